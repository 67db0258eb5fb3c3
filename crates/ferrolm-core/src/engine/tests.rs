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
    /// Added to the logit of the token that followed the latest earlier occurrence of the
    /// context's last token: a model that copies from its context, for speculation.
    copy_bonus: f32,
}

impl FakeModel {
    fn new(capacity: usize) -> Self {
        FakeModel { kv: vec![None; capacity], copy_bonus: 0.0 }
    }

    fn copying(capacity: usize, bonus: f32) -> Self {
        FakeModel { kv: vec![None; capacity], copy_bonus: bonus }
    }

    /// One row per `plan.logit_rows` entry: a hash of the tokens in the slots that token
    /// attends to (its request's, up to its position).
    fn forward(&mut self, plan: &BatchPlan) -> Vec<f32> {
        for i in 0..plan.num_tokens() {
            self.kv[plan.out_slots[i] as usize] = Some((plan.input_ids[i], plan.positions[i]));
        }
        let mut logits = Vec::with_capacity(plan.logit_rows.len() * VOCAB);
        let mut b = 0;
        for &t in &plan.logit_rows {
            while plan.qo_offsets[b + 1] <= t {
                b += 1;
            }
            let all = &plan.kv_slots[plan.kv_offsets[b] as usize..plan.kv_offsets[b + 1] as usize];
            let pos = plan.positions[t as usize] as usize;
            let ctx = &all[..pos + 1];
            let mut tokens = Vec::with_capacity(ctx.len());
            for (p, &slot) in ctx.iter().enumerate() {
                let (token, at) = self.kv[slot as usize].expect("attended slot was written");
                assert_eq!(at as usize, p, "context slots out of position order");
                tokens.push(token);
            }
            if t + 1 == plan.qo_offsets[b + 1] {
                assert_eq!(pos + 1, all.len(), "attends to exactly the tokens up to the last new one");
            }
            logits.extend(fake_row(&tokens, self.copy_bonus));
        }
        logits
    }
}

/// The fake model's logits after `tokens`.
fn fake_row(tokens: &[u32], copy_bonus: f32) -> Vec<f32> {
    let h =
        tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| (h ^ t as u64).wrapping_mul(0x100_0000_01b3));
    let mut row: Vec<f32> = (0..VOCAB as u64)
        .map(|v| {
            let x = (h ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xff51_afd7_ed55_8ccd);
            ((x >> 40) % 1000) as f32 / 100.0
        })
        .collect();
    if let Some(next) = copied_next(tokens) {
        row[next as usize] += copy_bonus;
    }
    row
}

