//! Where the `tlru` policy reads the time: a monotonic clock in nanoseconds, injectable so
//! that tests move time forward by hand instead of sleeping.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// A monotonic time in nanoseconds from an arbitrary start. Never goes back.
pub trait TimeSource: Send + Sync + fmt::Debug {
    fn now_ns(&self) -> u64;
}

/// The machine's monotonic clock, counted from the first time any tree read it.
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl TimeSource for MonotonicClock {
    fn now_ns(&self) -> u64 {
        static START: OnceLock<Instant> = OnceLock::new();
        let start = *START.get_or_init(Instant::now);
        u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to; shared (behind an `Arc`) by the trees and the
/// test that drives them.
#[derive(Debug, Default)]
pub struct ManualClock {
    ns: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ns: u64) -> Self {
        ManualClock { ns: AtomicU64::new(start_ns) }
    }

    /// Moves the time forward by `ns` (saturating: the clock never wraps back).
    pub fn advance(&self, ns: u64) {
        let _ = self.ns.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(t.saturating_add(ns)));
    }
}

impl TimeSource for ManualClock {
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told_and_saturates() {
        let c = ManualClock::new(5);
        assert_eq!(c.now_ns(), 5);
        c.advance(10);
        assert_eq!(c.now_ns(), 15);
        c.advance(u64::MAX);
        assert_eq!(c.now_ns(), u64::MAX);
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let a = MonotonicClock.now_ns();
        let b = MonotonicClock.now_ns();
        assert!(b >= a);
    }
}
