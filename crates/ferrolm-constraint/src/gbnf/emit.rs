//! A rule's body as the regex the DFA compiler reads: characters as Unicode scalar
//! values (UTF-8 in the DFA), calls as the byte spelling of `recursive.rs`.

use std::fmt::Write;

use super::ast::Node;
use crate::budget::MAX_REGEX_BYTES;
use crate::error::{ConstraintError, Result};
use crate::recursive::call;

pub(crate) fn regex(body: &Node) -> Result<String> {
    let mut out = String::new();
    write(body, &mut out)?;
    crate::budget::charge(out.len(), "the grammar's regex text")?;
    Ok(out)
}

fn write(node: &Node, out: &mut String) -> Result<()> {
    match node {
        Node::Empty => out.push_str("(?:)"),
        // An empty class: matches nothing (simplification leaves it only where the
        // whole rule matches nothing, which the DFA compiler reports).
        Node::Never => out.push_str(r"[^\x{0}-\x{10FFFF}]"),
        Node::Text(text) => text.chars().for_each(|c| push_char(c, out)),
        Node::Class { ranges, negated } if ranges.is_empty() => {
            debug_assert!(*negated, "the parser refuses `[]`");
            out.push_str("(?s:.)");
        }
        Node::Class { ranges, negated } => {
            out.push('[');
            if *negated {
                out.push('^');
            }
            for &(lo, hi) in ranges {
                let _ = write!(out, r"\x{{{:X}}}", lo as u32);
                if hi != lo {
                    let _ = write!(out, r"-\x{{{:X}}}", hi as u32);
                }
            }
            out.push(']');
        }
        Node::Call(k) => out.push_str(&call(*k)),
        Node::Ref(_) => unreachable!("references are inlined before emission"),
        Node::Seq(items) => {
            for item in items {
                if matches!(item, Node::Alt(_)) {
                    out.push_str("(?:");
                    write(item, out)?;
                    out.push(')');
                } else {
                    write(item, out)?;
                }
            }
        }
        Node::Alt(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push('|');
                }
                write(item, out)?;
            }
        }
        Node::Repeat(item, min, max) => {
            let atomic = match &**item {
                Node::Class { .. } | Node::Call(_) => true,
                Node::Text(text) => text.chars().count() == 1,
                _ => false,
            };
            if atomic {
                write(item, out)?;
            } else {
                out.push_str("(?:");
                write(item, out)?;
                out.push(')');
            }
            let _ = match (min, max) {
                (0, None) => write!(out, "*"),
                (1, None) => write!(out, "+"),
                (0, Some(1)) => write!(out, "?"),
                (min, None) => write!(out, "{{{min},}}"),
                (min, Some(max)) if min == max => write!(out, "{{{min}}}"),
                (min, Some(max)) => write!(out, "{{{min},{max}}}"),
            };
        }
    }
    if out.len() > MAX_REGEX_BYTES {
        return Err(ConstraintError::GrammarTooLarge {
            message: format!(
                "with its rules inlined, a rule of the grammar is over {} KiB of regex",
                MAX_REGEX_BYTES >> 10
            ),
        });
    }
    Ok(())
}

fn push_char(c: char, out: &mut String) {
    if c.is_ascii_alphanumeric() || c == ' ' || (!c.is_ascii() && !c.is_control()) {
        out.push(c);
    } else {
        let _ = write!(out, r"\x{{{:X}}}", c as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gbnf::ast::{alt, repeat, seq};

    #[test]
    fn regex_text() {
        let text = |s: &str| Node::Text(s.into());
        let node = seq(vec![
            text("a.b"),
            alt(vec![text("x"), text("yz")]),
            repeat(text("ab"), 0, None),
            repeat(Node::Class { ranges: vec![('0', '9')], negated: false }, 2, Some(5)),
            Node::Class { ranges: vec![('"', '"')], negated: true },
            Node::Class { ranges: vec![], negated: true },
            text("é\n"),
        ]);
        assert_eq!(
            regex(&node).unwrap(),
            r"a\x{2E}b(?:x|yz)(?:ab)*[\x{30}-\x{39}]{2,5}[^\x{22}](?s:.)é\x{A}"
        );
        let pattern = regex(&node).unwrap();
        let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        assert!(re.is_match("a.byzabab123x中é\n"));
        assert!(!re.is_match("axbyz123x中é\n"));
    }
}
