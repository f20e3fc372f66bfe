//! A compaction statement reaches every peer that holds what it erases
//! (issue 29, `docs/SIGNING.md`, "Floors with an authority"; the
//! `Statement` frame, `docs/PROTOCOL.md`).
//!
//! A delta carries a statement only with a floor, and a floor goes only to
//! a peer whose marks are below it; so a peer already past the floor,
//! still holding the events below it, never learned the statement, and an
//! admin's compaction (`POST /compaction`) erased only at the node it was
//! posted to and at peers behind it. These tests show, over real
//! `Session`s:
//!
//! - three replicas: A and B converged past seq F of writer W's stream;
//!   the admin's statement compacts W to F at A; after a session between
//!   A and B, B holds no event of W at or below F, keeps those above, and
//!   a reader from the start is told exactly `(W, 1, F)` was lost. The
//!   statement crossed once: the link stays up for many heartbeats more
//!   and nothing is offered again. (Before the `Statement` frame, B kept
//!   every event: after a minute of session its floor was still 0.)
//! - a peer that does not trust the admin key is offered the statement,
//!   refuses it (`StatementNoAuthority`, counted and logged), keeps every
//!   event, and the session goes on: a mesh whose nodes trust differently
//!   keeps its links.
//! - a statement refused for no authority or for a chain hash that is not
//!   the receiver's, offered again in the same session, costs the receiver
//!   a lookup, not a commit round; that memory is bounded
//!   (`STATEMENT_REFUSALS_MAX`) and says when it is full.
//! - an offered statement whose signature does not verify ends the
//!   receiver's session (`Refused`, `BadStatement`) and erases nothing;
//!   one of a stream the receiver does not hold is ignored (it would only
//!   add a stream): the frame can erase no more than a delta's statement.
//!
//! How: keyed replicas in memory from fixed secrets, W's events handed to
//! A and B as deltas; the admin's statement applied to A as a delta
//! carrying it (what the node's `POST /compaction` does); two real
//! sessions over an in-memory stream on tokio's paused clock.

use std::time::{Duration, Instant};

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    AdminKey, ChainHash, Commits, Compaction, Config, Delta, DeltaError, MemStore, Membership,
    PageError, Replica, WriterKey,
};
use meshlog_sync::frame::{
    self, Frame, Hello, FRAME_BYTES_MAX, HELLO_SKIPS_UNKNOWN_KINDS, LENGTH_PREFIX_BYTES,
    PROTOCOL_VERSION,
};
use meshlog_sync::proto::Protocol;
use meshlog_sync::testkit::{hand_in, run_paused};
use meshlog_sync::{
    ProtocolError, Session, SessionConfig, SessionEnd, SessionError, SessionState, SharedReplica,
};

const FLOOR: u64 = 6;
const HEAD: u64 = 10;

fn admin() -> AdminKey {
    AdminKey::from_bytes([5; 32])
}

/// A keyed replica in memory from `secret`, trusting the admin if asked.
fn keyed(secret: u8, trusts_admin: bool) -> SharedReplica {
    let mut membership = Membership::open();
    if trusts_admin {
        membership.trust_admin(admin().public());
    }
    let config = Config {
        membership,
        ..Config::with_key(WriterKey::from_bytes([secret; 32]))
    };
    let replica = Replica::open(config, MemStore::default()).expect("an empty store opens");
    SharedReplica::with_commits(replica, Commits::Inline)
}

/// W with `HEAD` events, and A and B holding all of them.
fn converged(b_trusts_admin: bool) -> (SharedReplica, SharedReplica, SharedReplica) {
    let w = keyed(1, false);
    for i in 0..HEAD {
        w.append_at(format!("w{i}").into_bytes(), 1_000 + i)
            .expect("append");
    }
    let a = keyed(2, true);
    let b = keyed(3, b_trusts_admin);
    for replica in [&a, &b] {
        let delta = w
            .try_delta_for(&replica.marks(), usize::MAX)
            .expect("W reads");
        replica.apply(delta).expect("W's events are taken");
        assert_eq!(replica.marks().get(w.stream()), HEAD);
    }
    (w, a, b)
}

