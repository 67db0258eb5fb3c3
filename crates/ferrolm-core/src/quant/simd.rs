//! x86-64 versions of the block dot products of [`super::dot`] (every quantized type:
//! Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K), at two levels picked at run time:
//! [`avx2`] (AVX2 and F16C) and [`vnni`] (AVX-512 VNNI, VL and BW on 256-bit vectors, as
//! Zen 4 and Ice Lake and later have). One body (`kernels!`) is compiled for each level;
//! the levels differ only in a few integer primitives: byte products (`maddubs` + `madd`
//! against `dpbusd`, `madd` + add against `dpwssd`) and the fifth bits of Q5_0/Q5_1/Q5_K
//! (a compare per byte against an AVX-512 byte mask).
//!
//! Same floats as the portable code, bit for bit (the tests check every level): each
//! block's integer sum is exact, whatever order it is added in, and the float steps of
//! each block run as in the portable code, block after block, with no fused multiply-add.
//! What the vectors buy is the integer work and the float steps that do not depend on
//! the running sum (f16 scales widened with F16C, four blocks' products at once): only
//! the additions to the running sum stay one at a time, in block order.
//!
//! The `dot_tokens_*` kernels multiply rows of weights by several tokens
//! ([`super::dot::dot_rows`]), each token getting the floats of the one-token kernels.
//! The 32-weight formats go eight blocks at a time: a token's activations are regrouped
//! once ([`super::dot::ActGroup`]: bytes 4k..4k + 4 of block j in lane j of vector k) and
//! each group of weight blocks once for every token, so eight byte products sum to eight
//! block totals in eight lanes with no horizontal sums, and the float steps take eight
//! blocks' scales at once. A k-quant super-block is unpacked once (codes with their fifth
//! bits, scales spread over lanes) and applied to each token in turn.
//!
//! Integer tricks, each exact:
//! - `maddubs` and `dpbusd` multiply unsigned by signed bytes. Q8_0's signed weights move
//!   their sign onto the activations (`sign`): |w| <= 128 fits the unsigned operand, and
//!   activation codes are never -128 (the quantizers clamp to +-127), so negating them
//!   cannot wrap.
//! - Q4_0 and Q5_0 multiply the unsigned codes (0..16, 0..32) and subtract the offset
//!   (8, 16) times the activations: `sum((q - o) a) = sum(q a) - sum(o a)`.
//! - Q6_K does the same with its offset 32 per sub-block of 16, taking `sum(a)` from the
//!   activations' `bsums` (which `quantize_q8_k` fills as the sums of its codes).
//! - AVX2's `maddubs` saturates its pairs of products at i16: every use here stays below
//!   (at most 2 * 128 * 127 = 32512 for Q8_0, 2 * 63 * 128 for Q6_K's codes).

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

/// The vector level the dispatching dot products run at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Portable,
    /// AVX2 with F16C.
    Avx2,
    /// AVX-512 VNNI, VL and BW (256-bit `dpbusd`/`dpwssd`, byte masks) on top of AVX2
    /// and F16C.
    Avx512Vnni,
}

/// Whether the CPU has what [`avx2`] needs.
pub fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

/// Whether the CPU has what [`vnni`] needs.
pub fn has_avx512_vnni() -> bool {
    has_avx2()
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
}

/// The best level this CPU runs, detected once: the dot products ask on every row.
#[inline]
pub fn level() -> Level {
    static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
    match LEVEL.load(Ordering::Relaxed) {
        0 => Level::Portable,
        1 => Level::Avx2,
        2 => Level::Avx512Vnni,
        _ => {
            let level = if has_avx512_vnni() {
                Level::Avx512Vnni
            } else if has_avx2() {
                Level::Avx2
            } else {
                Level::Portable
            };
            LEVEL.store(level as u8, Ordering::Relaxed);
            level
        }
    }
}

/// Four f16 values packed little-endian into one 64-bit lane, for `cvtph`.
#[inline]
fn f16x4(h: [[u8; 2]; 4]) -> i64 {
    i64::from_le_bytes([h[0][0], h[0][1], h[1][0], h[1][1], h[2][0], h[2][1], h[3][0], h[3][1]])
}

/// The eight 6-bit scales and mins of a Q4_K/Q5_K super-block (`scale_min_k4` for all
/// sub-blocks at once, on 32-bit words: bytes 0..4 hold the low scales, 4..8 the low mins,
/// 8..12 the high ones' low nibbles, with their top bits in the spare bits 6..8 of 0..8).
#[inline]
fn k4_scales(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([packed[i], packed[i + 1], packed[i + 2], packed[i + 3]]);
    let (w0, w1, w2) = (word(0), word(4), word(8));
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const TOP2: u32 = 0x0303_0303;
    let scales_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let mins_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    let join = |lo: u32, hi: u32| ((lo as u64) | ((hi as u64) << 32)).to_le_bytes();
    (join(w0 & LOW6, scales_hi), join(w1 & LOW6, mins_hi))
}

