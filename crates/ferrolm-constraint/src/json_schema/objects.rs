//! Objects: declared members in schema order (optional ones omissible), then extra
//! members under other names, all written canonically so that "another name" is exact.
//!
//! - `propertyNames` restricts every name: a declared one it refuses may not be
//!   present; extra names are the canonical names of the right length (`minLength` /
//!   `maxLength`), matching its `pattern` (when no declared name does: excluding a name
//!   from a pattern would need a difference of languages), or its `const`/`enum`
//!   (then each listed name is one more optional member).
//! - `patternProperties`: a declared or required name matching patterns takes the
//!   intersection of its schema and theirs (`merge.rs`); extra names matching them take
//!   their schema. Exact where no difference of languages is needed: with
//!   `additionalProperties` false (or absent in strict mode), the patterns' schemas all
//!   equal (names matching several need no intersection) and no declared name
//!   matching one (it would have to be excluded from the pattern); with
//!   `additionalProperties` a schema, only patterns with that same schema. Others are
//!   `UnsupportedSchema`.
//! - `minProperties` / `maxProperties` count the members as they are written: a regex
//!   per (position, count so far), refused when that grows too large.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

use regex_automata::dfa::regex::Regex;
use rustc_hash::FxHashMap;
use serde_json::{json, Map, Value};

use super::merge::json_eq;
use super::names::{matches_every_name, name_except, name_except_len, name_outside, unit, CANONICAL_CHAR};
use super::negate::{SOME_EXTRA, SOME_OTHER};
use super::pattern::pattern_regex;
use super::values::escape_pointer;
use super::{Translator, ANNOTATIONS};
use crate::error::{ConstraintError, Result};
use crate::recursive::{mark, Mark};

/// Largest counted-members regex we write, in bytes.
const MAX_COUNTED_REGEX: u128 = 200_000;

/// A name pattern: its regex over the canonical name body, and a matcher for it, built
/// when a name is first tested (Unicode classes make it costly).
struct NamePattern {
    /// The pattern as the schema writes it.
    source: String,
    body: String,
    matcher: std::cell::OnceCell<Option<Arc<Regex>>>,
}

impl NamePattern {
    fn new(pattern: &str) -> std::result::Result<Self, String> {
        let body = pattern_regex(pattern, CANONICAL_CHAR)?;
        Ok(NamePattern { source: pattern.to_string(), body, matcher: std::cell::OnceCell::new() })
    }

    /// Whether `name` matches (a pattern we cannot build a matcher for matches every
    /// name, and `object` then refuses the schema: see `untestable`).
    fn matches(&self, name: &str) -> bool {
        let matcher = self.matcher.get_or_init(|| name_matcher(&self.body));
        matcher.as_ref().is_none_or(|m| m.is_match(&canonical_body(name)))
    }

    fn untestable(&self) -> bool {
        matches!(self.matcher.get(), Some(None))
    }
}

/// The matcher of a name pattern's body, `None` if it cannot be built. Remembered
/// process-wide: schemas repeat their patterns (`^x-` in every OpenAPI object), and
/// building a DFA over Unicode classes costs more than translating a small object.
fn name_matcher(body: &str) -> Option<Arc<Regex>> {
    /// Bytes of matchers kept; the memo is emptied when a new one would pass this.
    const BUDGET_BYTES: usize = 16 << 20;
    #[derive(Default)]
    struct Memo {
        matchers: FxHashMap<String, Option<Arc<Regex>>>,
        bytes: usize,
    }
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    let lock = || memo.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(known) = lock().matchers.get(body) {
        return known.clone();
    }
    // Built without the lock held, so other compilations go on meanwhile.
    let built = Regex::new(&format!("^(?:{body})$")).ok().map(Arc::new);
    let bytes =
        body.len() + built.as_ref().map_or(0, |r| r.forward().memory_usage() + r.reverse().memory_usage());
    let mut memo = lock();
    if memo.bytes + bytes > BUDGET_BYTES {
        memo.matchers.clear();
        memo.bytes = 0;
    }
    if memo.matchers.insert(body.to_string(), built.clone()).is_none() {
        memo.bytes += bytes;
    }
    built
}

/// A name as serde_json writes it between the quotes.
fn canonical_body(name: &str) -> String {
    name.chars().map(unit).collect()
}

