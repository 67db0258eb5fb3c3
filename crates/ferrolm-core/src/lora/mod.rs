//! LoRA adapters, many of them served in one step.
//!
//! An adapter changes a projection `W` (`out × in`) of a layer to `W + s·B·A`, with `A`
//! (`r × in`) and `B` (`out × r`) of a small rank `r` and a scaling `s`. Merging the
//! update into `W` would tie the model to one adapter; instead the runner computes the
//! base projection for the whole step and then [`apply`] adds, to each token's row, the
//! update of that token's adapter (the idea of S-LoRA and Punica). Requests with
//! different adapters, or none, share one step, and an adapter costs `r·(in + out)`
//! floats per projection instead of a copy of the model.
//!
//! An [`Adapter`] comes from a folder Hugging Face PEFT wrote ([`Adapter::load_peft`],
//! in `peft`) or from matrices ([`Adapter::from_parts`]). Both check every matrix
//! against the base model's [`LoraShape`] when the adapter is built, so the kernel never
//! meets a size it did not expect and a bad file is refused at load time, with the file
//! and the tensor named, rather than failing in the middle of a step.
//!
//! The matrices are kept the way the kernel reads them: `A` as PEFT stores it (a row per
//! rank, dotted with the token), `B` transposed with the scaling folded in (a row per
//! rank, added to the output scaled by that dot).

mod kernel;
mod peft;
#[cfg(test)]
mod peft_tests;
pub mod registry;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;

pub use kernel::{apply, TokenGroup};

/// The seven projections of a Llama-family layer an adapter can target, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    pub const ALL: [Target; 7] =
        [Target::Q, Target::K, Target::V, Target::O, Target::Gate, Target::Up, Target::Down];

    /// 0..7, in the order of [`Target::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The module's name in PEFT's tensor names and `target_modules`.
    pub fn peft_name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The block that holds the projection in a Llama layer (`self_attn` or `mlp`).
    fn parent(self) -> &'static str {
        match self {
            Target::Q | Target::K | Target::V | Target::O => "self_attn",
            Target::Gate | Target::Up | Target::Down => "mlp",
        }
    }

    /// The names of [`LoraShape::dims`]'s two sizes, for error messages.
    fn dim_names(self) -> (&'static str, &'static str) {
        match self {
            Target::Q => ("hidden", "q_dim"),
            Target::K | Target::V => ("hidden", "kv_dim"),
            Target::O => ("q_dim", "hidden"),
            Target::Gate | Target::Up => ("hidden", "intermediate"),
            Target::Down => ("intermediate", "hidden"),
        }
    }
}

/// The base model's sizes an adapter must fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoraShape {
    pub layers: usize,
    pub hidden: usize,
    /// `num_heads * head_dim`.
    pub q_dim: usize,
    /// `num_kv_heads * head_dim`.
    pub kv_dim: usize,
    pub intermediate: usize,
}

impl LoraShape {
    /// `(in, out)` of a projection: what `x` holds per token and what the update adds to.
    pub fn dims(&self, t: Target) -> (usize, usize) {
        match t {
            Target::Q => (self.hidden, self.q_dim),
            Target::K | Target::V => (self.hidden, self.kv_dim),
            Target::O => (self.q_dim, self.hidden),
            Target::Gate | Target::Up => (self.hidden, self.intermediate),
            Target::Down => (self.intermediate, self.hidden),
        }
    }
}

/// One projection's low-rank update: `out += scaling * B (A x)`.
#[derive(Clone, Debug, PartialEq)]
pub struct LowRank {
    pub rank: usize,
    pub in_dim: usize,
    pub out_dim: usize,
    /// `[rank][in_dim]`, row-major (PEFT's `lora_A.weight` as stored).
    pub a: Vec<f32>,
    /// `[rank][out_dim]`: PEFT's `lora_B.weight` (`[out_dim][rank]`) transposed and
    /// multiplied by the scaling, so that the kernel's expand is one axpy over `out_dim`
    /// per rank.
    pub b_t: Vec<f32>,
}

/// One projection for [`Adapter::from_parts`]: `(layer, target, rank, a [rank * in],
/// b [out * rank] as PEFT stores lora_B, scaling)`.
pub type RawPart = (usize, Target, usize, Vec<f32>, Vec<f32>, f32);

/// One projection's matrices as a loader found them, before they are checked.
pub(crate) struct Part {
    pub layer: usize,
    pub target: Target,
    pub rank: usize,
    /// `[rank][in]`.
    pub a: Vec<f32>,
    /// `[out][rank]`, as PEFT stores `lora_B`.
    pub b: Vec<f32>,
    pub scaling: f32,
}

/// The low-rank updates of one adapter, per layer and projection, sized for one model.
#[derive(Clone)]
pub struct Adapter {
    shape: LoraShape,
    /// `[layer][target.index()]`.
    layers: Vec<[Option<LowRank>; 7]>,
}

impl Adapter {
    /// Reads `dir/adapter_config.json` and `dir/adapter_model.safetensors` (what PEFT's
    /// `save_pretrained` writes) and checks them against `shape`.
    pub fn load_peft(dir: &Path, shape: &LoraShape) -> Result<Adapter, LoraError> {
        peft::load(dir, shape)
    }

