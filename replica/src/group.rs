//! `GroupCommit`: many threads appending to one replica, batched into one
//! store commit per round.
//!
//! Callers queue their payloads and wait. A committer thread takes the
//! whole queue (up to [`GROUP_EVENTS_MAX`] events and [`GROUP_BYTES_MAX`]
//! payload bytes), appends it with [`Replica::append_batch_at`] — one store
//! commit, durable when it returns on a [`DiskStore`](crate::DiskStore) —
//! and only then hands each caller its event. Whoever queued meanwhile is
//! served by the next round, which starts at once: while one round commits,
//! the next one fills up, so the batch grows with the number of callers and
//! the cost of a commit, and no caller waits for another to be scheduled.
//!
//! Readers and sync go through [`GroupCommit::with`] and
//! [`GroupCommit::with_mut`]. The replica exposes an event only after its
//! commit returned, so a page or a delta never carries an event its writer
//! could forget.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshlog_cursor::StreamId;

use crate::{Event, Replica, ReplicaError, Store};

/// The most events one round commits.
pub const GROUP_EVENTS_MAX: usize = 4096;
/// The most payload bytes one round commits (a round takes at least one
/// event, whatever its size).
pub const GROUP_BYTES_MAX: usize = 16 << 20;

/// A replica shared by many appending threads, with group commit.
///
/// ```
/// use std::sync::Arc;
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::{GroupCommit, Replica};
///
/// let group = Arc::new(GroupCommit::new(Replica::new(StreamId::new(1))));
/// let threads: Vec<_> = (0..4)
///     .map(|i| {
///         let group = Arc::clone(&group);
///         std::thread::spawn(move || group.append(format!("from thread {i}")))
///     })
///     .collect();
/// for thread in threads {
///     thread.join().unwrap()?; // acknowledged: committed to the store
/// }
/// let page = group.with(|replica| replica.page(&VersionVector::new(), 10))?;
/// assert_eq!(page.events.len(), 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct GroupCommit<S: Store + Send + 'static> {
    shared: Arc<Shared<S>>,
    committer: Option<JoinHandle<()>>,
}

/// Counters of a [`GroupCommit`] since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Rounds committed (successfully or not).
    pub commits: u64,
    /// Events acknowledged.
    pub events: u64,
}

#[derive(Debug)]
struct Shared<S: Store> {
    replica: Mutex<Replica<S>>,
    queue: Mutex<Queue>,
    /// Signalled when a payload is queued or the group closes.
    queued: Condvar,
    stream: StreamId,
    payload_bytes_max: usize,
    commits: AtomicU64,
    events: AtomicU64,
    /// Fault injection: the committer panics outside its `catch_unwind`
    /// at its next round, as a bug of its own would.
    #[cfg(test)]
    panic_next_round: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Default)]
struct Queue {
    waiting: VecDeque<Waiter>,
    /// Whether the committer sleeps on `queued`: only then does a caller
    /// pay for a wake-up.
    idle: bool,
    closed: bool,
}

#[derive(Debug)]
struct Waiter {
    payload: Bytes,
    /// Taken when the caller is answered. A waiter dropped unanswered (its
    /// round lost to a panic in the committer, or left in the queue of a
    /// committer that is gone) answers [`ReplicaError::Failed`], so that no
    /// caller waits forever.
    slot: Option<Arc<Slot>>,
}

impl Waiter {
    fn answer(&mut self, outcome: Result<Event, ReplicaError>) {
        if let Some(slot) = self.slot.take() {
            slot.finish(outcome);
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.answer(Err(ReplicaError::Failed));
    }
}

/// Where the committer leaves one caller's outcome.
#[derive(Debug, Default)]
struct Slot {
    done: Mutex<Option<Result<Event, ReplicaError>>>,
    changed: Condvar,
}

impl Slot {
    fn finish(&self, outcome: Result<Event, ReplicaError>) {
        *lock(&self.done) = Some(outcome);
        self.changed.notify_one();
    }

