//! A writer restored from an old backup (issue 29: "today the node does
//! not expose `recover_own_stream`"): its peers hold its own stream past
//! the head its restored data directory holds. Appending from there would
//! write seqs it already wrote, a fork of its own stream that every peer
//! refuses as equivocation. The node relearns its stream from its peers
//! before it appends again (`node/src/recovery.rs`).
//!
//! - `a_restored_writer_relearns_its_stream_and_continues_after_the_peers_head`:
//!   node A writes, B syncs, A's data directory is copied (stopped), A
//!   writes more, B syncs, A's directory is restored from the copy and A
//!   restarts with B as its peer: A's next append continues after B's head
//!   of A's stream, both nodes agree (marks and chain hashes), and a reader
//!   of either sees every event once. With the check off
//!   (`recovery_wait_ms = 0`, as every node was before) A appended at the
//!   restored head + 1: the fork.
//! - `the_operator_flag_holds_appends_with_503_until_a_peer_brings_the_stream`:
//!   A restored, started with `--recover-own-stream` and no peers of its
//!   own: appends answer `503 recovering` with `retry-after` (a WebSocket
//!   append: close 1013) while no peer has been heard; once B dials it, A relearns and the next append
//!   continues after B's head.
//!
//! Nodes are real `Node::start`s; waits poll with a deadline; nothing is
//! timed.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use meshlog_node::config::NodeConfig;
use meshlog_node::Node;
use support::{append, marks, request, wait_until, walk};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

fn config(dir: &Path, peers: &[SocketAddr]) -> NodeConfig {
    let mut config = NodeConfig::new(dir, "127.0.0.1:0");
    config.peers = peers.iter().map(|addr| format!("http://{addr}")).collect();
    config.sync.heartbeat = Duration::from_millis(50);
    config.sync.backoff_min = Duration::from_millis(20);
    config.sync.backoff_max = Duration::from_millis(400);
    config
}

async fn stop(node: Node) {
    node.shutdown();
    node.stopped().await;
}

/// `cp -a from to` of a stopped node's data directory (flat: the files
/// docs/OPERATIONS.md's backup copies).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

fn restore(backup: &Path, dir: &Path) {
    std::fs::remove_dir_all(dir).unwrap();
    copy_dir(backup, dir);
}

async fn held(addr: SocketAddr, stream: &str) -> u64 {
    marks(addr).await["marks"][stream].as_u64().unwrap_or(0)
}

/// Every event a reader of `addr` sees, once each: `(stream, seq)` unique,
/// and `stream`'s seqs exactly `1..=head` with the payloads `written`.
async fn reader_sees_every_event_once(addr: SocketAddr, stream: &str, written: &[String]) {
    let events = walk(addr, 2).await;
    let mut seen = BTreeSet::new();
    let mut own = Vec::new();
    for event in &events {
        let id = (event["stream"].to_string(), event["seq"].as_u64().unwrap());
        assert!(seen.insert(id.clone()), "{id:?} seen twice: {events:?}");
        if event["stream"] == stream {
            own.push((
                event["seq"].as_u64().unwrap(),
                event["payload"].as_str().unwrap().to_owned(),
            ));
        }
    }
    own.sort();
    let expected: Vec<(u64, String)> = (1..).zip(written.iter().cloned()).collect();
    assert_eq!(own, expected, "the reader of {addr}");
}

