//! The block layout of format 3 (`replica/src/disk/block.rs`) at its
//! boundaries: a block filling up exactly, a block of one event larger than
//! the byte target, a compaction floor inside a block and at a block's end,
//! appends that extend a block across a reopen; and a seeded run of all of
//! them against a `BTreeMap` model.
//!
//! After every step the replica's events equal the model's and `verify`
//! recounts the recorded digest; at every reopen the redb file itself is
//! read (the store closed) and its layout checked: each stream's blocks are
//! contiguous, start at `floor + 1`, end at `head`, and hold 1 to 128
//! events, and a block under the byte target was not left short while a
//! later block of the same stream exists unless its next event would not
//! fit.

mod disk_support;

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Config, Delta, DiskStore, Event, Replica};
use meshlog_testkit::{seed, SplitMix64};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use disk_support::{data_file, peer_event, scratch, PEER};

const OWN: StreamId = StreamId::new(1);
const BLOCKS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("blocks");
const BLOCK_EVENTS_MAX: u64 = 128;
const BLOCK_BYTES_TARGET: usize = 32 << 10;

type Model = BTreeMap<(StreamId, u64), Event>;
/// Per stream, the `(first_seq, count, bytes)` of each block in the file.
type Layout = BTreeMap<StreamId, Vec<(u64, u64, usize)>>;

fn open(dir: &Path) -> Replica<DiskStore> {
    let store = DiskStore::open(dir).expect("open the store");
    Replica::open(Config::new(OWN), store).expect("open the replica")
}

fn append(replica: &mut Replica<DiskStore>, model: &mut Model, sizes: &[usize], tag: u64) {
    let payloads = sizes
        .iter()
        .map(|&size| Bytes::from(vec![(tag % 251) as u8; size]));
    for event in replica.append_batch_at(payloads, tag).unwrap() {
        model.insert((event.stream, event.seq), event);
    }
}

fn receive(replica: &mut Replica<DiskStore>, model: &mut Model, count: u64) {
    let first = replica.marks().get(PEER) + 1;
    let events: Vec<Event> = (first..first + count).map(peer_event).collect();
    replica
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: events.clone(),
            seals: Vec::new(),
        })
        .unwrap();
    for event in events {
        model.insert((event.stream, event.seq), event);
    }
}

fn compact(replica: &mut Replica<DiskStore>, model: &mut Model, stream: StreamId, floor: u64) {
    let target: VersionVector = [(stream, floor)].into_iter().collect();
    replica.compact(&target).unwrap();
    let floor = replica.floor().get(stream);
    model.retain(|&(s, seq), _| s != stream || seq > floor);
}

/// The replica holds exactly the model, and its digest recounts.
fn check(replica: &Replica<DiskStore>, model: &Model, step: &str) {
    let mut held = Model::new();
    for (stream, head) in replica.marks().iter() {
        for seq in replica.floor().get(stream) + 1..=head {
            let event = replica
                .get(stream, seq)
                .unwrap_or_else(|| panic!("{step}: {stream} {seq} is not held"));
            held.insert((stream, seq), event);
        }
    }
    assert!(held == *model, "{step}: the replica differs from the model");
    let verified = replica.verify().unwrap_or_else(|e| panic!("{step}: {e}"));
    assert_eq!(verified.events, model.len() as u64, "{step}");
    // A walk in pages of a few events crosses every block boundary.
    let mut cursor = replica.floor();
    let mut walked = 0;
    loop {
        let page = replica.page(&cursor, 7).unwrap();
        walked += page.events.len();
        cursor = page.next;
        if page.at_head {
            break;
        }
    }
    assert_eq!(walked, model.len(), "{step}: a walk returned every event");
}