/// What `propertyNames` allows.
#[derive(Default)]
struct NameFilter {
    nothing: bool,
    min: u64,
    max: Option<u64>,
    pattern: Option<NamePattern>,
    values: Option<Vec<String>>,
}

impl NameFilter {
    fn allows(&self, name: &str) -> bool {
        let length = name.chars().count() as u64;
        !self.nothing
            && length >= self.min
            && self.max.is_none_or(|m| length <= m)
            && self.pattern.as_ref().is_none_or(|p| p.matches(name))
            && self.values.as_ref().is_none_or(|v| v.iter().any(|n| n == name))
    }
}

fn is_true(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => *b,
        Value::Object(map) => map.keys().all(|k| ANNOTATIONS.contains(&k.as_str())),
        _ => false,
    }
}

fn same_schema(a: &Value, b: &Value) -> bool {
    json_eq(a, b) || (is_true(a) && is_true(b))
}

impl<'a> Translator<'a> {
    pub(super) fn object(&mut self, map: &Map<String, Value>, path: &str) -> Result<String> {
        if let Some(listed) = map.get(SOME_OTHER) {
            return self.some_other_member(map, listed, path);
        }
        // The schema of members not named in `properties`, if any are allowed.
        let any = Value::Bool(true);
        let extra_schema: Option<&Value> = match map.get("additionalProperties") {
            Some(Value::Bool(false)) => None,
            None if self.strict => None,
            None => Some(&any),
            Some(schema) => Some(schema),
        };
        let properties: Vec<(&String, &Value)> = match map.get("properties") {
            None => Vec::new(),
            Some(Value::Object(p)) => p.iter().collect(),
            Some(_) => return Err(self.invalid(path, "`properties` must be an object")),
        };
        let required: Vec<&str> = match map.get("required") {
            None => Vec::new(),
            Some(Value::Array(list)) => list
                .iter()
                .map(|v| v.as_str().ok_or_else(|| self.invalid(path, "`required` entries must be strings")))
                .collect::<Result<_>>()?,
            Some(_) => return Err(self.invalid(path, "`required` must be an array")),
        };
        let undeclared: Vec<&str> = required
            .iter()
            .copied()
            .filter(|name| !properties.iter().any(|(p, _)| p.as_str() == *name))
            .collect();
        let filter = self.name_filter(map, path)?;
        let patterns = self.pattern_properties(map, path)?;
        // The schemas of the patterns a name matches, as one schema.
        let pattern_schema = |name: &str| -> Option<Value> {
            let matching: Vec<&Value> =
                patterns.iter().filter(|(p, _)| p.matches(name)).map(|(_, s)| *s).collect();
            match matching.len() {
                0 => None,
                1 => Some(matching[0].clone()),
                _ => Some(json!({ "allOf": matching })),
            }
        };
        let ws = self.ws.clone();
        let mut members = Vec::new();
        let mut member_names: Vec<String> = Vec::new();
        for (name, schema) in &properties {
            let is_required = required.contains(&name.as_str());
            let allowed = filter.as_ref().is_none_or(|f| f.allows(name));
            let member_path = format!("{path}/properties/{}", escape_pointer(name));
            let value = match pattern_schema(name) {
                _ if **schema == Value::Bool(false) || !allowed => None,
                Some(matching) => self.intersection(schema, &matching, &member_path)?,
                None => {
                    // A member whose schema allows no value may not be present.
                    let value = self.schema(schema, &member_path);
                    match self.allows_nothing(&value, &member_path) {
                        true => None,
                        false => Some(self.shared(value?)),
                    }
                }
            };
            // Absent: the member may not be present (its name is still not "other").
            let Some(value) = value else {
                if is_required {
                    return Err(self.nothing(path, format!("required property {name:?} allows no value")));
                }
                continue;
            };
            let key = self.member_key(name)?;
            members.push((format!("{key}{ws}:{ws}(?:{value})"), is_required));
            member_names.push(name.to_string());
        }
        // Required but not described: present, after the others, with a value of the
        // patterns it matches, else of the `additionalProperties` schema if there is
        // one (else of any type).
        for name in &undeclared {
            if filter.as_ref().is_some_and(|f| !f.allows(name)) {
                return Err(self.nothing(path, format!("required property {name:?} is not a valid name")));
            }
            let key = self.member_key(name)?;
            let value = match (pattern_schema(name), map.get("additionalProperties")) {
                (Some(matching), _) => self.schema(&matching, &format!("{path}/patternProperties"))?,
                (None, Some(Value::Bool(false))) => {
                    return Err(self.nothing(path, format!("required property {name:?} is not allowed")))
                }
                (None, Some(schema)) => self.schema(schema, &format!("{path}/additionalProperties"))?,
                (None, None) => self.any_value(),
            };
            members.push((format!("{key}{ws}:{ws}(?:{value})"), true));
            member_names.push(name.to_string());
        }
        let mut declared: Vec<&str> = properties.iter().map(|(n, _)| n.as_str()).collect();
        declared.extend(&undeclared);
        // `propertyNames` listing the names: each other one is an optional member.
        if let Some(listed) = filter.as_ref().and_then(|f| f.values.as_ref()) {
            for name in listed {
                if declared.contains(&name.as_str()) || !filter.as_ref().is_some_and(|f| f.allows(name)) {
                    continue;
                }
                let value_schema = match pattern_schema(name) {
                    Some(matching) => matching,
                    None => match extra_schema {
                        Some(schema) => schema.clone(),
                        None => continue,
                    },
                };
                let key = self.member_key(name)?;
                let value = self.schema(&value_schema, &format!("{path}/propertyNames"))?;
                members.push((format!("{key}{ws}:{ws}(?:{value})"), false));
                member_names.push(name.to_string());
            }
        }
        let extra = match &filter {
            Some(f) if f.values.is_some() || f.nothing => None,
            _ => self.extra_member(extra_schema, &patterns, filter.as_ref(), &declared, path)?,
        };
        let filter_pattern = filter.as_ref().and_then(|f| f.pattern.as_ref());
        if patterns.iter().map(|(p, _)| p).chain(filter_pattern).any(NamePattern::untestable) {
            return Err(self.unsupported("a name pattern too large to test names against", path));
        }
        let (min, max) = self.counts(map, "minProperties", "maxProperties", path)?;
        let required_count = members.iter().filter(|(_, r)| *r).count() as u64;
        let some_extra = map.get(SOME_EXTRA) == Some(&Value::Bool(true));
        if some_extra && extra.is_none() {
            return Err(self.nothing(path, "no extra member is allowed"));
        }
        if self.any_order {
            if some_extra {
                return Err(
                    self.unsupported("not (of `additionalProperties`) with members in any order", path)
                );
            }
            if min > required_count || max.is_some() {
                self.refuse("minProperties/maxProperties with members in any order", path)?;
            }
            let required: Vec<&str> =
                member_names.iter().zip(&members).filter(|(_, (_, r))| *r).map(|(n, _)| n.as_str()).collect();
            return self.any_order_object(&members, extra, &required, path);
        }
        let body = if min <= required_count && max.is_none() {
            uncounted_body(&members, extra, some_extra, &ws)
        } else if some_extra {
            return Err(
                self.unsupported("not (of `additionalProperties`) next to minProperties/maxProperties", path)
            );
        } else {
            match counted_body(&members, extra.as_deref(), min, max, &ws) {
                Ok(body) => body,
                Err(Uncountable::NoCount) => {
                    return Err(self.nothing(path, "no object satisfies minProperties/maxProperties"))
                }
                Err(Uncountable::TooLarge) => {
                    self.refuse("minProperties/maxProperties (too many optional members to count)", path)?;
                    uncounted_body(&members, extra, false, &ws)
                }
            }
        };
        Ok(format!(r"\{{{ws}{body}{ws}\}}"))
    }

