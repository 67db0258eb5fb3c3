//! Compiled grammars cached by what they were compiled from, with a wall-clock limit
//! on compilation.
//!
//! A compilation runs on the caller's thread under a deadline (`budget.rs`): its long
//! loops check the clock, so a compilation past the limit stops at its next check with
//! [`ConstraintError::GrammarTooLarge`] and frees what it took. Every compilation is
//! also bounded in memory by its budget. (regex-automata's parser and dense builder,
//! the latter used for patterns with look-arounds only, cannot be interrupted; they run
//! under size limits.) Compiling here rather than on a helper thread matters: handing
//! the work to another thread and waiting cost 0.2 ms of a 1–3 ms compilation on a
//! quiet machine and about 1.5 ms on a loaded one (two wake-ups through the scheduler).
//! Schemas are translated recursively, so the compilation runs on a stack of at least
//! [`COMPILE_STACK_BYTES`] (a fresh one where the caller's has less left). A panic
//! while compiling comes back as [`ConstraintError::Internal`]. Failures are cached
//! too, so a schema that times out is not compiled again on every request (panics are
//! not: they are bugs, reported each time).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::budget;

use crate::error::{ConstraintError, Result};
use crate::grammar::Grammar;
use crate::json_schema::JsonSchemaOptions;
use crate::tags::TagSequence;
use crate::vocab::Vocabulary;

/// What a grammar is compiled from; the cache key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GrammarSource {
    Regex(String),
    /// JSON Schema text and its options.
    JsonSchema(String, JsonSchemaOptions),
    Choice(Vec<String>),
    /// Any JSON object (`response_format: json_object`).
    JsonObject(JsonSchemaOptions),
    /// A grammar in GBNF/EBNF (`Grammar::from_gbnf`).
    Gbnf(String),
    /// Free text until the trigger first appears, then the inner grammar.
    Segment {
        trigger: String,
        then: Box<GrammarSource>,
    },
    /// Free text until `trigger` first appears, then the inner grammar; with `optional`
    /// the output may also end before the trigger (`Grammar::after_trigger_with`).
    AfterTrigger {
        trigger: String,
        then: Box<GrammarSource>,
        optional: bool,
    },
    /// The body between structural tags, maybe repeated (`Grammar::tag_sequence`).
    Tags {
        body: Box<GrammarSource>,
        tags: TagSequence,
    },
    /// Text of `first` or text of `second`, told apart by their first bytes
    /// (`Grammar::either`).
    Either {
        first: Box<GrammarSource>,
        second: Box<GrammarSource>,
    },
}

impl GrammarSource {
    /// What kind of source it is, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSource::Regex(_) => "regex",
            GrammarSource::JsonSchema(..) => "json_schema",
            GrammarSource::Choice(_) => "choice",
            GrammarSource::JsonObject(_) => "json_object",
            GrammarSource::Gbnf(_) => "gbnf",
            GrammarSource::Segment { .. } => "segment",
            GrammarSource::AfterTrigger { .. } => "after_trigger",
            GrammarSource::Tags { .. } => "tags",
            GrammarSource::Either { .. } => "either",
        }
    }

    fn compile(&self, vocab: Arc<Vocabulary>) -> Result<Arc<Grammar>> {
        budget::entry(|| self.compile_in_scope(vocab))
    }

    fn compile_in_scope(&self, vocab: Arc<Vocabulary>) -> Result<Arc<Grammar>> {
        match self {
            GrammarSource::Regex(pattern) => Grammar::from_regex(vocab, pattern),
            GrammarSource::JsonSchema(schema, options) => Grammar::from_json_schema(vocab, schema, options),
            GrammarSource::Choice(choices) => {
                let choices: Vec<&str> = choices.iter().map(String::as_str).collect();
                Grammar::from_choices(vocab, &choices)
            }
            GrammarSource::JsonObject(options) => Grammar::json_object(vocab, options),
            GrammarSource::Gbnf(grammar) => Grammar::from_gbnf(vocab, grammar),
            GrammarSource::Segment { trigger, then } => {
                Grammar::after_trigger(trigger, &*then.compile(vocab)?)
            }
            GrammarSource::AfterTrigger { trigger, then, optional } => {
                Grammar::after_trigger_with(trigger, &*then.compile_in_scope(vocab)?, *optional)
            }
            GrammarSource::Tags { body, tags } => {
                Grammar::tag_sequence(&*body.compile_in_scope(vocab)?, tags)
            }
            GrammarSource::Either { first, second } => {
                let first = first.compile_in_scope(vocab.clone())?;
                Grammar::either(&first, &*second.compile_in_scope(vocab)?)
            }
        }
    }
}

