//! What every route handler shares: the settings, the ingress and egress, the tokenizer
//! and chat template, the vocabulary (token bytes for logprobs).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use ferrolm_constraint::{Grammar, Vocabulary};
use ferrolm_core::engine::Lora;
use ferrolm_core::lora::registry::{LoraRegistry, RegistryError};
use serde_json::Value;

use crate::chat_request::{self, ChatInput, ChatModel, GenerateInput, PreparedChat};
use crate::egress::{Egress, RequestStream};
use crate::errors::{ApiError, ApiResult};
use crate::ingress::Ingress;
use crate::kv_events::KvEventCounters;
use crate::metrics::{ForwardTimes, Histograms};
use crate::structured::{GrammarPool, Structured};
use crate::tokenizer::{ChatTemplate, Tokenizer};
use crate::tools::PlannedConstraint;

/// The settings the front end needs (the rest of the server's settings are shown on
/// `/server_info` from `settings`).
#[derive(Clone, Debug)]
pub struct FrontendConfig {
    pub host: String,
    pub port: u16,
    /// The id clients send as `model`.
    pub model_name: String,
    /// `--model` as given (the model card's `root`).
    pub model_path: String,
    pub api_key: Option<String>,
    pub max_request_bytes: usize,
    pub max_running_requests: usize,
    pub max_queued_requests: Option<usize>,
    pub queue_timeout_s: Option<f64>,
    pub context_length: usize,
    pub kv_capacity: usize,
    /// The most input characters one token can stand for (a cheap bound that refuses a
    /// prompt that cannot fit before it is tokenized); `None`: no bound known.
    pub chars_per_token: Option<usize>,
    /// The engine's model facts (`/get_model_info`, `/server_info`).
    pub model_info: Value,
    /// The server's settings as `/server_info` shows them (the API key only as "set").
    pub settings: Value,
    pub version: String,
    /// Threads of the HTTP runtime, and of the tokenizer pool.
    pub http_threads: usize,
    pub tokenizer_threads: usize,
    /// Threads that wait for structured-output grammars to compile.
    pub grammar_threads: usize,
    /// `--engine-heartbeat-timeout`: a step loop that has not come round for this long
    /// (a step stuck, a frozen loop) makes the server unavailable until it does; `None`:
    /// not watched.
    pub heartbeat_timeout_s: Option<f64>,
    /// The KV event stream as `/server_info` describes it (`{"enabled": false,
    /// "block_size": N}` when events are off).
    pub kv_events: Value,
    /// The LoRA adapters served beside the base model (`None`: none can be).
    pub loras: Option<Arc<LoraRegistry>>,
}

/// A request in flight by its public id (`/generate`'s rid, the OpenAI response id), for
/// `/abort_request`.
pub struct Named {
    pub stream: Arc<RequestStream>,
    pub rids: Vec<u64>,
}

pub struct AppState {
    pub config: FrontendConfig,
    /// The server's tool-call and reasoning parsers.
    pub tools: crate::tools::ServerTools,
    pub ingress: Arc<Ingress>,
    pub egress: Arc<Egress>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
    pub vocab: Arc<Vocabulary>,
    pub grammars: GrammarPool,
    pub next_rid: AtomicU64,
    pub named: Mutex<HashMap<String, Named>>,
    pub started_at: u64,
    pub histograms: Mutex<Histograms>,
    /// The KV event publisher's counters (set by the step loop's side).
    pub kv_counters: Arc<KvEventCounters>,
    /// The step loop's forward timings (noted by its commits).
    pub forward_times: Arc<ForwardTimes>,
    /// `config.loras`.
    pub loras: Option<Arc<LoraRegistry>>,
    /// Why the engine cannot serve now (its step loop stopped coming round), or `None`.
    pub unavailable: tokio::sync::watch::Sender<Option<String>>,
}

impl AppState {
    /// The longest prompt the core can take: shorter than the context, and room in the
    /// KV pool for it and one more token.
    pub fn max_prompt_tokens(&self) -> usize {
        self.config.context_length.min(self.config.kv_capacity).saturating_sub(1)
    }

