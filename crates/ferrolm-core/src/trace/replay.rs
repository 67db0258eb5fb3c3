//! Replaying a trace through a fresh engine with a fake model: each step's sampled token
//! is the one the recording says its request produced next (`commit_tokens`), so the
//! scheduler, the prefix cache and the KV pool do exactly what they did live, without a
//! model, a GPU or Python. After every step the KV pool is checked (every slot free xor
//! held once, by the cache or by one request); at the end no slot may be left held.
//!
//! Requests arrive by step (as recorded: the replay repeats the recording's call order and
//! compares each step's plan with the recorded one) or by time (a virtual clock advanced
//! by a per-step cost, for replaying under other settings, where steps no longer line up).
//!
//! What the fake model cannot reproduce by itself, the replay enforces from the recording:
//! a request ended by its grammar or by sampling is aborted after its last recorded token,
//! a queue timeout is applied where it happened, a request still running when the
//! recording stopped is aborted once its tokens run out.

mod step;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::detok::TokenBytes;
use crate::engine::{BatchPlan, Engine, ErrorKind, FinishReason};

use super::file::Trace;
use super::format::{At, Record};
use super::options::{Arrivals, ReplayOptions};
use super::summary::{ReplaySummary, MAX_LISTED};

/// Replays `trace`; per-step lines (with `options.verbose`) go to `log`. Errors are for a
/// trace that cannot be replayed at all (its settings are refused); what goes wrong in the
/// replay is in the summary.
pub fn replay(
    trace: &Trace,
    options: &ReplayOptions,
    log: &mut dyn FnMut(&str),
) -> Result<ReplaySummary, String> {
    let mut r = Replayer::start(trace, options, log)?;
    r.run(trace, options.arrivals);
    Ok(r.finish())
}

/// The token bytes a trace carries; other ids in the vocabulary have none (only output
/// tokens are detokenized).
struct RecordedVocab {
    size: usize,
    bytes: HashMap<u32, Vec<u8>>,
    special: HashSet<u32>,
}

impl TokenBytes for RecordedVocab {
    fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        ((id as usize) < self.size).then(|| self.bytes.get(&id).map_or(&[][..], Vec::as_slice))
    }
    fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }
}

/// A request as the recording has it.
#[derive(Default)]
struct Expected {
    tokens: Vec<u32>,
    finish: Option<super::format::RecordedFinish>,
}

impl Expected {
    /// Its recorded end comes from a call the replay repeats, or from the engine itself.
    fn ends_by_itself(&self) -> bool {
        match &self.finish {
            Some(f) => matches!(
                f.reason,
                FinishReason::Abort
                    | FinishReason::Error { kind: ErrorKind::StepFailed | ErrorKind::KvCapacity, .. }
            ),
            None => false,
        }
    }
}

/// Why the replay itself ended a request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    AsRecorded,
    CutOff,
}

pub(super) struct Replayer<'a> {
    pub(super) engine: Engine,
    expected: HashMap<u64, Expected>,
    produced: HashMap<u64, usize>,
    live: BTreeSet<u64>,
    ending: HashMap<u64, Ending>,
    /// Queue timeouts of the recording, applied before the step (or at the time) they
    /// happened: the replay's clock is not the recording's.
    expiries: Vec<(u64, At)>,
    in_flight: Option<BatchPlan>,
    /// Empty steps in a row while requests wait, and the most steps the trace may take.
    idle_steps: u64,
    step_limit: u64,
    /// A token id no output or stop uses: the stand-in for a token the recording lacks.
    stand_in: u32,
    s: ReplaySummary,
    notes: Vec<String>,
    clock: Option<f64>,
    check_every: u64,
    verbose: bool,
    log: &'a mut dyn FnMut(&str),
}

impl<'a> Replayer<'a> {
    pub(super) fn start(
        trace: &Trace,
        options: &ReplayOptions,
        log: &'a mut dyn FnMut(&str),
    ) -> Result<Self, String> {
        let mut config = trace.config.clone();
        options.overrides.apply(&mut config);
        let vocab = Arc::new(RecordedVocab {
            size: config.vocab_size,
            bytes: trace.token_bytes.clone(),
            special: trace.special.clone(),
        });
        let engine = Engine::new(config.clone(), vocab).map_err(|e| e.to_string())?;
        let mut r = Replayer::new(engine, trace, options, log);
        r.s.kv_capacity = config.kv_capacity;
        Ok(r)
    }

    pub(super) fn run(&mut self, trace: &Trace, arrivals: Arrivals) {
        match arrivals {
            Arrivals::Steps => self.by_steps(trace),
            Arrivals::Time { step_s, token_s } => {
                self.by_time(trace, step_s.unwrap_or_else(|| trace.mean_step_s()), token_s)
            }
        }
    }

