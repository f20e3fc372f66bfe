//! `Backoff`: the redial policy of a link to a peer, shared by the peer
//! manager and by any driver of sessions (the node dials over HTTP).

use std::time::Duration;

use meshlog_cursor::StreamId;

use crate::rng::SplitMix64;

/// Jittered exponential backoff between redials of one peer: the delay
/// before attempt `n` (from 0) is drawn uniformly from the upper half of
/// `min · 2^n`, capped at `max`, so that replicas restarted together do not
/// dial in lockstep; seeded, so a test's schedule replays.
///
/// ```
/// use std::time::Duration;
/// use meshlog_sync::Backoff;
/// let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2), 7);
/// let first = backoff.next_delay();
/// assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
/// for _ in 0..10 {
///     assert!(backoff.next_delay() <= Duration::from_secs(2));
/// }
/// backoff.reset();
/// assert!(backoff.next_delay() <= Duration::from_millis(100));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
    rng: SplitMix64,
}

impl Backoff {
    /// A backoff from `min` to `max` (`max` raised to `min` if below it),
    /// its jitter seeded with `seed`.
    pub fn new(min: Duration, max: Duration, seed: u64) -> Self {
        Backoff {
            min,
            max,
            attempt: 0,
            rng: SplitMix64::new(seed),
        }
    }

    /// The backoff of one link of a replica: its jitter seeded from
    /// `jitter_seed` (0 unless a test sets it), the replica's own stream and
    /// the peer's `index` among the links it dials, so that the links of
    /// one replica, and those of replicas restarted together, draw
    /// different delays, and a test's schedule replays. The one seed every
    /// driver uses (the manager, the node).
    pub fn for_link(
        min: Duration,
        max: Duration,
        jitter_seed: u64,
        local: StreamId,
        index: u64,
    ) -> Self {
        Backoff::new(
            min,
            max,
            SplitMix64::derive(jitter_seed ^ local.get(), index),
        )
    }

    /// The delay before the next attempt; the one after is twice as long
    /// (up to `max`).
    pub fn next_delay(&mut self) -> Duration {
        let min_ms = self.min.as_millis().max(1) as u64;
        let max_ms = (self.max.as_millis() as u64).max(min_ms);
        let base_ms = min_ms
            .saturating_mul(1u64 << self.attempt.min(32))
            .min(max_ms);
        self.attempt = self.attempt.saturating_add(1);
        Duration::from_millis(base_ms / 2 + self.rng.below(base_ms / 2 + 1))
    }

    /// Starts over from `min`.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Records how a session ended, starting over from `min` only if it was
    /// established (the peer's hello arrived) and lasted at least `max`. A
    /// peer that fails right after its hello (a refused delta, garbage after
    /// a valid hello) fails the same way on every connection and must be
    /// dialed less and less often, not every `min`.
    pub fn session_ended(&mut self, established: bool, lasted: Duration) {
        if established && lasted >= self.max {
            self.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_bounds_and_jitters() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2), 7);
        let mut delays = std::collections::BTreeSet::new();
        for attempt in 0..40u32 {
            let base = (100u64 << attempt.min(5)).min(2000);
            let delay = backoff.next_delay().as_millis() as u64;
            assert!(
                delay >= base / 2 && delay <= base,
                "attempt {attempt}: {delay} ms"
            );
            delays.insert(delay);
        }
        assert!(delays.len() > 5, "the delays are jittered: {delays:?}");
    }

    /// Found in review: the backoff started over after every established
    /// session, so a peer that sent a valid hello and then a refused delta
    /// was redialed every 50 to 100 ms for ever.
    #[test]
    fn only_an_established_session_that_lasted_resets_the_backoff() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let mut backoff = Backoff::new(min, max, 1);
        for _ in 0..6 {
            backoff.next_delay();
        }
        backoff.session_ended(true, max / 2);
        assert!(
            backoff.next_delay() > min,
            "a short session keeps backing off"
        );
        backoff.session_ended(false, max * 2);
        assert!(backoff.next_delay() > min, "no hello: keeps backing off");
        backoff.session_ended(true, max);
        assert!(
            backoff.next_delay() <= min,
            "an established, long session starts over"
        );
    }
}
