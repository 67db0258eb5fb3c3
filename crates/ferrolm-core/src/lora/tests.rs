//! The kernel against a plain f64 `s·B·A x` on random steps (several adapters, rows in
//! no group, adapters without the projection), inline and cut into pieces on a pool;
//! `from_parts`'s layout and refusals.

use proptest::prelude::*;

use super::kernel::{apply_split, Split};
use super::*;

use crate::test_values::Values;

/// A model shape in which `target` reads `in_dim` and writes `out_dim` (the other
/// sizes are whatever is left over).
fn shape_for(target: Target, in_dim: usize, out_dim: usize) -> LoraShape {
    let mut s = LoraShape { layers: 2, hidden: 5, q_dim: 6, kv_dim: 3, intermediate: 7 };
    match target {
        Target::Q => (s.hidden, s.q_dim) = (in_dim, out_dim),
        Target::K | Target::V => (s.hidden, s.kv_dim) = (in_dim, out_dim),
        Target::O => (s.q_dim, s.hidden) = (in_dim, out_dim),
        Target::Gate | Target::Up => (s.hidden, s.intermediate) = (in_dim, out_dim),
        Target::Down => (s.intermediate, s.hidden) = (in_dim, out_dim),
    }
    assert_eq!(s.dims(target), (in_dim, out_dim));
    s
}

/// One adapter of a step: its matrices in PEFT's layout, kept for the reference.
struct Spec {
    /// `None`: the adapter does not adapt the projection under test.
    matrices: Option<(usize, Vec<f32>, Vec<f32>, f32)>,
    adapter: Adapter,
}

/// An adapter with `rank` (or without the projection: rank 0) on layer 1's `target`,
/// and another projection of layer 0 that the step does not ask for.
fn spec(shape: &LoraShape, target: Target, rank: usize, values: &mut Values) -> Spec {
    let (in_dim, out_dim) = shape.dims(target);
    let other = Target::ALL[(target.index() + 3) % 7];
    let (oi, oo) = shape.dims(other);
    let mut parts = vec![(0, other, 2, values.vec(2 * oi), values.vec(oo * 2), 0.5)];
    let matrices = (rank > 0).then(|| {
        let scaling = 0.25 + values.next().abs() * 4.0;
        (rank, values.vec(rank * in_dim), values.vec(out_dim * rank), scaling)
    });
    if let Some((rank, a, b, s)) = &matrices {
        parts.push((1, target, *rank, a.clone(), b.clone(), *s));
    }
    let adapter = Adapter::from_parts(shape, parts).expect("a well-formed adapter");
    Spec { matrices, adapter }
}

/// `out0 + s·B (A x)` per row, in f64, and the sum of the terms' magnitudes (the scale
/// of the f32 rounding error).
fn reference(spec: &Spec, x: &[f32], out0: &[f32]) -> Vec<(f64, f64)> {
    let (rank, a, b, s) = spec.matrices.as_ref().expect("the adapter has the projection");
    let (out_dim, in_dim) = (out0.len(), x.len());
    let shrunk: Vec<(f64, f64)> = (0..*rank)
        .map(|j| {
            let row = &a[j * in_dim..(j + 1) * in_dim];
            let v = row.iter().zip(x).map(|(&a, &x)| a as f64 * x as f64);
            v.clone().fold((0.0, 0.0), |(sum, mag), v| (sum + v, mag + v.abs()))
        })
        .collect();
    (0..out_dim)
        .map(|o| {
            let mut sum = out0[o] as f64;
            let mut mag = sum.abs();
            for (j, (d, dmag)) in shrunk.iter().enumerate() {
                let w = b[o * rank + j] as f64 * *s as f64;
                sum += d * w;
                mag += dmag * w.abs();
            }
            (sum, mag)
        })
        .collect()
}

#[derive(Clone, Debug)]
struct Step {
    target: Target,
    in_dim: usize,
    out_dim: usize,
    /// Per adapter: its rank on the projection (0: none).
    ranks: Vec<usize>,
    /// Runs of rows: (length, the adapter that runs them, or none).
    runs: Vec<(usize, Option<usize>)>,
    seed: u64,
}

