//! The request core's answers: what the engine's step outputs become on the wire, for
//! `/v1/completions`, `/v1/chat/completions` and `/generate`.
//!
//! ```text
//! Sample (a choice's whole output) ─► Completion, ChatCompletion, GenerateResult
//! SampleUpdate (what steps added)  ─► Chunks ─► SSE events: CompletionChunk,
//!                                               ChatCompletionChunk, GenerateResult so far
//! ```
//!
//! Typed structs, serialized as they are borrowed (no JSON tree per token), in OpenAI's
//! shapes: the fields OpenAI sends as `null` are sent as `null` (`"logprobs": null`,
//! `"finish_reason": null`). A logprob is written as the f64 of the core's f32, the number
//! the offline `Engine` returns.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrolm_constraint::Vocabulary;
use ferrolm_core::detok::StopReason;
use ferrolm_core::engine::{ErrorKind, FinishReason, Finished};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::egress::SampleUpdate;
use crate::errors::ApiError;
use crate::tools::output::{parse_whole, PieceKind, ToolCall};
use crate::tools::{ChatOutputParser, ChatPlan, Piece};

pub const DONE: &[u8] = b"data: [DONE]\n\n";
const CHAT_CHUNK: &str = "chat.completion.chunk";
const TEXT_COMPLETION: &str = "text_completion";

/// One choice: everything its updates have brought so far (a stream that sends deltas
/// keeps only its tokens' ids, to count them, and its finish).
#[derive(Default, Debug, Clone)]
pub struct Sample {
    pub index: usize,
    pub first_of_prompt: bool,
    pub output: SampleUpdate,
}

/// OpenAI's finish_reason of a finished sample.
pub fn finish_reason(f: &Finished) -> &'static str {
    match f.reason {
        FinishReason::Stop(_) => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
        FinishReason::Error { .. } => "error",
    }
}

/// `tool_calls` when the output ended by itself with calls.
pub fn final_reason(finish_reason: &str, has_calls: bool) -> &str {
    if has_calls && finish_reason == "stop" {
        "tool_calls"
    } else {
        finish_reason
    }
}

/// A sample that finished with an error, as the API's error: 503 when it waited too long
/// in the queue (the server is overloaded; a retry may succeed), else 500.
pub fn error_of(f: &Finished) -> ApiError {
    match &f.reason {
        FinishReason::Error { kind: ErrorKind::QueueTimeout, message } => {
            ApiError::new(503, format!("the server is overloaded: the request {message}"))
                .with_code(ErrorKind::QueueTimeout.as_str())
        }
        // the engine logged the cause; clients get no internals
        FinishReason::Error { kind: ErrorKind::StepFailed, .. } => {
            ApiError::new(500, "generation failed: the engine step failed (see the server log)")
        }
        FinishReason::Error { message, .. } => ApiError::new(500, format!("generation failed: {message}")),
        _ => ApiError::new(500, "generation failed"),
    }
}

/// `digits` random hex digits: the ids of answers and of tool calls.
pub fn random_hex(digits: usize) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut out = String::with_capacity(digits + 16);
    while out.len() < digits {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        write!(out, "{:016x}", h.finish()).expect("a String takes it");
    }
    out.truncate(digits);
    out
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// One SSE event: `data: <json>\n\n`.
pub fn event(out: &mut Vec<u8>, payload: &impl Serialize) {
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *out, payload).expect("a response serializes");
    out.extend_from_slice(b"\n\n");
}

pub fn error_event(out: &mut Vec<u8>, e: &ApiError) {
    event(out, &e.envelope());
}

// ---- OpenAI's objects ----

#[derive(Serialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: CachedTokens,
}

#[derive(Serialize, Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CachedTokens {
    pub cached_tokens: usize,
}

impl Usage {
    /// OpenAI's usage: each prompt counted once, every sample's completion tokens.
    pub fn of(samples: &[Sample]) -> Self {
        let mut u = Usage::default();
        for s in samples {
            u.completion_tokens += s.output.token_ids.len();
            if let (true, Some(f)) = (s.first_of_prompt, &s.output.finished) {
                u.prompt_tokens += f.prompt_tokens;
                u.prompt_tokens_details.cached_tokens += f.cached_tokens;
            }
        }
        u.total_tokens = u.prompt_tokens + u.completion_tokens;
        u
    }
}

/// A response object or chunk; `C` is its choices.
#[derive(Serialize, Debug)]
pub struct Envelope<'a, C> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: C,
    /// Always on a whole answer. On a chunk only when the client asked for usage
    /// (`stream_options.include_usage`): `null`, and the usage on the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

