//! Structure of a [`ByteDfa`] that mask computation exploits: its loops and which
//! states no token can tell apart.

use std::hash::Hasher;

use rustc_hash::{FxHashMap, FxHasher};

use super::{ByteDfa, DEAD};

/// Predecessor lists of a transition table in one flat array (a `Vec` per state costs
/// an allocation each, which dominated small compilations): the states with a
/// transition into `t` (other than [`DEAD`]) are `list[offsets[t]..offsets[t + 1]]`,
/// a state listed once per target.
pub(super) struct Predecessors {
    offsets: Vec<u32>,
    list: Vec<u32>,
}

impl Predecessors {
    /// Of the table whose entry `state * nc + class` is `target(index)`.
    pub fn new(n: usize, nc: usize, target: impl Fn(usize) -> u32) -> Self {
        let mut offsets = vec![0u32; n + 1];
        let mut last_source = vec![u32::MAX; n];
        for s in 1..n {
            for t in (s * nc..(s + 1) * nc).map(&target) {
                if std::mem::replace(&mut last_source[t as usize], s as u32) != s as u32 {
                    offsets[t as usize + 1] += 1;
                }
            }
        }
        for t in 0..n {
            offsets[t + 1] += offsets[t];
        }
        let mut fill = offsets.clone();
        let mut list = vec![0u32; offsets[n] as usize];
        last_source.fill(u32::MAX);
        for s in 1..n {
            for t in (s * nc..(s + 1) * nc).map(&target) {
                if std::mem::replace(&mut last_source[t as usize], s as u32) != s as u32 {
                    list[fill[t as usize] as usize] = s as u32;
                    fill[t as usize] += 1;
                }
            }
        }
        Predecessors { offsets, list }
    }

    #[inline]
    pub fn of(&self, t: usize) -> &[u32] {
        &self.list[self.offsets[t] as usize..self.offsets[t + 1] as usize]
    }
}

/// The distinct targets of each row of a transition table, other than [`DEAD`], in
/// one flat array: a row's target is listed once per run of neighbouring classes
/// leading to it (rows are mostly DEAD, and a target usually spans a run of classes:
/// walking these is much less than walking the table).
pub(super) struct Successors {
    /// Row s is `list[offsets[s]..offsets[s + 1]]`; rows are added in order.
    offsets: Vec<u32>,
    list: Vec<u32>,
    /// Per row: the one class not leading to [`DEAD`], or [`Successors::NOT_ONE`] (none,
    /// or several). Known to whoever writes the rows, and the single-byte summary needs
    /// it: finding it again scanned whole rows.
    only_class: Vec<u16>,
}

impl Successors {
    /// In [`Successors::only_class`]: no class, or more than one, leaves the row alive.
    pub const NOT_ONE: u16 = u16::MAX;

    pub fn with_capacity(rows: usize, targets: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Successors { offsets, list: Vec::with_capacity(targets), only_class: Vec::with_capacity(rows) }
    }

    /// Of a whole table.
    pub fn of_table(n: usize, nc: usize, transitions: &[u32]) -> Self {
        let mut out = Successors::with_capacity(n, n * 2);
        for row in transitions.chunks_exact(nc.max(1)).take(n) {
            let mut last = DEAD;
            let (mut live, mut first) = (0usize, Self::NOT_ONE);
            for (class, &t) in row.iter().enumerate() {
                if t != DEAD {
                    if live == 0 {
                        first = class as u16;
                    }
                    live += 1;
                    if t != last {
                        out.push(t);
                    }
                }
                last = t;
            }
            out.end_row(if live == 1 { first } else { Self::NOT_ONE });
        }
        out
    }

    /// Add a target to the row being written.
    #[inline]
    pub fn push(&mut self, target: u32) {
        self.list.push(target);
    }

    /// Close the row being written, given its only live class (or
    /// [`Successors::NOT_ONE`]).
    #[inline]
    pub fn end_row(&mut self, only_class: u16) {
        self.offsets.push(self.list.len() as u32);
        self.only_class.push(only_class);
    }

    /// The only class of row `s` not leading to [`DEAD`], if exactly one does not.
    #[inline]
    pub fn only_class(&self, s: usize) -> Option<usize> {
        let class = self.only_class[s];
        (class != Self::NOT_ONE).then_some(class as usize)
    }

