//! Grammars in GBNF, llama.cpp's notation (also the EBNF that xgrammar, and so SGLang
//! and vLLM, read): `name ::= ...` rules, `root` the whole output.
//!
//! Supported:
//! - rules `name ::= body`, names of letters, digits, `-` and `_`; a rule runs until the
//!   next `name ::=`, so bodies may span lines; `#` comments; `root` is the start;
//! - sequences, alternatives `|`, groups `( )` (`()` is the empty string), string
//!   literals `"..."` (`""` is the empty string), character classes `[a-z0-9_]`,
//!   negated classes `[^"\\]`, `[^]` and `.` for any character;
//! - repetition `*` `+` `?` `{m}` `{m,}` `{m,n}` (counts up to 100000);
//! - escapes in strings and classes: `\n \r \t \\ \" \[ \] \-` and xgrammar's
//!   `\b \f \v \a \e \0 \' \/ \?` (and `\` before any of `^ $ . * + ( ) { } |`), `\xHH`
//!   (exactly two digits, as in llama.cpp), `\uHHHH`, `\UHHHHHHHH`. Characters are
//!   Unicode scalar values: `\xE9` is `é`, not the byte 0xE9.
//!
//! Refused with a message that names them: llama.cpp's token matches (`<think>`,
//! `<[id]>`, `!<...>`), xgrammar's macros (`Regex(...)`, `TagDispatch(...)`, ...), rule
//! options (`name[max_tokens=..]`) and lookahead assertions (`(= ...)`), Lark's
//! `name: ...`, ISO EBNF's `name = ...;`, single-quoted strings. Errors carry the line
//! and the column ([`ConstraintError::InvalidGrammar`]): syntax, an undefined rule, a
//! rule defined twice, no `root`, a `root` that matches no finite text.
//!
//! How it runs: everything that is not recursive is inlined into regexes; recursion
//! becomes rules that call each other (`plan.rs`), such as one per bracketed segment
//! (`"[" ... "]"`). Left recursion within a rule (`expr ::= expr "+" term | term`) and
//! recursion at the end of a rule (`list ::= item "," list | item`) are rewritten as
//! loops (`rewrite.rs`). The engine decides at each character without looking further
//! ahead where a rule is called or returns, so a grammar must make that choice from one
//! character at the rule boundaries (inside a rule anything goes: its DFA keeps all
//! alternatives open). A grammar that does not is refused
//! ([`ConstraintError::UnsupportedGrammar`], naming the rule, a text that leads there
//! and the character), never run inexactly; left recursion through several rules too.

mod ast;
pub(crate) mod check;
mod emit;
mod parse;
mod plan;
mod rewrite;

use std::sync::Arc;

use ast::Node;
use check::{example_prefix, find_conflict, show_byte, Conflict, ConflictKind};
use plan::{Forbidden, NoPlan, Plan, RuleKind};

use crate::dfa::{ByteDfa, RegexOptions};
use crate::error::{ConstraintError, Result};
use crate::grammar::Grammar;
use crate::recursive::Rules;
use crate::vocab::Vocabulary;

/// Plans tried after one the engine cannot run (each without the rule at fault).
const MAX_PLANS: usize = 16;

/// Compiles a GBNF grammar (see the module's documentation). Runs in the caller's
/// budget scope.
pub(crate) fn compile(vocab: Arc<Vocabulary>, text: &str) -> Result<Arc<Grammar>> {
    let parse::Parsed { mut defs, root } = parse::parse(text)?;
    let nullable = rewrite::nullable(&defs);
    for (d, def) in defs.iter_mut().enumerate() {
        let body = std::mem::replace(&mut def.body, Node::Empty);
        def.body = rewrite::without_self_recursion(&Node::Ref(d), &nullable, body);
    }
    rewrite::without_unproductive(&mut defs);
    let no_finite_text = || ConstraintError::InvalidGrammar {
        line: defs[root].pos.line,
        column: defs[root].pos.column,
        message: "`root` matches no finite text: every way through it recurses without end".into(),
    };
    if defs[root].body == Node::Never {
        return Err(no_finite_text());
    }
    // Removing what cannot finish keeps every language, and so which are empty.
    debug_assert_eq!(nullable, rewrite::nullable(&defs));
    let mut forbidden = Forbidden::default();
    let mut first_refusal: Option<ConstraintError> = None;
    for _ in 0..MAX_PLANS {
        crate::budget::check()?;
        let plan = match plan::plan(&defs, root, &nullable, &forbidden) {
            Ok(plan) => plan?,
            Err(NoPlan) => break,
        };
        let names = RuleNames { plan: &plan, defs: &defs };
        check_left_recursion(&plan, &names)?;
        let regexes = plan.rules.iter().map(|rule| emit::regex(&rule.body)).collect::<Result<Vec<_>>>()?;
        if let [pattern] = &regexes[..] {
            return Grammar::from_regex(vocab, pattern).map_err(|e| dfa_error(e, &no_finite_text));
        }
        let options = RegexOptions::default();
        let dfas = regexes
            .iter()
            .map(|pattern| ByteDfa::from_regex_with_calls(pattern, &options))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| dfa_error(e, &no_finite_text))?;
        let rules = Rules::new_unchecked(dfas).map_err(|e| dfa_error(e, &no_finite_text))?;
        let Some(conflict) = find_conflict(&rules)? else {
            let rules = rules.checked().map_err(|e| dfa_error(e, &no_finite_text))?;
            return Ok(Arc::new(Grammar::from_rules(vocab, rules)));
        };
        first_refusal.get_or_insert_with(|| describe(&conflict, &rules, &names));
        let progress = match &plan.rules[conflict.blamed_rule() as usize].kind {
            RuleKind::Main => false,
            RuleKind::Segment { sites, .. } => {
                sites.iter().fold(false, |any, site| forbidden.segments.insert(site.clone()) | any)
            }
            RuleKind::Def(d) => forbidden.defs.insert(*d),
        };
        if !progress {
            break;
        }
    }
    Err(first_refusal.unwrap_or_else(|| ConstraintError::UnsupportedGrammar {
        rule: defs[root].name.clone(),
        message: "no way was found to split the grammar's recursion into rules the engine runs exactly"
            .into(),
    }))
}

