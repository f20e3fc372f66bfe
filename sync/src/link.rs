//! [`PeerLink`]: one peer as a replica's driver keeps it, dialed or
//! accepted: the session running on it, how the last one ended, and for a
//! dialed peer the redial loop with its jittered [`Backoff`] and what the
//! last session learned of the peer (its hello's flags, the checkpoints
//! it holds: `PeerMemory`), which the next one starts from. The dial step
//! is injected ([`Dial`]): raw TCP for the [`PeerManager`](crate::PeerManager),
//! an HTTP upgrade with TLS and peer authentication for the node. Both
//! report peers with one type, [`PeerStatus`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::Store;
use meshlog_sync_core::proto::PeerMemory;
use meshlog_sync_core::{PeerDirection, Routes, SessionConfig, SessionState};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::lock;
use crate::{Backoff, CheckpointWants, Session, SessionEnd, SessionError, SharedReplica};

/// One peer as its link sees it now. `A` names the peer: the address
/// dialed or accepted from (the manager's, and the node's inbound
/// sessions), or the URL dialed (the node's peers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus<A = SocketAddr> {
    /// The address (or URL) dialed, or the inbound peer's address.
    pub addr: A,
    /// Who dialed.
    pub direction: PeerDirection,
    /// Whether a session is running and the peer's hello has arrived.
    pub connected: bool,
    /// The peer's stream, from its last hello.
    pub stream: Option<StreamId>,
    /// The marks the peer has acknowledged (current or last session).
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

/// The dial step of a link: connects to the peer and hands back a byte
/// stream a session can run on (after whatever the transport needs first:
/// a TLS handshake, an HTTP upgrade, a peer proof).
pub trait Dial: Send + Sync + 'static {
    /// The stream a dial gives.
    type Io: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// Dials once. The error is the reason shown in
    /// [`PeerStatus::last_error`] (`dial failed: ...`, `peer answered 404
    /// ...`): a sentence for the operator.
    fn dial(&self) -> impl Future<Output = Result<Self::Io, String>> + Send;

    /// A session starts on a dialed stream (for a driver that counts
    /// them). Nothing by default.
    fn session_started(&self) {}

    /// That session ended. Nothing by default.
    fn session_ended(&self) {}
}

/// What every session of a replica's links runs with: the replica, the
/// session settings, and the routes table and checkpoint wants they share.
#[derive(Debug, Clone)]
pub struct LinkSessions<S: Store> {
    /// The replica.
    pub shared: SharedReplica<S>,
    /// Each session's timing and limits.
    pub config: SessionConfig,
    /// Shared by every session of the replica, so that in a mesh with
    /// cycles an event arrives about once (see [`Routes`]).
    pub routes: Routes,
    /// Shared by every session of the replica: asks for checkpoints by
    /// name go to their peers (see [`CheckpointWants`]).
    pub wants: CheckpointWants,
}

impl<S: Store> LinkSessions<S> {
    /// A session with a peer reached in `direction`, in the routes table
    /// and the checkpoint wants.
    pub fn session(&self, direction: PeerDirection) -> Session<S> {
        Session::new(self.shared.clone(), self.config.clone())
            .with_routes(self.routes.clone(), direction)
            .with_checkpoint_wants(self.wants.clone())
    }
}

/// How a dialed link redials: its backoff and how long a dial may take.
#[derive(Debug, Clone)]
pub struct Redial {
    /// The delays between dials.
    pub backoff: Backoff,
    /// How long one dial may take.
    pub connect_timeout: Duration,
}

/// One peer, dialed or accepted, as its driver keeps it: the session
/// running on it (its state published live), the last session's state when
/// none runs, the sessions started and the last error.
#[derive(Debug)]
pub struct PeerLink<A = SocketAddr> {
    addr: A,
    direction: PeerDirection,
    state: Mutex<LinkState>,
    /// What the last session with the peer learned of it, which the next
    /// session dialed to it starts from (`Session::with_peer_memory`).
    memory: Arc<Mutex<PeerMemory>>,
}

#[derive(Debug, Default)]
struct LinkState {
    running: Option<watch::Receiver<SessionState>>,
    last: SessionState,
    connects: u64,
    last_error: Option<String>,
}

impl<A: Clone> PeerLink<A> {
    /// A link to the peer at `addr`, reached in `direction`, with no
    /// session yet: a peer it never met ([`PeerMemory::unmet`]: its first
    /// session dialed sends a hello against a checkpoint).
    pub fn new(addr: A, direction: PeerDirection) -> Self {
        PeerLink {
            addr,
            direction,
            state: Mutex::default(),
            memory: Arc::new(Mutex::new(PeerMemory::unmet())),
        }
    }

    /// The link starting from `memory`, what a session with the peer
    /// learned before (kept by the driver past a restart, in
    /// [`PeerMemory::to_bytes`]' form): its first session dialed goes
    /// against a checkpoint if the peer read one then. A peer that no
    /// longer does says so in its hello, and that session's hello goes
    /// again, whole (`docs/PROTOCOL.md`, "The dialer's hello").
    pub fn with_peer_memory(self, memory: PeerMemory) -> Self {
        *lock(&self.memory) = memory;
        self
    }

