//! Long random sequences of tree operations, checked after every step against DESIGN.md's
//! invariants and an independent oracle: a map from every cached page-aligned prefix to
//! the KV slots of its last page, which is all a prefix cache promises to remember.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use ferrolm_core::radix::{EvictionPolicy, ManualClock, NodeHandle, RadixTree, TreeConfig};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Match(Vec<u32>, bool),
    Insert(Vec<u32>, bool, i64),
    Lock(usize),
    Unlock(usize),
    Evict(usize),
    Reset,
    /// Moves the clock forward this many seconds (`tlru` nodes expire after 4 s here).
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    // A tiny alphabet makes shared prefixes, splits and aliased pages common.
    let seq = prop::collection::vec(0u32..4, 0..14);
    prop_oneof![
        4 => (seq.clone(), any::<bool>()).prop_map(|(s, ns)| Op::Match(s, ns)),
        6 => (seq, any::<bool>(), -2i64..3).prop_map(|(s, ns, p)| Op::Insert(s, ns, p)),
        2 => any::<usize>().prop_map(Op::Lock),
        2 => any::<usize>().prop_map(Op::Unlock),
        2 => (0usize..12).prop_map(Op::Evict),
        1 => Just(Op::Reset),
        2 => (0u64..6).prop_map(Op::Advance),
    ]
}

type Key = (bool, Vec<u32>);

struct Harness {
    tree: RadixTree,
    clock: Arc<ManualClock>,
    page: usize,
    capacity: usize,
    free: Vec<u32>,
    /// cached (namespace, page-aligned prefix) -> slots of the prefix's last page
    oracle: HashMap<Key, Vec<u32>>,
    by_slot: HashMap<u32, Key>,
    /// handles from matches, with the prefix each covers and how often it is locked now
    handles: Vec<(NodeHandle, Key, usize)>,
    /// prefixes whose node went away: their handles must stay stale forever
    dead: HashSet<NodeHandle>,
}

fn ns_name(ns: bool) -> Option<&'static str> {
    ns.then_some("tenant")
}

impl Harness {
    fn new(page: usize, policy: EvictionPolicy, kv_events: bool, share: f64) -> Self {
        let capacity = 64;
        let config = TreeConfig {
            page_size: page,
            policy,
            kv_events,
            slru_protected_share: share,
            ttl: Duration::from_secs(4),
            ..TreeConfig::default()
        };
        let clock = Arc::new(ManualClock::new(0));
        Harness {
            tree: RadixTree::with_clock(config, clock.clone()).unwrap(),
            clock,
            page,
            capacity,
            free: (0..capacity as u32).collect(),
            oracle: HashMap::new(),
            by_slot: HashMap::new(),
            handles: Vec::new(),
            dead: HashSet::new(),
        }
    }

    fn oracle_match(&self, ns: bool, seq: &[u32]) -> (usize, Vec<u32>) {
        let aligned = seq.len() / self.page * self.page;
        let mut slots = Vec::new();
        for end in (self.page..=aligned).step_by(self.page) {
            match self.oracle.get(&(ns, seq[..end].to_vec())) {
                Some(page) => slots.extend_from_slice(page),
                None => break,
            }
        }
        (slots.len(), slots)
    }

