//! Bad input gives a typed error (or `false`), never a panic.

mod common;

use common::small_vocab;
use ferrolm_constraint::tokenizer_files::{from_hf_tokenizer_json, from_tiktoken};
use ferrolm_constraint::{
    fill_next_token_bitmask_batch, ConstraintError, Grammar, Matcher, RegexOptions, Vocabulary,
};

#[test]
fn invalid_regexes_are_typed_errors() {
    let (vocab, _) = small_vocab(&[]);
    for pattern in ["(", "a{2,1}", "[z-a]", r"\p{NoSuchClass}", "a)|(b"] {
        let err = Grammar::from_regex(vocab.clone(), pattern).unwrap_err();
        assert!(matches!(err, ConstraintError::InvalidRegex { .. }), "{pattern}: {err}");
    }
    // Unicode word boundaries cannot be expressed by a DFA.
    let err = Grammar::from_regex(vocab.clone(), r"\bfoo\b").unwrap_err();
    assert!(matches!(err, ConstraintError::InvalidRegex { .. }), "{err}");
}

#[test]
fn oversized_regex_is_grammar_too_large() {
    let (vocab, _) = small_vocab(&[]);
    let options = RegexOptions { max_automaton_bytes: 1 << 16, ..RegexOptions::default() };
    let err = Grammar::from_regex_with(vocab, r"\w{200}", &options).unwrap_err();
    assert!(matches!(err, ConstraintError::GrammarTooLarge { .. }), "{err}");
}

#[test]
fn bitmask_size_mismatch_is_an_error() {
    let (vocab, _) = small_vocab(&[]);
    let matcher = Matcher::new(Grammar::from_regex(vocab.clone(), "a+").unwrap());
    let words = vocab.bitmask_words();
    for len in [0, words - 1, words + 1] {
        let err = matcher.fill_next_token_bitmask(&mut vec![0; len]).unwrap_err();
        assert_eq!(err, ConstraintError::BitmaskSize { expected: words, got: len });
    }
    let err = matcher.grammar().compute_mask(0, &mut vec![0; words + 1]).unwrap_err();
    assert_eq!(err, ConstraintError::BitmaskSize { expected: words, got: words + 1 });
    let mut mask = vec![u32::MAX; words];
    matcher.grammar().compute_mask(u32::MAX, &mut mask).unwrap();
    assert!(mask.iter().all(|&w| w == 0), "an unknown state allows nothing");
    let err = fill_next_token_bitmask_batch(&[&matcher, &matcher], &mut vec![0; words]).unwrap_err();
    assert_eq!(err, ConstraintError::BitmaskSize { expected: 2 * words, got: words });
}

#[test]
fn rollback_past_the_start_is_an_error_and_changes_nothing() {
    let (vocab, _) = small_vocab(&[]);
    let mut matcher = Matcher::new(Grammar::from_regex(vocab, "a+").unwrap());
    assert!(matcher.accept_str("aa"));
    let err = matcher.rollback(2).unwrap_err();
    assert_eq!(err, ConstraintError::RollbackTooFar { requested: 2, available: 1 });
    assert!(matcher.can_end());
}

#[test]
fn unknown_special_and_unfit_tokens_are_refused_without_change() {
    let (vocab, eos) = small_vocab(&[]);
    let mut matcher = Matcher::new(Grammar::from_regex(vocab.clone(), "a+").unwrap());
    let special = vocab.find_token(b"<|special|>").unwrap();
    assert!(!matcher.accept_token(vocab.size() as u32));
    assert!(!matcher.accept_token(u32::MAX));
    assert!(!matcher.accept_token(special));
    assert!(!matcher.accept_token(eos), "EOS before the document is complete");
    assert!(!matcher.accept_token(b'b' as u32));
    assert_eq!(matcher.num_steps(), 0);
    assert!(matcher.accept_token(b'a' as u32));
    assert!(matcher.accept_token(eos) && matcher.is_ended());
    assert!(matcher.is_token_allowed(eos) && matcher.accept_token(eos), "EOS again after the end: a no-op");
    assert!(!matcher.accept_token(b'a' as u32));
    assert_eq!(matcher.num_steps(), 2);
}

#[test]
fn bad_vocabularies_are_typed_errors() {
    let err = Vocabulary::new(vec![b"a".to_vec()], &[], &[]).unwrap_err();
    assert!(matches!(err, ConstraintError::InvalidVocabulary(_)), "{err}");
    let mut builder = ferrolm_constraint::VocabularyBuilder::new();
    builder.add_token(0, b"a".to_vec()).add_token(0, b"b".to_vec()).mark_eos(1);
    assert!(matches!(builder.build().unwrap_err(), ConstraintError::InvalidVocabulary(_)));
    assert!(builder.mark_eos_by_text("</s>").is_err());
    let huge = from_tiktoken("YQ== 4000000000\n").unwrap().mark_eos(0).build().unwrap_err();
    assert!(matches!(huge, ConstraintError::InvalidVocabulary(_)), "{huge}");
}

#[test]
fn bad_tiktoken_lines_name_the_line() {
    for (text, line) in [("YQ== 0\nnot-base64! 1\n", 2), ("YQ== 0\nYg==\n", 2), ("YQ== x\n", 1)] {
        match from_tiktoken(text).unwrap_err() {
            ConstraintError::TokenizerFile { line: Some(l), .. } => assert_eq!(l, line, "{text:?}"),
            other => panic!("unexpected {other}"),
        }
    }
}

#[test]
fn bad_tokenizer_json_is_a_typed_error() {
    let cases = [
        "not json",
        "{}",
        r#"{"model": {"type": "WordPiece", "vocab": {"a": 0}}, "decoder": {"type": "WordPiece"}}"#,
        r#"{"model": {"type": "BPE", "vocab": {"a": 0}}}"#,
        r#"{"model": {"type": "BPE", "vocab": {"a": -1}}, "decoder": {"type": "ByteLevel"}}"#,
        r#"{"model": {"type": "BPE", "vocab": {"\u4e2d": 0}}, "decoder": {"type": "ByteLevel"}}"#,
    ];
    for text in cases {
        let err = from_hf_tokenizer_json(text).unwrap_err();
        assert!(matches!(err, ConstraintError::TokenizerFile { .. }), "{text}: {err}");
    }
}
