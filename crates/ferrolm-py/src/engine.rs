//! `Engine`, `BatchPlan`, `StepOutputs`: the engine core's step API. Behaviour and errors
//! are documented in `python/ferrolm/_core.pyi`.

use std::collections::HashMap;
use std::sync::Arc;

use ferrolm_core::detok::{StopConditions, StopReason};
use ferrolm_core::engine::{
    BatchPlan, Constraint, DeviceDraws, Engine, EngineConfig, FinishReason, Lora, RequestParams,
    SamplingBatch, StepOutputs, ThinkingBudget,
};
use ferrolm_core::radix::EvictionPolicy;
use ferrolm_core::sampling::SamplingParams;
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};

use crate::convert::{ids, logits_rows, BlockSize};
use crate::errors;
use crate::guard::Poison;

#[pyclass(module = "ferrolm._core", name = "Engine")]
pub struct PyEngine {
    // the front end's binding (`frontend.rs`) steps the same core
    pub(crate) engine: Engine,
    pub(crate) poison: Poison,
}

/// One rid, or one per sample of the prompt.
#[derive(FromPyObject)]
enum Rids {
    One(u64),
    Samples(Vec<u64>),
}

/// A plan column for Python, read-only: `ForwardBatch.from_plan` takes a `BatchPlan`
/// without re-checking it, so its columns must stay as the core made them.
fn frozen<T: numpy::Element>(a: Bound<'_, PyArray1<T>>) -> Py<PyArray1<T>> {
    drop(a.readwrite().make_nonwriteable());
    a.unbind()
}

fn u32_array(py: Python<'_>, v: Vec<u32>) -> Py<PyArray1<i32>> {
    v.into_iter().map(|x| x as i32).collect::<Vec<i32>>().into_pyarray(py).unbind()
}

fn plan_column(py: Python<'_>, v: Vec<u32>) -> Py<PyArray1<i32>> {
    frozen(v.into_iter().map(|x| x as i32).collect::<Vec<i32>>().into_pyarray(py))
}

/// A request's thinking budget (`ferrolm_core::engine::ThinkingBudget`): see `_core.pyi`.
#[pyclass(module = "ferrolm._core", name = "ThinkingBudget", frozen, get_all)]
#[derive(Clone)]
pub struct PyThinkingBudget {
    pub budget: usize,
    pub start_ids: Vec<u32>,
    pub end_ids: Vec<u32>,
    pub open: bool,
}

#[pymethods]
impl PyThinkingBudget {
    #[new]
    #[pyo3(signature = (budget, end_ids, *, start_ids = Vec::new(), open = false))]
    fn new(budget: usize, end_ids: Vec<u32>, start_ids: Vec<u32>, open: bool) -> Self {
        PyThinkingBudget { budget, start_ids, end_ids, open }
    }

    fn __repr__(&self) -> String {
        format!(
            "ThinkingBudget(budget={}, end_ids={:?}, start_ids={:?}, open={})",
            self.budget,
            self.end_ids,
            self.start_ids,
            if self.open { "True" } else { "False" }
        )
    }
}

impl From<ThinkingBudget> for PyThinkingBudget {
    fn from(t: ThinkingBudget) -> Self {
        PyThinkingBudget { budget: t.budget, start_ids: t.start_ids, end_ids: t.end_ids, open: t.open }
    }
}

impl From<&PyThinkingBudget> for ThinkingBudget {
    fn from(t: &PyThinkingBudget) -> Self {
        ThinkingBudget {
            budget: t.budget,
            start_ids: t.start_ids.clone(),
            end_ids: t.end_ids.clone(),
            open: t.open,
        }
    }
}