pub type Completion<'a> = Envelope<'a, Vec<CompletionChoice<'a>>>;
pub type CompletionChunk<'a> = Envelope<'a, [CompletionChoice<'a>; 1]>;
pub type ChatCompletion<'a> = Envelope<'a, Vec<ChatChoice<'a>>>;
pub type ChatCompletionChunk<'a> = Envelope<'a, [ChatChunkChoice<'a>; 1]>;

/// A choice of a completion, whole or the text a chunk adds.
#[derive(Serialize, Debug)]
pub struct CompletionChoice<'a> {
    pub index: usize,
    pub text: &'a str,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'a str>,
}

#[derive(Serialize, Debug)]
pub struct ChatChoice<'a> {
    pub index: usize,
    pub message: AssistantMessage<'a>,
    pub logprobs: Option<ChatLogprobs<'a>>,
    pub finish_reason: Option<&'a str>,
}

#[derive(Serialize, Debug)]
pub struct ChatChunkChoice<'a> {
    pub index: usize,
    pub delta: Delta<'a>,
    pub logprobs: Option<ChatLogprobs<'a>>,
    pub finish_reason: Option<&'a str>,
}

/// The assistant message of one whole chat output.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct AssistantMessage<'a> {
    pub role: &'static str,
    /// `null` when a parsed output has none (only calls, say).
    pub content: Option<Cow<'a, str>>,
    /// Present when the plan reads reasoning; `null` when the output had none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Option<String>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// What a chunk adds to a chat choice's message; what it does not add is absent.
#[derive(Serialize, Debug, Default, Clone, PartialEq)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<FunctionCall<'a>>,
}

/// A tool call as OpenAI writes it. Whole in a message: id, type and function. In deltas:
/// first the index, id, type and name (with arguments `""`), then the index and fragments
/// of the arguments.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct FunctionCall<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: Function<'a>,
}

#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Function<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    pub arguments: Cow<'a, str>,
}

impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let function = Function { name: Some(&self.name), arguments: Cow::Borrowed(&self.arguments) };
        FunctionCall { index: None, id: Some(&self.id), kind: Some("function"), function }.serialize(s)
    }
}

/// The legacy completions' logprobs: parallel lists, `top_logprobs` as {token: logprob}.
#[derive(Serialize, Debug)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f64>,
    pub top_logprobs: Vec<Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Of `u`'s tokens, whose text starts at `offset`; with the offset after the last.
    fn new(vocab: &Vocabulary, u: &SampleUpdate, offset: usize) -> (Self, usize) {
        let text = |t: u32| String::from_utf8_lossy(vocab.token_bytes(t).unwrap_or(b"")).into_owned();
        let tokens: Vec<String> = u.token_ids.iter().map(|&t| text(t)).collect();
        let mut text_offset = Vec::with_capacity(tokens.len());
        let mut end = offset;
        for t in &tokens {
            text_offset.push(end);
            end += t.chars().count();
        }
        let top_logprobs = u
            .top_logprobs
            .iter()
            .map(|alts| alts.iter().map(|&(t, lp)| (text(t), Value::from(lp as f64))).collect())
            .collect();
        let token_logprobs = u.logprobs.iter().map(|&x| x as f64).collect();
        (CompletionLogprobs { tokens, token_logprobs, top_logprobs, text_offset }, end)
    }
}

/// The chat logprobs: one entry per token with its bytes and its alternatives.
#[derive(Serialize, Debug)]
pub struct ChatLogprobs<'a> {
    pub content: Vec<TokenLogprob<'a>>,
}

#[derive(Serialize, Debug)]
pub struct TokenLogprob<'a> {
    pub token: Cow<'a, str>,
    pub logprob: f64,
    pub bytes: &'a [u8],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TokenLogprob<'a>>>,
}

impl<'a> ChatLogprobs<'a> {
    fn new(vocab: &'a Vocabulary, u: &SampleUpdate) -> Self {
        let entry = |t: u32, lp: f32| {
            let bytes = vocab.token_bytes(t).unwrap_or(b"");
            TokenLogprob {
                token: String::from_utf8_lossy(bytes),
                logprob: lp as f64,
                bytes,
                top_logprobs: None,
            }
        };
        let content = (u.token_ids.iter().zip(&u.logprobs).zip(&u.top_logprobs))
            .map(|((&t, &lp), alts)| TokenLogprob {
                top_logprobs: Some(alts.iter().map(|&(a, y)| entry(a, y)).collect()),
                ..entry(t, lp)
            })
            .collect();
        ChatLogprobs { content }
    }
}

