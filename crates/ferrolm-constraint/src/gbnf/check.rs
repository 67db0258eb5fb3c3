//! Whether the engine runs compiled rules exactly.
//!
//! The engine reads a byte by, in order, the rule's own transition, a call whose rule
//! can begin with the byte, or a return to the caller (`recursive.rs`); it never looks
//! further ahead. That is exact when, at every state, at most one of those moves can
//! lead anywhere: the rules are LL(1) (strong LL(1), over the rules' DFA states). So
//! for every rule `k` and every state:
//! - no byte both starts a call and is read directly, and no byte starts two calls;
//! - where `k` may end, no byte both continues `k` and may follow `k`: FOLLOW(k) is what
//!   can come after a call of `k` anywhere, through the callers that may end right
//!   after it (a least fixpoint).
//!
//! `Rules::new`'s own check looks at what follows a call only in the calling rule; a
//! grammar whose rules end in optional parts needs the whole FOLLOW set.

use std::collections::{HashMap, VecDeque};

use crate::dfa::{ByteDfa, DEAD};
use crate::error::Result;
use crate::recursive::{Rules, CALL_BASE};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConflictKind {
    /// The byte starts `callee` and is also read by the rule itself.
    CallOrText { callee: u32 },
    /// The byte starts both `callee` and `other`.
    TwoCalls { callee: u32, other: u32 },
    /// The rule may end here, and the byte both continues it and may follow it.
    EndOrGoOn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub rule: u32,
    pub state: u32,
    pub byte: u8,
    pub kind: ConflictKind,
}

impl Conflict {
    /// The rule a new plan should do without: the callee the choice is about, or the
    /// rule that does not know where it ends.
    pub fn blamed_rule(&self) -> u32 {
        match self.kind {
            ConflictKind::CallOrText { callee } | ConflictKind::TwoCalls { callee, .. } => callee,
            ConflictKind::EndOrGoOn => self.rule,
        }
    }
}

type Bytes = [bool; 256];

fn direct(dfa: &ByteDfa, state: u32) -> Bytes {
    let mut bytes = [false; 256];
    for b in 0..CALL_BASE {
        bytes[b as usize] = dfa.next(state, b) != DEAD;
    }
    bytes
}

/// The text bytes that can come next from `state` of `rule`, directly or by a call.
fn moves(rules: &Rules, rule: u32, state: u32) -> Bytes {
    let mut bytes = direct(rules.rule(rule), state);
    for &(callee, _) in rules.calls_from(rule, state) {
        union(&mut bytes, rules.first(callee));
    }
    bytes
}

fn union(into: &mut Bytes, from: &Bytes) -> bool {
    let mut changed = false;
    for (a, &b) in into.iter_mut().zip(from) {
        if b && !*a {
            *a = true;
            changed = true;
        }
    }
    changed
}

fn common(a: &Bytes, b: &Bytes) -> Option<u8> {
    (0..=255u8).find(|&i| a[i as usize] && b[i as usize])
}

/// FOLLOW of every rule (rule 0, the whole output, is never called).
fn follow_sets(rules: &Rules) -> Vec<Bytes> {
    let n = rules.num_rules();
    let mut follow = vec![[false; 256]; n];
    // `inherits[r]`: rules whose FOLLOW includes FOLLOW(r) (called where r may end).
    let mut inherits: Vec<Vec<u32>> = vec![Vec::new(); n];
    for r in 0..n as u32 {
        let dfa = rules.rule(r);
        for state in 1..dfa.num_states() as u32 {
            for &(callee, ret) in rules.calls_from(r, state) {
                let after = moves(rules, r, ret);
                union(&mut follow[callee as usize], &after);
                if dfa.is_accepting(ret) {
                    inherits[r as usize].push(callee);
                }
            }
        }
    }
    let mut queue: VecDeque<u32> = (0..n as u32).collect();
    while let Some(r) = queue.pop_front() {
        let from = follow[r as usize];
        for &callee in &inherits[r as usize] {
            if union(&mut follow[callee as usize], &from) {
                queue.push_back(callee);
            }
        }
    }
    follow
}

/// The first place where the engine would have to guess, if any (`Err` once the
/// compilation is cancelled).
pub(crate) fn find_conflict(rules: &Rules) -> Result<Option<Conflict>> {
    let follow = follow_sets(rules);
    for rule in 0..rules.num_rules() as u32 {
        crate::budget::check()?;
        let dfa = rules.rule(rule);
        for state in 1..dfa.num_states() as u32 {
            let calls = rules.calls_from(rule, state);
            let text = direct(dfa, state);
            for (i, &(callee, _)) in calls.iter().enumerate() {
                let starts = rules.first(callee);
                if let Some(byte) = common(starts, &text) {
                    return Ok(Some(Conflict {
                        rule,
                        state,
                        byte,
                        kind: ConflictKind::CallOrText { callee },
                    }));
                }
                for &(other, _) in &calls[i + 1..] {
                    if let Some(byte) = common(starts, rules.first(other)) {
                        let kind = ConflictKind::TwoCalls { callee, other };
                        return Ok(Some(Conflict { rule, state, byte, kind }));
                    }
                }
            }
            if rule != 0 && dfa.is_accepting(state) {
                if let Some(byte) = common(&moves(rules, rule, state), &follow[rule as usize]) {
                    return Ok(Some(Conflict { rule, state, byte, kind: ConflictKind::EndOrGoOn }));
                }
            }
        }
    }
    Ok(None)
}

