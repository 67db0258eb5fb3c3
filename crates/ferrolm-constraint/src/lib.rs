//! ferrolm's structured-output constraint engine: make a model's output match a regex or
//! a JSON Schema by masking, at every decode step, the tokens that would break it.
//!
//! Key types:
//! - [`Vocabulary`]: token bytes, special and EOS ids, and the token trie; built once per
//!   tokenizer (from a list, a tiktoken file or a `tokenizer.json`) and shared.
//! - [`Grammar`]: a regex, a JSON Schema ([`json_schema`]), any JSON object, a list of
//!   choices, a GBNF/EBNF grammar ([`Grammar::from_gbnf`]), or free text until a trigger then one of those, compiled to byte-level
//!   DFAs (several that call each other where JSON nests without bound) bound to a
//!   vocabulary, with a mask cache shared by all its matchers. [`GrammarCache`] compiles
//!   each source once, under a time limit.
//! - [`Matcher`]: one per request; fills the next-token bitmask, accepts tokens, rolls
//!   back, and says whether the output may or must end.
//!
//! The decode loop:
//!
//! ```
//! use std::sync::Arc;
//! use ferrolm_constraint::{Grammar, Matcher, Vocabulary};
//!
//! let tokens: Vec<Vec<u8>> = ["a", "b", "ab", "<eos>"].iter().map(|t| t.as_bytes().to_vec()).collect();
//! let vocab = Arc::new(Vocabulary::new(tokens, &[], &[3])?);
//! let grammar = Grammar::from_regex(vocab.clone(), "(ab)+")?;
//! let mut matcher = Matcher::new(grammar);
//! let mut mask = vec![0u32; vocab.bitmask_words()];
//! loop {
//!     // 1. mask the logits with the allowed tokens
//!     matcher.fill_next_token_bitmask(&mut mask)?;
//!     // 2. sample among the allowed tokens (here: the highest allowed id)
//!     let token = (0..vocab.size() as u32).rev().find(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1).unwrap();
//!     // 3. commit it
//!     assert!(matcher.accept_token(token));
//!     // 4. stop at EOS
//!     if matcher.is_ended() { break; }
//! }
//! # Ok::<(), ferrolm_constraint::ConstraintError>(())
//! ```

mod budget;
mod cache;
mod dfa;
mod error;
mod gbnf;
mod grammar;
pub mod json_schema;
mod matcher;
mod recursive;
mod region;
mod tags;
pub mod tokenizer_files;
mod trie;
mod trigger;
mod vocab;

pub use cache::{GrammarCache, GrammarSource};
pub use dfa::{ByteDfa, RegexOptions, DEAD};
pub use error::{ConstraintError, Result};
pub use grammar::{Grammar, DEFAULT_MASK_CACHE_BYTES};
pub use matcher::{fill_next_token_bitmask_batch, fill_next_token_bitmask_batch_i32, Matcher};
pub use tags::TagSequence;
pub use trie::TokenTrie;
pub use vocab::{TokenKind, Vocabulary, VocabularyBuilder, MAX_VOCAB_SIZE};
