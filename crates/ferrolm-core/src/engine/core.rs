//! The engine core: `submit`, `schedule`, `commit`, `abort`. Everything a step needs
//! except the forward pass: admission under token and KV budgets, chunked prefill,
//! eviction then retraction under KV pressure, sampling, grammar masks, detokenization,
//! stop conditions, and handing finished sequences to the prefix cache.
//!
//! A request is a token list (prompt, then output) of which the first `kv_len` have KV
//! in the pool. Every step runs `tokens[kv_len..end]` for some `end`; when `end` reaches
//! the last token, the step's logits give the next one. Prefill, chunked prefill, decode
//! and resuming a retracted request are all that one rule.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crate::detok::{Detokenizer, StopReason, TokenBytes};
use crate::radix::{RadixTree, TreeConfig};
use crate::sampling::{RequestRng, Sampled, Sampler};

use super::config::{EngineConfig, SchedulePolicy};
use super::constraint::TokenConstraint;
use super::kv_slots::SlotPool;
use super::plan::{BatchPlan, Finished, StepOutputs};
use super::request::{FinishReason, Request, RequestParams};
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

fn invalid(field: &'static str, message: String) -> EngineError {
    EngineError::InvalidRequest { field, message }
}

struct InFlight {
    rid: u64,
    end: usize,
    samples: bool,
    is_prefill: bool,
}

pub struct Engine {
    config: EngineConfig,
    vocab: Arc<dyn TokenBytes + Send + Sync>,
    tree: RadixTree,
    pool: SlotPool,
    requests: HashMap<u64, Request>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    in_flight: Vec<InFlight>,
    /// Outputs of aborts, timeouts and refusals not yet handed out.
    pending: StepOutputs,
    seeds: RequestRng,
    mask: Vec<u32>,
    /// One row of sampling weights, reused by every request's draw.
    scratch: Vec<f32>,
    pub(crate) stats: EngineStats,
    latencies: LatencySamples,
}

