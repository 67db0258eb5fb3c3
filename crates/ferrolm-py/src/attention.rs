//! `paged_attention` and `write_kv`: the core's attention kernel over numpy arrays, read
//! and written in place (C-contiguous arrays only, so nothing is copied), with the GIL
//! released. Behaviour and errors are documented in `python/ferrolm/_core.pyi`.
//!
//! As with numpy's own functions, a caller that changes these arrays from another thread
//! during the call gets undefined results.

use ferrolm_core::attention::{self, bf16, f16, AttentionError, Geometry, KvElem, Options, Step};
use numpy::{npyffi, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::convert::{count, ids, type_name};
use crate::errors;
use crate::guard::contain;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dtype {
    F32,
    F16,
    Bf16,
}

/// A C-contiguous array seen as raw memory: its shape, element type and data.
struct Raw {
    shape: Vec<usize>,
    dtype: Dtype,
    data: usize, // address, so that the view is Send
    len: usize,
}

impl Raw {
    fn bytes(&self) -> std::ops::Range<usize> {
        let size = if self.dtype == Dtype::F32 { 4 } else { 2 };
        self.data..self.data + self.len * size
    }

    /// # Safety
    /// `T` must be the array's element type, and no one may write the array meanwhile.
    unsafe fn slice<T>(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.data as *const T, self.len)
    }

    /// # Safety
    /// As `slice`, and no other view of the array may be used meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut<T>(&self) -> &mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.data as *mut T, self.len)
    }
}

fn raw(obj: &Bound<'_, PyAny>, what: &'static str, ndim: usize, writable: bool) -> PyResult<Raw> {
    let py = obj.py();
    let array = obj.cast::<PyUntypedArray>().map_err(|_| {
        errors::invalid_field(py, what, format!("{what} must be a numpy array, got {}", type_name(obj)))
    })?;
    if array.ndim() != ndim {
        return Err(errors::invalid_field(
            py,
            what,
            format!("{what} must have {ndim} dimensions, got shape {:?}", array.shape()),
        ));
    }
    if !array.is_c_contiguous() {
        return Err(errors::invalid_field(py, what, format!("{what} must be C-contiguous")));
    }
    let dtype = array.dtype();
    let kind = match (dtype.kind(), dtype.itemsize()) {
        (b'f', 4) => Dtype::F32,
        (b'f', 2) => Dtype::F16,
        (_, 2) if dtype.str()?.to_str()? == "bfloat16" => Dtype::Bf16,
        _ => {
            return Err(errors::invalid_field(
                py,
                what,
                format!("{what} must be float32, float16 or bfloat16, got {dtype}"),
            ))
        }
    };
    // SAFETY: a live numpy array object.
    let (data, flags) = unsafe {
        let ptr = array.as_array_ptr();
        ((*ptr).fields.data as usize, (*ptr).fields.flags)
    };
    if writable && flags & npyffi::NPY_ARRAY_WRITEABLE == 0 {
        return Err(errors::invalid_field(py, what, format!("{what} is not writable")));
    }
    if data % dtype.itemsize() != 0 {
        return Err(errors::invalid_field(py, what, format!("{what} is not aligned")));
    }
    Ok(Raw { shape: array.shape().to_vec(), dtype: kind, data, len: array.len() })
}

fn float32(obj: &Bound<'_, PyAny>, what: &'static str, writable: bool) -> PyResult<Raw> {
    let r = raw(obj, what, 3, writable)?;
    if r.dtype != Dtype::F32 {
        return Err(errors::invalid_field(obj.py(), what, format!("{what} must be float32")));
    }
    Ok(r)
}

/// The pools' geometry and type; both must agree.
fn pools(k: &Bound<'_, PyAny>, v: &Bound<'_, PyAny>, writable: bool) -> PyResult<(Raw, Raw)> {
    let py = k.py();
    let (kr, vr) = (raw(k, "k_pool", 3, writable)?, raw(v, "v_pool", 3, writable)?);
    if kr.shape != vr.shape || kr.dtype != vr.dtype {
        return Err(errors::invalid_field(
            py,
            "v_pool",
            format!(
                "v_pool ({:?}, {:?}) must have k_pool's shape and type ({:?}, {:?})",
                vr.shape, vr.dtype, kr.shape, kr.dtype
            ),
        ));
    }
    if overlap(&kr, &vr) {
        return Err(errors::invalid_field(py, "v_pool", "k_pool and v_pool must not share memory".into()));
    }
    Ok((kr, vr))
}

fn overlap(a: &Raw, b: &Raw) -> bool {
    let (a, b) = (a.bytes(), b.bytes());
    a.start < b.end && b.start < a.end
}

fn core_error(py: Python<'_>, e: AttentionError) -> PyErr {
    errors::invalid_field(py, e.field, e.message)
}

