//! [`Mesh`]: replicas, the links between them, the protocol sessions on
//! those links and the writers, run by one event loop on a simulated clock.
//!
//! A link joins two replicas; one dials (its session is
//! [`PeerDirection::Outbound`]), the other listens. While both are up and
//! the link is not cut, the dialer's redial connects it: two fresh
//! [`Protocol`]s, one per side, sharing each replica's [`Routes`] with its
//! other sessions. A connection is numbered (its epoch); a frame of an
//! older connection that arrives is dropped, as bytes of a closed TCP
//! connection are. A session that fails (a read timeout across a cut link,
//! a protocol error) or is a duplicate closes the connection, both sides at
//! once, and the dialer redials after a jittered backoff (100 ms doubling
//! to 2 s, as `meshlog_sync::Backoff::for_link` does).
//!
//! A writer is a runtime's own stream: a replica of its own (in memory)
//! whose events its home replica takes as a delta (`delta_columns_for` the
//! home's marks, `apply_columns`), the path a received delta takes, at
//! each append while the home is up and at its restart otherwise.
//!
//! A stopped replica keeps its store (a [`MemStore`] survives a stop as a
//! `DiskStore` survives a restart) and reopens it with [`Replica::open`];
//! its routes and sessions are gone, as a process's are.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshlog_cursor::{token, CheckpointName, StreamId, TokenError, VersionVector};
use meshlog_replica::{Commits, Config, MemStore, Replica, SharedReplica};
use meshlog_sync_core::frame::LENGTH_PREFIX_BYTES;
use meshlog_sync_core::proto::{PeerMemory, Protocol, Received};
use meshlog_sync_core::{PeerDirection, ProtocolError, Routes, SessionConfig};
use meshlog_testkit::SplitMix64;

use crate::net::NetConfig;
use crate::queue::Queue;
use crate::topology;

/// The wall-clock time of simulated time zero, in ms since the Unix epoch
/// (events carry a time; the simulator's is its clock, so runs replay).
const SIM_EPOCH_MS: u64 = 1_800_000_000_000;

/// The redial backoff: its first delay, and the most it doubles to.
const REDIAL_FIRST: Duration = Duration::from_millis(100);
const REDIAL_MAX: Duration = Duration::from_secs(2);

/// What a mesh is made of.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// The run's seed: every draw of the run comes from it.
    pub seed: u64,
    /// Replicas (nodes of the mesh).
    pub replicas: usize,
    /// Of them, how many start down and empty, to join later
    /// ([`Mesh::join`]).
    pub late_joiners: usize,
    /// Writers, each homed on a replica (writer `i` on replica
    /// `i % replicas`, skipping late joiners).
    pub writers: usize,
    /// Links beyond a random spanning tree.
    pub extra_links: usize,
    /// What every link does to a frame.
    pub net: NetConfig,
    /// Every session's configuration.
    pub session: SessionConfig,
    /// Each event's payload length.
    pub payload_bytes: usize,
}

/// What the run did, summed over every link and session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Frames handed to the network, and their bytes (length prefix
    /// included).
    pub frames_sent: u64,
    /// Bytes of those frames.
    pub bytes_sent: u64,
    /// Frames the network lost (drawn, or sent across a cut link).
    pub frames_lost: u64,
    /// Extra copies the network delivered.
    pub frames_duplicated: u64,
    /// Frames that arrived for a connection already closed.
    pub frames_stale: u64,
    /// Connections opened (both sessions of a link).
    pub connections: u64,
    /// Events applied by replicas from deltas.
    pub events_applied: u64,
    /// Events received that the replica already held.
    pub events_duplicate: u64,
    /// Events appended by writers.
    pub events_written: u64,
    /// Why sessions ended: the error's kind, counted.
    pub session_ends: BTreeMap<String, u64>,
    /// Frames and bytes sent per frame kind (`docs/PROTOCOL.md`, "Frame
    /// kinds": the payload's first byte).
    pub by_kind: BTreeMap<&'static str, (u64, u64)>,
    /// Checkpoints the replicas minted (`Replica::mint_checkpoint`, asked
    /// by each session once a heartbeat interval, as the tokio driver
    /// asks), counted per mint: replicas that mint the same marks mint
    /// the same checkpoint, counted once each.
    pub checkpoints_minted: u64,
    /// Of them, distinct checkpoints (by name).
    pub checkpoints_distinct: u64,
    /// Checkpoints received from a peer that the replica kept (new to it).
    pub checkpoints_kept: u64,
    /// Checkpoint gossip frames sent (kinds 6 `Checkpoint` and 7
    /// `CheckpointWant`, the protocol's own), length prefix included.
    pub checkpoint_frames: u64,
    /// Bytes of those frames.
    pub checkpoint_bytes: u64,
}

