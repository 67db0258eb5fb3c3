//! The request fields of the ecosystem, as data: every field that OpenAI's, vLLM's or
//! SGLang's request schemas define for chat, completions and `/generate` (its
//! `sampling_params` too), with the schemas it comes from and what ferrolm does with it.
//!
//! Routers re-serialize a request with their own typed schema and so add fields at their
//! defaults (SGLang's Model Gateway adds `no_stop_trim`, `continue_final_message`,
//! `return_hidden_states`...; vllm-router `echo`, `include_reasoning`...). The rule:
//! - [`Rule::Read`]: the route's typed request reads the field (it is honoured, or refused
//!   by that route's own checks, naming it);
//! - [`Rule::Ignored`]: bookkeeping that changes nothing here (`user`, `log_metrics`), any
//!   value accepted;
//! - [`Rule::AtDefault`]: accepted at its default value(s) (and as `null`), which ask for
//!   nothing ferrolm does not do; any other value is a 400 naming the field and the value,
//!   with the reason;
//! - a name no schema defines stays a 400 (`unknown field`).
//!
//! A test checks that the `Read` entries of each route are exactly the fields its typed
//! request reads, so this list and the structs cannot drift.

use serde_json::Value;

/// Where a field is defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schema {
    OpenAI,
    Vllm,
    Sglang,
    /// llama.cpp's server (`cache_prompt`, `grammar`), whose clients ferrolm also serves.
    LlamaCpp,
    /// ferrolm's own (`speculative`).
    Ferrolm,
}

impl Schema {
    pub fn name(self) -> &'static str {
        match self {
            Schema::OpenAI => "OpenAI",
            Schema::Vllm => "vLLM",
            Schema::Sglang => "SGLang",
            Schema::LlamaCpp => "llama.cpp",
            Schema::Ferrolm => "ferrolm",
        }
    }
}

/// The request object a field belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completion,
    /// `POST /generate`, the top level
    Generate,
    /// `POST /generate`, inside `sampling_params`
    Sampling,
}

/// A default value as JSON.
#[derive(Clone, Copy, Debug)]
pub enum Val {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(&'static str),
    EmptyList,
    EmptyObject,
}

impl Val {
    fn matches(self, v: &Value) -> bool {
        match (self, v) {
            (Val::Bool(b), Value::Bool(x)) => b == *x,
            (Val::Int(i), Value::Number(n)) => n.as_i64() == Some(i) || n.as_f64() == Some(i as f64),
            (Val::Float(f), Value::Number(n)) => n.as_f64() == Some(f),
            (Val::Str(s), Value::String(x)) => s == x,
            (Val::EmptyList, Value::Array(a)) => a.is_empty(),
            (Val::EmptyObject, Value::Object(o)) => o.is_empty(),
            _ => false,
        }
    }

