//! `Vocabulary`, `Grammar`, `Matcher`: the structured-output constraint engine. Behaviour
//! and errors are documented in `python/ferrolm/_core.pyi`.

use std::sync::Arc;
use std::time::Duration;

use ferrolm_constraint::json_schema::{JsonSchemaOptions, Whitespace};
use ferrolm_constraint::{
    tokenizer_files, Grammar, GrammarCache, GrammarSource, Matcher, TagSequence, Vocabulary,
    VocabularyBuilder,
};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors;
use crate::guard::{contain, SharedPoison};

/// Grammars compiled per vocabulary before the cache starts over.
const CACHE_CAPACITY: usize = 1024;

#[pyclass(module = "ferrolm._core", name = "Vocabulary", frozen)]
pub struct PyVocabulary {
    /// Shared with the Rust front end, which compiles its requests' grammars here too.
    cache: Arc<GrammarCache>,
}

impl PyVocabulary {
    pub fn vocab(&self) -> &Arc<Vocabulary> {
        self.cache.vocab()
    }

    pub fn cache(&self) -> &Arc<GrammarCache> {
        &self.cache
    }

    fn compile(&self, py: Python<'_>, source: GrammarSource) -> PyResult<PyGrammar> {
        let grammar =
            contain(py, || self.cache.get_or_compile(&source))?.map_err(|e| errors::constraint(py, e))?;
        Ok(PyGrammar { grammar })
    }

    /// The vocabulary `build` makes, with its grammar cache; both without the GIL (the
    /// cache indexes the vocabulary's JSON string loops: ~10 ms on a 200k vocabulary).
    fn built(
        py: Python<'_>,
        build: impl FnOnce() -> ferrolm_constraint::Result<Vocabulary> + Send,
        compile_timeout_s: f64,
    ) -> PyResult<Self> {
        // NaN, zero and negative: refused (clamped, they made every compile time out).
        if compile_timeout_s.is_nan() || compile_timeout_s <= 0.0 {
            return Err(errors::invalid_field(
                py,
                "compile_timeout_s",
                format!("compile_timeout_s must be a positive number of seconds, got {compile_timeout_s}"),
            ));
        }
        let timeout = Duration::from_secs_f64(compile_timeout_s.clamp(0.001, 3600.0));
        let cache =
            contain(py, || build().map(|vocab| GrammarCache::new(Arc::new(vocab), CACHE_CAPACITY, timeout)))?
                .map_err(|e| errors::constraint(py, e))?;
        Ok(PyVocabulary { cache: Arc::new(cache) })
    }
}

fn json_options(
    py: Python<'_>,
    whitespace: &str,
    max_whitespace: u32,
    lenient: bool,
    strict: bool,
) -> PyResult<JsonSchemaOptions> {
    let whitespace = match whitespace {
        "compact" => Whitespace::Compact,
        "flexible" => Whitespace::Flexible { max_run: max_whitespace },
        other => {
            return Err(errors::invalid_field(
                py,
                "whitespace",
                format!("whitespace must be 'compact' or 'flexible', got {other:?}"),
            ))
        }
    };
    Ok(JsonSchemaOptions { whitespace, lenient, strict, ..JsonSchemaOptions::default() })
}

/// A tokenizer file's vocabulary with the caller's EOS ids, padded to `vocab_size`.
fn finish(
    mut builder: VocabularyBuilder,
    eos_token_ids: &[u32],
    vocab_size: Option<usize>,
) -> ferrolm_constraint::Result<Vocabulary> {
    for &e in eos_token_ids {
        builder.mark_eos(e);
    }
    if let Some(n) = vocab_size {
        builder.min_size(n);
    }
    builder.build()
}

#[pymethods]
impl PyVocabulary {
    #[new]
    #[pyo3(signature = (token_bytes, *, special_token_ids = Vec::new(), eos_token_ids = Vec::new(), compile_timeout_s = 10.0))]
    fn new(
        py: Python<'_>,
        token_bytes: Vec<Vec<u8>>,
        special_token_ids: Vec<u32>,
        eos_token_ids: Vec<u32>,
        compile_timeout_s: f64,
    ) -> PyResult<Self> {
        let build = || Vocabulary::new(token_bytes, &special_token_ids, &eos_token_ids);
        Self::built(py, build, compile_timeout_s)
    }

