//! Compile time and regex size of nested-array/object schemas by depth (a probe of how
//! grammar size grows with nesting): `cargo run --release --example nesting_probe -- 10 15 20`.
use std::sync::Arc;
use std::time::Instant;

use ferrolm_constraint::json_schema::{json_schema_to_regex, JsonSchemaOptions};
use ferrolm_constraint::{Grammar, Vocabulary};

fn nested(kind: &str, depth: usize) -> String {
    let mut schema = r#"{"type":"string"}"#.to_string();
    for _ in 0..depth {
        schema = match kind {
            "array" => format!(r#"{{"type":"array","items":{schema}}}"#),
            "contains" => format!(r#"{{"type":"array","items":{schema},"contains":{schema}}}"#),
            _ => format!(
                r#"{{"type":"object","properties":{{"a":{schema},"b":{{"type":"integer"}}}},"required":["a"]}}"#
            ),
        };
    }
    schema
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).chain([b"<eos>".to_vec()]).collect();
    let vocab = Arc::new(Vocabulary::new(tokens, &[], &[256]).unwrap());
    for arg in std::env::args().skip(1) {
        let depth: usize = arg.parse().expect("a depth");
        let kinds = std::env::var("KINDS").unwrap_or_else(|_| "array,object".into());
        for kind in kinds.split(',') {
            let schema = nested(kind, depth);
            let options = JsonSchemaOptions::default();
            let regex_len = serde_json::from_str(&schema)
                .map_err(|e| e.to_string())
                .and_then(|v| json_schema_to_regex(&v, &options).map_err(|e| e.to_string()))
                .map(|r| r.len().to_string())
                .unwrap_or_else(|_| "-".into());
            let started = Instant::now();
            let result = Grammar::from_json_schema(vocab.clone(), &schema, &options);
            println!(
                "{kind:6} depth {depth:3}: schema {:5} B, main regex {regex_len} B, compile {:8.2} ms, {}, peak RSS {} MiB",
                schema.len(),
                started.elapsed().as_secs_f64() * 1e3,
                match &result {
                    Ok(g) => format!("ok (recursive: {})", g.is_recursive()),
                    Err(e) => format!("error: {e}"),
                },
                rss_kib() >> 10
            );
        }
    }
}
