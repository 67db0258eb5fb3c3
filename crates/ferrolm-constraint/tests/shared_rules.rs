//! Member values and array items written in several places become one rule each place
//! calls (`json_schema::Translator::shared`): the language stays the same, the states
//! shrink, a schema whose branches would read one byte both through a call and directly
//! is written out instead, and masks stay exact.

mod common;

use std::sync::Arc;

use common::{check_mask, random_tokenization, small_vocab, Rng};
use ferrolm_constraint::json_schema::{json_schema_to_regex, JsonSchemaOptions};
use ferrolm_constraint::{Grammar, Matcher, Vocabulary};
use serde_json::{json, Value};

fn vocab() -> (Arc<Vocabulary>, u32) {
    let extra: Vec<Vec<u8>> = ["\":", "\",\"", "{\"", "},{", "\"}", "20", "T1", "Z\""]
        .iter()
        .map(|t| t.as_bytes().to_vec())
        .collect();
    small_vocab(&extra)
}

fn accepts(grammar: &Arc<Grammar>, vocab: &Vocabulary, eos: u32, text: &str, rng: &mut Rng) -> bool {
    let mut matcher = Matcher::new(grammar.clone());
    for token in random_tokenization(vocab, text.as_bytes(), rng) {
        check_mask(&matcher, vocab);
        if !matcher.accept_token(token) {
            return false;
        }
    }
    check_mask(&matcher, vocab);
    matcher.accept_token(eos)
}

/// An object schema used in three places (two members and an array's items).
fn repeated() -> Value {
    let event = json!({
        "type": "object",
        "properties": {
            "at": {"type": "string", "format": "date-time"},
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
        },
        "required": ["at"],
        "additionalProperties": false,
    });
    json!({
        "type": "object",
        "properties": {"first": event, "last": event, "all": {"type": "array", "items": event}},
        "required": ["first"],
        "additionalProperties": false,
    })
}

