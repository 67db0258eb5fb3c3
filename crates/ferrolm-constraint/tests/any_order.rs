//! Members in any order (`JsonSchemaOptions::any_order_members`): each declared member
//! at most once, in any order, `required` checked at the close, extra members anywhere;
//! masks exact, checked against the prefixes of every document of finite schemas.

mod common;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use common::{check_mask, small_vocab};
use ferrolm_constraint::json_schema::{JsonSchemaOptions, Whitespace};
use ferrolm_constraint::{Grammar, Matcher, Vocabulary};
use serde_json::{json, Value};

fn any_order() -> JsonSchemaOptions {
    JsonSchemaOptions { any_order_members: true, ..JsonSchemaOptions::default() }
}

fn vocab() -> (Arc<Vocabulary>, u32) {
    let extra: Vec<Vec<u8>> =
        ["\"a\"", "\"a", ",\"", "\"ab\"", "\":", "},", "}}", ":1", ",\"c\":{", "\"x\":1", "{\""]
            .iter()
            .map(|t| t.as_bytes().to_vec())
            .collect();
    small_vocab(&extra)
}

fn accepts(grammar: &Arc<Grammar>, text: &str) -> bool {
    let mut m = Matcher::new(grammar.clone());
    m.accept_str(text) && m.can_end()
}

/// `text` is accepted whole, and the mask before each of its bytes agrees with trying
/// every token.
fn accepted_with_exact_masks(grammar: &Arc<Grammar>, vocab: &Vocabulary, text: &str) {
    assert!(accepts(grammar, text), "{text}");
    let mut m = Matcher::new(grammar.clone());
    for b in text.bytes() {
        check_mask(&m, vocab);
        assert!(m.accept_bytes(&[b]), "{text}");
    }
}

/// Every compact document of a finite schema: objects' members in every order.
fn documents(schema: &Value) -> Vec<String> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.iter().map(Value::to_string).collect();
    }
    if let Some(value) = schema.get("const") {
        return vec![value.to_string()];
    }
    let properties = schema["properties"].as_object().unwrap();
    let required: Vec<&str> =
        schema["required"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    let names: Vec<&String> = properties.keys().collect();
    let mut out = Vec::new();
    for subset in 0u32..1 << names.len() {
        let chosen: Vec<&String> =
            (0..names.len()).filter(|i| subset >> i & 1 == 1).map(|i| names[i]).collect();
        if required.iter().any(|r| !chosen.iter().any(|c| c == r)) {
            continue;
        }
        for order in permutations(&chosen) {
            let mut partial = vec![String::new()];
            for (i, name) in order.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                let values = documents(&properties[name.as_str()]);
                partial = partial
                    .iter()
                    .flat_map(|p| values.iter().map(move |v| format!("{p}{sep}{}:{v}", json!(name))))
                    .collect();
            }
            out.extend(partial.into_iter().map(|p| format!("{{{p}}}")));
        }
    }
    out
}

fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    if items.is_empty() {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut tail in permutations(&rest) {
            tail.insert(0, first.clone());
            out.push(tail);
        }
    }
    out
}

fn finite_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "a": {"enum": [1, 2]},
            "ab": {"const": "x"},
            "c": {
                "type": "object",
                "properties": {"x": {"const": 1}, "a": {"const": true}, "y": {"const": null}},
                "required": ["x"],
                "additionalProperties": false
            }
        },
        "required": ["a"],
        "additionalProperties": false
    })
}

#[test]
fn masks_are_exact_on_every_prefix_of_a_finite_schema() {
    let (vocab, eos) = vocab();
    let schema = finite_schema();
    let grammar = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &any_order()).unwrap();
    let docs = documents(&schema);
    assert!(docs.len() > 100, "{}", docs.len());
    let whole: HashSet<&str> = docs.iter().map(String::as_str).collect();
    let prefixes: BTreeSet<&str> = docs.iter().flat_map(|d| (0..=d.len()).map(move |i| &d[..i])).collect();
    let mut mask = vec![0u32; vocab.bitmask_words()];
    for prefix in &prefixes {
        let mut m = Matcher::new(grammar.clone());
        assert!(m.accept_str(prefix), "prefix {prefix:?} refused");
        m.fill_next_token_bitmask(&mut mask).unwrap();
        for id in 0..vocab.size() as u32 {
            let allowed = mask[id as usize / 32] >> (id % 32) & 1 == 1;
            let expected = match vocab.token_bytes(id) {
                _ if id == eos => whole.contains(prefix),
                Some(bytes) if !bytes.is_empty() => match std::str::from_utf8(bytes) {
                    Ok(text) => prefixes.contains(format!("{prefix}{text}").as_str()),
                    Err(_) => false,
                },
                _ => false,
            };
            assert_eq!(
                allowed,
                expected,
                "after {prefix:?}, token {:?}",
                vocab.token_bytes(id).map(String::from_utf8_lossy)
            );
        }
    }
    for doc in &docs {
        assert!(accepts(&grammar, doc), "{doc}");
    }
    for bad in [
        r#"{"a":1,"a":2}"#,
        r#"{"ab":"x"}"#,
        r#"{"a":1,"c":{"a":true}}"#,
        r#"{"c":{"x":1,"x":1},"a":1}"#,
        r#"{"a":1,}"#,
    ] {
        assert!(!accepts(&grammar, bad), "{bad}");
    }
}

