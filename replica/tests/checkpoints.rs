//! Checkpoints in the replica (issue 27, `docs/TOKEN.md` "Version 2"): a
//! replica mints them from its marks (rate-limited, the time an argument),
//! keeps 16 by name (those of the most events) on both stores across a reopen, answers each
//! page the shortest token (version 2 against a checkpoint kept, or
//! version 1), and reads a token of either version back, here or on a
//! replica that received the checkpoint; one naming a checkpoint it does
//! not keep is a typed `UnknownCheckpoint`, never a guess. Randomized
//! tests take a seed (`MESHLOG_SEED` replays one) and print it on failure.

mod common;
mod disk_support;

use bytes::Bytes;
use meshlog_cursor::token::{self, Token};
use meshlog_cursor::{Checkpoint, StreamId, VersionVector};
use meshlog_replica::{
    Config, Delta, DiskError, DiskStore, Event, MemStore, PageError, Replica, SharedReplica, Store,
    CHECKPOINTS_KEPT, CHECKPOINT_INTERVAL_MS,
};
use meshlog_testkit::{seed, SplitMix64};
use redb::{ReadableTable, TableDefinition};

/// A time well past the epoch, so that the first mint is always due.
const T0: u64 = 1_700_000_000_000;

/// A delta of one event on each of `streams`, at `seq` (so each stream's
/// events come in order from 1), stamped from `lamport`.
fn delta(streams: &[StreamId], seq: u64, lamport: u64) -> Delta {
    let events = streams
        .iter()
        .enumerate()
        .map(|(i, &stream)| Event {
            stream,
            seq,
            lamport: lamport + i as u64,
            time_ms: 0,
            payload: Bytes::from_static(b"x"),
        })
        .collect();
    Delta {
        events,
        ..Delta::default()
    }
}

/// `count` random 64-bit stream ids, ascending, none the reader's own.
fn random_streams(rng: &mut SplitMix64, count: usize) -> Vec<StreamId> {
    let mut streams: Vec<StreamId> = (0..count)
        .map(|_| StreamId::new(rng.next_u64() | 1 << 63))
        .collect();
    streams.sort_unstable();
    streams.dedup();
    streams
}

/// A replica holding one event of each of `streams` (applied as peers'
/// deltas), on `store`.
fn holding<S: Store>(store: S, streams: &[StreamId]) -> Replica<S> {
    let mut replica = Replica::open(Config::new(StreamId::new(1)), store).expect("open");
    for chunk in streams.chunks(4096) {
        replica.apply(&delta(chunk, 1, 1)).expect("apply");
    }
    replica
}

fn is_relative(text: &str) -> bool {
    matches!(token::decode_any_text(text), Ok(Token::Relative(_)))
}

#[test]
fn a_mint_is_due_only_past_the_bound_and_the_interval() {
    let streams: Vec<StreamId> = (2..=400).map(StreamId::new).collect();
    let mut replica = holding(MemStore::default(), &streams);
    let first = replica.mint_checkpoint(T0).expect("mint").expect("due");
    assert_eq!(first.vector(), &replica.marks());
    assert_eq!(replica.checkpoints(), vec![first.clone()]);
    // The marks moved on more than 128 streams, but within the interval.
    replica
        .apply(&delta(&streams[..200], 2, 1_000))
        .expect("apply");
    let soon = T0 + CHECKPOINT_INTERVAL_MS - 1;
    assert_eq!(replica.mint_checkpoint(soon).expect("mint"), None);
    // Past the interval and its jitter (at most half the interval).
    let late = T0 + CHECKPOINT_INTERVAL_MS * 3 / 2;
    let second = replica.mint_checkpoint(late).expect("mint").expect("due");
    assert_eq!(second.vector(), &replica.marks());
    // Within 128 streams of one kept: never due, however late.
    replica
        .apply(&delta(&streams[..128], 3, 5_000))
        .expect("apply");
    assert_eq!(replica.mint_checkpoint(u64::MAX).expect("mint"), None);
    assert_eq!(replica.checkpoints(), vec![first, second]);
}

