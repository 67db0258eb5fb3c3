//! The grammar as parsed: definitions whose bodies are expression trees, built through
//! constructors that keep them simplified (no nested sequences or alternations, no
//! empty parts, no alternatives that can never match).

use std::fmt::{self, Write};

/// A place in the grammar text, 1-based; the column counts characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Node {
    /// The empty string (`""`, `()`, an empty alternative).
    Empty,
    /// No string at all (what is left of a rule that can never finish).
    Never,
    /// A non-empty literal.
    Text(String),
    /// One character in (or, negated, not in) the ranges; `.` is an empty negated class.
    Class {
        ranges: Vec<(char, char)>,
        negated: bool,
    },
    /// A rule of the grammar, by definition index.
    Ref(usize),
    /// A rule of the compiled grammar, by rule number (after planning, `plan.rs`).
    Call(usize),
    Seq(Vec<Node>),
    Alt(Vec<Node>),
    /// `min` to `max` (unbounded: `None`) repetitions.
    Repeat(Box<Node>, u32, Option<u32>),
}

/// One `name ::= body` of the grammar.
#[derive(Debug, Clone)]
pub(crate) struct Def {
    pub name: String,
    pub pos: Pos,
    pub body: Node,
}

pub(crate) fn seq(items: Vec<Node>) -> Node {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Node::Never => return Node::Never,
            Node::Empty => {}
            Node::Seq(inner) => out.extend(inner),
            other => out.push(other),
        }
    }
    match out.len() {
        0 => Node::Empty,
        1 => out.pop().unwrap(),
        _ => Node::Seq(out),
    }
}

pub(crate) fn alt(items: Vec<Node>) -> Node {
    let mut out: Vec<Node> = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Node::Never => {}
            Node::Alt(inner) => out.extend(inner),
            other => out.push(other),
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut unique = Vec::with_capacity(out.len());
    for item in out {
        if seen.insert(item.clone()) {
            unique.push(item);
        }
    }
    match unique.len() {
        0 => Node::Never,
        1 => unique.pop().unwrap(),
        _ => Node::Alt(unique),
    }
}

pub(crate) fn repeat(item: Node, min: u32, max: Option<u32>) -> Node {
    match (item, min, max) {
        (_, 0, Some(0)) | (Node::Empty, _, _) => Node::Empty,
        (Node::Never, 0, _) => Node::Empty,
        (Node::Never, _, _) => Node::Never,
        (item, 1, Some(1)) => item,
        (item, min, max) => Node::Repeat(Box::new(item), min, max),
    }
}

pub(crate) fn optional(item: Node) -> Node {
    repeat(item, 0, Some(1))
}

impl Node {
    /// Whether the empty string matches, given which definitions can be empty. Calls are
    /// to rules that never match the empty string.
    pub fn nullable(&self, defs_nullable: &[bool]) -> bool {
        match self {
            Node::Empty => true,
            Node::Never | Node::Text(_) | Node::Class { .. } | Node::Call(_) => false,
            Node::Ref(d) => defs_nullable[*d],
            Node::Seq(items) => items.iter().all(|i| i.nullable(defs_nullable)),
            Node::Alt(items) => items.iter().any(|i| i.nullable(defs_nullable)),
            Node::Repeat(item, min, _) => *min == 0 || item.nullable(defs_nullable),
        }
    }

    /// Calls `visit` on every `Ref` in the tree.
    pub fn for_each_ref(&self, visit: &mut impl FnMut(usize)) {
        match self {
            Node::Ref(d) => visit(*d),
            Node::Seq(items) | Node::Alt(items) => items.iter().for_each(|i| i.for_each_ref(visit)),
            Node::Repeat(item, _, _) => item.for_each_ref(visit),
            _ => {}
        }
    }

    /// The tree with each `Ref(d)` replaced by `with(d)` (left as is where it gives `None`).
    pub fn substitute(&self, with: &impl Fn(usize) -> Option<Node>) -> Node {
        match self {
            Node::Ref(d) => with(*d).unwrap_or(Node::Ref(*d)),
            Node::Seq(items) => seq(items.iter().map(|i| i.substitute(with)).collect()),
            Node::Alt(items) => alt(items.iter().map(|i| i.substitute(with)).collect()),
            Node::Repeat(item, min, max) => repeat(item.substitute(with), *min, *max),
            other => other.clone(),
        }
    }

    /// Written back in GBNF (for error messages), with `names` for `Ref`s and `Call`s.
    pub fn display<'a>(&'a self, names: &'a dyn Fn(&Node) -> String) -> Display<'a> {
        Display { node: self, names }
    }
}

pub(crate) struct Display<'a> {
    node: &'a Node,
    names: &'a dyn Fn(&Node) -> String,
}

impl fmt::Display for Display<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        write_gbnf(self.node, self.names, &mut out);
        f.write_str(&out)
    }
}

fn write_gbnf(node: &Node, names: &dyn Fn(&Node) -> String, out: &mut String) {
    let grouped = |node: &Node, out: &mut String| {
        if matches!(node, Node::Seq(_) | Node::Alt(_)) {
            out.push('(');
            write_gbnf(node, names, out);
            out.push(')');
        } else {
            write_gbnf(node, names, out);
        }
    };
    match node {
        Node::Empty => out.push_str("\"\""),
        Node::Never => out.push_str("[]"),
        Node::Text(text) => {
            out.push('"');
            for c in text.chars() {
                push_escaped(c, '"', out);
            }
            out.push('"');
        }
        Node::Class { ranges, negated } if ranges.is_empty() && *negated => out.push('.'),
        Node::Class { ranges, negated } => {
            out.push('[');
            if *negated {
                out.push('^');
            }
            for &(lo, hi) in ranges {
                push_escaped(lo, ']', out);
                if hi != lo {
                    out.push('-');
                    push_escaped(hi, ']', out);
                }
            }
            out.push(']');
        }
        Node::Ref(_) | Node::Call(_) => out.push_str(&names(node)),
        Node::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                if matches!(item, Node::Alt(_)) {
                    grouped(item, out);
                } else {
                    write_gbnf(item, names, out);
                }
            }
        }
        Node::Alt(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" | ");
                }
                write_gbnf(item, names, out);
            }
        }
        Node::Repeat(item, min, max) => {
            grouped(item, out);
            match (min, max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (min, None) => {
                    let _ = write!(out, "{{{min},}}");
                }
                (min, Some(max)) if min == max => {
                    let _ = write!(out, "{{{min}}}");
                }
                (min, Some(max)) => {
                    let _ = write!(out, "{{{min},{max}}}");
                }
            }
        }
    }
}

fn push_escaped(c: char, quote: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        '\\' => out.push_str("\\\\"),
        c if c == quote || (quote == ']' && matches!(c, '[' | '^' | '-')) => {
            out.push('\\');
            out.push(c);
        }
        c if (c as u32) < 0x20 || c as u32 == 0x7F => {
            let _ = write!(out, "\\x{:02X}", c as u32);
        }
        c => out.push(c),
    }
}
