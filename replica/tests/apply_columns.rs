//! A delta applied in columns (`Replica::apply_columns`,
//! `SharedReplica::apply_columns`) leaves exactly what the same delta
//! applied as events leaves: the same outcome (report, or refusal and its
//! error), marks, floor, clock, digest, pending buffer, counters and
//! pages, whether its runs are held as columns (a clean delta) or go the
//! event path, on a store with a view (`MemStore`), on one without (the
//! replica keeps its own copy), on one that reads the batch as events, and
//! on disk.
//! Seeded: `MESHLOG_SEED` replays a run.

use std::convert::Infallible;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Batch, Config, Delta, DeltaColumns, DiskStore, Event, MemStore, Replica, SharedReplica, Store,
    StoreMeta, Values,
};
use meshlog_testkit::{seed, SplitMix64};

/// The replicas' own stream: deltas claim it too.
const OWN: u64 = 1;

/// A `MemStore` as another store may be: `view: false`, it offers no view
/// (the replica keeps its own copy of the events); `by_events: true`, it
/// reads a batch as events, as a store outside this crate does.
#[derive(Default)]
struct Wrapped<const VIEW: bool, const BY_EVENTS: bool>(MemStore);

type NoView = Wrapped<false, false>;
type ByEvents = Wrapped<true, true>;

impl<const VIEW: bool, const BY_EVENTS: bool> Store for Wrapped<VIEW, BY_EVENTS> {
    type Error = Infallible;

    fn meta(&self) -> Result<StoreMeta, Infallible> {
        self.0.meta()
    }

    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), Infallible> {
        self.0.read_stream(stream, after_seq, limit, out)
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), Infallible> {
        if !BY_EVENTS {
            return self.0.commit(batch);
        }
        let runs: usize = batch.runs().map(<[Event]>::len).sum();
        assert_eq!(runs, batch.event_count(), "runs and count agree");
        let events: Vec<Event> = batch.events().cloned().collect();
        let copy = Batch::from_events(events)
            .with_floors(batch.floors.clone())
            .with_clock(batch.clock);
        assert_eq!(&copy, batch, "a batch equals the batch of its events");
        self.0.commit(&copy)
    }

    fn view(&self) -> Option<meshlog_replica::StoreView> {
        if VIEW {
            self.0.view()
        } else {
            None
        }
    }
}

/// A delta a peer may send: mostly a clean one (runs from each stream's
/// head + 1, stamps rising, across chunk boundaries now and then), else
/// one with a flaw a receiver must catch or sort out: a gap, a repeat, a
/// stamp that does not rise, a claim on the receiver's own stream, a
/// floor, two runs of a stream, streams out of order.
fn delta(rng: &mut SplitMix64, marks: &VersionVector, clock: u64) -> Delta {
    let mut events = Vec::new();
    let mut streams: Vec<u64> = (2..=5).filter(|_| rng.chance(0.5)).collect();
    if streams.is_empty() {
        streams.push(rng.between(2, 6));
    }
    // Now and then a claim on the receiver's own stream.
    if rng.chance(0.05) {
        streams.insert(0, OWN);
    }
    let flawed = rng.chance(0.3);
    for &id in &streams {
        let stream = StreamId::new(id);
        let mut seq = marks.get(stream) + 1;
        if flawed && rng.chance(0.3) {
            seq = (seq + rng.below(4)).saturating_sub(2).max(1);
        }
        let len = if rng.chance(0.1) {
            rng.between(200, 700)
        } else {
            rng.between(1, 20)
        };
        // Flawed: perhaps stamped at or below what the stream holds.
        let mut lamport = if flawed && rng.chance(0.3) {
            rng.below(clock + 1)
        } else {
            clock + rng.between(1, 5)
        };
        for _ in 0..len {
            let payload_len = rng.below(40) as usize;
            events.push(Event {
                stream,
                seq,
                lamport,
                time_ms: rng.below(3) * (1 << 40),
                payload: Bytes::from(vec![(seq % 251) as u8; payload_len]),
            });
            seq += 1;
            lamport += if flawed && rng.chance(0.02) {
                0
            } else {
                rng.between(1, 1 << 33)
            };
        }
    }
    if flawed && rng.chance(0.3) {
        rng.shuffle(&mut events);
    }
    let mut floor = VersionVector::new();
    if flawed && rng.chance(0.3) {
        let stream = StreamId::new(rng.between(1, 6));
        floor.advance(stream, marks.get(stream) + rng.below(3));
    }
    Delta {
        floor_proofs: Default::default(),
        floor,
        events,
        seals: Vec::new(),
    }
}

