//! Live follow, fanned out: one node, 1, 100 and 1,000 followers, beside
//! Redis Streams readers (`XREAD BLOCK`) and NATS JetStream push consumers,
//! in one run (issue 9's benchmark).
//!
//! One appender writes single events at a fixed rate and waits for each
//! acknowledgement (durable for meshlog and Redis, as in the node bench);
//! it notes when it sent each append and when the acknowledgement came,
//! and each payload carries the event's number. Every follower notes when
//! it receives each event. Reported over all (event, follower) deliveries,
//! p50, p99 and max of two latencies:
//!
//! - commit → follower, the figure: receipt minus the append's
//!   acknowledgement. The acknowledgement is the appender's view of the
//!   commit; a follower may be pushed the event before the appender reads
//!   its answer, and such a delivery counts as 0.
//! - send → follower: receipt minus the append's send, so the commit's
//!   own time (an fsync for meshlog and Redis) is included.
//!
//! Each server runs in a process of its own, so that its CPU time
//! (`utime + stime` from `/proc/<pid>/stat`, over the timed window) is
//! the server's alone, divided by the deliveries it made: node CPU per
//! delivered event. The meshlog node is this bench's own binary started
//! again as `meshlog serve` would run (`meshlog_node::run`), so it needs
//! no separate build; Redis and NATS are installed from Debian's packages
//! by `benches/peers.sh` when missing and started in temp directories.
//! The followers and the appender are in this process, on one runtime.
//!
//! Followers are what a user would run: meshlog's `Follower` client over
//! `GET /follow` (a WebSocket each, with its gap checks); per Redis
//! reader, a connection looping `XREAD BLOCK`; per NATS follower, a
//! connection with its own push consumer (no acks). Every follower starts
//! at the head; warm-up events are appended until each has received one,
//! and only the events appended after that are timed.
//!
//! Run: `cargo bench -p meshlog-bench --bench follow`. Environment:
//! `MESHLOG_BENCH_FOLLOWERS` follower counts (default `1,100,1000`, each
//! at most 2,000), `MESHLOG_BENCH_RATE` appends per second (default 50),
//! `MESHLOG_BENCH_SECONDS` the timed window per run (default 4),
//! `MESHLOG_BENCH_SYSTEMS` which systems (default `meshlog,redis,nats`),
//! `MESHLOG_BENCH_ROUNDS` times the whole sequence runs (default 1; the
//! goals are judged on the medians).
//! Figures are recorded in docs/BENCHMARKS.md ("Live follow, fanned out").

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures_util::StreamExt;
use meshlog_node::follow::{FollowItem, FollowStream, Follower, FollowerConfig};

use common::{
    env_counts, env_number, find_binary, install_peers, machine, nats_footnote, nats_note,
    print_systems, start_each, start_nats, start_redis, systems_from_env, timed, until_interrupted,
    version_of, wait_ready, Client, Http, Kind, Result, ServerProcess, PAYLOAD_BYTES,
    REQUEST_TIMEOUT, STARTUP_TIMEOUT,
};

/// The most followers one run may ask for; the node is configured for
/// twice as many subscriptions and connections.
const FOLLOWERS_MAX: usize = 2_000;
/// The goal's follower count and its p99 bound.
const GOAL_FOLLOWERS: usize = 1_000;
const GOAL_P99_MS: f64 = 5.0;
/// How long warm-up may take until every follower has an event.
const WARMUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Warm-up appends are this far apart.
const WARMUP_INTERVAL: Duration = Duration::from_millis(20);
/// After the last timed append, how long deliveries may still arrive.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Set in the environment of the child that runs the meshlog node: the
/// directory holding its `data/` and `node.toml`.
const NODE_ENV: &str = "MESHLOG_BENCH_FOLLOW_NODE";

struct Settings {
    followers: Vec<usize>,
    /// Times the whole sequence runs; the goals take each figure's median.
    rounds: usize,
    rate: u64,
    seconds: u64,
    systems: Vec<Kind>,
}

