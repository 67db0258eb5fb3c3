//! Regex -> a byte-level DFA in our own compact table.
//!
//! regex-automata parses and determinizes (anchored at the start, `\z` appended so a
//! match means the whole output matched). We then copy the reachable states into a
//! table of our own and drop every state from which no accepting state can be reached:
//! that makes "not dead" mean exactly "still a prefix of some document", which is the
//! guarantee the token mask must give.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use regex_syntax::hir::{Hir, Look};
use rustc_hash::FxHashMap;

use crate::error::{ConstraintError, Result};

/// The state from which nothing can be completed. Every table row of it points to itself.
pub const DEAD: u32 = 0;

/// Limits on compiling one regex. Exceeding any is a [`ConstraintError::GrammarTooLarge`].
#[derive(Debug, Clone)]
pub struct RegexOptions {
    /// Upper bound on the NFA and on the DFA (each, in bytes) while building.
    pub max_automaton_bytes: usize,
    /// Upper bound on states in our table.
    pub max_states: usize,
    /// Upper bound on the time spent copying states into our table. (regex-automata's
    /// determinization itself is bounded by `max_automaton_bytes`, not by a clock.)
    pub timeout: Duration,
}

impl Default for RegexOptions {
    fn default() -> Self {
        RegexOptions { max_automaton_bytes: 64 << 20, max_states: 200_000, timeout: Duration::from_secs(10) }
    }
}

/// A DFA over bytes in which every state except [`DEAD`] can still reach acceptance.
#[derive(Debug, Clone)]
pub struct ByteDfa {
    /// Byte -> equivalence class (bytes no regex construct distinguishes share a class).
    classes: [u8; 256],
    num_classes: usize,
    /// `transitions[state * num_classes + class]`.
    transitions: Vec<u32>,
    /// The same table with targets stored as row offsets (`target * num_classes`), so
    /// the mask walk saves a multiply per trie node. Row 0 is still [`DEAD`].
    row_transitions: Vec<u32>,
    accepting: Vec<bool>,
    /// The only byte leaving a state alive, if exactly one does (jump-forward).
    single_byte: Vec<Option<u8>>,
    /// Whether any byte leaves a state alive.
    can_continue: Vec<bool>,
    /// Strongly connected component of each state, and whether that component holds a
    /// cycle (a loop the output can go round: the body of a string, free text).
    component: Vec<u32>,
    component_has_cycle: Vec<bool>,
    start: u32,
}

