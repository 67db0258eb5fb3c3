//! Times the quantized products on one thread: a 1536 x 576 matrix (SmolLM2-135M's MLP
//! up projection) of each type a Q4_K_M or Q8_0 file of that model holds, by 1 token
//! (`dot_row`, what a decode step runs per row) and by 16 tokens (`dot_tokens`, a decode
//! batch). Prints nanoseconds per weight block and token.
//! `cargo run --release -p ferrolm-core --example dot_tokens_bench`

use std::time::Instant;

use ferrolm_core::quant::dot::{dot_row, dot_tokens, quantize_activations};
use ferrolm_core::quant::QuantType;

fn main() {
    let (rows, cols) = (1536usize, 576usize);
    for ty in [QuantType::Q5_0, QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1] {
        let row_bytes = ty.bytes_for(cols).expect("whole blocks");
        // bytes that decode to finite weights: scales of small f16 values
        let mut w = vec![0u8; rows * row_bytes];
        for (i, b) in w.iter_mut().enumerate() {
            *b = (i * 37 % 251) as u8;
        }
        let block = ty.block_bytes();
        for blk in w.chunks_exact_mut(block) {
            blk[0] = 0x00;
            blk[1] = 0x20; // an f16 scale of about 0.008
            if ty == QuantType::Q4_1 {
                blk[2] = 0x00;
                blk[3] = 0xA0; // an f16 minimum of about -0.008
            }
        }
        for (way, tokens) in [("dot_row", 1usize), ("dot_tokens", 16)] {
            let acts: Vec<_> = (0..tokens)
                .map(|t| {
                    let x: Vec<f32> = (0..cols).map(|i| ((i * 7 + t * 3) % 19) as f32 * 0.1 - 0.9).collect();
                    quantize_activations(ty.activation_format(), &x)
                })
                .collect();
            let mut out = vec![0f32; tokens];
            let mut best = f64::MAX;
            let mut check = 0f32;
            for _ in 0..30 {
                let t = Instant::now();
                match way {
                    "dot_row" => {
                        for row in w.chunks_exact(row_bytes) {
                            check += dot_row(ty, row, &acts[0], &mut []);
                        }
                    }
                    _ => {
                        for row in w.chunks_exact(row_bytes) {
                            dot_tokens(ty, row, &acts, &mut [], &mut out);
                            check += out[0];
                        }
                    }
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let blocks = rows * cols / ty.block_elems() * tokens;
            let ns = best * 1e9 / blocks as f64;
            println!("{ty} {way:<10} x {tokens:>2} tokens: {ns:.2} ns per block-token ({check:.1})");
        }
    }
}