#[pyclass(module = "ferrolm._core", name = "BatchPlan", frozen)]
pub struct PyBatchPlan {
    // the forward's columns, read every step
    #[pyo3(get)]
    input_ids: Py<PyArray1<i32>>,
    #[pyo3(get)]
    positions: Py<PyArray1<i32>>,
    #[pyo3(get)]
    out_slots: Py<PyArray1<i32>>,
    #[pyo3(get)]
    qo_offsets: Py<PyArray1<i32>>,
    #[pyo3(get)]
    kv_slots: Py<PyArray1<i32>>,
    #[pyo3(get)]
    kv_offsets: Py<PyArray1<i32>>,
    /// The new tokens whose logits the runner returns (`BatchPlan::logit_rows`).
    #[pyo3(get)]
    logit_rows: Py<PyArray1<i32>>,
    // the loop's columns, which a loop that leaves the outputs to the core (the Rust
    // front end's) seldom reads: made into arrays when first read
    rid_values: Vec<u64>,
    sample_values: Vec<bool>,
    prefill_values: Vec<bool>,
    greedy_values: Vec<bool>,
    ignore_eos_values: Vec<bool>,
    drafted_values: Vec<u32>,
    lora_values: Option<Arc<Vec<Option<Lora>>>>,
    rids: PyOnceLock<Py<PyArray1<u64>>>,
    samples: PyOnceLock<Py<PyArray1<bool>>>,
    is_prefill: PyOnceLock<Py<PyArray1<bool>>>,
    plain_greedy: PyOnceLock<Py<PyArray1<bool>>>,
    ignore_eos: PyOnceLock<Py<PyArray1<bool>>>,
    drafted: PyOnceLock<Py<PyArray1<u32>>>,
    // read by the step loop every step to pick the runner's mode: plain bools, no array
    #[pyo3(get)]
    all_plain_greedy: bool,
    #[pyo3(get)]
    has_drafts: bool,
    num_requests: usize,
    num_tokens: usize,
}

impl PyBatchPlan {
    pub(crate) fn new(py: Python<'_>, p: BatchPlan) -> Self {
        let has_lora = p.has_lora();
        PyBatchPlan {
            all_plain_greedy: p.all_plain_greedy(),
            has_drafts: p.has_drafts(),
            num_requests: p.num_requests(),
            num_tokens: p.num_tokens(),
            input_ids: plan_column(py, p.input_ids),
            positions: plan_column(py, p.positions),
            out_slots: plan_column(py, p.out_slots),
            qo_offsets: plan_column(py, p.qo_offsets),
            kv_slots: plan_column(py, p.kv_slots),
            kv_offsets: plan_column(py, p.kv_offsets),
            logit_rows: plan_column(py, p.logit_rows),
            rid_values: p.rids,
            sample_values: p.samples,
            prefill_values: p.is_prefill,
            greedy_values: p.plain_greedy,
            ignore_eos_values: p.ignore_eos,
            lora_values: has_lora.then(|| Arc::new(p.loras)),
            drafted_values: p.drafted,
            rids: PyOnceLock::new(),
            samples: PyOnceLock::new(),
            is_prefill: PyOnceLock::new(),
            plain_greedy: PyOnceLock::new(),
            ignore_eos: PyOnceLock::new(),
            drafted: PyOnceLock::new(),
        }
    }
}

/// A read-only array of `values`, made once.
fn lazy_column<'py, T: numpy::Element + Copy>(
    py: Python<'py>,
    cell: &PyOnceLock<Py<PyArray1<T>>>,
    values: &[T],
) -> Bound<'py, PyArray1<T>> {
    // owned by a Rust container, as the other columns: numpy then refuses `setflags(write=True)`
    cell.get_or_init(py, || frozen(values.to_vec().into_pyarray(py))).bind(py).clone()
}

#[pymethods]
impl PyBatchPlan {
    #[getter]
    fn rids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u64>> {
        lazy_column(py, &self.rids, &self.rid_values)
    }
    #[getter]
    fn samples<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        lazy_column(py, &self.samples, &self.sample_values)
    }
    #[getter]
    fn is_prefill<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        lazy_column(py, &self.is_prefill, &self.prefill_values)
    }
    #[getter]
    fn plain_greedy<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        lazy_column(py, &self.plain_greedy, &self.greedy_values)
    }
    #[getter]
    fn ignore_eos<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<bool>> {
        lazy_column(py, &self.ignore_eos, &self.ignore_eos_values)
    }
    #[getter]
    fn drafted<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        lazy_column(py, &self.drafted, &self.drafted_values)
    }
    /// Each request's LoRA adapter (`StepLoras`), or `None` when no request has one.
    #[getter]
    fn loras(&self) -> Option<crate::lora::PyStepLoras> {
        self.lora_values.as_ref().map(|l| crate::lora::PyStepLoras { loras: Arc::clone(l) })
    }
    #[getter]
    fn num_requests(&self) -> usize {
        self.num_requests
    }
    /// `num_requests` under `ForwardBatch`'s name, so that a runner takes the plan as its batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.num_requests
    }
    #[getter]
    fn num_tokens(&self) -> usize {
        self.num_tokens
    }
    fn __len__(&self) -> usize {
        self.num_requests
    }
    fn __repr__(&self) -> String {
        format!("BatchPlan(num_requests={}, num_tokens={})", self.num_requests, self.num_tokens)
    }
}

