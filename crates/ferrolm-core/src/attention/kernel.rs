//! The inner loop of one task: a block of query rows (every query head of a few
//! consecutive tokens of one request) over a range of that request's keys, read in place
//! from the pool a tile at a time (a slot's keys of all KV heads are contiguous, so a tile
//! reads whole slot rows), with an online softmax. The result is a partial
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
    /// `[tokens * num_heads, head_dim]` (row `r` is token `r / num_heads`, head
    /// `r % num_heads`), already multiplied by the softmax scale.
    pub queries: &'a [f32],
    /// Per token: the index of its own key in `slots` (its position).
    pub positions: &'a [u32],
    /// The request's KV slots, in position order.
    pub slots: &'a [u32],
    pub keys: std::ops::Range<usize>,
    pub k_pool: &'a [E],
    pub v_pool: &'a [E],
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Keys a query sees, counting its own: `usize::MAX` without a sliding window.
    pub window: usize,
}

/// A worker's scratch, reused across its tasks.
pub(super) struct Workspace {
    pub queries: Vec<f32>,
    pub positions: Vec<u32>,
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) scores: Vec<f32>,
}

impl Workspace {
    /// For slot rows of `row` elements (KV heads times head_dim).
    pub fn new(row: usize) -> Self {
        Workspace {
            queries: Vec::new(),
            positions: Vec::new(),
            k: vec![0.0; TILE * row],
            v: vec![0.0; TILE * row],
            scores: vec![0.0; TILE],
        }
    }
}

/// Multiply-add, separate or fused (the fused one only where the CPU has FMA: elsewhere
/// `mul_add` is a slow library call).
trait Arith: Sized {
    fn fma(a: f32, b: f32, c: f32) -> f32;
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot::<Self>(a, b)
    }
    /// `q` against four keys at once.
    #[inline(always)]
    fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        k.map(|k| Self::dot(q, k))
    }
    /// `acc += sum_j weights[j] * rows[j][offset..offset + len(acc)]`.
    #[inline(always)]
    fn accumulate(acc: &mut [f32], weights: &[f32], rows: &[&[f32]], offset: usize) {
        let len = acc.len();
        for (&p, v) in weights.iter().zip(rows) {
            for (a, &x) in acc.iter_mut().zip(&v[offset..offset + len]) {
                *a = Self::fma(p, x, *a);
            }
        }
    }
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
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: `Fused` is only used inside `run_avx2`, on a CPU with AVX2 and FMA.
        unsafe { dot_avx2(a, b) }
    }
    #[inline(always)]
    fn dot4(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
        if q.len() % 8 != 0 {
            return k.map(|k| Self::dot(q, k));
        }
        // SAFETY: as for `dot`.
        unsafe { dot4_avx2(q, k) }
    }
    #[inline(always)]
    fn accumulate(acc: &mut [f32], weights: &[f32], rows: &[&[f32]], offset: usize) {
        if acc.len() % 8 != 0 {
            let len = acc.len();
            for (&p, v) in weights.iter().zip(rows) {
                for (a, &x) in acc.iter_mut().zip(&v[offset..offset + len]) {
                    *a = p.mul_add(x, *a);
                }
            }
            return;
        }
        let mut base = 0;
        // SAFETY: as for `dot`; each block stays within `acc` and every row (checked there).
        unsafe {
            while base < acc.len() {
                match (acc.len() - base).min(32) / 8 {
                    4 => accumulate_avx2::<4>(acc, base, weights, rows, offset),
                    3 => accumulate_avx2::<3>(acc, base, weights, rows, offset),
                    2 => accumulate_avx2::<2>(acc, base, weights, rows, offset),
                    _ => accumulate_avx2::<1>(acc, base, weights, rows, offset),
                }
                base += 32;
            }
        }
    }
}