    /// What the last session with the peer learned of it (whether it reads
    /// a hello against a checkpoint, which checkpoints it holds): a
    /// dialed link's next session starts from it (`docs/PROTOCOL.md`,
    /// "The dialer's hello"). [`PeerMemory::unmet`] before a session
    /// heard the peer's hello (unless the link started from a memory:
    /// [`PeerLink::with_peer_memory`]); nothing (a whole hello next) after
    /// one that did not.
    pub fn peer_memory(&self) -> PeerMemory {
        lock(&self.memory).clone()
    }

    /// The peer's address (or URL).
    pub fn addr(&self) -> &A {
        &self.addr
    }

    /// Who dialed.
    pub fn direction(&self) -> PeerDirection {
        self.direction
    }

    /// The peer now, its lag counted against `our_marks`.
    pub fn status(&self, our_marks: &VersionVector) -> PeerStatus<A> {
        let state = lock(&self.state);
        let (running, session) = match &state.running {
            Some(receiver) => (true, receiver.borrow().clone()),
            None => (false, state.last.clone()),
        };
        PeerStatus {
            addr: self.addr.clone(),
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

    /// Whether a session runs on the link now.
    pub fn is_running(&self) -> bool {
        lock(&self.state).running.is_some()
    }

    /// Records a session's start, its state published by `receiver`.
    pub fn started(&self, receiver: watch::Receiver<SessionState>) {
        let mut state = lock(&self.state);
        state.running = Some(receiver);
        state.connects += 1;
    }

    /// Records a session's end and why; returns whether the peer's hello
    /// had arrived (the session was established).
    pub fn ended(&self, result: &Result<SessionEnd, SessionError>) -> bool {
        let mut state = lock(&self.state);
        if let Some(receiver) = state.running.take() {
            state.last = receiver.borrow().clone();
        }
        match result {
            Err(error) => state.last_error = Some(error.to_string()),
            Ok(SessionEnd::Duplicate { peer }) => {
                state.last_error = Some(format!(
                    "the link to stream {peer} runs on the session it dialed to this replica; \
                     this one was closed as a duplicate"
                ))
            }
            Ok(_) => {}
        }
        state.last.peer.is_some()
    }

    /// Records a dial that failed, and why.
    pub fn failed(&self, reason: String) {
        lock(&self.state).last_error = Some(reason);
    }

    /// Runs `session` over `io` on this link until it ends or `stop`
    /// completes, recording its start and end; whether it was established
    /// and how long it lasted.
    pub async fn run_session<S, IO, F>(
        &self,
        session: Session<S>,
        io: IO,
        stop: F,
    ) -> (bool, Duration)
    where
        S: Store + Send + Sync + 'static,
        IO: AsyncRead + AsyncWrite,
        F: Future,
    {
        self.started(session.state());
        let started_at = tokio::time::Instant::now();
        let result = session.run_until(io, stop).await;
        (self.ended(&result), started_at.elapsed())
    }
}

impl<A: Clone + std::fmt::Display> PeerLink<A> {
    /// Dials the peer with `dial`, runs a session on each stream it gives,
    /// and redials after each end or failure with `redial`'s backoff, until
    /// a future made by `stop` completes (it is made anew for each wait: a
    /// cancellation token's `cancelled`, or `std::future::pending` for
    /// ever).
    pub async fn dial_loop<S, D, F, Fut>(
        &self,
        sessions: LinkSessions<S>,
        dial: D,
        mut redial: Redial,
        stop: F,
    ) where
        S: Store + Send + Sync + 'static,
        D: Dial,
        F: Fn() -> Fut,
        Fut: Future<Output = ()>,
    {
        let local = sessions.shared.stream();
        loop {
            let dialed = tokio::select! {
                _ = stop() => return,
                dialed = tokio::time::timeout(redial.connect_timeout, dial.dial()) => dialed,
            };
            match dialed {
                Ok(Ok(io)) => {
                    tracing::debug!(%local, peer = %self.addr, "dialed peer");
                    dial.session_started();
                    // Its first hello goes against a checkpoint if the
                    // last session heard the peer read one.
                    let session = sessions
                        .session(PeerDirection::Outbound)
                        .with_peer_memory(Arc::clone(&self.memory));
                    let (established, lasted) = self.run_session(session, io, stop()).await;
                    dial.session_ended();
                    redial.backoff.session_ended(established, lasted);
                }
                Ok(Err(reason)) => {
                    tracing::debug!(%local, peer = %self.addr, %reason, "dial failed");
                    self.failed(reason);
                }
                Err(_) => {
                    tracing::debug!(%local, peer = %self.addr, "dial timed out");
                    self.failed(format!("dial timed out after {:?}", redial.connect_timeout));
                }
            }
            let delay = redial.backoff.next_delay();
            tokio::select! {
                _ = stop() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}
