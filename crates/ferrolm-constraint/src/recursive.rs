//! Rules that call rules: what a regular language cannot say, such as "a JSON value of
//! any type" (arrays and objects nest without bound).
//!
//! A recursive grammar is a list of DFAs, rule 0 the main one. In a rule's DFA a call
//! is spelled with bytes 0xF8..=0xFF (never part of UTF-8 text, so never a token's
//! text): the marker 0xFF, then the rule's number in three base-7 digits 0xF8..=0xFE.
//! The path `s --(0xFF d1 d2 d3)--> r` means "here comes a whole rule k, then continue
//! at r"; the calls of each state are listed once at build, so the states in the
//! middle of a call's spelling are never occupied. A
//! configuration is (rule, state, stack of return points). Reading a byte takes, in
//! order: the rule's own transition; else a call whose rule can begin with the byte;
//! else, where the rule may end, a return to the caller. The grammars we build are
//! checked to make that choice unambiguous (`Rules::new`), so this greedy order never
//! refuses a valid document.
//!
//! Stacks are linked frames in an arena, so a configuration is a small `Copy` value and
//! the trie walk can carry one per depth; frames pushed during a walk go to a scratch
//! arena layered over the matcher's.

use std::collections::HashMap;

use crate::dfa::{ByteDfa, DEAD};
use crate::error::{ConstraintError, Result};

/// The smallest byte that is never text: a member mark's first byte ([`MARK`]), then
/// the bytes of a call's spelling.
pub(crate) const CALL_BASE: u8 = 0xF7;
/// The smallest digit of a call's or a mark's number.
const DIGIT_BASE: u8 = 0xF8;
/// The first byte of every mark (`any_order` objects: see [`Mark`]).
const MARK: u8 = 0xF7;
/// Digits of a mark's number.
const MARK_DIGITS: usize = 5;
/// Mark numbers: 0 opens an object, `1 + 2j` is member name `j`, `2 + 2r` closes an
/// object whose required names are the `r`-th set.
pub(crate) const MAX_MARK_NUMBER: usize = 7 * 7 * 7 * 7 * 7;
/// The first byte of every call.
const CALL_MARK: u8 = 0xFF;
/// Digits of the rule number: 0xF8..=0xFE, base 7, three of them.
const CALL_DIGITS: u8 = 7;
/// At most this many rules (three base-7 digits).
pub(crate) const MAX_RULES: usize = 7 * 7 * 7;
/// The empty stack.
pub const NO_FRAME: u32 = u32::MAX;
/// Calls and returns taken for one byte, at most (they are epsilon moves; a rule cannot
/// begin by calling itself through a chain longer than the number of rules).
const MAX_MOVES_PER_BYTE: usize = MAX_RULES + 64;

/// Where a recursive matcher stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Config {
    pub rule: u32,
    pub state: u32,
    /// Top frame in the arena, or [`NO_FRAME`]. Return points, and above them, while
    /// an object whose members come in any order is open in the current rule, the
    /// member names seen in it (frames whose `rule` is [`SEEN`]; the object's `{` put
    /// a scope frame under them, its `}` takes them off).
    pub stack: u32,
}

/// The `rule` of a frame noting a member name (never a rule's number).
pub(crate) const SEEN: u32 = u32::MAX;
/// The `state` of the frame that opens an object's scope in a seen-names list.
const SCOPE: u32 = u32::MAX;
/// The `state` of a frame noting a member, whatever its name (see [`Mark::First`]).
const ITEM: u32 = u32::MAX - 1;

/// A return point: continue in `rule` at `state`; `below` is the next frame down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub rule: u32,
    pub state: u32,
    pub below: u32,
}

/// Somewhere frames live: a matcher's arena, or a walk's scratch over it.
pub(crate) trait Frames {
    fn frame(&self, index: u32) -> Frame;
    fn push(&mut self, frame: Frame) -> u32;
}

impl Frames for Vec<Frame> {
    fn frame(&self, index: u32) -> Frame {
        self[index as usize]
    }
    fn push(&mut self, frame: Frame) -> u32 {
        Vec::push(self, frame);
        (self.len() - 1) as u32
    }
}

/// Scratch frames layered over a matcher's arena (indexes from `base.len()` on). A
/// mask walk pushes the same few frames again and again, so equal frames are shared.
pub(crate) struct ScratchFrames<'a> {
    base: &'a [Frame],
    extra: Vec<Frame>,
    known: HashMap<(u32, u32, u32), u32>,
}

impl<'a> ScratchFrames<'a> {
    pub fn new(base: &'a [Frame]) -> Self {
        ScratchFrames { base, extra: Vec::new(), known: HashMap::new() }
    }
}

impl Frames for ScratchFrames<'_> {
    fn frame(&self, index: u32) -> Frame {
        let index = index as usize;
        match index.checked_sub(self.base.len()) {
            Some(extra) => self.extra[extra],
            None => self.base[index],
        }
    }
    fn push(&mut self, frame: Frame) -> u32 {
        let next = (self.base.len() + self.extra.len()) as u32;
        let index = *self.known.entry((frame.rule, frame.state, frame.below)).or_insert(next);
        if index == next {
            self.extra.push(frame);
        }
        index
    }
}

/// One rule seen as an automaton that may simulate a loop (`region.rs`): its own
/// transitions, with every byte a call or a return could take counted as leaving.
pub(crate) struct RuleSide<'a> {
    pub rules: &'a Rules,
    pub rule: u32,
    /// The stack is not empty, so a rule that may end may return.
    pub may_return: bool,
}