    /// A member's name as a regex; with members in any order, followed by its mark.
    pub(super) fn member_key(&mut self, name: &str) -> Result<String> {
        let key = regex_syntax::escape(&Value::String(name.to_string()).to_string());
        if !self.any_order {
            return Ok(key);
        }
        let next = self.name_ids.len() as u32;
        let id = *self.name_ids.entry(name.to_string()).or_insert(next);
        if id as usize > Mark::LIMIT {
            return Err(ConstraintError::GrammarTooLarge {
                message: format!("more than {} member names with members in any order", Mark::LIMIT),
            });
        }
        Ok(format!("{key}{}", mark(Mark::Member(id))))
    }

    /// An object whose members (each already followed by its name's mark) come in any
    /// order: any of them, or an extra one, separated by commas; the marks note each
    /// name (refusing it seen twice) and check the required ones at the close.
    pub(super) fn any_order_object(
        &mut self,
        members: &[(String, bool)],
        extra: Option<String>,
        required: &[&str],
        path: &str,
    ) -> Result<String> {
        let mut required: Vec<u32> = required.iter().map(|n| self.name_ids[*n]).collect();
        required.sort_unstable();
        required.dedup();
        let required: Box<[u32]> = required.into();
        let set = match self.required_sets.iter().position(|r| *r == required) {
            Some(set) => set,
            None => {
                self.required_sets.push(required);
                self.required_sets.len() - 1
            }
        };
        if set > Mark::LIMIT {
            return Err(ConstraintError::GrammarTooLarge {
                message: format!(
                    "more than {} required sets with members in any order at {path}",
                    Mark::LIMIT
                ),
            });
        }
        let alternatives: Vec<&str> =
            members.iter().map(|(m, _)| m.as_str()).chain(extra.as_deref()).collect();
        let (open, close) = (mark(Mark::Open), mark(Mark::Close(set as u32)));
        let ws = &self.ws;
        if alternatives.is_empty() {
            return Ok(format!(r"\{{{open}{ws}{close}\}}"));
        }
        // Each member written once: the marks before it tell the first from the others
        // (only those come after a comma).
        let (first, next) = (mark(Mark::First), mark(Mark::Next));
        let member = alternatives.join("|");
        Ok(format!(r"\{{{open}{ws}(?:(?:{first}|{next},{ws})(?:{member}){ws})*{close}\}}"))
    }

