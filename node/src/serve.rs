//! `meshlog serve`: startup, the accept loop and graceful shutdown.
//!
//! One port serves everything: the JSON API and, by an HTTP upgrade of
//! `GET /sync`, the peers' sync sessions; over TLS when the node has a
//! certificate. The accept loop bounds what clients can hold: at most
//! `connections_max` connections, and `connections_per_ip_max` from one
//! address (one more is answered `503 too_many_connections` and closed), a
//! TLS handshake and then a request head must each arrive within
//! `request_read_timeout` (else the connection is closed; this also ends
//! idle keep-alive connections) and a body within it again (else `408`);
//! a head is at most `header_bytes_max` bytes and `headers_max` headers
//! (else `431`).
//!
//! On SIGINT or SIGTERM the node stops accepting, lets in-flight requests
//! finish (an append is answered only after its durable commit, so what was
//! acknowledged is on disk), closes the sync sessions and exits 0.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use hyper_util::rt::{TokioIo, TokioTimer};
use meshlog_replica::WriterPublicKey;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::auth::{Auth, SecretsError};
use crate::config::{Limits, NodeConfig, ServeArgs};
use crate::http::{self, AppState, ConnInfo};
use crate::metrics::Metrics;
use crate::peer_memory::PeerMemoryFile;
use crate::peers::{PeerSecurity, Peers};
use crate::replica::{NodeReplica, OpenError};
use crate::tls::{Tls, TlsError};
use crate::writer_key::KeyFileError;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The settings are wrong.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A setting is out of the range it takes.
    #[error(transparent)]
    Setting(#[from] crate::config::OutOfRange),
    /// The data directory could not be opened.
    #[error("cannot open the data directory: {0}")]
    Open(#[from] OpenError),
    /// The writer key could not be loaded or created.
    #[error(transparent)]
    WriterKey(#[from] KeyFileError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// A configured peer URL is not one the node can dial.
    #[error(transparent)]
    Peer(#[from] crate::peers::PeerUrlError),
    /// The secrets could not be loaded, or the node would serve a network
    /// without any.
    #[error(transparent)]
    Secrets(#[from] SecretsError),
    /// The TLS files could not be loaded.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// A running node. Dropping it does not stop it; call
/// [`Node::shutdown`] and then [`Node::stopped`].
pub struct Node {
    local_addr: SocketAddr,
    stream: u64,
    writer: WriterPublicKey,
    sealed: bool,
    stop: CancellationToken,
    done: JoinHandle<()>,
    auth: Auth,
    allow_unauthenticated: bool,
    tls: Tls,
    replica: NodeReplica,
}

impl Node {
    /// Opens the data directory, binds the listener, starts dialing the
    /// configured peers and serving. Must be called within a tokio runtime.
    pub async fn start(config: NodeConfig) -> Result<Node, ServeError> {
        config.check()?;
        let security = &config.security;
        let auth = Auth::load(security.secrets.clone())?;
        let tls = Tls::load(
            security.tls_cert.as_deref(),
            security.tls_key.as_deref(),
            security.tls_ca.as_deref(),
        )?;
        let replica = open_replica(&config).await?;
        crate::trust::log(&config.trust, replica.config().require_seals);
        let (listener, local_addr) = bind(&config.listen).await?;
        auth.check_listen(local_addr, security.allow_unauthenticated)?;
        if !auth.enabled() {
            tracing::warn!(addr = %local_addr, "no secret configured: every route is open to whoever reaches this address");
        }
        let stop = CancellationToken::new();
        let metrics = Arc::new(Metrics::new());
        let security = PeerSecurity {
            auth: auth.clone(),
            tls: tls.clone(),
            inbound_max: config.limits.inbound_sessions_max,
        };
        let peers = start_peers(&config, &replica, &metrics, &stop, security)?;
        let fetch = crate::read::CheckpointFetch::new(
            peers.checkpoint_wants(),
            config.sync.checkpoint_fetch,
            config.sync.checkpoint_fetches_max,
            Arc::clone(&metrics),
        );
        let state = Arc::new(AppState {
            replica: replica.clone(),
            peers: peers.clone(),
            metrics,
            limits: config.limits.clone(),
            follow: crate::follow::FollowHub::new(
                &replica,
                config.follow.clone(),
                stop.child_token(),
            ),
            auth: auth.clone(),
            tls: tls.clone(),
            fetch,
        });
        tracing::info!(
            stream = replica.stream().get(),
            sealed = replica.sealed(),
            addr = %local_addr,
            data = %config.data.display(),
            peers = config.peers.len(),
            tls = tls.server.is_some(),
            authenticated = auth.enabled(),
            "node serving"
        );
        let done = tokio::spawn(accept_loop(listener, state, stop.clone()));
        Ok(Node {
            local_addr,
            stream: replica.stream().get(),
            writer: replica.writer_key(),
            sealed: replica.sealed(),
            stop,
            done,
            auth,
            allow_unauthenticated: config.security.allow_unauthenticated,
            tls,
            replica,
        })
    }
}

/// The node's sync links: the configured peers dialed, and the watch that
/// ends the start's check of the own stream against them
/// (`crate::recovery`).
fn start_peers(
    config: &NodeConfig,
    replica: &NodeReplica,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
    security: PeerSecurity,
) -> Result<Peers, ServeError> {
    let peers = Peers::new(
        replica.clone(),
        config.sync.clone(),
        Arc::clone(metrics),
        stop.child_token(),
        security,
        PeerMemoryFile::load(&config.data),
    );
    for url in &config.peers {
        peers.add(url)?;
    }
    let watch = crate::recovery::watch(replica, &peers, &config.sync, stop.child_token());
    tokio::spawn(watch);
    Ok(peers)
}

/// Opens the data directory's replica with its writer key, off the
/// runtime (it reads the whole log).
async fn open_replica(config: &NodeConfig) -> Result<NodeReplica, ServeError> {
    let data = config.data.clone();
    let stream_id = config.stream_id;
    let settings = crate::replica::OpenSettings {
        trust: config.trust.clone(),
        require_seals: config.require_seals,
        payload_bytes_max: config.limits.payload_bytes_max,
        recover_own_stream: crate::recovery::holds_at_start(config),
        // Longer than the hold at start, so that an append made during it
        // sees its end rather than a 503.
        append_wait: config.sync.recovery_wait + std::time::Duration::from_secs(1),
    };
    tokio::task::spawn_blocking(move || {
        NodeReplica::open(&data, stream_id, &settings).map_err(|error| match error {
            OpenError::WriterKey(error) => ServeError::WriterKey(error),
            error => ServeError::Open(error),
        })
    })
    .await
    .expect("opening the replica panicked")
}

/// The listener on `listen`, and the address it got.
async fn bind(listen: &str) -> Result<(TcpListener, SocketAddr), ServeError> {
    let bind_error = |source: std::io::Error| ServeError::Bind {
        addr: listen.to_owned(),
        source,
    };
    let listener = TcpListener::bind(listen).await.map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local_addr))
}

impl Node {
    /// Rereads the secrets from the file and environment they came from
    /// (what `SIGHUP` does): new secrets are accepted at once, removed ones
    /// are refused from the next request on. On an error the old secrets
    /// stay in force.
    pub fn reload_secrets(&self) -> Result<(), SecretsError> {
        self.auth
            .reload(self.local_addr, self.allow_unauthenticated)
    }

    /// Rereads the node's TLS certificate and key from their files (what
    /// `SIGHUP` does, with the secrets): new handshakes, served and dialed,
    /// present the new pair; links already up keep theirs. `Ok(false)` for
    /// a node without a certificate. On an error the old pair stays.
    pub fn reload_tls(&self) -> Result<bool, TlsError> {
        self.tls.reload()
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The node's own stream id.
    pub fn stream(&self) -> u64 {
        self.stream
    }

    /// The public half of the node's writer key (`writer.key` in its data
    /// directory): its stream is the one the key derives, or a legacy
    /// stream's recorded id (`docs/SIGNING.md`).
    pub fn writer_key(&self) -> WriterPublicKey {
        self.writer
    }

    /// Whether the node seals its stream: its key derives it, or the
    /// trust configuration binds the key to this legacy stream
    /// (`docs/SIGNING.md`, the upgrade policy).
    pub fn sealed(&self) -> bool {
        self.sealed
    }

    /// The replica's group-commit counters so far: rounds, store commits,
    /// events appended, the largest round (`SharedReplica::commit_stats`).
    /// Requests per commit is what a group commit gathers: the node bench
    /// prints it beside each run.
    pub fn commit_stats(&self) -> meshlog_replica::CommitStats {
        self.replica.commit_stats()
    }

    /// Starts a graceful shutdown.
    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    /// Waits until the node has shut down: listener closed, in-flight
    /// requests answered (or the shutdown timeout passed), sessions closed.
    pub async fn stopped(self) {
        let _ = self.done.await;
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<AppState>, stop: CancellationToken) {
    let limits = state.limits.clone();
    let permits = Arc::new(Semaphore::new(limits.connections_max));
    let per_ip = PerIp::default();
    let connections = TaskTracker::new();
    let router = http::router(Arc::clone(&state));
    loop {
        let (tcp, remote) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let Some(slot) = per_ip.take(remote.ip(), limits.connections_per_ip_max) else {
            state.metrics.connections_refused.inc();
            tracing::debug!(%remote, limit = limits.connections_per_ip_max, "connection refused: too many connections from one address");
            connections.spawn(refuse(tcp, limits.clone()));
            continue;
        };
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                connections.spawn(accept_connection(
                    tcp,
                    remote,
                    router.clone(),
                    Arc::clone(&state),
                    (permit, slot),
                    stop.clone(),
                ));
            }
            Err(_) => {
                state.metrics.connections_refused.inc();
                tracing::debug!(%remote, limit = limits.connections_max, "connection refused: too many connections");
                connections.spawn(refuse(tcp, limits.clone()));
            }
        }
    }
    drop(listener);
    tracing::info!("shutting down: no new connections; finishing requests in flight");
    connections.close();
    if tokio::time::timeout(limits.shutdown_timeout, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?limits.shutdown_timeout, "requests still in flight at the shutdown timeout");
    }
    state.peers.shutdown().await;
    tracing::info!("node stopped");
}

/// Connections held per client address.
#[derive(Clone, Default)]
struct PerIp(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One connection's place in [`PerIp`], given back on drop.
struct IpSlot {
    counts: PerIp,
    ip: IpAddr,
}

impl PerIp {
    fn take(&self, ip: IpAddr, max: usize) -> Option<IpSlot> {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(ip).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(IpSlot {
            counts: self.clone(),
            ip,
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Runs the TLS handshake if the node serves TLS (bounded by
/// `request_read_timeout`), answering a plaintext request on the TLS port
/// with a plain `400` that says so, then serves the connection.
async fn accept_connection(
    tcp: TcpStream,
    remote: SocketAddr,
    router: axum::Router,
    state: Arc<AppState>,
    places: (OwnedSemaphorePermit, IpSlot),
    stop: CancellationToken,
) {
    let limits = state.limits.clone();
    let Some(server) = state.tls.server.clone() else {
        let info = ConnInfo {
            remote,
            client_certificate: false,
        };
        return serve_connection(tcp, info, router, state, places, stop).await;
    };
    let mut first = [0u8; 1];
    match tokio::time::timeout(limits.request_read_timeout, tcp.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE => {}
        Ok(Ok(1)) => {
            state.metrics.tls_handshakes_failed.inc();
            tracing::debug!(%remote, "plaintext request on the TLS port");
            return plaintext_on_tls(tcp, limits).await;
        }
        _ => return,
    }
    let accepted = tokio::time::timeout(
        limits.request_read_timeout,
        tokio_rustls::TlsAcceptor::from(server).accept(tcp),
    )
    .await;
    let tls = match accepted {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            state.metrics.tls_handshakes_failed.inc();
            tracing::info!(%remote, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            state.metrics.tls_handshakes_failed.inc();
            tracing::debug!(%remote, "TLS handshake timed out");
            return;
        }
    };
    let info = ConnInfo {
        remote,
        client_certificate: tls.get_ref().1.peer_certificates().is_some(),
    };
    serve_connection(tls, info, router, state, places, stop).await
}

async fn serve_connection<IO>(
    io: IO,
    info: ConnInfo,
    router: axum::Router,
    state: Arc<AppState>,
    _places: (OwnedSemaphorePermit, IpSlot),
    stop: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let limits = state.limits.clone();
    state.metrics.connections_open.inc();
    // Every request learns who sent it and whether its connection showed a
    // client certificate (the sync upgrade's check).
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(info.clone());
            router.clone().oneshot(request)
        });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_read_timeout)
        .max_buf_size(limits.header_bytes_max.max(8192))
        .max_header_size(limits.header_bytes_max)
        .max_headers(limits.headers_max);
    let connection = builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                break;
            }
            _ = stop.cancelled(), if !stopping => {
                // Answer the request in flight, then close.
                connection.as_mut().graceful_shutdown();
                stopping = true;
            }
        }
    }
    state.metrics.connections_open.dec();
}

/// Answers an HTTP request sent in plaintext to the TLS port, as nginx
/// does, rather than a TLS alert the client cannot read.
async fn plaintext_on_tls(tcp: TcpStream, limits: Limits) {
    let body = r#"{"error":"tls_required","message":"this port speaks TLS: use https://"}"#;
    answer_and_close(tcp, limits, "400 Bad Request", body).await
}

/// Answers one connection over the limit with `503` and closes it, without
/// parsing its request: bounded in time and bytes, so refusals cannot pile
/// up.
async fn refuse(tcp: TcpStream, limits: Limits) {
    let body = r#"{"error":"too_many_connections","message":"this node serves as many connections as it accepts; retry later"}"#;
    answer_and_close(tcp, limits, "503 Service Unavailable", body).await
}

/// Writes one JSON answer without reading the request, then closes.
async fn answer_and_close(mut tcp: TcpStream, limits: Limits, status: &str, body: &str) {
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    let answer = async {
        tcp.write_all(response.as_bytes()).await?;
        tcp.shutdown().await?;
        // Read (and drop) what the client sent, until it closes: closing a
        // socket with unread input resets it, and the reset can destroy the
        // answer before the client reads it. Bounded: 64 KiB, and the time
        // below.
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < 64 * 1024 {
            match tcp.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<_, std::io::Error>(())
    };
    let time = limits
        .request_read_timeout
        .min(std::time::Duration::from_secs(1));
    let _ = tokio::time::timeout(time, answer).await;
}

/// `meshlog serve`: runs a node until SIGINT or SIGTERM, then shuts it down
/// gracefully and exits 0. Prints `listening on ADDR` on stdout once it
/// serves.
pub fn run(args: ServeArgs) -> ExitCode {
    let config = match NodeConfig::from_args(args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("meshlog serve: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("meshlog serve: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let node = match Node::start(config).await {
            Ok(node) => node,
            Err(error) => {
                eprintln!("meshlog serve: {error}");
                return ExitCode::FAILURE;
            }
        };
        println!("listening on {}", node.local_addr());
        println!("stream {}", node.stream());
        use std::io::Write;
        let _ = std::io::stdout().flush();
        wait_for_signal(&node).await;
        tracing::info!("signal received; shutting down");
        node.shutdown();
        node.stopped().await;
        ExitCode::SUCCESS
    })
}

/// Waits for SIGINT or SIGTERM; rereads the secrets and the TLS
/// certificate and key on each SIGHUP.
async fn wait_for_signal(node: &Node) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (mut term, mut hup) = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) {
            (Ok(term), Ok(hup)) => (term, hup),
            _ => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return,
                _ = term.recv() => return,
                _ = hup.recv() => {
                    match node.reload_secrets() {
                        Ok(()) => tracing::info!("SIGHUP: secrets reread"),
                        Err(error) => tracing::error!(%error, "SIGHUP: secrets not reread; the old ones stay in force"),
                    }
                    match node.reload_tls() {
                        Ok(true) => tracing::info!("SIGHUP: TLS certificate and key reread"),
                        Ok(false) => {}
                        Err(error) => tracing::error!(%error, "SIGHUP: TLS certificate not reread; the old one stays in force"),
                    }
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = node;
        let _ = tokio::signal::ctrl_c().await;
    }
}
