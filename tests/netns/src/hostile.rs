//! The hostile node (`--hostile-node`, `docs/FAULTS.md`): a peer that holds
//! the mesh's peer secret but no writer key, beside the five honest nodes.
//!
//! It keeps a replica of its own and syncs it with each honest node in
//! turn over the real transport (the node's own dial,
//! `meshlog_node::peer_auth::upgrade`, and a `meshlog_sync::Session`), so
//! it holds what the mesh holds, sealed as the writers sealed it, and
//! relays it honestly. Between those sessions it opens sessions of its own
//! and sends one forged delta on each ([`Forgery`]): another writer's next
//! event unsealed and sealed by a wrong key, a real sealed run the node
//! lacks with one payload or lamport altered, and floors at a writer's
//! head + 5, at `LAMPORT_MAX` and below the node's head. Before all that,
//! as the mesh starts (before the writers write), it sends each node
//! another writer's first event, unsealed: a stream the node holds
//! nothing of and has pinned no key for. Each attempt is
//! recorded with what the node did ([`ForgeryOutcome`]): refused (the
//! session closed unacknowledged and the node's
//! `meshlog_deltas_refused_total` rose), cut (an unsealed first run
//! acknowledged, and the node's chain head not the forged event's), or
//! acknowledged. The checker demands that every event forgery was refused
//! (the first run: cut) at least once and never taken, and that the honest
//! nodes' logs hold no event an honest writer did not send and no floor a
//! compaction could not have set.
//!
//! With `--plant stolen-key` it is also given one writer's key and seals
//! that writer's next event with it ([`Forgery::StolenKey`]): a forgery no
//! node can tell from the writer's, so the checker must fail.
//!
//! It runs on a thread of the harness (a tokio runtime of its own) in the
//! root namespace, from the clients' address: partitions between nodes
//! leave it alone, link impairments do not.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_node::auth::{Auth, PeerKey, SecretSources};
use meshlog_replica::{
    Binding, ChainHash, Config, Delta, Event, MemStore, Membership, Replica, RunSeal, Seal,
    SharedReplica, WriterKey, WriterPublicKey, LAMPORT_MAX,
};
use meshlog_sync::frame::{self, Frame, FrameReader, Hello};
use meshlog_sync::{Session, SessionConfig, FRAME_BYTES_MAX, PROTOCOL_VERSION};
use meshlog_testkit::SplitMix64;
use tokio::io::AsyncWriteExt;

use crate::history::{Forgery, ForgeryOutcome};
use crate::http::{request_from, PEER_SECRET};
use crate::net::{node_addr, observer};
use crate::schedule::NODES;

/// The stream the hostile peer names in its hellos: no writer's.
pub const HOSTILE_STREAM: u64 = 6;
/// How long each honest session with a node runs.
const HONEST_SESSION: Duration = Duration::from_millis(300);
/// How long a dial, a hello or a node's answer to a forgery may take.
const ANSWER_BOUND: Duration = Duration::from_secs(3);
/// Why an altered run or the stolen key's forgery was not tried.
const NO_NODE_FITS: &str = "no node's marks fit: none lacked what this peer holds";
/// The byte budget of the deltas it builds from its replica.
const DELTA_BYTES: usize = 64 << 10;
/// How many times an unsealed first run is sent to a node whose session
/// proved nothing (no session, closed, unanswered) as the mesh starts.
const FIRST_RUN_TRIES: usize = 3;
/// How many times in a round an altered run is tried while no node lacks
/// what this peer holds, each after another honest session.
const ALTERED_TRIES: usize = 3;

