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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::dfa::{ByteDfa, DEAD};
use crate::trie::TokenTrie;

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
        LoopIndex { inside: inside.into(), exits }
    }
}

/// Per-vocabulary memo of loop indexes, keyed by the loop's canonical transitions.
#[derive(Debug, Default)]
pub(crate) struct LoopIndexCache {
    indexes: Mutex<HashMap<Box<[u32]>, Arc<LoopIndex>>>,
}

impl LoopIndexCache {
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
