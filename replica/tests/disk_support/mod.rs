//! Helpers shared by the durable-store tests (`disk.rs`, `crash.rs`,
//! `corruption.rs`): a scratch data directory and the simulated peer's
//! events. (The seeded generator and the seeds come from `meshlog_testkit`.)
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
