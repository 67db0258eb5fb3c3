//! Loaders that turn tokenizer files into a [`VocabularyBuilder`]: tiktoken's
//! `base64 rank` lines and Hugging Face `tokenizer.json` (byte-level BPE with the GPT-2
//! byte-to-unicode alphabet, or SentencePiece `▁` with `<0x..>` byte fallback).
//!
//! The caller still marks EOS ids (tokenizer files do not say which ids end a turn)
//! before calling `build`.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::Value;

use crate::error::{ConstraintError, Result};
use crate::vocab::VocabularyBuilder;

/// Read a tiktoken file's text: one `base64(token bytes) rank` per line. Special tokens
/// are not in these files; add them with [`VocabularyBuilder::add_special_token`].
pub fn from_tiktoken(text: &str) -> Result<VocabularyBuilder> {
    let error = |line: usize, message: String| ConstraintError::TokenizerFile {
        format: "tiktoken",
        line: Some(line),
        message,
    };
    let mut builder = VocabularyBuilder::new();
    for (index, line) in text.lines().enumerate() {
        let line_number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(encoded), Some(rank), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(error(line_number, "expected `base64 rank`".into()));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| error(line_number, format!("bad base64 {encoded:?}: {e}")))?;
        let rank: u32 = rank.parse().map_err(|_| error(line_number, format!("bad rank {rank:?}")))?;
        builder.add_token(rank, bytes);
    }
    Ok(builder)
}