    /// For tests and other loaders: `parts` are `(layer, target, rank, a [rank * in],
    /// b [out * rank] as PEFT stores lora_B, scaling)`, checked against `shape` like a
    /// file. Errors have an empty `file`.
    pub fn from_parts(shape: &LoraShape, parts: Vec<RawPart>) -> Result<Adapter, LoraError> {
        let parts = parts
            .into_iter()
            .map(|(layer, target, rank, a, b, scaling)| Part { layer, target, rank, a, b, scaling })
            .collect();
        Adapter::build(shape, parts).map_err(|message| LoraError { file: String::new(), message })
    }

    /// Checks every part against `shape` and lays it out for the kernel; the error names
    /// the layer and projection at fault.
    pub(crate) fn build(shape: &LoraShape, parts: Vec<Part>) -> Result<Adapter, String> {
        if parts.is_empty() {
            return Err("the adapter has no LoRA matrices".into());
        }
        let mut layers: Vec<[Option<LowRank>; 7]> =
            (0..shape.layers).map(|_| std::array::from_fn(|_| None)).collect();
        for part in parts {
            let (layer, target) = (part.layer, part.target);
            let at = format!("layer {layer} {}", target.peft_name());
            let slot = layers.get_mut(layer).ok_or_else(|| {
                format!("{at}: the model has {} layers (0..{})", shape.layers, shape.layers)
            })?;
            let slot = &mut slot[target.index()];
            if slot.is_some() {
                return Err(format!("{at}: given twice"));
            }
            *slot = Some(low_rank(shape, part).map_err(|m| format!("{at}: {m}"))?);
        }
        Ok(Adapter { shape: *shape, layers })
    }

    /// The update of `target` in `layer`, if the adapter has one.
    pub fn get(&self, layer: usize, target: Target) -> Option<&LowRank> {
        self.layers.get(layer)?[target.index()].as_ref()
    }

    /// The targets present in at least one layer, in [`Target::ALL`]'s order.
    pub fn targets(&self) -> Vec<Target> {
        Target::ALL.into_iter().filter(|t| self.layers.iter().any(|l| l[t.index()].is_some())).collect()
    }

    /// The largest rank of any projection (what a caller sizes scratch space by).
    pub fn max_rank(&self) -> usize {
        self.low_ranks().map(|lr| lr.rank).max().unwrap_or(0)
    }

    /// Bytes held by the matrices.
    pub fn bytes(&self) -> usize {
        self.low_ranks().map(|lr| (lr.a.len() + lr.b_t.len()) * size_of::<f32>()).sum()
    }

    /// The model sizes the adapter was checked against.
    pub fn shape(&self) -> &LoraShape {
        &self.shape
    }

    fn low_ranks(&self) -> impl Iterator<Item = &LowRank> {
        self.layers.iter().flatten().flatten()
    }
}

/// A summary: the matrices would fill a log with numbers.
impl fmt::Debug for Adapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adapter")
            .field("shape", &self.shape)
            .field("targets", &self.targets())
            .field("max_rank", &self.max_rank())
            .field("bytes", &self.bytes())
            .finish()
    }
}

/// Checks one part's sizes and values and transposes `B` with the scaling folded in.
fn low_rank(shape: &LoraShape, part: Part) -> Result<LowRank, String> {
    let Part { target, rank, a, b, scaling, .. } = part;
    let (in_dim, out_dim) = shape.dims(target);
    let (in_name, out_name) = target.dim_names();
    if in_dim == 0 || out_dim == 0 {
        return Err(format!("the model's {in_name} ({in_dim}) and {out_name} ({out_dim}) must be above 0"));
    }
    if rank == 0 {
        return Err("rank 0".into());
    }
    if a.len() != rank * in_dim {
        return Err(format!(
            "A has {} values; rank {rank} × {in_name} {in_dim} needs {}",
            a.len(),
            rank * in_dim
        ));
    }
    if b.len() != out_dim * rank {
        return Err(format!(
            "B has {} values; {out_name} {out_dim} × rank {rank} needs {}",
            b.len(),
            out_dim * rank
        ));
    }
    if !scaling.is_finite() {
        return Err(format!("scaling {scaling} is not finite"));
    }
    if let Some(i) = a.iter().position(|v| !v.is_finite()) {
        return Err(format!("A holds {} at index {i}", a[i]));
    }
    let mut b_t = vec![0f32; rank * out_dim];
    for (o, row) in b.chunks_exact(rank).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            b_t[j * out_dim + o] = v * scaling;
        }
    }
    if let Some(i) = b_t.iter().position(|v| !v.is_finite()) {
        let (j, o) = (i / out_dim, i % out_dim);
        return Err(format!("B[{o}][{j}] = {} times scaling {scaling} is not finite", b[o * rank + j]));
    }
    Ok(LowRank { rank, in_dim, out_dim, a, b_t })
}

/// What is wrong with an adapter: `file` is the path (as given, joined with the file
/// name) of the file at fault, empty for [`Adapter::from_parts`]; `message` says what,
/// naming the tensor or key where there is one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraError {
    pub file: String,
    pub message: String,
}

impl LoraError {
    pub(crate) fn new(file: &Path, message: impl Into<String>) -> LoraError {
        LoraError { file: file.display().to_string(), message: message.into() }
    }
}

impl fmt::Display for LoraError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.file.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.file, self.message)
        }
    }
}

impl std::error::Error for LoraError {}
