//! Why the JSON Schema translator refuses schemas: each refused schema with its error,
//! then the refusals grouped by keyword, most frequent first. Translation only (no
//! vocabulary, no automata: a schema refused for its size shows up only at compile).
//!
//! ```text
//! cargo run --release --example schema_refusals -- tests/data/schemastore/schemas/*.json
//! ```

use std::collections::BTreeMap;

use ferrolm_constraint::json_schema::{json_schema_to_regex, JsonSchemaOptions};
use ferrolm_constraint::ConstraintError;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = JsonSchemaOptions::default();
    let (mut total, mut refused) = (0usize, 0usize);
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in std::env::args().skip(1) {
        total += 1;
        let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
        let name = std::path::Path::new(&file).file_stem().unwrap_or_default().to_string_lossy().into_owned();
        if let Err(error) = json_schema_to_regex(&schema, &options) {
            refused += 1;
            println!("{name}: {error}");
            let cause = match &error {
                ConstraintError::UnsupportedSchema { keyword, .. } => keyword.clone(),
                other => other.to_string().chars().take(60).collect(),
            };
            groups.entry(cause).or_default().push(name);
        }
    }
    println!("\ntranslated {}/{total}; refusals by cause:", total - refused);
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    for (cause, names) in groups {
        println!("{:4}  {cause}: {}", names.len(), names.join(" "));
    }
    Ok(())
}