/// How a `tokenizer.json` spells bytes in its token strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2 byte-level: every byte is one printable char (`Ġ` is the space byte).
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xAB>` is the raw byte 0xAB, the rest is UTF-8.
    Metaspace,
}

/// Read a Hugging Face `tokenizer.json`. Entries of `added_tokens` marked `special`
/// become special tokens (they never match grammar bytes); the others (`<think>`,
/// `</think>`, `<tool_call>` in some models) are text: decoding keeps their content, so
/// a grammar can match it (a segment trigger such as `</think>` needs this).
pub fn from_hf_tokenizer_json(text: &str) -> Result<VocabularyBuilder> {
    let root: Value = serde_json::from_str(text).map_err(|e| hf_error(format!("not JSON: {e}")))?;
    let model = root.get("model").ok_or_else(|| hf_error("no `model` section".into()))?;
    let spelling = detect_spelling(&root)?;
    let pieces = model_pieces(model)?;

    // Added tokens override model entries with the same id.
    let mut added: BTreeMap<u32, (Vec<u8>, bool)> = BTreeMap::new();
    if let Some(list) = root.get("added_tokens").and_then(Value::as_array) {
        for entry in list {
            let id = entry.get("id").and_then(Value::as_u64);
            let content = entry.get("content").and_then(Value::as_str);
            let (Some(id), Some(content)) = (id, content) else {
                return Err(hf_error(format!("added token without id/content: {entry}")));
            };
            let id = u32::try_from(id).map_err(|_| hf_error(format!("token id {id} too large")))?;
            // Absent `special` counts as special: the safe side for control tokens.
            let special = entry.get("special").and_then(Value::as_bool).unwrap_or(true);
            added.insert(id, (content.as_bytes().to_vec(), special));
        }
    }

    let mut builder = VocabularyBuilder::new();
    for (id, piece) in pieces {
        if added.contains_key(&id) {
            continue;
        }
        let bytes = match spelling {
            Spelling::ByteLevel => decode_byte_level(piece)
                .ok_or_else(|| hf_error(format!("token {id} {piece:?} is not byte-level")))?,
            Spelling::Metaspace => decode_metaspace(piece),
        };
        builder.add_token(id, bytes);
    }
    for (id, (text, special)) in added {
        if special {
            builder.add_special_token(id, text);
        } else {
            builder.add_token(id, text);
        }
    }
    Ok(builder)
}

fn hf_error(message: String) -> ConstraintError {
    ConstraintError::TokenizerFile { format: "tokenizer.json", line: None, message }
}

/// `(id, token string)` for each entry of the model's vocabulary.
fn model_pieces(model: &Value) -> Result<Vec<(u32, &str)>> {
    let kind = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
    let vocab = model.get("vocab").ok_or_else(|| hf_error("model has no `vocab`".into()))?;
    let to_id = |id: Option<u64>| {
        id.and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| hf_error("token id is not a small non-negative integer".into()))
    };
    match (kind, vocab) {
        ("BPE" | "WordLevel", Value::Object(map)) => {
            map.iter().map(|(piece, id)| Ok((to_id(id.as_u64())?, piece.as_str()))).collect()
        }
        ("Unigram", Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(id, entry)| {
                let piece = entry
                    .get(0)
                    .and_then(Value::as_str)
                    .ok_or_else(|| hf_error(format!("Unigram entry {id} is not [piece, score]")))?;
                Ok((to_id(Some(id as u64))?, piece))
            })
            .collect(),
        (other, _) => Err(hf_error(format!(
            "model type {other:?} (with this vocab layout) is not supported; expected BPE or Unigram"
        ))),
    }
}

/// Byte-level if a ByteLevel decoder or pre-tokenizer is present; SentencePiece if a
/// Metaspace/`▁` replacement or byte fallback is; otherwise we cannot know the bytes.
fn detect_spelling(root: &Value) -> Result<Spelling> {
    let sections = ["decoder", "pre_tokenizer"].map(|key| root.get(key).unwrap_or(&Value::Null));
    if sections.iter().any(|s| mentions(s, &|v| v.get("type").and_then(Value::as_str) == Some("ByteLevel"))) {
        return Ok(Spelling::ByteLevel);
    }
    let is_metaspace = |v: &Value| {
        v.get("type").and_then(Value::as_str) == Some("Metaspace")
            || v.get("type").and_then(Value::as_str) == Some("ByteFallback")
            || (v.get("type").and_then(Value::as_str) == Some("Replace")
                && v.pointer("/pattern/String").and_then(Value::as_str) == Some("\u{2581}"))
    };
    let byte_fallback = root.pointer("/model/byte_fallback").and_then(Value::as_bool).unwrap_or(false);
    if byte_fallback || sections.iter().any(|s| mentions(s, &is_metaspace)) {
        return Ok(Spelling::Metaspace);
    }
    Err(hf_error(
        "cannot tell how token strings map to bytes: expected a ByteLevel or Metaspace \
         (SentencePiece) decoder"
            .into(),
    ))
}

/// Whether `value` or any component nested in it (Sequence decoders) satisfies `test`.
fn mentions(value: &Value, test: &dyn Fn(&Value) -> bool) -> bool {
    match value {
        Value::Object(map) => test(value) || map.values().any(|v| mentions(v, test)),
        Value::Array(items) => items.iter().any(|v| mentions(v, test)),
        _ => false,
    }
}

/// GPT-2's byte-to-unicode table inverted: printable Latin-1 bytes stand for
/// themselves, the other 68 bytes were shifted to U+0100.. in byte order.
fn byte_level_char_to_byte(c: char) -> Option<u8> {
    let is_printable = |b: u32| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let code = c as u32;
    if code < 0x100 {
        return is_printable(code).then_some(code as u8);
    }
    let shifted = (code - 0x100) as usize;
    (0u32..256).filter(|&b| !is_printable(b)).nth(shifted).map(|b| b as u8)
}

fn decode_byte_level(piece: &str) -> Option<Vec<u8>> {
    piece.chars().map(byte_level_char_to_byte).collect()
}

fn decode_metaspace(piece: &str) -> Vec<u8> {
    if let Some(byte) = parse_byte_fallback(piece) {
        return vec![byte];
    }
    piece.replace('\u{2581}', " ").into_bytes()
}

/// `<0xAB>` -> 0xAB.
fn parse_byte_fallback(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_round_trips_all_bytes() {
        let mut seen = [false; 256];
        for code in 0u32..0x200 {
            if let Some(b) = char::from_u32(code).and_then(byte_level_char_to_byte) {
                assert!(!seen[b as usize], "byte {b} mapped twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(byte_level_char_to_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_char_to_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_char_to_byte('a'), Some(b'a'));
    }

    #[test]
    fn metaspace_pieces() {
        assert_eq!(decode_metaspace("▁Hello"), b" Hello");
        assert_eq!(decode_metaspace("<0x0A>"), b"\n");
        assert_eq!(decode_metaspace("<0x0A"), b"<0x0A");
    }
}
