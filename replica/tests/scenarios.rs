//! The brief's seed scenarios on in-process replicas, and the replica's other
//! named guarantees: exactly-once paging by a version-vector cursor (even
//! for an event stamped below the walk's position that arrives late), stale
//! cursors after compaction, equivocation, and the pending buffer.
//!
//! Each test builds replicas, links them with `common::Link` (an in-process
//! link that can be cut), walks with `common::Walker` (which panics on any
//! duplicate or misordered page) and checks what the walk returned against
//! the set of events the replicas hold.

mod common;

use std::collections::BTreeSet;

use common::{held, push, Link, Walker};
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Config, Delta, DeltaError, Event, MemStore, PageError, Replica, ReplicaError,
};
use meshlog_testkit::FlakyStore;

fn replica(id: u64) -> Replica {
    Replica::new(StreamId::new(id))
}

#[test]
fn paging_by_stamp_returns_every_event_exactly_once() {
    let (mut a, mut b, mut c) = (replica(1), replica(2), replica(3));
    let link = Link::default();
    for round in 0..20u32 {
        a.append(round.to_le_bytes().to_vec()).unwrap();
        if round % 2 == 0 {
            b.append(round.to_le_bytes().to_vec()).unwrap();
        }
        if round % 3 == 0 {
            c.append(round.to_le_bytes().to_vec()).unwrap();
            link.sync(&mut b, &mut c);
        }
        link.sync(&mut a, &mut b);
    }
    link.sync(&mut b, &mut c);
    link.sync(&mut a, &mut b);
    assert_eq!(a.digest(), c.digest());

    for limit in [1, 2, 3, 7, 100] {
        let mut walker = Walker::default();
        walker.walk_to_head(&a, limit);
        assert_eq!(walker.seen, held(&a), "limit {limit}");
        // The whole walk is in (lamport, stream) order, not only each page.
        let keys: Vec<_> = walker
            .events
            .iter()
            .map(|e| (e.lamport, e.stream))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "limit {limit}");
    }
}

#[test]
fn paging_while_events_arrive_returns_every_event_exactly_once() {
    let (mut a, mut b) = (replica(1), replica(2));
    let link = Link::default();
    let mut walker = Walker::default();
    for round in 0..60u32 {
        // The reader's own replica and its peer both keep writing.
        a.append(round.to_le_bytes().to_vec()).unwrap();
        if round % 3 != 0 {
            b.append(round.to_le_bytes().to_vec()).unwrap();
        }
        if round % 4 == 0 {
            link.sync(&mut a, &mut b);
        }
        walker.step(&a, 2).unwrap();
    }
    link.sync(&mut a, &mut b);
    walker.walk_to_head(&a, 2);
    assert_eq!(walker.seen, held(&a));
    assert_eq!(walker.seen.len(), 60 + 40);
}

/// B is partitioned away, appends at a lamport stamp the reader's walk has
/// already passed, and comes back: the version-vector cursor returns the
/// late event; a scalar "last stamp seen" cursor would lose it.
#[test]
fn events_resume_across_partition_test() {
    let (mut a, mut b) = (replica(1), replica(2));
    let mut link = Link::default();
    for i in 0..3u8 {
        b.append(vec![b'b', i]).unwrap();
        a.append(vec![b'a', i]).unwrap();
        link.sync(&mut a, &mut b);
    }
    let b_stamp = b.clock();

    link.cut = true;
    for i in 3..10u8 {
        a.append(vec![b'a', i]).unwrap();
    }
    // The reader walks A with a small limit, past B's stamp.
    let mut walker = Walker::default();
    walker.walk_to_head(&a, 2);
    assert!(walker.position > b_stamp, "the walk passed B's stamp");
    let cursor_before = walker.cursor.clone();

    // Partitioned, B appends; its clock has not seen A's later events.
    let late = b.append(&b"late"[..]).unwrap();
    assert!(
        late.lamport <= walker.position,
        "the late event ({}) is stamped at or below the walk's position ({})",
        late.lamport,
        walker.position
    );

    link.cut = false;
    link.sync(&mut a, &mut b);
    assert!(
        a.get(late.stream, late.seq).is_some(),
        "A accepted the late event"
    );

    // Resuming from the last cursor returns it.
    let page = a.page(&cursor_before, 10).unwrap();
    assert_eq!(page.events, vec![late.clone()]);

    // The contrast: the old design, a scalar cursor `lamport > after`,
    // never returns it.
    let all = a.page(&VersionVector::new(), 100).unwrap().events;
    let scalar_resume: Vec<&Event> = all.iter().filter(|e| e.lamport > walker.position).collect();
    assert!(
        scalar_resume.is_empty(),
        "a scalar cursor sees nothing after its position"
    );
    assert!(all.contains(&late), "although the late event is in the log");
}

