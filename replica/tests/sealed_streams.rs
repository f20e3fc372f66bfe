//! Sealed streams at the replica (`docs/SIGNING.md`, "Seals"): a keyed
//! replica seals its own stream's head lazily, once per head, and the seal
//! vouches for exactly the chain it holds.
//!
//! Each test builds keyed replicas from fixed secrets and checks what the
//! seal says against the replica's own chain, and how often it signed
//! (`Stats::seals_signed`). Then a hostile relay between a keyed writer
//! and a receiver: each tampering with a sealed delta (an event forged,
//! altered or reordered, a seal cut off, replaced with an older one or by
//! another key, two writers' runs spliced) is refused with its typed
//! reason, the receiver unchanged (marks, floor, chain digest, held
//! events), and the honest delta is still taken afterwards.

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Config, Delta, DeltaError, Event, MemStore, Replica, ReplicaError, RunSeal, Seal, WriterKey,
};
use meshlog_testkit::Snapshot;

fn keyed(secret: u8) -> (WriterKey, Replica<MemStore>) {
    let key = WriterKey::from_bytes([secret; 32]);
    let replica = Replica::open(Config::with_key(key.clone()), MemStore::default())
        .expect("an empty store opens");
    (key, replica)
}

#[test]
fn a_keyed_replica_seals_its_head_once_until_the_head_moves() {
    let (key, mut writer) = keyed(7);
    assert_eq!(writer.stream(), key.stream());
    assert_eq!(writer.own_seal(), None, "nothing to seal before an append");
    writer.append(&b"one"[..]).expect("append");
    writer.append(&b"two"[..]).expect("append");
    let seal = writer.own_seal().expect("a keyed replica seals its head");
    assert_eq!((seal.stream, seal.seq), (key.stream(), 2));
    let chain = writer.chain(key.stream()).expect("the own stream is held");
    assert_eq!(
        seal.head, chain.head_hash,
        "the seal is over the chain held"
    );
    seal.verify(&key.public()).expect("its key signs it");
    // Asked again (another delta) at the same head: the kept seal.
    let _ = writer.delta_for(&VersionVector::new(), usize::MAX);
    assert_eq!(writer.own_seal(), Some(seal));
    assert_eq!(writer.stats().seals_signed, 1, "one signature per head");
    // The head moves: a new seal, signed once more.
    writer.append(&b"three"[..]).expect("append");
    let next = writer.own_seal().expect("sealed");
    assert_eq!(next.seq, 3);
    assert_eq!(next.head, writer.chain(key.stream()).unwrap().head_hash);
    next.verify(&key.public()).expect("its key signs it");
    assert_eq!(writer.stats().seals_signed, 2);
}

#[test]
fn an_unkeyed_replica_seals_nothing() {
    let mut replica = Replica::new(StreamId::new(5));
    replica.append(&b"one"[..]).expect("append");
    assert_eq!(replica.own_seal(), None);
    assert_eq!(replica.stats().seals_signed, 0);
}

/// What a refusal must leave unchanged.
fn snapshot(replica: &Replica<MemStore>) -> Snapshot {
    Snapshot::new(
        replica.marks(),
        replica.floor(),
        replica.chain_digest(),
        |stream, seq| replica.get(stream, seq),
    )
}

/// A keyed writer with `len` events, and a receiver that took its first
/// `taken` through an honest sealed delta.
fn writer_and_receiver(
    len: usize,
    taken: u64,
) -> (WriterKey, Replica<MemStore>, Replica<MemStore>) {
    let (key, mut writer) = keyed(11);
    let mut receiver = Replica::open(
        Config {
            require_seals: true,
            ..Config::with_key(WriterKey::from_bytes([12; 32]))
        },
        MemStore::default(),
    )
    .expect("opens");
    for i in 0..len {
        writer
            .append(Bytes::from(format!("event {i}")))
            .expect("append");
        if i as u64 + 1 == taken {
            let delta = writer.delta_for(&receiver.marks(), usize::MAX);
            receiver.apply(&delta).expect("the honest delta is taken");
        }
    }
    (key, writer, receiver)
}

