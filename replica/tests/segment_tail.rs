//! The write-ahead segment's recovery (`docs/STORAGE.md`, "The write-ahead
//! segment"): what an unclean open makes of a segment cut or damaged.
//!
//! Each case runs a `DiskStore` over two of testkit's simulated disks (the
//! data file's and the segment's), commits a seeded number of appends (each
//! one record), and loses the power with nothing unsynced kept: redb is
//! back at its last checkpoint, the segment holds every acknowledged
//! commit. Then the segment is edited on the simulated disk and the store
//! reopened:
//!
//! - cut at every byte offset of its last record: every commit before it
//!   is present once, the last is absent (a torn tail is refused, not
//!   half-read), and `Recovery::torn_bytes` counts the bytes cut;
//! - a byte flipped anywhere in the last record: the same;
//! - a byte flipped in any earlier record: the open is refused with
//!   `DiskError::Segment` (damage before the tail drops no acknowledged
//!   commit silently);
//! - untouched: every commit is present once, replayed from the segment
//!   (a crash between the segment's fdatasync and redb's durable fold
//!   loses nothing), and the zeros kept ahead of the tail read as the end
//!   of the log, not as a torn record;
//! - cut right after its last record, as an earlier build left a segment
//!   (no end mark, no zeros): the same;
//! - written in place after a checkpoint, shorter records over longer
//!   older ones: exactly the new ones replay, nothing is reported torn;
//!   the last new one damaged: it is cut, and no older one after it is
//!   read.
//!
//! Seeds are printed on failure; `MESHLOG_SEED` replays one.

mod disk_support;

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{Config, DiskError, DiskOptions, DiskStore, Replica};
use meshlog_testkit::{seed, PowerDisk, SplitMix64};
use redb::StorageBackend as _;

use disk_support::scratch;

const OWN: StreamId = StreamId::new(1);

/// A store's two disks after a power cut that kept only what was synced.
struct Cut {
    data: PowerDisk,
    segment: PowerDisk,
    dir: tempfile::TempDir,
    /// The payloads acknowledged, seq 1 first.
    acked: Vec<Bytes>,
    /// Where the segment's last record starts and ends.
    last_record: (u64, u64),
    /// Where each record since the last checkpoint starts.
    starts: Vec<u64>,
}

/// Where each record of the segment starts, up to the end mark (a zero
/// head) or the file's end, and where the last one ends.
fn frames(segment: &dyn redb::StorageBackend) -> (Vec<u64>, u64) {
    let (mut starts, mut at) = (Vec::new(), 0);
    let len = segment.len().unwrap();
    while at + 8 <= len {
        let mut head = [0u8; 8];
        segment.read(at, &mut head).unwrap();
        if head == [0; 8] {
            break;
        }
        starts.push(at);
        at += 8 + u64::from(u32::from_le_bytes(head[..4].try_into().unwrap()));
    }
    (starts, at)
}

fn options() -> DiskOptions {
    DiskOptions {
        // No checkpoint during the appends: every one is in the segment.
        checkpoint_records: 1 << 20,
        ..DiskOptions::default()
    }
}

fn open(cut: &Cut) -> Result<Replica<DiskStore>, DiskError> {
    let store = DiskStore::open_with_backends(
        cut.dir.path(),
        &options(),
        cut.data.backend(),
        cut.segment.backend(),
    )?;
    Ok(Replica::open(Config::new(OWN), store).expect("the replica opens on a store that opened"))
}

/// A generator whose first draw makes `PowerDisk::restore` keep only what
/// was synced.
fn synced_only() -> SplitMix64 {
    (0..)
        .map(SplitMix64::new)
        .find(|rng| rng.clone().below(4) == 0)
        .expect("some seed draws 0")
}

/// Appends a seeded number of seeded payloads, one commit each, and cuts
/// the power keeping only what was synced.
fn committed_then_cut(seed: u64) -> Cut {
    let mut rng = SplitMix64::new(seed);
    let (data, segment) = (PowerDisk::new(), PowerDisk::new());
    let mut cut = Cut {
        data,
        segment,
        dir: scratch(),
        acked: Vec::new(),
        last_record: (0, 0),
        starts: Vec::new(),
    };
    let replica = open(&cut).expect("a new store opens");
    append_then_cut(&mut cut, replica, &mut rng, 40);
    cut
}

