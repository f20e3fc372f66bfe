//! `PeerManager`: TCP sessions with configured and inbound peers.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshlog_replica::{MemStore, Store};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::link::{Dial, LinkSessions, PeerLink, Redial};
use crate::lock;
use crate::{
    Backoff, CheckpointWants, PeerDirection, PeerStatus, Routes, SessionConfig, SharedReplica,
};

/// Where to listen, whom to dial, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// The address to accept inbound peers on (`None`: dial only). Port 0
    /// picks a free port; see [`PeerManager::local_addr`].
    pub listen: Option<SocketAddr>,
    /// Peers to dial and keep dialing.
    pub peers: Vec<SocketAddr>,
    /// Each session's timing and limits.
    pub session: SessionConfig,
    /// The first reconnect delay; it doubles per failed attempt, and starts
    /// over after a session that was established (the peer's hello arrived)
    /// and lasted at least `backoff_max`. Default 100 ms.
    pub backoff_min: Duration,
    /// The longest reconnect delay. Default 10 s.
    pub backoff_max: Duration,
    /// How long a dial may take. Default 5 s.
    pub connect_timeout: Duration,
    /// The most inbound sessions at once; more are refused. Default 64.
    pub inbound_max: usize,
    /// Seeds the reconnect jitter (mixed with this replica's stream and the
    /// peer's index), so that a test's schedule replays. Default 0.
    pub jitter_seed: u64,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            listen: None,
            peers: Vec::new(),
            session: SessionConfig::default(),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            inbound_max: 64,
            jitter_seed: 0,
        }
    }
}

/// Why the manager could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// The socket error.
    #[source]
    pub source: std::io::Error,
}

/// Keeps sessions with peers over TCP: dials every configured peer and
/// redials it with jittered exponential backoff whenever its session ends,
/// accepts inbound peers (up to a limit), and reports each peer's state.
///
/// One peer never blocks another or an append: each session is its own task
/// with a bounded output buffer and read/write timeouts. Dropping the
/// manager (or [`PeerManager::shutdown`]) ends every session.
///
/// If two replicas dial each other, they keep two sessions; both are
/// correct (receipt is idempotent), one is redundant.
pub struct PeerManager<S: Store = MemStore> {
    shared: SharedReplica<S>,
    config: ManagerConfig,
    local_addr: Option<SocketAddr>,
    links: Arc<Mutex<Vec<Arc<PeerLink>>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Shared by every session of this manager: a stream that arrives
    /// through one session is asked quiet on the others, and of two
    /// sessions with one peer only one is kept.
    routes: Routes,
    /// Shared by every session of this manager: asks for checkpoints by
    /// name.
    wants: CheckpointWants,
}

