//! [`FrameError`]: every way a frame fails to encode or decode.
//!
//! One enum for the whole format, in a file of its own because every other
//! part of `frame` returns it and none of them owns it: a caller (a
//! session, the fuzz checks) matches one type whatever layer of a frame was
//! wrong, and each variant carries what that caller needs to act (the
//! limit, the count, the stream).

use meshlog_cursor::StreamId;

// Named by the variants' docs only.
#[cfg(doc)]
use super::{DELTA_EVENTS_MAX, FRAME_BYTES_MAX, PROTOCOL_VERSION};

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
        /// The frame limit: [`FRAME_BYTES_MAX`] unless a session raised it.
        max: usize,
    },
    /// A whole frame given to [`decode`](super::decode) holds fewer bytes
    /// than its length prefix announces (or not even a prefix).
    #[error("frame of {len} bytes is cut short: its prefix announces {needed} bytes")]
    Truncated {
        /// The bytes given.
        len: usize,
        /// The bytes the prefix announces, itself included (the prefix
        /// alone if it is incomplete).
        needed: usize,
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
    /// disagree (`kind` is `frame` when bytes follow a whole frame given to
    /// [`decode`](super::decode)).
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
    /// A delta announces more than the bytes left in it can hold: its
    /// payload lengths (`field` = `payloads`) summing past the bytes left
    /// after its columns. Refused before any payload is copied.
    #[error("a delta frame's {field} count of {count} does not fit the {bytes_left} bytes left")]
    CountAboveBytes {
        /// What the count counts: `payloads`, the sum of the payload
        /// lengths read so far.
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
    /// one, plus the event's gap) overflows a `u64`, or a run's first
    /// stamp (a difference from the previous run's first) comes to 0.
    #[error("delta event {stream}:{seq}: lamport stamp overflows a u64 or is 0")]
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
    /// A seal of a delta's seals section is not canonical: its key is not
    /// a valid writer key, its base flag is neither 0 nor 1, or its stream
    /// does not follow the seal before it (one seal per stream, streams
    /// strictly ascending). Whether it vouches for its run is the
    /// replica's to judge, after decoding.
    #[error("seal of stream {stream} in a delta frame is not canonical: {detail}")]
    BadSeal {
        /// The seal's stream.
        stream: StreamId,
        /// What is wrong.
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
    /// The frame error inside an I/O error from
    /// `meshlog_sync::frame::FrameReader`, if that is
    /// what it is.
    pub fn of_io(error: &std::io::Error) -> Option<&FrameError> {
        error.get_ref()?.downcast_ref::<FrameError>()
    }
}
