//! Sampling parameters of one request, checked once when the request arrives so the
//! per-token path never meets a bad value.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no limit.
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    /// HF semantics: logits of tokens seen in the prompt or output are divided (if
    /// positive) or multiplied (if negative) by this; 1 is off.
    pub repetition_penalty: f32,
    /// OpenAI semantics, over generated tokens: `logit -= frequency * count`.
    pub frequency_penalty: f32,
    /// OpenAI semantics, over generated tokens: `logit -= presence` once a token appeared.
    pub presence_penalty: f32,
    /// Added to the logit of each listed token.
    pub logit_bias: Vec<(u32, f32)>,
    /// `None` draws a seed from the engine's own stream.
    pub seed: Option<u64>,
    /// Return the sampled token's logprob, plus this many top alternatives.
    pub logprobs: bool,
    pub top_logprobs: u32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            logprobs: false,
            top_logprobs: 0,
        }
    }
}

/// A parameter out of range; names the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidParam {
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for InvalidParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for InvalidParam {}

/// Most alternatives a caller may ask for (OpenAI allows 20).
pub const MAX_TOP_LOGPROBS: u32 = 20;

fn bad(field: &'static str, message: String) -> InvalidParam {
    InvalidParam { field, message }
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks every field against `vocab_size`.
    pub fn validate(&self, vocab_size: usize) -> Result<(), InvalidParam> {
        let finite = |field, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(bad(field, format!("must be a finite number, got {v}")))
            }
        };
        finite("temperature", self.temperature)?;
        if !(0.0..=100.0).contains(&self.temperature) {
            return Err(bad("temperature", format!("must be in [0, 100], got {}", self.temperature)));
        }
        finite("top_p", self.top_p)?;
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("top_p", format!("must be in (0, 1], got {}", self.top_p)));
        }
        finite("min_p", self.min_p)?;
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("min_p", format!("must be in [0, 1], got {}", self.min_p)));
        }
        finite("repetition_penalty", self.repetition_penalty)?;
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 10.0) {
            return Err(bad(
                "repetition_penalty",
                format!("must be in (0, 10], got {}", self.repetition_penalty),
            ));
        }
        for (field, v) in
            [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)]
        {
            finite(field, v)?;
            if !(-2.0..=2.0).contains(&v) {
                return Err(bad(field, format!("must be in [-2, 2], got {v}")));
            }
        }
        for &(token, bias) in &self.logit_bias {
            if token as usize >= vocab_size {
                return Err(bad(
                    "logit_bias",
                    format!("token {token} is outside the vocabulary (size {vocab_size})"),
                ));
            }
            finite("logit_bias", bias)?;
            if !(-100.0..=100.0).contains(&bias) {
                return Err(bad(
                    "logit_bias",
                    format!("bias of token {token} must be in [-100, 100], got {bias}"),
                ));
            }
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(bad(
                "top_logprobs",
                format!("must be at most {MAX_TOP_LOGPROBS}, got {}", self.top_logprobs),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_field() {
        assert!(SamplingParams::default().validate(10).is_ok());
        let cases: Vec<(SamplingParams, &str)> = vec![
            (SamplingParams { temperature: -1.0, ..Default::default() }, "temperature"),
            (SamplingParams { temperature: f32::NAN, ..Default::default() }, "temperature"),
            (SamplingParams { top_p: 0.0, ..Default::default() }, "top_p"),
            (SamplingParams { min_p: 1.5, ..Default::default() }, "min_p"),
            (SamplingParams { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty"),
            (SamplingParams { frequency_penalty: 3.0, ..Default::default() }, "frequency_penalty"),
            (SamplingParams { presence_penalty: f32::INFINITY, ..Default::default() }, "presence_penalty"),
            (SamplingParams { logit_bias: vec![(10, 1.0)], ..Default::default() }, "logit_bias"),
            (SamplingParams { logit_bias: vec![(1, 1000.0)], ..Default::default() }, "logit_bias"),
            (SamplingParams { top_logprobs: 21, ..Default::default() }, "top_logprobs"),
        ];
        for (p, field) in cases {
            assert_eq!(p.validate(10).unwrap_err().field, field, "{p:?}");
        }
    }
}
