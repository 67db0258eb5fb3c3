//! How model families write tool calls, and how to tell them from a chat template:
//!
//! - `hermes` (Qwen 2.5 and 3, Hermes, ferrolm's `tiny`): `<tool_call>\n{"name": "f",
//!   "arguments": {...}}\n</tool_call>`, once per call, text allowed around them.
//! - `llama3_json` (Llama 3.1 to 3.3): the whole answer is the call, `{"name": "f",
//!   "parameters": {...}}`, optionally after `<|python_tag|>`; several are separated by `;`.
//! - `mistral`: `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`.

use ferrolm_constraint::TagSequence;
use serde_json::Value;

use super::call_scanner::CallScanner;
use super::definitions::{call_array_schema, call_object_schema, FunctionTool};
use super::output::{Piece, Sink};

const WS: &[char] = &[' ', '\t', '\n', '\r'];

/// How many bytes at the end of `text` may be the start of `tag` (held back until the
/// next text says whether the tag came). Tags are ASCII, so the cut is a char boundary.
pub fn held_back(text: &str, tag: &str) -> usize {
    for k in (1..=(tag.len().saturating_sub(1)).min(text.len())).rev() {
        if text.ends_with(&tag[..k]) {
            return k;
        }
    }
    0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    Hermes,
    Llama3Json,
    Mistral,
}

const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolCallFormat {
    pub fn name(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "hermes",
            ToolCallFormat::Llama3Json => "llama3_json",
            ToolCallFormat::Mistral => "mistral",
        }
    }

    /// Where a call starts in free text.
    pub fn trigger(self) -> Option<&'static str> {
        Some(match self {
            ToolCallFormat::Hermes => "<tool_call>",
            ToolCallFormat::Llama3Json => PYTHON_TAG,
            ToolCallFormat::Mistral => "[TOOL_CALLS]",
        })
    }

    /// What a forced call begins with, given in the prompt.
    pub fn opening(self) -> &'static str {
        match self {
            ToolCallFormat::Hermes => "<tool_call>\n",
            ToolCallFormat::Llama3Json => "",
            ToolCallFormat::Mistral => "[TOOL_CALLS]",
        }
    }

    pub fn arguments_keys(self) -> &'static [&'static str] {
        match self {
            ToolCallFormat::Llama3Json => &["parameters", "arguments"],
            _ => &["arguments"],
        }
    }

    /// Several calls in one answer: each call's JSON between these; `None`: the body
    /// schema holds them all (Mistral's array).
    pub fn tags(self) -> Option<TagSequence> {
        let t = |begin: &str, end: &str, separator: &str| TagSequence {
            begin: begin.into(),
            end: end.into(),
            separator: separator.into(),
            repeated: true,
            begun: String::new(),
        };
        match self {
            ToolCallFormat::Hermes => Some(t("<tool_call>\n", "\n</tool_call>", "\n")),
            ToolCallFormat::Llama3Json => Some(t("", "", "; ")),
            ToolCallFormat::Mistral => None,
        }
    }

    /// The JSON Schema of one call (of all of them for Mistral), what follows the trigger
    /// (or the opening).
    pub fn body_schema(self, tools: &[&FunctionTool], parallel: bool) -> Value {
        match self {
            ToolCallFormat::Mistral => call_array_schema(tools, self.arguments_keys()[0], parallel),
            _ => call_object_schema(tools, self.arguments_keys()[0]),
        }
    }

    /// The tags around the calls where an answer in a response format may come instead;
    /// `None` where the calls' first characters cannot tell them from such an answer.
    pub fn answer_or_calls_tags(self, parallel: bool) -> Option<TagSequence> {
        match self {
            ToolCallFormat::Hermes => self.tags().map(|t| TagSequence { repeated: parallel, ..t }),
            ToolCallFormat::Llama3Json => None,
            ToolCallFormat::Mistral => Some(TagSequence {
                begin: "[TOOL_CALLS]".into(),
                end: String::new(),
                separator: String::new(),
                repeated: false,
                begun: String::new(),
            }),
        }
    }

    /// A parser of one output; `primed`: the prompt ended with the opening.
    pub fn stream(self, sink: Sink, primed: bool) -> ToolStream {
        let call =
            (primed && self == ToolCallFormat::Hermes).then(|| CallScanner::new(self.arguments_keys()));
        let state = match self {
            ToolCallFormat::Hermes => State::Text,
            ToolCallFormat::Llama3Json => State::Start,
            ToolCallFormat::Mistral if primed => State::Calls,
            ToolCallFormat::Mistral => State::Text,
        };
        ToolStream { format: self, sink, buf: String::new(), call, state }
    }
}

