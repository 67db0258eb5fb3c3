//! GBNF text -> definitions. A hand-written recursive-descent parser: every error names
//! the line and column where the grammar goes wrong, and constructs of neighbouring
//! dialects (Lark, ISO EBNF, llama.cpp's token matches, xgrammar's macros and rule
//! options) get a message saying what they are, rather than a bare syntax error.

use std::collections::HashMap;

use super::ast::{alt, optional, repeat, seq, Def, Node, Pos};
use crate::error::{ConstraintError, Result};

/// Grammar text longer than this is refused (a grammar is a few kilobytes).
pub(crate) const MAX_GRAMMAR_BYTES: usize = 1 << 20;
/// Parentheses nest at most this deep (the parser recurses per level).
const MAX_NESTING: usize = 100;
/// The largest count of a `{m,n}` repetition.
pub(crate) const MAX_REPEAT: u32 = 100_000;
/// xgrammar's macros: `Regex(...)` and friends parse as a rule reference then a group.
const XGRAMMAR_MACROS: [&str; 6] =
    ["Regex", "Substring", "TagDispatch", "Token", "ExcludeToken", "TokenTagDispatch"];

/// The definitions of `text`, and the index of `root` among them.
pub(crate) struct Parsed {
    pub defs: Vec<Def>,
    pub root: usize,
}

pub(crate) fn parse(text: &str) -> Result<Parsed> {
    if text.len() > MAX_GRAMMAR_BYTES {
        return Err(ConstraintError::GrammarTooLarge {
            message: format!("the grammar text is over {} KiB", MAX_GRAMMAR_BYTES >> 10),
        });
    }
    let mut parser = Parser {
        chars: text.chars().collect(),
        at: 0,
        line_starts: std::iter::once(0)
            .chain(text.chars().enumerate().filter(|&(_, c)| c == '\n').map(|(i, _)| i + 1))
            .collect(),
        symbols: HashMap::new(),
        defs: Vec::new(),
    };
    parser.grammar()?;
    parser.finish()
}

