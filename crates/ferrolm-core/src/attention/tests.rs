//! The kernel against a plain f64 attention over the same (rounded) pool values, on random
//! plans: decodes and prefill chunks over cached prefixes, GQA, windows, split contexts,
//! one or several threads, all three pool types.

use proptest::prelude::*;

use super::*;

/// A deterministic stream of values in [-1, 1).
struct Values(u64);

impl Values {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

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

fn reference<E: KvElem>(
    g: Geometry,
    c: &Columns,
    queries: &[f32],
    k_pool: &[E],
    v_pool: &[E],
    scale: f32,
    window: Option<usize>,
) -> Vec<f64> {
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
                        q.iter().zip(k).map(|(&x, &y)| x as f64 * y.to_f32() as f64).sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                let o = &mut out[(t * g.num_heads + h) * d..][..d];
                for (&s, w) in slots[first..=p].iter().zip(&weights) {
                    for (o, v) in o.iter_mut().zip(&v_pool[at(s)..at(s) + d]) {
                        *o += w / total * v.to_f32() as f64;
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
    let mut k_pool: Vec<E> = rng.vec(c.num_slots * row).into_iter().map(E::from_f32).collect();
    let mut v_pool: Vec<E> = rng.vec(c.num_slots * row).into_iter().map(E::from_f32).collect();
    let num_new = c.positions.len();
    let (new_k, new_v) = (rng.vec(num_new * row), rng.vec(num_new * row));
    write_kv(g, &c.out_slots, &new_k, &new_v, &mut k_pool, &mut v_pool).unwrap();
    for (t, &s) in c.out_slots.iter().enumerate() {
        for i in 0..row {
            prop_assert_eq!(k_pool[s as usize * row + i].to_f32(), E::from_f32(new_k[t * row + i]).to_f32());
            prop_assert_eq!(v_pool[s as usize * row + i].to_f32(), E::from_f32(new_v[t * row + i]).to_f32());
        }
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
    check_plan::<bf16>(&Plan { requests: mixed, threads: 2, ..plan }).unwrap();
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