/// The token after the latest earlier occurrence of the last one.
fn copied_next(tokens: &[u32]) -> Option<u32> {
    let (&last, before) = tokens.split_last()?;
    before.iter().rposition(|&t| t == last).map(|i| tokens[i + 1])
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
    // a complete document ends the request even with ignore_eos and before min_new_tokens:
    // the grammar allows nothing but EOS, so suppressing it would leave no token at all
    for params in
        [RequestParams { ignore_eos: true, ..greedy(6) }, RequestParams { min_new_tokens: 4, ..greedy(6) }]
    {
        engine.submit(6, &[1, 2, 3], params, Some(Box::new(EosAfterOne(0)))).unwrap();
        let s6 = drain(&mut engine, &mut model)[&6].clone();
        assert_eq!(s6.2.reason, FinishReason::Stop(StopReason::Token(EOS)));
        assert_eq!(s6.0.len(), 2);
    }
    engine.check_invariants().unwrap();
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
fn a_bad_configuration_is_refused_naming_its_field() {
    let field = |f: fn(&mut EngineConfig)| Engine::new(config(f), vocab()).err().map(|e| e.field);
    assert_eq!(field(|c| c.kv_capacity = 0), Some("kv_capacity"));
    assert_eq!(field(|c| c.kv_capacity = 1 << 31), Some("kv_capacity"));
    assert_eq!(field(|c| c.max_running_requests = 0), Some("max_running_requests"));
    assert_eq!(field(|c| c.max_prefill_tokens = 0), Some("max_prefill_tokens"));
    assert_eq!(field(|c| c.new_token_ratio = 1.5), Some("new_token_ratio"));
    assert_eq!(field(|c| c.eos_token_ids = vec![VOCAB as u32]), Some("eos_token_ids"));
    assert_eq!(field(|c| c.kv_event_block_size = 0), Some("kv_event_block_size"));
    assert_eq!(field(|_| {}), None);
    let e = config(|c| c.max_context = 0).validate().unwrap_err();
    assert_eq!((e.field, e.to_string()), ("max_context", "max_context must be at least 1".to_string()));
}

#[test]
fn the_plan_says_which_entries_the_runner_may_pick_greedily() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let sampled =
        RequestParams { sampling: SamplingParams { temperature: 0.7, ..Default::default() }, ..greedy(4) };
    let with_logprobs =
        RequestParams { sampling: SamplingParams { logprobs: true, ..greedy(4).sampling }, ..greedy(4) };
    let banned_stops = RequestParams { min_new_tokens: 2, ..greedy(4) };
    let top_k_one = RequestParams {
        sampling: SamplingParams { temperature: 0.9, top_k: 1, ..Default::default() },
        ignore_eos: false,
        ..greedy(4)
    };
    engine.submit(1, &[1, 2], greedy(4), None).unwrap();
    engine.submit(2, &[1, 2], sampled, None).unwrap();
    engine.submit(3, &[1, 2], with_logprobs, None).unwrap();
    engine.submit(4, &[1, 2], banned_stops, None).unwrap();
    engine.submit(5, &[1, 2], top_k_one, None).unwrap();
    engine.submit(6, &[1, 2], greedy(4), Some(Box::new(AllowList::new(VOCAB, &[65, 66])))).unwrap();
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.rids, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(plan.plain_greedy, vec![true, false, false, false, true, false]);
    assert_eq!(plan.ignore_eos, vec![true, true, true, true, false, true]);
    assert!(!plan.all_plain_greedy());
    engine.fail_step("dropped");
    engine.take_outputs();
    engine.submit(7, &[1, 2], greedy(4), None).unwrap();
    let plan = engine.schedule().unwrap();
    assert!(plan.all_plain_greedy(), "{plan:?}");
}

