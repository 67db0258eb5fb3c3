//! JSON Schema -> regex: valid documents (compact, properties in schema order) are in
//! the language, invalid ones are not, unsupported keywords are named errors.
//!
//! `check` reads schemas in OpenAI's strict mode (an absent `additionalProperties` is
//! `false`), so that a schema without values of any type is one regex; the default,
//! open objects, is checked through grammars (`check_rules`).

mod common;

use common::{random_tokenization, small_vocab, Rng};
use ferrolm_constraint::json_schema::{json_schema_to_regex, JsonSchemaOptions, Whitespace};
use ferrolm_constraint::{ConstraintError, Grammar, Matcher};
use proptest::prelude::*;
use serde_json::{json, Value};

fn language(schema: &Value, options: &JsonSchemaOptions) -> regex::Regex {
    let pattern = json_schema_to_regex(schema, options).unwrap();
    regex::Regex::new(&format!("^(?:{pattern})$")).unwrap()
}

fn strict() -> JsonSchemaOptions {
    JsonSchemaOptions { strict: true, ..JsonSchemaOptions::default() }
}

fn check(schema: Value, valid: &[&str], invalid: &[&str]) {
    let re = language(&schema, &strict());
    for doc in valid {
        assert!(re.is_match(doc), "{schema} should accept {doc}");
    }
    for doc in invalid {
        assert!(!re.is_match(doc), "{schema} should reject {doc}");
    }
}

fn unsupported(schema: Value) -> String {
    match json_schema_to_regex(&schema, &JsonSchemaOptions::default()) {
        Err(ConstraintError::UnsupportedSchema { keyword, .. }) => keyword,
        other => panic!("{schema}: expected an unsupported-keyword error, got {other:?}"),
    }
}

#[test]
fn object_with_required_properties_in_schema_order() {
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]});
    check(
        schema,
        &[r#"{"name":"Ada","age":36}"#, r#"{"name":"a \"q\" \\ \n \u00e9","age":-1}"#],
        &[
            r#"{"age":36,"name":"Ada"}"#,
            r#"{"name":"Ada"}"#,
            r#"{"name":"Ada","age":36,"x":1}"#,
            r#"{ "name":"Ada","age":36}"#,
            r#"{"name":"Ada","age":036}"#,
            "{\"name\":\"a\nb\",\"age\":1}",
        ],
    );
}

