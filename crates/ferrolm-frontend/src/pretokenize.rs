//! A hand-written splitter for the pre-tokenizer regexes of the common byte-level BPE
//! tokenizers, in place of the `tokenizers` crate's regex engine (fancy-regex, which the
//! patterns' lookahead `\s+(?!\S)` needs, and which took about three quarters of the time
//! of encoding a chat prompt).
//!
//! Recognized, by the exact pattern text in `tokenizer.json`:
//! - cl100k / Llama 3 (and the embedded tiny model):
//!   `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//! - Qwen 2 / 2.5 / 3: the same with `\p{N}` (one digit a piece);
//! - GPT-2's, as `ByteLevel` with `use_regex` applies it:
//!   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
//!
//! Each gives the pieces the regex gives (leftmost-first alternation, greedy repeats with
//! their backtracking worked out by hand below), with the character classes taken from
//! `regex-syntax`, the tables the regex engine itself uses. Any other pre-tokenizer runs
//! as the `tokenizers` crate has it.

use std::sync::OnceLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::tokenizer::pattern::Pattern;
use tokenizers::{Offsets, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior};

pub const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
pub const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Which regex a [`FastSplit`] stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitKind {
    /// cl100k's family: `max_digits` is 3 (cl100k, Llama 3) or 1 (Qwen 2).
    Cl100k {
        max_digits: usize,
    },
    Gpt2,
}

impl SplitKind {
    pub fn from_pattern(pattern: &str) -> Option<Self> {
        match pattern {
            CL100K_PATTERN => Some(SplitKind::Cl100k { max_digits: 3 }),
            QWEN2_PATTERN => Some(SplitKind::Cl100k { max_digits: 1 }),
            GPT2_PATTERN => Some(SplitKind::Gpt2),
            _ => None,
        }
    }
}

/// The splitter as a `tokenizers` pattern: every piece is a match (these regexes match
/// every character, so there are no gaps).
#[derive(Clone, Copy, Debug)]
pub struct FastSplit(pub SplitKind);

impl Pattern for FastSplit {
    fn find_matches(&self, inside: &str) -> tokenizers::Result<Vec<(Offsets, bool)>> {
        Ok(split(self.0, inside).into_iter().map(|r| (r, true)).collect())
    }
}

const L: u8 = 1;
const N: u8 = 2;
const S: u8 = 4;

struct Classes {
    ascii: [u8; 128],
    letters: Vec<(char, char)>,
    numbers: Vec<(char, char)>,
    spaces: Vec<(char, char)>,
}

fn ranges(class: &str) -> Vec<(char, char)> {
    use regex_syntax::hir::{Class, HirKind};
    let hir = regex_syntax::Parser::new().parse(class).expect("a Unicode class");
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c.ranges().iter().map(|r| (r.start(), r.end())).collect(),
        other => unreachable!("{class} parsed as {other:?}"),
    }
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let letters = ranges(r"\p{L}");
        let numbers = ranges(r"\p{N}");
        let spaces = ranges(r"\s");
        let mut ascii = [0u8; 128];
        for (b, slot) in ascii.iter_mut().enumerate() {
            let c = char::from(b as u8);
            *slot = if within(&letters, c) { L } else { 0 }
                | if within(&numbers, c) { N } else { 0 }
                | if within(&spaces, c) { S } else { 0 };
        }
        Classes { ascii, letters, numbers, spaces }
    })
}

