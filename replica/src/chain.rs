//! `ChainHash`: each event commits to the one before it in its stream
//! (`docs/SIGNING.md`, "Hash chain").
//!
//! ```text
//! h(0)   = [0; 32]
//! h(seq) = BLAKE3::derive_key("meshlog chain v1",
//!            h(seq-1) || stream u64 LE || seq u64 LE || lamport u64 LE
//!            || time_ms u64 LE || payload_len u64 LE || payload)
//! ```
//!
//! The hash at a stream's head commits to every event of the stream, so it
//! is that stream's digest whatever was compacted; a writer's seal over it
//! vouches for the whole run below it.

use meshlog_cursor::StreamId;

use crate::Event;

/// The BLAKE3 key-derivation context of the chain: a hash of this chain is
/// never a hash of anything else meshlog signs.
const CONTEXT: &str = "meshlog chain v1";

/// [`CONTEXT`] hashed once: `derive_key` hashes its context before the
/// input, and a chain hashes a context per event, so the context's hash is
/// computed once per process rather than per event (same output).
static CONTEXT_KEY: std::sync::LazyLock<blake3::hazmat::ContextKey> =
    std::sync::LazyLock::new(|| blake3::hazmat::hash_derive_key_context(CONTEXT));

/// The chain hash of a stream at some seq: BLAKE3 over the event at that
/// seq and the chain hash below it ([`ChainHash::GENESIS`] below seq 1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ChainHash([u8; 32]);

impl ChainHash {
    /// The chain hash at seq 0, below a stream's first event: 32 zero bytes.
    pub const GENESIS: ChainHash = ChainHash([0; 32]);

    /// The chain hash from its 32 bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        ChainHash(bytes)
    }

    /// The hash's 32 bytes.
    pub const fn to_bytes(self) -> [u8; 32] {
        self.0
    }

    /// The hash's 32 bytes, borrowed.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The chain hash at `event.seq`, where `self` is the chain hash at
    /// `event.seq - 1` of `event.stream`.
    pub fn next(&self, event: &Event) -> ChainHash {
        self.next_parts(
            event.stream,
            event.seq,
            event.lamport,
            event.time_ms,
            &event.payload,
        )
    }

    /// [`ChainHash::next`] from an event's fields, for a run held in
    /// columns (no [`Event`] made for it).
    pub(crate) fn next_parts(
        &self,
        stream: StreamId,
        seq: u64,
        lamport: u64,
        time_ms: u64,
        payload: &[u8],
    ) -> ChainHash {
        let mut header = [0u8; 72];
        header[..32].copy_from_slice(&self.0);
        header[32..40].copy_from_slice(&stream.get().to_le_bytes());
        header[40..48].copy_from_slice(&seq.to_le_bytes());
        header[48..56].copy_from_slice(&lamport.to_le_bytes());
        header[56..64].copy_from_slice(&time_ms.to_le_bytes());
        header[64..72].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let mut hasher =
            <blake3::Hasher as blake3::hazmat::HasherExt>::new_from_context_key(&CONTEXT_KEY);
        hasher.update(&header);
        hasher.update(payload);
        ChainHash(*hasher.finalize().as_bytes())
    }

    /// The chain hash after `events`, in order, from `self`: the events are
    /// consecutive seqs of one stream, the first one above `self`'s seq.
    pub fn extend<'a>(self, events: impl IntoIterator<Item = &'a Event>) -> ChainHash {
        events
            .into_iter()
            .fold(self, |hash, event| hash.next(event))
    }
}

impl std::fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChainHash({self})")
    }
}