/// Every event a walk from the floor pages through.
fn walk<S: Store>(replica: &Replica<S>) -> Vec<Event> {
    let (mut cursor, mut events) = (replica.floor().clone(), Vec::new());
    loop {
        let page = replica.page(&cursor, 1_000).unwrap();
        events.extend(page.events);
        cursor = page.next;
        if page.at_head {
            return events;
        }
    }
}

/// Applies seeded deltas to two replicas on stores made by `store`, one
/// as events and one in columns, and compares them after every step.
fn compare<S: Store>(name: &str, rounds: u32, store: impl Fn() -> S) {
    let seed = seed::replay_or(0xc01a_5eed);
    let mut rng = SplitMix64::new(seed);
    let (mut clean, mut refused) = (0, 0);
    for round in 0..rounds {
        let config = Config::new(StreamId::new(OWN));
        let mut by_events = Replica::open(config.clone(), store()).unwrap();
        let mut by_columns = Replica::open(config, store()).unwrap();
        for step in 0..40 {
            let at = format!("{name}, round {round}, step {step}, seed {seed}");
            if rng.chance(0.1) {
                let payload = Bytes::from(vec![7u8; rng.below(9) as usize]);
                let time_ms = 1_000 + step;
                by_events.append_at(payload.clone(), time_ms).unwrap();
                by_columns.append_at(payload, time_ms).unwrap();
            }
            if rng.chance(0.05) {
                let target: VersionVector = by_events
                    .marks()
                    .iter()
                    .map(|(stream, seq)| (stream, seq.saturating_sub(rng.below(30))))
                    .collect();
                assert_eq!(
                    by_events.compact(&target).unwrap(),
                    by_columns.compact(&target).unwrap(),
                    "{at}"
                );
            }
            let delta = delta(&mut rng, &by_events.marks(), by_events.clock());
            let columns = DeltaColumns::from_delta(&delta);
            assert_eq!(columns.to_delta(), delta, "{at}");
            let applied = by_events.apply(&delta);
            let applied_in_columns = by_columns.apply_columns(&columns);
            assert_eq!(
                format!("{applied:?}"),
                format!("{applied_in_columns:?}"),
                "{at}"
            );
            match &applied {
                Ok(report) if report.applied as usize == delta.events.len() => clean += 1,
                Ok(_) => {}
                Err(_) => refused += 1,
            }
            assert_eq!(by_events.marks(), by_columns.marks(), "{at}");
            assert_eq!(by_events.floor(), by_columns.floor(), "{at}");
            assert_eq!(by_events.clock(), by_columns.clock(), "{at}");
            assert_eq!(by_events.digest(), by_columns.digest(), "{at}");
            assert_eq!(by_events.pending_len(), by_columns.pending_len(), "{at}");
            assert_eq!(by_events.stats(), by_columns.stats(), "{at}");
            assert_eq!(walk(&by_events), walk(&by_columns), "{at}");
        }
        assert_eq!(
            by_events.verify().unwrap(),
            by_columns.verify().unwrap(),
            "{name}, round {round}, seed {seed}"
        );
    }
    // Both kinds of delta were met, many times.
    println!("{name}: {clean} applied whole, {refused} refused, seed {seed}");
    assert!(
        clean > 5 * rounds && refused > rounds,
        "{name}: {clean} applied whole, {refused} refused, seed {seed}"
    );
}

#[test]
fn on_a_store_with_a_view() {
    compare("MemStore", 20, MemStore::default);
}

#[test]
fn on_a_store_without_a_view() {
    compare("no view", 20, NoView::default);
}

#[test]
fn on_a_store_that_reads_events() {
    compare("by events", 20, ByEvents::default);
}

#[test]
fn on_a_disk_store() {
    let dirs = std::cell::RefCell::new(Vec::new());
    // Fewer rounds: each step is two commits to a file.
    compare("disk", 5, || {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::open(dir.path()).unwrap();
        dirs.borrow_mut().push(dir);
        store
    });
}

