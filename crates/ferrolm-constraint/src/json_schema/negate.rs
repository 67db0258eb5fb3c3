//! The complement of a flat schema as a union of flat schemas, for the keywords whose
//! violation is itself a schema: a value fails `{k1, k2, ...}` when it has another type,
//! or has the type of some `ki` and violates it (`minLength: 3` -> `{type: string,
//! maxLength: 2}`, `required: [a]` -> `{type: object, properties: {a: false}}`,
//! `properties: {a: S}` -> `a` present with a value of `not S`, `items: S` -> `contains:
//! not S`, `const`/`enum` -> the other values of their types). Other keywords (`pattern`,
//! `format`, `additionalProperties` other than `false`, ...) are `UnsupportedSchema`;
//! `additionalProperties: false` fails where a member is named none of the declared
//! names (`SOME_OTHER`, which `objects.rs` writes as "one of the declared members not in
//! the list, or an extra member"). This gives `not`,
//! `if`/`then`/`else` (`if ∧ then` or `not if ∧ else`) and `oneOf` with overlapping
//! branches (each branch and the negation of the others).

use serde_json::{json, Map, Value};

use super::merge::{type_list, types_value};
use super::{Translator, ANNOTATIONS};
use crate::error::Result;

/// Internal type: numbers that are not integers.
pub(super) const FRACTION: &str = "\u{1}non-integer number";
/// Internal keyword: values (of the schema's scalar types) that are excluded.
pub(super) const NOT_ENUM: &str = "\u{1}not one of";
/// Internal keyword: objects that, for each of these lists of names, have a member
/// named none of the names in it (the violations of `additionalProperties: false`; a
/// conjunction of them lists several).
pub(super) const SOME_OTHER: &str = "\u{1}a member not named";
/// Internal keyword: objects with at least one extra member (one `properties` does
/// not declare), written after the declared ones as extra members are.
pub(super) const SOME_EXTRA: &str = "\u{1}an extra member";

const ALL_TYPES: [&str; 6] = ["null", "boolean", "number", "string", "array", "object"];

