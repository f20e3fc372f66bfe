//! A hostile relay at the replica level (`docs/SIGNING.md`, "Seals" and
//! "Floors with an authority"): the ways a relay can tamper with a
//! writer's sealed delta, each with the refusal a receiver must answer,
//! and the floors it can send to erase a writer's events, each with the
//! refusal or the ignoring due. Any crate's tests can play them against a
//! receiver and check that each is refused or ignored, the receiver
//! unchanged, and that the honest delta is still taken afterwards.

//!
//! And a hostile *writer*: [`equivocating_writers`], one key that signs
//! two histories of its stream (equivocation with valid signatures,
//! `docs/SIGNING.md`), which no relay can forge and every receiver must
//! prove, keep and freeze on.

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{
    AdminKey, ChainHash, Compaction, Config, Delta, DeltaError, Event, MemStore, Replica, RunSeal,
    Seal, WriterKey,
};

/// Two replicas of one writer `key` that share the events `common`, then
/// each write their own history: `a` on the first, `b` on the second (a
/// writer restored from a backup and written on, or a key copied to a
/// second machine). Both seal their stream with `key`: two histories,
/// each validly signed. `a` and `b` should differ in their first event
/// (else the fork is further on).
pub fn equivocating_writers(
    key: &WriterKey,
    common: &[Bytes],
    a: &[Bytes],
    b: &[Bytes],
) -> (Replica<MemStore>, Replica<MemStore>) {
    let config = || Config::with_key(key.clone());
    let mut first = Replica::open(config(), MemStore::default()).expect("an empty store opens");
    for payload in common {
        first.append(payload.clone()).expect("append");
    }
    let backup = first.store().clone();
    let mut second = Replica::open(config(), backup).expect("the copy opens");
    for payload in a {
        first.append(payload.clone()).expect("append");
    }
    for payload in b {
        second.append(payload.clone()).expect("append");
    }
    (first, second)
}

/// One tampering: what it does, the delta it makes, and the refusal due.
#[derive(Debug, Clone)]
pub struct Tampering {
    /// What the relay did, for the failure message.
    pub what: &'static str,
    /// The tampered delta.
    pub delta: Delta,
    /// The refusal a receiver must answer.
    pub refusal: DeltaError,
}

/// The tamperings of `honest`, a delta carrying one sealed run of at least
/// three events of `key`'s stream that attaches at the receiver's head,
/// whose hash there is `head_hash` (at seq `first - 1`). `stranger` signs
/// the seal another key makes; `foreign` is another writer's event,
/// spliced into the run. With `require_seals` (or a stream the receiver
/// pinned), cutting the seal off is refused too.
///
/// Panics if `honest` is not such a delta (a test's own mistake).
pub fn tamperings(
    honest: &Delta,
    key: &WriterKey,
    head_hash: meshlog_replica::ChainHash,
    stranger: &WriterKey,
    foreign: &Event,
) -> Vec<Tampering> {
    let stream = key.stream();
    let sealed = *honest
        .seals
        .iter()
        .find(|s| s.seal.stream == stream)
        .expect("the honest delta seals the writer's run");
    let run: Vec<usize> = (0..honest.events.len())
        .filter(|&i| honest.events[i].stream == stream)
        .collect();
    assert!(run.len() >= 3, "the run has three events or more");
    let last = sealed.seal.seq;
    let first = honest.events[run[0]].seq;
    let broken = DeltaError::ChainBroken { stream, seq: last };
    let with = |change: &dyn Fn(&mut Vec<Event>)| {
        let mut delta = honest.clone();
        change(&mut delta.events);
        delta
    };
    // The seal swapped in its stream's place among the others' (streams
    // ascending, as a delta lists them): a frame cannot carry seals out of
    // that order, so a swap appended last would not even cross the wire.
    let with_seal = |seal: Option<RunSeal>| {
        let mut delta = honest.clone();
        delta.seals.retain(|s| s.seal.stream != stream);
        delta.seals.extend(seal);
        delta.seals.sort_by_key(|s| s.seal.stream);
        delta
    };
    let mut tampered = vec![
        Tampering {
            what: "a payload altered",
            delta: with(&|events| events[run[1]].payload = bytes_of(b"forged")),
            refusal: broken.clone(),
        },
        Tampering {
            what: "a lamport altered (still rising)",
            delta: with(&|events| events[run[run.len() - 1]].lamport += 1),
            refusal: broken.clone(),
        },
        Tampering {
            what: "a time altered",
            delta: with(&|events| events[run[0]].time_ms ^= 1),
            refusal: broken.clone(),
        },
        Tampering {
            what: "two events' contents swapped inside the run",
            delta: with(&|events| {
                let (a, b) = (
                    events[run[0]].payload.clone(),
                    events[run[1]].payload.clone(),
                );
                events[run[0]].payload = b;
                events[run[1]].payload = a;
            }),
            refusal: broken.clone(),
        },
        Tampering {
            what: "the writer's next event forged under the seal",
            delta: with(&|events| {
                let mut next = events[run[run.len() - 1]].clone();
                next.seq += 1;
                next.lamport += 1;
                next.payload = bytes_of(b"forged next");
                events.push(next);
            }),
            refusal: broken.clone(),
        },
        Tampering {
            what: "another writer's event spliced into the run",
            delta: with(&|events| {
                let at = &events[run[1]];
                events[run[1]] = Event {
                    stream,
                    seq: at.seq,
                    lamport: at.lamport,
                    ..foreign.clone()
                };
            }),
            refusal: broken.clone(),
        },
        Tampering {
            what: "the seal replaced with an older one",
            delta: with_seal(Some(RunSeal {
                seal: Seal::sign(key, first - 1, head_hash),
                ..sealed
            })),
            refusal: DeltaError::ChainBroken {
                stream,
                seq: first - 1,
            },
        },
        Tampering {
            what: "a seal by another key",
            delta: with_seal(Some(RunSeal {
                key: stranger.public(),
                seal: Seal::sign_for(stranger, stream, last, sealed.seal.head),
                base: None,
            })),
            refusal: DeltaError::KeyMismatch {
                stream,
                derived: stranger.stream(),
            },
        },
        Tampering {
            what: "the seal's signature altered",
            delta: with_seal(Some(RunSeal {
                seal: Seal {
                    signature: {
                        let mut signature = sealed.seal.signature;
                        signature[0] ^= 1;
                        signature
                    },
                    ..sealed.seal
                },
                ..sealed
            })),
            refusal: DeltaError::BadSeal { stream, seq: last },
        },
    ];
    tampered.push(Tampering {
        what: "the seal cut off",
        delta: with_seal(None),
        refusal: DeltaError::Unsealed { stream, seq: first },
    });
    tampered
}

