//! A shortcut for the masks of states that sit inside a loop of the automaton (the
//! body of a JSON string, free text, a list of digits).
//!
//! Many states in many grammars share the same loop: every string field of every JSON
//! schema loops through the same few string-body states. While a token's bytes stay in
//! the loop, what happens depends only on the loop itself, not on the grammar around
//! it. So for each distinct loop (its transitions written canonically, byte by byte) we
//! walk the trie once, per vocabulary, and remember (a) the tokens that never leave the
//! loop and (b) the trie nodes where a path leaves it, with the loop state it leaves
//! from. A state's mask is then (a) plus a walk of the subtrees under (b) with the real
//! automaton: exact, and much cheaper than a full walk when most tokens stay inside.
//!
//! A state outside any loop can still behave like one for a while: the states of a
//! counted repetition `[^"]{0,100}"` act like the loop `[^"]*"` for every byte string
//! shorter than what is left of the count. [`LoopIndexCache::simulated`] finds an
//! indexed loop that a state simulates up to some depth `d` (every byte string of at
//! most `d` bytes is refused by both or followed by both, counting a loop exit as
//! "anything goes"); the mask is then the loop's inside tokens no longer than `d`, the
//! exits no deeper than `d` walked from the state's real successors, and a walk of the
//! tokens longer than `d` alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::dfa::{ByteDfa, DEAD};
use crate::trie::TokenTrie;

/// A simulation shallower than this is not worth it: the walk of the longer tokens
/// would cost about as much as a full walk.
pub(crate) const MIN_SIMULATION_DEPTH: usize = 8;
/// Simulations are not followed deeper than this: the search costs more with every
/// level, and a state that simulates a loop this deep has only the tokens longer than
/// this left to walk (o200k has a few hundred; `Vocabulary::long_token_trie` holds
/// them). A search that completes within it (no byte string tells the state from the
/// loop) has its pairs remembered, and the searches from the states that lead into the
/// same loop (a trie of member names) stop at once. A counted string never completes:
/// searched to o200k's longest token (128 bytes), its first mask cost 0.2-0.6 ms.
pub(crate) const MAX_SIMULATION_DEPTH: usize = 32;

/// What [`LoopIndex::simulation_depth`] returns for a state that simulates the loop
/// whatever the depth: every pair of states it can reach has been checked.
pub(crate) const NEVER_BREAKS: usize = usize::MAX;

/// Loops with more states than this are not indexed (their keys would be large).
const MAX_LOOP_STATES: usize = 32;
/// At most this many loops are indexed per vocabulary.
const MAX_INDEXES: usize = 64;

const DEAD_MARK: u32 = u32::MAX;
const EXIT_MARK: u32 = u32::MAX - 1;

/// The loop (strongly connected component) around one state, numbered canonically:
/// breadth-first from that state, bytes in increasing order.
pub(crate) struct Loop {
    /// Canonical index -> state of the grammar's automaton.
    pub states: Vec<u32>,
    /// For each canonical state and each byte: the canonical target, `DEAD_MARK`, or
    /// `EXIT_MARK` when the byte leaves the loop alive.
    pub key: Box<[u32]>,
}

/// How a recursive grammar overrides a byte's plain transition inside a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Override {
    /// The DFA transition is the whole story.
    Plain,
    /// Never text (a call byte).
    Dead,
    /// Leaves the loop even where the DFA says dead (a call or a return may take it).
    Exit,
    /// Leaves the loop whatever the DFA says (the target checks the names seen in an
    /// object whose members come in any order).
    Leave,
}

impl Loop {
    pub fn around(dfa: &ByteDfa, state: u32) -> Option<Loop> {
        Self::around_with(dfa, state, |_, _| Override::Plain)
    }

    /// [`Loop::around`] where `overrides(state, byte)` may turn a transition dead or
    /// into an exit (for rules of a recursive grammar).
    pub fn around_with(dfa: &ByteDfa, state: u32, overrides: impl Fn(u32, u8) -> Override) -> Option<Loop> {
        if !dfa.is_in_cycle(state) {
            return None;
        }
        let mut states = vec![state];
        let mut index: HashMap<u32, u32> = HashMap::from([(state, 0)]);
        let mut key = Vec::new();
        let mut i = 0;
        while i < states.len() {
            let from = states[i];
            for byte in 0..=255u8 {
                let target = dfa.next(from, byte);
                let mark = match overrides(from, byte) {
                    Override::Dead => DEAD_MARK,
                    Override::Exit if target == DEAD => EXIT_MARK,
                    Override::Leave => EXIT_MARK,
                    _ if target == DEAD => DEAD_MARK,
                    _ if !dfa.same_component(target, state) => EXIT_MARK,
                    _ => match index.get(&target) {
                        Some(&j) => j,
                        None => {
                            if states.len() == MAX_LOOP_STATES {
                                return None;
                            }
                            index.insert(target, states.len() as u32);
                            states.push(target);
                            states.len() as u32 - 1
                        }
                    },
                };
                key.push(mark);
            }
            i += 1;
        }
        Some(Loop { states, key: key.into() })
    }
}