impl std::fmt::Display for ChainHash {
    /// Lowercase hex, 64 digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

/// What a replica keeps of a stream's chain: the chain hash at its floor
/// and at its head (`docs/SIGNING.md`, "Hash chain"), persisted by the
/// store with the stream's floor and head.
///
/// A stream is **anchored** when its chain is known from seq 1:
/// `floor_hash` is `h(floor)` and `head_hash` is `h(head)`, equal on every
/// replica that holds that head, whatever it compacted. A stream whose
/// events below its floor this replica never held is **unanchored**: a
/// floor learned from a peer above everything held (no hash comes with a
/// floor before sync protocol 4), or a stream compacted in a data file
/// written before chains were kept (format 3 and older). Its chain is
/// rooted at its floor with [`ChainHash::GENESIS`] instead of `h(floor)`:
/// consistent for [`Replica::verify`](crate::Replica::verify), but not
/// comparable with another replica's, so a digest shows no hash for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamChain {
    /// The chain hash at the stream's floor (its root when unanchored).
    pub floor_hash: ChainHash,
    /// The chain hash at the stream's head.
    pub head_hash: ChainHash,
    /// Whether the chain is known from seq 1 (see above).
    pub anchored: bool,
}

impl Default for StreamChain {
    /// A stream with nothing compacted and nothing held: anchored at
    /// [`ChainHash::GENESIS`].
    fn default() -> Self {
        StreamChain::rooted(0)
    }
}

impl StreamChain {
    /// Where a stream's chain starts when it is chained from its floor
    /// with no hash known there (a store that records no chain for it, or
    /// an upgrade from a format that kept none): anchored at
    /// [`ChainHash::GENESIS`] when nothing was compacted (`floor_seq` 0),
    /// else unanchored, rooted at [`ChainHash::GENESIS`]. The one policy
    /// for both. Extend it through the held events with
    /// [`StreamChain::extended`].
    pub fn rooted(floor_seq: u64) -> Self {
        StreamChain {
            floor_hash: ChainHash::GENESIS,
            head_hash: ChainHash::GENESIS,
            anchored: floor_seq == 0,
        }
    }

    /// The chain with its head moved past `events` (the next of the
    /// stream, in seq order).
    pub fn extended<'a>(mut self, events: impl IntoIterator<Item = &'a Event>) -> Self {
        self.head_hash = self.head_hash.extend(events);
        self
    }
}

/// One stream's part of a [`ChainDigest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamHead {
    /// The writer stream.
    pub stream: StreamId,
    /// Its head seq (the replica's mark for it).
    pub head: u64,
    /// The chain hash at `head`; `None` when the stream is unanchored
    /// ([`StreamChain`]): its head is known, its hash there is not.
    pub chain: Option<ChainHash>,
}

/// What a replica holds, stream by stream, as chain heads: equal on two
/// replicas that hold the same heads of the same streams, whatever each
/// compacted (unlike [`Digest`](crate::Digest), a sum over the events
/// held, which moves with the floor).
///
/// `hash` is one BLAKE3 over every stream, ascending:
///
/// ```text
/// hash = BLAKE3::derive_key("meshlog digest v1",
///          for each stream ascending: stream u64 LE || head u64 LE
///          || 1 || chain hash at head      (anchored)
///          || 0 || 32 zero bytes)          (unanchored)
/// ```
///
/// Streams with head 0 (nothing held or compacted) are not listed. Two
/// replicas with equal `hash` hold the same heads, and the same events
/// below them for every anchored stream; an unanchored stream counts by
/// its head alone, so a replica unanchored on a stream and one anchored
/// on it differ there until sync protocol 4 brings the hash at a floor.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ChainDigest {
    /// Per stream, ascending.
    pub streams: Vec<StreamHead>,
    /// The hash over `streams` (formula above; printed as 64 hex digits
    /// like a [`ChainHash`], which it is not).
    pub hash: ChainHash,
}

/// The BLAKE3 key-derivation context of the overall digest.
const DIGEST_CONTEXT: &str = "meshlog digest v1";

