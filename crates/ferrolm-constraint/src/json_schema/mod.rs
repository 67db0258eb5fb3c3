//! JSON Schema -> regexes: one for the main rule and, where the schema recurses or takes
//! values of any type, more for the rules it calls.
//!
//! Generation-oriented choices (the documents we produce are always valid, but some
//! valid documents are not produced):
//! - compact JSON by default, or JSON whitespace capped at a run length;
//! - properties in the order the schema lists them, extra ones after them; an absent
//!   `additionalProperties` allows members of any name and type, as the specification
//!   says (`strict`, OpenAI's strict mode: it generates no undeclared property, as
//!   `false` would);
//! - numbers without exponent where bounds apply; integral values without a fraction;
//! - `format` restricts strings to the format (`assert_formats`), some formats to a
//!   valid subset (see `formats.rs`); formats the engine does not know are annotations.
//!
//! Schemas of drafts 4, 6, 7, 2019-09 and 2020-12 (by `$schema`; 2020-12 without) are
//! first rewritten into the 2020-12 vocabulary, unknown keywords (annotations) dropped
//! and references resolved (`normalize.rs`).
//!
//! Without `type`, a schema allows every type, each keyword constraining its own.
//! Values of any type and recursive `$ref`s become rules that call each other (see
//! `recursive.rs`; the regex of the main rule then contains calls). `allOf`, keywords
//! next to `$ref`/`anyOf`/`oneOf`, `dependent*`, `unevaluated*`, `not`, `if` and
//! overlapping `oneOf` branches are rewritten into unions of merged schemas where that
//! is exact (`merge.rs`, `negate.rs`). Anything that would change what is valid and
//! that we cannot express — `uniqueItems` over unbounded domains, overlapping
//! `patternProperties`, `not` of a `pattern`, ... — is a
//! [`ConstraintError::UnsupportedSchema`] naming the keyword, unless `lenient` is set,
//! in which case the keyword is ignored and the grammar may be looser or stricter.

mod any;
mod formats;
mod int_range;
mod literal;
mod merge;
mod multiple;
mod names;
mod negate;
mod normalize;
mod objects;
mod one_of;
mod pattern;
mod values;

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::budget::MAX_REGEX_BYTES;
use crate::error::{ConstraintError, Result};
use crate::recursive::{call, MAX_RULES};

pub(crate) use any::any_json_rules;
use any::{any_value_rule, ANY_VALUE_RULE};

pub use int_range::integer_range_regex;

/// How much whitespace the generated JSON may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Whitespace {
    /// None at all: `{"a":1,"b":[2,3]}`.
    Compact,
    /// JSON whitespace wherever JSON allows it, at most `max_run` characters in a row
    /// (an unbounded run lets a model loop on whitespace forever).
    Flexible { max_run: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JsonSchemaOptions {
    pub whitespace: Whitespace,
    /// Ignore unsupported keywords instead of failing.
    pub lenient: bool,
    /// OpenAI's strict mode: read an absent `additionalProperties` as `false` (objects
    /// get only their declared members). Off (the default), it allows members of any
    /// name and value after the declared ones, as JSON Schema says.
    pub strict: bool,
    /// Generate strings in their `format` (the default: what a caller naming a format
    /// wants). Draft 2020-12 makes `format` an annotation unless the format-assertion
    /// vocabulary is in use; turn this off for that reading.
    pub assert_formats: bool,
    /// Declared members in any order, each at most once, `required` checked at the
    /// object's close (off, the default: in schema order, as OpenAI and llguidance
    /// generate them). The matcher notes the names seen in each open object, so masks
    /// stay exact without an automaton per order. Objects with `minProperties` or
    /// `maxProperties` are then refused (unless `lenient`, which ignores the counts).
    pub any_order_members: bool,
}

impl Default for JsonSchemaOptions {
    fn default() -> Self {
        JsonSchemaOptions {
            whitespace: Whitespace::Compact,
            lenient: false,
            strict: false,
            assert_formats: true,
            any_order_members: false,
        }
    }
}

/// Keywords that never change what is valid.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "examples",
    "default",
    "$comment",
    "$schema",
    "$id",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
    "$defs",
    "definitions",
];

/// Keywords this module understands (some only with certain values).
const HANDLED: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "enum",
    "const",
    "anyOf",
    "allOf",
    "oneOf",
    "$ref",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "nullable",
    "pattern",
    "contains",
    "minContains",
    "maxContains",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "multipleOf",
    negate::NOT_ENUM,
    negate::SOME_OTHER,
    negate::SOME_EXTRA,
];

