use super::*;

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::default();
    f(&mut p);
    p.validate(1 << 20).unwrap();
    p
}

fn mask_of(allowed: &[usize], vocab: usize) -> Vec<u32> {
    let mut m = vec![0u32; vocab.div_ceil(32)];
    for &t in allowed {
        m[t / 32] |= 1 << (t % 32);
    }
    m
}

fn histogram(p: SamplingParams, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut s = Sampler::new(p, &[], 7);
    let mut h = vec![0; logits.len()];
    for _ in 0..draws {
        h[s.sample(&mut logits.to_vec(), None).unwrap().token as usize] += 1;
    }
    h
}

#[test]
fn greedy_takes_the_argmax_lowest_index_on_ties() {
    let mut s = Sampler::new(params(|p| p.temperature = 0.0), &[], 0);
    assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0], None).unwrap().token, 1);
    let mut s = Sampler::new(params(|p| p.top_k = 1), &[], 0);
    assert_eq!(s.sample(&mut [0.1, 2.0, 3.0], None).unwrap().token, 2);
}

#[test]
fn same_seed_same_tokens_different_seed_different_tokens() {
    let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
    let run = |seed| {
        let mut s = Sampler::new(params(|p| p.seed = Some(seed)), &[], 999);
        (0..40).map(|_| s.sample(&mut logits.clone(), None).unwrap().token).collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn temperature_sampling_follows_the_softmax() {
    let logits = [0.0f32, 1.0, 2.0];
    let h = histogram(params(|_| {}), &logits, 20_000);
    let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
    for (i, &l) in logits.iter().enumerate() {
        let expected = (l as f64).exp() / z * 20_000.0;
        assert!((h[i] as f64 - expected).abs() < 0.05 * 20_000.0, "{h:?}");
    }
}

#[test]
fn top_k_top_p_min_p_cut_the_tail() {
    let logits = [5.0f32, 4.0, 1.0, 0.0, -1.0];
    assert!(histogram(params(|p| p.top_k = 2), &logits, 2000)[2..].iter().all(|&c| c == 0));
    // p(0) ≈ 0.72, p(0)+p(1) ≈ 0.99: top_p 0.9 keeps two tokens
    let h = histogram(params(|p| p.top_p = 0.9), &logits, 2000);
    assert!(h[2..].iter().all(|&c| c == 0) && h[1] > 0, "{h:?}");
    // min_p 0.5 keeps tokens with p >= 0.5 * p(max): only token 0
    assert_eq!(histogram(params(|p| p.min_p = 0.5), &logits, 500)[0], 500);
}

#[test]
fn masked_tokens_are_never_sampled_and_empty_mask_errors() {
    let logits = [9.0f32, 0.0, 0.0, 8.0];
    let mask = mask_of(&[1, 3], 4);
    let mut s = Sampler::new(params(|_| {}), &[], 3);
    for _ in 0..500 {
        let t = s.sample(&mut logits.to_vec(), Some(&mask)).unwrap().token;
        assert!(t == 1 || t == 3);
    }
    let mut g = Sampler::new(params(|p| p.temperature = 0.0), &[], 3);
    assert_eq!(g.sample(&mut logits.to_vec(), Some(&mask)).unwrap().token, 3);
    assert_eq!(g.sample(&mut logits.to_vec(), Some(&mask_of(&[], 4))), Err(NoAllowedToken));
}

#[test]
fn penalties_and_bias_change_logits_as_documented() {
    let p = params(|p| {
        p.temperature = 0.0;
        p.repetition_penalty = 2.0;
        p.frequency_penalty = 0.5;
        p.presence_penalty = 0.25;
        p.logit_bias = vec![(3, -1.0)];
    });
    let mut s = Sampler::new(p, &[0], 0);
    s.observe(1);
    s.observe(1);
    let mut logits = vec![4.0f32, 4.0, -2.0, 1.0];
    s.steer(&mut logits, None);
    // token 0: in the prompt, positive: 4 / 2
    // token 1: seen and twice generated: 4 / 2 - 0.5 * 2 - 0.25
    // token 3: bias -1
    assert_eq!(logits, vec![2.0, 0.75, -2.0, 0.0]);
}

#[test]
fn logprobs_are_normalised_and_ordered() {
    let p = params(|p| {
        p.temperature = 0.0;
        p.logprobs = true;
        p.top_logprobs = 2;
    });
    let mut s = Sampler::new(p, &[], 0);
    let out = s.sample(&mut [1.0f32, 3.0, 2.0], None).unwrap();
    assert_eq!(out.token, 1);
    let z = (1f32.exp() + 3f32.exp() + 2f32.exp()).ln();
    assert!((out.logprob.unwrap() - (3.0 - z)).abs() < 1e-5);
    assert_eq!(out.top_logprobs.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
    assert!((out.top_logprobs[1].1 - (2.0 - z)).abs() < 1e-5);
}

proptest::proptest! {
    /// The selection-based top-p cut keeps exactly the set a full sort would keep.
    #[test]
    fn top_p_cut_matches_sorting(ws in proptest::collection::vec(0u8..50, 1..600), p in 0.01f64..1.0) {
        let weights: Vec<f32> = ws.iter().map(|&w| w as f32 / 7.0).collect();
        let total: f64 = weights.iter().map(|&w| w as f64).sum();
        let mut sorted: Vec<u32> = (0..weights.len() as u32).collect();
        sorted.sort_by(|a, b| weights[*b as usize].total_cmp(&weights[*a as usize]).then(a.cmp(b)));
        let mut acc = 0.0;
        let mut want = sorted.len();
        for (n, &i) in sorted.iter().enumerate() {
            acc += weights[i as usize] as f64;
            if acc >= p * total { want = n + 1; break; }
        }
        let mut keys: Vec<u64> = weights.iter().enumerate()
            .map(|(i, &w)| (w.to_bits() as u64) << 32 | !(i as u32) as u64).collect();
        let k = top_p_cut(&mut keys, p * total);
        let mut got: Vec<u32> = keys[..k].iter().map(|&k| key_index(k)).collect();
        got.sort();
        let mut expected = sorted[..want].to_vec();
        expected.sort();
        proptest::prop_assert_eq!(got, expected);
    }
}
