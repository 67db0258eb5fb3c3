//! Writes an engine's trace as it runs (`Engine::record_trace`). Every line is flushed
//! when written: a trace is wanted most from a process that then crashed or hung.
//! A write that fails stops the recording (logged once) and never the engine.

use std::collections::HashSet;
use std::io::Write;
use std::time::Instant;

use crate::detok::TokenBytes;
use crate::engine::{BatchPlan, Constraint, EngineConfig, RequestParams, StepOutputs};

use super::format::{header, At, Output, PlanEntry, Record, RecordedConstraint, RecordedFinish};

pub struct TraceRecorder {
    out: Box<dyn Write + Send + Sync>,
    started: Instant,
    /// `schedule` calls recorded so far.
    steps: u64,
    /// Tokens whose bytes are in the trace already.
    known_tokens: HashSet<u32>,
    stopped: bool,
}

/// Which call produced a batch of outputs.
#[derive(Clone, Copy)]
pub(crate) enum OutputsOf<'a> {
    Commit,
    FailStep(&'a str),
    TakeOutputs,
}

impl TraceRecorder {
    /// Starts a trace on `out` with its header (the engine's configuration).
    pub fn new(mut out: Box<dyn Write + Send + Sync>, config: &EngineConfig) -> std::io::Result<Self> {
        writeln!(out, "{}", header(config))?;
        out.flush()?;
        Ok(TraceRecorder {
            out,
            started: Instant::now(),
            steps: 0,
            known_tokens: HashSet::new(),
            stopped: false,
        })
    }

    fn at(&self, step: u64) -> At {
        At { step, t: self.started.elapsed().as_secs_f64() }
    }

    fn write(&mut self, record: Record) {
        if self.stopped {
            return;
        }
        let line = record.to_json().to_string();
        if let Err(e) = writeln!(self.out, "{line}").and_then(|_| self.out.flush()) {
            tracing::warn!(error = %e, "trace recording stopped: the write failed");
            self.stopped = true;
        }
    }

    pub(crate) fn on_submit(
        &mut self,
        rids: &[u64],
        prompt: &[u32],
        params: &RequestParams,
        constraint: Option<&Constraint>,
    ) {
        let constraint = match constraint {
            None => RecordedConstraint::None,
            Some(Constraint::AllowedTokens(ids)) => RecordedConstraint::AllowedTokens(ids.clone()),
            Some(Constraint::Grammar(_)) => RecordedConstraint::Grammar,
            Some(Constraint::Custom(_)) => RecordedConstraint::Custom,
        };
        let at = self.at(self.steps);
        self.write(Record::Submit {
            at,
            rids: rids.to_vec(),
            prompt: prompt.to_vec(),
            params: Box::new(params.clone()),
            constraint,
        });
    }

    pub(crate) fn on_abort(&mut self, rid: u64) {
        let at = self.at(self.steps);
        self.write(Record::Abort { at, rid });
    }

    pub(crate) fn on_flush(&mut self) {
        let at = self.at(self.steps);
        self.write(Record::Flush { at });
    }

    pub(crate) fn on_schedule(&mut self, plan: &BatchPlan) {
        let plan = (0..plan.num_requests())
            .map(|b| {
                let (a, z) = (plan.qo_offsets[b] as usize, plan.qo_offsets[b + 1] as usize);
                let start = if z > a { plan.positions[a] as usize } else { 0 };
                PlanEntry { rid: plan.rids[b], start, len: z - a, samples: plan.samples[b] }
            })
            .collect();
        let at = self.at(self.steps);
        self.steps += 1;
        self.write(Record::Schedule { at, plan });
    }

    /// Outputs of a commit (or failed step) of the latest step, or of `take_outputs`
    /// (recorded only when there are any).
    pub(crate) fn on_outputs(&mut self, of: OutputsOf<'_>, out: &StepOutputs, vocab: &dyn TokenBytes) {
        if matches!(of, OutputsOf::TakeOutputs) && out.is_empty() {
            return;
        }
        let new: Vec<u32> = out.token_ids.iter().copied().filter(|t| self.known_tokens.insert(*t)).collect();
        if !new.is_empty() {
            let special = new.iter().copied().filter(|&t| vocab.is_special(t)).collect();
            let tokens =
                new.into_iter().map(|t| (t, vocab.token_bytes(t).unwrap_or_default().to_vec())).collect();
            self.write(Record::Tokens { tokens, special });
        }
        let outputs = (0..out.len())
            .map(|i| Output {
                rid: out.rids[i],
                tokens: out.token_ids[out.token_offsets[i] as usize..out.token_offsets[i + 1] as usize]
                    .to_vec(),
                finish: out.finished[i]
                    .as_ref()
                    .map(|f| RecordedFinish { reason: f.reason.clone(), cached_tokens: f.cached_tokens }),
            })
            .collect();
        let at = self.at(self.steps.saturating_sub(1));
        self.write(match of {
            OutputsOf::Commit => Record::Commit { at, out: outputs },
            OutputsOf::FailStep(message) => {
                Record::FailStep { at, message: message.to_string(), out: outputs }
            }
            OutputsOf::TakeOutputs => Record::Outputs { at: self.at(self.steps), out: outputs },
        });
    }
}
