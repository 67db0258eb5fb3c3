//! Matrix products over quantized weights with integer dot products, the portable
//! reference: activations are quantized per block to int8 (`Q8_0`, `Q8_1` or `Q8_K`, the
//! block each weight format pairs with in ggml), each block's codes are multiplied and
//! summed as integers, and the block scales are applied once per block in f32.
//!
//! The arithmetic is fixed here, operation by operation (integer sums are exact in any
//! order; the float steps are written out in the order they must run): SIMD versions
//! are to give these exact floats, tested against this code bit for bit. Weight rows are
//! read once for all the tokens of a call (prefill chunks, decode batches), and rows are
//! split over scoped threads for large products.
//!
//! Every quantized type has x86-64 versions ([`super::simd`]: AVX-512 VNNI, else AVX2),
//! picked at run time by the `dot_*` functions; `dot_*_portable` is the code they
//! equal, and what other CPUs run. [`dot_rows`] multiplies rows of weights by several
//! tokens, each token getting exactly its [`dot_row`] float: the SIMD versions unpack a
//! weight block once for a group of tokens, the portable code loops over [`dot_row`]. The
//! CPU runner's matrices (`cpu_model::linear`) call it per run of rows.

use half::f16;

use super::blocks::{
    scale_min_k4, Block, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
    QK, QK_K,
};
use super::{available_threads, QuantError, QuantType};

#[inline]
fn half(bytes: [u8; 2]) -> f32 {
    f16::from_le_bytes(bytes).to_f32()
}

/// `Q8_1` activations (paired with `Q4_1` and `Q5_1` weights): `Q8_0` plus `s = d * sum(qs)`, which
/// carries the weights' minimum through the product.
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_1 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; QK],
}

/// `Q8_K` activations (paired with the k-quants): an f32 scale over 256 codes, and the
/// sums of each 16 codes for the weights' minimums.
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

/// Rounds half away from zero, as C's `roundf` (ggml's quantizers use it), for the
/// values a quantizer rounds: `|v| < 2^31` or NaN (0, as `v.round() as i32`).
/// `f32::round` is a libm call on CPUs without SSE4.1 in the baseline (a tenth of a
/// decode step's quantizing): the truncating conversion and the exact fraction
/// `v - trunc(v)` give the same integer in a few vector instructions.
#[inline]
pub(crate) fn round_away(v: f32) -> i32 {
    let t = v as i32;
    let frac = v - t as f32;
    t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32
}

/// `x` (whole blocks of 32) as `Q8_0`: `d = max|x| / 127` (stored as f16), codes
/// `round(x / d)` computed with the unrounded `d`, as ggml's reference quantizer does.
pub fn quantize_q8_0(x: &[f32]) -> Vec<BlockQ8_0> {
    x.chunks_exact(QK).map(quantize_q8_0_block).collect()
}

/// One block of 32 values as `Q8_0` (see [`quantize_q8_0`]).
pub fn quantize_q8_0_block(xs: &[f32]) -> BlockQ8_0 {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK];
    for (q, &v) in qs.iter_mut().zip(xs) {
        *q = round_away(v * id) as i8;
    }
    BlockQ8_0 { d: f16::from_f32(d).to_le_bytes(), qs }
}

/// `x` (whole blocks of 32) as `Q8_1`; `d` kept in f32 (activations never reach a file).
pub fn quantize_q8_1(x: &[f32]) -> Vec<BlockQ8_1> {
    x.chunks_exact(QK)
        .map(|xs| {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut qs = [0i8; QK];
            let mut sum = 0i32;
            for (q, &v) in qs.iter_mut().zip(xs) {
                *q = round_away(v * id) as i8;
                sum += *q as i32;
            }
            BlockQ8_1 { d, s: d * sum as f32, qs }
        })
        .collect()
}

/// `x` (whole blocks of 256) as `Q8_K`: the value of largest magnitude maps to -127
/// (its sign folded into `d`), codes rounded half to even, as ggml's reference
/// quantizer does (its `nearest_int`).
pub fn quantize_q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    x.chunks_exact(QK_K)
        .map(|xs| {
            let mut block = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
            let max = xs.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            if max == 0.0 {
                return block;
            }
            let iscale = -127.0 / max;
            for (q, &v) in block.qs.iter_mut().zip(xs) {
                *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            for (sum, qs) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
                *sum = qs.iter().map(|&q| q as i16).sum();
            }
            block.d = 1.0 / iscale;
            block
        })
        .collect()
}

