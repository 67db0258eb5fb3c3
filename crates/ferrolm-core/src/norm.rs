//! RMSNorm over the rows of a matrix, as the Llama family applies it before attention and
//! the MLP: `out = x * (1 / sqrt(mean(x²) + eps)) * weight`, in f32 (the mean of squares
//! summed in f64, the two products rounded in that order, as transformers does in f32).
//!
//! A per-token hot path of the CPU runners: written as array ops (numpy, or torch on the
//! CPU) it is five or more calls, each costing more in dispatch than its arithmetic at a
//! decode batch; here it is one call. Large inputs (a prefill chunk) are split by rows
//! over scoped threads.

use std::fmt;
use std::sync::OnceLock;

/// A shape that does not fit; `field` names the argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NormError {
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for NormError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for NormError {}

/// Elements from which a call is split over threads (a few hundred µs of work).
const PARALLEL_FROM: usize = 1 << 18;

/// Normalizes each row of `x` (rows of `weight.len()` values) into `out`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<(), NormError> {
    let width = weight.len();
    let bad = |field, message: String| Err(NormError { field, message });
    if width == 0 {
        return bad("weight", "weight must not be empty".into());
    }
    if x.len() % width != 0 {
        return bad("x", format!("{} values are not whole rows of {width}", x.len()));
    }
    if out.len() != x.len() {
        return bad("out", format!("out has {} values; want x's {}", out.len(), x.len()));
    }
    if !eps.is_finite() || eps < 0.0 {
        return bad("eps", format!("eps must be a finite number >= 0, got {eps}"));
    }
    let rows = x.len() / width;
    let threads = if x.len() < PARALLEL_FROM { 1 } else { available_threads() };
    if threads < 2 || rows < 2 {
        norm_rows(x, weight, eps, out);
        return Ok(());
    }
    let per = rows.div_ceil(threads.min(rows)) * width;
    std::thread::scope(|scope| {
        let mut parts = x.chunks(per).zip(out.chunks_mut(per));
        let here = parts.next();
        for (xs, os) in parts {
            scope.spawn(move || norm_rows(xs, weight, eps, os));
        }
        if let Some((xs, os)) = here {
            norm_rows(xs, weight, eps, os);
        }
    });
    Ok(())
}

/// Asked once: on Linux it reads the cgroup's CPU quota, tens of µs a call.
fn available_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let width = weight.len();
    for (row, dst) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let scale = inverse_rms(row, eps);
        for ((o, &v), &w) in dst.iter_mut().zip(row).zip(weight) {
            *o = (v * scale) * w;
        }
    }
}

/// `1 / sqrt(mean(row²) + eps)`: squares summed in f32 lanes (vectorized), lanes in f64.
fn inverse_rms(row: &[f32], eps: f32) -> f32 {
    const LANES: usize = 8;
    let mut lanes = [0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            lanes[i] += c[i] * c[i];
        }
    }
    let mut sum: f64 = lanes.iter().map(|&v| v as f64).sum();
    sum += chunks.remainder().iter().map(|&v| (v * v) as f64).sum::<f64>();
    (1.0 / (sum / row.len() as f64 + eps as f64).sqrt()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        x.chunks(w.len())
            .flat_map(|row| {
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / row.len() as f64;
                let s = 1.0 / (ms + eps as f64).sqrt();
                row.iter().zip(w).map(move |(&v, &wi)| (v as f64 * s * wi as f64) as f32).collect::<Vec<_>>()
            })
            .collect()
    }

    fn close(a: &[f32], b: &[f32]) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{x} vs {y}");
        }
    }

    #[test]
    fn rows_match_the_float64_reference_small_and_split_over_threads() {
        for (rows, width) in [(1, 5), (3, 64), (7, 129), (600, 512)] {
            let x: Vec<f32> = (0..rows * width).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let w: Vec<f32> = (0..width).map(|i| 0.5 + (i % 13) as f32 / 10.0).collect();
            let mut out = vec![f32::NAN; x.len()];
            rms_norm(&x, &w, 1e-5, &mut out).unwrap();
            close(&out, &reference(&x, &w, 1e-5));
        }
    }

    #[test]
    fn a_zero_row_stays_zero_and_bad_shapes_name_the_argument() {
        let mut out = vec![1.0; 4];
        rms_norm(&[0.0; 4], &[1.0; 4], 1e-6, &mut out).unwrap();
        assert_eq!(out, vec![0.0; 4]);
        assert_eq!(rms_norm(&[0.0; 5], &[1.0; 4], 1e-6, &mut [0.0; 5]).unwrap_err().field, "x");
        assert_eq!(rms_norm(&[0.0; 4], &[1.0; 4], 1e-6, &mut [0.0; 3]).unwrap_err().field, "out");
        assert_eq!(rms_norm(&[0.0; 4], &[], 1e-6, &mut [0.0; 4]).unwrap_err().field, "weight");
        assert_eq!(rms_norm(&[0.0; 4], &[1.0; 4], f32::NAN, &mut [0.0; 4]).unwrap_err().field, "eps");
    }
}
