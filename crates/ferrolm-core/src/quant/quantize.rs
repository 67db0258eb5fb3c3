//! Float weights quantized at load into block formats (`--quantization q8_0|q4_k` on a
//! Hugging Face checkpoint), so that the quantized runner reads 1.06 or 0.56 bytes per
//! weight instead of 4.
//!
//! `Q8_0` rounds as ggml's reference quantizer does (`d = max|x| / 127`). `Q4_K` uses a
//! plain min-max fit per sub-block of 32 (scale and minimum, then both rounded to 6 bits
//! under the super-block's f16 scales, and the codes rounded against the rounded scales):
//! valid blocks that llama.cpp reads, less accurate than its iterative search.

use half::f16;

use super::blocks::{BlockQ4K, QK_K};
use super::dot::quantize_q8_0;
use super::{QuantError, QuantType};

/// `x` (`rows` rows of `cols` floats) as the raw blocks of `ty` (Q8_0 or Q4_K), row after row.
pub fn quantize_rows(ty: QuantType, x: &[f32], cols: usize) -> Result<Vec<u8>, QuantError> {
    let bad = |field, message: String| Err(QuantError { field, message });
    if ty.bytes_for(cols).is_none() || cols == 0 {
        return bad(
            "cols",
            format!("rows of {cols} weights are not whole {ty} blocks of {}", ty.block_elems()),
        );
    }
    if x.len() % cols != 0 {
        return bad("x", format!("{} values are not whole rows of {cols}", x.len()));
    }
    match ty {
        QuantType::Q8_0 => Ok(quantize_q8_0(x)
            .iter()
            .flat_map(|b| b.d.iter().copied().chain(b.qs.iter().map(|&q| q as u8)))
            .collect()),
        QuantType::Q4K => {
            let mut out = Vec::with_capacity(x.len() / QK_K * 144);
            for block in x.chunks_exact(QK_K).map(quantize_q4_k_block) {
                out.extend_from_slice(&block.d);
                out.extend_from_slice(&block.dmin);
                out.extend_from_slice(&block.scales);
                out.extend_from_slice(&block.qs);
            }
            Ok(out)
        }
        _ => bad("ggml_type", format!("weights are quantized to Q8_0 or Q4_K at load, not {ty}")),
    }
}

fn quantize_q4_k_block(x: &[f32]) -> BlockQ4K {
    // each sub-block: w ~= scale * q - min with q in 0..16, min >= 0 (zero always representable)
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let lo = sub.iter().fold(0f32, |m, &v| m.min(v));
        let hi = sub.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        scales[j] = (hi - lo) / 15.0;
        mins[j] = -lo;
    }
    let d = scales.iter().fold(0f32, |m, &v| m.max(v)) / 63.0;
    let dmin = mins.iter().fold(0f32, |m, &v| m.max(v)) / 63.0;
    let (d16, dmin16) = (f16::from_f32(d), f16::from_f32(dmin));
    let (d, dmin) = (d16.to_f32(), dmin16.to_f32());
    let code6 = |v: f32, unit: f32| if unit > 0.0 { (v / unit).round().clamp(0.0, 63.0) as u8 } else { 0 };
    let sc: Vec<u8> = scales.iter().map(|&s| code6(s, d)).collect();
    let m: Vec<u8> = mins.iter().map(|&v| code6(v, dmin)).collect();
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        packed[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        packed[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    let mut qs = [0u8; QK_K / 2];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let (step, offset) = (d * sc[j] as f32, dmin * m[j] as f32);
        for (l, &v) in sub.iter().enumerate() {
            let q = if step > 0.0 { ((v + offset) / step).round().clamp(0.0, 15.0) as u8 } else { 0 };
            qs[32 * (j / 2) + l] |= if j % 2 == 0 { q } else { q << 4 };
        }
    }
    BlockQ4K { d: d16.to_le_bytes(), dmin: dmin16.to_le_bytes(), scales: packed, qs }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    }

    /// Quantized and read back by the dequantizer: each weight within its sub-block's
    /// step (half a step of rounding, plus the 6-bit rounding of scale and minimum).
    #[test]
    fn q4_k_blocks_read_back_within_a_step() {
        let x = weights(4 * QK_K, 7);
        let bytes = quantize_rows(QuantType::Q4K, &x, 2 * QK_K).unwrap();
        assert_eq!(bytes.len(), 4 * 144);
        let mut back = vec![0f32; x.len()];
        crate::quant::dequantize(QuantType::Q4K, &bytes, &mut back).unwrap();
        for (sub, (a, b)) in x.chunks_exact(32).zip(back.chunks_exact(32)).enumerate() {
            let range = a.iter().fold(f32::MIN, |m, &v| m.max(v)) - a.iter().fold(0f32, |m, &v| m.min(v));
            let worst = a.iter().zip(b).map(|(u, v)| (u - v).abs()).fold(0f32, f32::max);
            assert!(worst <= range / 15.0 * 1.2 + 1e-6, "sub-block {sub}: error {worst}, range {range}");
        }
    }

    #[test]
    fn q8_0_blocks_are_the_reference_rounding() {
        let x = weights(64, 3);
        let bytes = quantize_rows(QuantType::Q8_0, &x, 64).unwrap();
        let mut back = vec![0f32; 64];
        crate::quant::dequantize(QuantType::Q8_0, &bytes, &mut back).unwrap();
        for (a, b) in x.chunks_exact(32).zip(back.chunks_exact(32)) {
            let step = a.iter().fold(0f32, |m, &v| m.max(v.abs())) / 127.0;
            assert!(a.iter().zip(b).all(|(u, v)| (u - v).abs() <= step * 0.51));
        }
    }

    #[test]
    fn rows_that_are_not_whole_blocks_are_refused() {
        assert_eq!(quantize_rows(QuantType::Q4K, &[0.0; 128], 128).unwrap_err().field, "cols");
        assert_eq!(quantize_rows(QuantType::Q6K, &[0.0; 256], 256).unwrap_err().field, "ggml_type");
    }
}
