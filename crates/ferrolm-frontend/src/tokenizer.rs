//! Text to token ids (the `tokenizers` crate on the model's `tokenizer.json`) and chat
//! messages to a prompt (the model's chat template, rendered by minijinja as
//! transformers renders it with jinja2: trim_blocks, lstrip_blocks, `raise_exception`,
//! `tojson`, `strftime_now`, and Python's string methods).

use std::path::Path;

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value as JinjaValue};
use serde::{Deserialize, Serialize};

use crate::pretokenize::{FastPreTokenizer, SplitKind};

/// The `tokenizers` crate's tokenizer with the pre-tokenizer's split regex run by hand
/// where it is one of the common ones (`crate::pretokenize`).
type Hf = tokenizers::TokenizerImpl<
    tokenizers::ModelWrapper,
    tokenizers::NormalizerWrapper,
    FastPreTokenizer,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

pub struct Tokenizer {
    hf: Hf,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let hf = Hf::from_file(path).map_err(|e| format!("tokenizer.json could not be read: {e}"))?;
        Ok(Tokenizer { hf })
    }

    /// From the text of a `tokenizer.json` (what Python's `tokenizers.Tokenizer.to_str()`
    /// gives, for a tokenizer that was not read from a file).
    pub fn from_json(text: &str) -> Result<Self, String> {
        let hf: Hf =
            serde_json::from_str(text).map_err(|e| format!("tokenizer.json could not be read: {e}"))?;
        Ok(Tokenizer { hf })
    }

    /// Whether the pre-tokenizer's split regex runs by hand (else as the crate runs it).
    pub fn fast_pre_tokenizer(&self) -> bool {
        self.hf.get_pre_tokenizer().is_some_and(FastPreTokenizer::is_fast)
    }

    /// Token ids; `add_special_tokens` applies the tokenizer's template (e.g. a leading
    /// BOS); text rendered from a chat template already has its own.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, String> {
        let byte_level = self.hf.get_pre_tokenizer().and_then(FastPreTokenizer::byte_level_only);
        let enc = match byte_level {
            Some((kind, prefix)) => self.encode_byte_level(text, kind, prefix, add_special_tokens),
            None => self.hf.encode_fast(text, add_special_tokens),
        };
        Ok(enc.map_err(|e| format!("tokenizing failed: {e}"))?.get_ids().to_vec())
    }

    /// `encode_fast` for a byte-level BPE whose pre-tokenizer is a recognized split: the
    /// same steps (added tokens and the normalizer, the split, the byte mapping, the model,
    /// the post-processor) without the crate's per-byte alignment bookkeeping, which only
    /// offsets need.
    fn encode_byte_level(
        &self,
        text: &str,
        kind: SplitKind,
        add_prefix_space: bool,
        add_special_tokens: bool,
    ) -> tokenizers::Result<tokenizers::Encoding> {
        use tokenizers::{Model, OffsetReferential, OffsetType};
        let segments = self.hf.get_added_vocabulary().extract_and_normalize(self.hf.get_normalizer(), text);
        let model = self.hf.get_model();
        let mut tokens = Vec::new();
        let mut failed = None;
        for (segment, _, added) in segments.get_splits(OffsetReferential::Original, OffsetType::None) {
            if let Some(added) = added {
                tokens.extend(added.iter().cloned());
                continue;
            }
            crate::pretokenize::byte_level_pieces(kind, add_prefix_space, segment, |piece| {
                if failed.is_none() {
                    match model.tokenize(piece) {
                        Ok(t) => tokens.extend(t),
                        Err(e) => failed = Some(e),
                    }
                }
            });
        }
        if let Some(e) = failed {
            return Err(e);
        }
        self.hf.post_process(tokenizers::Encoding::from_tokens(tokens, 0), None, add_special_tokens)
    }

    /// The text of token ids, special tokens kept.
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.hf.decode(ids, false).map_err(|e| format!("decoding failed: {e}"))
    }
}

