//! Which parts of the grammar become rules of the engine, and the rules' bodies.
//!
//! The engine runs a regex per rule and calls between rules (`recursive.rs`); whatever
//! is not recursive is best inlined, since inside one regex the DFA keeps every
//! alternative open at once, while at a call the engine must choose from the next
//! character alone. So only recursion gets rules, and it gets them where the choice is
//! easy: recursion in real grammars is nesting between brackets (`"[" ... value ...
//! "]"`, `"(" ws expr ")"`, `"{" statement* "}"`), and the bracketed *segment* itself
//! makes the best rule: it starts with a character that announces it and ends with
//! one after which it cannot go on, so what follows it never needs a guess. Each
//! recursive reference takes the nearest segment around it that is bounded on both
//! sides by parts that never match the empty string and do not recurse. Cycles left
//! without such a segment (`factor ::= "-" factor | ...`) get a whole definition made a
//! rule (the *fallback*). Segments with the same body share one rule.
//!
//! A plan can still be one the engine cannot run exactly (`check.rs`); the caller then
//! forbids the rule at fault and plans again.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::ast::{alt, repeat, seq, Def, Node};
use super::rewrite;
use crate::error::{ConstraintError, Result};
use crate::recursive::MAX_RULES;

/// Nodes one compiled rule may hold after inlining (inlining can multiply a grammar).
const MAX_RULE_NODES: usize = 1 << 20;
/// References inlined within references at most this deep (inlining recurses).
const MAX_INLINE_DEPTH: usize = 500;

/// A bracketed part of a definition: items `first..=last` of the sequence at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Segment {
    pub def: usize,
    pub path: Vec<u32>,
    pub first: usize,
    pub last: usize,
}

/// Segments cut from the sequence at `(definition, path)`: `(first, last)` item ranges.
type SegmentCuts = HashMap<(usize, Vec<u32>), Vec<(usize, usize)>>;

/// What a plan may not use (each found at fault in an earlier plan).
#[derive(Debug, Default)]
pub(crate) struct Forbidden {
    pub segments: HashSet<Segment>,
    pub defs: HashSet<usize>,
}

#[derive(Debug, Clone)]
pub(crate) enum RuleKind {
    /// Rule 0: the whole output (`root`).
    Main,
    /// A bracketed segment (those of every site with the same body).
    Segment { sites: Vec<Segment>, body: Node },
    /// A whole definition (the fallback).
    Def(usize),
}

#[derive(Debug)]
pub(crate) struct Rule {
    pub kind: RuleKind,
    /// With every reference inlined: text, classes, calls.
    pub body: Node,
}

#[derive(Debug)]
pub(crate) struct Plan {
    pub rules: Vec<Rule>,
}

/// No plan: a cycle whose every member was forbidden.
#[derive(Debug)]
pub(crate) struct NoPlan;

