//! A deterministic simulator of a meshlog mesh: real replicas
//! ([`SharedReplica`](meshlog_replica::SharedReplica) over
//! [`MemStore`](meshlog_replica::MemStore)) joined by real protocol cores
//! ([`Protocol`](meshlog_sync_core::proto::Protocol)), driven by a simulated
//! clock over a simulated network, single-threaded and seeded, so a run
//! replays exactly from its seed.
//!
//! Each session is driven as `meshlog_sync::Session` drives it, with the
//! same calls in the same order: `poll_transmit` until it gives nothing
//! after every turn (the driver's `fill`), `handle_payload` for each frame
//! received then `apply_columns` and `handle_applied` for a delta it hands
//! back, `handle_timeout` at `poll_timeout`, a session whose replica's marks
//! moved filled again (the driver's change watch), and the session closed
//! when `duplicate_of` names a peer or a call fails; a checkpoint the core
//! hands back is kept (`keep_checkpoint`), and at a wake-up a session asks
//! its replica to mint one once a heartbeat interval (`mint_checkpoint` at
//! the simulated time), so the checkpoint gossip (frames 6, 7 and the
//! hello against a checkpoint, 9) is the protocol's. Only the transport
//! differs: frames travel as datagrams with a drawn latency, and may be
//! lost, duplicated or reordered.
//!
//! # Layout
//!
//! - [`queue`]: [`Queue`], the simulated clock: timed events in a priority
//!   queue, ties broken by insertion order.
//! - [`net`]: [`NetConfig`], what a link does to a frame (latency, loss,
//!   duplication, reordering), drawn from the run's generator.
//! - [`topology`]: a random connected graph and its diameter.
//! - [`mesh`]: [`Mesh`], the nodes, links, sessions and writers, the event
//!   loop and the faults (partitions, stops, restarts, late joins,
//!   compaction), and [`Counters`].
//! - [`scenario`]: [`Scenario`], a scripted run (writes, faults, readers,
//!   then heal and converge, then a quiet window) and its [`Figures`].
//! - [`check`]: the invariants checked as a run goes ([`check::prefix_closed`],
//!   [`check::converged`]) and [`Reader`], a walk that pages one replica and
//!   fails over to another with its token, checked exactly-once.
//!
//! The `mesh-bench` binary runs the large meshes and prints the figures
//! of `docs/BENCHMARKS.md`.
//!
//! **Architecture invariant:** no tokio, no thread, no clock read: time is
//! the queue's, and every draw comes from one [`SplitMix64`](meshlog_testkit::SplitMix64)
//! seeded by the run.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod check;
pub mod mesh;
pub mod net;
pub mod queue;
pub mod scenario;
pub mod topology;

pub use check::{Reader, Violation};
pub use mesh::{Answer, Counters, Mesh, MeshConfig};
pub use net::NetConfig;
pub use queue::Queue;
pub use scenario::{Churn, Figures, Scenario, TokenFigure};