/// The same partition, with the walk resumed after every single event and
/// the late delta delivered twice (once before and once after it is read):
/// every event of the log exactly once over the whole walk.
#[test]
fn events_resume_across_partition_with_repeated_resumes_and_a_duplicated_delta() {
    let (mut a, mut b) = (replica(1), replica(2));
    let mut link = Link::default();
    for i in 0..4u8 {
        a.append(vec![b'a', i]).unwrap();
        b.append(vec![b'b', i]).unwrap();
    }
    link.sync(&mut a, &mut b);
    link.cut = true;
    for i in 4..12u8 {
        a.append(vec![b'a', i]).unwrap();
    }
    let mut walker = Walker::default();
    // Resume after every event: each step starts from the previous cursor.
    while !walker.step(&a, 1).unwrap() {}
    let late_1 = b.append(&b"late-1"[..]).unwrap();
    let late_2 = b.append(&b"late-2"[..]).unwrap();
    assert!(late_2.lamport <= walker.position);

    let delta: Delta = b.delta_for(&a.marks(), usize::MAX);
    assert_eq!(delta.events.len(), 2);
    a.apply(&delta).unwrap();
    assert!(
        !walker.step(&a, 1).unwrap(),
        "one late event read, one left"
    );
    let again = a.apply(&delta).unwrap();
    assert_eq!(again.duplicates, 2, "the second delivery changes nothing");
    assert_eq!(again.applied, 0);
    while !walker.step(&a, 1).unwrap() {}
    assert!(walker.step(&a, 1).unwrap(), "at head, nothing more");

    link.cut = false;
    link.sync(&mut a, &mut b);
    assert_eq!(walker.seen, held(&a));
    assert_eq!(walker.seen.len(), 4 + 4 + 8 + 2);
    assert!(walker.seen.contains(&(late_1.stream, late_1.seq)));
}

/// A cursor is valid on any replica: a reader that fails over to a replica
/// behind the one it was reading continues without duplicates or losses.
#[test]
fn a_cursor_from_one_replica_resumes_on_another() {
    let (mut a, mut b) = (replica(1), replica(2));
    for i in 0..10u8 {
        a.append(vec![i]).unwrap();
        b.append(vec![i]).unwrap();
    }
    push(&a, &mut b, usize::MAX);
    let mut walker = Walker::default();
    walker.walk_to_head(&b, 3);
    // A lags: it has not seen B's events. Failing over to it returns
    // nothing twice, and everything once A catches up.
    assert!(walker.step(&a, 3).unwrap());
    push(&b, &mut a, usize::MAX);
    walker.walk_to_head(&a, 3);
    assert_eq!(walker.seen, held(&a));
    assert_eq!(walker.seen.len(), 20);
}

