//! The HTTP API against a real node started in-process on a free port:
//! appends (one raw payload, JSON and NDJSON batches, base64), walks to the
//! head with tokens, byte-exact payloads, long tokens through
//! `POST /events/query`, a stale token answered 410 with the exact ranges
//! and a resume token that works, a token from a node that is ahead
//! (`behind: true`), and a legacy scalar `after=N`.

mod support;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use meshlog_cursor::{token, StreamId, VersionVector};
use serde_json::{json, Value};
use support::*;

fn payload_bytes(event: &Value) -> Vec<u8> {
    match (event.get("payload"), event.get("payload_base64")) {
        (Some(Value::String(text)), None) => text.as_bytes().to_vec(),
        (None, Some(Value::String(encoded))) => STANDARD.decode(encoded).expect("valid base64"),
        _ => panic!("an event carries exactly one of payload and payload_base64: {event}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_of_every_kind_walk_back_byte_exact() {
    let node = start(7).await;
    let addr = node.addr;
    let mut expected: Vec<Vec<u8>> = Vec::new();

    // One raw payload, any content type but the two batch types.
    let raw = request(
        addr,
        "POST",
        "/events",
        &[("content-type", "text/plain")],
        b"hello",
    )
    .await;
    assert_eq!(raw.status, 201);
    assert_eq!(
        raw.json(),
        json!({"events": [{"stream": "7", "seq": 1, "lamport": 1}]})
    );
    expected.push(b"hello".to_vec());

    // Raw bytes that are not UTF-8 come back as payload_base64.
    let binary: Vec<u8> = vec![0xff, 0x00, 0xfe, b'a', 0x80];
    let response = request(
        addr,
        "POST",
        "/events",
        &[("content-type", "application/octet-stream")],
        &binary,
    )
    .await;
    assert_eq!(response.status, 201);
    expected.push(binary.clone());

    // A JSON batch: strings and objects, one commit.
    let batch = json!(["a", {"payload": "b"}, {"payload_base64": STANDARD.encode([0u8, 159, 146, 150])}, "ünïcödé"]);
    let response = post_json(addr, "/events", &batch).await;
    assert_eq!(response.status, 201);
    let seqs: Vec<u64> = response.json()["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![3, 4, 5, 6]);
    expected.extend([
        b"a".to_vec(),
        b"b".to_vec(),
        vec![0, 159, 146, 150],
        "ünïcödé".as_bytes().to_vec(),
    ]);

    // An NDJSON batch, blank lines skipped, CRLF tolerated.
    let ndjson = b"\"x\"\r\n\n{\"payload\":\"y\"}\n{\"payload_base64\":\"AAE=\"}\n";
    let response = request(
        addr,
        "POST",
        "/events",
        &[("content-type", "application/x-ndjson")],
        ndjson,
    )
    .await;
    assert_eq!(
        response.status,
        201,
        "{:?}",
        String::from_utf8_lossy(&response.body)
    );
    assert_eq!(response.json()["events"].as_array().unwrap().len(), 3);
    expected.extend([b"x".to_vec(), b"y".to_vec(), vec![0, 1]]);

    // A content type with parameters is still a batch.
    let response = request(
        addr,
        "POST",
        "/events",
        &[("content-type", "Application/JSON; charset=utf-8")],
        b"[\"z\"]",
    )
    .await;
    assert_eq!(response.status, 201);
    expected.push(b"z".to_vec());

    for limit in [1, 2, 3, 100] {
        let events = walk(addr, limit).await;
        let payloads: Vec<Vec<u8>> = events.iter().map(payload_bytes).collect();
        assert_eq!(payloads, expected, "walk with limit {limit}");
        for (index, event) in events.iter().enumerate() {
            assert_eq!(event["stream"], "7");
            assert_eq!(event["seq"], index as u64 + 1);
            assert!(event["time"].as_u64().unwrap() > 1_600_000_000_000);
        }
    }
    // Text payloads are text, others base64.
    let events = walk(addr, 100).await;
    assert_eq!(events[0]["payload"], "hello");
    assert!(events[0].get("payload_base64").is_none());
    assert_eq!(events[1]["payload_base64"], STANDARD.encode(&binary));
    assert!(events[1].get("payload").is_none());

    // The last page's token is at the head; the marks' token equals it.
    let all = get(addr, "/events?limit=100").await.json();
    assert_eq!(all["at_head"], true);
    assert_eq!(all["behind"], false);
    assert_eq!(marks(addr).await["token"], all["next"]);
    let empty = get(
        addr,
        &format!("/events?after={}", all["next"].as_str().unwrap()),
    )
    .await
    .json();
    assert_eq!(empty["events"], json!([]));
    assert_eq!(empty["at_head"], true);
    assert_eq!(empty["next"], all["next"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_takes_a_long_token_and_a_token_ahead_of_the_node_is_served_as_behind() {
    let node = start(7).await;
    let addr = node.addr;
    for i in 0..5u8 {
        append(addr, &[b'e', b'0' + i]).await;
    }
    // A token from a node that holds 1,000 streams this one has never seen,
    // and is ahead on this node's own stream too: about 14 KB of text.
    let mut rng = 0x006d_6573_686c_6f67u64;
    let mut ahead: VersionVector = (0..1000)
        .map(|_| {
            rng = rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (StreamId::new((z ^ (z >> 31)).max(8)), 3)
        })
        .collect();
    ahead.advance(StreamId::new(7), 2);
    let text = token::encode_text(&ahead).unwrap();
    assert!(text.len() >= 12_000, "{} chars", text.len());

    let response = post_json(addr, "/events/query", &json!({"after": text, "limit": 10})).await;
    assert_eq!(
        response.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&response.body)
    );
    let page = response.json();
    assert_eq!(page["behind"], true);
    assert_eq!(page["at_head"], true);
    // What this node has beyond the token, never an error, never a skip.
    let seqs: Vec<u64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![3, 4, 5]);
    let next = token::decode_text(page["next"].as_str().unwrap()).unwrap();
    assert_eq!(next.get(StreamId::new(7)), 5);
    assert_eq!(next.len(), 1001, "the token's other streams are kept");

    // The same long token works in a URL too.
    let response = get(addr, &format!("/events?after={text}&limit=10")).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["events"], page["events"]);

    // `after: null` and no `after` are the start; no limit is the default.
    let from_null = post_json(addr, "/events/query", &json!({"after": null}))
        .await
        .json();
    let from_none = post_json(addr, "/events/query", &json!({})).await.json();
    assert_eq!(from_null["events"].as_array().unwrap().len(), 5);
    assert_eq!(from_null, from_none);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_token_is_told_exactly_what_it_lost_and_its_resume_token_works() {
    let node = start(3).await;
    let addr = node.addr;
    for i in 0..10u8 {
        append(addr, &[b'a' + i]).await;
    }
    let first = get(addr, "/events?limit=2").await.json();
    let stale_token = first["next"].as_str().unwrap().to_owned();
    let before = marks(addr).await;

    let compacted = post_json(addr, "/compact", &json!({"keep_last": 3})).await;
    assert_eq!(compacted.status, 200);
    assert_eq!(
        compacted.json(),
        json!({"dropped": 7, "streams": 1, "floor": {"3": 7}})
    );

    for response in [
        get(addr, &format!("/events?after={stale_token}")).await,
        post_json(addr, "/events/query", &json!({"after": stale_token})).await,
    ] {
        assert_eq!(response.status, 410);
        let body = response.json();
        assert_eq!(body["error"], "stale_cursor");
        assert_eq!(
            body["lost"],
            json!([{"stream": "3", "first": 3, "last": 7}])
        );
        assert!(body["message"].as_str().unwrap().contains("seq 3..=7"));
        let resume = body["resume"].as_str().unwrap();
        let page = get(addr, &format!("/events?after={resume}")).await.json();
        let payloads: Vec<&str> = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["payload"].as_str().unwrap())
            .collect();
        assert_eq!(payloads, vec!["h", "i", "j"]);
        assert_eq!(page["at_head"], true);
    }
    // From the start is stale too: everything below the floor is named.
    let response = get(addr, "/events").await;
    assert_eq!(response.status, 410);
    assert_eq!(
        response.json()["lost"],
        json!([{"stream": "3", "first": 1, "last": 7}])
    );

    let marks = marks(addr).await;
    assert_eq!(marks["floor"], json!({"3": 7}));
    assert_eq!(marks["marks"], json!({"3": 10}));
    assert_eq!(marks["digest"]["events"], 3);
    // The digest of what is held moved with the floor; the chain heads
    // did not.
    assert_ne!(marks["digest"], before["digest"]);
    assert_eq!(marks["chains"], before["chains"]);
    assert_eq!(marks["chains"]["streams"]["3"]["head"], 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_scalar_position_is_served_from_the_vector_covering_it() {
    let node = start(5).await;
    let addr = node.addr;
    for i in 0..6u8 {
        append(addr, &[b'a' + i]).await;
    }
    // Lamport stamps are 1..=6 on this single writer: after=4 means the
    // events stamped 5 and 6.
    let page = get(addr, "/events?after=4").await.json();
    let payloads: Vec<&str> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["payload"].as_str().unwrap())
        .collect();
    assert_eq!(payloads, vec!["e", "f"]);
    // The answer carries a real token to switch to.
    let next = token::decode_text(page["next"].as_str().unwrap()).unwrap();
    assert_eq!(next.get(StreamId::new(5)), 6);
    // 0 is the start; a scalar past every stamp is the head.
    assert_eq!(
        get(addr, "/events?after=0").await.json()["events"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    let past = get(addr, "/events?after=1000").await.json();
    assert_eq!(past["events"], json!([]));
    assert_eq!(past["at_head"], true);
    // In a query body too.
    let query = post_json(addr, "/events/query", &json!({"after": "4"}))
        .await
        .json();
    assert_eq!(query["events"], page["events"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_metrics_and_marks_answer_their_shapes() {
    let node = start(9).await;
    let addr = node.addr;
    append(addr, b"one").await;
    let health = get(addr, "/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json(), json!({"status": "ok"}));

    let _ = get(addr, "/events").await;
    let metrics = get(addr, "/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = String::from_utf8(metrics.body).unwrap();
    for line in [
        "meshlog_appends_total 1",
        "meshlog_pages_total 1",
        "meshlog_applies_total 0",
        "meshlog_deltas_refused_total 0",
        "meshlog_open_warnings 0",
        "meshlog_pages_stale_total 0",
        "meshlog_sync_sessions 0",
        "meshlog_peers_connected 0",
        "meshlog_sync_statements_sent_total 0",
        "meshlog_sync_statements_refused_total 0",
        "meshlog_sync_frames_skipped_total 0",
        "meshlog_sync_first_hellos_against_total 0",
        "meshlog_commit_seconds_count 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }

    let marks = marks(addr).await;
    assert_eq!(marks["stream"], "9");
    assert_eq!(marks["marks"], json!({"9": 1}));
    assert_eq!(marks["floor"], json!({}));
    assert_eq!(marks["peers"], json!([]));
    assert_eq!(marks["digest"]["events"], 1);
    assert_eq!(marks["digest"]["sum"].as_str().unwrap().len(), 32);
    let chains = &marks["chains"];
    assert_eq!(chains["hash"].as_str().unwrap().len(), 64);
    let streams = chains["streams"].as_object().unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams["9"]["head"], 1);
    assert_eq!(streams["9"]["hash"].as_str().unwrap().len(), 64);
}

/// A version-2 token relative to a checkpoint the node does not keep is
/// refused on every read route with `409 unknown_checkpoint` naming it,
/// never read as another cursor (issue 27; `docs/HTTP.md`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_relative_to_an_unknown_checkpoint_is_409_on_every_read() {
    let node = start(7).await;
    let addr = node.addr;
    append(addr, b"x").await;
    let vector: VersionVector = (1..=300u64).map(|s| (StreamId::new(s), 3)).collect();
    let checkpoint = meshlog_cursor::Checkpoint::new(vector.clone()).unwrap();
    let relative = token::encode_relative_text(&vector, &checkpoint).unwrap();
    let name = checkpoint.name().to_string();
    let query = post_json(addr, "/events/query", &json!({"after": relative})).await;
    let get = get(addr, &format!("/events?after={relative}")).await;
    let follow = get_follow(addr, &relative).await;
    for response in [query, get, follow] {
        assert_eq!(response.status, 409, "{}", response.error());
        let body = response.json();
        assert_eq!(body["error"], "unknown_checkpoint");
        assert_eq!(body["checkpoint"], name.as_str());
    }
    // Its version-1 form reads as ever.
    let v1 = token::encode_text(&vector).unwrap();
    assert_eq!(get_events_status(addr, &v1).await, 200);
}

async fn get_follow(addr: std::net::SocketAddr, after: &str) -> Response {
    get(addr, &format!("/follow?after={after}")).await
}

async fn get_events_status(addr: std::net::SocketAddr, after: &str) -> u16 {
    get(addr, &format!("/events?after={after}")).await.status
}
