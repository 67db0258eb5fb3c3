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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

use crate::detok::TokenBytes;
use crate::engine::{
    BatchPlan, Constraint, Engine, EngineConfig, ErrorKind, FinishReason, RequestParams, SchedulePolicy,
    StepOutputs,
};
use crate::radix::EvictionPolicy;

use super::format::{parse_header, At, PlanEntry, Record, RecordedConstraint};

/// A trace read into memory.
#[derive(Clone, Debug)]
pub struct Trace {
    pub config: EngineConfig,
    pub records: Vec<Record>,
    token_bytes: HashMap<u32, Vec<u8>>,
    special: HashSet<u32>,
}

impl Trace {
    /// Reads a trace; errors name the line.
    pub fn read(reader: impl BufRead) -> Result<Trace, String> {
        let mut lines = reader.lines().enumerate().filter(|(_, l)| l.as_ref().map_or(true, |l| !l.trim().is_empty()));
        let parse = |n: usize, line: std::io::Result<String>| -> Result<serde_json::Value, String> {
            let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
            serde_json::from_str(&line).map_err(|e| format!("line {}: not JSON: {e}", n + 1))
        };
        let (n, first) = lines.next().ok_or("the trace is empty (no header line)")?;
        let config = parse_header(&parse(n, first)?).map_err(|e| format!("line {}: {e}", n + 1))?;
        let mut trace = Trace { config, records: Vec::new(), token_bytes: HashMap::new(), special: HashSet::new() };
        for (n, line) in lines {
            let record = Record::from_json(&parse(n, line)?).map_err(|e| format!("line {}: {e}", n + 1))?;
            if let Record::Tokens { tokens, special } = &record {
                trace.token_bytes.extend(tokens.iter().cloned());
                trace.special.extend(special);
            }
            trace.records.push(record);
        }
        Ok(trace)
    }

    pub fn open(path: &Path) -> Result<Trace, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Trace::read(std::io::BufReader::new(file)).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn recorded_steps(&self) -> u64 {
        self.records.iter().filter(|r| matches!(r, Record::Schedule { .. })).count() as u64
    }

    /// Mean seconds from a step's plan to its commit in the recording (the forward pass
    /// and the commit): the default step cost of a replay by time.
    pub fn mean_step_s(&self) -> f64 {
        let mut scheduled: Option<f64> = None;
        let (mut total, mut n) = (0.0, 0usize);
        for r in &self.records {
            match r {
                Record::Schedule { at, plan } => scheduled = (!plan.is_empty()).then_some(at.t),
                Record::Commit { at, .. } | Record::FailStep { at, .. } => {
                    if let Some(s) = scheduled.take() {
                        total += (at.t - s).max(0.0);
                        n += 1;
                    }
                }
                _ => {}
            }
        }
        if n == 0 {
            0.01
        } else {
            total / n as f64
        }
    }
}

/// How requests arrive in a replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// In the recording's call order: a submit before step s arrives before step s.
    Steps,
    /// At their recorded times, on a virtual clock that advances `step_s` (default: the
    /// recording's mean step) plus `token_s` per token in the plan at each step.
    Time { step_s: Option<f64>, token_s: f64 },
}

/// Settings to replay under instead of the recorded ones (what-if and bisection).
#[derive(Clone, Debug, Default)]
pub struct ConfigOverrides {
    pub kv_capacity: Option<usize>,
    pub max_running_requests: Option<usize>,
    pub max_prefill_tokens: Option<usize>,
    pub schedule_policy: Option<SchedulePolicy>,
    pub eviction_policy: Option<EvictionPolicy>,
    pub enable_prefix_cache: Option<bool>,
    pub new_token_ratio: Option<f64>,
}

impl ConfigOverrides {
    pub fn apply(&self, c: &mut EngineConfig) {
        let ConfigOverrides {
            kv_capacity,
            max_running_requests,
            max_prefill_tokens,
            schedule_policy,
            eviction_policy,
            enable_prefix_cache,
            new_token_ratio,
        } = self.clone();
        c.kv_capacity = kv_capacity.unwrap_or(c.kv_capacity);
        c.max_running_requests = max_running_requests.unwrap_or(c.max_running_requests);
        c.max_prefill_tokens = max_prefill_tokens.unwrap_or(c.max_prefill_tokens);
        c.schedule_policy = schedule_policy.unwrap_or(c.schedule_policy);
        c.eviction_policy = eviction_policy.unwrap_or(c.eviction_policy);
        c.enable_prefix_cache = enable_prefix_cache.unwrap_or(c.enable_prefix_cache);
        c.new_token_ratio = new_token_ratio.unwrap_or(c.new_token_ratio);
    }
}

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub arrivals: Arrivals,
    pub overrides: ConfigOverrides,
    /// Check the KV pool every this many steps (0: at the end only).
    pub check_every: u64,
    /// One line per step through the `log` callback.
    pub verbose: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions { arrivals: Arrivals::Steps, overrides: ConfigOverrides::default(), check_every: 1, verbose: false }
    }
}

