//! The AVX2 inner loop of one task, for head dimensions of whole 8-lane vectors: the
//! task's keys are read a tile at a time and, within a tile, one KV head at a time. That
//! head's keys and values of the tile (widened to f32 where the pool is narrower) are
//! small enough to stay in L1 while every query row of its group reads them: the three
//! query heads of a decode token on a 9/3-head model, all of them for every token of a
//! prefill block.
//!
//! Scores are computed eight keys at a time (eight independent FMA chains, one shared
//! reduction), and a key's score is bit for bit the one `kernel`'s four-key product
//! gives, so the tile size and the task split never change a score. Values are summed
//! into the row's accumulator 64 lanes at a time (eight independent FMA chains, in the
//! same order as `kernel`). The next tile's slot rows are prefetched while this one
//! computes: a request's slots may lie anywhere in the pool.

use std::arch::x86_64::*;

use super::elem::KvElem;
use super::kernel::{fold_tile, TaskInput, Workspace, STATE_HEADER};
use crate::quant::blocks::{BlockQ8_0, QK};

/// Keys per tile: one KV head's keys and values of a tile in f32 take
/// `2 * KEYS * head_dim * 4` bytes, 16 KiB at head_dim 64.
const KEYS: usize = 32;

/// Runs one task into `state` (`[rows, STATE_HEADER + head_dim]`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C, and `input.head_dim` must be a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run<E: KvElem>(input: &TaskInput<'_, E>, work: &mut Workspace, state: &mut [f32]) {
    let d = input.head_dim;
    assert!(d % 8 == 0 && d > 0);
    let row_len = input.num_kv_heads * d; // one slot: every KV head
    let group = input.num_heads / input.num_kv_heads;
    let stride = STATE_HEADER + d;
    let tokens = input.positions.len();
    for row in state.chunks_exact_mut(stride).take(tokens * input.num_heads) {
        row[0] = f32::NEG_INFINITY;
        row[1..].fill(0.0);
    }
    let scores = &mut work.scores;
    if scores.len() < KEYS {
        scores.resize(KEYS, 0.0);
    }
    let (k_pool, v_pool) = (input.k_pool, input.v_pool);
    let mut start = input.keys.start;
    while start < input.keys.end {
        let n = KEYS.min(input.keys.end - start);
        let tile = &input.slots[start..start + n];
        for kv in 0..input.num_kv_heads {
            let at = kv * d;
            let mut rows: [usize; KEYS] = [0; KEYS]; // where each key's head starts in the pools
            for (i, &slot) in tile.iter().enumerate() {
                rows[i] = slot as usize * row_len + at;
                assert!(rows[i] + d <= k_pool.len() * E::VALUES && rows[i] + d <= v_pool.len() * E::VALUES);
            }
            for (t, &own) in input.positions.iter().enumerate() {
                // the keys of this tile the token sees: a window ending at its own
                let own = own as usize;
                let lo = (own + 1).saturating_sub(input.window).max(start);
                let hi = (own + 1).min(start + n);
                if lo >= hi {
                    continue;
                }
                let seen = &rows[lo - start..hi - start];
                for h in kv * group..(kv + 1) * group {
                    let r = t * input.num_heads + h;
                    let q = &input.queries[r * d..(r + 1) * d];
                    let scores = &mut scores[..hi - lo];
                    // SAFETY: the CPU has AVX2, FMA and F16C; every key and value row
                    // `seen[j]..seen[j] + d` is within its pool (asserted above).
                    unsafe { score_keys(q, k_pool.as_ptr(), seen, scores) };
                    let acc = fold_tile(&mut state[r * stride..(r + 1) * stride], scores);
                    // SAFETY: as for `score_keys`; acc is d long.
                    unsafe { accumulate(acc, scores, v_pool.as_ptr(), seen) };
                }
            }
        }
        start += n;
    }
}

/// `out[j] = q . keys[rows[j]..][..d]`, eight keys at a time, then four, then one. Every
/// score is the same float whatever its neighbours: the same FMA chain per key and the
/// same reduction, `((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))`.
///
/// # Safety
/// `keys.add(rows[j])` must have `q.len()` (a multiple of 8) readable elements.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_keys<E: KvElem>(q: &[f32], keys: *const E, rows: &[usize], out: &mut [f32]) {
    let len = rows.len();
    let mut j = 0;
    // SAFETY (all): the caller's; j + 8 (or 4, or 1) <= len entries of out.
    unsafe {
        while j + 8 <= len {
            let r: [usize; 8] = rows[j..j + 8].try_into().expect("8 rows");
            _mm256_storeu_ps(out.as_mut_ptr().add(j), dots::<E, 8>(q, keys, r));
            j += 8;
        }
        while j + 4 <= len {
            let r: [usize; 4] = rows[j..j + 4].try_into().expect("4 rows");
            _mm_storeu_ps(out.as_mut_ptr().add(j), _mm256_castps256_ps128(dots::<E, 4>(q, keys, r)));
            j += 4;
        }
        while j < len {
            out[j] = _mm256_cvtss_f32(dots::<E, 1>(q, keys, [rows[j]]));
            j += 1;
        }
    }
}

