//! Helpers shared by the durable-store tests (`disk.rs`, `crash.rs`,
//! `corruption.rs`): a seeded generator, the seed plumbing, a scratch data
//! directory, and the simulated peer's events.
#![allow(dead_code)]

use std::path::Path;

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::Event;

/// The simulated peer's stream.
pub const PEER: StreamId = StreamId::new(2);

/// The peer's event `seq`: a function of `seq` alone, so every run sends the
/// same event for a seq and none equivocates; its lamport is far above ours,
/// so receiving it must raise the clock.
pub fn peer_event(seq: u64) -> Event {
    Event {
        stream: PEER,
        seq,
        lamport: 1_000_000 + seq * 1_000,
        time_ms: seq,
        payload: Bytes::from(format!("peer {seq}")),
    }
}

/// A small seeded generator (splitmix64): deterministic for a seed, so a
/// failing run replays exactly.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound > 0`).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}

/// The seed for a randomized test: `MESHLOG_SEED` if set, else the clock.
pub fn seed() -> u64 {
    if let Ok(text) = std::env::var("MESHLOG_SEED") {
        return text.parse().expect("MESHLOG_SEED is a u64");
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// Prints the seed if the test panics (the harness shows a failing test's
/// output), so that `MESHLOG_SEED=<seed>` replays it.
pub struct SeedReport {
    name: &'static str,
    seed: u64,
}

impl SeedReport {
    /// Reports `seed` for test `name` if dropped while panicking.
    pub fn new(name: &'static str, seed: u64) -> Self {
        SeedReport { name, seed }
    }
}

impl Drop for SeedReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{}: failed with seed {}; replay with MESHLOG_SEED={}",
                self.name, self.seed, self.seed
            );
        }
    }
}

/// A fresh scratch directory, removed when dropped.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("meshlog-disk-")
        .tempdir()
        .expect("create a scratch directory")
}

/// The data file of the store in `dir`.
pub fn data_file(dir: &Path) -> std::path::PathBuf {
    dir.join(meshlog_replica::DATA_FILE)
}