/// One JSON string character, encoded: anything but `"`, `\` and control characters,
/// or an escape. A character outside the BMP is written as UTF-8 (as serde_json writes
/// it), never as a `\u` surrogate escape: a lone surrogate is text no UTF-8 parser
/// (serde_json, Rust's `str`) accepts, and allowing only high-low pairs would add eight
/// states to every string of a schema, and to every count position of a counted one
/// (SchemaStore's largest schema then passes the state limit). The values that can be
/// written are the same.
pub(crate) const STRING_CHAR: &str =
    r#"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))"#;
const NUMBER: &str = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?";

/// The schema as the translator reads it: rewritten into the draft 2020-12 vocabulary
/// (its draft picked by `$schema`), annotations and unknown keywords dropped, and every
/// reference that stays in the document resolved and pointing under the root's `$defs`
/// (see `normalize.rs`). For tools that follow the schema alongside the engine (the
/// order in which members are generated, for instance).
pub fn normalized_schema(schema: &Value) -> Result<Value> {
    let draft = normalize::draft_of(schema).unwrap_or(normalize::Draft::D2020);
    normalize::normalize(schema, draft)
}

/// [`normalized_schema`] of a schema given as JSON text, as compact JSON text.
pub fn normalized_schema_text(schema: &str) -> Result<String> {
    let value: Value = serde_json::from_str(schema).map_err(|e| ConstraintError::InvalidSchema {
        path: "#".into(),
        message: format!("not JSON: {e}"),
    })?;
    Ok(normalized_schema(&value)?.to_string())
}

/// Translate a schema into a regex over the JSON text.
pub fn json_schema_to_regex(schema: &Value, options: &JsonSchemaOptions) -> Result<String> {
    Ok(json_schema_to_rules_with(schema, options, false)?.rules.swap_remove(0))
}

/// What a schema translates to: its rules' regexes, whether repeats became rules, and
/// for members in any order the name sets the objects' close marks require.
pub(crate) struct Translated {
    pub rules: Vec<String>,
    pub shared: bool,
    /// `Some` when the regexes have marks (`recursive::Mark`): the required sets.
    pub required: Option<Vec<Box<[u32]>>>,
}

/// The regexes of a schema's rules: the main one, then, if the schema has positions
/// that take a value of any type (`{}`, `true`, an array without `items`, ...), the
/// rule for such a value, which those positions call (see `recursive.rs`), then the
/// rules of recurring `$ref`s and of shared regexes.
#[cfg(test)]
pub(crate) fn json_schema_to_rules(schema: &Value, options: &JsonSchemaOptions) -> Result<Vec<String>> {
    Ok(json_schema_to_rules_with(schema, options, true)?.rules)
}

/// [`json_schema_to_rules`]; `share_repeats`: a member value or array item written in
/// several places (the same object schema under many names, a format) becomes one rule
/// that each place calls (see [`Translator::shared`]). Also says whether that made
/// rules: calls where the text was written out can make a grammar ambiguous at a rule
/// boundary (two `anyOf` branches, one calling, one reading the same byte), and then the
/// caller translates again without.
pub(crate) fn json_schema_to_rules_with(
    schema: &Value,
    options: &JsonSchemaOptions,
    share_repeats: bool,
) -> Result<Translated> {
    // Another metaschema may switch vocabularies (validation) off or on.
    let draft = match normalize::draft_of(schema) {
        Some(draft) => draft,
        None if options.lenient => normalize::Draft::D2020,
        None => {
            let metaschema = schema.get("$schema").map(|m| m.to_string()).unwrap_or_default();
            return Err(ConstraintError::UnsupportedSchema {
                keyword: format!("$schema {metaschema} (not a draft 4, 6, 7, 2019-09 or 2020-12 metaschema)"),
                path: "#".into(),
            });
        }
    };
    let normalized = normalize::normalize(schema, draft)?;
    let schema = &normalized;
    let ws = whitespace_regex(options.whitespace);
    // A schema whose text has the placeholder marks (noncharacters) is not shared.
    let share_repeats = share_repeats && !schema.to_string().contains([MARK_OPEN, MARK_CLOSE]);
    let mut translator = Translator {
        root: schema,
        lenient: options.lenient,
        strict: options.strict,
        assert_formats: options.assert_formats,
        ws: ws.clone(),
        ref_stack: Vec::new(),
        inline_stack: Vec::new(),
        uses_any_value: false,
        extra_rules: Vec::new(),
        empty: Default::default(),
        share_repeats,
        pieces: Vec::new(),
        piece_ids: HashMap::new(),
        any_order: options.any_order_members,
        name_ids: HashMap::new(),
        required_sets: Vec::new(),
    };
    let main = translator.schema(schema, "#")?;
    // Each recurring target, translated with itself on the stack so that its own
    // references call its rule (new rules may be found on the way); shared regexes are
    // rules as they are.
    let mut ref_rules = Vec::new();
    while ref_rules.len() < translator.extra_rules.len() {
        match translator.extra_rules[ref_rules.len()].clone() {
            ExtraRule::Ref(reference) => {
                let pointer = decode_pointer(reference.strip_prefix('#').unwrap_or_default());
                let target = schema.pointer(&pointer).expect("resolved when first met");
                translator.ref_stack = vec![reference.clone()];
                ref_rules.push(translator.schema(target, &reference)?);
            }
            ExtraRule::Shared(regex) => ref_rules.push(regex),
        }
    }
    let (main, ref_rules, shared_any) = translator.resolve_pieces(main, ref_rules)?;
    let required = translator.any_order.then(|| std::mem::take(&mut translator.required_sets));
    if !translator.uses_any_value && ref_rules.is_empty() {
        return Ok(Translated { rules: vec![main], shared: shared_any, required });
    }
    // Rule 1 is always the any-value rule, so that reference rules keep their numbers.
    let mut rules = vec![main, any_value_rule(&ws)];
    rules.extend(ref_rules);
    Ok(Translated { rules, shared: shared_any, required })
}

