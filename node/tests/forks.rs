//! `GET /forks` (`docs/HTTP.md`): the streams a node holds proven forked
//! (`docs/SIGNING.md`, "Equivocation with valid signatures"), each with its
//! proof, which a client decodes and checks on its own.
//!
//! How: a node in a scratch directory answers an empty list; stopped, its
//! data directory's replica is given a proof (a writer key that sealed two
//! histories of one event each), as a peer's sync would give it; started
//! again, the node serves it: stream, seq, key, both signed heads, and the
//! proof's bytes, which decode to the proof kept and verify.

mod support;

use base64::Engine;
use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_node::Node;
use meshlog_replica::{
    ChainHash, Config, DiskStore, Event, ForkBranch, ForkProof, Replica, Seal, WriterKey,
};

/// A proof that `key` sealed two histories of one event each.
fn proof(key: &WriterKey) -> ForkProof {
    let stream = key.stream();
    let branch = |payload: &'static [u8]| {
        let event = Event {
            stream,
            seq: 1,
            lamport: 1,
            time_ms: 5,
            payload: Bytes::from_static(payload),
        };
        let head = ChainHash::GENESIS.next(&event);
        ForkBranch {
            seal: Seal::sign(key, 1, head),
            hash_at: head,
            events: Vec::new(),
        }
    };
    ForkProof {
        key: key.public(),
        seq: 1,
        branches: [branch(b"one history"), branch(b"another")],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_forks_serves_each_kept_proof_and_an_empty_list_without() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let node = Node::start(support::test_config(dir.path(), 7))
        .await
        .expect("starts");
    let answer = support::get(node.local_addr(), "/forks").await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json(), serde_json::json!({ "forks": [] }));
    node.shutdown();
    node.stopped().await;

    let key = WriterKey::from_bytes([31; 32]);
    let kept = proof(&key);
    {
        let store = DiskStore::open(dir.path()).expect("the store opens");
        let mut replica = Replica::open(Config::new(StreamId::new(7)), store).expect("opens");
        assert!(replica.keep_fork(&kept).expect("a valid proof is kept"));
    }

    let node = Node::start(support::test_config(dir.path(), 7))
        .await
        .expect("starts again");
    let answer = support::get(node.local_addr(), "/forks").await;
    assert_eq!(answer.status, 200);
    let body = answer.json();
    let forks = body["forks"].as_array().expect("a list");
    assert_eq!(forks.len(), 1, "{body}");
    let fork = &forks[0];
    assert_eq!(fork["stream"], key.stream().get().to_string());
    assert_eq!(fork["seq"], 1);
    assert_eq!(fork["key"], key.public().to_string());
    let heads: Vec<String> = fork["heads"]
        .as_array()
        .expect("heads")
        .iter()
        .map(|head| head["hash"].as_str().expect("a hash").to_string())
        .collect();
    let expected: Vec<String> = kept
        .branches
        .iter()
        .map(|branch| branch.seal.head.to_string())
        .collect();
    assert_eq!(heads, expected);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(fork["proof"].as_str().expect("the proof"))
        .expect("base64");
    let served = ForkProof::from_bytes(&bytes).expect("decodes");
    assert_eq!(served, kept);
    served.verify(None).expect("verifies on its own");
    node.shutdown();
    node.stopped().await;
}
