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
/// # Commits and the async runtime
///
/// A change (append, apply, compact) commits to the store before it
/// returns, under the lock; on a [`DiskStore`](meshlog_replica::DiskStore)
/// that is an fsync. The plain methods run it on the calling thread, which
/// is right for threads of one's own. From async code use the `_async`
/// methods ([`SharedReplica::apply_async`], [`SharedReplica::append_async`],
/// [`SharedReplica::with_mut_async`]), which sessions use: they run the
/// change where [`Commits`] says, on tokio's blocking pool for any store but
/// a [`MemStore`], so that a commit never stalls the runtime's other tasks
/// (other sessions, their heartbeats and timeouts). The lock is still never
/// held across an `.await`: the whole change, lock included, runs on the
/// blocking thread.
///
/// A short call that finds the lock taken (`delta_for`, or reading the
/// marks and floor for a hello) still waits on its thread for the change
/// under way, commit included: the replica commits under its lock.
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
    commits: Commits,
    replica: Mutex<Replica<S>>,
    marks: watch::Sender<VersionVector>,
}

/// Where a [`SharedReplica`]'s `_async` methods run a change that may
/// commit to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commits {
    /// On tokio's blocking pool (`spawn_blocking`), for a store whose commit
    /// blocks its thread: a [`DiskStore`](meshlog_replica::DiskStore)
    /// fsyncs every commit. What [`SharedReplica::new`] picks, whatever the
    /// store, since it cannot tell.
    BlockingPool,
    /// In the calling task, for a store whose commit never blocks: a
    /// [`MemStore`], what [`SharedReplica::in_memory`] picks. No hand-off to
    /// another thread per delta, and a run under tokio's paused clock stays
    /// deterministic.
    Inline,
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
    /// A new, empty in-memory replica writing `stream`, shared, with
    /// [`Commits::Inline`]: a [`MemStore`] commit never blocks.
    pub fn in_memory(stream: StreamId) -> Self {
        SharedReplica::with_commits(Replica::new(stream), Commits::Inline)
    }
}

impl<S: Store> SharedReplica<S> {
    /// Shares `replica`, with [`Commits::BlockingPool`]: its async calls
    /// commit on tokio's blocking pool.
    pub fn new(replica: Replica<S>) -> Self {
        SharedReplica::with_commits(replica, Commits::BlockingPool)
    }

    /// Shares `replica`, its async calls committing where `commits` says.
    pub fn with_commits(replica: Replica<S>, commits: Commits) -> Self {
        let (marks, _) = watch::channel(replica.marks());
        SharedReplica {
            inner: Arc::new(Inner {
                stream: replica.stream(),
                commits,
                replica: Mutex::new(replica),
                marks,
            }),
        }
    }

    /// The replica's own stream.
    pub fn stream(&self) -> StreamId {
        self.inner.stream
    }

    /// Where the async calls commit.
    pub fn commits(&self) -> Commits {
        self.inner.commits
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

    /// Appends a local event stamped with the wall-clock time. Commits on
    /// this thread; from async code see [`SharedReplica::append_async`].
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
    /// delta changes nothing. Commits on this thread; from async code see
    /// [`SharedReplica::apply_async`].
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

impl<S: Store + Send + 'static> SharedReplica<S> {
    /// Runs `change` as [`SharedReplica::with_mut`] does (then publishes the
    /// marks), without blocking the async runtime: on tokio's blocking pool
    /// with [`Commits::BlockingPool`], at once in the calling task with
    /// [`Commits::Inline`].
    ///
    /// The lock is taken and released by `change`'s thread, never held
    /// across an `.await`. Calls awaited one after another run in that
    /// order. Once the future is polled, the change runs to its end even if
    /// the future is dropped: a change is never cut short half-way.
    ///
    /// ```
    /// use meshlog_cursor::StreamId;
    /// use meshlog_replica::Replica;
    /// use meshlog_sync::{Commits, SharedReplica};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// let shared = SharedReplica::new(Replica::new(StreamId::new(1)));
    /// assert_eq!(shared.commits(), Commits::BlockingPool);
    /// let event = shared.append_async(&b"hello"[..]).await?;
    /// let held = shared.with_mut_async(move |replica| replica.get(event.stream, event.seq)).await;
    /// assert_eq!(held, Some(event));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Panics
    ///
    /// If `change` panics (the panic is resumed in the caller, and the
    /// replica is poisoned as with [`SharedReplica::with_mut`]), or if the
    /// runtime shuts down before the change could start. With
    /// [`Commits::BlockingPool`], if called outside a tokio runtime.
    pub async fn with_mut_async<R, F>(&self, change: F) -> R
    where
        F: FnOnce(&mut Replica<S>) -> R + Send + 'static,
        R: Send + 'static,
    {
        match self.inner.commits {
            Commits::Inline => self.with_mut(change),
            Commits::BlockingPool => {
                let shared = self.clone();
                let changed = tokio::task::spawn_blocking(move || shared.with_mut(change)).await;
                match changed {
                    Ok(out) => out,
                    Err(error) => match error.try_into_panic() {
                        Ok(panic) => std::panic::resume_unwind(panic),
                        Err(_) => panic!("the runtime shut down before a replica change could run"),
                    },
                }
            }
        }
    }

    /// [`SharedReplica::apply`] without blocking the async runtime (see
    /// [`SharedReplica::with_mut_async`]). Takes the delta by value: it
    /// moves to the thread that applies it.
    pub async fn apply_async(&self, delta: Delta) -> Result<ApplyReport, ReplicaError> {
        self.with_mut_async(move |replica| replica.apply(&delta))
            .await
    }

    /// [`SharedReplica::append`] without blocking the async runtime (see
    /// [`SharedReplica::with_mut_async`]).
    pub async fn append_async(&self, payload: impl Into<Bytes>) -> Result<Event, ReplicaError> {
        let payload = payload.into();
        self.with_mut_async(move |replica| replica.append(payload))
            .await
    }
}
