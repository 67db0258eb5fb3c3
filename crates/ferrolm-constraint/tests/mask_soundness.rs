//! The trie mask equals the brute-force mask (every token's bytes run through the DFA),
//! and the DFA's language equals the `regex` crate's full-match language.

mod common;

use common::{extra_tokens_strategy, oracle, re_strategy, small_vocab, Rng, ALPHABET};
use ferrolm_constraint::{Grammar, Matcher, TokenKind, Vocabulary, DEAD};
use proptest::prelude::*;

fn brute_force_mask(grammar: &Grammar, vocab: &Vocabulary, state: u32) -> Vec<u32> {
    let dfa = grammar.dfa();
    let mut mask = vec![0u32; vocab.bitmask_words()];
    for id in 0..vocab.size() as u32 {
        let allowed = match vocab.kind(id).unwrap() {
            TokenKind::Normal => {
                let bytes = vocab.token_bytes(id).unwrap();
                !bytes.is_empty() && dfa.run(state, bytes) != DEAD
            }
            TokenKind::Eos => dfa.is_accepting(state),
            TokenKind::Special | TokenKind::Absent => false,
        };
        if allowed {
            mask[id as usize / 32] |= 1 << (id % 32);
        }
    }
    mask
}

fn random_text(rng: &mut Rng, max_chars: usize) -> String {
    (0..rng.below(max_chars + 1)).map(|_| ALPHABET[rng.below(ALPHABET.len())]).collect()
}