/// What a trie walk through one loop found.
#[derive(Debug)]
pub(crate) struct LoopIndex {
    /// Tokens whose bytes all stay in the loop, from its first state.
    pub inside: Box<[u32]>,
    /// `(trie node, canonical loop state of its parent)` where a path leaves the loop.
    pub exits: Vec<(u32, u32)>,
    /// Per exit: a token under it, whose bytes spell the path to it.
    pub exit_tokens: Vec<u32>,
    /// Trie nodes under the exits, in all: what a mask from this index may still have to
    /// walk with the real automaton (a loop that most bytes leave at once, such as
    /// whitespace, saves nothing over a full walk).
    pub exit_nodes: usize,
    /// Fewer than half the trie's nodes lie under exits: a state that only simulates
    /// the loop gains from it (else its mask is as cheap by a plain walk).
    saves_work: bool,
    /// The loop's canonical transitions (see [`Loop::key`]).
    key: Box<[u32]>,
    /// Bytes with the same column in `key` share a group (simulation reads one byte
    /// per group).
    byte_group: [u8; 256],
    /// Bytes that stay in the loop from its first state: a state that steps on fewer
    /// bytes cannot simulate it (a quick test before the search).
    bytes_inside_from_start: usize,
}

impl LoopIndex {
    fn build(trie: &TokenTrie, key: &[u32], mask_words: usize) -> LoopIndex {
        let mut inside = vec![0u32; mask_words];
        let mut exits = Vec::new();
        trie.walk_into_mask_indexed(
            0u32,
            |node, state, byte| match key[state as usize * 256 + byte as usize] {
                DEAD_MARK => None,
                EXIT_MARK => {
                    exits.push((node, state));
                    None
                }
                next => Some(next),
            },
            &mut inside,
        );
        let exit_tokens = exits.iter().map(|&(node, _)| trie.token_under(node)).collect();
        let exit_nodes = exits.iter().map(|&(node, _)| trie.subtree_size(node)).sum();
        let num_states = key.len() / 256;
        let mut byte_group = [0u8; 256];
        let mut columns: Vec<Vec<u32>> = Vec::new();
        for byte in 0..256 {
            let column: Vec<u32> = (0..num_states).map(|l| key[l * 256 + byte]).collect();
            let group = columns.iter().position(|c| *c == column).unwrap_or_else(|| {
                columns.push(column);
                columns.len() - 1
            });
            byte_group[byte] = group as u8;
        }
        let bytes_inside_from_start =
            key[..256].iter().filter(|&&m| m != DEAD_MARK && m != EXIT_MARK).count();
        LoopIndex {
            inside: inside.into(),
            exits,
            exit_tokens,
            exit_nodes,
            saves_work: exit_nodes * 2 < trie.num_nodes(),
            key: key.into(),
            byte_group,
            bytes_inside_from_start,
        }
    }

    /// Whether `byte` from `q` keeps the simulation of loop state `l` (the pair to
    /// continue with, if both stay inside), or breaks it.
    #[inline]
    fn pair_step(
        &self,
        side: &impl SimulatingSide,
        q: u32,
        l: u32,
        byte: u8,
    ) -> Result<Option<(u32, u32)>, ()> {
        self.pair_outcome(l, byte, side.step(q, byte))
    }

    /// [`LoopIndex::pair_step`] once the side's step is known.
    #[inline]
    fn pair_outcome(&self, l: u32, byte: u8, step: SideStep) -> Result<Option<(u32, u32)>, ()> {
        match (self.key[l as usize * 256 + byte as usize], step) {
            (EXIT_MARK, _) => Ok(None),
            (DEAD_MARK, SideStep::Dead) => Ok(None),
            (DEAD_MARK, _) => Err(()),
            (_, SideStep::Dead | SideStep::Exit) => Err(()),
            (next, SideStep::To(target)) => Ok(Some((target, next))),
        }
    }

