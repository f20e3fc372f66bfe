//! Floors without authority (issue 29, `docs/SIGNING.md` "Floors with an
//! authority"): a floor a peer sends says only what that peer no longer
//! holds. It never drops an event the receiver holds, never touches the
//! receiver's own stream, is recorded (the range lost) only where the
//! receiver holds nothing of the stream above its own floor, and where the
//! receiver holds events below it, they stay and the stream is reported
//! behind that peer's floor.
//!
//! Found by an independent suite over a real session: a peer's floor at
//! `LAMPORT_MAX`, or at a third writer's head + 5, erased that writer's
//! stream at the receiver, and a floor above the receiver's own head ended
//! every session with `OwnFloorAboveHead`, so that writer and receiver never
//! synced again. The named tests replay those floors against a snapshot;
//! the seeded property interleaves a hostile peer's deltas (floors at 0, 1,
//! head - 1, head, head + 1, `LAMPORT_MAX`, random) with honest writers'
//! deltas and checks that no held event ever disappears but by the
//! receiver's own compaction, and that every honest event delivered
//! arrives.
//!
//! Seeded: `MESHLOG_SEED=<n>` replays a failing run.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::push;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{ApplyReport, Delta, Digest, Event, PageError, Replica, LAMPORT_MAX};
use meshlog_testkit::seed;
use meshlog_testkit::SplitMix64;

const RECEIVER: StreamId = StreamId::new(1);
const WRITER: StreamId = StreamId::new(2);
const HOSTILE: StreamId = StreamId::new(3);

/// Everything a floor could have erased: marks, floor, digest, clock and
/// every held event.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    marks: VersionVector,
    floor: VersionVector,
    digest: Digest,
    clock: u64,
    events: Vec<Event>,
}

fn snapshot(replica: &Replica) -> Snapshot {
    let mut events = Vec::new();
    for (stream, head) in replica.marks().iter() {
        for seq in replica.floor().get(stream) + 1..=head {
            events.push(replica.get(stream, seq).expect("held"));
        }
    }
    Snapshot {
        marks: replica.marks(),
        floor: replica.floor(),
        digest: replica.digest(),
        clock: replica.clock(),
        events,
    }
}

fn floor(stream: StreamId, seq: u64) -> Delta {
    Delta {
        floor_proofs: Default::default(),
        floor: [(stream, seq)].into_iter().collect(),
        events: Vec::new(),
        seals: Vec::new(),
    }
}

/// A receiver that wrote 5 events and holds a writer's 10.
fn receiver_and_writer() -> (Replica, Replica) {
    let mut receiver = Replica::new(RECEIVER);
    let mut writer = Replica::new(WRITER);
    for i in 0..5u8 {
        receiver.append_at(vec![i], 0).unwrap();
    }
    for i in 0..10u8 {
        writer.append_at(vec![i], 0).unwrap();
    }
    push(&writer, &mut receiver, usize::MAX);
    push(&receiver, &mut writer, usize::MAX);
    (receiver, writer)
}

/// After a hostile floor: the writer's later events reach the receiver,
/// the receiver's reach the writer, and both hold the same.
fn still_syncs_both_ways(receiver: &mut Replica, writer: &mut Replica) {
    writer.append_at("after the hostile floor", 0).unwrap();
    receiver.append_at("the receiver still writes", 0).unwrap();
    let to_receiver = writer.delta_for(&receiver.marks(), usize::MAX);
    let report = receiver.apply(&to_receiver).unwrap();
    assert!(report.applied >= 1, "{report:?}");
    let to_writer = receiver.delta_for(&writer.marks(), usize::MAX);
    assert!(writer.apply(&to_writer).unwrap().applied >= 1);
    assert_eq!(receiver.marks(), writer.marks());
    assert_eq!(receiver.digest(), writer.digest());
}

/// Issue 29: a peer's floor at the largest accepted on a writer's stream
/// the receiver holds erased it (and every later event of it was ignored
/// as below the floor).
#[test]
fn a_hostile_floor_at_lamport_max_on_a_held_stream_erases_nothing() {
    let (mut receiver, mut writer) = receiver_and_writer();
    let before = snapshot(&receiver);
    let report = receiver.apply(&floor(WRITER, LAMPORT_MAX)).unwrap();
    assert_eq!(snapshot(&receiver), before);
    assert_eq!(
        report,
        ApplyReport {
            behind_floor: vec![(WRITER, LAMPORT_MAX)],
            ..ApplyReport::default()
        }
    );
    still_syncs_both_ways(&mut receiver, &mut writer);
}