#[test]
fn the_16_of_the_most_events_are_kept_by_name_and_a_reopen_keeps_them_in_memory() {
    let streams: Vec<StreamId> = (2..=200).map(StreamId::new).collect();
    let replica = holding(MemStore::default(), &streams);
    let kept = keep_twenty(replica);
    let reopened = Replica::open(Config::new(StreamId::new(1)), kept.0.into_store()).expect("open");
    assert_eq!(reopened.checkpoints(), kept.1);
}

#[test]
fn the_16_of_the_most_events_are_kept_by_name_and_a_reopen_keeps_them_on_disk() {
    let dir = tempfile::tempdir().expect("scratch dir");
    let streams: Vec<StreamId> = (2..=200).map(StreamId::new).collect();
    let replica = holding(DiskStore::open(dir.path()).expect("open store"), &streams);
    let (replica, kept) = keep_twenty(replica);
    drop(replica);
    let store = DiskStore::open(dir.path()).expect("reopen store");
    let reopened = Replica::open(Config::new(StreamId::new(1)), store).expect("open");
    assert_eq!(reopened.checkpoints(), kept);
    // A token relative to one of them still reads after the reopen.
    let newest = kept.last().expect("kept");
    let relative = token::encode_relative_text(newest.vector(), newest).expect("encodes");
    assert_eq!(&reopened.cursor(&relative).expect("kept"), newest.vector());
}

/// Keeps 20 checkpoints (minted and received, each of more events than
/// the one before); answers the replica and the 16 it must keep (those
/// of the most events), oldest first.
fn keep_twenty<S: Store>(mut replica: Replica<S>) -> (Replica<S>, Vec<Checkpoint>) {
    let minted = replica.mint_checkpoint(T0).expect("mint").expect("due");
    let mut all = vec![minted.clone()];
    for seq in 1..=19u64 {
        let mut vector = minted.vector().clone();
        vector.advance(StreamId::new(10_000), seq);
        let checkpoint = Checkpoint::new(vector).expect("named");
        assert!(replica.keep_checkpoint(checkpoint.clone()).expect("keep"));
        assert!(!replica
            .keep_checkpoint(checkpoint.clone())
            .expect("keep again"));
        all.push(checkpoint);
    }
    let kept = all.split_off(all.len() - CHECKPOINTS_KEPT);
    assert_eq!(replica.checkpoints(), kept);
    for checkpoint in &kept {
        assert_eq!(
            replica.checkpoint(checkpoint.name()).as_ref(),
            Some(checkpoint)
        );
    }
    (replica, kept)
}

#[test]
fn a_token_from_one_replica_reads_at_another_once_it_keeps_the_checkpoint() {
    let mut rng = SplitMix64::new(seed::replay_or(27));
    let streams = random_streams(&mut rng, 1_000);
    let mut a = holding(MemStore::default(), &streams);
    let mut b = holding(MemStore::default(), &streams);
    let checkpoint = a.mint_checkpoint(T0).expect("mint").expect("due");
    // Both move on a few streams; a reader walks A to its head.
    a.apply(&delta(&streams[..5], 2, 9_000)).expect("apply");
    b.apply(&delta(&streams[..5], 2, 9_000)).expect("apply");
    let head = a.page(&VersionVector::new(), 2_000).expect("page");
    assert!(head.at_head);
    assert!(is_relative(&head.token), "the head token is version 2");
    let v1 = token::encode_text(&head.next).expect("encodes");
    println!(
        "head token at 1,000 random streams: {} chars (version 1: {})",
        head.token.len(),
        v1.len()
    );
    assert!(head.token.len() < 100 && v1.len() > 10_000);
    // B does not keep it: a typed refusal naming it, never a guess.
    match b.cursor(&head.token) {
        Err(PageError::UnknownCheckpoint { name }) => assert_eq!(name, checkpoint.name()),
        other => panic!("expected UnknownCheckpoint, got {other:?}"),
    }
    // The version-1 form reads anywhere.
    assert_eq!(b.cursor(&v1).expect("version 1"), head.next);
    // Once B keeps the checkpoint (as gossip delivers it), the token reads.
    assert!(b.keep_checkpoint(checkpoint).expect("keep"));
    assert_eq!(b.cursor(&head.token).expect("version 2"), head.next);
    let at_b = b.page(&head.next, 10).expect("page");
    assert!(at_b.events.is_empty() && at_b.at_head);
    assert_eq!(
        at_b.token, head.token,
        "both answer the same shortest token"
    );
}

