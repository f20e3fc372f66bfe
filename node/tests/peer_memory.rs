//! What a node's links learned of their peers outlives a restart (issue
//! 27, writer churn; `docs/PROTOCOL.md`, "The dialer's hello"): the data
//! directory's `peer-memory` file. A link to a peer it never met sends
//! its first hello against a checkpoint (`PeerMemory::unmet`); a peer
//! that does not read one (here: checkpoints off) answers with a whole
//! hello of its own, and the dialer's goes again, whole. The file keeps
//! that, so a restarted node's first hello to such a peer goes whole at
//! once; without the file it tried against again. A bad file (garbage,
//! cut short, a byte changed, oversized) is no memory: the node starts,
//! warns with the reason, takes the peer for one never met, and the file
//! is written anew.
//!
//! How: node A (stream 1) starts on a data directory holding a checkpoint
//! its marks dominate (`support::checkpointed_dir`) and dials node B. A is
//! stopped and started again on the same directory; what its hellos were
//! is `meshlog_sync_first_hellos_against_total` in A's `/metrics` (A's
//! sessions whose first hello went against a checkpoint), read while its
//! link to B is up (the session running is counted).

mod support;

use std::net::SocketAddr;
use std::path::Path;

use meshlog_node::Node;
use serde_json::json;
use support::{
    append, checkpointed_dir, counter, get, marks, post_json, start, start_with, test_config,
    wait_until, TestNode,
};

/// A, on `dir`, dialing `peers` from the start.
async fn start_a_with(dir: &Path, peers: &[SocketAddr]) -> Node {
    let mut config = test_config(dir, 1);
    config.peers = peers.iter().map(|peer| format!("http://{peer}")).collect();
    Node::start(config).await.expect("the node starts")
}

/// A, on `dir`, dialing `b`.
async fn start_a(dir: &Path, b: SocketAddr) -> Node {
    start_a_with(dir, &[b]).await
}

/// A started on `dir` with no peer, then told to dial `peer` over HTTP,
/// synced with it: how many of its sessions' first hellos went against
/// a checkpoint. Stopped after.
async fn run_a_adding(dir: &Path, peer: SocketAddr) -> u64 {
    let a = start_a_with(dir, &[]).await;
    let addr = a.local_addr();
    let added = post_json(addr, "/peers", &json!({"url": format!("http://{peer}")})).await;
    assert_eq!(added.status, 201);
    synced(addr, peer).await;
    let against = first_hellos_against(addr).await;
    stop(a).await;
    against
}

/// Waits until A's link to B is up and B holds an event A appends now.
async fn synced(a: SocketAddr, b: SocketAddr) {
    let seq = append(a, b"after the start").await;
    wait_until("b holds a's new event", || async {
        marks(b).await["marks"]["1"] == seq
    })
    .await;
    wait_until("a's link to b is up", || async {
        get(a, "/peers").await.json()["peers"][0]["connected"] == true
    })
    .await;
}

async fn first_hellos_against(a: SocketAddr) -> u64 {
    counter(a, "meshlog_sync_first_hellos_against_total").await
}

async fn stop(node: Node) {
    node.shutdown();
    node.stopped().await;
}

/// A started on `dir`, synced with B: how many of its sessions' first
/// hellos went against a checkpoint. Stopped after.
async fn run_a(dir: &Path, b: SocketAddr) -> u64 {
    let a = start_a(dir, b).await;
    let addr = a.local_addr();
    synced(addr, b).await;
    let against = first_hellos_against(addr).await;
    stop(a).await;
    against
}

/// B with checkpoint gossip off: it does not read a hello against a
/// checkpoint (it skips kind 9 and says so in its hello).
async fn start_b_without_checkpoints() -> TestNode {
    start_with(2, |config| config.sync.checkpoints = false).await
}

#[tokio::test]
async fn a_peer_never_met_gets_a_hello_against_a_checkpoint() {
    let b = start(2).await;
    let dir = tempfile::tempdir().unwrap();
    checkpointed_dir(dir.path());
    assert_eq!(
        run_a(dir.path(), b.addr).await,
        1,
        "a peer never met is taken to read one: B fetches the checkpoint by name"
    );
}

#[tokio::test]
async fn a_restarted_node_remembers_a_peer_that_does_not_read_a_hello_against_a_checkpoint() {
    let b = start_b_without_checkpoints().await;
    let dir = tempfile::tempdir().unwrap();
    checkpointed_dir(dir.path());
    let file = dir.path().join("peer-memory");
    assert_eq!(
        run_a(dir.path(), b.addr).await,
        1,
        "the first start knows nothing of b: a hello against, then whole"
    );
    assert!(file.exists(), "the session's end wrote what it learned");
    assert!(!dir.path().join("peer-memory.tmp").exists());
    assert_eq!(
        run_a(dir.path(), b.addr).await,
        0,
        "after the restart, the first hello goes whole at once"
    );
}

/// A peer added over HTTP starts from what the file says of it; a write
/// made while it is no longer dialed drops it.
#[tokio::test]
async fn a_peer_added_later_starts_from_the_file_until_a_write_without_it() {
    let b = start_b_without_checkpoints().await;
    let c = start(3).await;
    let dir = tempfile::tempdir().unwrap();
    checkpointed_dir(dir.path());
    assert_eq!(run_a(dir.path(), b.addr).await, 1);
    assert_eq!(
        run_a_adding(dir.path(), b.addr).await,
        0,
        "b, added over HTTP, is remembered"
    );
    // A start dialing c only: its session's end writes c, not b.
    let a = start_a(dir.path(), c.addr).await;
    synced(a.local_addr(), c.addr).await;
    stop(a).await;
    assert_eq!(
        run_a_adding(dir.path(), b.addr).await,
        1,
        "b was dropped from the file: a peer never met again"
    );
}

/// The warning a bad file gets is captured off the test's own thread (a
/// current-thread runtime, where the node reads the file as it starts).
#[test]
fn a_bad_peer_memory_file_is_a_warning_and_is_written_anew() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let b = runtime.block_on(start_b_without_checkpoints());
    let dir = tempfile::tempdir().unwrap();
    checkpointed_dir(dir.path());
    let file = dir.path().join("peer-memory");
    runtime.block_on(run_a(dir.path(), b.addr));
    let good = std::fs::read(&file).unwrap();
    let mut changed = good.clone();
    changed[good.len() / 2] ^= 0x10;
    let bad = [
        ("garbage", b"not a peer memory".to_vec(), "version 110"),
        ("cut short", good[..good.len() - 1].to_vec(), "checksum"),
        ("a byte changed", changed, "checksum"),
        ("oversized", vec![0; 1 << 20], "is over"),
    ];
    for (what, bytes, reason) in bad {
        std::fs::write(&file, &bytes).unwrap();
        let mut against = None;
        let log = support::logged(|| against = Some(runtime.block_on(run_a(dir.path(), b.addr))));
        assert_eq!(against, Some(1), "{what}: a peer never met");
        let warning = log
            .lines()
            .find(|line| line.contains("WARN") && line.contains("peer memory file is not read"))
            .unwrap_or_else(|| panic!("{what}: no warning in\n{log}"));
        assert!(warning.contains(reason), "{what}: {warning}");
        assert_ne!(std::fs::read(&file).unwrap(), bytes, "{what}: written anew");
    }
    assert_eq!(
        runtime.block_on(run_a(dir.path(), b.addr)),
        0,
        "the file written anew is read"
    );
}
