//! A schema of any supported draft rewritten into the 2020-12 vocabulary the translator
//! reads, before translation:
//! - keywords the translator does not know are dropped: JSON Schema makes unknown
//!   keywords annotations (`id` in later drafts, `links`, `example`, `x-*`, ...), and so
//!   are `format`s the engine does not assert;
//! - draft 4: `id` is `$id`, boolean `exclusiveMinimum`/`exclusiveMaximum` turn `minimum`/
//!   `maximum` exclusive; drafts 4 to 7: `dependencies` is `dependentRequired` (array
//!   values) / `dependentSchemas` (schema values), and every keyword next to `$ref` is
//!   ignored; drafts 4 to 2019-09: array-form `items` is `prefixItems`, `additionalItems`
//!   then `items`;
//! - references are resolved here, against the base URI each `$id` sets (an absolute
//!   reference to the schema's own `$id`, `#/definitions/...` inside a subschema with its
//!   own `$id`, plain-name fragments of `$anchor` or draft-6/7 `"$id": "#name"`): each
//!   target is normalized once and moved under the root's `$defs`, named by its JSON
//!   pointer in the original document, and every `$ref` points there. A reference that
//!   leaves the document stays as written (the translator refuses it).
//!
//! Known keywords the translator cannot enforce (`$dynamicRef`, `$recursiveRef`, ...)
//! are kept, so that the translator names them in `UnsupportedSchema`.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::formats::is_supported_format;
use crate::error::{ConstraintError, Result};

/// The JSON Schema drafts, picked by `$schema` (2020-12 without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Draft {
    D4,
    D6,
    D7,
    D2019,
    D2020,
}

/// Whether `key` is a keyword of a later draft than `draft`: there it is unknown, an
/// annotation (draft-04's `{"const": "a"}` allows every value, as validators read it).
fn introduced_after(key: &str, draft: Draft) -> bool {
    let since = match key {
        "const" | "contains" | "propertyNames" => Draft::D6,
        "if" | "then" | "else" => Draft::D7,
        "dependentRequired"
        | "dependentSchemas"
        | "unevaluatedProperties"
        | "unevaluatedItems"
        | "minContains"
        | "maxContains" => Draft::D2019,
        "prefixItems" => Draft::D2020,
        _ => return false,
    };
    draft < since
}

/// The draft `$schema` names; `None` for a metaschema that is not one of the drafts
/// (a custom one may switch vocabularies on or off).
pub(super) fn draft_of(schema: &Value) -> Option<Draft> {
    let Some(uri) = schema.get("$schema").and_then(Value::as_str) else {
        return Some(Draft::D2020);
    };
    let known = ["http://json-schema.org/", "https://json-schema.org/"];
    let rest = known.iter().find_map(|k| uri.strip_prefix(k))?;
    let rest = rest.trim_end_matches('#');
    match rest {
        "draft-04/schema" => Some(Draft::D4),
        "draft-06/schema" => Some(Draft::D6),
        "draft-07/schema" => Some(Draft::D7),
        "draft/2019-09/schema" => Some(Draft::D2019),
        "draft/2020-12/schema" | "schema" => Some(Draft::D2020),
        _ => None,
    }
}

/// Keywords that hold one schema.
const ONE_SCHEMA: &[&str] = &[
    "additionalProperties",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
];
/// Keywords that hold a list of schemas.
const SCHEMA_LIST: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
/// Keywords that hold an object of schemas.
const SCHEMA_MAP: &[&str] = &["properties", "patternProperties", "dependentSchemas"];
/// Other keywords the translator reads (their values are data, copied as they are).
const DATA: &[&str] = &[
    "type",
    "required",
    "enum",
    "const",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "nullable",
    "pattern",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "multipleOf",
    "dependentRequired",
];
/// Known keywords that change what is valid and that the translator does not enforce:
/// kept so that it refuses them by name.
pub(super) const UNENFORCED: &[&str] = &["$dynamicRef", "$recursiveRef"];