#[test]
fn optional_properties_in_every_combination() {
    let schema = json!({"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "null"}}, "required": ["b"]});
    check(
        schema.clone(),
        &[r#"{"b":true}"#, r#"{"a":1,"b":false}"#, r#"{"b":true,"c":null}"#, r#"{"a":1,"b":true,"c":null}"#],
        &[r#"{}"#, r#"{"a":1}"#, r#"{"b":true,}"#, r#"{,"b":true}"#, r#"{"c":null,"b":true}"#],
    );
    let all_optional = json!({"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}});
    let re = language(&all_optional, &strict());
    for subset in 0..8u32 {
        let members: Vec<String> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .filter(|(i, _)| subset >> i & 1 == 1)
            .map(|(_, k)| format!("\"{k}\":1"))
            .collect();
        let doc = format!("{{{}}}", members.join(","));
        assert!(re.is_match(&doc), "{doc}");
    }
    for doc in [r#"{"b":1,"a":1}"#, r#"{,}"#, r#"{"a":1,,"c":1}"#, r#"{"a":1,}"#] {
        assert!(!re.is_match(doc), "{doc}");
    }
}

#[test]
fn strings_with_lengths_and_formats() {
    check(
        json!({"type": "string", "minLength": 2, "maxLength": 3}),
        &[r#""ab""#, r#""a\"c""#, r#""日本語""#, r#""\u0041bc""#],
        &[r#""a""#, r#""abcd""#, r#""ab"#],
    );
    check(
        json!({"type": "string", "format": "date-time"}),
        &[r#""2026-11-30T08:15:00Z""#, r#""2026-11-30T08:15:00.123+05:30""#],
        &[r#""2026-13-30T08:15:00Z""#, r#""2026-11-30 08:15:00Z""#],
    );
    check(
        json!({"type": "string", "format": "uuid"}),
        &[r#""123e4567-e89b-12d3-a456-426614174000""#],
        &[r#""123e4567e89b12d3a456426614174000""#],
    );
    check(json!({"format": "ipv4", "type": "string"}), &[r#""192.168.0.1""#], &[r#""256.1.1.1""#]);
    check(json!({"type": "string", "format": "email"}), &[r#""ada@example.org""#], &[r#""ada@""#]);
}

#[test]
fn astral_characters_are_written_as_utf8_never_as_surrogate_escapes() {
    // A lone surrogate escape is not text serde_json (or any UTF-8 parser) accepts; an
    // escaped pair spells a character that UTF-8 spells too, as serde_json writes it.
    check(
        json!({"type": "string"}),
        &[r#""😀""#, r#""a😀b""#, r#""\u00e9\ud7ff\ue000""#],
        &[r#""\ud83d""#, r#""\ude00""#, r#""\ud83d\ude00""#, r#""\ud83d\u0041""#],
    );
    for doc in [r#""\ud83d""#, r#""\ude00\ud83d""#] {
        assert!(serde_json::from_str::<String>(doc).is_err(), "{doc} does not parse");
    }
    // One character towards `maxLength`.
    check(
        json!({"type": "string", "maxLength": 1}),
        &[r#""😀""#, r#""\u00e9""#],
        &[r#""a😀""#, r#""\ud83d""#],
    );
    // Values of any type (an array without `items`) follow the same rule.
    check_rules(
        json!({"type": "array"}),
        &strict(),
        &[r#"["😀"]"#],
        &[r#"["\ud83d"]"#, r#"["\ud83d\ude00"]"#],
    );
}

#[test]
fn string_patterns() {
    check(
        json!({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}),
        &[r#""AB-123""#],
        &[r#""AB-12""#, r#""xAB-123""#, r#""ab-123""#],
    );
    check(json!({"type": "string", "pattern": "o\"k"}), &[r#""look: o\"k!""#], &[r#""ok""#]);
}

#[test]
fn numbers_and_integer_bounds() {
    check(json!({"type": "number"}), &["0", "-1.5", "1e10", "2.5E-3"], &["01", "1.", ".5", "+1", "--1"]);
    check(
        json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        &["1", "0.5", "1.0", "0.001"],
        &["0", "0.0", "1.5", "-0.5", "1e-3"],
    );
    check(
        json!({"type": "integer", "minimum": -5, "exclusiveMaximum": 100}),
        &["-5", "0", "99"],
        &["-6", "100", "1000", "-0"],
    );
}

#[test]
fn enums_consts_type_lists_and_nullable() {
    check(
        json!({"enum": ["red", "say \"hi\"", 3, {"k": [1, null]}]}),
        &[r#""red""#, r#""say \"hi\"""#, "3", r#"{"k":[1,null]}"#],
        &[r#""blue""#, "4", r#"{"k":[1]}"#],
    );
    check(json!({"type": "string", "enum": ["a", 1]}), &[r#""a""#], &["1"]);
    check(json!({"const": "x"}), &[r#""x""#], &[r#""y""#]);
    check(json!({"type": ["string", "null"]}), &[r#""s""#, "null"], &["1"]);
    check(json!({"type": "integer", "nullable": true}), &["7", "null"], &["true"]);
}

#[test]
fn arrays_with_items_counts_and_prefix_items() {
    let schema = json!({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3});
    check(schema, &["[1]", "[1,2]", "[1,2,3]"], &["[]", "[1,2,3,4]", "[1,]", "[,1]"]);
    check(
        json!({"type": "array", "items": {"type": "boolean"}}),
        &["[]", "[true,false,true]"],
        &["[true false]"],
    );
    check(
        json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false}),
        &["[]", "[1]", r#"[1,"a"]"#],
        &[r#"["a"]"#, r#"[1,"a",2]"#],
    );
    check(
        json!({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "null"}, "minItems": 2}),
        &["[1,null]", "[1,null,null]"],
        &["[1]", "[null,null]"],
    );
}

#[test]
fn refs_resolve_and_unknown_refs_are_errors() {
    let schema = json!({
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
        "type": "array", "items": {"$ref": "#/$defs/point"}});
    check(schema, &[r#"[{"x":1},{"x":2}]"#], &[r#"[{"y":1}]"#]);
    let unknown = json!({"type": "array", "items": {"$ref": "#/$defs/missing"}});
    assert!(matches!(
        json_schema_to_regex(&unknown, &JsonSchemaOptions::default()),
        Err(ConstraintError::InvalidSchema { .. })
    ));
}

#[test]
fn unsupported_keywords_are_named_unless_lenient() {
    assert!(unsupported(json!({"type": "string", "pattern": "(?=a)"})).starts_with("pattern"));
    assert_eq!(
        unsupported(json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})),
        "uniqueItems"
    );
    let overlapping =
        json!({"oneOf": [{"type": "string", "pattern": "a"}, {"type": "string", "pattern": "b"}]});
    assert!(unsupported(overlapping).starts_with("not"));
    assert!(unsupported(json!({"not": {"type": "string", "pattern": "a"}})).starts_with("not"));
    let lenient = JsonSchemaOptions { lenient: true, ..JsonSchemaOptions::default() };
    let re = language(&json!({"type": "string", "pattern": "(a)\\1"}), &lenient);
    assert!(re.is_match(r#""anything""#));
}

#[test]
fn extra_properties_have_other_names_and_come_last() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "integer"}},
        "required": ["b"], "additionalProperties": {"type": "boolean"}});
    check(
        schema,
        &[r#"{"b":1}"#, r#"{"a":null,"b":1,"x":true}"#, r#"{"b":1,"x":true,"aa":false}"#],
        &[r#"{"b":1,"a":true}"#, r#"{"b":1,"b":true}"#, r#"{"x":true,"b":1}"#, r#"{"b":1,"x":1}"#],
    );
    let optional = json!({"type": "object", "properties": {"a": {"type": "null"}},
        "additionalProperties": {"type": "integer"}});
    check(
        optional,
        &["{}", r#"{"a":null}"#, r#"{"z":1}"#, r#"{"a":null,"z":1,"y":2}"#],
        &[r#"{"a":1}"#, r#"{,"z":1}"#],
    );
}

#[test]
fn one_of_with_exclusive_branches() {
    check(json!({"oneOf": [{"type": "integer"}, {"type": "string"}]}), &["1", r#""a""#], &["true"]);
    let pet = json!({"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}}, "required": ["kind", "good"]}
    ]});
    check(
        pet,
        &[r#"{"kind":"cat","lives":9}"#, r#"{"kind":"dog","good":true}"#],
        &[r#"{"kind":"dog","lives":9}"#, r#"{"kind":"cow"}"#],
    );
}

#[test]
fn keywords_without_type_constrain_only_their_own_type() {
    let (vocab, eos) = small_vocab(&[]);
    let schema = json!({"minimum": 1, "maxLength": 2, "items": {"type": "null"}});
    let grammar =
        Grammar::from_json_schema(vocab.clone(), &schema.to_string(), &JsonSchemaOptions::default()).unwrap();
    let accepts = |doc: &str| {
        let mut matcher = Matcher::new(grammar.clone());
        matcher.accept_str(doc) && matcher.accept_token(eos)
    };
    for doc in ["1", "2.5", r#""ab""#, "true", "null", "[null,null]", "{}"] {
        assert!(accepts(doc), "{doc}");
    }
    for doc in ["0", "0.5", r#""abc""#, "[1]", "tru"] {
        assert!(!accepts(doc), "{doc}");
    }
}

#[test]
fn flexible_whitespace_is_capped() {
    let schema =
        json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}});
    let options = JsonSchemaOptions { whitespace: Whitespace::Flexible { max_run: 2 }, ..strict() };
    let re = language(&schema, &options);
    assert!(re.is_match("{ \"a\" : [ 1 ,\n2 ] }"));
    assert!(re.is_match(r#"{"a":[1,2]}"#));
    assert!(!re.is_match("{   \"a\":[]}"), "a run of 3 exceeds the cap");
}

#[test]
fn invalid_schemas_are_typed_errors() {
    let (vocab, _) = small_vocab(&[]);
    let options = JsonSchemaOptions::default();
    for text in ["not json", r#"{"type": 5}"#, r#"{"type": "integer", "minimum": 5, "maximum": 1}"#, "[1]"] {
        match Grammar::from_json_schema(vocab.clone(), text, &options) {
            Err(ConstraintError::InvalidSchema { .. }) => {}
            other => panic!("{text}: {other:?}"),
        }
    }
}

fn person_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b\"c"]}, "maxItems": 3},
        "score": {"type": ["number", "null"]}},
        "required": ["name", "age"]})
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random valid instances, serialized by serde_json (compact, in schema order), are
    /// accepted token by token under random tokenizations, and may end.
    #[test]
    fn valid_instances_are_accepted_token_by_token(
        name in "(\\PC|[\\x00-\\x1f]){0,8}",
        age in 0u32..=150,
        tags in proptest::option::of(proptest::collection::vec(proptest::sample::select(vec!["a", "b\"c"]), 0..=3)),
        score in proptest::option::of(proptest::option::of(-1e6f64..1e6)),
        seed in any::<u64>(),
    ) {
        let mut instance = serde_json::Map::new();
        instance.insert("name".into(), json!(name));
        instance.insert("age".into(), json!(age));
        if let Some(tags) = tags {
            instance.insert("tags".into(), json!(tags));
        }
        if let Some(score) = score {
            instance.insert("score".into(), json!(score));
        }
        let document = Value::Object(instance).to_string();
        let (vocab, eos) = small_vocab(&[b"\":\"".to_vec(), b"\",\"".to_vec(), b"name".to_vec()]);
        let grammar = Grammar::from_json_schema(vocab.clone(), &person_schema().to_string(), &JsonSchemaOptions::default()).unwrap();
        let mut matcher = Matcher::new(grammar);
        let mut rng = Rng(seed);
        for token in random_tokenization(&vocab, document.as_bytes(), &mut rng) {
            prop_assert!(matcher.accept_token(token), "rejected {} in {}", token, document);
        }
        prop_assert!(matcher.accept_token(eos), "cannot end {}", document);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every ordered subset of the members is accepted exactly when it holds all the
    /// required ones; other orders never are.
    #[test]
    fn members_in_order_with_every_required_one(required in proptest::collection::vec(any::<bool>(), 1..7)) {
        let names: Vec<String> = (0..required.len()).map(|i| format!("m{i}")).collect();
        let properties: serde_json::Map<String, Value> =
            names.iter().map(|n| (n.clone(), json!({"type": "integer"}))).collect();
        let required_names: Vec<&String> = names.iter().zip(&required).filter(|(_, r)| **r).map(|(n, _)| n).collect();
        let schema = json!({"type": "object", "properties": properties, "required": required_names});
        let re = language(&schema, &strict());
        for subset in 0u32..(1 << names.len()) {
            let chosen: Vec<usize> = (0..names.len()).filter(|i| subset >> i & 1 == 1).collect();
            let doc = format!("{{{}}}", chosen.iter().map(|i| format!("\"m{i}\":1")).collect::<Vec<_>>().join(","));
            let complete = required.iter().enumerate().all(|(i, r)| !r || chosen.contains(&i));
            prop_assert_eq!(re.is_match(&doc), complete, "{} for required {:?}", doc, required);
            if chosen.len() >= 2 {
                let mut reversed = chosen.clone();
                reversed.reverse();
                let doc = format!("{{{}}}", reversed.iter().map(|i| format!("\"m{i}\":1")).collect::<Vec<_>>().join(","));
                prop_assert!(!re.is_match(&doc), "{}", doc);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Arrays of every length up to 7: accepted exactly when the length is within
    /// minItems/maxItems and every element has its position's type.
    #[test]
    fn array_lengths_and_positions(
        min in 0u64..4, extra in proptest::option::of(0u64..4), prefix in 0usize..4, items in any::<bool>()
    ) {
        let max = extra.map(|e| min + e);
        let mut schema = serde_json::Map::new();
        schema.insert("type".into(), json!("array"));
        // Prefix positions hold strings, later ones integers (or nothing, without items).
        schema.insert("prefixItems".into(), Value::Array(vec![json!({"type": "string"}); prefix]));
        schema.insert("items".into(), if items { json!({"type": "integer"}) } else { json!(false) });
        schema.insert("minItems".into(), json!(min));
        if let Some(max) = max {
            schema.insert("maxItems".into(), json!(max));
        }
        let schema = Value::Object(schema);
        let Ok(pattern) = json_schema_to_regex(&schema, &JsonSchemaOptions::default()) else {
            // Only an impossible length range may fail to compile.
            let longest = if items { max.unwrap_or(u64::MAX) } else { max.unwrap_or(u64::MAX).min(prefix as u64) };
            prop_assert!(longest < min, "{} failed to compile", schema);
            return Ok(());
        };
        let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        for len in 0usize..7 {
            let elements: Vec<String> = (0..len).map(|i| if i < prefix { "\"s\"".to_string() } else { "1".to_string() }).collect();
            let doc = format!("[{}]", elements.join(","));
            let fits_positions = items || len <= prefix;
            let valid = fits_positions && len as u64 >= min && max.is_none_or(|m| len as u64 <= m);
            prop_assert_eq!(re.is_match(&doc), valid, "{} for {}", doc, schema);
            // A wrong type at any position is refused.
            if len > 0 {
                let mut wrong = elements.clone();
                wrong[len - 1] = "true".into();
                let doc = format!("[{}]", wrong.join(","));
                prop_assert!(!re.is_match(&doc), "{} for {}", doc, schema);
            }
        }
    }
}

/// `check` through a grammar (the schema may need rules: values of any type, recursion).
fn check_rules(schema: Value, options: &JsonSchemaOptions, valid: &[&str], invalid: &[&str]) {
    let (vocab, eos) = small_vocab(&[]);
    let grammar = Grammar::from_json_schema(vocab, &schema.to_string(), options).unwrap();
    let accepts = |doc: &str| {
        let mut matcher = Matcher::new(grammar.clone());
        matcher.accept_str(doc) && matcher.accept_token(eos)
    };
    for doc in valid {
        assert!(accepts(doc), "{schema} should accept {doc}");
    }
    for doc in invalid {
        assert!(!accepts(doc), "{schema} should reject {doc}");
    }
}

fn spec_options() -> JsonSchemaOptions {
    JsonSchemaOptions { strict: false, assert_formats: false, ..JsonSchemaOptions::default() }
}

#[test]
fn all_of_merges_its_schemas() {
    let schema = json!({"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
        {"properties": {"a": {"maximum": 9}, "b": {"type": "string"}}, "required": ["b"]}
    ]});
    check(
        schema,
        &[r#"{"a":0,"b":""}"#, r#"{"a":9,"b":"x"}"#],
        &[r#"{"a":10,"b":""}"#, r#"{"a":-1,"b":""}"#, r#"{"a":1}"#, r#"{"b":""}"#, r#"{"a":1.5,"b":""}"#],
    );
    // Types intersect; enums filter; disjoint parts allow nothing.
    check(
        json!({"allOf": [{"type": ["integer", "string"]}, {"type": "number"}]}),
        &["1"],
        &["1.5", r#""a""#],
    );
    check(json!({"allOf": [{"enum": [1, 2, "a"]}, {"enum": [2, "a", 3]}]}), &["2", r#""a""#], &["1", "3"]);
    assert!(json_schema_to_regex(
        &json!({"allOf": [{"type": "string"}, {"type": "null"}]}),
        &JsonSchemaOptions::default()
    )
    .is_err());
    // A name one part does not declare takes that part's additionalProperties.
    let closed = json!({"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false},
        {"properties": {"b": {"type": "integer"}}}
    ]});
    check(closed, &["{}", r#"{"a":1}"#], &[r#"{"b":1}"#, r#"{"a":1,"b":1}"#]);
    // Two patterns would need an intersection of languages.
    assert!(unsupported(json!({"allOf": [{"pattern": "a"}, {"pattern": "b"}]})).contains("pattern"));
}

#[test]
fn siblings_of_ref_any_of_and_all_of_are_merged() {
    let schema = json!({
        "$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
        "$ref": "#/$defs/base", "properties": {"name": {"type": "string"}}, "required": ["name"]});
    check(schema, &[r#"{"id":1,"name":"x"}"#], &[r#"{"id":1}"#, r#"{"name":"x"}"#, r#"{"name":"x","id":1}"#]);
    let distributed = json!({"type": "integer", "maximum": 10, "anyOf": [{"minimum": 8}, {"maximum": 1}]});
    check(distributed, &["8", "10", "1", "-5"], &["11", "5", "2", "8.5"]);
    // A reference that reaches itself with siblings cannot be inlined.
    let recursive = json!({"$defs": {"node": {"type": "object",
        "properties": {"next": {"$ref": "#/$defs/node", "type": "object"}}}}, "$ref": "#/$defs/node"});
    assert!(unsupported(recursive).contains("recursive"));
}

#[test]
fn unevaluated_keywords_on_merged_schemas() {
    let schema = json!({"allOf": [{"properties": {"a": {"type": "integer"}}}],
        "properties": {"b": {"type": "integer"}}, "unevaluatedProperties": false, "type": "object"});
    check_rules(schema, &spec_options(), &["{}", r#"{"a":1,"b":2}"#], &[r#"{"a":1,"c":2}"#, r#"{"c":1}"#]);
    let items = json!({"type": "array", "prefixItems": [{"type": "integer"}], "unevaluatedItems": {"type": "string"}});
    check_rules(items, &spec_options(), &["[]", "[1]", r#"[1,"a","b"]"#], &[r#"["a"]"#, "[1,2]"]);
    // Overlapping anyOf branches could both evaluate members: refused.
    let overlapping = json!({"anyOf": [{"properties": {"a": true}}, {"properties": {"b": true}}],
        "unevaluatedProperties": false});
    assert!(unsupported(overlapping).starts_with("unevaluatedProperties"));
}

#[test]
fn contains_and_min_contains() {
    let schema =
        json!({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}, "minContains": 2});
    check(schema, &["[5,6]", "[1,5,2,7,3]"], &["[]", "[5]", "[1,2,3]", r#"[5,6,"a"]"#]);
    check_rules(
        json!({"type": "array", "contains": {"const": 1}}),
        &spec_options(),
        &["[1]", r#"[{},"a",1,[]]"#],
        &["[]", "[2]"],
    );
    assert_eq!(unsupported(json!({"type": "array", "contains": {"const": 1}, "maxContains": 2})), "contains");
}

#[test]
fn dependent_required_and_schemas() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
        "c": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"c": {"required": ["a"]}}});
    check(
        schema,
        &["{}", r#"{"b":1}"#, r#"{"a":1,"b":2}"#, r#"{"a":1,"b":2,"c":3}"#],
        &[r#"{"a":1}"#, r#"{"b":1,"c":3}"#, r#"{"a":1,"c":3}"#],
    );
}

#[test]
fn not_if_then_else_and_overlapping_one_of() {
    let options = spec_options();
    check_rules(
        json!({"not": {"type": "integer"}}),
        &options,
        &["1.5", r#""a""#, "null", "[1]", "{}"],
        &["1", "-3"],
    );
    check_rules(
        json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
            "not": {"properties": {"a": {"enum": [1, 2]}}}}),
        &options,
        &[r#"{"a":0}"#, r#"{"a":3}"#],
        &[r#"{"a":1}"#, r#"{"a":2}"#, "{}"],
    );
    check_rules(
        json!({"type": "string", "not": {"const": "x"}}),
        &options,
        &[r#""""#, r#""xy""#],
        &[r#""x""#],
    );
    let conditional =
        json!({"type": "integer", "if": {"minimum": 0}, "then": {"maximum": 9}, "else": {"minimum": -5}});
    check_rules(conditional, &options, &["0", "9", "-1", "-5"], &["10", "-6"]);
    let overlapping = json!({"type": "integer", "oneOf": [{"minimum": 2}, {"maximum": 5}]});
    check_rules(overlapping, &options, &["1", "6", "100"], &["2", "5", "3"]);
    check(
        json!({"oneOf": [{"type": "integer"}, {"type": "number"}]}),
        &["1.5", "-0.25", "1e-7"],
        &["1", "0"],
    );
    // Negating a pattern would need the complement of a language.
    assert!(unsupported(json!({"if": {"type": "string", "pattern": "a"}, "then": {"minLength": 2}}))
        .starts_with("not"));
}

#[test]
fn multiple_of_integers_and_decimals() {
    check(
        json!({"type": "integer", "multipleOf": 3}),
        &["0", "3", "-3", "12", "999", "-1002"],
        &["1", "-4", "10", "3.0", "-0", "03"],
    );
    check(json!({"type": "integer", "multipleOf": 1e-8}), &["0", "7", "-12345"], &["1.5"]);
    check(
        json!({"type": "number", "multipleOf": 1.5}),
        &["0", "1.5", "-4.5", "3", "12"],
        &["35", "1.0", "0.5", "2.25"],
    );
    check(
        json!({"type": "number", "multipleOf": 0.01}),
        &["0", "19.99", "-0.01", "5", "0.5"],
        &["0.001", "1.005"],
    );
    // Sign bounds fold into the automaton; close bounds list the multiples.
    check(json!({"type": "integer", "multipleOf": 5, "minimum": 1}), &["5", "100"], &["0", "-5", "7"]);
    check(
        json!({"type": "number", "multipleOf": 0.25, "exclusiveMaximum": 0}),
        &["-0.25", "-3", "-1.5"],
        &["0", "0.25", "-0.1"],
    );
    check(
        json!({"type": "integer", "multipleOf": 7, "minimum": 10, "maximum": 30}),
        &["14", "21", "28"],
        &["7", "35", "20"],
    );
    assert!(unsupported(json!({"type": "integer", "multipleOf": 7, "minimum": 10})).contains("multipleOf"));
    assert!(unsupported(json!({"type": "integer", "multipleOf": 123456789})).contains("multipleOf"));
}

#[test]
fn unique_items_where_exact() {
    check(
        json!({"type": "array", "items": {"type": "integer"}, "maxItems": 1, "uniqueItems": true}),
        &["[]", "[1]"],
        &["[1,2]"],
    );
    check(
        json!({"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": true, "minItems": 2}),
        &[r#"["a","b"]"#, r#"["c","a","b"]"#],
        &[r#"["a","a"]"#, r#"["a"]"#, r#"["a","b","a"]"#, r#"["a","b","c","a"]"#],
    );
    check(
        json!({"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "boolean"}], "items": false, "uniqueItems": true}),
        &["[]", "[true]", "[true,false]", "[false,true]"],
        &["[true,true]", "[false,false]", "[true,false,true]"],
    );
    check(json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": false}), &["[1,1]"], &[]);
    assert_eq!(
        unsupported(json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})),
        "uniqueItems"
    );
}

#[test]
fn min_and_max_properties_count_members() {
    let options = spec_options();
    check_rules(
        json!({"type": "object", "maxProperties": 2}),
        &options,
        &["{}", r#"{"a":1}"#, r#"{"a":1,"b":[2]}"#],
        &[r#"{"a":1,"b":2,"c":3}"#],
    );
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a"], "additionalProperties": {"type": "string"}, "minProperties": 2, "maxProperties": 3});
    check(
        schema,
        &[r#"{"a":1,"b":2}"#, r#"{"a":1,"x":"y"}"#, r#"{"a":1,"b":2,"x":"y"}"#, r#"{"a":1,"x":"y","z":"w"}"#],
        &[r#"{"a":1}"#, r#"{"a":1,"b":2,"x":"y","z":"w"}"#, r#"{"b":2,"x":"y"}"#],
    );
}

#[test]
fn property_names_restrict_names() {
    let options = spec_options();
    check_rules(
        json!({"type": "object", "propertyNames": {"maxLength": 3}}),
        &options,
        &["{}", r#"{"abc":1,"é":2}"#],
        &[r#"{"abcd":1}"#],
    );
    check_rules(
        json!({"type": "object", "propertyNames": {"pattern": "^a+$"}}),
        &options,
        &[r#"{"a":1,"aa":2}"#],
        &[r#"{"ab":1}"#, r#"{"":1}"#],
    );
    check_rules(
        json!({"type": "object", "propertyNames": {"enum": ["foo", "bar"]}}),
        &options,
        &["{}", r#"{"foo":1}"#, r#"{"foo":1,"bar":null}"#],
        &[r#"{"baz":1}"#, r#"{"foo":1,"foo":2}"#],
    );
    check_rules(
        json!({"type": "object", "properties": {"long": {}, "ok": {}}, "propertyNames": {"maxLength": 2}}),
        &options,
        &[r#"{"ok":1}"#, r#"{"ok":1,"x":2}"#],
        &[r#"{"long":1}"#, r#"{"ok":1,"ok":2}"#],
    );
    check_rules(json!({"type": "object", "propertyNames": false}), &options, &["{}"], &[r#"{"a":1}"#]);
    let referenced = json!({"$defs": {"id": {"type": "string", "maxLength": 2}}, "type": "object",
        "propertyNames": {"$ref": "#/$defs/id"}});
    check_rules(referenced, &options, &["{}", r#"{"ab":1,"c":[]}"#], &[r#"{"abc":1}"#]);
}

#[test]
fn pattern_properties_without_overlaps() {
    check(
        json!({"type": "object", "properties": {"foo": {"type": "integer"}},
            "patternProperties": {"^v_": {"type": "string"}, "^w_": {"type": "string"}}, "additionalProperties": false}),
        &[r#"{"foo":1}"#, r#"{"foo":1,"v_a":"x","w_b":"y"}"#, r#"{"v_":""}"#],
        &[r#"{"x":1}"#, r#"{"v_a":1}"#, r#"{"foo":"a"}"#],
    );
    // Absent additionalProperties forbids extras in strict mode: only pattern names.
    check(
        json!({"type": "object", "patternProperties": {"f.*o": {"type": "integer"}}}),
        &[r#"{"xfooy":1}"#],
        &[r#"{"bar":1}"#, r#"{"foo":"x"}"#],
    );
    for overlapping in [
        json!({"patternProperties": {"a*": {"type": "integer"}, "aaa*": {"maximum": 20}}, "additionalProperties": false}),
        json!({"properties": {"foo": {}}, "patternProperties": {"f.o": {"minItems": 2}}, "additionalProperties": false}),
        json!({"patternProperties": {"f.*o": {"type": "integer"}}, "additionalProperties": {"type": "string"}}),
        // A required name matching the pattern would have to be excluded from it.
        json!({"required": ["v_1"], "patternProperties": {"^v_": {"type": "integer"}}, "additionalProperties": false}),
    ] {
        assert!(unsupported(overlapping).contains("patternProperties"));
    }
}

#[test]
fn absent_additional_properties_allows_any_extra_member_after_the_declared_ones() {
    let options = JsonSchemaOptions::default();
    check_rules(
        json!({"type": "object"}),
        &options,
        &["{}", r#"{"a":1}"#, r#"{"a":{"b":[1,"x",null,{}]},"c":true}"#],
        &[r#"{"a"}"#, r#"{"a":1,}"#, "[]"],
    );
    let named = json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]});
    check_rules(
        named.clone(),
        &options,
        &[r#"{"name":"n"}"#, r#"{"name":"n","zzz":1}"#, r#"{"name":"n","zzz":{"name":2},"y":[]}"#],
        // Declared members first, with their own schema; extras take other names.
        &[r#"{"zzz":1,"name":"n"}"#, r#"{"name":1}"#, r#"{"name":"n","name":"m"}"#, "{}"],
    );
    // A free-form member (`metadata: {type: object}`) is any object, not only `{}`.
    check_rules(
        json!({"type": "object", "properties": {"metadata": {"type": "object"}}}),
        &options,
        &[r#"{"metadata":{"k":"v","n":[1]}}"#],
        &[r#"{"metadata":1}"#],
    );
    // Extras follow the whitespace rules of the rest.
    let flexible = JsonSchemaOptions { whitespace: Whitespace::Flexible { max_run: 2 }, ..options.clone() };
    check_rules(
        named.clone(),
        &flexible,
        &["{ \"name\": \"n\" ,\n\"x\" : [ 1 ] }"],
        &["{\"name\":\"n\",   \"x\":1}"],
    );
    // Strict mode (OpenAI's structured outputs): no undeclared member.
    check_rules(named, &strict(), &[r#"{"name":"n"}"#], &[r#"{"name":"n","zzz":1}"#]);
    check_rules(json!({"type": "object"}), &strict(), &["{}"], &[r#"{"a":1}"#]);
}

#[test]
fn unknown_keywords_and_formats_are_annotations() {
    let schema = json!({
        "type": "object", "id": "urn:x", "self": {"href": "x"}, "links": [{"rel": "self"}],
        "example": {"a": 1}, "x-kubernetes-preserve-unknown-fields": true, "_comment": "note",
        "properties": {
            "a": {"type": "integer", "readonly": true, "javaName": "A", "markdownDescription": "*a*"},
            "h": {"type": "string", "format": "sha1"},
            "d": {"type": "string", "format": "date"},
        },
        "additionalProperties": false,
    });
    check(
        schema,
        &[r#"{"a":1}"#, r#"{"h":"anything"}"#, r#"{"d":"2024-02-29"}"#],
        &[r#"{"a":"x"}"#, r#"{"d":"2023-02-29"}"#, r#"{"x-kubernetes-preserve-unknown-fields":1}"#],
    );
    // A known keyword the engine cannot enforce is still named (lenient ignores it).
    let dynamic = json!({"$dynamicRef": "#meta"});
    assert_eq!(unsupported(dynamic.clone()), "$dynamicRef");
    let lenient = JsonSchemaOptions { lenient: true, ..JsonSchemaOptions::default() };
    assert!(json_schema_to_regex(&dynamic, &lenient).is_ok());
}

#[test]
fn draft_4_and_7_vocabularies() {
    let draft4 = json!({
        "$schema": "http://json-schema.org/draft-04/schema#",
        "id": "https://example.com/person.json",
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 0, "exclusiveMinimum": true, "maximum": 9, "exclusiveMaximum": false},
            "pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": false},
            "kind": {"$ref": "https://example.com/person.json#/definitions/kind"},
        },
        "dependencies": {"age": ["kind"], "pair": {"required": ["age"]}},
        "definitions": {"kind": {"enum": ["a", "b"]}},
        "additionalProperties": false,
    });
    check(
        draft4,
        &[
            "{}",
            r#"{"age":1,"kind":"a"}"#,
            r#"{"age":9,"pair":["x",1],"kind":"b"}"#,
            r#"{"age":3,"pair":["x"],"kind":"a"}"#,
        ],
        &[
            r#"{"age":0,"kind":"a"}"#,
            r#"{"age":10,"kind":"a"}"#,
            r#"{"age":1}"#,
            r#"{"pair":["x"]}"#,
            r#"{"pair":["x",1,2],"age":1,"kind":"a"}"#,
            r#"{"kind":"c"}"#,
        ],
    );
    // Drafts up to 7 ignore the siblings of `$ref`; `$id: "#name"` is an anchor; an
    // array `items` with `additionalItems` a schema.
    let draft7 = json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"n": {"$id": "#num", "type": "integer"}},
        "type": "array",
        "items": [{"$ref": "#num", "type": "string"}],
        "additionalItems": {"type": "boolean"},
    });
    check(draft7, &["[]", "[1]", "[1,true,false]"], &[r#"["a"]"#, "[1,2]"]);
    // In 2020-12 `additionalItems` is gone (an unknown keyword) and `$ref` siblings apply.
    let modern = json!({"type": "array", "prefixItems": [{"type": "integer"}], "additionalItems": false,
        "items": {"type": "integer"}});
    check(modern, &["[1,2,3]"], &[r#"[1,"a"]"#]);
    let custom = json!({"$schema": "https://example.com/my-meta", "type": "string"});
    assert!(unsupported(custom).contains("metaschema"));
}

#[test]
fn union_members_that_allow_no_value_are_left_out() {
    check(json!({"anyOf": [{"type": "string", "enum": [1]}, {"type": "integer"}]}), &["1"], &[r#""a""#]);
    check(json!({"type": ["array", "integer"], "minItems": 3, "maxItems": 1}), &["7"], &["[]", "[1,2,3]"]);
    check(
        json!({"oneOf": [{"type": "array", "maxItems": 0, "minItems": 1}, {"type": "null"}]}),
        &["null"],
        &["[]"],
    );
    // A member no value of which is allowed may not be present (it is if required).
    let member = json!({"type": "object", "properties": {"a": {"type": "array", "minItems": 2, "maxItems": 1},
        "b": {"type": "integer"}}});
    check(member.clone(), &["{}", r#"{"b":1}"#], &[r#"{"a":[]}"#, r#"{"a":[1,2],"b":1}"#]);
    let mut required = member;
    required["required"] = json!(["a"]);
    assert!(matches!(json_schema_to_regex(&required, &strict()), Err(ConstraintError::InvalidSchema { .. })));
    // Every branch empty: the schema allows nothing, an error as before.
    let empty =
        json!({"anyOf": [{"type": "string", "enum": [1]}, {"type": "array", "minItems": 2, "maxItems": 1}]});
    assert!(matches!(json_schema_to_regex(&empty, &strict()), Err(ConstraintError::InvalidSchema { .. })));
}

#[test]
fn open_objects_with_many_members_stay_small() {
    // Each declared name is excluded from the extra members' names: the regex of "other
    // names" grows with the names; several such objects still compile.
    let properties: serde_json::Map<String, Value> =
        (0..80).map(|i| (format!("option_{i}_name"), json!({"type": "integer"}))).collect();
    let object = json!({"type": "object", "properties": properties});
    let schema =
        json!({"type": "object", "properties": {"a": object, "b": object, "c": object, "d": object}});
    check_rules(
        schema,
        &JsonSchemaOptions::default(),
        &[r#"{"a":{"option_7_name":1,"option_7_nam":2,"zzz":{}},"b":{"option_1_name_":[]}}"#],
        &[r#"{"a":{"zzz":1,"option_7_name":1}}"#, r#"{"a":{"option_7_name":1,"option_7_name":2}}"#],
    );
}

#[test]
fn keywords_next_to_enum_filter_or_do_not_apply() {
    // Lengths filter string values; keywords of a type no value has change nothing.
    check(json!({"enum": ["a", "abc", 1], "minLength": 2}), &[r#""abc""#, "1"], &[r#""a""#]);
    check(
        json!({"enum": ["avoid", "always"], "additionalProperties": false, "minItems": 1}),
        &[r#""avoid""#],
        &["{}"],
    );
    // A keyword that applies to a value is still refused.
    assert!(unsupported(json!({"enum": [{"a": 1}], "additionalProperties": false}))
        .contains("next to const/enum"));
}

#[test]
fn pattern_properties_in_open_objects_with_simple_patterns() {
    let options = JsonSchemaOptions::default();
    let prefixed = json!({"type": "object", "properties": {"a": {"type": "integer"}},
        "patternProperties": {"^x-": {"type": "string"}}});
    check_rules(
        prefixed,
        &options,
        &["{}", r#"{"a":1,"x-y":"s","b":[1]}"#, r#"{"b":1,"x-":""}"#, r#"{"x":{}}"#],
        &[r#"{"x-y":1}"#, r#"{"a":1,"x-":2}"#, r#"{"a":1,"a":2}"#],
    );
    let every_line = json!({"type": "object", "patternProperties": {"^.*$": {"type": "integer"}}});
    check_rules(
        every_line,
        &options,
        &["{}", r#"{"a":1,"":2}"#, r#"{"a\nb":"s"}"#],
        &[r#"{"a":"s"}"#, r#"{"":"s"}"#],
    );
    let every = json!({"type": "object", "patternProperties": {".*": {"type": "integer"}}});
    check_rules(every, &options, &[r#"{"a":1,"b\nc":2}"#], &[r#"{"a":"s"}"#, r#"{"b\nc":"s"}"#]);
    // Every name matching: the pattern is the extra members' schema, next to propertyNames too.
    let named = json!({"type": "object", "propertyNames": {"pattern": "^[0-9]+$"}, "additionalProperties": false,
        "patternProperties": {".*": {"type": "integer"}}});
    check_rules(named, &options, &["{}", r#"{"404":1,"5":2}"#], &[r#"{"a":1}"#, r#"{"404":"x"}"#]);
    // Other patterns would need their complement: still refused.
    let run = json!({"type": "object", "patternProperties": {"^[_a-z][a-z0-9-]*$": {"type": "integer"}}});
    check_rules(run, &options, &[r#"{"a-1":1,"9":"s","A":[],"":null}"#], &[r#"{"a":"s"}"#, r#"{"_":"s"}"#]);
    let other = json!({"type": "object", "patternProperties": {"^\\w+$": {"type": "integer"}}});
    assert!(unsupported(other).contains("patternProperties"));
}

// Schemas that need a proof or a value test rather than an intersection of languages
// (`oneOf` branches proven apart, keywords decided on listed values, lengths a pattern
// implies, `not` of `additionalProperties: false`). Each table agrees with the Python
// `jsonschema` validator (formats asserted, `uri` as a scheme and no spaces).

#[test]
fn one_of_value_vs_pattern() {
    check_rules(
        serde_json::from_str(
            r#"{"oneOf": [{"type": "string", "pattern": "^[0-9 x]+$"}, {"enum": ["any"]}]}"#,
        )
        .unwrap(),
        &JsonSchemaOptions::default(),
        &[r#""any""#, r#""16x16 32x32""#],
        &[r#""ab""#, r#""""#, r#"1"#],
    );
}

#[test]
fn one_of_value_vs_format() {
    check_rules(
        serde_json::from_str(r#"{"type": "object", "properties": {"url": {"oneOf": [{"type": "string", "format": "uri"}, {"type": "string", "enum": [""]}]}}}"#).unwrap(),
        &JsonSchemaOptions::default(),
        &[r#"{"url":""}"#, r#"{"url":"https://a.b/c"}"#],
        &[r#"{"url":"a b"}"#, r#"{"url":null}"#],
    );
}

#[test]
fn one_of_disjoint_patterns_of_a_required_member() {
    check_rules(
        serde_json::from_str(r#"{"type": "object", "required": ["out"], "properties": {"out": {"type": "string", "minLength": 1}}, "oneOf": [{"properties": {"out": {"type": "string", "pattern": "\\.js$"}, "map": {"type": "boolean"}}}, {"properties": {"out": {"type": "string", "pattern": "\\.css$"}}}]}"#).unwrap(),
        &JsonSchemaOptions::default(),
        &[r#"{"out":"a.js","map":true}"#, r#"{"out":"a.css"}"#, r#"{"out":"a.css","map":1}"#],
        &[r#"{"out":"a.txt"}"#, r#"{}"#, r#"{"out":""}"#],
    );
}

#[test]
fn one_of_closed_object_without_a_required_member() {
    check_rules(
        serde_json::from_str(r#"{"oneOf": [{"type": "object", "required": ["login"], "properties": {"login": {"type": "string"}}}, {"type": "object", "required": ["slug"], "properties": {"slug": {"type": "string"}}, "additionalProperties": false}]}"#).unwrap(),
        &JsonSchemaOptions::default(),
        &[r#"{"login":"a"}"#, r#"{"slug":"s"}"#, r#"{"login":"a","slug":"s"}"#],
        &[r#"{}"#, r#"{"slug":1}"#],
    );
}

#[test]
fn const_next_to_format() {
    check_rules(
        serde_json::from_str(r#"{"type": "object", "properties": {"avatar": {"type": "string", "format": "uri", "const": "https://a.b/u/1?v=4"}, "e": {"format": "email", "enum": ["a@b.co", "not an email", 3]}}}"#).unwrap(),
        &JsonSchemaOptions::default(),
        &[r#"{"avatar":"https://a.b/u/1?v=4"}"#, r#"{"e":"a@b.co"}"#, r#"{"e":3}"#],
        &[r#"{"avatar":"https://a.b/"}"#, r#"{"e":"not an email"}"#],
    );
}

#[test]
fn enum_next_to_pattern_and_bounds() {
    check_rules(
        serde_json::from_str(r#"{"enum": ["ab", "b", 5, 50], "pattern": "^a", "maximum": 10}"#).unwrap(),
        &JsonSchemaOptions::default(),
        &[r#""ab""#, r#"5"#],
        &[r#""b""#, r#"50"#],
    );
}

#[test]
fn pattern_implying_lengths() {
    check_rules(
        serde_json::from_str(r#"{"type": "object", "properties": {"s": {"type": "string", "minLength": 1, "pattern": "[^ ]"}, "d": {"type": "string", "minLength": 3, "maxLength": 9, "pattern": "^[a-c]{4,6}$"}}}"#).unwrap(),
        &JsonSchemaOptions::default(),
        &[r#"{"s":" a ","d":"abcab"}"#, r#"{"s":"x"}"#],
        &[r#"{"s":""}"#, r#"{"s":"   "}"#, r#"{"d":"abc"}"#],
    );
}

#[test]
fn not_additional_properties_false() {
    check_rules(
        serde_json::from_str(
            r#"{"type": "object", "not": {"properties": {"a": {}}, "additionalProperties": false}}"#,
        )
        .unwrap(),
        &JsonSchemaOptions::default(),
        &[r#"{"b":1}"#, r#"{"a":1,"b":2}"#],
        &[r#"{}"#, r#"{"a":[1]}"#],
    );
}

#[test]
fn one_of_closed_objects_overlapping_at_empty() {
    check_rules(
        serde_json::from_str(r#"{"oneOf": [{"type": "string"}, {"type": "object", "additionalProperties": false, "properties": {"ps": {"type": "string"}}}, {"type": "object", "additionalProperties": false, "properties": {"sh": {"type": "string"}}}, {"type": "object", "additionalProperties": false, "properties": {"cmd": {"type": "string"}}}]}"#).unwrap(),
        &JsonSchemaOptions::default(),
        &[r#""x""#, r#"{"ps":"a"}"#, r#"{"sh":"b"}"#, r#"{"cmd":"c"}"#],
        &[r#"{}"#, r#"{"ps":"a","sh":"b"}"#, r#"{"zz":1}"#, r#"{"ps":1}"#],
    );
}
#[test]
fn keywords_next_to_const_that_cannot_be_decided_stay_refused() {
    assert!(unsupported(json!({"const": [1, 1], "uniqueItems": true})).contains("next to const/enum"));
    // A pattern next to lengths it does not imply, or next to a format, still needs an
    // intersection.
    assert!(
        unsupported(json!({"type": "string", "maxLength": 3, "pattern": "a"})).contains("pattern next to")
    );
    assert!(unsupported(json!({"type": "string", "format": "uri", "pattern": "^https?://"}))
        .contains("pattern next to"));
    // `not` of an `additionalProperties` schema (a member failing it) is not built.
    assert!(unsupported(json!({"not": {"additionalProperties": {"type": "string"}}}))
        .contains("additionalProperties"));
}

#[test]
fn a_negated_closed_object_needs_a_member_of_another_name_in_strict_mode_too() {
    let strict = JsonSchemaOptions { strict: true, ..JsonSchemaOptions::default() };
    let schema = json!({"type": "object", "properties": {"a": {}, "b": {}},
        "not": {"properties": {"a": {}}, "additionalProperties": false}});
    check_rules(schema, &strict, &[r#"{"b":1}"#, r#"{"a":1,"b":2}"#], &[r#"{"a":1}"#, "{}"]);
}

#[test]
fn draft_4_reads_const_as_an_annotation() {
    // `const` came with draft 6: in a draft-04 schema it allows every value, as
    // validators read it (a `oneOf` of such branches allows no value at all).
    let schema = json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
        "properties": {"k": {"const": "a"}, "o": {"oneOf": [{"const": "x"}, {"const": "y"}]}}});
    check_rules(schema, &JsonSchemaOptions::default(), &[r#"{"k":"b"}"#, r#"{"k":1}"#], &[r#"{"o":"x"}"#]);
}
