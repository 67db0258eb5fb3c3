//! The records of a trace and their JSON form (one object per line; the format is in
//! the module doc of [`crate::trace`]). Reading them back: `parse.rs`.

use serde_json::{json, Map, Value};

use crate::detok::StopReason;
use crate::engine::{EngineConfig, FinishReason, RequestParams, SchedulePolicy};

/// The `format` field of the header line.
pub const FORMAT: &str = "ferrolm-trace";
/// The version this build writes and reads.
pub const VERSION: u64 = 1;

/// When a record happened: `step` counts the `schedule` calls made before it (a submit
/// with step 3 came before the fourth step; a step's own records carry its index), `t` is
/// seconds since recording started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct At {
    pub step: u64,
    pub t: f64,
}

/// One request of a step's plan: its tokens `[start, start + len)` run, and it samples a
/// token after them when `samples`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanEntry {
    pub rid: u64,
    pub start: usize,
    pub len: usize,
    pub samples: bool,
}

/// What one request produced in a step (or an abort or timeout outside one).
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub rid: u64,
    pub tokens: Vec<u32>,
    pub finish: Option<RecordedFinish>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RecordedFinish {
    pub reason: FinishReason,
    /// Prompt tokens it found in the prefix cache at its first admission.
    pub cached_tokens: usize,
}

/// The constraint a request was submitted with. Only an allow list can be replayed: a
/// grammar needs the vocabulary it was compiled for, which a trace does not carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordedConstraint {
    None,
    AllowedTokens(Vec<u32>),
    Grammar,
    Custom,
}

#[derive(Clone, Debug)]
pub enum Record {
    Submit {
        at: At,
        rids: Vec<u64>,
        prompt: Vec<u32>,
        params: Box<RequestParams>, // boxed: the other records are small
        constraint: RecordedConstraint,
    },
    Abort {
        at: At,
        rid: u64,
    },
    Flush {
        at: At,
    },
    Schedule {
        at: At,
        plan: Vec<PlanEntry>,
    },
    /// The outputs of `commit` or `commit_tokens`.
    Commit {
        at: At,
        out: Vec<Output>,
    },
    FailStep {
        at: At,
        message: String,
        out: Vec<Output>,
    },
    /// The outputs of `take_outputs` (aborts and timeouts outside a step), when any.
    Outputs {
        at: At,
        out: Vec<Output>,
    },
    /// The bytes of output tokens, written before the first record that holds them, so a
    /// replay detokenizes as the engine did (stop strings match at the same token).
    Tokens {
        tokens: Vec<(u32, Vec<u8>)>,
        special: Vec<u32>,
    },
}

pub fn header(config: &EngineConfig) -> Value {
    json!({
        "kind": "header",
        "format": FORMAT,
        "version": VERSION,
        "config": {
            "kv_capacity": config.kv_capacity,
            "max_running_requests": config.max_running_requests,
            "max_prefill_tokens": config.max_prefill_tokens,
            "schedule_policy": schedule_policy_name(config.schedule_policy),
            "enable_prefix_cache": config.enable_prefix_cache,
            "eviction_policy": config.eviction_policy.to_string(),
            "new_token_ratio": config.new_token_ratio,
            "fast_lane_tokens": config.fast_lane_tokens,
            "max_context": config.max_context,
            "vocab_size": config.vocab_size,
            "eos_token_ids": config.eos_token_ids,
            "seed": config.seed,
            "speculative": config.speculative,
            "speculative_max_draft": config.speculative_max_draft,
            "speculative_row_cost": config.speculative_row_cost,
        },
    })
}

pub fn schedule_policy_name(p: SchedulePolicy) -> &'static str {
    match p {
        SchedulePolicy::Fcfs => "fcfs",
        SchedulePolicy::Lpm => "lpm",
        SchedulePolicy::Priority => "priority",
    }
}