/// Around the number of a piece (a regex `shared` may still make a rule) in the texts
/// written while translating: noncharacters, which no generated regex contains.
const MARK_OPEN: char = '\u{FDD0}';
const MARK_CLOSE: char = '\u{FDD1}';

/// A member value or array item at least this long, written in two places or more,
/// becomes one rule (shorter ones cost fewer states than a call's bookkeeping).
const SHARED_REPEAT_BYTES: usize = 256;

/// A member value or array item repeating a part at least this many times (a string's
/// `maxLength`, an array's `maxItems`) is shared like a long one, however short its
/// text: its DFA holds a copy of the part's states per count (140 characters of a
/// string are some 1,200 states).
const SHARED_REPEAT_COUNT: u32 = 16;

/// The largest count of a counted repetition in `regex` (`{n}`, `{n,m}`: the larger
/// number), escapes and character classes skipped.
fn largest_count(regex: &str) -> u32 {
    let (mut largest, mut in_class) = (0u32, false);
    let mut bytes = regex.bytes().peekable();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => {
                bytes.next();
            }
            b'[' if !in_class => in_class = true,
            b']' if in_class => in_class = false,
            b'{' if !in_class => {
                let mut number = 0u32;
                while let Some(&d) = bytes.peek() {
                    match d {
                        b'0'..=b'9' => number = number.saturating_mul(10).saturating_add(u32::from(d - b'0')),
                        b',' => {
                            largest = largest.max(number);
                            number = 0;
                        }
                        _ => break,
                    }
                    bytes.next();
                }
                largest = largest.max(number);
            }
            _ => {}
        }
    }
    largest
}

/// The pieces `text` refers to, in order (once per mention).
fn piece_refs(text: &str) -> impl Iterator<Item = usize> + '_ {
    text.split(MARK_OPEN).skip(1).filter_map(|rest| rest.split(MARK_CLOSE).next()?.parse().ok())
}

/// `text` with each piece mention replaced by `resolved[piece]`.
fn replace_pieces(text: &str, resolved: &[String]) -> String {
    if !text.contains(MARK_OPEN) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split(MARK_OPEN);
    out.push_str(parts.next().unwrap_or_default());
    for part in parts {
        let (number, rest) = part.split_once(MARK_CLOSE).expect("a piece mention is closed");
        out.push_str(&resolved[number.parse::<usize>().expect("a piece number")]);
        out.push_str(rest);
    }
    out
}

/// The rule of the first recurring `$ref` or shared regex.
const FIRST_REF_RULE: usize = 2;

/// A regex written more than once (an array's item: `(item(,item)*)?`) becomes a rule
/// of its own, called from each place, when it is longer than this. Written out, each
/// level of nesting would double it: nested arrays grew exponentially with depth.
const SHARED_RULE_BYTES: usize = 4096;

/// A regex nesting groups deeper than this, in a position a call may take, becomes a
/// rule (a regex may nest groups at most `MAX_GROUP_NESTING` deep).
const MAX_INLINE_GROUP_DEPTH: usize = 64;

