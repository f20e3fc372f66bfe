//! [`SessionState`] and [`LimitHit`]: what one peer's side of the
//! protocol knows and counts, published by its driver as it changes.

use std::time::Instant;

use meshlog_cursor::{StreamId, VersionVector};

// Named by the docs only.
#[cfg(doc)]
use crate::SessionConfig;

/// What a session knows about its peer, published as it changes (see
/// `meshlog_sync::Session::state`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionState {
    /// The peer's stream, once its hello arrived.
    pub peer: Option<StreamId>,
    /// The marks the peer reported (hello, acks, heartbeats), joined: what it
    /// has acknowledged holding.
    pub peer_marks: VersionVector,
    /// The floor in the peer's hello.
    pub peer_floor: VersionVector,
    /// Frames sent (queued for writing).
    pub frames_sent: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Received frames of a kind this side does not know (added by a later
    /// build), skipped whole: counted in [`SessionState::frames_received`]
    /// too, and logged at `debug`.
    pub frames_skipped: u64,
    /// Whether this side's first hello went against a checkpoint (kind
    /// 9) rather than whole: a dialer's does when it remembers that the
    /// peer reads one (`docs/PROTOCOL.md`, "The dialer's hello"); an
    /// accepting side's, when the dialer's hello says it reads one.
    /// (A re-sent hello goes against one once the peer's hello says it
    /// reads one, whatever the first did.)
    pub first_hello_against: bool,
    /// Bytes sent, prefixes included.
    pub bytes_sent: u64,
    /// Bytes received, prefixes included.
    pub bytes_received: u64,
    /// When the last frame from the peer arrived (any frame: a heartbeat
    /// too), on the clock the session's driver passes in: how fresh what
    /// the link says of the peer is. `None` before the first frame.
    pub last_frame_at: Option<Instant>,
    /// Events sent in deltas (re-sends counted again).
    pub events_sent: u64,
    /// Received events that became visible here.
    pub events_applied: u64,
    /// Received events this replica already held.
    pub events_duplicate: u64,
    /// Routes frames sent: streams asked quiet (another session brings
    /// them) or loud again.
    pub routes_sent: u64,
    /// Streams the peer asked us not to push, now.
    pub peer_quiet_streams: usize,
    /// Events not exchanged because of a limit (received and cut before
    /// the apply, or not sent): the metric of [`SessionState::limits`].
    pub events_over_limit: u64,
    /// Every limit the session ran into, one entry per stream affected:
    /// what it cannot exchange and which setting says so. The session
    /// keeps exchanging everything else.
    pub limits: Vec<LimitHit>,
    /// Streams this replica is behind the peer's floor on, now: per
    /// stream (ascending) the peer's floor. The replica holds events of
    /// the stream below that floor, which it keeps (a peer's floor never
    /// erases them); the peer cannot serve the seqs between, so the stream
    /// is asked quiet here and left to another session, until the gap is
    /// filled or the replica compacts what it holds of the stream (then
    /// the peer's floor is recorded as lost). `docs/SIGNING.md`, "Floors
    /// with an authority".
    pub behind_floor: Vec<(StreamId, u64)>,
    /// Received events of streams behind the peer's floor, not taken: the
    /// counter of [`SessionState::behind_floor`].
    pub events_behind_floor: u64,
    /// Compaction statements offered to the peer in statement frames (to
    /// a peer past their floor; `docs/SIGNING.md`), each once a session.
    pub statements_sent: u64,
    /// Statements the peer offered that this replica grants no authority
    /// (`StatementNoAuthority`) or whose chain hash is not its own
    /// (`StatementHashMismatch`): nothing erased, the first of each logged
    /// at `warn`. A statement this session already refused (the same
    /// `(stream, signer)` for no authority, the same `(stream, floor,
    /// hash)` for a hash mismatch) is counted here again without being
    /// judged: no commit round, no log (at most
    /// [`STATEMENT_REFUSALS_MAX`] refusals are remembered).
    pub statements_refused: u64,
}

