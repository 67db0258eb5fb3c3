//! Each format is checked against a per-weight formula written independently of the
//! block loops (index arithmetic from the layout description, not the same iteration),
//! on random blocks; exact float equality throughout. The Python tests check the same
//! functions against gguf-py's dequantizers on real files.

use half::f16;

use super::blocks::{scale_min_k4, QK_K};
use super::*;

/// xorshift64*: deterministic random bytes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// A finite f16 of moderate size (random bits may be NaN or huge).
    fn scale(&mut self) -> [u8; 2] {
        let v = ((self.next() % 2001) as f32 - 1000.0) / 4096.0;
        f16::from_f32(v).to_le_bytes()
    }
}

fn h(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Random blocks of `ty` with sane f16 scales written over the random bytes at `scales`.
fn random_blocks(rng: &mut Rng, ty: QuantType, n: usize, scales: &[usize]) -> Vec<u8> {
    let mut data = rng.bytes(n * ty.block_bytes());
    for block in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in scales {
            block[at..at + 2].copy_from_slice(&rng.scale());
        }
    }
    data
}

fn dequantized(ty: QuantType, data: &[u8]) -> Vec<f32> {
    let mut out = vec![f32::NAN; data.len() / ty.block_bytes() * ty.block_elems()];
    dequantize(ty, data, &mut out).unwrap();
    out
}

fn check(ty: QuantType, scales: &[usize], weight: impl Fn(&[u8], usize) -> f32) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ty as u64);
    let data = random_blocks(&mut rng, ty, 37, scales);
    let got = dequantized(ty, &data);
    for (b, block) in data.chunks_exact(ty.block_bytes()).enumerate() {
        for i in 0..ty.block_elems() {
            let want = weight(block, i);
            let have = got[b * ty.block_elems() + i];
            assert!(want.to_bits() == have.to_bits(), "{ty} block {b} weight {i}: {have} != {want}");
        }
    }
}

#[test]
fn q8_0_is_code_times_scale() {
    check(QuantType::Q8_0, &[0], |b, i| (b[2 + i] as i8) as f32 * h(b));
}

#[test]
fn q4_0_low_nibbles_first_half_high_nibbles_second() {
    check(QuantType::Q4_0, &[0], |b, i| {
        let byte = b[2 + i % 16];
        let q = if i < 16 { byte & 15 } else { byte >> 4 };
        h(b) * (q as f32 - 8.0)
    });
}

#[test]
fn q4_1_adds_the_minimum() {
    check(QuantType::Q4_1, &[0, 2], |b, i| {
        let byte = b[4 + i % 16];
        let q = if i < 16 { byte & 15 } else { byte >> 4 };
        h(b) * q as f32 + h(&b[2..])
    });
}

/// Bit 4 of weight `i` of a Q5_0/Q5_1 block: bit `i % 8` of byte `i / 8` of `qh` (the
/// little-endian u32's bit `i`).
fn fifth_bit(qh: &[u8], i: usize) -> u8 {
    (qh[i / 8] >> (i % 8)) & 1
}

#[test]
fn q5_0_takes_its_fifth_bit_from_qh_offset_16() {
    check(QuantType::Q5_0, &[0], |b, i| {
        let byte = b[6 + i % 16];
        let low = if i < 16 { byte & 15 } else { byte >> 4 };
        let q = low as i32 + 16 * fifth_bit(&b[2..6], i) as i32;
        (q - 16) as f32 * h(b)
    });
}

#[test]
fn q5_1_takes_its_fifth_bit_from_qh_and_adds_the_minimum() {
    check(QuantType::Q5_1, &[0, 2], |b, i| {
        let byte = b[8 + i % 16];
        let low = if i < 16 { byte & 15 } else { byte >> 4 };
        let q = low + 16 * fifth_bit(&b[4..8], i);
        q as f32 * h(b) + h(&b[2..])
    });
}

/// Scale and min of sub-block `sub` from the 12 packed bytes, bit by bit from the layout:
/// sub-blocks 0..4 use the low 6 bits of bytes `sub` and `sub + 4`; 4..8 take their low
/// nibble from byte `sub + 4` (scale low, min high) and their top 2 bits from bits 6..8
/// of bytes `sub - 4` (scale) and `sub` (min).
fn k4_scale_min(packed: &[u8], sub: usize) -> (f32, f32) {
    let bits = |byte: u8, from: u32, count: u32| ((byte >> from) & ((1 << count) - 1)) as u32;
    let (s, m) = if sub < 4 {
        (bits(packed[sub], 0, 6), bits(packed[sub + 4], 0, 6))
    } else {
        (
            bits(packed[sub + 4], 0, 4) + (bits(packed[sub - 4], 6, 2) << 4),
            bits(packed[sub + 4], 4, 4) + (bits(packed[sub], 6, 2) << 4),
        )
    };
    (s as f32, m as f32)
}

