//! `dequantize`, `quant_matmul` and `quant_types`: the core's GGUF block formats over
//! numpy arrays. The input bytes are read in place (a memory-mapped file stays unread
//! until here), the output is a fresh float32 array handed to numpy without a copy, and
//! the GIL is released while the blocks are decoded or multiplied. Behaviour and errors:
//! `python/ferrolm/_core.pyi`.

use ferrolm_core::quant::{self, QuantType};
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::type_name;
use crate::errors;
use crate::guard::contain;

fn quant_type(py: Python<'_>, ggml_type: u32) -> PyResult<QuantType> {
    QuantType::from_ggml(ggml_type).ok_or_else(|| {
        let known: Vec<String> = QuantType::ALL.iter().map(|t| format!("{t} ({})", *t as u32)).collect();
        errors::invalid_field(
            py,
            "ggml_type",
            format!("ggml type {ggml_type} is not one ferrolm reads; it reads {}", known.join(", ")),
        )
    })
}

/// The weights that `data` (whole blocks of ggml type `ggml_type`) encode, as float32.
#[pyfunction]
pub fn dequantize<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    ggml_type: u32,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let ty = quant_type(py, ggml_type)?;
    let array = data.cast::<PyArrayDyn<u8>>().map_err(|_| {
        errors::invalid_field(
            py,
            "data",
            format!("data must be a uint8 numpy array (the raw blocks), got {}", type_name(data)),
        )
    })?;
    if !array.is_c_contiguous() {
        return Err(errors::invalid_field(py, "data", "data must be C-contiguous".into()));
    }
    let bytes = array.readonly();
    let slice = bytes.as_slice()?;
    if slice.len() % ty.block_bytes() != 0 {
        return Err(errors::invalid_field(
            py,
            "data",
            format!("{} bytes are not whole {ty} blocks of {} bytes", slice.len(), ty.block_bytes()),
        ));
    }
    let weights = slice.len() / ty.block_bytes() * ty.block_elems();
    let out = contain(py, || {
        let mut out = vec![0f32; weights];
        quant::dequantize(ty, slice, &mut out).map(|()| out)
    })?;
    let out = out.map_err(|e| errors::invalid_field(py, e.field, e.message))?;
    Ok(out.into_pyarray(py))
}

/// `x @ W.T` for `W`, `rows` rows of `cols` weights of ggml type `ggml_type` (raw
/// blocks, a GGUF tensor's bytes), and `x` float32 `[tokens, cols]`: float32 `[tokens,
/// rows]` by integer dot products over activations quantized per block.
#[pyfunction]
#[pyo3(signature = (weight, ggml_type, rows, cols, x))]
pub fn quant_matmul<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    ggml_type: u32,
    rows: usize,
    cols: usize,
    x: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let ty = quant_type(py, ggml_type)?;
    let w = weight.cast::<PyArrayDyn<u8>>().map_err(|_| {
        errors::invalid_field(
            py,
            "weight",
            format!("weight must be a uint8 numpy array, got {}", type_name(weight)),
        )
    })?;
    let xs = x.cast::<PyArrayDyn<f32>>().map_err(|_| {
        errors::invalid_field(py, "x", format!("x must be a float32 numpy array, got {}", type_name(x)))
    })?;
    if !w.is_c_contiguous() || !xs.is_c_contiguous() {
        return Err(errors::invalid_field(py, "x", "weight and x must be C-contiguous".into()));
    }
    if xs.ndim() != 2 || xs.shape()[1] != cols {
        return Err(errors::invalid_field(
            py,
            "x",
            format!("x must have shape [tokens, {cols}], got {:?}", xs.shape()),
        ));
    }
    let tokens = xs.shape()[0];
    let (w, xs) = (w.readonly(), xs.readonly());
    let (ws, xv) = (w.as_slice()?, xs.as_slice()?);
    let out = contain(py, || {
        let mut out = vec![0f32; tokens * rows];
        quant::dot::matmul(ty, ws, rows, cols, xv, &mut out).map(|()| out)
    })?;
    let out = out.map_err(|e| errors::invalid_field(py, e.field, e.message))?;
    out.into_pyarray(py).reshape([tokens, rows])
}

/// `x` (float32 `[rows, cols]`) quantized to ggml type `ggml_type` (Q8_0 or Q4_K): the
/// raw blocks as uint8, row after row, as a GGUF would store them.
#[pyfunction]
pub fn quantize<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    ggml_type: u32,
) -> PyResult<Bound<'py, PyArray1<u8>>> {
    let ty = quant_type(py, ggml_type)?;
    let xs = x.cast::<PyArrayDyn<f32>>().map_err(|_| {
        errors::invalid_field(py, "x", format!("x must be a float32 numpy array, got {}", type_name(x)))
    })?;
    if xs.ndim() != 2 || !xs.is_c_contiguous() {
        return Err(errors::invalid_field(py, "x", "x must be a C-contiguous [rows, cols] array".into()));
    }
    let cols = xs.shape()[1];
    let xs = xs.readonly();
    let values = xs.as_slice()?;
    let out = contain(py, || quant::quantize::quantize_rows(ty, values, cols))?;
    let out = out.map_err(|e| errors::invalid_field(py, e.field, e.message))?;
    Ok(out.into_pyarray(py))
}

/// ggml's name of each type `dequantize` reads, to its type id.
#[pyfunction]
pub fn quant_types(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for ty in QuantType::ALL {
        out.set_item(ty.name(), ty as u32)?;
    }
    Ok(out)
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(quant_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add_function(wrap_pyfunction!(quant_types, m)?)
}
