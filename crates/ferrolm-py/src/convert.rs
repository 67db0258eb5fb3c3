//! Integer sequences in from Python: numpy `int32`/`uint32` arrays are read in place (no
//! copy when contiguous); other integer arrays and lists are converted once. Anything
//! else is an `InvalidInputError` that names the argument.
//!
//! Reading an array in place with the GIL released is what numpy's own functions do: a
//! caller that writes to the same array from another thread at the same time gets
//! undefined results, as it would with numpy.

use numpy::{
    PyArray2, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyReadwriteArray2, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use crate::errors;

pub enum Ids<'py> {
    /// A contiguous native 4-byte integer array read in place without numpy's borrow
    /// tracking (see [`tree_ids`]): the array, its data, its length.
    InPlace {
        _array: Bound<'py, PyUntypedArray>,
        data: *const u32,
        len: usize,
    },
    Unsigned(PyReadonlyArray1<'py, u32>),
    /// Checked non-negative, so its bits read as the same `u32` values.
    Signed(PyReadonlyArray1<'py, i32>),
    Owned(Vec<u32>),
}

impl Ids<'_> {
    pub fn as_slice(&self) -> &[u32] {
        match self {
            // SAFETY: the data of a contiguous array of this many 4-byte values, kept
            // alive by the array this holds; i32 values read as u32 bits (see tree_ids)
            Ids::InPlace { data, len, .. } => unsafe { std::slice::from_raw_parts(*data, *len) },
            Ids::Unsigned(a) => a.as_slice().expect("checked contiguous"),
            Ids::Signed(a) => {
                let s = a.as_slice().expect("checked contiguous");
                // SAFETY: i32 and u32 have the same size and alignment, and every value was
                // checked to be non-negative when this was built.
                unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u32>(), s.len()) }
            }
            Ids::Owned(v) => v,
        }
    }
}

/// A step's logits, `[rows, vocab]` float32, borrowed for writing (the commit modifies
/// them in place), with their row width: `obj` itself when it is a C-contiguous writable
/// float32 array, else one C-ordered float32 copy of anything array-like.
pub fn logits_rows<'py>(obj: &Bound<'py, PyAny>) -> PyResult<(PyReadwriteArray2<'py, f32>, usize)> {
    let py = obj.py();
    let array = match obj.cast::<PyArray2<f32>>() {
        Ok(a) if a.is_c_contiguous() && a.try_readwrite().is_ok() => a.clone(),
        _ => {
            let np = py.import("numpy")?;
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("dtype", "float32")?;
            kwargs.set_item("order", "C")?;
            let copy = np.call_method("array", (obj,), Some(&kwargs))?;
            copy.cast_into::<PyArray2<f32>>().map_err(|_| {
                errors::invalid_field(py, "logits", "logits must be a 2-D array [num_requests, vocab]".into())
            })?
        }
    };
    let width = array.shape()[1];
    Ok((array.readwrite(), width))
}

/// Reads `obj` as a sequence of integers in `0..=max`; `what` names it in errors.
pub fn ids<'py>(obj: &Bound<'py, PyAny>, what: &str, max: u32) -> PyResult<Ids<'py>> {
    let py = obj.py();
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return from_array(array, what, max);
    }
    if obj.is_instance_of::<pyo3::types::PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(errors::invalid_field(
            py,
            what,
            format!("{what} must be a sequence of integers, not a string"),
        ));
    }
    let values: Vec<i64> = obj.extract().map_err(|_| {
        errors::invalid_field(
            py,
            what,
            format!("{what} must be a 1-D numpy integer array or a sequence of ints, got {}", type_name(obj)),
        )
    })?;
    checked(py, values.into_iter(), what, max).map(Ids::Owned)
}

/// What [`tree_ids`] checked of the values' range: whether a signed array's sign is still
/// to be checked (left to the caller when asked, who then calls [`non_negative`] before
/// using the values and [`sign_error`] for the error), and, when checked, whether every
/// value is known to be below 2^31 (the radix tree's match skips the sign check of tokens
/// equal to keys only while every key is).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SignCheck {
    /// Checked: every value is in `0..=max`, and below 2^31 (an `int32` array).
    BelowHalf,
    /// Checked: every value is in `0..=max`, which may reach 2^31 and beyond (a `uint32`
    /// array, a list, another dtype).
    Done,
    /// An `int32` array whose sign is still to be checked.
    Deferred,
}