/// Four dot products of one query row, reduced together: the horizontal sums, which cost
/// as much as the products at head_dim 32, are shared by the four (`q.len()` a multiple
/// of 8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn dot4_avx2(q: &[f32], k: [&[f32]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let n = q.len();
    for row in &k {
        assert!(row.len() >= n);
    }
    // SAFETY: i + 8 <= n <= the length of q and of every key row.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_loadu_ps(q.as_ptr().add(i));
            for (a, row) in acc.iter_mut().zip(&k) {
                *a = _mm256_fmadd_ps(x, _mm256_loadu_ps(row.as_ptr().add(i)), *a);
            }
            i += 8;
        }
        // [a0+a1, a2+a3 | b0+b1, b2+b3 ...] twice, then the two 128-bit halves
        let ab = _mm256_hadd_ps(acc[0], acc[1]);
        let cd = _mm256_hadd_ps(acc[2], acc[3]);
        let abcd = _mm256_hadd_ps(ab, cd);
        let sums = _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
        let mut out = [0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), sums);
        out
    }
}

/// `acc[base..base + 8C] += sum_j weights[j] * rows[j][offset + base..][..8C]`, the C vectors of
/// the accumulator held in registers across the rows (independent FMA chains).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn accumulate_avx2<const C: usize>(
    acc: &mut [f32],
    base: usize,
    weights: &[f32],
    rows: &[&[f32]],
    offset: usize,
) {
    use std::arch::x86_64::*;
    assert!(base + 8 * C <= acc.len());
    // SAFETY: base + 8C <= len of acc, and of every row (checked below).
    unsafe {
        let mut r = [_mm256_setzero_ps(); C];
        for (c, reg) in r.iter_mut().enumerate() {
            *reg = _mm256_loadu_ps(acc.as_ptr().add(base + 8 * c));
        }
        for (&p, row) in weights.iter().zip(rows) {
            assert!(offset + base + 8 * C <= row.len());
            let w = _mm256_set1_ps(p);
            let v = row.as_ptr().add(offset + base);
            for (c, reg) in r.iter_mut().enumerate() {
                *reg = _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * c)), *reg);
            }
        }
        for (c, reg) in r.iter().enumerate() {
            _mm256_storeu_ps(acc.as_mut_ptr().add(base + 8 * c), *reg);
        }
    }
}

/// The dot product in 256-bit registers (the portable lanes of `dot` compile to 64-bit
/// pieces here): two accumulators, one horizontal sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut i = 0;
    let mut tail = 0f32;
    // SAFETY (all loads): i + 8 <= n or i + 16 <= n elements of both slices.
    unsafe {
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        while i + 16 <= n {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), _mm256_loadu_ps(pb.add(i + 8)), s1);
            i += 16;
        }
        if i + 8 <= n {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            i += 8;
        }
        let s = _mm256_add_ps(s0, s1);
        let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
        let q = _mm_add_ss(q, _mm_movehdup_ps(q));
        for j in i..n {
            tail = a[j].mul_add(b[j], tail);
        }
        _mm_cvtss_f32(q) + tail
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
            if input.head_dim % 8 == 0 {
                // SAFETY: as below; the head dimension is whole 8-lane vectors.
                unsafe { super::grouped::run(input, work, state) };
                return;
            }
            // SAFETY: the CPU has the features `run_avx2` is compiled for.
            unsafe { run_avx2(input, work, state) };
            return;
        }
    }
    run::<E, Separate>(input, work, state);
}

/// The portable loop, whatever the CPU (tests compare it with the SIMD ones).
#[cfg(test)]
pub(super) fn run_portable<E: KvElem>(input: &TaskInput<'_, E>, work: &mut Workspace, state: &mut [f32]) {
    run::<E, Separate>(input, work, state);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<E: KvElem>(input: &TaskInput<'_, E>, work: &mut Workspace, state: &mut [f32]) {
    run::<E, Fused>(input, work, state);
}

#[inline(always)]
fn dot<A: Arith>(a: &[f32], b: &[f32]) -> f32 {
    // one vector register of lanes (AVX2), reduced once at the end
    const L: usize = 8;
    let mut lanes = [0f32; L];
    let (ac, bc) = (a.chunks_exact(L), b.chunks_exact(L));
    let mut tail = 0f32;
    for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
        tail = A::fma(*x, *y, tail);
    }
    for (x, y) in ac.zip(bc) {
        let (x, y): (&[f32; L], &[f32; L]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for i in 0..L {
            lanes[i] = A::fma(x[i], y[i], lanes[i]);
        }
    }
    let (lo, hi) = lanes.split_at(L / 2);
    let quad = [lo[0] + hi[0], lo[1] + hi[1], lo[2] + hi[2], lo[3] + hi[3]];
    (quad[0] + quad[2]) + (quad[1] + quad[3]) + tail
}

/// One tile's scores folded into a row's online-softmax state (`[max, sum, acc..]`): the
/// scores become their weights `exp(s - max)` under the row's new running max, the sum
/// takes them in and the accumulator is rescaled to that max. Returns the accumulator,
/// for the caller to add the tile's weighted values to.
#[inline(always)]
pub(super) fn fold_tile<'a>(row: &'a mut [f32], scores: &mut [f32]) -> &'a mut [f32] {
    let tile_max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let (head, acc) = row.split_at_mut(STATE_HEADER);
    let max = head[0].max(tile_max);
    // exp(-inf) is 0: the first tile a row sees scales nothing in
    let rescale = exp_nonpositive(head[0] - max);
    for s in scores.iter_mut() {
        *s = exp_nonpositive(*s - max);
    }
    head[1] = head[1] * rescale + lane_sum(scores);
    head[0] = max;
    if rescale != 1.0 {
        for a in acc.iter_mut() {
            *a *= rescale;
        }
    }
    acc
}

