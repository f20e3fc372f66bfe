//! What a session owes the tokio runtime it shares with other tasks: it
//! takes turns fairly and it never blocks the runtime's thread.
//!
//! - A peer whose frames are always ready (a reader that never returns
//!   `Pending`, as a socket with a deep backlog filled by another thread
//!   does) must not starve our writes: our acks go out between its frames.
//!   Counted in frames, not time, so nothing can flake: on a current-thread
//!   runtime with tokio's paused clock, no time passes at all.
//! - The same flood lasting three read timeouts of (paused) time must not
//!   starve our ticks either: our heartbeats keep going out, so the peer
//!   does not time out waiting for them. A helper task advances the paused
//!   clock each time it runs, which it can only do when the session yields.
//! - A durable store's commit (here one held until another task releases
//!   it, standing for a slow fsync) must not stop the runtime's other tasks:
//!   a timer on the same current-thread runtime keeps firing, and releases
//!   it. Real clock: tokio holds a paused clock still while a blocking task
//!   runs, so a timer could not fire there. Deterministic all the same: the
//!   old inline commit fails by the commit waiting out `HOLD_MAX`, not by a
//!   race. The commits are also shown to run one at a time, in the order
//!   the peer's frames arrived.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Config, Delta, Event, MemStore, Replica};
use meshlog_sync::frame::{self, Frame, Hello};
use meshlog_sync::testkit::{run_paused, wait_for};
use meshlog_sync::{Commits, Session, SessionConfig, SessionEnd, SessionState, SharedReplica};
use meshlog_testkit::{HeldCommit, HeldStore};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

const A: StreamId = StreamId::new(0xa);
const B: StreamId = StreamId::new(0xb);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap()
}

fn hello_from_b() -> Vec<u8> {
    frame::encode(&Frame::Hello(Hello {
        protocol: frame::PROTOCOL_VERSION,
        stream: B,
        marks: VersionVector::new(),
        floor: VersionVector::new(),
        frame_bytes_max: meshlog_sync::FRAME_BYTES_MAX as u32,
    }))
    .unwrap()
}

/// B's event `seq`, alone in a delta frame.
fn delta_from_b(seq: u64) -> Vec<u8> {
    frame::encode(&Frame::delta(
        1,
        Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: vec![Event {
                stream: B,
                seq,
                lamport: seq,
                time_ms: 0,
                payload: Bytes::from_static(b"flood"),
            }],
            seals: Vec::new(),
        },
    ))
    .unwrap()
}

// ---------------------------------------------------------------------------
// A flooding peer.
// ---------------------------------------------------------------------------

/// One write of the session's: the frames in it, when, and how many frames
/// the session had received by then.
struct Written {
    frames_received: u64,
    at: Instant,
    frames: Vec<Frame>,
}

/// A peer that sends its hello and then B's events one delta frame after
/// another, filling every read whole and never returning `Pending`, until
/// `frames_max` frames or until the paused clock reaches `until`; then it
/// closes. It takes everything written to it, recording each write.
struct Flood {
    pending: Vec<u8>,
    sent: u64,
    frames_max: u64,
    until: Option<Instant>,
    session: watch::Receiver<SessionState>,
    written: Arc<Mutex<Vec<Written>>>,
}

impl Flood {
    fn new(session: watch::Receiver<SessionState>, frames_max: u64) -> Self {
        Flood {
            pending: Vec::new(),
            sent: 0,
            frames_max,
            until: None,
            session,
            written: Arc::default(),
        }
    }

    fn done(&self) -> bool {
        self.sent >= self.frames_max || self.until.is_some_and(|until| Instant::now() >= until)
    }
}

