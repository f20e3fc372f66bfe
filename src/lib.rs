//! meshlog: a replicated event log for a mesh of runtimes.
//!
//! Every runtime embeds a replica, writes its own stream of events and syncs
//! with its peers; readers page through the log and resume from a cursor that
//! is a compact version vector, so a walk returns every event exactly once,
//! even an event from a writer that was partitioned away and comes back stamped
//! below the reader's position.
//!
//! This facade re-exports the workspace's crates:
//!
//! - [`cursor`] (`meshlog-cursor`): the version vector, floor and token codec.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use meshlog_cursor as cursor;
pub use meshlog_cursor::{StaleCursor, StreamId, TokenError, VersionVector};