    /// How deep `state` of `side` simulates this loop from its first state: the
    /// largest `d <= limit` such that no byte string of at most `d` bytes is followed
    /// by one and refused by the other while the loop has not been left (where the
    /// side may leave by a call or a return, it must agree with the loop's exits), or
    /// [`NEVER_BREAKS`] when no byte string of any length tells them apart.
    ///
    /// `first` holds the side's step from `state` on every byte (the caller computes
    /// it once for all the loops it tries). `memo` (kept by the caller for this side and
    /// this loop) marks the pairs known to simulate at every depth, whose searches are
    /// not repeated, and keeps the bytes the search reads. A search that checks every pair it can reach
    /// and finds no disagreement marks them all, so the states of a member-name trie,
    /// which all lead into the same string body, search once between them.
    #[inline(never)]
    pub(crate) fn simulation_depth(
        &self,
        side: &impl SimulatingSide,
        state: u32,
        first: &[SideStep; 256],
        limit: usize,
        memo: &mut SideMemo,
    ) -> usize {
        let SideMemo { safe, bytes } = memo;
        let loop_states = (self.key.len() / 256) as u32;
        let words = (side.num_states() * loop_states as usize).div_ceil(64);
        if safe.len() < words {
            safe.resize(words, 0);
        }
        let is_safe = |safe: &[u64], bit: usize| safe[bit / 64] >> (bit % 64) & 1 == 1;
        if limit == 0 {
            return 0;
        }
        if is_safe(safe, (state * loop_states) as usize) {
            return NEVER_BREAKS;
        }
        // Most candidates fail on the first byte: check it plainly before any setup.
        if (0..=255u8).any(|byte| self.pair_outcome(0, byte, first[byte as usize]).is_err()) {
            return 0;
        }
        // Then one byte per (side's byte class, loop column group): the same for every
        // search of this side in this loop, so sorted out once.
        if bytes.is_empty() {
            let mut joint: Vec<(u32, u8)> = (0..=255u8)
                .map(|b| (side.byte_class(b) << 8 | self.byte_group[b as usize] as u32, b))
                .collect();
            joint.sort_unstable();
            joint.dedup_by_key(|(key, _)| *key);
            *bytes = joint.into_iter().map(|(_, b)| b).collect();
        }
        // Pairs already checked (a pair breaks the simulation at any depth or never),
        // or known safe.
        let mut visited = vec![0u64; words];
        let mut checked: Vec<u32> = Vec::new();
        let mut first_visit = |(q, l): (u32, u32), safe: &[u64]| {
            let bit = (q * loop_states + l) as usize;
            let fresh = visited[bit / 64] >> (bit % 64) & 1 == 0 && !is_safe(safe, bit);
            visited[bit / 64] |= 1 << (bit % 64);
            if fresh {
                checked.push(bit as u32);
            }
            fresh
        };
        first_visit((state, 0), safe);
        let mut level = vec![(state, 0u32)];
        let mut next_level = Vec::new();
        for depth in 0..limit {
            for &(q, l) in &level {
                for &byte in bytes.iter() {
                    match self.pair_step(side, q, l, byte) {
                        Err(()) => return depth,
                        Ok(Some(pair)) => {
                            if first_visit(pair, safe) {
                                next_level.push(pair);
                            }
                        }
                        Ok(None) => {}
                    }
                }
            }
            if next_level.is_empty() {
                // Every pair reachable has been checked (or was known safe): the
                // simulation never breaks, from any of them.
                for bit in checked {
                    safe[bit as usize / 64] |= 1 << (bit % 64);
                }
                return NEVER_BREAKS;
            }
            std::mem::swap(&mut level, &mut next_level);
            next_level.clear();
        }
        limit
    }
}

/// Per automaton that simulates loops (a plain grammar, or one rule of a recursive one
/// with or without a caller to return to): what its searches found.
#[derive(Debug, Default)]
pub(crate) struct SimulationMemo {
    /// Per loop index (by address: indexes live as long as their vocabulary).
    per_loop: HashMap<usize, SideMemo>,
    /// Per state searched: the answer of [`LoopIndexCache::simulated`], with how many
    /// loops were indexed then. A rule's state comes back under every stack it is
    /// reached with (each a mask of its own), and its search would find the same again
    /// unless more loops have been indexed since: it depends on the automata only.
    answers: HashMap<u32, (usize, Simulated)>,
}

/// A loop that a state simulates, and how deep (see [`LoopIndexCache::simulated`]).
pub(crate) type Simulated = Option<(Arc<LoopIndex>, usize)>;

/// What the searches of one side in one loop keep.
#[derive(Debug, Default)]
pub(crate) struct SideMemo {
    /// One bit per pair of a side state and a loop state: set when the pair is known to
    /// simulate the loop at every depth.
    safe: Vec<u64>,
    /// One byte per (side's byte class, loop column group); empty until the first
    /// search that needs it.
    bytes: Vec<u8>,
}

/// Where a byte takes the simulating automaton.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SideStep {
    Dead,
    /// It may leave the rule (a call or a return): what follows is not this DFA's.
    Exit,
    To(u32),
}

