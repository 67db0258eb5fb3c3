//! Property tests of the matcher: members of the language are accepted under random
//! tokenizations, every allowed token can still be completed, rollback restores state,
//! jump-forward bytes agree with the mask.

mod common;

use std::collections::{HashMap, VecDeque};

use common::{
    allowed_ids, extra_tokens_strategy, oracle, random_tokenization, re_strategy, small_vocab, Rng,
};
use ferrolm_constraint::{ByteDfa, Grammar, Matcher, DEAD};
use proptest::prelude::*;

/// The shortest byte string taking `state` to acceptance, by breadth-first search.
fn shortest_completion(dfa: &ByteDfa, state: u32) -> Option<Vec<u8>> {
    let mut parent: HashMap<u32, (u32, u8)> = HashMap::new();
    let mut queue = VecDeque::from([state]);
    let mut seen = std::collections::HashSet::from([state]);
    while let Some(s) = queue.pop_front() {
        if dfa.is_accepting(s) {
            let mut path = Vec::new();
            let mut cur = s;
            while cur != state {
                let (prev, byte) = parent[&cur];
                path.push(byte);
                cur = prev;
            }
            path.reverse();
            return Some(path);
        }
        for byte in 0..=255u8 {
            let next = dfa.next(s, byte);
            if next != DEAD && seen.insert(next) {
                parent.insert(next, (s, byte));
                queue.push_back(next);
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn members_are_accepted_under_random_tokenizations(
        re in re_strategy(), extra in extra_tokens_strategy(), seed in any::<u64>()
    ) {
        let pattern = re.to_pattern();
        let (vocab, eos) = small_vocab(&extra);
        let grammar = Grammar::from_regex(vocab.clone(), &pattern).unwrap();
        let mut rng = Rng(seed);
        let mut mask = vec![0u32; vocab.bitmask_words()];
        for _ in 0..4 {
            let mut member = String::new();
            re.sample(&mut rng, &mut member);
            let tokens = random_tokenization(&vocab, member.as_bytes(), &mut rng);
            let mut matcher = Matcher::new(grammar.clone());
            for &token in &tokens {
                matcher.fill_next_token_bitmask(&mut mask).unwrap();
                prop_assert!(mask[token as usize / 32] >> (token % 32) & 1 == 1,
                    "{} masks out token {} of member {:?}", pattern, token, member);
                prop_assert!(matcher.accept_token(token));
            }
            prop_assert!(matcher.can_end());
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            prop_assert!(mask[eos as usize / 32] >> (eos % 32) & 1 == 1);
            prop_assert!(matcher.accept_token(eos));
            prop_assert!(matcher.is_ended() && matcher.must_end());
            prop_assert!(!matcher.accept_token(tokens.first().copied().unwrap_or(0)));
        }
    }

    #[test]
    fn every_allowed_token_can_be_completed(
        re in re_strategy(), extra in extra_tokens_strategy(), seed in any::<u64>()
    ) {
        let pattern = re.to_pattern();
        let oracle = oracle(&pattern);
        let (vocab, eos) = small_vocab(&extra);
        let grammar = Grammar::from_regex(vocab.clone(), &pattern).unwrap();
        let mut rng = Rng(seed);
        let mut matcher = Matcher::new(grammar.clone());
        let mut output: Vec<u8> = Vec::new();
        let mut mask = vec![0u32; vocab.bitmask_words()];
        for _ in 0..6 {
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            let allowed = allowed_ids(&mask, mask.len() * 32);
            prop_assert!(!allowed.is_empty(), "{}: nothing allowed after {:?}", pattern, output);
            prop_assert_eq!(allowed.contains(&eos), matcher.can_end());
            prop_assert_eq!(allowed == vec![eos], matcher.must_end());
            for &token in &allowed {
                if token == eos {
                    prop_assert!(oracle.is_match(&output));
                    continue;
                }
                let mut next = matcher.clone();
                prop_assert!(next.accept_token(token));
                let mut text = output.clone();
                text.extend_from_slice(vocab.token_bytes(token).unwrap());
                let state = grammar.dfa().run(grammar.dfa().start(), &text);
                let completion = shortest_completion(grammar.dfa(), state);
                prop_assert!(completion.is_some(), "{}: no completion after {:?}", pattern, text);
                text.extend(completion.unwrap());
                prop_assert!(oracle.is_match(&text), "{}: completed {:?} is not a member", pattern, text);
            }
            let choices: Vec<u32> = allowed.into_iter().filter(|&t| t != eos).collect();
            if choices.is_empty() {
                break;
            }
            let token = choices[rng.below(choices.len())];
            output.extend_from_slice(vocab.token_bytes(token).unwrap());
            prop_assert!(matcher.accept_token(token));
        }
    }

    #[test]
    fn free_text_then_trigger_then_member_is_accepted(
        re in re_strategy(), extra in extra_tokens_strategy(), free in "[a-c\"{}<>/é]{0,12}", seed in any::<u64>()
    ) {
        let trigger = "</a>";
        prop_assume!(!free.contains(trigger));
        let (vocab, eos) = small_vocab(&extra);
        let grammar = Grammar::from_regex(vocab.clone(), &re.to_pattern()).unwrap();
        let segment = Grammar::after_trigger(trigger, &grammar).unwrap();
        let mut rng = Rng(seed);
        let mut member = String::new();
        re.sample(&mut rng, &mut member);
        let document = format!("{free}{trigger}{member}");
        let mut matcher = Matcher::new(segment);
        for token in random_tokenization(&vocab, document.as_bytes(), &mut rng) {
            prop_assert!(matcher.accept_token(token), "refused {} in {:?}", token, document);
        }
        prop_assert!(matcher.accept_token(eos));
        // Without the trigger the document can never end.
        let mut untriggered = Matcher::new(Grammar::after_trigger(trigger, &grammar).unwrap());
        prop_assert!(untriggered.accept_str(&free) && !untriggered.can_end());
    }

    #[test]
    fn rollback_restores_earlier_masks(
        re in re_strategy(), extra in extra_tokens_strategy(), seed in any::<u64>()
    ) {
        let (vocab, eos) = small_vocab(&extra);
        let grammar = Grammar::from_regex(vocab.clone(), &re.to_pattern()).unwrap();
        let mut rng = Rng(seed);
        let mut member = String::new();
        re.sample(&mut rng, &mut member);
        let tokens = random_tokenization(&vocab, member.as_bytes(), &mut rng);
        let mut matcher = Matcher::new(grammar);
        let mut masks = Vec::new();
        let mut mask = vec![0u32; vocab.bitmask_words()];
        for &token in tokens.iter().chain([&eos]) {
            matcher.fill_next_token_bitmask(&mut mask).unwrap();
            masks.push(mask.clone());
            prop_assert!(matcher.accept_token(token));
        }
        let steps = rng.below(masks.len()) + 1;
        matcher.rollback(steps).unwrap();
        prop_assert!(!matcher.is_ended());
        prop_assert_eq!(matcher.num_steps(), masks.len() - steps);
        matcher.fill_next_token_bitmask(&mut mask).unwrap();
        prop_assert_eq!(&mask, &masks[masks.len() - steps]);
    }

    #[test]
    fn forced_bytes_agree_with_the_mask(
        re in re_strategy(), extra in extra_tokens_strategy(), seed in any::<u64>()
    ) {
        let (vocab, _) = small_vocab(&extra);
        let grammar = Grammar::from_regex(vocab.clone(), &re.to_pattern()).unwrap();
        let mut rng = Rng(seed);
        let mut member = String::new();
        re.sample(&mut rng, &mut member);
        let mut matcher = Matcher::new(grammar);
        let mut mask = vec![0u32; vocab.bitmask_words()];
        for &byte in member.as_bytes().iter().chain([&0u8]) {
            let forced = matcher.forced_bytes();
            if !forced.is_empty() {
                prop_assert!(!matcher.can_end());
                matcher.fill_next_token_bitmask(&mut mask).unwrap();
                for token in allowed_ids(&mask, mask.len() * 32) {
                    let bytes = vocab.token_bytes(token).unwrap();
                    let n = bytes.len().min(forced.len());
                    prop_assert_eq!(&bytes[..n], &forced[..n]);
                }
                let mut jumped = matcher.clone();
                prop_assert!(jumped.accept_bytes(&forced));
            }
            if !matcher.accept_bytes(&[byte]) {
                break;
            }
        }
    }
}
