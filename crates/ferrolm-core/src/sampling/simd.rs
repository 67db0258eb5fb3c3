//! Whole-row kernels written so the compiler vectorizes them: lane-wise max, a branch-free
//! exp, and the argmax built on them. A row is 32k–200k logits and every running request
//! needs one per step, so these loops are the sampler's cost.
//!
//! Each kernel is compiled twice on x86-64, for the baseline (SSE2) and with AVX2, and picks
//! at run time (`multiversion!`). AVX2 only widens the lanes: no FMA, so every lane does
//! the same IEEE operations in the same order and both versions give the same bits (a
//! result must not depend on the CPU it ran on).

/// `pub fn name(args) -> ret` running `body` built for AVX2 where the CPU has it.
macro_rules! multiversion {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn portable($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) -> $ret { portable($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (checked just above; the check is cached)
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable($($arg),*)
        }

        /// The baseline build alone, for the tests that check both builds agree.
        #[cfg(test)]
        pub(crate) mod $name {
            use super::*;
            pub(crate) fn portable($($arg: $ty),*) -> $ret $body
        }
    };
}

const LANES: usize = 8;

multiversion! {
/// The largest value, ignoring NaN; `-inf` for an empty or all-`-inf` row.
pub fn max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            lanes[i] = if c[i] > lanes[i] { c[i] } else { lanes[i] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &x in lanes.iter().chain(chunks.remainder()) {
        if x > m {
            m = x;
        }
    }
    m
}
}

multiversion! {
/// Index of the largest value (NaN ignored), lowest index on ties; `None` if every value
/// is `-inf` or NaN. One pass: each lane keeps its best value and where it saw it.
pub fn argmax(xs: &[f32]) -> Option<u32> {
    // twice the lanes of `max`: more independent compare chains in flight
    const W: usize = 2 * LANES;
    let mut best = [f32::NEG_INFINITY; W];
    let mut at = [u32::MAX; W];
    let mut chunks = xs.chunks_exact(W);
    let mut base = 0u32;
    for c in &mut chunks {
        for i in 0..W {
            let better = c[i] > best[i];
            best[i] = if better { c[i] } else { best[i] };
            at[i] = if better { base + i as u32 } else { at[i] };
        }
        base += W as u32;
    }
    let mut winner: Option<(f32, u32)> = None;
    let tail = chunks.remainder().iter().enumerate().map(|(i, &x)| (x, base + i as u32));
    for (x, i) in best.iter().copied().zip(at).chain(tail) {
        if x > f32::NEG_INFINITY && winner.is_none_or(|(w, wi)| x > w || (x == w && i < wi)) {
            winner = Some((x, i));
        }
    }
    winner.map(|(_, i)| i)
}
}

/// exp(x) for x <= 0 within 2 ulp-ish (relative error < 1e-6), exactly 0 for `-inf`.
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let finite = x > -87.0;
    let x = if finite { x } else { -87.0 };
    // k = n + ROUND exactly, so n sits in k's low mantissa bits: integer math from here
    // on, which vectorizes (a float-to-int `as` cast would not)
    let k = x * LOG2E + ROUND;
    let n = k - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let n_int = k.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_int.wrapping_add(127) << 23);
    let keep = if finite { u32::MAX } else { 0 };
    f32::from_bits((p * scale).to_bits() & keep)
}

multiversion! {
/// `out[i] = exp((xs[i] - shift) * scale)` for rows whose values are at most `shift`;
/// returns the sum (accumulated in lanes of f32, then f64).
pub fn exp_shifted(xs: &[f32], shift: f32, scale: f32, out: &mut Vec<f32>) -> f64 {
    out.clear();
    out.resize(xs.len(), 0.0);
    let mut total = 0f64;
    // blocks of 4096: short enough that f32 lane sums keep their precision
    for (xb, ob) in xs.chunks(4096).zip(out.chunks_mut(4096)) {
        let mut lanes = [0f32; LANES];
        let mut xc = xb.chunks_exact(LANES);
        let mut oc = ob.chunks_exact_mut(LANES);
        for (x, o) in (&mut xc).zip(&mut oc) {
            for i in 0..LANES {
                let e = exp_nonpositive((x[i] - shift) * scale);
                o[i] = e;
                lanes[i] += e;
            }
        }
        for (x, o) in xc.remainder().iter().zip(oc.into_remainder()) {
            *o = exp_nonpositive((x - shift) * scale);
            lanes[0] += *o;
        }
        total += lanes.iter().map(|&v| v as f64).sum::<f64>();
    }
    total
}
}

