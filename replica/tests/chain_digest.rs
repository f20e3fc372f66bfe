//! The chain heads (`docs/SIGNING.md`, "Hash chain"): what converged
//! replicas answer as their digest whatever each compacted, kept through
//! appends, deliveries and compactions, reopened as they were, and checked
//! by `verify`.
//!
//! - Two replicas that converged and compacted at different floors answer
//!   equal chain digests, where their `Digest` sums differ (the fault
//!   harness's finding: `GET /marks` digests disagreed after compactions).
//! - A seeded property over random appends, deliveries (with floors: the
//!   writers compact too), compactions and reopens, on `MemStore`s and a
//!   `DiskStore`: every anchored stream's chain hash at a replica's head is
//!   the chain of the writer's own events up to that head (a reference
//!   model), so two replicas that hold one head of a stream agree; an
//!   unanchored stream has a floor; a reopened replica answers the same
//!   chains as before; `verify` passes.
//! - `verify` refuses a store whose recorded head hash was altered, with a
//!   typed error naming the stream.

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Batch, ChainDigest, ChainHash, Config, Delta, DiskStore, Event, MemStore, Replica,
    ReplicaError, Store, StoreMeta, StoreView, StreamChain,
};
use meshlog_testkit::{seed, SplitMix64};

mod common;

/// The fault harness's finding, as a test: converged replicas that
/// compacted at different times answered different digests.
#[test]
fn converged_replicas_that_compacted_at_different_floors_answer_one_chain_digest() {
    let (one, two, three) = (StreamId::new(1), StreamId::new(2), StreamId::new(3));
    let mut a = Replica::new(one);
    let mut b = Replica::new(two);
    let mut writer = Replica::new(three);
    for i in 0..20u8 {
        a.append_at(vec![i], 100 + u64::from(i)).unwrap();
        b.append_at(vec![i, i], 200).unwrap();
        writer.append_at(vec![i; 3], 300).unwrap();
    }
    common::push(&writer, &mut a, 1 << 20);
    common::push(&writer, &mut b, 1 << 20);
    let link = common::Link::default();
    link.sync(&mut a, &mut b);
    assert_eq!(a.marks(), b.marks());
    assert_eq!(a.digest(), b.digest(), "converged, nothing compacted");
    assert_eq!(a.chain_digest(), b.chain_digest());
    // a compacts twice, b once and elsewhere.
    a.compact(&[(one, 5), (three, 7)].into_iter().collect())
        .unwrap();
    a.compact(&[(one, 12), (two, 20), (three, 9)].into_iter().collect())
        .unwrap();
    b.compact(&[(three, 18), (one, 2)].into_iter().collect())
        .unwrap();
    assert_eq!(a.marks(), b.marks(), "the heads did not move");
    assert_ne!(a.floor(), b.floor());
    // The old digest sums what is held: it moved with each floor.
    assert_ne!(a.digest(), b.digest(), "the sums differ");
    assert_ne!(a.digest().sum, b.digest().sum);
    // The chain heads did not.
    let (da, db) = (a.chain_digest(), b.chain_digest());
    assert_eq!(da, db, "per stream and overall");
    assert_eq!(da.streams.len(), 3);
    for head in &da.streams {
        assert!(head.chain.is_some(), "stream {} anchored", head.stream);
        assert_eq!(db.stream(head.stream), Some(head));
    }
    // Compacting to the head keeps it too, and both still verify.
    b.compact(&b.marks()).unwrap();
    assert_eq!(b.chain_digest(), da);
    a.verify().unwrap();
    b.verify().unwrap();
    // The formula of the overall hash (docs, `ChainDigest`).
    let mut bytes = Vec::new();
    for head in &da.streams {
        bytes.extend_from_slice(&head.stream.get().to_le_bytes());
        bytes.extend_from_slice(&head.head.to_le_bytes());
        bytes.push(1);
        bytes.extend_from_slice(head.chain.unwrap().as_bytes());
    }
    assert_eq!(
        da.hash.to_bytes(),
        blake3::derive_key("meshlog digest v1", &bytes)
    );
}

/// A replica on a `MemStore` or on a `DiskStore` in its own directory.
// A handful of nodes in a test: boxing the store would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Node {
    Mem(Replica<MemStore>),
    Disk(Replica<DiskStore>, PathBuf),
    /// Between a close and a reopen.
    Closed,
}

macro_rules! on {
    ($node:expr, $replica:ident => $body:expr) => {
        match $node {
            Node::Mem($replica) => $body,
            Node::Disk($replica, _) => $body,
            Node::Closed => unreachable!("reopened at once"),
        }
    };
}

