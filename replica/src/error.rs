//! The replica's errors: one for what changes the log, one for paging;
//! and the conversions of a store's errors into them (`store_error`,
//! `read_error`). A leaf: it imports none of the modules that answer
//! these errors.

use meshlog_cursor::{CheckpointName, StaleCursor, StreamId, TokenError};

use crate::mem::ReadError;
use crate::{ChainHash, Digest};

/// Why an append, apply, compaction or open failed. Nothing was changed
/// unless the variant says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// A payload is larger than the configured limit.
    #[error(
        "payload of {len} bytes on stream {stream} seq {seq} exceeds the limit of {limit} bytes"
    )]
    PayloadTooLarge {
        /// The stream of the event.
        stream: StreamId,
        /// The event's seq (for an append, the seq it would have taken).
        seq: u64,
        /// The payload's length.
        len: usize,
        /// `Config::payload_bytes_max`.
        limit: usize,
    },
    /// A peer's delta was refused: it breaks the log's rules. Nothing was
    /// changed.
    #[error(transparent)]
    Delta(#[from] DeltaError),
    /// A fork proof offered to [`Replica::keep_fork`](crate::Replica::keep_fork)
    /// does not prove a fork of its stream by the stream's key (or is of
    /// the own stream).
    #[error(transparent)]
    Fork(#[from] crate::ForkError),
    /// Accepting a delta would make the replica hold more streams than its
    /// limit. The delta was refused.
    #[error(
        "a delta would bring the replica to {streams} streams (the last new one: stream {stream}, \
         seqs {seqs:?}); the limit is {limit}"
    )]
    TooManyStreams {
        /// The last new stream of the delta, which does not fit.
        stream: StreamId,
        /// The seqs the delta carries of it (its floor's, if no events).
        seqs: std::ops::RangeInclusive<u64>,
        /// The count the replica would reach.
        streams: usize,
        /// `Config::streams_max`.
        limit: usize,
    },
    /// The lamport clock or this writer's seq reached `u64::MAX`.
    #[error("the lamport clock or the seq of stream {stream} is exhausted")]
    ClockExhausted {
        /// This replica's stream.
        stream: StreamId,
    },
    /// On open, the store's content breaks an invariant.
    #[error("store content is inconsistent on stream {stream}: {detail}")]
    Corrupt {
        /// The stream where the check failed.
        stream: StreamId,
        /// What failed.
        detail: String,
    },
    /// The store failed. Nothing the failed commit held became visible;
    /// since a failed commit leaves the store's content uncertain (an fsync
    /// that failed may or may not have written), the replica refuses
    /// further changes ([`ReplicaError::Failed`]) until it is reopened, and
    /// keeps serving what it committed before.
    #[error("store failed: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// [`Replica::verify`](crate::Replica::verify) recomputed the digest of
    /// every held event and it differs from the one the store recorded.
    #[error("the digest recomputed from every event ({recomputed:?}) differs from the one recorded ({recorded:?})")]
    DigestMismatch {
        /// The digest the store recorded (and the replica serves).
        recorded: Digest,
        /// The digest of the events read back.
        recomputed: Digest,
    },
    /// [`Replica::verify`](crate::Replica::verify) recomputed a stream's
    /// chain from its floor hash through its held events, and it ends at
    /// another hash than the one recorded at its head.
    #[error("stream {stream}: the chain recomputed to head {head} is {recomputed}, but {recorded} is recorded")]
    ChainMismatch {
        /// The stream.
        stream: StreamId,
        /// Its head seq.
        head: u64,
        /// The chain hash at the head the store recorded (and the replica
        /// serves). Boxed, as is `recomputed`: every `Result` of the
        /// crate carries this enum, which stays small.
        recorded: Box<ChainHash>,
        /// The chain hash recomputed from the events read back.
        recomputed: Box<ChainHash>,
    },
    /// An earlier commit failed, or a change panicked part-way; reopen the
    /// replica to recover its durable state.
    #[error("an earlier store commit failed or a change panicked; reopen the replica to recover its durable state")]
    Failed,
    /// The replica was opened to recover its own stream from its peers
    /// ([`Config::recover_own_stream`](crate::Config::recover_own_stream)):
    /// it appends nothing until [`Replica::end_recovery`](crate::Replica::end_recovery).
    #[error("stream {stream} is recovering its own events from peers (head {head}); appends wait for end_recovery")]
    Recovering {
        /// This replica's stream.
        stream: StreamId,
        /// Its head so far.
        head: u64,
    },
}

