//! Wire frames: the messages two replicas exchange, their postcard encoding
//! and the length prefix around it.
//!
//! A frame on the wire is a 4-byte little-endian payload length followed by
//! the payload, a postcard-encoded [`Frame`]. The byte format is specified in
//! `docs/PROTOCOL.md`; this module is its only implementation.
//!
//! Decoding is total: any byte string gives a [`Frame`] or a typed
//! [`FrameError`], never a panic. A length prefix is checked against
//! [`FRAME_BYTES_MAX`] before anything is allocated for the payload. Every
//! count a payload announces (a vector's streams, a delta's events) is
//! checked against its limit ([`STREAMS_MAX`], [`DELTA_EVENTS_MAX`]) before
//! any of its elements is decoded, and sequences are grown as elements are
//! read, never reserved by a count read from the input: a payload decodes
//! into at most a small multiple of its length, and never into more than
//! its limits allow, however small its elements.
//!
//! The serde types here are private: [`Frame`] carries the domain types of
//! `meshlog-cursor` and `meshlog-replica` (which are deliberately not
//! `Serialize`), converted at this boundary.
//!
//! ```
//! use meshlog_cursor::{StreamId, VersionVector};
//! use meshlog_sync::frame::{self, Frame};
//!
//! let marks: VersionVector = [(StreamId::new(1), 5)].into_iter().collect();
//! let bytes = frame::encode(&Frame::Ack { marks: marks.clone() })?;
//! let (payload, used) = frame::split_frame(&bytes)?.expect("one whole frame");
//! assert_eq!(used, bytes.len());
//! assert_eq!(frame::decode(payload)?, Frame::Ack { marks });
//! # Ok::<(), meshlog_sync::FrameError>(())
//! ```

use std::fmt;
use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};
use meshlog_cursor::token::STREAMS_MAX;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event};
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The protocol version this crate speaks, carried in every [`Hello`]. Peers
/// speaking another version are disconnected after the hello.
pub const PROTOCOL_VERSION: u16 = 1;

/// The largest frame payload, in bytes (the length prefix excluded): 4 MiB.
///
/// It must hold the largest delta a session sends: one event of up to the
/// replica's `payload_bytes_max` (1 MiB by default) or a byte budget of
/// events (see `SessionConfig::delta_bytes_max`), plus a floor vector of up
/// to [`STREAMS_MAX`] entries (at most 20 bytes each, about 320 KiB).
pub const FRAME_BYTES_MAX: usize = 4 << 20;

/// The most events one delta frame may carry: 8192.
///
/// The bound on what one frame decodes into. Without it a 4 MiB delta of
/// minimal events (5 bytes each on the wire, 64 bytes each decoded) would
/// decode into some 800,000 events, 50 to 100 MB, for each inbound session
/// at once. With it a delta decodes into at most about 1 MiB of events
/// besides its payloads.
///
/// A sender's byte budget counts at least 50 bytes per event
/// ([`meshlog_replica::Event::size_hint`]), so the default budget of
/// 256 KiB never builds a delta of more than 5,242 events; a session with a
/// larger budget splits what it builds into frames of at most this many
/// events. A receiver refuses a delta announcing more
/// ([`FrameError::TooManyEvents`]) after reading only its count.
pub const DELTA_EVENTS_MAX: usize = 8192;

/// The length prefix: a `u32`, little-endian.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// The postcard variant index of each frame kind; the first byte of every
/// payload (a varint below 128 is one byte).
mod tag {
    pub const HELLO: u32 = 0;
    pub const DELTA: u32 = 1;
    pub const ACK: u32 = 2;
    pub const HEARTBEAT: u32 = 3;
}

