//! What `DiskStore` and `SharedReplica`'s group commit promise, one test per promise: a
//! reopened replica holds exactly what was committed (events, floors, the
//! clock), its next append takes a fresh seq and a higher lamport; the data
//! directory is locked against a second open, in this process and in
//! another; a batch that would leave a hole is refused with nothing
//! written; a deleted data file is reported, not replaced by an empty log;
//! group commit acknowledges every append exactly once, batched; and a
//! seeded random run keeps a disk replica equal to an in-memory one across
//! reopens.

mod disk_support;

use std::collections::BTreeSet;
use std::process::Command;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Batch, Config, Delta, DiskError, DiskOptions, DiskStore, Event, MemStore, Recovery, Replica,
    SharedReplica, Store,
};
use meshlog_testkit::{seed, SplitMix64};

use disk_support::{data_file, peer_event, scratch, PEER};

const OWN: StreamId = StreamId::new(1);

fn open(dir: &std::path::Path) -> Replica<DiskStore> {
    let store = DiskStore::open(dir).expect("open the store");
    Replica::open(Config::new(OWN), store).expect("recover the replica")
}

#[test]
fn reopen_recovers_events_floors_and_clock_and_the_next_append_is_fresh() {
    let dir = scratch();
    let mut replica = open(dir.path());
    for i in 0..50u64 {
        replica.append_at(format!("own {i}"), i).unwrap();
    }
    let delta = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: (1..=10).map(peer_event).collect(),
        seals: Vec::new(),
    };
    replica.apply(&delta).unwrap();
    let compacted: VersionVector = [(OWN, 20), (PEER, 4)].into_iter().collect();
    replica.compact(&compacted).unwrap();
    let (marks, floor, clock, digest) = (
        replica.marks(),
        replica.floor(),
        replica.clock(),
        replica.digest(),
    );
    assert!(clock >= peer_event(10).lamport);
    drop(replica);

    let store = DiskStore::open(dir.path()).unwrap();
    assert_eq!(
        store.recovery(),
        Recovery {
            created: false,
            rolled_back: false,
            pages_checked: false,
            replayed: 0,
            torn_bytes: 0,
        },
        "a clean close leaves nothing torn, nothing for redb to recover, nothing to replay"
    );
    drop(store);
    // Asked for, the check of every page runs on a clean open too.
    let options = DiskOptions {
        check_pages_on_open: true,
        ..DiskOptions::default()
    };
    let store = DiskStore::open_with(dir.path(), &options).unwrap();
    assert!(store.recovery().pages_checked);
    assert!(!store.recovery().rolled_back);
    let mut reopened = Replica::open(Config::new(OWN), store).unwrap();
    assert_eq!(reopened.marks(), marks);
    assert_eq!(reopened.floor(), floor);
    assert_eq!(reopened.clock(), clock);
    assert_eq!(reopened.digest(), digest);
    assert_eq!(reopened.get(OWN, 20), None, "compacted away");
    assert_eq!(reopened.get(OWN, 21).unwrap().payload, "own 20");
    let next = reopened.append(&b"after reopen"[..]).unwrap();
    assert_eq!(next.seq, 51);
    assert!(next.lamport > clock);
}

#[test]
fn a_second_open_of_the_directory_is_refused_until_the_first_closes() {
    let dir = scratch();
    let first = DiskStore::open(dir.path()).unwrap();
    match DiskStore::open(dir.path()) {
        Err(DiskError::Locked { dir: locked, .. }) => assert_eq!(locked, dir.path()),
        other => panic!("expected Locked, got {other:?}"),
    }
    drop(first);
    DiskStore::open(dir.path()).expect("opens once the first store is closed");
}

/// Set by `another_process_is_refused_the_lock` for the child it starts.
const LOCK_CHILD_ENV: &str = "MESHLOG_LOCK_CHILD_DIR";