/// A store's error (a commit, a meta read, a checkpoint record) as the
/// replica answers it: [`ReplicaError::Store`].
pub(crate) fn store_error<E: std::error::Error + Send + Sync + 'static>(error: E) -> ReplicaError {
    ReplicaError::Store(Box::new(error))
}

/// A failed read of held events as the replica answers it:
/// [`ReplicaError::Store`].
pub(crate) fn read_error(error: ReadError) -> ReplicaError {
    ReplicaError::Store(error)
}

/// Something [`Replica::open`](crate::Replica::open) accepted but an
/// operator should know: the replica opened and serves what it holds.
/// Each is logged (`tracing::warn!`) when found, counted in
/// [`Stats::open_warnings`](crate::Stats::open_warnings), and listed by
/// [`Replica::open_warnings`](crate::Replica::open_warnings).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenWarning {
    /// The store holds more streams than
    /// [`Config::streams_max`](crate::Config::streams_max) allows (an
    /// operator lowered it). Every stream held is kept and served; a change
    /// that would add another stream is refused
    /// ([`ReplicaError::TooManyStreams`]) until the count is back under the
    /// limit or the limit is raised.
    #[error(
        "the store holds {streams} streams (the own stream's slot counted), above streams_max = \
         {limit}; they are kept, and no new stream is taken"
    )]
    StreamsOverLimit {
        /// The streams counted: those held, and the own stream's slot.
        streams: usize,
        /// `Config::streams_max`.
        limit: usize,
    },
}