fn refused(receiver: &mut Replica<MemStore>, delta: &Delta) -> DeltaError {
    let before = snapshot(receiver);
    let error = match receiver.apply(delta) {
        Err(ReplicaError::Delta(error)) => error,
        other => panic!("the tampered delta must be refused, got {other:?}"),
    };
    assert_eq!(snapshot(receiver), before, "a refusal changes nothing");
    error
}

#[test]
fn an_honest_sealed_delta_is_taken_and_chains_alike() {
    let (key, writer, mut receiver) = writer_and_receiver(5, 2);
    let delta = writer.delta_for(&receiver.marks(), usize::MAX);
    assert_eq!(delta.seals.len(), 1);
    assert_eq!(delta.seals[0].key, key.public());
    assert_eq!(delta.seals[0].seal.seq, 5);
    receiver.apply(&delta).expect("taken");
    assert_eq!(
        receiver.chain(key.stream()).unwrap().head_hash,
        writer.chain(key.stream()).unwrap().head_hash
    );
}

#[test]
fn a_hostile_relay_is_refused_with_its_reason_and_changes_nothing() {
    let (key, writer, mut receiver) = writer_and_receiver(5, 2);
    let stream = key.stream();
    let honest = writer.delta_for(&receiver.marks(), usize::MAX);
    assert_eq!(honest.events.len(), 3);
    let broken = |seq| DeltaError::ChainBroken { stream, seq };
    let with_events = |events: Vec<Event>| Delta {
        events,
        ..honest.clone()
    };
    let mut events = honest.events.clone();

    // A payload altered.
    events[1].payload = Bytes::from_static(b"forged");
    assert_eq!(refused(&mut receiver, &with_events(events)), broken(5));
    // A lamport altered (still rising, so only the chain can tell).
    let mut events = honest.events.clone();
    events[2].lamport += 1;
    assert_eq!(refused(&mut receiver, &with_events(events)), broken(5));
    // A time altered.
    let mut events = honest.events.clone();
    events[0].time_ms += 1;
    assert_eq!(refused(&mut receiver, &with_events(events)), broken(5));
    // Two events' contents swapped inside the run (seqs kept).
    let mut events = honest.events.clone();
    let (a, b) = (events[0].payload.clone(), events[1].payload.clone());
    events[0].payload = b;
    events[1].payload = a;
    assert_eq!(refused(&mut receiver, &with_events(events)), broken(5));
    // The writer's next event forged onto the run, under the seal.
    let mut events = honest.events.clone();
    let mut next = events[2].clone();
    next.seq += 1;
    next.lamport += 1;
    events.push(next);
    assert_eq!(refused(&mut receiver, &with_events(events)), broken(5));
    // The seal cut off: seals are required.
    let cut = Delta {
        seals: Vec::new(),
        ..honest.clone()
    };
    assert_eq!(
        refused(&mut receiver, &cut),
        DeltaError::Unsealed { stream, seq: 3 }
    );
    // The seal replaced with an older one (at seq 2, the receiver's head).
    let older = Seal::sign(&key, 2, receiver.chain(stream).unwrap().head_hash);
    let replaced = Delta {
        seals: vec![RunSeal {
            seal: older,
            ..honest.seals[0]
        }],
        ..honest.clone()
    };
    assert_eq!(refused(&mut receiver, &replaced), broken(2));
    // A seal by another key, over the honest chain.
    let stranger = WriterKey::from_bytes([13; 32]);
    let by_stranger = Delta {
        seals: vec![RunSeal {
            key: stranger.public(),
            seal: Seal::sign_for(&stranger, stream, 5, honest.seals[0].seal.head),
            base: None,
        }],
        ..honest.clone()
    };
    assert_eq!(
        refused(&mut receiver, &by_stranger),
        DeltaError::KeyMismatch {
            stream,
            derived: stranger.stream()
        }
    );
    // The right key, a signature not its own.
    let mut bad = honest.seals[0];
    bad.seal.signature[0] ^= 1;
    let bad_signature = Delta {
        seals: vec![bad],
        ..honest.clone()
    };
    assert_eq!(
        refused(&mut receiver, &bad_signature),
        DeltaError::BadSeal { stream, seq: 5 }
    );
    // Two writers' runs spliced: another writer's event put in the run.
    let (_, mut other) = keyed(14);
    other.append(&b"elsewhere"[..]).expect("append");
    let mut spliced = other.get(other.stream(), 1).expect("held");
    spliced.stream = stream;
    spliced.seq = 4;
    spliced.lamport = honest.events[1].lamport;
    let mut events = honest.events.clone();
    events[1] = spliced;
    assert_eq!(refused(&mut receiver, &with_events(events)), broken(5));

    // The honest delta is still taken afterwards.
    receiver.apply(&honest).expect("the honest delta is taken");
    assert_eq!(receiver.marks().get(stream), 5);
    assert_eq!(
        receiver.chain(stream).unwrap().head_hash,
        writer.chain(stream).unwrap().head_hash
    );
}

