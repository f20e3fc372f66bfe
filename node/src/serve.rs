//! `meshlog serve`: startup, the accept loop and graceful shutdown.
//!
//! One port serves everything: the JSON API and, by an HTTP upgrade of
//! `GET /sync`, the peers' sync sessions. The accept loop bounds what
//! clients can hold: at most `connections_max` connections (one more is
//! answered `503 too_many_connections` and closed), a request head must
//! arrive within `request_read_timeout` (else the connection is closed) and
//! its body within it again (else `408`).
//!
//! On SIGINT or SIGTERM the node stops accepting, lets in-flight requests
//! finish (an append is answered only after its durable commit, so what was
//! acknowledged is on disk), closes the sync sessions and exits 0.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Limits, NodeConfig, ServeArgs};
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::peers::Peers;
use crate::replica::{NodeReplica, OpenError};

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The settings are wrong.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The data directory could not be opened.
    #[error("cannot open the data directory: {0}")]
    Open(#[from] OpenError),
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
}

/// A running node. Dropping it does not stop it; call
/// [`Node::shutdown`] and then [`Node::stopped`].
pub struct Node {
    local_addr: SocketAddr,
    stream: u64,
    stop: CancellationToken,
    done: JoinHandle<()>,
}

impl Node {
    /// Opens the data directory, binds the listener, starts dialing the
    /// configured peers and serving. Must be called within a tokio runtime.
    pub async fn start(config: NodeConfig) -> Result<Node, ServeError> {
        let data = config.data.clone();
        let stream_id = config.stream_id;
        let payload_bytes_max = config.limits.payload_bytes_max;
        let replica = tokio::task::spawn_blocking(move || {
            NodeReplica::open(&data, stream_id, payload_bytes_max)
        })
        .await
        .expect("opening the replica panicked")?;
        let listener =
            TcpListener::bind(&config.listen)
                .await
                .map_err(|source| ServeError::Bind {
                    addr: config.listen.clone(),
                    source,
                })?;
        let local_addr = listener.local_addr().map_err(|source| ServeError::Bind {
            addr: config.listen.clone(),
            source,
        })?;
        let stop = CancellationToken::new();
        let metrics = Arc::new(Metrics::new());
        let peers = Peers::new(
            replica.clone(),
            config.sync.clone(),
            Arc::clone(&metrics),
            stop.child_token(),
        );
        for url in &config.peers {
            peers.add(url)?;
        }
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
        });
        tracing::info!(
            stream = replica.stream().get(),
            addr = %local_addr,
            data = %config.data.display(),
            peers = config.peers.len(),
            "node serving"
        );
        let done = tokio::spawn(accept_loop(listener, state, stop.clone()));
        Ok(Node {
            local_addr,
            stream: replica.stream().get(),
            stop,
            done,
        })
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The node's own stream id.
    pub fn stream(&self) -> u64 {
        self.stream
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
        match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => {
                connections.spawn(serve_connection(
                    tcp,
                    router.clone(),
                    Arc::clone(&state),
                    limits.clone(),
                    permit,
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

async fn serve_connection(
    tcp: TcpStream,
    router: axum::Router,
    state: Arc<AppState>,
    limits: Limits,
    _permit: OwnedSemaphorePermit,
    stop: CancellationToken,
) {
    state.metrics.connections_open.inc();
    let service = TowerToHyperService::new(router);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.request_read_timeout);
    let connection = builder
        .serve_connection(TokioIo::new(tcp), service)
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

/// Answers one connection over the limit with `503` and closes it, without
/// parsing its request: bounded in time and bytes, so refusals cannot pile
/// up.
async fn refuse(mut tcp: TcpStream, limits: Limits) {
    let body = r#"{"error":"too_many_connections","message":"this node serves as many connections as it accepts; retry later"}"#;
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
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
        wait_for_signal().await;
        tracing::info!("signal received; shutting down");
        node.shutdown();
        node.stopped().await;
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
