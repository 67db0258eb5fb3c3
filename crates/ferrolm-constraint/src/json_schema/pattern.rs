//! JSON Schema `pattern` -> a regex over the JSON-encoded string body.
//!
//! Two translations. (1) ECMA-262 syntax and meaning into regex-syntax's: `\d` and `\w`
//! are ASCII in ECMA-262, `\s` is its own list, `.` stops at every line terminator, `[`
//! `&` `~` are plain inside a class; ECMA-only features (lookaround, backreferences,
//! word boundaries, `\c`) are refused. (2) The pattern matches decoded characters but
//! we generate encoded JSON: every character JSON must escape (`"`, `\`, controls) is
//! replaced by its escape as serde_json writes it. A pattern is a search, not a full
//! match, unless anchored with `^` / `$`.

use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Look, Repetition};

/// ECMA-262 `\s`: WhiteSpace and LineTerminator.
const ECMA_SPACE: &str =
    r"\t\n\x0B\x0C\r \xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}";

/// A regex for the encoded body of a JSON string matching `pattern`, given the regex of
/// one encoded character (for the unanchored ends). `Err` explains what is unsupported.
pub fn pattern_regex(pattern: &str, any_char: &str) -> Result<String, String> {
    let translated = ecma_to_regex_syntax(pattern)?;
    let hir = regex_syntax::ParserBuilder::new()
        .nest_limit(128)
        .build()
        .parse(&translated)
        .map_err(|e| format!("cannot read pattern {pattern:?}: {e}"))?;
    let (hir, anchored_start, anchored_end) = strip_anchors(hir);
    let body = encode(&hir)?;
    let start = if anchored_start { String::new() } else { format!("{any_char}*") };
    let end = if anchored_end { String::new() } else { format!("{any_char}*") };
    Ok(format!("{start}(?:{body}){end}"))
}

/// The fewest and most characters of the strings `pattern` matches (`None` for the
/// most: unbounded), or `None` if the pattern is not one we translate. A `minLength` /
/// `maxLength` these bounds already satisfy adds nothing to the pattern.
pub fn pattern_lengths(pattern: &str) -> Option<(u64, Option<u64>)> {
    let translated = ecma_to_regex_syntax(pattern).ok()?;
    let hir = regex_syntax::ParserBuilder::new().nest_limit(128).build().parse(&translated).ok()?;
    let (hir, anchored_start, anchored_end) = strip_anchors(hir);
    let (min, max) = char_lengths(&hir)?;
    // A search: any text may come before and after the match.
    Some((min, max.filter(|_| anchored_start && anchored_end)))
}

fn char_lengths(hir: &Hir) -> Option<(u64, Option<u64>)> {
    Some(match hir.kind() {
        HirKind::Empty => (0, Some(0)),
        HirKind::Look(_) => return None,
        HirKind::Literal(lit) => {
            let n = std::str::from_utf8(&lit.0).ok()?.chars().count() as u64;
            (n, Some(n))
        }
        HirKind::Class(_) => (1, Some(1)),
        HirKind::Repetition(rep) => {
            let (min, max) = char_lengths(&rep.sub)?;
            let most = match (rep.max, max) {
                (_, Some(0)) => Some(0),
                (Some(times), Some(max)) => max.checked_mul(u64::from(times)),
                _ => None,
            };
            (min.saturating_mul(u64::from(rep.min)), most)
        }
        HirKind::Capture(cap) => char_lengths(&cap.sub)?,
        HirKind::Concat(parts) => {
            let (mut min, mut max) = (0u64, Some(0u64));
            for part in parts {
                let (lo, hi) = char_lengths(part)?;
                min = min.saturating_add(lo);
                max = max.zip(hi).and_then(|(a, b)| a.checked_add(b));
            }
            (min, max)
        }
        HirKind::Alternation(parts) => {
            let bounds = parts.iter().map(char_lengths).collect::<Option<Vec<_>>>()?;
            let min = bounds.iter().map(|b| b.0).min().unwrap_or(0);
            let max = bounds.iter().map(|b| b.1).try_fold(0u64, |acc, hi| hi.map(|h| acc.max(h)));
            (min, max)
        }
    })
}

