//! `SharedReplica`: one replica shared by appenders, readers and sessions.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    ApplyReport, CompactReport, Delta, Digest, Event, MemStore, Page, PageError, Replica,
    ReplicaError, Stats, Store,
};
use tokio::sync::watch;

/// A replica behind a mutex, with a watch of its marks that wakes every
/// session when the log changes (a local append or a delta from any peer).
///
/// Cheap to clone: clones share the replica. Every method takes the lock for
/// the length of one replica call and never across an `.await`, so a slow
/// peer never holds up an append. Sessions compute what to send from the
/// replica itself, so no per-peer queue of events grows while a peer lags.
/// If a replica call ever panics, every later call panics too: a replica
/// interrupted mid-change is not served or sent to peers.
///
/// ```
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_sync::SharedReplica;
///
/// let shared = SharedReplica::in_memory(StreamId::new(1));
/// let mut marks = shared.subscribe();
/// shared.append(&b"hello"[..])?;
/// assert!(marks.has_changed()?);
/// assert_eq!(marks.borrow_and_update().get(StreamId::new(1)), 1);
/// let page = shared.page(&VersionVector::new(), 10)?;
/// assert_eq!(page.events.len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SharedReplica<S: Store = MemStore> {
    inner: Arc<Inner<S>>,
}

struct Inner<S: Store> {
    stream: StreamId,
    replica: Mutex<Replica<S>>,
    marks: watch::Sender<VersionVector>,
}

impl<S: Store> Clone for SharedReplica<S> {
    fn clone(&self) -> Self {
        SharedReplica {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: Store> std::fmt::Debug for SharedReplica<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReplica")
            .field("stream", &self.inner.stream)
            .field("marks", &*self.inner.marks.borrow())
            .finish()
    }
}

impl SharedReplica<MemStore> {
    /// A new, empty in-memory replica writing `stream`, shared.
    pub fn in_memory(stream: StreamId) -> Self {
        SharedReplica::new(Replica::new(stream))
    }
}

impl<S: Store> SharedReplica<S> {
    /// Shares `replica`.
    pub fn new(replica: Replica<S>) -> Self {
        let (marks, _) = watch::channel(replica.marks());
        SharedReplica {
            inner: Arc::new(Inner {
                stream: replica.stream(),
                replica: Mutex::new(replica),
                marks,
            }),
        }
    }

    /// The replica's own stream.
    pub fn stream(&self) -> StreamId {
        self.inner.stream
    }

    /// The marks as last published (no lock taken).
    pub fn marks(&self) -> VersionVector {
        self.inner.marks.borrow().clone()
    }

    /// A receiver that sees the marks change after every append or apply
    /// that changed the log.
    pub fn subscribe(&self) -> watch::Receiver<VersionVector> {
        self.inner.marks.subscribe()
    }

    /// Appends a local event stamped with the wall-clock time.
    pub fn append(&self, payload: impl Into<Bytes>) -> Result<Event, ReplicaError> {
        self.with_mut(|replica| replica.append(payload))
    }

    /// Appends a local event with an explicit wall-clock time.
    pub fn append_at(
        &self,
        payload: impl Into<Bytes>,
        time_ms: u64,
    ) -> Result<Event, ReplicaError> {
        self.with_mut(|replica| replica.append_at(payload, time_ms))
    }

    /// A page of events after `after` (see [`Replica::page`]).
    pub fn page(&self, after: &VersionVector, limit: usize) -> Result<Page, PageError> {
        self.lock().page(after, limit)
    }

    /// Validates, then applies a delta (see [`Replica::apply`]); a refused
    /// delta changes nothing.
    pub fn apply(&self, delta: &Delta) -> Result<ApplyReport, ReplicaError> {
        self.with_mut(|replica| replica.apply(delta))
    }

    /// What a peer with marks `their_marks` misses, up to `byte_budget`
    /// (see [`Replica::delta_for`]).
    pub fn delta_for(&self, their_marks: &VersionVector, byte_budget: usize) -> Delta {
        self.lock().delta_for(their_marks, byte_budget)
    }

    /// Compacts to `target` (see [`Replica::compact`]).
    pub fn compact(&self, target: &VersionVector) -> Result<CompactReport, ReplicaError> {
        self.with_mut(|replica| replica.compact(target))
    }

    /// The floor.
    pub fn floor(&self) -> VersionVector {
        self.lock().floor()
    }

    /// The digest of the events held.
    pub fn digest(&self) -> Digest {
        self.lock().digest()
    }

    /// The replica's counters.
    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// Runs `read` with the replica locked: for anything the methods above
    /// do not cover. Do not block in it.
    pub fn with<R>(&self, read: impl FnOnce(&Replica<S>) -> R) -> R {
        read(&self.lock())
    }

    /// Runs `change` with the replica locked, then publishes the marks if
    /// they moved. Do not block in it.
    pub fn with_mut<R>(&self, change: impl FnOnce(&mut Replica<S>) -> R) -> R {
        let mut replica = self.lock();
        let out = change(&mut replica);
        // Published under the lock, so the watch never shows marks older
        // than a value it showed before.
        let marks = replica.marks();
        self.inner.marks.send_if_modified(|published| {
            if *published == marks {
                false
            } else {
                *published = marks;
                true
            }
        });
        out
    }

    fn lock(&self) -> MutexGuard<'_, Replica<S>> {
        // Poisoned means a replica call panicked (a failed invariant
        // assertion) part-way through a change: its state cannot be trusted,
        // so every user of it stops too rather than serve or send it.
        self.inner
            .replica
            .lock()
            .expect("the replica's lock is poisoned: a replica call panicked mid-change")
    }
}