/// Integer dot product of 32 codes with 32 activation codes.
#[inline]
fn dot32(w: impl Iterator<Item = i32>, a: &[i8]) -> i32 {
    w.zip(a).map(|(w, &a)| w * a as i32).sum()
}

/// The fastest version of a dot product this CPU runs ([`super::simd::level`]): AVX-512
/// VNNI, AVX2, or the portable code; the same floats from each.
macro_rules! dispatch {
    ($name:ident, $portable:ident, $w:expr, $a:expr) => {{
        #[cfg(target_arch = "x86_64")]
        match super::simd::level() {
            // SAFETY: the level's CPU features are present (detected at run time)
            super::simd::Level::Avx512Vnni => return unsafe { super::simd::vnni::$name($w, $a) },
            super::simd::Level::Avx2 => return unsafe { super::simd::avx2::$name($w, $a) },
            super::simd::Level::Portable => {}
        }
        $portable($w, $a)
    }};
}

/// `Q8_0` weights by `Q8_0` activations. The activations come from [`quantize_q8_0`]:
/// the SIMD versions rely on their codes never being -128.
pub fn dot_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    dispatch!(dot_q8_0, dot_q8_0_portable, w, a)
}

/// `Q4_0` weights by `Q8_0` activations.
pub fn dot_q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    dispatch!(dot_q4_0, dot_q4_0_portable, w, a)
}

/// `Q5_0` weights by `Q8_0` activations.
pub fn dot_q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    dispatch!(dot_q5_0, dot_q5_0_portable, w, a)
}

/// `Q4_1` weights by `Q8_1` activations.
pub fn dot_q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    dispatch!(dot_q4_1, dot_q4_1_portable, w, a)
}

/// `Q5_1` weights by `Q8_1` activations.
pub fn dot_q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    dispatch!(dot_q5_1, dot_q5_1_portable, w, a)
}

/// `Q4_K` weights by `Q8_K` activations.
pub fn dot_q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    dispatch!(dot_q4_k, dot_q4_k_portable, w, a)
}

/// `Q5_K` weights by `Q8_K` activations.
pub fn dot_q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    dispatch!(dot_q5_k, dot_q5_k_portable, w, a)
}

/// `Q6_K` weights by `Q8_K` activations. The activations come from [`quantize_q8_k`]:
/// the SIMD versions take the sums of their codes from `bsums`.
pub fn dot_q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    dispatch!(dot_q6_k, dot_q6_k_portable, w, a)
}

