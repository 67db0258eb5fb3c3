//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API as
//! a translation into a chat completion run by the one request core (see
//! [`super::translate`]). `system` becomes the system message; `text`, `tool_use`,
//! `tool_result` and `thinking` blocks become chat's content, calls, tool messages and
//! reasoning; `tools` (`input_schema`) and `tool_choice` (`auto`, `any`, `tool`, `none`)
//! become chat's tools, constrained alike; `output_config.format` becomes chat's
//! `response_format`. The answer's content blocks come from the chat plan's parser:
//! `thinking` (the reasoning parser's), `text`, `tool_use`. Errors go out in Anthropic's
//! envelope ([`anthropic_envelope`], applied to every response under `/v1/messages`).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use ferrolm_core::engine::Finished;
use serde_json::{json, Map, Value};

use super::translate::{
    self, bad, check_fields, ending, named_event, object_at, opt_str, Ending, FieldPolicy, Policy, Renames,
};
use super::{json_response, read_body, respond, Tracked};
use crate::errors::{ApiError, ApiResult};
use crate::json_body;
use crate::response::{random_hex, Usage};
use crate::state::AppState;
use crate::tools::output::{MessageBuilder, PieceKind};
use crate::tools::Piece;

const CACHE: &str = "the prefix cache works by itself; there are no cache breakpoints to set";
const NOT_HERE: &str = "Anthropic's platform feature, not part of this server";

/// The fields of a Messages request: Anthropic's API reference (`POST /v1/messages`), as
/// the `anthropic` Python SDK 2.17 types them (`MessageCreateParamsBase`), with
/// `temperature`, `top_p` and `top_k`, which earlier versions of the schema have and
/// clients still send.
pub const MESSAGE_FIELDS: &[FieldPolicy] = &[
    ("model", Policy::Honoured),
    ("max_tokens", Policy::Honoured),
    ("messages", Policy::Honoured),
    ("system", Policy::Honoured),
    ("stop_sequences", Policy::Honoured),
    ("stream", Policy::Honoured),
    ("temperature", Policy::Honoured),
    ("top_p", Policy::Honoured),
    ("top_k", Policy::Honoured),
    ("tools", Policy::Honoured),
    ("tool_choice", Policy::Honoured),
    ("thinking", Policy::Honoured),
    ("output_config", Policy::Honoured),
    ("metadata", Policy::NoEffect("metadata.user_id identifies the caller; it changes no token")),
    ("cache_control", Policy::NoEffect(CACHE)),
    ("service_tier", Policy::NoEffect("there is one tier")),
    ("speed", Policy::Refused("there is one speed")),
    ("container", Policy::Refused(NOT_HERE)),
    ("diagnostics", Policy::Refused(NOT_HERE)),
    ("inference_geo", Policy::Refused(NOT_HERE)),
    ("user_profile_id", Policy::Refused(NOT_HERE)),
    ("workspace_id", Policy::Refused(NOT_HERE)),
    ("mcp_servers", Policy::Refused("MCP servers are not supported")),
];

