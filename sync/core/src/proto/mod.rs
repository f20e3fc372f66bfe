//! The sans-I/O protocol core: one peer's side of the sync protocol as a
//! state machine, fed received frames and the time, handing back frames to
//! send and when to wake next.
//!
//! Every rule of a session lives here: the hello exchange, what the peer is
//! believed to hold (the *view*), how deltas are built, split and sized,
//! when to ack and heartbeat, which deltas are refused and why, and the
//! read timeouts. Nothing here touches a socket, a task, a timer or tokio:
//! time is an argument, bytes in and out are the caller's to move, and a
//! received delta is handed back to be applied by whoever owns the replica
//! (and its commits), in the manner of `quinn-proto` and `rustls`.
//!
//! Drivers:
//!
//! - `meshlog_sync::Session`: a tokio task over one byte stream;
//! - [`sync_once`]: one exchange between two replicas in memory, to
//!   quiescence (tests, benchmarks, request/response transports);
//! - a runtime's own transport (a message bus, a WebSocket it owns): call
//!   [`Protocol::poll_transmit`] and send what it gives, hand what arrives
//!   to [`Protocol::handle_payload`], apply the delta it may return and
//!   report with [`Protocol::handle_applied`], and call
//!   [`Protocol::handle_timeout`] at [`Protocol::poll_timeout`].
//!
//! # Layout
//!
//! One [`Protocol`], its state grouped by concern (the hello, what we
//! send, timing, our acks, the marks both ways, routing), its rules cut
//! along the same seams:
//!
//! - this file: the module declarations and re-exports only;
//! - `state`: [`Protocol`] and its state, [`LocalReplica`], [`Received`],
//!   and the records the state holds; a leaf every other module imports
//!   from, so imports flow one way (no module imports this file);
//! - `driver`: the driver's API (`Protocol::new`, `poll_transmit`,
//!   `handle_*`, `poll_timeout`), which hands each frame to the module
//!   that owns it;
//! - `hello`: the hello exchange and the checks on the peer's, and
//!   [`PeerMemory`], what a session leaves for the next one dialed to the
//!   same peer;
//! - `memory_bytes`: [`PeerMemory`]'s byte form, for a driver that keeps
//!   it past a restart, and [`PeerMemoryError`];
//! - `view`: the peer view, what the peer is believed to hold;
//! - `delta`: delta sizing, splitting and the send delay, and a received
//!   delta;
//! - `receipts`: acks and heartbeats both ways;
//! - `seals`: cutting and splitting a delta so that each seal stays with
//!   the run it vouches for, and no sealed run goes short of its seal;
//! - `forks`: the fork proofs the replica keeps, passed on once per
//!   session in a delta of their own;
//! - `statements`: the compaction statements the replica keeps, offered
//!   once per session to a peer past their floor (which no delta's floor
//!   reaches), and those the peer offers, applied;
//! - `refusals`: what this side does not take (`admit`: a received delta
//!   cut to the replica's admission), and why a refused delta ends the
//!   session;
//! - `timeouts`: the tick, read timeouts, round trips and retransmission;
//! - `routing`: the routes table and the streams asked quiet;
//! - `gossip`: checkpoints sent as differences, checked against their
//!   names when received, and asked for whole;
//! - `once`: [`sync_once`] and [`hand_in`].
//!
//! # Example
//!
//! ```
//! use std::time::Instant;
//! use meshlog_cursor::StreamId;
//! use meshlog_replica::SharedReplica;
//! use meshlog_sync_core::proto::{Protocol, Received};
//! use meshlog_sync_core::SessionConfig;
//!
//! let a = SharedReplica::in_memory(StreamId::new(1));
//! let b = SharedReplica::in_memory(StreamId::new(2));
//! a.append(&b"from a"[..])?;
//! /// Carries every frame `from` has to send to `to`; whether it had any.
//! fn carry(
//!     now: Instant,
//!     from: &mut Protocol,
//!     from_replica: &SharedReplica,
//!     to: &mut Protocol,
//!     to_replica: &SharedReplica,
//! ) -> Result<bool, Box<dyn std::error::Error>> {
//!     let mut moved = false;
//!     while let Some(bytes) = from.poll_transmit(now, from_replica)? {
//!         moved = true;
//!         let payload = &bytes[meshlog_sync_core::frame::LENGTH_PREFIX_BYTES..];
//!         if let Received::Apply(columns) = to.handle_payload(now, payload, to_replica)? {
//!             let applied = to_replica.apply_columns(columns);
//!             to.handle_applied(now, applied)?;
//!         }
//!     }
//!     Ok(moved)
//! }
//!
//! let now = Instant::now();
//! let mut a_side = Protocol::new(a.stream(), SessionConfig::default(), now);
//! let mut b_side = Protocol::new(b.stream(), SessionConfig::default(), now);
//! // Both ways, until neither side has anything to say.
//! while carry(now, &mut a_side, &a, &mut b_side, &b)?
//!     | carry(now, &mut b_side, &b, &mut a_side, &a)?
//! {}
//! assert_eq!(a.digest(), b.digest());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod delta;
mod driver;
mod forks;
mod gossip;
mod hello;
mod memory_bytes;
mod once;
mod receipts;
mod refusals;
mod routing;
mod seals;
mod state;
mod statements;
mod timeouts;
mod view;

pub use hello::PeerMemory;
pub use memory_bytes::{PeerMemoryError, PEER_MEMORY_BYTES_MAX};
pub use once::{hand_in, sync_once, SyncReport};
pub use state::{LocalReplica, Protocol, Received};
