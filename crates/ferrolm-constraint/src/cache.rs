//! Compiled grammars cached by what they were compiled from, with a wall-clock limit
//! on compilation.
//!
//! The limit is enforced by compiling on a helper thread and giving up waiting: the
//! caller gets [`ConstraintError::GrammarTooLarge`] on time, while the abandoned
//! compilation runs on until its own checks or size limits stop it (our subset
//! construction checks the clock; regex-automata's parser and its dense builder, used
//! for patterns with look-arounds, cannot be interrupted). The helper thread is kept
//! between compilations (spawning one costs more than compiling a small schema); an
//! abandoned one exits when done. Failures are cached too, so a schema that times out
//! is not compiled again on every request.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{ConstraintError, Result};
use crate::grammar::Grammar;
use crate::json_schema::JsonSchemaOptions;
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
    /// Free text until the trigger first appears, then the inner grammar.
    Segment {
        trigger: String,
        then: Box<GrammarSource>,
    },
}

impl GrammarSource {
    fn compile(&self, vocab: Arc<Vocabulary>) -> Result<Arc<Grammar>> {
        match self {
            GrammarSource::Regex(pattern) => Grammar::from_regex(vocab, pattern),
            GrammarSource::JsonSchema(schema, options) => Grammar::from_json_schema(vocab, schema, options),
            GrammarSource::Choice(choices) => {
                let choices: Vec<&str> = choices.iter().map(String::as_str).collect();
                Grammar::from_choices(vocab, &choices)
            }
            GrammarSource::JsonObject(options) => Grammar::json_object(vocab, options),
            GrammarSource::Segment { trigger, then } => {
                Grammar::after_trigger(trigger, &*then.compile(vocab)?)
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
}

/// A compilation for the worker thread, and where its result goes.
type Job = (GrammarSource, Arc<Vocabulary>, mpsc::Sender<Result<Arc<Grammar>>>);

fn spawn_worker() -> Option<mpsc::Sender<Job>> {
    let (jobs, queue) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("ferrolm-grammar-compile".into())
        .spawn(move || {
            // Ends when the sender is dropped (the cache is gone or gave up waiting).
            for (source, vocab, reply) in queue {
                // The receiver may be gone after a timeout; nothing to do then.
                let _ = reply.send(source.compile(vocab));
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
        }
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
            return entry.clone();
        }
        // Compiled without holding the lock, so other sources are served meanwhile
        // (two callers may compile the same new source at once; both get equal grammars).
        let result = self.compile_with_timeout(source);
        let mut entries = self.lock();
        if entries.len() >= self.capacity {
            entries.clear();
        }
        entries.entry(source.clone()).or_insert(result).clone()
    }

    fn compile_with_timeout(&self, source: &GrammarSource) -> Result<Arc<Grammar>> {
        let idle = self.idle_worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(worker) = idle.or_else(spawn_worker) else {
            // No thread to be had: compile here, without the limit.
            return source.compile(self.vocab.clone());
        };
        let (reply, result) = mpsc::channel();
        if worker.send((source.clone(), self.vocab.clone(), reply)).is_err() {
            return source.compile(self.vocab.clone());
        }
        match result.recv_timeout(self.timeout) {
            Ok(result) => {
                // Back to idle (if another caller parked one meanwhile, this one exits).
                self.idle_worker.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(worker);
                result
            }
            // Dropping `worker` lets the abandoned thread exit once it is done.
            Err(mpsc::RecvTimeoutError::Timeout) => Err(ConstraintError::GrammarTooLarge {
                message: format!("compiling took longer than {:?}", self.timeout),
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(ConstraintError::GrammarTooLarge {
                message: "the compilation thread stopped without a result".into(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GrammarSource, Result<Arc<Grammar>>>> {
        // A panic while holding the lock leaves the map consistent (inserts are atomic).
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}
