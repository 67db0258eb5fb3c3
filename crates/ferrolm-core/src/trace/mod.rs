//! Engine traces: a recording of the calls made to an [`Engine`](crate::engine::Engine)
//! (submits, aborts, each step's plan and what it produced) that replays offline without
//! Python or a model: the recorded tokens stand in for the forward pass. A scheduling
//! problem seen in production becomes a file to replay, check and bisect
//! (`ferrolm-replay`, [`replay`]).
//!
//! Recording: `Engine::record_trace` (Python: `Engine(record_trace=PATH)`, `ferrolm serve
//! --record-trace PATH`).
//!
//! # Format, version 1
//!
//! JSON lines (UTF-8, one object per line, written and flushed as the engine runs). Every
//! object has a `kind`; records after the header carry `step` (how many `schedule` calls
//! came before it; a step's own records carry its index) and `t` (seconds since the
//! recording started). Readers ignore fields they do not know and take defaults for
//! optional ones that are absent; a change that old readers would misread bumps `version`.
//!
//! | kind | fields |
//! |---|---|
//! | `header` (first line) | `format: "ferrolm-trace"`, `version: 1`, `config`: the engine's settings (`kv_capacity`, `max_running_requests`, `max_prefill_tokens`, `schedule_policy`, `enable_prefix_cache`, `eviction_policy`, `new_token_ratio`, `fast_lane_tokens`, `max_context`, `vocab_size`, `eos_token_ids`, `seed`) |
//! | `submit` | `rids` (one per sample), `prompt` (token ids), `params` (`max_new_tokens`, `min_new_tokens`, `ignore_eos`, `priority`, `namespace`, `queue_timeout_s`, `thinking` (`null` or `{budget, start_ids, end_ids, open}`), the sampling fields `temperature` ... `top_logprobs`, `stop`, `stop_token_ids`, `include_stop_str`, `skip_special_tokens`), `constraint`: `null`, `{"allowed_token_ids": [...]}`, `"grammar"` or `"custom"` |
//! | `abort` | `rid` (an abort of a live request) |
//! | `flush` | (a `flush_cache` that emptied the cache) |
//! | `schedule` | `plan`: `[[rid, start, len, samples], ...]`: request `rid` runs its tokens `start..start+len`, and samples a token after them when `samples` |
//! | `commit` | `out`: `[[rid, [token ids], finish], ...]`, `finish` `null` or `{"reason": "stop" \| "length" \| "abort" \| "error", "token" or "string" (a stop), "error_kind", "message" (an error), "cached_tokens"}` |
//! | `fail_step` | `message`, `out`: the step's requests, ended (`Engine::fail_step`) |
//! | `outputs` | `out`: what `take_outputs` returned (aborts, queue timeouts outside a step) |
//! | `tokens` | `ids`, `bytes` (hex, one string per id), `special`: the bytes of output tokens, before their first use, so a replay detokenizes (and matches stop strings) as the engine did |
//!
//! Grammars are not in a trace (they need the model's vocabulary): a replay runs such
//! requests unconstrained on their recorded tokens and ends them where the recording did.

mod file;
mod format;
mod options;
mod parse;
mod recorder;
mod replay;
mod summary;

pub use file::Trace;
pub use format::{At, Output, PlanEntry, Record, RecordedConstraint, RecordedFinish, FORMAT, VERSION};
pub use options::{Arrivals, ConfigOverrides, ReplayOptions};
pub(crate) use recorder::OutputsOf;
pub use recorder::TraceRecorder;
pub use replay::replay;
pub use summary::{ReplaySummary, MAX_LISTED};
