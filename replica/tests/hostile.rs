//! What a stranger's values can do to a replica: floors and events claiming
//! the receiver's own stream, floors and cursors at the edges of `u64`.
//!
//! Three named regressions from a review (each failed on the code before
//! the shared-handle work: two panicked on overflow, one deleted the
//! receiver's own events), the rule that only a writer writes its stream
//! (and the explicit recovery mode that relearns it), and a seeded property
//! over random hostile deltas and cursors: no call panics, a refused delta
//! changes nothing, and no event the replica wrote itself is ever removed.
//!
//! Seeded: `MESHLOG_SEED=<n>` replays a failing run; `MESHLOG_QC_TESTS=<n>`
//! runs more cases than the default.

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Config, Delta, DeltaError, Event, MemStore, Replica, ReplicaError};
use meshlog_testkit::seed::{self, with_seed};
use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};

const OWN: StreamId = StreamId::new(1);
const PEER: StreamId = StreamId::new(2);

fn event(stream: StreamId, seq: u64, lamport: u64) -> Event {
    Event {
        stream,
        seq,
        lamport,
        time_ms: 0,
        payload: format!("{stream}/{seq}").into_bytes().into(),
    }
}

fn vector(entries: &[(StreamId, u64)]) -> VersionVector {
    entries.iter().copied().collect()
}

/// A replica that wrote `own` events and holds `peer` events of PEER.
fn replica_with(own: u64, peer: u64) -> Replica {
    let mut replica = Replica::new(OWN);
    for i in 0..own {
        replica.append_at(format!("own {i}"), 0).unwrap();
    }
    let events = (1..=peer).map(|seq| event(PEER, seq, 1000 + seq)).collect();
    replica
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events,
            seals: Vec::new(),
        })
        .unwrap();
    replica
}

fn snapshot(replica: &Replica) -> (VersionVector, VersionVector, meshlog_replica::Digest, u64) {
    (
        replica.marks(),
        replica.floor(),
        replica.digest(),
        replica.clock(),
    )
}

/// Review regression: `validate` never looked at `delta.floor`, so a peer
/// could send a floor for the receiver's own stream above its head, and
/// applying it deleted the receiver's events and moved its head (its next
/// append then skipped seqs). It was then refused (`OwnFloorAboveHead`),
/// which ended every sync session with that peer for good (issue 29): now
/// a peer's floor on our own stream is ignored, whatever its value.
#[test]
fn a_peer_floor_above_our_own_head_is_ignored_and_deletes_nothing() {
    let mut replica = replica_with(5, 0);
    let before = snapshot(&replica);
    let hostile = Delta {
        floor_proofs: Default::default(),
        floor: vector(&[(OWN, 10)]),
        events: Vec::new(),
        seals: Vec::new(),
    };
    let report = replica.apply(&hostile).unwrap();
    assert_eq!(report, meshlog_replica::ApplyReport::default());
    assert_eq!(snapshot(&replica), before);
    assert_eq!(replica.append_at("next", 0).unwrap().seq, 6);
}

/// A floor a peer sends for our own stream at or below our head is not its
/// to apply either: it is ignored, and our events stay.
#[test]
fn a_peer_floor_on_our_own_stream_below_our_head_compacts_nothing() {
    let mut replica = replica_with(5, 0);
    let before = snapshot(&replica);
    replica
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: vector(&[(OWN, 3)]),
            events: Vec::new(),
            seals: Vec::new(),
        })
        .unwrap();
    assert_eq!(snapshot(&replica), before);
    assert!(replica.get(OWN, 1).is_some());
}

