//! The functions a request offers (OpenAI's `tools`) and which it may or must call
//! (`tool_choice`), checked with 400s naming the field at fault; and the JSON Schemas a
//! constrained call is generated under.

use serde_json::{json, Map, Value};

use crate::errors::{ApiError, ApiResult};

/// One function a request offers; `index` is its place in `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub index: usize,
    pub name: String,
    pub parameters: Map<String, Value>,
    pub description: Option<String>,
    pub strict: bool,
}

impl FunctionTool {
    pub fn parameters_field(&self) -> String {
        format!("tools.{}.function.parameters", self.index)
    }

    /// OpenAI's (and Hugging Face chat templates') form of the tool.
    pub fn as_template_tool(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), Value::from(self.name.as_str()));
        if let Some(d) = &self.description {
            function.insert("description".into(), Value::from(d.as_str()));
        }
        function.insert("parameters".into(), Value::Object(self.parameters.clone()));
        json!({"type": "function", "function": function})
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChoiceMode {
    None,
    Auto,
    Required,
}

/// `mode`; `function` names the one function that must be called (mode is then required).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolChoice {
    pub mode: ChoiceMode,
    pub function: Option<String>,
}

impl ToolChoice {
    pub fn calls_forced(&self) -> bool {
        self.mode == ChoiceMode::Required
    }
}

fn bad(message: String, field: &str) -> ApiError {
    ApiError::bad_request(message, field)
}

fn is_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Python's `repr` of a string, for messages.
fn repr(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// OpenAI's `tools` (their shape already checked, see [`check_tool_shapes`]) as
/// `FunctionTool`s; a 400 naming the field at fault.
pub fn parse_tools(raw: Option<&Value>) -> ApiResult<Vec<FunctionTool>> {
    let Some(raw) = raw.filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
    let entries = match raw.as_array() {
        Some(a) if !a.is_empty() => a,
        _ => return Err(bad("tools: give a non-empty list of tools, or none".into(), "tools")),
    };
    let mut tools: Vec<FunctionTool> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        // the shape is checked: each field is of its type, or absent, or null
        let function = entry.get("function").and_then(Value::as_object);
        let field = |key: &str| function.and_then(|f| f.get(key));
        let name_field = format!("tools.{i}.function.name");
        let name = match field("name") {
            Some(Value::String(n)) if is_function_name(n) => n.clone(),
            other => {
                let shown = match other {
                    Some(Value::String(n)) => repr(n),
                    Some(v) => v.to_string(),
                    None => "None".into(),
                };
                return Err(bad(
                    format!("{name_field}: {shown} is not a function name (1 to 64 letters, digits, _ or -)"),
                    &name_field,
                ));
            }
        };
        if tools.iter().any(|t| t.name == name) {
            return Err(bad(format!("{name_field}: {} is defined twice", repr(&name)), &name_field));
        }
        let parameters =
            field("parameters").and_then(Value::as_object).cloned().unwrap_or_else(no_parameters);
        let description = field("description").and_then(Value::as_str).map(str::to_string);
        let strict = field("strict").and_then(Value::as_bool).unwrap_or(false);
        tools.push(FunctionTool { index: i, name, parameters, description, strict });
    }
    Ok(tools)
}

/// OpenAI's function with an empty parameter list.
fn no_parameters() -> Map<String, Value> {
    let Value::Object(m) = json!({"type": "object", "properties": {}, "additionalProperties": false}) else {
        unreachable!()
    };
    m
}

/// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": ...}}`;
/// absent, `auto` when there are tools, else `none` (as OpenAI). A choice without tools,
/// or naming a function that is not among them, is refused.
pub fn parse_tool_choice(raw: Option<&Value>, tools: &[FunctionTool]) -> ApiResult<ToolChoice> {
    let raw = match raw {
        None | Some(Value::Null) => {
            let mode = if tools.is_empty() { ChoiceMode::None } else { ChoiceMode::Auto };
            return Ok(ToolChoice { mode, function: None });
        }
        Some(r) => r,
    };
    if tools.is_empty() {
        return Err(bad("tool_choice: only allowed when tools are given".into(), "tool_choice"));
    }
    if let Value::String(s) = raw {
        let mode = match s.as_str() {
            "none" => ChoiceMode::None,
            "auto" => ChoiceMode::Auto,
            "required" => ChoiceMode::Required,
            _ => {
                return Err(bad(
                    format!(
                        "tool_choice: {} is not one of none, auto, required or a named function",
                        repr(s)
                    ),
                    "tool_choice",
                ))
            }
        };
        return Ok(ToolChoice { mode, function: None });
    }
    let name = raw
        .as_object()
        .filter(|o| o.get("type").and_then(Value::as_str) == Some("function"))
        .and_then(|o| o.get("function"))
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str);
    let Some(name) = name else {
        return Err(bad(
            "tool_choice: give \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"
                .into(),
            "tool_choice",
        ));
    };
    if !tools.iter().any(|t| t.name == name) {
        return Err(bad(
            format!("tool_choice: function {} is not among the tools", repr(name)),
            "tool_choice",
        ));
    }
    Ok(ToolChoice { mode: ChoiceMode::Required, function: Some(name.to_string()) })
}

/// The tools a constrained call may name.
pub fn callable_tools<'a>(tools: &'a [FunctionTool], choice: &ToolChoice) -> Vec<&'a FunctionTool> {
    match &choice.function {
        Some(f) => tools.iter().filter(|t| &t.name == f).collect(),
        None => tools.iter().collect(),
    }
}

/// One call: `{"name": <one of the tools>, "<arguments_key>": <its parameters>}`, name
/// first (the engine writes declared members in schema order).
pub fn call_object_schema(tools: &[&FunctionTool], arguments_key: &str) -> Value {
    let many = tools.len() > 1;
    let branches: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let pointer = if many {
                format!("#/anyOf/{k}/properties/{arguments_key}")
            } else {
                format!("#/properties/{arguments_key}")
            };
            call_branch(t, arguments_key, &pointer)
        })
        .collect();
    let schema =
        if many { json!({ "anyOf": branches }) } else { branches.into_iter().next().expect("a tool") };
    with_lifted_dialect(schema, tools)
}

/// A JSON array of calls (Mistral's format): at least one; one at most when parallel calls
/// are off.
pub fn call_array_schema(tools: &[&FunctionTool], arguments_key: &str, parallel: bool) -> Value {
    let many = tools.len() > 1;
    let branches: Vec<Value> = tools
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let prefix = if many { format!("#/items/anyOf/{k}") } else { "#/items".to_string() };
            call_branch(t, arguments_key, &format!("{prefix}/properties/{arguments_key}"))
        })
        .collect();
    let items =
        if many { json!({ "anyOf": branches }) } else { branches.into_iter().next().expect("a tool") };
    let mut schema = Map::new();
    schema.insert("type".into(), "array".into());
    schema.insert("items".into(), items);
    schema.insert("minItems".into(), 1.into());
    if !parallel {
        schema.insert("maxItems".into(), 1.into());
    }
    with_lifted_dialect(Value::Object(schema), tools)
}

/// Each tool's parameters (as JSON text) by the field they came from: the one named when
/// the assembled schema does not compile.
pub fn schema_parts(tools: &[&FunctionTool]) -> Vec<(String, String)> {
    tools
        .iter()
        .map(|t| (t.parameters_field(), serde_json::to_string(&t.parameters).expect("JSON")))
        .collect()
}

/// OpenAI's strict mode for the assembled schema: only when every function asks for it.
pub fn all_strict(tools: &[&FunctionTool]) -> bool {
    !tools.is_empty() && tools.iter().all(|t| t.strict)
}