/// The schema rewritten as described in the module documentation.
pub(super) fn normalize(root: &Value, draft: Draft) -> Result<Value> {
    let mut normalizer =
        Normalizer { root, draft, ids: HashMap::new(), anchors: HashMap::new(), targets: Vec::new() };
    let root_base = normalizer.id_of(root).map(|id| join("", &id)).unwrap_or_default();
    normalizer.ids.insert(String::new(), String::new());
    normalizer.ids.insert(root_base.clone(), String::new());
    normalizer.scan(root, "", &root_base, 0);
    let mut out = normalizer.schema(root, "", &root_base, 0)?;
    let mut defs = Map::new();
    let mut done = 0;
    while done < normalizer.targets.len() {
        let pointer = normalizer.targets[done].clone();
        done += 1;
        let target = root.pointer(&pointer).expect("resolved before queued");
        let base = normalizer.base_at(&pointer, &root_base);
        let normalized = normalizer.schema(target, &pointer, &base, 0)?;
        defs.insert(pointer, normalized);
    }
    // `true`/`false` at the root: nothing refers into it but itself.
    if let (false, Value::Object(map)) = (defs.is_empty(), &mut out) {
        map.insert("$defs".into(), Value::Object(defs));
    }
    Ok(out)
}

/// JSON nesting past which a schema is not walked (serde_json stops at 128 anyway).
const MAX_DEPTH: usize = 256;

struct Normalizer<'a> {
    root: &'a Value,
    draft: Draft,
    /// Absolute (or root-relative) URI of each resource -> its JSON pointer.
    ids: HashMap<String, String>,
    /// (resource URI, plain-name fragment) -> JSON pointer.
    anchors: HashMap<(String, String), String>,
    /// JSON pointers (in the original document) that references lead to, in the order met.
    targets: Vec<String>,
}

impl<'a> Normalizer<'a> {
    /// The `$id` (draft 4: `id`) of a schema object, if a string.
    fn id_of(&self, value: &Value) -> Option<String> {
        let key = if self.draft == Draft::D4 { "id" } else { "$id" };
        value.get(key).and_then(Value::as_str).map(str::to_string)
    }

    /// Record every `$id` and anchor, with the base URI in force at each object.
    fn scan(&mut self, value: &Value, pointer: &str, base: &str, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        match value {
            Value::Object(map) => {
                let mut base = base.to_string();
                if let Some(id) = self.id_of(value) {
                    match id.strip_prefix('#') {
                        // Draft 6/7 (and 4): `"$id": "#name"` is a plain-name anchor.
                        Some(name) if !name.is_empty() && self.draft <= Draft::D7 => {
                            self.anchors.insert((base.clone(), name.to_string()), pointer.to_string());
                        }
                        Some(_) => {}
                        None => {
                            let (uri, _) = id.split_once('#').unwrap_or((&id, ""));
                            base = join(&base, uri);
                            self.ids.entry(base.clone()).or_insert_with(|| pointer.to_string());
                        }
                    }
                }
                for key in ["$anchor", "$dynamicAnchor"] {
                    if let Some(name) = map.get(key).and_then(Value::as_str) {
                        self.anchors.insert((base.clone(), name.to_string()), pointer.to_string());
                    }
                }
                for (key, child) in map {
                    if matches!(key.as_str(), "enum" | "const" | "default" | "examples" | "example") {
                        continue;
                    }
                    self.scan(child, &format!("{pointer}/{}", escape_token(key)), &base, depth + 1);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    self.scan(child, &format!("{pointer}/{i}"), base, depth + 1);
                }
            }
            _ => {}
        }
    }