impl Record {
    pub fn to_json(&self) -> Value {
        let at = |kind: &str, at: &At| {
            let mut m = Map::new();
            m.insert("kind".into(), kind.into());
            m.insert("step".into(), at.step.into());
            // microseconds are plenty, and keep lines short
            m.insert("t".into(), json!((at.t * 1e6).round() / 1e6));
            m
        };
        let m = match self {
            Record::Submit { at: a, rids, prompt, params, constraint } => {
                let mut m = at("submit", a);
                m.insert("rids".into(), json!(rids));
                m.insert("prompt".into(), json!(prompt));
                m.insert("params".into(), params_json(params));
                let c = match constraint {
                    RecordedConstraint::None => Value::Null,
                    RecordedConstraint::AllowedTokens(ids) => json!({ "allowed_token_ids": ids }),
                    RecordedConstraint::Grammar => "grammar".into(),
                    RecordedConstraint::Custom => "custom".into(),
                };
                m.insert("constraint".into(), c);
                m
            }
            Record::Abort { at: a, rid } => {
                let mut m = at("abort", a);
                m.insert("rid".into(), (*rid).into());
                m
            }
            Record::Flush { at: a } => at("flush", a),
            Record::Schedule { at: a, plan } => {
                let mut m = at("schedule", a);
                let plan: Vec<Value> =
                    plan.iter().map(|e| json!([e.rid, e.start, e.len, e.samples])).collect();
                m.insert("plan".into(), plan.into());
                m
            }
            Record::Commit { at: a, out } => {
                let mut m = at("commit", a);
                m.insert("out".into(), outputs_json(out));
                m
            }
            Record::FailStep { at: a, message, out } => {
                let mut m = at("fail_step", a);
                m.insert("message".into(), message.as_str().into());
                m.insert("out".into(), outputs_json(out));
                m
            }
            Record::Outputs { at: a, out } => {
                let mut m = at("outputs", a);
                m.insert("out".into(), outputs_json(out));
                m
            }
            Record::Tokens { tokens, special } => {
                let mut m = Map::new();
                m.insert("kind".into(), "tokens".into());
                m.insert("ids".into(), tokens.iter().map(|(id, _)| *id).collect::<Vec<_>>().into());
                m.insert("bytes".into(), tokens.iter().map(|(_, b)| hex(b)).collect::<Vec<_>>().into());
                m.insert("special".into(), json!(special));
                m
            }
        };
        Value::Object(m)
    }
}

fn params_json(p: &RequestParams) -> Value {
    let s = &p.sampling;
    json!({
        "max_new_tokens": p.max_new_tokens,
        "min_new_tokens": p.min_new_tokens,
        "ignore_eos": p.ignore_eos,
        "priority": p.priority,
        "namespace": p.namespace,
        "queue_timeout_s": p.queue_timeout_s,
        "speculative": p.speculative,
        "thinking": p.thinking.as_ref().map(|t| json!({
            "budget": t.budget, "start_ids": t.start_ids, "end_ids": t.end_ids, "open": t.open,
        })),
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "logit_bias": s.logit_bias.iter().map(|&(t, b)| json!([t, b])).collect::<Vec<_>>(),
        "seed": s.seed,
        "logprobs": s.logprobs,
        "top_logprobs": s.top_logprobs,
        "stop": p.stops.stop_strings,
        "stop_token_ids": p.stops.stop_token_ids,
        "include_stop_str": p.stops.include_stop_str,
        "skip_special_tokens": p.stops.skip_special_tokens,
    })
}

fn outputs_json(out: &[Output]) -> Value {
    out.iter()
        .map(|o| {
            let finish = match &o.finish {
                None => Value::Null,
                Some(f) => {
                    let mut m = match &f.reason {
                        FinishReason::Stop(StopReason::Token(t)) => json!({"reason": "stop", "token": t}),
                        FinishReason::Stop(StopReason::String(s)) => json!({"reason": "stop", "string": s}),
                        FinishReason::Length => json!({"reason": "length"}),
                        FinishReason::Abort => json!({"reason": "abort"}),
                        FinishReason::Error { kind, message } => {
                            json!({"reason": "error", "error_kind": kind.as_str(), "message": message})
                        }
                    };
                    m["cached_tokens"] = f.cached_tokens.into();
                    m
                }
            };
            json!([o.rid, o.tokens, finish])
        })
        .collect::<Vec<_>>()
        .into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
