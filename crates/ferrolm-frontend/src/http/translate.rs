//! What `/v1/messages` and `/v1/responses` share. Each is a translation of its request
//! into the body `/v1/chat/completions` takes, run by the one request core
//! (`openai::prepare` and `openai::submit`: the chat template, the tools and their
//! constraint, structured output, the checks of every field); the output is read by the
//! chat plan's own parser and written in the API's shape. Errors raised on the chat path
//! name chat's fields: [`Renames`] puts them back into the API's (`tools.0.input_schema`,
//! not `tools.0.function.parameters`).
//!
//! Each API keeps the fields of its request schema as data ([`FieldPolicy`] tables, with
//! the schema they come from): a field is honoured, accepted because it cannot change a
//! token (said so), or refused by name; a field in no table is refused as unknown.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use ferrolm_core::detok::StopReason;
use ferrolm_core::engine::{FinishReason, Finished};
use futures_util::stream;
use serde_json::{Map, Value};

use crate::egress::SampleUpdate;
use crate::errors::{ApiError, ApiResult};
use crate::field_policy::{check_rule, Rule};
use crate::generation::Generation;
use crate::http::openai::{self, ChatJob};
use crate::http::Tracked;
use crate::protocol;
use crate::response::{Sample, Usage};
use crate::state::AppState;
use crate::tools::{ChatOutputParser, Piece};

/// What a request field gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Read and acted on (its values checked where it is read).
    Honoured,
    /// Accepted and changes nothing the model generates; the reason says why.
    NoEffect(&'static str),
    /// A 400 naming the field whenever it is given (not null), with the reason.
    Refused(&'static str),
}

pub type FieldPolicy = (&'static str, Policy);

impl Policy {
    /// The rule `field_policy` checks: honoured is read, no effect is ignored, refused is
    /// accepted only as null.
    fn rule(self) -> Rule {
        match self {
            Policy::Honoured => Rule::Read,
            Policy::NoEffect(_) => Rule::Ignored,
            Policy::Refused(reason) => Rule::AtDefault(&[], reason),
        }
    }
}

/// Checks a body's top-level fields against its API's table: refused ones (when not null)
/// and unknown ones are a 400 naming them.
pub fn check_fields(obj: &Map<String, Value>, table: &[FieldPolicy], prefix: &str) -> ApiResult<()> {
    for (name, value) in obj {
        let path = format!("{prefix}{name}");
        match table.iter().find(|(n, _)| n == name).map(|(_, p)| *p) {
            Some(policy) => {
                if let Err(message) = check_rule(policy.rule(), value) {
                    return Err(ApiError::bad_request(format!("{path}: {message}"), path));
                }
            }
            None => {
                let known: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
                return Err(ApiError::bad_request(
                    format!("{path}: unknown field (the fields here: {})", known.join(", ")),
                    path,
                ));
            }
        }
    }
    Ok(())
}

/// A 400 naming `field`.
pub fn bad(field: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("{field}: {message}"), field)
}

/// The request's value at `field` as a string (absent or null: `None`).
pub fn opt_str<'a>(obj: &'a Map<String, Value>, key: &str, field: &str) -> ApiResult<Option<&'a str>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(field, "expected a string")),
    }
}

pub fn object_at<'a>(v: &'a Value, field: &str) -> ApiResult<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| bad(field, "expected an object"))
}

/// Chat's field paths to the API's: the longest chat prefix that matches is replaced.
#[derive(Debug, Default)]
pub struct Renames(Vec<(String, String)>);

impl Renames {
    pub fn add(&mut self, chat: impl Into<String>, api: impl Into<String>) {
        self.0.push((chat.into(), api.into()));
    }

    pub fn apply(&self, mut e: ApiError) -> ApiError {
        let Some(param) = e.param.clone() else { return e };
        let found = self
            .0
            .iter()
            .filter(|(c, _)| {
                param == *c || param.strip_prefix(c.as_str()).is_some_and(|r| r.starts_with('.'))
            })
            .max_by_key(|(c, _)| c.len());
        if let Some((chat, api)) = found {
            let renamed = format!("{api}{}", &param[chat.len()..]);
            if let Some(rest) = e.message.strip_prefix(param.as_str()) {
                e.message = format!("{renamed}{rest}");
            }
            e.param = Some(renamed);
        }
        e
    }
}

/// A translated chat, prepared and submitted by the chat path; its errors renamed.
pub(crate) async fn run_chat(
    state: &Arc<AppState>,
    chat: &Value,
    renames: &Renames,
) -> ApiResult<(ChatJob, Generation)> {
    let body = serde_json::to_vec(chat).expect("a chat body serializes");
    let req = protocol::parse_chat(&body).map_err(|e| renames.apply(e))?;
    let job = openai::prepare(state, req).await.map_err(|e| renames.apply(e))?;
    let gen = openai::submit(state, &job).await.map_err(|e| renames.apply(e))?;
    Ok((job, gen))
}

/// How a sample ended, in the terms both APIs need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Ended by itself (end of sequence, a stop token).
    Done,
    /// A stop string matched.
    StopString(String),
    /// The token budget ran out.
    Length,
    Aborted,
}

