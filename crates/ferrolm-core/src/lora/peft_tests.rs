//! `load_peft` on folders written here with the safetensors crate: the three float types,
//! the scalings, the name forms PEFT writes, and every refusal naming its file and the
//! tensor or key at fault.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use half::{bf16, f16};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};

use super::*;

/// hidden 8, q_dim 8, kv_dim 4, intermediate 12, two layers.
const SHAPE: LoraShape = LoraShape { layers: 2, hidden: 8, q_dim: 8, kv_dim: 4, intermediate: 12 };

/// A folder under the system's temp dir, removed when dropped.
struct Folder(PathBuf);

impl Folder {
    fn new() -> Folder {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("ferrolm-lora-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        Folder(path)
    }

    fn config(self, config: &Value) -> Folder {
        std::fs::write(self.0.join("adapter_config.json"), config.to_string()).unwrap();
        self
    }

    fn weights(self, tensors: &[Tensor]) -> Folder {
        let bytes: Vec<(String, Vec<u8>)> = tensors.iter().map(|t| (t.name.clone(), t.bytes())).collect();
        let views = tensors
            .iter()
            .zip(&bytes)
            .map(|(t, (name, b))| (name.clone(), TensorView::new(t.dtype, t.shape.clone(), b).unwrap()));
        let file = safetensors::serialize(views, None).unwrap();
        std::fs::write(self.0.join("adapter_model.safetensors"), file).unwrap();
        self
    }

    fn load(&self) -> Result<Adapter, LoraError> {
        Adapter::load_peft(&self.0, &SHAPE)
    }

    /// The error of loading, checked to name `file` and to say `want`.
    fn refused(&self, file: &str, want: &[&str]) -> LoraError {
        let err = self.load().expect_err("the adapter is refused");
        assert!(err.file.ends_with(file), "{err} is not about {file}");
        assert!(Path::new(&err.file).starts_with(&self.0), "{} is not in the folder", err.file);
        for w in want {
            assert!(err.message.contains(w), "{:?} lacks {w:?}", err.message);
        }
        assert_eq!(err.to_string(), format!("{}: {}", err.file, err.message));
        err
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Tensor {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    values: Vec<f32>,
}

impl Tensor {
    fn bytes(&self) -> Vec<u8> {
        let v = &self.values;
        match self.dtype {
            Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Dtype::F16 => v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect(),
            Dtype::BF16 => v.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect(),
            Dtype::F64 => v.iter().flat_map(|&x| (x as f64).to_le_bytes()).collect(),
            other => panic!("no test data in {other}"),
        }
    }
}

/// Values every float type holds exactly (k / 8 for small k), different per tensor.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + seed * 3) % 17) as f32 / 8.0 - 1.0).collect()
}

/// The tensors of projection `proj` of `layer` with `rank`, under PEFT's usual name.
fn pair(layer: usize, target: Target, rank: usize, dtype: Dtype) -> [Tensor; 2] {
    let name = |side| format!("base_model.model.{}.lora_{side}.weight", module(layer, target));
    let (i, o) = SHAPE.dims(target);
    let seed = layer * 7 + target.index();
    [
        Tensor { name: name("A"), dtype, shape: vec![rank, i], values: values(rank * i, seed) },
        Tensor { name: name("B"), dtype, shape: vec![o, rank], values: values(o * rank, seed + 1) },
    ]
}

fn module(layer: usize, target: Target) -> String {
    format!("model.layers.{layer}.{}.{}", target.parent(), target.peft_name())
}

fn config() -> Value {
    json!({
        "peft_type": "LORA", "r": 2, "lora_alpha": 16, "bias": "none", "use_rslora": false,
        "use_dora": false, "fan_in_fan_out": false, "alpha_pattern": {}, "rank_pattern": {},
        "modules_to_save": null, "target_modules": ["q_proj", "v_proj", "down_proj"],
        "task_type": "CAUSAL_LM", "base_model_name_or_path": "somewhere/llama", "lora_dropout": 0.05,
    })
}

fn with(key: &str, value: Value) -> Value {
    let mut c = config();
    c[key] = value;
    c
}

/// q of layer 0, v and down of layer 1: the tensors a usual adapter has.
fn usual(dtype: Dtype) -> Vec<Tensor> {
    [(0, Target::Q), (1, Target::V), (1, Target::Down)]
        .into_iter()
        .flat_map(|(l, t)| pair(l, t, 2, dtype))
        .collect()
}

/// `b_t` as it should come out of `b` (`[out][rank]`).
fn transposed(b: &[f32], rank: usize, scaling: f32) -> Vec<f32> {
    let out = b.len() / rank;
    (0..rank).flat_map(|j| (0..out).map(move |o| b[o * rank + j] * scaling)).collect()
}

#[test]
fn f32_f16_and_bf16_load_to_the_same_matrices() {
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        let folder = Folder::new().config(&config()).weights(&usual(dtype));
        let adapter = folder.load().unwrap();
        assert_eq!(adapter.targets(), vec![Target::Q, Target::V, Target::Down]);
        assert_eq!(adapter.max_rank(), 2);
        for (layer, target) in [(0, Target::Q), (1, Target::V), (1, Target::Down)] {
            let [a, b] = pair(layer, target, 2, dtype);
            let got = adapter.get(layer, target).unwrap();
            assert_eq!((got.in_dim, got.out_dim), SHAPE.dims(target));
            assert_eq!(got.a, a.values, "{dtype} {layer} {target:?}");
            assert_eq!(got.b_t, transposed(&b.values, 2, 8.0)); // 16 / 2
        }
        assert!(adapter.get(0, Target::V).is_none() && adapter.get(1, Target::Q).is_none());
    }
}

#[test]
fn rslora_scales_by_the_square_root_of_the_rank() {
    let c = json!({"peft_type": "LORA", "r": 4, "lora_alpha": 16, "use_rslora": true});
    let folder = Folder::new().config(&c).weights(&pair(1, Target::O, 4, Dtype::F32));
    let adapter = folder.load().unwrap();
    let [_, b] = pair(1, Target::O, 4, Dtype::F32);
    assert_eq!(adapter.get(1, Target::O).unwrap().b_t, transposed(&b.values, 4, 8.0));
    // 16 / 2
}

#[test]
fn a_rank_pattern_gives_each_module_its_own_rank_and_scaling() {
    let mut tensors = usual(Dtype::F32);
    tensors.extend(pair(0, Target::Up, 4, Dtype::F32));
    let c = with("rank_pattern", json!({"model.layers.0.mlp.up_proj": 4}));
    let adapter = Folder::new().config(&c).weights(&tensors).load().unwrap();
    let up = adapter.get(0, Target::Up).unwrap();
    let [_, b] = pair(0, Target::Up, 4, Dtype::F32);
    assert_eq!((up.rank, &up.b_t), (4, &transposed(&b.values, 4, 4.0))); // 16 / 4
    assert_eq!(adapter.get(0, Target::Q).unwrap().rank, 2);
    assert_eq!(adapter.max_rank(), 4);
    // without the pattern, a rank other than r means the files disagree
    let folder = Folder::new().config(&config()).weights(&tensors);
    folder.refused("adapter_model.safetensors", &["layers.0.mlp.up_proj.lora_A.weight", "rank 4", "`r`"]);
}

#[test]
fn every_name_form_peft_writes_is_read() {
    let mut tensors = usual(Dtype::F32);
    // the adapter's name inside, and no leading base_model.model.
    tensors[0].name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight".into();
    tensors[1].name = "model.layers.0.self_attn.q_proj.lora_B.weight".into();
    tensors[2].name = "model.layers.1.self_attn.v_proj.lora_A.my_adapter.weight".into();
    let mut c = with("target_modules", json!("q_proj|v_proj|down_proj"));
    c["some_future_key"] = json!({"anything": [1, 2]});
    let adapter = Folder::new().config(&c).weights(&tensors).load().unwrap();
    assert_eq!(adapter.targets(), vec![Target::Q, Target::V, Target::Down]);
}

#[test]
fn config_options_that_change_the_arithmetic_are_refused_by_key() {
    let cases = [
        (with("peft_type", json!("PREFIX_TUNING")), "`peft_type`"),
        (with("use_dora", json!(true)), "`use_dora`"),
        (with("bias", json!("lora_only")), "`bias`"),
        (with("fan_in_fan_out", json!(true)), "`fan_in_fan_out`"),
        (with("alpha_pattern", json!({"q_proj": 32})), "`alpha_pattern`"),
        (with("modules_to_save", json!(["lm_head"])), "`modules_to_save`"),
        (with("r", json!(0)), "`r`"),
        (with("lora_alpha", json!("sixteen")), "`lora_alpha`"),
        (with("use_rslora", json!("yes")), "`use_rslora`"),
        (with("lora_bias", json!(true)), "`lora_bias`"),
    ];
    for (c, key) in cases {
        Folder::new().config(&c).weights(&usual(Dtype::F32)).refused("adapter_config.json", &[key]);
    }
    let mut c = config();
    c.as_object_mut().unwrap().remove("peft_type");
    Folder::new().config(&c).weights(&usual(Dtype::F32)).refused("adapter_config.json", &["`peft_type`"]);
}

#[test]
fn missing_or_broken_files_are_named() {
    let folder = Folder::new().weights(&usual(Dtype::F32));
    folder.refused("adapter_config.json", &["missing"]);
    let folder = Folder::new().weights(&usual(Dtype::F32));
    std::fs::write(folder.0.join("adapter_config.json"), "{\"peft_type\": \"LORA\",").unwrap();
    folder.refused("adapter_config.json", &["not valid JSON"]);

    let folder = Folder::new().config(&config());
    folder.refused("adapter_model.safetensors", &["missing"]);
    std::fs::write(folder.0.join("adapter_model.bin"), b"PK\x03\x04").unwrap();
    folder.refused("adapter_model.safetensors", &["adapter_model.bin", "pickle", "safe_serialization=True"]);
    std::fs::write(folder.0.join("adapter_model.safetensors"), b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
        .unwrap();
    folder.refused("adapter_model.safetensors", &["not a safetensors file"]);

    let empty = Folder::new().config(&config()).weights(&[]);
    empty.refused("adapter_model.safetensors", &["no LoRA tensors"]);
}

/// The usual tensors with `change` made; the load must fail naming `want`.
fn refused_weights(change: impl FnOnce(&mut Vec<Tensor>), want: &[&str]) {
    let mut tensors = usual(Dtype::F32);
    change(&mut tensors);
    Folder::new().config(&config()).weights(&tensors).refused("adapter_model.safetensors", want);
}

fn tensor(name: &str, shape: Vec<usize>) -> Tensor {
    let n = shape.iter().product();
    Tensor { name: name.into(), dtype: Dtype::F32, shape, values: values(n, 0) }
}

#[test]
fn tensors_ferrolm_cannot_apply_are_refused_by_name() {
    let does_not_adapt = "which ferrolm does not adapt (it adapts q/k/v/o/gate/up/down)";
    let embedding = "base_model.model.model.embed_tokens.lora_embedding_A";
    refused_weights(
        |t| t.push(tensor(embedding, vec![2, 16])),
        &[embedding, "targets embed_tokens", does_not_adapt],
    );
    let head = "base_model.model.lm_head.lora_A.weight";
    refused_weights(|t| t.push(tensor(head, vec![2, 8])), &[head, "targets lm_head", does_not_adapt]);
    let fused = "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight";
    refused_weights(
        |t| t.push(tensor(fused, vec![2, 8])),
        &[fused, "layers.0.self_attn.qkv_proj", does_not_adapt],
    );
    let saved = "base_model.model.lm_head.modules_to_save.default.weight";
    refused_weights(|t| t.push(tensor(saved, vec![4, 8])), &[saved, "targets lm_head"]);
    let dora = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector";
    refused_weights(|t| t.push(tensor(dora, vec![8])), &[dora, "lora_A.weight and lora_B.weight only"]);
}

#[test]
fn tensors_that_do_not_fit_are_refused_by_name() {
    let far = "base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight";
    refused_weights(|t| t.extend(pair(2, Target::Q, 2, Dtype::F32)), &[far, "layer 2", "2 layers"]);
    let lone_a = "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight";
    refused_weights(|t| t.push(tensor(lone_a, vec![2, 8])), &[lone_a, "lora_B is missing"]);
    let lone_b = "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight";
    refused_weights(|t| t.push(tensor(lone_b, vec![12, 2])), &[lone_b, "lora_A is missing"]);
    let q_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    let q_b = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
    refused_weights(|t| t[0] = tensor(q_a, vec![2, 6]), &[q_a, "[2, 6]", "[r, 8]", "hidden"]);
    refused_weights(|t| t[1] = tensor(q_b, vec![4, 2]), &[q_b, "[4, 2]", "[8, r]", "q_dim"]);
    refused_weights(|t| t[0] = tensor(q_a, vec![8]), &[q_a, "[8]"]);
    refused_weights(|t| t[1] = tensor(q_b, vec![8, 3]), &[q_a, q_b, "rank 2", "rank 3"]);
    let v_b = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight";
    refused_weights(|t| t[3].values[5] = f32::NAN, &[v_b, "NaN at index 5"]);
    refused_weights(|t| t[3].dtype = Dtype::F64, &[v_b, "dtype F64", "F32, F16 and BF16"]);
    let again = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight";
    refused_weights(|t| t.push(tensor(again, vec![2, 8])), &[q_a, again, "same matrix"]);
}
