//! Ingress: requests, aborts and control calls from the HTTP threads, queued for the step
//! loop, which drains them into the engine core at the start of each step.
//!
//! The queue is columnar: every prompt's token ids go into one flat buffer (a
//! submission keeps its range), so queueing a request is an append, not an allocation
//! per request. The step loop swaps the whole inbox out under the lock and works on it
//! outside the lock, so an HTTP thread never waits for a step.
//!
//! While there is no work the step loop blocks in [`Ingress::wait`] on a condition
//! variable (no busy spin); a push wakes it at once.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use ferrolm_core::engine::{
    Constraint, Engine, EngineError, EngineStats, LatencySamples, Load, RequestParams,
};
use tokio::sync::oneshot;

pub struct Submission {
    /// One per sample of the prompt.
    pub rids: Vec<u64>,
    /// Where the prompt sits in the inbox's flat id buffer.
    pub prompt: Range<usize>,
    pub params: RequestParams,
    pub constraint: Option<Constraint>,
    pub reply: oneshot::Sender<Result<(), EngineError>>,
}

/// Questions for the engine, answered between steps.
pub enum Call {
    Stats(oneshot::Sender<(EngineStats, Load)>),
    Metrics(oneshot::Sender<(EngineStats, Load, LatencySamples)>),
    FlushCache(oneshot::Sender<bool>),
    AbortAll(oneshot::Sender<usize>),
}

#[derive(Default)]
struct Inbox {
    ids: Vec<u32>,
    submits: Vec<Submission>,
    aborts: Vec<u64>,
    calls: Vec<Call>,
    stopped: bool,
}

impl Inbox {
    fn is_empty(&self) -> bool {
        self.submits.is_empty() && self.aborts.is_empty() && self.calls.is_empty()
    }
}

/// What a drain did. The step loop keeps no state of its own about requests: what the
/// runner needs of them comes with each plan (`BatchPlan::plain_greedy`, `ignore_eos`).
#[derive(Debug, Default, PartialEq)]
pub struct Drained {
    pub submitted: usize,
    pub rejected: usize,
}

pub struct Ingress {
    inbox: Mutex<Inbox>,
    ready: Condvar,
    /// The inbox the step loop swapped out last, kept for its buffers' capacity.
    spare: Mutex<Inbox>,
    /// The step loop's heartbeat: when it last came round (drained, or woke from a
    /// wait), in milliseconds since `epoch`; a loop blocked in `wait` is idle, not stuck.
    epoch: Instant,
    last_beat_ms: AtomicU64,
    in_wait: AtomicBool,
}

impl Default for Ingress {
    fn default() -> Self {
        Ingress {
            inbox: Mutex::default(),
            ready: Condvar::new(),
            spare: Mutex::default(),
            epoch: Instant::now(),
            last_beat_ms: AtomicU64::new(0),
            in_wait: AtomicBool::new(false),
        }
    }
}

impl Ingress {
    pub fn new() -> Self {
        Self::default()
    }

