//! The handle's group commit against the single-owner replica: random
//! rounds of deltas (late, early, duplicated, overlapping, equivocating,
//! forging our own stream, carrying floors) and local appends are queued
//! while the committer is held, so that each round is one plan and one
//! commit; a `Replica` applies the same requests one at a time, deltas
//! first, in the order the round plans them. After every round the two
//! agree on which requests were refused (and why), on marks, floor, pending
//! count and every held event — all but the stamps of their own appends,
//! which a round may give lower (see the comment at the check).
//!
//! Half the rounds hand every delta in columns (`apply_columns_async`),
//! the others some of them: a round whose deltas are all in columns and
//! clean (catch-ups of distinct writers, each from the receiver's mark) is
//! planned as columns, any other as events.
//!
//! Seeded: a failing schedule prints its seed; `MESHLOG_SEED` replays it.

use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Config, Delta, DeltaColumns, Event, MemStore, Replica, SharedReplica};
use meshlog_testkit::seed;
use meshlog_testkit::store::HeldStore;
use meshlog_testkit::SplitMix64;

const OWN: StreamId = StreamId::new(1);
const WRITERS: [StreamId; 3] = [StreamId::new(2), StreamId::new(3), StreamId::new(4)];
const HOLD_MAX: Duration = Duration::from_secs(20);

/// Every held event, in page order, without wall-clock times (the handle's
/// async appends stamp their own).
fn walk(
    page: impl Fn(&VersionVector) -> meshlog_replica::Page,
    floor: VersionVector,
) -> Vec<(StreamId, u64, u64, Bytes)> {
    let mut cursor = floor;
    let mut events = Vec::new();
    loop {
        let page = page(&cursor);
        events.extend(
            page.events
                .into_iter()
                .map(|e| (e.stream, e.seq, e.lamport, e.payload)),
        );
        cursor = page.next;
        if page.at_head {
            return events;
        }
    }
}

/// A delta drawn from a writer's history: a slice that may start late (a
/// hole below it), overlap what was sent before, carry a floor, or be
/// hostile (an altered event, our own stream forged).
fn draw_delta(rng: &mut SplitMix64, writers: &[Replica], own_head: u64) -> Delta {
    let writer = &writers[rng.below(writers.len() as u64) as usize];
    let stream = writer.stream();
    let head = writer.marks().get(stream);
    let mut delta = Delta::default();
    if head > 0 {
        let from = rng.below(head);
        let len = 1 + rng.below(4);
        let since: VersionVector = [(stream, from)].into_iter().collect();
        delta = writer.delta_for(&since, usize::MAX);
        delta.events.truncate(len as usize);
    }
    match rng.below(10) {
        0 => {
            if let Some(event) = delta.events.first_mut() {
                event.payload = Bytes::from_static(b"an altered version");
            }
        }
        1 => delta.events.push(Event {
            stream: OWN,
            seq: own_head + 1 + rng.below(3),
            lamport: 1 + rng.below(100),
            time_ms: 0,
            payload: Bytes::from_static(b"forged"),
        }),
        2 if head > 2 => {
            delta.floor = [(stream, 1 + rng.below(head - 1))].into_iter().collect();
        }
        3 => delta.floor = [(OWN, own_head + 1)].into_iter().collect(),
        _ => {}
    }
    rng.shuffle(&mut delta.events);
    delta
}

/// A clean delta: everything a writer holds past the receiver's mark of
/// its stream.
fn catch_up(rng: &mut SplitMix64, writers: &[Replica], marks: &VersionVector) -> Delta {
    let writer = &writers[rng.below(writers.len() as u64) as usize];
    let stream = writer.stream();
    let since: VersionVector = [(stream, marks.get(stream))].into_iter().collect();
    writer.delta_for(&since, usize::MAX)
}

enum Request {
    Apply(Delta),
    Append(Vec<Bytes>),
}