/// What a chat request asks of its answer beyond its plan, the same whole and streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatReply {
    /// vLLM's `echo`: the text each choice's content starts with (the last message's,
    /// when that is the assistant's); streamed, its own delta after the role.
    pub echo: Option<String>,
    /// vLLM's `include_reasoning`: `false` parses the reasoning apart (with a reasoning
    /// parser) and returns none of it, no `reasoning_content` whole or streamed.
    pub include_reasoning: bool,
    /// SGLang's `stream_reasoning`: `false` streams the reasoning as one delta once it
    /// ends (its closing tag, or the end of the output); the content streams as usual.
    pub stream_reasoning: bool,
}

impl Default for ChatReply {
    fn default() -> Self {
        ChatReply { echo: None, include_reasoning: true, stream_reasoning: true }
    }
}

/// The assistant message of a whole chat output, and its finish reason (`tool_calls` when
/// it ended by itself with calls).
pub fn message<'a, 'f>(
    plan: &ChatPlan,
    reply: &ChatReply,
    text: &'a str,
    finish: Option<&'f str>,
) -> (AssistantMessage<'a>, Option<&'f str>) {
    let mut m = AssistantMessage {
        role: "assistant",
        content: None,
        reasoning_content: None,
        tool_calls: Vec::new(),
    };
    let mut finish = finish;
    if !plan.parses() {
        m.content = Some(Cow::Borrowed(text));
    } else {
        let built = parse_whole(plan, text);
        finish = finish.map(|f| final_reason(f, !built.calls.is_empty()));
        m.content = non_empty(built.content).map(Cow::Owned);
        m.reasoning_content =
            (plan.reasoning.is_some() && reply.include_reasoning).then(|| non_empty(built.reasoning));
        m.tool_calls = built.calls;
    }
    if let Some(echo) = &reply.echo {
        // as vLLM: the echoed text, then the content (none: the echoed text alone)
        let content = m.content.take().unwrap_or_default();
        m.content = Some(Cow::Owned(format!("{echo}{content}")));
    }
    (m, finish)
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// OpenAI's chunk deltas of parsed pieces: a call's id and name first (with empty
/// arguments), then its argument fragments; runs of one kind merged.
pub fn deltas(pieces: &[Piece]) -> Vec<Delta<'_>> {
    let mut out: Vec<Delta> = Vec::new();
    for p in pieces {
        let last = out.last_mut();
        match p.kind {
            PieceKind::Reasoning | PieceKind::Content => {
                let reasoning = p.kind == PieceKind::Reasoning;
                let run = last.filter(|d| d.role.is_none() && d.tool_calls.is_empty()).and_then(|d| {
                    match (reasoning, &mut d.content, &mut d.reasoning_content) {
                        (false, Some(text), None) | (true, None, Some(text)) => Some(text),
                        _ => None,
                    }
                });
                match run {
                    Some(text) => text.to_mut().push_str(&p.text),
                    None if reasoning => out
                        .push(Delta { reasoning_content: Some(Cow::Borrowed(&p.text)), ..Delta::default() }),
                    None => out.push(Delta { content: Some(Cow::Borrowed(&p.text)), ..Delta::default() }),
                }
            }
            PieceKind::Call => {
                let function = Function { name: Some(&p.text), arguments: Cow::Borrowed("") };
                let call = FunctionCall {
                    index: Some(p.index),
                    id: Some(&p.call_id),
                    kind: Some("function"),
                    function,
                };
                out.push(Delta { tool_calls: vec![call], ..Delta::default() });
            }
            PieceKind::Arguments => {
                let run = last
                    .filter(|d| d.role.is_none() && d.content.is_none() && d.reasoning_content.is_none())
                    .and_then(|d| d.tool_calls.first_mut())
                    .filter(|c| c.index == Some(p.index) && c.id.is_none());
                match run {
                    Some(call) => call.function.arguments.to_mut().push_str(&p.text),
                    None => {
                        let function = Function { name: None, arguments: Cow::Borrowed(&p.text) };
                        let call = FunctionCall { index: Some(p.index), id: None, kind: None, function };
                        out.push(Delta { tool_calls: vec![call], ..Delta::default() });
                    }
                }
            }
        }
    }
    out
}

