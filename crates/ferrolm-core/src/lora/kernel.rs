//! The batched update: each run of token rows gets its own adapter's `B (A x)` added to
//! the base projection's output, in one call per layer and projection.
//!
//! A token's update is two thin products: shrink (`rank` dots of length `in_dim`) then
//! expand (`rank` axpys of length `out_dim`, the scaling already in `b_t`). The expand of
//! a few tokens runs as one tile whose sums stay in registers ([`expand_tile`]). A row's
//! arithmetic is the same whatever tile, piece or step it falls in, and on every CPU
//! (AVX2 only widens the lanes), so a token gets the same floats alone or in a batch.
//!
//! Plain loops over slices, which the compiler vectorizes, reach about 35 GFLOP/s per
//! core on the 2-core AMD EPYC dev box (AVX2 path; 2048 tokens, 2048 -> 8192, rank 16:
//! 20 ms on one core, 10 ms on two). The `gemm` crate's AVX-512 FMA kernels did the same
//! two products in 12 ms on one core; they were not taken because they would give up the
//! row-for-row floats above, for an update that is a few percent of the base
//! projection's work at ranks 8..64.
//!
//! Groups cover disjoint rows, so their output rows are split into disjoint slices and
//! the pieces run on the caller's rayon pool (the model's) when the step is big enough to
//! pay for it (prefill, or many decodes): cut by tokens, several pieces per thread. A
//! small step (one decode) runs inline, since waking threads would cost more than the few
//! thousand multiply-adds it has.

use std::ops::Range;

use rayon::prelude::*;

use super::{Adapter, LowRank, Target};

/// A run of consecutive token rows (rows `tokens` of the step) that use `adapter`.
#[derive(Clone, Debug)]
pub struct TokenGroup<'a> {
    pub adapter: &'a Adapter,
    pub tokens: Range<usize>,
}

/// When to go parallel and how finely to cut.
#[derive(Clone, Copy, Debug)]
pub(super) struct Split {
    /// Multiply-adds of the whole call from which it runs on the pool.
    pub parallel_from: usize,
    /// Multiply-adds a piece holds at least (below, handing it over costs more than it saves).
    pub min_piece: usize,
}

const SPLIT: Split = Split { parallel_from: 64 << 10, min_piece: 16 << 10 };
/// Pieces per thread aimed at, so that a thread busy elsewhere does not hold up the step.
const PIECES_PER_THREAD: usize = 4;

/// Adds each group's update for (`layer`, `target`) to `out` (`[T][out_dim]` row-major)
/// from `x` (`[T][in_dim]`): for each group whose adapter has this projection,
/// `out[t] += b_t^T (a x[t])`. Rows in no group are untouched.
///
/// Panics (a caller's bug, not bad input) if the sizes disagree with each other or with
/// the adapters, if a group reaches past `T`, or if groups overlap.
pub fn apply(
    layer: usize,
    target: Target,
    x: &[f32],
    in_dim: usize,
    out: &mut [f32],
    out_dim: usize,
    groups: &[TokenGroup<'_>],
) {
    apply_split(layer, target, x, in_dim, out, out_dim, groups, SPLIT);
}

/// One group's rows: its matrices, its tokens' inputs and their output rows.
struct Piece<'a> {
    low_rank: &'a LowRank,
    x: &'a [f32],
    out: &'a mut [f32],
}