/// `token(cursor)` (the follow frames' tokens, issue 27) is the rule of
/// `Page::token`: for a page's `next` it is the page's token, on the
/// replica and its shared handle; for a cursor far from every checkpoint
/// kept it is version 1.
#[test]
fn a_cursors_token_is_the_one_a_page_answers_for_it() {
    let mut rng = SplitMix64::new(seed::replay_or(27));
    let streams = random_streams(&mut rng, 300);
    let mut replica = holding(MemStore::default(), &streams);
    replica.mint_checkpoint(T0).expect("mint").expect("due");
    replica
        .apply(&delta(&streams[..5], 2, 9_000))
        .expect("apply");
    let head = replica.page(&VersionVector::new(), 1_000).expect("page");
    assert!(is_relative(&head.token));
    assert_eq!(replica.token(&head.next).expect("token"), head.token);
    let shared = SharedReplica::new(replica);
    assert_eq!(shared.token(&head.next).expect("token"), head.token);
    let first: VersionVector = [(streams[0], 1)].into_iter().collect();
    let far = shared.token(&first).expect("token");
    assert_eq!(far, token::encode_text(&first).expect("encodes"));
}

#[test]
fn every_token_accepted_today_reads_as_it_did() {
    let replica = Replica::new(StreamId::new(1));
    let vectors = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../cursor/tests/vectors.txt"
    ))
    .expect("the version-1 vectors");
    let mut valid = 0;
    for line in vectors
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let fields: Vec<&str> = line.split(' ').collect();
        let text = fields[2];
        match fields[0] {
            "valid" => {
                let expected = token::decode_text(text).expect("a valid vector");
                assert_eq!(replica.cursor(text).expect(line), expected, "{line}");
                valid += 1;
            }
            _ => assert!(replica.cursor(text).is_err(), "{line}"),
        }
    }
    assert!(valid >= 10, "the vectors were read");
}

#[test]
fn a_cursor_pages_identically_from_either_version() {
    seed::for_each_seed(
        "a_cursor_pages_identically_from_either_version",
        0x2727,
        16,
        |seed| {
            let mut rng = SplitMix64::new(seed);
            let streams = random_streams(&mut rng, 300);
            let mut replica = holding(MemStore::default(), &streams);
            for round in 0..6u64 {
                let moved: Vec<StreamId> = streams
                    .iter()
                    .copied()
                    .filter(|_| rng.chance(0.5))
                    .collect();
                let marks = replica.marks();
                let events = moved
                    .iter()
                    .enumerate()
                    .map(|(i, &stream)| Event {
                        stream,
                        seq: marks.get(stream) + 1,
                        lamport: 10_000 * (round + 1) + i as u64,
                        time_ms: 0,
                        payload: Bytes::from_static(b"y"),
                    })
                    .collect();
                replica
                    .apply(&Delta {
                        events,
                        ..Delta::default()
                    })
                    .expect("apply");
                let now = T0 + round * CHECKPOINT_INTERVAL_MS * 2;
                replica.mint_checkpoint(now).expect("mint");
            }
            for _ in 0..40 {
                let cursor = random_cursor(&mut rng, &replica.marks());
                let v1 = token::encode_text(&cursor).expect("encodes");
                let by_v1 = replica.page(&replica.cursor(&v1).expect("v1"), 50);
                for checkpoint in replica.checkpoints() {
                    let Ok(v2) = token::encode_relative_text(&cursor, &checkpoint) else {
                        continue;
                    };
                    let by_v2 = replica.page(&replica.cursor(&v2).expect("v2"), 50);
                    assert_eq!(by_v2, by_v1, "seed {seed}: {v2} against {v1}");
                }
                if let Ok(page) = &by_v1 {
                    assert_eq!(replica.cursor(&page.token).expect("own token"), page.next);
                    assert!(page.token.len() <= token::encode_text(&page.next).unwrap().len());
                }
            }
        },
    );
}