/// Errors of the DFA and rule compilers, said of a grammar.
fn dfa_error(error: ConstraintError, no_finite_text: &dyn Fn() -> ConstraintError) -> ConstraintError {
    match error {
        ConstraintError::InvalidRegex { message, .. } if message == crate::dfa::MATCHES_NOTHING => {
            no_finite_text()
        }
        ConstraintError::InvalidSchema { message, .. } if message.starts_with("no finite document") => {
            no_finite_text()
        }
        ConstraintError::InvalidRegex { message, .. } if message.contains("nested") => {
            ConstraintError::GrammarTooLarge {
                message:
                    "with its rules inlined, the grammar nests groups deeper than the regex parser's limit"
                        .into(),
            }
        }
        // Only our own translation writes these: a bug, not the user's grammar.
        ConstraintError::InvalidRegex { message, .. }
        | ConstraintError::UnsupportedSchema { keyword: message, .. } => {
            ConstraintError::Internal { message: format!("grammar translation: {message}") }
        }
        other => other,
    }
}

/// Names of the compiled rules, as the grammar's author knows them.
struct RuleNames<'a> {
    plan: &'a Plan,
    defs: &'a [ast::Def],
}

impl RuleNames<'_> {
    fn name(&self, rule: usize) -> String {
        match &self.plan.rules[rule].kind {
            RuleKind::Main => "root".into(),
            RuleKind::Def(d) => format!("`{}`", self.defs[*d].name),
            RuleKind::Segment { sites, body } => {
                let names = |node: &Node| match node {
                    Node::Ref(d) => self.defs[*d].name.clone(),
                    _ => "(...)".into(),
                };
                let mut text = body.display(&names).to_string();
                if text.chars().count() > 60 {
                    text = text.chars().take(57).collect::<String>() + "...";
                }
                format!("`{text}` in `{}`", self.defs[sites[0].def].name)
            }
        }
    }

    /// The grammar rule at fault: the definition itself, or the one a segment is in.
    fn def_name(&self, rule: usize) -> String {
        match &self.plan.rules[rule].kind {
            RuleKind::Main => "root".into(),
            RuleKind::Def(d) => self.defs[*d].name.clone(),
            RuleKind::Segment { sites, .. } => self.defs[sites[0].def].name.clone(),
        }
    }
}

/// Left recursion that rewriting could not take out (through several rules): refused.
fn check_left_recursion(plan: &Plan, names: &RuleNames) -> Result<()> {
    let starts: Vec<Vec<usize>> = plan
        .rules
        .iter()
        .map(|rule| {
            let mut out = Vec::new();
            plan::first_calls(&rule.body, &mut out);
            out
        })
        .collect();
    for from in 0..starts.len() {
        // A path from `from` back to itself through calls at rule starts.
        let mut parent = vec![usize::MAX; starts.len()];
        let mut stack = vec![from];
        while let Some(k) = stack.pop() {
            for &next in &starts[k] {
                if next == from {
                    let mut cycle = vec![names.name(from)];
                    let mut at = k;
                    while at != from {
                        cycle.push(names.name(at));
                        at = parent[at];
                    }
                    cycle.push(names.name(from));
                    let last = cycle.len() - 1;
                    cycle[1..last].reverse();
                    let how = if cycle.len() == 2 {
                        format!("{} can begin with itself", cycle[0])
                    } else {
                        cycle.join(" can begin with ")
                    };
                    return Err(ConstraintError::UnsupportedGrammar {
                        rule: names.def_name(from),
                        message: format!(
                            "left recursion ({how}) is supported only in the form `a ::= a x | a y | z` (which \
                             becomes `z (x | y)*`): write it that way, or as a repetition"
                        ),
                    });
                }
                if parent[next] == usize::MAX && next != from {
                    parent[next] = k;
                    stack.push(next);
                }
            }
        }
    }
    Ok(())
}

fn describe(conflict: &Conflict, rules: &Rules, names: &RuleNames) -> ConstraintError {
    let name = |k: u32| names.name(k as usize);
    let prefix = example_prefix(rules, conflict.rule, conflict.state, &|k| names.def_name(k as usize));
    let place = if prefix.is_empty() {
        format!("at the start of {}", name(conflict.rule))
    } else {
        format!("after `{prefix}` in {}", name(conflict.rule))
    };
    let byte = show_byte(conflict.byte);
    let message = match conflict.kind {
        ConflictKind::CallOrText { callee } => {
            format!("{place}, {byte} could either begin {} or be read directly", name(callee))
        }
        ConflictKind::TwoCalls { callee, other } => {
            format!("{place}, {byte} could begin either {} or {}", name(callee), name(other))
        }
        ConflictKind::EndOrGoOn => format!(
            "{place}, {byte} could either continue it or come after it where it is used (hint: a rule that \
             ends with something optional, such as whitespace, followed where it is used by something \
             that may begin the same way: move the optional part to where the rule is used)"
        ),
    };
    ConstraintError::UnsupportedGrammar {
        rule: names.def_name(conflict.blamed_rule() as usize),
        message: format!(
            "{message}; the engine chooses at each character without looking further ahead, so the grammar \
             must make that choice from one character"
        ),
    }
}
