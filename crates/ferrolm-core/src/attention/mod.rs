//! Paged attention over the KV pool, on the CPU.
//!
//! The pool of one layer is two arrays `[num_slots, num_kv_heads, head_dim]` (keys and
//! values) in f32, f16, bf16 or Q8_0 blocks (see `elem`); a step is the engine's batch
//! columns: per new token its position, per request its new tokens (`qo_offsets`) and the slots it attends to in
//! position order (`kv_slots`, `kv_offsets`: cached prefix first, then its new tokens).
//! [`write_kv`] stores the step's new keys and values into their slots; [`attend`] reads
//! every request's keys and values where they are in the pool (no gather, no padding) and
//! writes each query head's output.
//!
//! Query `t` of a request sits at key index `positions[t]` of that request and sees the
//! keys up to it (causal), or only the last `sliding_window` of them. Query head `h` reads
//! KV head `h / (num_heads / num_kv_heads)` (grouped-query attention). Everything is
//! computed in f32 with an online softmax.
//!
//! The work is cut into tasks of (request, block of queries, block of keys): a query block
//! holds every query head of a few tokens (for a decode, one token), so a task reads each
//! slot's keys and values of all KV heads at once, contiguous in the pool; a context is
//! cut into blocks of 256 keys, always at the same keys, so that one long request does not
//! serialize the step and a row's result never depends on what else the step holds. Tasks run on scoped threads (the caller's thread among them), the
//! largest first; each leaves a partial softmax state per row, and the partials of a row
//! are merged at the end.
//!
//! The inner loop of a task is `grouped` on x86-64 CPUs with AVX2, FMA and F16C when the
//! head dimension is whole 8-lane vectors: keys and values are read from the pool as they
//! are (f16 and bf16 widened in registers) one KV head at a time, by every query row of
//! that head's group. Elsewhere it is `kernel`'s portable loop.

mod elem;
#[cfg(target_arch = "x86_64")]
mod grouped;
mod kernel;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::{Mutex, OnceLock};

pub use elem::KvElem;
pub use half::{bf16, f16};

use kernel::{run_task, TaskInput, Workspace, STATE_HEADER};

/// Heads and head size of one layer's attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// One step's columns (all `u32`, as the engine's plan gives them).
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    /// `[T]`: each new token's index among its request's `kv_slots`.
    pub positions: &'a [u32],
    /// `[B + 1]`: request `b`'s new tokens are `qo_offsets[b]..qo_offsets[b + 1]`.
    pub qo_offsets: &'a [u32],
    /// The slots each request attends to, in position order.
    pub kv_slots: &'a [u32],
    /// `[B + 1]`: request `b`'s slots are `kv_slots[kv_offsets[b]..kv_offsets[b + 1]]`.
    pub kv_offsets: &'a [u32],
}

/// How to attend.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Multiplies every score (usually `head_dim ** -0.5`).
    pub scale: f32,
    /// Keys a query sees, counting its own; `None`: all before it.
    pub sliding_window: Option<usize>,
    /// Threads to use, the caller's included; 0 = the machine's available parallelism.
    pub num_threads: usize,
    /// Upper bound on the keys of one task (tests use it to force split contexts);
    /// `None` lets the planner choose.
    pub max_keys_per_task: Option<usize>,
}

impl Options {
    pub fn new(scale: f32) -> Self {
        Options { scale, sliding_window: None, num_threads: 0, max_keys_per_task: None }
    }
}

/// Inputs that do not fit together; `field` names the argument at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionError {
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for AttentionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for AttentionError {}

fn fail<T>(field: &'static str, message: String) -> Result<T, AttentionError> {
    Err(AttentionError { field, message })
}

fn check_geometry(g: &Geometry) -> Result<(), AttentionError> {
    if g.num_heads == 0 || g.num_kv_heads == 0 || g.head_dim == 0 {
        return fail("geometry", format!("heads, KV heads and head_dim must be positive, got {g:?}"));
    }
    if g.num_heads % g.num_kv_heads != 0 {
        return fail(
            "geometry",
            format!("num_heads ({}) must be a multiple of num_kv_heads ({})", g.num_heads, g.num_kv_heads),
        );
    }
    Ok(())
}