/// The admin's statement compacting `stream` to `FLOOR`, applied to `a`.
fn admin_compacts(a: &SharedReplica, stream: StreamId) {
    let statement = a
        .compaction_at(stream, FLOOR)
        .expect("a reads")
        .expect("held and anchored");
    let mut delta = Delta {
        floor: [(stream, FLOOR)].into_iter().collect(),
        ..Delta::default()
    };
    delta
        .floor_proofs
        .statements
        .push(statement.sign_by_admin(&admin()));
    a.apply(delta).expect("A trusts the admin");
    assert_eq!(a.floor().get(stream), FLOOR);
}

/// Runs a session between `a` and `b` until `done` holds (checked every
/// millisecond) and then for `linger` more, or for at most a minute; both
/// ends and the states of both sides.
fn session(
    a: &SharedReplica,
    b: &SharedReplica,
    done: impl Fn() -> bool,
    linger: Duration,
) -> ((SessionEnd, SessionState), (SessionEnd, SessionState)) {
    let config = SessionConfig::with_heartbeat(Duration::from_millis(20));
    run_paused(async {
        let (a_io, b_io) = tokio::io::duplex(1 << 20);
        let stop = async {
            let start = tokio::time::Instant::now();
            while !done() && start.elapsed() < Duration::from_secs(60) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            tokio::time::sleep(linger).await;
        };
        // Both sessions stop together, once `stop` has run.
        let (stopped, stopping) = tokio::sync::watch::channel(false);
        let stop_when = |mut stopping: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        };
        let a_session = Session::new(a.clone(), config.clone());
        let b_session = Session::new(b.clone(), config.clone());
        let (a_state, b_state) = (a_session.state(), b_session.state());
        let (a_end, b_end, ()) = tokio::join!(
            a_session.run_until(a_io, stop_when(stopping.clone())),
            b_session.run_until(b_io, stop_when(stopping)),
            async {
                stop.await;
                let _ = stopped.send(true);
            },
        );
        let a_state = a_state.borrow().clone();
        let b_state = b_state.borrow().clone();
        (
            (a_end.expect("A's session ends well"), a_state),
            (b_end.expect("B's session ends well"), b_state),
        )
    })
}

fn lost_from_start(replica: &SharedReplica) -> Vec<(StreamId, u64, u64)> {
    match replica.page(&VersionVector::new(), 100) {
        Err(PageError::Stale(stale)) => stale
            .lost()
            .iter()
            .map(|range| (range.stream, range.first_seq, range.last_seq))
            .collect(),
        Ok(page) => panic!(
            "a reader from the start is told nothing lost: {} events",
            page.events.len()
        ),
        Err(other) => panic!("{other}"),
    }
}

#[test]
fn an_admin_statement_reaches_a_peer_past_its_floor_and_erases_there() {
    let (w, a, b) = converged(true);
    let stream = w.stream();
    admin_compacts(&a, stream);
    let done = || b.floor().get(stream) >= FLOOR;
    // Many heartbeats after B took it: nothing is offered again.
    let ((a_end, a_state), (b_end, b_state)) = session(&a, &b, done, Duration::from_secs(2));
    assert_eq!((a_end, b_end), (SessionEnd::Stopped, SessionEnd::Stopped));
    assert_eq!(b.floor().get(stream), FLOOR, "B took the admin's floor");
    assert_eq!(b.marks().get(stream), HEAD, "B keeps what is above it");
    for seq in 1..=HEAD {
        assert_eq!(b.get(stream, seq).is_some(), seq > FLOOR, "seq {seq}");
    }
    assert_eq!(lost_from_start(&b), vec![(stream, 1, FLOOR)]);
    assert_eq!(lost_from_start(&a), vec![(stream, 1, FLOOR)]);
    assert_eq!(a.chain_digest(), b.chain_digest());
    assert_eq!(a_state.statements_sent, 1, "offered once: {a_state:?}");
    assert_eq!(b_state.statements_sent, 0, "B had nothing to offer A");
    assert_eq!(b_state.statements_refused, 0);
}

