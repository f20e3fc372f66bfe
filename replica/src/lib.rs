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
//! - `admission`: [`Admission`], how much of a received delta the
//!   replica's limits take (asked before applying it).
//! - `checkpoints`: the checkpoints a replica keeps ([`CHECKPOINTS_KEPT`],
//!   minted at most every [`CHECKPOINT_INTERVAL_MS`] or received), the
//!   shortest token a page answers, and a token of either version read
//!   back ([`Replica::cursor`]; `docs/TOKEN.md`, "Version 2").
//! - `event`: [`Event`], named `(stream, seq)`, with its content hash;
//!   `chain`: [`ChainHash`], each event committed to the one below it
//!   (`docs/SIGNING.md`), what a replica keeps of it per stream
//!   ([`StreamChain`]) and the digest of the chain heads
//!   ([`ChainDigest`]).
//! - `replica`: [`Replica`], one owner's replica — append, validate/apply,
//!   page, delta, compact, digest — and its [`Config`].
//! - `log`: each stream's gap-free prefix (floor, head) and pending buffer,
//!   where its events are read from, and the walk behind paging and deltas
//!   (a k-way merge of the streams in page order).
//! - `mem`: events in memory in chunked columns (`MemStore`'s data, or a
//!   replica's own copy), and the `Source` the walk reads through;
//!   `narrow`: a column of 16- or 32-bit offsets from a base while its
//!   values fit.
//! - `seal`: writer keys and their stream ids ([`WriterKey`],
//!   [`WriterPublicKey`]), [`Seal`]s over a stream's chain hash and their
//!   batch check ([`verify_seals`]), and the signed statements
//!   ([`Compaction`], [`WriterAdmission`], [`Binding`]); pure functions of
//!   bytes, errors [`SealError`] (`docs/SIGNING.md`).
//! - `fork`: [`ForkProof`], a writer's equivocation under valid seals as
//!   anyone can check it (its encoding and [`ForkError`]).
//! - `membership`: [`Membership`], the writers a replica accepts and the
//!   legacy streams bound to their keys (its trust configuration).
//! - `policy`: [`RetentionPolicy`], which picks a floor to compact to.
//! - `store`: the [`Store`] trait, its [`StoreView`], and [`MemStore`].
//! - `disk`: [`DiskStore`], the durable store on redb, and [`DiskError`];
//!   its events in blocks per stream (`disk::block`), read through a
//!   snapshot per commit (`disk::view`); formats 1 and 2 upgraded on open
//!   (`disk::upgrade`).
//! - `state`: the readable state, and every change split into validate →
//!   plan → commit → publish (crate-private): `state/held.rs` holds the
//!   `State` struct (the leaf every sibling imports it from),
//!   `state/validate.rs` decides what is accepted, `state/plan.rs` folds a
//!   round in submission order, `state/publish.rs` performs it,
//!   `state/delta.rs` builds deltas; `state/mod.rs` opens, verifies and
//!   reads.
//! - `shared`: [`SharedReplica`], the one handle every task shares: reads
//!   that never wait on a commit, group commit (a committer thread or the
//!   caller), runtime-agnostic async writes ([`Completion`]) and change
//!   notification ([`Change`]).
//! - `error`: [`ReplicaError`], [`DeltaError`] (what a peer's delta breaks),
//!   [`OpenWarning`] (what `open` accepted but reports) and [`PageError`].
//!
//! **Architecture invariant:** this crate never touches the network; its only
//! I/O is the durable store (`disk`, files in one data directory). It knows
//! nothing of frames or sockets (that is `meshlog-sync`) and encodes no tokens
//! itself: it picks, of the encodings `meshlog-cursor` writes, the shortest.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod admission;
mod chain;
mod checkpoints;
mod columns;
mod disk;
mod error;
mod event;
mod fork;
mod log;
mod mem;
mod membership;
mod narrow;
mod policy;
mod replica;
mod seal;
mod shared;
mod state;
mod store;
mod stream_page;
mod values;

pub use admission::{Admission, Cut, Limit};
pub use chain::{ChainDigest, ChainHash, StreamChain, StreamHead};
pub use checkpoints::{CHECKPOINTS_KEPT, CHECKPOINT_INTERVAL_MS};
pub use columns::{ColumnRun, ColumnsError, DeltaColumns};
pub use disk::{
    DiskError, DiskOptions, DiskStore, FoldLag, Recovery, CACHE_BYTES_DEFAULT,
    CHECKPOINT_BYTES_DEFAULT, CHECKPOINT_RECORDS_DEFAULT, DATA_FILE, FORMAT_VERSION, LOCK_FILE,
    LOCK_WAIT_DEFAULT, SEGMENT_FILE, UNFOLDED_BYTES_MAX_DEFAULT, UNFOLDED_RECORDS_MAX_DEFAULT,
};
pub use error::{DeltaError, OpenWarning, PageError, ReplicaError};
pub use fork::{ForkBranch, ForkError, ForkProof};
pub use seal::{
    verify_seals, AdminKey, AdminPublicKey, Binding, Compaction, CompactionSigner, FloorProofs,
    KeptSeals, KeyFault, RunSeal, Seal, SealError, SignedAdmission, SignedBinding,
    SignedCompaction, WriterAdmission, WriterKey, WriterPublicKey,
};
pub use values::{Piece, Values, ValuesRef};

/// The largest lamport stamp a replica accepts from a peer: `2^62`. A
/// clock advances by one per append, so no honest writer gets near it,
/// and a peer stamping above it cannot push the receiver's clock to where
/// its own appends fail ([`ReplicaError::ClockExhausted`]): `2^62` appends
/// are left above it.
pub const LAMPORT_MAX: u64 = 1 << 62;
pub use event::Event;
pub use membership::Membership;
pub use policy::RetentionPolicy;
pub use replica::{
    ApplyReport, CompactReport, Config, Delta, Digest, Page, Replica, Stats, Verified, PAGE_LEN_MAX,
};
pub use shared::{
    Change, ChangeHook, CommitStats, Commits, Completion, SharedReplica, ROUND_BYTES_MAX,
    ROUND_EVENTS_MAX,
};
pub use store::{Batch, MemStore, Store, StoreMeta, StoreView};
