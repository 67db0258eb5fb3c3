//! The vocabulary: every token id's bytes, which ids are special and which end the
//! document. Built once per tokenizer and shared (behind an `Arc`) by every grammar.

use crate::error::{ConstraintError, Result};
use crate::region::LoopIndexCache;
use crate::trie::{TokenTrie, MAX_TOKEN_BYTES};

/// Real vocabularies have up to a few hundred thousand ids; refuse more than this.
pub const MAX_VOCAB_SIZE: usize = 1 << 24;

/// How a token id takes part in constraint matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// Text: its bytes are matched against the grammar.
    Normal,
    /// A control token (`<|im_start|>`, `<s>`, ...): never matches grammar bytes.
    Special,
    /// An end-of-sequence token: allowed exactly where the document may end.
    Eos,
    /// An id with no token behind it (padding up to the model's embedding size).
    Absent,
}

/// An immutable token table plus the trie used to compute masks.
#[derive(Debug)]
pub struct Vocabulary {
    kinds: Vec<TokenKind>,
    /// Token bytes, flat: token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    eos_ids: Vec<u32>,
    trie: TokenTrie,
    /// Masks of automaton loops, shared by every grammar over this vocabulary.
    loop_indexes: LoopIndexCache,
    /// `(length, id)` of every token, longest first (built on first use).
    by_length: std::sync::OnceLock<Vec<(u32, u32)>>,
    /// The trie of the tokens longer than [`LONG_TOKEN_BYTES`] (built on first use).
    long_trie: std::sync::OnceLock<TokenTrie>,
}

/// Tokens longer than this many bytes also go into [`Vocabulary::long_token_trie`]
/// (3,987 of o200k's 200k tokens).
pub(crate) const LONG_TOKEN_BYTES: usize = 16;

impl Vocabulary {
    /// A vocabulary whose token `i` has bytes `tokens[i]`; `special_ids` never match
    /// grammar bytes and `eos_ids` (also special) end the document.
    pub fn new(tokens: Vec<Vec<u8>>, special_ids: &[u32], eos_ids: &[u32]) -> Result<Self> {
        let mut builder = VocabularyBuilder::new();
        for (id, bytes) in tokens.into_iter().enumerate() {
            let id = u32::try_from(id)
                .map_err(|_| ConstraintError::InvalidVocabulary("more than u32::MAX tokens".into()))?;
            builder.add_token(id, bytes);
        }
        for &id in special_ids {
            builder.mark_special(id);
        }
        for &id in eos_ids {
            builder.mark_eos(id);
        }
        builder.build()
    }

    /// Number of token ids, i.e. the width of a mask row in bits.
    pub fn size(&self) -> usize {
        self.kinds.len()
    }

    /// Length in 32-bit words of one bitmask row: `(size + 31) / 32`.
    pub fn bitmask_words(&self) -> usize {
        self.size().div_ceil(32)
    }

    /// The bytes of token `id`, or `None` for an id past the end. Special tokens keep
    /// their text here (for detokenization) even though grammars never match them.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let id = id as usize;
        if id >= self.kinds.len() {
            return None;
        }
        Some(&self.bytes[self.offsets[id] as usize..self.offsets[id + 1] as usize])
    }

    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.kind(id) == Some(TokenKind::Eos)
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The ids of the tokens longer than `max_len` bytes.
    pub(crate) fn ids_longer_than(&self, max_len: usize) -> impl Iterator<Item = u32> + '_ {
        let by_length = self.by_length.get_or_init(|| {
            let mut by_length: Vec<(u32, u32)> = (0..self.size() as u32)
                .map(|id| (self.token_bytes(id).map_or(0, <[u8]>::len) as u32, id))
                .collect();
            by_length.sort_unstable_by(|a, b| b.cmp(a));
            by_length
        });
        by_length.iter().take_while(move |&&(len, _)| len as usize > max_len).map(|&(_, id)| id)
    }

    pub fn trie(&self) -> &TokenTrie {
        &self.trie
    }

    /// The trie of the text tokens longer than [`LONG_TOKEN_BYTES`], with their ids: a
    /// walk for the long tokens only (a mask from a loop simulated that deep) then skips
    /// the short tokens' nodes without visiting them. Tokens with equal bytes keep the
    /// id they have in [`Vocabulary::trie`].
    pub(crate) fn long_token_trie(&self) -> &TokenTrie {
        self.long_trie.get_or_init(|| {
            TokenTrie::build((0..self.size() as u32).filter_map(|id| {
                let bytes = self.token_bytes(id)?;
                (self.kinds[id as usize] == TokenKind::Normal && bytes.len() > LONG_TOKEN_BYTES)
                    .then_some((id, bytes))
            }))
        })
    }

    pub(crate) fn loop_indexes(&self) -> &LoopIndexCache {
        &self.loop_indexes
    }

    /// Find the id of a token by its exact bytes (first match); a convenience for
    /// tests and for naming special tokens, not for the hot path.
    pub fn find_token(&self, bytes: &[u8]) -> Option<u32> {
        (0..self.size() as u32).find(|&id| self.token_bytes(id) == Some(bytes))
    }
}

