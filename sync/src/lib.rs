//! meshlog's anti-entropy: replicas converge by exchanging high-water marks
//! (the version vectors the cursor also uses) and sending each other what
//! the other misses, third-party streams included, over any tokio byte
//! stream.
//!
//! Links break, frames are lost, duplicated, delayed and reordered, and a
//! partitioned writer keeps writing. Sessions cope because every delta is
//! computed from what the peer is believed to hold, applying is idempotent
//! and order-free (the replica's job), and delta frames are numbered: each
//! ack and heartbeat (a *receipt*) says the last delta received and carries
//! the peer's marks, so whatever was lost, and only that, is sent again,
//! one round trip after the loss shows. Marks travel as a difference from
//! marks the peer already holds, so an idle heartbeat is a few bytes
//! whatever the stream count. After a link heals, convergence takes one
//! round trip. A trickle of events goes in few deltas: while a small one is
//! in flight, new events wait for its ack (at most a send delay), and in a
//! mesh an ack is the delta number alone.
//!
//! # Layout
//!
//! The protocol itself, without I/O, is the core crate,
//! `meshlog-sync-core` (no tokio in its dependency tree); this crate drives
//! it over tokio and re-exports its public items at the same paths:
//!
//! - [`frame`]: the core's wire frames ([`Frame`], [`Hello`], the codec,
//!   [`FRAME_BYTES_MAX`], [`DELTA_EVENTS_MAX`], [`FrameError`]), and, from
//!   this crate (`reader`), the cancel-safe [`FrameReader`] of whole frames
//!   from a tokio byte stream. Byte format: `docs/PROTOCOL.md`.
//! - [`proto`]: the core's sans-I/O state machine, [`proto::Protocol`], with
//!   its [`SessionConfig`], [`SessionState`], [`LimitHit`], [`Routes`] and
//!   [`PeerDirection`].
//! - [`SharedReplica`] and [`Commits`] are the replica crate's one handle,
//!   re-exported: sessions read it without waiting on commits, apply
//!   through its group commit (a committer thread for a durable store, so a
//!   commit never stalls the runtime), and turn its change notification
//!   into a `tokio::sync::watch` ([`ChangeWatch`], `watch`) that wakes them
//!   on new events.
//! - `session`: [`Session`], the tokio driver of a [`proto::Protocol`] over
//!   one byte stream (timers, output buffer, write timeout, commits),
//!   [`SessionEnd`], and [`SessionError`]: the core's [`ProtocolError`]
//!   plus the stream's failures.
//! - `once`: [`sync_once`], the core's one in-memory exchange at the time
//!   of the call.
//! - `link`: [`PeerLink`], one dialed or accepted peer as its driver keeps
//!   it (status, the session running, the last error, the redial loop with
//!   [`Backoff`], [`Redial`]), with the dial step injected ([`Dial`]) and
//!   the sessions' settings shared ([`LinkSessions`]); used by
//!   [`PeerManager`] (TCP) and by the node (HTTP upgrade, TLS, peer
//!   authentication). [`PeerStatus`] is its one status type.
//! - `backoff`: [`Backoff`], the jittered exponential redial policy of a
//!   link.
//! - `manager`: [`PeerManager`], which dials configured peers over TCP,
//!   accepts inbound peers and reports their [`PeerStatus`].
//! - `wants`: [`CheckpointWants`], shared by a replica's sessions: asks
//!   their peers for a checkpoint by name (through the core's
//!   `CheckpointWant`) and says when a session kept one.
//! - `rng`: `SplitMix64`, the seeded generator behind the links' jitter
//!   (crate-private; the same algorithm as `meshlog_testkit::SplitMix64`,
//!   which the testkit draws its faults from).
//! - `testkit` (feature `testkit`): the frame-level fault proxy
//!   (`FaultLink` in memory, `FaultProxy` over TCP), an in-memory mesh of
//!   replicas with reconnecting links, a paused-clock runtime and a bounded
//!   `wait_for` for tests, the frame-decoding checks of the `frame_decode`
//!   fuzz target, and, re-exported from the dev-only `meshlog-testkit`,
//!   seeds from `MESHLOG_SEED` and `SplitMix64`.
//!
//! **Architecture invariant:** only this crate and its core know frames,
//! and only this crate (not the core) knows sockets, tasks and the clock.
//! The replica and the cursor are used through their public API; their types
//! are converted to the core's private serde types at the frame boundary.
//!
//! # Example
//!
//! Two replicas linked by an in-memory stream converge:
//!
//! ```
//! use std::time::Duration;
//! use meshlog_cursor::StreamId;
//! use meshlog_sync::{Session, SessionConfig, SharedReplica};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build()?.block_on(async {
//! let a = SharedReplica::in_memory(StreamId::new(1));
//! let b = SharedReplica::in_memory(StreamId::new(2));
//! a.append(&b"from a"[..])?;
//! b.append(&b"from b"[..])?;
//!
//! let (a_end, b_end) = tokio::io::duplex(64 * 1024);
//! let config = SessionConfig::with_heartbeat(Duration::from_millis(50));
//! let a_session = tokio::spawn(Session::new(a.clone(), config.clone()).run(a_end));
//! let b_session = tokio::spawn(Session::new(b.clone(), config).run(b_end));
//!
//! for _ in 0..100 {
//!     if a.digest() == b.digest() {
//!         break;
//!     }
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//! }
//! assert_eq!(a.digest(), b.digest());
//! assert_eq!(a.marks(), b.marks());
//! a_session.abort();
//! b_session.abort();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backoff;
mod link;
mod manager;
mod once;
mod reader;
mod rng;
mod session;
#[cfg(feature = "testkit")]
pub mod testkit;
mod wants;
mod watch;

/// The wire frames: the core's (`meshlog_sync_core::frame`, re-exported
/// whole), and [`FrameReader`], which reads them from a tokio byte stream.
pub mod frame {
    pub use crate::reader::FrameReader;
    pub use meshlog_sync_core::frame::*;
}

pub use meshlog_sync_core::proto;

pub use backoff::Backoff;
pub use frame::{
    Frame, FrameError, FrameReader, Hello, DELTA_EVENTS_MAX, FRAME_BYTES_CEILING, FRAME_BYTES_MAX,
    PROTOCOL_VERSION,
};
pub use link::{Dial, LinkSessions, PeerLink, PeerStatus, Redial};
pub use manager::{BindError, ManagerConfig, PeerManager};
pub use meshlog_replica::{Commits, SharedReplica};
pub use meshlog_sync_core::{
    LimitHit, PeerDirection, ProtocolError, Routes, SessionConfig, SessionState, SyncReport,
    STATEMENT_REFUSALS_MAX,
};
pub use once::sync_once;
pub use session::{Session, SessionEnd, SessionError};
pub use wants::CheckpointWants;
pub use watch::ChangeWatch;

/// Locks `mutex`, taking a poisoned lock as it is: only bookkeeping is
/// done under this crate's locks, so a panic elsewhere leaves it
/// consistent.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