/// One message between two replicas.
///
/// The session protocol (see `docs/PROTOCOL.md`): each side opens with a
/// [`Hello`]; then sends [`Frame::Delta`]s with what the other misses,
/// [`Frame::Ack`] after applying a delta that changed its log, and a
/// [`Frame::Heartbeat`] every tick, whose marks the receiver takes as the
/// truth about the sender, so that anything lost on the way is sent again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame {
    /// The first frame of each side: who it is, which protocol it speaks, and
    /// what it holds. Re-sent on every tick until the peer shows it arrived.
    Hello(Hello),
    /// Events the receiver misses (per stream contiguous from the receiver's
    /// marks as the sender knew them), and floors it must record.
    Delta(Delta),
    /// The sender's marks after applying a delta: the receiver may join them
    /// into what it believes the sender holds.
    Ack {
        /// The sender's marks.
        marks: VersionVector,
    },
    /// The periodic re-exchange: the sender's marks now. The receiver
    /// replaces what it believes the sender holds with them, which re-sends
    /// whatever a lost frame carried.
    Heartbeat {
        /// The sender's marks.
        marks: VersionVector,
    },
}

impl Frame {
    /// The frame's kind, for logs and errors: `hello`, `delta`, `ack` or
    /// `heartbeat`.
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "hello",
            Frame::Delta(_) => "delta",
            Frame::Ack { .. } => "ack",
            Frame::Heartbeat { .. } => "heartbeat",
        }
    }
}

/// The opening frame of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The protocol version the sender speaks ([`PROTOCOL_VERSION`]). Its
    /// place (the first field of frame kind 0) is fixed across versions, so a
    /// peer of any version can read it and say what is wrong.
    pub protocol: u16,
    /// The sender's own writer stream: its replica's id.
    pub stream: StreamId,
    /// The sender's marks (head vector).
    pub marks: VersionVector,
    /// The sender's floor (compacted up to).
    pub floor: VersionVector,
}

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A length prefix, or an encoded frame, is above the limit. Nothing was
    /// allocated for it.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// The length announced or produced.
        len: usize,
        /// [`FRAME_BYTES_MAX`].
        max: usize,
    },
    /// A frame with an empty payload.
    #[error("empty frame: a payload holds at least its kind")]
    Empty,
    /// The payload's first varint names no frame kind this side knows.
    #[error("unknown frame kind {tag}: this side speaks protocol version {ours}")]
    UnknownKind {
        /// The kind read.
        tag: u32,
        /// [`PROTOCOL_VERSION`].
        ours: u16,
    },
    /// A hello from a peer speaking another protocol version.
    #[error("peer speaks protocol version {theirs}; this side speaks version {ours}")]
    ProtocolVersion {
        /// The version in the peer's hello.
        theirs: u16,
        /// [`PROTOCOL_VERSION`].
        ours: u16,
    },
    /// The payload does not decode as a frame of its kind.
    #[error("malformed {kind} frame: {detail}")]
    Malformed {
        /// The frame's kind (or `frame` if unknown).
        kind: &'static str,
        /// What the decoder reported.
        detail: String,
    },
    /// Bytes are left after the frame: the length prefix and the payload
    /// disagree.
    #[error("{len} trailing bytes after a {kind} frame")]
    TrailingBytes {
        /// The frame's kind.
        kind: &'static str,
        /// How many bytes were left.
        len: usize,
    },
    /// A delta announces more events than a frame may carry. Refused after
    /// reading the count, before any event is decoded; when encoding,
    /// before anything is written.
    #[error("delta frame of {count} events exceeds the maximum of {max} events")]
    TooManyEvents {
        /// The count announced (or, when encoding, held).
        count: usize,
        /// [`DELTA_EVENTS_MAX`].
        max: usize,
    },
    /// A version vector in the frame is not canonical: streams not strictly
    /// ascending, a zero seq, or more streams than a vector may hold (that
    /// count checked before any entry is decoded).
    #[error("{field} of a {kind} frame is not a canonical version vector: {detail}")]
    BadVector {
        /// The frame's kind.
        kind: &'static str,
        /// The field (`marks`, `floor`).
        field: &'static str,
        /// What is wrong, with the stream concerned.
        detail: String,
    },
    /// The frame could not be encoded.
    #[error("cannot encode a {kind} frame: {detail}")]
    Encode {
        /// The frame's kind.
        kind: &'static str,
        /// What the encoder reported.
        detail: String,
    },
}