    fn wait(&self) -> Result<Event, ReplicaError> {
        let mut done = lock(&self.done);
        loop {
            if let Some(outcome) = done.take() {
                return outcome;
            }
            done = self
                .changed
                .wait(done)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl<S: Store + Send + 'static> GroupCommit<S> {
    /// Shares `replica` among appending threads, starting its committer
    /// thread.
    pub fn new(replica: Replica<S>) -> Self {
        let shared = Arc::new(Shared {
            stream: replica.stream(),
            payload_bytes_max: replica.config().payload_bytes_max,
            replica: Mutex::new(replica),
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            commits: AtomicU64::new(0),
            events: AtomicU64::new(0),
            #[cfg(test)]
            panic_next_round: std::sync::atomic::AtomicBool::new(false),
        });
        let committer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("meshlog-group-commit".to_string())
                .spawn(move || shared.run())
                .expect("spawn the group commit thread")
        };
        GroupCommit {
            shared,
            committer: Some(committer),
        }
    }

    /// Appends a local event stamped with the current wall-clock time, in
    /// the next group commit. Returns once the commit holding it returned:
    /// on a [`DiskStore`](crate::DiskStore), once it is durable.
    ///
    /// A payload over the limit is refused alone. A failed commit fails
    /// every append of its round (each gets the store's error) and poisons
    /// the replica: later appends get [`ReplicaError::Failed`] until it is
    /// reopened. So does a panic, in the replica or in the committer
    /// itself: every caller is answered.
    pub fn append(&self, payload: impl Into<Bytes>) -> Result<Event, ReplicaError> {
        let shared = &self.shared;
        let payload = payload.into();
        if payload.len() > shared.payload_bytes_max {
            return Err(ReplicaError::PayloadTooLarge {
                stream: shared.stream,
                len: payload.len(),
                limit: shared.payload_bytes_max,
            });
        }
        let slot = Arc::new(Slot::default());
        let idle = {
            let mut queue = lock(&shared.queue);
            // Closed while the group is borrowed: the committer is gone
            // (see `Shared::run`), and nothing would answer.
            if queue.closed {
                return Err(ReplicaError::Failed);
            }
            queue.waiting.push_back(Waiter {
                payload,
                slot: Some(Arc::clone(&slot)),
            });
            std::mem::take(&mut queue.idle)
        };
        if idle {
            shared.queued.notify_one();
        }
        slot.wait()
    }

    /// Runs `read` on the replica: paging, deltas for sync, marks. Waits
    /// for a commit under way. A replica poisoned by a panic is still
    /// readable.
    pub fn with<R>(&self, read: impl FnOnce(&Replica<S>) -> R) -> R {
        read(&lock(&self.shared.replica))
    }

    /// Runs `change` on the replica: applying a peer's delta, compacting.
    /// Serialized with the rounds of appends.
    ///
    /// `change` runs under the replica's lock: calling this group's
    /// [`GroupCommit::append`] from inside it deadlocks (the committer
    /// needs the same lock). Append through the replica directly there, or
    /// outside `change`.
    pub fn with_mut<R>(&self, change: impl FnOnce(&mut Replica<S>) -> R) -> R {
        change(&mut lock(&self.shared.replica))
    }

    /// Counters since this group was made.
    pub fn stats(&self) -> GroupStats {
        GroupStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            events: self.shared.events.load(Ordering::Relaxed),
        }
    }

