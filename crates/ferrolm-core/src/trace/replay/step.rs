//! One replayed call or step: submits, aborts, a step's plan and its commit with the
//! recorded tokens, and what each batch of outputs says against the recording.

use std::collections::HashSet;

use crate::engine::{BatchPlan, Constraint, RequestParams, StepOutputs};

use super::super::format::{At, PlanEntry, RecordedConstraint};
use super::{reason_key, rid_list, same_reason, Ending, Replayer, MAX_LISTED};

impl Replayer<'_> {
    // ---- calls ----

    pub(super) fn submit(
        &mut self,
        rids: &[u64],
        prompt: &[u32],
        params: &RequestParams,
        constraint: &RecordedConstraint,
    ) {
        let mut params = params.clone();
        params.queue_timeout_s = None; // applied from the recording (see `expiries`)
        let constraint = match constraint {
            RecordedConstraint::AllowedTokens(ids) => Some(Constraint::AllowedTokens(ids.clone())),
            _ => None,
        };
        self.s.requests += rids.len();
        match self.engine.submit_samples(rids, prompt, params, constraint) {
            Ok(()) => self.live.extend(rids),
            Err(e) => {
                self.s.refused += rids.len();
                self.notes.push(format!("refused {}: {e}", rid_list(rids)));
            }
        }
    }

    pub(super) fn abort(&mut self, rid: u64) {
        if self.engine.abort(rid) {
            let out = self.engine.take_outputs();
            self.take(&out);
        }
    }

    pub(super) fn end(&mut self, rid: u64, why: Ending) {
        self.ending.insert(rid, why);
        self.abort(rid);
    }

    /// Applies the recorded queue timeouts that are due.
    pub(super) fn expire(&mut self, due: impl Fn(&At) -> bool) {
        let (now, later): (Vec<_>, Vec<_>) = self.expiries.drain(..).partition(|(_, at)| due(at));
        self.expiries = later;
        for (rid, _) in now {
            if self.live.contains(&rid) {
                self.end(rid, Ending::AsRecorded);
            }
        }
    }

    /// Schedules a step (committing one left in flight first); compares its plan with the
    /// recorded one when given. Returns the plan's token count.
    pub(super) fn schedule(&mut self, recorded: Option<&[PlanEntry]>) -> usize {
        self.commit(None);
        let before: Vec<u64> = self.engine.running_rids().to_vec();
        let plan = match self.engine.schedule() {
            Ok(plan) => plan,
            Err(e) => {
                self.violation(format!("step {}: schedule failed: {e}", self.s.steps));
                return 0;
            }
        };
        let entries = plan_entries(&plan);
        if let Some(recorded) = recorded {
            self.s.compared_steps += 1;
            if recorded != entries.as_slice() {
                self.s.diverged_steps += 1;
                let d = format!(
                    "step {}: recorded [{}], replayed [{}]",
                    self.s.steps,
                    describe_plan(recorded),
                    describe_plan(&entries)
                );
                self.notes.push("DIVERGED from the recording".into());
                self.s.first_divergence.get_or_insert(d);
            }
        }
        let after: HashSet<u64> = self.engine.running_rids().iter().copied().collect();
        let mut retracted: Vec<u64> = before.iter().copied().filter(|r| !after.contains(r)).collect();
        if !retracted.is_empty() {
            // those that left the batch for the queue (not those that ended)
            retracted.retain(|r| self.engine.waiting_rids().any(|w| w == *r));
        }
        let before: HashSet<u64> = before.into_iter().collect();
        let mut prefill = Vec::new();
        let mut decodes = 0;
        let mut drafts = Vec::new();
        for (e, &drafted) in entries.iter().zip(&plan.drafted) {
            let admitted = !before.contains(&e.rid);
            if admitted {
                self.s.admissions += 1;
            }
            if !e.samples {
                self.s.prefill_chunks += 1;
            }
            if drafted > 0 && !admitted {
                decodes += 1;
                drafts.push(format!("r{} {}", e.rid, drafted));
            } else if admitted || e.len > 1 || !e.samples {
                let mut d = format!("r{} {}+{}", e.rid, e.start, e.len);
                if admitted && e.start > 0 {
                    d += &format!(" hit {}", e.start);
                }
                if !e.samples {
                    d += " chunk";
                }
                prefill.push(d);
            } else {
                decodes += 1;
            }
        }
        if self.verbose {
            let mut n = format!("{} req {} tok", plan.num_requests(), plan.num_tokens());
            if !prefill.is_empty() {
                n += &format!(" | prefill {}", prefill.join(", "));
            }
            if decodes > 0 {
                n += &format!(" | decode {decodes}");
            }
            if !drafts.is_empty() {
                n += &format!(" | drafts {}", drafts.join(", "));
            }
            if !retracted.is_empty() {
                n += &format!(" | retract {}", rid_list(&retracted));
            }
            self.notes.insert(0, n);
        }
        self.s.peak_running = self.s.peak_running.max(after.len());
        let tokens = plan.num_tokens();
        self.idle_steps = if plan.is_empty() { self.idle_steps + 1 } else { 0 };
        if plan.is_empty() {
            let out = self.engine.take_outputs();
            self.take(&out);
            self.end_step();
        } else {
            self.in_flight = Some(plan);
        }
        tokens
    }

    /// Commits the step in flight, if any, with the recorded tokens (or fails it).
    pub(super) fn commit(&mut self, failure: Option<&str>) {
        let Some(plan) = self.in_flight.take() else { return };
        let result = match failure {
            Some(message) => Ok(self.engine.fail_step(message)),
            None => {
                // a token per logit row: a draft's rows get the recorded tokens in turn
                // (the core keeps the draft's tokens while they agree)
                let mut tokens = Vec::with_capacity(plan.logit_rows.len());
                for ((&rid, &samples), &drafted) in plan.rids.iter().zip(&plan.samples).zip(&plan.drafted) {
                    for j in 0..=drafted as usize {
                        tokens.push(self.token_at(rid, samples, j));
                    }
                }
                self.engine.commit_tokens(&tokens)
            }
        };
        match result {
            Ok(out) => self.take(&out),
            Err(e) => self.violation(format!("step {}: commit failed: {e}", self.s.steps)),
        }
        // ends the fake model cannot produce, where the recording has them
        for &rid in &plan.rids {
            if !self.live.contains(&rid) {
                continue;
            }
            let Some(e) = self.expected.get(&rid) else { continue };
            if e.finish.is_some()
                && !e.ends_by_itself()
                && self.produced.get(&rid).copied().unwrap_or(0) >= e.tokens.len()
            {
                self.end(rid, Ending::AsRecorded);
            }
        }
        self.end_step();
    }

    /// The recorded token `ahead` places after what `rid` has produced (a stand-in
    /// where the recording has none).
    pub(super) fn token_at(&mut self, rid: u64, samples: bool, ahead: usize) -> u32 {
        if !samples {
            return 0; // not read
        }
        let e = self.expected.entry(rid).or_default();
        let i = self.produced.get(&rid).copied().unwrap_or(0) + ahead;
        match e.tokens.get(i) {
            Some(&t) => t,
            None => {
                // a request ended by its grammar or sampling drew no token in its last step
                let ended_here = e.finish.is_some() && !e.ends_by_itself();
                if !ended_here && ahead == 0 {
                    self.s.missing_tokens += 1;
                }
                self.stand_in
            }
        }
    }

    /// Takes in a batch of outputs: tokens, finishes, and how they compare.
    pub(super) fn take(&mut self, out: &StepOutputs) {
        for i in 0..out.len() {
            let rid = out.rids[i];
            let n = (out.token_offsets[i + 1] - out.token_offsets[i]) as usize;
            *self.produced.entry(rid).or_default() += n;
            let Some(fin) = &out.finished[i] else { continue };
            self.live.remove(&rid);
            let expected = self.expected.get(&rid).and_then(|e| e.finish.clone());
            let ending = self.ending.remove(&rid);
            let key = match (ending, &expected) {
                (Some(Ending::AsRecorded), Some(f)) => {
                    self.s.enforced_ends += 1;
                    reason_key(&f.reason)
                }
                (Some(Ending::CutOff), _) => {
                    self.s.cut_off += 1;
                    reason_key(&fin.reason)
                }
                _ => reason_key(&fin.reason),
            };
            if self.verbose {
                self.notes.push(format!("finish r{rid} {key}"));
            }
            *self.s.finishes.entry(key).or_default() += 1;
            let mismatch = match &expected {
                None => None, // cut off by the end of the recording
                Some(f) if ending.is_none() && !same_reason(&f.reason, &fin.reason) => Some(format!(
                    "request {rid} ended with {}, recorded {}",
                    reason_key(&fin.reason),
                    reason_key(&f.reason)
                )),
                Some(f) if f.cached_tokens != fin.cached_tokens => Some(format!(
                    "request {rid} found {} prompt tokens cached, recorded {}",
                    fin.cached_tokens, f.cached_tokens
                )),
                Some(_) => None,
            };
            if let Some(m) = mismatch {
                self.s.finish_mismatches += 1;
                self.s.first_mismatch.get_or_insert(m);
            }
        }
    }

    pub(super) fn end_step(&mut self) {
        let step = self.s.steps;
        self.s.steps += 1;
        if self.check_every > 0 && self.s.steps % self.check_every == 0 {
            self.check(step);
        }
        let load = self.engine.load();
        self.s.peak_kv_used = self.s.peak_kv_used.max(load.kv_used);
        if self.verbose {
            let t = self.clock.map(|c| format!(" t={c:.3}")).unwrap_or_default();
            let notes = std::mem::take(&mut self.notes).join(" | ");
            (self.log)(&format!(
                "step {step}{t}: {notes} | kv {}/{} used, {} cached | waiting {} running {}",
                load.kv_used, load.kv_capacity, load.cached_tokens, load.waiting, load.running
            ));
        } else {
            self.notes.clear();
        }
    }

    pub(super) fn check(&mut self, step: u64) {
        self.s.kv_checks += 1;
        if let Err(m) = self.engine.check_invariants() {
            self.violation(format!("after step {step}: {m}"));
        }
    }

    pub(super) fn violation(&mut self, message: String) {
        self.s.violation_count += 1;
        if self.s.violations.len() < MAX_LISTED {
            self.s.violations.push(message);
        }
    }
}

fn plan_entries(plan: &BatchPlan) -> Vec<PlanEntry> {
    (0..plan.num_requests())
        .map(|b| {
            let (a, z) = (plan.qo_offsets[b] as usize, plan.qo_offsets[b + 1] as usize);
            PlanEntry {
                rid: plan.rids[b],
                start: plan.positions[a] as usize,
                len: z - a,
                samples: plan.samples[b],
            }
        })
        .collect()
}

fn describe_plan(plan: &[PlanEntry]) -> String {
    plan.iter()
        .map(|e| format!("r{} {}+{}{}", e.rid, e.start, e.len, if e.samples { "" } else { " chunk" }))
        .collect::<Vec<_>>()
        .join(", ")
}
