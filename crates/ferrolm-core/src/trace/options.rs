//! How a replay runs: arrivals, settings that replace the recorded ones, checks.

use crate::engine::{EngineConfig, SchedulePolicy};
use crate::radix::EvictionPolicy;

/// How requests arrive in a replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// In the recording's call order: a submit before step s arrives before step s.
    Steps,
    /// At their recorded times, on a virtual clock that advances `step_s` (default: the
    /// recording's mean step) plus `token_s` per token in the plan at each step.
    Time { step_s: Option<f64>, token_s: f64 },
}

/// Settings to replay under instead of the recorded ones (what-if and bisection).
#[derive(Clone, Debug, Default)]
pub struct ConfigOverrides {
    pub kv_capacity: Option<usize>,
    pub max_running_requests: Option<usize>,
    pub max_prefill_tokens: Option<usize>,
    pub schedule_policy: Option<SchedulePolicy>,
    pub eviction_policy: Option<EvictionPolicy>,
    pub enable_prefix_cache: Option<bool>,
    pub new_token_ratio: Option<f64>,
}

impl ConfigOverrides {
    pub fn apply(&self, c: &mut EngineConfig) {
        let ConfigOverrides {
            kv_capacity,
            max_running_requests,
            max_prefill_tokens,
            schedule_policy,
            eviction_policy,
            enable_prefix_cache,
            new_token_ratio,
        } = self.clone();
        c.kv_capacity = kv_capacity.unwrap_or(c.kv_capacity);
        c.max_running_requests = max_running_requests.unwrap_or(c.max_running_requests);
        c.max_prefill_tokens = max_prefill_tokens.unwrap_or(c.max_prefill_tokens);
        c.schedule_policy = schedule_policy.unwrap_or(c.schedule_policy);
        c.eviction_policy = eviction_policy.unwrap_or(c.eviction_policy);
        c.enable_prefix_cache = enable_prefix_cache.unwrap_or(c.enable_prefix_cache);
        c.new_token_ratio = new_token_ratio.unwrap_or(c.new_token_ratio);
    }
}

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub arrivals: Arrivals,
    pub overrides: ConfigOverrides,
    /// Check the KV pool every this many steps (0: at the end only).
    pub check_every: u64,
    /// One line per step through the `log` callback.
    pub verbose: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            arrivals: Arrivals::Steps,
            overrides: ConfigOverrides::default(),
            check_every: 1,
            verbose: false,
        }
    }
}
