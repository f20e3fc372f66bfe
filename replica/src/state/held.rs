//! What a replica holds, and nothing that acts on it: the `State` struct
//! and its fields' types (`LazyDigest`), its plain accessors and the
//! digest's arithmetic. The leaf of `state`: it imports none of its
//! siblings, and every sibling (`validate`, `plan`, `publish`, `delta`)
//! and `state` itself import the state from here.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use meshlog_cursor::{StreamId, VersionVector};

use crate::log::Log;
use crate::{Config, Digest, Event, OpenWarning, Seal, Stats, StreamChain};

/// A replica's readable state: the log, its vectors and counters.
#[derive(Debug)]
pub(crate) struct State {
    pub(super) config: Config,
    pub(super) log: Log,
    pub(super) marks: VersionVector,
    pub(super) floor: VersionVector,
    pub(super) clock: u64,
    pub(super) pending_len: usize,
    /// The digest, summed when asked ([`State::digest`]): a sender or a
    /// reader that never asks never hashes what it receives.
    pub(super) digest: Mutex<LazyDigest>,
    /// Per stream held, its chain at the floor and at the head
    /// (`docs/SIGNING.md`), moved by every commit (`state/chain.rs`); for
    /// a stream in `hashed`, `head_hash` is the chain hash at that seq,
    /// below the head (hashed lazily).
    pub(super) chains: BTreeMap<StreamId, StreamChain>,
    /// Per stream hashed lazily (neither the own keyed stream nor pinned)
    /// whose chain is recorded below its head: the seq its `head_hash` is
    /// at. Recorded by the store with the chain ([`Batch::hashed`]).
    ///
    /// [`Batch::hashed`]: crate::Batch::hashed
    pub(super) hashed: BTreeMap<StreamId, u64>,
    /// Chain hashes of lazily hashed streams computed when asked (the
    /// digest, [`State::chain`]) above what `chains` records: `(seq,
    /// hash)`, the furthest known; the next commit of the stream records
    /// it. A lock: asked under `&self`.
    pub(super) resolved: Mutex<BTreeMap<StreamId, (u64, crate::ChainHash)>>,
    pub(super) stats: Stats,
    /// Whether peers may still write this replica's own stream (see
    /// [`Config::recover_own_stream`]); appends are refused meanwhile.
    pub(super) recovering: bool,
    /// What opening accepted but reports.
    pub(super) open_warnings: Vec<OpenWarning>,
    /// The seal over the own stream's head last signed ([`State::own_seal`]),
    /// kept until the head moves. A lock: deltas are built under `&self`.
    pub(super) own_seal: Mutex<Option<Seal>>,
    /// Per stream received sealed, the key pinned for it (the first that
    /// verified): an unsealed run of it, or one sealed by another key, is
    /// refused. Recorded by the store with the kept seals
    /// ([`Batch::seals`](crate::Batch::seals)).
    pub(super) pinned: BTreeMap<StreamId, crate::WriterPublicKey>,
    /// Per stream received sealed, the seals held at and below its head,
    /// ascending, thinned ([`crate::KeptSeals::thin`]): a delta relaying
    /// the stream ends its run at one of them (`state/seals.rs`).
    pub(super) kept_seals: BTreeMap<StreamId, Vec<Seal>>,
    /// Per stream, the newest compaction statement kept: the own stream's
    /// (signed when it compacts, keyed) and those that erased a stream
    /// here; sent with the floor (`state/authority.rs`). Recorded by the
    /// store ([`Batch::statements`](crate::Batch::statements)).
    pub(super) statements: BTreeMap<StreamId, crate::SignedCompaction>,
    /// Chain hashes of the own stream at some seqs below its head (where
    /// a delta was cut, and where the gaps were read), so that a run cut
    /// below the head is sealed by chaining from the nearest one
    /// (`state/seals.rs`); bounded. A lock: deltas are built under `&self`.
    pub(super) own_hashes: Mutex<BTreeMap<u64, crate::ChainHash>>,
    /// Per stream proven forked, the first proof of it kept
    /// (`replica/src/state/forks.rs`): the stream is frozen, nothing of it
    /// above its head is taken. Recorded by the store
    /// ([`Batch::forks`](crate::Batch::forks)).
    pub(super) forks: BTreeMap<StreamId, crate::ForkProof>,
    /// How many seals [`State::own_seal`] signed ([`Stats::seals_signed`]).
    pub(super) seals_signed: std::sync::atomic::AtomicU64,
    /// The checkpoints kept, minted or received (`checkpoints.rs`): what
    /// a page's token is relative to, and what a version-2 token is read
    /// against. Recorded by the store apart from commits
    /// ([`Store::keep_checkpoints`](crate::Store::keep_checkpoints)).
    pub(crate) checkpoints: crate::checkpoints::Checkpoints,
}

impl State {
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn marks(&self) -> &VersionVector {
        &self.marks
    }

    pub(crate) fn floor(&self) -> &VersionVector {
        &self.floor
    }

    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }

    /// The digest's parts, from `&mut self` (no lock taken).
    pub(super) fn lazy_digest(&mut self) -> &mut LazyDigest {
        self.digest
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn stats(&self) -> Stats {
        let mut stats = self.stats;
        stats.seals_signed = self.seals_signed.load(std::sync::atomic::Ordering::Relaxed);
        stats
    }

    /// The seal over the own stream's head, signed by the configured key:
    /// the one kept if it is at the head still (same seq and chain hash),
    /// else signed now and kept. `None` without a key or before the
    /// first append.
    pub(crate) fn own_seal(&self) -> Option<Seal> {
        let key = self.config.key.as_ref()?;
        let stream = self.config.stream;
        let head = self.marks.get(stream);
        let chain = self.chain(stream)?;
        if head == 0 {
            return None;
        }
        let mut kept = self.own_seal.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(seal) = *kept {
            if seal.seq == head && seal.head == chain.head_hash {
                return Some(seal);
            }
        }
        let seal = Seal::sign_for(key, stream, head, chain.head_hash);
        self.seals_signed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *kept = Some(seal);
        Some(seal)
    }

    pub(crate) fn open_warnings(&self) -> &[OpenWarning] {
        &self.open_warnings
    }

    pub(crate) fn pending_len(&self) -> usize {
        self.pending_len
    }

    pub(crate) fn is_recovering(&self) -> bool {
        self.recovering
    }
}

impl Digest {
    pub(crate) fn add(&mut self, event: &Event) {
        self.events += 1;
        self.sum = self.sum.wrapping_add(event.content_hash());
    }

    pub(crate) fn remove(&mut self, event: &Event) {
        self.events -= 1;
        self.sum = self.sum.wrapping_sub(event.content_hash());
    }
}

/// The digest of the events held, summed when asked: `sum` holds every
/// held event's hash but those of `unhashed`, which per stream is the
/// first held seq not in it (every held seq from it to the head is not).
#[derive(Debug, Default)]
pub(super) struct LazyDigest {
    pub(super) sum: Digest,
    pub(super) unhashed: BTreeMap<StreamId, u64>,
}