#[test]
fn a_peer_that_does_not_trust_the_admin_keeps_its_events_and_its_link() {
    let (w, a, b) = converged(false);
    let stream = w.stream();
    admin_compacts(&a, stream);
    let done = || false;
    let ((a_end, a_state), (b_end, b_state)) = session(&a, &b, done, Duration::ZERO);
    assert_eq!((a_end, b_end), (SessionEnd::Stopped, SessionEnd::Stopped));
    assert_eq!(a_state.statements_sent, 1, "{a_state:?}");
    assert_eq!(b_state.statements_refused, 1, "{b_state:?}");
    assert_eq!(b.floor().get(stream), 0, "nothing erased at B");
    assert_eq!(b.marks().get(stream), HEAD);
    assert!(b.page(&VersionVector::new(), 100).is_ok());
}

/// `frame`'s payload (without its length prefix).
fn payload(frame: &Frame) -> Vec<u8> {
    frame::encode(frame).expect("encodes")[LENGTH_PREFIX_BYTES..].to_vec()
}

#[test]
fn an_offered_statement_that_does_not_verify_ends_the_session_and_erases_nothing() {
    let (w, a, b) = converged(true);
    let stream = w.stream();
    admin_compacts(&a, stream);
    let now = Instant::now();
    let start = || core_after_hello(&a, &b, now);

    // The admin's statement of a stream B does not hold: nothing applied.
    let elsewhere = Compaction {
        stream: StreamId::new(77),
        floor: 3,
        hash: ChainHash::GENESIS,
    }
    .sign_by_admin(&admin());
    let mut core = start();
    hand_in(now, &mut core, &payload(&Frame::Statement(elsewhere)), &b)
        .expect("ignored, the session goes on");
    assert_eq!(b.floor().get(StreamId::new(77)), 0);
    assert_eq!(b.marks().get(StreamId::new(77)), 0);

    // A's statement with its signature altered: refused, nothing erased.
    let mut forged = a.statement(stream).expect("A keeps the admin's statement");
    forged.signature[0] ^= 1;
    let mut core = start();
    let error = hand_in(now, &mut core, &payload(&Frame::Statement(forged)), &b)
        .expect_err("a signature that does not verify ends the session");
    assert!(
        matches!(
            &error,
            SessionError::Core(ProtocolError::Refused {
                source: DeltaError::BadStatement { .. },
                ..
            })
        ),
        "{error}"
    );
    assert_eq!(b.floor().get(stream), 0, "nothing erased");
    assert_eq!(b.marks().get(stream), HEAD);
}

/// Issue 29: B does not trust the admin and holds W only below the
/// admin's floor A took; every delta A sends B carries W's floor and the
/// admin's statement. B cuts W whole from it (reported in its limits),
/// takes the rest (another writer's events), and the link is not ended by
/// a refusal. (Before the cut, B refused each delta whole,
/// `StatementNoAuthority`, and every session ended `Refused`.)
#[test]
fn a_peer_behind_a_floor_it_does_not_trust_cuts_the_stream_and_keeps_syncing() {
    let w = keyed(1, false);
    let b = keyed(3, false);
    for i in 0..3 {
        w.append_at(format!("w{i}").into_bytes(), 1_000 + i)
            .expect("append");
    }
    let hand = |from: &SharedReplica, to: &SharedReplica| {
        let delta = from.try_delta_for(&to.marks(), usize::MAX).expect("reads");
        to.apply(delta).expect("taken");
    };
    hand(&w, &b);
    for i in 3..HEAD {
        w.append_at(format!("w{i}").into_bytes(), 1_000 + i)
            .expect("append");
    }
    let other = keyed(4, false);
    for i in 0..5 {
        other
            .append_at(format!("x{i}").into_bytes(), 2_000 + i)
            .expect("append");
    }
    let a = keyed(2, true);
    hand(&w, &a);
    hand(&other, &a);
    let stream = w.stream();
    admin_compacts(&a, stream);

    let done = || b.marks().get(other.stream()) >= 5;
    let ((a_end, _), (b_end, b_state)) = session(&a, &b, done, Duration::from_secs(1));
    assert_eq!((a_end, b_end), (SessionEnd::Stopped, SessionEnd::Stopped));
    assert_eq!(b.marks().get(other.stream()), 5, "the other stream taken");
    assert_eq!(b.marks().get(stream), 3, "W as it was");
    assert_eq!(b.floor().get(stream), 0, "nothing erased at B");
    assert!(
        b_state
            .limits
            .contains(&meshlog_sync::LimitHit::StatementNoAuthority {
                stream,
                floor: FLOOR
            }),
        "{b_state:?}"
    );
}

