//! A commit's record in the segment (`segment`): the whole [`Batch`] and
//! the record's number, as one body that the segment frames with a length
//! and a crc32. One function encodes it and one decodes it, so a field a
//! commit gains is one more line in each (and in the round-trip test).
//!
//! The body, integers little-endian:
//!
//! ```text
//! number u64 · clock u64
//! floors:  count u32 · count × (stream u64 · floor_seq u64)
//! chains:  count u32 · count × (stream u64 · floor_hash [32] · head_hash [32] · anchored u8)
//! hashed:  count u32 · count × (stream u64 · seq u64), streams ascending
//! seals:   count u32 · count × (stream u64 · len u32 · the stream's `seals` table record)
//! events:  count u32 · count × (stream u64 · seq u64 · lamport u64 · time_ms u64 · len u32 · payload)
//! [statements: count u32 · count × `SignedCompaction::to_bytes` (144), streams ascending]
//! [forks:      count u32 · count × (len u32 · `ForkProof::to_bytes`)]
//! ```
//!
//! The trailer (statements, then forks) is written only when the batch
//! has some (a record without them is byte for byte what builds before
//! them wrote); its statements' count is 0 when only forks follow.
//!
//! Decoding is total: a body read back from disk is untrusted (the frame's
//! crc32 caught a torn write, but not a crafted one), so every count is
//! checked against the bytes left before anything is allocated, and any
//! byte string gives a batch or a reason.

use bytes::Bytes;
use meshlog_cursor::StreamId;

use super::codec::{self, decode_seals, encode_seals, u64_at};
use crate::{
    Batch, ChainHash, Event, KeptSeals, Seal, SignedCompaction, StreamChain, WriterPublicKey,
};

/// Bytes of an event before its payload.
const EVENT_HEAD_LEN: usize = 8 * 4 + 4;
/// Bytes of a chain entry.
const CHAIN_LEN: usize = 8 + 32 + 32 + 1;
/// Bytes of a floor entry.
const FLOOR_LEN: usize = 8 + 8;
/// The fewest bytes of a seals entry: its stream, its length and the
/// shortest `seals` record (a key, a count of 0 and a crc32).
const SEALS_ENTRY_MIN: usize = 8 + 4 + 32 + 4 + 4;

