//! `POST /v1/completions` and `POST /v1/chat/completions`: OpenAI's shapes, streamed over
//! SSE or answered at the end, as the Python front end answers them
//! (`openai_completions.py`, `openai_chat.py`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::Response;
use ferrolm_constraint::Grammar;
use ferrolm_core::engine::{Constraint, RequestParams};
use serde_json::{json, Value};

use crate::chat_request::{ChatInput, PreparedChat};
use crate::egress::SampleUpdate;
use crate::errors::{ApiError, ApiResult};
use crate::generation::{error_of, finish_reason, Generation, Sample};
use crate::http::sse::{self, json_str, DONE};
use crate::http::{json_response, public_id, unix_now, Tracked};
use crate::protocol::{self, ChatFields, ChatRequest, CompletionRequest, OpenAISampling, Prompt};
use crate::state::AppState;
use crate::tools::output as tools_output;
use crate::tools::ChatOutputParser;

const DEFAULT_MAX_TOKENS: u64 = 16; // OpenAI's default for completions

fn completion_field(core: &str) -> Option<String> {
    Some(
        match core {
            "input_ids" => "prompt",
            "max_new_tokens" => "max_tokens",
            "min_new_tokens" => "min_tokens",
            "top_logprobs" => "logprobs",
            _ => return None,
        }
        .to_string(),
    )
}

pub async fn completions(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let CompletionRequest { sampling, fields } = protocol::parse_completion(&body)?;
    state.check_model(sampling.model.as_deref())?;
    if fields.echo {
        return Err(ApiError::bad_request("echo: not supported yet", "echo"));
    }
    if fields.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_request("suffix: not supported yet", "suffix"));
    }
    if fields.best_of.is_some_and(|b| b != sampling.n) {
        return Err(ApiError::bad_request("best_of: not supported yet (other than equal to n)", "best_of"));
    }
    let structured = protocol::openai_structured(&sampling)?;
    let with_logprobs = fields.logprobs.is_some();
    let max_tokens = sampling.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    let params = protocol::openai_params(&sampling, max_tokens, with_logprobs, fields.logprobs.unwrap_or(0))?;
    state.check_max_tokens(max_tokens, "max_tokens")?;
    let prompts = prompts_of(&state, fields.prompt).await?;
    let grammar = state.grammar(structured.as_ref()).await?;
    let n = sampling.n as usize;
    let mut gen = Generation::new(state.clone(), prompts.len() * n, !sampling.stream);
    for ids in &prompts {
        let constraint = grammar.clone().map(Constraint::Grammar);
        gen.add(ids, params.clone(), n, constraint, &completion_field).await?;
    }
    let id = public_id("cmpl");
    let created = unix_now();
    let tracked = Tracked::new(&state, id.clone(), gen);
    if sampling.stream {
        let include_usage = sampling.stream_options.is_some_and(|o| o.include_usage);
        let mut prefix = Vec::new();
        prefix.extend_from_slice(b"{\"id\":");
        json_str(&mut prefix, &id);
        prefix.extend_from_slice(b",\"object\":\"text_completion\",\"created\":");
        prefix.extend_from_slice(created.to_string().as_bytes());
        prefix.extend_from_slice(b",\"model\":");
        json_str(&mut prefix, &state.config.model_name);
        let stream = ChunkStream {
            tracked,
            prefix,
            include_usage,
            with_logprobs,
            chat: false,
            offsets: vec![0; prompts.len() * n],
            done: false,
            parsers: Vec::new(),
            has_calls: Vec::new(),
        };
        return Ok(sse::response(stream, ChunkStream::next));
    }
    let mut tracked = tracked;
    tracked.gen.run_to_end().await?;
    let choices: Vec<Value> = tracked
        .gen
        .samples
        .iter()
        .map(|s| {
            let logprobs = if with_logprobs {
                completion_logprobs(&state, &s.token_ids, &s.logprobs, &s.top_logprobs, 0).0
            } else {
                Value::Null
            };
            json!({"index": s.index, "text": s.text, "logprobs": logprobs, "finish_reason": s.finished.as_ref().map(finish_reason)})
        })
        .collect();
    let usage = tracked.gen.usage();
    Ok(json_response(&json!({"id": id, "object": "text_completion", "created": created,
        "model": state.config.model_name, "choices": choices, "usage": usage})))
}

