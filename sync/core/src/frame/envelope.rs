//! The envelope: the length prefix around a payload, and a payload as a
//! whole (its kind varint, then its content).
//!
//! Two symmetric pairs are the entry points of the codec: [`encode`] and
//! [`decode`] take and give a whole frame, length prefix included (what a
//! byte stream carries), [`encode_payload`] and [`decode_payload`] the
//! payload alone (what a transport that frames messages itself carries, and
//! what `meshlog_sync::frame::FrameReader` hands out). They write and read
//! the kind, check a hello's protocol version before
//! anything else of it, check the vectors' counts before decoding, and hand
//! the content to the postcard-mapped types of `repr` or to the delta
//! event runs of `event_runs`. Kept apart from both so that what every
//! frame shares (prefix, kind, size limit) is read in one place, and each
//! codec only knows its own layout.

use meshlog_cursor::{CheckpointName, StreamId, VersionVector, CHECKPOINT_NAME_BYTES};
use meshlog_replica::{Delta, DeltaColumns};
use serde::Deserialize;

use super::event_runs::{decode_columns, decode_events, encode_columns, encode_events, put_varint};
use super::repr::{
    check_counts, CheckpointRepr, HelloAgainstRepr, HelloRepr, ReceiptRepr, RoutesRepr, VectorRepr,
};
use super::sections::{put_forks, put_sections, read_sections};
use super::{
    tag, CheckpointFrame, Frame, FrameError, Hello, HelloAgainst, MarksDiff, Receipt, Routes,
    DELTA_EVENTS_MAX, FRAME_BYTES_CEILING, FRAME_BYTES_MAX, LENGTH_PREFIX_BYTES, PROTOCOL_VERSION,
};
// Named by `decode`'s docs only.
#[cfg(doc)]
use meshlog_cursor::STREAMS_MAX;

/// Splits the first whole frame off `buf` (length prefix and payload).
///
/// Returns `Ok(None)` while `buf` holds less than a whole frame (read more),
/// `Ok(Some((payload, used)))` with the payload and the bytes it took with its
/// prefix, or [`FrameError::TooLarge`] as soon as the prefix announces more
/// than [`FRAME_BYTES_MAX`], before the payload is read.
pub fn split_frame(buf: &[u8]) -> Result<Option<(&[u8], usize)>, FrameError> {
    split_frame_limited(buf, FRAME_BYTES_MAX)
}

/// [`split_frame`] with a frame limit of `max` payload bytes instead of
/// [`FRAME_BYTES_MAX`]: what a side whose `frame_bytes_max` is raised reads
/// with.
pub fn split_frame_limited(buf: &[u8], max: usize) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(len) = peek_len(buf, max)? else {
        return Ok(None);
    };
    let used = LENGTH_PREFIX_BYTES + len;
    if buf.len() < used {
        return Ok(None);
    }
    Ok(Some((&buf[LENGTH_PREFIX_BYTES..used], used)))
}

/// The payload length announced by the prefix at the start of `buf`, checked
/// against the limit; `None` if the prefix is incomplete: what a reader of
/// a byte stream checks before it buffers a payload.
///
/// # Errors
///
/// [`FrameError::TooLarge`] for a length above `max`, before anything is
/// allocated for it.
pub fn peek_len(buf: &[u8], max: usize) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_PREFIX_BYTES) else {
        return Ok(None);
    };
    let mut bytes = [0u8; LENGTH_PREFIX_BYTES];
    bytes.copy_from_slice(prefix);
    let len = u32::from_le_bytes(bytes) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(Some(len))
}

