//! `Event`: one entry of a writer's stream, and its content hash.

use bytes::Bytes;
use meshlog_cursor::StreamId;

/// One event: named by `(stream, seq)`, stamped with a lamport clock and the
/// writer's wall-clock time, carrying an opaque payload.
///
/// `seq` counts the writer's events from 1 with no gaps; within one stream
/// `lamport` rises strictly with `seq`. Two events with one name and any
/// other field different are an equivocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The writer's stream.
    pub stream: StreamId,
    /// The event's position in its stream, from 1.
    pub seq: u64,
    /// The writer's lamport clock when it appended the event.
    pub lamport: u64,
    /// The writer's wall-clock time at append, in milliseconds since the
    /// Unix epoch; informational, and used by time-based retention.
    pub time_ms: u64,
    /// The application's bytes.
    pub payload: Bytes,
}

impl Event {
    /// A 128-bit hash of the whole event, name and content. Replicas sum the
    /// hashes of the events they hold into their digest.
    pub fn content_hash(&self) -> u128 {
        let mut header = [0u8; 32];
        header[0..8].copy_from_slice(&self.stream.get().to_le_bytes());
        header[8..16].copy_from_slice(&self.seq.to_le_bytes());
        header[16..24].copy_from_slice(&self.lamport.to_le_bytes());
        header[24..32].copy_from_slice(&self.time_ms.to_le_bytes());
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(&header);
        hasher.update(&self.payload);
        hasher.digest128()
    }

    /// An upper estimate of the event's size on the wire, for byte budgets:
    /// the payload plus five 10-byte varints.
    pub fn size_hint(&self) -> usize {
        self.payload.len() + 50
    }
}
