//! How a grammar fills masks.
//!
//! The allowed-token set of a plain grammar depends only on the DFA state, so masks are
//! cached and shared by every matcher of the grammar (bounded by a byte budget). The
//! cache is keyed not by state but by a coarser class: states that no token (no byte
//! string up to the longest token's length) can tell apart share one entry, which makes
//! the states of a counted repetition such as `[^"]{0,200}` share a mask until the count
//! nears its end. EOS is not in cached masks: it is added per state, where the state may
//! end. Recursive grammars cache by configuration (rule, state, whole stack). A cache
//! miss walks the trie, or starts from a loop index (`region.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use super::{Grammar, MAX_CACHED_STACK};
use crate::dfa::DEAD;
use crate::error::{ConstraintError, Result};
use crate::recursive::RuleSide;
use crate::recursive::{Config, Frame, Rules, ScratchFrames, CALL_BASE, NO_FRAME};
use crate::region::{Loop, LoopIndex, Override, SimulationMemo};
use crate::vocab::LONG_TOKEN_BYTES;

/// What a trie walk from one state of a rule finds while the rule's frame stays on the
/// stack: the tokens that never return from the rule (the rules it calls come back into
/// it), and the trie nodes where a path returns, with the rule's (accepting) state
/// there. The mask of any configuration at that state is the first plus the subtrees
/// of the second walked with the configuration's stack; a state whose mask needs a full
/// walk walks the trie once, not once per call site.
#[derive(Debug)]
pub(crate) struct FrameIndex {
    inside: Box<[u32]>,
    exits: Vec<(u32, u32)>,
}

/// The simulation memo key of a plain grammar's DFA: apart from every rule's, since a
/// memo's bits hold only for the automaton whose searches set them.
const PLAIN_DFA: (u32, bool) = (u32::MAX, false);