fn ecma_to_regex_syntax(pattern: &str) -> Result<String, String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::new();
    let mut in_class = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\\' {
            let escaped = next.ok_or("a pattern cannot end with a backslash")?;
            match escaped {
                'd' => out.push_str("[[:digit:]]"),
                'D' => out.push_str("[^[:digit:]]"),
                'w' => out.push_str("[[:word:]]"),
                'W' => out.push_str("[^[:word:]]"),
                's' => out.push_str(&format!("[{ECMA_SPACE}]")),
                'S' => out.push_str(&format!("[^{ECMA_SPACE}]")),
                'b' if in_class => out.push_str(r"\x08"),
                'b' | 'B' => return Err("word boundaries (\\b, \\B) in a pattern are not supported".into()),
                '0' if !chars.get(i + 2).is_some_and(char::is_ascii_digit) => out.push_str(r"\x00"),
                '1'..='9' => return Err("backreferences in a pattern are not supported".into()),
                'k' => return Err("named backreferences in a pattern are not supported".into()),
                'c' => return Err("control escapes (\\c) in a pattern are not supported".into()),
                other => {
                    out.push('\\');
                    out.push(other);
                }
            }
            i += 2;
            continue;
        }
        if in_class {
            match c {
                ']' => {
                    in_class = false;
                    out.push(']');
                }
                '[' | '&' | '~' => {
                    out.push('\\');
                    out.push(c);
                }
                _ => out.push(c),
            }
        } else {
            match c {
                '[' => {
                    in_class = true;
                    out.push('[');
                    if next == Some('^') {
                        out.push('^');
                        i += 1;
                    }
                    if chars.get(i + 1) == Some(&']') {
                        return Err("an empty class `[]` in a pattern is not supported".into());
                    }
                }
                '.' => out.push_str(r"[^\n\r\x{2028}\x{2029}]"),
                '(' if next == Some('?') => {
                    let rest: String = chars[i + 2..].iter().take(2).collect();
                    if rest.starts_with('=') || rest.starts_with('!') || rest == "<=" || rest == "<!" {
                        return Err("lookaround in a pattern is not supported".into());
                    }
                    out.push(c);
                }
                _ => out.push(c),
            }
        }
        i += 1;
    }
    Ok(out)
}

/// Remove a leading `^` and a trailing `$` of the top-level sequence; any other anchor
/// stays and is refused by `encode` (it would refer to the whole document).
fn strip_anchors(hir: Hir) -> (Hir, bool, bool) {
    let is_start = |h: &Hir| matches!(h.kind(), HirKind::Look(Look::Start));
    let is_end = |h: &Hir| matches!(h.kind(), HirKind::Look(Look::End));
    if is_start(&hir) {
        return (Hir::empty(), true, false);
    }
    if is_end(&hir) {
        return (Hir::empty(), false, true);
    }
    match hir.into_kind() {
        HirKind::Concat(mut parts) => {
            let start = parts.first().is_some_and(is_start);
            if start {
                parts.remove(0);
            }
            let end = parts.last().is_some_and(is_end);
            if end {
                parts.pop();
            }
            (Hir::concat(parts), start, end)
        }
        kind => (rebuild(kind), false, false),
    }
}

fn rebuild(kind: HirKind) -> Hir {
    match kind {
        HirKind::Empty => Hir::empty(),
        HirKind::Literal(lit) => Hir::literal(lit.0),
        HirKind::Class(class) => Hir::class(class),
        HirKind::Look(look) => Hir::look(look),
        HirKind::Repetition(rep) => Hir::repetition(rep),
        HirKind::Capture(cap) => Hir::capture(cap),
        HirKind::Concat(parts) => Hir::concat(parts),
        HirKind::Alternation(parts) => Hir::alternation(parts),
    }
}

/// Characters JSON must escape inside a string.
fn must_escape() -> ClassUnicode {
    ClassUnicode::new([
        ClassUnicodeRange::new('\0', '\x1f'),
        ClassUnicodeRange::new('"', '"'),
        ClassUnicodeRange::new('\\', '\\'),
    ])
}

/// The same language over encoded characters.
fn encode(hir: &Hir) -> Result<String, String> {
    Ok(encode_hir(hir)?.to_string())
}

