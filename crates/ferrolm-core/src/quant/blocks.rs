//! The block formats of GGUF/ggml quantized tensors, as typed structs over the bytes of
//! a file.
//!
//! A quantized row is a run of fixed-size blocks; each block holds its scale(s) and the
//! packed integer codes of 32 (legacy types) or 256 (k-quants) weights. The structs
//! mirror ggml's memory layout byte for byte, so a slice of a memory-mapped file can be
//! viewed as `&[Block]` without copying: every field is a byte array (alignment 1, any
//! bit pattern valid), and `f16` scales are decoded with `half` on use.
//!
//! Each `dequantize` rounds exactly as ggml's reference dequantizers and gguf-py's numpy
//! ones do (one f32 rounding per product or difference, in the same order, never fused),
//! so the floats are identical, not merely close.

use half::f16;

/// Weights per block of the legacy formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
pub const QK: usize = 32;
/// Weights per super-block of the k-quants (Q4_K, Q5_K, Q6_K).
pub const QK_K: usize = 256;
/// Bytes of the packed 6-bit scales and mins of Q4_K and Q5_K.
const K_SCALE_SIZE: usize = 12;

/// A block type whose bytes can be viewed in place.
///
/// # Safety
/// Implementors are `#[repr(C)]` structs of `u8`/`i8` arrays only: alignment 1, no
/// padding, every bit pattern valid, and `size_of::<Self>() == BYTES`.
pub unsafe trait Block: Copy + 'static {
    /// Weights in one block.
    const ELEMS: usize;
    /// Bytes of one block in the file.
    const BYTES: usize;
    /// Writes the block's `ELEMS` weights into `out` (exactly `ELEMS` long).
    fn dequantize(&self, out: &mut [f32]);
}

#[inline]
fn half(bytes: [u8; 2]) -> f32 {
    f16::from_le_bytes(bytes).to_f32()
}

/// `Q8_0`: 32 signed bytes and one f16 scale; `w = q * d`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; QK],
}

unsafe impl Block for BlockQ8_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 34;
    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

/// `Q4_0`: 32 nibbles with an implicit offset of 8 and one f16 scale; `w = (q - 8) * d`.
/// Byte `j` holds weight `j` in its low nibble and weight `j + 16` in its high one.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; QK / 2],
}

unsafe impl Block for BlockQ4_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 18;
    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((l, h), &byte) in lo.iter_mut().zip(hi.iter_mut()).zip(&self.qs) {
            *l = d * ((byte & 0x0F) as i32 - 8) as f32;
            *h = d * ((byte >> 4) as i32 - 8) as f32;
        }
    }
}

/// `Q4_1`: 32 nibbles, an f16 scale and an f16 minimum; `w = d * q + m`. Nibble order as
/// in `Q4_0`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; QK / 2],
}

unsafe impl Block for BlockQ4_1 {
    const ELEMS: usize = QK;
    const BYTES: usize = 20;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (half(self.d), half(self.m));
        let (lo, hi) = out.split_at_mut(QK / 2);
        for ((l, h), &byte) in lo.iter_mut().zip(hi.iter_mut()).zip(&self.qs) {
            *l = d * (byte & 0x0F) as f32 + m;
            *h = d * (byte >> 4) as f32 + m;
        }
    }
}

/// The 5-bit codes of a `Q5_0`/`Q5_1` block, weight order: the low four bits are `qs`'s
/// nibbles laid out as in `Q4_0`, and bit `j` of `qh` (read as a little-endian u32) is
/// bit 4 of weight `j`.
#[inline]
fn codes5(qh: [u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let high = u32::from_le_bytes(qh);
    let mut codes = [0u8; QK];
    for (j, &byte) in qs.iter().enumerate() {
        codes[j] = (byte & 0x0F) | (((high >> j) & 1) << 4) as u8;
        codes[j + QK / 2] = (byte >> 4) | (((high >> (j + QK / 2)) & 1) << 4) as u8;
    }
    codes
}

/// `Q5_0`: 32 five-bit codes with an implicit offset of 16 and one f16 scale;
/// `w = (q - 16) * d`. The low nibbles as in `Q4_0`, the fifth bits in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

impl BlockQ5_0 {
    /// The 32 codes (0..32, before the offset), in weight order.
    #[inline]
    pub fn codes(&self) -> [u8; QK] {
        codes5(self.qh, &self.qs)
    }
}

unsafe impl Block for BlockQ5_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 22;
    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        for (o, q) in out.iter_mut().zip(self.codes()) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }
}

/// `Q5_1`: 32 five-bit codes, an f16 scale and an f16 minimum; `w = q * d + m`. Code
/// layout as in `Q5_0`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

impl BlockQ5_1 {
    /// The 32 codes (0..32), in weight order.
    #[inline]
    pub fn codes(&self) -> [u8; QK] {
        codes5(self.qh, &self.qs)
    }
}

