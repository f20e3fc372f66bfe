//! Stores that misbehave on command, around any [`Store`]: what a test
//! needs to see how a replica (or a session over one) copes with a commit
//! that fails or takes long.
//!
//! - [`FlakyStore`]: commits fail from a moment the test picks (now, or
//!   after N more commits) until it heals them, through a [`CommitFaults`]
//!   handle the test keeps after the store moves into a replica.
//! - [`HeldStore`]: once armed, each commit blocks until the test releases
//!   it (or a time limit passes), through a [`CommitGate`] the test keeps;
//!   what a durable store whose fsync takes as long as the test says looks
//!   like from above.
//!
//! Both only touch commits: reads and metadata go to the inner store
//! unchanged, as a real store's reads keep working when its disk is full.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Batch, Event, MemStore, Store, StoreMeta, StoreView};

/// The error of a [`FlakyStore`]: the injected failure, or the inner
/// store's own.
#[derive(Debug, thiserror::Error)]
pub enum FlakyError<E> {
    /// A commit refused on the test's command.
    #[error("injected commit failure")]
    Injected,
    /// The inner store failed by itself.
    #[error(transparent)]
    Store(E),
}

/// A store whose commits fail on command, over an inner store (a
/// [`MemStore`] by default).
///
/// ```
/// use meshlog_cursor::StreamId;
/// use meshlog_replica::{Config, Replica, ReplicaError};
/// use meshlog_testkit::FlakyStore;
///
/// let store = FlakyStore::default();
/// let faults = store.faults();
/// let mut replica = Replica::open(Config::new(StreamId::new(1)), store)?;
/// faults.fail_after(1);
/// assert!(replica.append(&b"durable"[..]).is_ok());
/// assert!(matches!(replica.append(&b"lost"[..]), Err(ReplicaError::Store(_))));
/// assert_eq!((faults.committed(), faults.refused()), (1, 1));
/// # Ok::<(), ReplicaError>(())
/// ```
#[derive(Debug)]
pub struct FlakyStore<S = MemStore> {
    inner: S,
    faults: CommitFaults,
}

/// Over an empty [`MemStore`]. (Not for every `S: Default`: one impl lets
/// `FlakyStore::default()` infer its store, as a default type parameter
/// alone does not.)
impl Default for FlakyStore {
    fn default() -> Self {
        FlakyStore::new(MemStore::default())
    }
}

impl<S> FlakyStore<S> {
    /// A store over `inner` whose commits succeed until told otherwise.
    pub fn new(inner: S) -> Self {
        FlakyStore {
            inner,
            faults: CommitFaults::default(),
        }
    }

    /// The handle that makes this store's commits fail, shared with the
    /// store: keep a clone before moving the store into a replica.
    pub fn faults(&self) -> CommitFaults {
        self.faults.clone()
    }

    /// The inner store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The inner store, without the faults.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// When a [`FlakyStore`]'s commits fail: a handle shared by the store and
/// the test (clones share one state).
#[derive(Debug, Clone, Default)]
pub struct CommitFaults {
    state: Arc<FaultState>,
}

#[derive(Debug)]
struct FaultState {
    /// Commits still allowed before every commit fails; `u64::MAX` means no
    /// limit (healed).
    commits_ok_left: AtomicU64,
    /// Commits that reached the inner store and succeeded.
    committed: AtomicU64,
    /// Commits refused by injection.
    refused: AtomicU64,
}

impl Default for FaultState {
    fn default() -> Self {
        FaultState {
            commits_ok_left: AtomicU64::new(u64::MAX),
            committed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }
}

impl CommitFaults {
    /// Every commit from now on fails, until [`CommitFaults::heal`].
    pub fn fail_now(&self) {
        self.fail_after(0);
    }

    /// The next `commits` commits succeed, then every commit fails, until
    /// [`CommitFaults::heal`].
    pub fn fail_after(&self, commits: u64) {
        // u64::MAX is "no limit": the largest finite count is one less.
        self.state
            .commits_ok_left
            .store(commits.min(u64::MAX - 1), SeqCst);
    }