    /// Objects that, for each list of names in `lists` (`SOME_OTHER`), have a member
    /// named none of them: an extra member (escaping every list; the listed names that
    /// are not declared become declared members, with the value extra members take, so
    /// that they are not extra), or one of the declared members the first list does
    /// not name (escaping the lists that do not name it either; the others remain).
    fn some_other_member(&mut self, map: &Map<String, Value>, lists: &Value, path: &str) -> Result<String> {
        if map.contains_key("patternProperties") {
            return Err(self.unsupported("not (of `additionalProperties`) next to patternProperties", path));
        }
        let lists: Vec<Vec<&str>> = lists
            .as_array()
            .into_iter()
            .flatten()
            .map(|list| list.as_array().into_iter().flatten().filter_map(Value::as_str).collect())
            .collect();
        let mut base = map.clone();
        base.remove(SOME_OTHER);
        let Some(first) = lists.first() else { return self.object(&base, path) };
        let properties = match base.get("properties") {
            Some(Value::Object(p)) => p.clone(),
            _ => Map::new(),
        };
        let mut cases = Vec::new();
        for (name, schema) in &properties {
            if first.contains(&name.as_str()) || schema == &Value::Bool(false) {
                continue;
            }
            let mut case = base.clone();
            let mut required = match case.get("required") {
                Some(Value::Array(r)) => r.clone(),
                _ => Vec::new(),
            };
            if !required.iter().any(|r| r == name.as_str()) {
                required.push(Value::String(name.clone()));
            }
            case.insert("required".into(), Value::Array(required));
            let remaining: Vec<Value> =
                lists.iter().filter(|l| l.contains(&name.as_str())).map(|l| json!(l)).collect();
            if !remaining.is_empty() {
                case.insert(SOME_OTHER.into(), Value::Array(remaining));
            }
            cases.push(case);
        }
        let extra_value = match base.get("additionalProperties") {
            None if self.strict => None,
            None => Some(Value::Bool(true)),
            Some(Value::Bool(false)) => None,
            Some(schema) => Some(schema.clone()),
        };
        if let Some(extra_value) = extra_value {
            let mut case = base.clone();
            let mut declared = properties.clone();
            for name in lists.iter().flatten() {
                declared.entry(name.to_string()).or_insert_with(|| extra_value.clone());
            }
            case.insert("properties".into(), Value::Object(declared));
            case.insert(SOME_EXTRA.into(), Value::Bool(true));
            cases.push(case);
        }
        let mut alternatives = Vec::new();
        for case in cases {
            let regex = self.object(&case, path);
            if self.allows_nothing(&regex, path) {
                continue;
            }
            alternatives.push(format!("(?:{})", regex?));
        }
        if alternatives.is_empty() {
            return Err(self.nothing(path, "no object has a member of another name"));
        }
        Ok(alternatives.join("|"))
    }