pub fn ending(f: &Finished) -> Ending {
    match &f.reason {
        FinishReason::Stop(StopReason::String(s)) => Ending::StopString(s.clone()),
        FinishReason::Stop(_) => Ending::Done,
        FinishReason::Length => Ending::Length,
        FinishReason::Abort | FinishReason::Error { .. } => Ending::Aborted,
    }
}

/// An SSE event with its name: `event: NAME\ndata: JSON\n\n`.
pub fn named_event(out: &mut Vec<u8>, name: &str, payload: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    serde_json::to_writer(&mut *out, payload).expect("an event serializes");
    out.extend_from_slice(b"\n\n");
}

/// A streamed answer in an API's events, fed the output's parsed pieces.
pub trait Events: Send + 'static {
    fn start(&mut self, out: &mut Vec<u8>);
    fn pieces(&mut self, out: &mut Vec<u8>, pieces: Vec<Piece>);
    /// The sample's end (its pieces are all in).
    fn finish(&mut self, out: &mut Vec<u8>, f: &Finished, usage: Usage);
    /// The stream ends with an error.
    fn error(&mut self, out: &mut Vec<u8>, e: &ApiError);
}

/// The SSE response of a single-sample generation written by `events`. `tracked` (which
/// owns the request's `Generation`) is dropped with the body: at the end, or when the
/// client goes away, which aborts what still runs and frees its KV.
pub fn stream(tracked: Tracked, parser: ChatOutputParser, mut events: impl Events) -> Response {
    let mut first = Vec::new();
    events.start(&mut first);
    let state = (tracked, parser, events, Some(first), false);
    let body = stream::unfold(state, |(mut tracked, mut parser, mut events, first, done)| async move {
        if let Some(first) = first {
            return Some((
                Ok::<_, std::convert::Infallible>(Bytes::from(first)),
                (tracked, parser, events, None, false),
            ));
        }
        if done {
            return None;
        }
        let mut out = Vec::new();
        let done = match tracked.gen.next().await {
            Err(e) => {
                events.error(&mut out, &e);
                true
            }
            Ok(batch) if batch.is_empty() => true,
            Ok(batch) => {
                let mut done = false;
                for (_, u) in &batch {
                    done |= feed(&mut out, &mut parser, &mut events, &tracked.gen.samples, u);
                }
                done
            }
        };
        Some((Ok(Bytes::from(out)), (tracked, parser, events, None, done)))
    });
    let mut r = Response::new(Body::from_stream(body));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// One update through the parser into events; whether the sample finished.
fn feed(
    out: &mut Vec<u8>,
    parser: &mut ChatOutputParser,
    events: &mut impl Events,
    samples: &[Sample],
    u: &SampleUpdate,
) -> bool {
    let mut pieces = parser.feed(&u.text);
    let Some(f) = &u.finished else {
        events.pieces(out, pieces);
        return false;
    };
    if let FinishReason::Error { .. } = f.reason {
        events.error(out, &crate::response::error_of(f));
        return true;
    }
    pieces.extend(parser.finish());
    events.pieces(out, pieces);
    events.finish(out, f, Usage::of(samples));
    true
}

/// The one sample of a generation run to its end: its text, and how it ended.
pub async fn run_whole(gen: &mut Generation) -> ApiResult<(String, Finished)> {
    gen.run_to_end().await?;
    let s = gen.samples.first().ok_or_else(|| ApiError::new(500, "no sample"))?;
    let f = s.output.finished.clone().ok_or_else(|| ApiError::new(500, "the sample did not finish"))?;
    Ok((s.output.text.clone(), f))
}

/// The arguments of a call as a JSON value (an object when the call was constrained;
/// otherwise the text as it came, as a string).
pub fn arguments_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_take_the_longest_prefix_and_keep_the_rest() {
        let mut r = Renames::default();
        r.add("tools", "tools");
        r.add("tools.1.function.parameters", "tools.1.input_schema");
        r.add("max_tokens", "max_output_tokens");
        let e = r.apply(ApiError::bad_request(
            "tools.1.function.parameters.properties: bad",
            "tools.1.function.parameters.properties",
        ));
        assert_eq!(e.param.as_deref(), Some("tools.1.input_schema.properties"));
        assert_eq!(e.message, "tools.1.input_schema.properties: bad");
        let e = r.apply(ApiError::bad_request("max_tokens: too big", "max_tokens"));
        assert_eq!(e.param.as_deref(), Some("max_output_tokens"));
        // a prefix of a name is not a prefix of its path
        let e = r.apply(ApiError::bad_request("max_tokensx: no", "max_tokensx"));
        assert_eq!(e.param.as_deref(), Some("max_tokensx"));
    }

    #[test]
    fn refused_and_unknown_fields_are_named() {
        const TABLE: &[FieldPolicy] =
            &[("a", Policy::Honoured), ("b", Policy::NoEffect("no token")), ("c", Policy::Refused("why"))];
        let obj = |v: Value| v.as_object().unwrap().clone();
        assert!(check_fields(&obj(serde_json::json!({"a": 1, "b": 2, "c": null})), TABLE, "").is_ok());
        let e = check_fields(&obj(serde_json::json!({"c": 1})), TABLE, "x.").unwrap_err();
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("x.c"), "x.c: 1 is not supported: why (accepted: null)")
        );
        let e = check_fields(&obj(serde_json::json!({"d": 1})), TABLE, "").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("d"));
        assert!(e.message.contains("unknown field"), "{}", e.message);
    }
}