#[test]
fn q4_k_sub_blocks_pair_up_in_nibbles() {
    check(QuantType::Q4K, &[0, 2], |b, i| {
        let sub = i / 32;
        let byte = b[16 + (sub / 2) * 32 + i % 32];
        let q = if sub % 2 == 0 { byte & 15 } else { byte >> 4 };
        let (s, m) = k4_scale_min(&b[4..16], sub);
        (h(b) * s) * q as f32 - h(&b[2..]) * m
    });
}

#[test]
fn q5_k_takes_its_fifth_bit_from_qh() {
    check(QuantType::Q5K, &[0, 2], |b, i| {
        let sub = i / 32;
        let byte = b[48 + (sub / 2) * 32 + i % 32];
        let low = if sub % 2 == 0 { byte & 15 } else { byte >> 4 };
        let high = (b[16 + i % 32] >> sub) & 1;
        let (s, m) = k4_scale_min(&b[4..16], sub);
        (h(b) * s) * (low + 16 * high) as f32 - h(&b[2..]) * m
    });
}

#[test]
fn q6_k_six_bits_offset_32_with_signed_scales() {
    check(QuantType::Q6K, &[208], |b, i| {
        let (half, r) = (i / 128, i % 128);
        let (k, l) = (r / 32, r % 32);
        let ql = b[64 * half + l + 32 * (k % 2)];
        let low = if k < 2 { ql & 15 } else { ql >> 4 };
        let high = (b[128 + 32 * half + l] >> (2 * k)) & 3;
        let scale = b[192 + 8 * half + l / 16 + 2 * k] as i8;
        (h(&b[208..]) * scale as f32) * ((low | (high << 4)) as i32 - 32) as f32
    });
}

#[test]
fn float_types_widen_exactly() {
    let values = [0.0f32, -0.0, 1.5, -2.25, 65504.0, 1e-7, f32::INFINITY];
    let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(dequantized(QuantType::F32, &f32_bytes), values);
    let f16_bytes: Vec<u8> = values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
    let want: Vec<f32> = values.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    assert_eq!(dequantized(QuantType::F16, &f16_bytes), want);
    let bf16_bytes: Vec<u8> =
        values.iter().flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes()).collect();
    let want: Vec<f32> = values.iter().map(|v| f32::from_bits(v.to_bits() & 0xFFFF_0000)).collect();
    assert_eq!(dequantized(QuantType::BF16, &bf16_bytes), want);
}

#[test]
fn packed_scales_round_trip() {
    // pack 8 six-bit (scale, min) pairs the way the layout describes, then read them back
    let pairs: Vec<(u8, u8)> = (0..8).map(|j| ((j * 9 + 5) % 64, (j * 23 + 61) % 64)).collect();
    let mut packed = [0u8; 12];
    for (j, &(s, m)) in pairs.iter().enumerate() {
        if j < 4 {
            packed[j] |= s;
            packed[j + 4] |= m;
        } else {
            packed[j + 4] = (s & 15) | ((m & 15) << 4);
            packed[j - 4] |= (s >> 4) << 6;
            packed[j] |= (m >> 4) << 6;
        }
    }
    for (j, &pair) in pairs.iter().enumerate() {
        assert_eq!(scale_min_k4(j, &packed), pair, "sub-block {j}");
    }
}

