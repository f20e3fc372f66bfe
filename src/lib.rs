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
//! - [`replica`] (`meshlog-replica`): the delta-state log, its stores, and
//!   [`SharedReplica`], the one handle every task of a runtime shares.
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
//!
//! An embedder's usual start: a durable replica shared by its threads and
//! tasks, and the text token a reader keeps.
//!
//! ```
//! use meshlog::{decode_token, encode_token, Config, DiskStore, Replica, SharedReplica, StreamId, VersionVector};
//!
//! let dir = std::env::temp_dir().join(format!("meshlog-facade-doc-{}", std::process::id()));
//! let store = DiskStore::open(&dir)?;
//! let shared = SharedReplica::new(Replica::open(Config::new(StreamId::new(7)), store)?);
//! shared.append(&b"durable once this returns"[..])?;
//! let page = shared.page(&VersionVector::new(), 10)?;
//! let token = encode_token(&page.next)?;
//! assert_eq!(decode_token(&token)?, page.next);
//! drop(shared);
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use meshlog_cursor as cursor;
pub use meshlog_replica as replica;
pub use meshlog_sync as sync;

pub use meshlog_cursor::token::{decode_text as decode_token, encode_text as encode_token};
pub use meshlog_cursor::{StaleCursor, StreamId, TokenError, VersionVector};
pub use meshlog_replica::{
    Change, Commits, Config, Delta, DeltaError, DiskStore, Event, MemStore, Page, PageError,
    Replica, ReplicaError, RetentionPolicy, SharedReplica,
};

/// The README's example, compiled and run as a doctest so it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
