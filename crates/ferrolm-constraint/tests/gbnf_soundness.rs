//! GBNF grammars against an oracle independent of the engine: an Earley recognizer over
//! the grammar's tree (`common/earley.rs`). Random grammars, recursive in every way
//! the translation handles (brackets, recursion without brackets, at the start or the
//! end of a rule, through several rules, through rules that may be empty), and
//! hand-picked ones. For each grammar the engine compiles:
//! - members, under random tokenizations, are accepted token by token;
//! - near misses (a character inserted, deleted or replaced) are accepted exactly
//!   when they are members;
//! - along random walks, the mask is exactly the set of tokens after which the text
//!   can still be completed (EOS exactly where the text may end), so the mask never
//!   lets the output leave the language and never refuses a way to stay in it.
//!
//! A grammar the engine cannot run exactly must be refused as `UnsupportedGrammar`,
//! never compiled wrong; the count of those is printed, and bounded.

mod common;

use std::sync::Arc;

use common::earley::{grammar_text, member, sample, Bnf, BytePrefix, CHARS, G};
use common::{random_tokenization, small_vocab, Rng};
use ferrolm_constraint::{ConstraintError, Grammar, Matcher, TokenKind, Vocabulary};

fn vocab() -> (Arc<Vocabulary>, u32) {
    let bytes: Vec<u8> = CHARS.iter().flat_map(|c| c.to_string().into_bytes()).collect();
    let mut rng = Rng(7);
    let mut extra: Vec<Vec<u8>> = ["(a", "a)", "ab", "),(", "[]", " a", "aé", "()", "],[", "ba", "a,", ", "]
        .iter()
        .map(|t| t.as_bytes().to_vec())
        .collect();
    for _ in 0..48 {
        let len = 2 + rng.below(3);
        extra.push((0..len).map(|_| bytes[rng.below(bytes.len())]).collect());
    }
    small_vocab(&extra)
}

fn lit(s: &str) -> G {
    G::Lit(s.into())
}

/// Leaves mostly keep off the brackets (as in real grammars, where brackets are
/// structure), sometimes not (to make grammars the engine must refuse).
fn random_char(rng: &mut Rng) -> char {
    const CONTENT: &[char] = &['a', 'b', 'c', ',', ' ', 'é'];
    if rng.below(5) == 0 {
        CHARS[rng.below(CHARS.len())]
    } else {
        CONTENT[rng.below(CONTENT.len())]
    }
}

fn random_text(rng: &mut Rng, max: usize) -> String {
    (0..1 + rng.below(max)).map(|_| random_char(rng)).collect()
}

fn random_node(rng: &mut Rng, depth: u32, rules: usize, refs: bool) -> G {
    let leaf = |rng: &mut Rng| match rng.below(5) {
        0 | 1 => G::Lit(random_text(rng, 2)),
        2 => {
            let mut chars: Vec<char> = (0..1 + rng.below(3)).map(|_| random_char(rng)).collect();
            chars.dedup();
            G::Class(chars, rng.below(6) == 0)
        }
        _ if refs => G::Ref(rng.below(rules)),
        _ => G::Lit(random_text(rng, 2)),
    };
    if depth == 0 {
        return leaf(rng);
    }
    let sub = |rng: &mut Rng| random_node(rng, depth - 1, rules, refs);
    match rng.below(11) {
        0..=2 => leaf(rng),
        3 => G::Seq((0..2 + rng.below(2)).map(|_| sub(rng)).collect()),
        4 => G::Alt((0..2 + rng.below(2)).map(|_| sub(rng)).collect()),
        5 => {
            let min = rng.below(2) as u32;
            let max = if rng.below(2) == 0 { None } else { Some(min + rng.below(3) as u32) };
            G::Rep(Box::new(sub(rng)), min, max)
        }
        // Brackets around a list of things: how recursion mostly looks.
        6..=8 => {
            let (open, close) = [("(", ")"), ("[", "]")][rng.below(2)];
            let item = if refs && rng.below(2) == 0 { G::Ref(rng.below(rules)) } else { sub(rng) };
            let inner = if rng.below(2) == 0 {
                G::Rep(
                    Box::new(G::Seq(vec![
                        item.clone(),
                        G::Rep(Box::new(G::Seq(vec![lit(","), item])), 0, None),
                    ])),
                    0,
                    Some(1),
                )
            } else {
                item
            };
            G::Seq(vec![lit(open), inner, lit(close)])
        }
        _ if refs => G::Ref(rng.below(rules)),
        _ => leaf(rng),
    }
}

/// 1 to 4 rules; each has a first alternative without references, so every rule can
/// finish, or is another rule by another name (one defined before it).
fn random_rules(rng: &mut Rng) -> Vec<G> {
    let n = 1 + rng.below(4);
    (0..n)
        .map(|k| {
            if k > 0 && rng.below(6) == 0 {
                return G::Ref(rng.below(k));
            }
            let mut alternatives = vec![random_node(rng, 2, n, false)];
            for _ in 0..rng.below(3) {
                alternatives.push(random_node(rng, 3, n, true));
            }
            if alternatives.len() == 1 {
                alternatives.pop().unwrap()
            } else {
                G::Alt(alternatives)
            }
        })
        .collect()
}

