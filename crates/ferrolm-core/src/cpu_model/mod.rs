//! The Llama-family forward pass on the CPU over weights kept in their GGUF block formats
//! (Q8_0, Q4_K, ... or plain floats): one call per step computes every layer, with
//! integer-dot matrix products ([`linear`]), the core's paged attention over a KV pool
//! this model owns, and no Python in between.
//!
//! It computes what the numpy runner computes over the same weights dequantized (Hugging
//! Face's Llama: RMSNorm, "rotate half" RoPE, grouped-query attention, SwiGLU), except
//! that each matrix product quantizes its input per block to int8 first, as llama.cpp
//! does: logits agree with the float forward within the activations' rounding.
//! Variants: biases on q/k/v (Qwen2), RMSNorm of each query and key head (Qwen3), a
//! sliding window, tied embeddings (no head: the embedding's rows are its rows).

mod bandwidth;
mod linear;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};

use crate::attention::{self, Geometry, KvElem, Options, Step};
use crate::engine::Lora;
use crate::lora::{self as lora, Target, TokenGroup};
use crate::norm::rms_norm;
use crate::quant::blocks::BlockQ8_0;

pub use bandwidth::read_bandwidth;
pub use linear::{Inputs, Linear};

/// A model or batch that does not fit; `field` names the tensor or argument at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelError {
    pub field: String,
    pub message: String,
}