#[pyclass(module = "ferrolm._core", name = "SamplingBatch", frozen, get_all)]
pub struct PySamplingBatch {
    greedy: Py<PyArray1<bool>>,
    temperature: Py<PyArray1<f32>>,
    top_k: Py<PyArray1<i32>>,
    top_p: Py<PyArray1<f32>>,
    min_p: Py<PyArray1<f32>>,
    repetition_penalty: Py<PyArray1<f32>>,
    frequency_penalty: Py<PyArray1<f32>>,
    presence_penalty: Py<PyArray1<f32>>,
    uniforms: Py<PyArray1<f64>>,
    logprobs: Py<PyArray1<bool>>,
    top_logprobs: Py<PyArray1<i32>>,
    bias_offsets: Py<PyArray1<i32>>,
    bias_ids: Py<PyArray1<i32>>,
    bias_values: Py<PyArray1<f32>>,
    penalty_offsets: Py<PyArray1<i32>>,
    penalty_ids: Py<PyArray1<i32>>,
    penalty_counts: Py<PyArray1<i32>>,
    banned_offsets: Py<PyArray1<i32>>,
    banned_ids: Py<PyArray1<i32>>,
    mask_rows: Py<PyArray1<i32>>,
    masks: Py<PyArray2<i32>>,
    num_rows: usize,
}

impl PySamplingBatch {
    fn new(py: Python<'_>, b: SamplingBatch) -> PyResult<Self> {
        let words = b.mask_words;
        let num_masks = b.masks.len() / words.max(1);
        // the packed words as int32 (the same bits): what torch and numpy shift and test
        let masks: Vec<i32> = b.masks.into_iter().map(|w| w as i32).collect();
        let masks = masks.into_pyarray(py).reshape([num_masks, words])?.unbind();
        Ok(PySamplingBatch {
            num_rows: b.greedy.len(),
            greedy: b.greedy.into_pyarray(py).unbind(),
            temperature: b.temperature.into_pyarray(py).unbind(),
            top_k: u32_array(py, b.top_k),
            top_p: b.top_p.into_pyarray(py).unbind(),
            min_p: b.min_p.into_pyarray(py).unbind(),
            repetition_penalty: b.repetition_penalty.into_pyarray(py).unbind(),
            frequency_penalty: b.frequency_penalty.into_pyarray(py).unbind(),
            presence_penalty: b.presence_penalty.into_pyarray(py).unbind(),
            uniforms: b.uniforms.into_pyarray(py).unbind(),
            logprobs: b.logprobs.into_pyarray(py).unbind(),
            top_logprobs: u32_array(py, b.top_logprobs),
            bias_offsets: u32_array(py, b.bias_offsets),
            bias_ids: u32_array(py, b.bias_ids),
            bias_values: b.bias_values.into_pyarray(py).unbind(),
            penalty_offsets: u32_array(py, b.penalty_offsets),
            penalty_ids: u32_array(py, b.penalty_ids),
            penalty_counts: u32_array(py, b.penalty_counts),
            banned_offsets: u32_array(py, b.banned_offsets),
            banned_ids: u32_array(py, b.banned_ids),
            mask_rows: b.mask_rows.into_pyarray(py).unbind(),
            masks,
        })
    }
}

#[pymethods]
impl PySamplingBatch {
    fn __len__(&self) -> usize {
        self.num_rows
    }
}

/// The drawn tokens as given to `commit_tokens`: ids, or -1 where nothing could be drawn.
fn drawn_tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Option<u32>>> {
    let py = obj.py();
    let bad = |m: String| errors::invalid_field(py, "tokens", m);
    let read = |i: usize, t: i64| match t {
        -1 => Ok(None),
        t if (0..=u32::MAX as i64).contains(&t) => Ok(Some(t as u32)),
        t => Err(bad(format!("tokens[{i}] is {t}; ids are >= 0 (-1: nothing could be drawn)"))),
    };
    if let Ok(a) = obj.cast::<PyArray1<i32>>() {
        // what the runners hand over: read in place
        let a = a.readonly();
        return a.as_array().iter().enumerate().map(|(i, &t)| read(i, t as i64)).collect();
    }
    let array = py.import("numpy")?.call_method1("asarray", (obj,))?;
    let array = array.cast::<PyUntypedArray>().map_err(|_| bad("tokens must be an integer array".into()))?;
    if array.ndim() != 1 {
        return Err(bad(format!("tokens must be a 1-D array, got shape {:?}", array.shape())));
    }
    if array.len() == 0 {
        return Ok(Vec::new());
    }
    let kind = array.dtype().kind();
    if kind != b'i' && kind != b'u' {
        return Err(bad(format!("tokens must be an integer array, got dtype {}", array.dtype())));
    }
    let wide = array.call_method1("astype", ("int64",))?;
    let wide = wide.cast::<PyArray1<i64>>()?.readonly();
    wide.as_array().iter().enumerate().map(|(i, &t)| read(i, t)).collect()
}