/// The rules for `defs` (already without self-recursion that a loop can say, and
/// without references to definitions that cannot finish).
pub(crate) fn plan(
    defs: &[Def],
    root: usize,
    nullable: &[bool],
    forbidden: &Forbidden,
) -> std::result::Result<Result<Plan>, NoPlan> {
    let reachable = reachable(defs, root);
    let refs: Vec<Vec<usize>> = (0..defs.len())
        .map(|d| {
            let mut out = Vec::new();
            if reachable[d] {
                defs[d].body.for_each_ref(&mut |e| out.push(e));
            }
            out
        })
        .collect();
    let component = components(&refs);
    let recursive = |d: usize, e: usize| component[d] == component[e];
    let mut segments = SegmentCuts::new();
    for d in (0..defs.len()).filter(|&d| reachable[d]) {
        let mut sites = Vec::new();
        find_sites(&defs[d].body, &mut Vec::new(), &mut |path, e| {
            if recursive(d, e) {
                sites.push(path.to_vec());
            }
        });
        let boundary = |item: &Node| {
            let mut recurses = false;
            item.for_each_ref(&mut |e| recurses |= recursive(d, e));
            !recurses && !item.nullable(nullable)
        };
        for site in sites {
            if let Some((path, first, last)) = enclosing_segment(&defs[d].body, &site, &boundary) {
                let ranges = segments.entry((d, path)).or_default();
                ranges.push((first, last));
            }
        }
    }
    // Overlapping segments of one sequence merge (`"(" a "," b ")"`).
    let mut cut_segments = SegmentCuts::new();
    for ((d, path), mut ranges) in segments {
        ranges.sort();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (first, last) in ranges {
            match merged.last_mut() {
                Some(previous) if first <= previous.1 => previous.1 = previous.1.max(last),
                _ => merged.push((first, last)),
            }
        }
        merged.retain(|&(first, last)| {
            !forbidden.segments.contains(&Segment { def: d, path: path.clone(), first, last })
        });
        if !merged.is_empty() {
            cut_segments.insert((d, path), merged);
        }
    }
    // References outside segments, and the cycles they still make.
    let outside: Vec<Vec<usize>> = (0..defs.len())
        .map(|d| {
            let mut out = Vec::new();
            if reachable[d] {
                refs_outside(&defs[d].body, &mut Vec::new(), d, &cut_segments, &mut out);
            }
            out
        })
        .collect();
    let cut_defs = fallback_cuts(defs, &outside, nullable, forbidden)?;
    Ok(Builder::new(defs, nullable, cut_segments, cut_defs).build(root))
}

fn reachable(defs: &[Def], root: usize) -> Vec<bool> {
    let mut seen = vec![false; defs.len()];
    let mut stack = vec![root];
    seen[root] = true;
    while let Some(d) = stack.pop() {
        defs[d].body.for_each_ref(&mut |e| {
            if !std::mem::replace(&mut seen[e], true) {
                stack.push(e);
            }
        });
    }
    seen
}

/// Strongly connected components (Kosaraju, without recursion); a node on no cycle is
/// alone in its component, but so is one that only refers to itself, which the
/// callers test for separately where it matters.
fn components(successors: &[Vec<usize>]) -> Vec<usize> {
    let n = successors.len();
    let mut order = Vec::with_capacity(n);
    let mut seen = vec![false; n];
    for start in 0..n {
        if std::mem::replace(&mut seen[start], true) {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        while let Some((node, next)) = stack.last_mut() {
            if let Some(&succ) = successors[*node].get(*next) {
                *next += 1;
                if !std::mem::replace(&mut seen[succ], true) {
                    stack.push((succ, 0));
                }
            } else {
                order.push(*node);
                stack.pop();
            }
        }
    }
    let mut predecessors = vec![Vec::new(); n];
    for (node, succs) in successors.iter().enumerate() {
        for &succ in succs {
            predecessors[succ].push(node);
        }
    }
    let mut component = vec![usize::MAX; n];
    for &start in order.iter().rev() {
        if component[start] != usize::MAX {
            continue;
        }
        component[start] = start;
        let mut stack = vec![start];
        while let Some(node) = stack.pop() {
            for &pred in &predecessors[node] {
                if component[pred] == usize::MAX {
                    component[pred] = start;
                    stack.push(pred);
                }
            }
        }
    }
    component
}

/// Calls `visit(path, def)` for every reference, `path` the child indexes down to it.
fn find_sites(node: &Node, path: &mut Vec<u32>, visit: &mut impl FnMut(&[u32], usize)) {
    match node {
        Node::Ref(d) => visit(path, *d),
        Node::Seq(items) | Node::Alt(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i as u32);
                find_sites(item, path, visit);
                path.pop();
            }
        }
        Node::Repeat(item, _, _) => {
            path.push(0);
            find_sites(item, path, visit);
            path.pop();
        }
        _ => {}
    }
}

fn child(node: &Node, index: u32) -> &Node {
    match node {
        Node::Seq(items) | Node::Alt(items) => &items[index as usize],
        Node::Repeat(item, _, _) => item,
        _ => unreachable!("a path goes through sequences, alternations and repetitions"),
    }
}

