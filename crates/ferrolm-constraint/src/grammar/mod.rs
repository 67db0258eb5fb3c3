//! A compiled grammar: a DFA (or, for recursion, rules of DFAs) bound to a vocabulary,
//! with the mask caches its matchers share (`masks.rs`), and the stepping a matcher
//! needs (`advance`, `can_end_at`, `next_bytes`).

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};

use crate::dfa::{ByteDfa, RegexOptions, DEAD};
use crate::error::{ConstraintError, Result};
use crate::json_schema::{any_json_rules, json_schema_to_rules_with, JsonSchemaOptions};
use crate::recursive::{Config, Frame, Frames, Rules, ScratchFrames, AMBIGUOUS_RULES, CALL_BASE, NO_FRAME};
use crate::region::SimulationMemo;
use crate::tags::TokenEdge;
use crate::vocab::Vocabulary;

mod masks;

pub(crate) use masks::set_bit;

/// Default memory budget of the per-state mask cache of one grammar.
pub const DEFAULT_MASK_CACHE_BYTES: usize = 64 << 20;

/// Masks of recursive grammars are cached only while the stack is at most this deep.
const MAX_CACHED_STACK: usize = 256;

#[derive(Debug)]
pub struct Grammar {
    vocab: Arc<Vocabulary>,
    dfa: ByteDfa,
    /// State -> index into `masks`.
    mask_class: Vec<u32>,
    masks: Vec<OnceLock<masks::CachedMask>>,
    cache_bytes_left: AtomicUsize,
    /// For grammars with rule calls (`recursive.rs`): the rules, and masks cached by
    /// configuration (rule, state and the whole stack).
    rules: Option<Rules>,
    stack_masks: Mutex<HashMap<Vec<u32>, Arc<masks::CachedMask>>>,
    /// Per (rule, whether it may return), or for the plain DFA: the states known to simulate indexed loops at
    /// every depth, so that a mask's search for a loop to start from is not repeated
    /// over the states that lead into one (`region.rs`).
    simulation_memos: Mutex<HashMap<(u32, bool), SimulationMemo>>,
    /// Per (rule, state) of a rule that was called: its walk apart from the stack
    /// (`masks.rs`).
    frame_indexes: Mutex<HashMap<(u32, u32), Arc<masks::FrameIndex>>>,
    /// Special tokens the grammar takes as whole steps (a trigger such as `[TOOL_CALLS]`
    /// that the tokenizer has as a special token: `tags.rs`).
    token_edges: Vec<TokenEdge>,
}

impl Grammar {
    /// Compile `pattern`; the whole output must match it.
    pub fn from_regex(vocab: Arc<Vocabulary>, pattern: &str) -> Result<Arc<Grammar>> {
        Self::from_regex_with(vocab, pattern, &RegexOptions::default())
    }

    pub fn from_regex_with(
        vocab: Arc<Vocabulary>,
        pattern: &str,
        options: &RegexOptions,
    ) -> Result<Arc<Grammar>> {
        crate::budget::entry(|| {
            let dfa = ByteDfa::from_regex(pattern, options)?;
            Ok(Arc::new(Self::from_dfa(vocab, dfa)))
        })
    }

    /// Compile a JSON Schema (given as JSON text); see [`crate::json_schema`] for what
    /// is supported.
    pub fn from_json_schema(
        vocab: Arc<Vocabulary>,
        schema: &str,
        options: &JsonSchemaOptions,
    ) -> Result<Arc<Grammar>> {
        crate::budget::entry(|| {
            let schema: serde_json::Value = serde_json::from_str(schema).map_err(|e| {
                if e.to_string().starts_with("recursion limit exceeded") {
                    // serde_json's guard for its own stack (and for ours, which
                    // translates the schema recursively).
                    ConstraintError::GrammarTooLarge {
                        message: "the schema nests arrays and objects more than 128 levels deep".into(),
                    }
                } else {
                    ConstraintError::InvalidSchema { path: "#".into(), message: format!("not JSON: {e}") }
                }
            })?;
            let translated = json_schema_to_rules_with(&schema, options, true)?;
            let shared = translated.shared;
            match Self::from_translated(vocab.clone(), translated) {
                // A call where a branch reads the same byte: written out again instead.
                Err(ConstraintError::UnsupportedSchema { keyword, .. })
                    if shared && keyword.starts_with(AMBIGUOUS_RULES) =>
                {
                    Self::from_translated(vocab, json_schema_to_rules_with(&schema, options, false)?)
                }
                result => result,
            }
        })
    }

