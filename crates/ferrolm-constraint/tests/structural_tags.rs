//! Structural tags (`Grammar::tag_sequence`): several tool calls in one answer, each
//! `<tool_call>\n{json}\n</tool_call>`. Every valid sequence of calls is accepted token by
//! token (the mask agreeing with `is_token_allowed` at every step); every output a random
//! walk over the masks completes parses back into calls valid for the schema; and
//! triggers that are special tokens are taken as one token.

mod common;

use std::sync::Arc;

use common::{allowed_ids, check_mask, random_tokenization, small_vocab, Rng};
use ferrolm_constraint::json_schema::JsonSchemaOptions;
use ferrolm_constraint::{Grammar, Matcher, TagSequence, TokenKind, Vocabulary};
use proptest::prelude::*;
use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const SPECIAL: &str = "<|special|>"; // small_vocab's special token

fn vocab() -> (Arc<Vocabulary>, u32) {
    let extra: Vec<Vec<u8>> =
        ["<tool_call>", "\n</tool_call>", "{\"name\":\"", "\",\"arguments\":{", "}}", "\":\""]
            .iter()
            .map(|t| t.as_bytes().to_vec())
            .collect();
    small_vocab(&extra)
}

/// Two functions, as `call_object_schema` builds them (strings kept short so random
/// walks finish).
fn call_schema() -> Value {
    json!({"anyOf": [
        {"type": "object", "properties": {
            "name": {"const": "get_weather"},
            "arguments": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 3},
                "unit": {"enum": ["c", "f"]}},
                "required": ["city"], "additionalProperties": false}},
         "required": ["name", "arguments"], "additionalProperties": false},
        {"type": "object", "properties": {
            "name": {"const": "ping"},
            "arguments": {"type": "object", "properties": {}, "additionalProperties": false}},
         "required": ["name", "arguments"], "additionalProperties": false}]})
}

/// An independent check of one call against `call_schema`.
fn valid_call(call: &Value) -> bool {
    let Some(object) = call.as_object() else { return false };
    let Some(arguments) = call.get("arguments").and_then(Value::as_object) else { return false };
    if object.len() != 2 {
        return false;
    }
    match call.get("name").and_then(Value::as_str) {
        Some("ping") => arguments.is_empty(),
        Some("get_weather") => {
            let city_ok =
                arguments.get("city").and_then(Value::as_str).is_some_and(|c| c.chars().count() <= 3);
            let unit_ok = arguments.get("unit").is_none_or(|u| u == "c" || u == "f");
            let known = arguments.keys().all(|k| k == "city" || k == "unit");
            city_ok && unit_ok && known
        }
        _ => false,
    }
}

fn hermes(repeated: bool, begun: &str) -> TagSequence {
    TagSequence {
        begin: "<tool_call>\n".into(),
        end: "\n</tool_call>".into(),
        separator: "\n".into(),
        repeated,
        begun: begun.into(),
    }
}

fn body(vocab: &Arc<Vocabulary>) -> Arc<Grammar> {
    Grammar::from_json_schema(vocab.clone(), &call_schema().to_string(), &JsonSchemaOptions::default())
        .unwrap()
}

fn render(calls: &[Value]) -> String {
    calls.iter().map(|c| format!("<tool_call>\n{c}\n</tool_call>")).collect::<Vec<_>>().join("\n")
}

/// Feed `tokens` (checking the mask before each), then EOS.
fn accepts_tokens(grammar: &Arc<Grammar>, vocab: &Vocabulary, eos: u32, tokens: &[u32]) -> bool {
    let mut matcher = Matcher::new(grammar.clone());
    for &token in tokens {
        check_mask(&matcher, vocab);
        if !matcher.accept_token(token) {
            return false;
        }
    }
    check_mask(&matcher, vocab);
    matcher.accept_token(eos)
}

fn accepts(grammar: &Arc<Grammar>, vocab: &Vocabulary, eos: u32, text: &str, rng: &mut Rng) -> bool {
    accepts_tokens(grammar, vocab, eos, &random_tokenization(vocab, text.as_bytes(), rng))
}