/// The child half of `another_process_is_refused_the_lock`: runs only in the
/// child process (the test binary run again with `LOCK_CHILD_ENV` set) and
/// passes trivially otherwise.
#[test]
fn lock_child_process() {
    let Ok(dir) = std::env::var(LOCK_CHILD_ENV) else {
        return;
    };
    match DiskStore::open(&dir) {
        Err(error @ DiskError::Locked { .. }) => println!("child: refused: {error}"),
        other => println!("child: NOT refused: {other:?}"),
    }
}

#[test]
fn another_process_is_refused_the_lock() {
    let dir = scratch();
    let _held = DiskStore::open(dir.path()).unwrap();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lock_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LOCK_CHILD_ENV, dir.path())
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("child: refused: data directory"),
        "child output: {stdout}"
    );
    assert!(stdout.contains("is locked by another process"), "{stdout}");
}

#[test]
fn a_batch_that_would_leave_a_hole_is_refused_and_nothing_is_written() {
    let dir = scratch();
    let mut store = DiskStore::open(dir.path()).unwrap();
    let event = |seq: u64| Event {
        stream: OWN,
        seq,
        lamport: seq,
        time_ms: 0,
        payload: Bytes::from_static(b"x"),
    };
    store
        .commit(&Batch::from_events(vec![event(1)]).with_clock(1))
        .unwrap();
    let refused = store.commit(&Batch::from_events(vec![event(2), event(4)]).with_clock(4));
    match refused {
        Err(DiskError::BatchRefused { stream, detail, .. }) => {
            assert_eq!(stream, OWN);
            assert!(detail.contains("seq 4 does not follow head 2"), "{detail}");
        }
        other => panic!("expected BatchRefused, got {other:?}"),
    }
    drop(store);
    let store = DiskStore::open(dir.path()).unwrap();
    let meta = store.meta().unwrap();
    assert_eq!(meta.heads.get(OWN), 1);
    assert_eq!(meta.clock, 1);
}

