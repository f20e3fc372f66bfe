//! Session behaviour beyond convergence: budgets, backpressure, relaying,
//! and recovery from a lost hello.
//!
//! - A large backlog (including a payload of the replica's 1 MiB maximum)
//!   crosses in budgeted delta frames, none above the frame limit.
//! - Small events under a budget large enough to build deltas of more than
//!   `DELTA_EVENTS_MAX` events cross split into frames the receiver takes.
//! - A dead peer (never reads, never writes) does not hold up another peer
//!   or appends, and its session ends on its own timeout.
//! - In a chain C - A - B, C's events reach B through A and nobody receives
//!   an event twice: what a peer sent is never echoed back to it.
//! - A hello lost to a one-way cut is re-sent; the session is established
//!   on the same connection once the cut heals.
//!
//! All in memory under tokio's paused clock.

use std::time::Duration;

use meshlog_cursor::StreamId;
use meshlog_sync::testkit::{run_paused, wait_for, Direction, FaultLink, Faults};
use meshlog_sync::{
    ProtocolError, Session, SessionConfig, SessionError, SessionState, SharedReplica,
    DELTA_EVENTS_MAX,
};
use tokio::sync::watch;

/// How long any wait here may take, in paused time.
const WAIT: Duration = Duration::from_secs(10);

fn config() -> SessionConfig {
    SessionConfig::with_heartbeat(Duration::from_millis(20))
}

/// Starts a session pair between `a` and `b` over an in-memory stream;
/// returns each side's state.
fn link(
    a: &SharedReplica,
    b: &SharedReplica,
    config: SessionConfig,
) -> (watch::Receiver<SessionState>, watch::Receiver<SessionState>) {
    let (a_end, b_end) = tokio::io::duplex(64 * 1024);
    let a_session = Session::new(a.clone(), config.clone());
    let b_session = Session::new(b.clone(), config);
    let states = (a_session.state(), b_session.state());
    tokio::spawn(a_session.run(a_end));
    tokio::spawn(b_session.run(b_end));
    states
}

#[test]
fn a_backlog_crosses_in_budgeted_frames() {
    run_paused(async {
        let a = SharedReplica::in_memory(StreamId::new(1));
        let b = SharedReplica::in_memory(StreamId::new(2));
        let max_payload = a.config().payload_bytes_max;
        for i in 0..3000u64 {
            a.append_at(vec![i as u8; 1024], i).unwrap();
        }
        a.append_at(vec![0xee; max_payload], 0).unwrap();
        let config = SessionConfig {
            delta_bytes_max: 128 * 1024,
            ..config()
        };
        let (a_state, _) = link(&a, &b, config);
        wait_for("b to catch up", WAIT, || b.digest() == a.digest()).await;
        assert_eq!(b.marks(), a.marks());
        let sent = a_state.borrow().clone();
        // The small events need at least this many 128 KiB frames; the
        // largest payload takes one more frame of its own.
        let small_bytes = 3000 * (1024 + 50);
        assert!(
            sent.frames_sent as usize > small_bytes / (128 * 1024) + 1,
            "{} frames for {small_bytes} bytes and one of {max_payload}",
            sent.frames_sent
        );
        assert_eq!(
            sent.events_sent, 3001,
            "nothing was sent twice on a perfect link"
        );
    });
}

