//! Writer keys, seals and signed statements: the cryptographic pieces of
//! signed streams (`docs/SIGNING.md`). Pure functions of bytes: nothing
//! here reads a store or knows a replica's state.
//!
//! - `key`: [`WriterKey`] and [`WriterPublicKey`] (Ed25519; a public key
//!   derives its stream's id), [`AdminKey`] and [`AdminPublicKey`].
//! - this file: [`Seal`], a writer's signature over its stream's chain hash
//!   at a seq, and [`verify_seals`], batch verification that names the bad
//!   seal.
//! - `statement`: [`Compaction`], [`WriterAdmission`] and [`Binding`], each
//!   signed under its own domain string.
//! - `error`: [`SealError`] and [`KeyFault`].
//!
//! Every signed message starts with its own domain string (`"meshlog seal
//! v1"`, `"meshlog compaction v1"`, …: no two share a prefix), then fixed-size
//! fields, so a signature for one kind is never a signature for another.
//! Every encoding has one fixed size and decodes totally.

mod error;
mod key;
mod statement;

use ed25519_dalek::{Signature, Verifier};
use meshlog_cursor::StreamId;

use crate::ChainHash;

pub use error::{KeyFault, SealError};
pub use key::{AdminKey, AdminPublicKey, WriterKey, WriterPublicKey};
pub use statement::{
    Binding, Compaction, CompactionSigner, SignedAdmission, SignedBinding, SignedCompaction,
    WriterAdmission,
};

/// The domain string that starts a seal's signed message.
const SEAL_DOMAIN: &[u8] = b"meshlog seal v1";

/// A writer's seal: its signature over the chain hash of its stream at
/// `seq`, which vouches for every event of the stream up to `seq`.
///
/// The signed message is [`Seal::message`]: `"meshlog seal v1"` (15 bytes)
/// `|| stream u64 LE || seq u64 LE || head` (63 bytes). The encoding is
/// `stream u64 LE || seq u64 LE || head || signature` ([`Seal::LEN`] bytes).
///
/// ```
/// use meshlog_replica::{ChainHash, Seal, WriterKey};
/// let key = WriterKey::from_bytes([1; 32]);
/// let seal = Seal::sign(&key, 3, ChainHash::from_bytes([2; 32]));
/// assert_eq!(seal.stream, key.stream());
/// seal.verify(&key.public())?;
/// assert_eq!(Seal::from_bytes(&seal.to_bytes())?, seal);
/// # Ok::<(), meshlog_replica::SealError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// The sealed stream.
    pub stream: StreamId,
    /// The sealed seq.
    pub seq: u64,
    /// The stream's chain hash at `seq`.
    pub head: ChainHash,
    /// The writer's Ed25519 signature over [`Seal::message`].
    pub signature: [u8; 64],
}

impl Seal {
    /// The size of a seal's encoding.
    pub const LEN: usize = 8 + 8 + 32 + 64;

    /// The seal `key` makes for its own stream ([`WriterKey::stream`]) at
    /// `seq`, whose chain hash is `head`.
    pub fn sign(key: &WriterKey, seq: u64, head: ChainHash) -> Seal {
        Seal::sign_for(key, key.stream(), seq, head)
    }

    /// The seal `key` makes for `stream`: a legacy stream bound to the key
    /// ([`Binding`]); for any other stream, [`Seal::verify`] refuses it.
    pub fn sign_for(key: &WriterKey, stream: StreamId, seq: u64, head: ChainHash) -> Seal {
        let signature = key.sign(&Seal::message(stream, seq, head)).to_bytes();
        Seal {
            stream,
            seq,
            head,
            signature,
        }
    }

    /// The bytes a seal signs: `"meshlog seal v1" || stream u64 LE || seq
    /// u64 LE || head`.
    pub fn message(stream: StreamId, seq: u64, head: ChainHash) -> [u8; 63] {
        let mut message = [0u8; 63];
        message[..15].copy_from_slice(SEAL_DOMAIN);
        message[15..23].copy_from_slice(&stream.get().to_le_bytes());
        message[23..31].copy_from_slice(&seq.to_le_bytes());
        message[31..].copy_from_slice(head.as_bytes());
        message
    }

