//! `POST /v1/responses` and `GET /v1/responses/{id}`: OpenAI's Responses API as a
//! translation into a chat completion run by the one request core (see
//! [`super::translate`]). `instructions` becomes the system message; `input` (a string, or
//! message, `function_call`, `function_call_output` and `reasoning` items) becomes chat's
//! messages; function `tools`, `tool_choice` and `parallel_tool_calls` are chat's, calls
//! constrained alike; `text.format` becomes chat's `response_format`. The output items
//! (`reasoning`, `message`, `function_call`) come from the chat plan's parser; streamed,
//! they are Responses' typed events, each with its `sequence_number`.
//!
//! With `store` (the default) the response and its conversation are kept in memory for
//! `previous_response_id` and `GET /v1/responses/{id}`: the [`STORE_LIMIT`] most recently
//! used responses, at most [`STORE_BYTES`] in all, the least recently used dropped first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use ferrolm_core::engine::Finished;
use serde_json::{json, Map, Value};

use super::translate::{
    self, bad, check_fields, ending, named_event, object_at, opt_str, Ending, FieldPolicy, Policy, Renames,
};
use super::{json_response, read_body, respond, Tracked};
use crate::errors::{ApiError, ApiResult};
use crate::json_body;
use crate::response::{random_hex, unix_now, Usage};
use crate::state::AppState;
use crate::tools::output::{MessageBuilder, PieceKind, ToolCall};
use crate::tools::Piece;

/// Stored responses kept at most.
pub const STORE_LIMIT: usize = 1024;
/// Bytes of stored responses and conversations kept at most (their JSON).
pub const STORE_BYTES: usize = 64 << 20;

const NOT_HERE: &str = "OpenAI's platform feature, not part of this server";

/// The fields of a Responses request: OpenAI's API reference (`POST /v1/responses`), as
/// the `openai` Python SDK 3.63 types them (`ResponseCreateParamsBase`, and `stream`).
pub const RESPONSE_FIELDS: &[FieldPolicy] = &[
    ("model", Policy::Honoured),
    ("input", Policy::Honoured),
    ("instructions", Policy::Honoured),
    ("max_output_tokens", Policy::Honoured),
    ("temperature", Policy::Honoured),
    ("top_p", Policy::Honoured),
    ("tools", Policy::Honoured),
    ("tool_choice", Policy::Honoured),
    ("parallel_tool_calls", Policy::Honoured),
    ("text", Policy::Honoured),
    ("reasoning", Policy::Honoured),
    ("stream", Policy::Honoured),
    ("stream_options", Policy::Honoured),
    ("store", Policy::Honoured),
    ("previous_response_id", Policy::Honoured),
    ("metadata", Policy::Honoured),
    ("include", Policy::Honoured),
    ("truncation", Policy::Honoured),
    ("background", Policy::Honoured),
    ("user", Policy::NoEffect("it identifies the caller; it changes no token")),
    ("safety_identifier", Policy::NoEffect("it identifies the caller; it changes no token")),
    ("prompt_cache_key", Policy::NoEffect("the prefix cache needs no key")),
    ("service_tier", Policy::NoEffect("there is one tier")),
    (
        "max_tool_calls",
        Policy::Refused("the number of calls can only be limited to one (parallel_tool_calls)"),
    ),
    ("top_logprobs", Policy::Refused("logprobs are not returned here; use /v1/chat/completions")),
    ("conversation", Policy::Refused("conversations are not stored; use previous_response_id")),
    ("prompt", Policy::Refused("prompt templates are not stored here")),
    ("prompt_cache_retention", Policy::Refused("the prefix cache keeps what fits, for no set time")),
    ("prompt_cache_options", Policy::Refused(NOT_HERE)),
    ("context_management", Policy::Refused("the context is not compacted")),
    ("moderation", Policy::Refused(NOT_HERE)),
    ("access_programs", Policy::Refused(NOT_HERE)),
    ("background_options", Policy::Refused("background responses are not supported")),
    ("image", Policy::Refused("images are not supported")),
];

const MESSAGE_ITEM: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("role", Policy::Honoured),
    ("content", Policy::Honoured),
    ("id", Policy::NoEffect("an item's id changes no token")),
    ("status", Policy::NoEffect("an item's status changes no token")),
    ("phase", Policy::Refused("message phases are not supported")),
];
const CALL_ITEM: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("call_id", Policy::Honoured),
    ("name", Policy::Honoured),
    ("arguments", Policy::Honoured),
    ("id", Policy::NoEffect("an item's id changes no token")),
    ("status", Policy::NoEffect("an item's status changes no token")),
    ("caller", Policy::Refused("programmatic tool calling is not supported")),
    ("namespace", Policy::Refused("tool namespaces are not supported")),
];
const OUTPUT_ITEM: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("call_id", Policy::Honoured),
    ("output", Policy::Honoured),
    ("id", Policy::NoEffect("an item's id changes no token")),
    ("status", Policy::NoEffect("an item's status changes no token")),
    ("name", Policy::NoEffect("the call is found by its call_id")),
    ("caller", Policy::Refused("programmatic tool calling is not supported")),
    ("namespace", Policy::Refused("tool namespaces are not supported")),
];
const REASONING_ITEM: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("summary", Policy::Honoured),
    ("content", Policy::Honoured),
    ("id", Policy::NoEffect("an item's id changes no token")),
    ("status", Policy::NoEffect("an item's status changes no token")),
    // what `include: ["reasoning.encrypted_content"]` gave back: the text, read again
    ("encrypted_content", Policy::Honoured),
];
const FUNCTION_TOOL: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("name", Policy::Honoured),
    ("description", Policy::Honoured),
    ("parameters", Policy::Honoured),
    ("strict", Policy::Honoured),
    ("allowed_callers", Policy::Refused("programmatic tool calling is not supported")),
    ("defer_loading", Policy::Refused("tool search is not supported")),
    ("output_schema", Policy::Refused("tool output schemas are not supported")),
];
const TEXT_FIELDS: &[FieldPolicy] =
    &[("format", Policy::Honoured), ("verbosity", Policy::Refused("the verbosity cannot be set"))];