#[test]
fn a_relay_passes_the_writers_seal_on_and_cannot_strip_it_later() {
    let (key, mut writer) = keyed(21);
    let stream = key.stream();
    // An open relay (no key, seals not required) and an open receiver.
    let mut relay = Replica::new(StreamId::new(100));
    let mut receiver = Replica::new(StreamId::new(101));
    for i in 0..3 {
        writer
            .append(Bytes::from(format!("event {i}")))
            .expect("append");
    }
    relay
        .apply(&writer.delta_for(&relay.marks(), usize::MAX))
        .expect("the relay takes the sealed run");
    let relayed = relay.delta_for(&receiver.marks(), usize::MAX);
    assert_eq!(
        relayed.seals.len(),
        1,
        "the relay passes the writer's seal on"
    );
    assert_eq!(relayed.seals[0].key, key.public());
    assert_eq!(relayed.seals[0].seal.seq, 3);
    receiver
        .apply(&relayed)
        .expect("the relayed sealed run is taken");

    // The writer moves on; the relay strips the seal of the next run: the
    // receiver knows the stream as sealed, and refuses it.
    writer.append(&b"event 3"[..]).expect("append");
    relay
        .apply(&writer.delta_for(&relay.marks(), usize::MAX))
        .expect("the relay takes it");
    let mut stripped = relay.delta_for(&receiver.marks(), usize::MAX);
    assert_eq!(stripped.seals.len(), 1);
    stripped.seals.clear();
    assert_eq!(
        refused(&mut receiver, &stripped),
        DeltaError::Unsealed { stream, seq: 4 }
    );
    // Sealed by a stranger's key claiming the stream: refused.
    let stranger = WriterKey::from_bytes([22; 32]);
    let mut resealed = relay.delta_for(&receiver.marks(), usize::MAX);
    let honest = resealed.clone();
    resealed.seals[0].key = stranger.public();
    resealed.seals[0].seal = Seal::sign_for(&stranger, stream, 4, honest.seals[0].seal.head);
    assert_eq!(
        refused(&mut receiver, &resealed),
        DeltaError::KeyMismatch {
            stream,
            derived: stranger.stream()
        }
    );
    receiver
        .apply(&honest)
        .expect("the honest relayed run is taken");
    assert_eq!(
        receiver.chain(stream).unwrap().head_hash,
        writer.chain(stream).unwrap().head_hash
    );
}

/// An early run (a hole below it) cannot be chained from the receiver's
/// head: a sealed one is dropped, not held pending, so that a relay cannot
/// park forged events under a genuine seal; it is fetched again once it
/// attaches.
#[test]
fn an_early_sealed_run_is_dropped_and_taken_once_it_attaches() {
    let (key, writer, mut receiver) = writer_and_receiver(5, 2);
    let stream = key.stream();
    let honest = writer.delta_for(&receiver.marks(), usize::MAX);
    // seqs 4..=5 only, under the honest seal at 5, one payload forged.
    let mut early = Delta {
        events: honest.events[1..].to_vec(),
        ..honest.clone()
    };
    early.events[0].payload = Bytes::from_static(b"forged");
    let before = snapshot(&receiver);
    let report = receiver.apply(&early).expect("an early run is not refused");
    assert_eq!((report.pending, report.dropped), (0, 2));
    assert_eq!(receiver.pending_len(), 0);
    assert_eq!(snapshot(&receiver), before);
    receiver.apply(&honest).expect("the honest run attaches");
    assert_eq!(
        receiver.chain(stream).unwrap().head_hash,
        writer.chain(stream).unwrap().head_hash
    );
}

