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
//! - [`frame`]: the wire frames ([`Frame`], [`Hello`]), their encoding
//!   (postcard, but a delta's events written by hand as run headers and
//!   columns in repeat and literal runs) behind a `u32` length prefix,
//!   [`FRAME_BYTES_MAX`] (the default frame limit, a session setting),
//!   [`DELTA_EVENTS_MAX`], the
//!   cancel-safe [`FrameReader`] and [`FrameError`]. Byte format:
//!   `docs/PROTOCOL.md`.
//! - [`SharedReplica`] and [`Commits`] are the replica crate's one handle,
//!   re-exported: sessions read it without waiting on commits, apply
//!   through its group commit (a committer thread for a durable store, so a
//!   commit never stalls the runtime), and turn its change notification
//!   into a `tokio::sync::watch` ([`ChangeWatch`]) that wakes them on new
//!   events.
//! - [`proto`]: the sans-I/O protocol core, [`proto::Protocol`]: one
//!   peer's side of the protocol as a state machine fed received frames and
//!   the time, handing back frames to send and when to wake next (every rule
//!   of a session: hello, view, delta sizing and splitting, acks,
//!   heartbeats, refusals, read timeouts); and [`sync_once`], one exchange
//!   between two replicas in memory, to quiescence.
//! - `session`: [`Session`], the tokio driver of a [`proto::Protocol`] over
//!   one byte stream (timers, output buffer, write timeout, commits),
//!   [`SessionConfig`], [`SessionState`], [`SessionError`].
//! - `routes`: [`Routes`], the table a replica's sessions share so that in
//!   a mesh with cycles an event reaches it about once: per stream, the
//!   session that brings it (the others ask their peers quiet for it in a
//!   `Routes` frame), and per peer, the one session kept when two replicas
//!   dial each other.
//! - `backoff`: [`Backoff`], the jittered exponential redial policy of a
//!   link, used by the manager and by drivers of sessions elsewhere (the
//!   node dials over HTTP).
//! - `manager`: [`PeerManager`], which dials configured peers over TCP,
//!   reconnects with jittered backoff, accepts inbound peers and reports
//!   [`PeerStatus`] (connected, marks, lag in events).
//! - `rng`: `SplitMix64`, the seeded generator behind the manager's jitter
//!   (crate-private; the same algorithm as `meshlog_testkit::SplitMix64`,
//!   which the testkit draws its faults from).
//! - `testkit` (feature `testkit`): the frame-level fault proxy
//!   (`FaultLink` in memory, `FaultProxy` over TCP), an in-memory mesh of
//!   replicas with reconnecting links, a paused-clock runtime and a bounded
//!   `wait_for` for tests, the frame-decoding checks of the `frame_decode`
//!   fuzz target, and, re-exported from the dev-only `meshlog-testkit`,
//!   seeds from `MESHLOG_SEED` and `SplitMix64`.
//!
//! **Architecture invariant:** only this crate knows frames and sockets.
//! The replica and the cursor are used through their public API; their types
//! are converted to this crate's private serde types at the frame boundary.
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
pub mod frame;
mod manager;
pub mod proto;
mod rng;
mod routes;
mod session;
#[cfg(feature = "testkit")]
pub mod testkit;
mod watch;

pub use backoff::Backoff;
pub use frame::{
    Frame, FrameError, FrameReader, Hello, DELTA_EVENTS_MAX, FRAME_BYTES_CEILING, FRAME_BYTES_MAX,
    PROTOCOL_VERSION,
};
pub use manager::{BindError, ManagerConfig, PeerDirection, PeerManager, PeerStatus};
pub use meshlog_replica::{Commits, SharedReplica};
pub use proto::{sync_once, SyncReport};
pub use routes::Routes;
pub use session::{LimitHit, Session, SessionConfig, SessionEnd, SessionError, SessionState};
pub use watch::ChangeWatch;
