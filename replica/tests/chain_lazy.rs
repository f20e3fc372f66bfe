//! Streams hashed lazily (`docs/SIGNING.md`, "Hash chain"): a stream that
//! is neither the own keyed stream nor pinned is not hashed at each
//! commit; its chain is recorded where it was last hashed, and extended
//! when the digest, a floor, `verify` or a seal asks. What a store
//! recorded must stay right across a reopen (a crash is a reopen of what
//! the last commit left): the digest after it is the writers', whatever
//! mix of deltas, digests asked, compactions and reopens came before.
//!
//! Seeded: each schedule prints its seed on failure; `MESHLOG_SEED`
//! replays one.

mod disk_support;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{ChainHash, Config, DiskStore, MemStore, Replica, Store, WriterKey};
use meshlog_testkit::{seed, SplitMix64};

const RECEIVER: StreamId = StreamId::new(1);

/// Two unkeyed writers and one keyed one, each appending a few events.
fn grow(writers: &mut [Replica<MemStore>], rng: &mut SplitMix64, time: u64) {
    for writer in writers.iter_mut() {
        let n = 1 + rng.next_u64() % 6;
        let payloads: Vec<Bytes> = (0..n)
            .map(|_| {
                Bytes::from(vec![
                    rng.next_u64() as u8;
                    1 + (rng.next_u64() % 40) as usize
                ])
            })
            .collect();
        writer.append_batch_at(payloads, time).expect("appends");
    }
}

/// The writers' chain hash at `head` of their own stream, as the
/// receiver's digest should answer it (the writer keeps every event).
fn expected_hash(writer: &Replica<MemStore>, stream: StreamId) -> ChainHash {
    writer.chain(stream).expect("held").head_hash
}

/// One schedule on a receiver whose store `reopen` rebuilds: deltas of
/// random budgets, digests asked now and then, compactions, reopens; at
/// every step the receiver's digest lists each writer's stream at the
/// receiver's head with the writer's hash there, and `verify` passes.
fn schedule<S: Store>(
    seed: u64,
    mut receiver: Replica<S>,
    reopen: impl Fn(Replica<S>) -> Replica<S>,
) where
    S::Error: std::fmt::Debug,
{
    let mut rng = SplitMix64::new(seed);
    let mut writers = vec![
        Replica::new(StreamId::new(11)),
        Replica::new(StreamId::new(12)),
        Replica::open(
            Config::with_key(WriterKey::from_bytes([7; 32])),
            MemStore::default(),
        )
        .expect("opens"),
    ];
    for step in 0..60u64 {
        grow(&mut writers, &mut rng, step);
        for writer in &writers {
            let budget = 64 + (rng.next_u64() % 600) as usize;
            let delta = writer.delta_for(&receiver.marks(), budget);
            receiver
                .apply(&delta)
                .unwrap_or_else(|error| panic!("seed {seed}, step {step}: {error}"));
        }
        match rng.next_u64() % 6 {
            0 => {
                let _ = receiver.chain_digest();
            }
            1 => {
                let target: VersionVector = receiver
                    .marks()
                    .iter()
                    .map(|(stream, head)| (stream, head - rng.next_u64() % (head + 1)))
                    .collect();
                receiver.compact(&target).expect("compacts");
            }
            2 => receiver = reopen(receiver),
            _ => {}
        }
        let digest = receiver.chain_digest();
        for writer in &writers {
            let stream = writer.stream();
            let Some(head) = digest.stream(stream) else {
                continue;
            };
            // The writer's hash at the receiver's head: its events up
            // to there, chained.
            let hash = writer
                .delta_for(&VersionVector::new(), usize::MAX)
                .events
                .iter()
                .filter(|e| e.stream == stream && e.seq <= head.head)
                .fold(ChainHash::GENESIS, |hash, e| hash.next(e));
            assert_eq!(
                head.chain,
                Some(hash),
                "seed {seed}, step {step}: stream {stream} at {}",
                head.head
            );
            if head.head == writer.marks().get(stream) {
                assert_eq!(head.chain, Some(expected_hash(writer, stream)));
            }
        }
        receiver
            .verify()
            .unwrap_or_else(|error| panic!("seed {seed}, step {step}: {error}"));
    }
}

#[test]
fn a_lazily_hashed_stream_answers_the_writers_digest_through_compactions_and_reopens_on_disk() {
    for seed in seed::seeds(0x1a2d, 4) {
        let dir = disk_support::scratch();
        let config = Config::new(RECEIVER);
        let open = |config: &Config| {
            Replica::open(config.clone(), DiskStore::open(dir.path()).expect("opens"))
                .expect("the receiver opens")
        };
        let receiver = open(&config);
        schedule(seed, receiver, |receiver| {
            drop(receiver);
            open(&config)
        });
    }
}

#[test]
fn a_lazily_hashed_stream_answers_the_writers_digest_through_reopens_in_memory() {
    for seed in seed::seeds(0x1a2e, 4) {
        let config = Config::new(RECEIVER);
        let receiver = Replica::open(config.clone(), MemStore::default()).expect("opens");
        schedule(seed, receiver, |receiver| {
            Replica::open(config.clone(), receiver.into_store()).expect("reopens")
        });
    }
}