async fn prompts_of(state: &Arc<AppState>, prompt: Prompt) -> ApiResult<Vec<Vec<u32>>> {
    let empty = || ApiError::bad_request("prompt: the prompt is empty", "prompt");
    match prompt {
        Prompt::Text(t) => {
            if t.is_empty() {
                return Err(empty());
            }
            Ok(vec![state.encode(t, "prompt", true).await?])
        }
        Prompt::Ids(ids) => {
            if ids.is_empty() {
                return Err(ApiError::bad_request("prompt: no prompt given", "prompt"));
            }
            Ok(vec![ids])
        }
        Prompt::IdLists(lists) => {
            if lists.is_empty() {
                return Err(ApiError::bad_request("prompt: no prompt given", "prompt"));
            }
            if lists.iter().any(Vec::is_empty) {
                return Err(empty());
            }
            Ok(lists)
        }
        Prompt::Texts(texts) => {
            if texts.is_empty() {
                return Err(ApiError::bad_request("prompt: no prompt given", "prompt"));
            }
            // every text checked for length before any is tokenized
            for t in &texts {
                if t.is_empty() {
                    return Err(empty());
                }
                state.check_text_length(t, "prompt")?;
            }
            let mut out = Vec::with_capacity(texts.len());
            for t in texts {
                out.push(state.encode(t, "prompt", true).await?);
            }
            Ok(out)
        }
    }
}

fn chat_field(max_tokens_field: &'static str) -> impl Fn(&str) -> Option<String> + Sync {
    move |core: &str| {
        Some(
            match core {
                "input_ids" => "messages",
                "max_new_tokens" => max_tokens_field,
                "min_new_tokens" => "min_tokens",
                _ => return None,
            }
            .to_string(),
        )
    }
}

/// `POST /v1/chat/completions`: parse → prepare → submit → respond.
pub async fn chat(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let req = protocol::parse_chat(&body)?;
    let job = prepare(&state, req).await?;
    let gen = submit(&state, &job).await?;
    respond(state, job, gen).await
}

/// A chat completion ready to submit: the request core's prepared chat, its grammar, the
/// core's parameters, and how to answer.
struct ChatJob {
    prepared: PreparedChat,
    grammar: Option<Arc<Grammar>>,
    params: RequestParams,
    n: usize,
    /// The body field that set the budget (`max_completion_tokens` or `max_tokens`).
    max_tokens_field: &'static str,
    stream: bool,
    include_usage: bool,
    logprobs: bool,
}

/// The request's checks, its plan, its grammar and its parameters.
async fn prepare(state: &Arc<AppState>, req: ChatRequest) -> ApiResult<ChatJob> {
    let ChatRequest { sampling, fields } = req;
    state.check_model(sampling.model.as_deref())?;
    if fields.top_logprobs.is_some_and(|t| t > 0) && !fields.logprobs {
        return Err(ApiError::bad_request("top_logprobs: requires logprobs to be true", "top_logprobs"));
    }
    let (max_tokens_field, max_tokens) = match (fields.max_completion_tokens, sampling.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", Some(m)),
        (None, m) => ("max_tokens", m),
    };
    if let Some(m) = max_tokens {
        state.check_max_tokens(m, max_tokens_field)?;
    }
    let (logprobs, top_logprobs) = (fields.logprobs, fields.top_logprobs.unwrap_or(0));
    let prepared = plan(state, fields, &sampling).await?;
    let grammar = match prepared.constraint() {
        Some(c) => Some(state.planned_grammar(c).await?),
        None => None,
    };
    let prompt_len = prepared.ids.len() as u64;
    let context = state.config.context_length as u64;
    let max_tokens = match max_tokens {
        Some(m) => m,
        // as OpenAI: up to the end of the context
        None if prompt_len >= context => {
            return Err(ApiError::bad_request(
                format!("messages: the prompt has {prompt_len} tokens; the context holds {context}"),
                "messages",
            ))
        }
        None => context - prompt_len,
    };
    let mut params = protocol::openai_params(&sampling, max_tokens, logprobs, top_logprobs)?;
    if prepared.skip_special_tokens() == Some(false) {
        params.stops.skip_special_tokens = false;
    }
    Ok(ChatJob {
        prepared,
        grammar,
        params,
        n: sampling.n as usize,
        max_tokens_field,
        stream: sampling.stream,
        include_usage: sampling.stream_options.is_some_and(|o| o.include_usage),
        logprobs,
    })
}