/// The shared handle takes a delta in columns as `Replica` does: a clean
/// one alone in its round, or any one, ends as the same state.
#[test]
fn the_shared_handle_applies_columns_as_events() {
    let seed = seed::replay_or(0x054a_5eed);
    let mut rng = SplitMix64::new(seed);
    let by_events = SharedReplica::new(Replica::new(StreamId::new(OWN)));
    let by_columns = SharedReplica::new(Replica::new(StreamId::new(OWN)));
    for step in 0..300 {
        let at = format!("step {step}, seed {seed}");
        let delta = delta(&mut rng, &by_events.marks(), by_events.clock());
        let columns = DeltaColumns::from_delta(&delta);
        let applied = by_events.apply(delta);
        let applied_in_columns = by_columns.apply_columns(columns);
        assert_eq!(
            format!("{applied:?}"),
            format!("{applied_in_columns:?}"),
            "{at}"
        );
        assert_eq!(by_events.marks(), by_columns.marks(), "{at}");
        assert_eq!(by_events.digest(), by_columns.digest(), "{at}");
        assert_eq!(by_events.stats(), by_columns.stats(), "{at}");
        assert_eq!(by_events.pending_len(), by_columns.pending_len(), "{at}");
    }
    assert_eq!(by_events.verify().unwrap(), by_columns.verify().unwrap());
}

/// Columns built by hand at the edges of their types (seqs and stamps 0,
/// 1 and `u64::MAX`, the largest stamp a replica takes and one above it,
/// streams 0 and `u64::MAX`, the receiver's own stream, empty and
/// over-the-limit payloads, times at both ends) are taken or refused in
/// columns exactly as their events are.
#[test]
fn columns_at_the_edges_are_taken_as_their_events() {
    let seed = seed::replay_or(0xed6e_5eed);
    let mut rng = SplitMix64::new(seed);
    let edges = [
        0,
        1,
        2,
        meshlog_replica::LAMPORT_MAX,
        meshlog_replica::LAMPORT_MAX + 1,
        u64::MAX - 1,
        u64::MAX,
    ];
    let mut config = Config::new(StreamId::new(OWN));
    config.payload_bytes_max = 4;
    let mut outcomes = std::collections::BTreeSet::new();
    for step in 0..2_000 {
        let mut by_events = Replica::open(config.clone(), MemStore::default()).unwrap();
        by_events.append_at(&b"own"[..], 5).unwrap();
        let mut by_columns = Replica::open(config.clone(), MemStore::default()).unwrap();
        by_columns.append_at(&b"own"[..], 5).unwrap();
        let pick = |rng: &mut SplitMix64| edges[rng.below(edges.len() as u64) as usize];
        let mut runs = Vec::new();
        let (mut lamports, mut times, mut ends, mut payloads) = (vec![], vec![], vec![], vec![]);
        for _ in 0..1 + rng.below(3) {
            let stream = match rng.below(4) {
                0 => StreamId::new(OWN),
                1 => StreamId::new(pick(&mut rng)),
                _ => StreamId::new(2 + rng.below(3)),
            };
            let first_seq = if rng.chance(0.5) { 1 } else { pick(&mut rng) };
            let len = 1 + rng.below(3) as usize;
            let len = if first_seq.checked_add(len as u64 - 1).is_none() {
                1
            } else {
                len
            };
            runs.push(meshlog_replica::ColumnRun {
                stream,
                first_seq,
                len,
            });
            let mut lamport = if rng.chance(0.5) {
                1 + rng.below(5)
            } else {
                pick(&mut rng)
            };
            for _ in 0..len {
                lamports.push(lamport);
                lamport = lamport.saturating_add(if rng.chance(0.9) { 1 } else { 0 });
                times.push(pick(&mut rng));
                payloads.extend(std::iter::repeat_n(7u8, rng.below(6) as usize));
                ends.push(payloads.len() as u64);
            }
        }
        let columns = DeltaColumns::from_parts(
            VersionVector::new(),
            runs,
            Values::from(lamports),
            Values::from(times),
            Values::from(ends),
            payloads,
        )
        .unwrap();
        let applied = by_events.apply(&columns.to_delta());
        let applied_in_columns = by_columns.apply_columns(&columns);
        let at = format!("step {step}, seed {seed}: {columns:?}");
        assert_eq!(
            format!("{applied:?}"),
            format!("{applied_in_columns:?}"),
            "{at}"
        );
        assert_eq!(by_events.marks(), by_columns.marks(), "{at}");
        assert_eq!(by_events.clock(), by_columns.clock(), "{at}");
        assert_eq!(by_events.digest(), by_columns.digest(), "{at}");
        assert_eq!(by_events.pending_len(), by_columns.pending_len(), "{at}");
        by_columns.verify().unwrap();
        outcomes.insert(match &applied {
            Ok(report) if report.applied > 0 => "applied".to_string(),
            Ok(_) => "nothing applied".to_string(),
            Err(error) => format!("{error:?}")
                .split([' ', '{'])
                .next()
                .unwrap_or_default()
                .to_string(),
        });
    }
    // Taken, and refused for several reasons.
    println!("outcomes: {outcomes:?}");
    assert!(outcomes.len() >= 6, "{outcomes:?}");
}
