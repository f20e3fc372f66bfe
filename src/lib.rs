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
//! - [`replica`] (`meshlog-replica`): the delta-state log, its stores and
//!   group commit.
//! - [`sync`] (`meshlog-sync`): wire frames, sessions and the peer manager.
//!
//! ```
//! use meshlog::{Replica, StreamId, VersionVector};
//!
//! let mut replica = Replica::new(StreamId::new(1));
//! replica.append(&b"hello"[..])?;
//! let page = replica.page(&VersionVector::new(), 10)?;
//! assert_eq!(page.events.len(), 1);
//! assert!(page.at_head);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use meshlog_cursor as cursor;
pub use meshlog_replica as replica;
pub use meshlog_sync as sync;

pub use meshlog_cursor::{StaleCursor, StreamId, TokenError, VersionVector};
pub use meshlog_replica::{Event, Page, PageError, Replica, ReplicaError};

/// The README's example, compiled and run as a doctest so it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
