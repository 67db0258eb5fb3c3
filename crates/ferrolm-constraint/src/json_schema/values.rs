//! The regex of each JSON type under its keywords.

use serde_json::{Map, Value};

use super::any::{any_value_rule, ANY_VALUE_RULE};
use super::formats::format_regex;
use super::int_range::{integer_range_regex, number_range_regex};
use super::merge::json_eq;
use super::names::name_except;
use super::negate::NOT_ENUM;
use super::pattern::{pattern_lengths, pattern_regex};
use super::{canonical_json, has_type, Translator, ANNOTATIONS, NUMBER, STRING_CHAR};
use crate::error::Result;
use crate::recursive::call;

/// Largest repetition count we write into a regex; larger bounds would build huge
/// automata and are treated as unbounded above / refused below.
const MAX_COUNT: u64 = 10_000;

impl<'a> Translator<'a> {
    pub(super) fn integer(&self, map: &Map<String, Value>, path: &str) -> Result<String> {
        if map.contains_key("multipleOf") {
            return self.multiple(map, true, path);
        }
        let bound = |key: &str| self.number_keyword(map, key, path);
        let mut min = bound("minimum")?.map(|m| m.ceil());
        let mut max = bound("maximum")?.map(|m| m.floor());
        if let Some(e) = bound("exclusiveMinimum")? {
            let e = e.floor() + 1.0;
            min = Some(min.map_or(e, |m| m.max(e)));
        }
        if let Some(e) = bound("exclusiveMaximum")? {
            let e = e.ceil() - 1.0;
            max = Some(max.map_or(e, |m| m.min(e)));
        }
        let limit = 1e30;
        if min.is_some_and(|m| m.abs() > limit) || max.is_some_and(|m| m.abs() > limit) {
            self.refuse("integer bounds beyond 1e30", path)?;
            return Ok(integer_range_regex(None, None).expect("unbounded range"));
        }
        let (min, max) = (min.map(|m| m as i128), max.map(|m| m as i128));
        // Excluded values (a negated `enum`) split the range.
        let mut excluded: Vec<i128> = excluded(map)
            .filter_map(|v| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i128))
            .filter(|&v| min.is_none_or(|m| v >= m) && max.is_none_or(|m| v <= m))
            .collect();
        excluded.sort_unstable();
        excluded.dedup();
        let mut parts = Vec::new();
        let mut low = min;
        for value in excluded.iter().copied().chain([i128::MAX]) {
            let high = if value == i128::MAX { max } else { Some(value - 1) };
            if let Some(part) = integer_range_regex(low, high) {
                parts.push(format!("(?:{part})"));
            }
            low = Some(value.saturating_add(1));
        }
        if parts.is_empty() {
            return Err(self.nothing(path, "no integer lies between the bounds"));
        }
        Ok(parts.join("|"))
    }

    /// Numbers that are not integers, as JSON serializers write them: a nonzero
    /// fraction without exponent, or a mantissa in [1, 10) with a negative exponent.
    pub(super) fn fraction(&self, map: &Map<String, Value>, path: &str) -> Result<String> {
        let bounded = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"];
        if bounded.iter().any(|k| map.contains_key(*k)) || excluded(map).any(|v| v.is_number()) {
            self.refuse("not (of an integer type next to number keywords)", path)?;
        }
        Ok(r"-?(?:0|[1-9][0-9]*)\.[0-9]*[1-9][0-9]*|-?[1-9](?:\.[0-9]*[1-9])?[eE]-0*[1-9][0-9]*".into())
    }

    /// Without bounds, any JSON number; with integer bounds, the numbers between them
    /// written without an exponent; other bounds are unsupported.
    pub(super) fn number(&self, map: &Map<String, Value>, path: &str) -> Result<String> {
        if map.contains_key("multipleOf") {
            return self.multiple(map, false, path);
        }
        let lower = self.tighter_bound(map, "minimum", "exclusiveMinimum", true, path)?;
        let upper = self.tighter_bound(map, "maximum", "exclusiveMaximum", false, path)?;
        if lower.is_none() && upper.is_none() {
            return Ok(NUMBER.to_string());
        }
        let as_integer = |bound: Option<(f64, bool)>| match bound {
            None => Some(None),
            Some((v, exclusive)) if v.fract() == 0.0 && v.abs() <= 1e30 => Some(Some((v as i128, exclusive))),
            Some(_) => None,
        };
        match (as_integer(lower), as_integer(upper)) {
            (Some(lower), Some(upper)) => number_range_regex(lower, upper)
                .ok_or_else(|| self.nothing(path, "no number lies between the bounds")),
            _ => {
                self.refuse("bounds on a number other than integers", path)?;
                Ok(NUMBER.to_string())
            }
        }
    }

    /// The value of a numeric keyword, if present.
    fn number_keyword(&self, map: &Map<String, Value>, key: &str, path: &str) -> Result<Option<f64>> {
        match map.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_f64().map(Some).ok_or_else(|| self.invalid(path, format!("`{key}` must be a number")))
            }
        }
    }

    /// The tighter of an inclusive and an exclusive bound: `(value, exclusive)`.
    fn tighter_bound(
        &self,
        map: &Map<String, Value>,
        inclusive_key: &str,
        exclusive_key: &str,
        lower: bool,
        path: &str,
    ) -> Result<Option<(f64, bool)>> {
        let read = |key: &str| self.number_keyword(map, key, path);
        Ok(match (read(inclusive_key)?, read(exclusive_key)?) {
            (None, None) => None,
            (Some(i), None) => Some((i, false)),
            (None, Some(e)) => Some((e, true)),
            // At equal values the exclusive bound is the tighter.
            (Some(i), Some(e)) if (lower && i > e) || (!lower && i < e) => Some((i, false)),
            (Some(_), Some(e)) => Some((e, true)),
        })
    }

    pub(super) fn string(&self, map: &Map<String, Value>, path: &str) -> Result<String> {
        let (min, max) = self.counts(map, "minLength", "maxLength", path)?;
        let excluded: Vec<&str> = excluded(map).filter_map(Value::as_str).collect();
        if !excluded.is_empty() {
            // Strings written canonically (as names are), so that "other" is exact.
            let constrained = ["pattern", "format", "minLength", "maxLength"];
            if constrained.iter().any(|k| map.contains_key(*k)) {
                self.refuse("not (of string values next to string keywords)", path)?;
            }
            return Ok(format!("\"(?:{})\"", name_except(&excluded)));
        }
        if let Some(pattern) = map.get("pattern") {
            let pattern = pattern.as_str().ok_or_else(|| self.invalid(path, "`pattern` must be a string"))?;
            // Lengths the pattern's strings all have add nothing; other lengths, and a
            // format, would need the intersection of two languages.
            let lengths_implied = pattern_lengths(pattern)
                .is_some_and(|(lo, hi)| lo >= min && max.is_none_or(|m| hi.is_some_and(|h| h <= m)));
            if (self.assert_formats && map.contains_key("format"))
                || ((min > 0 || max.is_some()) && !lengths_implied)
            {
                self.refuse("pattern next to format/minLength/maxLength", path)?;
            }
            match pattern_regex(pattern, STRING_CHAR) {
                Ok(body) => return Ok(format!("\"{body}\"")),
                Err(message) => self.refuse(&format!("pattern: {message}"), path)?,
            }
        }
        if let Some(format) = map.get("format").filter(|_| self.assert_formats) {
            let name = format.as_str().ok_or_else(|| self.invalid(path, "`format` must be a string"))?;
            match format_regex(name) {
                Some(regex) => {
                    if min > 0 || max.is_some() {
                        self.refuse("minLength/maxLength next to format", path)?;
                    }
                    return Ok(format!("\"(?:{regex})\""));
                }
                None => self.refuse(&format!("format {name:?}"), path)?,
            }
        }
        Ok(format!("\"{STRING_CHAR}{}\"", repeat_suffix(min, max)))
    }

    pub(super) fn array(&mut self, map: &Map<String, Value>, path: &str) -> Result<String> {
        let (min, max) = self.counts(map, "minItems", "maxItems", path)?;
        let prefix: Vec<String> = match map.get("prefixItems") {
            None => Vec::new(),
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, s)| self.schema(s, &format!("{path}/prefixItems/{i}")))
                .collect::<Result<_>>()?,
            Some(_) => return Err(self.invalid(path, "`prefixItems` must be an array")),
        };
        if map.get("uniqueItems") == Some(&Value::Bool(true)) {
            if let Some(regex) = self.unique_items(map, prefix.len(), min, max, path)? {
                return Ok(regex);
            }
        }
        if let Some(contains) = map.get("contains") {
            if let Some(regex) = self.contains(map, contains, min, max, path)? {
                return Ok(regex);
            }
        }
        // Written twice or more below (first item, then each further one).
        let rest = match map.get("items") {
            Some(Value::Bool(false)) => None,
            Some(items) => {
                let item = self.schema(items, &format!("{path}/items"))?;
                Some(self.shared(item))
            }
            None => Some(self.any_value()),
        };
        let max = match rest {
            None => Some(max.map_or(prefix.len() as u64, |m| m.min(prefix.len() as u64))),
            Some(_) => max,
        };
        if max.is_some_and(|m| m < min) {
            return Err(self.nothing(path, "no array length satisfies minItems/maxItems"));
        }
        let separator = format!("{ws},{ws}", ws = self.ws);
        let element = |i: usize| -> String {
            match prefix.get(i) {
                Some(p) => format!("(?:{p})"),
                None => format!("(?:{})", rest.as_deref().expect("past the prefix only with items")),
            }
        };
        // After `count` elements: what may follow (more elements, each with its comma).
        let mut tail = String::new();
        let first_free = prefix.len().max(1);
        if rest.is_some() {
            let more_min = min.saturating_sub(first_free as u64);
            let more_max = max.map(|m| m.saturating_sub(first_free as u64));
            if more_max != Some(0) {
                tail = format!("(?:{separator}{}){}", element(first_free), repeat_suffix(more_min, more_max));
            }
        }
        for count in (1..first_free.min(max.unwrap_or(u64::MAX) as usize)).rev() {
            let next = format!("{separator}{}{tail}", element(count));
            tail = if (count as u64) >= min { format!("(?:{next})?") } else { next };
        }
        let ws = &self.ws;
        if max == Some(0) {
            return Ok(format!(r"\[{ws}\]"));
        }
        let elements = format!("{}{tail}", element(0));
        Ok(if min == 0 {
            format!(r"\[{ws}(?:{elements})?{ws}\]")
        } else {
            format!(r"\[{ws}{elements}{ws}\]")
        })
    }

    /// `uniqueItems: true`, where exact: arrays of at most one item need nothing; items
    /// from small finite domains (`const`/`enum`, booleans, null) are enumerated, every
    /// array of distinct values (at most `MAX_UNIQUE_ARRAYS`). `None`: nothing to add.
    fn unique_items(
        &mut self,
        map: &Map<String, Value>,
        prefix_len: usize,
        min: u64,
        max: Option<u64>,
        path: &str,
    ) -> Result<Option<String>> {
        let items_false = map.get("items") == Some(&Value::Bool(false));
        let longest =
            if items_false { Some(max.map_or(prefix_len as u64, |m| m.min(prefix_len as u64))) } else { max };
        if longest.is_some_and(|m| m <= 1) {
            return Ok(None);
        }
        let prefix: Vec<Value> =
            map.get("prefixItems").and_then(Value::as_array).cloned().unwrap_or_default();
        let domains: Option<Vec<Vec<Value>>> = prefix.iter().map(finite_domain).collect();
        let items = if items_false { Some(Vec::new()) } else { map.get("items").and_then(finite_domain) };
        let (Some(domains), Some(items), false) = (domains, items, map.contains_key("contains")) else {
            self.refuse("uniqueItems", path)?;
            return Ok(None);
        };
        let mut arrays: Vec<Vec<&Value>> = Vec::new();
        let mut current: Vec<&Value> = Vec::new();
        let longest = longest.unwrap_or(u64::MAX);
        fn walk<'v>(
            domains: &'v [Vec<Value>],
            items: &'v [Value],
            current: &mut Vec<&'v Value>,
            arrays: &mut Vec<Vec<&'v Value>>,
            (min, max): (u64, u64),
        ) -> bool {
            let length = current.len() as u64;
            if length >= min {
                arrays.push(current.clone());
                if arrays.len() > MAX_UNIQUE_ARRAYS {
                    return false;
                }
            }
            if length >= max {
                return true;
            }
            let domain = domains.get(current.len()).map_or(items, Vec::as_slice);
            for value in domain {
                if current.iter().any(|v| json_eq(v, value)) {
                    continue;
                }
                current.push(value);
                let ok = walk(domains, items, current, arrays, (min, max));
                current.pop();
                if !ok {
                    return false;
                }
            }
            true
        }
        if !walk(&domains, &items, &mut current, &mut arrays, (min, longest)) {
            self.refuse("uniqueItems (too many arrays to enumerate)", path)?;
            return Ok(None);
        }
        if arrays.is_empty() {
            return Err(self.nothing(path, "no array of distinct items satisfies the schema"));
        }
        let ws = &self.ws;
        let separator = format!("{ws},{ws}");
        let alternatives: Vec<String> = arrays
            .iter()
            .map(|array| {
                let values: Vec<String> =
                    array.iter().map(|v| regex_syntax::escape(&canonical_json(v))).collect();
                format!(r"\[{ws}{}{ws}\]", values.join(&separator))
            })
            .collect();
        Ok(Some(alternatives.join("|")))
    }

    /// Arrays with at least `minContains` (default 1) elements matching `contains`:
    /// `(I,)*B(,(I,)*B){n-1}(,I)*` where `I` is an item and `B` an item that also
    /// matches `contains` (no complement needed). `None`: `contains` asks nothing.
    fn contains(
        &mut self,
        map: &Map<String, Value>,
        contains: &Value,
        min: u64,
        max: Option<u64>,
        path: &str,
    ) -> Result<Option<String>> {
        let (at_least, at_most) = self.counts(map, "minContains", "maxContains", path)?;
        let at_least = if map.contains_key("minContains") { at_least } else { 1 };
        if at_least == 0 && at_most.is_none() {
            return Ok(None);
        }
        // A count of the others (maxContains), or lengths and positions next to it,
        // would need the complement of `contains` or a product of counters.
        if at_most.is_some() || min > 1 || max.is_some() || map.contains_key("prefixItems") || at_least > 16 {
            self.refuse("contains", path)?;
            return Ok(None);
        }
        let any = Value::Bool(true);
        let items = map.get("items").unwrap_or(&any);
        let path = format!("{path}/contains");
        let Some(both) = self.intersection(items, contains, &path)? else {
            return Err(self.nothing(&path, "no item can match `contains`"));
        };
        let item = match items {
            Value::Bool(false) => return Err(self.nothing(&path, "no item can match `contains`")),
            items => self.schema(items, &path)?,
        };
        // A call next to bytes read directly would make the grammar ambiguous: values of
        // any type written out at the top (their elements still call the rule).
        let inline =
            |regex: String| if regex == call(ANY_VALUE_RULE) { any_value_rule(&self.ws) } else { regex };
        let (item, both) = (inline(item), inline(both));
        let ws = &self.ws;
        let sep = format!("{ws},{ws}");
        let next = format!("(?:(?:{item}){sep})*(?:{both})");
        let more = format!("(?:{sep}{next}){{{}}}", at_least - 1);
        Ok(Some(format!(r"\[{ws}{next}{more}(?:{sep}(?:{item}))*{ws}\]")))
    }

    /// A `(min, max)` pair of length keywords (`max = None`: unbounded).
    pub(super) fn counts(
        &self,
        map: &Map<String, Value>,
        min_key: &str,
        max_key: &str,
        path: &str,
    ) -> Result<(u64, Option<u64>)> {
        let read = |key: &str| -> Result<Option<u64>> {
            match map.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .or_else(|| v.as_f64().filter(|f| *f >= 0.0 && f.fract() == 0.0).map(|f| f as u64))
                    .map(Some)
                    .ok_or_else(|| self.invalid(path, format!("`{key}` must be a non-negative integer"))),
            }
        };
        let min = read(min_key)?.unwrap_or(0);
        let max = read(max_key)?;
        if min > MAX_COUNT {
            self.refuse(&format!("{min_key} above {MAX_COUNT}"), path)?;
        }
        if max.is_some_and(|m| m < min) {
            return Err(self.nothing(path, format!("{max_key} is below {min_key}")));
        }
        Ok((min.min(MAX_COUNT), max.filter(|&m| m <= MAX_COUNT)))
    }
}