/// The most refused compaction statements a session remembers, by what
/// the refusal depends on (`(stream, signer)` for no authority, `(stream,
/// floor, hash)` for a chain hash not the replica's): a statement frame
/// repeating one costs a lookup, not a commit round. An entry is 56
/// bytes, so at most 14 KiB a session. Past it a refusal is not
/// remembered (its repeats cost a commit round each, as before the
/// memory), reported once as [`LimitHit::StatementRefusalsMax`] and
/// logged once at `warn`. An
/// honest peer offers each statement once a session, so only a peer that
/// repeats refused statements by the hundred reaches it.
pub const STATEMENT_REFUSALS_MAX: usize = 256;

/// A limit a session ran into, and what it cannot exchange because of it.
/// The session keeps exchanging what fits; each is logged once, at `warn`,
/// naming the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitHit {
    /// The peer sent a stream this replica cannot hold: it already holds
    /// `streams_max` streams (`meshlog_replica::Config::streams_max`, at
    /// most 16,383, what a cursor carries). The stream is asked quiet.
    StreamsMax {
        /// The stream refused.
        stream: StreamId,
        /// `streams_max`.
        limit: usize,
    },
    /// The peer sent an event whose payload exceeds this replica's
    /// `payload_bytes_max`: its stream stops below it here, and is asked
    /// quiet.
    PayloadBytesMax {
        /// The event's stream.
        stream: StreamId,
        /// The event's seq.
        seq: u64,
        /// Its payload's length.
        len: usize,
        /// `payload_bytes_max`.
        limit: usize,
    },
    /// The peer sent a stream whose writer this replica's closed
    /// membership does not admit (`meshlog_replica::Config::membership`,
    /// `docs/SIGNING.md`, "Membership"): its events are not taken, the
    /// stream is asked quiet, and the rest of the peer's deltas are.
    /// Admit the writer's key in the trust configuration to take it.
    UnknownWriter {
        /// The stream refused.
        stream: StreamId,
        /// The key that sealed its run, if the peer sent a seal of it.
        key: Option<meshlog_replica::WriterPublicKey>,
    },
    /// The peer sent a stream this replica froze at a fork: it keeps a
    /// proof that the stream's writer signed two histories of it
    /// (`docs/SIGNING.md`, "Equivocation with valid signatures"), and
    /// takes nothing of it above `head`. The stream is asked quiet.
    Frozen {
        /// The stream refused.
        stream: StreamId,
        /// The head it is frozen at.
        head: u64,
    },
    /// The peer sent new events of a stream with no seal, and this
    /// replica requires seals (`meshlog_replica::Config::require_seals`)
    /// of a stream it has not pinned a key for: a legacy stream, from
    /// before signed streams. Its events are not taken, the stream is
    /// asked quiet, and the rest of the peer's deltas are.
    Unsealed {
        /// The stream refused.
        stream: StreamId,
    },
    /// The peer sent a compaction statement for a stream (at `floor`)
    /// whose signer has no authority here: an admin key this replica
    /// does not trust, or a writer key it does not admit
    /// (`docs/SIGNING.md`, "Compaction statements"). The stream is cut
    /// whole from the peer's deltas and asked quiet; the rest is taken,
    /// and the link kept (a mesh whose nodes trust differently keeps its
    /// links). The stream comes from a peer that can serve it.
    StatementNoAuthority {
        /// The stream refused.
        stream: StreamId,
        /// The floor the statement raises it to.
        floor: u64,
    },
    /// The peer offered statements refused here (no authority, or a
    /// chain hash not the replica's), over [`STATEMENT_REFUSALS_MAX`]
    /// distinct ones in this session: further ones are not remembered,
    /// and each repeat of one costs a commit round again. Reported once a
    /// session.
    StatementRefusalsMax {
        /// [`STATEMENT_REFUSALS_MAX`].
        limit: usize,
    },
    /// One of our events is too large for a frame (our
    /// `payload_bytes_max` is above what a frame between us and this peer
    /// carries): its stream is not sent to this peer past it.
    FrameBytesMax {
        /// The event's stream.
        stream: StreamId,
        /// The event's seq.
        seq: u64,
        /// Its payload's length.
        len: usize,
        /// The frame limit it exceeds: the smaller of this side's
        /// [`SessionConfig::frame_bytes_max`] and the peer's.
        limit: usize,
    },
}
