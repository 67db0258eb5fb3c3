//! What parsing a chat output yields, piece by piece as the text arrives (reasoning text,
//! content text, a tool call's start with its id and name, fragments of its arguments),
//! the pieces put together (`MessageBuilder`), OpenAI's deltas of them, and the parser of
//! one output (`ChatOutputParser`: the thinking split off, then calls parsed out of the
//! answer).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};

use super::formats::{ToolCallFormat, ToolStream};
use super::reasoning::{Part, ReasoningFormat, ReasoningStream};

const WS: &[char] = &[' ', '\t', '\n', '\r'];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceKind {
    Reasoning,
    Content,
    /// A call's start: `text` is the function's name, `call_id` its id.
    Call,
    /// A fragment of a call's arguments.
    Arguments,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub kind: PieceKind,
    pub text: String,
    /// The call's place among the message's calls.
    pub index: usize,
    pub call_id: String,
}

impl Piece {
    fn new(kind: PieceKind, text: String) -> Self {
        Piece { kind, text, index: 0, call_id: String::new() }
    }
}

/// `call_` and 24 random hex digits, as OpenAI's ids look.
pub fn new_call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut out = String::from("call_");
    for _ in 0..2 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(5 + 24);
    out
}

/// Where a tool-call parser writes its pieces. With `parallel` off only the first call is
/// kept (OpenAI's `parallel_tool_calls: false` promises at most one).
#[derive(Debug, Default)]
pub struct Sink {
    parallel: bool,
    pieces: Vec<Piece>,
    num_calls: usize,
}

impl Sink {
    pub fn new(parallel: bool) -> Self {
        Sink { parallel, ..Default::default() }
    }

    pub fn content(&mut self, text: &str) {
        if !text.is_empty() {
            self.pieces.push(Piece::new(PieceKind::Content, text.to_string()));
        }
    }

    /// Announces a call; its index, or `None` when it is dropped.
    pub fn start_call(&mut self, name: &str) -> Option<usize> {
        if !self.parallel && self.num_calls >= 1 {
            return None;
        }
        let index = self.num_calls;
        self.num_calls += 1;
        self.pieces.push(Piece {
            kind: PieceKind::Call,
            text: name.to_string(),
            index,
            call_id: new_call_id(),
        });
        Some(index)
    }

    pub fn arguments(&mut self, index: Option<usize>, text: &str) {
        if let (Some(index), false) = (index, text.is_empty()) {
            self.pieces.push(Piece {
                kind: PieceKind::Arguments,
                text: text.to_string(),
                index,
                call_id: String::new(),
            });
        }
    }