fn within(ranges: &[(char, char)], c: char) -> bool {
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// `L`, `N`, `S` bits of a character (0: none of them, "punctuation" below).
#[inline]
fn class_of(t: &Classes, c: char) -> u8 {
    if c.is_ascii() {
        return t.ascii[c as usize];
    }
    if within(&t.letters, c) {
        L
    } else if within(&t.numbers, c) {
        N
    } else if within(&t.spaces, c) {
        S
    } else {
        0
    }
}

/// The text's characters with their byte offsets and classes, and one sentinel past the
/// end (class `u8::MAX`, so no test for a class matches it).
fn scan(t: &Classes, text: &str) -> Vec<(usize, char, u8)> {
    let mut out = Vec::with_capacity(text.len() + 1);
    out.extend(text.char_indices().map(|(i, c)| (i, c, class_of(t, c))));
    out.push((text.len(), '\0', u8::MAX));
    out
}

/// The byte ranges of the pieces `kind`'s regex splits `text` into.
pub fn split(kind: SplitKind, text: &str) -> Vec<Offsets> {
    let t = classes();
    let chars = scan(t, text);
    let n = chars.len() - 1; // characters, without the sentinel
    let class = |i: usize| chars[i].2;
    let is = |i: usize, bits: u8| i < n && class(i) & bits != 0;
    let punct = |i: usize| i < n && class(i) == 0;
    let newline = |i: usize| i < n && matches!(chars[i].1, '\r' | '\n');
    let run = |mut i: usize, keep: &dyn Fn(usize) -> bool| {
        while keep(i) {
            i += 1;
        }
        i
    };
    let mut pieces = Vec::with_capacity(text.len() / 3 + 1);
    let mut i = 0;
    while i < n {
        let c = chars[i].1;
        let end = match kind {
            SplitKind::Cl100k { max_digits } => {
                if let Some(e) = contraction(&chars, i, true) {
                    e
                } else if is(i, L) {
                    run(i + 1, &|k| is(k, L))
                } else if !is(i, L | N) && !newline(i) && is(i + 1, L) {
                    // [^\r\n\p{L}\p{N}]?\p{L}+ with its optional character
                    run(i + 2, &|k| is(k, L))
                } else if is(i, N) {
                    let mut e = i + 1;
                    while e < i + max_digits && is(e, N) {
                        e += 1;
                    }
                    e
                } else if punct(i) || (c == ' ' && punct(i + 1)) {
                    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
                    let e = run(if c == ' ' { i + 2 } else { i + 1 }, &|k| punct(k));
                    run(e, &|k| newline(k))
                } else {
                    // whitespace: `\s*[\r\n]+` ends after the run's last newline;
                    // else `\s+(?!\S)` leaves the run's last character to the next
                    // piece (when one follows), else `\s+`
                    let e = run(i, &|k| is(k, S));
                    match (i..e).rev().find(|&k| newline(k)) {
                        Some(last) => last + 1,
                        None => whitespace_end(i, e, n),
                    }
                }
            }
            SplitKind::Gpt2 => {
                let spaced = c == ' ';
                if let Some(e) = contraction(&chars, i, false) {
                    e
                } else if is(i, L) || (spaced && is(i + 1, L)) {
                    run(i + 1, &|k| is(k, L))
                } else if is(i, N) || (spaced && is(i + 1, N)) {
                    run(i + 1, &|k| is(k, N))
                } else if punct(i) || (spaced && punct(i + 1)) {
                    run(i + 1, &|k| punct(k))
                } else {
                    whitespace_end(i, run(i, &|k| is(k, S)), n)
                }
            }
        };
        debug_assert!(end > i);
        pieces.push((chars[i].0, chars[end].0));
        i = end;
    }
    pieces
}

/// Where `\s+(?!\S)|\s+` ends on the whitespace run `start..end` (characters).
fn whitespace_end(start: usize, end: usize, n: usize) -> usize {
    if end == n || end - start == 1 {
        end
    } else {
        end - 1
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `i` (case-insensitive as the regex engine folds case:
/// `ſ` is an `s`), the end of the match.
fn contraction(chars: &[(usize, char, u8)], i: usize, fold: bool) -> Option<usize> {
    if chars[i].1 != '\'' {
        return None;
    }
    let at = |k: usize| chars.get(k).map(|c| c.1).unwrap_or('\0');
    let eq = |k: usize, want: char| {
        let c = at(k);
        c == want || (fold && (c == want.to_ascii_uppercase() || (want == 's' && c == 'ſ')))
    };
    if eq(i + 1, 's') || eq(i + 1, 't') || eq(i + 1, 'm') || eq(i + 1, 'd') {
        return Some(i + 2);
    }
    if (eq(i + 1, 'r') || eq(i + 1, 'v')) && eq(i + 2, 'e') || eq(i + 1, 'l') && eq(i + 2, 'l') {
        return Some(i + 3);
    }
    None
}

/// GPT-2's byte-to-character table (`ByteLevel`'s): printable Latin-1 bytes stand for
/// themselves, the others for 256 + n in byte order.
fn byte_chars() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut table = ['\0'; 256];
        let mut n = 0;
        for b in 0..=255u8 {
            table[b as usize] = if printable(b) {
                char::from(b)
            } else {
                n += 1;
                char::from_u32(255 + n).expect("below 512")
            };
        }
        table
    })
}

/// The pieces of `text` as `byte_level_only`'s pre-tokenizer hands them to the model:
/// split, then each piece's bytes as GPT-2's characters; `f` takes each piece.
pub fn byte_level_pieces(kind: SplitKind, add_prefix_space: bool, text: &str, mut f: impl FnMut(&str)) {
    let spaced;
    let text = if add_prefix_space && !text.starts_with(' ') {
        spaced = format!(" {text}");
        spaced.as_str()
    } else {
        text
    };
    let table = byte_chars();
    let mut piece = String::new();
    for (start, end) in split(kind, text) {
        piece.clear();
        piece.extend(text.as_bytes()[start..end].iter().map(|&b| table[b as usize]));
        f(&piece);
    }
}

/// A pre-tokenizer read from `tokenizer.json` that runs a recognized split regex with
/// [`FastSplit`], and anything else as the `tokenizers` crate does.
#[derive(Clone, Debug)]
pub enum FastPreTokenizer {
    /// `Split(regex, Isolated)` (or `ByteLevel` with its GPT-2 regex) by [`FastSplit`],
    /// then the rest of the sequence.
    Fast {
        kind: SplitKind,
        add_prefix_space: bool,
        rest: Vec<PreTokenizerWrapper>,
        source: Value,
    },
    Other(PreTokenizerWrapper),
}

impl FastPreTokenizer {
    /// Whether the split regex is the hand-written one.
    pub fn is_fast(&self) -> bool {
        matches!(self, FastPreTokenizer::Fast { .. })
    }

    /// The split and whether a prefix space is added, when the whole pre-tokenizer is the
    /// split then GPT-2's byte-to-character mapping (`ByteLevel` without its regex or
    /// prefix space): what [`byte_level_pieces`] does without the crate's alignment
    /// bookkeeping.
    pub fn byte_level_only(&self) -> Option<(SplitKind, bool)> {
        let FastPreTokenizer::Fast { kind, add_prefix_space, rest, .. } = self else { return None };
        match rest.as_slice() {
            [PreTokenizerWrapper::ByteLevel(b)] if !b.use_regex && !b.add_prefix_space => {
                Some((*kind, *add_prefix_space))
            }
            _ => None,
        }
    }

    /// From the `pre_tokenizer` object of `tokenizer.json`.
    pub fn from_json(source: Value) -> Result<Self, serde_json::Error> {
        if let Some(fast) = Self::recognize(&source)? {
            return Ok(fast);
        }
        Ok(FastPreTokenizer::Other(serde_json::from_value(source)?))
    }

    fn recognize(source: &Value) -> Result<Option<Self>, serde_json::Error> {
        let steps: Vec<Value> = match source.get("type").and_then(Value::as_str) {
            Some("Sequence") => match source.get("pretokenizers").and_then(Value::as_array) {
                Some(steps) => steps.clone(),
                None => return Ok(None),
            },
            _ => vec![source.clone()],
        };
        let Some(first) = steps.first() else { return Ok(None) };
        let kind = match first.get("type").and_then(Value::as_str) {
            Some("Split") => {
                let pattern = first.pointer("/pattern/Regex").and_then(Value::as_str);
                let isolated = first.get("behavior").and_then(Value::as_str) == Some("Isolated");
                let inverted = first.get("invert").and_then(Value::as_bool) != Some(false);
                match pattern.and_then(SplitKind::from_pattern) {
                    Some(kind) if isolated && !inverted => (kind, false, None),
                    _ => return Ok(None),
                }
            }
            Some("ByteLevel") if first.get("use_regex").and_then(Value::as_bool).unwrap_or(true) => {
                // the same step, without its own regex, after the fast split
                let mut bytes = first.clone();
                bytes["use_regex"] = json!(false);
                bytes["add_prefix_space"] = json!(false);
                let prefix = first.get("add_prefix_space").and_then(Value::as_bool).unwrap_or(true);
                (SplitKind::Gpt2, prefix, Some(bytes))
            }
            _ => return Ok(None),
        };
        let (kind, add_prefix_space, replaced) = kind;
        let mut rest = Vec::new();
        if let Some(bytes) = replaced {
            rest.push(serde_json::from_value(bytes)?);
        }
        for step in &steps[1..] {
            rest.push(serde_json::from_value(step.clone())?);
        }
        Ok(Some(FastPreTokenizer::Fast { kind, add_prefix_space, rest, source: source.clone() }))
    }
}

impl PreTokenizer for FastPreTokenizer {
    fn pre_tokenize(&self, pretokenized: &mut PreTokenizedString) -> tokenizers::Result<()> {
        match self {
            FastPreTokenizer::Other(p) => p.pre_tokenize(pretokenized),
            FastPreTokenizer::Fast { kind, add_prefix_space, rest, .. } => {
                let pattern = FastSplit(*kind);
                pretokenized.split(|_, mut normalized| {
                    if *add_prefix_space && !normalized.get().starts_with(' ') {
                        normalized.prepend(" ");
                    }
                    normalized.split(pattern, SplitDelimiterBehavior::Isolated)
                })?;
                for step in rest {
                    step.pre_tokenize(pretokenized)?;
                }
                Ok(())
            }
        }
    }
}

impl<'de> Deserialize<'de> for FastPreTokenizer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let source = Value::deserialize(deserializer)?;
        FastPreTokenizer::from_json(source).map_err(serde::de::Error::custom)
    }
}

