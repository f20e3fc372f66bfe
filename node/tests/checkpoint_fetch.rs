//! A version-2 token works at any node (issue 27; `docs/TOKEN.md`, "An
//! unknown checkpoint"): a node that does not keep the checkpoint a
//! reader's token names asks its peers for it by name over its sync
//! sessions, waits at most `checkpoint_fetch_ms`, and answers the page;
//! only when no peer sends it is the answer `409 unknown_checkpoint`,
//! saying how many peers were asked.
//!
//! How: node A's data directory is written before it starts, with 60
//! writers' events and a checkpoint minted from them (then a few events
//! more), so its head token is version 2. Both nodes run with checkpoint
//! gossip off (`sync_checkpoints = false`), so B, which dials A and syncs
//! every event, never learns the checkpoint by gossip (nor mints one of
//! its own); the sync link is up. A reader walks A to the head, gets a
//! short version-2 token, more events are written on both nodes, and the
//! reader resumes at B: B must fetch the checkpoint and answer exactly the
//! new events, each once. Before the fetch, B answered `409` at once.
//! Only 127.0.0.1; no timed assertions (every wait is bounded by the
//! support's deadline).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::token::{self, Token};
use meshlog_cursor::{Checkpoint, StreamId, VersionVector};
use meshlog_replica::{Config, Delta, DiskStore, Event, Replica};
use serde_json::{json, Value};
use support::*;

/// The writers A holds besides its own stream.
const WRITERS: std::ops::RangeInclusive<u64> = 100..=159;

/// One event at `seq` on each of `writers`.
fn writers_at(writers: impl Iterator<Item = u64>, seq: u64) -> Delta {
    let events = writers
        .map(|s| Event {
            stream: StreamId::new(s),
            seq,
            lamport: seq * 1_000 + s,
            time_ms: 0,
            payload: Bytes::from(format!("w{s}-{seq}")),
        })
        .collect();
    Delta {
        events,
        ..Delta::default()
    }
}

/// Writes A's data directory (stream 1, a legacy directory as the support
/// makes): three events on each writer, a checkpoint minted from those
/// marks, then a fourth event on five writers. The checkpoint.
fn write_a(dir: &std::path::Path) -> Checkpoint {
    legacy_dir(dir, 1);
    let store = DiskStore::open(dir).expect("a's store");
    let mut replica = Replica::open(Config::new(StreamId::new(1)), store).expect("a's replica");
    for seq in 1..=3 {
        replica.apply(&writers_at(WRITERS, seq)).expect("applied");
    }
    let checkpoint = replica
        .mint_checkpoint(1_700_000_000_000)
        .expect("minted")
        .expect("a mint is due on a replica holding none");
    replica
        .apply(&writers_at(100..=104, 4))
        .expect("applied after the checkpoint");
    checkpoint
}

/// A node in `dir` with checkpoint gossip off, waiting at most `fetch_ms`
/// for a checkpoint it fetches.
async fn node_in(
    dir: tempfile::TempDir,
    stream: u64,
    peers: Vec<String>,
    fetch_ms: u64,
) -> TestNode {
    let mut config = test_config(dir.path(), stream);
    config.sync.checkpoints = false;
    config.sync.checkpoint_fetch = Duration::from_millis(fetch_ms);
    config.peers = peers;
    let node = meshlog_node::Node::start(config)
        .await
        .expect("the node starts");
    let addr = node.local_addr();
    TestNode { node, addr, dir }
}

/// Pages `addr` from `after` to its head with `limit`: the events (as
/// `stream:seq`) and the last `next`.
async fn walk_to_head(
    addr: std::net::SocketAddr,
    after: &str,
    limit: usize,
) -> (Vec<String>, String) {
    let mut after = after.to_owned();
    let mut seen = Vec::new();
    loop {
        let response = get(addr, &format!("/events?after={after}&limit={limit}")).await;
        assert_eq!(response.status, 200, "{}", response.error());
        let page = response.json();
        for event in page["events"].as_array().unwrap() {
            seen.push(format!(
                "{}:{}",
                event["stream"].as_str().unwrap(),
                event["seq"]
            ));
        }
        after = page["next"].as_str().unwrap().to_owned();
        if page["at_head"] == true {
            return (seen, after);
        }
    }
}