/// Review regression: a floor of `u64::MAX` overflowed `head + 1` when the
/// pending buffer was released (a debug-build panic, a wrap in release).
/// Such a floor is now refused (`FloorTooLarge`, below). The largest floor
/// accepted, `LAMPORT_MAX`, is taken as that peer's word on a stream the
/// receiver holds nothing of (it records the range as lost and releases
/// the buffer without overflow); on a stream it holds events of, it erases
/// nothing (the stream is reported behind that peer's floor); on our own
/// stream it is ignored.
#[test]
fn a_peer_floor_of_u64_max_does_not_overflow() {
    const THIRD: StreamId = StreamId::new(3);
    let top = meshlog_replica::LAMPORT_MAX;
    let mut replica = replica_with(3, 4);
    // An early event of THIRD, of which nothing is held, waits in the
    // pending buffer.
    replica
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: vec![event(THIRD, 9, 2000)],
            seals: Vec::new(),
        })
        .unwrap();
    assert_eq!(replica.pending_len(), 1);
    assert!(replica
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: vector(&[(THIRD, u64::MAX)]),
            events: Vec::new(),
            seals: Vec::new(),
        })
        .is_err());
    assert_eq!(replica.pending_len(), 1);
    let report = replica
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: vector(&[(PEER, top), (THIRD, top)]),
            events: Vec::new(),
            seals: Vec::new(),
        })
        .unwrap();
    assert_eq!(report.floors_raised, 1);
    assert_eq!(report.behind_floor, [(PEER, top)]);
    assert_eq!(replica.marks().get(THIRD), top);
    assert_eq!(replica.floor().get(THIRD), top);
    assert_eq!(replica.pending_len(), 0);
    // PEER's events stay; our own stream is untouched.
    assert_eq!(replica.marks().get(PEER), 4);
    assert_eq!(replica.floor().get(PEER), 0);
    assert_eq!(replica.marks().get(OWN), 3);
    let page = replica.page(&VersionVector::new(), 100);
    assert!(page.is_err(), "a cursor at 0 on THIRD is below its floor");
    let resumed = replica.page(&vector(&[(THIRD, top)]), 100).unwrap();
    assert_eq!(resumed.events.len(), 7);

    let before = snapshot(&replica);
    let hostile = Delta {
        floor_proofs: Default::default(),
        floor: vector(&[(OWN, u64::MAX)]),
        events: Vec::new(),
        seals: Vec::new(),
    };
    assert!(replica.apply(&hostile).is_err());
    assert_eq!(snapshot(&replica), before);
    let hostile = Delta {
        floor_proofs: Default::default(),
        floor: vector(&[(OWN, top)]),
        events: Vec::new(),
        seals: Vec::new(),
    };
    replica.apply(&hostile).unwrap();
    assert_eq!(snapshot(&replica), before);
}

/// Review regression: the walk computed `covered + 1` for a cursor at
/// `u64::MAX` on a held stream, which overflowed (such a cursor is one text
/// token away). A cursor at the top covers everything of its stream.
#[test]
fn a_cursor_at_u64_max_on_a_held_stream_does_not_overflow() {
    let replica = replica_with(3, 4);
    for cursor in [
        vector(&[(OWN, u64::MAX)]),
        vector(&[(PEER, u64::MAX)]),
        vector(&[(OWN, u64::MAX), (PEER, u64::MAX)]),
        vector(&[(OWN, u64::MAX - 1), (PEER, 2)]),
    ] {
        let page = replica.page(&cursor, 100).unwrap();
        assert!(page.at_head);
        assert!(page
            .events
            .iter()
            .all(|event| event.seq > cursor.get(event.stream)));
        assert!(page.next.dominates(&cursor));
        let delta = replica.delta_for(&cursor, usize::MAX);
        assert!(delta
            .events
            .iter()
            .all(|event| event.seq > cursor.get(event.stream)));
    }
}

/// Found by the property below: a peer's event stamped near `u64::MAX`
/// pushed the receiver's clock there, and its own appends then failed with
/// `ClockExhausted` forever. Stamps above `LAMPORT_MAX` are refused.
#[test]
fn a_peer_stamp_near_u64_max_cannot_exhaust_our_clock() {
    let mut replica = replica_with(1, 0);
    let before = snapshot(&replica);
    let hostile = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![event(PEER, 1, u64::MAX - 2)],
        seals: Vec::new(),
    };
    assert!(matches!(
        replica.apply(&hostile),
        Err(ReplicaError::Delta(DeltaError::LamportTooLarge { .. }))
    ));
    assert_eq!(snapshot(&replica), before);
    let at_the_cap = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![event(PEER, 1, meshlog_replica::LAMPORT_MAX)],
        seals: Vec::new(),
    };
    replica.apply(&at_the_cap).unwrap();
    for _ in 0..3 {
        replica.append_at("still writing", 0).unwrap();
    }
}

/// Noted in the node's closing notes: a floor of `u64::MAX` from a peer for
/// another writer's stream made the receiver drop that stream and ignore
/// every later event of it. No stream can reach a seq above `LAMPORT_MAX`
/// (lamports rise with seq), so such a floor is refused whole.
#[test]
fn a_floor_no_stream_can_reach_is_refused_and_changes_nothing() {
    let mut replica = replica_with(2, 3);
    let before = snapshot(&replica);
    for floor in [u64::MAX, meshlog_replica::LAMPORT_MAX + 1] {
        let hostile = Delta {
            floor_proofs: Default::default(),
            floor: vector(&[(PEER, floor)]),
            events: Vec::new(),
            seals: Vec::new(),
        };
        assert!(matches!(
            replica.apply(&hostile),
            Err(ReplicaError::Delta(DeltaError::FloorTooLarge { .. }))
        ));
        assert_eq!(snapshot(&replica), before);
    }
    // At the bound it is a legal (if odd) compaction claim: this replica
    // holds PEER's events, so it keeps them and is behind that floor.
    let at_the_cap = Delta {
        floor_proofs: Default::default(),
        floor: vector(&[(PEER, meshlog_replica::LAMPORT_MAX)]),
        events: Vec::new(),
        seals: Vec::new(),
    };
    let report = replica.apply(&at_the_cap).unwrap();
    assert_eq!(report.behind_floor, [(PEER, meshlog_replica::LAMPORT_MAX)]);
    assert_eq!(snapshot(&replica), before);
}

