//! `replay_trace`: the core's trace replay (`ferrolm_core::trace`), the same as the
//! `ferrolm-replay` binary, for Python callers and for installs without the binary.

use std::path::PathBuf;

use ferrolm_core::radix::EvictionPolicy;
use ferrolm_core::trace::{replay, Arrivals, ConfigOverrides, ReplayOptions, ReplaySummary, Trace};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;
use crate::guard::contain;

#[pyfunction]
#[pyo3(signature = (
    path, *, by_time = false, step_ms = None, token_ms = 0.0, check_every = 1, verbose = false,
    kv_capacity = None, max_running_requests = None, max_prefill_tokens = None, schedule_policy = None,
    eviction_policy = None, enable_prefix_cache = None, new_token_ratio = None,
))]
#[allow(clippy::too_many_arguments)]
fn replay_trace<'py>(
    py: Python<'py>,
    path: PathBuf,
    by_time: bool,
    step_ms: Option<f64>,
    token_ms: f64,
    check_every: u64,
    verbose: bool,
    kv_capacity: Option<usize>,
    max_running_requests: Option<usize>,
    max_prefill_tokens: Option<usize>,
    schedule_policy: Option<&str>,
    eviction_policy: Option<&str>,
    enable_prefix_cache: Option<bool>,
    new_token_ratio: Option<f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let bad = |field: &'static str, m: String| errors::invalid_field(py, field, format!("{field}: {m}"));
    for (field, v) in [("step_ms", step_ms.unwrap_or(0.0)), ("token_ms", token_ms)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(bad(field, format!("must be a non-negative number of milliseconds, got {v}")));
        }
    }
    if !by_time && (step_ms.is_some() || token_ms != 0.0) {
        return Err(bad("by_time", "step_ms and token_ms are for replays with by_time=True".into()));
    }
    let overrides = ConfigOverrides {
        kv_capacity,
        max_running_requests,
        max_prefill_tokens,
        schedule_policy: schedule_policy
            .map(str::parse)
            .transpose()
            .map_err(|m| bad("schedule_policy", m))?,
        eviction_policy: eviction_policy
            .map(str::parse::<EvictionPolicy>)
            .transpose()
            .map_err(|e| bad("eviction_policy", e.to_string()))?,
        enable_prefix_cache,
        new_token_ratio,
    };
    let arrivals = if by_time {
        Arrivals::Time { step_s: step_ms.map(|ms| ms / 1e3), token_s: token_ms / 1e3 }
    } else {
        Arrivals::Steps
    };
    let options = ReplayOptions { arrivals, overrides, check_every, verbose };
    let file = std::fs::File::open(&path)
        .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display())))?;
    let (summary, lines) = contain(py, move || {
        let trace = Trace::read(std::io::BufReader::new(file)).map_err(|m| ("trace", m))?;
        let mut lines = Vec::new();
        let summary =
            replay(&trace, &options, &mut |l| lines.push(l.to_string())).map_err(|m| ("settings", m))?;
        Ok::<_, (&'static str, String)>((summary, lines))
    })?
    .map_err(|(field, m)| bad(field, m))?;
    summary_dict(py, &summary, lines)
}

fn summary_dict<'py>(py: Python<'py>, s: &ReplaySummary, lines: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("ok", s.is_ok())?;
    d.set_item("same", s.is_same())?;
    d.set_item("requests", s.requests)?;
    d.set_item("recorded_steps", s.recorded_steps)?;
    d.set_item("steps", s.steps)?;
    d.set_item("compared_steps", s.compared_steps)?;
    d.set_item("diverged_steps", s.diverged_steps)?;
    d.set_item("first_divergence", s.first_divergence.clone())?;
    d.set_item("prompt_tokens", s.prompt_tokens)?;
    d.set_item("cache_hit_tokens", s.cache_hit_tokens)?;
    d.set_item("recorded_cache_hit_tokens", s.recorded_cache_hit_tokens)?;
    d.set_item("generated_tokens", s.generated_tokens)?;
    d.set_item("admissions", s.admissions)?;
    d.set_item("prefill_chunks", s.prefill_chunks)?;
    d.set_item("retractions", s.retractions)?;
    d.set_item("finishes", s.finishes.clone())?;
    d.set_item("enforced_ends", s.enforced_ends)?;
    d.set_item("cut_off", s.cut_off)?;
    d.set_item("refused", s.refused)?;
    d.set_item("finish_mismatches", s.finish_mismatches)?;
    d.set_item("first_mismatch", s.first_mismatch.clone())?;
    d.set_item("missing_tokens", s.missing_tokens)?;
    d.set_item("kv_checks", s.kv_checks)?;
    d.set_item("kv_capacity", s.kv_capacity)?;
    d.set_item("peak_kv_used", s.peak_kv_used)?;
    d.set_item("peak_running", s.peak_running)?;
    d.set_item("violations", s.violations.clone())?;
    d.set_item("violation_count", s.violation_count)?;
    d.set_item("report", s.report())?;
    d.set_item("lines", lines)?;
    Ok(d)
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay_trace, m)?)
}
