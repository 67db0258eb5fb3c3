//! `rms_norm`: the core's RMSNorm over numpy arrays, written into a caller's array (no
//! copy in or out), with the GIL released. Behaviour and errors: `python/ferrolm/_core.pyi`.

use ferrolm_core::norm;
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::convert::type_name;
use crate::errors;
use crate::guard::contain;

fn float32_array<'py>(obj: &Bound<'py, PyAny>, what: &'static str) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let py = obj.py();
    let array = obj.cast::<PyArrayDyn<f32>>().map_err(|_| {
        errors::invalid_field(
            py,
            what,
            format!("{what} must be a float32 numpy array, got {}", type_name(obj)),
        )
    })?;
    if !array.is_c_contiguous() {
        return Err(errors::invalid_field(py, what, format!("{what} must be C-contiguous")));
    }
    Ok(array.clone())
}

/// RMSNorm of the rows of `x` (its last axis) into `out`.
#[pyfunction]
#[pyo3(signature = (x, weight, out, *, eps))]
pub fn rms_norm(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    eps: f64,
) -> PyResult<()> {
    let (x, out) = (float32_array(x, "x")?, float32_array(out, "out")?);
    let weight = weight.cast::<PyArray1<f32>>().map_err(|_| {
        errors::invalid_field(py, "weight", "weight must be a 1-D float32 numpy array".into())
    })?;
    if x.ndim() == 0 || x.shape()[x.ndim() - 1] != weight.len() {
        return Err(errors::invalid_field(
            py,
            "weight",
            format!("weight has {} values; want x's last axis ({:?})", weight.len(), x.shape()),
        ));
    }
    if out.shape() != x.shape() {
        return Err(errors::invalid_field(
            py,
            "out",
            format!("out has shape {:?}; want x's {:?}", out.shape(), x.shape()),
        ));
    }
    let (x, weight) = (x.readonly(), weight.readonly());
    // the borrow checker of rust-numpy refuses an `out` that shares memory with the inputs
    let mut out = out.try_readwrite().map_err(|_| {
        errors::invalid_field(py, "out", "out must be writable and not share memory with x".into())
    })?;
    let (xs, ws) = (x.as_slice()?, weight.as_slice()?);
    let os = out.as_slice_mut()?;
    let done = contain(py, || norm::rms_norm(xs, ws, eps as f32, os))?;
    done.map_err(|e| errors::invalid_field(py, e.field, e.message))
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rms_norm, m)?)
}
