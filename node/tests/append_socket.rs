//! `GET /events/append`: appends streamed over a WebSocket.
//!
//! - The node's first message names the stream, once; the answers after
//!   it carry only ranges.
//! - Pipelined (seeded): many messages sent before any answer is read,
//!   single events (binary) and batches (text), are answered in order,
//!   each by the range its events took, and `GET /events` pages exactly
//!   those events afterwards.
//! - Idle: a socket on which the client sends nothing for
//!   `append_idle_timeout` is closed, the close naming why.
//! - Auth: the upgrade needs the write secret, as `POST /events` does.
//! - Bad input: a batch that is not JSON, a payload over the limit, and a
//!   message over `body_bytes_max` (refused from its header) are each
//!   answered by the API's error body, then a close naming the code;
//!   what came before the bad message is answered first.
//! - A client that vanishes mid-flight: every acknowledged event is in the
//!   data directory when the node is reopened on it.

mod support;

use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use meshlog_node::config::NodeConfig;
use meshlog_testkit::rng::SplitMix64;
use meshlog_testkit::seed;
use serde_json::Value;
use support::{start, start_with, walk, DEADLINE};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A socket of appends to the node at `addr`, whose first message (read
/// here) names its stream, `stream`.
async fn connect(addr: SocketAddr, stream: &str) -> Socket {
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/events/append"))
        .await
        .expect("the upgrade succeeds");
    assert_eq!(
        next_json(&mut socket).await,
        serde_json::json!({ "stream": stream })
    );
    socket
}

/// The next message the node sends, pings skipped.
async fn next_message(socket: &mut Socket) -> Option<Message> {
    loop {
        let message = tokio::time::timeout(DEADLINE, socket.next())
            .await
            .expect("a message within the deadline")?;
        match message {
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(message) => return Some(message),
            Err(_) => return None,
        }
    }
}

async fn next_json(socket: &mut Socket) -> Value {
    match next_message(socket).await {
        Some(Message::Text(text)) => serde_json::from_str(text.as_str()).expect("JSON"),
        other => panic!("expected a text message, got {other:?}"),
    }
}

/// The close the node ends with: its code and reason.
async fn next_close(socket: &mut Socket) -> (CloseCode, String) {
    match next_message(socket).await {
        Some(Message::Close(Some(frame))) => (frame.code, frame.reason.as_str().to_owned()),
        other => panic!("expected a close, got {other:?}"),
    }
}

/// A random payload: text, bytes that are not UTF-8, or empty.
fn payload(rng: &mut SplitMix64) -> Vec<u8> {
    match rng.below(4) {
        0 => Vec::new(),
        1 => {
            let mut bytes: Vec<u8> = (0..rng.between(1, 40))
                .map(|_| rng.below(256) as u8)
                .collect();
            bytes[0] = 0xff;
            bytes
        }
        _ => (0..rng.between(1, 30))
            .map(|_| b"ab\"\\\n {}"[rng.below(8) as usize])
            .collect(),
    }
}

/// A batch message: the JSON `POST /events` takes, strings or base64.
fn batch_text(payloads: &[Vec<u8>]) -> String {
    use base64::Engine as _;
    let elements: Vec<Value> = payloads
        .iter()
        .map(|payload| match std::str::from_utf8(payload) {
            Ok(text) => Value::String(text.to_owned()),
            Err(_) => serde_json::json!({
                "payload_base64": base64::engine::general_purpose::STANDARD.encode(payload)
            }),
        })
        .collect();
    Value::Array(elements).to_string()
}

/// The payload of a paged event.
fn payload_of(event: &Value) -> Vec<u8> {
    use base64::Engine as _;
    match (event["payload"].as_str(), event["payload_base64"].as_str()) {
        (Some(text), None) => text.as_bytes().to_vec(),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
        _ => panic!("an event without one payload: {event}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelined_appends_are_acknowledged_in_order_by_range_and_paged_after() {
    let seed = seed::replay_or(0x5eed_0030);
    let _report = seed::Report::new(
        "pipelined_appends_are_acknowledged_in_order_by_range_and_paged_after",
        seed,
    );
    let mut rng = SplitMix64::new(seed);
    let node = start(7).await;
    let socket = connect(node.addr, "7").await;
    // More messages than the node reads ahead, all sent before any answer
    // is read: the backpressure holds the rest in the socket.
    let messages_len = meshlog_node::http::APPENDS_IN_FLIGHT_MAX * 3;
    let sent: Vec<Vec<Vec<u8>>> = (0..messages_len)
        .map(|_| {
            if rng.chance(0.6) {
                vec![payload(&mut rng)]
            } else {
                (0..rng.below(6)).map(|_| payload(&mut rng)).collect()
            }
        })
        .collect();
    let sender = sent.clone();
    let singles: Vec<bool> = sender.iter().map(|b| b.len() == 1).collect();
    let (mut sink, mut source) = socket.split();
    let writing = tokio::spawn(async move {
        for (batch, single) in sender.into_iter().zip(singles) {
            let message = if single {
                Message::Binary(Bytes::from(batch[0].clone()))
            } else {
                Message::Text(batch_text(&batch).into())
            };
            sink.send(message).await.unwrap();
        }
        sink
    });
    let mut seq_next = 1u64;
    let mut lamport_last = 0u64;
    for (index, batch) in sent.iter().enumerate() {
        let text = match tokio::time::timeout(DEADLINE, source.next()).await {
            Ok(Some(Ok(Message::Text(text)))) => text,
            other => panic!("answer {index}: {other:?}"),
        };
        let answer: Value = serde_json::from_str(text.as_str()).unwrap();
        // The stream was named once, by the first message.
        let keys: Vec<&String> = answer.as_object().expect("an object").keys().collect();
        if batch.is_empty() {
            assert!(keys.is_empty(), "answer {index}: {answer}");
            continue;
        }
        assert_eq!(keys, ["lamport", "seq"], "answer {index}: {answer}");
        let last = seq_next + batch.len() as u64 - 1;
        assert_eq!(
            answer["seq"],
            serde_json::json!([seq_next, last]),
            "answer {index}"
        );
        let range = |at: usize| answer["lamport"][at].as_u64().expect("a lamport range");
        let (lamport_first, lamport_end) = (range(0), range(1));
        assert!(lamport_first > lamport_last, "answer {index}: lamport fell");
        assert_eq!(
            lamport_end - lamport_first,
            last - seq_next,
            "answer {index}"
        );
        lamport_last = lamport_end;
        seq_next = last + 1;
    }
    let mut sink = writing.await.unwrap();
    sink.send(Message::Close(None)).await.unwrap();

    let expected: Vec<Vec<u8>> = sent.into_iter().flatten().collect();
    let events = walk(node.addr, 97).await;
    assert_eq!(events.len(), expected.len());
    for (index, (event, payload)) in events.iter().zip(&expected).enumerate() {
        assert_eq!(event["seq"], index as u64 + 1);
        assert_eq!(&payload_of(event), payload, "event {index}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_append_socket_needs_the_write_secret() {
    let node = start_with(1, |config: &mut NodeConfig| {
        config.security.secrets.read = vec!["read-secret-0123456789abcdef".into()];
        config.security.secrets.write = vec!["write-secret-0123456789abcdef".into()];
    })
    .await;
    let status = |secret: Option<&str>| {
        let mut request = format!("ws://{}/events/append", node.addr)
            .into_client_request()
            .unwrap();
        if let Some(secret) = secret {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {secret}").parse().unwrap());
        }
        async move {
            match tokio_tungstenite::connect_async(request).await {
                Ok((mut socket, response)) => {
                    assert_eq!(next_json(&mut socket).await["stream"], "1");
                    socket
                        .send(Message::Binary(Bytes::from_static(b"x")))
                        .await
                        .unwrap();
                    let answer = next_json(&mut socket).await;
                    assert_eq!(answer["seq"], serde_json::json!([1, 1]));
                    response.status().as_u16()
                }
                Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                    response.status().as_u16()
                }
                Err(error) => panic!("{error}"),
            }
        }
    };
    assert_eq!(status(None).await, 401);
    assert_eq!(status(Some("wrong-secret-0123456789abcdef")).await, 401);
    assert_eq!(status(Some("read-secret-0123456789abcdef")).await, 403);
    assert_eq!(status(Some("write-secret-0123456789abcdef")).await, 101);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_that_is_not_json_is_answered_by_an_error_then_a_close() {
    let node = start(1).await;
    let mut socket = connect(node.addr, "1").await;
    socket
        .send(Message::Binary(Bytes::from_static(b"kept")))
        .await
        .unwrap();
    socket.send(Message::Text("not json".into())).await.unwrap();
    assert_eq!(
        next_json(&mut socket).await["seq"],
        serde_json::json!([1, 1])
    );
    // The answer docs/HTTP.md shows.
    let error = next_json(&mut socket).await;
    assert_eq!(
        error.to_string(),
        r#"{"error":"bad_body","message":"expected a JSON array of strings or {\"payload\"} / {\"payload_base64\"} objects: expected ident at line 1 column 2"}"#
    );
    assert_eq!(
        next_close(&mut socket).await,
        (CloseCode::Policy, "bad_body".to_owned())
    );
    let events = walk(node.addr, 10).await;
    assert_eq!(events.len(), 1, "only the good message was appended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payload_over_the_limit_is_answered_by_an_error_then_a_close() {
    let node = start_with(1, |config: &mut NodeConfig| {
        config.limits.payload_bytes_max = 64;
    })
    .await;
    let mut socket = connect(node.addr, "1").await;
    // In a batch, the second element is over: nothing of it is appended.
    let batch = batch_text(&[b"fits".to_vec(), vec![b'x'; 65]]);
    socket.send(Message::Text(batch.into())).await.unwrap();
    let error = next_json(&mut socket).await;
    assert_eq!(error["error"], "payload_too_large", "{error}");
    assert_eq!(error["limit"], 64, "{error}");
    assert_eq!(
        next_close(&mut socket).await,
        (CloseCode::Policy, "payload_too_large".to_owned())
    );
    assert!(walk(node.addr, 10).await.is_empty());
}

/// A message whose header declares more than `body_bytes_max` is refused
/// from the header: its payload is never sent, so the node must not wait
/// for it (nor allocate it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_over_the_frame_limit_is_refused_from_its_header() {
    let node = start(1).await;
    let limit = meshlog_node::config::Limits::default().body_bytes_max;
    let mut socket = connect(node.addr, "1").await;
    // A masked binary frame header: FIN + binary, 127 = a 64-bit length,
    // then the mask key; no payload follows.
    let mut header = vec![0x82, 0x80 | 127];
    header.extend_from_slice(&(limit as u64 + 1).to_be_bytes());
    header.extend_from_slice(&[1, 2, 3, 4]);
    match socket.get_mut() {
        tokio_tungstenite::MaybeTlsStream::Plain(tcp) => tcp.write_all(&header).await.unwrap(),
        _ => unreachable!("plain TCP"),
    }
    let error = next_json(&mut socket).await;
    assert_eq!(error["error"], "message_too_large", "{error}");
    assert_eq!(error["limit"], limit as u64, "{error}");
    assert_eq!(
        next_close(&mut socket).await,
        (CloseCode::Size, "message_too_large".to_owned())
    );
}

/// A client that sends nothing for `append_idle_timeout` is closed with a
/// close naming why, after the answers of what it sent before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_socket_is_closed_with_a_close_naming_why() {
    let node = start_with(1, |config: &mut NodeConfig| {
        config.limits.append_idle_timeout = std::time::Duration::from_millis(50);
    })
    .await;
    let mut socket = connect(node.addr, "1").await;
    socket
        .send(Message::Binary(Bytes::from_static(b"before")))
        .await
        .unwrap();
    assert_eq!(
        next_json(&mut socket).await,
        serde_json::json!({ "seq": [1, 1], "lamport": [1, 1] })
    );
    assert_eq!(
        next_close(&mut socket).await,
        (CloseCode::Away, "idle_timeout".to_owned())
    );
    assert_eq!(walk(node.addr, 10).await.len(), 1);
}

/// A client that sends many appends and vanishes after reading some of the
/// answers: what it was told is durable is in the data directory when the
/// node is reopened on it, and the log there has no hole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn what_was_acknowledged_survives_a_client_that_vanishes() {
    let seed = seed::replay_or(0x5eed_0031);
    let _report = seed::Report::new(
        "what_was_acknowledged_survives_a_client_that_vanishes",
        seed,
    );
    let mut rng = SplitMix64::new(seed);
    let node = start(3).await;
    let mut socket = connect(node.addr, "3").await;
    let sent_len = rng.between(20, 200) as usize;
    let read_len = rng.below(sent_len as u64) as usize;
    for index in 0..sent_len {
        let payload = format!("event {index}");
        socket
            .send(Message::Binary(Bytes::from(payload)))
            .await
            .unwrap();
    }
    let mut acknowledged = 0;
    for _ in 0..read_len {
        let answer = next_json(&mut socket).await;
        acknowledged = answer["seq"][1].as_u64().unwrap();
    }
    // Gone without a close.
    drop(socket);
    let dir = node.dir;
    node.node.shutdown();
    tokio::time::timeout(DEADLINE, node.node.stopped())
        .await
        .unwrap();

    let config = support::test_config(dir.path(), 3);
    let reopened = meshlog_node::Node::start(config).await.expect("it reopens");
    let events = walk(reopened.local_addr(), 50).await;
    assert!(
        events.len() as u64 >= acknowledged,
        "{} events held, {acknowledged} acknowledged",
        events.len()
    );
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event["seq"], index as u64 + 1);
        assert_eq!(event["payload"], format!("event {index}"));
    }
    reopened.shutdown();
    reopened.stopped().await;
}
