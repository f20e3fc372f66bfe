//! Floors with an authority (issue 29, `docs/SIGNING.md` "Floors with an
//! authority"): a compaction statement `(stream, floor, h(floor))` signed
//! by the stream's writer or the trusted admin key erases the receiver's
//! events of that stream up to its floor, as a compaction would (a reader
//! below it is told exactly what it lost); anything else that claims to
//! is refused with its typed reason and changes nothing, and no unsigned
//! floor erases a held event or raises the floor of a stream the receiver
//! knows is keyed: pinned, or, before it pinned it, bound or admitted in
//! its membership, or any under `require_seals` (a newcomer is not cut
//! off a writer whose key it knows).
//!
//! The named tests each build a keyed writer and a receiver from fixed
//! secrets; the seeded property mixes honest statements, statements under
//! foreign keys and unsigned floors against a model of what may be
//! erased. `MESHLOG_SEED=<n>` replays a failing run.

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    AdminKey, Binding, ChainHash, Compaction, Config, Delta, DeltaError, MemStore, Membership,
    PageError, Replica, ReplicaError, SignedCompaction, WriterKey, LAMPORT_MAX,
};
use meshlog_testkit::hostile::{floor_attacks, FloorOutcome};
use meshlog_testkit::{seed, Snapshot, SplitMix64};

mod disk_support;

fn key(secret: u8) -> WriterKey {
    WriterKey::from_bytes([secret; 32])
}

fn keyed(secret: u8) -> Replica<MemStore> {
    Replica::open(Config::with_key(key(secret)), MemStore::default()).expect("opens")
}

fn receiver_with(membership: Membership) -> Replica<MemStore> {
    let config = Config {
        membership,
        ..Config::with_key(key(2))
    };
    Replica::open(config, MemStore::default()).expect("opens")
}

fn snapshot(replica: &Replica<MemStore>) -> Snapshot {
    Snapshot::new(
        replica.marks(),
        replica.floor(),
        replica.chain_digest(),
        |stream, seq| replica.get(stream, seq),
    )
}

fn append(writer: &mut Replica<MemStore>, count: usize) {
    for _ in 0..count {
        let seq = writer.marks().get(writer.stream()) + 1;
        writer
            .append(Bytes::from(format!("event {seq}")))
            .expect("append");
    }
}

/// A writer (secret 1) with `len` events, and a receiver (secret 2) that
/// took the first `taken` of them sealed.
fn writer_and_receiver(len: usize, taken: usize) -> (Replica<MemStore>, Replica<MemStore>) {
    let mut writer = keyed(1);
    let mut receiver = receiver_with(Membership::open());
    append(&mut writer, taken);
    let delta = writer.delta_for(&receiver.marks(), usize::MAX);
    receiver.apply(&delta).expect("the honest delta is taken");
    append(&mut writer, len - taken);
    (writer, receiver)
}

fn compact(replica: &mut Replica<MemStore>, stream: StreamId, floor: u64) {
    replica
        .compact(&[(stream, floor)].into_iter().collect())
        .expect("compacts");
}

/// A delta carrying only `statement` (and its floor).
fn statement_only(statement: SignedCompaction) -> Delta {
    let mut delta = Delta {
        floor: [(statement.statement.stream, statement.statement.floor)]
            .into_iter()
            .collect(),
        ..Delta::default()
    };
    delta.floor_proofs.statements.push(statement);
    delta
}

fn refused(receiver: &mut Replica<MemStore>, delta: &Delta) -> DeltaError {
    let before = snapshot(receiver);
    let error = match receiver.apply(delta) {
        Err(ReplicaError::Delta(error)) => error,
        other => panic!("the statement must be refused, got {other:?}"),
    };
    assert_eq!(snapshot(receiver), before, "a refusal changes nothing");
    error
}

fn lost(receiver: &Replica<MemStore>, cursor: &VersionVector) -> Vec<(StreamId, u64, u64)> {
    match receiver.page(cursor, 100) {
        Err(PageError::Stale(stale)) => stale
            .lost()
            .iter()
            .map(|range| (range.stream, range.first_seq, range.last_seq))
            .collect(),
        other => panic!("the cursor must be stale, got {other:?}"),
    }
}