/// Encodes a frame with its length prefix: the bytes [`decode`] takes.
///
/// Fails with [`FrameError::TooLarge`] if the payload would exceed
/// [`FRAME_BYTES_MAX`] (a delta built past the budget, say), with
/// [`FrameError::TooManyEvents`] for a delta of more than
/// [`DELTA_EVENTS_MAX`] events, and with [`FrameError::Encode`] for a delta
/// whose events break the model (per stream, seqs not contiguous in the
/// order given, or lamport stamps not rising from 1) or whose seals the
/// peer's decoder refuses (more than its runs, streams not strictly
/// ascending): nothing is sent that the peer would refuse.
///
/// A delta's events may come in any order across streams (a replica's
/// [`meshlog_replica::Replica::delta_for`] builds `(lamport, stream)`
/// order); per stream they must be in seq order. They are decoded grouped
/// by stream, streams ascending, each stream's in seq order.
///
/// ```
/// use bytes::Bytes;
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::{Delta, Event};
/// use meshlog_sync_core::frame::{self, Frame, LENGTH_PREFIX_BYTES};
///
/// let event = |stream, seq, lamport| Event {
///     stream: StreamId::new(stream),
///     seq,
///     lamport,
///     time_ms: 1_000 + lamport,
///     payload: Bytes::from_static(b"x"),
/// };
/// // Two writers' events, interleaved as a replica sends them.
/// let delta = Delta {
///     floor_proofs: Default::default(),
///     floor: VersionVector::new(),
///     events: vec![event(2, 1, 1), event(1, 4, 2), event(2, 2, 3), event(1, 5, 4)],
///     seals: Vec::new(),
/// };
/// let bytes = frame::encode(&Frame::delta(1, delta.clone()))?;
/// // They arrive grouped by stream.
/// let grouped = Delta {
///     floor_proofs: Default::default(),
///     floor: VersionVector::new(),
///     events: vec![event(1, 4, 2), event(1, 5, 4), event(2, 1, 1), event(2, 2, 3)],
///     seals: Vec::new(),
/// };
/// assert_eq!(frame::decode(&bytes)?, Frame::delta(1, grouped.clone()));
/// // The payload alone, for a transport that frames messages itself.
/// let payload = frame::encode_payload(&Frame::delta(1, delta))?;
/// assert_eq!(payload, bytes[LENGTH_PREFIX_BYTES..]);
/// assert_eq!(frame::decode_payload(&payload)?, Frame::delta(1, grouped));
/// # Ok::<(), meshlog_sync_core::FrameError>(())
/// ```
pub fn encode(frame: &Frame) -> Result<Vec<u8>, FrameError> {
    encode_limited(frame, FRAME_BYTES_MAX)
}

