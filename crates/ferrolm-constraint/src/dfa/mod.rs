//! A byte-level DFA in our own compact table, in which every state except [`DEAD`] can
//! still reach acceptance: "not dead" means exactly "still a prefix of some document",
//! the guarantee the token mask must give.
//!
//! - `compile`: regex -> table (regex-automata builds the NFA and determinizes;
//!   `parse` reads the regex text our translators write, regex-syntax any other);
//! - `analysis`: loops (strongly connected components) and the token-depth equivalence
//!   of states that the mask cache and the loop indexes build on.

mod analysis;
mod compile;
mod direct;
mod parse;
mod subset;

use std::sync::Arc;

pub use compile::RegexOptions;
pub(crate) use compile::MAX_GROUP_NESTING;

/// The message of the [`crate::ConstraintError::InvalidRegex`] of a regex that matches
/// no string at all.
pub(crate) const MATCHES_NOTHING: &str = "the regex matches no string";

/// The state from which nothing can be completed. Every table row of it points to itself.
pub const DEAD: u32 = 0;

/// A DFA over bytes in which every state except [`DEAD`] can still reach acceptance.
///
/// The low-level table under a grammar, read on the hot path: its methods take the
/// state ids it hands out (`start`, `next`, below `num_states`) and index with them
/// directly, so a made-up id panics. Untrusted callers go through `Matcher`.
#[derive(Debug, Clone)]
pub struct ByteDfa {
    /// Byte -> equivalence class (bytes no regex construct distinguishes share a class).
    classes: [u8; 256],
    num_classes: usize,
    /// `row_transitions[state * num_classes + class]` is the target's row offset,
    /// `target * num_classes`, so the mask walk saves a multiply per trie node; row 0
    /// is [`DEAD`]. [`ByteDfa::next`] divides by `num_classes` with `row_divisor`. One
    /// table, not one of targets beside one of offsets: a compiled grammar's tables are
    /// fresh memory, and the page faults of writing a second copy cost more than the
    /// multiply saves (a tenth of a median schema's compile).
    ///
    /// The tables are never changed once built, and shared between clones: the memo of
    /// compiled patterns (`compile.rs`) hands the same rule (a value of any type, a
    /// string) to every schema, and a grammar keeps its main rule next to its rules.
    row_transitions: Arc<[u32]>,
    /// `ceil(2^32 / num_classes)`: a row offset times this, shifted right by 32, is its
    /// state (exact for every multiple of `num_classes` below 2^32).
    row_divisor: u64,
    accepting: Arc<[bool]>,
    /// The only byte leaving a state alive, if exactly one does (jump-forward).
    single_byte: Arc<[Option<u8>]>,
    /// Whether any byte leaves a state alive.
    can_continue: Arc<[bool]>,
    /// Strongly connected component of each state, and whether that component holds a
    /// cycle (a loop the output can go round: the body of a string, free text).
    component: Arc<[u32]>,
    component_has_cycle: Arc<[bool]>,
    start: u32,
}

impl ByteDfa {
    /// A DFA from a raw table (row `state * num_classes + class`, row 0 = [`DEAD`]):
    /// states that cannot reach acceptance are dropped and the summaries computed.
    pub(crate) fn from_table(
        classes: [u8; 256],
        num_classes: usize,
        transitions: Vec<u32>,
        accepting: Vec<bool>,
        start: u32,
    ) -> ByteDfa {
        let successors = analysis::Successors::of_table(accepting.len(), num_classes, &transitions);
        Self::keep_live_states(classes, num_classes, transitions, accepting, start, successors)
    }

    /// [`ByteDfa::from_table`] given the table's successor lists, which the subset
    /// construction writes as it fills the rows.
    fn from_table_with_successors(
        classes: [u8; 256],
        num_classes: usize,
        transitions: Vec<u32>,
        accepting: Vec<bool>,
        start: u32,
        successors: analysis::Successors,
    ) -> ByteDfa {
        debug_assert_eq!(successors.rows(), accepting.len());
        Self::keep_live_states(classes, num_classes, transitions, accepting, start, successors)
    }

