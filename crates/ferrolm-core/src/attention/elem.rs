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
    /// Widens `src` into `dst` (same length).
    fn load(src: &[Self], dst: &mut [f32]);
    /// Narrows `src` into `dst` (same length), rounding to nearest even.
    fn store(src: &[f32], dst: &mut [Self]);
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
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
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
    fn load(src: &[f16], dst: &mut [f32]) {
        // F16C where the CPU has it (detected once at run time by `half`)
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn store(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
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
}
