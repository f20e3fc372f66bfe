//! The records of the `streams`, `chains`, `seals` and `meta` tables, each with a crc32 over
//! its key and content (`docs/STORAGE.md`), and the little-endian reads
//! that blocks share. A leaf: it imports nothing of the crate, so the
//! digest record is coded from and to its two numbers (the store converts
//! them to and from [`Digest`](crate::Digest)).

use meshlog_cursor::StreamId;

/// The `meta` table's keys.
pub(super) const META_FORMAT: &str = "format";
pub(super) const META_CLOCK: &str = "clock";
pub(super) const META_DIGEST: &str = "digest";
pub(super) const META_BLOCKS: &str = "blocks";
/// The number of the last write-ahead segment record redb holds.
pub(super) const META_FOLDED: &str = "folded";

const STREAM_RECORD_LEN: usize = 8 + 8 + 4;

pub(super) fn encode_stream(stream: StreamId, floor: u64, head: u64) -> [u8; STREAM_RECORD_LEN] {
    let mut record = [0u8; STREAM_RECORD_LEN];
    record[0..8].copy_from_slice(&floor.to_le_bytes());
    record[8..16].copy_from_slice(&head.to_le_bytes());
    let crc = record_crc(&stream.get().to_le_bytes(), &record[..16]);
    record[16..20].copy_from_slice(&crc.to_le_bytes());
    record
}

pub(super) fn decode_stream(stream: StreamId, record: &[u8]) -> Option<(u64, u64)> {
    if record.len() != STREAM_RECORD_LEN {
        return None;
    }
    let crc = u32::from_le_bytes(record[16..20].try_into().expect("4 bytes"));
    (crc == record_crc(&stream.get().to_le_bytes(), &record[..16]))
        .then(|| (u64_at(record, 0), u64_at(record, 8)))
}

/// A `chains` table record: the floor it is for (which must be the stream
/// record's: a record from before a compaction is refused) and the seq its
/// head hash is at (the stream record's head, or below it for a stream
/// hashed lazily: the hash at a seq stays true as events are appended),
/// the chain hash at the floor and at that seq, whether it is anchored (1)
/// or not (0), and a crc32 over the stream and all of that.
const CHAIN_RECORD_LEN: usize = 8 + 8 + 32 + 32 + 1 + 4;

/// A stream's chain as the `chains` table holds it: floor, head, floor
/// hash, head hash, anchored.
pub(super) type ChainRecord = (u64, u64, [u8; 32], [u8; 32], bool);

pub(super) fn encode_chain(stream: StreamId, chain: ChainRecord) -> [u8; CHAIN_RECORD_LEN] {
    let (floor, head, floor_hash, head_hash, anchored) = chain;
    let mut record = [0u8; CHAIN_RECORD_LEN];
    record[0..8].copy_from_slice(&floor.to_le_bytes());
    record[8..16].copy_from_slice(&head.to_le_bytes());
    record[16..48].copy_from_slice(&floor_hash);
    record[48..80].copy_from_slice(&head_hash);
    record[80] = u8::from(anchored);
    let crc = record_crc(&stream.get().to_le_bytes(), &record[..81]);
    record[81..85].copy_from_slice(&crc.to_le_bytes());
    record
}

pub(super) fn decode_chain(stream: StreamId, record: &[u8]) -> Option<ChainRecord> {
    if record.len() != CHAIN_RECORD_LEN || record[80] > 1 {
        return None;
    }
    let crc = u32::from_le_bytes(record[81..85].try_into().expect("4 bytes"));
    (crc == record_crc(&stream.get().to_le_bytes(), &record[..81])).then(|| {
        (
            u64_at(record, 0),
            u64_at(record, 8),
            record[16..48].try_into().expect("32 bytes"),
            record[48..80].try_into().expect("32 bytes"),
            record[80] == 1,
        )
    })
}

/// The most seals a `seals` record holds (`KeptSeals::SEALS_MAX`; a
/// longer count is refused before anything is allocated).
pub(super) const SEALS_RECORD_MAX: usize = 72;
/// The bytes of one seal in a `seals` record (`Seal::LEN`).
pub(super) const SEAL_LEN: usize = 8 + 8 + 32 + 64;

