//! `Event`: one entry of a writer's stream, and its content hash.

use bytes::Bytes;
use meshlog_cursor::StreamId;

/// Payloads up to this size are hashed in one shot from a stack buffer.
const SMALL_PAYLOAD_BYTES: usize = 224;

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
        // The one-shot hash of header and payload back to back is the same
        // value as the streaming one, without its 600-byte state: the
        // common small event is hashed from the stack.
        if self.payload.len() <= SMALL_PAYLOAD_BYTES {
            let mut bytes = [0u8; 32 + SMALL_PAYLOAD_BYTES];
            bytes[..32].copy_from_slice(&header);
            bytes[32..32 + self.payload.len()].copy_from_slice(&self.payload);
            return xxhash_rust::xxh3::xxh3_128(&bytes[..32 + self.payload.len()]);
        }
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use meshlog_cursor::StreamId;
    use meshlog_testkit::{seed, SplitMix64};

    use super::Event;

    /// The digest is recorded on disk and compared across replicas: the
    /// one-shot hash of small events must be the streaming hash, for every
    /// payload length either side of the cut-over.
    #[test]
    fn content_hash_is_the_streaming_xxh3_of_header_and_payload() {
        let seed = seed::replay_or(0xd16e57);
        let mut rng = SplitMix64::new(seed);
        for len in 0..600 {
            let payload: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let event = Event {
                stream: StreamId::new(rng.next_u64()),
                seq: rng.next_u64(),
                lamport: rng.next_u64(),
                time_ms: rng.next_u64(),
                payload: Bytes::from(payload),
            };
            let mut hasher = xxhash_rust::xxh3::Xxh3::new();
            hasher.update(&event.stream.get().to_le_bytes());
            hasher.update(&event.seq.to_le_bytes());
            hasher.update(&event.lamport.to_le_bytes());
            hasher.update(&event.time_ms.to_le_bytes());
            hasher.update(&event.payload);
            assert_eq!(
                event.content_hash(),
                hasher.digest128(),
                "len {len}, seed {seed}"
            );
        }
    }
}
