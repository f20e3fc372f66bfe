//! Signed streams over real sessions (issue 29, step 3: seals on the wire,
//! protocol 4; `docs/SIGNING.md`, `docs/PROTOCOL.md`).
//!
//! What it proves:
//!
//! - A keyed writer's seals cross the wire, its own and those it relays: a
//!   receiver syncing with it over real `Session`s verifies them and pins
//!   both writers' keys (shown afterwards: each writer's next run with its
//!   seal cut off is refused, `Unsealed`), and holds their chains as they
//!   do.
//! - A hostile relay in the middle of a real session (the kit's
//!   `tamperings`: an event forged, altered or reordered, another writer's
//!   spliced in, the seal cut off, replaced by an older one, by another
//!   key's or with its signature altered): each ends the receiver's session
//!   with `SessionError::Refused` and its typed reason, logged; the
//!   receiver is unchanged (marks, floor, chain digest, events); the
//!   writer's session never refuses anything; and afterwards the honest
//!   events converge over an honest session, so the writer is never cut
//!   off.
//! - A delta split into frames keeps each sealed run whole with its seal,
//!   and a sealed stream cut for a receiver's limit is cut whole, never
//!   left as a run its seal does not end: neither ends the session (each
//!   did: the split left the parts unsealed, `Unsealed`; the cut kept a
//!   seal past the run, `ChainBroken`).
//!
//! - Hostile floors in the middle of a session (the kit's
//!   `floor_attacks`): an unsigned floor above the receiver's held events
//!   is taken and ignored (nothing erased, the session goes on), and a
//!   floor whose statement is signed by a key that is not the trusted
//!   admin's ends the session `Refused` with `StatementNoAuthority`,
//!   logged; either way the receiver is unchanged and the writer's events
//!   converge afterwards.
//!
//! How: keyed replicas in memory from fixed secrets; two real `Session`s
//! over an in-memory stream, or over `testkit::tampering_link`, which
//! decodes the writer's deltas and hands them to the test to rewrite.
//! Seeded (event counts, payloads, the order of the tamperings); the seed is
//! printed on failure and replayed from `MESHLOG_SEED`. Tokio's clock is
//! paused.

use std::cell::{Cell, RefCell};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use meshlog_cursor::StreamId;
use meshlog_replica::{
    AdminKey, Commits, Config, Delta, DeltaError, Event, MemStore, Membership, Replica,
    ReplicaError, WriterKey,
};
use meshlog_sync::testkit::{self, SplitMix64};
use meshlog_sync::{
    LimitHit, ProtocolError, Session, SessionConfig, SessionEnd, SessionError, SessionState,
    SharedReplica,
};
use meshlog_testkit::hostile::{floor_attacks, tamperings, FloorOutcome};
use meshlog_testkit::Snapshot;

const RECEIVER: StreamId = StreamId::new(0xa);
const CONVERGE_WITHIN: Duration = Duration::from_secs(30);

fn config() -> SessionConfig {
    SessionConfig::with_heartbeat(Duration::from_millis(20))
}

/// A keyed replica in memory, sealing the stream its key derives.
fn keyed(secret: u8) -> (WriterKey, SharedReplica) {
    let key = WriterKey::from_bytes([secret; 32]);
    let replica = Replica::open(Config::with_key(key.clone()), MemStore::default())
        .expect("an empty store opens");
    (key, SharedReplica::with_commits(replica, Commits::Inline))
}

/// What a refusal must leave unchanged.
fn snapshot(replica: &SharedReplica) -> Snapshot {
    Snapshot::new(
        replica.marks(),
        replica.floor(),
        replica.chain_digest(),
        |stream, seq| replica.get(stream, seq),
    )
}

/// Appends `low` to `high` events (drawn) of seeded payloads to `replica`.
fn append(replica: &SharedReplica, rng: &mut SplitMix64, low: u64, high: u64) {
    for _ in 0..rng.between(low, high) {
        let len = rng.below(24) as usize;
        let payload: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        replica
            .append_at(payload, 1_000 + rng.below(1_000))
            .expect("append");
    }
}

