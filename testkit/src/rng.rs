//! [`SplitMix64`]: the seeded generator every randomized test of the
//! workspace draws from.
//!
//! Not cryptographic. Chosen because every draw must replay from a seed, and
//! because it needs no dependency and no global state: a generator is one
//! `u64`, and two generators built from one seed draw the same numbers on
//! every platform and every build.
//!
//! `meshlog-sync` keeps a copy of the same algorithm in its production code
//! (the peer manager's reconnect jitter), since no runtime may depend on this
//! dev-only crate.

/// A SplitMix64 generator (Steele, Lea and Flood, 2014): one `u64` of
/// state, every output a pure function of the seed and the number of draws.
///
/// ```
/// use meshlog_testkit::SplitMix64;
///
/// let mut a = SplitMix64::new(42);
/// let mut b = SplitMix64::new(42);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(10) < 10);
/// assert!((3..=5).contains(&a.between(3, 5)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

/// The golden-ratio increment of SplitMix64's state.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// A uniform draw in `0..bound`, or 0 if `bound` is 0 (so a caller
    /// drawing an index into an empty collection gets 0, not a panic).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            return 0;
        }
        // Lemire's multiply-shift: bias below 2^-64 per draw, and unlike
        // `% bound` it does not favour small values for large bounds.
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A uniform draw in `low..=high`.
    ///
    /// # Panics
    ///
    /// If `low > high`: the caller's range is empty, which is a bug in the
    /// test, not something to paper over with a value.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "between({low}, {high}): empty range");
        match (high - low).checked_add(1) {
            Some(width) => low + self.below(width),
            // The whole of u64.
            None => self.next_u64(),
        }
    }

    /// A uniform draw in `[0, 1)`, with 53 bits of precision.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `true` with probability `p` (below 0 never, 1 or above always).
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// `N` uniform bytes: the little-endian bytes of `N / 8` draws (rounded
    /// up), as keys, hashes and secrets in tests are drawn.
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut bytes = [0u8; N];
        for chunk in bytes.chunks_mut(8) {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes()[..chunk.len()]);
        }
        bytes
    }

    /// Shuffles `items` uniformly (Fisher–Yates), drawing `len - 1` times.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// A seed for a child generator, derived from `seed` and `salt` without
    /// drawing from any generator: children of one seed with different salts
    /// are independent, and adding a child does not shift its siblings'
    /// draws (so a schedule replays even after a test grows a new link).
    pub fn derive(seed: u64, salt: u64) -> u64 {
        mix(seed ^ mix(salt.wrapping_add(0x6a09_e667_f3bc_c909)))
    }
}

/// SplitMix64's output function (a variant of MurmurHash3's finalizer).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference outputs of SplitMix64 from seed 0 (the published
    /// algorithm): a copy that drifted would change every replayed seed.
    #[test]
    fn draws_match_the_reference_splitmix64() {
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(rng.next_u64(), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn one_seed_draws_one_sequence() {
        let mut a = SplitMix64::new(0x5eed);
        let mut b = SplitMix64::new(0x5eed);
        let mut c = SplitMix64::new(0x5eee);
        let from_a: Vec<u64> = (0..64).map(|_| a.next_u64()).collect();
        let from_b: Vec<u64> = (0..64).map(|_| b.next_u64()).collect();
        let from_c: Vec<u64> = (0..64).map(|_| c.next_u64()).collect();
        assert_eq!(from_a, from_b);
        assert_ne!(from_a, from_c);
    }

    #[test]
    fn below_and_between_stay_in_range_and_reach_both_ends() {
        let mut rng = SplitMix64::new(7);
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
        let mut seen = [false; 6];
        for _ in 0..10_000 {
            let draw = rng.below(6);
            assert!(draw < 6, "{draw}");
            seen[draw as usize] = true;
            let draw = rng.between(3, 5);
            assert!((3..=5).contains(&draw), "{draw}");
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
        assert_eq!(rng.between(9, 9), 9);
        // The full range does not overflow.
        rng.between(0, u64::MAX);
        let big = rng.below(u64::MAX);
        assert!(big < u64::MAX);
    }

    #[test]
    #[should_panic(expected = "empty range")]
    fn between_an_empty_range_is_a_bug() {
        SplitMix64::new(1).between(5, 4);
    }

    #[test]
    fn unit_and_chance_stay_in_bounds() {
        let mut rng = SplitMix64::new(11);
        let mut heads = 0;
        for _ in 0..10_000 {
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u), "{u}");
            assert!(!rng.chance(0.0));
            assert!(rng.chance(1.0));
            heads += u32::from(rng.chance(0.5));
        }
        assert!((4_000..6_000).contains(&heads), "{heads} of 10,000");
    }

    #[test]
    fn shuffle_permutes_and_replays() {
        let mut items: Vec<u32> = (0..50).collect();
        let mut again = items.clone();
        SplitMix64::new(3).shuffle(&mut items);
        SplitMix64::new(3).shuffle(&mut again);
        assert_eq!(items, again);
        assert_ne!(items, (0..50).collect::<Vec<_>>());
        items.sort_unstable();
        assert_eq!(items, (0..50).collect::<Vec<_>>());
        SplitMix64::new(3).shuffle::<u8>(&mut []);
    }

    #[test]
    fn derived_seeds_differ_by_salt_and_replay() {
        assert_eq!(SplitMix64::derive(1, 2), SplitMix64::derive(1, 2));
        assert_ne!(SplitMix64::derive(1, 2), SplitMix64::derive(1, 3));
        assert_ne!(SplitMix64::derive(1, 2), SplitMix64::derive(2, 2));
    }
}
