//! A weight matrix kept in its file's block format, and its product with a batch of
//! tokens' activations, split by rows over the thread pool.
//!
//! Each token's activations are quantized once per [`ActivationFormat`] ([`Inputs`]) and
//! shared by every matrix that reads them (q, k and v; gate and up). A thread takes a
//! run of weight rows and multiplies each row by every token before moving on
//! ([`dot_rows`]: each weight block unpacked once for a group of tokens), so a weight
//! row is read from memory once per step, however many tokens the step has, and each
//! token gets the floats it would get alone. Float rows (F32, F16, BF16) are widened to
//! f32 once per step and multiplied in f32 ([`widen_rows`], [`float_dot`]).

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use rayon::prelude::*;

use crate::quant::dot::{
    dot_rows, quantize_activations, quantize_activations_alone, ActivationFormat, Activations,
};
use crate::quant::QuantType;

use super::ModelError;

/// `rows` rows of `cols` weights of type `ty`, as a GGUF stores a matrix (row `r` holds
/// the weights of output `r`), and an optional f32 bias per row.
pub struct Linear {
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    data: Vec<u8>,
    row_bytes: usize,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// `name` is the tensor's name, for errors.
    pub fn new(
        name: &str,
        ty: QuantType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        bias: Option<Vec<f32>>,
    ) -> Result<Linear, ModelError> {
        let row_bytes = ty.bytes_for(cols).ok_or_else(|| {
            ModelError::new(
                name,
                format!("rows of {cols} weights are not whole {ty} blocks of {}", ty.block_elems()),
            )
        })?;
        if data.len() != rows * row_bytes {
            return Err(ModelError::new(
                name,
                format!("{} bytes; {rows} rows of {cols} {ty} weights take {}", data.len(), rows * row_bytes),
            ));
        }
        if let Some(b) = &bias {
            if b.len() != rows {
                return Err(ModelError::new(
                    name,
                    format!("the bias has {} values for {rows} rows", b.len()),
                ));
            }
        }
        Ok(Linear { ty, rows, cols, data, row_bytes, bias })
    }

    /// Bytes of weights one product reads.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Row `r` as floats (an embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let bytes = &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
        crate::quant::dequantize(self.ty, bytes, out).expect("a row is whole blocks of its type");
    }

    /// `out[t * rows + r] = row r . x[t] (+ bias[r])` for the `tokens` of `inputs`.
    pub fn forward(&self, inputs: &mut Inputs<'_>, out: &mut [f32]) {
        let tokens = inputs.tokens;
        debug_assert_eq!(inputs.width, self.cols);
        debug_assert_eq!(out.len(), tokens * self.rows);
        if tokens >= FLOAT_FROM_TOKENS {
            self.forward_float(inputs.x, tokens, out);
            self.add_bias(out);
            return;
        }
        let chunk = rows_per_task(self.rows, self.row_bytes);
        // float weights (F32, F16, BF16): each row widened to f32 once, then multiplied by
        // every token while it is in cache (each token's dot alone, as it would be in a
        // step of its own); block formats: the integer dots
        let float = self.ty.activation_format() == ActivationFormat::Float;
        let (x, cols) = (inputs.x, self.cols);
        let acts: &[_] = if float { &[] } else { inputs.get(self.ty.activation_format()) };
        let dot = float_dot();
        let run = |first: usize, dst: &mut [f32]| {
            let n = dst.len() / tokens;
            let mut scratch = vec![0f32; if float { cols } else { 0 }];
            let rows = &self.data[first * self.row_bytes..(first + n) * self.row_bytes];
            if !float {
                dot_rows(self.ty, rows, self.row_bytes, acts, &mut scratch, dst);
                return;
            }
            for (row, dst) in rows.chunks_exact(self.row_bytes).zip(dst.chunks_exact_mut(tokens)) {
                widen_rows(self.ty, row, &mut scratch);
                for (o, x) in dst.iter_mut().zip(x.chunks_exact(cols)) {
                    *o = dot(&scratch, x);
                }
            }
        };
        if tokens == 1 {
            out.par_chunks_mut(chunk).enumerate().for_each(|(c, dst)| run(c * chunk, dst));
        } else {
            // rows outermost (each weight row read once), then transposed to [tokens, rows]
            let mut by_row = vec![0f32; out.len()];
            by_row.par_chunks_mut(chunk * tokens).enumerate().for_each(|(c, dst)| run(c * chunk, dst));
            for (r, per_token) in by_row.chunks_exact(tokens).enumerate() {
                for (t, &v) in per_token.iter().enumerate() {
                    out[t * self.rows + r] = v;
                }
            }
        }
        self.add_bias(out);
    }

    fn add_bias(&self, out: &mut [f32]) {
        if let Some(bias) = &self.bias {
            for row in out.chunks_exact_mut(self.rows) {
                for (o, b) in row.iter_mut().zip(bias) {
                    *o += b;
                }
            }
        }
    }

    /// A prefill-sized product: the weights dequantized, `FLOAT_ROWS` rows at a time, and
    /// multiplied in f32 by an f32 matrix kernel (the `gemm` crate). With this many tokens
    /// per weight row, multiply-adds dominate over reading the weights, and float kernels
    /// do them several times faster than per-block integer dots with their float steps.
    fn forward_float(&self, x: &[f32], tokens: usize, out: &mut [f32]) {
        let cols = self.cols;
        let mut weights = vec![0f32; FLOAT_ROWS.min(self.rows) * cols];
        let threads = rayon::current_num_threads().max(1);
        let chunk = self.rows.min(FLOAT_ROWS).div_ceil(threads * TASKS_PER_THREAD).max(1);
        for first in (0..self.rows).step_by(FLOAT_ROWS) {
            let n = FLOAT_ROWS.min(self.rows - first);
            let w = &mut weights[..n * cols];
            w.par_chunks_mut(chunk * cols).enumerate().for_each(|(c, dst)| {
                let r0 = first + c * chunk;
                let bytes = &self.data[r0 * self.row_bytes..(r0 + dst.len() / cols) * self.row_bytes];
                widen_rows(self.ty, bytes, dst);
            });
            // out[t, first + j] = sum_k x[t, k] * w[j, k]: lhs x is [tokens, cols] row-major,
            // rhs is w transposed (k along its rows: stride 1; j along its columns: stride
            // cols), dst the [tokens, n] block of out starting at column `first`
            // SAFETY: every pointer and stride stays inside its slice: x holds tokens * cols
            // values, w n * cols, and out's rows `tokens` * self.rows from column `first`
            // up to first + n <= self.rows
            unsafe {
                gemm::gemm(
                    tokens,
                    n,
                    cols,
                    out.as_mut_ptr().add(first),
                    1,
                    self.rows as isize,
                    false,
                    x.as_ptr(),
                    1,
                    cols as isize,
                    w.as_ptr(),
                    cols as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(threads),
                );
            }
        }
    }
}