async fn marks_of(addr: std::net::SocketAddr) -> Value {
    marks(addr).await["marks"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_a_checkpoint_b_lacks_is_fetched_and_resumes_exactly_once() {
    let a_dir = tempfile::tempdir().unwrap();
    let checkpoint = write_a(a_dir.path());
    let a = node_in(a_dir, 1, vec![], 10_000).await;
    let b = node_in(tempfile::tempdir().unwrap(), 2, vec![a.url()], 10_000).await;
    wait_until("b holds a's events", || async {
        marks_of(b.addr).await == marks_of(a.addr).await
    })
    .await;

    // The reader walks A to the head: every event once, a version-2 token.
    let (walked, head) = walk_to_head(a.addr, "", 50).await;
    assert_eq!(walked.len(), 60 * 3 + 5);
    assert_eq!(walked.iter().collect::<BTreeSet<_>>().len(), walked.len());
    let Ok(Token::Relative(relative)) = token::decode_any_text(&head) else {
        panic!("a version-2 head token: {head}");
    };
    assert_eq!(relative.checkpoint(), checkpoint.name());
    let cursor = relative.expand(&checkpoint).unwrap();
    let v1 = token::encode_text(&cursor).unwrap();
    assert!(
        head.len() <= 48 && head.len() * 3 < v1.len(),
        "short: {} characters against {} as version 1",
        head.len(),
        v1.len()
    );

    // More events on both nodes, synced both ways.
    for i in 0..4 {
        append(a.addr, format!("a{i}").as_bytes()).await;
        append(b.addr, format!("b{i}").as_bytes()).await;
    }
    wait_until("a and b hold the same events", || async {
        let (at_a, at_b) = (marks_of(a.addr).await, marks_of(b.addr).await);
        at_a == at_b && at_a["1"] == 4 && at_a["2"] == 4
    })
    .await;

    // Resumed at B (which never kept the checkpoint): exactly the new
    // events, once each, none missing.
    let (rest, next) = walk_to_head(b.addr, &head, 3).await;
    let expected: BTreeSet<String> = (1..=4)
        .flat_map(|seq| [format!("1:{seq}"), format!("2:{seq}")])
        .collect();
    assert_eq!(rest.len(), expected.len(), "{rest:?}");
    assert_eq!(rest.iter().cloned().collect::<BTreeSet<_>>(), expected);
    // B's last token reads at A too, at the head there.
    let at_a = get(a.addr, &format!("/events?after={next}")).await.json();
    assert_eq!(at_a["events"], json!([]), "{at_a}");
    assert_eq!(at_a["at_head"], true);
    // And the same token subscribes at B's follow route (kept now).
    assert_ne!(
        get(b.addr, &format!("/follow?after={head}")).await.status,
        409
    );
}

/// A token whose checkpoint no peer keeps: B asks its one peer, waits the
/// bound and answers `409 unknown_checkpoint`, saying it asked one peer
/// (so does A, asking B over B's inbound session); a node with no peer
/// answers at once, having asked none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_no_peer_keeps_is_409_after_asking_every_peer() {
    let a = node_in(tempfile::tempdir().unwrap(), 1, vec![], 300).await;
    let b = node_in(tempfile::tempdir().unwrap(), 2, vec![a.url()], 300).await;
    let alone = node_in(tempfile::tempdir().unwrap(), 3, vec![], 300).await;
    append(a.addr, b"x").await;
    wait_until("b's link to a is up", || async {
        get(b.addr, "/peers").await.json()["peers"][0]["connected"] == true
    })
    .await;
    let vector: VersionVector = (1..=300u64).map(|s| (StreamId::new(s), 3)).collect();
    let nobody = Checkpoint::new(vector.clone()).unwrap();
    let relative = token::encode_relative_text(&vector, &nobody).unwrap();
    let get_events = get(b.addr, &format!("/events?after={relative}")).await;
    let query = post_json(b.addr, "/events/query", &json!({"after": relative})).await;
    let at_a = get(a.addr, &format!("/events?after={relative}")).await;
    let at_alone = get(alone.addr, &format!("/events?after={relative}")).await;
    let asked = [(get_events, 1), (query, 1), (at_a, 1), (at_alone, 0)];
    for (response, peers_asked) in asked {
        assert_eq!(response.status, 409, "{}", response.error());
        let body = response.json();
        assert_eq!(body["error"], "unknown_checkpoint");
        assert_eq!(body["checkpoint"], nobody.name().to_string().as_str());
        assert_eq!(body["peers_asked"], peers_asked, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("none of the {peers_asked} peer(s)")),
            "{message}"
        );
    }
}