/// A cursor near `marks`: each stream at, a little behind, or ahead of its
/// mark, or absent.
fn random_cursor(rng: &mut SplitMix64, marks: &VersionVector) -> VersionVector {
    marks
        .iter()
        .filter_map(|(stream, seq)| match rng.below(8) {
            0 => None,
            1 => Some((stream, seq + rng.below(3))),
            2 | 3 => Some((stream, seq.saturating_sub(rng.below(3)))),
            _ => Some((stream, seq)),
        })
        .filter(|&(_, seq)| seq > 0)
        .collect()
}

#[test]
fn the_head_token_of_a_replica_holding_10000_streams_is_under_2_kb() {
    let mut rng = SplitMix64::new(seed::replay_or(10_000));
    let streams = random_streams(&mut rng, 10_000);
    let mut replica = holding(MemStore::default(), &streams);
    replica.mint_checkpoint(T0).expect("mint").expect("due");
    // Writes go on after the mint on 128 of the streams, a few events each.
    let mut moved = streams.clone();
    rng.shuffle(&mut moved);
    moved.truncate(128);
    moved.sort_unstable();
    for seq in 2..=4 {
        replica
            .apply(&delta(&moved, seq, seq * 20_000))
            .expect("apply");
    }
    let head = replica.page(&replica.marks(), 1).expect("page");
    let v1 = token::encode_text(&head.next).expect("encodes");
    println!(
        "head token at 10,000 random streams, 128 moved since the checkpoint: {} chars \
         (version 1: {} chars)",
        head.token.len(),
        v1.len()
    );
    assert!(is_relative(&head.token));
    assert!(head.token.len() <= 2048, "{} chars", head.token.len());
}

#[test]
fn a_shared_replica_mints_keeps_and_answers_as_the_owner_does() {
    let streams: Vec<StreamId> = (2..=300).map(StreamId::new).collect();
    let shared = SharedReplica::in_memory(StreamId::new(1));
    shared.apply(delta(&streams, 1, 1)).expect("apply");
    let minted = shared.mint_checkpoint(T0).expect("mint").expect("due");
    assert_eq!(shared.mint_checkpoint(T0 + 1).expect("mint"), None);
    assert_eq!(shared.checkpoints(), vec![minted.clone()]);
    assert!(!shared.keep_checkpoint(minted.clone()).expect("keep"));
    assert_eq!(shared.checkpoint(minted.name()), Some(minted));
    let page = shared.page(&VersionVector::new(), 1_000).expect("page");
    assert!(is_relative(&page.token), "{}", page.token);
    assert_eq!(shared.cursor(&page.token).expect("own token"), page.next);
}

/// A damaged `checkpoints` record (a flipped bit, a hole in the positions)
/// is refused on open, naming the table and the position: the record is
/// a version-1 token, decoded totally.
#[test]
fn a_damaged_checkpoint_record_is_refused_naming_its_position() {
    const CHECKPOINTS: TableDefinition<u64, &[u8]> = TableDefinition::new("checkpoints");
    type Damage = fn(&redb::WriteTransaction);
    let cases: [(&str, Damage); 2] = [
        ("the checkpoint record at position 0", |txn| {
            let mut table = txn.open_table(CHECKPOINTS).expect("the table");
            let mut record = table
                .get(0)
                .expect("reads")
                .expect("a record")
                .value()
                .to_vec();
            record[2] ^= 1;
            table.insert(0, record.as_slice()).expect("writes");
        }),
        ("position 5 after 1 records", |txn| {
            let mut table = txn.open_table(CHECKPOINTS).expect("the table");
            let record = table
                .remove(1)
                .expect("reads")
                .expect("a record")
                .value()
                .to_vec();
            table.insert(5, record.as_slice()).expect("writes");
        }),
    ];
    for (expected, damage) in cases {
        let dir = tempfile::tempdir().expect("scratch dir");
        {
            let streams: Vec<StreamId> = (2..=10).map(StreamId::new).collect();
            let mut replica = holding(DiskStore::open(dir.path()).expect("open store"), &streams);
            replica.mint_checkpoint(T0).expect("mint").expect("due");
            let other = Checkpoint::new([(StreamId::new(3), 9)].into_iter().collect()).unwrap();
            replica.keep_checkpoint(other).expect("keep");
        }
        {
            let db = redb::Database::open(disk_support::data_file(dir.path())).expect("opens");
            let txn = db.begin_write().expect("write");
            damage(&txn);
            txn.commit().expect("commits");
        }
        match DiskStore::open(dir.path()) {
            Err(DiskError::Corrupt { detail, .. }) => {
                assert!(detail.contains(expected), "{expected}: {detail}");
            }
            other => panic!("expected Corrupt for {expected}, got {other:?}"),
        }
    }
}

