//! Replays token sequences through the radix tree as an engine would, without Python:
//! per sequence `match_prefix`, `lock`, allocate KV slots for the uncached rest (evicting
//! when the pool is short), `insert`, free duplicate slots, `unlock`. Prints the hit rate,
//! per-operation latency and the tree's memory.
//!
//! Input: one sequence per line, token ids separated by spaces (`-` reads stdin).
//!
//! ```text
//! ferrolm-tree-replay FILE [--capacity N] [--page-size N] [--policy lru|lfu|fifo|mru|filo|priority] [--events] [--check]
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufRead, BufReader};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use ferrolm_core::radix::{EvictionPolicy, RadixTree, TreeConfig};

/// Counts live heap bytes so the report can set the tree's own estimate beside the truth.
struct CountingAlloc;
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

struct Args {
    path: String,
    capacity: usize,
    config: TreeConfig,
    check: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let mut capacity = 1 << 20;
    let mut config = TreeConfig::default();
    let mut check = false;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--capacity" => {
                capacity = value("--capacity")?.parse().map_err(|e| format!("--capacity: {e}"))?
            }
            "--page-size" => {
                config.page_size = value("--page-size")?.parse().map_err(|e| format!("--page-size: {e}"))?
            }
            "--policy" => config.policy = value("--policy")?.parse().map_err(|e| format!("--policy: {e}"))?,
            "--events" => config.kv_events = true,
            "--check" => check = true,
            "-h" | "--help" => return Err(String::new()),
            other if path.is_none() && (!other.starts_with('-') || other == "-") => {
                path = Some(other.to_string())
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    let path = path.ok_or("missing the input file")?;
    Ok(Args { path, capacity, config, check })
}

fn read_sequences(path: &str) -> Result<Vec<Vec<u32>>, String> {
    let reader: Box<dyn BufRead> = if path == "-" {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        Box::new(BufReader::new(std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?))
    };
    let mut out = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| format!("{path}: {e}"))?;
        let seq = line
            .split_whitespace()
            .map(|t| t.parse::<u32>().map_err(|e| format!("{path}:{}: token {t:?}: {e}", n + 1)))
            .collect::<Result<Vec<_>, _>>()?;
        if !seq.is_empty() {
            out.push(seq);
        }
    }
    Ok(out)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

fn run(args: Args) -> Result<(), String> {
    let sequences = read_sequences(&args.path)?;
    let policy: EvictionPolicy = args.config.policy;
    let heap_before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut tree = RadixTree::new(args.config).map_err(|e| e.to_string())?;
    let mut free: Vec<u32> = (0..args.capacity as u32).rev().collect();
    let (mut match_ns, mut insert_ns, mut evict_ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut hit, mut total, mut skipped) = (0usize, 0usize, 0usize);
    let mut events = 0usize;
    let started = Instant::now();
    for seq in &sequences {
        let t = Instant::now();
        let m = tree.match_prefix(seq, None);
        match_ns.push(t.elapsed().as_nanos() as u64);
        tree.lock(m.node).map_err(|e| e.to_string())?;
        let need = seq.len() - m.length;
        if free.len() < need {
            let t = Instant::now();
            free.extend(tree.evict(need - free.len()));
            evict_ns.push(t.elapsed().as_nanos() as u64);
        }
        if free.len() < need {
            skipped += 1; // longer than what the unlocked cache can give back
            tree.unlock(m.node).map_err(|e| e.to_string())?;
            continue;
        }
        hit += m.length;
        total += seq.len();
        let mut slots = m.kv_slots;
        slots.extend(free.drain(free.len() - need..));
        let t = Instant::now();
        let cached = tree.insert(seq, &slots, None, 0).map_err(|e| e.to_string())?;
        insert_ns.push(t.elapsed().as_nanos() as u64);
        free.extend_from_slice(&slots[m.length..cached.max(m.length)]);
        free.extend_from_slice(&slots[seq.len() / tree.config().page_size * tree.config().page_size..]);
        tree.unlock(m.node).map_err(|e| e.to_string())?;
        // drained as a publisher would, so queued events do not count as tree memory
        events += tree.take_events().len();
        if args.check {
            tree.check_invariants()?;
            let held = tree.sizes().total + free.len();
            if held != args.capacity {
                return Err(format!(
                    "KV conservation broken: {held} slots accounted, capacity {}",
                    args.capacity
                ));
            }
        }
    }
    let elapsed = started.elapsed();
    let heap = LIVE_BYTES.load(Ordering::Relaxed) - heap_before;
    let sizes = tree.sizes();
    println!(
        "sequences {} (skipped {skipped}), policy {policy}, capacity {}",
        sequences.len(),
        args.capacity
    );
    println!(
        "hit rate {:.3} ({hit} of {total} tokens), {events} KV events",
        hit as f64 / total.max(1) as f64
    );
    println!(
        "cached tokens {}, nodes {}, wall {:.1} ms",
        sizes.total,
        sizes.nodes,
        elapsed.as_secs_f64() * 1e3
    );
    for (name, v) in [("match_prefix", &mut match_ns), ("insert", &mut insert_ns), ("evict", &mut evict_ns)] {
        v.sort_unstable();
        println!(
            "{name:>13}: n {:>7}  p50 {:>8.2} us  p99 {:>8.2} us",
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.99)
        );
    }
    let per_token = |b: usize| b as f64 / sizes.total.max(1) as f64;
    println!(
        "memory: {:.1} B/token by the tree's count, {:.1} B/token by the allocator (free list excluded)",
        per_token(tree.memory_bytes()),
        per_token(heap.saturating_sub(free.capacity() * 4))
    );
    Ok(())
}

fn main() -> ExitCode {
    match parse_args().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("error: {msg}");
            }
            eprintln!("usage: ferrolm-tree-replay FILE|- [--capacity N] [--page-size N] [--policy NAME] [--events] [--check]");
            ExitCode::from(2)
        }
    }
}
