//! Draft tokens without a draft model (speculative decoding by lookup): the tokens that
//! followed the latest earlier occurrence of the sequence's own suffix, and the rules that
//! accept or reject them against the target model's distribution.
//!
//! [`NgramIndex`] keeps, for every n-gram of length `min_n..=max_n` of a request's tokens
//! (prompt and output), where it last ended; appending a token costs `max_n - min_n + 1`
//! hash-map updates. [`NgramIndex::propose`] takes the longest suffix that occurred before
//! and drafts what came after that occurrence, as vLLM's n-gram proposer and llama.cpp's
//! prompt lookup do: copies of a quoted passage, a file being edited, repeated JSON keys.
//!
//! [`DraftLength`] adapts how many tokens to draft to what the request's drafts earned:
//! one more after a draft accepted whole, half after one rejected at its first token.
//!
//! Acceptance keeps the output distribution exactly the target's. A lookup draft is a
//! single token with probability 1 under the drafter, so the standard rule (accept `d`
//! with probability `min(1, p(d) / q(d))`, else sample from the normalized `(p - q)+`)
//! becomes: accept `d` with probability `p(d)`, else sample from `p` without `d`. Then
//! `P(x) = p(d) [x = d] + (1 - p(d)) p(x) / (1 - p(d)) [x != d] = p(x)`. Greedy decoding
//! accepts a draft token exactly when it is the argmax.

use hashbrown::HashMap;

/// Where each n-gram of a token sequence last ended, for drafting from the sequence's own
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
}

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
        NgramIndex { min_n, max_n, tokens: Vec::new(), last_end: HashMap::new() }
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
        for n in self.min_n..=self.max_n.min(end) {
            self.last_end.insert((n as u8, hash_of(&self.tokens[end - n..])), end as u32);
        }
        self.tokens.push(token);
    }

    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.push(t);
        }
    }

    /// Up to `max_tokens` tokens that followed the latest earlier occurrence of the
    /// longest suffix (of `max_n` down to `min_n` tokens) seen before, into `out`
    /// (cleared first); empty when no suffix occurred before.
    pub fn propose(&self, max_tokens: usize, out: &mut Vec<u32>) {
        out.clear();
        let end = self.tokens.len();
        if max_tokens == 0 {
            return;
        }
        for n in (self.min_n..=self.max_n.min(end)).rev() {
            let suffix = &self.tokens[end - n..];
            let Some(&at) = self.last_end.get(&(n as u8, hash_of(suffix))) else { continue };
            let at = at as usize;
            if at < n || &self.tokens[at - n..at] != suffix {
                continue; // a hash collision
            }
            out.extend_from_slice(&self.tokens[at..(at + max_tokens).min(end)]);
            return;
        }
    }
}

/// How many tokens to draft next for one request, from what its drafts earned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftLength {
    current: usize,
    max: usize,
}

impl DraftLength {
    /// Starting at `max.min(start)` tokens, never above `max` (at least 1).
    pub fn new(start: usize, max: usize) -> DraftLength {
        let max = max.max(1);
        DraftLength { current: start.clamp(1, max), max }
    }

    pub fn get(&self) -> usize {
        self.current
    }

    /// A draft of `drafted` tokens of which the first `accepted` were accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if accepted >= drafted {
            self.current = (self.current + 1).min(self.max);
        } else if accepted == 0 {
            self.current = (self.current / 2).max(1);
        }
    }
}

/// Whether a sampled step keeps the draft token `draft`, given the target's probabilities
/// `probs` for that position (after temperature, top-k and top-p) and a uniform draw `u` in
/// [0, 1): kept with probability `probs[draft]`.
pub fn keep_draft(probs: &[f32], draft: u32, u: f32) -> bool {
    probs.get(draft as usize).is_some_and(|&p| u < p)
}

/// The token sampled in place of a rejected draft token: from `probs` without `draft`,
/// renormalized, by inverse CDF at the uniform draw `u` in [0, 1). `None` when nothing
/// else has probability (then the draft could not have been rejected).
pub fn resample_without(probs: &[f32], draft: u32, u: f32) -> Option<u32> {
    let rest: f64 =
        probs.iter().enumerate().filter(|&(i, _)| i != draft as usize).map(|(_, &p)| p as f64).sum();
    if rest <= 0.0 {
        return None;
    }
    let target = u as f64 * rest;
    let mut seen = 0f64;
    let mut last = None;
    for (i, &p) in probs.iter().enumerate() {
        if i == draft as usize || p <= 0.0 {
            continue;
        }
        seen += p as f64;
        last = Some(i as u32);
        if target < seen {
            return last;
        }
    }
    last // rounding left the target at the very end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The proposal by brute force: longest suffix first, latest earlier occurrence.
    fn reference(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
        let end = tokens.len();
        for n in (min_n..=max_n.min(end)).rev() {
            let suffix = &tokens[end - n..];
            // occurrences ending at `at` < end
            if let Some(at) = (n..end).rev().find(|&at| &tokens[at - n..at] == suffix) {
                return tokens[at..(at + k).min(end)].to_vec();
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

        #[test]
        fn draft_length_stays_within_its_bounds(
            start in 0usize..10,
            max in 0usize..10,
            outcomes in prop::collection::vec((0usize..10, 0usize..10), 0..50),
        ) {
            let mut length = DraftLength::new(start, max);
            for (drafted, accepted) in outcomes {
                let before = length.get();
                length.record(drafted, accepted.min(drafted));
                prop_assert!(1 <= length.get() && length.get() <= max.max(1));
                if drafted > 0 && accepted >= drafted {
                    prop_assert!(length.get() >= before);
                }
            }
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

    /// The distribution of the token a lookup step emits (the draft if kept, else the
    /// resampled one) equals the target's: exactly, computed over a grid of draws fine
    /// enough that each bucket's share is the probability to the grid's resolution.
    #[test]
    fn keeping_or_resampling_leaves_the_target_distribution() {
        let probs = [0.05f32, 0.4, 0.0, 0.25, 0.3];
        let grid = 500;
        for draft in 0..probs.len() as u32 {
            let mut counts = [0usize; 5];
            for a in 0..grid {
                let u1 = (a as f32 + 0.5) / grid as f32;
                if keep_draft(&probs, draft, u1) {
                    counts[draft as usize] += grid;
                    continue;
                }
                for b in 0..grid {
                    let u2 = (b as f32 + 0.5) / grid as f32;
                    counts[resample_without(&probs, draft, u2).unwrap() as usize] += 1;
                }
            }
            let total = (grid * grid) as f64;
            for (x, &c) in counts.iter().enumerate() {
                let share = c as f64 / total;
                assert!((share - probs[x] as f64).abs() < 4e-3, "draft {draft}: P({x}) = {share}");
            }
        }
        assert_eq!(resample_without(&[0.0, 1.0], 1, 0.3), None);
        assert!(!keep_draft(&probs, 99, 0.0)); // outside the vocabulary: never kept
    }
}
