//! Reading a trace's lines back into records. Absent optional fields take their defaults
//! and unknown fields are ignored, so later versions may add fields.

use serde_json::{Map, Value};

use crate::detok::{StopConditions, StopReason};
use crate::engine::{EngineConfig, ErrorKind, FinishReason, RequestParams, ThinkingBudget};
use crate::sampling::SamplingParams;

use super::format::{At, Output, PlanEntry, Record, RecordedConstraint, RecordedFinish, FORMAT, VERSION};

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
            Some(v) => v
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| format!("{key}: expected a non-negative integer")),
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
    arr.iter()
        .map(|x| x.as_u64())
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| "expected integers".to_string())
}

/// The engine configuration of a header line (checks the format and version).
pub fn parse_header(line: &Value) -> Result<EngineConfig, String> {
    let h = object(line)?;
    if h.opt("format").and_then(Value::as_str) != Some(FORMAT) {
        return Err(format!(
            "not a ferrolm trace: the first line must be a header with \"format\": {FORMAT:?}"
        ));
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
            Some(v) => v
                .as_str()
                .ok_or("eviction_policy: expected a string")?
                .parse()
                .map_err(|e: crate::radix::policy::UnknownPolicy| format!("eviction_policy: {e}"))?,
        },
        new_token_ratio: c.f64_or("new_token_ratio", d.new_token_ratio)?,
        fast_lane_tokens: c.usize_or("fast_lane_tokens", d.fast_lane_tokens)?,
        max_context: c.usize_or("max_context", d.max_context)?,
        vocab_size: c.usize_or("vocab_size", d.vocab_size)?,
        eos_token_ids: c.ids_or_empty("eos_token_ids")?,
        seed: c.opt("seed").map_or(Some(d.seed), Value::as_u64).ok_or("seed: expected an integer")?,
        // drafts change a plan's entries
        speculative: c.bool_or("speculative", d.speculative)?,
        speculative_max_draft: c.usize_or("speculative_max_draft", d.speculative_max_draft)?,
        speculative_row_cost: c.f64_or("speculative_row_cost", d.speculative_row_cost)?,
        // settings that do not change a schedule (KV events): the defaults
        ..d
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
                        object(c)
                            .and_then(|c| c.ids("allowed_token_ids"))
                            .map_err(|e| format!("constraint: {e}"))?,
                    ),
                };
                let params = parse_params(r.get("params")?).map_err(|e| format!("params: {e}"))?;
                Ok(Record::Submit {
                    at: r.at()?,
                    rids,
                    prompt: r.ids("prompt")?,
                    params: Box::new(params),
                    constraint,
                })
            }
            "abort" => Ok(Record::Abort { at: r.at()?, rid: r.u64("rid")? }),
            "flush" => Ok(Record::Flush { at: r.at()? }),
            "schedule" => {
                let plan = r.get("plan")?.as_array().ok_or("plan: expected an array")?;
                let plan = plan
                    .iter()
                    .map(|e| {
                        let e = e
                            .as_array()
                            .filter(|e| e.len() == 4)
                            .ok_or("expected [rid, start, len, samples]")?;
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
        queue_timeout_s: p
            .opt("queue_timeout_s")
            .map(|v| v.as_f64().ok_or("queue_timeout_s: expected a number"))
            .transpose()?,
        speculative: p
            .opt("speculative")
            .map(|v| v.as_bool().ok_or("speculative: expected true or false"))
            .transpose()?,
        thinking: match p.opt("thinking") {
            None => None,
            Some(v) => {
                let t = object(v).map_err(|m| format!("thinking: {m}"))?;
                let budget = t.usize_or("budget", 0).map_err(|m| format!("thinking.{m}"))?;
                let start_ids = t.ids_or_empty("start_ids").map_err(|m| format!("thinking.{m}"))?;
                let end_ids = t.ids_or_empty("end_ids").map_err(|m| format!("thinking.{m}"))?;
                let open = t.bool_or("open", false).map_err(|m| format!("thinking.{m}"))?;
                Some(ThinkingBudget { budget, start_ids, end_ids, open })
            }
        },
        // a trace holds no weights: an adapter's requests replay on the base model, in
        // their namespace (recorded), so the cache behaves as it did
        lora: None,
    })
}

fn parse_outputs(v: &Value) -> Result<Vec<Output>, String> {
    let arr = v.as_array().ok_or("out: expected an array")?;
    arr.iter()
        .map(|e| {
            let e = e.as_array().filter(|e| e.len() == 3).ok_or("out: expected [rid, tokens, finish]")?;
            let rid = e[0].as_u64().ok_or("out: rid: expected an integer")?;
            let tokens = ids(&e[1]).map_err(|m| format!("out: tokens: {m}"))?;
            let finish = if e[2].is_null() {
                None
            } else {
                Some(parse_finish(&e[2]).map_err(|m| format!("out: finish: {m}"))?)
            };
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
            (None, Some(s)) => {
                FinishReason::Stop(StopReason::String(s.as_str().ok_or("string: expected a string")?.into()))
            }
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
            FinishReason::Error {
                kind,
                message: f.opt("message").and_then(Value::as_str).unwrap_or("").to_string(),
            }
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
