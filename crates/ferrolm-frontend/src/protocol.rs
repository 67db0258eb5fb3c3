//! Request bodies, parsed strictly into typed structs with field-level errors: a string
//! is not a number, a bool not an int; integers are range-checked in the width the core
//! takes them (token ids u32, counts u64, priority i64); a field that is not one of the
//! struct's own is refused naming it (the few OpenAI fields that change nothing are
//! accepted and ignored). Ranges the core checks itself (temperature, top_p,
//! penalties...) are left to it: its refusal names its field, which [`core_field_error`]
//! renames to the body's.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;

use ferrolm_core::detok::StopConditions;
use ferrolm_core::engine::{EngineError, RequestParams};
use ferrolm_core::sampling::SamplingParams;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::errors::{ApiError, ApiResult};
use crate::field_policy::{self, Route};
use crate::json_body;
use crate::structured::{self, Asked, SchemaField, Structured};

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM's and SGLang's: usage on every chunk (only `false` is taken).
    pub continuous_usage_stats: Option<bool>,
    /// OpenAI's: padding against length side channels (accepted, none is added).
    pub include_obfuscation: Option<bool>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(try_from = "Value")]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// What completions and chat completions share (`OpenAISampling`).
#[derive(Deserialize, Debug)]
pub struct OpenAISampling {
    pub model: Option<String>,
    #[serde(default = "one")]
    pub n: u64,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stop: Option<OneOrMany>,
    pub seed: Option<u64>,
    pub logit_bias: Option<BTreeMap<String, f64>>,
    #[serde(default)]
    pub frequency_penalty: f64,
    #[serde(default)]
    pub presence_penalty: f64,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub min_tokens: u64,
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default = "yes")]
    pub skip_special_tokens: bool,
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    /// SGLang's name for `include_stop_str_in_output`.
    #[serde(default)]
    pub no_stop_trim: bool,
    pub priority: Option<i64>,
    pub cache_salt: Option<String>,
    /// SGLang's: the LoRA adapter to run with, by name (or the folder it was loaded from).
    pub lora_path: Option<String>,
    pub response_format: Option<Value>,
    pub regex: Option<String>,
    pub json_schema: Option<SchemaField>,
    pub ebnf: Option<String>,
    pub guided_json: Option<SchemaField>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    pub grammar: Option<String>,
    pub user: Option<String>,
    pub cache_prompt: Option<bool>,
    /// ferrolm's: speculate by lookup (`None`: as the server's `--speculative` says).
    pub speculative: Option<bool>,
    /// vLLM's; either value gives the same text here: the detokenizer writes each token's
    /// bytes, an added token as its content, with nothing between two tokens (see
    /// `crate::field_policy`).
    pub spaces_between_special_tokens: Option<bool>,
}

fn one() -> u64 {
    1
}
fn yes() -> bool {
    true
}

#[derive(Deserialize, Debug)]
#[serde(try_from = "Value")]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
    Texts(Vec<String>),
}

#[derive(Deserialize, Debug)]
pub struct CompletionFields {
    pub prompt: Prompt,
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
}