    fn show(self) -> String {
        match self {
            Val::Bool(b) => b.to_string(),
            Val::Int(i) => i.to_string(),
            Val::Float(f) => format!("{f:?}"),
            Val::Str(s) => format!("{s:?}"),
            Val::EmptyList => "[]".into(),
            Val::EmptyObject => "{}".into(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Rule {
    Read,
    Ignored,
    /// The values accepted besides `null`, and why another is refused.
    AtDefault(&'static [Val], &'static str),
}

#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub name: &'static str,
    pub routes: &'static [Route],
    pub from: &'static [Schema],
    pub rule: Rule,
}

use Route::{Chat as C, Completion as P, Generate as G, Sampling as S};
use Rule::{AtDefault, Ignored, Read};
use Schema::{Ferrolm as FE, LlamaCpp as LC, OpenAI as O, Sglang as L, Vllm as V};

const CP: &[Route] = &[C, P];
const F: &[Val] = &[Val::Bool(false)];
const T: &[Val] = &[Val::Bool(true)];
const NULL: &[Val] = &[];
const OVL: &[Schema] = &[O, V, L];
const VL: &[Schema] = &[V, L];

const fn f(name: &'static str, routes: &'static [Route], from: &'static [Schema], rule: Rule) -> Field {
    Field { name, routes, from, rule }
}

/// Every field known, per route.
pub static FIELDS: &[Field] = &[
    // ---- chat and completions: read ----
    f("model", &[C, P, G], OVL, Read),
    f("n", CP, OVL, Read),
    f("temperature", CP, OVL, Read),
    f("top_p", CP, OVL, Read),
    f("stop", CP, OVL, Read),
    f("seed", CP, OVL, Read),
    f("logit_bias", CP, OVL, Read),
    f("frequency_penalty", CP, OVL, Read),
    f("presence_penalty", CP, OVL, Read),
    f("stream", &[C, P, G], OVL, Read),
    f("stream_options", CP, OVL, Read),
    f("max_tokens", CP, OVL, Read),
    f("top_k", CP, VL, Read),
    f("min_p", CP, VL, Read),
    f("repetition_penalty", CP, VL, Read),
    f("ignore_eos", CP, VL, Read),
    f("min_tokens", CP, VL, Read),
    f("stop_token_ids", CP, VL, Read),
    f("skip_special_tokens", CP, VL, Read),
    f("include_stop_str_in_output", CP, &[V], Read),
    f("no_stop_trim", CP, &[L], Read),
    f("priority", &[C, P, G], VL, Read),
    f("cache_salt", &[C, P, G], VL, Read),
    f("response_format", CP, OVL, Read),
    f("regex", CP, &[L], Read),
    f("json_schema", CP, &[L], Read),
    f("ebnf", CP, &[L], Read),
    f("guided_json", CP, &[V], Read),
    f("guided_regex", CP, &[V], Read),
    f("guided_choice", CP, &[V], Read),
    f("guided_grammar", CP, &[V], Read),
    f("grammar", CP, &[LC], Read),
    f("user", CP, OVL, Read),
    f("cache_prompt", CP, &[LC], Read),
    f("speculative", CP, &[FE], Read),
    // chat only
    f("messages", &[C], OVL, Read),
    f("max_completion_tokens", &[C], OVL, Read),
    f("logprobs", CP, OVL, Read),
    f("top_logprobs", &[C], OVL, Read),
    f("tools", &[C, G], OVL, Read),
    f("tool_choice", &[C, G], OVL, Read),
    f("parallel_tool_calls", &[C, G], &[O, V, L], Read),
    f("chat_template_kwargs", &[C], VL, Read),
    f("add_generation_prompt", &[C], &[V], Read),
    f("continue_final_message", &[C], VL, Read),
    f("separate_reasoning", &[C, G], &[L], Read),
    f("include_reasoning", &[C], &[V], Read),
    f("stream_reasoning", &[C], &[L], Read),
    f("echo", &[C], &[V], Read),
    f("thinking_token_budget", &[C], &[V], Read),
    f("reasoning_effort", &[C], OVL, Read),
    // The detokenizer writes each token's bytes, an added token as its content, with
    // nothing between two tokens. vLLM's `false` asks that an added token after an added
    // token be written as its content with no space before it; with the decoders of the
    // tokenizers read here (ByteLevel, Metaspace/byte fallback; others are refused) the
    // Hugging Face decoder puts none there either, so both values give the same text.
    f("spaces_between_special_tokens", CP, &[V], Read),
    // completions only
    f("prompt", &[P], OVL, Read),
    f("echo", &[P], OVL, Read),
    f("suffix", &[P], OVL, Read),
    f("best_of", &[P], &[O, V], Read),
    // ---- chat and completions: bookkeeping ----
    f("safety_identifier", &[C], &[O], Ignored),
    f("store", &[C], &[O], Ignored),
    f("metadata", &[C], &[O], Ignored),
    f("service_tier", &[C], &[O], Ignored),
    f("prompt_cache_key", &[C], &[O], Ignored),
    f("prompt_cache_retention", &[C], &[O], Ignored),
    f("request_id", CP, &[V], Ignored),
    f("rid", CP, &[L], Ignored),
    // ---- chat and completions: at their defaults ----
    f("return_hidden_states", &[C, P, G], &[L], AtDefault(F, "hidden states are not returned")),
    f("add_special_tokens", &[C], &[V], AtDefault(F, "the chat template writes the special tokens")),
    f(
        "add_special_tokens",
        &[P],
        &[V],
        AtDefault(T, "a text prompt is always encoded with the tokenizer's special tokens"),
    ),
    f("use_beam_search", CP, &[V], AtDefault(F, "beam search is not supported")),
    f("length_penalty", CP, &[V], AtDefault(&[Val::Float(1.0)], "beam search is not supported")),
    f(
        "truncate_prompt_tokens",
        CP,
        &[V],
        AtDefault(NULL, "prompts are not truncated; a prompt over the context is refused"),
    ),
    f("prompt_logprobs", CP, &[V], AtDefault(NULL, "prompt log-probabilities are not returned")),
    f("allowed_token_ids", CP, &[V], AtDefault(NULL, "use logit_bias")),
    f("bad_words", CP, &[V], AtDefault(&[Val::EmptyList], "use logit_bias")),
    f(
        "logits_processors",
        CP,
        &[V],
        AtDefault(&[Val::EmptyList], "custom logits processors are not supported"),
    ),
    f("return_tokens_as_token_ids", CP, &[V], AtDefault(F, "tokens are returned as text")),
    f("return_token_ids", CP, VL, AtDefault(F, "use /generate for token ids")),
    f(
        "return_prompt_token_ids",
        &[C],
        &[L],
        AtDefault(F, "use /v1/chat/completions/render for the prompt's ids"),
    ),
    f("return_meta_info", &[C], &[L], AtDefault(F, "use /generate for meta_info")),
    f(
        "return_cached_tokens_details",
        CP,
        &[L],
        AtDefault(F, "usage.prompt_tokens_details.cached_tokens counts them"),
    ),
    f("return_routed_experts", &[C, P, G], &[L], AtDefault(F, "the models served have no experts")),
    f(
        "routed_experts_start_len",
        &[C, P, G],
        &[L],
        AtDefault(&[Val::Int(0)], "the models served have no experts"),
    ),
    f("stop_regex", CP, &[L], AtDefault(NULL, "stop strings are plain text")),
    f("session_id", CP, &[L], AtDefault(NULL, "sessions are not supported")),
    f("images_config", CP, &[L], AtDefault(NULL, "only text input is supported")),
    f("max_dynamic_patch", &[C], &[L], AtDefault(NULL, "only text input is supported")),
    f("min_dynamic_patch", &[C], &[L], AtDefault(NULL, "only text input is supported")),
    f("use_audio_in_video", &[C], &[L], AtDefault(F, "only text input is supported")),
    f(
        "input_ids",
        &[C],
        &[L],
        AtDefault(NULL, "the prompt is rendered from the messages; use /generate for ids"),
    ),
    f("task", &[C], &[L], AtDefault(NULL, "quick-instruction tasks are not supported")),
    f("reasoning", &[C], &[L], AtDefault(NULL, "the reasoning effort cannot be set")),
    f("ngram_corpus_id", &[C, P], &[L], AtDefault(NULL, "n-gram speculative decoding is not supported")),
    f(
        "routed_dp_rank",
        &[C, P, G],
        &[L],
        AtDefault(&[Val::Int(0)], "a replica has one data-parallel rank, 0"),
    ),
    f(
        "disagg_prefill_dp_rank",
        &[C, P, G],
        &[L],
        AtDefault(NULL, "prefill/decode disaggregation is not supported"),
    ),
    f("custom_labels", &[C, P], &[L], Ignored),
    f("best_of", &[C], &[V], AtDefault(&[Val::Int(1)], "one sequence is sampled per choice")),
    f(
        "kv_transfer_params",
        CP,
        &[V],
        AtDefault(NULL, "KV transfer (disaggregated prefill) is not supported"),
    ),
    f("vllm_xargs", CP, &[V], AtDefault(&[Val::EmptyObject], "no extra arguments are read")),
    f("mm_processor_kwargs", CP, &[V], AtDefault(NULL, "only text input is supported")),
    f("media_io_kwargs", &[C], &[V], AtDefault(NULL, "only text input is supported")),
    f("prompt_embeds", &[P], &[V], AtDefault(NULL, "prompt embeddings are not supported")),
    f("documents", &[C], &[V], AtDefault(NULL, "the chat template is given no documents")),
    f("chat_template", &[C], &[V], AtDefault(NULL, "the model's chat template is used")),
    f("structural_tag", CP, VL, AtDefault(NULL, "use tools or response_format")),
    f(
        "guided_decoding_backend",
        CP,
        &[V],
        AtDefault(NULL, "there is one structured-output engine; the backend cannot be chosen"),
    ),
    f(
        "guided_whitespace_pattern",
        CP,
        &[V],
        AtDefault(NULL, "the whitespace of structured output cannot be set"),
    ),
    f(
        "structured_outputs",
        CP,
        &[V],
        AtDefault(
            NULL,
            "use guided_json, guided_regex, guided_choice, json_schema, regex or response_format",
        ),
    ),
    f("verbosity", &[C], &[O], AtDefault(NULL, "the verbosity cannot be set")),
    f("web_search_options", &[C], &[O], AtDefault(NULL, "web search is not supported")),
    f("prediction", &[C], &[O], AtDefault(NULL, "predicted outputs are not supported")),
    f("functions", &[C], &[O], AtDefault(NULL, "function calling is not supported; use tools")),
    f("function_call", &[C], &[O], AtDefault(NULL, "function calling is not supported; use tool_choice")),
    f("audio", &[C], &[O], AtDefault(NULL, "audio is not supported")),
    f("modalities", &[C, G], &[O, L], AtDefault(NULL, "only text output is supported")),
    f("lora_path", &[C, P, G], &[L], Read),
    f("lora_id", &[G], &[L], AtDefault(NULL, "name the LoRA adapter with lora_path or model")),
    f("session_params", &[C, P, G], &[L], AtDefault(NULL, "sessions are not supported")),
    f("bootstrap_host", &[C, P, G], &[L], AtDefault(NULL, "prefill/decode disaggregation is not supported")),
    f("bootstrap_port", &[C, P, G], &[L], AtDefault(NULL, "prefill/decode disaggregation is not supported")),
    f("bootstrap_room", &[C, P, G], &[L], AtDefault(NULL, "prefill/decode disaggregation is not supported")),
    f("bootstrap_pair_key", &[G], &[L], AtDefault(NULL, "prefill/decode disaggregation is not supported")),
    f(
        "data_parallel_rank",
        &[C, P, G],
        &[L],
        AtDefault(&[Val::Int(0)], "a replica has one data-parallel rank, 0"),
    ),
    f("extra_key", &[C, P, G], &[L], AtDefault(NULL, "use cache_salt")),
    f(
        "custom_logit_processor",
        &[C, P, G],
        &[L],
        AtDefault(NULL, "custom logit processors are not supported"),
    ),
    f("custom_params", &[C, P, S], &[L], AtDefault(NULL, "custom logit processors are not supported")),
    // ---- /generate: read ----
    f("text", &[G], &[L], Read),
    f("input_ids", &[G], &[L], Read),
    f("sampling_params", &[G], &[L], Read),
    f("rid", &[G], &[L], Read),
    f("return_logprob", &[G], &[L], Read),
    f("top_logprobs_num", &[G], &[L], Read),
    // ---- /generate: bookkeeping and defaults ----
    f("log_metrics", &[G], &[L], Ignored),
    f("no_logs", &[G], &[L], Ignored),
    f("custom_labels", &[G], &[L], Ignored),
    f("conversation_id", &[G], &[L], Ignored),
    f("return_text_in_logprobs", &[G], &[L], AtDefault(F, "log-probabilities carry token ids")),
    f(
        "logprob_start_len",
        &[G],
        &[L],
        AtDefault(&[Val::Int(-1)], "prompt log-probabilities are not returned"),
    ),
    f(
        "token_ids_logprob",
        &[G],
        &[L],
        AtDefault(NULL, "log-probabilities of chosen token ids are not returned"),
    ),
    f("background", &[G], &[L], AtDefault(F, "background requests are not supported")),
    f("return_bytes", &[G], &[L], AtDefault(F, "output is returned as text")),
    f("return_entropy", &[G], &[L], AtDefault(F, "entropies are not returned")),
    f("input_embeds", &[G], &[L], AtDefault(NULL, "input embeddings are not supported")),
    f("image_data", &[G], &[L], AtDefault(NULL, "images are not supported")),
    f("video_data", &[G], &[L], AtDefault(NULL, "video is not supported")),
    f("audio_data", &[G], &[L], AtDefault(NULL, "audio is not supported")),
    // ---- /generate's sampling_params ----
    f("max_new_tokens", &[S], &[L], Read),
    f("min_new_tokens", &[S], &[L], Read),
    f("temperature", &[S], &[L], Read),
    f("top_p", &[S], &[L], Read),
    f("top_k", &[S], &[L], Read),
    f("min_p", &[S], &[L], Read),
    f("repetition_penalty", &[S], &[L], Read),
    f("frequency_penalty", &[S], &[L], Read),
    f("presence_penalty", &[S], &[L], Read),
    f("stop", &[S], &[L], Read),
    f("stop_token_ids", &[S], &[L], Read),
    f("ignore_eos", &[S], &[L], Read),
    f("skip_special_tokens", &[S], &[L], Read),
    f("no_stop_trim", &[S], &[L], Read),
    f("seed", &[S], &[L], Read),
    f("n", &[S], &[L], Read),
    f("logit_bias", &[S], &[L], Read),
    f("regex", &[S], &[L], Read),
    f("json_schema", &[S], &[L], Read),
    f("ebnf", &[S], &[L], Read),
    f("speculative", &[S], &[FE], Read),
    f("thinking_token_budget", &[S], &[V], Read),
    f("stream_interval", &[S], &[L], Ignored),
    f("spaces_between_special_tokens", &[S], &[L], Read), // the same text either way (above)
    f("structural_tag", &[S], &[L], AtDefault(NULL, "use json_schema, regex or ebnf")),
    f("stop_regex", &[S], &[L], AtDefault(NULL, "stop strings are plain text")),
    f("sampling_seed", &[S], &[L], AtDefault(NULL, "use seed")),
];

/// The entry of `name` on `route`.
pub fn lookup(route: Route, name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.name == name && f.routes.contains(&route))
}

/// What a body's field not read by the route's typed request comes to: `Ok` when it is
/// accepted (ignored, or at its default), a message (after `path: `) when it is refused,
/// `None` when no schema defines it.
pub fn check_unread(route: Route, name: &str, value: &Value) -> Option<Result<(), String>> {
    lookup(route, name).map(|field| check_rule(field.rule, value))
}

/// Whether `value` is accepted under `rule`; else what is wrong with it (the caller names
/// the field). The one check of every field table: these routes' and those of the APIs
/// translated into a chat (`http::translate`).
pub fn check_rule(rule: Rule, value: &Value) -> Result<(), String> {
    match rule {
        Read | Ignored => Ok(()),
        AtDefault(_, _) if value.is_null() => Ok(()),
        AtDefault(ok, _) if ok.iter().any(|v| v.matches(value)) => Ok(()),
        AtDefault(ok, reason) => {
            let mut accepted: Vec<String> = ok.iter().map(|v| v.show()).collect();
            accepted.push("null".into());
            Err(format!("{} is not supported: {reason} (accepted: {})", shown(value), accepted.join(", ")))
        }
    }
}

/// A value as a message quotes it: its JSON, cut at 60 characters.
pub fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= 60 {
        return text;
    }
    let cut: String = text.chars().take(60).collect();
    format!("{cut}...")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_field_at_its_default_is_accepted_and_another_value_is_named() {
        assert_eq!(check_unread(C, "return_hidden_states", &json!(false)), Some(Ok(())));
        assert_eq!(check_unread(C, "return_hidden_states", &Value::Null), Some(Ok(())));
        let err = check_unread(C, "return_hidden_states", &json!(true)).unwrap().unwrap_err();
        assert!(err.starts_with("true is not supported: hidden states"), "{err}");
        assert!(err.ends_with("(accepted: false, null)"), "{err}");
        assert_eq!(check_unread(C, "length_penalty", &json!(1)), Some(Ok(())));
        assert!(check_unread(C, "length_penalty", &json!(1.5)).unwrap().is_err());
        assert_eq!(check_unread(G, "log_metrics", &json!(true)), Some(Ok(())));
        assert_eq!(check_unread(C, "no_such_field", &json!(true)), None);
        // routes are kept apart: a /generate field is not a chat field
        assert_eq!(check_unread(C, "log_metrics", &json!(true)), None);
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let err = check_unread(C, "chat_template", &json!("x".repeat(500))).unwrap().unwrap_err();
        assert!(err.starts_with(&format!("\"{}...", "x".repeat(59))), "{err}");
    }

    #[test]
    fn every_field_names_its_schema_and_appears_once_per_route() {
        for (i, a) in FIELDS.iter().enumerate() {
            assert!(!a.from.is_empty() && !a.routes.is_empty(), "{}", a.name);
            for b in &FIELDS[i + 1..] {
                let shared = a.routes.iter().any(|r| b.routes.contains(r));
                assert!(!(a.name == b.name && shared), "{} is listed twice for one route", a.name);
            }
        }
    }
}