#[test]
fn a_stale_cursor_names_every_stream_and_range_and_resumes_without_duplicates() {
    let (mut a, mut b) = (replica(1), replica(2));
    for i in 0..10u8 {
        a.append(vec![i]).unwrap();
        b.append(vec![i]).unwrap();
    }
    push(&b, &mut a, usize::MAX);
    let mut walker = Walker::default();
    walker.step(&a, 4).unwrap();
    let (s1, s2) = (StreamId::new(1), StreamId::new(2));
    let read = (walker.cursor.get(s1), walker.cursor.get(s2));

    let floor: VersionVector = [(s1, 6), (s2, 7)].into_iter().collect();
    let report = a.compact(&floor).unwrap();
    assert_eq!(report.dropped, 13);

    let stale = match a.page(&walker.cursor, 4) {
        Err(PageError::Stale(stale)) => stale,
        other => panic!("expected a stale report, got {other:?}"),
    };
    let lost: Vec<_> = stale.lost().iter().map(|r| (r.stream, r.seqs())).collect();
    assert_eq!(lost, vec![(s1, read.0 + 1..=6), (s2, read.1 + 1..=7)]);
    assert_eq!(stale.resume(), &walker.cursor.joined(&floor));

    // The reader accepts the gap and continues: no duplicate, nothing else lost.
    let mut lost_names: BTreeSet<_> = BTreeSet::new();
    for range in stale.lost() {
        lost_names.extend(range.seqs().map(|seq| (range.stream, seq)));
    }
    walker.cursor = stale.resume().clone();
    walker.walk_to_head(&a, 4);
    let all: BTreeSet<_> = (1..=10).flat_map(|seq| [(s1, seq), (s2, seq)]).collect();
    assert!(walker.seen.is_disjoint(&lost_names));
    let union: BTreeSet<_> = walker.seen.union(&lost_names).copied().collect();
    assert_eq!(union, all);
}

/// A replica behind another's floor that holds nothing of the stream (a
/// newcomer) learns the floor through sync, records it, and reports its
/// own readers stale rather than skipping. One that holds events of the
/// stream below the floor keeps them and is told it is behind that peer's
/// floor (issue 29: a peer's floor never erases what a replica holds); once
/// it gives them up itself (compacting what it holds), it records the
/// floor and reports its readers stale just as exactly.
#[test]
fn a_replica_behind_a_peers_floor_records_it() {
    let (mut a, mut b, mut newcomer) = (replica(1), replica(2), replica(3));
    for i in 0..10u8 {
        a.append(vec![i]).unwrap();
    }
    push(&a, &mut b, usize::MAX);
    for i in 10..20u8 {
        a.append(vec![i]).unwrap();
    }
    let s1 = StreamId::new(1);
    a.compact(&[(s1, 15)].into_iter().collect()).unwrap();
    let cursor: VersionVector = [(s1, 12)].into_iter().collect();
    let stale_from = |replica: &Replica| match replica.page(&cursor, 10) {
        Err(PageError::Stale(stale)) => stale.lost()[0].seqs(),
        other => panic!("expected stale, got {other:?}"),
    };

    let delta = a.delta_for(&newcomer.marks(), usize::MAX);
    assert_eq!(delta.floor.get(s1), 15, "the floor travels with the delta");
    let report = newcomer.apply(&delta).unwrap();
    assert_eq!((report.floors_raised, report.applied), (1, 5));
    assert_eq!(newcomer.floor().get(s1), 15);
    assert_eq!(newcomer.marks().get(s1), 20);
    assert_eq!(stale_from(&newcomer), 13..=15);

    let (digest, marks) = (b.digest(), b.marks());
    let delta = a.delta_for(&b.marks(), usize::MAX);
    assert_eq!(delta.floor.get(s1), 15);
    let report = b.apply(&delta).unwrap();
    assert_eq!(report.behind_floor, [(s1, 15)]);
    assert_eq!((report.behind_events, report.applied), (5, 0));
    assert_eq!((b.digest(), b.marks()), (digest, marks));
    assert_eq!(b.floor().get(s1), 0);
    assert_eq!(b.stats().behind_floor, 1);

    b.compact(&b.marks()).unwrap();
    b.apply(&a.delta_for(&b.marks(), usize::MAX)).unwrap();
    assert_eq!((b.floor().get(s1), b.marks().get(s1)), (15, 20));
    let cursor_at_5: VersionVector = [(s1, 5)].into_iter().collect();
    match b.page(&cursor_at_5, 10) {
        Err(PageError::Stale(stale)) => assert_eq!(stale.lost()[0].seqs(), 6..=15),
        other => panic!("expected stale, got {other:?}"),
    }
}

