//! Engine tests against a fake model that really reads the KV pool: each step writes the
//! new tokens into the slots the plan names, and a request's logits are a hash of the
//! tokens found in the slots it attends to. Wrong slots, stale slots or a wrong order give
//! different tokens, so output identity across cache, batching, chunking and retraction
//! tests the engine's bookkeeping, not just its arithmetic.

use std::sync::Arc;

use super::*;
use crate::detok::{StopConditions, StopReason, TokenTable};
use crate::sampling::SamplingParams;

const VOCAB: usize = 300;
const EOS: u32 = 299;

fn vocab() -> Arc<TokenTable> {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    while tokens.len() < VOCAB - 1 {
        let i = tokens.len();
        tokens.push(format!("<{i}>").into_bytes());
    }
    tokens.push(b"</s>".to_vec());
    Arc::new(TokenTable { tokens, special: vec![EOS] })
}

struct FakeModel {
    kv: Vec<Option<(u32, u32)>>,
}

impl FakeModel {
    fn new(capacity: usize) -> Self {
        FakeModel { kv: vec![None; capacity] }
    }

    fn forward(&mut self, plan: &BatchPlan) -> Vec<f32> {
        for i in 0..plan.num_tokens() {
            self.kv[plan.out_slots[i] as usize] = Some((plan.input_ids[i], plan.positions[i]));
        }
        let mut logits = Vec::with_capacity(plan.num_requests() * VOCAB);
        for b in 0..plan.num_requests() {
            let ctx = &plan.kv_slots[plan.kv_offsets[b] as usize..plan.kv_offsets[b + 1] as usize];
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for (pos, &slot) in ctx.iter().enumerate() {
                let (token, p) = self.kv[slot as usize].expect("attended slot was written");
                assert_eq!(p as usize, pos, "context slots out of position order");
                h = (h ^ token as u64).wrapping_mul(0x100_0000_01b3);
            }
            let last = plan.positions[plan.qo_offsets[b + 1] as usize - 1] as usize;
            assert_eq!(last + 1, ctx.len(), "attends to exactly the tokens up to the last new one");
            for v in 0..VOCAB as u64 {
                let x = (h ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
                logits.push(((x >> 40) % 1000) as f32 / 100.0);
            }
        }
        logits
    }
}

fn config(f: impl FnOnce(&mut EngineConfig)) -> EngineConfig {
    let mut c = EngineConfig {
        kv_capacity: 4096,
        vocab_size: VOCAB,
        eos_token_ids: vec![EOS],
        max_context: 4096,
        ..EngineConfig::default()
    };
    f(&mut c);
    c
}

fn greedy(max_new: usize) -> RequestParams {
    RequestParams {
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        max_new_tokens: max_new,
        ignore_eos: true,
        ..Default::default()
    }
}

/// One step: schedule, run the fake model, commit (or collect outputs when idle), check
/// KV conservation.
fn step(engine: &mut Engine, model: &mut FakeModel) -> StepOutputs {
    let plan = engine.schedule().unwrap();
    let out = if plan.is_empty() {
        engine.take_outputs()
    } else {
        let mut logits = model.forward(&plan);
        engine.commit(&mut logits, VOCAB).unwrap()
    };
    engine.check_invariants().unwrap();
    out
}

/// Runs until everything finished; returns each rid's tokens, text and finish.
fn drain(
    engine: &mut Engine,
    model: &mut FakeModel,
) -> std::collections::BTreeMap<u64, (Vec<u32>, String, Finished)> {
    let mut tokens: std::collections::BTreeMap<u64, (Vec<u32>, String, Option<Finished>)> =
        Default::default();
    let mut steps = 0;
    while engine.has_work() {
        steps += 1;
        assert!(steps < 100_000, "engine made no progress");
        let out = step(engine, model);
        record(&mut tokens, &out);
    }
    tokens.into_iter().map(|(rid, (t, s, f))| (rid, (t, s, f.expect("every request finished")))).collect()
}

fn record(
    acc: &mut std::collections::BTreeMap<u64, (Vec<u32>, String, Option<Finished>)>,
    out: &StepOutputs,
) {
    for i in 0..out.len() {
        let e = acc.entry(out.rids[i]).or_default();
        e.0.extend_from_slice(
            &out.token_ids[out.token_offsets[i] as usize..out.token_offsets[i + 1] as usize],
        );
        e.1.push_str(&out.texts[i]);
        if let Some(f) = &out.finished[i] {
            assert!(e.2.is_none(), "request {} finished twice", out.rids[i]);
            e.2 = Some(f.clone());
        }
    }
}

fn prompts() -> Vec<Vec<u32>> {
    let system: Vec<u32> = (0..40).map(|i| (i * 7 % 250) as u32).collect();
    (0..12u32)
        .map(|i| {
            let mut p = if i % 3 == 0 { Vec::new() } else { system.clone() };
            p.extend((0..(5 + i * 9)).map(|j| (i * 31 + j * 13) % 250));
            p
        })
        .collect()
}

fn run_all(cfg: EngineConfig, one_at_a_time: bool) -> Vec<Vec<u32>> {
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    let mut results = std::collections::BTreeMap::new();
    for (i, p) in prompts().iter().enumerate() {
        engine.submit(i as u64, p, greedy(10 + i % 5), None).unwrap();
        if one_at_a_time {
            results.extend(drain(&mut engine, &mut model));
        }
    }
    results.extend(drain(&mut engine, &mut model));
    let load = engine.load();
    assert_eq!(load.kv_used, load.cached_tokens, "every slot is free or cached at the end");
    results
        .into_values()
        .map(|(t, _, f)| {
            assert_eq!(f.reason, FinishReason::Length);
            t
        })
        .collect()
}

#[test]
fn greedy_output_is_identical_across_cache_batching_chunking_and_retraction() {
    let reference = run_all(config(|c| c.enable_prefix_cache = false), true);
    assert_eq!(reference.len(), 12);
    assert_eq!(run_all(config(|_| {}), true), reference, "cache on, alone");
    assert_eq!(run_all(config(|_| {}), false), reference, "cache on, batched");
    assert_eq!(run_all(config(|c| c.enable_prefix_cache = false), false), reference, "cache off, batched");
    assert_eq!(run_all(config(|c| c.max_prefill_tokens = 7), false), reference, "chunked prefill");
    assert_eq!(run_all(config(|c| c.max_running_requests = 3), false), reference, "small batches");
    // a pool this small forces eviction and retraction while everything is in flight
    let tight = config(|c| {
        c.kv_capacity = 260;
        c.new_token_ratio = 0.0;
        c.fast_lane_tokens = 0;
    });
    let mut engine = Engine::new(tight.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(tight.kv_capacity);
    for (i, p) in prompts().iter().enumerate() {
        engine.submit(i as u64, p, greedy(10 + i % 5), None).unwrap();
    }
    let out = drain(&mut engine, &mut model);
    assert!(engine.stats().retractions > 0, "the test should force retractions");
    assert_eq!(out.into_values().map(|v| v.0).collect::<Vec<_>>(), reference, "retracted and resumed");
}

#[test]
fn prefix_cache_hits_are_counted_and_reported() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let mut model = FakeModel::new(4096);
    let p = prompts()[1].clone();
    engine.submit(1, &p, greedy(4), None).unwrap();
    let first = drain(&mut engine, &mut model);
    assert_eq!(first[&1].2.cached_tokens, 0);
    engine.submit(2, &p, greedy(4), None).unwrap();
    let second = drain(&mut engine, &mut model);
    assert_eq!(second[&2].2.cached_tokens, p.len() - 1, "all but the last prompt token come from the cache");
    assert_eq!(first[&1].0, second[&2].0);
    assert_eq!(engine.stats().cache_hit_tokens, (p.len() - 1) as u64);
}

#[test]
fn stop_strings_eos_and_min_new_tokens() {
    let v = vocab();
    let mut engine = Engine::new(config(|_| {}), v.clone()).unwrap();
    let mut model = FakeModel::new(4096);
    // learn what greedy produces, then stop on its third token's text
    engine.submit(1, &[1, 2, 3], greedy(6), None).unwrap();
    let free = drain(&mut engine, &mut model)[&1].clone();
    let third = String::from_utf8(v.tokens[free.0[2] as usize].clone()).unwrap();
    let stops = StopConditions { stop_strings: vec![third.clone()], ..Default::default() };
    engine.submit(2, &[1, 2, 3], RequestParams { stops: stops.clone(), ..greedy(6) }, None).unwrap();
    let stopped = drain(&mut engine, &mut model)[&2].clone();
    assert_eq!(stopped.2.reason, FinishReason::Stop(StopReason::String(third.clone())));
    assert_eq!(stopped.0, free.0[..3].to_vec());
    assert!(!stopped.1.contains(&third) || free.1.matches(&third).count() > 1);
    // a stop token id ends it, but not before min_new_tokens
    let stop_tok = StopConditions { stop_token_ids: vec![free.0[1]], ..Default::default() };
    engine.submit(3, &[1, 2, 3], RequestParams { stops: stop_tok.clone(), ..greedy(6) }, None).unwrap();
    let s3 = drain(&mut engine, &mut model)[&3].clone();
    assert_eq!(s3.2.reason, FinishReason::Stop(StopReason::Token(free.0[1])));
    assert_eq!(s3.0.len(), 2);
    engine
        .submit(4, &[1, 2, 3], RequestParams { stops: stop_tok, min_new_tokens: 5, ..greedy(6) }, None)
        .unwrap();
    let s4 = drain(&mut engine, &mut model)[&4].clone();
    assert!(s4.0[..5].iter().all(|&t| t != free.0[1]) || s4.0.len() == 6);
    // EOS: force it with a constraint that only allows EOS after the first token
    struct EosAfterOne(usize);
    impl TokenConstraint for EosAfterOne {
        fn fill_mask(&mut self, mask: &mut [u32]) {
            mask.fill(if self.0 == 0 { u32::MAX } else { 0 });
            mask[EOS as usize / 32] |= 1 << (EOS % 32);
            if self.0 == 0 {
                mask[EOS as usize / 32] &= !(1 << (EOS % 32));
            }
        }
        fn accept_token(&mut self, _: u32) -> bool {
            self.0 += 1;
            true
        }
        fn must_end(&self) -> bool {
            self.0 > 0
        }
    }
    let eos_params = RequestParams { ignore_eos: false, ..greedy(6) };
    engine.submit(5, &[1, 2, 3], eos_params, Some(Box::new(EosAfterOne(0)))).unwrap();
    let s5 = drain(&mut engine, &mut model)[&5].clone();
    assert_eq!(s5.2.reason, FinishReason::Stop(StopReason::Token(EOS)));
    assert_eq!(s5.0.len(), 2);
    assert!(!s5.1.contains("</s>"), "EOS text is skipped");
}

#[test]
fn constraint_masks_every_token() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let mut model = FakeModel::new(4096);
    let allowed = [65u32, 66, 67];
    let sampled =
        RequestParams { sampling: SamplingParams { seed: Some(3), ..Default::default() }, ..greedy(30) };
    engine.submit(1, &[1, 2], sampled, Some(Box::new(AllowList::new(VOCAB, &allowed)))).unwrap();
    let out = drain(&mut engine, &mut model);
    assert_eq!(out[&1].0.len(), 30);
    assert!(out[&1].0.iter().all(|t| allowed.contains(t)));
    assert!(out[&1].1.chars().all(|c| "ABC".contains(c)));
}

