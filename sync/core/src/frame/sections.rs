//! A delta's sections (protocol 4): what follows its payloads, each a
//! tagged, length-bounded part (`docs/PROTOCOL.md`, "Delta sections").
//!
//! Three sections are known: the **seals** (tag 0): per stream at most
//! one writer's [`RunSeal`] over the delta's run of it, in the encodings
//! of `meshlog_replica::seal` (the key's 32 bytes, [`Seal::to_bytes`], the
//! optional base's 32); the **statements** (tag 1): per stream of the
//! delta's floor at most one [`SignedCompaction`] (its 144 bytes); the
//! **floor hashes** (tag 2): per stream of the delta's floor at most one
//! chain hash there (stream u64 LE, the hash's 32 bytes). Those two are
//! [`FloorProofs`]. Later additions are new tags: a receiver skips a
//! section whose tag it does not know, by its length, so they need no new
//! protocol version as long as an older receiver may ignore them (it then
//! behaves as it did before them; an older v4 receiver ignores statements
//! and keeps every held event, as before them). An addition an older
//! receiver must not ignore needs a new version.
//!
//! Only structure is judged here (counts, order, lengths, a key that is a
//! key): whether a seal vouches for its run, whether its key may sign for
//! its stream, is the replica's one acceptance path (`docs/SIGNING.md`).

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    ChainHash, FloorProofs, ForkProof, RunSeal, Seal, SignedCompaction, WriterPublicKey,
};

use super::event_runs::{put_varint, Reader};
use super::FrameError;

/// Each known section's tag, the varint that opens it.
mod tag {
    /// The writers' seals over the delta's runs.
    pub const SEALS: u64 = 0;
    /// The compaction statements backing the delta's floors.
    pub const STATEMENTS: u64 = 1;
    /// The chain hash at each of the delta's floors.
    pub const FLOOR_HASHES: u64 = 2;
    /// Proofs that writers forked their streams (`docs/SIGNING.md`,
    /// "Equivocation with valid signatures").
    pub const FORKS: u64 = 3;
}

/// The bytes of a floor hash entry: the stream and the hash (40).
const FLOOR_HASH_ENTRY_BYTES: usize = 8 + 32;

/// The most bytes the statements and floor hashes of a delta whose floor
/// has `floor_len` streams take: per section its tag, a length and a
/// count of at most 5 bytes each, and per stream a statement and a hash.
pub(crate) fn floor_proofs_bytes_max(floor_len: usize) -> usize {
    if floor_len == 0 {
        return 0;
    }
    2 * (1 + 5 + 5) + floor_len * (SignedCompaction::LEN + FLOOR_HASH_ENTRY_BYTES)
}

/// The fewest bytes a fork proof's encoding takes (no events in either
/// branch): the domain string, the key, the seq and two branch heads.
const FORK_PROOF_BYTES_MIN: usize = 15 + 32 + 8 + 2 * (Seal::LEN + 32 + 4);

/// Appends the forks section (tag 3) after the sections before it, if
/// there are proofs: a count, then each proof's length and encoding
/// (`ForkProof::to_bytes`).
pub(super) fn put_forks(out: &mut Vec<u8>, forks: &[ForkProof]) {
    if forks.is_empty() {
        return;
    }
    let mut body = Vec::new();
    put_varint(&mut body, forks.len() as u64);
    for proof in forks {
        let bytes = proof.to_bytes();
        put_varint(&mut body, bytes.len() as u64);
        body.extend_from_slice(&bytes);
    }
    put_varint(out, tag::FORKS);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(&body);
}

