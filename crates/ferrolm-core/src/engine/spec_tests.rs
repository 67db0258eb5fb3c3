//! Speculative decoding by lookup: drafts verified in one forward change no output token
//! (greedy or seeded), leave the sampled distribution the target's, and keep every KV
//! slot accounted for whatever is kept or rejected.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// Prompts that repeat themselves, so a copying model's output is there to be drafted.
fn copy_prompts() -> Vec<Vec<u32>> {
    (0..8u32)
        .map(|i| {
            let passage: Vec<u32> = (0..(20 + i * 5)).map(|j| (i * 37 + j * 11) % 250).collect();
            let mut p = passage.clone();
            p.extend(&passage[..(3 + i as usize) % passage.len()]);
            p.extend([251, 252]);
            p.extend(&passage[..4]);
            p
        })
        .collect()
}

fn speculating(on: bool, f: impl FnOnce(&mut EngineConfig)) -> EngineConfig {
    config(|c| {
        c.speculative = on;
        f(c);
    })
}

type Outputs = BTreeMap<u64, (Vec<u32>, String, Finished)>;

/// Every copy prompt under `params(i)`, batched, on a model that copies with `bonus`.
fn run_copies(
    cfg: &EngineConfig,
    bonus: f32,
    params: impl Fn(usize) -> RequestParams,
) -> (Outputs, EngineStats) {
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::copying(cfg.kv_capacity, bonus);
    for (i, p) in copy_prompts().iter().enumerate() {
        engine.submit(i as u64, p, params(i), None).unwrap();
    }
    let out = drain(&mut engine, &mut model);
    let load = engine.load();
    assert_eq!(load.kv_used, load.cached_tokens, "every slot is free or cached at the end");
    (out, engine.stats())
}

fn mixed_params(i: usize) -> RequestParams {
    let mut p = if i % 2 == 0 { greedy(24 + i) } else { sampled(Some(i as u64), 24 + i) };
    if i % 3 == 0 {
        p.stops.stop_strings = vec!["<2".into()];
    }
    if i == 5 {
        p.sampling.logprobs = true;
        p.sampling.top_logprobs = 2;
    }
    p
}

#[test]
fn speculation_changes_no_token_greedy_or_seeded() {
    for bonus in [20.0, 4.0] {
        let (plain, plain_stats) = run_copies(&speculating(false, |_| {}), bonus, mixed_params);
        let (spec, stats) = run_copies(&speculating(true, |_| {}), bonus, mixed_params);
        assert_eq!(spec, plain, "copy bonus {bonus}");
        assert_eq!(plain_stats.spec_drafts, 0);
        assert!(stats.spec_accepted_tokens > 0, "drafts were kept: {stats:?}");
        assert!(stats.spec_accepted_tokens < stats.spec_draft_tokens, "and some rejected: {stats:?}");
        if bonus > 10.0 {
            // a model that mostly copies: most drafts are kept
            assert!(stats.steps * 2 < plain_stats.steps, "fewer steps: {stats:?} against {plain_stats:?}");
        }
        let histogram: u64 = stats.spec_accepted_histogram.iter().sum();
        assert_eq!(histogram, stats.spec_drafts);
        // chunked prefill, a small batch and a pool tight enough to retract
        for tweak in [
            (|c: &mut EngineConfig| c.max_prefill_tokens = 7) as fn(&mut EngineConfig),
            |c| c.max_running_requests = 3,
            |c| c.kv_capacity = 150,
            |c| c.speculative_max_draft = 1,
        ] {
            let (again, _) = run_copies(&speculating(true, tweak), bonus, mixed_params);
            assert_eq!(again, plain, "copy bonus {bonus}, tweaked");
        }
    }
}

#[test]
fn a_request_opts_in_or_out_of_the_engines_default() {
    let opt = |on: Option<bool>| move |i: usize| RequestParams { speculative: on, ..greedy(20 + i) };
    let (_, off) = run_copies(&speculating(false, |_| {}), 20.0, opt(None));
    assert_eq!(off.spec_drafts, 0);
    let (_, on) = run_copies(&speculating(false, |_| {}), 20.0, opt(Some(true)));
    assert!(on.spec_drafts > 0);
    let (_, out) = run_copies(&speculating(true, |_| {}), 20.0, opt(Some(false)));
    assert_eq!(out.spec_drafts, 0);
}

