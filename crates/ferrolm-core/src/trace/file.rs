//! A trace file read into memory (the format: the module doc of `crate::trace`).

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;

use crate::engine::EngineConfig;

use super::format::Record;
use super::parse::parse_header;

/// A trace read into memory.
#[derive(Clone, Debug)]
pub struct Trace {
    pub config: EngineConfig,
    pub records: Vec<Record>,
    pub(super) token_bytes: HashMap<u32, Vec<u8>>,
    pub(super) special: HashSet<u32>,
}

impl Trace {
    /// Reads a trace; errors name the line.
    pub fn read(reader: impl BufRead) -> Result<Trace, String> {
        let mut lines =
            reader.lines().enumerate().filter(|(_, l)| l.as_ref().map_or(true, |l| !l.trim().is_empty()));
        let parse = |n: usize, line: std::io::Result<String>| -> Result<serde_json::Value, String> {
            let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
            serde_json::from_str(&line).map_err(|e| format!("line {}: not JSON: {e}", n + 1))
        };
        let (n, first) = lines.next().ok_or("the trace is empty (no header line)")?;
        let config = parse_header(&parse(n, first)?).map_err(|e| format!("line {}: {e}", n + 1))?;
        let mut trace =
            Trace { config, records: Vec::new(), token_bytes: HashMap::new(), special: HashSet::new() };
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