fn encode_hir(hir: &Hir) -> Result<Hir, String> {
    Ok(match hir.kind() {
        HirKind::Empty => Hir::empty(),
        HirKind::Literal(lit) => {
            let text =
                std::str::from_utf8(&lit.0).map_err(|_| "a pattern literal is not UTF-8".to_string())?;
            Hir::concat(text.chars().map(encode_char).collect())
        }
        HirKind::Class(Class::Unicode(class)) => {
            let mut raw = class.clone();
            raw.difference(&must_escape());
            let mut special = class.clone();
            special.intersect(&must_escape());
            let mut alternatives = vec![Hir::class(Class::Unicode(raw))];
            for range in special.ranges() {
                alternatives.extend((range.start()..=range.end()).map(encode_char));
            }
            Hir::alternation(alternatives)
        }
        HirKind::Class(Class::Bytes(_)) => return Err("a pattern class over bytes is not supported".into()),
        HirKind::Look(_) => {
            return Err(
                "anchors inside a pattern (other than a leading ^ and a trailing $) are not supported".into(),
            )
        }
        HirKind::Repetition(rep) => {
            Hir::repetition(Repetition { sub: Box::new(encode_hir(&rep.sub)?), ..rep.clone() })
        }
        HirKind::Capture(cap) => encode_hir(&cap.sub)?,
        HirKind::Concat(parts) => Hir::concat(parts.iter().map(encode_hir).collect::<Result<_, _>>()?),
        HirKind::Alternation(parts) => {
            Hir::alternation(parts.iter().map(encode_hir).collect::<Result<_, _>>()?)
        }
    })
}

/// `c` as serde_json writes it inside a string.
fn encode_char(c: char) -> Hir {
    Hir::literal(super::names::unit(c).into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::json_schema::STRING_CHAR as ANY;

    fn matches(pattern: &str, json_string: &str) -> bool {
        let body = pattern_regex(pattern, ANY).unwrap();
        regex::Regex::new(&format!("^\"(?:{body})\"$")).unwrap().is_match(json_string)
    }

    #[test]
    fn search_unless_anchored() {
        assert!(matches("ab", r#""xxabyy""#));
        assert!(!matches("^ab", r#""xxab""#));
        assert!(matches("^ab", r#""abyy""#));
        assert!(!matches("^ab$", r#""abyy""#));
        assert!(matches("^[a-z]+$", r#""hello""#));
    }

    #[test]
    fn ecma_classes_and_dot() {
        assert!(matches(r"^\d+$", r#""123""#));
        assert!(!matches(r"^\d+$", r#""١٢٣""#), "ECMA \\d is ASCII");
        assert!(!matches(r"^\w$", r#""é""#));
        assert!(matches(r"^.$", r#""é""#));
        assert!(!matches(r"^.$", r#""\r""#), "ECMA . stops at line terminators");
        assert!(matches(r"^\s$", r#""\u00a0""#) || matches(r"^\s$", "\"\u{a0}\""));
        assert!(matches(r"^[[]$", r#""[""#));
    }

    #[test]
    fn escapes_json_must_write() {
        assert!(matches(r#"^a"b$"#, r#""a\"b""#));
        assert!(!matches(r#"^a"b$"#, r#""a"b""#));
        assert!(matches(r"^\\$", r#""\\""#));
        assert!(matches(r"^\n$", r#""\n""#));
        assert!(matches(r"^[^a]$", r#""\"""#));
        assert!(matches(r"^[\x00-\x1f]$", r#""\u0001""#));
    }

    #[test]
    fn lengths_of_patterns() {
        assert_eq!(pattern_lengths("[^ ]"), Some((1, None)));
        assert_eq!(pattern_lengths(r"^did:[a-z0-9]+:.+$"), Some((7, None)));
        assert_eq!(pattern_lengths(r"^(ab|c)[0-9]{2,3}$"), Some((3, Some(5))));
        assert_eq!(pattern_lengths("^é?$"), Some((0, Some(1))));
        assert_eq!(pattern_lengths("^$"), Some((0, Some(0))));
        assert_eq!(pattern_lengths("x|^y"), None);
    }

    #[test]
    fn ecma_only_features_are_refused() {
        for pattern in [r"(?=a)", r"(a)\1", r"\bword", r"\cA", "a[]", r"a\"] {
            assert!(pattern_regex(pattern, ANY).is_err(), "{pattern}");
        }
        assert!(pattern_regex("a|^b", ANY).is_err(), "an anchor inside an alternation");
    }
}
