//! What `SharedReplica`, the one handle every task shares, promises:
//!
//! - readers never wait for a commit in progress, and see nothing of it
//!   until it is committed (a store whose commit is held until the test
//!   releases it);
//! - a commit that fails part-way through an apply leaves the readable state
//!   exactly as it was (marks, floor, digest, a full page walk);
//! - deltas grouped into one round are checked against each other (two
//!   peers' versions of one event: the first is kept);
//! - every write path publishes a change notification;
//! - the async writes complete on any executor;
//! - a panic inside a round poisons the handle under one stated policy, and
//!   no caller is left waiting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Batch, Config, Delta, DeltaError, Event, MemStore, PageError, Replica, ReplicaError,
    SharedReplica, Store, StoreMeta,
};
use meshlog_testkit::store::{FlakyStore, HeldStore};

const OWN: StreamId = StreamId::new(1);
const PEER: StreamId = StreamId::new(2);
const OTHER: StreamId = StreamId::new(3);
/// How long a held commit waits for its release at most: long enough that
/// a reader stuck behind it is caught, short enough to fail a broken run.
const HOLD_MAX: Duration = Duration::from_secs(20);

fn event(stream: StreamId, seq: u64, lamport: u64, payload: &str) -> Event {
    Event {
        stream,
        seq,
        lamport,
        time_ms: 0,
        payload: payload.to_owned().into(),
    }
}

fn delta(events: Vec<Event>) -> Delta {
    Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events,
        seals: Vec::new(),
    }
}

/// Everything a reader can see, read through the handle.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    marks: VersionVector,
    floor: VersionVector,
    digest: meshlog_replica::Digest,
    walk: Vec<Event>,
    delta: Vec<Event>,
}

fn seen<S: Store>(shared: &SharedReplica<S>) -> Seen {
    let mut walk = Vec::new();
    // From the floor: what is held, not a stale report.
    let mut cursor = shared.floor();
    loop {
        let page = shared.page(&cursor, 3).expect("a page");
        walk.extend(page.events);
        cursor = page.next;
        if page.at_head {
            break;
        }
    }
    Seen {
        marks: shared.marks(),
        floor: shared.floor(),
        digest: shared.digest(),
        walk,
        delta: shared.delta_for(&VersionVector::new(), usize::MAX).events,
    }
}

#[test]
fn reads_never_wait_for_a_commit_in_progress_and_see_nothing_of_it_before() {
    let store = HeldStore::new(MemStore::default(), HOLD_MAX);
    let gate = store.gate();
    let shared = SharedReplica::new(Replica::open(Config::new(OWN), store).unwrap());
    shared.append("committed").unwrap();
    shared
        .apply(delta(vec![event(PEER, 1, 5, "from a peer")]))
        .unwrap();
    let before = seen(&shared);
    let version = shared.latest_change().version;

    gate.arm();
    let writer = {
        let shared = shared.clone();
        std::thread::spawn(move || shared.append("held"))
    };
    assert!(gate.wait_holding(HOLD_MAX), "the commit was never held");

    // Readers on other threads, while the commit is held.
    let (answers, answered) = mpsc::channel();
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (shared, answers) = (shared.clone(), answers.clone());
            std::thread::spawn(move || {
                let _ = answers.send((seen(&shared), shared.get(OWN, 2)));
            })
        })
        .collect();
    for _ in 0..4 {
        let (during, held_event) = answered
            .recv_timeout(HOLD_MAX / 2)
            .expect("a reader waited for the held commit");
        assert_eq!(during, before, "a read saw the commit in progress");
        assert_eq!(held_event, None);
    }
    assert!(
        gate.is_holding(),
        "every read returned while the commit was held"
    );
    assert_eq!(
        shared.latest_change().version,
        version,
        "no change published yet"
    );
    for reader in readers {
        reader.join().unwrap();
    }

    assert!(gate.release());
    let appended = writer.join().unwrap().unwrap();
    assert_eq!(appended.seq, 2);
    let after = seen(&shared);
    assert_eq!(after.marks.get(OWN), 2);
    assert_eq!(after.walk.len(), before.walk.len() + 1);
    assert_eq!(shared.get(OWN, 2), Some(appended));
    assert!(shared.latest_change().version > version);
    assert!(gate.commits().iter().all(|commit| commit.released));
}

