//! Equivocation with valid signatures (`docs/SIGNING.md`, "Equivocation
//! with valid signatures"): a writer key that signs two histories of its
//! stream is proven forked, the proof kept and the stream frozen.
//!
//! How: one key writes a common prefix, then its store is copied (a writer
//! restored from a backup) and both copies write on, each its own history.
//! Two relays take one history each; a receiver takes the first history
//! from one relay, then the other from the second: it must refuse it as
//! `Forked`, keep a proof that verifies on its own, freeze the stream
//! (later events of it refused `Frozen`, cut by the admission), go on
//! taking other streams, keep the proof across a reopen (memory and disk),
//! and hand it to a third replica, which freezes too. Forged proofs (a bad
//! signature, one history twice, another key, any byte flipped) are
//! refused, and a conflict that two valid seals do not prove (a relay's
//! altered run, a run without its base) stays a plain refusal. Seeded
//! properties draw the histories; the seed is printed on failure.

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Config, Delta, DeltaColumns, DeltaError, DiskStore, ForkError, ForkProof, Limit, MemStore,
    Replica, ReplicaError, Store, WriterKey,
};
use meshlog_testkit::hostile::equivocating_writers;
use meshlog_testkit::{seed, SplitMix64};

const KEY: [u8; 32] = [7; 32];

fn keyed(secret: [u8; 32]) -> Replica<MemStore> {
    Replica::open(
        Config::with_key(WriterKey::from_bytes(secret)),
        MemStore::default(),
    )
    .expect("an empty store opens")
}

/// A replica that requires seals, so it pins every stream it takes.
fn strict_config(id: u64) -> Config {
    Config {
        require_seals: true,
        ..Config::new(StreamId::new(id))
    }
}

fn strict(id: u64) -> Replica<MemStore> {
    Replica::open(strict_config(id), MemStore::default()).expect("an empty store opens")
}

fn payloads(count: u64, tag: u8, rng: &mut SplitMix64) -> Vec<Bytes> {
    (0..count)
        .map(|_| {
            let len = rng.below(40) as usize;
            let mut payload = vec![tag; len + 1];
            payload[0] = rng.next_u64() as u8;
            Bytes::from(payload)
        })
        .collect()
}

fn append(writer: &mut Replica<MemStore>, count: u64, tag: u8, rng: &mut SplitMix64) {
    for payload in payloads(count, tag, rng) {
        writer.append(payload).expect("append");
    }
}

/// Deltas from `source` to `target` until `target` holds all `source`
/// holds, or the first refusal.
fn sync<S: Store>(source: &Replica<MemStore>, target: &mut Replica<S>) -> Result<(), ReplicaError> {
    for _ in 0..1000 {
        if target.marks().dominates(&source.marks()) {
            return Ok(());
        }
        let delta = source.delta_for(&target.marks(), usize::MAX);
        target.apply(&delta)?;
    }
    panic!("no end");
}

/// Two writers of one key: a common prefix of `common` events, then
/// `a_len` events of history A and `b_len` of history B (above A's head,
/// so B's relay keeps a seal where A ends). Relay 1 holds A, relay 2 B.
struct Forked {
    writer_a: Replica<MemStore>,
    writer_b: Replica<MemStore>,
    relay_a: Replica<MemStore>,
    relay_b: Replica<MemStore>,
}

fn forked(common: u64, a_len: u64, b_extra: u64, rng: &mut SplitMix64) -> Forked {
    let (writer_a, mut writer_b) = equivocating_writers(
        &WriterKey::from_bytes(KEY),
        &payloads(common, 1, rng),
        &payloads(a_len, 2, rng),
        &payloads(a_len, 3, rng),
    );
    let (mut relay_a, mut relay_b) = (strict(101), strict(102));
    sync(&writer_a, &mut relay_a).expect("relay A takes history A");
    // Relay B takes B in two steps: it keeps a seal where A ends.
    sync(&writer_b, &mut relay_b).expect("relay B takes history B");
    append(&mut writer_b, b_extra, 4, rng);
    sync(&writer_b, &mut relay_b).expect("relay B takes the rest of B");
    Forked {
        writer_a,
        writer_b,
        relay_a,
        relay_b,
    }
}