/// Per stream, the `(first_seq, count, bytes)` of each block in the file.
fn layout(dir: &Path) -> Layout {
    let db = redb::Database::open(data_file(dir)).unwrap();
    let read = db.begin_read().unwrap();
    let blocks = read.open_table(BLOCKS).unwrap();
    let mut layout: BTreeMap<StreamId, Vec<(u64, u64, usize)>> = BTreeMap::new();
    for entry in blocks.iter().unwrap() {
        let (key, value) = entry.unwrap();
        let (stream, first_seq) = key.value();
        let value = value.value();
        let count = u32::from_le_bytes(value[..4].try_into().unwrap()) as u64;
        layout
            .entry(StreamId::new(stream))
            .or_default()
            .push((first_seq, count, value.len()));
    }
    layout
}

/// The file's blocks tile each stream's `floor+1 ..= head`.
fn check_layout(dir: &Path, model: &Model, step: &str) -> Layout {
    let layout = layout(dir);
    let mut ranges: BTreeMap<StreamId, (u64, u64)> = BTreeMap::new();
    for &(stream, seq) in model.keys() {
        let range = ranges.entry(stream).or_insert((seq, seq));
        range.1 = seq;
    }
    let streams: Vec<StreamId> = layout.keys().copied().collect();
    assert_eq!(
        streams,
        ranges.keys().copied().collect::<Vec<_>>(),
        "{step}: streams with blocks"
    );
    for (stream, blocks) in &layout {
        let (first, last) = ranges[stream];
        let mut next = first;
        for &(first_seq, count, bytes) in blocks {
            assert_eq!(
                first_seq, next,
                "{step}: stream {stream} blocks are contiguous"
            );
            assert!(
                (1..=BLOCK_EVENTS_MAX).contains(&count),
                "{step}: stream {stream} block at {first_seq} holds {count}"
            );
            assert!(
                count == 1 || bytes <= BLOCK_BYTES_TARGET,
                "{step}: a block of {count} events over the byte target ({bytes} bytes)"
            );
            next = first_seq + count;
        }
        assert_eq!(next - 1, last, "{step}: stream {stream} blocks end at head");
    }
    layout
}

/// Closes the store, checks the file's layout, reopens: the replica and
/// the layout read while it was closed.
fn reopen(
    replica: Replica<DiskStore>,
    dir: &Path,
    model: &Model,
    step: &str,
) -> (Replica<DiskStore>, Layout) {
    drop(replica);
    let layout = check_layout(dir, model, step);
    let replica = open(dir);
    check(&replica, model, step);
    (replica, layout)
}

fn firsts_and_counts(layout: &Layout, stream: StreamId) -> Vec<(u64, u64)> {
    layout[&stream]
        .iter()
        .map(|&(first, count, _)| (first, count))
        .collect()
}

#[test]
fn a_block_fills_up_exactly_and_the_next_event_starts_a_new_one() {
    let dir = scratch();
    let mut model = Model::new();
    let mut replica = open(dir.path());
    append(&mut replica, &mut model, &[10; 128], 1);
    let (mut replica, layout) = reopen(replica, dir.path(), &model, "128 events");
    assert_eq!(layout[&OWN], vec![(1, 128, 4 + 128 * 30 + 4)]);
    append(&mut replica, &mut model, &[10], 2);
    let (_, layout) = reopen(replica, dir.path(), &model, "129 events");
    assert_eq!(firsts_and_counts(&layout, OWN), vec![(1, 128), (129, 1)]);
}

#[test]
fn an_event_over_the_byte_target_is_a_block_of_its_own() {
    let dir = scratch();
    let mut model = Model::new();
    let mut replica = open(dir.path());
    append(&mut replica, &mut model, &[100, 100, 40_000, 100], 1);
    let (_, layout) = reopen(replica, dir.path(), &model, "a large event");
    assert_eq!(
        firsts_and_counts(&layout, OWN),
        vec![(1, 2), (3, 1), (4, 1)]
    );
}