/// What a replay found. `violations` lists the first broken KV checks (up to
/// [`MAX_LISTED`]); `violation_count` counts them all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplaySummary {
    /// Requests submitted (one per sample).
    pub requests: usize,
    pub recorded_steps: u64,
    pub steps: u64,
    /// Steps whose plan was compared with the recorded one (arrivals by step only).
    pub compared_steps: u64,
    pub diverged_steps: u64,
    pub first_divergence: Option<String>,
    pub prompt_tokens: u64,
    pub cache_hit_tokens: u64,
    /// The sum of the recorded requests' `cached_tokens`.
    pub recorded_cache_hit_tokens: u64,
    pub generated_tokens: u64,
    pub admissions: u64,
    /// Plan entries that ran part of a prompt (chunked prefill).
    pub prefill_chunks: u64,
    pub retractions: u64,
    /// By reason: `length`, `stop`, `abort`, `error:<kind>` (enforced ends under their
    /// recorded reason).
    pub finishes: BTreeMap<String, usize>,
    /// Ends the fake model cannot produce, applied from the recording.
    pub enforced_ends: usize,
    /// Requests still running when the recording stopped, aborted after their tokens.
    pub cut_off: usize,
    /// Submits the replaying engine refused (possible under overrides).
    pub refused: usize,
    /// Requests that ended otherwise than recorded (reason, or cached prompt tokens).
    pub finish_mismatches: usize,
    pub first_mismatch: Option<String>,
    /// Tokens asked for beyond what the recording holds (a stand-in was used).
    pub missing_tokens: usize,
    pub kv_checks: u64,
    pub kv_capacity: usize,
    pub peak_kv_used: usize,
    pub peak_running: usize,
    pub violations: Vec<String>,
    pub violation_count: usize,
}

/// Violations listed in a summary (all are counted).
pub const MAX_LISTED: usize = 20;

impl ReplaySummary {
    /// The replay kept every KV check.
    pub fn is_ok(&self) -> bool {
        self.violation_count == 0
    }

    /// Every step and every finish as recorded.
    pub fn is_same(&self) -> bool {
        self.diverged_steps == 0 && self.finish_mismatches == 0 && self.missing_tokens == 0 && self.refused == 0
    }

    /// The exit status of `ferrolm-replay`: 0 the checks held, 1 a KV check failed (or the
    /// engine stalled), 3 with `expect_same` when the replay differs from the recording.
    /// (2 is for bad arguments and unreadable traces.)
    pub fn exit_code(&self, expect_same: bool) -> u8 {
        if !self.is_ok() {
            1
        } else if expect_same && !self.is_same() {
            3
        } else {
            0
        }
    }

    /// The report, one line each.
    pub fn report(&self) -> Vec<String> {
        let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
        let mut lines = vec![format!(
            "replayed {} requests in {} steps (recorded: {} steps)",
            self.requests, self.steps, self.recorded_steps
        )];
        if self.compared_steps > 0 {
            let mut l = format!(
                "decisions: {} of {} steps scheduled as recorded",
                self.compared_steps - self.diverged_steps,
                self.compared_steps
            );
            if let Some(d) = &self.first_divergence {
                l += &format!("; first divergence: {d}");
            }
            lines.push(l);
        } else {
            lines.push("decisions: not compared (arrivals by time)".into());
        }
        lines.push(format!(
            "tokens: prompt {}, cache hits {} ({:.1}%; recorded {}), generated {}",
            self.prompt_tokens,
            self.cache_hit_tokens,
            pct(self.cache_hit_tokens, self.prompt_tokens),
            self.recorded_cache_hit_tokens,
            self.generated_tokens
        ));
        lines.push(format!(
            "schedule: {} admissions, {} prefill chunks, {} retractions, peak {} running",
            self.admissions, self.prefill_chunks, self.retractions, self.peak_running
        ));
        let finishes: Vec<String> = self.finishes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let mut l = format!(
            "finishes: {}; ended as recorded {}, cut off {}, refused {}, mismatches {}, missing tokens {}",
            if finishes.is_empty() { "none".to_string() } else { finishes.join(", ") },
            self.enforced_ends,
            self.cut_off,
            self.refused,
            self.finish_mismatches,
            self.missing_tokens
        );
        if let Some(m) = &self.first_mismatch {
            l += &format!("; first mismatch: {m}");
        }
        lines.push(l);
        lines.push(format!(
            "KV: {} checks, peak {} of {} slots used, {} violations{}",
            self.kv_checks,
            self.peak_kv_used,
            self.kv_capacity,
            self.violation_count,
            if self.is_ok() { "; no leaked slot at the end" } else { "" }
        ));
        lines.extend(self.violations.iter().map(|v| format!("VIOLATION {v}")));
        lines
    }
}