/// [`ids`] for the radix tree's calls, which only read their arrays and write to no array
/// a caller passed: a contiguous native `int32`/`uint32` array is read in place without
/// numpy's borrow tracking (a lock and a table lookup per array, a tenth of a tree
/// match; it guards Rust's own aliasing of arrays, and nothing here writes to one).
/// `max` is `u32::MAX` (any token) or the slot bound. With `defer_sign`, an `int32`
/// array's values are not yet checked to be non-negative (`SignCheck::Deferred`): the
/// caller checks them where it reads them anyway (see `RadixTree.match_prefix`).
pub fn tree_ids<'py>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    max: u32,
    defer_sign: bool,
) -> PyResult<(Ids<'py>, SignCheck)> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        let dtype = array.dtype();
        let kind = dtype.kind();
        let native4 = dtype.itemsize() == 4 && dtype.is_native_byteorder() != Some(false);
        // SAFETY: one dimension and a native 4-byte integer dtype: its values read as u32
        // bits; `as_slice` refuses an array that is not contiguous or not aligned (those
        // go through `ids`, which copies them)
        let slice = (array.ndim() == 1 && native4 && (kind == b'i' || kind == b'u'))
            .then(|| unsafe { array.cast_unchecked::<numpy::PyArray1<u32>>().as_slice() }.ok())
            .flatten();
        if let Some(s) = slice {
            let (data, len) = (s.as_ptr(), s.len());
            let deferred = kind == b'i' && defer_sign && max == u32::MAX;
            if kind == b'u' {
                check_max_u32(obj.py(), s, what, max)?;
            } else if !deferred {
                // SAFETY: the same values as i32
                let signed = unsafe { std::slice::from_raw_parts(data.cast::<i32>(), len) };
                check_range_i32(obj.py(), signed, what, max)?;
            }
            let check = if deferred {
                // asked for now, read by the caller's first pass
                prefetch(s);
                SignCheck::Deferred
            } else if kind == b'i' {
                SignCheck::BelowHalf
            } else {
                SignCheck::Done
            };
            return Ok((Ids::InPlace { _array: array.clone(), data, len }, check));
        }
    }
    ids(obj, what, max).map(|ids| (ids, SignCheck::Done))
}

/// Whether every value of an `int32` array read as `u32` bits is non-negative.
pub fn non_negative(bits: &[u32]) -> bool {
    top_bits_clear_in_cache(bits)
}

/// The error for an `int32` array [`non_negative`] refused, naming its first negative value.
pub fn sign_error(py: Python<'_>, bits: &[u32], what: &str) -> PyErr {
    let (i, &v) = bits.iter().enumerate().find(|(_, &v)| v >> 31 != 0).expect("a negative value");
    out_of_range(py, what, i, v as i32 as i64, u32::MAX)
}

fn from_array<'py>(array: &Bound<'py, PyUntypedArray>, what: &str, max: u32) -> PyResult<Ids<'py>> {
    let py = array.py();
    if array.ndim() != 1 {
        return Err(errors::invalid_field(
            py,
            what,
            format!("{what} must be a 1-D array, got shape {:?}", array.shape()),
        ));
    }
    let dtype = array.dtype();
    let kind = dtype.kind();
    // 4-byte integers in the machine's byte order are read in place. The dtype is checked
    // by its fields: cheaper than comparing against a constructed `int32` descriptor,
    // which the hot calls (a tree match is about a microsecond) would feel.
    if dtype.itemsize() == 4 && (kind == b'i' || kind == b'u') && dtype.is_native_byteorder() != Some(false) {
        if kind == b'u' {
            // SAFETY: one dimension and a native 4-byte unsigned dtype: a `u32` array
            let a = unsafe { array.cast_unchecked::<numpy::PyArray1<u32>>() }.readonly();
            if let Ok(s) = a.as_slice() {
                check_max_u32(py, s, what, max)?;
                return Ok(Ids::Unsigned(a));
            }
            return checked(py, a.as_array().iter().map(|&v| v as i64), what, max).map(Ids::Owned);
        }
        // SAFETY: as above, signed: an `i32` array
        let a = unsafe { array.cast_unchecked::<numpy::PyArray1<i32>>() }.readonly();
        if let Ok(s) = a.as_slice() {
            check_range_i32(py, s, what, max)?;
            return Ok(Ids::Signed(a));
        }
        return checked(py, a.as_array().iter().map(|&v| v as i64), what, max).map(Ids::Owned);
    }
    if kind == b'i' || kind == b'u' {
        // other widths: let numpy cast to int64 once (values above i64::MAX cannot be ids)
        let wide = array.call_method1("astype", ("int64",))?;
        let wide = wide.cast::<numpy::PyArray1<i64>>()?.readonly();
        return checked(py, wide.as_array().iter().copied(), what, max).map(Ids::Owned);
    }
    Err(errors::invalid_field(py, what, format!("{what} must be an integer array, got dtype {dtype}")))
}