impl crate::region::SimulatingSide for RuleSide<'_> {
    fn num_states(&self) -> usize {
        self.rules.rule(self.rule).num_states()
    }

    #[inline]
    fn step(&self, state: u32, byte: u8) -> crate::region::SideStep {
        use crate::region::SideStep;
        if byte >= CALL_BASE {
            return SideStep::Dead;
        }
        let dfa = self.rules.rule(self.rule);
        match dfa.next(state, byte) {
            DEAD if (self.may_return && dfa.is_accepting(state))
                || self.rules.call_on(self.rule, state, byte).is_some()
                || self.rules.has_marks(self.rule, state) =>
            {
                SideStep::Exit
            }
            DEAD => SideStep::Dead,
            target if self.rules.guarded(self.rule, target) => SideStep::Exit,
            target => SideStep::To(target),
        }
    }

    fn byte_class(&self, byte: u8) -> u32 {
        self.rules.rule(self.rule).byte_class(byte) as u32
            | (self.rules.first_class[byte as usize] as u32) << 8
    }
}

/// Per state of a rule: the calls leaving it, `(callee, return state)`.
type StateCalls = Vec<Box<[(u32, u32)]>>;

/// The rules of a recursive grammar, checked unambiguous.
#[derive(Debug, Clone)]
pub struct Rules {
    dfas: Vec<ByteDfa>,
    /// `first[k][b]`: rule k can begin with byte b.
    first: Vec<[bool; 256]>,
    /// Bytes numbered by the set of rules that can begin with them (equal sets, equal
    /// numbers): what a byte class must tell apart besides a rule's own classes.
    first_class: [u8; 256],
    /// Per rule, per state: the calls leaving that state, `(callee, return state)`.
    calls: Vec<StateCalls>,
    /// The marks of objects whose members come in any order, if any rule has some.
    marks: Option<Box<Marks>>,
}

impl Rules {
    pub fn new(dfas: Vec<ByteDfa>) -> Result<Rules> {
        Self::new_unchecked(dfas)?.checked()
    }

    /// [`Rules::new`] for rules with marks ([`Mark`]); `required[r]`: the sorted name
    /// numbers that `Mark::Close(r)` requires.
    pub(crate) fn with_marks(dfas: Vec<ByteDfa>, required: Vec<Box<[u32]>>) -> Result<Rules> {
        let mut rules = Self::new_unchecked(dfas)?;
        rules.marks = Marks::new(&rules, required)?.map(Box::new);
        rules.checked()
    }

    /// [`Rules::new`] but for the check that the greedy order is safe, for a translator
    /// that checks more itself (`gbnf/check.rs`) before calling [`Rules::checked`].
    pub(crate) fn new_unchecked(dfas: Vec<ByteDfa>) -> Result<Rules> {
        let ambiguous = |message: String| ConstraintError::UnsupportedSchema {
            keyword: format!("recursive grammar: {message}"),
            path: "#".into(),
        };
        if dfas.is_empty() || dfas.len() > MAX_RULES {
            return Err(ambiguous(format!("needs 1 to {MAX_RULES} rules")));
        }
        for (k, dfa) in dfas.iter().enumerate().skip(1) {
            if dfa.is_accepting(dfa.start()) {
                return Err(ambiguous(format!("rule {k} matches the empty string")));
            }
        }
        let calls = dfas.iter().map(|dfa| list_calls(dfa, dfas.len())).collect::<Result<Vec<_>>>()?;
        let marked = dfas.iter().map(list_marks).collect::<Result<Vec<_>>>()?;
        let (dfas, calls) = keep_productive(dfas, calls, &marked)?;
        let first = first_bytes(&dfas, &calls);
        let mut sets: Vec<Vec<bool>> = Vec::new();
        let mut first_class = [0u8; 256];
        for byte in 0..=255usize {
            let set: Vec<bool> = first.iter().map(|f| f[byte]).collect();
            first_class[byte] = match sets.iter().position(|s| *s == set) {
                Some(class) => class as u8,
                None => {
                    sets.push(set);
                    (sets.len() - 1) as u8
                }
            };
        }
        Ok(Rules { dfas, first, first_class, calls, marks: None })
    }

    /// These rules, once checked unambiguous.
    pub(crate) fn checked(self) -> Result<Rules> {
        self.check_unambiguous().map_err(|message| ConstraintError::UnsupportedSchema {
            keyword: format!("recursive grammar: {message}"),
            path: "#".into(),
        })?;
        Ok(self)
    }

    pub(crate) fn num_rules(&self) -> usize {
        self.dfas.len()
    }

    /// `first(k)[b]`: rule k can begin with byte b.
    pub(crate) fn first(&self, rule: u32) -> &[bool; 256] {
        &self.first[rule as usize]
    }

    /// The same rules with another main rule (checked again).
    pub fn with_main(&self, main: ByteDfa) -> Result<Rules> {
        let mut dfas = self.dfas.clone();
        dfas[0] = main;
        match &self.marks {
            None => Rules::new(dfas),
            Some(marks) => Rules::with_marks(dfas, marks.required.clone()),
        }
    }

    /// Whether some rule has marks (objects whose members come in any order).
    #[inline]
    pub(crate) fn marked(&self) -> bool {
        self.marks.is_some()
    }