/// Replays `trace`; per-step lines (with `options.verbose`) go to `log`. Errors are for a
/// trace that cannot be replayed at all (its settings are refused); what goes wrong in the
/// replay is in the summary.
pub fn replay(trace: &Trace, options: &ReplayOptions, log: &mut dyn FnMut(&str)) -> Result<ReplaySummary, String> {
    let mut r = Replayer::start(trace, options, log)?;
    r.run(trace, options.arrivals);
    Ok(r.finish(trace))
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
        let engine = Engine::new(config.clone(), vocab)?;
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
    pub(super) fn finish(mut self, trace: &Trace) -> ReplaySummary {
        self.drain(trace.recorded_steps());
        self.final_checks();
        let stats = self.engine.stats();
        self.s.prompt_tokens = stats.prompt_tokens;
        self.s.cache_hit_tokens = stats.cache_hit_tokens;
        self.s.generated_tokens = stats.generation_tokens;
        self.s.retractions = stats.retractions;
        self.s
    }

    fn new(engine: Engine, trace: &Trace, options: &ReplayOptions, log: &'a mut dyn FnMut(&str)) -> Self {
        let mut expected: HashMap<u64, Expected> = HashMap::new();
        let mut expiries = Vec::new();
        let mut used: HashSet<u32> = trace.config.eos_token_ids.iter().copied().collect();
        let mut recorded_hits = 0u64;
        for rec in &trace.records {
            match rec {
                Record::Commit { at, out } | Record::FailStep { at, out, .. } | Record::Outputs { at, out } => {
                    // a queue timeout happens in a schedule call: its step's commit reports
                    // it, or `take_outputs` after that step (which counts the step as done)
                    let step = if matches!(rec, Record::Outputs { .. }) { at.step.saturating_sub(1) } else { at.step };
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
                Record::Submit { rids, prompt, params, constraint, .. } => self.submit(rids, prompt, params, constraint),
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
        let limit = step_limit(trace.recorded_steps());
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
                if self.s.steps >= limit {
                    self.violation(format!("no end after {limit} steps: the engine stalls"));
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

    // ---- calls ----

    fn submit(&mut self, rids: &[u64], prompt: &[u32], params: &RequestParams, constraint: &RecordedConstraint) {
        let mut params = params.clone();
        params.queue_timeout_s = None; // applied from the recording (see `expiries`)
        let constraint = match constraint {
            RecordedConstraint::AllowedTokens(ids) => Some(Constraint::AllowedTokens(ids.clone())),
            _ => None,
        };
        self.s.requests += rids.len();
        match self.engine.submit_samples(rids, prompt, params, constraint) {
            Ok(()) => self.live.extend(rids),
            Err(e) => {
                self.s.refused += rids.len();
                self.notes.push(format!("refused {}: {e}", rid_list(rids)));
            }
        }
    }

    fn abort(&mut self, rid: u64) {
        if self.engine.abort(rid) {
            let out = self.engine.take_outputs();
            self.take(&out);
        }
    }

    fn end(&mut self, rid: u64, why: Ending) {
        self.ending.insert(rid, why);
        self.abort(rid);
    }

    /// Applies the recorded queue timeouts that are due.
    fn expire(&mut self, due: impl Fn(&At) -> bool) {
        let (now, later): (Vec<_>, Vec<_>) = self.expiries.drain(..).partition(|(_, at)| due(at));
        self.expiries = later;
        for (rid, _) in now {
            if self.live.contains(&rid) {
                self.end(rid, Ending::AsRecorded);
            }
        }
    }

    /// Schedules a step (committing one left in flight first); compares its plan with the
    /// recorded one when given. Returns the plan's token count.
    fn schedule(&mut self, recorded: Option<&[PlanEntry]>) -> usize {
        self.commit(None);
        let before: Vec<u64> = self.engine.running_rids().to_vec();
        let plan = match self.engine.schedule() {
            Ok(plan) => plan,
            Err(e) => {
                self.violation(format!("step {}: schedule failed: {e}", self.s.steps));
                return 0;
            }
        };
        let entries = plan_entries(&plan);
        if let Some(recorded) = recorded {
            self.s.compared_steps += 1;
            if recorded != entries.as_slice() {
                self.s.diverged_steps += 1;
                let d = format!(
                    "step {}: recorded [{}], replayed [{}]",
                    self.s.steps,
                    describe_plan(recorded),
                    describe_plan(&entries)
                );
                self.notes.push("DIVERGED from the recording".into());
                self.s.first_divergence.get_or_insert(d);
            }
        }
        let after: HashSet<u64> = self.engine.running_rids().iter().copied().collect();
        let waiting: HashSet<u64> = self.engine.waiting_rids().collect();
        let retracted: Vec<u64> = before.iter().copied().filter(|r| !after.contains(r) && waiting.contains(r)).collect();
        let mut prefill = Vec::new();
        let mut decodes = 0;
        for e in &entries {
            let admitted = !before.contains(&e.rid);
            if admitted {
                self.s.admissions += 1;
            }
            if !e.samples {
                self.s.prefill_chunks += 1;
            }
            if admitted || e.len > 1 || !e.samples {
                let mut d = format!("r{} {}+{}", e.rid, e.start, e.len);
                if admitted && e.start > 0 {
                    d += &format!(" hit {}", e.start);
                }
                if !e.samples {
                    d += " chunk";
                }
                prefill.push(d);
            } else {
                decodes += 1;
            }
        }
        if self.verbose {
            let mut n = format!("{} req {} tok", plan.num_requests(), plan.num_tokens());
            if !prefill.is_empty() {
                n += &format!(" | prefill {}", prefill.join(", "));
            }
            if decodes > 0 {
                n += &format!(" | decode {decodes}");
            }
            if !retracted.is_empty() {
                n += &format!(" | retract {}", rid_list(&retracted));
            }
            self.notes.insert(0, n);
        }
        self.s.peak_running = self.s.peak_running.max(after.len());
        let tokens = plan.num_tokens();
        if plan.is_empty() {
            let out = self.engine.take_outputs();
            self.take(&out);
            self.end_step();
        } else {
            self.in_flight = Some(plan);
        }
        tokens
    }

    /// Commits the step in flight, if any, with the recorded tokens (or fails it).
    fn commit(&mut self, failure: Option<&str>) {
        let Some(plan) = self.in_flight.take() else { return };
        let result = match failure {
            Some(message) => Ok(self.engine.fail_step(message)),
            None => {
                let tokens: Vec<u32> =
                    plan.rids.iter().zip(&plan.samples).map(|(&rid, &samples)| self.token_for(rid, samples)).collect();
                self.engine.commit_tokens(&tokens)
            }
        };
        match result {
            Ok(out) => self.take(&out),
            Err(e) => self.violation(format!("step {}: commit failed: {e}", self.s.steps)),
        }
        // ends the fake model cannot produce, where the recording has them
        for &rid in &plan.rids {
            if !self.live.contains(&rid) {
                continue;
            }
            let Some(e) = self.expected.get(&rid) else { continue };
            if e.finish.is_some() && !e.ends_by_itself() && self.produced.get(&rid).copied().unwrap_or(0) >= e.tokens.len() {
                self.end(rid, Ending::AsRecorded);
            }
        }
        self.end_step();
    }

    fn token_for(&mut self, rid: u64, samples: bool) -> u32 {
        if !samples {
            return 0; // not read
        }
        let e = self.expected.entry(rid).or_default();
        let i = self.produced.get(&rid).copied().unwrap_or(0);
        match e.tokens.get(i) {
            Some(&t) => t,
            None => {
                // a request ended by its grammar or sampling drew no token in its last step
                let ended_here = e.finish.is_some() && !e.ends_by_itself();
                if !ended_here {
                    self.s.missing_tokens += 1;
                }
                self.stand_in
            }
        }
    }

    /// Takes in a batch of outputs: tokens, finishes, and how they compare.
    fn take(&mut self, out: &StepOutputs) {
        for i in 0..out.len() {
            let rid = out.rids[i];
            let n = (out.token_offsets[i + 1] - out.token_offsets[i]) as usize;
            *self.produced.entry(rid).or_default() += n;
            let Some(fin) = &out.finished[i] else { continue };
            self.live.remove(&rid);
            let expected = self.expected.get(&rid).and_then(|e| e.finish.clone());
            let ending = self.ending.remove(&rid);
            let key = match (ending, &expected) {
                (Some(Ending::AsRecorded), Some(f)) => {
                    self.s.enforced_ends += 1;
                    reason_key(&f.reason)
                }
                (Some(Ending::CutOff), _) => {
                    self.s.cut_off += 1;
                    reason_key(&fin.reason)
                }
                _ => reason_key(&fin.reason),
            };
            if self.verbose {
                self.notes.push(format!("finish r{rid} {key}"));
            }
            *self.s.finishes.entry(key).or_default() += 1;
            let mismatch = match &expected {
                None => None, // cut off by the end of the recording
                Some(f) if ending.is_none() && !same_reason(&f.reason, &fin.reason) => Some(format!(
                    "request {rid} ended with {}, recorded {}",
                    reason_key(&fin.reason),
                    reason_key(&f.reason)
                )),
                Some(f) if f.cached_tokens != fin.cached_tokens => Some(format!(
                    "request {rid} found {} prompt tokens cached, recorded {}",
                    fin.cached_tokens, f.cached_tokens
                )),
                Some(_) => None,
            };
            if let Some(m) = mismatch {
                self.s.finish_mismatches += 1;
                self.s.first_mismatch.get_or_insert(m);
            }
        }
    }

    fn end_step(&mut self) {
        let step = self.s.steps;
        self.s.steps += 1;
        if self.check_every > 0 && self.s.steps % self.check_every == 0 {
            self.check(step);
        }
        let load = self.engine.load();
        self.s.peak_kv_used = self.s.peak_kv_used.max(load.kv_used);
        if self.verbose {
            let t = self.clock.map(|c| format!(" t={c:.3}")).unwrap_or_default();
            let notes = std::mem::take(&mut self.notes).join(" | ");
            (self.log)(&format!(
                "step {step}{t}: {notes} | kv {}/{} used, {} cached | waiting {} running {}",
                load.kv_used, load.kv_capacity, load.cached_tokens, load.waiting, load.running
            ));
        } else {
            self.notes.clear();
        }
    }

    fn check(&mut self, step: u64) {
        self.s.kv_checks += 1;
        if let Err(m) = self.engine.check_invariants() {
            self.violation(format!("after step {step}: {m}"));
        }
    }

    fn violation(&mut self, message: String) {
        self.s.violation_count += 1;
        if self.s.violations.len() < MAX_LISTED {
            self.s.violations.push(message);
        }
    }

    // ---- the end ----

    /// Runs what is left until every request has ended; requests the recording left
    /// running end when their recorded tokens run out.
    fn drain(&mut self, recorded_steps: u64) {
        self.commit(None);
        let limit = self.s.steps + step_limit(recorded_steps);
        loop {
            let exhausted: Vec<u64> = self
                .live
                .iter()
                .copied()
                .filter(|rid| {
                    let e = self.expected.get(rid);
                    e.is_none_or(|e| e.finish.is_none() && self.produced.get(rid).copied().unwrap_or(0) >= e.tokens.len())
                })
                .collect();
            for rid in exhausted {
                self.end(rid, Ending::CutOff);
            }
            if !self.engine.has_work() {
                return;
            }
            if self.s.steps >= limit {
                self.violation(format!(
                    "{} requests never ended ({} steps after the recording's last): the engine stalls",
                    self.engine.num_requests(),
                    limit
                ));
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

fn step_limit(recorded_steps: u64) -> u64 {
    recorded_steps.saturating_mul(4).saturating_add(10_000)
}

fn time_of(r: &Record) -> f64 {
    match r {
        Record::Submit { at, .. } | Record::Abort { at, .. } | Record::Flush { at } => at.t,
        _ => 0.0,
    }
}

fn plan_entries(plan: &BatchPlan) -> Vec<PlanEntry> {
    (0..plan.num_requests())
        .map(|b| {
            let (a, z) = (plan.qo_offsets[b] as usize, plan.qo_offsets[b + 1] as usize);
            PlanEntry { rid: plan.rids[b], start: plan.positions[a] as usize, len: z - a, samples: plan.samples[b] }
        })
        .collect()
}

fn describe_plan(plan: &[PlanEntry]) -> String {
    plan.iter()
        .map(|e| format!("r{} {}+{}{}", e.rid, e.start, e.len, if e.samples { "" } else { " chunk" }))
        .collect::<Vec<_>>()
        .join(", ")
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

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