const FORMAT_FIELDS: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("name", Policy::Honoured),
    ("schema", Policy::Honoured),
    ("description", Policy::Honoured),
    ("strict", Policy::Honoured),
];
const REASONING_FIELDS: &[FieldPolicy] = &[
    ("effort", Policy::Honoured),
    ("summary", Policy::Honoured),
    ("generate_summary", Policy::Honoured),
    ("context", Policy::Refused("which turns' reasoning is kept is the chat template's")),
    ("mode", Policy::Refused("there is one reasoning mode")),
];

/// A response kept for `previous_response_id` and `GET /v1/responses/{id}`.
struct Stored {
    response: Value,
    /// Its conversation as chat messages (without `instructions`), its output included.
    conversation: Vec<Value>,
    bytes: usize,
}

/// The stored responses, least recently used first out.
#[derive(Default)]
pub struct ResponseStore {
    inner: Mutex<StoreInner>,
}

#[derive(Default)]
struct StoreInner {
    items: HashMap<String, Stored>,
    /// Ids, least recently used first.
    order: VecDeque<String>,
    bytes: usize,
}

impl StoreInner {
    fn touch(&mut self, id: &str) {
        if let Some(at) = self.order.iter().position(|x| x == id) {
            let id = self.order.remove(at).expect("found");
            self.order.push_back(id);
        }
    }
}

impl ResponseStore {
    fn put(&self, id: String, response: Value, conversation: Vec<Value>) {
        let bytes =
            response.to_string().len() + conversation.iter().map(|m| m.to_string().len()).sum::<usize>();
        let mut s = self.inner.lock().unwrap();
        if let Some(old) = s.items.remove(&id) {
            s.bytes -= old.bytes;
            s.order.retain(|x| x != &id);
        }
        s.bytes += bytes;
        s.items.insert(id.clone(), Stored { response, conversation, bytes });
        s.order.push_back(id);
        while s.items.len() > STORE_LIMIT || (s.bytes > STORE_BYTES && s.order.len() > 1) {
            let Some(oldest) = s.order.pop_front() else { break };
            if let Some(gone) = s.items.remove(&oldest) {
                s.bytes -= gone.bytes;
            }
        }
    }

    fn response(&self, id: &str) -> Option<Value> {
        let mut s = self.inner.lock().unwrap();
        s.touch(id);
        s.items.get(id).map(|x| x.response.clone())
    }

    fn conversation(&self, id: &str) -> Option<Vec<Value>> {
        let mut s = self.inner.lock().unwrap();
        s.touch(id);
        s.items.get(id).map(|x| x.conversation.clone())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().items.len()
    }
}

pub fn routes() -> Router<Arc<AppState>> {
    let store = Arc::new(ResponseStore::default());
    let for_get = store.clone();
    Router::new()
        .route(
            "/v1/responses",
            post(move |State(state): State<Arc<AppState>>, body: Body| {
                let store = store.clone();
                async move {
                    respond(
                        async { create(state.clone(), store, read_body(&state, body).await?).await }.await,
                    )
                }
            }),
        )
        .route(
            "/v1/responses/{id}",
            get(move |Path(id): Path<String>| {
                let store = for_get.clone();
                async move {
                    match store.response(&id) {
                        Some(r) => json_response(&r),
                        None => {
                            respond(Err(ApiError::new(404, format!("no stored response has the id {id:?}"))
                                .with_param(Some("id".into()))))
                        }
                    }
                }
            }),
        )
}

/// What the request asked, echoed in its response object.
struct Echo {
    id: String,
    created_at: u64,
    model: String,
    fields: Map<String, Value>,
}

impl Echo {
    /// The response object, `status` and `output` as given.
    fn object(&self, status: &str, output: Vec<Value>, usage: Option<Value>, incomplete: bool) -> Value {
        let mut r = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "model": self.model,
            "output": output,
            "usage": usage,
        });
        for (k, v) in &self.fields {
            r[k.as_str()] = v.clone();
        }
        r
    }
}