fn bytes_of(bytes: &'static [u8]) -> bytes::Bytes {
    bytes::Bytes::from_static(bytes)
}

/// What a receiver must answer a hostile floor with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FloorOutcome {
    /// Refused with this reason (the session ends, nothing changes).
    Refused(DeltaError),
    /// Taken and ignored: nothing erased, the stream reported behind the
    /// floor (`ApplyReport::behind_floor`), the delta's events of the
    /// stream not taken; the session goes on.
    Ignored,
}

/// One hostile floor: what it claims, the delta carrying it (no events),
/// and the outcome due.
#[derive(Debug, Clone)]
pub struct FloorAttack {
    /// What the relay did, for the failure message.
    pub what: &'static str,
    /// The delta (a floor, and for a signed one its statement).
    pub delta: Delta,
    /// What the receiver must answer.
    pub outcome: FloorOutcome,
}

/// The hostile floors against a receiver that holds `stream` up to `head`
/// (events above its floor), whose chain hash there is `head_hash`, and
/// trusts an admin key other than `not_admin`: an unsigned floor above the
/// held events (ignored: nothing erased), and a floor at `head` with a
/// statement over the right hash signed by `not_admin` (refused,
/// `StatementNoAuthority`: only the writer or the trusted admin may
/// erase).
pub fn floor_attacks(
    stream: StreamId,
    head: u64,
    head_hash: ChainHash,
    not_admin: &AdminKey,
) -> Vec<FloorAttack> {
    let floor_delta = |floor: u64| Delta {
        floor: [(stream, floor)].into_iter().collect(),
        ..Delta::default()
    };
    let mut signed = floor_delta(head);
    let statement = Compaction {
        stream,
        floor: head,
        hash: head_hash,
    }
    .sign_by_admin(not_admin);
    signed.floor_proofs.statements.push(statement);
    vec![
        FloorAttack {
            what: "an unsigned floor above held events",
            delta: floor_delta(head + 5),
            outcome: FloorOutcome::Ignored,
        },
        FloorAttack {
            what: "a floor signed by a key that is not the admin's",
            delta: signed,
            outcome: FloorOutcome::Refused(DeltaError::StatementNoAuthority {
                stream,
                floor: head,
                derived: statement.signer.stream(),
            }),
        },
    ]
}
