//! Loading vocabularies from tokenizer files.

use std::sync::Arc;

use ferrolm_constraint::tokenizer_files::{from_hf_tokenizer_json, from_tiktoken};
use ferrolm_constraint::{Grammar, Matcher, TokenKind};

#[test]
fn tiktoken_lines_become_tokens() {
    // "a", "b", " ab", and a lone 0xE4 byte (a partial UTF-8 character).
    let text = "YQ== 0\nYg== 1\nIGFi 2\n5A== 3\n";
    let mut builder = from_tiktoken(text).unwrap();
    builder.add_special_token(4, b"<|endoftext|>".to_vec()).mark_eos(4);
    let vocab = builder.build().unwrap();
    assert_eq!(vocab.size(), 5);
    assert_eq!(vocab.token_bytes(2), Some(&b" ab"[..]));
    assert_eq!(vocab.token_bytes(3), Some(&[0xE4u8][..]));
    assert_eq!(vocab.kind(4), Some(TokenKind::Eos));
    assert_eq!(vocab.eos_ids(), &[4]);
}

#[test]
fn byte_level_bpe_tokenizer_json() {
    let json = r#"{
        "added_tokens": [{"id": 4, "content": "<|endoftext|>", "special": true},
                         {"id": 5, "content": "<think>", "special": false}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"a": 0, "Ġa": 1, "Ċ": 2, "Ã©": 3, "<|endoftext|>": 4}, "merges": []}
    }"#;
    let mut builder = from_hf_tokenizer_json(json).unwrap();
    builder.mark_eos_by_text("<|endoftext|>").unwrap();
    let vocab = builder.build().unwrap();
    assert_eq!(vocab.token_bytes(1), Some(&b" a"[..]));
    assert_eq!(vocab.token_bytes(2), Some(&b"\n"[..]));
    assert_eq!(vocab.token_bytes(3), Some("é".as_bytes()));
    assert_eq!(vocab.kind(4), Some(TokenKind::Eos));
    assert_eq!(vocab.kind(5), Some(TokenKind::Normal), "a non-special added token is text");
    assert_eq!(vocab.token_bytes(5), Some(&b"<think>"[..]));
}

#[test]
fn sentencepiece_tokenizer_json_with_byte_fallback() {
    let json = r#"{
        "added_tokens": [{"id": 0, "content": "<unk>", "special": true},
                         {"id": 1, "content": "<s>", "special": true},
                         {"id": 2, "content": "</s>", "special": true}],
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "byte_fallback": true,
                  "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xE4>": 4, "▁hi": 5, "中": 6}}
    }"#;
    let mut builder = from_hf_tokenizer_json(json).unwrap();
    builder.mark_eos(2);
    let vocab = Arc::new(builder.build().unwrap());
    assert_eq!(vocab.token_bytes(3), Some(&b"\n"[..]));
    assert_eq!(vocab.token_bytes(4), Some(&[0xE4u8][..]));
    assert_eq!(vocab.token_bytes(5), Some(&b" hi"[..]));
    assert_eq!(vocab.kind(0), Some(TokenKind::Special));

    let grammar = Grammar::from_regex(vocab, r" hi\n").unwrap();
    let mut matcher = Matcher::new(grammar);
    assert!(!matcher.accept_token(1), "special tokens never match grammar bytes");
    assert!(matcher.accept_token(5) && matcher.accept_token(3) && matcher.accept_token(2));
}

#[test]
fn unigram_tokenizer_json() {
    let json = r#"{
        "decoder": {"type": "Metaspace", "replacement": "▁"},
        "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["▁x", -1.0], ["y", -2.0]]}
    }"#;
    let mut builder = from_hf_tokenizer_json(json).unwrap();
    builder.mark_eos(0);
    let vocab = builder.build().unwrap();
    assert_eq!(vocab.token_bytes(1), Some(&b" x"[..]));
    assert_eq!(vocab.token_bytes(2), Some(&b"y"[..]));
}
