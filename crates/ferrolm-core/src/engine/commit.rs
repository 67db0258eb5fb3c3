//! Committing a step: sampling (in parallel for large batches), grammar masks,
//! detokenization, stop conditions, and handing finished prefills to the prefix cache.

use std::collections::HashMap;
use std::time::Instant;

use crate::detok::StopReason;
use crate::sampling::Sampled;
use crate::trace::OutputsOf;

use super::core::{Engine, EngineError, InFlight};
use super::plan::StepOutputs;
use super::request::{ErrorKind, FinishReason, Request};

impl Engine {
    // ---- commit ----

    /// Consumes the step's logits (`[plan.logit_rows.len(), width]`: one row per request,
    /// and one more per draft token of a request that verifies a draft, in plan order;
    /// `width >= vocab_size`; modified in place) and advances every request in the plan.
    pub fn commit(&mut self, logits: &mut [f32], width: usize) -> Result<StepOutputs, EngineError> {
        let rows: usize = self.in_flight.iter().map(|f| 1 + f.draft.len()).sum();
        if width < self.config.vocab_size || logits.len() != rows * width {
            return Err(EngineError::Protocol(format!(
                "logits must have shape [{rows}, >= {}], got {} values with rows of {width}",
                self.config.vocab_size,
                logits.len()
            )));
        }
        let in_flight = std::mem::take(&mut self.in_flight);
        self.step_masks.clear();
        let mut out = std::mem::replace(&mut self.pending, StepOutputs::new());
        let mut blocks: Vec<&mut [f32]> = Vec::with_capacity(in_flight.len());
        let mut rest = logits;
        for f in &in_flight {
            let (block, tail) = std::mem::take(&mut rest).split_at_mut((1 + f.draft.len()) * width);
            blocks.push(block);
            rest = tail;
        }
        let drawn = self.draw_all(&in_flight, &mut blocks);
        for ((f, block), d) in in_flight.iter().zip(blocks).zip(drawn) {
            self.advance_with(f, Rows::Logits { block, width, drawn: d }, &mut out);
        }
        out.extend(std::mem::replace(&mut self.pending, StepOutputs::new()));
        self.trace_outputs(OutputsOf::Commit, &out);
        Ok(out)
    }

    /// Same as `commit` for a runner that sampled on its own (e.g. on a GPU): one token
    /// per logit row of the plan (one per entry, and one per draft token), in plan order
    /// (ignored for entries that do not sample).
    pub fn commit_tokens(&mut self, tokens: &[u32]) -> Result<StepOutputs, EngineError> {
        let tokens: Vec<Option<u32>> = tokens.iter().map(|&t| Some(t)).collect();
        self.commit_drawn(&DeviceDraws { tokens: &tokens, ..DeviceDraws::default() })
    }