#[derive(Deserialize, Debug)]
pub struct TextPart {
    #[serde(rename = "type")]
    pub kind: TextKind,
    pub text: String,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
pub enum TextKind {
    Text,
}

#[derive(Deserialize, Debug)]
#[serde(try_from = "Value")]
pub enum Content {
    Text(String),
    Parts(Vec<TextPart>),
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Deserialize, Debug)]
pub struct ChatMessage {
    pub role: Role,
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
    pub refusal: Option<String>,
    pub tool_calls: Option<Vec<Value>>,
    pub annotations: Option<Vec<Value>>,
    pub reasoning_content: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct ChatFields {
    pub messages: Vec<ChatMessage>,
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<u32>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: bool,
    pub separate_reasoning: Option<bool>,
    /// vLLM's: the content starts with the last message's when that is the assistant's.
    pub echo: Option<bool>,
    /// vLLM's: `false` parses the reasoning apart but returns none of it.
    pub include_reasoning: Option<bool>,
    /// SGLang's: `false` streams the reasoning as one delta, once it ends.
    pub stream_reasoning: Option<bool>,
    /// vLLM's: the most tokens the reasoning may take before its end is forced.
    pub thinking_token_budget: Option<u64>,
    /// OpenAI's: a thinking budget as a share of the output's (`effort_budget`).
    pub reasoning_effort: Option<String>,
}

/// The reasoning efforts (OpenAI's `reasoning_effort` and `reasoning.effort`, Anthropic's
/// `output_config.effort`) and the share of the output's token budget (`max_tokens`) each
/// lets the thinking take, as (numerator, denominator); `max`: no cap.
pub const REASONING_EFFORTS: &[(&str, Option<(u64, u64)>)] = &[
    ("none", Some((0, 1))),
    ("minimal", Some((1, 10))),
    ("low", Some((1, 5))),
    ("medium", Some((1, 2))),
    ("high", Some((4, 5))),
    ("xhigh", Some((9, 10))),
    ("max", None),
];

/// The thinking budget of an effort for an output of `max_tokens` tokens (at least one
/// token but for `none`); `None` for `max`. Refuses an effort not known, naming `field`.
pub fn effort_budget(effort: &str, max_tokens: u64, field: &str) -> ApiResult<Option<u64>> {
    let Some((_, share)) = REASONING_EFFORTS.iter().find(|(name, _)| *name == effort) else {
        let names: Vec<&str> = REASONING_EFFORTS.iter().map(|(n, _)| *n).collect();
        return Err(ApiError::bad_request(format!("{field}: must be one of {}", names.join(", ")), field));
    };
    Ok(share.map(|(num, den)| {
        let budget = (max_tokens as u128 * num as u128 / den as u128) as u64;
        if num == 0 {
            0
        } else {
            budget.max(1)
        }
    }))
}

#[derive(Deserialize, Debug)]
pub struct NativeSampling {
    #[serde(default = "native_max_new_tokens")]
    pub max_new_tokens: u64,
    #[serde(default)]
    pub min_new_tokens: u64,
    #[serde(default = "one_f")]
    pub temperature: f64,
    #[serde(default = "one_f")]
    pub top_p: f64,
    #[serde(default = "minus_one")]
    pub top_k: i64,
    #[serde(default)]
    pub min_p: f64,
    #[serde(default = "one_f")]
    pub repetition_penalty: f64,
    #[serde(default)]
    pub frequency_penalty: f64,
    #[serde(default)]
    pub presence_penalty: f64,
    pub stop: Option<OneOrMany>,
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default = "yes")]
    pub skip_special_tokens: bool,
    #[serde(default)]
    pub no_stop_trim: bool,
    pub seed: Option<u64>,
    #[serde(default = "one")]
    pub n: u64,
    pub logit_bias: Option<BTreeMap<String, f64>>,
    pub regex: Option<String>,
    pub json_schema: Option<SchemaField>,
    pub ebnf: Option<String>,
    /// SGLang's; either value gives the same text, as `OpenAISampling`'s.
    pub spaces_between_special_tokens: Option<bool>,
    /// ferrolm's, as `OpenAISampling::speculative`.
    pub speculative: Option<bool>,
    /// vLLM's: the most tokens the reasoning may take before its end is forced.
    pub thinking_token_budget: Option<u64>,
}

fn native_max_new_tokens() -> u64 {
    128
}
fn one_f() -> f64 {
    1.0
}
fn minus_one() -> i64 {
    -1
}

#[derive(Deserialize, Debug)]
pub struct GenerateRequest {
    pub model: Option<String>,
    pub text: Option<String>,
    pub input_ids: Option<Vec<u32>>,
    pub sampling_params: Option<Value>,
    #[serde(default)]
    pub stream: bool,
    pub rid: Option<String>,
    #[serde(default)]
    pub return_logprob: bool,
    #[serde(default)]
    pub top_logprobs_num: u32,
    pub priority: Option<i64>,
    pub cache_salt: Option<String>,
    /// SGLang's: the LoRA adapter to run with, by name (or the folder it was loaded from).
    pub lora_path: Option<String>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub separate_reasoning: bool,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct AbortRequest {
    pub rid: Option<String>,
    #[serde(default)]
    pub abort_all: bool,
}

// ---- parsing ----

/// Checks the fields of the objects nested in OpenAI's bodies (`stream_options`,
/// `response_format`).
fn check_nested(obj: &Map<String, Value>) -> ApiResult<()> {
    if let Some(Value::Object(o)) = obj.get("stream_options") {
        check_fields(o, &[fields_of::<StreamOptions>()], "stream_options.")?;
        if o.get("continuous_usage_stats") == Some(&Value::Bool(true)) {
            return Err(ApiError::bad_request(
                "stream_options.continuous_usage_stats: true is not supported: usage comes in the last chunk \
                 (include_usage) (accepted: false, null)",
                "stream_options.continuous_usage_stats",
            ));
        }
    }
    if let Some(Value::Object(o)) = obj.get("response_format") {
        check_fields(o, &[&["type", "json_schema"]], "response_format.")?;
    }
    Ok(())
}

/// The fields a struct reads, as serde names them: the struct itself is the list a body's
/// fields are checked against. (Its `Deserialize` is asked to read a struct from a
/// deserializer that notes the field names it is given and reads nothing.)
fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error, Visitor};
    struct Names<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Names<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Error::custom("only the names are read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
            unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Names(&mut fields));
    fields
}