/// The request core's prepared chat: the prompt rendered, what tools and reasoning change
/// about it, its ids.
async fn plan(
    state: &Arc<AppState>,
    fields: ChatFields,
    sampling: &OpenAISampling,
) -> ApiResult<PreparedChat> {
    let input = ChatInput {
        messages: fields.messages,
        tools: fields.tools,
        tool_choice: fields.tool_choice,
        parallel_tool_calls: fields.parallel_tool_calls != Some(false),
        chat_template_kwargs: fields.chat_template_kwargs.unwrap_or_default(),
        structured: protocol::openai_structured(sampling)?,
    };
    state.prepare_chat(input).await
}

async fn submit(state: &Arc<AppState>, job: &ChatJob) -> ApiResult<Generation> {
    let mut gen = Generation::new(state.clone(), job.n, !job.stream);
    let constraint = job.grammar.clone().map(Constraint::Grammar);
    gen.add(&job.prepared.ids, job.params.clone(), job.n, constraint, &chat_field(job.max_tokens_field))
        .await?;
    Ok(gen)
}

async fn respond(state: Arc<AppState>, job: ChatJob, gen: Generation) -> ApiResult<Response> {
    let id = public_id("chatcmpl");
    let created = unix_now();
    let mut tracked = Tracked::new(&state, id.clone(), gen);
    if job.stream {
        return Ok(stream(&state, job, tracked, &id, created));
    }
    tracked.gen.run_to_end().await?;
    let choices: Vec<Value> = tracked.gen.samples.iter().map(|s| choice(&state, &job, s)).collect();
    let usage = tracked.gen.usage();
    Ok(json_response(&json!({"id": id, "created": created, "model": state.config.model_name,
        "object": "chat.completion", "choices": choices, "usage": usage})))
}

/// One choice of a whole answer: the assistant message as the output parser reads it.
fn choice(state: &AppState, job: &ChatJob, s: &Sample) -> Value {
    let logprobs = if job.logprobs {
        chat_logprobs(state, &s.token_ids, &s.logprobs, &s.top_logprobs)
    } else {
        Value::Null
    };
    let (message, finish) =
        tools_output::message(&job.prepared.plan, &s.text, s.finished.as_ref().map(finish_reason));
    json!({"index": s.index, "message": message, "logprobs": logprobs, "finish_reason": finish})
}

