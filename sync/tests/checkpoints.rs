//! Checkpoint gossip over real sessions (issue 27; `docs/PROTOCOL.md`,
//! "Checkpoints"): a checkpoint a replica mints reaches its peer (the
//! first whole, the next as a difference from it), so that a version-2
//! token one replica answers reads on the other; a peer that sends a
//! vector under another vector's name is refused with a typed error and
//! nothing is kept; a receiver lacking a difference's parent asks for
//! the whole and keeps it; and a frame of a kind this build does not know,
//! after the peer's hello, is skipped and the session goes on (what lets
//! a later kind reach a peer whose hello says it skips them); and a
//! checkpoint asked for by name through `CheckpointWants` (the node's
//! fetch for a reader's token) comes back from the peer that keeps it
//! and is kept, with gossip off on both sides, while an ask no peer can
//! answer keeps nothing.
//!
//! All in memory under tokio's paused clock; the checkpoints are minted by
//! the test at a fixed time (`mint_checkpoint`), not by the wall clock.

use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::token::{self, Token};
use meshlog_cursor::{Checkpoint, StreamId, VersionVector};
use meshlog_replica::{Delta, Event, CHECKPOINT_INTERVAL_MS};
use meshlog_sync::frame::{self, CheckpointFrame, Frame, Hello};
use meshlog_sync::testkit::{run_paused, wait_for};
use meshlog_sync::{
    CheckpointWants, ProtocolError, Session, SessionConfig, SessionError, SharedReplica,
    PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long any wait here may take, in paused time.
const WAIT: Duration = Duration::from_secs(10);
/// The time of the first mint.
const T0: u64 = 1_700_000_000_000;

fn config() -> SessionConfig {
    SessionConfig {
        checkpoints: true,
        ..SessionConfig::with_heartbeat(Duration::from_millis(20))
    }
}

/// One event at `seq` on each of streams `100 ..= 399` (peers' events, so
/// that a mint is due: more than 128 streams moved).
fn writers_at(seq: u64) -> Delta {
    let events = (100..400u64)
        .map(|s| Event {
            stream: StreamId::new(s),
            seq,
            lamport: seq * 1_000 + s,
            time_ms: 0,
            payload: Bytes::from_static(b"w"),
        })
        .collect();
    Delta {
        events,
        ..Delta::default()
    }
}

#[test]
fn checkpoints_gossip_and_a_token_from_one_replica_reads_on_the_other() {
    run_paused(async {
        let a = SharedReplica::in_memory(StreamId::new(1));
        let b = SharedReplica::in_memory(StreamId::new(2));
        a.apply(writers_at(1)).unwrap();
        let first = a.mint_checkpoint(T0).unwrap().expect("due");
        let (a_end, b_end) = tokio::io::duplex(1 << 20);
        tokio::spawn(Session::new(a.clone(), config()).run(a_end));
        tokio::spawn(Session::new(b.clone(), config()).run(b_end));
        wait_for("b to keep the first checkpoint", WAIT, || {
            b.checkpoint(first.name()).is_some()
        })
        .await;
        // The writers move on; A mints again (a difference from the first).
        a.apply(writers_at(2)).unwrap();
        let second = a
            .mint_checkpoint(T0 + 2 * CHECKPOINT_INTERVAL_MS)
            .unwrap()
            .expect("due");
        wait_for("b to keep the second checkpoint", WAIT, || {
            b.checkpoint(second.name()).as_ref() == Some(&second)
        })
        .await;
        wait_for("b to hold a's events", WAIT, || {
            b.marks().dominates(&a.marks())
        })
        .await;
        // A reader at A's head gets a version-2 token; B reads it.
        let head = a.page(&VersionVector::new(), 1_000).unwrap();
        assert!(head.at_head);
        let Ok(Token::Relative(relative)) = token::decode_any_text(&head.token) else {
            panic!("a version-2 head token: {}", head.token);
        };
        assert_eq!(relative.checkpoint(), second.name());
        assert_eq!(b.cursor(&head.token).unwrap(), head.next);
        let at_b = b.page(&b.cursor(&head.token).unwrap(), 10).unwrap();
        assert!(at_b.events.is_empty() || at_b.events.iter().all(|e| e.stream == b.stream()));
    });
}

/// A hello from stream 9 holding nothing.
fn hello() -> Vec<u8> {
    frame::encode(&Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        stream: StreamId::new(9),
        marks: VersionVector::new(),
        floor: VersionVector::new(),
        frame_bytes_max: meshlog_sync::FRAME_BYTES_MAX as u32,
    }))
    .unwrap()
}

