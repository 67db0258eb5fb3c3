//! GBNF grammars through the public API: llama.cpp's published grammars on documents
//! (real JSON against json.gbnf, token by token, the mask checked against trying every
//! token), errors with their positions, grammars the engine refuses, and hostile
//! grammars stopped by the compile limits.

mod common;

use std::sync::Arc;

use common::{check_mask, random_tokenization, small_vocab, Rng};
use ferrolm_constraint::{ConstraintError, Grammar, GrammarCache, GrammarSource, Matcher, Vocabulary};
use proptest::prelude::*;
use serde_json::Value;

fn grammar_file(name: &str) -> String {
    let path = format!("{}/tests/data/gbnf/{name}.gbnf", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).expect("grammar file")
}

fn vocab() -> (Arc<Vocabulary>, u32) {
    let extra: Vec<Vec<u8>> = [
        "\":", "\",\"", "[[", "]]", "]}", "},{", "{\"", "true", "null", "12", "\"]", ".5", ", ", ": ",
        "\n  ", "int", " = ", "){", ";}", "e5", "\\n", "\\u00", "O-O", "1. ", "- ",
    ]
    .iter()
    .map(|t| t.as_bytes().to_vec())
    .collect();
    small_vocab(&extra)
}

/// Whether `text` is accepted token by token under a random tokenization (masks checked
/// along the way if `check`), then EOS.
fn accepts(
    grammar: &Arc<Grammar>,
    vocab: &Vocabulary,
    eos: u32,
    text: &str,
    rng: &mut Rng,
    check: bool,
) -> bool {
    let mut matcher = Matcher::new(grammar.clone());
    for token in random_tokenization(vocab, text.as_bytes(), rng) {
        if check {
            check_mask(&matcher, vocab);
        }
        if !matcher.accept_token(token) {
            return false;
        }
    }
    if check {
        check_mask(&matcher, vocab);
    }
    matcher.accept_token(eos)
}

fn random_string(rng: &mut Rng) -> String {
    const CHARS: &[char] = &['a', 'Z', ' ', '"', '\\', '/', '\n', '\t', 'é', '中', '😀', '\u{1}', '{', ']'];
    (0..rng.below(6)).map(|_| CHARS[rng.below(CHARS.len())]).collect()
}

/// A JSON value in the range json.gbnf allows (numbers of at most 16 digits and no
/// exponent: its exponent rule, `[0-9] [1-9]{0,15}`, refuses `1e10`).
fn random_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth >= 4 { 4 } else { 6 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => match rng.below(3) {
            0 => Value::from(rng.next_u64() as i64 % 1_000_000_000_000_000),
            1 => Value::from((rng.below(20_000) as f64 - 10_000.0) / 64.0),
            _ => Value::from(-(rng.below(100) as i64)),
        },
        3 => Value::String(random_string(rng)),
        4 => Value::Array((0..rng.below(4)).map(|_| random_value(rng, depth + 1)).collect()),
        _ => random_object(rng, depth),
    }
}

fn random_object(rng: &mut Rng, depth: usize) -> Value {
    Value::Object((0..rng.below(4)).map(|_| (random_string(rng), random_value(rng, depth + 1))).collect())
}

