//! A small seeded generator (SplitMix64): reproducible from a printed seed, no extra dependency.

/// SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    seed: u64,
}

impl Rng {
    /// From `LIGER_SEED` when set, else from the clock: fresh inputs every run.
    pub fn from_env() -> Self {
        let seed = std::env::var("LIGER_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(7)
            });
        Self::new(seed)
    }

    /// From a seed.
    pub fn new(seed: u64) -> Self {
        Self { state: seed, seed }
    }

    /// The seed this generator started from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` values uniform in `[lo, hi)` plus `shift`, as f32.
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64, shift: f64) -> Vec<f32> {
        (0..n)
            .map(|_| (lo + (hi - lo) * self.uniform() + shift) as f32)
            .collect()
    }

    /// Uniform integer in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