#[test]
fn a_keyed_writer_that_compacts_its_stream_signs_a_statement_at_its_floor() {
    let mut writer = keyed(1);
    let stream = writer.stream();
    append(&mut writer, 10);
    assert_eq!(writer.statement(stream), None, "nothing compacted yet");
    compact(&mut writer, stream, 4);
    let signed = writer.statement(stream).expect("a statement at the floor");
    let chain = writer.chain(stream).expect("held");
    assert_eq!(
        signed.statement,
        Compaction {
            stream,
            floor: 4,
            hash: chain.floor_hash
        }
    );
    assert_eq!(writer.compaction(stream), Some(signed.statement));
    signed
        .verify(None, None)
        .expect("the writer's key signs it");
    compact(&mut writer, stream, 7);
    assert_eq!(
        writer.statement(stream).unwrap().statement.floor,
        7,
        "the newest kept"
    );
    // The store keeps it: reopened, the replica still sends it.
    let reopened = Replica::open(Config::with_key(key(1)), writer.into_store()).expect("reopens");
    assert_eq!(reopened.statement(stream).unwrap().statement.floor, 7);
    let delta = reopened.delta_for(&VersionVector::new(), usize::MAX);
    assert_eq!(delta.floor.get(stream), 7);
    assert_eq!(
        delta.floor_proofs.statements,
        vec![reopened.statement(stream).unwrap()]
    );
    assert_eq!(
        delta.floor_proofs.hashes,
        vec![(stream, chain_at_floor(&reopened, stream))]
    );
}

/// The kept statements survive a reopen on disk: the own stream's, signed
/// at its compaction, and one received that erased a writer's stream.
#[test]
fn statements_are_kept_on_disk_across_a_reopen() {
    let dir = disk_support::scratch();
    let open = || {
        let store = meshlog_replica::DiskStore::open(dir.path()).expect("opens");
        Replica::open(Config::with_key(key(2)), store).expect("the replica opens")
    };
    let mut writer = keyed(1);
    let stream = writer.stream();
    append(&mut writer, 6);
    let mut receiver = open();
    let own = receiver.stream();
    receiver
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    for i in 0..4u8 {
        receiver.append(vec![i]).expect("append");
    }
    receiver
        .compact(&[(own, 3)].into_iter().collect())
        .expect("compacts");
    compact(&mut writer, stream, 4);
    receiver
        .apply(&statement_only(writer.statement(stream).unwrap()))
        .expect("the writer's statement");
    let kept = (receiver.statement(own), receiver.statement(stream));
    assert!(kept.0.is_some() && kept.1.is_some(), "{kept:?}");
    drop(receiver);
    let reopened = open();
    assert_eq!((reopened.statement(own), reopened.statement(stream)), kept);
    assert_eq!(reopened.floor().get(stream), 4);
}

fn chain_at_floor(replica: &Replica<MemStore>, stream: StreamId) -> ChainHash {
    replica.chain(stream).unwrap().floor_hash
}

/// Regression (issue 29, step 4): a receiver behind a writer's floor,
/// holding events below it, waited for a peer holding the gap; with the
/// writer's statement it takes the gap as lost and resumes. On the code
/// before statements the delta's events were not taken (`behind_floor`).
#[test]
fn a_receiver_behind_a_signed_floor_takes_the_gap_as_lost_and_resumes() {
    let (mut writer, mut receiver) = writer_and_receiver(10, 3);
    let stream = writer.stream();
    compact(&mut writer, stream, 6);
    let delta = writer.delta_for(&receiver.marks(), usize::MAX);
    assert_eq!(delta.floor_proofs.statements.len(), 1);
    let report = receiver.apply(&delta).expect("taken");
    assert!(report.behind_floor.is_empty(), "{report:?}");
    assert_eq!(receiver.floor().get(stream), 6);
    assert_eq!(
        receiver.marks().get(stream),
        10,
        "the run above the floor taken"
    );
    assert_eq!(
        receiver.chain_digest(),
        writer.chain_digest(),
        "anchored alike"
    );
    // A reader that had read one event is told exactly what it lost: the
    // events held (2, 3) and the gap (4 ..= 6).
    let cursor: VersionVector = [(stream, 1)].into_iter().collect();
    assert_eq!(lost(&receiver, &cursor), vec![(stream, 2, 6)]);
}