#[test]
fn same_seed_same_output_alone_or_in_a_batch() {
    let sampled = |seed| RequestParams {
        sampling: SamplingParams { seed: Some(seed), temperature: 1.0, ..Default::default() },
        ..greedy(12)
    };
    let run = |with_others: bool| {
        let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
        let mut model = FakeModel::new(4096);
        if with_others {
            for i in 10..15 {
                engine.submit(i, &prompts()[i as usize % 12], sampled(i), None).unwrap();
            }
        }
        engine.submit(1, &[5, 6, 7], sampled(42), None).unwrap();
        drain(&mut engine, &mut model)[&1].0.clone()
    };
    assert_eq!(run(false), run(true));
}

#[test]
fn bad_requests_are_refused_naming_the_field() {
    let mut engine = Engine::new(config(|c| c.max_context = 64), vocab()).unwrap();
    let field = |r: Result<(), EngineError>| match r.unwrap_err() {
        EngineError::InvalidRequest { field, .. } => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(engine.submit(1, &[], greedy(1), None)), "input_ids");
    assert_eq!(field(engine.submit(1, &[VOCAB as u32], greedy(1), None)), "input_ids");
    assert_eq!(field(engine.submit(1, &[1; 64], greedy(1), None)), "input_ids");
    assert_eq!(field(engine.submit(1, &[1; 10], greedy(60), None)), "max_new_tokens");
    assert_eq!(field(engine.submit(1, &[1], greedy(0), None)), "max_new_tokens");
    assert_eq!(
        field(engine.submit(1, &[1], RequestParams { min_new_tokens: 5, ..greedy(2) }, None)),
        "min_new_tokens"
    );
    let hot =
        RequestParams { sampling: SamplingParams { temperature: -1.0, ..Default::default() }, ..greedy(2) };
    assert_eq!(field(engine.submit(1, &[1], hot, None)), "temperature");
    let stop = RequestParams {
        stops: StopConditions { stop_strings: vec![String::new()], ..Default::default() },
        ..greedy(2)
    };
    assert_eq!(field(engine.submit(1, &[1], stop, None)), "stop");
    engine.submit(1, &[1], greedy(2), None).unwrap();
    assert_eq!(engine.submit(1, &[1], greedy(2), None), Err(EngineError::DuplicateRid(1)));
    assert_eq!(engine.num_requests(), 1);
    let small =
        Engine::new(config(|c| c.kv_capacity = 8), vocab()).unwrap().submit(1, &[1; 8], greedy(1), None);
    assert_eq!(field(small), "input_ids");
    assert!(Engine::new(config(|c| c.kv_capacity = 0), vocab()).is_err());
}