/// The sum of a row's per-block terms in the order the SIMD code adds them: block i into
/// lane i % 4 (each lane a running sum in block order), then `(l0 + l1) + (l2 + l3)`.
/// Four independent sums let a vector add take four blocks at once, with no chain of
/// scalar adds per block (the 32-weight formats' order; the k-quants sum in block order).
pub(crate) fn lane_sum(terms: impl Iterator<Item = f32>) -> f32 {
    let mut lanes = [0f32; 4];
    for (i, t) in terms.enumerate() {
        lanes[i % 4] += t;
    }
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

pub fn dot_q8_0_portable(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    lane_sum(w.iter().zip(a).map(|(w, a)| {
        let sumi = dot32(w.qs.iter().map(|&q| q as i32), &a.qs);
        sumi as f32 * (half(w.d) * half(a.d))
    }))
}

pub fn dot_q4_0_portable(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    lane_sum(w.iter().zip(a).map(|(w, a)| {
        let lo = dot32(w.qs.iter().map(|&b| (b & 0x0F) as i32 - 8), &a.qs[..QK / 2]);
        let hi = dot32(w.qs.iter().map(|&b| (b >> 4) as i32 - 8), &a.qs[QK / 2..]);
        (lo + hi) as f32 * (half(w.d) * half(a.d))
    }))
}

pub fn dot_q4_1_portable(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    lane_sum(w.iter().zip(a).map(|(w, a)| {
        let lo = dot32(w.qs.iter().map(|&b| (b & 0x0F) as i32), &a.qs[..QK / 2]);
        let hi = dot32(w.qs.iter().map(|&b| (b >> 4) as i32), &a.qs[QK / 2..]);
        (lo + hi) as f32 * (half(w.d) * a.d) + half(w.m) * a.s
    }))
}

pub fn dot_q5_0_portable(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
    lane_sum(w.iter().zip(a).map(|(w, a)| {
        let sumi = dot32(w.codes().into_iter().map(|q| q as i32 - 16), &a.qs);
        sumi as f32 * (half(w.d) * half(a.d))
    }))
}

pub fn dot_q5_1_portable(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
    lane_sum(w.iter().zip(a).map(|(w, a)| {
        let sumi = dot32(w.codes().into_iter().map(|q| q as i32), &a.qs);
        sumi as f32 * (half(w.d) * a.d) + half(w.m) * a.s
    }))
}

/// Q4_K and Q5_K: `codes(block, sub)` gives the 32 codes of sub-block `sub`.
fn dot_k4<B>(
    w: &[B],
    a: &[BlockQ8K],
    parts: impl Fn(&B) -> ([u8; 2], [u8; 2], &[u8; 12]),
    codes: impl Fn(&B, usize, usize) -> i32,
) -> f32 {
    let mut sum = 0f32;
    for (w, a) in w.iter().zip(a) {
        let (d, dmin, scales) = parts(w);
        let (mut sumi, mut summ) = (0i32, 0i32);
        for sub in 0..QK_K / 32 {
            let (sc, m) = scale_min_k4(sub, scales);
            let qa = &a.qs[32 * sub..32 * sub + 32];
            sumi += sc as i32 * dot32((0..32).map(|l| codes(w, sub, l)), qa);
            summ += m as i32 * (a.bsums[2 * sub] as i32 + a.bsums[2 * sub + 1] as i32);
        }
        sum += (a.d * half(d)) * sumi as f32 - (a.d * half(dmin)) * summ as f32;
    }
    sum
}

pub fn dot_q4_k_portable(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    dot_k4(
        w,
        a,
        |b| (b.d, b.dmin, &b.scales),
        |b, sub, l| {
            let byte = b.qs[32 * (sub / 2) + l];
            (if sub % 2 == 0 { byte & 0x0F } else { byte >> 4 }) as i32
        },
    )
}

pub fn dot_q5_k_portable(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    dot_k4(
        w,
        a,
        |b| (b.d, b.dmin, &b.scales),
        |b, sub, l| {
            let byte = b.qs[32 * (sub / 2) + l];
            let low = if sub % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            (low | (((b.qh[l] >> sub) & 1) << 4)) as i32
        },
    )
}

pub fn dot_q6_k_portable(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (w, a) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for half_index in 0..2 {
            let ql = &w.ql[64 * half_index..64 * half_index + 64];
            let qh = &w.qh[32 * half_index..32 * half_index + 32];
            for k in 0..4 {
                // weights 32k..32k+32 of this half: two sub-blocks of 16, each its scale
                for sub16 in 0..2 {
                    let mut part = 0i32;
                    for l in 16 * sub16..16 * sub16 + 16 {
                        let q = ql[l + 32 * (k % 2)];
                        let low = if k < 2 { q & 0x0F } else { q >> 4 };
                        let code = (low | (((qh[l] >> (2 * k)) & 3) << 4)) as i32 - 32;
                        part += code * a.qs[128 * half_index + 32 * k + l] as i32;
                    }
                    sumi += w.scales[8 * half_index + sub16 + 2 * k] as i32 * part;
                }
            }
        }
        sum += (a.d * half(w.d)) * sumi as f32;
    }
    sum
}

/// The activation block format a weight type's dot product reads (ggml's
/// `vec_dot_type`): each token's activations are quantized once per format, however
/// many matrices of that format read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivationFormat {
    Float,
    Q8_0,
    Q8_1,
    Q8K,
}

impl QuantType {
    pub fn activation_format(self) -> ActivationFormat {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => ActivationFormat::Float,
            QuantType::Q8_0 | QuantType::Q4_0 | QuantType::Q5_0 => ActivationFormat::Q8_0,
            QuantType::Q4_1 | QuantType::Q5_1 => ActivationFormat::Q8_1,
            QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => ActivationFormat::Q8K,
        }
    }
}

