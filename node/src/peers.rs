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
//! The link itself (status, the session running, the last error, the
//! redial loop and its jittered backoff) is `meshlog_sync::PeerLink`, the
//! one `meshlog_sync::PeerManager` keeps too; this module injects the dial
//! step (`HttpDial`: TCP, TLS for `https://`, the `GET /sync` upgrade and
//! the peer proof) and counts the sessions in the node's metrics. What
//! each link's sessions learned of its peer outlives a restart in the data
//! directory's `peer-memory` file (`crate::peer_memory`): a link starts
//! from it, and a session that ends with something new has it written.

use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use meshlog_cursor::VersionVector;
use meshlog_replica::DiskStore;
use meshlog_sync::{
    Backoff, CheckpointWants, Dial, LinkSessions, PeerDirection, PeerLink, Redial, Routes,
    SessionConfig,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::Auth;
use crate::config::SyncSettings;
use crate::lock;
use crate::metrics::{Metrics, SessionTotals};
use crate::peer_auth;
use crate::peer_memory::{Memories, PeerMemoryFile};
use crate::replica::NodeReplica;
use crate::tls::Tls;

// Defined beside the upgrade that names them (`peer_auth::upgrade`), so
// that the handshake does not import the links that use it; named here too
// for the node's other users of the links.
pub(crate) use crate::peer_auth::{REFUSED_PREFIX, SYNC_PROTOCOL};

/// One dialed peer as the node sees it now: the link's status, the peer
/// named by its normalized URL (`http://host:port`).
pub type PeerStatus = meshlog_sync::PeerStatus<String>;

/// One inbound session (a peer that dialed this node) as the node sees it
/// now: the link's status, the peer named by the address its connection
/// came from.
pub type InboundStatus = meshlog_sync::PeerStatus<std::net::SocketAddr>;

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
    dialed: Mutex<Vec<Dialed>>,
    /// The running inbound sessions, in the order they started.
    inbound: Mutex<Vec<Arc<PeerLink<std::net::SocketAddr>>>>,
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
    /// Shared by every session of this node: the reads' asks for a
    /// checkpoint by name (`crate::read::CheckpointFetch`).
    wants: CheckpointWants,
    /// The counters of every session that ended (dialed and inbound),
    /// added once its link no longer shows it running: with the running
    /// sessions', what the metrics show ([`Peers::session_totals`]).
    sessions_ended: Mutex<SessionTotals>,
    /// The data directory's `peer-memory` file: what the dialed links
    /// start from, and where what they learn is written.
    memory: PeerMemoryFile,
}

/// A dialed peer: its link, and the token that stops its dial loop.
#[derive(Clone)]
struct Dialed {
    link: Arc<PeerLink<String>>,
    stop: CancellationToken,
}