/// Refuses a field not in `known`, naming it as sent; on a route's top level, a field the
/// route does not read is judged by the [`field_policy`] (accepted when it is bookkeeping
/// or at its default, refused naming it and its value otherwise).
fn check_fields(obj: &Map<String, Value>, known: &[&[&str]], prefix: &str) -> ApiResult<()> {
    check_route_fields(obj, known, prefix, None)
}

fn check_route_fields(
    obj: &Map<String, Value>,
    known: &[&[&str]],
    prefix: &str,
    route: Option<Route>,
) -> ApiResult<()> {
    for (name, value) in obj {
        if known.iter().any(|k| k.contains(&name.as_str())) {
            continue;
        }
        let path = format!("{prefix}{name}");
        let reason = match route.and_then(|r| field_policy::check_unread(r, name, value)) {
            Some(Ok(())) => continue,
            Some(Err(reason)) => reason,
            None => {
                let mut fields: Vec<&str> = known.iter().flat_map(|k| k.iter().copied()).collect();
                fields.sort_unstable();
                fields.dedup();
                format!("unknown field (the fields here: {})", fields.join(", "))
            }
        };
        return Err(ApiError::bad_request(format!("{path}: {reason}"), path));
    }
    Ok(())
}

fn object(value: &Value) -> ApiResult<&Map<String, Value>> {
    value.as_object().ok_or_else(|| ApiError::new(400, "the body must be a JSON object"))
}

/// Deserializes `value` as `T`; a fault is a 400 whose `param` is the field's dotted path
/// (`messages.0.role`), a trailing list index dropped (`stop_token_ids`, not `.3`), and
/// nothing below a free-form map's key (`logit_bias`).
pub fn typed<T: DeserializeOwned>(value: &Value, prefix: &str) -> ApiResult<T> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let parts: Vec<String> = e
            .path()
            .iter()
            .filter_map(|seg| match seg {
                serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                _ => None,
            })
            .collect();
        let path = json_body::field_path(&parts);
        let inner = e.into_inner().to_string();
        match (prefix, path.as_str()) {
            ("", "") => ApiError::new(400, inner),
            (_, "") => {
                let param = prefix.trim_end_matches('.').to_string();
                ApiError::bad_request(format!("{param}: {inner}"), param)
            }
            _ => {
                let param = format!("{prefix}{path}");
                ApiError::bad_request(format!("{param}: {inner}"), param)
            }
        }
    })
}

// The fields that take one of several JSON shapes are told apart by the value's type
// (not by trying each shape in turn, as serde's untagged enums do), so that a value of no
// accepted shape is refused with a message of ours that says which shapes are accepted.

impl TryFrom<Value> for OneOrMany {
    type Error = String;
    fn try_from(value: Value) -> Result<Self, String> {
        const SHAPES: &str = "expected a string or a list of strings";
        match value {
            Value::String(s) => Ok(OneOrMany::One(s)),
            Value::Array(items) => strings(items).map(OneOrMany::Many).map_err(|_| SHAPES.into()),
            _ => Err(SHAPES.into()),
        }
    }
}

impl TryFrom<Value> for Prompt {
    type Error = String;
    fn try_from(value: Value) -> Result<Self, String> {
        const SHAPES: &str =
            "expected a string, a list of strings, a list of token ids or a list of lists of token ids";
        let items = match value {
            Value::String(s) => return Ok(Prompt::Text(s)),
            Value::Array(items) => items,
            _ => return Err(SHAPES.into()),
        };
        match items.first() {
            None | Some(Value::Number(_)) => token_ids(&items).map(Prompt::Ids),
            Some(Value::String(_)) => strings(items).map(Prompt::Texts).map_err(|_| SHAPES.into()),
            Some(Value::Array(_)) => items
                .iter()
                .map(|list| match list {
                    Value::Array(ids) => token_ids(ids),
                    _ => Err(SHAPES.into()),
                })
                .collect::<Result<_, _>>()
                .map(Prompt::IdLists),
            Some(_) => Err(SHAPES.into()),
        }
    }
}

impl TryFrom<Value> for Content {
    type Error = String;
    fn try_from(value: Value) -> Result<Self, String> {
        match value {
            Value::String(s) => Ok(Content::Text(s)),
            Value::Array(_) => serde_json::from_value(value)
                .map(Content::Parts)
                .map_err(|e| format!("a content part is not {{\"type\": \"text\", \"text\": ...}}: {e}")),
            _ => Err("expected a string or a list of content parts".into()),
        }
    }
}

fn strings(items: Vec<Value>) -> Result<Vec<String>, String> {
    items
        .into_iter()
        .map(|v| match v {
            Value::String(s) => Ok(s),
            _ => Err("expected strings".to_string()),
        })
        .collect()
}