fn settings() -> Settings {
    let followers = env_counts("MESHLOG_BENCH_FOLLOWERS", FOLLOWERS_MAX, &[1, 100, 1_000]);
    Settings {
        followers,
        rounds: env_number("MESHLOG_BENCH_ROUNDS", 1).clamp(1, 20) as usize,
        rate: env_number("MESHLOG_BENCH_RATE", 50).clamp(1, 10_000),
        seconds: env_number("MESHLOG_BENCH_SECONDS", 4).clamp(1, 600),
        systems: systems_from_env(),
    }
}

/// The clock every send and receipt is read from (one process, so one
/// monotonic clock), in nanoseconds.
fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A 100-byte ASCII payload: `w` (warm-up) or `m` (timed), the event's
/// number (timed events count from 0), then padding.
fn payload(timed: bool, n: u64) -> Bytes {
    let flag = if timed { 'm' } else { 'w' };
    let mut bytes = format!("{flag} {n:010} ").into_bytes();
    bytes.resize(PAYLOAD_BYTES, b'.');
    Bytes::from(bytes)
}

/// `Some(n)` for timed event `n`, `None` for a warm-up event.
fn parse_payload(bytes: &[u8]) -> Result<Option<usize>> {
    let text = std::str::from_utf8(bytes)?;
    let mut words = text.split(' ');
    let timed = match words.next() {
        Some("m") => true,
        Some("w") => false,
        _ => return Err(format!("not a bench payload: {text:?}").into()),
    };
    let n = words.next().ok_or("a payload without a number")?.parse()?;
    Ok(timed.then_some(n))
}

// ---------------------------------------------------------------------------
// Servers.

/// One system under test, running in its own process.
struct System {
    kind: Kind,
    addr: SocketAddr,
    /// Shown in the report: the version and the durability it has.
    note: String,
    process: ServerProcess,
}

/// The child's side: runs the node as `meshlog serve --data DIR/data
/// --listen 127.0.0.1:0 --config DIR/node.toml` would, printing
/// `listening on ADDR`, until it is killed.
fn run_node(dir: PathBuf) -> ExitCode {
    use clap::Parser;
    let (data, config) = (dir.join("data"), dir.join("node.toml"));
    meshlog_node::run(meshlog_node::Cli::parse_from([
        "meshlog".as_ref(),
        "serve".as_ref(),
        "--data".as_ref(),
        data.as_os_str(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
    ]
        as [&std::ffi::OsStr; 8]))
}

/// Starts the meshlog node in a child process (this binary again, with
/// [`NODE_ENV`] set) and reads the address it prints.
fn start_meshlog() -> Result<(ServerProcess, SocketAddr)> {
    let dir = tempfile::Builder::new()
        .prefix("meshlog-bench-follow-node-")
        .tempdir()?;
    // Room for every follower's connection and subscription, twice over:
    // a run's followers may still be closing when the next run's connect.
    let room = 2 * FOLLOWERS_MAX + 64;
    std::fs::write(
        dir.path().join("node.toml"),
        // Every follower connects from 127.0.0.1: the per-address share
        // must hold them all too.
        format!(
            "connections_max = {room}\nconnections_per_ip_max = {room}\nfollowers_max = {room}\n"
        ),
    )?;
    let log = dir.path().join("node.log");
    let mut child = Command::new(std::env::current_exe()?)
        .env(NODE_ENV, dir.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let stdout = child.stdout.take().expect("a piped stdout");
    let mut server = ServerProcess {
        name: "meshlog node",
        child,
        _dir: dir,
        log,
    };
    // The node prints one line; the reader keeps the pipe open after it.
    let (lines, line) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for text in std::io::BufReader::new(stdout).lines() {
            let Ok(text) = text else { break };
            let _ = lines.send(text);
        }
    });
    let addr = match line.recv_timeout(STARTUP_TIMEOUT) {
        Ok(text) => text
            .strip_prefix("listening on ")
            .and_then(|addr| addr.trim().parse().ok())
            .ok_or_else(|| format!("the node printed {text:?}, not `listening on ADDR`"))?,
        Err(_) => {
            server.check_running()?;
            return Err("the node printed no address within the startup timeout".into());
        }
    };
    Ok((server, addr))
}