    /// From a Hugging Face `tokenizer.json` text.
    #[staticmethod]
    #[pyo3(signature = (text, *, eos_token_ids = Vec::new(), vocab_size = None, compile_timeout_s = 10.0))]
    fn from_tokenizer_json(
        py: Python<'_>,
        text: &str,
        eos_token_ids: Vec<u32>,
        vocab_size: Option<usize>,
        compile_timeout_s: f64,
    ) -> PyResult<Self> {
        let build = || finish(tokenizer_files::from_hf_tokenizer_json(text)?, &eos_token_ids, vocab_size);
        Self::built(py, build, compile_timeout_s)
    }

    /// From a tiktoken file's text (`base64 rank` lines).
    #[staticmethod]
    #[pyo3(signature = (text, *, eos_token_ids = Vec::new(), compile_timeout_s = 10.0))]
    fn from_tiktoken(
        py: Python<'_>,
        text: &str,
        eos_token_ids: Vec<u32>,
        compile_timeout_s: f64,
    ) -> PyResult<Self> {
        let build = || finish(tokenizer_files::from_tiktoken(text)?, &eos_token_ids, None);
        Self::built(py, build, compile_timeout_s)
    }

    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<usize> {
        contain(py, || self.vocab().size())
    }

    #[getter]
    fn bitmask_words(&self, py: Python<'_>) -> PyResult<usize> {
        contain(py, || self.vocab().bitmask_words())
    }

    fn regex(&self, py: Python<'_>, pattern: String) -> PyResult<PyGrammar> {
        self.compile(py, GrammarSource::Regex(pattern))
    }

    #[pyo3(signature = (
        schema, *, whitespace = "compact", max_whitespace = 4, lenient = false, strict = false,
        any_order_members = false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn json_schema(
        &self,
        py: Python<'_>,
        schema: String,
        whitespace: &str,
        max_whitespace: u32,
        lenient: bool,
        strict: bool,
        any_order_members: bool,
    ) -> PyResult<PyGrammar> {
        let options = JsonSchemaOptions {
            any_order_members,
            ..json_options(py, whitespace, max_whitespace, lenient, strict)?
        };
        self.compile(py, GrammarSource::JsonSchema(schema, options))
    }

    #[pyo3(signature = (*, whitespace = "compact", max_whitespace = 4))]
    fn json_object(&self, py: Python<'_>, whitespace: &str, max_whitespace: u32) -> PyResult<PyGrammar> {
        let options = json_options(py, whitespace, max_whitespace, false, false)?;
        self.compile(py, GrammarSource::JsonObject(options))
    }

    /// A grammar in GBNF / EBNF (llama.cpp's notation, which xgrammar also reads).
    fn ebnf(&self, py: Python<'_>, grammar: String) -> PyResult<PyGrammar> {
        self.compile(py, GrammarSource::Gbnf(grammar))
    }

    fn choice(&self, py: Python<'_>, choices: Vec<String>) -> PyResult<PyGrammar> {
        if choices.is_empty() {
            return Err(errors::invalid_field(py, "choice", "choice needs at least one option".into()));
        }
        self.compile(py, GrammarSource::Choice(choices))
    }

    /// Free text until `trigger` appears, then `then` (e.g. JSON after `</think>`); with
    /// `optional`, the output may also end before the trigger.
    #[pyo3(signature = (trigger, then, *, optional = false))]
    fn after_trigger(
        &self,
        py: Python<'_>,
        trigger: &str,
        then: &PyGrammar,
        optional: bool,
    ) -> PyResult<PyGrammar> {
        if trigger.is_empty() {
            return Err(errors::invalid_field(py, "trigger", "the trigger must not be empty".into()));
        }
        let grammar = contain(py, || Grammar::after_trigger_with(trigger, &then.grammar, optional))?
            .map_err(|e| errors::constraint(py, e))?;
        Ok(PyGrammar { grammar })
    }

