//! Times one decode step's attention over every layer of a small GQA model (SmolLM2-135M's
//! shape: 9 query heads, 3 KV heads, head dim 64, 30 layers), contiguous slots, inside a
//! rayon pool as the CPU model runs it. With a third argument, each request brings that
//! many new tokens (a prefill chunk over `context` cached ones); the fourth is the pool's
//! type (f16 by default, f32, bf16 or q8_0).
//! `cargo run --release -p ferrolm-core --example decode_attention -- [batch] [context] [new] [type]`

use std::time::Instant;

use ferrolm_core::attention::{attend, bf16, f16, Geometry, KvElem, Options, Step};
use ferrolm_core::quant::blocks::BlockQ8_0;

const GEOMETRY: Geometry = Geometry { num_heads: 9, num_kv_heads: 3, head_dim: 64 };
const LAYERS: usize = 30;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: usize| args.get(i).map_or(default, |a| a.parse().expect("a number"));
    let (batch, context, new) = (number(0, 1), number(1, 2048), number(2, 1).max(1));
    match args.get(3).map_or("f16", String::as_str) {
        "f16" => run::<f16>(batch, context, new),
        "f32" => run::<f32>(batch, context, new),
        "bf16" => run::<bf16>(batch, context, new),
        "q8_0" => run::<BlockQ8_0>(batch, context, new),
        other => panic!("the pool type is f16, f32, bf16 or q8_0, not {other}"),
    }
}

fn run<E: KvElem>(batch: usize, context: usize, new: usize) {
    let row = GEOMETRY.num_kv_heads * GEOMETRY.head_dim;
    let per_request = context + new - 1; // the cached tokens and the new ones but the last's own
    let slots = batch * (per_request + 1);
    let fill = |f: &dyn Fn(usize) -> f32| {
        let values: Vec<f32> = (0..slots * row).map(f).collect();
        let mut pool = E::zeros(values.len());
        E::store(&values, &mut pool, 0);
        pool
    };
    let pools: Vec<(Vec<E>, Vec<E>)> = (0..LAYERS)
        .map(|l| {
            let k = fill(&|i| ((i * 7 + l) % 13) as f32 * 0.05 - 0.3);
            let v = fill(&|i| ((i * 5 + l) % 11) as f32 * 0.05 - 0.25);
            (k, v)
        })
        .collect();
    let positions: Vec<u32> =
        (0..batch).flat_map(|_| (0..new).map(|t| (per_request + 1 - new + t) as u32)).collect();
    let qo: Vec<u32> = (0..=batch).map(|b| (b * new) as u32).collect();
    let kv_slots: Vec<u32> = (0..slots as u32).collect();
    let kv_offsets: Vec<u32> = (0..=batch).map(|b| (b * (per_request + 1)) as u32).collect();
    let step = Step { positions: &positions, qo_offsets: &qo, kv_slots: &kv_slots, kv_offsets: &kv_offsets };
    let width = GEOMETRY.num_heads * GEOMETRY.head_dim;
    let queries: Vec<f32> = (0..batch * new * width).map(|i| (i % 17) as f32 * 0.1 - 0.8).collect();
    let mut out = vec![0f32; batch * new * width];
    let options = Options::new(0.125);
    let pool = rayon::ThreadPoolBuilder::new().build().expect("a pool");
    let mut times = Vec::new();
    for _ in 0..if new > 1 { 8 } else { 60 } {
        let t = Instant::now();
        pool.install(|| {
            for (k, v) in &pools {
                attend(GEOMETRY, &step, &queries, k, v, &options, &mut out).expect("valid");
            }
        });
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let mut reads = Vec::new();
    let mut total = 0f32;
    let mut widened = vec![0f32; slots * row];
    for _ in 0..20 {
        let t = Instant::now();
        for (k, v) in &pools {
            for p in [k, v] {
                E::load(p, 0, &mut widened);
                total += widened[row];
            }
        }
        reads.push(t.elapsed().as_secs_f64() * 1e3);
    }
    reads.sort_by(|a, b| a.total_cmp(b));
    println!("widening the pools into one buffer: {:.3} ms ({total})", reads[10]);
    let kv_bytes = (LAYERS * 2 * std::mem::size_of_val(&pools[0].0[..])) as f64 * context as f64
        / slots as f64
        * batch as f64;
    let ms = times[times.len() / 2];
    println!(
        "{} B={batch} ctx={context} new={new}: {ms:.3} ms for {LAYERS} layers ({:.1} GB/s of KV), checksum {:.4}",
        E::NAME,
        kv_bytes / ms / 1e6,
        out.iter().sum::<f32>()
    );
}