/// One chat message as the template sees it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Message {
    pub role: String,
    /// Absent or null: empty, as an assistant turn with only calls has it.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant's calls as templates take them (`arguments` a mapping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Python's str methods (.strip(), .startswith()...) as jinja2 has them
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<JinjaValue, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, format!("chat template: {message}")))
        });
        env.add_function("strftime_now", |format: String| -> String { strftime_now(&format) });
        // transformers' tojson: no HTML escaping, non-ASCII kept, optional indent
        env.add_filter(
            "tojson",
            |value: JinjaValue, indent: Option<usize>, kwargs: Kwargs| -> Result<String, Error> {
                let named: Option<usize> = kwargs.get("indent")?;
                kwargs.assert_all_used()?;
                to_json(&value, named.or(indent))
            },
        );
        env.add_template_owned("chat".to_string(), source.to_string())
            .map_err(|e| format!("the chat template does not compile: {e}"))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.unwrap_or("").to_string(),
            eos_token: eos_token.unwrap_or("").to_string(),
        })
    }

    /// The template's text (the tool-call and reasoning formats are read from it).
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, String> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// As `render`, with more variables: the request's `tools` (OpenAI's form; undefined
    /// without them, as transformers leaves it) and `chat_template_kwargs`.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        variables: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, String> {
        let template = self.env.get_template("chat").expect("added at construction");
        let base = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        // a variable given as null stays undefined, as transformers leaves `tools=None`
        let defined: std::borrow::Cow<'_, serde_json::Map<String, serde_json::Value>> =
            if variables.values().any(serde_json::Value::is_null) {
                let kept = variables.iter().filter(|(_, v)| !v.is_null());
                std::borrow::Cow::Owned(kept.map(|(k, v)| (k.clone(), v.clone())).collect())
            } else {
                std::borrow::Cow::Borrowed(variables)
            };
        let ctx = if defined.is_empty() {
            base
        } else {
            minijinja::context! { ..base, ..JinjaValue::from_serialize(&*defined) }
        };
        template.render(ctx).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation if e.detail().is_some_and(|d| d.starts_with("chat template:")) => {
                e.detail().unwrap_or_default().to_string()
            }
            _ => format!("chat template failed: {e}"),
        })
    }
}

fn to_json(value: &JinjaValue, indent: Option<usize>) -> Result<String, Error> {
    let v: serde_json::Value = serde_json::to_value(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(match indent {
        None => python_json(&v),
        Some(n) => {
            let mut out = Vec::new();
            let indent = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            v.serialize(&mut ser).expect("a JSON value serializes");
            String::from_utf8(out).expect("JSON is UTF-8")
        }
    })
}

/// `json.dumps(value, ensure_ascii=False)`: ", " and ": " separators, as Python writes.
pub(crate) fn python_json(v: &serde_json::Value) -> String {
    use serde_json::Value as V;
    match v {
        V::Array(items) => format!("[{}]", items.iter().map(python_json).collect::<Vec<_>>().join(", ")),
        V::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{}: {}", serde_json::to_string(k).expect("a key"), python_json(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => serde_json::to_string(other).expect("a scalar"),
    }
}

/// The local date by a strftime format, for templates that print today's date. Only the
/// directives such templates use (`%d %b %Y`, `%Y-%m-%d`, `%B`...), in UTC.
fn strftime_now(format: &str) -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let (y, m, d) = civil_from_days(days);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('B') => out.push_str(MONTHS[(m - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// (year, month, day) of days since 1970-01-01 (Howard Hinnant's civil calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    fn msg(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            name: None,
            tool_call_id: None,
            reasoning_content: None,
            tool_calls: None,
        }
    }

    #[test]
    fn renders_the_tiny_template() {
        let t = ChatTemplate::new(TINY, Some("<s>"), Some("</s>")).unwrap();
        let out = t.render(&[msg("user", "Hi")], true).unwrap();
        assert_eq!(out, "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn raise_exception_is_an_error_naming_the_template() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", None, None).unwrap();
        assert_eq!(t.render(&[], true).unwrap_err(), "chat template: no system role");
    }

    #[test]
    fn python_string_methods_and_tojson() {
        let t = ChatTemplate::new(
            "{{ messages[0].content.strip() }}|{{ messages[0] | tojson }}|{{ ' x '.startswith(' ') }}",
            None,
            None,
        )
        .unwrap();
        let out = t.render(&[msg("user", "  é ")], false).unwrap();
        // Python's spelling of a boolean, as jinja2 prints it
        assert_eq!(out, "é|{\"role\": \"user\", \"content\": \"  é \"}|True");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
