//! Draft tokens without a draft model (speculative decoding by lookup): the tokens that
//! followed the latest earlier occurrence of the sequence's own suffix.
//!
//! A draft comes first from the prefix cache: the tokens an earlier sequence with the
//! same prefix (prompt and output so far) went on with (`RadixTree::continuation`), e.g.
//! another sample of the prompt, or an agent sending the same context again. Else:
//!
//! [`NgramIndex`] keeps, for every n-gram of length `min_n..=max_n` of a request's tokens
//! (prompt and output), where it last ended and where each occurrence's previous one
//! ended; appending a token costs `max_n - min_n + 1` hash-map updates.
//! [`NgramIndex::propose`] takes the longest suffix that occurred before and drafts what
//! came after its occurrences, as vLLM's n-gram proposer and llama.cpp's prompt lookup
//! do (copies of a quoted passage, a file being edited), but only as far as its latest
//! occurrences agree: after a suffix that recurs with different continuations (`", "` in
//! a JSON object, `return` in code) the next token is a guess, and a guessed row is
//! paid for and thrown away.
//!
//! [`Speculation`] sizes each draft by what a verified row costs against the chance that
//! a draft token is kept, estimated from the request's own drafts, and pauses drafting
//! while none pays, so that a request with nothing to copy pays for almost no rows.
//!
//! Verification keeps the output distribution exactly the target's, with no rule of its
//! own: the commit draws each position's token from the target's distribution as it would
//! without a draft (same masks, penalties and random stream), and keeps going while the
//! drawn token equals the draft's. A lookup draft is a single token with probability 1
//! under the drafter, for which the standard rule (accept `d` with probability
//! `min(1, p(d) / q(d))`, else draw from the normalized `(p - q)+`) is "accept with
//! probability `p(d)`, else draw from `p` without `d`": the same law as drawing `x ~ p`
//! and accepting when `x = d`. Greedy decoding accepts a draft token exactly when it is
//! the argmax. So a seeded request gives the same tokens with and without speculation,
//! up to the rounding of a multi-token forward.

use hashbrown::HashMap;

/// Where each n-gram of a token sequence ended, for drafting from the sequence's own
/// history.
#[derive(Clone, Debug)]
pub struct NgramIndex {
    min_n: usize,
    max_n: usize,
    tokens: Vec<u32>,
    /// (n, hash of the n tokens) -> the index just past the n-gram's latest occurrence
    /// before the current end of `tokens` (the occurrence that ends at the end is not
    /// recorded until a token follows it: a suffix must find an earlier match).
    last_end: HashMap<(u8, u64), u32>,
    /// `previous[n - min_n][e]`: for the n-gram ending at `e`, the end of its previous
    /// occurrence (or `NONE`), so that occurrences chain from the latest back.
    previous: Vec<Vec<u32>>,
}

const NONE: u32 = u32::MAX;

/// Occurrences of a suffix whose continuations a draft must agree with: the latest few
/// (older ones speak of another part of the text).
const AGREEING: usize = 4;

fn hash_of(tokens: &[u32]) -> u64 {
    // FNV-1a over the ids: n-grams are a few tokens, and a collision only costs a draft
    // that `propose` checks against the real tokens before offering it
    tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ t as u64).wrapping_mul(0x0100_0000_01b3))
}

impl NgramIndex {
    /// An empty index matching suffixes of `min_n..=max_n` tokens (`1 <= min_n <= max_n <= 255`).
    pub fn new(min_n: usize, max_n: usize) -> NgramIndex {
        assert!(
            1 <= min_n && min_n <= max_n && max_n <= u8::MAX as usize,
            "n-gram lengths {min_n}..={max_n}"
        );
        NgramIndex {
            min_n,
            max_n,
            tokens: Vec::new(),
            last_end: HashMap::new(),
            previous: vec![Vec::new(); max_n - min_n + 1],
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Appends `token`: the n-grams that ended just before it are now earlier occurrences.
    pub fn push(&mut self, token: u32) {
        let end = self.tokens.len();
        for (i, previous) in self.previous.iter_mut().enumerate() {
            let n = self.min_n + i;
            let before = if n <= end {
                self.last_end.insert((n as u8, hash_of(&self.tokens[end - n..])), end as u32).unwrap_or(NONE)
            } else {
                NONE
            };
            previous.push(before);
        }
        self.tokens.push(token);
    }

    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.push(t);
        }
    }