impl Node {
    fn marks(&self) -> VersionVector {
        on!(self, r => r.marks())
    }
    fn floor(&self) -> VersionVector {
        on!(self, r => r.floor())
    }
    fn stream(&self) -> StreamId {
        on!(self, r => r.stream())
    }
    fn chain(&self, stream: StreamId) -> Option<StreamChain> {
        on!(self, r => r.chain(stream))
    }
    fn chain_digest(&self) -> ChainDigest {
        on!(self, r => r.chain_digest())
    }
    fn delta_for(&self, marks: &VersionVector, budget: usize) -> Delta {
        on!(self, r => r.delta_for(marks, budget))
    }
    fn apply(&mut self, delta: &Delta) {
        on!(self, r => { r.apply(delta).expect("an honest delta applies"); })
    }
    fn compact(&mut self, target: &VersionVector) {
        on!(self, r => { r.compact(target).unwrap(); })
    }
    fn append(&mut self, payload: Bytes, time_ms: u64) -> Event {
        on!(self, r => r.append_at(payload, time_ms).unwrap())
    }
    fn verify(&self) {
        on!(self, r => { r.verify().unwrap(); })
    }
    /// Closes and reopens the replica on its store.
    fn reopen(&mut self) {
        *self = match std::mem::replace(self, Node::Closed) {
            Node::Mem(r) => {
                let config = r.config().clone();
                Node::Mem(Replica::open(config, r.into_store()).unwrap())
            }
            Node::Disk(r, dir) => {
                let config = r.config().clone();
                drop(r);
                let store = DiskStore::open(&dir).unwrap();
                Node::Disk(Replica::open(config, store).unwrap(), dir)
            }
            Node::Closed => unreachable!(),
        };
    }
}

/// The chains of every stream a node holds.
fn chains(node: &Node) -> Vec<(StreamId, Option<StreamChain>)> {
    node.marks()
        .iter()
        .map(|(stream, _)| (stream, node.chain(stream)))
        .collect()
}

#[test]
fn every_anchored_chain_head_is_the_writers_chain_through_appends_deliveries_compactions_and_reopens(
) {
    // Over the seeds: streams seen unanchored (a peer's floor above
    // everything held), checked by head alone.
    let mut unanchored_seen = 0;
    seed::for_each_seed("chain_heads_property", 0xc4a1_4ead, 8, |seed| {
        let mut rng = SplitMix64::new(seed);
        let dir = tempfile::tempdir().unwrap();
        let mut nodes: Vec<Node> = (1..=4u64)
            .map(|id| Node::Mem(Replica::new(StreamId::new(id))))
            .collect();
        let disk_dir = dir.path().join("disk");
        let disk = DiskStore::open(&disk_dir).unwrap();
        nodes.push(Node::Disk(
            Replica::open(Config::new(StreamId::new(5)), disk).unwrap(),
            disk_dir,
        ));
        // Every stream's events as its writer appended them.
        let mut history: BTreeMap<StreamId, Vec<Event>> = BTreeMap::new();
        let mut reopens = 0;
        for step in 0..400 {
            let n = nodes.len() as u64;
            let i = rng.below(n) as usize;
            match rng.below(12) {
                0..=4 => {
                    for _ in 0..rng.between(1, 4) {
                        let len = rng.below(40) as usize;
                        let payload = Bytes::from(vec![step as u8; len]);
                        let event = nodes[i].append(payload, rng.below(1_000));
                        history.entry(event.stream).or_default().push(event);
                    }
                }
                5..=8 => {
                    let j = (i + 1 + rng.below(n - 1) as usize) % nodes.len();
                    let budget = rng.below(600) as usize;
                    let delta = nodes[i].delta_for(&nodes[j].marks(), budget);
                    nodes[j].apply(&delta);
                }
                9 | 10 => {
                    let mut target = VersionVector::new();
                    for (stream, head) in nodes[i].marks().iter() {
                        if rng.chance(0.6) {
                            target.advance(stream, rng.below(head + 1));
                        }
                    }
                    nodes[i].compact(&target);
                }
                _ => {
                    let before = (chains(&nodes[i]), nodes[i].chain_digest());
                    nodes[i].reopen();
                    reopens += 1;
                    let after = (chains(&nodes[i]), nodes[i].chain_digest());
                    assert_eq!(after, before, "reopened node {i}, step {step}");
                }
            }
            check(&nodes, &history, step, &mut unanchored_seen);
            if step % 50 == 49 {
                nodes.iter().for_each(Node::verify);
            }
        }
        nodes.iter().for_each(Node::verify);
        assert!(reopens > 10, "reopened {reopens} times");
    });
    assert!(unanchored_seen > 0, "no stream was ever unanchored");
}

