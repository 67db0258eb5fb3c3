//! `Frontend`: the Rust HTTP front end (`ferrolm-frontend`) in the process that runs the
//! step loop. Behaviour is documented in `python/ferrolm/_core.pyi`.
//!
//! The HTTP threads never take the GIL. The loop's calls take the core engine from
//! `Engine` and release the GIL: `drain` moves queued requests into the core, and
//! `commit`/`commit_tokens`/`fail_step`/`take_outputs` hand the step's outputs straight to
//! the request streams, so no Python object is made per request; they return only the
//! rids that finished. The commits also take the step loop's timing of the forward, for
//! `/metrics`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrolm_core::engine::StepOutputs;
use ferrolm_frontend::metrics::ForwardTimes;
use ferrolm_frontend::{
    ChatTemplate, Egress, Frontend, FrontendConfig, Ingress, KvEventCounters, KvEventCounts, Loading,
    Tokenizer,
};
use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;

use crate::constraint::PyVocabulary;
use crate::convert::logits_rows;
use crate::engine::{Draws, PyBatchPlan, PyEngine};
use crate::errors;

#[pyclass(module = "ferrolm._core", name = "Frontend", frozen)]
pub struct PyFrontend {
    ingress: Arc<Ingress>,
    egress: Arc<Egress>,
    kv_counters: Arc<KvEventCounters>,
    forward_times: Arc<ForwardTimes>,
    port: u16,
    server: Mutex<Option<Frontend>>,
}

type Finished<'py> = Bound<'py, PyArray1<u64>>;

impl PyFrontend {
    fn note_forward(&self, seconds: Option<f64>, cpu_seconds: Option<f64>) {
        if let Some(seconds) = seconds {
            self.forward_times.note(seconds, cpu_seconds.unwrap_or(0.0));
        }
    }

    /// Runs `step` on the core engine with the GIL released (a panic poisons the engine,
    /// as its own calls do), publishes the outputs, returns the finished rids.
    fn publish<'py>(
        &self,
        py: Python<'py>,
        engine: &Bound<'py, PyEngine>,
        step: impl FnOnce(
                &mut ferrolm_core::engine::Engine,
            ) -> Result<StepOutputs, ferrolm_core::engine::EngineError>
            + Send,
    ) -> PyResult<Finished<'py>> {
        let mut e = engine.borrow_mut();
        let e = &mut *e;
        let egress = &*self.egress;
        let finished = e
            .poison
            .run(py, &mut e.engine, |core| step(core).map(|out| egress.publish(&out)))?
            .map_err(|err| errors::engine(py, err))?;
        Ok(finished.into_pyarray(py))
    }
}

