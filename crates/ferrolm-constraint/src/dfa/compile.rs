//! Regex -> [`ByteDfa`]: regex-automata parses and determinizes (anchored at the start,
//! `\z` appended so a match means the whole output matched); we copy the reachable
//! states into our table, which then drops the states that cannot reach acceptance.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use regex_syntax::hir::{Hir, Look};

use super::{ByteDfa, DEAD};
use crate::error::{ConstraintError, Result};

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

impl ByteDfa {
    pub fn from_regex(pattern: &str, options: &RegexOptions) -> Result<Self> {
        Self::build(pattern, options, false)
    }

    /// [`ByteDfa::from_regex`] for patterns with rule calls: bytes 0xF8.. (never in
    /// UTF-8 text) written `(?-u:\xF8)`, which only our own translators produce.
    pub(crate) fn from_regex_with_calls(pattern: &str, options: &RegexOptions) -> Result<Self> {
        Self::build(pattern, options, true)
    }

    /// Compiled patterns are remembered process-wide: the rules every JSON Schema shares
    /// (a value of any type, a string, a number) would otherwise be determinized again for
    /// each schema. Only small tables are kept, and the memo is bounded.
    fn build(pattern: &str, options: &RegexOptions, allow_calls: bool) -> Result<Self> {
        let key = MemoKey {
            pattern: pattern.into(),
            allow_calls,
            max_automaton_bytes: options.max_automaton_bytes,
            max_states: options.max_states,
        };
        let memoized = lock_memo().dfas.get(&key).cloned();
        if let Some(dfa) = memoized {
            crate::budget::charge(dfa.heap_bytes(), "the DFA table")?;
            return Ok(ByteDfa::clone(&dfa));
        }
        crate::budget::charge(pattern.len(), "the regex text")?;
        let dfa = Self::build_uncached(pattern, options, allow_calls)?;
        let bytes = dfa.heap_bytes() + pattern.len();
        crate::budget::charge(dfa.heap_bytes(), "the DFA table")?;
        if bytes <= MEMO_MAX_DFA_BYTES {
            let mut memo = lock_memo();
            if memo.bytes + bytes > MEMO_BUDGET_BYTES {
                memo.dfas.clear();
                memo.bytes = 0;
            }
            if memo.dfas.insert(key, Arc::new(dfa.clone())).is_none() {
                memo.bytes += bytes;
            }
        }
        Ok(dfa)
    }

    fn build_uncached(pattern: &str, options: &RegexOptions, allow_calls: bool) -> Result<Self> {
        Self::build_with_route(pattern, options, allow_calls, true)
    }

    /// `direct`: read the syntax our translators write straight into an NFA
    /// (`direct.rs`); otherwise (and for any other syntax) regex-syntax parses and
    /// regex-automata's compiler builds the NFA.
    pub(super) fn build_with_route(
        pattern: &str,
        options: &RegexOptions,
        allow_calls: bool,
        direct: bool,
    ) -> Result<Self> {
        let invalid = |message: String| invalid_regex(pattern, message);
        let nfa_too_large = || too_large(format!("the NFA exceeds {} bytes", options.max_automaton_bytes));
        crate::budget::check()?;
        let read = match direct {
            true => {
                super::direct::compile(pattern, !allow_calls, MAX_GROUP_NESTING, options.max_automaton_bytes)
            }
            false => None,
        };
        let nfa = match read {
            Some(nfa) => {
                let nfa = nfa.map_err(|stop| match stop {
                    super::direct::Stop::TooLarge => nfa_too_large(),
                    super::direct::Stop::Budget(e) => e,
                })?;
                crate::budget::charge(nfa.memory_usage(), "the NFA")?;
                nfa
            }
            None => {
                let hir = regex_syntax::ParserBuilder::new()
                    .nest_limit(MAX_GROUP_NESTING)
                    .utf8(!allow_calls)
                    .build()
                    .parse(pattern)
                    .map_err(|e| invalid(e.to_string()))?;
                let whole = Hir::concat(vec![hir, Hir::look(Look::End)]);
                // No capture groups: we only ever ask "alive?", and captures add states.
                let config = thompson::Config::new()
                    .nfa_size_limit(Some(options.max_automaton_bytes))
                    .shrink(false)
                    .which_captures(thompson::WhichCaptures::None);
                crate::budget::check()?;
                let nfa = with_nfa_compiler(|compiler| {
                    compiler.configure(config).build_from_hir(&whole).map_err(Box::new)
                })
                .map_err(|e| {
                    if e.size_limit().is_some() {
                        nfa_too_large()
                    } else {
                        invalid(error_chain(&e))
                    }
                })?;
                crate::budget::charge(nfa.memory_usage(), "the NFA")?;
                if !super::subset::applies(&nfa) {
                    return Self::build_dense(&nfa, pattern, options);
                }
                super::subset::Nfa::from_thompson(&nfa)
            }
        };
        let table = super::subset::determinize(&nfa, options)?;
        if table.start == DEAD {
            return Err(invalid(super::MATCHES_NOTHING.into()));
        }
        Ok(table)
    }

