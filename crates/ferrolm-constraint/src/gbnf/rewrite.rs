//! Rewrites that keep the language and take recursion out where a loop says the same:
//! a rule that refers to itself only at the start of its alternatives (left
//! recursion, `a ::= a x | y`, which a top-down matcher cannot run) becomes `y x*`; one
//! that refers to itself only at the end (`list ::= item list | item`) becomes
//! `item* item`. Then rules that can never finish are removed, and which rules can
//! match the empty string is worked out.

use super::ast::{alt, repeat, seq, Def, Node};

/// `body` of the rule `me` with self-reference at the start or the end of its
/// alternatives turned into repetition.
/// `nullable`: which definitions match the empty string (rewriting keeps languages, so
/// it holds before and after).
pub(crate) fn without_self_recursion(me: &Node, nullable: &[bool], body: Node) -> Node {
    let body = without_left_recursion(me, body, nullable);
    if !contains(&body, me) {
        return body;
    }
    match tail_split(me, &body) {
        // body = P me | Q, so me = P* Q.
        Some((prefix, rest)) => seq(vec![repeat(prefix, 0, None), rest]),
        None => body,
    }
}

fn contains(node: &Node, me: &Node) -> bool {
    match node {
        Node::Seq(items) | Node::Alt(items) => items.iter().any(|i| contains(i, me)),
        Node::Repeat(item, _, _) => contains(item, me),
        other => other == me,
    }
}

/// `me ::= me x1 | me x2 | y1 | y2` -> `(y1 | y2) (x1 | x2)*`, wherever the leading `me`s
/// are (`me ::= (me "," | "[") x` too); left as is if `me` could also be reached at the
/// start through parts that may be empty.
fn without_left_recursion(me: &Node, body: Node, nullable: &[bool]) -> Node {
    match head_split(me, &body, nullable) {
        Some((tails, others)) if tails != Node::Never => seq(vec![others, repeat(tails, 0, None)]),
        _ => body,
    }
}

/// `(T, O)` with `node = me T | O` where `me` is not at the start of `O`; `None` if
/// `me` can come first other than that (after parts that may be empty, or inside a
/// repetition).
fn head_split(me: &Node, node: &Node, nullable: &[bool]) -> Option<(Node, Node)> {
    if !contains(node, me) {
        return Some((Node::Never, node.clone()));
    }
    match node {
        n if n == me => Some((Node::Empty, Node::Never)),
        Node::Alt(items) => {
            let (tails, others): (Vec<Node>, Vec<Node>) = items
                .iter()
                .map(|i| head_split(me, i, nullable))
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .unzip();
            Some((alt(tails), alt(others)))
        }
        Node::Seq(items) => {
            let (first, rest) = items.split_first().unwrap();
            let rest = seq(rest.to_vec());
            let (tails, others) = head_split(me, first, nullable)?;
            // Where `first` may be empty, `me` at the start of the rest is hidden.
            if others.nullable(nullable) && head_split(me, &rest, nullable)?.0 != Node::Never {
                return None;
            }
            Some((seq(vec![tails, rest.clone()]), seq(vec![others, rest])))
        }
        Node::Repeat(item, 0, Some(1)) => {
            let (tails, others) = head_split(me, item, nullable)?;
            Some((tails, alt(vec![others, Node::Empty])))
        }
        Node::Repeat(item, _, _) => {
            let (tails, _) = head_split(me, item, nullable)?;
            (tails == Node::Never).then(|| (Node::Never, node.clone()))
        }
        _ => Some((Node::Never, node.clone())),
    }
}

/// `(P, Q)` with `node = P me | Q` where `me` appears in `node` only at the end; `None`
/// if it appears anywhere else.
fn tail_split(me: &Node, node: &Node) -> Option<(Node, Node)> {
    if !contains(node, me) {
        return Some((Node::Never, node.clone()));
    }
    match node {
        n if n == me => Some((Node::Empty, Node::Never)),
        Node::Alt(items) => {
            let (prefixes, rests): (Vec<Node>, Vec<Node>) =
                items.iter().map(|i| tail_split(me, i)).collect::<Option<Vec<_>>>()?.into_iter().unzip();
            Some((alt(prefixes), alt(rests)))
        }
        Node::Seq(items) => {
            let (last, before) = items.split_last().unwrap();
            if before.iter().any(|i| contains(i, me)) {
                return None;
            }
            let (prefix, rest) = tail_split(me, last)?;
            let with = |tail: Node| seq(before.iter().cloned().chain([tail]).collect());
            Some((with(prefix), with(rest)))
        }
        Node::Repeat(item, 0, Some(1)) => {
            let (prefix, rest) = tail_split(me, item)?;
            Some((prefix, alt(vec![rest, Node::Empty])))
        }
        _ => None,
    }
}

