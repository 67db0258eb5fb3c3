//! Sampling on the CPU: one [`Sampler`] per request, fed one row of logits per step.

mod params;
mod rng;
mod sampler;
pub(crate) mod simd;

pub use params::{InvalidParam, SamplingParams, MAX_TOP_LOGPROBS};
pub use rng::RequestRng;
pub use sampler::{argmax, mask_allows, mask_only, NoAllowedToken, Sampled, Sampler};