impl Serialize for FastPreTokenizer {
    fn serialize<Z: Serializer>(&self, serializer: Z) -> Result<Z::Ok, Z::Error> {
        match self {
            FastPreTokenizer::Fast { source, .. } => source.serialize(serializer),
            FastPreTokenizer::Other(p) => p.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::split::Split;
    use tokenizers::OffsetReferential;
    use tokenizers::OffsetType;

    /// The pieces the `tokenizers` crate's own regex gives (GPT-2's: the regex alone,
    /// ByteLevel's byte mapping would change the pieces' text).
    fn reference(kind: SplitKind, text: &str) -> Vec<Offsets> {
        static SPLITS: OnceLock<Vec<Split>> = OnceLock::new();
        let splits = SPLITS.get_or_init(|| {
            [CL100K_PATTERN, QWEN2_PATTERN, GPT2_PATTERN]
                .map(|p| {
                    Split::new(
                        tokenizers::pre_tokenizers::split::SplitPattern::Regex(p.into()),
                        SplitDelimiterBehavior::Isolated,
                        false,
                    )
                    .unwrap()
                })
                .into()
        });
        let split = match kind {
            SplitKind::Cl100k { max_digits: 3 } => &splits[0],
            SplitKind::Cl100k { .. } => &splits[1],
            SplitKind::Gpt2 => &splits[2],
        };
        let mut pre = PreTokenizedString::from(text);
        split.pre_tokenize(&mut pre).unwrap();
        pre.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(_, o, _)| o).collect()
    }

    const KINDS: [SplitKind; 3] =
        [SplitKind::Cl100k { max_digits: 3 }, SplitKind::Cl100k { max_digits: 1 }, SplitKind::Gpt2];

    fn check(text: &str) {
        for kind in KINDS {
            assert_eq!(split(kind, text), reference(kind, text), "{kind:?} on {text:?}");
        }
    }

    #[test]
    fn same_pieces_as_the_regex_on_chosen_strings() {
        for text in [
            "",
            "Hello world",
            "  leading and trailing  ",
            "I'm sure you'll say it's what we'd've done; THEY'RE, 'S 'sx 'ſ ''s",
            "numbers 1 12 123 1234 12345 3.14159 1,000,000 ٣٤٥ 一二三 ⅣⅫ ²³",
            "tabs\tand\t\tnewlines\n\n\r\n  \n x\n\ny \n",
            "punct!!! ... ?!\n\n(parens) [brackets] {braces} \"quotes\" 'single'",
            "unicode: héllo naïve café Ελληνικά русский 中文字符 日本語 한국어 עברית العربية",
            "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷 combining e\u{301} a\u{308}",
            "nbsp\u{a0}here\u{2003}em\u{3000}ideo \u{85}nel \u{2028}ls",
            "mixed123abc abc123 _under_score snake_case camelCase ALLCAPS",
            "code: fn main() { let x = vec![1, 2, 3]; println!(\"{x:?}\"); }\n",
            "   \n   \n\t\t\n",
            "a",
            " ",
            "\n",
            "'",
            "'s",
            " 's",
            " !",
            " 1",
            "x  ",
            "x  y",
            "$100.00 -5 +3 #tag @user e-mail@example.com http://example.com/a?b=c",
        ] {
            check(text);
        }
    }

    #[test]
    fn same_pieces_as_the_regex_on_random_strings() {
        // characters from every class the patterns tell apart, several bytes wide too
        let alphabet: Vec<char> =
            "aZé字ſK1٣²Ⅳ 'sStTrReEvVmMlLdD\t\r\n\u{a0}\u{3000}\u{85}.,!?-_\"😀\u{301}\u{200d}"
                .chars()
                .collect();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let len = (next() % 32) as usize;
            let text: String =
                (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect();
            check(&text);
        }
    }

    #[test]
    fn byte_level_characters_are_gpt2s() {
        let t = byte_chars();
        assert_eq!((t[b' ' as usize], t[b'\n' as usize], t[0], t[b'a' as usize]), ('Ġ', 'Ċ', 'Ā', 'a'));
        assert_eq!((t[0xA0], t[0xAD], t[0xFF]), ('ł', 'Ń', 'ÿ'));
        let mut pieces = Vec::new();
        byte_level_pieces(SplitKind::Cl100k { max_digits: 3 }, false, "Hi  é\n", |p| {
            pieces.push(p.to_string())
        });
        assert_eq!(pieces, ["Hi", "Ġ", "ĠÃ©", "Ċ"]);
        pieces.clear();
        byte_level_pieces(SplitKind::Gpt2, true, "Hi", |p| pieces.push(p.to_string()));
        assert_eq!(pieces, ["ĠHi"]);
    }

    #[test]
    fn recognizes_the_patterns_and_falls_back_for_others() {
        let split = |pattern: &str| {
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})
        };
        assert!(FastPreTokenizer::from_json(split(CL100K_PATTERN)).unwrap().is_fast());
        assert!(FastPreTokenizer::from_json(split(QWEN2_PATTERN)).unwrap().is_fast());
        assert!(!FastPreTokenizer::from_json(split(r"\w+|\s+")).unwrap().is_fast());
        let gpt2 =
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        assert!(FastPreTokenizer::from_json(gpt2).unwrap().is_fast());
        let plain =
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false});
        assert!(!FastPreTokenizer::from_json(plain).unwrap().is_fast());
    }
}
