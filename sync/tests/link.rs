//! `PeerLink`, the one peer link of the manager and the node, with its dial
//! step injected: a dial that fails is reported as the link's last error
//! and redialed after the backoff's delays (which double, jittered), and a
//! stop ends the loop between dials. A dial that gives a stream runs a
//! session on it, counted in the link's status.
//!
//! How: a `Dial` that fails a given number of times and then hands out one
//! end of an in-memory duplex whose other end runs a session with a second
//! replica; under tokio's paused clock, so the delays take no real time and
//! the times of the dials are exact.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshlog_cursor::StreamId;
use meshlog_sync::testkit::{run_paused, wait_for};
use meshlog_sync::{
    Backoff, CheckpointWants, Dial, LinkSessions, PeerDirection, PeerLink, Redial, Routes, Session,
    SessionConfig, SharedReplica,
};
use tokio::io::DuplexStream;
use tokio::time::Instant;

/// Fails `failures` dials, then gives one end of a duplex whose other end
/// runs a session of `peer`; records when each dial happened.
struct TestDial {
    failures: usize,
    peer: SharedReplica,
    dials: Arc<Mutex<Vec<Instant>>>,
}

impl Dial for TestDial {
    type Io = DuplexStream;

    async fn dial(&self) -> Result<DuplexStream, String> {
        let attempt = {
            let mut dials = self.dials.lock().unwrap();
            dials.push(Instant::now());
            dials.len()
        };
        if attempt <= self.failures {
            return Err(format!("dial failed: attempt {attempt} refused"));
        }
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let session = Session::new(self.peer.clone(), config());
        tokio::spawn(session.run(theirs));
        Ok(ours)
    }
}

fn config() -> SessionConfig {
    SessionConfig::with_heartbeat(Duration::from_millis(20))
}

#[test]
fn a_failing_dial_is_reported_and_redialed_with_backoff_until_a_session_runs() {
    run_paused(async {
        let a = SharedReplica::in_memory(StreamId::new(1));
        let b = SharedReplica::in_memory(StreamId::new(2));
        b.append(&b"from b"[..]).unwrap();
        let dials = Arc::new(Mutex::new(Vec::new()));
        let dial = TestDial {
            failures: 3,
            peer: b.clone(),
            dials: Arc::clone(&dials),
        };
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(10));
        let redial = Redial {
            backoff: Backoff::for_link(min, max, 7, a.stream(), 1),
            connect_timeout: Duration::from_secs(1),
        };
        let sessions = LinkSessions {
            shared: a.clone(),
            config: config(),
            routes: Routes::new(),
            wants: CheckpointWants::new(),
        };
        let link = Arc::new(PeerLink::new("b".to_owned(), PeerDirection::Outbound));
        // A stop that stays stopped, as the node's cancellation token does.
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = {
            let link = Arc::clone(&link);
            tokio::spawn(async move {
                link.dial_loop(sessions, dial, redial, || {
                    let mut stopped = stopped.clone();
                    async move {
                        let _ = stopped.wait_for(|&stopped| stopped).await;
                    }
                })
                .await;
            })
        };
        wait_for(
            "a session after three failed dials",
            Duration::from_secs(10),
            || link.status(&a.marks()).connected,
        )
        .await;
        let status = link.status(&a.marks());
        assert_eq!(status.addr, "b");
        assert_eq!(status.direction, PeerDirection::Outbound);
        assert_eq!(status.connects, 1, "{status:?}");
        assert_eq!(status.stream, Some(StreamId::new(2)));
        assert_eq!(
            status.last_error.as_deref(),
            Some("dial failed: attempt 3 refused"),
            "the last failure is kept while the session runs"
        );
        // Each delay is drawn from the upper half of min · 2^n.
        let times = dials.lock().unwrap().clone();
        assert_eq!(times.len(), 4, "three failures, then the dial that worked");
        for (n, pair) in times.windows(2).enumerate() {
            let base = min * (1 << n);
            let waited = pair[1] - pair[0];
            assert!(
                waited >= base / 2 && waited <= base,
                "delay {n}: {waited:?}, not in [{:?}, {base:?}]",
                base / 2
            );
        }
        wait_for("B's event at A", Duration::from_secs(10), || {
            a.marks().get(StreamId::new(2)) == 1
        })
        .await;
        // A stop ends the session and the loop.
        stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the loop ends on stop")
            .unwrap();
        assert!(!link.is_running());
        assert!(!link.status(&a.marks()).connected);
    });
}
