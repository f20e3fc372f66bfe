//! Wire frames: the messages two replicas exchange, their encoding and the
//! length prefix around it.
//!
//! A frame on the wire is a 4-byte little-endian payload length followed by
//! the payload: the frame's kind, then its content. Hellos, acks,
//! heartbeats and a delta's floor are postcard encodings; a delta's events
//! are written by hand: one run header per stream with seqs implied, then
//! columns of lamport gaps, times and payload lengths in repeat and literal
//! runs, then the payloads, then its sections (the writers' seals). The
//! byte format is specified in
//! `docs/PROTOCOL.md`; this module and its submodules are its only
//! implementation.
//!
//! # Layout
//!
//! Cut along the format's seams, so that each part of the byte layout has
//! one file to read, and the public surface stays here, at
//! `meshlog_sync_core::frame::...`:
//!
//! - this file: [`Frame`], [`Hello`], the protocol version, the limits
//!   ([`FRAME_BYTES_MAX`], [`DELTA_EVENTS_MAX`], [`LENGTH_PREFIX_BYTES`]) and the frame kinds' numbers; it re-exports
//!   what the submodules make public.
//! - `envelope`: the length prefix ([`split_frame`]) and a payload as a
//!   whole ([`encode`], [`decode`]): the kind varint, the hello's version
//!   check, and the dispatch to the two codecs below.
//! - `repr`: the private serde types postcard writes (a hello's fields, a
//!   version vector), converted to and from the domain types here, and the
//!   check of their vectors' counts that walks their layout before decoding.
//! - `event_runs`: the hand-written codec of a delta's events (per-stream
//!   run headers, seqs implied, columns in repeat and literal runs of lamport gaps,
//!   times and payload lengths, shortest-form varints), which postcard's layout could not make this compact.
//! - `sections`: what follows a delta's payloads, tagged and
//!   length-bounded (an unknown tag skipped): the seals over its runs, in
//!   the replica's seal encodings.
//! - the cancel-safe reader of whole frames from a tokio byte stream,
//!   `FrameReader`, is not here: it does I/O, so it lives in the driver
//!   crate (`meshlog_sync::frame::FrameReader`), on [`peek_len`].
//! - `against`: [`HelloAgainst`], a hello written against a checkpoint,
//!   and the pure functions that write and rebuild it.
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
//! length, a section's length, a delta's seals) is checked against its
//! limit ([`STREAMS_MAX`], [`DELTA_EVENTS_MAX`], one seal per run) and
//! against the bytes left before any of its elements is decoded. Vectors
//! are grown as their entries are read, never reserved by a count read
//! from the input; a delta's events are reserved once, by a count already
//! checked against [`DELTA_EVENTS_MAX`], and only after the whole delta
//! (run headers, columns, payloads, sections) is known to be well formed:
//! a delta decodes into at
//! most 512 KiB of events besides its payloads, whatever its size (a
//! column's repeat lets a few bytes stand for many events), and a malformed
//! one into nothing more than its run headers.
//!
//! The serde types are private: [`Frame`] carries the domain types of
//! `meshlog-cursor` and `meshlog-replica` (which are deliberately not
//! `Serialize`), converted at this boundary.
//!
//! # Example
//!
//! ```
//! use meshlog_cursor::{StreamId, VersionVector};
//! use meshlog_sync_core::frame::{self, Frame, MarksDiff, Receipt};
//!
//! // Delta 3 arrived; the sender holds the peer's marks 1; its own marks 2
//! // are its marks 1 with stream 1 at seq 5.
//! let changes: VersionVector = [(StreamId::new(1), 5)].into_iter().collect();
//! let ack = Frame::Ack(Receipt {
//!     received: 3,
//!     seen: 1,
//!     marks: MarksDiff { number: 2, base: 1, changes },
//! });
//! let bytes = frame::encode(&ack)?;
//! let (payload, used) = frame::split_frame(&bytes)?.expect("one whole frame");
//! assert_eq!(used, bytes.len());
//! assert_eq!(frame::decode_payload(payload)?, ack);
//! assert_eq!(frame::decode(&bytes)?, ack);
//! # Ok::<(), meshlog_sync_core::FrameError>(())
//! ```

