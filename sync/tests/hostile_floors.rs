//! Hostile floors over a real `Session` (issue 29, found by an independent
//! suite): a peer's floor on the receiver's own stream ended every session
//! with `OwnFloorAboveHead`, and its floor at a third writer's head + 5 or
//! at `LAMPORT_MAX` erased that writer's stream at the receiver, after
//! which writer and receiver never synced again.
//!
//! What it proves: a session whose peer sends those floors does not end
//! with a refusal; the receiver's marks, floor and digest are unchanged;
//! the session reports the writer's stream behind the peer's floor (its
//! state, and a `warn` naming stream and floor) and asks it quiet; and the
//! writer and the receiver, over a second session, still converge both
//! ways. With honest peers and a shared routes table, a stream behind one
//! peer's floor is brought by another peer that holds it.
//!
//! How: a fake peer writes raw frames into an in-memory stream facing a
//! real `Session`; the second session is two real `Session`s over an
//! in-memory stream. Tokio's clock is paused.

use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Digest, LAMPORT_MAX};
use meshlog_sync::frame::{self, Frame, Hello};
use meshlog_sync::testkit;
use meshlog_sync::{
    PeerDirection, Routes, Session, SessionConfig, SessionEnd, SessionError, SessionState,
    SharedReplica, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RECEIVER: StreamId = StreamId::new(0xa);
const WRITER: StreamId = StreamId::new(0xb);
const HOSTILE: StreamId = StreamId::new(0xc);
const CONVERGE_WITHIN: Duration = Duration::from_secs(10);

fn config() -> SessionConfig {
    SessionConfig::with_heartbeat(Duration::from_millis(20))
}

fn state(replica: &SharedReplica) -> (VersionVector, VersionVector, Digest) {
    (replica.marks(), replica.floor(), replica.digest())
}

/// A receiver that wrote 3 events and a writer that wrote 10, synced.
fn receiver_and_writer() -> (SharedReplica, SharedReplica) {
    let receiver = SharedReplica::in_memory(RECEIVER);
    let writer = SharedReplica::in_memory(WRITER);
    for i in 0..3u8 {
        receiver.append_at(vec![i], 0).unwrap();
    }
    for i in 0..10u8 {
        writer.append_at(vec![i], 0).unwrap();
    }
    meshlog_sync::sync_once(&receiver, &writer, &config()).unwrap();
    assert_eq!(receiver.marks(), writer.marks());
    (receiver, writer)
}

/// Runs a session of `replica` against a fake peer that says hello and
/// sends `deltas`, reads what the session sends for a while, then closes:
/// how the session ended and its last state.
async fn against_hostile(
    replica: &SharedReplica,
    deltas: Vec<Delta>,
) -> (Result<SessionEnd, SessionError>, SessionState) {
    let (ours, mut peer) = tokio::io::duplex(1 << 20);
    let session = Session::new(replica.clone(), config());
    let state = session.state();
    let mut bytes = frame::encode(&Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        stream: HOSTILE,
        marks: VersionVector::new(),
        floor: VersionVector::new(),
        frame_bytes_max: meshlog_sync::FRAME_BYTES_MAX as u32,
    }))
    .unwrap();
    for (number, delta) in (1..).zip(deltas) {
        bytes.extend(frame::encode(&Frame::delta(number, delta)).unwrap());
    }
    let peer_side = async move {
        peer.write_all(&bytes).await.unwrap();
        let mut sink = vec![0u8; 4096];
        let drain = async { while let Ok(1..) = peer.read(&mut sink).await {} };
        // A few heartbeats' worth, well within the read timeout.
        let _ = tokio::time::timeout(Duration::from_millis(60), drain).await;
    };
    let (result, ()) = tokio::join!(session.run(ours), peer_side);
    let last = state.borrow().clone();
    (result, last)
}

/// Two real sessions between `a` and `b` until their marks and digests
/// agree.
async fn converge(a: &SharedReplica, b: &SharedReplica) {
    let (a_io, b_io) = tokio::io::duplex(1 << 20);
    let agreed = || async {
        testkit::wait_for("convergence", CONVERGE_WITHIN, || {
            a.marks() == b.marks() && a.digest() == b.digest()
        })
        .await;
    };
    let (a_end, b_end) = tokio::join!(
        Session::new(a.clone(), config()).run_until(a_io, agreed()),
        Session::new(b.clone(), config()).run_until(b_io, agreed()),
    );
    assert!(matches!(a_end, Ok(SessionEnd::Stopped)), "{a_end:?}");
    assert!(matches!(b_end, Ok(SessionEnd::Stopped)), "{b_end:?}");
}

