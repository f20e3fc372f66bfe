//! The one difference a group commit cannot avoid (issue 28 follow-up,
//! documented on `SharedReplica`): when the store commit of a round fails,
//! every request of the round answers the store error, and nothing of it
//! is visible; one by one, the requests before the failing commit would
//! have been durable.

use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{Config, Delta, Event, Replica, ReplicaError, SharedReplica};
use meshlog_testkit::store::HeldStore;
use meshlog_testkit::FlakyStore;

const OWN: StreamId = StreamId::new(1);
const HOLD_MAX: Duration = Duration::from_secs(20);

/// What a request was answered: `Ok`, the store's error, `Failed`.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    Store,
    Failed,
}

fn answer<T>(result: Result<T, ReplicaError>) -> Answer {
    match result {
        Ok(_) => Answer::Ok,
        Err(ReplicaError::Store(_)) => Answer::Store,
        Err(ReplicaError::Failed) => Answer::Failed,
        Err(other) => panic!("unexpected: {other}"),
    }
}

fn peer_delta() -> Delta {
    Delta {
        events: vec![Event {
            stream: StreamId::new(2),
            seq: 1,
            lamport: 1,
            time_ms: 0,
            payload: Bytes::from_static(b"peer"),
        }],
        ..Delta::default()
    }
}

#[test]
fn a_failed_round_commit_answers_the_store_error_to_every_request_of_the_round() {
    // The handle: a blocker's commit held, three requests queued behind it
    // (one round), and the round's commit made to fail.
    let flaky = FlakyStore::default();
    let faults = flaky.faults();
    let store = HeldStore::new(flaky, HOLD_MAX);
    let gate = store.gate();
    let shared = SharedReplica::new(Replica::open(Config::new(OWN), store).unwrap());
    faults.fail_after(1); // the blocker's commit succeeds, the next fails
    gate.arm();
    let blocker = shared.append_async("blocker");
    assert!(gate.wait_holding(HOLD_MAX), "the blocker's commit is held");
    let first = shared.append_async("first");
    let second = shared.apply_async(peer_delta());
    let third = shared.append_async("third");
    gate.disarm();
    assert!(gate.release());
    blocker.wait().unwrap();
    let grouped = [
        answer(first.wait()),
        answer(second.wait()),
        answer(third.wait()),
    ];
    let after = answer(shared.append("after"));
    assert_eq!(shared.commit_stats().largest_round, 3, "one round of three");

    // One by one: the same requests, the same failing commit (the third
    // change after the blocker's).
    let flaky = FlakyStore::default();
    let reference_faults = flaky.faults();
    let mut reference = Replica::open(Config::new(OWN), flaky).unwrap();
    reference_faults.fail_after(2);
    reference.append("blocker").unwrap();
    let one_by_one = [
        answer(reference.append("first")),
        answer(reference.apply(&peer_delta())),
        answer(reference.append("third")),
    ];
    let reference_after = answer(reference.append("after"));

    assert_eq!(
        grouped,
        [Answer::Store, Answer::Store, Answer::Store],
        "grouped: the round's commit failed, every request of it answers the store error"
    );
    assert_eq!(
        one_by_one,
        [Answer::Ok, Answer::Store, Answer::Failed],
        "one by one: the first was durable, the second's commit failed, the third was refused"
    );
    assert_eq!((after, reference_after), (Answer::Failed, Answer::Failed));
    // Nothing of the round is visible: the blocker alone.
    assert_eq!(shared.marks().get(OWN), 1);
    assert_eq!(shared.marks().get(StreamId::new(2)), 0);
    assert_eq!(reference.marks().get(OWN), 2, "one by one, `first` is held");
}