/// Token ids: integers in 0..2^32, as the core takes them.
fn token_ids(items: &[Value]) -> Result<Vec<u32>, String> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| format!("token ids are integers in 0..2^32, got {v}"))
        })
        .collect()
}

pub struct CompletionRequest {
    pub sampling: OpenAISampling,
    pub fields: CompletionFields,
}

pub struct ChatRequest {
    pub sampling: OpenAISampling,
    pub fields: ChatFields,
}

pub fn parse_completion(body: &[u8]) -> ApiResult<CompletionRequest> {
    let value = json_body::parse(body)?;
    let obj = object(&value)?;
    check_route_fields(
        obj,
        &[fields_of::<OpenAISampling>(), fields_of::<CompletionFields>()],
        "",
        Some(Route::Completion),
    )?;
    check_nested(obj)?;
    if !obj.contains_key("prompt") {
        return Err(ApiError::bad_request("prompt: Field required", "prompt"));
    }
    let fields: CompletionFields = typed(&value, "")?;
    let sampling: OpenAISampling = typed(&value, "")?;
    check_sampling(&sampling)?;
    if let Some(lp) = fields.logprobs {
        if lp > 20 {
            return Err(ApiError::bad_request("logprobs: must be at most 20", "logprobs"));
        }
    }
    if fields.best_of == Some(0) {
        return Err(ApiError::bad_request("best_of: must be at least 1", "best_of"));
    }
    Ok(CompletionRequest { sampling, fields })
}

pub fn parse_chat(body: &[u8]) -> ApiResult<ChatRequest> {
    let value = json_body::parse(body)?;
    let obj = object(&value)?;
    check_route_fields(
        obj,
        &[fields_of::<OpenAISampling>(), fields_of::<ChatFields>()],
        "",
        Some(Route::Chat),
    )?;
    check_nested(obj)?;
    if !obj.contains_key("messages") {
        return Err(ApiError::bad_request("messages: Field required", "messages"));
    }
    if let Some(messages) = obj.get("messages") {
        check_messages(messages)?;
    }
    crate::tools::definitions::check_tool_shapes(obj, "")?;
    let fields: ChatFields = typed(&value, "")?;
    let sampling: OpenAISampling = typed(&value, "")?;
    check_sampling(&sampling)?;
    if fields.messages.is_empty() {
        return Err(ApiError::bad_request("messages: at least one message is required", "messages"));
    }
    if fields.max_completion_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "max_completion_tokens: must be at least 1",
            "max_completion_tokens",
        ));
    }
    if fields.top_logprobs.is_some_and(|t| t > 20) {
        return Err(ApiError::bad_request("top_logprobs: must be at most 20", "top_logprobs"));
    }
    Ok(ChatRequest { sampling, fields })
}

