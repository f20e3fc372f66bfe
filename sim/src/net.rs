//! [`NetConfig`]: what a simulated link does to each frame.

use std::time::Duration;

use meshlog_testkit::SplitMix64;

/// What a link does to a frame: a latency drawn uniformly from
/// `latency_min ..= latency_max`, then a chance to be lost, a chance to be
/// delivered twice (each copy with its own latency), and a chance to be
/// held up to `reorder_window` longer (so frames sent after it overtake
/// it). Frames are datagrams: the protocol's own numbering, acks and
/// retransmission repair what the link does.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// The shortest one-way latency.
    pub latency_min: Duration,
    /// The longest one-way latency (before reordering).
    pub latency_max: Duration,
    /// The chance a frame is lost.
    pub loss: f64,
    /// The chance a frame is delivered twice.
    pub duplicate: f64,
    /// The chance a frame is held back, up to `reorder_window`.
    pub reorder: f64,
    /// How much longer a held-back frame may take.
    pub reorder_window: Duration,
}

impl NetConfig {
    /// A clean network: latency only, nothing lost, duplicated or held.
    pub fn clean(latency_min: Duration, latency_max: Duration) -> Self {
        NetConfig {
            latency_min,
            latency_max,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_window: Duration::ZERO,
        }
    }

    /// The mean round trip: twice the mean one-way latency.
    pub fn round_trip_mean(&self) -> Duration {
        self.latency_min + self.latency_max
    }

    /// The delays after which one frame arrives: none (lost), one, or two
    /// (duplicated).
    pub fn deliveries(&self, rng: &mut SplitMix64) -> Vec<Duration> {
        if rng.chance(self.loss) {
            return Vec::new();
        }
        let copies = if rng.chance(self.duplicate) { 2 } else { 1 };
        (0..copies).map(|_| self.delay(rng)).collect()
    }

    fn delay(&self, rng: &mut SplitMix64) -> Duration {
        let spread = self.latency_max.saturating_sub(self.latency_min);
        let mut delay = self.latency_min + nanos_below(rng, spread);
        if rng.chance(self.reorder) {
            delay += nanos_below(rng, self.reorder_window);
        }
        delay
    }
}

/// A duration drawn uniformly from `0 ..= bound`, in whole microseconds.
fn nanos_below(rng: &mut SplitMix64, bound: Duration) -> Duration {
    let micros = bound.as_micros() as u64;
    Duration::from_micros(rng.below(micros + 1))
}
