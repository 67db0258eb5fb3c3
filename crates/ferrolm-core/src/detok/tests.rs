use super::*;
use proptest::prelude::*;

/// Byte-level vocabulary: every single byte, a few multi-byte tokens, one special.
fn vocab() -> TokenTable {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for t in ["hello", " world", "STOP", "ST", "OP", "é", "\u{1F600}", "<eos>"] {
        tokens.push(t.as_bytes().to_vec());
    }
    let eos = tokens.len() as u32 - 1;
    TokenTable { tokens, special: vec![eos] }
}

fn id(v: &TokenTable, text: &str) -> u32 {
    v.tokens.iter().position(|t| t == text.as_bytes()).unwrap() as u32
}

fn run(v: &TokenTable, stops: StopConditions, tokens: &[u32]) -> (String, Vec<String>, Option<StopReason>) {
    let mut d = Detokenizer::new(stops);
    let mut deltas = Vec::new();
    for &t in tokens {
        let step = d.step(v, t, true, false).unwrap();
        deltas.push(step.delta);
        if step.stop.is_some() {
            return (deltas.concat(), deltas, step.stop);
        }
    }
    deltas.push(d.flush());
    (deltas.concat(), deltas, None)
}

#[test]
fn multibyte_characters_are_never_split() {
    let v = vocab();
    let smile = "\u{1F600}".as_bytes().iter().map(|&b| b as u32).collect::<Vec<_>>();
    let (text, deltas, _) = run(&v, StopConditions::default(), &smile);
    assert_eq!(text, "\u{1F600}");
    assert_eq!(deltas, vec!["", "", "", "\u{1F600}", ""]);
}

#[test]
fn stop_string_across_tokens_is_caught_and_never_leaks() {
    let v = vocab();
    let stops = StopConditions { stop_strings: vec!["STOP".into()], ..Default::default() };
    let tokens = [id(&v, "hello"), id(&v, "ST"), id(&v, "OP"), id(&v, " world")];
    let (text, deltas, stop) = run(&v, stops.clone(), &tokens);
    assert_eq!(text, "hello");
    assert_eq!(deltas, vec!["hello", "", ""]);
    assert_eq!(stop, Some(StopReason::String("STOP".into())));
    let include = StopConditions { include_stop_str: true, ..stops };
    assert_eq!(run(&v, include, &tokens).0, "helloSTOP");
}

#[test]
fn held_back_prefix_is_released_when_it_does_not_complete() {
    let v = vocab();
    let stops = StopConditions { stop_strings: vec!["STOP".into()], ..Default::default() };
    let (text, deltas, stop) = run(&v, stops, &[id(&v, "ST"), id(&v, "hello")]);
    assert_eq!(stop, None);
    assert_eq!(text, "SThello");
    assert_eq!(deltas[0], "");
}

#[test]
fn stop_token_ids_and_special_tokens() {
    let v = vocab();
    let eos = id(&v, "<eos>");
    let stops =
        StopConditions { stop_token_ids: vec![b'x' as u32], skip_special_tokens: true, ..Default::default() };
    let (text, _, stop) = run(&v, stops.clone(), &[id(&v, "hello"), eos, b'x' as u32, b'y' as u32]);
    assert_eq!(text, "hello");
    assert_eq!(stop, Some(StopReason::Token(b'x' as u32)));
    let shown = StopConditions { skip_special_tokens: false, ..stops };
    assert_eq!(run(&v, shown, &[eos, b'x' as u32]).0, "<eos>");
}

#[test]
fn stops_are_ignored_until_allowed() {
    let v = vocab();
    let stops = StopConditions { stop_strings: vec!["STOP".into()], ..Default::default() };
    let mut d = Detokenizer::new(stops);
    let s = d.step(&v, id(&v, "STOP"), false, false).unwrap();
    assert_eq!((s.delta.as_str(), s.stop), ("STOP", None));
}

#[test]
fn unknown_token_is_an_error() {
    let v = vocab();
    let mut d = Detokenizer::new(StopConditions::default());
    assert_eq!(d.step(&v, 10_000, true, false), Err(UnknownToken(10_000)));
}

proptest! {
    /// Without stops, the deltas concatenate to the lossy decode of all bytes.
    #[test]
    fn deltas_concatenate_to_full_decode(tokens in prop::collection::vec(0u32..263, 0..60)) {
        let v = vocab();
        let bytes: Vec<u8> = tokens.iter().flat_map(|&t| v.tokens[t as usize].clone()).collect();
        let stops = StopConditions::default();
        let (text, _, _) = run(&v, stops, &tokens);
        // every delta is a String (valid UTF-8 by type); their join is the one-shot decode
        prop_assert_eq!(text, String::from_utf8_lossy(&bytes).into_owned());
    }

    /// With a stop string, the output is exactly the text before its first occurrence,
    /// whichever of several stop strings completes first.
    #[test]
    fn stop_output_is_text_before_first_match(tokens in prop::collection::vec(prop::sample::select(vec![b'S' as u32, b'T' as u32, b'O' as u32, b'P' as u32, b'a' as u32, 256 + 2, 256 + 3, 256 + 4]), 0..40)) {
        let v = vocab();
        let full: String = tokens.iter().map(|&t| String::from_utf8(v.tokens[t as usize].clone()).unwrap()).collect();
        let stops = StopConditions { stop_strings: vec!["STOP".into(), "PP".into()], ..Default::default() };
        let (text, _, stop) = run(&v, stops, &tokens);
        let first = ["STOP", "PP"].iter().filter_map(|s| full.find(s).map(|i| (i + s.len(), i))).min();
        match first {
            Some((_, start)) => {
                prop_assert!(stop.is_some());
                prop_assert_eq!(text, full[..start].to_string());
            }
            None => {
                prop_assert!(stop.is_none());
                prop_assert_eq!(text, full);
            }
        }
    }
}
