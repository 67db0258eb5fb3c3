//! Runs core work with the GIL released and panics contained. A panic means the core's
//! state may be half-changed, so the object it happened in refuses every later call
//! (DESIGN.md, contract 3) instead of serving answers from a broken structure.
//!
//! Three forms: [`Poison`] for objects behind `&mut self` (a tree, an engine; its
//! `run_attached` keeps the GIL for work shorter than releasing it),
//! [`SharedPoison`] for objects whose calls take `&self` but that still hold mutable
//! state (a constraint matcher, poisoned by a batch call too), and [`contain`] for
//! frozen shared objects (a vocabulary, a grammar) whose state a call cannot leave
//! half-changed: their panics become `CorePanicError` without poisoning.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

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
            return Err(refused(py, reason));
        }
        catch(py, || work(state)).map_err(|reason| {
            self.reason = Some(reason.clone());
            poisoned(py, &reason)
        })
    }

    /// [`run`](Self::run) keeping the GIL: for the copy of a result into the array just
    /// made for it, a few hundred nanoseconds, less than releasing the GIL again costs.
    pub fn run_attached<S, T>(&mut self, py: Python<'_>, state: S, work: impl FnOnce(S) -> T) -> PyResult<T> {
        if let Some(reason) = &self.reason {
            return Err(refused(py, reason));
        }
        catch_unwind(AssertUnwindSafe(|| work(state))).map_err(|payload| {
            let reason = panic_reason(&*payload);
            self.reason = Some(reason.clone());
            poisoned(py, &reason)
        })
    }
}

/// [`Poison`] for calls through `&self`: the first panic's reason is kept once.
#[derive(Default)]
pub struct SharedPoison {
    reason: OnceLock<String>,
}

impl SharedPoison {
    pub fn run<S: Send, T: Send>(
        &self,
        py: Python<'_>,
        state: S,
        work: impl FnOnce(S) -> T + Send,
    ) -> PyResult<T> {
        self.check(py)?;
        catch(py, || work(state)).map_err(|reason| {
            self.poison(reason.clone());
            poisoned(py, &reason)
        })
    }

    /// `CorePanicError` if a panic happened here before.
    pub fn check(&self, py: Python<'_>) -> PyResult<()> {
        match self.reason.get() {
            Some(reason) => Err(refused(py, reason)),
            None => Ok(()),
        }
    }

    /// Refuse every later call (a panic happened in a call that involved this object).
    pub fn poison(&self, reason: String) {
        let _ = self.reason.set(reason);
    }
}

/// Runs `work` with the GIL released; a panic becomes `CorePanicError` and nothing is
/// poisoned (for frozen objects, whose state a call does not change half-way).
pub fn contain<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> PyResult<T> {
    catch(py, work)
        .map_err(|reason| errors::core_panic(py, format!("internal error in ferrolm's core: {reason}")))
}

/// `work` with the GIL released; `Err(reason)` if it panicked.
fn catch<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> Result<T, String> {
    py.detach(|| catch_unwind(AssertUnwindSafe(work))).map_err(|payload| panic_reason(&*payload))
}

pub fn panic_reason(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

fn refused(py: Python<'_>, reason: &str) -> PyErr {
    errors::core_panic(
        py,
        format!("this object is unusable after an internal error ({reason}); create a new one"),
    )
}

fn poisoned(py: Python<'_>, reason: &str) -> PyErr {
    errors::core_panic(
        py,
        format!("internal error in ferrolm's core: {reason}; this object refuses further use"),
    )
}