    /// `model` may be omitted; if given it must be the served one or a loaded LoRA
    /// adapter's name (a 404 otherwise, as OpenAI and vLLM answer).
    pub fn check_model(&self, requested: Option<&str>) -> ApiResult<()> {
        match requested {
            Some(m) if m != self.config.model_name && !self.loras.as_ref().is_some_and(|r| r.contains(m)) => {
                Err(self.model_not_found(m, "model"))
            }
            _ => Ok(()),
        }
    }

    fn model_not_found(&self, name: &str, param: &str) -> ApiError {
        let adapters = match &self.loras {
            Some(r) => {
                let names: Vec<String> = r.list().into_iter().map(|l| format!("{:?}", l.name)).collect();
                if names.is_empty() {
                    String::new()
                } else {
                    format!(" (or a LoRA adapter: {})", names.join(", "))
                }
            }
            None => String::new(),
        };
        ApiError::new(
            404,
            format!(
                "{param}: {name:?} is not served here; the model is {:?}{adapters}",
                self.config.model_name
            ),
        )
        .with_param(Some(param.to_string()))
        .with_code("model_not_found")
    }

    /// The LoRA adapter a request runs with: `lora_path` (SGLang's field: an adapter's
    /// name, or the folder it was loaded from) or else a `model` that is not the base
    /// model's name (OpenAI's and vLLM's way); `None`: the base model. An adapter not
    /// loaded is a 404 naming it. Its weights are read again, off the HTTP threads, if
    /// they were evicted.
    pub async fn lora_for(&self, model: Option<&str>, lora_path: Option<&str>) -> ApiResult<Option<Lora>> {
        let (name, param) = match (lora_path, model) {
            (Some(p), _) => (p, "lora_path"),
            (None, Some(m)) if m != self.config.model_name => (m, "model"),
            _ => return Ok(None),
        };
        let Some(registry) = self.loras.clone() else { return Err(self.model_not_found(name, param)) };
        let wanted = name.to_string();
        let acquired = tokio::task::spawn_blocking(move || registry.acquire(&wanted))
            .await
            .map_err(|e| ApiError::new(500, format!("reading the LoRA adapter failed: {e}")))?;
        match acquired {
            Ok(lora) => Ok(Some(lora)),
            Err(RegistryError::NotFound(_)) => Err(self.model_not_found(name, param)),
            Err(e) => Err(lora_error(e, param)),
        }
    }

    /// A text too long for the context even at the fewest tokens it could have is
    /// refused without tokenizing it.
    pub fn check_text_length(&self, text: &str, param: &str) -> ApiResult<()> {
        let Some(per_token) = self.config.chars_per_token else { return Ok(()) };
        let chars = text.chars().count();
        let at_least = chars.div_ceil(per_token.max(1));
        if at_least > self.max_prompt_tokens() {
            return Err(ApiError::bad_request(
                format!(
                    "{param}: the prompt has at least {at_least} tokens ({chars} characters); at most {} fit the context and the KV pool",
                    self.max_prompt_tokens()
                ),
                param,
            ));
        }
        Ok(())
    }

    /// A budget beyond the context can never be met.
    pub fn check_max_tokens(&self, max_tokens: u64, param: &str) -> ApiResult<()> {
        if max_tokens > self.config.context_length as u64 {
            return Err(ApiError::bad_request(
                format!(
                    "{param}: {max_tokens} is more than the context length ({})",
                    self.config.context_length
                ),
                param,
            ));
        }
        Ok(())
    }

    /// Token ids of a text, on the tokenizer pool (never on an HTTP thread: a megabyte
    /// prompt delays no other request).
    pub async fn encode(
        self: &Arc<Self>,
        text: String,
        param: &str,
        add_special_tokens: bool,
    ) -> ApiResult<Vec<u32>> {
        self.check_text_length(&text, param)?;
        let state = self.clone();
        let ids = tokio::task::spawn_blocking(move || state.tokenizer.encode(&text, add_special_tokens))
            .await
            .map_err(|e| ApiError::new(500, format!("tokenizing failed: {e}")))?;
        ids.map_err(|m| ApiError::bad_request(format!("{param}: {m}"), param))
    }

