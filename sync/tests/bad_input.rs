//! Bad input from a peer: garbage, an oversized frame, a wrong protocol
//! version, an equivocating event, a non-canonical vector, a hello naming
//! ourselves, a stream cut inside a frame, a silent peer, a peer that
//! never reads (also while it sends deltas that each ask for an ack), and a
//! transport whose flush never completes.
//!
//! What it proves: each ends the session with its own typed error, the
//! reason is logged through `tracing` (captured here and searched), and the
//! replica's state (marks, floor, digest) is unchanged. Over TCP, a
//! `PeerManager` that dials a peer sending garbage reports the reason in the
//! peer's status and keeps redialing.
//!
//! How: a fake peer writes raw bytes into an in-memory stream (or a TCP
//! socket on 127.0.0.1) facing a real `Session`.

use std::cell::RefCell;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, DeltaError, Digest, Event};
use meshlog_sync::frame::{self, Frame, Hello, MarksDiff, Receipt};
use meshlog_sync::testkit;
use meshlog_sync::{
    FrameError, ManagerConfig, PeerManager, ProtocolError, Session, SessionConfig, SessionEnd,
    SessionError, SharedReplica, FRAME_BYTES_MAX, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};

thread_local! {
    /// What this thread logged: each test runs its session on its own
    /// thread (a current-thread runtime), so its log is its own.
    static CAPTURED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes into this thread's `CAPTURED`.
struct ThreadCapture;

impl Write for ThreadCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED.with(|captured| captured.borrow_mut().extend_from_slice(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `test` on a current-thread runtime with paused time, capturing what
/// it logs; returns its output and the log.
///
/// One global subscriber for the whole binary: per-test scoped subscribers
/// race on tracing's cached callsite interest when tests run in parallel.
fn logged<F: Future>(test: F) -> (F::Output, String) {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing_subscriber::fmt()
            .with_writer(|| ThreadCapture)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
    });
    CAPTURED.with(|captured| captured.borrow_mut().clear());
    let out = testkit::run_paused(test);
    let log = CAPTURED.with(|captured| String::from_utf8_lossy(&captured.borrow()).into_owned());
    (out, log)
}

const A: StreamId = StreamId::new(0xa);
const B: StreamId = StreamId::new(0xb);

fn event(stream: StreamId, seq: u64, lamport: u64, payload: &'static [u8]) -> Event {
    Event {
        stream,
        seq,
        lamport,
        time_ms: 0,
        payload: Bytes::from_static(payload),
    }
}

/// A replica holding an event of its own and one of B's.
fn replica_a() -> SharedReplica {
    let a = SharedReplica::in_memory(A);
    a.append_at(&b"a1"[..], 0).unwrap();
    a.apply(Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![event(B, 1, 1, b"original")],
        seals: Vec::new(),
    })
    .unwrap();
    a
}

fn state(replica: &SharedReplica) -> (VersionVector, VersionVector, Digest) {
    (replica.marks(), replica.floor(), replica.digest())
}

fn hello(stream: StreamId, protocol: u16) -> Vec<u8> {
    frame::encode(&Frame::Hello(Hello {
        protocol,
        stream,
        marks: [(B, 1)].into_iter().collect(),
        floor: VersionVector::new(),
        frame_bytes_max: meshlog_sync::FRAME_BYTES_MAX as u32,
    }))
    .unwrap()
}

/// Runs a session of `replica` against a fake peer that writes `bytes`,
/// then reads and discards until the session closes (or, with `close`,
/// closes its side right after writing).
async fn against(
    replica: &SharedReplica,
    bytes: Vec<u8>,
    close: bool,
) -> Result<SessionEnd, SessionError> {
    let (ours, mut peer) = tokio::io::duplex(1 << 20);
    let config = SessionConfig::with_heartbeat(Duration::from_millis(20));
    let session = Session::new(replica.clone(), config).run(ours);
    let peer_side = async move {
        peer.write_all(&bytes).await.unwrap();
        if close {
            return;
        }
        let mut sink = vec![0u8; 4096];
        while let Ok(1..) = peer.read(&mut sink).await {}
    };
    let (result, ()) = tokio::join!(session, peer_side);
    result
}