    /// Up to `max_tokens` tokens that followed the longest suffix (of `max_n` down to
    /// `min_n` tokens) seen before, into `out` (cleared first): the tokens on which the
    /// continuations of its latest `AGREEING` earlier occurrences agree (each up to the
    /// end of what exists); empty when no suffix occurred before or they differ at once.
    /// Returns the length of the suffix matched (0: none).
    pub fn propose(&self, max_tokens: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        let end = self.tokens.len();
        if max_tokens == 0 {
            return 0;
        }
        for n in (self.min_n..=self.max_n.min(end)).rev() {
            let suffix = &self.tokens[end - n..];
            let Some(&latest) = self.last_end.get(&(n as u8, hash_of(suffix))) else { continue };
            let is_match = |at: usize| at >= n && &self.tokens[at - n..at] == suffix;
            if !is_match(latest as usize) {
                continue; // a hash collision
            }
            // the chain of earlier occurrences (a collision in it ends it)
            let mut ends = [latest as usize; AGREEING];
            let mut found = 1;
            while found < AGREEING {
                let before = self.previous[n - self.min_n][ends[found - 1]];
                if before == NONE || !is_match(before as usize) {
                    break;
                }
                ends[found] = before as usize;
                found += 1;
            }
            let first = ends[0];
            for i in 0..max_tokens {
                let agreed = ends[..found]
                    .iter()
                    .all(|&at| at + i < end && self.tokens[at + i] == self.tokens[first + i]);
                if !agreed {
                    break;
                }
                out.push(self.tokens[first + i]);
            }
            return n;
        }
        0
    }
}

/// Where a draft came from, each with its own chance of being kept: a continuation from
/// the prefix cache or a long n-gram match (`LONG_MATCH` tokens or more) is kept far more
/// often than a short one (on SmolLM2's copy workloads, 93-100% of first tokens after a
/// 5-token match against 44% after a 2-token match seen once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Long = 0,
    Short = 1,
}

/// A match of this many tokens or more drafts as [`Source::Long`].
pub const LONG_MATCH: usize = 4;

/// One request's drafting state: its n-gram index, what its drafts earned, and its pause.
///
/// How long a draft is follows from what a verified row costs and what a draft token is
/// worth. A row costs `row_cost` of a one-token step (the forward's work grows with its
/// rows; on a CPU a row of a small model costs about a quarter of a step). The j-th draft
/// token is kept with probability `p^j` when each is kept with probability `p` once the
/// ones before it were, so it pays while `p^j > row_cost`: the draft is the longest
/// such, `floor(ln(row_cost) / ln(p))` tokens. `p` is estimated per [`Source`] from the
/// request's own drafts (kept tokens against drafts cut short, decayed so that the
/// estimate follows the text: a copied passage, then free prose). While a source's
/// `p <= row_cost` its drafts do not pay: the request then drafts one token of it now and
/// then to see whether that changed, waiting twice as long after each probe that earned
/// nothing; a source that pays drafts even then.
#[derive(Clone, Debug)]
pub struct Speculation {
    index: NgramIndex,
    max_draft: usize,
    row_cost: f64,
    /// Per source: decayed counts of draft tokens kept and of drafts cut short.
    kept: [f64; 2],
    missed: [f64; 2],
    /// The source of the draft in flight.
    pending: Source,
    /// Steps left before probing again.
    pause: u32,
    /// The pause the next fruitless probe earns (doubles each time, up to `MAX_PAUSE`).
    backoff: u32,
}

/// n-gram lengths matched: a single shared token is too weak a hint to pay for a row.
pub const MIN_NGRAM: usize = 2;
pub const MAX_NGRAM: usize = 5;
/// At most this many steps without a probe after fruitless ones: a request whose text
/// has nothing to copy pays one verified row per this many steps.
const MAX_PAUSE: u32 = 32;
/// The estimates before any draft, per source: as if 4 (long) or 2 (short) tokens had
/// been kept and 1 draft cut short (p = 4/5 and 2/3).
const PRIOR_KEPT: [f64; 2] = [4.0, 2.0];
const PRIOR_MISSED: f64 = 1.0;
/// Each draft's outcome weighs this much less at the next (about the last 5 drafts count).
const DECAY: f64 = 0.8;

impl Speculation {
    /// Drafting over `tokens` (the prompt), at most `max_draft` tokens a step, a verified
    /// row costing `row_cost` (in (0, 1]) of a one-token step.
    pub fn new(tokens: &[u32], max_draft: usize, row_cost: f64) -> Speculation {
        let mut index = NgramIndex::new(MIN_NGRAM, MAX_NGRAM);
        index.extend(tokens);
        Speculation {
            index,
            max_draft,
            row_cost,
            kept: [0.0; 2],
            missed: [0.0; 2],
            pending: Source::Short,
            pause: 0,
            backoff: 1,
        }
    }

    /// The next token of the sequence.
    pub fn push(&mut self, token: u32) {
        self.index.push(token);
    }

