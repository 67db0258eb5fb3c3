//! Every engine knob in one place, checked once.

use std::str::FromStr;

use crate::radix::EvictionPolicy;

/// Which waiting request is admitted first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SchedulePolicy {
    /// First come, first served.
    #[default]
    Fcfs,
    /// Longest cached prefix first (ties by arrival), at every queue length.
    Lpm,
    /// Highest `priority` first (ties by arrival).
    Priority,
}

impl SchedulePolicy {
    /// The name `FromStr` reads.
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulePolicy::Fcfs => "fcfs",
            SchedulePolicy::Lpm => "lpm",
            SchedulePolicy::Priority => "priority",
        }
    }
}

impl FromStr for SchedulePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(SchedulePolicy::Fcfs),
            "lpm" => Ok(SchedulePolicy::Lpm),
            "priority" => Ok(SchedulePolicy::Priority),
            _ => Err(format!("unknown schedule policy {s:?}; expected one of fcfs, lpm, priority")),
        }
    }
}

/// A configuration the engine refuses: `field` names the setting (as `EngineConfig` spells
/// it), `message` says what is wrong with its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: &'static str,
    pub message: String,
}

impl ConfigError {
    pub fn new(field: &'static str, message: String) -> Self {
        ConfigError { field, message }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The engine's one configuration, and the one place its defaults are written: the
/// binding takes `EngineConfig::default()` for every keyword not given and shows it
/// (`ferrolm._core.EngineConfig.defaults()`), and `ferrolm.Engine`, the server's
/// `ServerArgs` and the CLI help read them from there.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Token slots in the KV pool.
    pub kv_capacity: usize,
    pub max_running_requests: usize,
    /// Prompt tokens per step (chunked prefill size); decode tokens do not count.
    pub max_prefill_tokens: usize,
    pub schedule_policy: SchedulePolicy,
    pub enable_prefix_cache: bool,
    pub eviction_policy: EvictionPolicy,
    /// Share of each running request's remaining `max_new_tokens` kept free for it when
    /// admitting new requests (the rest is a bet that requests stop early).
    pub new_token_ratio: f64,
    /// A waiting request with at most this many uncached tokens is admitted even when the
    /// step's prefill budget is spent (the prefix-hit fast lane).
    pub fast_lane_tokens: usize,
    /// The model's context length: prompt + output may not exceed it.
    pub max_context: usize,
    pub vocab_size: usize,
    pub eos_token_ids: Vec<u32>,
    /// Seeds the per-request random streams of requests that carry no seed.
    pub seed: u64,
    /// Queue the prefix cache's KV events (vLLM's shape) for `Engine::take_kv_events`.
    pub kv_events: bool,
    /// Tokens per KV event block (the page size a router's index must use).
    pub kv_event_block_size: usize,
    /// Speculate by lookup (`engine::draft`) for requests that do not say otherwise
    /// (`RequestParams::speculative`).
    pub speculative: bool,
    /// The most draft tokens a request verifies in one step.
    pub speculative_max_draft: usize,
    /// What a verified draft row costs, as a share of a one-token step's forward: drafts
    /// are as long as their tokens are likely to pay for it (`draft::Speculation`).
    pub speculative_row_cost: f64,
    /// The most LoRA adapters one step's batch may mix (vLLM's and SGLang's
    /// `--max-loras`): a waiting request whose adapter would be one more than this waits
    /// until a running adapter's requests are done.
    pub max_loras: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            kv_capacity: Self::DEFAULT_KV_CAPACITY,
            max_running_requests: Self::DEFAULT_MAX_RUNNING_REQUESTS,
            max_prefill_tokens: Self::DEFAULT_MAX_PREFILL_TOKENS,
            schedule_policy: SchedulePolicy::Fcfs,
            enable_prefix_cache: true,
            eviction_policy: EvictionPolicy::Lru,
            new_token_ratio: 0.3,
            fast_lane_tokens: 32,
            max_context: 1 << 15,
            vocab_size: 32_000,
            eos_token_ids: Vec::new(),
            seed: 0,
            kv_events: false,
            kv_event_block_size: Self::DEFAULT_KV_EVENT_BLOCK_SIZE,
            speculative: false,
            speculative_max_draft: Self::DEFAULT_SPECULATIVE_MAX_DRAFT,
            speculative_row_cost: Self::DEFAULT_SPECULATIVE_ROW_COST,
            max_loras: Self::DEFAULT_MAX_LORAS,
        }
    }
}

impl EngineConfig {
    pub const DEFAULT_KV_CAPACITY: usize = 32_768;
    pub const DEFAULT_MAX_RUNNING_REQUESTS: usize = 64;
    pub const DEFAULT_MAX_PREFILL_TOKENS: usize = 2048;
    /// vLLM's default block size, which routers (Dynamo, llm-d) are usually set up with.
    pub const DEFAULT_KV_EVENT_BLOCK_SIZE: usize = 16;
    /// Long enough for a copied line of code to go in one step; a draft is only as long
    /// as its tokens are likely to pay for their rows (`draft::Speculation`).
    pub const DEFAULT_SPECULATIVE_MAX_DRAFT: usize = 10;
    /// A verified row's share of a one-token step on a CPU for a small model: a row reads
    /// no more weights, but multiplies them again. Measured on two cores with
    /// SmolLM2-135M (`ferrolm bench quant --drafts`, forwards of 1 + k rows): 0.21 to 0.25
    /// on its Q4_1 and Q4_K_M files. Far less on a GPU.
    pub const DEFAULT_SPECULATIVE_ROW_COST: f64 = 0.25;
    pub const MAX_SPECULATIVE_DRAFT: usize = 64;
    /// SGLang's `--max-loras-per-batch` default.
    pub const DEFAULT_MAX_LORAS: usize = 8;

    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("kv_capacity", self.kv_capacity),
            ("max_running_requests", self.max_running_requests),
            ("max_prefill_tokens", self.max_prefill_tokens),
            ("max_context", self.max_context),
            ("vocab_size", self.vocab_size),
            ("kv_event_block_size", self.kv_event_block_size),
            ("speculative_max_draft", self.speculative_max_draft),
            ("max_loras", self.max_loras),
        ];
        for (field, v) in positive {
            if v == 0 {
                return Err(ConfigError::new(field, "must be at least 1".into()));
            }
        }
        if self.kv_capacity > u32::MAX as usize / 2 {
            return Err(ConfigError::new(
                "kv_capacity",
                format!("must be below 2^31, got {}", self.kv_capacity),
            ));
        }
        if self.speculative_max_draft > Self::MAX_SPECULATIVE_DRAFT {
            return Err(ConfigError::new(
                "speculative_max_draft",
                format!(
                    "must be at most {}, got {}",
                    Self::MAX_SPECULATIVE_DRAFT,
                    self.speculative_max_draft
                ),
            ));
        }
        if !(self.speculative_row_cost > 0.0 && self.speculative_row_cost <= 1.0) {
            return Err(ConfigError::new(
                "speculative_row_cost",
                format!("must be in (0, 1], got {}", self.speculative_row_cost),
            ));
        }
        if !(0.0..=1.0).contains(&self.new_token_ratio) {
            return Err(ConfigError::new(
                "new_token_ratio",
                format!("must be in [0, 1], got {}", self.new_token_ratio),
            ));
        }
        if let Some(&e) = self.eos_token_ids.iter().find(|&&e| e as usize >= self.vocab_size) {
            return Err(ConfigError::new(
                "eos_token_ids",
                format!("{e} is outside the vocabulary (size {})", self.vocab_size),
            ));
        }
        Ok(())
    }
}