// The range checks of the usual bounds (any u32, or below 2^31) reduce to an OR of the
// values' bits, which compiles to vector code on every x86-64 (a min/max does not without
// SSE4.1); only a failing check walks the values again to name the first bad one.

/// Whether every value has its top bit clear.
fn top_bits_clear(s: &[u32]) -> bool {
    prefetch(s);
    top_bits_clear_in_cache(s)
}

/// [`top_bits_clear`] for values just read (no prefetch).
fn top_bits_clear_in_cache(s: &[u32]) -> bool {
    // eight lanes, so that the loop is two vector ORs per step
    let mut lanes = [0u32; 8];
    let chunks = s.chunks_exact(8);
    let rest = chunks.remainder().iter().fold(0u32, |acc, &v| acc | v);
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane |= v;
        }
    }
    lanes.iter().fold(rest, |acc, &v| acc | v) >> 31 == 0
}

fn check_max_u32(py: Python<'_>, s: &[u32], what: &str, max: u32) -> PyResult<()> {
    let ok = match max {
        u32::MAX => true,
        MAX_I32 => top_bits_clear(s),
        _ => s.iter().all(|&v| v <= max),
    };
    if ok {
        return Ok(());
    }
    check_max(py, s.iter().map(|&v| v as i64), what, max)
}

fn check_range_i32(py: Python<'_>, s: &[i32], what: &str, max: u32) -> PyResult<()> {
    // SAFETY: i32 and u32 have the same size and alignment; a set top bit is a negative value
    let bits = unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u32>(), s.len()) };
    let ok = top_bits_clear(bits) && (max >= MAX_I32 || bits.iter().all(|&v| v <= max));
    if ok {
        return Ok(());
    }
    check_max(py, s.iter().map(|&v| v as i64), what, max)
}

const MAX_I32: u32 = i32::MAX as u32;

fn check_max(py: Python<'_>, values: impl Iterator<Item = i64>, what: &str, max: u32) -> PyResult<()> {
    for (i, v) in values.enumerate() {
        if v < 0 || v > max as i64 {
            return Err(out_of_range(py, what, i, v, max));
        }
    }
    Ok(())
}

fn checked(py: Python<'_>, values: impl Iterator<Item = i64>, what: &str, max: u32) -> PyResult<Vec<u32>> {
    values
        .enumerate()
        .map(
            |(i, v)| {
                if v < 0 || v > max as i64 {
                    Err(out_of_range(py, what, i, v, max))
                } else {
                    Ok(v as u32)
                }
            },
        )
        .collect()
}

