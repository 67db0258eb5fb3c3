//! A request body as JSON. JSON has no NaN or infinity, but Python's `json` (and other
//! writers) send `NaN`, `Infinity` and `-Infinity`, and `1e400` overflows to infinity: such
//! a number is a 400 naming the field it sits in, not a bare "invalid JSON".

use serde_json::Value;

use crate::errors::{ApiError, ApiResult};

/// Stands in for a non-finite number while the body is parsed a second time.
const NON_FINITE: &str = "\u{0}ferrolm:non-finite\u{0}";

pub fn parse(body: &[u8]) -> ApiResult<Value> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(first) => {
            let Some(patched) = replace_non_finite(body) else {
                return Err(ApiError::new(400, format!("the body is not valid JSON: {first}")));
            };
            let Ok(value) = serde_json::from_slice::<Value>(&patched) else {
                return Err(ApiError::new(400, format!("the body is not valid JSON: {first}")));
            };
            let mut path = Vec::new();
            if find(&value, &mut path) {
                let param = field_path(&path);
                return Err(ApiError::bad_request(format!("{param}: must be a finite number"), param));
            }
            Err(ApiError::new(400, format!("the body is not valid JSON: {first}")))
        }
    }
}

/// The body with every non-finite number outside strings replaced by the marker string;
/// `None` when there was none.
fn replace_non_finite(body: &[u8]) -> Option<Vec<u8>> {
    let marker = serde_json::to_vec(NON_FINITE).expect("a string serializes");
    let mut out = Vec::with_capacity(body.len());
    let mut found = false;
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        if b == b'"' {
            // copy the string as is, escapes included
            let start = i;
            i += 1;
            while i < body.len() && body[i] != b'"' {
                i += if body[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(body.len());
            out.extend_from_slice(&body[start..i]);
            continue;
        }
        let rest = &body[i..];
        let word =
            ["-Infinity", "Infinity", "NaN", "-NaN"].into_iter().find(|w| rest.starts_with(w.as_bytes()));
        if let Some(w) = word {
            out.extend_from_slice(&marker);
            i += w.len();
            found = true;
            continue;
        }
        if b == b'-' || b.is_ascii_digit() {
            let end = rest
                .iter()
                .position(|c| !(c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E')))
                .unwrap_or(rest.len());
            let number = &rest[..end];
            let overflows = std::str::from_utf8(number)
                .ok()
                .filter(|s| s.contains(['e', 'E', '.']))
                .and_then(|s| s.parse::<f64>().ok())
                .is_some_and(|x| x.is_infinite());
            if overflows {
                out.extend_from_slice(&marker);
                found = true;
            } else {
                out.extend_from_slice(number);
            }
            i += end;
            continue;
        }
        out.push(b);
        i += 1;
    }
    found.then_some(out)
}

fn find(value: &Value, path: &mut Vec<String>) -> bool {
    match value {
        Value::String(s) => s == NON_FINITE,
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i.to_string());
                if find(v, path) {
                    return true;
                }
                path.pop();
            }
            false
        }
        Value::Object(map) => {
            for (k, v) in map {
                path.push(k.clone());
                if find(v, path) {
                    return true;
                }
                path.pop();
            }
            false
        }
        _ => false,
    }
}

/// Fields that hold free-form maps: their keys are data, not fields.
pub const FREE_FORM: &[&str] = &["logit_bias", "json_schema", "guided_json", "metadata", "response_format"];

/// The dotted path that names a field: it stops at a free-form map, and a trailing list
/// index is dropped (`stop_token_ids`, not `stop_token_ids.3`; `messages.0.role` stays).
pub fn field_path(parts: &[String]) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for p in parts {
        kept.push(p);
        if FREE_FORM.contains(&p.as_str()) {
            break;
        }
    }
    while kept.last().is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())) {
        kept.pop();
    }
    kept.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: &str) -> Option<String> {
        parse(body.as_bytes()).unwrap_err().param
    }

    #[test]
    fn non_finite_numbers_name_their_field() {
        assert_eq!(param(r#"{"prompt": "x", "temperature": NaN}"#).as_deref(), Some("temperature"));
        assert_eq!(param(r#"{"top_p": Infinity}"#).as_deref(), Some("top_p"));
        assert_eq!(param(r#"{"t": 1e400}"#).as_deref(), Some("t"));
        assert_eq!(param(r#"{"logit_bias": {"5": -Infinity}}"#).as_deref(), Some("logit_bias"));
        assert_eq!(param(r#"{"sampling_params": {"min_p": NaN}}"#).as_deref(), Some("sampling_params.min_p"));
        // inside a string it is text
        assert_eq!(
            parse(br#"{"prompt": "NaN 1e400 \" Infinity"}"#).unwrap()["prompt"],
            "NaN 1e400 \" Infinity"
        );
    }

    #[test]
    fn malformed_json_is_a_400_without_a_field() {
        for body in ["{", "", "[1,", r#"{"a": nan}"#] {
            let e = parse(body.as_bytes()).unwrap_err();
            assert_eq!((e.status, e.param), (400, None), "{body}");
        }
    }
}