    /// `propertyNames` as a filter; `None` when it allows every name.
    fn name_filter(&self, map: &Map<String, Value>, path: &str) -> Result<Option<NameFilter>> {
        let Some(mut schema) = map.get("propertyNames") else { return Ok(None) };
        let mut path = format!("{path}/propertyNames");
        // A reference alone (to names defined once): its target, followed a few steps.
        for _ in 0..8 {
            let Some(reference) = schema.get("$ref").and_then(Value::as_str) else { break };
            if schema.as_object().is_some_and(|m| m.len() > 1) {
                break;
            }
            let pointer = reference.strip_prefix('#').map(super::decode_pointer);
            match pointer.and_then(|p| self.root.pointer(&p)) {
                Some(target) => (schema, path) = (target, reference.to_string()),
                None => break,
            }
        }
        let names = match schema {
            Value::Bool(true) => return Ok(None),
            Value::Bool(false) => return Ok(Some(NameFilter { nothing: true, ..NameFilter::default() })),
            Value::Object(names) => names,
            _ => return Err(self.invalid(&path, "a schema must be an object or a boolean")),
        };
        let mut filter = NameFilter::default();
        for (key, value) in names {
            match key.as_str() {
                k if ANNOTATIONS.contains(&k) => {}
                "type" => {
                    let types = self.listed_types(names, &path)?;
                    filter.nothing |= !types.iter().any(|t| t == "string");
                }
                "minLength" | "maxLength" => {}
                "pattern" => {
                    let pattern =
                        value.as_str().ok_or_else(|| self.invalid(&path, "`pattern` must be a string"))?;
                    match NamePattern::new(pattern) {
                        Ok(pattern) => filter.pattern = Some(pattern),
                        Err(message) => return Err(self.unsupported(&format!("pattern: {message}"), &path)),
                    }
                }
                "const" => filter.values = Some(value.as_str().map(str::to_string).into_iter().collect()),
                "enum" => {
                    let values =
                        value.as_array().ok_or_else(|| self.invalid(&path, "`enum` must be an array"))?;
                    filter.values =
                        Some(values.iter().filter_map(Value::as_str).map(str::to_string).collect());
                }
                "format" if !self.assert_formats => {}
                other => return Err(self.unsupported(&format!("propertyNames with `{other}`"), &path)),
            }
        }
        (filter.min, filter.max) = self.counts(names, "minLength", "maxLength", &path)?;
        if names.contains_key("const") && names.contains_key("enum") {
            // Both must hold: the listed values both allow.
            let constant = names.get("const").and_then(Value::as_str);
            let listed = names.get("enum").and_then(Value::as_array);
            let both = constant.filter(|c| listed.is_some_and(|l| l.iter().any(|v| v.as_str() == Some(c))));
            filter.values = Some(both.map(str::to_string).into_iter().collect());
        }
        Ok(Some(filter))
    }

