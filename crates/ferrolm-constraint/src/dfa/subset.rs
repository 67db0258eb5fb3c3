//! Thompson NFA -> DFA table by subset construction, for the patterns we build: the
//! only look-around is the `\z` appended to every pattern. regex-automata's dense
//! builder is general (start states per look-behind context, match kinds, quit bytes)
//! and costs ~35 µs even for `abc`; a JSON Schema compiles several patterns, so this
//! plain construction (FxHash on state sets, one representative byte per class) is
//! used whenever it applies, and the dense builder otherwise.

use std::time::Instant;

use super::analysis::Successors;
use super::{ByteDfa, RegexOptions, DEAD};
use crate::error::{ConstraintError, Result};
use regex_automata::nfa::thompson::{State, NFA};
use regex_automata::util::look::Look;
use regex_automata::util::primitives::StateID;

/// Whether [`determinize`] handles `nfa`: no look-around but end of input.
pub(super) fn applies(nfa: &NFA) -> bool {
    nfa.look_set_any().iter().all(|look| look == Look::End)
}

/// The DFA of `nfa` (anchored at the start, accepting where `\z` then a match can be
/// reached), trimmed to states that can still reach acceptance.
///
/// Each state is expanded in one pass over its NFA states, which collects their byte
/// ranges as runs of byte classes (class numbers grow with the byte, so a range is a
/// run of classes). The classes are cut where some run starts or ends; all classes of
/// a piece reach the same NFA states (every letter inside a string), so the list of
/// those states, its closure and lookup are done once per piece, and the piece's
/// row entries are filled at once. The NFA state sets live in one flat array.
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
    // The distinct targets of each row but DEAD (in class order, a target repeated
    // over neighbouring classes listed once): the trim and the loop analysis walk
    // these rather than the whole table.
    let mut successors = Successors::with_capacity(expected_states, expected_states * 4);
    successors.end_row(); // DEAD's row: nothing
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
    // The byte transitions of the state being expanded: first class, last class, target.
    let mut edges: Vec<(u16, u16, StateID)> = Vec::new();
    // The NFA states one byte of the current piece leads to, and of the piece before.
    let (mut list, mut previous): (Vec<StateID>, Vec<StateID>) = (Vec::new(), Vec::new());
    let mut key: Vec<StateID> = Vec::new();
    // Per class: the ranges (bits, by index in `edges`) that start there, and those
    // that end just before it. Cleared as they are read.
    let (mut starting, mut ending) = (vec![0u64; num_classes + 1], vec![0u64; num_classes + 1]);
    // The DFA state one byte leads to, by the NFA states it leads to: one NFA state
    // (the usual case) by index, several by their sorted list. A cache only: the sets
    // (and so the state numbers) are found by their closure.
    let mut target_of_one: Vec<u32> = vec![u32::MAX; nfa.states().len()];
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
        edges.clear();
        // Where pieces start: every run's first class and the class after its last.
        let mut cuts = Cuts::default();
        let mut add = |lo: u8, hi: u8, next: StateID, edges: &mut Vec<(u16, u16, StateID)>| {
            let (lo, hi) = (u16::from(classes[lo as usize]), u16::from(classes[hi as usize]));
            cuts.mark(lo);
            cuts.mark(hi + 1);
            edges.push((lo, hi, next));
        };
        for &id in &set {
            match nfa.state(id) {
                State::ByteRange { trans } => add(trans.start, trans.end, trans.next, &mut edges),
                State::Sparse(sparse) => {
                    for trans in sparse.transitions.iter() {
                        add(trans.start, trans.end, trans.next, &mut edges);
                    }
                }
                State::Dense(dense) => {
                    for &byte in representative.iter() {
                        let next = dense.transitions[byte as usize];
                        if next != StateID::ZERO {
                            add(byte, byte, next, &mut edges);
                        }
                    }
                }
                _ => {}
            }
        }
        let row_start = transitions.len();
        previous.clear();
        let mut previous_target = DEAD;
        let mut piece_start = 0u16;
        // With at most 64 ranges, the ranges covering the current piece are bits (in
        // the order of `edges`), updated where ranges start and end.
        let few = edges.len() <= 64;
        if few {
            for (i, edge) in edges.iter().enumerate() {
                starting[edge.0 as usize] |= 1 << i;
                ending[edge.1 as usize + 1] |= 1 << i;
            }
        }
        let mut covering = 0u64;
        for piece_end in cuts.after(0, num_classes as u16) {
            list.clear();
            if few {
                let at = piece_start as usize;
                covering = (covering & !std::mem::take(&mut ending[at])) | std::mem::take(&mut starting[at]);
                let mut bits = covering;
                while bits != 0 {
                    list.push(edges[bits.trailing_zeros() as usize].2);
                    bits &= bits - 1;
                }
            } else {
                list.extend(edges.iter().filter(|e| e.0 <= piece_start && piece_start <= e.1).map(|e| e.2));
            }
            let target = if list.is_empty() {
                DEAD
            } else if list == previous {
                previous_target
            } else {
                key.clear();
                key.extend_from_slice(&list);
                if key.len() > 1 {
                    key.sort_unstable();
                    key.dedup();
                }
                if let [one] = key[..] {
                    let slot = &mut target_of_one[one.as_usize()];
                    if *slot == u32::MAX {
                        closure.of(nfa, [one], &mut buffer);
                        *slot = intern(&buffer, &mut sets)?;
                    }
                    *slot
                } else {
                    let (seen, fresh) = targets.intern(&key);
                    if fresh {
                        closure.of(nfa, key.iter().copied(), &mut buffer);
                        target_of.push(intern(&buffer, &mut sets)?);
                    }
                    target_of[seen as usize]
                }
            };
            if target != DEAD && target != previous_target {
                successors.push(target);
            }
            transitions.resize(row_start + piece_end as usize, target);
            std::mem::swap(&mut list, &mut previous);
            previous_target = target;
            piece_start = piece_end;
        }
        ending[num_classes] = 0;
        successors.end_row();
        next_to_expand += 1;
    }
    Ok(ByteDfa::from_table_with_successors(classes, num_classes, transitions, accepting, start, successors))
}

