//! A group-committed round is a left fold (issue 28): requests committed
//! together end exactly as the same requests applied one by one, in
//! submission order, whatever the committer's timing.
//!
//! A threaded `SharedReplica` (`SharedReplica::new`: a real committer
//! thread) receives batches of requests from several worker threads, one
//! after another in a known order (each worker says when its request is
//! queued before the next is handed out). Most batches are queued behind a
//! commit the test holds (`HeldStore`), so that they are planned as rounds
//! of every size; the others flow as the committer takes them. Beside it a
//! `Replica` applies the same requests one by one, in the same order.
//!
//! Requests: appends and batches of appends, deltas as events and as
//! columns (late, early, gapped, duplicated, overlapping, equivocating —
//! a twin writer of one stream — claiming the receiver's own stream, with
//! floors, honest or not, at every position of a round), and compactions.
//! A third of the batches hand every delta in columns, so that rounds of
//! clean deltas are planned as columns. After every batch both agree on every answer (reports, appended events,
//! refusals), marks, floor, clock, digest, pending count, a full page walk
//! and every counter of `stats()`.
//!
//! Seeded: a failing schedule prints its seed; `MESHLOG_SEED` replays it.
//! `MESHLOG_SCHEDULES=10000` runs more schedules than the default 200.

use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    ApplyReport, CompactReport, Completion, Config, Delta, DeltaColumns, Event, MemStore, Replica,
    ReplicaError, SharedReplica,
};
use meshlog_testkit::seed;
use meshlog_testkit::store::HeldStore;
use meshlog_testkit::SplitMix64;

const OWN: StreamId = StreamId::new(1);
const WRITERS: [StreamId; 3] = [StreamId::new(2), StreamId::new(3), StreamId::new(4)];
const HOLD_MAX: Duration = Duration::from_secs(20);
const SENDERS: usize = 3;

#[derive(Debug, Clone)]
enum Request {
    Append(Vec<Bytes>),
    Apply(Delta),
    Columns(Delta),
    Compact(VersionVector),
}

/// Events as compared: `(stream, seq, lamport, payload)`.
type Stripped = Vec<(StreamId, u64, u64, Bytes)>;

/// What a request was answered, comparable: events without their
/// wall-clock time (the handle's async appends stamp their own), errors
/// as their message.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// With the events' wall-clock time (the same for every event of a
    /// request), which the reference then stamps its own with.
    Appended(Result<(Stripped, u64), String>),
    Applied(Result<ApplyReport, String>),
    Compacted(Result<CompactReport, String>),
}

fn strip(events: &[Event]) -> Stripped {
    events
        .iter()
        .map(|e| (e.stream, e.seq, e.lamport, e.payload.clone()))
        .collect()
}

fn message(error: ReplicaError) -> String {
    error.to_string()
}

enum Waiting {
    Appended(Completion<Result<Vec<Event>, ReplicaError>>),
    Applied(Completion<Result<ApplyReport, ReplicaError>>),
    Compacted(Completion<Result<CompactReport, ReplicaError>>),
}

impl Waiting {
    fn answer(self) -> Answer {
        match self {
            Waiting::Appended(c) => Answer::Appended(
                c.wait()
                    .map(|e| (strip(&e), e.first().map_or(0, |e| e.time_ms)))
                    .map_err(message),
            ),
            Waiting::Applied(c) => Answer::Applied(c.wait().map_err(message)),
            Waiting::Compacted(c) => Answer::Compacted(c.wait().map_err(message)),
        }
    }
}

fn submit(shared: &SharedReplica<HeldStore>, request: Request) -> Waiting {
    match request {
        Request::Append(payloads) => Waiting::Appended(shared.append_batch_async(payloads)),
        Request::Apply(delta) => Waiting::Applied(shared.apply_async(delta)),
        Request::Columns(delta) => {
            Waiting::Applied(shared.apply_columns_async(DeltaColumns::from_delta(&delta)))
        }
        Request::Compact(target) => Waiting::Compacted(shared.compact_async(target)),
    }
}