/// A shortest way into `state` of `rule` from its start, as text (calls written as
/// `name(k)`), for error messages: printable bytes preferred.
pub(crate) fn example_prefix(rules: &Rules, rule: u32, state: u32, name: &dyn Fn(u32) -> String) -> String {
    let dfa = rules.rule(rule);
    let order: Vec<u8> = (0x20..0x7F).chain(0..0x20).chain(0x7F..CALL_BASE).collect();
    let mut parent: HashMap<u32, (u32, Option<u8>, Option<u32>)> = HashMap::new();
    let mut queue = VecDeque::from([dfa.start()]);
    parent.insert(dfa.start(), (dfa.start(), None, None));
    while let Some(s) = queue.pop_front() {
        if s == state {
            break;
        }
        let by_byte = order.iter().map(|&b| (dfa.next(s, b), Some(b), None));
        let by_call = rules.calls_from(rule, s).iter().map(|&(callee, ret)| (ret, None, Some(callee)));
        for (next, byte, callee) in by_byte.chain(by_call).collect::<Vec<_>>() {
            if next != DEAD && !parent.contains_key(&next) {
                parent.insert(next, (s, byte, callee));
                queue.push_back(next);
            }
        }
    }
    let mut parts: Vec<(Option<u8>, Option<u32>)> = Vec::new();
    let mut at = state;
    while at != dfa.start() {
        let Some(&(previous, byte, callee)) = parent.get(&at) else { break };
        parts.push((byte, callee));
        at = previous;
    }
    parts.reverse();
    let mut text = String::new();
    let mut bytes = Vec::new();
    for (byte, callee) in parts {
        match (byte, callee) {
            (Some(b), _) => bytes.push(b),
            (None, Some(k)) => {
                text.push_str(&String::from_utf8_lossy(&std::mem::take(&mut bytes)));
                text.push_str(&format!("<{}>", name(k)));
            }
            _ => {}
        }
    }
    text.push_str(&String::from_utf8_lossy(&bytes));
    text
}

/// A byte as a person reads it.
pub(crate) fn show_byte(byte: u8) -> String {
    match byte {
        b'\n' => "`\\n`".into(),
        b'\t' => "`\\t`".into(),
        b'\r' => "`\\r`".into(),
        b' ' => "a space".into(),
        0x21..=0x7E => format!("`{}`", byte as char),
        0x80.. => format!("a character starting with byte 0x{byte:02X}"),
        _ => format!("byte 0x{byte:02X}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dfa::RegexOptions;
    use crate::recursive::call;

    fn rules(patterns: &[&str]) -> Rules {
        let options = RegexOptions::default();
        Rules::new_unchecked(
            patterns.iter().map(|p| ByteDfa::from_regex_with_calls(p, &options).unwrap()).collect(),
        )
        .unwrap()
    }

    #[test]
    fn follow_through_callers_that_may_end() {
        // root: a then " "; a: b; b: "x" then an optional space. After "x", a space could
        // continue b or follow it (through a, which ends right after b): the check in
        // `Rules::new` sees only the first caller.
        let r = rules(&[&format!("{} ", call(1)), &call(2), "x ?"]);
        assert!(r.clone().checked().is_ok(), "the local check misses it");
        let conflict = find_conflict(&r).unwrap().unwrap();
        assert_eq!((conflict.rule, conflict.byte, conflict.kind), (2, b' ', ConflictKind::EndOrGoOn));
        assert_eq!(conflict.blamed_rule(), 2);
        // With a comma after it, fine.
        assert_eq!(find_conflict(&rules(&[&format!("{},", call(1)), &call(2), "x ?"])), Ok(None));
    }

    #[test]
    fn calls_against_text_and_calls() {
        let r = rules(&[&format!("{}|xy", call(1)), "xz"]);
        let conflict = find_conflict(&r).unwrap().unwrap();
        assert_eq!((conflict.rule, conflict.byte), (0, b'x'));
        assert_eq!(conflict.kind, ConflictKind::CallOrText { callee: 1 });
        let r = rules(&[&format!("{}|{}", call(1), call(2)), "xz", "xy"]);
        assert_eq!(find_conflict(&r).unwrap().unwrap().kind, ConflictKind::TwoCalls { callee: 1, other: 2 });
        let name = |k: u32| format!("r{k}");
        let r = rules(&[&format!("ab{}c(?:x|{})", call(1), call(2)), "xz", "xy"]);
        let conflict = find_conflict(&r).unwrap().unwrap();
        assert_eq!(example_prefix(&r, conflict.rule, conflict.state, &name), "ab<r1>c");
    }
}