/// An offered statement whose chain hash differs from the history the
/// receiver holds at its floor (an honest disagreement, e.g. a forked
/// writer's other history) is counted and logged, and the session goes
/// on: ending it would have each new session offer it again.
#[test]
fn an_offered_statement_whose_hash_differs_does_not_end_the_session() {
    let (w, a, b) = converged(true);
    let stream = w.stream();
    let now = Instant::now();
    let mut core = core_after_hello(&a, &b, now);
    let other_history = Compaction {
        stream,
        floor: FLOOR,
        hash: ChainHash::GENESIS,
    }
    .sign_by_admin(&admin());
    hand_in(
        now,
        &mut core,
        &payload(&Frame::Statement(other_history)),
        &b,
    )
    .expect("a hash mismatch does not end the session");
    assert_eq!(b.floor().get(stream), 0, "nothing erased");
    assert_eq!(b.marks().get(stream), HEAD);
}

/// B's core, after a hello from `a` that says it skips kinds it does not
/// know (so that A may offer statements).
fn core_after_hello(a: &SharedReplica, b: &SharedReplica, now: Instant) -> Protocol {
    let mut core = Protocol::new(b.stream(), SessionConfig::default(), now);
    let hello = Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        stream: a.stream(),
        marks: a.marks(),
        floor: a.floor(),
        frame_bytes_max: FRAME_BYTES_MAX as u32 | HELLO_SKIPS_UNKNOWN_KINDS,
    });
    hand_in(now, &mut core, &payload(&hello), b).expect("A's hello");
    core
}

/// Hands `frame` to B's core; whether it handed back something to apply
/// (a commit round), which is applied and reported.
fn offered_costs_a_round(
    now: Instant,
    core: &mut Protocol,
    frame: &Frame,
    b: &SharedReplica,
) -> bool {
    match core
        .handle_payload(now, &payload(frame), b)
        .expect("the session goes on")
    {
        meshlog_sync::proto::Received::Apply(columns) => {
            let applied = b.apply_columns(columns);
            core.handle_applied(now, applied)
                .expect("a refusal for no authority does not end the session");
            true
        }
        _ => false,
    }
}

/// The admin's statement that `stream` is compacted to `floor` over the
/// genesis hash: a chain no replica here holds at that floor.
fn genesis_statement(stream: StreamId, floor: u64) -> Frame {
    Frame::Statement(
        Compaction {
            stream,
            floor,
            hash: ChainHash::GENESIS,
        }
        .sign_by_admin(&admin()),
    )
}

/// Issue 29: a refused statement offered again in the same session costs
/// B a lookup: no commit round (nothing handed back to apply, the
/// replica's refusal counter unchanged), counted in
/// `statements_refused`, not logged again; one by the same signer at
/// another floor too (authority depends on the stream and the signer).
/// Before, each repeat was applied and refused again: a commit round and
/// two `warn` lines each.
#[test]
fn a_refused_statement_offered_again_costs_no_commit_round() {
    let (w, a, b) = converged(false);
    let stream = w.stream();
    let now = Instant::now();
    let mut core = core_after_hello(&a, &b, now);
    let statement = |floor| genesis_statement(stream, floor);
    assert!(offered_costs_a_round(now, &mut core, &statement(FLOOR), &b));
    assert_eq!(b.stats().deltas_refused, 1);
    for floor in [FLOOR, FLOOR, FLOOR - 1] {
        assert!(
            !offered_costs_a_round(now, &mut core, &statement(floor), &b),
            "a repeat at floor {floor} was applied again"
        );
    }
    assert_eq!(b.stats().deltas_refused, 1, "no round refused again");
    assert_eq!(core.state().statements_refused, 4);
    assert!(core.state().limits.is_empty(), "{:?}", core.state().limits);
    assert_eq!(b.floor().get(stream), 0, "nothing erased");
    assert_eq!(b.marks().get(stream), HEAD);
    // Another session judges it again: the memory is the session's.
    let mut next = core_after_hello(&a, &b, now);
    assert!(offered_costs_a_round(now, &mut next, &statement(FLOOR), &b));
    assert_eq!(b.stats().deltas_refused, 2);
}