#[test]
fn a_commit_failing_in_the_middle_of_an_apply_leaves_the_readable_state_unchanged() {
    let store = FlakyStore::new(MemStore::default());
    let faults = store.faults();
    let shared = SharedReplica::new(Replica::open(Config::new(OWN), store).unwrap());
    shared.append("own 1").unwrap();
    shared.append("own 2").unwrap();
    shared
        .apply(delta(vec![
            event(PEER, 1, 3, "p1"),
            event(PEER, 2, 4, "p2"),
            event(OTHER, 1, 2, "o1"),
            // Early: waits in the pending buffer for PEER's seq 3.
            event(PEER, 4, 9, "p4"),
        ]))
        .unwrap();
    shared
        .compact(&[(PEER, 1)].into_iter().collect::<VersionVector>())
        .unwrap();
    assert_eq!(shared.pending_len(), 1);
    let before = seen(&shared);
    let stats = shared.stats();

    faults.fail_now();
    // New events, a released early one, a raised floor: all in one commit
    // that fails.
    let failing = Delta {
        floor_proofs: Default::default(),
        floor: [(OTHER, 1)].into_iter().collect(),
        events: vec![event(PEER, 3, 8, "p3"), event(OTHER, 2, 10, "o2")],
        seals: Vec::new(),
    };
    let refused = shared.apply(failing.clone());
    assert!(
        matches!(refused, Err(ReplicaError::Store(_))),
        "{refused:?}"
    );
    assert_eq!(
        seen(&shared),
        before,
        "the failed commit changed what readers see"
    );
    assert_eq!(shared.pending_len(), 1);
    assert_eq!(shared.stats(), stats);

    // The store's content is uncertain now: no further change is made.
    faults.heal();
    assert!(matches!(shared.apply(failing), Err(ReplicaError::Failed)));
    assert!(matches!(shared.append("x"), Err(ReplicaError::Failed)));
    assert_eq!(
        seen(&shared),
        before,
        "reads keep serving the committed state"
    );

    // Reopened on its store, it holds exactly what was committed.
    let store = shared.into_replica().unwrap().into_store().into_inner();
    let reopened = SharedReplica::new(Replica::open(Config::new(OWN), store).unwrap());
    // The pending buffer is memory only; everything a reader saw is durable.
    assert_eq!(seen(&reopened), before);
    assert_eq!(reopened.append("after reopen").unwrap().seq, 3);
}

/// Two peers' deltas that carry different versions of one event, grouped
/// into one round (queued while the committer is held on another round):
/// the first is applied, the second refused as an equivocation, and the
/// rest of the round goes through.
#[test]
fn deltas_grouped_into_one_round_are_checked_against_each_other() {
    let store = HeldStore::new(MemStore::default(), HOLD_MAX);
    let gate = store.gate();
    let shared = SharedReplica::new(Replica::open(Config::new(OWN), store).unwrap());
    gate.arm();
    let blocker = shared.append_async("holds the committer");
    assert!(gate.wait_holding(HOLD_MAX));
    let first = shared.apply_async(delta(vec![event(PEER, 1, 5, "first version")]));
    let second = shared.apply_async(delta(vec![event(PEER, 1, 5, "second version")]));
    let third = shared.apply_async(delta(vec![event(OTHER, 1, 6, "unrelated")]));
    let append = shared.append_async("mine");
    gate.disarm();
    assert!(gate.release());

    assert_eq!(blocker.wait().unwrap().seq, 1);
    assert_eq!(first.wait().unwrap().applied, 1);
    let refused = second.wait();
    assert!(
        matches!(
            refused,
            Err(ReplicaError::Delta(DeltaError::Equivocation { seq: 1, .. }))
        ),
        "{refused:?}"
    );
    assert_eq!(third.wait().unwrap().applied, 1);
    let mine = append.wait().unwrap();
    assert_eq!(mine.seq, 2);
    // Appends in a round with deltas are stamped above what they made visible.
    assert!(mine.lamport > 6);
    assert_eq!(
        shared.get(PEER, 1).unwrap().payload,
        &b"first version"[..],
        "the first version is kept"
    );
    assert_eq!(shared.stats().deltas_refused, 1);
    assert_eq!(
        shared.commit_stats().commits,
        2,
        "the queued requests went in one round after the held one"
    );
}

