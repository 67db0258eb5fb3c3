//! Compiled grammars cached by what they were compiled from, with a wall-clock limit
//! on compilation.
//!
//! The limit is enforced by compiling on a helper thread and giving up waiting: the
//! caller gets [`ConstraintError::GrammarTooLarge`] on time, and the cache sets the
//! compilation's cancel flag (`budget.rs`), which its long loops check, so the
//! abandoned compilation stops soon after and frees what it took. Every compilation is
//! also bounded in memory by its budget. (regex-automata's parser and dense builder,
//! the latter used for patterns with look-arounds only, cannot be interrupted; they run
//! under size limits.) A panic while compiling comes back as
//! [`ConstraintError::Internal`]. The helper thread is kept between compilations
//! (spawning one costs more than compiling a small schema); an abandoned one exits
//! when done. Failures are cached too, so a schema that times out is not compiled again
//! on every request (panics are not: they are bugs, reported each time).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::budget::{self, CancelFlag};

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
    /// An idle compile thread's job queue (taken while in use, so concurrent callers
    /// each get their own thread).
    idle_worker: Mutex<Option<mpsc::Sender<Job>>>,
    /// Compilations running on helper threads, abandoned ones included.
    running: Arc<AtomicUsize>,
}

/// A compilation for the worker thread, its cancel flag, and where its result goes.
struct Job {
    compile: Box<dyn FnOnce() -> Result<Arc<Grammar>> + Send>,
    cancel: Arc<CancelFlag>,
    reply: mpsc::Sender<Result<Arc<Grammar>>>,
}

fn spawn_worker(running: Arc<AtomicUsize>) -> Option<mpsc::Sender<Job>> {
    let (jobs, queue) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("ferrolm-grammar-compile".into())
        // Schemas are translated recursively (at most 128 JSON levels deep).
        .stack_size(16 << 20)
        .spawn(move || {
            // Ends when the sender is dropped (the cache is gone or gave up waiting).
            for job in queue {
                let Job { compile, cancel, reply } = job;
                let result = catch_unwind(AssertUnwindSafe(|| {
                    budget::scope(budget::MAX_COMPILE_BYTES, Some(cancel), compile)
                }))
                .unwrap_or_else(|payload| {
                    let reason = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "panic".into());
                    Err(ConstraintError::Internal { message: format!("compilation panicked: {reason}") })
                });
                running.fetch_sub(1, Ordering::SeqCst);
                // The receiver may be gone after a timeout; nothing to do then.
                let _ = reply.send(result);
            }
        })
        .ok()?;
    Some(jobs)
}

impl GrammarCache {
    /// At most `capacity` entries are kept (the cache is cleared when full: grammars in
    /// use stay alive through their `Arc`s); each compilation may take `timeout`.
    pub fn new(vocab: Arc<Vocabulary>, capacity: usize, timeout: Duration) -> Self {
        GrammarCache {
            vocab,
            timeout,
            capacity: capacity.max(1),
            entries: Mutex::new(HashMap::new()),
            idle_worker: Mutex::new(None),
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Compilations still running on helper threads, including those whose caller gave
    /// up waiting (they stop at their next cancellation check).
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
        let (vocab, owned) = (self.vocab.clone(), source.clone());
        let started = std::time::Instant::now();
        let result = self.compile_with_timeout(Box::new(move || owned.compile_in_scope(vocab)));
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

    fn compile_with_timeout(
        &self,
        compile: Box<dyn FnOnce() -> Result<Arc<Grammar>> + Send>,
    ) -> Result<Arc<Grammar>> {
        let idle = self.idle_worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(worker) = idle.or_else(|| spawn_worker(self.running.clone())) else {
            // No thread to be had: compile here, without the time limit.
            return budget::entry(compile);
        };
        let (reply, result) = mpsc::channel();
        let cancel = Arc::new(CancelFlag::default());
        self.running.fetch_add(1, Ordering::SeqCst);
        if let Err(mpsc::SendError(job)) = worker.send(Job { compile, cancel: cancel.clone(), reply }) {
            self.running.fetch_sub(1, Ordering::SeqCst);
            return budget::entry(job.compile);
        }
        match result.recv_timeout(self.timeout) {
            Ok(result) => {
                // Back to idle (if another caller parked one meanwhile, this one exits).
                self.idle_worker.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(worker);
                result
            }
            // The compilation stops at its next check; dropping `worker` lets the thread
            // exit then.
            Err(mpsc::RecvTimeoutError::Timeout) => {
                cancel.cancel();
                Err(ConstraintError::GrammarTooLarge {
                    message: format!("compiling took longer than the limit of {:?}", self.timeout),
                })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(ConstraintError::Internal {
                message: "the compilation thread stopped without a result".into(),
            }),
        }
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
    fn a_panic_on_the_compile_thread_is_an_error_and_the_thread_lives_on() {
        let cache = GrammarCache::new(tiny_vocab(), 8, Duration::from_secs(60));
        let err = cache.compile_with_timeout(Box::new(|| panic!("boom"))).unwrap_err();
        assert!(matches!(&err, ConstraintError::Internal { message } if message.contains("boom")), "{err}");
        assert_eq!(cache.compilations_running(), 0);
        // The same (kept) thread compiles the next source.
        assert!(cache.get_or_compile(&GrammarSource::Regex("a+".into())).is_ok());
    }

    #[test]
    fn a_timed_out_compilation_is_cancelled() {
        let cache = GrammarCache::new(tiny_vocab(), 8, Duration::from_millis(20));
        let (seen, saw) = mpsc::channel();
        let err = cache
            .compile_with_timeout(Box::new(move || {
                // A compilation that only ends when cancelled (a loop that checks).
                loop {
                    if let Err(e) = budget::check() {
                        let _ = seen.send(());
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }))
            .unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
        // Generous: only a compilation that never stops would take this long.
        saw.recv_timeout(Duration::from_secs(60)).expect("the abandoned compilation stopped");
    }

    #[test]
    fn an_abandoned_compilation_stops_at_its_next_check() {
        let cache = GrammarCache::new(tiny_vocab(), 8, Duration::from_millis(20));
        let (done, outcome) = mpsc::channel();
        let vocab = cache.vocab().clone();
        let err = cache
            .compile_with_timeout(Box::new(move || {
                // Start the real work only once the cache has given up on it.
                while budget::check().is_ok() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let result = GrammarSource::Regex(r"[a-z]{1,30}x[a-z]{8}".into()).compile_in_scope(vocab);
                let _ = done.send(result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
                result
            }))
            .unwrap_err();
        assert!(err.to_string().contains("longer than"), "{err}");
        let outcome = outcome.recv_timeout(Duration::from_secs(60)).expect("the compilation ended");
        assert!(outcome.as_ref().is_err_and(|e| e.contains("cancelled")), "{outcome:?}");
        while cache.compilations_running() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