/// Appends `a{seq}` to `a` for each seq of `seqs` (each must get that
/// seq), recording the payloads in `written`, and waits until `b` holds
/// them.
async fn write_and_sync(
    a: &Node,
    b: SocketAddr,
    written: &mut Vec<String>,
    seqs: std::ops::RangeInclusive<u64>,
) {
    let stream = a.stream().to_string();
    for seq in seqs.clone() {
        written.push(format!("a{seq}"));
        let payload = written.last().unwrap().as_bytes();
        assert_eq!(append(a.local_addr(), payload).await, seq);
    }
    wait_until("the peer holds them", || async {
        held(b, &stream).await == *seqs.end()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_writer_relearns_its_stream_and_continues_after_the_peers_head() {
    let scratch = tempfile::tempdir().unwrap();
    let (a_dir, b_dir, backup) = (
        scratch.path().join("a"),
        scratch.path().join("b"),
        scratch.path().join("a.backup"),
    );
    let b = Node::start(config(&b_dir, &[])).await.unwrap();
    let b_addr = b.local_addr();
    let mut written: Vec<String> = Vec::new();

    let a = Node::start(config(&a_dir, &[b_addr])).await.unwrap();
    let a_stream = a.stream().to_string();
    write_and_sync(&a, b_addr, &mut written, 1..=3).await;
    stop(a).await;
    copy_dir(&a_dir, &backup);

    let a = Node::start(config(&a_dir, &[b_addr])).await.unwrap();
    write_and_sync(&a, b_addr, &mut written, 4..=6).await;
    stop(a).await;

    // Restored from the copy: A holds 3 of its own stream, B holds 6.
    restore(&backup, &a_dir);
    let a = Node::start(config(&a_dir, &[b_addr])).await.unwrap();
    let a_addr = a.local_addr();
    written.push("a7, after the restore".into());
    // The append waits while A relearns; its seq continues after B's head.
    let seq = append(a_addr, written.last().unwrap().as_bytes()).await;
    assert_eq!(seq, 7, "A appended at {seq}: it forked its own stream");
    assert_eq!(marks(a_addr).await["writer"]["recovering"], false);
    wait_until("B holds A's seventh", || async {
        held(b_addr, &a_stream).await == 7
    })
    .await;
    let (on_a, on_b) = (marks(a_addr).await, marks(b_addr).await);
    assert_eq!(on_a["marks"], on_b["marks"], "{on_a} {on_b}");
    assert_eq!(
        on_a["chains"]["hash"], on_b["chains"]["hash"],
        "no fork: {on_a} {on_b}"
    );
    for addr in [a_addr, b_addr] {
        reader_sees_every_event_once(addr, &a_stream, &written).await;
    }
    let peers = support::get(a_addr, "/peers").await.json();
    assert!(
        peers["peers"][0]["last_error"].is_null(),
        "A's link to B was refused: {peers}"
    );
    stop(a).await;
    stop(b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_flag_holds_appends_with_503_until_a_peer_brings_the_stream() {
    let scratch = tempfile::tempdir().unwrap();
    let (a_dir, b_dir, backup) = (
        scratch.path().join("a"),
        scratch.path().join("b"),
        scratch.path().join("a.backup"),
    );
    let b = Node::start(config(&b_dir, &[])).await.unwrap();
    let b_addr = b.local_addr();
    let a = Node::start(config(&a_dir, &[b_addr])).await.unwrap();
    let a_stream = a.stream().to_string();
    append(a.local_addr(), b"one").await;
    stop(a).await;
    copy_dir(&a_dir, &backup);
    let a = Node::start(config(&a_dir, &[b_addr])).await.unwrap();
    append(a.local_addr(), b"two").await;
    wait_until("B holds A's two", || async {
        held(b_addr, &a_stream).await == 2
    })
    .await;
    stop(a).await;
    stop(b).await;
    restore(&backup, &a_dir);

    // A restored, forced to relearn, no peer of its own and B down.
    let mut forced = config(&a_dir, &[]);
    forced.sync.recover_own_stream = true;
    forced.sync.recovery_wait = Duration::from_millis(50);
    let a = Node::start(forced).await.unwrap();
    let a_addr = a.local_addr();
    assert_eq!(marks(a_addr).await["writer"]["recovering"], true);
    let refused = request(a_addr, "POST", "/events", &[], b"too early").await;
    assert_eq!(
        refused.status,
        503,
        "{:?}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(refused.error(), "recovering");
    assert_eq!(refused.header("retry-after"), Some("1"));
    // The WebSocket append alike: the error body, then close 1013 (try
    // again later).
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{a_addr}/events/append"))
        .await
        .expect("the upgrade succeeds");
    socket
        .send(Message::Text(r#"["too early"]"#.into()))
        .await
        .unwrap();
    let mut answers = Vec::new();
    while !matches!(answers.last(), Some(Message::Close(_))) {
        let next = tokio::time::timeout(support::DEADLINE, socket.next()).await;
        match next.expect("an answer within the deadline") {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(message)) => answers.push(message),
            _ => break,
        }
    }
    assert!(
        matches!(&answers[..], [Message::Text(body), Message::Close(Some(close)), ..]
            if body.contains("\"recovering\"") && close.code == CloseCode::Again),
        "{answers:?}"
    );

    // B comes back and dials A: A relearns, then appends after B's head.
    let mut b_config = config(&b_dir, &[a_addr]);
    b_config.sync.recovery_wait = Duration::ZERO;
    let b = Node::start(b_config).await.unwrap();
    wait_until("A relearned its stream", || async {
        marks(a_addr).await["writer"]["recovering"] == false
    })
    .await;
    assert_eq!(append(a_addr, b"three").await, 3);
    reader_sees_every_event_once(
        a_addr,
        &a_stream,
        &["one".into(), "two".into(), "three".into()],
    )
    .await;
    stop(a).await;
    stop(b).await;
}