    /// A chat rendered with the template, planned and tokenized by the request core
    /// ([`chat_request::prepare_chat`]), on the tokenizer pool.
    pub async fn prepare_chat(
        self: &Arc<Self>,
        input: ChatInput,
        options: chat_request::ChatOptions,
    ) -> ApiResult<PreparedChat> {
        self.prepare(move |state, model| {
            chat_request::prepare_chat_with(input, options, model, &|text| {
                state.check_text_length(text, "messages")
            })
        })
        .await
    }

    /// A `/generate` planned and tokenized by the request core
    /// ([`chat_request::prepare_generate`]), on the tokenizer pool.
    pub async fn prepare_generate(self: &Arc<Self>, input: GenerateInput) -> ApiResult<PreparedChat> {
        self.prepare(move |state, model| {
            chat_request::prepare_generate(input, model, &|text| state.check_text_length(text, "text"))
        })
        .await
    }

    async fn prepare(
        self: &Arc<Self>,
        work: impl FnOnce(&AppState, &ChatModel<'_>) -> ApiResult<PreparedChat> + Send + 'static,
    ) -> ApiResult<PreparedChat> {
        let state = self.clone();
        tokio::task::spawn_blocking(move || {
            let model = ChatModel {
                template: state.template.as_deref(),
                tokenizer: &state.tokenizer,
                tools: &state.tools,
            };
            work(&state, &model)
        })
        .await
        .map_err(|e| ApiError::new(500, format!("preparing the request failed: {e}")))?
    }

    /// The grammar of a plan's constraint, compiled in the engine's grammar cache on the
    /// grammar pool (its errors name the request field at fault).
    pub async fn planned_grammar(&self, c: &PlannedConstraint) -> ApiResult<Arc<Grammar>> {
        let (grammar, seconds) = self.grammars.compile_planned(c).await?;
        self.histograms.lock().unwrap().observe_grammar(seconds);
        Ok(grammar)
    }

    /// Why the engine cannot serve now, if it cannot.
    pub fn unavailable(&self) -> Option<String> {
        self.unavailable.borrow().clone()
    }

    /// The 503 of a request the engine cannot serve now, if it cannot.
    pub fn check_available(&self) -> ApiResult<()> {
        match self.unavailable() {
            Some(reason) => Err(unavailable_error(&reason)),
            None => Ok(()),
        }
    }

    /// Resolves with the reason once the engine becomes unavailable (never, if it stays).
    pub async fn until_unavailable(&self) -> ApiError {
        let mut watch = self.unavailable.subscribe();
        // the reason is copied out at once: a watch::Ref holds the channel's lock
        let reason = watch.wait_for(Option::is_some).await.ok().and_then(|r| r.clone());
        match reason {
            Some(reason) => unavailable_error(&reason),
            None => std::future::pending().await,
        }
    }

    /// The compiled grammar of a request's structured output (off the HTTP threads and
    /// the step loop; its wait reaches `ferrolm:grammar_compile_seconds`).
    pub async fn grammar(&self, asked: Option<&Structured>) -> ApiResult<Option<Arc<Grammar>>> {
        let Some(asked) = asked else { return Ok(None) };
        let (grammar, seconds) = self.grammars.compile(asked).await?;
        self.histograms.lock().unwrap().observe_grammar(seconds);
        Ok(Some(grammar))
    }
}

/// A registry refusal as an HTTP error: an unknown adapter is a 404; a bad one a 400
/// naming its file.
pub fn lora_error(e: RegistryError, param: &str) -> ApiError {
    match e {
        RegistryError::NotFound(name) => {
            ApiError::new(404, format!("{param}: the LoRA adapter {name:?} is not loaded"))
                .with_param(Some(param.to_string()))
                .with_code("model_not_found")
        }
        RegistryError::BadName(m) => ApiError::bad_request(m, param),
        RegistryError::Load(l) => ApiError::bad_request(format!("{}: {}", l.file, l.message), param),
    }
}

pub fn unavailable_error(reason: &str) -> ApiError {
    ApiError::new(503, format!("the engine is unavailable: {reason}")).with_code("engine_unavailable")
}