impl ModelError {
    pub fn new(field: impl Into<String>, message: String) -> ModelError {
        ModelError { field: field.into(), message }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ModelError {}

/// Sizes and constants of the architecture.
#[derive(Clone, Debug)]
pub struct Shape {
    pub hidden: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_eps: f32,
    pub sliding_window: Option<usize>,
    /// `[head_dim / 2]`: each dimension pair's rotation speed, scaling applied (the Python
    /// side computes it, with the model's RoPE scaling).
    pub inv_freq: Vec<f64>,
    /// What cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    pub rope_scale: f64,
}

/// One decoder layer.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub o: Linear,
    pub ffn_norm: Vec<f32>,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// Drops this process's resident pages of `bytes` once they have been copied: loading a
/// GGUF copies every tensor out of the file's mapping, and without this each page read
/// stays resident beside its copy until the file is unmapped, twice the file at the
/// peak. The pages stay in the page cache; a later read faults them back in from the
/// file. Only whole pages inside `bytes` are dropped (a page shared with a neighbouring
/// tensor is simply read again). A no-op off Linux.
///
/// # Safety
/// `bytes` must lie in a file mapping this process never writes: on anonymous memory
/// `MADV_DONTNEED` discards the contents.
pub unsafe fn release_file_pages(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let start = (bytes.as_ptr() as usize).next_multiple_of(page);
        let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
        if end > start {
            // SAFETY: [start, end) is whole pages inside `bytes`, a file mapping that is
            // only read (the caller's): the advice changes residency, never contents. A
            // failure leaves the pages resident, which is what not calling it does.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

/// The KV pool's element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
    BF16,
    /// ggml's Q8_0 blocks: 32 signed bytes and an f16 scale per 32 values of a head
    /// (34 bytes where f16 takes 64); the head dimension must be a multiple of 32.
    Q8_0,
}

enum Pool {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    Q8_0(Vec<BlockQ8_0>),
}

impl Pool {
    /// A pool of zeros whose pages become resident as slots are written (`KvElem::zeros`).
    fn new(dtype: KvDtype, len: usize) -> Pool {
        match dtype {
            KvDtype::F32 => Pool::F32(f32::zeros(len)),
            KvDtype::F16 => Pool::F16(f16::zeros(len)),
            KvDtype::BF16 => Pool::BF16(bf16::zeros(len)),
            KvDtype::Q8_0 => Pool::Q8_0(BlockQ8_0::zeros(len)),
        }
    }
}

/// One layer's keys and values: `[num_slots, num_kv_heads, head_dim]` each.
struct LayerPool {
    k: Pool,
    v: Pool,
}

/// One step's columns, as the engine's plan gives them (see `attention::Step`), plus the
/// new tokens and the slots they write.
pub struct Batch<'a> {
    pub input_ids: &'a [u32],
    pub positions: &'a [u32],
    pub out_slots: &'a [u32],
    pub qo_offsets: &'a [u32],
    pub kv_slots: &'a [u32],
    pub kv_offsets: &'a [u32],
    /// Request b's LoRA adapter (`None`: the base model); empty when none has one.
    pub loras: &'a [Option<Lora>],
}

/// Every tensor of the model.
pub struct Weights {
    pub embed: Linear,
    /// `None`: tied to `embed`.
    pub head: Option<Linear>,
    pub final_norm: Vec<f32>,
    pub layers: Vec<Layer>,
}

pub struct QuantModel {
    pub shape: Shape,
    embed: Linear,
    /// `None`: tied to `embed`.
    head: Option<Linear>,
    final_norm: Vec<f32>,
    layers: Vec<Layer>,
    pools: Vec<LayerPool>,
    num_slots: usize,
    /// The threads a step runs on (0 at construction: one per available core). The whole step runs inside it (`install`), so each
    /// matrix product splits its rows among threads already awake instead of waking
    /// the pool from outside hundreds of times a step.
    threads: Arc<rayon::ThreadPool>,
}

impl QuantModel {
    pub fn new(
        shape: Shape,
        weights: Weights,
        num_slots: usize,
        kv_dtype: KvDtype,
        num_threads: usize,
    ) -> Result<QuantModel, ModelError> {
        let Weights { embed, head, final_norm, layers } = weights;
        check_shapes(&shape, &embed, head.as_ref(), &final_norm, &layers)?;
        if num_slots == 0 {
            return Err(ModelError::new("num_slots", "num_slots must be positive".into()));
        }
        if kv_dtype == KvDtype::Q8_0 && shape.head_dim % BlockQ8_0::VALUES != 0 {
            return Err(ModelError::new(
                "kv_cache_dtype",
                format!(
                    "a q8_0 KV cache needs head_dim a multiple of 32, and this model's is {}",
                    shape.head_dim
                ),
            ));
        }
        let pool_len = num_slots * shape.num_kv_heads * shape.head_dim;
        let pools = (0..layers.len())
            .map(|_| LayerPool { k: Pool::new(kv_dtype, pool_len), v: Pool::new(kv_dtype, pool_len) })
            .collect();
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(num_threads)
            .thread_name(|i| format!("ferrolm-cpu-model-{i}"))
            .build()
            .map(Arc::new)
            .map_err(|e| ModelError::new("num_threads", format!("cannot start the model's threads: {e}")))?;
        Ok(QuantModel { shape, embed, head, final_norm, layers, pools, num_slots, threads })
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Bytes of weights a decode step reads (every matrix once, the head included).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down].iter().map(|m| m.bytes()).sum::<usize>()
            })
            .sum();
        layers + self.head.as_ref().unwrap_or(&self.embed).bytes()
    }

    /// Writes the new tokens' keys and values to their slots and returns f32 logits
    /// `[B, vocab]` of each request's last new token, or `[T, vocab]` of every new token
    /// when `all_logits`.
    pub fn forward(&mut self, batch: &Batch<'_>, all_logits: bool) -> Result<Vec<f32>, ModelError> {
        let rows: Vec<usize> = if all_logits {
            (0..batch.input_ids.len()).collect()
        } else {
            batch.qo_offsets.iter().skip(1).map(|&end| (end as usize).saturating_sub(1)).collect()
        };
        self.logits_at(batch, &rows)
    }

    /// `forward` returning the logits of the new tokens at `rows` (indices into
    /// `input_ids`, in order): a plan's `logit_rows`, which add a row per draft token.
    pub fn forward_rows(&mut self, batch: &Batch<'_>, rows: &[u32]) -> Result<Vec<f32>, ModelError> {
        let tokens = batch.input_ids.len();
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= tokens) {
            return Err(ModelError::new(
                "logit_rows",
                format!("row {r} is past the step's {tokens} new tokens"),
            ));
        }
        let rows: Vec<usize> = rows.iter().map(|&r| r as usize).collect();
        self.logits_at(batch, &rows)
    }

    fn logits_at(&mut self, batch: &Batch<'_>, rows: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.check(batch)?;
        let threads = Arc::clone(&self.threads);
        threads.install(|| self.forward_here(batch, rows))
    }

    /// The sizes a LoRA adapter of this model must have.
    pub fn lora_shape(&self) -> lora::LoraShape {
        let s = &self.shape;
        lora::LoraShape {
            layers: self.layers.len(),
            hidden: s.hidden,
            q_dim: s.num_heads * s.head_dim,
            kv_dim: s.num_kv_heads * s.head_dim,
            intermediate: s.intermediate,
        }
    }

    pub fn num_threads(&self) -> usize {
        self.threads.current_num_threads()
    }

    fn forward_here(&mut self, batch: &Batch<'_>, rows: &[usize]) -> Result<Vec<f32>, ModelError> {
        let s = &self.shape;
        let (hidden, tokens) = (s.hidden, batch.input_ids.len());
        let mut x = vec![0f32; tokens * hidden];
        for (t, &id) in batch.input_ids.iter().enumerate() {
            self.embed.row_into(id as usize, &mut x[t * hidden..(t + 1) * hidden]);
        }
        let rope = Rope::new(&s.inv_freq, s.rope_scale, batch.positions);
        let mut scratch = Scratch::new(s, tokens);
        let lora = lora_rows(batch);
        for (i, (layer, pool)) in self.layers.iter().zip(&mut self.pools).enumerate() {
            let adapters = Adapters { layer: i, lora: &lora };
            layer_forward(s, layer, pool, batch, &rope, &adapters, &mut x, &mut scratch)?;
        }
        let mut last = Vec::with_capacity(rows.len() * hidden);
        for &t in rows {
            last.extend_from_slice(&x[t * hidden..(t + 1) * hidden]);
        }
        let mut normed = vec![0f32; last.len()];
        norm(&last, &self.final_norm, s.rms_eps, &mut normed);
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0f32; rows.len() * head.rows];
        head.forward(&mut Inputs::new(&normed, hidden), &mut logits);
        Ok(logits)
    }

    fn check(&self, batch: &Batch<'_>) -> Result<(), ModelError> {
        let tokens = batch.input_ids.len();
        if tokens == 0 {
            return Err(ModelError::new("input_ids", "a step needs at least one token".into()));
        }
        if batch.positions.len() != tokens || batch.out_slots.len() != tokens {
            return Err(ModelError::new(
                "positions",
                format!(
                    "positions ({}) and out_slots ({}) need one entry per new token ({tokens})",
                    batch.positions.len(),
                    batch.out_slots.len()
                ),
            ));
        }
        if let Some(&id) = batch.input_ids.iter().find(|&&id| id as usize >= self.embed.rows) {
            return Err(ModelError::new(
                "input_ids",
                format!("token id {id} >= vocab size {}", self.embed.rows),
            ));
        }
        if let Some(&slot) =
            batch.out_slots.iter().chain(batch.kv_slots).find(|&&s| s as usize >= self.num_slots)
        {
            return Err(ModelError::new("kv_slots", format!("slot {slot} >= num_slots {}", self.num_slots)));
        }
        let requests = batch.qo_offsets.len().saturating_sub(1);
        if requests == 0 || batch.qo_offsets[requests] as usize != tokens {
            return Err(ModelError::new(
                "qo_offsets",
                format!("qo_offsets must end at the {tokens} new tokens"),
            ));
        }
        if batch.qo_offsets.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ModelError::new("qo_offsets", "every request needs at least one new token".into()));
        }
        if !batch.loras.is_empty() && batch.loras.len() != requests {
            return Err(ModelError::new(
                "loras",
                format!(
                    "{} adapters for {requests} requests: give one per request, or none",
                    batch.loras.len()
                ),
            ));
        }
        let shape = self.lora_shape();
        for lora in batch.loras.iter().flatten() {
            if lora.adapter.shape() != &shape {
                return Err(ModelError::new(
                    "loras",
                    format!("the LoRA adapter {:?} was read for another model's shape", lora.name),
                ));
            }
        }
        Ok(())
    }
}