/// What every object and chunk of one answer names: its id, when, the model.
#[derive(Debug, Clone)]
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Head {
    /// A new answer's: `{prefix}-{32 hex digits}`, created now.
    pub fn new(prefix: &str, model: &str) -> Self {
        Head { id: format!("{prefix}-{}", random_hex(32)), created: unix_now(), model: model.to_string() }
    }

    fn envelope<C>(&self, object: &'static str, choices: C, usage: Option<Option<Usage>>) -> Envelope<'_, C> {
        Envelope { id: &self.id, object, created: self.created, model: &self.model, choices, usage }
    }

    /// The whole answer of `/v1/completions`.
    pub fn completion<'a>(
        &'a self,
        samples: &'a [Sample],
        logprobs: bool,
        vocab: &Vocabulary,
    ) -> Completion<'a> {
        let choices = samples
            .iter()
            .map(|s| CompletionChoice {
                index: s.index,
                text: &s.output.text,
                logprobs: logprobs.then(|| CompletionLogprobs::new(vocab, &s.output, 0).0),
                finish_reason: s.output.finished.as_ref().map(finish_reason),
            })
            .collect();
        self.envelope(TEXT_COMPLETION, choices, Some(Some(Usage::of(samples))))
    }

    /// The whole answer of `/v1/chat/completions`: each choice's message as the plan's
    /// output parser reads it.
    pub fn chat_completion<'a>(
        &'a self,
        samples: &'a [Sample],
        plan: &ChatPlan,
        reply: &ChatReply,
        logprobs: bool,
        vocab: &'a Vocabulary,
    ) -> ChatCompletion<'a> {
        let choices = samples
            .iter()
            .map(|s| {
                let (message, finish_reason) =
                    message(plan, reply, &s.output.text, s.output.finished.as_ref().map(finish_reason));
                let logprobs = logprobs.then(|| ChatLogprobs::new(vocab, &s.output));
                ChatChoice { index: s.index, message, logprobs, finish_reason }
            })
            .collect();
        self.envelope("chat.completion", choices, Some(Some(Usage::of(samples))))
    }
}

// ---- the native API ----

/// `/generate`'s answer for one sample (streamed: the whole output so far).
#[derive(Serialize, Debug)]
pub struct GenerateResult<'a> {
    pub text: &'a str,
    pub output_ids: &'a [u32],
    pub meta_info: MetaInfo<'a>,
    /// When the request asked for tools or reasoning, the output as the plan reads it:
    /// the content (`null` when none); the reasoning where the plan reads it; the calls
    /// where it reads calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Serialize, Debug)]
pub struct MetaInfo<'a> {
    pub id: &'a str,
    pub finish_reason: Option<NativeFinish<'a>>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// (logprob, token) per token, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_token_logprobs: Option<Vec<(f64, u32)>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_top_logprobs: Option<Vec<Vec<(f64, u32)>>>,
}

#[derive(Serialize, Debug)]
pub struct NativeFinish<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    /// What matched a stop: the string or the token id.
    pub matched: Option<Matched<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'a str>,
}

#[derive(Serialize, Debug)]
#[serde(untagged)]
pub enum Matched<'a> {
    Text(&'a str),
    Token(u32),
}

/// One sample's `/generate` answer; `plan`: the request's, when it asked for tools or
/// reasoning.
pub fn generate_result<'a>(
    s: &'a Sample,
    rid: &'a str,
    logprobs: bool,
    plan: Option<&ChatPlan>,
) -> GenerateResult<'a> {
    let (o, finished) = (&s.output, s.output.finished.as_ref());
    let finish = finished.map(|f| NativeFinish {
        kind: finish_reason(f),
        matched: match &f.reason {
            FinishReason::Stop(StopReason::String(s)) => Some(Matched::Text(s)),
            FinishReason::Stop(StopReason::Token(t)) => Some(Matched::Token(*t)),
            _ => None,
        },
        message: if let FinishReason::Error { message, .. } = &f.reason { Some(message) } else { None },
    });
    let pairs = |ids: &[u32], lps: &[f32]| ids.iter().zip(lps).map(|(&t, &lp)| (lp as f64, t)).collect();
    let mut out = GenerateResult {
        text: &o.text,
        output_ids: &o.token_ids,
        meta_info: MetaInfo {
            id: rid,
            finish_reason: finish,
            prompt_tokens: finished.map_or(0, |f| f.prompt_tokens),
            completion_tokens: o.token_ids.len(),
            cached_tokens: finished.map_or(0, |f| f.cached_tokens),
            output_token_logprobs: logprobs.then(|| pairs(&o.token_ids, &o.logprobs)),
            output_top_logprobs: logprobs.then(|| {
                o.top_logprobs
                    .iter()
                    .map(|alts| alts.iter().map(|&(t, lp)| (lp as f64, t)).collect())
                    .collect()
            }),
        },
        content: None,
        reasoning_content: None,
        tool_calls: None,
    };
    if let Some(plan) = plan {
        let built = parse_whole(plan, &o.text);
        if let (false, Some(f)) = (built.calls.is_empty(), out.meta_info.finish_reason.as_mut()) {
            f.kind = final_reason(f.kind, true);
        }
        out.content = Some(non_empty(built.content));
        out.reasoning_content = plan.reasoning.is_some().then(|| non_empty(built.reasoning));
        out.tool_calls = plan.tool_format.is_some().then_some(built.calls);
    }
    out
}