/// Parse `text` as `<tool_call>\n{json}\n</tool_call>` joined by `\n`: the calls, or
/// `None` if it is not of that shape.
fn parse_calls(text: &str) -> Option<Vec<Value>> {
    let mut rest = text;
    let mut calls = Vec::new();
    loop {
        rest = rest.strip_prefix("<tool_call>\n")?;
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let call = stream.next()?.ok()?;
        rest = rest[stream.byte_offset()..].strip_prefix("\n</tool_call>")?;
        calls.push(call);
        if rest.is_empty() {
            return Some(calls);
        }
        rest = rest.strip_prefix('\n')?;
    }
}

fn call_strategy() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"name": "ping", "arguments": {}})),
        ("[a-c\"\\\\é\n]{0,3}", proptest::option::of(prop_oneof![Just("c"), Just("f")])).prop_map(
            |(city, unit)| {
                let mut arguments = json!({"city": city});
                if let Some(unit) = unit {
                    arguments["unit"] = json!(unit);
                }
                json!({"name": "get_weather", "arguments": arguments})
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Completeness: any one or more valid calls, token by token (forced: the prompt wrote
    /// the first opening; auto: after free text and the trigger).
    #[test]
    fn every_sequence_of_valid_calls_is_accepted(
        calls in proptest::collection::vec(call_strategy(), 1..5),
        text in "[a-z <>/]{0,12}",
        seed in any::<u64>(),
    ) {
        prop_assume!(!text.contains(OPEN));
        let (vocab, eos) = vocab();
        let body = body(&vocab);
        let mut rng = Rng(seed);
        let rendered = render(&calls);
        let forced = Grammar::tag_sequence(&body, &hermes(true, "<tool_call>\n")).unwrap();
        prop_assert!(accepts(&forced, &vocab, eos, &rendered["<tool_call>\n".len()..], &mut rng));
        let auto = Grammar::after_trigger_with(OPEN, &Grammar::tag_sequence(&body, &hermes(true, OPEN)).unwrap(), true)
            .unwrap();
        let answer = format!("{text}{rendered}");
        prop_assert!(accepts(&auto, &vocab, eos, &answer, &mut rng));
        prop_assert!(accepts(&auto, &vocab, eos, &text, &mut rng), "auto: a plain answer");
        let once = Grammar::tag_sequence(&body, &hermes(false, "")).unwrap();
        prop_assert_eq!(accepts(&once, &vocab, eos, &rendered, &mut rng), calls.len() == 1);
    }

    /// Soundness: whatever a random walk over the masks writes, once it may end, parses
    /// into one or more calls valid for the schema.
    #[test]
    fn every_completed_output_parses_into_valid_calls(seed in any::<u64>()) {
        let (vocab, eos) = vocab();
        let grammar = Grammar::tag_sequence(&body(&vocab), &hermes(true, "")).unwrap();
        let mut rng = Rng(seed);
        let mut matcher = Matcher::new(grammar);
        let mut mask = vec![0u32; vocab.bitmask_words()];
        let mut out = Vec::new();
        for _ in 0..2000 {
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            let allowed = allowed_ids(&mask, vocab.size());
            prop_assert!(!allowed.is_empty(), "a dead end after {:?}", String::from_utf8_lossy(&out));
            // end half the time it may, so outputs hold one call or several
            let token = if allowed.contains(&eos) && rng.below(2) == 0 { eos } else { allowed[rng.below(allowed.len())] };
            prop_assert!(matcher.accept_token(token));
            if token == eos {
                break;
            }
            out.extend_from_slice(vocab.token_bytes(token).unwrap());
        }
        prop_assume!(matcher.is_ended()); // a walk stuck in a long string: nothing to check
        let text = String::from_utf8(out).expect("UTF-8");
        let calls = parse_calls(&text);
        prop_assert!(calls.is_some(), "not of the tags' shape: {text:?}");
        for call in calls.unwrap() {
            prop_assert!(valid_call(&call), "{call}");
        }
    }
}

#[test]
fn invalid_sequences_are_refused() {
    let (vocab, eos) = vocab();
    let grammar = Grammar::tag_sequence(&body(&vocab), &hermes(true, "")).unwrap();
    let mut rng = Rng(1);
    let ping = r#"{"name":"ping","arguments":{}}"#;
    assert!(accepts(&grammar, &vocab, eos, &format!("<tool_call>\n{ping}\n</tool_call>"), &mut rng));
    for bad in [
        String::new(),
        format!("<tool_call>\n{ping}"),
        format!("<tool_call>\n{ping}\n</tool_call>\n"),
        format!("<tool_call>\n{ping}\n</tool_call>text"),
        format!("<tool_call>\n{ping}\n</tool_call><tool_call>\n{ping}\n</tool_call>"),
        r#"<tool_call>
{"name":"nope","arguments":{}}
</tool_call>"#
            .to_string(),
        format!("text<tool_call>\n{ping}\n</tool_call>"),
    ] {
        assert!(!accepts(&grammar, &vocab, eos, &bad, &mut rng), "{bad:?}");
    }
}

#[test]
fn a_closing_that_could_continue_the_body_is_refused() {
    let (vocab, _) = vocab();
    let digits = Grammar::from_regex(vocab.clone(), "[0-9]+").unwrap();
    let tags = TagSequence { begin: "<".into(), end: "1".into(), ..TagSequence::default() };
    assert!(Grammar::tag_sequence(&digits, &tags).is_err());
    let tags = TagSequence { begin: "<".into(), end: ">".into(), ..TagSequence::default() };
    assert!(Grammar::tag_sequence(&digits, &tags).is_ok());
}

#[test]
fn a_special_token_trigger_opens_the_calls() {
    // `[TOOL_CALLS]`-like: the trigger is the text of a special token of the vocabulary
    let (vocab, eos) = vocab();
    let special = vocab.find_token(SPECIAL.as_bytes()).unwrap();
    assert_eq!(vocab.kind(special), Some(TokenKind::Special));
    let tags = TagSequence {
        begin: String::new(),
        end: String::new(),
        separator: "; ".into(),
        repeated: true,
        ..Default::default()
    };
    let calls = Grammar::tag_sequence(&body(&vocab), &tags).unwrap();
    let grammar = Grammar::after_trigger_with(SPECIAL, &calls, true).unwrap();
    let ping = r#"{"name":"ping","arguments":{}}"#;
    let mut rng = Rng(3);
    let mut tokens = random_tokenization(&vocab, b"some text ", &mut rng);
    tokens.push(special);
    tokens.extend(random_tokenization(&vocab, format!("{ping}; {ping}").as_bytes(), &mut rng));
    assert!(accepts_tokens(&grammar, &vocab, eos, &tokens));
    // its text spelled out opens the calls too (the output's text is the same)
    assert!(accepts(&grammar, &vocab, eos, &format!("text{SPECIAL}{ping}"), &mut rng));
    assert!(accepts(&grammar, &vocab, eos, "a plain answer", &mut rng));
    // once the calls have begun, the token is not allowed again
    let mut matcher = Matcher::new(grammar.clone());
    assert!(matcher.accept_token(special));
    assert!(!matcher.is_token_allowed(special));
    assert!(!matcher.accept_token(special));
    // other special tokens stay out of free text
    let plain = Grammar::after_trigger_with("<call>", &calls, true).unwrap();
    assert!(!Matcher::new(plain).is_token_allowed(special));
}

#[test]
fn special_token_triggers_nest() {
    // thinking that ends with a special token, then calls after another special token
    let (vocab, eos) = vocab();
    let special = vocab.find_token(SPECIAL.as_bytes()).unwrap();
    let calls = Grammar::tag_sequence(&body(&vocab), &hermes(true, OPEN)).unwrap();
    let inner = Grammar::after_trigger_with(OPEN, &calls, true).unwrap();
    let grammar = Grammar::after_trigger(SPECIAL, &inner).unwrap();
    let ping = r#"{"name":"ping","arguments":{}}"#;
    let mut rng = Rng(4);
    let mut tokens = random_tokenization(&vocab, b"thinking", &mut rng);
    tokens.push(special);
    tokens.extend(random_tokenization(
        &vocab,
        format!("answer{OPEN}\n{ping}\n</tool_call>").as_bytes(),
        &mut rng,
    ));
    assert!(accepts_tokens(&grammar, &vocab, eos, &tokens));
    let mut matcher = Matcher::new(grammar);
    assert!(matcher.accept_token(special));
    assert!(!matcher.is_token_allowed(special), "the outer trigger is passed");
    assert!(matcher.can_end(), "auto after the thinking: a plain (empty) answer");
}

#[test]
fn either_an_answer_in_the_response_format_or_calls() {
    // tool_choice auto with response_format: the answer is JSON of its schema, or calls
    let (vocab, eos) = vocab();
    // a tree of nodes: recursive rules
    let answer_schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"},
        "items": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["ok"], "additionalProperties": false,
        "$defs": {"node": {"type": "object", "properties": {
            "k": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
            "additionalProperties": false}}});
    let answer =
        Grammar::from_json_schema(vocab.clone(), &answer_schema.to_string(), &JsonSchemaOptions::default())
            .unwrap();
    assert!(answer.is_recursive());
    let calls = Grammar::tag_sequence(&body(&vocab), &hermes(true, "")).unwrap();
    let grammar = Grammar::either(&answer, &calls).unwrap();
    let mut rng = Rng(8);
    let ping = r#"{"name":"ping","arguments":{}}"#;
    for ok in [
        r#"{"ok":true}"#.to_string(),
        r#"{"ok":false,"items":[{},{"k":[{"k":[{}]}]}]}"#.to_string(),
        format!("<tool_call>\n{ping}\n</tool_call>"),
        format!("<tool_call>\n{ping}\n</tool_call>\n<tool_call>\n{ping}\n</tool_call>"),
    ] {
        assert!(accepts(&grammar, &vocab, eos, &ok, &mut rng), "{ok}");
    }
    for bad in [
        r#"{"ok":1}"#.to_string(),
        r#"{"ok":true,"items":[{"x":1}]}"#.to_string(),
        "plain text".to_string(),
        format!(r#"{{"ok":true}}<tool_call>\n{ping}\n</tool_call>"#),
        ping.to_string(),
        String::new(),
    ] {
        assert!(!accepts(&grammar, &vocab, eos, &bad, &mut rng), "{bad}");
    }
    // a walk over the masks ends in one or the other
    let (mut answers, mut called) = (0, 0);
    for seed in 0..40 {
        let mut rng = Rng(seed);
        let mut matcher = Matcher::new(grammar.clone());
        let mut mask = vec![0u32; vocab.bitmask_words()];
        let mut out = Vec::new();
        for _ in 0..2000 {
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            let allowed = allowed_ids(&mask, vocab.size());
            let token = if allowed.contains(&eos) { eos } else { allowed[rng.below(allowed.len())] };
            assert!(matcher.accept_token(token));
            if token == eos {
                break;
            }
            out.extend_from_slice(vocab.token_bytes(token).unwrap());
        }
        if !matcher.is_ended() {
            continue;
        }
        let text = String::from_utf8(out).unwrap();
        match parse_calls(&text) {
            Some(calls) => {
                assert!(calls.iter().all(valid_call), "{text}");
                called += 1;
            }
            None => {
                answers += 1;
                let value: Value = serde_json::from_str(&text).expect(&text);
                assert!(
                    value["ok"].is_boolean()
                        && value.as_object().unwrap().keys().all(|k| k == "ok" || k == "items")
                );
            }
        }
    }
    assert!(answers > 0 && called > 0, "{answers} answers, {called} calls");
}