impl ChainDigest {
    /// The digest of `streams` (ascending by stream, heads above 0).
    pub fn new(streams: Vec<StreamHead>) -> Self {
        let mut hasher = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
        for head in &streams {
            hasher.update(&head.stream.get().to_le_bytes());
            hasher.update(&head.head.to_le_bytes());
            match head.chain {
                Some(chain) => {
                    hasher.update(&[1]);
                    hasher.update(chain.as_bytes());
                }
                None => {
                    hasher.update(&[0]);
                    hasher.update(&[0; 32]);
                }
            }
        }
        ChainDigest {
            streams,
            hash: ChainHash(*hasher.finalize().as_bytes()),
        }
    }

    /// The part of `stream`, if it is listed.
    pub fn stream(&self, stream: StreamId) -> Option<&StreamHead> {
        self.streams
            .binary_search_by_key(&stream, |head| head.stream)
            .ok()
            .map(|at| &self.streams[at])
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use meshlog_cursor::StreamId;
    use meshlog_testkit::{seed, SplitMix64};

    use super::ChainHash;
    use crate::Event;

    fn event(rng: &mut SplitMix64, seq: u64, len: usize) -> Event {
        Event {
            stream: StreamId::new(7),
            seq,
            lamport: seq + rng.next_u64() % 3,
            time_ms: rng.next_u64(),
            payload: Bytes::from((0..len).map(|_| rng.next_u64() as u8).collect::<Vec<_>>()),
        }
    }

    /// The chain is the documented formula: BLAKE3 derive_key over the
    /// previous hash and the event's fields, payload last.
    #[test]
    fn the_chain_hash_is_the_documented_blake3_derive_key() {
        let seed = seed::replay_or(0xc4a1);
        let mut rng = SplitMix64::new(seed);
        let mut prev = ChainHash::GENESIS;
        for seq in 1..200u64 {
            let e = event(&mut rng, seq, (seq as usize * 7) % 300);
            let mut bytes = prev.to_bytes().to_vec();
            for field in [
                e.stream.get(),
                e.seq,
                e.lamport,
                e.time_ms,
                e.payload.len() as u64,
            ] {
                bytes.extend_from_slice(&field.to_le_bytes());
            }
            bytes.extend_from_slice(&e.payload);
            let expected = blake3::derive_key("meshlog chain v1", &bytes);
            let next = prev.next(&e);
            assert_eq!(next.to_bytes(), expected, "seq {seq}, seed {seed}");
            prev = next;
        }
    }

    /// Every field, and the hash below, changes the hash: a relay cannot
    /// alter, restamp, reorder or splice a run without the head changing.
    #[test]
    fn every_field_and_the_link_below_change_the_hash() {
        let seed = seed::replay_or(0xc4a2);
        let mut rng = SplitMix64::new(seed);
        let e = event(&mut rng, 5, 16);
        let base = ChainHash::from_bytes([9; 32]);
        let h = base.next(&e);
        let mut variants = vec![ChainHash::GENESIS.next(&e)];
        for change in 0..6 {
            let mut v = e.clone();
            match change {
                0 => v.stream = StreamId::new(8),
                1 => v.seq += 1,
                2 => v.lamport += 1,
                3 => v.time_ms ^= 1,
                4 => v.payload = Bytes::from_static(b"other"),
                _ => v.payload = e.payload.slice(..15),
            }
            variants.push(base.next(&v));
        }
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, h, "variant {i} kept the hash, seed {seed}");
        }
        // Two events in the other order end at another head.
        let f = event(&mut rng, 6, 3);
        assert_ne!(base.extend([&e, &f]), base.extend([&f, &e]));
        assert_eq!(base.extend([&e, &f]), base.next(&e).next(&f));
    }

    #[test]
    fn display_is_64_hex_digits() {
        let h = ChainHash::from_bytes([0xab; 32]);
        assert_eq!(h.to_string(), "ab".repeat(32));
        assert_eq!(format!("{h:?}"), format!("ChainHash({})", "ab".repeat(32)));
    }
}
