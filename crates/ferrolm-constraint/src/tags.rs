//! Structural tags: a grammar's text wrapped in fixed opening and closing strings, once or
//! repeated (`<tool_call>\n{...}\n</tool_call>` once per tool call), and triggers that are
//! special tokens (`[TOOL_CALLS]`, `<|python_tag|>`).
//!
//! The sequence is one more rule in front of the body's rules: the main rule reads the
//! opening, calls the body's main rule (moved to the end of the list), reads the closing,
//! and loops through a separator to the next opening. The recursive machinery
//! (`recursive.rs`) then runs it exactly, and its check proves that the closing can never
//! be mistaken for more of the body. A free-text part in front (`Grammar::after_trigger`)
//! gives "text, then one or more calls".
//!
//! Special tokens are not text: the vocabulary's trie never walks them, so a trigger that
//! the tokenizer has as a special token could not be written under a byte grammar. Where
//! a trigger's text is a special token's, the grammar also takes that token as one step
//! from every free-text state to where the trigger's bytes lead (an edge of the main
//! rule, taken only with an empty stack), so the model may write it either way; the text
//! the output decodes to is the same.

use std::ops::Range;
use std::sync::Arc;

use crate::dfa::{ByteDfa, RegexOptions, DEAD};
use crate::error::{ConstraintError, Result};
use crate::grammar::Grammar;
use crate::recursive::{call, call_bytes, Config, Rules, CALL_BASE, MAX_RULES, NO_FRAME};
use crate::vocab::TokenKind;

/// Opening, body, closing, repeated: what [`Grammar::tag_sequence`] builds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TagSequence {
    /// Written before every body (`<tool_call>\n`); may be empty.
    pub begin: String,
    /// Written after every body (`\n</tool_call>`); may be empty.
    pub end: String,
    /// Written between two tags (`\n`); may be empty.
    pub separator: String,
    /// More than one tag may come (else exactly one).
    pub repeated: bool,
    /// The part of the first `begin` already written (by the prompt, or a trigger in
    /// front): a prefix of `begin` that the output does not repeat.
    pub begun: String,
}

impl Grammar {
    /// `tags.begin`, text matching `body`, `tags.end`; with `tags.repeated`, then any number
    /// of `separator begin body end` more. The output may end only after a closing.
    pub fn tag_sequence(body: &Grammar, tags: &TagSequence) -> Result<Arc<Grammar>> {
        crate::budget::entry(|| {
            let Some(first_begin) = tags.begin.strip_prefix(&tags.begun) else {
                return Err(invalid("`begun` must be a prefix of `begin`"));
            };
            // Rule 0 is the sequence; the body's rules follow.
            let (mut dfas, body_rule) = embed(body, 1)?;
            let esc = |text: &str| regex_syntax::escape(text);
            let one = |opening: &str| format!("{}{}{}", esc(opening), call(body_rule), esc(&tags.end));
            let mut main = one(first_begin);
            if tags.repeated {
                main += &format!("(?:{}{})*", esc(&tags.separator), one(&tags.begin));
            }
            dfas.insert(0, ByteDfa::from_regex_with_calls(&main, &RegexOptions::default())?);
            Ok(Arc::new(Self::from_rules(body.vocab().clone(), Rules::new(dfas)?)))
        })
    }

    /// Text that matches `first` or text that matches `second` (an answer in the
    /// response format, or tool calls). Their first bytes must tell them apart.
    pub fn either(first: &Grammar, second: &Grammar) -> Result<Arc<Grammar>> {
        crate::budget::entry(|| {
            if !Arc::ptr_eq(first.vocab(), second.vocab()) {
                return Err(invalid("the two grammars have different vocabularies"));
            }
            let (mut dfas, first_rule) = embed(first, 1)?;
            let (more, second_rule) = embed(second, 1 + dfas.len())?;
            dfas.extend(more);
            let main = format!("{}|{}", call(first_rule), call(second_rule));
            dfas.insert(0, ByteDfa::from_regex_with_calls(&main, &RegexOptions::default())?);
            Ok(Arc::new(Self::from_rules(first.vocab().clone(), Rules::new(dfas)?)))
        })
    }
}

fn invalid(message: &str) -> ConstraintError {
    ConstraintError::InvalidRegex { pattern: String::new(), message: format!("structural tags: {message}") }
}

/// `grammar`'s rules as rules `base..`: its other rules first, in order, then its main
/// rule (the one a caller calls, returned with them), calls renumbered to match.
fn embed(grammar: &Grammar, base: usize) -> Result<(Vec<ByteDfa>, usize)> {
    if !grammar.token_edges().is_empty() {
        return Err(invalid("a grammar that takes special tokens must come first (put triggers outside)"));
    }
    let Some(rules) = grammar.rules() else {
        return Ok((vec![grammar.dfa().clone()], base));
    };
    let n = rules.num_rules();
    if (0..n as u32).any(|k| calls_main(rules, k)) {
        return Err(invalid("a grammar whose rules call its main rule cannot be embedded"));
    }
    if base + n > MAX_RULES {
        return Err(ConstraintError::GrammarTooLarge {
            message: format!("the combined grammar needs more than {MAX_RULES} rules"),
        });
    }
    let index = |k: u32| if k == 0 { base + n - 1 } else { base + k as usize - 1 };
    let order = (1..n as u32).chain(std::iter::once(0));
    let dfas = order
        .map(|k| if base == 1 { Ok(rules.rule(k).clone()) } else { renumber_calls(rules, k, index) })
        .collect::<Result<Vec<_>>>()?;
    Ok((dfas, base + n - 1))
}