#[test]
fn equivocation_is_reported_and_the_first_event_kept() {
    let (mut a, mut b) = (replica(1), replica(2));
    let first = a.append(&b"first"[..]).unwrap();
    push(&a, &mut b, usize::MAX);
    let digest = b.digest();
    let forged = Event {
        payload: (&b"forged"[..]).into(),
        ..first.clone()
    };
    let delta = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![forged],
        seals: Vec::new(),
    };
    match b.apply(&delta) {
        Err(ReplicaError::Delta(DeltaError::Equivocation { stream, seq })) => {
            assert_eq!((stream, seq), (first.stream, first.seq));
        }
        other => panic!("expected an equivocation, got {other:?}"),
    }
    assert_eq!(b.get(first.stream, first.seq), Some(first));
    assert_eq!(b.digest(), digest, "a refused delta changes nothing");
    assert_eq!(b.stats().deltas_refused, 1);
}

#[test]
fn equivocation_inside_one_delta_and_against_a_pending_event_is_refused() {
    let mut a = replica(1);
    let events: Vec<Event> = (0..4u8).map(|i| a.append(vec![i]).unwrap()).collect();
    let mut b = replica(2);
    // seq 3 arrives early and waits; a different seq 3 is then refused.
    b.apply(&Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![events[2].clone()],
        seals: Vec::new(),
    })
    .unwrap();
    assert_eq!(b.pending_len(), 1);
    let forged = Event {
        payload: (&b"x"[..]).into(),
        ..events[2].clone()
    };
    let refused = b.apply(&Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![forged.clone()],
        seals: Vec::new(),
    });
    assert!(matches!(
        refused,
        Err(ReplicaError::Delta(DeltaError::Equivocation { seq: 3, .. }))
    ));
    let twice = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![
            events[3].clone(),
            Event {
                payload: (&b"y"[..]).into(),
                ..events[3].clone()
            },
        ],
        seals: Vec::new(),
    };
    assert!(matches!(
        b.apply(&twice),
        Err(ReplicaError::Delta(DeltaError::Equivocation { seq: 4, .. }))
    ));
}

#[test]
fn a_lamport_that_does_not_rise_with_seq_is_refused() {
    let mut a = replica(1);
    let events: Vec<Event> = (0..2u8).map(|i| a.append(vec![i]).unwrap()).collect();
    let mut b = replica(2);
    b.apply(&Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![events[0].clone()],
        seals: Vec::new(),
    })
    .unwrap();
    let bad = Event {
        lamport: events[0].lamport,
        ..events[1].clone()
    };
    let refused = b.apply(&Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![bad],
        seals: Vec::new(),
    });
    assert!(
        matches!(
            refused,
            Err(ReplicaError::Delta(DeltaError::LamportNotRising {
                seq: 2,
                neighbour_seq: 1,
                ..
            }))
        ),
        "{refused:?}"
    );
    assert_eq!(b.marks().get(StreamId::new(1)), 1);
}

#[test]
fn early_events_wait_hidden_and_overflow_is_dropped_then_refetched() {
    let mut a = replica(1);
    let events: Vec<Event> = (0..10u8).map(|i| a.append(vec![i]).unwrap()).collect();
    let mut config = Config::new(StreamId::new(2));
    config.pending_events_max = 3;
    let mut b = Replica::open(config, MemStore::default()).unwrap();
    // Seqs 3..=10 arrive, 1 and 2 are lost: nothing is visible with a hole.
    let report = b
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: events[2..].to_vec(),
            seals: Vec::new(),
        })
        .unwrap();
    assert_eq!((report.applied, report.pending, report.dropped), (0, 3, 5));
    assert!(b
        .page(&VersionVector::new(), 100)
        .unwrap()
        .events
        .is_empty());
    assert_eq!(b.marks().get(StreamId::new(1)), 0);
    // Seq 1 then 2 arrive: the buffer releases 3..=5; anti-entropy refetches
    // what overflowed.
    let report = b
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: vec![events[0].clone()],
            seals: Vec::new(),
        })
        .unwrap();
    assert_eq!(report.applied, 1);
    let report = b
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: vec![events[1].clone()],
            seals: Vec::new(),
        })
        .unwrap();
    assert_eq!(report.applied, 4);
    assert_eq!(b.pending_len(), 0);
    push(&a, &mut b, usize::MAX);
    assert_eq!(b.digest(), a.digest());
}

