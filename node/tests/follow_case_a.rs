//! `case_a_follower_converges_after_loss` over the real channel: a node
//! `N` that syncs with a peer `P` (both in-process, on disk, over HTTP),
//! and four `Follower`s of `N` — the whole log, each writer's stream, and
//! the status stream — connected through a frame-level WebSocket fault
//! proxy (`follow_support`).
//!
//! Each seeded schedule starts fresh followers at `N`'s marks and runs two
//! phases drawn from seven faults: frame loss, delay, duplication,
//! reordering, a cut connection, `N` partitioned from `P` (the peer link
//! removed through the API) while both write, and a compaction of `N` past
//! followers that are cut off. Each phase writes under the fault, heals it,
//! then compares every follower's state with a fresh snapshot read over
//! HTTP: its events (each exactly once, each stream in seq order), its
//! cursor and a digest of what it holds, against a walk of `GET /events`
//! from its start cursor, `GET /marks`' marks, floor and digest. Receiving a
//! resync is not enough: the comparison is of state. After the compaction a
//! follower must have reported the gap as `stale` (the documented outcome;
//! these followers accept it and go on from `resume`).
//!
//! 100 schedules, on four lanes (a node pair each) at once so the run
//! stays short; `MESHLOG_SEED` replays one.

mod follow_support;
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use follow_support::{Faults, Tracked, WsProxy};
use meshlog_cursor::{token, StreamId, VersionVector};
use meshlog_node::follow::{FollowStream, FollowerConfig};
use meshlog_node::http::json::{EventJson, MarksJson, PageJson};
use meshlog_testkit::seed::{seeds, Report};
use meshlog_testkit::SplitMix64;
use serde_json::json;
use support::{get, post_json, request, start_with, TestNode};

const SCHEDULES: usize = 100;
const LANES: usize = 4;
const PHASES: usize = 2;
const CONVERGE_WITHIN: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Loss,
    Delay,
    Duplication,
    Reordering,
    CutConnection,
    PeerPartition,
    CompactionPastCutFollower,
}

const FAULTS: [Fault; 7] = [
    Fault::Loss,
    Fault::Delay,
    Fault::Duplication,
    Fault::Reordering,
    Fault::CutConnection,
    Fault::PeerPartition,
    Fault::CompactionPastCutFollower,
];

struct Lane {
    node: TestNode,
    peer: TestNode,
}

async fn start_lane(lane: usize) -> Lane {
    let peer = start_with(200 + lane as u64 * 2, |config| {
        config.follow.heartbeat = Duration::from_millis(25);
    })
    .await;
    let peer_url = peer.url();
    let node = start_with(201 + lane as u64 * 2, move |config| {
        config.peers = vec![peer_url];
        config.follow.heartbeat = Duration::from_millis(25);
    })
    .await;
    Lane { node, peer }
}

async fn marks(addr: SocketAddr) -> MarksJson {
    let response = get(addr, "/marks").await;
    assert_eq!(response.status, 200);
    serde_json::from_slice(&response.body).unwrap()
}

fn vector(json: &BTreeMap<String, u64>) -> VersionVector {
    json.iter()
        .map(|(stream, seq)| (StreamId::new(stream.parse().unwrap()), *seq))
        .collect()
}

fn stream_of(event: &EventJson) -> StreamId {
    StreamId::new(event.stream.parse().unwrap())
}

/// Every event after `after` (of one writer with `stream`), walked fresh.
async fn walk_from(addr: SocketAddr, after: &VersionVector, stream: Option<u64>) -> Vec<EventJson> {
    let mut after = token::encode_text(after).unwrap();
    let mut events = Vec::new();
    loop {
        let mut path = format!("/events?after={after}&limit=500");
        if let Some(stream) = stream {
            path.push_str(&format!("&stream={stream}"));
        }
        let response = get(addr, &path).await;
        assert_eq!(
            response.status,
            200,
            "{}",
            String::from_utf8_lossy(&response.body)
        );
        let page: PageJson = serde_json::from_slice(&response.body).unwrap();
        events.extend(page.events);
        after = page.next;
        if page.at_head {
            return events;
        }
    }
}

