//! Times one decode step's attention over every layer of a small GQA model (SmolLM2-135M's
//! shape: 9 query heads, 3 KV heads, head dim 64, 30 layers), f16 pools, contiguous slots,
//! inside a rayon pool as the CPU model runs it. With a third argument, each request
//! brings that many new tokens (a prefill chunk over `context` cached ones).
//! `cargo run --release -p ferrolm-core --example decode_attention -- [batch] [context] [new]`

use std::time::Instant;

use ferrolm_core::attention::{attend, f16, Geometry, Options, Step};

const GEOMETRY: Geometry = Geometry { num_heads: 9, num_kv_heads: 3, head_dim: 64 };
const LAYERS: usize = 30;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let batch = args.first().copied().unwrap_or(1);
    let context = args.get(1).copied().unwrap_or(2048);
    let new = args.get(2).copied().unwrap_or(1).max(1);
    let row = GEOMETRY.num_kv_heads * GEOMETRY.head_dim;
    let per_request = context + new - 1; // the cached tokens and the new ones but the last's own
    let slots = batch * (per_request + 1);
    let pools: Vec<(Vec<f16>, Vec<f16>)> = (0..LAYERS)
        .map(|l| {
            let k = (0..slots * row).map(|i| f16::from_f32(((i * 7 + l) % 13) as f32 * 0.05 - 0.3)).collect();
            let v =
                (0..slots * row).map(|i| f16::from_f32(((i * 5 + l) % 11) as f32 * 0.05 - 0.25)).collect();
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
    let mut total = 0u64;
    for _ in 0..20 {
        let t = Instant::now();
        for (k, v) in &pools {
            for p in [k, v] {
                total = total.wrapping_add(p.iter().map(|x| x.to_bits() as u64).sum::<u64>());
            }
        }
        reads.push(t.elapsed().as_secs_f64() * 1e3);
    }
    reads.sort_by(|a, b| a.total_cmp(b));
    println!("a plain read of the pools: {:.3} ms ({total})", reads[10]);
    let kv_bytes = (LAYERS * batch * context * row * 2 * 2) as f64;
    let ms = times[times.len() / 2];
    println!(
        "B={batch} ctx={context} new={new}: {ms:.3} ms for {LAYERS} layers ({:.1} GB/s of KV), checksum {:.4}",
        kv_bytes / ms / 1e6,
        out.iter().sum::<f32>()
    );
}
