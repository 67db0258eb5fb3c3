//! Regex text -> HIR in one pass, for the syntax our translators write (JSON Schema and
//! GBNF produce regexes of hundreds of kB). regex-syntax first builds an AST with a span
//! on every node, walks it to check the nesting, translates it and frees it: ~40% of a
//! JSON Schema's compile time. Here the HIR comes straight from the text, through the
//! same smart constructors (`Hir::concat`, `Hir::alternation`, `Hir::class`, ...) that
//! regex-syntax's translator calls with the same arguments, so the result is the HIR
//! regex-syntax would give (tests compare them on every corpus regex).
//!
//! Only a subset is read: literals and escapes of punctuation, `\n` `\t` `\r` `\f` `\v`,
//! `\xHH` and `\x{H..}`; bracket classes of literals and ranges; `(?:` and `(?-u:` groups;
//! `|`; greedy `* + ? {n} {n,} {n,m}`. Anything else (and anything regex-syntax would
//! refuse) gives `None`, and the caller parses with regex-syntax, which also gives the
//! errors.

use regex_syntax::hir::{Class, ClassBytes, ClassBytesRange, ClassUnicode, ClassUnicodeRange};
#[cfg(test)]
use regex_syntax::hir::{Hir, Repetition};

/// The HIR of `pattern` as regex-syntax would parse it (`utf8`: its `utf8` option; the
/// nesting limit as given to it), or `None` if `pattern` is outside the subset read here.
#[cfg(test)]
pub(super) fn parse(pattern: &str, utf8: bool, nest_limit: u32) -> Option<Hir> {
    let mut parser = Parser { text: pattern.as_bytes(), pos: 0, utf8, unicode: true };
    let mut stack: Vec<Group> = Vec::new();
    let mut current = Group::new(true);
    while let Some(b) = parser.peek() {
        match b {
            b'(' => {
                let unicode = if parser.eat(b"(?:") {
                    parser.unicode
                } else if parser.eat(b"(?-u:") {
                    false
                } else {
                    return None; // captures, other flags
                };
                stack.push(std::mem::replace(&mut current, Group::new(parser.unicode)));
                parser.unicode = unicode;
                // regex-syntax counts a group, its alternation, concatenation and a
                // repetition of it as levels (and a class with its union at the bottom).
                if 4 * stack.len() + 6 > nest_limit as usize {
                    return None;
                }
            }
            b')' => {
                parser.pos += 1;
                let outer = stack.pop()?;
                let inner = std::mem::replace(&mut current, outer);
                parser.unicode = inner.unicode_outside;
                current.push_item(inner.finish());
            }
            b'|' => {
                parser.pos += 1;
                current.end_branch();
            }
            b'*' | b'+' | b'?' | b'{' => {
                let (min, max) = parser.repetition()?;
                if parser.peek() == Some(b'?') {
                    return None; // lazy
                }
                current.repeat(min, max)?;
            }
            b'[' => {
                let class = parser.class()?;
                current.push_item(Hir::class(class));
            }
            b'\\' => match parser.escape()? {
                Literal::Char(c) => current.push_char(c),
                Literal::Byte(byte) => current.push_byte(byte),
            },
            b'.' | b'^' | b'$' | b']' | b'}' => return None,
            _ => {
                let c = parser.char()?;
                current.push_char(c);
            }
        }
    }
    if !stack.is_empty() {
        return None; // unclosed group
    }
    Some(current.finish())
}

/// One group being read: its finished branches, and the current branch's items with
/// the literal bytes read since the last item (merged as the translator merges them).
#[cfg(test)]
struct Group {
    branches: Vec<Hir>,
    items: Vec<Hir>,
    literal: Vec<u8>,
    last: Last,
    /// The Unicode flag outside the group, restored when it closes.
    unicode_outside: bool,
}

/// What a repetition operator would apply to.
#[cfg(test)]
#[derive(Clone, Copy, PartialEq)]
enum Last {
    Nothing,
    /// The last `n` bytes of `literal` (one character, or one byte).
    Literal(usize),
    /// The last of `items`.
    Item,
    /// A repetition (a second operator is left to regex-syntax).
    Repetition,
}

#[cfg(test)]
impl Group {
    fn new(unicode_outside: bool) -> Self {
        Group {
            branches: Vec::new(),
            items: Vec::new(),
            literal: Vec::new(),
            last: Last::Nothing,
            unicode_outside,
        }
    }

    fn flush_literal(&mut self) {
        if !self.literal.is_empty() {
            self.items.push(Hir::literal(std::mem::take(&mut self.literal)));
        }
    }

    fn push_item(&mut self, hir: Hir) {
        self.flush_literal();
        self.items.push(hir);
        self.last = Last::Item;
    }