/// A forks section's body: a count (1 or more, and what the body can hold
/// at the smallest proof's size, checked before anything is allocated),
/// then each proof's length (at most `ForkProof::BYTES_MAX`) and its
/// encoding, decoded totally, filling the body exactly. Whether a proof
/// proves anything is the replica's to judge.
fn read_forks(body: &[u8]) -> Result<Vec<ForkProof>, FrameError> {
    let mut reader = Reader { bytes: body };
    let count = reader.varint("fork count")?;
    let bytes_left = reader.bytes.len();
    if count == 0 {
        return Err(Reader::malformed(
            "forks",
            "a forks section holds one proof or more",
        ));
    }
    if count.saturating_mul(FORK_PROOF_BYTES_MIN as u64) > bytes_left as u64 {
        return Err(FrameError::CountAboveBytes {
            field: "forks",
            count,
            bytes_left,
        });
    }
    let mut forks = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = reader.varint("fork proof length")?;
        let bytes = take(&mut reader, len, "fork proof")?;
        let proof = ForkProof::from_bytes(bytes)
            .map_err(|error| Reader::malformed("fork proof", &error.to_string()))?;
        forks.push(proof);
    }
    if !reader.bytes.is_empty() {
        return Err(Reader::malformed(
            "forks",
            &format!("{} bytes after the last proof", reader.bytes.len()),
        ));
    }
    Ok(forks)
}

/// The bytes of a seal entry without a base: the key, the seal, the base's
/// flag (145).
const SEAL_ENTRY_BYTES_MIN: usize = WriterPublicKey::LEN + Seal::LEN + 1;

/// The bytes of a seal entry with a base (177).
const SEAL_ENTRY_BYTES_MAX: usize = SEAL_ENTRY_BYTES_MIN + 32;

/// The most bytes the sections of a delta of one run take: the seals
/// section's tag, length and count, and one seal with a base (1 + 2 + 1 +
/// 177 = 181). What a frame carrying one event needs besides the event.
pub(crate) const ONE_RUN_SECTIONS_BYTES_MAX: usize = 1 + 2 + 1 + SEAL_ENTRY_BYTES_MAX;

/// Appends a delta's sections after its payloads: the seals section if it
/// has seals, then the statements and the floor hashes if it has any (an
/// empty section is never written). Refuses what a receiver would: more
/// seals than the delta's `runs`, streams not strictly ascending, a
/// statement or hash of a stream not in the delta's `floor`
/// ([`FrameError::Encode`]).
pub(super) fn put_sections(
    out: &mut Vec<u8>,
    seals: &[RunSeal],
    runs: usize,
    floor: &VersionVector,
    proofs: &FloorProofs,
) -> Result<(), FrameError> {
    put_seals(out, seals, runs)?;
    let statements: Vec<(StreamId, [u8; SignedCompaction::LEN])> = proofs
        .statements
        .iter()
        .map(|s| (s.statement.stream, s.to_bytes()))
        .collect();
    put_floor_entries(out, tag::STATEMENTS, "statement", &statements, floor)?;
    let hashes: Vec<(StreamId, [u8; FLOOR_HASH_ENTRY_BYTES])> = proofs
        .hashes
        .iter()
        .map(|&(stream, hash)| {
            let mut entry = [0u8; FLOOR_HASH_ENTRY_BYTES];
            entry[..8].copy_from_slice(&stream.get().to_le_bytes());
            entry[8..].copy_from_slice(hash.as_bytes());
            (stream, entry)
        })
        .collect();
    put_floor_entries(out, tag::FLOOR_HASHES, "floor hash", &hashes, floor)
}

/// Appends a section of fixed-size entries, one per stream of `floor` at
/// most, streams strictly ascending: its tag, length, count and entries.
fn put_floor_entries<const N: usize>(
    out: &mut Vec<u8>,
    tag: u64,
    what: &str,
    entries: &[(StreamId, [u8; N])],
    floor: &VersionVector,
) -> Result<(), FrameError> {
    if entries.is_empty() {
        return Ok(());
    }
    let refuse = |detail: String| FrameError::Encode {
        kind: "delta",
        detail,
    };
    if let Some(pair) = entries.windows(2).find(|pair| pair[1].0 <= pair[0].0) {
        return Err(refuse(format!(
            "the {what} of stream {} follows the {what} of stream {}: one per stream, \
             streams strictly ascending",
            pair[1].0, pair[0].0
        )));
    }
    if let Some((stream, _)) = entries.iter().find(|(stream, _)| floor.get(*stream) == 0) {
        return Err(refuse(format!(
            "a {what} of stream {stream}, which the delta's floor does not name"
        )));
    }
    let mut body = Vec::with_capacity(5 + entries.len() * N);
    put_varint(&mut body, entries.len() as u64);
    for (_, entry) in entries {
        body.extend_from_slice(entry);
    }
    put_varint(out, tag);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(&body);
    Ok(())
}