impl Engine {
    pub fn new(config: EngineConfig, vocab: Arc<dyn TokenBytes + Send + Sync>) -> Result<Self, String> {
        config.validate()?;
        let tree = RadixTree::new(TreeConfig { policy: config.eviction_policy, ..TreeConfig::default() })
            .map_err(|e| e.to_string())?;
        Ok(Engine {
            pool: SlotPool::new(config.kv_capacity),
            tree,
            vocab,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: Vec::new(),
            pending: StepOutputs::new(),
            seeds: RequestRng::new(config.seed),
            mask: vec![0; config.vocab_size.div_ceil(32)],
            scratch: Vec::with_capacity(config.vocab_size),
            stats: EngineStats::default(),
            latencies: LatencySamples::default(),
            config,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    // ---- submit and abort ----

    /// Queues a request. Checks everything about it first; an error changes nothing.
    pub fn submit(
        &mut self,
        rid: u64,
        prompt: &[u32],
        params: RequestParams,
        constraint: Option<Box<dyn TokenConstraint>>,
    ) -> Result<(), EngineError> {
        self.check_request(rid, prompt, &params)?;
        let seed = self.seeds.next_u64();
        let now = Instant::now();
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
            constraint,
            arrival: now,
            queued_at: now,
            first_token_at: None,
            last_token_at: None,
            cached_prompt_tokens: None,
            retractions: 0,
            aborted: false,
        };
        self.requests.insert(rid, request);
        self.waiting.push_back(rid);
        Ok(())
    }

    fn check_request(&self, rid: u64, prompt: &[u32], p: &RequestParams) -> Result<(), EngineError> {
        let c = &self.config;
        if self.requests.contains_key(&rid) {
            return Err(EngineError::DuplicateRid(rid));
        }
        if prompt.is_empty() {
            return Err(invalid("input_ids", "the prompt is empty".into()));
        }
        if let Some((i, t)) = prompt.iter().enumerate().find(|(_, &t)| t as usize >= c.vocab_size) {
            return Err(invalid(
                "input_ids",
                format!("input_ids[{i}] = {t} is outside the vocabulary (size {})", c.vocab_size),
            ));
        }
        if prompt.len() >= c.max_context {
            return Err(invalid(
                "input_ids",
                format!("the prompt has {} tokens; the context length is {}", prompt.len(), c.max_context),
            ));
        }
        if p.max_new_tokens == 0 {
            return Err(invalid("max_new_tokens", "must be at least 1".into()));
        }
        if prompt.len() + p.max_new_tokens > c.max_context {
            return Err(invalid(
                "max_new_tokens",
                format!(
                    "the prompt ({} tokens) plus max_new_tokens ({}) exceeds the context length {}",
                    prompt.len(),
                    p.max_new_tokens,
                    c.max_context
                ),
            ));
        }
        if prompt.len() + 1 > c.kv_capacity {
            return Err(invalid(
                "input_ids",
                format!("the prompt has {} tokens; the KV pool holds {}", prompt.len(), c.kv_capacity),
            ));
        }
        if p.min_new_tokens > p.max_new_tokens {
            return Err(invalid(
                "min_new_tokens",
                format!("{} is above max_new_tokens ({})", p.min_new_tokens, p.max_new_tokens),
            ));
        }
        p.sampling.validate(c.vocab_size).map_err(|e| invalid(e.field, e.message))?;
        if let Some(&t) = p.stops.stop_token_ids.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(invalid(
                "stop_token_ids",
                format!("{t} is outside the vocabulary (size {})", c.vocab_size),
            ));
        }
        if p.stops.stop_strings.iter().any(String::is_empty) {
            return Err(invalid("stop", "stop strings must not be empty".into()));
        }
        if let Some(t) = p.queue_timeout_s {
            if !(t.is_finite() && t > 0.0) {
                return Err(invalid(
                    "queue_timeout",
                    format!("must be a positive number of seconds, got {t}"),
                ));
            }
        }
        Ok(())
    }

    /// Ends a request wherever it is; its output (reason `Abort`) comes with the next
    /// `commit` or `take_outputs`. False if the engine does not know the rid.
    pub fn abort(&mut self, rid: u64) -> bool {
        let Some(r) = self.requests.get_mut(&rid) else { return false };
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
        std::mem::replace(&mut self.pending, StepOutputs::new())
    }

    // ---- schedule ----

    /// Picks this step's work. Every running request gets its next token or prompt chunk
    /// (decode is never starved by prompts); waiting requests join in policy order while
    /// the step's prefill budget, `max_running_requests` and the KV pool allow.
    pub fn schedule(&mut self) -> Result<BatchPlan, EngineError> {
        if !self.in_flight.is_empty() {
            return Err(EngineError::Protocol("schedule called twice without commit".into()));
        }
        self.expire_waiting(Instant::now());
        self.make_room_for_decodes();
        let mut plan = BatchPlan { qo_offsets: vec![0], kv_offsets: vec![0], ..BatchPlan::default() };
        let mut budget = self.config.max_prefill_tokens;
        for i in 0..self.running.len() {
            let rid = self.running[i];
            let r = &self.requests[&rid];
            let todo = r.tokens.len() - r.kv_len;
            let is_decode = todo == 1 && r.kv_len >= r.prompt_len;
            // a decode's slot was made room for; prompt chunks share the prefill budget
            let n = if is_decode { 1 } else { todo.min(budget) };
            if n == 0 || !self.reserve_slots(rid, n) {
                continue;
            }
            if !is_decode {
                budget -= n;
            }
            self.add_to_plan(&mut plan, rid, n, !is_decode);
        }
        self.admit(&mut plan, &mut budget);
        if plan.is_empty() && self.running.len() > 1 {
            // Running prompts that cannot get slots while nothing decodes would wait on
            // each other forever: give one's KV back and try again.
            let victim = self.retraction_victim();
            self.retract(victim);
            return self.schedule();
        }
        self.stats.steps += 1;
        Ok(plan)
    }

    /// Allocates `n` more slots for a running request's next tokens (evicting from the
    /// cache if the pool is short). False, taking nothing, if they cannot be had.
    fn reserve_slots(&mut self, rid: u64, n: usize) -> bool {
        self.evict_until_free(n);
        let r = self.requests.get_mut(&rid).expect("running request exists");
        self.pool.alloc_into(n, &mut r.slots)
    }

    fn evict_until_free(&mut self, n: usize) {
        if self.pool.num_free() < n {
            let freed = self.tree.evict(n - self.pool.num_free());
            self.pool.free(&freed).expect("the cache returned a slot the pool holds as free");
        }
    }

    fn add_to_plan(&mut self, plan: &mut BatchPlan, rid: u64, n: usize, is_prefill: bool) {
        let r = &self.requests[&rid];
        let (start, end) = (r.kv_len, r.kv_len + n);
        plan.rids.push(rid);
        plan.input_ids.extend_from_slice(&r.tokens[start..end]);
        plan.positions.extend(start as u32..end as u32);
        plan.out_slots.extend_from_slice(&r.slots[start..end]);
        plan.qo_offsets.push(plan.input_ids.len() as u32);
        plan.kv_slots.extend_from_slice(&r.slots[..end]);
        plan.kv_offsets.push(plan.kv_slots.len() as u32);
        let samples = end == r.tokens.len();
        plan.samples.push(samples);
        plan.is_prefill.push(is_prefill);
        self.in_flight.push(InFlight { rid, end, samples, is_prefill });
    }

    /// Frees pool slots for every decoding request: from the cache first, then by
    /// retracting running requests (those with the most left to generate go first).
    fn make_room_for_decodes(&mut self) {
        loop {
            let need = self
                .running
                .iter()
                .filter(|rid| {
                    let r = &self.requests[*rid];
                    r.tokens.len() - r.kv_len == 1 && r.kv_len >= r.prompt_len
                })
                .count();
            self.evict_until_free(need);
            if self.pool.num_free() >= need {
                return;
            }
            let victim = self.retraction_victim();
            if self.running.len() == 1 {
                let r = &self.requests[&victim];
                let msg = format!(
                    "the KV pool ({} slots) cannot hold this request's {} tokens",
                    self.config.kv_capacity,
                    r.tokens.len()
                );
                let text = self.requests.get_mut(&victim).unwrap().detok.flush();
                self.finish_pending(victim, FinishReason::Error(msg), text);
                return;
            }
            self.retract(victim);
        }
    }

    /// The running request with the most left to generate (the latest arrival on ties):
    /// retracting it frees room for the longest time.
    fn retraction_victim(&self) -> u64 {
        self.running
            .iter()
            .copied()
            .max_by_key(|rid| {
                let r = &self.requests[rid];
                (r.remaining(), r.arrival)
            })
            .expect("retraction needs a running request")
    }

    /// Takes a running request off the batch, keeping its tokens: its computed KV goes to
    /// the cache, so it resumes through a prefix hit.
    fn retract(&mut self, rid: u64) {
        self.release_kv(rid);
        self.running.retain(|&r| r != rid);
        let r = self.requests.get_mut(&rid).unwrap();
        r.retractions += 1;
        r.queued_at = Instant::now();
        self.waiting.push_front(rid);
        self.stats.retractions += 1;
        tracing::debug!(rid, "retracted under KV pressure");
    }

    /// Hands a request's KV to the cache (or the pool) and drops its lock.
    fn release_kv(&mut self, rid: u64) {
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

    fn expire_waiting(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .waiting
            .iter()
            .copied()
            .filter(|rid| {
                let r = &self.requests[rid];
                r.retractions == 0
                    && r.params
                        .queue_timeout_s
                        .is_some_and(|t| now.duration_since(r.queued_at).as_secs_f64() > t)
            })
            .collect();
        for rid in expired {
            let t = self.requests[&rid].params.queue_timeout_s.unwrap();
            self.finish_pending(
                rid,
                FinishReason::Error(format!("waited in the queue longer than {t} s")),
                String::new(),
            );
        }
    }

    fn admission_order(&mut self) -> Vec<u64> {
        let mut order: Vec<u64> = self.waiting.iter().copied().collect();
        match self.config.schedule_policy {
            SchedulePolicy::Fcfs => {}
            SchedulePolicy::Priority => {
                order.sort_by_key(|rid| std::cmp::Reverse(self.requests[rid].params.priority))
            }
            SchedulePolicy::Lpm if self.config.enable_prefix_cache => {
                let mut hits: HashMap<u64, usize> = HashMap::new();
                for &rid in &order {
                    let r = &self.requests[&rid];
                    let m = self
                        .tree
                        .match_prefix(&r.tokens[..r.tokens.len() - 1], r.params.namespace.as_deref());
                    hits.insert(rid, m.length);
                }
                order.sort_by_key(|rid| std::cmp::Reverse(hits[rid]));
            }
            SchedulePolicy::Lpm => {}
        }
        order
    }

    fn admit(&mut self, plan: &mut BatchPlan, budget: &mut usize) {
        for rid in self.admission_order() {
            if self.running.len() >= self.config.max_running_requests {
                break;
            }
            let r = &self.requests[&rid];
            // at least one token must run to produce logits
            let lookup = &r.tokens[..r.tokens.len() - 1];
            let (matched, cached_slots, node) = if self.config.enable_prefix_cache {
                let m = self.tree.match_prefix(lookup, r.params.namespace.as_deref());
                (m.length, m.kv_slots, Some(m.node))
            } else {
                (0, Vec::new(), None)
            };
            let uncached = r.tokens.len() - matched;
            let fast_lane = uncached <= self.config.fast_lane_tokens;
            if *budget == 0 && !fast_lane {
                break;
            }
            let chunk = if fast_lane { uncached } else { uncached.min(*budget) };
            if let Some(node) = node {
                self.tree.lock(node).expect("a fresh match's node is live");
            }
            let ratio = self.config.new_token_ratio;
            let reserved: usize = self
                .running
                .iter()
                .map(|rid| {
                    let r = &self.requests[rid];
                    // slots still to allocate for its known tokens, plus a share of its future
                    r.tokens.len().saturating_sub(r.slots.len())
                        + (r.remaining() as f64 * ratio).ceil() as usize
                })
                .sum();
            let wanted = uncached + (r.remaining() as f64 * ratio).ceil() as usize;
            let available = self.pool.num_free() + self.tree.sizes().evictable;
            if wanted + reserved > available {
                if let Some(node) = node {
                    self.tree.unlock(node).expect("just locked");
                }
                break;
            }
            self.evict_until_free(chunk);
            let r = self.requests.get_mut(&rid).unwrap();
            r.slots = cached_slots;
            assert!(self.pool.alloc_into(chunk, &mut r.slots), "room was checked");
            r.cached_len = matched;
            r.kv_len = matched;
            r.node = node;
            if r.cached_prompt_tokens.is_none() {
                r.cached_prompt_tokens = Some(matched.min(r.prompt_len));
                self.stats.prompt_tokens += r.prompt_len as u64;
                self.stats.cache_hit_tokens += matched.min(r.prompt_len) as u64;
                self.latencies.queue_s.push(r.arrival.elapsed().as_secs_f64());
            }
            self.waiting.retain(|&w| w != rid);
            self.running.push(rid);
            *budget -= chunk.min(*budget);
            let is_prefill = !(chunk == 1 && matched >= self.requests[&rid].prompt_len);
            self.add_to_plan(plan, rid, chunk, is_prefill);
        }
    }

    // ---- commit ----

    /// Consumes the step's logits (`[plan.num_requests(), width]`, row b for request b,
    /// `width >= vocab_size`; modified in place) and advances every request in the plan.
    pub fn commit(&mut self, logits: &mut [f32], width: usize) -> Result<StepOutputs, EngineError> {
        let rows = self.in_flight.len();
        if width < self.config.vocab_size || logits.len() != rows * width {
            return Err(EngineError::Protocol(format!(
                "logits must have shape [{rows}, >= {}], got {} values with rows of {width}",
                self.config.vocab_size,
                logits.len()
            )));
        }
        let in_flight = std::mem::take(&mut self.in_flight);
        let mut out = std::mem::replace(&mut self.pending, StepOutputs::new());
        let vocab = self.config.vocab_size;
        let drawn = self.draw_all(&in_flight, logits, width);
        for ((i, f), d) in in_flight.iter().enumerate().zip(drawn) {
            let row = &mut logits[i * width..i * width + vocab];
            self.advance_with(f, row, &mut out, None, d);
        }
        out.extend(std::mem::replace(&mut self.pending, StepOutputs::new()));
        Ok(out)
    }

    /// Same as `commit` for a runner that sampled on its own (e.g. on a GPU): one token
    /// per plan entry that samples, in plan order (ignored for entries that do not).
    pub fn commit_tokens(&mut self, tokens: &[u32]) -> Result<StepOutputs, EngineError> {
        if tokens.len() != self.in_flight.len() {
            return Err(EngineError::Protocol(format!(
                "expected {} tokens (one per plan entry), got {}",
                self.in_flight.len(),
                tokens.len()
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(EngineError::Protocol(format!("token {t} is outside the vocabulary")));
        }
        // A one-hot row turns the given token into the argmax of a greedy pick.
        let vocab = self.config.vocab_size;
        let mut row = vec![f32::NEG_INFINITY; vocab];
        let in_flight = std::mem::take(&mut self.in_flight);
        let mut out = std::mem::replace(&mut self.pending, StepOutputs::new());
        for (f, &t) in in_flight.iter().zip(tokens) {
            row[t as usize] = 0.0;
            self.advance_with(f, &mut row, &mut out, Some(t), None);
            row[t as usize] = f32::NEG_INFINITY;
        }
        out.extend(std::mem::replace(&mut self.pending, StepOutputs::new()));
        Ok(out)
    }

    /// Samples the rows of every entry that samples, split across two threads when the
    /// batch is large enough to pay for one: rows, samplers and grammars are per request,
    /// so the draws are independent. Returns each entry's draw (or `None`).
    fn draw_all(
        &mut self,
        in_flight: &[InFlight],
        logits: &mut [f32],
        width: usize,
    ) -> Vec<Option<Result<Sampled, String>>> {
        const PARALLEL_FROM: usize = 16;
        let vocab = self.config.vocab_size;
        let index: HashMap<u64, usize> =
            in_flight.iter().enumerate().filter(|(_, f)| f.samples).map(|(i, f)| (f.rid, i)).collect();
        let mut rows: Vec<Option<&mut [f32]>> =
            logits.chunks_mut(width).map(|r| Some(&mut r[..vocab])).collect();
        let mut work: Vec<(usize, &mut Request, &mut [f32])> = Vec::with_capacity(index.len());
        for (rid, r) in self.requests.iter_mut() {
            if let Some(&i) = index.get(rid) {
                if !r.aborted {
                    work.push((i, r, rows[i].take().expect("one row per entry")));
                }
            }
        }
        let mut drawn: Vec<Option<Result<Sampled, String>>> = (0..in_flight.len()).map(|_| None).collect();
        if work.len() < PARALLEL_FROM {
            return drawn; // sampled one by one in advance_with, with the engine's buffers
        }
        let eos = &self.config.eos_token_ids;
        let half = work.len() / 2;
        let (mine, theirs) = work.split_at_mut(half);
        let (mask, scratch) = (&mut self.mask, &mut self.scratch);
        let (a, b) = std::thread::scope(|scope| {
            let other = scope.spawn(move || {
                let (mut mask, mut scratch) = (vec![0u32; vocab.div_ceil(32)], Vec::with_capacity(vocab));
                theirs
                    .iter_mut()
                    .map(|(i, r, row)| (*i, draw(r, row, eos, None, &mut mask, &mut scratch)))
                    .collect::<Vec<_>>()
            });
            let here: Vec<_> =
                mine.iter_mut().map(|(i, r, row)| (*i, draw(r, row, eos, None, mask, scratch))).collect();
            (here, other.join().expect("sampling thread"))
        });
        for (i, d) in a.into_iter().chain(b) {
            drawn[i] = Some(d);
        }
        drawn
    }

    /// Advances one plan entry: `drawn` is its token when it was sampled ahead (in
    /// parallel), else it is sampled here (or `forced`).
    fn advance_with(
        &mut self,
        f: &InFlight,
        row: &mut [f32],
        out: &mut StepOutputs,
        forced: Option<u32>,
        drawn: Option<Result<Sampled, String>>,
    ) {
        let Some(r) = self.requests.get_mut(&f.rid) else { return };
        r.kv_len = f.end;
        if r.aborted {
            let text = r.detok.flush();
            let fin = self.finish(f.rid, FinishReason::Abort);
            out.push(f.rid, text, Some(fin));
            return;
        }
        if !f.samples {
            return;
        }
        if f.is_prefill && self.config.enable_prefix_cache {
            self.cache_prefill(f.rid);
        }
        let Some(r) = self.requests.get_mut(&f.rid) else { return };
        let stops_active = r.generated() >= r.params.min_new_tokens;
        let sampled = match drawn {
            Some(d) => d,
            None => draw(r, row, &self.config.eos_token_ids, forced, &mut self.mask, &mut self.scratch),
        };
        let sampled = match sampled {
            Ok(s) => s,
            Err(msg) => {
                let text = r.detok.flush();
                let fin = self.finish(f.rid, FinishReason::Error(msg));
                out.push(f.rid, text, Some(fin));
                return;
            }
        };
        let token = sampled.token;
        if let Some(c) = &mut r.constraint {
            if !c.accept_token(token) {
                let text = r.detok.flush();
                let fin =
                    self.finish(f.rid, FinishReason::Error(format!("the grammar rejected token {token}")));
                out.push(f.rid, text, Some(fin));
                return;
            }
        }
        r.sampler.observe(token);
        r.tokens.push(token);
        let now = Instant::now();
        match r.last_token_at {
            None => self.latencies.ttft_s.push(now.duration_since(r.arrival).as_secs_f64()),
            Some(prev) => self.latencies.itl_s.push(now.duration_since(prev).as_secs_f64()),
        }
        r.first_token_at.get_or_insert(now);
        r.last_token_at = Some(now);
        self.stats.generation_tokens += 1;
        let is_eos = !r.params.ignore_eos && self.config.eos_token_ids.contains(&token);
        let step = r.detok.step(&*self.vocab, token, stops_active, is_eos).unwrap_or_else(|_| {
            crate::detok::Step { delta: String::new(), stop: Some(StopReason::Token(token)) }
        });
        out.push_token(token, sampled.logprob, &sampled.top_logprobs);
        let mut text = step.delta;
        let reason = match step.stop {
            Some(stop) => Some(FinishReason::Stop(stop)),
            None if r.generated() >= r.params.max_new_tokens || r.tokens.len() >= self.config.max_context => {
                text.push_str(&r.detok.flush());
                Some(FinishReason::Length)
            }
            None => None,
        };
        let fin = reason.map(|reason| self.finish(f.rid, reason));
        out.push(f.rid, text, fin);
    }

    /// A finished prefill goes into the cache at once (not only when the request ends), so
    /// requests that arrive meanwhile with the same prefix, e.g. the other samples of an
    /// `n > 1` request, reuse it. The request then holds the tree's slots for its whole
    /// prefix and a lock on the node that ends it.
    fn cache_prefill(&mut self, rid: u64) {
        let r = self.requests.get_mut(&rid).expect("in-flight request exists");
        let (n, ns) = (r.kv_len, r.params.namespace.as_deref());
        let already = self.tree.insert(&r.tokens[..n], &r.slots[..n], ns, r.params.priority);
        let already = already.expect("token and slot lists have equal length");
        let m = self.tree.match_prefix(&r.tokens[..n], ns);
        debug_assert_eq!(m.length, n);
        // ours among the already-cached part are duplicates of the tree's (same tokens at
        // the same positions, so the same K/V): switch to the tree's and free ours
        self.pool.free(&r.slots[r.cached_len..already.max(r.cached_len)]).expect("duplicate slots were ours");
        r.slots[..n].copy_from_slice(&m.kv_slots);
        self.tree.lock(m.node).expect("a fresh match's node is live");
        if let Some(old) = r.node.replace(m.node) {
            self.tree.unlock(old).expect("the request's lock is live");
        }
        r.cached_len = n;
    }

    // ---- finishing ----

    /// Removes a request, handing its KV to the cache; returns its closing facts.
    fn finish(&mut self, rid: u64, reason: FinishReason) -> Finished {
        if self.running.contains(&rid) {
            self.release_kv(rid);
            self.running.retain(|&r| r != rid);
        } else {
            self.waiting.retain(|&w| w != rid);
        }
        let r = self.requests.remove(&rid).expect("finishing a live request");
        self.latencies.e2e_s.push(r.arrival.elapsed().as_secs_f64());
        self.stats.finished += 1;
        if matches!(reason, FinishReason::Error(_)) {
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
    fn finish_pending(&mut self, rid: u64, reason: FinishReason, text: String) {
        let fin = self.finish(rid, reason);
        self.pending.push(rid, text, Some(fin));
    }
}

/// One request's next token from its row: EOS and stop tokens suppressed where they may
/// not come yet, the grammar's mask applied, then its sampler (or the `forced` token,
/// checked against the mask).
fn draw(
    r: &mut Request,
    row: &mut [f32],
    eos_ids: &[u32],
    forced: Option<u32>,
    mask: &mut Vec<u32>,
    scratch: &mut Vec<f32>,
) -> Result<Sampled, String> {
    let stops_active = r.generated() >= r.params.min_new_tokens;
    // EOS and stop tokens are off the table before min_new_tokens (and EOS with ignore_eos)
    if r.params.ignore_eos || !stops_active {
        for &e in eos_ids {
            row[e as usize] = f32::NEG_INFINITY;
        }
    }
    if !stops_active {
        for &t in &r.params.stops.stop_token_ids {
            row[t as usize] = f32::NEG_INFINITY;
        }
    }
    let mask = match &mut r.constraint {
        Some(c) => {
            c.fill_mask(mask);
            Some(mask.as_slice())
        }
        None => None,
    };
    match forced {
        Some(t) if mask.is_none_or(|m| crate::sampling::mask_allows(m, t as usize)) => {
            Ok(Sampled { token: t, logprob: None, top_logprobs: Vec::new() })
        }
        Some(t) => Err(format!("token {t} is not allowed by the request's grammar")),
        None => r.sampler.sample_with(row, mask, scratch).map_err(|e| e.to_string()),
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
        }
    }

    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    pub fn has_work(&self) -> bool {
        !self.requests.is_empty() || !self.pending.is_empty()
    }

    /// Drops the prefix cache. Refused (false) while any request runs, since running
    /// requests hold locks in it.
    pub fn flush_cache(&mut self) -> bool {
        if !self.running.is_empty() || !self.in_flight.is_empty() {
            return false;
        }
        let freed = self.tree.evict(usize::MAX);
        self.pool.free(&freed).expect("the cache returned a slot the pool holds as free");
        true
    }

    /// KV conservation (free + cached + held by running requests == capacity, no slot
    /// twice) and the tree's own invariants. O(capacity); for tests and idle checks.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.tree.check_invariants()?;
        let mut seen = vec![false; self.pool.capacity()];
        let mut mark = |s: u32, owner: &str| -> Result<(), String> {
            let cell = seen.get_mut(s as usize).ok_or(format!("slot {s} is outside the pool ({owner})"))?;
            if *cell {
                return Err(format!("slot {s} is held twice (second holder: {owner})"));
            }
            *cell = true;
            Ok(())
        };
        for s in self.tree.all_kv_slots() {
            mark(s, "the cache")?;
        }
        for rid in &self.running {
            let r = &self.requests[rid];
            for &s in &r.slots[r.cached_len..] {
                mark(s, &format!("request {rid}"))?;
            }
        }
        for (s, held) in seen.iter().enumerate() {
            if *held == self.pool.is_free(s as u32) {
                return Err(format!(
                    "slot {s} is {} and {}",
                    if *held { "held" } else { "not held" },
                    if *held { "free" } else { "not free" }
                ));
            }
        }
        for rid in &self.waiting {
            let r = &self.requests[rid];
            if !r.slots.is_empty() || r.node.is_some() {
                return Err(format!("waiting request {rid} holds KV"));
            }
        }
        if self.waiting.len() + self.running.len() != self.requests.len() {
            return Err("a request is neither waiting nor running".into());
        }
        Ok(())
    }
}
