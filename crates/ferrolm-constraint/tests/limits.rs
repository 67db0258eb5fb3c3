//! Hostile and degenerate schemas: nesting costs linear size (nested arrays used to
//! double their grammar per level), compilations are bounded in memory and stop when
//! cancelled, and schemas no finite document matches are refused at compile time.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::small_vocab;
use ferrolm_constraint::json_schema::{json_schema_to_regex, JsonSchemaOptions};
use ferrolm_constraint::{ConstraintError, Grammar, GrammarCache, GrammarSource, Matcher, Vocabulary};

/// Only a blow-up exceeds this (the machine is shared and noisy; depth 100 takes
/// ~0.1 s in debug, and nested arrays of depth 20 used not to finish at all).
const GENEROUS: Duration = Duration::from_secs(60);

fn nested_arrays(depth: usize) -> String {
    let mut schema = r#"{"type":"string"}"#.to_string();
    for _ in 0..depth {
        schema = format!(r#"{{"type":"array","items":{schema}}}"#);
    }
    schema
}

fn nested_objects(depth: usize) -> String {
    let mut schema = r#"{"type":"string"}"#.to_string();
    for _ in 0..depth {
        schema = format!(
            r#"{{"type":"object","properties":{{"a":{schema},"b":{{"type":"integer"}}}},"required":["a"]}}"#
        );
    }
    schema
}

fn compile(vocab: &Arc<Vocabulary>, schema: &str) -> Result<Arc<Grammar>, ConstraintError> {
    Grammar::from_json_schema(vocab.clone(), schema, &JsonSchemaOptions::default())
}

/// `text` byte by byte, checking before each byte that the mask allows it and allows
/// something (no dead end), and at the end that EOS is allowed exactly when complete.
fn walk(grammar: &Arc<Grammar>, vocab: &Vocabulary, eos: u32, text: &str) -> bool {
    let mut matcher = Matcher::new(grammar.clone());
    let mut mask = vec![0u32; vocab.bitmask_words()];
    for &byte in text.as_bytes() {
        matcher.fill_next_token_bitmask(&mut mask).unwrap();
        assert!(mask.iter().any(|&w| w != 0), "a dead end before {:?} in {text}", byte as char);
        let token = byte as u32; // small_vocab: token b is the single byte b
        let allowed = mask[token as usize / 32] >> (token % 32) & 1 == 1;
        assert_eq!(allowed, matcher.is_token_allowed(token));
        if !matcher.accept_token(token) {
            return false;
        }
    }
    matcher.fill_next_token_bitmask(&mut mask).unwrap();
    let eos_allowed = mask[eos as usize / 32] >> (eos % 32) & 1 == 1;
    assert_eq!(eos_allowed, matcher.can_end());
    matcher.can_end()
}

#[test]
fn nested_arrays_compile_in_linear_size_and_match_exactly() {
    let (vocab, eos) = small_vocab(&[]);
    for depth in [20, 40, 100] {
        let schema = nested_arrays(depth);
        let started = Instant::now();
        let grammar = compile(&vocab, &schema).unwrap_or_else(|e| panic!("depth {depth}: {e}"));
        assert!(started.elapsed() < GENEROUS, "depth {depth} took {:?}", started.elapsed());
        // The main rule's regex no longer doubles per level: items over 4 KiB are rules.
        let main =
            json_schema_to_regex(&serde_json::from_str(&schema).unwrap(), &JsonSchemaOptions::default())
                .unwrap();
        assert!(main.len() < 64 << 10, "depth {depth}: main regex of {} bytes", main.len());

        let full = format!("{}\"x\"{}", "[".repeat(depth), "]".repeat(depth));
        assert!(walk(&grammar, &vocab, eos, &full), "depth {depth}: {full}");
        assert!(walk(&grammar, &vocab, eos, "[]"));
        let mixed = format!("[[],{}\"x\",\"y\"{}]", "[".repeat(depth - 1), "]".repeat(depth - 1));
        assert!(walk(&grammar, &vocab, eos, &mixed), "depth {depth}: {mixed}");
        let too_deep = format!("{}\"x\"{}", "[".repeat(depth + 1), "]".repeat(depth + 1));
        assert!(!walk(&grammar, &vocab, eos, &too_deep), "depth {depth}: one level too many");
        let too_shallow = format!("{}\"x\"{}", "[".repeat(depth - 1), "]".repeat(depth - 1));
        assert!(!walk(&grammar, &vocab, eos, &too_shallow), "depth {depth}: a string one level up");
        assert!(!walk(&grammar, &vocab, eos, "[\"x\",]"));
    }
}

#[test]
fn nested_objects_compile_and_match_exactly_or_are_refused_past_the_parser_depth() {
    let (vocab, eos) = small_vocab(&[]);
    for depth in [20, 40, 60] {
        let started = Instant::now();
        let grammar =
            compile(&vocab, &nested_objects(depth)).unwrap_or_else(|e| panic!("depth {depth}: {e}"));
        assert!(started.elapsed() < GENEROUS, "depth {depth} took {:?}", started.elapsed());
        let full = format!("{}\"x\"{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        assert!(walk(&grammar, &vocab, eos, &full), "depth {depth}");
        let with_b = format!("{}\"x\",\"b\":-3}}{}", "{\"a\":".repeat(depth), ",\"b\":7}".repeat(depth - 1));
        assert!(walk(&grammar, &vocab, eos, &with_b), "depth {depth}: {with_b}");
        let missing = format!("{}\"x\"{}", "{\"a\":".repeat(depth - 1), "}".repeat(depth - 1));
        assert!(!walk(&grammar, &vocab, eos, &missing), "depth {depth}: one level short");
    }
    // 100 levels of objects are 200 levels of JSON: past the JSON parser's guard (128).
    let started = Instant::now();
    let err = compile(&vocab, &nested_objects(100)).unwrap_err();
    assert!(started.elapsed() < GENEROUS);
    assert!(matches!(&err, ConstraintError::GrammarTooLarge { message } if message.contains("128")), "{err}");
}

#[test]
fn schemas_whose_regex_multiplies_are_refused_quickly_by_size() {
    let (vocab, _) = small_vocab(&[]);
    // A small request whose levels each use the one below twice (`contains` writes its
    // item schema several times and cannot call a rule for it, `anyOf` of two
    // references doubles too): the regex multiplies per level until the size limit
    // stops the translation.
    let mut defs = serde_json::Map::new();
    defs.insert("l0".into(), serde_json::json!({"type": "string"}));
    for i in 1..=30 {
        let below = serde_json::json!({"$ref": format!("#/$defs/l{}", i - 1)});
        let level = if i % 2 == 0 {
            serde_json::json!({"type": "array", "items": below, "contains": below})
        } else {
            serde_json::json!({"anyOf": [{"type": "array", "items": below}, {"type": "object", "additionalProperties": below}]})
        };
        defs.insert(format!("l{i}"), level);
    }
    let schema = serde_json::json!({"$defs": defs, "$ref": "#/$defs/l30"}).to_string();
    assert!(schema.len() < 4096);
    let started = Instant::now();
    match compile(&vocab, &schema) {
        Err(ConstraintError::GrammarTooLarge { message }) => {
            assert!(message.contains("KiB") || message.contains("MiB"), "{message}")
        }
        other => panic!("expected GrammarTooLarge, got {other:?}"),
    }
    assert!(started.elapsed() < GENEROUS, "took {:?}", started.elapsed());
}

#[test]
fn a_schema_regex_too_deep_for_the_parser_is_a_size_limit() {
    let (vocab, _) = small_vocab(&[]);
    // 300 items nest 600 levels, within the limit; 1,000 do not.
    let items = |n: usize| -> Vec<serde_json::Value> {
        (0..n).map(|_| serde_json::json!({"type": "integer"})).collect()
    };
    let schema =
        |n: usize| serde_json::json!({"type": "array", "prefixItems": items(n), "items": false}).to_string();
    assert!(compile(&vocab, &schema(300)).is_ok());
    let err = compile(&vocab, &schema(1000)).unwrap_err();
    assert!(
        matches!(&err, ConstraintError::GrammarTooLarge { message } if message.contains("1024")),
        "{err}"
    );
}

#[test]
fn a_timed_out_compilation_stops_and_frees_its_caller() {
    let (vocab, _) = small_vocab(&[]);
    let cache = GrammarCache::new(vocab, 8, Duration::from_millis(1));
    // Some 100,000 DFA states: well over a millisecond to build, within every limit.
    let properties: serde_json::Map<String, serde_json::Value> =
        (0..40).map(|i| (format!("p{i}"), serde_json::json!({"type": "string", "maxLength": 200}))).collect();
    let schema = serde_json::json!({"type": "object", "properties": properties}).to_string();
    let source = GrammarSource::JsonSchema(schema, JsonSchemaOptions::default());
    let started = Instant::now();
    let err = cache.get_or_compile(&source).unwrap_err();
    assert!(err.to_string().contains("longer than"), "{err}");
    assert!(started.elapsed() < GENEROUS, "stopped only after {:?}", started.elapsed());
    // It ran on this thread and has stopped: nothing is left running.
    assert_eq!(cache.compilations_running(), 0);
    // The failure is cached: asking again answers at once with the same error.
    assert_eq!(cache.get_or_compile(&source).unwrap_err().to_string(), err.to_string());
}

#[test]
fn self_references_with_no_way_out_are_refused_at_compile_time() {
    let (vocab, _) = small_vocab(&[]);
    let hopeless = [
        r##"{"$ref": "#"}"##,
        r##"{"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}"##,
        r##"{"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}}, "$ref": "#/$defs/a"}"##,
        r##"{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}"##,
        r##"{"type": "array", "items": {"$ref": "#"}, "minItems": 1}"##,
        r##"{"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}"##,
        r##"{"anyOf": [{"$ref": "#"}]}"##,
        r##"{"allOf": [{"$ref": "#"}]}"##,
    ];
    for schema in hopeless {
        match compile(&vocab, schema) {
            Err(ConstraintError::InvalidSchema { message, .. }) => {
                assert!(message.contains("no finite document"), "{schema}: {message}")
            }
            // Refused another way (a recursive $ref next to other keywords, ...) is fine too;
            // compiling is not.
            Err(ConstraintError::UnsupportedSchema { .. }) => {}
            other => panic!("{schema}: expected a refusal, got {:?}", other.map(|_| "a grammar")),
        }
    }
    // The cyclic $defs of issue 9, by name.
    let err = compile(
        &vocab,
        r##"{"$defs":{"a":{"type":"object","properties":{"x":{"$ref":"#/$defs/a"}},"required":["x"]}},"$ref":"#/$defs/a"}"##,
    )
    .unwrap_err();
    assert!(matches!(err, ConstraintError::InvalidSchema { .. }), "{err}");
    assert!(err.to_string().contains("no finite document matches"), "{err}");
}

#[test]
fn a_branch_no_document_completes_is_masked_out_not_a_dead_end() {
    let (vocab, eos) = small_vocab(&[]);
    let schema = r##"{"$defs": {"loop": {"type": "object", "properties": {"x": {"$ref": "#/$defs/loop"}},
        "required": ["x"]}}, "anyOf": [{"type": "null"}, {"$ref": "#/$defs/loop"}]}"##;
    let grammar = compile(&vocab, schema).unwrap();
    assert!(walk(&grammar, &vocab, eos, "null"));
    let matcher = Matcher::new(grammar);
    assert!(!matcher.is_token_allowed(b'{' as u32), "the endless branch must not be entered");
}

