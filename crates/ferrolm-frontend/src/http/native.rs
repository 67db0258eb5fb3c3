//! The native API, after SGLang's: `/generate` (text or ids in; text, ids and meta_info
//! out; SSE with the cumulative text when streamed) and `/abort_request`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::Response;
use ferrolm_core::engine::Constraint;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::errors::{ApiError, ApiResult};
use crate::generation::Generation;
use crate::http::{json_response, sse, Tracked};
use crate::ingress::Call;
use crate::protocol;
use crate::response::{generate_result, Chunks};
use crate::state::AppState;
use crate::tools::plan::PlanInput;
use crate::tools::{self, ChatPlan};

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
    if g.req.text.is_some() == g.req.input_ids.is_some() {
        return Err(ApiError::bad_request("text: give exactly one of text and input_ids", "text"));
    }
    if g.req.text.as_deref() == Some("") || g.req.input_ids.as_ref().is_some_and(Vec::is_empty) {
        let field = if g.req.text.is_some() { "text" } else { "input_ids" };
        return Err(ApiError::bad_request(format!("{field}: the prompt is empty"), field));
    }
    let structured = protocol::native_structured(&g.sampling)?;
    let params = protocol::native_params(&g)?;
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
    let plan = plan_of(&state, &g, structured.clone()).await?;
    let mut params = params;
    let mut ids = match (g.req.text, g.req.input_ids) {
        (Some(text), _) => state.encode(text, "text", true).await?,
        (None, Some(ids)) => ids,
        (None, None) => unreachable!("checked above"),
    };
    let grammar = match &plan {
        Some(plan) => {
            if plan.skip_special_tokens == Some(false) {
                params.stops.skip_special_tokens = false;
            }
            if let (true, Some(format)) = (plan.primed, plan.tool_format) {
                if !format.opening().is_empty() {
                    // the forced call's opening goes after the caller's prompt
                    ids.extend(state.encode(format.opening().to_string(), "text", false).await?);
                }
            }
            match &plan.constraint {
                Some(c) => Some(state.planned_grammar(c).await?),
                None => None,
            }
        }
        None => state.grammar(structured.as_ref()).await?,
    };
    let mut gen = Generation::new(state.clone(), n, true);
    gen.add(&ids, params, n, grammar.map(Constraint::Grammar), &native_field(from_text)).await?;
    let rid = g.req.rid.unwrap_or_else(|| format!("gen-{}", gen.rids[0]));
    let with_logprobs = g.req.return_logprob;
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

/// What tools and reasoning change, for a request that asks for either (the prompt is the
/// caller's: the tools are not written into it).
async fn plan_of(
    state: &Arc<AppState>,
    g: &protocol::Generate,
    structured: Option<crate::structured::Structured>,
) -> ApiResult<Option<ChatPlan>> {
    let req = &g.req;
    let absent = |v: &Option<Value>| v.as_ref().is_none_or(Value::is_null);
    if absent(&req.tools) && absent(&req.tool_choice) && !req.separate_reasoning {
        return Ok(None);
    }
    let tools = tools::parse_tools(req.tools.as_ref())?;
    let choice = tools::parse_tool_choice(req.tool_choice.as_ref(), &tools)?;
    if req.separate_reasoning && state.tools.reasoning.is_none() {
        return Err(ApiError::bad_request(
            "separate_reasoning: the server runs without --reasoning-parser",
            "separate_reasoning",
        ));
    }
    let prompt = match (&req.text, &req.input_ids) {
        (Some(text), _) => text.clone(),
        (None, Some(ids)) => {
            state.tokenizer.decode(ids).map_err(|m| ApiError::bad_request(m, "input_ids"))?
        }
        (None, None) => String::new(),
    };
    let plan = tools::plan_chat(
        prompt,
        PlanInput {
            tools: &tools,
            choice: &choice,
            parallel: req.parallel_tool_calls != Some(false),
            tool_format: state.tools.tool_format,
            reasoning: state.tools.reasoning.as_ref().filter(|_| req.separate_reasoning),
            constrain: state.tools.constrain,
            structured,
            special_tokens: &state.tools.special_tokens,
        },
    )?;
    Ok(Some(plan))
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
