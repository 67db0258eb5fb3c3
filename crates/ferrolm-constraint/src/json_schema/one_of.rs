//! `oneOf` as a union, where that is exact: when no value can satisfy two branches.
//!
//! Our regexes cover a canonical subset of each branch (schema order, canonical
//! numbers), so two regexes being disjoint would not prove the schemas are. We prove it
//! on the schemas instead, for the cases that occur in practice: branches whose JSON
//! types cannot overlap (`null` vs an object); a branch listing values (`const`/`enum`)
//! each of which the other refuses (a value failing its `pattern`, `format`, bounds,
//! ...: `literal.rs`); string branches whose patterns no string matches both of (their
//! automata's product is empty); and object branches that a property both require (or
//! the context requires) tells apart: its schemas are exclusive in turn (tagged unions),
//! or one branch is closed (`additionalProperties: false`) without it. Anything else is
//! left to the negation of the other branches (`merge.rs`).

use serde_json::{Map, Value};

use super::literal::{disjoint, keyword_holds, small_dfa};
use super::pattern::pattern_regex;
use super::{decode_pointer, STRING_CHAR};

/// JSON types as a bit set; `integer` values are also `number` values.
const NULL: u8 = 1;
const BOOLEAN: u8 = 2;
const INTEGER: u8 = 4;
const FRACTIONAL: u8 = 8;
const STRING: u8 = 16;
const ARRAY: u8 = 32;
const OBJECT: u8 = 64;
const ANY: u8 = 127;

/// Deepest nesting of the proof (properties of properties, references).
const MAX_DEPTH: usize = 8;

/// What the proof reads the schemas with.
pub struct Context<'a> {
    /// The root, to resolve local `$ref`s.
    pub root: &'a Value,
    /// Whether `format` is asserted (else an annotation).
    pub assert_formats: bool,
}

/// Whether no value satisfies two of `branches`, among the values the `oneOf`'s
/// `siblings` allow (their `type` and `required` are read).
pub fn branches_exclusive(context: &Context, branches: &[Value], siblings: &Map<String, Value>) -> bool {
    let required: Vec<&str> = siblings
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let types = match siblings.get("type") {
        Some(_) => declared_types(siblings),
        None => ANY,
    };
    for (i, a) in branches.iter().enumerate() {
        for b in &branches[i + 1..] {
            if !exclusive(context, a, b, types, &required, 0) {
                return false;
            }
        }
    }
    true
}

/// `exclusive` among values of the `allowed` types that have the `required` members.
fn exclusive(context: &Context, a: &Value, b: &Value, allowed: u8, required: &[&str], depth: usize) -> bool {
    let root = context.root;
    if depth > MAX_DEPTH {
        return false;
    }
    if a == &Value::Bool(false) || b == &Value::Bool(false) {
        return true;
    }
    let (Some(a), Some(b)) = (resolve(root, a, 0), resolve(root, b, 0)) else {
        return false;
    };
    let common = types(root, a, 0) & types(root, b, 0) & allowed;
    if common == 0 {
        return true;
    }
    if values_fail(context, a, b, depth) || values_fail(context, b, a, depth) {
        return true;
    }
    if common == STRING && patterns_apart(a, b) {
        return true;
    }
    common == OBJECT && objects_apart(context, a, b, required, depth)
}

/// `a` lists its values, and `b` refuses each of them.
fn values_fail(context: &Context, a: &Map<String, Value>, b: &Map<String, Value>, depth: usize) -> bool {
    let values: Vec<&Value> = match (a.get("const"), a.get("enum")) {
        (Some(value), _) => vec![value],
        (None, Some(Value::Array(values))) => values.iter().collect(),
        _ => return false,
    };
    let nullable = a.get("nullable") == Some(&Value::Bool(true));
    !nullable && values.iter().all(|v| refuses(context, b, v, depth + 1))
}

/// Whether the schema `map` certainly refuses `value` (`false`: allows it, or we
/// cannot tell).
fn refuses(context: &Context, map: &Map<String, Value>, value: &Value, depth: usize) -> bool {
    let root = context.root;
    if depth > MAX_DEPTH || (value.is_null() && map.get("nullable") == Some(&Value::Bool(true))) {
        return false;
    }
    if types(root, map, 0) & type_of(value) == 0 {
        return true;
    }
    let refused_by = |schema: &Value| match schema {
        Value::Bool(b) => !b,
        _ => resolve(root, schema, 0).is_some_and(|m| refuses(context, m, value, depth + 1)),
    };
    for (key, keyword) in map {
        let refused = match key.as_str() {
            "allOf" => keyword.as_array().is_some_and(|list| list.iter().any(refused_by)),
            "anyOf" | "oneOf" => keyword.as_array().is_some_and(|list| list.iter().all(refused_by)),
            "required" => value.as_object().is_some_and(|members| {
                keyword
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|n| n.as_str().is_some_and(|n| !members.contains_key(n)))
            }),
            "properties" => value.as_object().is_some_and(|members| {
                members.iter().any(|(name, v)| {
                    keyword.get(name).is_some_and(|schema| match schema {
                        Value::Bool(b) => !b,
                        _ => resolve(root, schema, 0).is_some_and(|m| refuses(context, m, v, depth + 1)),
                    })
                })
            }),
            _ => keyword_holds(value, key, keyword, context.assert_formats) == Some(false),
        };
        if refused {
            return true;
        }
    }
    false
}