#[test]
fn a_request_too_long_for_the_pool_finishes_with_an_error() {
    let mut engine = Engine::new(config(|c| c.kv_capacity = 16), vocab()).unwrap();
    let mut model = FakeModel::new(16);
    engine.submit(1, &[1; 10], greedy(20), None).unwrap();
    let out = drain(&mut engine, &mut model);
    assert!(
        matches!(out[&1].2.reason, FinishReason::Error(ref m) if m.contains("KV pool")),
        "{:?}",
        out[&1].2
    );
    assert_eq!(engine.load().kv_used, engine.load().cached_tokens);
}

#[test]
fn commit_checks_the_protocol() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    assert!(engine.commit(&mut [], VOCAB).is_ok(), "nothing in flight, nothing to do");
    engine.submit(1, &[1, 2], greedy(2), None).unwrap();
    let plan = engine.schedule().unwrap();
    assert!(matches!(engine.schedule(), Err(EngineError::Protocol(_))));
    assert!(matches!(engine.commit(&mut vec![0.0; VOCAB - 1], VOCAB - 1), Err(EngineError::Protocol(_))));
    let mut model = FakeModel::new(4096);
    let mut logits = model.forward(&plan);
    engine.commit(&mut logits, VOCAB).unwrap();
}

#[test]
fn abort_anywhere_frees_everything() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let mut model = FakeModel::new(4096);
    for i in 0..6 {
        engine.submit(i, &prompts()[i as usize], greedy(50), None).unwrap();
    }
    let plan = engine.schedule().unwrap();
    assert!(engine.abort(0), "in flight: finished at commit");
    let mut logits = model.forward(&plan);
    let out = engine.commit(&mut logits, VOCAB).unwrap();
    let pos = out.rids.iter().position(|&r| r == 0).unwrap();
    assert_eq!(out.finished[pos].as_ref().unwrap().reason, FinishReason::Abort);
    assert!(engine.abort(1));
    assert!(!engine.abort(99));
    assert_eq!(engine.abort_all(), 4);
    let out = engine.take_outputs();
    assert_eq!(out.len(), 5);
    engine.check_invariants().unwrap();
    assert_eq!(engine.load().running, 0);
    assert_eq!(engine.load().kv_used, engine.load().cached_tokens);
    assert!(engine.flush_cache());
    assert_eq!(engine.load().kv_used, 0);
}

