//! Chat messages as Hugging Face chat templates expect them:
//! an assistant's `tool_calls` with their `arguments` as a mapping (OpenAI sends them as
//! JSON text), `tool` messages with their `tool_call_id`.

use serde_json::{Map, Value};

use crate::errors::{ApiError, ApiResult};

/// A history message's calls (their shape already checked) for the template; a 400 naming
/// `messages.i.tool_calls.j.function.arguments` for arguments that are not JSON.
pub fn template_calls(calls: &[Value], i: usize) -> ApiResult<Vec<Value>> {
    let mut out = Vec::with_capacity(calls.len());
    for (j, call) in calls.iter().enumerate() {
        let function = call.get("function").cloned().unwrap_or(Value::Null);
        let arguments = match function.get("arguments") {
            Some(Value::String(text)) if text.trim().is_empty() => Value::Object(Map::new()),
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|_| {
                let field = format!("messages.{i}.tool_calls.{j}.function.arguments");
                let shown: String = text.chars().take(60).collect();
                ApiError::bad_request(format!("{field}: not JSON: {shown:?}"), field)
            })?,
            Some(other) => other.clone(),
            None => Value::Null,
        };
        let mut f = Map::new();
        f.insert("name".into(), function.get("name").cloned().unwrap_or(Value::Null));
        f.insert("arguments".into(), arguments);
        let mut c = Map::new();
        c.insert("type".into(), "function".into());
        c.insert("function".into(), Value::Object(f));
        if let Some(id) = call.get("id").filter(|v| !v.is_null()) {
            c.insert("id".into(), id.clone());
        }
        out.push(Value::Object(c));
    }
    Ok(out)
}
