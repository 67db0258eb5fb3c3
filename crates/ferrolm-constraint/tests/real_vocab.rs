//! Mask soundness on a real vocabulary. Ignored by default: it needs a tiktoken file,
//! e.g. `cl100k_base.tiktoken` from the `bpe-openai` package (gunzipped):
//!
//! ```text
//! FERROLM_TIKTOKEN_FILE=path/to/cl100k_base.tiktoken cargo test --release -- --ignored
//! ```

use std::sync::Arc;

use ferrolm_constraint::tokenizer_files::from_tiktoken;
use ferrolm_constraint::{Grammar, Matcher, TokenKind, Vocabulary, DEAD};

/// The vocabulary of `FERROLM_TIKTOKEN_FILE`; `None` (saying so) when it is not set.
fn load() -> Option<Arc<Vocabulary>> {
    let Ok(path) = std::env::var("FERROLM_TIKTOKEN_FILE") else {
        eprintln!("FERROLM_TIKTOKEN_FILE not set; skipping");
        return None;
    };
    let text = std::fs::read_to_string(path).expect("readable tiktoken file");
    let mut builder = from_tiktoken(&text).unwrap();
    let eos = text.lines().count() as u32;
    builder.add_special_token(eos, b"<|endoftext|>".to_vec()).mark_eos(eos);
    Some(Arc::new(builder.build().unwrap()))
}

#[test]
#[ignore = "needs FERROLM_TIKTOKEN_FILE"]
fn trie_mask_equals_brute_force_on_a_real_vocabulary() {
    let Some(vocab) = load() else { return };
    let cases = [
        (r#"\{"name":"[^"\\]{0,30}","age":[0-9]{1,3}\}"#, r#"{"name":"Grace Hopper","age":85}"#),
        (r"[^\n]*\n", "Über naïve café — 日本語のテキスト\n"),
        (r"(yes|no|maybe)", "maybe"),
    ];
    for (pattern, document) in cases {
        let grammar = Grammar::from_regex(vocab.clone(), pattern).unwrap();
        let dfa = grammar.dfa();
        let mut matcher = Matcher::new(grammar.clone());
        let mut mask = vec![0u32; vocab.bitmask_words()];
        for (i, &byte) in document.as_bytes().iter().enumerate() {
            let state = dfa.run(dfa.start(), &document.as_bytes()[..i]);
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            for id in 0..vocab.size() as u32 {
                let expected = match vocab.kind(id).unwrap() {
                    TokenKind::Normal => dfa.run(state, vocab.token_bytes(id).unwrap()) != DEAD,
                    TokenKind::Eos => dfa.is_accepting(state),
                    _ => false,
                };
                let got = mask[id as usize / 32] >> (id % 32) & 1 == 1;
                assert_eq!(
                    got,
                    expected,
                    "{pattern} after {:?}: token {id}",
                    String::from_utf8_lossy(&document.as_bytes()[..i])
                );
            }
            assert!(matcher.accept_bytes(&[byte]));
        }
        assert!(matcher.can_end());
    }
}

#[test]
#[ignore = "needs FERROLM_TIKTOKEN_FILE"]
fn loop_index_masks_equal_full_walks_on_a_real_vocabulary() {
    let Some(vocab) = load() else { return };
    let schema = r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array",
        "items":{"type":"string","format":"email"}},"c":{"type":"number"},
        "d":{"type":"string","maxLength":60},"e":{"type":"string","minLength":3}},"required":["a"]}"#;
    let grammar = Grammar::from_json_schema(vocab.clone(), schema, &Default::default()).unwrap();
    let (mut fast, mut full) = (vec![0u32; vocab.bitmask_words()], vec![0u32; vocab.bitmask_words()]);
    for state in 1..grammar.dfa().num_states() as u32 {
        grammar.compute_mask(state, &mut fast).unwrap();
        grammar.compute_mask_by_full_walk(state, &mut full).unwrap();
        assert_eq!(fast, full, "state {state}");
    }
}

#[test]
#[ignore = "needs FERROLM_TIKTOKEN_FILE"]
fn recursive_masks_equal_trying_every_token_on_a_real_vocabulary() {
    let Some(vocab) = load() else { return };
    // Values of any type, then strings of counted length inside them (their states
    // simulate the string loop rather than sit in it).
    let counted = r#"{"minLength":2,"maxLength":40}"#;
    let cases = [
        (
            Grammar::json_value(vocab.clone(), &Default::default()).unwrap(),
            r#"{"a":[1,{"b":[[true],null]}],"c":"dé\"f","d":-2.5e3}"#,
        ),
        (
            Grammar::from_json_schema(vocab.clone(), counted, &Default::default()).unwrap(),
            r#"["ab",{"k":"dé\"fghijklmnopqrstuvwxyz"}]"#,
        ),
    ];
    for (grammar, document) in cases {
        let mut matcher = Matcher::new(grammar);
        let mut mask = vec![0u32; vocab.bitmask_words()];
        for &byte in document.as_bytes() {
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            for id in 0..vocab.size() as u32 {
                let got = mask[id as usize / 32] >> (id % 32) & 1 == 1;
                assert_eq!(
                    got,
                    matcher.is_token_allowed(id),
                    "token {id} at depth {}",
                    matcher.stack_depth()
                );
            }
            assert!(matcher.accept_bytes(&[byte]), "{document}");
        }
        assert!(matcher.can_end());
    }
}

/// An open object whose member names are longer than 32 bytes, as in GitHub's and
/// detekt's schemas: the states of the name trie simulate the string loop at every
/// depth (proven by the first search and remembered for the others), so their masks
/// skip the walk of the long tokens. Every mask along the document equals trying every
/// token.
#[test]
#[ignore = "needs FERROLM_TIKTOKEN_FILE"]
fn open_object_name_masks_equal_trying_every_token_on_a_real_vocabulary() {
    let Some(vocab) = load() else { return };
    let schema = r#"{"type":"object","properties":{
        "allowedPatternsForUndocumentedPublicProperties":{"type":"string"},
        "allowedPatternsForUndocumentedPublicFunctions":{"type":"object","properties":{
            "ignoreOverriddenFunctionsInInterfacesAndClasses":{"type":"boolean"}}},
        "active":{"type":"boolean"}},
        "additionalProperties":{"type":["string","object"]}}"#;
    let grammar = Grammar::from_json_schema(vocab.clone(), schema, &Default::default()).unwrap();
    let document = concat!(
        r#"{"allowedPatternsForUndocumentedPublicFunctions":{"ignoreOverriddenFunctionsInInterfacesAndClasses":true,"#,
        r#""allowedPatternsForUndocumentedPublicFunctionsToo":"x"},"active":false,"#,
        r#""allowedPatternsForUndocumentedPublicPropertiesAsWell":{"a":"====================================="}}"#
    );
    let mut matcher = Matcher::new(grammar);
    let mut mask = vec![0u32; vocab.bitmask_words()];
    for &byte in document.as_bytes() {
        matcher.fill_next_token_bitmask(&mut mask).unwrap();
        for id in 0..vocab.size() as u32 {
            let got = mask[id as usize / 32] >> (id % 32) & 1 == 1;
            assert_eq!(got, matcher.is_token_allowed(id), "token {id} at depth {}", matcher.stack_depth());
        }
        assert!(matcher.accept_bytes(&[byte]), "{document}");
    }
    assert!(matcher.can_end());
}
