//! Wire frames: the messages two replicas exchange, their encoding and the
//! length prefix around it.
//!
//! A frame on the wire is a 4-byte little-endian payload length followed by
//! the payload: the frame's kind, then its content. Hellos, acks,
//! heartbeats and a delta's floor are postcard encodings; a delta's events
//! are written by hand (`encode_events`, `decode_events`), grouped into one
//! run per stream with seqs implied and lamports and times as differences.
//! The byte format is specified in `docs/PROTOCOL.md`; this module is its
//! only implementation.
//!
//! Decoding is total: any byte string gives a [`Frame`] or a typed
//! [`FrameError`], never a panic. A length prefix is checked against
//! [`FRAME_BYTES_MAX`] before anything is allocated for the payload. Every
//! count a payload announces (a vector's streams, a delta's events, a run's
//! events, a payload's length) is checked against its limit
//! ([`STREAMS_MAX`], [`DELTA_EVENTS_MAX`]) and against the bytes left before
//! any of its elements is decoded. Vectors are grown as their entries are
//! read, never reserved by a count read from the input; a delta's events
//! are reserved once, by a count already known to fit the bytes left at
//! [`EVENT_BYTES_MIN`] bytes an event. A payload decodes into at most a
//! small multiple of its length (an event of 3 bytes into 64), and never
//! into more than its limits allow, however small its elements.
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
/// minimal events ([`EVENT_BYTES_MIN`] bytes each on the wire, 64 bytes
/// each decoded) would decode into some 1,400,000 events, about 90 MB, for
/// each inbound session at once. With it a delta decodes into at most
/// 512 KiB of events besides its payloads.
///
/// A sender's byte budget counts at least 50 bytes per event
/// ([`meshlog_replica::Event::size_hint`]), so the default budget of
/// 256 KiB never builds a delta of more than 5,242 events; a session with a
/// larger budget splits what it builds into frames of at most this many
/// events. A receiver refuses a delta announcing more
/// ([`FrameError::TooManyEvents`]) after reading only its count.
pub const DELTA_EVENTS_MAX: usize = 8192;

/// The fewest bytes an event of a delta takes on the wire: its lamport gap,
/// its time and its payload length, one varint byte each (the run it
/// belongs to takes more).
///
/// A delta's event count, and each run's, is refused
/// ([`FrameError::CountAboveBytes`]) if this many bytes per event do not
/// fit what is left of the payload, so what a delta decodes into stays
/// within 64 / 3 bytes of events per payload byte.
pub const EVENT_BYTES_MIN: usize = 3;

