//! Pins and seals survive a restart (`docs/SIGNING.md`, "Seals";
//! `docs/STORAGE.md`, table `seals`): a replica that took a sealed stream
//! keeps, across a reopen of its store, the key it pinned (so a relay
//! cannot strip the seals, or reseal with another key, after a restart)
//! and the seals it kept (so it relays the stream sealed, to a receiver
//! that requires seals, delta by delta).
//!
//! Each test builds a keyed writer in memory and a relay on a `DiskStore`
//! (or a `MemStore`) in a scratch directory, reopens the relay, and checks
//! what it refuses and what it relays. A damaged `seals` record is refused
//! on open with a typed error naming the table and the stream, and a
//! format-4 file written before the table existed opens with no pins.

mod disk_support;

use std::path::Path;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Config, Delta, DeltaError, DiskError, DiskStore, MemStore, Replica, ReplicaError, Seal, Store,
    WriterKey,
};
use redb::{ReadableTable, TableDefinition};

use disk_support::{data_file, scratch};

/// A change to a record's bytes.
type Damage = fn(&mut Vec<u8>);

const SEALS: TableDefinition<u64, &[u8]> = TableDefinition::new("seals");
const RELAY: StreamId = StreamId::new(500);

fn writer(secret: u8, len: usize) -> Replica<MemStore> {
    let mut writer = Replica::open(
        Config::with_key(WriterKey::from_bytes([secret; 32])),
        MemStore::default(),
    )
    .expect("opens");
    for i in 0..len {
        writer
            .append(Bytes::from(format!("event {i} {}", "x".repeat(i % 40))))
            .expect("append");
    }
    writer
}

fn strict(id: u64) -> Replica<MemStore> {
    let config = Config {
        require_seals: true,
        ..Config::new(StreamId::new(id))
    };
    Replica::open(config, MemStore::default()).expect("opens")
}

/// Sends deltas within `budget` until `target` holds what `source` does,
/// each accepted.
fn sync<A: Store, B: Store>(source: &Replica<A>, target: &mut Replica<B>, budget: usize) -> usize {
    let mut deltas = 0;
    while !target.marks().dominates(&source.marks()) {
        let delta = source.delta_for(&target.marks(), budget);
        target
            .apply(&delta)
            .unwrap_or_else(|error| panic!("delta {deltas} refused: {error}"));
        deltas += 1;
        assert!(deltas < 10_000, "no end");
    }
    deltas
}

fn open_relay(dir: &Path) -> Replica<DiskStore> {
    let store = DiskStore::open(dir).expect("the store opens");
    Replica::open(Config::new(RELAY), store).expect("the replica opens")
}

/// What a reopened relay must still do: refuse the stream unsealed and
/// sealed by a stranger, and relay it sealed to a receiver that requires
/// seals, delta by delta.
fn check_pinned_and_relaying<S: Store>(relay: &mut Replica<S>, writer: &mut Replica<MemStore>) {
    let stream = writer.stream();
    writer.append(&b"after the restart"[..]).expect("append");
    let honest = writer.delta_for(&relay.marks(), usize::MAX);
    assert_eq!(honest.events.len(), 1);
    let mut unsealed = honest.clone();
    unsealed.seals.clear();
    let head = relay.marks().get(stream);
    assert_eq!(
        refused(relay, &unsealed),
        DeltaError::Unsealed {
            stream,
            seq: head + 1
        },
        "the pin survives the reopen"
    );
    let stranger = WriterKey::from_bytes([99; 32]);
    let mut resealed = honest.clone();
    resealed.seals[0].key = stranger.public();
    resealed.seals[0].seal = Seal::sign_for(&stranger, stream, head + 1, honest.seals[0].seal.head);
    assert_eq!(
        refused(relay, &resealed),
        DeltaError::KeyMismatch {
            stream,
            derived: stranger.stream()
        }
    );
    // The seals kept before the restart: relayed, the stream ends at them.
    let mut newcomer = strict(501);
    let deltas = sync(relay, &mut newcomer, 1_500);
    assert!(deltas > 1, "relayed by more than one delta ({deltas})");
    relay.apply(&honest).expect("the honest run is taken");
    sync(relay, &mut newcomer, 1_500);
    assert_eq!(
        newcomer.chain_digest().stream(stream),
        writer.chain_digest().stream(stream)
    );
}

