//! What one compilation may take: memory (bytes of regex text, NFAs and DFA tables,
//! counted as they are built) and, under [`crate::GrammarCache`], time (a deadline, and
//! a cancel flag for callers that give up waiting). The long loops of a compilation —
//! schema translation, subset construction, copying tables, rule checks — call
//! [`check`] or [`charge`], so a compilation past either limit stops with
//! [`ConstraintError::GrammarTooLarge`] and frees what it took. (regex-automata's
//! parser and dense builder cannot be interrupted; they run under size limits.)
//!
//! The budget of the running compilation lives in a thread-local, installed by
//! [`scope`] at each public entry point (nested entry points share the outer one).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{ConstraintError, Result};

/// Bytes one compilation may account for in all (regex text, NFAs, DFA tables).
pub const MAX_COMPILE_BYTES: usize = 256 << 20;
/// Bytes of one rule's regex text: JSON Schema translation refuses to write more.
pub const MAX_REGEX_BYTES: usize = 1 << 20;

/// Shared between a compilation and whoever waits for it.
#[derive(Debug, Default)]
pub struct CancelFlag {
    cancelled: AtomicBool,
    /// Cancellations seen by a compilation (tests use it to see a stop happen).
    observed: AtomicUsize,
}

impl CancelFlag {
    /// Tests stop compilations at a known point with it; the cache stops them by their
    /// deadline.
    #[cfg(test)]
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

struct Budget {
    bytes_left: usize,
    limit: usize,
    cancel: Option<Arc<CancelFlag>>,
    deadline: Option<Deadline>,
}

/// When a compilation must stop, and the limit that set it (for the message).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    limit: Duration,
    /// Checks since the clock was last read: reading it every time would cost more
    /// than the small compilations it guards.
    unread: u32,
}

impl Deadline {
    pub(crate) fn after(limit: Duration) -> Self {
        Deadline { at: Instant::now() + limit, limit, unread: 0 }
    }
}

/// The clock is read at every this many checks (checks come at most every few hundred
/// DFA states or schema nodes, so this is well under a millisecond of work).
const CHECKS_PER_CLOCK_READ: u32 = 16;

thread_local! {
    static CURRENT: RefCell<Option<Budget>> = const { RefCell::new(None) };
}

/// Runs `compile` under a budget of `limit` bytes and, if given, a cancel flag. Inside
/// another scope, the outer budget is used as it is (one compilation, one budget).
pub(crate) fn scope<T>(limit: usize, cancel: Option<Arc<CancelFlag>>, compile: impl FnOnce() -> T) -> T {
    scope_with_deadline(limit, cancel, None, compile)
}

/// [`scope`] that also stops the compilation at the first check after `deadline`.
pub(crate) fn scope_with_deadline<T>(
    limit: usize,
    cancel: Option<Arc<CancelFlag>>,
    deadline: Option<Deadline>,
    compile: impl FnOnce() -> T,
) -> T {
    let installed = CURRENT.with(|current| {
        let mut current = current.borrow_mut();
        if current.is_some() {
            return false;
        }
        *current = Some(Budget { bytes_left: limit, limit, cancel, deadline });
        true
    });
    // Removed again even if `compile` panics (the cache catches panics and the thread goes on).
    struct Uninstall(bool);
    impl Drop for Uninstall {
        fn drop(&mut self) {
            if self.0 {
                CURRENT.with(|current| current.borrow_mut().take());
            }
        }
    }
    let _uninstall = Uninstall(installed);
    compile()
}

/// The default scope of a public entry point.
pub(crate) fn entry<T>(compile: impl FnOnce() -> T) -> T {
    scope(MAX_COMPILE_BYTES, None, compile)
}

/// `Err` once the compilation was cancelled (its waiter gave up) or ran past its
/// deadline.
pub(crate) fn check() -> Result<()> {
    CURRENT.with(|current| {
        let mut current = current.borrow_mut();
        let Some(budget) = current.as_mut() else { return Ok(()) };
        if let Some(flag) = &budget.cancel {
            if flag.is_cancelled() {
                flag.observed.fetch_add(1, Ordering::Relaxed);
                return Err(ConstraintError::GrammarTooLarge {
                    message: "compilation cancelled: it ran past the compile time limit".into(),
                });
            }
        }
        if let Some(deadline) = &mut budget.deadline {
            deadline.unread += 1;
            if deadline.unread >= CHECKS_PER_CLOCK_READ {
                if Instant::now() >= deadline.at {
                    // `unread` stays full: every later check reads the clock and fails.
                    return Err(past_deadline(deadline.limit));
                }
                deadline.unread = 0;
            }
        }
        Ok(())
    })
}

/// The error of a compilation stopped by its deadline.
pub(crate) fn past_deadline(limit: Duration) -> ConstraintError {
    ConstraintError::GrammarTooLarge { message: format!("compiling took longer than the limit of {limit:?}") }
}

/// Accounts `bytes` for `what`; `Err` past the budget (or when cancelled).
pub(crate) fn charge(bytes: usize, what: &str) -> Result<()> {
    check()?;
    CURRENT.with(|current| match &mut *current.borrow_mut() {
        Some(budget) => match budget.bytes_left.checked_sub(bytes) {
            Some(left) => {
                budget.bytes_left = left;
                Ok(())
            }
            None => Err(ConstraintError::GrammarTooLarge {
                message: format!(
                    "{what} would take the compilation past its memory budget of {} MiB",
                    budget.limit >> 20
                ),
            }),
        },
        None => Ok(()),
    })
}

/// How many times compilations under `flag` noticed the cancellation.
#[cfg(test)]
pub(crate) fn observed(flag: &CancelFlag) -> usize {
    flag.observed.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_add_up_per_scope() {
        scope(100, None, || {
            assert!(charge(60, "a").is_ok());
            let err = charge(60, "the second table").unwrap_err();
            assert!(err.to_string().contains("memory budget"), "{err}");
            // Nested entry points share the outer budget.
            entry(|| assert!(charge(50, "b").is_err()));
        });
        // A new scope starts afresh.
        scope(100, None, || assert!(charge(60, "a").is_ok()));
    }

    #[test]
    fn a_cancelled_scope_stops_at_the_next_check() {
        let flag = Arc::new(CancelFlag::default());
        scope(100, Some(flag.clone()), || {
            assert!(check().is_ok());
            flag.cancel();
            let err = check().unwrap_err();
            assert!(err.to_string().contains("cancelled"), "{err}");
        });
        assert_eq!(observed(&flag), 1);
    }

    #[test]
    fn a_scope_past_its_deadline_stops_within_a_few_checks() {
        let deadline = Deadline::after(Duration::from_millis(5));
        scope_with_deadline(100, None, Some(deadline), || {
            assert!(check().is_ok());
            std::thread::sleep(Duration::from_millis(10));
            let stopped = (0..CHECKS_PER_CLOCK_READ).position(|_| check().is_err());
            assert!(stopped.is_some(), "no check failed past the deadline");
            let err = check().unwrap_err();
            assert!(err.to_string().contains("longer than the limit of 5ms"), "{err}");
        });
        // Outside the scope nothing is limited.
        assert!(check().is_ok());
    }
}
