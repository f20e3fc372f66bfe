//! The replica's errors: one for what changes the log, one for paging.

use meshlog_cursor::{StaleCursor, StreamId};

/// Why an append, apply, compaction or open failed. Nothing was changed
/// unless the variant says so.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// A payload is larger than the configured limit.
    #[error("payload of {len} bytes on stream {stream} exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The stream of the event.
        stream: StreamId,
        /// The payload's length.
        len: usize,
        /// `Config::payload_bytes_max`.
        limit: usize,
    },
    /// A received event has seq 0; seqs start at 1.
    #[error("event on stream {stream} has seq 0; seqs start at 1")]
    ZeroSeq {
        /// The stream of the event.
        stream: StreamId,
    },
    /// Two different events claim one name. The delta was refused whole; the
    /// event held first is kept.
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
    /// stream, against a neighbour already known. The delta was refused.
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
    /// Accepting a delta would make the replica hold more streams than its
    /// limit. The delta was refused.
    #[error("a delta would bring the replica to {streams} streams; the limit is {limit}")]
    TooManyStreams {
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
    /// The store failed. If the failure came from a commit, the replica's
    /// memory may be ahead of its store: it refuses further changes
    /// ([`ReplicaError::Failed`]) until it is reopened.
    #[error("store failed: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// An earlier commit failed; reopen the replica to recover its durable
    /// state.
    #[error("an earlier store commit failed; reopen the replica to recover its durable state")]
    Failed,
}

/// Why a page was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PageError {
    /// The cursor is below the compaction floor on some stream: the error
    /// names every stream, the seqs lost, and the cursor to resume from.
    #[error(transparent)]
    Stale(#[from] StaleCursor),
    /// An earlier store commit failed, so the replica's memory may hold
    /// what its store does not: it serves nothing until reopened.
    #[error("an earlier store commit failed; reopen the replica to recover its durable state")]
    Failed,
    /// The requested page is longer than the configured limit.
    #[error("page limit {limit} exceeds the maximum of {max}")]
    LimitTooLarge {
        /// The limit asked for.
        limit: usize,
        /// `Config::page_len_max`.
        max: usize,
    },
}
