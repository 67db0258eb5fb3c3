//! AVX2 versions of the block dot products of [`super::dot`], picked at run time where
//! the CPU has AVX2. The integer sums are exact in any order, and the per-block float
//! steps run as in the portable code, so the results are the same floats: the tests
//! check it bit for bit.
//!
//! The unsigned-by-signed byte multiply (`maddubs`) takes the absolute value of the
//! weight codes and moves their sign onto the activations. Weight codes may be -128
//! (a file can hold it; |-128| = 128 still fits the unsigned operand); activation codes
//! never are (the quantizers clamp them to +-127), so flipping their sign cannot wrap.
//! Two products of at most 128 * 127 sum to 32512: no 16-bit saturation.

use std::arch::x86_64::*;

use super::blocks::{BlockQ4_0, BlockQ8_0, QK};
use half::f16;

/// Whether the CPU has AVX2 (std caches the answer).
#[inline]
pub fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
}

#[inline]
fn half(bytes: [u8; 2]) -> f32 {
    f16::from_le_bytes(bytes).to_f32()
}

/// Sum of the 32 products of signed bytes `w` and `a` (`a` never -128).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_i8x32(w: __m256i, a: __m256i) -> i32 {
    let magnitudes = _mm256_sign_epi8(w, w);
    let signed = _mm256_sign_epi8(a, w);
    let pairs = _mm256_maddubs_epi16(magnitudes, signed);
    let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    let halves = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256::<1>(quads));
    let pairs = _mm_add_epi32(halves, _mm_unpackhi_epi64(halves, halves));
    let one = _mm_add_epi32(pairs, _mm_shuffle_epi32::<0b01>(pairs));
    _mm_cvtsi128_si32(one)
}

/// # Safety
/// The CPU must have AVX2 (`has_avx2`); `a`'s codes are never -128.
#[target_feature(enable = "avx2")]
pub unsafe fn dot_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    for (w, a) in w.iter().zip(a) {
        let wv = _mm256_loadu_si256(w.qs.as_ptr().cast());
        let av = _mm256_loadu_si256(a.qs.as_ptr().cast());
        sum += dot_i8x32(wv, av) as f32 * (half(w.d) * half(a.d));
    }
    sum
}

/// # Safety
/// As [`dot_q8_0`].
#[target_feature(enable = "avx2")]
pub unsafe fn dot_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0f32;
    let low = _mm_set1_epi8(0x0F);
    let eight = _mm256_set1_epi8(8);
    for (w, a) in w.iter().zip(a) {
        let packed = _mm_loadu_si128(w.qs.as_ptr().cast());
        // weights 0..16 are the low nibbles, 16..32 the high ones, as the activations
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), low);
        let wv = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight);
        let av = _mm256_loadu_si256(a.qs.as_ptr().cast());
        sum += dot_i8x32(wv, av) as f32 * (half(w.d) * half(a.d));
    }
    sum
}

const _: () = assert!(QK == 32);
