//! ferrolm's HTTP front end in Rust: the OpenAI and native routes on axum/tokio, in the
//! process that runs the step loop, with no Python on the request path.
//!
//! ```text
//! HTTP threads (tokio)                       step loop (the caller's thread)
//!   parse, validate, auth, chat template,
//!   tokenize (tokenizer pool)
//!   Ingress::submit ───── columnar inbox ───► Ingress::drain(&mut Engine)   (start of a step)
//!                                             schedule → forward → commit
//!   RequestStream::next ◄── merged updates ── Egress::publish(&StepOutputs)
//!   SSE frames / JSON
//! ```
//!
//! The step loop blocks in [`Ingress::wait`] while there is no work. [`Frontend`] owns
//! the runtime; the PyO3 crate wraps it so that Python's loop runs schedule → forward →
//! commit and hands the core's outputs to [`Egress::publish`] without a Python object
//! per request.

pub mod chat_request;
pub mod egress;
pub mod errors;
pub mod field_policy;
pub mod generation;
pub mod http;
pub mod ingress;
pub mod json_body;
pub mod kv_events;
pub mod loading;
pub mod metrics;
pub mod pretokenize;
pub mod protocol;
pub mod response;
pub mod state;
pub mod structured;
pub mod tokenizer;
pub mod tools;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::serve::ListenerExt;
use ferrolm_constraint::GrammarCache;
use tokio::sync::oneshot;

pub use egress::{Egress, RequestStream, SampleUpdate};
pub use ingress::{Drained, Ingress};
pub use kv_events::{KvEventCounters, KvEventCounts};
pub use loading::Loading;
pub use state::FrontendConfig;
pub use tokenizer::{ChatTemplate, Tokenizer};

use crate::state::AppState;

/// The HTTP server, running on its own threads until [`Frontend::stop`] (or drop).
pub struct Frontend {
    pub ingress: Arc<Ingress>,
    pub egress: Arc<Egress>,
    pub kv_counters: Arc<KvEventCounters>,
    pub forward_times: Arc<metrics::ForwardTimes>,
    local_addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: Option<oneshot::Sender<()>>,
    /// The server task: it ends once the connections open at the shutdown signal closed.
    served: Option<tokio::task::JoinHandle<()>>,
}

impl Frontend {
    /// Binds `config.host:config.port` and starts serving. `grammars` is the engine's
    /// grammar cache: its vocabulary is the one the core detokenizes with and checks
    /// every request's grammar against.
    pub fn start(
        config: FrontendConfig,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        grammars: Arc<GrammarCache>,
    ) -> Result<Self, String> {
        Self::start_on(config, tokenizer, template, grammars, None)
    }