/// Why a peer's delta was refused: what it claims breaks the log's rules.
/// The delta is refused whole and nothing changes. Separate from local
/// limits ([`ReplicaError::PayloadTooLarge`], [`ReplicaError::TooManyStreams`])
/// and store failures, so a session can tell a misbehaving peer from a
/// configuration mismatch; exhaustive, so it can match every case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    /// A received event has seq 0; seqs start at 1.
    #[error("event on stream {stream} has seq 0; seqs start at 1")]
    ZeroSeq {
        /// The stream of the event.
        stream: StreamId,
    },
    /// Two different events claim one name. The event held first is kept.
    #[error(
        "equivocation: two different events claim stream {stream} seq {seq}; the first is kept"
    )]
    Equivocation {
        /// The stream.
        stream: StreamId,
        /// The seq claimed twice.
        seq: u64,
    },
    /// A received event's lamport stamp does not rise with seq within its
    /// stream, against a neighbour already known.
    #[error(
        "stream {stream} seq {seq} has lamport {lamport}, but seq {neighbour_seq} has lamport \
         {neighbour_lamport}: lamport must rise with seq"
    )]
    LamportNotRising {
        /// The stream.
        stream: StreamId,
        /// The offending event's seq.
        seq: u64,
        /// Its lamport stamp.
        lamport: u64,
        /// The neighbour's seq (one below or one above).
        neighbour_seq: u64,
        /// The neighbour's lamport stamp.
        neighbour_lamport: u64,
    },
    /// A received event is stamped above [`LAMPORT_MAX`](crate::LAMPORT_MAX):
    /// accepted, it would push the receiver's clock so near `u64::MAX` that
    /// its own appends would soon fail. No honest writer gets there.
    #[error("stream {stream} seq {seq} has lamport {lamport}, above the largest accepted, {max}")]
    LamportTooLarge {
        /// The stream.
        stream: StreamId,
        /// The event's seq.
        seq: u64,
        /// Its lamport stamp.
        lamport: u64,
        /// [`LAMPORT_MAX`](crate::LAMPORT_MAX).
        max: u64,
    },
    /// The delta carries events of the receiver's own stream beyond its
    /// head: only this replica writes its stream. (A writer that lost its
    /// store opens with `recover_own_stream` to relearn it.)
    #[error("stream {stream} is the receiver's own; seq {seq} is beyond its head {head}")]
    OwnStreamAhead {
        /// The receiver's stream.
        stream: StreamId,
        /// The first offending seq.
        seq: u64,
        /// The receiver's head.
        head: u64,
    },
    /// The delta names a floor above [`LAMPORT_MAX`](crate::LAMPORT_MAX):
    /// lamports rise with seq, so no stream ever reaches such a seq, and
    /// accepted, the floor would make the receiver ignore every future
    /// event of the stream.
    #[error("stream {stream} has floor {floor}, above the largest possible seq, {max}")]
    FloorTooLarge {
        /// The stream.
        stream: StreamId,
        /// The floor claimed.
        floor: u64,
        /// [`LAMPORT_MAX`](crate::LAMPORT_MAX).
        max: u64,
    },
    /// A run's seal is signed by a key that does not derive its stream,
    /// is not the one bound to it (a legacy stream), or is not the key
    /// the receiver pinned for it (`docs/SIGNING.md`, "Keys and stream ids").
    #[error("the seal on stream {stream} is signed by a key that writes stream {derived}")]
    KeyMismatch {
        /// The sealed stream.
        stream: StreamId,
        /// The stream the signing key derives.
        derived: StreamId,
    },
    /// A run's events do not chain to the hash its seal signs: forged,
    /// altered, reordered or spliced events, or a seal of another run.
    #[error("stream {stream}: the run's events do not chain to its seal at seq {seq}")]
    ChainBroken {
        /// The stream.
        stream: StreamId,
        /// The seq the seal is at (or the run's first seq out of place).
        seq: u64,
    },
    /// The delta's sealed run of a stream and a seal the receiver holds
    /// are two histories signed by the stream's writer: a fork
    /// (`docs/SIGNING.md`, "Equivocation with valid signatures"). The
    /// receiver keeps `proof` and freezes the stream at `head`.
    #[error(
        "stream {stream}: its writer signed two histories that differ at seq {seq} (a fork); \
         the proof is kept and the stream frozen at seq {head}"
    )]
    Forked {
        /// The stream.
        stream: StreamId,
        /// The seq the two histories are shown to differ at.
        seq: u64,
        /// The receiver's head of the stream, which it is frozen at (what
        /// [`DeltaError::Frozen`] names for its later runs).
        head: u64,
        /// The proof, both seals and the events between.
        proof: Box<crate::ForkProof>,
    },
    /// The delta brings new events of a stream frozen at a fork: the
    /// receiver holds a proof that its writer signed two histories, and
    /// takes nothing of it above what it held.
    #[error("stream {stream} is frozen at seq {head}: its writer forked it (a proof is kept)")]
    Frozen {
        /// The stream.
        stream: StreamId,
        /// The head it is frozen at.
        head: u64,
    },
    /// A run's seal does not verify under its key.
    #[error("stream {stream}: the seal at seq {seq} does not verify")]
    BadSeal {
        /// The stream.
        stream: StreamId,
        /// The sealed seq.
        seq: u64,
    },
    /// A run carries no seal where the receiver requires one
    /// ([`Config::require_seals`](crate::Config::require_seals)).
    #[error("stream {stream}: the run from seq {seq} carries no seal, and seals are required")]
    Unsealed {
        /// The stream.
        stream: StreamId,
        /// The run's first seq.
        seq: u64,
    },
    /// The delta brings something new of a writer the receiver's closed
    /// [`Membership`](crate::Membership) does not admit: events above the
    /// receiver's head (or a floor that would raise the stream) of a
    /// stream no admitted key writes, or a seal by a key not admitted for
    /// its stream (`docs/SIGNING.md`, "Membership"). To take it, admit the
    /// writer's key in the receiver's trust configuration.
    #[error(
        "stream {stream}: its writer{} is not admitted by this replica's trust configuration",
        key.as_ref().map(|key| format!(" (key {key})")).unwrap_or_default()
    )]
    UnknownWriter {
        /// The stream.
        stream: StreamId,
        /// The key that sealed the run, if it carried a seal (boxed: a
        /// decoded key is large, and this error travels by value).
        key: Option<Box<crate::WriterPublicKey>>,
    },
    /// A compaction statement is signed by a key with no authority over
    /// its stream: neither the stream's writer (the key that derives it,
    /// or the one bound, pinned or admitted for it) nor the admin key the
    /// receiver trusts (`docs/SIGNING.md`, "Floors with an authority").
    #[error(
        "stream {stream}: the compaction statement at floor {floor} is signed by a key \
         that writes stream {derived}, neither this stream's writer nor the trusted admin key"
    )]
    StatementNoAuthority {
        /// The stream.
        stream: StreamId,
        /// The floor stated.
        floor: u64,
        /// The stream the signing key derives.
        derived: StreamId,
    },
    /// A compaction statement's signature does not verify.
    #[error("stream {stream}: the compaction statement at floor {floor} does not verify")]
    BadStatement {
        /// The stream.
        stream: StreamId,
        /// The floor stated.
        floor: u64,
    },
    /// A compaction statement's chain hash at its floor differs from the
    /// receiver's, which holds that seq: the statement is over another
    /// history of the stream.
    #[error(
        "stream {stream}: the compaction statement's chain hash at seq {seq} differs from \
         the one this replica holds there"
    )]
    StatementHashMismatch {
        /// The stream.
        stream: StreamId,
        /// The statement's floor, a seq the receiver holds.
        seq: u64,
    },
}

