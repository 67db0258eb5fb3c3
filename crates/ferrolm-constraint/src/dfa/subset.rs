//! Thompson NFA -> DFA table by subset construction, for the patterns we build: the
//! only look-around is the `\z` appended to every pattern. regex-automata's dense
//! builder is general (start states per look-behind context, match kinds, quit bytes)
//! and costs ~35 µs even for `abc`; a JSON Schema compiles several patterns, so this
//! plain construction (FxHash on state sets, one representative byte per class) is
//! used whenever it applies, and the dense builder otherwise.

use std::time::Instant;

use regex_automata::nfa::thompson::{State, NFA};
use regex_automata::util::look::Look;
use regex_automata::util::primitives::StateID;
use rustc_hash::FxHashMap;

use super::{ByteDfa, RegexOptions, DEAD};
use crate::error::{ConstraintError, Result};

/// Whether [`determinize`] handles `nfa`: no look-around but end of input.
pub(super) fn applies(nfa: &NFA) -> bool {
    nfa.look_set_any().iter().all(|look| look == Look::End)
}

/// The DFA of `nfa` (anchored at the start, accepting where `\z` then a match can be
/// reached), trimmed to states that can still reach acceptance.
///
/// Each state is expanded in one pass over its NFA states, which spreads their byte
/// ranges over the byte classes (class numbers grow with the byte, so a range is a run
/// of classes); neighbouring classes usually reach the same NFA states (every letter
/// inside a string), and the closure and lookup of such a target are done once. The
/// NFA state sets live in one flat array.
pub(super) fn determinize(nfa: &NFA, options: &RegexOptions) -> Result<ByteDfa> {
    let started = Instant::now();
    let (classes, num_classes, representative) = super::compile::class_table(nfa.byte_classes());
    let mut closure = Closure::new(nfa.states().len());
    let mut sets = SetStore::default();
    // Sized for about as many DFA states as the NFA has (bounded): growing the table by
    // doubling copied it several times over.
    let expected_states = nfa.states().len().clamp(16, 1 << 14);
    let mut transitions = Vec::with_capacity(expected_states * num_classes);
    transitions.resize(num_classes, DEAD);
    let mut accepting = Vec::with_capacity(expected_states);
    accepting.push(false);
    let mut buffer = Vec::new();
    closure.of(nfa, [nfa.start_anchored()], &mut buffer);
    let intern = |set: &[StateID], sets: &mut SetStore| -> Result<u32> {
        let (id, fresh) = sets.intern(set);
        if fresh {
            if sets.len() > options.max_states {
                return Err(too_large(format!("more than {} DFA states", options.max_states)));
            }
            if sets.heap_bytes() + sets.len() * num_classes * 4 > options.max_automaton_bytes {
                return Err(too_large(format!("the DFA exceeds {} bytes", options.max_automaton_bytes)));
            }
        }
        Ok(id)
    };
    let start = intern(&buffer, &mut sets)?;
    let mut next_to_expand = 1;
    let mut set: Vec<StateID> = Vec::new();
    // Per class: the NFA states one byte of it leads to, in the order of `set`.
    let mut per_class: Vec<Vec<StateID>> = vec![Vec::new(); num_classes];
    // Lists of NFA states one byte leads to, seen so far, and the DFA state of each
    // (list 0 is the empty list, never looked up).
    let mut targets = SetStore::default();
    let mut target_of: Vec<u32> = vec![DEAD];
    while next_to_expand < sets.len() {
        if next_to_expand % 256 == 0 {
            if started.elapsed() > options.timeout {
                return Err(too_large(format!("compiling took longer than {:?}", options.timeout)));
            }
            crate::budget::check()?;
        }
        set.clear();
        set.extend_from_slice(sets.get(next_to_expand as u32));
        accepting.push(closure.accepts_at_end(nfa, &set));
        per_class.iter_mut().for_each(Vec::clear);
        for &id in &set {
            match nfa.state(id) {
                State::ByteRange { trans } => {
                    spread(&classes, trans.start, trans.end, trans.next, &mut per_class);
                }
                State::Sparse(sparse) => {
                    for trans in sparse.transitions.iter() {
                        spread(&classes, trans.start, trans.end, trans.next, &mut per_class);
                    }
                }
                State::Dense(dense) => {
                    for (class, &byte) in representative.iter().enumerate() {
                        let next = dense.transitions[byte as usize];
                        if next != StateID::ZERO {
                            per_class[class].push(next);
                        }
                    }
                }
                _ => {}
            }
        }
        for class in 0..num_classes {
            let target = if per_class[class].is_empty() {
                DEAD
            } else if class > 0 && per_class[class] == per_class[class - 1] {
                *transitions.last().expect("the previous class's target")
            } else {
                // The same NFA states after a byte recur from many DFA states (every
                // character of a string body leads to the body again): their closure
                // and its lookup are done once.
                let (seen, fresh) = targets.intern(&per_class[class]);
                if fresh {
                    closure.of(nfa, per_class[class].iter().copied(), &mut buffer);
                    target_of.push(intern(&buffer, &mut sets)?);
                }
                target_of[seen as usize]
            };
            transitions.push(target);
        }
        next_to_expand += 1;
    }
    Ok(ByteDfa::from_table(classes, num_classes, transitions, accepting, start))
}