/// Appends a seeded number of seeded payloads of up to `longest` bytes,
/// one commit each, and cuts the power keeping only what was synced.
fn append_then_cut(
    cut: &mut Cut,
    mut replica: Replica<DiskStore>,
    rng: &mut SplitMix64,
    longest: u64,
) {
    let salt = rng.next_u64() as usize;
    for _ in 0..rng.between(2, 6) {
        let len = rng.below(longest) as usize;
        let payload: Bytes = (0..len).map(|i| (salt + i) as u8).collect();
        replica.append(payload.clone()).unwrap();
        cut.acked.push(payload);
        assert_eq!(replica.marks().get(OWN), cut.acked.len() as u64);
    }
    let (starts, end) = frames(&cut.segment.backend());
    cut.last_record = (*starts.last().expect("a record"), end);
    cut.starts = starts;
    cut.data.restore(&mut synced_only());
    cut.segment.restore(&mut synced_only());
    drop(replica);
}

/// Appends long payloads, closes (a checkpoint: the segment starts again
/// at offset 0), reopens and appends short ones over them, then cuts the
/// power keeping only what was synced. `starts` are the short ones'.
fn checkpointed_then_cut(seed: u64) -> (Cut, usize) {
    let mut rng = SplitMix64::new(seed);
    let mut cut = Cut {
        data: PowerDisk::new(),
        segment: PowerDisk::new(),
        dir: scratch(),
        acked: Vec::new(),
        last_record: (0, 0),
        starts: Vec::new(),
    };
    let mut replica = open(&cut).expect("a new store opens");
    for _ in 0..rng.between(4, 9) {
        let payload: Bytes = (0..200 + rng.below(100)).map(|i| i as u8 | 1).collect();
        replica.append(payload.clone()).unwrap();
        cut.acked.push(payload);
    }
    drop(replica);
    let old = cut.acked.len();
    let replica = open(&cut).expect("the store reopens after a clean close");
    append_then_cut(&mut cut, replica, &mut rng, 30);
    (cut, old)
}

/// The replica holds exactly the first `count` acknowledged payloads.
fn holds_first(replica: &Replica<DiskStore>, cut: &Cut, count: usize, case: &str) {
    assert_eq!(replica.marks().get(OWN), count as u64, "{case}: head");
    for (index, payload) in cut.acked[..count].iter().enumerate() {
        let event = replica
            .get(OWN, index as u64 + 1)
            .unwrap_or_else(|| panic!("{case}: seq {} missing", index + 1));
        assert_eq!(&event.payload, payload, "{case}: seq {}", index + 1);
    }
    replica
        .verify()
        .unwrap_or_else(|error| panic!("{case}: verify: {error}"));
}

fn edit_segment(cut: &Cut, edit: impl FnOnce(&dyn redb::StorageBackend)) {
    let backend = cut.segment.backend();
    edit(&backend);
    backend.sync_data().unwrap();
}

/// A crash after the segment's fdatasync and before redb's durable fold
/// (every commit between two checkpoints) loses nothing: the open replays
/// each commit once.
#[test]
fn a_crash_between_the_segment_sync_and_the_fold_loses_nothing() {
    seed::for_each_seed(
        "a_crash_between_the_segment_sync_and_the_fold_loses_nothing",
        0x5e6_0001,
        20,
        |seed| {
            let cut = committed_then_cut(seed);
            let replica = open(&cut).unwrap_or_else(|error| panic!("seed {seed}: {error}"));
            let recovery = replica.store().recovery();
            assert_eq!(recovery.replayed, cut.acked.len() as u64, "seed {seed}");
            assert_eq!(recovery.torn_bytes, 0, "seed {seed}");
            assert!(
                cut.segment.backend().len().unwrap() > cut.last_record.1 + 8,
                "seed {seed}: no zeros ahead of the tail"
            );
            assert!(
                !recovery.pages_checked,
                "seed {seed}: the open walked the data file"
            );
            holds_first(&replica, &cut, cut.acked.len(), &format!("seed {seed}"));
            drop(replica);
            // And once more, cleanly: nothing to replay, nothing twice.
            let replica = open(&cut).unwrap();
            assert_eq!(replica.store().recovery().replayed, 0);
            holds_first(
                &replica,
                &cut,
                cut.acked.len(),
                &format!("seed {seed}, clean"),
            );
        },
    );
}