/// [`encode`] with a frame limit of `max` payload bytes instead of
/// [`FRAME_BYTES_MAX`] (clamped to [`FRAME_BYTES_CEILING`]): what a session
/// sends with once both sides' hellos allow larger frames.
pub fn encode_limited(frame: &Frame, max: usize) -> Result<Vec<u8>, FrameError> {
    let mut out = vec![0u8; LENGTH_PREFIX_BYTES];
    encode_into(frame, &mut out, max.min(FRAME_BYTES_CEILING))?;
    let len = out.len() - LENGTH_PREFIX_BYTES;
    // Cannot truncate: `encode_into` refuses more than FRAME_BYTES_CEILING,
    // which fits a u32.
    out[..LENGTH_PREFIX_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

/// Encodes a frame's payload alone, without the length prefix: the bytes
/// [`decode_payload`] takes. Fails as [`encode`] does.
pub fn encode_payload(frame: &Frame) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::new();
    encode_into(frame, &mut out, FRAME_BYTES_MAX)?;
    Ok(out)
}

/// Appends a frame's payload to `out`, refusing one above the limit.
///
/// The vectors and the hello's fields are written by hand in postcard's
/// layout (varints, a sequence as its count then its elements), which is
/// what `repr` reads back with postcard.
fn encode_into(frame: &Frame, out: &mut Vec<u8>, max: usize) -> Result<(), FrameError> {
    let start = out.len();
    put_frame(frame, out)?;
    let len = out.len() - start;
    if len > max {
        out.truncate(start);
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(())
}

/// Appends a frame's payload to `out`, its kind first, refusing one the
/// peer's decoder would refuse (the size limit is the caller's).
fn put_frame(frame: &Frame, out: &mut Vec<u8>) -> Result<(), FrameError> {
    match frame {
        Frame::Hello(hello) => put_hello(out, hello)?,
        Frame::Delta { number, delta } => {
            put_delta_head(out, *number, &delta.floor, delta.events.len())?;
            let runs = encode_events(&delta.events, out)?;
            put_sections(out, &delta.seals, runs, &delta.floor, &delta.floor_proofs)?;
        }
        Frame::Ack(receipt) => {
            put_varint(out, u64::from(tag::ACK));
            put_receipt(out, receipt, "ack")?;
        }
        Frame::Heartbeat(receipt) => {
            put_varint(out, u64::from(tag::HEARTBEAT));
            put_receipt(out, receipt, "heartbeat")?;
        }
        Frame::BareAck(received) => {
            if *received == 0 {
                return Err(FrameError::Encode {
                    kind: "bare ack",
                    detail: "received 0: a bare ack follows a delta".into(),
                });
            }
            put_varint(out, u64::from(tag::BARE_ACK));
            put_varint(out, *received);
        }
        Frame::Routes(routes) => put_routes(out, routes)?,
        Frame::Checkpoint(checkpoint) => put_checkpoint(out, checkpoint),
        Frame::CheckpointWant(name) => {
            put_varint(out, u64::from(tag::CHECKPOINT_WANT));
            out.extend_from_slice(name.as_bytes());
        }
        Frame::Statement(signed) => {
            put_varint(out, u64::from(tag::STATEMENT));
            out.extend_from_slice(&signed.to_bytes());
        }
        Frame::HelloAgainst(hello) => put_hello_against(out, hello)?,
    }
    Ok(())
}

/// Appends a hello: its kind, protocol, stream, marks, floor and frame
/// limit, refusing a limit below the one every peer takes.
fn put_hello(out: &mut Vec<u8>, hello: &Hello) -> Result<(), FrameError> {
    put_varint(out, u64::from(tag::HELLO));
    put_varint(out, u64::from(hello.protocol));
    put_varint(out, hello.stream.get());
    put_vector(out, &hello.marks);
    put_vector(out, &hello.floor);
    if (hello.frame_bytes_max as usize) < FRAME_BYTES_MAX {
        return Err(FrameError::Encode {
            kind: "hello",
            detail: format!(
                "a frame limit of {} bytes, below the {FRAME_BYTES_MAX} every peer takes",
                hello.frame_bytes_max
            ),
        });
    }
    put_varint(out, u64::from(hello.frame_bytes_max));
    Ok(())
}

/// Appends a hello against a checkpoint: its kind, protocol, stream,
/// checkpoint name, marks, unfolded streams, floor and frame limit;
/// refuses what the decoder refuses (a limit below the one every peer
/// takes, unfolded streams not strictly ascending or also in the marks).
fn put_hello_against(out: &mut Vec<u8>, hello: &HelloAgainst) -> Result<(), FrameError> {
    check_hello_against(hello).map_err(|detail| FrameError::Encode {
        kind: "hello against",
        detail,
    })?;
    put_varint(out, u64::from(tag::HELLO_AGAINST));
    put_varint(out, u64::from(hello.protocol));
    put_varint(out, hello.stream.get());
    out.extend_from_slice(hello.base.as_bytes());
    put_vector(out, &hello.marks);
    put_varint(out, hello.unfolded.len() as u64);
    for stream in &hello.unfolded {
        put_varint(out, stream.get());
    }
    put_vector(out, &hello.floor);
    put_varint(out, u64::from(hello.frame_bytes_max));
    Ok(())
}

/// What a hello against a checkpoint must be on both sides of the wire,
/// beside its vectors' own form: a frame limit every peer takes, and
/// unfolded streams within the limit, strictly ascending and none with a
/// mark above the checkpoint (the checks that need the checkpoint are
/// [`HelloAgainst::expand`]'s).
fn check_hello_against(hello: &HelloAgainst) -> Result<(), String> {
    if (hello.frame_bytes_max as usize) < FRAME_BYTES_MAX {
        return Err(format!(
            "a frame limit of {} bytes, below the {FRAME_BYTES_MAX} every peer takes",
            hello.frame_bytes_max
        ));
    }
    if hello.unfolded.len() > meshlog_cursor::STREAMS_MAX {
        return Err(format!(
            "{} unfolded streams exceed the limit of {}",
            hello.unfolded.len(),
            meshlog_cursor::STREAMS_MAX
        ));
    }
    if hello.unfolded.windows(2).any(|pair| pair[1] <= pair[0]) {
        return Err("unfolded streams are not strictly ascending".into());
    }
    if let Some(stream) = hello.unfolded.iter().find(|&&s| hello.marks.get(s) > 0) {
        return Err(format!(
            "stream {stream} is unfolded and has a mark above the checkpoint"
        ));
    }
    Ok(())
}

/// Appends a routes frame: its kind, number, then the quiet and the loud
/// streams, each as a count then the streams; refuses one
/// [`check_routes`] refuses, before anything is written.
fn put_routes(out: &mut Vec<u8>, routes: &Routes) -> Result<(), FrameError> {
    if let Err(detail) = check_routes(routes) {
        return Err(FrameError::Encode {
            kind: "routes",
            detail,
        });
    }
    put_varint(out, u64::from(tag::ROUTES));
    put_varint(out, routes.number);
    for streams in [&routes.quiet, &routes.loud] {
        put_varint(out, streams.len() as u64);
        for stream in streams {
            put_varint(out, stream.get());
        }
    }
    Ok(())
}

/// Appends a checkpoint frame: its kind, name, parent (0, or 1 and the
/// parent's name) and changes.
fn put_checkpoint(out: &mut Vec<u8>, checkpoint: &CheckpointFrame) {
    put_varint(out, u64::from(tag::CHECKPOINT));
    out.extend_from_slice(checkpoint.name.as_bytes());
    match checkpoint.parent {
        None => out.push(0),
        Some(parent) => {
            out.push(1);
            out.extend_from_slice(parent.as_bytes());
        }
    }
    put_vector(out, &checkpoint.changes);
}

/// Appends a delta frame's kind, number and floor, refusing number 0 and
/// more than [`DELTA_EVENTS_MAX`] events.
fn put_delta_head(
    out: &mut Vec<u8>,
    number: u64,
    floor: &VersionVector,
    count: usize,
) -> Result<(), FrameError> {
    if count > DELTA_EVENTS_MAX {
        return Err(FrameError::TooManyEvents {
            count,
            max: DELTA_EVENTS_MAX,
        });
    }
    if number == 0 {
        return Err(FrameError::Encode {
            kind: "delta",
            detail: "delta number 0: numbers start at 1".into(),
        });
    }
    put_varint(out, u64::from(tag::DELTA));
    put_varint(out, number);
    put_vector(out, floor);
    Ok(())
}

/// [`encode_limited`] of delta `number` holding `columns`, written from
/// the columns as they are. Without fork proofs, the bytes of
/// `Frame::delta(number, columns.to_delta())`; with them, those bytes
/// followed by a forks section (the length prefix counting it, the limit
/// applying to the whole), which a [`Delta`] has no place for
/// ([`DeltaColumns::to_delta`] drops the proofs).
pub(crate) fn encode_delta_columns_limited(
    number: u64,
    columns: &DeltaColumns,
    max: usize,
) -> Result<Vec<u8>, FrameError> {
    let max = max.min(FRAME_BYTES_CEILING);
    let mut out = vec![0u8; LENGTH_PREFIX_BYTES];
    put_delta_head(&mut out, number, &columns.floor, columns.len())?;
    let runs = encode_columns(columns, &mut out)?;
    put_sections(
        &mut out,
        &columns.seals,
        runs,
        &columns.floor,
        &columns.floor_proofs,
    )?;
    put_forks(&mut out, &columns.forks);
    let len = out.len() - LENGTH_PREFIX_BYTES;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    // Cannot truncate: at most FRAME_BYTES_CEILING, which fits a u32.
    out[..LENGTH_PREFIX_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

/// Appends a receipt: `received`, `seen`, the marks' `number`, `number -
/// base`, and the changes. Refuses one a receiver would: number 0, a base
/// above the number, changes with the base equal to the number.
fn put_receipt(out: &mut Vec<u8>, receipt: &Receipt, kind: &'static str) -> Result<(), FrameError> {
    let marks = &receipt.marks;
    if let Err(detail) = check_marks(marks.number, marks.base, &marks.changes) {
        return Err(FrameError::Encode { kind, detail });
    }
    put_varint(out, receipt.received);
    put_varint(out, receipt.seen);
    put_varint(out, marks.number);
    put_varint(out, marks.number - marks.base);
    put_vector(out, &marks.changes);
    Ok(())
}

/// What a [`MarksDiff`] must hold, on both sides of the wire.
fn check_marks(number: u64, base: u64, changes: &VersionVector) -> Result<(), String> {
    if number == 0 {
        return Err("marks number 0: numbers start at 1".into());
    }
    if base > number {
        return Err(format!("marks {number} differ from later marks {base}"));
    }
    if base == number && !changes.is_empty() {
        return Err(format!(
            "marks {number} are their own base but carry {} changes",
            changes.len()
        ));
    }
    Ok(())
}

/// What a routes frame must be: numbered from 1, each set within the limit
/// (its order and the limit are the decoder's checks too), no stream both
/// quiet and loud.
fn check_routes(routes: &Routes) -> Result<(), String> {
    if routes.number == 0 {
        return Err("routes number 0: numbers start at 1".into());
    }
    for (field, streams) in [("quiet", &routes.quiet), ("loud", &routes.loud)] {
        if streams.len() > meshlog_cursor::STREAMS_MAX {
            return Err(format!(
                "{} {field} streams exceed the limit of {}",
                streams.len(),
                meshlog_cursor::STREAMS_MAX
            ));
        }
        if streams.windows(2).any(|pair| pair[1] <= pair[0]) {
            return Err(format!("{field} streams are not strictly ascending"));
        }
    }
    if let Some(both) = routes
        .quiet
        .iter()
        .find(|stream| routes.loud.binary_search(stream).is_ok())
    {
        return Err(format!("stream {both} is both quiet and loud"));
    }
    Ok(())
}

/// Appends a version vector in postcard's layout of a sequence of
/// `(u64, u64)` pairs: the count, then each stream and seq.
fn put_vector(out: &mut Vec<u8>, vector: &VersionVector) {
    put_varint(out, vector.len() as u64);
    for (stream, seq) in vector.iter() {
        put_varint(out, stream.get());
        put_varint(out, seq);
    }
}

/// Decodes one whole frame, length prefix included: the bytes [`encode`]
/// gives, exactly.
///
/// A prefix above [`FRAME_BYTES_MAX`] is [`FrameError::TooLarge`] (checked
/// first), fewer bytes than the prefix announces [`FrameError::Truncated`],
/// and bytes after the payload [`FrameError::TrailingBytes`]; the payload
/// is then decoded as [`decode_payload`] does. A byte stream of frames back
/// to back is cut with [`split_frame`] (or read with
/// `meshlog_sync::frame::FrameReader`) instead.
pub fn decode(bytes: &[u8]) -> Result<Frame, FrameError> {
    match split_frame(bytes)? {
        Some((payload, used)) => {
            if used < bytes.len() {
                return Err(FrameError::TrailingBytes {
                    kind: "frame",
                    len: bytes.len() - used,
                });
            }
            decode_payload(payload)
        }
        None => Err(FrameError::Truncated {
            len: bytes.len(),
            needed: match peek_len(bytes, FRAME_BYTES_MAX)? {
                Some(len) => LENGTH_PREFIX_BYTES + len,
                None => LENGTH_PREFIX_BYTES,
            },
        }),
    }
}

/// Decodes one frame's payload, without its length prefix: the bytes
/// [`encode_payload`] gives.
///
/// Total: any bytes give a frame or a typed error. A hello is checked for
/// its protocol version before the rest of it is read, so a peer of another
/// version gets [`FrameError::ProtocolVersion`], not a decoding error. The
/// counts the payload announces are checked before their elements are
/// decoded: a delta of more than [`DELTA_EVENTS_MAX`] events is
/// [`FrameError::TooManyEvents`], a count the bytes left cannot hold
/// [`FrameError::CountAboveBytes`], a vector of more than [`STREAMS_MAX`]
/// streams [`FrameError::BadVector`].
///
/// A delta's events come out grouped by stream, streams ascending, each
/// stream's in seq order, whatever order the sender's delta held them in.
pub fn decode_payload(payload: &[u8]) -> Result<Frame, FrameError> {
    decode_payload_limited(payload, FRAME_BYTES_MAX)
}

/// [`decode_payload`] with a frame limit of `max` payload bytes instead of
/// [`FRAME_BYTES_MAX`]: what a side whose `frame_bytes_max` is raised
/// decodes with.
pub fn decode_payload_limited(payload: &[u8], max: usize) -> Result<Frame, FrameError> {
    Ok(match decode_any(payload, max, false)? {
        Incoming::Frame(frame) => frame,
        // (Not made when asked for events.)
        Incoming::Delta { number, columns } => Frame::Delta {
            number,
            delta: columns.to_delta(),
        },
    })
}

/// A received frame as the protocol takes it: a delta in columns, as it
/// was written (no [`meshlog_replica::Event`] per event), any other as a
/// [`Frame`].
#[derive(Debug)]
// One per received frame, handed straight on: boxing the delta would cost
// an allocation a frame for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Incoming {
    /// Any frame but a delta.
    Frame(Frame),
    /// A delta, its events left in columns.
    Delta {
        /// The delta's number.
        number: u64,
        /// Its floor and events, as written.
        columns: DeltaColumns,
    },
}

impl Incoming {
    /// The frame's kind, as [`Frame::kind`] names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Incoming::Frame(frame) => frame.kind(),
            Incoming::Delta { .. } => "delta",
        }
    }
}

/// [`decode_payload_limited`], a delta left in columns: what the protocol
/// core decodes a received payload with.
///
/// # Errors
///
/// As [`decode_payload_limited`].
pub fn decode_incoming(payload: &[u8], max: usize) -> Result<Incoming, FrameError> {
    decode_any(payload, max, true)
}

/// [`decode_payload_limited`], a delta's events decoded in `columns` or as
/// events.
fn decode_any(payload: &[u8], max: usize, columns: bool) -> Result<Incoming, FrameError> {
    let (tag, kind, body) = decode_header(payload, max)?;
    Ok(Incoming::Frame(match tag {
        tag::HELLO => decode_hello(body, kind)?,
        tag::DELTA => return decode_delta(body, kind, columns),
        tag::ACK => Frame::Ack(take_all::<ReceiptRepr>(body, kind)?.into_receipt(kind)?),
        tag::BARE_ACK => {
            let received: u64 = take_all(body, kind)?;
            if received == 0 {
                return Err(FrameError::Malformed {
                    kind,
                    detail: "received 0: a bare ack follows a delta".into(),
                });
            }
            Frame::BareAck(received)
        }
        tag::ROUTES => {
            let repr: RoutesRepr = take_all(body, kind)?;
            let routes = Routes {
                number: repr.number,
                quiet: repr.quiet.into_streams(kind, "quiet")?,
                loud: repr.loud.into_streams(kind, "loud")?,
            };
            check_routes(&routes).map_err(|detail| FrameError::Malformed { kind, detail })?;
            Frame::Routes(routes)
        }
        tag::CHECKPOINT => {
            let repr: CheckpointRepr = take_all(body, kind)?;
            Frame::Checkpoint(CheckpointFrame {
                name: CheckpointName::from_bytes(repr.name),
                parent: repr.parent.map(CheckpointName::from_bytes),
                changes: repr.changes.into_vector(kind, "changes")?,
            })
        }
        tag::CHECKPOINT_WANT => {
            Frame::CheckpointWant(CheckpointName::from_bytes(take_all::<
                [u8; CHECKPOINT_NAME_BYTES],
            >(body, kind)?))
        }
        tag::STATEMENT => Frame::Statement(decode_statement(body, kind)?),
        tag::HELLO_AGAINST => decode_hello_against(body, kind)?,
        _ => Frame::Heartbeat(take_all::<ReceiptRepr>(body, kind)?.into_receipt(kind)?),
    }))
}

/// A payload's kind, checked before its body is decoded: not empty, within
/// `max`, a known kind, a hello of our version, and every count it
/// announces within its limit. The tag, the kind's name and the body.
fn decode_header(payload: &[u8], max: usize) -> Result<(u32, &'static str, &[u8]), FrameError> {
    if payload.is_empty() {
        return Err(FrameError::Empty);
    }
    if payload.len() > max {
        return Err(FrameError::TooLarge {
            len: payload.len(),
            max,
        });
    }
    let (tag, body) = postcard::take_from_bytes::<u32>(payload).map_err(malformed("frame"))?;
    let kind = match tag {
        tag::HELLO => "hello",
        tag::DELTA => "delta",
        tag::ACK => "ack",
        tag::HEARTBEAT => "heartbeat",
        tag::ROUTES => "routes",
        tag::BARE_ACK => "bare ack",
        tag::CHECKPOINT => "checkpoint",
        tag::CHECKPOINT_WANT => "checkpoint want",
        tag::STATEMENT => "statement",
        tag::HELLO_AGAINST => "hello against",
        _ => {
            return Err(FrameError::UnknownKind {
                tag,
                ours: PROTOCOL_VERSION,
            })
        }
    };
    if tag == tag::HELLO || tag == tag::HELLO_AGAINST {
        let (protocol, _) = postcard::take_from_bytes::<u16>(body).map_err(malformed(kind))?;
        if protocol != PROTOCOL_VERSION {
            return Err(FrameError::ProtocolVersion {
                theirs: protocol,
                ours: PROTOCOL_VERSION,
            });
        }
    }
    check_counts(tag, kind, payload)?;
    Ok((tag, kind, body))
}

/// A statement frame's body: exactly one `SignedCompaction` in its
/// 144 bytes, its signer a valid writer key (the signature is the
/// replica's to verify).
fn decode_statement(
    body: &[u8],
    kind: &'static str,
) -> Result<meshlog_replica::SignedCompaction, FrameError> {
    let len = meshlog_replica::SignedCompaction::LEN;
    if body.len() > len {
        return Err(FrameError::TrailingBytes {
            kind,
            len: body.len() - len,
        });
    }
    meshlog_replica::SignedCompaction::from_bytes(body).map_err(|error| FrameError::Malformed {
        kind,
        detail: error.to_string(),
    })
}

/// A postcard error in a frame of `kind`, as a [`FrameError::Malformed`].
fn malformed(kind: &'static str) -> impl Fn(postcard::Error) -> FrameError {
    move |error: postcard::Error| FrameError::Malformed {
        kind,
        detail: error.to_string(),
    }
}

/// The whole of `bytes` as one `T`.
fn take_all<'a, T: Deserialize<'a>>(bytes: &'a [u8], kind: &'static str) -> Result<T, FrameError> {
    let (value, rest) = postcard::take_from_bytes::<T>(bytes).map_err(malformed(kind))?;
    if !rest.is_empty() {
        return Err(FrameError::TrailingBytes {
            kind,
            len: rest.len(),
        });
    }
    Ok(value)
}

/// A hello's body, its frame limit at least the one every peer takes.
fn decode_hello(body: &[u8], kind: &'static str) -> Result<Frame, FrameError> {
    let hello: HelloRepr = take_all(body, kind)?;
    if (hello.frame_bytes_max as usize) < FRAME_BYTES_MAX {
        return Err(FrameError::Malformed {
            kind,
            detail: format!(
                "a frame limit of {} bytes, below the {FRAME_BYTES_MAX} every peer takes",
                hello.frame_bytes_max
            ),
        });
    }
    Ok(Frame::Hello(Hello {
        protocol: hello.protocol,
        stream: StreamId::new(hello.stream),
        marks: hello.marks.into_vector(kind, "marks")?,
        floor: hello.floor.into_vector(kind, "floor")?,
        frame_bytes_max: hello.frame_bytes_max,
    }))
}

/// A hello against a checkpoint's body: its vectors canonical, and what
/// [`check_hello_against`] checks.
fn decode_hello_against(body: &[u8], kind: &'static str) -> Result<Frame, FrameError> {
    let repr: HelloAgainstRepr = take_all(body, kind)?;
    let hello = HelloAgainst {
        protocol: repr.protocol,
        stream: StreamId::new(repr.stream),
        frame_bytes_max: repr.frame_bytes_max,
        base: CheckpointName::from_bytes(repr.base),
        marks: repr.marks.into_vector(kind, "marks")?,
        unfolded: repr.unfolded.into_streams(kind, "unfolded")?,
        floor: repr.floor.into_vector(kind, "floor")?,
    };
    check_hello_against(&hello).map_err(|detail| FrameError::Malformed { kind, detail })?;
    Ok(Frame::HelloAgainst(hello))
}

/// A delta's body: its number, its floor, and its events in `columns` or
/// as events.
fn decode_delta(body: &[u8], kind: &'static str, columns: bool) -> Result<Incoming, FrameError> {
    let (number, rest) = postcard::take_from_bytes::<u64>(body).map_err(malformed(kind))?;
    if number == 0 {
        return Err(FrameError::Malformed {
            kind,
            detail: "delta number 0: numbers start at 1".into(),
        });
    }
    let (floor, events) = postcard::take_from_bytes::<VectorRepr>(rest).map_err(malformed(kind))?;
    let floor = floor.into_vector(kind, "floor")?;
    if !columns {
        // A delta as events carries no proofs of forks (`Delta` has no
        // place for them): a session decodes deltas in columns.
        let sections = |rest: &[u8], runs| read_sections(rest, runs, &floor);
        let (events, (seals, floor_proofs, _forks)) = decode_events(events, sections)?;
        return Ok(Incoming::Frame(Frame::Delta {
            number,
            delta: Delta {
                floor_proofs,
                floor,
                events,
                seals,
            },
        }));
    }
    let sections = |rest: &[u8], runs| read_sections(rest, runs, &floor);
    let (mut columns, (seals, floor_proofs, forks)) = decode_columns(events, sections)?;
    columns.floor = floor;
    columns.seals = seals;
    columns.floor_proofs = floor_proofs;
    columns.forks = forks;
    Ok(Incoming::Delta { number, columns })
}

impl ReceiptRepr {
    fn into_receipt(self, kind: &'static str) -> Result<Receipt, FrameError> {
        let changes = self.changes.into_vector(kind, "changes")?;
        let base = self
            .number
            .checked_sub(self.back)
            .ok_or_else(|| FrameError::Malformed {
                kind,
                detail: format!(
                    "marks {} differ from marks {} numbers back, below 0",
                    self.number, self.back
                ),
            })?;
        check_marks(self.number, base, &changes)
            .map_err(|detail| FrameError::Malformed { kind, detail })?;
        Ok(Receipt {
            received: self.received,
            seen: self.seen,
            marks: MarksDiff {
                number: self.number,
                base,
                changes,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    // The envelope's own checks: the kind and version open every payload,
    // a prefix above the limit is refused before its payload arrives, and
    // an unknown kind, an empty or overlong payload, another version or an
    // announced count too large come back as typed errors.
    use super::*;
    use crate::frame::tests::sample_frames;
    use crate::frame::{MarksDiff, Receipt};
    use crate::frame::{VersionVector, DELTA_EVENTS_MAX, FRAME_BYTES_MAX};

    #[test]
    fn the_first_payload_byte_is_the_kind_and_a_hello_starts_with_its_version() {
        let bytes = encode(&sample_frames()[0]).unwrap();
        assert_eq!(bytes[4], 0);
        assert_eq!(bytes[5], PROTOCOL_VERSION as u8);
        let ack = encode(&Frame::Ack(Receipt {
            received: 0,
            seen: 0,
            marks: MarksDiff {
                number: 1,
                base: 0,
                changes: VersionVector::new(),
            },
        }))
        .unwrap();
        assert_eq!(ack, [6, 0, 0, 0, 2, 0, 0, 1, 1, 0]);
    }

    #[test]
    fn a_prefix_above_the_limit_is_refused_before_the_payload_arrives() {
        let prefix = ((FRAME_BYTES_MAX + 1) as u32).to_le_bytes();
        assert_eq!(
            split_frame(&prefix),
            Err(FrameError::TooLarge {
                len: FRAME_BYTES_MAX + 1,
                max: FRAME_BYTES_MAX
            })
        );
        assert_eq!(split_frame(&prefix[..3]), Ok(None));
    }

    #[test]
    fn another_protocol_version_is_named() {
        // Kind 0, version 1 (varint), then garbage the reader never reaches.
        assert_eq!(
            decode_payload(&[0, 1, 0xff, 0xff]),
            Err(FrameError::ProtocolVersion {
                theirs: 1,
                ours: PROTOCOL_VERSION
            })
        );
        // A version above ours, in two bytes.
        assert_eq!(
            decode_payload(&[0, 0x80, 0x01]),
            Err(FrameError::ProtocolVersion {
                theirs: 128,
                ours: PROTOCOL_VERSION
            })
        );
    }

    #[test]
    fn unknown_kinds_empty_and_trailing_bytes_are_typed() {
        assert_eq!(
            decode_payload(&[10]),
            Err(FrameError::UnknownKind {
                tag: 10,
                ours: PROTOCOL_VERSION
            })
        );
        assert_eq!(decode_payload(&[]), Err(FrameError::Empty));
        assert_eq!(
            decode_payload(&[3, 0, 0, 1, 0, 0, 0]),
            Err(FrameError::TrailingBytes {
                kind: "heartbeat",
                len: 1
            })
        );
    }

    #[test]
    fn a_huge_announced_count_is_refused_by_the_count_alone() {
        // A delta whose events claim 2^32-1 elements in a 7-byte payload.
        assert_eq!(
            decode_payload(&[1, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            Err(FrameError::TooManyEvents {
                count: 0xffff_ffff,
                max: DELTA_EVENTS_MAX
            })
        );
        // An ack whose changes claim 2^32-1 entries.
        let err = decode_payload(&[2, 0, 0, 1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f]).unwrap_err();
        assert!(
            matches!(err, FrameError::BadVector { kind: "ack", field: "changes", ref detail } if detail.starts_with("4294967295 streams")),
            "{err}"
        );
    }

    /// What `encode_delta_columns_limited`'s docs say: without fork proofs
    /// its bytes are the delta's as events; with them, those bytes and then
    /// the forks section, the prefix counting it and the limit applying to
    /// the whole. (The docs said "the bytes of the delta as events" alone,
    /// false with proofs, which `DeltaColumns::to_delta` drops.)
    #[test]
    fn delta_columns_encode_as_their_delta_then_their_fork_proofs() {
        use meshlog_replica::{ChainHash, Event, ForkBranch, ForkProof, Seal, WriterKey};
        let key = WriterKey::from_bytes([5; 32]);
        let stream = key.stream();
        // A proof of two one-event histories, as `ForkProof`'s docs build.
        let branch = |payload: &'static [u8]| {
            let event = Event {
                stream,
                seq: 1,
                lamport: 1,
                time_ms: 0,
                payload: payload.into(),
            };
            let head = ChainHash::GENESIS.next(&event);
            ForkBranch {
                seal: Seal::sign(&key, 1, head),
                hash_at: ChainHash::GENESIS,
                events: vec![event],
            }
        };
        let proof = ForkProof {
            key: key.public(),
            seq: 0,
            branches: [branch(b"a"), branch(b"b")],
        };
        let Frame::Delta { delta, .. } = &sample_frames()[1] else {
            panic!("the second sample is a delta")
        };
        let mut columns = DeltaColumns::from_delta(delta);
        let plain = encode(&Frame::delta(3, columns.to_delta())).unwrap();
        assert_eq!(
            encode_delta_columns_limited(3, &columns, FRAME_BYTES_MAX),
            Ok(plain.clone())
        );
        columns.forks = vec![proof.clone()];
        let forked = encode_delta_columns_limited(3, &columns, FRAME_BYTES_MAX).unwrap();
        let mut section = Vec::new();
        put_forks(&mut section, &columns.forks);
        assert!(!section.is_empty());
        let payload = [&plain[LENGTH_PREFIX_BYTES..], &section[..]].concat();
        assert_eq!(forked[LENGTH_PREFIX_BYTES..], payload[..]);
        assert_eq!(
            forked[..LENGTH_PREFIX_BYTES],
            (payload.len() as u32).to_le_bytes()
        );
        // The limit counts the proofs.
        assert_eq!(
            encode_delta_columns_limited(3, &columns, payload.len() - 1),
            Err(FrameError::TooLarge {
                len: payload.len(),
                max: payload.len() - 1
            })
        );
        // In columns the proofs come back; as events, the delta alone.
        let Ok(Incoming::Delta {
            columns: decoded, ..
        }) = decode_incoming(&payload, FRAME_BYTES_MAX)
        else {
            panic!("a delta")
        };
        assert_eq!(decoded.forks, vec![proof]);
        assert_eq!(decode(&forked), decode(&plain));
    }
}