    /// The estimated chance that a draft token from `source` is kept, its predecessors kept.
    pub fn keep_rate(&self, source: Source) -> f64 {
        let s = source as usize;
        (self.kept[s] + PRIOR_KEPT[s]) / (self.kept[s] + self.missed[s] + PRIOR_KEPT[s] + PRIOR_MISSED)
    }

    /// How many tokens from `source` pay to draft now (0: none).
    pub fn worth_drafting(&self, source: Source) -> usize {
        let p = self.keep_rate(source);
        if p <= self.row_cost {
            return 0;
        }
        if p >= 1.0 {
            return self.max_draft;
        }
        // p^k > row_cost  <=>  k < ln(row_cost) / ln(p)
        let k = (self.row_cost.ln() / p.ln()).ceil() as usize - 1;
        k.clamp(1, self.max_draft)
    }

    /// This step's draft, at most `limit` tokens, into `out` (cleared first): what
    /// `cached` (the prefix cache's continuation: given a length and `out`) holds, else
    /// what followed the sequence's suffix; cut to what pays for its source, one token
    /// (a probe) where nothing pays, nothing while paused (the step counts toward it).
    pub fn draft(&mut self, limit: usize, cached: impl FnOnce(usize, &mut Vec<u32>), out: &mut Vec<u32>) {
        out.clear();
        let paused = self.pause > 0;
        if paused {
            self.pause -= 1;
        }
        let cap = limit.min(self.max_draft);
        if cap == 0 {
            return;
        }
        cached(cap, out);
        let source = if !out.is_empty() {
            Source::Long
        } else {
            match self.index.propose(cap, out) {
                0 => return,
                n if n >= LONG_MATCH => Source::Long,
                _ => Source::Short,
            }
        };
        let k = match self.worth_drafting(source) {
            0 if paused => 0,
            0 => 1,
            k => k,
        };
        out.truncate(k);
        self.pending = source;
    }