/// The segment cut at every byte offset of its last record: the record is
/// refused whole, everything before it is present once.
#[test]
fn a_segment_cut_inside_its_last_record_loses_only_that_record() {
    seed::for_each_seed(
        "a_segment_cut_inside_its_last_record_loses_only_that_record",
        0x5e6_0002,
        3,
        |seed| {
            let (start, end) = committed_then_cut(seed).last_record;
            for at in start..end {
                let cut = committed_then_cut(seed);
                edit_segment(&cut, |segment| segment.set_len(at).unwrap());
                let case = format!("seed {seed}: cut at byte {at} (last record {start}..{end})");
                let replica = open(&cut).unwrap_or_else(|error| panic!("{case}: {error}"));
                assert_eq!(replica.store().recovery().torn_bytes, at - start, "{case}");
                holds_first(&replica, &cut, cut.acked.len() - 1, &case);
            }
        },
    );
}

/// A byte flipped in the last record: it is refused whole. A byte flipped
/// in an earlier one: the open is refused, typed, naming the segment.
#[test]
fn a_flipped_byte_is_a_torn_tail_in_the_last_record_and_refused_before_it() {
    seed::for_each_seed(
        "a_flipped_byte_is_a_torn_tail_in_the_last_record_and_refused_before_it",
        0x5e6_0003,
        3,
        |seed| {
            let mut rng = SplitMix64::new(seed ^ FLIP_SALT);
            let shape = committed_then_cut(seed);
            let (start, end) = shape.last_record;
            // Every byte of the last record, and a sample of those before it.
            let before: Vec<u64> = (0..16).map(|_| rng.below(start)).collect();
            for at in before.into_iter().chain(start..end) {
                let cut = committed_then_cut(seed);
                let mask = 1u8 << rng.below(8);
                edit_segment(&cut, |segment| {
                    let mut byte = [0u8];
                    segment.read(at, &mut byte).unwrap();
                    segment.write(at, &[byte[0] ^ mask]).unwrap();
                });
                let case = format!(
                    "seed {seed}: byte {at} ^ {mask:#04x} (records at {:?}, end {end})",
                    shape.starts
                );
                match open(&cut) {
                    Ok(replica) if at >= start => {
                        // The record is cut with the zeros after it.
                        let len = cut.segment.backend().len().unwrap();
                        assert_eq!(replica.store().recovery().torn_bytes, len - start, "{case}");
                        holds_first(&replica, &cut, cut.acked.len() - 1, &case);
                    }
                    Ok(replica) => panic!(
                        "{case}: damage before the tail opened, holding head {}",
                        replica.marks().get(OWN)
                    ),
                    Err(DiskError::Segment { path, .. }) if at < start => {
                        assert!(path.ends_with(meshlog_replica::SEGMENT_FILE), "{case}");
                    }
                    Err(error) => panic!("{case}: {error}"),
                }
            }
        },
    );
}

/// A fixed salt for the flips' generator.
const FLIP_SALT: u64 = 0xf11b;

/// A segment as an earlier build left it (its records up to the file's
/// end: no end mark, no zeros ahead) replays whole, nothing torn.
#[test]
fn a_segment_of_the_earlier_layout_replays_whole() {
    seed::for_each_seed(
        "a_segment_of_the_earlier_layout_replays_whole",
        0x5e6_0004,
        10,
        |seed| {
            let cut = committed_then_cut(seed);
            edit_segment(&cut, |segment| segment.set_len(cut.last_record.1).unwrap());
            let case = format!("seed {seed}");
            let replica = open(&cut).unwrap_or_else(|error| panic!("{case}: {error}"));
            let recovery = replica.store().recovery();
            assert_eq!(recovery.replayed, cut.acked.len() as u64, "{case}");
            assert_eq!(recovery.torn_bytes, 0, "{case}");
            holds_first(&replica, &cut, cut.acked.len(), &case);
        },
    );
}