/// Most arrays `uniqueItems` may enumerate.
const MAX_UNIQUE_ARRAYS: usize = 4096;

/// The values a schema allows, when they are few and scalar enough to list: `const`,
/// `enum` (within `type`), booleans, null; `false`: none.
fn finite_domain(schema: &Value) -> Option<Vec<Value>> {
    let map = match schema {
        Value::Bool(false) => return Some(Vec::new()),
        Value::Object(map) => map,
        _ => return None,
    };
    let known = ["type", "const", "enum", "nullable"];
    if map.keys().any(|k| !known.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str())) {
        return None;
    }
    let mut types: Option<Vec<String>> = match map.get("type") {
        None => None,
        Some(Value::String(t)) => Some(vec![t.clone()]),
        Some(Value::Array(list)) => Some(list.iter().filter_map(Value::as_str).map(str::to_string).collect()),
        Some(_) => return None,
    };
    let nullable = map.get("nullable") == Some(&Value::Bool(true));
    if let (true, Some(types)) = (nullable, types.as_mut()) {
        types.push("null".into());
    }
    let listed: Vec<Value> = match (map.get("const"), map.get("enum")) {
        (Some(value), None) => vec![value.clone()],
        (None, Some(Value::Array(values))) => values.clone(),
        (None, None) => {
            let types = types.as_ref()?;
            let mut values = Vec::new();
            for ty in types {
                match ty.as_str() {
                    "boolean" => values.extend([Value::Bool(true), Value::Bool(false)]),
                    "null" => values.push(Value::Null),
                    _ => return None,
                }
            }
            values
        }
        _ => return None,
    };
    let mut out: Vec<Value> = Vec::new();
    for value in listed {
        let typed = types.as_ref().is_none_or(|t| t.iter().any(|ty| has_type(&value, ty)));
        let typed = typed || (nullable && value.is_null());
        if typed && !out.iter().any(|v| json_eq(v, &value)) {
            out.push(value);
        }
    }
    Some(out)
}

/// The values a negated `enum` excludes.
fn excluded(map: &Map<String, Value>) -> impl Iterator<Item = &Value> {
    map.get(NOT_ENUM).and_then(Value::as_array).into_iter().flatten()
}

/// `{min,max}` as a regex suffix.
fn repeat_suffix(min: u64, max: Option<u64>) -> String {
    match max {
        None if min == 0 => "*".into(),
        None => format!("{{{min},}}"),
        Some(max) => format!("{{{min},{max}}}"),
    }
}

/// A property name inside a JSON pointer used for error paths.
pub(super) fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}