    fn push_char(&mut self, c: char) {
        let mut buffer = [0u8; 4];
        let bytes = c.encode_utf8(&mut buffer).as_bytes();
        self.literal.extend_from_slice(bytes);
        self.last = Last::Literal(bytes.len());
    }

    fn push_byte(&mut self, byte: u8) {
        self.literal.push(byte);
        self.last = Last::Literal(1);
    }

    fn repeat(&mut self, min: u32, max: Option<u32>) -> Option<()> {
        let sub = match self.last {
            Last::Literal(n) => {
                let tail = self.literal.split_off(self.literal.len() - n);
                self.flush_literal();
                Hir::literal(tail)
            }
            Last::Item => self.items.pop()?,
            Last::Nothing | Last::Repetition => return None,
        };
        self.items.push(Hir::repetition(Repetition { min, max, greedy: true, sub: Box::new(sub) }));
        self.last = Last::Repetition;
        Some(())
    }

    fn end_branch(&mut self) {
        self.flush_literal();
        let items = std::mem::take(&mut self.items);
        self.branches.push(concat(items));
        self.last = Last::Nothing;
    }

    fn finish(mut self) -> Hir {
        if self.branches.is_empty() {
            self.flush_literal();
            return concat(self.items);
        }
        self.end_branch();
        Hir::alternation(self.branches)
    }
}

/// As the translator: a concatenation of one item is the item.
#[cfg(test)]
fn concat(mut items: Vec<Hir>) -> Hir {
    if items.len() == 1 {
        items.pop().expect("one item")
    } else {
        Hir::concat(items)
    }
}

pub(super) enum Literal {
    Char(char),
    /// A byte that is not ASCII, in a `(?-u:` group.
    Byte(u8),
}

pub(super) struct Parser<'a> {
    pub(super) text: &'a [u8],
    pub(super) pos: usize,
    /// regex-syntax's `utf8` option: no class or byte that could match invalid UTF-8.
    pub(super) utf8: bool,
    /// The Unicode flag (`(?-u:` clears it inside its group).
    pub(super) unicode: bool,
}