/// The answer as OpenAI's chunks: the assistant role first, then the parsed deltas.
fn stream(state: &AppState, job: ChatJob, tracked: Tracked, id: &str, created: u64) -> Response {
    let mut prefix = Vec::new();
    prefix.extend_from_slice(b"{\"id\":");
    json_str(&mut prefix, id);
    prefix.extend_from_slice(b",\"created\":");
    prefix.extend_from_slice(created.to_string().as_bytes());
    prefix.extend_from_slice(b",\"model\":");
    json_str(&mut prefix, &state.config.model_name);
    prefix.extend_from_slice(b",\"object\":\"chat.completion.chunk\"");
    let n = job.n;
    let stream = ChunkStream {
        tracked,
        prefix,
        include_usage: job.include_usage,
        with_logprobs: job.logprobs,
        chat: true,
        offsets: vec![0; n],
        done: false,
        parsers: (0..n).filter_map(|_| job.prepared.output_parser()).collect(),
        has_calls: vec![false; n],
    };
    let mut first = Vec::new();
    for index in 0..n {
        stream.chunk(&mut first, index, r#"{"role":"assistant","content":""}"#.as_bytes(), None, None);
    }
    sse::response((Some(Bytes::from(first)), stream), |(first, s)| async move {
        match first {
            Some(b) => Some((b, (None, s))),
            None => ChunkStream::next(s).await.map(|(b, s)| (b, (None, s))),
        }
    })
}

/// The state of a streamed completion or chat completion.
struct ChunkStream {
    tracked: Tracked,
    /// `{"id":...,"object":...,"created":...,"model":...` of every chunk.
    prefix: Vec<u8>,
    include_usage: bool,
    with_logprobs: bool,
    chat: bool,
    /// Per choice: where its next token's text starts (completion logprobs' text_offset).
    offsets: Vec<usize>,
    done: bool,
    /// Per choice of a chat whose output is parsed (tool calls, reasoning); else empty.
    parsers: Vec<ChatOutputParser>,
    /// Per choice: whether it has sent a tool call.
    has_calls: Vec<bool>,
}

impl ChunkStream {
    fn chunk(
        &self,
        out: &mut Vec<u8>,
        index: usize,
        delta: &[u8],
        logprobs: Option<&Value>,
        finish: Option<&str>,
    ) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(b",\"choices\":[{\"index\":");
        out.extend_from_slice(index.to_string().as_bytes());
        out.extend_from_slice(if self.chat { b",\"delta\":" } else { b",\"text\":" });
        out.extend_from_slice(delta);
        out.extend_from_slice(b",\"logprobs\":");
        match logprobs {
            Some(v) => serde_json::to_writer(&mut *out, v).expect("JSON"),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"finish_reason\":");
        match finish {
            Some(f) => json_str(out, f),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b"}]");
        if self.include_usage {
            out.extend_from_slice(b",\"usage\":null");
        }
        out.extend_from_slice(b"}\n\n");
    }

    async fn next(mut self) -> Option<(Bytes, Self)> {
        if self.done {
            return None;
        }
        let mut out = Vec::new();
        match self.tracked.gen.next().await {
            Err(e) => {
                sse::event(&mut out, &e.envelope());
                out.extend_from_slice(DONE);
                self.done = true;
            }
            Ok(batch) if batch.is_empty() => {
                if self.include_usage {
                    let mut usage = Vec::new();
                    usage.extend_from_slice(b"data: ");
                    usage.extend_from_slice(&self.prefix);
                    usage.extend_from_slice(b",\"choices\":[],\"usage\":");
                    serde_json::to_writer(&mut usage, &self.tracked.gen.usage()).expect("JSON");
                    usage.extend_from_slice(b"}\n\n");
                    out.extend_from_slice(&usage);
                }
                out.extend_from_slice(DONE);
                self.done = true;
            }
            Ok(batch) => {
                let state = self.tracked.state.clone();
                for (index, u) in &batch {
                    if !self.parsers.is_empty() {
                        self.parsed_chunks(&mut out, &state, *index, u);
                        continue;
                    }
                    if !u.token_ids.is_empty() || !u.text.is_empty() {
                        let mut delta = Vec::with_capacity(u.text.len() + 16);
                        if self.chat {
                            delta.extend_from_slice(b"{\"content\":");
                            json_str(&mut delta, &u.text);
                            delta.push(b'}');
                        } else {
                            json_str(&mut delta, &u.text);
                        }
                        let logprobs = self.with_logprobs.then(|| {
                            if self.chat {
                                chat_logprobs(&state, &u.token_ids, &u.logprobs, &u.top_logprobs)
                            } else {
                                let (v, end) = completion_logprobs(
                                    &state,
                                    &u.token_ids,
                                    &u.logprobs,
                                    &u.top_logprobs,
                                    self.offsets[*index],
                                );
                                self.offsets[*index] = end;
                                v
                            }
                        });
                        self.chunk(&mut out, *index, &delta, logprobs.as_ref(), None);
                    }
                    if let Some(f) = &u.finished {
                        if finish_reason(f) == "error" {
                            sse::event(&mut out, &error_of(f).envelope());
                        }
                        let empty: &[u8] = if self.chat { b"{}" } else { b"\"\"" };
                        self.chunk(&mut out, *index, empty, None, Some(finish_reason(f)));
                    }
                }
            }
        }
        Some((Bytes::from(out), self))
    }
}