/// A Responses request as a chat body (its messages after `prior`), with the renames of
/// chat's fields and this request's own conversation (its input as chat messages).
struct Translated {
    chat: Map<String, Value>,
    renames: Renames,
    /// The chat messages of this request's input (for the store).
    input: Vec<Value>,
    reasoning: ReasoningOut,
}

/// How reasoning items are written: with the text as a summary too (`reasoning.summary`),
/// and with `encrypted_content` (`include: ["reasoning.encrypted_content"]`), which lets a
/// stateless client (`store: false`, as Codex runs) hand the reasoning back next turn.
/// Nothing is encrypted here: the field is the text in base64, opaque to the client as
/// OpenAI's is, and read back as the text.
#[derive(Clone, Copy, Debug, Default)]
struct ReasoningOut {
    summary: bool,
    encrypted: bool,
}

/// `include`'s values: the one ferrolm can add, or a 400 naming the value.
fn parse_include(obj: &Map<String, Value>) -> ApiResult<bool> {
    let Some(include) = obj.get("include").filter(|v| !v.is_null()) else { return Ok(false) };
    let include = include.as_array().ok_or_else(|| bad("include", "expected a list"))?;
    let mut encrypted = false;
    for (i, value) in include.iter().enumerate() {
        match value.as_str() {
            Some("reasoning.encrypted_content") => encrypted = true,
            Some(other) => {
                return Err(bad(
                    &format!("include.{i}"),
                    format!(
                        "not supported: {other:?} (only \"reasoning.encrypted_content\" can be included)"
                    ),
                ))
            }
            None => return Err(bad(&format!("include.{i}"), "expected a string")),
        }
    }
    Ok(encrypted)
}

fn encode_reasoning(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn decode_reasoning(encoded: &str, field: &str) -> ApiResult<String> {
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| bad(field, "not reasoning this server returned (base64 of UTF-8 text)"))
}

fn translate(obj: &Map<String, Value>, prior: Vec<Value>) -> ApiResult<Translated> {
    let mut chat = Map::new();
    let mut renames = Renames::default();
    if let Some(m) = obj.get("model") {
        chat.insert("model".into(), m.clone());
    }
    let mut messages = Vec::new();
    if let Some(instructions) = opt_str(obj, "instructions", "instructions")? {
        renames.add("messages.0", "instructions");
        messages.push(json!({"role": "system", "content": instructions}));
    }
    for m in prior {
        renames.add(format!("messages.{}", messages.len()), "previous_response_id");
        messages.push(m);
    }
    let first_input = messages.len();
    match obj.get("input") {
        None | Some(Value::Null) => return Err(bad("input", "Field required")),
        Some(Value::String(s)) => {
            renames.add(format!("messages.{}", messages.len()), "input");
            messages.push(json!({"role": "user", "content": s}));
        }
        Some(Value::Array(items)) => {
            if items.is_empty() {
                return Err(bad("input", "at least one item is required"));
            }
            translate_items(items, &mut messages, &mut renames)?;
        }
        Some(_) => return Err(bad("input", "expected a string or a list of items")),
    }
    let input = messages[first_input..].to_vec();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(m) = obj.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), m.clone());
        renames.add("max_tokens", "max_output_tokens");
    }
    for key in ["temperature", "top_p", "stream", "parallel_tool_calls"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.into(), v.clone());
        }
    }
    translate_tools(obj, &mut chat, &mut renames)?;
    if let Some(text) = obj.get("text").filter(|v| !v.is_null()) {
        let text = object_at(text, "text")?;
        check_fields(text, TEXT_FIELDS, "text.")?;
        if let Some(format) = text.get("format").filter(|v| !v.is_null()) {
            let f = object_at(format, "text.format")?;
            check_fields(f, FORMAT_FIELDS, "text.format.")?;
            match opt_str(f, "type", "text.format.type")? {
                Some("text") => {}
                Some("json_object") => {
                    chat.insert("response_format".into(), json!({"type": "json_object"}));
                }
                Some("json_schema") => {
                    let mut js = Map::new();
                    for key in ["name", "schema", "description", "strict"] {
                        if let Some(v) = f.get(key).filter(|v| !v.is_null()) {
                            js.insert(key.into(), v.clone());
                        }
                    }
                    if !js.contains_key("name") {
                        return Err(bad("text.format.name", "Field required"));
                    }
                    chat.insert("response_format".into(), json!({"type": "json_schema", "json_schema": js}));
                    renames.add("response_format.json_schema", "text.format");
                }
                _ => return Err(bad("text.format.type", "must be 'text', 'json_object' or 'json_schema'")),
            }
            renames.add("response_format", "text.format");
        }
    }
    let mut summary = false;
    let encrypted = parse_include(obj)?;
    if let Some(reasoning) = obj.get("reasoning").filter(|v| !v.is_null()) {
        let r = object_at(reasoning, "reasoning")?;
        check_fields(r, REASONING_FIELDS, "reasoning.")?;
        // the effort also caps the thinking at its share of max_output_tokens (chat's
        // reasoning_effort: protocol::REASONING_EFFORTS)
        renames.add("reasoning_effort", "reasoning.effort");
        match opt_str(r, "effort", "reasoning.effort")? {
            None => {}
            Some(e @ "none") => {
                chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": false}));
                chat.insert("reasoning_effort".into(), json!(e));
            }
            Some(e @ ("minimal" | "low" | "medium" | "high" | "xhigh")) => {
                chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": true}));
                chat.insert("reasoning_effort".into(), json!(e));
            }
            Some(_) => {
                return Err(bad("reasoning.effort", "must be one of none, minimal, low, medium, high, xhigh"))
            }
        }
        for key in ["summary", "generate_summary"] {
            match opt_str(r, key, &format!("reasoning.{key}"))? {
                None => {}
                Some("auto" | "concise" | "detailed") => summary = true,
                Some(_) => {
                    return Err(bad(&format!("reasoning.{key}"), "must be 'auto', 'concise' or 'detailed'"))
                }
            }
        }
    }
    Ok(Translated { chat, renames, input, reasoning: ReasoningOut { summary, encrypted } })
}

