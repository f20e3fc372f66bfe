//! The limits a stranger meets (`docs/SECURITY.md`, "Limits") that the
//! other suites do not already exceed: connections per client address
//! (a slow-loris client holding its share while another address pages
//! normally), the request head's size and header count, and inbound sync
//! sessions. (Bodies, slow heads and bodies, the connection limit, follow
//! subscriptions and queues are exceeded in `bad_input.rs` and
//! `follow.rs`.)

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A connection from a chosen loopback address (Linux routes all of
/// 127.0.0.0/8 to the loopback interface).
async fn connect_from(source: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind a loopback source address");
    socket.connect(addr).await.unwrap()
}

async fn read_all(stream: &mut TcpStream) -> Vec<u8> {
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer)).await;
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_loris_address_holds_only_its_share_while_another_pages() {
    let node = start_with(21, |config| {
        config.limits.connections_per_ip_max = 8;
        config.limits.connections_max = 64;
        config.limits.request_read_timeout = Duration::from_millis(800);
    })
    .await;
    let addr = node.addr;
    append(addr, b"x").await;

    // The slow-loris: as many half-sent heads as its address may hold.
    let mut loris = Vec::new();
    for _ in 0..8 {
        let mut stream = connect_from([127, 0, 0, 2], addr).await;
        stream
            .write_all(b"GET /events HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        loris.push(stream);
    }
    // One more from that address is refused at once...
    let mut ninth = connect_from([127, 0, 0, 2], addr).await;
    let _ = ninth
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let response = parse_response(&read_all(&mut ninth).await).expect("an answer");
    assert_eq!(
        (response.status, response.error()),
        (503, "too_many_connections".into())
    );
    // ...while another address pages normally.
    for _ in 0..5 {
        let mut stream = connect_from([127, 0, 0, 3], addr).await;
        stream
            .write_all(b"GET /events HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let response = parse_response(&read_all(&mut stream).await).expect("an answer");
        assert_eq!(response.status, 200);
    }
    // The held heads are cut off at the read timeout, which frees the
    // address's share.
    for stream in &mut loris {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(DEADLINE, stream.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "a slow-loris connection was never cut off");
    }
    drop(loris);
    wait_until("the address may connect again", || async {
        let mut stream = connect_from([127, 0, 0, 2], addr).await;
        let _ = stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await;
        parse_response(&read_all(&mut stream).await).is_some_and(|r| r.status == 200)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_too_large_or_with_too_many_headers_is_431() {
    let node = start_with(22, |config| {
        config.limits.header_bytes_max = 8192;
        config.limits.headers_max = 16;
    })
    .await;
    let addr = node.addr;
    let big = "b".repeat(10_000);
    let response = request(addr, "GET", "/health", &[("x-big", &big)], b"").await;
    assert_eq!(response.status, 431);
    let names: Vec<String> = (0..20).map(|i| format!("x-h{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|name| (name.as_str(), "1")).collect();
    let response = request(addr, "GET", "/health", &many, b"").await;
    assert_eq!(response.status, 431);
    // Within the limits, served.
    let response = request(addr, "GET", "/health", &[("x-small", "1")], b"").await;
    assert_eq!(response.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_sync_sessions_past_the_limit_are_503() {
    let node = start_with(23, |config| {
        config.limits.inbound_sessions_max = 2;
    })
    .await;
    let addr = node.addr;
    let upgrade = async || {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                b"GET /sync HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: meshlog-sync\r\n\r\n",
            )
            .await
            .unwrap();
        let (status, _) = read_head(&mut stream).await;
        (status, stream)
    };
    let (first, _a) = upgrade().await;
    let (second, _b) = upgrade().await;
    let (third, _c) = upgrade().await;
    assert_eq!((first, second, third), (101, 101, 503));
}