#[test]
fn schema_order_stays_the_default() {
    let (vocab, _) = vocab();
    let schema = finite_schema().to_string();
    let ordered = Grammar::from_json_schema(vocab.clone(), &schema, &JsonSchemaOptions::default()).unwrap();
    let any = Grammar::from_json_schema(vocab, &schema, &any_order()).unwrap();
    let shuffled = r#"{"c":{"y":null,"x":1},"a":2}"#;
    assert!(!accepts(&ordered, shuffled));
    assert!(accepts(&any, shuffled));
}

#[test]
fn extra_members_come_anywhere_and_declared_ones_once() {
    let (vocab, _) = vocab();
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"$ref": "#"}, "list": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["a"]
    });
    for whitespace in [Whitespace::Compact, Whitespace::Flexible { max_run: 2 }] {
        let options = JsonSchemaOptions { whitespace, ..any_order() };
        let grammar = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &options).unwrap();
        assert!(grammar.is_recursive());
        for ok in [
            r#"{"a":1}"#,
            r#"{"z":[1,{"q":2}],"a":1}"#,
            r#"{"b":{"a":2,"b":{"a":3}},"x":null,"a":1}"#,
            r#"{"list":[{"a":1,"list":[]},{"zz":"a","a":0}],"a":5,"b":{"a":1}}"#,
        ] {
            accepted_with_exact_masks(&grammar, &vocab, ok);
        }
        for bad in [
            r#"{"b":{"a":1}}"#,
            r#"{"a":1,"a":1}"#,
            r#"{"a":1,"b":{"a":1,"a":2}}"#,
            r#"{"a":"s"}"#,
            r#"{"list":[{}],"a":1}"#,
        ] {
            assert!(!accepts(&grammar, bad), "{bad}");
        }
    }
}

#[test]
fn counted_members_are_refused_unless_lenient() {
    let (vocab, _) = vocab();
    let schema = json!({"type": "object", "properties": {"a": {}}, "maxProperties": 1}).to_string();
    assert!(Grammar::from_json_schema(vocab.clone(), &schema, &any_order()).is_err());
    let lenient = JsonSchemaOptions { lenient: true, ..any_order() };
    assert!(Grammar::from_json_schema(vocab, &schema, &lenient).is_ok());
}

#[test]
fn unions_of_objects_check_each_branch_at_the_close() {
    let (vocab, _) = vocab();
    let schema = json!({
        "anyOf": [
            {"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}}, "required": ["a"], "additionalProperties": false},
            {"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}}, "required": ["b"], "additionalProperties": false},
            {"type": "object", "properties": {"c": {"enum": [{"x": 1, "y": [{"z": 2}]}]}}, "required": ["c"], "additionalProperties": false}
        ]
    });
    let grammar = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &any_order()).unwrap();
    for ok in [r#"{"a":1}"#, r#"{"b":2}"#, r#"{"b":2,"a":1}"#, r#"{"c":{"y":[{"z":2}],"x":1}}"#] {
        accepted_with_exact_masks(&grammar, &vocab, ok);
    }
    for bad in [
        r#"{}"#,
        r#"{"a":1,"a":1}"#,
        r#"{"c":{"x":1}}"#,
        r#"{"c":{"x":1,"y":[{"z":2}],"x":1}}"#,
        r#"{"a":1,"c":{"x":1,"y":[{"z":2}]}}"#,
    ] {
        assert!(!accepts(&grammar, bad), "{bad}");
    }
}