    /// Stops the committer and hands back the replica. No append can be
    /// under way: this takes the group by value.
    pub fn into_inner(mut self) -> Replica<S> {
        self.close();
        let shared = Arc::clone(&self.shared);
        drop(self);
        let shared = Arc::into_inner(shared).expect("the committer thread has ended");
        shared
            .replica
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn close(&mut self) {
        lock(&self.shared.queue).closed = true;
        // Whether or not the committer sleeps: a spare wake-up is harmless.
        self.shared.queued.notify_one();
        if let Some(committer) = self.committer.take() {
            // The committer catches panics from the replica; a panic here
            // would be its own bug, and is re-raised only if we are not
            // already unwinding.
            if let Err(panic) = committer.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
}

impl<S: Store + Send + 'static> Drop for GroupCommit<S> {
    fn drop(&mut self) {
        self.close();
    }
}

impl<S: Store> Shared<S> {
    /// The committer thread: one round per wake-up while anything is
    /// queued; ends when the group closes and the queue is empty.
    fn run(&self) {
        let _closing = CloseOnExit(self);
        while let Some(round) = self.next_round() {
            #[cfg(test)]
            if self.panic_next_round.load(Ordering::Relaxed) {
                panic!("injected: the committer dies holding a round");
            }
            self.commit_round(round);
        }
    }

    /// Waits for payloads and takes the queue's front, up to the limits.
    /// `None` once the group is closed and nothing is left.
    fn next_round(&self) -> Option<Vec<Waiter>> {
        let mut queue = lock(&self.queue);
        while queue.waiting.is_empty() {
            if queue.closed {
                return None;
            }
            queue.idle = true;
            queue = self
                .queued
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
        queue.idle = false;
        let mut bytes = 0usize;
        let mut len = 0usize;
        for waiter in &queue.waiting {
            bytes = bytes.saturating_add(waiter.payload.len());
            if len > 0 && (len == GROUP_EVENTS_MAX || bytes > GROUP_BYTES_MAX) {
                break;
            }
            len += 1;
        }
        Some(queue.waiting.drain(..len).collect())
    }

    /// Appends one round in one commit, then gives every caller its
    /// outcome.
    fn commit_round(&self, mut round: Vec<Waiter>) {
        let committed = catch_unwind(AssertUnwindSafe(|| {
            let payloads = round.iter().map(|waiter| waiter.payload.clone());
            match self.replica.lock() {
                Ok(mut replica) => replica.append_batch_at(payloads, now_ms()),
                // A panic inside the replica may have left it half-changed.
                Err(_) => Err(ReplicaError::Failed),
            }
        }));
        self.commits.fetch_add(1, Ordering::Relaxed);
        match committed {
            Ok(Ok(events)) => {
                assert_eq!(events.len(), round.len(), "one event per payload");
                self.events
                    .fetch_add(events.len() as u64, Ordering::Relaxed);
                for (waiter, event) in round.iter_mut().zip(events) {
                    waiter.answer(Ok(event));
                }
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, events = round.len(), "group commit failed");
                let error = Arc::new(error);
                for waiter in &mut round {
                    waiter.answer(Err(share(&error)));
                }
            }
            Err(_) => {
                tracing::error!(
                    events = round.len(),
                    "the replica panicked in a group commit; appends fail from now on"
                );
                for waiter in &mut round {
                    waiter.answer(Err(ReplicaError::Failed));
                }
            }
        }
    }
}

/// Closes the queue when the committer thread ends, however it ends (the
/// group closing, or a panic of its own), and answers every caller still
/// queued: nothing waits for a committer that is gone.
struct CloseOnExit<'a, S: Store>(&'a Shared<S>);

impl<S: Store> Drop for CloseOnExit<'_, S> {
    fn drop(&mut self) {
        let orphans: Vec<Waiter> = {
            let mut queue = lock(&self.0.queue);
            queue.closed = true;
            queue.waiting.drain(..).collect()
        };
        // Each answers `Failed` as it drops, outside the queue's lock.
        drop(orphans);
    }
}

/// One round's error, for each of its callers.
fn share(error: &Arc<ReplicaError>) -> ReplicaError {
    match &**error {
        ReplicaError::PayloadTooLarge { stream, len, limit } => ReplicaError::PayloadTooLarge {
            stream: *stream,
            len: *len,
            limit: *limit,
        },
        ReplicaError::ClockExhausted { stream } => ReplicaError::ClockExhausted { stream: *stream },
        ReplicaError::Failed => ReplicaError::Failed,
        _ => ReplicaError::Store(Box::new(RoundFailed(Arc::clone(error)))),
    }
}

/// The error of a group commit round, shared by every append in it.
#[derive(Debug)]
struct RoundFailed(Arc<ReplicaError>);

impl std::fmt::Display for RoundFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the group commit holding this append failed: {}", self.0)
    }
}

impl std::error::Error for RoundFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Review regression: a panic in the committer thread outside its
    /// `catch_unwind` dropped its round unanswered and left every later
    /// append queued for a thread that was gone: those callers waited
    /// forever.
    #[test]
    fn appends_are_answered_not_left_waiting_when_the_committer_dies() {
        let group = Arc::new(GroupCommit::new(Replica::new(StreamId::new(1))));
        assert_eq!(group.append(&b"before"[..]).unwrap().seq, 1);
        group.shared.panic_next_round.store(true, Ordering::Relaxed);
        let (outcome_tx, outcome) = mpsc::channel();
        let caller = {
            let group = Arc::clone(&group);
            std::thread::spawn(move || {
                let _ = outcome_tx.send(group.append(&b"in the lost round"[..]));
            })
        };
        let lost = outcome
            .recv_timeout(Duration::from_secs(60))
            .expect("the caller in the lost round was never answered");
        assert!(matches!(lost, Err(ReplicaError::Failed)), "{lost:?}");
        caller.join().unwrap();
        // Refused at once, not queued for a committer that is gone.
        let after = group.append(&b"after"[..]);
        assert!(matches!(after, Err(ReplicaError::Failed)), "{after:?}");
        // What was committed stays readable.
        assert_eq!(
            group.with(|replica| replica.marks().get(StreamId::new(1))),
            1
        );
        // Dropping the group re-raises the committer's own panic (a bug).
        let group = Arc::into_inner(group).expect("the only handle left");
        assert!(catch_unwind(AssertUnwindSafe(|| drop(group))).is_err());
    }
}