fn start(kind: Kind, runtime: &tokio::runtime::Runtime) -> Result<System> {
    let (mut process, addr, note) = match kind {
        Kind::Meshlog => {
            let (process, addr) = start_meshlog()?;
            let note = "meshlog node (own process, `meshlog serve` defaults but connection limits): durable commit (redb, fdatasync) before the ack and before followers see an event".to_owned();
            (process, addr, note)
        }
        Kind::Redis => {
            let binary = find_binary("redis-server").ok_or("redis-server is not installed")?;
            let (process, port) = start_redis()?;
            let note = format!(
                "{}: --appendonly yes --appendfsync always; readers are answered after the fsync",
                version_of(&binary)
            );
            (process, SocketAddr::from(([127, 0, 0, 1], port)), note)
        }
        Kind::Nats => {
            let (process, port) = start_nats()?;
            let note = nats_note();
            (process, SocketAddr::from(([127, 0, 0, 1], port)), note)
        }
    };
    runtime.block_on(wait_ready(kind, addr, Some(&mut process)))?;
    Ok(System {
        kind,
        addr,
        note,
        process,
    })
}

/// A process's CPU time so far (user + system, all threads), in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    static TICKS_PER_S: OnceLock<f64> = OnceLock::new();
    let ticks_per_s = *TICKS_PER_S.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').ok_or("a /proc stat without a name")? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).ok_or("no utime")?.parse()?;
    let stime: f64 = fields.get(12).ok_or("no stime")?.parse()?;
    Ok((utime + stime) / ticks_per_s)
}

/// This process's open-file limit, so that a run that cannot open its
/// followers' sockets says why before it starts.
fn open_files_max() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

// ---------------------------------------------------------------------------
// Followers.

/// What every follower of a run shares.
#[derive(Default)]
struct Tally {
    /// Followers that have received their first event.
    ready: AtomicUsize,
    /// Timed deliveries so far, over all followers.
    delivered: AtomicU64,
    /// meshlog's follower: gaps refetched and lagged reports.
    refetched: AtomicU64,
    lagged: AtomicU64,
}

/// One follower's receipts: each timed event's number and when it
/// arrived ([`now_ns`]).
struct Receipts {
    tally: Arc<Tally>,
    received: Vec<(usize, u64)>,
    seen_any: bool,
}

impl Receipts {
    fn new(tally: Arc<Tally>) -> Receipts {
        Receipts {
            tally,
            received: Vec::new(),
            seen_any: false,
        }
    }