impl FrameError {
    /// The frame error inside an I/O error from [`FrameReader`], if that is
    /// what it is.
    pub fn of_io(error: &std::io::Error) -> Option<&FrameError> {
        error.get_ref()?.downcast_ref::<FrameError>()
    }
}

/// Splits the first whole frame off `buf` (length prefix and payload).
///
/// Returns `Ok(None)` while `buf` holds less than a whole frame (read more),
/// `Ok(Some((payload, used)))` with the payload and the bytes it took with its
/// prefix, or [`FrameError::TooLarge`] as soon as the prefix announces more
/// than [`FRAME_BYTES_MAX`], before the payload is read.
pub fn split_frame(buf: &[u8]) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(len) = peek_len(buf)? else {
        return Ok(None);
    };
    let used = LENGTH_PREFIX_BYTES + len;
    if buf.len() < used {
        return Ok(None);
    }
    Ok(Some((&buf[LENGTH_PREFIX_BYTES..used], used)))
}

/// The payload length announced by the prefix at the start of `buf`, checked
/// against the limit; `None` if the prefix is incomplete.
fn peek_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_PREFIX_BYTES) else {
        return Ok(None);
    };
    let mut bytes = [0u8; LENGTH_PREFIX_BYTES];
    bytes.copy_from_slice(prefix);
    let len = u32::from_le_bytes(bytes) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len,
            max: FRAME_BYTES_MAX,
        });
    }
    Ok(Some(len))
}

/// Encodes a frame with its length prefix.
///
/// Fails with [`FrameError::TooLarge`] if the payload would exceed
/// [`FRAME_BYTES_MAX`] (a delta built past the budget, say), and with
/// [`FrameError::TooManyEvents`] for a delta of more than
/// [`DELTA_EVENTS_MAX`] events: nothing is sent that the peer would refuse.
pub fn encode(frame: &Frame) -> Result<Vec<u8>, FrameError> {
    if let Frame::Delta(delta) = frame {
        if delta.events.len() > DELTA_EVENTS_MAX {
            return Err(FrameError::TooManyEvents {
                count: delta.events.len(),
                max: DELTA_EVENTS_MAX,
            });
        }
    }
    let repr = FrameRepr::from_frame(frame);
    let mut out = postcard::to_extend(&repr, vec![0u8; LENGTH_PREFIX_BYTES]).map_err(|error| {
        FrameError::Encode {
            kind: frame.kind(),
            detail: error.to_string(),
        }
    })?;
    let len = out.len() - LENGTH_PREFIX_BYTES;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len,
            max: FRAME_BYTES_MAX,
        });
    }
    // Cannot truncate: FRAME_BYTES_MAX fits a u32.
    out[..LENGTH_PREFIX_BYTES].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

/// Decodes one frame's payload (without its length prefix).
///
/// Total: any bytes give a frame or a typed error. A hello is checked for
/// its protocol version before the rest of it is read, so a peer of another
/// version gets [`FrameError::ProtocolVersion`], not a decoding error. The
/// counts the payload announces are checked before their elements are
/// decoded: a delta of more than [`DELTA_EVENTS_MAX`] events is
/// [`FrameError::TooManyEvents`], a vector of more than [`STREAMS_MAX`]
/// streams [`FrameError::BadVector`].
pub fn decode(payload: &[u8]) -> Result<Frame, FrameError> {
    if payload.is_empty() {
        return Err(FrameError::Empty);
    }
    if payload.len() > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len: payload.len(),
            max: FRAME_BYTES_MAX,
        });
    }
    let malformed = |kind: &'static str| {
        move |error: postcard::Error| FrameError::Malformed {
            kind,
            detail: error.to_string(),
        }
    };
    let (tag, _) = postcard::take_from_bytes::<u32>(payload).map_err(malformed("frame"))?;
    let kind = match tag {
        tag::HELLO => "hello",
        tag::DELTA => "delta",
        tag::ACK => "ack",
        tag::HEARTBEAT => "heartbeat",
        _ => {
            return Err(FrameError::UnknownKind {
                tag,
                ours: PROTOCOL_VERSION,
            })
        }
    };
    if tag == tag::HELLO {
        let ((_, protocol), _) =
            postcard::take_from_bytes::<(u32, u16)>(payload).map_err(malformed(kind))?;
        if protocol != PROTOCOL_VERSION {
            return Err(FrameError::ProtocolVersion {
                theirs: protocol,
                ours: PROTOCOL_VERSION,
            });
        }
    }
    check_counts(tag, kind, payload)?;
    let (repr, rest) = postcard::take_from_bytes::<FrameRepr>(payload).map_err(malformed(kind))?;
    if !rest.is_empty() {
        return Err(FrameError::TrailingBytes {
            kind,
            len: rest.len(),
        });
    }
    repr.into_frame(kind)
}