/// The dot products of `q` with `N` keys (N = 1, 4 or 8), in the first N lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dots<E: KvElem, const N: usize>(q: &[f32], keys: *const E, rows: [usize; N]) -> __m256 {
    let n = q.len();
    // SAFETY: the caller's (i + 8 <= n elements of q and of every key row).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        if let Some(blocks) = E::q8_0_blocks(keys) {
            // a block's codes against the query, then its scale once: (q . c) * d
            let mut i = 0;
            while i < n {
                let x: [__m256; 4] = std::array::from_fn(|s| _mm256_loadu_ps(q.as_ptr().add(i + 8 * s)));
                for (a, &row) in acc.iter_mut().zip(&rows) {
                    let block = &*blocks.add((row + i) / QK);
                    let mut sum = _mm256_mul_ps(x[0], codes8(block, 0));
                    for (s, &x) in x.iter().enumerate().skip(1) {
                        sum = _mm256_fmadd_ps(x, codes8(block, 8 * s), sum);
                    }
                    *a = _mm256_fmadd_ps(sum, scale(block), *a);
                }
                i += QK;
            }
        } else {
            let mut i = 0;
            while i < n {
                let x = _mm256_loadu_ps(q.as_ptr().add(i));
                for (a, &row) in acc.iter_mut().zip(&rows) {
                    *a = _mm256_fmadd_ps(x, E::load8(keys, row + i), *a);
                }
                i += 8;
            }
        }
        let abcd = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
        let efgh = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
        let low = _mm256_permute2f128_ps::<0x20>(abcd, efgh);
        let high = _mm256_permute2f128_ps::<0x31>(abcd, efgh);
        _mm256_add_ps(low, high)
    }
}

/// `acc += sum_j weights[j] * values[rows[j]..][..len(acc)]`, up to 64 lanes of `acc`
/// held in registers across the rows (independent FMA chains).
///
/// # Safety
/// As `score_keys`, with `acc.len()` elements per row.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate<E: KvElem>(acc: &mut [f32], weights: &[f32], values: *const E, rows: &[usize]) {
    let len = acc.len();
    let mut base = 0;
    // SAFETY (each call): the caller's, and base + 8C <= len.
    unsafe {
        while base < len {
            match (len - base) / 8 {
                8.. => base += accumulate_lanes::<E, 8>(acc, base, weights, values, rows),
                4..=7 => base += accumulate_lanes::<E, 4>(acc, base, weights, values, rows),
                2 | 3 => base += accumulate_lanes::<E, 2>(acc, base, weights, values, rows),
                _ => base += accumulate_lanes::<E, 1>(acc, base, weights, values, rows),
            }
        }
    }
}

/// `acc[base..base + 8C] += sum_j weights[j] * values[rows[j] + base..][..8C]`; returns 8C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn accumulate_lanes<E: KvElem, const C: usize>(
    acc: &mut [f32],
    base: usize,
    weights: &[f32],
    values: *const E,
    rows: &[usize],
) -> usize {
    assert!(base + 8 * C <= acc.len());
    // SAFETY: base + 8C <= len of acc; the rows, the caller's.
    unsafe {
        let mut r = [_mm256_setzero_ps(); C];
        for (c, reg) in r.iter_mut().enumerate() {
            *reg = _mm256_loadu_ps(acc.as_ptr().add(base + 8 * c));
        }
        if let Some(blocks) = E::q8_0_blocks(values) {
            // the weight times a block's scale once, then times each of its codes
            for (&p, &row) in weights.iter().zip(rows) {
                let w = _mm256_set1_ps(p);
                for (c, reg) in r.iter_mut().enumerate() {
                    let at = row + base + 8 * c;
                    let block = &*blocks.add(at / QK);
                    let wd = _mm256_mul_ps(w, scale(block));
                    *reg = _mm256_fmadd_ps(wd, codes8(block, at % QK), *reg);
                }
            }
        } else {
            for (&p, &row) in weights.iter().zip(rows) {
                let w = _mm256_set1_ps(p);
                let v = row + base;
                for (c, reg) in r.iter_mut().enumerate() {
                    *reg = _mm256_fmadd_ps(w, E::load8(values, v + 8 * c), *reg);
                }
            }
        }
        for (c, reg) in r.iter().enumerate() {
            _mm256_storeu_ps(acc.as_mut_ptr().add(base + 8 * c), *reg);
        }
    }
    8 * C
}

/// A Q8_0 block's scale in every lane.
#[target_feature(enable = "avx2,f16c")]
#[inline]
fn scale(block: &BlockQ8_0) -> __m256 {
    let bits = u16::from_le_bytes(block.d) as i32;
    _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
}

/// Codes `at..at + 8` of a Q8_0 block (`at` at most 24), as floats.
#[target_feature(enable = "avx2")]
#[inline]
fn codes8(block: &BlockQ8_0, at: usize) -> __m256 {
    let eight: &[i8; 8] = block.qs[at..at + 8].try_into().expect("8 codes");
    // SAFETY: eight readable bytes, loaded unaligned.
    let packed = unsafe { _mm_loadl_epi64(eight.as_ptr().cast::<__m128i>()) };
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(packed))
}
