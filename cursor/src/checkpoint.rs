//! [`Checkpoint`]: a version vector every replica can name, and
//! [`CheckpointName`], that name. Version-2 tokens
//! ([`token::encode_relative`](crate::token::encode_relative)) carry a
//! checkpoint's name and only the streams where the cursor differs from it.

use std::fmt;

use crate::{token, TokenError, VersionVector};

/// The bytes of a [`CheckpointName`]: 128 bits.
pub const CHECKPOINT_NAME_BYTES: usize = 16;

/// A checkpoint's name: the first 16 bytes of the BLAKE3 hash of its
/// vector's canonical version-1 token (`docs/TOKEN.md`, "Checkpoints").
///
/// A cryptographic hash, so the name certifies the vector: a replica that
/// fetches a checkpoint by name from any peer, however hostile, checks the
/// vector it gets against the name ([`Checkpoint::new`] recomputes it), and
/// nobody can make a second vector with the name of one they did not mint.
/// Its text form is 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointName([u8; CHECKPOINT_NAME_BYTES]);

impl CheckpointName {
    /// Wraps 16 bytes read from a token or a frame.
    pub const fn from_bytes(bytes: [u8; CHECKPOINT_NAME_BYTES]) -> Self {
        CheckpointName(bytes)
    }

    /// The name's bytes, as a token writes them.
    pub const fn as_bytes(&self) -> &[u8; CHECKPOINT_NAME_BYTES] {
        &self.0
    }
}

impl fmt::Display for CheckpointName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for CheckpointName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CheckpointName({self})")
    }
}

/// A version vector with its name: what a version-2 token is relative to.
///
/// Built only by [`Checkpoint::new`], which hashes the vector, so a
/// checkpoint's name is always its vector's.
///
/// ```
/// use meshlog_cursor::{token, Checkpoint, StreamId, VersionVector};
/// let head: VersionVector = (1..=1000u64).map(|s| (StreamId::new(s << 40), 500)).collect();
/// let checkpoint = Checkpoint::new(head.clone())?;
/// // A reader a few events past the checkpoint on two streams.
/// let mut cursor = head.clone();
/// cursor.advance(StreamId::new(7 << 40), 503);
/// cursor.advance(StreamId::new(9 << 40), 501);
/// let relative = token::encode_relative(&cursor, &checkpoint)?;
/// assert!(relative.len() < 40 && token::encode(&cursor)?.len() > 6000);
/// match token::decode_any(&relative)? {
///     token::Token::Relative(relative) => {
///         assert_eq!(relative.checkpoint(), checkpoint.name());
///         assert_eq!(relative.expand(&checkpoint)?, cursor);
///     }
///     token::Token::Absolute(_) => unreachable!("a version-2 token"),
/// }
/// # Ok::<(), meshlog_cursor::TokenError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Checkpoint {
    vector: VersionVector,
    name: CheckpointName,
}

impl Checkpoint {
    /// Names `vector`. Fails only when it has more than
    /// [`STREAMS_MAX`](crate::STREAMS_MAX) streams (it would have no
    /// version-1 token to hash): [`TokenError::TooManyStreams`].
    pub fn new(vector: VersionVector) -> Result<Self, TokenError> {
        let name = name_of(&token::encode(&vector)?);
        Ok(Checkpoint { vector, name })
    }

    /// The checkpoint's name.
    pub fn name(&self) -> CheckpointName {
        self.name
    }

    /// The checkpoint's vector.
    pub fn vector(&self) -> &VersionVector {
        &self.vector
    }
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Checkpoint({}, {} streams)",
            self.name,
            self.vector.len()
        )
    }
}

/// The name of the vector whose version-1 token is `token_v1`.
fn name_of(token_v1: &[u8]) -> CheckpointName {
    let hash = blake3::hash(token_v1);
    let mut name = [0; CHECKPOINT_NAME_BYTES];
    name.copy_from_slice(&hash.as_bytes()[..CHECKPOINT_NAME_BYTES]);
    CheckpointName(name)
}