    /// As [`Frontend::start`], on the socket `loading` bound while the model loaded (its
    /// address, not `config`'s), when given.
    pub fn start_on(
        config: FrontendConfig,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        grammars: Arc<GrammarCache>,
        loading: Option<Loading>,
    ) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.http_threads.max(1))
            // the tokenizer pool: tokenizing and template rendering run here
            .max_blocking_threads(config.tokenizer_threads.max(1))
            .thread_name("ferrolm-http")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("the HTTP runtime could not start: {e}"))?;
        let ingress = Arc::new(Ingress::new());
        let egress = Arc::new(Egress::new());
        let kv_counters = Arc::new(KvEventCounters::default());
        let forward_times = Arc::new(metrics::ForwardTimes::default());
        let started_at = response::unix_now();
        let addr = format!("{}:{}", config.host, config.port);
        let grammar_threads = config.grammar_threads;
        let tools = tools::ServerTools::new(
            &config.settings,
            template.as_ref().map(|t| t.source()),
            grammars.vocab(),
        );
        let state = Arc::new(AppState {
            loras: config.loras.clone(),
            tools,
            config,
            ingress: ingress.clone(),
            egress: egress.clone(),
            tokenizer: Arc::new(tokenizer),
            template: template.map(Arc::new),
            vocab: grammars.vocab().clone(),
            grammars: structured::GrammarPool::new(grammars, grammar_threads),
            next_rid: AtomicU64::new(0),
            named: Mutex::new(HashMap::new()),
            started_at,
            histograms: Mutex::new(metrics::Histograms::new(started_at as f64)),
            kv_counters: kv_counters.clone(),
            forward_times: forward_times.clone(),
            unavailable: tokio::sync::watch::Sender::new(None),
        });
        runtime.spawn(egress.clone().pump());
        if let Some(timeout) = state.config.heartbeat_timeout_s.filter(|t| *t > 0.0) {
            runtime.spawn(watch_heartbeat(state.clone(), timeout));
        }
        let bound = loading.map(Loading::into_listener);
        let listener = runtime
            .block_on(async {
                match bound {
                    Some(l) => tokio::net::TcpListener::from_std(l),
                    None => tokio::net::TcpListener::bind(&addr).await,
                }
            })
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local_addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (tx, rx) = oneshot::channel::<()>();
        let app = http::router(state);
        // every SSE frame goes out when written (as asyncio's transports do): without it
        // a frame written while the last is unacked
        // waits for the client's (possibly delayed) ACK
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY could not be set on a connection: {e}");
            }
        });
        let served = runtime.spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::error!("the HTTP server stopped: {e}");
            }
        });
        Ok(Frontend {
            ingress,
            egress,
            kv_counters,
            forward_times,
            local_addr,
            runtime: Some(runtime),
            shutdown: Some(tx),
            served: Some(served),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, fails the requests in flight, and ends the HTTP threads (waiting
    /// at most `timeout` for open connections).
    pub fn stop(&mut self, timeout: Duration) {
        self.egress.stop_pump();
        self.ingress.stop();
        self.egress.fail_all("the engine is unavailable: the server is shutting down");
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(rt) = self.runtime.take() {
            // The requests just failed are answered (503, or a stream's error event) by
            // their handlers, on the runtime's threads: wait for the graceful shutdown to
            // see their connections close before the runtime drops its tasks, or a client
            // is cut off without a response. Not from inside a runtime, where it cannot block.
            let served = self.served.take();
            if let (Some(served), Err(_)) = (served, tokio::runtime::Handle::try_current()) {
                // the timer is made inside the runtime, whose clock it needs
                let _ = rt.block_on(async move { tokio::time::timeout(timeout, served).await });
            }
            rt.shutdown_timeout(Duration::from_millis(100));
        }
    }
}

/// The engine-heartbeat watch: while the step loop has not come round for `timeout`
/// seconds (a step stuck, a frozen loop), the server is unavailable: what waits on the
/// engine is answered 503 (and aborted, so a resumed loop frees its KV), new requests and
/// `/health` are 503, until the loop comes round again.
async fn watch_heartbeat(state: Arc<AppState>, timeout: f64) {
    let every = Duration::from_secs_f64((timeout / 4.0).clamp(0.01, 1.0));
    loop {
        tokio::time::sleep(every).await;
        if state.ingress.is_stopped() {
            return;
        }
        let silent = state.ingress.since_beat().as_secs_f64();
        let stalled = state.unavailable.borrow().is_some();
        if silent > timeout && !stalled {
            let reason = format!(
                "the engine has not answered for {silent:.1} s (frozen, or a step longer than --engine-heartbeat-timeout {timeout})"
            );
            tracing::error!(
                "{reason}; failing {} requests in flight, refusing new ones until it answers",
                state.egress.len()
            );
            state.unavailable.send_replace(Some(reason.clone()));
            state.egress.fail_all(&format!("the engine is unavailable: {reason}"));
        } else if silent <= timeout && stalled {
            tracing::warn!("the engine answers again: serving");
            state.unavailable.send_replace(None);
        }
    }
}

impl Drop for Frontend {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(1));
    }
}