    /// Commits succeed again.
    pub fn heal(&self) {
        self.state.commits_ok_left.store(u64::MAX, SeqCst);
    }

    /// Whether the next commit will fail.
    pub fn is_failing(&self) -> bool {
        self.state.commits_ok_left.load(SeqCst) == 0
    }

    /// How many commits reached the inner store and succeeded.
    pub fn committed(&self) -> u64 {
        self.state.committed.load(SeqCst)
    }

    /// How many commits were refused by injection.
    pub fn refused(&self) -> u64 {
        self.state.refused.load(SeqCst)
    }

    /// Takes one commit's permission: `false` if it must fail.
    fn admit(&self) -> bool {
        let admitted = self
            .state
            .commits_ok_left
            .fetch_update(SeqCst, SeqCst, |left| match left {
                0 => None,
                u64::MAX => Some(u64::MAX),
                left => Some(left - 1),
            })
            .is_ok();
        if !admitted {
            self.state.refused.fetch_add(1, SeqCst);
        }
        admitted
    }
}

impl<S: Store> Store for FlakyStore<S> {
    type Error = FlakyError<S::Error>;

    fn meta(&self) -> Result<StoreMeta, Self::Error> {
        self.inner.meta().map_err(FlakyError::Store)
    }

    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), Self::Error> {
        self.inner
            .read_stream(stream, after_seq, limit, out)
            .map_err(FlakyError::Store)
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), Self::Error> {
        if !self.faults.admit() {
            return Err(FlakyError::Injected);
        }
        self.inner.commit(batch).map_err(FlakyError::Store)?;
        self.faults.state.committed.fetch_add(1, SeqCst);
        Ok(())
    }

    fn view(&self) -> Option<StoreView> {
        self.inner.view()
    }

    fn keep_checkpoints(&mut self, vectors: &[VersionVector]) -> Result<(), Self::Error> {
        self.inner
            .keep_checkpoints(vectors)
            .map_err(FlakyError::Store)
    }
}

/// A store whose commits, once its [`CommitGate`] is armed, block until
/// the test releases them, over an inner store (a [`MemStore`] by default).
///
/// ```
/// use std::time::Duration;
/// use meshlog_cursor::StreamId;
/// use meshlog_replica::{Config, MemStore, Replica};
/// use meshlog_testkit::{HeldCommit, HeldStore};
///
/// let store = HeldStore::new(MemStore::default(), Duration::from_secs(5));
/// let gate = store.gate();
/// let mut replica = Replica::open(Config::new(StreamId::new(1)), store)?;
/// gate.arm();
/// let writer = std::thread::spawn(move || replica.append(&b"slow"[..]).map(|e| e.seq));
/// assert!(gate.wait_holding(Duration::from_secs(5)), "the commit is held");
/// assert!(gate.release());
/// assert_eq!(writer.join().unwrap()?, 1);
/// assert_eq!(
///     gate.commits(),
///     [HeldCommit { events: vec![(StreamId::new(1), 1)], released: true }]
/// );
/// # Ok::<(), meshlog_replica::ReplicaError>(())
/// ```
#[derive(Debug)]
pub struct HeldStore<S = MemStore> {
    inner: S,
    gate: Arc<CommitGate>,
}

impl<S> HeldStore<S> {
    /// A store over `inner` whose commits, once armed, are each held until
    /// released or for `hold_max` at most (so a test that never releases
    /// fails by its own check, not by hanging).
    pub fn new(inner: S, hold_max: Duration) -> Self {
        HeldStore {
            inner,
            gate: Arc::new(CommitGate::new(hold_max)),
        }
    }

    /// The gate that holds and releases this store's commits.
    pub fn gate(&self) -> Arc<CommitGate> {
        Arc::clone(&self.gate)
    }

    /// The inner store.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Store> Store for HeldStore<S> {
    type Error = S::Error;