#[pymethods]
impl PyFrontend {
    #[new]
    #[pyo3(signature = (
        vocabulary, tokenizer_json, *, host, port, model_name, model_path, context_length, kv_capacity,
        max_running_requests, max_request_bytes, version, model_info_json = "{}", settings_json = "{}",
        api_key = None, chat_template = None, bos_token = None, eos_token = None, max_queued_requests = None,
        queue_timeout = None, chars_per_token = None, http_threads = 2, tokenizer_threads = 2,
        grammar_threads = 2, engine_heartbeat_timeout = 0.0, loading = None, kv_events_json = None,
        lora_registry = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        vocabulary: PyRef<'_, PyVocabulary>,
        tokenizer_json: PathBuf,
        host: String,
        port: u16,
        model_name: String,
        model_path: String,
        context_length: usize,
        kv_capacity: usize,
        max_running_requests: usize,
        max_request_bytes: usize,
        version: String,
        model_info_json: &str,
        settings_json: &str,
        api_key: Option<String>,
        chat_template: Option<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
        max_queued_requests: Option<usize>,
        queue_timeout: Option<f64>,
        chars_per_token: Option<usize>,
        http_threads: usize,
        tokenizer_threads: usize,
        grammar_threads: usize,
        engine_heartbeat_timeout: f64,
        loading: Option<PyRef<'_, PyLoading>>,
        kv_events_json: Option<&str>,
        lora_registry: Option<PyRef<'_, crate::lora::PyLoraRegistry>>,
    ) -> PyResult<Self> {
        let loading = match loading {
            None => None,
            Some(l) => Some(l.inner.lock().unwrap().take().ok_or_else(|| {
                errors::invalid_field(
                    py,
                    "loading",
                    "loading: its port was already handed to a Frontend".into(),
                )
            })?),
        };
        let json = |field: &str, text: &str| {
            serde_json::from_str(text).map_err(|e| errors::invalid_field(py, field, format!("{field}: {e}")))
        };
        let config = FrontendConfig {
            host,
            port,
            model_name,
            model_path,
            api_key,
            max_request_bytes,
            max_running_requests,
            max_queued_requests,
            queue_timeout_s: queue_timeout,
            context_length,
            kv_capacity,
            chars_per_token,
            model_info: json("model_info_json", model_info_json)?,
            settings: json("settings_json", settings_json)?,
            version,
            http_threads,
            tokenizer_threads,
            grammar_threads,
            heartbeat_timeout_s: (engine_heartbeat_timeout > 0.0).then_some(engine_heartbeat_timeout),
            kv_events: match kv_events_json {
                Some(text) => json("kv_events_json", text)?,
                None => serde_json::json!({"enabled": false, "block_size": 16}),
            },
            loras: lora_registry.map(|r| r.registry.clone()),
        };
        let grammars = vocabulary.cache().clone();
        let started = py.detach(move || -> Result<Frontend, String> {
            let tokenizer = Tokenizer::from_file(&tokenizer_json)?;
            let template = chat_template
                .map(|t| ChatTemplate::new(&t, bos_token.as_deref(), eos_token.as_deref()))
                .transpose()?;
            Frontend::start_on(config, tokenizer, template, grammars, loading)
        });
        let server = started.map_err(|m| errors::invalid_input(py, m))?;
        Ok(PyFrontend {
            ingress: server.ingress.clone(),
            egress: server.egress.clone(),
            kv_counters: server.kv_counters.clone(),
            forward_times: server.forward_times.clone(),
            port: server.local_addr().port(),
            server: Mutex::new(Some(server)),
        })
    }

    /// The port it listens on (the one asked for, or the one the system gave for 0).
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Samples submitted and not finished.
    #[getter]
    fn in_flight(&self) -> usize {
        self.egress.len()
    }

    /// The KV event publisher's counters, as `/server_info` and `/metrics` show them.
    fn note_kv_events(&self, queued: u64, sent: u64, dropped: u64, replays: u64, late: u64) {
        self.kv_counters.set(KvEventCounts { queued, sent, dropped, replays, late });
    }

    fn wait(&self, py: Python<'_>, timeout: f64) -> bool {
        let timeout = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        let ingress = &*self.ingress;
        py.detach(|| ingress.wait(timeout))
    }

    /// Moves what the HTTP threads queued into the core; the number of prompts taken.
    fn drain(&self, py: Python<'_>, engine: &Bound<'_, PyEngine>) -> PyResult<usize> {
        let mut e = engine.borrow_mut();
        let e = &mut *e;
        let ingress = &*self.ingress;
        let drained = e.poison.run(py, &mut e.engine, |core| ingress.drain(core))?;
        Ok(drained.submitted)
    }

    /// `drain`, then the core's `schedule` in the same call (one release of the GIL):
    /// `None` when the core has no work.
    fn next_plan(&self, py: Python<'_>, engine: &Bound<'_, PyEngine>) -> PyResult<Option<PyBatchPlan>> {
        let mut e = engine.borrow_mut();
        let e = &mut *e;
        let ingress = &*self.ingress;
        let plan = e
            .poison
            .run(py, &mut e.engine, |core| {
                ingress.drain(core);
                if core.has_work() {
                    core.schedule().map(Some)
                } else {
                    Ok(None)
                }
            })?
            .map_err(|err| errors::engine(py, err))?;
        Ok(plan.map(|p| PyBatchPlan::new(py, p)))
    }

    /// `forward_s`, `forward_cpu_s`: the step's forward as the loop timed it (wall, and
    /// its own thread's CPU), for `/metrics`; passed here rather than in a call of their
    /// own, to keep the step at two calls into Rust.
    #[pyo3(signature = (engine, logits, forward_s = None, forward_cpu_s = None))]
    fn commit<'py>(
        &self,
        py: Python<'py>,
        engine: &Bound<'py, PyEngine>,
        logits: &Bound<'py, PyAny>,
        forward_s: Option<f64>,
        forward_cpu_s: Option<f64>,
    ) -> PyResult<Finished<'py>> {
        self.note_forward(forward_s, forward_cpu_s);
        let (mut rows, width) = logits_rows(logits)?;
        let slice = rows.as_slice_mut().expect("C-contiguous: logits_rows checked or copied it");
        self.publish(py, engine, move |core| core.commit(slice, width))
    }

    /// `Engine.commit_tokens` (ids drawn on the runner's device, with their logprobs where
    /// asked for), the outputs handed to the streams; the forward's timing as in `commit`.
    #[pyo3(signature = (
        engine, tokens, *, logprobs = None, top_ids = None, top_logprobs = None, forward_s = None,
        forward_cpu_s = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn commit_tokens<'py>(
        &self,
        py: Python<'py>,
        engine: &Bound<'py, PyEngine>,
        tokens: &Bound<'py, PyAny>,
        logprobs: Option<&Bound<'py, PyAny>>,
        top_ids: Option<&Bound<'py, PyAny>>,
        top_logprobs: Option<&Bound<'py, PyAny>>,
        forward_s: Option<f64>,
        forward_cpu_s: Option<f64>,
    ) -> PyResult<Finished<'py>> {
        self.note_forward(forward_s, forward_cpu_s);
        let draws = Draws::read(tokens, logprobs, top_ids, top_logprobs)?;
        self.publish(py, engine, move |core| core.commit_drawn(&draws.as_device()))
    }

    fn fail_step<'py>(
        &self,
        py: Python<'py>,
        engine: &Bound<'py, PyEngine>,
        message: &str,
    ) -> PyResult<Finished<'py>> {
        let message = message.to_string();
        self.publish(py, engine, move |core| Ok(core.fail_step(&message)))
    }

    fn take_outputs<'py>(&self, py: Python<'py>, engine: &Bound<'py, PyEngine>) -> PyResult<Finished<'py>> {
        self.publish(py, engine, |core| Ok(core.take_outputs()))
    }

    #[pyo3(signature = (timeout = 5.0))]
    fn stop(&self, py: Python<'_>, timeout: f64) {
        let server = self.server.lock().unwrap().take();
        if let Some(mut server) = server {
            py.detach(move || server.stop(Duration::from_secs_f64(timeout.clamp(0.0, 60.0))));
        }
    }
}