/// Stores the step's new keys and values into their pool slots.
#[pyfunction]
#[pyo3(signature = (k_pool, v_pool, out_slots, keys, values))]
pub fn write_kv(
    py: Python<'_>,
    k_pool: &Bound<'_, PyAny>,
    v_pool: &Bound<'_, PyAny>,
    out_slots: &Bound<'_, PyAny>,
    keys: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let (kp, vp) = pools(k_pool, v_pool, true)?;
    let (kn, vn) = (float32(keys, "keys", false)?, float32(values, "values", false)?);
    let geometry = Geometry { num_heads: kp.shape[1], num_kv_heads: kp.shape[1], head_dim: kp.shape[2] };
    for (r, what) in [(&kn, "keys"), (&vn, "values")] {
        if r.shape[1..] != kp.shape[1..] {
            return Err(errors::invalid_field(
                py,
                what,
                format!(
                    "{what} has shape {:?}; want [T, {}, {}] like the pool",
                    r.shape, kp.shape[1], kp.shape[2]
                ),
            ));
        }
        if overlap(r, &kp) || overlap(r, &vp) {
            return Err(errors::invalid_field(
                py,
                what,
                format!("{what} must not share memory with the pool"),
            ));
        }
    }
    let slots = ids(out_slots, "out_slots", u32::MAX)?;
    let slots = slots.as_slice();
    // SAFETY: types checked above; the pools are distinct from each other and from the
    // inputs, and the GIL-holding caller does not touch them during the call.
    let done = contain(py, || unsafe {
        let (k, v) = (kn.slice::<f32>(), vn.slice::<f32>());
        match kp.dtype {
            Dtype::F32 => {
                attention::write_kv(geometry, slots, k, v, kp.slice_mut::<f32>(), vp.slice_mut::<f32>())
            }
            Dtype::F16 => {
                attention::write_kv(geometry, slots, k, v, kp.slice_mut::<f16>(), vp.slice_mut::<f16>())
            }
            Dtype::Bf16 => {
                attention::write_kv(geometry, slots, k, v, kp.slice_mut::<bf16>(), vp.slice_mut::<bf16>())
            }
        }
    })?;
    done.map_err(|e| core_error(py, e))
}

fn attend_typed<E: KvElem>(
    geometry: Geometry,
    step: &Step<'_>,
    queries: &Raw,
    pools: (&Raw, &Raw),
    options: &Options,
    out: &Raw,
) -> Result<(), AttentionError> {
    // SAFETY: the caller checked the types and that `out` shares no memory with the rest.
    unsafe {
        attention::attend(
            geometry,
            step,
            queries.slice::<f32>(),
            pools.0.slice::<E>(),
            pools.1.slice::<E>(),
            options,
            out.slice_mut::<f32>(),
        )
    }
}

/// Attention of a step's queries over the KV pool, written into `out`.
#[pyfunction]
#[pyo3(signature = (queries, k_pool, v_pool, positions, qo_offsets, kv_slots, kv_offsets, out, *, scale, sliding_window = None, num_threads = None))]
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    py: Python<'_>,
    queries: &Bound<'_, PyAny>,
    k_pool: &Bound<'_, PyAny>,
    v_pool: &Bound<'_, PyAny>,
    positions: &Bound<'_, PyAny>,
    qo_offsets: &Bound<'_, PyAny>,
    kv_slots: &Bound<'_, PyAny>,
    kv_offsets: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    scale: &Bound<'_, PyAny>,
    sliding_window: Option<&Bound<'_, PyAny>>,
    num_threads: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let q = float32(queries, "queries", false)?;
    let (kp, vp) = pools(k_pool, v_pool, false)?;
    let o = float32(out, "out", true)?;
    if o.shape != q.shape {
        return Err(errors::invalid_field(
            py,
            "out",
            format!("out has shape {:?}; want the queries' {:?}", o.shape, q.shape),
        ));
    }
    if overlap(&o, &q) || overlap(&o, &kp) || overlap(&o, &vp) {
        return Err(errors::invalid_field(py, "out", "out must not share memory with the inputs".into()));
    }
    if q.shape[2] != kp.shape[2] {
        return Err(errors::invalid_field(
            py,
            "queries",
            format!("queries' head size {} differs from the pool's {}", q.shape[2], kp.shape[2]),
        ));
    }
    let geometry = Geometry { num_heads: q.shape[1], num_kv_heads: kp.shape[1], head_dim: q.shape[2] };
    let scale: f64 = scale.extract().map_err(|_| {
        errors::invalid_field(py, "scale", format!("scale must be a float, got {}", type_name(scale)))
    })?;
    let options = Options {
        scale: scale as f32,
        sliding_window: sliding_window
            .filter(|w| !w.is_none())
            .map(|w| count(w, "sliding_window"))
            .transpose()?,
        num_threads: num_threads
            .filter(|n| !n.is_none())
            .map(|n| count(n, "num_threads"))
            .transpose()?
            .unwrap_or(0),
        max_keys_per_task: None,
    };
    let columns = [
        ids(positions, "positions", u32::MAX)?,
        ids(qo_offsets, "qo_offsets", u32::MAX)?,
        ids(kv_slots, "kv_slots", u32::MAX)?,
        ids(kv_offsets, "kv_offsets", u32::MAX)?,
    ];
    let step = Step {
        positions: columns[0].as_slice(),
        qo_offsets: columns[1].as_slice(),
        kv_slots: columns[2].as_slice(),
        kv_offsets: columns[3].as_slice(),
    };
    let done = contain(py, || match kp.dtype {
        Dtype::F32 => attend_typed::<f32>(geometry, &step, &q, (&kp, &vp), &options, &o),
        Dtype::F16 => attend_typed::<f16>(geometry, &step, &q, (&kp, &vp), &options, &o),
        Dtype::Bf16 => attend_typed::<bf16>(geometry, &step, &q, (&kp, &vp), &options, &o),
    })?;
    done.map_err(|e| core_error(py, e))
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(write_kv, m)?)?;
    m.add_function(wrap_pyfunction!(paged_attention, m)?)?;
    Ok(())
}