/// `POST /v1/messages/count_tokens` (`MessageCountTokensParams`): the request's fields
/// less the sampling ones.
const COUNT_FIELDS: &[&str] =
    &["model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "cache_control"];

const TEXT_BLOCK: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("text", Policy::Honoured),
    ("cache_control", Policy::NoEffect(CACHE)),
    ("citations", Policy::Refused("citations are not supported")),
];
const TOOL_USE_BLOCK: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("id", Policy::Honoured),
    ("name", Policy::Honoured),
    ("input", Policy::Honoured),
    ("cache_control", Policy::NoEffect(CACHE)),
    ("caller", Policy::Refused("programmatic tool calling is not supported")),
    ("toolset_name", Policy::Refused("toolsets are not supported")),
];
const TOOL_RESULT_BLOCK: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("tool_use_id", Policy::Honoured),
    ("content", Policy::Honoured),
    ("is_error", Policy::Honoured),
    ("cache_control", Policy::NoEffect(CACHE)),
    ("toolset_name", Policy::Refused("toolsets are not supported")),
];
const THINKING_BLOCK: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("thinking", Policy::Honoured),
    ("signature", Policy::NoEffect("thinking is not signed here: a signature is neither made nor checked")),
];
const TOOL_FIELDS: &[FieldPolicy] = &[
    ("name", Policy::Honoured),
    ("description", Policy::Honoured),
    ("input_schema", Policy::Honoured),
    ("strict", Policy::Honoured),
    ("type", Policy::Honoured),
    ("cache_control", Policy::NoEffect(CACHE)),
    ("eager_input_streaming", Policy::NoEffect("the input is always streamed as it is generated")),
    ("input_examples", Policy::Refused("tool input examples are not supported")),
    ("defer_loading", Policy::Refused("tool search is not supported")),
    ("allowed_callers", Policy::Refused("programmatic tool calling is not supported")),
];
const TOOL_CHOICE_FIELDS: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("name", Policy::Honoured),
    ("disable_parallel_tool_use", Policy::Honoured),
];
const THINKING_FIELDS: &[FieldPolicy] = &[
    ("type", Policy::Honoured),
    ("budget_tokens", Policy::Honoured),
    ("display", Policy::Refused("the thinking is always shown whole")),
];
const OUTPUT_CONFIG_FIELDS: &[FieldPolicy] = &[("format", Policy::Honoured), ("effort", Policy::Honoured)];
/// Anthropic's efforts: each caps the thinking at its share of `max_tokens`, as OpenAI's
/// reasoning efforts do (`protocol::REASONING_EFFORTS`).
const EFFORTS: &[&str] = &["low", "medium", "high", "xhigh", "max"];

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/v1/messages",
            post(|State(state): State<Arc<AppState>>, body: Body| async move {
                respond(async { create(state.clone(), read_body(&state, body).await?).await }.await)
            }),
        )
        .route(
            "/v1/messages/count_tokens",
            post(|State(state): State<Arc<AppState>>, body: Body| async move {
                respond(async { count_tokens(state.clone(), read_body(&state, body).await?).await }.await)
            }),
        )
}

