//! Whatever a replica accepts, it reopens (issue 28), at its limits.
//!
//! - A regression test for the node that could not restart: a replica at
//!   `streams_max` accepted its own first append, held `streams_max + 1`
//!   streams, and `open` then refused its store ("a delta would bring the
//!   replica to 3 streams; the limit is 2"). The own stream's slot is now
//!   always reserved.
//! - A store holding more streams than the configured limit (an operator
//!   lowered it) opens, with a typed warning and a counter, and refuses
//!   only what would add a stream.
//! - A seeded property: random appends, deltas (early, hostile, oversized,
//!   new streams) and compactions with `streams_max`, `payload_bytes_max`
//!   and the pending buffer set small, on a `MemStore` and on a
//!   `DiskStore` in a temp dir. After every accepted operation the store
//!   reopens to the identical state (marks, floor, clock, digest, a full
//!   page); every refusal leaves the state unchanged.
//!
//! Seeded: a failing schedule prints its seed; `MESHLOG_SEED` replays it.

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Config, Delta, DiskStore, Event, MemStore, OpenWarning, Replica, ReplicaError, Store,
};
use meshlog_testkit::seed;
use meshlog_testkit::SplitMix64;

const OWN: StreamId = StreamId::new(1);

/// What a reopened replica must show again (the pending buffer is memory
/// only, and not part of it).
#[derive(Debug, PartialEq, Eq)]
struct Durable {
    marks: VersionVector,
    floor: VersionVector,
    clock: u64,
    digest: meshlog_replica::Digest,
    walk: Vec<Event>,
}

fn durable<S: Store>(replica: &Replica<S>) -> Durable {
    let page = replica.page(&replica.floor(), 10_000).unwrap();
    assert!(page.at_head, "one page holds everything");
    Durable {
        marks: replica.marks(),
        floor: replica.floor(),
        clock: replica.clock(),
        digest: replica.digest(),
        walk: page.events,
    }
}

fn peer_delta(stream: u64, events: u64) -> Delta {
    let mut peer = Replica::new(StreamId::new(stream));
    for i in 0..events {
        peer.append_at(format!("{stream} #{i}"), 0).unwrap();
    }
    peer.delta_for(&VersionVector::new(), usize::MAX)
}

/// From issue 28: with `streams_max = 2`, a replica took two peers'
/// streams, then its own first append made three, and `open` refused the
/// store. Before the fix this failed at the reopen with "a delta would
/// bring the replica to 3 streams; the limit is 2".
#[test]
fn a_replica_at_streams_max_that_appends_reopens() {
    let mut config = Config::new(OWN);
    config.streams_max = 2;
    let mut replica = Replica::open(config.clone(), MemStore::default()).unwrap();
    replica.apply(&peer_delta(2, 2)).unwrap();
    let second = replica.apply(&peer_delta(3, 2));
    replica.append_at("own", 0).unwrap();
    let before = durable(&replica);
    let reopened = Replica::open(config, replica.into_store()).expect("it reopens");
    assert_eq!(durable(&reopened), before);
    // The own stream's slot is reserved: one peer fits, the second not.
    assert!(
        matches!(
            second,
            Err(ReplicaError::TooManyStreams {
                streams: 3,
                limit: 2,
                ..
            })
        ),
        "{second:?}"
    );
    assert!(reopened.open_warnings().is_empty());
}

