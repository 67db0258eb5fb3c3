//! One request's state inside the engine.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::detok::{Detokenizer, StopConditions, StopReason};
use crate::lora::Adapter;
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
    /// A cap on the tokens of the reasoning section, with the markers that open and close
    /// it (vLLM's `thinking_token_budget`).
    pub thinking: Option<ThinkingBudget>,
    /// The LoRA adapter the request runs with (`None`: the base model). Its prefixes
    /// live in their own cache namespace ([`Lora::namespace`]).
    pub lora: Option<Lora>,
}

/// A request's LoRA adapter: the registry's id for it (never reused, so a name loaded
/// again with other weights shares no cached prefix with the old ones), its name and
/// its weights, held for as long as a request or plan holds them.
#[derive(Clone)]
pub struct Lora {
    pub id: u32,
    pub name: Arc<str>,
    pub adapter: Arc<Adapter>,
}

/// Marks a namespace as an adapter's; no other namespace has it (`Lora::namespace`).
const LORA_NAMESPACE: &str = "\u{0}lora:";

impl Lora {
    /// The cache namespace of the adapter's requests, within `salt`'s (a request's
    /// `cache_salt`, or `None`): `"\0lora:{id}:{name}"`, then `"\0{salt}"` if salted.
    /// Adapter names hold no NUL and the front end refuses salts that do, so no other
    /// namespace can equal it; the id makes an adapter loaded again under the same name a
    /// new namespace.
    pub fn namespace(&self, salt: Option<&str>) -> String {
        let mut ns = format!("{LORA_NAMESPACE}{}:{}", self.id, self.name);
        if let Some(salt) = salt {
            ns.push('\u{0}');
            ns.push_str(salt);
        }
        ns
    }
}

/// What a cache namespace says: the adapter (id, name) when it is a LoRA adapter's
/// ([`Lora::namespace`]), and the salt (all of it when it is not an adapter's).
pub fn namespace_parts(namespace: &str) -> (Option<(u32, &str)>, Option<&str>) {
    let Some(rest) = namespace.strip_prefix(LORA_NAMESPACE) else { return (None, Some(namespace)) };
    let (adapter, salt) = match rest.split_once('\u{0}') {
        Some((adapter, salt)) => (adapter, Some(salt)),
        None => (rest, None),
    };
    let parsed = adapter.split_once(':').and_then(|(id, name)| Some((id.parse().ok()?, name)));
    match parsed {
        Some(lora) => (Some(lora), salt),
        None => (None, Some(namespace)),
    }
}

/// Ids are never reused: one id, one set of weights.
impl PartialEq for Lora {
    fn eq(&self, other: &Lora) -> bool {
        self.id == other.id
    }
}

impl Eq for Lora {}

impl fmt::Debug for Lora {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Lora({}, {:?})", self.id, self.name)
    }
}

/// How many tokens a request may think, and the token sequences that delimit the
/// thinking. Once it has generated `budget` tokens inside its reasoning without closing
/// it, the core forces `end_ids` one token per step (as if sampled: they go through the
/// grammar, the stop checks, the detokenizer and the KV like any token), and generation
/// then goes on as usual. Tokens of the markers themselves do not count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThinkingBudget {
    pub budget: usize,
    /// The tokens that open the reasoning, watched for in the output when it does not
    /// start inside it (empty: only `open` says).
    pub start_ids: Vec<u32>,
    /// The tokens that close it: watched for, and forced once the budget is spent.
    pub end_ids: Vec<u32>,
    /// The output starts inside the reasoning (the prompt opened it, or the model thinks
    /// without writing the opening marker).
    pub open: bool,
}

/// Where a request with a thinking budget stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Thinking {
    /// The reasoning has not opened (yet): watching for its start marker.
    Before,
    /// Inside it, `spent` tokens so far.
    Inside { spent: usize },
    /// The budget is spent: the next token is `end_ids[next]`.
    Forcing { next: usize },
    /// Closed (by the model or by force): nothing more to do.
    After,
}

impl ThinkingBudget {
    /// The state of a request that has generated nothing yet.
    pub(crate) fn initial(&self) -> Thinking {
        if self.open {
            self.inside(0, &[])
        } else {
            Thinking::Before
        }
    }