    /// `begin`, `then`, `end`, repeated with `separator` between (structural tags: one
    /// `<tool_call>` per call); `begun` is the part of the first `begin` already written.
    #[pyo3(signature = (then, *, begin, end, separator = "", repeated = true, begun = ""))]
    #[allow(clippy::too_many_arguments)]
    fn structural_tags(
        &self,
        py: Python<'_>,
        then: &PyGrammar,
        begin: &str,
        end: &str,
        separator: &str,
        repeated: bool,
        begun: &str,
    ) -> PyResult<PyGrammar> {
        if !begin.starts_with(begun) {
            return Err(errors::invalid_field(
                py,
                "begun",
                format!("begun {begun:?} is not a prefix of begin {begin:?}"),
            ));
        }
        let tags = TagSequence {
            begin: begin.into(),
            end: end.into(),
            separator: separator.into(),
            repeated,
            begun: begun.into(),
        };
        let grammar = contain(py, || Grammar::tag_sequence(&then.grammar, &tags))?
            .map_err(|e| errors::constraint(py, e))?;
        Ok(PyGrammar { grammar })
    }

    /// Text matching `first` or text matching `second` (an answer in the response format,
    /// or tool calls); their first bytes must tell them apart.
    fn either(&self, py: Python<'_>, first: &PyGrammar, second: &PyGrammar) -> PyResult<PyGrammar> {
        let grammar = contain(py, || Grammar::either(&first.grammar, &second.grammar))?
            .map_err(|e| errors::constraint(py, e))?;
        Ok(PyGrammar { grammar })
    }

    /// Test hook: panics inside the core (as a compilation that hits a bug would).
    /// Raises ``CorePanicError``; a vocabulary is frozen, so it stays usable.
    fn _inject_panic(&self, py: Python<'_>) -> PyResult<()> {
        contain(py, || panic!("injected by _inject_panic"))
    }
}

#[pyclass(module = "ferrolm._core", name = "Grammar", frozen)]
pub struct PyGrammar {
    pub grammar: Arc<Grammar>,
}

#[pymethods]
impl PyGrammar {
    #[getter]
    fn vocab_size(&self, py: Python<'_>) -> PyResult<usize> {
        contain(py, || self.grammar.vocab().size())
    }

    fn matcher(&self, py: Python<'_>) -> PyResult<PyMatcher> {
        let matcher = contain(py, || Matcher::new(self.grammar.clone()))?;
        Ok(PyMatcher { matcher, poison: SharedPoison::default() })
    }
}

/// A matcher; after a panic in any call involving it (a batch fill included) it refuses
/// every later call with `CorePanicError`.
#[pyclass(module = "ferrolm._core", name = "Matcher")]
pub struct PyMatcher {
    pub matcher: Matcher,
    poison: SharedPoison,
}

fn mask_row<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyArray1<i32>>> {
    match obj.cast::<PyArray1<i32>>() {
        Ok(a) if a.is_c_contiguous() => Ok(a.clone()),
        _ => Err(errors::invalid_field(
            py,
            "bitmask",
            "bitmask must be a contiguous 1-D int32 numpy array".into(),
        )),
    }
}

#[pymethods]
impl PyMatcher {
    #[new]
    fn new(py: Python<'_>, grammar: &PyGrammar) -> PyResult<Self> {
        grammar.matcher(py)
    }

    /// Fills `bitmask` (`int32[(vocab + 31) // 32]`, caller-owned) with the allowed tokens.
    fn fill_next_token_bitmask(&self, py: Python<'_>, bitmask: &Bound<'_, PyAny>) -> PyResult<()> {
        self.poison.check(py)?;
        let row = mask_row(py, bitmask)?;
        let mut rw = row
            .try_readwrite()
            .map_err(|_| errors::invalid_field(py, "bitmask", "bitmask is not writable".into()))?;
        let slice = rw.as_slice_mut().expect("checked contiguous");
        self.poison
            .run(py, &self.matcher, |m| m.fill_next_token_bitmask_i32(slice))?
            .map_err(|e| errors::constraint(py, e))
    }

    fn accept_token(&mut self, py: Python<'_>, token: u32) -> PyResult<bool> {
        self.poison.run(py, &mut self.matcher, |m| m.accept_token(token))
    }