/// Collects tokens from any source (a list, a tiktoken file, a `tokenizer.json`) and
/// checks them once in [`VocabularyBuilder::build`].
#[derive(Debug, Default, Clone)]
pub struct VocabularyBuilder {
    tokens: Vec<(u32, Vec<u8>, TokenKind)>,
    special_ids: Vec<u32>,
    eos_ids: Vec<u32>,
    min_size: usize,
}

impl VocabularyBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A text token.
    pub fn add_token(&mut self, id: u32, bytes: Vec<u8>) -> &mut Self {
        self.tokens.push((id, bytes, TokenKind::Normal));
        self
    }

    /// A special token with its text (the text is kept for display only).
    pub fn add_special_token(&mut self, id: u32, text: Vec<u8>) -> &mut Self {
        self.tokens.push((id, text, TokenKind::Special));
        self
    }

    /// Mark an already added (or absent) id as special.
    pub fn mark_special(&mut self, id: u32) -> &mut Self {
        self.special_ids.push(id);
        self
    }

    /// Mark an id as end-of-sequence (it becomes special too).
    pub fn mark_eos(&mut self, id: u32) -> &mut Self {
        self.eos_ids.push(id);
        self
    }

    /// Mark as EOS the special token whose text is `text`; an error if there is none.
    pub fn mark_eos_by_text(&mut self, text: &str) -> Result<&mut Self> {
        let id = self
            .tokens
            .iter()
            .find(|(_, bytes, _)| bytes.as_slice() == text.as_bytes())
            .map(|(id, _, _)| *id)
            .ok_or_else(|| {
                ConstraintError::InvalidVocabulary(format!("no token with text {text:?} to mark as EOS"))
            })?;
        Ok(self.mark_eos(id))
    }

    /// Pad the vocabulary to at least `size` ids (models often have more embedding rows
    /// than tokens); the extra ids are never allowed.
    pub fn min_size(&mut self, size: usize) -> &mut Self {
        self.min_size = size;
        self
    }

    pub fn build(&self) -> Result<Vocabulary> {
        let max_id = self
            .tokens
            .iter()
            .map(|(id, _, _)| *id as usize + 1)
            .chain(self.special_ids.iter().map(|&id| id as usize + 1))
            .chain(self.eos_ids.iter().map(|&id| id as usize + 1))
            .max()
            .unwrap_or(0);
        let size = max_id.max(self.min_size);
        if size > MAX_VOCAB_SIZE {
            // A stray huge id (a corrupt file) would otherwise allocate gigabytes.
            return Err(ConstraintError::InvalidVocabulary(format!(
                "{size} token ids is implausibly many (at most {MAX_VOCAB_SIZE})"
            )));
        }
        if self.eos_ids.is_empty() {
            return Err(ConstraintError::InvalidVocabulary(
                "no EOS token id given: a constrained document could never end".into(),
            ));
        }
        let mut kinds = vec![TokenKind::Absent; size];
        let mut texts: Vec<&[u8]> = vec![&[]; size];
        for (id, bytes, kind) in &self.tokens {
            let slot = &mut kinds[*id as usize];
            if *slot != TokenKind::Absent {
                return Err(ConstraintError::InvalidVocabulary(format!("token id {id} is defined twice")));
            }
            *slot = *kind;
            if bytes.len() > MAX_TOKEN_BYTES {
                return Err(ConstraintError::InvalidVocabulary(format!(
                    "token id {id} is {} bytes long (at most {MAX_TOKEN_BYTES})",
                    bytes.len()
                )));
            }
            texts[*id as usize] = bytes;
        }
        for &id in &self.special_ids {
            kinds[id as usize] = TokenKind::Special;
        }
        for &id in &self.eos_ids {
            kinds[id as usize] = TokenKind::Eos;
        }
        let total: usize = texts.iter().map(|t| t.len()).sum();
        if total > u32::MAX as usize {
            return Err(ConstraintError::InvalidVocabulary("token bytes exceed 4 GiB".into()));
        }
        let mut bytes = Vec::with_capacity(total);
        let mut offsets = Vec::with_capacity(size + 1);
        offsets.push(0);
        for text in &texts {
            bytes.extend_from_slice(text);
            offsets.push(bytes.len() as u32);
        }
        // Only text tokens with at least one byte go into the trie: an empty token would
        // let the model loop forever without making progress.
        let trie = TokenTrie::build(
            texts
                .iter()
                .enumerate()
                .filter(|(id, text)| kinds[*id] == TokenKind::Normal && !text.is_empty())
                .map(|(id, text)| (id as u32, *text)),
        );
        let mut eos_ids = self.eos_ids.clone();
        eos_ids.sort_unstable();
        eos_ids.dedup();
        Ok(Vocabulary {
            kinds,
            bytes,
            offsets,
            eos_ids,
            trie,
            loop_indexes: LoopIndexCache::default(),
            by_length: Default::default(),
            long_trie: Default::default(),
        })
    }
}