/// Applies `request` to the reference; an append takes the time the
/// handle stamped (`got`), so that the digests compare.
fn apply_one(reference: &mut Replica, request: &Request, got: &Answer) -> Answer {
    match request {
        Request::Append(payloads) => {
            let time_ms = match got {
                Answer::Appended(Ok((_, time_ms))) => *time_ms,
                _ => 0,
            };
            Answer::Appended(
                reference
                    .append_batch_at(payloads.clone(), time_ms)
                    .map(|e| (strip(&e), time_ms))
                    .map_err(message),
            )
        }
        Request::Apply(delta) => Answer::Applied(reference.apply(delta).map_err(message)),
        Request::Columns(delta) => Answer::Applied(
            reference
                .apply_columns(&DeltaColumns::from_delta(delta))
                .map_err(message),
        ),
        Request::Compact(target) => Answer::Compacted(reference.compact(target).map_err(message)),
    }
}

/// The writers whose histories deltas are cut from: one per stream of
/// `WRITERS`, and a twin of the first that writes other payloads under
/// the same stream (its events equivocate with the first's).
fn writers() -> Vec<Replica> {
    let mut writers: Vec<Replica> = WRITERS.iter().map(|&s| Replica::new(s)).collect();
    writers.push(Replica::new(WRITERS[0]));
    writers
}

/// A delta cut from a writer's history, relative to the receiver's marks
/// before the batch: a catch-up, a late or early slice (a hole below it),
/// a repeat, and sometimes altered, reordered, claiming the receiver's own
/// stream, or carrying a floor (honest or not, the own stream's included).
fn draw_delta(rng: &mut SplitMix64, writers: &[Replica], marks: &VersionVector) -> Delta {
    let writer = &writers[rng.below(writers.len() as u64) as usize];
    let stream = writer.stream();
    let head = writer.marks().get(stream);
    let since = match rng.below(4) {
        0 => marks.get(stream),
        1 => marks.get(stream) + rng.between(1, 3),
        _ => rng.below(head + 1),
    };
    let since: VersionVector = [(stream, since)].into_iter().collect();
    let mut delta = writer.delta_for(&since, usize::MAX);
    if rng.chance(0.5) {
        delta.events.truncate(rng.between(1, 5) as usize);
    }
    if rng.chance(0.15) && delta.events.len() > 2 {
        // A gap inside the slice.
        delta.events.remove(1);
    }
    let own_head = marks.get(OWN);
    match rng.below(14) {
        0 => {
            if let Some(event) = delta.events.first_mut() {
                event.payload = Bytes::from_static(b"an altered version");
            }
        }
        1 => delta.events.push(Event {
            stream: OWN,
            seq: (own_head + rng.below(4)).max(1),
            lamport: 1 + rng.below(100),
            time_ms: 0,
            payload: Bytes::from_static(b"forged"),
        }),
        2 | 3 => {
            let stream = WRITERS[rng.below(WRITERS.len() as u64) as usize];
            delta
                .floor
                .advance(stream, marks.get(stream) + rng.below(4));
        }
        4 => delta.floor.advance(OWN, own_head + rng.below(2)),
        5 => {
            if let Some(event) = delta.events.last_mut() {
                event.lamport = rng.below(event.lamport + 2);
            }
        }
        _ => {}
    }
    if rng.chance(0.2) {
        rng.shuffle(&mut delta.events);
    }
    delta
}

fn draw_request(
    rng: &mut SplitMix64,
    writers: &[Replica],
    marks: &VersionVector,
    batch: usize,
    index: usize,
) -> Request {
    match rng.below(20) {
        0..=4 => Request::Append(
            (0..rng.between(1, 3))
                .map(|j| Bytes::from(format!("own b{batch} r{index} #{j}")))
                .collect(),
        ),
        5..=11 => Request::Apply(draw_delta(rng, writers, marks)),
        12..=18 => Request::Columns(draw_delta(rng, writers, marks)),
        _ => Request::Compact(
            marks
                .iter()
                .map(|(stream, head)| (stream, rng.below(head + 2)))
                .collect(),
        ),
    }
}

/// Everything a reader can compare, events without their times.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    marks: VersionVector,
    floor: VersionVector,
    clock: u64,
    digest: meshlog_replica::Digest,
    pending: usize,
    stats: meshlog_replica::Stats,
    walk: Stripped,
}

fn seen_shared(shared: &SharedReplica<HeldStore>) -> Seen {
    let page = shared.page(&shared.floor(), 10_000).unwrap();
    assert!(page.at_head, "one page holds everything");
    Seen {
        marks: shared.marks(),
        floor: shared.floor(),
        clock: shared.clock(),
        digest: shared.digest(),
        pending: shared.pending_len(),
        stats: shared.stats(),
        walk: strip(&page.events),
    }
}