/// The length prefix: a `u32`, little-endian.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// Each frame kind's number: the varint that opens every payload (a varint
/// below 128 is one byte), as a postcard enum's variant index would.
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
    /// A delta announces more than the bytes left in it can hold: an event
    /// count (of the whole delta, `field` = `events`, or of one run, `run`)
    /// above the bytes left divided by [`EVENT_BYTES_MIN`], or a payload
    /// length (`payload`) above the bytes left. Refused before anything is
    /// allocated for it.
    #[error("a delta frame's {field} count of {count} does not fit the {bytes_left} bytes left")]
    CountAboveBytes {
        /// What the count counts: `events`, `run` or `payload`.
        field: &'static str,
        /// The count announced.
        count: u64,
        /// The bytes left in the payload after the count.
        bytes_left: usize,
    },
    /// A run of a delta names seqs past `u64::MAX`: its first seq plus its
    /// event count, less one, overflows.
    #[error(
        "delta run of stream {stream}: {count} events from seq {first_seq} overflow a u64 seq"
    )]
    SeqOverflow {
        /// The run's stream.
        stream: StreamId,
        /// The run's first seq.
        first_seq: u64,
        /// The run's event count.
        count: u64,
    },
    /// An event's lamport stamp (the previous event's in its run, plus
    /// one, plus the event's gap) overflows a `u64`.
    #[error("delta event {stream}:{seq}: lamport stamp overflows a u64")]
    LamportOverflow {
        /// The event's stream.
        stream: StreamId,
        /// The event's seq.
        seq: u64,
    },
    /// A delta's runs are not canonical: a run of no events, a run of more
    /// events than the delta's count leaves, or a stream not above the
    /// previous run's (one run per stream, streams strictly ascending).
    #[error("delta run of stream {stream} is not canonical: {detail}")]
    BadRun {
        /// The run's stream.
        stream: StreamId,
        /// What is wrong.
        detail: String,
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
    /// The frame could not be encoded: postcard failed, or a delta holds
    /// what its layout cannot carry (and a receiver would refuse): per
    /// stream, events not contiguous in seq order, a lamport stamp not
    /// rising with seq, or a lamport stamp of 0.
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
/// [`FRAME_BYTES_MAX`] (a delta built past the budget, say), with
/// [`FrameError::TooManyEvents`] for a delta of more than
/// [`DELTA_EVENTS_MAX`] events, and with [`FrameError::Encode`] for a delta
/// whose events break the model (per stream, seqs not contiguous in the
/// order given, or lamport stamps not rising from 1): nothing is sent that
/// the peer would refuse.
///
/// A delta's events may come in any order across streams; per stream they
/// must be in seq order. They are decoded in `(lamport, stream)` order,
/// the order [`meshlog_replica::Replica::delta_for`] builds.
///
/// ```
/// use bytes::Bytes;
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::{Delta, Event};
/// use meshlog_sync::frame::{self, Frame, LENGTH_PREFIX_BYTES};
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
///     floor: VersionVector::new(),
///     events: vec![event(2, 1, 1), event(1, 4, 2), event(2, 2, 3), event(1, 5, 4)],
/// };
/// let bytes = frame::encode(&Frame::Delta(delta.clone()))?;
/// assert_eq!(frame::decode(&bytes[LENGTH_PREFIX_BYTES..])?, Frame::Delta(delta));
/// # Ok::<(), meshlog_sync::FrameError>(())
/// ```
pub fn encode(frame: &Frame) -> Result<Vec<u8>, FrameError> {
    let kind = frame.kind();
    let postcard_error = |error: postcard::Error| FrameError::Encode {
        kind,
        detail: error.to_string(),
    };
    let mut out = vec![0u8; LENGTH_PREFIX_BYTES];
    match frame {
        Frame::Hello(hello) => {
            put_varint(&mut out, u64::from(tag::HELLO));
            let repr = HelloRepr {
                protocol: hello.protocol,
                stream: hello.stream.get(),
                marks: VectorRepr::of(&hello.marks),
                floor: VectorRepr::of(&hello.floor),
            };
            out = postcard::to_extend(&repr, out).map_err(postcard_error)?;
        }
        Frame::Delta(delta) => {
            if delta.events.len() > DELTA_EVENTS_MAX {
                return Err(FrameError::TooManyEvents {
                    count: delta.events.len(),
                    max: DELTA_EVENTS_MAX,
                });
            }
            put_varint(&mut out, u64::from(tag::DELTA));
            out =
                postcard::to_extend(&VectorRepr::of(&delta.floor), out).map_err(postcard_error)?;
            encode_events(&delta.events, &mut out)?;
        }
        Frame::Ack { marks } => {
            put_varint(&mut out, u64::from(tag::ACK));
            out = postcard::to_extend(&VectorRepr::of(marks), out).map_err(postcard_error)?;
        }
        Frame::Heartbeat { marks } => {
            put_varint(&mut out, u64::from(tag::HEARTBEAT));
            out = postcard::to_extend(&VectorRepr::of(marks), out).map_err(postcard_error)?;
        }
    }
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
/// [`FrameError::TooManyEvents`], a count the bytes left cannot hold
/// [`FrameError::CountAboveBytes`], a vector of more than [`STREAMS_MAX`]
/// streams [`FrameError::BadVector`].
///
/// A delta's events come out in `(lamport, stream)` order (per stream in
/// seq order), whatever order the sender's delta held them in.
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
    let (tag, body) = postcard::take_from_bytes::<u32>(payload).map_err(malformed("frame"))?;
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
        let (protocol, _) = postcard::take_from_bytes::<u16>(body).map_err(malformed(kind))?;
        if protocol != PROTOCOL_VERSION {
            return Err(FrameError::ProtocolVersion {
                theirs: protocol,
                ours: PROTOCOL_VERSION,
            });
        }
    }
    check_counts(tag, kind, payload)?;
    /// The whole of `bytes` as one `T`.
    fn take_all<'a, T: Deserialize<'a>>(
        bytes: &'a [u8],
        kind: &'static str,
    ) -> Result<T, FrameError> {
        let (value, rest) =
            postcard::take_from_bytes::<T>(bytes).map_err(|error| FrameError::Malformed {
                kind,
                detail: error.to_string(),
            })?;
        if !rest.is_empty() {
            return Err(FrameError::TrailingBytes {
                kind,
                len: rest.len(),
            });
        }
        Ok(value)
    }
    Ok(match tag {
        tag::HELLO => {
            let hello: HelloRepr = take_all(body, kind)?;
            Frame::Hello(Hello {
                protocol: hello.protocol,
                stream: StreamId::new(hello.stream),
                marks: hello.marks.into_vector(kind, "marks")?,
                floor: hello.floor.into_vector(kind, "floor")?,
            })
        }
        tag::DELTA => {
            let (floor, events) =
                postcard::take_from_bytes::<VectorRepr>(body).map_err(malformed(kind))?;
            Frame::Delta(Delta {
                floor: floor.into_vector(kind, "floor")?,
                events: decode_events(events)?,
            })
        }
        tag::ACK => Frame::Ack {
            marks: take_all::<VectorRepr>(body, kind)?.into_vector(kind, "marks")?,
        },
        _ => Frame::Heartbeat {
            marks: take_all::<VectorRepr>(body, kind)?.into_vector(kind, "marks")?,
        },
    })
}