fn call_branch(tool: &FunctionTool, arguments_key: &str, pointer: &str) -> Value {
    let mut parameters = rebased(&tool.parameters, pointer);
    parameters.shift_remove("$schema");
    let mut properties = Map::new();
    properties.insert("name".into(), json!({ "const": tool.name }));
    properties.insert(arguments_key.into(), Value::Object(parameters));
    json!({"type": "object", "properties": properties, "required": ["name", arguments_key],
           "additionalProperties": false})
}

/// A `$schema` (draft) the functions' parameters declare moves to the root; when they
/// declare different drafts, each part stays 2020-12.
fn with_lifted_dialect(schema: Value, tools: &[&FunctionTool]) -> Value {
    let mut dialects: Vec<&str> =
        tools.iter().filter_map(|t| t.parameters.get("$schema").and_then(Value::as_str)).collect();
    dialects.sort_unstable();
    dialects.dedup();
    if dialects.len() != 1 {
        return schema;
    }
    let mut out = Map::new();
    out.insert("$schema".into(), Value::from(dialects[0]));
    if let Value::Object(m) = schema {
        out.extend(m);
    }
    Value::Object(out)
}

/// Keywords whose values are data, not schemas.
const DATA_KEYWORDS: &[&str] = &["const", "enum", "default", "examples", "example"];
/// Keywords whose values map names to schemas.
const NAME_MAPS: &[&str] =
    &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"];

/// `parameters` moved to `pointer` inside a larger schema: references to its own root are
/// rewritten to point there.
fn rebased(parameters: &Map<String, Value>, pointer: &str) -> Map<String, Value> {
    fn walk(node: &Value, names: bool, pointer: &str) -> Value {
        match node {
            Value::Object(m) if names => {
                Value::Object(m.iter().map(|(k, v)| (k.clone(), walk(v, false, pointer))).collect())
            }
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| {
                        let out = match v {
                            Value::String(r) if k == "$ref" && r.starts_with('#') => {
                                Value::from(format!("{pointer}{}", &r[1..]))
                            }
                            _ if DATA_KEYWORDS.contains(&k.as_str()) => v.clone(),
                            _ => walk(v, NAME_MAPS.contains(&k.as_str()), pointer),
                        };
                        (k.clone(), out)
                    })
                    .collect(),
            ),
            Value::Array(items) => Value::Array(items.iter().map(|v| walk(v, false, pointer)).collect()),
            other => other.clone(),
        }
    }
    match walk(&Value::Object(parameters.clone()), false, pointer) {
        Value::Object(m) => m,
        _ => unreachable!("an object walks to an object"),
    }
}

// ---- the shapes of the fields (what the Python front end's pydantic models check) ----

fn missing(field: String) -> ApiError {
    ApiError::bad_request(format!("{field}: Field required"), field)
}

fn wrong(field: String, what: &str) -> ApiError {
    ApiError::bad_request(format!("{field}: Input should be {what}"), field)
}

fn check_keys(obj: &Map<String, Value>, known: &[&str], prefix: &str) -> ApiResult<()> {
    for key in obj.keys() {
        if !known.contains(&key.as_str()) {
            let field = format!("{prefix}{key}");
            return Err(ApiError::bad_request(
                format!("{field}: unknown field (the fields here: {})", known.join(", ")),
                field,
            ));
        }
    }
    Ok(())
}

fn optional_kind(
    obj: &Map<String, Value>,
    key: &str,
    prefix: &str,
    ok: fn(&Value) -> bool,
    what: &str,
) -> ApiResult<()> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(v) if ok(v) => Ok(()),
        Some(_) => Err(wrong(format!("{prefix}{key}"), what)),
    }
}