// Named by the docs here only.
#[cfg(doc)]
use meshlog_cursor::STREAMS_MAX;
use meshlog_cursor::{CheckpointName, StreamId, VersionVector};
use meshlog_replica::Delta;

mod against;
mod envelope;
mod error;
mod event_runs;
mod repr;
mod sections;

pub use against::HelloAgainst;
pub(crate) use envelope::encode_delta_columns_limited;
pub use envelope::{
    decode, decode_incoming, decode_payload, decode_payload_limited, encode, encode_limited,
    encode_payload, peek_len, split_frame, split_frame_limited, Incoming,
};
pub use error::FrameError;
pub(crate) use sections::{floor_proofs_bytes_max, ONE_RUN_SECTIONS_BYTES_MAX};

/// The protocol version this crate speaks, carried in every [`Hello`]. Peers
/// speaking another version are refused after their hello
/// ([`FrameError::ProtocolVersion`]); ours reaches them first, so they can
/// say why too.
///
/// Version 4 ends a delta with sections, tagged and length-bounded, the
/// first of which carries the writers' seals; version 3 writes a delta's
/// event fields as columns in repeat and literal runs and its payloads back
/// to back; version 2 numbered delta frames,
/// acknowledged the last one received, and carried marks in acks and
/// heartbeats as a difference from marks the receiver already holds
/// (`docs/PROTOCOL.md`).
pub const PROTOCOL_VERSION: u16 = 4;

/// The largest frame payload every peer takes, in bytes (the length prefix
/// excluded): 4 MiB, the default of `SessionConfig::frame_bytes_max` and
/// its floor.
///
/// It must hold the largest delta a session sends: one event of up to the
/// replica's `payload_bytes_max` (1 MiB by default) or a byte budget of
/// events (see `SessionConfig::delta_bytes_max`), plus a floor vector of up
/// to [`STREAMS_MAX`] entries (at most 20 bytes each, about 320 KiB). Two
/// sides that both raise `frame_bytes_max` (announced in their hellos)
/// exchange frames up to the smaller of the two, so that events of larger
/// payloads travel between them.
pub const FRAME_BYTES_MAX: usize = 4 << 20;

/// The largest `SessionConfig::frame_bytes_max`: 1 GiB. A receiver buffers
/// a whole frame before decoding it, so this is also the most one session
/// may buffer.
pub const FRAME_BYTES_CEILING: usize = 1 << 30;

/// The most events one delta frame may carry: 8192.
///
/// The bound on what one frame decodes into. A delta's columns write a
/// repeated value once, so a few bytes can stand for many small events:
/// without this bound a 4 MiB delta could decode into millions of events
/// (64 bytes each in memory) in every inbound session at once. With it a
/// delta decodes into at most 512 KiB of events besides its payloads.
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

/// Each frame kind's number: the varint that opens every payload (a varint
/// below 128 is one byte), as a postcard enum's variant index would.
mod tag {
    pub const HELLO: u32 = 0;
    pub const DELTA: u32 = 1;
    pub const ACK: u32 = 2;
    pub const HEARTBEAT: u32 = 3;
    pub const ROUTES: u32 = 4;
    pub const BARE_ACK: u32 = 5;
    pub const CHECKPOINT: u32 = 6;
    pub const CHECKPOINT_WANT: u32 = 7;
    pub const STATEMENT: u32 = 8;
    pub const HELLO_AGAINST: u32 = 9;
}

