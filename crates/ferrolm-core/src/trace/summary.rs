//! What a replay found, and its report.

use std::collections::BTreeMap;

/// What a replay found. `violations` lists the first broken KV checks (up to
/// [`MAX_LISTED`]); `violation_count` counts them all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplaySummary {
    /// Requests submitted (one per sample).
    pub requests: usize,
    pub recorded_steps: u64,
    pub steps: u64,
    /// Steps whose plan was compared with the recorded one (arrivals by step only).
    pub compared_steps: u64,
    pub diverged_steps: u64,
    pub first_divergence: Option<String>,
    pub prompt_tokens: u64,
    pub cache_hit_tokens: u64,
    /// The sum of the recorded requests' `cached_tokens`.
    pub recorded_cache_hit_tokens: u64,
    pub generated_tokens: u64,
    pub admissions: u64,
    /// Plan entries that ran part of a prompt (chunked prefill).
    pub prefill_chunks: u64,
    pub retractions: u64,
    /// Drafts verified (speculative decoding), their tokens and the tokens kept.
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    /// By reason: `length`, `stop`, `abort`, `error:<kind>` (enforced ends under their
    /// recorded reason).
    pub finishes: BTreeMap<String, usize>,
    /// Ends the fake model cannot produce, applied from the recording.
    pub enforced_ends: usize,
    /// Requests still running when the recording stopped, aborted after their tokens.
    pub cut_off: usize,
    /// Submits the replaying engine refused (possible under overrides).
    pub refused: usize,
    /// Requests that ended otherwise than recorded (reason, or cached prompt tokens).
    pub finish_mismatches: usize,
    pub first_mismatch: Option<String>,
    /// Tokens asked for beyond what the recording holds (a stand-in was used).
    pub missing_tokens: usize,
    pub kv_checks: u64,
    pub kv_capacity: usize,
    pub peak_kv_used: usize,
    pub peak_running: usize,
    pub violations: Vec<String>,
    pub violation_count: usize,
}

/// Violations listed in a summary (all are counted).
pub const MAX_LISTED: usize = 20;

impl ReplaySummary {
    /// The replay kept every KV check.
    pub fn is_ok(&self) -> bool {
        self.violation_count == 0
    }

    /// Every step and every finish as recorded.
    pub fn is_same(&self) -> bool {
        self.diverged_steps == 0
            && self.finish_mismatches == 0
            && self.missing_tokens == 0
            && self.refused == 0
    }

    /// The exit status of `ferrolm-replay`: 0 the checks held, 1 a KV check failed (or the
    /// engine stalled), 3 with `expect_same` when the replay differs from the recording.
    /// (2 is for bad arguments and unreadable traces.)
    pub fn exit_code(&self, expect_same: bool) -> u8 {
        if !self.is_ok() {
            1
        } else if expect_same && !self.is_same() {
            3
        } else {
            0
        }
    }

    /// The report, one line each.
    pub fn report(&self) -> Vec<String> {
        let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
        let mut lines = vec![format!(
            "replayed {} requests in {} steps (recorded: {} steps)",
            self.requests, self.steps, self.recorded_steps
        )];
        if self.compared_steps > 0 {
            let mut l = format!(
                "decisions: {} of {} steps scheduled as recorded",
                self.compared_steps - self.diverged_steps,
                self.compared_steps
            );
            if let Some(d) = &self.first_divergence {
                l += &format!("; first divergence: {d}");
            }
            lines.push(l);
        } else if self.recorded_steps == 0 {
            lines.push("decisions: the trace records no steps to compare with".into());
        } else {
            lines.push("decisions: not compared (arrivals by time)".into());
        }
        lines.push(format!(
            "tokens: prompt {}, cache hits {} ({:.1}%; recorded {}), generated {}",
            self.prompt_tokens,
            self.cache_hit_tokens,
            pct(self.cache_hit_tokens, self.prompt_tokens),
            self.recorded_cache_hit_tokens,
            self.generated_tokens
        ));
        lines.push(format!(
            "schedule: {} admissions, {} prefill chunks, {} retractions, peak {} running",
            self.admissions, self.prefill_chunks, self.retractions, self.peak_running
        ));
        if self.drafts > 0 {
            lines.push(format!(
                "speculation: {} drafts of {} tokens, {} kept ({:.1}%)",
                self.drafts,
                self.draft_tokens,
                self.accepted_tokens,
                pct(self.accepted_tokens, self.draft_tokens)
            ));
        }
        let finishes: Vec<String> = self.finishes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let mut l = format!(
            "finishes: {}; ended as recorded {}, cut off {}, refused {}, mismatches {}, missing tokens {}",
            if finishes.is_empty() { "none".to_string() } else { finishes.join(", ") },
            self.enforced_ends,
            self.cut_off,
            self.refused,
            self.finish_mismatches,
            self.missing_tokens
        );
        if let Some(m) = &self.first_mismatch {
            l += &format!("; first mismatch: {m}");
        }
        lines.push(l);
        lines.push(format!(
            "KV: {} checks, peak {} of {} slots used, {} violations{}",
            self.kv_checks,
            self.peak_kv_used,
            self.kv_capacity,
            self.violation_count,
            if self.is_ok() { "; no leaked slot at the end" } else { "" }
        ));
        lines.extend(self.violations.iter().map(|v| format!("VIOLATION {v}")));
        lines
    }
}