    /// The base URI in force at `pointer` (the `$id`s met on the way from the root).
    fn base_at(&self, pointer: &str, root_base: &str) -> String {
        let mut base = root_base.to_string();
        let mut walked = String::new();
        for token in pointer.split('/').skip(1) {
            walked.push('/');
            walked.push_str(token);
            let Some(node) = self.root.pointer(&walked) else { break };
            if let Some(id) = self.id_of(node).filter(|id| !id.starts_with('#')) {
                let (uri, _) = id.split_once('#').unwrap_or((&id, ""));
                base = join(&base, uri);
            }
        }
        base
    }

    /// The original JSON pointer a reference leads to, if it stays in this document.
    fn resolve(&self, reference: &str, base: &str) -> Option<String> {
        let (uri, fragment) = reference.split_once('#').unwrap_or((reference, ""));
        let resource_uri = if uri.is_empty() { base.to_string() } else { join(base, uri) };
        let resource = self.ids.get(&resource_uri)?;
        let fragment = percent_decode(fragment);
        let pointer = if fragment.is_empty() {
            resource.clone()
        } else if fragment.starts_with('/') {
            format!("{resource}{fragment}")
        } else {
            self.anchors.get(&(resource_uri, fragment))?.clone()
        };
        self.root.pointer(&pointer).map(|_| pointer)
    }

    /// The reference as the normalized schema writes it (queuing its target).
    fn reference(&mut self, reference: &str, base: &str) -> String {
        let Some(pointer) = self.resolve(reference, base) else {
            return reference.to_string();
        };
        if pointer.is_empty() {
            return "#".into();
        }
        if !self.targets.contains(&pointer) {
            self.targets.push(pointer.clone());
        }
        // `%` would be read as a percent-escape by the translator.
        format!("#/$defs/{}", escape_token(&pointer).replace('%', "%25"))
    }

