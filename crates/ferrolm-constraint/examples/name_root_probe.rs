use ferrolm_constraint::json_schema::JsonSchemaOptions;
use ferrolm_constraint::tokenizer_files::from_tiktoken;
use ferrolm_constraint::{Grammar, Matcher};
use std::sync::Arc;
use std::time::Instant;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&args[1])?;
    let mut builder = from_tiktoken(&text)?;
    let eos = text.lines().count() as u32;
    builder.add_special_token(eos, b"<|endoftext|>".to_vec()).mark_eos(eos);
    let vocab = Arc::new(builder.build()?);
    let mut mask = vec![0u32; vocab.bitmask_words()];
    let recursive = args.get(2).is_some_and(|a| a == "open");
    let mut total = std::time::Duration::ZERO;
    for i in 0..300 {
        let extra = if recursive { "" } else { r#","additionalProperties":{"type":"string"}"# };
        let schema = format!(
            r#"{{"type":"object","properties":{{"name{i}":{{"type":"string"}},"age{i}":{{"type":"integer"}}}}{extra}}}"#
        );
        let g = Grammar::from_json_schema(vocab.clone(), &schema, &JsonSchemaOptions::default())?;
        let mut m = Matcher::new(g.clone());
        assert!(m.accept_str("{\""));
        let t = Instant::now();
        m.fill_next_token_bitmask(&mut mask)?;
        if i > 0 {
            total += t.elapsed();
        }
    }
    println!("mean name-root mask {:?}", total / 299);
    Ok(())
}