/// The seals section, if there are seals (see [`put_sections`]).
fn put_seals(out: &mut Vec<u8>, seals: &[RunSeal], runs: usize) -> Result<(), FrameError> {
    if seals.is_empty() {
        return Ok(());
    }
    let refuse = |detail: String| FrameError::Encode {
        kind: "delta",
        detail,
    };
    if seals.len() > runs {
        return Err(refuse(format!(
            "{} seals for {runs} runs: at most one seal per run",
            seals.len()
        )));
    }
    if let Some(pair) = seals
        .windows(2)
        .find(|pair| pair[1].seal.stream <= pair[0].seal.stream)
    {
        return Err(refuse(format!(
            "the seal of stream {} follows the seal of stream {}: one seal per stream, \
             streams strictly ascending",
            pair[1].seal.stream, pair[0].seal.stream
        )));
    }
    let mut body = Vec::with_capacity(10 + seals.len() * SEAL_ENTRY_BYTES_MAX);
    put_varint(&mut body, seals.len() as u64);
    for run_seal in seals {
        body.extend_from_slice(&run_seal.key.to_bytes());
        body.extend_from_slice(&run_seal.seal.to_bytes());
        match run_seal.base {
            None => body.push(0),
            Some(base) => {
                body.push(1);
                body.extend_from_slice(base.as_bytes());
            }
        }
    }
    put_varint(out, tag::SEALS);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(&body);
    Ok(())
}