/// Why a page was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PageError {
    /// The cursor is below the compaction floor on some stream: the error
    /// names every stream, the seqs lost, and the cursor to resume from.
    #[error(transparent)]
    Stale(#[from] StaleCursor),
    /// A change panicked part-way through publishing, so the replica's
    /// memory cannot be trusted: it serves no page until reopened.
    #[error("a change panicked part-way; reopen the replica to recover its durable state")]
    Failed,
    /// Reading the held events failed (a store on disk that is damaged or
    /// failing); nothing was skipped, the page was not answered.
    #[error("reading the log failed: {detail}")]
    Store {
        /// What failed, naming the file and record where the store knows.
        detail: String,
    },
    /// The requested page is longer than the configured limit.
    #[error("page limit {limit} exceeds the maximum of {max}")]
    LimitTooLarge {
        /// The limit asked for.
        limit: usize,
        /// `Config::page_len_max`.
        max: usize,
    },
    /// A version-2 token names a checkpoint this replica does not keep
    /// (never minted nor received here, or older than the last
    /// [`CHECKPOINTS_KEPT`](crate::CHECKPOINTS_KEPT)). Nothing is guessed:
    /// resume from the token's version-1 form, which a replica that keeps
    /// the checkpoint answers (`docs/TOKEN.md`, "An unknown checkpoint").
    #[error("the token is relative to checkpoint {name}, which this replica does not keep")]
    UnknownCheckpoint {
        /// The checkpoint the token names.
        name: CheckpointName,
    },
    /// A token that is not a cursor: it does not decode, or its
    /// differences do not apply to the checkpoint it names.
    #[error("bad token: {0}")]
    BadToken(#[from] TokenError),
}
