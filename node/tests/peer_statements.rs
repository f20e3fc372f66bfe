//! A peer's compaction statements this node grants no authority, as an
//! operator sees them (issue 29, `docs/SIGNING.md`, "Floors with an
//! authority"; `docs/PROTOCOL.md`, "Statements offered"), over a real
//! inbound sync session on 127.0.0.1:
//!
//! - a delta whose floor comes with a statement signed by an admin key
//!   the node does not trust: the node cuts that stream whole, takes the
//!   rest of the delta and keeps the link, and `GET /peers` shows the
//!   inbound session cutting the stream with the limit
//!   `statement_no_authority`;
//! - `Statement` frames of that kind, offered twice, and a frame of a
//!   kind this build does not know: `GET /metrics` exports the sessions'
//!   `meshlog_sync_statements_refused_total` (2),
//!   `meshlog_sync_frames_skipped_total` (1) and
//!   `meshlog_sync_statements_sent_total` (0) with their HELP text, and
//!   the replica refused one round, not two (`meshlog_deltas_refused_total`
//!   is 1: the repeat cost a lookup; before the session remembered
//!   refused statements, it was 2); `GET /peers` shows the same counters
//!   on the inbound session.
//!
//! How: `support::raw_peer::RawPeer` dials the node (no peer secrets),
//! says hello and sends the frames by hand. Waits poll with a deadline;
//! nothing is timed. The node's heartbeat is long, so the peer's silence
//! does not end the session while the test reads `GET /peers`.

mod support;

use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{AdminKey, ChainHash, Compaction, Delta, Event, FloorProofs};
use meshlog_sync::frame::Frame;
use serde_json::Value;
use support::raw_peer::RawPeer;
use support::*;

/// The stream the untrusted statement in a delta is for.
const CUT: u64 = 77;
/// The stream the peer relays, which the node takes.
const RELAYED: u64 = 88;
/// A later build's frame kind 64 with a body this build cannot read.
const UNKNOWN_KIND: [u8; 5] = [0x40, 0x01, 0xff, 0xff, 0x07];

/// An admin key the node is not configured to trust.
fn untrusted_admin() -> AdminKey {
    AdminKey::from_bytes([42; 32])
}

fn statement(stream: u64, floor: u64) -> meshlog_replica::SignedCompaction {
    Compaction {
        stream: StreamId::new(stream),
        floor,
        hash: ChainHash::GENESIS,
    }
    .sign_by_admin(&untrusted_admin())
}

/// Three events of [`RELAYED`], and [`CUT`]'s floor at 5 backed by an
/// untrusted statement.
fn delta() -> Delta {
    let events = (1..=3)
        .map(|seq| Event {
            stream: StreamId::new(RELAYED),
            seq,
            lamport: seq,
            time_ms: 1_700_000_000_000,
            payload: Bytes::from(format!("r{seq}")),
        })
        .collect();
    let mut floor_proofs = FloorProofs::default();
    floor_proofs.statements.push(statement(CUT, 5));
    Delta {
        floor_proofs,
        floor: [(StreamId::new(CUT), 5)].into_iter().collect(),
        events,
        seals: Vec::new(),
    }
}

/// The limits `GET /peers` lists for the first inbound session.
async fn inbound_limits(addr: std::net::SocketAddr) -> Value {
    get(addr, "/peers").await.json()["inbound"][0]["limits"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_without_authority_is_cut_shown_and_counted_once_per_round() {
    let node = start_with(1, |config| {
        config.sync.heartbeat = Duration::from_secs(3);
    })
    .await;
    let addr = node.addr;
    let mut peer = RawPeer::open(addr).await.expect("the upgrade");
    peer.hello(66).await;
    peer.send(&Frame::delta(1, delta())).await;
    assert!(
        peer.acknowledges_within(1, DEADLINE).await,
        "the session ended instead of acknowledging the delta"
    );

    // GET /peers: the inbound session cuts CUT for the statement.
    wait_until("GET /peers shows the stream cut", || async {
        inbound_limits(addr)
            .await
            .as_array()
            .is_some_and(|limits| !limits.is_empty())
    })
    .await;
    let peers = get(addr, "/peers").await.json();
    let inbound = &peers["inbound"][0];
    assert_eq!(inbound["stream"], "66", "{peers}");
    assert_eq!(inbound["limits_total"], 1, "{peers}");
    let limit = &inbound["limits"][0];
    assert_eq!(limit["stream"], CUT.to_string(), "{peers}");
    assert_eq!(limit["limit"], "statement_no_authority", "{peers}");
    assert!(
        limit["reason"].as_str().unwrap().contains("floor 5"),
        "{peers}"
    );
    let answer = marks(addr).await;
    assert_eq!(
        answer["marks"][RELAYED.to_string()],
        3,
        "the rest is taken: {answer}"
    );
    assert!(answer["floor"].get(CUT.to_string()).is_none(), "{answer}");

    // The same kind of statement offered in frames, twice, over a stream
    // the node holds; and a frame of a kind it does not know.
    for _ in 0..2 {
        peer.send(&Frame::Statement(statement(RELAYED, 2))).await;
    }
    peer.send_payload(&UNKNOWN_KIND).await;
    wait_until("the sessions' counters are scraped", || async {
        counter(addr, "meshlog_sync_statements_refused_total").await == 2
            && counter(addr, "meshlog_sync_frames_skipped_total").await == 1
    })
    .await;
    assert_eq!(counter(addr, "meshlog_sync_statements_sent_total").await, 0);
    assert_eq!(
        counter(addr, "meshlog_deltas_refused_total").await,
        1,
        "the repeated statement cost a second commit round"
    );
    let text = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
    for name in [
        "sync_statements_sent",
        "sync_statements_refused",
        "sync_frames_skipped",
    ] {
        assert!(
            text.lines()
                .any(|line| line.starts_with(&format!("# HELP meshlog_{name} "))),
            "no HELP for {name} in\n{text}"
        );
    }
    // GET /peers names the session that counted them.
    let peers = get(addr, "/peers").await.json();
    assert_eq!(
        peers["inbound"][0]["counters"],
        serde_json::json!({"statements_sent": 0, "statements_refused": 2, "frames_skipped": 1}),
        "{peers}"
    );
    let answer = marks(addr).await;
    assert_eq!(answer["marks"][RELAYED.to_string()], 3, "{answer}");
    assert!(
        answer["floor"].get(RELAYED.to_string()).is_none(),
        "nothing erased: {answer}"
    );
    assert_eq!(
        inbound_limits(addr).await.as_array().unwrap().len(),
        1,
        "the link goes on"
    );
}