/// Moore's refinement with every state every round: the reference for
/// `ByteDfa::equivalence_up_to`.
fn naive_equivalence(dfa: &ferrolm_constraint::ByteDfa, depth: usize) -> Vec<u32> {
    let n = dfa.num_states();
    let mut class: Vec<u32> = (0..n).map(|s| u32::from(s != 0)).collect();
    for _ in 0..depth {
        let mut ids = std::collections::HashMap::new();
        class = (0..n)
            .map(|s| {
                let mut signature = vec![class[s]];
                signature.extend((0..=255u8).map(|b| class[dfa.next(s as u32, b) as usize]));
                let fresh = ids.len() as u32;
                *ids.entry(signature).or_insert(fresh)
            })
            .collect();
    }
    class
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn incremental_equivalence_equals_moore(re in re_strategy(), depth in 0usize..12) {
        let dfa = ferrolm_constraint::ByteDfa::from_regex(&re.to_pattern(), &Default::default()).unwrap();
        let fast = dfa.equivalence_up_to(depth);
        let slow = naive_equivalence(&dfa, depth);
        for i in 0..fast.len() {
            for j in 0..fast.len() {
                prop_assert_eq!(fast[i] == fast[j], slow[i] == slow[j], "{} depth {}", re.to_pattern(), depth);
            }
        }
    }

    #[test]
    fn trie_mask_equals_brute_force(re in re_strategy(), extra in extra_tokens_strategy(), seed in any::<u64>()) {
        let pattern = re.to_pattern();
        let (vocab, _) = small_vocab(&extra);
        let grammar = Grammar::from_regex(vocab.clone(), &pattern).unwrap();
        // Every state of the automaton, by both mask paths.
        let mut fresh = vec![0u32; vocab.bitmask_words()];
        for state in 1..grammar.dfa().num_states().min(300) as u32 {
            let expected = brute_force_mask(&grammar, &vocab, state);
            grammar.compute_mask(state, &mut fresh).unwrap();
            prop_assert_eq!(&fresh, &expected, "pattern {} state {}", pattern, state);
            grammar.compute_mask_by_full_walk(state, &mut fresh).unwrap();
            prop_assert_eq!(&fresh, &expected, "full walk: pattern {} state {}", pattern, state);
        }
        // The same grammar behind a trigger (free text first).
        let segment = Grammar::after_trigger("a\"b", &grammar).unwrap();
        for state in 1..segment.dfa().num_states().min(300) as u32 {
            let expected = brute_force_mask(&segment, &vocab, state);
            segment.compute_mask(state, &mut fresh).unwrap();
            prop_assert_eq!(&fresh, &expected, "segment: pattern {} state {}", pattern, state);
        }
        let mut rng = Rng(seed);
        // Through matchers, along members of the language and along random strings.
        let mut texts = Vec::new();
        for _ in 0..4 {
            let mut member = String::new();
            re.sample(&mut rng, &mut member);
            texts.push(member);
            texts.push(random_text(&mut rng, 6));
        }
        for text in &texts {
            let mut matcher = Matcher::new(grammar.clone());
            for (i, &byte) in text.as_bytes().iter().enumerate() {
                let state = grammar.dfa().run(grammar.dfa().start(), &text.as_bytes()[..i]);
                if state == DEAD {
                    break;
                }
                let expected = brute_force_mask(&grammar, &vocab, state);
                // Twice through the matcher: the first fill computes, the second is cached.
                for _ in 0..2 {
                    let mut via_matcher = vec![u32::MAX; vocab.bitmask_words()];
                    matcher.fill_next_token_bitmask(&mut via_matcher).unwrap();
                    prop_assert_eq!(&via_matcher, &expected);
                }
                if !matcher.accept_bytes(&[byte]) {
                    break;
                }
            }
        }
    }

    #[test]
    fn dfa_language_equals_oracle(re in re_strategy(), seed in any::<u64>()) {
        let pattern = re.to_pattern();
        let (vocab, _) = small_vocab(&[]);
        let grammar = Grammar::from_regex(vocab, &pattern).unwrap();
        let oracle = oracle(&pattern);
        let dfa = grammar.dfa();
        let mut rng = Rng(seed);
        for _ in 0..16 {
            let mut member = String::new();
            re.sample(&mut rng, &mut member);
            let state = dfa.run(dfa.start(), member.as_bytes());
            prop_assert!(state != DEAD && dfa.is_accepting(state), "{} rejects member {:?}", pattern, member);
            let other = random_text(&mut rng, 5);
            let state = dfa.run(dfa.start(), other.as_bytes());
            let ours = state != DEAD && dfa.is_accepting(state);
            prop_assert_eq!(ours, oracle.is_match(other.as_bytes()), "{} on {:?}", pattern, other);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// States of a counted repetition take their masks from the index of a loop they
    /// simulate (`region.rs`): inside tokens up to the simulated depth, exits walked
    /// from real states, longer tokens walked alone. Long tokens (up to 40 bytes) make
    /// every part of that matter; the masks must equal the brute-force ones anyway.
    #[test]
    fn simulated_loop_masks_equal_brute_force(
        body in prop::sample::select(vec!["[ab]", "[ab]|é", "a|b|é|c", "[abc]", "a|é"]),
        min in 0usize..10,
        extra_len in 0usize..40,
        tail in prop::sample::select(vec!["\"c[ab]*", "\"(c|cc)", "\"", "\"[ab]{0,3}", "c\""]),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let letters = ["a", "b", "c", "é", "\""];
        let mut extra: Vec<Vec<u8>> = Vec::new();
        for _ in 0..60 {
            let len = 2 + rng.below(38);
            extra.push((0..len).map(|_| letters[rng.below(letters.len())]).collect::<String>().into_bytes());
        }
        let (vocab, _) = small_vocab(&extra);
        let mut fresh = vec![0u32; vocab.bitmask_words()];
        // Loops for the vocabulary to index: masks of every state of these grammars.
        for seed_pattern in ["(?:[ab]|é)*\"c[ab]*", "[ab]*\"", "(?:a|é)*c"] {
            let looping = Grammar::from_regex(vocab.clone(), seed_pattern).unwrap();
            for state in 1..looping.dfa().num_states() as u32 {
                looping.compute_mask(state, &mut fresh).unwrap();
            }
        }
        let pattern = format!("(?:{body}){{{min},{}}}{tail}", min + extra_len);
        let grammar = Grammar::from_regex(vocab.clone(), &pattern).unwrap();
        for state in 1..grammar.dfa().num_states() as u32 {
            let expected = brute_force_mask(&grammar, &vocab, state);
            grammar.compute_mask(state, &mut fresh).unwrap();
            prop_assert_eq!(&fresh, &expected, "pattern {} state {} simulated {:?}", pattern, state, grammar.simulated_depth(state));
        }
    }
}

/// The simulation is taken where it should be: the states of `[ab]{0,40}"` far from
/// the end of the count simulate the loop of `[ab]*"` (indexed first) as deep as the
/// search goes (32 bytes; the longest token has 39), and
/// near the end not at all; every mask equals the brute-force one.
#[test]
fn counted_repetition_simulates_the_indexed_loop() {
    let long: Vec<Vec<u8>> = (2..40).map(|n| "ab".repeat(n).into_bytes()[..n].to_vec()).collect();
    let (vocab, _) = small_vocab(&long);
    let mut mask = vec![0u32; vocab.bitmask_words()];
    let looping = Grammar::from_regex(vocab.clone(), "[ab]*\"").unwrap();
    looping.compute_mask(looping.dfa().start(), &mut mask).unwrap();
    let counted = Grammar::from_regex(vocab.clone(), "[ab]{0,40}\"").unwrap();
    let dfa = counted.dfa();
    let start = dfa.start();
    assert_eq!(counted.simulated_depth(start), Some(32), "searched 32 bytes deep at most");
    let near_end = dfa.run(start, &[b'a'; 36]);
    assert_eq!(counted.simulated_depth(near_end), None, "4 bytes left: too shallow");
    let middle = dfa.run(start, &[b'a'; 25]);
    assert_eq!(counted.simulated_depth(middle), Some(15));
    let deep = dfa.run(start, &[b'a'; 20]);
    assert_eq!(counted.simulated_depth(deep), Some(20), "the long tokens walked from the long-token trie");
    for state in 1..dfa.num_states() as u32 {
        counted.compute_mask(state, &mut mask).unwrap();
        assert_eq!(mask, brute_force_mask(&counted, &vocab, state), "state {state}");
    }
}

/// States outside the loop that no byte string tells from it (here the states that
/// read the first bytes of `ab` or `ba`, whose futures differ only past the quote)
/// simulate it at every depth: their masks need no walk of the long tokens, and the
/// second state's search is answered by what the first proved. Every mask equals the
/// brute-force one.
#[test]
fn states_that_always_simulate_the_loop_take_its_index_whole() {
    let long: Vec<Vec<u8>> = (2..40).map(|n| "ab".repeat(n).into_bytes()[..n].to_vec()).collect();
    let (vocab, _) = small_vocab(&long);
    let mut mask = vec![0u32; vocab.bitmask_words()];
    let looping = Grammar::from_regex(vocab.clone(), "[ab]*\"").unwrap();
    looping.compute_mask(looping.dfa().start(), &mut mask).unwrap();
    let grammar = Grammar::from_regex(vocab.clone(), "[ab]*\"x|ab[ab]*\"y|ba[ab]*\"z").unwrap();
    let dfa = grammar.dfa();
    let start = dfa.start();
    let after_a = dfa.next(start, b'a');
    assert_eq!(grammar.simulated_depth(start), Some(39), "as deep as the longest token");
    assert_eq!(grammar.simulated_depth(after_a), Some(39));
    for state in 1..dfa.num_states() as u32 {
        grammar.compute_mask(state, &mut mask).unwrap();
        assert_eq!(mask, brute_force_mask(&grammar, &vocab, state), "state {state}");
    }
}

/// States of a counted repetition share a cached mask until fewer repetitions remain
/// than the longest token spans; from there on each needs its own.
#[test]
fn counted_repetitions_share_masks_only_where_sound() {
    let extra: Vec<Vec<u8>> =
        (2..=8).map(|k| vec![b'a'; k]).chain([b"ab".to_vec(), b"aab".to_vec()]).collect();
    let (vocab, _) = small_vocab(&extra);
    for pattern in ["a{0,30}b", "a{5,25}", "(?:a{0,12}b){2}"] {
        let grammar = Grammar::from_regex(vocab.clone(), pattern).unwrap();
        assert!(grammar.num_mask_classes() < grammar.dfa().num_states(), "{pattern}: no sharing");
        let mut matcher = Matcher::new(grammar.clone());
        let mut mask = vec![0u32; vocab.bitmask_words()];
        for byte in "a".repeat(12).bytes().chain(*b"b").chain("a".repeat(12).bytes()) {
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            assert_eq!(mask, brute_force_mask(&grammar, &vocab, matcher.state()), "{pattern}");
            if !matcher.accept_bytes(&[byte]) {
                break;
            }
        }
    }
}

/// Regexes that hung the direct NFA reader (an operand repeated zero times left open:
/// `(?:a){0,0}` is what `re_strategy` writes) and others of their kind: empty loops,
/// empty branches in loops, nested and huge counts. Each compiles within seconds (or
/// stops with `GrammarTooLarge`), and the automaton agrees with the `regex` crate on
/// every string of up to four characters over the alphabet.
#[test]
fn zero_counts_empty_loops_and_nested_counts_match_the_oracle() {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    use std::time::Duration;
    let compile = |pattern: &str| {
        let (send, receive) = channel();
        let owned = pattern.to_string();
        std::thread::spawn(move || {
            let _ = send.send(ferrolm_constraint::ByteDfa::from_regex(&owned, &Default::default()));
        });
        match receive.recv_timeout(Duration::from_secs(30)) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => panic!("{pattern}: no automaton in 30 s"),
            Err(RecvTimeoutError::Disconnected) => panic!("{pattern}: panicked"),
        }
    };
    let alphabet = ["a", "b", "é"];
    let mut strings = vec![String::new()];
    for length in 1..=4 {
        let shorter: Vec<String> =
            strings.iter().filter(|s| s.chars().count() == length - 1).cloned().collect();
        strings.extend(shorter.iter().flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}"))));
    }
    for pattern in [
        "a{0}",
        "(?:a){0,0}",
        "(?:a){0,0}b",
        "(?:(?:a){0,0}|b)*",
        "(?:(?:a){0}){3}",
        "(?:a*)*",
        "(?:(?:)*)*b",
        "(?:|a)+",
        "(?:a|)*(?:|b){2,}",
        "(?:(?:|a)*|b*)+",
        "(?:(?:a{0,3}){0,3}){0,3}",
        "(?:(?:a?){2}){1,}b?",
        "(?:é{0,2}|b){2,3}",
        "(?:(?:(?:(?:)*){1000}){1000}){1000}",
        "(?:(?:(?:a{0}){1000}){1000}){1000}b",
    ] {
        let dfa = compile(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
        let oracle = oracle(pattern);
        for text in &strings {
            let state = dfa.run(dfa.start(), text.as_bytes());
            let ours = state != DEAD && dfa.is_accepting(state);
            assert_eq!(ours, oracle.is_match(text.as_bytes()), "{pattern} on {text:?}");
        }
    }
    for pattern in ["[a-z]{10000000}", "(?:(?:[ab]{1000}){1000}){1000}", "(?:(?:(?:a|){1000}){1000}){1000}"] {
        match compile(pattern) {
            Err(ferrolm_constraint::ConstraintError::GrammarTooLarge { .. }) => {}
            other => panic!("{pattern}: {:?}", other.map(|d| d.num_states())),
        }
    }
}
