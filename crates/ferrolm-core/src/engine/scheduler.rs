//! Scheduling: what runs each step. Admission under token and KV budgets, chunked
//! prefill, eviction then retraction under KV pressure, queue timeouts.

use std::collections::HashMap;
use std::time::Instant;

use super::config::SchedulePolicy;
use super::core::{Engine, EngineError, InFlight};
use super::plan::BatchPlan;
use super::request::{ErrorKind, FinishReason};

impl Engine {
    // ---- schedule ----

    /// Picks this step's work. Every running request gets its next token or prompt chunk
    /// (decode is never starved by prompts); waiting requests join in policy order while
    /// the step's prefill budget, `max_running_requests` and the KV pool allow.
    pub fn schedule(&mut self) -> Result<BatchPlan, EngineError> {
        let _step = tracing::debug_span!("step", step = self.stats.steps).entered();
        let plan = self.plan_step()?;
        if let Some(t) = &mut self.trace {
            t.on_schedule(&plan);
        }
        Ok(plan)
    }

    fn plan_step(&mut self) -> Result<BatchPlan, EngineError> {
        if !self.in_flight.is_empty() {
            return Err(EngineError::Protocol("schedule called twice without commit".into()));
        }
        self.expire_waiting(Instant::now());
        let decodes = self.make_room_for_decodes();
        let mut plan = BatchPlan { qo_offsets: vec![0], kv_offsets: vec![0], ..BatchPlan::default() };
        let mut budget = self.config.max_prefill_tokens;
        // drafts take only slots that are free beyond every decode's one (never an eviction)
        let mut spare = self.pool.num_free().saturating_sub(decodes);
        for rid in self.plan_order() {
            let r = &self.requests[&rid];
            let todo = r.tokens.len() - r.kv_len;
            let is_decode = r.is_decoding();
            // a decode's slot was made room for; prompt chunks share the prefill budget
            let n = if is_decode { 1 } else { todo.min(budget) };
            if !is_decode && n > 0 && n < todo {
                tracing::debug!(rid, start = r.kv_len, tokens = n, left = todo - n, "prefill chunk");
            }
            let draft = if is_decode { self.draft_for(rid, spare) } else { Vec::new() };
            if n == 0 || !self.reserve_slots(rid, n + draft.len()) {
                continue;
            }
            spare -= draft.len();
            if !is_decode {
                budget -= n;
            }
            self.add_to_plan(&mut plan, rid, n, !is_decode, draft);
        }
        self.admit(&mut plan, &mut budget);
        if plan.is_empty() && self.running.len() > 1 {
            // Running prompts that cannot get slots while nothing decodes would wait on
            // each other forever: give one's KV back and try again.
            let victim = self.retraction_victim();
            self.retract(victim);
            return self.plan_step();
        }
        self.stats.steps += 1;
        Ok(plan)
    }