/// How deeply `regex` nests groups (escapes and character classes skipped).
fn group_depth(regex: &str) -> usize {
    let (mut depth, mut deepest, mut in_class) = (0usize, 0usize, false);
    let mut bytes = regex.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => {
                bytes.next();
            }
            b'[' if !in_class => in_class = true,
            b']' if in_class => in_class = false,
            b'(' if !in_class => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' if !in_class => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A rule after the any-value rule.
#[derive(Clone, PartialEq, Eq)]
enum ExtraRule {
    /// A recurring `$ref` target (translated after the main rule).
    Ref(String),
    /// A regex several positions use (already translated).
    Shared(String),
}

fn whitespace_regex(whitespace: Whitespace) -> String {
    match whitespace {
        Whitespace::Compact => String::new(),
        Whitespace::Flexible { max_run } => format!(r"[ \t\n\r]{{0,{max_run}}}"),
    }
}

struct Translator<'a> {
    root: &'a Value,
    lenient: bool,
    strict: bool,
    assert_formats: bool,
    /// Regex for optional whitespace between tokens (empty when compact).
    ws: String,
    /// `$ref`s being expanded, to detect recursion.
    ref_stack: Vec<String>,
    /// `$ref`s inlined to be merged with their siblings, while their copies are translated.
    inline_stack: Vec<String>,
    /// Some position takes a value of any type (the any-value rule is needed).
    uses_any_value: bool,
    /// `$ref`s that recur and shared regexes; the i-th is rule `FIRST_REF_RULE + i`.
    extra_rules: Vec<ExtraRule>,
    /// The errors met so far that say a schema allows no value (rather than that it is
    /// malformed): a union drops such a branch.
    empty: std::cell::RefCell<Vec<ConstraintError>>,
    /// Member values and array items written in several places become rules
    /// ([`Translator::shared`]).
    share_repeats: bool,
    /// The regexes `shared` left to decide (mentioned in texts by number), and their numbers.
    pieces: Vec<String>,
    piece_ids: HashMap<String, usize>,
    /// Declared members in any order ([`JsonSchemaOptions::any_order_members`]).
    any_order: bool,
    /// The number of each member name a mark names, and the required sets close marks name.
    name_ids: HashMap<String, u32>,
    required_sets: Vec<Box<[u32]>>,
}

impl<'a> Translator<'a> {
    fn unsupported(&self, keyword: &str, path: &str) -> ConstraintError {
        ConstraintError::UnsupportedSchema { keyword: keyword.to_string(), path: path.to_string() }
    }

    fn invalid(&self, path: &str, message: impl Into<String>) -> ConstraintError {
        ConstraintError::InvalidSchema { path: path.to_string(), message: message.into() }
    }

    /// An error saying that the schema at `path` allows no value.
    pub(super) fn nothing(&self, path: &str, message: impl Into<String>) -> ConstraintError {
        let err = self.invalid(path, message);
        self.empty.borrow_mut().push(err.clone());
        err
    }

    /// Whether `result`, the translation of the schema at `path`, failed because that
    /// schema allows no value (not merely some position inside it).
    pub(super) fn allows_nothing<T>(&self, result: &Result<T>, path: &str) -> bool {
        matches!(result, Err(err @ ConstraintError::InvalidSchema { path: at, .. })
            if at == path && self.empty.borrow().contains(err))
    }

