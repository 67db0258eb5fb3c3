//! Regex text -> Thompson NFA in one pass, for the syntax our translators write. The
//! general route (text -> HIR -> regex-automata's compiler) builds a tree of boxed
//! nodes, walks it and frees it, and compiles every Unicode class through a UTF-8
//! automaton builder with its own hash map: on JSON Schemas (hundreds of kB of regex,
//! the string-character class `[^"\\\x00-\x1f]` written once per string and repeated
//! under every count) those steps took about half of the compile time. Here the NFA
//! states are written into the subset construction's flat NFA (`subset::Nfa`) as the
//! text is read (regex-automata's NFA builder, used before, copied every state once
//! more into its final NFA and boxed each sparse and union state), and the UTF-8
//! automaton of a class is planned once per distinct class text and stamped out at each
//! occurrence (suffixes shared, as regex-automata's compiler shares them). A character
//! or a single byte range is its own exit (no empty state after it).
//!
//! The subset read is `parse.rs`'s (literals and escapes, bracket classes, `(?:` and
//! `(?-u:` groups, `|`, greedy `* + ? {n} {n,} {n,m}`); anything else gives `None` and
//! the caller goes through regex-syntax, which also gives the errors. A counted
//! repetition is compiled by reading its operand's text again once per copy, as the
//! compiler compiles the operand's HIR once per copy (an operand that matches only the
//! empty string at most once, as regex-syntax simplifies it; an operand repeated zero
//! times, built before its count was read, is closed with a fail state, as an open exit
//! points at state 0). The tests check, on every regex of the corpus schemas and on random regexes of
//! the subset, that the automaton's language is regex-syntax's.

use regex_syntax::hir::Class;
use regex_syntax::utf8::Utf8Sequences;

use super::parse::{Literal, Parser};
use super::subset::{Nfa, NfaTooLarge};
use crate::error::ConstraintError;

/// The NFA of `pattern` followed by `\z` (anchored; no capture states), as
/// regex-syntax's parser (its `utf8` option, nesting limit `nest_limit`) and
/// regex-automata's compiler would give it up to the states' shapes; `None` if
/// `pattern` is outside the subset read here. `Some(Err)` when the NFA exceeds
/// `size_limit` bytes ([`Stop::TooLarge`]) or the compilation's
/// budget stops it ([`Stop::Budget`]: checked at every copy of a repeated operand, the
/// one place where the states built are not proportional to the text read).
pub(super) fn compile(
    pattern: &str,
    utf8: bool,
    nest_limit: u32,
    size_limit: usize,
) -> Option<Result<Nfa, Stop>> {
    let mut direct = Direct {
        parser: Parser { text: pattern.as_bytes(), pos: 0, utf8, unicode: true },
        nfa: Nfa::with_capacity(Some(size_limit), pattern.len() + 8),
        depth: 0,
        nest_limit,
        plans: Vec::new(),
        ids: Vec::new(),
    };
    match direct.whole() {
        Ok(()) => Some(Ok(direct.nfa)),
        Err(Fail::Stop(stop)) => Some(Err(stop)),
        Err(Fail::Syntax) => None,
    }
}

/// Why the direct read stopped with an error.
#[derive(Debug)]
pub(super) enum Stop {
    /// The NFA grew past its size limit.
    TooLarge,
    /// The compilation's budget (it was cancelled).
    Budget(ConstraintError),
}

enum Fail {
    /// Outside the subset (or an error regex-syntax reports).
    Syntax,
    Stop(Stop),
}

impl From<NfaTooLarge> for Fail {
    fn from(_: NfaTooLarge) -> Self {
        Fail::Stop(Stop::TooLarge)
    }
}

type R<T> = std::result::Result<T, Fail>;

/// A piece of NFA: its entry and its exit (an `Empty` or `Union` state, patched to what
/// follows), whether it matches the empty string and whether it matches nothing else.
#[derive(Clone, Copy)]
struct Frag {
    start: u32,
    end: u32,
    nullable: bool,
    only_empty: bool,
}

impl Frag {
    /// Of a piece that matches one character or byte.
    fn one(start: u32, end: u32) -> Self {
        Frag { start, end, nullable: false, only_empty: false }
    }