/// Issue 29: a peer's floor at a third writer's head + 5 erased the
/// receiver's copy of it; with events above the floor, none are taken.
#[test]
fn a_hostile_floor_past_a_writers_head_erases_nothing() {
    let (mut receiver, mut writer) = receiver_and_writer();
    let before = snapshot(&receiver);
    let invented = Event {
        stream: WRITER,
        seq: 16,
        lamport: 1_000,
        time_ms: 0,
        payload: "invented above the floor".into(),
    };
    let hostile = Delta {
        floor_proofs: Default::default(),
        floor: [(WRITER, 15)].into_iter().collect(),
        events: vec![invented],
        seals: Vec::new(),
    };
    let report = receiver.apply(&hostile).unwrap();
    assert_eq!(snapshot(&receiver), before);
    assert_eq!(report.behind_floor, [(WRITER, 15)]);
    assert_eq!((report.behind_events, report.pending), (1, 0));
    assert_eq!(receiver.pending_len(), 0);
    still_syncs_both_ways(&mut receiver, &mut writer);
}

/// Issue 29: a peer's floor above the receiver's own head was refused
/// (`OwnFloorAboveHead`), which ended every sync session with that peer.
/// It is ignored, as any peer's floor on the receiver's own stream.
#[test]
fn a_hostile_floor_past_our_own_head_is_ignored() {
    let (mut receiver, mut writer) = receiver_and_writer();
    let before = snapshot(&receiver);
    for seq in [5 + 9, 3, LAMPORT_MAX] {
        let report = receiver.apply(&floor(RECEIVER, seq)).unwrap();
        assert_eq!(report, ApplyReport::default());
        assert_eq!(snapshot(&receiver), before);
    }
    assert_eq!(receiver.append_at("next", 0).unwrap().seq, 6);
    still_syncs_both_ways(&mut receiver, &mut writer);
}

/// A newcomer (holding nothing of the stream) takes a peer's floor: the
/// range is recorded as lost, and a reader's stale report names exactly
/// it, on the newcomer as on the peer.
#[test]
fn a_newcomer_takes_a_peers_floor_and_reports_exactly_what_was_lost() {
    let (_, mut writer) = receiver_and_writer();
    writer
        .compact(&[(WRITER, 7)].into_iter().collect())
        .unwrap();
    let mut newcomer = Replica::new(StreamId::new(9));
    let report = newcomer
        .apply(&writer.delta_for(&newcomer.marks(), usize::MAX))
        .unwrap();
    // Seqs 8..=10 of the writer, and the receiver's 5 the writer holds.
    assert_eq!((report.floors_raised, report.applied), (1, 3 + 5));
    assert!(report.behind_floor.is_empty());
    assert_eq!(newcomer.floor().get(WRITER), 7);
    let cursor: VersionVector = [(WRITER, 2)].into_iter().collect();
    for replica in [&writer, &newcomer] {
        match replica.page(&cursor, 10) {
            Err(PageError::Stale(stale)) => {
                assert_eq!(stale.lost().len(), 1);
                assert_eq!(stale.lost()[0].stream, WRITER);
                assert_eq!(stale.lost()[0].seqs(), 3..=7);
            }
            other => panic!("expected stale, got {other:?}"),
        }
    }
}

/// A hostile floor drawn near the receiver's head of `stream`.
fn hostile_floor(rng: &mut SplitMix64, head: u64) -> u64 {
    let floor = match rng.below(7) {
        0 => 0,
        1 => 1,
        2 => head.saturating_sub(1),
        3 => head,
        4 => head + 1,
        5 => LAMPORT_MAX - rng.below(2),
        _ => rng.below(head + 20),
    };
    floor.min(LAMPORT_MAX)
}

