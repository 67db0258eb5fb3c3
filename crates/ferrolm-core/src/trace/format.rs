//! The records of a trace and their JSON form (one object per line; see the module doc of
//! [`crate::trace`] for the format). Writing goes through `serde_json::Value`; reading
//! takes defaults for absent optional fields, so later versions may add fields.

use serde_json::{json, Map, Value};

use crate::detok::{StopConditions, StopReason};
use crate::engine::{EngineConfig, ErrorKind, FinishReason, RequestParams, SchedulePolicy};
use crate::sampling::SamplingParams;

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
    Submit { at: At, rids: Vec<u64>, prompt: Vec<u32>, params: RequestParams, constraint: RecordedConstraint },
    Abort { at: At, rid: u64 },
    Flush { at: At },
    Schedule { at: At, plan: Vec<PlanEntry> },
    /// The outputs of `commit` or `commit_tokens`.
    Commit { at: At, out: Vec<Output> },
    FailStep { at: At, message: String, out: Vec<Output> },
    /// The outputs of `take_outputs` (aborts and timeouts outside a step), when any.
    Outputs { at: At, out: Vec<Output> },
    /// The bytes of output tokens, written before the first record that holds them, so a
    /// replay detokenizes as the engine did (stop strings match at the same token).
    Tokens { tokens: Vec<(u32, Vec<u8>)>, special: Vec<u32> },
}

// ---- writing ----

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
                let plan: Vec<Value> = plan.iter().map(|e| json!([e.rid, e.start, e.len, e.samples])).collect();
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

// ---- reading ----

/// A JSON object of a record, with the accessors that name the field that is wrong.
struct Obj<'a>(&'a Map<String, Value>);

impl<'a> Obj<'a> {
    fn get(&self, key: &str) -> Result<&'a Value, String> {
        self.0.get(key).ok_or_else(|| format!("missing field {key:?}"))
    }
    fn opt(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }
    fn u64(&self, key: &str) -> Result<u64, String> {
        self.get(key)?.as_u64().ok_or_else(|| format!("{key}: expected a non-negative integer"))
    }
    fn usize_or(&self, key: &str, default: usize) -> Result<usize, String> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => v.as_u64().map(|v| v as usize).ok_or_else(|| format!("{key}: expected a non-negative integer")),
        }
    }
    fn f64_or(&self, key: &str, default: f64) -> Result<f64, String> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| format!("{key}: expected a number")),
        }
    }
    fn bool_or(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.opt(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| format!("{key}: expected true or false")),
        }
    }
    fn str(&self, key: &str) -> Result<&'a str, String> {
        self.get(key)?.as_str().ok_or_else(|| format!("{key}: expected a string"))
    }
    fn ids(&self, key: &str) -> Result<Vec<u32>, String> {
        ids(self.get(key)?).map_err(|e| format!("{key}: {e}"))
    }
    fn ids_or_empty(&self, key: &str) -> Result<Vec<u32>, String> {
        match self.opt(key) {
            None => Ok(Vec::new()),
            Some(v) => ids(v).map_err(|e| format!("{key}: {e}")),
        }
    }
    fn at(&self) -> Result<At, String> {
        Ok(At { step: self.u64("step")?, t: self.f64_or("t", 0.0)? })
    }
}

fn object(v: &Value) -> Result<Obj<'_>, String> {
    v.as_object().map(Obj).ok_or_else(|| "expected a JSON object".to_string())
}

fn ids(v: &Value) -> Result<Vec<u32>, String> {
    let arr = v.as_array().ok_or("expected an array of token ids")?;
    arr.iter()
        .map(|x| x.as_u64().filter(|&x| x <= u32::MAX as u64).map(|x| x as u32))
        .collect::<Option<Vec<u32>>>()
        .ok_or_else(|| "expected token ids (integers below 2^32)".to_string())
}

fn u64s(v: &Value) -> Result<Vec<u64>, String> {
    let arr = v.as_array().ok_or("expected an array of integers")?;
    arr.iter().map(|x| x.as_u64()).collect::<Option<Vec<u64>>>().ok_or_else(|| "expected integers".to_string())
}