fn check_shapes(
    s: &Shape,
    embed: &Linear,
    head: Option<&Linear>,
    final_norm: &[f32],
    layers: &[Layer],
) -> Result<(), ModelError> {
    let want = |name: &str, m: &Linear, rows: usize, cols: usize| {
        if m.rows == rows && m.cols == cols {
            Ok(())
        } else {
            Err(ModelError::new(name, format!("shape [{}, {}], want [{rows}, {cols}]", m.rows, m.cols)))
        }
    };
    let vector = |name: &str, v: &[f32], len: usize| {
        if v.len() == len {
            Ok(())
        } else {
            Err(ModelError::new(name, format!("{} values, want {len}", v.len())))
        }
    };
    if s.num_heads == 0 || s.num_kv_heads == 0 || s.num_heads % s.num_kv_heads != 0 || s.head_dim % 2 != 0 {
        return Err(ModelError::new("shape", format!("heads / kv heads / head_dim do not fit: {s:?}")));
    }
    if !(s.rope_scale.is_finite() && s.rope_scale > 0.0) {
        return Err(ModelError::new("rope_scale", format!("{} is not a positive factor", s.rope_scale)));
    }
    if s.inv_freq.len() != s.head_dim / 2 {
        return Err(ModelError::new("inv_freq", format!("{} values, want head_dim / 2", s.inv_freq.len())));
    }
    let (h, q, kv) = (s.hidden, s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim);
    want("token_embd", embed, s.vocab, h)?;
    if let Some(head) = head {
        want("output", head, s.vocab, h)?;
    }
    vector("output_norm", final_norm, h)?;
    for (i, l) in layers.iter().enumerate() {
        let name = |part: &str| format!("blk.{i}.{part}");
        vector(&name("attn_norm"), &l.attn_norm, h)?;
        want(&name("attn_q"), &l.q, q, h)?;
        want(&name("attn_k"), &l.k, kv, h)?;
        want(&name("attn_v"), &l.v, kv, h)?;
        want(&name("attn_output"), &l.o, h, q)?;
        vector(&name("ffn_norm"), &l.ffn_norm, h)?;
        want(&name("ffn_gate"), &l.gate, s.intermediate, h)?;
        want(&name("ffn_up"), &l.up, s.intermediate, h)?;
        want(&name("ffn_down"), &l.down, h, s.intermediate)?;
        for (part, n) in [("attn_q_norm", &l.q_norm), ("attn_k_norm", &l.k_norm)] {
            if let Some(n) = n {
                vector(&name(part), n, s.head_dim)?;
            }
        }
    }
    Ok(())
}