    /// Same as `commit` for a runner that drew the tokens itself with the step's
    /// `sampling_batch` (or greedily): each token is checked against the entry's grammar
    /// mask, then the request advances as after the core's own draw (its random stream by
    /// one draw where it samples, its matcher, detokenizer, stops). An entry whose token
    /// is `None` (nothing could be drawn) ends with the error the core's sampler gives.
    /// The columns have one entry per logit row of the plan (`BatchPlan::logit_rows`).
    /// Checks every length and id first; an error changes nothing.
    pub fn commit_drawn(&mut self, draws: &DeviceDraws<'_>) -> Result<StepOutputs, EngineError> {
        let n: usize = self.in_flight.iter().map(|f| 1 + f.draft.len()).sum();
        if draws.tokens.len() != n {
            return Err(EngineError::Protocol(format!(
                "expected {n} tokens (one per logit row of the plan), got {}",
                draws.tokens.len()
            )));
        }
        if let Some(t) = draws.tokens.iter().flatten().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(EngineError::Protocol(format!("token {t} is outside the vocabulary")));
        }
        if let Some(l) = draws.logprobs.filter(|l| l.len() != n) {
            return Err(EngineError::Protocol(format!(
                "expected {n} logprobs (one per logit row of the plan), got {}",
                l.len()
            )));
        }
        let w = draws.top_width;
        if draws.top_ids.len() != n * w || draws.top_logprobs.len() != n * w {
            return Err(EngineError::Protocol(format!(
                "top ids and logprobs must have shape [{n}, {w}], got {} and {} values",
                draws.top_ids.len(),
                draws.top_logprobs.len()
            )));
        }
        let in_flight = std::mem::take(&mut self.in_flight);
        let masks = std::mem::take(&mut self.step_masks);
        let mut out = std::mem::replace(&mut self.pending, StepOutputs::new());
        let mut first_row = 0;
        for (i, f) in in_flight.iter().enumerate() {
            let mask = masks.get(i).and_then(|m| m.as_deref());
            self.advance_with(f, Rows::Given { draws, first_row, mask }, &mut out);
            first_row += 1 + f.draft.len();
        }
        out.extend(std::mem::replace(&mut self.pending, StepOutputs::new()));
        self.trace_outputs(OutputsOf::Commit, &out);
        Ok(out)
    }

    /// Drops the step in flight after its forward failed (the runner raised): nothing
    /// advances, since its KV was never written; the slots reserved for the step go back
    /// to the pool, and every request in the plan finishes with `ErrorKind::StepFailed`
    /// and `message` (one aborted meanwhile with `Abort`). What the requests held before
    /// the step (KV written by earlier steps) goes to the cache as at any finish. Returns
    /// their outputs after any pending ones; with no step in flight, only those.
    pub fn fail_step(&mut self, message: &str) -> StepOutputs {
        let in_flight = std::mem::take(&mut self.in_flight);
        self.step_masks.clear();
        let mut out = std::mem::replace(&mut self.pending, StepOutputs::new());
        for f in &in_flight {
            // the step's slots are those past kv_len, which did not move: finishing frees them
            let Some(r) = self.requests.get_mut(&f.rid) else { continue };
            let text = r.detok.flush();
            let reason = if r.aborted {
                FinishReason::Abort
            } else {
                FinishReason::error(ErrorKind::StepFailed, message)
            };
            let fin = self.finish(f.rid, reason);
            out.push(f.rid, text, Some(fin));
        }
        if !in_flight.is_empty() {
            self.stats.failed_steps += 1;
            tracing::warn!(requests = in_flight.len(), message, "step failed");
        }
        out.extend(std::mem::replace(&mut self.pending, StepOutputs::new()));
        self.trace_outputs(OutputsOf::FailStep(message), &out);
        out
    }

    /// Samples the first row of every entry that samples and verifies no draft, split
    /// across two threads when the batch is large enough to pay for one
    /// (`worth_a_thread`): rows, samplers and grammars are per request, so the draws are
    /// independent. Returns each entry's draw (or `None`: drawn in `advance_with`).
    fn draw_all(
        &mut self,
        in_flight: &[InFlight],
        blocks: &mut [&mut [f32]],
    ) -> Vec<Option<Result<Sampled, FinishReason>>> {
        let vocab = self.config.vocab_size;
        let index: HashMap<u64, usize> = in_flight
            .iter()
            .enumerate()
            .filter(|(_, f)| f.samples && f.draft.is_empty())
            .map(|(i, f)| (f.rid, i))
            .collect();
        let mut rows: Vec<Option<&mut [f32]>> = blocks.iter_mut().map(|b| Some(&mut b[..vocab])).collect();
        let mut work: Vec<(usize, &mut Request, &mut [f32])> = Vec::with_capacity(index.len());
        for (rid, r) in self.requests.iter_mut() {
            if let Some(&i) = index.get(rid) {
                if !r.aborted {
                    work.push((i, r, rows[i].take().expect("one row per entry")));
                }
            }
        }
        let mut drawn: Vec<Option<Result<Sampled, FinishReason>>> =
            (0..in_flight.len()).map(|_| None).collect();
        let greedy = work.iter().filter(|(_, r, _)| r.sampler.params().is_greedy()).count();
        if !worth_a_thread(work.len(), greedy, vocab, PARALLEL_MIN_PASSES) {
            return drawn; // sampled one by one in advance_with, with the engine's buffers
        }
        let eos = &self.config.eos_token_ids;
        let half = work.len() / 2;
        let (mine, theirs) = work.split_at_mut(half);
        let (mask, scratch) = (&mut self.mask, &mut self.scratch);
        let (a, (b, helper_ns)) = std::thread::scope(|scope| {
            let other = scope.spawn(move || {
                let (mut mask, mut scratch) = (vec![0u32; vocab.div_ceil(32)], Vec::with_capacity(vocab));
                let drawn = theirs
                    .iter_mut()
                    .map(|(i, r, row)| (*i, draw(r, row, eos, None, &mut mask, &mut scratch)))
                    .collect::<Vec<_>>();
                // the thread ends with this call: its CPU is counted here, since nothing
                // that lists the process's threads afterwards sees it
                (drawn, thread_cpu_ns())
            });
            let here: Vec<_> =
                mine.iter_mut().map(|(i, r, row)| (*i, draw(r, row, eos, None, mask, scratch))).collect();
            (here, other.join().expect("sampling thread"))
        });
        self.stats.sampling_thread_cpu_ns += helper_ns;
        for (i, d) in a.into_iter().chain(b) {
            drawn[i] = Some(d);
        }
        drawn
    }

    /// Advances one plan entry by its rows: the token of each row is drawn (or was drawn
    /// ahead, in parallel, or given by the runner), and the request takes it; a request
    /// verifying a draft goes on to the next row while the token equals the draft's,
    /// then keeps the KV of the drafts it kept and frees the rest.
    fn advance_with(&mut self, f: &InFlight, mut rows: Rows<'_>, out: &mut StepOutputs) {
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
        // the prompt is in the cache: the other samples of an n > 1 request may share it
        self.release_followers(f.rid);
        let vocab = self.config.vocab_size;
        let (mut text, mut reason, mut kept) = (String::new(), None, 0);
        for i in 0..=f.draft.len() {
            let r = self.requests.get_mut(&f.rid).expect("a sampling entry's request is live");
            let eos = &self.config.eos_token_ids;
            let (sampled, from_runner) = match &mut rows {
                Rows::Logits { block, width, drawn } => {
                    let row = &mut block[i * *width..i * *width + vocab];
                    (
                        drawn
                            .take()
                            .unwrap_or_else(|| draw(r, row, eos, None, &mut self.mask, &mut self.scratch)),
                        false,
                    )
                }
                Rows::Given { draws, first_row, mask } => {
                    let g = draws.given(*first_row + i);
                    let mask = if i == 0 { mask.take() } else { None };
                    (draw(r, &mut [], eos, Some((g, mask)), &mut self.mask, &mut self.scratch), true)
                }
            };
            let (delta, token, end) = self.take_token(f.rid, sampled, from_runner, out);
            text.push_str(&delta);
            reason = end;
            let kept_draft = token.is_some() && f.draft.get(i) == token.as_ref();
            kept += kept_draft as usize;
            if reason.is_some() || !kept_draft {
                break;
            }
        }
        if !f.draft.is_empty() {
            self.settle_draft(f, kept);
        }
        let fin = reason.map(|reason| self.finish(f.rid, reason));
        out.push(f.rid, text, fin);
    }

    /// After verifying `f`'s draft, of which the first `kept` tokens were kept: their KV
    /// stays, the rejected ones' slots go back to the pool.
    fn settle_draft(&mut self, f: &InFlight, kept: usize) {
        let r = self.requests.get_mut(&f.rid).expect("a sampling entry's request is live");
        r.kv_len = f.end + kept;
        debug_assert!(r.kv_len <= r.tokens.len());
        let rejected = r.slots.split_off(r.kv_len);
        self.pool.free(&rejected).expect("a rejected draft's slots were the request's");
        if let Some(spec) = r.spec.as_mut() {
            spec.record(f.draft.len(), kept);
        }
        self.stats.spec_drafts += 1;
        self.stats.spec_draft_tokens += f.draft.len() as u64;
        self.stats.spec_accepted_tokens += kept as u64;
        let at = kept.min(self.stats.spec_accepted_histogram.len() - 1);
        self.stats.spec_accepted_histogram[at] += 1;
    }

    /// Request `rid` takes one drawn token: its grammar, sampler, detokenizer and stops
    /// see it. Returns the text it adds, the token (`None` when the draw failed) and why
    /// the request ends, if it does (the caller finishes it, once its KV is settled).
    fn take_token(
        &mut self,
        rid: u64,
        sampled: Result<Sampled, FinishReason>,
        from_runner: bool,
        out: &mut StepOutputs,
    ) -> (String, Option<u32>, Option<FinishReason>) {
        let r = self.requests.get_mut(&rid).expect("a sampling entry's request is live");
        let stops_active = r.generated() >= r.params.min_new_tokens;
        let sampled = match sampled {
            Ok(s) => s,
            Err(reason) => return (r.detok.flush(), None, Some(reason)),
        };
        if from_runner && !r.sampler.params().is_greedy() {
            r.sampler.skip_uniform(); // the runner drew with it (SamplingBatch::uniforms)
        }
        let token = sampled.token;
        // a complete document ends the request whatever ignore_eos and min_new_tokens say:
        // the grammar allows nothing after it
        let document_done = r.constraint.as_ref().is_some_and(|c| c.must_end());
        if let Some(c) = &mut r.constraint {
            if !c.accept_token(token) {
                let reason =
                    FinishReason::error(ErrorKind::Grammar, format!("the grammar rejected token {token}"));
                return (r.detok.flush(), None, Some(reason));
            }
        }
        r.sampler.observe(token);
        r.tokens.push(token);
        if let Some(spec) = r.spec.as_mut() {
            spec.push(token);
        }
        r.observe_thinking();
        let now = Instant::now();
        match r.last_token_at {
            None => self.latencies.ttft_s.push(now.duration_since(r.arrival).as_secs_f64()),
            Some(prev) => self.latencies.itl_s.push(now.duration_since(prev).as_secs_f64()),
        }
        r.first_token_at.get_or_insert(now);
        r.last_token_at = Some(now);
        self.stats.generation_tokens += 1;
        let is_eos = (!r.params.ignore_eos || document_done) && self.config.eos_token_ids.contains(&token);
        let step =
            r.detok.step(&*self.vocab, token, stops_active || document_done, is_eos).unwrap_or_else(|_| {
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
        (text, Some(token), reason)
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
}

/// Where an entry's tokens come from: its rows of the step's logits (`width` apart; the
/// first one's token perhaps `drawn` ahead), or the runner, a token per row (and the
/// first row's grammar mask, when `sampling_batch` filled it).
enum Rows<'a> {
    Logits { block: &'a mut [f32], width: usize, drawn: Option<Result<Sampled, FinishReason>> },
    Given { draws: &'a DeviceDraws<'a>, first_row: usize, mask: Option<&'a [u32]> },
}

/// A token the runner drew (its logprobs as it computed them), or its word that nothing
/// could be drawn.
pub(super) enum Given {
    Token(Sampled),
    Nothing,
}

/// What a runner that samples on its own hands back for a step: one entry per logit row.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeviceDraws<'a> {
    /// `None` where nothing could be drawn (every logit masked out).
    pub tokens: &'a [Option<u32>],
    /// The drawn token's logprob per entry (kept where the request asked for logprobs).
    pub logprobs: Option<&'a [f32]>,
    /// `[entries, top_width]`, row-major: each entry's most likely tokens, best first, with
    /// their logprobs; the first `top_logprobs` finite ones are kept.
    pub top_ids: &'a [u32],
    pub top_logprobs: &'a [f32],
    pub top_width: usize,
}

impl DeviceDraws<'_> {
    /// Logit row `j`'s token (with its logprob and top alternatives as drawn).
    fn given(&self, j: usize) -> Given {
        let Some(token) = self.tokens[j] else { return Given::Nothing };
        let w = self.top_width;
        let top = (j * w..(j + 1) * w).map(|t| (self.top_ids[t], self.top_logprobs[t]));
        Given::Token(Sampled { token, logprob: self.logprobs.map(|l| l[j]), top_logprobs: top.collect() })
    }
}

/// One request's next token from its row: EOS and stop tokens suppressed where they may
/// not come yet, the grammar's mask applied, then its sampler. Or the token `given` by the
/// runner, checked against the mask (the one given with it, else the grammar's now).
fn draw(
    r: &mut Request,
    row: &mut [f32],
    eos_ids: &[u32],
    given: Option<(Given, Option<&[u32]>)>,
    mask: &mut Vec<u32>,
    scratch: &mut Vec<f32>,
) -> Result<Sampled, FinishReason> {
    let stops_active = r.generated() >= r.params.min_new_tokens;
    // EOS and stop tokens are off the table before min_new_tokens (and EOS with ignore_eos),
    // unless the grammar's document is complete: then EOS is all that may come
    let document_done = r.constraint.as_ref().is_some_and(|c| c.must_end());
    if given.is_none() {
        if (r.params.ignore_eos || !stops_active) && !document_done {
            for &e in eos_ids {
                row[e as usize] = f32::NEG_INFINITY;
            }
        }
        if !stops_active {
            for &t in &r.params.stops.stop_token_ids {
                row[t as usize] = f32::NEG_INFINITY;
            }
        }
    }
    let (given, known_mask) = match given {
        Some((g, m)) => (Some(g), m),
        None => (None, None),
    };
    // the thinking budget's forced end marker is the one token allowed (the grammar, if
    // any, checks it as it accepts it); a runner's step mask already says so
    let forced = r.forced_token();
    let mask = match (forced, &mut r.constraint, known_mask) {
        (_, _, Some(m)) => Some(m),
        (Some(t), _, None) => {
            crate::sampling::mask_only(mask, t);
            Some(mask.as_slice())
        }
        (None, Some(c), None) => {
            c.fill_mask(mask);
            Some(mask.as_slice())
        }
        (None, None, None) => None,
    };
    // nothing left to draw: the grammar's doing when there is one
    let none_left = |mask: Option<&[u32]>, message: String| {
        let kind = if mask.is_some() { ErrorKind::Grammar } else { ErrorKind::Sampling };
        FinishReason::error(kind, message)
    };
    let p = r.sampler.params();
    match given {
        Some(Given::Token(s)) if mask.is_none_or(|m| crate::sampling::mask_allows(m, s.token as usize)) => {
            let wanted = p.top_logprobs as usize;
            let top = s.top_logprobs.into_iter().filter(|t| t.1.is_finite()).take(wanted).collect();
            Ok(Sampled { token: s.token, logprob: s.logprob.filter(|_| p.logprobs), top_logprobs: top })
        }
        Some(Given::Token(s)) if forced.is_some() => Err(FinishReason::error(
            ErrorKind::Grammar,
            format!(
                "token {} is not the thinking budget's forced token {}",
                s.token,
                forced.expect("matched")
            ),
        )),
        Some(Given::Token(s)) => Err(FinishReason::error(
            ErrorKind::Grammar,
            format!("token {} is not allowed by the request's grammar", s.token),
        )),
        Some(Given::Nothing) => Err(none_left(mask, crate::sampling::NoAllowedToken.to_string())),
        None => r.sampler.sample_with(row, mask, scratch).map_err(|e| none_left(mask, e.to_string())),
    }
}

/// Logit passes (`worth_a_thread`) from which a step's sampling takes two threads: about
/// half a millisecond of argmax (some 125 rows of a 32k vocabulary, 32 of a 128k one).
/// The core's unit tests take the two-thread path from 16 rows, to check it on small
/// models.
const PARALLEL_MIN_PASSES: usize = if cfg!(test) { 0 } else { 4_000_000 };

/// The calling thread's CPU time so far, in nanoseconds (0 where there is no such clock).
fn thread_cpu_ns() -> u64 {
    #[cfg(unix)]
    {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime only writes the timespec it is given
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0 {
            return t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64;
        }
    }
    0
}

/// Whether sampling `rows` rows of `vocab` logits (`greedy` of them by argmax) is worth a
/// second thread, at `min_passes`: a thread started for the step costs tens of
/// microseconds of CPU (its stack, its start and its join), which pays only when the rows
/// take many times that. An argmax row is one pass over the logits; a sampled one
/// (softmax, top-k/p), counted as several.
fn worth_a_thread(rows: usize, greedy: usize, vocab: usize, min_passes: usize) -> bool {
    const MIN_ROWS: usize = 16;
    const PASSES_PER_SAMPLED_ROW: usize = 8;
    let passes = greedy * vocab + (rows - greedy) * vocab * PASSES_PER_SAMPLED_ROW;
    rows >= MIN_ROWS && passes >= min_passes
}

#[cfg(test)]
#[test]
fn a_second_sampling_thread_only_for_a_large_step() {
    let min = 4_000_000;
    assert!(!worth_a_thread(64, 64, 32_008, min), "64 argmax rows of a small vocabulary");
    assert!(worth_a_thread(160, 160, 32_008, min));
    assert!(worth_a_thread(32, 32, 128_256, min), "32 argmax rows of a large vocabulary");
    assert!(worth_a_thread(16, 0, 32_008, min), "16 sampled rows");
    assert!(!worth_a_thread(15, 0, 128_256, min), "never under 16 rows");
}