#[test]
fn commit_tokens_takes_externally_sampled_tokens() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    engine.submit(1, &[1, 2], greedy(3), None).unwrap();
    let mut all = Vec::new();
    while engine.has_work() {
        let plan = engine.schedule().unwrap();
        let out = engine.commit_tokens(&vec![72; plan.num_requests()]).unwrap();
        all.extend_from_slice(&out.token_ids);
    }
    assert_eq!(all, vec![72, 72, 72]);
    engine.submit(2, &[1, 2], greedy(3), Some(Box::new(AllowList::new(VOCAB, &[65])))).unwrap();
    engine.schedule().unwrap();
    let out = engine.commit_tokens(&[72]).unwrap();
    assert!(matches!(out.finished[0].as_ref().unwrap().reason, FinishReason::Error(_)));
}

#[test]
fn priority_and_queue_timeout() {
    let mut engine = Engine::new(
        config(|c| {
            c.schedule_policy = SchedulePolicy::Priority;
            c.max_running_requests = 1;
        }),
        vocab(),
    )
    .unwrap();
    let mut model = FakeModel::new(4096);
    engine.submit(1, &[1], RequestParams { priority: 0, ..greedy(2) }, None).unwrap();
    engine.submit(2, &[2], RequestParams { priority: 5, ..greedy(2) }, None).unwrap();
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.rids, vec![2]);
    let mut logits = model.forward(&plan);
    engine.commit(&mut logits, VOCAB).unwrap();
    engine.submit(3, &[3], RequestParams { queue_timeout_s: Some(1e-9), ..greedy(2) }, None).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let out = drain(&mut engine, &mut model);
    assert!(matches!(out[&3].2.reason, FinishReason::Error(ref m) if m.contains("queue")));
    assert_eq!(out[&1].2.reason, FinishReason::Length);
}