/// Number of slots of a pool pair, checking they agree with the geometry, the pool's
/// element type and each other (lengths in values).
fn pool_slots<E: KvElem>(g: &Geometry, k_pool: &[E], v_pool: &[E]) -> Result<usize, AttentionError> {
    if g.head_dim % E::VALUES != 0 {
        return fail(
            "geometry",
            format!("a {} pool needs head_dim a multiple of {}, got {}", E::NAME, E::VALUES, g.head_dim),
        );
    }
    let (k_len, v_len) = (k_pool.len() * E::VALUES, v_pool.len() * E::VALUES);
    let row = g.num_kv_heads * g.head_dim;
    if k_len % row != 0 {
        return fail(
            "k_pool",
            format!("k_pool's size {k_len} is not a multiple of num_kv_heads * head_dim = {row}"),
        );
    }
    if v_len != k_len {
        return fail("v_pool", format!("v_pool has {v_len} elements, k_pool {k_len}: they must match"));
    }
    Ok(k_len / row)
}

fn check_offsets(field: &'static str, offsets: &[u32], total: usize, of: &str) -> Result<(), AttentionError> {
    if offsets.len() < 2 || offsets[0] != 0 || offsets[offsets.len() - 1] as usize != total {
        return fail(
            field,
            format!("{field} must start at 0 and end at len({of}) = {total}, with B + 1 >= 2 entries"),
        );
    }
    if offsets.windows(2).any(|w| w[0] > w[1]) {
        return fail(field, format!("{field} must not decrease"));
    }
    Ok(())
}

/// Stores the step's new keys and values (`[T, num_kv_heads, head_dim]` each, f32) into
/// their slots `out_slots` (`[T]`), narrowing to the pool's type.
pub fn write_kv<E: KvElem>(
    geometry: Geometry,
    out_slots: &[u32],
    keys: &[f32],
    values: &[f32],
    k_pool: &mut [E],
    v_pool: &mut [E],
) -> Result<(), AttentionError> {
    check_geometry(&geometry)?;
    let num_slots = pool_slots(&geometry, k_pool, v_pool)?;
    let row = geometry.num_kv_heads * geometry.head_dim;
    let expected = out_slots.len() * row;
    if keys.len() != expected {
        return fail(
            "keys",
            format!("keys has {} elements, want len(out_slots) * {row} = {expected}", keys.len()),
        );
    }
    if values.len() != expected {
        return fail("values", format!("values has {} elements, want {expected}", values.len()));
    }
    if let Some((i, &s)) = out_slots.iter().enumerate().find(|(_, &s)| s as usize >= num_slots) {
        return fail("out_slots", format!("out_slots[{i}] is {s}, but the pool has {num_slots} slots"));
    }
    for (t, &slot) in out_slots.iter().enumerate() {
        let (src, dst) = (t * row..(t + 1) * row, slot as usize * row);
        E::store(&keys[src.clone()], k_pool, dst);
        E::store(&values[src], v_pool, dst);
    }
    Ok(())
}

/// One unit of output rows: a query block of one request (every head of its tokens), over
/// the keys any of its queries sees; its tasks are `tasks[first_task..first_task + num_tasks]`.
struct Unit {
    request: usize,
    tokens: std::ops::Range<usize>,
    first_task: usize,
    num_tasks: usize,
}

struct Task {
    unit: usize,
    keys: std::ops::Range<usize>,
    /// Offset of its `[rows, STATE_HEADER + head_dim]` state in the scratch.
    state: usize,
    work: usize,
}

/// Query rows per task at most (tokens of a block times the query heads), unless one
/// token has more heads.
const ROWS_PER_TASK: usize = 64;
/// Keys per task: a request's context is cut at every multiple of this many keys,
/// whatever else the step holds, so that a query row's partial states, and the order they
/// are merged in, are the same in every step (a decode alone, a batch, a speculative
/// draft's rows): its output is bit for bit the same. A multiple of `kernel::TILE`.
const KEYS_PER_TASK: usize = 256;
/// Below this many row-key products in all (well under a millisecond of one core's work),
/// a helper thread costs more than it saves: spawning it and, on a busy machine, waiting
/// for it to be scheduled.
const MIN_PARALLEL_WORK: usize = 1 << 17;
/// The same inside a rayon pool, where a helper costs a task, not a thread: a decode of a
/// 2k-token context (heads x keys ~ 20k) is worth splitting there.
const MIN_PARALLEL_WORK_IN_POOL: usize = 1 << 12;

