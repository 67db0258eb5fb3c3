//! `sampling_batch` and `commit_drawn`: the columns a device sampler reads, and the core
//! taking its draws as it takes its own.

use super::*;

fn knobs(f: impl FnOnce(&mut RequestParams)) -> RequestParams {
    let mut p = RequestParams { max_new_tokens: 8, ..Default::default() };
    f(&mut p);
    p
}

fn row<T: Copy>(values: &[T], offsets: &[u32], b: usize) -> Vec<T> {
    values[offsets[b] as usize..offsets[b + 1] as usize].to_vec()
}

#[test]
fn the_batch_has_a_row_per_entry_with_each_requests_knobs() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    let biased = knobs(|p| {
        p.sampling =
            SamplingParams { temperature: 0.0, logit_bias: vec![(5, 2.0), (9, -1.0)], ..Default::default() };
        p.ignore_eos = true;
    });
    let sampled = knobs(|p| {
        p.sampling = SamplingParams {
            temperature: 0.7,
            top_k: 5,
            top_p: 0.9,
            min_p: 0.1,
            seed: Some(3),
            logprobs: true,
            top_logprobs: 2,
            ..Default::default()
        };
        p.min_new_tokens = 2;
        p.stops.stop_token_ids = vec![7];
    });
    let penalized = knobs(|p| {
        p.sampling = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 1.5,
            frequency_penalty: 0.5,
            ..Default::default()
        };
    });
    engine.submit(1, &[1, 2], biased, None).unwrap();
    engine.submit(2, &[3, 4], sampled, None).unwrap();
    engine.submit(3, &[10, 11, 10], penalized, Some(Box::new(AllowList::new(VOCAB, &[1, 2, 40])))).unwrap();
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.rids, vec![1, 2, 3]);
    let b = engine.sampling_batch().unwrap();
    assert_eq!(b.num_rows(), 3);
    assert_eq!(b.greedy, vec![true, false, true]);
    assert_eq!(b.temperature, vec![1.0, 0.7, 1.0], "greedy rows divide by 1");
    assert_eq!((b.top_k[1], b.top_p[1], b.min_p[1]), (5, 0.9, 0.1));
    assert_eq!((b.uniforms[0], b.uniforms[2]), (0.0, 0.0));
    assert!((0.0..1.0).contains(&b.uniforms[1]));
    assert_eq!(b.uniforms[1], engine.sampling_batch().unwrap().uniforms[1], "peeking uses nothing up");
    assert_eq!((b.logprobs.clone(), b.top_logprobs.clone()), (vec![false, true, false], vec![0, 2, 0]));
    assert_eq!(row(&b.bias_ids, &b.bias_offsets, 0), vec![5, 9]);
    assert_eq!(row(&b.bias_values, &b.bias_offsets, 0), vec![2.0, -1.0]);
    assert!(row(&b.bias_ids, &b.bias_offsets, 1).is_empty());
    // ignore_eos bans EOS; before min_new_tokens, EOS and the stop tokens
    assert_eq!(row(&b.banned_ids, &b.banned_offsets, 0), vec![EOS]);
    assert_eq!(row(&b.banned_ids, &b.banned_offsets, 1), vec![EOS, 7]);
    assert!(row(&b.banned_ids, &b.banned_offsets, 2).is_empty());
    // the repetition penalty covers the prompt's tokens, not yet generated
    let mut ids = row(&b.penalty_ids, &b.penalty_offsets, 2);
    ids.sort();
    assert_eq!(ids, vec![10, 11]);
    assert_eq!(row(&b.penalty_counts, &b.penalty_offsets, 2), vec![0, 0]);
    assert_eq!(b.mask_rows, vec![-1, -1, 0]);
    assert_eq!(b.mask_words, VOCAB.div_ceil(32));
    let mut want = vec![0u32; b.mask_words];
    AllowList::new(VOCAB, &[1, 2, 40]).fill_mask(&mut want);
    assert_eq!(b.masks, want);

    engine
        .commit_drawn(&DeviceDraws { tokens: &[Some(5), Some(6), Some(40)], ..Default::default() })
        .unwrap();
    engine.schedule().unwrap();
    let b = engine.sampling_batch().unwrap();
    let mut counted: Vec<(u32, u32)> = row(&b.penalty_ids, &b.penalty_offsets, 2)
        .into_iter()
        .zip(row(&b.penalty_counts, &b.penalty_offsets, 2))
        .collect();
    counted.sort();
    assert_eq!(counted, vec![(10, 0), (11, 0), (40, 1)], "the generated token now counts");
    assert_eq!(row(&b.banned_ids, &b.banned_offsets, 1), vec![EOS, 7], "one token out of min_new_tokens 2");
}