struct Symbol {
    index: usize,
    /// Where the name first appears (for "undefined rule").
    first_use: usize,
    /// Followed by `(` at its first use (an xgrammar macro?).
    called: bool,
    defined_at: Option<usize>,
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    /// Character index where each line begins.
    line_starts: Vec<usize>,
    symbols: HashMap<String, Symbol>,
    /// Bodies by symbol index (`None` until defined).
    defs: Vec<Option<Def>>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl Parser {
    fn pos(&self, at: usize) -> Pos {
        let line = self.line_starts.partition_point(|&start| start <= at);
        Pos { line, column: at - self.line_starts[line - 1] + 1 }
    }

    fn error_at(&self, at: usize, message: impl Into<String>) -> ConstraintError {
        let Pos { line, column } = self.pos(at);
        ConstraintError::InvalidGrammar { line, column, message: message.into() }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn peek_at(&self, offset: usize) -> Option<char> {
        self.chars.get(self.at + offset).copied()
    }

    fn looking_at(&self, s: &str) -> bool {
        s.chars().enumerate().all(|(i, c)| self.peek_at(i) == Some(c))
    }

    /// Whitespace (newlines included: a rule ends where the next `name ::=` begins) and
    /// `#` comments.
    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' | '\r' | '\n' | '\u{FEFF}' => self.at += 1,
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(is_name_char) {
            self.at += 1;
        }
        (self.at > start).then(|| self.chars[start..self.at].iter().collect())
    }

    /// At `name ::=`: the start of the next rule.
    fn at_definition(&mut self) -> bool {
        let start = self.at;
        let found = self.name().is_some() && {
            self.skip_space();
            self.looking_at("::=")
        };
        self.at = start;
        found
    }

    fn grammar(&mut self) -> Result<()> {
        loop {
            self.skip_space();
            let Some(c) = self.peek() else { return Ok(()) };
            let start = self.at;
            let Some(name) = self.name() else {
                return Err(match c {
                    ')' => self.error_at(start, "unmatched `)`"),
                    _ => self.error_at(start, format!("expected a rule name (`name ::= ...`), found `{c}`")),
                });
            };
            // Numbered before its body's references: definitions keep the text's order.
            self.symbol(&name, start, false);
            self.skip_space();
            self.definition_sign(&name)?;
            let body = self.alternatives(0)?;
            if self.peek() == Some(')') {
                return Err(self.error_at(self.at, "unmatched `)`"));
            }
            self.define(name, start, body)?;
        }
    }

    /// `::=`, with a word for the signs of other dialects.
    fn definition_sign(&mut self, name: &str) -> Result<()> {
        if self.looking_at("::=") {
            self.at += 3;
            return Ok(());
        }
        let message = match self.peek() {
            Some(':') => format!("expected `::=` after `{name}` (Lark's `{name}: ...` is not supported; write `{name} ::= ...`)"),
            Some('=') => format!("expected `::=` after `{name}` (ISO EBNF's `{name} = ...;` is not supported; write `{name} ::= ...`)"),
            Some('[') => format!("expected `::=` after `{name}` (xgrammar's rule options `{name}[...]` are not supported)"),
            Some('-') if self.looking_at("->") => format!("expected `::=` after `{name}`, found `->`"),
            Some(c) => format!("expected `::=` after the rule name `{name}`, found `{c}`"),
            None => format!("expected `::=` after the rule name `{name}`, found the end of the grammar"),
        };
        Err(self.error_at(self.at, message))
    }

    fn define(&mut self, name: String, start: usize, body: Node) -> Result<()> {
        let index = self.symbol(&name, start, false);
        let symbol = self.symbols.get_mut(&name).unwrap();
        if let Some(first) = symbol.defined_at {
            let Pos { line, .. } = self.pos(first);
            return Err(
                self.error_at(start, format!("rule `{name}` is defined twice (first at line {line})"))
            );
        }
        symbol.defined_at = Some(start);
        self.defs[index] = Some(Def { name, pos: self.pos(start), body });
        Ok(())
    }

    fn symbol(&mut self, name: &str, at: usize, called: bool) -> usize {
        let next = self.symbols.len();
        let symbol = self.symbols.entry(name.to_string()).or_insert(Symbol {
            index: next,
            first_use: at,
            called,
            defined_at: None,
        });
        if symbol.index == next {
            self.defs.push(None);
        }
        symbol.index
    }

    fn alternatives(&mut self, depth: usize) -> Result<Node> {
        let mut alternatives = vec![self.sequence(depth)?];
        while self.peek() == Some('|') {
            self.at += 1;
            alternatives.push(self.sequence(depth)?);
        }
        Ok(alt(alternatives))
    }

    fn sequence(&mut self, depth: usize) -> Result<Node> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                None | Some('|') | Some(')') => break,
                Some(c) if depth == 0 && is_name_char(c) && self.at_definition() => break,
                _ => {}
            }
            let item = self.primary(depth)?;
            items.push(self.postfix(item)?);
        }
        Ok(seq(items))
    }

    fn primary(&mut self, depth: usize) -> Result<Node> {
        let start = self.at;
        let c = self.peek().expect("called before the end");
        match c {
            '"' => self.string(),
            '[' => self.class(),
            '.' => {
                self.at += 1;
                Ok(Node::Class { ranges: Vec::new(), negated: true })
            }
            '(' if self.peek_at(1) == Some('=') => {
                Err(self.error_at(start, "lookahead assertions `(= ...)` are not supported"))
            }
            '(' => {
                if depth + 1 > MAX_NESTING {
                    return Err(
                        self.error_at(start, format!("parentheses nest more than {MAX_NESTING} deep"))
                    );
                }
                self.at += 1;
                let inner = self.alternatives(depth + 1)?;
                if self.peek() != Some(')') {
                    return Err(self.error_at(start, "`(` is never closed"));
                }
                self.at += 1;
                Ok(inner)
            }
            c if is_name_char(c) => {
                let name = self.name().unwrap();
                let called = self.peek() == Some('(');
                Ok(Node::Ref(self.symbol(&name, start, called)))
            }
            '<' | '!' => Err(self.error_at(
                start,
                "token matches (`<[id]>`, `<token>`, `!<...>`) are not supported: a grammar describes text",
            )),
            '\'' => Err(self.error_at(start, "single-quoted strings are not supported: use double quotes")),
            '*' | '+' | '?' | '{' => {
                Err(self.error_at(start, format!("`{c}` must follow something to repeat")))
            }
            ':' if self.looking_at("::=") => {
                Err(self.error_at(start, "unexpected `::=` (a rule definition starts with its name)"))
            }
            c => Err(self.error_at(start, format!("unexpected `{c}`"))),
        }
    }

    fn postfix(&mut self, mut item: Node) -> Result<Node> {
        loop {
            let before_space = self.at;
            self.skip_space();
            let start = self.at;
            item = match self.peek() {
                Some('*') => repeat(item, 0, None),
                Some('+') => repeat(item, 1, None),
                Some('?') => optional(item),
                Some('{') => {
                    self.at += 1;
                    let (min, max) = self.counts(start)?;
                    item = repeat(item, min, max);
                    continue;
                }
                _ => {
                    self.at = before_space;
                    return Ok(item);
                }
            };
            self.at += 1;
        }
    }

    /// `m}`, `m,}` or `m,n}` after a `{` at `start`.
    fn counts(&mut self, start: usize) -> Result<(u32, Option<u32>)> {
        self.skip_space();
        let min = self.count()?;
        self.skip_space();
        let max = if self.peek() == Some(',') {
            self.at += 1;
            self.skip_space();
            if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                Some(self.count()?)
            } else {
                None
            }
        } else {
            Some(min)
        };
        self.skip_space();
        if self.peek() != Some('}') {
            return Err(
                self.error_at(self.at, "expected `}` closing the repetition `{m}`, `{m,}` or `{m,n}`")
            );
        }
        self.at += 1;
        if max.is_some_and(|max| max < min) {
            return Err(self.error_at(
                start,
                format!("repetition `{{{min},{}}}` has its maximum below its minimum", max.unwrap()),
            ));
        }
        Ok((min, max))
    }

    fn count(&mut self) -> Result<u32> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        if self.at == start {
            return Err(
                self.error_at(start, "expected a number in the repetition (`{m}`, `{m,}` or `{m,n}`)")
            );
        }
        let digits: String = self.chars[start..self.at].iter().collect();
        match digits.parse::<u32>() {
            Ok(n) if n <= MAX_REPEAT => Ok(n),
            _ => {
                Err(self
                    .error_at(start, format!("repetition count {digits} is over the limit of {MAX_REPEAT}")))
            }
        }
    }

    fn string(&mut self) -> Result<Node> {
        let start = self.at;
        self.at += 1;
        let mut text = String::new();
        loop {
            match self.peek() {
                None => return Err(self.error_at(start, "string is never closed (missing `\"`)")),
                Some('"') => break,
                Some('\\') => text.push(self.escape()?),
                Some(c) => {
                    text.push(c);
                    self.at += 1;
                }
            }
        }
        self.at += 1;
        Ok(if text.is_empty() { Node::Empty } else { Node::Text(text) })
    }

    fn class(&mut self) -> Result<Node> {
        let start = self.at;
        self.at += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.at += 1;
        }
        let mut ranges = Vec::new();
        loop {
            let lo = match self.peek() {
                None => return Err(self.error_at(start, "character class is never closed (missing `]`)")),
                Some(']') => break,
                Some(_) => self.class_char()?,
            };
            let hi = if self.peek() == Some('-') && self.peek_at(1).is_some_and(|c| c != ']') {
                let dash = self.at;
                self.at += 1;
                let hi = self.class_char()?;
                if hi < lo {
                    return Err(self.error_at(dash, format!("range `{lo}-{hi}` is reversed")));
                }
                hi
            } else {
                lo
            };
            ranges.push((lo, hi));
        }
        self.at += 1;
        if ranges.is_empty() && !negated {
            return Err(self.error_at(start, "the empty character class `[]` matches nothing"));
        }
        Ok(Node::Class { ranges, negated })
    }

    fn class_char(&mut self) -> Result<char> {
        match self.peek() {
            Some('\\') => self.escape(),
            Some(c) => {
                self.at += 1;
                Ok(c)
            }
            None => Err(self.error_at(self.at, "character class is never closed (missing `]`)")),
        }
    }

    /// The character of the escape at a `\`: GBNF's (`\n \r \t \\ \" \[ \]`, `\xHH`,
    /// `\uHHHH`, `\UHHHHHHHH`) and xgrammar's additions.
    fn escape(&mut self) -> Result<char> {
        let start = self.at;
        self.at += 1;
        let Some(c) = self.peek() else {
            return Err(self.error_at(start, "`\\` at the end of the grammar"));
        };
        self.at += 1;
        let digits = match c {
            'n' => return Ok('\n'),
            'r' => return Ok('\r'),
            't' => return Ok('\t'),
            'b' => return Ok('\u{8}'),
            'f' => return Ok('\u{C}'),
            'v' => return Ok('\u{B}'),
            'a' => return Ok('\u{7}'),
            'e' => return Ok('\u{1B}'),
            '0' => return Ok('\0'),
            '\\' | '"' | '\'' | '/' | '?' | '[' | ']' | '-' | '^' | '$' | '.' | '*' | '+' | '(' | ')'
            | '{' | '}' | '|' => return Ok(c),
            'x' => 2,
            'u' => 4,
            'U' => 8,
            c => return Err(self.error_at(start, format!("unknown escape `\\{c}`"))),
        };
        let hex_start = self.at;
        let mut value = 0u32;
        for _ in 0..digits {
            match self.peek().and_then(|c| c.to_digit(16)) {
                Some(d) => {
                    value = value * 16 + d;
                    self.at += 1;
                }
                None => {
                    return Err(
                        self.error_at(hex_start, format!("`\\{c}` needs {digits} hexadecimal digits"))
                    );
                }
            }
        }
        char::from_u32(value).ok_or_else(|| {
            self.error_at(
                start,
                format!("`\\{c}{value:0digits$X}` is not a Unicode character (a surrogate or past 10FFFF)"),
            )
        })
    }

    fn finish(self) -> Result<Parsed> {
        let mut undefined: Vec<(&String, &Symbol)> =
            self.symbols.iter().filter(|(_, s)| s.defined_at.is_none()).collect();
        undefined.sort_by_key(|(_, s)| s.first_use);
        if let Some((name, symbol)) = undefined.first() {
            let hint = if symbol.called && XGRAMMAR_MACROS.contains(&name.as_str()) {
                format!(" (xgrammar's macro `{name}(...)` is not supported)")
            } else {
                String::new()
            };
            return Err(self.error_at(symbol.first_use, format!("undefined rule `{name}`{hint}")));
        }
        let Some(root) = self.symbols.get("root") else {
            return Err(ConstraintError::InvalidGrammar {
                line: 1,
                column: 1,
                message: "no rule named `root`: the output must match `root`".into(),
            });
        };
        let root = root.index;
        Ok(Parsed {
            defs: self.defs.into_iter().map(|d| d.expect("every symbol is defined")).collect(),
            root,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> Node {
        let parsed = parse(text).unwrap();
        parsed.defs[parsed.root].body.clone()
    }

    fn error(text: &str) -> (usize, usize, String) {
        match parse(text) {
            Err(ConstraintError::InvalidGrammar { line, column, message }) => (line, column, message),
            other => panic!("{text:?}: expected a grammar error, got {:?}", other.map(|p| p.defs)),
        }
    }

    fn text(s: &str) -> Node {
        Node::Text(s.into())
    }

    fn class(ranges: &[(char, char)], negated: bool) -> Node {
        Node::Class { ranges: ranges.to_vec(), negated }
    }

    #[test]
    fn literals_and_escapes() {
        assert_eq!(body(r#"root ::= "ab""#), text("ab"));
        assert_eq!(body(r#"root ::= """#), Node::Empty);
        assert_eq!(body(r#"root ::= "\n\t\r\\\"\x41\u00e9\U0001F600\[\]\/""#), text("\n\t\r\\\"Aé😀[]/"));
        // `\x` takes exactly two digits, as in llama.cpp.
        assert_eq!(body(r#"root ::= "\x41BC""#), text("ABC"));
        assert_eq!(body("root ::= \"a\nb\""), text("a\nb"));
        assert_eq!(body(r#"root ::= "日本""#), text("日本"));
    }

    #[test]
    fn classes() {
        assert_eq!(body("root ::= [a-z0-9_]"), class(&[('a', 'z'), ('0', '9'), ('_', '_')], false));
        assert_eq!(
            body(r#"root ::= [^"\\\x00-\x1F]"#),
            class(&[('"', '"'), ('\\', '\\'), ('\0', '\u{1F}')], true)
        );
        assert_eq!(body("root ::= [-+]"), class(&[('-', '-'), ('+', '+')], false));
        assert_eq!(body("root ::= [+-]"), class(&[('+', '+'), ('-', '-')], false));
        assert_eq!(body(r"root ::= [\]\-]"), class(&[(']', ']'), ('-', '-')], false));
        assert_eq!(body("root ::= [ぁ-ゟ]"), class(&[('ぁ', 'ゟ')], false));
        assert_eq!(body("root ::= ."), class(&[], true));
        assert_eq!(body("root ::= [^]"), class(&[], true));
    }

    #[test]
    fn sequences_alternatives_groups() {
        assert_eq!(
            body(r#"root ::= "a" ("b" | "c") | "d""#),
            Node::Alt(vec![Node::Seq(vec![text("a"), Node::Alt(vec![text("b"), text("c")])]), text("d")])
        );
        assert_eq!(body(r#"root ::= | "a""#), Node::Alt(vec![Node::Empty, text("a")]));
        assert_eq!(body("root ::= ()"), Node::Empty);
        assert_eq!(body(r#"root ::= "a" | "a""#), text("a"));
    }

    #[test]
    fn repetitions() {
        let a = || Box::new(text("a"));
        assert_eq!(body(r#"root ::= "a"*"#), Node::Repeat(a(), 0, None));
        assert_eq!(body(r#"root ::= "a"+"#), Node::Repeat(a(), 1, None));
        assert_eq!(body(r#"root ::= "a"?"#), Node::Repeat(a(), 0, Some(1)));
        assert_eq!(body(r#"root ::= "a"{3}"#), Node::Repeat(a(), 3, Some(3)));
        assert_eq!(body(r#"root ::= "a"{2,}"#), Node::Repeat(a(), 2, None));
        assert_eq!(body(r#"root ::= "a"{ 2 , 5 }"#), Node::Repeat(a(), 2, Some(5)));
        assert_eq!(body(r#"root ::= "a"{0}"#), Node::Empty);
        assert_eq!(body(r#"root ::= "a" *"#), Node::Repeat(a(), 0, None));
        assert_eq!(
            body(r#"root ::= ("a" "b")+"#),
            Node::Repeat(Box::new(Node::Seq(vec![text("a"), text("b")])), 1, None)
        );
    }

    #[test]
    fn rules_span_lines_until_the_next_definition() {
        let parsed =
            parse("# a comment\nroot ::= a\n  b # trailing\n  | \"x\"\na ::= \"1\"\nb ::=\n  \"2\"\n")
                .unwrap();
        let names: Vec<&str> = parsed.defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["root", "a", "b"]);
        assert_eq!(
            parsed.defs[0].body,
            Node::Alt(vec![Node::Seq(vec![Node::Ref(1), Node::Ref(2)]), text("x")])
        );
        assert_eq!(parsed.defs[2].pos, Pos { line: 6, column: 1 });
        assert_eq!(parsed.defs[2].body, text("2"));
        // Names with dashes, underscores and digits.
        let parsed = parse("root ::= my-rule_2\nmy-rule_2 ::= \"x\"").unwrap();
        assert_eq!(parsed.defs[1].name, "my-rule_2");
    }

    #[test]
    fn errors_name_line_and_column() {
        assert_eq!(error("root ::= \"abc").0, 1);
        assert_eq!(error("root ::= \"abc").1, 10);
        assert!(error("root ::= \"abc").2.contains("never closed"));
        let (line, column, message) = error("root ::= a\n\na ::= b c");
        assert_eq!((line, column), (3, 7));
        assert!(message.contains("undefined rule `b`"), "{message}");
        let (line, column, message) = error("a ::= \"x\"");
        assert_eq!((line, column), (1, 1));
        assert!(message.contains("no rule named `root`"));
        let (line, column, message) = error("root ::= \"a\"\nroot ::= \"b\"");
        assert_eq!((line, column), (2, 1));
        assert!(message.contains("defined twice (first at line 1)"));
        let (line, column, message) = error("root ::= (\"a\" | \"b\"");
        assert_eq!((line, column), (1, 10));
        assert!(message.contains("never closed"));
        assert_eq!(error("root ::= \"a\")").2, "unmatched `)`");
        assert!(error("root ::= [a-z").2.contains("never closed"));
        assert!(error("root ::= [z-a]").2.contains("reversed"));
        assert!(error("root ::= []").2.contains("matches nothing"));
        assert!(error(r#"root ::= "\q""#).2.contains("unknown escape `\\q`"));
        assert!(error(r#"root ::= "\x4""#).2.contains("2 hexadecimal digits"));
        assert!(error(r#"root ::= "\uD800""#).2.contains("not a Unicode character"));
        assert!(error(r#"root ::= "a"{3,2}"#).2.contains("maximum below its minimum"));
        assert!(error(r#"root ::= "a"{,2}"#).2.contains("expected a number"));
        assert!(error(r#"root ::= "a"{200000}"#).2.contains("over the limit"));
        assert!(error(r#"root ::= "a"{2"#).2.contains("expected `}`"));
        assert!(error("root ::= *").2.contains("must follow something"));
        let (line, column, message) = error("root ::= \"a\"\n  & \"b\"");
        assert_eq!((line, column, message.as_str()), (2, 3, "unexpected `&`"));
        assert!(error("root ::= (\"a\"").2.contains("never closed"));
        assert!(error("::= \"a\"").2.contains("expected a rule name"));
    }

    #[test]
    fn neighbouring_dialects_are_named() {
        assert!(error("root: \"a\"").2.contains("Lark"));
        assert!(error("root = \"a\";").2.contains("ISO EBNF"));
        assert!(error("root[lazy] ::= \"a\"").2.contains("rule options"));
        assert!(error("root ::= <think> \"a\"").2.contains("token matches"));
        assert!(error("root ::= !<[12]>").2.contains("token matches"));
        assert!(error("root ::= 'a'").2.contains("double quotes"));
        assert!(error("root ::= \"a\" (= \"b\")").2.contains("lookahead"));
        assert!(error("root ::= Regex(\"[0-9]+\")").2.contains("macro `Regex(...)`"));
        // A plain reference followed by a group stays a reference.
        assert!(parse("root ::= f(\"a\")\nf ::= \"b\"").is_ok());
    }

    #[test]
    fn limits() {
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(150), ")".repeat(150));
        assert!(error(&deep).2.contains("nest more than 100"));
        let ok = format!("root ::= {}\"a\"{}", "(".repeat(90), ")".repeat(90));
        assert_eq!(body(&ok), text("a"));
        let huge = format!("root ::= \"{}\"", "a".repeat(MAX_GRAMMAR_BYTES));
        assert!(matches!(parse(&huge), Err(ConstraintError::GrammarTooLarge { .. })));
    }
}