#[test]
fn randomized_soak_keeps_kv_conserved() {
    use crate::sampling::RequestRng;
    let mut rng = RequestRng::new(7);
    let mut pick = |n: u64| (rng.next_u64() % n) as usize;
    let cfg = config(|c| {
        c.kv_capacity = 600;
        c.max_prefill_tokens = 64;
        c.max_running_requests = 16;
    });
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    let mut next_rid = 0u64;
    let mut live: Vec<u64> = Vec::new();
    let mut finished = 0;
    for _step in 0..3000 {
        if next_rid < 400 && pick(3) == 0 {
            let len = 1 + pick(120);
            let shared = pick(2) == 0;
            let prompt: Vec<u32> =
                (0..len).map(|i| if shared && i < 30 { i as u32 } else { pick(250) as u32 }).collect();
            let mut p = greedy(1 + pick(40));
            if pick(4) == 0 {
                p.stops.stop_strings = vec!["<1".into()];
            }
            if pick(3) == 0 {
                p.sampling.temperature = 0.8;
                p.sampling.top_p = 0.9;
            }
            let constraint: Option<Box<dyn TokenConstraint>> =
                if pick(5) == 0 { Some(Box::new(AllowList::new(VOCAB, &[260, 261, 262]))) } else { None };
            engine.submit(next_rid, &prompt, p, constraint).unwrap();
            live.push(next_rid);
            next_rid += 1;
        }
        if !live.is_empty() && pick(25) == 0 {
            let rid = live.swap_remove(pick(live.len() as u64));
            engine.abort(rid);
        }
        let out = step(&mut engine, &mut model);
        finished += out.finished.iter().filter(|f| f.is_some()).count();
        if next_rid == 400 && !engine.has_work() {
            break;
        }
    }
    let mut acc = Default::default();
    while engine.has_work() {
        let out = step(&mut engine, &mut model);
        record(&mut acc, &out);
        finished += out.finished.iter().filter(|f| f.is_some()).count();
    }
    assert_eq!(finished as u64, next_rid, "every request finished exactly once");
    let stats = engine.stats();
    assert!(
        stats.retractions > 0 && stats.cache_hit_tokens > 0,
        "the soak should exercise retraction and the cache: {stats:?}"
    );
    let load = engine.load();
    assert_eq!(load.kv_used, load.cached_tokens, "every slot is free or cached");
}