    /// Whether marks leave `state` of `rule` (bytes it does not read may be read past them).
    #[inline]
    pub(crate) fn has_marks(&self, rule: u32, state: u32) -> bool {
        self.marks.as_ref().is_some_and(|m| !m.from[rule as usize][state as usize].is_empty())
    }

    /// Whether arriving at `state` of `rule` checks the names seen (or takes a mark).
    #[inline]
    pub(crate) fn guarded(&self, rule: u32, state: u32) -> bool {
        self.marks.as_ref().is_some_and(|m| {
            m.guard[rule as usize][state as usize] != 0 || m.eager[rule as usize][state as usize]
        })
    }

    pub fn main(&self) -> &ByteDfa {
        &self.dfas[0]
    }

    pub(crate) fn rule(&self, rule: u32) -> &ByteDfa {
        &self.dfas[rule as usize]
    }

    /// The configuration after `byte`, or `None` if the byte is refused.
    #[inline]
    pub(crate) fn step(&self, config: Config, byte: u8, frames: &mut impl Frames) -> Option<Config> {
        // The common case, small enough to inline into trie walks: the rule reads the
        // byte itself, no marks to check.
        if byte < CALL_BASE && self.marks.is_none() {
            let next = self.dfas[config.rule as usize].next(config.state, byte);
            if next != DEAD {
                return Some(Config { state: next, ..config });
            }
        }
        self.step_slow(config, byte, frames)
    }

    /// [`Rules::step`] past its common case: calls, marks and returns.
    #[inline(never)]
    fn step_slow(&self, mut config: Config, byte: u8, frames: &mut impl Frames) -> Option<Config> {
        if byte >= CALL_BASE {
            return None;
        }
        for _ in 0..MAX_MOVES_PER_BYTE {
            let dfa = &self.dfas[config.rule as usize];
            let next = dfa.next(config.state, byte);
            if next != DEAD {
                let config = Config { state: next, ..config };
                return match &self.marks {
                    None => Some(config),
                    Some(marks) => marks.arrive(config, frames),
                };
            }
            if let Some((callee, ret)) = self.call_on(config.rule, config.state, byte) {
                let frame = frames.push(Frame { rule: config.rule, state: ret, below: config.stack });
                config = Config { rule: callee, state: self.dfas[callee as usize].start(), stack: frame };
                continue;
            }
            if let Some(marks) = &self.marks {
                if let Some(marked) = marks.take_lazily(self, config, byte, frames) {
                    config = marked;
                    continue;
                }
            }
            if dfa.is_accepting(config.state) && config.stack != NO_FRAME {
                let frame = frames.frame(config.stack);
                if frame.rule != SEEN {
                    config = Config { rule: frame.rule, state: frame.state, stack: frame.below };
                    continue;
                }
            }
            return None;
        }
        None
    }

    /// The document may end here: every rule on the stack may end where it stands.
    pub(crate) fn can_end(&self, mut config: Config, frames: &[Frame]) -> bool {
        loop {
            if !self.dfas[config.rule as usize].is_accepting(config.state) {
                return false;
            }
            if config.stack == NO_FRAME {
                return config.rule == 0;
            }
            let frame = frames[config.stack as usize];
            if frame.rule == SEEN {
                return false;
            }
            config = Config { rule: frame.rule, state: frame.state, stack: frame.below };
        }
    }

    /// The calls leaving `state` of `rule`: `(callee, return state)`.
    #[inline]
    pub(crate) fn calls_from(&self, rule: u32, state: u32) -> &[(u32, u32)] {
        &self.calls[rule as usize][state as usize]
    }

    /// A call from `state` of `rule` whose callee can begin with `byte`.
    #[inline]
    pub(crate) fn call_on(&self, rule: u32, state: u32, byte: u8) -> Option<(u32, u32)> {
        self.calls_from(rule, state)
            .iter()
            .copied()
            .find(|&(callee, _)| self.first[callee as usize][byte as usize])
    }