/// Two real sessions between `a` and `b`, each with its config, until
/// their marks and chain digests agree; both must end stopped.
async fn converge_with(a: &SharedReplica, b: &SharedReplica, a_config: SessionConfig) {
    let (a_io, b_io) = tokio::io::duplex(1 << 20);
    let agreed = || async {
        testkit::wait_for("convergence", CONVERGE_WITHIN, || {
            a.marks() == b.marks() && a.chain_digest() == b.chain_digest()
        })
        .await;
    };
    let (a_end, b_end) = tokio::join!(
        Session::new(a.clone(), a_config).run_until(a_io, agreed()),
        Session::new(b.clone(), config()).run_until(b_io, agreed()),
    );
    assert!(
        matches!(
            (&a_end, &b_end),
            (Ok(SessionEnd::Stopped), Ok(SessionEnd::Stopped))
        ),
        "{a_end:?}, {b_end:?}"
    );
}

async fn converge(a: &SharedReplica, b: &SharedReplica) {
    converge_with(a, b, config()).await;
}

/// `writer`'s next run of `stream`, with its seal cut off, is refused by
/// `receiver` as unsealed: the receiver pinned the stream's key.
fn assert_pinned(writer: &SharedReplica, receiver: &SharedReplica, stream: StreamId) {
    let mut delta = writer.delta_for(&receiver.marks(), usize::MAX);
    assert!(
        delta.events.iter().any(|e| e.stream == stream),
        "nothing new of {stream}"
    );
    delta.seals.retain(|s| s.seal.stream != stream);
    let before = snapshot(receiver);
    let refused = receiver
        .apply(delta)
        .expect_err("an unsealed run of a pinned stream");
    assert!(
        matches!(refused, ReplicaError::Delta(DeltaError::Unsealed { stream: s, .. }) if s == stream),
        "{refused:?}"
    );
    assert_eq!(snapshot(receiver), before);
}

#[test]
fn a_sealing_writer_syncs_to_a_receiver_that_pins_it_and_the_writers_it_relays() {
    testkit::for_each_seed("sealing_writer_syncs", 0x5ea1, 4, |seed| {
        testkit::run_paused(async move {
            let mut rng = SplitMix64::new(seed);
            let (_, writer) = keyed(1);
            let (_, third) = keyed(2);
            let receiver = SharedReplica::in_memory(RECEIVER);
            append(&third, &mut rng, 1, 40);
            converge(&third, &writer).await;
            append(&writer, &mut rng, 1, 40);
            append(&receiver, &mut rng, 0, 2);
            converge(&writer, &receiver).await;
            for stream in [writer.stream(), third.stream()] {
                assert_eq!(
                    receiver.chain_digest().stream(stream),
                    writer.chain_digest().stream(stream),
                    "seed {seed}: the chain of {stream}"
                );
            }
            // Both keys pinned: the receiver verified the writer's own seal
            // and the third writer's, relayed, both from the frames.
            append(&writer, &mut rng, 1, 1);
            append(&third, &mut rng, 1, 1);
            converge(&third, &writer).await;
            assert_pinned(&writer, &receiver, writer.stream());
            assert_pinned(&writer, &receiver, third.stream());
        });
    });
}

// The log a test captures, per thread (the paused runtime is
// current-thread): what a session reports at `warn`.
thread_local! {
    static CAPTURED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

struct ThreadCapture;

impl std::io::Write for ThreadCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        CAPTURED.with(|captured| captured.borrow_mut().extend_from_slice(bytes));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Clears this thread's captured log, and installs the capture once.
fn capture_log() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing_subscriber::fmt()
            .with_writer(|| ThreadCapture)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
    });
    CAPTURED.with(|captured| captured.borrow_mut().clear());
}

fn captured_log() -> String {
    CAPTURED.with(|captured| String::from_utf8_lossy(&captured.borrow()).into_owned())
}

