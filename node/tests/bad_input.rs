//! Bad input against a real node: each is answered with its documented
//! status and error code, and afterwards the node still serves and its state
//! (marks, digest) is unchanged.
//!
//! Hostile tokens come from the cursor crate's committed vectors
//! (`cursor/tests/vectors.txt`, every `invalid` line) and the fuzz
//! regressions (`fuzz/regressions/*/`); the expected answer of each is what
//! the codec itself says of it, so the API adds no leniency and no panic.
//! Then bad limits, bodies over the limit, invalid JSON / UTF-8 / base64
//! batches, a slow client cut off by the read timeout while another pages,
//! more connections than the limit, and unknown routes and methods.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use meshlog_cursor::token;
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// Every hostile token text: the vectors' invalid inputs, and each fuzz
/// regression as raw text, as the base64 of its bytes, and wrapped with a
/// valid version byte and checksum as the fuzz target does.
fn hostile_tokens() -> Vec<(String, String)> {
    let mut texts = Vec::new();
    let vectors = std::fs::read_to_string(repo_file("cursor/tests/vectors.txt")).unwrap();
    for (index, line) in vectors.lines().enumerate() {
        let Some(rest) = line.strip_prefix("invalid ") else {
            continue;
        };
        let input = rest.split(' ').next().unwrap();
        let text = if let Some(hex) = input.strip_prefix("hex:") {
            let hex: String = hex.chars().filter(|c| *c != '_').collect();
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            URL_SAFE_NO_PAD.encode(bytes)
        } else if let Some(text) = input.strip_prefix("text:") {
            text.to_owned()
        } else if let Some(fill) = input.strip_prefix("fill:") {
            let (byte, count) = fill.split_once('*').unwrap();
            let byte = u8::from_str_radix(byte, 16).unwrap();
            URL_SAFE_NO_PAD.encode(vec![byte; count.parse().unwrap()])
        } else if let Some(fill) = input.strip_prefix("textfill:") {
            let (ch, count) = fill.split_once('*').unwrap();
            ch.repeat(count.parse().unwrap())
        } else {
            panic!("vectors.txt line {}: unknown input {input}", index + 1);
        };
        texts.push((format!("vectors.txt line {}", index + 1), text));
    }
    assert!(
        texts.len() > 30,
        "only {} invalid vectors found",
        texts.len()
    );
    let mut regressions = 0;
    for target in ["token_decode", "token_roundtrip"] {
        let dir = repo_file(&format!("fuzz/regressions/{target}"));
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let name = format!(
                "fuzz/regressions/{target}/{}",
                path.file_name().unwrap().to_string_lossy()
            );
            let Some((&mode, payload)) = data.split_first() else {
                continue;
            };
            regressions += 1;
            texts.push((
                format!("{name} (text)"),
                String::from_utf8_lossy(payload).into_owned(),
            ));
            texts.push((format!("{name} (bytes)"), URL_SAFE_NO_PAD.encode(payload)));
            if mode & 1 == 1 {
                let mut wrapped = vec![1u8];
                wrapped.extend_from_slice(payload);
                let crc = crc32fast::hash(&wrapped);
                wrapped.extend_from_slice(&crc.to_le_bytes());
                texts.push((format!("{name} (wrapped)"), URL_SAFE_NO_PAD.encode(wrapped)));
            }
        }
    }
    assert!(regressions > 5, "only {regressions} fuzz regressions found");
    texts
}