    /// How `oneOf` branches are proven apart (`one_of.rs`).
    fn apart(&self) -> one_of::Context<'a> {
        one_of::Context { root: self.root, assert_formats: self.assert_formats }
    }

    /// Fail on a keyword we do not support, unless lenient.
    fn refuse(&self, keyword: &str, path: &str) -> Result<()> {
        if self.lenient {
            Ok(())
        } else {
            Err(self.unsupported(keyword, path))
        }
    }

    /// The regex of `schema`, refused once it grows past [`MAX_REGEX_BYTES`] (so a
    /// schema whose regex multiplies with nesting stops early, at a small cost).
    fn schema(&mut self, schema: &Value, path: &str) -> Result<String> {
        crate::budget::check()?;
        let regex = self.schema_inner(schema, path)?;
        if regex.len() > MAX_REGEX_BYTES {
            return Err(ConstraintError::GrammarTooLarge {
                message: format!(
                    "the regex of the schema at {path} exceeds the limit of {} KiB (repetitions or \
                     combinations multiply its size)",
                    MAX_REGEX_BYTES >> 10
                ),
            });
        }
        Ok(regex)
    }

    /// `regex` as it is if short and shallow, else a call to a rule that matches it: for
    /// positions a call may take that are written more than once or may be large (array
    /// items, member values; see [`SHARED_RULE_BYTES`]), and so that deeply nested
    /// schemas do not nest groups past what the regex parser takes.
    pub(super) fn shared(&mut self, regex: String) -> String {
        // Its length and depth written out (the pieces in it inlined).
        // (Without sharing there are no pieces, and a mark is the schema's own text.)
        let written = match self.share_repeats && regex.contains(MARK_OPEN) {
            true => self.written_out(&regex, SHARED_RULE_BYTES),
            false => (regex.len() <= SHARED_RULE_BYTES).then_some(std::borrow::Cow::Borrowed(regex.as_str())),
        };
        let Some(written) = written.filter(|w| group_depth(w) <= MAX_INLINE_GROUP_DEPTH) else {
            return self.as_rule(regex);
        };
        if !self.share_repeats
            || (written.len() < SHARED_REPEAT_BYTES && largest_count(&written) < SHARED_REPEAT_COUNT)
        {
            return regex;
        }
        // A piece: written out where it is used once, a rule where it is used more
        // (decided once the whole schema is translated: `resolve_pieces`).
        let piece = match self.piece_ids.get(&regex) {
            Some(&piece) => piece,
            None => {
                self.piece_ids.insert(regex.clone(), self.pieces.len());
                self.pieces.push(regex);
                self.pieces.len() - 1
            }
        };
        format!("{MARK_OPEN}{piece}{MARK_CLOSE}")
    }

    /// `regex` with its pieces written out, if that is at most `limit` bytes long.
    fn written_out(&self, regex: &str, limit: usize) -> Option<std::borrow::Cow<'_, str>> {
        if !regex.contains(MARK_OPEN) {
            return (regex.len() <= limit).then(|| std::borrow::Cow::Owned(regex.to_string()));
        }
        let mut out = String::new();
        let mut parts = regex.split(MARK_OPEN);
        out.push_str(parts.next().unwrap_or_default());
        for part in parts {
            let (number, rest) = part.split_once(MARK_CLOSE)?;
            let piece = &self.pieces[number.parse::<usize>().ok()?];
            out.push_str(&self.written_out(piece, limit.checked_sub(out.len())?)?);
            out.push_str(rest);
            if out.len() > limit {
                return None;
            }
        }
        (out.len() <= limit).then_some(std::borrow::Cow::Owned(out))
    }

    /// The texts with their pieces resolved: a piece used in two places or more (counted
    /// as written: inside a piece written out twice, twice) becomes a rule each place
    /// calls, others are written out. Also says whether a piece became a rule.
    fn resolve_pieces(&mut self, main: String, rules: Vec<String>) -> Result<(String, Vec<String>, bool)> {
        if self.pieces.is_empty() {
            return Ok((main, rules, false));
        }
        let n = self.pieces.len();
        let mut uses = vec![0usize; n];
        for text in std::iter::once(&main).chain(&rules) {
            for piece in piece_refs(text) {
                uses[piece] += 1;
            }
        }
        // A piece only mentions pieces made before it: from the last to the first, each
        // piece's uses are known when it is reached.
        let mut rule_of: Vec<Option<usize>> = vec![None; n];
        for piece in (0..n).rev() {
            if uses[piece] == 0 {
                continue;
            }
            let times = match uses[piece] >= 2 && FIRST_REF_RULE + self.extra_rules.len() < MAX_RULES {
                true => {
                    self.extra_rules.push(ExtraRule::Shared(String::new()));
                    rule_of[piece] = Some(FIRST_REF_RULE + self.extra_rules.len() - 1);
                    1
                }
                false => uses[piece],
            };
            for inner in piece_refs(&self.pieces[piece]).collect::<Vec<_>>() {
                uses[inner] += times;
            }
        }
        let mut resolved: Vec<String> = Vec::with_capacity(n);
        for (piece, rule) in rule_of.iter().enumerate() {
            let text = match rule {
                Some(rule) => call(*rule),
                None => replace_pieces(&self.pieces[piece], &resolved),
            };
            resolved.push(text);
        }
        let first_new = FIRST_REF_RULE + rules.len();
        let mut rules: Vec<String> = rules.iter().map(|r| replace_pieces(r, &resolved)).collect();
        let mut new_rules: Vec<(usize, String)> = (0..n)
            .filter_map(|piece| Some((rule_of[piece]?, replace_pieces(&self.pieces[piece], &resolved))))
            .collect();
        new_rules.sort_by_key(|(rule, _)| *rule);
        debug_assert!(new_rules.iter().enumerate().all(|(i, (rule, _))| *rule == first_new + i));
        rules.extend(new_rules.into_iter().map(|(_, text)| text));
        let main = replace_pieces(&main, &resolved);
        for text in std::iter::once(&main).chain(&rules) {
            if text.len() > MAX_REGEX_BYTES {
                return Err(ConstraintError::GrammarTooLarge {
                    message: format!(
                        "a rule's regex exceeds the limit of {} KiB (repetitions or combinations \
                         multiply its size)",
                        MAX_REGEX_BYTES >> 10
                    ),
                });
            }
        }
        Ok((main, rules, rule_of.iter().any(Option::is_some)))
    }

    fn as_rule(&mut self, regex: String) -> String {
        let rule = ExtraRule::Shared(regex);
        let index = match self.extra_rules.iter().position(|r| *r == rule) {
            Some(index) => index,
            None if FIRST_REF_RULE + self.extra_rules.len() < MAX_RULES => {
                self.extra_rules.push(rule);
                self.extra_rules.len() - 1
            }
            // Out of rules: written out (the size limit above still applies).
            None => {
                let ExtraRule::Shared(regex) = rule else { unreachable!() };
                return regex;
            }
        };
        call(FIRST_REF_RULE + index)
    }

    fn schema_inner(&mut self, schema: &Value, path: &str) -> Result<String> {
        let map = match schema {
            Value::Object(map) => map,
            Value::Bool(true) => return Ok(self.any_value()),
            Value::Bool(false) => return Err(self.nothing(path, "the schema `false` allows no value")),
            _ => return Err(self.invalid(path, "a schema must be an object or a boolean")),
        };
        if merge::needs_flattening(map) {
            match self.flattened(map, path) {
                // Lenient: read the schema as before, ignoring what cannot be merged.
                Err(ConstraintError::UnsupportedSchema { .. }) if self.lenient => {}
                result => return result,
            }
        }
        for key in map.keys() {
            if !ANNOTATIONS.contains(&key.as_str()) && !HANDLED.contains(&key.as_str()) {
                self.refuse(key, path)?;
            }
        }
        if map.keys().all(|k| ANNOTATIONS.contains(&k.as_str())) {
            return Ok(self.any_value());
        }
        // Keywords that replace the schema: each must stand alone (its siblings would
        // need an intersection of languages, which we do not build).
        for keyword in ["$ref", "anyOf", "allOf", "oneOf"] {
            if let Some(value) = map.get(keyword) {
                let siblings =
                    map.keys().any(|k| k != keyword && !ANNOTATIONS.contains(&k.as_str()) && k != "nullable");
                if siblings {
                    self.refuse(&format!("{keyword} with sibling keywords"), path)?;
                }
                let inner = self.combinator(keyword, value, path)?;
                return Ok(self.with_nullable(map, inner));
            }
        }
        if let Some(value) = map.get("const") {
            let inner = self.literal_choice(map, std::slice::from_ref(value), path)?;
            return Ok(self.with_nullable(map, inner));
        }
        if let Some(values) = map.get("enum") {
            let values = values.as_array().ok_or_else(|| self.invalid(path, "`enum` must be an array"))?;
            let inner = self.literal_choice(map, values, path)?;
            return Ok(self.with_nullable(map, inner));
        }
        let types = self.types(map, path)?;
        let mut alternatives = Vec::new();
        let mut none_of_them = None;
        for ty in types {
            // A type no value of which the keywords allow is left out of the union.
            let typed = self.typed(&ty, map, path);
            if self.allows_nothing(&typed, path) {
                none_of_them = typed.err();
                continue;
            }
            alternatives.push(format!("(?:{})", typed?));
        }
        if let (true, Some(err)) = (alternatives.is_empty(), none_of_them) {
            return Err(err);
        }
        Ok(self.with_nullable(map, alternatives.join("|")))
    }

    /// A value of any type: a call to the any-value rule.
    pub(super) fn any_value(&mut self) -> String {
        self.uses_any_value = true;
        call(ANY_VALUE_RULE)
    }

    fn with_nullable(&self, map: &Map<String, Value>, inner: String) -> String {
        if map.get("nullable") == Some(&Value::Bool(true)) {
            format!("(?:{inner})|null")
        } else {
            inner
        }
    }

    fn combinator(&mut self, keyword: &str, value: &Value, path: &str) -> Result<String> {
        if keyword == "$ref" {
            let reference = value.as_str().ok_or_else(|| self.invalid(path, "`$ref` must be a string"))?;
            return self.reference(reference, path);
        }
        let branches = value
            .as_array()
            .filter(|b| !b.is_empty())
            .ok_or_else(|| self.invalid(path, format!("`{keyword}` must be a non-empty array")))?;
        match keyword {
            "allOf" if branches.len() == 1 => self.schema(&branches[0], &format!("{path}/allOf/0")),
            "allOf" => Err(self.unsupported("allOf with more than one schema", path)),
            // oneOf also demands that exactly one branch matches: a union says that only
            // when no value satisfies two branches. Lenient mode accepts the union anyway.
            // Overlapping branches: each and the negation of the others (merge.rs).
            "oneOf" if !self.lenient && !one_of::branches_exclusive(&self.apart(), branches, &Map::new()) => {
                let map: Map<String, Value> = std::iter::once(("oneOf".to_string(), value.clone())).collect();
                self.flattened(&map, path)
            }
            _ => {
                let mut alternatives = Vec::new();
                let mut none_of_them = None;
                for (i, branch) in branches.iter().enumerate() {
                    let branch_path = format!("{path}/{keyword}/{i}");
                    let inner = self.schema(branch, &branch_path);
                    // A branch that allows no value adds nothing to the union.
                    if self.allows_nothing(&inner, &branch_path) {
                        none_of_them = inner.err();
                        continue;
                    }
                    let inner = inner?;
                    // In anyOf, a branch that takes anything makes the others redundant.
                    if inner == call(ANY_VALUE_RULE) && keyword == "anyOf" {
                        return Ok(inner);
                    }
                    alternatives.push(format!("(?:{inner})"));
                }
                match none_of_them {
                    Some(err) if alternatives.is_empty() => Err(err),
                    _ => Ok(alternatives.join("|")),
                }
            }
        }
    }

    /// Resolve a local reference (`#`, `#/$defs/...`, any JSON pointer into the root).
    fn reference(&mut self, reference: &str, path: &str) -> Result<String> {
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| self.unsupported(&format!("$ref {reference:?} (only local references)"), path))?;
        let target = self
            .root
            .pointer(&decode_pointer(pointer))
            .ok_or_else(|| self.invalid(path, format!("unknown $ref {reference:?}")))?;
        if self.ref_stack.iter().any(|r| r == reference) {
            // Recursion: the target becomes a rule of its own, called from here.
            let rule = ExtraRule::Ref(reference.to_string());
            let index = match self.extra_rules.iter().position(|r| *r == rule) {
                Some(index) => index,
                None => {
                    if FIRST_REF_RULE + self.extra_rules.len() >= MAX_RULES {
                        return Err(self.unsupported("more recursive $refs than rules", path));
                    }
                    self.extra_rules.push(rule);
                    self.extra_rules.len() - 1
                }
            };
            return Ok(call(FIRST_REF_RULE + index));
        }
        self.ref_stack.push(reference.to_string());
        let result = self.schema(target, reference);
        self.ref_stack.pop();
        result
    }

    /// The listed types; without `type`, every type: each keyword constrains only the
    /// values of its own type (`{"minimum": 1}` also allows strings, arrays, ...).
    fn types(&self, map: &Map<String, Value>, path: &str) -> Result<Vec<String>> {
        if map.contains_key("type") {
            return self.listed_types(map, path);
        }
        // `number` covers integers; the first bytes of these six never overlap.
        Ok(["null", "boolean", "number", "string", "array", "object"].map(String::from).to_vec())
    }

    /// `const` / `enum`: the compact serializations of the values that also have the
    /// schema's `type` (if any).
    fn literal_choice(&mut self, map: &Map<String, Value>, values: &[Value], path: &str) -> Result<String> {
        let types = match map.get("type") {
            Some(_) => Some(self.listed_types(map, path)?),
            None => None,
        };
        let values: Vec<&Value> = values
            .iter()
            .filter(|v| types.as_ref().is_none_or(|t| t.iter().any(|ty| has_type(v, ty))))
            .collect();
        self.counts(map, "minLength", "maxLength", path)?;
        // The listed values are all the schema may take: every other keyword keeps
        // those it allows, where it can be decided on a value (`literal.rs`).
        let mut kept = vec![true; values.len()];
        for (key, keyword) in map {
            if ["const", "enum", "type", "nullable"].contains(&key.as_str())
                || !HANDLED.contains(&key.as_str())
            {
                continue;
            }
            for (i, value) in values.iter().enumerate() {
                match literal::keyword_holds(value, key, keyword, self.assert_formats) {
                    Some(holds) => kept[i] &= holds,
                    None => self.refuse(&format!("{key} next to const/enum"), path)?,
                }
            }
        }
        let mut alternatives: Vec<String> = Vec::new();
        for (value, _) in values.iter().zip(&kept).filter(|(_, kept)| **kept) {
            alternatives.push(self.literal(value, path)?);
        }
        if alternatives.is_empty() {
            return Err(self.nothing(path, "no value of `const`/`enum` has the schema's type"));
        }
        Ok(alternatives.join("|"))
    }

    /// The regex of one `const`/`enum` value: its compact serialization; with members
    /// in any order, each object in it an object of exactly its members, in any order.
    fn literal(&mut self, value: &Value, path: &str) -> Result<String> {
        fn has_object(value: &Value) -> bool {
            match value {
                Value::Object(_) => true,
                Value::Array(items) => items.iter().any(has_object),
                _ => false,
            }
        }
        if !self.any_order || !has_object(value) {
            return Ok(regex_syntax::escape(&canonical_json(value)));
        }
        match value {
            Value::Array(items) => {
                let mut parts = Vec::with_capacity(items.len());
                for item in items {
                    parts.push(self.literal(item, path)?);
                }
                Ok(format!(r"\[{}\]", parts.join(",")))
            }
            Value::Object(members) => {
                let mut written = Vec::with_capacity(members.len());
                for (name, member) in members {
                    let key = self.member_key(name)?;
                    written.push((format!("{key}:(?:{})", self.literal(member, path)?), true));
                }
                let names: Vec<&str> = members.keys().map(String::as_str).collect();
                self.any_order_object(&written, None, &names, path)
            }
            _ => unreachable!("scalars are written above"),
        }
    }

    fn listed_types(&self, map: &Map<String, Value>, path: &str) -> Result<Vec<String>> {
        match map.get("type") {
            Some(Value::String(t)) => Ok(vec![t.clone()]),
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| self.invalid(path, "`type` entries must be strings"))
                })
                .collect(),
            Some(_) => Err(self.invalid(path, "`type` must be a string or a non-empty array")),
            None => Ok(Vec::new()),
        }
    }

    fn typed(&mut self, ty: &str, map: &Map<String, Value>, path: &str) -> Result<String> {
        match ty {
            "null" => Ok("null".into()),
            "boolean" => Ok("true|false".into()),
            "integer" => self.integer(map, path),
            "number" => self.number(map, path),
            negate::FRACTION => self.fraction(map, path),
            "string" => self.string(map, path),
            "array" => self.array(map, path),
            "object" => self.object(map, path),
            other => Err(self.invalid(path, format!("unknown type {other:?}"))),
        }
    }
}