#[inline]
fn load_i8(v: &[i8; 32]) -> __m256i {
    // SAFETY: 32 readable bytes; loadu has no alignment requirement
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

#[inline]
fn load_u8(v: &[u8; 32]) -> __m256i {
    // SAFETY: as in `load_i8`
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

#[inline]
fn load_half(v: &[u8; 16]) -> __m128i {
    // LLVM otherwise rebuilds this load from overlapping loads of the neighbouring fields
    // and blocks with several shuffles each (Q5_0 ran 40% slower): it cannot see through
    // a pointer that went through an (empty) asm block
    let mut p = v.as_ptr();
    // SAFETY: the asm block is empty: it reads and writes nothing
    unsafe { std::arch::asm!("/* {0} */", inout(reg) p, options(pure, readonly, nostack, preserves_flags)) };
    // SAFETY: 16 readable bytes; loadu has no alignment requirement
    unsafe { _mm_loadu_si128(p.cast()) }
}

#[inline]
fn load_half_i8(v: &[i8; 16]) -> __m128i {
    // SAFETY: as in `load_half`
    unsafe { _mm_loadu_si128(v.as_ptr().cast()) }
}

#[inline]
fn load_i32x8(v: &[i32; 8]) -> __m256i {
    // SAFETY: 32 readable bytes; loadu has no alignment requirement
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

#[inline]
fn load_f32x8(v: &[f32; 8]) -> __m256 {
    // SAFETY: 32 readable bytes; loadu has no alignment requirement
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

#[inline]
fn load_i16(v: &[i16; 16]) -> __m256i {
    // SAFETY: 32 readable bytes; loadu has no alignment requirement
    unsafe { _mm256_loadu_si256(v.as_ptr().cast()) }
}

/// The dot products for one level: `$features` is its `target_feature` list (`$check` the
/// function that tells whether the CPU has them), and the
/// invoking module defines the level's integer primitives:
/// - `dot_u8i8(u, s)`: 8 lanes of i32, each the sum of 4 products of unsigned bytes of
///   `u` by signed bytes of `s` (the callers keep every pair of products within i16);
/// - `dot_offset(q, o, s)`: as `dot_u8i8(q, s) - dot_u8i8(o, s)`;
/// - `dot_acc(acc, u, s)`: `acc` plus `dot_u8i8(u, s)`;
/// - `WIDE_PRODUCTS`: whether `dot_acc` takes any unsigned bytes (no i16 step), so that
///   Q8_0's codes can be made unsigned by an offset of 128;
/// - `madd_acc(acc, x, y)`: `acc` plus the pairwise i32 sums of the i16 products of `x`, `y`;
/// - `codes5(nibbles, qh)`: Q5_0/Q5_1 codes, `nibbles` plus 16 in byte `j` where bit `j`
///   of `qh` (little-endian) is set;
/// - `k5_codes(nibbles, qh, sub)`: Q5_K codes of sub-block `sub`, `nibbles` plus 16 in
///   byte `l` where bit `sub` of byte `l` of `qh` is set.
macro_rules! kernels {
    ($features:literal, $check:ident) => {
        use super::{
            f16x4, k4_scales, load_f32x8, load_half, load_half_i8, load_i16, load_i32x8, load_i8, load_u8,
        };
        use crate::quant::blocks::{
            BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
        };
        use crate::quant::dot::{ActGroup, BlockQ8K, BlockQ8_1};

        /// The totals of four blocks' partial sums, in block order.
        #[inline]
        #[target_feature(enable = $features)]
        fn totals4(v: [__m256i; 4]) -> __m128i {
            // per 128-bit half: [v0 lanes 0..4, v1 .., v2 .., v3 ..], then the halves added
            let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
            _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
        }

        /// The totals of two vectors of partial sums.
        #[inline]
        #[target_feature(enable = $features)]
        fn totals2(x: __m256i, y: __m256i) -> (i32, i32) {
            let h = _mm256_hadd_epi32(x, y);
            let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            let t = _mm_hadd_epi32(s, s);
            (_mm_cvtsi128_si32(t), _mm_extract_epi32::<1>(t))
        }

        /// The first `n` lanes of `terms` (the others zero): a last group of fewer than
        /// four blocks adds nothing to the lanes it does not have. (A lane sum is never
        /// -0.0, so adding +0.0 to it changes nothing.)
        #[inline]
        #[target_feature(enable = $features)]
        fn first_lanes(terms: __m128, n: usize) -> __m128 {
            const KEEP: [[u32; 4]; 4] = [[0; 4], [!0, 0, 0, 0], [!0, !0, 0, 0], [!0, !0, !0, 0]];
            // SAFETY: 16 readable bytes; loadu has no alignment requirement
            _mm_and_ps(terms, unsafe { _mm_loadu_ps(KEEP[n].as_ptr().cast()) })
        }

        /// The four lane sums added as `(l0 + l1) + (l2 + l3)`: the portable code's
        /// [`super::super::dot::lane_sum`].
        #[inline]
        #[target_feature(enable = $features)]
        fn lanes_total(lanes: __m128) -> f32 {
            let pairs = _mm_add_ps(lanes, _mm_movehdup_ps(lanes)); // [l0 + l1, _, l2 + l3, _]
            _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehl_ps(pairs, pairs)))
        }

        /// An f16 widened to f32 (exact), with F16C: the `half` crate asks the CPU each time.
        #[inline]
        #[target_feature(enable = $features)]
        fn half(bytes: [u8; 2]) -> f32 {
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes(bytes) as i32)))
        }

        /// Two times four f16 values widened to f32 (exact).
        #[inline]
        #[target_feature(enable = $features)]
        fn widen(x: [[u8; 2]; 4], y: [[u8; 2]; 4]) -> (__m128, __m128) {
            let both = _mm256_cvtph_ps(_mm_set_epi64x(f16x4(y), f16x4(x)));
            (_mm256_castps256_ps128(both), _mm256_extractf128_ps::<1>(both))
        }

        /// A row of 32-weight blocks, four blocks at a time: `terms` gives the float term of
        /// each of four blocks, block i going to lane i % 4 of the running lane sums (as the
        /// portable `lane_sum`). A last group of fewer than four repeats its last block,
        /// whose extra terms are not added.
        #[inline]
        #[target_feature(enable = $features)]
        fn by_four<W, A>(w: &[W], a: &[A], terms: impl Fn([&W; 4], [&A; 4]) -> __m128) -> f32 {
            let n = w.len().min(a.len());
            let (w4, w_rest) = w[..n].as_chunks::<4>();
            let (a4, a_rest) = a[..n].as_chunks::<4>();
            let mut lanes = _mm_setzero_ps();
            for (w, a) in w4.iter().zip(a4) {
                lanes = _mm_add_ps(lanes, terms(w.each_ref(), a.each_ref()));
            }
            if let Some(last) = w_rest.len().checked_sub(1) {
                // references, not copies: a copied block read back in pieces stalls on
                // store forwarding (a third of the time of a 576-column row, in perf)
                let at = |j: usize| j.min(last);
                let w = [&w_rest[0], &w_rest[at(1)], &w_rest[at(2)], &w_rest[at(3)]];
                let a = [&a_rest[0], &a_rest[at(1)], &a_rest[at(2)], &a_rest[at(3)]];
                lanes = _mm_add_ps(lanes, first_lanes(terms(w, a), w_rest.len()));
            }
            lanes_total(lanes)
        }

        /// `sumi as f32 * (d_w * d_a)` for four blocks whose scales are all f16.
        #[inline]
        #[target_feature(enable = $features)]
        fn scaled(sums: __m128i, dw: [[u8; 2]; 4], da: [[u8; 2]; 4]) -> __m128 {
            let (dw, da) = widen(dw, da);
            _mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_mul_ps(dw, da))
        }

        /// `sumi as f32 * (d_w * a.d) + m_w * a.s` for four blocks against Q8_1.
        #[inline]
        #[target_feature(enable = $features)]
        fn scaled_with_min(sums: __m128i, dw: [[u8; 2]; 4], mw: [[u8; 2]; 4], a: [&BlockQ8_1; 4]) -> __m128 {
            let (dw, mw) = widen(dw, mw);
            let da = _mm_set_ps(a[3].d, a[2].d, a[1].d, a[0].d);
            let sa = _mm_set_ps(a[3].s, a[2].s, a[1].s, a[0].s);
            _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(sums), _mm_mul_ps(dw, da)), _mm_mul_ps(mw, sa))
        }

        /// The 32 nibbles of 16 bytes, in weight order: low nibbles (weights 0..16) then
        /// high ones (16..32).
        #[inline]
        #[target_feature(enable = $features)]
        fn nibbles(qs: &[u8; 16]) -> __m256i {
            // the 16 bytes in both halves, the upper half shifted down 4 bits (no lane
            // crossing shuffle)
            let both = _mm256_broadcastsi128_si256(load_half(qs));
            let shifted = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
            _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q8_0_sums(w: &BlockQ8_0, a: &BlockQ8_0) -> __m256i {
            let (wv, av) = (load_i8(&w.qs), load_i8(&a.qs));
            dot_u8i8(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q4_0_sums(w: &BlockQ4_0, a: &BlockQ8_0) -> __m256i {
            dot_offset(nibbles(&w.qs), _mm256_set1_epi8(8), load_i8(&a.qs))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q5_0_sums(w: &BlockQ5_0, a: &BlockQ8_0) -> __m256i {
            let codes = codes5(nibbles(&w.qs), w.qh);
            dot_offset(codes, _mm256_set1_epi8(16), load_i8(&a.qs))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q4_1_sums(w: &BlockQ4_1, a: &BlockQ8_1) -> __m256i {
            dot_u8i8(nibbles(&w.qs), load_i8(&a.qs))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn q5_1_sums(w: &BlockQ5_1, a: &BlockQ8_1) -> __m256i {
            dot_u8i8(codes5(nibbles(&w.qs), w.qh), load_i8(&a.qs))
        }

        /// `Q8_0` by `Q8_0`. Activation codes must not be -128 (`quantize_q8_0` never makes
        /// one): a -128 gives another sum than the portable code.
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
            by_four(w, a, |w, a| {
                let sums = totals4([
                    q8_0_sums(&w[0], &a[0]),
                    q8_0_sums(&w[1], &a[1]),
                    q8_0_sums(&w[2], &a[2]),
                    q8_0_sums(&w[3], &a[3]),
                ]);
                scaled(sums, [w[0].d, w[1].d, w[2].d, w[3].d], [a[0].d, a[1].d, a[2].d, a[3].d])
            })
        }

        /// `Q4_0` by `Q8_0`.
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
            by_four(w, a, |w, a| {
                let sums = totals4([
                    q4_0_sums(&w[0], &a[0]),
                    q4_0_sums(&w[1], &a[1]),
                    q4_0_sums(&w[2], &a[2]),
                    q4_0_sums(&w[3], &a[3]),
                ]);
                scaled(sums, [w[0].d, w[1].d, w[2].d, w[3].d], [a[0].d, a[1].d, a[2].d, a[3].d])
            })
        }

        /// `Q5_0` by `Q8_0`.
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
            by_four(w, a, |w, a| {
                let sums = totals4([
                    q5_0_sums(&w[0], &a[0]),
                    q5_0_sums(&w[1], &a[1]),
                    q5_0_sums(&w[2], &a[2]),
                    q5_0_sums(&w[3], &a[3]),
                ]);
                scaled(sums, [w[0].d, w[1].d, w[2].d, w[3].d], [a[0].d, a[1].d, a[2].d, a[3].d])
            })
        }

        /// `Q4_1` by `Q8_1`.
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
            by_four(w, a, |w, a| {
                let sums = totals4([
                    q4_1_sums(&w[0], &a[0]),
                    q4_1_sums(&w[1], &a[1]),
                    q4_1_sums(&w[2], &a[2]),
                    q4_1_sums(&w[3], &a[3]),
                ]);
                scaled_with_min(sums, [w[0].d, w[1].d, w[2].d, w[3].d], [w[0].m, w[1].m, w[2].m, w[3].m], a)
            })
        }

        /// `Q5_1` by `Q8_1`.
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
            by_four(w, a, |w, a| {
                let sums = totals4([
                    q5_1_sums(&w[0], &a[0]),
                    q5_1_sums(&w[1], &a[1]),
                    q5_1_sums(&w[2], &a[2]),
                    q5_1_sums(&w[3], &a[3]),
                ]);
                scaled_with_min(sums, [w[0].d, w[1].d, w[2].d, w[3].d], [w[0].m, w[1].m, w[2].m, w[3].m], a)
            })
        }

        /// The `shuffle_epi8` control that spreads i16 lane `lo` of a vector's 128-bit halves
        /// over its low half and lane `hi` over its high half.
        #[inline]
        #[target_feature(enable = $features)]
        fn spread_i16(lo: i8, hi: i8) -> __m256i {
            let bytes = |j: i8| (((2 * j + 1) as i16) << 8) | (2 * j) as i16;
            _mm256_set_m128i(_mm_set1_epi16(bytes(hi)), _mm_set1_epi16(bytes(lo)))
        }

        /// `sum(mins[j] * (bsums[2j] + bsums[2j + 1]))` as 8 partial sums: the weights'
        /// minimums of Q4_K/Q5_K against the activations' sums per 16.
        #[inline]
        #[target_feature(enable = $features)]
        fn k4_min_sums(mins: [u8; 8], bsums: &[i16; 16]) -> __m256i {
            let m = _mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(mins)));
            // each min twice, next to the two sums of its sub-block of 32
            let pairs = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
            _mm256_madd_epi16(load_i16(bsums), pairs)
        }

        /// The integer sums of a Q4_K or Q5_K super-block: `sum(scale * dot(codes, a))` over
        /// its 8 sub-blocks and the minimums' `sum(min * sum(a))`. `fifth` adds bit 4 to
        /// the codes of sub-block `sub` (Q5_K) or nothing (Q4_K).
        #[inline]
        #[target_feature(enable = $features)]
        fn k4_sums(
            qs: &[u8; 128],
            packed: &[u8; 12],
            a: &BlockQ8K,
            fifth: impl Fn(__m256i, i32) -> __m256i,
        ) -> (i32, i32) {
            let (scales, mins) = k4_scales(packed);
            // the 8 scales as i16 in both halves; sub-block j's spread over a vector by a
            // shuffle (cheaper than a broadcast from a general register)
            let scales =
                _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(scales))));
            let splat = |j: i8| _mm256_shuffle_epi8(scales, spread_i16(j, j));
            let aq = a.qs.as_chunks::<32>().0;
            let low = _mm256_set1_epi8(0x0F);
            let mut acc = _mm256_setzero_si256();
            for (pair, q) in qs.as_chunks::<32>().0.iter().enumerate() {
                let q = load_u8(q);
                // each 32 bytes: the low nibbles are sub-block 2 * pair, the high ones the next
                let lo = fifth(_mm256_and_si256(q, low), 2 * pair as i32);
                let hi = fifth(_mm256_and_si256(_mm256_srli_epi16::<4>(q), low), 2 * pair as i32 + 1);
                // codes < 32 by activations: pairs of products stay within i16
                let plo = _mm256_maddubs_epi16(lo, load_i8(&aq[2 * pair]));
                let phi = _mm256_maddubs_epi16(hi, load_i8(&aq[2 * pair + 1]));
                acc = madd_acc(acc, plo, splat(2 * pair as i8));
                acc = madd_acc(acc, phi, splat(2 * pair as i8 + 1));
            }
            totals2(acc, k4_min_sums(mins, &a.bsums))
        }

        /// `Q4_K` by `Q8_K`.
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
            let mut sum = 0f32;
            for (w, a) in w.iter().zip(a) {
                let (sumi, summ) = k4_sums(&w.qs, &w.scales, a, |codes, _| codes);
                sum += (a.d * half(w.d)) * sumi as f32 - (a.d * half(w.dmin)) * summ as f32;
            }
            sum
        }

        /// `Q5_K` by `Q8_K`.
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
            let mut sum = 0f32;
            for (w, a) in w.iter().zip(a) {
                let high = load_u8(&w.qh);
                let fifth = |codes, sub| k5_codes(codes, high, sub);
                let (sumi, summ) = k4_sums(&w.qs, &w.scales, a, fifth);
                sum += (a.d * half(w.d)) * sumi as f32 - (a.d * half(w.dmin)) * summ as f32;
            }
            sum
        }

        /// `Q6_K` by `Q8_K`: unsigned 6-bit codes, then `32 * sum(scale * bsum)` off the
        /// integer sum for the offset.
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
            let mut sum = 0f32;
            let low = _mm256_set1_epi8(0x0F);
            // the i16 scale of sub-block 2k over the low 128 bits (weights 0..16 of a run of
            // 32), that of 2k + 1 over the high ones
            let picks = [spread_i16(0, 1), spread_i16(2, 3), spread_i16(4, 5), spread_i16(6, 7)];
            for (w, a) in w.iter().zip(a) {
                let aq = a.qs.as_chunks::<32>().0;
                let ql = w.ql.as_chunks::<32>().0;
                let qh = w.qh.as_chunks::<32>().0;
                let scales8 = w.scales.as_chunks::<8>().0;
                let mut acc = _mm256_setzero_si256();
                for half_index in 0..2 {
                    let (l0, l1) = (load_u8(&ql[2 * half_index]), load_u8(&ql[2 * half_index + 1]));
                    let h = load_u8(&qh[half_index]);
                    let m = |bits: i8| _mm256_and_si256(h, _mm256_set1_epi8(bits));
                    // weight l + 32k: nibble k / 2 of ql[l + 32 (k % 2)], bits 2k..2k+2 of
                    // qh[l] as bits 4..6
                    let codes = [
                        _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16::<4>(m(0x03))),
                        _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_slli_epi16::<2>(m(0x0C))),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l0), low), m(0x30)),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(l1), low),
                            _mm256_srli_epi16::<2>(m(0xC0_u8 as i8)),
                        ),
                    ];
                    let eight = i64::from_le_bytes(scales8[half_index].map(|s| s as u8));
                    let scales = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_set_epi64x(0, eight)));
                    for (k, codes) in codes.into_iter().enumerate() {
                        // codes < 64 by activations: pairs of products stay within i16
                        let p = _mm256_maddubs_epi16(codes, load_i8(&aq[4 * half_index + k]));
                        acc = madd_acc(acc, p, _mm256_shuffle_epi8(scales, picks[k]));
                    }
                }
                let all_scales = _mm256_cvtepi8_epi16(load_half_i8(&w.scales));
                let offsets = _mm256_madd_epi16(all_scales, load_i16(&a.bsums));
                let acc = _mm256_sub_epi32(acc, _mm256_slli_epi32::<5>(offsets));
                let sumi = totals2(acc, _mm256_setzero_si256()).0;
                sum += (a.d * half(w.d)) * sumi as f32;
            }
            sum
        }

        // ---- several tokens per weight row: each block unpacked once for all of them ----

        /// Rows of `row_blocks` weight blocks each, `run` on each with its outputs
        /// `out[r * stride..][..tokens]` (a group of tokens within a step's).
        #[inline]
        #[target_feature(enable = $features)]
        fn each_row<W>(
            w: &[W],
            row_blocks: usize,
            out: &mut [f32],
            stride: usize,
            tokens: usize,
            mut run: impl FnMut(&[W], &mut [f32]),
        ) {
            for (r, row) in w.chunks_exact(row_blocks).enumerate() {
                run(row, &mut out[r * stride..r * stride + tokens]);
            }
        }

        /// Eight pairs of f16 values, each packed in a u32 (low half, high half), widened
        /// to f32 (exact): the eight low halves, the eight high halves.
        #[inline]
        #[target_feature(enable = $features)]
        fn widen_pairs(v: [u32; 8]) -> (__m256, __m256) {
            let v = v.map(|x| x as i32);
            let v = _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
            // per 128-bit half: the low halves into bytes 0..8, the high ones into 8..16;
            // then 64-bit lanes 0, 2, 1, 3: all low halves, then all high halves
            let split = _mm256_shuffle_epi8(
                v,
                _mm256_setr_epi8(
                    0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6,
                    7, 10, 11, 14, 15,
                ),
            );
            let both = _mm256_permute4x64_epi64::<0b11_01_10_00>(split);
            (
                _mm256_cvtph_ps(_mm256_castsi256_si128(both)),
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(both)),
            )
        }

        /// The first `n` of eight lanes of `terms` (the others zero; see [`first_lanes`]).
        #[inline]
        #[target_feature(enable = $features)]
        fn first_lanes8(terms: __m256, n: usize) -> __m256 {
            const KEEP: [u32; 16] = [!0, !0, !0, !0, !0, !0, !0, !0, 0, 0, 0, 0, 0, 0, 0, 0];
            // SAFETY: n <= 8, so 8 values from 8 - n are inside KEEP; loadu has no
            // alignment requirement
            _mm256_and_ps(terms, unsafe { _mm256_loadu_ps(KEEP.as_ptr().add(8 - n).cast()) })
        }

        /// The 8 x 8 transpose of 32-bit values: vector k of the result holds value k of
        /// each of `rows`, row j in lane j.
        #[inline]
        #[target_feature(enable = $features)]
        fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
            let lo32 = |a, b| _mm256_unpacklo_epi32(a, b);
            let hi32 = |a, b| _mm256_unpackhi_epi32(a, b);
            let (t0, t1, t2, t3) = (lo32(r[0], r[1]), hi32(r[0], r[1]), lo32(r[2], r[3]), hi32(r[2], r[3]));
            let (t4, t5, t6, t7) = (lo32(r[4], r[5]), hi32(r[4], r[5]), lo32(r[6], r[7]), hi32(r[6], r[7]));
            // u_k: values k and k + 4 of rows 0..4 (u0..u3) or 4..8 (u4..u7), per half
            let lo64 = |a, b| _mm256_unpacklo_epi64(a, b);
            let hi64 = |a, b| _mm256_unpackhi_epi64(a, b);
            let u = [lo64(t0, t2), hi64(t0, t2), lo64(t1, t3), hi64(t1, t3)];
            let v = [lo64(t4, t6), hi64(t4, t6), lo64(t5, t7), hi64(t5, t7)];
            let low = |k: usize| _mm256_permute2x128_si256::<0x20>(u[k], v[k]);
            let high = |k: usize| _mm256_permute2x128_si256::<0x31>(u[k], v[k]);
            [low(0), low(1), low(2), low(3), high(0), high(1), high(2), high(3)]
        }

        /// Up to eight blocks' codes (`codes` of each: 32 in weight order) regrouped:
        /// value k of block j in lane j of vector k ([`transpose8`]), zeros for missing
        /// blocks.
        #[inline]
        #[target_feature(enable = $features)]
        fn regroup<W>(blocks: &[W], codes: impl Fn(&W) -> __m256i) -> [__m256i; 8] {
            let n = blocks.len();
            transpose8(std::array::from_fn(
                |j| if j < n { codes(&blocks[j]) } else { _mm256_setzero_si256() },
            ))
        }

        /// [`regroup`] for the 4-bit formats, on the packed bytes: byte i of a block holds
        /// weight i (low nibble) and weight i + 16 (high nibble), so the 4 x 8 transpose
        /// of the blocks' 16 bytes (32-bit value k of block j into lane j of vector k)
        /// holds the low nibbles of vector k and the high ones of vector k + 4: half the
        /// shuffles of unpacking first and transposing 8 x 8.
        #[inline]
        #[target_feature(enable = $features)]
        fn regroup_nibbles<W>(blocks: &[W], qs: impl Fn(&W) -> &[u8; 16]) -> [__m256i; 8] {
            let n = blocks.len();
            let row = |j: usize| if j < n { load_half(qs(&blocks[j])) } else { _mm_setzero_si128() };
            // y_j: block j in the low half, block j + 4 in the high half
            let y: [__m256i; 4] = std::array::from_fn(|j| _mm256_set_m128i(row(j + 4), row(j)));
            let (t0, t1) = (_mm256_unpacklo_epi32(y[0], y[1]), _mm256_unpackhi_epi32(y[0], y[1]));
            let (t2, t3) = (_mm256_unpacklo_epi32(y[2], y[3]), _mm256_unpackhi_epi32(y[2], y[3]));
            let packed = [
                _mm256_unpacklo_epi64(t0, t2),
                _mm256_unpackhi_epi64(t0, t2),
                _mm256_unpacklo_epi64(t1, t3),
                _mm256_unpackhi_epi64(t1, t3),
            ];
            let low = _mm256_set1_epi8(0x0F);
            std::array::from_fn(|k| {
                if k < 4 {
                    _mm256_and_si256(packed[k], low)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(packed[k - 4]), low)
                }
            })
        }

        /// A 32-weight format's several-token kernel, as closures:
        /// - `codes`: the codes of up to eight weight blocks (fifth bits set), regrouped
        ///   as the activations are: values 4k..4k + 4 of block j in lane j of vector k,
        ///   zero for the blocks a last group lacks ([`regroup`], [`regroup_nibbles`]);
        /// - `prepare`: what each token's products read of eight blocks' codes regrouped
        ///   (their values 4k..4k + 4 in lane j for block j), once per group;
        /// - `product`: one token's products with such a vector of its activations
        ///   ([`ActGroup::codes`]), added to a vector of per-block sums;
        /// - `scales`: the block's f16 scale and minimum packed in a u32 (low half, high
        ///   half; zero where the format has none);
        /// - `offset`: what each code is stored above its value (Q4_0: 8, Q5_0: 16), taken
        ///   off as `offset * sum(a)` per block;
        /// - `term`: the blocks' float terms from (integer total, weight scale, weight
        ///   minimum, activation scale, activation sum): the portable code's operations.
        struct Format<Codes, Prepare, Product, Scales, Term> {
            codes: Codes,
            prepare: Prepare,
            product: Product,
            scales: Scales,
            offset: i32,
            term: Term,
        }

        /// The tokens' sums (`acts[t]` into `out[r * stride + t]`, at most 16 tokens) over
        /// rows of `row_blocks` 32-weight blocks, eight blocks at a time.
        ///
        /// A group's codes are regrouped once ([`transpose8`]) so that lane j of every
        /// vector belongs to block j, as the tokens' activations already are
        /// ([`ActGroup`]): a token's eight products then add up to its eight block
        /// totals with no horizontal sums, and its terms come from whole vectors of
        /// scales. Block i goes to lane i % 4 of the token's running sums, in block order
        /// (the first four of a group, then the last four), as [`by_four`] and the
        /// portable `lane_sum` add them. A last group of fewer than eight reads zero codes
        /// and scales for the blocks it lacks and adds nothing for them.
        #[inline]
        #[target_feature(enable = $features)]
        fn rows_by_eight<W, U: Copy>(
            w: &[W],
            row_blocks: usize,
            acts: &[&[ActGroup]],
            out: &mut [f32],
            stride: usize,
            f: &Format<
                impl Fn(&[W]) -> [__m256i; 8],
                impl Fn(__m256i) -> U,
                impl Fn(__m256i, U, __m256i) -> __m256i,
                impl Fn(&W) -> u32,
                impl Fn(__m256, __m256, __m256, __m256, __m256) -> __m256,
            >,
        ) {
            let mut lanes = [_mm_setzero_ps(); 16];
            let lanes = &mut lanes[..acts.len()];
            each_row(w, row_blocks, out, stride, acts.len(), |row, out| {
                lanes.fill(_mm_setzero_ps());
                for (g, blocks) in row.chunks(8).enumerate() {
                    let n = blocks.len();
                    let codes = (f.codes)(blocks);
                    let prepared: [U; 8] = codes.map(|c| (f.prepare)(c));
                    let (dw, mw) =
                        widen_pairs(std::array::from_fn(|j| if j < n { (f.scales)(&blocks[j]) } else { 0 }));
                    let offset = _mm256_set1_epi32(f.offset);
                    for (l, a) in lanes.iter_mut().zip(acts) {
                        let a = &a[g];
                        let av = &a.codes;
                        // four chains of two products: each product waits on the last
                        let chain = |k: usize| {
                            let first = (f.product)(_mm256_setzero_si256(), prepared[k], load_i8(&av[k]));
                            (f.product)(first, prepared[k + 4], load_i8(&av[k + 4]))
                        };
                        let (c0, c1, c2, c3) = (chain(0), chain(1), chain(2), chain(3));
                        let mut totals = _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
                        if f.offset != 0 {
                            let sums = load_i32x8(&a.sums);
                            totals = _mm256_sub_epi32(totals, _mm256_mullo_epi32(offset, sums));
                        }
                        let (da, sa) = (load_f32x8(&a.d), load_f32x8(&a.s));
                        let mut t = (f.term)(_mm256_cvtepi32_ps(totals), dw, mw, da, sa);
                        if n < 8 {
                            t = first_lanes8(t, n);
                        }
                        let low = _mm_add_ps(*l, _mm256_castps256_ps128(t));
                        *l = _mm_add_ps(low, _mm256_extractf128_ps::<1>(t));
                    }
                }
                for (o, l) in out.iter_mut().zip(lanes.iter()) {
                    *o = lanes_total(*l);
                }
            })
        }

        /// `sumi as f32 * (d_w * d_a)`: the term of Q8_0, Q4_0 and Q5_0 blocks.
        #[inline]
        #[target_feature(enable = $features)]
        fn term_scaled(sumf: __m256, dw: __m256, _mw: __m256, da: __m256, _sa: __m256) -> __m256 {
            _mm256_mul_ps(sumf, _mm256_mul_ps(dw, da))
        }

        /// `sumi as f32 * (d_w * d_a) + m_w * s_a`: the term of Q4_1 and Q5_1 blocks.
        #[inline]
        #[target_feature(enable = $features)]
        fn term_with_min(sumf: __m256, dw: __m256, mw: __m256, da: __m256, sa: __m256) -> __m256 {
            _mm256_add_ps(_mm256_mul_ps(sumf, _mm256_mul_ps(dw, da)), _mm256_mul_ps(mw, sa))
        }

        /// Unsigned codes by activations: the product of the 32-weight formats but Q8_0.
        #[inline]
        #[target_feature(enable = $features)]
        fn unsigned_product(acc: __m256i, codes: __m256i, a: __m256i) -> __m256i {
            dot_acc(acc, codes, a)
        }

        /// [`dot_q8_0`] of rows of `row_blocks` weight blocks by each token, the same
        /// floats: `out[r * stride + t]` for row r and `acts[t]` (each as long as a row).
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_tokens_q8_0(
            w: &[BlockQ8_0],
            row_blocks: usize,
            acts: &[&[ActGroup]],
            out: &mut [f32],
            stride: usize,
        ) {
            if WIDE_PRODUCTS {
                // codes + 128 as unsigned bytes, the 128 taken off per block as an offset
                let f = Format {
                    codes: |w: &[BlockQ8_0]| regroup(w, |w| load_i8(&w.qs)),
                    prepare: |c: __m256i| _mm256_xor_si256(c, _mm256_set1_epi8(i8::MIN)),
                    product: |acc, c, a| unsigned_product(acc, c, a),
                    scales: |w: &BlockQ8_0| u16::from_le_bytes(w.d) as u32,
                    offset: 128,
                    term: |s, dw, mw, da, sa| term_scaled(s, dw, mw, da, sa),
                };
                return rows_by_eight(w, row_blocks, acts, out, stride, &f);
            }
            let f = Format {
                codes: |w: &[BlockQ8_0]| regroup(w, |w| load_i8(&w.qs)),
                // the weights' signs move onto the activations (see the module's notes)
                prepare: |c: __m256i| (_mm256_sign_epi8(c, c), c),
                product: |acc, (abs, signed): (__m256i, __m256i), a| {
                    dot_acc(acc, abs, _mm256_sign_epi8(a, signed))
                },
                scales: |w: &BlockQ8_0| u16::from_le_bytes(w.d) as u32,
                offset: 0,
                term: |s, dw, mw, da, sa| term_scaled(s, dw, mw, da, sa),
            };
            rows_by_eight(w, row_blocks, acts, out, stride, &f)
        }

        /// [`dot_q4_0`] of rows of weights by each token (as [`dot_tokens_q8_0`]).
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_tokens_q4_0(
            w: &[BlockQ4_0],
            row_blocks: usize,
            acts: &[&[ActGroup]],
            out: &mut [f32],
            stride: usize,
        ) {
            let f = Format {
                codes: |w: &[BlockQ4_0]| regroup_nibbles(w, |w| &w.qs),
                prepare: |c: __m256i| c,
                product: |acc, c, a| unsigned_product(acc, c, a),
                scales: |w: &BlockQ4_0| u16::from_le_bytes(w.d) as u32,
                offset: 8,
                term: |s, dw, mw, da, sa| term_scaled(s, dw, mw, da, sa),
            };
            rows_by_eight(w, row_blocks, acts, out, stride, &f)
        }

        /// [`dot_q5_0`] of rows of weights by each token (as [`dot_tokens_q8_0`]).
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_tokens_q5_0(
            w: &[BlockQ5_0],
            row_blocks: usize,
            acts: &[&[ActGroup]],
            out: &mut [f32],
            stride: usize,
        ) {
            let f = Format {
                codes: |w: &[BlockQ5_0]| regroup(w, |w| codes5(nibbles(&w.qs), w.qh)),
                prepare: |c: __m256i| c,
                product: |acc, c, a| unsigned_product(acc, c, a),
                scales: |w: &BlockQ5_0| u16::from_le_bytes(w.d) as u32,
                offset: 16,
                term: |s, dw, mw, da, sa| term_scaled(s, dw, mw, da, sa),
            };
            rows_by_eight(w, row_blocks, acts, out, stride, &f)
        }

        /// [`dot_q4_1`] of rows of weights by each token (as [`dot_tokens_q8_0`]).
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_tokens_q4_1(
            w: &[BlockQ4_1],
            row_blocks: usize,
            acts: &[&[ActGroup]],
            out: &mut [f32],
            stride: usize,
        ) {
            let f = Format {
                codes: |w: &[BlockQ4_1]| regroup_nibbles(w, |w| &w.qs),
                prepare: |c: __m256i| c,
                product: |acc, c, a| unsigned_product(acc, c, a),
                scales: |w: &BlockQ4_1| u32::from_le_bytes([w.d[0], w.d[1], w.m[0], w.m[1]]),
                offset: 0,
                term: |s, dw, mw, da, sa| term_with_min(s, dw, mw, da, sa),
            };
            rows_by_eight(w, row_blocks, acts, out, stride, &f)
        }

        /// [`dot_q5_1`] of rows of weights by each token (as [`dot_tokens_q8_0`]).
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_tokens_q5_1(
            w: &[BlockQ5_1],
            row_blocks: usize,
            acts: &[&[ActGroup]],
            out: &mut [f32],
            stride: usize,
        ) {
            let f = Format {
                codes: |w: &[BlockQ5_1]| regroup(w, |w| codes5(nibbles(&w.qs), w.qh)),
                prepare: |c: __m256i| c,
                product: |acc, c, a| unsigned_product(acc, c, a),
                scales: |w: &BlockQ5_1| u32::from_le_bytes([w.d[0], w.d[1], w.m[0], w.m[1]]),
                offset: 0,
                term: |s, dw, mw, da, sa| term_with_min(s, dw, mw, da, sa),
            };
            rows_by_eight(w, row_blocks, acts, out, stride, &f)
        }

        /// A Q4_K/Q5_K super-block unpacked: the codes of its 8 sub-blocks, each one's
        /// scale spread over i16 lanes, and the minimums paired with the activations'
        /// sums per 16.
        struct K4Unpacked {
            codes: [__m256i; 8],
            scales: [__m256i; 8],
            mins: __m256i,
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn k4_unpack(
            qs: &[u8; 128],
            packed: &[u8; 12],
            fifth: impl Fn(__m256i, i32) -> __m256i,
        ) -> K4Unpacked {
            let (scales, mins) = k4_scales(packed);
            let scales =
                _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(scales))));
            let m = _mm_cvtepu8_epi16(_mm_set_epi64x(0, i64::from_le_bytes(mins)));
            let low = _mm256_set1_epi8(0x0F);
            let mut u = K4Unpacked {
                codes: [_mm256_setzero_si256(); 8],
                scales: [_mm256_setzero_si256(); 8],
                mins: _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m)),
            };
            for (pair, q) in qs.as_chunks::<32>().0.iter().enumerate() {
                let q = load_u8(q);
                u.codes[2 * pair] = fifth(_mm256_and_si256(q, low), 2 * pair as i32);
                u.codes[2 * pair + 1] =
                    fifth(_mm256_and_si256(_mm256_srli_epi16::<4>(q), low), 2 * pair as i32 + 1);
            }
            for (j, s) in u.scales.iter_mut().enumerate() {
                *s = _mm256_shuffle_epi8(scales, spread_i16(j as i8, j as i8));
            }
            u
        }

        /// The integer sums of [`k4_sums`] for an unpacked super-block and one token.
        #[inline]
        #[target_feature(enable = $features)]
        fn k4_token(u: &K4Unpacked, a: &BlockQ8K) -> (i32, i32) {
            let aq = a.qs.as_chunks::<32>().0;
            let mut acc = _mm256_setzero_si256();
            for j in 0..8 {
                // codes < 32 by activations: pairs of products stay within i16
                acc = madd_acc(acc, _mm256_maddubs_epi16(u.codes[j], load_i8(&aq[j])), u.scales[j]);
            }
            totals2(acc, _mm256_madd_epi16(load_i16(&a.bsums), u.mins))
        }

        /// [`dot_q4_k`] of rows of weights by each token (as [`dot_tokens_q8_0`]).
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_tokens_q4_k(
            w: &[BlockQ4K],
            row_blocks: usize,
            acts: &[&[BlockQ8K]],
            out: &mut [f32],
            stride: usize,
        ) {
            each_row(w, row_blocks, out, stride, acts.len(), |row, out| row_q4_k(row, acts, out))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn row_q4_k(w: &[BlockQ4K], acts: &[&[BlockQ8K]], out: &mut [f32]) {
            out.fill(0.0);
            for (b, w) in w.iter().enumerate() {
                let u = k4_unpack(&w.qs, &w.scales, |codes, _| codes);
                let (d, dmin) = (half(w.d), half(w.dmin));
                for (sum, a) in out.iter_mut().zip(acts) {
                    let a = &a[b];
                    let (sumi, summ) = k4_token(&u, a);
                    *sum += (a.d * d) * sumi as f32 - (a.d * dmin) * summ as f32;
                }
            }
        }

        /// [`dot_q5_k`] of rows of weights by each token (as [`dot_tokens_q8_0`]).
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_tokens_q5_k(
            w: &[BlockQ5K],
            row_blocks: usize,
            acts: &[&[BlockQ8K]],
            out: &mut [f32],
            stride: usize,
        ) {
            each_row(w, row_blocks, out, stride, acts.len(), |row, out| row_q5_k(row, acts, out))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn row_q5_k(w: &[BlockQ5K], acts: &[&[BlockQ8K]], out: &mut [f32]) {
            out.fill(0.0);
            for (b, w) in w.iter().enumerate() {
                let high = load_u8(&w.qh);
                let u = k4_unpack(&w.qs, &w.scales, |codes, sub| k5_codes(codes, high, sub));
                let (d, dmin) = (half(w.d), half(w.dmin));
                for (sum, a) in out.iter_mut().zip(acts) {
                    let a = &a[b];
                    let (sumi, summ) = k4_token(&u, a);
                    *sum += (a.d * d) * sumi as f32 - (a.d * dmin) * summ as f32;
                }
            }
        }

        /// [`dot_q6_k`] of rows of weights by each token (as [`dot_tokens_q8_0`]).
        ///
        /// # Safety
        #[doc = concat!("The CPU has this level's features ([`super::", stringify!($check), "`]).")]
        #[target_feature(enable = $features)]
        pub fn dot_tokens_q6_k(
            w: &[BlockQ6K],
            row_blocks: usize,
            acts: &[&[BlockQ8K]],
            out: &mut [f32],
            stride: usize,
        ) {
            each_row(w, row_blocks, out, stride, acts.len(), |row, out| row_q6_k(row, acts, out))
        }

        #[inline]
        #[target_feature(enable = $features)]
        fn row_q6_k(w: &[BlockQ6K], acts: &[&[BlockQ8K]], out: &mut [f32]) {
            out.fill(0.0);
            let low = _mm256_set1_epi8(0x0F);
            let picks = [spread_i16(0, 1), spread_i16(2, 3), spread_i16(4, 5), spread_i16(6, 7)];
            for (b, w) in w.iter().enumerate() {
                // the 8 runs of 32 codes (two halves of 4) and their scale vectors, once
                let mut codes = [_mm256_setzero_si256(); 8];
                let mut scales = [_mm256_setzero_si256(); 8];
                let ql = w.ql.as_chunks::<32>().0;
                let qh = w.qh.as_chunks::<32>().0;
                let scales8 = w.scales.as_chunks::<8>().0;
                for half_index in 0..2 {
                    let (l0, l1) = (load_u8(&ql[2 * half_index]), load_u8(&ql[2 * half_index + 1]));
                    let h = load_u8(&qh[half_index]);
                    let m = |bits: i8| _mm256_and_si256(h, _mm256_set1_epi8(bits));
                    let c = &mut codes[4 * half_index..4 * half_index + 4];
                    c[0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16::<4>(m(0x03)));
                    c[1] = _mm256_or_si256(_mm256_and_si256(l1, low), _mm256_slli_epi16::<2>(m(0x0C)));
                    c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l0), low), m(0x30));
                    c[3] = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(l1), low),
                        _mm256_srli_epi16::<2>(m(0xC0_u8 as i8)),
                    );
                    let eight = i64::from_le_bytes(scales8[half_index].map(|s| s as u8));
                    let s = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_set_epi64x(0, eight)));
                    for k in 0..4 {
                        scales[4 * half_index + k] = _mm256_shuffle_epi8(s, picks[k]);
                    }
                }
                let all_scales = _mm256_cvtepi8_epi16(load_half_i8(&w.scales));
                let d = half(w.d);
                for (sum, a) in out.iter_mut().zip(acts) {
                    let a = &a[b];
                    let aq = a.qs.as_chunks::<32>().0;
                    let mut acc = _mm256_setzero_si256();
                    for j in 0..8 {
                        // codes < 64 by activations: pairs of products stay within i16
                        acc = madd_acc(acc, _mm256_maddubs_epi16(codes[j], load_i8(&aq[j])), scales[j]);
                    }
                    let offsets = _mm256_madd_epi16(all_scales, load_i16(&a.bsums));
                    let acc = _mm256_sub_epi32(acc, _mm256_slli_epi32::<5>(offsets));
                    let sumi = totals2(acc, _mm256_setzero_si256()).0;
                    *sum += (a.d * d) * sumi as f32;
                }
            }
        }
    };
}

