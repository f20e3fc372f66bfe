//! Who may do what (`docs/SECURITY.md`): every route and the peer hello
//! with no secret, a wrong secret and each role's secret, where only the
//! documented combinations succeed and a refused request changes nothing;
//! open reads; rotating secrets with a reload; and an authenticated but
//! malicious peer (hostile floors, equivocation, lamports going backwards,
//! an oversized frame, a flood of hellos) refused and counted while an
//! honest peer and a reader go on.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_node::auth::SecretSources;
use meshlog_node::config::NodeConfig;
use meshlog_replica::{Delta, Event};
use meshlog_sync::frame::{Frame, FRAME_BYTES_MAX};
use serde_json::{json, Value};
use support::raw_peer::RawPeer;
use support::*;
use tokio::io::AsyncWriteExt;

const READ: &str = "read-secret-0123456789abcdef";
const WRITE: &str = "write-secret-0123456789abcdef";
const ADMIN: &str = "admin-secret-0123456789abcdef";
const PEER: &str = "peer-secret-0123456789abcdef";
const WRONG: &str = "wrong-secret-0123456789abcdef";

fn secrets(open_reads: bool) -> SecretSources {
    SecretSources {
        read: vec![READ.into()],
        write: vec![WRITE.into()],
        admin: vec![ADMIN.into()],
        peer: vec![PEER.into()],
        open_reads,
        file: None,
    }
}

fn secure(open_reads: bool) -> impl FnOnce(&mut NodeConfig) {
    move |config| config.security.secrets = secrets(open_reads)
}