/// `obj` as a C-contiguous array of `T` (converted once where it is another type) with
/// `ndim` dimensions: its values and shape.
fn values<T: numpy::Element + Copy>(
    obj: &Bound<'_, PyAny>,
    what: &'static str,
    dtype: &str,
    ndim: usize,
) -> PyResult<(Vec<T>, Vec<usize>)> {
    let py = obj.py();
    let array = py
        .import("numpy")?
        .call_method1("ascontiguousarray", (obj, dtype))
        .map_err(|_| errors::invalid_field(py, what, format!("{what} must be an array of {dtype}")))?;
    let array = array.cast::<PyArrayDyn<T>>()?.readonly();
    if array.ndim() != ndim {
        return Err(errors::invalid_field(
            py,
            what,
            format!("{what} must have {ndim} dimensions, got shape {:?}", array.shape()),
        ));
    }
    Ok((array.as_slice()?.to_vec(), array.shape().to_vec()))
}

/// What a runner drew on its device, as `commit_tokens` takes it (the `Engine`'s and the
/// `Frontend`'s), read and checked once.
pub(crate) struct Draws {
    tokens: Vec<Option<u32>>,
    logprobs: Option<Vec<f32>>,
    top_ids: Vec<u32>,
    top_logprobs: Vec<f32>,
    top_width: usize,
}

impl Draws {
    pub(crate) fn read(
        tokens: &Bound<'_, PyAny>,
        logprobs: Option<&Bound<'_, PyAny>>,
        top_ids: Option<&Bound<'_, PyAny>>,
        top_logprobs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let py = tokens.py();
        let tokens = drawn_tokens(tokens)?;
        let logprobs =
            logprobs.map(|l| values::<f32>(l, "logprobs", "float32", 1)).transpose()?.map(|(l, _)| l);
        let (top_ids, top_logprobs, top_width) = match (top_ids, top_logprobs) {
            (None, None) => (Vec::new(), Vec::new(), 0),
            (Some(ids), Some(lps)) => {
                let (ids, shape) = values::<i64>(ids, "top_ids", "int64", 2)?;
                let (lps, lps_shape) = values::<f32>(lps, "top_logprobs", "float32", 2)?;
                if lps_shape != shape {
                    return Err(errors::invalid_field(
                        py,
                        "top_logprobs",
                        format!("top_logprobs has shape {lps_shape:?}; want top_ids' {shape:?}"),
                    ));
                }
                let ids = ids
                    .into_iter()
                    .map(|t| u32::try_from(t).ok())
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| errors::invalid_field(py, "top_ids", "top_ids must be >= 0".into()))?;
                (ids, lps, shape[1])
            }
            _ => {
                return Err(errors::invalid_field(
                    py,
                    "top_ids",
                    "give top_ids and top_logprobs together".into(),
                ))
            }
        };
        Ok(Draws { tokens, logprobs, top_ids, top_logprobs, top_width })
    }

    pub(crate) fn as_device(&self) -> DeviceDraws<'_> {
        DeviceDraws {
            tokens: &self.tokens,
            logprobs: self.logprobs.as_deref(),
            top_ids: &self.top_ids,
            top_logprobs: &self.top_logprobs,
            top_width: self.top_width,
        }
    }
}

#[pyclass(module = "ferrolm._core", name = "StepOutputs", frozen, get_all)]
pub struct PyStepOutputs {
    rids: Py<PyArray1<u64>>,
    token_offsets: Py<PyArray1<i32>>,
    token_ids: Py<PyArray1<i32>>,
    logprobs: Py<PyArray1<f32>>,
    top_offsets: Py<PyArray1<i32>>,
    top_ids: Py<PyArray1<i32>>,
    top_logprobs: Py<PyArray1<f32>>,
    texts: Py<PyList>,
    finished: Py<PyList>,
}

