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
pub(super) fn determinize(nfa: &NFA, options: &RegexOptions) -> Result<ByteDfa> {
    let started = Instant::now();
    let (classes, num_classes, representative) = super::compile::class_table(nfa.byte_classes());
    let mut closure = Closure::new(nfa.states().len());
    // Sets are sorted NFA state lists; set k is DFA state k (0 = DEAD = empty set).
    let mut sets: Vec<Box<[StateID]>> = vec![Box::new([])];
    let mut ids: FxHashMap<Box<[StateID]>, u32> = FxHashMap::default();
    ids.insert(Box::new([]), DEAD);
    let mut transitions = vec![DEAD; num_classes];
    let mut accepting = vec![false];
    let mut set_bytes = 0usize;
    let mut buffer = Vec::new();
    closure.of(nfa, [nfa.start_anchored()], &mut buffer);
    let mut intern = |set: &[StateID], sets: &mut Vec<Box<[StateID]>>| -> Result<u32> {
        if let Some(&id) = ids.get(set) {
            return Ok(id);
        }
        set_bytes += std::mem::size_of_val(set);
        if sets.len() >= options.max_states {
            return Err(too_large(format!("more than {} DFA states", options.max_states)));
        }
        if set_bytes + sets.len() * num_classes * 4 > options.max_automaton_bytes {
            return Err(too_large(format!("the DFA exceeds {} bytes", options.max_automaton_bytes)));
        }
        let id = sets.len() as u32;
        let set: Box<[StateID]> = set.into();
        sets.push(set.clone());
        ids.insert(set, id);
        Ok(id)
    };
    let start = intern(&buffer, &mut sets)?;
    let mut next_to_expand = 1;
    let mut targets: Vec<StateID> = Vec::new();
    while next_to_expand < sets.len() {
        if next_to_expand % 256 == 0 {
            if started.elapsed() > options.timeout {
                return Err(too_large(format!("compiling took longer than {:?}", options.timeout)));
            }
            crate::budget::check()?;
        }
        let set = sets[next_to_expand].clone();
        accepting.push(closure.accepts_at_end(nfa, &set));
        for &byte in &representative {
            targets.clear();
            for &id in set.iter() {
                let next = match nfa.state(id) {
                    State::ByteRange { trans } => trans.matches_byte(byte).then_some(trans.next),
                    State::Sparse(sparse) => sparse.matches_byte(byte),
                    State::Dense(dense) => dense.matches_byte(byte),
                    _ => None,
                };
                targets.extend(next);
            }
            let target = if targets.is_empty() {
                DEAD
            } else {
                closure.of(nfa, targets.iter().copied(), &mut buffer);
                intern(&buffer, &mut sets)?
            };
            transitions.push(target);
        }
        next_to_expand += 1;
    }
    Ok(ByteDfa::from_table(classes, num_classes, transitions, accepting, start))
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