/// A frame's kind from its first payload byte (`docs/PROTOCOL.md`).
fn kind_name(kind: Option<&u8>) -> &'static str {
    match kind {
        Some(0) => "hello",
        Some(1) => "delta",
        Some(2) => "ack",
        Some(3) => "heartbeat",
        Some(4) => "routes",
        Some(5) => "bare ack",
        Some(6) => "checkpoint",
        Some(7) => "checkpoint want",
        Some(8) => "statement",
        Some(9) => "hello against",
        _ => "other",
    }
}

/// What the event loop does at a time.
#[derive(Debug)]
enum Ev {
    /// A frame arrives at `side` of `link`, for connection `epoch`.
    Deliver {
        link: usize,
        side: usize,
        epoch: u64,
        payload: Bytes,
    },
    /// A session's `poll_timeout` is due.
    Wake {
        link: usize,
        side: usize,
        epoch: u64,
    },
    /// The dialer of `link` tries to connect.
    Redial { link: usize },
}

struct Node {
    stream: StreamId,
    replica: Option<SharedReplica<MemStore>>,
    /// The store of a stopped replica, reopened at restart.
    store: Option<MemStore>,
    routes: Routes,
    links: Vec<usize>,
}

struct Session {
    protocol: Protocol,
    /// The time of the wake-up scheduled last (others are stale).
    wake_at: Option<Duration>,
    /// When this session next asks its replica to mint a checkpoint (at
    /// a wake-up once this is past, then a heartbeat interval later: the
    /// tokio driver's `mint_at`).
    mint_at: Duration,
}

struct Link {
    /// The nodes: `ends[0]` dials, `ends[1]` listens.
    ends: [usize; 2],
    cut: bool,
    epoch: u64,
    sessions: Option<[Session; 2]>,
    redial_scheduled: bool,
    backoff: Duration,
    /// Bytes sent on this link (both ways), for the heartbeat figure.
    bytes_sent: u64,
    /// What the dialer's last session learned of the listener, which its
    /// next session starts from (the tokio driver's `PeerLink` memory,
    /// which the node keeps on disk: a restart keeps it too).
    memory: PeerMemory,
}

struct Writer {
    replica: SharedReplica<MemStore>,
    home: usize,
}

/// A simulated mesh (see the module docs).
pub struct Mesh {
    config: MeshConfig,
    rng: SplitMix64,
    base: Instant,
    now: Duration,
    queue: Queue<Ev>,
    nodes: Vec<Node>,
    links: Vec<Link>,
    writers: Vec<Writer>,
    /// The mesh's retention target: every replica compacts to it, at once
    /// if up, at its restart otherwise.
    retention: VersionVector,
    counters: Counters,
    fingerprint: u64,
    steps: u64,
    /// The names of the checkpoints minted so far (for the distinct count).
    minted: BTreeSet<CheckpointName>,
}

impl Mesh {
    /// A mesh as `config` says: replicas up (but the late joiners), a
    /// random connected topology, writers homed, and every link dialed at
    /// time zero.
    pub fn new(config: MeshConfig) -> Self {
        let mut rng = SplitMix64::new(config.seed);
        let mut ids = std::collections::BTreeSet::new();
        // Random ids, as a mesh's runtimes have: they cost what real ones
        // cost in marks and tokens.
        let mut fresh_id = |rng: &mut SplitMix64| loop {
            let id = rng.next_u64() >> 1;
            if id != 0 && ids.insert(id) {
                return StreamId::new(id);
            }
        };
        let nodes: Vec<Node> = (0..config.replicas)
            .map(|i| {
                let stream = fresh_id(&mut rng);
                let up = i < config.replicas - config.late_joiners;
                Node {
                    stream,
                    replica: up.then(|| SharedReplica::in_memory(stream)),
                    store: None,
                    routes: Routes::new(),
                    links: Vec::new(),
                }
            })
            .collect();
        let homes = config.replicas - config.late_joiners;
        let writers = (0..config.writers)
            .map(|i| Writer {
                replica: SharedReplica::in_memory(fresh_id(&mut rng)),
                home: i % homes.max(1),
            })
            .collect();
        let edges = topology::random_connected(config.replicas, config.extra_links, &mut rng);
        let mut mesh = Mesh {
            base: Instant::now(),
            now: Duration::ZERO,
            queue: Queue::new(),
            nodes,
            links: Vec::new(),
            writers,
            retention: VersionVector::new(),
            counters: Counters::default(),
            fingerprint: 0xcbf2_9ce4_8422_2325,
            steps: 0,
            minted: BTreeSet::new(),
            rng,
            config,
        };
        for (dialer, listener) in edges {
            let link = mesh.links.len();
            mesh.links.push(Link {
                ends: [dialer, listener],
                cut: false,
                epoch: 0,
                sessions: None,
                redial_scheduled: false,
                backoff: REDIAL_FIRST,
                bytes_sent: 0,
                memory: PeerMemory::unmet(),
            });
            mesh.nodes[dialer].links.push(link);
            mesh.nodes[listener].links.push(link);
            mesh.schedule_redial(link, Duration::ZERO);
        }
        mesh
    }

