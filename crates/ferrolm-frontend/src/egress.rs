//! Egress: a step's outputs (the core's columnar `StepOutputs`) go straight to the stream
//! of the HTTP request each belongs to.
//!
//! Each HTTP request has one [`RequestStream`] for all its samples. The step loop appends
//! a sample's new tokens and text to that sample's pending update and wakes the reader;
//! it never waits for a reader and never drops anything. A reader slower than the engine
//! finds several steps merged into one update (a request's output is bounded by its
//! `max_tokens`, so is what waits). So no stream can hold up the step loop or another
//! stream (no head-of-line blocking), and each token is copied once into the pending
//! update and moved out of it once (no O(T²) copying of a growing output).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ferrolm_core::engine::{Finished, StepOutputs};
use tokio::sync::Notify;

/// What one sample produced since its reader last looked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleUpdate {
    pub token_ids: Vec<u32>,
    pub text: String,
    /// One per token (NaN where the request did not ask for logprobs).
    pub logprobs: Vec<f32>,
    /// One list of (token, logprob) alternatives per token.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// Set on the sample's last update.
    pub finished: Option<Finished>,
}

impl SampleUpdate {
    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty() && self.text.is_empty() && self.finished.is_none()
    }

    /// `other` after `self`, merged into `self`.
    pub fn append(&mut self, other: SampleUpdate) {
        self.token_ids.extend_from_slice(&other.token_ids);
        self.text.push_str(&other.text);
        self.logprobs.extend_from_slice(&other.logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        if other.finished.is_some() {
            self.finished = other.finished;
        }
    }
}

#[derive(Default)]
struct Pending {
    /// By sample index: what the reader has not taken yet.
    samples: Vec<SampleUpdate>,
    /// Samples whose finish was taken by the reader.
    done: Vec<bool>,
    /// Samples whose finish the engine has published.
    ended: Vec<bool>,
    /// The engine can no longer serve this request (it failed or is shutting down).
    failure: Option<String>,
}

/// The samples of one HTTP request, as the step loop fills them and the handler reads.
pub struct RequestStream {
    pending: Mutex<Pending>,
    notify: Notify,
}

impl RequestStream {
    pub fn new(num_samples: usize) -> Arc<Self> {
        Arc::new(RequestStream {
            pending: Mutex::new(Pending {
                samples: vec![SampleUpdate::default(); num_samples],
                done: vec![false; num_samples],
                ended: vec![false; num_samples],
                failure: None,
            }),
            notify: Notify::new(),
        })
    }

    fn push(&self, sample: usize, update: SampleUpdate) {
        let mut p = self.pending.lock().unwrap();
        if update.finished.is_some() {
            p.ended[sample] = true;
        }
        p.samples[sample].append(update);
        drop(p);
        self.notify.notify_one();
    }

    fn fail(&self, message: &str) {
        self.pending.lock().unwrap().failure.get_or_insert_with(|| message.to_string());
        self.notify.notify_one();
    }

    /// Waits until some sample has something new; returns (sample index, update) for
    /// every sample that has, in index order. An empty list means every sample has
    /// finished (or the engine failed: see [`RequestStream::failure`]).
    pub async fn next(&self) -> Vec<(usize, SampleUpdate)> {
        loop {
            // registered before looking, so a push between the look and the wait wakes us
            let notified = self.notify.notified();
            {
                let mut p = self.pending.lock().unwrap();
                let Pending { samples, done, failure, .. } = &mut *p;
                let mut out = Vec::new();
                for (i, s) in samples.iter_mut().enumerate() {
                    if !s.is_empty() {
                        if s.finished.is_some() {
                            done[i] = true;
                        }
                        out.push((i, std::mem::take(s)));
                    }
                }
                if !out.is_empty() || failure.is_some() || done.iter().all(|&d| d) {
                    return out;
                }
            }
            notified.await;
        }
    }

    /// Why the engine could not finish this request, once it could not.
    pub fn failure(&self) -> Option<String> {
        self.pending.lock().unwrap().failure.clone()
    }

    /// Whether every sample's last update has been taken.
    pub fn finished(&self) -> bool {
        self.pending.lock().unwrap().done.iter().all(|&d| d)
    }

    /// Samples the engine has not finished (to abort when the client goes away).
    pub fn unfinished(&self) -> Vec<usize> {
        let p = self.pending.lock().unwrap();
        (0..p.ended.len()).filter(|&i| !p.ended[i]).collect()
    }
}

/// Where each live rid's outputs go.
#[derive(Default)]
pub struct Egress {
    routes: Mutex<HashMap<u64, (Arc<RequestStream>, usize)>>,
}

impl Egress {
    pub fn new() -> Self {
        Self::default()
    }

    /// Routes `rids[j]` to sample `first_sample + j` of `stream`.
    pub fn register(&self, rids: &[u64], stream: &Arc<RequestStream>, first_sample: usize) {
        let mut routes = self.routes.lock().unwrap();
        for (j, &rid) in rids.iter().enumerate() {
            routes.insert(rid, (stream.clone(), first_sample + j));
        }
    }

    /// Stops routing `rids` (their request is over, or was never submitted).
    pub fn unregister(&self, rids: &[u64]) {
        let mut routes = self.routes.lock().unwrap();
        for rid in rids {
            routes.remove(rid);
        }
    }

    /// Live routes: requests submitted and not finished.
    pub fn len(&self) -> usize {
        self.routes.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hands every entry of a step's outputs to its stream; returns the rids that
    /// finished. Outputs of rids nobody reads any more (a client that went away) are
    /// dropped here: their request was aborted.
    pub fn publish(&self, out: &StepOutputs) -> Vec<u64> {
        let mut finished = Vec::new();
        let mut routes = self.routes.lock().unwrap();
        for i in 0..out.len() {
            let rid = out.rids[i];
            if out.finished[i].is_some() {
                finished.push(rid);
            }
            let route =
                if out.finished[i].is_some() { routes.remove(&rid) } else { routes.get(&rid).cloned() };
            let Some((stream, sample)) = route else { continue };
            let (a, b) = (out.token_offsets[i] as usize, out.token_offsets[i + 1] as usize);
            let top_logprobs = (a..b)
                .map(|j| {
                    let (ta, tb) = (out.top_offsets[j] as usize, out.top_offsets[j + 1] as usize);
                    (ta..tb).map(|k| (out.top_ids[k], out.top_logprobs[k])).collect()
                })
                .collect();
            let update = SampleUpdate {
                token_ids: out.token_ids[a..b].to_vec(),
                text: out.texts[i].clone(),
                logprobs: out.logprobs[a..b].to_vec(),
                top_logprobs,
                finished: out.finished[i].clone(),
            };
            stream.push(sample, update);
        }
        finished
    }

    /// Every request in flight ends with `message` (the engine is gone).
    pub fn fail_all(&self, message: &str) {
        let routes = std::mem::take(&mut *self.routes.lock().unwrap());
        for (stream, _) in routes.into_values() {
            stream.fail(message);
        }
    }
}

#[cfg(test)]
mod tests;
