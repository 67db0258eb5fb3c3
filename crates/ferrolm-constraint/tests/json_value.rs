//! Values of any type (a stack of rule calls): JSON documents of any shape and depth are
//! accepted token by token, invalid ones refused, and the trie mask equals the mask made
//! by trying every token.

mod common;

use std::sync::Arc;

use common::{check_mask, random_tokenization, small_vocab, Rng};
use ferrolm_constraint::json_schema::{JsonSchemaOptions, Whitespace};
use ferrolm_constraint::{Grammar, Matcher, Vocabulary};
use proptest::prelude::*;
use serde_json::{json, Value};

fn vocab() -> (Arc<Vocabulary>, u32) {
    let extra: Vec<Vec<u8>> =
        ["\":", "\",\"", "[[", "]]", "]}", "},{", "{\"", "true", "null", "12", "\"]", ".5"]
            .iter()
            .map(|t| t.as_bytes().to_vec())
            .collect();
    small_vocab(&extra)
}

fn accepts(
    grammar: &Arc<Grammar>,
    vocab: &Vocabulary,
    eos: u32,
    text: &str,
    rng: &mut Rng,
    check: bool,
) -> bool {
    let mut matcher = Matcher::new(grammar.clone());
    for token in random_tokenization(vocab, text.as_bytes(), rng) {
        if check {
            check_mask(&matcher, vocab);
        }
        if !matcher.accept_token(token) {
            return false;
        }
    }
    if check {
        check_mask(&matcher, vocab);
    }
    matcher.accept_token(eos)
}