/// Feeds `bytes`, checks the error with `expected`, the log for `reason`,
/// and the replica for no change.
fn refused(
    bytes: Vec<u8>,
    close: bool,
    reason: &str,
    expected: impl FnOnce(&SessionError) -> bool,
) {
    let a = replica_a();
    let before = state(&a);
    let (result, log) = logged(against(&a, bytes, close));
    let error = result.expect_err("the session must end with an error");
    assert!(expected(&error), "unexpected error: {error:?}");
    assert!(
        log.contains("sync session closed") && log.contains(reason),
        "reason {reason:?} not logged:\n{log}"
    );
    assert_eq!(state(&a), before, "the replica changed");
}

#[test]
fn garbage_is_disconnected() {
    refused(
        vec![5, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 0x01],
        false,
        "bad frame from peer",
        |e| {
            matches!(
                e,
                SessionError::Core(ProtocolError::Frame(
                    FrameError::UnknownKind { .. } | FrameError::Malformed { .. }
                ))
            )
        },
    );
}

#[test]
fn an_oversized_frame_is_refused_by_its_prefix_alone() {
    // Only the prefix is sent: the session must not wait for 4 MiB to come.
    // (A side reads three bytes more than the default limit: what its
    // hello announces, the limit with its two lowest bits set as flags.)
    let prefix = ((FRAME_BYTES_MAX + 4) as u32).to_le_bytes().to_vec();
    refused(
        prefix,
        false,
        "exceeds the maximum",
        |e| matches!(e, SessionError::Core(ProtocolError::Frame(FrameError::TooLarge { len, .. })) if *len == FRAME_BYTES_MAX + 4),
    );
}

#[test]
fn a_wrong_protocol_version_is_named() {
    refused(
        hello(B, PROTOCOL_VERSION + 1),
        false,
        "peer speaks protocol version 5",
        |e| {
            matches!(
                e,
                SessionError::Core(ProtocolError::Frame(FrameError::ProtocolVersion {
                    theirs: 5,
                    ours: 4
                }))
            )
        },
    );
}

/// Protocol 2 changed the delta, ack and heartbeat layouts, protocol 3
/// the delta's again, and protocol 4 ended a delta with its sections (the
/// seals); none keeps compatibility with the one before: a v1, v2 or v3
/// peer is refused after its hello, with the reason logged here naming
/// both versions, and it first receives our hello, whose version it reads
/// (its place is fixed in every version) and refuses in turn, saying that
/// we speak version 4.
#[test]
fn older_peers_are_refused_with_a_logged_reason_and_hear_our_version() {
    for theirs in [1u8, 2, 3] {
        // An old hello, byte for byte as v1 and v2 wrote it: kind 0, the
        // protocol, stream 0xb, marks {0xb: 1}, no floor; v3's ends with
        // its frame limit (4 MiB).
        let mut old_hello = vec![0x00, theirs, 0x0b, 0x01, 0x0b, 0x01, 0x00];
        if theirs == 3 {
            old_hello.extend([0x80, 0x80, 0x80, 0x02]);
        }
        let mut prefixed = (old_hello.len() as u32).to_le_bytes().to_vec();
        prefixed.extend(old_hello);
        let old_hello = prefixed;
        let a = replica_a();
        let before = state(&a);
        let ((result, heard), log) = logged(async {
            let (ours, mut peer) = tokio::io::duplex(1 << 20);
            let config = SessionConfig::with_heartbeat(Duration::from_millis(20));
            let session = Session::new(a.clone(), config).run(ours);
            let peer_side = async move {
                peer.write_all(&old_hello).await.unwrap();
                let mut heard = Vec::new();
                let _ = peer.read_to_end(&mut heard).await;
                heard
            };
            tokio::join!(session, peer_side)
        });
        let error = result.expect_err("an older peer is refused");
        assert!(
            matches!(
                error,
                SessionError::Core(ProtocolError::Frame(FrameError::ProtocolVersion { theirs: t, ours: 4 }))
                    if t == u16::from(theirs)
            ),
            "{error:?}"
        );
        assert!(
            log.contains(&format!(
                "refusing a peer that speaks sync protocol version {theirs}: this side \
                 speaks version 4; upgrade the older side"
            )) && log.contains(&format!(
                "peer speaks protocol version {theirs}; this side speaks version 4"
            )),
            "reason not logged:\n{log}"
        );
        // What the older peer heard: our hello, whose version sits where it
        // reads it (kind 0, then the version varint).
        let (payload, _) = frame::split_frame(&heard).unwrap().expect("our hello");
        assert_eq!(&payload[..2], [0, 4], "{heard:02x?}");
        assert_eq!(state(&a), before, "the replica changed");
    }
}