/// Checks the counts of the payload's vectors against their limit (at most
/// [`STREAMS_MAX`] entries) before anything is decoded for their entries. A
/// delta's event counts are checked by `decode_events` as it reads them.
///
/// postcard writes a sequence's count (a varint) before its elements, so
/// this walks the payload's layout reading varints only, skipping vector
/// entries without storing them: it allocates nothing. Bytes that do not
/// parse are left to the decoder, which reports them as it would without
/// this check.
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
            // The event counts are checked by `decode_events`, which reads
            // them before anything else of the events.
            skip_vector(body, kind, "floor")?;
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
struct HelloRepr {
    protocol: u16,
    stream: u64,
    marks: VectorRepr,
    floor: VectorRepr,
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

// ---------------------------------------------------------------------------
// A delta's events: one run per stream, written by hand.
// ---------------------------------------------------------------------------

/// The longest varint of a `u64`: 10 bytes of 7 bits, the last holding 1.
const VARINT_BYTES_MAX: usize = 10;

/// Appends `value` as a LEB128 varint, postcard's encoding of unsigned
/// integers: 7 bits a byte, least significant group first, the high bit
/// set on every byte but the last. Always the shortest form.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A signed difference as an unsigned number, small magnitudes small:
/// 0, -1, 1, -2, 2... as 0, 1, 2, 3, 4...
fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// The inverse of [`zigzag`].
fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// Writes a delta's events after its floor (`docs/PROTOCOL.md`, "Delta
/// events"): their count, then one run per stream, streams ascending, each
/// `stream, first seq, event count` and its events in seq order, every
/// event `lamport gap, time, payload length, payload`.
///
/// The seqs of a run are implied (`first + i`), so a stream's events must
/// be contiguous; a lamport stamp is written as its gap above the previous
/// one in the run less one (above 0 for the first), so it must rise from 1;
/// a time is the wrapping difference from the previous event's in the
/// frame, zigzag-encoded (the first event's plain). What the layout cannot
/// carry is refused with [`FrameError::Encode`].
fn encode_events(events: &[Event], out: &mut Vec<u8>) -> Result<(), FrameError> {
    let refuse = |detail: String| FrameError::Encode {
        kind: "delta",
        detail,
    };
    // Grouped by stream, each stream's events in the order given: a stable
    // sort. A replica's delta interleaves streams in `(lamport, stream)`
    // order; the decoder restores that order.
    let mut by_stream: Vec<&Event> = events.iter().collect();
    by_stream.sort_by_key(|event| event.stream);
    put_varint(out, events.len() as u64);
    let mut time_previous: Option<u64> = None;
    for run in by_stream.chunk_by(|a, b| a.stream == b.stream) {
        let first = run[0];
        put_varint(out, first.stream.get());
        put_varint(out, first.seq);
        put_varint(out, run.len() as u64);
        let mut seq_due = Some(first.seq);
        let mut lamport_previous = 0u64;
        for event in run {
            if seq_due != Some(event.seq) {
                return Err(refuse(format!(
                    "event {}:{} follows seq {} of its stream: a delta carries each \
                     stream's events contiguous and in seq order",
                    event.stream,
                    event.seq,
                    seq_due.map_or(u64::MAX, |due| due - 1),
                )));
            }
            if event.lamport <= lamport_previous {
                return Err(refuse(format!(
                    "event {}:{} has lamport stamp {}, not above {}: lamport stamps rise \
                     from 1 with seq",
                    event.stream, event.seq, event.lamport, lamport_previous
                )));
            }
            put_varint(out, event.lamport - lamport_previous - 1);
            let time = match time_previous {
                None => event.time_ms,
                Some(previous) => zigzag(event.time_ms.wrapping_sub(previous) as i64),
            };
            put_varint(out, time);
            put_varint(out, event.payload.len() as u64);
            out.extend_from_slice(&event.payload);
            seq_due = event.seq.checked_add(1);
            lamport_previous = event.lamport;
            time_previous = Some(event.time_ms);
        }
    }
    Ok(())
}

/// Reads a delta's events, written by [`encode_events`], to the end of the
/// payload.
///
/// Every count is checked before anything is decoded or allocated for what
/// it counts: the delta's against [`DELTA_EVENTS_MAX`], then it and each
/// run's against the bytes left at [`EVENT_BYTES_MIN`] bytes an event, each
/// payload length against the bytes left. Seqs, lamport stamps and their
/// sums are checked for overflow. Only canonical input decodes (shortest
/// varints, one run per stream, streams strictly ascending, no empty run),
/// so the frame re-encodes to the very bytes it came from.
///
/// The events come out in `(lamport, stream)` order: within a run lamport
/// rises with seq by construction, and no two runs share a stream, so that
/// order keeps each stream's events in seq order.
fn decode_events(bytes: &[u8]) -> Result<Vec<Event>, FrameError> {
    let mut reader = Reader { bytes };
    let count = reader.varint("event count")?;
    if count > DELTA_EVENTS_MAX as u64 {
        return Err(FrameError::TooManyEvents {
            count: usize::try_from(count).unwrap_or(usize::MAX),
            max: DELTA_EVENTS_MAX,
        });
    }
    reader.check_fits("events", count)?;
    // At most DELTA_EVENTS_MAX events, and at most one per
    // EVENT_BYTES_MIN bytes of input: reserved once, exactly.
    let count = count as usize;
    let mut events: Vec<Event> = Vec::with_capacity(count);
    let mut stream_previous: Option<StreamId> = None;
    let mut time_previous: Option<u64> = None;
    while events.len() < count {
        let stream = StreamId::new(reader.varint("stream")?);
        let bad_run = |detail: String| FrameError::BadRun { stream, detail };
        if let Some(previous) = stream_previous {
            if stream <= previous {
                return Err(bad_run(format!(
                    "it follows the run of stream {previous}: one run per stream, \
                     streams strictly ascending"
                )));
            }
        }
        stream_previous = Some(stream);
        let first_seq = reader.varint("first seq")?;
        let run_len = reader.varint("run event count")?;
        let events_left = count - events.len();
        if run_len == 0 {
            return Err(bad_run("a run of no events".to_string()));
        }
        if run_len > events_left as u64 {
            return Err(bad_run(format!(
                "{run_len} events where the delta's count leaves {events_left}"
            )));
        }
        let last_seq = first_seq
            .checked_add(run_len - 1)
            .ok_or(FrameError::SeqOverflow {
                stream,
                first_seq,
                count: run_len,
            })?;
        reader.check_fits("run", run_len)?;
        let mut lamport = 0u64;
        for seq in first_seq..=last_seq {
            let gap = reader.varint("lamport gap")?;
            lamport = lamport
                .checked_add(gap)
                .and_then(|sum| sum.checked_add(1))
                .ok_or(FrameError::LamportOverflow { stream, seq })?;
            let time_ms = match time_previous {
                None => reader.varint("time")?,
                Some(previous) => {
                    previous.wrapping_add(unzigzag(reader.varint("time difference")?) as u64)
                }
            };
            time_previous = Some(time_ms);
            let len = reader.varint("payload length")?;
            let payload = Bytes::copy_from_slice(reader.take("payload", len)?);
            events.push(Event {
                stream,
                seq,
                lamport,
                time_ms,
                payload,
            });
        }
    }
    if !reader.bytes.is_empty() {
        return Err(FrameError::TrailingBytes {
            kind: "delta",
            len: reader.bytes.len(),
        });
    }
    // Allocation-free, and already sorted for a delta of one stream.
    events.sort_unstable_by_key(|event| (event.lamport, event.stream));
    Ok(events)
}

/// Reads the hand-written part of a delta frame: shortest-form varints and
/// byte strings, every error a [`FrameError`] of the delta kind.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn malformed(what: &str, problem: &str) -> FrameError {
        FrameError::Malformed {
            kind: "delta",
            detail: format!("{what}: {problem}"),
        }
    }

    /// The next varint; `what` names it in errors. Refuses a varint cut
    /// short, one above `u64::MAX`, and one not in its shortest form (a
    /// last byte of 0 after others), so that every value has one encoding.
    fn varint(&mut self, what: &str) -> Result<u64, FrameError> {
        let mut value = 0u64;
        for (i, &byte) in self.bytes.iter().take(VARINT_BYTES_MAX).enumerate() {
            if i == VARINT_BYTES_MAX - 1 && byte > 1 {
                return Err(Self::malformed(what, "varint above u64::MAX"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                if byte == 0 && i > 0 {
                    return Err(Self::malformed(what, "varint not in its shortest form"));
                }
                self.bytes = &self.bytes[i + 1..];
                return Ok(value);
            }
        }
        // Every 10th byte returned above: the input ended first.
        Err(Self::malformed(what, "the frame ends inside a varint"))
    }

    /// Refuses a count of events the bytes left cannot hold, at
    /// [`EVENT_BYTES_MIN`] bytes each.
    fn check_fits(&self, field: &'static str, count: u64) -> Result<(), FrameError> {
        let bytes_left = self.bytes.len();
        if count.saturating_mul(EVENT_BYTES_MIN as u64) > bytes_left as u64 {
            return Err(FrameError::CountAboveBytes {
                field,
                count,
                bytes_left,
            });
        }
        Ok(())
    }

    /// The next `len` bytes, refused before anything is read if fewer are
    /// left.
    fn take(&mut self, field: &'static str, len: u64) -> Result<&'a [u8], FrameError> {
        let bytes_left = self.bytes.len();
        if len > bytes_left as u64 {
            return Err(FrameError::CountAboveBytes {
                field,
                count: len,
                bytes_left,
            });
        }
        let (taken, rest) = self.bytes.split_at(len as usize);
        self.bytes = rest;
        Ok(taken)
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
            [
                0x0c, 0, 0, 0, 0x01, 0x00, 0x01, 0x02, 0x05, 0x01, 0x0a, 0xe8, 0x07, 0x02, 0x68,
                0x69
            ]
        );
        // Two writers interleaved, a floor, a clock stepping back.
        let event = |stream, seq, lamport, time_ms, payload: &'static [u8]| Event {
            stream: StreamId::new(stream),
            seq,
            lamport,
            time_ms,
            payload: Bytes::from_static(payload),
        };
        let interleaved = Frame::Delta(Delta {
            floor: vv(&[(2, 8)]),
            events: vec![
                event(7, 3, 20, 5000, b"a"),
                event(2, 9, 21, 5010, b"b"),
                event(7, 4, 22, 4990, b"c"),
                event(2, 10, 25, 5020, b""),
            ],
        });
        let bytes = encode(&interleaved).unwrap();
        #[rustfmt::skip]
        let expected = [
            0x1b, 0, 0, 0,
            0x01,
            0x01, 0x02, 0x08,
            0x04,
            0x02, 0x09, 0x02,
            0x14, 0x92, 0x27, 0x01, 0x62,
            0x03, 0x14, 0x00,
            0x07, 0x03, 0x02,
            0x13, 0x27, 0x01, 0x61,
            0x01, 0x13, 0x01, 0x63,
        ];
        assert_eq!(bytes, expected);
        assert_eq!(decode(&bytes[LENGTH_PREFIX_BYTES..]), Ok(interleaved));
    }

    /// `docs/PROTOCOL.md` states that a delta of one event takes at most
    /// 327,709 bytes besides its payload, so payloads up to 3,866,595 bytes
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
        let bytes = encode(&delta(3_866_595)).unwrap();
        assert_eq!(bytes.len(), LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX);
        assert_eq!(
            encode(&delta(3_866_596)),
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
        // Kind 1, an empty floor, the count, then a run (stream 1 from
        // seq 1) of one minimal event (lamport gap, time, empty payload)
        // where 8193 should be.
        let mut payload = vec![1, 0];
        payload.extend(postcard::to_stdvec(&((DELTA_EVENTS_MAX + 1) as u64)).unwrap());
        payload.extend([1, 1, 1, 0, 0, 0]);
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

    fn event(stream: u64, seq: u64, lamport: u64, time_ms: u64) -> Event {
        Event {
            stream: StreamId::new(stream),
            seq,
            lamport,
            time_ms,
            payload: Bytes::from(format!("{stream}:{seq}")),
        }
    }

    fn delta_of(events: Vec<Event>) -> Frame {
        Frame::Delta(Delta {
            floor: VersionVector::new(),
            events,
        })
    }

    fn round_trip(frame: &Frame) -> Result<Frame, FrameError> {
        let bytes = encode(frame)?;
        decode(&bytes[LENGTH_PREFIX_BYTES..])
    }

    /// A delta's seqs are implied and its lamport stamps are gaps, so what
    /// breaks the model (and a receiver's replica would refuse) cannot be
    /// written: the encoder says so instead of sending something else.
    #[test]
    fn a_delta_the_layout_cannot_carry_is_not_encoded() {
        let cases = [
            (
                "a hole",
                vec![event(1, 1, 1, 0), event(1, 3, 2, 0)],
                "follows seq 1",
            ),
            (
                "seqs out of order",
                vec![event(1, 2, 2, 0), event(1, 1, 1, 0)],
                "follows seq 2",
            ),
            (
                "a seq twice",
                vec![event(1, 1, 1, 0), event(1, 1, 2, 0)],
                "follows seq 1",
            ),
            (
                "a lamport stamp repeated",
                vec![event(1, 1, 5, 0), event(1, 2, 5, 0)],
                "not above 5",
            ),
            (
                "a lamport stamp falling",
                vec![event(1, 1, 5, 0), event(1, 2, 4, 0)],
                "not above 5",
            ),
            (
                "a lamport stamp of 0",
                vec![event(2, 1, 1, 0), event(1, 1, 0, 0)],
                "stamp 0, not above 0",
            ),
            (
                "a seq past u64::MAX",
                vec![event(1, u64::MAX, 1, 0), event(1, 0, 2, 0)],
                "follows seq 18446744073709551615",
            ),
        ];
        for (name, events, says) in cases {
            match encode(&delta_of(events)) {
                Err(FrameError::Encode {
                    kind: "delta",
                    detail,
                }) => {
                    assert!(detail.contains(says), "{name}: {detail}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    /// The lamport field is the gap above the previous stamp in the run
    /// less one (above 0 for the first event), so a gap of 0 is the next
    /// stamp: no byte string can say that a stamp stands still or falls.
    #[test]
    fn a_lamport_gap_of_zero_is_the_next_stamp() {
        // Kind 1, no floor, 3 events: stream 5 from seq 1, gaps 0, 0, 4.
        let payload = [1, 0, 3, 5, 1, 3, 0, 0, 0, 0, 0, 0, 4, 0, 0];
        let Ok(Frame::Delta(delta)) = decode(&payload) else {
            panic!("{:?}", decode(&payload));
        };
        let stamps: Vec<(u64, u64)> = delta.events.iter().map(|e| (e.seq, e.lamport)).collect();
        assert_eq!(stamps, [(1, 1), (2, 2), (3, 7)]);
    }

    /// The ends of every range: seqs up to `u64::MAX`, lamport stamps up
    /// to `u64::MAX`, and times that jump across the whole `u64` range
    /// (their differences wrap, so every step has an encoding: one of 2^63
    /// is `i64::MIN`).
    #[test]
    fn seqs_lamports_and_times_at_their_limits_round_trip() {
        let frame = delta_of(vec![
            event(u64::MAX, u64::MAX - 2, 1, 0),
            event(u64::MAX, u64::MAX - 1, 2, u64::MAX),
            event(u64::MAX, u64::MAX, u64::MAX, 0),
            event(0, 0, u64::MAX - 1, 1 << 63),
            event(0, 1, u64::MAX, 0),
        ]);
        let Frame::Delta(delta) = &frame else {
            unreachable!()
        };
        let mut sorted = delta.events.clone();
        sorted.sort_by_key(|e| (e.lamport, e.stream));
        assert_eq!(round_trip(&frame), Ok(delta_of(sorted)));
        // One event at seq u64::MAX, alone in its run.
        let frame = delta_of(vec![event(3, u64::MAX, u64::MAX, u64::MAX)]);
        assert_eq!(round_trip(&frame), Ok(frame));
    }

    #[test]
    fn zigzag_maps_small_magnitudes_to_small_numbers_and_back() {
        let pairs = [
            (0, 0),
            (-1, 1),
            (1, 2),
            (-2, 3),
            (i64::MAX, u64::MAX - 1),
            (i64::MIN, u64::MAX),
        ];
        for (signed, unsigned) in pairs {
            assert_eq!(zigzag(signed), unsigned);
            assert_eq!(unzigzag(unsigned), signed);
        }
    }

    /// Every value has one encoding: a varint longer than its shortest
    /// form, or above `u64::MAX`, is refused, so a delta that decodes
    /// re-encodes to the very bytes it came from.
    #[test]
    fn delta_varints_are_read_in_their_shortest_form_only() {
        let malformed = |payload: &[u8], says: &str| match decode(payload) {
            Err(FrameError::Malformed {
                kind: "delta",
                detail,
            }) => {
                assert!(detail.contains(says), "{payload:?}: {detail}");
            }
            other => panic!("{payload:?}: {other:?}"),
        };
        // An empty delta whose count 0 is written in two bytes.
        malformed(
            &[1, 0, 0x80, 0x00],
            "event count: varint not in its shortest form",
        );
        // Stream 1 written in two bytes.
        malformed(
            &[1, 0, 1, 0x81, 0x00, 1, 1, 0, 0, 0],
            "stream: varint not in its shortest form",
        );
        // A first seq of 2^64 (a 10th byte of 2), and of eleven bytes.
        let mut payload = vec![1, 0, 1, 1];
        payload.extend([0x80; 9]);
        payload.extend([0x02, 1, 0, 0, 0]);
        malformed(&payload, "first seq: varint above u64::MAX");
        let mut payload = vec![1, 0, 1, 1];
        payload.extend([0xff; 10]);
        payload.extend([0x01, 1, 0, 0, 0]);
        malformed(&payload, "first seq: varint above u64::MAX");
        // Cut inside the time varint.
        malformed(
            &[1, 0, 1, 1, 1, 1, 0, 0x80, 0x80],
            "time: the frame ends inside a varint",
        );
        // The shortest forms of 0 and u64::MAX are fine.
        let mut payload = vec![1, 0, 1, 1];
        payload.extend([0xff; 9]);
        payload.extend([0x01, 1, 0, 0, 0]);
        let Ok(Frame::Delta(delta)) = decode(&payload) else {
            panic!("{:?}", decode(&payload));
        };
        assert_eq!(
            (delta.events[0].seq, delta.events[0].lamport),
            (u64::MAX, 1)
        );
        let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
        bytes.extend(&payload);
        assert_eq!(encode(&Frame::Delta(delta)), Ok(bytes));
    }

    /// A replica's delta interleaves its writers in `(lamport, stream)`
    /// order; the frame groups them by stream, and the receiver gets them
    /// back in that same order. A delta in another order (stream by
    /// stream, say) arrives in `(lamport, stream)` order, each stream's
    /// events still in seq order.
    #[test]
    fn interleaved_writers_round_trip_in_the_order_a_replica_sends() {
        let ids = [0x5eed_0001u64, 0x17, 0xffff_ffff, 3];
        let mut writers: Vec<meshlog_replica::Replica> = ids
            .iter()
            .map(|&id| meshlog_replica::Replica::new(StreamId::new(id)))
            .collect();
        let mut rng = crate::rng::SplitMix64::new(0xf4a3e);
        for i in 0..400u64 {
            let w = rng.below(ids.len() as u64) as usize;
            // Wall clocks that step back now and then.
            let time_ms = 1_750_000_000_000 + i * 7 - rng.below(3) * 20;
            let payload = vec![i as u8; rng.below(40) as usize];
            writers[w].append_at(Bytes::from(payload), time_ms).unwrap();
            // Writers see each other's events now and then, so their
            // clocks interleave.
            if rng.below(3) == 0 {
                let target = rng.below(ids.len() as u64) as usize;
                let delta = writers[w].delta_for(&writers[target].marks(), usize::MAX);
                writers[target].apply(&delta).unwrap();
            }
        }
        for w in 1..writers.len() {
            let delta = writers[w].delta_for(&writers[0].marks(), usize::MAX);
            writers[0].apply(&delta).unwrap();
        }
        let delta = writers[0].delta_for(&VersionVector::new(), usize::MAX);
        assert_eq!(delta.events.len(), 400);
        let streams_switch = delta
            .events
            .windows(2)
            .filter(|pair| pair[0].stream != pair[1].stream)
            .count();
        assert!(streams_switch > 100, "{streams_switch} switches");
        let frame = Frame::Delta(delta.clone());
        assert_eq!(round_trip(&frame), Ok(frame));

        // Stream by stream, and backwards across streams.
        let mut by_stream = delta.events.clone();
        by_stream.sort_by_key(|e| std::cmp::Reverse(e.stream));
        assert_ne!(by_stream, delta.events);
        assert_eq!(round_trip(&delta_of(by_stream)), Ok(Frame::Delta(delta)));
    }
}