#[test]
fn a_repeated_value_is_one_rule_with_the_same_language() {
    let (vocab, eos) = vocab();
    let schema = repeated();
    let options = JsonSchemaOptions::default();
    let shared = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &options).unwrap();
    // Written out (what `json_schema_to_regex` gives: one regex, no rules).
    let written =
        Grammar::from_regex(vocab.clone(), &json_schema_to_regex(&schema, &options).unwrap()).unwrap();
    assert!(shared.is_recursive() && !written.is_recursive());
    assert!(
        shared.num_states() * 2 < written.num_states(),
        "shared {} states, written out {}",
        shared.num_states(),
        written.num_states()
    );
    let event = r#"{"at":"2024-02-29T10:00:00Z","id":1,"tags":["a","bc"]}"#;
    let short = r#"{"at":"2023-01-01T00:00:00.5+01:00"}"#;
    let valid = [
        format!(r#"{{"first":{short}}}"#),
        format!(r#"{{"first":{event},"last":{short},"all":[{event},{short}]}}"#),
        format!(r#"{{"first":{short},"all":[]}}"#),
    ];
    let invalid = [
        format!(r#"{{"last":{short}}}"#),
        r#"{"first":{"at":"2023-02-29T00:00:00Z"}}"#.to_string(),
        r#"{"first":{"id":1}}"#.to_string(),
        format!(r#"{{"first":{short},"all":[{{"at":"2023-01-01T00:00:00Z","tags":["abcd"]}}]}}"#),
        format!(r#"{{"first":{short},"other":1}}"#),
    ];
    let mut rng = Rng(7);
    for doc in &valid {
        assert!(accepts(&shared, &vocab, eos, doc, &mut rng), "shared refuses {doc}");
        assert!(accepts(&written, &vocab, eos, doc, &mut rng), "written out refuses {doc}");
    }
    for doc in &invalid {
        assert!(!accepts(&shared, &vocab, eos, doc, &mut rng), "shared accepts {doc}");
        assert!(!accepts(&written, &vocab, eos, doc, &mut rng), "written out accepts {doc}");
    }
}

/// Two `anyOf` branches with a member of one name: in the first its value is the
/// repeated object (a call), in the second another object read directly. One byte
/// (`{`) would both start the call and be read: the schema is written out instead.
#[test]
fn a_call_next_to_a_branch_reading_the_same_byte_is_written_out() {
    let (vocab, eos) = vocab();
    let event = repeated()["properties"]["first"].clone();
    let schema = json!({
        "anyOf": [
            {
                "type": "object",
                "properties": {"p": event, "q": event},
                "required": ["p"],
                "additionalProperties": false,
            },
            {
                "type": "object",
                "properties": {"p": {"type": "object", "properties": {"n": {"type": "null"}},
                    "required": ["n"], "additionalProperties": false}},
                "required": ["p"],
                "additionalProperties": false,
            },
        ]
    });
    let grammar =
        Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &JsonSchemaOptions::default()).unwrap();
    let mut rng = Rng(11);
    let short = r#"{"at":"2023-01-01T00:00:00Z"}"#;
    for doc in [format!(r#"{{"p":{short},"q":{short}}}"#), r#"{"p":{"n":null}}"#.to_string()] {
        assert!(accepts(&grammar, &vocab, eos, &doc, &mut rng), "{doc}");
    }
    for doc in [r#"{"p":{"n":null},"q":{"n":null}}"#, r#"{"p":{"at":"x"}}"#] {
        assert!(!accepts(&grammar, &vocab, eos, doc, &mut rng), "{doc}");
    }
}

/// Names and values holding the characters the translator marks its pieces with are
/// translated as any others (sharing is off for such a schema).
#[test]
fn schemas_with_the_marker_characters_compile() {
    let (vocab, eos) = vocab();
    let mut schema = repeated();
    schema["properties"]["\u{FDD0}0\u{FDD1}"] = json!({"const": "\u{FDD0}1\u{FDD1}"});
    let grammar =
        Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &JsonSchemaOptions::default()).unwrap();
    let short = r#"{"at":"2023-01-01T00:00:00Z"}"#;
    let doc = format!("{{\"first\":{short},\"\u{FDD0}0\u{FDD1}\":\"\u{FDD0}1\u{FDD1}\"}}");
    assert!(accepts(&grammar, &vocab, eos, &doc, &mut Rng(3)), "{doc}");
    let other = format!("{{\"first\":{short},\"\u{FDD0}0\u{FDD1}\":{short}}}");
    assert!(!accepts(&grammar, &vocab, eos, &other, &mut Rng(3)), "{other}");
}

/// A short string with a large `maxLength`, used in three places (all members optional
/// also writes values twice): few bytes of regex, but over a thousand states a copy.
/// It is shared like a long value, with the same language.
#[test]
fn a_short_value_with_a_large_count_is_one_rule() {
    let (vocab, eos) = vocab();
    let text = json!({"type": "string", "maxLength": 140});
    let schema = json!({
        "type": "object",
        "properties": {"name": text, "summary": text, "tags": {"type": "array", "items": text}},
        "additionalProperties": false,
    });
    let options = JsonSchemaOptions::default();
    let shared = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &options).unwrap();
    let written =
        Grammar::from_regex(vocab.clone(), &json_schema_to_regex(&schema, &options).unwrap()).unwrap();
    assert!(shared.is_recursive() && !written.is_recursive());
    assert!(
        shared.num_states() * 2 < written.num_states(),
        "shared {} states, written out {}",
        shared.num_states(),
        written.num_states()
    );
    let long = "x".repeat(140);
    let too_long = "y".repeat(141);
    let valid = [
        "{}".to_string(),
        format!(r#"{{"name":"{long}","summary":"a\"b","tags":["","{long}"]}}"#),
        format!(r#"{{"summary":"{long}"}}"#),
        r#"{"tags":["\u00e9t\u00e9"]}"#.to_string(),
    ];
    let invalid = [
        format!(r#"{{"name":"{too_long}"}}"#),
        format!(r#"{{"tags":["{too_long}"]}}"#),
        r#"{"summary":"a","name":"b"}"#.to_string(),
    ];
    let mut rng = Rng(5);
    for doc in &valid {
        assert!(accepts(&shared, &vocab, eos, doc, &mut rng), "shared refuses {doc}");
        assert!(accepts(&written, &vocab, eos, doc, &mut rng), "written out refuses {doc}");
    }
    for doc in &invalid {
        assert!(!accepts(&shared, &vocab, eos, doc, &mut rng), "shared accepts {doc}");
        assert!(!accepts(&written, &vocab, eos, doc, &mut rng), "written out accepts {doc}");
    }
}

/// One shared rule (a counted string) called from two members followed by different
/// text: inside it, the tokens that stay in the string are the same at both call sites
/// (walked once, `grammar/masks.rs`'s `FrameIndex`), and the tokens that return differ
/// with the caller. Both masks are exact.
#[test]
fn a_shared_rule_allows_the_returning_tokens_of_its_call_site() {
    let (vocab, eos) = vocab();
    let text = json!({"type": "string", "maxLength": 40});
    let schema = json!({
        "type": "object",
        "properties": {"a": text, "b": text},
        "required": ["a", "b"],
        "additionalProperties": false,
    });
    let grammar =
        Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &JsonSchemaOptions::default()).unwrap();
    assert!(grammar.is_recursive());
    let id =
        |t: &str| (0..vocab.size() as u32).find(|&i| vocab.token_bytes(i) == Some(t.as_bytes())).unwrap();
    let (next_member, close) = (id("\",\""), id("\"}"));
    let mut matcher = Matcher::new(grammar.clone());
    assert!(matcher.accept_str(r#"{"a":"xy"#));
    check_mask(&matcher, &vocab);
    assert!(matcher.is_token_allowed(next_member) && !matcher.is_token_allowed(close));
    assert!(matcher.accept_str(r#"","b":"xy"#));
    check_mask(&matcher, &vocab);
    assert!(!matcher.is_token_allowed(next_member) && matcher.is_token_allowed(close));
    assert!(matcher.accept_token(close) && matcher.accept_token(eos));
}