/// Issue 29: a statement refused for a chain hash that is not B's at its
/// floor, offered again in the same session, costs B a lookup too (it
/// cost a commit round and two `warn` lines each time: only refusals for
/// no authority were remembered). The memory is by stream, floor and
/// hash: the same statement at another floor is judged (and refused)
/// once, and the admin's real statement, whose hash is B's, still erases.
#[test]
fn a_statement_refused_for_a_hash_mismatch_offered_again_costs_no_commit_round() {
    let (w, a, b) = converged(true);
    let stream = w.stream();
    let now = Instant::now();
    let mut core = core_after_hello(&a, &b, now);
    let other_history = |floor| genesis_statement(stream, floor);
    assert!(offered_costs_a_round(
        now,
        &mut core,
        &other_history(FLOOR),
        &b
    ));
    assert_eq!(b.stats().deltas_refused, 1);
    for _ in 0..3 {
        assert!(
            !offered_costs_a_round(now, &mut core, &other_history(FLOOR), &b),
            "a repeat was applied again"
        );
    }
    assert_eq!(b.stats().deltas_refused, 1, "no round refused again");
    assert!(offered_costs_a_round(
        now,
        &mut core,
        &other_history(FLOOR - 1),
        &b
    ));
    assert!(!offered_costs_a_round(
        now,
        &mut core,
        &other_history(FLOOR - 1),
        &b
    ));
    assert_eq!(b.stats().deltas_refused, 2);
    assert_eq!(core.state().statements_refused, 6);
    assert!(core.state().limits.is_empty(), "{:?}", core.state().limits);
    assert_eq!(b.floor().get(stream), 0, "nothing erased");

    let real = b
        .compaction_at(stream, FLOOR)
        .expect("b reads")
        .expect("held and anchored")
        .sign_by_admin(&admin());
    assert!(offered_costs_a_round(
        now,
        &mut core,
        &Frame::Statement(real),
        &b
    ));
    assert_eq!(b.floor().get(stream), FLOOR, "the real statement erases");
}

/// The memory of refused statements is bounded: past
/// `STATEMENT_REFUSALS_MAX` pairs a refused pair is not remembered (its
/// repeat costs a round again), reported once as
/// `LimitHit::StatementRefusalsMax`; the pairs remembered stay so.
#[test]
fn the_memory_of_refused_statements_stops_at_its_bound_and_says_so() {
    let (w, a, b) = converged(false);
    let stream = w.stream();
    let now = Instant::now();
    let mut core = core_after_hello(&a, &b, now);
    // Signed by distinct keys B does not trust.
    let by = |signer: usize| {
        let mut secret = [9u8; 32];
        secret[..8].copy_from_slice(&(signer as u64).to_le_bytes());
        Frame::Statement(
            Compaction {
                stream,
                floor: FLOOR,
                hash: ChainHash::GENESIS,
            }
            .sign_by_admin(&AdminKey::from_bytes(secret)),
        )
    };
    let max = meshlog_sync::STATEMENT_REFUSALS_MAX;
    for signer in 0..=max + 1 {
        assert!(offered_costs_a_round(now, &mut core, &by(signer), &b));
    }
    let hit = meshlog_sync::LimitHit::StatementRefusalsMax { limit: max };
    assert_eq!(core.state().limits, vec![hit], "reported once");
    assert!(!offered_costs_a_round(now, &mut core, &by(0), &b));
    assert!(!offered_costs_a_round(now, &mut core, &by(max - 1), &b));
    assert!(
        offered_costs_a_round(now, &mut core, &by(max), &b),
        "a pair past the bound is judged again"
    );
    assert_eq!(core.state().statements_refused as usize, max + 2 + 3);
    assert_eq!(b.floor().get(stream), 0, "nothing erased");
}