#[test]
fn every_write_path_publishes_a_change() {
    let shared = SharedReplica::in_memory(OWN);
    let calls = Arc::new(AtomicU64::new(0));
    let hook = {
        let calls = Arc::clone(&calls);
        shared.on_change(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
        })
    };
    let mut version = shared.latest_change().version;
    let mut expect_change = |what: &str, shared: &SharedReplica| {
        let change = shared.wait_for_change(version, Duration::from_secs(5));
        assert!(change.version > version, "{what} published no change");
        assert_eq!(change.marks, shared.marks());
        assert_eq!(change.floor, shared.floor());
        version = change.version;
    };
    shared.append("single").unwrap();
    expect_change("append", &shared);
    shared.append_batch(vec!["a".into(), "b".into()]).unwrap();
    expect_change("append_batch", &shared);
    let peer = delta(vec![event(PEER, 1, 50, "p")]);
    shared.apply(peer.clone()).unwrap();
    expect_change("apply", &shared);
    shared
        .compact(&[(OWN, 2)].into_iter().collect::<VersionVector>())
        .unwrap();
    expect_change("compact", &shared);
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    // A delta of duplicates moves nothing and publishes nothing.
    assert_eq!(shared.apply(peer).unwrap().duplicates, 1);
    assert_eq!(shared.latest_change().version, version);
    drop(hook);
    shared.append("unhooked").unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4, "a dropped hook still ran");
}

/// Wakes the thread that blocks on a future.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor: polls `future` on this thread, parking between
/// wake-ups (bounded, so a lost wake-up fails rather than hangs).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    for _ in 0..100_000 {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
    panic!("the future never completed");
}

#[test]
fn async_writes_complete_on_any_executor() {
    let store = HeldStore::new(MemStore::default(), HOLD_MAX);
    let shared = SharedReplica::new(Replica::open(Config::new(OWN), store).unwrap());
    let completions: Vec<_> = (0..64)
        .map(|i| shared.append_async(format!("async {i}")))
        .collect();
    let seqs: Vec<u64> = block_on(async {
        let mut seqs = Vec::new();
        for completion in completions {
            seqs.push(completion.await.unwrap().seq);
        }
        seqs
    });
    assert_eq!(
        seqs,
        (1..=64).collect::<Vec<_>>(),
        "submitted in order, answered in order"
    );
    let batch = block_on(shared.append_batch_async(vec!["x".into(), "y".into()])).unwrap();
    assert_eq!(batch.iter().map(|e| e.seq).collect::<Vec<_>>(), [65, 66]);
    assert!(
        shared.commit_stats().commits < 66,
        "some appends shared a commit"
    );
}

/// A store whose commit panics on command: a bug inside a round.
#[derive(Debug, Default)]
struct PanickingStore {
    inner: MemStore,
    panic: Arc<std::sync::atomic::AtomicBool>,
}

impl Store for PanickingStore {
    type Error = std::convert::Infallible;

    fn meta(&self) -> Result<StoreMeta, Self::Error> {
        self.inner.meta()
    }

    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), Self::Error> {
        self.inner.read_stream(stream, after_seq, limit, out)
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), Self::Error> {
        assert!(
            !self.panic.load(Ordering::SeqCst),
            "injected: the store panics mid-commit"
        );
        self.inner.commit(batch)
    }
}

/// The poison policy: after a panic inside a round the handle serves
/// nothing new (pages fail, deltas are empty, writes fail), keeps answering
/// the last published marks, and answers every caller instead of leaving
/// one waiting.
#[test]
fn a_panic_inside_a_round_poisons_the_handle_and_answers_every_caller() {
    let store = PanickingStore::default();
    let panic = Arc::clone(&store.panic);
    let shared = SharedReplica::new(Replica::open(Config::new(OWN), store).unwrap());
    shared.append("before").unwrap();
    let marks = shared.marks();
    panic.store(true, Ordering::SeqCst);
    let lost = shared.append("in the panicking round");
    assert!(matches!(lost, Err(ReplicaError::Failed)), "{lost:?}");
    assert!(matches!(shared.append("after"), Err(ReplicaError::Failed)));
    assert!(matches!(
        shared.page(&VersionVector::new(), 10),
        Err(PageError::Failed)
    ));
    assert_eq!(
        shared.delta_for(&VersionVector::new(), usize::MAX),
        Delta::default()
    );
    assert_eq!(shared.marks(), marks);
    let mut replica = shared.into_replica().unwrap();
    assert!(matches!(
        replica.append("via the replica"),
        Err(ReplicaError::Failed)
    ));
}

#[test]
fn into_replica_hands_back_the_replica_only_from_the_last_handle() {
    let shared = SharedReplica::in_memory(OWN);
    shared.append("one").unwrap();
    let other = shared.clone();
    let shared = shared.into_replica().expect_err("another handle is alive");
    drop(other);
    let mut replica = shared.into_replica().expect("the last handle");
    assert_eq!(replica.append("two").unwrap().seq, 2);
}