/// Which definitions can produce a finite string (a least fixpoint).
pub(crate) fn productive(defs: &[Def]) -> Vec<bool> {
    let mut productive = vec![false; defs.len()];
    loop {
        let mut changed = false;
        for (d, def) in defs.iter().enumerate() {
            if !productive[d] && can_finish(&def.body, &productive) {
                productive[d] = true;
                changed = true;
            }
        }
        if !changed {
            return productive;
        }
    }
}

fn can_finish(node: &Node, productive: &[bool]) -> bool {
    match node {
        Node::Never => false,
        Node::Empty | Node::Text(_) | Node::Class { .. } | Node::Call(_) => true,
        Node::Ref(d) => productive[*d],
        Node::Seq(items) => items.iter().all(|i| can_finish(i, productive)),
        Node::Alt(items) => items.iter().any(|i| can_finish(i, productive)),
        Node::Repeat(item, min, _) => *min == 0 || can_finish(item, productive),
    }
}

/// Which definitions match the empty string (a least fixpoint).
pub(crate) fn nullable(defs: &[Def]) -> Vec<bool> {
    let mut nullable = vec![false; defs.len()];
    loop {
        let mut changed = false;
        for (d, def) in defs.iter().enumerate() {
            if !nullable[d] && def.body.nullable(&nullable) {
                nullable[d] = true;
                changed = true;
            }
        }
        if !changed {
            return nullable;
        }
    }
}

/// The definitions with references to those that cannot finish replaced by `Never`
/// (and simplified away).
pub(crate) fn without_unproductive(defs: &mut [Def]) {
    let productive = productive(defs);
    if productive.iter().all(|&p| p) {
        return;
    }
    for def in defs.iter_mut() {
        def.body = def.body.substitute(&|d| (!productive[d]).then_some(Node::Never));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Node {
        Node::Text(s.into())
    }

    const ME: Node = Node::Ref(0);

    #[test]
    fn left_recursion_becomes_a_loop() {
        // expr ::= expr "+" t | expr "-" t | t
        let body =
            alt(vec![seq(vec![ME, t("+"), Node::Ref(1)]), seq(vec![ME, t("-"), Node::Ref(1)]), Node::Ref(1)]);
        assert_eq!(
            without_self_recursion(&ME, &[false; 2], body),
            seq(vec![
                Node::Ref(1),
                repeat(alt(vec![seq(vec![t("+"), Node::Ref(1)]), seq(vec![t("-"), Node::Ref(1)])]), 0, None)
            ])
        );
        // Only left recursion: nothing finite.
        assert_eq!(without_self_recursion(&ME, &[false; 2], seq(vec![ME, t("a")])), Node::Never);
    }

    #[test]
    fn right_recursion_becomes_a_loop() {
        // list ::= item list | item
        let body = alt(vec![seq(vec![Node::Ref(1), ME]), Node::Ref(1)]);
        assert_eq!(
            without_self_recursion(&ME, &[false; 2], body),
            seq(vec![repeat(Node::Ref(1), 0, None), Node::Ref(1)])
        );
        // ws ::= ([ \t] ws)?
        let space = Node::Class { ranges: vec![(' ', ' '), ('\t', '\t')], negated: false };
        let body = repeat(seq(vec![space.clone(), ME]), 0, Some(1));
        assert_eq!(without_self_recursion(&ME, &[false; 2], body), repeat(space, 0, None));
        // items ::= item ("," items)?
        let body = seq(vec![Node::Ref(1), repeat(seq(vec![t(","), ME]), 0, Some(1))]);
        assert_eq!(
            without_self_recursion(&ME, &[false; 2], body),
            seq(vec![repeat(seq(vec![Node::Ref(1), t(",")]), 0, None), Node::Ref(1)])
        );
    }

    #[test]
    fn nested_recursion_stays() {
        let body = alt(vec![seq(vec![t("("), ME, t(")")]), t("x")]);
        assert_eq!(without_self_recursion(&ME, &[false; 2], body.clone()), body);
    }
}
