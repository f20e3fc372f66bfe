//! meshlog's test kit: what every crate's tests and benches share, so that
//! a seed means the same thing everywhere and a failing test replays the same
//! way in every crate.
//!
//! Dev-only: crates use it through `[dev-dependencies]` (benches and sync's
//! `testkit` feature excepted, neither of which ships in a runtime). Its
//! own dependencies are `meshlog-cursor` and `meshlog-replica`, so the test
//! stores can wrap any [`meshlog_replica::Store`], and redb (the version
//! `meshlog-replica` pins), for the power-loss backend.
//!
//! # Layout
//!
//! - [`rng`]: [`SplitMix64`], the one seeded generator of the workspace's
//!   tests: draws, ranges, chances, shuffles, derived child seeds.
//! - [`seed`]: the one seed format (printed in decimal; read from
//!   `MESHLOG_SEED` in decimal or `0x` hexadecimal), the seeds a test runs,
//!   and the guards that print `replay with MESHLOG_SEED=<seed>` when a
//!   seeded test panics.
//! - [`store`]: [`FlakyStore`], a store whose commits fail on demand or
//!   after N commits, and [`HeldStore`], a store whose commits block until
//!   the test releases them.
//! - [`power`]: [`PowerDisk`], a simulated disk whose unsynced writes a
//!   power cut loses (whole, in part, torn or reordered), and
//!   [`PowerBackend`], the redb storage backend a `DiskStore` opens over it.
//! - [`hostile`]: [`hostile::tamperings`], a hostile relay's ways with a
//!   writer's sealed delta, each with the refusal a receiver must answer.
//! - [`damage`]: [`damage::flip_bit_in_block`], a bit flipped inside one
//!   block of a closed `DiskStore`'s data file, for a store whose reads
//!   fail where a damaged disk's would.
//! - [`alloc`]: [`CountingAlloc`], a global allocator that counts this
//!   thread's live and peak heap bytes and its allocations, and
//!   [`alloc::measure`], which measures a closure.
//! - [`churn`]: [`churn::churned`], a replica holding live writers' streams
//!   beside retired ones compacted to their head, and a checkpoint.
//!
//! A crate's own `#[cfg(test)]` unit tests link a second copy of that crate
//! (this kit links the normal build), so unit tests inside `meshlog-replica`
//! or `meshlog-cursor` may use only the type-free parts: [`rng`] and
//! [`seed`]. Integration tests link one copy and may use all of it.
//!
//! # Example
//!
//! ```
//! use meshlog_testkit::{seed, SplitMix64};
//!
//! // Runs each seed (or only `MESHLOG_SEED`, if set); a panic prints the
//! // seed and the command that replays it, then fails the test.
//! seed::for_each_seed("draws_stay_in_range", 0x5eed, 4, |seed| {
//!     let mut rng = SplitMix64::new(seed);
//!     assert!(rng.below(6) < 6);
//! });
//! ```
#![deny(missing_docs)]

pub mod alloc;
pub mod churn;
pub mod damage;
pub mod deps;
pub mod hostile;
pub mod power;
pub mod rng;
pub mod seed;
pub mod snapshot;
pub mod store;

pub use alloc::CountingAlloc;
pub use power::{Loss, PowerBackend, PowerDisk};
pub use rng::SplitMix64;
pub use snapshot::Snapshot;
pub use store::{CommitFaults, CommitGate, FlakyError, FlakyStore, HeldCommit, HeldStore};

// The kit's own unit tests measure with the allocator they test.
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;