/// Every node's anchored chain heads against the writers' histories, and
/// pairwise: equal heads, equal hashes.
fn check(
    nodes: &[Node],
    history: &BTreeMap<StreamId, Vec<Event>>,
    step: usize,
    unanchored_seen: &mut usize,
) {
    let mut seen: BTreeMap<(StreamId, u64), ChainHash> = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let digest = node.chain_digest();
        for (stream, head) in node.marks().iter() {
            let chain = node.chain(stream).expect("every held stream has a chain");
            let listed = digest.stream(stream).expect("every held stream is listed");
            assert_eq!(listed.head, head);
            if !chain.anchored {
                *unanchored_seen += 1;
                assert!(
                    node.floor().get(stream) > 0,
                    "node {i}, step {step}: stream {stream} unanchored with nothing compacted"
                );
                assert_eq!(listed.chain, None);
                continue;
            }
            let events = &history[&stream][..head as usize];
            let expected = ChainHash::GENESIS.extend(events);
            assert_eq!(
                chain.head_hash,
                expected,
                "node {i} (own {}), step {step}: stream {stream} at head {head}",
                node.stream()
            );
            assert_eq!(listed.chain, Some(expected));
            let floor = node.floor().get(stream) as usize;
            assert_eq!(
                chain.floor_hash,
                ChainHash::GENESIS.extend(&history[&stream][..floor]),
                "node {i}, step {step}: stream {stream} at floor {floor}"
            );
            if let Some(other) = seen.insert((stream, head), chain.head_hash) {
                assert_eq!(other, chain.head_hash, "step {step}: stream {stream}");
            }
        }
    }
}

/// A store whose recorded chain head of one stream was altered (one bit):
/// what a damaged or tampered file would hand over.
struct Tampered {
    inner: MemStore,
    stream: StreamId,
}

impl Store for Tampered {
    type Error = std::convert::Infallible;

    fn meta(&self) -> Result<StoreMeta, Self::Error> {
        let mut meta = self.inner.meta()?;
        let chain = meta.chains.get_mut(&self.stream).expect("recorded");
        let mut bytes = chain.head_hash.to_bytes();
        bytes[7] ^= 0x10;
        chain.head_hash = ChainHash::from_bytes(bytes);
        Ok(meta)
    }

    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), Self::Error> {
        self.inner.read_stream(stream, after_seq, limit, out)
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), Self::Error> {
        self.inner.commit(batch)
    }

    fn view(&self) -> Option<StoreView> {
        self.inner.view()
    }
}

#[test]
fn verify_refuses_a_tampered_chain_head_naming_the_stream() {
    let mut writer = Replica::new(StreamId::new(7));
    for i in 0..10u8 {
        writer.append_at(vec![i], 5).unwrap();
    }
    let mut replica = Replica::new(StreamId::new(1));
    replica.append(&b"own"[..]).unwrap();
    common::push(&writer, &mut replica, 1 << 20);
    replica
        .compact(&[(StreamId::new(7), 4)].into_iter().collect())
        .unwrap();
    let honest = replica.chain(StreamId::new(7)).unwrap();
    replica.verify().unwrap();
    let config = replica.config().clone();
    let store = Tampered {
        inner: replica.into_store(),
        stream: StreamId::new(7),
    };
    let opened = Replica::open(config, store).unwrap();
    match opened.verify() {
        Err(ReplicaError::ChainMismatch {
            stream,
            head,
            recorded,
            recomputed,
        }) => {
            assert_eq!((stream, head), (StreamId::new(7), 10));
            assert_ne!(*recorded, honest.head_hash);
            assert_eq!(*recomputed, honest.head_hash);
        }
        other => panic!("expected ChainMismatch, got {other:?}"),
    }
}

/// A batch committed by hand (no chains) makes a store forget the chains
/// of the streams it touches; a replica opened on it chains them again
/// from their floors: anchored from `h(0)` where nothing was compacted,
/// unanchored where something was.
#[test]
fn a_store_written_without_chains_is_chained_again_on_open() {
    let stream = StreamId::new(4);
    let events: Vec<Event> = (1..=6u64)
        .map(|seq| Event {
            stream,
            seq,
            lamport: seq,
            time_ms: 9,
            payload: Bytes::from(vec![seq as u8; 3]),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let config = Config::new(StreamId::new(1));
    let mut mem = MemStore::default();
    let mut disk = DiskStore::open(dir.path()).unwrap();
    for batch in [
        Batch::from_events(events[..4].to_vec()).with_clock(4),
        Batch::from_events(events[4..].to_vec()).with_clock(6),
    ] {
        mem.commit(&batch).unwrap();
        disk.commit(&batch).unwrap();
    }
    assert!(mem.meta().unwrap().chains.is_empty());
    let expected = StreamChain {
        floor_hash: ChainHash::GENESIS,
        head_hash: ChainHash::GENESIS.extend(&events),
        anchored: true,
    };
    let replica = Replica::open(config.clone(), mem.clone()).unwrap();
    assert_eq!(replica.chain(stream), Some(expected));
    replica.verify().unwrap();
    let replica = Replica::open(config.clone(), disk).unwrap();
    assert_eq!(replica.chain(stream), Some(expected));
    replica.verify().unwrap();
    // A floor raised by hand: the events below it are gone, unanchored.
    let floor = Batch::default()
        .with_floors(vec![(stream, 2)])
        .with_clock(6);
    mem.commit(&floor).unwrap();
    let replica = Replica::open(config, mem).unwrap();
    let chain = replica.chain(stream).unwrap();
    assert!(!chain.anchored);
    assert_eq!(replica.chain_digest().stream(stream).unwrap().chain, None);
    replica.verify().unwrap();
}
