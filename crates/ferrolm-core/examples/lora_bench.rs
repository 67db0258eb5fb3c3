//! Times the LoRA update of one decode step of SmolLM2-135M's shapes (30 layers, hidden
//! 576, 9 + 3 heads of 64, MLP 1536): every layer's seven projections for `--tokens`
//! decode tokens spread over `--adapters` adapters of rank `--rank`, on a pool of 1 and
//! of 2 threads. Prints the time per step and the adapters' bytes read per step.
//! `cargo run --release -p ferrolm-core --example lora_bench [tokens adapters rank]`

use std::time::Instant;

use ferrolm_core::lora::{apply, Adapter, LoraShape, Target, TokenGroup};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("a number")).collect();
    let (tokens, adapters, rank) = (
        args.first().copied().unwrap_or(16),
        args.get(1).copied().unwrap_or(4),
        args.get(2).copied().unwrap_or(16),
    );
    let shape = LoraShape { layers: 30, hidden: 576, q_dim: 576, kv_dim: 192, intermediate: 1536 };
    let made: Vec<Adapter> = (0..adapters)
        .map(|n| {
            let mut parts = Vec::new();
            for layer in 0..shape.layers {
                for t in Target::ALL {
                    let (i, o) = shape.dims(t);
                    let a = (0..rank * i).map(|k| ((k * 7 + n) % 13) as f32 * 0.01 - 0.06).collect();
                    let b = (0..o * rank).map(|k| ((k * 5 + n) % 11) as f32 * 0.01 - 0.05).collect();
                    parts.push((layer, t, rank, a, b, 2.0));
                }
            }
            Adapter::from_parts(&shape, parts).expect("fits")
        })
        .collect();
    let per = tokens / adapters;
    let groups: Vec<TokenGroup<'_>> = made
        .iter()
        .enumerate()
        .map(|(n, a)| TokenGroup { adapter: a, tokens: n * per..(n + 1) * per })
        .collect();
    let bytes: usize = made.iter().map(Adapter::bytes).sum();
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut best = f64::MAX;
        pool.install(|| {
            let mut xs = Vec::new();
            let mut outs = Vec::new();
            for t in Target::ALL {
                let (i, o) = shape.dims(t);
                xs.push(vec![0.1f32; tokens * i]);
                outs.push(vec![0f32; tokens * o]);
            }
            for _ in 0..20 {
                let t0 = Instant::now();
                for layer in 0..shape.layers {
                    for (k, t) in Target::ALL.into_iter().enumerate() {
                        let (i, o) = shape.dims(t);
                        apply(layer, t, &xs[k], i, &mut outs[k], o, &groups);
                    }
                }
                best = best.min(t0.elapsed().as_secs_f64());
            }
        });
        println!(
            "{threads} thread(s): {tokens} tokens over {adapters} adapters of rank {rank}: {:.2} ms a step, {:.1} MB of adapters ({:.1} GB/s)",
            best * 1e3,
            bytes as f64 / 1e6,
            bytes as f64 / best / 1e9
        );
    }
}