/// The fields of each chat message (unknown ones refused, the calls' shapes checked),
/// before they are read as [`ChatMessage`]s.
fn check_messages(messages: &Value) -> ApiResult<()> {
    let Value::Array(messages) = messages else { return Ok(()) };
    for (i, m) in messages.iter().enumerate() {
        if let Value::Object(m) = m {
            check_fields(m, &[fields_of::<ChatMessage>()], &format!("messages.{i}."))?;
            crate::tools::definitions::check_message_calls(m, i)?;
            if let Some(Value::Array(parts)) = m.get("content") {
                for (j, part) in parts.iter().enumerate() {
                    if let Value::Object(part) = part {
                        check_fields(part, &[&["type", "text"]], &format!("messages.{i}.content.{j}."))?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The chat fields of the offline API (`Engine.chat`), as one JSON object: `messages`,
/// `tools`, `tool_choice`, `parallel_tool_calls`, `chat_template_kwargs`,
/// `thinking_token_budget`; checked as the
/// HTTP body's are, errors naming the same fields.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct OfflineChat {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// `SamplingParams.thinking_token_budget`, which the prepared chat turns into the core's.
    pub thinking_token_budget: Option<u64>,
}

pub fn parse_offline_chat(value: &Value) -> ApiResult<OfflineChat> {
    let obj = object(value)?;
    check_fields(obj, &[fields_of::<OfflineChat>()], "")?;
    match obj.get("messages") {
        None => return Err(ApiError::bad_request("messages: Field required", "messages")),
        Some(m) => check_messages(m)?,
    }
    crate::tools::definitions::check_tool_shapes(obj, "")?;
    let chat: OfflineChat = typed(value, "")?;
    if chat.messages.is_empty() {
        return Err(ApiError::bad_request("messages: at least one message is required", "messages"));
    }
    Ok(chat)
}

/// The sampling fields of the offline API (`ferrolm.SamplingParams`: `_core.Engine.submit`'s
/// keywords and `n`), typed as the core takes them, so that a value of a wrong type or
/// sign is refused naming its field where the parameters are made, before any engine
/// sees them. Ranges are the core's, checked at submit.
#[derive(Deserialize, Debug)]
pub struct OfflineSampling {
    pub max_new_tokens: usize,
    pub min_new_tokens: usize,
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub logit_bias: Option<HashMap<u32, f32>>,
    pub seed: Option<u64>,
    pub logprobs: bool,
    pub top_logprobs: u32,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub include_stop_str: bool,
    pub skip_special_tokens: bool,
    pub ignore_eos: bool,
    pub n: NonZeroU32,
    pub allowed_token_ids: Option<Vec<u32>>,
    pub speculative: Option<bool>,
    pub thinking_token_budget: Option<u64>,
}

pub struct Generate {
    pub req: GenerateRequest,
    pub sampling: NativeSampling,
}

pub fn parse_generate(body: &[u8]) -> ApiResult<Generate> {
    let value = json_body::parse(body)?;
    let obj = object(&value)?;
    check_route_fields(obj, &[fields_of::<GenerateRequest>()], "", Some(Route::Generate))?;
    crate::tools::definitions::check_tool_shapes(obj, "")?;
    let req: GenerateRequest = typed(&value, "")?;
    let sp = req.sampling_params.clone().unwrap_or_else(|| Value::Object(Map::new()));
    let Value::Object(sp_obj) = &sp else {
        return Err(ApiError::bad_request("sampling_params: must be an object", "sampling_params"));
    };
    check_route_fields(sp_obj, &[fields_of::<NativeSampling>()], "sampling_params.", Some(Route::Sampling))?;
    let sampling: NativeSampling = typed(&sp, "sampling_params.")?;
    let bad = |f: &str, m: &str| {
        let p = format!("sampling_params.{f}");
        Err(ApiError::bad_request(format!("{p}: {m}"), p))
    };
    if sampling.max_new_tokens == 0 {
        return bad("max_new_tokens", "must be at least 1");
    }
    if !(1..=128).contains(&sampling.n) {
        return bad("n", "must be in [1, 128]");
    }
    if sampling.top_k < -1 || sampling.top_k > u32::MAX as i64 {
        return bad("top_k", "must be -1 (off) or in [0, 2**32)");
    }
    if sampling.temperature < 0.0 {
        return bad("temperature", "must be at least 0");
    }
    if req.top_logprobs_num > 20 {
        return Err(ApiError::bad_request("top_logprobs_num: must be at most 20", "top_logprobs_num"));
    }
    check_salt(req.cache_salt.as_deref())?;
    Ok(Generate { req, sampling })
}

pub fn parse_abort(body: &[u8]) -> ApiResult<AbortRequest> {
    let value = json_body::parse(body)?;
    let obj = object(&value)?;
    check_fields(obj, &[fields_of::<AbortRequest>()], "")?;
    typed(&value, "")
}

fn check_salt(salt: Option<&str>) -> ApiResult<()> {
    if let Some(s) = salt {
        let chars = s.chars().count();
        if !(1..=512).contains(&chars) {
            return Err(ApiError::bad_request("cache_salt: must have 1 to 512 characters", "cache_salt"));
        }
        // NUL separates an adapter's namespace from its salt (`Lora::namespace`)
        if s.contains('\0') {
            return Err(ApiError::bad_request("cache_salt: must not contain NUL characters", "cache_salt"));
        }
    }
    Ok(())
}

/// The ranges OpenAI's API sets and the core does not check (or checks in other words);
/// `response_format` is read (and checked) with the other structured fields.
fn check_sampling(s: &OpenAISampling) -> ApiResult<()> {
    let bad = |f: &str, m: &str| Err(ApiError::bad_request(format!("{f}: {m}"), f));
    if !(1..=128).contains(&s.n) {
        return bad("n", "must be in [1, 128]");
    }
    if s.temperature.is_some_and(|t| t < 0.0) {
        return bad("temperature", "must be at least 0");
    }
    if s.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return bad("top_p", "must be in (0, 1]");
    }
    if s.max_tokens == Some(0) {
        return bad("max_tokens", "must be at least 1");
    }
    if s.top_k.is_some_and(|k| k < -1 || k > u32::MAX as i64) {
        return bad("top_k", "must be -1 (off) or in [0, 2**32)");
    }
    if s.min_p.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return bad("min_p", "must be in [0, 1]");
    }
    if s.repetition_penalty.is_some_and(|p| p <= 0.0) {
        return bad("repetition_penalty", "must be above 0");
    }
    for (f, v) in [("frequency_penalty", s.frequency_penalty), ("presence_penalty", s.presence_penalty)] {
        if !(-2.0..=2.0).contains(&v) {
            return bad(f, "must be in [-2, 2]");
        }
    }
    if s.guided_choice.as_ref().is_some_and(|c| c.is_empty()) {
        return bad("guided_choice", "at least one choice is required");
    }
    check_salt(s.cache_salt.as_deref())
}

// ---- to the core's parameters ----

/// The structured output an OpenAI body asks for (at most one constraint).
pub fn openai_structured(s: &OpenAISampling) -> ApiResult<Option<Structured>> {
    let asked = Asked {
        regex: s.regex.as_deref(),
        json_schema: s.json_schema.as_ref(),
        ebnf: s.ebnf.as_deref(),
        guided_json: s.guided_json.as_ref(),
        guided_regex: s.guided_regex.as_deref(),
        guided_choice: s.guided_choice.as_deref(),
        guided_grammar: s.guided_grammar.as_deref(),
        grammar: s.grammar.as_deref(),
        response_format: s.response_format.as_ref(),
    };
    structured::constraint_of(&asked, "")
}

/// The structured output `/generate`'s `sampling_params` ask for.
pub fn native_structured(sp: &NativeSampling) -> ApiResult<Option<Structured>> {
    let asked = Asked {
        regex: sp.regex.as_deref(),
        json_schema: sp.json_schema.as_ref(),
        ebnf: sp.ebnf.as_deref(),
        ..Asked::default()
    };
    structured::constraint_of(&asked, "sampling_params.")
}

/// OpenAI sends token ids as JSON object keys: plain ASCII decimals in u32 range.
pub fn parse_logit_bias(bias: &BTreeMap<String, f64>, param: &str) -> ApiResult<Vec<(u32, f32)>> {
    let mut out = Vec::with_capacity(bias.len());
    for (key, &value) in bias {
        let digits = key.trim_start_matches('0');
        let ok = !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()) && digits.len() <= 10;
        let token = if ok { digits.parse::<u64>().unwrap_or(0) } else { u64::MAX };
        if !ok || token > u32::MAX as u64 {
            let shown: String = key.chars().take(40).collect();
            return Err(ApiError::bad_request(
                format!("{param}: key {shown:?} is not a token id (a decimal number below 2**32)"),
                param,
            ));
        }
        if !(-100.0..=100.0).contains(&value) {
            return Err(ApiError::bad_request(
                format!("{param}: bias {value} of token {token} is outside [-100, 100]"),
                param,
            ));
        }
        out.push((token as u32, value as f32));
    }
    out.sort_by_key(|b| b.0);
    Ok(out)
}

fn stop_strings(stop: Option<&OneOrMany>, param: &str) -> ApiResult<Vec<String>> {
    let stop = stop.cloned().map(OneOrMany::into_vec).unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad_request(format!("{param}: a stop string may not be empty"), param));
    }
    Ok(stop)
}