#[test]
fn recursive_schemas_with_a_way_out_still_compile_and_complete() {
    let (vocab, eos) = small_vocab(&[]);
    let list = r##"{"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
        "next": {"$ref": "#/$defs/node"}}, "required": ["v"]}}, "$ref": "#/$defs/node"}"##;
    let grammar = compile(&vocab, list).unwrap();
    assert!(grammar.is_recursive());
    for doc in [r#"{"v":1}"#, r#"{"v":1,"next":{"v":2,"next":{"v":3}}}"#] {
        assert!(walk(&grammar, &vocab, eos, doc), "{doc}");
    }
    assert!(!walk(&grammar, &vocab, eos, r#"{"v":1,"next":{}}"#));

    let tree = r##"{"type": "object", "properties": {"name": {"type": "string"},
        "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["name", "children"]}"##;
    let grammar = compile(&vocab, tree).unwrap();
    for doc in [
        r#"{"name":"r","children":[]}"#,
        r#"{"name":"r","children":[{"name":"a","children":[]},{"name":"b","children":[{"name":"c","children":[]}]}]}"#,
    ] {
        assert!(walk(&grammar, &vocab, eos, doc), "{doc}");
    }
    assert!(!walk(&grammar, &vocab, eos, r#"{"name":"r"}"#));
}

#[test]
fn self_references_in_every_position_end_in_a_grammar_or_an_error() {
    let (vocab, _) = small_vocab(&[]);
    let shapes = [
        r##"{"$ref": "#", "type": "object"}"##,
        r##"{"not": {"$ref": "#"}}"##,
        r##"{"if": {"$ref": "#"}, "then": {"type": "null"}}"##,
        r##"{"oneOf": [{"$ref": "#"}, {"type": "null"}]}"##,
        r##"{"anyOf": [{"$ref": "#"}, {"type": "null"}]}"##,
        r##"{"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}], "type": "object"}}, "$ref": "#/$defs/a"}"##,
        r##"{"properties": {"a": {"$ref": "#"}}, "required": ["a"]}"##,
        r##"{"type": "array", "prefixItems": [{"$ref": "#"}], "items": false}"##,
        r##"{"type": "object", "additionalProperties": {"$ref": "#"}, "minProperties": 1}"##,
        r##"{"dependentSchemas": {"a": {"$ref": "#"}}}"##,
        r##"{"contains": {"$ref": "#"}, "type": "array"}"##,
    ];
    for schema in shapes {
        let started = Instant::now();
        let result = compile(&vocab, schema);
        assert!(started.elapsed() < GENEROUS, "{schema}");
        if let Err(e) = result {
            assert!(
                matches!(
                    e,
                    ConstraintError::InvalidSchema { .. }
                        | ConstraintError::UnsupportedSchema { .. }
                        | ConstraintError::GrammarTooLarge { .. }
                ),
                "{schema}: {e}"
            );
        }
    }
}
