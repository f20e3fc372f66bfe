//! `ForkProof`: a writer's equivocation with valid signatures, as a third
//! party can check it (`docs/SIGNING.md`, "Equivocation with valid
//! signatures"). Pure functions of bytes: nothing here reads a store.
//!
//! A proof shows that one key sealed two histories of its stream that
//! differ at seq [`ForkProof::seq`]: each [`ForkBranch`] gives the chain
//! hash of its history at that seq and the events from there up to a seal,
//! which must chain to the hash the seal signs. Because each chain hash
//! commits to everything below it (BLAKE3), a branch whose events chain
//! from `hash_at` to its seal shows that the writer's sealed history had
//! `hash_at` at `seq`; two branches with different hashes there show two
//! histories, both signed: the writer forked its stream at or below `seq`.
//! No relay can make one without the writer's key signing both.
//!
//! **Checkable by anyone** who knows the stream's key (a derived stream's
//! key is the one that derives it; a legacy stream's, the one a trusted
//! [`Binding`] names): [`ForkProof::verify`] needs nothing else, and
//! [`ForkProof::from_bytes`] decodes any byte string totally (a proof or a
//! [`ForkError`]), bounded by [`ForkProof::BYTES_MAX`] and
//! [`ForkProof::EVENTS_MAX`] per branch, checked before anything is
//! allocated.
//!
//! The encoding, integers little-endian:
//!
//! ```text
//! "meshlog fork v1" (15) · key [32] · seq u64
//! 2 × branch: seal [112, as Seal::to_bytes] · hash_at [32] · count u32
//!             · count × (lamport u64 · time_ms u64 · len u32 · payload)
//! ```
//!
//! A branch's events are its stream's seqs `seq + 1 ..= seal.seq`, in
//! order: their stream and seqs are implied, so they cannot disagree.

use bytes::Bytes;
use meshlog_cursor::StreamId;

use crate::{Binding, ChainHash, Event, Seal, SealError, WriterPublicKey};

/// The domain string that starts a proof's encoding.
const FORK_DOMAIN: &[u8] = b"meshlog fork v1";
/// Bytes of an event in a branch before its payload.
const EVENT_HEAD_LEN: usize = 8 + 8 + 4;
/// Bytes of a branch before its events.
const BRANCH_HEAD_LEN: usize = Seal::LEN + 32 + 4;

/// Proof that a writer's key sealed two histories of its stream (see the
/// module docs): the two branches differ at `seq`.
///
/// ```
/// use meshlog_replica::{ChainHash, Event, ForkBranch, ForkProof, Seal, WriterKey};
/// let key = WriterKey::from_bytes([5; 32]);
/// let stream = key.stream();
/// // Two histories of one event each, both sealed at seq 1.
/// let branch = |payload: &'static [u8]| {
///     let event = Event { stream, seq: 1, lamport: 1, time_ms: 0, payload: payload.into() };
///     let head = ChainHash::GENESIS.next(&event);
///     ForkBranch { seal: Seal::sign(&key, 1, head), hash_at: ChainHash::GENESIS, events: vec![event] }
/// };
/// // At seq 0 both hashes are the genesis: no proof there...
/// let same = ForkProof { key: key.public(), seq: 0, branches: [branch(b"a"), branch(b"b")] };
/// assert!(same.verify(None).is_err());
/// // ...but at seq 1, where the seals are, they differ.
/// let at_one = |b: ForkBranch| ForkBranch { hash_at: b.seal.head, events: vec![], ..b };
/// let proof = ForkProof {
///     key: key.public(),
///     seq: 1,
///     branches: [at_one(branch(b"a")), at_one(branch(b"b"))],
/// };
/// proof.verify(None)?;
/// assert_eq!(ForkProof::from_bytes(&proof.to_bytes())?, proof);
/// # Ok::<(), meshlog_replica::ForkError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkProof {
    /// The key that sealed both branches.
    pub key: WriterPublicKey,
    /// The seq at which the branches' chain hashes differ: the writer's
    /// histories diverge at or below it.
    pub seq: u64,
    /// The two branches.
    pub branches: [ForkBranch; 2],
}

/// One history of a forked stream, as a [`ForkProof`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkBranch {
    /// A seal of the history, at or above the proof's seq.
    pub seal: Seal,
    /// The history's chain hash at the proof's seq.
    pub hash_at: ChainHash,
    /// The history's events from the proof's seq + 1 to the seal's seq:
    /// they chain from `hash_at` to the sealed hash.
    pub events: Vec<Event>,
}