/// Input items as chat messages: calls join the assistant message before them, reasoning
/// goes with the assistant message after it.
fn translate_items(items: &[Value], out: &mut Vec<Value>, renames: &mut Renames) -> ApiResult<()> {
    let mut reasoning: Option<String> = None;
    // whether the last chat message is an assistant message that calls may join
    let mut joinable = false;
    for (i, item) in items.iter().enumerate() {
        let path = format!("input.{i}");
        let item = object_at(item, &path)?;
        let field = |k: &str| format!("{path}.{k}");
        let kind = opt_str(item, "type", &field("type"))?.unwrap_or("message");
        match kind {
            "message" => {
                check_fields(item, MESSAGE_ITEM, &format!("{path}."))?;
                let role = opt_str(item, "role", &field("role"))?.ok_or_else(|| bad(&field("role"), "Field required"))?;
                if !["user", "assistant", "system", "developer"].contains(&role) {
                    return Err(bad(&field("role"), "must be user, assistant, system or developer"));
                }
                let content = item.get("content").ok_or_else(|| bad(&field("content"), "Field required"))?;
                let text = content_text(content, &field("content"))?;
                let mut msg = json!({"role": role, "content": text});
                if role == "assistant" {
                    if let Some(r) = reasoning.take() {
                        msg["reasoning_content"] = Value::String(r);
                    }
                }
                renames.add(format!("messages.{}", out.len()), path);
                out.push(msg);
                joinable = role == "assistant";
            }
            "function_call" => {
                check_fields(item, CALL_ITEM, &format!("{path}."))?;
                let get = |k: &str| {
                    opt_str(item, k, &field(k))?.ok_or_else(|| bad(&field(k), "Field required"))
                };
                let call = json!({
                    "id": get("call_id")?,
                    "type": "function",
                    "function": {"name": get("name")?, "arguments": get("arguments")?},
                });
                if !joinable {
                    let mut msg = json!({"role": "assistant", "content": null});
                    if let Some(r) = reasoning.take() {
                        msg["reasoning_content"] = Value::String(r);
                    }
                    renames.add(format!("messages.{}", out.len()), path.clone());
                    out.push(msg);
                    joinable = true;
                }
                let last = out.len() - 1;
                let calls = out[last].as_object_mut().expect("a message").entry("tool_calls").or_insert(json!([]));
                let calls = calls.as_array_mut().expect("a list");
                renames.add(format!("messages.{last}.tool_calls.{}", calls.len()), path);
                calls.push(call);
            }
            "function_call_output" => {
                check_fields(item, OUTPUT_ITEM, &format!("{path}."))?;
                let id = opt_str(item, "call_id", &field("call_id"))?
                    .ok_or_else(|| bad(&field("call_id"), "Field required"))?;
                let output = item.get("output").ok_or_else(|| bad(&field("output"), "Field required"))?;
                let text = content_text(output, &field("output"))?;
                renames.add(format!("messages.{}", out.len()), path);
                out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
                joinable = false;
            }
            "reasoning" => {
                check_fields(item, REASONING_ITEM, &format!("{path}."))?;
                let mut text = String::new();
                for key in ["content", "summary"] {
                    if let Some(parts) = item.get(key).filter(|v| !v.is_null()) {
                        let t = content_text(parts, &field(key))?;
                        if text.is_empty() {
                            text = t;
                        }
                    }
                }
                if let Some(encoded) = item.get("encrypted_content").filter(|v| !v.is_null()) {
                    let key = field("encrypted_content");
                    let encoded = encoded.as_str().ok_or_else(|| bad(&key, "expected a string"))?;
                    let decoded = decode_reasoning(encoded, &key)?;
                    if text.is_empty() {
                        text = decoded;
                    }
                }
                reasoning = Some(text);
                joinable = false;
            }
            other => {
                return Err(bad(
                    &field("type"),
                    format!("{other:?} items are not supported (message, function_call, function_call_output, reasoning)"),
                ))
            }
        }
    }
    if let Some(r) = reasoning {
        out.push(json!({"role": "assistant", "content": "", "reasoning_content": r}));
    }
    Ok(())
}