/// Checks the counts a payload announces against their limits before
/// anything is decoded for their elements: each vector's entries (at most
/// [`STREAMS_MAX`]) and a delta's events (at most [`DELTA_EVENTS_MAX`]).
///
/// postcard writes a sequence's count (a varint) before its elements, so
/// this walks the payload's layout reading varints only, skipping vector
/// entries without storing them and stopping at a delta's event count: it
/// allocates nothing. Bytes that do not parse are left to the decoder,
/// which reports them as it would without this check.
fn check_counts(tag: u32, kind: &'static str, payload: &[u8]) -> Result<(), FrameError> {
    fn take<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<(T, &[u8])> {
        postcard::take_from_bytes::<T>(bytes).ok()
    }
    /// Reads a vector's count, refuses it above the limit, and skips its
    /// entries; `Ok(None)` if the bytes do not parse.
    fn skip_vector<'a>(
        bytes: &'a [u8],
        kind: &'static str,
        field: &'static str,
    ) -> Result<Option<&'a [u8]>, FrameError> {
        let Some((count, mut rest)) = take::<u64>(bytes) else {
            return Ok(None);
        };
        if count > STREAMS_MAX as u64 {
            return Err(FrameError::BadVector {
                kind,
                field,
                detail: format!("{count} streams exceed the limit of {STREAMS_MAX}"),
            });
        }
        for _ in 0..count {
            let Some((_, after)) = take::<(u64, u64)>(rest) else {
                return Ok(None);
            };
            rest = after;
        }
        Ok(Some(rest))
    }

    let Some((_, body)) = take::<u32>(payload) else {
        return Ok(());
    };
    match tag {
        tag::HELLO => {
            let Some((_, vectors)) = take::<(u16, u64)>(body) else {
                return Ok(());
            };
            if let Some(floor) = skip_vector(vectors, kind, "marks")? {
                skip_vector(floor, kind, "floor")?;
            }
        }
        tag::DELTA => {
            let Some(events) = skip_vector(body, kind, "floor")? else {
                return Ok(());
            };
            let Some((count, _)) = take::<u64>(events) else {
                return Ok(());
            };
            if count > DELTA_EVENTS_MAX as u64 {
                return Err(FrameError::TooManyEvents {
                    count: usize::try_from(count).unwrap_or(usize::MAX),
                    max: DELTA_EVENTS_MAX,
                });
            }
        }
        _ => {
            skip_vector(body, kind, "marks")?;
        }
    }
    Ok(())
}

/// Reads length-prefixed frames from a byte stream, one whole frame at a
/// time.
///
/// Cancel-safe: [`FrameReader::read_payload`] keeps partial input in the reader,
/// so it can be a branch of `tokio::select!` that loses the race without
/// losing bytes. The buffer never holds more than one frame's worth plus one
/// read: a prefix above [`FRAME_BYTES_MAX`] is refused before its payload is
/// buffered.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: BytesMut,
}

/// How much buffer a read asks for at a time: large frames are read in
/// chunks rather than reserved whole up front.
const READ_CHUNK_BYTES: usize = 64 * 1024;