/// Activations of one token quantized in one [`ActivationFormat`]; the 32-value formats
/// also keep their blocks regrouped eight at a time for the several-token SIMD kernels
/// ([`ActGroup`]), unless quantized for a step of one token
/// ([`quantize_activations_alone`]).
pub enum Activations {
    Float(Vec<f32>),
    Q8_0(Vec<BlockQ8_0>, Option<Vec<ActGroup>>),
    Q8_1(Vec<BlockQ8_1>, Option<Vec<ActGroup>>),
    Q8K(Vec<BlockQ8K>),
}

/// Eight of a token's 32-value activation blocks, as the several-token SIMD kernels read
/// them: vector k of `codes` holds codes 4k..4k + 4 of block j in its
/// 32-bit lane j, so that products with weights regrouped the same way sum to eight
/// block totals in eight lanes, with no horizontal sums; then the blocks' scales (`d`,
/// widened from f16 for `Q8_0`: exact), `Q8_1`'s sums `s = d * sum(qs)` (zero for
/// `Q8_0`) and the integer sums of each block's codes, as arrays of eight. One record
/// per group: a kernel reaches all of it from one address.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct ActGroup {
    pub codes: [[i8; 32]; 8],
    pub d: [f32; 8],
    pub s: [f32; 8],
    pub sums: [i32; 8],
}

impl ActGroup {
    /// A token's blocks (each one's codes, scale and sum `s`) in groups of eight, a last
    /// group padded with zero blocks.
    fn groups<'a>(blocks: impl ExactSizeIterator<Item = (&'a [i8; QK], f32, f32)>) -> Vec<ActGroup> {
        let empty = ActGroup { codes: [[0; 32]; 8], d: [0.0; 8], s: [0.0; 8], sums: [0; 8] };
        let mut groups = vec![empty; blocks.len().div_ceil(8)];
        for (i, (qs, d, s)) in blocks.enumerate() {
            let (group, lane) = (&mut groups[i / 8], i % 8);
            for (k, four) in qs.chunks_exact(4).enumerate() {
                group.codes[k][4 * lane..4 * lane + 4].copy_from_slice(four);
            }
            group.d[lane] = d;
            group.s[lane] = s;
            group.sums[lane] = qs.iter().map(|&q| q as i32).sum();
        }
        groups
    }

    pub fn of_q8_0(blocks: &[BlockQ8_0]) -> Vec<ActGroup> {
        ActGroup::groups(blocks.iter().map(|b| (&b.qs, half(b.d), 0.0)))
    }

    pub fn of_q8_1(blocks: &[BlockQ8_1]) -> Vec<ActGroup> {
        ActGroup::groups(blocks.iter().map(|b| (&b.qs, b.d, b.s)))
    }
}

impl Activations {
    fn q8_0(&self) -> Option<&[ActGroup]> {
        if let Activations::Q8_0(_, Some(groups)) = self {
            Some(groups)
        } else {
            None
        }
    }
    fn q8_1(&self) -> Option<&[ActGroup]> {
        if let Activations::Q8_1(_, Some(groups)) = self {
            Some(groups)
        } else {
            None
        }
    }
    fn q8_k(&self) -> Option<&[BlockQ8K]> {
        if let Activations::Q8K(a) = self {
            Some(a)
        } else {
            None
        }
    }
}

/// `x` (whole blocks of the format) quantized as `format`, for any number of tokens.
pub fn quantize_activations(format: ActivationFormat, x: &[f32]) -> Activations {
    quantize(format, x, true)
}

/// `x` quantized as `format` for a step of this one token: the blocks are not regrouped
/// (the one-token kernels read them as they are), which a decode step of one request
/// would otherwise do for every matrix input; [`dot_rows`] refuses them with others.
pub fn quantize_activations_alone(format: ActivationFormat, x: &[f32]) -> Activations {
    quantize(format, x, false)
}

fn quantize(format: ActivationFormat, x: &[f32], regroup: bool) -> Activations {
    match format {
        ActivationFormat::Float => Activations::Float(x.to_vec()),
        ActivationFormat::Q8_0 => {
            let blocks = quantize_q8_0(x);
            let grouped = regroup.then(|| ActGroup::of_q8_0(&blocks));
            Activations::Q8_0(blocks, grouped)
        }
        ActivationFormat::Q8_1 => {
            let blocks = quantize_q8_1(x);
            let grouped = regroup.then(|| ActGroup::of_q8_1(&blocks));
            Activations::Q8_1(blocks, grouped)
        }
        ActivationFormat::Q8K => Activations::Q8K(quantize_q8_k(x)),
    }
}

