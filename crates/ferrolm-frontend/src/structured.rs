//! Structured output (regex, JSON Schema, `response_format`, EBNF, vLLM's `guided_*`,
//! llama.cpp's `grammar`): the fields, their precedence, and 400s naming the field.
//!
//! A request's grammar is compiled on the grammar pool's threads, never on an HTTP
//! thread nor on the step loop: the pool's threads compile through the shared
//! [`GrammarCache`] under the vocabulary's compile timeout (a schema that takes longer is a 400 naming its field). The cache is
//! the engine's own (`_core.Vocabulary`'s), so a grammar is compiled over the vocabulary
//! the core checks it against, and a source compiled once serves both front ends.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ferrolm_constraint::json_schema::JsonSchemaOptions;
use ferrolm_constraint::{ConstraintError, Grammar, GrammarCache, GrammarSource};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use crate::errors::{ApiError, ApiResult};

/// A JSON Schema field: the schema itself, or its JSON text.
#[derive(Deserialize, Debug, Clone)]
#[serde(try_from = "Value")]
pub enum SchemaField {
    Text(String),
    Object(Map<String, Value>),
}

impl TryFrom<Value> for SchemaField {
    type Error = String;
    fn try_from(value: Value) -> Result<Self, String> {
        match value {
            Value::String(s) => Ok(SchemaField::Text(s)),
            Value::Object(o) => Ok(SchemaField::Object(o)),
            _ => Err("expected a JSON Schema (an object) or its JSON text".into()),
        }
    }
}

impl SchemaField {
    /// The schema's JSON text (an object serialized with its members in the order sent:
    /// the order of properties is the order they are generated in).
    pub fn text(&self) -> String {
        match self {
            SchemaField::Text(t) => t.clone(),
            SchemaField::Object(o) => serde_json::to_string(o).expect("a JSON object serializes"),
        }
    }
}

/// The constraint a request asks for: what to compile, and the body field it came from
/// (named by every error about it).
#[derive(Debug, Clone, PartialEq)]
pub struct Structured {
    pub source: GrammarSource,
    pub field: String,
}

/// The structured-output fields of a body, in their order of precedence
/// (the first two given name the error when more than one is).
#[derive(Default)]
pub struct Asked<'a> {
    pub regex: Option<&'a str>,
    pub json_schema: Option<&'a SchemaField>,
    pub ebnf: Option<&'a str>,
    pub guided_json: Option<&'a SchemaField>,
    pub guided_regex: Option<&'a str>,
    pub guided_choice: Option<&'a [String]>,
    pub guided_grammar: Option<&'a str>,
    pub grammar: Option<&'a str>,
    pub response_format: Option<&'a Value>,
}

fn schema_options(strict: bool) -> JsonSchemaOptions {
    // as `Engine.grammar` compiles them: compact whitespace, nothing lenient
    JsonSchemaOptions { strict, ..JsonSchemaOptions::default() }
}