/// The core's request parameters from OpenAI's fields.
pub fn openai_params(
    s: &OpenAISampling,
    max_tokens: u64,
    logprobs: bool,
    top_logprobs: u32,
) -> ApiResult<RequestParams> {
    let stop = stop_strings(s.stop.as_ref(), "stop")?;
    let logit_bias = s.logit_bias.as_ref().map(|b| parse_logit_bias(b, "logit_bias")).transpose()?;
    Ok(RequestParams {
        sampling: SamplingParams {
            temperature: s.temperature.unwrap_or(1.0) as f32,
            top_k: match s.top_k {
                None | Some(-1) => 0,
                Some(k) => k as u32,
            },
            top_p: s.top_p.unwrap_or(1.0) as f32,
            min_p: s.min_p.unwrap_or(0.0) as f32,
            repetition_penalty: s.repetition_penalty.unwrap_or(1.0) as f32,
            frequency_penalty: s.frequency_penalty as f32,
            presence_penalty: s.presence_penalty as f32,
            logit_bias: logit_bias.unwrap_or_default(),
            seed: s.seed,
            logprobs,
            top_logprobs,
        },
        stops: StopConditions {
            stop_strings: stop,
            stop_token_ids: s.stop_token_ids.clone().unwrap_or_default(),
            include_stop_str: s.include_stop_str_in_output || s.no_stop_trim,
            skip_special_tokens: s.skip_special_tokens,
        },
        max_new_tokens: usize::try_from(max_tokens).unwrap_or(usize::MAX),
        min_new_tokens: usize::try_from(s.min_tokens).unwrap_or(usize::MAX),
        ignore_eos: s.ignore_eos,
        priority: s.priority.unwrap_or(0),
        namespace: s.cache_salt.clone(),
        queue_timeout_s: None,
        speculative: s.speculative,
        thinking: None, // the request core's, from the prepared chat
        lora: None,     // the server's registry resolves it (`AppState::lora_for`)
    })
}