/// Only a writer writes its stream: a peer whose hello claims more of our
/// own stream than we wrote is logged as suspicious, and its delta forging
/// our stream beyond our head is refused whole with the reason.
#[test]
fn a_peer_forging_our_own_stream_is_flagged_and_refused() {
    let mut bytes = frame::encode(&Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        stream: B,
        marks: [(A, 5), (B, 1)].into_iter().collect(),
        floor: VersionVector::new(),
        frame_bytes_max: meshlog_sync::FRAME_BYTES_MAX as u32,
    }))
    .unwrap();
    // A holds its own seq 1 only; the peer "sends" seqs 2 and 3 of A.
    let forged = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![event(A, 2, 10, b"forged a2"), event(A, 3, 11, b"forged a3")],
        seals: Vec::new(),
    };
    bytes.extend(frame::encode(&Frame::delta(1, forged)).unwrap());
    let a = replica_a();
    let before = state(&a);
    let (result, log) = logged(against(&a, bytes, false));
    let error = result.expect_err("the session must end with an error");
    assert!(
        matches!(
            &error,
            SessionError::Core(ProtocolError::Refused {
                peer,
                source: DeltaError::OwnStreamAhead { stream, seq: 2, head: 1 }
            }) if *peer == B && *stream == A
        ),
        "unexpected error: {error:?}"
    );
    assert!(
        log.contains("suspicious hello"),
        "hello not flagged:\n{log}"
    );
    assert!(
        log.contains("peer tried to write our own stream"),
        "forgery not logged:\n{log}"
    );
    assert_eq!(state(&a), before, "the replica changed");
    // A floor for our own stream above our head is no forgery to refuse
    // (issue 29: refusing it, `OwnFloorAboveHead`, ended every session with
    // that peer for good): it is ignored, and the session goes on.
    let mut bytes = hello(B, PROTOCOL_VERSION);
    let hostile_floor = Delta {
        floor_proofs: Default::default(),
        floor: [(A, 9)].into_iter().collect(),
        events: Vec::new(),
        seals: Vec::new(),
    };
    bytes.extend(frame::encode(&Frame::delta(1, hostile_floor)).unwrap());
    let a = replica_a();
    let before = state(&a);
    let session = async {
        let (ours, mut peer) = tokio::io::duplex(1 << 20);
        let config = SessionConfig::with_heartbeat(Duration::from_millis(20));
        let session = Session::new(a.clone(), config).run(ours);
        let peer_side = async move {
            peer.write_all(&bytes).await.unwrap();
            let mut sink = vec![0u8; 4096];
            let drain = async { while let Ok(1..) = peer.read(&mut sink).await {} };
            // A few heartbeats, within the read timeout; then it closes.
            let _ = tokio::time::timeout(Duration::from_millis(60), drain).await;
        };
        tokio::join!(session, peer_side).0
    };
    let (result, _) = logged(session);
    assert!(matches!(result, Ok(SessionEnd::PeerClosed)), "{result:?}");
    assert_eq!(state(&a), before, "the replica changed");
}

#[test]
fn an_equivocating_event_is_refused_whole() {
    let mut bytes = hello(B, PROTOCOL_VERSION);
    // B's seq 1 with another payload, and a valid seq 2 in the same delta:
    // nothing of it may be applied.
    let forged = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![event(B, 1, 1, b"forged"), event(B, 2, 2, b"b2")],
        seals: Vec::new(),
    };
    bytes.extend(frame::encode(&Frame::delta(1, forged)).unwrap());
    refused(bytes, false, "equivocation", |e| {
        matches!(
            e,
            SessionError::Core(ProtocolError::Refused { peer, source: DeltaError::Equivocation { stream, seq: 1 } })
                if *peer == B && *stream == B
        )
    });
}