#[test]
fn entries_that_do_not_sample_get_a_neutral_row_and_no_step_means_no_batch() {
    let mut engine = Engine::new(
        config(|c| {
            c.max_prefill_tokens = 4;
            c.fast_lane_tokens = 0;
        }),
        vocab(),
    )
    .unwrap();
    assert!(matches!(engine.sampling_batch(), Err(EngineError::Protocol(_))));
    let hot = knobs(|p| {
        p.sampling = SamplingParams { temperature: 2.0, logit_bias: vec![(1, 1.0)], ..Default::default() }
    });
    engine.submit(1, &[1, 2, 3, 4, 5, 6, 7, 8, 9], hot, None).unwrap();
    let plan = engine.schedule().unwrap();
    assert_eq!(plan.samples, vec![false], "a chunk short of the prompt's end");
    let b = engine.sampling_batch().unwrap();
    assert_eq!((b.greedy[0], b.temperature[0], b.bias_offsets.clone()), (true, 1.0, vec![0, 0]));
    let out = engine.commit_drawn(&DeviceDraws { tokens: &[None], ..Default::default() }).unwrap();
    assert!(out.finished.iter().all(Option::is_none), "an entry that does not sample ignores its token");
}

/// The draw a device sampler makes for an untruncated row: the inverse CDF of the row's
/// softmax at temperature `t`, in token order, at the batch's uniform.
fn inverse_cdf(logits: &[f32], banned: &[u32], t: f32, u: f64) -> u32 {
    let mut row: Vec<f64> = logits.iter().map(|&l| l as f64).collect();
    for &b in banned {
        row[b as usize] = f64::NEG_INFINITY;
    }
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = row.iter().map(|&l| ((l - max) / t as f64).exp()).collect();
    let mut target = u * w.iter().sum::<f64>();
    for (i, &x) in w.iter().enumerate() {
        if target < x {
            return i as u32;
        }
        target -= x;
    }
    unreachable!("u < 1")
}

#[test]
fn device_draws_at_the_batchs_uniforms_follow_the_cpu_samplers_stream() {
    let run = |on_device: bool| {
        let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
        let mut model = FakeModel::new(4096);
        for (rid, seed) in [(1u64, 11u64), (2, 12), (3, 13)] {
            let p = RequestParams { min_new_tokens: 3, ..sampled(Some(seed), 20) };
            engine.submit(rid, &prompts()[rid as usize], p, None).unwrap();
        }
        let mut outputs: std::collections::BTreeMap<u64, (Vec<u32>, String, Option<Finished>)> =
            Default::default();
        while engine.has_work() {
            let plan = engine.schedule().unwrap();
            let mut logits = model.forward(&plan);
            let out = if on_device {
                let b = engine.sampling_batch().unwrap();
                let tokens: Vec<Option<u32>> = (0..plan.num_requests())
                    .map(|i| {
                        let banned = row(&b.banned_ids, &b.banned_offsets, i);
                        let l = &logits[i * VOCAB..(i + 1) * VOCAB];
                        Some(inverse_cdf(l, &banned, b.temperature[i], b.uniforms[i]))
                    })
                    .collect();
                engine.commit_drawn(&DeviceDraws { tokens: &tokens, ..Default::default() }).unwrap()
            } else {
                engine.commit(&mut logits, VOCAB).unwrap()
            };
            record(&mut outputs, &out);
            engine.check_invariants().unwrap();
        }
        outputs.into_iter().map(|(rid, (t, _, _))| (rid, t)).collect::<Vec<_>>()
    };
    let cpu = run(false);
    assert!(cpu.iter().all(|(_, t)| t.len() == 20));
    assert_eq!(run(true), cpu);
}

