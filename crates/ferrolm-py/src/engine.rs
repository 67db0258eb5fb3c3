//! `Engine`, `BatchPlan`, `StepOutputs`: the engine core's step API. Behaviour and errors
//! are documented in `python/ferrolm/_core.pyi`.

use std::collections::HashMap;

use ferrolm_core::detok::{StopConditions, StopReason};
use ferrolm_core::engine::{
    BatchPlan, Constraint, Engine, EngineConfig, FinishReason, RequestParams, StepOutputs,
};
use ferrolm_core::radix::EvictionPolicy;
use ferrolm_core::sampling::SamplingParams;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::{ids, BlockSize};
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

fn u32_array(py: Python<'_>, v: Vec<u32>) -> Py<PyArray1<i32>> {
    v.into_iter().map(|x| x as i32).collect::<Vec<i32>>().into_pyarray(py).unbind()
}

#[pyclass(module = "ferrolm._core", name = "BatchPlan", frozen, get_all)]
pub struct PyBatchPlan {
    rids: Py<PyArray1<u64>>,
    input_ids: Py<PyArray1<i32>>,
    positions: Py<PyArray1<i32>>,
    out_slots: Py<PyArray1<i32>>,
    qo_offsets: Py<PyArray1<i32>>,
    kv_slots: Py<PyArray1<i32>>,
    kv_offsets: Py<PyArray1<i32>>,
    samples: Py<PyArray1<bool>>,
    is_prefill: Py<PyArray1<bool>>,
    num_requests: usize,
    num_tokens: usize,
}

impl PyBatchPlan {
    fn new(py: Python<'_>, p: BatchPlan) -> Self {
        PyBatchPlan {
            num_requests: p.num_requests(),
            num_tokens: p.num_tokens(),
            rids: p.rids.into_pyarray(py).unbind(),
            input_ids: u32_array(py, p.input_ids),
            positions: u32_array(py, p.positions),
            out_slots: u32_array(py, p.out_slots),
            qo_offsets: u32_array(py, p.qo_offsets),
            kv_slots: u32_array(py, p.kv_slots),
            kv_offsets: u32_array(py, p.kv_offsets),
            samples: p.samples.into_pyarray(py).unbind(),
            is_prefill: p.is_prefill.into_pyarray(py).unbind(),
        }
    }
}

#[pymethods]
impl PyBatchPlan {
    fn __len__(&self) -> usize {
        self.num_requests
    }
    fn __repr__(&self) -> String {
        format!("BatchPlan(num_requests={}, num_tokens={})", self.num_requests, self.num_tokens)
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
        // EngineConfig::DEFAULT_*, written out so that Python shows them
        vocabulary, *, kv_capacity = 32768,
        max_running_requests = 64, max_prefill_tokens = 2048, schedule_policy = "fcfs",
        enable_prefix_cache = true, eviction_policy = "lru", new_token_ratio = 0.3, fast_lane_tokens = 32,
        max_context = 32768, seed = 0, enable_kv_events = false, kv_event_block_size = BlockSize(16),
    ),
    // the range-checked block size shows as its plain default
    text_signature = "(vocabulary, *, kv_capacity=32768, max_running_requests=64, max_prefill_tokens=2048, \
        schedule_policy='fcfs', enable_prefix_cache=True, eviction_policy='lru', new_token_ratio=0.3, \
        fast_lane_tokens=32, max_context=32768, seed=0, enable_kv_events=False, kv_event_block_size=16)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        vocabulary: PyRef<'_, crate::constraint::PyVocabulary>,
        kv_capacity: usize,
        max_running_requests: usize,
        max_prefill_tokens: usize,
        schedule_policy: &str,
        enable_prefix_cache: bool,
        eviction_policy: &str,
        new_token_ratio: f64,
        fast_lane_tokens: usize,
        max_context: usize,
        seed: u64,
        enable_kv_events: bool,
        kv_event_block_size: BlockSize,
    ) -> PyResult<Self> {
        let bad = |field: &'static str, m: String| errors::invalid_field(py, field, format!("{field}: {m}"));
        let schedule_policy = schedule_policy.parse().map_err(|m| bad("schedule_policy", m))?;
        let eviction_policy: EvictionPolicy = eviction_policy
            .parse()
            .map_err(|e: ferrolm_core::radix::policy::UnknownPolicy| bad("eviction_policy", e.to_string()))?;
        let config = EngineConfig {
            kv_capacity,
            max_running_requests,
            max_prefill_tokens,
            schedule_policy,
            enable_prefix_cache,
            eviction_policy,
            new_token_ratio,
            fast_lane_tokens,
            max_context,
            vocab_size: vocabulary.vocab().size(),
            eos_token_ids: vocabulary.vocab().eos_ids().to_vec(),
            seed,
            kv_events: enable_kv_events,
            kv_event_block_size: kv_event_block_size.0,
        };
        // the engine detokenizes with it; request grammars must be compiled from it
        let engine =
            Engine::new(config, vocabulary.vocab().clone()).map_err(|m| errors::invalid_input(py, m))?;
        Ok(PyEngine { engine, poison: Poison::default() })
    }

    /// See `_core.pyi`.
    #[pyo3(signature = (
        rid, input_ids, *, max_new_tokens = 16, min_new_tokens = 0, temperature = 1.0, top_k = 0, top_p = 1.0,
        min_p = 0.0, repetition_penalty = 1.0, frequency_penalty = 0.0, presence_penalty = 0.0,
        logit_bias = None, seed = None, logprobs = false, top_logprobs = 0, stop = Vec::new(),
        stop_token_ids = Vec::new(), include_stop_str = false, skip_special_tokens = true, ignore_eos = false,
        priority = 0, namespace = None, queue_timeout = None, allowed_token_ids = None, grammar = None,
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
        let array = match logits.cast::<PyArray2<f32>>() {
            Ok(a) if a.is_c_contiguous() && a.try_readwrite().is_ok() => a.clone(),
            _ => {
                // anything else array-like: one conversion to a C-contiguous float32 copy
                let np = py.import("numpy")?;
                let copy = np.call_method1("array", (logits, "float32"))?;
                copy.cast_into::<PyArray2<f32>>().map_err(|_| {
                    errors::invalid_field(
                        py,
                        "logits",
                        "logits must be a 2-D array [num_requests, vocab]".to_string(),
                    )
                })?
            }
        };
        let width = array.shape()[1];
        let mut rw = array.readwrite();
        let slice = rw
            .as_slice_mut()
            .map_err(|_| errors::invalid_field(py, "logits", "logits must be contiguous".into()))?;
        let out = self
            .poison
            .run(py, (&mut self.engine, slice), |(e, s)| e.commit(s, width))?
            .map_err(|e| errors::engine(py, e))?;
        PyStepOutputs::new(py, out)
    }

    fn commit_tokens(&mut self, py: Python<'_>, tokens: &Bound<'_, PyAny>) -> PyResult<PyStepOutputs> {
        let tokens = ids(tokens, "tokens", u32::MAX)?;
        let tokens = tokens.as_slice();
        let out = self
            .poison
            .run(py, &mut self.engine, |e| e.commit_tokens(tokens))?
            .map_err(|e| errors::engine(py, e))?;
        PyStepOutputs::new(py, out)
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

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<PyBatchPlan>()?;
    m.add_class::<PyStepOutputs>()?;
    Ok(())
}