/// The nearest sequence around the reference at `site` with a boundary item on each
/// side of it: `(path of the sequence, first, last)`.
fn enclosing_segment(
    body: &Node,
    site: &[u32],
    boundary: &impl Fn(&Node) -> bool,
) -> Option<(Vec<u32>, usize, usize)> {
    // A body that is only the reference has no sequence around it.
    site.last()?;
    let mut ancestors = vec![body];
    for &index in &site[..site.len() - 1] {
        ancestors.push(child(ancestors.last().unwrap(), index));
    }
    for depth in (0..site.len()).rev() {
        let Node::Seq(items) = ancestors[depth] else { continue };
        let at = site[depth] as usize;
        let first = (0..at).rev().find(|&i| boundary(&items[i]));
        let last = (at + 1..items.len()).find(|&i| boundary(&items[i]));
        if let (Some(first), Some(last)) = (first, last) {
            return Some((site[..depth].to_vec(), first, last));
        }
    }
    None
}

/// The references of `node` outside the segments cut from it.
fn refs_outside(node: &Node, path: &mut Vec<u32>, def: usize, cuts: &SegmentCuts, out: &mut Vec<usize>) {
    match node {
        Node::Ref(d) => out.push(*d),
        Node::Seq(items) | Node::Alt(items) => {
            let ranges = match node {
                Node::Seq(_) => cuts.get(&(def, path.clone())).map(Vec::as_slice).unwrap_or(&[]),
                _ => &[],
            };
            for (i, item) in items.iter().enumerate() {
                if ranges.iter().any(|&(first, last)| (first..=last).contains(&i)) {
                    continue;
                }
                path.push(i as u32);
                refs_outside(item, path, def, cuts, out);
                path.pop();
            }
        }
        Node::Repeat(item, _, _) => {
            path.push(0);
            refs_outside(item, path, def, cuts, out);
            path.pop();
        }
        _ => {}
    }
}

/// Whole definitions to make rules until no cycle is left outside segments.
fn fallback_cuts(
    defs: &[Def],
    outside: &[Vec<usize>],
    nullable: &[bool],
    forbidden: &Forbidden,
) -> std::result::Result<Vec<usize>, NoPlan> {
    let mut cut: Vec<usize> = Vec::new();
    loop {
        let successors: Vec<Vec<usize>> =
            outside.iter().map(|refs| refs.iter().copied().filter(|e| !cut.contains(e)).collect()).collect();
        let component = components(&successors);
        // Ordered, so that the same grammar always gets the same plan.
        let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (d, &c) in component.iter().enumerate().take(defs.len()) {
            members.entry(c).or_default().push(d);
        }
        let cyclic: Vec<Vec<usize>> =
            members.into_values().filter(|m| m.len() > 1 || successors[m[0]].contains(&m[0])).collect();
        if cyclic.is_empty() {
            return Ok(cut);
        }
        for members in cyclic {
            // Calls into a definition that starts with a fixed part and cannot be empty
            // are the easiest to decide; then the most referred-to breaks most cycles.
            let score = |&d: &usize| {
                let opens = match &defs[d].body {
                    Node::Seq(items) => !items[0].nullable(nullable) && is_fixed(&items[0]),
                    other => is_fixed(other),
                };
                let callers =
                    members.iter().map(|&m| successors[m].iter().filter(|&&e| e == d).count()).sum::<usize>();
                (!nullable[d], opens, callers, std::cmp::Reverse(d))
            };
            let pick = members.iter().filter(|d| !forbidden.defs.contains(d)).max_by_key(|d| score(d));
            cut.push(*pick.ok_or(NoPlan)?);
        }
    }
}

fn is_fixed(node: &Node) -> bool {
    matches!(node, Node::Text(_) | Node::Class { .. })
}

