//! Mask timing on a real vocabulary (a tiktoken file such as `cl100k_base.tiktoken`
//! or `o200k_base.tiktoken` from the `bpe-openai` package's data, gunzipped).
//!
//! ```text
//! cargo run --release --example mask_bench -- path/to/o200k_base.tiktoken
//! ```
//!
//! For each grammar (a regex, a JSON Schema after `schema:`, or `json_object`): compile time, then
//! along a valid document (tokenized greedily, longest token first) the time of a mask
//! by a full trie walk ("walk"), by the uncached fast path ("fresh": loop indexes,
//! built on first use and shared per vocabulary), of a matcher's first fill in a freshly
//! compiled grammar ("first": the mask cache may already hold an equivalent state's
//! mask), and of the same fill again ("again": cached). p50 and p99 over 5 rounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrolm_constraint::tokenizer_files::from_tiktoken;
use ferrolm_constraint::{fill_next_token_bitmask_batch, Grammar, Matcher, Vocabulary};

const CASES: &[(&str, &str, &str)] = &[
    (
        "json-object",
        r#"\{"name":"([^"\\\x00-\x1f]|\\["\\/bfnrt])*","age":(0|[1-9][0-9]*),"email":"[a-z0-9.]+@[a-z0-9]+\.[a-z]{2,}","tags":\[("[a-z]*"(,"[a-z]*")*)?\]\}"#,
        r#"{"name":"Ada Lovelace, née Byron","age":36,"email":"ada@analytical.engine","tags":["math","poetry"]}"#,
    ),
    (
        "date-time",
        r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]Z",
        "2026-11-30T08:15:00Z",
    ),
    (
        "free-line",
        r"[^\n]{0,200}\n",
        "The quick brown fox jumps over the lazy dog, then rests by the river bank.\n",
    ),
    (
        "schema",
        r#"schema:{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"title":{"type":"string"},"author":{"type":"string"},"year":{"type":"integer","minimum":1400,"maximum":2100},"isbn":{"type":"string"},"summary":{"type":"string"},"tags":{"type":"array","items":{"type":"string"},"maxItems":5}},"required":["id","title","author","year","isbn","summary"]}"#,
        r#"{"id":"123e4567-e89b-12d3-a456-426614174000","title":"The Analytical Engine","author":"Ada Lovelace","year":1843,"isbn":"978-0-00-000000-0","summary":"Notes on Menabrea's sketch, with \"Note G\".","tags":["math","computing"]}"#,
    ),
    (
        "json_object",
        "json_object",
        r#"{"id":17,"tags":["a","b"],"owner":{"name":"Ada","langs":[{"n":"en","level":5}]},"ok":true}"#,
    ),
    ("choice", r"(positive|negative|neutral|mixed feelings)", "mixed feelings"),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("FERROLM_TIKTOKEN_FILE").ok())
        .ok_or("usage: mask_bench PATH.tiktoken (or FERROLM_TIKTOKEN_FILE)")?;
    let text = std::fs::read_to_string(&path)?;
    let started = Instant::now();
    let mut builder = from_tiktoken(&text)?;
    let eos = text.lines().count() as u32;
    builder.add_special_token(eos, b"<|endoftext|>".to_vec()).mark_eos(eos);
    let vocab = Arc::new(builder.build()?);
    println!(
        "vocabulary: {} tokens, {} trie nodes, built in {:.1} ms",
        vocab.size(),
        vocab.trie().num_nodes(),
        started.elapsed().as_secs_f64() * 1e3
    );
    full_walk(&vocab)?;
    let columns = ["walk p50", "p99", "fresh p50", "p99", "first p50", "p99", "again p50", "p99"];
    let mut header = format!("{:<12} {:>6} {:>9} {:>6}", "case", "states", "compile", "tokens");
    for column in columns {
        header += &format!(" {column:>9}");
    }
    println!("{header}");
    for &(name, pattern, document) in CASES {
        run_case(&vocab, name, pattern, document)?;
    }
    batch(&vocab)?;
    Ok(())
}

fn compile(
    vocab: &Arc<Vocabulary>,
    pattern: &str,
) -> Result<Arc<Grammar>, ferrolm_constraint::ConstraintError> {
    if pattern == "json_object" {
        return Grammar::json_object(vocab.clone(), &Default::default());
    }
    match pattern.strip_prefix("schema:") {
        Some(schema) => Grammar::from_json_schema(vocab.clone(), schema, &Default::default()),
        None => Grammar::from_regex(vocab.clone(), pattern),
    }
}