#[test]
fn json_gbnf_accepts_json_objects() {
    let (vocab, eos) = vocab();
    let grammar = Grammar::from_gbnf(vocab.clone(), &grammar_file("json")).unwrap();
    assert!(grammar.is_recursive());
    let mut rng = Rng(11);
    for i in 0..60 {
        let doc = random_object(&mut rng, 0);
        let compact = serde_json::to_string(&doc).unwrap();
        assert!(accepts(&grammar, &vocab, eos, &compact, &mut rng, i < 10), "{compact}");
        // json.gbnf's whitespace: a space, or a newline and up to 20 spaces, after tokens.
        let pretty = serde_json::to_string_pretty(&doc).unwrap();
        assert!(accepts(&grammar, &vocab, eos, &pretty, &mut rng, false), "{pretty}");
    }
    for doc in [
        "{}",
        "{ }",
        r#"{"a": [1, -2.5, {"b": null}], "c": "x\n\u00e9\ud83d\ude00", "d": true}"#,
        "{\"a\":1}\n    ",
        "{\"a\":1.5e3}",
    ] {
        assert!(accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{doc}");
    }
    let deep = format!("{{\"deep\":{}{{}}{}}}", "[".repeat(40), "]".repeat(40));
    assert!(accepts(&grammar, &vocab, eos, &deep, &mut rng, true));
    assert!(!accepts(&grammar, &vocab, eos, &deep[1..], &mut rng, false));
    for doc in [
        "",
        "[1]",
        "\"a\"",
        "{",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":01}",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{a:1}",
        "{\"a\":tru}",
        "{\"a\":\"\u{1}\"}",
        "{\"a\":\"\\x\"}",
        "{\"a\":[1 2]}",
        "{}}",
        "{\"a\":1e10}",
        "{\"a\":12345678901234567}",
        " {}",
    ] {
        assert!(!accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{doc}");
    }
}

/// Everything json.gbnf accepts is JSON: random edits of valid documents.
#[test]
fn json_gbnf_accepts_only_json() {
    let (vocab, _) = vocab();
    let grammar = Grammar::from_gbnf(vocab, &grammar_file("json")).unwrap();
    let mut rng = Rng(12);
    const EDITS: &[char] = &['{', '}', '[', ']', '"', ',', ':', '0', '-', '.', 'e', ' ', '\\', 'n'];
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..400 {
        let doc = serde_json::to_string(&random_object(&mut rng, 0)).unwrap();
        let mut chars: Vec<char> = doc.chars().collect();
        for _ in 0..1 + rng.below(2) {
            let at = rng.below(chars.len() + 1);
            match rng.below(3) {
                0 => chars.insert(at, EDITS[rng.below(EDITS.len())]),
                _ if at < chars.len() => {
                    chars.remove(at);
                }
                _ => chars.push(EDITS[rng.below(EDITS.len())]),
            }
        }
        let edited: String = chars.into_iter().collect();
        let mut matcher = Matcher::new(grammar.clone());
        if matcher.accept_str(&edited) && matcher.can_end() {
            accepted += 1;
            let parsed: Result<Value, _> = serde_json::from_str(&edited);
            assert!(parsed.is_ok_and(|v| v.is_object()), "accepted {edited:?}, which is not a JSON object");
        } else {
            refused += 1;
        }
    }
    assert!(accepted > 20 && refused > 100, "{accepted} accepted, {refused} refused");
}

#[test]
fn json_arrays_and_the_2023_recursive_whitespace() {
    let (vocab, eos) = vocab();
    let mut rng = Rng(13);
    let arr = Grammar::from_gbnf(vocab.clone(), &grammar_file("json_arr")).unwrap();
    let old = Grammar::from_gbnf(vocab.clone(), &grammar_file("json_arr_2023")).unwrap();
    for doc in ["[\n]", "[\n1,\n{\"a\": [true]},\n\"x\"]", "[\n [ ],\n{}]"] {
        assert!(accepts(&arr, &vocab, eos, doc, &mut rng, true), "{doc}");
        assert!(accepts(&old, &vocab, eos, doc, &mut rng, true), "{doc}");
    }
    // `ws ::= ([ \t\n] ws)?` is any amount of whitespace; json_arr.gbnf's now at most 21.
    let wide = format!("[\n{}1]", " ".repeat(40));
    assert!(accepts(&old, &vocab, eos, &wide, &mut rng, false));
    assert!(!accepts(&arr, &vocab, eos, &wide, &mut rng, false));
    for doc in ["[]", "[\n1,2]", "[\n1] ", "{}"] {
        assert!(!accepts(&arr, &vocab, eos, doc, &mut rng, true), "{doc}");
    }
}

#[test]
fn llama_cpp_example_grammars() {
    let (vocab, eos) = vocab();
    let mut rng = Rng(14);
    let cases: [(&str, &[&str], &[&str]); 7] = [
        (
            "arithmetic",
            &["1=2\n", "a +b=c\n", "(a+b) *3 = x\n1=1\n", "( a )=b\n", "x_1/(y*( 2 ))=z\n"],
            &["1=2", "(1=2\n", "a + b=c\n", "=1\n", "1=(2\n"],
        ),
        (
            "c",
            &[
                "int main(){return 0;}",
                "int f(int x){if(x<1){return 1;}else{return x*f(x-1);}}",
                "int f(){if(a<b){x = 1;}e = 2;}",
                "int f(){while(a<b){x = -( a+b );}}",
                "int f(){x = g(a, b);}char g(){// note\n/* block */}",
                "",
            ],
            &["int f(){", "int f(){x = ;}", "int f(){x = (a+b);}", "int 1f(){}", "float f(){return;}"],
        ),
        (
            "chess",
            &["1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd8+\n"],
            &["1. e4 e5\n", "1. e9 e5\n2. Nf3 Nc6\n", "2. e4 e5\n3. d4 d5\n"],
        ),
        ("list", &["- one\n", "- a\n- b, c\n"], &["", "- \n", "-a\n", "- a"]),
        ("japanese", &["こんにちは", "カタカナ 漢字\nです。"], &["", "hello", "こんにちは "]),
        ("english", &["Hello, world!", "a b\tc\n(1+2)=3"], &["", "héllo", "a  b"]),
        ("json_arr_2023", &["[\n\"\\/\"]"], &["[\n\"\\x\"]"]),
    ];
    for (name, good, bad) in cases {
        let grammar = Grammar::from_gbnf(vocab.clone(), &grammar_file(name)).unwrap();
        for doc in good {
            assert!(accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{name}: {doc:?}");
        }
        for doc in bad {
            assert!(!accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{name}: {doc:?}");
        }
    }
}

#[test]
fn syntax_and_meaning_errors_carry_positions() {
    let (vocab, _) = vocab();
    let error = |text: &str| match Grammar::from_gbnf(vocab.clone(), text) {
        Err(ConstraintError::InvalidGrammar { line, column, message }) => (line, column, message),
        other => panic!("{text:?}: {:?}", other.map(|_| "compiled")),
    };
    let (line, column, message) = error("root ::= item+\nitem ::= \"a\" | undefined-rule\n");
    assert_eq!((line, column), (2, 16));
    assert!(message.contains("undefined rule `undefined-rule`"), "{message}");
    let (line, column, message) = error("root ::= \"a\"\n\nroot ::= \"b\"");
    assert_eq!((line, column), (3, 1));
    assert!(message.contains("defined twice"), "{message}");
    assert!(error("item ::= \"a\"").2.contains("no rule named `root`"));
    assert!(error("").2.contains("no rule named `root`"));
    let (line, column, _) = error("root ::= [a-z\n");
    assert_eq!((line, column), (1, 10));
    let (line, column, message) = error("root ::= \"a\"\n  x ::= \"b\" )");
    assert_eq!((line, column, message.as_str()), (2, 13, "unmatched `)`"));
    // A root that cannot finish (only recursion, no way out).
    let (line, column, message) = error("# comment\nroot ::= \"(\" root \")\"");
    assert_eq!((line, column), (2, 1));
    assert!(message.contains("matches no finite text"), "{message}");
    assert!(error("root ::= a\na ::= \"x\" b\nb ::= \"y\" a").2.contains("no finite text"));
    let display =
        ConstraintError::InvalidGrammar { line: 2, column: 16, message: "undefined rule `x`".into() };
    assert_eq!(display.to_string(), "invalid grammar at line 2, column 16: undefined rule `x`");
}

#[test]
fn grammars_that_need_lookahead_are_refused_not_run_inexactly() {
    let (vocab, _) = vocab();
    let unsupported = |text: &str| match Grammar::from_gbnf(vocab.clone(), text) {
        Err(ConstraintError::UnsupportedGrammar { rule, message }) => (rule, message),
        other => panic!("{text:?}: {:?}", other.map(|_| "compiled")),
    };
    // Is the space in "c c a a" inside the inner `root` or the outer one? Both parse.
    let (rule, message) = unsupported("root ::= \"c\" root (\" \" root)* | \"a\"");
    assert_eq!(rule, "root");
    assert!(message.contains("a space could either continue it or come after it"), "{message}");
    assert!(message.contains("after `c"), "{message}");
    // Left recursion hidden behind an optional part.
    let (_, message) = unsupported("root ::= \"a\"? root \"b\" | \"c\"");
    assert!(message.contains("left recursion"), "{message}");
    // After `(`, is it `x`'s bracket or the `"(" "b" ")"`? Only the next character says.
    let (rule, message) = unsupported("root ::= x \"a\" | \"(\" \"b\" \")\"\nx ::= \"(\" x \")\" | \"c\"");
    assert_eq!(rule, "x");
    assert!(message.contains("at the start of root, `(` could either begin"), "{message}");
    // Two bracketed forms that begin alike are fine: the rule is the whole definition.
    assert!(Grammar::from_gbnf(
        vocab.clone(),
        "root ::= v\nv ::= \"[\" v \"]\" | \"[\" v \",\" v \"]\" | \"a\""
    )
    .is_ok());
    let display = ConstraintError::UnsupportedGrammar { rule: "v".into(), message: "m".into() };
    assert_eq!(display.to_string(), "unsupported grammar (rule `v`): m");
}

#[test]
fn rewritten_recursion_runs_as_written() {
    let (vocab, eos) = vocab();
    let mut rng = Rng(15);
    let cases: [(&str, &[&str], &[&str]); 6] = [
        // A rule that is only another rule's name, in a cycle.
        ("root ::= \"x\" a | \"y\"\na ::= root", &["y", "xy", "xxy"], &["x", ""]),
        ("root ::= a\na ::= b\nb ::= \"(\" a \")\" | \"z\"", &["z", "(z)", "((z))"], &["(z", "z)"]),
        // Left recursion, directly and through another rule.
        (
            "root ::= e\ne ::= e \"+\" t | t\nt ::= t \"*\" f | f\nf ::= \"(\" e \")\" | [0-9]+",
            &["1", "1+2*3", "(1+2)*3", "((1))*(2+3)+4"],
            &["", "1+", "(1", "1)", "+1"],
        ),
        (
            "root ::= a\na ::= b \"x\" | \"y\"\nb ::= a \"z\" | \"w\"",
            &["y", "wx", "yzx", "wxzx"],
            &["yz", "w", "x"],
        ),
        // Right recursion: a list, and recursive whitespace.
        ("root ::= item \",\" root | item\nitem ::= [a-z]+", &["a", "a,b", "ab,cd,e"], &["", "a,", ",a"]),
        ("root ::= \"x\" ws \"y\"\nws ::= ([ \\t\\n] ws)?", &["xy", "x y", "x \n\t y"], &["x", "x y y"]),
    ];
    for (text, good, bad) in cases {
        let grammar = Grammar::from_gbnf(vocab.clone(), text).unwrap();
        for doc in good {
            assert!(accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{text}: {doc:?}");
        }
        for doc in bad {
            assert!(!accepts(&grammar, &vocab, eos, doc, &mut rng, true), "{text}: {doc:?}");
        }
    }
    // A long list does not grow the matcher's stack: right recursion became a loop.
    let grammar =
        Grammar::from_gbnf(vocab, "root ::= \"[\" items \"]\"\nitems ::= \"a\" (\",\" items)?").unwrap();
    let mut matcher = Matcher::new(grammar);
    assert!(matcher.accept_str("[a"));
    let depth = matcher.stack_depth();
    assert!(matcher.accept_str(&",a".repeat(200)));
    assert_eq!(matcher.stack_depth(), depth);
    assert!(matcher.accept_str("]") && matcher.can_end());
}

#[test]
fn characters_are_unicode_scalar_values() {
    let (vocab, eos) = vocab();
    let mut rng = Rng(16);
    let any = Grammar::from_gbnf(vocab.clone(), "root ::= . .").unwrap();
    for doc in ["ab", "\n\t", "é中", "😀a"] {
        assert!(accepts(&any, &vocab, eos, doc, &mut rng, true), "{doc:?}");
    }
    assert!(!accepts(&any, &vocab, eos, "abc", &mut rng, true));
    let escapes =
        Grammar::from_gbnf(vocab.clone(), r#"root ::= "\xE9" [\u4E00-\u9FFF] "\U0001F600" [^a]"#).unwrap();
    assert!(accepts(&escapes, &vocab, eos, "é中😀b", &mut rng, true));
    assert!(!accepts(&escapes, &vocab, eos, "é中😀a", &mut rng, true));
    // `\xE9` is the character é, never the lone byte 0xE9.
    let mut matcher = Matcher::new(escapes);
    assert!(!matcher.accept_bytes(&[0xE9]));
}

#[test]
fn hostile_grammars_stop_at_the_limits() {
    let (vocab, _) = vocab();
    let too_large = |text: &str| match Grammar::from_gbnf(vocab.clone(), text) {
        Err(ConstraintError::GrammarTooLarge { message }) => message,
        other => panic!("{:?}...: {:?}", &text[..text.len().min(80)], other.map(|_| "compiled")),
    };
    // Each rule uses the next twice: inlined, 2^40 copies.
    let doubling: String = (0..40).map(|i| format!("a{i} ::= a{} a{}\n", i + 1, i + 1)).collect();
    let message = too_large(&format!("root ::= a0\n{doubling}a40 ::= \"x\"\n"));
    assert!(message.contains("inlining"), "{message}");
    // Huge counts.
    too_large("root ::= ([a-z]{100000}){100000}");
    // Thousands of recursive rules (each bracket body differs).
    let many: String = (0..400).map(|i| format!("r{i} ::= \"(\" r{i} \"{i}\" \")\" | \"x\"\n")).collect();
    let uses: Vec<String> = (0..400).map(|i| format!("r{i}")).collect();
    let message = too_large(&format!("root ::= {}\n{many}", uses.join(" ")));
    assert!(message.contains("recursive rules"), "{message}");
    // A chain of rules thousands deep.
    let chain: String = (0..3000).map(|i| format!("c{i} ::= \"x\" c{}\n", i + 1)).collect();
    let message = too_large(&format!("root ::= c0\n{chain}c3000 ::= \"y\"\n"));
    assert!(message.contains("deep"), "{message}");
    // Over a megabyte of grammar text.
    too_large(&format!("root ::= \"{}\"", "a".repeat(1 << 20)));
    // Parentheses nested past the parser's limit: an error with a position.
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(500), ")".repeat(500));
    assert!(matches!(Grammar::from_gbnf(vocab.clone(), &deep), Err(ConstraintError::InvalidGrammar { .. })));
}

#[test]
fn the_cache_compiles_each_grammar_once() {
    let (vocab, eos) = vocab();
    let cache = GrammarCache::new(vocab.clone(), 16, std::time::Duration::from_secs(30));
    let source = GrammarSource::Gbnf(grammar_file("json"));
    let a = cache.get_or_compile(&source).unwrap();
    let b = cache.get_or_compile(&source).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert!(accepts(&a, &vocab, eos, "{\"a\":[]}", &mut Rng(1), false));
    let bad = GrammarSource::Gbnf("root ::= (".into());
    assert!(matches!(cache.get_or_compile(&bad), Err(ConstraintError::InvalidGrammar { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Text made of grammar syntax, in any order: compiled, or refused with a typed
    /// error; never a panic.
    #[test]
    fn any_text_compiles_or_is_refused(parts in proptest::collection::vec(proptest::sample::select(vec![
        "root ::= ", "a ::= ", "b ::= ", "root", "a", "b", "\"x\"", "\"\"", "\"(\"", "\")\"", "(", ")", "|", "*", "+",
        "?", "{2}", "{1,3}", "{0,}", "[a-z]", "[^\"]", ".", "\n", " ", "# c\n", "<", "\\", "\"\\u00e9\"", "::=", "{",
        "'", "é",
    ]), 0..24)) {
        let (vocab, _) = vocab();
        let text: String = parts.concat();
        match Grammar::from_gbnf(vocab, &text) {
            Ok(grammar) => {
                let mut matcher = Matcher::new(grammar);
                let mut mask = vec![0u32; matcher.grammar().vocab().bitmask_words()];
                matcher.fill_next_token_bitmask(&mut mask).unwrap();
                let _ = matcher.accept_str("x(x)");
            }
            Err(
                ConstraintError::InvalidGrammar { .. }
                | ConstraintError::UnsupportedGrammar { .. }
                | ConstraintError::GrammarTooLarge { .. },
            ) => {}
            Err(other) => prop_assert!(false, "{text:?}: {other}"),
        }
    }
}