/// A `seals` table record: the key pinned (32 bytes), the number of seals
/// (u32 LE), the seals (each [`SEAL_LEN`] bytes, as `Seal::to_bytes`),
/// and a crc32 over the stream and all of that.
pub(super) fn encode_seals(stream: StreamId, key: [u8; 32], seals: &[[u8; SEAL_LEN]]) -> Vec<u8> {
    let mut record = Vec::with_capacity(32 + 4 + seals.len() * SEAL_LEN + 4);
    record.extend_from_slice(&key);
    record.extend_from_slice(&(seals.len() as u32).to_le_bytes());
    for seal in seals {
        record.extend_from_slice(seal);
    }
    let crc = record_crc(&stream.get().to_le_bytes(), &record);
    record.extend_from_slice(&crc.to_le_bytes());
    record
}

/// A stream's `seals` record as its parts, or why it is not one: a
/// length that its count does not account for, a count above
/// [`SEALS_RECORD_MAX`], or a checksum that fails. Total.
pub(super) fn decode_seals(
    stream: StreamId,
    record: &[u8],
) -> Result<([u8; 32], Vec<[u8; SEAL_LEN]>), String> {
    if record.len() < 32 + 4 + 4 {
        return Err(format!("{} bytes, fewer than a record's 40", record.len()));
    }
    let count = u32::from_le_bytes(record[32..36].try_into().expect("4 bytes")) as usize;
    if count > SEALS_RECORD_MAX {
        return Err(format!("{count} seals, above the {SEALS_RECORD_MAX} kept"));
    }
    let len = 32 + 4 + count * SEAL_LEN + 4;
    if record.len() != len {
        return Err(format!(
            "{} bytes where {count} seals take {len}",
            record.len()
        ));
    }
    let body = &record[..len - 4];
    let crc = u32::from_le_bytes(record[len - 4..].try_into().expect("4 bytes"));
    if crc != record_crc(&stream.get().to_le_bytes(), body) {
        return Err("it fails its checksum".to_string());
    }
    let seals = body[36..]
        .chunks_exact(SEAL_LEN)
        .map(|seal| seal.try_into().expect("SEAL_LEN bytes"))
        .collect();
    Ok((body[..32].try_into().expect("32 bytes"), seals))
}

/// A `forks` table record: a proof's encoding (`ForkProof::to_bytes`)
/// and a crc32 over the stream and it.
pub(super) fn encode_fork(stream: StreamId, proof: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(proof.len() + 4);
    record.extend_from_slice(proof);
    let crc = record_crc(&stream.get().to_le_bytes(), proof);
    record.extend_from_slice(&crc.to_le_bytes());
    record
}

/// A stream's `forks` record's proof bytes, or why it is not one (too
/// short, or a checksum that fails). Total.
pub(super) fn decode_fork(stream: StreamId, record: &[u8]) -> Result<&[u8], String> {
    let Some(body_len) = record.len().checked_sub(4) else {
        return Err(format!("{} bytes, fewer than a checksum", record.len()));
    };
    let (body, crc) = record.split_at(body_len);
    let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    if crc != record_crc(&stream.get().to_le_bytes(), body) {
        return Err("it fails its checksum".to_string());
    }
    Ok(body)
}

/// A `statements` table record: a signed statement's encoding
/// (`SignedCompaction::to_bytes`) and a crc32 over the stream and it, as a
/// `forks` record ([`encode_fork`]).
pub(super) fn encode_statement(stream: StreamId, statement: &[u8]) -> Vec<u8> {
    encode_fork(stream, statement)
}

/// A stream's `statements` record's statement bytes, or why it is not one
/// ([`decode_fork`]). A record of exactly `SignedCompaction::LEN` bytes is
/// the layout before the checksum (unreleased, `docs/STORAGE.md`): taken
/// as it is, its signature checked by the caller. Total.
pub(super) fn decode_statement(stream: StreamId, record: &[u8]) -> Result<&[u8], String> {
    if record.len() == crate::SignedCompaction::LEN {
        return Ok(record);
    }
    decode_fork(stream, record)
}