/// One request with an optional bearer secret.
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    secret: Option<&str>,
    body: &str,
) -> Response {
    let auth = secret.map(|secret| format!("Bearer {secret}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(auth) = &auth {
        headers.push(("authorization", auth.as_str()));
    }
    request(addr, method, path, &headers, body.as_bytes()).await
}

/// What a reader with every right sees: marks, floor, digest, events.
async fn state(addr: SocketAddr) -> (Value, usize) {
    let marks = call(addr, "GET", "/marks", Some(ADMIN), "").await.json();
    let events = call(addr, "GET", "/events?limit=1000", Some(ADMIN), "")
        .await
        .json()["events"]
        .as_array()
        .unwrap()
        .len();
    let kept = json!({
        "marks": marks["marks"],
        "floor": marks["floor"],
        "digest": marks["digest"],
    });
    (kept, events)
}

/// Which role each route needs (`None`: open), and a body to send.
const ROUTES: &[(&str, &str, Option<&str>, &str)] = &[
    ("GET", "/events", Some("read"), ""),
    ("POST", "/events/query", Some("read"), r#"{"after":null}"#),
    ("GET", "/marks", Some("read"), ""),
    ("GET", "/follow?stream=all", Some("read"), ""),
    ("POST", "/events", Some("write"), r#"["x"]"#),
    ("GET", "/events/append", Some("write"), ""),
    ("POST", "/compact", Some("admin"), r#"{"keep_last":1000}"#),
    ("POST", "/verify", Some("admin"), ""),
    ("GET", "/peers", Some("admin"), ""),
    (
        "POST",
        "/peers",
        Some("admin"),
        r#"{"url":"http://127.0.0.1:9"}"#,
    ),
    (
        "DELETE",
        "/peers",
        Some("admin"),
        r#"{"url":"http://127.0.0.1:9"}"#,
    ),
    ("GET", "/health", None, ""),
    ("GET", "/metrics", None, ""),
    ("GET", "/", None, ""),
];

fn rank(role: &str) -> u8 {
    match role {
        "read" => 1,
        "write" => 2,
        "admin" => 3,
        other => panic!("no role {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_route_with_every_credential_only_the_documented_ones_pass() {
    let node = start_with(1, secure(false)).await;
    let addr = node.addr;
    // Something to protect: two events.
    for payload in ["a", "b"] {
        assert_eq!(
            call(
                addr,
                "POST",
                "/events",
                Some(WRITE),
                &json!([payload]).to_string()
            )
            .await
            .status,
            201
        );
    }
    let credentials: [(&str, Option<&str>, u8); 5] = [
        ("none", None, 0),
        ("wrong", Some(WRONG), 0),
        ("read", Some(READ), 1),
        ("write", Some(WRITE), 2),
        ("admin", Some(ADMIN), 3),
    ];

    // Every refused combination first: none may change anything.
    let before = state(addr).await;
    let mut refused = 0;
    for (method, path, needs, body) in ROUTES {
        for (name, secret, held) in credentials {
            let Some(needs) = needs else { continue };
            if held >= rank(needs) {
                continue;
            }
            let response = call(addr, method, path, secret, body).await;
            let expected = if held == 0 { 401 } else { 403 };
            assert_eq!(
                response.status,
                expected,
                "{method} {path} with the {name} secret: {:?}",
                String::from_utf8_lossy(&response.body)
            );
            assert_eq!(
                response.error(),
                if held == 0 {
                    "unauthorized"
                } else {
                    "forbidden"
                }
            );
            if held == 0 {
                assert_eq!(
                    response.header("www-authenticate"),
                    Some("Bearer realm=\"meshlog\"")
                );
            }
            refused += 1;
        }
    }
    // The peer link takes no bearer secret, whatever its role: only the
    // peer handshake opens it.
    for (name, secret, _) in credentials {
        let auth = secret.map(|secret| format!("Bearer {secret}"));
        let mut headers = vec![("connection", "upgrade"), ("upgrade", "meshlog-sync")];
        if let Some(auth) = &auth {
            headers.push(("authorization", auth.as_str()));
        }
        let response = request(addr, "GET", "/sync", &headers, b"").await;
        assert_eq!(
            (response.status, response.error()),
            (401, "peer_unauthorized".to_owned()),
            "GET /sync with the {name} secret"
        );
    }
    assert_eq!(
        state(addr).await,
        before,
        "a refused request changed the node"
    );
    // Four read routes refused to two, two write routes to three, five
    // admin routes to four.
    assert_eq!(refused, 4 * 2 + 2 * 3 + 5 * 4, "refused combinations");
    let metrics = call(addr, "GET", "/metrics", None, "").await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains(&format!("meshlog_requests_denied_total {refused}")),
        "{text}"
    );

    // Then every allowed one: each gets past the check (an answer other
    // than 401/403), and the writes take effect.
    for (method, path, needs, body) in ROUTES {
        for (name, secret, held) in credentials {
            if needs.is_some_and(|needs| held < rank(needs)) {
                continue;
            }
            let response = call(addr, method, path, secret, body).await;
            assert!(
                ![401, 403].contains(&response.status),
                "{method} {path} with the {name} secret was refused: {:?}",
                String::from_utf8_lossy(&response.body)
            );
            if *method == "POST" && *path == "/events" {
                assert_eq!(response.status, 201);
            }
        }
    }
    let (_, events) = state(addr).await;
    assert_eq!(
        events,
        2 + 2,
        "the write and admin secrets each appended once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn open_reads_serve_readers_without_a_secret_and_nothing_else() {
    let node = start_with(1, secure(true)).await;
    let addr = node.addr;
    assert_eq!(call(addr, "GET", "/events", None, "").await.status, 200);
    assert_eq!(call(addr, "GET", "/marks", None, "").await.status, 200);
    assert_eq!(
        call(addr, "POST", "/events", None, r#"["x"]"#).await.status,
        401
    );
    assert_eq!(call(addr, "POST", "/compact", None, "{}").await.status, 401);
    assert_eq!(
        call(addr, "GET", "/peers", Some(READ), "").await.status,
        403
    );
    // A wrong secret is refused even where none is needed.
    assert_eq!(
        call(addr, "GET", "/events", Some(WRONG), "").await.status,
        401
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rotated_secret_is_accepted_and_the_old_one_refused_after_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets.toml");
    let old = "old-write-secret-0123456789";
    let new = "new-write-secret-0123456789";
    std::fs::write(&file, format!("write = [\"{old}\"]\n")).unwrap();
    let path = file.clone();
    let node = start_with(1, move |config| {
        config.security.secrets = SecretSources {
            file: Some(path),
            ..SecretSources::default()
        }
    })
    .await;
    let addr = node.addr;
    assert_eq!(
        call(addr, "POST", "/events", Some(old), r#"["1"]"#)
            .await
            .status,
        201
    );
    // Both during the rotation, then only the new one.
    std::fs::write(&file, format!("write = [\"{old}\", \"{new}\"]\n")).unwrap();
    node.node.reload_secrets().unwrap();
    assert_eq!(
        call(addr, "POST", "/events", Some(old), r#"["2"]"#)
            .await
            .status,
        201
    );
    assert_eq!(
        call(addr, "POST", "/events", Some(new), r#"["3"]"#)
            .await
            .status,
        201
    );
    std::fs::write(&file, format!("write = [\"{new}\"]\n")).unwrap();
    node.node.reload_secrets().unwrap();
    assert_eq!(
        call(addr, "POST", "/events", Some(old), r#"["4"]"#)
            .await
            .status,
        401
    );
    assert_eq!(
        call(addr, "POST", "/events", Some(new), r#"["5"]"#)
            .await
            .status,
        201
    );
    // A broken file leaves the secrets in force.
    std::fs::write(&file, "write = [\"short\"]\n").unwrap();
    assert!(node.node.reload_secrets().is_err());
    assert_eq!(
        call(addr, "POST", "/events", Some(new), r#"["6"]"#)
            .await
            .status,
        201
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_without_secrets_refuses_to_listen_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path(), 1);
    config.listen = "0.0.0.0:0".into();
    let error = match meshlog_node::Node::start(config.clone()).await {
        Ok(_) => panic!("an unprotected node listened on 0.0.0.0"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("--allow-unauthenticated"), "{error}");
    config.security.allow_unauthenticated = true;
    let node = meshlog_node::Node::start(config).await.unwrap();
    node.shutdown();
    node.stopped().await;
}

// --- peers ---------------------------------------------------------------

async fn seqs_of(addr: SocketAddr, stream: u64) -> Vec<u64> {
    let page = call(addr, "GET", "/events?limit=1000", Some(ADMIN), "")
        .await
        .json();
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["stream"].as_str() == Some(stream.to_string().as_str()))
        .map(|event| event["seq"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn peers_with_the_secret_sync_and_peers_without_it_are_refused() {
    let a = start_with(1, secure(false)).await;
    let url = a.url();
    let honest = start_with(2, |config| {
        config.security.secrets = secrets(false);
        config.peers = vec![url.clone()];
    })
    .await;
    let wrong = start_with(3, {
        let url = url.clone();
        move |config| {
            config.security.secrets = SecretSources {
                admin: vec![ADMIN.into()],
                peer: vec![WRONG.into()],
                ..SecretSources::default()
            };
            config.peers = vec![url];
        }
    })
    .await;
    let none = start_with(4, {
        let url = url.clone();
        move |config| config.peers = vec![url]
    })
    .await;
    for (node, secret) in [(&honest, Some(WRITE)), (&wrong, Some(ADMIN)), (&none, None)] {
        let response = call(node.addr, "POST", "/events", secret, r#"["mine"]"#).await;
        assert_eq!(response.status, 201);
    }
    wait_until("the honest peer's event reaches A", || async {
        seqs_of(a.addr, 2).await == vec![1]
    })
    .await;
    wait_until("A counts the refused dialers", || async {
        counter(a.addr, "meshlog_peer_auth_refused_total").await >= 2
    })
    .await;
    assert!(
        seqs_of(a.addr, 3).await.is_empty(),
        "a peer with the wrong secret got in"
    );
    assert!(
        seqs_of(a.addr, 4).await.is_empty(),
        "a peer with no secret got in"
    );
    let errors = call(wrong.addr, "GET", "/peers", Some(ADMIN), "")
        .await
        .json();
    let error = errors["peers"][0]["last_error"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        error.contains("401"),
        "the refused dialer says why: {error}"
    );
}

fn event(stream: u64, seq: u64, lamport: u64, payload: &'static str) -> Event {
    Event {
        stream: StreamId::new(stream),
        seq,
        lamport,
        time_ms: 1_700_000_000_000,
        payload: Bytes::from_static(payload.as_bytes()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malicious_authenticated_peer_is_refused_and_nothing_is_lost() {
    // Heartbeats of a second (read timeouts of ten): the flood's sessions,
    // which send nothing after their hello, must outlive the flood, however
    // slowly a loaded machine lets it connect (at the tests' 50 ms, the
    // first ones timed out and gave their places back before the last).
    let a = start_with(1, |config| {
        config.security.secrets = secrets(false);
        config.sync.heartbeat = Duration::from_secs(1);
    })
    .await;
    let url = a.url();
    let honest = start_with(2, move |config| {
        config.security.secrets = secrets(false);
        config.sync.heartbeat = Duration::from_secs(1);
        config.peers = vec![url];
    })
    .await;
    for payload in ["h1", "h2"] {
        call(
            honest.addr,
            "POST",
            "/events",
            Some(WRITE),
            &json!([payload]).to_string(),
        )
        .await;
    }
    call(a.addr, "POST", "/events", Some(WRITE), r#"["a1"]"#).await;
    wait_until("A holds the honest peer's events", || async {
        seqs_of(a.addr, 2).await == vec![1, 2]
    })
    .await;
    let before = state(a.addr).await;
    let refused_before = counter(a.addr, "meshlog_deltas_refused_total").await;

    // A forger (our key id, another key) never reaches a session.
    let forger = RawPeer::connect(a.addr, WRONG, PEER).await.unwrap();
    assert!(
        forger.closed_within(DEADLINE).await,
        "a forged proof kept its link"
    );
    let unknown = RawPeer::connect(a.addr, WRONG, WRONG).await;
    assert_eq!(unknown.err(), Some(401));

    // Floors without authority (issue 29): one above A's own head (it was
    // refused, `OwnFloorAboveHead`, which ended every session with that
    // peer for good), one past the honest peer's head (it erased that
    // stream). Each is ignored: the session acknowledges it and goes on,
    // and A's floor is unchanged (checked below).
    let floors: Vec<(&str, Delta)> = vec![
        (
            "a floor above A's own head",
            Delta {
                floor_proofs: Default::default(),
                floor: [(StreamId::new(1), 50)].into_iter().collect(),
                events: Vec::new(),
                seals: Vec::new(),
            },
        ),
        (
            "a floor past the honest peer's head",
            Delta {
                floor_proofs: Default::default(),
                floor: [(StreamId::new(2), 2 + 5)].into_iter().collect(),
                events: Vec::new(),
                seals: Vec::new(),
            },
        ),
    ];
    for (index, (what, delta)) in floors.iter().enumerate() {
        // A stream of its own each: A may not yet have seen the previous
        // link close, and of two sessions dialed by one peer it keeps the
        // first (`Routes`), so the same stream at once would end as
        // `Duplicate` instead of acknowledging.
        let mut peer = RawPeer::connect(a.addr, PEER, PEER).await.unwrap();
        peer.hello(66 + index as u64).await;
        peer.send(&Frame::delta(1, delta.clone())).await;
        assert!(
            peer.acknowledges_within(1, DEADLINE).await,
            "{what}: the session ended instead of acknowledging it"
        );
    }
    assert_eq!(
        counter(a.addr, "meshlog_deltas_refused_total").await,
        refused_before,
        "a floor without authority was refused"
    );

    // Authenticated, but hostile: each delta ends its session.
    let hostile: Vec<(&str, Delta)> = vec![
        (
            "a floor no stream can reach, on the honest peer's stream",
            Delta {
                floor_proofs: Default::default(),
                floor: [(StreamId::new(2), u64::MAX)].into_iter().collect(),
                events: Vec::new(),
                seals: Vec::new(),
            },
        ),
        (
            "an equivocation: another event named (2, 1)",
            Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: vec![event(2, 1, 1, "forged")],
                seals: Vec::new(),
            },
        ),
        (
            "lamports going backwards: (2, 3) stamped below (2, 2)",
            Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: vec![event(2, 3, 1, "x")],
                seals: Vec::new(),
            },
        ),
        (
            "events of A's own stream",
            Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: vec![event(1, 2, 99, "mine?")],
                seals: Vec::new(),
            },
        ),
    ];
    for (what, delta) in &hostile {
        let mut peer = RawPeer::connect(a.addr, PEER, PEER).await.unwrap();
        peer.hello(66).await;
        peer.send(&Frame::delta(1, delta.clone())).await;
        assert!(
            peer.closed_within(DEADLINE).await,
            "{what}: the link stayed open"
        );
    }
    wait_until("A counts every refused delta", || async {
        counter(a.addr, "meshlog_deltas_refused_total").await
            >= refused_before + hostile.len() as u64
    })
    .await;

    // An oversized frame: a length prefix past the limit.
    let mut peer = RawPeer::connect(a.addr, PEER, PEER).await.unwrap();
    peer.hello(66).await;
    let _ = peer
        .stream
        // (A side reads one byte more than the limit: the flag its hello
        // sets in the limit's lowest bit.)
        .write_all(&((FRAME_BYTES_MAX as u32) + 2).to_le_bytes())
        .await;
    assert!(
        peer.closed_within(DEADLINE).await,
        "an oversized frame kept its link"
    );

    // A flood of hellos: more sessions than A accepts, all at once, while a
    // reader pages. Each claims a stream of its own (hellos claiming one
    // stream collapse into one session); a few claim the honest peer's
    // stream, whose own session must survive them.
    let mut flood = Vec::new();
    let mut turned_away = 0;
    for index in 0..80u64 {
        match RawPeer::connect(a.addr, PEER, PEER).await {
            Ok(mut peer) => {
                peer.hello(if index % 10 == 0 { 2 } else { 1000 + index })
                    .await;
                flood.push(peer);
            }
            Err(503) => turned_away += 1,
            Err(status) => panic!("a hello in the flood got {status}"),
        }
    }
    assert!(turned_away > 0, "the flood was never turned away");
    assert_eq!(
        call(a.addr, "GET", "/events", Some(READ), "").await.status,
        200
    );
    drop(flood);

    // Nothing lost, and the honest peer goes on.
    let (after, _) = state(a.addr).await;
    assert_eq!(
        after["floor"], before.0["floor"],
        "a hostile floor took effect"
    );
    assert_eq!(seqs_of(a.addr, 2).await, vec![1, 2]);
    assert_eq!(seqs_of(a.addr, 1).await, vec![1]);
    assert!(seqs_of(a.addr, 66).await.is_empty());
    let page = call(a.addr, "GET", "/events?limit=100", Some(READ), "")
        .await
        .json();
    assert!(page["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["payload"] != "forged"));
    call(honest.addr, "POST", "/events", Some(WRITE), r#"["h3"]"#).await;
    wait_until("the honest peer still syncs", || async {
        seqs_of(a.addr, 2).await == vec![1, 2, 3]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_may_give_its_secret_in_the_query_as_a_browser_must() {
    let node = start_with(1, secure(false)).await;
    let base = format!("ws://{}/follow?stream=all", node.addr);
    let status = |result: Result<_, tokio_tungstenite::tungstenite::Error>| match result {
        Ok((_, response)) => {
            let response: &tokio_tungstenite::tungstenite::handshake::client::Response = &response;
            response.status().as_u16()
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(error) => panic!("{error}"),
    };
    let refused = tokio_tungstenite::connect_async(base.clone()).await;
    assert_eq!(status(refused.map(|(_, r)| ((), r))), 401);
    let wrong = tokio_tungstenite::connect_async(format!("{base}&access_token={WRONG}")).await;
    assert_eq!(status(wrong.map(|(_, r)| ((), r))), 401);
    let read = tokio_tungstenite::connect_async(format!("{base}&access_token={READ}")).await;
    assert_eq!(status(read.map(|(_, r)| ((), r))), 101);
    // Only on /follow: a page with the secret in its query is refused.
    let page = call(
        node.addr,
        "GET",
        &format!("/events?access_token={READ}"),
        None,
        "",
    )
    .await;
    assert_eq!(page.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn encoded_or_odd_paths_do_not_slip_past_the_route_table() {
    let node = start_with(1, secure(false)).await;
    for path in [
        "/%65vents",
        "/events/",
        "//events",
        "/events?x=/health",
        "/./events",
        "/health/../events",
        "/EVENTS",
        "/marks%2F",
        "/peers/",
    ] {
        let response = call(node.addr, "GET", path, None, "").await;
        assert!(
            [401, 404, 400].contains(&response.status),
            "GET {path} without a secret answered {}: {:?}",
            response.status,
            String::from_utf8_lossy(&response.body)
        );
        if response.status != 401 {
            assert_ne!(response.status, 200);
        }
    }
    let response = call(node.addr, "HEAD", "/marks", None, "").await;
    assert_eq!(
        response.status, 401,
        "HEAD reached a GET handler without a secret"
    );
    let response = call(node.addr, "POST", "/%65vents", None, r#"["x"]"#).await;
    assert_ne!(
        response.status, 201,
        "an encoded path appended without a secret"
    );
}
