//! Reading an adapter folder as Hugging Face PEFT's `save_pretrained` writes it:
//! `adapter_config.json` gives the scaling, `adapter_model.safetensors` the matrices.
//!
//! PEFT has options that change the arithmetic beyond `s·B·A` (DoRA's magnitudes, trained
//! biases, transposed Conv1D weights, per-module alphas, whole modules trained and saved
//! beside the adapter). Those are refused, naming the key, never ignored: ignoring one
//! would serve a model that quietly differs from the one that was trained. Keys that do
//! not change the arithmetic are ignored (PEFT writes many). The tensors decide what is
//! adapted (`target_modules` can be a list, a string or a regex; the tensors are exact),
//! and every tensor must be a `lora_A` or `lora_B` weight of one of the seven targets.
//!
//! Scaling: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`, where `r` is
//! the module's own rank, read from its tensors' shapes, so that a `rank_pattern` (ranks
//! per module) needs no parsing of its module patterns.

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::{Map, Value};

use super::{Adapter, LoraError, LoraShape, Part, Target};

const CONFIG: &str = "adapter_config.json";
const WEIGHTS: &str = "adapter_model.safetensors";
/// What older PEFT versions (and `safe_serialization=False`) write instead of `WEIGHTS`.
const PICKLE: &str = "adapter_model.bin";

pub(super) fn load(dir: &Path, shape: &LoraShape) -> Result<Adapter, LoraError> {
    let config_path = dir.join(CONFIG);
    let config = Config::read(&config_path)?;
    let weights_path = dir.join(WEIGHTS);
    let bytes = match fs::read(&weights_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::NotFound && dir.join(PICKLE).exists() => {
            return Err(LoraError::new(
                &weights_path,
                format!(
                    "missing; {PICKLE} is there, but ferrolm does not read the pickle format: \
                     save the adapter with save_pretrained(..., safe_serialization=True), or \
                     convert {PICKLE} to {WEIGHTS}"
                ),
            ));
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(LoraError::new(&weights_path, "missing: PEFT saves the matrices there"));
        }
        Err(e) => return Err(LoraError::new(&weights_path, format!("cannot be read: {e}"))),
    };
    let parts = read_parts(&bytes, &config, shape).map_err(|m| LoraError::new(&weights_path, m))?;
    Adapter::build(shape, parts).map_err(|m| LoraError::new(&weights_path, m))
}

/// What `adapter_config.json` says about the arithmetic.
struct Config {
    /// `r`: every module's rank unless `rank_pattern` says otherwise.
    rank: usize,
    alpha: f64,
    rslora: bool,
    /// A non-empty `rank_pattern`: ranks may differ from `r`.
    rank_pattern: bool,
}

