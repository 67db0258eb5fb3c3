//! In-place applicators rewritten away, where the rewrite is exact: `allOf`, and
//! `$ref` / `anyOf` / `oneOf` next to other keywords, become one schema (the
//! conjunction merged keyword by keyword) or an `anyOf` of such schemas (conjunction
//! distributed over the disjunctions: `{A, anyOf: [B, C]}` = `anyOf: [A∧B, A∧C]`);
//! `unevaluatedProperties` / `unevaluatedItems` then become `additionalProperties` /
//! `items` of the merged schema, which has evaluated exactly what its parts did.
//!
//! A merge is exact keyword by keyword: types intersect (`integer` within `number`),
//! `required` and `dependentRequired` unite, lower bounds take the maximum and upper
//! bounds the minimum, `enum`/`const` intersect, `properties` merge name by name (a
//! name one side does not declare takes that side's `additionalProperties`), as do
//! `prefixItems`/`items` position by position, `not`s unite under one `not`. Two
//! different values of a keyword we cannot intersect (two `pattern`s, two `format`s,
//! ...) are `UnsupportedSchema`.

use serde_json::{json, Map, Value};

use super::negate::{FRACTION, NOT_ENUM, SOME_OTHER};
use super::{decode_pointer, one_of, Translator, ANNOTATIONS};
use crate::error::Result;

/// Most cases a distribution may produce.
pub(super) const MAX_BRANCHES: usize = 32;
/// Deepest nesting of `allOf` / `$ref` inlining.
const MAX_DEPTH: usize = 24;

/// Keywords that apply a schema to the instance itself.
const IN_PLACE: &[&str] = &["$ref", "allOf", "anyOf", "oneOf"];
const UNEVALUATED: &[&str] = &["unevaluatedProperties", "unevaluatedItems"];
/// Keywords rewritten as disjunctions: `dependentRequired: {a: [b]}` is
/// `anyOf: [{properties: {a: false}}, {required: [b]}]`, `dependentSchemas: {a: S}`
/// is `anyOf: [{properties: {a: false}}, {required: [a]} ∧ S]`; `not`, `if`/`then`/
/// `else` through `negate.rs`.
const REWRITTEN: &[&str] = &["dependentRequired", "dependentSchemas", "not", "if", "then", "else"];

/// Flat schemas whose union is the schema. `exclusive`: no value matches two of them
/// and each stands for one set of evaluated properties / items (so `unevaluated*` may
/// be decided on each).
pub(super) struct Flat {
    pub(super) maps: Vec<Map<String, Value>>,
    exclusive: bool,
}

/// Whether `translate` would have to intersect languages to read this schema as is.
pub(super) fn needs_flattening(map: &Map<String, Value>) -> bool {
    if map.contains_key("allOf") || UNEVALUATED.iter().chain(REWRITTEN).any(|k| map.contains_key(*k)) {
        return true;
    }
    let applicators = IN_PLACE.iter().filter(|k| map.contains_key(**k)).count();
    let others = map
        .keys()
        .any(|k| !IN_PLACE.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) && k != "nullable");
    applicators > 1 || (applicators == 1 && others)
}

fn is_true(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => *b,
        Value::Object(map) => map.keys().all(|k| ANNOTATIONS.contains(&k.as_str())),
        _ => false,
    }
}