impl FrameReader {
    /// A reader with an empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next whole frame's payload (without the prefix), or `Ok(None)` at
    /// a clean end of stream (between frames).
    ///
    /// An end of stream inside a frame is an
    /// [`std::io::ErrorKind::UnexpectedEof`] error; a prefix above the limit
    /// is an [`std::io::ErrorKind::InvalidData`] error wrapping
    /// [`FrameError::TooLarge`] (see [`FrameError::of_io`]).
    pub async fn read_payload<R: AsyncRead + Unpin>(
        &mut self,
        source: &mut R,
    ) -> std::io::Result<Option<Bytes>> {
        Ok(self
            .read_frame(source)
            .await?
            .map(|raw| raw.slice(LENGTH_PREFIX_BYTES..)))
    }

    /// The next whole frame's raw bytes, prefix included: what the
    /// testkit's fault proxy forwards. Same contract as
    /// [`FrameReader::read_payload`]; the prefix is checked, the payload is
    /// not decoded. Only with the `testkit` feature: a session never needs a
    /// frame it has not decoded.
    #[cfg(feature = "testkit")]
    pub async fn read_raw<R: AsyncRead + Unpin>(
        &mut self,
        source: &mut R,
    ) -> std::io::Result<Option<Bytes>> {
        self.read_frame(source).await
    }

    /// The next whole frame, prefix included (see `read_raw`).
    async fn read_frame<R: AsyncRead + Unpin>(
        &mut self,
        source: &mut R,
    ) -> std::io::Result<Option<Bytes>> {
        loop {
            let len = peek_len(&self.buf)
                .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?;
            if let Some(len) = len {
                if self.buf.len() >= LENGTH_PREFIX_BYTES + len {
                    return Ok(Some(self.buf.split_to(LENGTH_PREFIX_BYTES + len).freeze()));
                }
            }
            let missing = match len {
                Some(len) => LENGTH_PREFIX_BYTES + len - self.buf.len(),
                None => LENGTH_PREFIX_BYTES - self.buf.len(),
            };
            self.buf.reserve(missing.min(READ_CHUNK_BYTES));
            let read = source.read_buf(&mut self.buf).await?;
            if read == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "stream ended inside a frame ({} bytes of it read)",
                        self.buf.len()
                    ),
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The serde representation: private, converted at this boundary.
// ---------------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
enum FrameRepr {
    Hello(HelloRepr),
    Delta(DeltaRepr),
    Ack(VectorRepr),
    Heartbeat(VectorRepr),
}

#[derive(Serialize, Deserialize)]
struct HelloRepr {
    protocol: u16,
    stream: u64,
    marks: VectorRepr,
    floor: VectorRepr,
}

#[derive(Serialize, Deserialize)]
struct DeltaRepr {
    floor: VectorRepr,
    events: Seq<EventRepr>,
}

#[derive(Serialize, Deserialize)]
struct EventRepr {
    stream: u64,
    seq: u64,
    lamport: u64,
    time_ms: u64,
    payload: Bytes,
}

/// A version vector on the wire: `(stream, seq)` pairs, streams strictly
/// ascending, seqs nonzero.
#[derive(Serialize, Deserialize)]
struct VectorRepr(Seq<(u64, u64)>);

/// A sequence that is grown as its elements are read, never reserved by the
/// count the input announces: every element takes at least one input byte,
/// so memory stays proportional to what was actually decoded. (serde's own
/// `Vec` impl reserves by the announced count, up to 1 MiB; postcard happens
/// to refuse counts above the bytes left, but that is its flavor's choice,
/// not a contract this boundary should rest on.)
struct Seq<T>(Vec<T>);

impl<T: Serialize> Serialize for Seq<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Seq<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SeqVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for SeqVisitor<T> {
            type Value = Seq<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Seq<T>, A::Error> {
                let mut out = Vec::new();
                while let Some(element) = seq.next_element()? {
                    out.push(element);
                }
                Ok(Seq(out))
            }
        }

        deserializer.deserialize_seq(SeqVisitor(PhantomData))
    }
}

impl VectorRepr {
    fn of(vector: &VersionVector) -> Self {
        VectorRepr(Seq(vector.iter().map(|(s, seq)| (s.get(), seq)).collect()))
    }