    /// Runs what is left, checks the end, and gives the summary.
    pub(super) fn finish(mut self) -> ReplaySummary {
        self.drain();
        self.final_checks();
        let stats = self.engine.stats();
        self.s.prompt_tokens = stats.prompt_tokens;
        self.s.cache_hit_tokens = stats.cache_hit_tokens;
        self.s.generated_tokens = stats.generation_tokens;
        self.s.retractions = stats.retractions;
        self.s.drafts = stats.spec_drafts;
        self.s.draft_tokens = stats.spec_draft_tokens;
        self.s.accepted_tokens = stats.spec_accepted_tokens;
        self.s
    }

    fn new(engine: Engine, trace: &Trace, options: &ReplayOptions, log: &'a mut dyn FnMut(&str)) -> Self {
        let mut expected: HashMap<u64, Expected> = HashMap::new();
        let mut expiries = Vec::new();
        let mut used: HashSet<u32> = trace.config.eos_token_ids.iter().copied().collect();
        let mut recorded_hits = 0u64;
        for rec in &trace.records {
            match rec {
                Record::Commit { at, out }
                | Record::FailStep { at, out, .. }
                | Record::Outputs { at, out } => {
                    // a queue timeout happens in a schedule call: its step's commit reports
                    // it, or `take_outputs` after that step (which counts the step as done)
                    let step = if matches!(rec, Record::Outputs { .. }) {
                        at.step.saturating_sub(1)
                    } else {
                        at.step
                    };
                    let at = At { step, t: at.t };
                    for o in out {
                        let e = expected.entry(o.rid).or_default();
                        e.tokens.extend_from_slice(&o.tokens);
                        used.extend(&o.tokens);
                        if let Some(f) = &o.finish {
                            recorded_hits += f.cached_tokens as u64;
                            if matches!(f.reason, FinishReason::Error { kind: ErrorKind::QueueTimeout, .. }) {
                                expiries.push((o.rid, at));
                            }
                            e.finish = Some(f.clone());
                        }
                    }
                }
                Record::Submit { params, .. } => used.extend(&params.stops.stop_token_ids),
                _ => {}
            }
        }
        let stand_in = (0..trace.config.vocab_size as u32).find(|t| !used.contains(t)).unwrap_or(0);
        let s = ReplaySummary {
            recorded_steps: trace.recorded_steps(),
            recorded_cache_hit_tokens: recorded_hits,
            ..Default::default()
        };
        Replayer {
            engine,
            expected,
            produced: HashMap::new(),
            live: BTreeSet::new(),
            ending: HashMap::new(),
            expiries,
            in_flight: None,
            idle_steps: 0,
            step_limit: step_limit(trace),
            stand_in,
            s,
            notes: Vec::new(),
            clock: None,
            check_every: options.check_every,
            verbose: options.verbose,
            log,
        }
    }

    // ---- the two ways of arriving ----

    fn by_steps(&mut self, trace: &Trace) {
        for rec in &trace.records {
            match rec {
                Record::Submit { rids, prompt, params, constraint, .. } => {
                    self.submit(rids, prompt, params, constraint)
                }
                Record::Abort { rid, .. } => self.abort(*rid),
                Record::Flush { .. } => {
                    self.engine.flush_cache();
                }
                Record::Schedule { at, plan } => {
                    self.expire(|at_| at_.step <= at.step);
                    self.schedule(Some(plan));
                }
                Record::Commit { .. } => self.commit(None),
                Record::FailStep { message, .. } => self.commit(Some(message)),
                Record::Outputs { .. } => {
                    if self.in_flight.is_none() {
                        let out = self.engine.take_outputs();
                        self.take(&out);
                    }
                }
                Record::Tokens { .. } => {}
            }
        }
        self.commit(None);
    }

    fn by_time(&mut self, trace: &Trace, step_s: f64, token_s: f64) {
        let failures: HashMap<u64, &str> = trace
            .records
            .iter()
            .filter_map(|r| match r {
                Record::FailStep { at, message, .. } => Some((at.step, message.as_str())),
                _ => None,
            })
            .collect();
        let arrivals: Vec<&Record> = trace
            .records
            .iter()
            .filter(|r| matches!(r, Record::Submit { .. } | Record::Abort { .. } | Record::Flush { .. }))
            .collect();
        let (mut clock, mut next) = (0.0f64, 0usize);
        loop {
            while let Some(rec) = arrivals.get(next).filter(|r| time_of(r) <= clock) {
                match rec {
                    Record::Submit { rids, prompt, params, constraint, .. } => {
                        self.submit(rids, prompt, params, constraint)
                    }
                    Record::Abort { rid, .. } => self.abort(*rid),
                    _ => {
                        self.engine.flush_cache();
                    }
                }
                next += 1;
            }
            self.expire(|at| at.t <= clock);
            if self.engine.has_work() {
                if self.stalled() {
                    return;
                }
                self.clock = Some(clock);
                let failure = failures.get(&self.s.steps).copied();
                let tokens = self.schedule(None);
                self.commit(failure);
                clock += step_s + token_s * tokens as f64;
            } else if let Some(rec) = arrivals.get(next) {
                clock = clock.max(time_of(rec));
            } else {
                return;
            }
        }
    }