#[test]
fn a_non_canonical_vector_is_refused() {
    let mut bytes = hello(B, PROTOCOL_VERSION);
    // An ack whose changes' streams descend: kind 2, received 0, seen 1,
    // marks 2 from 1 back, two entries (5, 1), (3, 1).
    bytes.extend([10, 0, 0, 0, 2, 0, 1, 2, 1, 2, 5, 1, 3, 1]);
    refused(bytes, false, "strictly ascending", |e| {
        matches!(
            e,
            SessionError::Core(ProtocolError::Frame(FrameError::BadVector {
                field: "changes",
                ..
            }))
        )
    });
}

#[test]
fn a_hello_naming_ourselves_is_refused() {
    refused(
        hello(A, PROTOCOL_VERSION),
        false,
        "own stream",
        |e| matches!(e, SessionError::Core(ProtocolError::SelfConnection { stream }) if *stream == A),
    );
}

#[test]
fn a_stream_cut_inside_a_frame_is_an_error() {
    refused(
        vec![10, 0, 0, 0, 2, 0],
        true,
        "inside a frame",
        |e| matches!(e, SessionError::Io(error) if error.kind() == std::io::ErrorKind::UnexpectedEof),
    );
}

#[test]
fn a_silent_peer_times_out() {
    // A peer that says hello, then nothing: the read timeout (10 heartbeats
    // of 20 ms) ends the session.
    refused(hello(B, PROTOCOL_VERSION), false, "read timeout", |e| {
        matches!(
            e,
            SessionError::Core(ProtocolError::ReadTimeout { what: "frame", .. })
        )
    });
}

#[test]
fn a_peer_that_never_reads_times_out_and_appends_go_on() {
    let ((), log) = logged(async {
        let a = replica_a();
        // A 1 KiB buffer: the session's frames fill it and the peer never
        // reads them; it keeps sending heartbeats so the read side is alive.
        let (ours, peer) = tokio::io::duplex(1024);
        let config = SessionConfig::with_heartbeat(Duration::from_millis(20));
        let session = tokio::spawn(Session::new(a.clone(), config).run(ours));
        let (_peer_read, mut peer_write) = tokio::io::split(peer);
        peer_write
            .write_all(&hello(B, PROTOCOL_VERSION))
            .await
            .unwrap();
        // Nothing received, our hello held, its own hello's marks unchanged.
        let heartbeat = frame::encode(&Frame::Heartbeat(Receipt {
            received: 0,
            seen: 1,
            marks: MarksDiff {
                number: 1,
                base: 1,
                changes: VersionVector::new(),
            },
        }))
        .unwrap();
        let mut appended = 0;
        while !session.is_finished() && appended < 1000 {
            // Appends are never held up by the stalled session.
            a.append_at(vec![7u8; 512], 0).unwrap();
            appended += 1;
            peer_write.write_all(&heartbeat).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let result = session.await.unwrap();
        assert!(
            matches!(result, Err(SessionError::WriteTimeout { .. })),
            "{result:?}"
        );
        assert_eq!(a.marks().get(A), 1 + appended);
    });
    assert!(log.contains("write timeout"), "{log}");
}

/// Found in review: every delta that changed the log queued an ack whatever
/// the output buffer held, so a peer that sent small deltas and never read
/// grew the buffer by one ack (our whole marks) per delta until the write
/// timeout, far past `queue_bytes_max`.
#[test]
fn acks_to_a_peer_that_never_reads_stay_within_the_queue_bound() {
    const DELTAS: u64 = 1000;
    let ((sent, bound), _log) = logged(async {
        let a = replica_a();
        // Marks of 300 streams make every ack about a kilobyte.
        let many = (0x100..0x100 + 300u64)
            .map(|stream| event(StreamId::new(stream), 1, 1, b"x"))
            .collect();
        a.apply(Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: many,
            seals: Vec::new(),
        })
        .unwrap();
        // The peer claims to hold everything: only acks are due.
        let mut bytes = frame::encode(&Frame::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            stream: B,
            marks: a.marks(),
            floor: VersionVector::new(),
            frame_bytes_max: meshlog_sync::FRAME_BYTES_MAX as u32,
        }))
        .unwrap();
        for seq in 2..2 + DELTAS {
            bytes.extend(
                frame::encode(&Frame::delta(
                    seq - 1,
                    Delta {
                        floor_proofs: Default::default(),
                        floor: VersionVector::new(),
                        events: vec![event(B, seq, seq, b"b")],
                        seals: Vec::new(),
                    },
                ))
                .unwrap(),
            );
        }
        let duplex_bytes = 1024;
        let (ours, peer) = tokio::io::duplex(duplex_bytes);
        let config = SessionConfig {
            queue_bytes_max: 4096,
            ..SessionConfig::with_heartbeat(Duration::from_millis(20))
        };
        let session = Session::new(a.clone(), config.clone());
        let state = session.state();
        let (_peer_read, mut peer_write) = tokio::io::split(peer);
        let (result, ()) = tokio::join!(session.run(ours), async {
            peer_write.write_all(&bytes).await.unwrap();
        });
        assert!(result.is_err(), "the session must time out: {result:?}");
        // The largest ack it sends: its whole marks (the peer never said
        // which it holds), with room for its counters.
        let ack_bytes = frame::encode(&Frame::Ack(Receipt {
            received: u64::from(u32::MAX),
            seen: u64::from(u32::MAX),
            marks: MarksDiff {
                number: u64::from(u32::MAX),
                base: 0,
                changes: a.marks(),
            },
        }))
        .unwrap()
        .len() as u64;
        // What the peer's buffer took, the queue bound, and the frames that
        // may cross it: the hello, and the ack or heartbeat that filled it.
        let bound = duplex_bytes as u64 + config.queue_bytes_max as u64 + 2 * ack_bytes;
        let sent = state.borrow().clone();
        (sent, bound)
    });
    assert_eq!(
        sent.events_applied, DELTAS,
        "every delta was read and applied"
    );
    assert!(
        sent.bytes_sent <= bound,
        "{} bytes queued; the bound is {bound}",
        sent.bytes_sent
    );
}