/// Whole rows of `ty` as f32: F16 with the CPU's conversion instructions where it has them
/// (the `half` crate's slice conversion), the other types by [`crate::quant::dequantize`].
fn widen_rows(ty: QuantType, row: &[u8], out: &mut [f32]) {
    if ty == QuantType::F16 {
        // SAFETY: every bit pattern is a valid u16; only the aligned middle is used
        let (head, bits, tail) = unsafe { row.align_to::<u16>() };
        if head.is_empty() && tail.is_empty() {
            bits.reinterpret_cast::<f16>().convert_to_f32_slice(out);
            return;
        }
    }
    crate::quant::dequantize(ty, row, out).expect("a row is whole values of its type");
}

/// The f32 dot product of float rows with a token's activations: 16 running sums (one per
/// lane, summed in a fixed order at the end), the same arithmetic on every CPU; with AVX2
/// the lanes are two 8-wide registers.
fn float_dot() -> fn(&[f32], &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (detected above)
        return |w, x| unsafe { dot_lanes_avx2(w, x) };
    }
    dot_lanes
}

#[inline(always)]
pub(super) fn dot_lanes(w: &[f32], x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut sums = [0f32; LANES];
    let (w_body, x_body) = (w.chunks_exact(LANES), x.chunks_exact(LANES));
    let (w_tail, x_tail) = (w_body.remainder(), x_body.remainder());
    for (w, x) in w_body.zip(x_body) {
        for i in 0..LANES {
            sums[i] += w[i] * x[i];
        }
    }
    for (i, (w, x)) in w_tail.iter().zip(x_tail).enumerate() {
        sums[i] += w * x;
    }
    sums.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_lanes_avx2(w: &[f32], x: &[f32]) -> f32 {
    dot_lanes(w, x)
}

/// Tokens from which a product runs in f32 ([`Linear::forward_float`]): below, integer
/// dots over quantized activations are faster (decode batches); above, prefill chunks.
pub const FLOAT_FROM_TOKENS: usize = 32;
/// Weight rows dequantized at a time by a float product (a few MB of f32).
const FLOAT_ROWS: usize = 1024;

/// Weight bytes one task reads at least: below that, handing rows to another thread
/// costs more than it saves.
const MIN_TASK_BYTES: usize = 32 << 10;
/// Tasks per thread aimed at (balance, when another thread is busy with Python).
const TASKS_PER_THREAD: usize = 4;

fn rows_per_task(rows: usize, row_bytes: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let by_balance = rows.div_ceil(threads * TASKS_PER_THREAD);
    let by_size = MIN_TASK_BYTES.div_ceil(row_bytes.max(1));
    by_balance.max(by_size).clamp(1, rows.max(1))
}

/// The activations of a step's tokens (`[tokens, width]` f32), quantized on first use in
/// each format a matrix asks for.
pub struct Inputs<'a> {
    x: &'a [f32],
    tokens: usize,
    width: usize,
    quantized: [Option<Vec<Activations>>; 4],
}

impl<'a> Inputs<'a> {
    pub fn new(x: &'a [f32], width: usize) -> Inputs<'a> {
        debug_assert_eq!(x.len() % width, 0);
        Inputs { x, tokens: x.len() / width, width, quantized: [None, None, None, None] }
    }

    fn get(&mut self, format: ActivationFormat) -> &[Activations] {
        let (x, width) = (self.x, self.width);
        self.quantized[format as usize].get_or_insert_with(|| match x.len() / width {
            1 => vec![quantize_activations_alone(format, x)],
            _ => x.par_chunks(width).map(|row| quantize_activations(format, row)).collect(),
        })
    }
}