/// A store written under a higher `streams_max` opens under a lower one:
/// warned, counted, every stream kept; only a new stream is refused.
#[test]
fn a_store_over_a_lowered_streams_max_opens_warned_and_takes_no_new_stream() {
    let mut wide = Replica::new(OWN);
    wide.append_at("own", 0).unwrap();
    for stream in 2..=4 {
        wide.apply(&peer_delta(stream, 2)).unwrap();
    }
    let before = durable(&wide);
    let mut config = Config::new(OWN);
    config.streams_max = 2;
    let mut narrow = Replica::open(config, wide.into_store()).expect("it opens");
    assert_eq!(durable(&narrow), before);
    assert_eq!(
        narrow.open_warnings(),
        [OpenWarning::StreamsOverLimit {
            streams: 4,
            limit: 2
        }]
    );
    assert_eq!(narrow.stats().open_warnings, 1);
    // What it holds keeps growing: its own stream and a held peer's.
    narrow.append_at("more", 0).unwrap();
    assert_eq!(narrow.apply(&peer_delta(2, 3)).unwrap().applied, 1);
    // A new stream is refused, and changes nothing.
    let held = durable(&narrow);
    let refused = narrow.apply(&peer_delta(5, 1));
    assert!(
        matches!(refused, Err(ReplicaError::TooManyStreams { limit: 2, .. })),
        "{refused:?}"
    );
    assert_eq!(durable(&narrow), held);
}

/// The writers a schedule draws deltas from: more streams than the limit.
fn writers(rng: &mut SplitMix64) -> Vec<Replica> {
    (2..=5u64)
        .map(|stream| {
            let mut writer = Replica::new(StreamId::new(stream));
            for i in 0..rng.between(3, 12) {
                let len = rng.below(48) as usize;
                writer
                    .append_at(Bytes::from(vec![i as u8; len]), 0)
                    .unwrap();
            }
            writer
        })
        .collect()
}

fn draw_delta(rng: &mut SplitMix64, writers: &[Replica], marks: &VersionVector) -> Delta {
    let writer = &writers[rng.below(writers.len() as u64) as usize];
    let stream = writer.stream();
    let since = match rng.below(3) {
        0 => marks.get(stream),
        1 => marks.get(stream) + rng.between(1, 3),
        _ => rng.below(writer.marks().get(stream) + 1),
    };
    let mut delta = writer.delta_for(&[(stream, since)].into_iter().collect(), usize::MAX);
    delta.events.truncate(rng.between(1, 6) as usize);
    match rng.below(8) {
        0 => {
            let floor = marks.get(stream) + rng.below(3);
            delta.floor.advance(stream, floor);
        }
        1 => delta.floor.advance(OWN, marks.get(OWN) + rng.below(2)),
        2 => {
            if let Some(event) = delta.events.first_mut() {
                event.payload = Bytes::from_static(b"altered");
            }
        }
        _ => {}
    }
    delta
}

/// One schedule on a store; `reopen` closes the replica and opens its
/// store again (a `MemStore` is moved, a `DiskStore` closed and reopened
/// on its directory).
fn schedule<S: Store>(seed: u64, store: S, reopen: impl Fn(Replica<S>, &Config) -> Replica<S>) {
    let mut rng = SplitMix64::new(seed);
    let mut writers = writers(&mut rng);
    let mut config = Config::new(OWN);
    config.streams_max = rng.between(1, 4) as usize;
    config.payload_bytes_max = rng.between(8, 40) as usize;
    config.pending_events_max = rng.below(4) as usize;
    let mut replica = Replica::open(config.clone(), store).unwrap();
    let (mut accepted, mut refused) = (0, 0);
    for step in 0..60 {
        if rng.chance(0.1) {
            // A writer grows, and sometimes compacts (deltas carry floors).
            let writer = &mut writers[rng.below(4) as usize];
            writer.append_at(vec![step as u8; 4], 0).unwrap();
            if rng.chance(0.3) {
                let stream = writer.stream();
                let head = writer.marks().get(stream);
                let target = [(stream, rng.below(head + 1))].into_iter().collect();
                writer.compact(&target).unwrap();
            }
        }
        let before = durable(&replica);
        let pending = replica.pending_len();
        let marks = replica.marks();
        let (what, result) = match rng.below(6) {
            0 | 1 => {
                let len = rng.below(config.payload_bytes_max as u64 * 2) as usize;
                let payload = Bytes::from(vec![b'o'; len]);
                ("append", replica.append_at(payload, 0).map(|_| ()))
            }
            2..=4 => {
                let delta = draw_delta(&mut rng, &writers, &marks);
                ("apply", replica.apply(&delta).map(|_| ()))
            }
            _ => {
                let target: VersionVector = marks
                    .iter()
                    .map(|(stream, head)| (stream, rng.below(head + 2)))
                    .collect();
                ("compact", replica.compact(&target).map(|_| ()))
            }
        };
        match result {
            Ok(()) => {
                accepted += 1;
                let held = durable(&replica);
                replica = reopen(replica, &config);
                assert_eq!(durable(&replica), held, "step {step}: {what} reopens");
            }
            Err(error) => {
                refused += 1;
                assert_eq!(
                    durable(&replica),
                    before,
                    "step {step}: {what} refused ({error}) changes nothing"
                );
                assert_eq!(replica.pending_len(), pending, "step {step}: {what}");
            }
        }
    }
    assert!(
        accepted > 0 && refused > 0,
        "accepted {accepted}, refused {refused}"
    );
}