    pub fn take(&mut self) -> Vec<Piece> {
        std::mem::take(&mut self.pieces)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    pub fn as_openai(&self) -> Value {
        json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// The pieces of one output put together.
#[derive(Debug, Default, Clone)]
pub struct MessageBuilder {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl MessageBuilder {
    pub fn add(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p.kind {
                PieceKind::Reasoning => self.reasoning.push_str(&p.text),
                PieceKind::Content => self.content.push_str(&p.text),
                PieceKind::Call => {
                    self.calls.push(ToolCall { id: p.call_id, name: p.text, arguments: String::new() })
                }
                PieceKind::Arguments => self.calls[p.index].arguments.push_str(&p.text),
            }
        }
    }
}

/// OpenAI's chunk deltas for pieces: the call's id and name first (with empty arguments),
/// then its argument fragments; runs of one kind merged.
pub fn deltas(pieces: &[Piece]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for p in pieces {
        match p.kind {
            PieceKind::Reasoning | PieceKind::Content => {
                let key = if p.kind == PieceKind::Reasoning { "reasoning_content" } else { "content" };
                if let Some(Value::Object(last)) = out.last_mut() {
                    if last.len() == 1 && last.contains_key(key) {
                        let merged = format!("{}{}", last[key].as_str().unwrap_or(""), p.text);
                        last.insert(key.into(), Value::from(merged));
                        continue;
                    }
                }
                let mut d = Map::new();
                d.insert(key.into(), Value::from(p.text.as_str()));
                out.push(Value::Object(d));
            }
            PieceKind::Call => out.push(json!({"tool_calls": [{"index": p.index, "id": p.call_id, "type": "function",
                                                               "function": {"name": p.text, "arguments": ""}}]})),
            PieceKind::Arguments => {
                if let Some(Value::Object(last)) = out.last_mut() {
                    if last.len() == 1 {
                        if let Some(Value::Array(calls)) = last.get_mut("tool_calls") {
                            let call = &mut calls[0];
                            if call["index"] == p.index && call.get("id").is_none() {
                                let merged = format!("{}{}", call["function"]["arguments"].as_str().unwrap_or(""), p.text);
                                call["function"]["arguments"] = Value::from(merged);
                                continue;
                            }
                        }
                    }
                }
                out.push(json!({"tool_calls": [{"index": p.index, "function": {"arguments": p.text}}]}));
            }
        }
    }
    out
}

/// Text without its leading and trailing whitespace, as it streams.
#[derive(Debug, Default)]
struct Trimmed {
    started: bool,
    held: String,
}

impl Trimmed {
    fn feed(&mut self, text: &str) -> String {
        let mut text = text;
        if !self.started {
            text = text.trim_start_matches(WS);
            if text.is_empty() {
                return String::new();
            }
            self.started = true;
        }
        let body = text.trim_end_matches(WS);
        if body.is_empty() {
            self.held.push_str(text);
            return String::new();
        }
        let out = format!("{}{}", self.held, body);
        self.held = text[body.len()..].to_string();
        out
    }
}

/// One chat output read as it streams; `feed` each new text, then `finish`. With neither
/// parser the answer passes through untouched; with one, the reasoning and the content lose
/// their leading and trailing whitespace.
pub struct ChatOutputParser {
    thinking: Option<ReasoningStream>,
    tools: Option<ToolStream>,
    trim: bool,
    reasoning_text: Trimmed,
    content_text: Trimmed,
}

impl ChatOutputParser {
    pub fn new(
        tool_format: Option<ToolCallFormat>,
        primed: bool,
        parallel: bool,
        reasoning: Option<&ReasoningFormat>,
        prompt: &str,
    ) -> Self {
        let thinking = reasoning.map(|r| r.stream(prompt));
        let tools = tool_format.map(|f| f.stream(Sink::new(parallel), primed));
        let trim = thinking.is_some() || tools.is_some();
        ChatOutputParser {
            thinking,
            tools,
            trim,
            reasoning_text: Trimmed::default(),
            content_text: Trimmed::default(),
        }
    }

    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        if text.is_empty() {
            return Vec::new();
        }
        match self.thinking.as_mut() {
            None => self.answer(text),
            Some(t) => {
                let parts = t.feed(text);
                self.route(parts)
            }
        }
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let mut pieces = match self.thinking.as_mut() {
            Some(t) => {
                let parts = t.finish();
                self.route(parts)
            }
            None => Vec::new(),
        };
        if let Some(tools) = self.tools.as_mut() {
            let more = tools.finish();
            pieces.extend(self.trim_content(more));
        }
        pieces
    }

    fn route(&mut self, parts: Vec<(Part, String)>) -> Vec<Piece> {
        let mut out = Vec::new();
        for (kind, text) in parts {
            match kind {
                Part::Reasoning => {
                    let kept = self.reasoning_text.feed(&text);
                    if !kept.is_empty() {
                        out.push(Piece::new(PieceKind::Reasoning, kept));
                    }
                }
                Part::Content => out.extend(self.answer(&text)),
                Part::End => {}
            }
        }
        out
    }

    fn answer(&mut self, text: &str) -> Vec<Piece> {
        if let Some(tools) = self.tools.as_mut() {
            let pieces = tools.feed(text);
            return self.trim_content(pieces);
        }
        if !self.trim {
            return vec![Piece::new(PieceKind::Content, text.to_string())];
        }
        let kept = self.content_text.feed(text);
        if kept.is_empty() {
            Vec::new()
        } else {
            vec![Piece::new(PieceKind::Content, kept)]
        }
    }

    fn trim_content(&mut self, pieces: Vec<Piece>) -> Vec<Piece> {
        let mut out = Vec::with_capacity(pieces.len());
        for mut p in pieces {
            if p.kind == PieceKind::Content {
                p.text = self.content_text.feed(&p.text);
                if p.text.is_empty() {
                    continue;
                }
            }
            out.push(p);
        }
        out
    }
}

/// A whole output parsed.
pub fn parse_whole(plan: &super::ChatPlan, text: &str) -> MessageBuilder {
    let mut parser = plan.output_parser();
    let mut built = MessageBuilder::default();
    built.add(parser.feed(text));
    built.add(parser.finish());
    built
}

/// `tool_calls` when the output ended by itself with calls.
pub fn final_reason(finish_reason: &str, has_calls: bool) -> &str {
    if has_calls && finish_reason == "stop" {
        "tool_calls"
    } else {
        finish_reason
    }
}

/// The assistant message of one output, and its finish reason.
pub fn message(
    plan: &super::ChatPlan,
    text: &str,
    finish_reason: Option<&'static str>,
) -> (Value, Option<&'static str>) {
    if !plan.parses() {
        return (json!({"role": "assistant", "content": text}), finish_reason);
    }
    let built = parse_whole(plan, text);
    let or_null = |s: &str| if s.is_empty() { Value::Null } else { Value::from(s) };
    let mut out = Map::new();
    out.insert("role".into(), "assistant".into());
    out.insert("content".into(), or_null(&built.content));
    if plan.reasoning.is_some() {
        out.insert("reasoning_content".into(), or_null(&built.reasoning));
    }
    if !built.calls.is_empty() {
        out.insert("tool_calls".into(), built.calls.iter().map(ToolCall::as_openai).collect());
    }
    (Value::Object(out), finish_reason.map(|f| final_reason(f, !built.calls.is_empty())))
}