    fn schema(&mut self, value: &Value, pointer: &str, base: &str, depth: usize) -> Result<Value> {
        if depth > MAX_DEPTH {
            return Err(ConstraintError::GrammarTooLarge {
                message: format!("the schema nests more than {MAX_DEPTH} levels"),
            });
        }
        let Value::Object(map) = value else {
            return Ok(value.clone());
        };
        let mut base = base.to_string();
        if let Some(id) = self.id_of(value).filter(|id| !id.starts_with('#')) {
            let (uri, _) = id.split_once('#').unwrap_or((&id, ""));
            base = join(&base, uri);
        }
        let child = |key: &str| format!("{pointer}/{}", escape_token(key));
        let mut out = Map::new();
        if self.draft <= Draft::D7 {
            if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
                // Drafts 4 to 7 ignore every keyword next to `$ref`.
                out.insert("$ref".into(), Value::String(self.reference(reference, &base)));
                return Ok(Value::Object(out));
            }
        }
        let array_items = self.draft <= Draft::D2019 && map.get("items").is_some_and(Value::is_array);
        for (key, value) in map {
            let key = key.as_str();
            if introduced_after(key, self.draft) {
                continue;
            }
            match key {
                "$ref" => {
                    let written = match value.as_str() {
                        Some(reference) => Value::String(self.reference(reference, &base)),
                        None => value.clone(),
                    };
                    out.insert(key.into(), written);
                }
                "items" if array_items => {
                    let list = self.list(value, &child(key), &base, depth)?;
                    out.insert("prefixItems".into(), list);
                }
                "items" => {
                    let schema = self.schema(value, &child(key), &base, depth + 1)?;
                    out.insert(key.into(), schema);
                }
                "additionalItems" if array_items => {
                    let schema = self.schema(value, &child(key), &base, depth + 1)?;
                    out.insert("items".into(), schema);
                }
                "dependencies" if self.draft <= Draft::D7 => {
                    let Value::Object(dependencies) = value else { continue };
                    for (name, dependency) in dependencies {
                        let (target, written) = if dependency.is_array() {
                            ("dependentRequired", dependency.clone())
                        } else {
                            let path = format!("{}/{}", child(key), escape_token(name));
                            ("dependentSchemas", self.schema(dependency, &path, &base, depth + 1)?)
                        };
                        let entry = out.entry(target).or_insert_with(|| Value::Object(Map::new()));
                        if let Value::Object(entry) = entry {
                            entry.insert(name.clone(), written);
                        }
                    }
                }
                "exclusiveMinimum" | "exclusiveMaximum" if self.draft == Draft::D4 && value.is_boolean() => {
                    let bound = if key == "exclusiveMinimum" { "minimum" } else { "maximum" };
                    if value == &Value::Bool(true) {
                        if let Some(limit) = map.get(bound) {
                            out.insert(key.into(), limit.clone());
                        }
                    }
                }
                "minimum" | "maximum" if self.draft == Draft::D4 => {
                    let exclusive = if key == "minimum" { "exclusiveMinimum" } else { "exclusiveMaximum" };
                    if map.get(exclusive) != Some(&Value::Bool(true)) {
                        out.insert(key.into(), value.clone());
                    }
                }
                // Unknown formats are annotations; known ones are asserted.
                "format" if value.as_str().is_none_or(is_supported_format) => {
                    out.insert(key.into(), value.clone());
                }
                _ if ONE_SCHEMA.contains(&key) => {
                    let schema = self.schema(value, &child(key), &base, depth + 1)?;
                    out.insert(key.into(), schema);
                }
                _ if SCHEMA_LIST.contains(&key) => {
                    let list = self.list(value, &child(key), &base, depth)?;
                    out.insert(key.into(), list);
                }
                _ if SCHEMA_MAP.contains(&key) => {
                    let written = match value {
                        Value::Object(schemas) => {
                            let mut written = Map::new();
                            for (name, schema) in schemas {
                                let path = format!("{}/{}", child(key), escape_token(name));
                                written.insert(name.clone(), self.schema(schema, &path, &base, depth + 1)?);
                            }
                            Value::Object(written)
                        }
                        other => other.clone(),
                    };
                    out.insert(key.into(), written);
                }
                _ if DATA.contains(&key) || UNENFORCED.contains(&key) => {
                    out.insert(key.into(), value.clone());
                }
                // Annotations, identifiers, `$defs` (targets are moved to the root) and
                // unknown keywords.
                _ => {}
            }
        }
        Ok(Value::Object(out))
    }

    fn list(&mut self, value: &Value, pointer: &str, base: &str, depth: usize) -> Result<Value> {
        match value {
            Value::Array(schemas) => Ok(Value::Array(
                schemas
                    .iter()
                    .enumerate()
                    .map(|(i, s)| self.schema(s, &format!("{pointer}/{i}"), base, depth + 1))
                    .collect::<Result<_>>()?,
            )),
            other => Ok(other.clone()),
        }
    }
}

/// A JSON pointer token: `~` as `~0`, `/` as `~1`.
fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

fn percent_decode(text: &str) -> String {
    super::decode_pointer(text)
}