    fn meta(&self) -> Result<StoreMeta, S::Error> {
        self.inner.meta()
    }

    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), S::Error> {
        self.inner.read_stream(stream, after_seq, limit, out)
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), S::Error> {
        self.gate.hold(batch);
        self.inner.commit(batch)
    }

    fn view(&self) -> Option<StoreView> {
        self.inner.view()
    }

    fn keep_checkpoints(&mut self, vectors: &[VersionVector]) -> Result<(), S::Error> {
        self.inner.keep_checkpoints(vectors)
    }
}

/// Holds a [`HeldStore`]'s commits, once armed, until another thread
/// releases them (or `hold_max` passes), and records each held commit.
#[derive(Debug)]
pub struct CommitGate {
    state: Mutex<GateState>,
    changed: Condvar,
    hold_max: Duration,
}

#[derive(Debug, Default)]
struct GateState {
    armed: bool,
    holding: bool,
    released: bool,
    commits: Vec<HeldCommit>,
}

/// One commit a [`CommitGate`] held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCommit {
    /// `(stream, seq)` of each event committed.
    pub events: Vec<(StreamId, u64)>,
    /// Whether another thread released it while it was held (`false`: it
    /// waited out `hold_max`).
    pub released: bool,
}

impl CommitGate {
    /// A gate, not yet armed, that holds a commit for `hold_max` at most.
    pub fn new(hold_max: Duration) -> Self {
        CommitGate {
            state: Mutex::default(),
            changed: Condvar::new(),
            hold_max,
        }
    }

    /// Holds every commit from now on (commits before, such as a replica's
    /// on open, pass straight through and are not recorded).
    pub fn arm(&self) {
        self.lock().armed = true;
    }

    /// Lets commits through unheld again (a commit being held stays held
    /// until released).
    pub fn disarm(&self) {
        self.lock().armed = false;
    }

    /// Releases the commit being held, if any; whether there was one.
    pub fn release(&self) -> bool {
        let mut state = self.lock();
        if state.holding && !state.released {
            state.released = true;
            self.changed.notify_all();
            true
        } else {
            false
        }
    }

    /// Whether a commit is being held now (and not yet released).
    pub fn is_holding(&self) -> bool {
        let state = self.lock();
        state.holding && !state.released
    }

