//! `PeerManager`: TCP sessions with configured and inbound peers.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{MemStore, Store};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use crate::rng::SplitMix64;
use crate::{Backoff, PeerDirection, Routes};
use crate::{Session, SessionConfig, SessionError, SessionState, SharedReplica};

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

/// One peer as the manager sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    /// The address dialed, or the inbound peer's address.
    pub addr: SocketAddr,
    /// Who dialed.
    pub direction: PeerDirection,
    /// Whether a session is running and the peer's hello has arrived.
    pub connected: bool,
    /// The peer's stream, from its last hello.
    pub stream: Option<StreamId>,
    /// The marks the peer has acknowledged (last session).
    pub marks: VersionVector,
    /// How many events this replica holds that the peer has not
    /// acknowledged: per stream, our mark minus its mark, summed.
    pub lag_events: u64,
    /// Sessions started with this peer (connections made).
    pub connects: u64,
    /// Why the most recent session or dial that ended badly did; kept
    /// while later sessions run.
    pub last_error: Option<String>,
    /// The current (or last) session's state and counters.
    pub session: SessionState,
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
    slots: Arc<Mutex<Vec<Arc<Slot>>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Shared by every session of this manager: a stream that arrives
    /// through one session is asked quiet on the others, and of two
    /// sessions with one peer only one is kept.
    routes: Routes,
}

struct Slot {
    addr: SocketAddr,
    direction: PeerDirection,
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    running: Option<watch::Receiver<SessionState>>,
    last: SessionState,
    connects: u64,
    last_error: Option<String>,
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
            slots: Arc::default(),
            tasks: Mutex::default(),
            routes: Routes::new(),
        };
        if let Some(listener) = listener {
            tracing::info!(local = %manager.shared.stream(), addr = ?local_addr, "sync listening");
            let task = tokio::spawn(accept_loop(
                listener,
                manager.shared.clone(),
                manager.config.clone(),
                Arc::clone(&manager.slots),
                manager.routes.clone(),
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

    /// Starts dialing `addr` (and redialing it) from now on. Must be called
    /// within a tokio runtime.
    pub fn connect(&self, addr: SocketAddr) {
        let slot = Arc::new(Slot {
            addr,
            direction: PeerDirection::Outbound,
            state: Mutex::default(),
        });
        let index = {
            let mut slots = lock(&self.slots);
            slots.push(Arc::clone(&slot));
            // The peer's index among dialed peers: inbound peers come and go
            // and must not change a dialed peer's jitter.
            slots
                .iter()
                .filter(|slot| slot.direction == PeerDirection::Outbound)
                .count() as u64
        };
        let seed = SplitMix64::derive(self.config.jitter_seed ^ self.shared.stream().get(), index);
        let backoff = Backoff::new(self.config.backoff_min, self.config.backoff_max, seed);
        let task = tokio::spawn(dial_loop(
            self.shared.clone(),
            self.config.clone(),
            slot,
            backoff,
            self.routes.clone(),
        ));
        lock(&self.tasks).push(task);
    }

    /// Every peer's state now, in the order the peers were added (configured
    /// peers first); an inbound peer is listed while its session runs.
    pub fn peers(&self) -> Vec<PeerStatus> {
        let marks = self.shared.marks();
        let slots: Vec<Arc<Slot>> = lock(&self.slots).clone();
        slots.iter().map(|slot| slot.status(&marks)).collect()
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

impl Slot {
    fn status(&self, our_marks: &VersionVector) -> PeerStatus {
        let state = lock(&self.state);
        let (running, session) = match &state.running {
            Some(receiver) => (true, receiver.borrow().clone()),
            None => (false, state.last.clone()),
        };
        PeerStatus {
            addr: self.addr,
            direction: self.direction,
            connected: running && session.peer.is_some(),
            stream: session.peer,
            marks: session.peer_marks.clone(),
            lag_events: our_marks.events_beyond(&session.peer_marks),
            connects: state.connects,
            last_error: state.last_error.clone(),
            session,
        }
    }

    fn started(&self, receiver: watch::Receiver<SessionState>) {
        let mut state = lock(&self.state);
        state.running = Some(receiver);
        state.connects += 1;
    }

    /// Records a session's end; returns whether the peer's hello had
    /// arrived (the session was established).
    fn ended(&self, result: Result<crate::SessionEnd, SessionError>) -> bool {
        let mut state = lock(&self.state);
        if let Some(receiver) = state.running.take() {
            state.last = receiver.borrow().clone();
        }
        if let Err(error) = result {
            state.last_error = Some(error.to_string());
        }
        state.last.peer.is_some()
    }

    fn failed(&self, reason: String) {
        lock(&self.state).last_error = Some(reason);
    }
}

async fn dial_loop<S: Store + Send + Sync + 'static>(
    shared: SharedReplica<S>,
    config: ManagerConfig,
    slot: Arc<Slot>,
    mut backoff: Backoff,
    routes: Routes,
) {
    let local = shared.stream();
    loop {
        match tokio::time::timeout(config.connect_timeout, TcpStream::connect(slot.addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                tracing::debug!(%local, peer_addr = %slot.addr, "dialed peer");
                let session = Session::new(shared.clone(), config.session.clone())
                    .with_routes(routes.clone(), PeerDirection::Outbound);
                slot.started(session.state());
                let started_at = tokio::time::Instant::now();
                let result = session.run(stream).await;
                let established = slot.ended(result);
                backoff.session_ended(established, started_at.elapsed());
            }
            Ok(Err(error)) => {
                tracing::debug!(%local, peer_addr = %slot.addr, %error, "dial failed");
                slot.failed(format!("dial failed: {error}"));
            }
            Err(_) => {
                tracing::debug!(%local, peer_addr = %slot.addr, "dial timed out");
                slot.failed(format!("dial timed out after {:?}", config.connect_timeout));
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

async fn accept_loop<S: Store + Send + Sync + 'static>(
    listener: TcpListener,
    shared: SharedReplica<S>,
    config: ManagerConfig,
    slots: Arc<Mutex<Vec<Arc<Slot>>>>,
    routes: Routes,
) {
    let local = shared.stream();
    // Owned here: aborting this task drops the set, which aborts every
    // inbound session.
    let mut sessions = JoinSet::new();
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
        while sessions.try_join_next().is_some() {}
        if sessions.len() >= config.inbound_max {
            tracing::warn!(%local, peer_addr = %addr, limit = config.inbound_max, "inbound peer refused: too many inbound sessions");
            continue;
        }
        let _ = stream.set_nodelay(true);
        tracing::debug!(%local, peer_addr = %addr, "accepted peer");
        let slot = Arc::new(Slot {
            addr,
            direction: PeerDirection::Inbound,
            state: Mutex::default(),
        });
        lock(&slots).push(Arc::clone(&slot));
        let session = Session::new(shared.clone(), config.session.clone())
            .with_routes(routes.clone(), PeerDirection::Inbound);
        slot.started(session.state());
        let slots = Arc::clone(&slots);
        sessions.spawn(async move {
            let result = session.run(stream).await;
            slot.ended(result);
            // An inbound peer that left is forgotten: it dials again.
            lock(&slots).retain(|other| !Arc::ptr_eq(other, &slot));
        });
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only plain bookkeeping happens under these locks; a panic elsewhere
    // leaves it consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_what_the_peer_misses() {
        let s = StreamId::new;
        let ours: VersionVector = [(s(1), 10), (s(2), 3)].into_iter().collect();
        let theirs: VersionVector = [(s(1), 4), (s(3), 9)].into_iter().collect();
        assert_eq!(ours.events_beyond(&theirs), 6 + 3);
    }
}