fn out_of_range(py: Python<'_>, what: &str, index: usize, value: i64, max: u32) -> PyErr {
    errors::invalid_field(py, what, format!("{what}[{index}] is {value}; values must be in 0..={max}"))
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// A non-negative count; `what` names it in errors.
pub fn count(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    match obj.extract::<i64>() {
        Ok(v) if v >= 0 => Ok(v as usize),
        Ok(v) => Err(errors::invalid_field(obj.py(), what, format!("{what} must be >= 0, got {v}"))),
        Err(_) => Err(errors::invalid_field(
            obj.py(),
            what,
            format!("{what} must be an int, got {}", type_name(obj)),
        )),
    }
}

/// An int in `min..=max`; anything else is an `InvalidInputError` naming `what`.
pub fn int_in_range(obj: &Bound<'_, PyAny>, what: &'static str, min: i128, max: i128) -> PyResult<i128> {
    let py = obj.py();
    let v: i128 = obj.extract().map_err(|_| {
        let got = if obj.extract::<f64>().is_ok() && !obj.is_instance_of::<pyo3::types::PyFloat>() {
            "an int out of range".to_string() // too large even for i128
        } else {
            type_name(obj)
        };
        errors::invalid_field(py, what, format!("{what} must be an int in {min}..={max}, got {got}"))
    })?;
    if v < min || v > max {
        return Err(errors::invalid_field(py, what, format!("{what} must be in {min}..={max}, got {v}")));
    }
    Ok(v)
}

/// Typed arguments: each refuses a wrong type or value with `InvalidInputError` naming the
/// argument, where PyO3's own extraction would raise a bare `TypeError`/`OverflowError`.
macro_rules! int_arg {
    ($(#[$doc:meta])* $name:ident($ty:ty), $arg:literal, $min:expr, $max:expr) => {
        $(#[$doc])*
        pub struct $name(pub $ty);

        impl<'a, 'py> FromPyObject<'a, 'py> for $name {
            type Error = PyErr;
            fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
                int_in_range(&obj, $arg, $min as i128, $max as i128).map(|v| $name(v as $ty))
            }
        }
    };
}

int_arg!(
    /// Tokens per page.
    PageSize(usize), "page_size", 1, 1 << 20
);
int_arg!(
    /// Tokens per KV event block.
    BlockSize(usize), "kv_event_block_size", 1, 1 << 20
);
int_arg!(
    /// Eviction priority of inserted tokens.
    Priority(i64), "priority", i64::MIN, i64::MAX
);

macro_rules! str_arg {
    ($(#[$doc:meta])* $name:ident, $arg:literal) => {
        $(#[$doc])*
        pub struct $name(pub String);

        impl<'a, 'py> FromPyObject<'a, 'py> for $name {
            type Error = PyErr;
            fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
                match obj.cast::<pyo3::types::PyString>() {
                    Ok(s) => Ok($name(s.to_str()?.to_string())),
                    Err(_) => Err(errors::invalid_field(
                        obj.py(),
                        $arg,
                        format!("{} must be a str, got {}", $arg, type_name(&obj)),
                    )),
                }
            }
        }
    };
}

str_arg!(
    /// An eviction policy's name.
    PolicyName, "eviction_policy"
);
str_arg!(
    /// A cache namespace (LoRA id, cache salt).
    Namespace, "namespace"
);

/// A count where any int too large for the machine means "all of them".
pub fn count_or_all(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<usize> {
    match obj.extract::<i128>() {
        Ok(v) if v < 0 => Err(errors::invalid_field(obj.py(), what, format!("{what} must be >= 0, got {v}"))),
        Ok(v) => Ok(usize::try_from(v).unwrap_or(usize::MAX)),
        Err(_) if obj.is_instance_of::<pyo3::types::PyInt>() && obj.gt(0)? => Ok(usize::MAX),
        Err(_) => count(obj, what),
    }
}

/// Asks for every cache line of `data` at once. Token arrays come in cold more often than
/// not (a prompt tokenized a while ago), and this first read of them is most of a tree
/// match's time: all lines requested together arrive faster than a sequential read that
/// waits for the hardware prefetcher to ramp up.
#[inline]
fn prefetch(data: &[u32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const LINE: usize = 64 / std::mem::size_of::<u32>();
        for i in (0..data.len()).step_by(LINE) {
            // SAFETY: a prefetch never faults, and the address is inside `data`
            unsafe { _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().add(i).cast::<i8>()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// A Python value as JSON, for the request core's typed checks of the offline API's
/// fields: None, bools, strings, numbers (numpy's too), mappings (keys as their `str`) and
/// other iterables. An int beyond 64 bits or a float that is not finite is a float 0
/// here: still a number of its type, its range the core's to check. Anything else is an
/// empty mapping, which no typed field but a mapping takes.
pub fn json_of(obj: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    use pyo3::types::{PyBool, PyFloat, PyInt, PyMapping, PyString};
    use serde_json::Value;
    let float = |x: f64| Value::from(if x.is_finite() { x } else { 0.0 });
    let int =
        obj.is_instance_of::<PyInt>() || (!obj.is_instance_of::<PyFloat>() && obj.extract::<i64>().is_ok());
    Ok(if obj.is_none() {
        Value::Null
    } else if let Ok(b) = obj.cast::<PyBool>() {
        Value::Bool(b.is_true())
    } else if let Ok(s) = obj.cast::<PyString>() {
        Value::String(s.to_str()?.to_string())
    } else if int {
        match (obj.extract::<i64>(), obj.extract::<u64>()) {
            (Ok(i), _) => Value::from(i),
            (_, Ok(u)) => Value::from(u),
            _ => float(0.0),
        }
    } else if let Ok(x) = obj.cast::<PyFloat>() {
        float(x.value())
    } else if let Ok(m) = obj.cast::<PyMapping>() {
        let mut out = serde_json::Map::new();
        for item in m.items()?.iter() {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
            out.insert(k.str()?.to_str()?.to_string(), json_of(&v)?);
        }
        Value::Object(out)
    } else if let Ok(items) = obj.try_iter() {
        Value::Array(items.map(|v| json_of(&v?)).collect::<PyResult<_>>()?)
    } else if let Ok(x) = obj.extract::<f64>() {
        float(x)
    } else {
        Value::Object(serde_json::Map::new())
    })
}