pub const FORMATS: &[ToolCallFormat] =
    &[ToolCallFormat::Hermes, ToolCallFormat::Llama3Json, ToolCallFormat::Mistral];

/// The names `tool_call_parser` takes: `auto` (the chat template's), `none`, the formats,
/// and the names other servers give them.
pub const PARSER_CHOICES: &[&str] =
    &["auto", "none", "hermes", "llama3_json", "mistral", "qwen25", "qwen", "qwen3", "llama3", "llama"];

fn by_name(name: &str) -> Option<ToolCallFormat> {
    let name = match name {
        "qwen25" | "qwen" | "qwen3" => "hermes",
        "llama3" | "llama" => "llama3_json",
        other => other,
    };
    FORMATS.iter().copied().find(|f| f.name() == name)
}

/// The format `--tool-call-parser` names; `auto`: the one the chat template shows, if
/// exactly one does; `none` (or a name not known): no parsing.
pub fn tool_call_format(name: &str, chat_template: Option<&str>) -> Option<ToolCallFormat> {
    match name {
        "none" => None,
        "auto" => detect_format(chat_template),
        other => by_name(other),
    }
}

/// The format whose markers the chat template writes; `None` when it shows none, or the
/// markers of more than one.
pub fn detect_format(chat_template: Option<&str>) -> Option<ToolCallFormat> {
    let t = chat_template.filter(|t| !t.is_empty())?;
    let mut found = Vec::new();
    if t.contains("<tool_call>") {
        found.push(ToolCallFormat::Hermes);
    }
    if t.contains("[TOOL_CALLS]") {
        found.push(ToolCallFormat::Mistral);
    }
    if t.contains(PYTHON_TAG) || (t.contains("ipython") && t.contains("\"parameters\"")) {
        found.push(ToolCallFormat::Llama3Json);
    }
    (found.len() == 1).then(|| found[0])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Free text (Hermes and Mistral; Llama 3 after text that is not a call).
    Text,
    /// Llama 3: the answer's start, not decided yet.
    Start,
    /// In the calls (Llama 3's or Mistral's array).
    Calls,
}

/// One output's parse, fed text as it is generated; `finish` at the end.
#[derive(Debug)]
pub struct ToolStream {
    format: ToolCallFormat,
    sink: Sink,
    buf: String,
    call: Option<CallScanner>,
    state: State,
}