/// At most one constraint, checked as `constraint_kwargs` checks it; `prefix` is where
/// the fields sit in the body (`sampling_params.` for `/generate`).
pub fn constraint_of(a: &Asked<'_>, prefix: &str) -> ApiResult<Option<Structured>> {
    let mut asked: Vec<Structured> = Vec::new();
    let mut push = |source: GrammarSource, field: String| asked.push(Structured { source, field });
    if let Some(r) = a.regex {
        push(GrammarSource::Regex(r.to_string()), format!("{prefix}regex"));
    }
    if let Some(s) = a.json_schema {
        push(GrammarSource::JsonSchema(s.text(), schema_options(false)), format!("{prefix}json_schema"));
    }
    if let Some(g) = a.ebnf {
        push(GrammarSource::Gbnf(g.to_string()), format!("{prefix}ebnf"));
    }
    if let Some(s) = a.guided_json {
        push(GrammarSource::JsonSchema(s.text(), schema_options(false)), format!("{prefix}guided_json"));
    }
    if let Some(r) = a.guided_regex {
        push(GrammarSource::Regex(r.to_string()), format!("{prefix}guided_regex"));
    }
    if let Some(c) = a.guided_choice {
        push(GrammarSource::Choice(c.to_vec()), format!("{prefix}guided_choice"));
    }
    if let Some(g) = a.guided_grammar {
        push(GrammarSource::Gbnf(g.to_string()), format!("{prefix}guided_grammar"));
    }
    if let Some(g) = a.grammar {
        push(GrammarSource::Gbnf(g.to_string()), format!("{prefix}grammar"));
    }
    if let Some(rf) = a.response_format {
        if let Some(source) = response_format(rf)? {
            push(source, "response_format".to_string());
        }
    }
    if asked.len() > 1 {
        let given: Vec<&str> = asked.iter().map(|s| s.field.as_str()).collect();
        return Err(ApiError::bad_request(
            format!("{}: only one of {} may be given", given[1], given.join(", ")),
            given[1],
        ));
    }
    Ok(asked.pop())
}

/// `response_format`'s grammar: none for `text`, any JSON object for `json_object`, the
/// schema for `json_schema` (with OpenAI's `strict`: objects get only their members; with
/// ferrolm's `any_order_members`: declared members in any order, each at most once).
fn response_format(rf: &Value) -> ApiResult<Option<GrammarSource>> {
    let Some(rf) = rf.as_object() else {
        return Err(ApiError::bad_request("response_format: must be an object", "response_format"));
    };
    let kind = rf.get("type").and_then(Value::as_str);
    if !matches!(kind, Some("text" | "json_object" | "json_schema")) {
        return Err(ApiError::bad_request(
            "response_format.type: must be one of 'text', 'json_object', 'json_schema'",
            "response_format.type",
        ));
    }
    // an object or null whatever the type
    let spec = match rf.get("json_schema") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o),
        Some(_) => {
            return Err(ApiError::bad_request(
                "response_format.json_schema: must be an object",
                "response_format.json_schema",
            ))
        }
    };
    match kind {
        Some("json_object") => Ok(Some(GrammarSource::JsonObject(schema_options(false)))),
        Some("json_schema") => {
            let Some(schema) = spec.and_then(|s| s.get("schema")).and_then(Value::as_object) else {
                return Err(ApiError::bad_request(
                    "response_format.json_schema.schema: a JSON Schema object is required",
                    "response_format.json_schema.schema",
                ));
            };
            let flag = |name: &str| match spec.and_then(|s| s.get(name)) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(ApiError::bad_request(
                    format!("response_format.json_schema.{name}: must be a boolean"),
                    format!("response_format.json_schema.{name}"),
                )),
            };
            let strict = flag("strict")?;
            // ferrolm's extension: declared members in any order, each at most once
            let any_order_members = flag("any_order_members")?;
            let text = serde_json::to_string(schema).expect("a JSON object serializes");
            let options = JsonSchemaOptions { any_order_members, ..schema_options(strict) };
            Ok(Some(GrammarSource::JsonSchema(text, options)))
        }
        _ => Ok(None), // text
    }
}

/// A compile's failure as the client sees it: bad input is a 400 naming the body field
/// it came from (whichever part of the constraint engine refused it: a schema's pattern
/// is a "regex", any size or time limit the "grammar"); a panic while compiling is a bug,
/// a 500.
pub fn compile_error(e: &ConstraintError, field: &str) -> ApiError {
    match e {
        ConstraintError::Internal { .. } => {
            ApiError::new(500, format!("the grammar could not be compiled: {e}"))
        }
        _ => ApiError::bad_request(e.to_string(), field),
    }
}

/// A compile to run on a grammar thread, with the cache.
type Job = Box<dyn FnOnce(&GrammarCache) + Send>;

/// Threads that compile grammars for the HTTP handlers (each waits on the cache, whose
/// compile is bounded by the vocabulary's timeout), so a slow schema holds neither an
/// HTTP thread nor the tokenizer pool.
pub struct GrammarPool {
    cache: Arc<GrammarCache>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
}