/// A digest of a set of events: their count and a checksum of their
/// contents in `(stream, seq)` order.
fn digest(events: &[EventJson]) -> (usize, u32) {
    let mut sorted: Vec<&EventJson> = events.iter().collect();
    sorted.sort_by_key(|e| (stream_of(e), e.seq));
    let mut hasher = crc32fast::Hasher::new();
    for event in &sorted {
        hasher.update(serde_json::to_string(event).unwrap().as_bytes());
    }
    (sorted.len(), hasher.finalize())
}

struct Schedule<'a> {
    lane: &'a Lane,
    proxy: WsProxy,
    followers: Vec<(FollowStream, Tracked)>,
    rng: SplitMix64,
    written: u64,
}

impl Schedule<'_> {
    async fn write(&mut self, addr: SocketAddr, count: u64, what: &str) {
        for _ in 0..count {
            self.written += 1;
            let payload = format!("{what} {}", self.written);
            let response = request(addr, "POST", "/events", &[], payload.as_bytes()).await;
            assert_eq!(response.status, 201);
            if self.rng.chance(0.3) {
                tokio::time::sleep(Duration::from_millis(self.rng.below(10))).await;
            }
        }
    }

    async fn write_both(&mut self, min: u64, what: &str) {
        let peer_count = min + self.rng.below(5);
        let node_count = min + self.rng.below(3);
        let (peer, node) = (self.lane.peer.addr, self.lane.node.addr);
        self.write(peer, peer_count, what).await;
        self.write(node, node_count, what).await;
    }

    async fn phase(&mut self, fault: Fault) {
        let what = format!("{fault:?}");
        let delay_ms_max = 5 + self.rng.below(30);
        let faults = |drop, duplicate, delay, reorder| Faults {
            drop,
            duplicate,
            delay,
            reorder,
            delay_ms_max,
        };
        let (node, peer) = (self.lane.node.addr, self.lane.peer.url());
        match fault {
            Fault::Loss => {
                let rate = 0.2 + self.rng.unit() * 0.4;
                self.proxy.set_faults(faults(rate, 0.0, 0.0, 0.0));
                self.write_both(1, &what).await;
            }
            Fault::Delay => {
                self.proxy.set_faults(faults(0.0, 0.0, 0.8, 0.0));
                self.write_both(1, &what).await;
            }
            Fault::Duplication => {
                self.proxy.set_faults(faults(0.0, 0.5, 0.0, 0.0));
                self.write_both(1, &what).await;
            }
            Fault::Reordering => {
                self.proxy.set_faults(faults(0.0, 0.0, 0.0, 0.5));
                self.write_both(1, &what).await;
            }
            Fault::CutConnection => {
                self.proxy.cut();
                self.write_both(1, &what).await;
            }
            Fault::PeerPartition => {
                let removed = request(
                    node,
                    "DELETE",
                    "/peers",
                    &[("content-type", "application/json")],
                    json!({ "url": peer }).to_string().as_bytes(),
                )
                .await;
                assert_eq!(removed.status, 200);
                self.write_both(1, &what).await;
                let added = post_json(node, "/peers", &json!({ "url": peer })).await;
                assert_eq!(added.status, 201);
            }
            Fault::CompactionPastCutFollower => {
                self.proxy.cut();
                self.write_both(3, &what).await;
                // Compact only once the node holds the peer's new events, so
                // the floor rises past every cut follower in both streams.
                let peer_marks = vector(&marks(self.lane.peer.addr).await.marks);
                let started = Instant::now();
                while !vector(&marks(node).await.marks).dominates(&peer_marks) {
                    assert!(
                        started.elapsed() < CONVERGE_WITHIN,
                        "the node never got the peer's events"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let compacted = post_json(
                    node,
                    "/compact",
                    &json!({ "keep_last": 1, "ignore_peers": true }),
                )
                .await;
                assert_eq!(compacted.status, 200);
            }
        }
        tokio::time::sleep(Duration::from_millis(self.rng.below(30))).await;
        self.proxy.heal();
        self.converge(fault).await;
    }

    /// Waits until every follower's state equals a fresh snapshot, then
    /// asserts it in detail (so a timeout still shows the difference).
    async fn converge(&mut self, fault: Fault) {
        let started = Instant::now();
        loop {
            let ok = self.check(fault, false).await;
            if ok || started.elapsed() > CONVERGE_WITHIN {
                break;
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        self.check(fault, true).await;
    }

    async fn check(&self, fault: Fault, assert: bool) -> bool {
        let node = self.lane.node.addr;
        let peer_marks = marks(self.lane.peer.addr).await;
        let snapshot = marks(node).await;
        macro_rules! expect {
            ($cond:expr, $($arg:tt)*) => {
                if !$cond {
                    if assert {
                        panic!("after {fault:?}: {}", format!($($arg)*));
                    }
                    return false;
                }
            };
        }
        expect!(
            snapshot.marks == peer_marks.marks,
            "node and peer have not converged: {:?} vs {:?}",
            snapshot.marks,
            peer_marks.marks
        );
        let marks_vector = vector(&snapshot.marks);
        let floor = vector(&snapshot.floor);
        for (stream, tracked) in &self.followers {
            let name = &tracked.name;
            let (ended, cursor) = {
                let state = tracked.state.lock().unwrap();
                (state.ended, state.cursor.clone())
            };
            expect!(!ended, "{name}: the follower ended");
            match stream {
                FollowStream::Status => {
                    let state = tracked.state.lock().unwrap();
                    let Some(status) = &state.status else {
                        expect!(false, "{name}: no status yet");
                        unreachable!()
                    };
                    expect!(
                        status.marks == snapshot.marks,
                        "{name}: marks {:?} vs {:?}",
                        status.marks,
                        snapshot.marks
                    );
                    expect!(status.floor == snapshot.floor, "{name}: floor");
                    expect!(status.digest == snapshot.digest, "{name}: digest");
                    expect!(status.token == snapshot.token, "{name}: token");
                }
                FollowStream::All | FollowStream::Writer(_) => {
                    let only = match stream {
                        FollowStream::Writer(id) => Some(*id),
                        _ => None,
                    };
                    // The cursor: the node's head (of that writer), other
                    // entries as the follower started.
                    let expected_cursor = match only {
                        None => tracked.start.joined(&marks_vector),
                        Some(id) => {
                            let mut cursor = tracked.start.clone();
                            cursor.advance(id, marks_vector.get(id));
                            cursor
                        }
                    };
                    expect!(
                        cursor == expected_cursor,
                        "{name}: cursor {:?}, the node's head {:?}",
                        cursor,
                        expected_cursor
                    );
                    let fresh =
                        walk_from(node, &tracked.start.joined(&floor), only.map(StreamId::get))
                            .await;
                    let state = tracked.state.lock().unwrap();
                    // Exactly once, each stream in seq order with no hole
                    // (a jump only at a reported stale gap).
                    let mut last: BTreeMap<StreamId, u64> = tracked.start.iter().collect();
                    for event in &state.events {
                        let stream = stream_of(event);
                        let previous = last.get(&stream).copied().unwrap_or(0);
                        let jumped = state
                            .stale
                            .iter()
                            .any(|(_, resume)| resume.get(stream) + 1 == event.seq);
                        assert!(
                            event.seq == previous + 1 || (jumped && event.seq > previous),
                            "{name}: event {}:{} after {previous}: a duplicate or a hole",
                            event.stream,
                            event.seq
                        );
                        last.insert(stream, event.seq);
                        if let Some(id) = only {
                            assert_eq!(stream, id, "{name}: another writer's event");
                        }
                    }
                    let held: Vec<EventJson> = state
                        .events
                        .iter()
                        .filter(|event| event.seq > floor.get(stream_of(event)))
                        .cloned()
                        .collect();
                    expect!(
                        digest(&held) == digest(&fresh),
                        "{name}: holds {} events above the floor, a fresh read has {}",
                        held.len(),
                        fresh.len()
                    );
                    let mut sorted = held.clone();
                    sorted.sort_by_key(|e| (stream_of(e), e.seq));
                    let mut fresh_sorted = fresh.clone();
                    fresh_sorted.sort_by_key(|e| (stream_of(e), e.seq));
                    expect!(
                        sorted == fresh_sorted,
                        "{name}: events differ from a fresh read"
                    );
                    if fault == Fault::CompactionPastCutFollower {
                        expect!(
                            !state.stale.is_empty(),
                            "{name}: the compaction past it was not reported stale"
                        );
                    }
                }
            }
        }
        true
    }
}

/// What a schedule's followers reported, summed over the run to show the
/// faults were felt (gaps refetched, stale gaps reported).
#[derive(Debug, Default, Clone, Copy)]
struct Felt {
    refetched: usize,
    stale: usize,
    reconnected: usize,
}

async fn schedule(lane: &Lane, seed: u64) -> Felt {
    let mut rng = SplitMix64::new(seed);
    let proxy = WsProxy::start(lane.node.addr, SplitMix64::derive(seed, 1)).await;
    let start = vector(&marks(lane.node.addr).await.marks);
    let streams = [
        FollowStream::All,
        FollowStream::Writer(StreamId::new(lane.peer.node.stream())),
        FollowStream::Writer(StreamId::new(lane.node.node.stream())),
        FollowStream::Status,
    ];
    let followers = streams
        .iter()
        .map(|&stream| {
            let mut config = FollowerConfig::new(vec![proxy.url()], stream);
            config.after = start.clone();
            config.gap_timeout = Duration::from_millis(80);
            config.idle_timeout = Duration::from_secs(2);
            config.backoff_min = Duration::from_millis(10);
            config.backoff_max = Duration::from_millis(80);
            config.accept_stale = true;
            (stream, Tracked::start(&stream.to_string(), config))
        })
        .collect();
    let mut schedule = Schedule {
        lane,
        proxy,
        followers,
        rng: SplitMix64::new(SplitMix64::derive(seed, 2)),
        written: 0,
    };
    for _ in 0..PHASES {
        let fault = FAULTS[rng.below(FAULTS.len() as u64) as usize];
        let started = Instant::now();
        schedule.phase(fault).await;
        if std::env::var_os("FOLLOW_TIMES").is_some() {
            eprintln!("{fault:?}: {:?}", started.elapsed());
        }
    }
    let mut felt = Felt::default();
    for (_, tracked) in &schedule.followers {
        let state = tracked.state.lock().unwrap();
        felt.refetched += state.refetched;
        felt.stale += state.stale.len();
        felt.reconnected += state.connected.saturating_sub(1);
    }
    felt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn case_a_follower_converges_after_loss() {
    let seeds = seeds(0xca5ea, SCHEDULES);
    let lanes = LANES.min(seeds.len());
    let mut tasks = Vec::new();
    for lane_index in 0..lanes {
        let mine: Vec<u64> = seeds
            .iter()
            .copied()
            .skip(lane_index)
            .step_by(lanes)
            .collect();
        tasks.push(tokio::spawn(async move {
            let lane = start_lane(lane_index).await;
            let mut felt = Felt::default();
            for seed in mine {
                let _report = Report::new("case_a_follower_converges_after_loss", seed);
                let one = schedule(&lane, seed).await;
                felt.refetched += one.refetched;
                felt.stale += one.stale;
                felt.reconnected += one.reconnected;
            }
            felt
        }));
    }
    let mut felt = Felt::default();
    for task in tasks {
        match task.await {
            Ok(one) => {
                felt.refetched += one.refetched;
                felt.stale += one.stale;
                felt.reconnected += one.reconnected;
            }
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
    eprintln!("followers felt the faults: {felt:?}");
    if seeds.len() == SCHEDULES {
        assert!(felt.refetched > 0, "no gap was ever refetched: {felt:?}");
        assert!(felt.stale > 0, "no stale gap was ever reported: {felt:?}");
        assert!(
            felt.reconnected > 0,
            "no follower ever reconnected: {felt:?}"
        );
    }
}
