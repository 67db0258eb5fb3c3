//! Grammars as trees, written out as GBNF for the engine and recognized here by an
//! Earley parser: an oracle for GBNF grammars independent of the engine (its own
//! lowering, no DFAs, no rule calls), which also tells whether a prefix can still be
//! completed (every rule the generators make can finish).
#![allow(dead_code)]

use std::collections::HashSet;

use super::Rng;

/// A grammar's rule bodies; rule 0 is `root`.
#[derive(Debug, Clone)]
pub enum G {
    Lit(String),
    /// One character in (or, negated, not in) the set.
    Class(Vec<char>, bool),
    Ref(usize),
    Seq(Vec<G>),
    Alt(Vec<G>),
    Rep(Box<G>, u32, Option<u32>),
}

/// The characters the generators use (one of them two bytes long in UTF-8).
pub const CHARS: &[char] = &['a', 'b', 'c', '(', ')', '[', ']', '{', '}', ',', ' ', 'é'];

pub fn rule_name(k: usize) -> String {
    if k == 0 {
        "root".into()
    } else {
        format!("r{k}")
    }
}

fn escape(c: char, in_class: bool) -> String {
    match c {
        '"' | '\\' => format!("\\{c}"),
        ']' | '[' | '^' | '-' if in_class => format!("\\{c}"),
        c => c.to_string(),
    }
}

impl G {
    pub fn to_gbnf(&self) -> String {
        match self {
            G::Lit(s) => format!("\"{}\"", s.chars().map(|c| escape(c, false)).collect::<String>()),
            G::Class(chars, negated) => format!(
                "[{}{}]",
                if *negated { "^" } else { "" },
                chars.iter().map(|&c| escape(c, true)).collect::<String>()
            ),
            G::Ref(k) => rule_name(*k),
            G::Seq(items) => items.iter().map(|i| format!("({})", i.to_gbnf())).collect::<Vec<_>>().join(" "),
            G::Alt(items) => {
                items.iter().map(|i| format!("({})", i.to_gbnf())).collect::<Vec<_>>().join(" | ")
            }
            G::Rep(item, min, max) => {
                let count = match max {
                    None => format!("{{{min},}}"),
                    Some(max) => format!("{{{min},{max}}}"),
                };
                format!("({}){count}", item.to_gbnf())
            }
        }
    }
}