    fn beat(&self) {
        self.last_beat_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long since the step loop last came round (zero while it waits for work): a
    /// step stuck in the forward, or a frozen loop, shows here.
    pub fn since_beat(&self) -> Duration {
        if self.in_wait.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_beat_ms.load(Ordering::Relaxed)))
    }

    /// Queues a prompt's samples; `reply` is answered by the drain that submits them.
    pub fn submit(
        &self,
        rids: Vec<u64>,
        prompt: &[u32],
        params: RequestParams,
        constraint: Option<Constraint>,
        reply: oneshot::Sender<Result<(), EngineError>>,
    ) {
        let mut inbox = self.inbox.lock().unwrap();
        let start = inbox.ids.len();
        inbox.ids.extend_from_slice(prompt);
        let prompt = start..inbox.ids.len();
        inbox.submits.push(Submission { rids, prompt, params, constraint, reply });
        drop(inbox);
        self.ready.notify_one();
    }

    pub fn abort(&self, rids: &[u64]) {
        if rids.is_empty() {
            return;
        }
        self.inbox.lock().unwrap().aborts.extend_from_slice(rids);
        self.ready.notify_one();
    }

    pub fn call(&self, call: Call) {
        self.inbox.lock().unwrap().calls.push(call);
        self.ready.notify_one();
    }

    /// Wakes a waiting step loop for good: [`Ingress::wait`] returns at once from now on.
    pub fn stop(&self) {
        self.inbox.lock().unwrap().stopped = true;
        self.ready.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        self.inbox.lock().unwrap().stopped
    }

    /// Blocks until something is queued, the ingress is stopped, or `timeout` passes;
    /// true when something is queued.
    pub fn wait(&self, timeout: Duration) -> bool {
        self.in_wait.store(true, Ordering::Relaxed);
        let queued = self.wait_for_work(timeout);
        self.beat();
        self.in_wait.store(false, Ordering::Relaxed);
        queued
    }

    fn wait_for_work(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut inbox = self.inbox.lock().unwrap();
        while inbox.is_empty() && !inbox.stopped {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            inbox = self.ready.wait_timeout(inbox, deadline - now).unwrap().0;
        }
        !inbox.is_empty()
    }

    /// Moves everything queued into `engine`: submissions first (each answered), then
    /// aborts (so an abort of a request queued in the same drain finds it), then calls.
    pub fn drain(&self, engine: &mut Engine) -> Drained {
        self.beat();
        let mut spare = std::mem::take(&mut *self.spare.lock().unwrap());
        {
            let mut inbox = self.inbox.lock().unwrap();
            if inbox.is_empty() {
                return Drained::default();
            }
            spare.stopped = inbox.stopped;
            std::mem::swap(&mut *inbox, &mut spare);
        }
        let mut batch = spare;
        let mut drained = Drained::default();
        for s in batch.submits.drain(..) {
            let result = engine.submit_samples(&s.rids, &batch.ids[s.prompt.clone()], s.params, s.constraint);
            if result.is_ok() {
                drained.submitted += 1;
            } else {
                drained.rejected += 1;
            }
            let _ = s.reply.send(result); // a handler that went away: its request is aborted below
        }
        for rid in batch.aborts.drain(..) {
            engine.abort(rid);
        }
        for call in batch.calls.drain(..) {
            answer(engine, call);
        }
        batch.ids.clear();
        *self.spare.lock().unwrap() = batch;
        drained
    }
}

fn answer(engine: &mut Engine, call: Call) {
    match call {
        Call::Stats(reply) => {
            let _ = reply.send((engine.stats(), engine.load()));
        }
        Call::Metrics(reply) => {
            let _ = reply.send((engine.stats(), engine.load(), engine.take_latencies()));
        }
        Call::FlushCache(reply) => {
            let _ = reply.send(engine.flush_cache());
        }
        Call::AbortAll(reply) => {
            let _ = reply.send(engine.abort_all());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_heartbeat_counts_from_the_last_time_the_loop_came_round() {
        let ingress = Ingress::new();
        std::thread::sleep(Duration::from_millis(30));
        // never came round yet: silent since it was made
        assert!(ingress.since_beat() >= Duration::from_millis(30));
        assert!(!ingress.wait(Duration::ZERO)); // a wait that returns is a beat
        let after_wait = ingress.since_beat();
        assert!(after_wait < Duration::from_millis(30), "{after_wait:?}");
    }

    #[test]
    fn a_loop_blocked_in_wait_is_idle_not_silent() {
        let ingress = Arc::new(Ingress::new());
        std::thread::sleep(Duration::from_millis(30));
        let waiter = {
            let ingress = ingress.clone();
            std::thread::spawn(move || ingress.wait(Duration::from_secs(60)))
        };
        while !ingress.in_wait.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
        assert_eq!(ingress.since_beat(), Duration::ZERO);
        ingress.abort(&[1]); // wakes it: something is queued
        assert!(waiter.join().unwrap());
    }
}
