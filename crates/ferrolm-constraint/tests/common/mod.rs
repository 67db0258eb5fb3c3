//! Shared fixtures for the integration tests: random regexes (as ASTs, so members can
//! be generated independently of our automaton), small vocabularies, an oracle.
#![allow(dead_code)]

pub mod earley;

use std::sync::Arc;

use ferrolm_constraint::{Matcher, Vocabulary};
use proptest::prelude::*;

/// A tiny deterministic generator (SplitMix64) seeded by proptest, so the tests need
/// no direct `rand` dependency.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A small regex AST over a few ASCII letters and two multi-byte characters.
#[derive(Debug, Clone)]
pub enum Re {
    Literal(char),
    Class(Vec<char>),
    Concat(Vec<Re>),
    Alt(Vec<Re>),
    Repeat(Box<Re>, u32, Option<u32>),
}

pub const ALPHABET: &[char] = &['a', 'b', 'c', '{', '"', 'é', '中'];

impl Re {
    pub fn to_pattern(&self) -> String {
        match self {
            Re::Literal(c) => regex_syntax::escape(&c.to_string()),
            Re::Class(chars) => {
                let body: String = chars.iter().map(|c| regex_syntax::escape(&c.to_string())).collect();
                format!("[{body}]")
            }
            Re::Concat(parts) => parts.iter().map(|p| format!("(?:{})", p.to_pattern())).collect(),
            Re::Alt(parts) => {
                let alts: Vec<String> = parts.iter().map(|p| format!("(?:{})", p.to_pattern())).collect();
                alts.join("|")
            }
            Re::Repeat(inner, min, Some(max)) => {
                format!("(?:{}){{{min},{max}}}", inner.to_pattern())
            }
            Re::Repeat(inner, min, None) => format!("(?:{}){{{min},}}", inner.to_pattern()),
        }
    }

    /// A random member of the language.
    pub fn sample(&self, rng: &mut Rng, out: &mut String) {
        match self {
            Re::Literal(c) => out.push(*c),
            Re::Class(chars) => out.push(chars[rng.below(chars.len())]),
            Re::Concat(parts) => parts.iter().for_each(|p| p.sample(rng, out)),
            Re::Alt(parts) => parts[rng.below(parts.len())].sample(rng, out),
            Re::Repeat(inner, min, max) => {
                let max = max.unwrap_or(min + 3);
                for _ in 0..*min + rng.below((max - min + 1) as usize) as u32 {
                    inner.sample(rng, out);
                }
            }
        }
    }
}

pub fn re_strategy() -> impl Strategy<Value = Re> {
    let leaf = prop_oneof![
        proptest::sample::select(ALPHABET).prop_map(Re::Literal),
        proptest::sample::subsequence(ALPHABET, 1..4).prop_map(Re::Class),
    ];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 1..4).prop_map(Re::Concat),
            proptest::collection::vec(inner.clone(), 2..4).prop_map(Re::Alt),
            (inner, 0u32..3, proptest::option::of(0u32..3)).prop_map(|(r, min, extra)| Re::Repeat(
                Box::new(r),
                min,
                extra.map(|e| min + e)
            )),
        ]
    })
}

/// Every single byte (so every string has a tokenization), the alphabet's characters,
/// `extra` multi-byte tokens, duplicates of two tokens, two specials and one EOS.
/// Returns the vocabulary and the id of its EOS.
pub fn small_vocab(extra: &[Vec<u8>]) -> (Arc<Vocabulary>, u32) {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for c in ALPHABET {
        tokens.push(c.to_string().into_bytes());
    }
    tokens.extend(extra.iter().filter(|t| !t.is_empty()).cloned());
    tokens.push(b"ab".to_vec());
    tokens.push(b"ab".to_vec());
    let special = tokens.len() as u32;
    tokens.push(b"<|special|>".to_vec());
    let eos = tokens.len() as u32;
    tokens.push(b"<|eos|>".to_vec());
    let vocab = Vocabulary::new(tokens, &[special], &[eos]).expect("valid vocabulary");
    (Arc::new(vocab), eos)
}

/// Random multi-byte tokens drawn from the alphabet's bytes.
pub fn extra_tokens_strategy() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let bytes: Vec<u8> = ALPHABET.iter().flat_map(|c| c.to_string().into_bytes()).collect();
    proptest::collection::vec(proptest::collection::vec(proptest::sample::select(bytes), 2..6), 0..40)
}

/// Full-match membership by the `regex` crate, independent of our automaton.
pub fn oracle(pattern: &str) -> regex::bytes::Regex {
    regex::bytes::Regex::new(&format!("^(?:{pattern})$")).expect("oracle compiles")
}

/// Split `text` into tokens of `vocab`, choosing at random among the tokens that fit
/// at each position (single bytes always fit).
pub fn random_tokenization(vocab: &Vocabulary, text: &[u8], rng: &mut Rng) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut pos = 0;
    while pos < text.len() {
        let fitting: Vec<u32> = (0..vocab.size() as u32)
            .filter(|&id| vocab.kind(id) == Some(ferrolm_constraint::TokenKind::Normal))
            .filter(|&id| {
                let t = vocab.token_bytes(id).unwrap();
                !t.is_empty() && text[pos..].starts_with(t)
            })
            .collect();
        let id = fitting[rng.below(fitting.len())];
        pos += vocab.token_bytes(id).unwrap().len();
        ids.push(id);
    }
    ids
}

/// The mask equals trying every token with `is_token_allowed`.
pub fn check_mask(matcher: &Matcher, vocab: &Vocabulary) {
    let mut mask = vec![0u32; vocab.bitmask_words()];
    matcher.fill_next_token_bitmask(&mut mask).unwrap();
    for id in 0..vocab.size() as u32 {
        let in_mask = mask[id as usize / 32] >> (id % 32) & 1 == 1;
        assert_eq!(in_mask, matcher.is_token_allowed(id), "token {id} {:?}", vocab.token_bytes(id));
    }
}

/// The token ids a mask allows, below `size`.
pub fn allowed_ids(mask: &[u32], size: usize) -> Vec<u32> {
    (0..size as u32).filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1).collect()
}
