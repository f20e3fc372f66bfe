//! `SealError`: why a key, seal or statement was refused.

use meshlog_cursor::StreamId;

/// Why a writer key, a seal or a signed statement was refused: by its bytes
/// (length, key point) or by its signature or authority. Each variant names
/// what a caller needs to report it: the stream and seq of a seal, the
/// statement's kind, the lengths.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// An encoding had the wrong number of bytes (every encoding of this
    /// module has one fixed size).
    #[error("{what}: expected {expected} bytes, got {got}")]
    WrongLength {
        /// What was decoded: `"writer key"`, `"seal"`, `"compaction"`, …
        what: &'static str,
        /// The encoding's size.
        expected: usize,
        /// The input's size.
        got: usize,
    },
    /// 32 bytes that are not a public key a writer may sign with.
    #[error("{what}: not a usable Ed25519 public key: {fault}")]
    BadKey {
        /// Which key: `"writer key"`, `"admin key"`, `"admitted key"`, …
        what: &'static str,
        /// What is wrong with it.
        fault: KeyFault,
    },
    /// A seal's signature does not verify under the stream's key: the run
    /// it ends was forged, altered, reordered or cut, or the seal is not
    /// the writer's.
    #[error("seal of stream {stream} at seq {seq}: the signature does not verify")]
    BadSignature {
        /// The sealed stream.
        stream: StreamId,
        /// The sealed seq.
        seq: u64,
    },
    /// A key signed for a stream its id does not derive, and no binding
    /// names that key for the stream.
    #[error(
        "stream {stream}: the key derives stream {derived}, and no binding names it for \
         stream {stream}"
    )]
    KeyMismatch {
        /// The stream the key signed for.
        stream: StreamId,
        /// The stream the key's id derives.
        derived: StreamId,
    },
    /// A statement's signature does not verify under the key that must
    /// have signed it.
    #[error("{statement} statement{}: the signature does not verify", for_stream(*stream))]
    BadStatement {
        /// `"compaction"`, `"admission"` or `"binding"`.
        statement: &'static str,
        /// The stream it is about, for a compaction or a binding.
        stream: Option<StreamId>,
    },
    /// A compaction statement signed by a key that is neither the stream's
    /// writer (derived or bound) nor the mesh admin key.
    #[error(
        "compaction of stream {stream} to floor {floor}: signed by a key that derives stream \
         {derived}, neither the stream's writer nor the admin key"
    )]
    NoAuthority {
        /// The stream the statement compacts.
        stream: StreamId,
        /// The floor it states.
        floor: u64,
        /// The stream the signing key derives.
        derived: StreamId,
    },
    /// The operating system gave no randomness for a new key.
    #[error("no randomness for a new key: {detail}")]
    Randomness {
        /// The operating system's error.
        detail: String,
    },
}

/// What is wrong with 32 bytes offered as a public key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFault {
    /// The bytes are not the encoding of a point of the curve.
    #[error("not a curve point")]
    NotAPoint,
    /// The point has another, canonical encoding: a key has exactly one.
    #[error("not the point's canonical encoding")]
    NonCanonical,
    /// The point is of small order: a signature under it says nothing.
    #[error("a point of small order")]
    SmallOrder,
    /// The point has a small-order component: no key generated as Ed25519
    /// says has one.
    #[error("a point outside the prime-order subgroup")]
    Torsion,
}

fn for_stream(stream: Option<StreamId>) -> String {
    match stream {
        Some(stream) => format!(" for stream {stream}"),
        None => String::new(),
    }
}
