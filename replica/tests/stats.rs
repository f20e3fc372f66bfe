//! `stats()` counts alike on an owned `Replica` and on a `SharedReplica`
//! (issue 28): the same requests give the same counters, whichever
//! handle applies them. `replica/tests/round_fold.rs` compares every
//! counter after every round of a seeded property; this is the named
//! regression for the defect found.

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Replica, SharedReplica, Stats};

/// From issue 28: `Replica::stats().appended` stayed 0 after appends on an
/// owned replica (the plan's appended runs were taken out before
/// publishing counted them), while the shared handle counted them.
#[test]
fn an_owned_replica_counts_its_appends_as_the_shared_handle_does() {
    let mut owned = Replica::new(StreamId::new(1));
    let shared = SharedReplica::in_memory(StreamId::new(1));
    owned.append_at("one", 0).unwrap();
    owned
        .append_batch_at(["two".into(), "three".into()], 0)
        .unwrap();
    shared.append_at("one", 0).unwrap();
    shared
        .append_batch(vec!["two".into(), "three".into()])
        .unwrap();

    let mut peer = Replica::new(StreamId::new(2));
    peer.append_at("peer", 0).unwrap();
    let delta = peer.delta_for(&VersionVector::new(), usize::MAX);
    owned.apply(&delta).unwrap();
    owned.apply(&delta).unwrap();
    shared.apply(delta.clone()).unwrap();
    shared.apply(delta).unwrap();

    let expected = Stats {
        appended: 3,
        applied: 1,
        duplicates: 1,
        ..Stats::default()
    };
    assert_eq!(owned.stats(), expected);
    assert_eq!(shared.stats(), expected);
}
