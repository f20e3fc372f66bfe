//! Sealed streams at the replica (`docs/SIGNING.md`, "Seals"): a keyed
//! replica seals its own stream's head lazily, once per head, and the seal
//! vouches for exactly the chain it holds.
//!
//! Each test builds keyed replicas from fixed secrets and checks what the
//! seal says against the replica's own chain, and how often it signed
//! (`Stats::seals_signed`).

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Config, MemStore, Replica, WriterKey};

fn keyed(secret: u8) -> (WriterKey, Replica<MemStore>) {
    let key = WriterKey::from_bytes([secret; 32]);
    let replica = Replica::open(Config::with_key(key.clone()), MemStore::default())
        .expect("an empty store opens");
    (key, replica)
}

#[test]
fn a_keyed_replica_seals_its_head_once_until_the_head_moves() {
    let (key, mut writer) = keyed(7);
    assert_eq!(writer.stream(), key.stream());
    assert_eq!(writer.own_seal(), None, "nothing to seal before an append");
    writer.append(&b"one"[..]).expect("append");
    writer.append(&b"two"[..]).expect("append");
    let seal = writer.own_seal().expect("a keyed replica seals its head");
    assert_eq!((seal.stream, seal.seq), (key.stream(), 2));
    let chain = writer.chain(key.stream()).expect("the own stream is held");
    assert_eq!(
        seal.head, chain.head_hash,
        "the seal is over the chain held"
    );
    seal.verify(&key.public()).expect("its key signs it");
    // Asked again (another delta) at the same head: the kept seal.
    let _ = writer.delta_for(&VersionVector::new(), usize::MAX);
    assert_eq!(writer.own_seal(), Some(seal));
    assert_eq!(writer.stats().seals_signed, 1, "one signature per head");
    // The head moves: a new seal, signed once more.
    writer.append(&b"three"[..]).expect("append");
    let next = writer.own_seal().expect("sealed");
    assert_eq!(next.seq, 3);
    assert_eq!(next.head, writer.chain(key.stream()).unwrap().head_hash);
    next.verify(&key.public()).expect("its key signs it");
    assert_eq!(writer.stats().seals_signed, 2);
}

#[test]
fn an_unkeyed_replica_seals_nothing() {
    let mut replica = Replica::new(StreamId::new(5));
    replica.append(&b"one"[..]).expect("append");
    assert_eq!(replica.own_seal(), None);
    assert_eq!(replica.stats().seals_signed, 0);
}