    /// regex-automata's dense builder, for NFAs with other look-around than `\z`.
    fn build_dense(nfa: &thompson::NFA, pattern: &str, options: &RegexOptions) -> Result<Self> {
        let invalid = |message: String| invalid_regex(pattern, message);
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    // We copy the table into our own; the searcher's extras are waste.
                    .accelerate(false)
                    .specialize_start_states(false)
                    .dfa_size_limit(Some(options.max_automaton_bytes))
                    .determinize_size_limit(Some(options.max_automaton_bytes)),
            )
            .build_from_nfa(nfa)
            .map_err(|e| {
                if e.is_size_limit_exceeded() {
                    too_large(format!("the DFA exceeds {} bytes", options.max_automaton_bytes))
                } else {
                    invalid(error_chain(&e))
                }
            })?;
        let table = copy_reachable(&dfa, options)?;
        if table.start == DEAD {
            return Err(invalid(super::MATCHES_NOTHING.into()));
        }
        Ok(table)
    }
}

/// Deepest nesting of groups a regex may have. The parser and the HIR are safe at any
/// depth (they keep their own stacks), but the Thompson compiler recurses: 1024
/// levels take well under the 2 MiB stack of a spawned thread (tested). Objects with
/// hundreds of optional members nest two levels per member.
pub(crate) const MAX_GROUP_NESTING: u32 = 1024;

/// DFAs of at most this many bytes are memoized.
const MEMO_MAX_DFA_BYTES: usize = 256 << 10;
/// The memo is cleared when it would hold more than this.
const MEMO_BUDGET_BYTES: usize = 32 << 20;

#[derive(PartialEq, Eq, Hash)]
struct MemoKey {
    pattern: Box<str>,
    allow_calls: bool,
    max_automaton_bytes: usize,
    max_states: usize,
}

#[derive(Default)]
struct Memo {
    dfas: FxHashMap<MemoKey, Arc<ByteDfa>>,
    bytes: usize,
}

fn lock_memo() -> std::sync::MutexGuard<'static, Memo> {
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    MEMO.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// regex-automata's byte classes as our table: class of each byte, number of classes
/// (without the end-of-input one), and the smallest byte of each class.
pub(super) fn class_table(
    byte_classes: &regex_automata::util::alphabet::ByteClasses,
) -> ([u8; 256], usize, Vec<u8>) {
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
    (classes, num_classes, representative)
}