impl PyStepOutputs {
    fn new(py: Python<'_>, o: StepOutputs) -> PyResult<Self> {
        let finished = PyList::empty(py);
        for f in o.finished {
            match f {
                None => finished.append(py.None())?,
                Some(f) => {
                    type Matched = Option<Py<PyAny>>;
                    let (kind, matched, message, error_kind): (&str, Matched, Option<String>, Option<&str>) =
                        match f.reason {
                            FinishReason::Stop(StopReason::Token(t)) => {
                                ("stop", Some(t.into_pyobject(py)?.into_any().unbind()), None, None)
                            }
                            FinishReason::Stop(StopReason::String(s)) => {
                                ("stop", Some(s.into_pyobject(py)?.into_any().unbind()), None, None)
                            }
                            FinishReason::Length => ("length", None, None, None),
                            FinishReason::Abort => ("abort", None, None, None),
                            FinishReason::Error { kind, message } => {
                                ("error", None, Some(message), Some(kind.as_str()))
                            }
                        };
                    finished.append((
                        kind,
                        matched,
                        message,
                        f.prompt_tokens,
                        f.cached_tokens,
                        f.completion_tokens,
                        error_kind,
                    ))?;
                }
            }
        }
        Ok(PyStepOutputs {
            rids: o.rids.into_pyarray(py).unbind(),
            token_offsets: u32_array(py, o.token_offsets),
            token_ids: u32_array(py, o.token_ids),
            logprobs: o.logprobs.into_pyarray(py).unbind(),
            top_offsets: u32_array(py, o.top_offsets),
            top_ids: u32_array(py, o.top_ids),
            top_logprobs: o.top_logprobs.into_pyarray(py).unbind(),
            texts: PyList::new(py, o.texts)?.unbind(),
            finished: finished.unbind(),
        })
    }
}

