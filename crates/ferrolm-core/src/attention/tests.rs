//! The kernel against a plain f64 attention over the same (rounded) pool values, on random
//! plans: decodes and prefill chunks over cached prefixes, GQA, windows, split contexts,
//! one or several threads, every pool type.

use proptest::prelude::*;

use super::*;
use crate::quant::blocks::BlockQ8_0;

use crate::test_values::Values;

#[derive(Clone, Debug)]
struct Plan {
    geometry: Geometry,
    /// Per request: (cached prefix length, new tokens).
    requests: Vec<(usize, usize)>,
    window: Option<usize>,
    threads: usize,
    max_keys: Option<usize>,
    seed: u64,
}

fn plans() -> impl Strategy<Value = Plan> {
    let request = prop_oneof![(0usize..400, Just(1usize)), (0usize..120, 1usize..48)];
    (
        1usize..=3,
        prop::sample::select(vec![1usize, 2, 4, 8]),
        prop::sample::select(vec![8usize, 20, 24, 32, 48, 64, 128]),
        prop::collection::vec(request, 1..5),
        prop::option::of(1usize..64),
        1usize..=3,
        prop::option::of(1usize..150),
        1u64..u64::MAX,
    )
        .prop_map(|(kv_heads, group, head_dim, requests, window, threads, max_keys, seed)| Plan {
            geometry: Geometry { num_heads: kv_heads * group, num_kv_heads: kv_heads, head_dim },
            requests,
            window,
            threads,
            max_keys,
            seed,
        })
}

/// The step's columns, slots scattered over a pool with spare room.
struct Columns {
    positions: Vec<u32>,
    qo_offsets: Vec<u32>,
    kv_slots: Vec<u32>,
    kv_offsets: Vec<u32>,
    out_slots: Vec<u32>,
    num_slots: usize,
}

fn columns(plan: &Plan) -> Columns {
    let total: usize = plan.requests.iter().map(|(p, n)| p + n).sum();
    let num_slots = total + 7;
    // a scattered, non-repeating assignment of slots
    let mut order: Vec<u32> = (0..num_slots as u32).collect();
    let mut rng = Values(plan.seed);
    for i in (1..order.len()).rev() {
        let j = ((rng.next() + 1.0) * 0.5 * (i + 1) as f32) as usize % (i + 1);
        order.swap(i, j);
    }
    let mut c = Columns {
        positions: vec![],
        qo_offsets: vec![0],
        kv_slots: vec![],
        kv_offsets: vec![0],
        out_slots: vec![],
        num_slots,
    };
    let mut next = 0;
    for &(prefix, new) in &plan.requests {
        let slots = &order[next..next + prefix + new];
        next += prefix + new;
        c.kv_slots.extend_from_slice(slots);
        c.out_slots.extend_from_slice(&slots[prefix..]);
        c.positions.extend((prefix..prefix + new).map(|p| p as u32));
        c.qo_offsets.push(c.positions.len() as u32);
        c.kv_offsets.push(c.kv_slots.len() as u32);
    }
    c
}

/// The whole pool's values, widened.
fn widened<E: KvElem>(pool: &[E]) -> Vec<f32> {
    let mut out = vec![0f32; pool.len() * E::VALUES];
    E::load(pool, 0, &mut out);
    out
}

/// A pool holding `values` (rounded to its type).
fn pool_of<E: KvElem>(values: &[f32]) -> Vec<E> {
    let mut pool = E::zeros(values.len());
    E::store(values, &mut pool, 0);
    pool
}

