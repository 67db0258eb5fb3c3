//! Quantized weights in the GGUF/ggml block formats: their types, their block layouts
//! ([`blocks`]) and dequantization to f32.
//!
//! Dequantization is what a runner that computes in float needs to load a GGUF; the
//! integer-dot products in [`dot`] read the blocks in place (the matmul kernels, with
//! SIMD versions in [`simd`]; the CPU runner's matrices use them). Large tensors are split by
//! blocks over scoped threads: loading an 8B model converts billions of weights once,
//! and the work is embarrassingly parallel.

pub mod blocks;
pub mod dot;
pub mod quantize;
// AVX-512 target features and intrinsics are stable from Rust 1.89: the SIMD kernels need
// it whatever the workspace's rust-version says
#[cfg(target_arch = "x86_64")]
#[clippy::msrv = "1.89"]
pub mod simd;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::OnceLock;

use blocks::{
    as_blocks, Block, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
};

/// A tensor element type of a GGUF file that ferrolm reads. The discriminants are ggml's
/// type ids (`ggml_type`), as the file stores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QuantType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    BF16 = 30,
}

impl QuantType {
    pub const ALL: [QuantType; 11] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::BF16,
        QuantType::Q8_0,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
    ];

    /// The type of a ggml type id; `None` for ids ferrolm does not read (other quant
    /// families, integer tensors, ids that do not exist).
    pub fn from_ggml(id: u32) -> Option<QuantType> {
        QuantType::ALL.into_iter().find(|t| *t as u32 == id)
    }

    /// ggml's name of the type (`"Q4_K"`), as llama.cpp and gguf-py print it.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "F32",
            QuantType::F16 => "F16",
            QuantType::BF16 => "BF16",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q4K => "Q4_K",
            QuantType::Q5K => "Q5_K",
            QuantType::Q6K => "Q6_K",
        }
    }

    /// Weights per block (1 for the float types).
    pub fn block_elems(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            QuantType::Q8_0 => BlockQ8_0::ELEMS,
            QuantType::Q4_0 => BlockQ4_0::ELEMS,
            QuantType::Q4_1 => BlockQ4_1::ELEMS,
            QuantType::Q5_0 => BlockQ5_0::ELEMS,
            QuantType::Q5_1 => BlockQ5_1::ELEMS,
            QuantType::Q4K => BlockQ4K::ELEMS,
            QuantType::Q5K => BlockQ5K::ELEMS,
            QuantType::Q6K => BlockQ6K::ELEMS,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::F32 => 4,
            QuantType::F16 | QuantType::BF16 => 2,
            QuantType::Q8_0 => BlockQ8_0::BYTES,
            QuantType::Q4_0 => BlockQ4_0::BYTES,
            QuantType::Q4_1 => BlockQ4_1::BYTES,
            QuantType::Q5_0 => BlockQ5_0::BYTES,
            QuantType::Q5_1 => BlockQ5_1::BYTES,
            QuantType::Q4K => BlockQ4K::BYTES,
            QuantType::Q5K => BlockQ5K::BYTES,
            QuantType::Q6K => BlockQ6K::BYTES,
        }
    }

    /// Bytes that `elems` weights take, or `None` if they are not whole blocks.
    pub fn bytes_for(self, elems: usize) -> Option<usize> {
        (elems % self.block_elems() == 0).then(|| elems / self.block_elems() * self.block_bytes())
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Input that does not fit; `field` names the argument (`"data"`, `"out"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantError {
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for QuantError {}

/// Weights from which a call is split over threads (about a millisecond of work).
const PARALLEL_FROM: usize = 1 << 20;

/// Dequantizes `data` (whole blocks of `ty`, as stored in the file: little-endian) into
/// `out`, which must hold exactly the weights the blocks encode.
pub fn dequantize(ty: QuantType, data: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let (elems, bytes) = (ty.block_elems(), ty.block_bytes());
    if data.len() % bytes != 0 {
        return Err(QuantError {
            field: "data",
            message: format!("{} bytes are not whole {ty} blocks of {bytes} bytes", data.len()),
        });
    }
    let want = data.len() / bytes * elems;
    if out.len() != want {
        return Err(QuantError {
            field: "out",
            message: format!("out has {} values; {} bytes of {ty} hold {want}", out.len(), data.len()),
        });
    }
    let blocks = data.len() / bytes;
    let threads = if out.len() < PARALLEL_FROM { 1 } else { available_threads().min(blocks) };
    if threads < 2 {
        dequantize_serial(ty, data, out);
        return Ok(());
    }
    let per_blocks = blocks.div_ceil(threads);
    std::thread::scope(|scope| {
        let mut parts = data.chunks(per_blocks * bytes).zip(out.chunks_mut(per_blocks * elems));
        let here = parts.next();
        for (d, o) in parts {
            scope.spawn(move || dequantize_serial(ty, d, o));
        }
        if let Some((d, o)) = here {
            dequantize_serial(ty, d, o);
        }
    });
    Ok(())
}

/// Asked once: on Linux it reads the cgroup's CPU quota, tens of µs a call.
fn available_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `data` is whole blocks and `out` their weights (checked by the caller).
fn dequantize_serial(ty: QuantType, data: &[u8], out: &mut [f32]) {
    match ty {
        QuantType::F32 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        QuantType::F16 => {
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        QuantType::BF16 => {
            // bf16 is the top half of an f32: widening is a shift, exact
            for (o, b) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
            }
        }
        QuantType::Q8_0 => run::<BlockQ8_0>(data, out),
        QuantType::Q4_0 => run::<BlockQ4_0>(data, out),
        QuantType::Q4_1 => run::<BlockQ4_1>(data, out),
        QuantType::Q5_0 => run::<BlockQ5_0>(data, out),
        QuantType::Q5_1 => run::<BlockQ5_1>(data, out),
        QuantType::Q4K => run::<BlockQ4K>(data, out),
        QuantType::Q5K => run::<BlockQ5K>(data, out),
        QuantType::Q6K => run::<BlockQ6K>(data, out),
    }
}

fn run<B: Block>(data: &[u8], out: &mut [f32]) {
    let blocks = as_blocks::<B>(data).expect("whole blocks, checked by dequantize");
    for (block, ys) in blocks.iter().zip(out.chunks_exact_mut(B::ELEMS)) {
        block.dequantize(ys);
    }
}
