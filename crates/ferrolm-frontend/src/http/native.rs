//! The native API, after SGLang's: `/generate` (text or ids in; text, ids and meta_info
//! out; SSE with the cumulative text when streamed) and `/abort_request`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::Response;
use ferrolm_core::engine::Constraint;
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::errors::{ApiError, ApiResult};
use crate::generation::{error_of, finish_reason, matched_stop, Generation, Sample};
use crate::http::sse::{self, DONE};
use crate::http::{json_response, Tracked};
use crate::ingress::Call;
use crate::protocol;
use crate::state::AppState;
use crate::tools::output as tools_output;
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
    let plan = plan.map(Arc::new);
    let mut gen = Generation::new(state.clone(), n, true);
    gen.add(&ids, params, n, grammar.map(Constraint::Grammar), &native_field(from_text)).await?;
    let rid = g.req.rid.unwrap_or_else(|| format!("gen-{}", gen.rids[0]));
    let with_logprobs = g.req.return_logprob;
    let mut tracked = Tracked::new(&state, rid.clone(), gen);
    if g.req.stream {
        return Ok(sse::response((tracked, false), move |(mut t, done)| {
            let rid = rid.clone();
            let plan = plan.clone();
            async move {
                if done {
                    return None;
                }
                let mut out = Vec::new();
                match t.gen.next().await {
                    Err(e) => {
                        sse::event(&mut out, &e.envelope());
                        out.extend_from_slice(DONE);
                        return Some((Bytes::from(out), (t, true)));
                    }
                    Ok(batch) if batch.is_empty() => {
                        out.extend_from_slice(DONE);
                        return Some((Bytes::from(out), (t, true)));
                    }
                    Ok(batch) => {
                        for (i, u) in &batch {
                            if let Some(f) = &u.finished {
                                if finish_reason(f) == "error" {
                                    sse::event(&mut out, &error_of(f).envelope());
                                }
                            }
                            let r = result(&t.gen.samples[*i], &rid, with_logprobs, plan.as_deref());
                            sse::event(&mut out, &r);
                        }
                    }
                }
                Some((Bytes::from(out), (t, false)))
            }
        }));
    }
    tracked.gen.run_to_end().await?;
    let out: Vec<Value> =
        tracked.gen.samples.iter().map(|s| result(s, &rid, with_logprobs, plan.as_deref())).collect();
    Ok(json_response(&if out.len() == 1 { out.into_iter().next().expect("one") } else { Value::Array(out) }))
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

fn result(s: &Sample, rid: &str, with_logprobs: bool, plan: Option<&ChatPlan>) -> Value {
    let mut finish = s.finished.as_ref().map(|f| {
        let mut v = json!({"type": finish_reason(f), "matched": matched_stop(f)});
        if let ferrolm_core::engine::FinishReason::Error { message, .. } = &f.reason {
            v["message"] = Value::from(message.as_str());
        }
        v
    });
    let (prompt_tokens, cached_tokens) =
        s.finished.as_ref().map_or((0, 0), |f| (f.prompt_tokens, f.cached_tokens));
    let mut meta = json!({"id": rid, "finish_reason": finish.clone(), "prompt_tokens": prompt_tokens,
                          "completion_tokens": s.token_ids.len(), "cached_tokens": cached_tokens});
    if with_logprobs {
        meta["output_token_logprobs"] =
            s.logprobs.iter().zip(&s.token_ids).map(|(&x, &t)| json!([x as f64, t])).collect();
        meta["output_top_logprobs"] = s
            .top_logprobs
            .iter()
            .map(|alts| alts.iter().map(|&(a, y)| json!([y as f64, a])).collect::<Value>())
            .collect();
    }
    let mut parsed = serde_json::Map::new();
    if let Some(plan) = plan {
        let built = tools_output::parse_whole(plan, &s.text);
        let or_null = |s: &str| if s.is_empty() { Value::Null } else { Value::from(s) };
        parsed.insert("content".into(), or_null(&built.content));
        if plan.reasoning.is_some() {
            parsed.insert("reasoning_content".into(), or_null(&built.reasoning));
        }
        if plan.tool_format.is_some() {
            parsed.insert("tool_calls".into(), built.calls.iter().map(|c| c.as_openai()).collect());
        }
        if let (false, Some(f), Some(fin)) = (built.calls.is_empty(), &s.finished, finish.as_mut()) {
            fin["type"] = Value::from(tools_output::final_reason(finish_reason(f), true));
        }
    }
    let meta = {
        let mut meta = meta;
        meta["finish_reason"] = finish.unwrap_or(Value::Null);
        meta
    };
    let mut out = json!({"text": s.text, "output_ids": s.token_ids, "meta_info": meta});
    if let Value::Object(o) = &mut out {
        o.extend(parsed);
    }
    out
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
