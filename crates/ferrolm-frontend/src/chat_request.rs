//! The request core of chat: one path from a chat request to what the engine runs,
//! shared by `POST /v1/chat/completions` and the offline `ferrolm.Engine.chat` (through
//! the binding), so the two cannot drift; and the same plan around the caller's own
//! prompt for `/generate` ([`prepare_generate`]). `crate::response` writes the answers.
//!
//! ```text
//! ChatInput (messages, tools, tool_choice, parallel_tool_calls, chat_template_kwargs,
//!            the caller's structured output)
//!   └─ prepare_chat(ChatModel) ─► PreparedChat: prompt text and ids, the planned
//!                                 constraint, skip_special_tokens, the output parser
//!        └─ compile_planned(GrammarCache) ─► the grammar (errors name the request field)
//! ```
//!
//! Everything here is synchronous and free of HTTP types: the server runs
//! [`prepare_chat`] on its tokenizer pool and [`compile_planned`] on its grammar threads;
//! the binding runs both with the GIL released. Errors are [`ApiError`]s: a status and
//! the request field at fault (`tools.0.function.parameters`), which the server answers
//! as a 400 and the binding raises as `InvalidInputError` with that `field`.

use std::sync::Arc;
use std::time::Instant;

use ferrolm_constraint::json_schema::{JsonSchemaOptions, Whitespace};
use ferrolm_constraint::{Grammar, GrammarCache, GrammarSource, TagSequence};
use ferrolm_core::engine::ThinkingBudget;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::errors::{ApiError, ApiResult};
use crate::protocol::{ChatMessage, Content, OneOrMany};
use crate::structured::{compile_error, SchemaField, Structured};
use crate::tokenizer::{ChatTemplate, Message, Tokenizer};
use crate::tools::plan::PlanInput;
use crate::tools::reasoning::PromptState;
use crate::tools::{self, ChatOutputParser, ChatPlan, PlannedConstraint, ServerTools};

/// Chat template variables a request may not set through `chat_template_kwargs`.
pub const RESERVED_TEMPLATE_VARIABLES: &[&str] =
    &["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];

/// What one chat request asks, whoever sent it.
#[derive(Debug, Default)]
pub struct ChatInput {
    pub messages: Vec<ChatMessage>,
    /// OpenAI's `tools` and `tool_choice`, as sent (checked here).
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: bool,
    pub chat_template_kwargs: Map<String, Value>,
    /// The caller's own structured output (`response_format`, `json_schema`...).
    pub structured: Option<Structured>,
    /// The most tokens the output may think (`thinking_token_budget`).
    pub thinking_budget: Option<u64>,
}

/// How a chat's prompt is rendered and its output read, beyond its messages: vLLM's
/// `add_generation_prompt` and `continue_final_message`, SGLang's `separate_reasoning`.
#[derive(Debug, Clone, Copy)]
pub struct ChatOptions {
    /// The template's generation prompt (the assistant's opening) ends the prompt.
    pub add_generation_prompt: bool,
    /// The last message (the assistant's) is left open for the model to go on with.
    pub continue_final_message: bool,
    /// Reasoning is parsed apart from the content (where the server parses reasoning).
    pub separate_reasoning: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions { add_generation_prompt: true, continue_final_message: false, separate_reasoning: true }
    }
}

/// What the model (and the server's flags) fix for every chat.
pub struct ChatModel<'a> {
    pub template: Option<&'a ChatTemplate>,
    pub tokenizer: &'a Tokenizer,
    pub tools: &'a ServerTools,
}

/// A chat ready to submit.
#[derive(Debug, Clone)]
pub struct PreparedChat {
    /// The prompt's token ids (the template writes its own BOS and markers).
    pub ids: Vec<u32>,
    /// The rendered prompt with what the tools add, the constraint, the parser settings.
    pub plan: ChatPlan,
    /// The core's thinking budget: where one was asked for and the output thinks.
    pub thinking: Option<ThinkingBudget>,
}

impl PreparedChat {
    pub fn prompt(&self) -> &str {
        &self.plan.prompt
    }

    pub fn constraint(&self) -> Option<&PlannedConstraint> {
        self.plan.constraint.as_ref()
    }

    /// `Some(false)` where the markers the parser reads are special tokens.
    pub fn skip_special_tokens(&self) -> Option<bool> {
        self.plan.skip_special_tokens
    }

    /// The parser of one output; `None` when outputs are plain text (no tool-call or
    /// reasoning format applies).
    pub fn output_parser(&self) -> Option<ChatOutputParser> {
        self.plan.parses().then(|| self.plan.output_parser())
    }
}

