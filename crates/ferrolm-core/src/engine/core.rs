//! The engine core: its state, `submit`, `abort`, finishing a request, observation.
//! Everything a step needs except the forward pass is split by job: `scheduler.rs`
//! (admission under token and KV budgets, chunked prefill, eviction then retraction under
//! KV pressure), `commit.rs` (sampling, grammar masks, detokenization, stop conditions,
//! handing finished sequences to the prefix cache) and `checks.rs` (request checks,
//! invariants).
//!
//! A request is a token list (prompt, then output) of which the first `kv_len` have KV
//! in the pool. Every step runs `tokens[kv_len..end]` for some `end`; when `end` reaches
//! the last token, the step's logits give the next one. Prefill, chunked prefill, decode
//! and resuming a retracted request are all that one rule.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crate::detok::{Detokenizer, TokenBytes};
use crate::radix::{KvEvent, RadixTree, TreeConfig};
use crate::sampling::{RequestRng, Sampler};
use crate::trace::{OutputsOf, TraceRecorder};

use super::config::{ConfigError, EngineConfig};
use super::constraint::{Constraint, TokenConstraint};
use super::draft::Speculation;
use super::kv_slots::SlotPool;
use super::plan::{Finished, StepOutputs};
use super::request::{FinishReason, Request, RequestParams, ThinkingBudget};
use super::stats::{EngineStats, LatencySamples};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineError {
    /// A request field is wrong; `field` names it.
    InvalidRequest {
        field: &'static str,
        message: String,
    },
    DuplicateRid(u64),
    /// `commit` without a plan, `schedule` twice, or logits of the wrong shape.
    Protocol(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::InvalidRequest { field, message } => write!(f, "{field}: {message}"),
            EngineError::DuplicateRid(rid) => write!(f, "rid: request {rid} is already in the engine"),
            EngineError::Protocol(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for EngineError {}

pub(super) fn invalid(field: &'static str, message: String) -> EngineError {
    EngineError::InvalidRequest { field, message }
}

pub(super) struct InFlight {
    pub rid: u64,
    /// The request's `kv_len` once the step's KV is written (its drafts not counted).
    pub end: usize,
    pub samples: bool,
    pub is_prefill: bool,
    /// Draft tokens the step verifies (their KV goes to the slots past `end`).
    pub draft: Vec<u32>,
}

pub struct Engine {
    pub(super) config: EngineConfig,
    pub(super) vocab: Arc<dyn TokenBytes + Send + Sync>,
    pub(super) tree: RadixTree,
    pub(super) pool: SlotPool,
    pub(super) requests: HashMap<u64, Request>,
    pub(super) waiting: VecDeque<u64>,
    pub(super) running: Vec<u64>,
    /// Samples 2..n of a prompt, by the rid of the sample they wait for (their leader):
    /// neither waiting nor running until it has prefilled the prompt.
    pub(super) followers: HashMap<u64, Vec<u64>>,
    pub(super) in_flight: Vec<InFlight>,
    /// Outputs of aborts, timeouts and refusals not yet handed out.
    pub(super) pending: StepOutputs,
    pub(super) seeds: RequestRng,
    pub(super) mask: Vec<u32>,
    /// The step's grammar masks as `sampling_batch` filled them (by plan entry), for
    /// checking the tokens a runner drew; empty otherwise.
    pub(super) step_masks: Vec<Option<Vec<u32>>>,
    /// One row of sampling weights, reused by every request's draw.
    pub(super) scratch: Vec<f32>,
    pub(crate) stats: EngineStats,
    pub(super) latencies: LatencySamples,
    /// Where every call is recorded, when asked (`record_trace`).
    pub(super) trace: Option<TraceRecorder>,
}

impl Engine {
    pub fn new(config: EngineConfig, vocab: Arc<dyn TokenBytes + Send + Sync>) -> Result<Self, ConfigError> {
        config.validate()?;
        let tree = RadixTree::new(TreeConfig {
            policy: config.eviction_policy,
            kv_events: config.kv_events,
            // the tree caches single tokens (page 1): any block size is a whole number of pages
            event_block_size: config.kv_event_block_size,
            ..TreeConfig::default()
        })
        // the only tree setting taken from the engine's that the tree checks further
        .map_err(|e| ConfigError::new("kv_event_block_size", e.to_string()))?;
        Ok(Engine {
            pool: SlotPool::new(config.kv_capacity),
            tree,
            vocab,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            followers: HashMap::new(),
            in_flight: Vec::new(),
            pending: StepOutputs::new(),
            seeds: RequestRng::new(config.seed),
            mask: vec![0; config.vocab_size.div_ceil(32)],
            step_masks: Vec::new(),
            scratch: Vec::with_capacity(config.vocab_size),
            stats: EngineStats::default(),
            latencies: LatencySamples::default(),
            trace: None,
            config,
        })
    }

    /// Records every call from now on as a trace (`crate::trace`) written to `out`, which
    /// `ferrolm-replay` replays without a model. Refused once the engine has taken a
    /// request: a trace starts from an empty engine.
    pub fn record_trace(&mut self, out: Box<dyn std::io::Write + Send + Sync>) -> Result<(), String> {
        if self.stats.steps > 0 || !self.requests.is_empty() || self.tree.sizes().total > 0 {
            return Err("a trace starts from a fresh engine; this one has run already".into());
        }
        self.trace =
            Some(TraceRecorder::new(out, &self.config).map_err(|e| format!("writing the trace: {e}"))?);
        Ok(())
    }

    /// Records a batch of outputs in the trace, if one is recorded.
    pub(super) fn trace_outputs(&mut self, of: OutputsOf<'_>, out: &StepOutputs) {
        if let Some(t) = &mut self.trace {
            t.on_outputs(of, out, &*self.vocab);
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    // ---- submit and abort ----

    /// Queues one request. Checks everything about it first; an error changes nothing.
    /// Shorthand for `submit_samples(&[rid], ...)` with any constraint.
    pub fn submit(
        &mut self,
        rid: u64,
        prompt: &[u32],
        params: RequestParams,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<(), EngineError> {
        self.submit_samples(&[rid], prompt, params, constraint.map(Constraint::Custom))
    }

    /// Queues `rids.len()` samples of one prompt (`n > 1`), sample j as request `rids[j]`
    /// with seed `seed + j` when the params carry a seed. Checks everything first; an error
    /// changes nothing.
    ///
    /// The first sample leads: the others wait (counted as waiting) until it has
    /// prefilled the prompt, and so cached it, then join the waiting queue at its front
    /// and share that prefix. If the leader ends before that (aborted, timed out, failed
    /// step, too large for the pool), the next sample leads in its place: every sample
    /// runs, or ends, on its own account. Each sample can be aborted by its rid.
    pub fn submit_samples(
        &mut self,
        rids: &[u64],
        prompt: &[u32],
        params: RequestParams,
        constraint: Option<Constraint>,
    ) -> Result<(), EngineError> {
        let mut params = params;
        if let Some(l) = &params.lora {
            params.namespace = Some(l.namespace(params.namespace.as_deref()));
        }
        self.check_request(rids, prompt, &params, constraint.as_ref())?;
        if let Some(t) = &mut self.trace {
            t.on_submit(rids, prompt, &params, constraint.as_ref());
        }
        let mut constraints: Vec<Option<Box<dyn TokenConstraint>>> = match constraint {
            None => rids.iter().map(|_| None).collect(),
            Some(Constraint::Custom(c)) => vec![Some(c)], // checked: one sample
            Some(c) => rids.iter().map(|_| Some(c.instance(self.config.vocab_size))).collect(),
        };
        let now = Instant::now();
        let speculates = params.speculative.unwrap_or(self.config.speculative);
        for (j, &rid) in rids.iter().enumerate() {
            let mut params = params.clone();
            params.sampling.seed = params.sampling.seed.map(|s| s.wrapping_add(j as u64));
            let seed = self.seeds.next_u64();
            let thinking = params.thinking.as_ref().map(ThinkingBudget::initial);
            let request = Request {
                tokens: prompt.to_vec(),
                prompt_len: prompt.len(),
                kv_len: 0,
                slots: Vec::new(),
                cached_len: 0,
                node: None,
                sampler: Sampler::new(params.sampling.clone(), prompt, seed),
                detok: Detokenizer::new(params.stops.clone()),
                params,
                constraint: constraints[j].take(),
                arrival: now,
                queued_at: now,
                first_token_at: None,
                last_token_at: None,
                cached_prompt_tokens: None,
                retractions: 0,
                aborted: false,
                spec: speculates.then(|| {
                    Speculation::new(
                        prompt,
                        self.config.speculative_max_draft,
                        self.config.speculative_row_cost,
                    )
                }),
                thinking,
            };
            self.requests.insert(rid, request);
        }
        self.waiting.push_back(rids[0]);
        if rids.len() > 1 {
            self.followers.insert(rids[0], rids[1..].to_vec());
        }
        Ok(())
    }

    /// The leader `rid` has prefilled its prompt: its followers join the waiting queue
    /// at its front (in order), their queue time starting now.
    pub(super) fn release_followers(&mut self, rid: u64) {
        let Some(followers) = self.followers.remove(&rid) else { return };
        let now = Instant::now();
        for &f in followers.iter().rev() {
            self.requests.get_mut(&f).expect("a follower is live").queued_at = now;
            self.waiting.push_front(f);
        }
    }

    /// Ends a request wherever it is; its output (reason `Abort`) comes with the next
    /// `commit` or `take_outputs`. False if the engine does not know the rid.
    pub fn abort(&mut self, rid: u64) -> bool {
        let Some(r) = self.requests.get_mut(&rid) else { return false };
        if let Some(t) = &mut self.trace {
            t.on_abort(rid);
        }
        if self.in_flight.iter().any(|f| f.rid == rid) {
            r.aborted = true; // the step's commit finishes it, after the runner wrote its KV
            return true;
        }
        let text = r.detok.flush();
        self.finish_pending(rid, FinishReason::Abort, text);
        true
    }

    /// Aborts every request.
    pub fn abort_all(&mut self) -> usize {
        let rids: Vec<u64> = self.requests.keys().copied().collect();
        rids.into_iter().filter(|&rid| self.abort(rid)).count()
    }

    /// Outputs produced outside a step (aborts, timeouts), for a loop with nothing to run.
    pub fn take_outputs(&mut self) -> StepOutputs {
        let out = std::mem::replace(&mut self.pending, StepOutputs::new());
        self.trace_outputs(OutputsOf::TakeOutputs, &out);
        out
    }

    /// Hands a request's KV to the cache (or the pool) and drops its lock.
    pub(super) fn release_kv(&mut self, rid: u64) {
        let r = self.requests.get_mut(&rid).unwrap();
        let slots = std::mem::take(&mut r.slots);
        let (kv_len, cached) = (r.kv_len, r.cached_len);
        if self.config.enable_prefix_cache {
            let ns = r.params.namespace.as_deref();
            let already = self.tree.insert(&r.tokens[..kv_len], &slots[..kv_len], ns, r.params.priority);
            let already = already.expect("token and slot lists have equal length");
            // ours among the already-cached part are duplicates; past kv_len nothing was written
            self.pool.free(&slots[cached..already.max(cached)]).expect("duplicate slots were ours");
            self.pool.free(&slots[kv_len.max(cached)..]).expect("unwritten slots were ours");
            if let Some(node) = r.node.take() {
                self.tree.unlock(node).expect("the request's lock is live");
            }
        } else {
            self.pool.free(&slots).expect("the request's slots were ours");
        }
        r.kv_len = 0;
        r.cached_len = 0;
    }

    // ---- finishing ----

    /// Removes a request, handing its KV to the cache; returns its closing facts.
    pub(super) fn finish(&mut self, rid: u64, reason: FinishReason) -> Finished {
        if self.running.contains(&rid) {
            self.release_kv(rid);
            self.running.retain(|&r| r != rid);
        } else {
            self.waiting.retain(|&w| w != rid);
            for followers in self.followers.values_mut() {
                followers.retain(|&f| f != rid);
            }
            self.followers.retain(|_, f| !f.is_empty());
        }
        if let Some(mut followers) = self.followers.remove(&rid) {
            // it ended before its prompt was cached: the next sample leads instead
            let next = followers.remove(0);
            self.waiting.push_front(next);
            if !followers.is_empty() {
                self.followers.insert(next, followers);
            }
        }
        let r = self.requests.remove(&rid).expect("finishing a live request");
        self.latencies.e2e_s.push(r.arrival.elapsed().as_secs_f64());
        self.stats.finished += 1;
        if matches!(reason, FinishReason::Error { .. }) {
            self.stats.errors += 1;
        }
        Finished {
            reason,
            prompt_tokens: r.prompt_len,
            cached_tokens: r.cached_prompt_tokens.unwrap_or(0),
            completion_tokens: r.generated(),
        }
    }

    /// Finishes a request outside a step; its output waits for the next commit.
    pub(super) fn finish_pending(&mut self, rid: u64, reason: FinishReason, text: String) {
        let fin = self.finish(rid, reason);
        self.pending.push(rid, text, Some(fin));
    }
}

impl Engine {
    // ---- observation ----

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    pub fn take_latencies(&mut self) -> LatencySamples {
        std::mem::take(&mut self.latencies)
    }

    pub fn load(&self) -> super::stats::Load {
        let sizes = self.tree.sizes();
        super::stats::Load {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_used: self.pool.capacity() - self.pool.num_free(),
            kv_capacity: self.pool.capacity(),
            cached_tokens: sizes.total,
            evictable_tokens: sizes.evictable,
            running_loras: self.lora_names(&self.running),
            waiting_loras: self.lora_names(&self.waiting),
            max_loras: self.config.max_loras,
        }
    }

    /// The adapters of `rids`, by name, each once, in the order first met.
    fn lora_names<'a>(&self, rids: impl IntoIterator<Item = &'a u64>) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for rid in rids {
            if let Some(l) = self.requests.get(rid).and_then(|r| r.params.lora.as_ref()) {
                if !names.iter().any(|n| **n == *l.name) {
                    names.push(l.name.to_string());
                }
            }
        }
        names
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    pub fn has_work(&self) -> bool {
        !self.requests.is_empty() || !self.pending.is_empty()
    }

    /// Drops the prefix cache. Refused (false) while any request runs, since running
    /// requests hold locks in it. With KV events on, a router sees one `AllBlocksCleared`
    /// (as vLLM sends on a prefix-cache reset), not a removal per block.
    pub fn flush_cache(&mut self) -> bool {
        if !self.running.is_empty() || !self.in_flight.is_empty() {
            return false;
        }
        if self.tree.sizes().protected == 0 {
            let freed = self.tree.all_kv_slots();
            self.tree.reset();
            self.pool.free(&freed).expect("the cache held a slot the pool holds as free");
        } else {
            // a lock outlived its request (a bug elsewhere): drop what can be dropped
            let freed = self.tree.evict(usize::MAX);
            self.pool.free(&freed).expect("the cache returned a slot the pool holds as free");
        }
        tracing::debug!("prefix cache flushed");
        if let Some(t) = &mut self.trace {
            t.on_flush();
        }
        true
    }

    /// The prefix cache's KV events since the last call, oldest first (empty unless
    /// `kv_events` is on).
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.tree.take_events()
    }

    /// The running requests, in the order their plan entries come.
    pub fn running_rids(&self) -> &[u64] {
        &self.running
    }

    /// The waiting requests, in queue order (samples waiting for their leader not included).
    pub fn waiting_rids(&self) -> impl Iterator<Item = u64> + '_ {
        self.waiting.iter().copied()
    }

    /// Takes a free slot and forgets it: a leak, for the tests of the checks that find one.
    #[cfg(test)]
    pub(crate) fn leak_slot_for_test(&mut self) {
        let mut taken = Vec::new();
        assert!(self.pool.alloc_into(1, &mut taken), "a free slot to leak");
    }
}