/// The port bound while the model loads: every route answers 503 ("the engine is
/// starting") until a `Frontend` takes the port over (`loading=`).
#[pyclass(module = "ferrolm._core", name = "FrontendLoading", frozen)]
pub struct PyLoading {
    inner: Mutex<Option<Loading>>,
    port: u16,
}

#[pymethods]
impl PyLoading {
    #[new]
    fn new(py: Python<'_>, host: String, port: u16) -> PyResult<Self> {
        let loading =
            py.detach(move || Loading::bind(&host, port)).map_err(|m| errors::invalid_input(py, m))?;
        let port = loading.local_addr().port();
        Ok(PyLoading { inner: Mutex::new(Some(loading)), port })
    }

    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Stops answering and frees the port (when no `Frontend` took it over).
    fn stop(&self, py: Python<'_>) {
        let loading = self.inner.lock().unwrap().take();
        py.detach(move || drop(loading));
    }
}

/// Token ids of `texts` as the Rust front end tokenizes them (`tokenizer.json` with the
/// hand-written pre-tokenizer split where it applies), for comparing with the `tokenizers`
/// package; and whether the hand-written split ran.
#[pyfunction]
#[pyo3(signature = (tokenizer_json, texts, *, add_special_tokens = false))]
fn frontend_encode(
    py: Python<'_>,
    tokenizer_json: PathBuf,
    texts: Vec<String>,
    add_special_tokens: bool,
) -> PyResult<(Vec<Vec<u32>>, bool)> {
    let tokenizer = Tokenizer::from_file(&tokenizer_json).map_err(|m| errors::invalid_input(py, m))?;
    let ids = py
        .detach(|| {
            texts.iter().map(|t| tokenizer.encode(t, add_special_tokens)).collect::<Result<Vec<_>, _>>()
        })
        .map_err(|m| errors::invalid_input(py, m))?;
    Ok((ids, tokenizer.fast_pre_tokenizer()))
}

pub fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(frontend_encode, m)?)?;
    m.add_class::<PyFrontend>()?;
    m.add_class::<PyLoading>()?;
    Ok(())
}
