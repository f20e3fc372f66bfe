//! End to end with three real `meshlog serve` processes on loopback, each
//! on its own data directory, linked in a chain C → proxy → B → A, where
//! the proxy is a test-only TCP relay that can cut and heal C's one link.
//!
//! It proves, over HTTP and the CLI only:
//!
//! - a reader that hops between nodes and between surfaces (raw HTTP pages
//!   in both representations and `meshlog events`), carrying one token,
//!   gets every event exactly once, including events C wrote while cut
//!   off and stamped at or below the reader's position;
//! - `kill -9` of the middle node and a restart on the same data directory
//!   keeps every acknowledged append, and the mesh converges again (the
//!   same digest on all three, within a bounded wait);
//! - the reader resumes across the restart with the same token.
//!
//! Every child process is killed when its guard drops, on failure too.

mod cli_support;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use cli_support::{cli, serve, Proxy, Served};
use meshlog_node::http::json::{PageCompactJson, COMPACT_MEDIA_TYPE};
use serde_json::Value;
use support::*;

type Key = (String, u64);

/// Appends `payloads` on `node` over HTTP; records each acknowledged event.
async fn append_all(node: SocketAddr, payloads: &[String], acked: &mut BTreeMap<Key, String>) {
    for payload in payloads {
        let response = request(node, "POST", "/events", &[], payload.as_bytes()).await;
        assert_eq!(response.status, 201, "{:?}", response.body);
        let event = &response.json()["events"][0];
        let key = (
            event["stream"].as_str().unwrap().to_owned(),
            event["seq"].as_u64().unwrap(),
        );
        acked.insert(key, payload.clone());
    }
}

async fn digest(addr: SocketAddr) -> Value {
    marks(addr).await["digest"].clone()
}

async fn converged(nodes: &[SocketAddr], events: usize) {
    wait_until(
        &format!("every node holds the same {events} events"),
        || async {
            let mut digests = Vec::new();
            for &node in nodes {
                digests.push(digest(node).await);
            }
            digests[0]["events"] == events && digests.iter().all(|d| *d == digests[0])
        },
    )
    .await;
}

async fn sync_sessions(addr: SocketAddr) -> Option<u64> {
    let metrics = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("meshlog_sync_sessions "))
        .and_then(|n| n.trim().parse().ok())
}

/// A reader that carries one token and takes each page from the next
/// surface in turn: HTTP on one node (in the default JSON or the compact
/// representation), the CLI on another.
struct Reader {
    token: String,
    seen: Vec<(Key, u64, String)>,
    hops: usize,
}

impl Reader {
    /// One page of up to `limit` events from `node`; whether it was at the
    /// head.
    async fn page(&mut self, node: SocketAddr, limit: usize) -> bool {
        self.hops += 1;
        let (events, next, at_head) = if self.hops.is_multiple_of(3) {
            // Raw HTTP in the compact representation, read back as the
            // default page.
            let response = request(
                node,
                "GET",
                &format!("/events?after={}&limit={limit}", self.token),
                &[("accept", COMPACT_MEDIA_TYPE)],
                b"",
            )
            .await;
            assert_eq!(response.status, 200, "{:?}", response.body);
            assert_eq!(response.header("content-type"), Some(COMPACT_MEDIA_TYPE));
            let page: PageCompactJson = serde_json::from_slice(&response.body).unwrap();
            let page = page.decode().unwrap();
            (
                page.events
                    .iter()
                    .map(|event| serde_json::to_value(event).unwrap())
                    .collect(),
                page.next,
                page.at_head,
            )
        } else if self.hops.is_multiple_of(2) {
            let url = format!("http://{node}");
            let limit = limit.to_string();
            let mut args = vec!["events", "--node", &url, "--limit", &limit, "--json"];
            if !self.token.is_empty() {
                args.extend(["--after", &self.token]);
            }
            let run = cli(&args, "").await;
            assert_eq!(run.code, Some(0), "{run:?}");
            let mut lines = run.json_lines();
            let last = lines.pop().unwrap();
            (
                lines,
                last["next"].as_str().unwrap().to_owned(),
                last["at_head"].as_bool().unwrap(),
            )
        } else {
            let response = get(node, &format!("/events?after={}&limit={limit}", self.token)).await;
            assert_eq!(response.status, 200, "{:?}", response.body);
            let page = response.json();
            (
                page["events"].as_array().unwrap().clone(),
                page["next"].as_str().unwrap().to_owned(),
                page["at_head"].as_bool().unwrap(),
            )
        };
        for event in events {
            self.seen.push((
                (
                    event["stream"].as_str().unwrap().to_owned(),
                    event["seq"].as_u64().unwrap(),
                ),
                event["lamport"].as_u64().unwrap(),
                event["payload"].as_str().unwrap().to_owned(),
            ));
        }
        self.token = next;
        at_head
    }

    /// Pages to the head, hopping over `nodes` page by page.
    async fn walk(&mut self, nodes: &[SocketAddr], limit: usize) {
        for round in 0..1_000 {
            let node = nodes[round % nodes.len()];
            if self.page(node, limit).await {
                // At one node's head; the others hold the same events here.
                return;
            }
        }
        panic!("the walk did not reach the head in 1,000 pages");
    }