impl Config {
    fn read(path: &Path) -> Result<Config, LoraError> {
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(LoraError::new(
                    path,
                    format!("missing: a PEFT adapter folder holds {CONFIG} next to {WEIGHTS}"),
                ));
            }
            Err(e) => return Err(LoraError::new(path, format!("cannot be read: {e}"))),
        };
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| LoraError::new(path, format!("is not valid JSON: {e}")))?;
        let object = value.as_object().ok_or_else(|| LoraError::new(path, "is not a JSON object"))?;
        Config::parse(object).map_err(|m| LoraError::new(path, m))
    }

    fn parse(config: &Map<String, Value>) -> Result<Config, String> {
        match config.get("peft_type") {
            Some(Value::String(s)) if s == "LORA" => {}
            Some(other) => {
                return Err(format!("`peft_type` is {other}; ferrolm reads LoRA adapters (\"LORA\") only"))
            }
            None => return Err("`peft_type` is missing; ferrolm reads LoRA adapters (\"LORA\")".into()),
        }
        let rank = match config.get("r") {
            Some(r) => match r.as_u64() {
                Some(n) if n > 0 => n as usize,
                _ => return Err(format!("`r` is {r}; it must be a whole number above 0")),
            },
            None => return Err("`r` (the rank) is missing".into()),
        };
        let alpha = match config.get("lora_alpha") {
            Some(a) => a.as_f64().ok_or_else(|| format!("`lora_alpha` is {a}; it must be a number"))?,
            None => return Err("`lora_alpha` is missing".into()),
        };
        let rslora = flag(config, "use_rslora")?;
        if flag(config, "use_dora")? {
            return Err("`use_dora` is true: DoRA adapters (a learned magnitude per output) \
                        are not supported; ferrolm applies plain LoRA"
                .into());
        }
        if flag(config, "fan_in_fan_out")? {
            return Err("`fan_in_fan_out` is true: matrices stored transposed (for Conv1D \
                        layers) are not supported; Llama-family models use Linear layers"
                .into());
        }
        if flag(config, "lora_bias")? {
            return Err("`lora_bias` is true: a bias on lora_B is not supported".into());
        }
        match config.get("bias") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "none" => {}
            Some(other) => {
                return Err(format!(
                    "`bias` is {other}: adapters that train the model's biases are not supported \
                     (only \"none\")"
                ))
            }
        }
        if non_empty(config.get("alpha_pattern")) {
            return Err("`alpha_pattern` is not empty: a lora_alpha per module is not supported".into());
        }
        if let Some(modules) = config.get("modules_to_save").filter(|v| non_empty(Some(v))) {
            return Err(format!(
                "`modules_to_save` is {modules}: adapters that replace whole modules are not supported"
            ));
        }
        let rank_pattern = non_empty(config.get("rank_pattern"));
        Ok(Config { rank, alpha, rslora, rank_pattern })
    }

    fn scaling(&self, rank: usize) -> f32 {
        let rank = rank as f64;
        (if self.rslora { self.alpha / rank.sqrt() } else { self.alpha / rank }) as f32
    }
}

/// A boolean key; absent or null is false.
fn flag(config: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("`{key}` is {other}; it must be true or false")),
    }
}