    /// `self` then `next` (already patched together).
    fn then(self, next: Frag) -> Self {
        Frag {
            start: self.start,
            end: next.end,
            nullable: self.nullable && next.nullable,
            only_empty: self.only_empty && next.only_empty,
        }
    }
}

/// The automaton of one class (for a Unicode class, of its UTF-8 encodings),
/// independent of state ids.
struct Plan {
    /// The class's text, from `[` to its closing `]`, and the Unicode flag it was read under.
    text: Box<[u8]>,
    /// Suffix states: byte range and the suffix state it leads to (`None`: the exit).
    /// A state's target comes before it.
    suffixes: Vec<(u8, u8, Option<usize>)>,
    /// The first byte's ranges and the suffix state each leads to.
    leads: Vec<(u8, u8, Option<usize>)>,
    /// The leading ranges do not overlap (one sparse state; else a union of ranges).
    disjoint: bool,
}

/// Plans kept per pattern (JSON Schema regexes use a few distinct classes).
const MAX_PLANS: usize = 32;

struct Direct<'a> {
    parser: Parser<'a>,
    nfa: Nfa,
    depth: usize,
    nest_limit: u32,
    plans: Vec<Plan>,
    /// Scratch: the suffix states of the class being stamped.
    ids: Vec<u32>,
}

