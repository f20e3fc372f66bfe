//! Links to peers, named by URL: dial, upgrade `GET /sync` to the sync
//! protocol, run a `meshlog_sync::Session` over the upgraded connection,
//! redial with jittered exponential backoff; and inbound sessions, which
//! arrive through the same upgrade on this node's port.
//!
//! A peer at `https://` is dialed over TLS, its certificate checked against
//! `--tls-ca` and this node's own certificate presented. With peer secrets
//! configured, every link (dialed or inbound) first passes the peer
//! handshake (`peer_auth`): a peer that does not hold the secret never
//! reaches a sync session.
//!
//! The redial policy is `meshlog_sync::PeerManager`'s (which dials raw TCP,
//! not an HTTP upgrade, so it is re-implemented here): the delay doubles
//! from `backoff_min` to `backoff_max` per failure, drawn from the upper
//! half of that range, and starts over only after a session that was
//! established and lasted at least `backoff_max`.

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http_body_util::Empty;
use hyper::header::{CONNECTION, HOST, UPGRADE};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_sync::{
    Backoff, PeerDirection, Routes, Session, SessionConfig, SessionEnd, SessionError, SessionState,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Auth;
use crate::config::SyncSettings;
use crate::metrics::Metrics;
use crate::peer_auth;
use crate::replica::NodeReplica;
use crate::tls::Tls;

/// The protocol named in the `Upgrade` header of `GET /sync`.
pub const SYNC_PROTOCOL: &str = "meshlog-sync";

/// One dialed peer as the node sees it now.
#[derive(Debug, Clone)]
pub struct PeerStatus {
    /// The peer's URL, normalized (`http://host:port`).
    pub url: String,
    /// Whether a session is running and the peer's hello has arrived.
    pub connected: bool,
    /// The peer's stream, from its last hello.
    pub stream: Option<StreamId>,
    /// The marks the peer has acknowledged (current or last session).
    pub marks: VersionVector,
    /// Events this node holds that the peer has not acknowledged.
    pub lag_events: u64,
    /// Why the last session or dial that ended badly did.
    pub last_error: Option<String>,
}

/// One inbound session (a peer that dialed this node) as the node sees it
/// now.
#[derive(Debug, Clone)]
pub struct InboundStatus {
    /// The address the session's connection came from.
    pub remote: std::net::SocketAddr,
    /// Whether the peer's hello has arrived.
    pub connected: bool,
    /// The peer's stream, from its hello.
    pub stream: Option<StreamId>,
    /// The marks the peer has acknowledged.
    pub marks: VersionVector,
    /// Events this node holds that the peer has not acknowledged.
    pub lag_events: u64,
}

/// A peer URL this node cannot dial.
#[derive(Debug, thiserror::Error)]
#[error("bad peer URL {url:?}: {reason}")]
pub struct PeerUrlError {
    /// The URL given.
    pub url: String,
    /// Why it is refused.
    pub reason: &'static str,
}

/// The node's sync links: dialed peers by URL, and inbound sessions.
/// Cheap to clone.
#[derive(Clone)]
pub struct Peers {
    inner: Arc<Inner>,
}

struct Inner {
    replica: NodeReplica,
    settings: SyncSettings,
    metrics: Arc<Metrics>,
    /// Cancelled on shutdown: every dial loop and session stops.
    stop: CancellationToken,
    tasks: TaskTracker,
    dialed: Mutex<Vec<Arc<Slot>>>,
    /// The running inbound sessions, by the address they came from, in
    /// the order they started.
    inbound: Mutex<Vec<(std::net::SocketAddr, watch::Receiver<SessionState>)>>,
    inbound_permits: Arc<Semaphore>,
    /// Counts peers ever added, to seed each one's jitter differently.
    added: Mutex<u64>,
    /// The peer secrets, for the handshake.
    auth: Auth,
    /// The TLS client for `https://` peers.
    tls: Tls,
    /// Shared by every session of this node: which session brings each
    /// stream, so that in a mesh with cycles an event arrives once, and of
    /// two sessions with one peer (each dialed the other) one is kept.
    routes: Routes,
}

struct Slot {
    url: String,
    tls: bool,
    host: String,
    port: u16,
    stop: CancellationToken,
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    running: Option<watch::Receiver<SessionState>>,
    last: SessionState,
    last_error: Option<String>,
}

impl Peers {
    /// No peers yet; `stop` ends every link when cancelled. At most
    /// `inbound_max` inbound sessions run at once.
    pub fn new(
        replica: NodeReplica,
        settings: SyncSettings,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
        security: PeerSecurity,
    ) -> Peers {
        Peers {
            inner: Arc::new(Inner {
                replica,
                settings,
                metrics,
                stop,
                tasks: TaskTracker::new(),
                dialed: Mutex::default(),
                inbound: Mutex::default(),
                inbound_permits: Arc::new(Semaphore::new(security.inbound_max)),
                added: Mutex::new(0),
                auth: security.auth,
                tls: security.tls,
                routes: Routes::new(),
            }),
        }
    }

    fn session_config(&self) -> SessionConfig {
        SessionConfig {
            frame_bytes_max: self.inner.settings.frame_bytes_max,
            ..SessionConfig::with_heartbeat(self.inner.settings.heartbeat)
        }
    }

    /// Starts dialing `url` (and redialing it). Returns the normalized URL
    /// and whether it was new (`false`: already dialed, nothing changed).
    pub fn add(&self, url: &str) -> Result<(String, bool), PeerUrlError> {
        let (normalized, host, port) = parse_url(url)?;
        let tls = normalized.starts_with("https:");
        if tls && self.inner.tls.client.is_none() {
            return Err(PeerUrlError {
                url: url.to_owned(),
                reason: "an https:// peer needs --tls-ca, the CA its certificate chains to",
            });
        }
        let slot = {
            let mut dialed = lock(&self.inner.dialed);
            if dialed.iter().any(|slot| slot.url == normalized) {
                return Ok((normalized, false));
            }
            let slot = Arc::new(Slot {
                url: normalized.clone(),
                tls,
                host,
                port,
                stop: self.inner.stop.child_token(),
                state: Mutex::default(),
            });
            dialed.push(Arc::clone(&slot));
            slot
        };
        let index = {
            let mut added = lock(&self.inner.added);
            *added += 1;
            *added
        };
        // Each peer's jitter differs from the others' and from other nodes'.
        let seed = self.inner.replica.stream().get() ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let settings = &self.inner.settings;
        let backoff = Backoff::new(settings.backoff_min, settings.backoff_max, seed);
        tracing::info!(peer = %normalized, "peer added");
        self.inner
            .tasks
            .spawn(dial_loop(self.clone(), slot, backoff));
        Ok((normalized, true))
    }

    /// Stops dialing `url` and ends its session. Returns whether it was a
    /// peer.
    pub fn remove(&self, url: &str) -> bool {
        let normalized = match parse_url(url) {
            Ok((normalized, _, _)) => normalized,
            Err(_) => url.to_owned(),
        };
        let removed = {
            let mut dialed = lock(&self.inner.dialed);
            let mut removed = Vec::new();
            dialed.retain(|slot| {
                if slot.url == normalized {
                    removed.push(Arc::clone(slot));
                    false
                } else {
                    true
                }
            });
            removed
        };
        for slot in &removed {
            slot.stop.cancel();
            tracing::info!(peer = %slot.url, "peer removed");
        }
        !removed.is_empty()
    }

    /// Every dialed peer's state, in the order they were added.
    pub fn list(&self) -> Vec<PeerStatus> {
        let marks = self.inner.replica.marks();
        let dialed: Vec<Arc<Slot>> = lock(&self.inner.dialed).clone();
        dialed.iter().map(|slot| slot.status(&marks)).collect()
    }

    /// The marks every known peer (dialed, or inbound now) has
    /// acknowledged: what compaction must not pass.
    pub fn acknowledged(&self) -> Vec<VersionVector> {
        let mut marks: Vec<VersionVector> = self
            .list()
            .into_iter()
            .filter(|peer| peer.stream.is_some())
            .map(|peer| peer.marks)
            .collect();
        let inbound = lock(&self.inner.inbound);
        for (_, receiver) in inbound.iter() {
            let state = receiver.borrow();
            if state.peer.is_some() {
                marks.push(state.peer_marks.clone());
            }
        }
        marks
    }

    /// The inbound sessions running now (peers that dialed this node), in
    /// the order they started; one that ended is no longer listed.
    pub fn inbound(&self) -> Vec<InboundStatus> {
        let marks = self.inner.replica.marks();
        lock(&self.inner.inbound)
            .iter()
            .map(|(remote, receiver)| {
                let session = receiver.borrow();
                InboundStatus {
                    remote: *remote,
                    connected: session.peer.is_some(),
                    stream: session.peer,
                    lag_events: marks.events_beyond(&session.peer_marks),
                    marks: session.peer_marks.clone(),
                }
            })
            .collect()
    }

    /// A place for one more inbound session, if there is room.
    pub fn inbound_permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.inner.inbound_permits)
            .try_acquire_owned()
            .ok()
    }

    /// Runs an inbound session over `io` (an upgraded `GET /sync` from
    /// `remote`) until the peer closes it, it fails, or the node shuts
    /// down. With `handshake`, the dialer's proof must come first, within
    /// `proof_timeout`.
    pub fn run_inbound<IO>(
        &self,
        mut io: IO,
        remote: std::net::SocketAddr,
        permit: OwnedSemaphorePermit,
        handshake: Option<peer_auth::Acceptor>,
        proof_timeout: std::time::Duration,
    ) where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let peers = self.clone();
        self.inner.tasks.spawn(async move {
            let _permit = permit;
            if let Some(acceptor) = handshake {
                let mut proof = [0u8; peer_auth::LEN];
                let read = tokio::time::timeout(proof_timeout, io.read_exact(&mut proof)).await;
                let passed = matches!(read, Ok(Ok(_))) && acceptor.finish(&proof);
                if !passed {
                    peers.inner.metrics.peer_auth_refused.inc();
                    tracing::warn!(%remote, key = %acceptor.key_id, "inbound sync refused: the dialer's proof is missing or wrong");
                    let _ = io.shutdown().await;
                    return;
                }
                tracing::debug!(%remote, key = %acceptor.key_id, "inbound peer authenticated");
            }
            let session = Session::new(peers.inner.replica.sync_handle(), peers.session_config())
                .with_routes(peers.inner.routes.clone(), PeerDirection::Inbound);
            let state = session.state();
            lock(&peers.inner.inbound).push((remote, state.clone()));
            peers.inner.metrics.sessions_running.inc();
            let _ = session.run_until(io, peers.inner.stop.cancelled()).await;
            // Off the list before the count drops: what reads 0 sessions
            // then lists none.
            lock(&peers.inner.inbound).retain(|(_, other)| !other.same_channel(&state));
            peers.inner.metrics.sessions_running.dec();
        });
    }

    /// Ends every session and dial loop and waits for them.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}