struct Builder<'a> {
    defs: &'a [Def],
    nullable: &'a [bool],
    cut_segments: SegmentCuts,
    /// Rule number of each definition made a rule.
    def_rules: HashMap<usize, usize>,
    rules: Vec<Rule>,
    /// Segment bodies (references not yet inlined) -> rule number.
    segment_rules: HashMap<Node, usize>,
    /// Definitions with their segments replaced by calls.
    marked: HashMap<usize, Node>,
    /// Definitions inlined, and their sizes in nodes.
    expanded: HashMap<usize, (Node, usize)>,
    /// References being inlined, outermost first.
    inlining: usize,
    too_many_rules: bool,
}

impl<'a> Builder<'a> {
    fn new(defs: &'a [Def], nullable: &'a [bool], cut_segments: SegmentCuts, cut_defs: Vec<usize>) -> Self {
        let mut builder = Builder {
            defs,
            nullable,
            cut_segments,
            def_rules: HashMap::new(),
            rules: vec![Rule { kind: RuleKind::Main, body: Node::Empty }],
            segment_rules: HashMap::new(),
            marked: HashMap::new(),
            expanded: HashMap::new(),
            inlining: 0,
            too_many_rules: false,
        };
        for d in cut_defs {
            let k = builder.new_rule(RuleKind::Def(d));
            builder.def_rules.insert(d, k);
        }
        builder
    }

    fn new_rule(&mut self, kind: RuleKind) -> usize {
        self.rules.push(Rule { kind, body: Node::Empty });
        if self.rules.len() > MAX_RULES {
            self.too_many_rules = true;
        }
        // Past the limit the number is never used: the plan is refused.
        (self.rules.len() - 1).min(MAX_RULES - 1)
    }

    fn build(mut self, root: usize) -> Result<Plan> {
        for d in 0..self.defs.len() {
            let body = self.mark(&self.defs[d].body.clone(), &mut Vec::new(), d);
            self.marked.insert(d, body);
        }
        if self.too_many_rules {
            return Err(ConstraintError::GrammarTooLarge {
                message: format!("the grammar needs more than {MAX_RULES} recursive rules"),
            });
        }
        self.rules[0].body = match self.def_rules.get(&root) {
            Some(&k) => self.call(root, k),
            None => self.expand_def(root)?.0,
        };
        for k in 1..self.rules.len() {
            let body = match &self.rules[k].kind {
                RuleKind::Main => unreachable!("one main rule"),
                RuleKind::Segment { body, .. } => self.expand(&body.clone())?.0,
                RuleKind::Def(d) => {
                    let d = *d;
                    let marked = self.marked[&d].clone();
                    let body = self.expand(&marked)?.0;
                    if self.nullable[d] {
                        non_empty(&body)
                    } else {
                        // Inlined, recursion through other definitions may have become
                        // left or right recursion of this rule, which a loop can say.
                        rewrite::without_self_recursion(&Node::Call(k), &[], body)
                    }
                }
            };
            self.rules[k].body = body;
        }
        Ok(Plan { rules: self.rules })
    }