    /// `patternProperties` as (pattern, schema) pairs.
    fn pattern_properties<'m>(
        &self,
        map: &'m Map<String, Value>,
        path: &str,
    ) -> Result<Vec<(NamePattern, &'m Value)>> {
        let Some(patterns) = map.get("patternProperties") else { return Ok(Vec::new()) };
        let patterns = patterns
            .as_object()
            .ok_or_else(|| self.invalid(path, "`patternProperties` must be an object"))?;
        let mut out = Vec::new();
        for (pattern, schema) in patterns {
            match NamePattern::new(pattern) {
                Ok(compiled) => out.push((compiled, schema)),
                Err(message) => {
                    return Err(self.unsupported(&format!("patternProperties: {message}"), path));
                }
            }
        }
        Ok(out)
    }

    /// One extra member (`"name":value`), where extra members are allowed.
    fn extra_member(
        &mut self,
        extra_schema: Option<&Value>,
        patterns: &[(NamePattern, &Value)],
        filter: Option<&NameFilter>,
        declared: &[&str],
        path: &str,
    ) -> Result<Option<String>> {
        let ws = self.ws.clone();
        // One pattern that every name matches: `additionalProperties` applies to no name,
        // and the pattern's schema to every extra one.
        if let [(pattern, schema)] = patterns {
            if matches_every_name(&pattern.source) {
                return self.extra_member(Some(schema), &[], filter, declared, path);
            }
        }
        // Patterns that change nothing: their schema is the one extra members take.
        let relevant: Vec<&(NamePattern, &Value)> = match extra_schema {
            Some(extra) => patterns.iter().filter(|(_, s)| !same_schema(s, extra)).collect(),
            None => patterns.iter().collect(),
        };
        let live: Vec<&&(NamePattern, &Value)> =
            relevant.iter().filter(|(_, s)| **s != Value::Bool(false)).collect();
        let (names, value_schema) = if relevant.is_empty() {
            let Some(extra) = extra_schema else { return Ok(None) };
            let names = match filter {
                None => name_except(declared),
                Some(f) => match &f.pattern {
                    Some(pattern) => {
                        if f.min > 0 || f.max.is_some() {
                            return Err(self.unsupported("propertyNames with pattern and lengths", path));
                        }
                        if declared.iter().any(|n| pattern.matches(n)) {
                            return Err(
                                self.unsupported("propertyNames pattern matching a declared name", path)
                            );
                        }
                        pattern.body.clone()
                    }
                    None => match name_except_len(declared, f.min, f.max) {
                        Some(names) => names,
                        None => return Ok(None),
                    },
                },
            };
            (names, extra.clone())
        } else {
            // Next to `additionalProperties: true` (or absent, open): names the patterns
            // match take their schema, the others any value, where the other names can
            // be written (patterns of a few simple forms).
            let open = extra_schema.is_some_and(is_true);
            let others = match (open, filter) {
                (true, None) if live.len() == relevant.len() => {
                    let sources: Vec<&str> = live.iter().map(|(p, _)| p.source.as_str()).collect();
                    name_outside(&sources, declared)
                }
                _ => None,
            };
            if extra_schema.is_some() && others.is_none() {
                return Err(self.unsupported("patternProperties next to additionalProperties", path));
            }
            if live.is_empty() {
                return Ok(None);
            }
            if live.len() != relevant.len() || live.iter().any(|(_, s)| !same_schema(s, live[0].1)) {
                return Err(self.unsupported("patternProperties with overlapping patterns", path));
            }
            if filter.is_some() {
                return Err(self.unsupported("patternProperties next to propertyNames", path));
            }
            if declared.iter().any(|n| live.iter().any(|(p, _)| p.matches(n))) {
                return Err(self.unsupported("patternProperties matching a declared property", path));
            }
            let names: Vec<&str> = live.iter().map(|(p, _)| p.body.as_str()).collect();
            if let Some(others) = others {
                let value = self.schema(live[0].1, &format!("{path}/patternProperties"))?;
                let matching = format!("\"(?:{})\"{ws}:{ws}(?:{value})", names.join("|"));
                let Some(others) = others else { return Ok(Some(matching)) };
                let any = self.any_value();
                return Ok(Some(format!("(?:{matching}|\"(?:{others})\"{ws}:{ws}{any})")));
            }
            (names.join("|"), live[0].1.clone())
        };
        let value = self.schema(&value_schema, &format!("{path}/additionalProperties"))?;
        Ok(Some(format!("\"(?:{names})\"{ws}:{ws}(?:{value})")))
    }
}