/// Compact JSON as the engine writes it: members in the given order, and integral
/// numbers without a fraction (`-2.0` is written `-2`; JSON Schema treats them as equal).
pub fn canonical_json(value: &Value) -> String {
    fn normalize(value: &Value) -> Value {
        match value {
            Value::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() <= MAX_EXACT_INTEGER => {
                    Value::from(f as i64)
                }
                _ => value.clone(),
            },
            Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
            Value::Object(members) => {
                Value::Object(members.iter().map(|(k, v)| (k.clone(), normalize(v))).collect())
            }
            _ => value.clone(),
        }
    }
    normalize(value).to_string()
}

/// 2^53: every integer up to here is exactly representable as an `f64`.
const MAX_EXACT_INTEGER: f64 = 9_007_199_254_740_992.0;

/// The type whose values a keyword constrains (`None`: every type, or not a keyword of
/// one type).
fn keyword_type(keyword: &str) -> Option<&'static str> {
    Some(match keyword {
        "properties"
        | "required"
        | "additionalProperties"
        | "patternProperties"
        | "propertyNames"
        | "minProperties"
        | "maxProperties"
        | negate::SOME_OTHER
        | negate::SOME_EXTRA => "object",
        "items" | "prefixItems" | "minItems" | "maxItems" | "contains" | "minContains" | "maxContains"
        | "uniqueItems" => "array",
        "minLength" | "maxLength" | "pattern" | "format" => "string",
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => "number",
        _ => return None,
    })
}

