//! Conformance on the official JSON-Schema-Test-Suite (draft 2020-12; the files and
//! their licence are in `tests/data/json-schema-test-suite`).
//!
//! For every case whose schema compiles, each instance is serialized the way the
//! engine generates JSON (compact, properties in schema order, integral numbers without
//! a fraction) and fed token by token: a valid instance must be accepted and may end;
//! an invalid one must be refused at some token or may not end. Both counts of mistakes
//! must be zero, with one exception: in the optional format-assertion tests, formats we
//! generate as a valid subset (email, hostname, uri, leap seconds) refuse some valid
//! values; those are listed, and no invalid value may pass. Run with `--nocapture` to
//! see the per-file table.

mod common;

use std::path::{Path, PathBuf};

use common::{random_tokenization, small_vocab, Rng};
use ferrolm_constraint::json_schema::{canonical_json, normalized_schema, JsonSchemaOptions};
use ferrolm_constraint::{Grammar, Matcher};
use serde_json::{Map, Value};

#[derive(Default)]
struct Tally {
    schemas: usize,
    compiled: usize,
    valid: usize,
    valid_accepted: usize,
    invalid: usize,
    invalid_rejected: usize,
}

#[test]
fn json_schema_test_suite_draft2020_12() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/json-schema-test-suite/draft2020-12");
    let mut files = Vec::new();
    collect_json_files(&root, &mut files);
    files.sort();
    let (vocab, eos) = small_vocab(&[b"\":".to_vec(), b"\",\"".to_vec(), b"true".to_vec(), b"null".to_vec()]);
    // Spec-faithful options: an absent additionalProperties allows extra properties,
    // and `format` is an annotation, except in the optional format-assertion tests.
    let spec = JsonSchemaOptions { strict: false, assert_formats: false, ..JsonSchemaOptions::default() };
    let asserting_formats = JsonSchemaOptions { assert_formats: true, ..spec.clone() };
    let mut rng = Rng(7);
    let mut mistakes = Vec::new();
    // Valid values outside the subset a format generates (documented in formats.rs).
    let mut format_subset_rejections = Vec::new();
    let mut total = Tally::default();
    println!("{:<28} {:>9} {:>14} {:>16}", "keyword (suite file)", "compiled", "valid ok", "invalid refused");
    for file in &files {
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        let groups: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let format_assertion = name.starts_with("optional/format");
        let options = if format_assertion { &asserting_formats } else { &spec };
        let mut tally = Tally::default();
        for group in &groups {
            tally.schemas += 1;
            let schema = &group["schema"];
            let Ok(grammar) = Grammar::from_json_schema(vocab.clone(), &schema.to_string(), options) else {
                continue;
            };
            tally.compiled += 1;
            for test in group["tests"].as_array().unwrap() {
                let valid = test["valid"].as_bool().unwrap();
                let normalized = normalized_schema(schema).unwrap();
                let documents = serializations(&test["data"], &normalized, &normalized);
                let accepted = documents.iter().any(|doc| {
                    let mut matcher = Matcher::new(grammar.clone());
                    random_tokenization(&vocab, doc.as_bytes(), &mut rng)
                        .into_iter()
                        .all(|t| matcher.accept_token(t))
                        && matcher.accept_token(eos)
                });
                if valid {
                    tally.valid += 1;
                    tally.valid_accepted += accepted as usize;
                } else {
                    tally.invalid += 1;
                    tally.invalid_rejected += !accepted as usize;
                }
                if accepted != valid {
                    let list =
                        if format_assertion && valid { &mut format_subset_rejections } else { &mut mistakes };
                    list.push(format!(
                        "{name}: {} / {}: {} {} wrongly {}",
                        group["description"],
                        test["description"],
                        schema,
                        documents[0],
                        if valid { "rejected" } else { "accepted" }
                    ));
                }
            }
        }
        println!(
            "{:<28} {:>4}/{:<4} {:>6}/{:<7} {:>7}/{:<8}",
            name,
            tally.compiled,
            tally.schemas,
            tally.valid_accepted,
            tally.valid,
            tally.invalid_rejected,
            tally.invalid
        );
        total.schemas += tally.schemas;
        total.compiled += tally.compiled;
        total.valid += tally.valid;
        total.valid_accepted += tally.valid_accepted;
        total.invalid += tally.invalid;
        total.invalid_rejected += tally.invalid_rejected;
    }
    println!(
        "{:<28} {:>4}/{:<4} {:>6}/{:<7} {:>7}/{:<8}",
        "total",
        total.compiled,
        total.schemas,
        total.valid_accepted,
        total.valid,
        total.invalid_rejected,
        total.invalid
    );
    println!("\nvalid values outside the generated subset of a format ({}):", format_subset_rejections.len());
    for rejection in &format_subset_rejections {
        println!("  {rejection}");
    }
    assert!(mistakes.is_empty(), "{} mistakes:\n{}", mistakes.len(), mistakes.join("\n"));
}

