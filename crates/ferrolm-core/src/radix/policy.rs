//! Eviction policies: which unlocked leaf goes first when the cache must shrink.
//!
//! Every policy maps a node's bookkeeping to a sort key; the tree keeps its evictable
//! leaves in a set ordered by that key and evicts from the front. The last component is
//! the node's creation sequence number, unique in a tree, so the order never depends on
//! where a node happens to sit in memory (the Python twin evicts in the same order).

use std::fmt;
use std::str::FromStr;

/// Chosen once, when the tree is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Least recently used first.
    #[default]
    Lru,
    /// Least frequently matched first, ties by least recently used.
    Lfu,
    /// Oldest first (by when the tokens were first cached).
    Fifo,
    /// Most recently used first.
    Mru,
    /// Newest first.
    Filo,
    /// Lowest priority (the highest a request inserted with) first, ties by least recently used.
    Priority,
    /// Segmented LRU: a node starts in the probationary segment and moves to the protected
    /// one on its second hit; probationary nodes go first, each segment in LRU order. The
    /// protected segment holds at most a share of the cached tokens
    /// ([`TreeConfig::slru_protected_share`](super::TreeConfig::slru_protected_share));
    /// when a promotion overflows it, its least recently used nodes move back to the
    /// probationary segment as if just used there.
    Slru,
    /// LRU with a time-to-live per node: a node expires when it has not been used for its
    /// TTL ([`TreeConfig::ttl`](super::TreeConfig::ttl), or the one given at insert);
    /// expired nodes go first (the earliest expired first), then the rest in LRU order.
    Tlru,
}

/// What a policy looks at.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EvictionStats {
    pub last_access: u64,
    pub created: u64,
    pub hits: u64,
    pub priority: i64,
    pub seq: u64,
    /// `slru`: in the protected segment.
    pub slru_protected: bool,
    /// `tlru`: the node's time-to-live, and when it expires (ns, the tree's clock).
    pub ttl_ns: u64,
    pub deadline_ns: u64,
}

/// Sort key of an evictable leaf: smaller goes first.
pub(crate) type EvictionKey = (u64, u64, u64);

impl EvictionPolicy {
    pub const ALL: [EvictionPolicy; 8] = [
        EvictionPolicy::Lru,
        EvictionPolicy::Lfu,
        EvictionPolicy::Fifo,
        EvictionPolicy::Mru,
        EvictionPolicy::Filo,
        EvictionPolicy::Priority,
        EvictionPolicy::Slru,
        EvictionPolicy::Tlru,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EvictionPolicy::Lru => "lru",
            EvictionPolicy::Lfu => "lfu",
            EvictionPolicy::Fifo => "fifo",
            EvictionPolicy::Mru => "mru",
            EvictionPolicy::Filo => "filo",
            EvictionPolicy::Priority => "priority",
            EvictionPolicy::Slru => "slru",
            EvictionPolicy::Tlru => "tlru",
        }
    }

    pub(crate) fn key(self, s: &EvictionStats) -> EvictionKey {
        match self {
            EvictionPolicy::Lru => (s.last_access, 0, s.seq),
            EvictionPolicy::Lfu => (s.hits, s.last_access, s.seq),
            EvictionPolicy::Fifo => (s.created, 0, s.seq),
            EvictionPolicy::Mru => (u64::MAX - s.last_access, 0, s.seq),
            EvictionPolicy::Filo => (u64::MAX - s.created, 0, s.seq),
            // Flipping the sign bit maps i64 order onto u64 order.
            EvictionPolicy::Priority => ((s.priority as u64) ^ (1 << 63), s.last_access, s.seq),
            EvictionPolicy::Slru => (s.slru_protected as u64, s.last_access, s.seq),
            // expired nodes are taken first from a second set, ordered by deadline
            EvictionPolicy::Tlru => (s.last_access, 0, s.seq),
        }
    }
}

impl fmt::Display for EvictionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name was not one of [`EvictionPolicy::ALL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = EvictionPolicy::ALL.iter().map(|p| p.name()).collect();
        write!(f, "unknown eviction policy {:?}; expected one of {}", self.0, names.join(", "))
    }
}

impl std::error::Error for UnknownPolicy {}

impl FromStr for EvictionPolicy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EvictionPolicy::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(last_access: u64, created: u64, hits: u64, priority: i64, seq: u64) -> EvictionStats {
        EvictionStats { last_access, created, hits, priority, seq, ..EvictionStats::default() }
    }

    #[test]
    fn names_round_trip() {
        for p in EvictionPolicy::ALL {
            assert_eq!(p.name().parse::<EvictionPolicy>().unwrap(), p);
        }
        let err = "LRU".parse::<EvictionPolicy>().unwrap_err();
        assert!(err.to_string().contains("lru, lfu, fifo"), "{err}");
        assert!(err.to_string().ends_with("slru, tlru"), "{err}");
    }

    #[test]
    fn slru_takes_probationary_before_protected() {
        let hot_old = EvictionStats { slru_protected: true, ..stats(1, 0, 2, 0, 1) };
        let cold_new = stats(9, 0, 1, 0, 2);
        assert!(EvictionPolicy::Slru.key(&cold_new) < EvictionPolicy::Slru.key(&hot_old));
        assert!(EvictionPolicy::Slru.key(&stats(1, 0, 0, 0, 3)) < EvictionPolicy::Slru.key(&cold_new));
    }

    #[test]
    fn priority_orders_negative_before_positive() {
        let low = EvictionPolicy::Priority.key(&stats(9, 0, 0, -5, 1));
        let high = EvictionPolicy::Priority.key(&stats(1, 0, 0, 3, 2));
        assert!(low < high);
    }

    #[test]
    fn mru_reverses_lru() {
        let old = stats(1, 0, 0, 0, 1);
        let new = stats(2, 0, 0, 0, 2);
        assert!(EvictionPolicy::Lru.key(&old) < EvictionPolicy::Lru.key(&new));
        assert!(EvictionPolicy::Mru.key(&old) > EvictionPolicy::Mru.key(&new));
    }
}