/// The forgeries of one round after the first runs, those `shown` (answered
/// as a node must) last, each group in [`Forgery::ALL`]'s order; never the
/// first run (sent only as the mesh starts), nor the stolen key's unless
/// this peer was `stolen` one.
fn round(shown: &std::collections::BTreeSet<Forgery>, stolen: bool) -> Vec<Forgery> {
    let mut forgeries: Vec<Forgery> = Forgery::ALL
        .into_iter()
        .filter(|f| *f != Forgery::UnsealedFirst && (stolen || *f != Forgery::StolenKey))
        .collect();
    forgeries.sort_by_key(|f| shown.contains(f));
    forgeries
}

/// One forgery attempt, as the harness records it.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The honest node it was sent to.
    pub node: usize,
    /// What was forged.
    pub forgery: Forgery,
    /// The stream it names (0 when not tried).
    pub stream: u64,
    /// The seq forged, altered or claimed as a floor.
    pub seq: u64,
    /// What the node did.
    pub outcome: ForgeryOutcome,
}

/// The honest writers, as the nodes' trust configuration names them: node
/// `i` writes legacy stream `i + 1`, bound to its key.
pub fn writer_key(seed: u64, node: usize) -> WriterKey {
    let mut rng = SplitMix64::new(SplitMix64::derive(seed, 300 + node as u64));
    WriterKey::from_bytes(rng.bytes::<32>())
}

/// The trust entries every node is given: `KEY@STREAM` per writer.
pub fn trust_entries(seed: u64) -> Vec<String> {
    (0..NODES)
        .map(|i| {
            let key = writer_key(seed, i).public().to_bytes();
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            format!("{hex}@{}", i + 1)
        })
        .collect()
}

/// The hostile peer.
pub struct Hostile {
    replica: SharedReplica<MemStore>,
    peer_key: PeerKey,
    stranger: WriterKey,
    /// A writer's key and stream, given by `--plant stolen-key`.
    stolen: Option<(WriterKey, StreamId)>,
    rng: SplitMix64,
    forged: u64,
}

impl Hostile {
    /// A hostile peer for the mesh of schedule `seed`: its replica admits
    /// the honest writers (so it can take and relay their sealed runs).
    /// With `stolen`, it holds that node's writer key.
    pub fn new(seed: u64, stolen: Option<usize>) -> Result<Hostile, String> {
        let mut membership = Membership::open();
        for node in 0..NODES {
            let key: WriterPublicKey = writer_key(seed, node).public();
            membership.admit(key);
            membership.bind(Binding {
                stream: StreamId::new(node as u64 + 1),
                key,
            });
        }
        let config = Config {
            membership,
            ..Config::new(StreamId::new(HOSTILE_STREAM))
        };
        let replica = Replica::open(config, MemStore::default())
            .map_err(|e| format!("the hostile peer's replica: {e}"))?;
        let peer_key = Auth::load(SecretSources {
            peer: vec![PEER_SECRET.into()],
            ..SecretSources::default()
        })
        .map_err(|e| format!("the peer secret: {e}"))?
        .peer_keys()
        .remove(0);
        let mut rng = SplitMix64::new(SplitMix64::derive(seed, 400));
        Ok(Hostile {
            replica: SharedReplica::with_commits(replica, meshlog_replica::Commits::Inline),
            peer_key,
            stranger: WriterKey::from_bytes(rng.bytes::<32>()),
            stolen: stolen.map(|node| (writer_key(seed, node), StreamId::new(node as u64 + 1))),
            rng,
            forged: 0,
        })
    }