impl AsyncRead for Flood {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while buf.remaining() > 0 {
            if self.pending.is_empty() {
                if self.done() {
                    break;
                }
                let next = match self.sent {
                    0 => hello_from_b(),
                    seq => delta_from_b(seq),
                };
                self.pending = next;
                self.sent += 1;
            }
            let len = self.pending.len().min(buf.remaining());
            buf.put_slice(&self.pending[..len]);
            self.pending.drain(..len);
        }
        // Whatever was filled, or nothing at the end: never `Pending`.
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Flood {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut frames = Vec::new();
        let mut rest = buf;
        while let Some((payload, used)) = frame::split_frame(rest).unwrap() {
            frames.push(frame::decode_payload(payload).unwrap());
            rest = &rest[used..];
        }
        assert!(rest.is_empty(), "a session writes whole frames here");
        let frames_received = self.session.borrow().frames_received;
        lock(&self.written).push(Written {
            frames_received,
            at: Instant::now(),
            frames,
        });
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn flood_config() -> SessionConfig {
    // Every delta acknowledged at once, so that the acks written show
    // whether writing kept its turns (delayed acks are `receipts.rs`'s).
    SessionConfig {
        ack_delay: Duration::ZERO,
        ..SessionConfig::with_heartbeat(Duration::from_millis(20))
    }
}

/// Found in review: the session's select polled reading before writing and
/// ticking, so while the peer's frames were always ready nothing of ours
/// was ever written, and the peer timed out waiting for our acks and
/// heartbeats. Now writing goes first after every frame handled. (The old
/// session wrote nothing at all after its hello until the flood ended.)
#[test]
fn a_flooding_peer_does_not_starve_our_acks() {
    const FRAMES: u64 = 2000;
    run_paused(async {
        let a = SharedReplica::in_memory(A);
        let session = Session::new(a.clone(), flood_config());
        let flood = Flood::new(session.state(), FRAMES);
        let written = Arc::clone(&flood.written);
        let end = session.run(flood).await;
        assert!(matches!(end, Ok(SessionEnd::PeerClosed)), "{end:?}");
        assert_eq!(a.marks().get(B), FRAMES - 1, "every delta was applied");

        let written = lock(&written);
        let acks = written
            .iter()
            .flat_map(|write| &write.frames)
            .filter(|frame| matches!(frame, Frame::Ack { .. }))
            .count() as u64;
        assert!(
            acks >= FRAMES / 2,
            "{acks} acks went out while the peer sent {FRAMES} frames"
        );
        // Between two writes of ours, the session handled at most two of
        // the peer's frames: reading never ran away with the turns.
        let mut received = 0;
        for write in written.iter() {
            assert!(
                write.frames_received - received <= 2,
                "{} frames handled before a write, after {received}",
                write.frames_received
            );
            received = write.frames_received;
        }
    });
}

/// The same flood for three read timeouts of time: the tick must not be
/// starved either, so our heartbeats keep the peer from timing out. The
/// paused clock advances only when the helper task runs, that is, only when
/// the session yields to the runtime (the old session never did: it read
/// until `FRAMES_MAX`, with no time passing and no heartbeat sent).
#[test]
fn a_flood_lasting_many_read_timeouts_still_gets_our_heartbeats_out() {
    const FRAMES_MAX: u64 = 100_000;
    const STEP: Duration = Duration::from_millis(5);
    run_paused(async {
        let config = flood_config();
        let a = SharedReplica::in_memory(A);
        let session = Session::new(a.clone(), config.clone());
        let mut flood = Flood::new(session.state(), FRAMES_MAX);
        let start = Instant::now();
        let flood_for = config.read_timeout * 3;
        flood.until = Some(start + flood_for);
        let written = Arc::clone(&flood.written);
        let clock = tokio::spawn(async {
            loop {
                tokio::time::advance(STEP).await;
            }
        });
        let end = session.run(flood).await;
        clock.abort();
        assert!(matches!(end, Ok(SessionEnd::PeerClosed)), "{end:?}");

        let heartbeats: Vec<Instant> = lock(&written)
            .iter()
            .filter(|write| {
                write
                    .frames
                    .iter()
                    .any(|frame| matches!(frame, Frame::Heartbeat { .. }))
            })
            .map(|write| write.at)
            .collect();
        let expected = (flood_for.as_millis() / config.heartbeat_interval.as_millis()) as usize;
        assert!(
            heartbeats.len() >= expected / 2,
            "{} heartbeats in {:?} of flood; at least {} expected",
            heartbeats.len(),
            start.elapsed(),
            expected / 2
        );
        // The peer never waits anywhere near its read timeout for one.
        let mut last = start;
        for at in heartbeats {
            assert!(
                at - last <= config.read_timeout / 2,
                "{:?} without a heartbeat",
                at - last
            );
            last = at;
        }
    });
}

// ---------------------------------------------------------------------------
// A slow durable store.
// ---------------------------------------------------------------------------

/// How long a held commit waits to be released before it goes on anyway:
/// only the old, inline commit ever waits this long.
const HOLD_MAX: Duration = Duration::from_secs(5);

/// Found in review: with a durable store the session applied a delta, and
/// so committed (fsynced) it, on the runtime's thread, stopping every other
/// task on it (other sessions, their heartbeats and timeouts) meanwhile. Now
/// the commit runs on the handle's committer thread: a timer on the same
/// current-thread runtime fires while it is held, and releases it. (The old
/// session's commits each waited out `HOLD_MAX`, unreleased.)
#[test]
fn a_slow_commit_does_not_stall_the_runtime_and_applies_stay_in_order() {
    const DELTAS: u64 = 5;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let commits = runtime.block_on(async {
        // A durable store whose fsync takes as long as the test says: each
        // commit, once armed, is held until released (or `HOLD_MAX`).
        let store = HeldStore::new(MemStore::default(), HOLD_MAX);
        let gate = store.gate();
        let a = SharedReplica::new(Replica::open(Config::new(A), store).unwrap());
        gate.arm();
        // The timer: what a heartbeat is to a session. It can only fire if
        // the runtime's one thread is free while a commit is held.
        let timer = tokio::spawn({
            let gate = Arc::clone(&gate);
            async move {
                let mut interval = tokio::time::interval(Duration::from_millis(5));
                loop {
                    interval.tick().await;
                    gate.release();
                }
            }
        });
        let (ours, mut peer) = tokio::io::duplex(64 * 1024);
        let session = tokio::spawn(Session::new(a.clone(), flood_config()).run(ours));
        let mut bytes = hello_from_b();
        for seq in 1..=DELTAS {
            bytes.extend(delta_from_b(seq));
        }
        peer.write_all(&bytes).await.unwrap();
        wait_for(
            "A to apply B's deltas",
            HOLD_MAX * (DELTAS as u32 + 1),
            || a.marks().get(B) == DELTAS,
        )
        .await;
        // And an append from async code, through the same pool.
        let event = a.append_async(&b"a1"[..]).await.unwrap();
        assert_eq!((event.stream, event.seq), (A, 1));
        session.abort();
        timer.abort();
        gate.commits()
    });
    let expected: Vec<HeldCommit> = (1..=DELTAS)
        .map(|seq| vec![(B, seq)])
        .chain([vec![(A, 1)]])
        .map(|events| HeldCommit {
            events,
            released: true,
        })
        .collect();
    assert_eq!(
        commits, expected,
        "each commit released by the timer while held, one delta at a time, in order"
    );
}

/// A replica in memory commits in the calling task: no hand-off to another
/// thread, and a paused-clock run stays deterministic.
#[test]
fn an_in_memory_replica_commits_inline() {
    assert_eq!(SharedReplica::in_memory(A).commits(), Commits::Inline);
    assert_eq!(
        SharedReplica::new(Replica::new(A)).commits(),
        Commits::Thread
    );
    let event = run_paused(async { SharedReplica::in_memory(A).append_async(&b"x"[..]).await });
    assert_eq!(event.unwrap().seq, 1);
}