impl<S: Store + Send + Sync + 'static> PeerManager<S> {
    /// Binds the listener (if configured) and starts dialing every
    /// configured peer. Must be called within a tokio runtime.
    pub async fn start(shared: SharedReplica<S>, config: ManagerConfig) -> Result<Self, BindError> {
        let listener = match config.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| BindError { addr, source })?,
            ),
            None => None,
        };
        let local_addr = match &listener {
            Some(listener) => Some(listener.local_addr().map_err(|source| BindError {
                addr: config.listen.expect("a listener was bound"),
                source,
            })?),
            None => None,
        };
        let manager = PeerManager {
            shared,
            config,
            local_addr,
            links: Arc::default(),
            tasks: Mutex::default(),
            routes: Routes::new(),
            wants: CheckpointWants::new(),
        };
        if let Some(listener) = listener {
            tracing::info!(local = %manager.shared.stream(), addr = ?local_addr, "sync listening");
            let task = tokio::spawn(accept_loop(
                listener,
                manager.sessions(),
                manager.config.inbound_max,
                Arc::clone(&manager.links),
            ));
            lock(&manager.tasks).push(task);
        }
        for addr in manager.config.peers.clone() {
            manager.connect(addr);
        }
        Ok(manager)
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Asks this manager's sessions for checkpoints by name, and hears
    /// when one arrives (see [`CheckpointWants`]).
    pub fn checkpoint_wants(&self) -> &CheckpointWants {
        &self.wants
    }

    /// What every session of this manager runs with.
    fn sessions(&self) -> LinkSessions<S> {
        LinkSessions {
            shared: self.shared.clone(),
            config: self.config.session.clone(),
            routes: self.routes.clone(),
            wants: self.wants.clone(),
        }
    }

    /// Starts dialing `addr` (and redialing it) from now on. Must be called
    /// within a tokio runtime.
    pub fn connect(&self, addr: SocketAddr) {
        let link = Arc::new(PeerLink::new(addr, PeerDirection::Outbound));
        let index = {
            let mut links = lock(&self.links);
            links.push(Arc::clone(&link));
            // The peer's index among dialed peers: inbound peers come and go
            // and must not change a dialed peer's jitter.
            links
                .iter()
                .filter(|link| link.direction() == PeerDirection::Outbound)
                .count() as u64
        };
        let redial = Redial {
            backoff: Backoff::for_link(
                self.config.backoff_min,
                self.config.backoff_max,
                self.config.jitter_seed,
                self.shared.stream(),
                index,
            ),
            connect_timeout: self.config.connect_timeout,
        };
        let sessions = self.sessions();
        let task = tokio::spawn(async move {
            link.dial_loop(sessions, TcpDial(addr), redial, std::future::pending::<()>)
                .await;
        });
        lock(&self.tasks).push(task);
    }

    /// Every peer's state now, in the order the peers were added (configured
    /// peers first); an inbound peer is listed while its session runs.
    pub fn peers(&self) -> Vec<PeerStatus> {
        let marks = self.shared.marks();
        let links: Vec<Arc<PeerLink>> = lock(&self.links).clone();
        links.iter().map(|link| link.status(&marks)).collect()
    }

    /// Ends every session and stops dialing and accepting.
    pub async fn shutdown(self) {
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}

impl<S: Store> Drop for PeerManager<S> {
    fn drop(&mut self) {
        for task in lock(&self.tasks).iter() {
            task.abort();
        }
    }
}

/// The manager's dial step: a TCP connection, no delay.
struct TcpDial(SocketAddr);

impl Dial for TcpDial {
    type Io = TcpStream;

    async fn dial(&self) -> Result<TcpStream, String> {
        let stream = TcpStream::connect(self.0)
            .await
            .map_err(|error| format!("dial failed: {error}"))?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

async fn accept_loop<S: Store + Send + Sync + 'static>(
    listener: TcpListener,
    sessions: LinkSessions<S>,
    inbound_max: usize,
    links: Arc<Mutex<Vec<Arc<PeerLink>>>>,
) {
    let local = sessions.shared.stream();
    // Owned here: aborting this task drops the set, which aborts every
    // inbound session.
    let mut running = JoinSet::new();
    loop {
        let (stream, addr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!(%local, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while running.try_join_next().is_some() {}
        if running.len() >= inbound_max {
            tracing::warn!(%local, peer_addr = %addr, limit = inbound_max, "inbound peer refused: too many inbound sessions");
            continue;
        }
        let _ = stream.set_nodelay(true);
        tracing::debug!(%local, peer_addr = %addr, "accepted peer");
        let link = Arc::new(PeerLink::new(addr, PeerDirection::Inbound));
        lock(&links).push(Arc::clone(&link));
        let session = sessions.session(PeerDirection::Inbound);
        let links = Arc::clone(&links);
        running.spawn(async move {
            link.run_session(session, stream, std::future::pending::<()>())
                .await;
            // An inbound peer that left is forgotten: it dials again.
            lock(&links).retain(|other| !Arc::ptr_eq(other, &link));
        });
    }
}

#[cfg(test)]
mod tests {
    use meshlog_cursor::{StreamId, VersionVector};

    #[test]
    fn lag_counts_what_the_peer_misses() {
        let s = StreamId::new;
        let ours: VersionVector = [(s(1), 10), (s(2), 3)].into_iter().collect();
        let theirs: VersionVector = [(s(1), 4), (s(3), 9)].into_iter().collect();
        assert_eq!(ours.events_beyond(&theirs), 6 + 3);
    }
}