#[test]
fn a_finished_prefill_is_shared_while_its_request_still_runs() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let mut model = FakeModel::new(4096);
    let p = prompts()[4].clone();
    engine.submit(1, &p, greedy(20), None).unwrap();
    let plan = engine.schedule().unwrap();
    let mut logits = model.forward(&plan);
    let first = engine.commit(&mut logits, VOCAB).unwrap();
    engine.check_invariants().unwrap();
    // request 1 is still decoding; request 2 finds its whole prompt cached
    engine.submit(2, &p, greedy(20), None).unwrap();
    let out = drain(&mut engine, &mut model);
    assert_eq!(out[&2].2.cached_tokens, p.len() - 1);
    let mut one = first.token_ids.clone();
    one.extend_from_slice(&out[&1].0);
    assert_eq!(one, out[&2].0, "sharing the prefix changes nothing in the output");
}

#[test]
fn admission_counts_slots_already_allocated_once() {
    // 8 prompts of 16 tokens with room for exactly their prompts plus the reserve: all
    // must be admitted in the first step, not only as many as double counting allows
    let cfg = config(|c| {
        c.kv_capacity = 8 * (16 + 4);
        c.new_token_ratio = 1.0;
    });
    let mut engine = Engine::new(cfg, vocab()).unwrap();
    for i in 0..8 {
        engine.submit(i, &[i as u32 + 1; 16], greedy(4), None).unwrap();
    }
    assert_eq!(engine.schedule().unwrap().num_requests(), 8);
}

#[test]
fn a_grammar_shapes_the_output_and_ends_it_with_eos() {
    use ferrolm_constraint::{Grammar, Matcher, Vocabulary};
    let v = vocab();
    let gv = Arc::new(Vocabulary::new(v.tokens.clone(), &[EOS], &[EOS]).unwrap());
    let grammar = Grammar::from_regex(gv, r#"\{"a": (true|false), "n": [0-9]{1,3}\}"#).unwrap();
    let mut engine = Engine::new(config(|_| {}), v.clone()).unwrap();
    let mut model = FakeModel::new(4096);
    for (rid, seed) in [(1u64, 1u64), (2, 2), (3, 3)] {
        let p = RequestParams {
            sampling: SamplingParams { temperature: 1.0, seed: Some(seed), ..Default::default() },
            ignore_eos: false,
            ..greedy(40)
        };
        engine.submit(rid, &[1, 2, 3], p, Some(Box::new(Matcher::new(grammar.clone())))).unwrap();
    }
    let out = drain(&mut engine, &mut model);
    let re = regex_automata::meta::Regex::new(r#"^\{"a": (true|false), "n": [0-9]{1,3}\}$"#).unwrap();
    for (rid, (_, text, fin)) in out {
        assert_eq!(fin.reason, FinishReason::Stop(StopReason::Token(EOS)), "request {rid}");
        assert!(re.is_match(&text), "request {rid} produced {text:?}");
    }
}

#[test]
fn parallel_sampling_of_a_large_batch_matches_one_at_a_time() {
    // 24 sampling rows take the two-thread path; alone, each takes the sequential one
    let params = |seed| RequestParams {
        sampling: SamplingParams { seed: Some(seed), temperature: 0.9, top_p: 0.95, ..Default::default() },
        stops: StopConditions::default(),
        ..greedy(8)
    };
    let run = |together: bool| {
        let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
        let mut model = FakeModel::new(4096);
        let mut out = std::collections::BTreeMap::new();
        for rid in 0..24u64 {
            engine.submit(rid, &[1 + rid as u32, 2, 3], params(rid), None).unwrap();
            if !together {
                out.extend(drain(&mut engine, &mut model));
            }
        }
        out.extend(drain(&mut engine, &mut model));
        out.into_values().map(|v| v.0).collect::<Vec<_>>()
    };
    assert_eq!(run(true), run(false));
}