impl ToolStream {
    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        match self.format {
            ToolCallFormat::Hermes => self.feed_hermes(),
            ToolCallFormat::Llama3Json => self.feed_llama3(),
            ToolCallFormat::Mistral => self.feed_mistral(),
        }
        self.sink.take()
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let buf = std::mem::take(&mut self.buf);
        match (self.format, self.call.as_mut()) {
            (_, Some(call)) => {
                call.feed(&mut self.sink, &buf);
                call.close(&mut self.sink);
            }
            (ToolCallFormat::Hermes, None) => self.sink.content(&buf),
            (ToolCallFormat::Llama3Json, None) => {
                if matches!(self.state, State::Text | State::Start)
                    || !buf.trim_matches(|c| WS.contains(&c) || c == ';').is_empty()
                {
                    self.sink.content(&buf);
                }
            }
            (ToolCallFormat::Mistral, None) => {
                if self.state == State::Text {
                    self.sink.content(&buf);
                }
            }
        }
        self.sink.take()
    }

    /// Sends the text before a possible start of `tag` as content, holds the rest.
    fn text_until(&mut self, tag: &str) -> bool {
        match self.buf.find(tag) {
            None => {
                let keep = held_back(&self.buf, tag);
                let cut = self.buf.len() - keep;
                self.sink.content(&self.buf[..cut]);
                self.buf.drain(..cut);
                false
            }
            Some(i) => {
                self.sink.content(&self.buf[..i]);
                self.buf.drain(..i + tag.len());
                true
            }
        }
    }

    fn feed_hermes(&mut self) {
        loop {
            match self.call.as_mut() {
                None => {
                    if !self.text_until("<tool_call>") {
                        return;
                    }
                    self.call = Some(CallScanner::new(self.format.arguments_keys()));
                }
                Some(call) => match self.buf.find(HERMES_CLOSE) {
                    None => {
                        let keep = held_back(&self.buf, HERMES_CLOSE);
                        let cut = self.buf.len() - keep;
                        call.feed(&mut self.sink, &self.buf[..cut]); // past the object: whitespace, dropped
                        self.buf.drain(..cut);
                        return;
                    }
                    Some(j) => {
                        call.feed(&mut self.sink, &self.buf[..j]);
                        call.close(&mut self.sink);
                        self.buf.drain(..j + HERMES_CLOSE.len());
                        self.call = None;
                    }
                },
            }
        }
    }

    /// Feeds the open call; false when it wants more text.
    fn feed_call(&mut self) -> bool {
        let call = self.call.as_mut().expect("a call");
        let taken = call.feed(&mut self.sink, &self.buf);
        self.buf.drain(..taken);
        if !call.complete {
            return false;
        }
        self.call = None;
        true
    }

    fn feed_llama3(&mut self) {
        while !self.buf.is_empty() {
            match self.state {
                State::Text => {
                    if !self.text_until(PYTHON_TAG) {
                        return;
                    }
                    self.state = State::Calls;
                }
                State::Start => {
                    let head = self.buf.trim_start_matches(WS);
                    if head.is_empty() || (head.len() < PYTHON_TAG.len() && PYTHON_TAG.starts_with(head)) {
                        return;
                    }
                    if let Some(rest) = head.strip_prefix(PYTHON_TAG) {
                        self.buf = rest.to_string();
                        self.state = State::Calls;
                    } else if head.starts_with('{') {
                        self.state = State::Calls;
                    } else {
                        self.state = State::Text;
                    }
                }
                State::Calls if self.call.is_some() => {
                    if !self.feed_call() {
                        return;
                    }
                }
                State::Calls => {
                    let head = self.buf.trim_start_matches(|c| WS.contains(&c) || c == ';');
                    if head.is_empty() {
                        return;
                    }
                    if head.starts_with('{') {
                        self.buf = head.to_string();
                        self.call = Some(CallScanner::new(self.format.arguments_keys()));
                    } else {
                        self.state = State::Text;
                    }
                }
            }
        }
    }

    fn feed_mistral(&mut self) {
        while !self.buf.is_empty() {
            match self.state {
                State::Text | State::Start => {
                    if !self.text_until("[TOOL_CALLS]") {
                        return;
                    }
                    self.state = State::Calls;
                }
                State::Calls if self.call.is_some() => {
                    if !self.feed_call() {
                        return;
                    }
                }
                State::Calls => {
                    let head = self.buf.trim_start_matches(|c| WS.contains(&c) || c == '[' || c == ',');
                    if head.is_empty() {
                        self.buf.clear();
                        return;
                    }
                    if head.starts_with('{') {
                        self.buf = head.to_string();
                        self.call = Some(CallScanner::new(self.format.arguments_keys()));
                    } else {
                        self.buf = head.strip_prefix(']').unwrap_or(head).to_string();
                        self.state = State::Text;
                    }
                }
            }
        }
    }
}