/// Grammars shaped like real ones: rules of atoms and of brackets around references
/// (one bracket kind per alternative of a rule), a prefix operator, lists.
fn nested_rules(rng: &mut Rng) -> Vec<G> {
    let n = 1 + rng.below(3);
    let brackets = [("(", ")"), ("[", "]"), ("{", "}")];
    (0..n)
        .map(|_| {
            let mut alternatives = vec![random_node(rng, 1, n, false)];
            let mut kinds: Vec<usize> = (0..brackets.len()).collect();
            for _ in 0..1 + rng.below(3) {
                let reference = G::Ref(rng.below(n));
                let alternative = match rng.below(5) {
                    0 => G::Seq(vec![lit("b"), reference]),
                    1 => G::Seq(vec![
                        lit("c"),
                        reference,
                        G::Rep(Box::new(G::Seq(vec![lit(" "), G::Ref(rng.below(n))])), 0, None),
                    ]),
                    _ if kinds.is_empty() => random_node(rng, 2, n, true),
                    _ => {
                        let (open, close) = brackets[kinds.swap_remove(rng.below(kinds.len()))];
                        let list = G::Seq(vec![
                            reference.clone(),
                            G::Rep(Box::new(G::Seq(vec![lit(","), reference])), 0, None),
                        ]);
                        let inner = match rng.below(3) {
                            0 => G::Rep(Box::new(list), 0, Some(1)),
                            1 => list,
                            _ => G::Seq(vec![random_node(rng, 1, n, false), G::Ref(rng.below(n))]),
                        };
                        let space =
                            if rng.below(3) == 0 { G::Rep(Box::new(lit(" ")), 0, Some(1)) } else { lit("a") };
                        G::Seq(vec![lit(open), inner, lit(close), space])
                    }
                };
                alternatives.push(alternative);
            }
            G::Alt(alternatives)
        })
        .collect()
}

fn mutate(text: &str, rng: &mut Rng) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let at = rng.below(chars.len() + 1);
    match rng.below(3) {
        0 => chars.insert(at, CHARS[rng.below(CHARS.len())]),
        1 if at < chars.len() => {
            chars.remove(at);
        }
        _ if at < chars.len() => chars[at] = CHARS[rng.below(CHARS.len())],
        _ => chars.push(CHARS[rng.below(CHARS.len())]),
    }
    chars.into_iter().collect()
}

fn bit(mask: &[u32], id: u32) -> bool {
    mask[id as usize / 32] >> (id % 32) & 1 == 1
}

/// Checks one grammar; `false` if the engine refused it as unsupported.
fn check(rules: &[G], vocab: &Arc<Vocabulary>, eos: u32, rng: &mut Rng) -> bool {
    let text = grammar_text(rules);
    let bnf = Bnf::new(rules);
    let grammar = match Grammar::from_gbnf(vocab.clone(), &text) {
        Ok(grammar) => grammar,
        Err(e @ ConstraintError::UnsupportedGrammar { .. }) => {
            if std::env::var("SHOW_REFUSED").is_ok() {
                println!("REFUSED\n{text}{e}\n");
            }
            return false;
        }
        Err(e) => panic!("{text}\nrefused: {e}"),
    };
    for _ in 0..6 {
        let mut doc = String::new();
        sample(rules, rng, &mut doc);
        assert!(member(&bnf, &doc), "{text}\nthe oracle refuses its own sample {doc:?}");
        let mut matcher = Matcher::new(grammar.clone());
        for token in random_tokenization(vocab, doc.as_bytes(), rng) {
            assert!(matcher.is_token_allowed(token), "{text}\nmember {doc:?}: token {token} masked out");
            assert!(matcher.accept_token(token), "{text}\nmember {doc:?}: token {token} refused");
        }
        assert!(matcher.accept_token(eos), "{text}\nmember {doc:?}: may not end");
        for _ in 0..4 {
            let near = mutate(&doc, rng);
            let mut matcher = Matcher::new(grammar.clone());
            let engine = matcher.accept_str(&near) && matcher.can_end();
            assert_eq!(engine, member(&bnf, &near), "{text}\nnear miss {near:?} (of {doc:?})");
        }
    }
    let mut mask = vec![0u32; vocab.bitmask_words()];
    for _ in 0..2 {
        let mut matcher = Matcher::new(grammar.clone());
        let mut oracle = BytePrefix::new(&bnf);
        let mut output: Vec<u8> = Vec::new();
        for _ in 0..12 {
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            let mut choices = Vec::new();
            for id in 0..vocab.size() as u32 {
                let expected = match vocab.kind(id).unwrap() {
                    TokenKind::Normal => {
                        let bytes = vocab.token_bytes(id).unwrap();
                        !bytes.is_empty() && oracle.allows(bytes)
                    }
                    TokenKind::Eos => oracle.accepts(),
                    TokenKind::Special | TokenKind::Absent => false,
                };
                assert_eq!(
                    bit(&mask, id),
                    expected,
                    "{text}\nafter {:?}: token {id} {:?}",
                    String::from_utf8_lossy(&output),
                    String::from_utf8_lossy(vocab.token_bytes(id).unwrap_or_default())
                );
                if expected && id != eos {
                    choices.push(id);
                }
            }
            if choices.is_empty() {
                break;
            }
            let token = choices[rng.below(choices.len())];
            let bytes = vocab.token_bytes(token).unwrap();
            assert!(matcher.accept_token(token));
            assert!(oracle.push(bytes));
            output.extend_from_slice(bytes);
        }
    }
    true
}