/// Appends the body of record `number` for `batch` to `out`. A count over
/// `u32::MAX` cannot be framed: answers which, and writes nothing usable
/// (the caller discards `out`).
pub(super) fn encode_batch(number: u64, batch: &Batch, out: &mut Vec<u8>) -> Result<(), String> {
    out.extend_from_slice(&number.to_le_bytes());
    out.extend_from_slice(&batch.clock.to_le_bytes());
    put_count(out, batch.floors.len(), "floors")?;
    for &(stream, floor_seq) in &batch.floors {
        out.extend_from_slice(&stream.get().to_le_bytes());
        out.extend_from_slice(&floor_seq.to_le_bytes());
    }
    put_count(out, batch.chains.len(), "chains")?;
    for &(stream, chain) in &batch.chains {
        out.extend_from_slice(&stream.get().to_le_bytes());
        out.extend_from_slice(&chain.floor_hash.to_bytes());
        out.extend_from_slice(&chain.head_hash.to_bytes());
        out.push(u8::from(chain.anchored));
    }
    put_count(out, batch.hashed.len(), "hashed")?;
    for &(stream, seq) in &batch.hashed {
        out.extend_from_slice(&stream.get().to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
    }
    put_count(out, batch.seals.len(), "seals")?;
    for (stream, kept) in &batch.seals {
        let seals: Vec<[u8; codec::SEAL_LEN]> = kept.seals.iter().map(Seal::to_bytes).collect();
        let record = encode_seals(*stream, kept.key.to_bytes(), &seals);
        out.extend_from_slice(&stream.get().to_le_bytes());
        put_count(out, record.len(), "seals record bytes")?;
        out.extend_from_slice(&record);
    }
    put_count(out, batch.event_count(), "events")?;
    for event in batch.events() {
        out.extend_from_slice(&event.stream.get().to_le_bytes());
        out.extend_from_slice(&event.seq.to_le_bytes());
        out.extend_from_slice(&event.lamport.to_le_bytes());
        out.extend_from_slice(&event.time_ms.to_le_bytes());
        put_count(out, event.payload.len(), "payload bytes")?;
        out.extend_from_slice(&event.payload);
    }
    if !batch.statements.is_empty() || !batch.forks.is_empty() {
        // The statements' count opens the trailer, 0 when only forks follow.
        put_count(out, batch.statements.len(), "statements")?;
        for statement in &batch.statements {
            out.extend_from_slice(&statement.to_bytes());
        }
    }
    if !batch.forks.is_empty() {
        put_count(out, batch.forks.len(), "forks")?;
        for proof in &batch.forks {
            let bytes = proof.to_bytes();
            put_count(out, bytes.len(), "fork proof bytes")?;
            out.extend_from_slice(&bytes);
        }
    }
    Ok(())
}

/// The record number of a body, if it is long enough to hold one.
pub(super) fn record_number(body: &[u8]) -> Option<u64> {
    (body.len() >= 8).then(|| u64_at(body, 0))
}

/// The number and batch of a record's body. Payloads are slices of
/// `body` (no copy).
pub(super) fn decode_batch(body: &Bytes) -> Result<(u64, Batch<'static>), String> {
    let mut reader = Reader { body, at: 0 };
    let number = reader.u64()?;
    let clock = reader.u64()?;
    let floors_len = reader.count(FLOOR_LEN, "floors")?;
    let mut floors = Vec::with_capacity(floors_len);
    for _ in 0..floors_len {
        floors.push((StreamId::new(reader.u64()?), reader.u64()?));
    }
    let chains_len = reader.count(CHAIN_LEN, "chains")?;
    let mut chains = Vec::with_capacity(chains_len);
    for _ in 0..chains_len {
        chains.push(read_chain(&mut reader)?);
    }
    let hashed_len = reader.count(FLOOR_LEN, "hashed")?;
    let mut hashed: Vec<(StreamId, u64)> = Vec::with_capacity(hashed_len);
    for _ in 0..hashed_len {
        let (stream, seq) = (StreamId::new(reader.u64()?), reader.u64()?);
        if hashed.last().is_some_and(|&(before, _)| before >= stream) {
            return Err(format!("hashed: stream {stream} out of order"));
        }
        hashed.push((stream, seq));
    }
    let seals_len = reader.count(SEALS_ENTRY_MIN, "seals")?;
    let mut seals = Vec::with_capacity(seals_len);
    for _ in 0..seals_len {
        let stream = StreamId::new(reader.u64()?);
        let len = reader.count(1, "seals record bytes")?;
        seals.push((stream, kept_seals(stream, reader.take(len)?)?));
    }
    let events_len = reader.count(EVENT_HEAD_LEN, "events")?;
    let mut events = Vec::with_capacity(events_len);
    for _ in 0..events_len {
        events.push(read_event(&mut reader, body)?);
    }
    let (statements, forks) = if reader.at == body.len() {
        (Vec::new(), Vec::new())
    } else {
        let statements = read_statements(&mut reader)?;
        let forks = if reader.at == body.len() {
            if statements.is_empty() {
                return Err(
                    "a statements count of 0 with no forks after it (none are written as no count)"
                        .into(),
                );
            }
            Vec::new()
        } else {
            read_forks(&mut reader)?
        };
        (statements, forks)
    };
    if reader.at != body.len() {
        return Err(format!(
            "{} bytes after the record's trailer",
            body.len() - reader.at
        ));
    }
    let mut batch = Batch::from_events(events)
        .with_clock(clock)
        .with_floors(floors);
    batch.chains = chains;
    batch.hashed = hashed;
    batch.seals = seals;
    batch.statements = statements;
    batch.forks = forks;
    Ok((number, batch))
}

/// The statements after a record's events: a count (0 only when forks
/// follow), then that many, streams strictly ascending.
fn read_statements(reader: &mut Reader<'_>) -> Result<Vec<SignedCompaction>, String> {
    let len = reader.count(SignedCompaction::LEN, "statements")?;
    let mut statements: Vec<SignedCompaction> = Vec::with_capacity(len);
    for _ in 0..len {
        let statement = SignedCompaction::from_bytes(reader.take(SignedCompaction::LEN)?)
            .map_err(|error| format!("statements: {error}"))?;
        let stream = statement.statement.stream;
        if statements
            .last()
            .is_some_and(|before| before.statement.stream >= stream)
        {
            return Err(format!("statements: stream {stream} out of order"));
        }
        statements.push(statement);
    }
    Ok(statements)
}

/// The forks section: each proof decoded (verified when it was kept).
fn read_forks(reader: &mut Reader<'_>) -> Result<Vec<crate::ForkProof>, String> {
    let len = reader.count(4, "forks")?;
    if len == 0 {
        return Err("a forks count of 0 (none are written as no count)".into());
    }
    let mut forks = Vec::with_capacity(len);
    for _ in 0..len {
        let bytes = reader.count(1, "fork proof bytes")?;
        let proof = crate::ForkProof::from_bytes(reader.take(bytes)?);
        forks.push(proof.map_err(|e| e.to_string())?);
    }
    Ok(forks)
}

/// One chain entry: a stream and its chain.
fn read_chain(reader: &mut Reader<'_>) -> Result<(StreamId, StreamChain), String> {
    let stream = StreamId::new(reader.u64()?);
    let floor_hash = ChainHash::from_bytes(reader.hash()?);
    let head_hash = ChainHash::from_bytes(reader.hash()?);
    let anchored = match reader.take(1)?[0] {
        0 => false,
        1 => true,
        other => return Err(format!("chain of stream {stream}: anchored byte {other}")),
    };
    let chain = StreamChain {
        floor_hash,
        head_hash,
        anchored,
    };
    Ok((stream, chain))
}

/// One event, its payload a slice of the body (no copy).
fn read_event(reader: &mut Reader<'_>, body: &Bytes) -> Result<Event, String> {
    let (stream, seq, lamport, time_ms) =
        (reader.u64()?, reader.u64()?, reader.u64()?, reader.u64()?);
    let len = reader.count(1, "payload bytes")?;
    let start = reader.at;
    reader.take(len)?;
    Ok(Event {
        stream: StreamId::new(stream),
        seq,
        lamport,
        time_ms,
        payload: body.slice(start..start + len),
    })
}

/// A stream's kept seals from its `seals` record (the table's codec), or
/// why not: the record, its key or a seal refused.
fn kept_seals(stream: StreamId, record: &[u8]) -> Result<KeptSeals, String> {
    let bad = |detail: String| format!("seals of stream {stream}: {detail}");
    let (key, seals) = decode_seals(stream, record).map_err(bad)?;
    let key = WriterPublicKey::from_bytes(&key).map_err(|e| bad(e.to_string()))?;
    let seals = seals
        .iter()
        .map(|bytes| Seal::from_bytes(bytes).map_err(|e| bad(e.to_string())))
        .collect::<Result<Vec<Seal>, String>>()?;
    Ok(KeptSeals { key, seals })
}

fn put_count(out: &mut Vec<u8>, count: usize, what: &str) -> Result<(), String> {
    let count = u32::try_from(count).map_err(|_| format!("{count} {what} in one commit"))?;
    out.extend_from_slice(&count.to_le_bytes());
    Ok(())
}

/// Reads a body front to back; every read is checked against what is left.
struct Reader<'b> {
    body: &'b [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, len: usize) -> Result<&[u8], String> {
        let left = self.body.len() - self.at;
        if len > left {
            return Err(format!(
                "{len} bytes wanted at byte {}, {left} left",
                self.at
            ));
        }
        self.at += len;
        Ok(&self.body[self.at - len..self.at])
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64_at(self.take(8)?, 0))
    }

    fn hash(&mut self) -> Result<[u8; 32], String> {
        Ok(self.take(32)?.try_into().expect("32 bytes"))
    }

    /// A count of items of at least `item_len` bytes each, refused when
    /// the bytes left cannot hold them (so a damaged count allocates
    /// nothing).
    fn count(&mut self, item_len: usize, what: &str) -> Result<usize, String> {
        let count = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize;
        let left = self.body.len() - self.at;
        if count.saturating_mul(item_len) > left {
            return Err(format!(
                "{count} {what} cannot fit in the {left} bytes left"
            ));
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Batch<'static> {
        let events = (1..=3)
            .map(|seq| Event {
                stream: StreamId::new(7),
                seq,
                lamport: 10 + seq,
                time_ms: 99,
                payload: Bytes::from(vec![seq as u8; seq as usize * 3]),
            })
            .collect();
        let mut batch = Batch::from_events(events)
            .with_clock(13)
            .with_floors(vec![(StreamId::new(2), 4)]);
        batch.chains = vec![(
            StreamId::new(7),
            StreamChain {
                floor_hash: ChainHash::from_bytes([1; 32]),
                head_hash: ChainHash::from_bytes([2; 32]),
                anchored: true,
            },
        )];
        batch.hashed = vec![(StreamId::new(7), 2)];
        let key = crate::WriterKey::from_bytes([9; 32]);
        let stream = key.stream();
        let seals = (2..=3)
            .map(|seq| Seal::sign(&key, seq, ChainHash::from_bytes([seq as u8; 32])))
            .collect();
        batch.seals = vec![(
            stream,
            KeptSeals {
                key: key.public(),
                seals,
            },
        )];
        let statement = crate::Compaction {
            stream,
            floor: 1,
            hash: ChainHash::from_bytes([5; 32]),
        };
        batch.statements = vec![statement.sign_by_writer(&key)];
        batch
    }

    /// Every field a commit persists comes back; a field added to `Batch`
    /// and persisted belongs in this comparison.
    #[test]
    fn a_batch_round_trips_whole() {
        let batch = sample();
        let mut body = Vec::new();
        encode_batch(42, &batch, &mut body).unwrap();
        let (number, back) = decode_batch(&Bytes::from(body.clone())).unwrap();
        assert_eq!(number, 42);
        assert_eq!(record_number(&body), Some(42));
        assert_eq!(back, batch);
        assert_eq!(back.chains, batch.chains);
        assert_eq!(back.hashed, batch.hashed);
        assert_eq!(back.seals, batch.seals);
        assert_eq!(back.statements, batch.statements);
        // Without statements, the record ends with its events, as before.
        let mut without = sample();
        without.statements.clear();
        let mut old = Vec::new();
        encode_batch(42, &without, &mut old).unwrap();
        assert_eq!(body.len() - old.len(), 4 + SignedCompaction::LEN);
        assert_eq!(
            decode_batch(&Bytes::from(old)).unwrap().1.statements,
            Vec::new()
        );
    }

    /// A proof of a fork of `key`'s stream at seq 1 (as `ForkProof`'s
    /// example builds one).
    fn proof(key: &crate::WriterKey) -> crate::ForkProof {
        let stream = key.stream();
        let branch = |payload: &'static [u8]| {
            let event = Event {
                stream,
                seq: 1,
                lamport: 1,
                time_ms: 0,
                payload: payload.into(),
            };
            let head = ChainHash::GENESIS.next(&event);
            crate::ForkBranch {
                seal: Seal::sign(key, 1, head),
                hash_at: head,
                events: Vec::new(),
            }
        };
        crate::ForkProof {
            key: key.public(),
            seq: 1,
            branches: [branch(b"a"), branch(b"b")],
        }
    }

    /// The trailer carries statements, forks, both or neither, each back
    /// as it went: forks alone open it with a statements count of 0, and a
    /// count of 0 with nothing after it is refused.
    #[test]
    fn statements_and_forks_share_the_trailer() {
        let key = crate::WriterKey::from_bytes([3; 32]);
        for (statements, forks) in [(true, true), (false, true), (true, false), (false, false)] {
            let mut batch = sample();
            if !statements {
                batch.statements.clear();
            }
            if forks {
                batch.forks = vec![proof(&key)];
            }
            let mut body = Vec::new();
            encode_batch(5, &batch, &mut body).unwrap();
            let (_, back) = decode_batch(&Bytes::from(body.clone())).unwrap();
            assert_eq!(back.statements, batch.statements, "{statements} {forks}");
            assert_eq!(back.forks, batch.forks, "{statements} {forks}");
            if !statements && forks {
                // The forks cut off: a statements count of 0 alone.
                let proof_len = 4 + 4 + batch.forks[0].to_bytes().len();
                let cut = Bytes::copy_from_slice(&body[..body.len() - proof_len]);
                let error = decode_batch(&cut).unwrap_err();
                assert!(error.contains("statements count of 0"), "{error}");
            }
        }
    }

    /// Every prefix of a body, and every body with a byte changed in a
    /// count, decodes to a batch or a reason: never a panic, never an
    /// allocation the bytes cannot back. One prefix decodes: the body cut
    /// right after its events, which is the record without its statements
    /// (as builds before them wrote it; a torn write is caught by the
    /// segment frame's crc32, not here).
    #[test]
    fn a_damaged_body_is_refused_not_panicked_on() {
        let mut body = Vec::new();
        let batch = sample();
        encode_batch(1, &batch, &mut body).unwrap();
        let events_end = body.len() - 4 - batch.statements.len() * SignedCompaction::LEN;
        for len in 0..body.len() {
            let decoded = decode_batch(&Bytes::copy_from_slice(&body[..len]));
            if len == events_end {
                assert!(decoded.unwrap().1.statements.is_empty());
            } else {
                assert!(decoded.is_err(), "a prefix of {len} bytes decoded");
            }
        }
        for at in 0..body.len() {
            let mut changed = body.clone();
            changed[at] = 0xff;
            let _ = decode_batch(&Bytes::from(changed));
        }
    }
}