multiversion! {
/// Sum of a block of weights, vectorized.
pub fn sum(xs: &[f32]) -> f64 {
    let mut lanes = [0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            lanes[i] += c[i];
        }
    }
    lanes.iter().chain(chunks.remainder()).map(|&v| v as f64).sum()
}
}

multiversion! {
/// `gate[i] = silu(gate[i]) * up[i]` (the CPU model's gated MLP), SiLU as `x * sigmoid(x)`
/// with the branch-free exp of a non-positive argument, so the loop vectorizes:
/// `sigmoid(x) = 1 / (1 + e^-x)` for `x >= 0` and `e^x / (1 + e^x)` below (neither can
/// overflow).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) -> () {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let e = exp_nonpositive(-x.abs());
        let sigmoid = if x >= 0.0 { 1.0 / (1.0 + e) } else { e / (1.0 + e) };
        *g = x * sigmoid * u;
    }
}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_closely() {
        for i in 0..=100_000 {
            let x = -(i as f32) * 0.0009;
            let (got, want) = (exp_nonpositive(x), x.exp());
            assert!((got - want).abs() <= want * 2e-6 + 1e-37, "exp({x}) = {got}, want {want}");
        }
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(0.0), 1.0);
    }

    #[test]
    fn argmax_and_max() {
        assert_eq!(argmax(&[]), None);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 20]), None);
        let mut xs = vec![0.5f32; 37];
        xs[30] = 2.0;
        xs[33] = 2.0;
        xs[3] = f32::NAN;
        assert_eq!(argmax(&xs), Some(30));
        assert_eq!(max(&xs), 2.0);
    }

    #[test]
    fn the_avx2_and_baseline_builds_give_the_same_bits() {
        // a row with ties, NaN, -inf, an odd length: the lanes' order must not change a bit
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for len in [0usize, 1, 7, 8, 15, 17, 100, 4095, 4097, 32_003] {
            let mut xs: Vec<f32> = (0..len).map(|_| ((next() % 2000) as f32 - 1500.0) / 37.0).collect();
            for _ in 0..len / 50 {
                let i = (next() % len as u64) as usize;
                xs[i] = [f32::NAN, f32::NEG_INFINITY, 30.0][(next() % 3) as usize];
            }
            assert_eq!(argmax(&xs), argmax::portable(&xs), "len {len}");
            assert_eq!(max(&xs).to_bits(), max::portable(&xs).to_bits(), "len {len}");
            let finite: Vec<f32> = xs.iter().map(|&x| if x.is_nan() { 0.0 } else { x }).collect();
            let shift = max(&finite).max(0.0);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let (ta, tb) = (
                exp_shifted(&finite, shift, 0.7, &mut a),
                exp_shifted::portable(&finite, shift, 0.7, &mut b),
            );
            assert_eq!(ta.to_bits(), tb.to_bits(), "len {len}");
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "len {len}");
            assert_eq!(sum(&a).to_bits(), sum::portable(&a).to_bits(), "len {len}");
        }
    }

    #[test]
    fn exp_shifted_sums() {
        let xs: Vec<f32> = (0..10_001).map(|i| -(i as f32) / 1000.0).collect();
        let mut out = Vec::new();
        let total = exp_shifted(&xs, 0.0, 1.0, &mut out);
        let want: f64 = xs.iter().map(|&x| (x as f64).exp()).sum();
        assert!((total - want).abs() / want < 1e-5, "{total} vs {want}");
    }

    #[test]
    fn silu_mul_is_x_sigmoid_x_times_up_in_both_builds() {
        let xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.05).chain([1e30, -1e30, 0.0, -0.0]).collect();
        let up: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let (mut a, mut b) = (xs.clone(), xs.clone());
        silu_mul(&mut a, &up);
        silu_mul::portable(&mut b, &up);
        for ((&x, &u), (&got, &base)) in xs.iter().zip(&up).zip(a.iter().zip(&b)) {
            assert_eq!(got.to_bits(), base.to_bits(), "{x}");
            let want = x as f64 / (1.0 + (-(x as f64)).exp()) * u as f64;
            // relative 1e-6, or absolute 1e-30 where exp underflows (x below -87)
            assert!(
                (got as f64 - want).abs() <= 1e-6 * want.abs() + 1e-30,
                "silu({x}) * {u}: {got} vs {want}"
            );
        }
        let mut nan = [f32::NAN];
        silu_mul(&mut nan, &[1.0]);
        assert!(nan[0].is_nan());
    }
}
