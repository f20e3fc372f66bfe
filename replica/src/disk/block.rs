//! A block: up to [`BLOCK_EVENTS_MAX`] consecutive events of one stream in
//! one redb value, keyed `(stream, first_seq)`, and the builder that lays
//! one out.
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! count u32 · count × (lamport u64 · time_ms u64 · end u32) · payloads · crc32
//! ```
//!
//! `end` is where the event's payload ends, counted from the start of the
//! payloads; each payload starts where the one before ended. The crc32
//! covers the key (`stream`, `first_seq`) and everything before it, so a
//! value moved under another key is caught as well as a flipped bit.
//!
//! Why blocks: one redb read then hands out up to 128 events as slices of one
//! buffer, where a value per event cost a B-tree step, a crc and an
//! allocation per event (`docs/STORAGE.md`).

use std::ops::Range;

use bytes::Bytes;
use meshlog_cursor::StreamId;

use super::codec::u64_at;
use crate::Event;

/// The most events a block holds. 128 events of 100 bytes walk at about
/// 8 M events/s warm where 64 walked at 6.7 M (`benches/storage_resident.rs`,
/// 1 M events); a commit rewrites at most one block per stream it extends.
pub(crate) const BLOCK_EVENTS_MAX: usize = 128;
/// A block takes another event only while its value stays within this
/// many bytes (a block of one event may be larger: that event's payload).
pub(crate) const BLOCK_BYTES_TARGET: usize = 32 << 10;

const HEADER: usize = 4;
const ENTRY: usize = 8 + 8 + 4;
const CRC: usize = 4;

/// A block read back and checked: its crc, its count, and that every
/// payload lies inside it, in order.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    first_seq: u64,
    count: usize,
    /// The value without its crc.
    body: Bytes,
}

impl Block {
    /// Checks the value stored under `(stream, first_seq)` and copies it
    /// out. Total: any bytes give a block or a description of the damage.
    pub(crate) fn decode(stream: StreamId, first_seq: u64, value: &[u8]) -> Result<Block, String> {
        if value.len() < HEADER + CRC {
            return Err(format!(
                "value of {} bytes is shorter than a block's {} bytes of header and crc",
                value.len(),
                HEADER + CRC
            ));
        }
        let (body, crc) = value.split_at(value.len() - CRC);
        let stored_crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        let computed_crc = block_crc(stream, first_seq, body);
        if stored_crc != computed_crc {
            return Err(format!(
                "crc32 mismatch: stored {stored_crc:#010x}, computed {computed_crc:#010x}"
            ));
        }
        let count = u32::from_le_bytes(body[..HEADER].try_into().expect("4 bytes")) as usize;
        if count == 0 || count > BLOCK_EVENTS_MAX {
            return Err(format!(
                "holds {count} events; a block holds 1 to {BLOCK_EVENTS_MAX}"
            ));
        }
        if first_seq == 0 || first_seq.checked_add(count as u64 - 1).is_none() {
            return Err(format!(
                "{count} events from seq {first_seq} leave the seqs"
            ));
        }
        let payloads_at = HEADER + count * ENTRY;
        let Some(payloads_len) = body.len().checked_sub(payloads_at) else {
            return Err(format!(
                "{count} entries do not fit in a value of {} bytes",
                value.len()
            ));
        };
        let mut start = 0usize;
        for index in 0..count {
            let end = end_at(body, index);
            if end < start || end > payloads_len {
                return Err(format!(
                    "event {index} ends its payload at {end}, outside {start}..={payloads_len}"
                ));
            }
            start = end;
        }
        if start != payloads_len {
            return Err(format!(
                "the payloads end at {start}, but the block holds {payloads_len} bytes of them"
            ));
        }
        Ok(Block {
            first_seq,
            count,
            body: Bytes::copy_from_slice(body),
        })
    }