/// One message between two replicas.
///
/// The session protocol (see `docs/PROTOCOL.md`): each side opens with a
/// [`Hello`]; then sends numbered [`Frame::Delta`]s with what the other
/// misses, a [`Frame::Ack`] (or a [`Frame::BareAck`]) after receiving
/// deltas, and a [`Frame::Heartbeat`] every tick and for a repair. Acks
/// and heartbeats carry a [`Receipt`]: the last delta number received and
/// the sender's marks (current in a heartbeat, possibly behind in an ack),
/// from which the receiver learns what arrived and re-sends only what was
/// lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame {
    /// The first frame of each side: who it is, which protocol it speaks, and
    /// what it holds. Re-sent on every tick until the peer shows it arrived.
    Hello(Hello),
    /// Events the receiver misses (per stream contiguous from the receiver's
    /// marks as the sender knew them), and floors it must record.
    Delta {
        /// The frame's number in its session: 1 for the first delta a side
        /// sends, then one more for each. Acknowledged by
        /// [`Receipt::received`].
        number: u64,
        /// The events and floors.
        delta: Delta,
    },
    /// Sent after receiving deltas, each applied whole: what arrived, and
    /// the sender's marks, which may lag behind what those deltas carried
    /// (the receiver counts that as held, pending, until a receipt's marks
    /// show it).
    Ack(Receipt),
    /// The periodic re-exchange, every tick (every other tick on a quiet
    /// link, once three in a row said the same), and the receipt of a repair (a
    /// delta after a gap, events held above a hole or dropped): the same
    /// fields as an ack, with the sender's current marks, sent whether or
    /// not deltas arrived. An idle one is a few bytes.
    Heartbeat(Receipt),
    /// Which streams the sender wants pushed on this session: those it
    /// receives through another session are asked quiet (so an event
    /// reaches it once in a mesh with cycles), and loud again when that
    /// session ends or lags. Sent only when its routes change.
    Routes(Routes),
    /// An ack without marks: the highest delta number received (at least
    /// 1), every delta up to it applied whole. Sent instead of an
    /// [`Frame::Ack`] on a session that shares a routes table, where the
    /// marks an ack would carry (every stream moving in the mesh) tell the
    /// peer nothing it sends by; the tick's heartbeat carries them.
    BareAck(u64),
    /// A checkpoint the sender keeps (`docs/TOKEN.md`, "Version 2"), as a
    /// difference from one it sent or received before on the session.
    /// Sent only to a peer whose hello says it skips kinds it does not
    /// know ([`Hello::skips_unknown_kinds`]), on a session configured for
    /// it (`SessionConfig::checkpoints`, on by default): a peer of
    /// protocol 4 built before this kind ends the session on it.
    Checkpoint(CheckpointFrame),
    /// Asks the peer for the whole vector of a checkpoint it sent as a
    /// difference from a parent the sender does not hold.
    CheckpointWant(CheckpointName),
    /// A compaction statement the sender keeps, offered to a peer that
    /// holds the stream past the statement's floor (a delta carries a
    /// statement only with a floor, which goes only to a peer behind it):
    /// the receiver's replica erases what it holds up to the floor where
    /// the statement has authority there (`docs/SIGNING.md`, "Floors with
    /// an authority"), and otherwise takes nothing and goes on. Unnumbered
    /// and sent once per session and statement, only to a peer whose
    /// hello says it skips kinds it does not know.
    Statement(meshlog_replica::SignedCompaction),
    /// A hello whose marks and floor are written against a checkpoint
    /// (`docs/PROTOCOL.md`, "A hello against a checkpoint"): a writer
    /// retired and compacted before it costs nothing. Sent only to a peer
    /// whose hello says it reads one ([`Hello::takes_hello_against`]),
    /// in place of a [`Frame::Hello`].
    HelloAgainst(HelloAgainst),
}

impl Frame {
    /// The frame's kind, for logs and errors: `hello`, `delta`, `ack`,
    /// `heartbeat`, `routes`, `bare ack`, `checkpoint`, `checkpoint want`,
    /// `statement` or `hello against`.
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Hello(_) => "hello",
            Frame::Delta { .. } => "delta",
            Frame::Ack(_) => "ack",
            Frame::Heartbeat(_) => "heartbeat",
            Frame::Routes(_) => "routes",
            Frame::BareAck(_) => "bare ack",
            Frame::Checkpoint(_) => "checkpoint",
            Frame::CheckpointWant(_) => "checkpoint want",
            Frame::Statement(_) => "statement",
            Frame::HelloAgainst(_) => "hello against",
        }
    }

    /// A delta frame numbered `number`.
    pub fn delta(number: u64, delta: Delta) -> Frame {
        Frame::Delta { number, delta }
    }
}