impl Peers {
    /// No peers yet; `stop` ends every link when cancelled. At most
    /// `inbound_max` inbound sessions run at once. Each peer added starts
    /// from what `memory` remembers of it.
    pub(crate) fn new(
        replica: NodeReplica,
        settings: SyncSettings,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
        security: PeerSecurity,
        memory: PeerMemoryFile,
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
                wants: CheckpointWants::new(),
                sessions_ended: Mutex::default(),
                memory,
            }),
        }
    }

    /// Asks every session of this node (dialed or inbound) for a
    /// checkpoint by name, and hears when one arrives.
    pub(crate) fn checkpoint_wants(&self) -> CheckpointWants {
        self.inner.wants.clone()
    }

    /// What every session of this node runs with.
    fn sessions(&self) -> LinkSessions<DiskStore> {
        let settings = &self.inner.settings;
        LinkSessions {
            shared: self.inner.replica.sync_handle(),
            config: SessionConfig {
                frame_bytes_max: settings.frame_bytes_max,
                checkpoints: settings.checkpoints,
                ..SessionConfig::with_heartbeat(settings.heartbeat)
            },
            routes: self.inner.routes.clone(),
            wants: self.inner.wants.clone(),
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
        let dialed = {
            let mut dialed = lock(&self.inner.dialed);
            if dialed.iter().any(|peer| *peer.link.addr() == normalized) {
                return Ok((normalized, false));
            }
            let memory = self.inner.memory.remembered(&normalized);
            let link =
                PeerLink::new(normalized.clone(), PeerDirection::Outbound).with_peer_memory(memory);
            let peer = Dialed {
                link: Arc::new(link),
                stop: self.inner.stop.child_token(),
            };
            dialed.push(peer.clone());
            peer
        };
        let index = {
            let mut added = lock(&self.inner.added);
            *added += 1;
            *added
        };
        let settings = &self.inner.settings;
        let redial = Redial {
            backoff: Backoff::for_link(
                settings.backoff_min,
                settings.backoff_max,
                0,
                self.inner.replica.stream(),
                index,
            ),
            connect_timeout: settings.connect_timeout,
        };
        let dial = HttpDial {
            peers: self.clone(),
            link: Arc::clone(&dialed.link),
            tls,
            host,
            port,
        };
        let sessions = self.sessions();
        tracing::info!(peer = %normalized, "peer added");
        self.inner.tasks.spawn(async move {
            let stop = dialed.stop;
            dialed
                .link
                .dial_loop(sessions, dial, redial, || stop.clone().cancelled_owned())
                .await;
        });
        Ok((normalized, true))
    }

    /// Stops dialing `url` and ends its session. Returns whether it was a
    /// peer; a URL that is no node URL could never have been added, and is
    /// refused as [`Peers::add`] refuses it.
    pub fn remove(&self, url: &str) -> Result<bool, PeerUrlError> {
        let (normalized, _, _) = parse_url(url)?;
        let removed: Vec<Dialed> = {
            let mut dialed = lock(&self.inner.dialed);
            let (removed, kept) = std::mem::take(&mut *dialed)
                .into_iter()
                .partition(|peer| *peer.link.addr() == normalized);
            *dialed = kept;
            removed
        };
        for peer in &removed {
            peer.stop.cancel();
            tracing::info!(peer = %peer.link.addr(), "peer removed");
        }
        Ok(!removed.is_empty())
    }

    /// Every dialed peer's state, in the order they were added.
    pub fn list(&self) -> Vec<PeerStatus> {
        let marks = self.inner.replica.marks();
        let dialed: Vec<Dialed> = lock(&self.inner.dialed).clone();
        dialed.iter().map(|peer| peer.link.status(&marks)).collect()
    }

    /// The marks every known peer (dialed, or inbound now) has
    /// acknowledged: what compaction must not pass.
    pub fn acknowledged(&self) -> Vec<VersionVector> {
        let dialed = self
            .list()
            .into_iter()
            .map(|peer| (peer.stream, peer.marks));
        let inbound = self
            .inbound()
            .into_iter()
            .map(|peer| (peer.stream, peer.marks));
        dialed
            .chain(inbound)
            .filter(|(stream, _)| stream.is_some())
            .map(|(_, marks)| marks)
            .collect()
    }

    /// The inbound sessions running now (peers that dialed this node), in
    /// the order they started; one that ended is no longer listed.
    pub fn inbound(&self) -> Vec<InboundStatus> {
        let marks = self.inner.replica.marks();
        let inbound: Vec<Arc<PeerLink<std::net::SocketAddr>>> = lock(&self.inner.inbound).clone();
        inbound.iter().map(|link| link.status(&marks)).collect()
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
            let link = Arc::new(PeerLink::new(remote, PeerDirection::Inbound));
            lock(&peers.inner.inbound).push(Arc::clone(&link));
            peers.inner.metrics.sessions_running.inc();
            let session = peers.sessions().session(PeerDirection::Inbound);
            link.run_session(session, io, peers.inner.stop.cancelled())
                .await;
            // Off the list before the count drops: what reads 0 sessions
            // then lists none.
            lock(&peers.inner.inbound).retain(|other| !Arc::ptr_eq(other, &link));
            peers.session_ended(&link);
            peers.inner.metrics.sessions_running.dec();
        });
    }

    /// The sync sessions' counters summed over every session of this
    /// node since it started: those that ended, and those established now
    /// (a session before its peer's hello has counted none of them).
    pub fn session_totals(&self) -> SessionTotals {
        let mut totals = *lock(&self.inner.sessions_ended);
        let dialed = self
            .list()
            .into_iter()
            .map(|peer| (peer.connected, peer.session));
        let inbound = self
            .inbound()
            .into_iter()
            .map(|peer| (peer.connected, peer.session));
        for (_, session) in dialed.chain(inbound).filter(|(connected, _)| *connected) {
            totals.add(&session);
        }
        totals
    }

    /// Adds the last session of `link`, which no longer runs, to the
    /// ended sessions' counters.
    fn session_ended<A: Clone>(&self, link: &PeerLink<A>) {
        let last = link.status(&VersionVector::new()).session;
        lock(&self.inner.sessions_ended).add(&last);
    }

    /// The dialed links' memories now, by URL.
    fn memories(&self) -> Memories {
        lock(&self.inner.dialed)
            .iter()
            .map(|peer| (peer.link.addr().clone(), peer.link.peer_memory()))
            .collect()
    }

    /// Writes the dialed links' memories to the `peer-memory` file, off
    /// the runtime, if they differ from what it holds.
    fn write_memory(&self) {
        if !self.inner.memory.differs(&self.memories()) {
            return;
        }
        let peers = self.clone();
        // Each write takes the memories as they are when it runs, under
        // the file's lock: the last one to run writes the newest.
        self.inner
            .tasks
            .spawn_blocking(move || peers.inner.memory.write(&peers.memories()));
    }

    /// Ends every session and dial loop and waits for them; then writes
    /// what the links learned, if that is new.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        let peers = self.clone();
        let _ =
            tokio::task::spawn_blocking(move || peers.inner.memory.write(&peers.memories())).await;
    }
}

