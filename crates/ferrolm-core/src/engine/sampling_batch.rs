//! The sampling side of a step in columns, for a runner that samples on its own device
//! (the torch runner on a GPU): everything `Sampler::sample_with` and `commit::draw` read,
//! one row per plan entry, ragged lists as flat values + offsets, and the grammar masks of
//! the constrained entries. The runner draws with these and hands the tokens (and
//! logprobs) back through `commit_drawn`; the core then advances as after its own draw.

use super::core::{Engine, EngineError};

/// Row b is plan entry b. Entries that do not sample this step (a prefill chunk short of
/// the prompt's end, an aborted request) get a neutral greedy row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingBatch {
    /// Argmax (temperature 0 or top_k 1): the other knobs then do not matter.
    pub greedy: Vec<bool>,
    /// 1 on greedy rows, so a batched division never meets 0.
    pub temperature: Vec<f32>,
    /// 0: no limit.
    pub top_k: Vec<u32>,
    pub top_p: Vec<f32>,
    pub min_p: Vec<f32>,
    pub repetition_penalty: Vec<f32>,
    pub frequency_penalty: Vec<f32>,
    pub presence_penalty: Vec<f32>,
    /// The uniform in [0, 1) the row's draw uses (inverse CDF over the kept weights in
    /// token order): the request's own random stream, which advances when the token is
    /// committed, so the same seed gives the same tokens whatever else is in the batch.
    pub uniforms: Vec<f64>,
    /// Whether the sampled token's logprob is wanted, and how many top alternatives.
    pub logprobs: Vec<bool>,
    pub top_logprobs: Vec<u32>,
    /// Logit bias of row b: `bias_ids[bias_offsets[b]..bias_offsets[b + 1]]` (distinct
    /// ids), added to the logits first.
    pub bias_offsets: Vec<u32>,
    pub bias_ids: Vec<u32>,
    pub bias_values: Vec<f32>,
    /// Tokens a penalty touches (distinct per row) and their count in the output. The
    /// repetition penalty applies to every listed token (the prompt's have count 0): a
    /// logit l becomes l / p if l > 0 else l * p; then frequency and presence:
    /// `l -= frequency * count + presence` where count > 0.
    pub penalty_offsets: Vec<u32>,
    pub penalty_ids: Vec<u32>,
    pub penalty_counts: Vec<u32>,
    /// Tokens that may not come yet (EOS and stop tokens before `min_new_tokens`, EOS
    /// with `ignore_eos`): their logits become -inf after the penalties.
    pub banned_offsets: Vec<u32>,
    pub banned_ids: Vec<u32>,
    /// Row of `masks` holding row b's grammar mask, or -1 when it has none.
    pub mask_rows: Vec<i32>,
    /// Packed masks `[num masks, mask_words]`: bit t % 32 of word t / 32 set where token t
    /// is allowed. Applied last, before logprobs.
    pub masks: Vec<u32>,
    pub mask_words: usize,
}

impl SamplingBatch {
    pub fn num_rows(&self) -> usize {
        self.greedy.len()
    }

    fn push_neutral(&mut self) {
        self.greedy.push(true);
        self.temperature.push(1.0);
        self.top_k.push(0);
        self.top_p.push(1.0);
        self.min_p.push(0.0);
        self.repetition_penalty.push(1.0);
        self.frequency_penalty.push(0.0);
        self.presence_penalty.push(0.0);
        self.uniforms.push(0.0);
        self.logprobs.push(false);
        self.top_logprobs.push(0);
        self.mask_rows.push(-1);
    }

    fn close_row(&mut self) {
        self.bias_offsets.push(self.bias_ids.len() as u32);
        self.penalty_offsets.push(self.penalty_ids.len() as u32);
        self.banned_offsets.push(self.banned_ids.len() as u32);
    }
}

impl Engine {
    /// The step in flight's sampling columns (see `SamplingBatch`). Fills each
    /// constrained entry's grammar mask once: `commit_drawn` checks the drawn tokens
    /// against these same masks. Calling it again refills them (same result: nothing
    /// advanced). Error without a step in flight.
    pub fn sampling_batch(&mut self) -> Result<SamplingBatch, EngineError> {
        if self.in_flight.is_empty() {
            return Err(EngineError::Protocol(
                "sampling_batch needs a scheduled step (call schedule first)".into(),
            ));
        }
        if self.in_flight.iter().any(|f| !f.draft.is_empty()) {
            // a draft's rows are drawn one after another, each after the one before is kept
            return Err(EngineError::Protocol(
                "a step that verifies drafts is sampled by the core: commit its logits".into(),
            ));
        }
        let vocab = self.config.vocab_size;
        let words = vocab.div_ceil(32);
        let mut b = SamplingBatch {
            bias_offsets: vec![0],
            penalty_offsets: vec![0],
            banned_offsets: vec![0],
            mask_words: words,
            ..Default::default()
        };
        let mut step_masks = Vec::with_capacity(self.in_flight.len());
        for f in &self.in_flight {
            let r = match self.requests.get_mut(&f.rid) {
                Some(r) if f.samples && !r.aborted => r,
                _ => {
                    b.push_neutral();
                    b.close_row();
                    step_masks.push(None);
                    continue;
                }
            };
            let p = r.sampler.params();
            let greedy = p.is_greedy();
            b.greedy.push(greedy);
            b.temperature.push(if greedy { 1.0 } else { p.temperature });
            b.top_k.push(p.top_k);
            b.top_p.push(p.top_p);
            b.min_p.push(p.min_p);
            b.repetition_penalty.push(p.repetition_penalty);
            b.frequency_penalty.push(p.frequency_penalty);
            b.presence_penalty.push(p.presence_penalty);
            b.uniforms.push(if greedy { 0.0 } else { r.sampler.peek_uniform() });
            b.logprobs.push(p.logprobs);
            b.top_logprobs.push(p.top_logprobs);
            for &(t, v) in &p.logit_bias {
                b.bias_ids.push(t);
                b.bias_values.push(v);
            }
            r.sampler.penalized_tokens(&mut b.penalty_ids, &mut b.penalty_counts);
            // as `commit::draw`: what may not come yet
            let stops_active = r.generated() >= r.params.min_new_tokens;
            let document_done = r.constraint.as_ref().is_some_and(|c| c.must_end());
            if (r.params.ignore_eos || !stops_active) && !document_done {
                b.banned_ids.extend_from_slice(&self.config.eos_token_ids);
            }
            if !stops_active {
                b.banned_ids.extend(r.params.stops.stop_token_ids.iter().copied());
            }
            let forced = r.forced_token();
            match &mut r.constraint {
                _ if forced.is_some() => {
                    // the thinking budget's end marker: the one token allowed
                    let mut mask = vec![0u32; words];
                    crate::sampling::mask_only(&mut mask, forced.expect("matched"));
                    b.mask_rows.push((b.masks.len() / words) as i32);
                    b.masks.extend_from_slice(&mask);
                    step_masks.push(Some(mask));
                }
                Some(c) => {
                    let mut mask = vec![0u32; words];
                    c.fill_mask(&mut mask);
                    b.mask_rows.push((b.masks.len() / words) as i32);
                    b.masks.extend_from_slice(&mask);
                    step_masks.push(Some(mask));
                }
                None => {
                    b.mask_rows.push(-1);
                    step_masks.push(None);
                }
            }
            b.close_row();
        }
        self.step_masks = step_masks;
        Ok(b)
    }
}
