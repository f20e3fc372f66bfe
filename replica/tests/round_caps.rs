//! A round's caps bound floors too (issue 28 follow-up: a delta of floors
//! alone counted as nothing toward `ROUND_EVENTS_MAX`, so one round could
//! take any number of them, all planned under the writer lock).

use std::time::Duration;

use meshlog_cursor::StreamId;
use meshlog_replica::{Config, Delta, MemStore, Replica, SharedReplica, ROUND_EVENTS_MAX};
use meshlog_testkit::store::HeldStore;

const HOLD_MAX: Duration = Duration::from_secs(20);

#[test]
fn deltas_of_floors_alone_are_split_into_rounds_by_the_events_cap() {
    let streams = ROUND_EVENTS_MAX as u64 * 3 / 4;
    let mut config = Config::new(StreamId::new(1));
    config.streams_max = meshlog_cursor::STREAMS_MAX;
    let store = HeldStore::new(MemStore::default(), HOLD_MAX);
    let gate = store.gate();
    let shared = SharedReplica::new(Replica::open(config, store).unwrap());
    gate.arm();
    let blocker = shared.append_async("blocker");
    assert!(gate.wait_holding(HOLD_MAX), "the blocker's commit is held");
    // Three deltas of floors alone, queued behind the held commit: each
    // counts ¾ of the cap, so no two share a round.
    let waiting: Vec<_> = (1..=3)
        .map(|seq| {
            shared.apply_async(Delta {
                floor: (2..streams + 2).map(|s| (StreamId::new(s), seq)).collect(),
                ..Delta::default()
            })
        })
        .collect();
    gate.disarm();
    assert!(gate.release());
    blocker.wait().unwrap();
    for completion in waiting {
        assert_eq!(completion.wait().unwrap().floors_raised, streams);
    }
    let stats = shared.commit_stats();
    assert_eq!(
        (stats.rounds, stats.largest_round),
        (4, 1),
        "the blocker's round, then one round per delta of floors"
    );
}