impl Direct<'_> {
    fn whole(&mut self) -> R<()> {
        let frag = self.alternation()?;
        if self.parser.peek().is_some() {
            return Err(Fail::Syntax); // an unopened `)`
        }
        let matched = self.nfa.add_match()?;
        let end = self.nfa.add_end(matched)?;
        self.nfa.patch(frag.end, end)?;
        self.nfa.set_start(frag.start);
        Ok(())
    }

    fn patch(&mut self, from: u32, to: u32) -> R<()> {
        Ok(self.nfa.patch(from, to)?)
    }

    fn empty(&mut self) -> R<Frag> {
        let id = self.nfa.add_empty()?;
        Ok(Frag { start: id, end: id, nullable: true, only_empty: true })
    }

    /// Branches separated by `|`, up to a `)` or the end.
    fn alternation(&mut self) -> R<Frag> {
        let first = self.concat()?;
        if self.parser.peek() != Some(b'|') {
            return Ok(first);
        }
        let union = self.nfa.add_union(&[])?;
        let end = self.nfa.add_empty()?;
        self.patch(union, first.start)?;
        self.patch(first.end, end)?;
        let (mut nullable, mut only_empty) = (first.nullable, first.only_empty);
        while self.parser.eat(b"|") {
            let branch = self.concat()?;
            self.patch(union, branch.start)?;
            self.patch(branch.end, end)?;
            nullable |= branch.nullable;
            only_empty &= branch.only_empty;
        }
        Ok(Frag { start: union, end, nullable, only_empty })
    }

    fn concat(&mut self) -> R<Frag> {
        let mut whole: Option<Frag> = None;
        loop {
            if matches!(self.parser.peek(), None | Some(b'|' | b')')) {
                break;
            }
            let (atom_pos, atom_unicode) = (self.parser.pos, self.parser.unicode);
            let mut frag = self.atom()?;
            if matches!(self.parser.peek(), Some(b'*' | b'+' | b'?' | b'{')) {
                let (min, max) = self.parser.repetition().ok_or(Fail::Syntax)?;
                if matches!(self.parser.peek(), Some(b'*' | b'+' | b'?' | b'{')) {
                    return Err(Fail::Syntax); // lazy, or a repetition of a repetition
                }
                let after = self.parser.pos;
                frag = self.repeat(frag, (atom_pos, atom_unicode), min, max)?;
                self.parser.pos = after;
            }
            whole = Some(match whole {
                None => frag,
                Some(w) => {
                    self.patch(w.end, frag.start)?;
                    w.then(frag)
                }
            });
        }
        match whole {
            Some(w) => Ok(w),
            None => self.empty(),
        }
    }

    /// The atom read at `at` (position and Unicode flag) once more: another copy.
    fn atom_again(&mut self, at: (usize, bool)) -> R<Frag> {
        // A copy of a copy of ... : the time is the product of the counts, not the text's
        // length; the cancel flag of a compilation past its time limit is seen here.
        crate::budget::check().map_err(|e| Fail::Stop(Stop::Budget(e)))?;
        let unicode = self.parser.unicode;
        (self.parser.pos, self.parser.unicode) = at;
        let frag = self.atom();
        self.parser.unicode = unicode;
        frag
    }

    /// `first` (the atom at `at`) repeated `min` to `max` times, built as
    /// regex-automata's compiler builds repetitions.
    fn repeat(&mut self, first: Frag, at: (usize, bool), min: u32, max: Option<u32>) -> R<Frag> {
        // As regex-syntax's `Hir::repetition`: an operand that matches only the empty
        // string is taken at most once (`(?:){1000}{1000}` is one empty state, not a
        // million).
        let (min, max) = match first.only_empty {
            true => (min.min(1), Some(max.map_or(1, |max| max.min(1)))),
            false => (min, max),
        };
        let mut spare = Some(first);
        let mut copy = |this: &mut Self| -> R<Frag> {
            match spare.take() {
                Some(frag) => Ok(frag),
                None => this.atom_again(at),
            }
        };
        let exactly = |this: &mut Self, n: u32, copy: &mut dyn FnMut(&mut Self) -> R<Frag>| -> R<Frag> {
            let mut whole: Option<Frag> = None;
            for _ in 0..n {
                let next = copy(this)?;
                whole = Some(match whole {
                    None => next,
                    Some(w) => {
                        this.patch(w.end, next.start)?;
                        w.then(next)
                    }
                });
            }
            match whole {
                Some(w) => Ok(w),
                None => this.empty(),
            }
        };
        match (min, max) {
            (_, Some(0)) => {
                // The operand was built when it was read, before its count was seen, and no
                // copy of it is used. Its open end is closed with a fail state rather than
                // left pointing at state 0 (a new state's target; with regex-automata's
                // builder, used before, a loop of empty states through state 0 hung its
                // removal of empty states). Nothing reaches it.
                let fail = self.nfa.add_fail()?;
                self.patch(first.end, fail)?;
                self.empty()
            }
            (0, None) if !first.nullable => {
                let sub = copy(self)?;
                let union = self.nfa.add_union(&[sub.start])?;
                self.patch(sub.end, union)?;
                Ok(Frag { start: union, end: union, nullable: true, only_empty: false })
            }
            (0, None) => {
                // (x+)?, as the compiler writes x* when x matches the empty string.
                let sub = copy(self)?;
                let plus = self.nfa.add_union(&[sub.start])?;
                self.patch(sub.end, plus)?;
                let end = self.nfa.add_empty()?;
                let question = self.nfa.add_union(&[sub.start, end])?;
                self.patch(plus, end)?;
                Ok(Frag { start: question, end, nullable: true, only_empty: false })
            }
            (n, None) => {
                let prefix = exactly(self, n - 1, &mut copy)?;
                let last = copy(self)?;
                self.patch(prefix.end, last.start)?;
                let union = self.nfa.add_union(&[last.start])?;
                self.patch(last.end, union)?;
                Ok(Frag { end: union, ..prefix.then(last) })
            }
            (min, Some(max)) => {
                let prefix = exactly(self, min, &mut copy)?;
                if min == max {
                    return Ok(prefix);
                }
                let end = self.nfa.add_empty()?;
                let mut prev_end = prefix.end;
                for _ in min..max {
                    let sub = copy(self)?;
                    let union = self.nfa.add_union(&[sub.start, end])?;
                    self.patch(prev_end, union)?;
                    prev_end = sub.end;
                }
                self.patch(prev_end, end)?;
                Ok(Frag { start: prefix.start, end, nullable: prefix.nullable, only_empty: first.only_empty })
            }
        }
    }

    fn atom(&mut self) -> R<Frag> {
        match self.parser.peek().ok_or(Fail::Syntax)? {
            b'(' => {
                let unicode = if self.parser.eat(b"(?:") {
                    self.parser.unicode
                } else if self.parser.eat(b"(?-u:") {
                    false
                } else {
                    return Err(Fail::Syntax); // captures, other flags
                };
                self.depth += 1;
                // As `parse.rs`: regex-syntax's count of levels.
                if 4 * self.depth + 6 > self.nest_limit as usize {
                    return Err(Fail::Syntax);
                }
                let outside = std::mem::replace(&mut self.parser.unicode, unicode);
                let inner = self.alternation()?;
                if !self.parser.eat(b")") {
                    return Err(Fail::Syntax);
                }
                self.parser.unicode = outside;
                self.depth -= 1;
                Ok(inner)
            }
            b'[' => self.class(),
            b'\\' => match self.parser.escape().ok_or(Fail::Syntax)? {
                Literal::Char(c) => self.char(c),
                Literal::Byte(byte) => self.bytes(&[(byte, byte)]),
            },
            b'.' | b'^' | b'$' | b']' | b'}' | b'*' | b'+' | b'?' | b'{' => Err(Fail::Syntax),
            _ => {
                let c = self.parser.char().ok_or(Fail::Syntax)?;
                self.char(c)
            }
        }
    }

    /// One character: its UTF-8 bytes in a row (the last byte's state is the exit).
    fn char(&mut self, c: char) -> R<Frag> {
        let mut buffer = [0u8; 4];
        let bytes = c.encode_utf8(&mut buffer).as_bytes();
        let (&last, before) = bytes.split_last().expect("a character has a byte");
        let end = self.nfa.add_range(last, last, 0)?;
        let mut next = end;
        for &b in before.iter().rev() {
            next = self.nfa.add_range(b, b, next)?;
        }
        Ok(Frag::one(next, end))
    }

    /// One byte out of `ranges` (sorted, disjoint): one state.
    fn bytes(&mut self, ranges: &[(u8, u8)]) -> R<Frag> {
        if let [(start, stop)] = *ranges {
            let one = self.nfa.add_range(start, stop, 0)?;
            return Ok(Frag::one(one, one));
        }
        let end = self.nfa.add_empty()?;
        let start = self.nfa.add_sparse(ranges.iter().map(|&(start, stop)| (start, stop, end)))?;
        Ok(Frag::one(start, end))
    }

    fn class(&mut self) -> R<Frag> {
        let start_pos = self.parser.pos;
        let unicode = self.parser.unicode;
        // A class seen before in this pattern: its plan, without reading it again.
        let rest = &self.parser.text[start_pos..];
        let seen =
            self.plans.iter().rposition(|p| p.text[0] == unicode as u8 && rest.starts_with(&p.text[1..]));
        let index = match seen {
            Some(index) => {
                self.parser.pos += self.plans[index].text.len() - 1;
                index
            }
            None => {
                let class = self.parser.class().ok_or(Fail::Syntax)?;
                let mut text = vec![unicode as u8];
                text.extend_from_slice(&self.parser.text[start_pos..self.parser.pos]);
                let plan = plan(&class, text.into_boxed_slice());
                if self.plans.len() == MAX_PLANS {
                    self.plans.remove(0);
                }
                self.plans.push(plan);
                self.plans.len() - 1
            }
        };
        self.stamp(index)
    }

    /// The states of plan `index`.
    fn stamp(&mut self, index: usize) -> R<Frag> {
        let plan = &self.plans[index];
        let end = self.nfa.add_empty()?;
        self.ids.clear();
        let target = |ids: &[u32], next: Option<usize>| next.map_or(end, |i| ids[i]);
        for &(start, stop, next) in &plan.suffixes {
            let next = target(&self.ids, next);
            self.ids.push(self.nfa.add_range(start, stop, next)?);
        }
        let ids = &self.ids;
        let leads = plan.leads.iter().map(|&(start, stop, next)| (start, stop, target(ids, next)));
        let start = if plan.disjoint {
            self.nfa.add_sparse(leads)?
        } else {
            let first = self.nfa.len() as u32;
            for (start, stop, next) in leads {
                self.nfa.add_range(start, stop, next)?;
            }
            let last = self.nfa.len() as u32;
            let union = self.nfa.add_union(&[])?;
            for alternate in first..last {
                self.nfa.patch(union, alternate)?;
            }
            union
        };
        Ok(Frag::one(start, end))
    }
}

