//! The delta that reveals a fork does not end the session (issue 29,
//! `docs/SIGNING.md`, "Equivocation with valid signatures").
//!
//! A writer signed two histories of its stream; a receiver holds history
//! A; a relay holding history B, and another writer's events the receiver
//! lacks, opens a session with it. The relay's first delta carries both:
//! the receiver's replica refuses it whole (`Forked`), keeps the proof and
//! freezes the stream.
//!
//! What it proves, in that one session (no redial): the receiver's session
//! goes on, reports the stream frozen at its head (`LimitHit::Frozen`);
//! the other writer's events of that same delta arrive (sent again, since
//! the refused delta was not acknowledged); the relay learns the proof
//! and freezes too; the relay's own events appended after the fork was
//! found arrive as well; nothing of history B is taken. Before, the first
//! delta that revealed the fork ended the receiver's session
//! (`SessionError::Core(ProtocolError::Refused { Forked })`), so no
//! stream synced on that link until the next session.
//!
//! How: keyed replicas in memory from fixed secrets (the kit's
//! `equivocating_writers` for the two histories), two real `Session`s
//! over an in-memory stream on tokio's paused clock, stopped together
//! once every step is seen. Seeded payloads; the seed is printed on
//! failure and replayed from `MESHLOG_SEED`.

use std::time::Duration;

use meshlog_replica::{Commits, Config, MemStore, Replica, WriterKey};
use meshlog_sync::testkit::{self, SplitMix64};
use meshlog_sync::{LimitHit, Session, SessionConfig, SessionEnd, SharedReplica};

const WITHIN: Duration = Duration::from_secs(30);

fn config() -> SessionConfig {
    SessionConfig::with_heartbeat(Duration::from_millis(20))
}

fn keyed(secret: u8) -> SharedReplica {
    let key = WriterKey::from_bytes([secret; 32]);
    let replica = Replica::open(Config::with_key(key), MemStore::default()).expect("opens");
    SharedReplica::with_commits(replica, Commits::Inline)
}

fn payloads(rng: &mut SplitMix64, count: u64, tag: u8) -> Vec<bytes::Bytes> {
    (0..count)
        .map(|i| bytes::Bytes::from(vec![tag, i as u8, rng.next_u64() as u8]))
        .collect()
}

/// Two real sessions between `a` and `b` until their marks and chain
/// digests agree; both must end stopped.
async fn converge(a: &SharedReplica, b: &SharedReplica) {
    let (a_io, b_io) = tokio::io::duplex(1 << 20);
    let agreed = || {
        testkit::wait_for("convergence", WITHIN, || {
            a.marks() == b.marks() && a.chain_digest() == b.chain_digest()
        })
    };
    let (a_end, b_end) = tokio::join!(
        Session::new(a.clone(), config()).run_until(a_io, agreed()),
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

#[test]
fn the_delta_that_reveals_a_fork_leaves_the_session_and_its_other_streams_going() {
    testkit::for_each_seed("fork_in_session", 0xf0c5, 3, |seed| {
        testkit::run_paused(async move {
            let mut rng = SplitMix64::new(seed);
            let key = WriterKey::from_bytes([21; 32]);
            let stream = key.stream();
            let common = payloads(&mut rng, 2, 1);
            let (a, b) = meshlog_testkit::hostile::equivocating_writers(
                &key,
                &common,
                &payloads(&mut rng, 3, 2),
                &payloads(&mut rng, 3, 3),
            );
            let writer_a = SharedReplica::with_commits(a, Commits::Inline);
            let writer_b = SharedReplica::with_commits(b, Commits::Inline);
            let (relay_a, relay_b, other) = (keyed(22), keyed(23), keyed(24));
            let count = 1 + rng.below(5);
            for payload in payloads(&mut rng, count, 5) {
                other.append(payload).expect("append");
            }
            converge(&writer_a, &relay_a).await;
            // Relay B takes B in two steps: it keeps a seal where A ends,
            // so its run past it carries the base that proves the fork.
            converge(&writer_b, &relay_b).await;
            for payload in payloads(&mut rng, 2, 4) {
                writer_b.append(payload).expect("append");
            }
            converge(&writer_b, &relay_b).await;
            converge(&other, &relay_b).await;
            let receiver = keyed(25);
            converge(&relay_a, &receiver).await;
            let a_head = receiver.marks().get(stream);
            assert_eq!(receiver.marks().get(other.stream()), 0);

            // One session, receiver and relay B, until every step is seen.
            let (receiver_io, relay_io) = tokio::io::duplex(1 << 20);
            let (stopped, stopping) = tokio::sync::watch::channel(false);
            let stop_when = |mut stopping: tokio::sync::watch::Receiver<bool>| async move {
                let _ = stopping.wait_for(|stop| *stop).await;
            };
            let receiver_session = Session::new(receiver.clone(), config());
            let state = receiver_session.state();
            let steps = async {
                testkit::wait_for("the fork found", WITHIN, || !receiver.forks().is_empty()).await;
                // Written after the fork was found: must still come.
                let later = payloads(&mut rng, 3, 6);
                for payload in later {
                    relay_b.append(payload).expect("append");
                }
                testkit::wait_for("the rest of the session", WITHIN, || {
                    relay_b.forks().len() == 1
                        && receiver.marks().get(other.stream()) == other.marks().get(other.stream())
                        && receiver.marks().get(relay_b.stream()) == 3
                })
                .await;
                let _ = stopped.send(true);
            };
            let (receiver_end, relay_end, ()) = tokio::join!(
                receiver_session.run_until(receiver_io, stop_when(stopping.clone())),
                Session::new(relay_b.clone(), config()).run_until(relay_io, stop_when(stopping)),
                steps,
            );
            assert!(
                matches!(
                    (&receiver_end, &relay_end),
                    (Ok(SessionEnd::Stopped), Ok(SessionEnd::Stopped))
                ),
                "the session ended: {receiver_end:?}, {relay_end:?}"
            );
            let forks = receiver.forks();
            assert_eq!(forks.len(), 1);
            forks[0].verify(None).expect("the proof verifies");
            assert_eq!(relay_b.forks(), forks, "the relay learned the proof");
            assert_eq!(receiver.marks().get(stream), a_head, "nothing of B taken");
            assert_eq!(
                receiver.chain(stream),
                relay_a.chain(stream),
                "history A, as held"
            );
            assert_eq!(
                state.borrow().limits,
                [LimitHit::Frozen {
                    stream,
                    head: a_head
                }]
            );
        });
    });
}
