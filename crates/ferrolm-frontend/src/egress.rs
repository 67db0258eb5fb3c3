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
//!
//! Waking the readers: a wake from the step loop's thread (outside the HTTP runtime) is a
//! remote schedule, often with a syscall to unpark a worker, and costs the loop several
//! microseconds per stream. So a step's streams are woken together: the loop hands them
//! to the [`Egress::pump`] task with one wake, and the pump, on a worker, wakes each
//! stream's reader there (a local schedule: no syscall, no cross-thread hand-off each).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
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

    /// Appends `update` to the sample's pending one; the caller wakes the reader.
    fn push_quiet(&self, sample: usize, update: SampleUpdate) {
        let mut p = self.pending.lock().unwrap();
        if update.finished.is_some() {
            p.ended[sample] = true;
        }
        p.samples[sample].append(update);
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
    /// Streams with news for the pump to wake.
    to_wake: Mutex<Vec<Arc<RequestStream>>>,
    /// Wakes the pump.
    pump: Notify,
    /// Whether a pump task runs (else `publish` wakes each stream itself).
    pumping: AtomicBool,
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

    /// The task that wakes, on the HTTP runtime, the readers of the streams `publish`
    /// fills, until [`Egress::stop_pump`]: spawn it there once. `publish` hands it the
    /// streams from this call on (what it hands over before the task first runs waits
    /// for it).
    pub fn pump(self: Arc<Self>) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.pumping.store(true, Ordering::Release);
        async move {
            loop {
                self.pump.notified().await;
                let streams = std::mem::take(&mut *self.to_wake.lock().unwrap());
                for s in streams {
                    s.notify.notify_one();
                }
            }
        }
    }

    /// From now on `publish` wakes each stream itself (the pump's runtime is stopping).
    pub fn stop_pump(&self) {
        self.pumping.store(false, Ordering::Release);
        self.pump.notify_one(); // anything handed over before is still woken if it can be
    }

    fn wake(&self, streams: Vec<Arc<RequestStream>>) {
        if streams.len() > 1 && self.pumping.load(Ordering::Acquire) {
            self.to_wake.lock().unwrap().extend(streams);
            self.pump.notify_one();
        } else {
            // one stream: waking it directly costs what waking the pump would
            for s in streams {
                s.notify.notify_one();
            }
        }
    }

    /// Hands every entry of a step's outputs to its stream and wakes their readers (all
    /// at once, after the last); returns the rids that finished. Outputs of rids nobody
    /// reads any more (a client that went away) are dropped here: their request was
    /// aborted.
    pub fn publish(&self, out: &StepOutputs) -> Vec<u64> {
        let mut finished = Vec::new();
        let mut woken: Vec<Arc<RequestStream>> = Vec::new();
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
            stream.push_quiet(sample, update);
            // the samples of one request come one after another: wake its stream once
            if !woken.last().is_some_and(|w| Arc::ptr_eq(w, &stream)) {
                woken.push(stream);
            }
        }
        drop(routes);
        self.wake(woken);
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
