//! Turning one row of logits into the next token: logit bias, penalties, the grammar mask,
//! logprobs, then temperature, top-k, top-p, min-p and a draw from the request's own
//! random stream (or argmax when greedy).
//!
//! Logprobs are of the distribution after bias, penalties and mask, before temperature
//! and truncation: what the model, steered as asked, thinks of each token.

use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;

use super::params::SamplingParams;
use super::rng::RequestRng;
use super::simd;

/// Per-request sampling state: its parameters, random stream and token counts.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: RequestRng,
    /// How often each token appeared in the output (frequency and presence penalties).
    output_counts: HashMap<u32, u32, FxBuildHasher>,
    /// Tokens seen in the prompt or output (repetition penalty); empty when it is off.
    seen: hashbrown::HashSet<u32, FxBuildHasher>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Set when the request asked for logprobs.
    pub logprob: Option<f32>,
    /// The most likely tokens with their logprobs, best first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Nothing could be sampled: the mask and biases left no finite logit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoAllowedToken;

impl std::fmt::Display for NoAllowedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no token is allowed at this step: the request's constraint (grammar or allowed tokens) left none")
    }
}

impl std::error::Error for NoAllowedToken {}

/// Bit `token` of a packed mask row (`u32` words, bit i of word w is token 32w + i).
#[inline]
pub fn mask_allows(mask: &[u32], token: usize) -> bool {
    mask.get(token / 32).is_some_and(|w| w >> (token % 32) & 1 == 1)
}

/// Makes `mask` allow `token` alone.
pub fn mask_only(mask: &mut [u32], token: u32) {
    mask.fill(0);
    if let Some(w) = mask.get_mut(token as usize / 32) {
        *w |= 1 << (token % 32);
    }
}