#[test]
fn a_writer_statement_erases_held_events_below_the_head() {
    let (mut writer, mut receiver) = writer_and_receiver(8, 8);
    let stream = writer.stream();
    compact(&mut writer, stream, 5);
    let statement = writer.statement(stream).unwrap();
    receiver.apply(&statement_only(statement)).expect("taken");
    assert_eq!(receiver.floor().get(stream), 5);
    assert_eq!(receiver.marks().get(stream), 8);
    assert_eq!(receiver.get(stream, 5), None);
    assert!(receiver.get(stream, 6).is_some());
    assert_eq!(receiver.chain_digest(), writer.chain_digest());
    assert_eq!(lost(&receiver, &VersionVector::new()), vec![(stream, 1, 5)]);
    receiver.verify().expect("the chain still verifies");
    // The receiver relays the statement with its floor.
    let newcomer_delta = receiver.delta_for(&VersionVector::new(), usize::MAX);
    assert_eq!(newcomer_delta.floor_proofs.statements, vec![statement]);
}

#[test]
fn a_statement_whose_hash_differs_at_a_held_seq_is_refused() {
    let (writer, mut receiver) = writer_and_receiver(8, 8);
    let stream = writer.stream();
    let forged = Compaction {
        stream,
        floor: 5,
        hash: ChainHash::from_bytes([7; 32]),
    }
    .sign_by_writer(&key(1));
    let error = refused(&mut receiver, &statement_only(forged));
    assert_eq!(error, DeltaError::StatementHashMismatch { stream, seq: 5 });
}

#[test]
fn a_statement_signed_by_a_key_that_is_not_the_writers_or_the_admins_is_refused() {
    let (writer, mut receiver) = writer_and_receiver(8, 8);
    let stream = writer.stream();
    let hash = receiver_hash_at(&writer, stream, 5);
    let stranger = key(9);
    let forged = Compaction {
        stream,
        floor: 5,
        hash,
    }
    .sign_by_writer(&stranger);
    let error = refused(&mut receiver, &statement_only(forged));
    assert_eq!(
        error,
        DeltaError::StatementNoAuthority {
            stream,
            floor: 5,
            derived: stranger.stream()
        }
    );
    // An admin statement the receiver does not trust: the same.
    let admin = AdminKey::from_bytes([5; 32]);
    let untrusted = Compaction {
        stream,
        floor: 5,
        hash,
    }
    .sign_by_admin(&admin);
    let error = refused(&mut receiver, &statement_only(untrusted));
    assert!(
        matches!(error, DeltaError::StatementNoAuthority { .. }),
        "{error:?}"
    );
    // A writer's statement with its signature altered.
    let mut altered = Compaction {
        stream,
        floor: 5,
        hash,
    }
    .sign_by_writer(&key(1));
    altered.signature[3] ^= 1;
    let error = refused(&mut receiver, &statement_only(altered));
    assert_eq!(error, DeltaError::BadStatement { stream, floor: 5 });
}

/// The writer's chain hash at `seq`, from a copy compacted there.
fn receiver_hash_at(writer: &Replica<MemStore>, stream: StreamId, seq: u64) -> ChainHash {
    let mut copy = keyed(3);
    copy.apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    compact(&mut copy, stream, seq);
    copy.chain(stream).unwrap().floor_hash
}

#[test]
fn an_admin_statement_erases_where_the_admin_is_trusted() {
    let (writer, _) = writer_and_receiver(8, 8);
    let stream = writer.stream();
    let admin = AdminKey::from_bytes([5; 32]);
    let mut membership = Membership::open();
    membership.trust_admin(admin.public());
    let mut receiver = receiver_with(membership);
    receiver
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    // The library makes the statement an admin signs from a replica that
    // compacted the stream.
    let mut compacted = keyed(3);
    compacted
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    compact(&mut compacted, stream, 6);
    let statement = compacted.compaction(stream).expect("anchored at its floor");
    receiver
        .apply(&statement_only(statement.sign_by_admin(&admin)))
        .expect("the admin's authority");
    assert_eq!(receiver.floor().get(stream), 6);
    assert_eq!(receiver.marks().get(stream), 8);
    assert_eq!(lost(&receiver, &VersionVector::new()), vec![(stream, 1, 6)]);
}

