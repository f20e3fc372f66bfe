//! Shared by the node's tests: an in-process node on a free port in a
//! scratch directory, the built `meshlog` binary as a child process, and a
//! small raw HTTP/1.1 client (so tests can also send what no real client
//! would: half a request, a hostile token, too many connections),
//! [`raw_peer::RawPeer`], a sync peer driven frame by frame, and
//! [`logged`], the log lines a closure wrote on its thread.

#![allow(dead_code)]

pub mod raw_peer;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use meshlog_cursor::StreamId;
use meshlog_node::config::NodeConfig;
use meshlog_node::Node;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any one wait in these tests may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A node in a scratch directory, with sync timings short enough for tests.
pub struct TestNode {
    pub node: Node,
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
}

impl TestNode {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Settings for a test node: free port, fast heartbeats and backoff, and
/// the stream id `stream_id`, so that assertions can name it: the data
/// directory is made a legacy one ([`legacy_dir`]), which runs unsealed.
pub fn test_config(dir: &std::path::Path, stream_id: u64) -> NodeConfig {
    legacy_dir(dir, stream_id);
    let mut config = NodeConfig::new(dir, "127.0.0.1:0");
    config.stream_id = Some(stream_id);
    config.sync.heartbeat = Duration::from_millis(50);
    config.sync.backoff_min = Duration::from_millis(20);
    config.sync.backoff_max = Duration::from_millis(400);
    config.sync.connect_timeout = Duration::from_secs(2);
    config
}

/// Makes `dir` a data directory that records `stream_id` (unless it
/// records one already), as a node from before signed streams left it: a
/// node keeps that id, which its new writer key does not derive
/// (`docs/SIGNING.md`, the upgrade policy). A new directory without it
/// writes the stream its key derives.
pub fn legacy_dir(dir: &std::path::Path, stream_id: u64) {
    std::fs::create_dir_all(dir).expect("the data directory");
    let file = dir.join("stream-id");
    if !file.exists() {
        std::fs::write(file, format!("{stream_id}\n")).expect("the stream-id file");
    }
}

pub async fn start(stream_id: u64) -> TestNode {
    start_with(stream_id, |_| {}).await
}

pub async fn start_with(stream_id: u64, tweak: impl FnOnce(&mut NodeConfig)) -> TestNode {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let mut config = test_config(dir.path(), stream_id);
    tweak(&mut config);
    let node = Node::start(config).await.expect("the node starts");
    let addr = node.local_addr();
    TestNode { node, addr, dir }
}

/// An HTTP response, read whole.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "status {}: body is not JSON ({error}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The `error` code of a JSON error body.
    pub fn error(&self) -> String {
        self.json()["error"].as_str().unwrap_or("").to_owned()
    }
}

/// One request on a fresh connection (`Connection: close`), read to the end.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut raw = head.into_bytes();
    raw.extend_from_slice(body);
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(&raw).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within {DEADLINE:?}"))
        .unwrap_or_else(|error| panic!("{method} {path}: {error}"));
    parse_response(&answer).unwrap_or_else(|| {
        panic!(
            "{method} {path}: not an HTTP response: {:?}",
            String::from_utf8_lossy(&answer)
        )
    })
}

/// Reads a response head byte by byte, so that nothing past it (an
/// upgraded protocol's first bytes) is consumed: its status (0 if none
/// arrived) and its text.
pub async fn read_head(stream: &mut TcpStream) -> (u16, String) {
    let mut raw = Vec::new();
    while !raw.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        raw.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// Parses a whole HTTP/1.1 response (content-length or chunked body).
pub fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        let mut body = Vec::new();
        let mut rest = rest;
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).ok()?.trim(), 16)
                    .ok()?;
            rest = &rest[line_end + 2..];
            if size == 0 {
                break;
            }
            body.extend_from_slice(rest.get(..size)?);
            rest = rest.get(size + 2..)?;
        }
        body
    } else {
        rest.to_vec()
    };
    Some(Response {
        status,
        headers,
        body,
    })
}

pub async fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, &[], b"").await
}