    /// Compile a grammar in GBNF, llama.cpp's notation, which is also the EBNF that
    /// xgrammar reads: rules `name ::= ...`, the whole output matching `root`. What is
    /// supported, and which grammars the engine refuses, is documented in `gbnf/mod.rs`.
    pub fn from_gbnf(vocab: Arc<Vocabulary>, grammar: &str) -> Result<Arc<Grammar>> {
        crate::budget::entry(|| crate::gbnf::compile(vocab, grammar))
    }

    /// One JSON object with members of any names and values (`response_format:
    /// json_object`); whitespace as in `options`.
    pub fn json_object(vocab: Arc<Vocabulary>, options: &JsonSchemaOptions) -> Result<Arc<Grammar>> {
        crate::budget::entry(|| Self::from_rule_regexes(vocab, any_json_rules(options, true)))
    }

    /// One JSON value of any type.
    pub fn json_value(vocab: Arc<Vocabulary>, options: &JsonSchemaOptions) -> Result<Arc<Grammar>> {
        crate::budget::entry(|| Self::from_rule_regexes(vocab, any_json_rules(options, false)))
    }

    /// A translated schema: [`Grammar::from_rule_regexes`], or rules with marks.
    fn from_translated(
        vocab: Arc<Vocabulary>,
        translated: crate::json_schema::Translated,
    ) -> Result<Arc<Grammar>> {
        match translated.required {
            None => Self::from_rule_regexes(vocab, translated.rules),
            Some(required) => Self::from_rule_regexes_with(vocab, translated.rules, Some(required)),
        }
    }

    /// One regex: a plain grammar; more: rules that call each other.
    fn from_rule_regexes(vocab: Arc<Vocabulary>, regexes: Vec<String>) -> Result<Arc<Grammar>> {
        Self::from_rule_regexes_with(vocab, regexes, None)
    }

    /// [`Grammar::from_rule_regexes`]; with `required`, the regexes may have marks
    /// (members in any order) and always become rules.
    fn from_rule_regexes_with(
        vocab: Arc<Vocabulary>,
        regexes: Vec<String>,
        required: Option<Vec<Box<[u32]>>>,
    ) -> Result<Arc<Grammar>> {
        Self::prime_json_loops(&vocab);
        // A rule whose regex matches nothing: the schema allows no (finite) document.
        let empty_language = |e: ConstraintError| match e {
            ConstraintError::InvalidRegex { message, .. } if message == crate::dfa::MATCHES_NOTHING => {
                ConstraintError::InvalidSchema {
                    path: "#".into(),
                    message: "no finite document matches: the schema's constraints exclude every value"
                        .into(),
                }
            }
            // A generated regex too deep for the parser: a limit, not a bad regex.
            ConstraintError::InvalidRegex { message, .. } if message.contains("nested parentheses") => {
                ConstraintError::GrammarTooLarge {
                    message: format!(
                        "the schema's regex nests groups deeper than the limit of {} (hundreds of \
                         prefixItems, deeply nested combinators)",
                        crate::dfa::MAX_GROUP_NESTING
                    ),
                }
            }
            e => e,
        };
        if let ([pattern], None) = (&regexes[..], &required) {
            return Self::from_regex(vocab, pattern).map_err(empty_language);
        }
        let options = RegexOptions::default();
        let dfas = regexes
            .iter()
            .map(|pattern| ByteDfa::from_regex_with_calls(pattern, &options))
            .collect::<Result<Vec<_>>>()
            .map_err(empty_language)?;
        let rules = match required {
            None => Rules::new(dfas)?,
            Some(required) => Rules::with_marks(dfas, required)?,
        };
        Ok(Arc::new(Self::from_rules(vocab, rules)))
    }

