//! One request's state inside the engine.

use std::time::Instant;

use crate::detok::{Detokenizer, StopConditions, StopReason};
use crate::radix::NodeHandle;
use crate::sampling::{Sampler, SamplingParams};

use super::constraint::TokenConstraint;
use super::draft::Speculation;

/// What a caller submits besides the prompt.
#[derive(Clone, Debug)]
pub struct RequestParams {
    pub sampling: SamplingParams,
    pub stops: StopConditions,
    pub max_new_tokens: usize,
    /// Stop tokens, EOS and stop strings are ignored until this many tokens are out.
    pub min_new_tokens: usize,
    pub ignore_eos: bool,
    /// Higher runs first under the `priority` policy; also the tree's eviction priority.
    pub priority: i64,
    /// Cache namespace (LoRA id, cache salt): no prefix is shared across namespaces.
    pub namespace: Option<String>,
    /// Give up if still waiting after this many seconds.
    pub queue_timeout_s: Option<f64>,
    /// Speculate by lookup (`engine::draft`); `None`: as `EngineConfig::speculative` says.
    pub speculative: Option<bool>,
}

impl RequestParams {
    /// Whether the core picks this request's tokens as the bare argmax of the logits (EOS
    /// excluded where it ignores EOS): greedy, and nothing that changes or masks the
    /// logits (bias, penalties, `min_new_tokens`' ban on stop tokens, a grammar or allow
    /// list: `constrained`) or asks for their log-probabilities. The one statement of the
    /// rule: plans carry it per entry (`BatchPlan::plain_greedy`) for the runner.
    pub fn plain_greedy(&self, constrained: bool) -> bool {
        let s = &self.sampling;
        s.is_greedy()
            && s.logit_bias.is_empty()
            && s.repetition_penalty == 1.0
            && s.frequency_penalty == 0.0
            && s.presence_penalty == 0.0
            && self.min_new_tokens == 0
            && !s.logprobs
            && s.top_logprobs == 0
            && !constrained
    }
}

impl Default for RequestParams {
    fn default() -> Self {
        RequestParams {
            sampling: SamplingParams::default(),
            stops: StopConditions { skip_special_tokens: true, ..Default::default() },
            max_new_tokens: 16,
            min_new_tokens: 0,
            ignore_eos: false,
            priority: 0,
            namespace: None,
            queue_timeout_s: None,
            speculative: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token, EOS or stop string; the matched one.
    Stop(StopReason),
    /// `max_new_tokens` or the context length was reached.
    Length,
    Abort,
    /// The engine could not serve it: `kind` says why in a word a program can match,
    /// `message` in words a person can act on.
    Error {
        kind: ErrorKind,
        message: String,
    },
}

impl FinishReason {
    pub(crate) fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        FinishReason::Error { kind, message: message.into() }
    }
}

/// Why a request ended with an error. Crosses the boundary as `as_str()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// It waited in the queue longer than its `queue_timeout_s`.
    QueueTimeout,
    /// It can never fit in the KV pool.
    KvCapacity,
    /// Its grammar (or allow list) left no token, or rejected a given one.
    Grammar,
    /// The step it was in failed (the model forward raised): `Engine::fail_step`.
    StepFailed,
    /// Sampling found no token to draw (every logit masked or not a number).
    Sampling,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 5] = [
        ErrorKind::QueueTimeout,
        ErrorKind::KvCapacity,
        ErrorKind::Grammar,
        ErrorKind::StepFailed,
        ErrorKind::Sampling,
    ];

    /// The kind's name at the boundary: `queue_timeout`, `kv_capacity`, `grammar`,
    /// `step_failed`, `sampling`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::QueueTimeout => "queue_timeout",
            ErrorKind::KvCapacity => "kv_capacity",
            ErrorKind::Grammar => "grammar",
            ErrorKind::StepFailed => "step_failed",
            ErrorKind::Sampling => "sampling",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub(crate) struct Request {
    /// Prompt then output.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Leading tokens whose KV is in the pool.
    pub kv_len: usize,
    /// KV slot of `tokens[i]` for every i < slots.len(); `slots[..cached_len]` belong to
    /// the tree (kept by the lock on `node`), the rest to this request.
    pub slots: Vec<u32>,
    pub cached_len: usize,
    pub node: Option<NodeHandle>,
    pub params: RequestParams,
    pub sampler: Sampler,
    pub detok: Detokenizer,
    pub constraint: Option<Box<dyn TokenConstraint>>,
    pub arrival: Instant,
    /// The latest time it entered the waiting queue (arrival or retraction).
    pub queued_at: Instant,
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    /// Prompt tokens found in the cache on first admission (for usage reports).
    pub cached_prompt_tokens: Option<usize>,
    pub retractions: u32,
    pub aborted: bool,
    /// Its drafting state, when it speculates.
    pub spec: Option<Speculation>,
}

impl Request {
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Whether its next step is one decode token (its prompt is in the pool).
    pub fn is_decoding(&self) -> bool {
        self.tokens.len() - self.kv_len == 1 && self.kv_len >= self.prompt_len
    }

    /// Tokens it may still generate.
    pub fn remaining(&self) -> usize {
        self.params.max_new_tokens.saturating_sub(self.generated())
    }
}