fn stream() -> StreamId {
    WriterKey::from_bytes(KEY).stream()
}

/// The receiver takes A from relay A, then B from relay B: refused
/// `Forked`, with the proof.
fn take_both<S: Store>(fork: &Forked, receiver: &mut Replica<S>) -> ForkProof {
    sync(&fork.relay_a, receiver).expect("history A is taken");
    let refused = sync(&fork.relay_b, receiver).expect_err("history B is refused");
    match refused {
        ReplicaError::Delta(DeltaError::Forked {
            stream: forked,
            seq,
            head,
            proof,
        }) => {
            assert_eq!(forked, stream());
            assert_eq!(proof.seq, seq);
            assert_eq!(head, receiver.marks().get(forked), "frozen at its head");
            *proof
        }
        other => panic!("expected Forked, got {other}"),
    }
}

#[test]
fn a_writer_that_signs_two_histories_is_proven_forked_and_its_stream_frozen() {
    let mut rng = SplitMix64::new(1);
    let mut fork = forked(3, 3, 3, &mut rng);
    let mut other_writer = keyed([9; 32]);
    append(&mut other_writer, 2, 5, &mut rng);
    let mut receiver = strict(103);
    let proof = take_both(&fork, &mut receiver);
    proof.verify(None).expect("the proof verifies on its own");
    assert_eq!(proof.seq, 6, "A ends at 6, where relay B's run starts");
    assert_eq!(receiver.forks(), vec![proof.clone()]);
    // Readers keep what they had: history A, held and readable.
    let held = receiver.marks().get(stream());
    assert_eq!(held, 6);
    let page = receiver.page(&VersionVector::new(), 100).expect("a page");
    assert_eq!(page.events.len(), 6);
    // Frozen: A's next events are refused, and cut by the admission.
    append(&mut fork.writer_a, 2, 2, &mut rng);
    let next = fork.writer_a.delta_for(&receiver.marks(), usize::MAX);
    assert!(matches!(
        receiver.apply(&next),
        Err(ReplicaError::Delta(DeltaError::Frozen { head: 6, .. }))
    ));
    let columns = DeltaColumns::from_delta(&next);
    let admission = receiver.admission(&columns);
    assert_eq!(admission.cuts.len(), 1);
    assert_eq!(admission.cuts[0].from_seq, 7);
    assert!(matches!(admission.cuts[0].limit, Limit::Frozen { head: 6 }));
    // Other streams keep syncing, alone or beside the frozen one.
    let mixed = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: next
            .events
            .iter()
            .chain(
                &other_writer
                    .delta_for(&VersionVector::new(), usize::MAX)
                    .events,
            )
            .cloned()
            .collect(),
        seals: next
            .seals
            .iter()
            .chain(
                &other_writer
                    .delta_for(&VersionVector::new(), usize::MAX)
                    .seals,
            )
            .copied()
            .collect(),
    };
    let cut = receiver
        .admission(&DeltaColumns::from_delta(&mixed))
        .cut_delta(&mixed);
    receiver.apply(&cut).expect("the other stream is taken");
    assert_eq!(receiver.marks().get(other_writer.stream()), 2);
    assert_eq!(receiver.marks().get(stream()), 6);
    // Reopened, the proof is kept and the stream still frozen.
    let store = receiver.into_store();
    let mut reopened = Replica::open(strict_config(103), store).expect("reopens");
    assert_eq!(reopened.forks(), vec![proof]);
    assert!(matches!(
        reopened.apply(&next),
        Err(ReplicaError::Delta(DeltaError::Frozen { .. }))
    ));
    // A delta of history B again: frozen (the first proof stays).
    assert!(sync(&fork.relay_b, &mut reopened).is_err());
    assert_eq!(reopened.forks().len(), 1);
}

#[test]
fn a_fork_proof_survives_reopen_on_disk() {
    let mut rng = SplitMix64::new(2);
    let fork = forked(2, 4, 1, &mut rng);
    let dir = tempfile::tempdir().expect("a scratch dir");
    let open = || {
        Replica::open(
            strict_config(104),
            DiskStore::open(dir.path()).expect("the store opens"),
        )
        .expect("the replica opens")
    };
    let mut receiver = open();
    let proof = take_both(&fork, &mut receiver);
    drop(receiver);
    let mut reopened = open();
    assert_eq!(reopened.forks(), vec![proof]);
    assert!(matches!(
        sync(&fork.relay_b, &mut reopened),
        Err(ReplicaError::Delta(DeltaError::Frozen { .. }))
    ));
    assert_eq!(reopened.marks().get(stream()), 6);
}

