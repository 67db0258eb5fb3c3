//! Reasoning models think between `<think>` and `</think>` before they answer; the parser
//! splits an output into reasoning and content as it streams.
//!
//! - `qwen3`: the thinking is there when the output opens with `<think>`, or when the
//!   prompt already opened it.
//! - `deepseek_r1`: the output is thinking until `</think>` even without the opening tag.
//!
//! Either way a prompt that already closed the thinking makes the whole output the answer.

use super::formats::held_back;

const WS: &[char] = &[' ', '\t', '\n', '\r'];
/// DeepSeek's assistant role marker (with full-width bars), in its R1 templates.
const DEEPSEEK_ASSISTANT: &str = "<\u{ff5c}Assistant\u{ff5c}>";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasoningFormat {
    pub name: &'static str,
    pub start: &'static str,
    pub end: &'static str,
    /// The output is thinking from its first character, whether or not it opens the tag.
    pub thinks_without_start: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptState {
    /// The prompt ends inside the thinking.
    Open,
    /// It ends right after it (the model answers at once).
    Closed,
    /// The output decides.
    Unsaid,
}

pub const QWEN3: ReasoningFormat =
    ReasoningFormat { name: "qwen3", start: "<think>", end: "</think>", thinks_without_start: false };
pub const DEEPSEEK_R1: ReasoningFormat =
    ReasoningFormat { name: "deepseek_r1", start: "<think>", end: "</think>", thinks_without_start: true };

impl ReasoningFormat {
    pub fn prompt_state(&self, prompt: &str) -> PromptState {
        if prompt.trim_end_matches(WS).ends_with(self.end) {
            return PromptState::Closed;
        }
        match (prompt.rfind(self.start), prompt.rfind(self.end)) {
            (Some(o), Some(c)) if o > c => PromptState::Open,
            (Some(_), None) => PromptState::Open,
            _ => PromptState::Unsaid,
        }
    }

    /// Whether an output to this prompt is to think first (structure applies after).
    pub fn thinking_expected(&self, prompt: &str) -> bool {
        self.prompt_state(prompt) != PromptState::Closed
    }

    pub fn stream(&self, prompt: &str) -> ReasoningStream {
        let (state, then) = match self.prompt_state(prompt) {
            PromptState::Closed => (State::Content, State::Content),
            PromptState::Open => (State::Opening, State::Reasoning),
            PromptState::Unsaid if self.thinks_without_start => (State::Opening, State::Reasoning),
            PromptState::Unsaid => (State::Opening, State::Content),
        };
        ReasoningStream { format: self.clone(), state, then, buf: String::new() }
    }
}

/// The names `reasoning_parser` takes: `auto` (the chat template's), `none`, the formats.
pub const REASONING_CHOICES: &[&str] = &["auto", "none", "qwen3", "deepseek_r1", "deepseek-r1"];

/// The format `--reasoning-parser` names; `auto`: the chat template's, if it shows one;
/// `none` (or a name not known): no parsing.
pub fn reasoning_format(name: &str, chat_template: Option<&str>) -> Option<ReasoningFormat> {
    match name {
        "auto" => detect_reasoning(chat_template),
        "qwen3" => Some(QWEN3),
        "deepseek_r1" | "deepseek-r1" => Some(DEEPSEEK_R1),
        _ => None,
    }
}

/// A template that writes or strips `</think>` is a thinking model's; DeepSeek's (its
/// role markers) thinks even without the opening tag.
pub fn detect_reasoning(chat_template: Option<&str>) -> Option<ReasoningFormat> {
    let t = chat_template.filter(|t| t.contains(QWEN3.end))?;
    Some(if t.contains(DEEPSEEK_ASSISTANT) { DEEPSEEK_R1 } else { QWEN3 })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Reasoning,
    Content,
    /// The thinking ended.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The output may open with the start tag: held until it says.
    Opening,
    Reasoning,
    Content,
}

#[derive(Debug)]
pub struct ReasoningStream {
    format: ReasoningFormat,
    state: State,
    then: State,
    buf: String,
}

impl ReasoningStream {
    pub fn feed(&mut self, text: &str) -> Vec<(Part, String)> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while !self.buf.is_empty() {
            match self.state {
                State::Content => {
                    out.push((Part::Content, std::mem::take(&mut self.buf)));
                }
                State::Opening => {
                    let head = self.buf.trim_start_matches(WS);
                    let start = self.format.start;
                    if head.is_empty() || (head.len() < start.len() && start.starts_with(head)) {
                        break;
                    }
                    if let Some(rest) = head.strip_prefix(start) {
                        self.buf = rest.to_string();
                        self.state = State::Reasoning;
                    } else {
                        self.state = self.then;
                    }
                }
                State::Reasoning => match self.buf.find(self.format.end) {
                    None => {
                        let keep = held_back(&self.buf, self.format.end);
                        let cut = self.buf.len() - keep;
                        if cut > 0 {
                            out.push((Part::Reasoning, self.buf[..cut].to_string()));
                        }
                        self.buf.drain(..cut);
                        break;
                    }
                    Some(i) => {
                        if i > 0 {
                            out.push((Part::Reasoning, self.buf[..i].to_string()));
                        }
                        self.buf.drain(..i + self.format.end.len());
                        self.state = State::Content;
                        out.push((Part::End, String::new()));
                    }
                },
            }
        }
        out
    }

    /// What was held back: a partial tag is text after all.
    pub fn finish(&mut self) -> Vec<(Part, String)> {
        if self.buf.is_empty() {
            return Vec::new();
        }
        let reasoning =
            self.state == State::Reasoning || (self.state == State::Opening && self.then == State::Reasoning);
        vec![(if reasoning { Part::Reasoning } else { Part::Content }, std::mem::take(&mut self.buf))]
    }
}