// ---- streaming ----

/// A streamed answer written as SSE events: [`Chunks::start`], then [`Chunks::update`]
/// for each update of a sample as the generation yields them, then [`Chunks::end`].
pub struct Chunks {
    frame: Frame,
    logprobs: bool,
    vocab: Arc<Vocabulary>,
    form: Form,
}

/// What every chunk of one answer carries around its choice: the chunk's [`Envelope`]
/// written once, cut where its choice goes, so that a token's chunk serializes only its
/// choice.
struct Frame {
    head: Head,
    object: &'static str,
    /// `"usage": null` on each chunk, and the usage at the end.
    include_usage: bool,
    /// `data: {"id":...,"choices":[` and `],"usage":null}\n\n` (or `]}\n\n`).
    open: Vec<u8>,
    close: Vec<u8>,
}

impl Frame {
    fn new(head: Head, object: &'static str, include_usage: bool) -> Self {
        let mut open = Vec::new();
        event(&mut open, &head.envelope(object, [(); 0], include_usage.then_some(None)));
        // the choices are the envelope's last list (usage is null): its last `[]`
        let at = open.windows(2).rposition(|w| w == b"[]").expect("the choices") + 1;
        let close = open.split_off(at);
        Frame { head, object, include_usage, open, close }
    }

    fn chunk(&self, out: &mut Vec<u8>, choice: impl Serialize) {
        out.reserve(self.open.len() + self.close.len() + 128);
        out.extend_from_slice(&self.open);
        serde_json::to_writer(&mut *out, &choice).expect("a choice serializes");
        out.extend_from_slice(&self.close);
    }
}

enum Form {
    /// Per choice: where its next token's text starts (the logprobs' `text_offset`).
    Completion { offsets: Vec<usize> },
    /// Per choice, its output parser (none when outputs are plain text) and whether it
    /// has sent a call; what the request asks of the answer.
    Chat { parsers: Vec<ChatOutputParser>, has_calls: Vec<bool>, reply: Box<ChatReply> },
    /// `/generate`: each event the whole output so far, read by the plan when the request
    /// asked for tools or reasoning.
    Generate { plan: Option<Box<ChatPlan>> },
}

impl Chunks {
    pub fn completion(
        head: Head,
        n: usize,
        include_usage: bool,
        logprobs: bool,
        vocab: Arc<Vocabulary>,
    ) -> Self {
        let frame = Frame::new(head, TEXT_COMPLETION, include_usage);
        Chunks { frame, logprobs, vocab, form: Form::Completion { offsets: vec![0; n] } }
    }

    pub fn chat(
        head: Head,
        plan: &ChatPlan,
        reply: ChatReply,
        n: usize,
        include_usage: bool,
        logprobs: bool,
        vocab: Arc<Vocabulary>,
    ) -> Self {
        let parser = || match reply.stream_reasoning {
            true => plan.output_parser(),
            false => plan.output_parser().holding_reasoning(),
        };
        let parsers = if plan.parses() { (0..n).map(|_| parser()).collect() } else { Vec::new() };
        let frame = Frame::new(head, CHAT_CHUNK, include_usage);
        let form = Form::Chat { parsers, has_calls: vec![false; n], reply: Box::new(reply) };
        Chunks { frame, logprobs, vocab, form }
    }

    pub fn generate(rid: String, plan: Option<ChatPlan>, logprobs: bool, vocab: Arc<Vocabulary>) -> Self {
        let frame = Frame::new(Head { id: rid, created: 0, model: String::new() }, "", false);
        Chunks { frame, logprobs, vocab, form: Form::Generate { plan: plan.map(Box::new) } }
    }