/// A string, or text parts (`input_text`, `output_text`, `summary_text`,
/// `reasoning_text`) joined.
fn content_text(v: &Value, field: &str) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                let path = format!("{field}.{j}");
                let p = object_at(p, &path)?;
                let kind = opt_str(p, "type", &format!("{path}.type"))?.unwrap_or("");
                if !["input_text", "output_text", "summary_text", "reasoning_text"].contains(&kind) {
                    return Err(bad(
                        &format!("{path}.type"),
                        format!("{kind:?} parts are not supported (input_text, output_text)"),
                    ));
                }
                let table: &[FieldPolicy] = &[
                    ("type", Policy::Honoured),
                    ("text", Policy::Honoured),
                    ("annotations", Policy::NoEffect("an answer's annotations change no token")),
                    ("logprobs", Policy::NoEffect("an answer's logprobs change no token")),
                ];
                check_fields(p, table, &format!("{path}."))?;
                let text = opt_str(p, "text", &format!("{path}.text"))?
                    .ok_or_else(|| bad(&format!("{path}.text"), "Field required"))?;
                out.push_str(text);
            }
            Ok(out)
        }
        _ => Err(bad(field, "expected a string or a list of text parts")),
    }
}

fn translate_tools(
    obj: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    renames: &mut Renames,
) -> ApiResult<()> {
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let tools = tools.as_array().ok_or_else(|| bad("tools", "expected a list of tools"))?;
        let mut out = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let path = format!("tools.{i}");
            let t = object_at(t, &path)?;
            match opt_str(t, "type", &format!("{path}.type"))? {
                Some("function") => {}
                Some(other) => {
                    return Err(bad(
                        &format!("{path}.type"),
                        format!("{other:?} tools are not supported: only function tools"),
                    ))
                }
                None => return Err(bad(&format!("{path}.type"), "Field required")),
            }
            check_fields(t, FUNCTION_TOOL, &format!("{path}."))?;
            let mut function = Map::new();
            for key in ["name", "description", "parameters", "strict"] {
                if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                    function.insert(key.into(), v.clone());
                }
            }
            out.push(json!({"type": "function", "function": function}));
            renames.add(format!("tools.{i}.function"), path.clone());
            renames.add(format!("tools.{i}"), path);
        }
        if !out.is_empty() {
            chat.insert("tools".into(), Value::Array(out));
        }
    }
    match obj.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            chat.insert("tool_choice".into(), Value::String(s.clone()));
        }
        Some(Value::Object(c)) => {
            if opt_str(c, "type", "tool_choice.type")? != Some("function") {
                return Err(bad(
                    "tool_choice.type",
                    "only 'function' choices are supported (or none, auto, required)",
                ));
            }
            check_fields(c, &[("type", Policy::Honoured), ("name", Policy::Honoured)], "tool_choice.")?;
            let name = opt_str(c, "name", "tool_choice.name")?
                .ok_or_else(|| bad("tool_choice.name", "Field required"))?;
            chat.insert("tool_choice".into(), json!({"type": "function", "function": {"name": name}}));
            renames.add("tool_choice.function.name", "tool_choice.name");
        }
        Some(_) => return Err(bad("tool_choice", "expected a string or an object")),
    }
    Ok(())
}

/// The request's settings that are checked here, not by the chat path.
fn check_settings(obj: &Map<String, Value>) -> ApiResult<()> {
    let flag = |key: &str| match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(key, "expected a boolean")),
    };
    if flag("background")? == Some(true) {
        return Err(bad("background", "not supported: background responses"));
    }
    flag("store")?;
    match opt_str(obj, "truncation", "truncation")? {
        None | Some("disabled") => {}
        Some("auto") => return Err(bad("truncation", "not supported: 'auto' (the input is never cut)")),
        Some(_) => return Err(bad("truncation", "must be 'auto' or 'disabled'")),
    }
    if let Some(so) = obj.get("stream_options").filter(|v| !v.is_null()) {
        let so = object_at(so, "stream_options")?;
        check_fields(so, &[("include_obfuscation", Policy::Honoured)], "stream_options.")?;
        match so.get("include_obfuscation") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => {
                return Err(bad("stream_options.include_obfuscation", "not supported: deltas are not padded"))
            }
            Some(_) => return Err(bad("stream_options.include_obfuscation", "expected a boolean")),
        }
    }
    if let Some(meta) = obj.get("metadata").filter(|v| !v.is_null()) {
        let meta = object_at(meta, "metadata")?;
        if meta.len() > 16 || meta.values().any(|v| v.as_str().is_none_or(|s| s.chars().count() > 512)) {
            return Err(bad("metadata", "at most 16 string values of at most 512 characters"));
        }
    }
    Ok(())
}