fn steps() -> impl Strategy<Value = Step> {
    (
        0usize..7,
        1usize..80,
        1usize..80,
        prop::collection::vec(prop_oneof![1 => Just(0usize), 4 => 1usize..24], 1..4),
        prop::collection::vec((0usize..7, prop::option::of(0usize..4)), 0..8),
        1u64..u64::MAX,
    )
        .prop_map(|(t, in_dim, out_dim, ranks, runs, seed)| {
            let runs = runs.into_iter().map(|(n, a)| (n, a.map(|a| a % ranks.len()))).collect();
            Step { target: Target::ALL[t], in_dim, out_dim, ranks, runs, seed }
        })
}

/// Runs `step` with `split` and checks every row against the reference (rows outside a
/// group, or whose adapter lacks the projection, unchanged bit for bit); returns `out`.
fn check(step: &Step, split: Split) -> Vec<f32> {
    let mut values = Values(step.seed);
    let shape = shape_for(step.target, step.in_dim, step.out_dim);
    let specs: Vec<Spec> = step.ranks.iter().map(|&r| spec(&shape, step.target, r, &mut values)).collect();
    let tokens: usize = step.runs.iter().map(|r| r.0).sum();
    let (x, out0) = (values.vec(tokens * step.in_dim), values.vec(tokens * step.out_dim));
    let mut groups = Vec::new();
    let mut row_adapter = vec![None; tokens];
    let mut first = 0;
    for &(n, adapter) in &step.runs {
        if let Some(k) = adapter {
            groups.push(TokenGroup { adapter: &specs[k].adapter, tokens: first..first + n });
            row_adapter[first..first + n].fill(Some(k));
        }
        first += n;
    }
    groups.reverse(); // any order will do
    let mut out = out0.clone();
    apply_split(1, step.target, &x, step.in_dim, &mut out, step.out_dim, &groups, split);
    for t in 0..tokens {
        let rows = |v: &[f32], w: usize| v[t * w..(t + 1) * w].to_vec();
        let (got, base) = (rows(&out, step.out_dim), rows(&out0, step.out_dim));
        match row_adapter[t].map(|k| &specs[k]).filter(|s| s.matrices.is_some()) {
            None => {
                assert!(got.iter().zip(&base).all(|(g, b)| g.to_bits() == b.to_bits()), "row {t} changed")
            }
            Some(spec) => {
                for (o, (&g, (want, mag))) in
                    got.iter().zip(reference(spec, &rows(&x, step.in_dim), &base)).enumerate()
                {
                    let err = (g as f64 - want).abs();
                    assert!(err <= 1e-5 * mag + 1e-30, "row {t} out {o}: {g} vs {want} (scale {mag})");
                }
            }
        }
    }
    out
}

