//! What one step asks of the model runner, in columns (the binding hands each column to
//! Python as a numpy array), and what the step gives back.

#[cfg(doc)]
use super::request::RequestParams;
use super::request::{FinishReason, Lora};

/// Tokens to run through the model this step. Request b's new tokens are
/// `input_ids[qo_offsets[b]..qo_offsets[b + 1]]` at `positions[...]`, their K/V go to
/// `out_slots[...]`, and it attends to `kv_slots[kv_offsets[b]..kv_offsets[b + 1]]` (every
/// slot of its sequence up to and including the new tokens, in position order). The
/// runner returns one row of logits per entry of `logit_rows`: each request's last new
/// token, and before it each of its draft tokens' predecessors when it speculates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchPlan {
    pub rids: Vec<u64>,
    pub input_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub out_slots: Vec<u32>,
    pub qo_offsets: Vec<u32>,
    pub kv_slots: Vec<u32>,
    pub kv_offsets: Vec<u32>,
    /// Whether request b samples a token after this step (false for a prefill chunk that
    /// does not reach the end of the prompt).
    pub samples: Vec<bool>,
    /// Whether request b's new tokens are prompt (or resumed) tokens rather than one decode token.
    pub is_prefill: Vec<bool>,
    /// Whether request b's next token is the bare argmax of its logits
    /// ([`RequestParams::plain_greedy`]): a runner may then pick it on its device.
    pub plain_greedy: Vec<bool>,
    /// Whether request b ignores EOS (a runner picking its greedy token must never pick an
    /// EOS id, as the core's sampler would not).
    pub ignore_eos: Vec<bool>,
    /// How many of request b's new tokens are draft tokens (its last ones) to verify.
    pub drafted: Vec<u32>,
    /// The new tokens (indices into `input_ids`) whose logits the runner returns, in
    /// order: for request b, its last `drafted[b] + 1` new tokens.
    pub logit_rows: Vec<u32>,
    /// Request b's LoRA adapter (`None`: the base model).
    pub loras: Vec<Option<Lora>>,
}

impl BatchPlan {
    pub fn num_requests(&self) -> usize {
        self.rids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rids.is_empty()
    }
    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }
    /// Whether every entry that samples this step is plain greedy (true when none
    /// samples): the runner may then pick the whole step's tokens as argmaxes. False when
    /// any entry verifies a draft, whose rows the core reads in turn.
    pub fn all_plain_greedy(&self) -> bool {
        !self.has_drafts() && self.samples.iter().zip(&self.plain_greedy).all(|(&s, &g)| !s || g)
    }
    /// Whether any entry verifies draft tokens (then the runner returns more logit rows
    /// than requests, and only the core's sampler reads them).
    pub fn has_drafts(&self) -> bool {
        self.logit_rows.len() > self.rids.len()
    }
    /// Whether any entry runs with a LoRA adapter.
    pub fn has_lora(&self) -> bool {
        self.loras.iter().any(Option::is_some)
    }
}

/// One finished request's closing facts.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// What a step (or an abort, or a timeout) produced: per request its new tokens, text
/// delta and, when it ended, why. Columns again: entry i covers
/// `token_ids[token_offsets[i]..token_offsets[i + 1]]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutputs {
    pub rids: Vec<u64>,
    pub token_offsets: Vec<u32>,
    pub token_ids: Vec<u32>,
    /// Logprob of each token in `token_ids` (NaN when not asked for).
    pub logprobs: Vec<f32>,
    /// Top alternatives of each token in `token_ids`: `top_offsets[j]..top_offsets[j + 1]`.
    pub top_offsets: Vec<u32>,
    pub top_ids: Vec<u32>,
    pub top_logprobs: Vec<f32>,
    pub texts: Vec<String>,
    pub finished: Vec<Option<Finished>>,
}

impl StepOutputs {
    pub fn new() -> Self {
        StepOutputs { token_offsets: vec![0], top_offsets: vec![0], ..Default::default() }
    }
    pub fn len(&self) -> usize {
        self.rids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rids.is_empty()
    }
    pub(crate) fn push(&mut self, rid: u64, text: String, finished: Option<Finished>) {
        self.rids.push(rid);
        self.texts.push(text);
        self.finished.push(finished);
        self.token_offsets.push(self.token_ids.len() as u32);
    }
    pub(crate) fn push_token(&mut self, token: u32, logprob: Option<f32>, top: &[(u32, f32)]) {
        self.token_ids.push(token);
        self.logprobs.push(logprob.unwrap_or(f32::NAN));
        for &(t, l) in top {
            self.top_ids.push(t);
            self.top_logprobs.push(l);
        }
        self.top_offsets.push(self.top_ids.len() as u32);
    }
    pub(crate) fn extend(&mut self, other: StepOutputs) {
        for i in 0..other.len() {
            let (a, b) = (other.token_offsets[i] as usize, other.token_offsets[i + 1] as usize);
            for j in a..b {
                let (ta, tb) = (other.top_offsets[j] as usize, other.top_offsets[j + 1] as usize);
                let top: Vec<(u32, f32)> =
                    (ta..tb).map(|k| (other.top_ids[k], other.top_logprobs[k])).collect();
                let lp = other.logprobs[j];
                self.push_token(other.token_ids[j], (!lp.is_nan()).then_some(lp), &top);
            }
            self.push(other.rids[i], other.texts[i].clone(), other.finished[i].clone());
        }
    }
}