/// Both take strings only, and no string matches both patterns.
fn patterns_apart(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    let dfa = |m: &Map<String, Value>| {
        let pattern = m.get("pattern")?.as_str()?;
        small_dfa(&pattern_regex(pattern, STRING_CHAR).ok()?)
    };
    match (dfa(a), dfa(b)) {
        (Some(x), Some(y)) => disjoint(&x, &y),
        _ => false,
    }
}

/// Both take objects only, and some property present in every value both could take
/// (required by either, or by the context) cannot satisfy both.
fn objects_apart(
    context: &Context,
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    required: &[&str],
    depth: usize,
) -> bool {
    let listed = |m: &Map<String, Value>| -> Vec<String> {
        m.get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let mut present: Vec<String> = required.iter().map(|n| n.to_string()).collect();
    present.extend(listed(a));
    present.extend(listed(b));
    present.iter().any(|name| {
        fn declared<'m>(m: &'m Map<String, Value>, name: &str) -> Option<&'m Value> {
            m.get("properties").and_then(|p| p.get(name))
        }
        // A closed object without the name (or declaring it `false`) cannot have it.
        let excludes = |m: &Map<String, Value>| match declared(m, name) {
            Some(schema) => schema == &Value::Bool(false),
            None => {
                m.get("additionalProperties") == Some(&Value::Bool(false))
                    && !m.contains_key("patternProperties")
            }
        };
        if excludes(a) || excludes(b) {
            return true;
        }
        match (declared(a, name), declared(b, name)) {
            (Some(x), Some(y)) => exclusive(context, x, y, ANY, &[], depth + 1),
            _ => false,
        }
    })
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
    declared_types(map)
}

/// The types `type` (and OpenAPI's `nullable`) allow.
fn declared_types(map: &Map<String, Value>) -> u8 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exclusive_branches(branches: Value) -> bool {
        let context = Context { root: &json!({}), assert_formats: true };
        branches_exclusive(&context, branches.as_array().unwrap(), &Map::new())
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
        // Present in every value of `cat`, so `optional`'s constraint applies to it.
        assert!(exclusive_branches(json!([cat, optional])));
        let optional_cat = json!({"type": "object", "properties": {"kind": {"const": "cat"}}});
        assert!(!exclusive_branches(json!([optional_cat, optional])), "{{}} satisfies both");
    }

    #[test]
    fn by_listed_values_patterns_and_closed_objects() {
        assert!(exclusive_branches(json!([{"type": "string", "pattern": "^[0-9 x]+$"}, {"enum": ["any"]}])));
        assert!(!exclusive_branches(
            json!([{"type": "string", "pattern": "^[0-9a-z]+$"}, {"enum": ["any"]}])
        ));
        assert!(exclusive_branches(json!([{"type": "string", "format": "uri"}, {"const": ""}])));
        assert!(exclusive_branches(
            json!([{"type": "string", "pattern": "\\.js$"}, {"type": "string", "pattern": "\\.css$"}])
        ));
        assert!(!exclusive_branches(json!([{"pattern": "\\.js$"}, {"pattern": "\\.css$"}])), "non-strings");
        let user = json!({"type": "object", "required": ["login"]});
        let team = json!({"type": "object", "properties": {"slug": {}}, "additionalProperties": false});
        assert!(exclusive_branches(json!([user, team])));
        let open_team = json!({"type": "object", "properties": {"slug": {}}});
        assert!(!exclusive_branches(json!([user, open_team])));
        let context = Context { root: &json!({}), assert_formats: false };
        assert!(!branches_exclusive(
            &context,
            &[json!({"format": "uri"}), json!({"const": ""})],
            &Map::new()
        ));
        // Among the values the siblings allow: objects with `kind`.
        let siblings = json!({"type": "object", "required": ["kind"]});
        let branches =
            [json!({"properties": {"kind": {"const": 1}}}), json!({"properties": {"kind": {"const": 2}}})];
        assert!(branches_exclusive(&context, &branches, siblings.as_object().unwrap()));
        assert!(!branches_exclusive(&context, &branches, &Map::new()));
    }
}