/// Anthropic's error type of a status.
fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 415 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}` of an error.
pub fn envelope(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// Every error under `/v1/messages`, the guard's (key, content type, size) included, in
/// Anthropic's envelope: an error answered in OpenAI's is rewritten.
pub async fn anthropic_envelope(request: Request, next: Next) -> Response {
    if !request.uri().path().starts_with("/v1/messages") {
        return next.run(request).await;
    }
    let response = next.run(request).await;
    if response.status().as_u16() < 400 {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.pointer("/error/message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let e = ApiError::new(parts.status.as_u16(), message);
    let body = serde_json::to_vec(&envelope(&e)).expect("an envelope serializes");
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// A Messages request as a chat completion body, with the renames of chat's fields.
fn translate(obj: &Map<String, Value>, counting: bool) -> ApiResult<(Value, Renames)> {
    let mut chat = Map::new();
    let mut renames = Renames::default();
    if let Some(m) = obj.get("model") {
        chat.insert("model".into(), m.clone());
    } else {
        return Err(bad("model", "Field required"));
    }
    let mut messages = Vec::new();
    if let Some(system) = obj.get("system").filter(|v| !v.is_null()) {
        let text = text_of(system, "system")?;
        renames.add(format!("messages.{}", messages.len()), "system");
        messages.push(json!({"role": "system", "content": text}));
    }
    let Some(given) = obj.get("messages") else { return Err(bad("messages", "Field required")) };
    let given = given.as_array().ok_or_else(|| bad("messages", "expected a list of messages"))?;
    if given.is_empty() {
        return Err(bad("messages", "at least one message is required"));
    }
    for (i, m) in given.iter().enumerate() {
        translate_message(m, i, &mut messages, &mut renames)?;
    }
    if given.last().and_then(|m| m.get("role")).and_then(Value::as_str) == Some("assistant") {
        let last = given.len() - 1;
        return Err(bad(
            &format!("messages.{last}"),
            "a last assistant message (a prefill) is not supported: end with a user message",
        ));
    }
    chat.insert("messages".into(), Value::Array(messages));
    translate_tools(obj, &mut chat, &mut renames)?;
    translate_thinking(obj, &mut chat, counting)?;
    if let Some(oc) = obj.get("output_config").filter(|v| !v.is_null()) {
        let oc = object_at(oc, "output_config")?;
        check_fields(oc, OUTPUT_CONFIG_FIELDS, "output_config.")?;
        if let Some(format) = oc.get("format").filter(|v| !v.is_null()) {
            let f = object_at(format, "output_config.format")?;
            check_fields(
                f,
                &[("type", Policy::Honoured), ("schema", Policy::Honoured)],
                "output_config.format.",
            )?;
            if opt_str(f, "type", "output_config.format.type")? != Some("json_schema") {
                return Err(bad("output_config.format.type", "must be 'json_schema'"));
            }
            let schema =
                f.get("schema").ok_or_else(|| bad("output_config.format.schema", "Field required"))?;
            chat.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": true}}),
            );
            renames.add("response_format.json_schema.schema", "output_config.format.schema");
            renames.add("response_format", "output_config.format");
        }
        match opt_str(oc, "effort", "output_config.effort")? {
            None => {}
            Some(e) if EFFORTS.contains(&e) => {
                chat.insert("reasoning_effort".into(), json!(e));
                renames.add("reasoning_effort", "output_config.effort");
            }
            Some(_) => {
                return Err(bad("output_config.effort", format!("must be one of {}", EFFORTS.join(", "))))
            }
        }
    }
    if counting {
        return Ok((Value::Object(chat), renames));
    }
    match obj.get("max_tokens") {
        None => return Err(bad("max_tokens", "Field required")),
        Some(v) => {
            chat.insert("max_tokens".into(), v.clone());
        }
    }
    for key in ["temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(stop) = obj.get("stop_sequences").filter(|v| !v.is_null()) {
        chat.insert("stop".into(), stop.clone());
        renames.add("stop", "stop_sequences");
    }
    if let Some(meta) = obj.get("metadata").filter(|v| !v.is_null()) {
        check_fields(object_at(meta, "metadata")?, &[("user_id", Policy::NoEffect(""))], "metadata.")?;
    }
    Ok((Value::Object(chat), renames))
}

/// A string, or a list of text blocks joined.
fn text_of(v: &Value, field: &str) -> ApiResult<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                let path = format!("{field}.{j}");
                let b = object_at(b, &path)?;
                if opt_str(b, "type", &format!("{path}.type"))? != Some("text") {
                    return Err(bad(&format!("{path}.type"), "only text blocks are supported here"));
                }
                check_fields(b, TEXT_BLOCK, &format!("{path}."))?;
                let text = opt_str(b, "text", &format!("{path}.text"))?
                    .ok_or_else(|| bad(&format!("{path}.text"), "Field required"))?;
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(text);
            }
            Ok(out)
        }
        _ => Err(bad(field, "expected a string or a list of text blocks")),
    }
}

fn translate_message(m: &Value, i: usize, out: &mut Vec<Value>, renames: &mut Renames) -> ApiResult<()> {
    let path = format!("messages.{i}");
    let m = object_at(m, &path)?;
    check_fields(m, &[("role", Policy::Honoured), ("content", Policy::Honoured)], &format!("{path}."))?;
    let role = opt_str(m, "role", &format!("{path}.role"))?;
    let role = match role {
        Some(r @ ("user" | "assistant")) => r,
        Some(_) => return Err(bad(&format!("{path}.role"), "must be 'user' or 'assistant'")),
        None => return Err(bad(&format!("{path}.role"), "Field required")),
    };
    let content = m.get("content").ok_or_else(|| bad(&format!("{path}.content"), "Field required"))?;
    let blocks: Vec<(usize, &Map<String, Value>)> = match content {
        Value::String(s) => {
            renames.add(format!("messages.{}", out.len()), path.clone());
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Value::Array(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(j, b)| object_at(b, &format!("{path}.content.{j}")).map(|b| (j, b)))
            .collect::<ApiResult<_>>()?,
        _ => return Err(bad(&format!("{path}.content"), "expected a string or a list of content blocks")),
    };
    let mut text = String::new();
    let mut reasoning: Option<String> = None;
    let mut calls = Vec::new();
    for (j, b) in blocks {
        let bp = format!("{path}.content.{j}");
        let kind = opt_str(b, "type", &format!("{bp}.type"))?.unwrap_or("");
        let allowed = match (role, kind) {
            ("user" | "assistant", "text") => TEXT_BLOCK,
            ("assistant", "tool_use") => TOOL_USE_BLOCK,
            ("assistant", "thinking") => THINKING_BLOCK,
            ("user", "tool_result") => TOOL_RESULT_BLOCK,
            _ => {
                return Err(bad(
                    &format!("{bp}.type"),
                    format!(
                        "{kind:?} blocks are not supported in a {role} message (text{})",
                        if role == "user" { ", tool_result" } else { ", tool_use, thinking" }
                    ),
                ))
            }
        };
        check_fields(b, allowed, &format!("{bp}."))?;
        let required = |key: &str| b.get(key).ok_or_else(|| bad(&format!("{bp}.{key}"), "Field required"));
        let string = |key: &str| {
            opt_str(b, key, &format!("{bp}.{key}"))?
                .ok_or_else(|| bad(&format!("{bp}.{key}"), "Field required"))
        };
        match kind {
            "text" => text.push_str(string("text")?),
            "thinking" => reasoning.get_or_insert_with(String::new).push_str(string("thinking")?),
            "tool_use" => {
                let input = required("input")?;
                if !input.is_object() {
                    return Err(bad(&format!("{bp}.input"), "expected an object"));
                }
                renames.add(format!("messages.{}.tool_calls.{}", out.len(), calls.len()), bp.clone());
                calls.push(json!({
                    "id": string("id")?,
                    "type": "function",
                    "function": {"name": string("name")?, "arguments": input.to_string()},
                }));
            }
            "tool_result" => {
                let id = string("tool_use_id")?;
                let mut result = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{bp}.content"))?,
                };
                match b.get("is_error") {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                    Some(Value::Bool(true)) => result = format!("Error: {result}"),
                    Some(_) => return Err(bad(&format!("{bp}.is_error"), "expected a boolean")),
                }
                renames.add(format!("messages.{}", out.len()), bp.clone());
                out.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
            }
            _ => unreachable!("the kinds are matched above"),
        }
    }
    if role == "assistant" {
        let mut msg = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if let Some(r) = reasoning {
            msg["reasoning_content"] = Value::String(r);
        }
        renames.add(format!("messages.{}", out.len()), path);
        out.push(msg);
    } else if !text.is_empty() || !matches!(content, Value::Array(b) if !b.is_empty()) {
        renames.add(format!("messages.{}", out.len()), path);
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

fn translate_tools(
    obj: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    renames: &mut Renames,
) -> ApiResult<()> {
    let mut names = Vec::new();
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let tools = tools.as_array().ok_or_else(|| bad("tools", "expected a list of tools"))?;
        let mut out = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let path = format!("tools.{i}");
            let t = object_at(t, &path)?;
            match opt_str(t, "type", &format!("{path}.type"))? {
                None | Some("custom") => {}
                Some(other) => {
                    return Err(bad(
                        &format!("{path}.type"),
                        format!(
                        "server tools ({other:?}) are not supported: only client tools with an input_schema"
                    ),
                    ))
                }
            }
            check_fields(t, TOOL_FIELDS, &format!("{path}."))?;
            let name = opt_str(t, "name", &format!("{path}.name"))?
                .ok_or_else(|| bad(&format!("{path}.name"), "Field required"))?;
            let schema = t
                .get("input_schema")
                .ok_or_else(|| bad(&format!("{path}.input_schema"), "Field required"))?;
            let mut function = json!({"name": name, "parameters": schema});
            for key in ["description", "strict"] {
                if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                    function[key] = v.clone();
                }
            }
            names.push(name.to_string());
            out.push(json!({"type": "function", "function": function}));
            renames.add(format!("tools.{i}.function.parameters"), format!("{path}.input_schema"));
            renames.add(format!("tools.{i}.function"), path.clone());
            renames.add(format!("tools.{i}"), path);
        }
        if !out.is_empty() {
            chat.insert("tools".into(), Value::Array(out));
        }
    }
    let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) else { return Ok(()) };
    let choice = object_at(choice, "tool_choice")?;
    check_fields(choice, TOOL_CHOICE_FIELDS, "tool_choice.")?;
    let kind = opt_str(choice, "type", "tool_choice.type")?
        .ok_or_else(|| bad("tool_choice.type", "Field required"))?;
    let mapped = match kind {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = opt_str(choice, "name", "tool_choice.name")?
                .ok_or_else(|| bad("tool_choice.name", "Field required"))?;
            if !names.iter().any(|n| n == name) {
                return Err(bad("tool_choice.name", format!("no tool is named {name:?}")));
            }
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad("tool_choice.type", "must be 'auto', 'any', 'tool' or 'none'")),
    };
    if kind != "none" && names.is_empty() {
        return Err(bad("tool_choice", format!("{kind:?} needs tools")));
    }
    if names.is_empty() {
        return Ok(()); // none without tools: nothing to call
    }
    match choice.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(disable)) => {
            chat.insert("parallel_tool_calls".into(), Value::Bool(!disable));
        }
        Some(_) => return Err(bad("tool_choice.disable_parallel_tool_use", "expected a boolean")),
    }
    chat.insert("tool_choice".into(), mapped);
    Ok(())
}

fn translate_thinking(
    obj: &Map<String, Value>,
    chat: &mut Map<String, Value>,
    counting: bool,
) -> ApiResult<()> {
    let Some(thinking) = obj.get("thinking").filter(|v| !v.is_null()) else { return Ok(()) };
    let t = object_at(thinking, "thinking")?;
    check_fields(t, THINKING_FIELDS, "thinking.")?;
    let enable = match opt_str(t, "type", "thinking.type")? {
        Some("enabled") => {
            let budget = t
                .get("budget_tokens")
                .ok_or_else(|| bad("thinking.budget_tokens", "Field required"))?
                .as_u64()
                .ok_or_else(|| bad("thinking.budget_tokens", "expected a positive integer"))?;
            let max_tokens = obj.get("max_tokens").and_then(Value::as_u64).unwrap_or(u64::MAX);
            if budget < 1024 || (!counting && budget >= max_tokens) {
                return Err(bad("thinking.budget_tokens", "must be at least 1024 and less than max_tokens"));
            }
            // the core forces the end of the thinking once it has taken this many tokens
            chat.insert("thinking_token_budget".into(), json!(budget));
            true
        }
        Some("adaptive") => true,
        Some("disabled") => false,
        _ => return Err(bad("thinking.type", "must be 'enabled', 'adaptive' or 'disabled'")),
    };
    chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": enable}));
    Ok(())
}

fn parse_body(body: &[u8], fields: &[FieldPolicy]) -> ApiResult<Map<String, Value>> {
    let value = json_body::parse(body)?;
    let Value::Object(obj) = value else { return Err(ApiError::new(400, "the body must be a JSON object")) };
    check_fields(&obj, fields, "")?;
    Ok(obj)
}

pub async fn count_tokens(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let fields: Vec<FieldPolicy> =
        MESSAGE_FIELDS.iter().copied().filter(|(n, _)| COUNT_FIELDS.contains(n)).collect();
    let obj = parse_body(&body, &fields)?;
    let (chat, renames) = translate(&obj, true)?;
    let req = crate::protocol::parse_chat(&serde_json::to_vec(&chat).expect("a chat body serializes"))
        .map_err(|e| renames.apply(e))?;
    state.check_model(req.sampling.model.as_deref())?;
    let prepared =
        super::openai::plan(&state, req.fields, &req.sampling).await.map_err(|e| renames.apply(e))?;
    Ok(json_response(&json!({"input_tokens": prepared.ids.len()})))
}

pub async fn create(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let obj = parse_body(&body, MESSAGE_FIELDS)?;
    let (chat, renames) = translate(&obj, false)?;
    let (job, gen) = translate::run_chat(&state, &chat, &renames).await?;
    let id = format!("msg_{}", random_hex(24));
    let model = super::openai::served_name(&state, &job.params).to_string();
    let prompt_tokens = job.prepared.ids.len();
    let mut tracked = Tracked::new(&state, id.clone(), gen);
    let plan = &job.prepared.plan;
    if job.stream {
        let events = MessageEvents { id, model, prompt_tokens, ..MessageEvents::default() };
        return Ok(translate::stream(tracked, plan.output_parser(), events));
    }
    let (text, finished) = translate::run_whole(&mut tracked.gen).await?;
    let built = crate::tools::output::parse_whole(plan, &text);
    let mut content = Vec::new();
    if !built.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": built.reasoning, "signature": ""}));
    }
    if !built.content.is_empty() {
        content.push(json!({"type": "text", "text": built.content}));
    }
    for call in &built.calls {
        let input = translate::arguments_value(&call.arguments);
        content.push(
            json!({"type": "tool_use", "id": tool_use_id(&call.id), "name": call.name, "input": input}),
        );
    }
    let (stop_reason, stop_sequence) = stop_reason(&finished, !built.calls.is_empty());
    Ok(json_response(&json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage(&finished, tracked.gen.samples[0].output.token_ids.len()),
    })))
}

/// Anthropic's ids of tool uses: `toolu_` and the call's own digits.
fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}

fn stop_reason(f: &Finished, has_calls: bool) -> (&'static str, Option<String>) {
    match ending(f) {
        Ending::Done if has_calls => ("tool_use", None),
        Ending::Done | Ending::Aborted => ("end_turn", None),
        Ending::StopString(s) => ("stop_sequence", Some(s)),
        Ending::Length => ("max_tokens", None),
    }
}

/// Anthropic counts the prompt's cached tokens apart from `input_tokens`.
fn usage(f: &Finished, output_tokens: usize) -> Value {
    json!({
        "input_tokens": f.prompt_tokens.saturating_sub(f.cached_tokens),
        "cache_read_input_tokens": f.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": output_tokens,
    })
}

/// Anthropic's stream: `message_start`, `ping`, then per content block
/// `content_block_start`, its deltas (`thinking_delta`, `text_delta`, `input_json_delta`)
/// and `content_block_stop`; at the end `message_delta` (the stop reason and the usage)
/// and `message_stop`.
#[derive(Default)]
struct MessageEvents {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// The open block's kind and index.
    open: Option<(PieceKind, usize)>,
    blocks: usize,
    built: MessageBuilder,
}

impl MessageEvents {
    fn open(&mut self, out: &mut Vec<u8>, kind: PieceKind, block: Value) {
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((kind, index));
        named_event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open.take() {
            named_event(out, "content_block_stop", &json!({"type": "content_block_stop", "index": index}));
        }
    }

    fn delta(&self, out: &mut Vec<u8>, delta: Value) {
        let index = self.open.map_or(0, |(_, i)| i);
        named_event(
            out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
    }
}

impl translate::Events for MessageEvents {
    fn start(&mut self, out: &mut Vec<u8>) {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        });
        named_event(out, "message_start", &json!({"type": "message_start", "message": message}));
        named_event(out, "ping", &json!({"type": "ping"}));
    }

    fn pieces(&mut self, out: &mut Vec<u8>, pieces: Vec<Piece>) {
        for p in &pieces {
            let open = self.open.map(|(k, _)| k);
            match p.kind {
                PieceKind::Reasoning => {
                    if open != Some(PieceKind::Reasoning) {
                        self.open(
                            out,
                            PieceKind::Reasoning,
                            json!({"type": "thinking", "thinking": "", "signature": ""}),
                        );
                    }
                    self.delta(out, json!({"type": "thinking_delta", "thinking": p.text}));
                }
                PieceKind::Content => {
                    if open != Some(PieceKind::Content) {
                        self.open(out, PieceKind::Content, json!({"type": "text", "text": ""}));
                    }
                    self.delta(out, json!({"type": "text_delta", "text": p.text}));
                }
                PieceKind::Call => {
                    let block = json!({"type": "tool_use", "id": tool_use_id(&p.call_id), "name": p.text, "input": {}});
                    self.open(out, PieceKind::Call, block);
                }
                PieceKind::Arguments => {
                    self.delta(out, json!({"type": "input_json_delta", "partial_json": p.text}))
                }
            }
        }
        self.built.add(pieces);
    }

    fn finish(&mut self, out: &mut Vec<u8>, f: &Finished, usage: Usage) {
        self.close(out);
        let (stop_reason, stop_sequence) = stop_reason(f, !self.built.calls.is_empty());
        let mut u = self::usage(f, usage.completion_tokens);
        u["input_tokens"] = json!(f.prompt_tokens.saturating_sub(f.cached_tokens));
        named_event(
            out,
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence}, "usage": u}),
        );
        named_event(out, "message_stop", &json!({"type": "message_stop"}));
    }

    fn error(&mut self, out: &mut Vec<u8>, e: &ApiError) {
        named_event(out, "error", &envelope(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tr(v: Value) -> ApiResult<Value> {
        translate(v.as_object().unwrap(), false).map(|(c, _)| c)
    }

    #[test]
    fn blocks_become_chat_messages() {
        let chat = tr(json!({
            "model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                    {"type": "text", "text": "and?"}]},
            ],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["x"],
        }))
        .unwrap();
        let m = &chat["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[2]["tool_calls"][0]["function"], json!({"name": "f", "arguments": "{\"a\":1}"}));
        assert_eq!(m[2]["reasoning_content"], "hmm");
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "toolu_1", "content": "42"}));
        assert_eq!(m[4], json!({"role": "user", "content": "and?"}));
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(chat["stop"], json!(["x"]));
    }

    #[test]
    fn the_thinking_budget_and_the_effort_cap_the_chats_thinking() {
        let msg = json!([{"role": "user", "content": "hi"}]);
        let chat = tr(json!({"model": "m", "max_tokens": 4000, "messages": msg,
                             "thinking": {"type": "enabled", "budget_tokens": 1024},
                             "output_config": {"effort": "low"}}))
        .unwrap();
        assert_eq!(chat["thinking_token_budget"], 1024);
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(chat["chat_template_kwargs"], json!({"enable_thinking": true}));
        let chat =
            tr(json!({"model": "m", "max_tokens": 10, "messages": msg, "thinking": {"type": "adaptive"}}))
                .unwrap();
        assert!(chat.get("thinking_token_budget").is_none() && chat.get("reasoning_effort").is_none());
    }

    #[test]
    fn unsupported_input_is_refused_by_name() {
        let base = |extra: Value| {
            let mut v =
                json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v
        };
        for (extra, param) in [
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "messages.0.content.0.type",
            ),
            (json!({"tools": [{"type": "web_search_20250305", "name": "w"}]}), "tools.0.type"),
            (
                json!({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [{"name": "f", "input_schema": {}}]}),
                "tool_choice.name",
            ),
            (json!({"thinking": {"type": "enabled", "budget_tokens": 10}}), "thinking.budget_tokens"),
            (
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
                "messages.1",
            ),
            (json!({"output_config": {"effort": "extreme"}}), "output_config.effort"),
        ] {
            let body = base(extra);
            let obj = body.as_object().unwrap();
            let err = check_fields(obj, MESSAGE_FIELDS, "")
                .and_then(|_| translate(obj, false).map(|_| ()))
                .unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
        }
    }
}