#[test]
fn drafts_stop_at_max_new_tokens_and_the_context() {
    let cfg = speculating(true, |c| c.speculative_max_draft = 8);
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::copying(cfg.kv_capacity, 30.0);
    let p = &copy_prompts()[2];
    engine.submit(1, p, greedy(5), None).unwrap();
    let mut generated = 0;
    while engine.has_work() {
        let plan = engine.schedule().unwrap();
        for (b, &k) in plan.drafted.iter().enumerate() {
            // the step emits the kept drafts and one token more: never past max_new_tokens
            assert!(generated + (k as usize) < 5, "entry {b} drafts {k} after {generated}");
        }
        let mut logits = model.forward(&plan);
        let out = engine.commit(&mut logits, VOCAB).unwrap();
        generated += out.token_ids.len();
        engine.check_invariants().unwrap();
    }
    assert_eq!(generated, 5);
    assert!(engine.stats().spec_drafts > 0);
}

#[test]
fn the_plan_asks_for_a_logit_row_per_draft_token_and_one_more() {
    let cfg = speculating(true, |_| {});
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::copying(cfg.kv_capacity, 30.0);
    engine.submit(1, &copy_prompts()[0], greedy(40), None).unwrap();
    engine.submit(2, &copy_prompts()[1], greedy(40), Some(Box::new(AllowList::new(VOCAB, &[7, 8])))).unwrap();
    let mut saw_draft = false;
    while engine.has_work() {
        let plan = engine.schedule().unwrap();
        let mut rows = Vec::new();
        for b in 0..plan.num_requests() {
            let end = plan.qo_offsets[b + 1];
            rows.extend(end - 1 - plan.drafted[b]..end);
        }
        assert_eq!(plan.logit_rows, rows);
        saw_draft |= plan.has_drafts();
        assert!(!plan.has_drafts() || !plan.all_plain_greedy(), "a draft is verified on the host");
        if plan.has_drafts() {
            assert!(matches!(engine.sampling_batch(), Err(EngineError::Protocol(_))));
        }
        let mut logits = model.forward(&plan);
        engine.commit(&mut logits, VOCAB).unwrap();
        engine.check_invariants().unwrap();
    }
    assert!(saw_draft);
}

#[test]
fn tokens_given_per_row_keep_the_drafts_they_agree_with() {
    let cfg = speculating(true, |_| {});
    // what the copying model says, committed as if a runner had drawn it
    let (reference, _) = run_copies(&cfg, 30.0, |i| greedy(20 + i));
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::copying(cfg.kv_capacity, 30.0);
    for (i, p) in copy_prompts().iter().enumerate() {
        engine.submit(i as u64, p, greedy(20 + i), None).unwrap();
    }
    let mut acc = Default::default();
    while engine.has_work() {
        let plan = engine.schedule().unwrap();
        let logits = model.forward(&plan);
        let tokens: Vec<u32> = logits
            .chunks(VOCAB)
            .map(|row| (0..VOCAB).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a))).unwrap() as u32)
            .collect();
        let out = engine.commit_tokens(&tokens).unwrap();
        record(&mut acc, &out);
        engine.check_invariants().unwrap();
    }
    let given: Vec<Vec<u32>> = acc.into_values().map(|v| v.0).collect();
    let reference: Vec<Vec<u32>> = reference.into_values().map(|v| v.0).collect();
    assert_eq!(given, reference);
    assert!(engine.stats().spec_accepted_tokens > 0);
}

