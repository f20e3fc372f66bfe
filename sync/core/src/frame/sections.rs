//! A delta's sections (protocol 4): what follows its payloads, each a
//! tagged, length-bounded part (`docs/PROTOCOL.md`, "Delta sections").
//!
//! One section is known today, the **seals**: per stream at most one
//! writer's [`RunSeal`] over the delta's run of it, in the encodings of
//! `meshlog_replica::seal` (the key's 32 bytes, [`Seal::to_bytes`], the
//! optional base's 32). Later additions of signed streams (a compaction
//! statement, the chain hash at a floor: issue 29's next steps) are new
//! tags: a receiver skips a section whose tag it does not know, by its
//! length, so they need no new protocol version as long as an older
//! receiver may ignore them (it then behaves as it did before them). An
//! addition an older receiver must not ignore needs a new version.
//!
//! Only structure is judged here (counts, order, lengths, a key that is a
//! key): whether a seal vouches for its run, whether its key may sign for
//! its stream, is the replica's one acceptance path (`docs/SIGNING.md`).

use meshlog_replica::{ChainHash, ForkProof, RunSeal, Seal, WriterPublicKey};

use super::event_runs::{put_varint, Reader};
use super::FrameError;

/// Each known section's tag, the varint that opens it.
mod tag {
    /// The writers' seals over the delta's runs.
    pub const SEALS: u64 = 0;
    /// Proofs that writers forked their streams (`docs/SIGNING.md`,
    /// "Equivocation with valid signatures").
    pub const FORKS: u64 = 3;
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
/// has seals (an empty section is never written). Refuses seals a receiver
/// would: more than the delta's `runs`, or streams not strictly ascending
/// ([`FrameError::Encode`]).
pub(super) fn put_sections(
    out: &mut Vec<u8>,
    seals: &[RunSeal],
    runs: usize,
) -> Result<(), FrameError> {
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
/// the frame, for a delta of `runs` runs: its seals (none if it has no
/// seals section). Sections go tags strictly ascending, each within the
/// bytes left; one of a tag this side does not know is skipped.
pub(super) fn read_sections(bytes: &[u8], runs: usize) -> Result<Sections, FrameError> {
    let mut reader = Reader { bytes };
    let mut previous: Option<u64> = None;
    let mut seals = Vec::new();
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
        if tag == tag::SEALS {
            seals = read_seals(body, runs)?;
        } else if tag == tag::FORKS {
            forks = read_forks(body)?;
        }
        // Any other tag: a later version's addition, which this side may
        // ignore (skipped by its length, nothing decoded of it).
    }
    Ok((seals, forks))
}

/// What a delta's sections carry: its seals, and the fork proofs.
pub(super) type Sections = (Vec<RunSeal>, Vec<ForkProof>);

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
        payload.extend([1, 0]);
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
}