    pub fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    #[inline]
    pub fn of(&self, s: usize) -> &[u32] {
        &self.list[self.offsets[s] as usize..self.offsets[s + 1] as usize]
    }
}

impl ByteDfa {
    /// Classes of states that no byte string of at most `depth` bytes tells apart (each
    /// string leaves both dead or both alive): their token masks are equal when no
    /// token is longer than `depth`. [`DEAD`] is class 0.
    ///
    /// Moore's partition refinement from {dead, alive}, stopped after `depth` rounds or
    /// when stable. Round r splits states by their successors' classes of round r - 1;
    /// only predecessors of states whose class changed can split, so each round looks
    /// at those alone. (A counted repetition `x{0,200}` splits one state per round; a
    /// full pass per round would cost 200 passes.)
    pub fn equivalence_up_to(&self, depth: usize) -> Vec<u32> {
        let n = self.num_states();
        let nc = self.num_classes;
        let predecessors = Predecessors::new(n, nc, |i| self.target(i));
        let mut class: Vec<u32> = (0..n).map(|s| u32::from(s != DEAD as usize)).collect();
        let mut members: Vec<Vec<u32>> = vec![vec![DEAD], (1..n as u32).collect()];
        let mut changed: Vec<u32> = (0..n as u32).collect();
        let mut touched_mark = vec![false; n];
        // A state's signature is its successors' classes, one per byte class. Rows are
        // kept as runs of byte classes with one target (a string's states send most
        // bytes to one place), and a signature is written as runs of one successor
        // class: (class, end of the run). Equal signatures are equal run lists.
        let rows = RowRuns::new(n, nc, |i| self.target(i));
        let mut scratch = Vec::new();
        let mut hash_signature = |class: &[u32], s: u32| -> u64 {
            rows.signature(class, s, &mut scratch);
            let mut hasher = FxHasher::default();
            for &(k, end) in &scratch {
                hasher.write_u64(u64::from(k) << 32 | u64::from(end));
            }
            hasher.finish()
        };
        let mut compare = (Vec::new(), Vec::new());
        let mut same_signature = |class: &[u32], a: u32, b: u32| -> bool {
            rows.signature(class, a, &mut compare.0);
            rows.signature(class, b, &mut compare.1);
            compare.0 == compare.1
        };
        let mut before = class.clone();
        for _ in 0..depth {
            // States with a successor whose class changed, grouped by their own class,
            // each with the hash of its signature.
            let mut touched: FxHashMap<u32, Vec<(u32, u64)>> = FxHashMap::default();
            for &t in &changed {
                for &p in predecessors.of(t as usize) {
                    if !std::mem::replace(&mut touched_mark[p as usize], true) {
                        touched.entry(class[p as usize]).or_default().push((p, hash_signature(&class, p)));
                    }
                }
            }
            changed.clear();
            // The classes before this round moves any state: what signatures compare.
            before.copy_from_slice(&class);
            for (c, states) in touched {
                // Untouched members kept their signature, which they share.
                let untouched = members[c as usize].iter().copied().find(|&m| !touched_mark[m as usize]);
                let base = untouched.map(|m| (m, hash_signature(&before, m)));
                for &(s, _) in &states {
                    touched_mark[s as usize] = false;
                }
                // The members per signature that differs from the base, and the groups
                // by hash (equal hashes of different signatures are told apart).
                let mut groups: Vec<Vec<u32>> = Vec::new();
                let mut by_hash: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
                for (s, hash) in states {
                    if base.is_some_and(|(m, h)| h == hash && same_signature(&before, s, m)) {
                        continue;
                    }
                    let candidates = by_hash.entry(hash).or_default();
                    match candidates.iter().find(|&&g| same_signature(&before, s, groups[g][0])) {
                        Some(&g) => groups[g].push(s),
                        None => {
                            candidates.push(groups.len());
                            groups.push(vec![s]);
                        }
                    }
                }
                // With no untouched member, the first group keeps the old class id.
                let mut keep_one = base.is_none();
                for group in groups {
                    if std::mem::take(&mut keep_one) {
                        continue;
                    }
                    let id = members.len() as u32;
                    for &s in &group {
                        class[s as usize] = id;
                    }
                    members.push(group.clone());
                    changed.extend(group);
                }
                members[c as usize].retain(|&m| class[m as usize] == c);
            }
            if changed.is_empty() {
                break;
            }
        }
        class
    }
}