    fn position(&self) -> u64 {
        self.seen
            .iter()
            .map(|(_, lamport, _)| *lamport)
            .max()
            .unwrap_or(0)
    }

    /// Every event was seen once, and the seen events are exactly `acked`.
    fn assert_exactly_once(&self, acked: &BTreeMap<Key, String>) {
        let mut once = BTreeMap::new();
        for (key, _, payload) in &self.seen {
            assert!(
                once.insert(key.clone(), payload.clone()).is_none(),
                "{key:?} returned twice"
            );
        }
        assert_eq!(
            &once, acked,
            "the walk's events are not the acknowledged ones"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_serve_processes_a_cut_link_a_hopping_reader_and_a_kill_9() {
    let dirs = tempfile::tempdir().unwrap();
    let a: Served = serve(&dirs.path().join("a"), 1, &[]);
    let mut b: Served = serve(&dirs.path().join("b"), 2, &[a.url()]);
    let proxy = Proxy::start(b.addr).await;
    let c: Served = serve(&dirs.path().join("c"), 3, &[proxy.url()]);
    let mut acked: BTreeMap<Key, String> = BTreeMap::new();

    for round in 0..4 {
        for (name, node) in [("a", a.addr), ("b", b.addr), ("c", c.addr)] {
            append_all(node, &[format!("{name}{round}")], &mut acked).await;
        }
    }
    converged(&[a.addr, b.addr, c.addr], 12).await;

    let mut reader = Reader {
        token: String::new(),
        seen: Vec::new(),
        hops: 0,
    };
    // A first few pages, on C and then A.
    reader.page(c.addr, 3).await;
    reader.page(a.addr, 3).await;

    // Cut C's one link; C keeps writing, and so do A and B.
    proxy.cut();
    wait_until("C runs no sync session", || async {
        sync_sessions(c.addr).await == Some(0)
    })
    .await;
    let late: Vec<String> = (0..3).map(|i| format!("c-late-{i}")).collect();
    append_all(c.addr, &late, &mut acked).await;
    for round in 0..3 {
        append_all(a.addr, &[format!("a-more-{round}")], &mut acked).await;
        append_all(b.addr, &[format!("b-more-{round}")], &mut acked).await;
    }
    converged(&[a.addr, b.addr], 18).await;
    // The reader walks A and B to their head, past C's late stamps.
    reader.walk(&[b.addr, a.addr], 2).await;
    let late_keys: BTreeSet<Key> = acked
        .iter()
        .filter(|(_, payload)| payload.starts_with("c-late"))
        .map(|(key, _)| key.clone())
        .collect();
    let late_stamps: Vec<u64> = {
        let events = walk(c.addr, 1000).await;
        events
            .iter()
            .filter(|e| e["payload"].as_str().unwrap().starts_with("c-late"))
            .map(|e| e["lamport"].as_u64().unwrap())
            .collect()
    };
    let position = reader.position();
    assert_eq!(late_stamps.len(), 3);
    assert!(
        late_stamps.iter().all(|&stamp| stamp <= position),
        "C's late events {late_stamps:?} must be stamped at or below the reader's position {position}"
    );
    assert!(reader
        .seen
        .iter()
        .all(|(key, _, _)| !late_keys.contains(key)));

    // Heal; the late events reach A and B, and the reader, hopping on,
    // gets each of them once.
    proxy.heal();
    converged(&[a.addr, b.addr, c.addr], 21).await;
    reader.walk(&[a.addr, c.addr, b.addr], 2).await;
    reader.assert_exactly_once(&acked);

    // kill -9 the middle node right after acknowledged appends, restart it
    // on the same data directory (a new port; the proxy follows it).
    let b_more: Vec<String> = (0..5).map(|i| format!("b-before-kill-{i}")).collect();
    append_all(b.addr, &b_more, &mut acked).await;
    b.kill9();
    append_all(a.addr, &["a-while-b-down".to_owned()], &mut acked).await;
    append_all(c.addr, &["c-while-b-down".to_owned()], &mut acked).await;
    let b2 = serve(&dirs.path().join("b"), 2, &[a.url()]);
    proxy.set_target(b2.addr);
    let total = acked.len();
    converged(&[a.addr, b2.addr, c.addr], total).await;
    for node in [a.addr, b2.addr, c.addr] {
        let held: BTreeMap<Key, String> = walk(node, 1000)
            .await
            .iter()
            .map(|e| {
                (
                    (
                        e["stream"].as_str().unwrap().to_owned(),
                        e["seq"].as_u64().unwrap(),
                    ),
                    e["payload"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(held, acked, "node {node} after the restart");
    }
    // The reader resumes across the restart, starting on the restarted node.
    reader.walk(&[b2.addr, c.addr, a.addr], 2).await;
    reader.assert_exactly_once(&acked);
    assert!(reader.hops >= 10, "the reader hopped {} times", reader.hops);
}