#[test]
fn a_request_too_long_for_the_pool_finishes_with_an_error() {
    let mut engine = Engine::new(config(|c| c.kv_capacity = 16), vocab()).unwrap();
    let mut model = FakeModel::new(16);
    engine.submit(1, &[1; 10], greedy(20), None).unwrap();
    let out = drain(&mut engine, &mut model);
    assert!(
        matches!(out[&1].2.reason, FinishReason::Error { kind: ErrorKind::KvCapacity, ref message } if message.contains("KV pool")),
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
    assert!(matches!(
        out.finished[0].as_ref().unwrap().reason,
        FinishReason::Error { kind: ErrorKind::Grammar, .. }
    ));
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
    assert!(
        matches!(out[&3].2.reason, FinishReason::Error { kind: ErrorKind::QueueTimeout, ref message } if message.contains("queue"))
    );
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
            let constraint =
                if pick(5) == 0 { Some(Constraint::AllowedTokens(vec![260, 261, 262])) } else { None };
            // now and then several samples of one prompt (n > 1)
            let n = if pick(6) == 0 { 2 + pick(3) as u64 } else { 1 };
            let rids: Vec<u64> = (next_rid..next_rid + n).collect();
            engine.submit_samples(&rids, &prompt, p, constraint).unwrap();
            live.extend_from_slice(&rids);
            next_rid += n;
        }
        if !live.is_empty() && pick(25) == 0 {
            let rid = live.swap_remove(pick(live.len() as u64));
            engine.abort(rid);
        }
        let plan = engine.schedule().unwrap();
        engine.check_invariants().unwrap();
        if !live.is_empty() && pick(40) == 0 {
            // an abort while the step is in flight
            let rid = live.swap_remove(pick(live.len() as u64));
            engine.abort(rid);
        }
        let out = if plan.is_empty() {
            engine.take_outputs()
        } else if pick(30) == 0 {
            // the forward failed: the model wrote nothing
            engine.fail_step("injected failure")
        } else {
            let mut logits = model.forward(&plan);
            engine.commit(&mut logits, VOCAB).unwrap()
        };
        engine.check_invariants().unwrap();
        finished += out.finished.iter().filter(|f| f.is_some()).count();
        if next_rid >= 400 && !engine.has_work() {
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
        stats.retractions > 0 && stats.cache_hit_tokens > 0 && stats.failed_steps > 0,
        "the soak should exercise retraction, the cache and failed steps: {stats:?}"
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

/// Runs `prompt` alone on a fresh engine; its tokens.
fn clean_run(cfg: &EngineConfig, prompt: &[u32], params: RequestParams) -> Vec<u32> {
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    engine.submit(0, prompt, params, None).unwrap();
    drain(&mut engine, &mut model).remove(&0).unwrap().0
}

fn step_failed(f: &Finished) -> bool {
    matches!(f.reason, FinishReason::Error { kind: ErrorKind::StepFailed, ref message } if message == "boom")
}

#[test]
fn a_failed_step_advances_nothing_and_leaves_no_unwritten_kv_in_the_cache() {
    let cfg = config(|c| c.max_running_requests = 3);
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    let x: Vec<u32> = (0..30).map(|i| (i * 11 % 250) as u32).collect();
    let mut p = x[..20].to_vec();
    p.extend((0..15).map(|i| 100 + i as u32));
    // requests 1 and 6 are decoding (their prompts are cached at prefill)
    engine.submit(1, &x, greedy(20), None).unwrap();
    engine.submit(6, &[7; 12], greedy(20), None).unwrap();
    let mut acc = Default::default();
    for _ in 0..3 {
        record(&mut acc, &step(&mut engine, &mut model));
    }
    // request 2 joins with a partial hit (20 of x's tokens); 5 waits (the batch is full)
    engine.submit(2, &p, greedy(6), None).unwrap();
    engine.submit(5, &[9; 8], greedy(6), None).unwrap();
    let free_before = engine.pool.num_free() + engine.tree.sizes().evictable;
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.rids, vec![1, 6, 2]);
    engine.abort(1); // in flight: ends as an abort, not an error
    engine.abort(5); // waiting: its output is pending
    let out = engine.fail_step("boom");
    engine.check_invariants().unwrap();
    record(&mut acc, &out);
    let fin = |rid: u64| acc[&rid].2.clone().unwrap();
    assert_eq!(fin(1).reason, FinishReason::Abort);
    assert_eq!(fin(5).reason, FinishReason::Abort);
    assert!(step_failed(&fin(6)) && step_failed(&fin(2)), "{:?} {:?}", fin(6), fin(2));
    assert_eq!((fin(6).completion_tokens, fin(2).completion_tokens), (3, 0), "nothing advanced");
    assert_eq!(engine.num_requests(), 0);
    assert_eq!(engine.stats().failed_steps, 1);
    // the written KV of 1 and 6 went to the cache; the step's own slots went back to the pool
    let load = engine.load();
    assert_eq!(load.kv_used, load.cached_tokens, "every slot is free or cached");
    assert!(engine.pool.num_free() + engine.tree.sizes().evictable >= free_before);
    assert_eq!(engine.tree.prefix_len(&p, None), 20, "none of request 2's unwritten prompt is cached");
    // the same prompts again: hits only on what was written, the same output as a clean engine
    engine.submit(3, &p, greedy(6), None).unwrap();
    let mut x_more = x.clone();
    x_more.extend_from_slice(&acc[&1].0); // x and 1's 3 tokens: the last one was never run
    engine.submit(4, &x_more, greedy(5), None).unwrap();
    let again = drain(&mut engine, &mut model);
    assert_eq!(again[&3].2.cached_tokens, 20);
    assert_eq!(again[&4].2.cached_tokens, x_more.len() - 1);
    assert_eq!(again[&3].0, clean_run(&cfg, &p, greedy(6)));
    assert_eq!(again[&4].0, clean_run(&cfg, &x_more, greedy(5)));
    // with no step in flight it hands out pending outputs only
    engine.submit(7, &[1, 2], greedy(2), None).unwrap();
    engine.abort(7);
    let out = engine.fail_step("boom");
    assert_eq!(
        (out.rids.clone(), out.finished[0].as_ref().map(|f| f.reason.clone())),
        (vec![7], Some(FinishReason::Abort))
    );
    assert_eq!(engine.stats().failed_steps, 1);
    engine.check_invariants().unwrap();
}

#[test]
fn a_failed_chunked_prefill_keeps_only_its_written_chunks() {
    let cfg = config(|c| {
        c.max_prefill_tokens = 8;
        c.fast_lane_tokens = 0;
    });
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    let p: Vec<u32> = (0..30).map(|i| (i * 7 % 250) as u32).collect();
    engine.submit(1, &p, greedy(4), None).unwrap();
    step(&mut engine, &mut model); // tokens 0..8 written
    step(&mut engine, &mut model); // 8..16
    engine.schedule().unwrap(); // 16..24, never run
    let out = engine.fail_step("boom");
    assert!(step_failed(out.finished[0].as_ref().unwrap()));
    engine.check_invariants().unwrap();
    assert_eq!(engine.tree.prefix_len(&p, None), 16);
    engine.submit(2, &p, greedy(4), None).unwrap();
    let again = drain(&mut engine, &mut model);
    assert_eq!(again[&2].2.cached_tokens, 16);
    assert_eq!(again[&2].0, clean_run(&cfg, &p, greedy(4)));
}

#[test]
fn a_cached_request_takes_the_fast_lane_past_an_uncached_one_that_does_not_fit() {
    let cfg = config(|c| {
        c.max_prefill_tokens = 16;
        c.fast_lane_tokens = 4;
    });
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    let cached: Vec<u32> = (0..12).map(|i| 200 + i as u32).collect();
    engine.submit(10, &cached, greedy(3), None).unwrap();
    drain(&mut engine, &mut model);
    // a long prompt in chunked prefill spends each step's budget
    engine.submit(11, &[5; 100], greedy(3), None).unwrap();
    step(&mut engine, &mut model);
    engine.submit(12, &[6; 50], greedy(3), None).unwrap(); // uncached: waits for budget
    engine.submit(13, &cached, greedy(3), None).unwrap(); // one uncached token: fast lane
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.rids, vec![11, 13], "the cached request is not held behind the uncached one");
    assert_eq!(plan.num_tokens(), 16 + 1);
    let mut logits = model.forward(&plan);
    let mut acc = Default::default();
    record(&mut acc, &engine.commit(&mut logits, VOCAB).unwrap());
    engine.check_invariants().unwrap();
    for (rid, v) in drain(&mut engine, &mut model) {
        let e = acc.entry(rid).or_default();
        e.0.extend(v.0);
    }
    assert_eq!(acc[&13].0, clean_run(&cfg, &cached, greedy(3)));
    assert_eq!(acc[&12].0, clean_run(&cfg, &[6; 50], greedy(3)));
}

