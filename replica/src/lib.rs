//! meshlog's delta-state log: one runtime's replica of the mesh's events.
//!
//! A [`Replica`] holds, for every writer stream, exactly the events
//! `floor+1 ..= head` — never a hole — and its own stream, which it appends
//! to. Replicas converge by sending each other [`Delta`]s: what the other
//! misses, computed from its marks (the head vector). Readers [`Replica::page`]
//! through the log with a version-vector cursor, so a resumed walk returns
//! every event exactly once, on any replica, including an event stamped below
//! the walk's position that arrived late. Compaction raises a floor; a cursor
//! below it gets [`PageError::Stale`], never a silent skip.
//!
//! # Layout
//!
//! - `event`: [`Event`], named `(stream, seq)`, with its content hash.
//! - `replica`: [`Replica`] — append, validate/apply, page, delta, compact,
//!   digest.
//! - `log`: the held events in page order, each stream's gap-free prefix and
//!   pending buffer, and the walk behind paging and deltas.
//! - `order`: the sorted, chunked map that holds the events in page order.
//! - `policy`: [`RetentionPolicy`], which picks a floor to compact to.
//! - `store`: the [`Store`] trait and [`MemStore`].
//! - `disk`: [`DiskStore`], the durable store on redb, and [`DiskError`].
//! - `group`: [`GroupCommit`], many appending threads batched into one
//!   durable commit per round.
//! - `error`: [`ReplicaError`] and [`PageError`].
//!
//! **Architecture invariant:** this crate never touches the network; its only
//! I/O is the durable store (`disk`, files in one data directory). It knows
//! nothing of frames or sockets (that is `meshlog-sync`) and encodes no tokens
//! (that is `meshlog-cursor`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod disk;
mod error;
mod event;
mod group;
mod log;
mod order;
mod policy;
mod replica;
mod store;

pub use disk::{DiskError, DiskStore, Recovery, DATA_FILE, FORMAT_VERSION, LOCK_FILE};
pub use error::{PageError, ReplicaError};
pub use event::Event;
pub use group::{GroupCommit, GroupStats, GROUP_BYTES_MAX, GROUP_EVENTS_MAX};
pub use policy::RetentionPolicy;
pub use replica::{ApplyReport, CompactReport, Config, Delta, Digest, Page, Replica, Stats};
pub use store::{Batch, MemStore, Store, StoreMeta};