/// The request's messages as the chat template takes them: text parts joined, the calls'
/// `arguments` as mappings (a 400 naming `messages.i.tool_calls.j.function.arguments` for
/// arguments that are not JSON).
pub fn template_messages(messages: Vec<ChatMessage>) -> ApiResult<Vec<Message>> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let tool_calls = match m.tool_calls {
            Some(calls) if !calls.is_empty() => Some(tools::messages::template_calls(&calls, i)?),
            _ => None,
        };
        out.push(Message {
            role: m.role.as_str().to_string(),
            content: match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => parts.into_iter().map(|p| p.text).collect(),
            },
            name: m.name,
            tool_call_id: m.tool_call_id,
            reasoning_content: m.reasoning_content,
            tool_calls,
        });
    }
    Ok(out)
}

/// A message's text as the chat template is given it: its text parts joined.
pub fn message_text(m: &ChatMessage) -> String {
    match &m.content {
        None => String::new(),
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => parts.iter().map(|p| p.text.as_str()).collect(),
    }
}

/// vLLM's `echo` of a chat: the last message's text when that message is the assistant's
/// (the answer's role), which the answer's content then starts with; else nothing.
pub fn echoed(messages: &[ChatMessage]) -> Option<String> {
    messages.last().filter(|m| m.role.as_str() == "assistant").map(message_text)
}

/// Renders, plans and tokenizes one chat. `check_prompt` may refuse a prompt text before
/// it is tokenized (the server's cheap bound on its length).
pub fn prepare_chat(
    input: ChatInput,
    model: &ChatModel<'_>,
    check_prompt: &dyn Fn(&str) -> ApiResult<()>,
) -> ApiResult<PreparedChat> {
    prepare_chat_with(input, ChatOptions::default(), model, check_prompt)
}

/// [`prepare_chat`] with the rendering options a request set.
pub fn prepare_chat_with(
    input: ChatInput,
    options: ChatOptions,
    model: &ChatModel<'_>,
    check_prompt: &dyn Fn(&str) -> ApiResult<()>,
) -> ApiResult<PreparedChat> {
    let continued =
        match (options.continue_final_message, input.messages.last()) {
            (false, _) => None,
            (true, _) if options.add_generation_prompt => return Err(ApiError::bad_request(
                "continue_final_message: true needs add_generation_prompt: false (the prompt cannot both \
                 continue the last message and open a new one)",
                "continue_final_message",
            )),
            (true, Some(m)) if m.role.as_str() == "assistant" => Some(message_text(m)),
            (true, _) => {
                return Err(ApiError::bad_request(
                    "continue_final_message: true needs an assistant message last",
                    "continue_final_message",
                ))
            }
        };
    let tools = tools::parse_tools(input.tools.as_ref())?;
    let choice = tools::parse_tool_choice(input.tool_choice.as_ref(), &tools)?;
    let messages = template_messages(input.messages)?;
    let mut variables = input.chat_template_kwargs;
    let mut reserved: Vec<&str> =
        RESERVED_TEMPLATE_VARIABLES.iter().copied().filter(|v| variables.contains_key(*v)).collect();
    reserved.sort_unstable();
    if let Some(first) = reserved.first() {
        return Err(ApiError::bad_request(
            format!("chat_template_kwargs: '{first}' is set from the request itself"),
            "chat_template_kwargs",
        ));
    }
    if !tools.is_empty() {
        variables.insert("tools".into(), tools.iter().map(|t| t.as_template_tool()).collect());
    }
    let Some(template) = model.template else {
        return Err(ApiError::bad_request(
            "messages: this model has no chat template (tokenizer_config.json 'chat_template')",
            "messages",
        ));
    };
    let mut text = template
        .render_with(&messages, options.add_generation_prompt, &variables)
        .map_err(|m| ApiError::bad_request(format!("messages: {m}"), "messages"))?;
    if let Some(last) = continued.filter(|c| !c.is_empty()) {
        // the prompt ends where the last message's text does (its end-of-turn cut off)
        match text.rfind(&last) {
            Some(at) => text.truncate(at + last.len()),
            None => return Err(ApiError::bad_request(
                "continue_final_message: the chat template does not write the last message's text as sent",
                "continue_final_message",
            )),
        }
    }
    let plan = tools::plan_chat(
        text,
        PlanInput {
            tools: &tools,
            choice: &choice,
            parallel: input.parallel_tool_calls,
            tool_format: model.tools.tool_format,
            reasoning: model.tools.reasoning.as_ref().filter(|_| options.separate_reasoning),
            constrain: model.tools.constrain,
            structured: input.structured,
            special_tokens: &model.tools.special_tokens,
        },
    )?;
    check_prompt(&plan.prompt)?;
    let ids = model
        .tokenizer
        .encode(&plan.prompt, false)
        .map_err(|m| ApiError::bad_request(format!("messages: {m}"), "messages"))?;
    let thinking = thinking_budget(model, &plan.prompt, input.thinking_budget)?;
    Ok(PreparedChat { ids, plan, thinking })
}

