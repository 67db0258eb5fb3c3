//! Structure of a [`ByteDfa`] that mask computation exploits: its loops and which
//! states no token can tell apart.

use rustc_hash::FxHashMap;

use super::{ByteDfa, DEAD};

/// One class in a refinement round: its id, its touched states with their signatures,
/// and the signature its untouched states share (if it has any).
type TouchedClass = (u32, Vec<(u32, Vec<u32>)>, Option<Vec<u32>>);

/// Predecessor lists of a transition table in one flat array (a `Vec` per state costs
/// an allocation each, which dominated small compilations): the states with a
/// transition into `t` (other than [`DEAD`]) are `list[offsets[t]..offsets[t + 1]]`,
/// a state listed once per target.
pub(super) struct Predecessors {
    offsets: Vec<u32>,
    list: Vec<u32>,
}

impl Predecessors {
    pub fn new(n: usize, nc: usize, transitions: &[u32]) -> Self {
        let mut offsets = vec![0u32; n + 1];
        let mut last_source = vec![u32::MAX; n];
        for s in 1..n {
            for &t in &transitions[s * nc..(s + 1) * nc] {
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
            for &t in &transitions[s * nc..(s + 1) * nc] {
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
        let predecessors = Predecessors::new(n, nc, &self.transitions);
        let mut class: Vec<u32> = (0..n).map(|s| u32::from(s != DEAD as usize)).collect();
        let mut members: Vec<Vec<u32>> = vec![vec![DEAD], (1..n as u32).collect()];
        let mut changed: Vec<u32> = (0..n as u32).collect();
        let mut touched_mark = vec![false; n];
        let signature = |class: &[u32], s: u32| -> Vec<u32> {
            (0..nc).map(|c| class[self.transitions[s as usize * nc + c] as usize]).collect()
        };
        for _ in 0..depth {
            // States with a successor whose class changed, grouped by their own class,
            // each with its signature taken before any split of this round.
            let mut touched: FxHashMap<u32, Vec<(u32, Vec<u32>)>> = FxHashMap::default();
            for &t in &changed {
                for &p in predecessors.of(t as usize) {
                    if !std::mem::replace(&mut touched_mark[p as usize], true) {
                        touched.entry(class[p as usize]).or_default().push((p, signature(&class, p)));
                    }
                }
            }
            changed.clear();
            // Untouched members kept their signature, which they share; it is taken
            // now, before this round moves any state to a new class.
            let touched: Vec<TouchedClass> = touched
                .into_iter()
                .map(|(c, states)| {
                    let untouched = members[c as usize].iter().copied().find(|&m| !touched_mark[m as usize]);
                    (c, states, untouched.map(|m| signature(&class, m)))
                })
                .collect();
            for (c, states, base) in touched {
                for &(s, _) in &states {
                    touched_mark[s as usize] = false;
                }
                let mut groups: FxHashMap<Vec<u32>, Vec<u32>> = FxHashMap::default();
                for (s, sig) in states {
                    if Some(&sig) != base.as_ref() {
                        groups.entry(sig).or_default().push(s);
                    }
                }
                // With no untouched member, the first group keeps the old class id.
                let mut keep_one = base.is_none();
                for (_, group) in groups {
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

/// Kosaraju's algorithm, iteratively: a post-order of the forward graph, then
/// components collected on the reversed graph in reverse post-order. [`DEAD`] is left
/// out (its component is its own and has no cycle that matters).
pub(super) fn strongly_connected_components(
    n: usize,
    nc: usize,
    transitions: &[u32],
) -> (Vec<u32>, Vec<bool>) {
    let successors = |s: usize| {
        transitions[s * nc..(s + 1) * nc].iter().map(|&t| t as usize).filter(|&t| t != DEAD as usize)
    };
    let mut visited = vec![false; n];
    let mut post_order = Vec::with_capacity(n);
    for root in 1..n {
        if visited[root] {
            continue;
        }
        visited[root] = true;
        let mut stack = vec![(root, 0usize)];
        while let Some((state, next_class)) = stack.last_mut() {
            if *next_class < nc {
                let target = transitions[*state * nc + *next_class] as usize;
                *next_class += 1;
                if target != DEAD as usize && !visited[target] {
                    visited[target] = true;
                    stack.push((target, 0));
                }
            } else {
                post_order.push(*state);
                stack.pop();
            }
        }
    }
    let predecessors = Predecessors::new(n, nc, transitions);
    let unassigned = u32::MAX;
    let mut component = vec![unassigned; n];
    let mut has_cycle = vec![false];
    component[DEAD as usize] = 0;
    for &root in post_order.iter().rev() {
        if component[root] != unassigned {
            continue;
        }
        let id = has_cycle.len() as u32;
        let mut members = vec![root];
        component[root] = id;
        let mut i = 0;
        while i < members.len() {
            for &pred in predecessors.of(members[i]) {
                let pred = pred as usize;
                if component[pred] == unassigned {
                    component[pred] = id;
                    members.push(pred);
                }
            }
            i += 1;
        }
        let self_loop = successors(root).any(|t| t == root);
        has_cycle.push(members.len() > 1 || self_loop);
    }
    (component, has_cycle)
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