/// Members in schema order, optional ones omissible, commas only between present
/// ones, then extra members. `nonempty` = the sequences of the remaining members that
/// write at least one, built back to front so that each member's regex appears at
/// most twice (writing "A, then the rest, or the rest" naively copies the rest once
/// per optional member: quadratic regexes, and automata that blew up to 57k states for
/// 20 optional string properties):
///   optional A:  (?:A,)?N | A    (when the rest may be empty: N | A,N | A)
///                (?:A,)?N        (when the rest holds a required member)
///   required A:  A(?:,N)?  or  A,N
fn uncounted_body(members: &[(String, bool)], extra: Option<String>, some_extra: bool, ws: &str) -> String {
    let separator = format!("{ws},{ws}");
    // Each member's regex is written around the rest's: its opening part, the rest,
    // its closing part. Written front to back into one string (formatting each around
    // the rest copied the rest once per member: quadratic in the members).
    let nonempty = (!members.is_empty()).then(|| {
        let n = members.len();
        // Whether a member after member i is required.
        let mut rest_has_required = vec![false; n];
        for i in (0..n - 1).rev() {
            rest_has_required[i] = rest_has_required[i + 1] || members[i + 1].1;
        }
        let mut out = String::with_capacity(members.iter().map(|(m, _)| 2 * m.len() + 16).sum());
        out.push_str("(?:");
        for (i, (member, is_required)) in members[..n - 1].iter().enumerate() {
            match (*is_required, rest_has_required[i]) {
                (false, _) => write!(out, "(?:{member}{separator})?(?:"),
                (true, false) => write!(out, "{member}(?:{separator}(?:"),
                (true, true) => write!(out, "{member}{separator}(?:"),
            }
            .expect("writing to a String");
        }
        out.push_str(&members[n - 1].0);
        for (i, (member, is_required)) in members[..n - 1].iter().enumerate().rev() {
            match (*is_required, rest_has_required[i]) {
                (false, false) => write!(out, ")|{member}").expect("writing to a String"),
                (false, true) | (true, true) => out.push(')'),
                (true, false) => out.push_str("))?"),
            }
        }
        out.push(')');
        out
    });
    let all_optional = members.iter().all(|(_, required)| !required);
    match (extra, nonempty) {
        (None, None) => String::new(),
        (None, Some(declared)) if all_optional => format!("(?:{declared})?"),
        (None, Some(declared)) => declared,
        // At least one extra member.
        (Some(extra), declared) if some_extra => {
            let extras = format!("{extra}(?:{separator}{extra})*");
            match declared {
                None => extras,
                Some(declared) if all_optional => format!("(?:{declared}{separator})?{extras}"),
                Some(declared) => format!("{declared}(?:{separator}{extra})+"),
            }
        }
        (Some(extra), declared) => {
            let extras = format!("{extra}(?:{separator}{extra})*");
            match declared {
                None => format!("(?:{extras})?"),
                Some(declared) if all_optional => {
                    format!("(?:(?:{declared}|{extra})(?:{separator}{extra})*)?")
                }
                Some(declared) => format!("{declared}(?:{separator}{extra})*"),
            }
        }
    }
}

