//! What a refused delta must leave unchanged: a replica's marks, floor,
//! chain digest and every event it holds, compared before and after.
//! Used by the hostile-input tests of the replica and of sync, over a
//! `Replica` or a `SharedReplica` alike (they share no trait, so the
//! caller passes its reads).

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{ChainDigest, Event};

/// A replica's observable state, for equality before and after a refusal.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The marks (heads).
    pub marks: VersionVector,
    /// The floor.
    pub floor: VersionVector,
    /// The chain digest.
    pub chains: ChainDigest,
    /// Every event held above the floor, stream by stream, seq ascending.
    pub events: Vec<Event>,
}

impl Snapshot {
    /// The state given by `marks`, `floor`, `chains`, with each held event
    /// read through `get(stream, seq)`.
    pub fn new(
        marks: VersionVector,
        floor: VersionVector,
        chains: ChainDigest,
        get: impl Fn(StreamId, u64) -> Option<Event>,
    ) -> Snapshot {
        let mut events = Vec::new();
        for (stream, head) in marks.iter() {
            for seq in floor.get(stream) + 1..=head {
                events.extend(get(stream, seq));
            }
        }
        Snapshot {
            marks,
            floor,
            chains,
            events,
        }
    }
}