/// The core's request parameters from `/generate`'s `sampling_params`.
pub fn native_params(g: &Generate) -> ApiResult<RequestParams> {
    let sp = &g.sampling;
    let stop = stop_strings(sp.stop.as_ref(), "sampling_params.stop")?;
    let logit_bias =
        sp.logit_bias.as_ref().map(|b| parse_logit_bias(b, "sampling_params.logit_bias")).transpose()?;
    Ok(RequestParams {
        sampling: SamplingParams {
            temperature: sp.temperature as f32,
            top_k: if sp.top_k == -1 { 0 } else { sp.top_k as u32 },
            top_p: sp.top_p as f32,
            min_p: sp.min_p as f32,
            repetition_penalty: sp.repetition_penalty as f32,
            frequency_penalty: sp.frequency_penalty as f32,
            presence_penalty: sp.presence_penalty as f32,
            logit_bias: logit_bias.unwrap_or_default(),
            seed: sp.seed,
            logprobs: g.req.return_logprob,
            top_logprobs: if g.req.return_logprob { g.req.top_logprobs_num } else { 0 },
        },
        stops: StopConditions {
            stop_strings: stop,
            stop_token_ids: sp.stop_token_ids.clone().unwrap_or_default(),
            include_stop_str: sp.no_stop_trim,
            skip_special_tokens: sp.skip_special_tokens,
        },
        max_new_tokens: usize::try_from(sp.max_new_tokens).unwrap_or(usize::MAX),
        min_new_tokens: usize::try_from(sp.min_new_tokens).unwrap_or(usize::MAX),
        ignore_eos: sp.ignore_eos,
        priority: g.req.priority.unwrap_or(0),
        namespace: g.req.cache_salt.clone(),
        queue_timeout_s: None,
        speculative: sp.speculative,
        thinking: None, // the request core's, from the prepared generate
        lora: None,     // the server's registry resolves it (`AppState::lora_for`)
    })
}