    /// Bytes held on the heap (for memory budgets).
    pub(crate) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        self.row_transitions.len() * size_of::<u32>()
            + self.accepting.len() * (size_of::<bool>() * 3 + size_of::<Option<u8>>() + size_of::<u32>())
            + self.component_has_cycle.len()
    }

    /// The byte classes: bytes in one class have the same transitions everywhere.
    pub(crate) fn byte_class(&self, byte: u8) -> u8 {
        self.classes[byte as usize]
    }

    pub fn start(&self) -> u32 {
        self.start
    }

    /// Number of states, counting [`DEAD`].
    pub fn num_states(&self) -> usize {
        self.accepting.len()
    }

    #[inline(always)]
    pub fn next(&self, state: u32, byte: u8) -> u32 {
        self.target(state as usize * self.num_classes + self.classes[byte as usize] as usize)
    }

    /// The target state at `index` (`state * num_classes + class`) of the table.
    #[inline(always)]
    pub(crate) fn target(&self, index: usize) -> u32 {
        self.state_of_row(self.row_transitions[index])
    }

    /// The state whose row starts at `row` (the inverse of [`ByteDfa::row_of`]).
    #[inline(always)]
    pub(crate) fn state_of_row(&self, row: u32) -> u32 {
        divide_row(row, self.row_divisor)
    }

    /// The row offset of `state` in the row table (see [`ByteDfa::next_row`]).
    #[inline(always)]
    pub(crate) fn row_of(&self, state: u32) -> u32 {
        state * self.num_classes as u32
    }

    /// [`ByteDfa::next`] on row offsets; row 0 is [`DEAD`].
    #[inline(always)]
    pub(crate) fn next_row(&self, row: u32, byte: u8) -> u32 {
        self.row_transitions[row as usize + self.classes[byte as usize] as usize]
    }

    /// Run `bytes` from `state`; [`DEAD`] as soon as they leave the language.
    pub fn run(&self, mut state: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            state = self.next(state, b);
            if state == DEAD {
                break;
            }
        }
        state
    }

    /// The document may end here.
    pub fn is_accepting(&self, state: u32) -> bool {
        self.accepting[state as usize]
    }

    /// Some byte keeps the document alive from here.
    pub fn can_continue(&self, state: u32) -> bool {
        self.can_continue[state as usize]
    }

    /// The one byte that keeps the document alive, if there is exactly one.
    pub fn single_byte(&self, state: u32) -> Option<u8> {
        self.single_byte[state as usize]
    }

    /// Whether `a` and `b` can reach each other.
    pub(crate) fn same_component(&self, a: u32, b: u32) -> bool {
        self.component[a as usize] == self.component[b as usize]
    }

    /// Whether `state` lies on a cycle.
    pub(crate) fn is_in_cycle(&self, state: u32) -> bool {
        self.component_has_cycle[self.component[state as usize] as usize]
    }

    /// The same automaton with the transitions `(state, byte)` removed (each byte's
    /// whole class), trimmed again to the states that can still reach acceptance.
    pub(crate) fn without_edges(&self, edges: &[(u32, u8)]) -> ByteDfa {
        let mut transitions: Vec<u32> = (0..self.row_transitions.len()).map(|i| self.target(i)).collect();
        for &(state, byte) in edges {
            transitions[state as usize * self.num_classes + self.classes[byte as usize] as usize] = DEAD;
        }
        ByteDfa::from_table(self.classes, self.num_classes, transitions, self.accepting.to_vec(), self.start)
    }

    /// How many bytes share `byte`'s class.
    pub(crate) fn class_size(&self, byte: u8) -> usize {
        let class = self.classes[byte as usize];
        self.classes.iter().filter(|&&c| c == class).count()
    }

    /// Renumber so that only states that can reach acceptance remain; the others
    /// collapse into [`DEAD`]. Also fills the per-state summaries.
    fn keep_live_states(
        classes: [u8; 256],
        nc: usize,
        all_transitions: Vec<u32>,
        all_accepting: Vec<bool>,
        start: u32,
        successors: analysis::Successors,
    ) -> Self {
        let n = all_accepting.len();
        let found = analysis::components_of(&successors, &all_accepting);
        let live = |state: usize| state != DEAD as usize && found.live[found.of[state] as usize];
        let mut new_id = vec![DEAD; n];
        let mut next_id = 1;
        // Live components keep their states (a state on a cycle with a live one is
        // live), renumbered densely.
        let mut new_component = vec![u32::MAX; found.has_cycle.len()];
        let mut component = vec![0u32];
        let mut component_has_cycle = vec![false];
        for (state, id) in new_id.iter_mut().enumerate().skip(1) {
            if live(state) {
                *id = next_id;
                next_id += 1;
                let old = found.of[state] as usize;
                if new_component[old] == u32::MAX {
                    new_component[old] = component_has_cycle.len() as u32;
                    component_has_cycle.push(found.has_cycle[old]);
                }
                component.push(new_component[old]);
            }
        }
        let kept = next_id as usize;
        let (transitions, accepting) = if kept == n {
            // Every state is live (the usual case): ids and table stay as they are.
            (all_transitions, all_accepting)
        } else {
            let mut transitions = vec![DEAD; kept * nc];
            let mut accepting = vec![false; kept];
            for state in 1..n {
                if live(state) {
                    let row = new_id[state] as usize;
                    accepting[row] = all_accepting[state];
                    for class in 0..nc {
                        transitions[row * nc + class] = new_id[all_transitions[state * nc + class] as usize];
                    }
                }
            }
            (transitions, accepting)
        };
        let mut class_sizes = vec![0usize; nc];
        let mut class_byte = vec![0u8; nc];
        for byte in 0..=255u8 {
            class_sizes[classes[byte as usize] as usize] += 1;
            class_byte[classes[byte as usize] as usize] = byte;
        }
        let mut single_byte = vec![None; kept];
        let mut can_continue = vec![false; kept];
        for row in 0..kept {
            // Rows untouched by the trim: their successor lists tell which rows lead
            // anywhere, and whoever wrote them which have one live class.
            if kept == n {
                can_continue[row] = !successors.of(row).is_empty();
                if let Some(only) = successors.only_class(row) {
                    if class_sizes[only] == 1 {
                        single_byte[row] = Some(class_byte[only]);
                    }
                }
                continue;
            }
            let mut live_classes = (0..nc).filter(|&c| transitions[row * nc + c] != DEAD);
            let first = live_classes.next();
            can_continue[row] = first.is_some();
            if let (Some(only), None) = (first, live_classes.next()) {
                if class_sizes[only] == 1 {
                    single_byte[row] = Some(class_byte[only]);
                }
            }
        }
        ByteDfa {
            classes,
            num_classes: nc,
            // One pass: an exact-size iterator is written straight into the Arc.
            row_transitions: transitions.iter().map(|&t| t * nc as u32).collect(),
            row_divisor: row_divisor(nc),
            accepting: accepting.into(),
            single_byte: single_byte.into(),
            can_continue: can_continue.into(),
            component: component.into(),
            component_has_cycle: component_has_cycle.into(),
            start: new_id[start as usize],
        }
    }
}