#[test]
fn lpm_ordering_looks_at_the_cache_without_changing_it() {
    let cfg = config(|c| {
        c.schedule_policy = SchedulePolicy::Lpm;
        c.max_running_requests = 1;
    });
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    let a: Vec<u32> = (0..40).map(|i| 100 + i as u32).collect();
    engine.submit(1, &a, greedy(1), None).unwrap();
    drain(&mut engine, &mut model);
    engine.submit(2, &[3; 10], greedy(30), None).unwrap();
    step(&mut engine, &mut model);
    // two waiting requests that share part of the cached node; the batch is full
    let mut w = a[..20].to_vec();
    w.extend([1, 2, 3]);
    engine.submit(3, &w, greedy(2), None).unwrap();
    engine.submit(4, &[8; 5], greedy(2), None).unwrap();
    let nodes = engine.tree.sizes().nodes;
    for _ in 0..3 {
        step(&mut engine, &mut model);
        assert_eq!(engine.tree.sizes().nodes, nodes, "no split for ordering");
    }
    let out = drain(&mut engine, &mut model);
    assert_eq!(out[&3].2.cached_tokens, 20);
}

fn sampled(seed: Option<u64>, max_new: usize) -> RequestParams {
    RequestParams {
        sampling: SamplingParams { temperature: 1.0, seed, ..Default::default() },
        max_new_tokens: max_new,
        ignore_eos: true,
        ..Default::default()
    }
}