impl Slot {
    fn status(&self, our_marks: &VersionVector) -> PeerStatus {
        let state = lock(&self.state);
        let (running, session) = match &state.running {
            Some(receiver) => (true, receiver.borrow().clone()),
            None => (false, state.last.clone()),
        };
        PeerStatus {
            url: self.url.clone(),
            connected: running && session.peer.is_some(),
            stream: session.peer,
            lag_events: our_marks.events_beyond(&session.peer_marks),
            marks: session.peer_marks,
            last_error: state.last_error.clone(),
        }
    }

    fn started(&self, receiver: watch::Receiver<SessionState>) {
        lock(&self.state).running = Some(receiver);
    }

    /// Records a session's end; returns whether it was established.
    fn ended(&self, result: Result<meshlog_sync::SessionEnd, SessionError>) -> bool {
        let mut state = lock(&self.state);
        if let Some(receiver) = state.running.take() {
            state.last = receiver.borrow().clone();
        }
        match result {
            Err(error) => state.last_error = Some(error.to_string()),
            Ok(SessionEnd::Duplicate { peer }) => {
                state.last_error = Some(format!(
                    "the link to stream {peer} runs on the session it dialed to this node; this one was closed as a duplicate"
                ))
            }
            Ok(_) => {}
        }
        state.last.peer.is_some()
    }