    // ---- the end ----

    /// Runs what is left until every request has ended; requests the recording left
    /// running end when their recorded tokens run out.
    fn drain(&mut self) {
        self.commit(None);
        // requests the recording never saw end (no more arrive from here on)
        let mut open: Vec<u64> = self
            .live
            .iter()
            .copied()
            .filter(|rid| self.expected.get(rid).is_none_or(|e| e.finish.is_none()))
            .collect();
        loop {
            open.retain(|rid| self.live.contains(rid));
            let exhausted: Vec<u64> = open
                .iter()
                .copied()
                .filter(|rid| {
                    let recorded = self.expected.get(rid).map_or(0, |e| e.tokens.len());
                    self.produced.get(rid).copied().unwrap_or(0) >= recorded
                })
                .collect();
            for rid in exhausted {
                self.end(rid, Ending::CutOff);
            }
            if !self.engine.has_work() {
                return;
            }
            if self.stalled() {
                return;
            }
            self.schedule(None);
            self.commit(None);
        }
    }

    /// No request left, so every used slot must be the cache's; flushing it must free them all.
    fn final_checks(&mut self) {
        let step = self.s.steps;
        self.check(step);
        if self.engine.num_requests() > 0 {
            return; // reported as a stall
        }
        let load = self.engine.load();
        if load.kv_used != load.cached_tokens {
            self.violation(format!(
                "at the end: {} slots used but {} cached, with no request left: {} leaked",
                load.kv_used,
                load.cached_tokens,
                load.kv_used as i64 - load.cached_tokens as i64
            ));
        }
        if self.engine.flush_cache() {
            let used = self.engine.load().kv_used;
            if used != 0 {
                self.violation(format!("at the end: {used} slots still used after flushing the cache"));
            }
        }
    }
}

/// Steps in a row that schedule nothing while requests wait: the engine is stuck.
const MAX_IDLE_STEPS: u64 = 1000;

impl Replayer<'_> {
    /// Whether the engine has stopped making progress (reported as a violation): a run of
    /// empty steps while requests wait, or more steps than the trace's work can take
    /// (every non-empty step runs at least one token; retractions may recompute some).
    fn stalled(&mut self) -> bool {
        let why = if self.idle_steps > MAX_IDLE_STEPS {
            format!("{} steps in a row scheduled nothing", self.idle_steps)
        } else if self.s.steps >= self.step_limit {
            format!("{} steps, more than the trace's work needs", self.s.steps)
        } else {
            return false;
        };
        let n = self.engine.num_requests();
        self.violation(format!("the engine stalls: {why}, with {n} requests left"));
        true
    }
}

/// The most steps a trace's work can take: each of its tokens (prompts and outputs, up to
/// `max_new_tokens`) run once, four times over for recomputation after retractions.
fn step_limit(trace: &Trace) -> u64 {
    let work: u64 = trace
        .records
        .iter()
        .map(|r| match r {
            Record::Submit { rids, prompt, params, .. } => {
                (rids.len() * (prompt.len() + params.max_new_tokens)) as u64
            }
            _ => 0,
        })
        .sum();
    trace.recorded_steps().saturating_add(work).saturating_mul(4).saturating_add(10_000)
}

fn time_of(r: &Record) -> f64 {
    match r {
        Record::Submit { at, .. } | Record::Abort { at, .. } | Record::Flush { at } => at.t,
        _ => 0.0,
    }
}

fn rid_list(rids: &[u64]) -> String {
    rids.iter().map(|r| format!("r{r}")).collect::<Vec<_>>().join(" ")
}

fn reason_key(r: &FinishReason) -> String {
    match r {
        FinishReason::Stop(_) => "stop".into(),
        FinishReason::Length => "length".into(),
        FinishReason::Abort => "abort".into(),
        FinishReason::Error { kind, .. } => format!("error:{kind}"),
    }
}

/// The same end: the same stop (token or string), or the same kind of error.
fn same_reason(a: &FinishReason, b: &FinishReason) -> bool {
    match (a, b) {
        (FinishReason::Error { kind: x, .. }, FinishReason::Error { kind: y, .. }) => x == y,
        _ => a == b,
    }
}
