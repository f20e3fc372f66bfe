//! `SimMesh`: replicas joined by in-memory fault links that reconnect.

use std::time::Duration;

use meshlog_replica::{MemStore, Store};
use meshlog_testkit::SplitMix64;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::proxy::{FaultLink, Faults, LinkControl};
use crate::{PeerDirection, Routes, Session, SessionConfig, SharedReplica};

/// How a [`SimMesh`] runs its sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshConfig {
    /// Every session's timing and limits.
    pub session: SessionConfig,
    /// After a session ends, the link reconnects after a delay drawn
    /// uniformly from `backoff_min ..= backoff_max` (from the link's seed).
    pub backoff_min: Duration,
    /// See `backoff_min`.
    pub backoff_max: Duration,
}

impl Default for MeshConfig {
    /// Fast timings for tests: heartbeats every 20 ms, timeouts after 10
    /// heartbeats, reconnects after 10 to 100 ms.
    fn default() -> Self {
        MeshConfig {
            session: SessionConfig::with_heartbeat(Duration::from_millis(20)),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(100),
        }
    }
}

/// The replicas of a mesh did not converge in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("replicas did not converge within {within:?}: {detail}")]
pub struct Divergence {
    /// The time allowed.
    pub within: Duration,
    /// Each replica's stream, marks and digest.
    pub detail: String,
}

/// Replicas joined by [`FaultLink`]s. Each link runs one session per side
/// and, whenever either ends (a timeout during a partition, a severed
/// connection), reconnects after a jittered delay: what a [`crate::PeerManager`]
/// does over TCP, in memory, so that a run can use tokio's paused clock.
///
/// Dropping the mesh stops every link.
pub struct SimMesh<S: Store = MemStore> {
    replicas: Vec<SharedReplica<S>>,
    /// Each replica's routing table, shared by its sessions.
    routes: Vec<Routes>,
    config: MeshConfig,
    links: Vec<MeshLink>,
}

struct MeshLink {
    ends: (usize, usize),
    control: LinkControl,
    task: JoinHandle<()>,
}

impl<S: Store + Send + Sync + 'static> SimMesh<S> {
    /// A mesh of `replicas`, with no links yet.
    pub fn new(replicas: Vec<SharedReplica<S>>, config: MeshConfig) -> Self {
        SimMesh {
            routes: replicas.iter().map(|_| Routes::new()).collect(),
            replicas,
            config,
            links: Vec::new(),
        }
    }

    /// Links replicas `a` and `b` (indices) through a fault link seeded with
    /// `seed`, and starts its sessions. Must be called within a tokio
    /// runtime.
    ///
    /// # Panics
    ///
    /// If `a` or `b` is not a replica's index, or `a == b`.
    pub fn link(&mut self, a: usize, b: usize, seed: u64, faults: Faults) -> LinkControl {
        assert!(a != b, "a replica cannot be linked to itself");
        let link = FaultLink::new(seed, faults);
        let control = link.control();
        let task = tokio::spawn(run_link(
            link,
            (self.replicas[a].clone(), self.routes[a].clone()),
            (self.replicas[b].clone(), self.routes[b].clone()),
            self.config.clone(),
            SplitMix64::new(SplitMix64::derive(seed, u64::MAX)),
        ));
        self.links.push(MeshLink {
            ends: (a, b),
            control: control.clone(),
            task,
        });
        control
    }

    /// The replicas, by index.
    pub fn replicas(&self) -> &[SharedReplica<S>] {
        &self.replicas
    }

    /// Every link: its two replicas' indices and its control.
    pub fn links(&self) -> impl Iterator<Item = ((usize, usize), &LinkControl)> {
        self.links.iter().map(|link| (link.ends, &link.control))
    }

    /// Cuts every link of replica `i`.
    pub fn isolate(&self, i: usize) {
        for link in &self.links {
            if link.ends.0 == i || link.ends.1 == i {
                link.control.cut();
            }
        }
    }

    /// Heals every partition and clears every link's faults.
    pub fn heal_all(&self) {
        for link in &self.links {
            link.control.heal();
            link.control.set_faults(Faults::none());
        }
    }

    /// Whether every replica has the same marks and digest.
    pub fn converged(&self) -> bool {
        let Some(first) = self.replicas.first() else {
            return true;
        };
        let (marks, digest) = (first.marks(), first.digest());
        self.replicas
            .iter()
            .all(|replica| replica.marks() == marks && replica.digest() == digest)
    }

    /// Waits until [`SimMesh::converged`], checking every millisecond of
    /// (possibly paused) tokio time; returns how long it took.
    pub async fn wait_converged(&self, within: Duration) -> Result<Duration, Divergence> {
        let start = Instant::now();
        loop {
            if self.converged() {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                return Err(Divergence {
                    within,
                    detail: self.describe(),
                });
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Each replica's stream, marks, floor and digest, one per line.
    pub fn describe(&self) -> String {
        self.replicas
            .iter()
            .map(|replica| {
                format!(
                    "\n  replica {}: marks {:?} floor {:?} digest {:?} pending {}",
                    replica.stream(),
                    replica.marks(),
                    replica.floor(),
                    replica.digest(),
                    replica.pending_len(),
                )
            })
            .collect()
    }
}

impl<S: Store> Drop for SimMesh<S> {
    fn drop(&mut self) {
        for link in &self.links {
            link.task.abort();
        }
    }
}

async fn run_link<S: Store + Send + Sync + 'static>(
    link: FaultLink,
    (a, a_routes): (SharedReplica<S>, Routes),
    (b, b_routes): (SharedReplica<S>, Routes),
    config: MeshConfig,
    mut rng: SplitMix64,
) {
    loop {
        let (a_end, b_end) = link.connect();
        // The first end dials: it is the side the link's direction names
        // first, and the one whose dial counts when two links join the
        // same replicas.
        let a_session = Session::new(a.clone(), config.session.clone())
            .with_routes(a_routes.clone(), PeerDirection::Outbound);
        let b_session = Session::new(b.clone(), config.session.clone())
            .with_routes(b_routes.clone(), PeerDirection::Inbound);
        // When one side ends, the other's stream is dropped with it: what a
        // closed connection does to the far end.
        tokio::select! {
            biased;
            _ = a_session.run(a_end) => {}
            _ = b_session.run(b_end) => {}
        }
        let min_ms = config.backoff_min.as_millis() as u64;
        let max_ms = (config.backoff_max.as_millis() as u64).max(min_ms);
        let delay_ms = min_ms + rng.below(max_ms - min_ms + 1);
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
}