/// `relative` resolved against `base` (enough of RFC 3986 for `$id`s and `$ref`s:
/// absolute URIs, absolute paths, and paths relative to the base's directory).
fn join(base: &str, relative: &str) -> String {
    if relative.is_empty() {
        return base.to_string();
    }
    if relative.contains("://") || relative.starts_with("urn:") || base.is_empty() {
        return relative.to_string();
    }
    if let Some(path) = relative.strip_prefix('/') {
        let authority_end = base.find("://").map(|s| s + 3).and_then(|s| base[s..].find('/').map(|e| s + e));
        return match authority_end {
            Some(end) => format!("{}/{path}", &base[..end]),
            None => format!("{base}/{path}"),
        };
    }
    match base.rfind('/') {
        Some(slash) if !base[..slash].ends_with(':') && !base[..=slash].ends_with("//") => {
            format!("{}{relative}", &base[..=slash])
        }
        _ => match base.find("://") {
            Some(_) if !base.ends_with('/') => format!("{base}/{relative}"),
            _ => format!("{base}{relative}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn joins() {
        assert_eq!(join("https://a.org/x/s.json", "t.json"), "https://a.org/x/t.json");
        assert_eq!(join("https://a.org/x/s.json", "/t.json"), "https://a.org/t.json");
        assert_eq!(join("https://a.org", "t.json"), "https://a.org/t.json");
        assert_eq!(join("", "t.json"), "t.json");
        assert_eq!(join("https://a.org/s.json", "http://b.org/u"), "http://b.org/u");
    }

    #[test]
    fn draft_4_vocabulary() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-04/schema#",
            "id": "https://example.com/s.json",
            "type": "object",
            "properties": {
                "n": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 5},
                "t": {"type": "array", "items": [{"type": "string"}], "additionalItems": false},
                "r": {"$ref": "https://example.com/s.json#/definitions/d", "type": "string"},
            },
            "dependencies": {"a": ["b"], "c": {"required": ["d"]}},
            "definitions": {"d": {"type": "integer", "javaType": "Long"}},
            "x-extra": 1,
        });
        let draft = draft_of(&schema).unwrap();
        assert_eq!(draft, Draft::D4);
        let out = normalize(&schema, draft).unwrap();
        assert_eq!(
            out,
            json!({
                "type": "object",
                "properties": {
                    "n": {"type": "number", "exclusiveMinimum": 0, "maximum": 5},
                    "t": {"type": "array", "prefixItems": [{"type": "string"}], "items": false},
                    "r": {"$ref": "#/$defs/~1definitions~1d"},
                },
                "dependentRequired": {"a": ["b"]},
                "dependentSchemas": {"c": {"required": ["d"]}},
                "$defs": {"/definitions/d": {"type": "integer"}},
            })
        );
    }

    #[test]
    fn keywords_of_later_drafts_are_annotations() {
        let schema = json!({"properties": {"a": {"const": 1, "type": "integer"}}, "contains": {"const": 2},
            "propertyNames": {"maxLength": 1}, "if": {"required": ["a"]}, "then": false,
            "prefixItems": [true], "minContains": 1, "dependentRequired": {"a": ["b"]}});
        let keys = |draft| {
            let out = normalize(&schema, draft).unwrap();
            let mut keys: Vec<String> = out.as_object().unwrap().keys().cloned().collect();
            keys.sort();
            (keys, out["properties"]["a"].as_object().unwrap().contains_key("const"))
        };
        assert_eq!(keys(Draft::D4), (vec!["properties".to_string()], false));
        assert_eq!(keys(Draft::D6).0, ["contains", "properties", "propertyNames"]);
        assert_eq!(keys(Draft::D7).0, ["contains", "if", "properties", "propertyNames", "then"]);
        assert!(keys(Draft::D7).1);
        assert_eq!(keys(Draft::D2019).0.len(), 7);
        assert_eq!(keys(Draft::D2020).0.len(), 8);
    }

    #[test]
    fn anchors_and_ids_in_subschemas() {
        let schema = json!({
            "$id": "https://example.com/root.json",
            "properties": {
                "a": {"$ref": "#foo"},
                "b": {"$ref": "other.json#/$defs/x"},
                "c": {"$ref": "remote.json"},
            },
            "$defs": {
                "f": {"$anchor": "foo", "type": "string", "format": "sha1"},
                "o": {"$id": "other.json", "$defs": {"x": {"type": "null"}}},
            },
        });
        let out = normalize(&schema, Draft::D2020).unwrap();
        assert_eq!(out["properties"]["a"], json!({"$ref": "#/$defs/~1$defs~1f"}));
        assert_eq!(out["properties"]["b"], json!({"$ref": "#/$defs/~1$defs~1o~1$defs~1x"}));
        assert_eq!(out["properties"]["c"], json!({"$ref": "remote.json"}));
        assert_eq!(out["$defs"]["/$defs/f"], json!({"type": "string"}));
        assert_eq!(out["$defs"]["/$defs/o/$defs/x"], json!({"type": "null"}));
    }
}
