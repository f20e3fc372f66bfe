//! A property of the segment path: a random sequence of commits (events of
//! three streams, raised floors, clocks) with reopen points between them —
//! clean closes, and power cuts that keep a seeded part of what was not
//! synced — leaves a `DiskStore` equal to a `MemStore` that applied the
//! same batches one by one: the same floors, heads, clock and events.
//! Checkpoint intervals are drawn per case, so reopens land before, on and
//! after checkpoints. A second mode holds the fold thread back
//! (`DiskStore::hold_fold`) with a small bound on what it may lag, so the
//! reads between commits are served from the overlay, and a clean reopen
//! must then read the same digest back from redb. Seeds are printed on
//! failure; `MESHLOG_SEED` replays.

mod disk_support;

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{Batch, DiskOptions, DiskStore, Event, MemStore, Store};
use meshlog_testkit::{seed, PowerDisk, SplitMix64};

use disk_support::scratch;

const STREAMS: u64 = 3;

fn open(dir: &std::path::Path, options: &DiskOptions, disks: &(PowerDisk, PowerDisk)) -> DiskStore {
    DiskStore::open_with_backends(dir, options, disks.0.backend(), disks.1.backend())
        .unwrap_or_else(|error| panic!("reopen: {error}"))
}

/// A random batch that keeps every stream gap-free against `model`.
fn batch(rng: &mut SplitMix64, model: &MemStore, clock: &mut u64) -> Batch<'static> {
    let meta = model.meta().unwrap();
    let mut events = Vec::new();
    let mut floors = Vec::new();
    for stream in 1..=STREAMS {
        let stream = StreamId::new(stream);
        let head = meta.heads.get(stream);
        if rng.chance(0.15) && head > meta.floor.get(stream) {
            floors.push((stream, rng.between(meta.floor.get(stream) + 1, head)));
        }
        for seq in head + 1..=head + rng.below(4) {
            *clock += 1;
            events.push(Event {
                stream,
                seq,
                lamport: *clock,
                time_ms: seq,
                payload: Bytes::from(vec![seq as u8; rng.below(64) as usize]),
            });
        }
    }
    Batch::from_events(events)
        .with_floors(floors)
        .with_clock(*clock)
}

fn assert_same(disk: &DiskStore, model: &MemStore, case: &str) {
    let (got, want) = (disk.meta().unwrap(), model.meta().unwrap());
    assert_eq!(got.floor, want.floor, "{case}: floors");
    assert_eq!(got.heads, want.heads, "{case}: heads");
    assert_eq!(got.clock, want.clock, "{case}: clock");
    for stream in 1..=STREAMS {
        let stream = StreamId::new(stream);
        let (mut left, mut right) = (Vec::new(), Vec::new());
        disk.read_stream(stream, 0, usize::MAX, &mut left).unwrap();
        model
            .read_stream(stream, 0, usize::MAX, &mut right)
            .unwrap();
        assert_eq!(left, right, "{case}: events of stream {stream}");
    }
}

#[test]
fn commits_and_reopens_equal_one_by_one_application_on_memstore() {
    seed::for_each_seed(
        "commits_and_reopens_equal_one_by_one_application_on_memstore",
        0x5e6_0004,
        24,
        |seed| run_case(seed, false),
    );
}

#[test]
fn reads_between_commits_while_the_fold_lags_equal_memstore() {
    seed::for_each_seed(
        "reads_between_commits_while_the_fold_lags_equal_memstore",
        0x5e6_0005,
        24,
        |seed| run_case(seed, true),
    );
}

/// One case; with `lag`, the fold is held back to what its bound forces.
fn run_case(seed: u64, lag: bool) {
    let mut rng = SplitMix64::new(seed);
    let dir = scratch();
    let disks = (PowerDisk::new(), PowerDisk::new());
    let options = DiskOptions {
        checkpoint_records: [1, 2, 5, 1024][rng.below(4) as usize],
        unfolded_records_max: if lag {
            rng.between(1, 6) as usize
        } else {
            1024
        },
        ..DiskOptions::default()
    };
    let mut model = MemStore::default();
    let mut clock = 0;
    let mut disk = open(dir.path(), &options, &disks);
    disk.hold_fold(lag);
    for step in 0..rng.between(10, 40) {
        let batch = batch(&mut rng, &model, &mut clock);
        disk.commit(&batch).unwrap();
        model.commit(&batch).unwrap();
        let case = format!("seed {seed}, step {step}, {options:?}");
        assert!(
            disk.fold_lag().records <= options.unfolded_records_max as u64,
            "{case}"
        );
        assert_same(&disk, &model, &case);
        match rng.below(8) {
            0 => {
                let digest = disk.meta().unwrap().digest;
                drop(disk);
                disk = open(dir.path(), &options, &disks);
                disk.hold_fold(lag);
                assert_eq!(disk.recovery().replayed, 0, "{case}: a clean close");
                assert_eq!(disk.meta().unwrap().digest, digest, "{case}: the digest");
            }
            1 => {
                // The power goes off; each disk keeps a seeded part
                // of what was not synced. Every commit returned, so
                // every commit is in the segment.
                let (data, segment) = (disks.0.restore(&mut rng), disks.1.restore(&mut rng));
                drop(disk);
                disk = open(dir.path(), &options, &disks);
                disk.hold_fold(lag);
                let case = format!("{case}, after a cut ({data}; {segment})");
                assert_same(&disk, &model, &case);
            }
            _ => {}
        }
    }
}