/// Each row of a transition table as runs of columns (byte classes) with one target.
struct RowRuns {
    /// Per state, its runs' range in `ends` / `targets`.
    offsets: Vec<u32>,
    /// Per run: one past its last column.
    ends: Vec<u32>,
    targets: Vec<u32>,
}

impl RowRuns {
    fn new(n: usize, nc: usize, target: impl Fn(usize) -> u32) -> RowRuns {
        let mut runs = RowRuns { offsets: vec![0], ends: Vec::new(), targets: Vec::new() };
        for s in 0..n {
            let row = s * nc;
            let mut c = 0;
            while c < nc {
                let t = target(row + c);
                let mut end = c + 1;
                while end < nc && target(row + end) == t {
                    end += 1;
                }
                runs.ends.push(end as u32);
                runs.targets.push(t);
                c = end;
            }
            runs.offsets.push(runs.ends.len() as u32);
        }
        runs
    }

    /// The classes of state `s`'s successors, as runs of one class: (class, end).
    fn signature(&self, class: &[u32], s: u32, out: &mut Vec<(u32, u32)>) {
        out.clear();
        let range = self.offsets[s as usize] as usize..self.offsets[s as usize + 1] as usize;
        for (&end, &t) in self.ends[range.clone()].iter().zip(&self.targets[range]) {
            let k = class[t as usize];
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = end,
                _ => out.push((k, end)),
            }
        }
    }
}

/// The strongly connected components of a transition table, and which can reach
/// acceptance.
pub(super) struct Components {
    /// Component of each state ([`DEAD`] alone in component 0).
    pub of: Vec<u32>,
    /// Whether a component holds a cycle (more than one state, or a state looping to
    /// itself).
    pub has_cycle: Vec<bool>,
    /// Whether a component's states can reach an accepting state (component 0 cannot).
    pub live: Vec<bool>,
}

/// Tarjan's algorithm, iteratively, over the states other than [`DEAD`]. It completes a
/// component only after every component it reaches, so whether one is live (holds an
/// accepting state, or leads to a live component) is known when it completes: one pass
/// over the successor lists, with no predecessor lists.
#[cfg(test)]
pub(super) fn components(n: usize, nc: usize, transitions: &[u32], accepting: &[bool]) -> Components {
    components_of(&Successors::of_table(n, nc, transitions), accepting)
}