#[test]
fn threads_give_the_serial_result() {
    let mut rng = Rng(7);
    // more than PARALLEL_FROM weights, and a block count that does not split evenly
    let blocks = (PARALLEL_FROM / QK_K) * 3 + 13;
    let data = random_blocks(&mut rng, QuantType::Q6K, blocks, &[208]);
    let parallel = dequantized(QuantType::Q6K, &data);
    let mut serial = vec![0f32; parallel.len()];
    dequantize_serial(QuantType::Q6K, &data, &mut serial);
    assert!(parallel.iter().zip(&serial).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn lengths_that_do_not_fit_are_errors_naming_the_argument() {
    let mut out = vec![0f32; 32];
    let err = dequantize(QuantType::Q8_0, &[0u8; 33], &mut out).unwrap_err();
    assert_eq!(err.field, "data");
    let err = dequantize(QuantType::Q8_0, &[0u8; 68], &mut out).unwrap_err();
    assert_eq!(err.field, "out");
    assert!(err.message.contains("64"), "{}", err.message);
    assert!(dequantize(QuantType::Q8_0, &[], &mut []).is_ok());
}

#[test]
fn types_are_ggml_ids_with_their_block_sizes() {
    for ty in QuantType::ALL {
        assert_eq!(QuantType::from_ggml(ty as u32), Some(ty));
    }
    assert_eq!(QuantType::from_ggml(12), Some(QuantType::Q4K));
    assert_eq!(QuantType::from_ggml(6), Some(QuantType::Q5_0));
    assert_eq!(QuantType::from_ggml(10), None); // Q2_K: not read
    assert_eq!(QuantType::from_ggml(4), None); // a retired id
    assert_eq!(QuantType::Q4K.bytes_for(512), Some(288));
    assert_eq!(QuantType::Q4K.bytes_for(100), None);
    assert_eq!(QuantType::BF16.bytes_for(3), Some(6));
    assert_eq!(QuantType::Q6K.to_string(), "Q6_K");
}

mod products {
    //! The integer-dot products against a float64 sum over the dequantized weights and
    //! the dequantized (already quantized) activations, which they must equal up to the
    //! float rounding of the per-block scales; and against the exact activations, within
    //! the activation quantization's bound.

    use super::super::blocks::{
        as_blocks, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
    };
    use super::super::dot::*;
    use super::*;

    const SCALES: [(QuantType, &[usize]); 8] = [
        (QuantType::Q8_0, &[0]),
        (QuantType::Q4_0, &[0]),
        (QuantType::Q4_1, &[0, 2]),
        (QuantType::Q5_0, &[0]),
        (QuantType::Q5_1, &[0, 2]),
        (QuantType::Q4K, &[0, 2]),
        (QuantType::Q5K, &[0, 2]),
        (QuantType::Q6K, &[208]),
    ];

    fn activations(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| (rng.next() % 20001) as f32 / 10000.0 - 1.0).collect()
    }

    /// The activations as the kernel sees them, dequantized.
    fn seen(ty: QuantType, x: &[f32]) -> Vec<f32> {
        match ty {
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => {
                quantize_q8_0(x).iter().flat_map(|b| b.qs.map(|q| q as f32 * h(&b.d))).collect()
            }
            QuantType::Q4_1 | QuantType::Q5_1 => {
                quantize_q8_1(x).iter().flat_map(|b| b.qs.map(|q| q as f32 * b.d)).collect()
            }
            QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => {
                quantize_q8_k(x).iter().flat_map(|b| b.qs.map(|q| q as f32 * b.d)).collect()
            }
            _ => x.to_vec(),
        }
    }

    #[test]
    fn integer_dots_equal_the_float_sum_of_what_they_multiply() {
        let (rows, cols, tokens) = (5, 512, 3);
        for (ty, scales) in SCALES {
            let mut rng = Rng(0x51CE ^ ty as u64);
            let w = random_blocks(&mut rng, ty, rows * cols / ty.block_elems(), scales);
            let x = activations(&mut rng, tokens * cols);
            let mut out = vec![f32::NAN; tokens * rows];
            matmul(ty, &w, rows, cols, &x, &mut out).unwrap();
            let wf = dequantized(ty, &w);
            for t in 0..tokens {
                let xt = &x[t * cols..(t + 1) * cols];
                let xq = seen(ty, xt);
                for r in 0..rows {
                    let wr = &wf[r * cols..(r + 1) * cols];
                    let want: f64 = wr.iter().zip(&xq).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let size: f64 = wr.iter().zip(&xq).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let got = out[t * rows + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * size + 1e-9,
                        "{ty} row {r} token {t}: {got} vs {want}"
                    );
                    // against the exact activations: each is off by at most half a step
                    // (max|x| / 254) plus the f16 rounding of a Q8_0 scale
                    let exact: f64 = wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let bound: f64 =
                        wr.iter().map(|&a| (a as f64).abs()).sum::<f64>() * (1.0 / 254.0 + 1.0 / 2048.0);
                    assert!(
                        (got - exact).abs() <= bound * 1.01,
                        "{ty}: {got} vs exact {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    #[test]
    fn float_weights_multiply_in_float() {
        let (rows, cols) = (3, 40);
        let mut rng = Rng(99);
        let x = activations(&mut rng, 2 * cols);
        let wf = activations(&mut rng, rows * cols);
        let bytes: Vec<u8> = wf.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = vec![0f32; 2 * rows];
        matmul(QuantType::F32, &bytes, rows, cols, &x, &mut out).unwrap();
        for t in 0..2 {
            for r in 0..rows {
                let want: f64 = (0..cols).map(|i| (wf[r * cols + i] * x[t * cols + i]) as f64).sum();
                assert_eq!(out[t * rows + r], want as f32);
            }
        }
    }

    #[test]
    fn threads_give_the_serial_result() {
        // over a megabyte of weights: split over threads where the machine has several
        let (rows, cols) = (4096, 512);
        let mut rng = Rng(5);
        let w = random_blocks(&mut rng, QuantType::Q4K, rows * cols / 256, &[0, 2]);
        let x = activations(&mut rng, 2 * cols);
        let mut out = vec![0f32; 2 * rows];
        matmul(QuantType::Q4K, &w, rows, cols, &x, &mut out).unwrap();
        let row_bytes = QuantType::Q4K.bytes_for(cols).unwrap();
        for r in [0, 1, rows / 2 + 3, rows - 1] {
            let mut one = vec![0f32; 2];
            matmul(QuantType::Q4K, &w[r * row_bytes..(r + 1) * row_bytes], 1, cols, &x, &mut one).unwrap();
            assert_eq!(one[0].to_bits(), out[r].to_bits());
            assert_eq!(one[1].to_bits(), out[rows + r].to_bits());
        }
    }

    #[test]
    fn shapes_that_do_not_fit_name_the_argument() {
        let mut out = vec![0f32; 2];
        let field = |r: Result<(), QuantError>| r.unwrap_err().field;
        assert_eq!(field(matmul(QuantType::Q4K, &[0; 144], 1, 100, &[0.0; 100], &mut out[..1])), "cols");
        assert_eq!(field(matmul(QuantType::Q4K, &[0; 143], 1, 256, &[0.0; 256], &mut out[..1])), "w");
        assert_eq!(field(matmul(QuantType::Q4K, &[0; 144], 1, 256, &[0.0; 255], &mut out[..1])), "x");
        assert_eq!(field(matmul(QuantType::Q4K, &[0; 144], 1, 256, &[0.0; 256], &mut out)), "out");
        assert!(matmul(QuantType::Q4K, &[0; 144], 1, 256, &[], &mut []).is_ok());
    }

    #[test]
    fn q8_k_folds_the_sign_of_the_largest_value_into_its_scale() {
        let mut x = vec![0.25f32; 256];
        x[7] = -2.0;
        let b = &quantize_q8_k(&x)[0];
        assert_eq!(b.qs[7], -127);
        assert_eq!(b.d, 2.0 / 127.0);
        assert_eq!(b.qs[0], 16); // 0.25 * 127 / 2 = 15.875: d's sign (positive here) keeps x's
        assert_eq!(b.bsums[0], b.qs[..16].iter().map(|&q| q as i16).sum::<i16>());
        assert!(quantize_q8_k(&[0.0; 256])[0].qs.iter().all(|&q| q == 0));
    }

    /// A level's dot and the portable one of raw weight blocks of a type by activations.
    type SimdAndPortable<'a> = dyn Fn(QuantType, &[u8], &[f32]) -> (f32, f32) + 'a;

    /// Random rows of every legacy length up to 41 blocks (every tail of the groups of
    /// four) and k-quant rows of 1..6 super-blocks, from raw random bytes (every code,
    /// Q8_0's -128 included), some blocks' scales zero; then extreme blocks (largest
    /// codes against +-127 activations), where a saturating pair of products would show.
    #[cfg(target_arch = "x86_64")]
    fn compare_level(level: &str, check: &SimdAndPortable<'_>) {
        let mut rng = Rng(0xA5A5 ^ level.len() as u64);
        let legacy = [QuantType::Q8_0, QuantType::Q4_0, QuantType::Q5_0, QuantType::Q4_1, QuantType::Q5_1];
        let k_quants = [QuantType::Q4K, QuantType::Q5K, QuantType::Q6K];
        let mut rows: Vec<(QuantType, usize)> = Vec::new();
        for blocks in 1..=41 {
            rows.extend(legacy.map(|ty| (ty, blocks)));
        }
        for blocks in 1..=6 {
            rows.extend(k_quants.map(|ty| (ty, blocks)));
        }
        for (ty, blocks) in rows {
            let scales = SCALES.iter().find(|(t, _)| *t == ty).unwrap().1;
            let mut w = random_blocks(&mut rng, ty, blocks, scales);
            let mut x = activations(&mut rng, blocks * ty.block_elems());
            if blocks > 2 {
                // a block of zero weight scale, and one of zero activations (scale 0)
                let zero = (rng.next() as usize) % blocks;
                for &at in scales.iter().take(1) {
                    w[zero * ty.block_bytes() + at..][..2].fill(0);
                }
                let quiet = (rng.next() as usize) % (blocks * ty.block_elems() / 32);
                x[quiet * 32..quiet * 32 + 32].fill(0.0);
            }
            let (simd, portable) = check(ty, &w, &x);
            assert_eq!(simd.to_bits(), portable.to_bits(), "{level} {ty} x{blocks}: {simd} vs {portable}");
        }
        for ty in legacy.into_iter().chain(k_quants) {
            let scales = SCALES.iter().find(|(t, _)| *t == ty).unwrap().1;
            for (code_byte, x_value) in [(0xFFu8, 1.0f32), (0xFF, -1.0), (0x80, 1.0), (0x80, -1.0)] {
                let blocks = 9 * 256 / ty.block_elems();
                let mut w = vec![code_byte; blocks * ty.block_bytes()];
                for block in w.chunks_exact_mut(ty.block_bytes()) {
                    for &at in scales {
                        block[at..at + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
                    }
                }
                let x = vec![x_value; blocks * ty.block_elems()];
                let (simd, portable) = check(ty, &w, &x);
                assert_eq!(simd.to_bits(), portable.to_bits(), "{level} {ty} {code_byte:#x} {x_value}");
            }
        }
    }

    /// One level's dot products (the portable ones are safe to call; a SIMD level's only
    /// where the CPU has it).
    struct Dots {
        q8_0: unsafe fn(&[BlockQ8_0], &[BlockQ8_0]) -> f32,
        q4_0: unsafe fn(&[BlockQ4_0], &[BlockQ8_0]) -> f32,
        q5_0: unsafe fn(&[BlockQ5_0], &[BlockQ8_0]) -> f32,
        q4_1: unsafe fn(&[BlockQ4_1], &[BlockQ8_1]) -> f32,
        q5_1: unsafe fn(&[BlockQ5_1], &[BlockQ8_1]) -> f32,
        q4_k: unsafe fn(&[BlockQ4K], &[BlockQ8K]) -> f32,
        q5_k: unsafe fn(&[BlockQ5K], &[BlockQ8K]) -> f32,
        q6_k: unsafe fn(&[BlockQ6K], &[BlockQ8K]) -> f32,
    }

    macro_rules! dots {
        ($($name:ident: $f:path),* $(,)?) => {
            Dots { $($name: $f),* }
        };
    }

    const PORTABLE: Dots = dots! {
        q8_0: dot_q8_0_portable, q4_0: dot_q4_0_portable, q5_0: dot_q5_0_portable,
        q4_1: dot_q4_1_portable, q5_1: dot_q5_1_portable, q4_k: dot_q4_k_portable,
        q5_k: dot_q5_k_portable, q6_k: dot_q6_k_portable,
    };

    /// Weights `w` (raw blocks of `ty`) by `x` quantized as `ty` reads it.
    ///
    /// # Safety
    /// The CPU runs `dots`.
    unsafe fn dot_with(dots: &Dots, ty: QuantType, w: &[u8], x: &[f32]) -> f32 {
        unsafe {
            match ty {
                QuantType::Q8_0 => (dots.q8_0)(as_blocks(w).unwrap(), &quantize_q8_0(x)),
                QuantType::Q4_0 => (dots.q4_0)(as_blocks(w).unwrap(), &quantize_q8_0(x)),
                QuantType::Q5_0 => (dots.q5_0)(as_blocks(w).unwrap(), &quantize_q8_0(x)),
                QuantType::Q4_1 => (dots.q4_1)(as_blocks(w).unwrap(), &quantize_q8_1(x)),
                QuantType::Q5_1 => (dots.q5_1)(as_blocks(w).unwrap(), &quantize_q8_1(x)),
                QuantType::Q4K => (dots.q4_k)(as_blocks(w).unwrap(), &quantize_q8_k(x)),
                QuantType::Q5K => (dots.q5_k)(as_blocks(w).unwrap(), &quantize_q8_k(x)),
                QuantType::Q6K => (dots.q6_k)(as_blocks(w).unwrap(), &quantize_q8_k(x)),
                _ => unreachable!("{ty} has no integer dot"),
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_dots_equal_the_portable_ones_bit_for_bit() {
        use super::super::simd::{avx2, has_avx2};
        if !has_avx2() {
            eprintln!("skipped: this CPU has no AVX2 and F16C");
            return;
        }
        let level = dots! {
            q8_0: avx2::dot_q8_0, q4_0: avx2::dot_q4_0, q5_0: avx2::dot_q5_0, q4_1: avx2::dot_q4_1,
            q5_1: avx2::dot_q5_1, q4_k: avx2::dot_q4_k, q5_k: avx2::dot_q5_k, q6_k: avx2::dot_q6_k,
        };
        // SAFETY: the CPU has AVX2 and F16C
        compare_level("avx2", &|ty, w, x| unsafe {
            (dot_with(&level, ty, w, x), dot_with(&PORTABLE, ty, w, x))
        });
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_vnni_dots_equal_the_portable_ones_bit_for_bit() {
        use super::super::simd::{has_avx512_vnni, vnni};
        if !has_avx512_vnni() {
            eprintln!("skipped: this CPU has no AVX-512 VNNI, VL and BW");
            return;
        }
        let level = dots! {
            q8_0: vnni::dot_q8_0, q4_0: vnni::dot_q4_0, q5_0: vnni::dot_q5_0, q4_1: vnni::dot_q4_1,
            q5_1: vnni::dot_q5_1, q4_k: vnni::dot_q4_k, q5_k: vnni::dot_q5_k, q6_k: vnni::dot_q6_k,
        };
        // SAFETY: the CPU has AVX-512 VNNI, VL and BW, AVX2 and F16C
        compare_level("avx512-vnni", &|ty, w, x| unsafe {
            (dot_with(&level, ty, w, x), dot_with(&PORTABLE, ty, w, x))
        });
    }

    #[test]
    fn dispatched_dots_equal_the_portable_ones() {
        // whatever level this CPU picks, through dot_row as a runner calls it
        let mut rng = Rng(0xD15);
        for (ty, scales) in SCALES {
            let cols = 1536;
            let w = random_blocks(&mut rng, ty, cols / ty.block_elems(), scales);
            let x = activations(&mut rng, cols);
            let got = dot_row(ty, &w, &quantize_activations(ty.activation_format(), &x), &mut []);
            // SAFETY: the portable code runs anywhere
            let want = unsafe { dot_with(&PORTABLE, ty, &w, &x) };
            assert_eq!(got.to_bits(), want.to_bits(), "{ty}");
        }
    }

    /// A several-token kernel: rows of `row_blocks` weight blocks, each token's view of its
    /// activations, the outputs and their stride per row.
    type TokenKernel<W> = for<'a> unsafe fn(&[W], usize, &[&'a [ActGroup]], &mut [f32], usize);
    /// The same for the k-quants, whose activations are their blocks.
    type KTokenKernel<W> = for<'a> unsafe fn(&[W], usize, &[&'a [BlockQ8K]], &mut [f32], usize);

    /// One level's several-token kernels.
    struct TokenDots {
        q8_0: TokenKernel<BlockQ8_0>,
        q4_0: TokenKernel<BlockQ4_0>,
        q5_0: TokenKernel<BlockQ5_0>,
        q4_1: TokenKernel<BlockQ4_1>,
        q5_1: TokenKernel<BlockQ5_1>,
        q4_k: KTokenKernel<BlockQ4K>,
        q5_k: KTokenKernel<BlockQ5K>,
        q6_k: KTokenKernel<BlockQ6K>,
    }

    macro_rules! token_dots {
        ($level:ident) => {
            TokenDots {
                q8_0: $level::dot_tokens_q8_0,
                q4_0: $level::dot_tokens_q4_0,
                q5_0: $level::dot_tokens_q5_0,
                q4_1: $level::dot_tokens_q4_1,
                q5_1: $level::dot_tokens_q5_1,
                q4_k: $level::dot_tokens_q4_k,
                q5_k: $level::dot_tokens_q5_k,
                q6_k: $level::dot_tokens_q6_k,
            }
        };
    }

    /// Weights `w` (raw blocks of `ty`) by each of `xs`, quantized as `ty` reads them.
    ///
    /// # Safety
    /// The CPU runs `dots`.
    unsafe fn tokens_with(dots: &TokenDots, ty: QuantType, w: &[u8], xs: &[Vec<f32>]) -> Vec<f32> {
        fn run<W: Block, A>(
            f: TokenKernel<W>,
            w: &[u8],
            xs: &[Vec<f32>],
            quantize: fn(&[f32]) -> Vec<A>,
            group: fn(&[A]) -> Vec<ActGroup>,
        ) -> Vec<f32> {
            let acts: Vec<Vec<ActGroup>> = xs.iter().map(|x| group(&quantize(x))).collect();
            let views: Vec<&[ActGroup]> = acts.iter().map(Vec::as_slice).collect();
            let mut out = vec![f32::NAN; xs.len()];
            let row: &[W] = as_blocks(w).unwrap();
            // SAFETY: the caller's CPU runs `f`
            unsafe { f(row, row.len(), &views, &mut out, xs.len()) };
            out
        }
        fn run_k<W: Block>(f: KTokenKernel<W>, w: &[u8], xs: &[Vec<f32>]) -> Vec<f32> {
            let acts: Vec<Vec<BlockQ8K>> = xs.iter().map(|x| quantize_q8_k(x)).collect();
            let slices: Vec<&[BlockQ8K]> = acts.iter().map(|a| a.as_slice()).collect();
            let mut out = vec![f32::NAN; xs.len()];
            let row: &[W] = as_blocks(w).unwrap();
            // SAFETY: the caller's CPU runs `f`
            unsafe { f(row, row.len(), &slices, &mut out, xs.len()) };
            out
        }
        match ty {
            QuantType::Q8_0 => run(dots.q8_0, w, xs, quantize_q8_0, ActGroup::of_q8_0),
            QuantType::Q4_0 => run(dots.q4_0, w, xs, quantize_q8_0, ActGroup::of_q8_0),
            QuantType::Q5_0 => run(dots.q5_0, w, xs, quantize_q8_0, ActGroup::of_q8_0),
            QuantType::Q4_1 => run(dots.q4_1, w, xs, quantize_q8_1, ActGroup::of_q8_1),
            QuantType::Q5_1 => run(dots.q5_1, w, xs, quantize_q8_1, ActGroup::of_q8_1),
            QuantType::Q4K => run_k(dots.q4_k, w, xs),
            QuantType::Q5K => run_k(dots.q5_k, w, xs),
            QuantType::Q6K => run_k(dots.q6_k, w, xs),
            _ => unreachable!("{ty} has no integer dot"),
        }
    }

    /// A level's several-token kernels against the portable one-token dots, bit for bit:
    /// 1..9 tokens, legacy rows of 1..10, 13, 16..18, 21 and 48 blocks (every tail of the
    /// groups of eight and four),
    /// k-quant rows of 1..3 super-blocks, raw random codes and some zero scales.
    #[cfg(target_arch = "x86_64")]
    fn compare_tokens(level: &str, dots: &TokenDots) {
        let mut rng = Rng(0x70C5 ^ level.len() as u64);
        for (ty, scales) in SCALES {
            let lengths: &[usize] = if ty.block_elems() == QK_K {
                &[1, 2, 3]
            } else {
                &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 16, 17, 18, 21, 48]
            };
            for &blocks in lengths {
                let mut w = random_blocks(&mut rng, ty, blocks, scales);
                if blocks > 2 {
                    let zero = (rng.next() as usize) % blocks;
                    w[zero * ty.block_bytes() + scales[0]..][..2].fill(0);
                }
                for tokens in 1..=9 {
                    let xs: Vec<Vec<f32>> =
                        (0..tokens).map(|_| activations(&mut rng, blocks * ty.block_elems())).collect();
                    // SAFETY: the caller checked the CPU runs `dots`; the portable code runs anywhere
                    let got = unsafe { tokens_with(dots, ty, &w, &xs) };
                    for (t, x) in xs.iter().enumerate() {
                        // SAFETY: the portable code runs anywhere
                        let want = unsafe { dot_with(&PORTABLE, ty, &w, x) };
                        assert_eq!(
                            got[t].to_bits(),
                            want.to_bits(),
                            "{level} {ty} x{blocks}, token {t} of {tokens}: {} vs {want}",
                            got[t]
                        );
                    }
                }
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_token_dots_equal_the_portable_ones_bit_for_bit() {
        use super::super::simd::{avx2, has_avx2};
        if !has_avx2() {
            eprintln!("skipped: this CPU has no AVX2 and F16C");
            return;
        }
        compare_tokens("avx2", &token_dots!(avx2));
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_vnni_token_dots_equal_the_portable_ones_bit_for_bit() {
        use super::super::simd::{has_avx512_vnni, vnni};
        if !has_avx512_vnni() {
            eprintln!("skipped: this CPU has no AVX-512 VNNI, VL and BW");
            return;
        }
        compare_tokens("avx512-vnni", &token_dots!(vnni));
    }

    #[test]
    fn dot_rows_equals_dot_row_for_every_row_and_token() {
        // at the level this CPU picks: several rows in one call, across the groups of
        // tokens (16), every quantized format (rows of legacy blocks ending in a part
        // group of eight) and float rows
        let mut rng = Rng(0x7E57);
        let all = SCALES.iter().copied().chain([(QuantType::F32, &[][..]), (QuantType::F16, &[][..])]);
        for (ty, scales) in all {
            let cols = match ty.block_elems() {
                QK_K => 768,
                1 => 224,
                _ => 576,
            };
            let rows = 5;
            let row_bytes = ty.bytes_for(cols).unwrap();
            let w: Vec<u8> = if ty.block_elems() == 1 {
                activations(&mut rng, rows * cols)
                    .iter()
                    .flat_map(|&v| {
                        if ty == QuantType::F32 {
                            v.to_le_bytes().to_vec()
                        } else {
                            f16::from_f32(v).to_le_bytes().to_vec()
                        }
                    })
                    .collect()
            } else {
                random_blocks(&mut rng, ty, rows * cols / ty.block_elems(), scales)
            };
            for tokens in (1..=9).chain([16, 17, 31, 33]) {
                let acts: Vec<Activations> = (0..tokens)
                    .map(|_| quantize_activations(ty.activation_format(), &activations(&mut rng, cols)))
                    .collect();
                let mut scratch = vec![0f32; cols];
                let mut out = vec![f32::NAN; rows * tokens];
                dot_rows(ty, &w, row_bytes, &acts, &mut scratch, &mut out);
                for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                    for (t, a) in acts.iter().enumerate() {
                        let want = dot_row(ty, row, a, &mut scratch);
                        assert_eq!(
                            out[r * tokens + t].to_bits(),
                            want.to_bits(),
                            "{ty} row {r} token {t} of {tokens}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn activations_quantized_for_one_token_dot_as_the_others() {
        let mut rng = Rng(0xA10E);
        for (ty, scales) in SCALES {
            let cols = if ty.block_elems() == QK_K { 512 } else { 576 };
            let row_bytes = ty.bytes_for(cols).unwrap();
            let w = random_blocks(&mut rng, ty, 3 * cols / ty.block_elems(), scales);
            let x = activations(&mut rng, cols);
            let (mut alone, mut regrouped) = ([0f32; 3], [0f32; 3]);
            dot_rows(
                ty,
                &w,
                row_bytes,
                &[quantize_activations_alone(ty.activation_format(), &x)],
                &mut [],
                &mut alone,
            );
            dot_rows(
                ty,
                &w,
                row_bytes,
                &[quantize_activations(ty.activation_format(), &x)],
                &mut [],
                &mut regrouped,
            );
            assert_eq!(alone.map(f32::to_bits), regrouped.map(f32::to_bits), "{ty}");
        }
    }

    #[test]
    #[should_panic(expected = "activations quantized for one token, given with others")]
    fn activations_quantized_for_one_token_are_refused_with_others() {
        let mut rng = Rng(0xA10F);
        let ty = QuantType::Q4_1;
        let w = random_blocks(&mut rng, ty, 576 / 32, &[0, 2]);
        let acts: Vec<Activations> = (0..2)
            .map(|_| quantize_activations_alone(ty.activation_format(), &activations(&mut rng, 576)))
            .collect();
        dot_rows(ty, &w, w.len(), &acts, &mut [], &mut [0.0; 2]);
    }

    #[test]
    fn round_away_is_roundf_on_what_quantizers_round() {
        // every f32 from -256 to 256 at a fine stride, the halves and their neighbours,
        // and values far out (still below 2^31)
        let mut values: Vec<f32> = (-2_560_000..=2_560_000).map(|i| i as f32 * 1e-4).collect();
        for k in -300..=300 {
            let half = k as f32 + 0.5;
            values.extend([half, f32::from_bits(half.to_bits() - 1), f32::from_bits(half.to_bits() + 1)]);
        }
        values.extend([0.49999997, -0.49999997, 8388607.5, -8388607.5, 1e9, -1e9, 2.1e9, -2.1e9, 0.0, -0.0]);
        for v in values {
            assert_eq!(round_away(v), v.round() as i32, "{v:e}");
        }
        assert_eq!(round_away(f32::NAN), 0);
    }
}