/// A byte stream whose flush never completes, as a buffered transport's
/// does when the peer stops reading.
struct FlushNeverCompletes(DuplexStream);

impl AsyncRead for FlushNeverCompletes {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for FlushNeverCompletes {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Pending
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Found in review: the session awaited `flush` with no timeout, so a flush
/// that never completed held the session (and its reads) for ever.
#[test]
fn a_flush_that_never_completes_times_out() {
    let (result, log) = logged(async {
        let a = replica_a();
        let (ours, _peer) = tokio::io::duplex(64 * 1024);
        let config = SessionConfig::with_heartbeat(Duration::from_millis(20));
        let session = Session::new(a, config).run(FlushNeverCompletes(ours));
        // Bounded, so that a regression fails instead of hanging.
        tokio::time::timeout(Duration::from_secs(60), session).await
    });
    let result = result.expect("the session must end on its own");
    assert!(
        matches!(result, Err(SessionError::WriteTimeout { .. })),
        "{result:?}"
    );
    assert!(log.contains("write timeout"), "{log}");
}

#[tokio::test]
async fn a_manager_reports_why_it_dropped_a_garbage_peer_and_redials() {
    // A fake peer on 127.0.0.1 that answers every connection with garbage.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let _ = socket.write_all(&[3, 0, 0, 0, 0x7f, 0x7f, 0x7f]).await;
                let mut sink = vec![0u8; 4096];
                while let Ok(1..) = socket.read(&mut sink).await {}
            });
        }
    });
    let a = replica_a();
    let before = state(&a);
    let config = ManagerConfig {
        peers: vec![addr],
        session: SessionConfig::with_heartbeat(Duration::from_millis(20)),
        backoff_min: Duration::from_millis(5),
        backoff_max: Duration::from_millis(20),
        ..ManagerConfig::default()
    };
    let manager = PeerManager::start(a.clone(), config).await.unwrap();
    let start = tokio::time::Instant::now();
    loop {
        let peer = manager.peers().remove(0);
        if peer.connects >= 2 {
            let reason = peer.last_error.expect("a reason");
            assert!(reason.contains("unknown frame kind 127"), "{reason}");
            assert!(!peer.connected);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no redial: {peer:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(state(&a), before);
    manager.shutdown().await;
    fake.abort();
}