/// What an ack or a heartbeat says: which of the receiver's delta frames
/// arrived, which of its marks the sender holds, and the sender's own
/// marks as a difference.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Receipt {
    /// The highest delta number received from the peer (0: none yet).
    pub received: u64,
    /// The number of the latest of the peer's marks the sender holds (1:
    /// those of the peer's hello; 0: none). The peer may send its next
    /// marks as a difference from those.
    pub seen: u64,
    /// The sender's marks.
    pub marks: MarksDiff,
}

/// A replica's marks as a difference from marks its peer already holds.
///
/// Each side numbers the marks it sends (its hello's are number 1; a new
/// number for each change after). Marks only rise within a session, so
/// whatever the receiver holds of the sender's marks numbered `base` or
/// later, joined with `changes`, is exactly the marks numbered `number`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MarksDiff {
    /// The number of these marks (at least 1).
    pub number: u64,
    /// The number of the marks they differ from, at most `number`; 0 is
    /// the empty vector (`changes` is then the whole vector).
    pub base: u64,
    /// Every stream whose seq is above its seq in marks `base`, with its
    /// seq now. Empty exactly when `base` is `number`.
    pub changes: VersionVector,
}

/// A change of the streams a replica wants pushed by one peer (see
/// `docs/PROTOCOL.md`, "Routes"). A stream is loud (pushed) until asked
/// quiet; each stream follows the latest-numbered routes frame naming it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Routes {
    /// The number of this routes frame in its session, from 1: a stream
    /// named by a frame older than the last applied for it is left alone
    /// (frames may be reordered).
    pub number: u64,
    /// Streams not to push to the sender, strictly ascending: it receives
    /// them through another session.
    pub quiet: Vec<StreamId>,
    /// Streams to push again, strictly ascending, none also quiet.
    pub loud: Vec<StreamId>,
}

/// A checkpoint on the wire: its name and its vector, as the streams where
/// it is above a parent checkpoint (the vector is `parent ⊔ changes`: a
/// checkpoint is sent as a difference only from one it dominates), or
/// whole. The receiver recomputes the name from the vector and refuses a
/// vector that does not have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFrame {
    /// The checkpoint's name, as the sender claims it.
    pub name: CheckpointName,
    /// The checkpoint `changes` are relative to, sent or received before
    /// on this session; `None`: `changes` is the whole vector.
    pub parent: Option<CheckpointName>,
    /// Every stream whose seq is above the parent's, with its seq (with
    /// no parent, every stream of the vector).
    pub changes: VersionVector,
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
    /// The largest frame payload the sender takes, in bytes: its
    /// `SessionConfig::frame_bytes_max`, at least [`FRAME_BYTES_MAX`]
    /// (a hello announcing less is malformed). Each side sends frames up
    /// to the smaller of both sides' limits ([`Hello::frame_limit`]).
    /// Its lowest bit is [`HELLO_SKIPS_UNKNOWN_KINDS`]: set, the sender
    /// skips frame kinds it does not know; its second is
    /// [`HELLO_TAKES_HELLO_AGAINST`]: set, it reads a [`HelloAgainst`].
    pub frame_bytes_max: u32,
}

/// The lowest bit of a hello's `frame_bytes_max`: set, the sender skips a
/// frame of a kind it does not know (and goes on) where older peers end
/// the session, so a kind added later may be sent to it.
///
/// A flag in a field every protocol-4 peer reads and none refuses: a
/// hello of another version, or with a field more, ends the session at a
/// peer built before the flag, and a version bump would cut every such
/// peer off. An older peer reads the flag as a limit one byte larger,
/// which the sender takes; sending to a flagged peer, a side counts the
/// limit without it ([`Hello::frame_limit`]). A peer of an older build
/// whose configured limit is odd looks flagged (the node's default and
/// every power of two are even).
pub const HELLO_SKIPS_UNKNOWN_KINDS: u32 = 1;

