//! A cross-crate scenario: a reader that keeps only the **text token** its
//! last page answered (as an HTTP or WebSocket client would) walks one
//! replica, fails over to another replica of the mesh with that token, and
//! gets every event exactly once — including events a partitioned writer
//! appended at stamps below the reader's position, delivered after the
//! partition heals through real sync sessions.
//!
//! Replicas A, B, C; sessions A–B and B–C over in-memory duplex streams on a
//! paused tokio clock (so no step depends on the machine's speed). The
//! partition cuts A off by ending its session; healing starts a new one.

use std::collections::BTreeSet;
use std::time::Duration;

use meshlog::cursor::token;
use meshlog::sync::{Session, SessionConfig, SharedReplica};
use meshlog::{StreamId, VersionVector};
use tokio::task::JoinHandle;

fn link(a: &SharedReplica, b: &SharedReplica) -> [JoinHandle<()>; 2] {
    let (a_end, b_end) = tokio::io::duplex(64 * 1024);
    let config = SessionConfig::with_heartbeat(Duration::from_millis(50));
    let a_session = Session::new(a.clone(), config.clone());
    let b_session = Session::new(b.clone(), config);
    [
        tokio::spawn(async move {
            let _ = a_session.run(a_end).await;
        }),
        tokio::spawn(async move {
            let _ = b_session.run(b_end).await;
        }),
    ]
}

/// Waits (in virtual time, bounded) until every replica has equal marks.
async fn converge(replicas: &[&SharedReplica]) {
    for _ in 0..2_000 {
        let marks = replicas[0].marks();
        if replicas.iter().all(|r| r.marks() == marks) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("replicas did not converge in 10 s of virtual time");
}

/// A reader holding nothing but a text token.
struct Reader {
    token: String,
    seen: BTreeSet<(StreamId, u64)>,
    position: u64,
}

impl Reader {
    /// One page; returns whether the replica is at its head.
    fn page(&mut self, replica: &SharedReplica, limit: usize) -> bool {
        let cursor = token::decode_text(&self.token).expect("our own token decodes");
        let page = replica.page(&cursor, limit).expect("page");
        for event in &page.events {
            assert!(
                self.seen.insert((event.stream, event.seq)),
                "{}:{} returned twice",
                event.stream,
                event.seq
            );
            self.position = self.position.max(event.lamport);
        }
        self.token = token::encode_text(&page.next).expect("a token encodes");
        page.at_head
    }

    fn walk_to_head(&mut self, replica: &SharedReplica) {
        for _ in 0..10_000 {
            if self.page(replica, 2) {
                return;
            }
        }
        panic!("walk did not reach the head");
    }
}

#[tokio::test(start_paused = true)]
async fn a_reader_fails_over_with_its_text_token_and_gets_every_event_once() {
    let a = SharedReplica::in_memory(StreamId::new(1));
    let b = SharedReplica::in_memory(StreamId::new(2));
    let c = SharedReplica::in_memory(StreamId::new(3));
    let a_b = link(&a, &b);
    let _b_c = link(&b, &c);
    for i in 0..5u8 {
        a.append(vec![b'a', i]).unwrap();
        b.append(vec![b'b', i]).unwrap();
        c.append(vec![b'c', i]).unwrap();
    }
    converge(&[&a, &b, &c]).await;

    // The start token is the documented constant.
    let mut reader = Reader {
        token: token::START_TEXT.to_owned(),
        seen: BTreeSet::new(),
        position: 0,
    };

    // Partition: A is cut off and keeps writing; the reader walks A far
    // past C's clock.
    for session in a_b {
        session.abort();
    }
    for i in 5..40u8 {
        a.append(vec![b'a', i]).unwrap();
    }
    reader.walk_to_head(&a);
    let late = c.append(&b"late from c"[..]).unwrap();
    assert!(
        late.lamport <= reader.position,
        "C's event ({}) is stamped at or below the reader's position ({})",
        late.lamport,
        reader.position
    );

    // The reader fails over to C with only its token: C lacks A's recent
    // events, so the reader gets the late event and nothing twice.
    reader.walk_to_head(&c);
    assert!(reader.seen.contains(&(late.stream, late.seq)));

    // Heal: A's events reach C through B, and the reader, still on C, gets
    // them once.
    let _a_b = link(&a, &b);
    converge(&[&a, &b, &c]).await;
    reader.walk_to_head(&c);

    let all: BTreeSet<(StreamId, u64)> = c
        .marks()
        .iter()
        .flat_map(|(stream, head)| (1..=head).map(move |seq| (stream, seq)))
        .collect();
    assert_eq!(all.len(), 40 + 5 + 6);
    assert_eq!(reader.seen, all, "every event exactly once");
    let final_cursor = token::decode_text(&reader.token).unwrap();
    assert_eq!(final_cursor, c.marks());
    assert!(final_cursor.dominates(&VersionVector::new()));
}
