//! One tool call written as a JSON object, `{"name": "f", "arguments": {...}}`, read as it
//! is generated. Once the name and then the arguments key
//! have come the call is announced and its arguments stream as the raw text the model
//! writes; an object that starts otherwise is kept until it is complete and then read
//! whole: a call if it has a name and arguments, else content.

use serde_json::Value;

use super::output::Sink;

fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Header,
    Arguments,
    Tail,
    Whole,
}

/// Just enough of JSON's lexing to follow nesting: strings (with escapes) and brackets.
#[derive(Debug, Default, Clone)]
struct Lexer {
    depth: i64,
    in_string: bool,
    escape: bool,
}

impl Lexer {
    fn step(&mut self, c: char) {
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if c == '\\' {
                self.escape = true;
            } else if c == '"' {
                self.in_string = false;
            }
        } else if c == '"' {
            self.in_string = true;
        } else if c == '{' || c == '[' {
            self.depth += 1;
        } else if c == '}' || c == ']' {
            self.depth -= 1;
        }
    }
}

#[derive(Debug)]
pub struct CallScanner {
    keys: &'static [&'static str],
    raw: String,
    mode: Mode,
    index: Option<usize>,
    announced: bool,
    pub complete: bool,
    closed: bool,
    object: Lexer,
    started: bool,
    args: Lexer,
    args_start: usize,
    args_scanned: usize,
    args_end: Option<usize>,
    sent: usize,
}