/// Why bytes are not a [`ForkProof`], or a proof does not prove a fork.
/// Each variant names what a caller needs to report it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForkError {
    /// The encoding is longer than [`ForkProof::BYTES_MAX`].
    #[error("fork proof: {len} bytes, above the {max} a proof may take")]
    TooLarge {
        /// The input's length.
        len: usize,
        /// [`ForkProof::BYTES_MAX`].
        max: usize,
    },
    /// The encoding ends early, has bytes left over, or does not start
    /// with the proof's domain string.
    #[error("fork proof: malformed at byte {at}: {detail}")]
    Malformed {
        /// Where decoding stopped.
        at: usize,
        /// What was expected there.
        detail: &'static str,
    },
    /// A branch holds more events than [`ForkProof::EVENTS_MAX`].
    #[error("fork proof: branch {branch} holds {count} events, above the {max} allowed")]
    TooManyEvents {
        /// Which branch (0 or 1).
        branch: usize,
        /// Its events.
        count: usize,
        /// [`ForkProof::EVENTS_MAX`].
        max: usize,
    },
    /// The key, or a seal under it, is refused: not a usable key, not the
    /// stream's key, or a signature that does not verify.
    #[error("fork proof: {0}")]
    Seal(#[from] SealError),
    /// The two seals are of different streams.
    #[error("fork proof: the seals are of streams {first} and {second}")]
    OtherStreams {
        /// The first branch's stream.
        first: StreamId,
        /// The second branch's stream.
        second: StreamId,
    },
    /// A branch's events are not its stream's seqs from the proof's seq + 1
    /// to its seal, or do not chain from its hash to the sealed one.
    #[error("fork proof of stream {stream}: branch {branch} does not chain from seq {seq} to its seal at seq {seal_seq}")]
    BranchBroken {
        /// The stream.
        stream: StreamId,
        /// Which branch (0 or 1).
        branch: usize,
        /// The proof's seq.
        seq: u64,
        /// The branch's seal's seq.
        seal_seq: u64,
    },
    /// A valid proof of the receiver's own stream: its key signed two
    /// histories, so it may have leaked. Logged at `error`; the own
    /// stream is never frozen.
    #[error(
        "fork proof of this replica's own stream {stream}: its key may have leaked; not frozen"
    )]
    OwnStream {
        /// The own stream.
        stream: StreamId,
    },
    /// Both branches have the same chain hash at the proof's seq: one
    /// history, no fork.
    #[error("fork proof of stream {stream}: both branches have the same chain hash at seq {seq}")]
    SameHistory {
        /// The stream.
        stream: StreamId,
        /// The proof's seq.
        seq: u64,
    },
}

impl ForkProof {
    /// The most bytes a proof's encoding takes: 1 MiB.
    pub const BYTES_MAX: usize = 1 << 20;
    /// The most events a branch holds: 4,096.
    pub const EVENTS_MAX: usize = 4096;

    /// The forked stream (its seals').
    pub fn stream(&self) -> StreamId {
        self.branches[0].seal.stream
    }

    /// Checks that the proof proves a fork of its stream by its key: the
    /// key signs for the stream (derives it, or `binding`, one the caller
    /// trusts, names it), both seals are of that stream and verify, each
    /// branch's events are the seqs from [`ForkProof::seq`] + 1 to its seal
    /// and chain from its `hash_at` to the sealed hash, and the two
    /// `hash_at` differ. Bounded: at most [`ForkProof::EVENTS_MAX`] events
    /// a branch are hashed.
    pub fn verify(&self, binding: Option<&Binding>) -> Result<(), ForkError> {
        let stream = self.stream();
        let second = self.branches[1].seal.stream;
        if second != stream {
            return Err(ForkError::OtherStreams {
                first: stream,
                second,
            });
        }
        self.key.signs_for(stream, binding)?;
        for (index, branch) in self.branches.iter().enumerate() {
            self.verify_branch(index, branch)?;
            branch.seal.verify_bound(&self.key, binding)?;
        }
        if self.branches[0].hash_at == self.branches[1].hash_at {
            return Err(ForkError::SameHistory {
                stream,
                seq: self.seq,
            });
        }
        Ok(())
    }

    /// One branch's path: bounded, the right seqs, chaining to its seal.
    fn verify_branch(&self, index: usize, branch: &ForkBranch) -> Result<(), ForkError> {
        let stream = self.stream();
        let seal = &branch.seal;
        if branch.events.len() > ForkProof::EVENTS_MAX {
            return Err(ForkError::TooManyEvents {
                branch: index,
                count: branch.events.len(),
                max: ForkProof::EVENTS_MAX,
            });
        }
        let broken = ForkError::BranchBroken {
            stream,
            branch: index,
            seq: self.seq,
            seal_seq: seal.seq,
        };
        let expected_len = seal.seq.checked_sub(self.seq);
        let seqs_right = expected_len == Some(branch.events.len() as u64)
            && branch.events.iter().zip(1u64..).all(|(event, offset)| {
                event.stream == stream && event.seq == self.seq.wrapping_add(offset)
            });
        if !seqs_right || branch.hash_at.extend(&branch.events) != seal.head {
            return Err(broken);
        }
        Ok(())
    }

