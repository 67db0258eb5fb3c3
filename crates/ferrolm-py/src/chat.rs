//! `ChatCore`, `PreparedChat`, `ChatOutputParser`, `render_chat_template`: the request core
//! of chat (`ferrolm_frontend::chat_request`, the one the HTTP server runs) for the
//! offline `Engine.chat`. Conversion and forwarding only; every call releases the GIL.
//! Behaviour is documented in `python/ferrolm/_core.pyi`.

use std::sync::Arc;

use ferrolm_constraint::{Grammar, GrammarCache};
use ferrolm_frontend::chat_request::{self, ChatInput, ChatModel, ConstraintFields, PreparedChat};
use ferrolm_frontend::errors::ApiError;
use ferrolm_frontend::protocol::{parse_offline_chat, typed, OfflineSampling};
use ferrolm_frontend::response;
use ferrolm_frontend::tokenizer::Message;
use ferrolm_frontend::tools::output::PieceKind;
use ferrolm_frontend::tools::{self, ChatOutputParser, ServerTools};
use ferrolm_frontend::{ChatTemplate, Tokenizer};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::constraint::{PyGrammar, PyVocabulary};
use crate::engine::PyThinkingBudget;
use crate::errors;
use crate::guard::contain;

/// The request core's error as a Python exception: a bad request is an
/// `InvalidInputError` naming its field; anything else is a bug in the core.
fn api_error(py: Python<'_>, e: ApiError) -> PyErr {
    match (e.status, e.param) {
        (400, Some(field)) => errors::invalid_field(py, &field, e.message),
        (400, None) => errors::invalid_input(py, e.message),
        _ => errors::core_panic(py, e.message),
    }
}

#[pyclass(module = "ferrolm._core", name = "ChatCore", frozen)]
pub struct PyChatCore {
    cache: Arc<GrammarCache>,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    special_tokens: std::collections::HashSet<String>,
}

#[pymethods]
impl PyChatCore {
    #[new]
    #[pyo3(signature = (vocabulary, tokenizer_json, chat_template = None, *, bos_token = None, eos_token = None))]
    fn new(
        py: Python<'_>,
        vocabulary: PyRef<'_, PyVocabulary>,
        tokenizer_json: &str,
        chat_template: Option<&str>,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> PyResult<Self> {
        let cache = vocabulary.cache().clone();
        let built = contain(py, || -> Result<_, String> {
            let tokenizer = Tokenizer::from_json(tokenizer_json)?;
            let template = chat_template.map(|t| ChatTemplate::new(t, bos_token, eos_token)).transpose()?;
            Ok((tokenizer, template, tools::special_token_texts(cache.vocab())))
        })?;
        let (tokenizer, template, special_tokens) = built.map_err(|m| errors::invalid_input(py, m))?;
        Ok(PyChatCore { cache, tokenizer, template, special_tokens })
    }

    #[pyo3(signature = (request_json, *, constraint_json = None, tool_call_parser = "auto", reasoning_parser = "auto", constrain_tool_calls = true))]
    fn prepare(
        &self,
        py: Python<'_>,
        request_json: &str,
        constraint_json: Option<&str>,
        tool_call_parser: &str,
        reasoning_parser: &str,
        constrain_tool_calls: bool,
    ) -> PyResult<PyPreparedChat> {
        let prepared = contain(py, || -> Result<_, ApiError> {
            let json = |text: &str, field: &str| {
                serde_json::from_str::<serde_json::Value>(text)
                    .map_err(|e| ApiError::bad_request(format!("{field}: not JSON: {e}"), field))
            };
            let chat = parse_offline_chat(&json(request_json, "request_json")?)?;
            let structured = match constraint_json {
                None => None,
                Some(text) => typed::<ConstraintFields>(&json(text, "constraint_json")?, "")?.structured()?,
            };
            let source = self.template.as_ref().map(ChatTemplate::source);
            let tools = ServerTools::named(
                tool_call_parser,
                reasoning_parser,
                constrain_tool_calls,
                source,
                self.special_tokens.clone(),
            )?;
            let input = ChatInput {
                messages: chat.messages,
                tools: chat.tools,
                tool_choice: chat.tool_choice,
                parallel_tool_calls: chat.parallel_tool_calls != Some(false),
                chat_template_kwargs: chat.chat_template_kwargs.unwrap_or_default(),
                structured,
                thinking_budget: chat.thinking_token_budget,
            };
            let model =
                ChatModel { template: self.template.as_ref(), tokenizer: &self.tokenizer, tools: &tools };
            let prepared = chat_request::prepare_chat(input, &model, &|_| Ok(()))?;
            let grammar = match prepared.constraint() {
                Some(c) => Some(chat_request::compile_planned(&self.cache, c)?.0),
                None => None,
            };
            Ok((prepared, grammar))
        })?;
        let (prepared, grammar) = prepared.map_err(|e| api_error(py, e))?;
        Ok(PyPreparedChat { prepared, grammar })
    }

    /// See `_core.pyi`.
    #[pyo3(signature = (prompt_ids, budget, *, reasoning_parser = "auto"))]
    fn thinking(
        &self,
        py: Python<'_>,
        prompt_ids: &Bound<'_, PyAny>,
        budget: u64,
        reasoning_parser: &str,
    ) -> PyResult<Option<PyThinkingBudget>> {
        let prompt_ids = crate::convert::ids(prompt_ids, "prompt_ids", u32::MAX)?;
        let prompt_ids = prompt_ids.as_slice();
        let thinking = contain(py, || -> Result<_, ApiError> {
            let source = self.template.as_ref().map(ChatTemplate::source);
            let tools =
                ServerTools::named("none", reasoning_parser, false, source, self.special_tokens.clone())?;
            let prompt =
                self.tokenizer.decode(prompt_ids).map_err(|m| ApiError::bad_request(m, "prompt_ids"))?;
            let model =
                ChatModel { template: self.template.as_ref(), tokenizer: &self.tokenizer, tools: &tools };
            chat_request::thinking_budget(&model, &prompt, Some(budget))
        })?;
        Ok(thinking.map_err(|e| api_error(py, e))?.map(PyThinkingBudget::from))
    }
}

#[pyclass(module = "ferrolm._core", name = "PreparedChat", frozen)]
pub struct PyPreparedChat {
    prepared: PreparedChat,
    grammar: Option<Arc<Grammar>>,
}

#[pymethods]
impl PyPreparedChat {
    #[getter]
    fn prompt(&self) -> &str {
        self.prepared.prompt()
    }

