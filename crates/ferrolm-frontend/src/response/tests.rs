//! The wire shapes of answers and chunks, byte for byte where OpenAI's clients read them.

use std::sync::Arc;

use ferrolm_constraint::Vocabulary;
use ferrolm_core::detok::StopReason;
use ferrolm_core::engine::{FinishReason, Finished};
use serde_json::json;

use super::*;
use crate::tools::ToolCallFormat;

fn vocab() -> Arc<Vocabulary> {
    Arc::new(Vocabulary::new(vec![b"<s>".to_vec(), b"a".to_vec(), b"\xff".to_vec()], &[], &[0]).unwrap())
}

fn head() -> Head {
    Head { id: "x-1".into(), created: 7, model: "m".into() }
}

fn finished(reason: FinishReason) -> Option<Finished> {
    Some(Finished { reason, prompt_tokens: 3, cached_tokens: 1, completion_tokens: 2 })
}

fn text(out: &[u8]) -> &str {
    std::str::from_utf8(out).unwrap()
}

#[test]
fn a_plain_chat_stream_keeps_openais_nulls() {
    let plan = ChatPlan {
        prompt: String::new(),
        tool_format: None,
        reasoning: None,
        primed: false,
        parallel: true,
        constraint: None,
        skip_special_tokens: None,
    };
    let mut chunks = Chunks::chat(head(), &plan, 1, true, false, vocab());
    let mut out = Vec::new();
    chunks.start(&mut out);
    let u = SampleUpdate {
        token_ids: vec![1],
        text: "a\"".into(),
        finished: finished(FinishReason::Length),
        ..Default::default()
    };
    let s = Sample { output: u.clone(), ..Sample::default() };
    chunks.update(&mut out, &s, &u);
    chunks.end(&mut out, Usage::of(std::slice::from_ref(&s)));
    let envelope = r#"data: {"id":"x-1","object":"chat.completion.chunk","created":7,"model":"m","choices":"#;
    let expected = [
        r#"[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        r#"[{"index":0,"delta":{"content":"a\""},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        r#"[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}],"usage":null}"#,
        r#"[],"usage":{"prompt_tokens":0,"completion_tokens":1,"total_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}"#,
    ];
    let mut want: String = expected.iter().map(|c| format!("{envelope}{c}\n\n")).collect();
    want.push_str("data: [DONE]\n\n");
    assert_eq!(text(&out), want);
}

#[test]
fn completion_logprobs_name_tokens_and_offsets() {
    let mut chunks = Chunks::completion(head(), 1, false, true, vocab());
    let mut out = Vec::new();
    let s = Sample::default();
    let first = SampleUpdate {
        token_ids: vec![1, 2],
        text: "a\u{fffd}".into(),
        logprobs: vec![-0.5, f32::NAN],
        top_logprobs: vec![vec![(1, -0.5)], vec![]],
        finished: None,
    };
    chunks.update(&mut out, &s, &first);
    let last = SampleUpdate {
        token_ids: vec![1],
        text: "a".into(),
        logprobs: vec![-1.0],
        top_logprobs: vec![vec![]],
        finished: finished(FinishReason::Stop(StopReason::Token(1))),
    };
    chunks.update(&mut out, &s, &last);
    let events: Vec<serde_json::Value> = text(&out)
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(&e[6..]).unwrap())
        .collect();
    assert_eq!(
        events[0]["choices"][0]["logprobs"],
        json!({"tokens": ["a", "\u{fffd}"], "token_logprobs": [-0.5, null], "top_logprobs": [{"a": -0.5}, {}], "text_offset": [0, 1]})
    );
    assert!(events[0].get("usage").is_none(), "no usage asked for");
    assert_eq!(
        events[1]["choices"][0]["logprobs"]["text_offset"],
        json!([2]),
        "offsets run on across chunks"
    );
    assert_eq!(events[2]["choices"][0]["finish_reason"], "stop");
}
#[test]
fn deltas_follow_openais_shape() {
    let mut parser = ChatOutputParser::new(Some(ToolCallFormat::Hermes), true, true, None, "");
    let mut pieces = parser.feed("{\"name\": \"f\", \"arguments\": {\"a\": 1");
    pieces.extend(parser.feed("}}"));
    pieces.extend(parser.finish());
    let d = serde_json::to_value(deltas(&pieces)).unwrap();
    assert_eq!(d[0]["tool_calls"][0]["function"], json!({"name": "f", "arguments": ""}));
    assert!(d[0]["tool_calls"][0]["id"].as_str().unwrap().starts_with("call_"));
    let rest = d.as_array().unwrap()[1..].to_vec();
    let args: String =
        rest.iter().map(|x| x["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(args, "{\"a\": 1}");
    assert!(rest.iter().all(|x| x["tool_calls"][0].get("id").is_none() && x["tool_calls"][0]["index"] == 0));
}

#[test]
fn a_generate_result_names_its_stop_and_logprobs() {
    let output = SampleUpdate {
        token_ids: vec![1],
        text: "a".into(),
        logprobs: vec![-0.25],
        top_logprobs: vec![vec![(1, -0.25), (2, -2.0)]],
        finished: finished(FinishReason::Stop(StopReason::String("a".into()))),
    };
    let s = Sample { output, ..Sample::default() };
    let v = serde_json::to_value(generate_result(&s, "r", true, None)).unwrap();
    assert_eq!(
        v,
        json!({"text": "a", "output_ids": [1], "meta_info": {"id": "r", "finish_reason": {"type": "stop", "matched": "a"},
               "prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 1,
               "output_token_logprobs": [[-0.25, 1]], "output_top_logprobs": [[[-0.25, 1], [-2.0, 2]]]}})
    );
}