/// The core's refusal as a 400, its field renamed to the body's (`max_new_tokens` is
/// `max_tokens` in OpenAI's API, `input_ids` the prompt...).
pub fn core_field_error(e: EngineError, names: &dyn Fn(&str) -> Option<String>) -> ApiError {
    match e {
        EngineError::InvalidRequest { field, message } => {
            let param = names(field).unwrap_or_else(|| field.to_string());
            ApiError::bad_request(format!("{param}: {message}"), param)
        }
        other => ApiError::new(500, format!("the engine could not take the request: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_effort_is_a_share_of_the_output_budget() {
        let at = |e: &str, m: u64| effort_budget(e, m, "reasoning_effort").unwrap();
        assert_eq!(at("none", 1000), Some(0));
        assert_eq!(at("minimal", 1000), Some(100));
        assert_eq!(at("low", 1000), Some(200));
        assert_eq!(at("medium", 1000), Some(500));
        assert_eq!(at("high", 1000), Some(800));
        assert_eq!(at("xhigh", 1000), Some(900));
        assert_eq!(at("max", 1000), None, "no cap");
        assert_eq!(at("minimal", 3), Some(1), "at least a token");
        assert_eq!(at("high", u64::MAX), Some(u64::MAX / 5 * 4), "no overflow");
        let e = effort_budget("extreme", 10, "reasoning.effort").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning.effort"));
        assert!(e.message.contains("none, minimal, low, medium, high, xhigh, max"), "{}", e.message);
    }

    fn prompt(body: &str) -> ApiResult<Prompt> {
        parse_completion(body.as_bytes()).map(|r| r.fields.prompt)
    }

    #[test]
    fn each_prompt_shape_is_told_apart_by_its_type() {
        assert!(matches!(prompt(r#"{"prompt": "hi"}"#), Ok(Prompt::Text(t)) if t == "hi"));
        assert!(matches!(prompt(r#"{"prompt": [1, 2]}"#), Ok(Prompt::Ids(ids)) if ids == [1, 2]));
        assert!(matches!(prompt(r#"{"prompt": []}"#), Ok(Prompt::Ids(ids)) if ids.is_empty()));
        assert!(matches!(prompt(r#"{"prompt": ["a", "b"]}"#), Ok(Prompt::Texts(t)) if t == ["a", "b"]));
        assert!(matches!(prompt(r#"{"prompt": [[1], [4294967295]]}"#),
            Ok(Prompt::IdLists(l)) if l == [vec![1], vec![u32::MAX]]));
    }

    #[test]
    fn a_value_of_no_accepted_shape_names_the_field_and_the_shapes() {
        for (body, says) in [
            (r#"{"prompt": 3}"#, "expected a string, a list of strings"),
            (r#"{"prompt": [1, "a"]}"#, "token ids are integers in 0..2^32, got \"a\""),
            (r#"{"prompt": [4294967296]}"#, "token ids are integers in 0..2^32, got 4294967296"),
            (r#"{"prompt": [[1], 2]}"#, "expected a string, a list of strings"),
            (r#"{"prompt": ["a", 1]}"#, "expected a string, a list of strings"),
            (r#"{"prompt": "a", "stop": [1]}"#, "stop: expected a string or a list of strings"),
        ] {
            let err = prompt(body).expect_err(body);
            assert_eq!(err.status, 400, "{body}");
            assert!(err.message.contains(says), "{body}: {}", err.message);
            let field = if body.contains("stop") { "stop" } else { "prompt" };
            assert_eq!(err.param.as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn the_fields_known_are_the_structs_own() {
        assert_eq!(fields_of::<AbortRequest>(), ["rid", "abort_all"]);
        let err = parse_generate(br#"{"text": "x", "sampling_params": {"temp": 1}}"#).err().unwrap();
        assert_eq!(err.param.as_deref(), Some("sampling_params.temp"));
        assert!(
            err.message.contains("unknown field (the fields here: ebnf, frequency_penalty,"),
            "{}",
            err.message
        );
    }

    #[test]
    fn the_policys_read_fields_are_the_typed_requests_own() {
        let routes: [(Route, Vec<&str>); 4] = [
            (Route::Chat, [fields_of::<OpenAISampling>(), fields_of::<ChatFields>()].concat()),
            (Route::Completion, [fields_of::<OpenAISampling>(), fields_of::<CompletionFields>()].concat()),
            (Route::Generate, fields_of::<GenerateRequest>().to_vec()),
            (Route::Sampling, fields_of::<NativeSampling>().to_vec()),
        ];
        for (route, read) in routes {
            let mut listed: Vec<&str> = field_policy::FIELDS
                .iter()
                .filter(|f| f.routes.contains(&route) && matches!(f.rule, field_policy::Rule::Read))
                .map(|f| f.name)
                .collect();
            let mut read = read;
            read.sort_unstable();
            read.dedup();
            listed.sort_unstable();
            assert_eq!(listed, read, "{route:?}");
        }
    }

    #[test]
    fn router_defaults_are_accepted_and_other_values_named_with_their_value() {
        let chat = br#"{"messages": [{"role": "user", "content": "hi"}], "no_stop_trim": false,
            "continue_final_message": false, "return_hidden_states": false, "separate_reasoning": true,
            "stream_reasoning": true, "include_reasoning": true, "skip_special_tokens": true,
            "max_completion_tokens": 4, "logprobs": false, "ignore_eos": false}"#;
        assert!(parse_chat(chat).is_ok());
        let body = br#"{"messages": [{"role": "user", "content": "hi"}], "return_hidden_states": true}"#;
        let err = parse_chat(body).err().unwrap();
        assert_eq!(err.param.as_deref(), Some("return_hidden_states"));
        assert!(err.message.starts_with("return_hidden_states: true is not supported"), "{}", err.message);
        let gen = br#"{"model": null, "text": "x", "sampling_params": {"max_new_tokens": 2},
            "return_text_in_logprobs": false, "log_metrics": true, "return_hidden_states": false,
            "background": false, "no_logs": false, "return_bytes": false, "return_entropy": false}"#;
        assert!(parse_generate(gen).is_ok());
        let err = parse_generate(br#"{"text": "x", "sampling_params": {"stop_regex": "a+"}}"#).err().unwrap();
        assert_eq!(err.param.as_deref(), Some("sampling_params.stop_regex"));
        assert!(err.message.contains("\"a+\" is not supported"), "{}", err.message);
        let err = parse_completion(br#"{"prompt": "x", "frobnicate": 1}"#).err().unwrap();
        assert!(err.message.starts_with("frobnicate: unknown field"), "{}", err.message);
    }

    #[test]
    fn message_content_is_text_or_text_parts() {
        let chat = |content: &str| {
            let body = format!(r#"{{"messages": [{{"role": "user", "content": {content}}}]}}"#);
            parse_chat(body.as_bytes()).map(|r| r.fields.messages.into_iter().next().unwrap().content)
        };
        assert!(matches!(chat(r#""hi""#), Ok(Some(Content::Text(t))) if t == "hi"));
        assert!(
            matches!(chat(r#"[{"type": "text", "text": "a"}]"#), Ok(Some(Content::Parts(p))) if p.len() == 1)
        );
        let err = chat(r#"[{"type": "image", "text": "a"}]"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages.0.content"));
        assert!(err.message.contains("a content part is not"), "{}", err.message);
        let err = chat("7").unwrap_err();
        assert!(err.message.contains("expected a string or a list of content parts"), "{}", err.message);
    }
}
