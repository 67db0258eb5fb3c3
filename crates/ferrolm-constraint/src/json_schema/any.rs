//! "A JSON value of any type": the rule that schema positions taking anything call,
//! and the grammars `json_object` / `json_value`. Arrays and objects nest without
//! bound, so the rule calls itself for their elements (see `recursive.rs`).

use super::{whitespace_regex, JsonSchemaOptions, NUMBER, STRING_CHAR};
use crate::recursive::call;

/// The rules of "one JSON value of any type" (`top_level_object`: an object).
pub(crate) fn any_json_rules(options: &JsonSchemaOptions, top_level_object: bool) -> Vec<String> {
    let ws = whitespace_regex(options.whitespace);
    let main = if top_level_object { any_object(&ws, &call(ANY_VALUE_RULE)) } else { call(ANY_VALUE_RULE) };
    vec![main, any_value_rule(&ws)]
}

/// The rule index of "a JSON value of any type".
pub(super) const ANY_VALUE_RULE: usize = 1;

/// A JSON value of any type; its array elements and object members call it again.
pub(super) fn any_value_rule(ws: &str) -> String {
    let value = call(ANY_VALUE_RULE);
    let string = format!("\"{STRING_CHAR}*\"");
    let array = format!(r"\[{ws}(?:{value}{ws}(?:,{ws}{value}{ws})*)?\]");
    let object = any_object(ws, &value);
    format!("{string}|{NUMBER}|true|false|null|{array}|{object}")
}

/// An object whose members have any names and values matching `value`.
pub(super) fn any_object(ws: &str, value: &str) -> String {
    let member = format!("\"{STRING_CHAR}*\"{ws}:{ws}(?:{value}){ws}");
    format!(r"\{{{ws}(?:{member}(?:,{ws}{member})*)?\}}")
}