impl ByteDfa {
    pub fn from_regex(pattern: &str, options: &RegexOptions) -> Result<Self> {
        let invalid =
            |message: String| ConstraintError::InvalidRegex { pattern: pattern.to_string(), message };
        let hir = regex_syntax::ParserBuilder::new()
            .nest_limit(256)
            .build()
            .parse(pattern)
            .map_err(|e| invalid(e.to_string()))?;
        let whole = Hir::concat(vec![hir, Hir::look(Look::End)]);
        let nfa = thompson::Compiler::new()
            .configure(
                thompson::Config::new().nfa_size_limit(Some(options.max_automaton_bytes)).shrink(false),
            )
            .build_from_hir(&whole)
            .map_err(|e| {
                if e.size_limit().is_some() {
                    too_large(format!("the NFA exceeds {} bytes", options.max_automaton_bytes))
                } else {
                    invalid(error_chain(&e))
                }
            })?;
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    .dfa_size_limit(Some(options.max_automaton_bytes))
                    .determinize_size_limit(Some(options.max_automaton_bytes)),
            )
            .build_from_nfa(&nfa)
            .map_err(|e| {
                if e.is_size_limit_exceeded() {
                    too_large(format!("the DFA exceeds {} bytes", options.max_automaton_bytes))
                } else {
                    invalid(error_chain(&e))
                }
            })?;
        let table = copy_reachable(&dfa, options)?;
        let table = table.keep_live_states();
        if table.start == DEAD {
            return Err(invalid("the regex matches no string".into()));
        }
        Ok(table)
    }

    /// A DFA from a raw table (row `state * num_classes + class`, row 0 = [`DEAD`]):
    /// states that cannot reach acceptance are dropped and the summaries computed.
    pub(crate) fn from_table(
        classes: [u8; 256],
        num_classes: usize,
        transitions: Vec<u32>,
        accepting: Vec<bool>,
        start: u32,
    ) -> ByteDfa {
        ByteDfa {
            classes,
            num_classes,
            transitions,
            row_transitions: Vec::new(),
            accepting,
            single_byte: Vec::new(),
            can_continue: Vec::new(),
            component: Vec::new(),
            component_has_cycle: Vec::new(),
            start,
        }
        .keep_live_states()
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
        self.transitions[state as usize * self.num_classes + self.classes[byte as usize] as usize]
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
        let mut predecessors: Vec<Vec<u32>> = vec![Vec::new(); n];
        for s in 1..n {
            for c in 0..nc {
                let t = self.transitions[s * nc + c] as usize;
                if predecessors[t].last() != Some(&(s as u32)) {
                    predecessors[t].push(s as u32);
                }
            }
        }
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
                for &p in &predecessors[t as usize] {
                    if !std::mem::replace(&mut touched_mark[p as usize], true) {
                        touched.entry(class[p as usize]).or_default().push((p, signature(&class, p)));
                    }
                }
            }
            changed.clear();
            for (c, states) in touched {
                // Untouched members kept their signature, which they share.
                let untouched = members[c as usize].iter().copied().find(|&m| !touched_mark[m as usize]);
                for &(s, _) in &states {
                    touched_mark[s as usize] = false;
                }
                let base = untouched.map(|m| signature(&class, m));
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

    /// Whether `a` and `b` can reach each other.
    pub(crate) fn same_component(&self, a: u32, b: u32) -> bool {
        self.component[a as usize] == self.component[b as usize]
    }

    /// Whether `state` lies on a cycle.
    pub(crate) fn is_in_cycle(&self, state: u32) -> bool {
        self.component_has_cycle[self.component[state as usize] as usize]
    }

    /// Renumber so that only states that can reach acceptance remain; the others
    /// collapse into [`DEAD`]. Also fills the per-state summaries.
    fn keep_live_states(self) -> Self {
        let n = self.num_states();
        let nc = self.num_classes;
        let mut predecessors: Vec<Vec<u32>> = vec![Vec::new(); n];
        for state in 0..n {
            for class in 0..nc {
                let target = self.transitions[state * nc + class] as usize;
                predecessors[target].push(state as u32);
            }
        }
        let mut live = self.accepting.clone();
        live[DEAD as usize] = false;
        let mut queue: VecDeque<usize> = (0..n).filter(|&s| live[s]).collect();
        while let Some(state) = queue.pop_front() {
            for &pred in &predecessors[state] {
                if !live[pred as usize] && pred != DEAD {
                    live[pred as usize] = true;
                    queue.push_back(pred as usize);
                }
            }
        }
        let mut new_id = vec![DEAD; n];
        let mut next_id = 1;
        for state in 1..n {
            if live[state] {
                new_id[state] = next_id;
                next_id += 1;
            }
        }
        let kept = next_id as usize;
        let mut transitions = vec![DEAD; kept * nc];
        let mut accepting = vec![false; kept];
        for state in 1..n {
            if live[state] {
                let row = new_id[state] as usize;
                accepting[row] = self.accepting[state];
                for class in 0..nc {
                    transitions[row * nc + class] = new_id[self.transitions[state * nc + class] as usize];
                }
            }
        }
        let mut class_sizes = vec![0usize; nc];
        let mut class_byte = vec![0u8; nc];
        for byte in 0..=255u8 {
            class_sizes[self.classes[byte as usize] as usize] += 1;
            class_byte[self.classes[byte as usize] as usize] = byte;
        }
        let mut single_byte = vec![None; kept];
        let mut can_continue = vec![false; kept];
        for row in 0..kept {
            let live_classes: Vec<usize> = (0..nc).filter(|&c| transitions[row * nc + c] != DEAD).collect();
            can_continue[row] = !live_classes.is_empty();
            if let [only] = live_classes[..] {
                if class_sizes[only] == 1 {
                    single_byte[row] = Some(class_byte[only]);
                }
            }
        }
        let row_transitions = transitions.iter().map(|&t| t * nc as u32).collect();
        let (component, component_has_cycle) = strongly_connected_components(kept, nc, &transitions);
        ByteDfa {
            classes: self.classes,
            num_classes: nc,
            row_transitions,
            transitions,
            accepting,
            single_byte,
            can_continue,
            component,
            component_has_cycle,
            start: new_id[self.start as usize],
        }
    }
}

