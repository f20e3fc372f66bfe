//! `SharedReplica::end_recovery` is a queued request (issue 28 follow-up:
//! it took the writer lock directly, so a request queued before it could be
//! planned after it, and the outcome depended on the committer's timing).

use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{Config, Delta, Event, MemStore, Replica, SharedReplica};
use meshlog_testkit::store::HeldStore;

const OWN: StreamId = StreamId::new(1);
const HOLD_MAX: Duration = Duration::from_secs(20);

fn delta(stream: StreamId, seqs: std::ops::RangeInclusive<u64>) -> Delta {
    Delta {
        events: seqs
            .map(|seq| Event {
                stream,
                seq,
                lamport: seq,
                time_ms: 0,
                payload: Bytes::from(format!("{stream} #{seq}")),
            })
            .collect(),
        ..Delta::default()
    }
}

/// The own stream's events 1..=2, queued before the end of recovery, are
/// taken (recovering); event 3, queued after it, is refused; as one by one.
#[test]
fn end_recovery_takes_its_place_in_the_queue() {
    let mut config = Config::new(OWN);
    config.recover_own_stream = true;
    let store = HeldStore::new(MemStore::default(), HOLD_MAX);
    let gate = store.gate();
    let shared = SharedReplica::new(Replica::open(config.clone(), store).unwrap());
    assert!(shared.is_recovering());

    let blocker = delta(StreamId::new(2), 1..=1);
    let before = delta(OWN, 1..=2);
    let after = delta(OWN, 3..=3);
    gate.arm();
    let held = shared.apply_async(blocker.clone());
    assert!(gate.wait_holding(HOLD_MAX), "the blocker's commit is held");
    let got_before = shared.apply_async(before.clone());
    let ended = shared.end_recovery_async();
    let got_after = shared.apply_async(after.clone());
    gate.disarm();
    assert!(gate.release());
    held.wait().unwrap();
    let got = (
        got_before.wait().map_err(|e| e.to_string()),
        ended.wait(),
        got_after.wait().map_err(|e| e.to_string()),
    );

    let mut reference = Replica::open(config, MemStore::default()).unwrap();
    reference.apply(&blocker).unwrap();
    let want_before = reference.apply(&before).map_err(|e| e.to_string());
    reference.end_recovery();
    let want_after = reference.apply(&after).map_err(|e| e.to_string());
    assert_eq!(got, (want_before, true, want_after));
    assert_eq!(got.0.as_ref().map(|report| report.applied), Ok(2));
    assert!(got.2.is_err(), "the own stream is closed to peers after");
    assert!(!shared.is_recovering());
    assert_eq!(shared.marks(), reference.marks());
    assert_eq!(shared.digest(), reference.digest());
}