/// The automaton of `class`; for a Unicode class, its UTF-8 byte sequences with common suffixes shared (a
/// trie of the sequences read backwards), so that bytes still to come of the same kind
/// (two continuation bytes, ...) are one state whatever came before.
fn plan(class: &Class, text: Box<[u8]>) -> Plan {
    let mut suffixes: Vec<(u8, u8, Option<usize>)> = Vec::new();
    let mut leads: Vec<(u8, u8, Option<usize>)> = Vec::new();
    let class = match class {
        Class::Bytes(class) => {
            leads.extend(class.iter().map(|r| (r.start(), r.end(), None)));
            return Plan { text, suffixes, leads, disjoint: true };
        }
        Class::Unicode(class) => class,
    };
    for range in class.iter() {
        for sequence in Utf8Sequences::new(range.start(), range.end()) {
            let ranges = sequence.as_slice();
            let mut next = None;
            for r in ranges[1..].iter().rev() {
                let key = (r.start, r.end, next);
                next = Some(match suffixes.iter().position(|s| *s == key) {
                    Some(i) => i,
                    None => {
                        suffixes.push(key);
                        suffixes.len() - 1
                    }
                });
            }
            leads.push((ranges[0].start, ranges[0].end, next));
        }
    }
    leads.sort_unstable();
    let disjoint = leads.windows(2).all(|w| w[0].1 < w[1].0);
    Plan { text, suffixes, leads, disjoint }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dfa::{ByteDfa, RegexOptions, DEAD};

    /// Whether two DFAs accept the same strings (a walk over pairs of states).
    fn same_language(a: &ByteDfa, b: &ByteDfa) -> bool {
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![(a.start(), b.start())];
        while let Some((x, y)) = stack.pop() {
            if !seen.insert((x, y)) {
                continue;
            }
            if (x == DEAD) != (y == DEAD) || (x != DEAD && a.is_accepting(x) != b.is_accepting(y)) {
                return false;
            }
            if x == DEAD {
                continue;
            }
            for byte in 0..=255u8 {
                stack.push((a.next(x, byte), b.next(y, byte)));
            }
        }
        true
    }

    fn both(pattern: &str, allow_calls: bool) -> (Option<ByteDfa>, ByteDfa) {
        let options = RegexOptions::default();
        let direct = ByteDfa::build_with_route(pattern, &options, allow_calls, true);
        let general =
            ByteDfa::build_with_route(pattern, &options, allow_calls, false).expect("regex-syntax reads it");
        (direct.ok(), general)
    }

    #[test]
    fn reads_the_generated_syntax_with_regex_syntax_language() {
        let patterns = [
            r#""(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*""#,
            r#""(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}){2,7}""#,
            r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?",
            r#"\{(?:"a":(?:true|false)(?:,"b":[0-9]{1,3})?)?\}"#,
            r"abc*d+e?f{2}g{2,}h{2,5}(?:ij){0}k{1}",
            r"a(?:)b|(?:c|)|",
            r"(?:a?)*(?:b?)+(?:c|){2,}(?:d?){1,3}x",
            r"[a-c]|[x]|q|\x41|\x{263A}|é|[é-ë]|\n\t\r\f\v|\.\*\-\#\&\~\/\:",
            r"[-a][a-][^-a][+-][\]\\\-\x00-\x1f\x7f]",
            r#"[\x20-\x7f--["\\e]]|[^a-z--[aeiou]]|[a-z--[^b-y]]"#,
            r"[\x{1000}-\x{1010}\x{1020}-\x{1030}]+|[^\x{80}-\x{10FFFF}]|[\x{10000}-\x{10FFFF}]{2}",
            r"(?:a|b|c)",
            r"[ \t\n\r]{0,20}",
            "(?:ab|ac|ad)(?:x|xy)",
            "é{3}(?:[^é]é){1,2}",
            "",
        ];
        for pattern in patterns {
            let (direct, general) = both(pattern, false);
            let direct = direct.unwrap_or_else(|| panic!("{pattern} is in the subset"));
            assert!(same_language(&direct, &general), "{pattern}");
        }
        for pattern in
            [r"a(?-u:\xFF\xF8\xF9\xFA)b", r"(?-u:[\x00-\x7f]|\xFE)", r"(?-u:\x41\xF8+)", r"(?-u:[^a])+"]
        {
            let (direct, general) = both(pattern, true);
            assert!(same_language(&direct.expect("in the subset"), &general), "{pattern}");
        }
    }

    #[test]
    fn leaves_other_syntax_and_errors_to_regex_syntax() {
        let extra = [r"(?-u:\xFF)", r"(?-u:[^a])"];
        for pattern in crate::dfa::parse::OTHER_SYNTAX.iter().chain(&extra) {
            assert!(compile(pattern, true, 1024, 1 << 20).is_none(), "{pattern}");
        }
        let nested = |depth: usize| format!("{}a{}", "(?:b|".repeat(depth), ")".repeat(depth));
        assert!(compile(&nested(100), true, 1024, 1 << 20).is_some());
        assert!(compile(&nested(600), true, 1024, 1 << 20).is_none());
    }

    #[test]
    fn a_size_limit_is_an_error() {
        let result = compile("[a-z]{1,500}x[a-z]{200}", true, 1024, 10_000);
        assert!(matches!(result, Some(Err(Stop::TooLarge))));
    }

    /// `f`'s result, or a panic naming `what` if it takes longer than `seconds` (the
    /// thread is left behind: the test fails rather than hangs).
    fn within<T: Send + 'static>(what: &str, seconds: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
        use std::sync::mpsc::{channel, RecvTimeoutError};
        let (send, receive) = channel();
        std::thread::spawn(move || send.send(f()));
        match receive.recv_timeout(std::time::Duration::from_secs(seconds)) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => panic!("{what}: no result in {seconds} s"),
            Err(RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
        }
    }

    /// Both routes build `pattern` within a few seconds, to the same language.
    fn same_as_general(pattern: &str) {
        let owned = pattern.to_string();
        let (direct, general) = within(pattern, 20, move || both(&owned, false));
        let direct = direct.unwrap_or_else(|| panic!("{pattern} is in the subset"));
        assert!(same_language(&direct, &general), "{pattern}");
    }

    /// An operand repeated zero times was built and left open: its end pointed at state
    /// 0, and with state 0 such an end as well (the operand first in the pattern),
    /// regex-automata's `Builder::build` followed the empty states `0 -> 0 -> ...` for
    /// ever. The random regexes of `tests/mask_soundness.rs` write `(?:a){0,0}`.
    #[test]
    fn an_operand_repeated_zero_times_is_closed() {
        for pattern in [
            "a{0}",
            "(?:a){0,0}",
            "(?:a){0}b",
            "(?:a{0})",
            "(?:a{0}|b)",
            "(?:a{0}b|c)d",
            "[ab]{0}",
            "(?:(?:)+){0}",
            "(?:(?:)){1,}{0}",
            "(?:(?:a){0}){5}",
            "(?:(?:a){0,0}){0,3}x",
            "(?:(?:a*){0})*",
            "(?:|a{0})+",
            "b(?:a){0,0}",
        ] {
            same_as_general(pattern);
        }
    }

    #[test]
    fn empty_loops_and_nested_counts_have_regex_syntax_language() {
        for pattern in [
            // Nested repetitions of what matches the empty string.
            "(?:a*)*",
            "(?:a*)+",
            "(?:a?)*",
            "(?:(?:a*)*)*",
            "(?:)*",
            "(?:)+",
            "(?:(?:)*)*",
            "(?:(?:)+)+",
            "(?:(?:)?){2,}",
            "(?:(?:)*){3}",
            "(?:(?:){0,}){1,}b",
            // Empty branches in loops.
            "(?:|a)+",
            "(?:a|)*",
            "(?:||)*",
            "(?:(?:|a)+|b*)+c",
            "(?:(?:|a)*|(?:b|)*){2,4}",
            "(?:a|(?:)*)*",
            // Nested counted repetitions.
            "(?:a{0,9}){0,9}",
            "(?:(?:a{0,9}){0,9}){0,9}",
            "(?:(?:a{1,3}){2,}){0,2}",
            "(?:(?:a?){2}){2,}",
            "(?:(?:a|b{0,2}){0,3}){1,2}c",
            "(?:a{0,2}|b{1,}){0,}",
            "(?:é{0,3}){2,3}",
            "(?:[ab]{0,1}){1,}",
            // Counts of what matches only the empty string: one copy, as regex-syntax
            // simplifies them.
            "(?:(?:a){0}){100000}",
            "x(?:(?:a{0}){1000}){100}y",
            "(?:(?:(?:a{0}){1000}){1000}){1000}",
            "(?:(?:(?:(?:)*){1000}){1000}){1000}",
            "(?:(?:(?:|(?:)){100000}){100000}){100000}",
        ] {
            same_as_general(pattern);
        }
    }

    #[test]
    fn huge_counts_stop_at_the_size_limit_as_the_general_route_does() {
        let options = RegexOptions::default();
        for pattern in
            ["[a-z]{10000000}", "(?:(?:[a-z]{1000}){1000}){1000}", "(?:(?:(?:a|){1000}){1000}){1000}"]
        {
            let owned = pattern.to_string();
            let options = options.clone();
            let (direct, general) = within(pattern, 60, move || {
                let direct = ByteDfa::build_with_route(&owned, &options, false, true);
                let general = ByteDfa::build_with_route(&owned, &options, false, false);
                (direct, general)
            });
            let direct = direct.err().unwrap_or_else(|| panic!("{pattern} is past the limit"));
            let general = general.err().unwrap_or_else(|| panic!("{pattern} is past the limit"));
            assert!(matches!(direct, crate::ConstraintError::GrammarTooLarge { .. }), "{pattern}: {direct}");
            assert_eq!(direct.to_string(), general.to_string(), "{pattern}");
        }
    }

    #[test]
    fn a_cancelled_compilation_stops_between_copies() {
        let flag = std::sync::Arc::new(crate::budget::CancelFlag::default());
        flag.cancel();
        let result = crate::budget::scope(usize::MAX, Some(flag.clone()), || {
            compile("(?:(?:[a-z]{100}){100}){100}", true, 1024, usize::MAX)
        });
        assert!(matches!(result, Some(Err(Stop::Budget(crate::ConstraintError::GrammarTooLarge { .. })))));
        assert_eq!(crate::budget::observed(&flag), 1);
        // Without a repetition, nothing to stop: the text read is the work done.
        let result = crate::budget::scope(usize::MAX, Some(flag.clone()), || {
            compile("[a-z]x", true, 1024, usize::MAX)
        });
        assert!(matches!(result, Some(Ok(_))));
    }

    /// Random regexes of the subset, empty groups, empty branches and zero counts
    /// included: the same language as regex-syntax's and regex-automata's compiler's.
    mod random {
        use super::same_as_general;
        use proptest::prelude::*;

        fn regex() -> impl Strategy<Value = String> {
            let leaf = prop_oneof![
                Just("a".to_string()),
                Just("b".to_string()),
                Just("é".to_string()),
                Just("[ab]".to_string()),
                Just("[^a]".to_string()),
                Just("(?:)".to_string()),
            ];
            let counts = [
                "*", "+", "?", "{0}", "{0,0}", "{1}", "{2}", "{0,1}", "{0,2}", "{1,3}", "{0,}", "{1,}",
                "{2,}",
            ];
            leaf.prop_recursive(4, 24, 3, move |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 1..4).prop_map(|parts| parts.concat()),
                    proptest::collection::vec(
                        prop_oneof![3 => inner.clone(), 1 => Just(String::new())],
                        2..4
                    )
                    .prop_map(|parts| format!("(?:{})", parts.join("|"))),
                    (inner, proptest::sample::select(counts.to_vec()))
                        .prop_map(|(r, count)| format!("(?:{r}){count}")),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1024))]

            #[test]
            fn random_regexes_have_regex_syntax_language(pattern in regex()) {
                same_as_general(&pattern);
            }
        }
    }

    #[test]
    fn every_regex_of_the_corpus_schemas_has_regex_syntax_language() {
        let (mut read, mut total) = (0usize, 0usize);
        for (rule, allow_calls) in crate::dfa::parse::corpus_rule_regexes() {
            total += rule.len();
            let options = RegexOptions::default();
            let Ok(general) = ByteDfa::build_with_route(&rule, &options, allow_calls, false) else {
                continue; // past a limit either way
            };
            if compile(&rule, !allow_calls, 1024, usize::MAX).is_some() {
                read += rule.len();
                let direct = ByteDfa::build_with_route(&rule, &options, allow_calls, true).unwrap();
                assert!(same_language(&direct, &general), "{}", &rule[..rule.len().min(300)]);
            }
        }
        assert!(total > 1 << 20, "the corpora are present: {total} bytes of regex");
        // What the translator writes is in the subset (all of it when written).
        assert!(read * 100 >= total * 99, "read {read} of {total} bytes");
    }
}
