//! `SplitMix64`: a small seeded generator for jitter and fault schedules.
//!
//! Not cryptographic; chosen because every decision it makes must replay
//! from a seed, and because it has no dependency and no global state.
//!
//! Crate-private: the manager draws its reconnect jitter from it, and the
//! `testkit` re-exports it for seeded tests in any crate. It is not part of
//! the sync API proper.

/// A SplitMix64 generator (Steele, Lea and Flood, 2014): one `u64` of state,
/// every output a pure function of the seed and the number of draws.
///
/// ```
/// use meshlog_sync::testkit::SplitMix64;
/// let mut a = SplitMix64::new(42);
/// let mut b = SplitMix64::new(42);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(10) < 10);
/// ```
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    /// A uniform draw in `0..bound` (0 if `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        // Lemire's multiply-shift: bias below 2^-64 per draw, fine here.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A uniform draw in `[0, 1)`.
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `true` with probability `p` (clamped to `[0, 1]`).
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A seed for a child generator, derived from this one's seed and
    /// `salt` without drawing from it: children of one parent with different
    /// salts are independent.
    pub fn derive(seed: u64, salt: u64) -> u64 {
        mix(seed ^ mix(salt.wrapping_add(0x6a09_e667_f3bc_c909)))
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