fn reference<E: KvElem>(
    g: Geometry,
    c: &Columns,
    queries: &[f32],
    k_pool: &[E],
    v_pool: &[E],
    scale: f32,
    window: Option<usize>,
) -> Vec<f64> {
    let (k_pool, v_pool) = (widened(k_pool), widened(v_pool));
    let d = g.head_dim;
    let group = g.num_heads / g.num_kv_heads;
    let mut out = vec![0f64; queries.len()];
    for b in 0..c.qo_offsets.len() - 1 {
        let slots = &c.kv_slots[c.kv_offsets[b] as usize..c.kv_offsets[b + 1] as usize];
        for t in c.qo_offsets[b] as usize..c.qo_offsets[b + 1] as usize {
            let p = c.positions[t] as usize;
            let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
            for h in 0..g.num_heads {
                let q = &queries[(t * g.num_heads + h) * d..][..d];
                let at = |s: u32| (s as usize * g.num_kv_heads + h / group) * d;
                let scores: Vec<f64> = slots[first..=p]
                    .iter()
                    .map(|&s| {
                        let k = &k_pool[at(s)..at(s) + d];
                        q.iter().zip(k).map(|(&x, &y)| x as f64 * y as f64).sum::<f64>() * scale as f64
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                let o = &mut out[(t * g.num_heads + h) * d..][..d];
                for (&s, w) in slots[first..=p].iter().zip(&weights) {
                    for (o, v) in o.iter_mut().zip(&v_pool[at(s)..at(s) + d]) {
                        *o += w / total * *v as f64;
                    }
                }
            }
        }
    }
    out
}

fn check_plan<E: KvElem>(plan: &Plan) -> Result<(), TestCaseError> {
    let g = plan.geometry;
    let c = columns(plan);
    let mut rng = Values(plan.seed ^ 0x9e37_79b9_7f4a_7c15);
    let row = g.num_kv_heads * g.head_dim;
    // the cached prefixes are already in the pool; the step writes its new tokens
    let mut k_pool: Vec<E> = pool_of(&rng.vec(c.num_slots * row));
    let mut v_pool: Vec<E> = pool_of(&rng.vec(c.num_slots * row));
    let num_new = c.positions.len();
    let (new_k, new_v) = (rng.vec(num_new * row), rng.vec(num_new * row));
    write_kv(g, &c.out_slots, &new_k, &new_v, &mut k_pool, &mut v_pool).unwrap();
    // each new row lands in its slot, rounded as the type rounds it on its own
    let (k_all, v_all) = (widened(&k_pool), widened(&v_pool));
    let (k_want, v_want) = (widened(&pool_of::<E>(&new_k)), widened(&pool_of::<E>(&new_v)));
    for (t, &s) in c.out_slots.iter().enumerate() {
        let slot = s as usize * row..(s as usize + 1) * row;
        prop_assert_eq!(&k_all[slot.clone()], &k_want[t * row..(t + 1) * row]);
        prop_assert_eq!(&v_all[slot], &v_want[t * row..(t + 1) * row]);
    }
    let queries: Vec<f32> = rng.vec(num_new * g.num_heads * g.head_dim).iter().map(|x| x * 2.0).collect();
    let scale = (g.head_dim as f32).powf(-0.5);
    let options = Options {
        scale,
        sliding_window: plan.window,
        num_threads: plan.threads,
        max_keys_per_task: plan.max_keys,
    };
    let step = Step {
        positions: &c.positions,
        qo_offsets: &c.qo_offsets,
        kv_slots: &c.kv_slots,
        kv_offsets: &c.kv_offsets,
    };
    let mut out = vec![f32::NAN; queries.len()];
    attend(g, &step, &queries, &k_pool, &v_pool, &options, &mut out).unwrap();
    let want = reference(g, &c, &queries, &k_pool, &v_pool, scale, plan.window);
    // values are in [-1, 1] and outputs are averages of them: an absolute bound
    for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
        prop_assert!((got as f64 - want).abs() <= 2e-5, "out[{}] = {}, reference {}", i, got, want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn equals_reference_f32(plan in plans()) {
        check_plan::<f32>(&plan)?;
    }

    #[test]
    fn equals_reference_f16(plan in plans()) {
        check_plan::<f16>(&plan)?;
    }

    #[test]
    fn equals_reference_bf16(plan in plans()) {
        check_plan::<bf16>(&plan)?;
    }

    #[test]
    fn equals_reference_q8_0(plan in plans(), blocks in 1usize..=4) {
        // Q8_0 keeps whole blocks of 32 per head
        let geometry = Geometry { head_dim: 32 * blocks, ..plan.geometry };
        check_plan::<BlockQ8_0>(&Plan { geometry, ..plan })?;
    }
}

#[test]
fn q8_0_pool_holds_ggml_blocks_and_needs_whole_blocks_per_head() {
    // a row stored in the pool is ggml's reference quantization of it: within half a
    // step of its block's scale, plus the scale's own rounding to f16 (2^-11 relative)
    // times the largest code
    let mut rng = Values(3);
    let row = rng.vec(2 * 64);
    let pool: Vec<BlockQ8_0> = pool_of(&row);
    let back = widened(&pool);
    for (xs, (ys, block)) in row.chunks(32).zip(back.chunks(32).zip(&pool)) {
        let want = crate::quant::dot::quantize_q8_0_block(xs);
        assert_eq!((block.d, block.qs), (want.d, want.qs));
        let step = half::f16::from_le_bytes(block.d).to_f32();
        for (x, y) in xs.iter().zip(ys) {
            assert!((x - y).abs() <= (0.5 + 127.0 / 2048.0) * step * 1.0001, "{x} read back as {y}");
        }
    }
    // a head of 48 values would split a block between two heads
    let g = Geometry { num_heads: 2, num_kv_heads: 2, head_dim: 48 };
    let (mut k, mut v) = (BlockQ8_0::zeros(4 * 96), BlockQ8_0::zeros(4 * 96));
    let err = write_kv(g, &[0], &[0.0; 96], &[0.0; 96], &mut k, &mut v).unwrap_err();
    assert_eq!(err.field, "geometry");
    assert!(err.message.contains("q8_0") && err.message.contains("32"), "{}", err.message);
}

#[test]
fn long_contexts_are_split_across_threads_and_agree() {
    // enough work for threads: a single decode over 20,000 keys (split into key blocks on
    // several threads, merged), then decodes beside a prefill chunk over a cached prefix
    let plan = Plan {
        geometry: Geometry { num_heads: 8, num_kv_heads: 2, head_dim: 64 },
        requests: vec![(20_000, 1)],
        window: None,
        threads: 4,
        max_keys: None,
        seed: 7,
    };
    check_plan::<f16>(&plan).unwrap();
    check_plan::<f32>(&Plan { window: Some(15_000), ..plan.clone() }).unwrap();
    let mixed = vec![(6_000, 1), (6_000, 1), (3_000, 40), (6_000, 1)];
    check_plan::<bf16>(&Plan { requests: mixed.clone(), threads: 2, ..plan.clone() }).unwrap();
    check_plan::<BlockQ8_0>(&Plan { requests: mixed, threads: 3, ..plan }).unwrap();
}

#[test]
fn inside_a_rayon_pool_the_split_runs_on_its_threads_and_agrees() {
    // num_threads 0 inside a pool: the pool's threads, splitting from far less work (a
    // decode over 2,000 keys), as the quant runner's step calls it
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    let plan = Plan {
        geometry: Geometry { num_heads: 9, num_kv_heads: 3, head_dim: 64 },
        requests: vec![(2_000, 1), (700, 1), (300, 24)],
        window: None,
        threads: 0,
        max_keys: None,
        seed: 11,
    };
    pool.install(|| check_plan::<f16>(&plan)).unwrap();
    pool.install(|| check_plan::<f32>(&Plan { window: Some(512), ..plan })).unwrap();
}

#[test]
fn errors_name_the_argument() {
    let g = Geometry { num_heads: 4, num_kv_heads: 2, head_dim: 8 };
    let pool = vec![0f32; 10 * 2 * 8];
    let q = vec![0f32; 4 * 8];
    let mut out = vec![0f32; 4 * 8];
    let opts = Options::new(1.0);
    let run = |positions: &[u32], qo: &[u32], slots: &[u32], kvo: &[u32], o: &Options, out: &mut [f32]| {
        let step = Step { positions, qo_offsets: qo, kv_slots: slots, kv_offsets: kvo };
        attend(g, &step, &q, &pool, &pool, o, out).map_err(|e| e.field)
    };
    assert_eq!(run(&[0], &[0, 1], &[3], &[0, 1], &opts, &mut out), Ok(()));
    assert_eq!(run(&[1], &[0, 1], &[3], &[0, 1], &opts, &mut out), Err("positions"));
    assert_eq!(run(&[0], &[0, 1], &[10], &[0, 1], &opts, &mut out), Err("kv_slots"));
    assert_eq!(run(&[0], &[0, 2], &[3], &[0, 1], &opts, &mut out), Err("qo_offsets"));
    assert_eq!(run(&[0], &[0, 1], &[3], &[0, 2], &opts, &mut out), Err("kv_offsets"));
    assert_eq!(run(&[0], &[0, 1], &[3], &[0, 1], &opts, &mut out[..8]), Err("out"));
    assert_eq!(run(&[0, 0], &[0, 2], &[3], &[0, 1], &opts, &mut out), Err("queries"));
    let windowless = Options { sliding_window: Some(0), ..opts };
    assert_eq!(run(&[0], &[0, 1], &[3], &[0, 1], &windowless, &mut out), Err("sliding_window"));
    let bad = Geometry { num_heads: 3, num_kv_heads: 2, head_dim: 8 };
    assert_eq!(
        attend(
            bad,
            &Step { positions: &[], qo_offsets: &[0, 0], kv_slots: &[], kv_offsets: &[0, 0] },
            &[],
            &pool,
            &pool,
            &opts,
            &mut []
        )
        .map_err(|e| e.field),
        Err("geometry")
    );
    let mut k = vec![0f32; 10 * 16];
    let mut v = vec![0f32; 10 * 16];
    let err = write_kv(g, &[10], &[0.0; 16], &[0.0; 16], &mut k, &mut v).unwrap_err();
    assert_eq!(err.field, "out_slots");
    let err = write_kv(g, &[1], &[0.0; 15], &[0.0; 16], &mut k, &mut v).unwrap_err();
    assert_eq!(err.field, "keys");
}

/// One task (a prefill block over a scattered context) run by the portable loop and by
/// the one this CPU picks: the same states, to rounding (the portable loop sums in
/// another order and without fused multiply-adds).
fn portable_matches_picked<E: KvElem>(head_dim: usize) {
    let (num_heads, num_kv_heads, tokens, context) = (6, 2, 5, 150);
    let mut rng = Values(head_dim as u64 + 5);
    let row = num_kv_heads * head_dim;
    let k_pool: Vec<E> = pool_of(&rng.vec(200 * row));
    let v_pool: Vec<E> = pool_of(&rng.vec(200 * row));
    let slots: Vec<u32> = (0..context as u32).map(|i| (i * 37) % 200).collect();
    let queries = rng.vec(tokens * num_heads * head_dim);
    let positions: Vec<u32> = (context - tokens..context).map(|p| p as u32).collect();
    let input = kernel::TaskInput {
        queries: &queries,
        positions: &positions,
        slots: &slots,
        keys: 10..context,
        k_pool: &k_pool,
        v_pool: &v_pool,
        num_heads,
        num_kv_heads,
        head_dim,
        window: 120,
    };
    let states = tokens * num_heads * (STATE_HEADER + head_dim);
    let (mut portable, mut picked) = (vec![f32::NAN; states], vec![f32::NAN; states]);
    kernel::run_portable(&input, &mut Workspace::new(row), &mut portable);
    run_task(&input, &mut Workspace::new(row), &mut picked);
    for (i, (a, b)) in portable.iter().zip(&picked).enumerate() {
        assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "{} state[{i}]: {a} vs {b}", E::NAME);
    }
}

#[test]
fn portable_loop_matches_the_simd_loops_on_every_pool_type() {
    for head_dim in [32, 64, 128] {
        portable_matches_picked::<f32>(head_dim);
        portable_matches_picked::<f16>(head_dim);
        portable_matches_picked::<bf16>(head_dim);
        portable_matches_picked::<BlockQ8_0>(head_dim);
    }
    portable_matches_picked::<f16>(20);
}

/// A query row's output is the same bits whatever else the step holds: alone, beside
/// other requests, or as the first of several new tokens (a speculative draft's rows),
/// on one thread or several. The context is cut at the same keys in every step.
#[test]
fn a_rows_output_does_not_depend_on_the_rest_of_the_step() {
    let g = Geometry { num_heads: 9, num_kv_heads: 3, head_dim: 64 };
    let row = g.num_kv_heads * g.head_dim;
    let ctx = 1_000; // several key blocks
    let mut rng = Values(5);
    let num_slots = ctx + 8 + 2_000;
    let k_pool: Vec<f16> = pool_of(&rng.vec(num_slots * row));
    let v_pool: Vec<f16> = pool_of(&rng.vec(num_slots * row));
    let width = g.num_heads * g.head_dim;
    let queries = rng.vec(4 * width);
    let ours: Vec<u32> = (0..ctx as u32 + 4).collect();
    let other: Vec<u32> = (ctx as u32 + 8..ctx as u32 + 2_008).collect();
    // our request's new tokens: the last `n` of its slots; run it as `n` tokens, maybe
    // after another request decoding over 2,000 keys
    let run = |n: usize, beside: bool, threads: usize| -> Vec<f32> {
        let mine = &ours[..ctx + n];
        let mut positions: Vec<u32> = (ctx as u32..(ctx + n) as u32).collect();
        let mut q = queries[..n * width].to_vec();
        let (mut qo, mut kv_slots, mut kv) = (vec![0, n as u32], mine.to_vec(), vec![0, mine.len() as u32]);
        if beside {
            positions.push(other.len() as u32 - 1);
            q.extend_from_slice(&queries[3 * width..4 * width]);
            qo.push(n as u32 + 1);
            kv_slots.extend_from_slice(&other);
            kv.push(kv_slots.len() as u32);
        }
        let step = Step { positions: &positions, qo_offsets: &qo, kv_slots: &kv_slots, kv_offsets: &kv };
        // inside a rayon pool, as the quant runner's step calls it (splits from little work)
        let options = Options { scale: 0.125, sliding_window: None, num_threads: 0, max_keys_per_task: None };
        let mut out = vec![0f32; q.len()];
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| attend(g, &step, &q, &k_pool, &v_pool, &options, &mut out)).unwrap();
        out[..width].to_vec() // the first new token's heads
    };
    let alone = run(1, false, 1);
    for (n, beside, threads) in [(1, true, 1), (1, false, 3), (2, false, 1), (4, true, 2), (3, false, 4)] {
        let got = run(n, beside, threads);
        assert!(
            got.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{n} new tokens, beside another: {beside}, {threads} threads"
        );
    }
}
