//! meshlog's sync protocol without I/O: the wire frames, one peer's side of
//! the protocol as a state machine fed received frames and the time, and
//! the routes table a replica's sessions share.
//!
//! Nothing here touches a socket, a task, a timer or a clock: time is an
//! argument, bytes in and out are the caller's to move, and a received
//! delta is handed back to be applied by whoever owns the replica, in the
//! manner of `quinn-proto` and `rustls`. The tokio drivers (`Session`,
//! `PeerManager`, the peer link, the frame reader) are in `meshlog-sync`,
//! which re-exports this crate's items at the same paths
//! (`meshlog_sync::frame::...`, `meshlog_sync::proto::Protocol`, ...). An
//! embedder with its own transport depends on this crate alone.
//!
//! # Layout
//!
//! - [`frame`]: the wire frames ([`Frame`], [`Hello`]), their encoding
//!   (postcard, but a delta's events written by hand as run headers and
//!   columns in repeat and literal runs) behind a `u32` length prefix,
//!   [`FRAME_BYTES_MAX`], [`DELTA_EVENTS_MAX`] and [`FrameError`]. Byte
//!   format: `docs/PROTOCOL.md`.
//! - [`proto`]: [`proto::Protocol`], one peer's side of the protocol (every
//!   rule of a session: hello, view, delta sizing and splitting, acks,
//!   heartbeats, refusals, read timeouts), its submodules cut by those
//!   concerns; and [`sync_once`], one exchange between two replicas in
//!   memory, to quiescence, at a time given by the caller.
//! - `config`: [`SessionConfig`], the timing and limits of a session.
//! - `state`: [`SessionState`], what a session knows of its peer and counts,
//!   [`LimitHit`], a limit it ran into, and [`STATEMENT_REFUSALS_MAX`].
//! - `error`: [`ProtocolError`], why the core ends a session.
//! - `routes`: [`Routes`], the table a replica's sessions share so that in
//!   a mesh with cycles an event reaches it about once, and
//!   [`PeerDirection`], who dialed.
//!
//! **Architecture invariant:** no tokio, no sockets, no clock reads. The
//! manifest has no tokio dependency, and `tests/no_tokio.rs` fails if one
//! appears in this crate's normal dependency tree. Time enters as an
//! `Instant` argument.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod config;
mod error;
pub mod frame;
pub mod proto;
mod routes;
mod state;

pub use config::SessionConfig;
pub use error::ProtocolError;
pub use frame::{
    Frame, FrameError, Hello, DELTA_EVENTS_MAX, FRAME_BYTES_CEILING, FRAME_BYTES_MAX,
    PROTOCOL_VERSION,
};
pub use proto::{sync_once, SyncReport};
pub use routes::{PeerDirection, Routes};
pub use state::{LimitHit, SessionState, STATEMENT_REFUSALS_MAX};