/// After a checkpoint the segment is written again from offset 0, shorter
/// records over longer older ones (which redb holds): a crash replays
/// exactly the new ones, and the older ones after them read as the end of
/// the log, not as a torn record.
#[test]
fn shorter_records_over_older_ones_after_a_checkpoint_replay_alone() {
    seed::for_each_seed(
        "shorter_records_over_older_ones_after_a_checkpoint_replay_alone",
        0x5e6_0005,
        10,
        |seed| {
            let (cut, old) = checkpointed_then_cut(seed);
            assert_eq!(cut.starts[0], 0, "seed {seed}: not written from offset 0");
            let case = format!("seed {seed} ({old} older records)");
            let replica = open(&cut).unwrap_or_else(|error| panic!("{case}: {error}"));
            let recovery = replica.store().recovery();
            assert_eq!(recovery.replayed, (cut.acked.len() - old) as u64, "{case}");
            assert_eq!(recovery.torn_bytes, 0, "{case}");
            holds_first(&replica, &cut, cut.acked.len(), &case);
        },
    );
}

/// After a checkpoint, the last new record damaged at any byte (an append
/// torn over older records): it is cut, and nothing after it, older
/// records included, is replayed.
#[test]
fn a_torn_record_over_older_ones_is_cut_and_nothing_after_it_replays() {
    seed::for_each_seed(
        "a_torn_record_over_older_ones_is_cut_and_nothing_after_it_replays",
        0x5e6_0006,
        3,
        |seed| {
            let (start, end) = checkpointed_then_cut(seed).0.last_record;
            for at in start..end {
                let (cut, old) = checkpointed_then_cut(seed);
                edit_segment(&cut, |segment| {
                    let mut byte = [0u8];
                    segment.read(at, &mut byte).unwrap();
                    segment.write(at, &[byte[0] ^ 0x20]).unwrap();
                });
                let case = format!("seed {seed}: byte {at} flipped (last record {start}..{end})");
                let replica = open(&cut).unwrap_or_else(|error| panic!("{case}: {error}"));
                let recovery = replica.store().recovery();
                let len = cut.segment.backend().len().unwrap();
                assert_eq!(recovery.torn_bytes, len - start, "{case}");
                assert_eq!(
                    recovery.replayed,
                    (cut.acked.len() - old - 1) as u64,
                    "{case}"
                );
                holds_first(&replica, &cut, cut.acked.len() - 1, &case);
            }
        },
    );
}

/// A clean close leaves the segment empty (cut to nothing, synced): the
/// next open reads no byte of it. Before, it kept the folded records and
/// the zeros ahead (up to 68 MiB), which every clean open read through to
/// look for a later record damage hid: 61 ms at 1M events. Appends after
/// the reopen write the zeros ahead again and are kept.
#[test]
fn a_clean_close_leaves_the_segment_empty_and_the_log_whole() {
    let dir = scratch();
    let segment = dir.path().join(meshlog_replica::SEGMENT_FILE);
    let append = |from: u64, to: u64| {
        let store = DiskStore::open_with(dir.path(), &options()).unwrap();
        let mut replica = Replica::open(Config::new(OWN), store).unwrap();
        for i in from..to {
            replica
                .append_at(Bytes::from(format!("event {i}")), i)
                .unwrap();
        }
        assert!(
            std::fs::metadata(&segment).unwrap().len() > 0,
            "the appends went through the segment"
        );
    };
    append(0, 40);
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), 0);
    append(40, 50);
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), 0);

    let store = DiskStore::open_with(dir.path(), &options()).unwrap();
    assert_eq!(store.recovery().replayed, 0);
    let replica = Replica::open(Config::new(OWN), store).unwrap();
    assert_eq!(replica.marks().get(OWN), 50);
    for seq in 1..=50 {
        let event = replica.get(OWN, seq).expect("every appended event kept");
        assert_eq!(event.payload, Bytes::from(format!("event {}", seq - 1)));
    }
}