impl Sampler {
    /// `params` must have passed `validate`; `seed` is used when the params carry none.
    pub fn new(params: SamplingParams, prompt: &[u32], seed: u64) -> Self {
        let rng = RequestRng::new(params.seed.unwrap_or(seed));
        let seen = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            Default::default()
        };
        Sampler { params, rng, output_counts: HashMap::default(), seen }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token as generated (it now counts for penalties).
    pub fn observe(&mut self, token: u32) {
        if self.params.frequency_penalty != 0.0 || self.params.presence_penalty != 0.0 {
            *self.output_counts.entry(token).or_insert(0) += 1;
        }
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(token);
        }
    }

    /// The uniform the next non-greedy draw will use, without using it up: a runner that
    /// samples on its own device draws with it, then `skip_uniform` advances the stream,
    /// so the request's random stream is the same whichever sampler drew.
    pub fn peek_uniform(&self) -> f64 {
        self.rng.clone().next_f64()
    }

    /// Uses up the uniform of one draw (see `peek_uniform`).
    pub fn skip_uniform(&mut self) {
        self.rng.next_f64();
    }

    /// Every token a penalty touches, with how often it was generated: the output's
    /// tokens (frequency and presence penalties) and, when the repetition penalty is on,
    /// the prompt's too (count 0 where only the prompt has it). Appended to `ids` and
    /// `counts`; nothing when no penalty is on.
    pub fn penalized_tokens(&self, ids: &mut Vec<u32>, counts: &mut Vec<u32>) {
        for (&t, &c) in &self.output_counts {
            ids.push(t);
            counts.push(c);
        }
        for &t in &self.seen {
            if !self.output_counts.contains_key(&t) {
                ids.push(t);
                counts.push(0);
            }
        }
    }

    /// Samples from `logits` (modified in place) under an optional packed mask.
    pub fn sample(&mut self, logits: &mut [f32], mask: Option<&[u32]>) -> Result<Sampled, NoAllowedToken> {
        self.sample_with(logits, mask, &mut Vec::new())
    }

    /// As `sample`, with a scratch buffer the caller keeps across calls (one row long).
    pub fn sample_with(
        &mut self,
        logits: &mut [f32],
        mask: Option<&[u32]>,
        scratch: &mut Vec<f32>,
    ) -> Result<Sampled, NoAllowedToken> {
        self.steer(logits, mask);
        let (logprob_of, top) = if self.params.logprobs || self.params.top_logprobs > 0 {
            let lse = log_sum_exp(logits, scratch).ok_or(NoAllowedToken)?;
            (Some(lse), top_n(logits, self.params.top_logprobs as usize, lse))
        } else {
            (None, Vec::new())
        };
        let token = if self.params.is_greedy() { argmax(logits) } else { self.draw(logits, scratch) }
            .ok_or(NoAllowedToken)?;
        Ok(Sampled {
            token,
            logprob: logprob_of.filter(|_| self.params.logprobs).map(|lse| logits[token as usize] - lse),
            top_logprobs: top,
        })
    }

    /// Bias, penalties and mask, in place.
    fn steer(&self, logits: &mut [f32], mask: Option<&[u32]>) {
        let p = &self.params;
        for &(token, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(token as usize) {
                *l += bias;
            }
        }
        if p.repetition_penalty != 1.0 {
            for &t in &self.seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        for (&t, &count) in &self.output_counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.frequency_penalty * count as f32 + p.presence_penalty;
            }
        }
        if let Some(mask) = mask {
            for (w, chunk) in logits.chunks_mut(32).enumerate() {
                let bits = mask.get(w).copied().unwrap_or(0);
                if bits == u32::MAX {
                    continue;
                }
                for (b, l) in chunk.iter_mut().enumerate() {
                    if bits >> b & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }

    /// Temperature, top-k, top-p, min-p, then one draw. Weights come from one vectorized
    /// pass over the row; only truncation sorts, and it sorts only as many of the largest
    /// weights as it needs.
    fn draw(&mut self, logits: &[f32], weights: &mut Vec<f32>) -> Option<u32> {
        let p = &self.params;
        let max = simd::max(logits);
        if !max.is_finite() {
            return simd::argmax(logits);
        }
        // weights relative to the best token: w = exp((l - max) / T), w(best) = 1
        let total = simd::exp_shifted(logits, max, 1.0 / p.temperature, weights);
        let truncated = p.top_k > 0 || p.top_p < 1.0 || p.min_p > 0.0;
        if !truncated {
            return Some(pick(weights, total, self.rng.next_f64()));
        }
        // Candidates as u64 keys: a non-negative f32's bits order like the float, so
        // `weight bits << 32 | !index` sorts by weight, then by lower index, with plain
        // integer compares and no indirection.
        let min_w = p.min_p; // min_p is relative to the best token, whose weight is 1
        let mut keys: Vec<u64> = weights
            .iter()
            .enumerate()
            .filter(|&(_, &w)| w > 0.0 && w >= min_w)
            .map(|(i, &w)| (w.to_bits() as u64) << 32 | !(i as u32) as u64)
            .collect();
        if p.top_k > 0 && (p.top_k as usize) < keys.len() {
            keys.select_nth_unstable_by(p.top_k as usize - 1, |a, b| b.cmp(a));
            keys.truncate(p.top_k as usize);
        }
        if p.top_p < 1.0 {
            let mass: f64 = keys.iter().map(|&k| key_weight(k) as f64).sum();
            let keep = top_p_cut(&mut keys, p.top_p as f64 * mass);
            keys.truncate(keep.max(1));
        }
        let kept: f64 = keys.iter().map(|&k| key_weight(k) as f64).sum();
        let mut u = self.rng.next_f64() * kept;
        for &k in &keys {
            let w = key_weight(k) as f64;
            if u < w {
                return Some(key_index(k));
            }
            u -= w;
        }
        keys.last().map(|&k| key_index(k)) // rounding left u just past the end
    }
}

fn key_weight(key: u64) -> f32 {
    f32::from_bits((key >> 32) as u32)
}

fn key_index(key: u64) -> u32 {
    !(key as u32)
}

/// Reorders `keys` so that its first k entries are the k largest (heaviest weight, then
/// lowest index: a strict order, so the cut is deterministic) and returns the least k whose
/// weights reach `target`. Expected O(n): each round halves the range that holds the cut,
/// summing only the half above it; only the last few dozen are sorted.
fn top_p_cut(keys: &mut [u64], target: f64) -> usize {
    let desc = |a: &u64, b: &u64| b.cmp(a);
    let (mut lo, mut hi, mut above) = (0, keys.len(), 0.0f64);
    while hi - lo > 64 {
        let mid = lo + (hi - lo) / 2;
        keys[lo..hi].select_nth_unstable_by(mid - lo, desc);
        let upper: f64 = keys[lo..mid].iter().map(|&k| key_weight(k) as f64).sum();
        if above + upper >= target {
            hi = mid;
        } else {
            above += upper;
            lo = mid;
        }
    }
    keys[lo..hi].sort_unstable_by(desc);
    for (n, &k) in keys[lo..hi].iter().enumerate() {
        above += key_weight(k) as f64;
        if above >= target {
            return lo + n + 1;
        }
    }
    hi
}

/// Inverse-CDF draw over all weights: whole blocks are skipped by their (vectorized)
/// sums, then one block is walked.
fn pick(weights: &[f32], total: f64, uniform: f64) -> u32 {
    const BLOCK: usize = 256;
    let mut u = uniform * total;
    let mut last_nonzero = 0;
    for (b, block) in weights.chunks(BLOCK).enumerate() {
        let mass = simd::sum(block);
        if u >= mass {
            u -= mass;
            if mass > 0.0 {
                last_nonzero = b;
            }
            continue;
        }
        for (i, &w) in block.iter().enumerate() {
            if u < w as f64 {
                return (b * BLOCK + i) as u32;
            }
            u -= w as f64;
        }
        last_nonzero = b;
    }
    // rounding carried u past the end: the last token with weight
    let block = &weights[last_nonzero * BLOCK..];
    (last_nonzero * BLOCK + block.iter().rposition(|&w| w > 0.0).unwrap_or(0)) as u32
}

/// Index of the largest finite logit, lowest index on ties.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    simd::argmax(logits)
}

fn log_sum_exp(logits: &[f32], scratch: &mut Vec<f32>) -> Option<f32> {
    let max = simd::max(logits);
    if !max.is_finite() {
        return None;
    }
    let sum = simd::exp_shifted(logits, max, 1.0, scratch);
    Some(max + sum.ln() as f32)
}

fn top_n(logits: &[f32], n: usize, lse: f32) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let mut all: Vec<(u32, f32)> =
        logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l)).collect();
    let by_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if n < all.len() {
        all.select_nth_unstable_by(n - 1, by_desc);
        all.truncate(n);
    }
    all.sort_unstable_by(by_desc);
    all.into_iter().map(|(t, l)| (t, l - lse)).collect()
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
