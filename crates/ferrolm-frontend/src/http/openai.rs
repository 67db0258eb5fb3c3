//! `POST /v1/completions` and `POST /v1/chat/completions`: parse → prepare → submit →
//! respond, the answer (OpenAI's shapes, streamed over SSE or whole) written by the
//! request core's `response` module.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::Response;
use ferrolm_constraint::Grammar;
use ferrolm_core::engine::{Constraint, RequestParams};

use crate::chat_request::{echoed, ChatInput, ChatOptions, PreparedChat};
use crate::errors::{ApiError, ApiResult};
use crate::generation::Generation;
use crate::http::{json_response, sse, Tracked};
use crate::protocol::{self, ChatFields, ChatRequest, CompletionRequest, OpenAISampling, Prompt};
use crate::response::{ChatReply, Chunks, Head};
use crate::state::AppState;

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
    if fields.echo && (sampling.stream || fields.logprobs.is_some()) {
        let with = if sampling.stream { "stream" } else { "logprobs" };
        return Err(ApiError::bad_request(
            format!(
                "echo: true is not supported with {with} (the prompt's log-probabilities are not returned)"
            ),
            "echo",
        ));
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
    let mut params =
        protocol::openai_params(&sampling, max_tokens, with_logprobs, fields.logprobs.unwrap_or(0))?;
    state.check_max_tokens(max_tokens, "max_tokens")?;
    params.lora = state.lora_for(sampling.model.as_deref(), sampling.lora_path.as_deref()).await?;
    // echo writes a text prompt as sent, a prompt of ids as the tokenizer decodes it
    let echoed: Vec<Option<String>> = match (&fields.prompt, fields.echo) {
        (_, false) => Vec::new(),
        (Prompt::Text(t), true) => vec![Some(t.clone())],
        (Prompt::Texts(ts), true) => ts.iter().cloned().map(Some).collect(),
        (Prompt::Ids(_), true) => vec![None],
        (Prompt::IdLists(lists), true) => vec![None; lists.len()],
    };
    let prompts = prompts_of(&state, fields.prompt).await?;
    let grammar = state.grammar(structured.as_ref()).await?;
    let n = sampling.n as usize;
    let mut gen = Generation::new(state.clone(), prompts.len() * n, !sampling.stream);
    for ids in &prompts {
        let constraint = grammar.clone().map(Constraint::Grammar);
        gen.add(ids, params.clone(), n, constraint, &completion_field).await?;
    }
    let head = Head::new("cmpl", served_name(&state, &params));
    let mut tracked = Tracked::new(&state, head.id.clone(), gen);
    if sampling.stream {
        let include_usage = sampling.stream_options.is_some_and(|o| o.include_usage);
        let chunks =
            Chunks::completion(head, prompts.len() * n, include_usage, with_logprobs, state.vocab.clone());
        return Ok(sse::stream(tracked, chunks));
    }
    tracked.gen.run_to_end().await?;
    let completion = head.completion(&tracked.gen.samples, with_logprobs, &state.vocab);
    if !fields.echo {
        return Ok(json_response(&completion));
    }
    // echo: each choice's text after its prompt
    let mut value = serde_json::to_value(&completion).expect("a response serializes");
    if let Some(choices) = value.get_mut("choices").and_then(|c| c.as_array_mut()) {
        for choice in choices {
            let index = choice["index"].as_u64().unwrap_or(0) as usize;
            let prompt = match &echoed[index / n] {
                Some(text) => text.clone(),
                None => state.tokenizer.decode(&prompts[index / n]).map_err(|m| {
                    ApiError::new(500, format!("the prompt could not be decoded for echo: {m}"))
                })?,
            };
            let text = choice["text"].as_str().unwrap_or("");
            choice["text"] = serde_json::Value::String(prompt + text);
        }
    }
    Ok(json_response(&value))
}

