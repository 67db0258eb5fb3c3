//! One HTTP request's generation: its samples submitted through the ingress, their
//! updates read from its egress stream, and the usage to report. Dropping a
//! `Generation` (the handler finished, or its client went away and the server dropped
//! the handler or the response body) aborts whatever still runs, so the KV is freed.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferrolm_core::engine::{Constraint, FinishReason, Finished, RequestParams};
use tokio::sync::oneshot;

use crate::egress::{RequestStream, SampleUpdate};
use crate::errors::{ApiError, ApiResult};
use crate::protocol::core_field_error;
use crate::response::{error_of, Sample};
use crate::state::AppState;

pub struct Generation {
    state: Arc<AppState>,
    pub stream: Arc<RequestStream>,
    /// By sample index.
    pub rids: Vec<u64>,
    pub samples: Vec<Sample>,
    /// Keep the text and ids of each sample (not needed by a stream that sends deltas).
    accumulate: bool,
}

impl Generation {
    /// Room for `num_samples` samples (prompts times n), all of one HTTP request.
    pub fn new(state: Arc<AppState>, num_samples: usize, accumulate: bool) -> Self {
        Generation {
            state,
            stream: RequestStream::new(num_samples),
            rids: Vec::with_capacity(num_samples),
            samples: Vec::with_capacity(num_samples),
            accumulate,
        }
    }

    /// Submits `n` samples of one prompt; answers once the engine core took (or refused)
    /// them. `names` renames the core's fields to the body's.
    pub async fn add(
        &mut self,
        prompt: &[u32],
        mut params: RequestParams,
        n: usize,
        constraint: Option<Constraint>,
        names: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> ApiResult<()> {
        let config = &self.state.config;
        if let Some(queued) = config.max_queued_requests {
            // all of a request's samples are held at once, running or waiting
            let limit = config.max_running_requests + queued;
            let wanted = self.rids.len() + n;
            if wanted > limit {
                return Err(ApiError::bad_request(
                    format!(
                        "n: {wanted} samples are more than the server can ever hold: {limit} ({} running + {queued} waiting); lower n",
                        config.max_running_requests
                    ),
                    "n",
                ));
            }
            let in_flight = self.state.egress.len();
            if in_flight + n > limit {
                return Err(ApiError::new(
                    429,
                    format!(
                        "the server is at capacity ({in_flight} requests running or waiting); retry later"
                    ),
                )
                .with_code("queue_full"));
            }
        }
        self.state.check_available()?;
        if params.queue_timeout_s.is_none() {
            params.queue_timeout_s = config.queue_timeout_s;
        }
        let first = self.state.next_rid.fetch_add(n as u64, Ordering::Relaxed);
        let rids: Vec<u64> = (first..first + n as u64).collect();
        let first_sample = self.rids.len();
        self.state.egress.register(&rids, &self.stream, first_sample);
        // pushed now: were this handler dropped while waiting, Drop aborts them
        self.rids.extend_from_slice(&rids);
        for j in 0..n {
            self.samples.push(Sample {
                index: first_sample + j,
                first_of_prompt: j == 0,
                ..Default::default()
            });
        }
        let (tx, rx) = oneshot::channel();
        self.state.ingress.submit(rids.clone(), prompt, params, constraint, tx);
        let answer = tokio::select! {
            answer = rx => answer,
            stalled = self.state.until_unavailable() => {
                // submitted, and maybe drained later: aborted there when the loop resumes
                self.state.ingress.abort(&rids);
                self.forget_last(&rids);
                return Err(stalled);
            }
        };
        match answer {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                self.forget_last(&rids);
                Err(core_field_error(e, names))
            }
            Err(_) => {
                self.forget_last(&rids);
                Err(ApiError::new(503, "the engine is unavailable: it stopped")
                    .with_code("engine_unavailable"))
            }
        }
    }

    fn forget_last(&mut self, rids: &[u64]) {
        self.state.egress.unregister(rids);
        let keep = self.rids.len() - rids.len();
        self.rids.truncate(keep);
        self.samples.truncate(keep);
    }

    /// The next batch of (sample index, update); empty once every sample has finished.
    /// An engine failure ends the request with a 503.
    pub async fn next(&mut self) -> ApiResult<Vec<(usize, SampleUpdate)>> {
        let batch = self.stream.next().await;
        if batch.is_empty() {
            if let Some(failure) = self.stream.failure() {
                return Err(ApiError::new(503, failure).with_code("engine_unavailable"));
            }
        }
        for (i, u) in &batch {
            let kept = &mut self.samples[*i].output;
            if self.accumulate {
                kept.append(u.clone());
            } else {
                kept.token_ids.extend_from_slice(&u.token_ids); // counted for usage
                kept.finished = u.finished.clone().or(kept.finished.take());
            }
        }
        Ok(batch)
    }

    /// Every sample to its end.
    pub async fn run_to_end(&mut self) -> ApiResult<()> {
        while !self.next().await?.is_empty() {}
        for s in &self.samples {
            if let Some(f @ Finished { reason: FinishReason::Error { .. }, .. }) = &s.output.finished {
                return Err(error_of(f));
            }
        }
        Ok(())
    }

    /// Aborts the samples the engine has not finished.
    pub fn abort_unfinished(&self) -> usize {
        let rids: Vec<u64> =
            self.stream.unfinished().into_iter().filter_map(|i| self.rids.get(i).copied()).collect();
        self.state.ingress.abort(&rids);
        rids.len()
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.abort_unfinished();
        self.state.egress.unregister(&self.rids);
    }
}