impl ChunkStream {
    /// A chat choice's update read by its output parser: OpenAI's deltas of the pieces
    /// (reasoning, content, calls), the first with the update's logprobs; the finish with
    /// `tool_calls` when the choice called.
    fn parsed_chunks(&mut self, out: &mut Vec<u8>, state: &AppState, index: usize, u: &SampleUpdate) {
        let mut deltas = Vec::new();
        let mut logprobs = None;
        if !u.token_ids.is_empty() || !u.text.is_empty() {
            logprobs =
                self.with_logprobs.then(|| chat_logprobs(state, &u.token_ids, &u.logprobs, &u.top_logprobs));
            let parser = &mut self.parsers[index];
            let mut pieces = parser.feed(&u.text);
            if u.finished.is_some() {
                pieces.extend(parser.finish());
            }
            deltas = tools_output::deltas(&pieces);
            if deltas.is_empty() && logprobs.is_some() {
                deltas.push(json!({}));
            }
        } else if u.finished.is_some() {
            deltas = tools_output::deltas(&self.parsers[index].finish());
        }
        self.has_calls[index] |= deltas.iter().any(|d| d.get("tool_calls").is_some());
        for (k, d) in deltas.iter().enumerate() {
            let bytes = serde_json::to_vec(d).expect("JSON");
            self.chunk(out, index, &bytes, if k == 0 { logprobs.as_ref() } else { None }, None);
        }
        if let Some(f) = &u.finished {
            if finish_reason(f) == "error" {
                sse::event(out, &error_of(f).envelope());
            }
            let reason = tools_output::final_reason(finish_reason(f), self.has_calls[index]);
            self.chunk(out, index, b"{}", None, Some(reason));
        }
    }
}

/// The legacy completions shape: parallel lists, `top_logprobs` as {token: logprob};
/// returns it and the text offset after the last token.
fn completion_logprobs(
    state: &AppState,
    ids: &[u32],
    logprobs: &[f32],
    top: &[Vec<(u32, f32)>],
    mut offset: usize,
) -> (Value, usize) {
    let tokens: Vec<String> = ids.iter().map(|&t| state.token_text(t)).collect();
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in &tokens {
        offsets.push(offset);
        offset += t.chars().count();
    }
    let tops: Vec<Value> = top
        .iter()
        .map(|alts| {
            let mut m = serde_json::Map::new();
            for &(t, lp) in alts {
                m.insert(state.token_text(t), Value::from(lp as f64));
            }
            Value::Object(m)
        })
        .collect();
    let lps: Vec<Value> = logprobs.iter().map(|&x| Value::from(x as f64)).collect();
    (json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}), offset)
}

/// The chat shape: one entry per token with its bytes and its alternatives.
fn chat_logprobs(state: &AppState, ids: &[u32], logprobs: &[f32], top: &[Vec<(u32, f32)>]) -> Value {
    let entry = |t: u32, lp: f32| {
        let raw = state.token_bytes(t);
        json!({"token": String::from_utf8_lossy(raw), "logprob": lp as f64, "bytes": raw})
    };
    let content: Vec<Value> = ids
        .iter()
        .zip(logprobs)
        .zip(top)
        .map(|((&t, &lp), alts)| {
            let mut e = entry(t, lp);
            e["top_logprobs"] = Value::Array(alts.iter().map(|&(a, y)| entry(a, y)).collect());
            e
        })
        .collect();
    json!({ "content": content })
}
