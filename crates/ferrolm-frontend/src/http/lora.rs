//! LoRA adapters while serving: `POST /v1/load_lora_adapter` and
//! `/v1/unload_lora_adapter` in vLLM's shapes (SGLang's `/load_lora_adapter` and
//! `/unload_lora_adapter` too), and the adapters' cards on `/v1/models`.
//!
//! Loading reads and checks the adapter's files on a blocking thread: the HTTP threads
//! and the step loop go on meanwhile, and a bad adapter is a 400 naming the file. The
//! routes answer only on a server started with `--enable-lora` (or `--lora-modules`):
//! they read any folder the server can, which an operator turns on knowingly (vLLM asks
//! for `VLLM_ALLOW_RUNTIME_LORA_UPDATING` for the same reason).

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use ferrolm_core::lora::registry::{LoraRegistry, RegistryError};
use serde_json::{json, Map, Value};

use super::translate::{bad, check_fields, opt_str, FieldPolicy, Policy};
use super::{read_body, respond};
use crate::errors::{ApiError, ApiResult};
use crate::json_body;
use crate::state::{lora_error, AppState};

/// vLLM's `LoadLoRAAdapterRequest` (and SGLang's, whose `pinned` asks for what every
/// adapter gets here: it stays registered until unloaded).
const LOAD_FIELDS: &[FieldPolicy] = &[
    ("lora_name", Policy::Honoured),
    ("lora_path", Policy::Honoured),
    ("load_inplace", Policy::Honoured),
    ("pinned", Policy::NoEffect("an adapter stays registered until it is unloaded")),
];
/// vLLM's `UnloadLoRAAdapterRequest`.
const UNLOAD_FIELDS: &[FieldPolicy] = &[
    ("lora_name", Policy::Honoured),
    ("lora_int_id", Policy::NoEffect("the adapter is named by lora_name")),
];

pub fn routes() -> Router<Arc<AppState>> {
    let load = |State(state): State<Arc<AppState>>, body: Body| async move {
        respond(async { load_adapter(state.clone(), read_body(&state, body).await?).await }.await)
    };
    let unload = |State(state): State<Arc<AppState>>, body: Body| async move {
        respond(async { unload_adapter(state.clone(), read_body(&state, body).await?).await }.await)
    };
    Router::new()
        .route("/v1/load_lora_adapter", post(load))
        .route("/load_lora_adapter", post(load))
        .route("/v1/unload_lora_adapter", post(unload))
        .route("/unload_lora_adapter", post(unload))
}

fn registry(state: &AppState) -> ApiResult<Arc<LoraRegistry>> {
    state.loras.clone().ok_or_else(|| {
        ApiError::bad_request(
            "LoRA adapters are off on this server: start it with --enable-lora (or --lora-modules)",
            "lora_name",
        )
    })
}

fn body_object(body: &[u8], fields: &[FieldPolicy]) -> ApiResult<Map<String, Value>> {
    let Value::Object(obj) = json_body::parse(body)? else {
        return Err(ApiError::new(400, "the body must be a JSON object"));
    };
    check_fields(&obj, fields, "")?;
    Ok(obj)
}

fn required<'a>(obj: &'a Map<String, Value>, key: &str) -> ApiResult<&'a str> {
    opt_str(obj, key, key)?.ok_or_else(|| bad(key, "is required"))
}

/// vLLM answers these routes with a plain-text line.
fn text_response(text: String) -> Response {
    let mut r = Response::new(Body::from(text));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

async fn load_adapter(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let obj = body_object(&body, LOAD_FIELDS)?;
    let registry = registry(&state)?;
    let name = required(&obj, "lora_name")?.to_string();
    let path = PathBuf::from(required(&obj, "lora_path")?);
    let in_place = match obj.get("load_inplace") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("load_inplace", "expected a boolean")),
    };
    if name == state.config.model_name {
        return Err(bad("lora_name", format!("{name:?} is the base model's name")));
    }
    let loaded = tokio::task::spawn_blocking(move || {
        // in place: the new weights under the old name (a new id, so no cached prefix
        // of the old weights is reused); requests running with the old ones finish with them
        if in_place && registry.contains(&name) {
            registry.unload(&name)?;
        }
        registry.load(&name, &path).map(|_| name)
    })
    .await
    .map_err(|e| ApiError::new(500, format!("loading the LoRA adapter failed: {e}")))?;
    match loaded {
        Ok(name) => Ok(text_response(format!("Success: LoRA adapter '{name}' added successfully."))),
        Err(e @ RegistryError::BadName(_)) => Err(lora_error(e, "lora_name")),
        Err(e) => Err(lora_error(e, "lora_path")),
    }
}

async fn unload_adapter(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let obj = body_object(&body, UNLOAD_FIELDS)?;
    let registry = registry(&state)?;
    let name = required(&obj, "lora_name")?;
    registry.unload(name).map_err(|e| lora_error(e, "lora_name"))?;
    Ok(text_response(format!("Success: LoRA adapter '{name}' removed successfully.")))
}

/// The adapters' model cards (vLLM's: `root` the folder, `parent` the base model).
pub fn adapter_cards(state: &AppState) -> Vec<Value> {
    let Some(registry) = &state.loras else { return Vec::new() };
    registry
        .list()
        .into_iter()
        .map(|l| {
            json!({"id": l.name, "object": "model", "created": state.started_at, "owned_by": "ferrolm",
                   "root": l.path, "parent": state.config.model_name,
                   "max_model_len": state.config.context_length})
        })
        .collect()
}