/// Buffers of one step, reused by every layer.
struct Scratch {
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl Scratch {
    fn new(s: &Shape, tokens: usize) -> Scratch {
        let (q, kv) = (s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim);
        Scratch {
            h: vec![0.0; tokens * s.hidden],
            q: vec![0.0; tokens * q],
            k: vec![0.0; tokens * kv],
            v: vec![0.0; tokens * kv],
            attn: vec![0.0; tokens * q],
            proj: vec![0.0; tokens * s.hidden],
            gate: vec![0.0; tokens * s.intermediate],
            up: vec![0.0; tokens * s.intermediate],
        }
    }
}

fn norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    rms_norm(x, weight, eps, out).expect("norm weights are checked at load");
}

/// The step's token rows that run with an adapter, as the kernel takes them: one run of
/// rows per adapter, so that it reads each adapter's matrices once per projection. The
/// scheduler lists each adapter's requests side by side, so the runs are usually the
/// step's own rows (`rows` is `None`: the kernel works on the step's arrays in place);
/// where an adapter's requests are apart (a step's newly admitted ones after the running
/// ones), `rows` lists the adapters' rows in adapter order, gathered for the kernel.
struct LoraRows<'a> {
    rows: Option<Vec<usize>>,
    groups: Vec<TokenGroup<'a>>,
}

