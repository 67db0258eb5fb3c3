//! The element types a KV pool may hold: f32, f16, bf16, and ggml's Q8_0 blocks (32
//! signed bytes and one f16 scale, llama.cpp's `--cache-type-k q8_0`). Every one is
//! computed in f32: the kernels widen a pool's values as they read them.
//!
//! Positions in a pool are counted in values, not elements: a Q8_0 element holds 32
//! values, and a slot row's values start at `slot * num_kv_heads * head_dim` whatever
//! the type. Every read and write of a block type covers whole blocks (the head
//! dimension is a multiple of [`KvElem::VALUES`]), so a block never mixes two heads.

use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use half::{bf16, f16};

use crate::quant::blocks::{Block, BlockQ8_0, QK};
use crate::quant::dot::quantize_q8_0_block;

/// A KV pool element.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// The name of the type (for messages; the numpy or ggml name).
    const NAME: &'static str;
    /// Values one element holds: 1, or 32 for a Q8_0 block. The head dimension must be
    /// a multiple of it.
    const VALUES: usize = 1;
    /// A pool of `values` zeros (a multiple of `VALUES`), taken from the allocator's
    /// zeroed memory, as `vec![0.0f32; len]` is: for a pool this size, fresh pages from
    /// the OS, which become resident when a slot is first written.
    fn zeros(values: usize) -> Vec<Self>;
    /// The pool itself when it is f32 already (read in place, never copied).
    fn as_f32(pool: &[Self]) -> Option<&[f32]>;
    /// Widens the pool's values `start..start + dst.len()` into `dst`.
    fn load(pool: &[Self], start: usize, dst: &mut [f32]);
    /// Narrows `src` into the pool's values from `start` (floats round to nearest even;
    /// Q8_0 quantizes each block as ggml's reference quantizer does).
    fn store(src: &[f32], pool: &mut [Self], start: usize);
    /// The eight values at `at` (a multiple of 8) of the pool at `pool`, widened to f32
    /// (exactly, as `load`).
    ///
    /// # Safety
    /// Values `at..at + 8` must be within the pool; the CPU must have AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(pool: *const Self, at: usize) -> std::arch::x86_64::__m256;
    /// The pool as Q8_0 blocks when it is one: the SIMD loop then applies a block's scale
    /// once per 32 values instead of widening each value with it.
    #[inline(always)]
    fn q8_0_blocks(_pool: *const Self) -> Option<*const BlockQ8_0> {
        None
    }
}

impl KvElem for f32 {
    const NAME: &'static str = "float32";
    fn zeros(values: usize) -> Vec<f32> {
        vec![0.0; values]
    }
    #[inline(always)]
    fn as_f32(pool: &[f32]) -> Option<&[f32]> {
        Some(pool)
    }
    #[inline(always)]
    fn load(pool: &[f32], start: usize, dst: &mut [f32]) {
        dst.copy_from_slice(&pool[start..start + dst.len()]);
    }
    #[inline(always)]
    fn store(src: &[f32], pool: &mut [f32], start: usize) {
        pool[start..start + src.len()].copy_from_slice(src);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(pool: *const f32, at: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(pool.add(at)) }
    }
}

impl KvElem for f16 {
    const NAME: &'static str = "float16";
    fn zeros(values: usize) -> Vec<f16> {
        // as their u16 bits: `vec![f16::ZERO; n]` would write every element
        vec![0u16; values].reinterpret_into()
    }
    #[inline(always)]
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn load(pool: &[f16], start: usize, dst: &mut [f32]) {
        let src = &pool[start..start + dst.len()];
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
    fn store(src: &[f32], pool: &mut [f16], start: usize) {
        pool[start..start + src.len()].convert_from_f32_slice(src);
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(pool: *const f16, at: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm_loadu_si128};
        // SAFETY: the caller's.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(pool.add(at).cast::<__m128i>())) }
    }
}

impl KvElem for bf16 {
    const NAME: &'static str = "bfloat16";
    fn zeros(values: usize) -> Vec<bf16> {
        vec![0u16; values].reinterpret_into()
    }
    #[inline(always)]
    fn as_f32(_: &[bf16]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn load(pool: &[bf16], start: usize, dst: &mut [f32]) {
        // bf16 is the top half of an f32: a shift, which vectorizes
        let src = &pool[start..start + dst.len()];
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32::from_bits((s.to_bits() as u32) << 16);
        }
    }
    #[inline(always)]
    fn store(src: &[f32], pool: &mut [bf16], start: usize) {
        for (d, &s) in pool[start..start + src.len()].iter_mut().zip(src) {
            *d = bf16::from_f32(s);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(pool: *const bf16, at: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's; bf16 is the top half of an f32.
        unsafe {
            let halves = _mm_loadu_si128(pool.add(at).cast::<__m128i>());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
        }
    }
}

impl KvElem for BlockQ8_0 {
    const NAME: &'static str = "q8_0";
    const VALUES: usize = QK;
    #[inline(always)]
    fn q8_0_blocks(pool: *const BlockQ8_0) -> Option<*const BlockQ8_0> {
        Some(pool)
    }
    fn zeros(values: usize) -> Vec<BlockQ8_0> {
        let blocks = values.div_ceil(QK);
        if blocks == 0 {
            return Vec::new();
        }
        let layout =
            std::alloc::Layout::array::<BlockQ8_0>(blocks).expect("a pool that fits the address space");
        // SAFETY: the layout is non-zero in size; an all-zero block is a valid block (byte
        // arrays only, `Block`'s contract: scale 0.0, codes 0), and the vector takes the
        // allocation with the layout it was made with (capacity = length = blocks).
        unsafe {
            let ptr = std::alloc::alloc_zeroed(layout).cast::<BlockQ8_0>();
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Vec::from_raw_parts(ptr, blocks, blocks)
        }
    }
    #[inline(always)]
    fn as_f32(_: &[BlockQ8_0]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn load(pool: &[BlockQ8_0], start: usize, dst: &mut [f32]) {
        debug_assert!(start % QK == 0 && dst.len() % QK == 0);
        for (out, block) in dst.chunks_exact_mut(QK).zip(&pool[start / QK..]) {
            block.dequantize(out);
        }
    }
    #[inline(always)]
    fn store(src: &[f32], pool: &mut [BlockQ8_0], start: usize) {
        assert!(start % QK == 0 && src.len() % QK == 0, "a Q8_0 pool is written in whole blocks");
        for (block, xs) in pool[start / QK..].iter_mut().zip(src.chunks_exact(QK)) {
            *block = quantize_q8_0_block(xs);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(pool: *const BlockQ8_0, at: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's: the block holding values at..at + 8 (8 divides 32, so one
        // block holds all eight) is within the pool.
        unsafe {
            let block = &*pool.add(at / QK);
            let bits = u16::from_le_bytes(block.d) as i32;
            let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
            let codes = _mm_loadl_epi64(block.qs.as_ptr().add(at % QK).cast::<__m128i>());
            // q * d in one f32 rounding, as the block's `dequantize`
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), d)
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
