//! `POST /tokenize` and `POST /detokenize` in vLLM's shapes: a `prompt`, or `messages`
//! through the chat template (the request core's messages, tools and template variables,
//! checked as chat checks them) with `add_generation_prompt`; the ids, their count and
//! `max_model_len`. `/detokenize` takes `tokens` and gives back the `prompt`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Map, Value};

use super::translate::{bad, check_fields, FieldPolicy, Policy};
use super::{json_response, read_body, respond};
use crate::chat_request::{template_messages, RESERVED_TEMPLATE_VARIABLES};
use crate::errors::{ApiError, ApiResult};
use crate::json_body;
use crate::protocol;
use crate::state::AppState;

/// vLLM's `TokenizeCompletionRequest` and `TokenizeChatRequest` (vllm/entrypoints/openai
/// protocol), one body with either `prompt` or `messages`.
const TOKENIZE_FIELDS: &[FieldPolicy] = &[
    ("model", Policy::Honoured),
    ("prompt", Policy::Honoured),
    ("messages", Policy::Honoured),
    ("add_special_tokens", Policy::Honoured),
    ("add_generation_prompt", Policy::Honoured),
    ("return_token_strs", Policy::Honoured),
    ("tools", Policy::Honoured),
    ("chat_template_kwargs", Policy::Honoured),
    ("continue_final_message", Policy::Refused("a final message cannot be continued")),
    ("chat_template", Policy::Refused("the model's own chat template is used")),
    ("mm_processor_kwargs", Policy::Refused("there is no multimodal processor")),
];
/// vLLM's `DetokenizeRequest`.
const DETOKENIZE_FIELDS: &[FieldPolicy] = &[("model", Policy::Honoured), ("tokens", Policy::Honoured)];

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route(
            "/tokenize",
            post(|State(state): State<Arc<AppState>>, body: Body| async move {
                respond(async { tokenize(state.clone(), read_body(&state, body).await?).await }.await)
            }),
        )
        .route(
            "/detokenize",
            post(|State(state): State<Arc<AppState>>, body: Body| async move {
                respond(async { detokenize(state.clone(), read_body(&state, body).await?).await }.await)
            }),
        )
}

fn body_object(body: &[u8], fields: &[FieldPolicy]) -> ApiResult<Map<String, Value>> {
    let Value::Object(obj) = json_body::parse(body)? else {
        return Err(ApiError::new(400, "the body must be a JSON object"));
    };
    check_fields(&obj, fields, "")?;
    Ok(obj)
}

fn flag(obj: &Map<String, Value>, key: &str, default: bool) -> ApiResult<bool> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(key, "expected a boolean")),
    }
}

pub async fn tokenize(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let obj = body_object(&body, TOKENIZE_FIELDS)?;
    state.check_model(obj.get("model").and_then(Value::as_str))?;
    let strs = flag(&obj, "return_token_strs", false)?;
    let ids = match (obj.get("prompt"), obj.get("messages")) {
        (Some(_), Some(_)) => return Err(bad("messages", "give either prompt or messages, not both")),
        (Some(Value::String(prompt)), None) => {
            for key in ["add_generation_prompt", "tools", "chat_template_kwargs"] {
                if obj.contains_key(key) {
                    return Err(bad(key, "applies to messages, not to a prompt"));
                }
            }
            let special = flag(&obj, "add_special_tokens", true)?;
            state.encode(prompt.clone(), "prompt", special).await?
        }
        (Some(_), None) => return Err(bad("prompt", "expected a string")),
        (None, Some(_)) => chat_ids(&state, &obj).await?,
        (None, None) => return Err(bad("prompt", "give a prompt or messages")),
    };
    let token_strs = strs.then(|| {
        ids.iter()
            .map(|&t| String::from_utf8_lossy(state.vocab.token_bytes(t).unwrap_or(b"")).into_owned())
            .collect::<Vec<_>>()
    });
    Ok(json_response(&json!({
        "count": ids.len(),
        "max_model_len": state.config.context_length,
        "tokens": ids,
        "token_strs": token_strs,
    })))
}

/// The ids of messages rendered by the chat template, as chat renders them (its checks of
/// the messages, the tools and the template variables).
async fn chat_ids(state: &Arc<AppState>, obj: &Map<String, Value>) -> ApiResult<Vec<u32>> {
    let add_generation_prompt = flag(obj, "add_generation_prompt", true)?;
    let special = flag(obj, "add_special_tokens", false)?;
    let mut chat = Map::new();
    for key in ["messages", "tools", "chat_template_kwargs"] {
        if let Some(v) = obj.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    let chat = protocol::parse_offline_chat(&Value::Object(chat))?;
    let tools = crate::tools::parse_tools(chat.tools.as_ref())?;
    let mut variables = chat.chat_template_kwargs.unwrap_or_default();
    if let Some(reserved) = RESERVED_TEMPLATE_VARIABLES.iter().find(|v| variables.contains_key(**v)) {
        return Err(bad("chat_template_kwargs", format!("'{reserved}' is set from the request itself")));
    }
    if !tools.is_empty() {
        variables.insert("tools".into(), tools.iter().map(|t| t.as_template_tool()).collect());
    }
    let messages = template_messages(chat.messages)?;
    let state2 = state.clone();
    let text = tokio::task::spawn_blocking(move || {
        let template = state2.template.as_deref().ok_or_else(|| {
            bad("messages", "this model has no chat template (tokenizer_config.json 'chat_template')")
        })?;
        template.render_with(&messages, add_generation_prompt, &variables).map_err(|m| bad("messages", m))
    })
    .await
    .map_err(|e| ApiError::new(500, format!("rendering failed: {e}")))??;
    state.encode(text, "messages", special).await
}

pub async fn detokenize(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let obj = body_object(&body, DETOKENIZE_FIELDS)?;
    state.check_model(obj.get("model").and_then(Value::as_str))?;
    let tokens = obj.get("tokens").ok_or_else(|| bad("tokens", "Field required"))?;
    let ids: Vec<u32> = protocol::typed(tokens, "tokens.")?;
    let vocab = state.vocab.size();
    if let Some(bad_id) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(bad("tokens", format!("token id {bad_id} is outside the vocabulary (size {vocab})")));
    }
    let state2 = state.clone();
    let text = tokio::task::spawn_blocking(move || state2.tokenizer.decode(&ids))
        .await
        .map_err(|e| ApiError::new(500, format!("decoding failed: {e}")))?
        .map_err(|m| bad("tokens", m))?;
    Ok(json_response(&json!({"prompt": text})))
}
