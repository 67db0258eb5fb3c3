//! The axum application: routes, the guard every request passes (API key, JSON content
//! type, body size), and what the routes share.

pub mod info;
pub mod lora;
pub mod messages;
pub mod native;
pub mod openai;
pub mod responses;
pub mod sse;
pub mod tokenize;
pub mod translate;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::errors::{ApiError, ApiResult};
use crate::generation::Generation;
use crate::state::{AppState, Named};

/// Probes and scrapers carry no key.
const OPEN_PATHS: [&str; 2] = ["/health", "/metrics"];

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions/render", post(render_completion))
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/v1/models", get(info::list_models))
        .route("/v1/models/{*model_id}", get(retrieve_model))
        .route(
            "/v1/models/",
            get(
                |State(state): State<Arc<AppState>>| async move { respond(info::retrieve_model(&state, "")) },
            ),
        )
        .route("/generate", post(generate))
        .route("/abort_request", post(abort_request))
        .route("/health", get(info::health))
        .route("/server_info", get(info::server_info))
        .route("/get_server_info", get(info::server_info))
        .route("/get_model_info", get(info::get_model_info))
        .route("/model_info", get(info::get_model_info))
        .route("/get_load", get(info::get_load))
        .route("/flush_cache", post(flush_cache))
        .route("/metrics", get(info::metrics))
        .merge(responses::routes())
        .merge(messages::routes())
        .merge(tokenize::routes())
        .merge(lora::routes())
        .fallback(|| async { ApiError::new(404, "Not Found") })
        .method_not_allowed_fallback(|| async { ApiError::new(405, "Method Not Allowed") })
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(middleware::from_fn(messages::anthropic_envelope))
        .layer(middleware::from_fn(close_unless_read))
        .with_state(state)
}

async fn completions(State(state): State<Arc<AppState>>, body: Body) -> Response {
    respond(async { openai::completions(state.clone(), read_body(&state, body).await?).await }.await)
}

async fn chat(State(state): State<Arc<AppState>>, body: Body) -> Response {
    respond(async { openai::chat(state.clone(), read_body(&state, body).await?).await }.await)
}

async fn render_completion(State(state): State<Arc<AppState>>, body: Body) -> Response {
    respond(async { openai::render_completion(state.clone(), read_body(&state, body).await?).await }.await)
}

async fn render_chat(State(state): State<Arc<AppState>>, body: Body) -> Response {
    respond(async { openai::render_chat(state.clone(), read_body(&state, body).await?).await }.await)
}

async fn generate(State(state): State<Arc<AppState>>, body: Body) -> Response {
    respond(async { native::generate(state.clone(), read_body(&state, body).await?).await }.await)
}

async fn abort_request(State(state): State<Arc<AppState>>, body: Body) -> Response {
    respond(async { native::abort_request(state.clone(), read_body(&state, body).await?).await }.await)
}

async fn flush_cache(State(state): State<Arc<AppState>>, body: Body) -> Response {
    respond(async { info::flush_cache(state.clone(), read_body(&state, body).await?).await }.await)
}

async fn retrieve_model(State(state): State<Arc<AppState>>, Path(model_id): Path<String>) -> Response {
    respond(info::retrieve_model(&state, &model_id))
}

