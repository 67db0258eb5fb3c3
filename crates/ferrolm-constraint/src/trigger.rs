//! Segments: free text until a trigger string first appears, then a strict grammar —
//! so a reasoning model thinks freely and then answers in valid JSON.
//!
//! Built as one automaton: a string-matching automaton for the trigger (Knuth-Morris-
//! Pratt: state k = the last k bytes are the first k bytes of the trigger) whose
//! completion enters the grammar's start state. The document may end only inside the
//! grammar, unless the trigger is optional: then it may also end in the free text, before
//! any trigger (a tool call or a plain answer). Free text is any bytes but 0xF8..=0xFF,
//! which UTF-8 text never contains (and which recursive grammars use for calls).

use crate::dfa::{ByteDfa, DEAD};
use crate::error::{ConstraintError, Result};
use crate::recursive::CALL_BASE;

/// Any bytes until the first occurrence of `trigger` (included), then `then`; with
/// `optional`, the document may also end before the trigger.
pub fn after_trigger(trigger: &[u8], then: &ByteDfa, optional: bool) -> Result<ByteDfa> {
    if trigger.is_empty() {
        return Err(ConstraintError::InvalidRegex {
            pattern: String::new(),
            message: "a segment trigger must not be empty".into(),
        });
    }
    let m = trigger.len();
    let next_matched = kmp_table(trigger);

    // Classes: bytes the grammar tells apart, each byte of the trigger apart, and the
    // bytes that are never text apart.
    let mut pair_to_class: Vec<(u8, i16, bool)> = Vec::new();
    let mut classes = [0u8; 256];
    let mut representative: Vec<u8> = Vec::new();
    for byte in 0..=255u8 {
        let in_trigger = trigger.iter().position(|&t| t == byte).map_or(-1, |p| p as i16);
        let pair = (then.byte_class(byte), in_trigger, byte >= CALL_BASE);
        let class = match pair_to_class.iter().position(|&p| p == pair) {
            Some(c) => c,
            None => {
                pair_to_class.push(pair);
                representative.push(byte);
                pair_to_class.len() - 1
            }
        };
        classes[byte as usize] = class as u8;
    }
    let num_classes = representative.len();

    // State ids: DEAD, then the m trigger states, then the grammar's live states.
    let trigger_state = |k: usize| (1 + k) as u32;
    let grammar_state = |s: u32| if s == DEAD { DEAD } else { m as u32 + s };
    let total = 1 + m + (then.num_states() - 1);
    let mut transitions = vec![DEAD; total * num_classes];
    let mut accepting = vec![false; total];
    for k in 0..m {
        accepting[trigger_state(k) as usize] = optional;
        for (class, &byte) in representative.iter().enumerate() {
            if byte >= CALL_BASE {
                continue; // never text (in a recursive grammar, the bytes of calls)
            }
            let matched = next_matched(k, byte);
            transitions[trigger_state(k) as usize * num_classes + class] =
                if matched == m { grammar_state(then.start()) } else { trigger_state(matched) };
        }
    }
    for s in 1..then.num_states() as u32 {
        let row = grammar_state(s) as usize;
        accepting[row] = then.is_accepting(s);
        for (class, &byte) in representative.iter().enumerate() {
            transitions[row * num_classes + class] = grammar_state(then.next(s, byte));
        }
    }
    Ok(ByteDfa::from_table(classes, num_classes, transitions, accepting, trigger_state(0)))
}

/// `next(k, byte)`: how much of `pattern` is matched after `byte`, given `k` matched.
fn kmp_table(pattern: &[u8]) -> impl Fn(usize, u8) -> usize + '_ {
    // failure[k] = length of the longest proper border of pattern[..k].
    let mut failure = vec![0usize; pattern.len() + 1];
    let mut border = 0;
    for k in 1..pattern.len() {
        while border > 0 && pattern[k] != pattern[border] {
            border = failure[border];
        }
        if pattern[k] == pattern[border] {
            border += 1;
        }
        failure[k + 1] = border;
    }
    move |mut k: usize, byte: u8| loop {
        if pattern[k] == byte {
            return k + 1;
        }
        if k == 0 {
            return 0;
        }
        k = failure[k];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dfa::RegexOptions;

    fn full_match(dfa: &ByteDfa, text: &str) -> bool {
        let s = dfa.run(dfa.start(), text.as_bytes());
        s != DEAD && dfa.is_accepting(s)
    }

    #[test]
    fn free_text_then_grammar() {
        let json = ByteDfa::from_regex(r#"\{"a":[0-9]+\}"#, &RegexOptions::default()).unwrap();
        let dfa = after_trigger(b"</think>", &json, false).unwrap();
        assert!(full_match(&dfa, r#"hmm, <think> </thin </think>{"a":12}"#));
        assert!(full_match(&dfa, r#"</think>{"a":1}"#));
        assert!(full_match(&dfa, r#"<<</</think>{"a":1}"#), "overlapping partial triggers");
        assert!(!full_match(&dfa, "no trigger yet"));
        assert!(!full_match(&dfa, r#"</think>{"a":1} </think>"#), "strict after the first trigger");
        assert!(!full_match(&dfa, r#"</think>x"#));
        assert!(after_trigger(b"", &json, false).is_err());
    }

    #[test]
    fn an_optional_trigger_may_never_come() {
        let json = ByteDfa::from_regex(r#"\{"a":[0-9]+\}"#, &RegexOptions::default()).unwrap();
        let dfa = after_trigger(b"<call>", &json, true).unwrap();
        assert!(full_match(&dfa, "a plain answer"), "free text may end");
        assert!(full_match(&dfa, ""), "even at once");
        assert!(full_match(&dfa, "<ca"), "a partial trigger is free text");
        assert!(full_match(&dfa, r#"then <call>{"a":1}"#));
        assert!(!full_match(&dfa, "then <call>"), "once triggered, the grammar must complete");
        assert!(!full_match(&dfa, r#"<call>{"a":1} more"#), "strict after the trigger");
        let mandatory = after_trigger(b"<call>", &json, false).unwrap();
        assert!(!full_match(&mandatory, "a plain answer"));
    }

    #[test]
    fn kmp_follows_borders() {
        let next = kmp_table(b"abab");
        assert_eq!(next(3, b'b'), 4);
        assert_eq!(next(3, b'a'), 1);
        assert_eq!(next(2, b'a'), 3);
        assert_eq!(next(0, b'x'), 0);
    }
}