#[test]
fn applying_deltas_in_any_order_and_twice_gives_the_same_state() {
    let mut a = replica(1);
    let mut c = replica(3);
    for i in 0..6u8 {
        a.append(vec![i]).unwrap();
        c.append(vec![i]).unwrap();
    }
    let mut deltas = Vec::new();
    let mut marks = VersionVector::new();
    for source in [&a, &c] {
        let mut from = marks.clone();
        loop {
            let delta = source.delta_for(&from, 120);
            if delta.events.is_empty() {
                break;
            }
            for e in &delta.events {
                from.advance(e.stream, e.seq);
            }
            deltas.push(delta);
        }
        marks.join(&source.marks());
    }
    assert!(deltas.len() > 4, "small budgets split the log");
    let mut forward = replica(2);
    for d in &deltas {
        forward.apply(d).unwrap();
    }
    let mut backward = replica(2);
    for d in deltas.iter().rev().chain(deltas.iter()) {
        backward.apply(d).unwrap();
    }
    assert_eq!(forward.digest(), backward.digest());
    assert_eq!(forward.marks(), backward.marks());
    assert_eq!(forward.marks(), marks);
}

#[test]
fn a_page_longer_than_the_limit_is_refused() {
    let a = replica(1);
    let max = a.config().page_len_max;
    assert!(matches!(
        a.page(&VersionVector::new(), max + 1),
        Err(PageError::LimitTooLarge { limit, max: m }) if limit == max + 1 && m == max
    ));
}

#[test]
fn reopening_a_store_restores_head_floor_and_clock_and_never_reuses_a_seq() {
    let mut a = replica(1);
    let mut b = replica(2);
    for i in 0..5u8 {
        b.append(vec![i]).unwrap();
    }
    push(&b, &mut a, usize::MAX);
    for i in 0..5u8 {
        a.append(vec![i]).unwrap();
    }
    a.compact(&[(StreamId::new(1), 2)].into_iter().collect())
        .unwrap();
    let (marks, floor, clock, digest) = (a.marks(), a.floor(), a.clock(), a.digest());
    let config = a.config().clone();
    let mut reopened = Replica::open(config, a.into_store()).unwrap();
    assert_eq!(
        (
            reopened.marks(),
            reopened.floor(),
            reopened.clock(),
            reopened.digest()
        ),
        (marks.clone(), floor, clock, digest)
    );
    let next = reopened.append(&b"after"[..]).unwrap();
    assert_eq!(next.seq, marks.get(StreamId::new(1)) + 1);
    assert!(next.lamport > clock);
}

/// After a failed commit nothing of it is visible: the replica keeps
/// serving exactly what it committed before (pages, deltas, marks, digest)
/// and refuses changes, since the store's content is uncertain; reopening
/// recovers the durable state.
#[test]
fn a_failed_commit_leaves_the_readable_state_unchanged_and_refuses_changes() {
    use meshlog_replica::Store as _;
    let mut a = replica(1);
    for i in 0..3u8 {
        a.append(vec![i]).unwrap();
    }
    let config = Config::new(StreamId::new(2));
    let store = FlakyStore::default();
    let faults = store.faults();
    let mut b = Replica::open(config.clone(), store).unwrap();
    b.append(&b"durable"[..]).unwrap();
    let before = (b.marks(), b.floor(), b.digest(), b.clock());
    let walk_before = b.page(&VersionVector::new(), 100).unwrap();
    faults.fail_now();
    let delta = a.delta_for(&b.marks(), usize::MAX);
    assert!(matches!(b.apply(&delta), Err(ReplicaError::Store(_))));
    assert_eq!((b.marks(), b.floor(), b.digest(), b.clock()), before);
    assert_eq!(b.page(&VersionVector::new(), 100).unwrap(), walk_before);
    assert_eq!(
        b.delta_for(&VersionVector::new(), usize::MAX).events,
        walk_before.events
    );
    assert!(matches!(b.append(&b"x"[..]), Err(ReplicaError::Failed)));
    assert!(matches!(b.apply(&delta), Err(ReplicaError::Failed)));
    let store = b.into_store();
    faults.heal();
    assert_eq!(store.meta().unwrap().heads.get(StreamId::new(1)), 0);
    let b = Replica::open(config, store).unwrap();
    let page = b.page(&VersionVector::new(), 10).unwrap();
    assert_eq!(page.events.len(), 1, "only the durable event survives");
}