/// The core's thinking budget of an output to `prompt`: `budget` tokens of thinking between
/// the markers of the model's reasoning format (the server's reasoning parser, whether or
/// not the reasoning is returned apart), as the model's tokens. `None` where nothing is
/// asked or the output does not think: no reasoning format, or a prompt that closed the
/// thinking (then there is no thinking to cap).
pub fn thinking_budget(
    model: &ChatModel<'_>,
    prompt: &str,
    budget: Option<u64>,
) -> ApiResult<Option<ThinkingBudget>> {
    let (Some(budget), Some(format)) = (budget, model.tools.reasoning.as_ref()) else { return Ok(None) };
    let open = match format.prompt_state(prompt) {
        PromptState::Closed => return Ok(None),
        PromptState::Open => true,
        PromptState::Unsaid => format.thinks_without_start,
    };
    let encode = |marker: &str| {
        model.tokenizer.encode(marker, false).map_err(|m| {
            ApiError::new(500, format!("thinking_token_budget: the marker {marker:?} does not tokenize: {m}"))
        })
    };
    Ok(Some(ThinkingBudget {
        budget: usize::try_from(budget).unwrap_or(usize::MAX),
        start_ids: encode(format.start)?,
        end_ids: encode(format.end)?,
        open,
    }))
}

/// What `/generate` asks of the request core beyond its sampling: the caller's own prompt
/// (not templated), and the tools and reasoning to plan around it.
#[derive(Debug)]
pub struct GenerateInput {
    pub prompt: GeneratePrompt,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: bool,
    pub separate_reasoning: bool,
    /// The caller's own structured output (`sampling_params.regex`...).
    pub structured: Option<Structured>,
    /// `sampling_params.thinking_token_budget`.
    pub thinking_budget: Option<u64>,
}

#[derive(Debug)]
pub enum GeneratePrompt {
    Text(String),
    Ids(Vec<u32>),
}

impl GenerateInput {
    /// Whether the request asks for tools or for the reasoning apart: then its output is
    /// read by the plan's parsers.
    pub fn parses(&self) -> bool {
        let given = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
        given(&self.tools) || given(&self.tool_choice) || self.separate_reasoning
    }
}

/// Plans and tokenizes one `/generate`: the tools and reasoning planned around the caller's
/// prompt (the tools are not written into it), and a forced call's opening after it.
/// `check_prompt` may refuse a prompt text before it is tokenized.
pub fn prepare_generate(
    input: GenerateInput,
    model: &ChatModel<'_>,
    check_prompt: &dyn Fn(&str) -> ApiResult<()>,
) -> ApiResult<PreparedChat> {
    let parses = input.parses();
    let tools = tools::parse_tools(input.tools.as_ref())?;
    let choice = tools::parse_tool_choice(input.tool_choice.as_ref(), &tools)?;
    if input.separate_reasoning && model.tools.reasoning.is_none() {
        return Err(ApiError::bad_request(
            "separate_reasoning: the server runs without --reasoning-parser",
            "separate_reasoning",
        ));
    }
    // what the reasoning parser reads: whether the prompt opened the thinking
    let prompt = match &input.prompt {
        GeneratePrompt::Text(text) => text.clone(),
        GeneratePrompt::Ids(ids) if parses || input.thinking_budget.is_some() => {
            model.tokenizer.decode(ids).map_err(|m| ApiError::bad_request(m, "input_ids"))?
        }
        GeneratePrompt::Ids(_) => String::new(),
    };
    let thinking = thinking_budget(model, &prompt, input.thinking_budget)?;
    let plan = tools::plan_chat(
        prompt,
        PlanInput {
            tools: &tools,
            choice: &choice,
            parallel: input.parallel_tool_calls,
            tool_format: model.tools.tool_format,
            reasoning: model.tools.reasoning.as_ref().filter(|_| input.separate_reasoning),
            constrain: model.tools.constrain,
            structured: input.structured,
            special_tokens: &model.tools.special_tokens,
        },
    )?;
    let encode = |text: &str, add_special_tokens| {
        model
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|m| ApiError::bad_request(format!("text: {m}"), "text"))
    };
    let mut ids = match input.prompt {
        GeneratePrompt::Text(text) => {
            check_prompt(&text)?;
            encode(&text, true)?
        }
        GeneratePrompt::Ids(ids) => ids,
    };
    if let (true, Some(format)) = (plan.primed, plan.tool_format) {
        if !format.opening().is_empty() {
            ids.extend(encode(format.opening(), false)?);
        }
    }
    Ok(PreparedChat { ids, plan, thinking })
}