/// Reads a delta's sections, the bytes after its payloads to the end of
/// the frame, for a delta of `runs` runs whose floor is `floor`: its seals
/// what backs its floors, and the proofs of forks it passes on (none of
/// a section it does not carry).
/// Sections go tags strictly ascending, each within the bytes left; one
/// of a tag this side does not know is skipped.
pub(super) fn read_sections(
    bytes: &[u8],
    runs: usize,
    floor: &VersionVector,
) -> Result<Sections, FrameError> {
    let mut reader = Reader { bytes };
    let mut previous: Option<u64> = None;
    let mut seals = Vec::new();
    let mut proofs = FloorProofs::default();
    let mut forks = Vec::new();
    while !reader.bytes.is_empty() {
        let tag = reader.varint("section tag")?;
        if let Some(previous) = previous.filter(|&previous| tag <= previous) {
            return Err(Reader::malformed(
                "sections",
                &format!("section {tag} follows section {previous}: tags strictly ascending"),
            ));
        }
        previous = Some(tag);
        let len = reader.varint("section length")?;
        let body = take(&mut reader, len, "section")?;
        match tag {
            tag::SEALS => seals = read_seals(body, runs)?,
            tag::STATEMENTS => {
                let entries = read_floor_entries::<{ SignedCompaction::LEN }>(
                    body,
                    "statements",
                    floor,
                    |entry| u64_le(&entry[..8]),
                )?;
                proofs.statements = entries
                    .iter()
                    .map(|entry| {
                        SignedCompaction::from_bytes(entry).map_err(|error| {
                            Reader::malformed(
                                "statements",
                                &format!("stream {}: {error}", StreamId::new(u64_le(&entry[..8]))),
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?;
            }
            tag::FLOOR_HASHES => {
                let entries = read_floor_entries::<FLOOR_HASH_ENTRY_BYTES>(
                    body,
                    "floor hashes",
                    floor,
                    |entry| u64_le(&entry[..8]),
                )?;
                proofs.hashes = entries
                    .iter()
                    .map(|entry| {
                        let mut hash = [0u8; 32];
                        hash.copy_from_slice(&entry[8..]);
                        (
                            StreamId::new(u64_le(&entry[..8])),
                            ChainHash::from_bytes(hash),
                        )
                    })
                    .collect();
            }
            tag::FORKS => forks = read_forks(body)?,
            // Any other tag: a later version's addition, which this side
            // may ignore (skipped by its length, nothing decoded of it).
            _ => {}
        }
    }
    Ok((seals, proofs, forks))
}

fn u64_le(bytes: &[u8]) -> u64 {
    let mut le = [0u8; 8];
    le.copy_from_slice(bytes);
    u64::from_le_bytes(le)
}

/// A section of fixed-size entries, one per stream of the delta's `floor`
/// at most: its count (1 to the floor's streams, and what the body holds,
/// checked before anything is allocated), then that many entries of `N`
/// bytes, their streams (`stream_of`) strictly ascending and each named by
/// the floor, filling the body exactly.
fn read_floor_entries<'a, const N: usize>(
    body: &'a [u8],
    section: &'static str,
    floor: &VersionVector,
    stream_of: impl Fn(&[u8]) -> u64,
) -> Result<Vec<&'a [u8]>, FrameError> {
    let mut reader = Reader { bytes: body };
    let count = reader.varint(section)?;
    if count == 0 || count > floor.len() as u64 {
        return Err(Reader::malformed(
            section,
            &format!(
                "{count} entries for a floor of {} streams: one per stream of the floor at most, \
                 and a section holds one or more",
                floor.len()
            ),
        ));
    }
    if count as usize * N != reader.bytes.len() {
        return Err(Reader::malformed(
            section,
            &format!(
                "{count} entries of {N} bytes in a body of {} bytes after its count",
                reader.bytes.len()
            ),
        ));
    }
    let entries: Vec<&[u8]> = reader.bytes.chunks_exact(N).collect();
    let mut previous: Option<u64> = None;
    for entry in &entries {
        let stream = stream_of(entry);
        if previous.is_some_and(|previous| stream <= previous) {
            return Err(Reader::malformed(
                section,
                &format!(
                    "stream {} follows stream {}: streams strictly ascending",
                    StreamId::new(stream),
                    StreamId::new(previous.unwrap_or(0))
                ),
            ));
        }
        if floor.get(StreamId::new(stream)) == 0 {
            return Err(Reader::malformed(
                section,
                &format!(
                    "stream {}, which the delta's floor does not name",
                    StreamId::new(stream)
                ),
            ));
        }
        previous = Some(stream);
    }
    Ok(entries)
}

/// What a delta's sections carry: its seals, what backs its floors, and
/// the fork proofs.
pub(super) type Sections = (Vec<RunSeal>, FloorProofs, Vec<ForkProof>);

/// The next `len` bytes of `reader`; `field` names the count in the error
/// when fewer are left.
fn take<'a>(
    reader: &mut Reader<'a>,
    len: u64,
    field: &'static str,
) -> Result<&'a [u8], FrameError> {
    let bytes_left = reader.bytes.len();
    if len > bytes_left as u64 {
        return Err(FrameError::CountAboveBytes {
            field,
            count: len,
            bytes_left,
        });
    }
    let (taken, rest) = reader.bytes.split_at(len as usize);
    reader.bytes = rest;
    Ok(taken)
}

/// A seals section's body: its count (1 to the delta's runs, and what the
/// body can hold, checked before anything is allocated), then that many
/// entries, streams strictly ascending, filling the body exactly.
fn read_seals(body: &[u8], runs: usize) -> Result<Vec<RunSeal>, FrameError> {
    let mut reader = Reader { bytes: body };
    let count = reader.varint("seal count")?;
    if count == 0 || count > runs as u64 {
        return Err(Reader::malformed(
            "seals",
            &format!("{count} seals for {runs} runs: one seal per run at most, and a section holds one or more"),
        ));
    }
    let bytes_left = reader.bytes.len();
    if count.saturating_mul(SEAL_ENTRY_BYTES_MIN as u64) > bytes_left as u64 {
        return Err(FrameError::CountAboveBytes {
            field: "seals",
            count,
            bytes_left,
        });
    }
    // At most the delta's runs (8,192), and a seal for every 145 bytes.
    let mut seals: Vec<RunSeal> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let run_seal = read_seal(&mut reader)?;
        if let Some(previous) = seals.last() {
            if run_seal.seal.stream <= previous.seal.stream {
                return Err(FrameError::BadSeal {
                    stream: run_seal.seal.stream,
                    detail: format!(
                        "it follows the seal of stream {}: one seal per stream, streams \
                         strictly ascending",
                        previous.seal.stream
                    ),
                });
            }
        }
        seals.push(run_seal);
    }
    if !reader.bytes.is_empty() {
        return Err(Reader::malformed(
            "seals",
            &format!("{} bytes after the last seal", reader.bytes.len()),
        ));
    }
    Ok(seals)
}