/// Add `next` to the target lists of the classes of bytes `start..=end`.
#[inline]
fn spread(classes: &[u8; 256], start: u8, end: u8, next: StateID, per_class: &mut [Vec<StateID>]) {
    for class in classes[start as usize]..=classes[end as usize] {
        per_class[class as usize].push(next);
    }
}

/// NFA state sets, each a DFA state (set k is state k; set 0, empty, is [`DEAD`]),
/// stored end to end in one array and found again by their hash.
struct SetStore {
    states: Vec<StateID>,
    /// Set k is `states[bounds[k]..bounds[k + 1]]`.
    bounds: Vec<usize>,
    /// Hash of a set -> the first set with that hash; further ones are chained.
    by_hash: FxHashMap<u64, u32>,
    next_same_hash: Vec<u32>,
}

impl Default for SetStore {
    fn default() -> Self {
        let mut store = SetStore {
            states: Vec::new(),
            bounds: vec![0],
            by_hash: FxHashMap::default(),
            next_same_hash: Vec::new(),
        };
        store.intern(&[]);
        store
    }
}

impl SetStore {
    const NONE: u32 = u32::MAX;

    fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    fn get(&self, id: u32) -> &[StateID] {
        &self.states[self.bounds[id as usize]..self.bounds[id as usize + 1]]
    }

    fn heap_bytes(&self) -> usize {
        self.states.len() * std::mem::size_of::<StateID>() + self.bounds.len() * 16
    }

    /// The id of `set`, and whether it is new.
    fn intern(&mut self, set: &[StateID]) -> (u32, bool) {
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut hasher = rustc_hash::FxHasher::default();
            set.hash(&mut hasher);
            hasher.finish()
        };
        let first = *self.by_hash.get(&hash).unwrap_or(&Self::NONE);
        let mut candidate = first;
        while candidate != Self::NONE {
            if self.get(candidate) == set {
                return (candidate, false);
            }
            candidate = self.next_same_hash[candidate as usize];
        }
        let id = self.len() as u32;
        self.states.extend_from_slice(set);
        self.bounds.push(self.states.len());
        self.next_same_hash.push(first);
        self.by_hash.insert(hash, id);
        (id, true)
    }
}

/// Epsilon closures, with a reusable visited mark.
struct Closure {
    mark: Vec<u32>,
    generation: u32,
    stack: Vec<StateID>,
}

impl Closure {
    fn new(nfa_states: usize) -> Self {
        Closure { mark: vec![0; nfa_states], generation: 0, stack: Vec::new() }
    }

    fn fresh(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.mark.fill(0);
            self.generation = 1;
        }
    }

    fn visit(&mut self, id: StateID) -> bool {
        let slot = &mut self.mark[id.as_usize()];
        let fresh = *slot != self.generation;
        *slot = self.generation;
        fresh
    }

    /// The states reachable from `roots` without reading a byte, stopping at looks
    /// (kept in the set: they are tried at the end of input); the states that read
    /// bytes, the looks and matches, sorted.
    fn of(&mut self, nfa: &NFA, roots: impl IntoIterator<Item = StateID>, set: &mut Vec<StateID>) {
        self.fresh();
        set.clear();
        self.stack.extend(roots);
        while let Some(id) = self.stack.pop() {
            if !self.visit(id) {
                continue;
            }
            match nfa.state(id) {
                State::Union { alternates } => self.stack.extend(alternates.iter().rev()),
                State::BinaryUnion { alt1, alt2 } => self.stack.extend([*alt2, *alt1]),
                State::Capture { next, .. } => self.stack.push(*next),
                State::Fail => {}
                State::ByteRange { .. }
                | State::Sparse(_)
                | State::Dense(_)
                | State::Look { .. }
                | State::Match { .. } => set.push(id),
            }
        }
        set.sort_unstable();
    }

    /// Whether a match is reached from `set` at the end of input (every look is `\z`).
    fn accepts_at_end(&mut self, nfa: &NFA, set: &[StateID]) -> bool {
        self.fresh();
        self.stack.extend(set.iter().copied());
        let mut found = false;
        while let Some(id) = self.stack.pop() {
            if found || !self.visit(id) {
                continue;
            }
            match nfa.state(id) {
                State::Match { .. } => found = true,
                State::Look { next, .. } => self.stack.push(*next),
                State::Union { alternates } => self.stack.extend(alternates.iter()),
                State::BinaryUnion { alt1, alt2 } => self.stack.extend([*alt1, *alt2]),
                State::Capture { next, .. } => self.stack.push(*next),
                _ => {}
            }
        }
        self.stack.clear();
        found
    }
}

fn too_large(message: String) -> ConstraintError {
    ConstraintError::GrammarTooLarge { message }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use regex_automata::nfa::thompson;

    use super::*;
    use crate::budget::{self, CancelFlag};

    #[test]
    fn the_construction_loop_stops_when_cancelled() {
        // Thousands of states: the loop reaches its periodic check.
        let nfa = thompson::NFA::new(r"[a-z]{1,30}x[a-z]{8}").unwrap();
        assert!(determinize(&nfa, &RegexOptions::default()).unwrap().num_states() > 1024);
        let flag = Arc::new(CancelFlag::default());
        flag.cancel();
        let err =
            budget::scope(usize::MAX, Some(flag.clone()), || determinize(&nfa, &RegexOptions::default()))
                .unwrap_err();
        assert!(err.to_string().contains("cancelled"), "{err}");
        assert_eq!(budget::observed(&flag), 1);
    }
}