#[test]
fn a_masked_or_missing_draw_ends_the_request_with_the_samplers_error() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    engine.submit(1, &[1, 2], greedy(4), Some(Box::new(AllowList::new(VOCAB, &[65, 66])))).unwrap();
    engine.submit(2, &[1, 2], greedy(4), Some(Box::new(AllowList::new(VOCAB, &[65, 66])))).unwrap();
    engine.submit(3, &[1, 2], greedy(4), None).unwrap();
    engine.submit(4, &[1, 2], greedy(4), Some(Box::new(AllowList::new(VOCAB, &[65, 66])))).unwrap();
    engine.schedule().unwrap();
    engine.sampling_batch().unwrap();
    let out = engine
        .commit_drawn(&DeviceDraws { tokens: &[Some(70), None, None, Some(66)], ..Default::default() })
        .unwrap();
    let kind = |i: usize| match &out.finished[i].as_ref().map(|f| &f.reason) {
        Some(FinishReason::Error { kind, message }) => Some((*kind, message.clone())),
        _ => None,
    };
    assert_eq!(kind(0).unwrap().0, ErrorKind::Grammar);
    assert!(kind(0).unwrap().1.contains("token 70"));
    assert_eq!(kind(1).unwrap().0, ErrorKind::Grammar, "nothing drawn under a grammar: the grammar's doing");
    assert_eq!(kind(2).unwrap().0, ErrorKind::Sampling);
    assert!(kind(3).is_none());
    assert_eq!(out.token_ids, vec![66]);
    engine.check_invariants().unwrap();
}

#[test]
fn commit_drawn_checks_its_input_and_changes_nothing_on_error() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    engine.submit(1, &[1, 2], greedy(2), None).unwrap();
    engine.submit(2, &[1, 2], greedy(2), None).unwrap();
    engine.schedule().unwrap();
    let bad = [
        DeviceDraws { tokens: &[Some(1)], ..Default::default() },
        DeviceDraws { tokens: &[Some(1), Some(VOCAB as u32)], ..Default::default() },
        DeviceDraws { tokens: &[Some(1), Some(2)], logprobs: Some(&[0.0]), ..Default::default() },
        DeviceDraws {
            tokens: &[Some(1), Some(2)],
            top_ids: &[1, 2],
            top_logprobs: &[0.0, 0.0],
            top_width: 2,
            ..Default::default()
        },
    ];
    for d in &bad {
        assert!(matches!(engine.commit_drawn(d), Err(EngineError::Protocol(_))), "{d:?}");
    }
    let out =
        engine.commit_drawn(&DeviceDraws { tokens: &[Some(1), Some(2)], ..Default::default() }).unwrap();
    assert_eq!(out.token_ids, vec![1, 2]);
}

#[test]
fn logprobs_given_are_kept_where_asked_and_only_finite_top_ones() {
    let mut engine = Engine::new(config(|_| {}), vocab()).unwrap();
    engine.submit(1, &[1, 2], greedy(2), None).unwrap();
    let asked = RequestParams {
        sampling: SamplingParams { temperature: 0.0, logprobs: true, top_logprobs: 2, ..Default::default() },
        ..greedy(2)
    };
    engine.submit(2, &[1, 2], asked, None).unwrap();
    engine.schedule().unwrap();
    let inf = f32::NEG_INFINITY;
    let out = engine
        .commit_drawn(&DeviceDraws {
            tokens: &[Some(4), Some(8)],
            logprobs: Some(&[-0.5, -0.25]),
            top_ids: &[4, 5, 6, 8, 9, 10],
            top_logprobs: &[-0.5, -1.0, -2.0, -0.25, inf, inf],
            top_width: 3,
        })
        .unwrap();
    assert!(out.logprobs[0].is_nan(), "not asked for");
    assert_eq!(out.logprobs[1], -0.25);
    assert_eq!(out.top_offsets, vec![0, 0, 1]);
    assert_eq!((out.top_ids.clone(), out.top_logprobs.clone()), (vec![8], vec![-0.25]));
}