/// The automaton that simulates a loop: a plain DFA, or a rule of a recursive grammar
/// with its calls and returns.
pub(crate) trait SimulatingSide {
    fn num_states(&self) -> usize;
    fn step(&self, state: u32, byte: u8) -> SideStep;
    /// Bytes of one class step alike from every state.
    fn byte_class(&self, byte: u8) -> u32;
}

impl SimulatingSide for ByteDfa {
    fn num_states(&self) -> usize {
        ByteDfa::num_states(self)
    }
    #[inline]
    fn step(&self, state: u32, byte: u8) -> SideStep {
        match self.next(state, byte) {
            DEAD => SideStep::Dead,
            target => SideStep::To(target),
        }
    }
    fn byte_class(&self, byte: u8) -> u32 {
        ByteDfa::byte_class(self, byte) as u32
    }
}

/// Per-vocabulary memo of loop indexes, keyed by the loop's canonical transitions.
#[derive(Debug, Default)]
pub(crate) struct LoopIndexCache {
    indexes: Mutex<HashMap<Box<[u32]>, Arc<LoopIndex>>>,
    /// The JSON string loops have been indexed.
    json_primed: std::sync::OnceLock<()>,
}

impl LoopIndexCache {
    /// Run `prime` the first time only (per vocabulary).
    pub fn prime_json_once(&self, prime: impl FnOnce()) {
        self.json_primed.get_or_init(prime);
    }

    /// Loops indexed so far.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.indexes.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The indexed loop that `state` simulates deepest, with that depth, if it reaches
    /// [`MIN_SIMULATION_DEPTH`]; `limit` (the longest token's length) and
    /// [`MAX_SIMULATION_DEPTH`] cap the search, and a state proven to simulate a loop
    /// at every depth gets `limit` itself (its mask needs no walk of the long tokens).
    pub(crate) fn simulated(
        &self,
        side: &impl SimulatingSide,
        state: u32,
        limit: usize,
        memo: &mut SimulationMemo,
    ) -> Option<(Arc<LoopIndex>, usize)> {
        let indexed = self.indexes.lock().unwrap_or_else(|e| e.into_inner()).len();
        if let Some((then, answer)) = memo.answers.get(&state) {
            if *then == indexed {
                return answer.clone();
            }
        }
        let answer = self.search_simulated(side, state, limit, &mut memo.per_loop);
        memo.answers.insert(state, (indexed, answer.clone()));
        answer
    }

    /// [`LoopIndexCache::simulated`], searched.
    fn search_simulated(
        &self,
        side: &impl SimulatingSide,
        state: u32,
        limit: usize,
        memo: &mut HashMap<usize, SideMemo>,
    ) -> Option<(Arc<LoopIndex>, usize)> {
        let longest = limit;
        let limit = limit.min(MAX_SIMULATION_DEPTH);
        // Structural states (after `{`, between members) step on a handful of bytes
        // and are ruled out here, before any search.
        let first: [SideStep; 256] = std::array::from_fn(|b| side.step(state, b as u8));
        let stepping = first.iter().filter(|step| matches!(step, SideStep::To(_))).count();
        let mut candidates: Vec<Arc<LoopIndex>> = self
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|index| index.saves_work && index.bytes_inside_from_start <= stepping)
            .cloned()
            .collect();
        if candidates.is_empty() {
            return None;
        }
        // The cheapest first (the fewest trie nodes under exits, each exit being a walk
        // from a real state): the first to reach the limit wins, else the deepest.
        candidates.sort_by_key(|index| index.exit_nodes);
        let mut best: Option<(Arc<LoopIndex>, usize)> = None;
        for index in candidates {
            let side_memo = memo.entry(Arc::as_ptr(&index) as usize).or_default();
            let depth = match index.simulation_depth(side, state, &first, limit, side_memo) {
                NEVER_BREAKS => longest,
                depth => depth,
            };
            if depth >= MIN_SIMULATION_DEPTH && best.as_ref().is_none_or(|(_, d)| depth > *d) {
                best = Some((index, depth));
                if depth >= limit {
                    break;
                }
            }
        }
        best
    }

    /// The index of `key`, built now if new; `None` once the cache is full (the caller
    /// then walks the whole trie, which costs no more than building an index would).
    pub fn get_or_build(&self, trie: &TokenTrie, key: &[u32], mask_words: usize) -> Option<Arc<LoopIndex>> {
        {
            let indexes = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(index) = indexes.get(key) {
                return Some(index.clone());
            }
            if indexes.len() >= MAX_INDEXES {
                return None;
            }
        }
        // Built outside the lock: a walk takes a millisecond and others may be filling.
        let index = Arc::new(LoopIndex::build(trie, key, mask_words));
        let mut indexes = self.indexes.lock().unwrap_or_else(|e| e.into_inner());
        Some(indexes.entry(key.into()).or_insert(index).clone())
    }
}
