//! meshlog's common language: the version vector.
//!
//! A reader's cursor, a replica's high-water marks and a compaction floor are
//! all one type, [`VersionVector`]: per writer stream ([`StreamId`]), the last
//! sequence number covered. A reader resumes a walk from a cursor; sync
//! exchanges marks; compaction records a floor, and
//! [`VersionVector::check_floor`] turns a cursor below it into a
//! [`StaleCursor`] that names what was lost instead of skipping it.
//!
//! Cursors travel as tokens (module [`token`]): versioned, canonical,
//! checksummed bytes, or URL-safe base64 text. Decoding a token is total.
//! A version-1 token is the whole vector; a version-2 token is relative to
//! a [`Checkpoint`], a vector every replica can name, and carries only the
//! streams where the cursor differs from it.
//!
//! # Layout
//!
//! - `stream`: [`StreamId`], a writer's id, and its text form.
//! - `vector`: [`VersionVector`] (wrapping the `crdts` crate's `VClock`), the
//!   staleness check, [`StaleCursor`] and [`LostRange`], and [`STREAMS_MAX`],
//!   the bound of every version vector (tokens, marks, floors, frames).
//! - `checkpoint`: [`Checkpoint`], a vector named by the BLAKE3 hash of its
//!   version-1 token, and [`CheckpointName`].
//! - [`token`]: the binary and text token codec of both versions, its
//!   limits and [`TokenError`]; version 2 in `token/relative.rs`.
//!
//! This crate does no I/O and knows nothing of events, logs or networks.
//!
//! # Example
//!
//! ```
//! use meshlog_cursor::{token, StreamId, VersionVector};
//!
//! // A reader has seen events 1..=5 of stream 1 and 1..=2 of stream 2.
//! let cursor: VersionVector = [(StreamId::new(1), 5), (StreamId::new(2), 2)].into_iter().collect();
//! let text = token::encode_text(&cursor)?;
//! assert_eq!(token::decode_text(&text)?, cursor);
//!
//! // Compaction dropped stream 1 up to seq 8: the cursor is stale and says so.
//! let floor: VersionVector = [(StreamId::new(1), 8)].into_iter().collect();
//! let stale = cursor.check_floor(&floor).unwrap_err();
//! assert_eq!(stale.lost()[0].seqs(), 6..=8);
//! # Ok::<(), meshlog_cursor::TokenError>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod checkpoint;
mod stream;
pub mod token;
mod vector;

pub use checkpoint::{Checkpoint, CheckpointName, CHECKPOINT_NAME_BYTES};
pub use stream::{ParseStreamIdError, StreamId};
pub use token::{CanonicalRule, TokenError};
pub use vector::{LostRange, StaleCursor, VersionVector, STREAMS_MAX};