const INLINE: Split = Split { parallel_from: usize::MAX, min_piece: 1 };
const PIECES: Split = Split { parallel_from: 0, min_piece: 1 };

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn apply_matches_the_reference(step in steps()) {
        let inline = check(&step, INLINE);
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let cut = pool.install(|| check(&step, PIECES));
        // a row's floats do not depend on how the step was cut
        prop_assert!(inline.iter().zip(&cut).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn a_big_step_runs_on_the_pool_with_the_same_floats() {
    let step = Step {
        target: Target::Gate,
        in_dim: 96,
        out_dim: 200,
        ranks: vec![16, 0, 8],
        runs: vec![(70, Some(0)), (5, None), (1, Some(2)), (3, Some(1)), (150, Some(2)), (9, None)],
        seed: 7,
    };
    let inline = check(&step, INLINE);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let public = pool.install(|| {
        let mut values = Values(step.seed);
        let shape = shape_for(step.target, step.in_dim, step.out_dim);
        let specs: Vec<Spec> =
            step.ranks.iter().map(|&r| spec(&shape, step.target, r, &mut values)).collect();
        let tokens = 238;
        let (x, mut out) = (values.vec(tokens * step.in_dim), values.vec(tokens * step.out_dim));
        let groups = [
            TokenGroup { adapter: &specs[0].adapter, tokens: 0..70 },
            TokenGroup { adapter: &specs[2].adapter, tokens: 75..76 },
            TokenGroup { adapter: &specs[1].adapter, tokens: 76..79 },
            TokenGroup { adapter: &specs[2].adapter, tokens: 79..229 },
        ];
        apply(1, step.target, &x, step.in_dim, &mut out, step.out_dim, &groups);
        out
    });
    assert!(inline.iter().zip(&public).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
#[should_panic(expected = "overlap")]
fn overlapping_groups_are_a_bug() {
    let shape = shape_for(Target::Q, 4, 4);
    let adapter = spec(&shape, Target::Q, 2, &mut Values(1)).adapter;
    let groups =
        [TokenGroup { adapter: &adapter, tokens: 0..2 }, TokenGroup { adapter: &adapter, tokens: 1..3 }];
    apply(1, Target::Q, &[0.0; 12], 4, &mut [0.0; 12], 4, &groups);
}

fn tiny() -> LoraShape {
    LoraShape { layers: 2, hidden: 3, q_dim: 4, kv_dim: 2, intermediate: 5 }
}

#[test]
fn from_parts_transposes_b_and_folds_in_the_scaling() {
    // K: hidden 3 -> kv_dim 2, rank 2
    let a = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let b = vec![1.0, 2.0, 3.0, 4.0]; // [out 2][rank 2]
    let down = (1, Target::Down, 1, vec![0.5; 5], vec![0.25; 3], 1.0);
    let adapter = Adapter::from_parts(&tiny(), vec![(0, Target::K, 2, a.clone(), b, 0.5), down]).unwrap();
    let k = adapter.get(0, Target::K).unwrap();
    assert_eq!((k.rank, k.in_dim, k.out_dim), (2, 3, 2));
    assert_eq!(k.a, a);
    assert_eq!(k.b_t, vec![0.5, 1.5, 1.0, 2.0]);
    assert!(adapter.get(1, Target::K).is_none() && adapter.get(5, Target::K).is_none());
    assert_eq!(adapter.targets(), vec![Target::K, Target::Down]);
    assert_eq!(adapter.max_rank(), 2);
    assert_eq!(adapter.bytes(), (6 + 4 + 5 + 3) * 4);
    assert_eq!(adapter.shape(), &tiny());
}

#[test]
fn from_parts_refuses_what_does_not_fit() {
    type Parts = Vec<RawPart>;
    let q = |layer, rank, a: usize, b: usize| (layer, Target::Q, rank, vec![0.1; a], vec![0.1; b], 2.0);
    let cases: Vec<(Parts, &str)> = vec![
        (vec![], "no LoRA matrices"),
        (vec![q(0, 2, 5, 8)], "layer 0 q_proj: A has 5 values; rank 2 × hidden 3 needs 6"),
        (vec![q(0, 2, 6, 6)], "layer 0 q_proj: B has 6 values; q_dim 4 × rank 2 needs 8"),
        (vec![q(2, 2, 6, 8)], "layer 2 q_proj: the model has 2 layers"),
        (vec![q(0, 0, 0, 0)], "layer 0 q_proj: rank 0"),
        (vec![q(1, 2, 6, 8), q(1, 2, 6, 8)], "layer 1 q_proj: given twice"),
        (vec![(0, Target::Q, 2, vec![0.1; 6], vec![0.1; 8], f32::NAN)], "scaling NaN"),
        (vec![(0, Target::Q, 2, vec![f32::INFINITY; 6], vec![0.1; 8], 1.0)], "A holds inf at index 0"),
        (vec![(0, Target::Q, 2, vec![0.1; 6], vec![1e30; 8], 1e10)], "layer 0 q_proj: B[0][0]"),
        (vec![(1, Target::Down, 1, vec![0.1; 4], vec![0.1; 3], 1.0)], "layer 1 down_proj: A has 4 values"),
    ];
    for (parts, want) in cases {
        let err = Adapter::from_parts(&tiny(), parts).unwrap_err();
        assert_eq!(err.file, "");
        assert!(err.message.contains(want), "{:?} lacks {want:?}", err.message);
        assert_eq!(err.to_string(), err.message);
    }
}

#[test]
fn targets_index_and_name_in_order() {
    let names: Vec<_> = Target::ALL.iter().map(|t| t.peft_name()).collect();
    assert_eq!(names, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]);
    assert!(Target::ALL.iter().enumerate().all(|(i, t)| t.index() == i));
    let s = LoraShape { layers: 1, hidden: 10, q_dim: 20, kv_dim: 5, intermediate: 30 };
    let dims: Vec<_> = Target::ALL.iter().map(|&t| s.dims(t)).collect();
    assert_eq!(dims, [(10, 20), (10, 5), (10, 5), (20, 10), (10, 30), (10, 30), (30, 10)]);
}