    /// The greedy order is safe when, wherever a call is possible, no other move takes
    /// the same first byte, and after a rule that may end no byte both continues it and
    /// follows the call. (Byte sets are built whole per state: this runs on every
    /// compilation of a recursive grammar.)
    fn check_unambiguous(&self) -> std::result::Result<(), String> {
        self.check_marks()?;
        // Bytes that continue rule k from a state where it may end.
        let continues: Vec<[bool; 256]> = (0..self.dfas.len())
            .map(|k| {
                let dfa = &self.dfas[k];
                let mut bytes = [false; 256];
                for q in (1..dfa.num_states() as u32).filter(|&q| dfa.is_accepting(q)) {
                    for (any, moves) in bytes.iter_mut().zip(self.moves_from(k, q)) {
                        *any |= moves;
                    }
                }
                bytes
            })
            .collect();
        for (rule, dfa) in self.dfas.iter().enumerate() {
            crate::budget::check().map_err(|e| e.to_string())?;
            for state in 1..dfa.num_states() as u32 {
                let calls: Vec<(usize, u32)> =
                    self.calls_from(rule as u32, state).iter().map(|&(k, ret)| (k as usize, ret)).collect();
                for (i, &(k, ret)) in calls.iter().enumerate() {
                    let after_call = self.moves_from(rule, ret);
                    for b in 0..CALL_BASE {
                        let starts = self.first[k][b as usize];
                        if starts && dfa.next(state, b) != DEAD {
                            return Err(format!("rule {rule} state {state}: byte {b:#x} both starts rule {k} and is read directly"));
                        }
                        if starts && calls[i + 1..].iter().any(|&(j, _)| self.first[j][b as usize]) {
                            return Err(format!(
                                "rule {rule} state {state}: two calls start with byte {b:#x}"
                            ));
                        }
                        if continues[k][b as usize] && after_call[b as usize] {
                            return Err(format!(
                                "byte {b:#x} both continues rule {k} and follows it in rule {rule}"
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The text bytes read from `state` of `rule`, directly, by a call, or past marks.
    fn moves_from(&self, rule: usize, state: u32) -> [bool; 256] {
        let mut bytes = self.direct_moves_from(rule, state);
        if let Some(marks) = &self.marks {
            for &(_, target) in marks.from[rule][state as usize].iter() {
                for (any, past) in bytes.iter_mut().zip(self.direct_moves_from(rule, target)) {
                    *any |= past;
                }
            }
        }
        bytes
    }

    /// The text bytes read from `state` of `rule`, directly or by a call.
    fn direct_moves_from(&self, rule: usize, state: u32) -> [bool; 256] {
        let dfa = &self.dfas[rule];
        let mut bytes = [false; 256];
        for b in 0..CALL_BASE {
            bytes[b as usize] = dfa.next(state, b) != DEAD;
        }
        for &(callee, _) in self.calls_from(rule as u32, state) {
            for (any, starts) in bytes.iter_mut().zip(&self.first[callee as usize]) {
                *any |= starts;
            }
        }
        bytes
    }

    /// Whether states `p` and `q` of `rule` have the same future (the same texts,
    /// calls and marks lead from them to the same ends): the union of two objects
    /// closes them at two states that the (unminimized) DFA keeps apart. Gives up, `false`,
    /// past a bound.
    fn equivalent(&self, rule: usize, p: u32, q: u32) -> bool {
        const MAX_PAIRS: usize = 100_000;
        let dfa = &self.dfas[rule];
        let empty: StateMarks = Vec::new();
        let marks = self.marks.as_ref().map_or(&empty, |m| &m.from[rule]);
        let marks_of = |s: u32| marks.get(s as usize).map_or(&[][..], |m| &m[..]);
        let mut seen_class = [false; 256];
        let bytes: Vec<u8> = (0..CALL_BASE)
            .filter(|&b| !std::mem::replace(&mut seen_class[dfa.byte_class(b) as usize], true))
            .collect();
        let mut visited: std::collections::HashSet<(u32, u32)> = std::collections::HashSet::new();
        let mut stack = vec![(p, q)];
        while let Some((a, b)) = stack.pop() {
            if a == b || !visited.insert((a.min(b), a.max(b))) {
                continue;
            }
            if a == DEAD
                || b == DEAD
                || visited.len() > MAX_PAIRS
                || dfa.is_accepting(a) != dfa.is_accepting(b)
            {
                return false;
            }
            let (calls_a, calls_b) = (self.calls_from(rule as u32, a), self.calls_from(rule as u32, b));
            let (marks_a, marks_b) = (marks_of(a), marks_of(b));
            if calls_a.len() != calls_b.len() || marks_a.len() != marks_b.len() {
                return false;
            }
            for (x, y) in calls_a.iter().zip(calls_b) {
                if x.0 != y.0 {
                    return false;
                }
                stack.push((x.1, y.1));
            }
            for (x, y) in marks_a.iter().zip(marks_b) {
                if x.0 != y.0 {
                    return false;
                }
                stack.push((x.1, y.1));
            }
            for &byte in &bytes {
                let (x, y) = (dfa.next(a, byte), dfa.next(b, byte));
                if (x == DEAD) != (y == DEAD) {
                    return false;
                }
                if x != DEAD {
                    stack.push((x, y));
                }
            }
        }
        true
    }

    /// Where marks leave a state, the bytes read past them must not be read from the
    /// state itself, and two marks reading one byte must lead to one state.
    fn check_marks(&self) -> std::result::Result<(), String> {
        let Some(marks) = &self.marks else { return Ok(()) };
        for (rule, states) in marks.from.iter().enumerate() {
            for (state, leaving) in states.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
                let own = self.direct_moves_from(rule, state as u32);
                let mut past: Vec<([bool; 256], u32)> = Vec::new();
                for &(_, target) in leaving.iter() {
                    let bytes = self.direct_moves_from(rule, target);
                    if let Some(byte) = (0..256).find(|&b| own[b] && bytes[b]) {
                        return Err(format!(
                            "rule {rule} state {state}: byte {byte:#x} is read both before and past a mark ({leaving:?})"
                        ));
                    }
                    let overlaps = |(other, at): &([bool; 256], u32)| {
                        *at != target
                            && other.iter().zip(&bytes).any(|(a, b)| *a && *b)
                            && !self.equivalent(rule, *at, target)
                    };
                    if past.iter().any(overlaps) {
                        return Err(format!(
                            "rule {rule} state {state}: two marks lead to different states on one byte"
                        ));
                    }
                    past.push((bytes, target));
                }
            }
        }
        Ok(())
    }
}

/// Which rules can be completed by a finite text: those with a path from the start to
/// an accepting state whose calls all go to such rules (a least fixpoint; a rule that
/// can only go on by calling itself again, such as `{"$ref": "#"}`, never is).
fn productive_rules(dfas: &[ByteDfa], calls: &[StateCalls], marked: &[StateMarks]) -> Result<Vec<bool>> {
    let text_bytes: Vec<Vec<u8>> = dfas
        .iter()
        .map(|dfa| {
            let mut seen = [false; 256];
            (0..CALL_BASE)
                .filter(|&b| !std::mem::replace(&mut seen[dfa.byte_class(b) as usize], true))
                .collect()
        })
        .collect();
    let mut productive = vec![false; dfas.len()];
    loop {
        let mut changed = false;
        for k in 0..dfas.len() {
            if productive[k] {
                continue;
            }
            crate::budget::check()?;
            let dfa = &dfas[k];
            let mut seen = vec![false; dfa.num_states()];
            let mut stack = vec![dfa.start()];
            seen[dfa.start() as usize] = true;
            while let Some(state) = stack.pop() {
                if dfa.is_accepting(state) {
                    productive[k] = true;
                    changed = true;
                    break;
                }
                let by_text = text_bytes[k].iter().map(|&b| dfa.next(state, b));
                let by_call = calls[k][state as usize]
                    .iter()
                    .filter(|&&(callee, _)| productive[callee as usize])
                    .map(|&(_, ret)| ret);
                let by_mark = marked[k][state as usize].iter().map(|&(_, target)| target);
                for next in by_text.chain(by_call).chain(by_mark) {
                    if next != DEAD && !std::mem::replace(&mut seen[next as usize], true) {
                        stack.push(next);
                    }
                }
            }
        }
        if !changed {
            return Ok(productive);
        }
    }
}

/// Refuses rules whose main rule accepts no finite text, and removes from the others
/// every call to a rule that cannot be completed (and the states only such calls kept
/// alive), so that "not dead" keeps meaning "a prefix of some document".
fn keep_productive(
    dfas: Vec<ByteDfa>,
    calls: Vec<StateCalls>,
    marked: &[StateMarks],
) -> Result<(Vec<ByteDfa>, Vec<StateCalls>)> {
    let productive = productive_rules(&dfas, &calls, marked)?;
    if !productive[0] {
        let looping: Vec<String> =
            (1..dfas.len()).filter(|&k| !productive[k]).map(|k| k.to_string()).collect();
        return Err(ConstraintError::InvalidSchema {
            path: "#".into(),
            message: format!(
                "no finite document matches: every way through it recurses without end (grammar rules \
                 [{}] can only be completed by entering themselves again, e.g. a `$ref` cycle whose \
                 members are all required)",
                looping.join(", ")
            ),
        });
    }
    if productive.iter().all(|&p| p) {
        return Ok((dfas, calls));
    }
    let mut pruned = Vec::with_capacity(dfas.len());
    for (k, dfa) in dfas.iter().enumerate() {
        if !productive[k] {
            // Never called any more; kept so that rule numbers stay as they are.
            pruned.push(dfa.clone());
            continue;
        }
        // The last digit of each call to an unproductive rule, from the state before it.
        let mut edges = Vec::new();
        for state in 1..dfa.num_states() as u32 {
            let marked = dfa.next(state, CALL_MARK);
            if marked == DEAD {
                continue;
            }
            for d1 in 0..CALL_DIGITS {
                let t1 = dfa.next(marked, DIGIT_BASE + d1);
                for d2 in (0..CALL_DIGITS).filter(|_| t1 != DEAD) {
                    let t2 = dfa.next(t1, DIGIT_BASE + d2);
                    for d3 in (0..CALL_DIGITS).filter(|_| t2 != DEAD) {
                        let callee = ((d1 * CALL_DIGITS + d2) * CALL_DIGITS + d3) as usize;
                        let byte = DIGIT_BASE + d3;
                        if dfa.next(t2, byte) == DEAD || productive[callee] {
                            continue;
                        }
                        if dfa.class_size(byte) != 1 {
                            return Err(ConstraintError::UnsupportedSchema {
                                keyword:
                                    "recursive grammar: a rule that cannot be completed shares its call \
                                          with others"
                                        .into(),
                                path: "#".into(),
                            });
                        }
                        edges.push((t2, byte));
                    }
                }
            }
        }
        pruned.push(dfa.without_edges(&edges));
    }
    let calls = pruned.iter().map(|dfa| list_calls(dfa, pruned.len())).collect::<Result<Vec<_>>>()?;
    Ok((pruned, calls))
}

/// The calls leaving each state of `dfa`: follow the marker, then every three-digit
/// path. A number past the last rule is an error (only our translators write calls).
fn list_calls(dfa: &ByteDfa, num_rules: usize) -> Result<StateCalls> {
    let mut calls = Vec::with_capacity(dfa.num_states());
    for state in 0..dfa.num_states() as u32 {
        let mut found = Vec::new();
        let marked = if state == DEAD { DEAD } else { dfa.next(state, CALL_MARK) };
        if marked != DEAD {
            let mut paths = vec![(marked, 0usize)];
            for _ in 0..3 {
                paths = paths
                    .into_iter()
                    .flat_map(|(at, number)| {
                        (0..CALL_DIGITS).filter_map(move |d| {
                            let next = dfa.next(at, DIGIT_BASE + d);
                            (next != DEAD).then_some((next, number * CALL_DIGITS as usize + d as usize))
                        })
                    })
                    .collect();
            }
            for (ret, callee) in paths {
                if callee >= num_rules {
                    return Err(ConstraintError::UnsupportedSchema {
                        keyword: format!("recursive grammar: a call to rule {callee} of {num_rules}"),
                        path: "#".into(),
                    });
                }
                found.push((callee as u32, ret));
            }
        }
        calls.push(found.into_boxed_slice());
    }
    Ok(calls)
}

/// `first[k][b]`: rule k can begin with byte b, directly or through calls at its start
/// (a fixpoint, since a rule may begin by calling another).
fn first_bytes(dfas: &[ByteDfa], calls: &[StateCalls]) -> Vec<[bool; 256]> {
    let mut first = vec![[false; 256]; dfas.len()];
    for (k, dfa) in dfas.iter().enumerate() {
        for b in 0..CALL_BASE {
            first[k][b as usize] = dfa.next(dfa.start(), b) != DEAD;
        }
    }
    loop {
        let mut changed = false;
        for (k, dfa) in dfas.iter().enumerate() {
            for &(callee, _) in calls[k][dfa.start() as usize].iter() {
                let callee_first = first[callee as usize];
                for (mine, theirs) in first[k].iter_mut().zip(callee_first) {
                    if theirs && !*mine {
                        *mine = true;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            return first;
        }
    }
}

/// A mark in a rule's text, for objects whose declared members may come in any order,
/// each at most once: spelled [`MARK`] then a five-digit number, read by no text byte,
/// it says what the matcher notes down (in `Config::seen`) or checks when it passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// After an object's `{`: a new scope of names seen.
    Open,
    /// Before the first member: refused unless the scope is empty; notes a member.
    First,
    /// Before the `,` of a member after the first: refused if the scope is empty;
    /// notes a member.
    Next,
    /// After a declared member's name: refused if that name was seen in the scope, else noted.
    Member(u32),
    /// Before an object's `}`: refused unless every name of the `r`-th required set was
    /// seen; ends the scope.
    Close(u32),
}

impl Mark {
    fn number(self) -> usize {
        match self {
            Mark::Open => 0,
            Mark::First => 1,
            Mark::Next => 2,
            Mark::Member(j) => 3 + 2 * j as usize,
            Mark::Close(r) => 4 + 2 * r as usize,
        }
    }

    fn from_number(n: usize) -> Mark {
        match n {
            0 => Mark::Open,
            1 => Mark::First,
            2 => Mark::Next,
            n if n % 2 == 1 => Mark::Member((n / 2 - 1) as u32),
            n => Mark::Close((n / 2 - 2) as u32),
        }
    }

    /// The largest name or required-set number a mark can carry.
    pub(crate) const LIMIT: usize = MAX_MARK_NUMBER / 2 - 3;
}

/// The mark as regex syntax.
pub(crate) fn mark(m: Mark) -> String {
    let n = m.number();
    debug_assert!(n < MAX_MARK_NUMBER);
    let mut out = format!(r"(?-u:\x{MARK:02X}");
    for place in (0..MARK_DIGITS as u32).rev() {
        let digit = DIGIT_BASE as usize + (n / 7usize.pow(place)) % 7;
        out.push_str(&format!(r"\x{digit:02X}"));
    }
    out.push(')');
    out
}

/// Per state of a rule: the marks leaving it, with the state after each.
type StateMarks = Vec<Box<[(Mark, u32)]>>;

/// The marks leaving each state of `dfa`.
fn list_marks(dfa: &ByteDfa) -> Result<StateMarks> {
    let mut out = Vec::with_capacity(dfa.num_states());
    for state in 0..dfa.num_states() as u32 {
        let marked = if state == DEAD { DEAD } else { dfa.next(state, MARK) };
        if marked == DEAD {
            out.push(Box::default());
            continue;
        }
        let mut paths = vec![(marked, 0usize)];
        for _ in 0..MARK_DIGITS {
            paths = paths
                .into_iter()
                .flat_map(|(at, number)| {
                    (0..CALL_DIGITS).filter_map(move |d| {
                        let next = dfa.next(at, DIGIT_BASE + d);
                        (next != DEAD).then_some((next, number * 7 + d as usize))
                    })
                })
                .collect();
        }
        out.push(paths.into_iter().map(|(target, n)| (Mark::from_number(n), target)).collect());
    }
    Ok(out)
}

/// What the matcher needs of the marks of a grammar's rules.
#[derive(Debug, Clone)]
pub(crate) struct Marks {
    /// Per rule, per state: the marks leaving it.
    from: Vec<StateMarks>,
    /// Per rule, per state: 0, or 1 + the index in `guard_sets` of the member names
    /// every way on from the state must note (the state lies inside member names):
    /// arriving there is refused when all of them were seen.
    guard: Vec<Vec<u32>>,
    guard_sets: Vec<Box<[u32]>>,
    /// Per rule, per state: only one mark leaves it (no text, no call, no end): it is
    /// taken on arrival.
    eager: Vec<Vec<bool>>,
    /// Per required-set number: the sorted name numbers.
    required: Vec<Box<[u32]>>,
}

impl Marks {
    fn new(rules: &Rules, required: Vec<Box<[u32]>>) -> Result<Option<Marks>> {
        let from = rules.dfas.iter().map(list_marks).collect::<Result<Vec<_>>>()?;
        if from.iter().all(|states| states.iter().all(|m| m.is_empty())) {
            return Ok(None);
        }
        let bad = |message: String| ConstraintError::UnsupportedSchema {
            keyword: format!("recursive grammar: {message}"),
            path: "#".into(),
        };
        for states in &from {
            for &(mark, _) in states.iter().flat_map(|m| m.iter()) {
                if let Mark::Close(r) = mark {
                    if r as usize >= required.len() {
                        return Err(bad(format!("a mark names required set {r} of {}", required.len())));
                    }
                }
            }
        }
        // A call is a way on that notes no name unless its callee's start notes one
        // (a rule of members shared between places); found again until no callee
        // start changes.
        let mut start_names: Vec<Option<Box<[u32]>>> = vec![None; rules.dfas.len()];
        let mut rounds = 0;
        let guards = loop {
            let guards = rules
                .dfas
                .iter()
                .enumerate()
                .map(|(k, dfa)| rule_guards(rules, k, dfa, &from[k], &start_names))
                .collect::<Result<Vec<_>>>()?;
            let starts: Vec<Option<Box<[u32]>>> =
                guards.iter().zip(&rules.dfas).map(|(g, dfa)| g[dfa.start() as usize].clone()).collect();
            rounds += 1;
            if starts == start_names || rounds > rules.dfas.len() + 1 {
                break guards;
            }
            start_names = starts;
        };
        let mut guard = Vec::with_capacity(from.len());
        let mut eager = Vec::with_capacity(from.len());
        let mut guard_sets: Vec<Box<[u32]>> = Vec::new();
        let mut set_ids: HashMap<Box<[u32]>, u32> = HashMap::new();
        for (k, (dfa, names)) in rules.dfas.iter().zip(guards).enumerate() {
            let rule_guard = names
                .into_iter()
                .map(|names| match names {
                    None => 0,
                    Some(names) => *set_ids.entry(names.clone()).or_insert_with(|| {
                        guard_sets.push(names);
                        guard_sets.len() as u32
                    }),
                })
                .collect();
            let marks = &from[k];
            let rule_eager = (0..dfa.num_states() as u32)
                .map(|state| {
                    state != DEAD
                        && marks[state as usize].len() == 1
                        && !dfa.is_accepting(state)
                        && rules.calls_from(k as u32, state).is_empty()
                        && (0..CALL_BASE).all(|b| dfa.next(state, b) == DEAD)
                })
                .collect();
            guard.push(rule_guard);
            eager.push(rule_eager);
        }
        Ok(Some(Marks { from, guard, guard_sets, eager, required }))
    }

    /// `config` having just read a byte into its state: refused where every name ahead
    /// was seen; a mark that alone leaves the state is taken.
    #[inline(never)]
    fn arrive(&self, mut config: Config, frames: &mut impl Frames) -> Option<Config> {
        for _ in 0..8 {
            let (rule, state) = (config.rule as usize, config.state as usize);
            let guard = self.guard[rule][state];
            if guard != 0
                && self.guard_sets[guard as usize - 1].iter().all(|&j| seen_in_scope(config.stack, j, frames))
            {
                return None;
            }
            if !self.eager[rule][state] {
                return Some(config);
            }
            let (mark, target) = self.from[rule][state][0];
            config = self.apply(mark, config, frames)?;
            config.state = target;
        }
        Some(config)
    }

    /// A mark from `config`'s state after which `byte` can be read, taken.
    #[cold]
    #[inline(never)]
    fn take_lazily(
        &self,
        rules: &Rules,
        config: Config,
        byte: u8,
        frames: &mut impl Frames,
    ) -> Option<Config> {
        let leaving = &self.from[config.rule as usize][config.state as usize];
        for &(mark, target) in leaving.iter() {
            let reads = rules.dfas[config.rule as usize].next(target, byte) != DEAD
                || rules.call_on(config.rule, target, byte).is_some();
            if !reads {
                continue;
            }
            if let Some(applied) = self.apply(mark, config, frames) {
                return Some(Config { state: target, ..applied });
            }
        }
        None
    }

    fn apply(&self, mark: Mark, config: Config, frames: &mut impl Frames) -> Option<Config> {
        match mark {
            Mark::Open => {
                let stack = frames.push(Frame { rule: SEEN, state: SCOPE, below: config.stack });
                Some(Config { stack, ..config })
            }
            Mark::First | Mark::Next => {
                let top = (config.stack != NO_FRAME).then(|| frames.frame(config.stack));
                let empty = top.is_none_or(|top| top.rule != SEEN || top.state == SCOPE);
                if empty != (mark == Mark::First) {
                    return None;
                }
                let stack = frames.push(Frame { rule: SEEN, state: ITEM, below: config.stack });
                Some(Config { stack, ..config })
            }
            Mark::Member(j) => {
                if seen_in_scope(config.stack, j, frames) {
                    return None;
                }
                let stack = frames.push(Frame { rule: SEEN, state: j, below: config.stack });
                Some(Config { stack, ..config })
            }
            Mark::Close(r) => {
                let required = &self.required[r as usize];
                let (mut index, mut found) = (config.stack, 0usize);
                while index != NO_FRAME {
                    let frame = frames.frame(index);
                    if frame.rule != SEEN {
                        return None;
                    }
                    if frame.state == SCOPE {
                        return (found == required.len()).then_some(Config { stack: frame.below, ..config });
                    }
                    found += usize::from(required.binary_search(&frame.state).is_ok());
                    index = frame.below;
                }
                None
            }
        }
    }
}

/// Per state of rule `k`: `None` where some way on notes no member name (it ends,
/// calls a rule whose start notes none, opens or closes an object), else the member
/// names every way on notes first (names of a callee's start included).
fn rule_guards(
    rules: &Rules,
    k: usize,
    dfa: &ByteDfa,
    marks: &StateMarks,
    start_names: &[Option<Box<[u32]>>],
) -> Result<Vec<Option<Box<[u32]>>>> {
    crate::budget::check()?;
    let n = dfa.num_states();
    let mut seen_class = [false; 256];
    let bytes: Vec<u8> = (0..CALL_BASE)
        .filter(|&b| !std::mem::replace(&mut seen_class[dfa.byte_class(b) as usize], true))
        .collect();
    let calls = |state: u32| rules.calls_from(k as u32, state);
    let mut free = vec![false; n];
    let mut predecessors: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut stack = Vec::new();
    for state in 1..n as u32 {
        for &b in &bytes {
            let next = dfa.next(state, b);
            if next != DEAD {
                predecessors[next as usize].push(state);
            }
        }
        let exits = dfa.is_accepting(state)
            || calls(state).iter().any(|&(callee, _)| start_names[callee as usize].is_none())
            || marks[state as usize].iter().any(|(m, _)| !matches!(m, Mark::Member(_)));
        if exits {
            free[state as usize] = true;
            stack.push(state);
        }
    }
    while let Some(state) = stack.pop() {
        for &p in &predecessors[state as usize] {
            if !std::mem::replace(&mut free[p as usize], true) {
                stack.push(p);
            }
        }
    }
    let mut out = vec![None; n];
    let mut visited = vec![u32::MAX; n];
    for state in 1..n as u32 {
        if free[state as usize] {
            continue;
        }
        let mut names = Vec::new();
        let mut stack = vec![state];
        visited[state as usize] = state;
        while let Some(at) = stack.pop() {
            names.extend(marks[at as usize].iter().filter_map(|(m, _)| match m {
                Mark::Member(j) => Some(*j),
                _ => None,
            }));
            for &(callee, _) in calls(at) {
                names.extend(start_names[callee as usize].iter().flat_map(|s| s.iter().copied()));
            }
            for &b in &bytes {
                let next = dfa.next(at, b);
                if next != DEAD && std::mem::replace(&mut visited[next as usize], state) != state {
                    stack.push(next);
                }
            }
        }
        names.sort_unstable();
        names.dedup();
        out[state as usize] = Some(names.into());
    }
    Ok(out)
}

/// Whether name `j` was seen in the innermost open scope of the stack at `seen`.
#[inline]
fn seen_in_scope(mut seen: u32, j: u32, frames: &impl Frames) -> bool {
    while seen != NO_FRAME {
        let frame = frames.frame(seen);
        if frame.rule != SEEN || frame.state == SCOPE {
            return false;
        }
        if frame.state == j {
            return true;
        }
        seen = frame.below;
    }
    false
}

/// How the errors of rules the greedy order cannot run begin (`Rules::new`).
pub(crate) const AMBIGUOUS_RULES: &str = "recursive grammar:";

/// The bytes that spell a call to rule `k`.
pub(crate) fn call_bytes(k: usize) -> [u8; 4] {
    debug_assert!(k < MAX_RULES);
    let digit = |place: usize| DIGIT_BASE + ((k / place) % CALL_DIGITS as usize) as u8;
    [CALL_MARK, digit(49), digit(7), digit(1)]
}

/// The call to rule `k` as regex syntax.
pub(crate) fn call(k: usize) -> String {
    debug_assert!(k < MAX_RULES);
    let digit = |place: usize| DIGIT_BASE as usize + (k / place) % CALL_DIGITS as usize;
    format!(r"(?-u:\x{CALL_MARK:02X}\x{:02X}\x{:02X}\x{:02X})", digit(49), digit(7), digit(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dfa::RegexOptions;

    fn rules(patterns: &[&str]) -> Result<Rules> {
        let options = RegexOptions::default();
        Rules::new(patterns.iter().map(|p| ByteDfa::from_regex_with_calls(p, &options).unwrap()).collect())
    }

    fn accepts(rules: &Rules, text: &str) -> bool {
        let mut frames = Vec::new();
        let mut config = Config { rule: 0, state: rules.main().start(), stack: NO_FRAME };
        for &b in text.as_bytes() {
            match rules.step(config, b, &mut frames) {
                Some(next) => config = next,
                None => return false,
            }
        }
        rules.can_end(config, &frames)
    }

    #[test]
    fn nested_brackets() {
        // Rule 1: a balanced list of `a`s, e.g. [a,[a,[]]].
        let list = format!(r"\[(?:(?:a|{c})(?:,(?:a|{c}))*)?\]", c = call(1));
        let rules = rules(&[&call(1), &list]).unwrap();
        for ok in ["[]", "[a]", "[a,[a,[]]]", "[[[[]]]]"] {
            assert!(accepts(&rules, ok), "{ok}");
        }
        for bad in ["", "[", "[a,]", "[[]", "[]]", "a"] {
            assert!(!accepts(&rules, bad), "{bad}");
        }
    }

    #[test]
    fn ambiguous_rules_are_refused() {
        let digits = "[0-9]+";
        // After a number, a digit could continue it or follow it.
        assert!(rules(&[&format!("{}1", call(1)), digits]).is_err());
        // A digit could be read directly or start the called rule.
        assert!(rules(&[&format!("{}|1", call(1)), digits]).is_err());
        assert!(rules(&[&format!("{},", call(1)), digits]).is_ok());
        // A called rule must not match the empty string.
        assert!(rules(&[&call(1), "[0-9]*"]).is_err());
    }
}