/// Rule `rule` of `rules` with every call to rule k spelled as a call to `index(k)`:
/// each call path is rebuilt from fresh states (the digits get classes of their own).
fn renumber_calls(rules: &Rules, rule: u32, index: impl Fn(u32) -> usize) -> Result<ByteDfa> {
    let dfa = rules.rule(rule);
    let old_classes = (0..=255u8).map(|b| dfa.byte_class(b) as usize).max().unwrap_or(0) + 1;
    let num_classes = old_classes + (256 - CALL_BASE as usize);
    if num_classes > 256 {
        return Err(invalid("a rule has too many byte classes to renumber its calls"));
    }
    let mut classes = [0u8; 256];
    let mut representative: Vec<Option<u8>> = vec![None; old_classes];
    for byte in 0..=255u8 {
        classes[byte as usize] = if byte >= CALL_BASE {
            (old_classes + (byte - CALL_BASE) as usize) as u8
        } else {
            let class = dfa.byte_class(byte);
            representative[class as usize].get_or_insert(byte);
            class
        };
    }
    let n = dfa.num_states();
    let mut transitions = vec![DEAD; n * num_classes];
    for state in 1..n as u32 {
        for (class, byte) in representative.iter().enumerate() {
            if let Some(byte) = byte {
                transitions[state as usize * num_classes + class] = dfa.next(state, *byte);
            }
        }
    }
    let mut accepting: Vec<bool> = (0..n as u32).map(|s| s != DEAD && dfa.is_accepting(s)).collect();
    let fresh = |transitions: &mut Vec<u32>, accepting: &mut Vec<bool>| {
        transitions.extend(std::iter::repeat_n(DEAD, num_classes));
        accepting.push(false);
        (accepting.len() - 1) as u32
    };
    for state in 1..n as u32 {
        for &(callee, ret) in rules.calls_from(rule, state) {
            let spelled = call_bytes(index(callee));
            let mut at = state;
            for (i, &byte) in spelled.iter().enumerate() {
                let cell = at as usize * num_classes + classes[byte as usize] as usize;
                if i == spelled.len() - 1 {
                    transitions[cell] = ret;
                } else {
                    if transitions[cell] == DEAD {
                        let next = fresh(&mut transitions, &mut accepting);
                        transitions[cell] = next;
                    }
                    at = transitions[cell];
                }
            }
        }
    }
    Ok(ByteDfa::from_table(classes, num_classes, transitions, accepting, dfa.start()))
}

/// Whether some state of `rule` calls rule 0.
fn calls_main(rules: &Rules, rule: u32) -> bool {
    (0..rules.rule(rule).num_states() as u32).any(|s| rules.calls_from(rule, s).iter().any(|&(k, _)| k == 0))
}

/// A special token taken as one step of the main rule, with an empty stack, from the
/// states in `from` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenEdge {
    pub token: u32,
    pub from: Range<u32>,
    pub to: u32,
}

impl TokenEdge {
    pub fn leaves(&self, config: Config) -> bool {
        config.rule == 0 && config.stack == NO_FRAME && self.from.contains(&config.state)
    }

    pub fn target(&self, config: Config) -> Config {
        Config { state: self.to, ..config }
    }

    fn shifted(&self, by: u32) -> TokenEdge {
        TokenEdge { token: self.token, from: self.from.start + by..self.from.end + by, to: self.to + by }
    }
}

/// The special-token edges of `trigger::after_trigger(trigger, then)`, built as `main`:
/// those of `then`, moved past the trigger's states, and, where `trigger` is the text of
/// a special token, that token from each trigger state to where the trigger leads.
pub(crate) fn trigger_token_edges(trigger: &[u8], then: &Grammar, main: &ByteDfa) -> Result<Vec<TokenEdge>> {
    let m = trigger.len() as u32;
    // `after_trigger` numbers its states: DEAD, the m trigger states, then `then`'s
    // states shifted by m. Every one of them can reach acceptance, so none is dropped.
    if main.num_states() != 1 + m as usize + then.dfa().num_states() - 1 {
        return Err(ConstraintError::InvalidRegex {
            pattern: String::new(),
            message: "a trigger segment lost states; special-token triggers cannot be placed".into(),
        });
    }
    let mut edges: Vec<TokenEdge> = then.token_edges().iter().map(|e| e.shifted(m)).collect();
    if let Some(token) = special_token(then, trigger) {
        let to = main.run(main.start(), trigger);
        debug_assert_eq!(to, m + then.dfa().start());
        if to != DEAD {
            edges.push(TokenEdge { token, from: 1..1 + m, to });
        }
    }
    Ok(edges)
}