fn view<B: Block>(row: &[u8]) -> &[B] {
    super::blocks::as_blocks::<B>(row).expect("rows are whole blocks, checked by the caller")
}

/// One weight row (its bytes: whole blocks of `ty`) times one token's activations,
/// which must be in `ty`'s [`ActivationFormat`] and as long as the row. `scratch` holds
/// a float row's widened weights (as long as the row; unused for quantized types).
pub fn dot_row(ty: QuantType, row: &[u8], a: &Activations, scratch: &mut [f32]) -> f32 {
    match (ty, a) {
        (QuantType::F32 | QuantType::F16 | QuantType::BF16, Activations::Float(x)) => {
            super::dequantize_serial(ty, row, scratch);
            // f32 products summed in f64: float weights need no quantized kernel here
            scratch.iter().zip(x).map(|(&w, &v)| (w * v) as f64).sum::<f64>() as f32
        }
        (QuantType::Q8_0, Activations::Q8_0(a, _)) => dot_q8_0(view(row), a),
        (QuantType::Q4_0, Activations::Q8_0(a, _)) => dot_q4_0(view(row), a),
        (QuantType::Q4_1, Activations::Q8_1(a, _)) => dot_q4_1(view(row), a),
        (QuantType::Q5_0, Activations::Q8_0(a, _)) => dot_q5_0(view(row), a),
        (QuantType::Q5_1, Activations::Q8_1(a, _)) => dot_q5_1(view(row), a),
        (QuantType::Q4K, Activations::Q8K(a)) => dot_q4_k(view(row), a),
        (QuantType::Q5K, Activations::Q8K(a)) => dot_q5_k(view(row), a),
        (QuantType::Q6K, Activations::Q8K(a)) => dot_q6_k(view(row), a),
        _ => panic!("{ty} weights read {:?} activations", ty.activation_format()),
    }
}

/// Tokens whose activation rows a SIMD call takes at once (their slices gathered on the
/// stack): a weight block is unpacked once per group.
const TOKEN_GROUP: usize = 16;

/// `run` over groups of up to [`TOKEN_GROUP`] tokens, each token's view `T` of its
/// activations picked by `get`, with the outputs from the group's first token on;
/// `None` if a token's activations are in another format.
fn act_groups<'a, T: Copy + 'a>(
    acts: &'a [Activations],
    out: &mut [f32],
    get: impl Fn(&'a Activations) -> Option<T>,
    mut run: impl FnMut(&[T], &mut [f32]),
) -> Option<()> {
    for (g, acts) in acts.chunks(TOKEN_GROUP).enumerate() {
        let first = get(&acts[0])?;
        let mut views: [T; TOKEN_GROUP] = [first; TOKEN_GROUP];
        for (v, a) in views.iter_mut().zip(acts).skip(1) {
            *v = get(a)?;
        }
        run(&views[..acts.len()], &mut out[g * TOKEN_GROUP..]);
    }
    Some(())
}

/// Weight rows of `row_bytes` each (whole blocks of `ty`) times each token's
/// activations: `out[r * tokens + t] == dot_row(ty, row r, &acts[t], scratch)`, bit for
/// bit, whatever the number of tokens (a request's numbers do not depend on what shares
/// its step). For several tokens, the SIMD versions unpack each weight block once for a
/// group of tokens and run the rows in one call; otherwise this is the loop over
/// [`dot_row`].
pub fn dot_rows(
    ty: QuantType,
    rows: &[u8],
    row_bytes: usize,
    acts: &[Activations],
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let tokens = acts.len();
    assert_eq!(rows.len() % row_bytes.max(1), 0, "whole rows");
    assert_eq!(out.len(), rows.len() / row_bytes.max(1) * tokens, "one output per row and token");
    if tokens == 0 || rows.is_empty() {
        return;
    }
    let alone = |a: &Activations| matches!(a, Activations::Q8_0(_, None) | Activations::Q8_1(_, None));
    assert!(tokens == 1 || !acts.iter().any(alone), "activations quantized for one token, given with others");
    // one token: the one-token kernels ([`dot_row`]) regroup nothing per weight block,
    // which is what a block costs when no other token shares its unpacking
    #[cfg(target_arch = "x86_64")]
    if tokens > 1 {
        use super::simd::{avx2, level, vnni, Level};
        macro_rules! simd {
            ($name:ident, $get:expr) => {{
                let level = level();
                if level != Level::Portable {
                    let row_blocks = row_bytes / ty.block_bytes();
                    let done = act_groups(acts, out, $get, |a, o| match level {
                        // SAFETY: the level's CPU features are present (detected at run time)
                        Level::Avx512Vnni => unsafe { vnni::$name(view(rows), row_blocks, a, o, tokens) },
                        // SAFETY: as above
                        _ => unsafe { avx2::$name(view(rows), row_blocks, a, o, tokens) },
                    });
                    if done.is_none() {
                        panic!("{ty} weights read {:?} activations", ty.activation_format());
                    }
                    return;
                }
            }};
        }
        match ty {
            QuantType::Q8_0 => simd!(dot_tokens_q8_0, Activations::q8_0),
            QuantType::Q4_0 => simd!(dot_tokens_q4_0, Activations::q8_0),
            QuantType::Q5_0 => simd!(dot_tokens_q5_0, Activations::q8_0),
            QuantType::Q4_1 => simd!(dot_tokens_q4_1, Activations::q8_1),
            QuantType::Q5_1 => simd!(dot_tokens_q5_1, Activations::q8_1),
            QuantType::Q4K => simd!(dot_tokens_q4_k, Activations::q8_k),
            QuantType::Q5K => simd!(dot_tokens_q5_k, Activations::q8_k),
            QuantType::Q6K => simd!(dot_tokens_q6_k, Activations::q8_k),
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => {}
        }
    }
    for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(tokens)) {
        for (o, a) in out.iter_mut().zip(acts) {
            *o = dot_row(ty, row, a, scratch);
        }
    }
}

