//! Membership at the replica (`docs/SIGNING.md`, "Membership"): a replica
//! whose `Config::membership` is closed takes events only of the writers
//! it admits, and refuses any other writer's with
//! `DeltaError::UnknownWriter`, naming the stream (and the sealing key),
//! its state unchanged; an open one (the default) takes any writer whose
//! key derives its stream. A legacy stream's seals verify under the key a
//! trusted binding names.
//!
//! Writers are keyed replicas from fixed secrets; the admin key signs
//! admissions and bindings. Each refusal is compared against a snapshot
//! of the receiver taken before it (marks, floor, chain digest, events).

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    AdminKey, Binding, Config, Cut, Delta, DeltaColumns, DeltaError, Event, Limit, MemStore,
    Membership, Replica, ReplicaError, RunSeal, Seal, SealError, SharedReplica, WriterAdmission,
    WriterKey,
};
use meshlog_testkit::Snapshot;

fn admin() -> AdminKey {
    AdminKey::from_bytes([100; 32])
}

/// A keyed writer (sealing its stream) with `len` events.
fn writer(secret: u8, len: usize) -> (WriterKey, Replica<MemStore>) {
    let key = WriterKey::from_bytes([secret; 32]);
    let mut replica =
        Replica::open(Config::with_key(key.clone()), MemStore::default()).expect("opens");
    for i in 0..len {
        replica
            .append(Bytes::from(format!("{secret}: event {i}")))
            .expect("append");
    }
    (key, replica)
}

/// A keyed receiver under `membership`.
fn receiver(membership: Membership) -> Replica<MemStore> {
    let config = Config {
        membership,
        ..Config::with_key(WriterKey::from_bytes([1; 32]))
    };
    Replica::open(config, MemStore::default()).expect("opens")
}