/// One seal entry: the key, the seal, the base's flag (0 or 1) and the
/// base after a 1. A key that is not a valid writer key is
/// [`FrameError::BadSeal`].
fn read_seal(reader: &mut Reader<'_>) -> Result<RunSeal, FrameError> {
    let key = take(reader, WriterPublicKey::LEN as u64, "seal key")?;
    let seal = take(reader, Seal::LEN as u64, "seal")?;
    let seal =
        Seal::from_bytes(seal).map_err(|error| Reader::malformed("seal", &error.to_string()))?;
    let bad = |detail: String| FrameError::BadSeal {
        stream: seal.stream,
        detail,
    };
    let key = WriterPublicKey::from_bytes(key).map_err(|error| bad(error.to_string()))?;
    let base = match take(reader, 1, "seal base")?[0] {
        0 => None,
        1 => {
            let base = take(reader, 32, "seal base")?;
            let mut hash = [0u8; 32];
            hash.copy_from_slice(base);
            Some(ChainHash::from_bytes(hash))
        }
        flag => return Err(bad(format!("a base flag of {flag}: 0 (no base) or 1"))),
    };
    Ok(RunSeal { key, seal, base })
}

#[cfg(test)]
mod tests {
    // The sections' structure: seals round trip with and without a base,
    // in both representations; an unknown section is skipped; and each
    // way a section or a seal entry breaks the layout comes back as its
    // typed error, the counts refused before anything is read for them.
    use bytes::Bytes;
    use meshlog_cursor::{StreamId, VersionVector};
    use meshlog_replica::{Delta, Event, WriterKey};

    use super::*;
    use crate::frame::tests::sealed_example;
    use crate::frame::{decode_incoming, decode_payload, encode_payload, Frame, Incoming};
    use crate::FRAME_BYTES_MAX;

    fn key(byte: u8) -> WriterKey {
        WriterKey::from_bytes([byte; 32])
    }