/// What the API must answer for `after = text`: (status, the message of a
/// `400 bad_token`).
fn expected_answer(text: &str) -> (u16, Option<String>) {
    if text.is_empty() {
        return (200, None);
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<u64>() {
            Ok(_) => (200, None),
            Err(_) => (400, None),
        };
    }
    // Either version (`docs/TOKEN.md`): a version-2 token names a
    // checkpoint, which this node (it gossips none) does not keep.
    match token::decode_any_text(text) {
        Ok(token::Token::Absolute(_)) => (200, None),
        Ok(token::Token::Relative(_)) => (409, None),
        Err(error) => (400, Some(error.to_string())),
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn state_of(addr: std::net::SocketAddr) -> (Value, Value) {
    let marks = marks(addr).await;
    (marks["marks"].clone(), marks["digest"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_tokens_are_refused_with_the_codecs_reason_and_change_nothing() {
    let node = start(11).await;
    let addr = node.addr;
    for i in 0..3u8 {
        append(addr, &[b'a' + i]).await;
    }
    let before = state_of(addr).await;
    let mut checked = 0;
    for (name, text) in hostile_tokens() {
        let (status, message) = expected_answer(&text);
        let mut answers =
            vec![post_json(addr, "/events/query", &json!({"after": text, "limit": 5})).await];
        if text.len() <= 16 * 1024 {
            answers.push(
                get(
                    addr,
                    &format!("/events?limit=5&after={}", percent_encode(&text)),
                )
                .await,
            );
        }
        for response in answers {
            assert_eq!(
                response.status,
                status,
                "{name}: {:?}",
                String::from_utf8_lossy(&response.body)
            );
            if status == 400 {
                let body = response.json();
                assert_eq!(body["error"], "bad_token", "{name}");
                if let Some(message) = &message {
                    assert_eq!(body["message"], *message, "{name}");
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 60, "{checked}");
    assert_eq!(state_of(addr).await, before);
    assert_eq!(walk(addr, 2).await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_limits_are_400_bad_limit() {
    let node = start(12).await;
    let addr = node.addr;
    append(addr, b"x").await;
    for limit in [
        "0",
        "-1",
        "10001",
        "18446744073709551616",
        "abc",
        "1.5",
        "",
        "%20",
    ] {
        let response = get(addr, &format!("/events?limit={limit}")).await;
        assert_eq!(response.status, 400, "limit={limit}");
        assert_eq!(response.error(), "bad_limit", "limit={limit}");
        assert_eq!(response.json()["max"], 10_000);
    }
    for limit in [
        json!(0),
        json!(-1),
        json!(10_001),
        json!("abc"),
        json!(1.5),
        json!(true),
        json!([1]),
    ] {
        let response = post_json(addr, "/events/query", &json!({"limit": limit})).await;
        assert_eq!(response.status, 400, "limit {limit}");
        assert_eq!(response.error(), "bad_limit", "limit {limit}");
    }
    // The largest allowed limit, and a limit as a string in JSON, are fine.
    assert_eq!(get(addr, "/events?limit=10000").await.status, 200);
    assert_eq!(
        post_json(addr, "/events/query", &json!({"limit": "2"}))
            .await
            .status,
        200
    );
    // A query body that is not the documented object is bad_body.
    for body in [
        &b"not json"[..],
        b"[]",
        b"{\"after\": 5}",
        b"{\"afterr\": null}",
    ] {
        let response = request(
            addr,
            "POST",
            "/events/query",
            &[("content-type", "application/json")],
            body,
        )
        .await;
        assert_eq!(response.status, 400, "{:?}", String::from_utf8_lossy(body));
        assert_eq!(response.error(), "bad_body");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_are_refused_whole_and_change_nothing() {
    let node = start_with(13, |config| {
        config.limits.body_bytes_max = 64 * 1024;
        config.limits.payload_bytes_max = 1024;
    })
    .await;
    let addr = node.addr;
    append(addr, b"kept").await;
    let before = state_of(addr).await;
    let json_type = [("content-type", "application/json")];
    let ndjson_type = [("content-type", "application/x-ndjson")];

    // Over the body limit: declared, and chunked with no length.
    let big = vec![b'x'; 64 * 1024 + 1];
    let response = request(addr, "POST", "/events", &[], &big).await;
    assert_eq!(
        (response.status, response.error()),
        (413, "body_too_large".into())
    );
    let response = request(addr, "POST", "/events/query", &json_type, &big).await;
    assert_eq!(
        (response.status, response.error()),
        (413, "body_too_large".into())
    );
    let chunked = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = "POST /events HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n";
        stream.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..5 {
            let chunk = vec![b'y'; 16 * 1024];
            let _ = stream
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await;
            let _ = stream.write_all(&chunk).await;
            let _ = stream.write_all(b"\r\n").await;
        }
        let _ = stream.write_all(b"0\r\n\r\n").await;
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        parse_response(&answer).expect("an answer")
    };
    let response = tokio::time::timeout(DEADLINE, chunked).await.unwrap();
    assert_eq!(
        (response.status, response.error()),
        (413, "body_too_large".into())
    );

    // A payload over the replica's limit, alone or inside a batch.
    let response = request(addr, "POST", "/events", &[], &vec![b'p'; 1025]).await;
    assert_eq!(
        (response.status, response.error()),
        (413, "payload_too_large".into())
    );
    let batch = json!(["small", "x".repeat(1025)]).to_string();
    let response = request(addr, "POST", "/events", &json_type, batch.as_bytes()).await;
    assert_eq!(
        (response.status, response.error()),
        (413, "payload_too_large".into())
    );

    // Invalid JSON, invalid UTF-8 inside JSON, invalid elements and base64.
    let bad_json_batches: [&[u8]; 11] = [
        b"[",
        b"{\"payload\": \"a\"}",
        b"[1, 2]",
        b"[\"ok\", null]",
        b"[\"\xff\xfe\"]",
        b"[{\"payload\": \"a\", \"payload_base64\": \"YQ==\"}]",
        b"[{}]",
        b"[{\"payload_base64\": \"!!!!\"}]",
        b"[{\"payload_base64\": \"YQ\"}]",
        b"[{\"payload\": \"a\", \"extra\": 1}]",
        b"",
    ];
    for body in bad_json_batches {
        let response = request(addr, "POST", "/events", &json_type, body).await;
        assert_eq!(response.status, 400, "{:?}", String::from_utf8_lossy(body));
        assert_eq!(
            response.error(),
            "bad_body",
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    // NDJSON: a bad line refuses the lines before it too (one commit).
    for body in [
        &b"\"good\"\nnot json\n"[..],
        b"\"good\"\n{\"payload_base64\": \"@@\"}\n",
        b"\"good\"\n\"\xff\"\n",
    ] {
        let response = request(addr, "POST", "/events", &ndjson_type, body).await;
        assert_eq!(response.status, 400, "{:?}", String::from_utf8_lossy(body));
        assert_eq!(response.error(), "bad_body");
    }
    // Compact and peers bodies.
    for (path, body) in [
        ("/compact", &b"{\"keep_last\": -1}"[..]),
        ("/compact", b"{\"nope\": 1}"),
        ("/peers", b"{}"),
        ("/peers", b"["),
    ] {
        let response = request(addr, "POST", path, &json_type, body).await;
        assert_eq!(
            (response.status, response.error()),
            (400, "bad_body".into()),
            "{path}"
        );
    }
    let response = post_json(addr, "/peers", &json!({"url": "ftp://x"})).await;
    assert_eq!(
        (response.status, response.error()),
        (400, "bad_peer_url".into())
    );
    let response = request(
        addr,
        "DELETE",
        "/peers",
        &json_type,
        br#"{"url": "http://127.0.0.1:1"}"#,
    )
    .await;
    assert_eq!(
        (response.status, response.error()),
        (404, "unknown_peer".into())
    );

    assert_eq!(state_of(addr).await, before);
    assert_eq!(append(addr, b"still serving").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_methods_answer_json_errors() {
    let node = start(14).await;
    let addr = node.addr;
    // `/` serves the follow page (`node/tests/follow.rs`).
    for path in ["/nope", "/events/x", "/marks/", "/v1/events"] {
        let response = get(addr, path).await;
        assert_eq!(response.status, 404, "{path}");
        assert_eq!(response.json()["error"], "not_found", "{path}");
        assert!(response.json()["message"].is_string());
    }
    for (method, path) in [
        ("PUT", "/events"),
        ("DELETE", "/marks"),
        ("GET", "/compact"),
        ("POST", "/health"),
        ("PATCH", "/peers"),
        ("GET", "/events/query"),
        ("POST", "/sync"),
    ] {
        let response = request(addr, method, path, &[], b"").await;
        assert_eq!(response.status, 405, "{method} {path}");
        assert_eq!(
            response.json()["error"],
            "method_not_allowed",
            "{method} {path}"
        );
    }
    // GET /sync without the upgrade headers.
    let response = get(addr, "/sync").await;
    assert_eq!(
        (response.status, response.error()),
        (426, "upgrade_required".into())
    );
    let response = request(
        addr,
        "GET",
        "/sync",
        &[("connection", "upgrade"), ("upgrade", "websocket")],
        b"",
    )
    .await;
    assert_eq!(
        (response.status, response.error()),
        (426, "upgrade_required".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_cut_off_while_another_pages_normally() {
    let node = start_with(15, |config| {
        config.limits.request_read_timeout = Duration::from_millis(300);
    })
    .await;
    let addr = node.addr;
    append(addr, b"x").await;

    // Half a request head, never finished.
    let mut slow_head = TcpStream::connect(addr).await.unwrap();
    slow_head
        .write_all(b"GET /events HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    // A whole head, then a body that never comes.
    let mut slow_body = TcpStream::connect(addr).await.unwrap();
    slow_body
        .write_all(b"POST /events HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nonly this")
        .await
        .unwrap();
    // A connection that sends nothing at all.
    let mut silent = TcpStream::connect(addr).await.unwrap();

    // Meanwhile another client pages normally.
    for _ in 0..5 {
        assert_eq!(get(addr, "/events").await.status, 200);
    }

    // The head that never ends: the connection is closed.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(DEADLINE, slow_head.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the slow head was not cut off");
    // The body that never ends: 408 request_timeout.
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, slow_body.read_to_end(&mut answer))
        .await
        .expect("the slow body was not cut off")
        .unwrap();
    let response = parse_response(&answer).expect("an answer");
    assert_eq!(
        (response.status, response.error()),
        (408, "request_timeout".into())
    );
    // The silent connection is closed too.
    let mut buf = Vec::new();
    let read = tokio::time::timeout(DEADLINE, silent.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the silent connection was not cut off");

    // Nothing was appended by the cut-off body.
    assert_eq!(marks(addr).await["marks"], json!({"15": 1}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_refused_without_harming_the_others() {
    let node = start_with(16, |config| {
        config.limits.connections_max = 4;
        config.limits.request_read_timeout = Duration::from_secs(30);
    })
    .await;
    let addr = node.addr;
    append(addr, b"x").await;
    // Wait for the append's connection to be released.
    wait_until("the first connection is released", || async {
        let text = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
        text.lines().any(|l| l == "meshlog_connections_open 1")
    })
    .await;

    // Four connections held open, each with a request in progress.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        held.push(stream);
    }
    // Let the server accept all four before the fifth.
    wait_until("a fifth connection is refused", || async {
        let response = get(addr, "/health").await;
        response.status == 503
    })
    .await;
    let response = get(addr, "/events").await;
    assert_eq!(
        (response.status, response.error()),
        (503, "too_many_connections".into())
    );
    assert_eq!(response.header("retry-after"), Some("1"));

    // The held connections are unharmed: each finishes its request.
    for stream in &mut held {
        stream
            .write_all(b"connection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer))
            .await
            .unwrap()
            .unwrap();
        let response = parse_response(&answer).unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.json(), json!({"status": "ok"}));
    }
    drop(held);
    // And once they are gone, new connections are served again.
    wait_until("connections are served again", || async {
        get(addr, "/events").await.status == 200
    })
    .await;
    let metrics = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
    assert!(
        !metrics
            .lines()
            .any(|l| l == "meshlog_connections_refused_total 0"),
        "{metrics}"
    );
}
