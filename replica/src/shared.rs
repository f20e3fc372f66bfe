//! `SharedReplica`: the one handle every task of a runtime shares: appenders,
//! readers, sync sessions and the node.
//!
//! # Locking
//!
//! Two locks, never held the other way round:
//!
//! - the **writer lock** (the store, and whether a commit failed) is held by
//!   whoever commits a round: it covers planning, the store commit and
//!   publishing, so rounds are serialized;
//! - the **state lock** (a read-write lock on the readable state) is taken
//!   *shared* by readers and by planning, and *exclusively* only to publish
//!   a committed round, which is memory work.
//!
//! So `page`, `delta_for`, `marks`, `floor`, `digest` and `get` never wait
//! for a store commit in progress, only for a publish; and nothing is
//! visible before its commit (a failed commit publishes nothing).
//!
//! # Group commit
//!
//! Writes (appends, batches, deltas, compactions) are queued as requests.
//! Whoever commits takes everything queued (up to [`ROUND_EVENTS_MAX`]
//! events and [`ROUND_BYTES_MAX`] payload bytes) into one **round**: one
//! plan, one store commit, one publish. Callers are answered in submission
//! order: a round's after its commit, one after another in the order they
//! were queued, and all of them before the next round is planned
//! (`replica/tests/round_fold.rs` logs the order as they are answered).
//! With [`Commits::Thread`] a committer thread commits; callers block
//! (`append`) or await (`append_async`, a runtime-agnostic future) their
//! answer; when fewer requests are queued than its last round held, it
//! waits up to 300 µs for the callers it just answered, so rounds stay
//! full. With [`Commits::Inline`] the caller
//! commits the queue itself under the writer lock (for a store whose commit
//! never blocks, such as [`MemStore`]); an append that finds nothing queued
//! there skips the round's machinery (no request, answer slot or round
//! plan of its own) and commits at the single-owner [`Replica`]'s cost
//! (`Inner::append_inline`).
//!
//! # Change notification
//!
//! After every round that moved the marks or the floor, the handle
//! publishes a [`Change`]: waiters of [`SharedReplica::wait_for_change`]
//! wake, and hooks registered with [`SharedReplica::on_change`] run, in
//! commit order. Every write path (single, batch, delta, compaction)
//! reaches it.
//!
//! # Poison policy
//!
//! A panic inside a round (an invariant assertion: a bug) may leave the
//! readable state half-published. The handle then stops serving it: every
//! later write answers [`ReplicaError::Failed`], `page` answers
//! [`PageError::Failed`], `delta_for` answers an empty delta and `get`
//! `None`; `marks` and `floor` keep answering the last values published
//! before the panic, and `digest` the last one it answered. Reopen the store to recover. A failed store
//! commit is not a panic: the state is unchanged and keeps being served,
//! and writes answer `Failed` until reopen (`docs/STORAGE.md`).

use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshlog_cursor::{Checkpoint, CheckpointName, StreamId, VersionVector};

use crate::checkpoints::CheckpointWork;
use crate::error::store_error;
use crate::replica::now_ms;
use crate::state::{AppendRequest, Plan, Planned, RoundItem, State};
use crate::{
    ApplyReport, ChainDigest, CompactReport, Config, Delta, DeltaColumns, Digest, Event, MemStore,
    OpenWarning, Page, PageError, Replica, ReplicaError, RetentionPolicy, Stats, Store,
    StreamChain, Verified,
};

/// The most events one round commits (a round takes at least one request,
/// whatever its size).
pub const ROUND_EVENTS_MAX: usize = 4096;
/// The most payload bytes one round commits.
pub const ROUND_BYTES_MAX: usize = 16 << 20;
/// The longest the committer thread waits for a round to grow back to the
/// size of the last one (see `next_round`).
const ROUND_LINGER: Duration = Duration::from_micros(300);

/// Who commits a [`SharedReplica`]'s rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commits {
    /// A committer thread of the handle's own: callers never commit, so an
    /// async caller never blocks its runtime on a durable commit (a
    /// [`DiskStore`](crate::DiskStore) fsyncs each one). What
    /// [`SharedReplica::new`] picks.
    Thread,
    /// The caller, under the writer lock, taking whatever else is queued
    /// along: for a store whose commit never blocks ([`MemStore`]). No
    /// hand-off per write, and a test under a paused clock stays
    /// deterministic. What [`SharedReplica::in_memory`] picks.
    Inline,
}

/// The marks and floor after a committed round that moved them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Change {
    /// Counts the changes published since the handle was made.
    pub version: u64,
    /// The marks after the round.
    pub marks: VersionVector,
    /// The floor after the round.
    pub floor: VersionVector,
}

/// Counters of a handle's rounds since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Rounds that committed to the store (successfully or not).
    pub commits: u64,
    /// Local events acknowledged.
    pub appended: u64,
    /// Rounds planned (a round that commits nothing counts too).
    pub rounds: u64,
    /// Rounds of two requests or more: group commits.
    pub grouped_rounds: u64,
    /// The most requests one round took.
    pub largest_round: u64,
}

/// Unregisters its hook when dropped (see [`SharedReplica::on_change`]).
#[must_use = "the hook is unregistered when this is dropped"]
pub struct ChangeHook {
    hooks: std::sync::Weak<Mutex<Hooks>>,
    id: u64,
}

impl std::fmt::Debug for ChangeHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeHook").field("id", &self.id).finish()
    }
}

impl Drop for ChangeHook {
    fn drop(&mut self) {
        if let Some(hooks) = self.hooks.upgrade() {
            lock(&hooks).list.retain(|(id, _)| *id != self.id);
        }
    }
}

type Hook = Arc<dyn Fn(&Change) + Send + Sync>;

#[derive(Default)]
struct Hooks {
    next_id: u64,
    list: Vec<(u64, Hook)>,
}

/// One replica shared by every task: cheap to clone, `Send + Sync`.
///
/// Requests queued together are planned as one round and committed to the
/// store at once (a group commit). A round is a left fold: each request
/// ends as it would applied one by one, in submission order, answers and
/// counters included — with one difference a group commit cannot avoid.
/// When the store commit of a round fails, every request of the round that
/// would have changed the store answers the round's store error
/// ([`ReplicaError::Store`]), and none of it is visible, where one by one
/// the requests before the failing one would have been committed and
/// durable. (Requests the round refuses answer their refusal either way;
/// every request after the failure answers [`ReplicaError::Failed`] until
/// the replica is reopened, as one by one.)
/// `replica/tests/round_failure.rs` shows the answers side by side.
///
/// ```
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::SharedReplica;
///
/// let shared = SharedReplica::in_memory(StreamId::new(1));
/// let threads: Vec<_> = (0..4)
///     .map(|i| {
///         let shared = shared.clone();
///         std::thread::spawn(move || shared.append(format!("from thread {i}")))
///     })
///     .collect();
/// for thread in threads {
///     thread.join().unwrap()?; // acknowledged: committed to the store
/// }
/// let batch = shared.append_batch(vec!["a".into(), "b".into()])?; // one commit
/// assert_eq!(batch[1].seq, 6);
/// let page = shared.page(&VersionVector::new(), 10)?;
/// assert_eq!(page.events.len(), 6);
/// assert_eq!(shared.latest_change().marks.get(StreamId::new(1)), 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct SharedReplica<S: Store = MemStore> {
    owner: Arc<Owner<S>>,
}

