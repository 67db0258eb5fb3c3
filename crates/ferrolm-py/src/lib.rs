//! `ferrolm._core`: the PyO3 face of `ferrolm-core`. Conversion and forwarding only; every
//! call that works on core data releases the GIL, and a panic in the core poisons the
//! object it happened in (see `guard`).

use pyo3::prelude::*;

mod attention;
mod chat;
mod constraint;
mod convert;
mod cpu_model;
mod engine;
mod errors;
mod frontend;
mod guard;
mod kv_events;
mod lora;
mod norm;
mod quant;
mod radix;
mod trace;

#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    radix::init(m)?;
    engine::init(m)?;
    constraint::init(m)?;
    attention::init(m)?;
    frontend::init(m)?;
    chat::init(m)?;
    norm::init(m)?;
    quant::init(m)?;
    cpu_model::init(m)?;
    trace::init(m)?;
    lora::init(m)?;
    Ok(())
}

/// Core logs go to stderr when `FERROLM_LOG` is set (e.g. `FERROLM_LOG=debug`); silent
/// otherwise (see `ferrolm_core::logging`).
fn init_logging() {
    ferrolm_core::logging::init_from_env();
}
