//! The grammar cache: one compilation per source, errors cached, a time limit.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::small_vocab;
use ferrolm_constraint::json_schema::JsonSchemaOptions;
use ferrolm_constraint::{ConstraintError, GrammarCache, GrammarSource, Matcher};

#[test]
fn same_source_gives_the_same_grammar() {
    let (vocab, _) = small_vocab(&[]);
    let cache = GrammarCache::new(vocab, 8, Duration::from_secs(30));
    let a = cache.get_or_compile(&GrammarSource::Regex("a+".into())).unwrap();
    let b = cache.get_or_compile(&GrammarSource::Regex("a+".into())).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let schema = GrammarSource::JsonSchema(r#"{"type":"integer"}"#.into(), JsonSchemaOptions::default());
    let c = cache.get_or_compile(&schema).unwrap();
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(cache.len(), 2);
}

#[test]
fn errors_are_cached_and_typed() {
    let (vocab, _) = small_vocab(&[]);
    let cache = GrammarCache::new(vocab, 8, Duration::from_secs(30));
    let source = GrammarSource::Regex("(".into());
    for _ in 0..2 {
        let err = cache.get_or_compile(&source).unwrap_err();
        assert!(matches!(err, ConstraintError::InvalidRegex { .. }));
    }
    assert_eq!(cache.len(), 1);
}

#[test]
fn choices_match_exactly_one_option() {
    let (vocab, eos) = small_vocab(&[]);
    let cache = GrammarCache::new(vocab, 8, Duration::from_secs(30));
    let grammar =
        cache.get_or_compile(&GrammarSource::Choice(vec!["yes".into(), "no".into(), "a|b".into()])).unwrap();
    let mut matcher = Matcher::new(grammar);
    assert!(matcher.accept_str("a|"));
    assert_eq!(matcher.forced_bytes(), b"b");
    assert!(matcher.accept_str("b") && matcher.accept_token(eos));
}

#[test]
fn json_object_source() {
    let (vocab, eos) = small_vocab(&[]);
    let cache = GrammarCache::new(vocab, 8, Duration::from_secs(30));
    let grammar = cache.get_or_compile(&GrammarSource::JsonObject(JsonSchemaOptions::default())).unwrap();
    let mut matcher = Matcher::new(grammar);
    assert!(!matcher.accept_str("[") && matcher.accept_str(r#"{"a":[{}]}"#) && matcher.accept_token(eos));
}

#[test]
fn slow_compilation_times_out() {
    let (vocab, _) = small_vocab(&[]);
    let cache = GrammarCache::new(vocab, 8, Duration::from_millis(1));
    // Big enough to take well over a millisecond to determinize, small enough to end.
    let err = cache.get_or_compile(&GrammarSource::Regex(r"[a-z]{1,30}x[a-z]{12}".into())).unwrap_err();
    assert!(err.to_string().contains("longer than"), "{err}");
}

/// Grammars and vocabularies are shared across threads (the bindings release the GIL);
/// matchers move between them.
#[test]
fn shared_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ferrolm_constraint::Vocabulary>();
    send_sync::<ferrolm_constraint::Grammar>();
    send_sync::<GrammarCache>();
    send_sync::<Matcher>();
}

#[test]
fn matchers_fill_masks_from_many_threads() {
    let (vocab, _) = small_vocab(&[b"ab".to_vec()]);
    let cache = GrammarCache::new(vocab.clone(), 8, Duration::from_secs(30));
    let grammar = cache.get_or_compile(&GrammarSource::Regex("(?:ab|c)*d".into())).unwrap();
    let expected = {
        let mut mask = vec![0u32; vocab.bitmask_words()];
        grammar.compute_mask_by_full_walk(grammar.dfa().start(), &mut mask).unwrap();
        mask
    };
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                let matcher = Matcher::new(grammar.clone());
                let mut mask = vec![0u32; vocab.bitmask_words()];
                for _ in 0..50 {
                    matcher.fill_next_token_bitmask(&mut mask).unwrap();
                    assert_eq!(mask, expected);
                }
            });
        }
    });
}