    pub(crate) fn first_seq(&self) -> u64 {
        self.first_seq
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// The bytes the block takes in memory (its value without the crc).
    pub(crate) fn byte_len(&self) -> usize {
        self.body.len()
    }

    /// The last seq the block holds (checked not to overflow on decode).
    pub(crate) fn last_seq(&self) -> u64 {
        self.first_seq + (self.count as u64 - 1)
    }

    /// Whether the block holds `seq`.
    pub(crate) fn holds(&self, seq: u64) -> bool {
        (self.first_seq..=self.last_seq()).contains(&seq)
    }

    pub(crate) fn lamport(&self, index: usize) -> u64 {
        u64_at(&self.body, HEADER + index * ENTRY)
    }

    fn time_ms(&self, index: usize) -> u64 {
        u64_at(&self.body, HEADER + index * ENTRY + 8)
    }

    fn payload_range(&self, index: usize) -> Range<usize> {
        let payloads_at = HEADER + self.count * ENTRY;
        let start = if index == 0 {
            0
        } else {
            end_at(&self.body, index - 1)
        };
        payloads_at + start..payloads_at + end_at(&self.body, index)
    }

    /// The event at `index`; its payload is a slice of the block's buffer.
    pub(crate) fn event(&self, stream: StreamId, index: usize) -> Event {
        Event {
            stream,
            seq: self.first_seq + index as u64,
            lamport: self.lamport(index),
            time_ms: self.time_ms(index),
            payload: self.body.slice(self.payload_range(index)),
        }
    }
}

/// Lays out one block: events are pushed in seq order while
/// [`BlockBuilder::has_room`] says so.
#[derive(Debug, Default)]
pub(crate) struct BlockBuilder {
    entries: Vec<u8>,
    payloads: Vec<u8>,
    count: usize,
}

impl BlockBuilder {
    /// A builder holding the events of `block` from `index` on.
    pub(crate) fn from_block(block: &Block, index: usize) -> BlockBuilder {
        let mut builder = BlockBuilder::default();
        for at in index..block.len() {
            builder.push(
                block.lamport(at),
                block.time_ms(at),
                &block.body[block.payload_range(at)],
            );
        }
        builder
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Whether an event with `payload_len` bytes fits: always into an
    /// empty block, else within [`BLOCK_EVENTS_MAX`] and
    /// [`BLOCK_BYTES_TARGET`].
    pub(crate) fn has_room(&self, payload_len: usize) -> bool {
        self.count == 0
            || (self.count < BLOCK_EVENTS_MAX
                && HEADER + self.entries.len() + ENTRY + self.payloads.len() + payload_len + CRC
                    <= BLOCK_BYTES_TARGET)
    }

    /// Adds the next event. The caller checked [`BlockBuilder::has_room`]
    /// and that the payload is under 4 GiB.
    pub(crate) fn push(&mut self, lamport: u64, time_ms: u64, payload: &[u8]) {
        assert!(
            self.count < BLOCK_EVENTS_MAX,
            "a block holds at most its max"
        );
        self.payloads.extend_from_slice(payload);
        let end = u32::try_from(self.payloads.len()).expect("a block's payloads fit in u32");
        self.entries.extend_from_slice(&lamport.to_le_bytes());
        self.entries.extend_from_slice(&time_ms.to_le_bytes());
        self.entries.extend_from_slice(&end.to_le_bytes());
        self.count += 1;
    }

    pub(crate) fn push_event(&mut self, event: &Event) {
        self.push(event.lamport, event.time_ms, &event.payload);
    }

    /// Writes the value for key `(stream, first_seq)` into `out`, and
    /// empties the builder.
    pub(crate) fn finish(&mut self, stream: StreamId, first_seq: u64, out: &mut Vec<u8>) {
        assert!(self.count > 0, "a block holds at least one event");
        out.clear();
        out.reserve(HEADER + self.entries.len() + self.payloads.len() + CRC);
        let count = u32::try_from(self.count).expect("a block's count fits in u32");
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&self.entries);
        out.extend_from_slice(&self.payloads);
        let crc = block_crc(stream, first_seq, out);
        out.extend_from_slice(&crc.to_le_bytes());
        self.entries.clear();
        self.payloads.clear();
        self.count = 0;
    }
}

fn end_at(body: &[u8], index: usize) -> usize {
    let at = HEADER + index * ENTRY + 16;
    u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes")) as usize
}

fn block_crc(stream: StreamId, first_seq: u64, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&stream.get().to_le_bytes());
    hasher.update(&first_seq.to_le_bytes());
    hasher.update(body);
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use meshlog_testkit::{seed, SplitMix64};

    use super::*;

