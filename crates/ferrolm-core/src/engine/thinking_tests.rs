//! The thinking budget: once a request has thought `budget` tokens without closing its
//! reasoning, the core forces the end marker's tokens through the usual commit path, on
//! the CPU sampler and on a runner's own draws alike.

use super::*;

const START: u32 = 249;
const END: [u32; 2] = [250, 251];

fn thinking(budget: usize, open: bool) -> Option<ThinkingBudget> {
    Some(ThinkingBudget { budget, start_ids: vec![START], end_ids: END.to_vec(), open })
}

fn budgeted(budget: usize, open: bool, max_new: usize) -> RequestParams {
    RequestParams { thinking: thinking(budget, open), ..greedy(max_new) }
}

/// Runs the request to its end on the CPU sampler: its tokens.
fn tokens_of(cfg: &EngineConfig, prompt: &[u32], params: RequestParams) -> Vec<u32> {
    clean_run(cfg, prompt, params)
}

#[test]
fn the_end_marker_is_forced_after_exactly_the_budget_and_generation_goes_on() {
    let cfg = config(|_| {});
    let p = prompts()[3].clone();
    let free = tokens_of(&cfg, &p, greedy(12));
    assert!(!free.contains(&END[0]) && !free.contains(&END[1]), "the fake model never closes: {free:?}");
    for budget in [0, 1, 5] {
        let out = tokens_of(&cfg, &p, budgeted(budget, true, 12));
        assert_eq!(out.len(), 12);
        assert_eq!(out[..budget], free[..budget], "budget {budget}: the model's own thinking first");
        assert_eq!(out[budget..budget + 2], END, "budget {budget}: then the end marker");
        // the answer is the model's own continuation of everything so far (its KV included)
        let mut so_far = p.clone();
        so_far.extend_from_slice(&out[..budget + 2]);
        assert_eq!(out[budget + 2..], tokens_of(&cfg, &so_far, greedy(10 - budget)), "budget {budget}");
    }
    // a budget larger than the output never forces
    assert_eq!(tokens_of(&cfg, &p, budgeted(50, true, 12)), free);
}

#[test]
fn counting_starts_at_the_start_marker_when_the_output_opens_the_thinking() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    engine.submit(1, &[1, 2], budgeted(2, false, 9), None).unwrap();
    let mut given = vec![7, 8, START, 10, 11];
    given.extend(END);
    given.extend([12, 13]);
    let mut out = Vec::new();
    for (i, &t) in given.iter().enumerate() {
        let plan = engine.schedule().unwrap();
        let forced = i == 5 || i == 6;
        assert_eq!(plan.plain_greedy, vec![!forced], "step {i}");
        out.extend(engine.commit_tokens(&[t]).unwrap().token_ids);
        engine.check_invariants().unwrap();
    }
    assert_eq!(out, given);
    assert!(!engine.has_work());
}

#[test]
fn no_forcing_when_the_model_closes_the_thinking_itself() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    engine.submit(1, &[1, 2], budgeted(4, true, 8), None).unwrap();
    // three tokens of thought, the marker, then an answer well past the budget
    let given = [20, 21, END[0], END[1], 22, 23, 24, 25];
    let mut out = Vec::new();
    for &t in &given {
        let plan = engine.schedule().unwrap();
        assert!(plan.all_plain_greedy());
        out.extend(engine.commit_tokens(&[t]).unwrap().token_ids);
    }
    assert_eq!(out, given);
    engine.check_invariants().unwrap();
}

#[test]
fn a_begun_marker_is_completed_and_a_wrong_token_refused() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    engine.submit(1, &[1, 2], budgeted(3, true, 8), None).unwrap();
    engine.submit(2, &[1, 2], budgeted(1, true, 8), None).unwrap();
    // request 1 spends its budget on a token that begins the marker: only the rest is
    // forced; request 2 is forced the whole marker
    for (t1, t2) in [(30, 40), (31, END[0]), (END[0], END[1])] {
        engine.schedule().unwrap();
        let out = engine.commit_tokens(&[t1, t2]).unwrap();
        assert_eq!(out.token_ids, vec![t1, t2]);
    }
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.plain_greedy, vec![false, true], "1 is forced, 2 has closed its thinking");
    let b = engine.sampling_batch().unwrap();
    let mask = &b.masks[b.mask_rows[0] as usize * b.mask_words..][..b.mask_words];
    let allowed: Vec<u32> =
        (0..VOCAB as u32).filter(|&t| crate::sampling::mask_allows(mask, t as usize)).collect();
    assert_eq!(allowed, vec![END[1]], "the batch's mask allows the forced token alone");
    assert_eq!(b.mask_rows[1], -1);
    let out = engine.commit_tokens(&[60, 61]).unwrap();
    let reason = &out.finished[0].as_ref().unwrap().reason;
    assert!(
        matches!(reason, FinishReason::Error { kind: ErrorKind::Grammar, message } if message.contains("forced")),
        "{reason:?}"
    );
    assert!(out.finished[1].is_none());
    engine.check_invariants().unwrap();
}