/// The shapes of `tools`, `tool_choice` and `parallel_tool_calls` in a body (`prefix`:
/// where they sit), as typed fields: unknown keys and wrong types are refused naming the
/// field.
pub fn check_tool_shapes(obj: &Map<String, Value>, prefix: &str) -> ApiResult<()> {
    match obj.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(entries)) => {
            for (i, entry) in entries.iter().enumerate() {
                let at = format!("{prefix}tools.{i}");
                let Some(e) = entry.as_object() else { return Err(wrong(at, "a valid dictionary")) };
                check_keys(e, &["type", "function"], &format!("{at}."))?;
                match e.get("type") {
                    None => return Err(missing(format!("{at}.type"))),
                    Some(Value::String(t)) if t == "function" => {}
                    Some(_) => return Err(wrong(format!("{at}.type"), "'function'")),
                }
                let f = match e.get("function") {
                    None => return Err(missing(format!("{at}.function"))),
                    Some(Value::Object(f)) => f,
                    Some(_) => return Err(wrong(format!("{at}.function"), "a valid dictionary")),
                };
                let fp = format!("{at}.function.");
                check_keys(f, &["name", "description", "parameters", "strict"], &fp)?;
                match f.get("name") {
                    None => return Err(missing(format!("{fp}name"))),
                    Some(Value::String(_)) => {}
                    Some(_) => return Err(wrong(format!("{fp}name"), "a valid string")),
                }
                optional_kind(f, "description", &fp, Value::is_string, "a valid string")?;
                optional_kind(f, "parameters", &fp, Value::is_object, "a valid dictionary")?;
                optional_kind(f, "strict", &fp, Value::is_boolean, "a valid boolean")?;
            }
        }
        Some(_) => return Err(wrong(format!("{prefix}tools"), "a valid list")),
    }
    match obj.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if matches!(s.as_str(), "none" | "auto" | "required") => {}
        Some(Value::Object(c)) => {
            let at = format!("{prefix}tool_choice");
            check_keys(c, &["type", "function"], &format!("{at}."))?;
            if c.get("type").and_then(Value::as_str) != Some("function") {
                return Err(wrong(format!("{at}.type"), "'function'"));
            }
            let Some(f) = c.get("function").and_then(Value::as_object) else {
                return Err(wrong(format!("{at}.function"), "a valid dictionary"));
            };
            check_keys(f, &["name"], &format!("{at}.function."))?;
            if !f.get("name").is_some_and(Value::is_string) {
                return Err(wrong(format!("{at}.function.name"), "a valid string"));
            }
        }
        Some(_) => {
            return Err(wrong(
                format!("{prefix}tool_choice"),
                "'none', 'auto', 'required' or a named function",
            ))
        }
    }
    optional_kind(obj, "parallel_tool_calls", prefix, Value::is_boolean, "a valid boolean")
}

