//! `Vocabulary`, `Grammar`, `Matcher`: the structured-output constraint engine. Behaviour
//! and errors are documented in `python/ferrolm/_core.pyi`.

use std::sync::Arc;
use std::time::Duration;

use ferrolm_constraint::json_schema::{JsonSchemaOptions, Whitespace};
use ferrolm_constraint::{
    tokenizer_files, ConstraintError, Grammar, GrammarCache, GrammarSource, Matcher, Vocabulary,
    VocabularyBuilder,
};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors;

/// Grammars compiled per vocabulary before the cache starts over.
const CACHE_CAPACITY: usize = 1024;

pub fn constraint_err(py: Python<'_>, e: ConstraintError) -> PyErr {
    let field = match &e {
        ConstraintError::InvalidVocabulary(_) | ConstraintError::TokenizerFile { .. } => "vocabulary",
        ConstraintError::InvalidRegex { .. } => "regex",
        ConstraintError::GrammarTooLarge { .. } => "grammar",
        ConstraintError::BitmaskSize { .. } => "bitmask",
        ConstraintError::RollbackTooFar { .. } => "steps",
        ConstraintError::UnsupportedSchema { .. } | ConstraintError::InvalidSchema { .. } => "json_schema",
    };
    errors::invalid_field(py, field, e.to_string())
}

#[pyclass(module = "ferrolm._core", name = "Vocabulary", frozen)]
pub struct PyVocabulary {
    cache: GrammarCache,
}

impl PyVocabulary {
    pub fn vocab(&self) -> &Arc<Vocabulary> {
        self.cache.vocab()
    }

    fn compile(&self, py: Python<'_>, source: GrammarSource) -> PyResult<PyGrammar> {
        let grammar = py.detach(|| self.cache.get_or_compile(&source)).map_err(|e| constraint_err(py, e))?;
        Ok(PyGrammar { grammar })
    }

    fn new_cached(vocab: Vocabulary, compile_timeout_s: f64) -> Self {
        let timeout = Duration::from_secs_f64(compile_timeout_s.clamp(0.001, 3600.0));
        PyVocabulary { cache: GrammarCache::new(Arc::new(vocab), CACHE_CAPACITY, timeout) }
    }
}

fn json_options(
    py: Python<'_>,
    whitespace: &str,
    max_whitespace: u32,
    lenient: bool,
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
    Ok(JsonSchemaOptions { whitespace, lenient, ..JsonSchemaOptions::default() })
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
        let vocab = py
            .detach(|| Vocabulary::new(token_bytes, &special_token_ids, &eos_token_ids))
            .map_err(|e| constraint_err(py, e))?;
        Ok(Self::new_cached(vocab, compile_timeout_s))
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
        let vocab = py.detach(build).map_err(|e| constraint_err(py, e))?;
        Ok(Self::new_cached(vocab, compile_timeout_s))
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
        let vocab = py.detach(build).map_err(|e| constraint_err(py, e))?;
        Ok(Self::new_cached(vocab, compile_timeout_s))
    }

    #[getter]
    fn size(&self) -> usize {
        self.vocab().size()
    }

    #[getter]
    fn bitmask_words(&self) -> usize {
        self.vocab().bitmask_words()
    }

    fn regex(&self, py: Python<'_>, pattern: String) -> PyResult<PyGrammar> {
        self.compile(py, GrammarSource::Regex(pattern))
    }

    #[pyo3(signature = (schema, *, whitespace = "compact", max_whitespace = 4, lenient = false))]
    fn json_schema(
        &self,
        py: Python<'_>,
        schema: String,
        whitespace: &str,
        max_whitespace: u32,
        lenient: bool,
    ) -> PyResult<PyGrammar> {
        let options = json_options(py, whitespace, max_whitespace, lenient)?;
        self.compile(py, GrammarSource::JsonSchema(schema, options))
    }

    #[pyo3(signature = (*, whitespace = "compact", max_whitespace = 4))]
    fn json_object(&self, py: Python<'_>, whitespace: &str, max_whitespace: u32) -> PyResult<PyGrammar> {
        let options = json_options(py, whitespace, max_whitespace, false)?;
        self.compile(py, GrammarSource::JsonObject(options))
    }

    fn choice(&self, py: Python<'_>, choices: Vec<String>) -> PyResult<PyGrammar> {
        if choices.is_empty() {
            return Err(errors::invalid_field(py, "choice", "choice needs at least one option".into()));
        }
        self.compile(py, GrammarSource::Choice(choices))
    }

    /// Free text until `trigger` appears, then `then` (e.g. JSON after `</think>`).
    fn after_trigger(&self, py: Python<'_>, trigger: &str, then: &PyGrammar) -> PyResult<PyGrammar> {
        if trigger.is_empty() {
            return Err(errors::invalid_field(py, "trigger", "the trigger must not be empty".into()));
        }
        let grammar = py
            .detach(|| Grammar::after_trigger(trigger, &then.grammar))
            .map_err(|e| constraint_err(py, e))?;
        Ok(PyGrammar { grammar })
    }
}