#[test]
fn any_value_documents() {
    let (vocab, eos) = vocab();
    let grammar = Grammar::json_value(vocab.clone(), &JsonSchemaOptions::default()).unwrap();
    assert!(grammar.is_recursive());
    let mut rng = Rng(1);
    for doc in [
        "1",
        "-0.5e3",
        "\"a\\\"b\"",
        "true",
        "null",
        "[]",
        "{}",
        "[[[[[[]]]]]]",
        r#"{"a":[1,{"b":null}],"c":"d"}"#,
    ] {
        assert!(accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{doc}");
    }
    for doc in ["", "01", "[1,]", "{\"a\"}", "[[]", "[]]", "{\"a\":1,}", "tru", "[1 2]", "{1:2}"] {
        assert!(!accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{doc}");
    }
}

#[test]
fn json_object_requires_an_object_and_whitespace_is_capped() {
    let (vocab, eos) = vocab();
    let options = JsonSchemaOptions { whitespace: Whitespace::Flexible { max_run: 2 }, ..Default::default() };
    let grammar = Grammar::json_object(vocab.clone(), &options).unwrap();
    let mut rng = Rng(2);
    assert!(accepts(&grammar, &vocab, eos, "{ \"a\" : [ 1 , {} ] }", &mut rng, true));
    assert!(!accepts(&grammar, &vocab, eos, "[1]", &mut rng, false));
    assert!(!accepts(&grammar, &vocab, eos, "{   \"a\":1}", &mut rng, false));
}

#[test]
fn jump_forward_and_ending_with_a_stack() {
    let (vocab, _) = vocab();
    let grammar = Grammar::json_value(vocab, &JsonSchemaOptions::default()).unwrap();
    let mut matcher = Matcher::new(grammar);
    assert!(matcher.accept_str("[[tr"));
    assert_eq!(matcher.stack_depth(), 3, "main -> value -> array element -> array element");
    assert_eq!(matcher.forced_bytes(), b"ue");
    assert!(matcher.accept_str("ue]]"));
    assert!(matcher.can_end() && matcher.must_end());
    matcher.rollback(1).unwrap(); // back to "[[tr": one accept_str is one step
    assert_eq!(matcher.stack_depth(), 3);
    assert!(matcher.accept_str("ue]") && !matcher.can_end() && !matcher.must_end());
    assert!(matcher.accept_str("]") && matcher.can_end());
}

#[test]
fn schemas_with_values_of_any_type() {
    let (vocab, eos) = vocab();
    let options = JsonSchemaOptions::default();
    let mut rng = Rng(3);
    let cases = [
        (json!({}), vec![r#"{"x":[1,2]}"#, "3"], vec!["[1,"]),
        (json!({"type": "array"}), vec!["[]", r#"[1,"a",[null]]"#], vec!["{}"]),
        (
            json!({"type": "object", "properties": {"a": {}, "b": {"type": "integer"}}, "required": ["a", "c"]}),
            vec![r#"{"a":{"k":[true]},"b":1,"c":null}"#, r#"{"a":1,"c":[]}"#],
            vec![r#"{"a":1}"#, r#"{"c":1,"a":1}"#],
        ),
        (json!({"anyOf": [{"type": "integer"}, true]}), vec!["\"s\"", "1"], vec![]),
        (
            json!({"type": "object", "additionalProperties": {"type": "integer"}}),
            vec![r#"{"x":1,"y":2}"#, "{}"],
            vec![r#"{"x":"s"}"#],
        ),
    ];
    for (schema, valid, invalid) in cases {
        let grammar = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &options).unwrap();
        for doc in valid {
            assert!(accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{schema}: {doc}");
        }
        for doc in invalid {
            assert!(!accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{schema}: {doc}");
        }
    }
}

#[test]
fn recursive_refs_become_rules() {
    let (vocab, eos) = vocab();
    let options = JsonSchemaOptions::default();
    let mut rng = Rng(4);
    let tree = json!({"type": "object", "properties": {
        "v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v"]});
    let list = json!({
        "$defs": {"node": {"type": "object", "properties": {
            "v": {"type": "string"},
            "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
        "$ref": "#/$defs/node"});
    let cases = [
        (
            tree,
            vec![r#"{"v":1}"#, r#"{"v":1,"kids":[{"v":2,"kids":[{"v":3},{"v":4,"kids":[]}]}]}"#],
            vec![r#"{"v":1,"kids":[{"kids":[]}]}"#, r#"{"v":1,"kids":[{"v":"x"}]}"#],
        ),
        (
            list,
            vec![r#"{"v":"a","next":null}"#, r#"{"v":"a","next":{"v":"b","next":{"v":"c","next":null}}}"#],
            vec![r#"{"v":"a","next":{"v":"b"}}"#, r#"{"v":"a","next":{"v":1,"next":null}}"#],
        ),
    ];
    for (schema, valid, invalid) in cases {
        let grammar = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &options).unwrap();
        assert!(grammar.is_recursive());
        for doc in valid {
            assert!(accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{schema}: {doc}");
        }
        for doc in invalid {
            assert!(!accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{schema}: {doc}");
        }
    }
}

#[test]
fn free_text_then_any_json_object() {
    let (vocab, eos) = vocab();
    let object = Grammar::json_object(vocab.clone(), &JsonSchemaOptions::default()).unwrap();
    let grammar = Grammar::after_trigger("</a>", &object).unwrap();
    assert!(grammar.is_recursive());
    let mut rng = Rng(5);
    assert!(accepts(&grammar, &vocab, eos, r#"thinking {[ </a>{"k":[1,{"x":null}]}"#, &mut rng, true));
    assert!(!accepts(&grammar, &vocab, eos, r#"no trigger {"k":1}"#, &mut rng, true));
    assert!(!accepts(&grammar, &vocab, eos, "</a>[1]", &mut rng, true));
}

#[test]
fn an_optional_trigger_lets_free_text_end_and_a_recursive_grammar_follow() {
    // tool_choice "auto": a plain answer, or a call (any JSON object here) after the trigger
    let (vocab, eos) = vocab();
    let object = Grammar::json_object(vocab.clone(), &JsonSchemaOptions::default()).unwrap();
    let grammar = Grammar::after_trigger_with("<call>", &object, true).unwrap();
    assert!(grammar.is_recursive());
    let mut rng = Rng(6);
    assert!(accepts(&grammar, &vocab, eos, "just an answer, {[ unbalanced", &mut rng, true));
    assert!(accepts(&grammar, &vocab, eos, "", &mut rng, true));
    assert!(accepts(&grammar, &vocab, eos, r#"let me call <call>{"k":[1,{"x":null}]}"#, &mut rng, true));
    assert!(!accepts(&grammar, &vocab, eos, r#"<call>{"k":"#, &mut rng, true));
    assert!(!accepts(&grammar, &vocab, eos, r#"<call>{"k":1} and more"#, &mut rng, true));
}

fn json_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "[a-c\"\\\\é\\n]{0,4}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec(("[a-c\"]{0,3}", inner), 0..4)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_json_is_accepted_with_exact_masks(value in json_strategy(), seed in any::<u64>()) {
        let (vocab, eos) = vocab();
        let grammar = Grammar::json_value(vocab.clone(), &JsonSchemaOptions::default()).unwrap();
        let document = value.to_string();
        let mut rng = Rng(seed);
        prop_assert!(accepts(&grammar, &vocab, eos, &document, &mut rng, true), "{}", document);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Recursive grammars whose strings have counted lengths, over a vocabulary with long
    /// tokens: their states outside loops simulate the (primed) JSON string loops, and
    /// the masks must still equal trying every token.
    #[test]
    fn counted_strings_in_recursive_grammars_have_exact_masks(
        min in 0usize..6,
        extra_len in 0usize..45,
        shape in 0usize..3,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let letters = ["a", "b", "é", "\"", ":", ",", "{", "}", "x"];
        let mut extra: Vec<Vec<u8>> = ["\":", "\",\"", "{\"", "true"].iter().map(|t| t.as_bytes().to_vec()).collect();
        for _ in 0..80 {
            let len = 2 + rng.below(40);
            extra.push((0..len).map(|_| letters[rng.below(letters.len())]).collect::<String>().into_bytes());
        }
        let (vocab, eos) = small_vocab(&extra);
        let max = min + extra_len;
        let (schema, document) = {
            let text: String = (0..min + rng.below(extra_len + 1)).map(|_| ["a", "b", "é"][rng.below(3)]).collect();
            match shape {
                0 => (json!({"minLength": min, "maxLength": max}), json!(text)),
                1 => (json!({"properties": {"foo": {}, "bar": {}}, "additionalProperties": {"type": "string", "minLength": min, "maxLength": max}}),
                      json!({"foo": [1, {"x": null}], "bar": "y", &text: text.clone()})),
                _ => (json!({"items": {"minLength": min, "maxLength": max}}), json!([text.clone(), {"k": text}])),
            }
        };
        let options = JsonSchemaOptions { strict: false, ..JsonSchemaOptions::default() };
        let grammar = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &options).unwrap();
        prop_assert!(grammar.is_recursive(), "{}", schema);
        let document = document.to_string();
        prop_assert!(accepts(&grammar, &vocab, eos, &document, &mut rng, true), "{} {}", schema, document);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Many documents through one grammar: its mask cache is filled by earlier
    /// documents and read by later ones (extra members after any declared one,
    /// free-form objects at any depth); every mask must still equal trying every token.
    #[test]
    fn masks_shared_between_states_of_one_grammar_stay_exact(
        values in proptest::collection::vec(json_strategy(), 12),
        seed in any::<u64>(),
    ) {
        let (vocab, eos) = vocab();
        let schema = json!({
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "object"}, "c": {"type": "array"}},
            "required": ["c"],
        });
        let grammar = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &JsonSchemaOptions::default()).unwrap();
        prop_assert!(grammar.is_recursive());
        let mut rng = Rng(seed);
        for (i, value) in values.into_iter().enumerate() {
            let mut document = serde_json::Map::new();
            if i % 2 == 0 {
                document.insert("a".into(), json!("x\"é"));
            }
            if i % 3 != 1 {
                document.insert("b".into(), json!({"k": value.clone(), "b": [value.clone()]}));
            }
            document.insert("c".into(), json!([value.clone(), {}]));
            document.insert(format!("z{i}"), value);
            let text = Value::Object(document).to_string();
            prop_assert!(accepts(&grammar, &vocab, eos, &text, &mut rng, true), "{}", text);
        }
    }
}