#[test]
fn a_third_replica_learns_the_proof_and_freezes() {
    let mut rng = SplitMix64::new(3);
    let fork = forked(1, 2, 2, &mut rng);
    let mut receiver = strict(103);
    let proof = take_both(&fork, &mut receiver);
    // A third replica that holds history B only: the proof (as bytes, as a
    // peer would send it) is verified and kept; B's stream is frozen there.
    let mut third = strict(105);
    sync(&fork.writer_b, &mut third).expect("history B is taken");
    let received = ForkProof::from_bytes(&proof.to_bytes()).expect("decodes");
    assert!(third.keep_fork(&received).expect("kept"));
    assert!(!third.keep_fork(&received).expect("kept once"));
    assert_eq!(third.forks(), vec![proof]);
    let mut writer_b = fork.writer_b;
    append(&mut writer_b, 1, 4, &mut rng);
    assert!(matches!(
        sync(&writer_b, &mut third),
        Err(ReplicaError::Delta(DeltaError::Frozen { .. }))
    ));
}

/// A stream frozen by a proof received before anything of it (so not
/// pinned) takes no event as columns either (review of the signed-streams
/// work): a clean delta in columns skipped the validator, so its events
/// were held where the same delta as events is refused `Frozen`.
#[test]
fn a_frozen_stream_never_pinned_takes_no_delta_in_columns() {
    let mut rng = SplitMix64::new(5);
    let fork = forked(1, 2, 2, &mut rng);
    let proof = take_both(&fork, &mut strict(103));
    let mut receiver = Replica::new(StreamId::new(106));
    assert!(receiver.keep_fork(&proof).expect("kept"));
    let mut delta = fork.writer_a.delta_for(&VersionVector::new(), usize::MAX);
    delta.seals.clear();
    let as_events = receiver.apply(&delta);
    assert!(
        matches!(
            as_events,
            Err(ReplicaError::Delta(DeltaError::Frozen { head: 0, .. }))
        ),
        "{as_events:?}"
    );
    let as_columns = receiver.apply_columns(&DeltaColumns::from_delta(&delta));
    assert!(
        matches!(
            as_columns,
            Err(ReplicaError::Delta(DeltaError::Frozen { head: 0, .. }))
        ),
        "{as_columns:?}"
    );
    assert_eq!(receiver.marks().get(stream()), 0, "nothing of it is held");
}