/// Breadth-first copy of the states reachable from the anchored start, trimmed to the
/// states that can still reach acceptance.
fn copy_reachable(dfa: &dense::DFA<Vec<u32>>, options: &RegexOptions) -> Result<ByteDfa> {
    let started = Instant::now();
    let (classes, num_classes, representative) = class_table(dfa.byte_classes());
    let start = dfa
        .start_state(&start::Config::new().anchored(Anchored::Yes))
        .map_err(|e| too_large(format!("no anchored start state: {e}")))?;

    let mut ids: FxHashMap<StateID, u32> = FxHashMap::default();
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
        if next_to_expand % 256 == 0 {
            if started.elapsed() > options.timeout {
                return Err(too_large(format!("compiling took longer than {:?}", options.timeout)));
            }
            crate::budget::check()?;
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
    Ok(ByteDfa::from_table(classes, num_classes, transitions, accepting, start_id))
}

/// A Thompson compiler kept per thread: a new one allocates its UTF-8 caches, which
/// costs more than compiling a small pattern.
fn with_nfa_compiler<T>(build: impl FnOnce(&mut thompson::Compiler) -> T) -> T {
    thread_local! {
        static COMPILER: std::cell::RefCell<thompson::Compiler> = std::cell::RefCell::new(thompson::Compiler::new());
    }
    COMPILER.with(|compiler| match compiler.try_borrow_mut() {
        Ok(mut compiler) => build(&mut compiler),
        // Re-entered (it never is today): a fresh compiler.
        Err(_) => build(&mut thompson::Compiler::new()),
    })
}

/// Long patterns (generated ones) are shortened in errors, and the parser's picture of
/// the pattern with carets under the fault is left out.
fn invalid_regex(pattern: &str, message: String) -> ConstraintError {
    const SHOWN: usize = 200;
    if pattern.len() <= SHOWN {
        return ConstraintError::InvalidRegex { pattern: pattern.to_string(), message };
    }
    let cut = (0..=SHOWN).rev().find(|&i| pattern.is_char_boundary(i)).unwrap_or(0);
    let last_line = message.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
    ConstraintError::InvalidRegex {
        pattern: format!("{}... ({} bytes)", &pattern[..cut], pattern.len()),
        message: last_line.trim().to_string(),
    }
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
    fn a_cancelled_compilation_returns_at_once() {
        let flag = std::sync::Arc::new(crate::budget::CancelFlag::default());
        flag.cancel();
        let err = crate::budget::scope(1 << 30, Some(flag), || {
            ByteDfa::from_regex(r"[a-z]{1,30}x[a-z]{12}", &RegexOptions::default())
        })
        .unwrap_err();
        assert!(err.to_string().contains("cancelled"), "{err}");
    }

    #[test]
    fn the_compile_budget_bounds_all_tables_together() {
        // Each table fits the per-regex limits; the scope's budget does not fit two.
        let one = ByteDfa::from_regex(r"[a-z]{1,30}x[a-z]{5}", &RegexOptions::default()).unwrap();
        let budget = one.heap_bytes() * 3 / 2;
        let err = crate::budget::scope(budget, None, || {
            ByteDfa::from_regex(r"[a-z]{1,30}x[a-z]{5}", &RegexOptions::default())?;
            ByteDfa::from_regex(r"[a-y]{1,30}x[a-z]{5}", &RegexOptions::default())
        })
        .unwrap_err();
        assert!(err.to_string().contains("memory budget"), "{err}");
    }

    #[test]
    fn the_deepest_nesting_allowed_compiles_on_a_small_thread_stack() {
        // The parser counts a group and the alternation in it: two levels each.
        let depth = MAX_GROUP_NESTING as usize / 2 - 1;
        let pattern = format!("{}a{}", "(?:b|".repeat(depth), ")".repeat(depth));
        let dfa = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || ByteDfa::from_regex(&pattern, &RegexOptions::default()).map(|d| d.num_states()))
            .unwrap()
            .join()
            .unwrap();
        assert!(dfa.is_ok(), "{dfa:?}");
        let too_deep = format!("{}a{}", "(?:b|".repeat(depth + 2), ")".repeat(depth + 2));
        assert!(depth > 500);
        let err = ByteDfa::from_regex(&too_deep, &RegexOptions::default()).unwrap_err();
        assert!(err.to_string().contains("nested parentheses"), "{err}");
    }

    #[test]
    fn empty_language_is_an_error() {
        let err = ByteDfa::from_regex(r"[^\s\S]", &RegexOptions::default()).unwrap_err();
        assert!(matches!(err, ConstraintError::InvalidRegex { .. }), "{err}");
    }
}
