//! A STREAM-like probe of the machine's memory read bandwidth: the physical limit of a
//! decode step on the CPU, which reads every weight once per generated token. A buffer
//! much larger than the caches is summed by every thread over its own part, several
//! times; the best pass counts (the least disturbed by other work on a shared machine).

use std::time::Instant;

use rayon::prelude::*;

/// Bytes per second read by summing a `bytes`-sized buffer on `threads` threads (0: one
/// per available core), the best of `passes`.
pub fn read_bandwidth(bytes: usize, threads: usize, passes: usize) -> f64 {
    let words = (bytes / 8).max(1 << 10);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a thread pool");
    // written by the threads that read it, so each part sits near its reader
    let mut buffer = vec![0u64; words];
    let part = words.div_ceil(pool.current_num_threads());
    pool.install(|| {
        buffer
            .par_chunks_mut(part)
            .enumerate()
            .for_each(|(i, c)| c.iter_mut().for_each(|w| *w = i as u64 + 1));
    });
    let mut best = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let start = Instant::now();
        let sum: u64 = pool.install(|| {
            buffer.par_chunks(part).map(|c| c.iter().fold(0u64, |a, &w| a.wrapping_add(w))).sum()
        });
        std::hint::black_box(sum);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_probe_reports_a_plausible_rate() {
        // between 100 MB/s (a badly overloaded machine) and 10 TB/s (beyond any memory)
        let rate = super::read_bandwidth(32 << 20, 0, 3);
        assert!((1e8..1e13).contains(&rate), "{rate}");
    }
}