/// The kit's hostile relay (`meshlog_testkit::hostile`), every tampering
/// against a receiver that requires seals: each refused with its reason,
/// the receiver unchanged; the honest delta taken after all of them.
#[test]
fn every_tampering_of_the_kits_hostile_relay_is_refused() {
    let (key, writer, mut receiver) = writer_and_receiver(6, 2);
    let stream = key.stream();
    let honest = writer.delta_for(&receiver.marks(), usize::MAX);
    let head_hash = receiver.chain(stream).unwrap().head_hash;
    let (_, mut other) = keyed(31);
    other.append(&b"elsewhere"[..]).expect("append");
    let foreign = other.get(other.stream(), 1).expect("held");
    let stranger = WriterKey::from_bytes([32; 32]);
    let tamperings =
        meshlog_testkit::hostile::tamperings(&honest, &key, head_hash, &stranger, &foreign);
    assert_eq!(tamperings.len(), 10);
    for tampering in tamperings {
        assert_eq!(
            refused(&mut receiver, &tampering.delta),
            tampering.refusal,
            "{}",
            tampering.what
        );
    }
    receiver.apply(&honest).expect("the honest delta is taken");
    assert_eq!(
        receiver.chain(stream).unwrap().head_hash,
        writer.chain(stream).unwrap().head_hash
    );
}

/// Found in review: the seal check judged a sealed run starting at seq 0
/// before the per-event checks did, computing `first_seq - 1` (an
/// overflow where overflow checks are on) and answering `ChainBroken`; it
/// is refused as `ZeroSeq`, the reason the same event gets unsealed.
#[test]
fn regression_a_sealed_run_from_seq_zero_is_refused_not_a_panic() {
    let (key, writer, mut receiver) = writer_and_receiver(3, 0);
    let mut delta = writer.delta_for(&receiver.marks(), usize::MAX);
    delta.events[0].seq = 0;
    delta.seals[0].base = Some(meshlog_replica::ChainHash::GENESIS);
    assert_eq!(
        refused(&mut receiver, &delta),
        DeltaError::ZeroSeq {
            stream: key.stream()
        }
    );
}

/// Under `require_seals`, the admission cuts a legacy stream's unsealed
/// run whole (`Limit::Unsealed`) and takes the sealed writer's run beside
/// it; applied whole, the same delta is refused `Unsealed` (one rule). A
/// pinned stream's run with its seal cut off is not cut: that is a
/// tampering, refused.
#[test]
fn require_seals_admission_cuts_a_legacy_stream_and_leaves_a_stripped_seal_to_the_refusal() {
    use meshlog_replica::{DeltaColumns, Limit};
    let (key, writer, mut receiver) = writer_and_receiver(4, 2);
    let legacy_stream = StreamId::new(0x1e6);
    let mut legacy = Replica::new(legacy_stream);
    legacy.append(&b"legacy"[..]).expect("append");
    let mut delta = writer.delta_for(&receiver.marks(), usize::MAX);
    delta
        .events
        .extend(legacy.delta_for(&VersionVector::new(), usize::MAX).events);
    let columns = DeltaColumns::from_delta(&delta);
    let admission = receiver.admission(&columns);
    assert_eq!(admission.cuts.len(), 1, "{admission:?}");
    assert_eq!(admission.cuts[0].stream, legacy_stream);
    assert_eq!(admission.cuts[0].from_seq, 0);
    assert!(matches!(admission.cuts[0].limit, Limit::Unsealed));
    assert!(matches!(
        refused(&mut receiver, &delta),
        DeltaError::Unsealed { stream, seq: 1 } if stream == legacy_stream
    ));
    // The pinned writer's run with its seal cut off: not cut, refused.
    let stripped = Delta {
        seals: Vec::new(),
        ..writer.delta_for(&receiver.marks(), usize::MAX)
    };
    assert!(receiver
        .admission(&DeltaColumns::from_delta(&stripped))
        .is_whole());
    assert!(matches!(
        refused(&mut receiver, &stripped),
        DeltaError::Unsealed { stream, .. } if stream == key.stream()
    ));
    // What the admission leaves is taken.
    let taken = receiver
        .apply_columns(&admission.cut_columns(&columns))
        .expect("the sealed run is taken");
    assert_eq!(taken.applied, 2);
    assert_eq!(receiver.marks().get(legacy_stream), 0);
}