    /// `node` (of definition `def`, at `path`) with its cut segments replaced by calls.
    fn mark(&mut self, node: &Node, path: &mut Vec<u32>, def: usize) -> Node {
        match node {
            Node::Seq(items) => {
                let mut marked = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    path.push(i as u32);
                    marked.push(self.mark(item, path, def));
                    path.pop();
                }
                let Some(ranges) = self.cut_segments.get(&(def, path.clone())).cloned() else {
                    return seq(marked);
                };
                let mut out = Vec::with_capacity(marked.len());
                let mut next = 0;
                for (first, last) in ranges {
                    out.extend(marked[next..first].iter().cloned());
                    let body = seq(marked[first..=last].to_vec());
                    let site = Segment { def, path: path.clone(), first, last };
                    let k = match self.segment_rules.get(&body) {
                        Some(&k) => k,
                        None => {
                            let k =
                                self.new_rule(RuleKind::Segment { sites: Vec::new(), body: body.clone() });
                            self.segment_rules.insert(body, k);
                            k
                        }
                    };
                    if let RuleKind::Segment { sites, .. } = &mut self.rules[k].kind {
                        sites.push(site);
                    }
                    out.push(Node::Call(k));
                    next = last + 1;
                }
                out.extend(marked[next..].iter().cloned());
                seq(out)
            }
            Node::Alt(items) => alt(items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    path.push(i as u32);
                    let marked = self.mark(item, path, def);
                    path.pop();
                    marked
                })
                .collect()),
            Node::Repeat(item, min, max) => {
                path.push(0);
                let marked = self.mark(item, path, def);
                path.pop();
                repeat(marked, *min, *max)
            }
            other => other.clone(),
        }
    }

    /// How a reference to the definition `d`, made rule `k`, is written: the call, optional
    /// if `d` matches the empty string (the rule itself never does).
    fn call(&self, d: usize, k: usize) -> Node {
        if self.nullable[d] {
            repeat(Node::Call(k), 0, Some(1))
        } else {
            Node::Call(k)
        }
    }

    fn expand_def(&mut self, d: usize) -> Result<(Node, usize)> {
        if let Some(done) = self.expanded.get(&d) {
            return Ok(done.clone());
        }
        crate::budget::check()?;
        if self.inlining >= MAX_INLINE_DEPTH {
            return Err(ConstraintError::GrammarTooLarge {
                message: format!("rules refer to rules more than {MAX_INLINE_DEPTH} deep"),
            });
        }
        let marked = self.marked[&d].clone();
        self.inlining += 1;
        let done = self.expand(&marked);
        self.inlining -= 1;
        let done = done?;
        self.expanded.insert(d, done.clone());
        Ok(done)
    }

    /// `node` with every reference inlined (or called, for definitions made rules), and
    /// its size in nodes.
    fn expand(&mut self, node: &Node) -> Result<(Node, usize)> {
        let (node, size) = match node {
            Node::Ref(d) => match self.def_rules.get(d) {
                Some(&k) => (self.call(*d, k), 2),
                None => self.expand_def(*d)?,
            },
            Node::Seq(items) | Node::Alt(items) => {
                let mut size = 1;
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    let (item, n) = self.expand(item)?;
                    size += n;
                    if size > MAX_RULE_NODES {
                        return Err(too_large());
                    }
                    out.push(item);
                }
                (if matches!(node, Node::Seq(_)) { seq(out) } else { alt(out) }, size)
            }
            Node::Repeat(item, min, max) => {
                let (item, n) = self.expand(item)?;
                (repeat(item, *min, *max), n + 1)
            }
            other => (other.clone(), 1),
        };
        if size > MAX_RULE_NODES {
            return Err(too_large());
        }
        Ok((node, size))
    }
}

fn too_large() -> ConstraintError {
    ConstraintError::GrammarTooLarge {
        message: format!(
            "inlining the grammar's rules makes one rule of more than {MAX_RULE_NODES} parts (rules that \
             use other rules many times, nested deeply)"
        ),
    }
}

/// The non-empty strings of `node` (which has no references left).
pub(crate) fn non_empty(node: &Node) -> Node {
    if !node.nullable(&[]) {
        return node.clone();
    }
    match node {
        Node::Seq(items) => alt((0..items.len())
            .map(|i| {
                seq(std::iter::once(non_empty(&items[i])).chain(items[i + 1..].iter().cloned()).collect())
            })
            .collect()),
        Node::Alt(items) => alt(items.iter().map(non_empty).collect()),
        // Some repetition is not empty: the first one that is not, then any of the rest.
        Node::Repeat(item, min, max) => {
            seq(vec![non_empty(item), repeat((**item).clone(), min.saturating_sub(1), max.map(|m| m - 1))])
        }
        _ => Node::Never,
    }
}

