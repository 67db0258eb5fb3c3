//! Compile time of GBNF grammars, and mask time along a document of each:
//! `cargo run --release --example gbnf_probe -- path/to/o200k_base.tiktoken tests/data/gbnf/*.gbnf`
//! (a first argument not ending in `.gbnf` is a tiktoken file; without one, the 256 bytes).
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use ferrolm_constraint::tokenizer_files::from_tiktoken;
use ferrolm_constraint::{Grammar, Matcher, Vocabulary};

/// A document of each of llama.cpp's grammars.
fn document(name: &str) -> &'static str {
    match name {
        "json" => {
            r#"{"name": "Grace Hopper", "born": 1906, "languages": ["COBOL", "FLOW-MATIC"], "navy": {"rank": "Rear Admiral", "years": [1943, 1986]}, "quote": "It's easier to ask forgiveness than it is to get permission.\n"}"#
        }
        "json_arr" | "json_arr_2023" => {
            "[\n{\"id\": 1, \"tags\": [\"a\", \"b\"]},\n{\"id\": 2, \"tags\": []}]"
        }
        "arithmetic" => "(alpha+beta) *3 = gamma\nx_1/(y*( 2 ))=z\n",
        "c" => "int fact(int n){if(n<2){return 1;}else{return n*fact(n-1);}}",
        "chess" => "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n4. O-O Nf6\n",
        "list" => "- milk\n- eggs, two dozen\n- bread\n",
        "japanese" => "こんにちは 世界\nカタカナです。",
        _ => "Hello, world! This is (mostly) English.",
    }
}

fn load_vocab(path: Option<&str>) -> Arc<Vocabulary> {
    let Some(path) = path else {
        let tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).chain([b"<eos>".to_vec()]).collect();
        return Arc::new(Vocabulary::new(tokens, &[], &[256]).unwrap());
    };
    let text = std::fs::read_to_string(path).expect("a tiktoken file");
    let mut builder = from_tiktoken(&text).unwrap();
    let eos = text.lines().count() as u32;
    builder.add_special_token(eos, b"<|endoftext|>".to_vec()).mark_eos(eos);
    Arc::new(builder.build().unwrap())
}

/// Greedy longest-match tokens of `text`.
fn tokenize(vocab: &Vocabulary, ids: &HashMap<Vec<u8>, u32>, text: &[u8]) -> Vec<u32> {
    let longest =
        (0..vocab.size() as u32).filter_map(|t| vocab.token_bytes(t)).map(<[u8]>::len).max().unwrap_or(1);
    let mut out = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let len =
            (1..=longest.min(text.len() - at)).rev().find(|&n| ids.contains_key(&text[at..at + n])).unwrap();
        out.push(ids[&text[at..at + len]]);
        at += len;
    }
    out
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let vocab_path = (!args.is_empty() && !args[0].ends_with(".gbnf")).then(|| args.remove(0));
    let vocab = load_vocab(vocab_path.as_deref());
    let ids: HashMap<Vec<u8>, u32> =
        (0..vocab.size() as u32).filter_map(|t| vocab.token_bytes(t).map(|b| (b.to_vec(), t))).collect();
    println!("vocabulary: {} tokens", vocab.size());
    println!(
        "{:<16} {:>10} {:>10} {:>6} {:>7} {:>12} {:>12}",
        "grammar", "cold ms", "warm ms", "calls", "tokens", "mask µs cold", "mask µs warm"
    );
    for path in &args {
        let name = std::path::Path::new(path).file_stem().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(path).expect("a grammar file");
        let started = Instant::now();
        let grammar = match Grammar::from_gbnf(vocab.clone(), &text) {
            Ok(grammar) => grammar,
            Err(e) => {
                println!("{name:<16} {e}");
                continue;
            }
        };
        let cold = started.elapsed().as_secs_f64() * 1e3;
        let warm = median(
            (0..10)
                .map(|_| {
                    let started = Instant::now();
                    Grammar::from_gbnf(vocab.clone(), &text).unwrap();
                    started.elapsed().as_secs_f64() * 1e3
                })
                .collect(),
        );
        let tokens = tokenize(&vocab, &ids, document(&name).as_bytes());
        let mut mask = vec![0u32; vocab.bitmask_words()];
        let mut per_pass = Vec::new();
        for _ in 0..2 {
            let mut matcher = Matcher::new(grammar.clone());
            let mut total = 0.0;
            for &token in &tokens {
                let started = Instant::now();
                matcher.fill_next_token_bitmask(&mut mask).unwrap();
                total += started.elapsed().as_secs_f64();
                assert!(matcher.accept_token(token), "{name}: the document is refused");
            }
            assert!(matcher.can_end(), "{name}: the document is not complete");
            per_pass.push(total / tokens.len() as f64 * 1e6);
        }
        println!(
            "{name:<16} {cold:>10.2} {warm:>10.2} {:>6} {:>7} {:>12.1} {:>12.1}",
            if grammar.is_recursive() { "yes" } else { "no" },
            tokens.len(),
            per_pass[0],
            per_pass[1]
        );
    }
}
