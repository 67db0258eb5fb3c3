//! Server-sent events as OpenAI frames them: `data: <json>\n\n` per chunk, then
//! `data: [DONE]\n\n`. The hot chunks are written by hand, keys in a fixed order (no JSON
//! tree per token).

use std::future::Future;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::stream;
use serde_json::Value;

pub const DONE: &[u8] = b"data: [DONE]\n\n";

pub fn event(out: &mut Vec<u8>, payload: &Value) {
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *out, payload).expect("a JSON value serializes");
    out.extend_from_slice(b"\n\n");
}

/// A JSON string literal (Python's `json.dumps(s, ensure_ascii=False)`).
pub fn json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("a string serializes");
}

/// An SSE response whose chunks come from `next` until it returns `None`. The state
/// `S` (which owns the request's `Generation`) is dropped when the body is: at the end,
/// or when the client goes away, which aborts what still runs.
pub fn response<S, F, Fut>(state: S, next: F) -> Response
where
    S: Send + 'static,
    F: FnMut(S) -> Fut + Send + 'static,
    Fut: Future<Output = Option<(Bytes, S)>> + Send + 'static,
{
    let mut next = next;
    let body = stream::unfold(state, move |s| {
        let fut = next(s);
        async move { fut.await.map(|(b, s)| (Ok::<_, std::convert::Infallible>(b), s)) }
    });
    let mut r = Response::new(Body::from_stream(body));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}
