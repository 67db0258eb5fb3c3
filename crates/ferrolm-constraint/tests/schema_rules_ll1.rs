//! The rules a JSON Schema compiles to run exactly: at every state of every rule one
//! byte decides between the rule's own text, a call and a return (LL(1), the check
//! GBNF grammars pass when built). Checked on every real-world schema of the corpus
//! and every schema of the JSON-Schema-Test-Suite that compiles, with both readings of
//! an absent `additionalProperties`.

mod common;

use std::path::Path;

use common::small_vocab;
use ferrolm_constraint::json_schema::JsonSchemaOptions;
use ferrolm_constraint::Grammar;
use serde_json::Value;

fn schemas() -> Vec<(String, String)> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(data.join("schemastore/schemas")).unwrap() {
        let path = entry.unwrap().path();
        out.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
    }
    for entry in std::fs::read_dir(data.join("json-schema-test-suite/draft2020-12")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let groups: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for (i, group) in groups.as_array().unwrap().iter().enumerate() {
            out.push((format!("{}#{i}", path.display()), group["schema"].to_string()));
        }
    }
    out
}

#[test]
fn compiled_schema_rules_are_ll1() {
    let (vocab, _) = small_vocab(&[]);
    let (mut recursive, mut conflicts) = (0, Vec::new());
    for strict in [false, true] {
        let options = JsonSchemaOptions { strict, ..JsonSchemaOptions::default() };
        for (name, schema) in schemas() {
            let Ok(grammar) = Grammar::from_json_schema(vocab.clone(), &schema, &options) else { continue };
            recursive += usize::from(grammar.is_recursive());
            if let Some(conflict) = grammar.ll1_conflict() {
                conflicts.push(format!("{name} (strict {strict}): {conflict}"));
            }
        }
    }
    assert!(recursive > 100, "only {recursive} recursive grammars checked");
    assert!(conflicts.is_empty(), "{conflicts:#?}");
}