#[test]
fn no_statement_erases_the_receivers_own_stream() {
    let admin = AdminKey::from_bytes([5; 32]);
    let mut membership = Membership::open();
    membership.trust_admin(admin.public());
    let mut receiver = receiver_with(membership);
    let own = receiver.stream();
    append(&mut receiver, 6);
    let mut copy = keyed(3);
    copy.apply(&receiver.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    compact(&mut copy, own, 4);
    let statement = copy.compaction(own).unwrap();
    let before = snapshot(&receiver);
    for signed in [
        statement.sign_by_admin(&admin),
        statement.sign_by_writer(&key(2)),
    ] {
        receiver
            .apply(&statement_only(signed))
            .expect("ignored, not refused");
        assert_eq!(snapshot(&receiver), before, "the own stream is untouched");
    }
}

/// Regression (issue 29, the hole `docs/SIGNING.md` named): a pinned
/// stream the receiver compacted whole took any peer's floor, so a
/// hostile peer could invent a floor past the writer's real head and the
/// receiver then ignored the writer's next events up to it. Now the floor
/// is not raised without the writer's authority (the stream is behind that
/// peer), and the writer's next events are still taken.
#[test]
fn an_unsigned_floor_on_a_pinned_stream_held_whole_is_not_raised() {
    let (mut writer, mut receiver) = writer_and_receiver(4, 4);
    let stream = writer.stream();
    compact(&mut receiver, stream, 4);
    let before = snapshot(&receiver);
    let invented = Delta {
        floor: [(stream, 4 + 5)].into_iter().collect(),
        ..Delta::default()
    };
    let report = receiver.apply(&invented).expect("not refused");
    assert_eq!(report.behind_floor, vec![(stream, 9)]);
    assert_eq!(snapshot(&receiver), before, "the floor is not raised");
    append(&mut writer, 2);
    let delta = writer.delta_for(&receiver.marks(), usize::MAX);
    receiver.apply(&delta).expect("the writer's next events");
    assert_eq!(receiver.marks().get(stream), 6, "the writer is not cut off");
}

#[test]
fn an_unsigned_floor_above_held_events_erases_nothing() {
    let (writer, mut receiver) = writer_and_receiver(8, 5);
    let stream = writer.stream();
    let before = snapshot(&receiver);
    for floor in [6, 8, 9, LAMPORT_MAX] {
        let hostile = Delta {
            floor: [(stream, floor)].into_iter().collect(),
            ..Delta::default()
        };
        let report = receiver.apply(&hostile).expect("not refused");
        assert_eq!(report.behind_floor, vec![(stream, floor)]);
        assert_eq!(snapshot(&receiver), before);
    }
}

/// The kit's hostile floors (`testkit::hostile::floor_attacks`), as the
/// sync tests play them over a session: each refused or ignored as due,
/// the receiver unchanged, and the writer's next events taken.
#[test]
fn the_kits_hostile_floors_are_refused_or_ignored_and_change_nothing() {
    let admin = AdminKey::from_bytes([5; 32]);
    let mut membership = Membership::open();
    membership.trust_admin(admin.public());
    let mut writer = keyed(1);
    let mut receiver = receiver_with(membership);
    let stream = writer.stream();
    append(&mut writer, 5);
    receiver
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    let head_hash = receiver.chain(stream).unwrap().head_hash;
    for attack in floor_attacks(stream, 5, head_hash, &AdminKey::from_bytes([6; 32])) {
        let before = snapshot(&receiver);
        match (&attack.outcome, receiver.apply(&attack.delta)) {
            (FloorOutcome::Refused(due), Err(ReplicaError::Delta(error))) => {
                assert_eq!(&error, due, "{}", attack.what)
            }
            (FloorOutcome::Ignored, Ok(report)) => {
                assert_eq!(report.behind_floor.len(), 1, "{}", attack.what)
            }
            (due, got) => panic!("{}: due {due:?}, got {got:?}", attack.what),
        }
        assert_eq!(snapshot(&receiver), before, "{}", attack.what);
    }
    append(&mut writer, 2);
    receiver
        .apply(&writer.delta_for(&receiver.marks(), usize::MAX))
        .expect("the writer's next events");
    assert_eq!(receiver.marks().get(stream), 7);
}

/// The seeded property: honest statements (the writer's, at floors it
/// compacted to), statements under foreign keys, statements over another
/// chain, and unsigned floors, delivered to a receiver in a random order
/// with the writer's sealed deltas. After every step: no held event is
/// gone but below the highest floor the writer signed and delivered (the
/// model), a refused delta changed nothing, and a reader's stale report
/// names exactly the range from its cursor to the receiver's floor.
#[test]
fn no_held_event_disappears_without_authority() {
    let mut erased = 0;
    seed::for_each_seed(
        "no_held_event_disappears_without_authority",
        0x5747_2900,
        24,
        |seed| erased += one_schedule(&mut SplitMix64::new(seed)),
    );
    assert!(
        erased > 0,
        "some statement erased held events (the property ran its case)"
    );
}

/// One schedule; answers how many steps erased held events by authority.
fn one_schedule(rng: &mut SplitMix64) -> usize {
    // The receiver pinned the writer's stream (took a sealed delta): an
    // unpinned newcomer still takes any peer's floor where it holds
    // nothing (`docs/SIGNING.md`).
    let (mut writer, mut receiver) = writer_and_receiver(1, 1);
    let stream = writer.stream();
    let stranger = key(9);
    // The model: the highest floor with authority delivered.
    let mut signed_floor = 0;
    let mut erased = 0;
    for _ in 0..40 {
        let before = snapshot(&receiver);
        let held_before: Vec<u64> =
            (receiver.floor().get(stream) + 1..=receiver.marks().get(stream)).collect();
        let step = rng.below(6);
        let result = match step {
            0 => {
                append(&mut writer, 1 + rng.below(4) as usize);
                Ok(None)
            }
            1 => {
                let head = writer.marks().get(stream);
                let floor = writer.floor().get(stream);
                if head > floor {
                    compact(&mut writer, stream, floor + 1 + rng.below(head - floor));
                }
                Ok(None)
            }
            2 => {
                let delta = writer.delta_for(&receiver.marks(), 1 + rng.below(400) as usize);
                let statement_floor = delta
                    .floor_proofs
                    .statements
                    .first()
                    .map(|s| s.statement.floor);
                receiver.apply(&delta).map(|_| statement_floor)
            }
            3 => {
                // A statement under a foreign key, over the writer's hash.
                let Some(signed) = writer.statement(stream) else {
                    continue;
                };
                let forged = signed.statement.sign_by_writer(&stranger);
                receiver.apply(&statement_only(forged)).map(|_| None)
            }
            4 => {
                // The writer's key over another chain's hash, at a seq
                // the receiver holds or compacted (above its head, only
                // the writer's key can do it, to its own stream).
                let floor = 1 + rng.below(receiver.marks().get(stream).max(1));
                let forged = Compaction {
                    stream,
                    floor,
                    hash: ChainHash::from_bytes([rng.below(255) as u8; 32]),
                }
                .sign_by_writer(&key(1));
                // Where the receiver holds the seq on an anchored chain,
                // it compares (an unanchored one has nothing to compare).
                let held = floor > receiver.floor().get(stream)
                    && floor <= receiver.marks().get(stream)
                    && receiver.chain(stream).is_some_and(|chain| chain.anchored);
                let result = receiver.apply(&statement_only(forged));
                if held {
                    assert!(
                        matches!(
                            result,
                            Err(ReplicaError::Delta(
                                DeltaError::StatementHashMismatch { .. }
                            ))
                        ),
                        "{result:?}"
                    );
                }
                result.map(|_| if held { None } else { Some(floor) })
            }
            _ => {
                let floor = rng.below(writer.marks().get(stream) + 8);
                let hostile = Delta {
                    floor: [(stream, floor)].into_iter().collect(),
                    ..Delta::default()
                };
                receiver.apply(&hostile).map(|_| None)
            }
        };
        match result {
            Err(_) => assert_eq!(snapshot(&receiver), before, "a refusal changes nothing"),
            Ok(floor) => {
                if let Some(floor) = floor {
                    signed_floor = signed_floor.max(floor);
                }
            }
        }
        // No held event is gone but below the floor signed and delivered.
        erased += usize::from(
            held_before
                .iter()
                .any(|&seq| receiver.get(stream, seq).is_none()),
        );
        for seq in held_before {
            assert!(
                seq <= signed_floor || receiver.get(stream, seq).is_some(),
                "seq {seq} erased without authority (signed floor {signed_floor})"
            );
        }
        // A reader at 0 is told exactly what it lost.
        let floor = receiver.floor().get(stream);
        if floor > 0 {
            assert_eq!(
                lost(&receiver, &VersionVector::new()),
                vec![(stream, 1, floor)]
            );
        }
    }
    // Healed: the writer's deltas bring the receiver to its head.
    for _ in 0..200 {
        if receiver.marks().get(stream) == writer.marks().get(stream) {
            break;
        }
        let delta = writer.delta_for(&receiver.marks(), usize::MAX);
        receiver.apply(&delta).expect("honest");
    }
    assert_eq!(
        receiver.marks().get(stream),
        writer.marks().get(stream),
        "converged"
    );
    erased
}

/// `compaction_at` answers, without compacting, the hash a compaction
/// there would record (what `meshlog key compact` signs): on a receiver
/// that hashes an unsealed stream lazily, from its floor and from a hash
/// known above it; `None` below the floor and above the head.
#[test]
fn compaction_at_answers_the_hash_a_compaction_there_records() {
    let mut writer = Replica::new(StreamId::new(77));
    append(&mut writer, 10);
    let stream = writer.stream();
    let mut receiver = receiver_with(Membership::open());
    receiver
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    let expected = |floor: u64| Some(receiver_hash_at(&writer, stream, floor));
    let at = |receiver: &Replica<MemStore>, floor: u64| {
        receiver
            .compaction_at(stream, floor)
            .expect("reads")
            .map(|statement| statement.hash)
    };
    for floor in [3, 10] {
        assert_eq!(at(&receiver, floor), expected(floor), "floor {floor}");
    }
    let _ = receiver.chain_digest(); // hashes to the head: a hash known above
    compact(&mut receiver, stream, 4);
    for floor in [4, 6, 10] {
        assert_eq!(at(&receiver, floor), expected(floor), "floor {floor}");
    }
    assert_eq!(at(&receiver, 3), None, "below the floor");
    assert_eq!(at(&receiver, 11), None, "above the head");
    assert_eq!(at(&receiver, 0), None);
}

/// Issue 29: a peer that does not trust the admin key, behind an admin
/// floor another node took, is offered the stream's statement with every
/// delta. Applied whole the delta is refused (the validator's rule); the
/// admission cuts the stream whole by the same rule, and the rest of the
/// delta (another writer's events) is taken, the stream left as it was.
#[test]
fn a_statement_without_authority_here_cuts_its_stream_and_the_rest_is_taken() {
    let mut writer = keyed(1);
    let stream = writer.stream();
    append(&mut writer, 3);
    let mut untrusting = keyed(6);
    untrusting
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("W 1..3 taken");
    append(&mut writer, 7);
    let admin = AdminKey::from_bytes([5; 32]);
    let mut membership = Membership::open();
    membership.trust_admin(admin.public());
    let mut trusting = receiver_with(membership);
    trusting
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    let mut other = keyed(4);
    append(&mut other, 6);
    trusting
        .apply(&other.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    let mut compacted = keyed(3);
    compacted
        .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
        .expect("taken");
    compact(&mut compacted, stream, 5);
    let statement = compacted.compaction(stream).expect("anchored at its floor");
    trusting
        .apply(&statement_only(statement.sign_by_admin(&admin)))
        .expect("the admin's authority");

    assert_eq!(untrusting.marks().get(stream), 3);

    let delta = trusting.delta_for(&untrusting.marks(), usize::MAX);
    let error = refused(&mut untrusting, &delta);
    assert!(
        matches!(error, DeltaError::StatementNoAuthority { stream: s, floor: 5, .. } if s == stream),
        "{error:?}"
    );
    let before: Vec<_> = (1..=3).map(|seq| untrusting.get(stream, seq)).collect();
    let columns = meshlog_replica::DeltaColumns::from_delta(&delta);
    let admission = untrusting.admission(&columns);
    assert_eq!(admission.cuts.len(), 1, "{admission:?}");
    assert_eq!(admission.cuts[0].stream, stream);
    assert_eq!(admission.cuts[0].from_seq, 0);
    assert!(matches!(
        admission.cuts[0].limit,
        meshlog_replica::Limit::StatementNoAuthority { floor: 5 }
    ));
    untrusting
        .apply(&admission.cut_delta(&delta))
        .expect("the rest is taken");
    assert_eq!(untrusting.marks().get(other.stream()), 6);
    assert_eq!(untrusting.marks().get(stream), 3, "W unchanged");
    assert_eq!(untrusting.floor().get(stream), 0, "W's floor unchanged");
    let after: Vec<_> = (1..=3).map(|seq| untrusting.get(stream, seq)).collect();
    assert_eq!(after, before, "W's held events unchanged");
}

/// A stream the receiver knows is keyed before it pinned it, and how it
/// knows: its writer, and a newcomer holding nothing of it.
struct KnownKeyed {
    how: &'static str,
    writer: Replica<MemStore>,
    newcomer: Replica<MemStore>,
}

/// The ways a newcomer (secret 2) knows a writer's stream is keyed before
/// any seal of it arrives: a binding names its key (`key@stream`, a legacy
/// stream no key derives), a closed membership admits its key, or the
/// newcomer requires seals. Each writer holds `len` events.
fn known_keyed(len: usize) -> Vec<KnownKeyed> {
    let legacy = StreamId::new(0x001e_9ac7);
    let legacy_key = key(7);
    let mut bound = Membership::open();
    bound.bind(Binding {
        stream: legacy,
        key: legacy_key.public(),
    });
    let legacy_config = Config {
        key: Some(legacy_key),
        ..Config::new(legacy)
    };
    let mut admitted = Membership::closed();
    admitted.admit(key(1).public());
    let requiring = Config {
        require_seals: true,
        ..Config::with_key(key(2))
    };
    let mut cases = vec![
        KnownKeyed {
            how: "bound",
            writer: Replica::open(legacy_config, MemStore::default()).expect("opens"),
            newcomer: receiver_with(bound),
        },
        KnownKeyed {
            how: "admitted",
            writer: keyed(1),
            newcomer: receiver_with(admitted),
        },
        KnownKeyed {
            how: "require_seals",
            writer: keyed(1),
            newcomer: Replica::open(requiring, MemStore::default()).expect("opens"),
        },
    ];
    for case in &mut cases {
        append(&mut case.writer, len);
    }
    cases
}

/// Issue 29 (the hole `docs/SIGNING.md` still named): a newcomer took an
/// unsigned floor on a stream it had not pinned yet, so a hostile peer's
/// floor past a keyed writer's real head was recorded as lost, and the
/// writer's real events below it were never taken: the writer was cut
/// off at that replica. A newcomer that knows the stream is keyed (bound,
/// admitted, or under `require_seals`) treats it as pinned: the floor
/// alone leaves the stream behind it, and every real event is taken.
#[test]
fn an_unsigned_floor_does_not_cut_a_keyed_writer_off_a_newcomer_that_knows_its_key() {
    for KnownKeyed {
        how,
        mut writer,
        mut newcomer,
    } in known_keyed(4)
    {
        let stream = writer.stream();
        let invented = Delta {
            floor: [(stream, 4 + 5)].into_iter().collect(),
            ..Delta::default()
        };
        let before = snapshot(&newcomer);
        let report = newcomer.apply(&invented).expect("not refused");
        assert_eq!(report.behind_floor, vec![(stream, 9)], "{how}");
        assert_eq!(
            snapshot(&newcomer),
            before,
            "{how}: the floor is not raised"
        );
        let report = newcomer
            .apply(&writer.delta_for(&newcomer.marks(), usize::MAX))
            .expect("the writer's real events");
        assert_eq!(report.applied, 4, "{how}: {report:?}");
        append(&mut writer, 2);
        newcomer
            .apply(&writer.delta_for(&newcomer.marks(), usize::MAX))
            .expect("the writer's next events");
        assert_eq!(newcomer.marks().get(stream), 6, "{how}");
        assert_eq!(newcomer.floor().get(stream), 0, "{how}: nothing lost");
        for seq in 1..=6 {
            assert_eq!(newcomer.get(stream, seq), writer.get(stream, seq), "{how}");
        }
        assert_eq!(newcomer.chain(stream), writer.chain(stream), "{how}");
    }
}

/// The same newcomers take a keyed writer's floor with its authority: a
/// statement from the writer, or a sealed run starting right after the
/// floor with its base (the writer's compacted delta, its statement
/// stripped). Each time the range is recorded lost and the run above it
/// taken.
#[test]
fn a_keyed_writers_floor_with_its_authority_is_taken_by_a_newcomer_that_knows_its_key() {
    for KnownKeyed {
        how,
        mut writer,
        newcomer,
    } in known_keyed(10)
    {
        let stream = writer.stream();
        compact(&mut writer, stream, 6);
        let statement = writer
            .statement(stream)
            .expect("the writer signs its floor");
        let mut by_statement = newcomer;
        let report = by_statement
            .apply(&statement_only(statement))
            .expect("the statement");
        assert!(report.behind_floor.is_empty(), "{how}: {report:?}");
        assert_eq!(by_statement.floor().get(stream), 6, "{how}");
        let mut by_seal = known_keyed(10)
            .into_iter()
            .find(|case| case.how == how)
            .expect("the same case")
            .newcomer;
        let mut sealed = writer.delta_for(&VersionVector::new(), usize::MAX);
        sealed.floor_proofs.statements.clear();
        assert!(sealed.seals.iter().any(|s| s.base.is_some()), "{how}");
        let report = by_seal.apply(&sealed).expect("the sealed run");
        assert!(report.behind_floor.is_empty(), "{how}: {report:?}");
        for newcomer in [&mut by_statement, &mut by_seal] {
            newcomer
                .apply(&writer.delta_for(&newcomer.marks(), usize::MAX))
                .expect("the run above the floor");
            assert_eq!(newcomer.floor().get(stream), 6, "{how}");
            assert_eq!(newcomer.marks().get(stream), 10, "{how}");
            assert_eq!(
                lost(newcomer, &VersionVector::new()),
                vec![(stream, 1, 6)],
                "{how}"
            );
        }
    }
}

/// What an unsigned floor still does (`docs/SIGNING.md`): a newcomer that
/// knows nothing of a stream (open membership, no binding, seals not
/// required, nothing pinned) still records it as lost where it holds
/// nothing of the stream, as a relay's retention floor is honest.
#[test]
fn a_newcomer_that_knows_no_key_of_a_stream_still_takes_an_unsigned_floor() {
    let mut writer = keyed(1);
    append(&mut writer, 4);
    let stream = writer.stream();
    let mut newcomer = receiver_with(Membership::open());
    let floor = Delta {
        floor: [(stream, 3)].into_iter().collect(),
        ..Delta::default()
    };
    let report = newcomer.apply(&floor).expect("taken");
    assert_eq!(report.floors_raised, 1);
    assert_eq!(newcomer.floor().get(stream), 3);
}

/// An honest relay's retention floor still reaches a newcomer that knows
/// the stream is keyed: the relay compacted the writer's stream by its own
/// retention (no statement: only the writer or the admin signs one), and
/// its delta carries the writer's sealed run above the floor with its
/// base, which vouches for the floor.
#[test]
fn a_relays_retention_floor_with_the_writers_sealed_run_reaches_a_newcomer_that_knows_its_key() {
    for KnownKeyed { how, writer, .. } in known_keyed(10) {
        let stream = writer.stream();
        let mut relay = receiver_with(Membership::open());
        // The relay trusts what the newcomer trusts, so that it takes the
        // bound legacy stream too.
        if how == "bound" {
            let mut bound = Membership::open();
            bound.bind(Binding {
                stream,
                key: key(7).public(),
            });
            relay = Replica::open(
                Config {
                    membership: bound,
                    ..Config::with_key(key(3))
                },
                MemStore::default(),
            )
            .expect("opens");
        }
        relay
            .apply(&writer.delta_for(&VersionVector::new(), usize::MAX))
            .expect("the relay takes the writer's stream");
        compact(&mut relay, stream, 6);
        let delta = relay.delta_for(&VersionVector::new(), usize::MAX);
        assert!(delta.floor_proofs.statements.is_empty(), "{how}");
        let mut newcomer = known_keyed(0)
            .into_iter()
            .find(|case| case.how == how)
            .expect("the same case")
            .newcomer;
        let report = newcomer.apply(&delta).expect("the relay's delta");
        assert!(report.behind_floor.is_empty(), "{how}: {report:?}");
        assert_eq!(newcomer.floor().get(stream), 6, "{how}");
        assert_eq!(newcomer.marks().get(stream), 10, "{how}");
    }
}