/// Whether a JSON value has a JSON Schema type.
fn has_type(value: &Value, ty: &str) -> bool {
    match ty {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
        "number" => value.is_number(),
        negate::FRACTION => value.as_f64().is_some_and(|f| f.fract() != 0.0),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => false,
    }
}

/// `#/$defs/a~1b` -> `/$defs/a~1b` with percent-escapes undone (JSON pointer `~`
/// escapes are handled by `Value::pointer`).
fn decode_pointer(pointer: &str) -> String {
    let mut out = Vec::new();
    let bytes = pointer.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) if bytes[i] == b'%' => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The bodies of the string loops JSON grammars are made of: values, and property
/// names written canonically. Their loop indexes are built once per vocabulary
/// (`Grammar::prime_json_loops`), so states that only simulate them (a string with a
/// `maxLength`) find them from the start.
pub(crate) fn string_loop_bodies() -> [&'static str; 2] {
    [STRING_CHAR, names::CANONICAL_CHAR]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_count_reads_counts_outside_classes_and_escapes() {
        assert_eq!(largest_count(r#""(?:[^"\\]|\\u[0-9a-f]{4}){0,140}""#), 140);
        assert_eq!(largest_count("a{3}b{2,17}"), 17);
        assert_eq!(largest_count("a{20,}"), 20);
        assert_eq!(largest_count(r"[{99}]\{50}x"), 0);
        assert_eq!(largest_count("abc"), 0);
    }
}
