//! Compile time of JSON Schemas on a real vocabulary, worst first: where the constraint
//! engine spends its compile time, for profiling (`perf record` this example).
//!
//! ```text
//! cargo run --release --example compile_probe -- o200k_base.tiktoken schema.json...
//! ```
//!
//! Schemas compile once each in the order given, in one process (as `ferrolm bench
//! constraint` does: rules shared between schemas are memoized process-wide).
//! `PROBE_STRICT=1` compiles them in strict mode (objects closed where
//! `additionalProperties` is absent), to see what open objects cost.

use std::sync::Arc;
use std::time::Instant;

use ferrolm_constraint::json_schema::JsonSchemaOptions;
use ferrolm_constraint::tokenizer_files::from_tiktoken;
use ferrolm_constraint::Grammar;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some("--regex") {
        // Regexes (one per file): states and CPU time of each DFA alone.
        for file in args.skip(1) {
            let pattern = std::fs::read_to_string(&file)?;
            let cpu_started = thread_cpu_ns();
            let dfa = ferrolm_constraint::ByteDfa::from_regex(pattern.trim_end(), &Default::default());
            let ms = (thread_cpu_ns().unwrap_or(0) - cpu_started.unwrap_or(0)) as f64 / 1e6;
            println!("{file}: {} bytes, {:?} states, {ms:.1} ms", pattern.len(), dfa.map(|d| d.num_states()));
        }
        return Ok(());
    }
    let path = args.next().ok_or("usage: compile_probe PATH.tiktoken SCHEMA.json...")?;
    let text = std::fs::read_to_string(&path)?;
    let mut builder = from_tiktoken(&text)?;
    let eos = text.lines().count() as u32;
    builder.add_special_token(eos, b"<|endoftext|>".to_vec()).mark_eos(eos);
    let vocab = Arc::new(builder.build()?);
    Grammar::prime_json_loops(&vocab); // once per vocabulary, as `GrammarCache::new` does
    let options =
        JsonSchemaOptions { strict: std::env::var_os("PROBE_STRICT").is_some(), ..Default::default() };
    let mut rows = Vec::new();
    let mut kept = Vec::new();
    for file in args {
        let schema = std::fs::read_to_string(&file)?;
        let (started, cpu_started) = (Instant::now(), thread_cpu_ns());
        let result = compile_one(&vocab, &schema, &options);
        // CPU time of this thread where the kernel reports it (steadier on a busy machine).
        let ms = match (cpu_started, thread_cpu_ns()) {
            (Some(a), Some(b)) => (b - a) as f64 / 1e6,
            _ => started.elapsed().as_secs_f64() * 1e3,
        };
        let name = std::path::Path::new(&file).file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let states = result.as_ref().map_or(0, |g| g.num_states());
        rows.push((ms, name, states, result.as_ref().err().map(|e| e.to_string())));
        // Kept, as a server's grammar cache keeps them: each compile writes fresh memory.
        kept.extend(result.ok());
    }
    let mut compiled: Vec<f64> = rows.iter().filter(|r| r.3.is_none()).map(|r| r.0).collect();
    compiled.sort_by(f64::total_cmp);
    if !compiled.is_empty() {
        let pct = |q: f64| compiled[((compiled.len() - 1) as f64 * q).round() as usize];
        println!(
            "compiled {}/{}: p50 {:.2} ms, p95 {:.1} ms, total {:.0} ms",
            compiled.len(),
            rows.len(),
            pct(0.5),
            pct(0.95),
            compiled.iter().sum::<f64>()
        );
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let states: usize = rows.iter().map(|r| r.2).sum();
    println!("states in all {states}");
    for (ms, name, states, error) in rows.iter() {
        let error =
            error.as_deref().map(|e| format!("  ERROR {}", &e[..e.len().min(90)])).unwrap_or_default();
        println!("{ms:9.1} ms {states:7} st  {name}{error}");
    }
    Ok(())
}

/// Nanoseconds this thread has run on a CPU. `clock_gettime` with the thread's CPU
/// clock: exact, where `/proc/thread-self/schedstat` (the fallback) only advances at
/// scheduler ticks on some kernels, which rounded small compiles to 0 or 4 ms.
fn thread_cpu_ns() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn clock_gettime(clock: i32, time: *mut [i64; 2]) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut time = [0i64; 2];
        // SAFETY: `time` is a `struct timespec` (two 64-bit fields on 64-bit Linux).
        if cfg!(target_pointer_width = "64")
            && unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut time) } == 0
        {
            return Some(time[0] as u64 * 1_000_000_000 + time[1] as u64);
        }
    }
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// One compile, not inlined: `valgrind --tool=callgrind --toggle-collect='compile_probe::compile_one'`
/// then counts the compiles alone, not the vocabulary's loading.
#[inline(never)]
fn compile_one(
    vocab: &Arc<ferrolm_constraint::Vocabulary>,
    schema: &str,
    options: &JsonSchemaOptions,
) -> ferrolm_constraint::Result<Arc<Grammar>> {
    Grammar::from_json_schema(vocab.clone(), schema, options)
}