    fn failed(&self, reason: String) {
        lock(&self.state).last_error = Some(reason);
    }
}

async fn dial_loop(peers: Peers, slot: Arc<Slot>, mut backoff: Backoff) {
    let settings = peers.inner.settings.clone();
    loop {
        let dialed = tokio::select! {
            _ = slot.stop.cancelled() => return,
            dialed = tokio::time::timeout(settings.connect_timeout, dial(&peers, &slot)) => dialed,
        };
        match dialed {
            Ok(Ok(io)) => {
                tracing::debug!(peer = %slot.url, "sync upgrade accepted");
                let session =
                    Session::new(peers.inner.replica.sync_handle(), peers.session_config())
                        .with_routes(peers.inner.routes.clone(), PeerDirection::Outbound);
                slot.started(session.state());
                peers.inner.metrics.sessions_running.inc();
                let started_at = tokio::time::Instant::now();
                let result = session.run_until(io, slot.stop.cancelled()).await;
                peers.inner.metrics.sessions_running.dec();
                let established = slot.ended(result);
                backoff.session_ended(established, started_at.elapsed());
            }
            Ok(Err(reason)) => {
                tracing::debug!(peer = %slot.url, %reason, "dial failed");
                slot.failed(reason);
            }
            Err(_) => {
                slot.failed(format!(
                    "dial timed out after {:?}",
                    settings.connect_timeout
                ));
            }
        }
        let delay = backoff.next_delay();
        tokio::select! {
            _ = slot.stop.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// A connection to a peer: plain TCP or TLS over it.
type PeerIo = Box<dyn PeerStream>;

/// What a peer connection needs to be.
trait PeerStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> PeerStream for T {}

/// Connects to the peer (over TLS for `https://`), upgrades `GET /sync`
/// to the sync protocol, and passes the peer handshake if this node has
/// peer secrets.
async fn dial(peers: &Peers, slot: &Slot) -> Result<TokioIo<hyper::upgrade::Upgraded>, String> {
    let tcp = TcpStream::connect((slot.host.as_str(), slot.port))
        .await
        .map_err(|error| format!("dial failed: {error}"))?;
    let _ = tcp.set_nodelay(true);
    let io: PeerIo = if slot.tls {
        let client = peers
            .inner
            .tls
            .client
            .clone()
            .ok_or("an https:// peer needs --tls-ca")?;
        Box::new(crate::tls::connect(client, &slot.host, tcp).await?)
    } else {
        Box::new(tcp)
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|error| format!("HTTP handshake failed: {error}"))?;
    // Drives the connection until the upgrade hands its socket over.
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let authority = format!("{}:{}", slot.host, slot.port);
    let handshake = peers
        .inner
        .auth
        .peer_keys()
        .first()
        .map(peer_auth::Dialer::new);
    let mut request = Request::get("/sync")
        .header(HOST, authority)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, SYNC_PROTOCOL);
    if let Some(dialer) = &handshake {
        for (name, value) in dialer.request_headers() {
            request = request.header(name, value);
        }
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|error| format!("cannot build the upgrade request: {error}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| format!("sync upgrade request failed: {error}"))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(
            response.into_body(),
            4096,
        ))
        .await
        .map(|body| String::from_utf8_lossy(&body.to_bytes()).into_owned())
        .unwrap_or_default();
        return Err(format!(
            "peer answered {status} to the sync upgrade: {body}"
        ));
    }
    let proof = match &handshake {
        Some(dialer) => Some(dialer.finish(response.headers())?),
        None => None,
    };
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|error| format!("sync upgrade failed: {error}"))?;
    let mut io = TokioIo::new(upgraded);
    if let Some(proof) = proof {
        io.write_all(&proof)
            .await
            .map_err(|error| format!("cannot send the peer proof: {error}"))?;
    }
    Ok(io)
}