#[test]
fn n_samples_share_the_prompt_and_seed_by_index() {
    let cfg = config(|_| {});
    let p = prompts()[5].clone();
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    engine.submit_samples(&[20, 21, 22], &p, sampled(Some(9), 6), None).unwrap();
    assert_eq!(engine.load().waiting, 1, "the other samples wait for the first, not in the queue");
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.rids, vec![20], "the first sample prefills the prompt alone");
    let mut logits = model.forward(&plan);
    let mut acc = Default::default();
    record(&mut acc, &engine.commit(&mut logits, VOCAB).unwrap());
    engine.check_invariants().unwrap();
    for (rid, v) in drain(&mut engine, &mut model) {
        let e = acc.entry(rid).or_default();
        e.0.extend(v.0);
        e.2 = Some(v.2);
    }
    for (j, rid) in [20u64, 21, 22].into_iter().enumerate() {
        let fin = acc[&rid].2.clone().unwrap();
        assert_eq!(fin.cached_tokens, if j == 0 { 0 } else { p.len() - 1 }, "sample {j}");
        assert_eq!(
            acc[&rid].0,
            clean_run(&cfg, &p, sampled(Some(9 + j as u64), 6)),
            "sample {j} has seed 9 + {j}"
        );
    }
    assert_ne!(acc[&20].0, acc[&21].0);
    // refusals change nothing
    let field = |r: Result<(), EngineError>| match r.unwrap_err() {
        EngineError::InvalidRequest { field, .. } => field,
        EngineError::DuplicateRid(rid) => panic!("duplicate {rid}"),
        other => panic!("{other:?}"),
    };
    assert_eq!(engine.submit_samples(&[30, 30], &p, greedy(2), None), Err(EngineError::DuplicateRid(30)));
    assert_eq!(field(engine.submit_samples(&[], &p, greedy(2), None)), "rid");
    let custom = Constraint::Custom(Box::new(AllowList::new(VOCAB, &[1])));
    assert_eq!(field(engine.submit_samples(&[30, 31], &p, greedy(2), Some(custom))), "n");
    assert_eq!(engine.num_requests(), 0);
}

#[test]
fn samples_run_on_when_their_leader_ends_early_and_abort_one_by_one() {
    let cfg = config(|_| {});
    let p = prompts()[7].clone();
    let clean = clean_run(&cfg, &p, greedy(4));
    let mut engine = Engine::new(cfg.clone(), vocab()).unwrap();
    let mut model = FakeModel::new(cfg.kv_capacity);
    // the leader is aborted before it ran: the next sample leads, the rest follow it
    engine.submit_samples(&[30, 31, 32], &p, greedy(4), None).unwrap();
    assert!(engine.abort(30));
    engine.check_invariants().unwrap();
    assert_eq!(engine.schedule().unwrap().rids, vec![31]);
    // the new leader's step fails: the last sample leads and runs alone
    let out = engine.fail_step("boom");
    assert!(step_failed(out.finished[1].as_ref().unwrap()), "{out:?}");
    assert_eq!(out.rids, vec![30, 31]);
    engine.check_invariants().unwrap();
    let rest = drain(&mut engine, &mut model);
    assert_eq!(rest.keys().copied().collect::<Vec<_>>(), vec![32]);
    assert_eq!(rest[&32].0, clean);
    // aborting a follower ends it alone
    engine.submit_samples(&[40, 41, 42], &p, greedy(4), None).unwrap();
    assert!(engine.abort(41));
    let out = drain(&mut engine, &mut model);
    assert_eq!(out[&41].2.reason, FinishReason::Abort);
    assert_eq!((out[&40].0.clone(), out[&42].0.clone()), (clean.clone(), clean.clone()));
    assert_eq!(out[&42].2.cached_tokens, p.len() - 1);
    // abort_all reaches followers too
    engine.submit_samples(&[50, 51], &p, greedy(4), None).unwrap();
    assert_eq!(engine.abort_all(), 2);
    let out = drain(&mut engine, &mut model);
    assert!(out.values().all(|v| v.2.reason == FinishReason::Abort) && out.len() == 2);
    // a queue timeout ends every sample, each once
    let timed = RequestParams { queue_timeout_s: Some(1e-9), ..greedy(4) };
    engine.submit_samples(&[60, 61, 62], &p, timed, None).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let out = drain(&mut engine, &mut model);
    assert_eq!(out.len(), 3);
    assert!(out
        .values()
        .all(|v| matches!(v.2.reason, FinishReason::Error { kind: ErrorKind::QueueTimeout, .. })));
}

