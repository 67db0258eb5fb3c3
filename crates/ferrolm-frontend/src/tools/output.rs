//! What parsing a chat output yields, piece by piece as the text arrives (reasoning text,
//! content text, a tool call's start with its id and name, fragments of its arguments),
//! the pieces put together (`MessageBuilder`), and the parser of one output
//! (`ChatOutputParser`: the thinking split off, then calls parsed out of the answer).
//! `crate::response` writes them as OpenAI's messages and deltas.

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
            call_id: format!("call_{}", crate::response::random_hex(24)),
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
    /// The reasoning so far, while it is held to be given as one piece when it ends
    /// ([`ChatOutputParser::holding_reasoning`]).
    held_reasoning: Option<String>,
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
            held_reasoning: None,
        }
    }

    /// The reasoning held back and given as one piece once it ends (its closing tag, or
    /// the end of the output), not piece by piece as it comes: SGLang's
    /// `stream_reasoning: false`.
    pub fn holding_reasoning(mut self) -> Self {
        self.held_reasoning = Some(String::new());
        self
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
        // what is held comes before anything the end releases
        pieces.splice(0..0, self.release_reasoning());
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
                    match self.held_reasoning.as_mut() {
                        Some(held) => held.push_str(&kept),
                        None if !kept.is_empty() => out.push(Piece::new(PieceKind::Reasoning, kept)),
                        None => {}
                    }
                }
                Part::Content => out.extend(self.answer(&text)),
                Part::End => out.extend(self.release_reasoning()),
            }
        }
        out
    }

    /// The reasoning held so far, as one piece (none when nothing is held).
    fn release_reasoning(&mut self) -> Option<Piece> {
        let held = self.held_reasoning.as_mut().filter(|h| !h.is_empty())?;
        Some(Piece::new(PieceKind::Reasoning, std::mem::take(held)))
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
