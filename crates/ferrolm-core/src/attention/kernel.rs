//! The inner loop of one task: a block of query rows (the query heads of one KV head, for
//! a few consecutive tokens of one request) over a range of that request's keys, read in
//! place from the pool a tile at a time, with an online softmax. The result is a partial
//! state per row (running max, running sum, unnormalised output) that `merge` combines
//! with the other tasks of the same rows.
//!
//! The dot products and the accumulation run over the contiguous head dimension in
//! fixed-width lanes, which the compiler turns into vector code; on x86-64 a copy of the
//! loop compiled for AVX2 + FMA is chosen at run time where the CPU has them.

use super::elem::KvElem;
use crate::sampling::simd::exp_nonpositive;

/// Keys widened to f32 at once: a tile of K and V stays in L1 for every row that reads it.
pub(super) const TILE: usize = 64;

/// Per-row partial state in a task's output: `[max, sum, acc[head_dim]]`.
pub(super) const STATE_HEADER: usize = 2;

/// What one task reads.
pub(super) struct TaskInput<'a, E> {
    /// `[rows, head_dim]`, already multiplied by the softmax scale.
    pub queries: &'a [f32],
    /// Per row: the index of its query's own key in `slots` (its position).
    pub positions: &'a [u32],
    /// The request's KV slots, in position order.
    pub slots: &'a [u32],
    pub keys: std::ops::Range<usize>,
    pub k_pool: &'a [E],
    pub v_pool: &'a [E],
    pub kv_head: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Keys a query sees, counting its own: `usize::MAX` without a sliding window.
    pub window: usize,
}

/// A worker's scratch, reused across its tasks.
pub(super) struct Workspace {
    pub queries: Vec<f32>,
    pub positions: Vec<u32>,
    k: Vec<f32>,
    v: Vec<f32>,
    scores: Vec<f32>,
}

impl Workspace {
    pub fn new(head_dim: usize) -> Self {
        Workspace {
            queries: Vec::new(),
            positions: Vec::new(),
            k: vec![0.0; TILE * head_dim],
            v: vec![0.0; TILE * head_dim],
            scores: vec![0.0; TILE],
        }
    }
}

/// Multiply-add, separate or fused (the fused one only where the CPU has FMA: elsewhere
/// `mul_add` is a slow library call).
trait Arith {
    fn fma(a: f32, b: f32, c: f32) -> f32;
}

struct Separate;
impl Arith for Separate {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

#[cfg(target_arch = "x86_64")]
struct Fused;
#[cfg(target_arch = "x86_64")]
impl Arith for Fused {
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Runs one task into `state` (`[rows, STATE_HEADER + head_dim]`).
pub(super) fn run_task<E: KvElem>(input: &TaskInput<'_, E>, work: &mut Workspace, state: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU has the features `run_avx2` is compiled for.
            unsafe { run_avx2(input, work, state) };
            return;
        }
    }
    run::<E, Separate>(input, work, state);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<E: KvElem>(input: &TaskInput<'_, E>, work: &mut Workspace, state: &mut [f32]) {
    run::<E, Fused>(input, work, state);
}

#[inline(always)]
fn dot<A: Arith>(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [0f32; L];
    let (ac, bc) = (a.chunks_exact(L), b.chunks_exact(L));
    let mut tail = 0f32;
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        tail = A::fma(*x, *y, tail);
    }
    for (x, y) in ac.zip(bc) {
        for i in 0..L {
            lanes[i] = A::fma(x[i], y[i], lanes[i]);
        }
    }
    let mut width = L / 2;
    while width > 0 {
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
        width /= 2;
    }
    lanes[0] + tail
}

#[inline(always)]
fn run<E: KvElem, A: Arith>(input: &TaskInput<'_, E>, work: &mut Workspace, state: &mut [f32]) {
    let d = input.head_dim;
    let stride = STATE_HEADER + d;
    let rows = input.positions.len();
    for row in state.chunks_exact_mut(stride).take(rows) {
        row[0] = f32::NEG_INFINITY;
        row[1..].fill(0.0);
    }
    let mut start = input.keys.start;
    while start < input.keys.end {
        let n = TILE.min(input.keys.end - start);
        let tile_slots = &input.slots[start..start + n];
        let at = |slot: u32| (slot as usize * input.num_kv_heads + input.kv_head) * d;
        // f32 pools are read in place; others are widened a tile at a time
        let direct = E::as_f32(input.k_pool).zip(E::as_f32(input.v_pool));
        if direct.is_none() {
            for (i, &slot) in tile_slots.iter().enumerate() {
                let a = at(slot);
                E::load(&input.k_pool[a..a + d], &mut work.k[i * d..(i + 1) * d]);
                E::load(&input.v_pool[a..a + d], &mut work.v[i * d..(i + 1) * d]);
            }
        }
        let (k_tile, v_tile) = (&work.k, &work.v);
        let key = |i: usize| match direct {
            Some((k, _)) => &k[at(tile_slots[i])..at(tile_slots[i]) + d],
            None => &k_tile[i * d..(i + 1) * d],
        };
        let value = |i: usize| match direct {
            Some((_, v)) => &v[at(tile_slots[i])..at(tile_slots[i]) + d],
            None => &v_tile[i * d..(i + 1) * d],
        };
        for (r, row) in state.chunks_exact_mut(stride).take(rows).enumerate() {
            // the keys of this tile the row sees: a window ending at its own
            let own = input.positions[r] as usize;
            let lo = (own + 1).saturating_sub(input.window).max(start);
            let hi = (own + 1).min(start + n);
            if lo >= hi {
                continue;
            }
            let q = &input.queries[r * d..(r + 1) * d];
            let scores = &mut work.scores[..hi - lo];
            let mut tile_max = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                *s = dot::<A>(q, key(lo - start + j));
                tile_max = tile_max.max(*s);
            }
            let (head, acc) = row.split_at_mut(STATE_HEADER);
            let max = head[0].max(tile_max);
            // exp(-inf) is 0: the first tile a row sees scales nothing in
            let rescale = exp_nonpositive(head[0] - max);
            let mut sum = head[1] * rescale;
            for s in scores.iter_mut() {
                *s = exp_nonpositive(*s - max);
                sum += *s;
            }
            if rescale != 1.0 {
                for a in acc.iter_mut() {
                    *a *= rescale;
                }
            }
            for (j, &p) in scores.iter().enumerate() {
                for (a, &x) in acc.iter_mut().zip(value(lo - start + j)) {
                    *a = A::fma(p, x, *a);
                }
            }
            head[0] = max;
            head[1] = sum;
        }
        start += n;
    }
}