    /// Two writers' runs of two events, both sealed, the second with a
    /// base; their streams ascending.
    fn two_sealed_runs() -> Delta {
        let mut keys = [key(1), key(2)];
        keys.sort_by_key(|key| key.stream());
        let mut events = Vec::new();
        let mut seals = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let first = 1 + 3 * i as u64;
            let run: Vec<Event> = (first..first + 2)
                .map(|seq| Event {
                    stream: key.stream(),
                    seq,
                    lamport: seq,
                    time_ms: 1000 + seq,
                    payload: Bytes::from(vec![seq as u8; 3]),
                })
                .collect();
            let base = (i == 1).then(|| ChainHash::from_bytes([9; 32]));
            let head = base.unwrap_or(ChainHash::GENESIS).extend(&run);
            seals.push(RunSeal {
                key: key.public(),
                seal: Seal::sign(key, first + 1, head),
                base,
            });
            events.extend(run);
        }
        let floor: VersionVector = [(keys[1].stream(), 3)].into_iter().collect();
        Delta {
            floor_proofs: Default::default(),
            floor,
            events,
            seals,
        }
    }

    /// The payload of `delta` as frame 1, and where its sections start.
    fn payload_and_sections(delta: &Delta) -> (Vec<u8>, usize) {
        let payload = encode_payload(&Frame::delta(1, delta.clone())).unwrap();
        let unsealed = Delta {
            seals: Vec::new(),
            ..delta.clone()
        };
        let at = encode_payload(&Frame::delta(1, unsealed)).unwrap().len();
        (payload, at)
    }

    #[test]
    fn seals_round_trip_with_and_without_a_base_in_both_representations() {
        let delta = two_sealed_runs();
        let frame = Frame::delta(1, delta.clone());
        let payload = encode_payload(&frame).unwrap();
        assert_eq!(decode_payload(&payload), Ok(frame));
        let Ok(Incoming::Delta { number, columns }) = decode_incoming(&payload, FRAME_BYTES_MAX)
        else {
            panic!("a delta")
        };
        assert_eq!(number, 1);
        assert_eq!(columns.seals, delta.seals);
        assert_eq!(columns.to_delta(), delta);
        // The columns encode to the same bytes.
        let bytes =
            crate::frame::encode_delta_columns_limited(1, &columns, FRAME_BYTES_MAX).unwrap();
        assert_eq!(bytes[4..], payload[..]);
        // Two entries, one with a base: 1 + 145 + 177 bytes of body.
        let (_, at) = payload_and_sections(&delta);
        assert_eq!(payload[at..at + 3], [0, 0xc3, 0x02]);
        assert_eq!(payload.len() - at, 3 + 323);
    }

    #[test]
    fn a_section_of_an_unknown_tag_is_skipped_by_its_length() {
        let delta = two_sealed_runs();
        let (mut payload, _) = payload_and_sections(&delta);
        // A later version's section, after the seals: tag 7, 3 bytes.
        payload.extend([7, 3, 0xff, 0x00, 0x80]);
        assert_eq!(decode_payload(&payload), Ok(Frame::delta(1, delta.clone())));
        // Alone, after a delta without seals: the delta decodes unsealed.
        let unsealed = Delta {
            seals: Vec::new(),
            ..delta
        };
        let mut payload = encode_payload(&Frame::delta(1, unsealed.clone())).unwrap();
        payload.extend([9, 0]);
        assert_eq!(decode_payload(&payload), Ok(Frame::delta(1, unsealed)));
    }

    #[test]
    fn sections_out_of_order_or_longer_than_the_frame_are_refused() {
        let (payload, _) = payload_and_sections(&two_sealed_runs());
        let mut twice = payload.clone();
        twice.extend([0, 0]);
        let err = decode_payload(&twice).unwrap_err();
        assert!(
            matches!(&err, FrameError::Malformed { detail, .. } if detail.contains("section 0 follows section 0")),
            "{err}"
        );
        let mut long = payload.clone();
        long.extend([5, 3, 1]);
        assert_eq!(
            decode_payload(&long),
            Err(FrameError::CountAboveBytes {
                field: "section",
                count: 3,
                bytes_left: 1
            })
        );
    }

    /// The payload of `two_sealed_runs` with its seals section's body
    /// replaced by `body`.
    fn with_seals_body(body: &[u8]) -> Vec<u8> {
        let (mut payload, at) = payload_and_sections(&two_sealed_runs());
        payload.truncate(at);
        payload.push(0);
        put_varint(&mut payload, body.len() as u64);
        payload.extend_from_slice(body);
        payload
    }

    #[test]
    fn seal_counts_are_checked_before_the_entries_are_read() {
        let (payload, at) = payload_and_sections(&two_sealed_runs());
        let body = &payload[at + 3..];
        // No seal, and more seals than the delta's two runs.
        for count in [0u8, 3] {
            let mut changed = body.to_vec();
            changed[0] = count;
            let err = decode_payload(&with_seals_body(&changed)).unwrap_err();
            assert!(
                matches!(&err, FrameError::Malformed { detail, .. } if detail.contains(&format!("{count} seals for 2 runs"))),
                "{err}"
            );
        }
        // Two seals announced in the bytes of one.
        assert_eq!(
            decode_payload(&with_seals_body(&body[..1 + 177])),
            Err(FrameError::CountAboveBytes {
                field: "seals",
                count: 2,
                bytes_left: 177
            })
        );
        // Bytes after the last seal.
        let mut longer = body.to_vec();
        longer.push(0);
        let err = decode_payload(&with_seals_body(&longer)).unwrap_err();
        assert!(
            matches!(&err, FrameError::Malformed { detail, .. } if detail.contains("1 bytes after the last seal")),
            "{err}"
        );
    }

    #[test]
    fn a_bad_key_a_bad_base_flag_and_seals_out_of_order_are_typed() {
        let delta = two_sealed_runs();
        let (payload, at) = payload_and_sections(&delta);
        let body = &payload[at + 3..];
        let first = delta.seals[0].seal.stream;
        // The first key's bytes: the identity point, of small order.
        let mut small = body.to_vec();
        small[1..33].copy_from_slice(&{
            let mut identity = [0u8; 32];
            identity[0] = 1;
            identity
        });
        let err = decode_payload(&with_seals_body(&small)).unwrap_err();
        assert!(
            matches!(err, FrameError::BadSeal { stream, .. } if stream == first),
            "{err}"
        );
        // The first entry's base flag (after the key and the seal).
        let mut flag = body.to_vec();
        flag[1 + 144] = 2;
        let err = decode_payload(&with_seals_body(&flag)).unwrap_err();
        assert!(
            matches!(&err, FrameError::BadSeal { stream, detail } if *stream == first && detail.contains("base flag of 2")),
            "{err}"
        );
        // The entries swapped: the second stream first.
        let mut swapped = vec![2];
        swapped.extend_from_slice(&body[1 + 145..]);
        swapped.extend_from_slice(&body[1..1 + 145]);
        let err = decode_payload(&with_seals_body(&swapped)).unwrap_err();
        assert!(
            matches!(&err, FrameError::BadSeal { stream, .. } if *stream == first),
            "{err}"
        );
    }

    #[test]
    fn the_encoder_refuses_seals_a_receiver_would() {
        let delta = two_sealed_runs();
        let mut swapped = delta.clone();
        swapped.seals.reverse();
        assert!(matches!(
            encode_payload(&Frame::delta(1, swapped)),
            Err(FrameError::Encode { .. })
        ));
        let mut more = delta.clone();
        more.events
            .retain(|event| event.stream == delta.seals[0].seal.stream);
        assert!(matches!(
            encode_payload(&Frame::delta(1, more)),
            Err(FrameError::Encode { detail, .. }) if detail.contains("2 seals for 1 runs")
        ));
    }

    #[test]
    fn the_doc_example_decodes_to_its_seal() {
        let Frame::Delta { delta, .. } = sealed_example() else {
            panic!()
        };
        let seal = delta.seals[0];
        assert_eq!(seal.seal.stream, StreamId::new(0x5e64_4dd2_17ae_e78b));
        seal.seal.verify(&seal.key).unwrap();
    }

    /// A delta whose floor names two writers (secrets 1 and 2, streams
    /// ascending), both with a statement and a hash, and one sealed run.
    fn floor_backed() -> Delta {
        let mut delta = two_sealed_runs();
        let mut keys = [key(1), key(2)];
        keys.sort_by_key(|key| key.stream());
        delta.floor = keys.iter().map(|key| (key.stream(), 3)).collect();
        // The run of the second writer starts at 4, after the floor.
        for (i, key) in keys.iter().enumerate() {
            let hash = ChainHash::from_bytes([i as u8 + 1; 32]);
            let statement = meshlog_replica::Compaction {
                stream: key.stream(),
                floor: 3,
                hash,
            };
            delta
                .floor_proofs
                .statements
                .push(statement.sign_by_writer(key));
            delta.floor_proofs.hashes.push((key.stream(), hash));
        }
        delta
    }

    #[test]
    fn statements_and_floor_hashes_round_trip_in_both_representations() {
        let delta = floor_backed();
        let frame = Frame::delta(1, delta.clone());
        let payload = encode_payload(&frame).unwrap();
        assert_eq!(decode_payload(&payload), Ok(frame));
        let Ok(Incoming::Delta { columns, .. }) = decode_incoming(&payload, FRAME_BYTES_MAX) else {
            panic!("a delta")
        };
        assert_eq!(columns.floor_proofs, delta.floor_proofs);
        let bytes =
            crate::frame::encode_delta_columns_limited(1, &columns, FRAME_BYTES_MAX).unwrap();
        assert_eq!(bytes[4..], payload[..]);
        // What the sync layer reserves for them covers them.
        let unbacked = Delta {
            floor_proofs: FloorProofs::default(),
            ..delta.clone()
        };
        let without = encode_payload(&Frame::delta(1, unbacked)).unwrap();
        assert!(payload.len() - without.len() <= floor_proofs_bytes_max(delta.floor.len()));
    }

    /// The payload of `delta` with its sections from tag 1 on replaced by
    /// `sections`.
    fn with_floor_sections(delta: &Delta, sections: &[u8]) -> Vec<u8> {
        let unbacked = Delta {
            floor_proofs: FloorProofs::default(),
            ..delta.clone()
        };
        let mut payload = encode_payload(&Frame::delta(1, unbacked)).unwrap();
        payload.extend_from_slice(sections);
        payload
    }

    #[test]
    fn floor_sections_that_break_their_layout_are_refused() {
        let delta = floor_backed();
        let [first, second] = [0, 1].map(|i| delta.floor_proofs.statements[i].to_bytes());
        let section = |tag: u8, count: u8, entries: &[&[u8]]| {
            let mut body = vec![count];
            for entry in entries {
                body.extend_from_slice(entry);
            }
            let mut out = vec![tag];
            put_varint(&mut out, body.len() as u64);
            out.extend(body);
            out
        };
        let malformed = |bytes: Vec<u8>, what: &str| {
            let err = decode_payload(&with_floor_sections(&delta, &bytes)).unwrap_err();
            assert!(
                matches!(&err, FrameError::Malformed { detail, .. } if detail.contains(what)),
                "{what}: {err}"
            );
        };
        malformed(section(1, 0, &[]), "a section holds one or more");
        malformed(
            section(1, 3, &[&first, &second, &first]),
            "one per stream of the floor at most",
        );
        malformed(
            section(1, 2, &[&first]),
            "2 entries of 144 bytes in a body of 144",
        );
        malformed(
            section(1, 2, &[&second, &first]),
            "streams strictly ascending",
        );
        let mut stranger = first;
        stranger[..8].copy_from_slice(&77u64.to_le_bytes());
        malformed(
            section(1, 1, &[&stranger]),
            "which the delta's floor does not name",
        );
        let mut bad_key = first;
        bad_key[48..80].copy_from_slice(&[0xff; 32]);
        malformed(section(1, 1, &[&bad_key]), "compaction signer");
        let mut hash = [0u8; 40];
        hash[..8].copy_from_slice(&first[..8]);
        malformed(
            section(2, 1, &[&hash[..39]]),
            "1 entries of 40 bytes in a body of 39",
        );
        // The encoder refuses what the decoder would.
        let mut unnamed = delta.clone();
        unnamed.floor = VersionVector::new();
        assert!(matches!(
            encode_payload(&Frame::delta(1, unnamed)),
            Err(FrameError::Encode { detail, .. }) if detail.contains("does not name")
        ));
        let mut swapped = delta.clone();
        swapped.floor_proofs.hashes.reverse();
        assert!(matches!(
            encode_payload(&Frame::delta(1, swapped)),
            Err(FrameError::Encode { detail, .. }) if detail.contains("strictly ascending")
        ));
    }

    #[test]
    fn the_doc_example_decodes_to_a_statement_that_verifies() {
        let Frame::Delta { delta, .. } = crate::frame::tests::statement_example() else {
            panic!()
        };
        let signed = delta.floor_proofs.statements[0];
        signed.verify(None, None).unwrap();
        assert_eq!(
            delta.floor_proofs.hashes,
            vec![(signed.statement.stream, signed.statement.hash)]
        );
    }
}