    fn into_vector(
        self,
        kind: &'static str,
        field: &'static str,
    ) -> Result<VersionVector, FrameError> {
        let entries = self.0 .0;
        let bad = |detail: String| FrameError::BadVector {
            kind,
            field,
            detail,
        };
        // Also checked before decoding (`check_counts`); kept here so that
        // no vector over the limit is built whatever path led here.
        if entries.len() > STREAMS_MAX {
            return Err(bad(format!(
                "{} streams exceed the limit of {STREAMS_MAX}",
                entries.len()
            )));
        }
        let mut previous: Option<u64> = None;
        for &(stream, seq) in &entries {
            if seq == 0 {
                return Err(bad(format!("stream {} has seq 0", StreamId::new(stream))));
            }
            if let Some(previous) = previous {
                if stream <= previous {
                    return Err(bad(format!(
                        "stream {} follows stream {}: streams must be strictly ascending",
                        StreamId::new(stream),
                        StreamId::new(previous)
                    )));
                }
            }
            previous = Some(stream);
        }
        Ok(entries
            .into_iter()
            .map(|(stream, seq)| (StreamId::new(stream), seq))
            .collect())
    }
}

impl FrameRepr {
    fn from_frame(frame: &Frame) -> Self {
        match frame {
            Frame::Hello(hello) => FrameRepr::Hello(HelloRepr {
                protocol: hello.protocol,
                stream: hello.stream.get(),
                marks: VectorRepr::of(&hello.marks),
                floor: VectorRepr::of(&hello.floor),
            }),
            Frame::Delta(delta) => FrameRepr::Delta(DeltaRepr {
                floor: VectorRepr::of(&delta.floor),
                events: Seq(delta
                    .events
                    .iter()
                    .map(|event| EventRepr {
                        stream: event.stream.get(),
                        seq: event.seq,
                        lamport: event.lamport,
                        time_ms: event.time_ms,
                        // A reference count, not a copy.
                        payload: event.payload.clone(),
                    })
                    .collect()),
            }),
            Frame::Ack { marks } => FrameRepr::Ack(VectorRepr::of(marks)),
            Frame::Heartbeat { marks } => FrameRepr::Heartbeat(VectorRepr::of(marks)),
        }
    }