/// AVX2 (with F16C for the scales): `maddubs` + `madd` for the byte products.
pub mod avx2 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn dot_u8i8(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn dot_offset(q: __m256i, o: __m256i, s: __m256i) -> __m256i {
        // the difference of the pairs stays within i16: both are below 2 * 31 * 128
        let pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(q, s), _mm256_maddubs_epi16(o, s));
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, dot_u8i8(u, s))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn madd_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(x, y))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn codes5(nibbles: __m256i, qh: [u8; 4]) -> __m256i {
        let all = _mm256_set1_epi32(i32::from_le_bytes(qh));
        // byte j gets qh's byte j / 8 (the shuffle indexes within each 128-bit half, and
        // every 4 bytes of `all` are qh), then tests its bit j % 8
        let spread = _mm256_shuffle_epi8(
            all,
            _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(16)))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn k5_codes(nibbles: __m256i, qh: __m256i, sub: i32) -> __m256i {
        // bit `sub` of each byte down to bit 0, then up to bit 4 (16-bit shifts: the bits
        // that cross into the other byte are masked off)
        let down = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(sub));
        _mm256_or_si256(nibbles, _mm256_and_si256(_mm256_slli_epi16::<4>(down), _mm256_set1_epi8(16)))
    }

    /// `maddubs` saturates pairs of products at i16: unsigned codes up to 255 would not fit.
    const WIDE_PRODUCTS: bool = false;

    kernels!("avx2,f16c", has_avx2);
}