/// The refusal a tampering is due, once the relay made it: what, and why.
type Due = Arc<Mutex<Option<(&'static str, DeltaError)>>>;

/// One session from `writer` to `receiver` through a relay that replaces
/// the first delta carrying at least three new events of `writer`'s stream
/// by tampering `index` of it. How each side's session ended, and what
/// was due.
async fn through_hostile_relay(
    writer: &SharedReplica,
    receiver: &SharedReplica,
    key: &WriterKey,
    index: usize,
    foreign: Event,
) -> (
    Result<SessionEnd, SessionError>,
    Result<SessionEnd, SessionError>,
    Option<(&'static str, DeltaError)>,
) {
    let stream = key.stream();
    let head_hash = receiver.chain(stream).expect("held").head_hash;
    let due: Due = Arc::default();
    let relay_due = due.clone();
    let key = key.clone();
    // The stranger of the tamperings counted by the test.
    let stranger = WriterKey::from_bytes([99; 32]);
    let (writer_io, receiver_io) = testkit::tampering_link(move |_, delta: Delta| {
        let mut due = relay_due.lock().unwrap();
        let run = delta.events.iter().filter(|e| e.stream == stream).count();
        if due.is_some() || run < 3 {
            return delta;
        }
        let tampering = tamperings(&delta, &key, head_hash, &stranger, &foreign)
            .into_iter()
            .nth(index)
            .expect("a tampering of that index");
        *due = Some((tampering.what, tampering.refusal));
        tampering.delta
    });
    // Bounded, so that a tampering wrongly taken fails the test rather
    // than hang it.
    let stop = || tokio::time::sleep(CONVERGE_WITHIN);
    let (writer_end, receiver_end) = tokio::join!(
        Session::new(writer.clone(), config()).run_until(writer_io, stop()),
        Session::new(receiver.clone(), config()).run_until(receiver_io, stop()),
    );
    let due = due.lock().unwrap().take();
    (writer_end, receiver_end, due)
}

#[test]
fn a_hostile_relay_in_a_session_is_refused_with_its_reason_and_the_writer_still_syncs() {
    testkit::for_each_seed("hostile_relay_in_a_session", 0x7a3e, 2, |seed| {
        capture_log();
        testkit::run_paused(async move {
            let mut rng = SplitMix64::new(seed);
            let (key, writer) = keyed(3);
            let (_, third) = keyed(4);
            let receiver = SharedReplica::in_memory(RECEIVER);
            append(&writer, &mut rng, 1, 5);
            append(&third, &mut rng, 1, 1);
            converge(&third, &writer).await;
            converge(&writer, &receiver).await;
            let foreign = third.get(third.stream(), 1).expect("held");
            // Every tampering the kit knows, in a drawn order.
            append(&writer, &mut rng, 3, 3);
            let honest = writer.delta_for(&receiver.marks(), usize::MAX);
            let head_hash = receiver.chain(key.stream()).expect("held").head_hash;
            let stranger = WriterKey::from_bytes([99; 32]);
            let count = tamperings(&honest, &key, head_hash, &stranger, &foreign).len();
            let mut order: Vec<usize> = (0..count).collect();
            rng.shuffle(&mut order);
            for index in order {
                // New events of the writer (and at times of the third
                // writer, relayed beside them), then the relay tampers.
                append(&writer, &mut rng, 3, 8);
                if rng.chance(0.5) {
                    append(&third, &mut rng, 1, 3);
                    converge(&third, &writer).await;
                }
                let before = snapshot(&receiver);
                capture_log();
                let (writer_end, receiver_end, due) =
                    through_hostile_relay(&writer, &receiver, &key, index, foreign.clone()).await;
                let (what, refusal) = due.expect("the relay tampered with a delta");
                match receiver_end {
                    Err(SessionError::Core(ProtocolError::Refused { peer, source })) => {
                        assert_eq!(peer, writer.stream(), "seed {seed}: {what}");
                        assert_eq!(source, refusal, "seed {seed}: {what}");
                    }
                    other => panic!("seed {seed}: {what}: the receiver's session ended {other:?}"),
                }
                let log = captured_log();
                assert!(
                    log.contains("peer sent a run its seal does not vouch for")
                        && log.contains(&refusal.to_string()),
                    "seed {seed}: {what}: not reported:\n{log}"
                );
                assert_eq!(
                    snapshot(&receiver),
                    before,
                    "seed {seed}: {what} changed the receiver"
                );
                assert!(
                    matches!(
                        writer_end,
                        Ok(SessionEnd::PeerClosed) | Err(SessionError::Io(_))
                    ),
                    "seed {seed}: {what}: the writer's session ended {writer_end:?}"
                );
                // The honest events still come through.
                converge(&writer, &receiver).await;
                assert_eq!(
                    receiver.marks().get(writer.stream()),
                    writer.marks().get(writer.stream())
                );
            }
            append(&writer, &mut rng, 1, 1);
            assert_pinned(&writer, &receiver, writer.stream());
        });
    });
}

/// Issue 29's hostile floors over a real session: every delta the writer
/// sends is replaced by the attack's floor (no events). The unsigned floor
/// above the receiver's held events erases nothing and ends nothing; the
/// floor signed by a key that is not the admin's is refused with its
/// reason and logged. The receiver is unchanged either way, and the
/// writer's events converge over an honest session afterwards.
#[test]
fn hostile_floors_in_a_session_erase_nothing_and_the_writer_still_syncs() {
    testkit::for_each_seed("hostile_floors_in_a_session", 0x29f1, 2, |seed| {
        capture_log();
        testkit::run_paused(async move {
            let mut rng = SplitMix64::new(seed);
            let (key, writer) = keyed(3);
            let stream = key.stream();
            let admin = AdminKey::from_bytes([40; 32]);
            let not_admin = AdminKey::from_bytes([41; 32]);
            let mut membership = Membership::open();
            membership.trust_admin(admin.public());
            let receiver_config = Config {
                membership,
                ..Config::new(RECEIVER)
            };
            let receiver = SharedReplica::with_commits(
                Replica::open(receiver_config, MemStore::default()).expect("opens"),
                Commits::Inline,
            );
            append(&writer, &mut rng, 3, 6);
            converge(&writer, &receiver).await;
            let head = receiver.marks().get(stream);
            let head_hash = receiver.chain(stream).expect("held").head_hash;
            for attack in floor_attacks(stream, head, head_hash, &not_admin) {
                let what = attack.what;
                append(&writer, &mut rng, 1, 4);
                let before = snapshot(&receiver);
                capture_log();
                let hostile = attack.delta.clone();
                let (writer_io, receiver_io) = testkit::tampering_link(move |_, _| hostile.clone());
                let stop = || tokio::time::sleep(Duration::from_secs(2));
                let (writer_end, receiver_end) = tokio::join!(
                    Session::new(writer.clone(), config()).run_until(writer_io, stop()),
                    Session::new(receiver.clone(), config()).run_until(receiver_io, stop()),
                );
                match &attack.outcome {
                    // A statement without authority here cuts its stream
                    // from the delta (reported, logged) and the session
                    // goes on; applied whole, the replica refuses it
                    // (issue 29: a difference in trust keeps the link).
                    FloorOutcome::Refused(DeltaError::StatementNoAuthority { .. }) => {
                        assert!(
                            matches!(receiver_end, Ok(SessionEnd::Stopped)),
                            "seed {seed}: {what}: ended {receiver_end:?}"
                        );
                        let log = captured_log();
                        assert!(
                            log.contains("peer sent a compaction statement for it"),
                            "seed {seed}: {what}: not reported:\n{log}"
                        );
                    }
                    FloorOutcome::Refused(reason) => {
                        match receiver_end {
                            Err(SessionError::Core(ProtocolError::Refused { peer, source })) => {
                                assert_eq!(peer, writer.stream(), "seed {seed}: {what}");
                                assert_eq!(&source, reason, "seed {seed}: {what}");
                            }
                            other => panic!("seed {seed}: {what}: ended {other:?}"),
                        }
                        let log = captured_log();
                        assert!(
                            log.contains("peer sent a compaction statement without authority"),
                            "seed {seed}: {what}: not reported:\n{log}"
                        );
                    }
                    FloorOutcome::Ignored => assert!(
                        matches!(receiver_end, Ok(SessionEnd::Stopped)),
                        "seed {seed}: {what}: ended {receiver_end:?}"
                    ),
                }
                assert!(
                    matches!(
                        writer_end,
                        Ok(SessionEnd::Stopped | SessionEnd::PeerClosed) | Err(SessionError::Io(_))
                    ),
                    "seed {seed}: {what}: the writer's session ended {writer_end:?}"
                );
                assert_eq!(
                    snapshot(&receiver),
                    before,
                    "seed {seed}: {what} changed the receiver"
                );
                // The writer is not cut off: its events converge.
                converge(&writer, &receiver).await;
                assert_eq!(receiver.marks().get(stream), writer.marks().get(stream));
            }
        });
    });
}

/// A backlog of two sealed writers larger than a frame carries, sent by a
/// session whose budget reads it in one delta: split at run boundaries,
/// each run whole with its seal, so the receiver, which pinned both, takes
/// every part. (Split as before, by the event limit alone, the parts went
/// unsealed and the receiver refused the first: `Unsealed`.)
#[test]
fn a_delta_split_into_frames_keeps_each_sealed_run_whole() {
    testkit::run_paused(async {
        let mut rng = SplitMix64::new(0x5b17);
        let (_, writer) = keyed(5);
        let (_, third) = keyed(6);
        let receiver = SharedReplica::in_memory(RECEIVER);
        append(&writer, &mut rng, 2, 2);
        append(&third, &mut rng, 2, 2);
        converge(&third, &writer).await;
        converge(&writer, &receiver).await;
        // 5,000 events each: 10,000 in one delta under a 2 MiB budget.
        let payloads = |n: u8| (0..5_000).map(move |i| bytes::Bytes::from(vec![n, i as u8]));
        writer.append_batch(payloads(1).collect()).expect("append");
        third.append_batch(payloads(2).collect()).expect("append");
        converge(&third, &writer).await;
        let mut large = config();
        large.delta_bytes_max = 2 << 20;
        converge_with(&writer, &receiver, large).await;
        assert_eq!(receiver.marks().get(third.stream()), 5_002);
        append(&writer, &mut rng, 1, 1);
        append(&third, &mut rng, 1, 1);
        converge(&third, &writer).await;
        assert_pinned(&writer, &receiver, writer.stream());
        assert_pinned(&writer, &receiver, third.stream());
    });
}

/// A sealed stream the receiver cuts for its `payload_bytes_max` (an event
/// above it amid the run) is cut whole, reported, and the rest of the
/// delta applied: the session goes on. (Cut at the event, the run kept a
/// seal it no longer ended at, and the receiver's replica refused the
/// delta: `ChainBroken`.)
#[test]
fn a_sealed_stream_cut_for_a_limit_is_cut_whole_and_the_session_goes_on() {
    testkit::run_paused(async {
        let (_, writer) = keyed(7);
        let mut limited = Config::new(RECEIVER);
        limited.payload_bytes_max = 64;
        let receiver = SharedReplica::with_commits(
            Replica::open(limited, MemStore::default()).expect("opens"),
            Commits::Inline,
        );
        let (_, small) = keyed(8);
        for payload in [&[1u8; 8][..], &[2; 100], &[3; 8]] {
            writer.append_at(payload.to_vec(), 1_000).expect("append");
        }
        small.append_at(&b"fits"[..], 1_000).expect("append");
        converge(&small, &writer).await;
        let (a_io, b_io) = tokio::io::duplex(1 << 20);
        let session = Session::new(receiver.clone(), config());
        let state = session.state();
        let taken = || async {
            testkit::wait_for("the small writer's event", CONVERGE_WITHIN, || {
                receiver.marks().get(small.stream()) == 1
            })
            .await;
        };
        let (writer_end, receiver_end) = tokio::join!(
            Session::new(writer.clone(), config()).run_until(a_io, taken()),
            session.run_until(b_io, taken()),
        );
        assert!(
            matches!(receiver_end, Ok(SessionEnd::Stopped)),
            "{receiver_end:?}"
        );
        assert!(
            matches!(writer_end, Ok(SessionEnd::Stopped)),
            "{writer_end:?}"
        );
        assert_eq!(
            receiver.marks().get(writer.stream()),
            0,
            "nothing of the cut stream"
        );
        let limits = state.borrow().limits.clone();
        assert!(
            matches!(limits[..], [LimitHit::PayloadBytesMax { stream, seq: 2, len: 100, limit: 64 }] if stream == writer.stream()),
            "{limits:?}"
        );
    });
}

/// One real session between `peer` and `receiver` for `rounds` rounds: in
/// each after the first, the test appends to every one of `writers` and
/// syncs them to `peer`; every round waits until `taken()` (the receiver
/// holds what it should) or the receiver's session ended. The receiver
/// stops first, the peer once it did. Both sessions must have ended
/// stopped (the link kept); answers what the peer's and the receiver's
/// sessions reported.
async fn relay_rounds(
    peer: &SharedReplica,
    receiver: &SharedReplica,
    writers: &[&SharedReplica],
    rng: &mut SplitMix64,
    rounds: usize,
    taken: impl Fn() -> bool,
    seed: u64,
) -> (SessionState, SessionState) {
    let (peer_io, receiver_io) = tokio::io::duplex(1 << 20);
    let (peer_session, receiver_session) = (
        Session::new(peer.clone(), config()),
        Session::new(receiver.clone(), config()),
    );
    let (peer_state, receiver_state) = (peer_session.state(), receiver_session.state());
    let (ended, done) = (Cell::new(false), Cell::new(false));
    let driver = async {
        for round in 0..rounds {
            if round > 0 {
                for writer in writers {
                    append(writer, rng, 1, 5);
                    converge(writer, peer).await;
                }
            }
            testkit::wait_for("the receiver's events", CONVERGE_WITHIN, || {
                ended.get() || taken()
            })
            .await;
            if ended.get() {
                break;
            }
        }
        done.set(true);
    };
    let stop = testkit::wait_for("the test's end", CONVERGE_WITHIN, || done.get());
    let receiver_run = async {
        let end = receiver_session.run_until(receiver_io, stop).await;
        ended.set(true);
        end
    };
    let peer_stop = testkit::wait_for("the receiver's end", CONVERGE_WITHIN, || ended.get());
    let (peer_end, receiver_end, ()) = tokio::join!(
        peer_session.run_until(peer_io, peer_stop),
        receiver_run,
        driver,
    );
    assert!(
        matches!(receiver_end, Ok(SessionEnd::Stopped)),
        "seed {seed}: the receiver's session ended {receiver_end:?}"
    );
    assert!(
        matches!(peer_end, Ok(SessionEnd::Stopped | SessionEnd::PeerClosed)),
        "seed {seed}: the peer's session ended {peer_end:?}"
    );
    let peer_state = peer_state.borrow().clone();
    let receiver_state = receiver_state.borrow().clone();
    (peer_state, receiver_state)
}

/// The one captured log line that contains `says`, at `WARN`.
fn warned_once(says: &str, seed: u64) -> String {
    let log = captured_log();
    let warned: Vec<&str> = log.lines().filter(|line| line.contains(says)).collect();
    assert_eq!(warned.len(), 1, "seed {seed}: logged once:\n{log}");
    assert!(warned[0].contains("WARN"), "seed {seed}: {}", warned[0]);
    warned[0].to_owned()
}

/// Issue 29, membership liveness: a receiver whose closed membership
/// admits one writer syncs with a peer holding that writer's stream and
/// a stranger's, both sealed. Before, the receiver's replica refused each
/// delta whole (`UnknownWriter`), the session ended `Refused`, and on
/// every redial again: the admitted writer's events never arrived. Now
/// the receiver's admission cuts the stranger's stream out, the session
/// asks it quiet and reports it (`LimitHit::UnknownWriter`, logged once
/// with its key), and takes the rest: the admitted writer converges, and
/// its later appends keep flowing in the same session, while the
/// stranger's (old and new) are never held.
#[test]
fn a_closed_receiver_cuts_an_unknown_writer_and_keeps_syncing_the_admitted_one() {
    testkit::for_each_seed("closed_receiver_cuts_unknown_writer", 0xc105, 2, |seed| {
        capture_log();
        testkit::run_paused(async move {
            let mut rng = SplitMix64::new(seed);
            let (admitted_key, admitted) = keyed(11);
            let (stranger_key, stranger) = keyed(12);
            // An open, keyed peer relaying both (its own stream empty).
            let (_, peer) = keyed(13);
            append(&admitted, &mut rng, 1, 20);
            append(&stranger, &mut rng, 1, 20);
            converge(&admitted, &peer).await;
            converge(&stranger, &peer).await;
            let mut membership = meshlog_replica::Membership::closed();
            membership.admit(admitted_key.public());
            let closed = Config {
                membership,
                ..Config::new(RECEIVER)
            };
            let receiver = SharedReplica::with_commits(
                Replica::open(closed, MemStore::default()).expect("opens"),
                Commits::Inline,
            );
            let (a, s) = (admitted_key.stream(), stranger_key.stream());
            // The test's side: it waits for the admitted writer, then
            // appends more of both writers, which reach the peer, in the
            // same session.
            let converged = || {
                receiver.marks().get(a) == admitted.marks().get(a)
                    && receiver.chain_digest().stream(a) == admitted.chain_digest().stream(a)
            };
            let (peer_state, receiver_state) = relay_rounds(
                &peer,
                &receiver,
                &[&admitted, &stranger],
                &mut rng,
                4,
                converged,
                seed,
            )
            .await;
            let held = snapshot(&receiver);
            assert_eq!(held.marks.get(s), 0, "seed {seed}");
            assert_eq!(held.floor.get(s), 0, "seed {seed}");
            assert!(held.events.iter().all(|e| e.stream == a), "seed {seed}");
            assert_eq!(
                receiver_state.limits,
                [LimitHit::UnknownWriter {
                    stream: s,
                    key: Some(stranger_key.public()),
                }],
                "seed {seed}"
            );
            assert!(receiver_state.events_over_limit > 0, "seed {seed}");
            assert_eq!(peer_state.peer_quiet_streams, 1, "seed {seed}: asked quiet");
            let warned = warned_once("peer relayed a writer this node does not admit", seed);
            assert!(
                warned.contains(&s.to_string())
                    && warned.contains(&stranger_key.public().to_string()),
                "seed {seed}: {warned}"
            );
        });
    });
}

/// A receiver that requires seals, syncing with a peer that holds a
/// sealed writer and an unsealed legacy one (a stream from before signed
/// streams), keeps the link: it cuts the legacy stream from the peer's
/// deltas, asks it quiet and reports it (`LimitHit::Unsealed`, logged
/// once), and takes the sealed writer's events, later appends included.
/// On the old code the whole delta was refused `Unsealed` and the session
/// ended (`SessionError::Refused`): one legacy stream anywhere in the mesh
/// cut every `require_seals` node off from its peers.
#[test]
fn a_receiver_requiring_seals_cuts_an_unsealed_legacy_stream_and_keeps_syncing() {
    testkit::for_each_seed("require_seals_cuts_unsealed", 0x5ea1, 2, |seed| {
        capture_log();
        testkit::run_paused(async move {
            let mut rng = SplitMix64::new(seed);
            let (_, sealed) = keyed(21);
            let legacy_stream = StreamId::new(0x1e6);
            let legacy = SharedReplica::with_commits(Replica::new(legacy_stream), Commits::Inline);
            // An open, keyed peer relaying both (its own stream empty).
            let (_, peer) = keyed(23);
            append(&sealed, &mut rng, 1, 20);
            append(&legacy, &mut rng, 1, 20);
            converge(&sealed, &peer).await;
            converge(&legacy, &peer).await;
            let strict = Config {
                require_seals: true,
                ..Config::new(RECEIVER)
            };
            let receiver = SharedReplica::with_commits(
                Replica::open(strict, MemStore::default()).expect("opens"),
                Commits::Inline,
            );
            let s = sealed.stream();
            let converged = || {
                receiver.marks().get(s) == sealed.marks().get(s)
                    && receiver.chain_digest().stream(s) == sealed.chain_digest().stream(s)
            };
            let (peer_state, receiver_state) = relay_rounds(
                &peer,
                &receiver,
                &[&sealed, &legacy],
                &mut rng,
                3,
                converged,
                seed,
            )
            .await;
            let held = snapshot(&receiver);
            assert_eq!(held.marks.get(legacy_stream), 0, "seed {seed}");
            assert_eq!(held.marks.get(s), sealed.marks().get(s), "seed {seed}");
            assert!(held.events.iter().all(|e| e.stream == s), "seed {seed}");
            assert_eq!(
                receiver_state.limits,
                [LimitHit::Unsealed {
                    stream: legacy_stream
                }],
                "seed {seed}"
            );
            assert_eq!(peer_state.peer_quiet_streams, 1, "seed {seed}: asked quiet");
            let warned = warned_once("stream refused: peer relayed an unsealed stream", seed);
            assert!(
                warned.contains(&legacy_stream.to_string()),
                "seed {seed}: {warned}"
            );
        });
    });
}

/// Sessions between `a` and `b` until `done` (bounded) or one ends; how
/// each ended.
async fn sessions_until(
    a: &SharedReplica,
    b: &SharedReplica,
    done: impl Fn() -> bool,
) -> (
    Result<SessionEnd, SessionError>,
    Result<SessionEnd, SessionError>,
    meshlog_sync::SessionState,
) {
    let (a_io, b_io) = tokio::io::duplex(1 << 20);
    let stop = || testkit::wait_for("the sessions' goal", CONVERGE_WITHIN, &done);
    let b_session = Session::new(b.clone(), config());
    let b_state = b_session.state();
    let (a_end, b_end) = tokio::join!(
        Session::new(a.clone(), config()).run_until(a_io, stop()),
        b_session.run_until(b_io, stop()),
    );
    let state = b_state.borrow().clone();
    (a_end, b_end, state)
}

/// Equivocation with valid signatures over real sessions (the kit's
/// `equivocating_writers`: one key, two histories, each sealed). A
/// receiver takes history A from one relay, then meets history B in a
/// session with a second relay: refused `Forked`, the proof kept, the
/// session going on (`fork_in_session.rs`). In the next session with that
/// relay the forked stream is cut (`Frozen`) while another writer's events
/// keep flowing, and the relay holds the proof (learned from the receiver
/// in either session) and freezes too. A third peer, syncing with the
/// receiver, learns the proof first and takes nothing of the forked
/// stream, the other writer's events all the same. On the old code the
/// second history ended every session `ChainBroken`, kept nothing and
/// froze nothing.
#[test]
fn a_forked_writer_is_proven_over_sessions_and_a_third_peer_learns_the_proof_and_freezes() {
    testkit::for_each_seed("forked_writer_over_sessions", 0xf04c, 2, |seed| {
        capture_log();
        testkit::run_paused(async move {
            let mut rng = SplitMix64::new(seed);
            let key = WriterKey::from_bytes([21; 32]);
            let stream = key.stream();
            let mut payloads = |count: u64, tag: u8| -> Vec<bytes::Bytes> {
                (0..count)
                    .map(|i| bytes::Bytes::from(vec![tag, i as u8, rng.next_u64() as u8]))
                    .collect()
            };
            let (common, a_len) = (payloads(2, 1), 3);
            let (a, b) = meshlog_testkit::hostile::equivocating_writers(
                &key,
                &common,
                &payloads(a_len, 2),
                &payloads(a_len, 3),
            );
            let b_more = payloads(2, 4);
            let writer_a = SharedReplica::with_commits(a, Commits::Inline);
            let writer_b = SharedReplica::with_commits(b, Commits::Inline);
            let (_, relay_a) = keyed(22);
            let (_, relay_b) = keyed(23);
            let (_, other) = keyed(24);
            append(&other, &mut rng, 1, 6);
            converge(&writer_a, &relay_a).await;
            // Relay B takes B in two steps: it keeps a seal where A ends.
            converge(&writer_b, &relay_b).await;
            for payload in b_more {
                writer_b.append(payload).expect("append");
            }
            converge(&writer_b, &relay_b).await;
            let receiver = SharedReplica::in_memory(RECEIVER);
            converge(&relay_a, &receiver).await;
            let a_head = receiver.marks().get(stream);
            // History B: refused as a fork, the proof kept.
            let (_, receiver_end, _) =
                sessions_until(&relay_b, &receiver, || !receiver.forks().is_empty()).await;
            assert!(
                matches!(receiver_end, Ok(SessionEnd::Stopped)),
                "seed {seed}: the receiver's session ended {receiver_end:?}"
            );
            let forks = receiver.forks();
            assert_eq!(forks.len(), 1, "seed {seed}");
            forks[0].verify(None).expect("the proof verifies");
            assert_eq!(receiver.marks().get(stream), a_head, "seed {seed}");
            // Next session: the stream is cut, the other writer flows, and
            // the relay learns the proof.
            append(&other, &mut rng, 1, 4);
            // The other writer's events only: the relay may hold the proof
            // already (the fork's session went on), and then passes it on
            // first, and the other writer takes nothing of the stream.
            let other_head = other.marks().get(other.stream());
            let (other_end, relay_end, _) = sessions_until(&other, &relay_b, || {
                relay_b.marks().get(other.stream()) == other_head
            })
            .await;
            assert!(
                matches!(
                    (&other_end, &relay_end),
                    (Ok(SessionEnd::Stopped), Ok(SessionEnd::Stopped))
                ),
                "seed {seed}: {other_end:?}, {relay_end:?}"
            );
            let (relay_end, receiver_end, state) = sessions_until(&relay_b, &receiver, || {
                relay_b.forks().len() == 1
                    && receiver.marks().get(other.stream()) == other.marks().get(other.stream())
            })
            .await;
            assert!(
                matches!(
                    (&relay_end, &receiver_end),
                    (Ok(SessionEnd::Stopped), Ok(SessionEnd::Stopped))
                ),
                "seed {seed}: {relay_end:?}, {receiver_end:?}"
            );
            assert_eq!(receiver.marks().get(stream), a_head, "seed {seed}");
            assert!(
                state.limits.iter().all(|hit| matches!(
                    hit,
                    LimitHit::Frozen { stream: s, head } if *s == stream && *head == a_head
                )),
                "seed {seed}: {:?}",
                state.limits
            );
            // A third peer learns the proof first, and takes nothing of
            // the forked stream.
            let third = SharedReplica::in_memory(StreamId::new(0xb));
            let (_, third_end, state) = sessions_until(&receiver, &third, || {
                third.forks().len() == 1
                    && third.marks().get(other.stream()) == other.marks().get(other.stream())
            })
            .await;
            assert!(
                matches!(third_end, Ok(SessionEnd::Stopped)),
                "seed {seed}: {third_end:?}"
            );
            assert_eq!(third.forks(), forks, "seed {seed}");
            assert_eq!(third.marks().get(stream), 0, "seed {seed}");
            assert_eq!(
                state.limits,
                [LimitHit::Frozen { stream, head: 0 }],
                "seed {seed}"
            );
            let log = captured_log();
            assert!(
                log.contains("a writer signed two histories of its stream"),
                "seed {seed}: not logged:\n{log}"
            );
        });
    });
}