    /// The draft in flight had `drafted` tokens, of which the first `accepted` were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        let s = self.pending as usize;
        self.kept[s] = self.kept[s] * DECAY + accepted as f64;
        self.missed[s] = self.missed[s] * DECAY + (accepted < drafted) as u8 as f64;
        if self.worth_drafting(self.pending) == 0 {
            // this source no longer pays: probe it again after a pause that grows
            self.pause = self.backoff;
            self.backoff = (self.backoff * 2).min(MAX_PAUSE);
        } else if accepted > 0 {
            self.backoff = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The proposal by brute force: longest suffix first, the common prefix of what
    /// followed its latest `AGREEING` earlier occurrences.
    fn reference(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
        let end = tokens.len();
        for n in (min_n..=max_n.min(end)).rev() {
            let suffix = &tokens[end - n..];
            // occurrences ending at `at` < end, latest first
            let ends: Vec<usize> =
                (n..end).rev().filter(|&at| &tokens[at - n..at] == suffix).take(AGREEING).collect();
            if let Some(&first) = ends.first() {
                return (0..k)
                    .take_while(|&i| {
                        ends.iter().all(|&at| at + i < end && tokens[at + i] == tokens[first + i])
                    })
                    .map(|i| tokens[first + i])
                    .collect();
            }
        }
        Vec::new()
    }

    proptest! {
        #[test]
        fn proposals_match_a_brute_force_search(
            tokens in prop::collection::vec(0u32..6, 0..120),
            min_n in 1usize..4,
            extra in 0usize..4,
            k in 0usize..8,
        ) {
            let max_n = min_n + extra;
            let mut index = NgramIndex::new(min_n, max_n);
            let mut out = Vec::new();
            for (i, &t) in tokens.iter().enumerate() {
                index.push(t);
                index.propose(k, &mut out);
                prop_assert_eq!(&out, &reference(&tokens[..=i], min_n, max_n, k), "after {} tokens", i + 1);
            }
            prop_assert_eq!(index.tokens(), &tokens[..]);
        }
    }

    #[test]
    fn a_copied_passage_is_drafted_from_its_first_occurrence() {
        // "a b c d e" then "a b" again: the draft is what followed "a b" before
        let mut index = NgramIndex::new(1, 3);
        index.extend(&[10, 11, 12, 13, 14, 99, 10, 11]);
        let mut out = Vec::new();
        index.propose(3, &mut out);
        assert_eq!(out, [12, 13, 14]);
        index.propose(10, &mut out);
        assert_eq!(out, [12, 13, 14, 99, 10, 11]); // up to the end of what exists
                                                   // nothing to copy: no draft
        let mut fresh = NgramIndex::new(2, 3);
        fresh.extend(&[1, 2, 3, 4, 5]);
        fresh.propose(4, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_suffix_that_recurs_drafts_only_what_its_continuations_share() {
        // `", "` (5, 6) recurs before keys 1, 2 and 3, each followed by `": "` (7, 8)
        let mut index = NgramIndex::new(2, 3);
        index.extend(&[5, 6, 1, 7, 8, 40, 5, 6, 2, 7, 8, 41, 5, 6]);
        let mut out = Vec::new();
        index.propose(4, &mut out);
        assert!(out.is_empty(), "the keys differ: no guess, got {out:?}");
        // continuations that agree for two tokens, then differ
        let mut index = NgramIndex::new(2, 3);
        index.extend(&[1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2]);
        index.propose(4, &mut out);
        assert_eq!(out, [3, 4]);
    }

    fn draft(spec: &mut Speculation, limit: usize) -> Vec<u32> {
        let mut out = Vec::new();
        spec.draft(limit, |_, _| {}, &mut out);
        out
    }

    #[test]
    fn fruitless_drafts_pause_drafting_longer_each_time() {
        // a sequence where "1 2" recurs: a (short) draft is always on offer
        let mut spec = Speculation::new(&[1, 2, 3, 1, 2], 4, 0.35);
        let mut drafted_steps = Vec::new();
        for step in 0..160 {
            let out = draft(&mut spec, 4);
            if !out.is_empty() {
                drafted_steps.push(step);
                spec.record(out.len(), 0); // never kept
            }
        }
        // while drafts still pay, every step drafts; then pauses of 1, 2, 4, ... and 32
        // steps between probes of one token
        let gaps: Vec<usize> = drafted_steps.windows(2).map(|w| w[1] - w[0] - 1).collect();
        let paused: Vec<usize> = gaps.iter().copied().skip_while(|&g| g == 0).collect();
        assert!(gaps.len() - paused.len() <= 4, "{gaps:?}");
        assert_eq!(&paused[..5], &[1, 2, 4, 8, 16], "{gaps:?}");
        assert!(paused[5..].iter().all(|&g| g == 32), "{gaps:?}");
        assert_eq!(spec.worth_drafting(Source::Short), 0);
        // once the pause is over, a probe is one token
        let next = (0..=MAX_PAUSE).map(|_| draft(&mut spec, 4)).find(|d| !d.is_empty());
        assert_eq!(next.map(|d| d.len()), Some(1));
    }

    #[test]
    fn a_long_match_drafts_while_short_ones_do_not_pay() {
        let mut spec = Speculation::new(&[1, 2, 9, 1, 2], 10, 0.35);
        for _ in 0..40 {
            let out = draft(&mut spec, 4);
            if !out.is_empty() {
                spec.record(out.len(), 0);
            }
        }
        assert_eq!(spec.worth_drafting(Source::Short), 0);
        // a passage, then its first four tokens again: a match of 4 drafts at the long
        // matches' own rate (the prior 4/5: 0.8^4 = 0.41 > 0.35 > 0.8^5), paused or not
        spec.push(3);
        for t in [10, 11, 12, 13, 14, 15, 16, 17, 7, 10, 11, 12, 13] {
            spec.push(t);
        }
        assert_eq!(draft(&mut spec, 10), [14, 15, 16, 17]);
    }

    #[test]
    fn a_draft_is_as_long_as_its_tokens_pay_for_their_rows() {
        let mut spec = Speculation::new(&[1, 2, 3, 1, 2], 10, 0.35);
        // the priors: p = 2/3 for short matches, (2/3)^2 = 0.44 > 0.35 > (2/3)^3; 4/5 for long ones
        assert_eq!(spec.worth_drafting(Source::Short), 2);
        assert_eq!(spec.worth_drafting(Source::Long), 4);
        for _ in 0..20 {
            draft(&mut spec, 10); // a short match: what follows is recorded for short ones
            spec.record(6, 6); // everything kept
        }
        assert!(spec.keep_rate(Source::Short) > 0.95);
        assert_eq!(spec.worth_drafting(Source::Short), 10, "capped at the most allowed");
        assert_eq!(spec.worth_drafting(Source::Long), 4, "the other source's estimate is its own");
        for _ in 0..5 {
            draft(&mut spec, 10);
            spec.record(2, 1); // half kept: p falls toward 1/2
        }
        let p = spec.keep_rate(Source::Short);
        let k = spec.worth_drafting(Source::Short);
        assert!(p.powi(k as i32) > 0.35 && p.powi(k as i32 + 1) <= 0.35, "p {p}, k {k}");
        // a row that costs little (a GPU): long drafts pay even at a modest rate
        let cheap = Speculation::new(&[], 16, 0.02);
        assert_eq!(cheap.worth_drafting(Source::Short), 9); // (2/3)^9 = 0.026 > 0.02 > (2/3)^10
    }
}
