//! `FERROLM_LOG`: the core's `tracing` events (admission, prefill chunks, cache hits,
//! eviction, retraction, queue timeouts, grammar compiles) printed to stderr, filtered
//! with `RUST_LOG`'s syntax (`debug`, `ferrolm_core=debug,ferrolm_constraint=info`,
//! `ferrolm_core::engine=trace`). Unset, nothing is installed: every event site is then a
//! check of one atomic level that fails, and no field is formatted.

/// The variable read by [`init_from_env`].
pub const ENV: &str = "FERROLM_LOG";

/// Installs a stderr subscriber filtered by `FERROLM_LOG` when it is set (and no
/// subscriber is installed yet). Returns whether it installed one; a filter that does not
/// parse is reported on stderr and installs nothing.
pub fn init_from_env() -> bool {
    let Ok(spec) = std::env::var(ENV) else { return false };
    match tracing_subscriber::EnvFilter::try_new(&spec) {
        Ok(filter) => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init()
            .is_ok(),
        Err(e) => {
            eprintln!("ferrolm: {ENV}={spec:?} is not a log filter ({e}); logging stays off");
            false
        }
    }
}