    fn receive(&mut self, payload: &[u8]) -> Result<()> {
        let received_ns = now_ns();
        let timed = parse_payload(payload)?;
        if !self.seen_any {
            self.seen_any = true;
            self.tally.ready.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(n) = timed {
            self.received.push((n, received_ns));
            self.tally.delivered.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Where one run's events go: the node's log, a Redis key, a JetStream
/// stream's subject.
struct Target {
    redis_key: String,
    nats_stream: String,
    nats_subject: String,
}

impl Target {
    fn for_run(followers: usize) -> Target {
        Target {
            redis_key: format!("follow-{followers}"),
            nats_stream: format!("FOLLOW_{followers}"),
            nats_subject: format!("follow.{followers}"),
        }
    }
}

/// A connected follower, not yet reading.
enum Reader {
    Meshlog(Follower),
    Redis(redis::aio::MultiplexedConnection),
    Nats(async_nats::Client, Box<jetstream::consumer::push::Messages>),
}

/// Connects one follower at the head of the run's log.
async fn connect_reader(system: &System, target: &Target, head: &Head) -> Result<Reader> {
    match (system.kind, head) {
        (Kind::Meshlog, Head::Meshlog(after)) => {
            let mut config =
                FollowerConfig::new(vec![format!("http://{}", system.addr)], FollowStream::All);
            config.after = after.clone();
            Ok(Reader::Meshlog(Follower::start(config)?))
        }
        (Kind::Redis, _) => {
            let client = redis::Client::open(format!("redis://{}/", system.addr))?;
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(REQUEST_TIMEOUT))
                .set_response_timeout(Some(REQUEST_TIMEOUT));
            let connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok(Reader::Redis(connection))
        }
        (Kind::Nats, _) => {
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(REQUEST_TIMEOUT)
                .request_timeout(Some(REQUEST_TIMEOUT))
                .connect(system.addr.to_string())
                .await?;
            let context = jetstream::ContextBuilder::new()
                .timeout(REQUEST_TIMEOUT)
                .build(client.clone());
            let stream = context.get_stream(&target.nats_stream).await?;
            let consumer = stream
                .create_consumer(jetstream::consumer::push::Config {
                    deliver_subject: client.new_inbox(),
                    deliver_policy: jetstream::consumer::DeliverPolicy::New,
                    ack_policy: jetstream::consumer::AckPolicy::None,
                    ..Default::default()
                })
                .await?;
            let messages = consumer.messages().await?;
            Ok(Reader::Nats(client, Box::new(messages)))
        }
        (Kind::Meshlog, Head::Other) => Err("meshlog needs its head".into()),
    }
}

/// Reads until `stop`; returns the follower's receipts.
async fn follow(
    reader: Reader,
    target: Arc<Target>,
    mut receipts: Receipts,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Receipts> {
    match reader {
        Reader::Meshlog(mut follower) => loop {
            let item = tokio::select! {
                _ = stop.changed() => break,
                item = follower.next() => item,
            };
            match item.ok_or("the follower ended")? {
                FollowItem::Event(event) => {
                    let text = event.payload.ok_or("a payload that is not UTF-8")?;
                    receipts.receive(text.as_bytes())?;
                }
                FollowItem::Refetched { .. } => {
                    receipts.tally.refetched.fetch_add(1, Ordering::SeqCst);
                }
                FollowItem::Lagged { .. } => {
                    receipts.tally.lagged.fetch_add(1, Ordering::SeqCst);
                }
                FollowItem::Stale { .. } => return Err("the follower went stale".into()),
                FollowItem::Connected { .. } | FollowItem::Status(_) => {}
            }
        },
        Reader::Redis(mut connection) => {
            // Entries past `last`: the stream was empty when the run began.
            let mut last = "0-0".to_owned();
            loop {
                let mut command = redis::cmd("XREAD");
                command
                    .arg("COUNT")
                    .arg(1_000)
                    .arg("BLOCK")
                    .arg(1_000)
                    .arg("STREAMS")
                    .arg(&target.redis_key)
                    .arg(&last);
                let read = command
                    .query_async::<Option<Vec<(String, Vec<(String, Vec<Vec<u8>>)>)>>>(
                        &mut connection,
                    );
                let reply = tokio::select! {
                    _ = stop.changed() => break,
                    reply = read => reply?,
                };
                for (_, entries) in reply.unwrap_or_default() {
                    for (id, fields) in entries {
                        receipts.receive(fields.get(1).ok_or("an entry without payload")?)?;
                        last = id;
                    }
                }
            }
        }
        Reader::Nats(client, mut messages) => {
            loop {
                let message = tokio::select! {
                    _ = stop.changed() => break,
                    message = messages.next() => message,
                };
                let message = message.ok_or("the push consumer ended")??;
                receipts.receive(&message.payload)?;
            }
            drop(messages);
            let _ = client.drain().await;
        }
    }
    Ok(receipts)
}

/// Where followers start: meshlog's current marks (a cursor); the peers'
/// logs are new and empty at the start of each run.
enum Head {
    Meshlog(meshlog_cursor::VersionVector),
    Other,
}

async fn head(system: &System, target: &Target) -> Result<Head> {
    match system.kind {
        Kind::Meshlog => {
            let mut http = Http::connect(system.addr).await?;
            let (status, body) = http
                .request(hyper::Method::GET, "/marks", None, Bytes::new())
                .await?;
            if status != hyper::StatusCode::OK {
                return Err(format!("GET /marks answered {status}").into());
            }
            let marks: serde_json::Value = serde_json::from_slice(&body)?;
            let token = marks["token"].as_str().ok_or("marks without a token")?;
            Ok(Head::Meshlog(meshlog_cursor::token::decode_text(token)?))
        }
        Kind::Redis => {
            let mut client = Client::connect(system.kind, system.addr).await?;
            if let Client::Redis(connection) = &mut client {
                let _: i64 = redis::cmd("DEL")
                    .arg(&target.redis_key)
                    .query_async(connection)
                    .await?;
            }
            Ok(Head::Other)
        }
        Kind::Nats => {
            let client = Client::connect(system.kind, system.addr).await?;
            if let Client::Nats(nats) = &client {
                let _ = nats.context.delete_stream(&target.nats_stream).await;
                nats.context
                    .create_stream(jetstream::stream::Config {
                        name: target.nats_stream.clone(),
                        subjects: vec![target.nats_subject.clone()],
                        storage: jetstream::stream::StorageType::File,
                        num_replicas: 1,
                        ..Default::default()
                    })
                    .await?;
            }
            client.close().await;
            Ok(Head::Other)
        }
    }
}

// ---------------------------------------------------------------------------
// One run: a system, a follower count.

struct Figures {
    deliveries: u64,
    expected: u64,
    /// From the append's acknowledgement (the commit, as the appender
    /// learns it) to each follower's receipt; a follower that beat the
    /// acknowledgement counts as 0.
    committed: Quantiles,
    /// From the append's send to each follower's receipt: the commit's
    /// own time included.
    sent: Quantiles,
    append_p50_ms: f64,
    cpu_us_per_delivery: f64,
    /// The server's CPU over the timed window, in cores.
    cpu_cores: f64,
    /// The followers' side (this process) over the window, in cores.
    client_cores: f64,
    refetched: u64,
    lagged: u64,
}

fn quantile_ms(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted_ns.len() as f64 * q) as usize).min(sorted_ns.len() - 1);
    sorted_ns[index] as f64 / 1e6
}

/// p50, p99 and max of a set of latencies, in milliseconds.
#[derive(Clone, Copy)]
struct Quantiles {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Quantiles {
    fn of(mut latencies_ns: Vec<u64>) -> Quantiles {
        latencies_ns.sort_unstable();
        Quantiles {
            p50_ms: quantile_ms(&latencies_ns, 0.50),
            p99_ms: quantile_ms(&latencies_ns, 0.99),
            max_ms: quantile_ms(&latencies_ns, 1.0),
        }
    }
}

async fn fan_out_run(system: &System, followers: usize, settings: &Settings) -> Result<Figures> {
    let target = Arc::new(Target::for_run(followers));
    let head = timed("the head", REQUEST_TIMEOUT, head(system, &target)).await?;
    let tally = Arc::new(Tally::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::with_capacity(followers);
    for _ in 0..followers {
        let reader = timed(
            "connecting a follower",
            REQUEST_TIMEOUT,
            connect_reader(system, &target, &head),
        )
        .await?;
        tasks.push(tokio::spawn(follow(
            reader,
            Arc::clone(&target),
            Receipts::new(Arc::clone(&tally)),
            stopped.clone(),
        )));
    }
    let outcome = appender_window(Appender {
        kind: system.kind,
        addr: system.addr,
        pid: system.process.child.id(),
        followers,
        events: (settings.rate * settings.seconds) as usize,
        rate: settings.rate,
        target: Arc::clone(&target),
        tally: Arc::clone(&tally),
    })
    .await;
    let _ = stop.send(true);
    let mut received = Vec::new();
    for task in tasks {
        match task.await? {
            Ok(receipts) => received.extend(receipts.received),
            Err(error) => return Err(format!("a follower failed: {error}").into()),
        }
    }
    let window = outcome?;
    let mut from_ack = Vec::with_capacity(received.len());
    let mut from_send = Vec::with_capacity(received.len());
    for (n, received_ns) in received {
        let (sent_ns, acked_ns) = *window
            .appends
            .get(n)
            .ok_or_else(|| format!("a follower received event {n}, never appended"))?;
        from_ack.push(received_ns.saturating_sub(acked_ns));
        from_send.push(received_ns - sent_ns);
    }
    let deliveries = from_ack.len() as u64;
    let mut acks_ns: Vec<u64> = window.appends.iter().map(|(s, a)| a - s).collect();
    acks_ns.sort_unstable();
    Ok(Figures {
        deliveries,
        expected: (window.appends.len() * followers) as u64,
        committed: Quantiles::of(from_ack),
        sent: Quantiles::of(from_send),
        append_p50_ms: quantile_ms(&acks_ns, 0.50),
        cpu_us_per_delivery: window.cpu_s * 1e6 / deliveries.max(1) as f64,
        cpu_cores: window.cpu_s / window.elapsed_s,
        client_cores: window.own_cpu_s / window.elapsed_s,
        refetched: tally.refetched.load(Ordering::SeqCst),
        lagged: tally.lagged.load(Ordering::SeqCst),
    })
}

struct Window {
    /// Per timed event, in order: when its append was sent and when it
    /// was acknowledged ([`now_ns`]).
    appends: Vec<(u64, u64)>,
    /// This process's CPU (the followers and the appender), in seconds.
    own_cpu_s: f64,
    cpu_s: f64,
    elapsed_s: f64,
}

/// What the appender's thread needs.
struct Appender {
    kind: Kind,
    addr: SocketAddr,
    /// The server's process.
    pid: u32,
    followers: usize,
    events: usize,
    rate: u64,
    target: Arc<Target>,
    tally: Arc<Tally>,
}

/// Runs [`timed_window`] on a thread and runtime of its own, so that the
/// appender's send and acknowledgement times are not held up behind the
/// followers' tasks.
async fn appender_window(appender: Appender) -> Result<Window> {
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(timed_window(appender))
    })
    .await?
}

/// Warm-up until every follower has an event, then the timed appends and
/// the drain, with the server's CPU (and this process's) read on either
/// side.
async fn timed_window(appender: Appender) -> Result<Window> {
    let Appender {
        kind,
        addr,
        pid,
        followers,
        events,
        rate,
        target,
        tally,
    } = appender;
    let mut appender = Client::connect(kind, addr).await?;
    let mut n = 0u64;
    let warm_started = Instant::now();
    while tally.ready.load(Ordering::SeqCst) < followers {
        if warm_started.elapsed() > WARMUP_TIMEOUT {
            return Err(format!(
                "only {} of {followers} followers received a warm-up event within {} s",
                tally.ready.load(Ordering::SeqCst),
                WARMUP_TIMEOUT.as_secs()
            )
            .into());
        }
        n += 1;
        let event = payload(false, n);
        appender
            .append_to(vec![event], &target.redis_key, &target.nats_subject)
            .await?;
        tokio::time::sleep(WARMUP_INTERVAL).await;
    }
    // Let the warm-up's last deliveries land before the window opens.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let cpu_before = cpu_seconds(pid)?;
    let own_cpu_before = cpu_seconds(std::process::id())?;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut appends = Vec::with_capacity(events);
    for timed_n in 0..events {
        ticker.tick().await;
        let sent_ns = now_ns();
        appender
            .append_to(
                vec![payload(true, timed_n as u64)],
                &target.redis_key,
                &target.nats_subject,
            )
            .await?;
        appends.push((sent_ns, now_ns()));
    }
    let expected = (events * followers) as u64;
    let drain_started = Instant::now();
    while tally.delivered.load(Ordering::SeqCst) < expected
        && drain_started.elapsed() < DRAIN_TIMEOUT
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds(pid)? - cpu_before;
    let own_cpu_s = cpu_seconds(std::process::id())? - own_cpu_before;
    appender.close().await;
    Ok(Window {
        appends,
        cpu_s,
        own_cpu_s,
        elapsed_s,
    })
}

// ---------------------------------------------------------------------------
// The whole bench and its table.

/// (round, followers, system) → figures or why the run failed.
type Results = Vec<(usize, usize, Kind, std::result::Result<Figures, String>)>;

async fn bench(settings: &Settings, systems: &[System]) -> Results {
    let mut results = Vec::new();
    // Systems take turns at each follower count, so that a burst of load
    // from elsewhere on a shared machine does not fall on one system.
    for round in 1..=settings.rounds {
        for &followers in &settings.followers {
            for system in systems {
                let run = fan_out_run(system, followers, settings)
                    .await
                    .map_err(|error| error.to_string());
                match &run {
                Ok(f) => eprintln!(
                    "{:<8} {followers:>5} followers: {}/{} deliveries; from commit p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; from send p99 {:.2} ms; {:.1} µs CPU per delivery",
                    system.kind.name(),
                    f.deliveries,
                    f.expected,
                    f.committed.p50_ms,
                    f.committed.p99_ms,
                    f.committed.max_ms,
                    f.sent.p99_ms,
                    f.cpu_us_per_delivery
                ),
                Err(error) => eprintln!(
                    "{} with {followers} followers failed: {error}",
                    system.kind.name()
                ),
            }
                results.push((round, followers, system.kind, run));
                // Closed followers' connections leave before the next run.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    results
}

fn main() -> ExitCode {
    if let Some(dir) = std::env::var_os(NODE_ENV) {
        return run_node(PathBuf::from(dir));
    }
    let settings = settings();
    let most = settings.followers.iter().copied().max().unwrap_or(0) as u64;
    if let Some(limit) = open_files_max() {
        // A socket per follower here, and the appender and spare files.
        if limit < most + 256 {
            eprintln!(
                "the open-file limit is {limit}, too low for {most} followers: raise it (`ulimit -n {}`) and run again",
                2 * most + 256
            );
            return ExitCode::FAILURE;
        }
    }
    install_peers(&settings.systems);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (systems, skipped) = start_each(&settings.systems, |kind| start(kind, &runtime));
    let results = until_interrupted(&runtime, bench(&settings, &systems));
    drop(runtime);
    let Some(results) = results else {
        drop(systems);
        eprintln!("interrupted; servers stopped");
        return ExitCode::from(130);
    };
    report(&settings, &systems, &skipped, &results);
    drop(systems);
    ExitCode::SUCCESS
}

fn report(settings: &Settings, systems: &[System], skipped: &[(Kind, String)], results: &Results) {
    println!();
    println!(
        "live follow fanned out: one appender, {} events/s for {} s per run ({PAYLOAD_BYTES}-byte payloads, each acked before the next); {}",
        settings.rate,
        settings.seconds,
        machine()
    );
    print_systems(
        systems
            .iter()
            .map(|system| (system.kind, system.note.as_str())),
        skipped,
    );
    println!("latency per (event, follower) delivery, in ms: from the append's acknowledgement (commit) to the follower's receipt, 0 if the follower was first; and from the append's send (commit included)");
    println!("server CPU (utime + stime of its process over the timed window) per delivered event, in µs, and in cores; the followers' and appender's process (clients), in cores");
    println!();
    println!(
        "{:>9}  {:<16} {:>13} {:>23} {:>15} {:>8} {:>8} {:>6} {:>7}",
        "followers",
        "system",
        "deliveries",
        "commit→rcv p50/p99/max",
        "send→rcv p50/99",
        "ack p50",
        "CPU µs",
        "cores",
        "clients"
    );
    for (round, followers, kind, run) in results {
        match run {
            Ok(f) => {
                let mut notes = String::new();
                if settings.rounds > 1 {
                    notes = format!("  (round {round})");
                }
                if f.refetched > 0 || f.lagged > 0 {
                    notes += &format!("  ({} refetches, {} lagged)", f.refetched, f.lagged);
                }
                println!(
                    "{followers:>9}  {:<16} {:>13} {:>23} {:>15} {:>8.2} {:>8.1} {:>6.2} {:>7.2}{notes}",
                    kind.label(),
                    format!("{}/{}", f.deliveries, f.expected),
                    format!(
                        "{:.2}/{:.2}/{:.2}",
                        f.committed.p50_ms, f.committed.p99_ms, f.committed.max_ms
                    ),
                    format!("{:.2}/{:.2}", f.sent.p50_ms, f.sent.p99_ms),
                    f.append_p50_ms,
                    f.cpu_us_per_delivery,
                    f.cpu_cores,
                    f.client_cores,
                );
            }
            Err(error) => println!("{followers:>9}  {:<16} failed: {error}", kind.label()),
        }
    }
    println!();
    for line in goals(settings.rounds, results) {
        println!("{line}");
    }
    if systems.iter().any(|s| s.kind == Kind::Nats) {
        println!();
        println!("{}", nats_footnote());
    }
}

/// The goals, judged at [`GOAL_FOLLOWERS`] followers: meshlog's
/// p99 from a committed append to each follower under [`GOAL_P99_MS`],
/// and meshlog no worse than either peer on that p99 and on CPU per
/// delivery. A goal is judged only from complete runs (every delivery
/// made), on the median of the rounds' figures.
/// The figures a goal is judged on, medians over the rounds.
struct Medians {
    p99_ms: f64,
    cpu_us_per_delivery: f64,
}

fn goals(rounds: usize, results: &Results) -> Vec<String> {
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let figures = |kind: Kind| {
        let complete: Vec<&Figures> = results
            .iter()
            .filter(|(_, followers, k, _)| *followers == GOAL_FOLLOWERS && *k == kind)
            .filter_map(|(_, _, _, run)| run.as_ref().ok())
            .filter(|f| f.deliveries == f.expected && f.expected > 0)
            .collect();
        (complete.len() == rounds).then(|| Medians {
            p99_ms: median(complete.iter().map(|f| f.committed.p99_ms).collect()),
            cpu_us_per_delivery: median(complete.iter().map(|f| f.cpu_us_per_delivery).collect()),
        })
    };
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    let over = if rounds > 1 {
        format!(", medians of {rounds} rounds")
    } else {
        String::new()
    };
    let mut lines = Vec::new();
    let Some(ours) = figures(Kind::Meshlog) else {
        lines.push(format!(
            "goals at {GOAL_FOLLOWERS} followers: not judged: no complete meshlog run at {GOAL_FOLLOWERS} followers"
        ));
        return lines;
    };
    lines.push(format!(
        "goal: meshlog commit→follower p99 < {GOAL_P99_MS} ms at {GOAL_FOLLOWERS} followers: {} ({:.2} ms{over})",
        verdict(ours.p99_ms < GOAL_P99_MS),
        ours.p99_ms
    ));
    for peer in [Kind::Redis, Kind::Nats] {
        match figures(peer) {
            Some(theirs) => {
                lines.push(format!(
                    "goal: meshlog p99 no worse than {} at {GOAL_FOLLOWERS} followers: {} ({:.2} vs {:.2} ms{over})",
                    peer.name(),
                    verdict(ours.p99_ms <= theirs.p99_ms),
                    ours.p99_ms,
                    theirs.p99_ms
                ));
                lines.push(format!(
                    "goal: meshlog CPU per delivery no worse than {} at {GOAL_FOLLOWERS} followers: {} ({:.2} vs {:.2} µs{over})",
                    peer.name(),
                    verdict(ours.cpu_us_per_delivery <= theirs.cpu_us_per_delivery),
                    ours.cpu_us_per_delivery,
                    theirs.cpu_us_per_delivery
                ));
            }
            None => lines.push(format!(
                "goal: meshlog no worse than {}: not judged: no complete {} run at {GOAL_FOLLOWERS} followers",
                peer.name(),
                peer.name()
            )),
        }
    }
    lines
}