#[test]
fn forged_proofs_are_refused_and_freeze_nothing() {
    let mut rng = SplitMix64::new(4);
    let fork = forked(2, 2, 2, &mut rng);
    let proof = take_both(&fork, &mut strict(103));
    let mut third = strict(106);
    let refuse = |third: &mut Replica<MemStore>, forged: &ForkProof| {
        assert!(third.keep_fork(forged).is_err());
        assert!(third.forks().is_empty());
    };
    // A bad signature.
    let mut bad_signature = proof.clone();
    bad_signature.branches[1].seal.signature[5] ^= 1;
    assert!(matches!(
        bad_signature.verify(None),
        Err(ForkError::Seal(_))
    ));
    refuse(&mut third, &bad_signature);
    // One history twice.
    let mut same = proof.clone();
    same.branches[1] = same.branches[0].clone();
    assert!(matches!(
        same.verify(None),
        Err(ForkError::SameHistory { .. })
    ));
    refuse(&mut third, &same);
    // Another key, that derives another stream.
    let mut other_key = proof.clone();
    other_key.key = WriterKey::from_bytes([8; 32]).public();
    assert!(matches!(other_key.verify(None), Err(ForkError::Seal(_))));
    refuse(&mut third, &other_key);
    // A branch whose events do not chain to its seal.
    let mut broken = proof.clone();
    broken.branches[1].events[0].lamport += 1;
    assert!(matches!(
        broken.verify(None),
        Err(ForkError::BranchBroken { branch: 1, .. })
    ));
    refuse(&mut third, &broken);
    // Bytes cut short, or with bytes left over.
    let bytes = proof.to_bytes();
    assert!(ForkProof::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(ForkProof::from_bytes(&longer).is_err());
    assert!(matches!(
        ForkProof::from_bytes(&vec![0; ForkProof::BYTES_MAX + 1]),
        Err(ForkError::TooLarge { .. })
    ));
    // The genuine one is kept.
    assert!(third.keep_fork(&proof).expect("kept"));
}

#[test]
fn a_conflict_two_valid_seals_do_not_prove_stays_a_plain_refusal() {
    let mut rng = SplitMix64::new(5);
    let fork = forked(2, 3, 2, &mut rng);
    let mut receiver = strict(103);
    sync(&fork.relay_a, &mut receiver).expect("history A is taken");
    let delta = fork.relay_b.delta_for(&receiver.marks(), usize::MAX);
    assert!(delta.seals[0].base.is_some(), "relay B sends its base");
    // A relay's altered run under the genuine seal proves nothing.
    let mut altered = delta.clone();
    altered.events[0].payload = Bytes::from_static(b"forged");
    assert!(matches!(
        receiver.apply(&altered),
        Err(ReplicaError::Delta(DeltaError::ChainBroken { .. }))
    ));
    // Nor does the run without its base (the receiver cannot tell).
    let mut unbased = delta.clone();
    unbased.seals[0].base = None;
    assert!(matches!(
        receiver.apply(&unbased),
        Err(ReplicaError::Delta(DeltaError::ChainBroken { .. }))
    ));
    // Nor a forged base.
    let mut forged_base = delta.clone();
    forged_base.seals[0].base = Some(meshlog_replica::ChainHash::from_bytes([3; 32]));
    assert!(matches!(
        receiver.apply(&forged_base),
        Err(ReplicaError::Delta(DeltaError::ChainBroken { .. }))
    ));
    assert!(receiver.forks().is_empty());
    assert_eq!(receiver.marks().get(stream()), 5);
    // The genuine delta proves it.
    assert!(matches!(
        receiver.apply(&delta),
        Err(ReplicaError::Delta(DeltaError::Forked { .. }))
    ));
    assert_eq!(receiver.forks().len(), 1);
}

#[test]
fn a_proof_of_the_own_stream_is_refused_and_never_freezes_it() {
    let mut rng = SplitMix64::new(6);
    let mut fork = forked(1, 1, 1, &mut rng);
    let proof = take_both(&fork, &mut strict(103));
    assert!(matches!(
        fork.writer_a.keep_fork(&proof),
        Err(ReplicaError::Fork(ForkError::OwnStream { .. }))
    ));
    assert!(fork.writer_a.forks().is_empty());
    fork.writer_a
        .append(&b"still writing"[..])
        .expect("appends");
}

/// Seeded: histories of drawn lengths; the fork is proven, the proof
/// verifies and round-trips, and every single byte flipped in its
/// encoding is refused (by decoding or verification).
#[test]
fn every_drawn_fork_is_proven_and_every_byte_flip_of_its_proof_refused() {
    seed::for_each_seed("forks", 0xF0_4C, 12, |seed| {
        let mut rng = SplitMix64::new(seed);
        let common = rng.below(5);
        let a_len = rng.between(1, 5);
        let b_extra = rng.between(1, 5);
        let fork = forked(common, a_len, b_extra, &mut rng);
        let mut receiver = strict(103);
        let proof = take_both(&fork, &mut receiver);
        assert_eq!(proof.seq, common + a_len, "seed {seed}");
        proof.verify(None).expect("verifies");
        let bytes = proof.to_bytes();
        assert_eq!(bytes.len(), proof.encoded_len());
        assert_eq!(ForkProof::from_bytes(&bytes).expect("decodes"), proof);
        for _ in 0..64 {
            let mut flipped = bytes.clone();
            let at = rng.below(bytes.len() as u64) as usize;
            flipped[at] ^= 1 << rng.below(8);
            let judged = ForkProof::from_bytes(&flipped).and_then(|p| p.verify(None));
            assert!(
                judged.is_err(),
                "byte {at} flipped is accepted, seed {seed}"
            );
        }
        assert_eq!(receiver.marks().get(stream()), common + a_len);
    });
}