/// Kosaraju's algorithm, iteratively: a post-order of the forward graph, then
/// components collected on the reversed graph in reverse post-order. [`DEAD`] is left
/// out (its component is its own and has no cycle that matters).
fn strongly_connected_components(n: usize, nc: usize, transitions: &[u32]) -> (Vec<u32>, Vec<bool>) {
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
    let mut predecessors: Vec<Vec<usize>> = vec![Vec::new(); n];
    for state in 1..n {
        for target in successors(state) {
            predecessors[target].push(state);
        }
    }
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
            for &pred in &predecessors[members[i]] {
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

/// Breadth-first copy of the states reachable from the anchored start.
fn copy_reachable(dfa: &dense::DFA<Vec<u32>>, options: &RegexOptions) -> Result<ByteDfa> {
    let started = Instant::now();
    let byte_classes = dfa.byte_classes();
    let mut classes = [0u8; 256];
    for byte in 0..=255u8 {
        classes[byte as usize] = byte_classes.get(byte);
    }
    // alphabet_len counts the end-of-input class, which is not a byte.
    let num_classes = byte_classes.alphabet_len() - 1;
    let mut representative = vec![0u8; num_classes];
    for byte in (0..=255u8).rev() {
        representative[classes[byte as usize] as usize] = byte;
    }
    let start = dfa
        .start_state(&start::Config::new().anchored(Anchored::Yes))
        .map_err(|e| too_large(format!("no anchored start state: {e}")))?;

    let mut ids: HashMap<StateID, u32> = HashMap::new();
    let mut order: Vec<StateID> = vec![StateID::ZERO]; // slot 0 stands for DEAD
    let mut transitions = vec![DEAD; num_classes];
    let mut accepting = vec![false];
    let mut intern = |id: StateID, order: &mut Vec<StateID>| -> u32 {
        if dfa.is_dead_state(id) {
            return DEAD;
        }
        *ids.entry(id).or_insert_with(|| {
            order.push(id);
            (order.len() - 1) as u32
        })
    };
    let start_id = intern(start, &mut order);
    let mut next_to_expand = 1;
    while next_to_expand < order.len() {
        if order.len() > options.max_states {
            return Err(too_large(format!("more than {} DFA states", options.max_states)));
        }
        if next_to_expand % 256 == 0 && started.elapsed() > options.timeout {
            return Err(too_large(format!("compiling took longer than {:?}", options.timeout)));
        }
        let state = order[next_to_expand];
        for &byte in &representative {
            let target = dfa.next_state(state, byte);
            if dfa.is_quit_state(target) {
                return Err(too_large("the DFA gave up on a byte (quit state)".into()));
            }
            let target_id = intern(target, &mut order);
            transitions.push(target_id);
        }
        accepting.push(dfa.is_match_state(dfa.next_eoi_state(state)));
        next_to_expand += 1;
    }
    Ok(ByteDfa {
        classes,
        num_classes,
        transitions,
        row_transitions: Vec::new(),
        accepting,
        single_byte: Vec::new(),
        can_continue: Vec::new(),
        component: Vec::new(),
        component_has_cycle: Vec::new(),
        start: start_id,
    })
}

fn too_large(message: String) -> ConstraintError {
    ConstraintError::GrammarTooLarge { message }
}

/// regex-automata's top-level messages are terse ("error building NFA"); the cause is
/// further down the chain.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_match(pattern: &str, text: &str) -> bool {
        let dfa = ByteDfa::from_regex(pattern, &RegexOptions::default()).unwrap();
        let state = dfa.run(dfa.start(), text.as_bytes());
        state != DEAD && dfa.is_accepting(state)
    }

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

    #[test]
    fn matches_whole_text_only() {
        assert!(full_match("a+b", "aab"));
        assert!(!full_match("a+b", "aabb"));
        assert!(!full_match("a+b", "aa"));
        assert!(full_match("a|ab", "ab"));
        assert!(full_match("(?:)", ""));
    }

    #[test]
    fn dead_means_no_completion() {
        let dfa = ByteDfa::from_regex("ab|ac", &RegexOptions::default()).unwrap();
        assert_eq!(dfa.run(dfa.start(), b"b"), DEAD);
        let a = dfa.run(dfa.start(), b"a");
        assert_ne!(a, DEAD);
        assert!(!dfa.is_accepting(a));
        assert_eq!(dfa.single_byte(a), None);
        let forced = ByteDfa::from_regex("abc", &RegexOptions::default()).unwrap();
        assert_eq!(forced.single_byte(forced.start()), Some(b'a'));
    }

    #[test]
    fn unbalanced_group_cannot_escape_the_anchor() {
        assert!(ByteDfa::from_regex("a)|(b", &RegexOptions::default()).is_err());
    }

    #[test]
    fn size_limit_is_an_error() {
        let options = RegexOptions { max_automaton_bytes: 10_000, ..RegexOptions::default() };
        let err = ByteDfa::from_regex(r"[a-z]{1,50}x[a-z]{20}", &options).unwrap_err();
        assert!(matches!(err, ConstraintError::GrammarTooLarge { .. }), "{err}");
    }

    #[test]
    fn empty_language_is_an_error() {
        let err = ByteDfa::from_regex(r"[^\s\S]", &RegexOptions::default()).unwrap_err();
        assert!(matches!(err, ConstraintError::InvalidRegex { .. }), "{err}");
    }
}
