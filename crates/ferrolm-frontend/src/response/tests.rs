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
    let mut chunks = Chunks::chat(head(), &plan, ChatReply::default(), 1, true, false, vocab());
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

fn thinking_plan() -> ChatPlan {
    ChatPlan {
        prompt: String::new(),
        tool_format: None,
        reasoning: Some(crate::tools::reasoning::DEEPSEEK_R1),
        primed: false,
        parallel: true,
        constraint: None,
        skip_special_tokens: None,
    }
}

/// Each chunk's delta of a chat stream fed `texts` one update each (the last finishes).
fn streamed_deltas(plan: &ChatPlan, reply: ChatReply, texts: &[&str]) -> Vec<serde_json::Value> {
    let mut chunks = Chunks::chat(head(), plan, reply, 1, false, false, vocab());
    let mut out = Vec::new();
    chunks.start(&mut out);
    for (i, t) in texts.iter().enumerate() {
        let last = i + 1 == texts.len();
        let u = SampleUpdate {
            token_ids: vec![1],
            text: t.to_string(),
            finished: if last { finished(FinishReason::Length) } else { None },
            ..Default::default()
        };
        chunks.update(&mut out, &Sample::default(), &u);
    }
    text(&out)
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str::<serde_json::Value>(&e[6..]).unwrap()["choices"][0]["delta"].clone())
        .collect()
}

const THOUGHT: &[&str] = &["I ", "think", " so", "</think>", "\n\nYes", ", sure."];

#[test]
fn include_reasoning_false_parses_the_reasoning_apart_and_returns_none() {
    let plan = thinking_plan();
    let hidden = ChatReply { include_reasoning: false, ..ChatReply::default() };
    let (m, _) = message(&plan, &hidden, "I think so</think>\n\nYes, sure.", Some("stop"));
    let whole = serde_json::to_value(&m).unwrap();
    assert_eq!(whole, json!({"role": "assistant", "content": "Yes, sure."}), "no reasoning_content at all");
    let (shown, _) = message(&plan, &ChatReply::default(), "I think so</think>\n\nYes, sure.", Some("stop"));
    assert_eq!(shown.reasoning_content, Some(Some("I think so".into())), "the default returns it");
    let deltas = streamed_deltas(&plan, hidden, THOUGHT);
    assert!(deltas.iter().all(|d| d.get("reasoning_content").is_none()), "{deltas:?}");
    let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
    assert_eq!(content, "Yes, sure.");
}

#[test]
fn stream_reasoning_false_sends_the_reasoning_as_one_delta_when_it_ends() {
    let plan = thinking_plan();
    let held = ChatReply { stream_reasoning: false, ..ChatReply::default() };
    let deltas = streamed_deltas(&plan, held.clone(), THOUGHT);
    let reasoning: Vec<(usize, &str)> = deltas
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.get("reasoning_content").map(|r| (i, r.as_str().unwrap())))
        .collect();
    // the role, then the reasoning once </think> came (its own update, the fourth)
    assert_eq!(reasoning, vec![(1, "I think so")], "{deltas:?}");
    let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
    assert_eq!(content, "Yes, sure.");
    // by default the reasoning streams as it comes
    let streamed = streamed_deltas(&plan, ChatReply::default(), THOUGHT);
    assert_eq!(streamed.iter().filter(|d| d.get("reasoning_content").is_some()).count(), 3);
    // reasoning that never ends comes at the end of the output
    let deltas = streamed_deltas(&plan, held, &["I ", "think", " so "]);
    let reasoning: Vec<&str> = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
    assert_eq!(reasoning, vec!["I think so"], "{deltas:?}");
}

#[test]
fn echo_starts_the_content_with_the_assistants_last_message() {
    let plain = ChatPlan { reasoning: None, ..thinking_plan() };
    let echo = ChatReply { echo: Some("Once upon".into()), ..ChatReply::default() };
    let (m, _) = message(&plain, &echo, " a time", Some("length"));
    assert_eq!(m.content.as_deref(), Some("Once upon a time"));
    // after parsing: the echoed text, then the content
    let (m, _) = message(&thinking_plan(), &echo, "hmm</think> a time", Some("length"));
    assert_eq!(
        (m.content.as_deref(), m.reasoning_content),
        (Some("Once upona time"), Some(Some("hmm".into())))
    );
    // streamed: its own delta right after the role
    let deltas = streamed_deltas(&plain, echo, &[" a", " time"]);
    assert_eq!(deltas[0], json!({"role": "assistant", "content": ""}));
    assert_eq!(deltas[1], json!({"content": "Once upon"}));
    let content: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
    assert_eq!(content, "Once upon a time");
    // nothing to echo: nothing sent
    let none = streamed_deltas(&plain, ChatReply { echo: None, ..ChatReply::default() }, &[" a"]);
    assert_eq!(none[1], json!({"content": " a"}));
}