/// A closed membership admitting the writers of `secrets` by admissions
/// the admin signed.
fn admitting(secrets: &[u8]) -> Membership {
    let mut membership = Membership::closed();
    for &secret in secrets {
        let key = WriterKey::from_bytes([secret; 32]).public();
        let admission = WriterAdmission { key }.sign(&admin());
        let admitted = membership
            .admit_signed(&admission, &admin().public())
            .expect("the admin's admission verifies");
        assert_eq!(admitted, key);
    }
    membership
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

/// Applies `delta`, which must be refused with a `DeltaError`, and checks
/// that nothing changed.
fn refused(receiver: &mut Replica<MemStore>, delta: &Delta) -> DeltaError {
    let before = snapshot(receiver);
    let error = match receiver.apply(delta) {
        Err(ReplicaError::Delta(error)) => error,
        other => panic!("the delta must be refused, got {other:?}"),
    };
    assert_eq!(snapshot(receiver), before, "a refusal changes nothing");
    error
}

fn all_of(replica: &Replica<MemStore>) -> Delta {
    replica.delta_for(&VersionVector::new(), usize::MAX)
}

#[test]
fn an_admitted_writer_is_taken_and_an_unknown_one_refused_with_its_stream_and_key() {
    let (admitted_key, admitted) = writer(2, 3);
    let (stranger_key, stranger) = writer(3, 2);
    let mut receiver = receiver(admitting(&[2]));

    let report = receiver
        .apply(&all_of(&admitted))
        .expect("an admitted writer");
    assert_eq!(report.applied, 3);
    assert_eq!(receiver.marks().get(admitted_key.stream()), 3);

    // The stranger's sealed run: refused, naming its stream and its key.
    let error = refused(&mut receiver, &all_of(&stranger));
    assert_eq!(
        error,
        DeltaError::UnknownWriter {
            stream: stranger_key.stream(),
            key: Some(Box::new(stranger_key.public())),
        }
    );
    let message = error.to_string();
    assert!(
        message.contains(&stranger_key.stream().to_string())
            && message.contains(&stranger_key.public().to_string())
            && message.contains("not admitted"),
        "{message}"
    );

    // The same events with the seal cut off: the writer is unknown still.
    let unsealed = Delta {
        seals: Vec::new(),
        ..all_of(&stranger)
    };
    assert_eq!(
        refused(&mut receiver, &unsealed),
        DeltaError::UnknownWriter {
            stream: stranger_key.stream(),
            key: None,
        }
    );

    // An unkeyed writer (a random stream id no admitted key writes).
    let mut unkeyed = Replica::new(StreamId::new(0x5eed));
    unkeyed.append(&b"anyone"[..]).expect("append");
    assert!(matches!(
        refused(&mut receiver, &all_of(&unkeyed)),
        DeltaError::UnknownWriter { stream, key: None } if stream == StreamId::new(0x5eed)
    ));
}

/// A relay that carries an admitted writer's events beside a stranger's:
/// the delta is refused whole (as every refusal is), the admitted events
/// included; sent alone, they are taken.
#[test]
fn a_delta_mixing_an_admitted_and_an_unknown_writer_is_refused_whole() {
    let (admitted_key, admitted) = writer(2, 2);
    let (stranger_key, stranger) = writer(3, 2);
    let mut relay = Replica::new(StreamId::new(77));
    relay.apply(&all_of(&admitted)).expect("open relay");
    relay.apply(&all_of(&stranger)).expect("open relay");
    let mut receiver = receiver(admitting(&[2]));
    let mixed = all_of(&relay);
    assert_eq!(mixed.seals.len(), 2, "the relay forwards both seals");
    assert!(matches!(
        refused(&mut receiver, &mixed),
        DeltaError::UnknownWriter { stream, .. } if stream == stranger_key.stream()
    ));
    receiver
        .apply(&all_of(&admitted))
        .expect("the admitted writer alone");
    assert_eq!(receiver.marks().get(admitted_key.stream()), 2);
    assert_eq!(receiver.marks().get(stranger_key.stream()), 0);
}

/// Issue 29 (membership liveness): the receiver's admission cuts the
/// unknown writer's stream out of a mixed delta (`Limit::UnknownWriter`,
/// naming the sealing key) by the validator's own rule, and the rest is
/// taken: the admitted writer's events and its seal (the stream pinned),
/// nothing of the stranger's, the state otherwise unchanged.
#[test]
fn admission_cuts_an_unknown_writers_stream_and_the_rest_of_the_delta_is_taken() {
    let (admitted_key, admitted) = writer(2, 3);
    let (stranger_key, stranger) = writer(3, 2);
    let mut relay = Replica::new(StreamId::new(77));
    relay.apply(&all_of(&admitted)).expect("open relay");
    relay.apply(&all_of(&stranger)).expect("open relay");
    let mixed = relay.delta_columns_for(&VersionVector::new(), usize::MAX);
    assert_eq!(mixed.seals.len(), 2, "the relay forwards both seals");
    let mut receiver = receiver(admitting(&[2]));
    let before = snapshot(&receiver);

    let admission = receiver.admission(&mixed);
    assert_eq!(
        admission.cuts,
        [Cut {
            stream: stranger_key.stream(),
            from_seq: 0,
            limit: Limit::UnknownWriter {
                key: Some(stranger_key.public()),
            },
        }]
    );
    // Applied whole, the same delta is refused for the same stream.
    assert!(matches!(
        refused(&mut receiver, &mixed.to_delta()),
        DeltaError::UnknownWriter { stream, .. } if stream == stranger_key.stream()
    ));

    let fits = admission.cut_columns(&mixed);
    assert_eq!(fits.seals.len(), 1, "the admitted writer's seal stays");
    let report = receiver.apply_columns(&fits).expect("the rest is taken");
    assert_eq!(report.applied, 3);
    let after = snapshot(&receiver);
    assert_eq!(after.marks.get(admitted_key.stream()), 3);
    assert_eq!(after.marks.get(stranger_key.stream()), 0);
    assert_eq!(after.floor, before.floor);
    let admitted_events: Vec<Event> = (1..=3)
        .map(|seq| admitted.get(admitted_key.stream(), seq).expect("held"))
        .collect();
    assert_eq!(after.events, admitted_events, "only the admitted writer's");
    assert_eq!(
        receiver.chain_digest().stream(admitted_key.stream()),
        admitted.chain_digest().stream(admitted_key.stream()),
        "the admitted writer's chain, as it holds it"
    );
    // Its seal came through: the stream is pinned (a next run unsealed
    // is refused).
    let mut admitted = admitted;
    admitted.append(&b"next"[..]).expect("append");
    let next = Delta {
        seals: Vec::new(),
        ..admitted.delta_for(&receiver.marks(), usize::MAX)
    };
    assert!(matches!(
        refused(&mut receiver, &next),
        DeltaError::Unsealed { stream, .. } if stream == admitted_key.stream()
    ));

    // Open membership: nothing is cut.
    let open = self::receiver(Membership::open());
    assert!(open.admission(&mixed).is_whole());
}

/// A seal of an admitted writer's stream by another key is a forgery, not
/// a stranger: it is not cut by admission but refused, `KeyMismatch`.
#[test]
fn a_seal_of_an_admitted_stream_by_another_key_is_refused_not_cut() {
    let (admitted_key, admitted) = writer(2, 2);
    let impostor = WriterKey::from_bytes([9; 32]);
    let mut forged = all_of(&admitted);
    let honest = forged.seals[0];
    forged.seals[0] = RunSeal {
        key: impostor.public(),
        seal: Seal::sign_for(
            &impostor,
            admitted_key.stream(),
            honest.seal.seq,
            honest.seal.head,
        ),
        base: None,
    };
    let mut receiver = receiver(admitting(&[2]));
    assert!(receiver
        .admission(&DeltaColumns::from_delta(&forged))
        .is_whole());
    assert_eq!(
        refused(&mut receiver, &forged),
        DeltaError::KeyMismatch {
            stream: admitted_key.stream(),
            derived: impostor.stream(),
        }
    );
}

#[test]
fn an_admission_not_signed_by_the_admin_admits_nothing() {
    let (key, writer) = writer(4, 1);
    let impostor = AdminKey::from_bytes([101; 32]);
    let forged = WriterAdmission { key: key.public() }.sign(&impostor);
    let mut membership = Membership::closed();
    assert!(matches!(
        membership.admit_signed(&forged, &admin().public()),
        Err(SealError::BadStatement {
            statement: "admission",
            ..
        })
    ));
    assert!(!membership.admits_stream(key.stream()));
    assert_eq!(membership, Membership::closed(), "nothing was admitted");
    let mut receiver = receiver(membership);
    assert_eq!(
        refused(&mut receiver, &all_of(&writer)),
        DeltaError::UnknownWriter {
            stream: key.stream(),
            key: Some(Box::new(key.public())),
        }
    );
}

/// A floor that would record a range of an unknown writer's stream as
/// lost is refused too: a stranger cannot take a stream slot by a floor.
/// So under `require_seals` as well (where a stream the membership takes
/// is raised only with its writer's authority, an unknown writer's is
/// still judged as its floor would raise it: refused, not left behind).
#[test]
fn an_unknown_writers_floor_is_refused_under_closed_membership() {
    let (stranger_key, _) = writer(5, 0);
    let mut floor = VersionVector::new();
    floor.advance(stranger_key.stream(), 10);
    let delta = Delta {
        floor,
        ..Delta::default()
    };
    for require_seals in [false, true] {
        let config = Config {
            membership: admitting(&[2]),
            require_seals,
            ..Config::with_key(WriterKey::from_bytes([1; 32]))
        };
        let mut receiver = Replica::open(config, MemStore::default()).expect("opens");
        assert_eq!(
            refused(&mut receiver, &delta),
            DeltaError::UnknownWriter {
                stream: stranger_key.stream(),
                key: None,
            },
            "require_seals {require_seals}"
        );
        // The admission cuts it by the same rule: the floor goes, nothing else.
        let admission = receiver.admission(&DeltaColumns::from_delta(&delta));
        assert_eq!(
            admission.cuts,
            [Cut {
                stream: stranger_key.stream(),
                from_seq: 0,
                limit: Limit::UnknownWriter { key: None },
            }],
            "require_seals {require_seals}"
        );
        assert!(admission.cut_delta(&delta).floor.is_empty());
    }
    // Open membership: the floor is recorded (the range lost).
    let mut open = self::receiver(Membership::open());
    open.apply(&delta).expect("open membership");
    assert_eq!(open.floor().get(stranger_key.stream()), 10);
}

#[test]
fn open_membership_takes_any_writer_whose_key_derives_its_stream() {
    let (key, stranger) = writer(6, 2);
    let mut receiver = receiver(Membership::default());
    assert!(Config::new(StreamId::new(1)).membership.is_open());
    receiver.apply(&all_of(&stranger)).expect("open");
    assert_eq!(receiver.marks().get(key.stream()), 2);
}

/// The grouped round (`SharedReplica`) decides membership as one by one:
/// the same one function in the validator.
#[test]
fn a_shared_replica_refuses_an_unknown_writer_the_same_way() {
    let (_, admitted) = writer(2, 1);
    let (stranger_key, stranger) = writer(3, 1);
    let config = Config {
        membership: admitting(&[2]),
        ..Config::new(StreamId::new(9))
    };
    let shared = SharedReplica::new(Replica::open(config, MemStore::default()).expect("opens"));
    shared.apply(all_of(&admitted)).expect("admitted");
    let error = shared.apply(all_of(&stranger)).expect_err("unknown");
    assert!(matches!(
        error,
        ReplicaError::Delta(DeltaError::UnknownWriter { stream, .. }) if stream == stranger_key.stream()
    ));
    assert_eq!(shared.marks().get(stranger_key.stream()), 0);
}

/// A legacy stream (a random id no key derives) seals under its writer's
/// key only where the receiver trusts a binding of the two: configured
/// (`key@stream`) or signed by the admin. Without one the seal is a
/// `KeyMismatch`; a binding another key signed is refused.
#[test]
fn a_legacy_stream_seals_under_a_bound_key() {
    let legacy = StreamId::new(0x001e_9ac7);
    let key = WriterKey::from_bytes([8; 32]);
    let mut writer = Replica::open(
        Config {
            key: Some(key.clone()),
            ..Config::new(legacy)
        },
        MemStore::default(),
    )
    .expect("opens");
    writer.append(&b"legacy"[..]).expect("append");
    let delta = all_of(&writer);
    assert_eq!(delta.seals.len(), 1, "the legacy writer seals its stream");

    let mut unbound = receiver(Membership::open());
    assert_eq!(
        refused(&mut unbound, &delta),
        DeltaError::KeyMismatch {
            stream: legacy,
            derived: key.stream(),
        }
    );

    let binding = Binding {
        stream: legacy,
        key: key.public(),
    };
    let mut forged = Membership::open();
    assert!(forged
        .bind_signed(
            &binding.sign(&AdminKey::from_bytes([9; 32])),
            &admin().public()
        )
        .is_err());
    assert_eq!(forged.binding(legacy), None);

    let mut signed = Membership::open();
    signed
        .bind_signed(&binding.sign(&admin()), &admin().public())
        .expect("the admin's binding");
    let mut configured = Membership::closed();
    configured.bind(binding);
    for membership in [signed, configured] {
        let mut bound = receiver(membership);
        bound.apply(&delta).expect("bound");
        assert_eq!(bound.marks().get(legacy), 1);
    }
}
