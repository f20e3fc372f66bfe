//! `GET /follow` against a real in-process node: the upgrade's refusals,
//! subscriptions on one connection and their bounds, one writer's stream,
//! a lagging follower (told `lagged`, appends never wait for it), a stale
//! follower (told exactly what it lost, the same body as `GET /events`'
//! 410), failover to another node, the page at `GET /`, and the status
//! stream's links (each state the console draws) and writers.

mod follow_support;
mod support;

use std::time::{Duration, Instant};

use follow_support::{Tracked, WsProxy};
use futures_util::{SinkExt, StreamExt};
use meshlog_cursor::{token, StreamId, VersionVector};
use meshlog_node::follow::{FollowItem, FollowStream, Follower, FollowerConfig, ServerFrame};
use meshlog_node::http::json::{MarksJson, PageJson};
use serde_json::{json, Value};
use support::{append, get, post_json, request, start, start_with, wait_until, walk, DEADLINE};
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(addr: std::net::SocketAddr, query: &str) -> Socket {
    let (socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/follow?{query}"))
        .await
        .expect("the upgrade succeeds");
    socket
}

async fn next_frame(socket: &mut Socket) -> Option<ServerFrame> {
    loop {
        let message = tokio::time::timeout(DEADLINE, socket.next())
            .await
            .expect("a frame within the deadline")?;
        match message.ok()? {
            Message::Text(text) => return Some(serde_json::from_str(text.as_str()).unwrap()),
            Message::Close(_) => return None,
            _ => continue,
        }
    }
}

async fn marks(addr: std::net::SocketAddr) -> MarksJson {
    serde_json::from_slice(&get(addr, "/marks").await.body).unwrap()
}

fn config(nodes: Vec<String>, stream: FollowStream) -> FollowerConfig {
    let mut config = FollowerConfig::new(nodes, stream);
    config.gap_timeout = Duration::from_millis(100);
    config.idle_timeout = Duration::from_secs(2);
    config.backoff_min = Duration::from_millis(10);
    config.backoff_max = Duration::from_millis(100);
    config
}

#[tokio::test]
async fn the_upgrade_refuses_bad_requests_before_switching() {
    let node = start(1).await;
    let plain = get(node.addr, "/follow").await;
    assert_eq!(plain.status, 426, "{:?}", plain.json());
    assert_eq!(plain.error(), "upgrade_required");
    let upgrade = [
        ("connection", "upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    let bad_stream = request(node.addr, "GET", "/follow?stream=writer:x", &upgrade, b"").await;
    assert_eq!(bad_stream.status, 400);
    assert_eq!(bad_stream.error(), "bad_stream");
    let bad_token = request(node.addr, "GET", "/follow?after=Anope", &upgrade, b"").await;
    assert_eq!(bad_token.status, 400);
    assert_eq!(bad_token.error(), "bad_token");
    let bad_events = get(node.addr, "/events?stream=0").await;
    assert_eq!(bad_events.status, 400);
    assert_eq!(bad_events.error(), "bad_stream");
}

#[tokio::test]
async fn subscriptions_share_a_connection_within_their_bounds() {
    let node = start_with(1, |config| {
        config.follow.connection_followers_max = 2;
        config.follow.followers_max = 3;
        config.follow.heartbeat = Duration::from_millis(50);
    })
    .await;
    append(node.addr, b"one").await;
    let mut socket = connect(node.addr, "stream=all").await;
    match next_frame(&mut socket).await {
        Some(ServerFrame::Events {
            stream,
            extends,
            events,
            ..
        }) => {
            assert_eq!(stream, "all");
            assert_eq!(token::decode_text(&extends).unwrap(), VersionVector::new());
            assert_eq!(events[0].payload.as_deref(), Some("one"));
        }
        other => panic!("expected the backlog, got {other:?}"),
    }
    let subscribe = |stream: &str| {
        Message::Text(
            json!({"type": "subscribe", "stream": stream})
                .to_string()
                .into(),
        )
    };
    socket.send(subscribe("status")).await.unwrap();
    socket.send(subscribe("writer:1")).await.unwrap();
    let mut saw_status = false;
    let mut refused = None;
    while !(saw_status && refused.is_some()) {
        match next_frame(&mut socket)
            .await
            .expect("the connection stays open")
        {
            ServerFrame::Status(status) => {
                assert_eq!(status.node, "1");
                assert_eq!(status.marks.get("1"), Some(&1));
                saw_status = true;
            }
            ServerFrame::Error { stream, error, .. } => refused = Some((stream, error)),
            _ => {}
        }
    }
    assert_eq!(
        refused,
        Some((Some("writer:1".into()), "too_many_subscriptions".into()))
    );
    // Node-wide: two held here, one more anywhere, then 503.
    let _second = connect(node.addr, "stream=status").await;
    let refused =
        tokio_tungstenite::connect_async(format!("ws://{}/follow?stream=all", node.addr)).await;
    match refused {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
            let body: Value = serde_json::from_slice(response.body().as_deref().unwrap()).unwrap();
            assert_eq!(body["error"], "too_many_followers");
        }
        other => panic!("expected 503 too_many_followers, got {other:?}"),
    }
}

#[tokio::test]
async fn one_writers_stream_carries_that_writer_alone_and_keeps_the_other_entries() {
    let a = start(1).await;
    let b = start_with(2, |config| config.peers = vec![a.url()]).await;
    append(a.addr, b"a1").await;
    append(b.addr, b"b1").await;
    append(a.addr, b"a2").await;
    wait_until("b holds a's events", || async {
        marks(b.addr).await.marks.get("1") == Some(&2)
    })
    .await;
    // A cursor from a walk of the whole log that has seen b's event.
    let start: VersionVector = [(StreamId::new(2), 1)].into_iter().collect();
    let start_token = token::encode_text(&start).unwrap();
    let mut socket = connect(b.addr, &format!("stream=writer:1&after={start_token}")).await;
    match next_frame(&mut socket).await {
        Some(ServerFrame::Events { events, next, .. }) => {
            let seqs: Vec<(String, u64)> =
                events.iter().map(|e| (e.stream.clone(), e.seq)).collect();
            assert_eq!(seqs, vec![("1".into(), 1), ("1".into(), 2)]);
            let next = token::decode_text(&next).unwrap();
            assert_eq!(next.get(StreamId::new(1)), 2);
            assert_eq!(next.get(StreamId::new(2)), 1, "the other entry is carried");
        }
        other => panic!("expected writer 1's events, got {other:?}"),
    }
    // The same read over HTTP.
    let page: PageJson = serde_json::from_slice(
        &get(b.addr, &format!("/events?stream=1&after={start_token}"))
            .await
            .body,
    )
    .unwrap();
    assert_eq!(page.events.len(), 2);
    assert!(page.events.iter().all(|e| e.stream == "1"));
    assert!(page.at_head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_follower_is_told_lagged_and_appends_never_wait_for_it() {
    let node = start_with(1, |config| {
        config.follow.queue_frames = 2;
        config.follow.frame_events_max = 8;
        config.follow.heartbeat = Duration::from_millis(50);
    })
    .await;
    // A follower at the head that reads nothing: its socket buffers fill,
    // then the node's queue for it.
    let stalled = {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let tcp = socket.connect(node.addr).await.unwrap();
        let (socket, _) =
            tokio_tungstenite::client_async(format!("ws://{}/follow?stream=all", node.addr), tcp)
                .await
                .unwrap();
        socket
    };
    // A follower through the Rust client that consumes slowly at first.
    let mut slow = Follower::start(config(vec![node.url()], FollowStream::All)).unwrap();
    let payload = "x".repeat(2000);
    let batch: Vec<Value> = (0..500).map(|_| Value::String(payload.clone())).collect();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for _ in 0..8 {
        let one = Instant::now();
        let response = post_json(node.addr, "/events", &Value::Array(batch.clone())).await;
        assert_eq!(response.status, 201);
        slowest = slowest.max(one.elapsed());
    }
    eprintln!(
        "8 MB appended in {:?} (slowest batch {slowest:?}) while a follower read nothing",
        started.elapsed()
    );
    // Every append was answered while the stalled follower had read
    // nothing: the node never waited for it. Now it reads: the frames
    // queued before the queue filled, then `lagged`, then the close.
    let mut stalled = stalled;
    let mut lagged = None;
    while let Some(message) = tokio::time::timeout(DEADLINE, stalled.next())
        .await
        .expect("the node closes a lagged connection")
    {
        match message {
            Ok(Message::Text(text)) => {
                if let ServerFrame::Lagged { cursor, .. } =
                    serde_json::from_str(text.as_str()).unwrap()
                {
                    lagged = Some(token::decode_text(&cursor).unwrap());
                }
            }
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let lagged = lagged.expect("the stalled follower was told it lagged");
    assert!(
        lagged.get(StreamId::new(1)) < 4000,
        "it lagged before the end: {lagged:?}"
    );

    // The slow client: told lagged too, then pages and resubscribes on its
    // own; it ends with every event once.
    let mut events = Vec::new();
    let mut lagged_items = 0;
    while events.len() < 4000 {
        let item = tokio::time::timeout(DEADLINE, slow.next())
            .await
            .expect("the slow follower goes on")
            .expect("the follower does not end");
        match item {
            FollowItem::Event(event) => events.push((event.stream, event.seq)),
            FollowItem::Lagged { .. } => lagged_items += 1,
            _ => {}
        }
        if events.len() < 200 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert!(
        lagged_items > 0,
        "the slow follower was never told it lagged"
    );
    let expected: Vec<(String, u64)> = (1..=4000).map(|seq| ("1".to_owned(), seq)).collect();
    assert_eq!(events, expected, "every event once, in order");
    assert_eq!(slow.cursor().get(StreamId::new(1)), 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_follower_is_told_exactly_what_it_lost() {
    let node = start_with(1, |config| {
        config.follow.heartbeat = Duration::from_millis(50)
    })
    .await;
    for i in 0..3 {
        append(node.addr, format!("before {i}").as_bytes()).await;
    }
    let proxy = WsProxy::start(node.addr, 7).await;
    let follower = Tracked::start("all", config(vec![proxy.url()], FollowStream::All));
    wait_until("the follower has the first three", || async {
        follower.state.lock().unwrap().events.len() == 3
    })
    .await;
    proxy.cut();
    for i in 0..5 {
        append(node.addr, format!("while cut {i}").as_bytes()).await;
    }
    let compacted = post_json(node.addr, "/compact", &json!({"keep_last": 2})).await;
    assert_eq!(compacted.status, 200);
    proxy.heal();
    wait_until("the follower ended on a stale report", || async {
        follower.state.lock().unwrap().ended
    })
    .await;
    {
        let state = follower.state.lock().unwrap();
        let (lost, resume) = &state.stale[0];
        assert_eq!(lost.len(), 1);
        assert_eq!(
            (lost[0].stream.as_str(), lost[0].first, lost[0].last),
            ("1", 4, 6)
        );
        assert_eq!(resume.get(StreamId::new(1)), 6);
        assert_eq!(state.events.len(), 3, "nothing past the gap, nothing twice");
        assert_eq!(
            state.cursor.get(StreamId::new(1)),
            3,
            "the cursor stays before the gap"
        );
    }
    // Over the socket, the stale frame is the 410 body of `GET /events`.
    let old = token::encode_text(&[(StreamId::new(1), 3)].into_iter().collect()).unwrap();
    let gone = get(node.addr, &format!("/events?after={old}")).await;
    assert_eq!(gone.status, 410);
    let mut socket = connect(node.addr, &format!("after={old}")).await;
    let frame = next_frame(&mut socket).await.expect("a stale frame");
    let mut frame = serde_json::to_value(frame).unwrap();
    let object = frame.as_object_mut().unwrap();
    assert_eq!(object.remove("type"), Some(json!("stale")));
    assert_eq!(object.remove("stream"), Some(json!("all")));
    assert_eq!(frame, gone.json());
    assert!(
        next_frame(&mut socket).await.is_none(),
        "the subscription ends"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_fails_over_to_another_node_from_its_cursor() {
    let a = start(1).await;
    let b = start_with(2, |config| config.peers = vec![a.url()]).await;
    let proxy = WsProxy::start(a.addr, 11).await;
    let follower = Tracked::start("all", config(vec![proxy.url(), b.url()], FollowStream::All));
    for i in 0..5 {
        append(a.addr, format!("a {i}").as_bytes()).await;
    }
    wait_until("the follower has a's first five", || async {
        follower.state.lock().unwrap().events.len() == 5
    })
    .await;
    proxy.cut();
    for i in 5..10 {
        append(a.addr, format!("a {i}").as_bytes()).await;
        append(b.addr, format!("b {i}").as_bytes()).await;
    }
    wait_until("the follower has everything, through b", || async {
        follower.state.lock().unwrap().events.len() == 15
    })
    .await;
    let fresh = walk(b.addr, 100).await;
    let state = follower.state.lock().unwrap();
    let mut held: Vec<(String, u64)> = state
        .events
        .iter()
        .map(|e| (e.stream.clone(), e.seq))
        .collect();
    held.sort();
    let mut expected: Vec<(String, u64)> = fresh
        .iter()
        .map(|e| {
            (
                e["stream"].as_str().unwrap().to_owned(),
                e["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(held, expected);
    assert!(state.connected >= 2, "it reconnected");
}

#[tokio::test]
async fn the_page_is_served_at_the_root() {
    let node = start(1).await;
    let page = get(node.addr, "/").await;
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    let text = String::from_utf8(page.body).unwrap();
    assert!(
        text.contains("/follow"),
        "the page follows over GET /follow"
    );
    assert!(
        text.contains("/events"),
        "the page refetches gaps over GET /events"
    );
}

/// Regression (issue 25): an independent WebSocket follower saw heartbeats
/// whose head was 1–2 events past the last `events` frame sent (the tick
/// paged, then read the marks again, and a commit landed in between). Here
/// four writers append seeded batches while one connection follows the
/// whole log and the node's writer stream with 1 ms heartbeats; every
/// heartbeat's head must be covered by the `events` frames before it on its
/// subscription. Bounded by the events written, not by time. The
/// deterministic check of the same rule is the unit test beside the tick
/// (`follow/server.rs`); this one drives the real tick and committer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeats_never_run_ahead_of_the_events_frames_before_them() {
    use meshlog_testkit::seed::{seeds, Report};
    use meshlog_testkit::SplitMix64;

    for seed in seeds(0x4ea7_b3a7_0025, 2) {
        let _report = Report::new(
            "heartbeats_never_run_ahead_of_the_events_frames_before_them",
            seed,
        );
        let node = start_with(1, |config| {
            config.follow.heartbeat = Duration::from_millis(1);
            config.follow.queue_frames = 4096;
        })
        .await;
        let mut socket = connect(node.addr, "stream=all").await;
        let subscribe = json!({"type": "subscribe", "stream": "writer:1"});
        socket
            .send(Message::Text(subscribe.to_string().into()))
            .await
            .unwrap();
        let mut rng = SplitMix64::new(seed);
        let batches: Vec<Vec<usize>> = (0..4)
            .map(|_| (0..40).map(|_| 1 + (rng.next_u64() % 4) as usize).collect())
            .collect();
        let total: u64 = batches.iter().flatten().map(|&n| n as u64).sum();
        let writers: Vec<_> = batches
            .into_iter()
            .enumerate()
            .map(|(writer, sizes)| {
                let addr = node.addr;
                tokio::spawn(async move {
                    for (batch, size) in sizes.into_iter().enumerate() {
                        let payloads: Vec<String> =
                            (0..size).map(|i| format!("{writer}.{batch}.{i}")).collect();
                        let answer = post_json(addr, "/events", &json!(payloads)).await;
                        assert_eq!(answer.status, 201, "{:?}", answer.json());
                    }
                })
            })
            .collect();

        // Per subscription: what its events frames covered so far, and
        // whether a heartbeat came after they covered every event.
        let mut covered: std::collections::HashMap<String, VersionVector> = Default::default();
        let mut done: std::collections::HashSet<String> = Default::default();
        let mut heartbeats = 0u64;
        let one = StreamId::new(1);
        while done.len() < 2 {
            match next_frame(&mut socket)
                .await
                .expect("the connection stays open")
            {
                ServerFrame::Events { stream, next, .. } => {
                    covered
                        .entry(stream)
                        .or_default()
                        .join(&token::decode_text(&next).unwrap());
                }
                ServerFrame::Heartbeat { stream, head } => {
                    heartbeats += 1;
                    let head = token::decode_text(&head).unwrap();
                    let seen = covered.get(&stream).cloned().unwrap_or_default();
                    assert!(
                        seen.dominates(&head),
                        "seed {seed}: heartbeat {heartbeats} on {stream} names {head:?}, \
                         past the events frames before it ({seen:?})"
                    );
                    if seen.get(one) == total {
                        done.insert(stream);
                    }
                }
                other => panic!("seed {seed}: unexpected {other:?}"),
            }
        }
        for writer in writers {
            writer.await.unwrap();
        }
        assert!(heartbeats > 0);
    }
}

/// The status stream names each link's state as the console colours it
/// (`up`, `reconnecting` with its error, `refused` with the peer's answer),
/// inbound links too, with lag and the age of the last frame; and each
/// writer's head, floor, events held and last event time as `GET /marks`
/// and `GET /events` answer them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_stream_names_each_links_state_and_each_writers_head() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let guarded = start_with(4, |config| {
        config.security.secrets = meshlog_node::auth::SecretSources {
            peer: vec!["peer-secret-node-1-does-not-hold".into()],
            ..Default::default()
        };
    })
    .await;
    let b = start(2).await;
    let peers = vec![b.url(), closed_url.clone(), guarded.url()];
    let a = start_with(1, |config| config.peers = peers).await;
    let c = start_with(3, |config| config.peers = vec![a.url()]).await;
    for node in [&a, &b, &a] {
        append(node.addr, b"x").await;
    }
    let mut socket = connect(a.addr, "stream=status").await;
    let started = Instant::now();
    let status = loop {
        let Some(ServerFrame::Status(status)) = next_frame(&mut socket).await else {
            continue;
        };
        let state = |peer: &str| {
            status
                .links
                .iter()
                .find(|link| link.peer == peer)
                .map(|link| link.state.clone())
        };
        let inbound_up = status
            .links
            .iter()
            .any(|link| link.direction == "inbound" && link.stream.as_deref() == Some("3"));
        let settled = state(&b.url()).as_deref() == Some("up")
            && state(&closed_url).as_deref() == Some("reconnecting")
            && state(&guarded.url()).as_deref() == Some("refused")
            && inbound_up
            && status.marks.len() == 2
            && status
                .links
                .iter()
                .all(|link| link.lag_events == 0 || link.state != "up");
        if settled {
            break status;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the status never settled: {:#?}",
            status.links
        );
    };
    let link = |peer: &str| status.links.iter().find(|link| link.peer == peer).unwrap();
    let up = link(&b.url());
    assert_eq!(
        (up.direction.as_str(), up.stream.as_deref()),
        ("dialed", Some("2"))
    );
    assert!(
        up.reason.is_none() && up.exchange_age_ms.is_some(),
        "{up:?}"
    );
    let down = link(&closed_url);
    assert!(
        down.reason.as_deref().unwrap().contains("dial failed"),
        "{down:?}"
    );
    let refused = link(&guarded.url());
    assert!(
        refused.reason.as_deref().unwrap().contains("401"),
        "{refused:?}"
    );
    assert_eq!(
        refused.exchange_age_ms, None,
        "no frame ever came: {refused:?}"
    );
    drop(c);

    // The writers, against GET /marks and the events themselves.
    let marks = marks(a.addr).await;
    let events = walk(a.addr, 100).await;
    let expected: Vec<(String, u64, u64, u64, Option<u64>)> = marks
        .marks
        .iter()
        .map(|(stream, head)| {
            let floor = marks.floor.get(stream).copied().unwrap_or(0);
            let last = events
                .iter()
                .find(|e| e["stream"] == stream.as_str() && e["seq"] == *head)
                .map(|e| e["time"].as_u64().unwrap());
            (stream.clone(), *head, floor, head - floor, last)
        })
        .collect();
    let writers: Vec<(String, u64, u64, u64, Option<u64>)> = status
        .writers
        .iter()
        .map(|w| (w.stream.clone(), w.head, w.floor, w.held, w.last_time_ms))
        .collect();
    assert_eq!(writers, expected);
    assert_eq!(status.appended, 2, "node 1 appended two events");
    assert_eq!(status.received, 1, "and received one");
    assert!(status.time_ms > 0);
}