pub fn grammar_text(rules: &[G]) -> String {
    rules.iter().enumerate().map(|(k, body)| format!("{} ::= {}\n", rule_name(k), body.to_gbnf())).collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Sym {
    Char(Vec<char>, bool),
    Nt(usize),
}

/// Plain BNF: nonterminal -> alternatives -> symbols.
pub struct Bnf {
    alternatives: Vec<Vec<Vec<Sym>>>,
    nullable: Vec<bool>,
}

impl Bnf {
    pub fn new(rules: &[G]) -> Bnf {
        let mut alternatives: Vec<Vec<Vec<Sym>>> = vec![Vec::new(); rules.len()];
        for (k, body) in rules.iter().enumerate() {
            let lowered = lower(body, &mut alternatives);
            alternatives[k].push(lowered);
        }
        let mut nullable = vec![false; alternatives.len()];
        loop {
            let mut changed = false;
            for n in 0..alternatives.len() {
                if !nullable[n]
                    && alternatives[n]
                        .iter()
                        .any(|alt| alt.iter().all(|s| matches!(s, Sym::Nt(m) if nullable[*m])))
                {
                    nullable[n] = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        Bnf { alternatives, nullable }
    }
}

fn fresh(alternatives: &mut Vec<Vec<Vec<Sym>>>, alts: Vec<Vec<Sym>>) -> Sym {
    alternatives.push(alts);
    Sym::Nt(alternatives.len() - 1)
}

fn lower(g: &G, out: &mut Vec<Vec<Vec<Sym>>>) -> Vec<Sym> {
    match g {
        G::Lit(s) => s.chars().map(|c| Sym::Char(vec![c], false)).collect(),
        G::Class(chars, negated) => vec![Sym::Char(chars.clone(), *negated)],
        G::Ref(k) => vec![Sym::Nt(*k)],
        G::Seq(items) => items.iter().flat_map(|i| lower(i, out)).collect(),
        G::Alt(items) => {
            let alts = items.iter().map(|i| lower(i, out)).collect();
            vec![fresh(out, alts)]
        }
        G::Rep(item, min, max) => {
            let body = lower(item, out);
            let mut seq: Vec<Sym> = (0..*min).flat_map(|_| body.clone()).collect();
            match max {
                None => {
                    out.push(Vec::new());
                    let star = out.len() - 1;
                    let mut again = body.clone();
                    again.push(Sym::Nt(star));
                    out[star] = vec![Vec::new(), again];
                    seq.push(Sym::Nt(star));
                }
                Some(max) => {
                    for _ in *min..*max {
                        let optional = fresh(out, vec![Vec::new(), body.clone()]);
                        seq.push(optional);
                    }
                }
            }
            seq
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Item {
    nt: usize,
    alt: usize,
    dot: usize,
    origin: usize,
}

/// An Earley recognizer fed one character at a time (and able to take them back).
pub struct Earley<'a> {
    bnf: &'a Bnf,
    sets: Vec<Vec<Item>>,
}

impl<'a> Earley<'a> {
    pub fn new(bnf: &'a Bnf) -> Self {
        let mut earley = Earley { bnf, sets: Vec::new() };
        let start =
            (0..bnf.alternatives[0].len()).map(|alt| Item { nt: 0, alt, dot: 0, origin: 0 }).collect();
        earley.close(start);
        earley
    }

    fn next_symbol(&self, item: &Item) -> Option<&'a Sym> {
        self.bnf.alternatives[item.nt][item.alt].get(item.dot)
    }

    /// Adds the set made of `seeds` and their predictions and completions (Aycock and
    /// Horspool's way with rules that match the empty string: predicting one also steps
    /// over it).
    fn close(&mut self, seeds: Vec<Item>) {
        let here = self.sets.len();
        let mut set: Vec<Item> = Vec::new();
        let mut seen: HashSet<Item> = HashSet::new();
        let mut add = |item: Item, set: &mut Vec<Item>| {
            if seen.insert(item) {
                set.push(item);
            }
        };
        for seed in seeds {
            add(seed, &mut set);
        }
        let mut i = 0;
        while i < set.len() {
            let item = set[i];
            i += 1;
            match self.next_symbol(&item) {
                Some(Sym::Nt(n)) => {
                    for alt in 0..self.bnf.alternatives[*n].len() {
                        add(Item { nt: *n, alt, dot: 0, origin: here }, &mut set);
                    }
                    if self.bnf.nullable[*n] {
                        add(Item { dot: item.dot + 1, ..item }, &mut set);
                    }
                }
                Some(Sym::Char(..)) => {}
                // Completed after reading something: advance whoever waited for it. (One
                // that read nothing is nullable, stepped over when predicted.)
                None if item.origin < here => {
                    for w in self.sets[item.origin].clone() {
                        if self.next_symbol(&w) == Some(&Sym::Nt(item.nt)) {
                            add(Item { dot: w.dot + 1, ..w }, &mut set);
                        }
                    }
                }
                None => {}
            }
        }
        self.sets.push(set);
    }

    pub fn push(&mut self, c: char) -> bool {
        let last = self.sets.last().unwrap();
        let seeds: Vec<Item> = last
            .iter()
            .filter(|item| match self.next_symbol(item) {
                Some(Sym::Char(chars, negated)) => chars.contains(&c) != *negated,
                _ => false,
            })
            .map(|item| Item { dot: item.dot + 1, ..*item })
            .collect();
        self.close(seeds);
        self.alive()
    }

    pub fn pop(&mut self) {
        assert!(self.sets.len() > 1);
        self.sets.pop();
    }

    pub fn alive(&self) -> bool {
        !self.sets.last().unwrap().is_empty()
    }

    pub fn accepts(&self) -> bool {
        self.sets.last().unwrap().iter().any(|i| i.nt == 0 && i.origin == 0 && self.next_symbol(i).is_none())
    }

    pub fn len(&self) -> usize {
        self.sets.len() - 1
    }

    pub fn truncate(&mut self, chars: usize) {
        self.sets.truncate(chars + 1);
    }
}

/// Whether `text` is in the language.
pub fn member(bnf: &Bnf, text: &str) -> bool {
    let mut earley = Earley::new(bnf);
    text.chars().all(|c| earley.push(c)) && earley.accepts()
}

/// A recognizer over bytes: UTF-8 may be cut anywhere (as tokens cut it).
pub struct BytePrefix<'a> {
    pub earley: Earley<'a>,
    pending: Vec<u8>,
    dead: bool,
}

impl<'a> BytePrefix<'a> {
    pub fn new(bnf: &'a Bnf) -> Self {
        BytePrefix { earley: Earley::new(bnf), pending: Vec::new(), dead: false }
    }

    /// Appends `bytes`; whether the text so far can still be completed.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            if self.dead {
                return false;
            }
            self.pending.push(b);
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    let c = s.chars().next().unwrap();
                    self.pending.clear();
                    self.dead = !self.earley.push(c);
                }
                Err(e) if e.error_len().is_some() => self.dead = true,
                Err(_) => {}
            }
        }
        !self.dead && self.pending_can_finish()
    }

    /// An incomplete character at the end: some character it begins can come next.
    /// Classes hold only `CHARS`, so besides those, the two smallest characters the bytes
    /// begin stand for all others (a negated class excludes at most one of them).
    fn pending_can_finish(&mut self) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        let mut candidates: Vec<char> =
            CHARS.iter().copied().filter(|c| c.to_string().as_bytes().starts_with(&self.pending)).collect();
        candidates.extend(smallest_completions(&self.pending, 2));
        candidates.into_iter().any(|c| {
            let ok = self.earley.push(c);
            self.earley.pop();
            ok
        })
    }

    pub fn accepts(&self) -> bool {
        !self.dead && self.pending.is_empty() && self.earley.accepts()
    }

    /// Whether `bytes` could come next (the state is left as it was).
    pub fn allows(&mut self, bytes: &[u8]) -> bool {
        let (chars, pending, dead) = (self.earley.len(), self.pending.clone(), self.dead);
        let ok = self.push(bytes);
        self.earley.truncate(chars);
        self.pending = pending;
        self.dead = dead;
        ok
    }
}