/// AVX-512 VNNI on 256-bit vectors: `dpbusd` sums four byte products straight into i32
/// (no i16 step, no saturation), `dpwssd` fuses `madd` with the accumulation, and BW's
/// byte masks add the fifth bits of the 5-bit codes in one instruction.
pub mod vnni {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512vnni,avx512vl,avx512bw")]
    fn dot_u8i8(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512vnni,avx512vl,avx512bw")]
    fn dot_offset(q: __m256i, o: __m256i, s: __m256i) -> __m256i {
        _mm256_sub_epi32(dot_u8i8(q, s), dot_u8i8(o, s))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512vnni,avx512vl,avx512bw")]
    fn dot_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, u, s)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512vnni,avx512vl,avx512bw")]
    fn madd_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
        _mm256_dpwssd_epi32(acc, x, y)
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512vnni,avx512vl,avx512bw")]
    fn codes5(nibbles: __m256i, qh: [u8; 4]) -> __m256i {
        // qh is a byte mask as it stands
        _mm256_mask_add_epi8(nibbles, u32::from_le_bytes(qh), nibbles, _mm256_set1_epi8(16))
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c,avx512vnni,avx512vl,avx512bw")]
    fn k5_codes(nibbles: __m256i, qh: __m256i, sub: i32) -> __m256i {
        let set = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << sub) as i8));
        _mm256_mask_add_epi8(nibbles, set, nibbles, _mm256_set1_epi8(16))
    }

    /// `dpbusd` adds byte products straight into i32: unsigned codes up to 255 fit.
    const WIDE_PRODUCTS: bool = true;

    kernels!("avx2,f16c,avx512vnni,avx512vl,avx512bw", has_avx512_vnni);
}
