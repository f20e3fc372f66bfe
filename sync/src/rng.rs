//! `SplitMix64`: a small seeded generator for the manager's reconnect
//! jitter.
//!
//! Not cryptographic; chosen because every decision it makes must replay
//! from a seed, and because it has no dependency and no global state.
//!
//! It is the same algorithm as `meshlog_testkit::SplitMix64` (same draws,
//! same `below`, same `derive`; a unit test below checks they agree), kept
//! as a copy on purpose: this is production code, and the testkit is a
//! dev-only crate that no runtime may depend on. Tests draw from the
//! testkit's (the `testkit` module re-exports it); only the manager and
//! this crate's own unit tests use this one. Crate-private, not part of the
//! sync API.

/// A SplitMix64 generator (Steele, Lea and Flood, 2014): one `u64` of state,
/// every output a pure function of the seed and the number of draws.
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

#[cfg(all(test, feature = "testkit"))]
mod tests {
    use super::SplitMix64;

    /// This copy and the testkit's draw the same numbers: a seed printed by
    /// a test means the same schedule as the manager's jitter would draw.
    #[test]
    fn the_same_draws_as_the_testkits_splitmix64() {
        let mut ours = SplitMix64::new(0x5eed);
        let mut kit = meshlog_testkit::SplitMix64::new(0x5eed);
        for bound in 0..1_000 {
            assert_eq!(ours.next_u64(), kit.next_u64());
            assert_eq!(ours.below(bound), kit.below(bound));
            assert_eq!(
                SplitMix64::derive(bound, 7),
                meshlog_testkit::SplitMix64::derive(bound, 7)
            );
        }
    }
}
