//! Wire frames: the messages two replicas exchange, their encoding and the
//! length prefix around it.
//!
//! A frame on the wire is a 4-byte little-endian payload length followed by
//! the payload: the frame's kind, then its content. Hellos, acks,
//! heartbeats and a delta's floor are postcard encodings; a delta's events
//! are written by hand, grouped into one run per stream with seqs implied
//! and lamports and times as differences. The byte format is specified in
//! `docs/PROTOCOL.md`; this module and its submodules are its only
//! implementation.
//!
//! # Layout
//!
//! Cut along the format's seams, so that each part of the byte layout has
//! one file to read, and the public surface stays here, at
//! `meshlog_sync::frame::...`:
//!
//! - this file: [`Frame`], [`Hello`], the protocol version, the limits
//!   ([`FRAME_BYTES_MAX`], [`DELTA_EVENTS_MAX`], [`EVENT_BYTES_MIN`],
//!   [`LENGTH_PREFIX_BYTES`]) and the frame kinds' numbers; it re-exports
//!   what the submodules make public.
//! - `envelope`: the length prefix ([`split_frame`]) and a payload as a
//!   whole ([`encode`], [`decode`]): the kind varint, the hello's version
//!   check, and the dispatch to the two codecs below.
//! - `repr`: the private serde types postcard writes (a hello's fields, a
//!   version vector), converted to and from the domain types here, and the
//!   check of their vectors' counts that walks their layout before decoding.
//! - `event_runs`: the hand-written codec of a delta's events (per-stream
//!   runs, seqs implied, lamports and times as differences, shortest-form
//!   varints), which postcard's layout could not make this compact.
//! - `reader`: [`FrameReader`], the cancel-safe reader of whole frames from
//!   a tokio byte stream; the only part that does I/O.
//! - `error`: [`FrameError`], the one error every part returns.
//!
//! Each file keeps its unit tests; the tests of the format as a whole (every
//! kind round trips, the examples of `docs/PROTOCOL.md` byte for byte, the
//! frame size bound) are at the end of this one.
//!
//! # Decoding is total
//!
//! Any byte string gives a [`Frame`] or a typed [`FrameError`], never a
//! panic. A length prefix is checked against [`FRAME_BYTES_MAX`] before
//! anything is allocated for the payload. Every count a payload announces
//! (a vector's streams, a delta's events, a run's events, a payload's
//! length) is checked against its limit
//! ([`STREAMS_MAX`], [`DELTA_EVENTS_MAX`]) and against the bytes left
//! before any of its elements is decoded. Vectors are grown as their entries are read, never
//! reserved by a count read from the input; a delta's events are reserved
//! once, by a count already known to fit the bytes left at
//! [`EVENT_BYTES_MIN`] bytes an event. A payload decodes into at most a
//! small multiple of its length (an event of 3 bytes into 64), and never
//! into more than its limits allow, however small its elements.
//!
//! The serde types are private: [`Frame`] carries the domain types of
//! `meshlog-cursor` and `meshlog-replica` (which are deliberately not
//! `Serialize`), converted at this boundary.
//!
//! # Example
//!
//! ```
//! use meshlog_cursor::{StreamId, VersionVector};
//! use meshlog_sync::frame::{self, Frame};
//!
//! let marks: VersionVector = [(StreamId::new(1), 5)].into_iter().collect();
//! let bytes = frame::encode(&Frame::Ack { marks: marks.clone() })?;
//! let (payload, used) = frame::split_frame(&bytes)?.expect("one whole frame");
//! assert_eq!(used, bytes.len());
//! assert_eq!(frame::decode_payload(payload)?, Frame::Ack { marks: marks.clone() });
//! assert_eq!(frame::decode(&bytes)?, Frame::Ack { marks });
//! # Ok::<(), meshlog_sync::FrameError>(())
//! ```

// Named by the docs here only.
#[cfg(doc)]
use meshlog_cursor::STREAMS_MAX;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::Delta;

mod envelope;
mod error;
mod event_runs;
mod reader;
mod repr;

pub use envelope::{decode, decode_payload, encode, encode_payload, split_frame};
pub use error::FrameError;
pub use reader::FrameReader;

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

#[cfg(test)]
mod tests {
    // The format as a whole: every kind round trips through the envelope,
    // the examples of `docs/PROTOCOL.md` come out byte for byte, and the
    // largest payload the doc promises always fits lands on the limit.
    use bytes::Bytes;
    use meshlog_cursor::STREAMS_MAX;
    use meshlog_replica::Event;

    use super::*;

    pub(super) fn vv(entries: &[(u64, u64)]) -> VersionVector {
        entries
            .iter()
            .map(|&(s, seq)| (StreamId::new(s), seq))
            .collect()
    }

    pub(super) fn sample_frames() -> Vec<Frame> {
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
            assert_eq!(decode_payload(payload).unwrap(), frame);
            assert_eq!(decode(&bytes).unwrap(), frame);
        }
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
        assert_eq!(decode(&bytes), Ok(interleaved));
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
}