    /// Inside with `spent` tokens out, `output` the tokens generated so far: forcing once
    /// the budget is spent, from the part of the end marker the output already ends with.
    fn inside(&self, spent: usize, output: &[u32]) -> Thinking {
        if spent < self.budget {
            return Thinking::Inside { spent };
        }
        let begun =
            (1..self.end_ids.len()).rev().find(|&k| output.ends_with(&self.end_ids[..k])).unwrap_or(0);
        Thinking::Forcing { next: begun }
    }

    /// The state after `output` (the tokens generated so far, the newest last) grew by
    /// its last token, from `state` before it.
    pub(crate) fn advance(&self, state: Thinking, output: &[u32]) -> Thinking {
        match state {
            Thinking::Before if !self.start_ids.is_empty() && output.ends_with(&self.start_ids) => {
                self.inside(0, output)
            }
            Thinking::Before | Thinking::After => state,
            Thinking::Inside { .. } if output.ends_with(&self.end_ids) => Thinking::After,
            Thinking::Inside { spent } => self.inside(spent + 1, output),
            Thinking::Forcing { next } if next + 1 >= self.end_ids.len() => Thinking::After,
            Thinking::Forcing { next } => Thinking::Forcing { next: next + 1 },
        }
    }

    /// The token the state forces next, if any.
    pub(crate) fn forced(&self, state: Thinking) -> Option<u32> {
        match state {
            Thinking::Forcing { next } => self.end_ids.get(next).copied(),
            _ => None,
        }
    }
}

impl RequestParams {
    /// Whether the core picks this request's tokens as the bare argmax of the logits (EOS
    /// excluded where it ignores EOS): greedy, and nothing that changes or masks the
    /// logits (bias, penalties, `min_new_tokens`' ban on stop tokens, a grammar or allow
    /// list, or a token the thinking budget forces: `constrained`) or asks for their
    /// log-probabilities. The one statement of the rule: plans carry it per entry
    /// (`BatchPlan::plain_greedy`) for the runner.
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
            thinking: None,
            lora: None,
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
    /// Where its thinking budget stands (`None` without one).
    pub thinking: Option<Thinking>,
}

impl Request {
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Whether its next step is one decode token (its prompt is in the pool).
    pub fn is_decoding(&self) -> bool {
        self.tokens.len() - self.kv_len == 1 && self.kv_len >= self.prompt_len
    }

    /// The token its thinking budget forces next, if any.
    pub fn forced_token(&self) -> Option<u32> {
        let budget = self.params.thinking.as_ref()?;
        budget.forced(self.thinking?)
    }

    /// Moves its thinking state past the token just pushed.
    pub fn observe_thinking(&mut self) {
        if let (Some(budget), Some(state)) = (&self.params.thinking, self.thinking) {
            self.thinking = Some(budget.advance(state, &self.tokens[self.prompt_len..]));
        }
    }

    /// Tokens it may still generate.
    pub fn remaining(&self) -> usize {
        self.params.max_new_tokens.saturating_sub(self.generated())
    }
}

#[cfg(test)]
mod lora_namespace_tests {
    use super::*;

    fn lora(id: u32, name: &str) -> Lora {
        let shape = crate::lora::LoraShape { layers: 1, hidden: 2, q_dim: 2, kv_dim: 2, intermediate: 2 };
        let part = (0, crate::lora::Target::Q, 1, vec![1.0; 2], vec![1.0; 2], 1.0);
        let adapter = crate::lora::Adapter::from_parts(&shape, vec![part]).unwrap();
        Lora { id, name: name.into(), adapter: Arc::new(adapter) }
    }

    #[test]
    fn an_adapters_namespace_says_its_id_name_and_salt() {
        let l = lora(7, "my:adapter");
        assert_eq!(namespace_parts(&l.namespace(None)), (Some((7, "my:adapter")), None));
        assert_eq!(
            namespace_parts(&l.namespace(Some("s\u{1}alt"))),
            (Some((7, "my:adapter")), Some("s\u{1}alt"))
        );
        // a salt alone is all salt, even one that looks like an adapter's
        assert_eq!(namespace_parts("lora:7:x"), (None, Some("lora:7:x")));
        assert_eq!(namespace_parts("\u{0}lora:x"), (None, Some("\u{0}lora:x")));
        assert_ne!(lora(8, "my:adapter").namespace(None), l.namespace(None));
    }
}