    fn is_locked(&self, key: &Key) -> bool {
        self.handles.iter().any(|(_, (ns, p), n)| {
            *n > 0 && *ns == key.0 && p.len() >= key.1.len() && p[..key.1.len()] == key.1[..]
        })
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Match(seq, ns) => {
                let got = self.tree.match_prefix(&seq, ns_name(ns));
                let (len, slots) = self.oracle_match(ns, &seq);
                prop_assert_eq!(got.length, len);
                prop_assert_eq!(&got.kv_slots, &slots);
                self.handles.push((got.node, (ns, seq[..len].to_vec()), 0));
            }
            Op::Insert(seq, ns, priority) => {
                // as an engine does: reuse the matched slots, allocate the rest
                let m = self.tree.match_prefix(&seq, ns_name(ns));
                self.tree.lock(m.node).unwrap();
                let need = seq.len() - m.length;
                if need > self.free.len() {
                    let freed = self.tree.evict(need - self.free.len());
                    self.forget(&freed);
                    self.free.extend(freed);
                }
                if need > self.free.len() {
                    self.tree.unlock(m.node).unwrap();
                    return self.check();
                }
                let mut slots = m.kv_slots.clone();
                slots.extend(self.free.drain(..need));
                let cached = self.tree.insert(&seq, &slots, ns_name(ns), priority).unwrap();
                prop_assert!(cached >= m.length);
                let aligned = seq.len() / self.page * self.page;
                for end in (self.page..=aligned).step_by(self.page) {
                    let key = (ns, seq[..end].to_vec());
                    if let std::collections::hash_map::Entry::Vacant(e) = self.oracle.entry(key.clone()) {
                        prop_assert!(end > cached, "page ending at {} reported cached but was not", end);
                        let page = slots[end - self.page..end].to_vec();
                        for &s in &page {
                            self.by_slot.insert(s, key.clone());
                        }
                        e.insert(page);
                    } else {
                        prop_assert!(end <= cached, "page ending at {} was cached but not reported", end);
                    }
                }
                // duplicates and the partial page go back to the pool
                self.free.extend_from_slice(&slots[m.length..cached.max(m.length)]);
                self.free.extend_from_slice(&slots[aligned..]);
                self.tree.unlock(m.node).unwrap();
            }
            Op::Lock(i) if !self.handles.is_empty() => {
                let i = i % self.handles.len();
                let (h, key, _) = self.handles[i].clone();
                let result = self.tree.lock(h);
                prop_assert_eq!(result.is_ok(), !self.dead.contains(&h), "handle {:?} for {:?}", h, key);
                if result.is_ok() {
                    self.handles[i].2 += 1;
                }
            }
            Op::Unlock(i) if !self.handles.is_empty() => {
                let h = self.handles[i % self.handles.len()].0;
                let result = self.tree.unlock(h);
                // locks count per node: any entry holding this handle may give one back
                match self.handles.iter().position(|(other, _, locks)| *other == h && *locks > 0) {
                    Some(k) => {
                        prop_assert!(result.is_ok());
                        self.handles[k].2 -= 1;
                    }
                    // unlocking an unlocked (or stale) node fails, except the root's no-op
                    None => prop_assert_eq!(result.is_ok(), h == self.tree.root_handle()),
                }
            }
            Op::Evict(n) => {
                let before = self.tree.sizes();
                let freed = self.tree.evict(n);
                prop_assert!(freed.len() >= n.min(before.evictable));
                prop_assert_eq!(self.tree.sizes().total, before.total - freed.len());
                for s in &freed {
                    let key = self.by_slot.get(s).expect("freed slot was cached").clone();
                    prop_assert!(!self.is_locked(&key), "evicted a locked prefix");
                }
                self.forget(&freed);
                self.free.extend(freed);
            }
            Op::Advance(seconds) => self.clock.advance(seconds * 1_000_000_000),
            Op::Reset => {
                self.tree.reset();
                self.free = (0..self.capacity as u32).collect();
                self.oracle.clear();
                self.by_slot.clear();
                for (h, key, locks) in &mut self.handles {
                    if !key.1.is_empty() {
                        self.dead.insert(*h);
                        *locks = 0;
                    }
                }
            }
            _ => {}
        }
        self.check()
    }

    fn forget(&mut self, freed: &[u32]) {
        for s in freed {
            if let Some(key) = self.by_slot.remove(s) {
                self.oracle.remove(&key);
                for (h, k, _) in &self.handles {
                    if *k == key {
                        self.dead.insert(*h);
                    }
                }
            }
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        self.tree.check_invariants().map_err(TestCaseError::fail)?;
        let sizes = self.tree.sizes();
        // KV conservation: free + cached == capacity, no slot held twice
        prop_assert_eq!(self.free.len() + sizes.total, self.capacity);
        let mut all: Vec<u32> = self.tree.all_kv_slots();
        all.extend_from_slice(&self.free);
        prop_assert_eq!(all.iter().collect::<HashSet<_>>().len(), self.capacity);
        prop_assert_eq!(sizes.total, self.oracle.len() * self.page);
        let protected = self.oracle.keys().filter(|k| self.is_locked(k)).count() * self.page;
        prop_assert_eq!(sizes.protected, protected);
        Ok(())
    }
}

fn run(
    page: usize,
    policy: EvictionPolicy,
    kv_events: bool,
    share: f64,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut h = Harness::new(page, policy, kv_events, share);
    for op in ops {
        h.step(op)?;
    }
    // drain: unlock everything, evict everything, and every slot is free again
    for i in 0..h.handles.len() {
        while h.handles[i].2 > 0 {
            h.step(Op::Unlock(i))?;
        }
    }
    let freed = h.tree.evict(usize::MAX);
    h.free.extend(freed);
    prop_assert_eq!(h.free.len(), h.capacity);
    prop_assert_eq!(h.tree.sizes().nodes, 0);
    Ok(())
}

fn policy() -> impl Strategy<Value = EvictionPolicy> {
    prop::sample::select(EvictionPolicy::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_ops_keep_invariants(page in prop::sample::select(vec![1usize, 2, 4]),
                                  policy in policy(),
                                  kv_events in any::<bool>(),
                                  share in prop::sample::select(vec![0.0, 0.3, 0.8, 1.0]),
                                  ops in prop::collection::vec(op(), 1..120)) {
        run(page, policy, kv_events, share, ops)?;
    }
}