/// The fields a response object echoes, as the request set them (or their defaults).
fn echoed(obj: &Map<String, Value>, state: &AppState) -> Map<String, Value> {
    let get = |k: &str, default: Value| obj.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(default);
    let mut m = Map::new();
    m.insert("instructions".into(), get("instructions", Value::Null));
    m.insert("max_output_tokens".into(), get("max_output_tokens", Value::Null));
    m.insert("metadata".into(), get("metadata", json!({})));
    m.insert("parallel_tool_calls".into(), get("parallel_tool_calls", json!(true)));
    m.insert("previous_response_id".into(), get("previous_response_id", Value::Null));
    m.insert("reasoning".into(), get("reasoning", json!({"effort": null, "summary": null})));
    m.insert("store".into(), get("store", json!(true)));
    m.insert("temperature".into(), get("temperature", json!(1.0)));
    m.insert("text".into(), get("text", json!({"format": {"type": "text"}})));
    m.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    m.insert("tools".into(), get("tools", json!([])));
    m.insert("top_p".into(), get("top_p", json!(1.0)));
    m.insert("truncation".into(), get("truncation", json!("disabled")));
    m.insert("user".into(), get("user", Value::Null));
    m.insert("service_tier".into(), json!("default"));
    let _ = state;
    m
}

pub async fn create(state: Arc<AppState>, store: Arc<ResponseStore>, body: Bytes) -> ApiResult<Response> {
    let Value::Object(obj) = json_body::parse(&body)? else {
        return Err(ApiError::new(400, "the body must be a JSON object"));
    };
    check_fields(&obj, RESPONSE_FIELDS, "")?;
    check_settings(&obj)?;
    let prior = match opt_str(&obj, "previous_response_id", "previous_response_id")? {
        None => Vec::new(),
        Some(id) => store.conversation(id).ok_or_else(|| {
            bad(
                "previous_response_id",
                format!("no stored response has the id {id:?} (kept: the {STORE_LIMIT} most recently used)"),
            )
        })?,
    };
    let t = translate(&obj, prior.clone())?;
    let (job, gen) = translate::run_chat(&state, &Value::Object(t.chat), &t.renames).await?;
    let echo = Echo {
        id: format!("resp_{}", random_hex(32)),
        created_at: unix_now(),
        model: super::openai::served_name(&state, &job.params).to_string(),
        fields: echoed(&obj, &state),
    };
    let keep = obj.get("store").and_then(Value::as_bool) != Some(false);
    let mut conversation = prior;
    conversation.extend(t.input);
    let mut tracked = Tracked::new(&state, echo.id.clone(), gen);
    let plan = &job.prepared.plan;
    if job.stream {
        let events = ResponseEvents {
            echo,
            reasoning: t.reasoning,
            store: keep.then_some((store, conversation)),
            seq: 0,
            items: Vec::new(),
            open: None,
            built: MessageBuilder::default(),
        };
        return Ok(translate::stream(tracked, plan.output_parser(), events));
    }
    let (text, finished) = translate::run_whole(&mut tracked.gen).await?;
    let built = crate::tools::output::parse_whole(plan, &text);
    let output = output_items(&built, t.reasoning);
    let usage = usage(&finished, tracked.gen.samples[0].output.token_ids.len(), &built);
    let incomplete = ending(&finished) == Ending::Length;
    let status = if incomplete { "incomplete" } else { "completed" };
    let response = echo.object(status, output, Some(usage), incomplete);
    if keep {
        conversation.push(assistant_message(&built));
        store.put(echo.id.clone(), response.clone(), conversation);
    }
    Ok(json_response(&response))
}