/// The shape of a history message's `tool_calls` (OpenAI's, as its clients send them back).
pub fn check_message_calls(message: &Map<String, Value>, i: usize) -> ApiResult<()> {
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(wrong(format!("messages.{i}.tool_calls"), "a valid list")),
    };
    for (j, call) in calls.iter().enumerate() {
        let at = format!("messages.{i}.tool_calls.{j}");
        let Some(c) = call.as_object() else { return Err(wrong(at, "a valid dictionary")) };
        check_keys(c, &["id", "type", "function", "index"], &format!("{at}."))?;
        optional_kind(c, "id", &format!("{at}."), Value::is_string, "a valid string")?;
        if c.get("type").is_some_and(|t| t.as_str() != Some("function")) {
            return Err(wrong(format!("{at}.type"), "'function'"));
        }
        optional_kind(c, "index", &format!("{at}."), Value::is_i64, "a valid integer")?;
        let f = match c.get("function") {
            None => return Err(missing(format!("{at}.function"))),
            Some(Value::Object(f)) => f,
            Some(_) => return Err(wrong(format!("{at}.function"), "a valid dictionary")),
        };
        let fp = format!("{at}.function.");
        check_keys(f, &["name", "arguments"], &fp)?;
        match f.get("name") {
            None => return Err(missing(format!("{fp}name"))),
            Some(Value::String(_)) => {}
            Some(_) => return Err(wrong(format!("{fp}name"), "a valid string")),
        }
        match f.get("arguments") {
            None => return Err(missing(format!("{fp}arguments"))),
            Some(Value::String(_) | Value::Object(_)) => {}
            Some(_) => return Err(wrong(format!("{fp}arguments"), "a valid string or dictionary")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(v: Value) -> Vec<FunctionTool> {
        parse_tools(Some(&v)).unwrap()
    }

    fn err<T: std::fmt::Debug>(r: ApiResult<T>) -> String {
        r.unwrap_err().param.unwrap()
    }

    #[test]
    fn tools_and_choices_are_checked_naming_the_field() {
        assert_eq!(err(parse_tools(Some(&json!([])))), "tools");
        assert_eq!(
            err(parse_tools(Some(&json!([{"type": "function", "function": {"name": "a b"}}])))),
            "tools.0.function.name"
        );
        let ping = json!({"type": "function", "function": {"name": "ping"}});
        assert_eq!(err(parse_tools(Some(&json!([ping, ping])))), "tools.1.function.name");
        let t = tools(json!([ping]));
        assert_eq!(t[0].parameters, no_parameters());
        assert_eq!(err(parse_tool_choice(Some(&json!("required")), &[])), "tool_choice");
        assert_eq!(
            err(parse_tool_choice(Some(&json!({"type": "function", "function": {"name": "x"}})), &t)),
            "tool_choice"
        );
        assert_eq!(parse_tool_choice(None, &t).unwrap().mode, ChoiceMode::Auto);
        assert_eq!(parse_tool_choice(None, &[]).unwrap().mode, ChoiceMode::None);
        let named =
            parse_tool_choice(Some(&json!({"type": "function", "function": {"name": "ping"}})), &t).unwrap();
        assert_eq!((named.mode, named.function.as_deref()), (ChoiceMode::Required, Some("ping")));
    }

    #[test]
    fn shapes_name_the_field() {
        let body = |v: Value| check_tool_shapes(v.as_object().unwrap(), "").unwrap_err().param.unwrap();
        assert_eq!(body(json!({"tools": [{"type": "function"}]})), "tools.0.function");
        assert_eq!(
            body(json!({"tools": [{"type": "function", "function": {"name": "a", "x": 1}}]})),
            "tools.0.function.x"
        );
        assert_eq!(body(json!({"tool_choice": "sometimes"})), "tool_choice");
        assert_eq!(body(json!({"parallel_tool_calls": "yes"})), "parallel_tool_calls");
        let m = json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}, "extra": 1}]});
        assert_eq!(
            check_message_calls(m.as_object().unwrap(), 0).unwrap_err().param.unwrap(),
            "messages.0.tool_calls.0.extra"
        );
    }

    #[test]
    fn call_schemas_rebase_references_and_lift_the_dialect() {
        let t = tools(json!([
            {"type": "function", "function": {"name": "a", "parameters": {"$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object", "properties": {"x": {"$ref": "#/$defs/x"}, "y": {"const": {"$ref": "#"}}},
                "$defs": {"x": {"type": "integer"}}}}},
            {"type": "function", "function": {"name": "b"}},
        ]));
        let refs: Vec<&FunctionTool> = t.iter().collect();
        let s = call_object_schema(&refs, "arguments");
        assert_eq!(s["$schema"], "http://json-schema.org/draft-07/schema#");
        let a = &s["anyOf"][0]["properties"]["arguments"];
        assert_eq!(a["properties"]["x"]["$ref"], "#/anyOf/0/properties/arguments/$defs/x");
        assert_eq!(a["properties"]["y"]["const"]["$ref"], "#");
        assert!(a.get("$schema").is_none());
        let keys: Vec<&String> = s["anyOf"][1].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["type", "properties", "required", "additionalProperties"]);
        let one = call_array_schema(&refs[1..], "arguments", false);
        assert_eq!(one["maxItems"], 1);
        assert_eq!(one["items"]["properties"]["name"]["const"], "b");
    }
}