    /// Checks that `key` signs for the seal's stream (it derives it) and
    /// that the signature verifies.
    pub fn verify(&self, key: &WriterPublicKey) -> Result<(), SealError> {
        self.verify_bound(key, None)
    }

    /// As [`Seal::verify`], where `binding` (a binding the receiver trusts)
    /// may name `key` for a legacy stream it does not derive.
    pub fn verify_bound(
        &self,
        key: &WriterPublicKey,
        binding: Option<&Binding>,
    ) -> Result<(), SealError> {
        key.signs_for(self.stream, binding)?;
        self.verify_signature(key)
    }

    /// The signature alone, by the cofactorless equation that
    /// `ed25519-dalek`'s `verify_batch` checks too.
    fn verify_signature(&self, key: &WriterPublicKey) -> Result<(), SealError> {
        let message = Seal::message(self.stream, self.seq, self.head);
        key.verifying()
            .verify(&message, &Signature::from_bytes(&self.signature))
            .map_err(|_| self.bad_signature())
    }

    fn bad_signature(&self) -> SealError {
        SealError::BadSignature {
            stream: self.stream,
            seq: self.seq,
        }
    }

    /// The seal's [`Seal::LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; Seal::LEN] {
        let mut bytes = [0u8; Seal::LEN];
        bytes[..8].copy_from_slice(&self.stream.get().to_le_bytes());
        bytes[8..16].copy_from_slice(&self.seq.to_le_bytes());
        bytes[16..48].copy_from_slice(self.head.as_bytes());
        bytes[48..].copy_from_slice(&self.signature);
        bytes
    }

    /// The seal these bytes encode: any [`Seal::LEN`] bytes are one (the
    /// signature is judged by [`Seal::verify`]); any other length is
    /// [`SealError::WrongLength`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Seal, SealError> {
        let bytes = fixed::<{ Seal::LEN }>(bytes, "seal")?;
        Ok(Seal {
            stream: StreamId::new(u64_at(bytes, 0)),
            seq: u64_at(bytes, 8),
            head: ChainHash::from_bytes(array(&bytes[16..48])),
            signature: array(&bytes[48..]),
        })
    }
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal")
            .field("stream", &self.stream)
            .field("seq", &self.seq)
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

/// A writer's seal as a delta carries it for its run of one stream: the
/// writer's public key, the seal at the run's last seq, and `base`, the
/// chain hash just below the run's first seq, when the run starts right
/// after the sender's floor (so a receiver that holds nothing there can
/// chain from it); otherwise the receiver chains from its own head hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSeal {
    /// The key that signed `seal`: it derives the stream.
    pub key: WriterPublicKey,
    /// The seal at the run's last seq.
    pub seal: Seal,
    /// The chain hash below the run's first seq, sent when the run starts
    /// right after the sender's floor.
    pub base: Option<ChainHash>,
}

/// What a delta carries to back its floors (`docs/SIGNING.md`, "Floors
/// with an authority"; on the wire, delta sections 1 and 2): compaction
/// statements, and the sender's chain hash at each floor it sends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FloorProofs {
    /// Per stream at most one signed compaction statement, streams
    /// strictly ascending: the newest the sender keeps of each stream
    /// whose floor the delta carries. One that verifies under the
    /// stream's writer key or the receiver's admin key erases the
    /// receiver's events of the stream up to its floor.
    pub statements: Vec<SignedCompaction>,
    /// Per stream of the delta's floor the sender is anchored at, its
    /// chain hash there, streams strictly ascending. Unsigned: a receiver
    /// takes it only where a statement vouches for the same hash.
    pub hashes: Vec<(StreamId, ChainHash)>,
}

impl FloorProofs {
    /// Whether it carries nothing.
    pub fn is_empty(&self) -> bool {
        self.statements.is_empty() && self.hashes.is_empty()
    }

    /// Keeps only the streams `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(StreamId) -> bool) {
        self.statements.retain(|s| keep(s.statement.stream));
        self.hashes.retain(|&(stream, _)| keep(stream));
    }
}

