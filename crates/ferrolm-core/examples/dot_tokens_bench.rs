//! Times the quantized products on one thread: a 1536 x 576 matrix (SmolLM2-135M's MLP
//! up projection) of each 32-weight type, by 1 token (`dot_row` per row: the portable
//! reference's shape) and by 1, 2, 4, 8 and 16 tokens in one `dot_rows` call (a decode
//! step, a draft's verification, a decode batch). Prints nanoseconds per weight block
//! and token.
//! `cargo run --release -p ferrolm-core --example dot_tokens_bench`

use std::time::Instant;

use ferrolm_core::quant::dot::{dot_row, dot_rows, quantize_activations};
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
        let ways = [("dot_row", 1usize), ("dot_rows", 1), ("dot_rows", 2), ("dot_rows", 4), ("dot_rows", 8)];
        for (way, tokens) in ways.into_iter().chain([("dot_rows", 16)]) {
            let acts: Vec<_> = (0..tokens)
                .map(|t| {
                    let x: Vec<f32> = (0..cols).map(|i| ((i * 7 + t * 3) % 19) as f32 * 0.1 - 0.9).collect();
                    quantize_activations(ty.activation_format(), &x)
                })
                .collect();
            let mut out = vec![0f32; rows * tokens];
            let mut best = f64::MAX;
            let mut check = 0f32;
            for _ in 0..30 {
                let t = Instant::now();
                if way == "dot_row" {
                    for row in w.chunks_exact(row_bytes) {
                        check += dot_row(ty, row, &acts[0], &mut []);
                    }
                } else {
                    dot_rows(ty, &w, row_bytes, &acts, &mut [], &mut out);
                    check += out[0];
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let blocks = rows * cols / ty.block_elems() * tokens;
            let ns = best * 1e9 / blocks as f64;
            println!("{ty} {way:<10} x {tokens:>2} tokens: {ns:.2} ns per block-token ({check:.1})");
        }
    }
}
