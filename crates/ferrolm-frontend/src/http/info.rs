//! Routes that describe the server: health, models, settings and load, model info, the
//! cache flush and metrics.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::errors::{ApiError, ApiResult};
use crate::http::json_response;
use crate::ingress::Call;
use crate::json_body;
use crate::state::AppState;

/// 200 while the engine serves; 503 while the server shuts down, and while the step loop
/// does not come round (its heartbeat is late: a step stuck, or the loop frozen).
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let reason = if state.ingress.is_stopped() {
        Some("the server is shutting down".to_string())
    } else {
        state.unavailable()
    };
    if let Some(reason) = reason {
        let mut r = json_response(&json!({"status": "unavailable", "reason": reason}));
        *r.status_mut() = axum::http::StatusCode::SERVICE_UNAVAILABLE;
        return r;
    }
    json_response(&json!({"status": "ok"}))
}

fn model_card(state: &AppState) -> Value {
    json!({"id": state.config.model_name, "object": "model", "created": state.started_at, "owned_by": "ferrolm",
           "root": state.config.model_path, "max_model_len": state.config.context_length})
}

pub async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    let mut data = vec![model_card(&state)];
    data.extend(super::lora::adapter_cards(&state));
    json_response(&json!({"object": "list", "data": data}))
}

pub fn retrieve_model(state: &AppState, model_id: &str) -> ApiResult<Response> {
    if let Some(card) = super::lora::adapter_cards(state).into_iter().find(|c| c["id"] == model_id) {
        return Ok(json_response(&card));
    }
    if model_id != state.config.model_name {
        return Err(ApiError::new(404, format!("model: {model_id:?} is not served here"))
            .with_param(Some("model".into()))
            .with_code("model_not_found"));
    }
    Ok(json_response(&model_card(state)))
}

pub async fn get_model_info(State(state): State<Arc<AppState>>) -> Response {
    let mut info = json!({"model_path": state.config.model_path, "served_model_name": state.config.model_name,
                          "is_generation": true});
    if let (Value::Object(out), Value::Object(model)) = (&mut info, &state.config.model_info) {
        for (k, v) in model {
            out.insert(k.clone(), v.clone());
        }
    }
    json_response(&info)
}

/// Asks the step loop between steps; a 503 at once while it does not come round.
async fn ask<T>(state: &AppState, call: impl FnOnce(oneshot::Sender<T>) -> Call) -> ApiResult<T> {
    state.check_available()?;
    let (tx, rx) = oneshot::channel();
    state.ingress.call(call(tx));
    tokio::select! {
        answer = rx => answer.map_err(|_| {
            ApiError::new(503, "the engine is unavailable: it stopped").with_code("engine_unavailable")
        }),
        stalled = state.until_unavailable() => Err(stalled),
    }
}

/// Settings (the API key only as set / not set) and the engine's current load.
pub async fn server_info(State(state): State<Arc<AppState>>) -> Response {
    let kv_on = crate::kv_events::enabled(&state.config.kv_events);
    let mut read = false;
    let mut load = match ask(&state, Call::Stats).await {
        Ok((s, l)) => {
            read = true;
            json!({"steps": s.steps, "prompt_tokens": s.prompt_tokens,
            "generation_tokens": s.generation_tokens, "cache_hit_tokens": s.cache_hit_tokens,
            "retractions": s.retractions, "finished": s.finished, "errors": s.errors,
            "failed_steps": s.failed_steps, "waiting": l.waiting, "running": l.running, "kv_used": l.kv_used,
            "kv_capacity": l.kv_capacity, "cached_tokens": l.cached_tokens, "evictable_tokens": l.evictable_tokens})
        }
        Err(_) => Value::Null,
    };
    // read after the answer: the step loop sets them before it drains the question
    let counts = (read && kv_on).then(|| state.kv_counters.get());
    if let (Some(c), Value::Object(m)) = (counts, &mut load) {
        m.extend(crate::kv_events::load_fields(c));
    }
    let kv_events = crate::kv_events::server_info(&state.config.kv_events, counts);
    let ready = state.unavailable().is_none();
    json_response(&json!({"version": state.config.version, "settings": state.config.settings, "ready": ready,
                          "load": load, "model": state.config.model_info, "kv_events": kv_events,
                          "frontend": "rust"}))
}

/// SGLang's `/get_load`: one entry per data-parallel rank (a replica has one), what the
/// SGLang Model Gateway reads for its load-aware policies.
pub async fn get_load(State(state): State<Arc<AppState>>) -> Response {
    match ask(&state, Call::Stats).await {
        Ok((_, l)) => json_response(&json!([{"dp_rank": 0, "num_reqs": l.running + l.waiting,
            "num_waiting_reqs": l.waiting, "num_tokens": l.kv_used.saturating_sub(l.evictable_tokens)}])),
        Err(e) => axum::response::IntoResponse::into_response(e),
    }
}

/// Drops the prefix cache; refused while requests run (their KV is in use).
pub async fn flush_cache(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    if !body.is_empty() {
        let v = json_body::parse(&body)?;
        match v.as_object() {
            Some(m) if m.is_empty() => {}
            Some(m) => {
                let name = m.keys().next().expect("not empty").clone();
                return Err(ApiError::bad_request(
                    format!("{name}: unknown field (/flush_cache takes no options)"),
                    name,
                ));
            }
            None => return Err(ApiError::new(400, "the body must be a JSON object")),
        }
    }
    if !ask(&state, Call::FlushCache).await? {
        return Err(ApiError::new(
            400,
            "the cache cannot be flushed while requests are running; try again when idle",
        ));
    }
    Ok(json_response(&json!({"success": true, "message": "cache flushed"})))
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if let Ok((stats, load, latencies)) = ask(&state, Call::Metrics).await {
        state.histograms.lock().unwrap().update(stats, load, latencies);
    }
    let kv = crate::kv_events::enabled(&state.config.kv_events).then(|| state.kv_counters.get());
    let block_size = state.config.kv_events.get("block_size").and_then(Value::as_u64).unwrap_or(0);
    let text = state.histograms.lock().unwrap().render(
        &state.config.model_name,
        block_size,
        kv,
        &state.forward_times,
        state.loras.is_some(),
    );
    let mut r = Response::new(Body::from(text));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    r
}