fn respond(r: ApiResult<Response>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

pub fn json_response(v: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(v).expect("a response serializes");
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// The body, refused with 413 past `--max-request-bytes` while it streams in.
async fn read_body(state: &AppState, body: Body) -> ApiResult<Bytes> {
    axum::body::to_bytes(body, state.config.max_request_bytes).await.map_err(|_| too_large(state))
}

fn too_large(state: &AppState) -> ApiError {
    ApiError::new(
        413,
        format!(
            "the request body is larger than {} bytes (the server's --max-request-bytes)",
            state.config.max_request_bytes
        ),
    )
    .with_code("request_too_large")
}

/// What every request passes before a route sees it: the API key, then for a POST with a
/// body a JSON content type (so that a web page cannot drive the API with a "simple"
/// cross-origin request; a POST without a body, as `curl -X POST .../flush_cache` sends
/// it, needs none) and a declared length within the limit.
async fn guard(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if let Some(key) = &state.config.api_key {
        if !OPEN_PATHS.contains(&path) && !authorized(request.headers(), key.as_bytes()) {
            return ApiError::new(401, "a valid API key is required: 'Authorization: Bearer KEY'")
                .with_code("invalid_api_key")
                .into_response();
        }
    }
    let headers = request.headers();
    let content_type = headers.get(header::CONTENT_TYPE);
    if request.method() == Method::POST
        && !is_json(content_type)
        && !(content_type.is_none() && bodiless(headers))
    {
        return ApiError::new(415, "a POST body must be JSON: send 'Content-Type: application/json'")
            .with_code("unsupported_media_type")
            .into_response();
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > state.config.max_request_bytes as u64) {
        return too_large(&state).into_response();
    }
    next.run(request).await
}

/// A request that declares no body: `Content-Length: 0`, or neither a length nor a
/// transfer coding (RFC 9112 6.3: then the body is empty).
fn bodiless(headers: &HeaderMap) -> bool {
    match headers.get(header::CONTENT_LENGTH) {
        Some(v) => v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) == Some(0),
        None => !headers.contains_key(header::TRANSFER_ENCODING),
    }
}

/// Says `Connection: close` on a response given before its request's body was read to the
/// end (a refusal by the guard, a 413 part way through, a route that reads no body): the
/// server cannot find where the next request on that connection starts, and closes it
/// after this response (hyper drains at most what has already arrived). Without the
/// header, a keep-alive client that sent its next request at once (several clients at
/// a time make that likely) would have it dropped unanswered.
async fn close_unless_read(request: Request, next: Next) -> Response {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Poll;

    use axum::body::HttpBody;
    use futures_util::StreamExt;

    let (parts, body) = request.into_parts();
    let read = Arc::new(AtomicBool::new(body.is_end_stream()));
    let request = if read.load(Ordering::Relaxed) {
        Request::from_parts(parts, body)
    } else {
        let seen = read.clone();
        let mut data = body.into_data_stream();
        let tracked = futures_util::stream::poll_fn(move |cx| {
            let next = data.poll_next_unpin(cx);
            if let Poll::Ready(None) = next {
                seen.store(true, Ordering::Relaxed);
            }
            next
        });
        Request::from_parts(parts, Body::from_stream(tracked))
    };
    let mut response = next.run(request).await;
    if !read.load(Ordering::Relaxed) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// `Authorization: Bearer KEY` (the scheme case-insensitive, RFC 9110) or `x-api-key: KEY`
/// (Anthropic's), the key compared in constant time.
fn authorized(headers: &HeaderMap, expected: &[u8]) -> bool {
    if let Some(key) = headers.get("x-api-key") {
        return constant_time_eq(trim(key.as_bytes()), expected);
    }
    let given = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()).unwrap_or(b"");
    let given = trim(given);
    let (scheme, token) = match given.iter().position(|&b| b == b' ') {
        Some(i) => (&given[..i], trim(&given[i + 1..])),
        None => (given, &b""[..]),
    };
    scheme.eq_ignore_ascii_case(b"bearer") && constant_time_eq(token, expected)
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let end = b.iter().rposition(|c| !c.is_ascii_whitespace()).map_or(start, |i| i + 1);
    &b[start..end]
}

/// Equal in time that depends only on the expected key's length: every byte of it is
/// compared whatever the given key holds, so how much matched does not show.
pub fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = (given.len() ^ expected.len()) as u64;
    for (i, &e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= u64::from(g ^ e);
    }
    std::hint::black_box(diff) == 0
}

fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(v) = content_type.and_then(|v| v.to_str().ok()) else { return false };
    let mut parts = v.split(';');
    if !parts.next().unwrap_or("").trim().eq_ignore_ascii_case("application/json") {
        return false;
    }
    for p in parts {
        let (name, value) = p.split_once('=').unwrap_or((p, ""));
        if name.trim().eq_ignore_ascii_case("charset") {
            let value = value.trim().trim_matches('"').to_ascii_lowercase();
            if value != "utf-8" && value != "utf8" {
                return false; // JSON is UTF-8 (RFC 8259)
            }
        }
    }
    true
}

/// A generation registered under its public id for `/abort_request`, for as long as
/// this lives (dropping it aborts what still runs and forgets the id).
pub struct Tracked {
    pub state: Arc<AppState>,
    pub id: String,
    pub gen: Generation,
}

impl Tracked {
    pub fn new(state: &Arc<AppState>, id: String, gen: Generation) -> Self {
        state
            .named
            .lock()
            .unwrap()
            .insert(id.clone(), Named { stream: gen.stream.clone(), rids: gen.rids.clone() });
        Tracked { state: state.clone(), id, gen }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut named = self.state.named.lock().unwrap();
        if named.get(&self.id).is_some_and(|n| Arc::ptr_eq(&n.stream, &self.gen.stream)) {
            named.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret1", b"secret"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bEaReR  secret "));
        assert!(authorized(&h, b"secret"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic secret"));
        assert!(!authorized(&h, b"secret"));
        assert!(!authorized(&HeaderMap::new(), b"secret"));
    }

    #[test]
    fn a_body_is_declared_by_a_length_or_a_transfer_coding() {
        let with = |name: header::HeaderName, v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(v));
            h
        };
        assert!(bodiless(&HeaderMap::new()));
        assert!(bodiless(&with(header::CONTENT_LENGTH, "0")));
        assert!(!bodiless(&with(header::CONTENT_LENGTH, "2")));
        assert!(!bodiless(&with(header::CONTENT_LENGTH, "x")));
        assert!(!bodiless(&with(header::TRANSFER_ENCODING, "chunked")));
    }

    #[test]
    fn json_content_types() {
        let ok = |s: &'static str| is_json(Some(&HeaderValue::from_static(s)));
        assert!(ok("application/json"));
        assert!(ok("Application/JSON; charset=\"UTF-8\""));
        assert!(!ok("application/json; charset=latin-1"));
        assert!(!ok("text/plain"));
        assert!(!is_json(None));
    }
}