    /// The running requests in the order the plan lists them: as they arrived, and where
    /// requests run with LoRA adapters, each adapter's side by side (stable within one), so
    /// that the runner takes an adapter's rows as one run and reads its matrices once.
    fn plan_order(&self) -> Vec<u64> {
        let mut order = self.running.clone();
        let lora = |rid: &u64| self.requests[rid].params.lora.as_ref().map_or(0, |l| l.id);
        if order.iter().any(|rid| lora(rid) != 0) {
            order.sort_by_key(lora);
        }
        order
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
            tracing::debug!(
                wanted = n,
                freed = freed.len(),
                free = self.pool.num_free(),
                "evicted from the prefix cache"
            );
        }
    }

    /// This step's draft for a decoding request that speculates: at most `spare` tokens
    /// (free slots), and no more than could be kept (its `max_new_tokens`, the context);
    /// what the prefix cache holds after its tokens, else what followed its latest suffix.
    fn draft_for(&mut self, rid: u64, spare: usize) -> Vec<u32> {
        let max_context = self.config.max_context;
        let (tree, requests) = (&self.tree, &mut self.requests);
        let r = requests.get_mut(&rid).expect("running request exists");
        // the step emits the kept drafts and one token more
        let limit =
            spare.min(r.remaining().saturating_sub(1)).min(max_context.saturating_sub(r.tokens.len() + 1));
        if r.forced_token().is_some() {
            return Vec::new(); // its thinking budget decides the next token: nothing to verify
        }
        let Some(spec) = r.spec.as_mut() else { return Vec::new() };
        let (tokens, namespace) = (&r.tokens, r.params.namespace.as_deref());
        let use_cache = self.config.enable_prefix_cache;
        let mut draft = Vec::new();
        spec.draft(
            limit,
            |k, out| {
                if use_cache {
                    tree.continuation(tokens, namespace, k, out);
                }
            },
            &mut draft,
        );
        draft
    }

    /// Request `rid`'s `n` next tokens, then its `draft` (whose slots were reserved after them).
    fn add_to_plan(&mut self, plan: &mut BatchPlan, rid: u64, n: usize, is_prefill: bool, draft: Vec<u32>) {
        let r = &self.requests[&rid];
        let (start, end) = (r.kv_len, r.kv_len + n);
        let k = draft.len();
        plan.rids.push(rid);
        plan.input_ids.extend_from_slice(&r.tokens[start..end]);
        plan.input_ids.extend_from_slice(&draft);
        plan.positions.extend(start as u32..(end + k) as u32);
        plan.out_slots.extend_from_slice(&r.slots[start..end + k]);
        plan.qo_offsets.push(plan.input_ids.len() as u32);
        plan.kv_slots.extend_from_slice(&r.slots[..end + k]);
        plan.kv_offsets.push(plan.kv_slots.len() as u32);
        let last = plan.input_ids.len() as u32;
        plan.logit_rows.extend(last - 1 - k as u32..last);
        plan.drafted.push(k as u32);
        let samples = end == r.tokens.len();
        plan.samples.push(samples);
        plan.is_prefill.push(is_prefill);
        // a token forced by the thinking budget is masked in: not the bare argmax
        plan.plain_greedy.push(r.params.plain_greedy(r.constraint.is_some() || r.forced_token().is_some()));
        plan.ignore_eos.push(r.params.ignore_eos);
        plan.loras.push(r.params.lora.clone());
        self.in_flight.push(InFlight { rid, end, samples, is_prefill, draft });
    }

    /// Frees pool slots for every decoding request: from the cache first, then by
    /// retracting running requests (those with the most left to generate go first).
    /// Returns how many decode this step.
    fn make_room_for_decodes(&mut self) -> usize {
        loop {
            let need = self.running.iter().filter(|rid| self.requests[*rid].is_decoding()).count();
            self.evict_until_free(need);
            if self.pool.num_free() >= need {
                return need;
            }
            let victim = self.retraction_victim();
            if self.running.len() == 1 {
                let r = &self.requests[&victim];
                let msg = format!(
                    "the KV pool ({} slots) cannot hold this request's {} tokens",
                    self.config.kv_capacity,
                    r.tokens.len()
                );
                tracing::warn!(rid = victim, "{msg}");
                let text = self.requests.get_mut(&victim).unwrap().detok.flush();
                self.finish_pending(victim, FinishReason::error(ErrorKind::KvCapacity, msg), text);
                return 0; // it was the only one running
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
        tracing::debug!(
            rid,
            kept = r.tokens.len(),
            free = self.pool.num_free(),
            "retracted under KV pressure"
        );
    }

    fn expire_waiting(&mut self, now: Instant) {
        // a sample that leads in place of an expired one joins the queue: look again
        loop {
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
            if expired.is_empty() {
                return;
            }
            for rid in expired {
                let t = self.requests[&rid].params.queue_timeout_s.unwrap();
                let message = format!("waited in the queue longer than {t} s");
                tracing::info!(rid, timeout_s = t, "queue timeout");
                self.finish_pending(
                    rid,
                    FinishReason::error(ErrorKind::QueueTimeout, message),
                    String::new(),
                );
            }
        }
    }

    fn admission_order(&self) -> Vec<u64> {
        let mut order: Vec<u64> = self.waiting.iter().copied().collect();
        match self.config.schedule_policy {
            SchedulePolicy::Fcfs => {}
            SchedulePolicy::Priority => {
                order.sort_by_key(|rid| std::cmp::Reverse(self.requests[rid].params.priority))
            }
            SchedulePolicy::Lpm if self.config.enable_prefix_cache => {
                // a read-only look: ordering must not split nodes or count as a use
                let hits: HashMap<u64, usize> = order
                    .iter()
                    .map(|rid| {
                        let r = &self.requests[rid];
                        let ns = r.params.namespace.as_deref();
                        (*rid, self.tree.prefix_len(&r.tokens[..r.tokens.len() - 1], ns))
                    })
                    .collect();
                order.sort_by_key(|rid| std::cmp::Reverse(hits[rid]));
            }
            SchedulePolicy::Lpm => {}
        }
        order
    }

    fn admit(&mut self, plan: &mut BatchPlan, budget: &mut usize) {
        // the adapters of the batch: a request with another one waits while there are
        // `max_loras` of them (those behind it may still join)
        let mut loras: Vec<u32> = Vec::new();
        for rid in &self.running {
            if let Some(l) = &self.requests[rid].params.lora {
                if !loras.contains(&l.id) {
                    loras.push(l.id);
                }
            }
        }
        for rid in self.admission_order() {
            if self.running.len() >= self.config.max_running_requests {
                break;
            }
            let r = &self.requests[&rid];
            let new_lora = r.params.lora.as_ref().map(|l| l.id).filter(|id| !loras.contains(id));
            if new_lora.is_some() && loras.len() >= self.config.max_loras {
                continue;
            }
            // at least one token must run to produce logits
            let lookup = &r.tokens[..r.tokens.len() - 1];
            let ns = r.params.namespace.as_deref();
            let cache = self.config.enable_prefix_cache;
            // a read-only look first: a request passed over must leave the tree as it was
            let matched = if cache { self.tree.prefix_len(lookup, ns) } else { 0 };
            let uncached = r.tokens.len() - matched;
            let fast_lane = uncached <= self.config.fast_lane_tokens;
            if *budget == 0 && !fast_lane {
                // the prefill budget is spent, but a request behind this one may still
                // take the fast lane (almost all cached)
                continue;
            }
            let (cached_slots, node) = if cache {
                let m = self.tree.match_prefix(lookup, ns);
                debug_assert_eq!(m.length, matched, "prefix_len agrees with match_prefix");
                (m.kv_slots, Some(m.node))
            } else {
                (Vec::new(), None)
            };
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
            // Alone, a request may take the whole pool: keeping room for its future would
            // leave one whose prompt fits but whose max_new_tokens does not waiting forever
            // (found by replaying a trace; should it outgrow the pool, it ends with kv_capacity).
            let alone = self.running.is_empty() && uncached <= available;
            if wanted + reserved > available && !alone {
                tracing::debug!(rid, wanted, reserved, available, "admission stops: KV budget");
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
            loras.extend(new_lora);
            *budget -= chunk.min(*budget);
            if matched > 0 {
                tracing::debug!(rid, cached = matched, prompt = r.prompt_len, "prefix cache hit");
            }
            tracing::debug!(
                rid,
                cached = matched,
                tokens = chunk,
                left = uncached - chunk,
                fast_lane,
                "admitted"
            );
            let is_prefill = !(chunk == 1 && matched >= self.requests[&rid].prompt_len);
            self.add_to_plan(plan, rid, chunk, is_prefill, Vec::new());
        }
    }
}
