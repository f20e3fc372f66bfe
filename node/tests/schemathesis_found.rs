//! Regressions for what the schemathesis run (`tests/schemathesis/run.sh`,
//! `docs/SECURITY.md`) found against the OpenAPI document: each test is
//! one finding, replayed against an in-process node over raw HTTP.

mod support;

use serde_json::json;
use support::*;

/// A body over axum's default extractor limit (2 MB) but under the node's
/// `body_bytes_max` (4 MiB) was refused `413` in plain text, not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_between_two_megabytes_and_the_node_limit_is_served() {
    let node = start(1).await;
    let payload = "x".repeat(900 << 10);
    let batch = json!([payload, payload, payload]).to_string();
    assert!(batch.len() > 2_000_000 && batch.len() < 4 << 20);
    let response = request(
        node.addr,
        "POST",
        "/events",
        &[("content-type", "application/json")],
        batch.as_bytes(),
    )
    .await;
    assert_eq!(
        response.status,
        201,
        "{:?}",
        response.header("content-type")
    );
    assert_eq!(response.json()["events"].as_array().unwrap().len(), 3);
}

/// `{"limit": 711.0}` is a JSON Schema `integer`; it was `400 bad_limit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_limit_written_as_a_float_is_a_limit() {
    let node = start(1).await;
    append(node.addr, b"a").await;
    append(node.addr, b"b").await;
    let response = post_json(node.addr, "/events/query", &json!({"limit": 1.0})).await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["events"].as_array().unwrap().len(), 1);
    let response = post_json(node.addr, "/events/query", &json!({"limit": 1.5})).await;
    assert_eq!(response.status, 400);
    assert_eq!(response.error(), "bad_limit");
}

/// Peer URLs no dial can reach were added (`http://[zz]`, user info
/// dropped) or silently dialed on port 80 (`http://host:65530*`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_urls_that_name_no_peer_are_refused() {
    let node = start(1).await;
    for url in [
        "http://[zz]",
        "http://user@host:7071",
        "http://host:65530*",
        "http://host:",
    ] {
        let response = post_json(node.addr, "/peers", &json!({ "url": url })).await;
        assert_eq!(response.status, 400, "{url}");
        assert_eq!(response.error(), "bad_peer_url", "{url}");
    }
    let peers = get(node.addr, "/peers").await.json();
    assert_eq!(peers["peers"], json!([]));
}

/// The stateful phase (seed 1429289164, case VEEyfW) added a peer, then
/// removed `http://[30.f]*`, a URL no peer can have, and was answered
/// `404 unknown_peer` ("created resource not found"): such a URL is a bad
/// request, as it is for `POST /peers`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_url_that_names_no_peer_is_a_bad_peer_url() {
    let node = start(1).await;
    let added = post_json(node.addr, "/peers", &json!({"url": "http://127.0.0.1:1"})).await;
    assert_eq!(added.status, 201);
    for url in ["http://[30.f]*", "http://[zz]", "http://host:65530*"] {
        let response = request(
            node.addr,
            "DELETE",
            "/peers",
            &[("content-type", "application/json")],
            json!({ "url": url }).to_string().as_bytes(),
        )
        .await;
        assert_eq!(response.status, 400, "{url}");
        assert_eq!(response.error(), "bad_peer_url", "{url}");
    }
    let peers = get(node.addr, "/peers").await.json();
    assert_eq!(peers["peers"].as_array().map(Vec::len), Some(1));
}

/// An `after` of any length was read when all digits (a legacy scalar:
/// leading zeros): the document says a token is at most `TOKEN_TEXT_MAX`
/// characters, and so is any `after`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_after_longer_than_a_token_can_be_is_a_bad_token() {
    let node = start(1).await;
    let max = meshlog_cursor::token::TOKEN_TEXT_MAX;
    let response = post_json(
        node.addr,
        "/events/query",
        &json!({ "after": format!("{}1", "0".repeat(max)) }),
    )
    .await;
    assert_eq!(response.status, 400);
    assert_eq!(response.error(), "bad_token");
    let response = post_json(
        node.addr,
        "/events/query",
        &json!({ "after": format!("{}1", "0".repeat(max - 1)) }),
    )
    .await;
    assert_eq!(response.status, 200);
}

/// `POST /compact` with a body of whitespace alone (`\t`, as JSON) was
/// taken as no body, the defaults, and answered 200; whitespace is not a
/// JSON object. An empty body still means the defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_body_of_whitespace_alone_is_refused_and_an_empty_one_is_the_defaults() {
    let node = start(1).await;
    append(node.addr, b"a").await;
    for body in [&b"\t"[..], b" ", b"\r\n"] {
        let response = request(
            node.addr,
            "POST",
            "/compact",
            &[("content-type", "application/json")],
            body,
        )
        .await;
        assert_eq!(
            (response.status, response.error()),
            (400, "bad_body".into()),
            "{body:?}"
        );
    }
    let response = request(node.addr, "POST", "/compact", &[], b"").await;
    assert_eq!(response.status, 200);
    assert_eq!(response.json()["dropped"], 0);
}