/// The sender's side of `DELTA_EVENTS_MAX`: a 2 MiB budget builds a delta
/// of some 40,000 empty events; it must cross as frames of at most the
/// limit, or the receiver refuses it and nothing converges.
#[test]
fn small_events_under_a_large_budget_cross_in_frames_within_the_event_limit() {
    run_paused(async {
        let a = SharedReplica::in_memory(StreamId::new(1));
        let b = SharedReplica::in_memory(StreamId::new(2));
        let count = 3 * DELTA_EVENTS_MAX as u64 + 5;
        for i in 0..count {
            a.append_at(&b""[..], i).unwrap();
        }
        let config = SessionConfig {
            delta_bytes_max: 2 << 20,
            ..config()
        };
        let (a_state, b_state) = link(&a, &b, config);
        wait_for("b to catch up", WAIT, || b.digest() == a.digest()).await;
        let sent = a_state.borrow().clone();
        assert_eq!(sent.events_sent, count, "nothing was sent twice");
        // The hello, then at least four delta frames for one delta.
        assert!(
            sent.frames_sent > count / DELTA_EVENTS_MAX as u64 + 1,
            "{sent:?}"
        );
        assert_eq!(b_state.borrow().events_applied, count);
    });
}

#[test]
fn a_dead_peer_blocks_neither_appends_nor_other_peers() {
    run_paused(async {
        let a = SharedReplica::in_memory(StreamId::new(1));
        let b = SharedReplica::in_memory(StreamId::new(2));
        link(&a, &b, config());
        // The dead peer: its end of the stream is kept open and never used.
        let (ours, _dead_end) = tokio::io::duplex(4096);
        let dead = tokio::spawn(Session::new(a.clone(), config()).run(ours));
        for i in 0..300u64 {
            a.append_at(vec![1u8; 4096], i).unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        wait_for("b to catch up while the dead session stalls", WAIT, || {
            b.digest() == a.digest()
        })
        .await;
        let result = dead.await.unwrap();
        assert!(
            matches!(
                result,
                Err(SessionError::Core(ProtocolError::ReadTimeout {
                    what: "hello",
                    ..
                }))
            ),
            "{result:?}"
        );
    });
}

#[test]
fn events_are_relayed_and_never_echoed() {
    run_paused(async {
        let a = SharedReplica::in_memory(StreamId::new(1));
        let b = SharedReplica::in_memory(StreamId::new(2));
        let c = SharedReplica::in_memory(StreamId::new(3));
        let (ca_state, ac_state) = link(&c, &a, config());
        let (ab_state, ba_state) = link(&a, &b, config());
        for i in 0..20u64 {
            [&a, &b, &c][i as usize % 3]
                .append_at(vec![i as u8], i)
                .unwrap();
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        wait_for("all three to converge", WAIT, || {
            a.digest() == b.digest() && b.digest() == c.digest() && a.marks() == c.marks()
        })
        .await;
        // Let the heartbeats run a while: still nothing twice.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for state in [&ca_state, &ac_state, &ab_state, &ba_state] {
            let state = state.borrow().clone();
            assert_eq!(state.events_duplicate, 0, "{state:?}");
        }
        assert_eq!(
            b.marks().get(c.stream()),
            (0..20).filter(|i| i % 3 == 2).count() as u64
        );
    });
}

#[test]
fn a_lost_hello_is_resent_on_the_same_connection() {
    run_paused(async {
        let a = SharedReplica::in_memory(StreamId::new(1));
        let b = SharedReplica::in_memory(StreamId::new(2));
        a.append_at(&b"a1"[..], 0).unwrap();
        b.append_at(&b"b1"[..], 0).unwrap();
        let link = FaultLink::new(5, Faults::none());
        let control = link.control();
        control.cut_one_way(Direction::Forward);
        let (a_end, b_end) = link.connect();
        let a_session = tokio::spawn(Session::new(a.clone(), config()).run(a_end));
        let b_session = tokio::spawn(Session::new(b.clone(), config()).run(b_end));
        tokio::time::sleep(Duration::from_millis(70)).await;
        assert!(
            control.stats(Direction::Forward).cut >= 2,
            "a's hello was re-sent"
        );
        control.heal();
        wait_for("a and b to converge", WAIT, || {
            a.digest() == b.digest() && a.marks() == b.marks()
        })
        .await;
        assert_eq!(control.connections(), 1);
        assert!(!a_session.is_finished() && !b_session.is_finished());
    });
}
