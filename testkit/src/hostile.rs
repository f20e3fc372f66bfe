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
    let run = SealedRun::of(honest, key);
    let mut tampered = altered_events(&run);
    tampered.extend(added_events(&run, foreign));
    tampered.extend(swapped_seals(&run, key, head_hash, stranger));
    tampered
}

/// The honest delta's sealed run of the writer's stream: what each kind
/// of tampering starts from.
struct SealedRun<'a> {
    honest: &'a Delta,
    stream: StreamId,
    /// The run's seal.
    sealed: RunSeal,
    /// Where the run's events are in the delta, in order.
    at: Vec<usize>,
    /// The seqs of its first and last events.
    first: u64,
    last: u64,
}

impl<'a> SealedRun<'a> {
    /// Panics if `honest` carries no sealed run of three events or more of
    /// `key`'s stream.
    fn of(honest: &'a Delta, key: &WriterKey) -> Self {
        let stream = key.stream();
        let sealed = *honest
            .seals
            .iter()
            .find(|s| s.seal.stream == stream)
            .expect("the honest delta seals the writer's run");
        let at: Vec<usize> = (0..honest.events.len())
            .filter(|&i| honest.events[i].stream == stream)
            .collect();
        assert!(at.len() >= 3, "the run has three events or more");
        SealedRun {
            honest,
            stream,
            sealed,
            first: honest.events[at[0]].seq,
            last: sealed.seal.seq,
            at,
        }
    }

    /// The run's last event, in the delta.
    fn end(&self) -> usize {
        self.at[self.at.len() - 1]
    }

    /// What a run whose events do not chain to its seal is refused with.
    fn broken(&self) -> DeltaError {
        DeltaError::ChainBroken {
            stream: self.stream,
            seq: self.last,
        }
    }

    /// The honest delta with its events changed.
    fn with(&self, change: impl Fn(&mut Vec<Event>)) -> Delta {
        let mut delta = self.honest.clone();
        change(&mut delta.events);
        delta
    }

    /// The honest delta with the run's seal swapped for `seal`, in its
    /// stream's place among the others' (streams ascending, as a delta
    /// lists them): a frame cannot carry seals out of that order, so a
    /// swap appended last would not even cross the wire.
    fn with_seal(&self, seal: Option<RunSeal>) -> Delta {
        let mut delta = self.honest.clone();
        delta.seals.retain(|s| s.seal.stream != self.stream);
        delta.seals.extend(seal);
        delta.seals.sort_by_key(|s| s.seal.stream);
        delta
    }
}

/// The run's events altered in place: each breaks the chain to the seal.
fn altered_events(run: &SealedRun) -> Vec<Tampering> {
    let at = &run.at;
    vec![
        Tampering {
            what: "a payload altered",
            delta: run.with(|events| events[at[1]].payload = bytes_of(b"forged")),
            refusal: run.broken(),
        },
        Tampering {
            what: "a lamport altered (still rising)",
            delta: run.with(|events| events[run.end()].lamport += 1),
            refusal: run.broken(),
        },
        Tampering {
            what: "a time altered",
            delta: run.with(|events| events[at[0]].time_ms ^= 1),
            refusal: run.broken(),
        },
        Tampering {
            what: "two events' contents swapped inside the run",
            delta: run.with(|events| {
                let (a, b) = (events[at[0]].payload.clone(), events[at[1]].payload.clone());
                events[at[0]].payload = b;
                events[at[1]].payload = a;
            }),
            refusal: run.broken(),
        },
    ]
}

/// Events the writer did not write passed off as its own: one added
/// under the seal, one of another writer spliced into the run.
fn added_events(run: &SealedRun, foreign: &Event) -> Vec<Tampering> {
    let stream = run.stream;
    vec![
        Tampering {
            what: "the writer's next event forged under the seal",
            delta: run.with(|events| {
                let mut next = events[run.end()].clone();
                next.seq += 1;
                next.lamport += 1;
                next.payload = bytes_of(b"forged next");
                events.push(next);
            }),
            refusal: run.broken(),
        },
        Tampering {
            what: "another writer's event spliced into the run",
            delta: run.with(|events| {
                let at = &events[run.at[1]];
                events[run.at[1]] = Event {
                    stream,
                    seq: at.seq,
                    lamport: at.lamport,
                    ..foreign.clone()
                };
            }),
            refusal: run.broken(),
        },
    ]
}

/// The run's seal replaced (an older one of `key`'s, one `stranger`
/// signs, one whose signature is altered) or cut off; the events intact.
fn swapped_seals(
    run: &SealedRun,
    key: &WriterKey,
    head_hash: ChainHash,
    stranger: &WriterKey,
) -> Vec<Tampering> {
    let (stream, sealed) = (run.stream, run.sealed);
    let mut signature = sealed.seal.signature;
    signature[0] ^= 1;
    vec![
        Tampering {
            what: "the seal replaced with an older one",
            delta: run.with_seal(Some(RunSeal {
                seal: Seal::sign(key, run.first - 1, head_hash),
                ..sealed
            })),
            refusal: DeltaError::ChainBroken {
                stream,
                seq: run.first - 1,
            },
        },
        Tampering {
            what: "a seal by another key",
            delta: run.with_seal(Some(RunSeal {
                key: stranger.public(),
                seal: Seal::sign_for(stranger, stream, run.last, sealed.seal.head),
                base: None,
            })),
            refusal: DeltaError::KeyMismatch {
                stream,
                derived: stranger.stream(),
            },
        },
        Tampering {
            what: "the seal's signature altered",
            delta: run.with_seal(Some(RunSeal {
                seal: Seal {
                    signature,
                    ..sealed.seal
                },
                ..sealed
            })),
            refusal: DeltaError::BadSeal {
                stream,
                seq: run.last,
            },
        },
        Tampering {
            what: "the seal cut off",
            delta: run.with_seal(None),
            refusal: DeltaError::Unsealed {
                stream,
                seq: run.first,
            },
        },
    ]
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