    /// Runs until `stop` says so: first an unsealed first run to each node
    /// ([`Hostile::first_runs`]), then `started`; then with each node in
    /// turn, round after round, one session per forgery, those not yet
    /// shown answered first (so a forgery that rarely finds a target is not
    /// always tried last, after the time ran out). Each altered run goes
    /// after an honest session (with the next node each time) that brings
    /// this peer what is newest, and is tried again, up to
    /// [`ALTERED_TRIES`] times, while no node lacks it: the mesh passes on
    /// what this peer just took within milliseconds, so one honest session
    /// often leaves nothing to alter. Each attempt goes to `record` as it
    /// completes.
    pub fn run(mut self, stop: &dyn Fn() -> bool, record: &dyn Fn(Attempt), started: &dyn Fn()) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("hostile peer: no runtime: {error}");
                return;
            }
        };
        runtime.block_on(async {
            let mut shown = std::collections::BTreeSet::new();
            self.first_runs(stop, &mut |attempt: Attempt| {
                if attempt.forgery.shown_by(&attempt.outcome) {
                    shown.insert(attempt.forgery);
                }
                record(attempt)
            })
            .await;
            started();
            let mut node = 0;
            let mut source = 0;
            while !stop() {
                for forgery in round(&shown, self.stolen.is_some()) {
                    if stop() {
                        break;
                    }
                    let attempt = self
                        .try_forgery(node, forgery, &mut source, stop, record)
                        .await;
                    if forgery.shown_by(&attempt.outcome) {
                        shown.insert(forgery);
                    }
                    record(attempt);
                }
                node = (node + 1) % NODES;
            }
        });
    }

    /// One forgery with `node` (an altered run: with the first node that
    /// lacks one, after honest sessions from `source` on), the attempts
    /// that found no target recorded and the last returned.
    async fn try_forgery(
        &mut self,
        node: usize,
        forgery: Forgery,
        source: &mut usize,
        stop: &dyn Fn() -> bool,
        record: &dyn Fn(Attempt),
    ) -> Attempt {
        let altered = matches!(forgery, Forgery::AlteredPayload | Forgery::AlteredLamport);
        if let (Forgery::StolenKey, Some((_, stream))) = (forgery, &self.stolen) {
            self.honest_session(stream.get() as usize - 1).await;
        }
        let mut tries = 0;
        loop {
            if altered {
                self.honest_session(*source).await;
                *source = (*source + 1) % NODES;
            }
            tries += 1;
            let attempt = self.attempt(node, forgery).await;
            let unfit =
                matches!(&attempt.outcome, ForgeryOutcome::NotTried { why } if why == NO_NODE_FITS);
            if !(altered && unfit) || tries >= ALTERED_TRIES || stop() {
                return attempt;
            }
            record(attempt);
        }
    }

    /// As the mesh starts, before the writers write: to each node, another
    /// admitted writer's first event, unsealed, on a stream it holds
    /// nothing of (so has pinned no key for). Under `require_seals` (on
    /// with a closed membership) the node must cut it, not take it: it
    /// could not tell it from the writer's first event, and taking it
    /// would make the writer's real one an equivocation. Sent again, up to
    /// [`FIRST_RUN_TRIES`] times, while a session proves nothing.
    async fn first_runs(&mut self, stop: &dyn Fn() -> bool, record: &mut dyn FnMut(Attempt)) {
        for node in 0..NODES {
            for _ in 0..FIRST_RUN_TRIES {
                if stop() {
                    return;
                }
                let attempt = self.attempt(node, Forgery::UnsealedFirst).await;
                let again = matches!(
                    attempt.outcome,
                    ForgeryOutcome::NoSession { .. }
                        | ForgeryOutcome::Closed
                        | ForgeryOutcome::Unanswered
                );
                record(attempt);
                if !again {
                    break;
                }
            }
        }
    }

    async fn dial(&self, node: usize) -> Result<Link, String> {
        dial(node, self.peer_key.clone()).await
    }

    /// An honest session: takes what the node holds and gives what it
    /// lacks, sealed as received.
    async fn honest_session(&self, node: usize) {
        if let Ok(io) = self.dial(node).await {
            let config = SessionConfig::with_heartbeat(Duration::from_millis(200));
            let session = Session::new(self.replica.clone(), config);
            let _ = session
                .run_until(io, tokio::time::sleep(HONEST_SESSION))
                .await;
        }
    }

    /// One forgery on a session of its own (for an altered run, with the
    /// first node whose hello shows it lacks a sealed run this peer
    /// holds): the forged delta made against the node's marks, and the
    /// node's answer.
    async fn attempt(&mut self, node: usize, forgery: Forgery) -> Attempt {
        let mut attempt = Attempt {
            node,
            forgery,
            stream: 0,
            seq: 0,
            outcome: ForgeryOutcome::NotTried { why: String::new() },
        };
        let ours = self.replica.marks();
        let opened = match (forgery, &self.stolen) {
            (Forgery::AlteredPayload | Forgery::AlteredLamport, _) => {
                // A node lacking events of another writer that this peer
                // holds: a sealed run it lacks.
                self.open_first(|node, marks| {
                    ours.iter().any(|(stream, seq)| {
                        stream.get() != node as u64 + 1 && marks.get(stream) < seq
                    })
                })
                .await
            }
            (Forgery::StolenKey, Some((_, stolen))) => {
                // A node holding no more of the stolen stream than this
                // peer: the forgery can extend what it holds.
                let stolen = *stolen;
                self.open_first(|node, marks| {
                    stolen.get() != node as u64 + 1 && marks.get(stolen) <= ours.get(stolen)
                })
                .await
            }
            _ => open(node, self.peer_key.clone(), self.hello()).await,
        };
        let mut open = match opened {
            Ok(open) => open,
            Err(why) if why == NO_NODE_FITS => {
                attempt.outcome = ForgeryOutcome::NotTried { why };
                return attempt;
            }
            Err(message) => {
                attempt.outcome = ForgeryOutcome::NoSession { message };
                return attempt;
            }
        };
        attempt.node = open.node;
        let own = StreamId::new(open.node as u64 + 1);
        let (stream, seq, delta) = match self.forge(forgery, &open.marks, own) {
            Ok(forged) => forged,
            Err(why) => {
                attempt.outcome = ForgeryOutcome::NotTried { why };
                return attempt;
            }
        };
        attempt.stream = stream.get();
        attempt.seq = seq;
        // An unsealed first run may be acknowledged and cut: the chain
        // hash a node holding it would show.
        let forged_hash =
            (forgery == Forgery::UnsealedFirst).then(|| ChainHash::GENESIS.extend(&delta.events));
        let refused_before = refused_count(open.node);
        attempt.outcome = match frame::encode(&Frame::delta(1, delta)) {
            Ok(bytes) if open.io.write_all(&bytes).await.is_ok() => {
                answer(&mut open, refused_before).await
            }
            Ok(_) => ForgeryOutcome::NoSession {
                message: "the link closed before the forgery was sent".into(),
            },
            Err(error) => ForgeryOutcome::NotTried {
                why: format!("the encoder refused it: {error}"),
            },
        };
        if let (ForgeryOutcome::Acknowledged, Some(hash)) = (&attempt.outcome, forged_hash) {
            attempt.outcome = match holds(open.node, stream, seq, hash) {
                Some(true) => ForgeryOutcome::Acknowledged,
                Some(false) => ForgeryOutcome::Cut,
                None => ForgeryOutcome::Unanswered,
            };
        }
        attempt
    }

    /// This peer's hello: its stream and marks.
    fn hello(&self) -> Frame {
        Frame::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            stream: StreamId::new(HOSTILE_STREAM),
            marks: self.replica.marks(),
            floor: VersionVector::new(),
            frame_bytes_max: FRAME_BYTES_MAX as u32,
        })
    }

    /// Sessions with every node at once; the first whose hello's marks
    /// `fits` (so that what is forged against them is not overtaken by the
    /// mesh while other nodes are asked), or an error when none does.
    async fn open_first(
        &self,
        fits: impl Fn(usize, &VersionVector) -> bool,
    ) -> Result<Open, String> {
        let mut opening = tokio::task::JoinSet::new();
        for node in 0..NODES {
            opening.spawn(open(node, self.peer_key.clone(), self.hello()));
        }
        while let Some(done) = opening.join_next().await {
            match done {
                Ok(Ok(open)) if fits(open.node, &open.marks) => return Ok(open),
                _ => {}
            }
        }
        Err(NO_NODE_FITS.into())
    }

    /// The forged delta against a node holding `marks` whose own stream is
    /// `own`: the stream and seq it names, and the delta.
    fn forge(
        &mut self,
        forgery: Forgery,
        marks: &VersionVector,
        own: StreamId,
    ) -> Result<(StreamId, u64, Delta), String> {
        let floor = |stream: StreamId, seq: u64| Delta {
            floor_proofs: Default::default(),
            floor: [(stream, seq)].into_iter().collect(),
            events: Vec::new(),
            seals: Vec::new(),
        };
        match forgery {
            Forgery::AlteredPayload | Forgery::AlteredLamport => self.altered(forgery, marks, own),
            Forgery::StolenKey => self.stolen_next(marks, own),
            Forgery::UnsealedFirst => {
                let stream = self.unheld(marks, own)?;
                let delta = Delta {
                    floor_proofs: Default::default(),
                    floor: VersionVector::new(),
                    events: vec![self.next_event(stream, 0)],
                    seals: Vec::new(),
                };
                Ok((stream, 1, delta))
            }
            _ => {
                let stream = self.target(marks, own)?;
                let head = marks.get(stream);
                Ok(match forgery {
                    Forgery::FloorAhead => (stream, head + 5, floor(stream, head + 5)),
                    Forgery::FloorMax => (stream, LAMPORT_MAX, floor(stream, LAMPORT_MAX)),
                    Forgery::FloorErasing => (stream, head - 1, floor(stream, head - 1)),
                    _ => {
                        let event = self.next_event(stream, head);
                        let seals = if forgery == Forgery::WrongKey {
                            let hash = meshlog_replica::ChainHash::GENESIS.next(&event);
                            vec![RunSeal {
                                key: self.stranger.public(),
                                seal: Seal::sign_for(&self.stranger, stream, head + 1, hash),
                                base: None,
                            }]
                        } else {
                            Vec::new()
                        };
                        let delta = Delta {
                            floor_proofs: Default::default(),
                            floor: VersionVector::new(),
                            events: vec![event],
                            seals,
                        };
                        (stream, head + 1, delta)
                    }
                })
            }
        }
    }

    /// Another writer's stream the node holds at least two events of,
    /// drawn at random.
    fn target(&mut self, marks: &VersionVector, own: StreamId) -> Result<StreamId, String> {
        let streams: Vec<StreamId> = (1..=NODES as u64)
            .map(StreamId::new)
            .filter(|&s| s != own && marks.get(s) >= 2)
            .collect();
        if streams.is_empty() {
            return Err("the node holds two events of no other writer yet".into());
        }
        Ok(streams[self.rng.below(streams.len() as u64) as usize])
    }

    /// Another writer's stream the node holds nothing of, drawn at random.
    fn unheld(&mut self, marks: &VersionVector, own: StreamId) -> Result<StreamId, String> {
        let streams: Vec<StreamId> = (1..=NODES as u64)
            .map(StreamId::new)
            .filter(|&s| s != own && marks.get(s) == 0)
            .collect();
        if streams.is_empty() {
            return Err("the node holds events of every other writer already".into());
        }
        Ok(streams[self.rng.below(streams.len() as u64) as usize])
    }

    /// A forged event at `head + 1` of `stream`, stamped above the held
    /// one, with a payload no writer sent.
    fn next_event(&mut self, stream: StreamId, head: u64) -> Event {
        self.forged += 1;
        let lamport = self
            .replica
            .get(stream, head)
            .map_or(self.replica.clock() + 1, |held| held.lamport + 1);
        Event {
            stream,
            seq: head + 1,
            lamport,
            time_ms: 1_700_000_000_000,
            payload: Bytes::from(format!("forged-{}", self.forged)),
        }
    }

    /// What its replica would honestly send the node, with the last event
    /// of one sealed run altered.
    fn altered(
        &mut self,
        forgery: Forgery,
        marks: &VersionVector,
        own: StreamId,
    ) -> Result<(StreamId, u64, Delta), String> {
        let mut delta = self.replica.delta_for(marks, DELTA_BYTES);
        let Some(stream) = delta
            .seals
            .iter()
            .map(|s| s.seal.stream)
            .find(|&s| s != own)
        else {
            return Err("no sealed run the node lacks".into());
        };
        let last = delta
            .events
            .iter_mut()
            .rfind(|e| e.stream == stream)
            .ok_or("a seal without its run")?;
        if forgery == Forgery::AlteredPayload {
            self.forged += 1;
            last.payload = Bytes::from(format!("forged-{}", self.forged));
        } else {
            last.lamport += 1;
        }
        Ok((stream, last.seq, delta))
    }

    /// The stolen key's writer's next event after what this peer holds,
    /// sealed by that key over the events the node lacks and it.
    fn stolen_next(
        &mut self,
        marks: &VersionVector,
        own: StreamId,
    ) -> Result<(StreamId, u64, Delta), String> {
        let Some((key, stream)) = self.stolen.as_ref().map(|(k, s)| (k.clone(), *s)) else {
            return Err("no key was stolen".into());
        };
        let held = self.replica.marks().get(stream);
        let chain = self
            .replica
            .chain(stream)
            .ok_or("no chain for the stream")?;
        if stream == own || held < marks.get(stream) || !chain.anchored {
            return Err("the node writes the stream, or holds more of it than this peer".into());
        }
        let mut events: Vec<Event> = (marks.get(stream) + 1..=held)
            .filter_map(|seq| self.replica.get(stream, seq))
            .collect();
        if events.len() as u64 != held - marks.get(stream) {
            return Err("this peer no longer holds what the node lacks".into());
        }
        let forged = self.next_event(stream, held);
        let hash = chain.head_hash.next(&forged);
        events.push(forged);
        let seal = Seal::sign_for(&key, stream, held + 1, hash);
        let delta = Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events,
            seals: vec![RunSeal {
                key: key.public(),
                seal,
                base: None,
            }],
        };
        Ok((stream, held + 1, delta))
    }
}