impl Translator<'_> {
    /// The values failing `schema`, as a union of flat schemas (empty: none).
    pub(super) fn negate(
        &mut self,
        schema: &Value,
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<Vec<Map<String, Value>>> {
        let flat = self.flatten(schema, path, inlined, depth + 1)?;
        // not (A or B) = not A and not B.
        let mut cases = vec![Map::new()];
        for map in &flat.maps {
            let negated = self.negate_map(map, path, inlined, depth)?;
            cases = self.product(&cases, &negated, path, inlined, depth)?;
        }
        Ok(cases)
    }

    fn negate_map(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<Vec<Map<String, Value>>> {
        let types = type_list(map);
        let mut cases: Vec<Map<String, Value>> = Vec::new();
        if let Some(types) = &types {
            let others = complement(types);
            if !others.is_empty() {
                cases.push(any_of_types(others));
            }
        }
        for (key, value) in map {
            let key = key.as_str();
            if ANNOTATIONS.contains(&key) || key == "type" {
                continue;
            }
            let invalid = |what: &str| crate::error::ConstraintError::InvalidSchema {
                path: path.to_string(),
                message: format!("`{key}` must be {what}"),
            };
            let number = |v: &Value| v.as_f64().ok_or_else(|| invalid("a number"));
            let count = |v: &Value| v.as_u64().ok_or_else(|| invalid("a count"));
            let violations: Vec<Value> = match key {
                "minimum" => vec![json!({"type": "number", "exclusiveMaximum": number(value)?})],
                "exclusiveMinimum" => vec![json!({"type": "number", "maximum": number(value)?})],
                "maximum" => vec![json!({"type": "number", "exclusiveMinimum": number(value)?})],
                "exclusiveMaximum" => vec![json!({"type": "number", "minimum": number(value)?})],
                "minLength" | "minItems" => match count(value)? {
                    0 => Vec::new(),
                    n => {
                        let (ty, max) =
                            if key == "minLength" { ("string", "maxLength") } else { ("array", "maxItems") };
                        vec![json!({"type": ty, max: n - 1})]
                    }
                },
                "maxLength" => vec![json!({"type": "string", "minLength": count(value)? + 1})],
                "maxItems" => vec![json!({"type": "array", "minItems": count(value)? + 1})],
                "required" => value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|name| {
                        let name = as_name(name)?;
                        Ok(json!({"type": "object", "properties": {name: false}, "additionalProperties": true}))
                    })
                    .collect::<Result<_>>()?,
                "properties" => {
                    let mut out = Vec::new();
                    for (name, schema) in value.as_object().into_iter().flatten() {
                        let failing = self.negate(schema, path, inlined, depth + 1)?;
                        if !failing.is_empty() {
                            out.push(json!({"type": "object", "required": [name],
                                "properties": {name.clone(): union(failing)}, "additionalProperties": true}));
                        }
                    }
                    out
                }
                "items" if !map.contains_key("prefixItems") => {
                    let failing = self.negate(value, path, inlined, depth + 1)?;
                    if failing.is_empty() {
                        Vec::new()
                    } else {
                        vec![json!({"type": "array", "contains": union(failing)})]
                    }
                }
                "contains" if !map.contains_key("minContains") && !map.contains_key("maxContains") => {
                    let failing = self.negate(value, path, inlined, depth + 1)?;
                    vec![json!({"type": "array", "items": union(failing)})]
                }
                // A member of another name, of any value.
                "additionalProperties" if value == &Value::Bool(false) => {
                    if map.contains_key("patternProperties") {
                        return Err(self.unsupported("not (of `additionalProperties` next to `patternProperties`)", path));
                    }
                    let declared: Vec<Value> = match map.get("properties") {
                        Some(Value::Object(properties)) => properties.keys().cloned().map(Value::String).collect(),
                        _ => Vec::new(),
                    };
                    vec![json!({"type": "object", "additionalProperties": true, SOME_OTHER: [declared]})]
                }
                "additionalProperties" if value == &Value::Bool(true) => Vec::new(),
                "not" => {
                    let flat = self.flatten(value, path, inlined, depth + 1)?;
                    flat.maps.into_iter().map(Value::Object).collect()
                }
                "const" | "enum" => {
                    let values = match key {
                        "const" => vec![value.clone()],
                        _ => value.as_array().cloned().ok_or_else(|| invalid("an array"))?,
                    };
                    let Some(others) = other_values(&values) else {
                        return Err(self.unsupported(&format!("not (of `{key}`)"), path));
                    };
                    others
                }
                _ => return Err(self.unsupported(&format!("not (of `{key}`)"), path)),
            };
            for violation in violations {
                let Value::Object(violation) = violation else { continue };
                // Within the schema's types, where it lists some.
                let case = match &types {
                    Some(types) => {
                        let typed: Map<String, Value> =
                            std::iter::once(("type".to_string(), types_value(types.clone()))).collect();
                        self.merge(&typed, &violation, path, inlined, depth)?
                    }
                    None => Some(violation),
                };
                cases.extend(case);
            }
        }
        Ok(cases)
    }

    /// Every `a ∧ b`, at most `MAX_BRANCHES` of them.
    pub(super) fn product(
        &mut self,
        left: &[Map<String, Value>],
        right: &[Map<String, Value>],
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<Vec<Map<String, Value>>> {
        let mut out = Vec::new();
        for a in left {
            for b in right {
                out.extend(self.merge(a, b, path, inlined, depth)?);
                if out.len() > super::merge::MAX_BRANCHES {
                    return Err(self.unsupported("allOf/anyOf/not combining into too many cases", path));
                }
            }
        }
        Ok(out)
    }
}

fn as_name(name: &Value) -> Result<String> {
    name.as_str().map(str::to_string).ok_or_else(|| crate::error::ConstraintError::InvalidSchema {
        path: "#".into(),
        message: "`required` entries must be strings".into(),
    })
}

/// The types not in `types` (integers: numbers that are not integers).
fn complement(types: &[String]) -> Vec<String> {
    let has = |t: &str| types.iter().any(|u| u == t);
    let mut out = Vec::new();
    for t in ALL_TYPES {
        if has(t) {
            continue;
        }
        if t == "number" {
            if has("integer") {
                if !has(FRACTION) {
                    out.push(FRACTION.to_string());
                }
            } else if has(FRACTION) {
                out.push("integer".to_string());
            } else {
                out.push(t.to_string());
            }
        } else {
            out.push(t.to_string());
        }
    }
    out
}

/// Values of any of these types (objects with any members).
fn any_of_types(types: Vec<String>) -> Map<String, Value> {
    let object = types.iter().any(|t| t == "object");
    let mut map: Map<String, Value> = std::iter::once(("type".to_string(), types_value(types))).collect();
    if object {
        map.insert("additionalProperties".into(), Value::Bool(true));
    }
    map
}

fn union(cases: Vec<Map<String, Value>>) -> Value {
    match cases.len() {
        0 => Value::Bool(false),
        1 => Value::Object(cases.into_iter().next().expect("one")),
        _ => json!({ "anyOf": cases }),
    }
}

/// Every value but these: per type, the other values. `None` for values we cannot
/// exclude (arrays, objects, non-integer numbers).
fn other_values(values: &[Value]) -> Option<Vec<Value>> {
    let mut excluded_numbers = Vec::new();
    let mut excluded_strings = Vec::new();
    let (mut null, mut yes, mut no) = (false, false, false);
    for value in values {
        match value {
            Value::Null => null = true,
            Value::Bool(true) => yes = true,
            Value::Bool(false) => no = true,
            Value::Number(n) => {
                let f = n.as_f64()?;
                if f.fract() != 0.0 || f.abs() > 1e15 {
                    return None;
                }
                excluded_numbers.push(Value::from(f as i64));
            }
            Value::String(_) => excluded_strings.push(value.clone()),
            _ => return None,
        }
    }
    let mut out = Vec::new();
    if !null {
        out.push(json!({"type": "null"}));
    }
    match (yes, no) {
        (true, true) => {}
        (true, false) => out.push(json!({"const": false})),
        (false, true) => out.push(json!({"const": true})),
        (false, false) => out.push(json!({"type": "boolean"})),
    }
    out.push(json!({"type": "integer", NOT_ENUM: excluded_numbers}));
    out.push(json!({"type": FRACTION}));
    out.push(json!({"type": "string", NOT_ENUM: excluded_strings}));
    out.push(json!({"type": ["array", "object"], "additionalProperties": true}));
    Some(out)
}