/// What the peer links need of the node's security settings.
#[derive(Clone)]
pub struct PeerSecurity {
    /// The peer secrets.
    pub auth: Auth,
    /// The TLS client for `https://` peers.
    pub tls: Tls,
    /// The most inbound sessions at once.
    pub inbound_max: usize,
}

/// `http[s]://host[:port][/]` → (`http[s]://host:port`, host, port): the
/// node's one URL parser (`crate::url`).
fn parse_url(url: &str) -> Result<(String, String, u16), PeerUrlError> {
    let node = crate::url::NodeUrl::parse(url).map_err(|error| PeerUrlError {
        url: error.url,
        reason: error.reason,
    })?;
    Ok((node.base, node.host, node.port))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only bookkeeping happens under these locks.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_are_normalized_and_checked() {
        assert_eq!(
            parse_url("http://127.0.0.1:7071").unwrap().0,
            "http://127.0.0.1:7071"
        );
        assert_eq!(
            parse_url("http://127.0.0.1:7071/").unwrap().0,
            "http://127.0.0.1:7071"
        );
        assert_eq!(parse_url("http://node-b").unwrap().0, "http://node-b:80");
        assert_eq!(parse_url("https://node-b").unwrap().0, "https://node-b:443");
        assert!(parse_url("ftp://127.0.0.1:7071").is_err());
        assert!(parse_url("127.0.0.1:7071").is_err());
        assert!(parse_url("http://127.0.0.1:7071/x").is_err());
    }

    /// Found by the schemathesis run (`tests/schemathesis/run.sh`): these
    /// were added as peers, normalized to URLs no dial could reach (or, for
    /// `host:65530*`, to port 80).
    #[test]
    fn peer_urls_with_user_info_a_bad_port_or_a_bracketed_non_ipv6_host_are_refused() {
        assert!(parse_url("http://[zz]").is_err());
        assert!(parse_url("http://[:]").is_err());
        assert!(parse_url("http://[1.2.3.4]").is_err());
        assert!(parse_url("http://user@host").is_err());
        assert!(parse_url("http://host:65530*").is_err());
        assert!(parse_url("http://host:65536").is_err());
        assert!(parse_url("http://host:").is_err());
        assert_eq!(parse_url("http://host:08").unwrap().0, "http://host:8");
        assert_eq!(parse_url("http://[::1]:7").unwrap().0, "http://[::1]:7");
    }
}