/// The node's dial step: TCP (and TLS for `https://`), the `GET /sync`
/// upgrade and the peer proof; each session on it counted in the metrics.
struct HttpDial {
    peers: Peers,
    /// The link it dials for: its last session's counters are added to the
    /// node's when the session ends.
    link: Arc<PeerLink<String>>,
    tls: bool,
    host: String,
    port: u16,
}

impl Dial for HttpDial {
    type Io = TokioIo<hyper::upgrade::Upgraded>;

    async fn dial(&self) -> Result<Self::Io, String> {
        let io = dial(&self.peers, self).await?;
        tracing::debug!(host = %self.host, port = self.port, "sync upgrade accepted");
        Ok(io)
    }

    fn session_started(&self) {
        self.peers.inner.metrics.sessions_running.inc();
    }

    fn session_ended(&self) {
        // The link already shows the session ended (`PeerLink::ended`), so
        // a scrape meanwhile counts it neither running nor ended, never
        // both.
        self.peers.session_ended(&self.link);
        self.peers.inner.metrics.sessions_running.dec();
        // The session left what it learned of the peer to the link.
        self.peers.write_memory();
    }
}

/// A connection to a peer: plain TCP or TLS over it.
type PeerIo = Box<dyn PeerStream>;

/// What a peer connection needs to be.
trait PeerStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> PeerStream for T {}

/// Connects to the peer: TCP, and TLS over it for `https://`.
async fn connect(peers: &Peers, slot: &HttpDial) -> Result<PeerIo, String> {
    let tcp = TcpStream::connect((slot.host.as_str(), slot.port))
        .await
        .map_err(|error| format!("dial failed: {error}"))?;
    let _ = tcp.set_nodelay(true);
    if !slot.tls {
        return Ok(Box::new(tcp));
    }
    let client = peers
        .inner
        .tls
        .client
        .clone()
        .ok_or("an https:// peer needs --tls-ca")?;
    Ok(Box::new(
        crate::tls::connect(client, &slot.host, tcp).await?,
    ))
}

/// Connects to the peer (over TLS for `https://`), upgrades `GET /sync`
/// to the sync protocol, and passes the peer handshake if this node has
/// peer secrets.
async fn dial(peers: &Peers, slot: &HttpDial) -> Result<TokioIo<hyper::upgrade::Upgraded>, String> {
    let io = connect(peers, slot).await?;
    let authority = format!("{}:{}", slot.host, slot.port);
    peer_auth::upgrade(io, &authority, peers.inner.auth.peer_keys().first()).await
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