fn run_case(
    vocab: &Arc<Vocabulary>,
    name: &str,
    pattern: &str,
    document: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let tokens = greedy_tokenize(vocab, document.as_bytes());
    let mut mask = vec![0u32; vocab.bitmask_words()];
    let (mut compiles, mut full, mut fresh, mut first, mut cached) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut states = 0;
    // Several rounds, each with a freshly compiled grammar (an empty mask cache), so
    // the uncached timings are not one noisy sample each.
    for _ in 0..5 {
        let started = Instant::now();
        let grammar = compile(vocab, pattern)?;
        compiles.push(started.elapsed());
        states = grammar.dfa().num_states();
        let mut matcher = Matcher::new(grammar.clone());
        for &token in &tokens {
            // Uncached masks by state exist for plain grammars only (a recursive one
            // also depends on the stack); its first fills are the uncached figure.
            if !grammar.is_recursive() {
                let t = Instant::now();
                grammar.compute_mask_by_full_walk(matcher.state(), &mut mask)?;
                full.push(t.elapsed());
                let t = Instant::now();
                grammar.compute_mask(matcher.state(), &mut mask)?;
                fresh.push(t.elapsed());
            }
            let t = Instant::now();
            matcher.fill_next_token_bitmask(&mut mask)?;
            first.push(t.elapsed());
            let t = Instant::now();
            matcher.fill_next_token_bitmask(&mut mask)?;
            cached.push(t.elapsed());
            assert!(mask[token as usize / 32] >> (token % 32) & 1 == 1, "{name}: token {token} masked");
            assert!(matcher.accept_token(token));
        }
        assert!(matcher.can_end(), "{name}: document incomplete");
    }
    let mut row =
        format!("{name:<12} {states:>6} {:>9} {:>6}", ms(percentile(&mut compiles, 0.5)), tokens.len());
    for times in [&mut full, &mut fresh, &mut first, &mut cached] {
        if times.is_empty() {
            row += &format!(" {:>9} {:>9}", "-", "-");
        } else {
            row += &format!(" {:>9} {:>9}", us(percentile(times, 0.5)), us(percentile(times, 0.99)));
        }
    }
    println!("{row}");
    Ok(())
}

/// The worst case of a walk: a state from which almost every token is allowed.
fn full_walk(vocab: &Arc<Vocabulary>) -> Result<(), Box<dyn std::error::Error>> {
    let grammar = Grammar::from_regex(vocab.clone(), r"[^\n]*")?;
    let mut mask = vec![0u32; vocab.bitmask_words()];
    let mut best = Duration::MAX;
    for _ in 0..30 {
        let t = Instant::now();
        grammar.compute_mask_by_full_walk(grammar.dfa().start(), &mut mask)?;
        best = best.min(t.elapsed());
    }
    let allowed: u32 = mask.iter().map(|w| w.count_ones()).sum();
    println!(
        "full walk ([^\\n]*): best {} for {} allowed tokens, {:.2} ns per trie node",
        us(best),
        allowed,
        best.as_secs_f64() * 1e9 / vocab.trie().num_nodes() as f64
    );
    Ok(())
}

fn batch(vocab: &Arc<Vocabulary>) -> Result<(), Box<dyn std::error::Error>> {
    let (_, pattern, document) = CASES[0];
    let grammar = Grammar::from_regex(vocab.clone(), pattern)?;
    let tokens = greedy_tokenize(vocab, document.as_bytes());
    // 64 requests, each at a different point of the document.
    let matchers: Vec<Matcher> = (0..64)
        .map(|i| {
            let mut m = Matcher::new(grammar.clone());
            for &t in &tokens[..i % tokens.len()] {
                assert!(m.accept_token(t));
            }
            m
        })
        .collect();
    let refs: Vec<&Matcher> = matchers.iter().collect();
    let mut rows = vec![0u32; 64 * vocab.bitmask_words()];
    let t = Instant::now();
    fill_next_token_bitmask_batch(&refs, &mut rows)?;
    let first = t.elapsed();
    let mut times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        fill_next_token_bitmask_batch(&refs, &mut rows)?;
        times.push(t.elapsed());
    }
    println!(
        "batch of 64 (json-object): first {} , cached p50 {}",
        us(first),
        us(percentile(&mut times, 0.5))
    );
    Ok(())
}

/// Longest-match tokenization: not the tokenizer's BPE, but a realistic split.
fn greedy_tokenize(vocab: &Vocabulary, mut text: &[u8]) -> Vec<u32> {
    let mut by_bytes = std::collections::HashMap::new();
    for id in 0..vocab.size() as u32 {
        if vocab.kind(id) == Some(ferrolm_constraint::TokenKind::Normal) {
            by_bytes.entry(vocab.token_bytes(id).unwrap().to_vec()).or_insert(id);
        }
    }
    let mut ids = Vec::new();
    while !text.is_empty() {
        let len = (1..=text.len().min(64))
            .rev()
            .find(|&n| by_bytes.contains_key(&text[..n]))
            .expect("every byte is a token");
        ids.push(by_bytes[&text[..len]]);
        text = &text[len..];
    }
    ids
}

fn percentile(times: &mut [Duration], q: f64) -> Duration {
    times.sort();
    times[((times.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2}ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.1}µs", d.as_secs_f64() * 1e6)
}
