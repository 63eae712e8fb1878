//! The one splitmix64 generator of the project: deterministic data and seeds
//! for tests, examples and the runtime's random ops, identical on every
//! platform and with no dependency.

/// The splitmix64 finaliser (Stafford's "mix13"): a bijective 64-bit mix in
/// which every input bit affects every output bit.
///
/// It exists so counter-based generators (the i-th draw a pure function of
/// `(seed, i)`) can share the exact mixing of [`SplitMix64`]: for any state
/// `s`, `SplitMix64(s).next_u64() == splitmix64(s.wrapping_add(SplitMix64::GAMMA))`.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A splitmix64 stream whose whole output is determined by its state (the
/// field): reproducible test data, example data sets and seeds.
///
/// The arithmetic is fixed bit for bit (tests and examples depend on the
/// exact streams): each step adds [`SplitMix64::GAMMA`] to the state and
/// returns [`splitmix64`] of the new state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The state increment of one step: 2^64 divided by the golden ratio,
    /// rounded to odd (the "golden gamma" of splitmix64).
    pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    /// A stream starting from state `seed` (the same as `SplitMix64(seed)`).
    pub const fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(Self::GAMMA);
        splitmix64(self.0)
    }

    /// Uniform in `[0, 1)`: the top 53 bits of [`next_u64`](Self::next_u64)
    /// times 2^-53, so every value is exact in f64.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`: `lo + (hi - lo) * uniform()`.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform-ish integer in `0..n` (`next_u64() % n`, with the slight modulo
    /// bias of that); 0 when `n == 0`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copy the crates' tests and examples used before this type existed.
    struct Reference(u64);

    impl Reference {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    #[test]
    fn known_stream_from_seed_zero() {
        // The published splitmix64 outputs for seed 0.
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn matches_the_reference_copy_bit_for_bit() {
        for seed in [0, 1, 42, u64::MAX, 0x6a09_e667_f3bc_c908] {
            let (mut a, mut b) = (SplitMix64::new(seed), Reference(seed));
            for _ in 0..100 {
                assert_eq!(a.next_u64(), b.next_u64());
            }
            let s = SplitMix64(seed);
            assert_eq!(
                s.clone().next_u64(),
                splitmix64(seed.wrapping_add(SplitMix64::GAMMA))
            );
            let (mut u, mut r) = (s.clone(), Reference(seed));
            let want = (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            assert_eq!(u.uniform().to_bits(), want.to_bits());
            let (mut u, mut r) = (s.clone(), Reference(seed));
            let want = -2.0 + 5.0 * ((r.next_u64() >> 11) as f64 / (1u64 << 53) as f64);
            assert_eq!(u.range(-2.0, 3.0).to_bits(), want.to_bits());
            let (mut u, mut r) = (s.clone(), Reference(seed));
            assert_eq!(u.below(7), (r.next_u64() % 7) as usize);
        }
    }

    #[test]
    fn ranges() {
        let mut r = SplitMix64(7);
        for _ in 0..1000 {
            let u = r.uniform();
            assert!((0.0..1.0).contains(&u));
            let x = r.range(-3.0, -1.0);
            assert!((-3.0..-1.0).contains(&x));
            assert!(r.below(5) < 5);
            assert_eq!(r.below(0), 0);
            assert_eq!(r.below(1), 0);
        }
    }
}