/// The `model` a response names: the adapter the request ran with, else the base model.
pub(crate) fn served_name<'a>(state: &'a AppState, params: &'a RequestParams) -> &'a str {
    params.lora.as_ref().map_or(&state.config.model_name, |l| &l.name)
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

/// vLLM's `POST /v1/chat/completions/render`: the token ids the chat's prompt comes to
/// here (what vllm-router asks a replica for, to route by its tokens), nothing run.
pub async fn render_chat(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let req = protocol::parse_chat(&body)?;
    let job = prepare(&state, req).await?;
    Ok(json_response(&serde_json::json!({
        "model": state.config.model_name,
        "prompt": job.prepared.prompt(),
        "token_ids": job.prepared.ids,
    })))
}

/// vLLM's `POST /v1/completions/render`: each prompt's token ids.
pub async fn render_completion(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let CompletionRequest { sampling, fields } = protocol::parse_completion(&body)?;
    state.check_model(sampling.model.as_deref())?;
    let prompts = prompts_of(&state, fields.prompt).await?;
    let rendered: Vec<serde_json::Value> = prompts
        .into_iter()
        .map(|ids| serde_json::json!({"model": state.config.model_name, "token_ids": ids}))
        .collect();
    Ok(json_response(&rendered))
}

/// A chat completion ready to submit: the request core's prepared chat, its grammar, the
/// core's parameters, and how to answer.
pub(crate) struct ChatJob {
    pub(crate) prepared: PreparedChat,
    grammar: Option<Arc<Grammar>>,
    pub(crate) params: RequestParams,
    n: usize,
    /// The body field that set the budget (`max_completion_tokens` or `max_tokens`).
    max_tokens_field: &'static str,
    pub(crate) stream: bool,
    include_usage: bool,
    logprobs: bool,
    /// What the request asks of the answer: echo, reasoning returned or streamed.
    reply: ChatReply,
}

/// The request's checks, its plan, its grammar and its parameters.
pub(crate) async fn prepare(state: &Arc<AppState>, req: ChatRequest) -> ApiResult<ChatJob> {
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
    let reply = ChatReply {
        echo: fields.echo.unwrap_or(false).then(|| echoed(&fields.messages)).flatten(),
        include_reasoning: fields.include_reasoning != Some(false),
        stream_reasoning: fields.stream_reasoning != Some(false),
    };
    let effort = fields.reasoning_effort.clone();
    if let Some(e) = &effort {
        protocol::effort_budget(e, 0, "reasoning_effort")?; // known, before the work of planning
    }
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
    params.lora = state.lora_for(sampling.model.as_deref(), sampling.lora_path.as_deref()).await?;
    if prepared.skip_special_tokens() == Some(false) {
        params.stops.skip_special_tokens = false;
    }
    // the budget asked for and the effort's share of max_tokens, the smaller
    let by_effort = match &effort {
        Some(e) => protocol::effort_budget(e, max_tokens, "reasoning_effort")?,
        None => None,
    };
    params.thinking = prepared.thinking.clone().and_then(|mut t| {
        let budget = by_effort.map_or(t.budget, |b| t.budget.min(usize::try_from(b).unwrap_or(usize::MAX)));
        t.budget = budget;
        (budget != usize::MAX).then_some(t)
    });
    Ok(ChatJob {
        prepared,
        grammar,
        params,
        n: sampling.n as usize,
        max_tokens_field,
        stream: sampling.stream,
        include_usage: sampling.stream_options.is_some_and(|o| o.include_usage),
        logprobs,
        reply,
    })
}

/// The request core's prepared chat: the prompt rendered, what tools and reasoning change
/// about it, its ids.
pub(crate) async fn plan(
    state: &Arc<AppState>,
    fields: ChatFields,
    sampling: &OpenAISampling,
) -> ApiResult<PreparedChat> {
    let options = ChatOptions {
        add_generation_prompt: fields.add_generation_prompt.unwrap_or(!fields.continue_final_message),
        continue_final_message: fields.continue_final_message,
        separate_reasoning: fields.separate_reasoning != Some(false),
    };
    let input = ChatInput {
        messages: fields.messages,
        tools: fields.tools,
        tool_choice: fields.tool_choice,
        parallel_tool_calls: fields.parallel_tool_calls != Some(false),
        chat_template_kwargs: fields.chat_template_kwargs.unwrap_or_default(),
        structured: protocol::openai_structured(sampling)?,
        // the markers are wanted where an effort may set the budget (capped in `prepare`)
        thinking_budget: fields
            .thinking_token_budget
            .or(fields.reasoning_effort.as_ref().map(|_| usize::MAX as u64)),
    };
    state.prepare_chat(input, options).await
}

pub(crate) async fn submit(state: &Arc<AppState>, job: &ChatJob) -> ApiResult<Generation> {
    let mut gen = Generation::new(state.clone(), job.n, !job.stream);
    let constraint = job.grammar.clone().map(Constraint::Grammar);
    gen.add(&job.prepared.ids, job.params.clone(), job.n, constraint, &chat_field(job.max_tokens_field))
        .await?;
    Ok(gen)
}

async fn respond(state: Arc<AppState>, job: ChatJob, gen: Generation) -> ApiResult<Response> {
    let head = Head::new("chatcmpl", served_name(&state, &job.params));
    let mut tracked = Tracked::new(&state, head.id.clone(), gen);
    let plan = &job.prepared.plan;
    if job.stream {
        let chunks =
            Chunks::chat(head, plan, job.reply, job.n, job.include_usage, job.logprobs, state.vocab.clone());
        return Ok(sse::stream(tracked, chunks));
    }
    tracked.gen.run_to_end().await?;
    let samples = &tracked.gen.samples;
    Ok(json_response(&head.chat_completion(samples, plan, &job.reply, job.logprobs, &state.vocab)))
}