fn lora_rows<'a>(batch: &Batch<'a>) -> LoraRows<'a> {
    let tokens = |b: usize| batch.qo_offsets[b] as usize..batch.qo_offsets[b + 1] as usize;
    // runs of adjacent requests with the same adapter, in the step's order
    let mut runs: Vec<(u32, TokenGroup<'a>)> = Vec::new();
    for (b, l) in batch.loras.iter().enumerate() {
        let Some(l) = l else { continue };
        match runs.last_mut() {
            Some((id, g)) if *id == l.id && g.tokens.end == tokens(b).start => g.tokens.end = tokens(b).end,
            _ => runs.push((l.id, TokenGroup { adapter: &l.adapter, tokens: tokens(b) })),
        }
    }
    let mut ids: Vec<u32> = runs.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    if ids.windows(2).all(|w| w[0] != w[1]) {
        return LoraRows { rows: None, groups: runs.into_iter().map(|(_, g)| g).collect() };
    }
    runs.sort_by_key(|(id, g)| (*id, g.tokens.start));
    let (mut rows, mut groups) = (Vec::new(), Vec::<TokenGroup<'a>>::new());
    let mut last_id = None;
    for (id, run) in runs {
        let start = rows.len();
        rows.extend(run.tokens.clone());
        match groups.last_mut() {
            Some(g) if last_id == Some(id) => g.tokens.end = rows.len(),
            _ => groups.push(TokenGroup { adapter: run.adapter, tokens: start..rows.len() }),
        }
        last_id = Some(id);
    }
    LoraRows { rows: Some(rows), groups }
}

/// The LoRA updates of one layer: `add` puts each group's update of a projection onto
/// that projection's output.
struct Adapters<'a> {
    layer: usize,
    lora: &'a LoraRows<'a>,
}

impl Adapters<'_> {
    fn add(&self, target: Target, x: &[f32], in_dim: usize, out: &mut [f32], out_dim: usize) {
        let LoraRows { rows, groups } = self.lora;
        if groups.is_empty() {
            return;
        }
        let Some(rows) = rows else {
            lora::apply(self.layer, target, x, in_dim, out, out_dim, groups);
            return;
        };
        // the adapters' rows gathered in adapter order, updated, and put back (copies of
        // the step's activations: small next to the matrices the update reads)
        let mut xs = Vec::with_capacity(rows.len() * in_dim);
        let mut outs = Vec::with_capacity(rows.len() * out_dim);
        for &r in rows {
            xs.extend_from_slice(&x[r * in_dim..(r + 1) * in_dim]);
            outs.extend_from_slice(&out[r * out_dim..(r + 1) * out_dim]);
        }
        lora::apply(self.layer, target, &xs, in_dim, &mut outs, out_dim, groups);
        for (&r, updated) in rows.iter().zip(outs.chunks_exact(out_dim)) {
            out[r * out_dim..(r + 1) * out_dim].copy_from_slice(updated);
        }
    }
}