impl<S: Store> Clone for SharedReplica<S> {
    fn clone(&self) -> Self {
        SharedReplica {
            owner: Arc::clone(&self.owner),
        }
    }
}

impl<S: Store> std::fmt::Debug for SharedReplica<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReplica")
            .field("stream", &self.inner().stream)
            .field("commits", &self.inner().commits)
            .field("marks", &self.latest_change().marks)
            .finish()
    }
}

/// Owns the committer thread: the last handle dropped closes the queue and
/// joins it (the thread holds `Inner`, not `Owner`).
struct Owner<S: Store> {
    inner: Arc<Inner<S>>,
    committer: Mutex<Option<JoinHandle<()>>>,
}

impl<S: Store> Drop for Owner<S> {
    fn drop(&mut self) {
        self.inner.close();
        if let Some(committer) = lock(&self.committer).take() {
            // The committer catches panics of rounds; one of its own would
            // be a bug, re-raised unless we are already unwinding.
            if let Err(panic) = committer.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
}

struct Inner<S: Store> {
    stream: StreamId,
    config: Config,
    commits: Commits,
    state: RwLock<State>,
    writer: Mutex<Writer<S>>,
    queue: Mutex<Queue>,
    /// Signalled when a request is queued or the queue closes.
    queued: Condvar,
    published: Mutex<Published>,
    /// Signalled when `published` changes.
    published_changed: Condvar,
    hooks: Arc<Mutex<Hooks>>,
    poisoned: AtomicBool,
    commit_count: AtomicU64,
    appended: AtomicU64,
    round_count: AtomicU64,
    grouped_rounds: AtomicU64,
    largest_round: AtomicU64,
}

struct Writer<S> {
    store: S,
    failed: bool,
}

struct Published {
    change: Change,
    /// The digest last answered (what a poisoned handle answers).
    digest: Digest,
    /// The chain digest last answered (likewise).
    chain_digest: ChainDigest,
    /// Callers of `wait_for_change` asleep on `published_changed`: an
    /// append with none skips the wake-up (a system call).
    waiters: usize,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Request>,
    /// Whether the committer sleeps on `queued`: only then does a caller
    /// pay for a wake-up.
    idle: bool,
    /// While the committer lingers for a round as large as the last one:
    /// how many queued requests wake it (0 when it does not linger).
    lingering_for: usize,
    closed: bool,
}

enum Work {
    Append {
        payloads: Vec<Bytes>,
        time_ms: u64,
    },
    Apply(Delta),
    ApplyColumns(DeltaColumns),
    Compact(VersionVector),
    /// [`SharedReplica::end_recovery`]: a round of its own, in its place
    /// in the queue.
    EndRecovery,
    /// [`SharedReplica::mint_checkpoint`] or
    /// [`SharedReplica::keep_checkpoint`]: a round of its own.
    Checkpoint(CheckpointWork),
    /// [`SharedReplica::keep_fork`]: a round of its own.
    KeepFork(Box<crate::ForkProof>),
}

impl Work {
    /// Whether the request is planned as a round of its own.
    fn is_alone(&self) -> bool {
        matches!(
            self,
            Work::Compact(_) | Work::EndRecovery | Work::Checkpoint(_) | Work::KeepFork(_)
        )
    }

    /// What the request counts toward [`ROUND_EVENTS_MAX`]: its events and
    /// its floors (each floor is planned as an operation, as an event is).
    fn events(&self) -> usize {
        match self {
            Work::Append { payloads, .. } => payloads.len(),
            Work::Apply(delta) => delta.events.len() + delta.floor.len(),
            Work::ApplyColumns(columns) => columns.len() + columns.floor.len(),
            Work::Compact(_) | Work::EndRecovery | Work::Checkpoint(_) | Work::KeepFork(_) => 0,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Work::Append { payloads, .. } => payloads.iter().map(Bytes::len).sum(),
            Work::Apply(delta) => delta.events.iter().map(|e| e.payload.len()).sum(),
            Work::ApplyColumns(columns) => columns.payloads().len(),
            Work::Compact(_) | Work::EndRecovery | Work::Checkpoint(_) | Work::KeepFork(_) => 0,
        }
    }
}

enum Outcome {
    Appended(Result<Vec<Event>, ReplicaError>),
    Applied(Result<ApplyReport, ReplicaError>),
    Compacted(Result<CompactReport, ReplicaError>),
    /// The recovery of the own stream ended.
    RecoveryEnded,
    /// The checkpoint a checkpoint round added, if any.
    Checkpointed(Result<Option<Checkpoint>, ReplicaError>),
    /// A fork proof kept (`true`), or one of its stream kept already.
    ForkKept(Result<bool, ReplicaError>),
    /// The request was dropped unanswered (a panic, a closed queue).
    Failed,
}

struct Request {
    work: Work,
    /// Taken when the caller is answered. A request dropped unanswered
    /// answers [`Outcome::Failed`], so that no caller waits forever.
    slot: Option<Arc<Slot>>,
}

impl Request {
    fn answer(&mut self, outcome: Outcome) {
        if let Some(slot) = self.slot.take() {
            slot.finish(outcome);
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        self.answer(Outcome::Failed);
    }
}

/// Where a request's outcome is left, for a blocking or an async caller.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    changed: Condvar,
}

#[derive(Default)]
struct SlotState {
    outcome: Option<Outcome>,
    waker: Option<Waker>,
    done: bool,
    /// A blocking caller sleeps on `changed`: only then does `finish`
    /// pay for a wake-up (a system call, on the committer, for every
    /// request of a round; an async caller has its waker instead).
    sleeping: bool,
}

impl Slot {
    fn finish(&self, outcome: Outcome) {
        let (waker, sleeping) = {
            let mut state = lock(&self.state);
            state.outcome = Some(outcome);
            state.done = true;
            (state.waker.take(), state.sleeping)
        };
        if sleeping {
            self.changed.notify_all();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn is_done(&self) -> bool {
        lock(&self.state).done
    }

    fn wait(&self) -> Outcome {
        let mut state = lock(&self.state);
        loop {
            if let Some(outcome) = state.outcome.take() {
                return outcome;
            }
            if state.done {
                return Outcome::Failed;
            }
            state.sleeping = true;
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut state = lock(&self.state);
        if let Some(outcome) = state.outcome.take() {
            return Poll::Ready(outcome);
        }
        if state.done {
            return Poll::Ready(Outcome::Failed);
        }
        match &state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => state.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

/// The answer to a write submitted with one of the `_async` methods: a
/// future that works on any executor (it needs no runtime of its own).
///
/// The write was submitted when the method was called; it runs to its end
/// whether or not this future is polled or dropped.
#[must_use = "the write runs anyway; await this to learn its outcome"]
pub struct Completion<T> {
    slot: Arc<Slot>,
    extract: fn(Outcome) -> T,
}

impl<T> std::fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("done", &self.slot.is_done())
            .finish()
    }
}

impl<T> Future for Completion<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let extract = self.extract;
        self.slot.poll(cx).map(extract)
    }
}

impl<T> Completion<T> {
    /// A write answered already (the append fast path): no one else
    /// touches its slot.
    fn ready(outcome: Outcome, extract: fn(Outcome) -> T) -> Completion<T> {
        let slot = Slot {
            state: Mutex::new(SlotState {
                outcome: Some(outcome),
                waker: None,
                done: true,
                sleeping: false,
            }),
            changed: Condvar::new(),
        };
        Completion {
            slot: Arc::new(slot),
            extract,
        }
    }

    /// Blocks the calling thread until the write is answered.
    pub fn wait(self) -> T {
        (self.extract)(self.slot.wait())
    }
}

fn appended(outcome: Outcome) -> Result<Vec<Event>, ReplicaError> {
    match outcome {
        Outcome::Appended(result) => result,
        _ => Err(ReplicaError::Failed),
    }
}

fn appended_one(outcome: Outcome) -> Result<Event, ReplicaError> {
    appended(outcome).map(|mut events| events.pop().expect("one payload gives one event"))
}

fn applied(outcome: Outcome) -> Result<ApplyReport, ReplicaError> {
    match outcome {
        Outcome::Applied(result) => result,
        _ => Err(ReplicaError::Failed),
    }
}

fn compacted(outcome: Outcome) -> Result<CompactReport, ReplicaError> {
    match outcome {
        Outcome::Compacted(result) => result,
        _ => Err(ReplicaError::Failed),
    }
}

impl SharedReplica<MemStore> {
    /// A new, empty in-memory replica writing `stream`, shared, with
    /// [`Commits::Inline`]: a [`MemStore`] commit never blocks.
    pub fn in_memory(stream: StreamId) -> Self {
        SharedReplica::with_commits(Replica::new(stream), Commits::Inline)
    }
}

impl<S: Store + Send + Sync + 'static> SharedReplica<S> {
    /// Shares `replica`, with [`Commits::Thread`]: a committer thread of its
    /// own commits every round.
    ///
    /// # Panics
    ///
    /// If the committer thread cannot be spawned.
    pub fn new(replica: Replica<S>) -> Self {
        SharedReplica::with_commits(replica, Commits::Thread)
    }

    /// Shares `replica`, its rounds committed as `commits` says.
    ///
    /// # Panics
    ///
    /// With [`Commits::Thread`], if the committer thread cannot be spawned.
    pub fn with_commits(replica: Replica<S>, commits: Commits) -> Self {
        let Replica {
            state,
            store,
            failed,
        } = replica;
        let published = Published {
            change: Change {
                version: 0,
                marks: state.marks().clone(),
                floor: state.floor().clone(),
            },
            digest: state.digest(),
            chain_digest: state.chain_digest(),
            waiters: 0,
        };
        let inner = Arc::new(Inner {
            stream: state.config().stream,
            config: state.config().clone(),
            commits,
            state: RwLock::new(state),
            writer: Mutex::new(Writer { store, failed }),
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
            published: Mutex::new(published),
            published_changed: Condvar::new(),
            hooks: Arc::new(Mutex::new(Hooks::default())),
            poisoned: AtomicBool::new(false),
            commit_count: AtomicU64::new(0),
            appended: AtomicU64::new(0),
            round_count: AtomicU64::new(0),
            grouped_rounds: AtomicU64::new(0),
            largest_round: AtomicU64::new(0),
        });
        let committer = match commits {
            Commits::Inline => None,
            Commits::Thread => {
                let inner = Arc::clone(&inner);
                Some(
                    std::thread::Builder::new()
                        .name("meshlog-commit".to_string())
                        .spawn(move || inner.run_committer())
                        .expect("spawn the replica's committer thread"),
                )
            }
        };
        SharedReplica {
            owner: Arc::new(Owner {
                inner,
                committer: Mutex::new(committer),
            }),
        }
    }

    /// Appends a local event stamped with the wall-clock time. Returns once
    /// the round holding it committed: on a [`DiskStore`](crate::DiskStore),
    /// once it is durable. Blocks the calling thread; from async code use
    /// [`SharedReplica::append_async`].
    pub fn append(&self, payload: impl Into<Bytes>) -> Result<Event, ReplicaError> {
        self.append_one(payload.into(), now_ms())
    }

    /// Appends a local event with an explicit wall-clock time.
    pub fn append_at(
        &self,
        payload: impl Into<Bytes>,
        time_ms: u64,
    ) -> Result<Event, ReplicaError> {
        self.append_one(payload.into(), time_ms)
    }

    /// Appends several events in one commit: all or none, contiguous in
    /// this replica's stream. Blocks; see
    /// [`SharedReplica::append_batch_async`].
    pub fn append_batch(&self, payloads: Vec<Bytes>) -> Result<Vec<Event>, ReplicaError> {
        let time_ms = now_ms();
        if let Some(appended) = self.inner().append_inline(&payloads, time_ms) {
            return appended;
        }
        let work = Work::Append { payloads, time_ms };
        self.submit(work, appended).wait()
    }

    /// One append, blocking: on the fast path if it applies (see
    /// `Inner::append_inline`), else queued as a request of the next round.
    fn append_one(&self, payload: Bytes, time_ms: u64) -> Result<Event, ReplicaError> {
        if let Some(appended) = self
            .inner()
            .append_inline(std::slice::from_ref(&payload), time_ms)
        {
            return appended.map(|mut events| events.pop().expect("one payload gives one event"));
        }
        let work = Work::Append {
            payloads: vec![payload],
            time_ms,
        };
        self.submit(work, appended_one).wait()
    }

    /// Validates, then applies a delta from a peer (see [`Replica::apply`]),
    /// in the next round. Blocks; see [`SharedReplica::apply_async`].
    pub fn apply(&self, delta: Delta) -> Result<ApplyReport, ReplicaError> {
        self.apply_async(delta).wait()
    }

    /// Validates, then applies a delta in columns from a peer (see
    /// [`Replica::apply_columns`]), in the next round. Blocks; see
    /// [`SharedReplica::apply_columns_async`].
    pub fn apply_columns(&self, columns: DeltaColumns) -> Result<ApplyReport, ReplicaError> {
        self.apply_columns_async(columns).wait()
    }

    /// Compacts to `target` (see [`Replica::compact`]). Blocks; see
    /// [`SharedReplica::compact_async`].
    pub fn compact(&self, target: &VersionVector) -> Result<CompactReport, ReplicaError> {
        self.compact_async(target.clone()).wait()
    }

    /// [`SharedReplica::append`] as a future.
    pub fn append_async(
        &self,
        payload: impl Into<Bytes>,
    ) -> Completion<Result<Event, ReplicaError>> {
        let payload = payload.into();
        let time_ms = now_ms();
        let inline = self
            .inner()
            .append_inline(std::slice::from_ref(&payload), time_ms);
        if let Some(appended) = inline {
            return Completion::ready(Outcome::Appended(appended), appended_one);
        }
        let work = Work::Append {
            payloads: vec![payload],
            time_ms,
        };
        self.submit(work, appended_one)
    }

    /// [`SharedReplica::append_batch`] as a future.
    pub fn append_batch_async(
        &self,
        payloads: Vec<Bytes>,
    ) -> Completion<Result<Vec<Event>, ReplicaError>> {
        let time_ms = now_ms();
        if let Some(appended) = self.inner().append_inline(&payloads, time_ms) {
            return Completion::ready(Outcome::Appended(appended), self::appended);
        }
        let work = Work::Append { payloads, time_ms };
        self.submit(work, appended)
    }

    /// [`SharedReplica::apply`] as a future.
    pub fn apply_async(&self, delta: Delta) -> Completion<Result<ApplyReport, ReplicaError>> {
        self.submit(Work::Apply(delta), applied)
    }

    /// [`SharedReplica::apply_columns`] as a future. A round whose deltas
    /// all came in columns and are all clean (see
    /// [`Replica::apply_columns`]) is planned and held as columns, with
    /// its appends; in any other round the delta joins as events.
    pub fn apply_columns_async(
        &self,
        mut columns: DeltaColumns,
    ) -> Completion<Result<ApplyReport, ReplicaError>> {
        // The proofs it passes on first, each a round of its own before
        // it (a proof that proves nothing is logged, and the delta judged
        // on its own).
        for proof in std::mem::take(&mut columns.forks) {
            drop(self.keep_fork_async(proof));
        }
        self.submit(Work::ApplyColumns(columns), applied)
    }

    /// [`SharedReplica::compact`] as a future.
    pub fn compact_async(
        &self,
        target: VersionVector,
    ) -> Completion<Result<CompactReport, ReplicaError>> {
        self.submit(Work::Compact(target), compacted)
    }

    /// Ends the recovery of the own stream (see [`Replica::end_recovery`]),
    /// once every request queued before it is answered: a queued request
    /// in its place, so that what was submitted before it is planned while
    /// recovering and what is submitted after it is not, whatever the
    /// committer's timing. Nothing changes on a poisoned or failed handle.
    pub fn end_recovery(&self) {
        self.end_recovery_async().wait();
    }

    /// Queues the end of the own stream's recovery (see
    /// [`SharedReplica::end_recovery`]); the completion resolves once it
    /// is done (`false`: the handle was poisoned or failed, and nothing
    /// changed).
    pub fn end_recovery_async(&self) -> Completion<bool> {
        self.submit(Work::EndRecovery, |outcome| {
            matches!(outcome, Outcome::RecoveryEnded)
        })
    }

    /// Mints a checkpoint from the marks if one is due at `now_ms` (see
    /// [`Replica::mint_checkpoint`]): a round of its own, in its place in
    /// the queue.
    pub fn mint_checkpoint(&self, now_ms: u64) -> Result<Option<Checkpoint>, ReplicaError> {
        self.checkpoint_async(CheckpointWork::Mint { now_ms })
            .wait()
    }

    /// Keeps a checkpoint received from a peer (see
    /// [`Replica::keep_checkpoint`]). Whether it was new.
    pub fn keep_checkpoint(&self, checkpoint: Checkpoint) -> Result<bool, ReplicaError> {
        Ok(self
            .checkpoint_async(CheckpointWork::Keep(checkpoint))
            .wait()?
            .is_some())
    }

    /// [`SharedReplica::mint_checkpoint`] for an async caller.
    pub fn mint_checkpoint_async(
        &self,
        now_ms: u64,
    ) -> Completion<Result<Option<Checkpoint>, ReplicaError>> {
        self.checkpoint_async(CheckpointWork::Mint { now_ms })
    }

    /// [`SharedReplica::keep_checkpoint`] for an async caller: the
    /// completion answers the checkpoint if it was new.
    pub fn keep_checkpoint_async(
        &self,
        checkpoint: Checkpoint,
    ) -> Completion<Result<Option<Checkpoint>, ReplicaError>> {
        self.checkpoint_async(CheckpointWork::Keep(checkpoint))
    }

    fn checkpoint_async(
        &self,
        work: CheckpointWork,
    ) -> Completion<Result<Option<Checkpoint>, ReplicaError>> {
        self.submit(Work::Checkpoint(work), |outcome| match outcome {
            Outcome::Checkpointed(result) => result,
            _ => Err(ReplicaError::Failed),
        })
    }

    /// Keeps a fork proof received from a peer (see
    /// [`Replica::keep_fork`]), in a round of its own. Blocks.
    pub fn keep_fork(&self, proof: crate::ForkProof) -> Result<bool, ReplicaError> {
        self.keep_fork_async(proof).wait()
    }

    /// [`SharedReplica::keep_fork`] as a future.
    pub fn keep_fork_async(
        &self,
        proof: crate::ForkProof,
    ) -> Completion<Result<bool, ReplicaError>> {
        self.submit(Work::KeepFork(Box::new(proof)), |outcome| match outcome {
            Outcome::ForkKept(kept) => kept,
            _ => Err(ReplicaError::Failed),
        })
    }

    /// Stops sharing and hands back the replica, if this is the last
    /// handle (otherwise hands this handle back). A poisoned replica (see
    /// the module docs) is handed back marked failed.
    pub fn into_replica(self) -> Result<Replica<S>, SharedReplica<S>> {
        let owner = Arc::try_unwrap(self.owner).map_err(|owner| SharedReplica { owner })?;
        let inner = Arc::clone(&owner.inner);
        drop(owner); // closes the queue and joins the committer
        let inner = Arc::try_unwrap(inner)
            .ok()
            .expect("the committer thread has ended");
        let poisoned = inner.poisoned.load(Ordering::Acquire);
        let writer = inner
            .writer
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let state = inner
            .state
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(Replica {
            state,
            store: writer.store,
            failed: writer.failed || poisoned,
        })
    }

    fn submit<T>(&self, work: Work, extract: fn(Outcome) -> T) -> Completion<T> {
        let inner = self.inner();
        let slot = Arc::new(Slot::default());
        let request = Request {
            work,
            slot: Some(Arc::clone(&slot)),
        };
        let wake = {
            let mut queue = lock(&inner.queue);
            if queue.closed {
                drop(queue);
                drop(request); // answers Failed
                return Completion { slot, extract };
            }
            queue.waiting.push_back(request);
            let lingering_done =
                queue.lingering_for > 0 && queue.waiting.len() >= queue.lingering_for;
            if lingering_done {
                queue.lingering_for = 0;
            }
            std::mem::take(&mut queue.idle) || lingering_done
        };
        match inner.commits {
            Commits::Thread => {
                if wake {
                    inner.queued.notify_one();
                }
            }
            Commits::Inline => {
                let mut writer = lock(&inner.writer);
                // Whoever held the lock before may have served us.
                while !slot.is_done() {
                    let Some(round) = inner.next_round(false, 0) else {
                        break;
                    };
                    inner.commit_round(&mut writer, round);
                }
            }
        }
        Completion { slot, extract }
    }
}

impl<S: Store> SharedReplica<S> {
    fn inner(&self) -> &Inner<S> {
        &self.owner.inner
    }

    /// This replica's own stream.
    pub fn stream(&self) -> StreamId {
        self.inner().stream
    }

    /// The settings the replica was opened with.
    pub fn config(&self) -> &Config {
        &self.inner().config
    }

    /// Who commits this handle's rounds.
    pub fn commits(&self) -> Commits {
        self.inner().commits
    }

    /// A page of events after `after` (see [`Replica::page`]). Never waits
    /// for a commit in progress.
    pub fn page(&self, after: &VersionVector, limit: usize) -> Result<Page, PageError> {
        let state = self.read().ok_or(PageError::Failed)?;
        state.page(after, limit)
    }

    /// The cursor a token's text stands for, of either version (see
    /// [`Replica::cursor`]).
    pub fn cursor(&self, token: &str) -> Result<VersionVector, PageError> {
        let state = self.read().ok_or(PageError::Failed)?;
        state.checkpoints.cursor_text(token)
    }

    /// The token this replica answers for `cursor`, the shortest of either
    /// version (see [`Replica::token`]); `PageError::Failed` once the
    /// handle is poisoned.
    pub fn token(&self, cursor: &VersionVector) -> Result<String, PageError> {
        let state = self.read().ok_or(PageError::Failed)?;
        Ok(state.checkpoints.token(cursor)?)
    }

    /// The checkpoints kept, oldest first (see [`Replica::checkpoints`]).
    pub fn checkpoints(&self) -> Vec<Checkpoint> {
        self.read()
            .map(|state| state.checkpoints.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The names of the checkpoints kept, oldest first: what a sync
    /// session compares with what its peer holds, without copying vectors.
    pub fn checkpoint_names(&self) -> Vec<CheckpointName> {
        self.read()
            .map(|state| state.checkpoints.iter().map(Checkpoint::name).collect())
            .unwrap_or_default()
    }

    /// The checkpoint of that name, if kept (see [`Replica::checkpoint`]).
    pub fn checkpoint(&self, name: CheckpointName) -> Option<Checkpoint> {
        self.read()?.checkpoints.get(name).cloned()
    }

    /// One writer's page after `after` (see [`Replica::page_stream`]).
    /// Never waits for a commit in progress.
    pub fn page_stream(
        &self,
        stream: StreamId,
        after: &VersionVector,
        limit: usize,
    ) -> Result<Page, PageError> {
        let state = self.read().ok_or(PageError::Failed)?;
        state.page_stream(stream, after, limit)
    }

    /// What a peer with marks `their_marks` misses, up to `byte_budget`
    /// (see [`Replica::delta_for`]): committed events only. Empty once the
    /// handle is poisoned.
    pub fn delta_for(&self, their_marks: &VersionVector, byte_budget: usize) -> Delta {
        self.read()
            .map(|state| state.delta_for_or_empty(their_marks, byte_budget))
            .unwrap_or_default()
    }

    /// See [`Replica::try_delta_for`]; [`ReplicaError::Failed`] once the
    /// handle is poisoned.
    pub fn try_delta_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Result<Delta, ReplicaError> {
        let state = self.read().ok_or(ReplicaError::Failed)?;
        let delta = state.delta_for(their_marks, byte_budget);
        delta.map_err(ReplicaError::Store)
    }

    /// See [`Replica::delta_columns_for`].
    pub fn delta_columns_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> DeltaColumns {
        self.read()
            .map(|state| state.delta_columns_for_or_empty(their_marks, byte_budget))
            .unwrap_or_default()
    }

    /// See [`Replica::try_delta_columns_for`]; [`ReplicaError::Failed`]
    /// once the handle is poisoned.
    pub fn try_delta_columns_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Result<DeltaColumns, ReplicaError> {
        let state = self.read().ok_or(ReplicaError::Failed)?;
        let columns = state.delta_columns_for(their_marks, byte_budget);
        columns.map_err(ReplicaError::Store)
    }

    /// The marks as last published.
    pub fn marks(&self) -> VersionVector {
        lock(&self.inner().published).change.marks.clone()
    }

    /// The floor as last published.
    pub fn floor(&self) -> VersionVector {
        lock(&self.inner().published).change.floor.clone()
    }

    /// The digest of the events held (as published). It is summed
    /// when asked: the hashes of the events received since the last call
    /// are added then (so a replica nobody asks never hashes what it
    /// receives), under the state's read lock.
    pub fn digest(&self) -> Digest {
        let Some(digest) = self.read().map(|state| state.digest()) else {
            return lock(&self.inner().published).digest;
        };
        lock(&self.inner().published).digest = digest;
        digest
    }

    /// The chain heads, as [`Replica::chain_digest`] (as published; a
    /// poisoned handle answers the last one it answered).
    pub fn chain_digest(&self) -> ChainDigest {
        let Some(digest) = self.read().map(|state| state.chain_digest()) else {
            return lock(&self.inner().published).chain_digest.clone();
        };
        lock(&self.inner().published).chain_digest = digest.clone();
        digest
    }

    /// `stream`'s chain at its floor and head, if it is held.
    pub fn chain(&self, stream: StreamId) -> Option<StreamChain> {
        self.read()?.chain(stream)
    }

    /// The newest compaction statement kept of `stream`, as
    /// [`Replica::statement`] answers it (`None` once the handle is
    /// poisoned): what sync offers a peer that holds the stream past its
    /// floor.
    pub fn statement(&self, stream: StreamId) -> Option<crate::SignedCompaction> {
        self.read()?.statement(stream)
    }

    /// What a compaction statement of `stream` at `floor` says, as
    /// [`Replica::compaction_at`] answers it (a poisoned handle:
    /// [`ReplicaError::Failed`]).
    pub fn compaction_at(
        &self,
        stream: StreamId,
        floor: u64,
    ) -> Result<Option<crate::Compaction>, ReplicaError> {
        self.read()
            .ok_or(ReplicaError::Failed)?
            .compaction_at(stream, floor)
    }

    /// The lamport clock.
    pub fn clock(&self) -> u64 {
        self.read().map_or(0, |state| state.clock())
    }

    /// The event `(stream, seq)`, if held.
    pub fn get(&self, stream: StreamId, seq: u64) -> Option<Event> {
        self.read()?.get(stream, seq).unwrap_or_else(|error| {
            tracing::error!(%stream, seq, %error, "reading the log failed");
            None
        })
    }

    /// Reads and checks every held event, as [`Replica::verify`] does.
    /// Holds the writer lock while it reads, so writes wait for it (reads
    /// do not); a poisoned handle answers [`ReplicaError::Failed`].
    pub fn verify(&self) -> Result<Verified, ReplicaError> {
        let _writer = lock(&self.inner().writer);
        self.read().ok_or(ReplicaError::Failed)?.verify()
    }

    /// The replica's counters.
    pub fn stats(&self) -> Stats {
        self.read().map(|state| state.stats()).unwrap_or_default()
    }

    /// How many early events wait in the pending buffer.
    pub fn pending_len(&self) -> usize {
        self.read().map_or(0, |state| state.pending_len())
    }

    /// How much of a received delta this replica's limits take now (see
    /// [`Replica::admission`]). A round committed meanwhile may change it;
    /// apply still checks the limits.
    pub fn admission(&self, columns: &DeltaColumns) -> crate::Admission {
        self.read()
            .map(|state| state.admission(columns))
            .unwrap_or_default()
    }

    /// The proofs of forked streams kept (see [`Replica::forks`]).
    pub fn forks(&self) -> Vec<crate::ForkProof> {
        self.forks_except(&std::collections::BTreeSet::new())
    }

    /// [`SharedReplica::forks`] but those of `streams`, copying only the
    /// others (what a sync session asks before every delta it plans).
    pub fn forks_except(
        &self,
        streams: &std::collections::BTreeSet<StreamId>,
    ) -> Vec<crate::ForkProof> {
        self.read()
            .map(|state| state.forks_except(streams))
            .unwrap_or_default()
    }

    /// What `open` accepted but reports (see [`Replica::open_warnings`]).
    pub fn open_warnings(&self) -> Vec<OpenWarning> {
        self.read()
            .map(|state| state.open_warnings().to_vec())
            .unwrap_or_default()
    }

    /// Whether the replica still relearns its own stream.
    pub fn is_recovering(&self) -> bool {
        self.read().is_some_and(|state| state.is_recovering())
    }

    /// See [`Replica::covering_lamport`].
    pub fn covering_lamport(&self, lamport: u64) -> VersionVector {
        self.read()
            .map(|state| state.covering_lamport(lamport))
            .unwrap_or_default()
    }

    /// The floor `policy` allows now (see [`RetentionPolicy::floor`]).
    pub fn retention_floor(
        &self,
        policy: &RetentionPolicy,
        now_ms: u64,
        peer_marks: &[VersionVector],
    ) -> VersionVector {
        match self.read() {
            Some(state) => policy.floor_of(&state, now_ms, peer_marks),
            None => self.floor(),
        }
    }

    /// Counters of the rounds since the handle was made.
    pub fn commit_stats(&self) -> CommitStats {
        CommitStats {
            commits: self.inner().commit_count.load(Ordering::Relaxed),
            appended: self.inner().appended.load(Ordering::Relaxed),
            rounds: self.inner().round_count.load(Ordering::Relaxed),
            grouped_rounds: self.inner().grouped_rounds.load(Ordering::Relaxed),
            largest_round: self.inner().largest_round.load(Ordering::Relaxed),
        }
    }

    /// The last change published (version 0: the state the handle was
    /// made with).
    pub fn latest_change(&self) -> Change {
        lock(&self.inner().published).change.clone()
    }

    /// Waits until a change newer than `version` is published, or
    /// `timeout` passes; returns the latest change either way. Blocks the
    /// calling thread.
    pub fn wait_for_change(&self, version: u64, timeout: Duration) -> Change {
        let inner = self.inner();
        let deadline = Instant::now() + timeout;
        let mut published = lock(&inner.published);
        while published.change.version <= version {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            published.waiters += 1;
            published = inner
                .published_changed
                .wait_timeout(published, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            published.waiters -= 1;
        }
        published.change.clone()
    }

    /// Runs `hook` after every change published from now on, in commit
    /// order, until the returned [`ChangeHook`] is dropped. The hook runs
    /// on the committing thread with the writer lock held: keep it short
    /// (hand the change to a channel), and never write to this replica
    /// from it (that deadlocks).
    pub fn on_change(&self, hook: impl Fn(&Change) + Send + Sync + 'static) -> ChangeHook {
        let hooks = &self.inner().hooks;
        let mut list = lock(hooks);
        list.next_id += 1;
        let id = list.next_id;
        list.list.push((id, Arc::new(hook)));
        ChangeHook {
            hooks: Arc::downgrade(hooks),
            id,
        }
    }

    /// The readable state, unless the handle is poisoned.
    fn read(&self) -> Option<RwLockReadGuard<'_, State>> {
        let inner = self.inner();
        if inner.poisoned.load(Ordering::Acquire) {
            return None;
        }
        Some(inner.state.read().unwrap_or_else(PoisonError::into_inner))
    }
}

impl<S: Store> Inner<S> {
    fn close(&self) {
        lock(&self.queue).closed = true;
        self.queued.notify_all();
    }

    /// The committer thread: one round per wake-up while anything is
    /// queued; ends when the queue closes and is empty.
    fn run_committer(&self) {
        let _closing = CloseOnExit(self);
        let mut last_round = 0;
        while let Some(round) = self.next_round(true, last_round) {
            last_round = round.len();
            let mut writer = lock(&self.writer);
            self.commit_round(&mut writer, round);
        }
    }

    /// Takes the queue's front, up to the limits (a compaction alone).
    /// With `wait`, sleeps while the queue is empty; `None` once closed and
    /// empty (or, without `wait`, when empty).
    ///
    /// With `wait`, a queue holding fewer requests than `last_round` waits up
    /// to [`ROUND_LINGER`] for that many: the callers just answered are
    /// waking up to queue their next write, and letting them join makes the
    /// next round theirs too instead of a sliver of it — more events per
    /// fsync, for at most that much added latency.
    fn next_round(&self, wait: bool, last_round: usize) -> Option<Vec<Request>> {
        let mut queue = lock(&self.queue);
        while queue.waiting.is_empty() {
            if queue.closed || !wait {
                return None;
            }
            queue.idle = true;
            queue = self
                .queued
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
        queue.idle = false;
        if wait && queue.waiting.len() < last_round {
            let deadline = Instant::now() + ROUND_LINGER;
            while queue.waiting.len() < last_round && !queue.closed {
                let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                    break;
                };
                queue.lingering_for = last_round;
                queue = self
                    .queued
                    .wait_timeout(queue, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            queue.lingering_for = 0;
        }
        if queue.waiting[0].work.is_alone() {
            return queue.waiting.pop_front().map(|request| vec![request]);
        }
        let mut events = 0usize;
        let mut bytes = 0usize;
        let mut len = 0usize;
        for request in &queue.waiting {
            if request.work.is_alone() {
                break;
            }
            events = events.saturating_add(request.work.events());
            bytes = bytes.saturating_add(request.work.bytes());
            if len > 0 && (events > ROUND_EVENTS_MAX || bytes > ROUND_BYTES_MAX) {
                break;
            }
            len += 1;
        }
        Some(queue.waiting.drain(..len).collect())
    }

    /// Plans, commits and publishes one round, then answers its callers.
    /// A panic inside poisons the handle (see the module docs); every
    /// caller of the round is answered all the same.
    fn commit_round(&self, writer: &mut Writer<S>, mut round: Vec<Request>) {
        let size = round.len() as u64;
        self.round_count.fetch_add(1, Ordering::Relaxed);
        if size > 1 {
            self.grouped_rounds.fetch_add(1, Ordering::Relaxed);
        }
        self.largest_round.fetch_max(size, Ordering::Relaxed);
        if self.poisoned.load(Ordering::Acquire) || writer.failed {
            for request in &mut round {
                request.answer(Outcome::Failed);
            }
            return;
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| self.run_round(writer, &mut round)));
        if outcome.is_err() {
            self.poisoned.store(true, Ordering::Release);
            tracing::error!(
                stream = %self.stream,
                requests = round.len(),
                "a replica change panicked; the handle serves nothing new until reopened"
            );
            self.published_changed.notify_all();
        }
        // Requests still unanswered answer Failed as they drop.
    }

    fn run_round(&self, writer: &mut Writer<S>, round: &mut [Request]) {
        if let [request] = round {
            if let Work::EndRecovery = request.work {
                write(&self.state).end_recovery();
                request.answer(Outcome::RecoveryEnded);
                return;
            }
            if let Work::Checkpoint(work) = &request.work {
                let result = self.checkpoint(writer, work);
                request.answer(Outcome::Checkpointed(result));
                return;
            }
            if let Work::KeepFork(proof) = &request.work {
                let kept = self.keep_fork_now(writer, proof);
                request.answer(Outcome::ForkKept(kept));
                return;
            }
            if let Work::Compact(target) = &request.work {
                let mut plan = read(&self.state).plan_compact(target);
                let report = plan.compact_report();
                let result = self
                    .commit_and_publish(writer, &mut plan)
                    .map(|()| report)
                    .inspect(|report| {
                        if report.streams > 0 {
                            tracing::info!(
                                dropped = report.dropped,
                                streams = report.streams,
                                "compact"
                            );
                        }
                    });
                request.answer(Outcome::Compacted(result));
                return;
            }
        }
        // A round whose deltas all came in columns and are all clean is
        // planned as columns (see `State::plan_columns`).
        let in_columns = round
            .iter()
            .any(|request| matches!(request.work, Work::ApplyColumns(_)))
            && !round
                .iter()
                .any(|request| matches!(request.work, Work::Apply(_)));
        if in_columns {
            let plan = read(&self.state).plan_columns(&items_of(round));
            if let Some(plan) = plan {
                let outcomes = self.commit_round_plan(writer, plan);
                answer_all(round, outcomes);
                return;
            }
        }
        // Else a delta in columns joins the round as events (its payloads
        // kept, not copied).
        for request in round.iter_mut() {
            if let Work::ApplyColumns(columns) = &mut request.work {
                let columns = std::mem::take(columns);
                request.work = Work::Apply(columns.into_delta());
            }
        }
        // Each request validated and planned against the state the ones
        // before it leave: a left fold, as one by one.
        let plan = read(&self.state).plan_round(&items_of(round));
        let outcomes = self.commit_round_plan(writer, plan);
        answer_all(round, outcomes);
    }

    /// Commits and publishes a round's plan, and says what each request of
    /// the round gets, in order.
    fn commit_round_plan(&self, writer: &mut Writer<S>, mut plan: Plan<'_>) -> Vec<Outcome> {
        let committed = self.commit_and_publish(writer, &mut plan).map_err(Arc::new);
        let planned = std::mem::take(&mut plan.planned);
        let mut appended_count = 0u64;
        let outcomes = planned
            .into_iter()
            .map(|planned| match planned {
                Planned::Refused(rejection) => {
                    let (stream, seqs, error) = (rejection.stream, rejection.seqs, rejection.rule);
                    tracing::warn!(own = %self.stream, %stream, ?seqs, %error, "delta refused");
                    Outcome::Applied(Err(error))
                }
                Planned::Applied(report) => {
                    Outcome::Applied(committed.as_ref().map(|()| report).map_err(share))
                }
                Planned::Appended(Err(error)) => Outcome::Appended(Err(error)),
                Planned::Appended(Ok(run)) => Outcome::Appended(match &committed {
                    Err(error) => Err(share(error)),
                    Ok(()) => {
                        // The plan is spent: its events move to their
                        // callers, not copied.
                        let events = plan.take_appended(run);
                        appended_count += events.len() as u64;
                        Ok(events)
                    }
                }),
            })
            .collect();
        // Counted before anyone is answered, so a caller that reads the
        // counters after its append returned sees its own events counted.
        self.appended.fetch_add(appended_count, Ordering::Relaxed);
        outcomes
    }

    /// A checkpoint round: planned on the state, recorded by the store,
    /// then kept (a failed record changes nothing, and leaves the store
    /// usable: no event was at stake).
    fn checkpoint(
        &self,
        writer: &mut Writer<S>,
        work: &CheckpointWork,
    ) -> Result<Option<Checkpoint>, ReplicaError> {
        let planned = {
            let state = read(&self.state);
            state
                .checkpoints
                .plan(work, state.marks(), state.config().stream)
        };
        let Some((next, added)) = planned else {
            return Ok(None);
        };
        writer
            .store
            .keep_checkpoints(&next.vectors())
            .map_err(store_error)?;
        tracing::debug!(name = %added.name(), streams = added.vector().len(), "checkpoint kept");
        write(&self.state).checkpoints = next;
        Ok(Some(added))
    }

    /// Commits the plan's batch (if any) with no lock on the state, then
    /// publishes it and notifies; a failed commit publishes nothing.
    fn commit_and_publish(
        &self,
        writer: &mut Writer<S>,
        plan: &mut Plan,
    ) -> Result<(), ReplicaError> {
        self.commit_store(writer, plan)?;
        if plan.is_noop() {
            return Ok(());
        }
        let (marks, floor) = {
            let mut state = write(&self.state);
            state.publish(plan, writer.store.view());
            (state.marks().clone(), state.floor().clone())
        };
        self.notify(marks, floor);
        Ok(())
    }

    /// The fast path of a blocking append on a [`Commits::Inline`] handle
    /// with nothing queued: planned by the state's own append planning (as
    /// [`Replica::append_batch_at`] plans it), committed and published
    /// under the writer lock by the caller, with none of a round's
    /// machinery (no request, answer slot or per-request outcome) and a
    /// change notification that costs nothing when no one listens. `None`
    /// when it does not apply: the append then joins a round, after what
    /// was queued before it. The same rules hold as for a round: visible
    /// only once committed, the change notified, counted, a panic poisons.
    fn append_inline(
        &self,
        payloads: &[Bytes],
        time_ms: u64,
    ) -> Option<Result<Vec<Event>, ReplicaError>> {
        if self.commits != Commits::Inline {
            return None;
        }
        let mut writer = lock(&self.writer);
        {
            let queue = lock(&self.queue);
            // Requests queued before this one commit first, in a round.
            if !queue.waiting.is_empty() || queue.closed {
                return None;
            }
        }
        if self.poisoned.load(Ordering::Acquire) || writer.failed {
            return Some(Err(ReplicaError::Failed));
        }
        let appended = catch_unwind(AssertUnwindSafe(|| {
            self.append_now(&mut writer, payloads, time_ms)
        }));
        Some(appended.unwrap_or_else(|_| {
            self.poisoned.store(true, Ordering::Release);
            tracing::error!(
                stream = %self.stream,
                "a replica change panicked; the handle serves nothing new until reopened"
            );
            self.published_changed.notify_all();
            Err(ReplicaError::Failed)
        }))
    }

    /// Plans, commits and publishes one append request alone (see
    /// `append_inline`), with the writer lock held.
    fn append_now(
        &self,
        writer: &mut Writer<S>,
        payloads: &[Bytes],
        time_ms: u64,
    ) -> Result<Vec<Event>, ReplicaError> {
        let request = AppendRequest { payloads, time_ms };
        let mut plan = read(&self.state).plan_round(&[RoundItem::Append(request)]);
        let Some(Planned::Appended(run)) = plan.planned.pop() else {
            unreachable!("one append request, one outcome");
        };
        let run = run?;
        self.commit_store(writer, &mut plan)?;
        if plan.is_noop() {
            return Ok(Vec::new());
        }
        let head = {
            let mut state = write(&self.state);
            state.publish(&plan, writer.store.view());
            state.marks().get(self.stream)
        };
        let events = plan.take_appended(run);
        self.appended
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        self.notify_appended(head);
        Ok(events)
    }

    /// [`Inner::notify`] after an append alone, which moved the own
    /// stream's mark to `head` and nothing else: the published marks are
    /// advanced in place, not cloned and compared, and waiters are woken
    /// and hooks run only if there are any. Called with the writer lock
    /// held, as `notify` is.
    fn notify_appended(&self, head: u64) {
        // Only the writer lock's holder changes the state: read now, it is
        // what this append published.
        #[cfg(debug_assertions)]
        let marks_after = read(&self.state).marks().clone();
        let hooks = self.hooks();
        let change = {
            let mut published = lock(&self.published);
            published.change.marks.advance(self.stream, head);
            #[cfg(debug_assertions)]
            assert_eq!(
                published.change.marks, marks_after,
                "the published marks follow the state's"
            );
            published.change.version += 1;
            if published.waiters > 0 {
                self.published_changed.notify_all();
            }
            if hooks.is_empty() {
                return;
            }
            published.change.clone()
        };
        for hook in hooks {
            hook(&change);
        }
    }

    /// The hooks registered now, to run outside the hooks' lock.
    fn hooks(&self) -> Vec<Hook> {
        lock(&self.hooks)
            .list
            .iter()
            .map(|(_, hook)| Arc::clone(hook))
            .collect()
    }

    /// Keeps `proof` now (see [`SharedReplica::keep_fork`]).
    fn keep_fork_now(
        &self,
        writer: &mut Writer<S>,
        proof: &crate::ForkProof,
    ) -> Result<bool, ReplicaError> {
        if writer.failed {
            return Err(ReplicaError::Failed);
        }
        let Some(batch) = read(&self.state).fork_batch(proof)? else {
            return Ok(false);
        };
        self.commit_count.fetch_add(1, Ordering::Relaxed);
        writer.store.commit(&batch).map_err(|error| {
            writer.failed = true;
            tracing::error!(stream = %self.stream, %error, "store commit failed; the replica refuses changes until reopened");
            store_error(error)
        })?;
        write(&self.state).publish_forks(&batch);
        Ok(true)
    }

    /// Commits the plan's batch, if any, to the store; a failure marks the
    /// writer failed (the replica refuses changes until reopened).
    fn commit_store(&self, writer: &mut Writer<S>, plan: &mut Plan) -> Result<(), ReplicaError> {
        // The chains and seals after the batch, recorded with it (only the
        // writer changes the state: it is the one the plan was made on). A
        // failed read commits nothing.
        read(&self.state).prepare_commit(plan)?;
        if plan.batch.is_empty() && plan.batch.seals.is_empty() && plan.batch.forks.is_empty() {
            return Ok(());
        }
        self.commit_count.fetch_add(1, Ordering::Relaxed);
        writer.store.commit(&plan.batch).map_err(|error| {
            writer.failed = true;
            tracing::error!(
                stream = %self.stream,
                %error,
                "store commit failed; nothing of it is visible, and the replica refuses changes until reopened"
            );
            store_error(error)
        })
    }

    /// Publishes the marks and floor after a round, waking waiters
    /// and running hooks if the marks or floor moved. Called with the
    /// writer lock held, so changes are seen in commit order.
    fn notify(&self, marks: VersionVector, floor: VersionVector) {
        let change = {
            let mut published = lock(&self.published);
            if published.change.marks == marks && published.change.floor == floor {
                return;
            }
            published.change = Change {
                version: published.change.version + 1,
                marks,
                floor,
            };
            // A wake-up (a system call) only for a caller asleep in
            // `wait_for_change`, as `notify_appended` does.
            if published.waiters > 0 {
                self.published_changed.notify_all();
            }
            published.change.clone()
        };
        for hook in self.hooks() {
            hook(&change);
        }
    }
}

/// Closes the queue when the committer thread ends, however it ends, and
/// answers every caller still queued: nothing waits for a committer that
/// is gone.
struct CloseOnExit<'a, S: Store>(&'a Inner<S>);

impl<S: Store> Drop for CloseOnExit<'_, S> {
    fn drop(&mut self) {
        let orphans: Vec<Request> = {
            let mut queue = lock(&self.0.queue);
            queue.closed = true;
            queue.waiting.drain(..).collect()
        };
        // Each answers Failed as it drops, outside the queue's lock.
        drop(orphans);
    }
}

/// A round's requests as the planner takes them, in order.
fn items_of(round: &[Request]) -> Vec<RoundItem<'_>> {
    round
        .iter()
        .map(|request| match &request.work {
            Work::Apply(delta) => RoundItem::Delta(delta),
            Work::ApplyColumns(columns) => RoundItem::Columns(columns),
            Work::Append { payloads, time_ms } => RoundItem::Append(AppendRequest {
                payloads,
                time_ms: *time_ms,
            }),
            Work::Compact(_) | Work::EndRecovery | Work::Checkpoint(_) | Work::KeepFork(_) => {
                unreachable!(
                    "a compaction, the end of recovery, a checkpoint or a kept fork is a round of its own"
                )
            }
        })
        .collect()
}

/// Answers each request of a round its outcome, in order (the handle
/// answers in submission order: see the module docs).
fn answer_all(round: &mut [Request], outcomes: Vec<Outcome>) {
    for (request, outcome) in round.iter_mut().zip(outcomes) {
        request.answer(outcome);
    }
}

/// One round's store error, for each of its callers.
fn share(error: &Arc<ReplicaError>) -> ReplicaError {
    ReplicaError::Store(Box::new(RoundFailed(Arc::clone(error))))
}

/// The error of a round, shared by every request in it.
#[derive(Debug)]
struct RoundFailed(Arc<ReplicaError>);

impl std::fmt::Display for RoundFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the commit holding this change failed: {}", self.0)
    }
}

impl std::error::Error for RoundFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Every lock here recovers from poisoning: the handle's own `poisoned`
/// flag, set by `commit_round`, is the one policy (see the module docs).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