#[allow(clippy::too_many_arguments)]
pub(super) fn apply_split(
    layer: usize,
    target: Target,
    x: &[f32],
    in_dim: usize,
    out: &mut [f32],
    out_dim: usize,
    groups: &[TokenGroup<'_>],
    split: Split,
) {
    let tokens = out.len().checked_div(out_dim).unwrap_or(0);
    assert_eq!(out.len(), tokens * out_dim, "out is not whole rows of {out_dim}");
    assert_eq!(x.len(), tokens * in_dim, "x has not the {tokens} rows of {in_dim} that out has");
    let mut groups: Vec<&TokenGroup<'_>> = groups.iter().filter(|g| !g.tokens.is_empty()).collect();
    groups.sort_by_key(|g| g.tokens.start);
    // the groups' rows of `out`, cut off one after another (so they are disjoint)
    let mut pieces = Vec::with_capacity(groups.len());
    // `rest` is `out` from row `done`; groups so far end by row `seen`
    let (mut rest, mut done, mut seen) = (out, 0, 0);
    for group in groups {
        let Range { start, end } = group.tokens.clone();
        assert!(start >= seen, "token groups overlap (at row {start})");
        assert!(end <= tokens, "a token group reaches row {end} of {tokens}");
        seen = end;
        let Some(low_rank) = group.adapter.get(layer, target) else {
            continue;
        };
        assert_eq!((low_rank.in_dim, low_rank.out_dim), (in_dim, out_dim), "the adapter's sizes");
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((start - done) * out_dim);
        let (rows, tail) = tail.split_at_mut((end - start) * out_dim);
        pieces.push(Piece { low_rank, x: &x[start * in_dim..end * in_dim], out: rows });
        (rest, done) = (tail, end);
    }
    let work = |p: &Piece<'_>| p.out.len() / out_dim * p.low_rank.rank * (in_dim + out_dim);
    let total: usize = pieces.iter().map(work).sum();
    if total < split.parallel_from {
        for p in pieces {
            update(p.low_rank, p.x, p.out);
        }
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let per_piece = (total / (threads * PIECES_PER_THREAD)).max(split.min_piece);
    let mut cut = Vec::new();
    for p in pieces {
        let per_token = p.low_rank.rank * (in_dim + out_dim);
        // a whole number of expand tiles per piece
        let n = per_piece.div_ceil(per_token).next_multiple_of(ROWS);
        for (x, out) in p.x.chunks(n * in_dim).zip(p.out.chunks_mut(n * out_dim)) {
            cut.push(Piece { low_rank: p.low_rank, x, out });
        }
    }
    cut.into_par_iter().for_each(|p| update(p.low_rank, p.x, p.out));
}

/// [`update_lanes`] compiled for AVX2 and FMA where the CPU has them (twice the lanes of
/// the x86-64 baseline, and each multiply-add one fused instruction: half the arithmetic
/// instructions, which is what bounds the update at decode sizes), else for the baseline
/// with separate multiplies and adds. The CPU picks the path, never the row: each row's
/// floats are the same alone or in any batch on a machine (fused and separate rounding
/// differ in the last bits between machines, as the base model's kernels may).
fn update(low_rank: &LowRank, x: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA are present (detected above)
        return unsafe { update_avx2_fma(low_rank, x, out) };
    }
    update_lanes::<Separate>(low_rank, x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn update_avx2_fma(low_rank: &LowRank, x: &[f32], out: &mut [f32]) {
    update_lanes::<Fused>(low_rank, x, out)
}

/// How `acc + s * b` is computed: fused (one rounding; one instruction with FMA) or as a
/// multiply then an add.
trait MulAdd {
    fn mul_add(acc: f32, s: f32, b: f32) -> f32;
}

struct Fused;
struct Separate;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(acc: f32, s: f32, b: f32) -> f32 {
        s.mul_add(b, acc)
    }
}

impl MulAdd for Separate {
    #[inline(always)]
    fn mul_add(acc: f32, s: f32, b: f32) -> f32 {
        acc + s * b
    }
}

/// `out[t] += b_t^T (a x[t])` for every row `t` of `x`.
///
/// Shrink: a dot per (token, rank). Expand: [`ROWS`] tokens at a time, [`COLS`] columns
/// at a time ([`expand_tile`]): the tile's sums stay in registers through all the ranks,
/// and each loaded value of `b_t` serves all its tokens. The last few tokens take a plain
/// axpy per rank ([`expand_row`]), which adds the same terms in the same order: a row's
/// floats do not depend on which path it took.
#[inline(always)]
fn update_lanes<M: MulAdd>(low_rank: &LowRank, x: &[f32], out: &mut [f32]) {
    let LowRank { rank, in_dim, out_dim, ref a, ref b_t } = *low_rank;
    let mut shrunk = vec![0f32; ROWS * rank];
    let mut x_rows = x.chunks_exact(ROWS * in_dim);
    let mut out_rows = out.chunks_exact_mut(ROWS * out_dim);
    for (x, out) in x_rows.by_ref().zip(out_rows.by_ref()) {
        for (x, s) in x.chunks_exact(in_dim).zip(shrunk.chunks_exact_mut(rank)) {
            shrink::<M>(a, x, s);
        }
        expand_tile::<M, ROWS>(&shrunk, b_t, out);
    }
    let rest = x_rows.remainder().chunks_exact(in_dim);
    for (x, out) in rest.zip(out_rows.into_remainder().chunks_exact_mut(out_dim)) {
        let s = &mut shrunk[..rank];
        shrink::<M>(a, x, s);
        expand_row::<M>(s, b_t, out);
    }
}

/// Tokens whose expand runs together.
const ROWS: usize = 4;
/// Output columns whose sums a tile keeps in registers (`ROWS * COLS` floats: 8 AVX registers).
const COLS: usize = 16;

/// `shrunk[j] = a[j] . x`.
#[inline(always)]
fn shrink<M: MulAdd>(a: &[f32], x: &[f32], shrunk: &mut [f32]) {
    for (a, s) in a.chunks_exact(x.len()).zip(shrunk) {
        *s = dot::<M>(a, x);
    }
}

/// `out[r] += sum_j shrunk[r][j] * b_t[j]` for `R` rows (`shrunk`: `[R][rank]`, `out`:
/// `[R][out_dim]`), each output's terms added in rank order.
#[inline(always)]
fn expand_tile<M: MulAdd, const R: usize>(shrunk: &[f32], b_t: &[f32], out: &mut [f32]) {
    let out_dim = out.len() / R;
    let rank = b_t.len() / out_dim;
    let body = out_dim / COLS * COLS;
    for c in (0..body).step_by(COLS) {
        let mut acc = [[0f32; COLS]; R];
        for (r, acc) in acc.iter_mut().enumerate() {
            acc.copy_from_slice(&out[r * out_dim + c..][..COLS]);
        }
        for (j, b) in b_t.chunks_exact(out_dim).enumerate() {
            let b = &b[c..c + COLS];
            for (r, acc) in acc.iter_mut().enumerate() {
                let s = shrunk[r * rank + j];
                for i in 0..COLS {
                    acc[i] = M::mul_add(acc[i], s, b[i]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            out[r * out_dim + c..][..COLS].copy_from_slice(acc);
        }
    }
    if body < out_dim {
        for (out, shrunk) in out.chunks_exact_mut(out_dim).zip(shrunk.chunks_exact(rank)) {
            let b_tail = b_t.chunks_exact(out_dim).map(|b| &b[body..]);
            for (b, &s) in b_tail.zip(shrunk) {
                axpy::<M>(s, b, &mut out[body..]);
            }
        }
    }
}

/// `out += sum_j shrunk[j] * b_t[j]`, one rank at a time (for one token, streaming each
/// row of `b_t` once beats gathering 16-column pieces of every row).
#[inline(always)]
fn expand_row<M: MulAdd>(shrunk: &[f32], b_t: &[f32], out: &mut [f32]) {
    for (b, &s) in b_t.chunks_exact(out.len()).zip(shrunk) {
        axpy::<M>(s, b, out);
    }
}

#[inline(always)]
fn axpy<M: MulAdd>(s: f32, b: &[f32], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(b) {
        *o = M::mul_add(*o, s, *b);
    }
}

/// Lanes of a dot product.
const LANES: usize = 16;

/// 16 running sums (one per lane, added in a fixed order at the end): the compiler keeps
/// them in vector registers, and the result does not depend on where the slices sit.
#[inline(always)]
fn dot<M: MulAdd>(a: &[f32], x: &[f32]) -> f32 {
    let mut sums = [0f32; LANES];
    let (a_body, x_body) = (a.chunks_exact(LANES), x.chunks_exact(LANES));
    let (a_tail, x_tail) = (a_body.remainder(), x_body.remainder());
    for (a, x) in a_body.zip(x_body) {
        for i in 0..LANES {
            sums[i] = M::mul_add(sums[i], a[i], x[i]);
        }
    }
    for (i, (a, x)) in a_tail.iter().zip(x_tail).enumerate() {
        sums[i] = M::mul_add(sums[i], *a, *x);
    }
    sums.iter().sum()
}