/// One source compiled in the cache (bounded by the vocabulary's compile timeout); its
/// error names `s.field`.
pub fn compile_structured(cache: &GrammarCache, s: &Structured) -> ApiResult<Arc<Grammar>> {
    cache.get_or_compile(&s.source).map_err(|e| compile_error(&e, &s.field))
}

/// A planned constraint's grammar and the seconds its compiles took. Each part is compiled
/// first, so that a failure names the request field at fault: a function's parameters
/// (`tools.1.function.parameters`), the answer's format (`response_format`); then the
/// whole. Every compile goes through the cache, the composed grammar too.
pub fn compile_planned(cache: &GrammarCache, c: &PlannedConstraint) -> ApiResult<(Arc<Grammar>, f64)> {
    let started = Instant::now();
    match compile_structured(cache, &c.body) {
        Ok(_) => {}
        Err(e) if e.status == 400 && !c.parts.is_empty() => {
            if let GrammarSource::JsonSchema(_, options) = &c.body.source {
                for (field, schema) in &c.parts {
                    let part = Structured {
                        source: GrammarSource::JsonSchema(schema.clone(), options.clone()),
                        field: field.clone(),
                    };
                    if let Err(mut e) = compile_structured(cache, &part) {
                        e.message = format!("{field}: {}", e.message);
                        return Err(e);
                    }
                }
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    }
    if let Some(answer) = &c.answer {
        compile_structured(cache, answer)?;
        let either = Structured { source: c.alternatives(), field: answer.field.clone() };
        compile_structured(cache, &either).map_err(|mut e| {
            if e.status == 400 {
                e.message = format!(
                    "{}: cannot be told apart from the structured part by its first character ({})",
                    answer.field, e.message
                );
            }
            e
        })?;
    }
    let grammar = compile_structured(cache, &Structured { source: c.source(), field: c.body.field.clone() })?;
    Ok((grammar, started.elapsed().as_secs_f64()))
}

/// Structural tags as a caller writes them (`SamplingParams.structured_tags`).
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TagFields {
    pub begin: String,
    pub end: String,
    #[serde(default)]
    pub separator: String,
    #[serde(default)]
    pub begun: String,
    #[serde(default = "yes")]
    pub repeated: bool,
}

fn yes() -> bool {
    true
}

/// The structured-output fields of the offline API (`ferrolm.SamplingParams`): one body
/// (`regex`, `json_schema`, `json_object`, `choice`, `ebnf`) and how it is placed in the
/// output (after triggers, between tags, or instead of an answer in another format).
/// Errors name these fields.
#[derive(Deserialize, Debug, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct ConstraintFields {
    pub regex: Option<String>,
    pub json_schema: Option<SchemaField>,
    #[serde(default)]
    pub json_schema_strict: bool,
    #[serde(default)]
    pub json_object: bool,
    pub choice: Option<Vec<String>>,
    pub ebnf: Option<String>,
    pub structured_after: Option<OneOrMany>,
    #[serde(default)]
    pub structured_optional: bool,
    pub structured_tags: Option<TagFields>,
    pub structured_or: Option<Box<ConstraintFields>>,
    /// The sub-schemas `json_schema` was assembled from, by the field each came from.
    pub json_schema_parts: Option<Map<String, Value>>,
    /// `compact` (the default) or `flexible`.
    pub whitespace: Option<String>,
}

fn refuse(field: &str, message: &str) -> ApiError {
    ApiError::bad_request(format!("{field}: {message}"), field)
}

impl ConstraintFields {
    fn options(&self, strict: bool) -> ApiResult<JsonSchemaOptions> {
        let whitespace = match self.whitespace.as_deref() {
            None | Some("compact") => Whitespace::Compact,
            Some("flexible") => Whitespace::Flexible { max_run: 4 },
            Some(other) => {
                return Err(refuse("whitespace", &format!("must be 'compact' or 'flexible', got {other:?}")))
            }
        };
        Ok(JsonSchemaOptions { whitespace, strict, ..JsonSchemaOptions::default() })
    }

    /// The body alone; `None` when no constraint is asked for.
    fn body(&self) -> ApiResult<Option<Structured>> {
        let mut asked: Vec<Structured> = Vec::new();
        let mut push =
            |source: GrammarSource, field: &str| asked.push(Structured { source, field: field.into() });
        if let Some(r) = &self.regex {
            push(GrammarSource::Regex(r.clone()), "regex");
        }
        if let Some(s) = &self.json_schema {
            push(GrammarSource::JsonSchema(s.text(), self.options(self.json_schema_strict)?), "json_schema");
        }
        if self.json_object {
            push(GrammarSource::JsonObject(self.options(false)?), "json_object");
        }
        if let Some(c) = &self.choice {
            if c.is_empty() {
                return Err(refuse("choice", "needs at least one option"));
            }
            push(GrammarSource::Choice(c.clone()), "choice");
        }
        if let Some(g) = &self.ebnf {
            push(GrammarSource::Gbnf(g.clone()), "ebnf");
        }
        if asked.len() > 1 {
            let given: Vec<&str> = asked.iter().map(|s| s.field.as_str()).collect();
            return Err(refuse(given[1], &format!("only one of {} may be given", given.join(", "))));
        }
        if self.json_schema_strict && self.json_schema.is_none() {
            return Err(refuse("json_schema_strict", "needs a json_schema"));
        }
        Ok(asked.pop())
    }

    /// The whole constraint; `None` when none is asked for.
    pub fn planned(&self) -> ApiResult<Option<PlannedConstraint>> {
        let Some(body) = self.body()? else {
            for (set, field) in [
                (self.structured_after.is_some(), "structured_after"),
                (self.structured_tags.is_some(), "structured_tags"),
                (self.structured_or.is_some(), "structured_or"),
                (self.json_schema_parts.is_some(), "json_schema_parts"),
            ] {
                if set {
                    return Err(refuse(field, "needs a regex, json_schema, json_object, choice or ebnf"));
                }
            }
            return Ok(None);
        };
        let triggers = match self.structured_after.clone() {
            None => Vec::new(),
            Some(t) => t.into_vec(),
        };
        if triggers.iter().any(String::is_empty) {
            return Err(refuse("structured_after", "a trigger may not be empty"));
        }
        if self.structured_optional && triggers.is_empty() {
            return Err(refuse("structured_optional", "needs structured_after"));
        }
        let tags = match &self.structured_tags {
            None => None,
            Some(t) if !t.begin.starts_with(&t.begun) => {
                return Err(refuse("structured_tags", "\"begun\" must be a prefix of \"begin\""))
            }
            Some(t) => Some(TagSequence {
                begin: t.begin.clone(),
                end: t.end.clone(),
                separator: t.separator.clone(),
                repeated: t.repeated,
                begun: t.begun.clone(),
            }),
        };
        let answer = match &self.structured_or {
            None => None,
            Some(inner) => {
                let mut inner = (**inner).clone();
                inner.whitespace = inner.whitespace.or_else(|| self.whitespace.clone());
                let Some(c) = inner.planned().map_err(|e| {
                    ApiError::bad_request(format!("structured_or: {}", e.message), "structured_or")
                })?
                else {
                    return Err(refuse("structured_or", "sets no constraint"));
                };
                Some(Structured { source: c.source(), field: "structured_or".into() })
            }
        };
        let parts = match &self.json_schema_parts {
            None => Vec::new(),
            Some(_) if self.json_schema.is_none() => {
                return Err(refuse("json_schema_parts", "needs a json_schema"))
            }
            Some(parts) => parts.iter().map(|(field, schema)| (field.clone(), schema_text(schema))).collect(),
        };
        Ok(Some(PlannedConstraint {
            body,
            parts,
            tags,
            answer,
            triggers,
            optional: self.structured_optional,
        }))
    }

    /// The constraint as one source (the caller's own structure for a chat, which plans
    /// its triggers and tags around it); its field is the body's.
    pub fn structured(&self) -> ApiResult<Option<Structured>> {
        Ok(self.planned()?.map(|c| Structured { source: c.source(), field: c.body.field.clone() }))
    }
}

fn schema_text(schema: &Value) -> String {
    match schema {
        Value::String(s) => s.clone(),
        other => serde_json::to_string(other).expect("JSON"),
    }
}

#[cfg(test)]
mod tests;
