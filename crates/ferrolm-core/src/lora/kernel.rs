//! The batched update: each run of token rows gets its own adapter's `B (A x)` added to
//! the base projection's output, in one call per layer and projection.
//!
//! A token's update is two thin products: shrink (`rank` dots of length `in_dim`) then
//! expand (`rank` axpys of length `out_dim`). Tokens are taken in blocks of [`BLOCK`] so
//! that each row of `A` and of `B` is read once per block while it is in cache, not once
//! per token. Each row's arithmetic is the same whatever block, task or step it falls
//! in, so a token gets the same floats alone or in a batch.
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
    let tokens = if out_dim == 0 { 0 } else { out.len() / out_dim };
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
        let n = per_piece.div_ceil(per_token).max(1);
        for (x, out) in p.x.chunks(n * in_dim).zip(p.out.chunks_mut(n * out_dim)) {
            cut.push(Piece { low_rank: p.low_rank, x, out });
        }
    }
    cut.into_par_iter().for_each(|p| update(p.low_rank, p.x, p.out));
}

/// [`update_lanes`] compiled for AVX2 where the CPU has it (twice the lanes of the
/// x86-64 baseline); the same operations in the same order, so the same floats.
fn update(low_rank: &LowRank, x: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (detected above)
        return unsafe { update_avx2(low_rank, x, out) };
    }
    update_lanes(low_rank, x, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn update_avx2(low_rank: &LowRank, x: &[f32], out: &mut [f32]) {
    update_lanes(low_rank, x, out)
}

/// `out[t] += b_t^T (a x[t])` for every row `t` of `x`, [`ROWS`] tokens at a time (the
/// last few one by one).
#[inline(always)]
fn update_lanes(low_rank: &LowRank, x: &[f32], out: &mut [f32]) {
    let (in_dim, out_dim) = (low_rank.in_dim, low_rank.out_dim);
    let mut x_rows = x.chunks_exact(ROWS * in_dim);
    let mut out_rows = out.chunks_exact_mut(ROWS * out_dim);
    for (x, out) in x_rows.by_ref().zip(out_rows.by_ref()) {
        update_rows::<ROWS>(low_rank, x, out);
    }
    let rest = x_rows.remainder().chunks_exact(in_dim);
    for (x, out) in rest.zip(out_rows.into_remainder().chunks_exact_mut(out_dim)) {
        update_rows::<1>(low_rank, x, out);
    }
}

/// Tokens updated together: each value of `A` and `B` loaded once for all of them, and
/// `2 * ROWS` independent sums in flight.
const ROWS: usize = 4;
/// Lanes of one dot product: its 16 running sums are added up in a fixed order at the end.
const LANES: usize = 16;
/// Output columns a row's sums cover between loads and stores of `out`.
const COLS: usize = 16;

/// The update of `R` consecutive rows (`x`: `R * in_dim`, `out`: `R * out_dim`). Every
/// row's floats are the same whatever `R` is: its dots add the same products in the same
/// lanes, and each output adds its terms to `out` in rank order.
#[inline(always)]
fn update_rows<const R: usize>(low_rank: &LowRank, x: &[f32], out: &mut [f32]) {
    let LowRank { rank, in_dim, out_dim, ref a, ref b_t } = *low_rank;
    // shrink: shrunk[j][r] = a[j] . x[r]
    let mut shrunk = [[0f32; R]; 64];
    let mut shrunk_vec = Vec::new();
    let shrunk: &mut [[f32; R]] = if rank <= 64 {
        &mut shrunk[..rank]
    } else {
        shrunk_vec.resize(rank, [0f32; R]);
        &mut shrunk_vec
    };
    let xs: [&[f32]; R] = std::array::from_fn(|r| &x[r * in_dim..(r + 1) * in_dim]);
    for (a, s) in a.chunks_exact(in_dim).zip(shrunk.iter_mut()) {
        for r in 0..R {
            s[r] = dot(a, xs[r]);
        }
    }
    // expand: out[r] += sum_j shrunk[j][r] * b_t[j], COLS columns at a time
    let body = out_dim / COLS * COLS;
    for c in (0..body).step_by(COLS) {
        let mut acc = [[0f32; COLS]; R];
        for (r, acc) in acc.iter_mut().enumerate() {
            acc.copy_from_slice(&out[r * out_dim + c..][..COLS]);
        }
        for (b, s) in b_t.chunks_exact(out_dim).zip(shrunk.iter()) {
            let b = &b[c..c + COLS];
            for (acc, &s) in acc.iter_mut().zip(s) {
                for i in 0..COLS {
                    acc[i] += s * b[i];
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            out[r * out_dim + c..][..COLS].copy_from_slice(acc);
        }
    }
    for (b, s) in b_t.chunks_exact(out_dim).zip(shrunk.iter()) {
        for (r, &s) in s.iter().enumerate() {
            let out = &mut out[r * out_dim..][body..out_dim];
            for (o, b) in out.iter_mut().zip(&b[body..]) {
                *o += s * b;
            }
        }
    }
}

/// 16 running sums (one per lane, added in a fixed order at the end): the compiler keeps
/// them in vector registers, and the result does not depend on where the slices sit.
#[inline(always)]
fn dot(a: &[f32], x: &[f32]) -> f32 {
    let mut sums = [0f32; LANES];
    let (a_body, x_body) = (a.chunks_exact(LANES), x.chunks_exact(LANES));
    let (a_tail, x_tail) = (a_body.remainder(), x_body.remainder());
    for (a, x) in a_body.zip(x_body) {
        for i in 0..LANES {
            sums[i] += a[i] * x[i];
        }
    }
    for (i, (a, x)) in a_tail.iter().zip(x_tail).enumerate() {
        sums[i] += a * x;
    }
    sums.iter().sum()
}