    /// Index the JSON string loops of `vocab` (once per vocabulary: a trie walk each):
    /// masks of states that only simulate them, such as the characters of a string
    /// with a `maxLength`, then come from these indexes (`region.rs`). The first JSON
    /// grammar compiled over `vocab` does it if nobody has; [`GrammarCache::new`] does it
    /// up front, so the first request does not pay for it (~10 ms on a 200k vocabulary).
    ///
    /// [`GrammarCache::new`]: crate::GrammarCache::new
    pub fn prime_json_loops(vocab: &Arc<Vocabulary>) {
        vocab.loop_indexes().prime_json_once(|| {
            let _ = vocab.ids_longer_than(0).next(); // sorts the tokens by length now
            let mut mask = vec![0u32; vocab.bitmask_words()];
            for body in crate::json_schema::string_loop_bodies() {
                if let Ok(string) = Self::from_regex(vocab.clone(), &format!("\"{body}*\"")) {
                    let inside = string.dfa.next(string.dfa.start(), b'"');
                    let _ = string.compute_mask(inside, &mut mask);
                }
            }
        });
    }

    /// Exactly one of `choices` (for classification-style outputs).
    pub fn from_choices(vocab: Arc<Vocabulary>, choices: &[&str]) -> Result<Arc<Grammar>> {
        if choices.is_empty() {
            return Err(ConstraintError::InvalidRegex {
                pattern: String::new(),
                message: "a choice needs at least one option".into(),
            });
        }
        let escaped: Vec<String> = choices.iter().map(|c| regex_syntax::escape(c)).collect();
        Self::from_regex(vocab, &escaped.join("|"))
    }

    /// Free text until `trigger` first appears in the output, then `then` (e.g.
    /// `"</think>"` then a JSON Schema). The output may end only once `then` may.
    pub fn after_trigger(trigger: &str, then: &Grammar) -> Result<Arc<Grammar>> {
        Self::after_trigger_with(trigger, then, false)
    }

    /// As [`Grammar::after_trigger`]; with `optional`, the output may also end in the free
    /// text, before the trigger has appeared (`tool_choice: auto`: a call or an answer).
    pub fn after_trigger_with(trigger: &str, then: &Grammar, optional: bool) -> Result<Arc<Grammar>> {
        crate::budget::entry(|| {
            let dfa = crate::trigger::after_trigger(trigger.as_bytes(), then.dfa(), optional)?;
            let mut grammar = match &then.rules {
                // The free-text part goes in front of the main rule; the others are unchanged.
                Some(rules) => Self::from_rules(then.vocab.clone(), rules.with_main(dfa)?),
                None => Self::from_dfa(then.vocab.clone(), dfa),
            };
            grammar.token_edges = crate::tags::trigger_token_edges(trigger.as_bytes(), then, grammar.dfa())?;
            Ok(Arc::new(grammar))
        })
    }

    pub fn from_dfa(vocab: Arc<Vocabulary>, dfa: ByteDfa) -> Grammar {
        let mask_class = dfa.equivalence_up_to(vocab.trie().max_depth());
        let num_classes = mask_class.iter().max().map_or(0, |&c| c as usize + 1);
        let masks = (0..num_classes).map(|_| OnceLock::new()).collect();
        Grammar {
            vocab,
            dfa,
            mask_class,
            masks,
            cache_bytes_left: AtomicUsize::new(DEFAULT_MASK_CACHE_BYTES),
            rules: None,
            stack_masks: Mutex::new(HashMap::new()),
            simulation_memos: Mutex::new(HashMap::new()),
            frame_indexes: Mutex::new(HashMap::new()),
            token_edges: Vec::new(),
        }
    }

