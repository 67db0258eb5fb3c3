//! The one error type of the crate. Every fallible entry point returns it; nothing on
//! user input panics.

use std::fmt;

/// What went wrong, with enough detail for a person to act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConstraintError {
    /// The vocabulary handed in is inconsistent (duplicate ids, an id past the size, ...).
    InvalidVocabulary(String),
    /// A tokenizer file could not be read: `format` names the file kind, `line` is
    /// 1-based when the format is line-oriented.
    TokenizerFile { format: &'static str, line: Option<usize>, message: String },
    /// The regex did not parse or uses a feature the DFA cannot express.
    InvalidRegex { pattern: String, message: String },
    /// The grammar's automaton grew past its configured limit (states, bytes or time).
    GrammarTooLarge { message: String },
    /// A caller-owned bitmask has the wrong length for the vocabulary.
    BitmaskSize { expected: usize, got: usize },
    /// Rolling back more steps than were taken (or than are remembered).
    RollbackTooFar { requested: usize, available: usize },
    /// A JSON Schema keyword or value that changes what is valid but is not supported.
    UnsupportedSchema { keyword: String, path: String },
    /// A JSON Schema that is not valid JSON Schema (or not JSON at all).
    InvalidSchema { path: String, message: String },
    /// A GBNF/EBNF grammar that does not parse or does not make sense (an undefined
    /// rule, no `root`); `line` and `column` are 1-based, the column counted in
    /// characters.
    InvalidGrammar { line: usize, column: usize, message: String },
    /// A valid GBNF/EBNF grammar that the engine cannot run exactly (one that needs to
    /// look ahead more than one character at a rule boundary, or left recursion through
    /// several rules); `rule` names the rule at fault.
    UnsupportedGrammar { rule: String, message: String },
    /// A bug: a panic while compiling, caught and reported.
    Internal { message: String },
}

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidVocabulary(msg) => write!(f, "invalid vocabulary: {msg}"),
            Self::TokenizerFile { format, line: Some(line), message } => {
                write!(f, "bad {format} file at line {line}: {message}")
            }
            Self::TokenizerFile { format, message, .. } => write!(f, "bad {format} file: {message}"),
            Self::InvalidRegex { pattern, message } => {
                write!(f, "invalid regex {pattern:?}: {message}")
            }
            Self::GrammarTooLarge { message } => write!(f, "grammar too large: {message}"),
            Self::BitmaskSize { expected, got } => write!(
                f,
                "bitmask has {got} words but the vocabulary needs {expected} ((vocab_size + 31) / 32)"
            ),
            Self::RollbackTooFar { requested, available } => {
                write!(f, "cannot roll back {requested} steps: only {available} can be undone")
            }
            Self::UnsupportedSchema { keyword, path } => write!(
                f,
                "unsupported JSON Schema keyword {keyword:?} at {path} (it would change what is valid)"
            ),
            Self::InvalidSchema { path, message } => {
                write!(f, "invalid JSON Schema at {path}: {message}")
            }
            Self::InvalidGrammar { line, column, message } => {
                write!(f, "invalid grammar at line {line}, column {column}: {message}")
            }
            Self::UnsupportedGrammar { rule, message } => {
                write!(f, "unsupported grammar (rule `{rule}`): {message}")
            }
            Self::Internal { message } => write!(f, "internal error in the constraint engine: {message}"),
        }
    }
}

impl std::error::Error for ConstraintError {}

pub type Result<T, E = ConstraintError> = std::result::Result<T, E>;