/// JSON equality (numbers by value: `1` equals `1.0`; members in any order).
pub(super) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
            (Some(x), Some(y), _, _) => x == y,
            (_, _, Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

impl<'a> Translator<'a> {
    /// Translate a schema that `needs_flattening`.
    pub(super) fn flattened(&mut self, map: &Map<String, Value>, path: &str) -> Result<String> {
        let mut inlined = Vec::new();
        let flat = self.flatten_map(map, path, &mut inlined, 0)?;
        let schema = match flat.maps.len() {
            0 => return Err(self.nothing(path, "no value satisfies every part of the schema")),
            1 => Value::Object(flat.maps.into_iter().next().expect("one")),
            _ => json!({ "anyOf": flat.maps }),
        };
        // References inlined here stay on the stack while their copies are translated,
        // so that one reaching itself again with siblings is refused, not unrolled.
        let depth = self.inline_stack.len();
        self.inline_stack.extend(inlined);
        let result = self.schema(&schema, path);
        self.inline_stack.truncate(depth);
        result
    }

    pub(super) fn flatten(
        &mut self,
        schema: &Value,
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<Flat> {
        match schema {
            Value::Bool(b) => {
                Ok(Flat { maps: if *b { vec![Map::new()] } else { Vec::new() }, exclusive: true })
            }
            Value::Object(map) => self.flatten_map(map, path, inlined, depth),
            _ => Err(self.invalid(path, "a schema must be an object or a boolean")),
        }
    }

    fn flatten_map(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<Flat> {
        if depth > MAX_DEPTH {
            return Err(self.unsupported("allOf/$ref nested too deeply", path));
        }
        let mut base: Map<String, Value> = map
            .iter()
            .filter(|(k, _)| {
                !IN_PLACE.contains(&k.as_str())
                    && !UNEVALUATED.contains(&k.as_str())
                    && !REWRITTEN.contains(&k.as_str())
                    && !ANNOTATIONS.contains(&k.as_str())
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        fold_nullable(&mut base);
        // Factors in the order their properties are generated: the reference's, the
        // `anyOf`/`oneOf` branch's, the first `allOf` schema's, this schema's own, the
        // other `allOf` schemas'.
        let mut factors = Vec::new();
        if let Some(reference) = map.get("$ref") {
            let reference =
                reference.as_str().ok_or_else(|| self.invalid(path, "`$ref` must be a string"))?;
            let target = self.inline_target(reference, path)?;
            inlined.push(reference.to_string());
            self.inline_stack.push(reference.to_string());
            let flat = self.flatten(target, reference, inlined, depth + 1);
            self.inline_stack.pop();
            factors.push(flat?);
        }
        for keyword in ["anyOf", "oneOf"] {
            let Some(branches) = map.get(keyword) else { continue };
            let branches = self.branch_list(keyword, branches, path)?;
            // Values also satisfy the siblings (their type, what they require).
            let disjoint = one_of::branches_exclusive(&self.apart(), branches, map);
            if keyword == "oneOf" && !disjoint {
                // Each branch, and none of the others.
                let mut flat = Flat { maps: Vec::new(), exclusive: false };
                for (i, branch) in branches.iter().enumerate() {
                    let path = format!("{path}/oneOf/{i}");
                    let mut cases = self.flatten(branch, &path, inlined, depth + 1)?.maps;
                    for (j, other) in branches.iter().enumerate() {
                        if i != j && !cases.is_empty() {
                            let failing = self.negate(other, &path, inlined, depth + 1)?;
                            cases = self.product(&cases, &failing, &path, inlined, depth)?;
                        }
                    }
                    flat.maps.extend(cases);
                }
                factors.push(flat);
                continue;
            }
            let mut flat = Flat { maps: Vec::new(), exclusive: disjoint };
            for (i, branch) in branches.iter().enumerate() {
                let branch = self.flatten(branch, &format!("{path}/{keyword}/{i}"), inlined, depth + 1)?;
                flat.exclusive &= branch.maps.len() <= 1;
                flat.maps.extend(branch.maps);
            }
            factors.push(flat);
        }
        for keyword in &REWRITTEN[..2] {
            let Some(dependencies) = map.get(*keyword) else { continue };
            let dependencies = dependencies
                .as_object()
                .ok_or_else(|| self.invalid(path, format!("`{keyword}` must be an object")))?;
            for (name, dependency) in dependencies {
                let absent = json!({ "properties": { name.clone(): false } });
                let present = json!({ "required": [name] });
                let mut flat =
                    Flat { maps: vec![as_map(absent)], exclusive: *keyword == "dependentRequired" };
                if *keyword == "dependentRequired" {
                    // "Absent, or the dependencies present" (the name itself need not be
                    // required: the first case covers its absence).
                    let required: Vec<Value> = dependency.as_array().into_iter().flatten().cloned().collect();
                    flat.maps.push(as_map(json!({ "required": required })));
                } else {
                    let path = format!("{path}/{keyword}");
                    let dependency = self.flatten(dependency, &path, inlined, depth + 1)?;
                    for case in &dependency.maps {
                        flat.maps.extend(self.merge(
                            &as_map(present.clone()),
                            case,
                            &path,
                            inlined,
                            depth,
                        )?);
                    }
                }
                factors.push(flat);
            }
        }
        if let Some(schema) = map.get("not") {
            let path = format!("{path}/not");
            // `not` collects no annotations: not exclusive, for `unevaluated*`.
            factors.push(Flat { maps: self.negate(schema, &path, inlined, depth + 1)?, exclusive: false });
        }
        if let Some(condition) = map.get("if") {
            let any = Value::Bool(true);
            let path = format!("{path}/if");
            let holds = self.flatten(condition, &path, inlined, depth + 1)?.maps;
            let fails = self.negate(condition, &path, inlined, depth + 1)?;
            let then = self.flatten(map.get("then").unwrap_or(&any), &path, inlined, depth + 1)?.maps;
            let otherwise = self.flatten(map.get("else").unwrap_or(&any), &path, inlined, depth + 1)?.maps;
            let mut maps = self.product(&holds, &then, &path, inlined, depth)?;
            maps.extend(self.product(&fails, &otherwise, &path, inlined, depth)?);
            factors.push(Flat { maps, exclusive: false });
        }
        // The first `allOf` schema (often the "base class") before this schema's own.
        let mut own = Some(Flat { maps: vec![base], exclusive: true });
        if let Some(branches) = map.get("allOf") {
            for (i, branch) in self.branch_list("allOf", branches, path)?.iter().enumerate() {
                factors.push(self.flatten(branch, &format!("{path}/allOf/{i}"), inlined, depth + 1)?);
                if i == 0 {
                    factors.extend(own.take());
                }
            }
        }
        factors.extend(own);
        let exclusive = factors.iter().all(|f| f.maps.len() <= 1 || f.exclusive);
        let mut cases = vec![Map::new()];
        for factor in &factors {
            let mut next = Vec::new();
            for case in &cases {
                for map in &factor.maps {
                    if let Some(merged) = self.merge(case, map, path, inlined, depth)? {
                        next.push(merged);
                    }
                }
            }
            if next.len() > MAX_BRANCHES {
                return Err(self.unsupported("allOf/anyOf combining into too many cases", path));
            }
            cases = next;
        }
        for keyword in UNEVALUATED {
            let Some(rest) = map.get(*keyword) else { continue };
            if !exclusive {
                return Err(self.unsupported(&format!("{keyword} next to overlapping anyOf branches"), path));
            }
            for case in &mut cases {
                self.unevaluated(case, keyword, rest, path)?;
            }
        }
        Ok(Flat { maps: cases, exclusive })
    }

    fn branch_list<'v>(&self, keyword: &str, value: &'v Value, path: &str) -> Result<&'v Vec<Value>> {
        value
            .as_array()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| self.invalid(path, format!("`{keyword}` must be a non-empty array")))
    }

    fn inline_target(&self, reference: &str, path: &str) -> Result<&'a Value> {
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| self.unsupported(&format!("$ref {reference:?} (only local references)"), path))?;
        if self.ref_stack.iter().chain(&self.inline_stack).any(|r| r == reference) {
            return Err(self.unsupported("$ref with sibling keywords (recursive)", path));
        }
        let root: &'a Value = self.root;
        root.pointer(&decode_pointer(pointer))
            .ok_or_else(|| self.invalid(path, format!("unknown $ref {reference:?}")))
    }

    /// `unevaluated*` of a flat schema: what its `additionalProperties` / `items` would
    /// be, unless those are present (then everything is evaluated).
    fn unevaluated(
        &self,
        case: &mut Map<String, Value>,
        keyword: &str,
        rest: &Value,
        path: &str,
    ) -> Result<()> {
        let (replaced, also_evaluating): (&str, &[&str]) = match keyword {
            "unevaluatedProperties" => ("additionalProperties", &["dependentSchemas", "if", "then", "else"]),
            _ => ("items", &["contains", "if", "then", "else"]),
        };
        if case.contains_key(replaced) {
            return Ok(());
        }
        if also_evaluating.iter().any(|k| case.contains_key(*k)) {
            return Err(self.unsupported(keyword, path));
        }
        case.insert(replaced.to_string(), rest.clone());
        Ok(())
    }

    /// The intersection of two schemas as one schema: `Some(true)` schema when any
    /// value passes, a `false`-like result as `Value::Bool(false)`.
    fn merge_schemas(
        &mut self,
        a: &Value,
        b: &Value,
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<Value> {
        if is_true(a) || json_eq(a, b) {
            return Ok(b.clone());
        }
        if is_true(b) {
            return Ok(a.clone());
        }
        if a == &Value::Bool(false) || b == &Value::Bool(false) {
            return Ok(Value::Bool(false));
        }
        let left = self.flatten(a, path, inlined, depth + 1)?;
        let right = self.flatten(b, path, inlined, depth + 1)?;
        let mut cases = Vec::new();
        for x in &left.maps {
            for y in &right.maps {
                if let Some(merged) = self.merge(x, y, path, inlined, depth + 1)? {
                    cases.push(Value::Object(merged));
                }
            }
        }
        if cases.len() > MAX_BRANCHES {
            return Err(self.unsupported("allOf/anyOf combining into too many cases", path));
        }
        Ok(match cases.len() {
            0 => Value::Bool(false),
            1 => cases.pop().expect("one"),
            _ => json!({ "anyOf": cases }),
        })
    }

    /// The regex of the values of both schemas; `None` when no value satisfies both.
    pub(super) fn intersection(&mut self, a: &Value, b: &Value, path: &str) -> Result<Option<String>> {
        let mut inlined = Vec::new();
        let merged = self.merge_schemas(a, b, path, &mut inlined, 0)?;
        if merged == Value::Bool(false) {
            return Ok(None);
        }
        let depth = self.inline_stack.len();
        self.inline_stack.extend(inlined);
        let result = self.schema(&merged, path);
        self.inline_stack.truncate(depth);
        result.map(Some)
    }

    /// The conjunction of two flat schemas; `None` when no value satisfies both.
    pub(super) fn merge(
        &mut self,
        a: &Map<String, Value>,
        b: &Map<String, Value>,
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<Option<Map<String, Value>>> {
        if a.is_empty() || b.is_empty() {
            return Ok(Some(if a.is_empty() { b.clone() } else { a.clone() }));
        }
        let (a, b) = (&drop_loose_contains(a), &drop_loose_contains(b));
        let mut out = a.clone();
        let mut done: Vec<&str> = Vec::new();
        // type
        if let (Some(ta), Some(tb)) = (type_list(a), type_list(b)) {
            let types = intersect_types(&ta, &tb);
            if types.is_empty() {
                return Ok(None);
            }
            out.insert("type".into(), types_value(types));
        } else if let Some(tb) = b.get("type") {
            out.insert("type".into(), tb.clone());
        }
        done.push("type");
        // enum / const
        match (literals(a), literals(b)) {
            (Some(la), Some(lb)) => {
                let both: Vec<Value> = la.into_iter().filter(|v| lb.iter().any(|w| json_eq(v, w))).collect();
                if both.is_empty() {
                    return Ok(None);
                }
                out.remove("const");
                out.insert("enum".into(), Value::Array(both));
            }
            (None, Some(lb)) => {
                out.insert("enum".into(), Value::Array(lb));
            }
            _ => {}
        }
        done.extend(["enum", "const"]);
        // required
        if let Some(Value::Array(rb)) = b.get("required") {
            let mut required = match a.get("required") {
                Some(Value::Array(ra)) => ra.clone(),
                _ => Vec::new(),
            };
            for name in rb {
                if !required.contains(name) {
                    required.push(name.clone());
                }
            }
            out.insert("required".into(), Value::Array(required));
        }
        done.push("required");
        // bounds
        for (key, lower) in [
            ("minimum", true),
            ("exclusiveMinimum", true),
            ("maximum", false),
            ("exclusiveMaximum", false),
            ("minLength", true),
            ("maxLength", false),
            ("minItems", true),
            ("maxItems", false),
            ("minProperties", true),
            ("maxProperties", false),
            ("minContains", true),
            ("maxContains", false),
        ] {
            done.push(key);
            let (Some(x), Some(y)) = (a.get(key), b.get(key)) else {
                if let Some(y) = b.get(key) {
                    out.insert(key.into(), y.clone());
                }
                continue;
            };
            let (Some(fx), Some(fy)) = (x.as_f64(), y.as_f64()) else {
                return Err(self.invalid(path, format!("`{key}` must be a number")));
            };
            let take_y = if lower { fy > fx } else { fy < fx };
            if take_y {
                out.insert(key.into(), y.clone());
            }
        }
        if let Some(y) = b.get("uniqueItems") {
            if y == &Value::Bool(true) || !a.contains_key("uniqueItems") {
                out.insert("uniqueItems".into(), y.clone());
            }
        }
        done.push("uniqueItems");
        if let (Some(x), Some(y)) = (a.get("multipleOf"), b.get("multipleOf")) {
            match (x.as_u64(), y.as_u64()) {
                (Some(x), Some(y)) if x > 0 && y > 0 => {
                    let lcm = x / gcd(x, y) * y;
                    out.insert("multipleOf".into(), Value::from(lcm));
                }
                _ if json_eq(x, y) => {}
                _ => return Err(self.unsupported("allOf with different multipleOf values", path)),
            }
            done.push("multipleOf");
        }
        if let (Some(x), Some(y)) = (a.get("not"), b.get("not")) {
            if !json_eq(x, y) {
                out.insert("not".into(), json!({ "anyOf": [x, y] }));
            }
            done.push("not");
        }
        if let (Some(Value::Object(x)), Some(Value::Object(y))) =
            (a.get("dependentRequired"), b.get("dependentRequired"))
        {
            let mut merged = x.clone();
            for (name, names) in y {
                let mut list = merged.get(name).and_then(Value::as_array).cloned().unwrap_or_default();
                for n in names.as_array().into_iter().flatten() {
                    if !list.contains(n) {
                        list.push(n.clone());
                    }
                }
                merged.insert(name.clone(), Value::Array(list));
            }
            out.insert("dependentRequired".into(), Value::Object(merged));
            done.push("dependentRequired");
        }
        if let (Some(Value::Array(x)), Some(Value::Array(y))) = (a.get(NOT_ENUM), b.get(NOT_ENUM)) {
            let mut excluded = x.clone();
            excluded.extend(y.iter().filter(|v| !x.contains(v)).cloned());
            out.insert(NOT_ENUM.into(), Value::Array(excluded));
            done.push(NOT_ENUM);
        }
        if let (Some(Value::Array(x)), Some(Value::Array(y))) = (a.get(SOME_OTHER), b.get(SOME_OTHER)) {
            // Each list must be escaped: all of them.
            out.insert(SOME_OTHER.into(), Value::Array(x.iter().chain(y).cloned().collect()));
            done.push(SOME_OTHER);
        }
        if let (Some(x), Some(y)) = (a.get("propertyNames"), b.get("propertyNames")) {
            let merged = self.merge_schemas(x, y, path, inlined, depth)?;
            out.insert("propertyNames".into(), merged);
            done.push("propertyNames");
        }
        self.merge_properties(a, b, &mut out, path, inlined, depth)?;
        self.merge_items(a, b, &mut out, path, inlined, depth)?;
        done.extend(["properties", "additionalProperties", "patternProperties", "prefixItems", "items"]);
        // Anything else: equal values, or one side only.
        for (key, y) in b {
            if done.contains(&key.as_str()) {
                continue;
            }
            match a.get(key) {
                None => {
                    out.insert(key.clone(), y.clone());
                }
                Some(x) if json_eq(x, y) => {}
                Some(_) => {
                    return Err(self.unsupported(&format!("allOf with different `{key}` values"), path))
                }
            }
        }
        // Listed values minus excluded ones.
        if let (Some(Value::Array(values)), Some(Value::Array(excluded))) =
            (out.get("enum"), out.get(NOT_ENUM))
        {
            let kept: Vec<Value> =
                values.iter().filter(|v| !excluded.iter().any(|e| json_eq(v, e))).cloned().collect();
            if kept.is_empty() {
                return Ok(None);
            }
            out.insert("enum".into(), Value::Array(kept));
            out.remove(NOT_ENUM);
        }
        // A required member that can take no value.
        if let Some(Value::Array(required)) = out.get("required") {
            let empty = Map::new();
            let properties = out.get("properties").and_then(Value::as_object).unwrap_or(&empty);
            let extra = out.get("additionalProperties");
            let impossible = |name: &Value| {
                name.as_str()
                    .and_then(|n| properties.get(n).or(extra))
                    .is_some_and(|s| s == &Value::Bool(false))
            };
            if required.iter().any(impossible) && type_list(&out).is_some_and(|t| t == ["object"]) {
                return Ok(None);
            }
        }
        Ok(Some(out))
    }

    fn merge_properties(
        &mut self,
        a: &Map<String, Value>,
        b: &Map<String, Value>,
        out: &mut Map<String, Value>,
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<()> {
        let keys = ["properties", "additionalProperties", "patternProperties"];
        let has = |m: &Map<String, Value>| keys.iter().any(|k| m.contains_key(*k));
        if !has(b) {
            return Ok(());
        }
        if !has(a) {
            for key in keys {
                if let Some(v) = b.get(key) {
                    out.insert(key.into(), v.clone());
                }
            }
            return Ok(());
        }
        if a.contains_key("patternProperties") || b.contains_key("patternProperties") {
            return Err(self.unsupported("patternProperties in allOf", path));
        }
        let props = |m: &'_ Map<String, Value>| -> Map<String, Value> {
            m.get("properties").and_then(Value::as_object).cloned().unwrap_or_default()
        };
        let (pa, pb) = (props(a), props(b));
        let (xa, xb) = (a.get("additionalProperties"), b.get("additionalProperties"));
        let mut merged = Map::new();
        for name in pa.keys().chain(pb.keys().filter(|k| !pa.contains_key(*k))) {
            let any = Value::Bool(true);
            let sa = pa.get(name).or(xa).unwrap_or(&any);
            let sb = pb.get(name).or(xb).unwrap_or(&any);
            let schema = self.merge_schemas(sa, sb, &format!("{path}/properties"), inlined, depth)?;
            merged.insert(name.clone(), schema);
        }
        out.insert("properties".into(), Value::Object(merged));
        match (xa, xb) {
            (Some(x), Some(y)) => {
                let schema =
                    self.merge_schemas(x, y, &format!("{path}/additionalProperties"), inlined, depth)?;
                out.insert("additionalProperties".into(), schema);
            }
            (None, Some(y)) => {
                out.insert("additionalProperties".into(), y.clone());
            }
            _ => {}
        }
        Ok(())
    }

    fn merge_items(
        &mut self,
        a: &Map<String, Value>,
        b: &Map<String, Value>,
        out: &mut Map<String, Value>,
        path: &str,
        inlined: &mut Vec<String>,
        depth: usize,
    ) -> Result<()> {
        let has = |m: &Map<String, Value>| m.contains_key("items") || m.contains_key("prefixItems");
        if !has(b) {
            return Ok(());
        }
        if !has(a) {
            for key in ["items", "prefixItems"] {
                if let Some(v) = b.get(key) {
                    out.insert(key.into(), v.clone());
                }
            }
            return Ok(());
        }
        let prefix = |m: &Map<String, Value>| {
            m.get("prefixItems").and_then(Value::as_array).cloned().unwrap_or_default()
        };
        let (pa, pb) = (prefix(a), prefix(b));
        let (ia, ib) = (a.get("items"), b.get("items"));
        let items = match (ia, ib) {
            (Some(x), Some(y)) => Some(self.merge_schemas(x, y, &format!("{path}/items"), inlined, depth)?),
            (x, y) => x.or(y).cloned(),
        };
        let mut merged = Vec::new();
        let mut cut = false;
        for i in 0..pa.len().max(pb.len()) {
            let any = Value::Bool(true);
            let sa = pa.get(i).or(ia).unwrap_or(&any);
            let sb = pb.get(i).or(ib).unwrap_or(&any);
            let schema = self.merge_schemas(sa, sb, &format!("{path}/prefixItems/{i}"), inlined, depth)?;
            if schema == Value::Bool(false) {
                // No element can stand here: the array ends before.
                cut = true;
                break;
            }
            merged.push(schema);
        }
        out.remove("prefixItems");
        if !merged.is_empty() {
            out.insert("prefixItems".into(), Value::Array(merged));
        }
        match (cut, items) {
            (true, _) => {
                out.insert("items".into(), Value::Bool(false));
            }
            (false, Some(items)) => {
                out.insert("items".into(), items);
            }
            (false, None) => {}
        }
        Ok(())
    }
}

fn as_map(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

/// OpenAPI's `nullable: true` as a `null` type and value.
fn fold_nullable(map: &mut Map<String, Value>) {
    if map.remove("nullable") != Some(Value::Bool(true)) {
        return;
    }
    if let Some(mut types) = type_list(map) {
        if !types.iter().any(|t| t == "null") {
            types.push("null".into());
        }
        map.insert("type".into(), types_value(types));
    }
    if let Some(mut values) = literals(map) {
        if !values.contains(&Value::Null) {
            values.push(Value::Null);
        }
        map.remove("const");
        map.insert("enum".into(), Value::Array(values));
    }
}

/// `minContains` / `maxContains` mean nothing without `contains`.
fn drop_loose_contains(map: &Map<String, Value>) -> Map<String, Value> {
    let mut map = map.clone();
    if !map.contains_key("contains") {
        map.remove("minContains");
        map.remove("maxContains");
    }
    map
}

pub(super) fn type_list(map: &Map<String, Value>) -> Option<Vec<String>> {
    match map.get("type")? {
        Value::String(t) => Some(vec![t.clone()]),
        Value::Array(list) => Some(list.iter().filter_map(Value::as_str).map(str::to_string).collect()),
        _ => None,
    }
}

pub(super) fn types_value(mut types: Vec<String>) -> Value {
    if types.len() == 1 {
        Value::String(types.swap_remove(0))
    } else {
        Value::Array(types.into_iter().map(Value::String).collect())
    }
}

fn intersect_types(a: &[String], b: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |t: &str| {
        if !out.iter().any(|o| o == t) {
            out.push(t.to_string());
        }
    };
    let has = |t: &str| b.iter().any(|u| u == t);
    for t in a {
        if has(t) {
            add(t);
        }
        // `number` is `integer` and `FRACTION`.
        match t.as_str() {
            "integer" | FRACTION if has("number") => add(t),
            "number" => {
                for part in ["integer", FRACTION] {
                    if has(part) {
                        add(part);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The values of `const` / `enum`, if either is present.
fn literals(map: &Map<String, Value>) -> Option<Vec<Value>> {
    if let Some(value) = map.get("const") {
        return Some(vec![value.clone()]);
    }
    map.get("enum").and_then(Value::as_array).cloned()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