#[allow(clippy::too_many_arguments)] // one layer's parts, each distinct
fn layer_forward(
    s: &Shape,
    layer: &Layer,
    pool: &mut LayerPool,
    batch: &Batch<'_>,
    rope: &Rope,
    adapters: &Adapters<'_>,
    x: &mut [f32],
    b: &mut Scratch,
) -> Result<(), ModelError> {
    let d = s.head_dim;
    let (q_dim, kv_dim) = (s.num_heads * d, s.num_kv_heads * d);
    norm(x, &layer.attn_norm, s.rms_eps, &mut b.h);
    {
        let mut inputs = Inputs::new(&b.h, s.hidden);
        layer.q.forward(&mut inputs, &mut b.q);
        layer.k.forward(&mut inputs, &mut b.k);
        layer.v.forward(&mut inputs, &mut b.v);
    }
    adapters.add(Target::Q, &b.h, s.hidden, &mut b.q, q_dim);
    adapters.add(Target::K, &b.h, s.hidden, &mut b.k, kv_dim);
    adapters.add(Target::V, &b.h, s.hidden, &mut b.v, kv_dim);
    if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
        let (q, k) = (b.q.clone(), b.k.clone());
        norm(&q, qn, s.rms_eps, &mut b.q);
        norm(&k, kn, s.rms_eps, &mut b.k);
    }
    rope.apply(&mut b.q, d);
    rope.apply(&mut b.k, d);
    attend(s, pool, batch, b)?;
    layer.o.forward(&mut Inputs::new(&b.attn, q_dim), &mut b.proj);
    adapters.add(Target::O, &b.attn, q_dim, &mut b.proj, s.hidden);
    add(x, &b.proj);

    norm(x, &layer.ffn_norm, s.rms_eps, &mut b.h);
    {
        let mut inputs = Inputs::new(&b.h, s.hidden);
        layer.gate.forward(&mut inputs, &mut b.gate);
        layer.up.forward(&mut inputs, &mut b.up);
    }
    adapters.add(Target::Gate, &b.h, s.hidden, &mut b.gate, s.intermediate);
    adapters.add(Target::Up, &b.h, s.hidden, &mut b.up, s.intermediate);
    crate::sampling::simd::silu_mul(&mut b.gate, &b.up);
    layer.down.forward(&mut Inputs::new(&b.gate, s.intermediate), &mut b.proj);
    adapters.add(Target::Down, &b.gate, s.intermediate, &mut b.proj, s.hidden);
    add(x, &b.proj);
    Ok(())
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn attend(s: &Shape, pool: &mut LayerPool, batch: &Batch<'_>, b: &mut Scratch) -> Result<(), ModelError> {
    let geometry = Geometry { num_heads: s.num_heads, num_kv_heads: s.num_kv_heads, head_dim: s.head_dim };
    let step = Step {
        positions: batch.positions,
        qo_offsets: batch.qo_offsets,
        kv_slots: batch.kv_slots,
        kv_offsets: batch.kv_offsets,
    };
    let mut options = Options::new((s.head_dim as f32).powf(-0.5));
    options.sliding_window = s.sliding_window;
    let failed = |e: attention::AttentionError| ModelError::new(e.field, e.message);
    fn run<E: KvElem>(
        g: Geometry,
        step: &Step<'_>,
        out_slots: &[u32],
        b: &mut Scratch,
        k: &mut [E],
        v: &mut [E],
        options: &Options,
    ) -> Result<(), attention::AttentionError> {
        attention::write_kv(g, out_slots, &b.k, &b.v, k, v)?;
        attention::attend(g, step, &b.q, k, v, options, &mut b.attn)
    }
    match (&mut pool.k, &mut pool.v) {
        (Pool::F32(k), Pool::F32(v)) => run(geometry, &step, batch.out_slots, b, k, v, &options),
        (Pool::F16(k), Pool::F16(v)) => run(geometry, &step, batch.out_slots, b, k, v, &options),
        (Pool::BF16(k), Pool::BF16(v)) => run(geometry, &step, batch.out_slots, b, k, v, &options),
        (Pool::Q8_0(k), Pool::Q8_0(v)) => run(geometry, &step, batch.out_slots, b, k, v, &options),
        _ => unreachable!("a layer's k and v pools share a type"),
    }
    .map_err(failed)
}

/// The cos and sin of each token's rotation angles times `scale`, `[T, head_dim / 2]`,
/// computed in f64 and rounded to f32 as the numpy runner's `rotation` does.
struct Rope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    pairs: usize,
}

impl Rope {
    fn new(inv_freq: &[f64], scale: f64, positions: &[u32]) -> Rope {
        let pairs = inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * pairs);
        let mut sin = Vec::with_capacity(positions.len() * pairs);
        for &p in positions {
            for &f in inv_freq {
                let angle = p as f64 * f;
                cos.push((angle.cos() * scale) as f32);
                sin.push((angle.sin() * scale) as f32);
            }
        }
        Rope { cos, sin, pairs }
    }

    /// Rotates `x` (`[T, heads, head_dim]`): dimension `i` pairs with `i + head_dim / 2`.
    fn apply(&self, x: &mut [f32], head_dim: usize) {
        let half = self.pairs;
        let heads = x.len() / head_dim / (self.cos.len() / half).max(1);
        for (t, token) in x.chunks_exact_mut(heads * head_dim).enumerate() {
            let (cos, sin) = (&self.cos[t * half..(t + 1) * half], &self.sin[t * half..(t + 1) * half]);
            for head in token.chunks_exact_mut(head_dim) {
                let (first, second) = head.split_at_mut(half);
                for i in 0..half {
                    let (a, b) = (first[i], second[i]);
                    first[i] = a * cos[i] - b * sin[i];
                    second[i] = b * cos[i] + a * sin[i];
                }
            }
        }
    }
}