/// A device sampler's draw: the inverse CDF of the masked row's softmax at the batch's
/// uniform (argmax on greedy rows).
fn device_draw(logits: &[f32], b: &SamplingBatch, i: usize) -> u32 {
    let mut row: Vec<f64> = logits.iter().map(|&l| l as f64).collect();
    let banned = &b.banned_ids[b.banned_offsets[i] as usize..b.banned_offsets[i + 1] as usize];
    for &t in banned {
        row[t as usize] = f64::NEG_INFINITY;
    }
    if b.mask_rows[i] >= 0 {
        let mask = &b.masks[b.mask_rows[i] as usize * b.mask_words..][..b.mask_words];
        for (t, l) in row.iter_mut().enumerate() {
            if !crate::sampling::mask_allows(mask, t) {
                *l = f64::NEG_INFINITY;
            }
        }
    }
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if b.greedy[i] {
        return row.iter().position(|&l| l == max).unwrap() as u32;
    }
    let w: Vec<f64> = row.iter().map(|&l| ((l - max) / b.temperature[i] as f64).exp()).collect();
    let mut target = b.uniforms[i] * w.iter().sum::<f64>();
    for (t, &x) in w.iter().enumerate() {
        if target < x {
            return t as u32;
        }
        target -= x;
    }
    unreachable!("u < 1")
}

#[test]
fn samples_of_one_request_each_force_alike_on_the_cpu_and_on_a_device() {
    let run = |on_device: bool| {
        let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
        let mut model = FakeModel::new(4096);
        let params = RequestParams { thinking: thinking(4, true), ..sampled(Some(5), 10) };
        // 16 samples and one more: a step large enough for two sampling threads
        let samples: Vec<u64> = (1..=16).collect();
        engine.submit_samples(&samples, &prompts()[2], params, None).unwrap();
        engine.submit(100, &prompts()[4], budgeted(3, true, 10), None).unwrap();
        let mut outputs: std::collections::BTreeMap<u64, (Vec<u32>, String, Option<Finished>)> =
            Default::default();
        while engine.has_work() {
            let plan = engine.schedule().unwrap();
            let mut logits = model.forward(&plan);
            let out = if on_device {
                let b = engine.sampling_batch().unwrap();
                let tokens: Vec<Option<u32>> = (0..plan.num_requests())
                    .map(|i| Some(device_draw(&logits[i * VOCAB..(i + 1) * VOCAB], &b, i)))
                    .collect();
                engine.commit_drawn(&DeviceDraws { tokens: &tokens, ..Default::default() }).unwrap()
            } else {
                engine.commit(&mut logits, VOCAB).unwrap()
            };
            record(&mut outputs, &out);
            engine.check_invariants().unwrap();
        }
        assert_eq!(engine.load().kv_used, engine.load().cached_tokens, "every request's KV went back");
        outputs.into_iter().map(|(rid, (t, _, _))| (rid, t)).collect::<Vec<_>>()
    };
    let cpu = run(false);
    for (rid, t) in &cpu {
        let budget = if *rid == 100 { 3 } else { 4 };
        assert_eq!(t.len(), 10, "{rid}");
        assert_eq!(t[budget..budget + 2], END, "sample {rid}: {t:?}");
    }
    assert_ne!(cpu[0].1[..4], cpu[1].1[..4], "the samples think apart");
    assert_eq!(run(true), cpu, "a device's draws force the same tokens");
}

#[test]
fn aborting_while_forcing_frees_everything() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let mut model = FakeModel::new(4096);
    engine.submit_samples(&[1, 2], &prompts()[6], budgeted(2, true, 20), None).unwrap();
    let mut seen: std::collections::BTreeMap<u64, (Vec<u32>, String, Option<Finished>)> = Default::default();
    while seen.get(&2).is_none_or(|s| s.0.len() < 3) {
        record(&mut seen, &step(&mut engine, &mut model));
    }
    assert_eq!(seen[&1].0[2..4], END);
    assert_eq!(seen[&2].0[2], END[0], "sample 2 is in the middle of its forced marker");
    assert!(engine.abort(2));
    record(&mut seen, &step(&mut engine, &mut model));
    assert_eq!(seen[&2].2.as_ref().unwrap().reason, FinishReason::Abort);
    assert_eq!(seen[&2].0.len(), 3);
    for (rid, v) in drain(&mut engine, &mut model) {
        seen.entry(rid).or_default().0.extend(v.0);
    }
    assert_eq!(seen[&1].0.len(), 20);
    engine.check_invariants().unwrap();
    assert_eq!(engine.load().kv_used, engine.load().cached_tokens);
}

#[test]
fn a_budget_without_an_end_marker_or_outside_the_vocabulary_is_refused() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let field = |r: Result<(), EngineError>| match r.unwrap_err() {
        EngineError::InvalidRequest { field, .. } => field,
        other => panic!("{other:?}"),
    };
    let no_end = ThinkingBudget { budget: 3, start_ids: vec![], end_ids: vec![], open: true };
    let p = RequestParams { thinking: Some(no_end), ..greedy(4) };
    assert_eq!(field(engine.submit(1, &[1], p, None)), "thinking_end_ids");
    let outside = ThinkingBudget { budget: 3, start_ids: vec![VOCAB as u32], end_ids: vec![1], open: false };
    let p = RequestParams { thinking: Some(outside), ..greedy(4) };
    assert_eq!(field(engine.submit(1, &[1], p, None)), "thinking_token_budget");
    assert_eq!(engine.num_requests(), 0);
}
