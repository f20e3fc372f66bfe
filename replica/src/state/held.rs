//! What a replica holds, and nothing that acts on it: the `State` struct
//! and its fields' types (`LazyDigest`), its plain accessors, the digest's
//! arithmetic and the store-error conversions. The leaf of `state`: it
//! imports none of its siblings, and every sibling (`validate`, `plan`,
//! `publish`, `delta`) and `state` itself import the state from here.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use meshlog_cursor::{StreamId, VersionVector};

use crate::log::Log;
use crate::mem::ReadError;
use crate::{Config, Digest, Event, OpenWarning, ReplicaError, Stats, StreamChain};

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
    /// (`docs/SIGNING.md`), moved by every commit (`state/chain.rs`).
    pub(super) chains: BTreeMap<StreamId, StreamChain>,
    pub(super) stats: Stats,
    /// Whether peers may still write this replica's own stream (see
    /// [`Config::recover_own_stream`]); appends are refused meanwhile.
    pub(super) recovering: bool,
    /// What opening accepted but reports.
    pub(super) open_warnings: Vec<OpenWarning>,
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
        self.stats
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

pub(crate) fn read_error(error: ReadError) -> ReplicaError {
    ReplicaError::Store(error)
}

pub(crate) fn store_error<E: std::error::Error + Send + Sync + 'static>(error: E) -> ReplicaError {
    ReplicaError::Store(Box::new(error))
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