pub(super) fn encode_clock(clock: u64) -> [u8; 12] {
    encode_count(META_CLOCK, clock)
}

pub(super) fn decode_clock(record: &[u8]) -> Option<u64> {
    decode_count(META_CLOCK, record)
}

/// A `u64` under a meta key: its value and a crc32 over key and value.
pub(super) fn encode_count(key: &str, count: u64) -> [u8; 12] {
    let mut record = [0u8; 12];
    record[0..8].copy_from_slice(&count.to_le_bytes());
    let crc = record_crc(key.as_bytes(), &record[..8]);
    record[8..12].copy_from_slice(&crc.to_le_bytes());
    record
}

pub(super) fn decode_count(key: &str, record: &[u8]) -> Option<u64> {
    if record.len() != 12 {
        return None;
    }
    let crc = u32::from_le_bytes(record[8..12].try_into().expect("4 bytes"));
    (crc == record_crc(key.as_bytes(), &record[..8])).then(|| u64_at(record, 0))
}

/// The digest record: the number of events and their sum, as in
/// [`Digest`](crate::Digest).
pub(super) fn encode_digest(events: u64, sum: u128) -> [u8; 28] {
    let mut record = [0u8; 28];
    record[0..8].copy_from_slice(&events.to_le_bytes());
    record[8..24].copy_from_slice(&sum.to_le_bytes());
    let crc = record_crc(META_DIGEST.as_bytes(), &record[..24]);
    record[24..28].copy_from_slice(&crc.to_le_bytes());
    record
}

/// The number of events and their sum, from a digest record.
pub(super) fn decode_digest(record: &[u8]) -> Option<(u64, u128)> {
    if record.len() != 28 {
        return None;
    }
    let crc = u32::from_le_bytes(record[24..28].try_into().expect("4 bytes"));
    (crc == record_crc(META_DIGEST.as_bytes(), &record[..24])).then(|| {
        (
            u64_at(record, 0),
            u128::from_le_bytes(record[8..24].try_into().expect("16 bytes")),
        )
    })
}

pub(super) fn encode_format(version: u32) -> [u8; 8] {
    let mut record = [0u8; 8];
    record[0..4].copy_from_slice(&version.to_le_bytes());
    let crc = record_crc(META_FORMAT.as_bytes(), &record[..4]);
    record[4..8].copy_from_slice(&crc.to_le_bytes());
    record
}

pub(super) fn decode_format(record: &[u8]) -> Option<u32> {
    if record.len() != 8 {
        return None;
    }
    let crc = u32::from_le_bytes(record[4..8].try_into().expect("4 bytes"));
    (crc == record_crc(META_FORMAT.as_bytes(), &record[..4]))
        .then(|| u32::from_le_bytes(record[0..4].try_into().expect("4 bytes")))
}

fn record_crc(key: &[u8], body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(key);
    hasher.update(body);
    hasher.finalize()
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_catch_flips() {
        let stream = StreamId::new(3);
        let record = encode_stream(stream, 5, 9);
        assert_eq!(decode_stream(stream, &record), Some((5, 9)));
        assert_eq!(decode_stream(StreamId::new(4), &record), None);
        let clock = encode_clock(77);
        assert_eq!(decode_clock(&clock), Some(77));
        let mut flipped = clock;
        flipped[0] ^= 1;
        assert_eq!(decode_clock(&flipped), None);
        assert_eq!(decode_format(&encode_format(1)), Some(1));
        let chain = (4, 9, [1; 32], [2; 32], true);
        let record = encode_chain(stream, chain);
        assert_eq!(decode_chain(stream, &record), Some(chain));
        assert_eq!(decode_chain(StreamId::new(4), &record), None);
        for bit in 0..record.len() * 8 {
            let mut flipped = record;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_chain(stream, &flipped), None, "bit {bit}");
        }
    }
}