    /// What comes before any output: each chat choice's role, then (vLLM's `echo`) each
    /// choice's echoed text.
    pub fn start(&self, out: &mut Vec<u8>) {
        if let Form::Chat { has_calls, reply, .. } = &self.form {
            for index in 0..has_calls.len() {
                let delta =
                    Delta { role: Some("assistant"), content: Some(Cow::Borrowed("")), ..Delta::default() };
                self.frame.chunk(out, ChatChunkChoice { index, delta, logprobs: None, finish_reason: None });
            }
            if let Some(echo) = reply.echo.as_deref().filter(|e| !e.is_empty()) {
                for index in 0..has_calls.len() {
                    let delta = Delta { content: Some(Cow::Borrowed(echo)), ..Delta::default() };
                    self.frame
                        .chunk(out, ChatChunkChoice { index, delta, logprobs: None, finish_reason: None });
                }
            }
        }
    }

    /// One update `u` of sample `s` (`s` has it already where the generation accumulates).
    pub fn update(&mut self, out: &mut Vec<u8>, s: &Sample, u: &SampleUpdate) {
        let Chunks { frame, logprobs, vocab, form } = self;
        let index = s.index;
        let fresh = !u.token_ids.is_empty() || !u.text.is_empty();
        match form {
            Form::Generate { plan } => {
                if let Some(f) = &u.finished {
                    error_event_of(out, f);
                }
                event(out, &generate_result(s, &frame.head.id, *logprobs, plan.as_deref()));
            }
            Form::Completion { offsets } => {
                if fresh {
                    let logprobs = logprobs.then(|| {
                        let (lp, end) = CompletionLogprobs::new(vocab, u, offsets[index]);
                        offsets[index] = end;
                        lp
                    });
                    frame
                        .chunk(out, CompletionChoice { index, text: &u.text, logprobs, finish_reason: None });
                }
                if let Some(f) = &u.finished {
                    error_event_of(out, f);
                    let reason = Some(finish_reason(f));
                    frame.chunk(
                        out,
                        CompletionChoice { index, text: "", logprobs: None, finish_reason: reason },
                    );
                }
            }
            Form::Chat { parsers, has_calls, reply } => {
                let mut logprobs = (fresh && *logprobs).then(|| ChatLogprobs::new(vocab, u));
                let mut pieces: Vec<Piece>;
                if parsers.is_empty() {
                    if fresh {
                        let delta = Delta { content: Some(Cow::Borrowed(&u.text)), ..Delta::default() };
                        frame.chunk(out, ChatChunkChoice { index, delta, logprobs, finish_reason: None });
                    }
                } else {
                    let parser = &mut parsers[index];
                    pieces = parser.feed(&u.text);
                    if u.finished.is_some() {
                        pieces.extend(parser.finish());
                    }
                    if !reply.include_reasoning {
                        pieces.retain(|p| p.kind != PieceKind::Reasoning);
                    }
                    let mut deltas = deltas(&pieces);
                    if deltas.is_empty() && logprobs.is_some() {
                        deltas.push(Delta::default());
                    }
                    has_calls[index] |= deltas.iter().any(|d| !d.tool_calls.is_empty());
                    for delta in deltas {
                        // the update's logprobs go with its first delta
                        let logprobs = logprobs.take();
                        frame.chunk(out, ChatChunkChoice { index, delta, logprobs, finish_reason: None });
                    }
                }
                if let Some(f) = &u.finished {
                    error_event_of(out, f);
                    let reason = Some(final_reason(finish_reason(f), has_calls[index]));
                    let delta = Delta::default();
                    frame.chunk(out, ChatChunkChoice { index, delta, logprobs: None, finish_reason: reason });
                }
            }
        }
    }

    /// The end of the stream: the usage (when asked for), then `[DONE]`.
    pub fn end(&self, out: &mut Vec<u8>, usage: Usage) {
        let Frame { head, object, include_usage, .. } = &self.frame;
        if *include_usage {
            event(out, &head.envelope(object, [(); 0], Some(Some(usage))));
        }
        out.extend_from_slice(DONE);
    }
}

/// The error event of a sample that finished with an error (sent before its finish).
fn error_event_of(out: &mut Vec<u8>, f: &Finished) {
    if let FinishReason::Error { .. } = f.reason {
        error_event(out, &error_of(f));
    }
}

#[cfg(test)]
mod tests;
