//! Thompson NFA -> DFA table by subset construction, for the patterns we build: the
//! only look-around is the `\z` appended to every pattern. regex-automata's dense
//! builder is general (start states per look-behind context, match kinds, quit bytes)
//! and costs ~35 µs even for `abc`; a JSON Schema compiles several patterns, so this
//! plain construction is used whenever it applies, and the dense builder otherwise.
//! It reads its own flat NFA ([`Nfa`]), which the direct reader writes and a
//! regex-automata NFA is copied into.

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
pub(super) fn determinize(nfa: &Nfa, options: &RegexOptions) -> Result<ByteDfa> {
    let started = Instant::now();
    let (classes, num_classes) = nfa.byte_classes();
    let mut closure = Closure::new(nfa.len());
    let mut sets = SetStore::default();
    // Sized for about as many DFA states as the NFA has (bounded): growing the table by
    // doubling copied it several times over.
    let expected_states = nfa.len().clamp(16, 1 << 14);
    let mut transitions = Vec::with_capacity(expected_states * num_classes);
    transitions.resize(num_classes, DEAD);
    let mut accepting = Vec::with_capacity(expected_states);
    accepting.push(false);
    // The distinct targets of each row but DEAD (in class order, a target repeated
    // over neighbouring classes listed once): the trim and the loop analysis walk
    // these rather than the whole table.
    let mut successors = Successors::with_capacity(expected_states, expected_states * 4);
    successors.end_row(Successors::NOT_ONE); // DEAD's row: nothing
    let mut buffer = Vec::new();
    closure.of(nfa, [nfa.start], &mut buffer);
    let intern = |set: &[u32], sets: &mut SetStore| -> Result<u32> {
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
    let mut set: Vec<u32> = Vec::new();
    // The byte transitions of the state being expanded: first class, last class, target.
    let mut edges: Vec<(u16, u16, u32)> = Vec::new();
    // The NFA states one byte of the current piece leads to, and of the piece before.
    let (mut list, mut previous): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
    let mut key: Vec<u32> = Vec::new();
    // Per class: the ranges (bits, by index in `edges`) that start there, and those
    // that end just before it. Cleared as they are read.
    let (mut starting, mut ending) = (vec![0u64; num_classes + 1], vec![0u64; num_classes + 1]);
    // The DFA state one byte leads to, by the NFA states it leads to: one NFA state
    // (the usual case) by index, several by their sorted list. A cache only: the sets
    // (and so the state numbers) are found by their closure.
    let mut target_of_one: Vec<u32> = vec![u32::MAX; nfa.len()];
    let mut targets = SetStore::default();
    let mut target_of: Vec<u32> = vec![DEAD];
    // Per `\z` state: whether a match follows it (see [`Closure::accepts_at_end`]).
    let mut end_accepts = vec![EndAccepts::Unknown; nfa.len()];
    while next_to_expand < sets.len() {
        if next_to_expand % 256 == 0 {
            if started.elapsed() > options.timeout {
                return Err(too_large(format!("compiling took longer than {:?}", options.timeout)));
            }
            crate::budget::check()?;
        }
        set.clear();
        set.extend_from_slice(sets.get(next_to_expand as u32));
        accepting.push(closure.accepts_at_end(nfa, &set, &mut end_accepts));
        edges.clear();
        // Where pieces start: every run's first class and the class after its last.
        let mut cuts = Cuts::default();
        let mut add = |lo: u8, hi: u8, next: u32, edges: &mut Vec<(u16, u16, u32)>| {
            let (lo, hi) = (u16::from(classes[lo as usize]), u16::from(classes[hi as usize]));
            cuts.mark(lo);
            cuts.mark(hi + 1);
            edges.push((lo, hi, next));
        };
        for &id in &set {
            match nfa.states[id as usize] {
                NfaState::Range { start, end, next } => add(start, end, next, &mut edges),
                NfaState::Sparse { first, len } => {
                    for &(start, end, next) in &nfa.ranges[first as usize..(first + len) as usize] {
                        add(start, end, next, &mut edges);
                    }
                }
                _ => {}
            }
        }
        let row_start = transitions.len();
        // The row starts all DEAD (a fill the compiler turns into `memset`) and each
        // live piece is then filled as a slice: extending the table piece by piece
        // wrote it one entry at a time.
        transitions.resize(row_start + num_classes, DEAD);
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
        // Classes of the row leading anywhere, and the first of them.
        let (mut live_classes, mut first_live) = (0u16, Successors::NOT_ONE);
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
                    let slot = &mut target_of_one[one as usize];
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
            if target != DEAD {
                if live_classes == 0 {
                    first_live = piece_start;
                }
                live_classes += piece_end - piece_start;
                transitions[row_start + piece_start as usize..row_start + piece_end as usize].fill(target);
            }
            std::mem::swap(&mut list, &mut previous);
            previous_target = target;
            piece_start = piece_end;
        }
        ending[num_classes] = 0;
        successors.end_row(if live_classes == 1 { first_live } else { Successors::NOT_ONE });
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
    states: Vec<u32>,
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

    fn get(&self, id: u32) -> &[u32] {
        &self.states[self.bounds[id as usize]..self.bounds[id as usize + 1]]
    }

    fn heap_bytes(&self) -> usize {
        self.states.len() * std::mem::size_of::<u32>() + self.bounds.len() * 16
    }

    fn hash(set: &[u32]) -> u32 {
        let mut hash = set.len() as u64;
        for &id in set {
            hash = (hash.rotate_left(5) ^ id as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
        (hash >> 32) as u32
    }

    /// The id of `set`, and whether it is new.
    fn intern(&mut self, set: &[u32]) -> (u32, bool) {
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
fn same(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Epsilon closures, with a reusable visited mark.
struct Closure {
    mark: Vec<u32>,
    generation: u32,
    stack: Vec<u32>,
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

    fn visit(&mut self, id: u32) -> bool {
        let slot = &mut self.mark[id as usize];
        let fresh = *slot != self.generation;
        *slot = self.generation;
        fresh
    }

    /// Push the alternatives of the union whose list starts at `entry`.
    fn push_alternates(&mut self, nfa: &Nfa, mut entry: u32) {
        while entry != Nfa::NONE {
            let (to, next) = nfa.alternates[entry as usize];
            self.stack.push(to);
            entry = next;
        }
    }

    /// The states reachable from `roots` without reading a byte, stopping at `\z`
    /// (kept in the set: it is tried at the end of input); the states that read
    /// bytes, the `\z` states and matches, sorted.
    fn of(&mut self, nfa: &Nfa, roots: impl IntoIterator<Item = u32>, set: &mut Vec<u32>) {
        self.fresh();
        set.clear();
        self.stack.extend(roots);
        while let Some(id) = self.stack.pop() {
            if !self.visit(id) {
                continue;
            }
            match nfa.states[id as usize] {
                NfaState::Empty { next } => self.stack.push(next),
                NfaState::Union { head } => self.push_alternates(nfa, head),
                NfaState::Fail => {}
                NfaState::Range { .. } | NfaState::Sparse { .. } | NfaState::End { .. } | NfaState::Match => {
                    set.push(id)
                }
            }
        }
        set.sort_unstable();
    }

    /// Whether a match is reached from `set` (a closure: states that read bytes, `\z`
    /// states and matches) at the end of input. Only a match or a `\z` state leads
    /// there; whether a `\z` state does is walked once and kept in `ends`: walking
    /// from the whole set for every DFA state cost a second closure walk per state.
    fn accepts_at_end(&mut self, nfa: &Nfa, set: &[u32], ends: &mut [EndAccepts]) -> bool {
        set.iter().any(|&id| match nfa.states[id as usize] {
            NfaState::Match => true,
            NfaState::End { .. } => {
                if ends[id as usize] == EndAccepts::Unknown {
                    ends[id as usize] =
                        if self.reaches_match(nfa, id) { EndAccepts::Yes } else { EndAccepts::No };
                }
                ends[id as usize] == EndAccepts::Yes
            }
            _ => false,
        })
    }

    /// Whether a match is reached from `root` at the end of input.
    fn reaches_match(&mut self, nfa: &Nfa, root: u32) -> bool {
        self.fresh();
        self.stack.push(root);
        let mut found = false;
        while let Some(id) = self.stack.pop() {
            if found || !self.visit(id) {
                continue;
            }
            match nfa.states[id as usize] {
                NfaState::Match => found = true,
                NfaState::End { next } | NfaState::Empty { next } => self.stack.push(next),
                NfaState::Union { head } => self.push_alternates(nfa, head),
                _ => {}
            }
        }
        self.stack.clear();
        found
    }
}

/// Whether a `\z` state leads to a match (at the end of input).
#[derive(Clone, Copy, PartialEq, Eq)]
enum EndAccepts {
    Unknown,
    No,
    Yes,
}

/// A Thompson NFA in flat arrays, for [`determinize`]: what the direct reader
/// (`direct.rs`) writes, with no pass after it (regex-automata's `Builder::build`
/// copied every state into its NFA, boxing each sparse and union state, and freeing
/// them again cost as much), and what a regex-automata NFA is copied into.
///
/// Empty states are kept (the closure steps over them); the only look-around is `\z`.
pub(super) struct Nfa {
    states: Vec<NfaState>,
    /// The byte ranges of sparse states, end to end.
    ranges: Vec<(u8, u8, u32)>,
    /// The alternatives of union states, each a linked list (target, next entry).
    alternates: Vec<(u32, u32)>,
    /// Where byte classes end (bit b: b and b + 1 are in different classes).
    class_ends: [u64; 4],
    start: u32,
    /// Bytes the NFA may take before it is too large (`None`: no limit).
    size_limit: Option<usize>,
}

#[derive(Clone, Copy, Debug)]
enum NfaState {
    /// An epsilon transition.
    Empty {
        next: u32,
    },
    Range {
        start: u8,
        end: u8,
        next: u32,
    },
    /// Ranges `ranges[first..first + len]` (sorted, disjoint).
    Sparse {
        first: u32,
        len: u32,
    },
    /// Alternatives from entry `head` of `alternates` ([`Nfa::NONE`]: none).
    Union {
        head: u32,
    },
    /// `\z`, then `next`.
    End {
        next: u32,
    },
    Match,
    Fail,
}

/// The NFA grew past its size limit.
#[derive(Debug)]
pub(super) struct NfaTooLarge;

type Built = std::result::Result<u32, NfaTooLarge>;

impl Nfa {
    const NONE: u32 = u32::MAX;

    /// An empty NFA with room for `states` states.
    pub fn with_capacity(size_limit: Option<usize>, states: usize) -> Self {
        Nfa {
            states: Vec::with_capacity(states),
            ranges: Vec::new(),
            alternates: Vec::new(),
            class_ends: [0; 4],
            start: 0,
            size_limit,
        }
    }

    /// Heap bytes (the size limit's measure).
    pub fn memory_usage(&self) -> usize {
        use std::mem::size_of;
        self.states.len() * size_of::<NfaState>()
            + self.ranges.len() * size_of::<(u8, u8, u32)>()
            + self.alternates.len() * size_of::<(u32, u32)>()
    }

    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn set_start(&mut self, start: u32) {
        self.start = start;
    }

    fn add(&mut self, state: NfaState) -> Built {
        let id = self.states.len() as u32;
        self.states.push(state);
        match self.size_limit {
            Some(limit) if self.memory_usage() > limit => Err(NfaTooLarge),
            _ => Ok(id),
        }
    }

    fn mark_range(&mut self, start: u8, end: u8) {
        if start > 0 {
            let b = start - 1;
            self.class_ends[b as usize / 64] |= 1 << (b % 64);
        }
        self.class_ends[end as usize / 64] |= 1 << (end % 64);
    }

    pub fn add_empty(&mut self) -> Built {
        self.add(NfaState::Empty { next: 0 })
    }

    pub fn add_range(&mut self, start: u8, end: u8, next: u32) -> Built {
        self.mark_range(start, end);
        self.add(NfaState::Range { start, end, next })
    }

    /// One state over `ranges` (sorted, disjoint).
    pub fn add_sparse(&mut self, ranges: impl IntoIterator<Item = (u8, u8, u32)>) -> Built {
        let first = self.ranges.len();
        for (start, end, next) in ranges {
            self.mark_range(start, end);
            self.ranges.push((start, end, next));
        }
        let len = (self.ranges.len() - first) as u32;
        self.add(NfaState::Sparse { first: first as u32, len })
    }

    pub fn add_union(&mut self, alternates: &[u32]) -> Built {
        let id = self.add(NfaState::Union { head: Self::NONE })?;
        for &to in alternates {
            self.patch(id, to)?;
        }
        Ok(id)
    }

    pub fn add_end(&mut self, next: u32) -> Built {
        self.add(NfaState::End { next })
    }

    pub fn add_match(&mut self) -> Built {
        self.add(NfaState::Match)
    }

    pub fn add_fail(&mut self) -> Built {
        self.add(NfaState::Fail)
    }

    /// Point the exit `from` (an empty, range or end state) at `to`, or add `to` to the
    /// alternatives of the union `from`.
    pub fn patch(&mut self, from: u32, to: u32) -> std::result::Result<(), NfaTooLarge> {
        match &mut self.states[from as usize] {
            NfaState::Empty { next } | NfaState::Range { next, .. } | NfaState::End { next } => *next = to,
            NfaState::Union { head } => {
                let entry = self.alternates.len() as u32;
                self.alternates.push((to, *head));
                *head = entry;
                if matches!(self.size_limit, Some(limit) if self.memory_usage() > limit) {
                    return Err(NfaTooLarge);
                }
            }
            NfaState::Sparse { .. } | NfaState::Match | NfaState::Fail => {}
        }
        Ok(())
    }

    /// Byte -> class, as regex-automata's NFA gives them: bytes that no range of any
    /// state tells apart share a class.
    fn byte_classes(&self) -> ([u8; 256], usize) {
        let mut classes = [0u8; 256];
        let mut class = 0u8;
        for b in 0..=255u8 {
            classes[b as usize] = class;
            if b < 255 && self.class_ends[b as usize / 64] & (1 << (b % 64)) != 0 {
                class += 1;
            }
        }
        (classes, class as usize + 1)
    }

    /// A regex-automata NFA whose only look-around is `\z` (see [`applies`]), copied.
    pub fn from_thompson(nfa: &NFA) -> Self {
        let mut out = Nfa::with_capacity(None, nfa.states().len());
        for state in nfa.states() {
            let copied = match state {
                State::ByteRange { trans } => {
                    NfaState::Range { start: trans.start, end: trans.end, next: trans.next.as_u32() }
                }
                State::Sparse(sparse) => {
                    let first = out.ranges.len() as u32;
                    out.ranges.extend(sparse.transitions.iter().map(|t| (t.start, t.end, t.next.as_u32())));
                    NfaState::Sparse { first, len: sparse.transitions.len() as u32 }
                }
                State::Dense(dense) => {
                    let first = out.ranges.len() as u32;
                    let mut byte = 0usize;
                    while byte < 256 {
                        let next = dense.transitions[byte];
                        let mut end = byte;
                        while end < 255 && dense.transitions[end + 1] == next {
                            end += 1;
                        }
                        if next != StateID::ZERO {
                            out.ranges.push((byte as u8, end as u8, next.as_u32()));
                        }
                        byte = end + 1;
                    }
                    NfaState::Sparse { first, len: out.ranges.len() as u32 - first }
                }
                State::Look { next, .. } => NfaState::End { next: next.as_u32() },
                State::Union { alternates } => {
                    let mut head = Self::NONE;
                    for alt in alternates.iter() {
                        out.alternates.push((alt.as_u32(), head));
                        head = out.alternates.len() as u32 - 1;
                    }
                    NfaState::Union { head }
                }
                State::BinaryUnion { alt1, alt2 } => {
                    out.alternates.push((alt1.as_u32(), Self::NONE));
                    out.alternates.push((alt2.as_u32(), out.alternates.len() as u32 - 1));
                    NfaState::Union { head: out.alternates.len() as u32 - 1 }
                }
                State::Capture { next, .. } => NfaState::Empty { next: next.as_u32() },
                State::Match { .. } => NfaState::Match,
                State::Fail => NfaState::Fail,
            };
            out.states.push(copied);
        }
        out.start = nfa.start_anchored().as_u32();
        let classes = nfa.byte_classes();
        for b in 0..255u8 {
            if classes.get(b) != classes.get(b + 1) {
                out.class_ends[b as usize / 64] |= 1 << (b % 64);
            }
        }
        out
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
        let nfa = Nfa::from_thompson(&thompson::NFA::new(r"[a-z]{1,30}x[a-z]{8}").unwrap());
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
