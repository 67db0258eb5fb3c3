//! Tool calling and reasoning for chat: the functions a request offers and how a call is
//! chosen (`definitions`), how model families write calls (`formats`, `call_scanner`) and
//! thinking (`reasoning`), reading an output as it streams (`output`), what a request
//! changes about the prompt and the grammar (`plan`), and the history as chat templates
//! take it (`messages`). The request core (`crate::chat_request`) runs them for the HTTP
//! server and, through the binding, for the offline `Engine.chat`, so both answer alike.

pub mod call_scanner;
pub mod definitions;
pub mod formats;
pub mod messages;
pub mod output;
pub mod plan;
pub mod reasoning;
#[cfg(test)]
mod tests;

use std::collections::HashSet;

use ferrolm_constraint::{TokenKind, Vocabulary};
use serde_json::Value;

pub use definitions::{parse_tool_choice, parse_tools, FunctionTool, ToolChoice};
pub use formats::ToolCallFormat;
pub use output::{ChatOutputParser, MessageBuilder, Piece};
pub use plan::{plan_chat, ChatPlan, PlannedConstraint};
pub use reasoning::ReasoningFormat;

/// The server's tool-call and reasoning parsers (its flags, or what the chat template
/// shows), whether calls are constrained, and the texts of the tokenizer's special tokens.
#[derive(Debug, Clone, Default)]
pub struct ServerTools {
    pub tool_format: Option<ToolCallFormat>,
    pub reasoning: Option<ReasoningFormat>,
    pub constrain: bool,
    pub special_tokens: HashSet<String>,
}

impl ServerTools {
    /// From the server's settings (`tool_call_parser`, `reasoning_parser`,
    /// `disable_tool_call_constraint`, as `/server_info` shows them) and the chat template.
    pub fn new(settings: &Value, chat_template: Option<&str>, vocab: &Vocabulary) -> Self {
        let setting = |name: &str| settings.get(name).and_then(Value::as_str).unwrap_or("auto").to_string();
        ServerTools {
            tool_format: formats::tool_call_format(&setting("tool_call_parser"), chat_template),
            reasoning: reasoning::reasoning_format(&setting("reasoning_parser"), chat_template),
            constrain: !settings
                .get("disable_tool_call_constraint")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            special_tokens: special_token_texts(vocab),
        }
    }

    /// The parsers by name, as the offline `Engine.chat` takes them: a name that is not
    /// one of [`formats::PARSER_CHOICES`] (or [`reasoning::REASONING_CHOICES`]) is an error
    /// naming `tool_call_parser` (`reasoning_parser`).
    pub fn named(
        tool_call_parser: &str,
        reasoning_parser: &str,
        constrain: bool,
        chat_template: Option<&str>,
        special_tokens: HashSet<String>,
    ) -> Result<Self, crate::errors::ApiError> {
        for (name, field, choices) in [
            (tool_call_parser, "tool_call_parser", formats::PARSER_CHOICES),
            (reasoning_parser, "reasoning_parser", reasoning::REASONING_CHOICES),
        ] {
            if !choices.contains(&name) {
                return Err(crate::errors::ApiError::bad_request(
                    format!("{field}: {name:?} is not one of {}", choices.join(", ")),
                    field,
                ));
            }
        }
        Ok(ServerTools {
            tool_format: formats::tool_call_format(tool_call_parser, chat_template),
            reasoning: reasoning::reasoning_format(reasoning_parser, chat_template),
            constrain,
            special_tokens,
        })
    }
}

/// The texts of the vocabulary's special tokens (end-of-sequence ones included).
pub fn special_token_texts(vocab: &Vocabulary) -> HashSet<String> {
    (0..vocab.size() as u32)
        .filter(|&id| matches!(vocab.kind(id), Some(TokenKind::Special | TokenKind::Eos)))
        .filter_map(|id| vocab.token_bytes(id).map(|b| String::from_utf8_lossy(b).into_owned()))
        .collect()
}