    /// The configuration.
    pub fn config(&self) -> &MeshConfig {
        &self.config
    }

    /// The simulated time since the start.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Events handled so far (the step a failed check names).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The run's generator, for the scenario's own draws (so they replay
    /// with the run).
    pub fn rng(&mut self) -> &mut SplitMix64 {
        &mut self.rng
    }

    /// What the run did so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// A fingerprint of the whole run so far: every frame delivered (its
    /// time, link, side and bytes), every operation, in order. Two runs of
    /// one seed have the same.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The replicas' count.
    pub fn replicas(&self) -> usize {
        self.nodes.len()
    }

    /// Replica `node`'s handle, if it is up.
    pub fn replica(&self, node: usize) -> Option<&SharedReplica<MemStore>> {
        self.nodes[node].replica.as_ref()
    }

    /// The replicas up.
    pub fn up(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&n| self.nodes[n].replica.is_some())
            .collect()
    }

    /// The links, as `(dialer, listener)`.
    pub fn links(&self) -> Vec<(usize, usize)> {
        self.links.iter().map(|l| (l.ends[0], l.ends[1])).collect()
    }

    /// Bytes sent on each link so far, both ways.
    pub fn link_bytes(&self) -> Vec<u64> {
        self.links.iter().map(|l| l.bytes_sent).collect()
    }

    /// Links with a connection up.
    pub fn connected(&self) -> usize {
        self.links.iter().filter(|l| l.sessions.is_some()).count()
    }

    /// The graph's diameter in hops.
    pub fn diameter(&self) -> usize {
        topology::diameter(self.nodes.len(), &self.links())
    }

    /// Writers.
    pub fn writers(&self) -> usize {
        self.writers.len()
    }

    /// What the writers wrote: every writer's head, joined. A converged
    /// mesh's marks.
    pub fn written(&self) -> VersionVector {
        let mut marks = VersionVector::new();
        for writer in &self.writers {
            marks.advance(
                writer.replica.stream(),
                writer.replica.marks().get(writer.replica.stream()),
            );
        }
        marks
    }

    /// Drops the writers' own replicas (what they wrote stays in
    /// [`Mesh::written`]'s answer no more: call it first), so that what
    /// is left in memory is the mesh's.
    pub fn drop_writers(&mut self) {
        self.writers.clear();
    }

    /// Writer `writer` appends one event, handed to its home at once if
    /// the home is up.
    pub fn append(&mut self, writer: usize) {
        let payload = vec![(writer % 251) as u8; self.config.payload_bytes];
        let event = self.writers[writer]
            .replica
            .append_at(payload, SIM_EPOCH_MS + self.now.as_millis() as u64)
            .expect("an in-memory writer appends");
        self.counters.events_written += 1;
        self.mix(&[1, writer as u64, event.seq]);
        self.hand_to_home(writer);
    }

    /// Hands a writer's events its home lacks to the home, if it is up.
    fn hand_to_home(&mut self, writer: usize) {
        let home = self.writers[writer].home;
        let Some(replica) = &self.nodes[home].replica else {
            return;
        };
        let columns = self.writers[writer]
            .replica
            .try_delta_columns_for(&replica.marks(), self.config.session.delta_budget())
            .expect("an in-memory writer reads its events");
        if columns.is_empty() {
            return;
        }
        let report = replica
            .apply_columns(columns)
            .expect("a writer's own events apply to its home");
        if report.applied > 0 {
            self.marks_changed(home);
        }
    }

    /// Writers `writers` stop writing, as runtimes that leave do: every
    /// replica compacts their streams whole, up to what each wrote
    /// ([`Mesh::compact_all`]: at once if up, at its restart otherwise;
    /// a replica that lacks some of their events compacts what it holds).
    /// What they wrote stays in [`Mesh::written`].
    pub fn retire(&mut self, writers: std::ops::Range<usize>) {
        let target: VersionVector = self.writers[writers]
            .iter()
            .map(|writer| {
                let stream = writer.replica.stream();
                (stream, writer.replica.marks().get(stream))
            })
            .collect();
        self.compact_all(&target);
    }

    /// Every replica up compacts to the mesh's retention target again,
    /// as a retention policy it runs would: what arrived since of the
    /// streams it names (a retired writer's last events, which reached
    /// this replica after the others compacted) goes too, so that the
    /// floors meet.
    pub fn reapply_retention(&mut self) {
        self.compact_all(&VersionVector::new());
    }

    /// Cuts `link`: every frame on it is lost until it heals (the sessions
    /// time out; redials fail).
    pub fn cut(&mut self, link: usize) {
        self.links[link].cut = true;
        self.mix(&[2, link as u64]);
    }

    /// Heals `link`.
    pub fn heal(&mut self, link: usize) {
        self.links[link].cut = false;
        self.mix(&[3, link as u64]);
    }

    /// Heals every link.
    pub fn heal_all(&mut self) {
        for link in 0..self.links.len() {
            if self.links[link].cut {
                self.heal(link);
            }
        }
    }

    /// Stops replica `node`, as a process stops: its sessions close, its
    /// store is kept.
    pub fn stop(&mut self, node: usize) {
        let Some(replica) = self.nodes[node].replica.take() else {
            return;
        };
        self.mix(&[4, node as u64]);
        for link in self.nodes[node].links.clone() {
            self.close(link, "peer stopped");
        }
        let Ok(replica) = replica.into_replica() else {
            panic!("the mesh holds the only handle of replica {node}");
        };
        self.nodes[node].store = Some(replica.into_store());
        self.nodes[node].routes = Routes::new();
    }

    /// Restarts replica `node` from its store (or, for a late joiner, on
    /// an empty one), hands it what its writers wrote meanwhile, and
    /// redials its links.
    pub fn restart(&mut self, node: usize) {
        if self.nodes[node].replica.is_some() {
            return;
        }
        self.mix(&[5, node as u64]);
        let stream = self.nodes[node].stream;
        let replica = match self.nodes[node].store.take() {
            Some(store) => Replica::open(Config::new(stream), store)
                .expect("a replica reopens what it accepted"),
            None => Replica::new(stream),
        };
        let replica = SharedReplica::with_commits(replica, Commits::Inline);
        // The retention policy runs at start: what was compacted while
        // this replica was down is compacted here too.
        replica
            .compact(&self.retention)
            .expect("an in-memory replica compacts");
        self.nodes[node].replica = Some(replica);
        for writer in 0..self.writers.len() {
            if self.writers[writer].home == node {
                self.hand_to_home(writer);
            }
        }
        for link in self.nodes[node].links.clone() {
            self.links[link].backoff = REDIAL_FIRST;
            self.schedule_redial(link, Duration::ZERO);
        }
    }

    /// A late joiner joins: [`Mesh::restart`] on an empty store.
    pub fn join(&mut self, node: usize) {
        self.restart(node);
    }

    /// Raises the mesh's retention target to `target` and compacts every
    /// replica up to it (each clamps it to what it holds); a replica down
    /// compacts at its restart. As a retention policy every replica runs
    /// would: so that, once converged, all hold the same floor.
    pub fn compact_all(&mut self, target: &VersionVector) {
        self.mix(&[6, target.len() as u64]);
        self.retention.join(target);
        let target = self.retention.clone();
        let target = &target;
        for node in 0..self.nodes.len() {
            let Some(replica) = &self.nodes[node].replica else {
                continue;
            };
            let report = replica
                .compact(target)
                .expect("an in-memory replica compacts");
            if report.streams > 0 {
                self.marks_changed(node);
            }
        }
    }

    /// Runs the event loop until `until` (simulated), handling every event
    /// due by then.
    pub fn run_until(&mut self, until: Duration) {
        while let Some((at, event)) = self.queue.pop_until(until) {
            self.now = at;
            self.steps += 1;
            match event {
                Ev::Deliver {
                    link,
                    side,
                    epoch,
                    payload,
                } => self.deliver(link, side, epoch, &payload),
                Ev::Wake { link, side, epoch } => self.wake(link, side, epoch, at),
                Ev::Redial { link } => self.redial(link),
            }
        }
        self.now = self.now.max(until);
    }

    fn instant(&self) -> Instant {
        self.base + self.now
    }

    fn mix(&mut self, words: &[u64]) {
        for word in words {
            for byte in word.to_le_bytes() {
                self.fingerprint =
                    (self.fingerprint ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
            }
        }
    }

    fn schedule_redial(&mut self, link: usize, after: Duration) {
        if !self.links[link].redial_scheduled {
            self.links[link].redial_scheduled = true;
            self.queue.push(self.now + after, Ev::Redial { link });
        }
    }

    fn redial(&mut self, link: usize) {
        self.links[link].redial_scheduled = false;
        let [dialer, listener] = self.links[link].ends;
        if self.nodes[dialer].replica.is_none() || self.links[link].sessions.is_some() {
            return; // a stopped dialer redials at its restart
        }
        if self.links[link].cut || self.nodes[listener].replica.is_none() {
            // The dial fails: the next after a jittered, doubling delay.
            let base = self.links[link].backoff;
            self.links[link].backoff = (base * 2).min(REDIAL_MAX);
            let delay =
                base / 2 + Duration::from_micros(self.rng.below(base.as_micros() as u64 / 2 + 1));
            self.schedule_redial(link, delay);
            return;
        }
        self.links[link].backoff = REDIAL_FIRST;
        self.links[link].epoch += 1;
        self.counters.connections += 1;
        self.mix(&[7, link as u64]);
        let now = self.instant();
        // The dialer starts from what its last session learned of the
        // listener; the listener learns from the dialer's hello.
        let session = |node: &Node, direction, memory: &PeerMemory| Session {
            protocol: Protocol::new(node.stream, self.config.session.clone(), now)
                .with_routes(&node.routes, direction)
                .with_peer_memory(memory),
            wake_at: None,
            mint_at: self.now,
        };
        let sessions = [
            session(
                &self.nodes[dialer],
                PeerDirection::Outbound,
                &self.links[link].memory,
            ),
            session(
                &self.nodes[listener],
                PeerDirection::Inbound,
                &PeerMemory::default(),
            ),
        ];
        self.links[link].sessions = Some(sessions);
        self.fill(link, 0);
        self.fill(link, 1);
    }

    /// Closes `link`'s connection, both sides, and has the dialer redial.
    fn close(&mut self, link: usize, why: &str) {
        let Some([dialer, _]) = self.links[link].sessions.take() else {
            return;
        };
        self.links[link].memory = dialer.protocol.peer_memory();
        *self
            .counters
            .session_ends
            .entry(why.to_owned())
            .or_default() += 1;
        tracing::debug!(link, why, "connection closed");
        self.mix(&[8, link as u64]);
        if self.nodes[self.links[link].ends[0]].replica.is_some() {
            let delay = self.links[link].backoff;
            self.schedule_redial(link, delay);
        }
    }

    fn fail(&mut self, link: usize, error: &ProtocolError) {
        let why = match error {
            ProtocolError::ReadTimeout { what, .. } => format!("read timeout ({what})"),
            other => format!("{other}"),
        };
        self.close(link, &why);
    }

    /// The driver's `fill`: everything the session has to send, sent; then
    /// its next wake-up scheduled.
    fn fill(&mut self, link: usize, side: usize) {
        let node = self.links[link].ends[side];
        let now = self.instant();
        let mut sent = Vec::new();
        let mut failed = None;
        let mut duplicate = false;
        {
            let Some(replica) = self.nodes[node].replica.as_ref() else {
                return;
            };
            let Some(sessions) = self.links[link].sessions.as_mut() else {
                return;
            };
            let protocol = &mut sessions[side].protocol;
            if protocol.duplicate_of().is_some() {
                duplicate = true;
            } else {
                loop {
                    match protocol.poll_transmit(now, replica) {
                        Ok(Some(bytes)) => sent.push(bytes),
                        Ok(None) => break,
                        Err(error) => {
                            failed = Some(error);
                            break;
                        }
                    }
                }
            }
        }
        if duplicate {
            self.close(link, "duplicate");
            return;
        }
        for bytes in sent {
            self.send(link, side, bytes);
        }
        if let Some(error) = failed {
            self.fail(link, &error);
            return;
        }
        self.schedule_wake(link, side);
    }

    fn schedule_wake(&mut self, link: usize, side: usize) {
        let epoch = self.links[link].epoch;
        let base = self.base;
        let now = self.now;
        let Some(sessions) = self.links[link].sessions.as_mut() else {
            return;
        };
        let session = &mut sessions[side];
        let at = session
            .protocol
            .poll_timeout()
            .saturating_duration_since(base)
            .max(now);
        if session.wake_at != Some(at) {
            session.wake_at = Some(at);
            self.queue.push(at, Ev::Wake { link, side, epoch });
        }
    }

    fn wake(&mut self, link: usize, side: usize, epoch: u64, at: Duration) {
        if self.links[link].epoch != epoch {
            return;
        }
        let now = self.instant();
        let Some(sessions) = self.links[link].sessions.as_mut() else {
            return;
        };
        let session = &mut sessions[side];
        if session.wake_at != Some(at) {
            return; // superseded by a later schedule
        }
        session.wake_at = None;
        if let Err(error) = session.protocol.handle_timeout(now) {
            self.fail(link, &error);
            return;
        }
        self.mint(link, side);
        self.fill(link, side);
    }

    /// The tokio driver's `mint`, at a wake-up: a session that gossips
    /// checkpoints asks its replica to mint one from its marks once a
    /// heartbeat interval, at the simulated time; the replica mints only
    /// when one is due (`Replica::mint_checkpoint`). The checkpoint goes
    /// out with the session's fill, and with the replica's other
    /// sessions' next fills, as the driver's do.
    fn mint(&mut self, link: usize, side: usize) {
        let node = self.links[link].ends[side];
        let Some(replica) = self.nodes[node].replica.as_ref() else {
            return;
        };
        let Some(sessions) = self.links[link].sessions.as_mut() else {
            return;
        };
        let session = &mut sessions[side];
        if !session.protocol.gossips_checkpoints() || self.now < session.mint_at {
            return;
        }
        session.mint_at = self.now + self.config.session.heartbeat_interval;
        let now_ms = SIM_EPOCH_MS + self.now.as_millis() as u64;
        let minted = replica
            .mint_checkpoint(now_ms)
            .expect("an in-memory replica keeps a checkpoint");
        if let Some(checkpoint) = minted {
            self.counters.checkpoints_minted += 1;
            if self.minted.insert(checkpoint.name()) {
                self.counters.checkpoints_distinct += 1;
            }
            self.mix(&[10, node as u64, checkpoint.vector().len() as u64]);
        }
    }

    /// One frame onto the network, from `side` of `link` to the other.
    fn send(&mut self, link: usize, side: usize, bytes: Vec<u8>) {
        self.counters.frames_sent += 1;
        self.counters.bytes_sent += bytes.len() as u64;
        self.links[link].bytes_sent += bytes.len() as u64;
        let kind = self
            .counters
            .by_kind
            .entry(kind_name(bytes.get(LENGTH_PREFIX_BYTES)))
            .or_default();
        kind.0 += 1;
        kind.1 += bytes.len() as u64;
        if let Some(6 | 7) = bytes.get(LENGTH_PREFIX_BYTES) {
            self.counters.checkpoint_frames += 1;
            self.counters.checkpoint_bytes += bytes.len() as u64;
        }
        if self.links[link].cut {
            self.counters.frames_lost += 1;
            return;
        }
        let deliveries = self.config.net.deliveries(&mut self.rng);
        if deliveries.is_empty() {
            self.counters.frames_lost += 1;
            return;
        }
        self.counters.frames_duplicated += deliveries.len() as u64 - 1;
        let payload = Bytes::from(bytes).slice(LENGTH_PREFIX_BYTES..);
        let epoch = self.links[link].epoch;
        for delay in deliveries {
            self.queue.push(
                self.now + delay,
                Ev::Deliver {
                    link,
                    side: 1 - side,
                    epoch,
                    payload: payload.clone(),
                },
            );
        }
    }

    /// A frame arrives: the driver's `on_payload`, then its `fill`, and the
    /// other sessions of the replica filled if its marks moved.
    fn deliver(&mut self, link: usize, side: usize, epoch: u64, payload: &[u8]) {
        if self.links[link].epoch != epoch || self.links[link].sessions.is_none() {
            self.counters.frames_stale += 1;
            return;
        }
        self.mix(&[9, link as u64, side as u64, payload.len() as u64]);
        // The frame's head: its kind, numbers and marks (the whole of most
        // frames), cheap enough for the largest runs.
        self.mix_bytes(&payload[..payload.len().min(64)]);
        let now = self.instant();
        let node = self.links[link].ends[side];
        let Some(replica) = self.nodes[node].replica.as_ref() else {
            return;
        };
        let sessions = self.links[link].sessions.as_mut().expect("checked above");
        let protocol = &mut sessions[side].protocol;
        // Whether the marks or the floor moved (the change watch's wake-up):
        // read from the apply's report, not by cloning the marks twice.
        let mut moved = false;
        let result = match protocol.handle_payload(now, payload, replica) {
            Ok(Received::Nothing) => Ok(()),
            // Checked against its name by the core; kept as the driver
            // keeps it (an in-memory store records it).
            Ok(Received::Checkpoint(checkpoint)) => {
                let kept = replica
                    .keep_checkpoint(checkpoint)
                    .expect("an in-memory replica keeps a checkpoint");
                self.counters.checkpoints_kept += u64::from(kept);
                Ok(())
            }
            Ok(Received::Apply(columns)) => {
                let applied = replica.apply_columns(columns);
                if let Ok(report) = &applied {
                    self.counters.events_applied += report.applied;
                    self.counters.events_duplicate += report.duplicates;
                    moved = report.applied > 0 || report.floors_raised > 0;
                }
                protocol.handle_applied(now, applied)
            }
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            self.fail(link, &error);
        } else {
            self.fill(link, side);
        }
        if moved {
            self.marks_changed(node);
        }
    }

    /// The change watch: every session of `node` fills.
    fn marks_changed(&mut self, node: usize) {
        for link in self.nodes[node].links.clone() {
            if self.links[link].sessions.is_some() {
                let side = usize::from(self.links[link].ends[0] != node);
                self.fill(link, side);
            }
        }
    }

    fn mix_bytes(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.fingerprint = (self.fingerprint ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// Tokens and checkpoints, as the replicas answer and keep them.
impl Mesh {
    /// The token replica `node` answers for `cursor` (the shortest of
    /// version 2 against each checkpoint it keeps and version 1:
    /// `Replica::token`), if it is up.
    pub fn token(&self, node: usize, cursor: &VersionVector) -> Option<Answer> {
        let replica = self.nodes[node].replica.as_ref()?;
        let text = replica
            .token(cursor)
            .expect("a replica's cursor has a token");
        let (relative, fell_back) = token_kind(replica, cursor, &text);
        Some(Answer {
            text,
            relative,
            fell_back,
        })
    }

    /// The names of the checkpoints replica `node` keeps, oldest first
    /// (none if it is down).
    pub fn checkpoint_names(&self, node: usize) -> Vec<CheckpointName> {
        self.nodes[node]
            .replica
            .as_ref()
            .map(SharedReplica::checkpoint_names)
            .unwrap_or_default()
    }
}

/// Whether `text`, `replica`'s token for `cursor`, is version 2; and if
/// not, whether for want of a checkpoint within the bound (it keeps some,
/// and the codec refuses `cursor` relative to each) rather than because
/// version 1 was shorter. Only a figure: the rule is the replica's.
pub(crate) fn token_kind(
    replica: &SharedReplica<MemStore>,
    cursor: &VersionVector,
    text: &str,
) -> (bool, bool) {
    if let Ok(token::Token::Relative(_)) = token::decode_any_text(text) {
        return (true, false);
    }
    let kept = replica.checkpoints();
    let beyond = |checkpoint| {
        matches!(
            token::encode_relative(cursor, checkpoint),
            Err(TokenError::TooManyDifferences { .. } | TokenError::DifferenceOutOfRange { .. })
        )
    };
    (false, !kept.is_empty() && kept.iter().all(beyond))
}

/// A token a replica answers: see [`Mesh::token`].
#[derive(Debug, Clone)]
pub struct Answer {
    /// The text token.
    pub text: String,
    /// Version 2 (relative to a checkpoint the replica keeps).
    pub relative: bool,
    /// Version 1 because every checkpoint kept was beyond the bound.
    pub fell_back: bool,
}
