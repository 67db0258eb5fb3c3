//! Test data: a deterministic stream of floats, the same on every machine.

/// A deterministic stream of values in [-1, 1) (xorshift64; 24 bits each, which f32 holds
/// exactly).
pub(crate) struct Values(pub(crate) u64);

impl Values {
    pub(crate) fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}
