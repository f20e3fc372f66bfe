//! What the append fast path of `SharedReplica` (an append on a
//! `Commits::Inline` handle with nothing queued commits without a round,
//! issue 28) keeps of the round's promises:
//!
//! - appends from several threads, mixed with batches, async appends and
//!   deltas (which go through rounds), are each committed once: the own
//!   stream holds seqs 1..=N without a hole, each thread's acknowledgements
//!   rise in its call order, lamport rises with seq, and the counters
//!   (`stats`, `commit_stats`) count every event; every change is notified
//!   to hooks once, in order, and the last one is the handle's latest;
//! - a failed store commit shows nothing and refuses writes until reopened;
//! - a panic on the fast path (a panicking hook) poisons the handle;
//! - a caller of `wait_for_change` wakes for a fast-path append.
//!
//! The concurrent test is seeded (`MESHLOG_SEED` replays one; the seed is
//! printed on failure): the seed draws each thread's operations, the
//! threads' interleaving is the machine's.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Change, Commits, Config, Delta, Event, PageError, Replica, ReplicaError, SharedReplica,
};
use meshlog_testkit::{seed, FlakyStore, SplitMix64};

const OWN: StreamId = StreamId::new(1);
const PEER: StreamId = StreamId::new(2);
const THREADS: u64 = 4;
const CALLS: u64 = 150;

/// What one thread's call appended: its own payloads, acknowledged as events.
fn payload(thread: u64, call: u64, index: u64) -> Bytes {
    Bytes::from(format!("thread {thread} call {call} event {index}"))
}

/// Thread `thread`'s calls, drawn from `rng`: appends (single, explicit
/// time, batch of 0 to 4, async) and now and then a peer's delta.
fn calls(shared: &SharedReplica, thread: u64, rng: &mut SplitMix64) -> Vec<Event> {
    let mut acknowledged = Vec::new();
    for call in 0..CALLS {
        match rng.below(10) {
            0..=4 => acknowledged.push(shared.append(payload(thread, call, 0)).unwrap()),
            5 => acknowledged.push(shared.append_at(payload(thread, call, 0), call).unwrap()),
            6 | 7 => {
                let len = rng.below(5);
                let batch = (0..len).map(|i| payload(thread, call, i)).collect();
                let events = shared.append_batch(batch).unwrap();
                assert_eq!(events.len() as u64, len);
                acknowledged.extend(events);
            }
            8 => {
                let event = shared.append_async(payload(thread, call, 0)).wait();
                acknowledged.push(event.unwrap());
            }
            _ => {
                // The peer's events, each thread its own range of seqs: a
                // delta goes through a round and may wait pending.
                let seq = thread * CALLS + call + 1;
                let delta = Delta {
                    floor_proofs: Default::default(),
                    floor: VersionVector::new(),
                    events: vec![Event {
                        stream: PEER,
                        seq,
                        lamport: seq,
                        time_ms: 0,
                        payload: Bytes::from(format!("peer {seq}")),
                    }],
                    seals: Vec::new(),
                };
                shared.apply(delta).unwrap();
            }
        }
    }
    acknowledged
}