/// Only a writer writes its stream: a delta carrying the receiver's own
/// stream beyond its head is refused whole (before, it was applied and the
/// writer's next append continued after the forged events).
#[test]
fn a_delta_writing_our_own_stream_beyond_its_head_is_refused() {
    let mut replica = replica_with(2, 0);
    let before = snapshot(&replica);
    let forged = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![event(PEER, 1, 5), event(OWN, 3, 50), event(OWN, 4, 51)],
        seals: Vec::new(),
    };
    let refused = replica.apply(&forged);
    assert!(
        matches!(
            refused,
            Err(ReplicaError::Delta(DeltaError::OwnStreamAhead {
                seq: 3,
                head: 2,
                ..
            }))
        ),
        "{refused:?}"
    );
    assert_eq!(snapshot(&replica), before);
    assert_eq!(replica.append_at("mine", 0).unwrap().seq, 3);
    // Our own events echoed back by a peer are duplicates, not a threat.
    let echo = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![replica.get(OWN, 1).unwrap()],
        seals: Vec::new(),
    };
    assert_eq!(replica.apply(&echo).unwrap().duplicates, 1);
    // An echo that differs is an equivocation.
    let mut altered = replica.get(OWN, 2).unwrap();
    altered.payload = "not what I wrote".into();
    let altered = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![altered],
        seals: Vec::new(),
    };
    assert!(matches!(
        replica.apply(&altered),
        Err(ReplicaError::Delta(DeltaError::Equivocation { seq: 2, .. }))
    ));
}

/// A writer that lost its store reopens under its old stream id in
/// recovery mode: it accepts its own stream from peers, appends nothing
/// until recovery ends, and then continues after the head it relearned —
/// never reusing a seq it had already written.
#[test]
fn a_writer_that_lost_its_store_relearns_its_stream_before_appending() {
    // Its previous life wrote 4 events, which a peer holds, compacted to 1.
    let mut previous = replica_with(4, 0);
    let mut peer = Replica::new(PEER);
    peer.apply(&previous.delta_for(&VersionVector::new(), usize::MAX))
        .unwrap();
    peer.compact(&vector(&[(OWN, 1)])).unwrap();
    previous.append_at("lost with the store", 0).unwrap();

    let mut config = Config::new(OWN);
    config.recover_own_stream = true;
    let mut reborn = Replica::open(config, MemStore::default()).unwrap();
    assert!(reborn.is_recovering());
    assert!(matches!(
        reborn.append_at("too early", 0),
        Err(ReplicaError::Recovering { head: 0, .. })
    ));
    reborn
        .apply(&peer.delta_for(&reborn.marks(), usize::MAX))
        .unwrap();
    assert_eq!(reborn.marks().get(OWN), 4);
    assert_eq!(reborn.floor().get(OWN), 1);
    reborn.end_recovery();
    assert!(!reborn.is_recovering());
    let next = reborn.append_at("after recovery", 0).unwrap();
    assert_eq!(next.seq, 5);
    assert!(next.lamport > peer.get(OWN, 4).unwrap().lamport);
    // And from now on the stream is its own again.
    let forged = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![event(OWN, 6, 10_000)],
        seals: Vec::new(),
    };
    assert!(reborn.apply(&forged).is_err());
}

/// A hostile step against the replica under test.
#[derive(Clone, Debug)]
enum Hostile {
    /// A delta: floors and events, each with edge values.
    Delta {
        floors: Vec<(u8, Edge)>,
        events: Vec<(u8, Edge, Edge)>,
    },
    /// A page with an edge cursor.
    Page { cursor: Vec<(u8, Edge)>, limit: u16 },
    /// A local append (so the own stream keeps growing).
    Append,
    /// A local compaction of another stream.
    Compact { stream: u8, floor: Edge },
}

/// A `u64` drawn near the edges: 0, 1, small, near the replica's heads,
/// near `u64::MAX`.
#[derive(Clone, Copy, Debug)]
struct Edge(u64);