#[test]
fn a_deleted_data_file_is_reported_not_replaced_by_an_empty_log() {
    let dir = scratch();
    let mut replica = open(dir.path());
    replica.append(&b"acknowledged"[..]).unwrap();
    drop(replica);
    std::fs::remove_file(data_file(dir.path())).unwrap();
    match DiskStore::open(dir.path()) {
        Err(DiskError::Corrupt { path, detail }) => {
            assert_eq!(path, data_file(dir.path()));
            assert!(detail.contains("data file is missing"), "{detail}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn an_empty_data_file_is_reported_not_taken_for_a_new_log() {
    let dir = scratch();
    let mut replica = open(dir.path());
    replica.append(&b"acknowledged"[..]).unwrap();
    drop(replica);
    std::fs::File::create(data_file(dir.path())).unwrap();
    match DiskStore::open(dir.path()) {
        Err(DiskError::Corrupt { path, .. }) => assert_eq!(path, data_file(dir.path())),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn group_commit_acknowledges_every_append_once_batched_and_durable() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 100;
    let dir = scratch();
    let group = SharedReplica::new(open(dir.path()));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let group = group.clone();
            std::thread::spawn(move || {
                (0..PER_THREAD)
                    .map(|i| group.append(format!("t{t} i{i}")).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seqs = BTreeSet::new();
    let mut acknowledged = Vec::new();
    for thread in threads {
        let events = thread.join().unwrap();
        // One thread's appends are acknowledged in the order it made them.
        assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
        for event in events {
            assert!(
                seqs.insert(event.seq),
                "seq {} acknowledged twice",
                event.seq
            );
            acknowledged.push(event);
        }
    }
    let total = (THREADS * PER_THREAD) as u64;
    assert_eq!(seqs, (1..=total).collect());
    let stats = group.commit_stats();
    assert_eq!(stats.appended, total);
    assert!(stats.commits <= total);
    drop(group.into_replica().unwrap());

    let reopened = open(dir.path());
    for event in acknowledged {
        assert_eq!(reopened.get(OWN, event.seq), Some(event));
    }
}

#[test]
fn group_commit_refuses_an_oversized_payload_alone() {
    let mut config = Config::new(OWN);
    config.payload_bytes_max = 4;
    let group = SharedReplica::new(Replica::open(config, MemStore::default()).unwrap());
    assert!(group.append(&b"too long"[..]).is_err());
    assert_eq!(group.append(&b"ok"[..]).unwrap().seq, 1);
}

/// A seeded random run of appends, received deltas (in order, early, and
/// duplicated) and compactions, applied to a replica on `DiskStore` and one
/// on `MemStore`; the disk one is reopened at random steps. After every
/// step both agree on marks, floor, clock and digest.
#[test]
fn disk_replica_equals_memory_replica_across_random_reopens() {
    let seed = seed::fresh();
    let _report = seed::Report::new(
        "disk_replica_equals_memory_replica_across_random_reopens",
        seed,
    );
    let mut rng = SplitMix64::new(seed);
    let dir = scratch();
    let mut disk = open(dir.path());
    let mut memory = Replica::open(Config::new(OWN), MemStore::default()).unwrap();
    let mut peer_sent = 0u64;
    for step in 0..300 {
        match rng.below(10) {
            0..=3 => {
                let n = rng.between(1, 5) as usize;
                let payloads: Vec<Bytes> = (0..n)
                    .map(|i| Bytes::from(format!("s{step} {i}")))
                    .collect();
                let a = disk.append_batch_at(payloads.clone(), step).unwrap();
                let b = memory.append_batch_at(payloads, step).unwrap();
                assert_eq!(a, b);
            }
            4..=6 => {
                // The peer's next events, sometimes with one held back (an
                // early arrival waits in the pending buffer), sometimes again.
                let first = if rng.below(4) == 0 && peer_sent > 0 {
                    rng.between(1, peer_sent)
                } else {
                    peer_sent + 1
                };
                let last = first + rng.below(4);
                let mut events: Vec<Event> = (first..=last).map(peer_event).collect();
                if rng.below(3) == 0 && events.len() > 1 {
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
                assert_eq!(a, b);
                peer_sent = peer_sent.max(last);
            }
            7 => {
                let target: VersionVector = [
                    (OWN, rng.below(disk.marks().get(OWN) + 1)),
                    (PEER, rng.below(disk.marks().get(PEER) + 1)),
                ]
                .into_iter()
                .collect();
                assert_eq!(
                    disk.compact(&target).unwrap(),
                    memory.compact(&target).unwrap()
                );
            }
            _ => {
                // Reopen both: the pending buffer lives in memory only, so
                // a reopen forgets it on either store alike.
                drop(disk);
                disk = open(dir.path());
                memory = Replica::open(Config::new(OWN), memory.into_store()).unwrap();
            }
        }
        assert_eq!(disk.marks(), memory.marks(), "step {step}");
        assert_eq!(disk.floor(), memory.floor(), "step {step}");
        assert_eq!(disk.clock(), memory.clock(), "step {step}");
        assert_eq!(disk.digest(), memory.digest(), "step {step}");
    }
}

#[test]
fn a_data_file_torn_during_the_first_open_is_started_over() {
    // No open ever returned here (the lock file holds no marker), so nothing
    // in the file was acknowledged: a kill during the first open leaves a
    // file that may be empty or partial, and the next open starts over.
    for torn in [&b"redb\x1a\n torn first write"[..], &b""[..]] {
        let dir = scratch();
        std::fs::write(data_file(dir.path()), torn).unwrap();
        let store = DiskStore::open(dir.path()).unwrap();
        assert!(store.recovery().created);
        assert_eq!(store.meta().unwrap().heads, VersionVector::new());
        // Set aside, not deleted: the marker is missing as well when `LOCK`
        // was deleted, and then the file may have held a log.
        let aside: Vec<Vec<u8>> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.to_string_lossy().contains(".damaged-"))
            .map(|path| std::fs::read(path).unwrap())
            .collect();
        assert_eq!(aside, vec![torn.to_vec()]);
    }
}

/// Review regression: with `LOCK` deleted from under a running store (an
/// operator "cleaning a stale lock"), a second open took a fresh lock, found
/// no marker, failed to open the data file (redb's own lock refused it) and
/// then deleted the live data file as "never acknowledged".
#[test]
fn an_open_after_the_lock_file_was_deleted_is_refused_and_keeps_the_data() {
    let dir = scratch();
    let mut first = open(dir.path());
    let event = first.append(&b"acknowledged"[..]).unwrap();
    std::fs::remove_file(dir.path().join(meshlog_replica::LOCK_FILE)).unwrap();
    match DiskStore::open(dir.path()) {
        Err(DiskError::Locked { .. }) => {}
        other => panic!("expected Locked, got {other:?}"),
    }
    assert!(
        data_file(dir.path()).exists(),
        "the live data file was removed"
    );
    drop(first);
    let reopened = open(dir.path());
    assert_eq!(reopened.get(OWN, event.seq), Some(event));
}

/// Review regression: `DiskStore::commit` computed `head + 1` unchecked, so a
/// batch for a stream whose head is `u64::MAX` (a floor raised that far)
/// panicked on overflow instead of being refused.
#[test]
fn a_batch_above_a_head_of_u64_max_is_refused_not_a_panic() {
    let dir = scratch();
    let mut store = DiskStore::open(dir.path()).unwrap();
    store
        .commit(&Batch::default().with_floors(vec![(PEER, u64::MAX)]))
        .unwrap();
    let refused = store.commit(&Batch::from_events(vec![Event {
        seq: 1,
        ..peer_event(1)
    }]));
    match refused {
        Err(DiskError::BatchRefused { stream, .. }) => assert_eq!(stream, PEER),
        other => panic!("expected BatchRefused, got {other:?}"),
    }
    drop(store);
    let store = DiskStore::open(dir.path()).unwrap();
    assert_eq!(store.meta().unwrap().heads.get(PEER), u64::MAX);
}

/// A store on disk builds its deltas by walking the streams in `(lamport,
/// stream)` order; the memory log finds the same cut from its lamport
/// columns. Both hold the same events: every delta, whole or cut, is the
/// same, in the same order (stream by stream).
#[test]
fn a_delta_from_disk_is_the_delta_from_memory() {
    let seed = seed::replay_or(0xd15c_de17);
    let mut rng = SplitMix64::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut disk = open(dir.path());
    let mut memory = Replica::new(OWN);
    let ids = [3u64, 8, 21];
    let mut writers: Vec<Replica> = ids
        .iter()
        .map(|&id| Replica::new(StreamId::new(id)))
        .collect();
    for _ in 0..400 {
        let w = rng.below(ids.len() as u64) as usize;
        let payload = vec![w as u8; rng.below(200) as usize];
        writers[w].append(Bytes::from(payload)).unwrap();
        if rng.below(3) == 0 {
            // Writers hear of each other, so their stamps interleave.
            let other = rng.below(ids.len() as u64) as usize;
            let delta = writers[w].delta_for(&writers[other].marks(), usize::MAX);
            writers[other].apply(&delta).unwrap();
        }
        if rng.below(5) == 0 {
            let delta = writers[w].delta_for(&disk.marks(), usize::MAX);
            disk.apply(&delta).unwrap();
            memory.apply(&delta).unwrap();
        }
    }
    for writer in &writers {
        let delta = writer.delta_for(&disk.marks(), usize::MAX);
        disk.apply(&delta).unwrap();
        memory.apply(&delta).unwrap();
    }
    assert_eq!(disk.marks(), memory.marks(), "seed {seed}");
    for _ in 0..100 {
        let their: VersionVector = ids
            .iter()
            .map(|&id| {
                let head = memory.marks().get(StreamId::new(id));
                (StreamId::new(id), rng.below(head + 1))
            })
            .collect();
        let budget = rng.below(40_000) as usize;
        let from_disk = disk.delta_for(&their, budget);
        assert_eq!(
            from_disk,
            memory.delta_for(&their, budget),
            "budget {budget}, seed {seed}"
        );
        assert_eq!(
            disk.delta_columns_for(&their, budget).to_delta(),
            from_disk,
            "seed {seed}"
        );
    }
}