/// Members and extra members as `uncounted_body` writes them, between `min` and `max`
/// of them in all: a regex per (member, count so far), refused when it would be too
/// large (each optional member doubles what follows it).
fn counted_body(
    members: &[(String, bool)],
    extra: Option<&str>,
    min: u64,
    max: Option<u64>,
    ws: &str,
) -> std::result::Result<String, Uncountable> {
    let separator = format!("{ws},{ws}");
    // Counts at or above `cap` behave alike (no maximum: once `min` is reached).
    let cap = max.unwrap_or(min.max(1));
    let norm = |c: u64| if max.is_none() { c.min(cap) } else { c };
    // Size estimate first: sizes[i][c], saturating.
    let n = members.len();
    let width = cap as usize + 2;
    let mut sizes = vec![vec![0u128; width]; n + 1];
    sizes[n].fill(extra.map_or(0, |e| e.len() as u128 * 2 + 32));
    for i in (0..n).rev() {
        for c in 0..width {
            let next = norm(c as u64 + 1) as usize;
            let with = members[i].0.len() as u128 + 16 + sizes[i + 1].get(next).copied().unwrap_or(0);
            let without = if members[i].1 { 0 } else { sizes[i + 1][c] };
            sizes[i][c] = with.saturating_add(without);
        }
    }
    if sizes[0][0] > MAX_COUNTED_REGEX {
        return Err(Uncountable::TooLarge);
    }
    fn tail(extra: Option<&str>, c: u64, min: u64, max: Option<u64>, separator: &str) -> Option<String> {
        let low = min.saturating_sub(c);
        let high = match max {
            Some(m) if m < c => return None,
            Some(m) => Some(m - c),
            None => None,
        };
        let Some(extra) = extra else { return (low == 0).then(String::new) };
        let suffix = |low: u64, high: Option<u64>| match high {
            None => format!("{{{low},}}"),
            Some(high) => format!("{{{low},{high}}}"),
        };
        if high == Some(0) {
            return (low == 0).then(String::new);
        }
        if c > 0 {
            return Some(format!("(?:{separator}{extra}){}", suffix(low, high)));
        }
        let more = format!("{extra}(?:{separator}{extra}){}", suffix(low.max(1) - 1, high.map(|h| h - 1)));
        Some(if low == 0 { format!("(?:{more})?") } else { more })
    }
    #[allow(clippy::too_many_arguments)]
    fn rest(
        members: &[(String, bool)],
        i: usize,
        c: u64,
        extra: Option<&str>,
        min: u64,
        max: Option<u64>,
        separator: &str,
        norm: &dyn Fn(u64) -> u64,
    ) -> Option<String> {
        if max.is_some_and(|m| c > m) {
            return None;
        }
        let Some((member, is_required)) = members.get(i) else {
            return tail(extra, c, min, max, separator);
        };
        let sep = if c > 0 { separator } else { "" };
        let with = rest(members, i + 1, norm(c + 1), extra, min, max, separator, norm)
            .map(|r| format!("{sep}{member}(?:{r})"));
        if *is_required {
            return with;
        }
        let without = rest(members, i + 1, c, extra, min, max, separator, norm);
        match (with, without) {
            (Some(a), Some(b)) => Some(format!("(?:{a}|{b})")),
            (a, b) => a.or(b),
        }
    }
    rest(members, 0, 0, extra, min, max, &separator, &norm).ok_or(Uncountable::NoCount)
}

enum Uncountable {
    /// No number of members the schema allows is within the bounds.
    NoCount,
    TooLarge,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_matchers_are_built_once_per_pattern() {
        let first = name_matcher("x-[a-z]+").expect("a small pattern builds");
        let again = name_matcher("x-[a-z]+").expect("remembered");
        assert!(Arc::ptr_eq(&first, &again));
        let pattern = NamePattern::new("^x-").unwrap();
        assert!(pattern.matches("x-kubernetes") && !pattern.matches("kind"));
        assert!(!pattern.untestable());
    }

    /// `uncounted_body`'s declared part as it was built before (each member formatted
    /// around the rest): the reference of the one-pass writer, character for character.
    fn nonempty_reference(members: &[(String, bool)], separator: &str) -> Option<String> {
        let mut nonempty: Option<String> = None;
        let mut rest_has_required = false;
        for (member, is_required) in members.iter().rev() {
            nonempty = Some(match (nonempty, *is_required, rest_has_required) {
                (None, _, _) => member.clone(),
                (Some(rest), false, false) => format!("(?:{member}{separator})?(?:{rest})|{member}"),
                (Some(rest), false, true) => format!("(?:{member}{separator})?(?:{rest})"),
                (Some(rest), true, false) => format!("{member}(?:{separator}(?:{rest}))?"),
                (Some(rest), true, true) => format!("{member}{separator}(?:{rest})"),
            });
            rest_has_required |= *is_required;
        }
        nonempty.map(|n| format!("(?:{n})"))
    }

    #[test]
    fn the_one_pass_body_is_the_nested_one() {
        let ws = " ?";
        // Every pattern of required and optional members up to five long.
        for n in 1..=5usize {
            for bits in 0..(1u32 << n) {
                let members: Vec<(String, bool)> =
                    (0..n).map(|i| (format!("\"m{i}\":{i}"), bits & (1 << i) != 0)).collect();
                let declared = nonempty_reference(&members, &format!("{ws},{ws}")).unwrap();
                let all_optional = bits == 0;
                let expected = if all_optional { format!("(?:{declared})?") } else { declared.clone() };
                assert_eq!(uncounted_body(&members, None, false, ws), expected, "{members:?}");
                let extra = "\"x\":0".to_string();
                let with_extra = uncounted_body(&members, Some(extra.clone()), false, ws);
                assert!(with_extra.contains(&declared), "{with_extra}");
            }
        }
        assert_eq!(uncounted_body(&[], None, false, ws), "");
    }
}