/// The output as the chat message a later turn's template takes.
fn assistant_message(built: &MessageBuilder) -> Value {
    let mut m = json!({"role": "assistant", "content": built.content});
    if !built.reasoning.is_empty() {
        m["reasoning_content"] = Value::String(built.reasoning.clone());
    }
    if !built.calls.is_empty() {
        m["tool_calls"] = built
            .calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    m
}

fn reasoning_item(id: &str, text: &str, style: ReasoningOut, status: &str) -> Value {
    let summary = if style.summary { json!([{"type": "summary_text", "text": text}]) } else { json!([]) };
    let mut item = json!({"id": id, "type": "reasoning", "summary": summary,
           "content": [{"type": "reasoning_text", "text": text}], "status": status});
    if style.encrypted {
        item["encrypted_content"] = json!(encode_reasoning(text));
    }
    item
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([text_part(text)]) };
    json!({"id": id, "type": "message", "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call: &ToolCall, status: &str) -> Value {
    json!({"id": id, "type": "function_call", "status": status, "call_id": call.id,
           "name": call.name, "arguments": call.arguments})
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex(32))
}

fn output_items(built: &MessageBuilder, reasoning: ReasoningOut) -> Vec<Value> {
    let mut out = Vec::new();
    if !built.reasoning.is_empty() {
        out.push(reasoning_item(&item_id("rs"), &built.reasoning, reasoning, "completed"));
    }
    if !built.content.is_empty() {
        out.push(message_item(&item_id("msg"), &built.content, "completed"));
    }
    for call in &built.calls {
        out.push(call_item(&item_id("fc"), call, "completed"));
    }
    out
}

/// Responses' usage: cached prompt tokens apart, reasoning tokens counted roughly by the
/// share of the output's characters (the parser works on text, not tokens).
fn usage(f: &Finished, output_tokens: usize, built: &MessageBuilder) -> Value {
    let chars = |s: &str| s.chars().count();
    let total: usize = chars(&built.reasoning)
        + chars(&built.content)
        + built.calls.iter().map(|c| chars(&c.name) + chars(&c.arguments)).sum::<usize>();
    let reasoning_tokens = (output_tokens * chars(&built.reasoning)).checked_div(total).unwrap_or(0);
    json!({
        "input_tokens": f.prompt_tokens,
        "input_tokens_details": {"cached_tokens": f.cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": f.prompt_tokens + output_tokens,
    })
}

/// Responses' typed events: `response.created`, `response.in_progress`, per output item
/// `response.output_item.added`, its parts and deltas, its `.done` events and
/// `response.output_item.done`; at the end `response.completed` (or
/// `response.incomplete` when the budget ran out). Each event has its `sequence_number`.
struct ResponseEvents {
    echo: Echo,
    reasoning: ReasoningOut,
    store: Option<(Arc<ResponseStore>, Vec<Value>)>,
    seq: u64,
    /// The output items finished so far.
    items: Vec<Value>,
    /// The open item: its kind, id and text so far (a call's: its index among the calls).
    open: Option<(PieceKind, String, String, usize)>,
    built: MessageBuilder,
}

impl ResponseEvents {
    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut payload: Value) {
        payload["type"] = json!(kind);
        payload["sequence_number"] = json!(self.seq);
        self.seq += 1;
        named_event(out, kind, &payload);
    }

    fn output_index(&self) -> usize {
        self.items.len()
    }

    fn open_item(&mut self, out: &mut Vec<u8>, kind: PieceKind, piece: &Piece) {
        self.close(out);
        let index = self.output_index();
        let (id, item) = match kind {
            PieceKind::Reasoning => {
                let id = item_id("rs");
                let item = json!({"id": id, "type": "reasoning", "summary": [], "status": "in_progress"});
                (id, item)
            }
            PieceKind::Content => {
                let id = item_id("msg");
                (id.clone(), message_item(&id, "", "in_progress"))
            }
            PieceKind::Call | PieceKind::Arguments => {
                let id = item_id("fc");
                let call = ToolCall {
                    id: piece.call_id.clone(),
                    name: piece.text.clone(),
                    arguments: String::new(),
                };
                (id.clone(), call_item(&id, &call, "in_progress"))
            }
        };
        self.emit(out, "response.output_item.added", json!({"output_index": index, "item": item}));
        if kind == PieceKind::Content {
            self.emit(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            );
        }
        self.open = Some((kind, id, String::new(), piece.index));
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        let Some((kind, id, text, call_index)) = self.open.take() else { return };
        let index = self.output_index();
        let item = match kind {
            PieceKind::Reasoning => {
                self.emit(
                    out,
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                reasoning_item(&id, &text, self.reasoning, "completed")
            }
            PieceKind::Content => {
                self.emit(
                    out,
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                );
                self.emit(
                    out,
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(&text)}),
                );
                message_item(&id, &text, "completed")
            }
            PieceKind::Call | PieceKind::Arguments => {
                let call = self.built.calls[call_index].clone();
                self.emit(
                    out,
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments}),
                );
                call_item(&id, &call, "completed")
            }
        };
        self.emit(out, "response.output_item.done", json!({"output_index": index, "item": item}));
        self.items.push(item);
    }
}

impl translate::Events for ResponseEvents {
    fn start(&mut self, out: &mut Vec<u8>) {
        let r = self.echo.object("in_progress", Vec::new(), None, false);
        self.emit(out, "response.created", json!({"response": r}));
        self.emit(out, "response.in_progress", json!({"response": r}));
    }