/// [`components`] of the table whose successor lists are `successors`.
pub(super) fn components_of(successors: &Successors, accepting: &[bool]) -> Components {
    const UNVISITED: u32 = u32::MAX;
    let n = successors.rows();
    let mut index = vec![UNVISITED; n];
    let mut lowlink = vec![0u32; n];
    let mut on_stack = vec![false; n];
    // Per state: a transition to a finished live component, or to itself.
    let mut reaches_live = vec![false; n];
    let mut self_loop = vec![false; n];
    let mut stack: Vec<u32> = Vec::new();
    // A state being visited and the position of its next successor.
    let mut calls: Vec<(u32, u32)> = Vec::new();
    let mut out = Components { of: vec![UNVISITED; n], has_cycle: vec![false], live: vec![false] };
    if n > 0 {
        out.of[DEAD as usize] = 0;
    }
    let mut counter = 0u32;
    for root in 1..n {
        if index[root] != UNVISITED {
            continue;
        }
        index[root] = counter;
        lowlink[root] = counter;
        counter += 1;
        stack.push(root as u32);
        on_stack[root] = true;
        calls.push((root as u32, successors.offsets[root]));
        while let Some(&mut (state, ref mut next)) = calls.last_mut() {
            let s = state as usize;
            if *next < successors.offsets[s + 1] {
                let target = successors.list[*next as usize] as usize;
                *next += 1;
                if index[target] == UNVISITED {
                    index[target] = counter;
                    lowlink[target] = counter;
                    counter += 1;
                    stack.push(target as u32);
                    on_stack[target] = true;
                    calls.push((target as u32, successors.offsets[target]));
                } else if on_stack[target] {
                    lowlink[s] = lowlink[s].min(index[target]);
                    self_loop[s] |= target == s;
                } else {
                    reaches_live[s] |= out.live[out.of[target] as usize];
                }
                continue;
            }
            calls.pop();
            if let Some(&(caller, _)) = calls.last() {
                let c = caller as usize;
                lowlink[c] = lowlink[c].min(lowlink[s]);
            }
            if lowlink[s] == index[s] {
                // `state` roots a component: the states above it on the stack.
                let id = out.has_cycle.len() as u32;
                let first = stack.iter().rposition(|&m| m == state).expect("the root is on the stack");
                let mut live = false;
                let cycle = stack.len() - first > 1 || self_loop[s];
                for &member in &stack[first..] {
                    let m = member as usize;
                    on_stack[m] = false;
                    out.of[m] = id;
                    live |= accepting[m] || reaches_live[m];
                }
                stack.truncate(first);
                out.has_cycle.push(cycle);
                out.live.push(live);
            }
            // Back in the caller: a finished callee's liveness is known now.
            if let Some(&(caller, _)) = calls.last() {
                if !on_stack[s] {
                    reaches_live[caller as usize] |= out.live[out.of[s] as usize];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::dfa::RegexOptions;

    /// Moore's refinement, every state every round: the reference for the
    /// incremental version.
    fn naive_equivalence(dfa: &ByteDfa, depth: usize) -> Vec<u32> {
        let n = dfa.num_states();
        let mut class: Vec<u32> = (0..n).map(|s| u32::from(s != 0)).collect();
        for _ in 0..depth {
            let mut ids: HashMap<Vec<u32>, u32> = HashMap::new();
            let next: Vec<u32> = (0..n)
                .map(|s| {
                    let mut sig = vec![class[s]];
                    sig.extend((0..=255u8).map(|b| class[dfa.next(s as u32, b) as usize]));
                    let fresh = ids.len() as u32;
                    *ids.entry(sig).or_insert(fresh)
                })
                .collect();
            class = next;
        }
        class
    }

    fn same_partition(a: &[u32], b: &[u32]) -> bool {
        (0..a.len()).all(|i| (0..a.len()).all(|j| (a[i] == a[j]) == (b[i] == b[j])))
    }

    /// Liveness by a backward search, and "same component" as mutual reachability.
    #[test]
    fn components_and_liveness_match_their_definitions() {
        let mut seed = 0x2545_f491_u64;
        let mut random = |bound: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % bound
        };
        for _ in 0..200 {
            let (n, nc) = (1 + random(12) as usize, 1 + random(3) as usize);
            let mut transitions = vec![DEAD; n * nc];
            for t in transitions.iter_mut().skip(nc) {
                *t = if random(3) == 0 { DEAD } else { random(n as u64) as u32 };
            }
            let accepting: Vec<bool> = (0..n).map(|s| s != 0 && random(4) == 0).collect();
            let reach = |from: usize| {
                let mut seen = vec![false; n];
                let mut todo = vec![from];
                while let Some(s) = todo.pop() {
                    for &t in &transitions[s * nc..(s + 1) * nc] {
                        if t != DEAD && !std::mem::replace(&mut seen[t as usize], true) {
                            todo.push(t as usize);
                        }
                    }
                }
                seen
            };
            let found = components(n, nc, &transitions, &accepting);
            for a in 1..n {
                let from_a = reach(a);
                let live = accepting[a] || (1..n).any(|t| from_a[t] && accepting[t]);
                assert_eq!(found.live[found.of[a] as usize], live);
                assert_eq!(found.has_cycle[found.of[a] as usize], from_a[a]);
                for (b, &a_reaches_b) in from_a.iter().enumerate().skip(1) {
                    assert_eq!(found.of[a] == found.of[b], a == b || (a_reaches_b && reach(b)[a]));
                }
            }
        }
    }

    #[test]
    fn incremental_equivalence_equals_moore() {
        let patterns =
            ["a{0,30}b", "(?:a{0,12}b){2}", "[^\n]{0,40}\n", "(ab|ac){1,6}d*", "x*(yz){3,9}|q[a-c]{2,7}"];
        for pattern in patterns {
            let dfa = ByteDfa::from_regex(pattern, &RegexOptions::default()).unwrap();
            for depth in [0, 1, 2, 3, 5, 8, 13, 40] {
                let fast = dfa.equivalence_up_to(depth);
                let slow = naive_equivalence(&dfa, depth);
                assert!(same_partition(&fast, &slow), "{pattern} at depth {depth}");
                assert_eq!(fast[0], 0);
            }
        }
    }
}