    fn event(seq: u64, payload_len: usize) -> Event {
        Event {
            stream: StreamId::new(7),
            seq,
            lamport: 100 + seq * 3,
            time_ms: 1_700_000_000_000 + seq,
            payload: Bytes::from(vec![seq as u8; payload_len]),
        }
    }

    fn build(events: &[Event]) -> Vec<u8> {
        let mut builder = BlockBuilder::default();
        for event in events {
            builder.push_event(event);
        }
        let mut value = Vec::new();
        builder.finish(events[0].stream, events[0].seq, &mut value);
        value
    }

    #[test]
    fn a_block_round_trips_and_catches_every_single_bit_flip() {
        let events: Vec<Event> = (5..9).map(|seq| event(seq, (seq % 3) as usize)).collect();
        let value = build(&events);
        let block = Block::decode(StreamId::new(7), 5, &value).unwrap();
        assert_eq!(
            (block.first_seq(), block.len(), block.last_seq()),
            (5, 4, 8)
        );
        for (index, expected) in events.iter().enumerate() {
            assert_eq!(&block.event(StreamId::new(7), index), expected);
        }
        for bit in 0..value.len() * 8 {
            let mut flipped = value.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                Block::decode(StreamId::new(7), 5, &flipped).is_err(),
                "bit {bit}"
            );
        }
        // Under another key, or cut short: caught too.
        assert!(Block::decode(StreamId::new(7), 6, &value).is_err());
        assert!(Block::decode(StreamId::new(8), 5, &value).is_err());
        for len in 0..value.len() {
            assert!(Block::decode(StreamId::new(7), 5, &value[..len]).is_err());
        }
    }

    /// A value whose crc is right but whose layout is not (what a bug
    /// writing it would leave) is refused, never a panic: random bodies
    /// with a valid crc appended.
    #[test]
    fn any_body_with_a_valid_crc_decodes_or_is_refused_never_a_panic() {
        let seed = seed::replay_or(0xb10c);
        let mut rng = SplitMix64::new(seed);
        for case in 0..20_000 {
            let len = rng.below(200) as usize;
            let mut body: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            if len >= 4 && rng.chance(0.7) {
                body[..4].copy_from_slice(&(rng.below(5) as u32).to_le_bytes());
            }
            let first_seq = if rng.chance(0.1) {
                u64::MAX - rng.below(3)
            } else {
                rng.below(10)
            };
            let stream = StreamId::new(1);
            let crc = block_crc(stream, first_seq, &body);
            body.extend_from_slice(&crc.to_le_bytes());
            if let Ok(block) = Block::decode(stream, first_seq, &body) {
                for index in 0..block.len() {
                    let event = block.event(stream, index);
                    assert_eq!(
                        event.seq,
                        first_seq + index as u64,
                        "case {case}, seed {seed}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_block_fills_to_its_max_events_or_its_byte_target() {
        let mut builder = BlockBuilder::default();
        for seq in 1..=BLOCK_EVENTS_MAX as u64 {
            assert!(builder.has_room(10));
            builder.push_event(&event(seq, 10));
        }
        assert!(!builder.has_room(0), "full at {BLOCK_EVENTS_MAX} events");
        let mut builder = BlockBuilder::default();
        assert!(
            builder.has_room(BLOCK_BYTES_TARGET * 4),
            "one large event always fits"
        );
        builder.push_event(&event(1, BLOCK_BYTES_TARGET / 2));
        assert!(!builder.has_room(BLOCK_BYTES_TARGET / 2));
        assert!(builder.has_room(100));
    }

    #[test]
    fn a_builder_from_a_block_keeps_the_events_from_an_index() {
        let events: Vec<Event> = (1..=10).map(|seq| event(seq, seq as usize)).collect();
        let block = Block::decode(StreamId::new(7), 1, &build(&events)).unwrap();
        let mut rest = BlockBuilder::from_block(&block, 4);
        assert_eq!(rest.len(), 6);
        let mut value = Vec::new();
        rest.finish(StreamId::new(7), 5, &mut value);
        let rest = Block::decode(StreamId::new(7), 5, &value).unwrap();
        for index in 0..rest.len() {
            assert_eq!(rest.event(StreamId::new(7), index), events[4 + index]);
        }
    }
}