    fn pieces(&mut self, out: &mut Vec<u8>, pieces: Vec<Piece>) {
        for p in pieces {
            let open = self.open.as_ref().map(|o| o.0);
            match p.kind {
                PieceKind::Reasoning | PieceKind::Content => {
                    if open != Some(p.kind) {
                        self.open_item(out, p.kind, &p);
                    }
                    let (_, id, text, _) = self.open.as_mut().expect("opened");
                    text.push_str(&p.text);
                    let id = id.clone();
                    let index = self.output_index();
                    let kind = if p.kind == PieceKind::Reasoning {
                        "response.reasoning_text.delta"
                    } else {
                        "response.output_text.delta"
                    };
                    let mut payload =
                        json!({"item_id": id, "output_index": index, "content_index": 0, "delta": p.text});
                    if p.kind == PieceKind::Content {
                        payload["logprobs"] = json!([]);
                    }
                    self.emit(out, kind, payload);
                }
                PieceKind::Call => self.open_item(out, PieceKind::Call, &p),
                PieceKind::Arguments => {
                    let id = self.open.as_ref().map(|o| o.1.clone()).unwrap_or_default();
                    let index = self.output_index();
                    self.emit(
                        out,
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": p.text}),
                    );
                }
            }
            self.built.add(vec![p]);
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>, f: &Finished, usage: Usage) {
        self.close(out);
        let incomplete = ending(f) == Ending::Length;
        let u = self::usage(f, usage.completion_tokens, &self.built);
        let items = self.items.clone();
        let r =
            self.echo.object(if incomplete { "incomplete" } else { "completed" }, items, Some(u), incomplete);
        if let Some((store, mut conversation)) = self.store.take() {
            conversation.push(assistant_message(&self.built));
            store.put(self.echo.id.clone(), r.clone(), conversation);
        }
        let kind = if incomplete { "response.incomplete" } else { "response.completed" };
        self.emit(out, kind, json!({"response": r}));
    }

    fn error(&mut self, out: &mut Vec<u8>, e: &ApiError) {
        let code = e.code.clone().unwrap_or_else(|| "server_error".into());
        self.emit(out, "error", json!({"code": code, "message": e.message, "param": e.param}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(v: Value) -> ApiResult<Translated> {
        translate(v.as_object().unwrap(), Vec::new())
    }

    #[test]
    fn items_become_chat_messages() {
        let t = tr(json!({
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c1", "output": "1"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]},
            ],
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}},
            "max_output_tokens": 5,
        }))
        .unwrap();
        let m = &t.chat["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[2]["reasoning_content"], "hmm");
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[4], json!({"role": "tool", "tool_call_id": "c2", "content": "2"}));
        assert_eq!(t.chat["response_format"]["json_schema"]["name"], "x");
        assert_eq!(t.chat["max_tokens"], 5);
        // the instructions are not part of the stored conversation
        assert_eq!(t.input.len(), 4);
    }

    #[test]
    fn the_effort_goes_to_chat_as_its_reasoning_effort() {
        for (effort, thinks) in [("none", false), ("minimal", true), ("high", true), ("xhigh", true)] {
            let t =
                tr(json!({"input": "x", "max_output_tokens": 100, "reasoning": {"effort": effort}})).unwrap();
            assert_eq!(t.chat["reasoning_effort"], effort);
            assert_eq!(t.chat["chat_template_kwargs"], json!({"enable_thinking": thinks}));
        }
        let t = tr(json!({"input": "x", "reasoning": {"summary": "auto"}})).unwrap();
        assert!(t.chat.get("reasoning_effort").is_none(), "no effort: no cap");
    }

    #[test]
    fn unsupported_input_is_refused_by_name() {
        for (body, param) in [
            (json!({"input": [{"type": "input_image"}]}), "input.0.type"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}),
                "input.0.content.0.type",
            ),
            (json!({"input": "x", "tools": [{"type": "web_search"}]}), "tools.0.type"),
            (json!({"input": "x", "text": {"verbosity": "low"}}), "text.verbosity"),
            (json!({"input": "x", "reasoning": {"effort": "max"}}), "reasoning.effort"),
            (
                // not what this server returned: refused, not passed on as text
                json!({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "e"}]}),
                "input.0.encrypted_content",
            ),
            (
                json!({"input": "x", "include": ["reasoning.encrypted_content", "file_search_call.results"]}),
                "include.1",
            ),
        ] {
            let err = tr(body.clone()).err().unwrap_or_else(|| panic!("{body}"));
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
        }
        for (body, param) in [
            (json!({"input": "x", "background": true}), "background"),
            (json!({"input": "x", "truncation": "auto"}), "truncation"),
        ] {
            let err = check_settings(body.as_object().unwrap()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param));
        }
    }

    #[test]
    fn included_reasoning_comes_back_as_the_same_text() {
        // include: the reasoning item carries encrypted_content; sent back (store: false,
        // as Codex runs), it is the assistant turn's reasoning again
        let t = tr(json!({"input": "x", "include": ["reasoning.encrypted_content"]})).unwrap();
        assert!(t.reasoning.encrypted && !t.reasoning.summary);
        let item = reasoning_item("rs_1", "first, the keys", t.reasoning, "completed");
        let encoded = item["encrypted_content"].as_str().unwrap().to_string();
        assert_ne!(encoded, "first, the keys");
        let next = tr(json!({"input": [
            {"role": "user", "content": "x"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encoded},
            {"role": "user", "content": "and then?"},
        ]}))
        .unwrap();
        let messages = next.chat["messages"].as_array().unwrap();
        assert!(messages.iter().any(|m| m["reasoning_content"] == "first, the keys"), "{messages:?}");
        // without include, no such field
        assert!(reasoning_item("rs_2", "t", ReasoningOut::default(), "completed")
            .get("encrypted_content")
            .is_none());
    }

    #[test]
    fn the_store_drops_the_least_recently_used() {
        let store = ResponseStore::default();
        for i in 0..STORE_LIMIT + 2 {
            store.put(format!("r{i}"), json!({"i": i}), Vec::new());
            if i == 0 {
                continue;
            }
            assert!(store.response("r0").is_some(), "r0 is used, so kept"); // touched every time
        }
        assert_eq!(store.len(), STORE_LIMIT);
        assert!(store.response("r1").is_none() && store.response("r2").is_none());
        assert!(store.response("r0").is_some() && store.response(&format!("r{}", STORE_LIMIT + 1)).is_some());
    }
}