    /// A grammar whose rules call each other (rule 0 is the main one).
    pub(crate) fn from_rules(vocab: Arc<Vocabulary>, rules: Rules) -> Grammar {
        Grammar {
            vocab,
            dfa: rules.main().clone(),
            mask_class: Vec::new(),
            masks: Vec::new(),
            cache_bytes_left: AtomicUsize::new(DEFAULT_MASK_CACHE_BYTES),
            rules: Some(rules),
            stack_masks: Mutex::new(HashMap::new()),
            simulation_memos: Mutex::new(HashMap::new()),
            frame_indexes: Mutex::new(HashMap::new()),
            token_edges: Vec::new(),
        }
    }

    /// Where the engine would have to look further than one byte to choose between a
    /// rule's own text, a call and a return (see `gbnf/check.rs`), described; `None`
    /// when the rules are LL(1) and so run exactly. Grammars compiled from GBNF are
    /// checked when built; this lets tests check the rules of other forms too.
    #[doc(hidden)]
    pub fn ll1_conflict(&self) -> Option<String> {
        let rules = self.rules.as_ref()?;
        crate::gbnf::check::find_conflict(rules).ok().flatten().map(|c| format!("{c:?}"))
    }

    /// DFA states in all, over every rule (a measure of what compiling cost).
    pub fn num_states(&self) -> usize {
        match &self.rules {
            None => self.dfa.num_states(),
            Some(rules) => (0..rules.num_rules()).map(|k| rules.rule(k as u32).num_states()).sum(),
        }
    }

    /// Whether rules call rules (the matcher then keeps a stack).
    pub fn is_recursive(&self) -> bool {
        self.rules.is_some()
    }

    pub(crate) fn start_config(&self) -> Config {
        Config { rule: 0, state: self.dfa.start(), stack: NO_FRAME }
    }

    /// The configuration after `bytes`, or `None` if they are refused. Frames pushed on
    /// the way stay in `frames` either way (the caller truncates if it must).
    pub(crate) fn advance(&self, config: Config, bytes: &[u8], frames: &mut impl Frames) -> Option<Config> {
        match &self.rules {
            None => {
                let state = self.dfa.run(config.state, bytes);
                (state != DEAD).then_some(Config { state, ..config })
            }
            Some(rules) => bytes.iter().try_fold(config, |c, &b| rules.step(c, b, frames)),
        }
    }

    pub(crate) fn can_end_at(&self, config: Config, frames: &[Frame]) -> bool {
        match &self.rules {
            None => self.dfa.is_accepting(config.state),
            Some(rules) => rules.can_end(config, frames),
        }
    }

    /// The bytes that can come next (jump-forward and `must_end` use this).
    pub(crate) fn next_bytes(&self, config: Config, frames: &[Frame]) -> Vec<u8> {
        (0..CALL_BASE)
            .filter(|&b| {
                let mut scratch = ScratchFrames::new(frames);
                self.advance(config, &[b], &mut scratch).is_some()
            })
            .collect()
    }

    pub fn vocab(&self) -> &Arc<Vocabulary> {
        &self.vocab
    }

    pub fn dfa(&self) -> &ByteDfa {
        &self.dfa
    }

    pub(crate) fn rules(&self) -> Option<&Rules> {
        self.rules.as_ref()
    }

    pub(crate) fn token_edges(&self) -> &[TokenEdge] {
        &self.token_edges
    }

    /// Where the special `token` leads from `config`, if the grammar takes it there.
    pub(crate) fn token_edge(&self, config: Config, token: u32) -> Option<Config> {
        self.token_edges.iter().find(|e| e.token == token && e.leaves(config)).map(|e| e.target(config))
    }

    /// Allow in `mask` the special tokens the grammar takes from `config`.
    pub(crate) fn add_token_edges(&self, config: Config, mask: &mut [u32]) {
        for edge in self.token_edges.iter().filter(|e| e.leaves(config)) {
            set_bit(mask, edge.token);
        }
    }
}