impl Grammar {
    /// [`Grammar::fill_mask`] for any configuration.
    pub(crate) fn fill_mask_at(&self, config: Config, frames: &[Frame], out: &mut [u32]) {
        let Some(rules) = &self.rules else {
            return self.fill_mask(config.state, out);
        };
        let key = stack_key(config, frames);
        let cached = key.as_ref().and_then(|k| self.lock_stack_masks().get(k).cloned());
        match cached {
            Some(mask) => mask.write_into(out),
            None => {
                self.compute_recursive_token_mask(rules, config, frames, out);
                let mask = CachedMask::of(out);
                let bytes = mask.heap_bytes();
                let reserved = self
                    .cache_bytes_left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(bytes))
                    .is_ok();
                if let (Some(key), true) = (key, reserved) {
                    self.lock_stack_masks().insert(key, Arc::new(mask));
                }
            }
        }
        if rules.can_end(config, frames) {
            self.set_eos(out);
        }
    }

    /// Like [`Grammar::compute_token_mask`], carrying configurations. Inside a loop of
    /// the current rule the stack stays as it is, so the loop indexes apply, with every
    /// byte a call or a return could take counted as leaving the loop.
    fn compute_recursive_token_mask(&self, rules: &Rules, config: Config, frames: &[Frame], out: &mut [u32]) {
        out.fill(0);
        let trie = self.vocab.trie();
        let mut scratch = ScratchFrames::new(frames);
        let dfa = rules.rule(config.rule);
        let may_return = config.stack != NO_FRAME;
        let marked = rules.marked();
        let overrides = |state: u32, byte: u8| {
            if byte >= CALL_BASE {
                Override::Dead
            } else if marked
                && (rules.has_marks(config.rule, state) || rules.guarded(config.rule, dfa.next(state, byte)))
            {
                Override::Leave
            } else if (may_return && dfa.is_accepting(state))
                || rules.call_on(config.rule, state, byte).is_some()
            {
                Override::Exit
            } else {
                Override::Plain
            }
        };
        let loop_index = Loop::around_with(dfa, config.state, overrides)
            .and_then(|l| Some((self.vocab.loop_indexes().get_or_build(trie, &l.key, out.len())?, l)));
        match loop_index {
            Some((index, around)) => {
                out.copy_from_slice(&index.inside);
                let subtrees = index
                    .exits
                    .iter()
                    .map(|&(node, l)| (node, Config { state: around.states[l as usize], ..config }));
                self.walk_subtrees(rules, config, subtrees, &mut scratch, out);
            }
            None => {
                let side = RuleSide { rules, rule: config.rule, may_return };
                let simulated = self.with_simulation_memo((config.rule, may_return), |memo| {
                    self.vocab.loop_indexes().simulated(&side, config.state, trie.max_depth(), memo)
                });
                match simulated {
                    Some((index, depth)) => self.fill_from_simulation(
                        &index,
                        depth,
                        config,
                        |c, b| rules.step(c, b, &mut scratch),
                        out,
                    ),
                    // Inside a rule that was called, the tokens that never return
                    // from it are the same at every call site (a `format: uri` string
                    // shared by dozens of members): walk them once per state.
                    None if may_return && !marked => {
                        let index = self.frame_index(rules, config.rule, config.state, out.len());
                        out.copy_from_slice(&index.inside);
                        let subtrees =
                            index.exits.iter().map(|&(node, state)| (node, Config { state, ..config }));
                        self.walk_subtrees(rules, config, subtrees, &mut scratch, out);
                    }
                    None if !marked => {
                        let leaves = self.walk_in_rule(rules, config, false, out);
                        self.walk_subtrees(rules, config, leaves, &mut scratch, out);
                    }
                    None => trie.walk_into_mask(config, |c, b| rules.step(c, b, &mut scratch), out),
                }
            }
        }
        for &(first, other) in trie.duplicates() {
            if get_bit(out, first) {
                set_bit(out, other);
            }
        }
    }

    /// Walk the trie under each `(node, configuration of its parent)` into `out`, with
    /// calls and returns (`config`: any configuration, to size the walk's scratch).
    fn walk_subtrees(
        &self,
        rules: &Rules,
        config: Config,
        subtrees: impl IntoIterator<Item = (u32, Config)>,
        scratch: &mut ScratchFrames,
        out: &mut [u32],
    ) {
        let trie = self.vocab.trie();
        let mut states = vec![config; trie.max_depth() + 1];
        for (node, parent) in subtrees {
            trie.walk_subtree_into_mask(node, parent, |c, b| rules.step(c, b, scratch), out, &mut states);
        }
    }

    /// The [`FrameIndex`] of `state` of `rule`, from the cache or walked now (and cached
    /// while the mask budget lasts).
    fn frame_index(&self, rules: &Rules, rule: u32, state: u32, words: usize) -> Arc<FrameIndex> {
        if let Some(found) = self.lock_frame_indexes().get(&(rule, state)) {
            return found.clone();
        }
        let dfa = rules.rule(rule);
        let mut inside = vec![0u32; words];
        let mut exits = Vec::new();
        // The rule's own frame is left off: its calls push frames above nothing and come
        // back, and where it would return, the step fails at the bottom of the stack.
        let mut scratch = ScratchFrames::new(&[]);
        let start = Config { rule, state, stack: NO_FRAME };
        let trie = self.vocab.trie();
        let mut states = vec![start; trie.max_depth() + 1];
        for (node, parent) in self.walk_in_rule(rules, start, true, &mut inside) {
            trie.walk_subtree_into_mask_indexed(
                node,
                parent,
                |node, c, byte| {
                    let next = rules.step(c, byte, &mut scratch);
                    if next.is_none() && c.stack == NO_FRAME && byte < CALL_BASE && dfa.is_accepting(c.state)
                    {
                        exits.push((node, c.state));
                    }
                    next
                },
                &mut inside,
                &mut states,
            );
        }
        let index = Arc::new(FrameIndex { inside: inside.into(), exits });
        let bytes = std::mem::size_of_val(&*index.inside) + index.exits.len() * 8;
        let reserved = self
            .cache_bytes_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(bytes))
            .is_ok();
        if reserved {
            self.lock_frame_indexes().insert((rule, state), index.clone());
        }
        index
    }

    /// A trie walk from `config` (in a grammar without marks) while the bytes stay in its
    /// rule: each is stepped on the rule's DFA rows, as a plain grammar's walk steps,
    /// not through [`Rules::step`] (which costs several times more per trie node). Where
    /// the DFA reads a byte no further from a state with calls or, with `may_return`,
    /// one that may end, the node and the configuration before it are returned, for the
    /// caller to walk that subtree with calls and returns.
    fn walk_in_rule(
        &self,
        rules: &Rules,
        config: Config,
        may_return: bool,
        out: &mut [u32],
    ) -> Vec<(u32, Config)> {
        let dfa = rules.rule(config.rule);
        let mut leaves = Vec::new();
        self.vocab.trie().walk_into_mask_indexed(
            dfa.row_of(config.state),
            |node, row, byte| {
                if byte >= CALL_BASE {
                    return None; // a call mark, never text
                }
                let next = dfa.next_row(row, byte);
                if next != DEAD {
                    return Some(next);
                }
                let state = dfa.state_of_row(row);
                if !rules.calls_from(config.rule, state).is_empty() || (may_return && dfa.is_accepting(state))
                {
                    leaves.push((node, Config { state, ..config }));
                }
                None
            },
            out,
        );
        leaves
    }

    fn lock_frame_indexes(&self) -> std::sync::MutexGuard<'_, HashMap<(u32, u32), Arc<FrameIndex>>> {
        self.frame_indexes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `search` with the simulation memo of `side`: `(rule, may_return)` for a rule
    /// of a recursive grammar, [`PLAIN_DFA`] for the DFA of a plain one (see `region.rs`).
    /// The lock is held through the search: two threads filling cold masks of one grammar
    /// at once take turns, and the second finds what the first proved.
    fn with_simulation_memo<T>(&self, side: (u32, bool), search: impl FnOnce(&mut SimulationMemo) -> T) -> T {
        let mut memos = self.simulation_memos.lock().unwrap_or_else(|e| e.into_inner());
        search(memos.entry(side).or_default())
    }

    fn lock_stack_masks(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u32>, Arc<CachedMask>>> {
        self.stack_masks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write the mask of `state` into `out` (exactly `bitmask_words` long).
    pub(crate) fn fill_mask(&self, state: u32, out: &mut [u32]) {
        debug_assert_eq!(out.len(), self.vocab.bitmask_words());
        let slot = &self.masks[self.mask_class[state as usize] as usize];
        match slot.get() {
            Some(cached) => cached.write_into(out),
            None => {
                self.compute_token_mask(state, out, true);
                self.cache(slot, CachedMask::of(out));
            }
        }
        self.add_eos(state, out);
    }

    fn cache(&self, slot: &OnceLock<CachedMask>, mask: CachedMask) {
        let bytes = mask.heap_bytes();
        // Reserve budget first so concurrent fills cannot overshoot it.
        let reserved = self
            .cache_bytes_left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(bytes))
            .is_ok();
        if reserved && slot.set(mask).is_err() {
            // Another thread cached it first; give the budget back.
            self.cache_bytes_left.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// The mask of `state`, uncached: from the loop index when `state` sits in a loop
    /// of the automaton (see `region.rs`), else by a full trie walk. For a recursive
    /// grammar, `state` is one of the main rule's, with an empty stack. A state the
    /// grammar does not have allows nothing.
    pub fn compute_mask(&self, state: u32, out: &mut [u32]) -> Result<()> {
        self.compute_mask_with(state, out, true)
    }

    /// The mask of `state` by a full trie walk, never using loop indexes: the reference
    /// the fast paths are tested and benchmarked against.
    pub fn compute_mask_by_full_walk(&self, state: u32, out: &mut [u32]) -> Result<()> {
        self.compute_mask_with(state, out, false)
    }

    fn compute_mask_with(&self, state: u32, out: &mut [u32], use_loops: bool) -> Result<()> {
        let expected = self.vocab.bitmask_words();
        if out.len() != expected {
            return Err(ConstraintError::BitmaskSize { expected, got: out.len() });
        }
        if state as usize >= self.dfa.num_states() {
            out.fill(0);
            return Ok(());
        }
        match &self.rules {
            Some(rules) => {
                let config = Config { rule: 0, state, stack: NO_FRAME };
                self.compute_recursive_token_mask(rules, config, &[], out);
                if rules.can_end(config, &[]) {
                    self.set_eos(out);
                }
            }
            None => {
                self.compute_token_mask(state, out, use_loops);
                self.add_eos(state, out);
            }
        }
        Ok(())
    }

    /// The mask without EOS.
    fn compute_token_mask(&self, state: u32, out: &mut [u32], use_loops: bool) {
        out.fill(0);
        if state == DEAD {
            return;
        }
        let dfa = &self.dfa;
        let trie = self.vocab.trie();
        let step = |row: u32, byte: u8| {
            let next = dfa.next_row(row, byte);
            (next != DEAD).then_some(next)
        };
        let loop_index = use_loops
            .then(|| Loop::around(dfa, state))
            .flatten()
            .and_then(|l| Some((self.vocab.loop_indexes().get_or_build(trie, &l.key, out.len())?, l)));
        match loop_index {
            Some((index, around)) => {
                // Tokens that stay in the loop, then the subtrees where paths leave it,
                // each walked from the real state its parent is in.
                out.copy_from_slice(&index.inside);
                let mut scratch = vec![0u32; trie.max_depth() + 1];
                for &(node, loop_state) in &index.exits {
                    let parent = dfa.row_of(around.states[loop_state as usize]);
                    trie.walk_subtree_into_mask(node, parent, step, out, &mut scratch);
                }
            }
            None => match use_loops.then(|| self.simulate_loop(state, out)) {
                Some(true) => {}
                _ => trie.walk_into_mask(dfa.row_of(state), step, out),
            },
        }
        for &(first, other) in trie.duplicates() {
            if get_bit(out, first) {
                set_bit(out, other);
            }
        }
    }

    /// The mask of `state` (outside any indexed loop) from an indexed loop it simulates
    /// deep enough (`region.rs`); `false`, with `out` untouched, when there is none.
    fn simulate_loop(&self, state: u32, out: &mut [u32]) -> bool {
        let dfa = &self.dfa;
        let Some((index, depth)) = self.with_simulation_memo(PLAIN_DFA, |memo| {
            self.vocab.loop_indexes().simulated(dfa, state, self.vocab.trie().max_depth(), memo)
        }) else {
            return false;
        };
        let step = |row: u32, byte: u8| {
            let next = dfa.next_row(row, byte);
            (next != DEAD).then_some(next)
        };
        self.fill_from_simulation(&index, depth, dfa.row_of(state), step, out);
        true
    }

    /// The mask from a loop that the automaton at `start` simulates `depth` bytes deep:
    /// the loop's inside tokens no longer than that, its exits within that depth walked
    /// from the real states their paths lead to, and the longer tokens walked alone.
    /// Duplicate ids are left to the caller.
    #[inline(never)]
    fn fill_from_simulation<S: Copy>(
        &self,
        index: &LoopIndex,
        depth: usize,
        start: S,
        mut step: impl FnMut(S, u8) -> Option<S>,
        out: &mut [u32],
    ) {
        let vocab = &self.vocab;
        let trie = vocab.trie();
        out.copy_from_slice(&index.inside);
        if depth < trie.max_depth() {
            for id in vocab.ids_longer_than(depth) {
                out[id as usize / 32] &= !(1 << (id % 32));
            }
        }
        let mut scratch = vec![start; trie.max_depth() + 1];
        for (&(node, _), &token) in index.exits.iter().zip(&index.exit_tokens) {
            let node_depth = trie.node_depth(node);
            if node_depth > depth {
                continue;
            }
            let path = &vocab.token_bytes(token).expect("trie tokens have bytes")[..node_depth - 1];
            if let Some(parent) = path.iter().try_fold(start, |s, &b| step(s, b)) {
                trie.walk_subtree_into_mask(node, parent, &mut step, out, &mut scratch);
            }
        }
        if depth < trie.max_depth() {
            // Only tokens longer than `depth` are left to walk: from the trie of the
            // long tokens when they all are in it.
            let long = if depth >= LONG_TOKEN_BYTES { vocab.long_token_trie() } else { trie };
            long.walk_long_tokens_into_mask(start, &mut step, out, depth);
        }
    }

    fn add_eos(&self, state: u32, out: &mut [u32]) {
        if state != DEAD && self.dfa.is_accepting(state) {
            self.set_eos(out);
        }
    }

    fn set_eos(&self, out: &mut [u32]) {
        for &eos in self.vocab.eos_ids() {
            set_bit(out, eos);
        }
    }

    /// How deep `state` (of a plain grammar, outside any loop) simulates an indexed loop
    /// of the vocabulary, if deep enough for its mask to come from that loop's index;
    /// for tests and diagnostics.
    #[doc(hidden)]
    pub fn simulated_depth(&self, state: u32) -> Option<usize> {
        if self.rules.is_some() || state == DEAD || state as usize >= self.dfa.num_states() {
            return None;
        }
        if Loop::around(&self.dfa, state).is_some() {
            return None;
        }
        let trie = self.vocab.trie();
        self.with_simulation_memo(PLAIN_DFA, |memo| {
            self.vocab.loop_indexes().simulated(&self.dfa, state, trie.max_depth(), memo)
        })
        .map(|(_, depth)| depth)
    }

    /// Number of distinct mask-cache entries the grammar can have (at most one per state).
    pub fn num_mask_classes(&self) -> usize {
        self.masks.len()
    }
}

/// A mask in a grammar's cache. Most states allow a few hundred tokens at most (a
/// value's first byte, a member name, a keyword): those are kept as their non-zero words
/// only, which also spares a cold mask the page faults of a fresh 25 kB (o200k) buffer.
#[derive(Debug)]
pub(crate) enum CachedMask {
    Dense(Box<[u32]>),
    /// `(word index, word)` of the non-zero words, in order.
    Sparse(Box<[(u32, u32)]>),
}

impl CachedMask {
    pub(crate) fn of(mask: &[u32]) -> CachedMask {
        let nonzero = mask.iter().filter(|&&w| w != 0).count();
        // A sparse word takes two: sparse wins below half the words set.
        if nonzero * 2 < mask.len() {
            let words =
                mask.iter().enumerate().filter(|(_, &w)| w != 0).map(|(i, &w)| (i as u32, w)).collect();
            CachedMask::Sparse(words)
        } else {
            CachedMask::Dense(mask.into())
        }
    }

    pub(crate) fn write_into(&self, out: &mut [u32]) {
        match self {
            CachedMask::Dense(words) => out.copy_from_slice(words),
            CachedMask::Sparse(words) => {
                out.fill(0);
                for &(i, w) in words.iter() {
                    out[i as usize] = w;
                }
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            CachedMask::Dense(words) => std::mem::size_of_val(&**words),
            CachedMask::Sparse(words) => std::mem::size_of_val(&**words),
        }
    }
}

/// The cache key of a configuration: rule, state and every frame of the stack (a token
/// may return through many of them); `None` when the stack is too deep to cache.
fn stack_key(config: Config, frames: &[Frame]) -> Option<Vec<u32>> {
    let mut key = vec![config.rule, config.state];
    let mut index = config.stack;
    while index != NO_FRAME {
        if key.len() > 2 * MAX_CACHED_STACK {
            return None;
        }
        let frame = frames[index as usize];
        key.extend([frame.rule, frame.state]);
        index = frame.below;
    }
    Some(key)
}

#[inline(always)]
pub(crate) fn set_bit(mask: &mut [u32], id: u32) {
    mask[(id >> 5) as usize] |= 1 << (id & 31);
}

#[inline(always)]
pub(crate) fn get_bit(mask: &[u32], id: u32) -> bool {
    mask[(id >> 5) as usize] & (1 << (id & 31)) != 0
}
