//! A streamed answer over server-sent events: the request core's [`Chunks`] written as
//! the generation's updates come, until every sample has finished or an error ends it.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::stream;

use crate::http::Tracked;
use crate::response::{error_event, Chunks, Usage, DONE};

/// The SSE response of `tracked`'s generation. `tracked` (which owns the request's
/// `Generation`) is dropped with the body: at the end, or when the client goes away,
/// which aborts what still runs.
pub fn stream(tracked: Tracked, chunks: Chunks) -> Response {
    let mut first = Vec::new();
    chunks.start(&mut first);
    let state = (tracked, chunks, (!first.is_empty()).then_some(first), false);
    let body = stream::unfold(state, |(mut tracked, mut chunks, first, done)| async move {
        if let Some(first) = first {
            return Some((
                Ok::<_, std::convert::Infallible>(Bytes::from(first)),
                (tracked, chunks, None, false),
            ));
        }
        if done {
            return None;
        }
        let mut out = Vec::new();
        let done = match tracked.gen.next().await {
            Err(e) => {
                error_event(&mut out, &e);
                out.extend_from_slice(DONE);
                true
            }
            Ok(batch) if batch.is_empty() => {
                chunks.end(&mut out, Usage::of(&tracked.gen.samples));
                true
            }
            Ok(batch) => {
                for (i, u) in &batch {
                    chunks.update(&mut out, &tracked.gen.samples[*i], u);
                }
                false
            }
        };
        Some((Ok(Bytes::from(out)), (tracked, chunks, None, done)))
    });
    let mut r = Response::new(Body::from_stream(body));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}