/// Grammars over one vocabulary, compiled once per source.
#[derive(Debug)]
pub struct GrammarCache {
    vocab: Arc<Vocabulary>,
    timeout: Duration,
    capacity: usize,
    entries: Mutex<HashMap<GrammarSource, Result<Arc<Grammar>>>>,
    /// Compilations in progress (on their callers' threads).
    running: AtomicUsize,
}

/// The least stack a compilation runs on (schemas are translated recursively, at most
/// 128 JSON levels deep, and regexes nest up to 1,024 groups).
pub const COMPILE_STACK_BYTES: usize = 16 << 20;

impl GrammarCache {
    /// At most `capacity` entries are kept (the cache is cleared when full: grammars in
    /// use stay alive through their `Arc`s); each compilation may take `timeout`.
    /// The vocabulary's JSON string loops are indexed here, once, rather than in the
    /// first request's compilation ([`Grammar::prime_json_loops`]).
    pub fn new(vocab: Arc<Vocabulary>, capacity: usize, timeout: Duration) -> Self {
        Grammar::prime_json_loops(&vocab);
        GrammarCache {
            vocab,
            timeout,
            capacity: capacity.max(1),
            entries: Mutex::new(HashMap::new()),
            running: AtomicUsize::new(0),
        }
    }

    /// Compilations in progress now.
    pub fn compilations_running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    pub fn vocab(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The grammar of `source`, compiled now if it is not cached.
    pub fn get_or_compile(&self, source: &GrammarSource) -> Result<Arc<Grammar>> {
        if let Some(entry) = self.lock().get(source) {
            tracing::debug!(kind = source.kind(), ok = entry.is_ok(), "grammar cache hit");
            return entry.clone();
        }
        // Compiled without holding the lock, so other sources are served meanwhile
        // (two callers may compile the same new source at once; both get equal grammars).
        let started = std::time::Instant::now();
        let result = self.compile_with_timeout(|| source.compile_in_scope(self.vocab.clone()));
        match &result {
            Ok(_) => tracing::debug!(
                kind = source.kind(),
                ms = started.elapsed().as_secs_f64() * 1e3,
                "grammar compiled"
            ),
            Err(e) => tracing::info!(kind = source.kind(), error = %e, "grammar compile failed"),
        }
        if matches!(result, Err(ConstraintError::Internal { .. })) {
            return result;
        }
        let mut entries = self.lock();
        if entries.len() >= self.capacity {
            entries.clear();
        }
        entries.entry(source.clone()).or_insert(result).clone()
    }

    /// `compile` on this thread under the time limit, the memory budget and enough
    /// stack; a panic is an [`ConstraintError::Internal`] error.
    fn compile_with_timeout(&self, compile: impl FnOnce() -> Result<Arc<Grammar>>) -> Result<Arc<Grammar>> {
        self.running.fetch_add(1, Ordering::SeqCst);
        let deadline = budget::Deadline::after(self.timeout);
        let result = catch_unwind(AssertUnwindSafe(|| {
            stacker::maybe_grow(COMPILE_STACK_BYTES, COMPILE_STACK_BYTES, || {
                budget::scope_with_deadline(budget::MAX_COMPILE_BYTES, None, Some(deadline), compile)
            })
        }))
        .unwrap_or_else(|payload| {
            let reason = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            Err(ConstraintError::Internal { message: format!("compilation panicked: {reason}") })
        });
        self.running.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GrammarSource, Result<Arc<Grammar>>>> {
        // A panic while holding the lock leaves the map consistent (inserts are atomic).
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_vocab() -> Arc<Vocabulary> {
        Arc::new(Vocabulary::new(vec![b"a".to_vec(), b"<eos>".to_vec()], &[], &[1]).unwrap())
    }

    /// The JSON string loops are indexed when the cache is made, not by the first
    /// request's compilation (which then finds them, and indexes nothing new).
    #[test]
    fn a_new_cache_has_indexed_the_json_string_loops() {
        let tokens: Vec<Vec<u8>> =
            (0u8..128).map(|b| vec![b]).chain([b"\"ab".to_vec(), b"<eos>".to_vec()]).collect();
        let vocab = Arc::new(Vocabulary::new(tokens, &[], &[129]).unwrap());
        assert_eq!(vocab.loop_indexes().len(), 0);
        let cache = GrammarCache::new(vocab.clone(), 8, Duration::from_secs(60));
        let primed = vocab.loop_indexes().len();
        assert!(primed > 0, "no loop indexed by GrammarCache::new");
        let schema = GrammarSource::JsonSchema(
            r#"{"type":"object","properties":{"a":{"type":"string"}}}"#.into(),
            JsonSchemaOptions::default(),
        );
        let mut m = crate::Matcher::new(cache.get_or_compile(&schema).unwrap());
        let mut mask = vec![0u32; vocab.bitmask_words()];
        assert!(m.accept_bytes(br#"{"a":"x"#));
        m.fill_next_token_bitmask(&mut mask).unwrap();
        assert_eq!(vocab.loop_indexes().len(), primed, "the string loop was indexed again");
    }

    #[test]
    fn assembled_sources_compile_as_their_grammar_calls_do() {
        let tokens: Vec<Vec<u8>> = (0u8..128).map(|b| vec![b]).chain([b"<eos>".to_vec()]).collect();
        let cache = GrammarCache::new(
            Arc::new(Vocabulary::new(tokens, &[], &[128]).unwrap()),
            8,
            Duration::from_secs(60),
        );
        let body = Box::new(GrammarSource::Regex("[0-9]+".into()));
        let tags = TagSequence {
            begin: "<c>".into(),
            end: "</c>".into(),
            separator: ",".into(),
            repeated: true,
            begun: "<c".into(),
        };
        let tagged = GrammarSource::Tags { body: body.clone(), tags };
        let answer = Box::new(GrammarSource::Regex("x[a-z]".into()));
        let either = GrammarSource::Either { first: answer, second: Box::new(tagged.clone()) };
        let source =
            GrammarSource::AfterTrigger { trigger: "!".into(), then: Box::new(either), optional: true };
        let accepts = |source: &GrammarSource, text: &str| {
            let mut m = crate::Matcher::new(cache.get_or_compile(source).unwrap());
            m.accept_bytes(text.as_bytes()) && m.can_end()
        };
        assert!(accepts(&tagged, ">12</c>,<c>3</c>"));
        assert!(!accepts(&tagged, "<c>12</c>"));
        assert!(accepts(&source, "free text!>1</c>"));
        assert!(accepts(&source, "free text!xy"));
        assert!(accepts(&source, "no trigger")); // optional: the output may end before it
                                                 // an answer that may begin as the calls do cannot be told apart
        let clash = GrammarSource::Either {
            first: Box::new(GrammarSource::Regex(">[a-z]".into())),
            second: Box::new(tagged),
        };
        assert!(cache.get_or_compile(&clash).is_err());
        assert_eq!(source.kind(), "after_trigger");
    }

    #[test]
    fn a_panic_while_compiling_is_an_error_and_the_cache_lives_on() {
        let cache = GrammarCache::new(tiny_vocab(), 8, Duration::from_secs(60));
        let err = cache.compile_with_timeout(|| panic!("boom")).unwrap_err();
        assert!(matches!(&err, ConstraintError::Internal { message } if message.contains("boom")), "{err}");
        assert_eq!(cache.compilations_running(), 0);
        assert!(cache.get_or_compile(&GrammarSource::Regex("a+".into())).is_ok());
    }

    #[test]
    fn a_compilation_past_its_deadline_stops_at_a_check() {
        let cache = GrammarCache::new(tiny_vocab(), 8, Duration::from_millis(20));
        let started = std::time::Instant::now();
        let err = cache
            .compile_with_timeout(|| {
                // A compilation that only ends when stopped (a loop that checks).
                loop {
                    budget::check()?;
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
            .unwrap_err();
        assert!(err.to_string().contains("longer than the limit of 20ms"), "{err}");
        // 16 checks a millisecond apart at most after the deadline; generous for a busy machine.
        assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
        assert_eq!(cache.compilations_running(), 0);
    }

    #[test]
    fn work_begun_after_the_deadline_stops_at_its_first_checks() {
        let cache = GrammarCache::new(tiny_vocab(), 8, Duration::from_millis(20));
        let vocab = cache.vocab().clone();
        let err = cache
            .compile_with_timeout(move || {
                std::thread::sleep(Duration::from_millis(25));
                GrammarSource::Regex(r"[a-z]{1,30}x[a-z]{8}".into()).compile_in_scope(vocab)
            })
            .unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
        // With time to spare, the same regex compiles.
        let roomy = GrammarCache::new(tiny_vocab(), 8, Duration::from_secs(60));
        assert!(roomy.get_or_compile(&GrammarSource::Regex(r"[a-z]{1,30}x[a-z]{8}".into())).is_ok());
    }

    #[test]
    fn a_deep_schema_compiles_on_a_small_caller_stack() {
        // 40 levels of arrays in objects: recursive translation needs more than 256 KiB of
        // stack, which the compilation finds by moving to a fresh one.
        let mut schema = serde_json::json!({"type": "integer"});
        for i in 0..40 {
            schema = serde_json::json!({"type": "object", "properties": {format!("k{i}"): {"type": "array", "items": schema}}});
        }
        let source = GrammarSource::JsonSchema(schema.to_string(), JsonSchemaOptions::default());
        let ok = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let cache = GrammarCache::new(tiny_vocab(), 8, Duration::from_secs(60));
                cache.get_or_compile(&source).map(|_| ()).map_err(|e| e.to_string())
            })
            .unwrap()
            .join()
            .expect("the compiling thread ends without a stack overflow");
        assert_eq!(ok, Ok(()));
    }
}