impl Arbitrary for Edge {
    fn arbitrary(g: &mut Gen) -> Self {
        let small = u64::from(u8::arbitrary(g) % 12);
        Edge(match u8::arbitrary(g) % 6 {
            0 => 0,
            1 => 1,
            2 | 3 => small,
            4 => u64::MAX - small,
            _ => u64::arbitrary(g),
        })
    }
}

/// Streams 0..4: 0 is the replica's own.
fn stream(index: u8) -> StreamId {
    StreamId::new(1 + u64::from(index % 4))
}

impl Arbitrary for Hostile {
    fn arbitrary(g: &mut Gen) -> Self {
        match u8::arbitrary(g) % 7 {
            0..=2 => Hostile::Delta {
                floors: (0..u8::arbitrary(g) % 3)
                    .map(|_| (u8::arbitrary(g), Edge::arbitrary(g)))
                    .collect(),
                events: (0..u8::arbitrary(g) % 5)
                    .map(|_| (u8::arbitrary(g), Edge::arbitrary(g), Edge::arbitrary(g)))
                    .collect(),
            },
            3 | 4 => Hostile::Page {
                cursor: (0..u8::arbitrary(g) % 4)
                    .map(|_| (u8::arbitrary(g), Edge::arbitrary(g)))
                    .collect(),
                limit: u16::arbitrary(g) % 50,
            },
            5 => Hostile::Append,
            _ => Hostile::Compact {
                stream: 1 + u8::arbitrary(g) % 3,
                floor: Edge::arbitrary(g),
            },
        }
    }
}

/// Runs the steps; fails if a call panics, a refused delta changed
/// anything, or an event the replica wrote itself went missing.
fn hostile_steps_never_remove_our_own_events(steps: Vec<Hostile>) -> TestResult {
    let mut replica = Replica::new(OWN);
    let mut written: Vec<Event> = Vec::new();
    for step in steps {
        match step {
            Hostile::Append => match replica.append_at("own", 7) {
                Ok(event) => written.push(event),
                Err(error) => return TestResult::error(format!("append failed: {error}")),
            },
            Hostile::Delta { floors, events } => {
                let delta = Delta {
                    floor_proofs: Default::default(),
                    floor: floors
                        .iter()
                        .map(|&(s, Edge(seq))| (stream(s), seq))
                        .filter(|&(_, seq)| seq > 0)
                        .collect(),
                    events: events
                        .iter()
                        .map(|&(s, Edge(seq), Edge(lamport))| event(stream(s), seq, lamport))
                        .collect(),
                    seals: Vec::new(),
                };
                let before = snapshot(&replica);
                let pending = replica.pending_len();
                if replica.apply(&delta).is_err()
                    && (snapshot(&replica) != before || replica.pending_len() != pending)
                {
                    return TestResult::error(format!("a refused delta changed state: {delta:?}"));
                }
            }
            Hostile::Page { cursor, limit } => {
                let cursor: VersionVector = cursor
                    .iter()
                    .map(|&(s, Edge(seq))| (stream(s), seq))
                    .filter(|&(_, seq)| seq > 0)
                    .collect();
                if let Ok(page) = replica.page(&cursor, usize::from(limit)) {
                    if !page.next.dominates(&cursor) || page.events.len() > usize::from(limit) {
                        return TestResult::error(format!("bad page for {cursor:?}"));
                    }
                }
                let _ = replica.delta_for(&cursor, 1 << 12);
            }
            Hostile::Compact {
                stream: s,
                floor: Edge(seq),
            } => {
                let target = vector(&[(stream(s), seq.max(1))]);
                if let Err(error) = replica.compact(&target) {
                    return TestResult::error(format!("compaction failed: {error}"));
                }
            }
        }
        if replica.marks().get(OWN) != written.len() as u64 || replica.floor().get(OWN) != 0 {
            return TestResult::error("our own stream's head or floor moved".to_string());
        }
        for event in &written {
            if replica.get(OWN, event.seq).as_ref() != Some(event) {
                return TestResult::error(format!("our own seq {} is gone", event.seq));
            }
        }
    }
    TestResult::passed()
}

#[test]
fn hostile_floors_events_and_cursors_never_panic_nor_remove_our_own_events() {
    let tests = std::env::var("MESHLOG_QC_TESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    with_seed("hostile", seed::fresh(), |seed| {
        QuickCheck::new()
            .rng(Gen::from_size_and_seed(40, seed))
            .tests(tests)
            .quickcheck(
                hostile_steps_never_remove_our_own_events as fn(Vec<Hostile>) -> TestResult,
            );
    });
}