/// Rows of weights from which a product is split over threads.
const PARALLEL_FROM_BYTES: usize = 1 << 20;

/// `out[t * rows + r] = weight row r . x[t]` for `tokens = x.len() / cols` tokens: `w` is
/// `rows` rows of `cols` weights of type `ty` (whole blocks each), as a GGUF stores a
/// `[rows, cols]` matrix. Each token's activations are quantized once; each weight row
/// is read once for all tokens.
pub fn matmul(
    ty: QuantType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let bad = |field, message: String| Err(QuantError { field, message });
    let Some(row_bytes) = ty.bytes_for(cols) else {
        return bad(
            "cols",
            format!("{cols} weights per row are not whole {ty} blocks of {}", ty.block_elems()),
        );
    };
    if w.len() != rows * row_bytes {
        return bad(
            "w",
            format!("{} bytes; {rows} rows of {cols} {ty} weights take {}", w.len(), rows * row_bytes),
        );
    }
    if cols == 0 || x.len() % cols != 0 {
        return bad("x", format!("{} values are not whole rows of {cols}", x.len()));
    }
    let tokens = x.len() / cols;
    if out.len() != tokens * rows {
        return bad("out", format!("out has {} values; want tokens x rows = {}", out.len(), tokens * rows));
    }
    if tokens == 0 || rows == 0 {
        return Ok(());
    }
    let format = ty.activation_format();
    let acts: Vec<Activations> = x.chunks_exact(cols).map(|xt| quantize_activations(format, xt)).collect();
    let threads = if w.len() < PARALLEL_FROM_BYTES { 1 } else { available_threads().min(rows) };
    let rows_per = rows.div_ceil(threads.max(1)).max(1);
    let run = |chunk: &[u8]| -> Vec<f32> {
        let n = chunk.len() / row_bytes;
        let mut local = vec![0f32; n * tokens];
        let mut scratch = vec![0f32; if ty.block_elems() == 1 { cols } else { 0 }];
        dot_rows(ty, chunk, row_bytes, &acts, &mut scratch, &mut local);
        local
    };
    let results: Vec<(usize, Vec<f32>)> = if threads < 2 {
        vec![(0, run(w))]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = w
                .chunks(rows_per * row_bytes)
                .enumerate()
                .map(|(c, chunk)| {
                    let run = &run;
                    scope.spawn(move || (c * rows_per, run(chunk)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("matmul worker")).collect()
        })
    };
    for (first, local) in results {
        for (i, per_token) in local.chunks_exact(tokens).enumerate() {
            for (t, &v) in per_token.iter().enumerate() {
                out[t * rows + first + i] = v;
            }
        }
    }
    Ok(())
}