/// `ceil(2^32 / num_classes)`, for [`divide_row`].
fn row_divisor(num_classes: usize) -> u64 {
    (1u64 << 32).div_ceil(num_classes as u64)
}

/// `row / num_classes` for a multiple `row = k * num_classes` below 2^32: with
/// `m = ceil(2^32 / n) = (2^32 + e) / n`, `e < n`, `row * m = k * 2^32 + k * e`, and
/// `k * e < k * n = row < 2^32`, so the high half is exactly `k`.
#[inline(always)]
fn divide_row(row: u32, row_divisor: u64) -> u32 {
    ((u64::from(row) * row_divisor) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every class count a table can have, with states at both ends of the range the
    /// row offsets allow.
    #[test]
    fn row_offsets_divide_back_to_their_states() {
        for nc in 1..=257u32 {
            let divisor = row_divisor(nc as usize);
            let top = u32::MAX / nc;
            for state in (0..4096).chain(top - 4096..=top).chain((0..top).step_by(1 + top as usize / 9973)) {
                assert_eq!(divide_row(state * nc, divisor), state, "{state} * {nc}");
            }
        }
    }

    #[test]
    fn next_reads_the_row_table_back() {
        let dfa = ByteDfa::from_regex("(ab|ac)*d[0-9]{2}", &RegexOptions::default()).unwrap();
        let mut state = dfa.start();
        for &b in b"abacd42" {
            let row = dfa.next_row(dfa.row_of(state), b);
            state = dfa.next(state, b);
            assert_eq!(row, dfa.row_of(state));
        }
        assert!(dfa.is_accepting(state));
    }
}