impl GrammarPool {
    pub fn new(cache: Arc<GrammarCache>, threads: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let (rx, cache) = (rx.clone(), cache.clone());
            std::thread::Builder::new()
                .name(format!("ferrolm-grammar-{i}"))
                .spawn(move || loop {
                    // ends when the pool is dropped (its sender with it)
                    let job = rx.lock().unwrap().recv();
                    let Ok(job) = job else { return };
                    job(&cache);
                })
                .expect("a grammar thread starts");
        }
        GrammarPool { cache, jobs: Mutex::new(Some(tx)) }
    }

    pub fn cache(&self) -> &Arc<GrammarCache> {
        &self.cache
    }

    /// `work` on a grammar thread; its answer, or a 503 once the pool has stopped. Work
    /// whose client went away while it queued is skipped.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&GrammarCache) -> ApiResult<T> + Send + 'static,
    ) -> ApiResult<T> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |cache| {
            if !tx.is_closed() {
                let _ = tx.send(work(cache));
            }
        });
        let sent = match &*self.jobs.lock().unwrap() {
            Some(jobs) => jobs.send(job).is_ok(),
            None => false,
        };
        let stopped = || {
            ApiError::new(503, "the engine is unavailable: the server is shutting down")
                .with_code("engine_unavailable")
        };
        if !sent {
            return Err(stopped());
        }
        rx.await.map_err(|_| stopped())?
    }

    /// The compiled grammar and the seconds it took (a compile, or a cache hit); the
    /// error as the client sees it.
    pub async fn compile(&self, s: &Structured) -> ApiResult<(Arc<Grammar>, f64)> {
        let s = s.clone();
        self.run(move |cache| {
            let started = Instant::now();
            crate::chat_request::compile_structured(cache, &s).map(|g| (g, started.elapsed().as_secs_f64()))
        })
        .await
    }

    /// A planned constraint's grammar ([`crate::chat_request::compile_planned`]).
    pub async fn compile_planned(
        &self,
        c: &crate::tools::PlannedConstraint,
    ) -> ApiResult<(Arc<Grammar>, f64)> {
        let c = c.clone();
        self.run(move |cache| crate::chat_request::compile_planned(cache, &c)).await
    }

    /// Lets the threads end once they finish what they hold.
    pub fn stop(&self) {
        self.jobs.lock().unwrap().take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use ferrolm_constraint::Vocabulary;
    use serde_json::json;

    fn field(v: Value) -> SchemaField {
        serde_json::from_value(v).unwrap()
    }

    fn err(r: ApiResult<Option<Structured>>) -> (String, String) {
        let e = r.unwrap_err();
        assert_eq!(e.status, 400);
        (e.param.unwrap(), e.message)
    }

    #[test]
    fn each_field_maps_to_its_source_and_is_named() {
        let schema = field(json!({"type": "object", "properties": {"b": {}, "a": {}}}));
        let cases: Vec<(Asked<'_>, &str)> = vec![
            (Asked { regex: Some("a+"), ..Default::default() }, "regex"),
            (Asked { json_schema: Some(&schema), ..Default::default() }, "json_schema"),
            (Asked { ebnf: Some("root ::= \"a\""), ..Default::default() }, "ebnf"),
            (Asked { guided_json: Some(&schema), ..Default::default() }, "guided_json"),
            (Asked { guided_regex: Some("a"), ..Default::default() }, "guided_regex"),
            (Asked { guided_grammar: Some("root ::= \"a\""), ..Default::default() }, "guided_grammar"),
            (Asked { grammar: Some("root ::= \"a\""), ..Default::default() }, "grammar"),
        ];
        for (asked, name) in cases {
            let s = constraint_of(&asked, "").unwrap().unwrap();
            assert_eq!(s.field, name);
            let native = constraint_of(&asked, "sampling_params.").unwrap().unwrap();
            assert_eq!(native.field, format!("sampling_params.{name}"));
        }
        let choices = vec!["yes".to_string(), "no".to_string()];
        let s = constraint_of(&Asked { guided_choice: Some(&choices), ..Default::default() }, "").unwrap();
        assert_eq!(s.unwrap().source, GrammarSource::Choice(choices.clone()));
        assert_eq!(constraint_of(&Asked::default(), "").unwrap(), None);
    }

    #[test]
    fn a_schema_object_keeps_the_order_of_its_properties() {
        // the order of properties is the order they are generated in
        let s = field(json!({"properties": {"zeta": {}, "alpha": {}}}));
        assert_eq!(s.text(), r#"{"properties":{"zeta":{},"alpha":{}}}"#);
        assert_eq!(field(json!("{\"type\": \"string\"}")).text(), "{\"type\": \"string\"}");
        assert!(serde_json::from_value::<SchemaField>(json!(5)).is_err());
    }

    #[test]
    fn response_format_text_is_free_json_object_and_json_schema_constrain() {
        let text = json!({"type": "text"});
        assert_eq!(
            constraint_of(&Asked { response_format: Some(&text), ..Default::default() }, "").unwrap(),
            None
        );
        let object = json!({"type": "json_object"});
        let s = constraint_of(&Asked { response_format: Some(&object), ..Default::default() }, "")
            .unwrap()
            .unwrap();
        assert_eq!(s.field, "response_format");
        assert!(matches!(s.source, GrammarSource::JsonObject(_)));
        for (strict, want) in [(json!(true), true), (json!(false), false), (Value::Null, false)] {
            let rf = json!({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": strict}});
            let s = constraint_of(&Asked { response_format: Some(&rf), ..Default::default() }, "")
                .unwrap()
                .unwrap();
            let GrammarSource::JsonSchema(text, options) = s.source else { panic!("a schema") };
            assert_eq!((text.as_str(), options.strict), (r#"{"type":"object"}"#, want));
            assert!(!options.any_order_members);
        }
        for (any, want) in [(json!(true), true), (json!(false), false), (Value::Null, false)] {
            let rf = json!({"type": "json_schema", "json_schema": {"schema": {}, "any_order_members": any}});
            let s = constraint_of(&Asked { response_format: Some(&rf), ..Default::default() }, "")
                .unwrap()
                .unwrap();
            let GrammarSource::JsonSchema(_, options) = s.source else { panic!("a schema") };
            assert_eq!((options.any_order_members, options.strict), (want, false));
        }
    }

    #[test]
    fn bad_response_formats_name_the_field() {
        let cases = [
            (
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
                "response_format.json_schema.schema",
            ),
            (json!({"type": "json_schema"}), "response_format.json_schema.schema"),
            (
                json!({"type": "json_schema", "json_schema": {"schema": "text"}}),
                "response_format.json_schema.schema",
            ),
            (json!({"type": "json_schema", "json_schema": 3}), "response_format.json_schema"),
            (json!({"type": "json_object", "json_schema": "x"}), "response_format.json_schema"),
            (json!({"type": "text", "json_schema": [1]}), "response_format.json_schema"),
            (
                json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
                "response_format.json_schema.strict",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": {}, "any_order_members": 1}}),
                "response_format.json_schema.any_order_members",
            ),
            (json!({"type": "xml"}), "response_format.type"),
            (json!("json"), "response_format"),
        ];
        for (rf, param) in cases {
            let (got, message) =
                err(constraint_of(&Asked { response_format: Some(&rf), ..Default::default() }, ""));
            assert_eq!(got, param, "{rf}");
            assert!(message.starts_with(param), "{message}");
        }
    }

    #[test]
    fn two_constraints_name_the_second_in_the_order_of_precedence() {
        let schema = field(json!({"type": "object"}));
        let rf = json!({"type": "json_object"});
        let a = Asked { regex: Some("a"), json_schema: Some(&schema), ..Default::default() };
        assert_eq!(
            err(constraint_of(&a, "")),
            ("json_schema".into(), "json_schema: only one of regex, json_schema may be given".into())
        );
        let a = Asked { guided_regex: Some("a"), regex: Some("b"), ..Default::default() };
        assert_eq!(err(constraint_of(&a, "")).0, "guided_regex");
        let a = Asked { grammar: Some("root ::= \"a\""), response_format: Some(&rf), ..Default::default() };
        assert_eq!(err(constraint_of(&a, "")).0, "response_format");
        let a = Asked { regex: Some("a"), ebnf: Some("x"), ..Default::default() };
        assert_eq!(err(constraint_of(&a, "sampling_params.")).0, "sampling_params.ebnf");
    }

    fn pool() -> GrammarPool {
        let tokens: Vec<Vec<u8>> = (0u8..128).map(|b| vec![b]).chain([b"ab".to_vec()]).collect();
        let vocab = Vocabulary::new(tokens, &[], &[0]).unwrap();
        GrammarPool::new(Arc::new(GrammarCache::new(Arc::new(vocab), 16, Duration::from_secs(10))), 2)
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn the_pool_compiles_and_names_the_field_of_a_source_that_does_not_compile() {
        let pool = pool();
        let ok = Structured { source: GrammarSource::Regex("a(b|c)".into()), field: "guided_regex".into() };
        let (g, seconds) = run(pool.compile(&ok)).unwrap();
        assert!(Arc::ptr_eq(g.vocab(), pool.cache().vocab()) && seconds >= 0.0);
        let cases = [
            (GrammarSource::Regex("((".into()), "guided_regex", "invalid regex"),
            (
                GrammarSource::JsonSchema("{\"type\": 5}".into(), schema_options(false)),
                "response_format",
                "invalid JSON Schema",
            ),
            (
                GrammarSource::JsonSchema("not json".into(), schema_options(false)),
                "sampling_params.json_schema",
                "invalid JSON Schema",
            ),
            (GrammarSource::Gbnf("root ::= 'a'".into()), "grammar", "invalid grammar"),
        ];
        for (source, field, message) in cases {
            let e = run(pool.compile(&Structured { source, field: field.into() })).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(field)));
            assert!(e.message.starts_with(message), "{}", e.message);
        }
    }

    #[test]
    fn a_compile_over_its_time_is_a_400_naming_the_field() {
        let tokens: Vec<Vec<u8>> = (0u8..128).map(|b| vec![b]).collect();
        let vocab = Vocabulary::new(tokens, &[], &[0]).unwrap();
        let pool =
            GrammarPool::new(Arc::new(GrammarCache::new(Arc::new(vocab), 16, Duration::from_millis(1))), 1);
        // a schema whose flattened grammar doubles per level: far more than 1 ms
        let mut defs = serde_json::Map::new();
        defs.insert("l0".into(), json!({"type": "string", "maxLength": 3}));
        for i in 1..=20 {
            let below = json!({"$ref": format!("#/$defs/l{}", i - 1)});
            defs.insert(format!("l{i}"), json!({"anyOf": [{"type": "array", "items": below, "maxItems": 2},
                                                          {"type": "object", "additionalProperties": below}]}));
        }
        let schema = json!({"$defs": defs, "$ref": "#/$defs/l20"}).to_string();
        let s = Structured {
            source: GrammarSource::JsonSchema(schema, schema_options(false)),
            field: "guided_json".into(),
        };
        let e = run(pool.compile(&s)).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("guided_json")), "{}", e.message);
        assert!(e.message.contains("compiling took longer than the limit"), "{}", e.message);
    }

    #[test]
    fn a_stopped_pool_answers_503() {
        let pool = pool();
        pool.stop();
        let s = Structured { source: GrammarSource::Regex("a".into()), field: "regex".into() };
        assert_eq!(run(pool.compile(&s)).unwrap_err().status, 503);
    }
}