/// The second-lowest bit of a hello's `frame_bytes_max`: set, the sender
/// reads a hello against a checkpoint ([`HelloAgainst`], kind 9), asking
/// for the checkpoint by name if it does not keep it. So a peer that
/// reads the hello first may answer with its own against a checkpoint.
///
/// In the same field as [`HELLO_SKIPS_UNKNOWN_KINDS`], for the same
/// reason: an older peer reads it as a limit two bytes larger, and a
/// side counts the limit without both bits ([`Hello::frame_limit`]). A
/// peer of an older build whose configured limit has this bit set looks
/// as if it read one (the node's default and every power of two from 4
/// up do not).
pub const HELLO_TAKES_HELLO_AGAINST: u32 = 2;

impl Hello {
    /// Whether the sender skips frame kinds it does not know
    /// ([`HELLO_SKIPS_UNKNOWN_KINDS`]): then a kind it may not know
    /// (`Frame::Checkpoint` and `Frame::CheckpointWant` for a peer built
    /// before them) may be sent to it.
    pub fn skips_unknown_kinds(&self) -> bool {
        self.frame_bytes_max & HELLO_SKIPS_UNKNOWN_KINDS != 0
    }

    /// Whether the sender reads a hello against a checkpoint
    /// ([`HELLO_TAKES_HELLO_AGAINST`]): then a side that has its hello
    /// may answer with one.
    pub fn takes_hello_against(&self) -> bool {
        self.frame_bytes_max & HELLO_TAKES_HELLO_AGAINST != 0
    }

    /// The largest frame payload to send the sender: its announced limit
    /// without the flag bits.
    pub fn frame_limit(&self) -> usize {
        (self.frame_bytes_max & !(HELLO_SKIPS_UNKNOWN_KINDS | HELLO_TAKES_HELLO_AGAINST)) as usize
    }
}

/// The most bytes `vector` takes on the wire: its count and every entry,
/// each varint at its longest (a bound, not the exact length).
pub(crate) fn vector_bytes_max(vector: &VersionVector) -> usize {
    3 + 20 * vector.len()
}

