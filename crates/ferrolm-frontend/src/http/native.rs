//! The native API, after SGLang's: `/generate` (text or ids in; text, ids and meta_info
//! out; SSE with the cumulative text when streamed) and `/abort_request`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::Response;
use ferrolm_core::engine::Constraint;
use serde_json::json;
use tokio::sync::oneshot;

use crate::chat_request::{GenerateInput, GeneratePrompt};
use crate::errors::{ApiError, ApiResult};
use crate::generation::Generation;
use crate::http::{json_response, sse, Tracked};
use crate::ingress::Call;
use crate::protocol;
use crate::response::{generate_result, Chunks};
use crate::state::AppState;

fn native_field(from_text: bool) -> impl Fn(&str) -> Option<String> + Sync {
    move |core: &str| {
        Some(match core {
            "input_ids" => if from_text { "text" } else { "input_ids" }.to_string(),
            "logprobs" => "return_logprob".to_string(),
            "top_logprobs" => "top_logprobs_num".to_string(),
            "rid" | "priority" | "namespace" | "grammar" => return None,
            other => format!("sampling_params.{other}"),
        })
    }
}

pub async fn generate(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let g = protocol::parse_generate(&body)?;
    state.check_model(g.req.model.as_deref())?;
    if g.req.text.is_some() == g.req.input_ids.is_some() {
        return Err(ApiError::bad_request("text: give exactly one of text and input_ids", "text"));
    }
    if g.req.text.as_deref() == Some("") || g.req.input_ids.as_ref().is_some_and(Vec::is_empty) {
        let field = if g.req.text.is_some() { "text" } else { "input_ids" };
        return Err(ApiError::bad_request(format!("{field}: the prompt is empty"), field));
    }
    let structured = protocol::native_structured(&g.sampling)?;
    let mut params = protocol::native_params(&g)?;
    params.lora = state.lora_for(g.req.model.as_deref(), g.req.lora_path.as_deref()).await?;
    let n = g.sampling.n as usize;
    if g.req.stream && n > 1 {
        return Err(ApiError::bad_request("stream: streaming is for n = 1", "stream"));
    }
    if let Some(rid) = &g.req.rid {
        if state.named.lock().unwrap().contains_key(rid) {
            return Err(ApiError::bad_request(format!("rid: {rid:?} is already in flight"), "rid"));
        }
    }
    state.check_max_tokens(g.sampling.max_new_tokens, "sampling_params.max_new_tokens")?;
    let from_text = g.req.text.is_some();
    let prompt = match (g.req.text, g.req.input_ids) {
        (Some(text), _) => GeneratePrompt::Text(text),
        (None, Some(ids)) => GeneratePrompt::Ids(ids),
        (None, None) => unreachable!("checked above"),
    };
    let input = GenerateInput {
        prompt,
        tools: g.req.tools,
        tool_choice: g.req.tool_choice,
        parallel_tool_calls: g.req.parallel_tool_calls != Some(false),
        separate_reasoning: g.req.separate_reasoning,
        structured,
        thinking_budget: g.sampling.thinking_token_budget,
    };
    let parses = input.parses();
    let prepared = state.prepare_generate(input).await?;
    if prepared.skip_special_tokens() == Some(false) {
        params.stops.skip_special_tokens = false;
    }
    params.thinking = prepared.thinking.clone();
    let grammar = match prepared.constraint() {
        Some(c) => Some(state.planned_grammar(c).await?),
        None => None,
    };
    let mut gen = Generation::new(state.clone(), n, true);
    gen.add(&prepared.ids, params, n, grammar.map(Constraint::Grammar), &native_field(from_text)).await?;
    let rid = g.req.rid.unwrap_or_else(|| format!("gen-{}", gen.rids[0]));
    let with_logprobs = g.req.return_logprob;
    let plan = parses.then_some(prepared.plan);
    let mut tracked = Tracked::new(&state, rid.clone(), gen);
    if g.req.stream {
        return Ok(sse::stream(tracked, Chunks::generate(rid, plan, with_logprobs, state.vocab.clone())));
    }
    tracked.gen.run_to_end().await?;
    let results: Vec<_> =
        tracked.gen.samples.iter().map(|s| generate_result(s, &rid, with_logprobs, plan.as_ref())).collect();
    Ok(match results.as_slice() {
        [one] => json_response(one),
        all => json_response(&all),
    })
}

/// Aborts one request by its id (a /generate rid or an OpenAI response id), or every
/// request of the engine.
pub async fn abort_request(state: Arc<AppState>, body: Bytes) -> ApiResult<Response> {
    let req = protocol::parse_abort(&body)?;
    if req.abort_all {
        let (tx, rx) = oneshot::channel();
        state.ingress.call(Call::AbortAll(tx));
        let count = rx.await.map_err(|_| {
            ApiError::new(503, "the engine is unavailable: it stopped").with_code("engine_unavailable")
        })?;
        return Ok(json_response(&json!({ "aborted": count })));
    }
    let Some(rid) = req.rid else {
        return Err(ApiError::bad_request("rid: give a rid, or abort_all: true", "rid"));
    };
    let rids: Vec<u64> = {
        let named = state.named.lock().unwrap();
        match named.get(&rid) {
            None => return Ok(json_response(&json!({"aborted": 0}))),
            Some(n) => n.stream.unfinished().into_iter().filter_map(|i| n.rids.get(i).copied()).collect(),
        }
    };
    state.ingress.abort(&rids);
    Ok(json_response(&json!({ "aborted": rids.len() })))
}