fn collect_json_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_json_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
}

/// The compact texts the engine could generate for `value` under `schema`: object
/// members in the order of the schema's `properties` (one text per `anyOf` branch
/// that orders them differently), integral floats written as integers.
fn serializations(value: &Value, schema: &Value, root: &Value) -> Vec<String> {
    let mut texts: Vec<String> = orderings(value, schema, root, 0).iter().map(canonical_json).collect();
    texts.dedup();
    texts
}

fn orderings(value: &Value, schema: &Value, root: &Value, depth: usize) -> Vec<Value> {
    let Some(map) = schema.as_object().filter(|_| depth < 16) else {
        return vec![value.clone()];
    };
    // A `const`/`enum` value is generated in the order the schema writes it.
    let literals =
        map.get("const").into_iter().chain(map.get("enum").and_then(Value::as_array).into_iter().flatten());
    for literal in literals {
        if literal == value {
            return vec![literal.clone()];
        }
    }
    if let Some(target) = map
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|p| root.pointer(p))
    {
        // Next to other keywords, the target's members come first (as in `allOf`).
        let mut all = orderings(value, target, root, depth + 1);
        if map.len() > 1 {
            let mut rest = map.clone();
            rest.remove("$ref");
            all.extend(orderings(value, &Value::Object(rest), root, depth + 1));
        }
        return all;
    }
    for keyword in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = map.get(keyword).and_then(Value::as_array) {
            let mut all: Vec<Value> =
                branches.iter().flat_map(|b| orderings(value, b, root, depth + 1)).collect();
            all.truncate(8);
            if !all.is_empty() {
                return all;
            }
        }
    }
    match value {
        Value::Object(members) => {
            let properties = map.get("properties").and_then(Value::as_object);
            let mut ordered = Map::new();
            if let Some(properties) = properties {
                for (key, sub) in properties {
                    if let Some(v) = members.get(key) {
                        ordered.insert(key.clone(), orderings(v, sub, root, depth + 1).swap_remove(0));
                    }
                }
            }
            // Undeclared members that `dependentRequired` requires of present ones come
            // next, in the order it lists them (the engine generates them as required).
            let dependencies = map.get("dependentRequired").and_then(Value::as_object).into_iter().flatten();
            for (_, needed) in dependencies.filter(|(d, _)| members.contains_key(*d)) {
                for key in needed.as_array().into_iter().flatten().filter_map(Value::as_str) {
                    if let (false, Some(v)) = (ordered.contains_key(key), members.get(key)) {
                        ordered.insert(key.to_string(), v.clone());
                    }
                }
            }
            for (key, v) in members {
                if !ordered.contains_key(key) {
                    ordered.insert(key.clone(), v.clone());
                }
            }
            vec![Value::Object(ordered)]
        }
        Value::Array(items) => {
            let prefix = map.get("prefixItems").and_then(Value::as_array);
            let rest = map.get("items");
            let ordered = items
                .iter()
                .enumerate()
                .map(|(i, v)| match prefix.and_then(|p| p.get(i)).or(rest) {
                    Some(sub) => orderings(v, sub, root, depth + 1).swap_remove(0),
                    None => v.clone(),
                })
                .collect();
            vec![Value::Array(ordered)]
        }
        _ => vec![value.clone()],
    }
}
