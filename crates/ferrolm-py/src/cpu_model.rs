//! `QuantModel`: the core's CPU forward over weights in their GGUF block formats
//! (`ferrolm_core::cpu_model`). The weights are copied once into the model at
//! construction (the caller's arrays, e.g. a memory-mapped file, can go afterwards); a
//! forward releases the GIL for the whole step. Behaviour and errors: `_core.pyi`.

use ferrolm_core::cpu_model::{
    Batch, KvDtype, Layer, Linear, ModelError, QuantModel as Core, Shape, Weights,
};
use ferrolm_core::quant::QuantType;
use numpy::{IntoPyArray, PyArray2, PyArrayDyn, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{ids, type_name};
use crate::errors;
use crate::guard::Poison;

fn model_error(py: Python<'_>, e: ModelError) -> PyErr {
    errors::invalid_field(py, &e.field, e.to_string())
}

/// `(ggml_type, rows, cols, data)` with `data` the matrix's raw blocks as uint8.
fn matrix(
    py: Python<'_>,
    matrices: &Bound<'_, PyDict>,
    name: &str,
    bias: Option<Vec<f32>>,
) -> PyResult<Linear> {
    let entry = matrices
        .get_item(name)?
        .ok_or_else(|| errors::invalid_field(py, name, format!("the model has no tensor {name:?}")))?;
    let (ggml_type, rows, cols, data, file_view): (u32, usize, usize, Bound<'_, PyAny>, bool) =
        entry.extract().map_err(|_| {
            errors::invalid_field(
                py,
                name,
                format!("{name}: want (ggml_type, rows, cols, uint8 array, is a view of a read-only file mapping)"),
            )
        })?;
    let ty = QuantType::from_ggml(ggml_type).ok_or_else(|| {
        errors::invalid_field(
            py,
            name,
            format!("{name}: ggml type {ggml_type} is not one ferrolm multiplies"),
        )
    })?;
    let array = data.cast::<PyArrayDyn<u8>>().map_err(|_| {
        errors::invalid_field(
            py,
            name,
            format!("{name}: data must be a uint8 array, got {}", type_name(&data)),
        )
    })?;
    let bytes = array.readonly();
    let slice = bytes
        .as_slice()
        .map_err(|_| errors::invalid_field(py, name, format!("{name}: data must be C-contiguous")))?;
    let copy = slice.to_vec();
    let writeable = || -> PyResult<bool> { array.getattr("flags")?.getattr("writeable")?.extract() };
    if file_view && !writeable()? {
        // SAFETY: the caller says the array views a file mapping, and it is read-only:
        // its pages can be dropped and read back from the file.
        unsafe { ferrolm_core::cpu_model::release_file_pages(slice) };
    }
    Linear::new(name, ty, rows, cols, copy, bias).map_err(|e| model_error(py, e))
}

fn vector(py: Python<'_>, vectors: &Bound<'_, PyDict>, name: &str) -> PyResult<Option<Vec<f32>>> {
    let Some(value) = vectors.get_item(name)? else { return Ok(None) };
    let array = value.cast::<PyArrayDyn<f32>>().map_err(|_| {
        errors::invalid_field(py, name, format!("{name}: want a float32 array, got {}", type_name(&value)))
    })?;
    Ok(Some(array.to_vec().map_err(|_| errors::invalid_field(py, name, format!("{name}: not contiguous")))?))
}

fn required(py: Python<'_>, vectors: &Bound<'_, PyDict>, name: &str) -> PyResult<Vec<f32>> {
    vector(py, vectors, name)?
        .ok_or_else(|| errors::invalid_field(py, name, format!("the model has no tensor {name:?}")))
}

fn shape_of(py: Python<'_>, shape: &Bound<'_, PyDict>) -> PyResult<Shape> {
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        shape.get_item(key)?.ok_or_else(|| errors::invalid_field(py, key, format!("shape needs {key:?}")))
    };
    let usize_of = |key: &str| -> PyResult<usize> { get(key)?.extract() };
    let window: Option<usize> = get("sliding_window")?.extract()?;
    Ok(Shape {
        hidden: usize_of("hidden")?,
        num_heads: usize_of("num_heads")?,
        num_kv_heads: usize_of("num_kv_heads")?,
        head_dim: usize_of("head_dim")?,
        intermediate: usize_of("intermediate")?,
        vocab: usize_of("vocab")?,
        rms_eps: get("rms_eps")?.extract()?,
        sliding_window: window,
        inv_freq: get("inv_freq")?.extract()?,
        rope_scale: match shape.get_item("rope_scale")? {
            Some(v) => v.extract()?,
            None => 1.0,
        },
    })
}

/// The Llama-family forward on the CPU over quantized weights, with its own KV pool.
#[pyclass(module = "ferrolm._core")]
pub struct QuantModel {
    core: Core,
    poison: Poison,
}

#[pymethods]
impl QuantModel {
    #[new]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    #[pyo3(signature = (shape, num_layers, matrices, vectors, num_slots, kv_cache_dtype = "float32", num_threads = 0))]
    fn new(
        py: Python<'_>,
        shape: &Bound<'_, PyDict>,
        num_layers: usize,
        matrices: &Bound<'_, PyDict>,
        vectors: &Bound<'_, PyDict>,
        num_slots: usize,
        kv_cache_dtype: &str,
        num_threads: usize,
    ) -> PyResult<Self> {
        let shape = shape_of(py, shape)?;
        let kv = match kv_cache_dtype {
            "float32" => KvDtype::F32,
            "float16" => KvDtype::F16,
            "bfloat16" => KvDtype::BF16,
            "q8_0" => KvDtype::Q8_0,
            other => {
                return Err(errors::invalid_field(
                    py,
                    "kv_cache_dtype",
                    format!("kv_cache_dtype must be float32, float16, bfloat16 or q8_0, got {other:?}"),
                ))
            }
        };
        let mut layers = Vec::with_capacity(num_layers);
        for i in 0..num_layers {
            let name = |part: &str| format!("blk.{i}.{part}");
            let m = |part: &str| {
                matrix(
                    py,
                    matrices,
                    &name(&format!("{part}.weight")),
                    vector(py, vectors, &name(&format!("{part}.bias")))?,
                )
            };
            layers.push(Layer {
                attn_norm: required(py, vectors, &name("attn_norm.weight"))?,
                q: m("attn_q")?,
                k: m("attn_k")?,
                v: m("attn_v")?,
                q_norm: vector(py, vectors, &name("attn_q_norm.weight"))?,
                k_norm: vector(py, vectors, &name("attn_k_norm.weight"))?,
                o: m("attn_output")?,
                ffn_norm: required(py, vectors, &name("ffn_norm.weight"))?,
                gate: m("ffn_gate")?,
                up: m("ffn_up")?,
                down: m("ffn_down")?,
            });
        }
        let embed = matrix(py, matrices, "token_embd.weight", None)?;
        let head = if matrices.contains("output.weight")? {
            Some(matrix(py, matrices, "output.weight", None)?)
        } else {
            None
        };
        let final_norm = required(py, vectors, "output_norm.weight")?;
        let core = Core::new(shape, Weights { embed, head, final_norm, layers }, num_slots, kv, num_threads)
            .map_err(|e| model_error(py, e))?;
        Ok(QuantModel { core, poison: Poison::default() })
    }

    /// Threads a step runs on.
    #[getter]
    fn num_threads(&self) -> usize {
        self.core.num_threads()
    }

    #[getter]
    fn num_slots(&self) -> usize {
        self.core.num_slots()
    }

    /// Bytes of weights a decode step reads.
    #[getter]
    fn weight_bytes(&self) -> usize {
        self.core.weight_bytes()
    }

    #[pyo3(signature = (
        input_ids, positions, out_slots, qo_offsets, kv_slots, kv_offsets, all_logits = false, logit_rows = None,
        loras = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn forward<'py>(
        &mut self,
        py: Python<'py>,
        input_ids: &Bound<'py, PyAny>,
        positions: &Bound<'py, PyAny>,
        out_slots: &Bound<'py, PyAny>,
        qo_offsets: &Bound<'py, PyAny>,
        kv_slots: &Bound<'py, PyAny>,
        kv_offsets: &Bound<'py, PyAny>,
        all_logits: bool,
        logit_rows: Option<&Bound<'py, PyAny>>,
        loras: Option<PyRef<'py, crate::lora::PyStepLoras>>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let loras = loras.map(|l| std::sync::Arc::clone(&l.loras));
        // copied out of the array: the forward runs with the GIL released
        let logit_rows: Option<Vec<u32>> =
            logit_rows.map(|r| ids(r, "logit_rows", u32::MAX).map(|r| r.as_slice().to_vec())).transpose()?;
        let columns = [
            ids(input_ids, "input_ids", u32::MAX)?,
            ids(positions, "positions", u32::MAX)?,
            ids(out_slots, "out_slots", u32::MAX)?,
            ids(qo_offsets, "qo_offsets", u32::MAX)?,
            ids(kv_slots, "kv_slots", u32::MAX)?,
            ids(kv_offsets, "kv_offsets", u32::MAX)?,
        ];
        let batch = Batch {
            input_ids: columns[0].as_slice(),
            positions: columns[1].as_slice(),
            out_slots: columns[2].as_slice(),
            qo_offsets: columns[3].as_slice(),
            kv_slots: columns[4].as_slice(),
            kv_offsets: columns[5].as_slice(),
            loras: loras.as_deref().map_or(&[], Vec::as_slice),
        };
        let rows = match (&logit_rows, all_logits) {
            (Some(r), _) => r.len(),
            (None, true) => batch.input_ids.len(),
            (None, false) => batch.qo_offsets.len().saturating_sub(1),
        };
        let vocab = self.core.shape.vocab;
        let core = &mut self.core;
        let logits = self.poison.run(py, (core, &batch, &logit_rows), |(core, batch, rows)| match rows {
            Some(r) => core.forward_rows(batch, r),
            None => core.forward(batch, all_logits),
        })?;
        let logits = logits.map_err(|e| model_error(py, e))?;
        logits.into_pyarray(py).reshape([rows, vocab])
    }
}

/// Bytes per second this machine reads from memory (a STREAM-like sum over a buffer of
/// `megabytes`, on `threads` threads, 0 = one per core; the best of `passes`).
#[pyfunction]
#[pyo3(signature = (megabytes = 512, threads = 0, passes = 5))]
fn read_bandwidth(py: Python<'_>, megabytes: usize, threads: usize, passes: usize) -> f64 {
    py.detach(|| ferrolm_core::cpu_model::read_bandwidth(megabytes << 20, threads, passes))
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_bandwidth, m)?)?;
    m.add_class::<QuantModel>()
}