/// Class numbers where the pieces of a row start (0 ..= 256), as bits.
#[derive(Default)]
struct Cuts([u64; 5]);

impl Cuts {
    #[inline]
    fn mark(&mut self, class: u16) {
        self.0[class as usize / 64] |= 1 << (class % 64);
    }

    /// The marked classes above `from`, up to and including `end` (always given).
    fn after(mut self, from: u16, end: u16) -> impl Iterator<Item = u16> {
        self.mark(end);
        let mut word = from as usize / 64;
        let mut bits = self.0[word] & (!0u64 << (from % 64)) & !(1u64 << (from % 64));
        std::iter::from_fn(move || loop {
            if bits != 0 {
                let class = (word * 64) as u16 + bits.trailing_zeros() as u16;
                bits &= bits - 1;
                if class > end {
                    return None;
                }
                return Some(class);
            }
            word += 1;
            if word >= self.0.len() || (word * 64) as u16 > end {
                return None;
            }
            bits = self.0[word];
        })
    }
}

/// NFA state sets, each a DFA state (set k is state k; set 0, empty, is [`DEAD`]),
/// stored end to end in one array and found again by their hash (open addressing).
struct SetStore {
    states: Vec<StateID>,
    /// Set k is `states[bounds[k]..bounds[k + 1]]`.
    bounds: Vec<usize>,
    /// Hash of each set.
    hashes: Vec<u32>,
    /// Set ids by hash, linear probing; [`SetStore::NONE`] where free. Its length is a
    /// power of two, at least twice the number of sets.
    slots: Vec<u32>,
}

impl Default for SetStore {
    fn default() -> Self {
        let mut store =
            SetStore { states: Vec::new(), bounds: vec![0], hashes: Vec::new(), slots: vec![Self::NONE; 64] };
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

    fn hash(set: &[StateID]) -> u32 {
        let mut hash = set.len() as u64;
        for id in set {
            hash = (hash.rotate_left(5) ^ id.as_u32() as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
        (hash >> 32) as u32
    }

    /// The id of `set`, and whether it is new.
    fn intern(&mut self, set: &[StateID]) -> (u32, bool) {
        let hash = Self::hash(set);
        let mask = self.slots.len() - 1;
        let mut slot = hash as usize & mask;
        loop {
            let candidate = self.slots[slot];
            if candidate == Self::NONE {
                break;
            }
            if self.hashes[candidate as usize] == hash && same(self.get(candidate), set) {
                return (candidate, false);
            }
            slot = (slot + 1) & mask;
        }
        let id = self.len() as u32;
        self.states.extend_from_slice(set);
        self.bounds.push(self.states.len());
        self.hashes.push(hash);
        self.slots[slot] = id;
        if self.len() * 2 > self.slots.len() {
            let size = self.slots.len() * 2;
            self.slots.clear();
            self.slots.resize(size, Self::NONE);
            for (id, &hash) in self.hashes.iter().enumerate() {
                let mut slot = hash as usize & (size - 1);
                while self.slots[slot] != Self::NONE {
                    slot = (slot + 1) & (size - 1);
                }
                self.slots[slot] = id as u32;
            }
        }
        (id, true)
    }
}

/// `a == b`, element by element: sets are short, and a call to `memcmp` costs more.
#[inline]
fn same(a: &[StateID], b: &[StateID]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
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