/// A sync link to a node, upgraded and authenticated.
type Link = meshlog_node::peer_auth::SyncLink;

/// A session of the hostile peer's own, hellos exchanged.
struct Open {
    node: usize,
    io: Link,
    reader: FrameReader,
    /// The node's marks, from its hello.
    marks: VersionVector,
}

/// Dials `node` as a peer: TCP, then the node's own sync upgrade and peer
/// handshake (`meshlog_node::peer_auth::upgrade`).
async fn dial(node: usize, key: PeerKey) -> Result<Link, String> {
    let addr: SocketAddr = node_addr(node);
    let tcp = tokio::time::timeout(ANSWER_BOUND, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    tokio::time::timeout(
        ANSWER_BOUND,
        meshlog_node::peer_auth::upgrade(tcp, &addr.to_string(), Some(&key)),
    )
    .await
    .map_err(|_| "the sync upgrade timed out".to_owned())?
}

/// Dials `node`, sends `hello` and reads frames until the node's hello.
async fn open(node: usize, key: PeerKey, hello: Frame) -> Result<Open, String> {
    let mut io = dial(node, key).await?;
    let bytes = frame::encode(&hello).map_err(|e| e.to_string())?;
    io.write_all(&bytes).await.map_err(|e| e.to_string())?;
    let mut reader = FrameReader::new();
    let read = async {
        loop {
            match reader.read_payload(&mut io).await {
                Ok(Some(payload)) => {
                    if let Ok(Frame::Hello(hello)) = frame::decode_payload(&payload) {
                        return Ok(hello.marks);
                    }
                }
                Ok(None) => return Err("the node closed before its hello".to_owned()),
                Err(error) => return Err(format!("reading the node's hello: {error}")),
            }
        }
    };
    let marks = tokio::time::timeout(ANSWER_BOUND, read)
        .await
        .map_err(|_| "no hello within the bound".to_owned())??;
    Ok(Open {
        node,
        io,
        reader,
        marks,
    })
}

/// The node's answer to delta 1: acknowledged, or the session closed
/// (refused if the node counted a refused delta since `refused_before`).
async fn answer(open: &mut Open, refused_before: Option<u64>) -> ForgeryOutcome {
    let read = async {
        loop {
            match open.reader.read_payload(&mut open.io).await {
                Ok(Some(payload)) => {
                    let received = match frame::decode_payload(&payload) {
                        Ok(Frame::Ack(receipt) | Frame::Heartbeat(receipt)) => receipt.received,
                        Ok(Frame::BareAck(received)) => received,
                        _ => 0,
                    };
                    if received >= 1 {
                        return true;
                    }
                }
                Ok(None) | Err(_) => return false,
            }
        }
    };
    match tokio::time::timeout(ANSWER_BOUND, read).await {
        Err(_) => ForgeryOutcome::Unanswered,
        Ok(true) => ForgeryOutcome::Acknowledged,
        Ok(false) => {
            // The node counts the refusal as it closes; allow it a moment.
            for _ in 0..10 {
                if let (Some(before), Some(after)) = (refused_before, refused_count(open.node)) {
                    if after > before {
                        return ForgeryOutcome::Refused;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            ForgeryOutcome::Closed
        }
    }
}

/// Whether `node` holds the forged event at `(stream, seq)`, from its
/// `GET /marks` `chains` (asked from the observer): its head there, with
/// the forged event's chain hash `forged`. A writer's later events cannot
/// chain from a forged one, so a head above `seq` is the writer's. `None`
/// when the node did not answer.
fn holds(node: usize, stream: StreamId, seq: u64, forged: ChainHash) -> Option<bool> {
    let response = request_from(
        Some(observer()),
        node_addr(node),
        "GET",
        "/marks",
        None,
        b"",
    )
    .ok()
    .filter(|response| response.status == 200)?;
    let marks: serde_json::Value = serde_json::from_slice(&response.body).ok()?;
    let head = &marks["chains"]["streams"][stream.to_string()];
    Some(
        head["head"].as_u64() == Some(seq)
            && head["hash"].as_str() == Some(forged.to_string().as_str()),
    )
}

/// The node's `meshlog_deltas_refused_total`, asked from the observer.
fn refused_count(node: usize) -> Option<u64> {
    let response = request_from(
        Some(observer()),
        node_addr(node),
        "GET",
        "/metrics",
        None,
        b"",
    )
    .ok()?;
    let text = String::from_utf8(response.body).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("meshlog_deltas_refused_total "))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_tries_what_is_not_yet_shown_first_and_never_the_first_run() {
        let none = std::collections::BTreeSet::new();
        let all = round(&none, false);
        assert!(!all.contains(&Forgery::UnsealedFirst));
        assert!(!all.contains(&Forgery::StolenKey));
        assert_eq!(all[0], Forgery::AlteredPayload);
        assert!(round(&none, true).contains(&Forgery::StolenKey));

        let shown: std::collections::BTreeSet<Forgery> =
            [Forgery::AlteredPayload, Forgery::UnsealedNext].into();
        let next = round(&shown, false);
        assert_eq!(next.len(), all.len());
        assert_eq!(next[0], Forgery::AlteredLamport);
        assert_eq!(
            &next[next.len() - 2..],
            &[Forgery::AlteredPayload, Forgery::UnsealedNext]
        );
    }
}