    fn accept_string(&mut self, py: Python<'_>, text: &str) -> PyResult<bool> {
        self.poison.run(py, &mut self.matcher, |m| m.accept_str(text))
    }

    fn is_token_allowed(&self, py: Python<'_>, token: u32) -> PyResult<bool> {
        self.poison.run(py, &self.matcher, |m| m.is_token_allowed(token))
    }

    fn rollback(&mut self, py: Python<'_>, steps: usize) -> PyResult<()> {
        self.poison.run(py, &mut self.matcher, |m| m.rollback(steps))?.map_err(|e| errors::constraint(py, e))
    }

    fn reset(&mut self, py: Python<'_>) -> PyResult<()> {
        self.poison.run(py, &mut self.matcher, |m| m.reset())
    }

    fn can_end(&self, py: Python<'_>) -> PyResult<bool> {
        self.poison.run(py, &self.matcher, |m| m.can_end())
    }

    fn must_end(&self, py: Python<'_>) -> PyResult<bool> {
        self.poison.run(py, &self.matcher, |m| m.must_end())
    }

    fn is_ended(&self, py: Python<'_>) -> PyResult<bool> {
        self.poison.run(py, &self.matcher, |m| m.is_ended())
    }

    /// The bytes that must come next whatever is sampled (jump-forward); empty if several
    /// continuations remain.
    fn forced_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.poison.run(py, &self.matcher, |m| m.forced_bytes())?;
        Ok(PyBytes::new(py, &bytes))
    }

    #[getter]
    fn num_steps(&self, py: Python<'_>) -> PyResult<usize> {
        self.poison.run(py, &self.matcher, |m| m.num_steps())
    }

    /// Test hook (not API): panics inside the core, to check that a panic becomes
    /// ``CorePanicError`` and poisons this matcher.
    fn _inject_panic(&mut self, py: Python<'_>) -> PyResult<()> {
        self.poison.run(py, &mut self.matcher, |_| panic!("injected by _inject_panic"))
    }
}

/// Fills row i of `bitmask` (`int32[len(matchers), words]`) for `matchers[i]`, in one call.
#[pyfunction]
pub fn fill_next_token_bitmask_batch(
    py: Python<'_>,
    matchers: Vec<PyRef<'_, PyMatcher>>,
    bitmask: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let array = bitmask.cast::<PyArray2<i32>>().map_err(|_| {
        errors::invalid_field(py, "bitmask", "bitmask must be a 2-D int32 numpy array".into())
    })?;
    if !array.is_c_contiguous() || array.shape()[0] != matchers.len() {
        return Err(errors::invalid_field(
            py,
            "bitmask",
            format!("bitmask must be C-contiguous with one row per matcher ({} rows)", matchers.len()),
        ));
    }
    let mut rw = array
        .try_readwrite()
        .map_err(|_| errors::invalid_field(py, "bitmask", "bitmask is not writable".into()))?;
    let slice = rw.as_slice_mut().expect("checked contiguous");
    for matcher in &matchers {
        matcher.poison.check(py)?;
    }
    let refs: Vec<&Matcher> = matchers.iter().map(|m| &m.matcher).collect();
    let filled = contain(py, || ferrolm_constraint::fill_next_token_bitmask_batch_i32(&refs, slice));
    if let Err(panicked) = &filled {
        // Any of them may be the one whose state broke: none is used again.
        for matcher in &matchers {
            matcher.poison.poison(format!("a batch fill panicked: {panicked}"));
        }
    }
    filled?.map_err(|e| errors::constraint(py, e))
}

/// A JSON Schema (text) as the engine reads it, as compact JSON text.
#[pyfunction]
pub fn json_schema_normalized(py: Python<'_>, schema: String) -> PyResult<String> {
    let normalized = contain(py, || ferrolm_constraint::json_schema::normalized_schema_text(&schema))?;
    normalized.map_err(|e| errors::constraint(py, e))
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVocabulary>()?;
    m.add_class::<PyGrammar>()?;
    m.add_class::<PyMatcher>()?;
    m.add_function(wrap_pyfunction!(fill_next_token_bitmask_batch, m)?)?;
    m.add_function(wrap_pyfunction!(json_schema_normalized, m)?)?;
    Ok(())
}