    /// Waits until a commit is being held, for `within` at most; whether
    /// one is.
    pub fn wait_holding(&self, within: Duration) -> bool {
        let state = self.lock();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, within, |state| !state.holding || state.released)
            .unwrap_or_else(PoisonError::into_inner);
        state.holding && !state.released
    }

    /// Every commit held so far, in order.
    pub fn commits(&self) -> Vec<HeldCommit> {
        self.lock().commits.clone()
    }

    fn hold(&self, batch: &Batch) {
        let mut state = self.lock();
        if !state.armed {
            return;
        }
        assert!(!state.holding, "two commits at once on one store");
        state.holding = true;
        state.released = false;
        // Wake a test waiting in `wait_holding`.
        self.changed.notify_all();
        let (mut state, _) = self
            .changed
            .wait_timeout_while(state, self.hold_max, |state| !state.released)
            .unwrap_or_else(PoisonError::into_inner);
        state.holding = false;
        let commit = HeldCommit {
            events: batch.events().map(|e| (e.stream, e.seq)).collect(),
            released: state.released,
        };
        state.commits.push(commit);
    }

    /// The state, even if a test thread panicked holding the lock: the
    /// gate's state stays consistent across each critical section.
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::thread;
    use std::time::Instant;

    use meshlog_cursor::VersionVector;
    use meshlog_replica::{Config, Replica, ReplicaError};

    use super::*;

    const OWN: StreamId = StreamId::new(1);

    fn event(seq: u64) -> Event {
        Event {
            stream: OWN,
            seq,
            lamport: seq,
            time_ms: 0,
            payload: Default::default(),
        }
    }

    fn batch(seq: u64) -> Batch<'static> {
        Batch::from_events(vec![event(seq)]).with_clock(seq)
    }

    #[test]
    fn a_flaky_store_fails_after_n_commits_until_healed() {
        let mut store = FlakyStore::default();
        let faults = store.faults();
        assert!(!faults.is_failing());
        faults.fail_after(2);
        assert!(store.commit(&batch(1)).is_ok());
        assert!(store.commit(&batch(2)).is_ok());
        assert!(faults.is_failing());
        assert!(matches!(store.commit(&batch(3)), Err(FlakyError::Injected)));
        assert!(matches!(store.commit(&batch(3)), Err(FlakyError::Injected)));
        // Reads still answer, and hold exactly what was committed.
        assert_eq!(store.meta().unwrap().heads.get(OWN), 2);
        faults.heal();
        assert!(store.commit(&batch(3)).is_ok());
        assert_eq!((faults.committed(), faults.refused()), (3, 2));
        faults.fail_now();
        assert!(store.commit(&batch(4)).is_err());
        assert_eq!(store.into_inner().meta().unwrap().heads.get(OWN), 3);
    }

    /// What `replica/tests/scenarios.rs` relies on: after a failed commit
    /// the replica keeps serving what it committed, refuses changes until
    /// reopened, and reopens on the healed store with exactly that.
    #[test]
    fn a_replica_on_a_failing_store_stops_and_reopens() {
        let store = FlakyStore::default();
        let faults = store.faults();
        let config = Config::new(OWN);
        let mut replica = Replica::open(config.clone(), store).unwrap();
        replica.append(&b"durable"[..]).unwrap();
        faults.fail_now();
        assert!(matches!(
            replica.append(&b"lost"[..]),
            Err(ReplicaError::Store(_))
        ));
        assert_eq!(
            replica
                .page(&VersionVector::new(), 10)
                .unwrap()
                .events
                .len(),
            1
        );
        assert!(matches!(
            replica.append(&b"refused"[..]),
            Err(ReplicaError::Failed)
        ));
        faults.heal();
        let replica = Replica::open(config, replica.into_store()).unwrap();
        assert_eq!(replica.marks().get(OWN), 1);
    }

    #[test]
    fn an_unarmed_gate_lets_commits_through_unrecorded() {
        let mut store = HeldStore::new(MemStore::default(), Duration::from_secs(60));
        let gate = store.gate();
        store.commit(&batch(1)).unwrap();
        assert!(gate.commits().is_empty());
        assert!(!gate.is_holding());
        assert!(!gate.release(), "nothing to release");
    }

    #[test]
    fn a_held_commit_waits_for_its_release() {
        let mut store = HeldStore::new(MemStore::default(), Duration::from_secs(60));
        let gate = store.gate();
        gate.arm();
        let writer = thread::spawn(move || {
            store.commit(&batch(1)).unwrap();
            store
        });
        assert!(gate.wait_holding(Duration::from_secs(60)));
        assert!(gate.is_holding());
        assert!(!writer.is_finished(), "the commit waits while held");
        assert!(gate.release());
        let store = writer.join().unwrap();
        assert!(!gate.is_holding());
        assert_eq!(
            gate.commits(),
            [HeldCommit {
                events: vec![(OWN, 1)],
                released: true,
            }]
        );
        assert_eq!(store.into_inner().meta().unwrap().heads.get(OWN), 1);
    }

    #[test]
    fn an_unreleased_commit_goes_on_after_hold_max() {
        let hold_max = Duration::from_millis(20);
        let mut store = HeldStore::new(MemStore::default(), hold_max);
        let gate = store.gate();
        gate.arm();
        let start = Instant::now();
        store.commit(&batch(1)).unwrap();
        assert!(start.elapsed() >= hold_max);
        assert_eq!(
            gate.commits(),
            [HeldCommit {
                events: vec![(OWN, 1)],
                released: false,
            }]
        );
        gate.disarm();
        store.commit(&batch(2)).unwrap();
        assert_eq!(gate.commits().len(), 1);
    }
}