fn seen_replica(replica: &Replica) -> Seen {
    let page = replica.page(&replica.floor(), 10_000).unwrap();
    assert!(page.at_head, "one page holds everything");
    Seen {
        marks: replica.marks(),
        floor: replica.floor(),
        clock: replica.clock(),
        digest: replica.digest(),
        pending: replica.pending_len(),
        stats: replica.stats(),
        walk: strip(&page.events),
    }
}

fn schedule(seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let mut writers = writers();
    let mut config = Config::new(OWN);
    // Small, so that full buffers drop early events, which must go the same
    // way in a round as one by one.
    config.pending_events_max = rng.between(2, 12) as usize;
    let store = HeldStore::new(MemStore::default(), HOLD_MAX);
    let gate = store.gate();
    let shared = SharedReplica::new(Replica::open(config.clone(), store).unwrap());
    let mut reference = Replica::open(config, MemStore::default()).unwrap();

    // Worker threads queue the requests; each answers once its request is
    // queued, so the submission order is the order they are handed out.
    let mut senders = Vec::new();
    let (queued_tx, queued) = mpsc::channel::<Waiting>();
    let mut workers = Vec::new();
    for _ in 0..SENDERS {
        let (tx, rx) = mpsc::channel::<Request>();
        let shared = shared.clone();
        let queued_tx = queued_tx.clone();
        senders.push(tx);
        workers.push(std::thread::spawn(move || {
            for request in rx {
                queued_tx.send(submit(&shared, request)).unwrap();
            }
        }));
    }

    for batch in 0..10 {
        for writer in &mut writers {
            for _ in 0..rng.below(4) {
                let n = writer.marks().get(writer.stream());
                let payload = format!("{} #{n} {}", writer.stream(), rng.below(2));
                writer.append_at(payload, 0).unwrap();
            }
            if rng.chance(0.1) {
                // The writer compacts, so its deltas carry floors.
                let stream = writer.stream();
                let head = writer.marks().get(stream);
                let target = [(stream, rng.below(head + 1))].into_iter().collect();
                writer.compact(&target).unwrap();
            }
        }
        let marks = reference.marks();
        let mut requests: Vec<Request> = (0..rng.between(1, 12) as usize)
            .map(|index| draw_request(&mut rng, &writers, &marks, batch, index))
            .collect();
        if rng.chance(0.3) {
            // Every delta in columns: a round of clean ones is planned as
            // columns (`State::plan_columns`), with its appends.
            for request in &mut requests {
                if let Request::Apply(delta) = request {
                    *request = Request::Columns(std::mem::take(delta));
                }
            }
        }

        let held = rng.chance(0.8);
        let blocker = if held {
            // Hold the committer on a round of its own; what is queued
            // meanwhile is planned in rounds as large as the limits allow.
            gate.arm();
            let blocker = shared.append_async("blocker");
            assert!(gate.wait_holding(HOLD_MAX), "batch {batch}: never held");
            Some(blocker)
        } else {
            None
        };
        let mut waiting = Vec::new();
        for (index, request) in requests.iter().enumerate() {
            senders[index % SENDERS].send(request.clone()).unwrap();
            waiting.push(queued.recv().unwrap());
        }
        if let Some(blocker) = blocker {
            gate.disarm();
            assert!(gate.release());
            let blocker = blocker.wait().unwrap();
            reference.append_at("blocker", blocker.time_ms).unwrap();
        }
        for (index, (request, waiting)) in requests.iter().zip(waiting).enumerate() {
            let got = waiting.answer();
            let want = apply_one(&mut reference, request, &got);
            assert_eq!(got, want, "batch {batch} request {index}: {request:?}");
        }
        assert_eq!(
            seen_shared(&shared),
            seen_replica(&reference),
            "batch {batch} ({} requests, held {held})",
            requests.len()
        );
    }
    drop(senders);
    for worker in workers {
        worker.join().unwrap();
    }
}

#[test]
fn a_round_ends_as_its_requests_applied_one_by_one_in_submission_order() {
    let count = std::env::var("MESHLOG_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    seed::for_each_seed("round_fold", 0xf01d_0a11, count, schedule);
}