#[pymethods]
impl PyStepOutputs {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.texts.bind(py).len()
    }
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (
        // None: EngineConfig::default()'s, the one place the defaults are written
        vocabulary, *, kv_capacity = None, max_running_requests = None, max_prefill_tokens = None,
        schedule_policy = None, enable_prefix_cache = None, eviction_policy = None, new_token_ratio = None,
        fast_lane_tokens = None, max_context = None, seed = None, enable_kv_events = None,
        kv_event_block_size = None, speculative = None, speculative_max_draft = None,
        speculative_row_cost = None, max_loras = None, record_trace = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        vocabulary: PyRef<'_, crate::constraint::PyVocabulary>,
        kv_capacity: Option<usize>,
        max_running_requests: Option<usize>,
        max_prefill_tokens: Option<usize>,
        schedule_policy: Option<&str>,
        enable_prefix_cache: Option<bool>,
        eviction_policy: Option<&str>,
        new_token_ratio: Option<f64>,
        fast_lane_tokens: Option<usize>,
        max_context: Option<usize>,
        seed: Option<u64>,
        enable_kv_events: Option<bool>,
        kv_event_block_size: Option<BlockSize>,
        speculative: Option<bool>,
        speculative_max_draft: Option<usize>,
        speculative_row_cost: Option<f64>,
        max_loras: Option<usize>,
        record_trace: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let bad = |field: &'static str, m: String| errors::invalid_field(py, field, format!("{field}: {m}"));
        let d = EngineConfig::default();
        let schedule_policy = match schedule_policy {
            Some(p) => p.parse().map_err(|m| bad("schedule_policy", m))?,
            None => d.schedule_policy,
        };
        let eviction_policy: EvictionPolicy = match eviction_policy {
            Some(p) => p.parse().map_err(|e: ferrolm_core::radix::policy::UnknownPolicy| {
                bad("eviction_policy", e.to_string())
            })?,
            None => d.eviction_policy,
        };
        let config = EngineConfig {
            kv_capacity: kv_capacity.unwrap_or(d.kv_capacity),
            max_running_requests: max_running_requests.unwrap_or(d.max_running_requests),
            max_prefill_tokens: max_prefill_tokens.unwrap_or(d.max_prefill_tokens),
            schedule_policy,
            enable_prefix_cache: enable_prefix_cache.unwrap_or(d.enable_prefix_cache),
            eviction_policy,
            new_token_ratio: new_token_ratio.unwrap_or(d.new_token_ratio),
            fast_lane_tokens: fast_lane_tokens.unwrap_or(d.fast_lane_tokens),
            max_context: max_context.unwrap_or(d.max_context),
            vocab_size: vocabulary.vocab().size(),
            eos_token_ids: vocabulary.vocab().eos_ids().to_vec(),
            seed: seed.unwrap_or(d.seed),
            kv_events: enable_kv_events.unwrap_or(d.kv_events),
            kv_event_block_size: kv_event_block_size.map_or(d.kv_event_block_size, |b| b.0),
            speculative: speculative.unwrap_or(d.speculative),
            speculative_max_draft: speculative_max_draft.unwrap_or(d.speculative_max_draft),
            speculative_row_cost: speculative_row_cost.unwrap_or(d.speculative_row_cost),
            max_loras: max_loras.unwrap_or(d.max_loras),
        };
        // the engine detokenizes with it; request grammars must be compiled from it
        let mut engine = Engine::new(config, vocabulary.vocab().clone())
            .map_err(|e| errors::invalid_field(py, e.field, e.to_string()))?;
        if let Some(path) = record_trace {
            let file = std::fs::File::create(&path).map_err(|e| {
                pyo3::exceptions::PyOSError::new_err(format!("record_trace: {}: {e}", path.display()))
            })?;
            engine.record_trace(Box::new(file)).map_err(|m| errors::invalid_field(py, "record_trace", m))?;
        }
        Ok(PyEngine { engine, poison: Poison::default() })
    }

    /// See `_core.pyi`.
    #[pyo3(signature = (
        rid, input_ids, *, max_new_tokens = 16, min_new_tokens = 0, temperature = 1.0, top_k = 0, top_p = 1.0,
        min_p = 0.0, repetition_penalty = 1.0, frequency_penalty = 0.0, presence_penalty = 0.0,
        logit_bias = None, seed = None, logprobs = false, top_logprobs = 0, stop = Vec::new(),
        stop_token_ids = Vec::new(), include_stop_str = false, skip_special_tokens = true, ignore_eos = false,
        priority = 0, namespace = None, queue_timeout = None, allowed_token_ids = None, grammar = None,
        speculative = None,
        thinking = None, lora = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        py: Python<'_>,
        rid: Rids,
        input_ids: &Bound<'_, PyAny>,
        max_new_tokens: usize,
        min_new_tokens: usize,
        temperature: f32,
        top_k: u32,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        frequency_penalty: f32,
        presence_penalty: f32,
        logit_bias: Option<HashMap<u32, f32>>,
        seed: Option<u64>,
        logprobs: bool,
        top_logprobs: u32,
        stop: Vec<String>,
        stop_token_ids: Vec<u32>,
        include_stop_str: bool,
        skip_special_tokens: bool,
        ignore_eos: bool,
        priority: i64,
        namespace: Option<String>,
        queue_timeout: Option<f64>,
        allowed_token_ids: Option<Vec<u32>>,
        grammar: Option<PyRef<'_, crate::constraint::PyGrammar>>,
        speculative: Option<bool>,
        thinking: Option<PyRef<'_, PyThinkingBudget>>,
        lora: Option<PyRef<'_, crate::lora::PyLoraAdapter>>,
    ) -> PyResult<()> {
        let input_ids = ids(input_ids, "input_ids", u32::MAX)?;
        let input_ids = input_ids.as_slice();
        let mut logit_bias: Vec<(u32, f32)> = logit_bias.unwrap_or_default().into_iter().collect();
        logit_bias.sort_by_key(|b| b.0);
        let params = RequestParams {
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty,
                frequency_penalty,
                presence_penalty,
                logit_bias,
                seed,
                logprobs,
                top_logprobs,
            },
            stops: StopConditions {
                stop_strings: stop,
                stop_token_ids,
                include_stop_str,
                skip_special_tokens,
            },
            max_new_tokens,
            min_new_tokens,
            ignore_eos,
            priority,
            namespace,
            queue_timeout_s: queue_timeout,
            speculative,
            thinking: thinking.map(|t| ThinkingBudget::from(&*t)),
            lora: lora.map(|l| l.lora.clone()),
        };
        let constraint = match (allowed_token_ids, grammar) {
            (Some(_), Some(_)) => {
                return Err(errors::invalid_field(
                    py,
                    "grammar",
                    "grammar: give a grammar or allowed_token_ids, not both".into(),
                ))
            }
            (Some(a), None) => Some(Constraint::AllowedTokens(a)),
            (None, Some(g)) => Some(Constraint::Grammar(g.grammar.clone())),
            (None, None) => None,
        };
        let rids = match rid {
            Rids::One(rid) => vec![rid],
            Rids::Samples(rids) => rids,
        };
        self.poison
            .run(py, &mut self.engine, |e| e.submit_samples(&rids, input_ids, params, constraint))?
            .map_err(|e| errors::engine(py, e))
    }

    fn schedule(&mut self, py: Python<'_>) -> PyResult<PyBatchPlan> {
        let plan =
            self.poison.run(py, &mut self.engine, |e| e.schedule())?.map_err(|e| errors::engine(py, e))?;
        Ok(PyBatchPlan::new(py, plan))
    }

    fn commit(&mut self, py: Python<'_>, logits: &Bound<'_, PyAny>) -> PyResult<PyStepOutputs> {
        let (mut rows, width) = logits_rows(logits)?;
        let slice = rows.as_slice_mut().expect("C-contiguous: logits_rows checked or copied it");
        let out = self
            .poison
            .run(py, (&mut self.engine, slice), |(e, s)| e.commit(s, width))?
            .map_err(|e| errors::engine(py, e))?;
        PyStepOutputs::new(py, out)
    }

    #[pyo3(signature = (tokens, *, logprobs = None, top_ids = None, top_logprobs = None))]
    fn commit_tokens(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        logprobs: Option<&Bound<'_, PyAny>>,
        top_ids: Option<&Bound<'_, PyAny>>,
        top_logprobs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyStepOutputs> {
        let draws = Draws::read(tokens, logprobs, top_ids, top_logprobs)?;
        let out = self
            .poison
            .run(py, &mut self.engine, |e| e.commit_drawn(&draws.as_device()))?
            .map_err(|e| errors::engine(py, e))?;
        PyStepOutputs::new(py, out)
    }

    fn sampling_batch(&mut self, py: Python<'_>) -> PyResult<PySamplingBatch> {
        let b = self
            .poison
            .run(py, &mut self.engine, |e| e.sampling_batch())?
            .map_err(|e| errors::engine(py, e))?;
        PySamplingBatch::new(py, b)
    }

    fn fail_step(&mut self, py: Python<'_>, message: &str) -> PyResult<PyStepOutputs> {
        let out = self.poison.run(py, &mut self.engine, |e| e.fail_step(message))?;
        PyStepOutputs::new(py, out)
    }

    fn abort(&mut self, py: Python<'_>, rid: u64) -> PyResult<bool> {
        self.poison.run(py, &mut self.engine, |e| e.abort(rid))
    }

    fn abort_all(&mut self, py: Python<'_>) -> PyResult<usize> {
        self.poison.run(py, &mut self.engine, |e| e.abort_all())
    }

    fn take_outputs(&mut self, py: Python<'_>) -> PyResult<PyStepOutputs> {
        let out = self.poison.run(py, &mut self.engine, |e| e.take_outputs())?;
        PyStepOutputs::new(py, out)
    }

    fn has_work(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.poison.run(py, &self.engine, |e| e.has_work())
    }

    fn flush_cache(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.poison.run(py, &mut self.engine, |e| e.flush_cache())
    }

    fn take_kv_events<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let events = self.poison.run(py, &mut self.engine, |e| e.take_kv_events())?;
        crate::kv_events::raw_events(py, events)
    }

    fn check_invariants(&mut self, py: Python<'_>) -> PyResult<()> {
        self.poison
            .run(py, &self.engine, |e| e.check_invariants())?
            .map_err(|m| errors::invariant_violation(py, m))
    }

    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (s, l) = self.poison.run(py, &self.engine, |e| (e.stats(), e.load()))?;
        let d = PyDict::new(py);
        d.set_item("steps", s.steps)?;
        d.set_item("prompt_tokens", s.prompt_tokens)?;
        d.set_item("generation_tokens", s.generation_tokens)?;
        d.set_item("cache_hit_tokens", s.cache_hit_tokens)?;
        d.set_item("retractions", s.retractions)?;
        d.set_item("finished", s.finished)?;
        d.set_item("errors", s.errors)?;
        d.set_item("failed_steps", s.failed_steps)?;
        d.set_item("spec_drafts", s.spec_drafts)?;
        d.set_item("spec_draft_tokens", s.spec_draft_tokens)?;
        d.set_item("spec_accepted_tokens", s.spec_accepted_tokens)?;
        d.set_item("spec_accepted_histogram", s.spec_accepted_histogram.to_vec())?;
        d.set_item("waiting", l.waiting)?;
        d.set_item("running", l.running)?;
        d.set_item("kv_used", l.kv_used)?;
        d.set_item("kv_capacity", l.kv_capacity)?;
        d.set_item("cached_tokens", l.cached_tokens)?;
        d.set_item("evictable_tokens", l.evictable_tokens)?;
        Ok(d)
    }

    fn take_latencies<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let l = self.poison.run(py, &mut self.engine, |e| e.take_latencies())?;
        let d = PyDict::new(py);
        d.set_item("ttft_s", l.ttft_s.into_pyarray(py))?;
        d.set_item("itl_s", l.itl_s.into_pyarray(py))?;
        d.set_item("e2e_s", l.e2e_s.into_pyarray(py))?;
        d.set_item("queue_s", l.queue_s.into_pyarray(py))?;
        Ok(d)
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.engine.config().vocab_size
    }

    #[getter]
    fn kv_capacity(&self) -> usize {
        self.engine.config().kv_capacity
    }

    #[getter]
    fn kv_events_enabled(&self) -> bool {
        self.engine.config().kv_events
    }

    #[getter]
    fn kv_event_block_size(&self) -> usize {
        self.engine.config().kv_event_block_size
    }
}