/// One minter at a time (`docs/TOKEN.md`, "What is built", item 1): a
/// replica that kept a checkpoint a peer minted does not mint at its next
/// call, however far its marks moved, but only once the interval and the
/// deferral's jitter (at most 20 s) have passed. The rule of the marks
/// and the time alone minted at once (nothing kept within the bound, none
/// minted before).
#[test]
fn a_replica_that_kept_a_peers_checkpoint_leaves_the_minting_to_it() {
    let streams: Vec<StreamId> = (2..=400).map(StreamId::new).collect();
    let mut replica = holding(MemStore::default(), &streams);
    // A peer's checkpoint, far from this replica's marks.
    let theirs: VersionVector = [(StreamId::new(9_999), 3)].into_iter().collect();
    let theirs = Checkpoint::new(theirs).expect("named");
    assert!(replica.keep_checkpoint(theirs).expect("keep"));
    assert_eq!(replica.mint_checkpoint(T0).expect("mint"), None);
    assert_eq!(
        replica
            .mint_checkpoint(T0 + CHECKPOINT_INTERVAL_MS)
            .expect("mint"),
        None
    );
    let past = T0 + CHECKPOINT_INTERVAL_MS + 20_000;
    let minted = replica.mint_checkpoint(past).expect("mint").expect("due");
    assert_eq!(minted.vector(), &replica.marks());
}

/// Ten replicas under writes that move every one's marks past the bound
/// each second, each asked to mint once a second (as their sessions ask),
/// every checkpoint minted kept by the others before the next second (a
/// gossip faster than a mint interval): after the first second, when all
/// mint (none keeps any), one replica mints at a time; when it stops, one
/// of the others takes over within the interval and the deferral's
/// jitter. The rule of the marks and the time alone had each mint every
/// 2-3 s: about 200 mints in the minute, where the gossip sends each over
/// every link.
#[test]
fn a_mesh_under_writes_mints_one_checkpoint_at_a_time() {
    let shared: Vec<StreamId> = (2..=300).map(StreamId::new).collect();
    // Each its own stream id: the deferral's jitter is drawn from it.
    let mut replicas: Vec<Replica<MemStore>> = (0..10)
        .map(|i| {
            let config = Config::new(StreamId::new(500 + i));
            let mut replica = Replica::open(config, MemStore::default()).expect("open");
            replica.apply(&delta(&shared, 1, 1)).expect("apply");
            replica
        })
        .collect();
    let mut minters: Vec<Vec<usize>> = Vec::new();
    let mut stopped = None;
    for round in 0..90u64 {
        let now = T0 + round * 1_000;
        let mut minted = Vec::new();
        for (i, replica) in replicas.iter_mut().enumerate() {
            // Every shared stream moves, and one of the replica's own (so
            // that no two replicas' marks are equal).
            let mut writes = delta(&shared, round + 2, 10_000 * (round + 1));
            writes.events.push(Event {
                stream: StreamId::new(1_000 + i as u64),
                seq: round + 1,
                lamport: 10_000 * (round + 1) + 5_000,
                time_ms: 0,
                payload: Bytes::from_static(b"o"),
            });
            replica.apply(&writes).expect("apply");
            if stopped == Some(i) {
                continue;
            }
            if let Some(checkpoint) = replica.mint_checkpoint(now).expect("mint") {
                minted.push((i, checkpoint));
            }
        }
        for (from, checkpoint) in &minted {
            for (i, replica) in replicas.iter_mut().enumerate() {
                if i != *from && stopped != Some(i) {
                    replica.keep_checkpoint(checkpoint.clone()).expect("keep");
                }
            }
        }
        minters.push(minted.iter().map(|(i, _)| *i).collect());
        if round == 45 {
            // The minter stops minting (it went down).
            stopped = minters[..=45].iter().rev().flatten().next().copied();
        }
    }
    println!("minters by second: {minters:?}");
    assert_eq!(minters[0].len(), 10, "at first every replica mints");
    assert!(
        minters[1..].iter().all(|m| m.len() <= 1),
        "two replicas minted in one second: {minters:?}"
    );
    // The mesh still mints: once each 2-3 s while a minter is up.
    let before_stop = minters[1..=45].iter().flatten().count();
    assert!((12..=23).contains(&before_stop), "{before_stop} mints");
    // Another takes over within the interval and the deferral's jitter.
    let stopped = stopped.expect("a minter");
    let takeover = minters[46..]
        .iter()
        .position(|m| !m.is_empty())
        .expect("another replica takes over");
    assert!(takeover <= 23, "took over after {takeover} s");
    assert!(minters[46..].iter().flatten().all(|&i| i != stopped));
}