impl CallScanner {
    pub fn new(keys: &'static [&'static str]) -> Self {
        CallScanner {
            keys,
            raw: String::new(),
            mode: Mode::Header,
            index: None,
            announced: false,
            complete: false,
            closed: false,
            object: Lexer::default(),
            started: false,
            args: Lexer::default(),
            args_start: 0,
            args_scanned: 0,
            args_end: None,
            sent: 0,
        }
    }

    /// Takes the object's text; returns how many bytes it took (it stops once the object
    /// is complete).
    pub fn feed(&mut self, sink: &mut Sink, text: &str) -> usize {
        if self.complete || self.closed {
            return 0;
        }
        let mut taken = text.len();
        for (i, c) in text.char_indices() {
            if !self.started {
                if is_ws(c) {
                    continue;
                }
                self.started = true;
                if c != '{' {
                    self.mode = Mode::Whole;
                }
            }
            self.object.step(c);
            if self.mode != Mode::Whole && self.object.depth == 0 && !self.object.in_string {
                taken = i + c.len_utf8();
                self.complete = true;
                break;
            }
        }
        self.raw.push_str(&text[..taken]);
        if self.mode == Mode::Header {
            self.try_header(sink);
        }
        if self.mode == Mode::Arguments {
            self.scan_arguments(sink);
        }
        if self.complete {
            self.settle(sink);
        }
        taken
    }

    /// The call's text has ended (its closing tag came, or the output ended).
    pub fn close(&mut self, sink: &mut Sink) {
        if !self.closed {
            self.settle(sink);
        }
    }

    fn try_header(&mut self, sink: &mut Sink) {
        match match_header(&self.raw, self.keys) {
            Header::More => {}
            Header::No => self.mode = Mode::Whole,
            Header::Found(name, start) => {
                self.index = sink.start_call(&name);
                self.announced = true;
                self.mode = Mode::Arguments;
                self.args_start = start;
                self.args_scanned = start;
                self.sent = start;
            }
        }
    }

    fn scan_arguments(&mut self, sink: &mut Sink) {
        let first = self.raw[self.args_start..].chars().next().expect("a value's first character");
        for (off, c) in self.raw[self.args_scanned..].char_indices() {
            let j = self.args_scanned + off;
            if !matches!(first, '{' | '[' | '"') {
                if c == ',' || c == '}' || is_ws(c) {
                    self.args_end = Some(j);
                    break;
                }
                continue;
            }
            let was_in_string = self.args.in_string;
            self.args.step(c);
            if (first == '"' && was_in_string && !self.args.in_string)
                || (matches!(first, '{' | '[') && self.args.depth == 0 && !self.args.in_string)
            {
                self.args_end = Some(j + c.len_utf8());
                break;
            }
        }
        self.args_scanned = self.raw.len();
        let end = self.args_end.unwrap_or(self.raw.len());
        if end > self.sent {
            sink.arguments(self.index, &self.raw[self.sent..end]);
            self.sent = end;
        }
        if self.args_end.is_some() {
            self.mode = Mode::Tail;
        }
    }

    fn settle(&mut self, sink: &mut Sink) {
        self.closed = true;
        if self.announced || self.raw.trim_matches(is_ws).is_empty() {
            return;
        }
        match read_call(&self.raw, self.keys) {
            None => sink.content(&self.raw),
            Some((name, arguments)) => {
                let index = sink.start_call(&name);
                sink.arguments(index, &arguments);
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Header {
    /// The name, and where the arguments value starts.
    Found(String, usize),
    More,
    No,
}

/// Whether `raw` begins `{"name": "<name>", "<key>": <value...>`.
pub fn match_header(raw: &str, keys: &[&str]) -> Header {
    let b = raw.as_bytes();
    let n = b.len();
    let ws = |mut p: usize| {
        while p < n && matches!(b[p], b' ' | b'\t' | b'\n' | b'\r') {
            p += 1;
        }
        p
    };
    // Ok(end) if `lit` is at p; Err(More) if raw ends in a prefix of it; Err(No) otherwise
    let literal = |p: usize, lit: &str| -> Result<usize, Header> {
        let rest = &b[p..(p + lit.len()).min(n)];
        if rest == lit.as_bytes() {
            Ok(p + lit.len())
        } else if lit.as_bytes().starts_with(rest) {
            Err(Header::More)
        } else {
            Err(Header::No)
        }
    };
    let mut pos = 0;
    for step in ["{", "\"name\"", ":"] {
        pos = ws(pos);
        match literal(pos, step) {
            Ok(p) => pos = p,
            Err(h) => return h,
        }
    }
    pos = ws(pos);
    if pos == n {
        return Header::More;
    }
    if b[pos] != b'"' {
        return Header::No;
    }
    let mut j = pos + 1;
    let mut escape = false;
    while j < n {
        let c = b[j];
        if escape {
            escape = false;
        } else if c == b'\\' {
            escape = true;
        } else if c == b'"' {
            break;
        }
        j += 1;
    }
    if j >= n {
        return Header::More;
    }
    let Ok(name) = serde_json::from_str::<String>(&raw[pos..j + 1]) else { return Header::No };
    pos = ws(j + 1);
    match literal(pos, ",") {
        Ok(p) => pos = ws(p),
        Err(h) => return h,
    }
    let mut any_more = false;
    let mut end = None;
    for key in keys {
        match literal(pos, &format!("\"{key}\"")) {
            Ok(p) => {
                end = Some(p);
                break;
            }
            Err(Header::More) => any_more = true,
            Err(_) => {}
        }
    }
    let Some(p) = end else { return if any_more { Header::More } else { Header::No } };
    pos = ws(p);
    match literal(pos, ":") {
        Ok(p) => pos = ws(p),
        Err(h) => return h,
    }
    if pos == n {
        return Header::More;
    }
    Header::Found(name, pos)
}

/// A whole call object's name and arguments (as JSON text), or `None` if it is not one.
pub fn read_call(text: &str, keys: &[&str]) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(text.trim_matches(is_ws)).ok()?;
    let obj = value.as_object()?;
    let name = obj.get("name")?.as_str()?;
    for key in keys {
        if let Some(arguments) = obj.get(*key) {
            // some models write the arguments as a JSON string: kept as the text it is
            return Some(match arguments {
                Value::String(s) => (name.to_string(), s.clone()),
                other => (name.to_string(), crate::tokenizer::python_json(other)),
            });
        }
    }
    None
}
