//! [`ProtocolError`]: why the protocol core ends a session. A driver adds
//! its own transport's failures (a broken stream, a write that stalls) in
//! its own error; none of them is the core's, which does no I/O.

use std::time::Duration;

use meshlog_cursor::{CheckpointName, StreamId};
use meshlog_replica::{DeltaError, ReplicaError};

use crate::frame::FrameError;

/// Why the protocol core ended a session. Each variant is logged
/// (`tracing::warn!`) by the driver with its reason when the session ends;
/// the replica's log is unchanged by the frame that caused it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// The peer sent bytes that are not a valid frame: garbage, an oversized
    /// length prefix, another protocol version, a non-canonical vector.
    #[error("bad frame from peer: {0}")]
    Frame(#[source] FrameError),
    /// The peer's delta was refused by the replica (an equivocation, a
    /// lamport stamp not rising, too many streams...). Nothing was applied.
    #[error("delta from peer {peer} refused: {source}")]
    Refused {
        /// The peer's stream.
        peer: StreamId,
        /// What the delta breaks.
        #[source]
        source: DeltaError,
    },
    /// The peer's delta exceeds a limit of this replica (a payload larger
    /// than `payload_bytes_max`, more streams than `streams_max`): a
    /// configuration mismatch rather than misbehaviour. Nothing was applied.
    #[error("delta from peer {peer} exceeds a local limit: {source}")]
    Limit {
        /// The peer's stream.
        peer: StreamId,
        /// The limit exceeded.
        #[source]
        source: ReplicaError,
    },
    /// The local replica failed (its store) while applying a delta.
    #[error("local replica failed: {0}")]
    Replica(#[source] ReplicaError),
    /// Reading the local replica's events to send the peer failed (its
    /// store: a damaged block on disk, named in `source`). The session
    /// ends here rather than send a shorter or empty delta in their place,
    /// which would hide the fault: the peer would go on believing it holds
    /// everything this side has. Nothing of that delta was sent.
    #[error(
        "reading the events to send peer {peer} failed, nothing sent in their place: {source}"
    )]
    Read {
        /// The peer the delta was for (this replica's own stream before
        /// the peer's hello, which no delta precedes).
        peer: StreamId,
        /// The replica's error ([`ReplicaError::Store`] naming the file,
        /// stream and block; [`ReplicaError::Failed`] for a poisoned
        /// handle).
        #[source]
        source: ReplicaError,
    },
    /// The peer's hello names this replica's own stream: a connection to
    /// itself, or two replicas configured with one id.
    #[error("peer claims this replica's own stream {stream}: a self-connection or a duplicate id")]
    SelfConnection {
        /// The stream claimed.
        stream: StreamId,
    },
    /// A second hello named another stream than the first.
    #[error("peer changed identity from stream {was} to stream {now} within one session")]
    IdentityChanged {
        /// The stream of the first hello.
        was: StreamId,
        /// The stream of the later hello.
        now: StreamId,
    },
    /// No frame (or no hello) arrived for the read timeout.
    #[error("no {what} from the peer for {idle:?} (read timeout)")]
    ReadTimeout {
        /// `frame`, or `hello` if the peer never said who it is.
        what: &'static str,
        /// How long the session waited.
        idle: Duration,
    },
    /// The peer broke the session's rules in a frame that decoded: it
    /// acknowledged a delta or marks this side never sent, or sent marks as
    /// a difference from marks this side never reported holding.
    #[error("peer broke the sync protocol: {detail}")]
    Protocol {
        /// What it did.
        detail: String,
    },
    /// The peer sent a checkpoint whose vector does not have the name it
    /// claims (a forged or damaged vector, or a difference from a parent
    /// that is not the one it named): nothing was kept.
    #[error("peer sent checkpoint {claimed} with a vector of another name ({computed:?})")]
    CheckpointForged {
        /// The name the frame claims.
        claimed: CheckpointName,
        /// The name of the vector it carries (`None`: the vector has more
        /// streams than a token holds, so no name).
        computed: Option<CheckpointName>,
    },
    /// A frame of ours could not be encoded (an event too large for a frame:
    /// the replica's `payload_bytes_max` is set above what a frame carries).
    #[error("cannot send a frame: {0}")]
    Send(#[source] FrameError),
}
