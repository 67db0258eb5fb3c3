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
        f.write_str("no token is allowed at this step (the grammar mask left nothing)")
    }
}

impl std::error::Error for NoAllowedToken {}

/// Bit `token` of a packed mask row (`u32` words, bit i of word w is token 32w + i).
#[inline]
pub fn mask_allows(mask: &[u32], token: usize) -> bool {
    mask.get(token / 32).is_some_and(|w| w >> (token % 32) & 1 == 1)
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

    /// Samples from `logits` (modified in place) under an optional packed mask.
    pub fn sample(&mut self, logits: &mut [f32], mask: Option<&[u32]>) -> Result<Sampled, NoAllowedToken> {
        self.steer(logits, mask);
        let (logprob_of, top) = if self.params.logprobs || self.params.top_logprobs > 0 {
            let lse = log_sum_exp(logits).ok_or(NoAllowedToken)?;
            (Some(lse), top_n(logits, self.params.top_logprobs as usize, lse))
        } else {
            (None, Vec::new())
        };
        let token =
            if self.params.is_greedy() { argmax(logits) } else { self.draw(logits) }.ok_or(NoAllowedToken)?;
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
            for (i, l) in logits.iter_mut().enumerate() {
                if !mask_allows(mask, i) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Temperature, top-k, top-p, min-p, then one draw.
    fn draw(&mut self, logits: &[f32]) -> Option<u32> {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &l)| (i as u32, l * inv_t))
            .collect();
        if cand.is_empty() {
            return None;
        }
        let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && (p.top_k as usize) < cand.len() {
            cand.select_nth_unstable_by(p.top_k as usize - 1, by_logit_desc);
            cand.truncate(p.top_k as usize);
        }
        cand.sort_unstable_by(by_logit_desc);
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, pr) in probs.iter().enumerate() {
                acc += pr / total;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            // probs[0] is the largest (exp(0) = 1 before normalising)
            let floor = p.min_p as f64 * probs[0];
            keep = keep.min(probs.iter().take_while(|&&pr| pr >= floor).count().max(1));
        }
        probs.truncate(keep);
        let total: f64 = probs.iter().sum();
        let mut u = self.rng.next_f64() * total;
        for (i, pr) in probs.iter().enumerate() {
            if u < *pr {
                return Some(cand[i].0);
            }
            u -= pr;
        }
        Some(cand[keep - 1].0) // rounding left u just past the end
    }
}

/// Index of the largest finite logit, lowest index on ties.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i as u32)
}

fn log_sum_exp(logits: &[f32]) -> Option<f32> {
    let max = logits.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return None;
    }
    let sum: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| ((l - max) as f64).exp()).sum();
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