fn check_many(generate: fn(&mut Rng) -> Vec<G>, seed: u64, count: usize) -> (usize, usize) {
    let (vocab, eos) = vocab();
    let mut rng = Rng(seed);
    let (mut compiled, mut recursive) = (0, 0);
    for _ in 0..count {
        let rules = generate(&mut rng);
        if check(&rules, &vocab, eos, &mut rng) {
            compiled += 1;
            let grammar = Grammar::from_gbnf(vocab.clone(), &grammar_text(&rules)).unwrap();
            recursive += usize::from(grammar.is_recursive());
        }
    }
    (compiled, recursive)
}

#[test]
fn random_grammars_match_the_oracle() {
    let (compiled, recursive) = check_many(random_rules, 20_240_601, 160);
    println!("random grammars: {compiled} of 160 compiled, {recursive} of them with rule calls");
    assert!(compiled >= 125, "{compiled} of 160 compiled");
    assert!(recursive >= 25, "{recursive} with rule calls");
}

#[test]
fn nested_grammars_match_the_oracle() {
    let (compiled, recursive) = check_many(nested_rules, 7_000_000, 160);
    println!("nested grammars: {compiled} of 160 compiled, {recursive} of them with rule calls");
    assert!(compiled >= 80, "{compiled} of 160 compiled");
    assert!(recursive >= 70, "{recursive} with rule calls");
}

#[test]
fn hand_picked_grammars_match_the_oracle() {
    let (vocab, eos) = vocab();
    let mut rng = Rng(5);
    let a = || lit("a");
    let opt = |g: G| G::Rep(Box::new(g), 0, Some(1));
    let star = |g: G| G::Rep(Box::new(g), 0, None);
    let cases: Vec<(&str, Vec<G>)> = vec![
        // root ::= "(" root? ")" | "a": brackets.
        ("brackets", vec![G::Alt(vec![G::Seq(vec![lit("("), opt(G::Ref(0)), lit(")")]), a()])]),
        // A list of values, each a bracketed list (through two rules).
        (
            "nested lists",
            vec![
                G::Seq(vec![G::Ref(1), star(G::Seq(vec![lit(","), G::Ref(1)]))]),
                G::Alt(vec![
                    a(),
                    G::Seq(vec![
                        lit("["),
                        opt(G::Seq(vec![G::Ref(1), star(G::Seq(vec![lit(","), G::Ref(1)]))])),
                        lit("]"),
                    ]),
                ]),
            ],
        ),
        // factor ::= "-" factor | "a" | "(" factor ")": recursion without a closing bracket.
        (
            "prefix operator",
            vec![
                G::Seq(vec![G::Ref(1), lit(",")]),
                G::Alt(vec![
                    G::Seq(vec![lit("b"), G::Ref(1)]),
                    a(),
                    G::Seq(vec![lit("("), G::Ref(1), lit(")")]),
                ]),
            ],
        ),
        // Left recursion: e ::= e "b" a | a.
        ("left recursion", vec![G::Alt(vec![G::Seq(vec![G::Ref(0), lit("b"), a()]), a()])]),
        // Right recursion through an optional tail: l ::= a ("," l)?.
        ("right recursion", vec![G::Seq(vec![a(), opt(G::Seq(vec![lit(","), G::Ref(0)]))])]),
        // Recursion through a rule that may be empty: x ::= ("b" x "c")?
        (
            "empty rule",
            vec![G::Seq(vec![G::Ref(1), lit(",")]), opt(G::Seq(vec![lit("b"), G::Ref(1), lit("c")]))],
        ),
        // Whitespace after values, as json.gbnf writes it.
        (
            "trailing spaces",
            vec![
                G::Ref(1),
                G::Alt(vec![
                    G::Seq(vec![a(), opt(lit(" "))]),
                    G::Seq(vec![
                        lit("["),
                        opt(lit(" ")),
                        opt(G::Seq(vec![G::Ref(1), star(G::Seq(vec![lit(","), opt(lit(" ")), G::Ref(1)]))])),
                        lit("]"),
                        opt(lit(" ")),
                    ]),
                ]),
            ],
        ),
    ];
    for (name, rules) in cases {
        assert!(check(&rules, &vocab, eos, &mut rng), "{name} refused:\n{}", grammar_text(&rules));
    }
}
