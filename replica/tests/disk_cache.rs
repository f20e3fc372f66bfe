//! A durable replica whose page cache is far smaller than its log behaves
//! exactly like the in-memory reference (issue 13).
//!
//! How: a seeded random run of appends, peers' deltas (in order, early,
//! duplicated), compactions and restarts, applied alike to a replica on a
//! `DiskStore` opened with a cache of a few KiB and to one on `MemStore`.
//! Payloads are up to a few hundred bytes, so the log soon outgrows the
//! cache and every page, delta and compaction reads across it. After every
//! step both agree on marks, floor, clock and digest, on a page and a delta
//! from a random cursor, and on a full walk; after every restart the disk
//! replica's `verify` recounts every event. `MESHLOG_SEED` replays a run;
//! `MESHLOG_CACHE_CASES` runs more of them.

mod disk_support;

use bytes::Bytes;
use disk_support::scratch;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Config, Delta, DiskOptions, DiskStore, Event, MemStore, Replica, Store};
use meshlog_testkit::{seed, SplitMix64};

const OWN: StreamId = StreamId::new(1);
const PEERS: [StreamId; 3] = [StreamId::new(2), StreamId::new(3), StreamId::new(9)];
const CACHE_BYTES: usize = 4 << 10;

fn open_disk(dir: &std::path::Path) -> Replica<DiskStore> {
    let options = DiskOptions {
        cache_bytes: CACHE_BYTES,
        ..DiskOptions::default()
    };
    let store = DiskStore::open_with(dir, &options).unwrap();
    Replica::open(Config::new(OWN), store).unwrap()
}

/// The event `seq` of peer `peer`: a function of both, so no run
/// equivocates; stamps interleave with the other peers' and ours.
fn peer_event(peer: StreamId, seq: u64) -> Event {
    let len = ((seq * 37 + peer.get() * 11) % 300) as usize;
    Event {
        stream: peer,
        seq,
        lamport: seq * 10 + peer.get(),
        time_ms: seq,
        payload: Bytes::from(vec![(seq % 251) as u8; len]),
    }
}

fn walk_all<S: Store>(replica: &Replica<S>, limit: usize) -> Vec<Event> {
    let mut cursor = replica.floor();
    let mut events = Vec::new();
    loop {
        let page = replica.page(&cursor, limit).unwrap();
        events.extend(page.events);
        cursor = page.next;
        if page.at_head {
            return events;
        }
    }
}

fn random_cursor(
    rng: &mut SplitMix64,
    marks: &VersionVector,
    floor: &VersionVector,
) -> VersionVector {
    marks
        .iter()
        .map(|(stream, head)| {
            let low = floor.get(stream);
            (stream, low + rng.below(head - low + 1))
        })
        .collect()
}

fn run(seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let dir = scratch();
    let mut disk = open_disk(dir.path());
    let mut memory = Replica::open(Config::new(OWN), MemStore::default()).unwrap();
    let mut sent = [0u64; 3];
    for step in 0..150u64 {
        let context = format!("case seed {seed} step {step} (the run's seed is printed below)");
        match rng.below(12) {
            0..=3 => {
                let payloads: Vec<Bytes> = (0..rng.between(1, 6))
                    .map(|i| Bytes::from(vec![(step + i) as u8; rng.below(400) as usize]))
                    .collect();
                let a = disk.append_batch_at(payloads.clone(), step).unwrap();
                let b = memory.append_batch_at(payloads, step).unwrap();
                assert_eq!(a, b, "{context}");
            }
            4..=7 => {
                let p = rng.below(3) as usize;
                let peer = PEERS[p];
                let first = if rng.below(4) == 0 && sent[p] > 0 {
                    rng.between(1, sent[p])
                } else {
                    sent[p] + 1
                };
                let last = first + rng.below(12);
                let mut events: Vec<Event> = (first..=last).map(|s| peer_event(peer, s)).collect();
                if rng.below(4) == 0 && events.len() > 1 {
                    events.remove(0);
                }
                let delta = Delta {
                    floor_proofs: Default::default(),
                    floor: VersionVector::new(),
                    events,
                    seals: Vec::new(),
                };
                let a = disk.apply(&delta).unwrap();
                let b = memory.apply(&delta).unwrap();
                assert_eq!(a, b, "{context}");
                sent[p] = sent[p].max(last);
            }
            8 => {
                let target = random_cursor(&mut rng, &disk.marks(), &disk.floor());
                assert_eq!(
                    disk.compact(&target).unwrap(),
                    memory.compact(&target).unwrap(),
                    "{context}"
                );
            }
            9 => {
                drop(disk);
                disk = open_disk(dir.path());
                memory = Replica::open(Config::new(OWN), memory.into_store()).unwrap();
                let verified = disk.verify().unwrap();
                assert_eq!(verified, memory.verify().unwrap(), "{context}");
            }
            _ => {
                // A peer's events past a hole, then the hole filled.
                let p = rng.below(3) as usize;
                let peer = PEERS[p];
                let early = Delta {
                    floor_proofs: Default::default(),
                    floor: VersionVector::new(),
                    events: vec![peer_event(peer, sent[p] + 3)],
                    seals: Vec::new(),
                };
                assert_eq!(disk.apply(&early).unwrap(), memory.apply(&early).unwrap());
                let fill = Delta {
                    floor_proofs: Default::default(),
                    floor: VersionVector::new(),
                    events: (sent[p] + 1..=sent[p] + 2)
                        .map(|s| peer_event(peer, s))
                        .collect(),
                    seals: Vec::new(),
                };
                assert_eq!(disk.apply(&fill).unwrap(), memory.apply(&fill).unwrap());
                sent[p] += 3;
            }
        }
        assert_eq!(disk.marks(), memory.marks(), "{context}");
        assert_eq!(disk.floor(), memory.floor(), "{context}");
        assert_eq!(disk.clock(), memory.clock(), "{context}");
        assert_eq!(disk.digest(), memory.digest(), "{context}");
        let cursor = random_cursor(&mut rng, &disk.marks(), &disk.floor());
        let limit = rng.between(1, 20) as usize;
        assert_eq!(
            disk.page(&cursor, limit).unwrap(),
            memory.page(&cursor, limit).unwrap(),
            "{context}"
        );
        let budget = rng.between(1, 3_000) as usize;
        assert_eq!(
            disk.delta_for(&cursor, budget),
            memory.delta_for(&cursor, budget),
            "{context}"
        );
        assert_eq!(walk_all(&disk, 7), walk_all(&memory, 7), "{context}");
        let lamport = rng.below(disk.clock() + 2);
        assert_eq!(
            disk.covering_lamport(lamport),
            memory.covering_lamport(lamport),
            "{context}"
        );
    }
    // The log outgrew the cache many times over.
    let size = std::fs::metadata(disk_support::data_file(dir.path()))
        .unwrap()
        .len();
    assert!(size > 8 * CACHE_BYTES as u64, "{size}");
}

#[test]
fn a_disk_replica_with_a_tiny_cache_equals_the_memory_reference_after_every_step() {
    let seed = seed::fresh();
    let _report = seed::Report::new(
        "a_disk_replica_with_a_tiny_cache_equals_the_memory_reference_after_every_step",
        seed,
    );
    let cases: u64 = std::env::var("MESHLOG_CACHE_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(3);
    let mut rng = SplitMix64::new(seed);
    for _ in 0..cases {
        run(rng.next_u64());
    }
}