#[test]
fn appends_extend_the_last_block_across_a_reopen() {
    let dir = scratch();
    let mut model = Model::new();
    let mut replica = open(dir.path());
    append(&mut replica, &mut model, &[20; 50], 1);
    let (mut replica, _) = reopen(replica, dir.path(), &model, "50 events");
    append(&mut replica, &mut model, &[20; 50], 2);
    let (_, layout) = reopen(replica, dir.path(), &model, "100 events");
    assert_eq!(firsts_and_counts(&layout, OWN), vec![(1, 100)]);
}

#[test]
fn a_floor_inside_a_block_rewrites_it_from_the_floor_and_one_at_its_end_rewrites_nothing() {
    let dir = scratch();
    let mut model = Model::new();
    let mut replica = open(dir.path());
    append(&mut replica, &mut model, &[30; 300], 1);
    // Inside the second block (129..=256).
    compact(&mut replica, &mut model, OWN, 200);
    check(&replica, &model, "floor 200");
    let (mut replica, layout) = reopen(replica, dir.path(), &model, "floor 200");
    assert_eq!(firsts_and_counts(&layout, OWN), vec![(201, 56), (257, 44)]);
    // At the end of a block: the next block is kept as it is.
    compact(&mut replica, &mut model, OWN, 256);
    let (mut replica, layout) = reopen(replica, dir.path(), &model, "floor 256");
    assert_eq!(firsts_and_counts(&layout, OWN), vec![(257, 44)]);
    // At the head: every block goes; appends start a new block.
    compact(&mut replica, &mut model, OWN, 300);
    let (mut replica, layout) = reopen(replica, dir.path(), &model, "floor 300");
    assert!(!layout.contains_key(&OWN));
    append(&mut replica, &mut model, &[30; 3], 2);
    let (_, layout) = reopen(replica, dir.path(), &model, "appended after the floor");
    assert_eq!(layout[&OWN], vec![(301, 3, 4 + 3 * 50 + 4)]);
}

/// Random appends (batches of 1 to 300, some payloads over the byte
/// target), received peer events, compactions to random floors (inside
/// blocks, at their ends, above the head) and reopens, against the model.
#[test]
fn random_appends_compactions_and_reopens_keep_the_blocks_equal_to_the_model() {
    let seed = seed::fresh();
    let _report = seed::Report::new(
        "random_appends_compactions_and_reopens_keep_the_blocks_equal_to_the_model",
        seed,
    );
    let mut rng = SplitMix64::new(seed);
    let dir = scratch();
    let mut model = Model::new();
    let mut replica = open(dir.path());
    for step in 0..60 {
        let name = format!("step {step}, seed {seed}");
        match rng.below(10) {
            0..=3 => {
                let len = if rng.chance(0.3) {
                    rng.between(1, 3)
                } else {
                    rng.between(1, 300)
                };
                let sizes: Vec<usize> = (0..len)
                    .map(|_| {
                        if rng.chance(0.02) {
                            rng.between(30_000, 70_000) as usize
                        } else {
                            rng.below(200) as usize
                        }
                    })
                    .collect();
                append(&mut replica, &mut model, &sizes, step);
            }
            4..=5 => {
                let count = rng.between(1, 150);
                receive(&mut replica, &mut model, count);
            }
            6..=7 => {
                let stream = if rng.chance(0.5) { OWN } else { PEER };
                let head = replica.marks().get(stream);
                let floor = replica.floor().get(stream);
                let target = match rng.below(4) {
                    0 => floor + rng.below(head.saturating_sub(floor) + 1),
                    1 => (head / BLOCK_EVENTS_MAX) * BLOCK_EVENTS_MAX,
                    2 => head,
                    _ => head + rng.between(1, 10),
                };
                if stream == PEER && target > head {
                    // A peer's floor above its head is learned the same way;
                    // keep the peer's seqs dense for `receive`.
                    continue;
                }
                compact(&mut replica, &mut model, stream, target.max(floor));
            }
            _ => {
                replica = reopen(replica, dir.path(), &model, &name).0;
                continue;
            }
        }
        check(&replica, &model, &name);
    }
    reopen(replica, dir.path(), &model, "the end");
}