/// The engine configuration of a header line (checks the format and version).
pub fn parse_header(line: &Value) -> Result<EngineConfig, String> {
    let h = object(line)?;
    if h.opt("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(format!("not a ferrolm trace: the first line must be a header with \"format\": {FORMAT:?}"));
    }
    let version = h.u64("version")?;
    if version != VERSION {
        return Err(format!("trace version {version}: this build reads version {VERSION}"));
    }
    let c = object(h.get("config")?).map_err(|e| format!("config: {e}"))?;
    let d = EngineConfig::default();
    let config = EngineConfig {
        kv_capacity: c.usize_or("kv_capacity", d.kv_capacity)?,
        max_running_requests: c.usize_or("max_running_requests", d.max_running_requests)?,
        max_prefill_tokens: c.usize_or("max_prefill_tokens", d.max_prefill_tokens)?,
        schedule_policy: match c.opt("schedule_policy") {
            None => d.schedule_policy,
            Some(v) => v.as_str().ok_or("schedule_policy: expected a string")?.parse()?,
        },
        enable_prefix_cache: c.bool_or("enable_prefix_cache", d.enable_prefix_cache)?,
        eviction_policy: match c.opt("eviction_policy") {
            None => d.eviction_policy,
            Some(v) => v.as_str().ok_or("eviction_policy: expected a string")?.parse().map_err(
                |e: crate::radix::policy::UnknownPolicy| format!("eviction_policy: {e}"),
            )?,
        },
        new_token_ratio: c.f64_or("new_token_ratio", d.new_token_ratio)?,
        fast_lane_tokens: c.usize_or("fast_lane_tokens", d.fast_lane_tokens)?,
        max_context: c.usize_or("max_context", d.max_context)?,
        vocab_size: c.usize_or("vocab_size", d.vocab_size)?,
        eos_token_ids: c.ids_or_empty("eos_token_ids")?,
        seed: c.opt("seed").map_or(Some(d.seed), Value::as_u64).ok_or("seed: expected an integer")?,
    };
    config.validate().map_err(|e| format!("config: {e}"))?;
    Ok(config)
}

impl Record {
    /// The record of one line after the header.
    pub fn from_json(v: &Value) -> Result<Record, String> {
        let r = object(v)?;
        match r.str("kind")? {
            "submit" => {
                let rids = u64s(r.get("rids")?).map_err(|e| format!("rids: {e}"))?;
                if rids.is_empty() {
                    return Err("rids: empty".into());
                }
                let constraint = match r.opt("constraint") {
                    None => RecordedConstraint::None,
                    Some(Value::String(s)) if s == "grammar" => RecordedConstraint::Grammar,
                    Some(Value::String(s)) if s == "custom" => RecordedConstraint::Custom,
                    Some(c) => RecordedConstraint::AllowedTokens(
                        object(c).and_then(|c| c.ids("allowed_token_ids")).map_err(|e| format!("constraint: {e}"))?,
                    ),
                };
                let params = parse_params(r.get("params")?).map_err(|e| format!("params: {e}"))?;
                Ok(Record::Submit { at: r.at()?, rids, prompt: r.ids("prompt")?, params, constraint })
            }
            "abort" => Ok(Record::Abort { at: r.at()?, rid: r.u64("rid")? }),
            "flush" => Ok(Record::Flush { at: r.at()? }),
            "schedule" => {
                let plan = r.get("plan")?.as_array().ok_or("plan: expected an array")?;
                let plan = plan
                    .iter()
                    .map(|e| {
                        let e = e.as_array().filter(|e| e.len() == 4).ok_or("expected [rid, start, len, samples]")?;
                        let n = |i: usize| e[i].as_u64().ok_or("expected [rid, start, len, samples]");
                        let samples = e[3].as_bool().ok_or("expected [rid, start, len, samples]")?;
                        Ok(PlanEntry { rid: n(0)?, start: n(1)? as usize, len: n(2)? as usize, samples })
                    })
                    .collect::<Result<Vec<_>, &str>>()
                    .map_err(|e| format!("plan: {e}"))?;
                Ok(Record::Schedule { at: r.at()?, plan })
            }
            "commit" => Ok(Record::Commit { at: r.at()?, out: parse_outputs(r.get("out")?)? }),
            "fail_step" => Ok(Record::FailStep {
                at: r.at()?,
                message: r.str("message")?.to_string(),
                out: parse_outputs(r.get("out")?)?,
            }),
            "outputs" => Ok(Record::Outputs { at: r.at()?, out: parse_outputs(r.get("out")?)? }),
            "tokens" => {
                let ids = r.ids("ids")?;
                let bytes = r.get("bytes")?.as_array().ok_or("bytes: expected an array")?;
                if bytes.len() != ids.len() {
                    return Err("ids and bytes differ in length".into());
                }
                let tokens = ids
                    .into_iter()
                    .zip(bytes)
                    .map(|(id, b)| Ok((id, unhex(b.as_str().ok_or("bytes: expected hex strings")?)?)))
                    .collect::<Result<Vec<_>, String>>()?;
                Ok(Record::Tokens { tokens, special: r.ids_or_empty("special")? })
            }
            other => Err(format!("unknown record kind {other:?}")),
        }
    }
}