fn refused<S: Store>(replica: &mut Replica<S>, delta: &Delta) -> DeltaError {
    let marks = replica.marks();
    let error = match replica.apply(delta) {
        Err(ReplicaError::Delta(error)) => error,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(replica.marks(), marks);
    error
}

#[test]
fn a_reopened_disk_replica_keeps_its_pin_and_relays_sealed() {
    let dir = scratch();
    let mut writer = writer(71, 120);
    {
        let mut relay = open_relay(dir.path());
        let deltas = sync(&writer, &mut relay, 1_000);
        assert!(deltas > 3, "taken by many deltas ({deltas})");
    }
    let mut relay = open_relay(dir.path());
    relay.verify().expect("verifies");
    check_pinned_and_relaying(&mut relay, &mut writer);
    // And again, after the commit that moved the seals.
    drop(relay);
    let mut relay = open_relay(dir.path());
    check_pinned_and_relaying(&mut relay, &mut writer);
}

#[test]
fn a_reopened_memory_replica_keeps_its_pin_and_relays_sealed() {
    let mut writer = writer(72, 120);
    let mut relay = Replica::open(Config::new(RELAY), MemStore::default()).expect("opens");
    sync(&writer, &mut relay, 1_000);
    let mut relay = Replica::open(Config::new(RELAY), relay.into_store()).expect("reopens");
    check_pinned_and_relaying(&mut relay, &mut writer);
}

/// A compaction over kept seals drops them in the same commit: the
/// reopened store holds none at or below the floor, and relays the rest.
#[test]
fn a_compaction_drops_the_seals_below_the_floor_on_disk_too() {
    let dir = scratch();
    let mut writer = writer(73, 80);
    let stream = writer.stream();
    {
        let mut relay = open_relay(dir.path());
        sync(&writer, &mut relay, 800);
        relay
            .compact(&[(stream, 40)].into_iter().collect())
            .expect("compacts");
    }
    let mut relay = open_relay(dir.path());
    let meta = relay.store().meta().expect("meta");
    let kept = &meta.seals[&stream];
    assert!(kept.seals.iter().all(|seal| seal.seq > 40));
    assert_eq!(kept.seals.last().map(|s| s.seq), Some(80));
    check_pinned_and_relaying(&mut relay, &mut writer);
}

/// A format-4 file written before the `seals` table existed opens with no
/// pins: the stream is taken unsealed, as any stream nobody sealed.
#[test]
fn a_format_4_file_without_the_seals_table_holds_no_pins() {
    let dir = scratch();
    let mut writer = writer(74, 10);
    {
        let mut relay = open_relay(dir.path());
        sync(&writer, &mut relay, usize::MAX);
    }
    {
        let db = redb::Database::open(data_file(dir.path())).expect("opens");
        let txn = db.begin_write().expect("write");
        assert!(
            txn.delete_table(SEALS).expect("deletes"),
            "the table was there"
        );
        txn.commit().expect("commits");
    }
    let mut relay = open_relay(dir.path());
    assert!(relay.store().meta().expect("meta").seals.is_empty());
    let delta = relay.delta_for(&VersionVector::new(), usize::MAX);
    assert!(
        delta.seals.is_empty(),
        "nothing kept, nothing relayed sealed"
    );
    // The next sealed run creates the table, and pins again.
    writer.append(&b"next"[..]).expect("append");
    sync(&writer, &mut relay, usize::MAX);
    drop(relay);
    let relay = open_relay(dir.path());
    let meta = relay.store().meta().expect("meta");
    let kept = &meta.seals[&writer.stream()];
    assert_eq!(kept.seals.last().map(|s| s.seq), Some(11));
}

/// A damaged `seals` record (a flipped bit, a count above the bound, a
/// seal outside its stream's range) is refused on open, naming the table
/// and the stream: untrusted bytes decode totally.
#[test]
fn a_damaged_seals_record_is_refused_naming_the_table_and_the_stream() {
    let writer = writer(75, 10);
    let stream = writer.stream();
    let damages: [(&str, Damage); 4] = [
        ("checksum", |record| record[40] ^= 1),
        ("above the 72 kept", |record| {
            record[32..36].copy_from_slice(&u32::MAX.to_le_bytes())
        }),
        ("bytes where", |record| record.truncate(record.len() - 1)),
        ("fewer than", |record| record.truncate(3)),
    ];
    for (expected, damage) in damages {
        let dir = scratch();
        {
            let mut relay = open_relay(dir.path());
            sync(&writer, &mut relay, usize::MAX);
        }
        {
            let db = redb::Database::open(data_file(dir.path())).expect("opens");
            let txn = db.begin_write().expect("write");
            {
                let mut table = txn.open_table(SEALS).expect("the table");
                let mut record = table
                    .get(stream.get())
                    .expect("reads")
                    .expect("a record")
                    .value()
                    .to_vec();
                damage(&mut record);
                table
                    .insert(stream.get(), record.as_slice())
                    .expect("writes");
            }
            txn.commit().expect("commits");
        }
        match DiskStore::open(dir.path()) {
            Err(DiskError::Corrupt { detail, .. }) => {
                assert!(
                    detail.contains(&format!("the seals record of stream {stream}"))
                        && detail.contains(expected),
                    "{detail}"
                );
            }
            other => panic!("expected Corrupt for {expected}, got {other:?}"),
        }
    }
}