/// The property: a receiver fed honest writers' deltas (in any order,
/// some lost, some twice) and a hostile peer's (floors at the edges on
/// every stream, the receiver's own included, with honest events of other
/// streams), compacting now and then itself. After every step, no event it
/// held is gone unless its own compaction dropped it; at the end, every
/// honest event it was delivered is held, or below its own compaction,
/// and every honest writer has fully arrived unless a hostile floor was
/// raised on its stream where the receiver held nothing of it (the one
/// thing an unsigned floor still does: until floors carry the writer's
/// seal, `docs/SIGNING.md`).
#[test]
fn hostile_floors_never_erase_held_events_and_honest_events_arrive() {
    let base = seed::replay_or(0xf100_5eed);
    seed::for_each_seed("hostile_floors", base, 300, |seed| {
        let mut rng = SplitMix64::new(seed);
        let writers_len = 1 + rng.below(3);
        let mut writers: Vec<Replica> = (0..writers_len)
            .map(|i| Replica::new(StreamId::new(10 + i)))
            .collect();
        let mut receiver = Replica::new(RECEIVER);
        // Every event the receiver held, and the seq at or below which
        // its own compactions dropped each stream.
        let mut ever_held: BTreeMap<(StreamId, u64), Event> = BTreeMap::new();
        let mut compacted = VersionVector::new();
        let mut in_flight: Vec<Delta> = Vec::new();
        let mut delivered: BTreeMap<(StreamId, u64), Event> = BTreeMap::new();
        // Streams whose floor a hostile floor raised (held nothing above
        // the receiver's floor): until floors carry the writer's seal, the
        // stream's events at or below it are ignored here.
        let mut raised_by_peer: BTreeSet<StreamId> = BTreeSet::new();
        for step in 0..60 {
            let at = format!("seed {seed}, step {step}");
            match rng.below(10) {
                0..=2 => {
                    let w = rng.below(writers.len() as u64) as usize;
                    writers[w].append_at(format!("w{w} s{step}"), 0).unwrap();
                    let since: VersionVector = writers[w]
                        .marks()
                        .iter()
                        .map(|(s, head)| (s, rng.below(head + 1)))
                        .collect();
                    in_flight.push(writers[w].delta_for(&since, usize::MAX));
                }
                3 | 4 if !in_flight.is_empty() => {
                    let i = rng.below(in_flight.len() as u64) as usize;
                    let delta = match rng.chance(0.2) {
                        true => in_flight[i].clone(),
                        false => in_flight.swap_remove(i),
                    };
                    delivered.extend(delta.events.iter().map(|e| ((e.stream, e.seq), e.clone())));
                    receiver.apply(&delta).unwrap();
                }
                5 if !in_flight.is_empty() => {
                    let i = rng.below(in_flight.len() as u64) as usize;
                    in_flight.swap_remove(i);
                }
                6 => {
                    let mut target = VersionVector::new();
                    for (stream, head) in receiver.marks().iter() {
                        if rng.chance(0.3) {
                            target.advance(stream, rng.below(head + 1));
                        }
                    }
                    for (stream, seq) in target.iter() {
                        compacted.advance(stream, seq.min(receiver.marks().get(stream)));
                    }
                    receiver.compact(&target).unwrap();
                }
                7 => {
                    receiver.append_at(format!("own s{step}"), 0).unwrap();
                }
                _ => {
                    // The hostile peer: floors on every stream it picks,
                    // with a slice of an honest writer's events.
                    let mut streams: Vec<StreamId> = writers.iter().map(Replica::stream).collect();
                    streams.extend([RECEIVER, HOSTILE]);
                    let mut hostile = Delta::default();
                    for stream in streams {
                        if rng.chance(0.5) {
                            let head = receiver.marks().get(stream);
                            hostile.floor.advance(stream, hostile_floor(&mut rng, head));
                        }
                    }
                    let w = rng.below(writers.len() as u64) as usize;
                    let since = receiver.marks();
                    hostile.events = writers[w].delta_for(&since, 1 << 10).events;
                    let before = snapshot(&receiver);
                    let report = receiver.apply(&hostile).unwrap();
                    for (stream, floor) in receiver.floor().iter() {
                        if floor > before.floor.get(stream) {
                            raised_by_peer.insert(stream);
                        }
                    }
                    for (stream, head) in before.marks.iter() {
                        if head > before.floor.get(stream) {
                            let floor = receiver.floor().get(stream);
                            assert_eq!(floor, before.floor.get(stream), "{at}: {report:?}");
                        }
                    }
                    for &(stream, _) in &report.behind_floor {
                        assert!(before.marks.get(stream) > before.floor.get(stream), "{at}");
                    }
                }
            }
            for (stream, head) in receiver.marks().iter() {
                for seq in receiver.floor().get(stream) + 1..=head {
                    let event = receiver.get(stream, seq).expect("held");
                    ever_held.entry((stream, seq)).or_insert(event);
                }
            }
            for (&(stream, seq), event) in &ever_held {
                if seq > compacted.get(stream) {
                    assert_eq!(
                        receiver.get(stream, seq).as_ref(),
                        Some(event),
                        "{at}: {stream}:{seq} held once is gone"
                    );
                }
            }
        }
        // Every honest delta still in flight is delivered, and each writer
        // catches the receiver up: every honest event delivered is held,
        // unless the receiver compacted past it.
        for delta in in_flight.drain(..) {
            delivered.extend(delta.events.iter().map(|e| ((e.stream, e.seq), e.clone())));
            receiver.apply(&delta).unwrap();
        }
        for writer in &writers {
            push(writer, &mut receiver, usize::MAX);
        }
        for (&(stream, seq), event) in &delivered {
            let below_floor = seq <= receiver.floor().get(stream);
            if !below_floor {
                assert_eq!(
                    receiver.get(stream, seq).as_ref(),
                    Some(event),
                    "seed {seed}: delivered {stream}:{seq} missing"
                );
            }
            if below_floor && stream != RECEIVER {
                // Only a floor the receiver could take: its own
                // compaction, or one raised where it held nothing.
                assert!(
                    seq <= compacted.get(stream) || !ever_held.contains_key(&(stream, seq)),
                    "seed {seed}: {stream}:{seq} below a floor after it was held"
                );
            }
        }
        for writer in &writers {
            let stream = writer.stream();
            if !raised_by_peer.contains(&stream) {
                assert_eq!(
                    receiver.marks().get(stream),
                    writer.marks().get(stream),
                    "seed {seed}: writer {stream} did not fully arrive"
                );
            }
        }
    });
}
