//! `oneOf` as a union, where that is exact: when no value can satisfy two branches.
//!
//! Our regexes cover a canonical subset of each branch (schema order, canonical
//! numbers), so two regexes being disjoint would not prove the schemas are. We prove it
//! on the schemas instead, for the cases that occur in practice: branches whose JSON
//! types cannot overlap (`null` vs an object), and tagged unions (object branches with
//! a required property whose `const`/`enum` values differ). Anything else is left
//! unsupported.

use serde_json::{Map, Value};

use super::{canonical_json, decode_pointer};

/// JSON types as a bit set; `integer` values are also `number` values.
const NULL: u8 = 1;
const BOOLEAN: u8 = 2;
const INTEGER: u8 = 4;
const FRACTIONAL: u8 = 8;
const STRING: u8 = 16;
const ARRAY: u8 = 32;
const OBJECT: u8 = 64;
const ANY: u8 = 127;

/// Whether no value satisfies two of `branches` (resolving local `$ref`s in `root`).
pub fn branches_exclusive(root: &Value, branches: &[Value]) -> bool {
    for (i, a) in branches.iter().enumerate() {
        for b in &branches[i + 1..] {
            if !exclusive(root, a, b) {
                return false;
            }
        }
    }
    true
}

fn exclusive(root: &Value, a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (resolve(root, a, 0), resolve(root, b, 0)) else {
        return false;
    };
    if types(root, a, 0) & types(root, b, 0) == 0 {
        return true;
    }
    tagged_apart(root, a, b)
}

/// Follow `$ref`s (a schema that is only a reference) to an object schema.
fn resolve<'a>(root: &'a Value, schema: &'a Value, depth: usize) -> Option<&'a Map<String, Value>> {
    let map = schema.as_object()?;
    match map.get("$ref").and_then(Value::as_str) {
        Some(reference) if depth < 16 => {
            let target = root.pointer(&decode_pointer(reference.strip_prefix('#')?))?;
            resolve(root, target, depth + 1)
        }
        Some(_) => None,
        None => Some(map),
    }
}

/// The types a schema's values can have (all, where we cannot tell).
fn types(root: &Value, map: &Map<String, Value>, depth: usize) -> u8 {
    if let Some(value) = map.get("const") {
        return type_of(value);
    }
    if let Some(values) = map.get("enum").and_then(Value::as_array) {
        return values.iter().map(type_of).fold(0, |a, b| a | b);
    }
    if let Some(branches) = map.get("anyOf").or_else(|| map.get("oneOf")).and_then(Value::as_array) {
        if depth < 16 {
            return branches
                .iter()
                .map(|b| resolve(root, b, 0).map_or(ANY, |m| types(root, m, depth + 1)))
                .fold(0, |a, b| a | b);
        }
        return ANY;
    }
    let named = match map.get("type") {
        Some(Value::String(t)) => type_bits(t),
        Some(Value::Array(list)) => {
            list.iter().filter_map(Value::as_str).map(type_bits).fold(0, |a, b| a | b)
        }
        _ => ANY,
    };
    if map.get("nullable") == Some(&Value::Bool(true)) {
        named | NULL
    } else {
        named
    }
}

fn type_bits(name: &str) -> u8 {
    match name {
        "null" => NULL,
        "boolean" => BOOLEAN,
        "integer" => INTEGER,
        "number" => INTEGER | FRACTIONAL,
        "string" => STRING,
        "array" => ARRAY,
        "object" => OBJECT,
        _ => ANY,
    }
}

fn type_of(value: &Value) -> u8 {
    match value {
        Value::Null => NULL,
        Value::Bool(_) => BOOLEAN,
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => INTEGER,
        Value::Number(_) => FRACTIONAL,
        Value::String(_) => STRING,
        Value::Array(_) => ARRAY,
        Value::Object(_) => OBJECT,
    }
}

/// Both are objects only, and some property required by both takes values from
/// disjoint `const`/`enum` sets in each (a discriminator).
fn tagged_apart(root: &Value, a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    if types(root, a, 0) != OBJECT || types(root, b, 0) != OBJECT {
        return false;
    }
    let required = |m: &Map<String, Value>| -> Vec<String> {
        m.get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let (required_a, required_b) = (required(a), required(b));
    required_a.iter().filter(|name| required_b.contains(name)).any(|name| {
        let values = |m: &Map<String, Value>| -> Option<Vec<String>> {
            let property = resolve(root, m.get("properties")?.get(name)?, 0)?;
            let listed: Vec<&Value> = match (property.get("const"), property.get("enum")) {
                (Some(value), _) => vec![value],
                (None, Some(Value::Array(values))) => values.iter().collect(),
                _ => return None,
            };
            Some(listed.into_iter().map(canonical_json).collect())
        };
        match (values(a), values(b)) {
            (Some(va), Some(vb)) => va.iter().all(|v| !vb.contains(v)),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exclusive_branches(branches: Value) -> bool {
        branches_exclusive(&json!({}), branches.as_array().unwrap())
    }

    #[test]
    fn by_type() {
        assert!(exclusive_branches(json!([{"type": "null"}, {"type": "object"}])));
        assert!(exclusive_branches(json!([{"type": "string"}, {"type": ["integer", "boolean"]}])));
        assert!(!exclusive_branches(json!([{"type": "integer"}, {"type": "number"}])));
        assert!(exclusive_branches(json!([{"type": "integer"}, {"const": 1.5}])));
        assert!(!exclusive_branches(json!([{"type": "string"}, {}])));
    }

    #[test]
    fn by_discriminator() {
        let cat = json!({"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]});
        let dog = json!({"type": "object", "properties": {"kind": {"enum": ["dog", "wolf"]}}, "required": ["kind"]});
        let any_kind =
            json!({"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]});
        let optional = json!({"type": "object", "properties": {"kind": {"const": "cow"}}});
        assert!(exclusive_branches(json!([cat, dog])));
        assert!(!exclusive_branches(json!([cat, any_kind])));
        assert!(!exclusive_branches(json!([cat, optional])));
    }
}