fn appends_from_threads(seed: u64) {
    let shared = SharedReplica::in_memory(OWN);
    let changes = Arc::new(Mutex::new(Vec::<Change>::new()));
    let _hook = {
        let changes = Arc::clone(&changes);
        shared.on_change(move |change| changes.lock().unwrap().push(change.clone()))
    };
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let shared = shared.clone();
            let mut rng = SplitMix64::new(SplitMix64::derive(seed, thread));
            std::thread::spawn(move || calls(&shared, thread, &mut rng))
        })
        .collect();
    let mut all = Vec::new();
    for (thread, handle) in threads.into_iter().enumerate() {
        let acknowledged = handle.join().expect("an appending thread");
        for pair in acknowledged.windows(2) {
            assert!(
                pair[0].seq < pair[1].seq,
                "thread {thread}: acknowledged seq {} after {}",
                pair[1].seq,
                pair[0].seq
            );
        }
        all.extend(acknowledged);
    }
    let appended = all.len() as u64;
    all.sort_by_key(|event| event.seq);
    let seqs: Vec<u64> = all.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=appended).collect::<Vec<_>>(), "each seq once");
    let payloads: BTreeSet<&Bytes> = all.iter().map(|event| &event.payload).collect();
    assert_eq!(payloads.len() as u64, appended, "each payload once");
    for pair in all.windows(2) {
        assert!(pair[0].lamport < pair[1].lamport, "lamport rises with seq");
    }
    for event in &all {
        assert_eq!(shared.get(OWN, event.seq).as_ref(), Some(event), "held");
    }
    assert_eq!(shared.marks().get(OWN), appended);
    assert_eq!(shared.stats().appended, appended, "stats");
    assert_eq!(shared.commit_stats().appended, appended, "commit_stats");

    let changes = changes.lock().unwrap();
    for pair in changes.windows(2) {
        assert_eq!(pair[1].version, pair[0].version + 1, "each change once");
        assert!(pair[0].marks.get(OWN) <= pair[1].marks.get(OWN));
        assert!(pair[0].marks.get(PEER) <= pair[1].marks.get(PEER));
    }
    assert_eq!(changes.last(), Some(&shared.latest_change()));
}

#[test]
fn appends_from_threads_are_each_committed_once_counted_and_notified() {
    let count = std::env::var("MESHLOG_QC_TESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(8);
    seed::for_each_seed("shared_appends", 0x5eed_a9e0, count, appends_from_threads);
}

#[test]
fn a_failed_commit_on_the_fast_path_shows_nothing_and_refuses_until_reopened() {
    let store = FlakyStore::default();
    let faults = store.faults();
    let replica = Replica::open(Config::new(OWN), store).unwrap();
    let shared = SharedReplica::with_commits(replica, Commits::Inline);
    let kept = shared.append("kept").unwrap();
    let (marks, stats, change) = (shared.marks(), shared.stats(), shared.latest_change());
    faults.fail_now();
    let lost = shared.append("lost");
    assert!(matches!(lost, Err(ReplicaError::Store(_))), "{lost:?}");
    assert_eq!(shared.marks(), marks);
    assert_eq!(shared.stats(), stats);
    assert_eq!(shared.latest_change(), change, "no change notified");
    assert_eq!(shared.get(OWN, 2), None);
    let page = shared.page(&VersionVector::new(), 10).unwrap();
    assert_eq!(page.events, vec![kept]);
    faults.heal();
    let refused = shared.append("after the failure");
    assert!(matches!(refused, Err(ReplicaError::Failed)), "{refused:?}");
}

#[test]
fn a_panic_on_the_fast_path_poisons_the_handle() {
    let shared = SharedReplica::in_memory(OWN);
    shared.append("before").unwrap();
    let marks = shared.marks();
    let _hook = shared.on_change(|_| panic!("injected: a hook panics"));
    let lost = shared.append("in the panicking append");
    assert!(matches!(lost, Err(ReplicaError::Failed)), "{lost:?}");
    assert!(matches!(shared.append("after"), Err(ReplicaError::Failed)));
    assert!(matches!(
        shared.page(&VersionVector::new(), 10),
        Err(PageError::Failed)
    ));
    assert_eq!(
        shared.marks().get(OWN),
        marks.get(OWN) + 1,
        "published before the hook ran"
    );
}

#[test]
fn a_caller_waiting_for_a_change_wakes_for_a_fast_path_append() {
    let shared = SharedReplica::in_memory(OWN);
    let version = shared.latest_change().version;
    let waiter = {
        let shared = shared.clone();
        // Far longer than any run: a lost wake-up shows as a hung test.
        std::thread::spawn(move || shared.wait_for_change(version, Duration::from_secs(3600)))
    };
    shared.append("wakes the waiter").unwrap();
    let change = waiter.join().expect("the waiter");
    assert!(change.version > version);
    assert_eq!(change.marks.get(OWN), 1);
}