#[cfg(test)]
mod tests {
    // The format as a whole: every kind round trips through the envelope,
    // the examples of `docs/PROTOCOL.md` come out byte for byte, and the
    // largest payload the doc promises always fits lands on the limit.
    use bytes::Bytes;
    use meshlog_cursor::STREAMS_MAX;
    use meshlog_replica::{ChainHash, Event, RunSeal, Seal, WriterKey};

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
                frame_bytes_max: FRAME_BYTES_MAX as u32,
            }),
            Frame::delta(
                1,
                Delta {
                    floor_proofs: Default::default(),
                    floor: vv(&[(2, 4)]),
                    events: vec![Event {
                        stream: StreamId::new(2),
                        seq: 5,
                        lamport: 11,
                        time_ms: 1_700_000_000_000,
                        payload: Bytes::from_static(b"hello"),
                    }],
                    seals: Vec::new(),
                },
            ),
            Frame::Ack(Receipt {
                received: u64::MAX,
                seen: 7,
                marks: MarksDiff {
                    number: u64::MAX,
                    base: 0,
                    changes: vv(&[(u64::MAX, u64::MAX)]),
                },
            }),
            Frame::Heartbeat(Receipt {
                received: 0,
                seen: 1,
                marks: MarksDiff {
                    number: 1,
                    base: 1,
                    changes: VersionVector::new(),
                },
            }),
            Frame::Routes(Routes {
                number: u64::MAX,
                quiet: vec![StreamId::new(1), StreamId::new(u64::MAX)],
                loud: vec![StreamId::new(2)],
            }),
            Frame::Checkpoint(CheckpointFrame {
                name: CheckpointName::from_bytes([0xff; 16]),
                parent: Some(CheckpointName::from_bytes([0; 16])),
                changes: vv(&[(u64::MAX, u64::MAX)]),
            }),
            Frame::CheckpointWant(CheckpointName::from_bytes([7; 16])),
            statement_frame_example(),
            Frame::HelloAgainst(HelloAgainst {
                protocol: PROTOCOL_VERSION,
                stream: StreamId::new(u64::MAX),
                frame_bytes_max: u32::MAX,
                base: CheckpointName::from_bytes([0x11; 16]),
                marks: vv(&[(2, 5), (u64::MAX, u64::MAX)]),
                unfolded: vec![StreamId::new(3), StreamId::new(4)],
                floor: vv(&[(3, 2), (u64::MAX, 1)]),
            }),
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

    /// The name of the checkpoint of `entries`: the doc's examples carry
    /// true names.
    fn checkpoint_name(entries: &[(u64, u64)]) -> CheckpointName {
        meshlog_cursor::Checkpoint::new(vv(entries))
            .expect("named")
            .name()
    }

    /// The hex bytes of every example block of `docs/PROTOCOL.md`'s
    /// "Examples" section, in order: on each line of a fenced block, the
    /// leading two-digit hex tokens (the rest of the line says what they
    /// are).
    fn doc_examples() -> Vec<Vec<u8>> {
        let doc = include_str!("../../../../docs/PROTOCOL.md");
        let start = doc.find("### Examples").expect("an Examples section");
        let section = &doc[start..];
        let end = section[4..].find("\n## ").map_or(section.len(), |i| i + 4);
        let mut blocks = Vec::new();
        let mut current: Option<Vec<u8>> = None;
        for line in section[..end].lines() {
            if line.trim_start().starts_with("```") {
                match current.take() {
                    Some(block) => blocks.push(block),
                    None => current = Some(Vec::new()),
                }
                continue;
            }
            if let Some(block) = current.as_mut() {
                for token in line.split_whitespace() {
                    match u8::from_str_radix(token, 16) {
                        Ok(byte) if token.len() == 2 => block.push(byte),
                        _ => break,
                    }
                }
            }
        }
        blocks
    }

    /// The examples of `docs/PROTOCOL.md`, byte for byte: read from the
    /// doc itself, each must be the encoding of its frame here and decode
    /// back to it.
    #[test]
    fn the_protocol_doc_examples_are_exact() {
        let event = |stream, seq, lamport, time_ms, payload: &'static [u8]| Event {
            stream: StreamId::new(stream),
            seq,
            lamport,
            time_ms,
            payload: Bytes::from_static(payload),
        };
        let expected = [
            Frame::Hello(Hello {
                protocol: 4,
                stream: StreamId::new(0xb),
                marks: vv(&[(0xb, 3)]),
                floor: VersionVector::new(),
                frame_bytes_max: FRAME_BYTES_MAX as u32 | HELLO_SKIPS_UNKNOWN_KINDS,
            }),
            Frame::delta(
                1,
                Delta {
                    floor_proofs: Default::default(),
                    floor: VersionVector::new(),
                    events: vec![event(2, 5, 11, 1000, b"hi")],
                    seals: Vec::new(),
                },
            ),
            // Two writers interleaved, a floor, a clock stepping back.
            Frame::delta(
                2,
                Delta {
                    floor_proofs: Default::default(),
                    floor: vv(&[(2, 8)]),
                    events: vec![
                        event(7, 3, 20, 5000, b"a"),
                        event(2, 9, 21, 5010, b"b"),
                        event(7, 4, 22, 4990, b"c"),
                        event(2, 10, 25, 5020, b""),
                    ],
                    seals: Vec::new(),
                },
            ),
            // One writer's steady events: a pair or two per column.
            Frame::delta(
                3,
                Delta {
                    floor_proofs: Default::default(),
                    floor: VersionVector::new(),
                    events: vec![
                        event(3, 1, 1, 1000, b"a"),
                        event(3, 2, 2, 1010, b"b"),
                        event(3, 3, 3, 1020, b"c"),
                        event(3, 4, 4, 1030, b"d"),
                    ],
                    seals: Vec::new(),
                },
            ),
            // A sealed run: the writer of key 01 02 .. 20's first event.
            sealed_example(),
            Frame::Ack(Receipt {
                received: 4,
                seen: 2,
                marks: MarksDiff {
                    number: 3,
                    base: 2,
                    changes: vv(&[(1, 5)]),
                },
            }),
            Frame::Heartbeat(Receipt {
                received: 4,
                seen: 2,
                marks: MarksDiff {
                    number: 3,
                    base: 3,
                    changes: VersionVector::new(),
                },
            }),
            Frame::Routes(Routes {
                number: 1,
                quiet: vec![StreamId::new(2), StreamId::new(7)],
                loud: Vec::new(),
            }),
            Frame::Routes(Routes {
                number: 2,
                quiet: Vec::new(),
                loud: vec![StreamId::new(7)],
            }),
            Frame::BareAck(4),
            // A floor backed by the writer's statement and its hash.
            statement_example(),
            Frame::Checkpoint(CheckpointFrame {
                name: checkpoint_name(&[(1, 300), (2, 5), (0x9e37_79b9_7f4a_7c15, 1)]),
                parent: None,
                changes: vv(&[(1, 300), (2, 5), (0x9e37_79b9_7f4a_7c15, 1)]),
            }),
            Frame::Checkpoint(CheckpointFrame {
                name: checkpoint_name(&[(1, 302), (2, 5), (0x9e37_79b9_7f4a_7c15, 1)]),
                parent: Some(checkpoint_name(&[
                    (1, 300),
                    (2, 5),
                    (0x9e37_79b9_7f4a_7c15, 1),
                ])),
                changes: vv(&[(1, 302)]),
            }),
            Frame::CheckpointWant(checkpoint_name(&[
                (1, 302),
                (2, 5),
                (0x9e37_79b9_7f4a_7c15, 1),
            ])),
            // Delta 5's statement, offered alone.
            statement_frame_example(),
        ];
        let blocks = doc_examples();
        assert_eq!(blocks.len(), expected.len(), "{blocks:02x?}");
        for (block, frame) in blocks.iter().zip(&expected) {
            assert_eq!(&encode(frame).unwrap(), block, "{frame:?}");
            // A delta's events arrive grouped by stream.
            let mut arrives = frame.clone();
            if let Frame::Delta { delta, .. } = &mut arrives {
                delta.events.sort_by_key(|e| (e.stream, e.seq));
            }
            assert_eq!(decode(block), Ok(arrives));
        }
        // The idle heartbeat the doc promises is 10 bytes on the wire.
        assert_eq!(blocks[6].len(), 10);
    }

    /// The sealed delta of `docs/PROTOCOL.md`'s examples: number 4, one
    /// event of the writer whose secret key is `01 02 .. 20`
    /// (`docs/SIGNING.md`'s fixed vector: stream `5e644dd217aee78b`), seq
    /// 1, lamport 1, time 1000 ms, payload `"hi"`, sealed at seq 1 (no
    /// base: the run starts at seq 1).
    pub(super) fn sealed_example() -> Frame {
        let key = WriterKey::from_bytes(std::array::from_fn(|i| i as u8 + 1));
        let event = Event {
            stream: key.stream(),
            seq: 1,
            lamport: 1,
            time_ms: 1000,
            payload: Bytes::from_static(b"hi"),
        };
        let head = ChainHash::GENESIS.next(&event);
        Frame::delta(
            4,
            Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: vec![event],
                seals: vec![RunSeal {
                    key: key.public(),
                    seal: Seal::sign(&key, 1, head),
                    base: None,
                }],
            },
        )
    }

    /// The delta with a signed floor of `docs/PROTOCOL.md`'s examples:
    /// number 5, no events, floor `{0x5e644dd217aee78b: 1}` (the writer of
    /// [`sealed_example`] compacted its first event), with the writer's
    /// compaction statement at seq 1 and the chain hash there.
    pub(super) fn statement_example() -> Frame {
        let Frame::Delta { delta: sealed, .. } = sealed_example() else {
            unreachable!("a delta")
        };
        let key = WriterKey::from_bytes(std::array::from_fn(|i| i as u8 + 1));
        let hash = ChainHash::GENESIS.next(&sealed.events[0]);
        let statement = meshlog_replica::Compaction {
            stream: key.stream(),
            floor: 1,
            hash,
        };
        let mut delta = Delta {
            floor: [(key.stream(), 1)].into_iter().collect(),
            ..Delta::default()
        };
        delta
            .floor_proofs
            .statements
            .push(statement.sign_by_writer(&key));
        delta.floor_proofs.hashes.push((key.stream(), hash));
        Frame::delta(5, delta)
    }

    /// The statement of [`statement_example`] in a frame of its own.
    pub(super) fn statement_frame_example() -> Frame {
        let Frame::Delta { delta, .. } = statement_example() else {
            unreachable!("a delta")
        };
        Frame::Statement(delta.floor_proofs.statements[0])
    }

    /// A statement frame's body is one statement, exactly: short, long or
    /// with a signer that is no valid key, it is a typed error.
    #[test]
    fn a_statement_frame_is_exactly_one_statement() {
        let Frame::Statement(signed) = statement_frame_example() else {
            unreachable!("a statement")
        };
        let mut payload = vec![tag::STATEMENT as u8];
        payload.extend_from_slice(&signed.to_bytes());
        assert_eq!(decode_payload(&payload), Ok(Frame::Statement(signed)));
        let short = &payload[..payload.len() - 1];
        assert!(matches!(
            decode_payload(short),
            Err(FrameError::Malformed {
                kind: "statement",
                ..
            })
        ));
        let mut long = payload.clone();
        long.push(0);
        assert_eq!(
            decode_payload(&long),
            Err(FrameError::TrailingBytes {
                kind: "statement",
                len: 1
            })
        );
        // The signer key's bytes (after stream, floor and hash) all 0xff:
        // not a point.
        let mut bad_key = payload.clone();
        bad_key[1 + 48..1 + 80].fill(0xff);
        assert!(matches!(
            decode_payload(&bad_key),
            Err(FrameError::Malformed {
                kind: "statement",
                ..
            })
        ));
    }

    /// `docs/PROTOCOL.md` states that a delta of one event takes at most
    /// 327,903 bytes besides its payload, so payloads up to 3,866,401 bytes
    /// always fit a frame: the worst case (the largest floor vector, every
    /// varint at its longest, the run sealed with a base) lands exactly on
    /// the limit.
    #[test]
    fn the_largest_payload_that_always_fits_is_the_documented_one() {
        let floor: VersionVector = (0..STREAMS_MAX as u64)
            .map(|i| (StreamId::new(u64::MAX - i), u64::MAX))
            .collect();
        let key = WriterKey::from_bytes([7; 32]);
        let stream = StreamId::new(u64::MAX);
        let seal = RunSeal {
            key: key.public(),
            seal: Seal::sign_for(&key, stream, u64::MAX, ChainHash::from_bytes([1; 32])),
            base: Some(ChainHash::from_bytes([2; 32])),
        };
        let delta = |payload_len: usize| {
            Frame::delta(
                u64::MAX,
                Delta {
                    floor_proofs: Default::default(),
                    floor: floor.clone(),
                    events: vec![Event {
                        stream,
                        seq: u64::MAX,
                        lamport: u64::MAX,
                        time_ms: u64::MAX,
                        payload: Bytes::from(vec![0u8; payload_len]),
                    }],
                    seals: vec![seal],
                },
            )
        };
        let bytes = encode(&delta(3_866_401)).unwrap();
        assert_eq!(bytes.len(), LENGTH_PREFIX_BYTES + FRAME_BYTES_MAX);
        assert_eq!(
            encode(&delta(3_866_402)),
            Err(FrameError::TooLarge {
                len: FRAME_BYTES_MAX + 1,
                max: FRAME_BYTES_MAX
            })
        );
    }
}