    #[getter]
    fn prompt_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.prepared.ids.clone().into_pyarray(py)
    }

    #[getter]
    fn grammar(&self) -> Option<PyGrammar> {
        self.grammar.clone().map(|grammar| PyGrammar { grammar })
    }

    #[getter]
    fn skip_special_tokens(&self) -> Option<bool> {
        self.prepared.skip_special_tokens()
    }

    #[getter]
    fn thinking(&self) -> Option<PyThinkingBudget> {
        self.prepared.thinking.clone().map(PyThinkingBudget::from)
    }

    #[getter]
    fn parses(&self) -> bool {
        self.prepared.plan.parses()
    }

    fn output_parser(&self, py: Python<'_>) -> PyResult<PyChatOutputParser> {
        let parser = contain(py, || self.prepared.plan.output_parser())?;
        Ok(PyChatOutputParser { parser })
    }

    /// A whole output read: (content, reasoning, calls, finish reason).
    #[pyo3(signature = (text, finish_reason = None))]
    #[allow(clippy::type_complexity)]
    fn parse(
        &self,
        py: Python<'_>,
        text: &str,
        finish_reason: Option<&str>,
    ) -> PyResult<(Option<String>, Option<String>, Vec<(String, String, String)>, Option<String>)> {
        let (m, finish) = contain(py, || {
            response::message(&self.prepared.plan, &response::ChatReply::default(), text, finish_reason)
        })?;
        let calls = m.tool_calls.into_iter().map(|c| (c.id, c.name, c.arguments)).collect();
        Ok((m.content.map(String::from), m.reasoning_content.flatten(), calls, finish.map(str::to_string)))
    }
}

/// One output read as it streams; pieces come as (kind, text, call index, call id) with
/// kind one of "reasoning", "content", "call" (text: the function's name) and "arguments".
#[pyclass(module = "ferrolm._core", name = "ChatOutputParser")]
pub struct PyChatOutputParser {
    parser: ChatOutputParser,
}