/// A mesh started at once mints more checkpoints than a replica keeps
/// (each replica one, at its first call), and gossip offers each replica
/// every one of them, again and again, in any order. Each replica must
/// end with the same 16, and a checkpoint it dropped must never be kept
/// again: dropping the oldest to arrive, a dropped one came back, was
/// kept again and sent on again, without end (the simulator's 1,000
/// replicas never got past their start).
#[test]
fn gossip_of_more_checkpoints_than_kept_settles_on_the_same_16_everywhere() {
    let seed = seed::replay_or(29);
    let mut rng = SplitMix64::new(seed);
    // 40 replicas' first checkpoints: each its own stream, a few events,
    // none dominating another.
    let minted: Vec<Checkpoint> = (0..40u64)
        .map(|at| {
            let vector: VersionVector = [(StreamId::new(100 + at), 1 + rng.below(5))]
                .into_iter()
                .collect();
            Checkpoint::new(vector).expect("named")
        })
        .collect();
    let mut ends = Vec::new();
    for replica_at in 0..3 {
        let mut replica = Replica::open(
            Config::new(StreamId::new(1 + replica_at)),
            MemStore::default(),
        )
        .expect("open");
        let (mut ever_kept, mut dropped) = (Vec::new(), Vec::new());
        for round in 0..4 {
            let mut order = minted.clone();
            rng.shuffle(&mut order);
            for checkpoint in order {
                let kept = replica.keep_checkpoint(checkpoint.clone()).expect("keep");
                assert!(
                    !(kept && dropped.contains(&checkpoint.name())),
                    "seed {seed}: replica {replica_at}, round {round}: {} was dropped and kept again",
                    checkpoint.name()
                );
                if kept {
                    ever_kept.push(checkpoint.name());
                }
                let now: Vec<_> = replica.checkpoints().iter().map(Checkpoint::name).collect();
                dropped = ever_kept
                    .iter()
                    .filter(|name| !now.contains(name))
                    .copied()
                    .collect();
            }
        }
        let mut names: Vec<_> = replica.checkpoints().iter().map(Checkpoint::name).collect();
        names.sort();
        assert_eq!(names.len(), CHECKPOINTS_KEPT, "seed {seed}");
        ends.push(names);
    }
    assert!(
        ends.windows(2).all(|pair| pair[0] == pair[1]),
        "seed {seed}: replicas offered the same checkpoints in other orders keep other ones"
    );
}