fn parse_params(v: &Value) -> Result<RequestParams, String> {
    let p = object(v)?;
    let d = RequestParams::default();
    let s = SamplingParams::default();
    let f32_or = |key: &str, default: f32| p.f64_or(key, default as f64).map(|v| v as f32);
    let logit_bias = match p.opt("logit_bias") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .ok_or("logit_bias: expected [[token, bias], ...]")?
            .iter()
            .map(|e| {
                let e = e.as_array().filter(|e| e.len() == 2);
                let t = e.and_then(|e| e[0].as_u64()).filter(|&t| t <= u32::MAX as u64);
                let b = e.and_then(|e| e[1].as_f64());
                t.zip(b).map(|(t, b)| (t as u32, b as f32)).ok_or("logit_bias: expected [[token, bias], ...]")
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let strings = match p.opt("stop") {
        None => Vec::new(),
        Some(v) => v
            .as_array()
            .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .ok_or("stop: expected an array of strings")?,
    };
    Ok(RequestParams {
        sampling: SamplingParams {
            temperature: f32_or("temperature", s.temperature)?,
            top_k: p.usize_or("top_k", s.top_k as usize)? as u32,
            top_p: f32_or("top_p", s.top_p)?,
            min_p: f32_or("min_p", s.min_p)?,
            repetition_penalty: f32_or("repetition_penalty", s.repetition_penalty)?,
            frequency_penalty: f32_or("frequency_penalty", s.frequency_penalty)?,
            presence_penalty: f32_or("presence_penalty", s.presence_penalty)?,
            logit_bias,
            seed: p.opt("seed").map(|v| v.as_u64().ok_or("seed: expected an integer")).transpose()?,
            logprobs: p.bool_or("logprobs", s.logprobs)?,
            top_logprobs: p.usize_or("top_logprobs", s.top_logprobs as usize)? as u32,
        },
        stops: StopConditions {
            stop_strings: strings,
            stop_token_ids: p.ids_or_empty("stop_token_ids")?,
            include_stop_str: p.bool_or("include_stop_str", d.stops.include_stop_str)?,
            skip_special_tokens: p.bool_or("skip_special_tokens", d.stops.skip_special_tokens)?,
        },
        max_new_tokens: p.usize_or("max_new_tokens", d.max_new_tokens)?,
        min_new_tokens: p.usize_or("min_new_tokens", d.min_new_tokens)?,
        ignore_eos: p.bool_or("ignore_eos", d.ignore_eos)?,
        priority: match p.opt("priority") {
            None => d.priority,
            Some(v) => v.as_i64().ok_or("priority: expected an integer")?,
        },
        namespace: match p.opt("namespace") {
            None => None,
            Some(v) => Some(v.as_str().ok_or("namespace: expected a string")?.to_string()),
        },
        queue_timeout_s: p.opt("queue_timeout_s").map(|v| v.as_f64().ok_or("queue_timeout_s: expected a number")).transpose()?,
    })
}

fn parse_outputs(v: &Value) -> Result<Vec<Output>, String> {
    let arr = v.as_array().ok_or("out: expected an array")?;
    arr.iter()
        .map(|e| {
            let e = e.as_array().filter(|e| e.len() == 3).ok_or("out: expected [rid, tokens, finish]")?;
            let rid = e[0].as_u64().ok_or("out: rid: expected an integer")?;
            let tokens = ids(&e[1]).map_err(|m| format!("out: tokens: {m}"))?;
            let finish = if e[2].is_null() { None } else { Some(parse_finish(&e[2]).map_err(|m| format!("out: finish: {m}"))?) };
            Ok(Output { rid, tokens, finish })
        })
        .collect()
}

fn parse_finish(v: &Value) -> Result<RecordedFinish, String> {
    let f = object(v)?;
    let reason = match f.str("reason")? {
        "stop" => match (f.opt("token"), f.opt("string")) {
            (Some(t), None) => FinishReason::Stop(StopReason::Token(
                t.as_u64().filter(|&t| t <= u32::MAX as u64).ok_or("token: expected a token id")? as u32,
            )),
            (None, Some(s)) => FinishReason::Stop(StopReason::String(s.as_str().ok_or("string: expected a string")?.into())),
            _ => return Err("a stop names its token or its string".into()),
        },
        "length" => FinishReason::Length,
        "abort" => FinishReason::Abort,
        "error" => {
            let name = f.str("error_kind")?;
            let kind = ErrorKind::ALL
                .into_iter()
                .find(|k| k.as_str() == name)
                .ok_or_else(|| format!("unknown error_kind {name:?}"))?;
            FinishReason::Error { kind, message: f.opt("message").and_then(Value::as_str).unwrap_or("").to_string() }
        }
        other => return Err(format!("unknown reason {other:?}")),
    };
    Ok(RecordedFinish { reason, cached_tokens: f.usize_or("cached_tokens", 0)? })
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return Err(format!("bytes: {s:?} is not hex"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| format!("bytes: {s:?} is not hex")))
        .collect()
}
