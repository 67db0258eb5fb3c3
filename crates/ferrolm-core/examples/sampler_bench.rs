//! Times one sampling call per mode on a row of random logits (no Python).
//! `cargo run --release -p ferrolm-core --example sampler_bench -- [vocab]`

use std::time::Instant;

use ferrolm_core::sampling::{RequestRng, Sampler, SamplingParams};

fn main() {
    let vocab: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(32_000);
    let mut rng = RequestRng::new(1);
    // roughly normal logits with std 3 (sum of uniforms)
    let row: Vec<f32> =
        (0..vocab).map(|_| ((0..4).map(|_| rng.next_f64()).sum::<f64>() - 2.0) as f32 * 5.2).collect();
    let modes: [(&str, SamplingParams); 4] = [
        ("greedy", SamplingParams { temperature: 0.0, ..Default::default() }),
        ("temperature", SamplingParams { temperature: 0.8, ..Default::default() }),
        ("top_p 0.9", SamplingParams { temperature: 0.8, top_p: 0.9, ..Default::default() }),
        ("top_k 50", SamplingParams { temperature: 0.8, top_k: 50, ..Default::default() }),
    ];
    let mut scratch = Vec::new();
    for (name, params) in modes {
        let mut s = Sampler::new(params, &[], 0);
        let mut buf = row.clone();
        let n = 200;
        let t = Instant::now();
        for _ in 0..n {
            buf.copy_from_slice(&row);
            std::hint::black_box(s.sample_with(&mut buf, None, &mut scratch).unwrap());
        }
        println!(
            "{name:>12}: {:8.1} us per call (vocab {vocab})",
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
}