type PyPiece = (&'static str, String, usize, String);

fn pieces(pieces: Vec<tools::Piece>) -> Vec<PyPiece> {
    pieces
        .into_iter()
        .map(|p| {
            let kind = match p.kind {
                PieceKind::Reasoning => "reasoning",
                PieceKind::Content => "content",
                PieceKind::Call => "call",
                PieceKind::Arguments => "arguments",
            };
            (kind, p.text, p.index, p.call_id)
        })
        .collect()
}

#[pymethods]
impl PyChatOutputParser {
    fn feed(&mut self, py: Python<'_>, text: &str) -> PyResult<Vec<PyPiece>> {
        let parser = &mut self.parser;
        Ok(pieces(contain(py, || parser.feed(text))?))
    }

    fn finish(&mut self, py: Python<'_>) -> PyResult<Vec<PyPiece>> {
        let parser = &mut self.parser;
        Ok(pieces(contain(py, || parser.finish())?))
    }
}

/// The grammar of the offline API's structured-output fields (`SamplingParams`' as a JSON
/// object): the body, and the triggers, tags and alternative answer around it, composed
/// and cached as the request core composes a chat's; `None` when none is asked for.
#[pyfunction]
fn request_grammar(
    py: Python<'_>,
    vocabulary: PyRef<'_, PyVocabulary>,
    constraint_json: &str,
) -> PyResult<Option<PyGrammar>> {
    let cache = vocabulary.cache();
    let compiled = contain(py, || -> Result<_, ApiError> {
        let value: serde_json::Value = serde_json::from_str(constraint_json).map_err(|e| {
            ApiError::bad_request(format!("constraint_json: not JSON: {e}"), "constraint_json")
        })?;
        match typed::<ConstraintFields>(&value, "")?.planned()? {
            None => Ok(None),
            Some(c) => Ok(Some(chat_request::compile_planned(cache, &c)?.0)),
        }
    })?;
    Ok(compiled.map_err(|e| api_error(py, e))?.map(|grammar| PyGrammar { grammar }))
}

/// Checks structured-output fields (as `request_grammar` takes them) without compiling:
/// which combinations are allowed and each field's shape, as the request core reads them,
/// so `ferrolm.SamplingParams` refuses at construction what a submit would refuse.
#[pyfunction]
fn check_constraint(py: Python<'_>, constraint_json: &str) -> PyResult<()> {
    let checked = contain(py, || -> Result<(), ApiError> {
        let value: serde_json::Value = serde_json::from_str(constraint_json).map_err(|e| {
            ApiError::bad_request(format!("constraint_json: not JSON: {e}"), "constraint_json")
        })?;
        typed::<ConstraintFields>(&value, "")?.planned().map(drop)
    })?;
    checked.map_err(|e| api_error(py, e))
}

/// Checks `ferrolm.SamplingParams`' sampling fields (a mapping of `Engine.submit`'s
/// keywords and `n`) against the types the core takes them in, as the request core reads
/// the offline API's fields ([`OfflineSampling`]): each refusal names its field.
#[pyfunction]
fn check_sampling(py: Python<'_>, fields: &Bound<'_, PyAny>) -> PyResult<()> {
    let value = crate::convert::json_of(fields)?;
    let checked = contain(py, || typed::<OfflineSampling>(&value, "").map(drop))?;
    checked.map_err(|e| api_error(py, e))
}

/// Renders chat messages (a JSON list of `{"role", "content"}`, with `name`,
/// `tool_call_id`, `reasoning_content` and `tool_calls` as templates take them) with a chat
/// template as the server does (minijinja); `tools_json` and `variables_json` (a JSON
/// object: `chat_template_kwargs`) are more template variables.
#[pyfunction]
#[pyo3(signature = (template, messages_json, *, bos_token = None, eos_token = None, add_generation_prompt = true, tools_json = None, variables_json = None))]
#[allow(clippy::too_many_arguments)]
fn render_chat_template(
    py: Python<'_>,
    template: &str,
    messages_json: &str,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
    add_generation_prompt: bool,
    tools_json: Option<&str>,
    variables_json: Option<&str>,
) -> PyResult<String> {
    let messages: Vec<Message> = serde_json::from_str(messages_json)
        .map_err(|e| errors::invalid_field(py, "messages_json", format!("messages_json: {e}")))?;
    let mut variables = match variables_json {
        None => serde_json::Map::new(),
        Some(text) => serde_json::from_str(text)
            .map_err(|e| errors::invalid_field(py, "variables_json", format!("variables_json: {e}")))?,
    };
    if let Some(tools) = tools_json {
        let tools: serde_json::Value = serde_json::from_str(tools)
            .map_err(|e| errors::invalid_field(py, "tools_json", format!("tools_json: {e}")))?;
        variables.insert("tools".into(), tools);
    }
    let rendered = contain(py, || {
        ChatTemplate::new(template, bos_token, eos_token)
            .and_then(|t| t.render_with(&messages, add_generation_prompt, &variables))
    })?;
    rendered.map_err(|m| errors::invalid_input(py, m))
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyChatCore>()?;
    m.add_class::<PyPreparedChat>()?;
    m.add_class::<PyChatOutputParser>()?;
    m.add_function(wrap_pyfunction!(render_chat_template, m)?)?;
    m.add_function(wrap_pyfunction!(request_grammar, m)?)?;
    m.add_function(wrap_pyfunction!(check_constraint, m)?)?;
    m.add_function(wrap_pyfunction!(check_sampling, m)?)?;
    let py = m.py();
    m.add("TOOL_CALL_PARSERS", PyTuple::new(py, tools::formats::PARSER_CHOICES)?)?;
    m.add("REASONING_PARSERS", PyTuple::new(py, tools::reasoning::REASONING_CHOICES)?)?;
    Ok(())
}