/// The `n` smallest characters whose UTF-8 begins with `prefix`.
fn smallest_completions(prefix: &[u8], n: usize) -> Vec<char> {
    let mut found = Vec::new();
    let mut stack = vec![prefix.to_vec()];
    while let Some(bytes) = stack.pop() {
        match std::str::from_utf8(&bytes) {
            Ok(s) => {
                found.push(s.chars().next().unwrap());
                if found.len() == n {
                    break;
                }
            }
            Err(e) if e.error_len().is_none() && bytes.len() < 4 => {
                // Depth first, smallest continuation byte first.
                stack.extend((0x80..=0xBFu8).rev().map(|b| [&bytes[..], &[b]].concat()));
            }
            Err(_) => {}
        }
    }
    found
}

/// Members drawn from the grammar: `depth` bounds nesting (past it, the shortest way out).
pub fn sample(rules: &[G], rng: &mut Rng, out: &mut String) {
    let heights = heights(rules);
    sample_node(&rules[0], rules, &heights, rng, 0, out);
}

/// Per rule, the least nesting of references needed to finish it.
fn heights(rules: &[G]) -> Vec<u32> {
    let mut h = vec![u32::MAX; rules.len()];
    loop {
        let mut changed = false;
        for k in 0..rules.len() {
            let v = height(&rules[k], &h);
            if v < h[k] {
                h[k] = v;
                changed = true;
            }
        }
        if !changed {
            return h;
        }
    }
}

fn height(g: &G, h: &[u32]) -> u32 {
    match g {
        G::Lit(_) | G::Class(..) => 0,
        G::Ref(k) => h[*k].saturating_add(1),
        G::Seq(items) => items.iter().map(|i| height(i, h)).max().unwrap_or(0),
        G::Alt(items) => items.iter().map(|i| height(i, h)).min().unwrap_or(u32::MAX),
        G::Rep(item, min, _) => {
            if *min == 0 {
                0
            } else {
                height(item, h)
            }
        }
    }
}

const DEEP: u32 = 6;

fn sample_node(g: &G, rules: &[G], h: &[u32], rng: &mut Rng, depth: u32, out: &mut String) {
    match g {
        G::Lit(s) => out.push_str(s),
        G::Class(chars, false) => out.push(chars[rng.below(chars.len())]),
        G::Class(chars, true) => {
            let allowed: Vec<char> = CHARS.iter().copied().filter(|c| !chars.contains(c)).collect();
            out.push(allowed[rng.below(allowed.len())]);
        }
        G::Ref(k) => sample_node(&rules[*k], rules, h, rng, depth + 1, out),
        G::Seq(items) => items.iter().for_each(|i| sample_node(i, rules, h, rng, depth, out)),
        G::Alt(items) => {
            let pick = if depth >= DEEP {
                (0..items.len()).min_by_key(|&i| height(&items[i], h)).unwrap()
            } else {
                rng.below(items.len())
            };
            sample_node(&items[pick], rules, h, rng, depth, out);
        }
        G::Rep(item, min, max) => {
            let max = max.unwrap_or(min + 2);
            let n = if depth >= DEEP { *min } else { min + rng.below((max - min + 1) as usize) as u32 };
            for _ in 0..n {
                sample_node(item, rules, h, rng, depth, out);
            }
        }
    }
}