impl Parser<'_> {
    pub(super) fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    pub(super) fn eat(&mut self, prefix: &[u8]) -> bool {
        let found = self.text[self.pos..].starts_with(prefix);
        if found {
            self.pos += prefix.len();
        }
        found
    }

    /// The character at the cursor (the text is a `str`, so it decodes).
    pub(super) fn char(&mut self) -> Option<char> {
        let rest = std::str::from_utf8(&self.text[self.pos..self.text.len().min(self.pos + 4)])
            .or_else(|e| std::str::from_utf8(&self.text[self.pos..self.pos + e.valid_up_to()]))
            .ok()?;
        let c = rest.chars().next()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// `* + ? {n} {n,} {n,m}` at the cursor.
    pub(super) fn repetition(&mut self) -> Option<(u32, Option<u32>)> {
        let b = self.peek()?;
        self.pos += 1;
        match b {
            b'*' => Some((0, None)),
            b'+' => Some((1, None)),
            b'?' => Some((0, Some(1))),
            _ => {
                let min = self.decimal()?;
                let max = if self.eat(b",") {
                    if self.peek() == Some(b'}') {
                        None
                    } else {
                        Some(self.decimal()?)
                    }
                } else {
                    Some(min)
                };
                if !self.eat(b"}") || max.is_some_and(|max| max < min) {
                    return None;
                }
                Some((min, max))
            }
        }
    }

    pub(super) fn decimal(&mut self) -> Option<u32> {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        std::str::from_utf8(&self.text[start..self.pos]).ok()?.parse().ok()
    }

    /// An escape outside a class: a literal, as regex-syntax's translator reads it.
    pub(super) fn escape(&mut self) -> Option<Literal> {
        let (c, hex_byte) = self.escaped_char()?;
        match hex_byte {
            // `(?-u:\xHH)`: a byte; not ASCII, only where invalid UTF-8 is allowed.
            Some(byte) if !self.unicode && byte > 0x7F => (!self.utf8).then_some(Literal::Byte(byte)),
            _ => Some(Literal::Char(c)),
        }
    }

    /// After a backslash: the character meant and, for `\xHH`, the byte it may stand for.
    pub(super) fn escaped_char(&mut self) -> Option<(char, Option<u8>)> {
        self.pos += 1; // the backslash
        let b = self.peek()?;
        self.pos += 1;
        let c = match b {
            b'n' => '\n',
            b't' => '\t',
            b'r' => '\r',
            b'f' => '\x0C',
            b'v' => '\x0B',
            b'x' if self.eat(b"{") => {
                if !self.unicode {
                    return None; // `(?-u:\x{..})` is a character, not a byte: rare, left alone
                }
                let start = self.pos;
                while self.peek().is_some_and(|b| b.is_ascii_hexdigit()) {
                    self.pos += 1;
                }
                let digits = std::str::from_utf8(&self.text[start..self.pos]).ok()?;
                if digits.is_empty() || digits.len() > 8 || !self.eat(b"}") {
                    return None;
                }
                char::from_u32(u32::from_str_radix(digits, 16).ok()?)?
            }
            b'x' => {
                let digits = self.text.get(self.pos..self.pos + 2)?;
                if !digits.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                self.pos += 2;
                let byte = u8::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
                return Some((char::from(byte), Some(byte)));
            }
            // Punctuation stands for itself (`\<` and `\>` are word boundaries).
            b if b.is_ascii_punctuation() && b != b'<' && b != b'>' => char::from(b),
            _ => return None,
        };
        Some((c, None))
    }

    /// A bracket class of literals and ranges, less (`--`) a bracket class at its end
    /// (the "any name but these" classes of `names.rs`).
    pub(super) fn class(&mut self) -> Option<Class> {
        self.pos += 1; // `[`
        let negated = self.eat(b"^");
        let mut ranges: Vec<(char, Option<u8>, char, Option<u8>)> = Vec::new();
        let mut subtracted = None;
        let mut first = true;
        loop {
            let b = self.peek()?;
            let next = self.text.get(self.pos + 1).copied();
            match b {
                b']' if !first => {
                    self.pos += 1;
                    break;
                }
                b']' | b'[' => return None, // `]` first, nested classes, `[:digit:]`
                b'-' if !first && next == Some(b'-') && self.text.get(self.pos + 2) == Some(&b'[') => {
                    self.pos += 2;
                    subtracted = Some(self.class()?);
                    if !self.eat(b"]") {
                        return None;
                    }
                    break;
                }
                b'-' if !first && next != Some(b']') => return None,
                b'&' | b'~' | b'-' if next == Some(b) => return None, // other set operations
                _ => {}
            }
            first = false;
            let (start, start_byte) = self.class_char()?;
            let end =
                if self.peek() == Some(b'-') && !matches!(self.text.get(self.pos + 1), Some(b']' | b'-')) {
                    self.pos += 1;
                    if matches!(self.peek(), Some(b'[' | b']')) {
                        return None;
                    }
                    let end = self.class_char()?;
                    if end.0 < start {
                        return None;
                    }
                    end
                } else {
                    (start, start_byte)
                };
            ranges.push((start, start_byte, end.0, end.1));
        }
        if self.unicode {
            let mut class =
                ClassUnicode::new(ranges.iter().map(|&(a, _, b, _)| ClassUnicodeRange::new(a, b)));
            match subtracted {
                Some(Class::Unicode(other)) => class.difference(&other),
                Some(Class::Bytes(_)) => return None,
                None => {}
            }
            if negated {
                class.negate();
            }
            return Some(Class::Unicode(class));
        }
        // As the translator's `class_literal_byte`: ASCII, or a `\xHH` escape.
        let byte = |c: char, hex: Option<u8>| if c.is_ascii() { Some(c as u8) } else { hex };
        let mut class = ClassBytes::empty();
        for &(a, a_hex, b, b_hex) in &ranges {
            class.push(ClassBytesRange::new(byte(a, a_hex)?, byte(b, b_hex)?));
        }
        match subtracted {
            Some(Class::Bytes(other)) => class.difference(&other),
            Some(Class::Unicode(_)) => return None,
            None => {}
        }
        if negated {
            class.negate();
        }
        if self.utf8 && !class.is_ascii() {
            return None; // an error in regex-syntax
        }
        Some(Class::Bytes(class))
    }

    /// One character of a class, and for `\xHH` the byte it may stand for.
    pub(super) fn class_char(&mut self) -> Option<(char, Option<u8>)> {
        match self.peek()? {
            b'\\' => self.escaped_char(),
            _ => Some((self.char()?, None)),
        }
    }
}

/// Patterns outside what the readers here take (other syntax, or errors): both leave them
/// to regex-syntax. Shared by this reader's tests and the direct reader's.
#[cfg(test)]
pub(super) const OTHER_SYNTAX: &[&str] = &[
    "(a)",
    "(?i:a)",
    "(?i)a",
    "a*?",
    "a**",
    "*a",
    "a|*",
    "a{2,1}",
    "a{",
    "a{x}",
    "[]a]",
    "[a-]b-c]",
    "[[:digit:]]",
    "[a&&b]",
    "[a--b]",
    "[z-a]",
    r"\d",
    r"\w",
    r"\p{L}",
    r"\b",
    r"\<",
    ".",
    "^a$",
    "(?:a",
    "a)",
    r"\",
    r"\xZZ",
    r"\x{110000}",
    "a]",
    "a}",
];