#[inline(always)]
fn lane_sum(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            lanes[i] += c[i];
        }
    }
    lanes.iter().chain(chunks.remainder()).sum()
}

#[inline(always)]
fn run<E: KvElem, A: Arith>(input: &TaskInput<'_, E>, work: &mut Workspace, state: &mut [f32]) {
    let d = input.head_dim;
    let row_len = input.num_kv_heads * d; // one slot: every KV head
    let group = input.num_heads / input.num_kv_heads;
    let stride = STATE_HEADER + d;
    let rows = input.positions.len() * input.num_heads;
    for row in state.chunks_exact_mut(stride).take(rows) {
        row[0] = f32::NEG_INFINITY;
        row[1..].fill(0.0);
    }
    let mut start = input.keys.start;
    while start < input.keys.end {
        let n = TILE.min(input.keys.end - start);
        let tile_slots = &input.slots[start..start + n];
        // f32 pools are read in place; others are widened a tile at a time
        let direct = E::as_f32(input.k_pool).zip(E::as_f32(input.v_pool));
        if direct.is_none() {
            for (i, &slot) in tile_slots.iter().enumerate() {
                let a = slot as usize * row_len;
                E::load(input.k_pool, a, &mut work.k[i * row_len..(i + 1) * row_len]);
                E::load(input.v_pool, a, &mut work.v[i * row_len..(i + 1) * row_len]);
            }
        }
        let mut key_rows: [&[f32]; TILE] = [&[]; TILE];
        let mut value_rows: [&[f32]; TILE] = [&[]; TILE];
        for (i, &slot) in tile_slots.iter().enumerate() {
            let a = slot as usize * row_len;
            (key_rows[i], value_rows[i]) = match direct {
                Some((k, v)) => (&k[a..a + row_len], &v[a..a + row_len]),
                None => (&work.k[i * row_len..(i + 1) * row_len], &work.v[i * row_len..(i + 1) * row_len]),
            };
        }
        for (r, row) in state.chunks_exact_mut(stride).take(rows).enumerate() {
            // the keys of this tile the row sees: a window ending at its own
            let own = input.positions[r / input.num_heads] as usize;
            let lo = (own + 1).saturating_sub(input.window).max(start);
            let hi = (own + 1).min(start + n);
            if lo >= hi {
                continue;
            }
            let offset = (r % input.num_heads) / group * d; // its KV head within a slot row
            let q = &input.queries[r * d..(r + 1) * d];
            let scores = &mut work.scores[..hi - lo];
            let keys = &key_rows[lo - start..hi - start];
            let key = |j: usize| &keys[j][offset..offset + d];
            let done = scores.len() / 4 * 4;
            for (c, four) in scores[..done].chunks_exact_mut(4).enumerate() {
                let j = 4 * c;
                four.copy_from_slice(&A::dot4(q, [key(j), key(j + 1), key(j + 2), key(j + 3)]));
            }
            for (j, s) in scores.iter_mut().enumerate().skip(done) {
                *s = A::dot(q, key(j));
            }
            let acc = fold_tile(row, scores);
            A::accumulate(acc, scores, &value_rows[lo - start..hi - start], offset);
        }
        start += n;
    }
}