/// Issue 29 over a session: floors on the receiver's own stream (its head
/// + 9) and on the writer's (its head + 5, then `LAMPORT_MAX`).
#[test]
fn hostile_floors_neither_end_the_session_nor_cut_the_writer_off() {
    testkit::run_paused(async {
        let (receiver, writer) = receiver_and_writer();
        let before = state(&receiver);
        let floor = |stream: StreamId, seq: u64| Delta {
            floor_proofs: Default::default(),
            floor: [(stream, seq)].into_iter().collect(),
            events: Vec::new(),
            seals: Vec::new(),
        };
        let deltas = vec![
            floor(RECEIVER, 3 + 9),
            floor(WRITER, 10 + 5),
            floor(WRITER, LAMPORT_MAX),
        ];
        let (end, session) = against_hostile(&receiver, deltas).await;
        assert!(matches!(end, Ok(SessionEnd::PeerClosed)), "{end:?}");
        assert_eq!(state(&receiver), before, "a hostile floor changed the log");
        assert_eq!(session.behind_floor, [(WRITER, LAMPORT_MAX)]);
        assert!(session.routes_sent >= 1, "the stream was not asked quiet");
        assert_eq!(receiver.stats().behind_floor, 2);

        // The writer and the receiver still sync both ways.
        for i in 0..4u8 {
            writer.append_at(vec![100 + i], 0).unwrap();
        }
        receiver.append_at(&b"receiver again"[..], 0).unwrap();
        converge(&receiver, &writer).await;
        assert_eq!(receiver.marks().get(WRITER), 14);
        assert_eq!(writer.marks().get(RECEIVER), 4);
        assert_eq!(receiver.floor(), VersionVector::new());
    });
}

/// A peer that compacted a writer's stream past what the receiver holds
/// cannot serve it: the receiver's session with that peer reports the
/// stream behind, asks it quiet and gives up being its source, and the
/// session with the writer (sharing the routes table) brings the gap.
#[test]
fn a_stream_behind_one_peers_floor_is_brought_by_another() {
    testkit::run_paused(async {
        let (receiver, writer) = receiver_and_writer();
        for i in 0..10u8 {
            writer.append_at(vec![50 + i], 0).unwrap();
        }
        let compacted = SharedReplica::in_memory(HOSTILE);
        meshlog_sync::sync_once(&compacted, &writer, &config()).unwrap();
        let compact_to: VersionVector = [(WRITER, 15)].into_iter().collect();
        compacted.compact(&compact_to).unwrap();

        let routes = Routes::new();
        let (to_compacted, compacted_io) = tokio::io::duplex(1 << 20);
        let (to_writer, writer_io) = tokio::io::duplex(1 << 20);
        let receiver_compacted = Session::new(receiver.clone(), config())
            .with_routes(routes.clone(), PeerDirection::Outbound);
        let behind = receiver_compacted.state();
        let receiver_writer =
            Session::new(receiver.clone(), config()).with_routes(routes, PeerDirection::Outbound);
        let done = || async {
            testkit::wait_for("the gap brought by the writer", CONVERGE_WITHIN, || {
                receiver.marks().get(WRITER) == 20 && behind.borrow().behind_floor.is_empty()
            })
            .await;
        };
        // The writer's session starts once the compacted peer's has found
        // the stream behind its floor.
        let writer_sessions = async {
            testkit::wait_for("the stream reported behind", CONVERGE_WITHIN, || {
                behind.borrow().behind_floor == [(WRITER, 15)]
            })
            .await;
            assert_eq!(
                receiver.marks().get(WRITER),
                10,
                "nothing taken above the gap"
            );
            tokio::join!(
                receiver_writer.run_until(to_writer, done()),
                Session::new(writer.clone(), config()).run_until(writer_io, done()),
            )
        };
        let (to_compacted_end, _, writer_ends) = tokio::join!(
            receiver_compacted.run_until(to_compacted, done()),
            Session::new(compacted.clone(), config()).run_until(compacted_io, done()),
            writer_sessions,
        );
        assert!(
            matches!(to_compacted_end, Ok(SessionEnd::Stopped)),
            "{to_compacted_end:?}"
        );
        assert!(
            matches!(writer_ends.0, Ok(SessionEnd::Stopped)),
            "{writer_ends:?}"
        );
        assert_eq!(receiver.floor().get(WRITER), 0, "nothing erased");
        assert_eq!(
            receiver
                .page(&VersionVector::new(), 100)
                .unwrap()
                .events
                .len(),
            3 + 20
        );
        assert!(behind.borrow().events_behind_floor >= 5);
    });
}