#[test]
fn whatever_a_memory_replica_accepts_at_its_limits_it_reopens() {
    seed::for_each_seed("limits_mem", 0x11_7175, 60, |seed| {
        schedule(seed, MemStore::default(), |replica, config| {
            Replica::open(config.clone(), replica.into_store()).expect("it reopens")
        });
    });
}

#[test]
fn whatever_a_disk_replica_accepts_at_its_limits_it_reopens() {
    seed::for_each_seed("limits_disk", 0xd15c_7175, 12, |seed| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let store = DiskStore::open(&path).unwrap();
        schedule(seed, store, |replica, config| {
            drop(replica.into_store());
            let store = DiskStore::open(&path).expect("the store reopens");
            Replica::open(config.clone(), store).expect("it reopens")
        });
    });
}

/// `Replica::admission` answers what apply's limits take: a delta cut to
/// it is never refused for a limit, and a delta it takes whole is refused
/// for a limit only if apply would refuse it anyway for something else
/// first. Seeded deltas of several streams, payloads around the limit,
/// floors of new streams, at small limits.
#[test]
fn a_delta_cut_to_the_admission_is_never_refused_for_a_limit() {
    seed::for_each_seed("admission", 0xad_3155, 200, |seed| {
        let mut rng = SplitMix64::new(seed);
        let writers = writers(&mut rng);
        let mut config = Config::new(OWN);
        config.streams_max = rng.between(1, 4) as usize;
        config.payload_bytes_max = rng.between(8, 40) as usize;
        let mut replica = Replica::open(config, MemStore::default()).unwrap();
        if rng.chance(0.5) {
            replica.append_at("own", 0).unwrap();
        }
        for step in 0..20 {
            let mut delta = Delta::default();
            for _ in 0..rng.between(1, 3) {
                let part = draw_delta(&mut rng, &writers, &replica.marks());
                delta.floor.join(&part.floor);
                delta.events.extend(part.events);
            }
            delta.events.sort_by_key(|e| (e.stream, e.seq));
            delta.events.dedup_by_key(|e| (e.stream, e.seq));
            let columns = meshlog_replica::DeltaColumns::from_delta(&delta);
            let admission = replica.admission(&columns);
            let limit_error = |result: &Result<_, ReplicaError>| {
                matches!(
                    result,
                    Err(ReplicaError::PayloadTooLarge { .. } | ReplicaError::TooManyStreams { .. })
                )
            };
            let whole = replica.validate(&delta);
            if limit_error(&whole) {
                assert!(
                    !admission.is_whole(),
                    "step {step}: {whole:?} {admission:?}"
                );
            }
            let cut = admission.cut_columns(&columns);
            let result = replica.apply_columns(&cut).map(|_| ());
            assert!(
                !limit_error(&result),
                "step {step}: {result:?} {admission:?}"
            );
        }
    });
}
