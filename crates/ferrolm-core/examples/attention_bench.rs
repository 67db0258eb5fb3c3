//! Times the paged-attention kernel on decode batches over scattered pool slots, with
//! f32 and f16 pools, against reading the same keys and values through a gathered copy
//! (what a gather-then-attend path pays before any arithmetic). No Python.
//! `cargo run --release -p ferrolm-core --example attention_bench -- [threads]`

use std::time::Instant;

use ferrolm_core::attention::{attend, f16, write_kv, Geometry, KvElem, Options, Step};
use ferrolm_core::sampling::RequestRng;

/// The e2e benchmark's model: 8 query heads, 4 KV heads, head dim 32.
const GEOMETRY: Geometry = Geometry { num_heads: 8, num_kv_heads: 4, head_dim: 32 };

struct Batch {
    positions: Vec<u32>,
    qo_offsets: Vec<u32>,
    kv_slots: Vec<u32>,
    kv_offsets: Vec<u32>,
}

/// `requests` decodes of `context` tokens each, their slots scattered over the pool.
fn decode_batch(requests: usize, context: usize, num_slots: usize, rng: &mut RequestRng) -> Batch {
    let mut b = Batch { positions: vec![], qo_offsets: vec![0], kv_slots: vec![], kv_offsets: vec![0] };
    for r in 0..requests {
        b.positions.push((context - 1) as u32);
        b.qo_offsets.push(r as u32 + 1);
        b.kv_slots
            .extend((0..context).map(|_| (rng.next_f64() * num_slots as f64) as u32 % num_slots as u32));
        b.kv_offsets.push(b.kv_slots.len() as u32);
    }
    b
}

fn pool<E: KvElem>(num_slots: usize, rng: &mut RequestRng) -> (Vec<E>, Vec<E>) {
    let row = GEOMETRY.num_kv_heads * GEOMETRY.head_dim;
    let mut k = E::zeros(num_slots * row);
    let mut v = E::zeros(num_slots * row);
    let values: Vec<f32> = (0..num_slots * row).map(|_| rng.next_f64() as f32 - 0.5).collect();
    let slots: Vec<u32> = (0..num_slots as u32).collect();
    write_kv(GEOMETRY, &slots, &values, &values, &mut k, &mut v).expect("a consistent pool");
    (k, v)
}

/// Median microseconds of `f` over `rounds` calls.
fn median_us(rounds: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times[rounds / 2]
}

fn run<E: KvElem>(name: &str, threads: usize) {
    let mut rng = RequestRng::new(7);
    let num_slots = 40_000;
    let (k, v) = pool::<E>(num_slots, &mut rng);
    let row = GEOMETRY.num_kv_heads * GEOMETRY.head_dim;
    let width = GEOMETRY.num_heads * GEOMETRY.head_dim;
    let options = Options { num_threads: threads, ..Options::new((GEOMETRY.head_dim as f32).powf(-0.5)) };
    for (requests, context) in [(1, 4096), (8, 512), (8, 4096), (32, 1024)] {
        let b = decode_batch(requests, context, num_slots, &mut rng);
        let step = Step {
            positions: &b.positions,
            qo_offsets: &b.qo_offsets,
            kv_slots: &b.kv_slots,
            kv_offsets: &b.kv_offsets,
        };
        let queries: Vec<f32> = (0..requests * width).map(|_| rng.next_f64() as f32 - 0.5).collect();
        let mut out = vec![0.0f32; queries.len()];
        let kernel = median_us(31, || {
            attend(GEOMETRY, &step, &queries, &k, &v, &options, &mut out).expect("a consistent step");
        });
        // the copy a gather path makes first: every slot's keys and values, widened to f32
        let mut gathered = vec![0.0f32; b.kv_slots.len() * row * 2];
        let gather = median_us(31, || {
            for (i, &s) in b.kv_slots.iter().enumerate() {
                let (src, dst) = (s as usize * row, i * 2 * row..(i * 2 + 1) * row);
                E::load(&k, src, &mut gathered[dst.clone()]);
                E::load(&v, src, &mut gathered[dst.start + row..dst.end + row]);
            }
            std::hint::black_box(&gathered);
        });
        println!(
            "{name} pool, {requests:>2} decodes x {context:>4} keys: kernel {kernel:8.1} us, gather alone {gather:8.1} us \
             ({:.1}x the kernel)",
            gather / kernel
        );
    }
}

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    run::<f32>("f32", threads);
    run::<f16>("f16", threads);
}
