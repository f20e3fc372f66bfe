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

mod follow_support;
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use meshlog_cursor::token::{self, Token};
use meshlog_cursor::{Checkpoint, StreamId, VersionVector};
use serde_json::{json, Value};
use support::*;

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

/// The next text frame `socket` receives within the deadline, parsed
/// (other messages skipped).
async fn next_frame<S>(socket: &mut S) -> meshlog_node::follow::ServerFrame
where
    S: futures_util::Stream<
            Item = Result<
                tokio_tungstenite::tungstenite::Message,
                tokio_tungstenite::tungstenite::Error,
            >,
        > + Unpin,
{
    use futures_util::StreamExt;
    loop {
        let message = tokio::time::timeout(DEADLINE, socket.next())
            .await
            .expect("a frame within the deadline")
            .expect("the socket is open")
            .expect("a message");
        if let tokio_tungstenite::tungstenite::Message::Text(text) = message {
            return serde_json::from_str(text.as_str()).expect("a server frame");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_a_checkpoint_b_lacks_is_fetched_and_resumes_exactly_once() {
    let a_dir = tempfile::tempdir().unwrap();
    let checkpoint = checkpointed_dir(a_dir.path());
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
    assert_eq!(counter(b.addr, "meshlog_checkpoint_fetches_total").await, 1);
    assert_eq!(
        counter(b.addr, "meshlog_checkpoint_fetches_missed_total").await,
        0
    );
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
        let said = match peers_asked {
            0 => "no peer could be asked for it".to_owned(),
            n => format!("none of the {n} peer(s) it asked sent it within 300 ms"),
        };
        assert!(message.contains(&said), "{message}");
    }
    for (node, missed) in [(&b, 2), (&a, 1), (&alone, 0)] {
        let fetches = counter(node.addr, "meshlog_checkpoint_fetches_total").await;
        assert_eq!(fetches, missed, "{}", node.url());
        let misses = counter(node.addr, "meshlog_checkpoint_fetches_missed_total").await;
        assert_eq!(misses, missed, "{}", node.url());
    }
}

/// The follow surfaces take a version-2 token from another node (issue
/// 27), each at a fresh node that never kept A's checkpoint: at C the
/// `GET /follow` upgrade from A's head token (its first frame extends
/// exactly that cursor); at D a client expands the token
/// (`Client::cursor`: `GET /checkpoint`, fetched from A, checked against
/// the name). Then a `Follower` started from that cursor at C, through a
/// proxy that drops half the frames (seeded), yields exactly the events
/// written after, once each, and refetches the gaps over `GET /events`,
/// whose `next` C now answers as version 2. Before, the upgrade answered
/// `409`, `GET /checkpoint` did not exist, and the follower's refetch
/// failed on a version-2 `next` (it reconnected instead, never
/// `Refetched`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_token_from_another_node_follows_at_a_node_lacking_its_checkpoint() {
    use futures_util::StreamExt;
    use meshlog_node::client::Client;
    use meshlog_node::follow::{FollowItem, FollowStream, Follower, FollowerConfig, ServerFrame};

    let a_dir = tempfile::tempdir().unwrap();
    let checkpoint = checkpointed_dir(a_dir.path());
    let a = node_in(a_dir, 1, vec![], 10_000).await;
    let c = node_in(tempfile::tempdir().unwrap(), 3, vec![a.url()], 10_000).await;
    let d = node_in(tempfile::tempdir().unwrap(), 4, vec![a.url()], 10_000).await;
    wait_until("c and d hold a's events", || async {
        let at_a = marks_of(a.addr).await;
        marks_of(c.addr).await == at_a && marks_of(d.addr).await == at_a
    })
    .await;
    let (_, head) = walk_to_head(a.addr, "", 200).await;
    let Ok(Token::Relative(relative)) = token::decode_any_text(&head) else {
        panic!("a version-2 head token: {head}");
    };
    let cursor = relative.expand(&checkpoint).unwrap();

    // The WebSocket follow at C from the token: the first events frame
    // extends exactly its cursor.
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/follow?after={head}", c.addr))
            .await
            .expect("the upgrade succeeds");
    append(a.addr, b"a0").await;
    let extends = loop {
        if let ServerFrame::Events { extends, .. } = next_frame(&mut socket).await {
            break extends;
        }
    };
    assert_eq!(token::decode_text(&extends).unwrap(), cursor);

    // A client expands the token at D, which fetches the checkpoint.
    let client = Client::new(&d.url()).unwrap();
    assert_eq!(client.cursor(&head).await.unwrap(), cursor);

    // The follower from that cursor at C, half its frames dropped.
    let proxy = follow_support::WsProxy::start(c.addr, 27).await;
    proxy.set_faults(follow_support::Faults {
        drop: 0.5,
        ..follow_support::Faults::none()
    });
    let mut follower = {
        let mut config = FollowerConfig::new(vec![proxy.url()], FollowStream::All);
        config.after = cursor.clone();
        config.gap_timeout = Duration::from_millis(100);
        config.backoff_min = Duration::from_millis(10);
        config.backoff_max = Duration::from_millis(100);
        Follower::start(config).unwrap()
    };
    for i in 1..10 {
        append(a.addr, format!("a{i}").as_bytes()).await;
        append(c.addr, format!("c{i}").as_bytes()).await;
    }
    let expected: BTreeSet<String> = (1..=10)
        .map(|seq| format!("1:{seq}"))
        .chain((1..=9).map(|seq| format!("3:{seq}")))
        .collect();
    let (mut seen, mut refetched) = (BTreeSet::new(), 0);
    while seen.len() < expected.len() {
        let item = tokio::time::timeout(DEADLINE, follower.next())
            .await
            .unwrap_or_else(|_| panic!("an item within the deadline; so far {seen:?}"))
            .expect("the follower goes on");
        match item {
            FollowItem::Event(event) => assert!(
                seen.insert(format!("{}:{}", event.stream, event.seq)),
                "{event:?} twice"
            ),
            FollowItem::Refetched { .. } => refetched += 1,
            _ => {}
        }
    }
    assert_eq!(seen, expected);
    assert!(refetched > 0, "a dropped frame was refetched (seed 27)");
    let mut end = cursor;
    for event in &expected {
        let (stream, seq) = event.split_once(':').unwrap();
        end.advance(StreamId::new(stream.parse().unwrap()), seq.parse().unwrap());
    }
    assert_eq!(follower.cursor(), &end);
    // C's pages answer version 2 now (it keeps the checkpoint), and so
    // do its follow frames to a follower that asks for the shortest
    // tokens (as the `Follower` does); by default they stay version 1.
    let page = get(c.addr, &format!("/events?after={head}")).await.json();
    let next = page["next"].as_str().unwrap();
    assert!(
        matches!(token::decode_any_text(next), Ok(Token::Relative(_))),
        "{next}"
    );
    for (query, relative) in [("&tokens=short", true), ("", false)] {
        let url = format!("ws://{}/follow?after={head}{query}", c.addr);
        let (mut socket, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        let (extends, next) = loop {
            if let ServerFrame::Events { extends, next, .. } = next_frame(&mut socket).await {
                break (extends, next);
            }
        };
        for text in [extends, next] {
            let decoded = token::decode_any_text(&text).unwrap();
            assert_eq!(
                matches!(decoded, Token::Relative(_)),
                relative,
                "{query}: {text}"
            );
        }
    }
}

/// The first `stale` frame of a follow from `after` (with `query` added).
async fn stale_frame(addr: std::net::SocketAddr, after: &str, query: &str) -> String {
    use meshlog_node::follow::ServerFrame;
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{addr}/follow?after={after}{query}"))
            .await
            .expect("the upgrade succeeds");
    loop {
        if let ServerFrame::Stale { resume, .. } = next_frame(&mut socket).await {
            return resume;
        }
    }
}

/// A stale answer's `resume` is the shortest token the node writes, as a
/// page's `next` is (issue 27: a reader of a large mesh told it lost
/// events is not handed a version-1 token of every stream): the `410`'s
/// and a `tokens=short` follower's `stale` frame are version 2 against
/// the node's checkpoint, and resume exactly where the version-1 one
/// does; a follower that did not ask for short tokens still gets
/// version 1. Before, every resume was version 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_answer_resumes_with_the_shortest_token() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = checkpointed_dir(dir.path());
    {
        // Writer 100's first two events compacted away.
        let store = meshlog_replica::DiskStore::open(dir.path()).unwrap();
        let mut replica =
            meshlog_replica::Replica::open(meshlog_replica::Config::new(StreamId::new(1)), store)
                .unwrap();
        let floor: VersionVector = [(StreamId::new(100), 2)].into_iter().collect();
        replica.compact(&floor).unwrap();
    }
    let a = node_in(dir, 1, vec![], 10_000).await;
    // A reader at the checkpoint but for writer 100, where it read one.
    let at_100 = |seq: u64| -> VersionVector {
        checkpoint
            .vector()
            .iter()
            .map(|(stream, at)| (stream, if stream.get() == 100 { seq } else { at }))
            .collect()
    };
    let (cursor, expected) = (at_100(1), at_100(2));
    let stale = token::encode_text(&cursor).unwrap();

    let response = get(a.addr, &format!("/events?after={stale}")).await;
    assert_eq!(response.status, 410, "{}", response.error());
    let body = response.json();
    assert_eq!(
        body["lost"],
        json!([{"stream": "100", "first": 2, "last": 2}])
    );
    let resume = body["resume"].as_str().unwrap().to_owned();
    let v1 = token::encode_text(&expected).unwrap();
    let Ok(Token::Relative(relative)) = token::decode_any_text(&resume) else {
        panic!(
            "a version-2 resume: {resume} (version 1: {} characters)",
            v1.len()
        );
    };
    assert_eq!(relative.expand(&checkpoint).unwrap(), expected);
    assert!(resume.len() * 3 < v1.len(), "{resume} against {v1}");
    let from_short = get(a.addr, &format!("/events?after={resume}&limit=1000")).await;
    let from_v1 = get(a.addr, &format!("/events?after={v1}&limit=1000")).await;
    assert_eq!(from_short.status, 200, "{}", from_short.error());
    assert_eq!(from_short.json()["events"], from_v1.json()["events"]);
    assert_ne!(from_short.json()["events"], json!([]));

    assert_eq!(stale_frame(a.addr, &stale, "&tokens=short").await, resume);
    assert_eq!(stale_frame(a.addr, &stale, "").await, v1);
}

/// A `subscribe` whose token names a checkpoint this node must fetch holds
/// none of the connection's other subscriptions (issue 27): while B asks
/// its peer for a checkpoint no peer keeps (a 5 s bound), an event
/// appended at B reaches the connection's first subscription, and only
/// then does the fetch end, in an `error` frame (`unknown_checkpoint`)
/// for the subscribed stream. Before, the connection waited in the
/// subscribe for the whole bound, so that `error` frame came first. The
/// order of frames is checked, never a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_fetching_a_checkpoint_holds_no_other_subscription() {
    use futures_util::SinkExt;
    use meshlog_node::follow::ServerFrame;
    use tokio_tungstenite::tungstenite::Message;

    let a = node_in(tempfile::tempdir().unwrap(), 1, vec![], 5_000).await;
    let b = node_in(tempfile::tempdir().unwrap(), 2, vec![a.url()], 5_000).await;
    append(a.addr, b"x").await;
    wait_until("b's link to a is up and b holds a's event", || async {
        get(b.addr, "/peers").await.json()["peers"][0]["connected"] == true
            && marks_of(b.addr).await["1"] == 1
    })
    .await;
    let vector: VersionVector = (1..=300u64).map(|s| (StreamId::new(s), 3)).collect();
    let nobody = Checkpoint::new(vector.clone()).unwrap();
    let relative = token::encode_relative_text(&vector, &nobody).unwrap();
    let head = get(b.addr, "/events?limit=1000").await.json()["next"]
        .as_str()
        .unwrap()
        .to_owned();

    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{}/follow?after={head}", b.addr))
            .await
            .expect("the upgrade succeeds");
    let subscribe = json!({"type": "subscribe", "stream": "writer:1", "after": relative});
    socket
        .send(Message::Text(subscribe.to_string().into()))
        .await
        .unwrap();
    // The subscribe is read before the append is made.
    wait_until("b is fetching the checkpoint", || async {
        counter(b.addr, "meshlog_checkpoint_fetches_total").await == 1
    })
    .await;
    append(b.addr, b"while fetching").await;
    let mut order = Vec::new();
    while order.len() < 2 {
        match next_frame(&mut socket).await {
            ServerFrame::Events { events, .. } => {
                assert_eq!(events.len(), 1);
                order.push("events".to_owned());
            }
            ServerFrame::Error { stream, error, .. } => {
                assert_eq!(stream.as_deref(), Some("writer:1"));
                order.push(error);
            }
            _ => {}
        }
    }
    assert_eq!(order, ["events", "unknown_checkpoint"]);
}
