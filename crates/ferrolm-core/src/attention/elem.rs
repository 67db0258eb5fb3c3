//! The element types a KV pool may hold. Every one is computed in f32: a row of the pool
//! is widened into an f32 buffer once per tile and shared by every query row that reads it.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// A KV pool element: f32, f16 or bf16.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// The numpy name of the type (for messages).
    const NAME: &'static str;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    /// The pool itself when it is f32 already (read in place, never copied).
    fn as_f32(pool: &[Self]) -> Option<&[f32]>;
    /// Widens `src` into `dst` (same length).
    fn load(src: &[Self], dst: &mut [f32]);
    /// Narrows `src` into `dst` (same length), rounding to nearest even.
    fn store(src: &[f32], dst: &mut [Self]);
    /// Eight elements from `p`, widened to f32 (exactly, as `load`).
    ///
    /// # Safety
    /// Eight elements from `p` must be readable; the CPU must have AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl KvElem for f32 {
    const NAME: &'static str = "float32";
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn as_f32(pool: &[f32]) -> Option<&[f32]> {
        Some(pool)
    }
    #[inline(always)]
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
}

impl KvElem for f16 {
    const NAME: &'static str = "float16";
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn load(src: &[f16], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx") {
                // SAFETY: the CPU has the features `load_f16c` is compiled for.
                unsafe { load_f16c(src, dst) };
                return;
            }
        }
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn store(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm_loadu_si128};
        // SAFETY: the caller's.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())) }
    }
}

impl KvElem for bf16 {
    const NAME: &'static str = "bfloat16";
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn as_f32(_: &[bf16]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn load(src: &[bf16], dst: &mut [f32]) {
        // bf16 is the top half of an f32: a shift, which vectorizes
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline(always)]
    fn store(src: &[f32], dst: &mut [bf16]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16::from_f32(s);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's; bf16 is the top half of an f32.
        unsafe {
            let halves = _mm_loadu_si128(p.cast::<__m128i>());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
        }
    }
}

/// f16 to f32 eight at a time with the F16C instruction (`half`'s slice conversion does the
/// same but is a call per row; this one inlines into the kernel's AVX2 loop).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
#[inline]
unsafe fn load_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n elements of both; unaligned loads and stores.
        unsafe {
            let halves = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(halves));
        }
        i += 8;
    }
    for j in i..n {
        dst[j] = src[j].to_f32();
    }
}