fn non_empty(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// A named tensor of the file.
type Named<'a> = (&'a str, TensorView<'a>);

/// Every projection's matrices, checked against `shape` and `config`; the message names
/// the tensor at fault.
fn read_parts(bytes: &[u8], config: &Config, shape: &LoraShape) -> Result<Vec<Part>, String> {
    let file = SafeTensors::deserialize(bytes).map_err(|e| format!("is not a safetensors file: {e}"))?;
    let mut tensors: Vec<Named<'_>> = file.iter().collect();
    // the header's order is the writer's; name order makes the first error reported stable
    tensors.sort_by_key(|(name, _)| *name);
    let mut pairs: BTreeMap<(usize, usize), [Option<Named<'_>>; 2]> = BTreeMap::new();
    for (name, view) in tensors {
        let (layer, target, side) = parse_name(name)?;
        if layer >= shape.layers {
            return Err(format!(
                "tensor `{name}` is for layer {layer}, but the model has {} layers (0..{})",
                shape.layers, shape.layers
            ));
        }
        let pair = pairs.entry((layer, target.index())).or_default();
        if let Some((other, _)) = &pair[side as usize] {
            return Err(format!("tensors `{other}` and `{name}` are the same matrix"));
        }
        pair[side as usize] = Some((name, view));
    }
    if pairs.is_empty() {
        return Err("holds no LoRA tensors (lora_A and lora_B weights of q/k/v/o/gate/up/down)".into());
    }
    let mut parts = Vec::with_capacity(pairs.len());
    for ((layer, t), pair) in pairs {
        let target = Target::ALL[t];
        let [a, b] = pair;
        let (a, b) = match (a, b) {
            (Some(a), Some(b)) => (a, b),
            (Some((name, _)), None) => return Err(unpaired(name, "A", "B", layer, target)),
            (None, Some((name, _))) => return Err(unpaired(name, "B", "A", layer, target)),
            (None, None) => unreachable!("a pair is made with one side"),
        };
        parts.push(part(layer, target, a, b, config, shape)?);
    }
    Ok(parts)
}

fn unpaired(name: &str, has: &str, lacks: &str, layer: usize, target: Target) -> String {
    format!(
        "tensor `{name}` is lora_{has} of layer {layer} {}, but its lora_{lacks} is missing",
        target.peft_name()
    )
}

/// One projection's `A` and `B`, their shapes checked (so that the messages name the
/// tensors; [`Adapter::build`] checks again, by lengths).
fn part(
    layer: usize,
    target: Target,
    (a_name, a): Named<'_>,
    (b_name, b): Named<'_>,
    config: &Config,
    shape: &LoraShape,
) -> Result<Part, String> {
    let (in_dim, out_dim) = shape.dims(target);
    let (in_name, out_name) = target.dim_names();
    let proj = target.peft_name();
    let a_shape = a.shape();
    if a_shape.len() != 2 || a_shape[1] != in_dim {
        return Err(format!(
            "tensor `{a_name}` has shape {a_shape:?}; {proj}'s lora_A must be [r, {in_dim}] (rank × {in_name})"
        ));
    }
    let b_shape = b.shape();
    if b_shape.len() != 2 || b_shape[0] != out_dim {
        return Err(format!(
            "tensor `{b_name}` has shape {b_shape:?}; {proj}'s lora_B must be [{out_dim}, r] ({out_name} × rank)"
        ));
    }
    let rank = a_shape[0];
    if b_shape[1] != rank {
        return Err(format!(
            "tensor `{a_name}` has rank {rank} (shape {a_shape:?}) but `{b_name}` has rank {} (shape {b_shape:?})",
            b_shape[1]
        ));
    }
    if rank == 0 {
        return Err(format!("tensor `{a_name}` has rank 0"));
    }
    if !config.rank_pattern && rank != config.rank {
        return Err(format!(
            "tensor `{a_name}` has rank {rank}, but `r` in {CONFIG} is {} and there is no `rank_pattern`",
            config.rank
        ));
    }
    let scaling = config.scaling(rank);
    Ok(Part { layer, target, rank, a: floats(a_name, &a)?, b: floats(b_name, &b)?, scaling })
}

/// `(layer, target, side)` of a tensor named as PEFT names it:
/// `[base_model.model.]model.layers.{i}.{self_attn|mlp}.{x}_proj.lora_{A|B}[.{adapter}].weight`.
fn parse_name(name: &str) -> Result<(usize, Target, Side), String> {
    let rest = name.strip_prefix("base_model.model.").unwrap_or(name);
    let parts: Vec<&str> = rest.split('.').collect();
    // the module's path ends where PEFT's own components begin
    let end = parts
        .iter()
        .position(|p| p.starts_with("lora_") || *p == "modules_to_save" || *p == "base_layer")
        .unwrap_or(parts.len().saturating_sub(1));
    let (module, peft) = parts.split_at(end);
    let found = match module {
        ["model", "layers", i, parent, proj] => i
            .parse::<usize>()
            .ok()
            .zip(Target::ALL.into_iter().find(|t| t.parent() == *parent && t.peft_name() == *proj)),
        _ => None,
    };
    let Some((layer, target)) = found else {
        let module = module.join(".");
        let module = module.strip_prefix("model.").unwrap_or(&module);
        return Err(format!(
            "tensor `{name}` targets {module}, which ferrolm does not adapt \
             (it adapts q/k/v/o/gate/up/down)"
        ));
    };
    let side = match peft {
        ["lora_A", "weight"] | ["lora_A", _, "weight"] => Side::A,
        ["lora_B", "weight"] | ["lora_B", _, "weight"] => Side::B,
        _ => {
            return Err(format!(
                "tensor `{name}` is not a LoRA matrix of {}: ferrolm reads lora_A.weight and \
                 lora_B.weight only",
                target.peft_name()
            ))
        }
    };
    Ok((layer, target, side))
}

/// The tensor's values as f32, all finite.
fn floats(name: &str, view: &TensorView<'_>) -> Result<Vec<f32>, String> {
    let data = view.data();
    let values: Vec<f32> = match view.dtype() {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => return Err(format!("tensor `{name}` has dtype {other}; ferrolm reads F32, F16 and BF16")),
    };
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(format!("tensor `{name}` holds {} at index {i}", values[i])),
        None => Ok(values),
    }
}