/// The special token whose text is `text`, if the vocabulary has one.
fn special_token(grammar: &Grammar, text: &[u8]) -> Option<u32> {
    let vocab = grammar.vocab();
    (0..vocab.size() as u32)
        .find(|&id| vocab.kind(id) == Some(TokenKind::Special) && vocab.token_bytes(id) == Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::Vocabulary;

    fn vocab() -> Arc<Vocabulary> {
        let mut tokens: Vec<Vec<u8>> = (0u8..128).map(|b| vec![b]).collect();
        tokens.push(b"<eos>".to_vec()); // 128
        tokens.push(b"[CALLS]".to_vec()); // 129, special
        Arc::new(Vocabulary::new(tokens, &[129], &[128]).unwrap())
    }

    fn accepts(grammar: &Arc<Grammar>, text: &str) -> bool {
        let mut matcher = crate::Matcher::new(grammar.clone());
        matcher.accept_str(text) && matcher.can_end()
    }

    #[test]
    fn begun_must_be_a_prefix() {
        let body = Grammar::from_regex(vocab(), "[0-9]+").unwrap();
        let tags = TagSequence { begin: "<a>".into(), begun: "<b".into(), ..TagSequence::default() };
        assert!(Grammar::tag_sequence(&body, &tags).is_err());
    }

    #[test]
    fn repeated_tags_over_a_plain_body() {
        let body = Grammar::from_regex(vocab(), "[0-9]+").unwrap();
        let tags = TagSequence {
            begin: "<a>".into(),
            end: "</a>".into(),
            separator: ",".into(),
            repeated: true,
            begun: "<".into(),
        };
        let grammar = Grammar::tag_sequence(&body, &tags).unwrap();
        assert!(accepts(&grammar, "a>1</a>"));
        assert!(accepts(&grammar, "a>1</a>,<a>23</a>,<a>4</a>"));
        assert!(!accepts(&grammar, "<a>1</a>"), "the begun part is not written again");
        assert!(!accepts(&grammar, "a>1</a>,"));
        assert!(!accepts(&grammar, "a></a>"));
        let once = Grammar::tag_sequence(&body, &TagSequence { repeated: false, ..tags }).unwrap();
        assert!(accepts(&once, "a>1</a>"));
        assert!(!accepts(&once, "a>1</a>,<a>2</a>"));
    }

    #[test]
    fn grammars_that_cannot_be_embedded_are_refused() {
        // rule 1 calls the main rule back: moving the main rule would break that call
        let options = RegexOptions::default();
        let main = ByteDfa::from_regex_with_calls(&format!("a|\\({}\\)", call(1)), &options).unwrap();
        let back = ByteDfa::from_regex_with_calls(&format!("b{}", call(0)), &options).unwrap();
        let looped = Arc::new(Grammar::from_rules(vocab(), Rules::new(vec![main, back]).unwrap()));
        let tags = TagSequence { begin: "<".into(), end: ">".into(), ..TagSequence::default() };
        assert!(Grammar::tag_sequence(&looped, &tags).is_err());
        let plain = Grammar::from_regex(looped.vocab().clone(), "x").unwrap();
        assert!(Grammar::either(&plain, &looped).is_err());
        assert!(Grammar::either(&plain, &Grammar::from_regex(looped.vocab().clone(), "y").unwrap()).is_ok());
        // two vocabularies
        let other = Grammar::from_regex(vocab(), "y").unwrap();
        assert!(Grammar::either(&plain, &other).is_err());
        // a grammar that takes special tokens goes outside, not inside
        let triggered = Grammar::after_trigger("[CALLS]", &plain).unwrap();
        assert!(Grammar::tag_sequence(&triggered, &tags).is_err());
    }

    #[test]
    fn a_special_token_trigger_is_one_step() {
        let v = vocab();
        let body = Grammar::from_regex(v.clone(), "[0-9]+").unwrap();
        let grammar = Grammar::after_trigger_with("[CALLS]", &body, true).unwrap();
        let mut matcher = crate::Matcher::new(grammar.clone());
        let mut mask = vec![0u32; v.bitmask_words()];
        matcher.fill_next_token_bitmask(&mut mask).unwrap();
        assert_eq!(mask[129 / 32] >> (129 % 32) & 1, 1, "the trigger token is allowed in free text");
        assert!(matcher.accept_str("hi "));
        assert!(matcher.accept_token(129));
        matcher.fill_next_token_bitmask(&mut mask).unwrap();
        assert_eq!(mask[129 / 32] >> (129 % 32) & 1, 0, "not once triggered");
        assert!(!matcher.is_token_allowed(b'x' as u32));
        assert!(!matcher.can_end());
        assert!(matcher.accept_token(b'7' as u32));
        assert!(matcher.can_end());
        assert!(!matcher.accept_token(129));
        matcher.rollback(2).unwrap();
        assert!(matcher.is_token_allowed(129), "rollback undoes the special step");
    }
}