    /// The proof's encoding (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(FORK_DOMAIN);
        out.extend_from_slice(&self.key.to_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        for branch in &self.branches {
            out.extend_from_slice(&branch.seal.to_bytes());
            out.extend_from_slice(branch.hash_at.as_bytes());
            out.extend_from_slice(&(branch.events.len() as u32).to_le_bytes());
            for event in &branch.events {
                out.extend_from_slice(&event.lamport.to_le_bytes());
                out.extend_from_slice(&event.time_ms.to_le_bytes());
                out.extend_from_slice(&(event.payload.len() as u32).to_le_bytes());
                out.extend_from_slice(&event.payload);
            }
        }
        out
    }

    /// The length of [`ForkProof::to_bytes`].
    pub fn encoded_len(&self) -> usize {
        let branches: usize = self
            .branches
            .iter()
            .map(|branch| {
                let events: usize = branch
                    .events
                    .iter()
                    .map(|event| EVENT_HEAD_LEN + event.payload.len())
                    .sum();
                BRANCH_HEAD_LEN + events
            })
            .sum();
        FORK_DOMAIN.len() + 32 + 8 + branches
    }

    /// The proof these bytes encode, or why not: any byte string gives one
    /// or the other, and nothing is allocated beyond what the input's
    /// length allows. A proof decoded is not yet checked:
    /// [`ForkProof::verify`] judges it.
    pub fn from_bytes(bytes: &[u8]) -> Result<ForkProof, ForkError> {
        if bytes.len() > ForkProof::BYTES_MAX {
            return Err(ForkError::TooLarge {
                len: bytes.len(),
                max: ForkProof::BYTES_MAX,
            });
        }
        let mut reader = Reader { bytes, at: 0 };
        if reader.take(FORK_DOMAIN.len(), "the domain string")? != FORK_DOMAIN {
            return Err(reader.malformed("the domain string \"meshlog fork v1\""));
        }
        let key = WriterPublicKey::from_bytes(reader.take(32, "a key")?)?;
        let seq = reader.u64("the seq")?;
        let first = reader.branch(0, seq)?;
        let second = reader.branch(1, seq)?;
        if reader.at != bytes.len() {
            return Err(reader.malformed("the end of the proof"));
        }
        Ok(ForkProof {
            key,
            seq,
            branches: [first, second],
        })
    }
}

/// A cursor over a proof's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn malformed(&self, detail: &'static str) -> ForkError {
        ForkError::Malformed {
            at: self.at,
            detail,
        }
    }

    fn take(&mut self, len: usize, detail: &'static str) -> Result<&'a [u8], ForkError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| self.malformed(detail))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u64(&mut self, detail: &'static str) -> Result<u64, ForkError> {
        let bytes = self.take(8, detail)?;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    fn u32(&mut self, detail: &'static str) -> Result<u32, ForkError> {
        let bytes = self.take(4, detail)?;
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    /// Branch `index` of a proof at `seq`: its events' count is checked
    /// against the bound and the bytes left before any is read.
    fn branch(&mut self, index: usize, seq: u64) -> Result<ForkBranch, ForkError> {
        let seal = Seal::from_bytes(self.take(Seal::LEN, "a seal")?)?;
        let hash_at =
            ChainHash::from_bytes(self.take(32, "a chain hash")?.try_into().expect("32 bytes"));
        let count = self.u32("a count of events")? as usize;
        let left = self.bytes.len() - self.at;
        if count > ForkProof::EVENTS_MAX {
            return Err(ForkError::TooManyEvents {
                branch: index,
                count,
                max: ForkProof::EVENTS_MAX,
            });
        }
        if count > left / EVENT_HEAD_LEN {
            return Err(self.malformed("as many events as counted"));
        }
        let mut events = Vec::with_capacity(count);
        for offset in 1..=count as u64 {
            let lamport = self.u64("an event's lamport")?;
            let time_ms = self.u64("an event's time")?;
            let len = self.u32("a payload's length")? as usize;
            let payload = Bytes::copy_from_slice(self.take(len, "a payload")?);
            events.push(Event {
                stream: seal.stream,
                seq: seq.wrapping_add(offset),
                lamport,
                time_ms,
                payload,
            });
        }
        Ok(ForkBranch {
            seal,
            hash_at,
            events,
        })
    }
}
