//! Helpers shared by the replica's integration tests: an in-process link
//! between replicas that a test can cut and heal, a walker that pages a log
//! and checks exactly-once, and the inputs of a fuzz target's regression
//! directory. (Seeds come from `meshlog_testkit::seed`.)
#![allow(dead_code)]

use std::collections::BTreeSet;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Event, PageError, Replica, Store};

/// Sends `source` everything `target` misses (in chunks of `budget` bytes)
/// until `target` holds all of it. Returns how many events became visible.
pub fn push<S: Store, T: Store>(
    source: &Replica<S>,
    target: &mut Replica<T>,
    budget: usize,
) -> u64 {
    let mut applied = 0;
    // Bounded: each round applies at least one event or stops.
    for _ in 0..10_000 {
        let delta = source.delta_for(&target.marks(), budget);
        if delta.events.is_empty() && delta.floor.is_empty() {
            return applied;
        }
        let report = target
            .apply(&delta)
            .expect("delta from a correct peer applies");
        applied += report.applied;
        if report.applied == 0 && report.floors_raised == 0 {
            return applied;
        }
    }
    panic!("push did not converge in 10,000 rounds");
}

/// A two-way in-process link between two replicas that tests cut and heal.
#[derive(Debug, Default)]
pub struct Link {
    pub cut: bool,
}

impl Link {
    /// Exchanges everything both ways, unless the link is cut.
    pub fn sync<S: Store, T: Store>(&self, a: &mut Replica<S>, b: &mut Replica<T>) {
        if !self.cut {
            push(a, b, 1 << 20);
            push(b, a, 1 << 20);
        }
    }
}

/// A reader that walks a log page by page and remembers what it got.
#[derive(Debug, Default)]
pub struct Walker {
    pub cursor: VersionVector,
    pub seen: BTreeSet<(StreamId, u64)>,
    pub events: Vec<Event>,
    /// The highest lamport stamp this walk has returned: the position a
    /// scalar cursor would resume from.
    pub position: u64,
}

impl Walker {
    /// Pages once; panics on a duplicate or a disorder within the page.
    pub fn step<S: Store>(
        &mut self,
        replica: &Replica<S>,
        limit: usize,
    ) -> Result<bool, PageError> {
        let page = replica.page(&self.cursor, limit)?;
        for pair in page.events.windows(2) {
            assert!(
                (pair[0].lamport, pair[0].stream) < (pair[1].lamport, pair[1].stream),
                "page out of (lamport, stream) order: {pair:?}"
            );
        }
        for event in page.events {
            assert!(
                self.seen.insert((event.stream, event.seq)),
                "event {}:{} returned twice",
                event.stream,
                event.seq
            );
            self.position = self.position.max(event.lamport);
            self.events.push(event);
        }
        self.cursor = page.next;
        Ok(page.at_head)
    }

    /// Pages until the replica's head (bounded).
    pub fn walk_to_head<S: Store>(&mut self, replica: &Replica<S>, limit: usize) {
        for _ in 0..1_000_000 {
            if self.step(replica, limit).expect("page") {
                return;
            }
        }
        panic!("walk did not reach the head");
    }
}

/// Every event name a replica holds (above its floor).
pub fn held<S: Store>(replica: &Replica<S>) -> BTreeSet<(StreamId, u64)> {
    let floor = replica.floor();
    replica
        .marks()
        .iter()
        .flat_map(|(stream, head)| (floor.get(stream) + 1..=head).map(move |seq| (stream, seq)))
        .collect()
}

/// The inputs under `fuzz/regressions/<target>/`, by name, sorted: what a
/// `*_fuzz_regressions.rs` test replays. Fails unless there are at least
/// `min`, so a replay cannot pass by reading an empty directory.
pub fn fuzz_regressions(target: &str, min: usize) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target);
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.is_file())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("a readable input"))
        })
        .collect();
    inputs.sort();
    assert!(
        inputs.len() >= min,
        "{} holds too few inputs",
        dir.display()
    );
    inputs
}
