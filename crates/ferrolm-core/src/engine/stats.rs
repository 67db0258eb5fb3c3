//! Counters and latency samples for metrics. The core counts; Python exports (Prometheus).

/// Monotonic counters since the engine started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub steps: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Prompt tokens found in the prefix cache at first admission.
    pub cache_hit_tokens: u64,
    pub retractions: u64,
    pub finished: u64,
    pub errors: u64,
    /// Steps dropped by `fail_step` (their forward failed).
    pub failed_steps: u64,
    /// CPU time of the helper threads that sample a large step beside the caller's
    /// (`commit`), in nanoseconds: they end with the call, so a reader of the process's
    /// live threads cannot see it.
    pub sampling_thread_cpu_ns: u64,
    /// Drafts verified (speculative decoding), their tokens, and the tokens kept.
    pub spec_drafts: u64,
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    /// Drafts by how many of their tokens were kept: entry i counts those that kept i
    /// (the last entry, those that kept at least that many).
    pub spec_accepted_histogram: [u64; SPEC_HISTOGRAM_LEN],
}

/// Entries of `EngineStats::spec_accepted_histogram`: 0 to 15 tokens, then 16 or more.
pub const SPEC_HISTOGRAM_LEN: usize = 17;

/// Latencies observed since the last `take_latencies`, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencySamples {
    /// Arrival to first token.
    pub ttft_s: Vec<f64>,
    /// Between consecutive tokens of a request.
    pub itl_s: Vec<f64>,
    /// Arrival to finish.
    pub e2e_s: Vec<f64>,
    /// Arrival to first admission.
    pub queue_s: Vec<f64>,
}

/// The engine's state right now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests in the waiting queue (not the other samples of an `n > 1` request, which
    /// wait for their first sample's prefill outside it).
    pub waiting: usize,
    pub running: usize,
    /// Slots held by requests or the cache.
    pub kv_used: usize,
    pub kv_capacity: usize,
    pub cached_tokens: usize,
    pub evictable_tokens: usize,
    /// The LoRA adapters of running and of waiting requests, by name, each once
    /// (vLLM's `vllm:lora_requests_info`).
    pub running_loras: Vec<String>,
    pub waiting_loras: Vec<String>,
    /// The most adapters a step mixes (`EngineConfig::max_loras`).
    pub max_loras: usize,
}