/// The softmax of `row` at temperature 1.
fn probabilities(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = row.iter().map(|&l| (l as f64 - max).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

/// Pearson's chi-square of `counts` against `expected` shares of `n`, bins with an
/// expected count under 5 merged; returns (statistic, degrees of freedom).
fn chi_square(counts: &[usize], expected: &[f64], n: usize) -> (f64, usize) {
    let (mut stat, mut bins, mut rest_o, mut rest_e) = (0.0, 0, 0.0, 0.0);
    for (&o, &p) in counts.iter().zip(expected) {
        let e = p * n as f64;
        if e < 5.0 {
            rest_o += o as f64;
            rest_e += e;
        } else {
            stat += (o as f64 - e).powi(2) / e;
            bins += 1;
        }
    }
    if rest_e > 0.0 {
        stat += (rest_o - rest_e).powi(2) / rest_e.max(1e-9);
        bins += 1;
    }
    (stat, bins - 1)
}

/// The 0.1% critical value of chi-square with `df` degrees of freedom (Wilson-Hilferty).
fn critical(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.09;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[test]
fn sampled_tokens_keep_the_target_distribution_under_speculation() {
    // a prompt whose last token was followed by several others before, so that every
    // likely first token has a draft on offer, which the copying model half agrees with
    let mut prompt = Vec::new();
    for t in 0..EOS {
        prompt.extend([5, t, 9]);
    }
    prompt.push(5);
    let bonus = 12.0;
    let n = 4000;
    let cfg = speculating(true, |c| c.seed = 11);
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::copying(cfg.kv_capacity, bonus);
    for rid in 0..n as u64 {
        engine.submit(rid, &prompt, sampled(None, 3), None).unwrap();
    }
    let out = drain(&mut engine, &mut model);
    let stats = engine.stats();
    assert!(stats.spec_accepted_tokens > 100, "drafts were kept: {stats:?}");
    assert!(stats.spec_draft_tokens > stats.spec_accepted_tokens + 100, "and rejected: {stats:?}");
    // the exact law of the second token, and of the third after a second that was the
    // draft's (9: its row is the one past the kept draft token), from the model's rows
    let first = probabilities(&fake_row(&prompt, bonus));
    let (mut second, mut third_after_9) = (vec![0.0; VOCAB], vec![0.0; VOCAB]);
    let mut ctx = prompt.clone();
    for (t1, &p1) in first.iter().enumerate() {
        ctx.push(t1 as u32);
        let p2 = probabilities(&fake_row(&ctx, bonus));
        for (t2, &p) in p2.iter().enumerate() {
            second[t2] += p1 * p;
        }
        ctx.push(9);
        for (t3, &p3) in probabilities(&fake_row(&ctx, bonus)).iter().enumerate() {
            third_after_9[t3] += p1 * p2[9] * p3;
        }
        ctx.truncate(prompt.len());
    }
    let z: f64 = third_after_9.iter().sum();
    third_after_9.iter_mut().for_each(|p| *p /= z);
    let mut counts = (vec![0usize; VOCAB], vec![0usize; VOCAB]);
    for (tokens, _, _) in out.values() {
        counts.0[tokens[1] as usize] += 1;
        if tokens[1] == 9 {
            counts.1[tokens[2] as usize] += 1;
        }
    }
    let after_9: usize = counts.1.iter().sum();
    assert!(after_9 > 1000, "the draft token came second {after_9} times");
    for (what, counts, law, n) in
        [("second", &counts.0, &second, n), ("third after a kept draft", &counts.1, &third_after_9, after_9)]
    {
        let (stat, df) = chi_square(counts, law, n);
        assert!(df >= 5, "a law with a few likely tokens: df {df}");
        assert!(stat < critical(df), "{what} token: chi-square {stat:.1} with {df} df");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random prompts, knobs, aborts, failed steps and pool sizes with speculation on:
    /// after every call each slot is free, cached or held once, and nothing leaks.
    #[test]
    fn kv_is_conserved_under_random_accept_and_reject(
        seed in any::<u64>(),
        capacity in 120usize..600,
        bonus in prop::sample::select(vec![0.0f32, 3.0, 30.0]),
        max_draft in 1usize..9,
    ) {
        use crate::sampling::RequestRng;
        let mut rng = RequestRng::new(seed);
        let mut pick = |n: u64| (rng.next_u64() % n) as usize;
        let cfg = speculating(true, |c| {
            c.kv_capacity = capacity;
            c.max_prefill_tokens = 48;
            c.speculative_max_draft = max_draft;
        });
        let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
        let mut model = FakeModel::copying(capacity, bonus);
        let prompts = copy_prompts();
        let mut live: Vec<u64> = Vec::new();
        let mut next = 0u64;
        let mut finished = 0usize;
        for _ in 0..400 {
            if next < 40 && pick(3) == 0 {
                let p = &prompts[pick(prompts.len() as u64)];
                let p = &p[..(1 + pick(p.len() as u64)).min(capacity / 3)];
                let mut params = if pick(2) == 0 { greedy(1 + pick(30)) } else { sampled(None, 1 + pick(30)) };
                if pick(4) == 0 {
                    params.ignore_eos = false;
                    params.stops.stop_strings = vec!["<1".into()];
                }
                let n = if pick(5) == 0 { 2 } else { 1 };
                let rids: Vec<u64> = (next..next + n).collect();
                let constraint = (pick(6) == 0).then(|| Constraint::AllowedTokens(vec![7, 8, 9, 251]));
                engine.submit_samples(&rids, p, params, constraint).unwrap();
                live.extend(&rids);
                next += n;
            }
            let plan = engine.schedule().unwrap();
            engine.check_invariants().map_err(TestCaseError::fail)?;
            if !live.is_empty() && pick(15) == 0 {
                let rid = live.swap_remove(pick(live.len() as u64));
                engine.abort(rid);
            }
            let out = if plan.is_empty() {
                engine.take_outputs()
            } else if pick(20) == 0 {
                engine.fail_step("injected")
            } else {
                let mut logits = model.forward(&plan);
                engine.commit(&mut logits, VOCAB).unwrap()
            };
            engine.check_invariants().map_err(TestCaseError::fail)?;
            finished += out.finished.iter().filter(|f| f.is_some()).count();
            if next >= 40 && !engine.has_work() {
                break;
            }
        }
        while engine.has_work() {
            let out = step(&mut engine, &mut model);
            finished += out.finished.iter().filter(|f| f.is_some()).count();
        }
        prop_assert_eq!(finished as u64, next);
        let load = engine.load();
        prop_assert_eq!(load.kv_used, load.cached_tokens);
    }
}

#[test]
fn a_repeated_request_drafts_what_the_cache_holds_after_its_tokens() {
    // a model that copies nothing: the n-gram drafts miss, the cache's continuation of
    // the same prompt (the first request's output) is kept whole
    let cfg = speculating(true, |_| {});
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    let prompt: Vec<u32> = (0..30).map(|i| (i * 17 % 250) as u32).collect();
    engine.submit(1, &prompt, greedy(40), None).unwrap();
    let first = drain(&mut engine, &mut model);
    let before = engine.stats();
    engine.submit(2, &prompt, greedy(40), None).unwrap();
    let second = drain(&mut engine, &mut model);
    assert_eq!(second[&2].0, first[&1].0, "the same greedy tokens");
    let after = engine.stats();
    let kept = after.spec_accepted_tokens - before.spec_accepted_tokens;
    assert!(kept >= 30, "most of the 40 tokens came from the cache's drafts: {kept}");
    assert!(after.steps - before.steps <= 12, "{} steps", after.steps - before.steps);
    // off without the prefix cache: nothing to continue from
    let mut engine = Engine::new(speculating(true, |c| c.enable_prefix_cache = false), vocab()).unwrap();
    engine.submit(1, &prompt, greedy(40), None).unwrap();
    drain(&mut engine, &mut model);
    engine.submit(2, &prompt, greedy(40), None).unwrap();
    drain(&mut engine, &mut model);
    assert!(engine.stats().spec_accepted_tokens < 10);
}

#[test]
fn no_draft_while_a_thinking_budget_forces_the_next_token() {
    let cfg = speculating(true, |_| {});
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::copying(cfg.kv_capacity, 30.0);
    let mut p = greedy(40);
    p.thinking =
        Some(ThinkingBudget { budget: 6, start_ids: vec![249], end_ids: vec![250, 251], open: true });
    engine.submit(1, &copy_prompts()[0], p, None).unwrap();
    let (mut forced_steps, mut drafted_steps) = (0, 0);
    let mut tokens = Vec::new();
    while engine.has_work() {
        let forced = engine.requests.get(&1).is_some_and(|r| r.forced_token().is_some());
        let plan = engine.schedule().unwrap();
        if forced {
            forced_steps += 1;
            assert_eq!(plan.drafted, [0], "the forced token is not drafted over");
        } else if plan.drafted.iter().any(|&k| k > 0) {
            drafted_steps += 1;
        }
        let mut logits = model.forward(&plan);
        engine.commit(&mut logits, VOCAB).unwrap();
        engine.check_invariants().unwrap();
        if let Some(r) = engine.requests.get(&1) {
            tokens.clone_from(&r.tokens);
        }
    }
    // the first marker token may close a kept draft (drawn under the budget's mask in
    // that step's last row), the second then comes alone
    assert!(forced_steps >= 1, "the markers were forced");
    assert!(tokens.windows(2).any(|w| w == [250, 251]), "both marker tokens were written");
    assert!(drafted_steps > 0, "and drafts ran around them");
}