/// The rules each rule can begin by calling (through parts that may be empty).
pub(crate) fn first_calls(node: &Node, out: &mut Vec<usize>) -> bool {
    match node {
        Node::Call(k) => {
            out.push(*k);
            false
        }
        Node::Empty => true,
        Node::Seq(items) => items.iter().all(|item| first_calls(item, out)),
        Node::Alt(items) => items.iter().fold(false, |nullable, item| first_calls(item, out) | nullable),
        Node::Repeat(item, min, _) => first_calls(item, out) || *min == 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gbnf::parse::parse;
    use crate::gbnf::rewrite;

    fn plan_of(text: &str) -> Plan {
        let parsed = parse(text).unwrap();
        let mut defs = parsed.defs;
        let nullable = rewrite::nullable(&defs);
        for (d, def) in defs.iter_mut().enumerate() {
            def.body = rewrite::without_self_recursion(&Node::Ref(d), &nullable, def.body.clone());
        }
        plan(&defs, parsed.root, &nullable, &Forbidden::default()).unwrap().unwrap()
    }

    fn kinds(plan: &Plan) -> Vec<String> {
        plan.rules
            .iter()
            .map(|r| match &r.kind {
                RuleKind::Main => "main".to_string(),
                RuleKind::Def(d) => format!("def {d}"),
                RuleKind::Segment { sites, .. } => format!("segment of {}", sites[0].def),
            })
            .collect()
    }

    #[test]
    fn regular_grammars_are_one_rule() {
        let plan = plan_of("root ::= a b a\na ::= \"x\"+\nb ::= [0-9]");
        assert_eq!(kinds(&plan), ["main"]);
        // Self recursion that a loop says needs no rule either.
        let plan = plan_of("root ::= item root | item\nitem ::= \"i\"");
        assert_eq!(kinds(&plan), ["main"]);
    }

    #[test]
    fn brackets_become_rules() {
        let plan = plan_of(
            "root ::= value\nvalue ::= array | \"1\"\narray ::= \"[\" ws (value (\",\" ws value)*)? \"]\" ws\nws ::= \" \"?",
        );
        assert_eq!(kinds(&plan), ["main", "segment of 2"]);
        // The trailing whitespace stays with the caller: the rule ends at the bracket.
        let body = format!("{:?}", plan.rules[1].body);
        assert!(body.ends_with("Text(\"]\")])"), "{body}");
        // Four identical blocks share one rule.
        let plan = plan_of(
            "root ::= stmt*\nstmt ::= \"s;\" | \"if\" \"{\" stmt* \"}\" (\"else\" \"{\" stmt* \"}\")? | \"do\" \"{\" stmt* \"}\"",
        );
        assert_eq!(kinds(&plan), ["main", "segment of 1"]);
    }

    #[test]
    fn unbracketed_recursion_falls_back_to_a_definition() {
        let fallback = plan_of("root ::= factor \";\"\nfactor ::= \"-\" factor | \"x\" | \"(\" factor \")\"");
        assert_eq!(kinds(&fallback), ["main", "def 1", "segment of 1"]);
        // Forbidden definitions are not taken.
        let parsed = parse("root ::= a\na ::= \"x\" b | \"y\"\nb ::= \"z\" a").unwrap();
        let nullable = rewrite::nullable(&parsed.defs);
        let forbidden = Forbidden { defs: [1, 2].into_iter().collect(), ..Default::default() };
        assert!(plan(&parsed.defs, parsed.root, &nullable, &forbidden).is_err());
    }

    #[test]
    fn non_empty_parts() {
        let a = Node::Text("a".into());
        let b = Node::Text("b".into());
        let opt = |n: &Node| repeat(n.clone(), 0, Some(1));
        assert_eq!(non_empty(&opt(&a)), a);
        assert_eq!(
            non_empty(&seq(vec![opt(&a), opt(&b)])),
            alt(vec![seq(vec![a.clone(), opt(&b)]), b.clone()])
        );
        assert_eq!(non_empty(&repeat(a.clone(), 0, None)), seq(vec![a.clone(), repeat(a.clone(), 0, None)]));
        assert_eq!(
            non_empty(&repeat(opt(&a), 2, Some(3))),
            seq(vec![a.clone(), repeat(opt(&a), 1, Some(2))])
        );
        assert_eq!(non_empty(&Node::Empty), Node::Never);
    }
}