/// What a replica keeps of one writer's stream it received sealed
/// (`docs/SIGNING.md`, "Seals"): the key it pinned (the first that
/// verified: any other is refused for the stream) and the seals it holds
/// below and at its head, ascending by seq, each verified over the chain
/// it holds, thinned to at most [`KeptSeals::SEALS_MAX`]. A relay ends a
/// run of the stream at one of them. A store records it with the batch
/// that moves it ([`Batch::seals`](crate::Batch::seals)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptSeals {
    /// The key pinned for the stream.
    pub key: WriterPublicKey,
    /// The seals held, ascending by seq, all above the stream's floor.
    pub seals: Vec<Seal>,
}

impl KeptSeals {
    /// How many of the newest seals are always kept: 8.
    pub const SEALS_RECENT: usize = 8;
    /// The most seals kept per stream: the [`KeptSeals::SEALS_RECENT`]
    /// newest, and one per power-of-two distance below the head (64 at
    /// most): 72, about 8 KiB.
    pub const SEALS_MAX: usize = KeptSeals::SEALS_RECENT + 64;

    /// Thins the seals (ascending) for a stream held from `floor` to
    /// `head`: drops those at or below the floor or above the head, keeps
    /// the [`KeptSeals::SEALS_RECENT`] newest, and below them, the newest
    /// seal of each distance bucket `bit length of (head - seq)`, so the
    /// older seals are exponentially spaced and at most
    /// [`KeptSeals::SEALS_MAX`] remain.
    pub fn thin(&mut self, floor: u64, head: u64) {
        self.seals
            .retain(|seal| seal.seq > floor && seal.seq <= head);
        self.seals.dedup_by_key(|seal| seal.seq);
        let mut kept = 0usize;
        let mut last_bucket = None;
        let mut keep = vec![false; self.seals.len()];
        for (index, seal) in self.seals.iter().enumerate().rev() {
            let bucket = 64 - (head - seal.seq).leading_zeros();
            if kept < KeptSeals::SEALS_RECENT || last_bucket != Some(bucket) {
                keep[index] = true;
                kept += 1;
                last_bucket = Some(bucket);
            }
        }
        let mut flags = keep.into_iter();
        self.seals.retain(|_| flags.next().unwrap_or(false));
    }
}

/// Verifies many seals at once, each under its key: every key must sign
/// for its seal's stream (it derives it, or one of `bindings` names it),
/// then the signatures are checked as one Ed25519 batch. When the batch
/// fails, the seals are checked one by one, so the error names the first
/// bad seal's stream and seq (in the order given).
///
/// A batch of one or none is checked alone.
pub fn verify_seals(
    seals: &[(Seal, WriterPublicKey)],
    bindings: &[Binding],
) -> Result<(), SealError> {
    for (seal, key) in seals {
        let binding = bindings
            .iter()
            .find(|b| b.stream == seal.stream && b.key == *key);
        key.signs_for(seal.stream, binding)?;
    }
    if seals.len() > 1 {
        let messages: Vec<[u8; 63]> = seals
            .iter()
            .map(|(seal, _)| Seal::message(seal.stream, seal.seq, seal.head))
            .collect();
        let messages: Vec<&[u8]> = messages.iter().map(|m| &m[..]).collect();
        let signatures: Vec<Signature> = seals
            .iter()
            .map(|(seal, _)| Signature::from_bytes(&seal.signature))
            .collect();
        let keys: Vec<ed25519_dalek::VerifyingKey> =
            seals.iter().map(|(_, key)| *key.verifying()).collect();
        if ed25519_dalek::verify_batch(&messages, &signatures, &keys).is_ok() {
            return Ok(());
        }
    }
    seals
        .iter()
        .try_for_each(|(seal, key)| seal.verify_signature(key))
}

/// The little-endian `u64` at `at` (the caller checked the length).
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// `bytes` as an array of `N`, or [`SealError::WrongLength`].
fn fixed<'a, const N: usize>(
    bytes: &'a [u8],
    what: &'static str,
) -> Result<&'a [u8; N], SealError> {
    bytes.try_into().map_err(|_| SealError::WrongLength {
        what,
        expected: N,
        got: bytes.len(),
    })
}

fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut array = [0u8; N];
    array.copy_from_slice(bytes);
    array
}