#[pyclass(module = "ferrolm._core", name = "Grammar", frozen)]
pub struct PyGrammar {
    pub grammar: Arc<Grammar>,
}

#[pymethods]
impl PyGrammar {
    #[getter]
    fn vocab_size(&self) -> usize {
        self.grammar.vocab().size()
    }

    fn matcher(&self) -> PyMatcher {
        PyMatcher { matcher: Matcher::new(self.grammar.clone()) }
    }
}

#[pyclass(module = "ferrolm._core", name = "Matcher")]
pub struct PyMatcher {
    pub matcher: Matcher,
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
    fn new(grammar: &PyGrammar) -> Self {
        grammar.matcher()
    }

    /// Fills `bitmask` (`int32[(vocab + 31) // 32]`, caller-owned) with the allowed tokens.
    fn fill_next_token_bitmask(&self, py: Python<'_>, bitmask: &Bound<'_, PyAny>) -> PyResult<()> {
        let row = mask_row(py, bitmask)?;
        let mut rw = row
            .try_readwrite()
            .map_err(|_| errors::invalid_field(py, "bitmask", "bitmask is not writable".into()))?;
        let slice = rw.as_slice_mut().expect("checked contiguous");
        let m = &self.matcher;
        py.detach(|| m.fill_next_token_bitmask_i32(slice)).map_err(|e| constraint_err(py, e))
    }

    fn accept_token(&mut self, token: u32) -> bool {
        self.matcher.accept_token(token)
    }

    fn accept_string(&mut self, text: &str) -> bool {
        self.matcher.accept_str(text)
    }

    fn is_token_allowed(&self, token: u32) -> bool {
        self.matcher.is_token_allowed(token)
    }

    fn rollback(&mut self, py: Python<'_>, steps: usize) -> PyResult<()> {
        self.matcher.rollback(steps).map_err(|e| constraint_err(py, e))
    }

    fn reset(&mut self) {
        self.matcher.reset()
    }

    fn can_end(&self) -> bool {
        self.matcher.can_end()
    }

    fn must_end(&self) -> bool {
        self.matcher.must_end()
    }

    fn is_ended(&self) -> bool {
        self.matcher.is_ended()
    }

    /// The bytes that must come next whatever is sampled (jump-forward); empty if several
    /// continuations remain.
    fn forced_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.matcher.forced_bytes())
    }

    #[getter]
    fn num_steps(&self) -> usize {
        self.matcher.num_steps()
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
    let refs: Vec<&Matcher> = matchers.iter().map(|m| &m.matcher).collect();
    py.detach(|| ferrolm_constraint::fill_next_token_bitmask_batch_i32(&refs, slice))
        .map_err(|e| constraint_err(py, e))
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVocabulary>()?;
    m.add_class::<PyGrammar>()?;
    m.add_class::<PyMatcher>()?;
    m.add_function(wrap_pyfunction!(fill_next_token_bitmask_batch, m)?)?;
    Ok(())
}