    fn into_frame(self, kind: &'static str) -> Result<Frame, FrameError> {
        Ok(match self {
            FrameRepr::Hello(hello) => Frame::Hello(Hello {
                protocol: hello.protocol,
                stream: StreamId::new(hello.stream),
                marks: hello.marks.into_vector(kind, "marks")?,
                floor: hello.floor.into_vector(kind, "floor")?,
            }),
            FrameRepr::Delta(delta) => Frame::Delta(Delta {
                floor: delta.floor.into_vector(kind, "floor")?,
                events: delta
                    .events
                    .0
                    .into_iter()
                    .map(|event| Event {
                        stream: StreamId::new(event.stream),
                        seq: event.seq,
                        lamport: event.lamport,
                        time_ms: event.time_ms,
                        payload: event.payload,
                    })
                    .collect(),
            }),
            FrameRepr::Ack(marks) => Frame::Ack {
                marks: marks.into_vector(kind, "marks")?,
            },
            FrameRepr::Heartbeat(marks) => Frame::Heartbeat {
                marks: marks.into_vector(kind, "marks")?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vv(entries: &[(u64, u64)]) -> VersionVector {
        entries
            .iter()
            .map(|&(s, seq)| (StreamId::new(s), seq))
            .collect()
    }

    fn sample_frames() -> Vec<Frame> {
        vec![
            Frame::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                stream: StreamId::new(7),
                marks: vv(&[(1, 3), (7, 9)]),
                floor: vv(&[(1, 1)]),
            }),
            Frame::Delta(Delta {
                floor: vv(&[(2, 4)]),
                events: vec![Event {
                    stream: StreamId::new(2),
                    seq: 5,
                    lamport: 11,
                    time_ms: 1_700_000_000_000,
                    payload: Bytes::from_static(b"hello"),
                }],
            }),
            Frame::Ack {
                marks: vv(&[(u64::MAX, u64::MAX)]),
            },
            Frame::Heartbeat {
                marks: VersionVector::new(),
            },
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for frame in sample_frames() {
            let bytes = encode(&frame).unwrap();
            let (payload, used) = split_frame(&bytes).unwrap().unwrap();
            assert_eq!(used, bytes.len());
            assert_eq!(decode(payload).unwrap(), frame);
        }
    }

    #[test]
    fn the_first_payload_byte_is_the_kind_and_a_hello_starts_with_its_version() {
        let bytes = encode(&sample_frames()[0]).unwrap();
        assert_eq!(bytes[4], 0);
        assert_eq!(bytes[5], PROTOCOL_VERSION as u8);
        let ack = encode(&Frame::Ack {
            marks: VersionVector::new(),
        })
        .unwrap();
        assert_eq!(ack, [2, 0, 0, 0, 2, 0]);
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

    /// The examples of `docs/PROTOCOL.md`, byte for byte.
    #[test]
    fn the_protocol_doc_examples_are_exact() {
        let ack = encode(&Frame::Ack {
            marks: vv(&[(1, 5)]),
        })
        .unwrap();
        assert_eq!(ack, [0x04, 0, 0, 0, 0x02, 0x01, 0x01, 0x05]);
        let hello = encode(&Frame::Hello(Hello {
            protocol: 1,
            stream: StreamId::new(0xb),
            marks: vv(&[(0xb, 3)]),
            floor: VersionVector::new(),
        }))
        .unwrap();
        assert_eq!(
            hello,
            [0x07, 0, 0, 0, 0x00, 0x01, 0x0b, 0x01, 0x0b, 0x03, 0x00]
        );
        let delta = encode(&Frame::Delta(Delta {
            floor: VersionVector::new(),
            events: vec![Event {
                stream: StreamId::new(2),
                seq: 5,
                lamport: 11,
                time_ms: 1000,
                payload: Bytes::from_static(b"hi"),
            }],
        }))
        .unwrap();
        assert_eq!(
            delta,
            [0x0b, 0, 0, 0, 0x01, 0x00, 0x01, 0x02, 0x05, 0x0b, 0xe8, 0x07, 0x02, 0x68, 0x69]
        );
    }

    /// `docs/PROTOCOL.md` states that a delta of one event takes at most
    /// 327,708 bytes besides its payload, so payloads up to 3,866,596 bytes
    /// always fit a frame: the worst case (the largest floor vector, every
    /// varint at its longest) lands exactly on the limit.
    #[test]
    fn the_largest_payload_that_always_fits_is_the_documented_one() {
        let floor: VersionVector = (0..STREAMS_MAX as u64)
            .map(|i| (StreamId::new(u64::MAX - i), u64::MAX))
            .collect();
        let delta = |payload_len: usize| {
            Frame::Delta(Delta {
                floor: floor.clone(),
                events: vec![Event {
                    stream: StreamId::new(u64::MAX),
                    seq: u64::MAX,
                    lamport: u64::MAX,
                    time_ms: u64::MAX,
                    payload: Bytes::from(vec![0u8; payload_len]),
                }],
            })
        };
        let bytes = encode(&delta(3_866_596)).unwrap();
        assert_eq!(bytes.len(), LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX);
        assert_eq!(
            encode(&delta(3_866_597)),
            Err(FrameError::TooLarge {
                len: FRAME_BYTES_MAX + 1,
                max: FRAME_BYTES_MAX
            })
        );
    }

    #[test]
    fn another_protocol_version_is_named() {
        // Kind 0, version 2 (varint), then garbage the reader never reaches.
        assert_eq!(
            decode(&[0, 2, 0xff, 0xff]),
            Err(FrameError::ProtocolVersion {
                theirs: 2,
                ours: PROTOCOL_VERSION
            })
        );
    }

    #[test]
    fn non_canonical_vectors_are_refused() {
        // Ack with two entries, streams descending.
        let err = decode(&[2, 2, 5, 1, 3, 1]).unwrap_err();
        assert!(
            matches!(err, FrameError::BadVector { field: "marks", .. }),
            "{err}"
        );
        // Ack with a zero seq.
        let err = decode(&[2, 1, 5, 0]).unwrap_err();
        assert!(matches!(err, FrameError::BadVector { .. }), "{err}");
    }

    #[test]
    fn unknown_kinds_empty_and_trailing_bytes_are_typed() {
        assert_eq!(
            decode(&[9]),
            Err(FrameError::UnknownKind {
                tag: 9,
                ours: PROTOCOL_VERSION
            })
        );
        assert_eq!(decode(&[]), Err(FrameError::Empty));
        assert_eq!(
            decode(&[3, 0, 0]),
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
            decode(&[1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            Err(FrameError::TooManyEvents {
                count: 0xffff_ffff,
                max: DELTA_EVENTS_MAX
            })
        );
        // An ack whose marks claim 2^32-1 entries.
        let err = decode(&[2, 0xff, 0xff, 0xff, 0xff, 0x0f]).unwrap_err();
        assert!(
            matches!(err, FrameError::BadVector { kind: "ack", field: "marks", ref detail } if detail.starts_with("4294967295 streams")),
            "{err}"
        );
    }

    fn tiny_events(count: usize) -> Vec<Event> {
        (1..=count as u64)
            .map(|seq| Event {
                stream: StreamId::new(1),
                seq,
                lamport: seq,
                time_ms: 0,
                payload: Bytes::new(),
            })
            .collect()
    }

    /// Found in review: a 4 MiB delta of minimal events decoded into about
    /// 800,000 events (50 to 100 MB) before anything checked their number.
    #[test]
    fn a_delta_of_more_events_than_the_limit_is_refused_before_decoding() {
        // Kind 1, an empty floor, the count, then one minimal event
        // (stream, seq, lamport, time, empty payload) where 8193 should be.
        let mut payload = vec![1, 0];
        payload.extend(postcard::to_stdvec(&((DELTA_EVENTS_MAX + 1) as u64)).unwrap());
        payload.extend([1, 1, 1, 0, 0]);
        assert_eq!(
            decode(&payload),
            Err(FrameError::TooManyEvents {
                count: DELTA_EVENTS_MAX + 1,
                max: DELTA_EVENTS_MAX
            })
        );
        // The count is read past a floor vector too.
        let mut payload = vec![1, 2, 1, 4, 7, 2];
        payload.extend(postcard::to_stdvec(&((DELTA_EVENTS_MAX + 1) as u64)).unwrap());
        assert!(matches!(
            decode(&payload),
            Err(FrameError::TooManyEvents { .. })
        ));
    }

    #[test]
    fn a_delta_at_the_event_limit_round_trips_and_one_above_is_not_encoded() {
        let at_limit = Frame::Delta(Delta {
            floor: VersionVector::new(),
            events: tiny_events(DELTA_EVENTS_MAX),
        });
        let bytes = encode(&at_limit).unwrap();
        assert_eq!(decode(&bytes[LENGTH_PREFIX_BYTES..]), Ok(at_limit));
        let above = Frame::Delta(Delta {
            floor: VersionVector::new(),
            events: tiny_events(DELTA_EVENTS_MAX + 1),
        });
        assert_eq!(
            encode(&above),
            Err(FrameError::TooManyEvents {
                count: DELTA_EVENTS_MAX + 1,
                max: DELTA_EVENTS_MAX
            })
        );
    }

    /// The sender's side of the limit: a byte budget counts at least 50
    /// bytes per event, so the default budget cannot build a delta the
    /// receiver refuses; larger budgets are split by the session.
    #[test]
    fn the_default_budget_never_builds_a_delta_over_the_event_limit() {
        let mut replica = meshlog_replica::Replica::new(StreamId::new(1));
        for i in 0..(DELTA_EVENTS_MAX as u64 + 100) {
            replica.append_at(Bytes::new(), i).unwrap();
        }
        let budget = crate::SessionConfig::default().delta_bytes_max;
        let delta = replica.delta_for(&VersionVector::new(), budget);
        assert!(
            delta.events.len() <= DELTA_EVENTS_MAX,
            "{} events",
            delta.events.len()
        );
        assert_eq!(delta.events.len(), budget / 50);
    }
}