fn vector(entries: &[(u64, u64)]) -> VersionVector {
    entries
        .iter()
        .map(|&(s, q)| (StreamId::new(s), q))
        .collect()
}

#[test]
fn a_vector_sent_under_another_vector_s_name_is_refused_and_not_kept() {
    run_paused(async {
        let b = SharedReplica::in_memory(StreamId::new(2));
        let honest = Checkpoint::new(vector(&[(5, 10), (6, 3)])).unwrap();
        let forged = vector(&[(5, 20), (6, 3)]);
        let mut bytes = hello();
        bytes.extend(
            frame::encode(&Frame::Checkpoint(CheckpointFrame {
                name: honest.name(),
                parent: None,
                changes: forged.clone(),
            }))
            .unwrap(),
        );
        let (ours, mut peer) = tokio::io::duplex(1 << 20);
        let session = Session::new(b.clone(), config()).run(ours);
        let peer_side = async move {
            peer.write_all(&bytes).await.unwrap();
            let mut sink = vec![0u8; 4096];
            while let Ok(1..) = peer.read(&mut sink).await {}
        };
        let (result, ()) = tokio::join!(session, peer_side);
        let computed = Checkpoint::new(forged).unwrap().name();
        match result {
            Err(SessionError::Core(ProtocolError::CheckpointForged {
                claimed,
                computed: Some(named),
            })) => {
                assert_eq!(claimed, honest.name());
                assert_eq!(named, computed);
            }
            other => panic!("expected CheckpointForged, got {other:?}"),
        }
        assert!(b.checkpoints().is_empty(), "nothing kept");
    });
}

#[test]
fn a_difference_from_an_unknown_parent_is_asked_for_whole_and_kept() {
    run_paused(async {
        let b = SharedReplica::in_memory(StreamId::new(2));
        let parent = Checkpoint::new(vector(&[(5, 10), (6, 3)])).unwrap();
        let child = Checkpoint::new(vector(&[(5, 12), (6, 3)])).unwrap();
        let (ours, mut peer) = tokio::io::duplex(1 << 20);
        tokio::spawn(Session::new(b.clone(), config()).run(ours));
        peer.write_all(&hello()).await.unwrap();
        let difference = Frame::Checkpoint(CheckpointFrame {
            name: child.name(),
            parent: Some(parent.name()),
            changes: vector(&[(5, 12)]),
        });
        peer.write_all(&frame::encode(&difference).unwrap())
            .await
            .unwrap();
        // Read B's frames until it asks for the child whole.
        let mut buffer = Vec::new();
        let mut chunk = vec![0u8; 4096];
        let asked = loop {
            let n = tokio::time::timeout(WAIT, peer.read(&mut chunk))
                .await
                .expect("b answers")
                .unwrap();
            assert!(n > 0, "b closed the session");
            buffer.extend_from_slice(&chunk[..n]);
            let mut found = None;
            while let Ok(Some((payload, used))) = frame::split_frame(&buffer) {
                if let Ok(Frame::CheckpointWant(name)) = frame::decode_payload(payload) {
                    found = Some(name);
                }
                buffer.drain(..used);
            }
            if let Some(name) = found {
                break name;
            }
        };
        assert_eq!(asked, child.name());
        let whole = Frame::Checkpoint(CheckpointFrame {
            name: child.name(),
            parent: None,
            changes: child.vector().clone(),
        });
        peer.write_all(&frame::encode(&whole).unwrap())
            .await
            .unwrap();
        wait_for("b to keep the child", WAIT, || {
            b.checkpoint(child.name()).is_some()
        })
        .await;
        assert_eq!(b.checkpoints(), vec![child]);
        // Keep the peer's end open until here.
        drop(peer);
    });
}

