//! Runs core work with the GIL released and panics contained. A panic means the core's
//! state may be half-changed, so the object it happened in refuses every later call
//! (DESIGN.md, contract 3) instead of serving answers from a broken structure.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;

use crate::errors;

#[derive(Default)]
pub struct Poison {
    reason: Option<String>,
}

impl Poison {
    pub fn run<S: Send, T: Send>(
        &mut self,
        py: Python<'_>,
        state: S,
        work: impl FnOnce(S) -> T + Send,
    ) -> PyResult<T> {
        if let Some(reason) = &self.reason {
            return Err(errors::core_panic(
                py,
                format!("this object is unusable after an internal error ({reason}); create a new one"),
            ));
        }
        match py.detach(|| catch_unwind(AssertUnwindSafe(|| work(state)))) {
            Ok(value) => Ok(value),
            Err(payload) => {
                let reason = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".to_string());
                self.reason = Some(reason.clone());
                Err(errors::core_panic(
                    py,
                    format!("internal error in ferrolm's core: {reason}; this object refuses further use"),
                ))
            }
        }
    }
}