pub async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Response {
    request(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .await
}

/// Appends one raw payload; returns its seq.
pub async fn append(addr: SocketAddr, payload: &[u8]) -> u64 {
    let response = request(addr, "POST", "/events", &[], payload).await;
    assert_eq!(
        response.status,
        201,
        "{:?}",
        String::from_utf8_lossy(&response.body)
    );
    response.json()["events"][0]["seq"].as_u64().expect("a seq")
}

/// Every event the node holds, walked with pages of `limit`.
pub async fn walk(addr: SocketAddr, limit: usize) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = String::new();
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < DEADLINE,
            "the walk did not reach the head"
        );
        let response = get(addr, &format!("/events?after={after}&limit={limit}")).await;
        assert_eq!(
            response.status,
            200,
            "{:?}",
            String::from_utf8_lossy(&response.body)
        );
        let page = response.json();
        events.extend(page["events"].as_array().unwrap().iter().cloned());
        after = page["next"].as_str().unwrap().to_owned();
        if page["at_head"].as_bool().unwrap() {
            return events;
        }
    }
}

/// `GET /marks` as JSON.
pub async fn marks(addr: SocketAddr) -> Value {
    let response = get(addr, "/marks").await;
    assert_eq!(response.status, 200);
    response.json()
}

/// A counter's (or gauge's) value in `GET /metrics`, by its full name
/// (`meshlog_pages_total`); fails if the node does not export it.
pub async fn counter(addr: SocketAddr, name: &str) -> u64 {
    let text = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} in {text}"))
        .parse()
        .unwrap()
}

/// Waits, polling, until `check` holds; fails after [`DEADLINE`].
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The writers a [`checkpointed_dir`] holds besides its own stream.
pub const WRITERS: std::ops::RangeInclusive<u64> = 100..=159;

/// One event at `seq` on each of `writers`.
pub fn writers_at(writers: impl Iterator<Item = u64>, seq: u64) -> meshlog_replica::Delta {
    let events = writers
        .map(|s| meshlog_replica::Event {
            stream: StreamId::new(s),
            seq,
            lamport: seq * 1_000 + s,
            time_ms: 0,
            payload: bytes::Bytes::from(format!("w{s}-{seq}")),
        })
        .collect();
    meshlog_replica::Delta {
        events,
        ..meshlog_replica::Delta::default()
    }
}

/// Writes a data directory for stream 1 before its node starts (a legacy
/// directory, as [`legacy_dir`] makes): three events on each of
/// [`WRITERS`], a checkpoint minted from those marks, then a fourth event
/// on five of them; so its node's head token is version 2 relative to
/// that checkpoint, which no other node keeps (issue 27). The checkpoint.
pub fn checkpointed_dir(dir: &std::path::Path) -> meshlog_cursor::Checkpoint {
    legacy_dir(dir, 1);
    let store = meshlog_replica::DiskStore::open(dir).expect("a's store");
    let mut replica =
        meshlog_replica::Replica::open(meshlog_replica::Config::new(StreamId::new(1)), store)
            .expect("a's replica");
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

/// A node in `dir` with checkpoint gossip off (so it neither mints nor
/// sends checkpoints: a peer learns one only by asking), waiting at most
/// `fetch_ms` for a checkpoint it fetches.
pub async fn node_in(
    dir: tempfile::TempDir,
    stream: u64,
    peers: Vec<String>,
    fetch_ms: u64,
) -> TestNode {
    let mut config = test_config(dir.path(), stream);
    config.sync.checkpoints = false;
    config.sync.checkpoint_fetch = Duration::from_millis(fetch_ms);
    config.peers = peers;
    let node = Node::start(config).await.expect("the node starts");
    let addr = node.local_addr();
    TestNode { node, addr, dir }
}

thread_local! {
    /// The log lines this thread wrote while [`logged`] captured them.
    static CAPTURED: std::cell::RefCell<Option<Vec<u8>>> = const { std::cell::RefCell::new(None) };
}

/// Writes a log line into this thread's capture, when one is on.
struct Captured;

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURED.with(|captured| {
            if let Some(lines) = captured.borrow_mut().as_mut() {
                lines.extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The log lines `f` writes on this thread. One global subscriber for the
/// whole test binary, each thread capturing its own lines: a scoped
/// subscriber (`with_default`) misses lines whenever a test on another
/// thread first reaches a log call site with no subscriber (tracing caches
/// that call site's interest as "never"), which made this test flaky when
/// the binary's tests ran side by side.
pub fn logged(f: impl FnOnce()) -> String {
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        tracing_subscriber::fmt()
            .with_writer(|| Captured)
            .with_ansi(false)
            .init();
    });
    CAPTURED.with(|captured| *captured.borrow_mut() = Some(Vec::new()));
    f();
    let bytes = CAPTURED.with(|captured| captured.borrow_mut().take().unwrap_or_default());
    String::from_utf8(bytes).unwrap()
}