#[test]
fn a_later_kind_after_the_hello_is_skipped_and_the_session_goes_on() {
    run_paused(async {
        let b = SharedReplica::in_memory(StreamId::new(2));
        let (ours, mut peer) = tokio::io::duplex(1 << 20);
        let session = tokio::spawn(Session::new(b.clone(), config()).run(ours));
        peer.write_all(&hello()).await.unwrap();
        // Kind 40, which no build knows yet, with a body of its own; then
        // a delta of the peer's first event.
        peer.write_all(&[4, 0, 0, 0, 40, 0xff, 0x01, 0x02])
            .await
            .unwrap();
        let delta = Delta {
            events: vec![Event {
                stream: StreamId::new(9),
                seq: 1,
                lamport: 1,
                time_ms: 0,
                payload: Bytes::from_static(b"after"),
            }],
            ..Delta::default()
        };
        peer.write_all(&frame::encode(&Frame::delta(1, delta)).unwrap())
            .await
            .unwrap();
        wait_for("b to apply the delta after the unknown kind", WAIT, || {
            b.marks().get(StreamId::new(9)) == 1
        })
        .await;
        assert!(!session.is_finished(), "the session ended");
        drop(peer);
        assert!(session.await.unwrap().is_ok());
    });
}

/// The node's fetch by name (issue 27): with gossip off on both sides, B
/// does not learn A's checkpoint until it asks for it by name through
/// its sessions' `CheckpointWants`; the answer is checked and kept, and
/// the kept count moves. An ask for a checkpoint nobody keeps goes to the
/// one session and brings nothing.
#[test]
fn a_checkpoint_asked_for_by_name_comes_from_the_peer_that_keeps_it() {
    run_paused(async {
        let quiet = SessionConfig {
            checkpoints: false,
            ..config()
        };
        let a = SharedReplica::in_memory(StreamId::new(1));
        let b = SharedReplica::in_memory(StreamId::new(2));
        a.apply(writers_at(1)).unwrap();
        let kept = a.mint_checkpoint(T0).unwrap().expect("due");
        let wants = CheckpointWants::new();
        let mut arrived = wants.kept();
        let (a_end, b_end) = tokio::io::duplex(1 << 20);
        tokio::spawn(Session::new(a.clone(), quiet.clone()).run(a_end));
        let session = Session::new(b.clone(), quiet).with_checkpoint_wants(wants.clone());
        tokio::spawn(session.run(b_end));
        wait_for("b to hold a's events", WAIT, || {
            b.marks().dominates(&a.marks())
        })
        .await;
        wait_for("b's session to take asks", WAIT, || wants.sessions() == 1).await;
        assert!(b.checkpoints().is_empty(), "no gossip: b has no checkpoint");
        assert_eq!(wants.ask(kept.name()), 1);
        tokio::time::timeout(WAIT, arrived.changed())
            .await
            .expect("a answers within the wait")
            .unwrap();
        assert_eq!(b.checkpoint(kept.name()), Some(kept.clone()));
        // Nobody keeps this one: asked of the one session, nothing comes.
        let unknown = Checkpoint::new(vector(&[(7, 7)])).unwrap();
        assert_eq!(wants.ask(unknown.name()), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(b.checkpoint(unknown.name()), None);
        assert_eq!(b.checkpoints(), vec![kept]);
    });
}