/// The blocks a router holds after following the engine's KV events: a hash is live from
/// its `BlockStored` until its `BlockRemoved` (or `AllBlocksCleared`). Returns how many
/// blocks were removed.
fn follow(live: &mut std::collections::HashSet<u64>, events: Vec<crate::radix::KvEvent>) -> usize {
    use crate::radix::KvEvent;
    let mut removed = 0;
    for e in events {
        match e {
            KvEvent::BlockStored { block_hashes, token_ids, block_size, .. } => {
                assert_eq!(token_ids.len(), block_hashes.len() * block_size as usize, "full blocks only");
                for h in block_hashes {
                    assert!(live.insert(h), "block {h} stored twice");
                }
            }
            KvEvent::BlockRemoved { block_hashes } => {
                for h in block_hashes {
                    assert!(live.remove(&h), "block {h} removed but never stored");
                    removed += 1;
                }
            }
            KvEvent::AllBlocksCleared => live.clear(),
        }
    }
    removed
}

#[test]
fn kv_events_predict_every_cache_hit_with_eviction_running() {
    use crate::radix::events::{chain_hashes, namespace_seed};
    const BLOCK: usize = 8;
    // a pool of 160 slots for prompts of up to ~150 tokens: every request evicts
    let cfg = config(|c| {
        c.kv_capacity = 160;
        c.kv_events = true;
        c.kv_event_block_size = BLOCK;
    });
    let mut engine = Engine::new(cfg, vocab()).unwrap();
    let mut model = FakeModel::new(160);
    let mut live = std::collections::HashSet::new();
    let mut history: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let (mut hits, mut removed) = (0, 0);
    for turn in 0..24u32 {
        let (conv, ns) = ((turn % 3) as usize, if turn % 3 == 2 { Some("tenant-b") } else { None });
        let p = &mut history[conv];
        p.extend((0..11).map(|j| (turn * 17 + j * 5) % 250));
        // the router's prediction from the events alone: leading blocks of the prompt
        // (less its last token, which always runs) that are live
        let hashes = chain_hashes(namespace_seed(ns), &p[..p.len() - 1], BLOCK);
        let predicted = hashes.iter().take_while(|&&h| live.contains(&h)).count() * BLOCK;
        let params = RequestParams { namespace: ns.map(str::to_string), ..greedy(6) };
        engine.submit(turn as u64, p, params, None).unwrap();
        let out = drain(&mut engine, &mut model);
        removed += follow(&mut live, engine.take_kv_events());
        let (tokens, _, fin) = &out[&(turn as u64)];
        assert_eq!(fin.cached_tokens / BLOCK * BLOCK, predicted, "turn {turn}");
        hits += predicted;
        p.extend_from_slice(tokens);
    }
    assert!(hits > 0 && removed > 0, "the workload should hit the cache and evict ({hits}, {removed})");
    assert!(engine.flush_cache());
    let events = engine.take_kv_events();
    assert_eq!(events, vec![crate::radix::KvEvent::AllBlocksCleared], "a flush is one clear");
    assert_eq!(engine.load().kv_used, 0, "the flush gave every slot back");
}

#[test]
fn kv_events_are_off_by_default() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let mut model = FakeModel::new(4096);
    engine.submit(1, &prompts()[1], greedy(4), None).unwrap();
    drain(&mut engine, &mut model);
    assert!(engine.take_kv_events().is_empty());
}
#[path = "sampling_batch_tests.rs"]
mod sampling_batch_tests;

#[path = "spec_tests.rs"]
mod spec_tests;

#[test]
fn the_cpu_of_a_large_steps_sampling_thread_is_counted() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let mut model = FakeModel::new(4096);
    engine.submit(1, &[1, 2], greedy(4), None).unwrap();
    let plan = engine.schedule().unwrap();
    engine.commit(&mut model.forward(&plan), VOCAB).unwrap();
    assert_eq!(engine.stats().sampling_thread_cpu_ns, 0, "one row: no second thread");
    for rid in 2..=17 {
        engine.submit(rid, &[1, 2, rid as u32], greedy(4), None).unwrap();
    }
    let plan = engine.schedule().unwrap();
    assert!(plan.num_requests() >= 16);
    engine.commit(&mut model.forward(&plan), VOCAB).unwrap();
    assert!(engine.stats().sampling_thread_cpu_ns > 0, "{:?}", engine.stats());
}

#[path = "thinking_tests.rs"]
mod thinking_tests;

#[path = "lora_tests.rs"]
mod lora_tests;