/// Neighbour checks inside one delta do not depend on the events' order:
/// seq 2 stamped below seq 1 is refused whichever comes first, and a repeat
/// of one name in the delta is only a duplicate if it is the same event.
#[test]
fn lamport_order_inside_one_delta_is_checked_in_any_order() {
    let stream = StreamId::new(9);
    let event = |seq: u64, lamport: u64| Event {
        stream,
        seq,
        lamport,
        time_ms: 0,
        payload: (&b"x"[..]).into(),
    };
    for events in [
        vec![event(2, 1), event(1, 5)],
        vec![event(1, 5), event(2, 1)],
        vec![event(2, 1), event(2, 1), event(1, 5)],
    ] {
        let mut b = replica(2);
        let delta = Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events,
            seals: Vec::new(),
        };
        let refused = b.apply(&delta);
        assert!(
            matches!(
                refused,
                Err(ReplicaError::Delta(DeltaError::LamportNotRising { .. }))
            ),
            "{refused:?}"
        );
        assert_eq!(b.digest(), replica(2).digest(), "nothing applied");
    }
    let mut b = replica(2);
    let twice = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![event(2, 6), event(1, 5), event(2, 6)],
        seals: Vec::new(),
    };
    assert_eq!(b.apply(&twice).unwrap().applied, 2);
}

/// A legacy reader's scalar position converts to the vector covering every
/// held event stamped at or below it; where compacted events' stamps are
/// gone and none held is at or below it, the stream starts at 0, so the
/// page reports the compacted range instead of skipping it.
#[test]
fn a_scalar_position_converts_to_a_cursor_that_never_skips_silently() {
    let mut a = replica(1);
    let mut b = replica(2);
    for i in 0..4u8 {
        a.append(vec![i]).unwrap(); // lamports 1..=4
    }
    for i in 0..4u8 {
        b.append(vec![i]).unwrap(); // lamports 1..=4
    }
    push(&b, &mut a, usize::MAX);
    let position = 2;
    let cursor = a.covering_lamport(position);
    assert_eq!(cursor.get(StreamId::new(1)), 2);
    assert_eq!(cursor.get(StreamId::new(2)), 2);
    let page = a.page(&cursor, 100).unwrap();
    assert!(page.events.iter().all(|event| event.lamport > position));
    assert_eq!(page.events.len(), 4);

    // Compact stream 2 past the position: its held events are all above it
    // and the stamps of the compacted ones are gone.
    a.compact(&[(StreamId::new(2), 3)].into_iter().collect())
        .unwrap();
    let cursor = a.covering_lamport(position);
    assert_eq!(cursor.get(StreamId::new(2)), 0);
    match a.page(&cursor, 100) {
        Err(PageError::Stale(stale)) => {
            assert_eq!(stale.lost()[0].seqs(), 1..=3);
            assert_eq!(stale.resume().get(StreamId::new(2)), 3);
        }
        other => panic!("expected a stale report, got {other:?}"),
    }
    // Where held events at or below the position remain, the compacted
    // ones below them were stamped lower: covered, not reported.
    a.compact(&[(StreamId::new(1), 1)].into_iter().collect())
        .unwrap();
    assert_eq!(a.covering_lamport(position).get(StreamId::new(1)), 2);
}