/// Every rule regex the JSON Schema translator writes for the committed corpora's schemas,
/// each with whether its schema became several rules (so the regex may call rules):
/// what the readers' corpus tests check against regex-syntax.
#[cfg(test)]
pub(super) fn corpus_rule_regexes() -> Vec<(String, bool)> {
    use crate::json_schema::{json_schema_to_rules, JsonSchemaOptions};
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut out = Vec::new();
    for corpus in ["schemastore", "kubernetes", "github"] {
        let Ok(entries) = std::fs::read_dir(data.join(corpus).join("schemas")) else { continue };
        for entry in entries {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let Ok(schema) = serde_json::from_str(&text) else { continue };
            let Ok(rules) = json_schema_to_rules(&schema, &JsonSchemaOptions::default()) else { continue };
            let several = rules.len() > 1;
            out.extend(rules.into_iter().map(|rule| (rule, several)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regex_syntax_hir(pattern: &str, utf8: bool) -> Option<Hir> {
        regex_syntax::ParserBuilder::new().nest_limit(1024).utf8(utf8).build().parse(pattern).ok()
    }

    /// Where the one-pass parser reads a pattern, its HIR is regex-syntax's.
    fn same_as_regex_syntax(pattern: &str, utf8: bool) -> bool {
        match parse(pattern, utf8, 1024) {
            Some(hir) => regex_syntax_hir(pattern, utf8).as_ref() == Some(&hir),
            None => true,
        }
    }

    #[test]
    fn reads_the_generated_syntax_as_regex_syntax_does() {
        let patterns = [
            r#""(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*""#,
            r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?",
            r#"\{(?:"a":(?:true|false)(?:,"b":[0-9]{1,3})?)?\}"#,
            r"abc*d+e?f{2}g{2,}h{2,5}(?:ij){0}k{1}",
            r"a(?:)b|(?:c|)|",
            r"[a-c]|[x]|q|\x41|\x{263A}|é|[é-ë]|\n\t\r\f\v|\.\*\-\#\&\~\/\:",
            r"[-a][a-][^-a][+-][\]\\\-\x00-\x1f\x7f]",
            r#"[\x20-\x7f--["\\e]]|[^a-z--[aeiou]]|[a-z--[^b-y]]"#,
            r"(?:a|b|c)",
            r"[ \t\n\r]{0,20}",
            "(?:ab|ac|ad)(?:x|xy)",
            "",
        ];
        for pattern in patterns {
            let hir = parse(pattern, true, 1024);
            assert!(hir.is_some(), "{pattern} is in the subset");
            assert!(same_as_regex_syntax(pattern, true), "{pattern}");
        }
    }

    #[test]
    fn reads_rule_calls_as_bytes() {
        for pattern in [r"a(?-u:\xFF\xF8\xF9\xFA)b", r"(?-u:[\x00-\x7f]|\xFE)", r"(?-u:\x41\xF8+)"] {
            assert!(parse(pattern, false, 1024).is_some(), "{pattern}");
            assert!(same_as_regex_syntax(pattern, false), "{pattern}");
        }
        // Not UTF-8: an error in regex-syntax, so not read here either.
        assert!(parse(r"(?-u:\xFF)", true, 1024).is_none());
        assert!(parse(r"(?-u:[^a])", true, 1024).is_none());
    }

    #[test]
    fn leaves_other_syntax_and_errors_to_regex_syntax() {
        for pattern in OTHER_SYNTAX {
            assert!(parse(pattern, true, 1024).is_none(), "{pattern}");
        }
    }

    #[test]
    fn deep_nesting_is_left_to_regex_syntax() {
        let nested = |depth: usize| format!("{}a{}", "(?:b|".repeat(depth), ")".repeat(depth));
        assert!(parse(&nested(100), true, 1024).is_some());
        assert!(same_as_regex_syntax(&nested(100), true));
        assert!(parse(&nested(600), true, 1024).is_none());
    }

    #[test]
    fn every_regex_of_the_corpus_schemas_parses_as_with_regex_syntax() {
        let (mut read, mut total) = (0usize, 0usize);
        for (rule, several) in corpus_rule_regexes() {
            let utf8 = !several;
            total += rule.len();
            if let Some(hir) = parse(&rule, utf8, 1024) {
                read += rule.len();
                assert_eq!(Some(hir), regex_syntax_hir(&rule, utf8), "{}", &rule[..rule.len().min(300)]);
            }
        }
        assert!(total > 1 << 20, "the corpora are present: {total} bytes of regex");
        // What the translator writes is in the subset (all of it when written).
        assert!(read * 100 >= total * 99, "read {read} of {total} bytes");
    }
}
