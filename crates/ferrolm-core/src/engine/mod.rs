//! The engine core: one call per step across the boundary (`schedule`, then `commit`),
//! everything but the forward pass.
//!
//! ```text
//! engine.submit_samples(&rids, prompt, params, constraint)?;  // one rid per sample
//! loop {
//!     let plan = engine.schedule()?;                    // what to run
//!     let out = match runner.forward(&plan) {           // [plan.num_requests(), vocab]
//!         Ok(mut logits) => engine.commit(&mut logits, vocab)?,  // tokens, text, finishes
//!         Err(e) => engine.fail_step(&e.to_string()),   // the step never happened
//!     };
//! }
//! ```
//!
//! A runner that samples on its own device (the logits never reach the host) asks for the
//! step's `sampling_batch()` (sampling knobs, penalties, grammar masks as columns), draws,
//! and hands the tokens back through `commit_drawn` instead of `commit`.
//!
//! Files by job: `core.rs` (state, submit, abort, finishing), `scheduler.rs`,
//! `commit.rs`, `sampling_batch.rs` (the device sampler's columns), `checks.rs` (request
//! checks, invariants).

mod checks;
mod commit;
mod config;
mod constraint;
mod core;
pub mod draft;
mod kv_slots;
mod plan;
mod request;
mod sampling_batch;
mod scheduler;
mod stats;

pub use self::core::{Engine, EngineError};
pub use commit::DeviceDraws;
pub use config::{ConfigError, EngineConfig, SchedulePolicy};
pub use constraint::{AllowList, Constraint, TokenConstraint};
pub use kv_slots::{BadFree, SlotPool};
pub use plan::{BatchPlan, Finished, StepOutputs};
pub use request::{namespace_parts, ErrorKind, FinishReason, Lora, RequestParams, ThinkingBudget};
pub use sampling_batch::SamplingBatch;
pub use stats::{EngineStats, LatencySamples, Load};

#[cfg(test)]
mod tests;