fn available_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// Attention of the step's queries (`[T, num_heads, head_dim]`, f32) over the pool, into
/// `out` (`[T, num_heads, head_dim]`). The step's own keys and values must already be in
/// the pool ([`write_kv`]).
pub fn attend<E: KvElem>(
    geometry: Geometry,
    step: &Step<'_>,
    queries: &[f32],
    k_pool: &[E],
    v_pool: &[E],
    options: &Options,
    out: &mut [f32],
) -> Result<(), AttentionError> {
    check_geometry(&geometry)?;
    let Geometry { num_heads, num_kv_heads, head_dim: d } = geometry;
    let num_slots = pool_slots(&geometry, k_pool, v_pool)?;
    let num_tokens = step.positions.len();
    let width = num_heads * d;
    if queries.len() != num_tokens * width {
        return fail(
            "queries",
            format!(
                "queries has {} elements, want len(positions) * {width} = {}",
                queries.len(),
                num_tokens * width
            ),
        );
    }
    if out.len() != queries.len() {
        return fail(
            "out",
            format!("out has {} elements, want {} (the queries' shape)", out.len(), queries.len()),
        );
    }
    check_offsets("qo_offsets", step.qo_offsets, num_tokens, "positions")?;
    check_offsets("kv_offsets", step.kv_offsets, step.kv_slots.len(), "kv_slots")?;
    if step.kv_offsets.len() != step.qo_offsets.len() {
        return fail("kv_offsets", "kv_offsets and qo_offsets must both have B + 1 entries".into());
    }
    if let Some((i, &s)) = step.kv_slots.iter().enumerate().find(|(_, &s)| s as usize >= num_slots) {
        return fail("kv_slots", format!("kv_slots[{i}] is {s}, but the pool has {num_slots} slots"));
    }
    if !options.scale.is_finite() {
        return fail("scale", format!("scale must be finite, got {}", options.scale));
    }
    let window = match options.sliding_window {
        Some(0) => return fail("sliding_window", "sliding_window must be at least 1".into()),
        Some(w) => w,
        None => usize::MAX,
    };
    let num_requests = step.qo_offsets.len() - 1;
    for b in 0..num_requests {
        let kv_len = (step.kv_offsets[b + 1] - step.kv_offsets[b]) as usize;
        let tokens = step.qo_offsets[b] as usize..step.qo_offsets[b + 1] as usize;
        if let Some(t) = tokens.clone().find(|&t| step.positions[t] as usize >= kv_len) {
            return fail(
                "positions",
                format!("positions[{t}] is {}, but its request has {kv_len} KV slots", step.positions[t]),
            );
        }
    }

    // plan: units of output rows, each cut into tasks over its keys
    let tokens_per_block = (ROWS_PER_TASK / num_heads).max(1);
    let mut units = Vec::new();
    let mut spans = Vec::new(); // keys each unit sees
    for b in 0..num_requests {
        let (t0, t1) = (step.qo_offsets[b] as usize, step.qo_offsets[b + 1] as usize);
        for start in (t0..t1).step_by(tokens_per_block) {
            let end = (start + tokens_per_block).min(t1);
            let block = &step.positions[start..end];
            let first = block.iter().min().map_or(0, |&p| (p as usize + 1).saturating_sub(window));
            let last = block.iter().max().map_or(0, |&p| p as usize + 1);
            units.push(Unit { request: b, tokens: start..end, first_task: 0, num_tasks: 0 });
            spans.push(first..last);
        }
    }
    let rows_of = |u: &Unit| u.tokens.len() * num_heads;
    let total_work: usize = units.iter().zip(&spans).map(|(u, s)| rows_of(u) * s.len()).sum();
    // inside a rayon pool (the CPU model's step) a helper is a task handed to a thread
    // already awake, a microsecond, not a thread to spawn: split far smaller work
    let in_pool = rayon::current_thread_index().is_some();
    let threads = match options.num_threads {
        0 if in_pool => rayon::current_num_threads(),
        0 => available_threads(),
        n => n,
    };
    let min_work = if in_pool { MIN_PARALLEL_WORK_IN_POOL } else { MIN_PARALLEL_WORK };
    let threads = if total_work < min_work { 1 } else { threads };
    let stride = STATE_HEADER + d;
    let mut tasks = Vec::new();
    let mut scratch_len = 0;
    for (index, (unit, span)) in units.iter_mut().zip(&spans).enumerate() {
        let rows = unit.tokens.len() * num_heads;
        let keys = options.max_keys_per_task.map_or(KEYS_PER_TASK, |cap| KEYS_PER_TASK.min(cap.max(1)));
        unit.first_task = tasks.len();
        let mut k0 = span.start;
        loop {
            // cut at multiples of `keys` from key 0, not from the span's start (a sliding
            // window's start moves with the query block)
            let k1 = ((k0 / keys + 1) * keys).min(span.end);
            tasks.push(Task { unit: index, keys: k0..k1, state: scratch_len, work: rows * (k1 - k0) });
            scratch_len += rows * stride;
            k0 = k1;
            if k0 >= span.end {
                break;
            }
        }
        unit.num_tasks = tasks.len() - unit.first_task;
    }

    let mut scratch = vec![0f32; scratch_len];
    {
        // hand each task its own piece of the scratch, largest tasks first
        let mut pieces: Vec<(usize, &mut [f32])> = Vec::with_capacity(tasks.len());
        let mut rest: &mut [f32] = &mut scratch;
        for (i, task) in tasks.iter().enumerate() {
            let rows = rows_of(&units[task.unit]);
            let (mine, tail) = rest.split_at_mut(rows * stride);
            pieces.push((i, mine));
            rest = tail;
        }
        pieces.sort_by_key(|(i, _)| std::cmp::Reverse(tasks[*i].work));
        let queue = Mutex::new(pieces.into_iter());
        let worker = || {
            let mut work = Workspace::new(num_kv_heads * d);
            loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some((i, state)) = next else { break };
                let task = &tasks[i];
                let unit = &units[task.unit];
                let b = unit.request;
                let slots = &step.kv_slots[step.kv_offsets[b] as usize..step.kv_offsets[b + 1] as usize];
                work.queries.clear();
                work.positions.clear();
                let rows = unit.tokens.start * width..unit.tokens.end * width;
                work.queries.extend(queries[rows].iter().map(|x| x * options.scale));
                work.positions.extend_from_slice(&step.positions[unit.tokens.clone()]);
                let (qs, ps) = (std::mem::take(&mut work.queries), std::mem::take(&mut work.positions));
                let input = TaskInput {
                    queries: &qs,
                    positions: &ps,
                    slots,
                    keys: task.keys.clone(),
                    k_pool,
                    v_pool,
                    num_heads,
                    num_kv_heads,
                    head_dim: d,
                    window,
                };
                run_task(&input, &mut work, state);
                work.queries = qs;
                work.positions = ps;
            }
        };
        let helpers = threads.min(tasks.len()).saturating_sub(1);
        if helpers == 0 {
            worker();
        } else if in_pool {
            rayon::scope(|scope| {
                for _ in 0..helpers {
                    scope.spawn(|_| worker());
                }
                worker();
            });
        } else {
            std::thread::scope(|scope| {
                for _ in 0..helpers {
                    scope.spawn(worker);
                }
                worker();
            });
        }
    }

    // merge each row's partial states into the output
    for unit in &units {
        let rows = rows_of(unit);
        let parts = &tasks[unit.first_task..unit.first_task + unit.num_tasks];
        for r in 0..rows {
            // rows are (token, head) in order, as in `out`
            let at = unit.tokens.start * width + r * d;
            let dst = &mut out[at..at + d];
            let state_of = |p: &Task| &scratch[p.state + r * stride..p.state + (r + 1) * stride];
            let max = parts.iter().map(|p| state_of(p)[0]).fold(f32::NEG_INFINITY, f32::max);
            dst.fill(0.0);
            let mut sum = 0f32;
            for p in parts {
                let s = state_of(p);
                if s[1] == 0.0 {
                    continue; // saw no key
                }
                let w = (s[0] - max).exp();
                sum += s[1] * w;
                for (o, &a) in dst.iter_mut().zip(&s[STATE_HEADER..]) {
                    *o += a * w;
                }
            }
            if sum > 0.0 {
                let inv = 1.0 / sum;
                for o in dst.iter_mut() {
                    *o *= inv;
                }
            }
        }
    }
    Ok(())
}