/// The engine's settings as the core's `EngineConfig` has them: `defaults()` are what
/// `Engine` takes for each keyword not given, and what `ferrolm.Engine`, the server's
/// arguments and the CLI help show.
#[pyclass(module = "ferrolm._core", name = "EngineConfig", frozen, get_all)]
pub struct PyEngineConfig {
    kv_capacity: usize,
    max_running_requests: usize,
    max_prefill_tokens: usize,
    schedule_policy: &'static str,
    enable_prefix_cache: bool,
    eviction_policy: &'static str,
    new_token_ratio: f64,
    fast_lane_tokens: usize,
    max_context: usize,
    seed: u64,
    enable_kv_events: bool,
    kv_event_block_size: usize,
    speculative: bool,
    speculative_max_draft: usize,
    speculative_row_cost: f64,
    max_loras: usize,
}

#[pymethods]
impl PyEngineConfig {
    #[staticmethod]
    fn defaults() -> Self {
        let d = EngineConfig::default();
        PyEngineConfig {
            kv_capacity: d.kv_capacity,
            max_running_requests: d.max_running_requests,
            max_prefill_tokens: d.max_prefill_tokens,
            schedule_policy: d.schedule_policy.as_str(),
            enable_prefix_cache: d.enable_prefix_cache,
            eviction_policy: d.eviction_policy.name(),
            new_token_ratio: d.new_token_ratio,
            fast_lane_tokens: d.fast_lane_tokens,
            max_context: d.max_context,
            seed: d.seed,
            enable_kv_events: d.kv_events,
            kv_event_block_size: d.kv_event_block_size,
            speculative: d.speculative,
            speculative_max_draft: d.speculative_max_draft,
            speculative_row_cost: d.speculative_row_cost,
            max_loras: d.max_loras,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "EngineConfig(kv_capacity={}, max_running_requests={}, max_prefill_tokens={}, schedule_policy={:?}, \
             enable_prefix_cache={}, eviction_policy={:?}, new_token_ratio={}, fast_lane_tokens={}, \
             max_context={}, seed={}, enable_kv_events={}, kv_event_block_size={}, speculative={}, \
             speculative_max_draft={}, speculative_row_cost={}, max_loras={})",
            self.kv_capacity,
            self.max_running_requests,
            self.max_prefill_tokens,
            self.schedule_policy,
            if self.enable_prefix_cache { "True" } else { "False" },
            self.eviction_policy,
            self.new_token_ratio,
            self.fast_lane_tokens,
            self.max_context,
            self.seed,
            if self.enable_kv_events { "True" } else { "False" },
            self.kv_event_block_size,
            if self.speculative { "True" } else { "False" },
            self.speculative_max_draft,
            self.speculative_row_cost,
            self.max_loras,
        )
    }
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<PyEngineConfig>()?;
    m.add_class::<PyBatchPlan>()?;
    m.add_class::<PyThinkingBudget>()?;
    m.add_class::<PyStepOutputs>()?;
    m.add_class::<PySamplingBatch>()?;
    Ok(())
}
