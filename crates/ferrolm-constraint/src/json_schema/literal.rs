//! Keywords decided on a known value: next to `const`/`enum` the listed values are all
//! a schema can take, so a `format`, `pattern`, bound, ... keeps those it allows rather
//! than needing an intersection of languages; and `oneOf` branches are proven apart
//! when every value one lists fails the other (`one_of.rs`).
//!
//! Strings are tested as the engine generates them: the pattern's or format's regex
//! over the JSON-encoded body, the encoding serde_json writes (the one `pattern.rs`
//! translates patterns into).

use serde_json::Value;

use super::formats::format_regex;
use super::merge::json_eq;
use super::negate::NOT_ENUM;
use super::pattern::pattern_regex;
use super::{canonical_json, has_type, keyword_type, STRING_CHAR};
use crate::dfa::{ByteDfa, RegexOptions};

/// Whether `value` satisfies `key: keyword` (`None`: not decided here). A keyword of
/// another type than the value's holds, as JSON Schema says.
pub(super) fn keyword_holds(value: &Value, key: &str, keyword: &Value, assert_formats: bool) -> Option<bool> {
    if let Some(ty) = keyword_type(key) {
        if !has_type(value, ty) {
            return Some(true);
        }
    }
    match key {
        "pattern" => {
            let body = pattern_regex(keyword.as_str()?, STRING_CHAR).ok()?;
            string_matches(&body, value)
        }
        "format" if !assert_formats => Some(true),
        "format" => string_matches(&format_regex(keyword.as_str()?)?, value),
        "minLength" | "maxLength" => {
            let length = value.as_str()?.chars().count() as u64;
            let bound = keyword.as_u64()?;
            Some(if key == "minLength" { length >= bound } else { length <= bound })
        }
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => {
            let (v, bound) = (value.as_f64()?, keyword.as_f64()?);
            Some(match key {
                "minimum" => v >= bound,
                "maximum" => v <= bound,
                "exclusiveMinimum" => v > bound,
                _ => v < bound,
            })
        }
        "multipleOf" => {
            // Exact only in integers (floating-point remainders are not).
            let (v, m) = (value.as_i64()?, keyword.as_i64()?);
            (m > 0).then(|| v % m == 0)
        }
        NOT_ENUM => Some(!keyword.as_array()?.iter().any(|x| json_eq(x, value))),
        "const" => Some(json_eq(keyword, value)),
        "enum" => Some(keyword.as_array()?.iter().any(|x| json_eq(x, value))),
        _ => None,
    }
}

/// Whether the JSON string `value` is matched by `body`, a regex over encoded bodies.
fn string_matches(body: &str, value: &Value) -> Option<bool> {
    let encoded = canonical_json(value);
    let inner = encoded.get(1..encoded.len().checked_sub(1)?)?;
    let dfa = small_dfa(body)?;
    Some(dfa.is_accepting(dfa.run(dfa.start(), inner.as_bytes())))
}

/// The DFA of a regex if it is small (a proof that gives up costs little).
pub(super) fn small_dfa(regex: &str) -> Option<ByteDfa> {
    let options = RegexOptions { max_automaton_bytes: 4 << 20, max_states: 4096, ..RegexOptions::default() };
    ByteDfa::from_regex(regex, &options).ok()
}

/// Whether no string is in both languages, as far as a bounded search of the two
/// DFAs' product can tell (`false`: some string is in both, or we could not tell).
pub(super) fn disjoint(a: &ByteDfa, b: &ByteDfa) -> bool {
    const MAX_PAIRS: usize = 20_000;
    let start = (a.start(), b.start());
    let mut seen = std::collections::HashSet::from([start]);
    let mut queue = vec![start];
    while let Some((x, y)) = queue.pop() {
        if a.is_accepting(x) && b.is_accepting(y) {
            return false;
        }
        for byte in 0..=255u8 {
            let next = (a.next(x, byte), b.next(y, byte));
            // Every live state reaches acceptance: only dead ends stop a path.
            if next.0 == crate::dfa::DEAD || next.1 == crate::dfa::DEAD || !seen.insert(next) {
                continue;
            }
            if seen.len() > MAX_PAIRS {
                return false;
            }
            queue.push(next);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keywords_on_values() {
        let holds = |v: Value, k: &str, kw: Value| keyword_holds(&v, k, &kw, true);
        assert_eq!(holds(json!("abc"), "pattern", json!("^a")), Some(true));
        assert_eq!(holds(json!("xabc"), "pattern", json!("^a")), Some(false));
        assert_eq!(holds(json!("x\"y"), "pattern", json!("^x\"y$")), Some(true));
        assert_eq!(holds(json!(3), "pattern", json!("^a")), Some(true));
        assert_eq!(holds(json!("https://a.b/c"), "format", json!("uri")), Some(true));
        assert_eq!(holds(json!(""), "format", json!("uri")), Some(false));
        assert_eq!(keyword_holds(&json!(""), "format", &json!("uri"), false), Some(true));
        assert_eq!(holds(json!("ab"), "minLength", json!(3)), Some(false));
        assert_eq!(holds(json!("é"), "maxLength", json!(1)), Some(true));
        assert_eq!(holds(json!(5), "exclusiveMaximum", json!(5)), Some(false));
        assert_eq!(holds(json!(6), "multipleOf", json!(3)), Some(true));
        assert_eq!(holds(json!(1.5), "multipleOf", json!(0.5)), None);
        assert_eq!(holds(json!("a"), NOT_ENUM, json!(["a"])), Some(false));
        assert_eq!(holds(json!([1]), "uniqueItems", json!(true)), None);
    }

    #[test]
    fn disjoint_patterns() {
        let dfa = |p: &str| small_dfa(&pattern_regex(p, STRING_CHAR).unwrap()).unwrap();
        assert!(disjoint(&dfa(r"\.js$"), &dfa(r"\.css$")));
        assert!(disjoint(&dfa("^[0-9]+$"), &dfa("^[a-z]+$")));
        assert!(!disjoint(&dfa(r"\.js$"), &dfa("^a")));
        assert!(!disjoint(&dfa(r"\.html?$"), &dfa(r"\.htm$")));
    }
}