fn schedule(seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let mut writers: Vec<Replica> = WRITERS.iter().map(|&s| Replica::new(s)).collect();
    let mut config = Config::new(OWN);
    // Large enough that no early event is dropped: the property compares
    // states, and which early event a full buffer drops depends on order.
    config.pending_events_max = 1 << 16;
    let store = HeldStore::new(MemStore::default(), HOLD_MAX);
    let gate = store.gate();
    let shared = SharedReplica::new(Replica::open(config.clone(), store).unwrap());
    let mut reference = Replica::open(config, MemStore::default()).unwrap();

    // The events held before each round, by name.
    let mut held_before: std::collections::BTreeSet<(StreamId, u64)> = Default::default();
    for round in 0..12 {
        for writer in &mut writers {
            for _ in 0..rng.below(4) {
                let n = writer.marks().get(writer.stream());
                writer
                    .append_at(format!("{} #{n}", writer.stream()), 0)
                    .unwrap();
            }
        }
        let own_head = reference.marks().get(OWN);
        let marks = reference.marks().clone();
        let requests: Vec<Request> = (0..1 + rng.below(8))
            .map(|i| {
                if rng.chance(0.3) {
                    Request::Append(
                        (0..1 + rng.below(3))
                            .map(|j| Bytes::from(format!("own r{round} q{i} #{j}")))
                            .collect(),
                    )
                } else if rng.chance(0.4) {
                    Request::Apply(catch_up(&mut rng, &writers, &marks))
                } else {
                    Request::Apply(draw_delta(&mut rng, &writers, own_head))
                }
            })
            .collect();

        // Hold the committer on a round of its own, queue the requests,
        // release: they are planned and committed as one round.
        gate.arm();
        let blocker = shared.append_async("blocker");
        assert!(gate.wait_holding(HOLD_MAX), "round {round}: never held");
        let mut applies = Vec::new();
        let mut appends = Vec::new();
        let all_in_columns = rng.chance(0.5);
        for request in &requests {
            match request {
                Request::Apply(delta) if all_in_columns || rng.chance(0.3) => {
                    applies.push(shared.apply_columns_async(DeltaColumns::from_delta(delta)))
                }
                Request::Apply(delta) => applies.push(shared.apply_async(delta.clone())),
                Request::Append(payloads) => {
                    appends.push(shared.append_batch_async(payloads.clone()))
                }
            }
        }
        gate.disarm();
        assert!(gate.release());
        blocker.wait().unwrap();

        // The reference: the blocker, then the round as planned: deltas in
        // order, then appends in order.
        reference.append_at("blocker", 0).unwrap();
        let deltas = requests.iter().filter_map(|r| match r {
            Request::Apply(delta) => Some(delta),
            Request::Append(_) => None,
        });
        for (delta, outcome) in deltas.zip(applies) {
            // The same deltas refused, for the same reason. (An accepted
            // delta's report may count an event as below the floor where
            // the one-by-one replica counted it a duplicate: a round raises
            // every floor before it adds events; the states must agree.)
            let got = outcome.wait().map(|_| ()).map_err(|e| e.to_string());
            let want = reference
                .apply(delta)
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_eq!(got, want, "round {round}: {delta:?}");
        }
        let batches = requests.iter().filter_map(|r| match r {
            Request::Append(payloads) => Some(payloads),
            Request::Apply(_) => None,
        });
        for (payloads, outcome) in batches.zip(appends) {
            let got = outcome.wait().unwrap();
            let want = reference.append_batch_at(payloads.clone(), 0).unwrap();
            let strip = |events: &[Event]| -> Vec<(u64, Bytes)> {
                events.iter().map(|e| (e.seq, e.payload.clone())).collect()
            };
            assert_eq!(strip(&got), strip(&want), "round {round}: appends");
        }

        assert_eq!(shared.marks(), reference.marks(), "round {round}: marks");
        assert_eq!(shared.floor(), reference.floor(), "round {round}: floor");
        assert_eq!(
            shared.pending_len(),
            reference.pending_len(),
            "round {round}"
        );
        // A round raises its floors before it adds events, so an event a
        // later delta's floor drops is never received and does not move the
        // clock, where one by one it did: the round's clock may be lower,
        // and so may the stamps of its own appends. Everything else agrees.
        assert!(shared.clock() <= reference.clock(), "round {round}: clock");
        let unstamped = |events: Vec<(StreamId, u64, u64, Bytes)>| {
            let mut events: Vec<(StreamId, u64, Option<u64>, Bytes)> = events
                .into_iter()
                .map(|(s, seq, lamport, p)| (s, seq, (s != OWN).then_some(lamport), p))
                .collect();
            events.sort();
            events
        };
        let held = walk(|c| shared.page(c, 7).unwrap(), shared.floor());
        // The round's own appends are stamped above every event its deltas
        // added.
        let new =
            |&&(s, seq, _, _): &&(StreamId, u64, u64, Bytes)| !held_before.contains(&(s, seq));
        let received = held
            .iter()
            .filter(new)
            .filter(|e| e.0 != OWN)
            .map(|e| e.2)
            .max()
            .unwrap_or(0);
        // (The blocker went in a round of its own, before.)
        let blocker = Bytes::from_static(b"blocker");
        for appended in held
            .iter()
            .filter(new)
            .filter(|e| e.0 == OWN && e.3 != blocker)
        {
            assert!(
                appended.2 > received,
                "round {round}: own {:?} stamped at or below {received}",
                (appended.1, appended.2)
            );
        }
        held_before = held.iter().map(|e| (e.0, e.1)).collect();
        let ours = unstamped(held);
        let theirs = unstamped(walk(|c| reference.page(c, 7).unwrap(), reference.floor()));
        assert_eq!(ours, theirs, "round {round}: the held events");
    }
}

#[test]
fn a_group_committed_round_equals_its_requests_applied_one_by_one() {
    let count = std::env::var("MESHLOG_QC_TESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(40);
    seed::for_each_seed("shared_rounds", 0x5eed_0a11, count, schedule);
}