unsafe impl Block for BlockQ5_1 {
    const ELEMS: usize = QK;
    const BYTES: usize = 24;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (half(self.d), half(self.m));
        for (o, q) in out.iter_mut().zip(self.codes()) {
            *o = q as f32 * d + m;
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K super-block. The first
/// four pairs sit in the low 6 bits of bytes 0..4 (scales) and 4..8 (mins); the last four
/// keep their low nibbles in bytes 8..12 and their top two bits in the spare high bits of
/// bytes 0..8.
#[inline]
pub fn scale_min_k4(j: usize, packed: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        let scale = (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4);
        let min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
        (scale, min)
    }
}

/// `Q4_K`: 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and min under two
/// f16 super-scales; `w = (d * scale) * q - (dmin * min)`. Each 32 bytes of `qs` hold two
/// sub-blocks: the low nibbles the first, the high nibbles the second.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

unsafe impl Block for BlockQ4K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 144;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (half(self.d), half(self.dmin));
        for (pair, (qs, ys)) in self.qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
            let (s1, m1) = scale_min_k4(2 * pair, &self.scales);
            let (s2, m2) = scale_min_k4(2 * pair + 1, &self.scales);
            let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
            let (lo, hi) = ys.split_at_mut(32);
            for ((l, h), &byte) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
                *l = d1 * (byte & 0x0F) as f32 - m1;
                *h = d2 * (byte >> 4) as f32 - m2;
            }
        }
    }
}

/// `Q5_K`: as `Q4_K` with a fifth bit per weight in `qh`: bit `2p` of `qh[l]` belongs to
/// weight `l` of sub-block `2p`, bit `2p + 1` to weight `l` of sub-block `2p + 1`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

unsafe impl Block for BlockQ5K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 176;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (half(self.d), half(self.dmin));
        for (pair, (qs, ys)) in self.qs.chunks_exact(32).zip(out.chunks_exact_mut(64)).enumerate() {
            let (s1, m1) = scale_min_k4(2 * pair, &self.scales);
            let (s2, m2) = scale_min_k4(2 * pair + 1, &self.scales);
            let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
            let (bit1, bit2) = (1u8 << (2 * pair), 1u8 << (2 * pair + 1));
            let (lo, hi) = ys.split_at_mut(32);
            for (l, ((yl, yh), &byte)) in lo.iter_mut().zip(hi.iter_mut()).zip(qs).enumerate() {
                let high = self.qh[l];
                let q1 = (byte & 0x0F) | if high & bit1 != 0 { 16 } else { 0 };
                let q2 = (byte >> 4) | if high & bit2 != 0 { 16 } else { 0 };
                *yl = d1 * q1 as f32 - m1;
                *yh = d2 * q2 as f32 - m2;
            }
        }
    }
}

/// `Q6_K`: 256 weights of 6 bits (low 4 in `ql`, high 2 in `qh`) with an offset of 32,
/// in 16 sub-blocks of 16 with signed 8-bit scales under one f16 super-scale;
/// `w = (d * scale) * (q - 32)`. Each half of 128 weights uses 64 bytes of `ql` and 32 of
/// `qh`: weight `l + 32 k` (k = 0..4) takes nibble `k / 2` of `ql[l + 32 (k % 2)]` and bits
/// `2k, 2k + 1` of `qh[l]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

unsafe impl Block for BlockQ6K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 210;
    fn dequantize(&self, out: &mut [f32]) {
        let d = half(self.d);
        for (half_index, ys) in out.chunks_exact_mut(128).enumerate() {
            let ql = &self.ql[64 * half_index..64 * half_index + 64];
            let qh = &self.qh[32 * half_index..32 * half_index + 32];
            let scales = &self.scales[8 * half_index..8 * half_index + 8];
            for l in 0..32 {
                let sub = l / 16;
                let codes = [
                    (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, &code) in codes.iter().enumerate() {
                    let scale = d * scales[sub + 2 * k] as f32;
                    ys[l + 32 * k] = scale * (code as i32 - 32) as f32;
                }
            }
        }
    }
}

// the file layout is the contract: a struct that is not exactly its block's bytes would
// read garbage
const _: () = {
    assert!(size_of::<BlockQ8_0>() == BlockQ8_0::BYTES && align_of::<BlockQ8_0>() == 1);
    assert!(size_of::<BlockQ4_0>() == BlockQ4_0::BYTES && align_of::<BlockQ4_0>() == 1);
    assert!(size_of::<BlockQ4_1>() == BlockQ4_1::BYTES && align_of::<BlockQ4_1>() == 1);
    assert!(size_of::<BlockQ5_0>() == BlockQ5_0::BYTES && align_of::<BlockQ5_0>() == 1);
    assert!(size_of::<BlockQ5_1>() == BlockQ5_1::BYTES && align_of::<BlockQ5_1>() == 1);
    assert!(size_of::<BlockQ4K>() == BlockQ4K::BYTES && align_of::<BlockQ4K>() == 1);
    assert!(size_of::<BlockQ5K>() == BlockQ5K::BYTES && align_of::<BlockQ5K>() == 1);
    assert!(size_of::<BlockQ6K>() == BlockQ6K::BYTES && align_of::<BlockQ6K>() == 1);
};

/// Views `bytes` as whole blocks, in place; `None` if the length is not a multiple of a
/// block.
pub fn as_blocks<B: Block>(bytes: &[u8]) -> Option<&[B]> {
    if bytes.len() % B::BYTES != 0 {
        return None;
    }
    // SAFETY: `Block` guarantees alignment 1, no padding, size BYTES and that every bit
    // pattern is a valid value; the length is a whole number of blocks and the lifetime
    // is that of `bytes`.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / B::BYTES) })
}
