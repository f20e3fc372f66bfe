//! The checks of the `fork_verify` fuzz target, on one fuzzer input: a
//! fork proof (`meshlog_replica::ForkProof`, `docs/SIGNING.md`,
//! "Equivocation with valid signatures") decoded and verified as a
//! receiver does with one a peer passes on.
//!
//! Input format: the first byte picks the mode, the rest is read as fields
//! (past its end, every byte reads as 0, so every input is a case).
//!
//! - even first byte (**raw**): the rest is a proof's bytes. Decoding is
//!   total and verification never panics; a proof that decodes re-encodes
//!   to the very bytes it came from (the encoding is canonical).
//! - odd first byte (**signed**): a fixed writer key seals two branches the
//!   input describes (the fork seq: a byte mod 8; per branch its hash at
//!   the seq, 32 bytes, and its events: a count byte mod 5, then per event
//!   its time, u64 LE, a payload length byte mod 16 and the payload), so
//!   the fuzzer starts past the signatures; then one change (a position
//!   u16, an xor byte) alters the proof's bytes. The proof must verify
//!   unchanged and be refused, by decoding or verification, when changed.
//!
//! This file is compiled into the fuzz crate and, by `#[path]`, into the
//! replica's `fork_fuzz_regressions` test: it may use only
//! `meshlog_replica`, `bytes` and std.

use meshlog_replica::{ChainHash, Event, ForkBranch, ForkProof, Seal, WriterKey};

/// The fixed secret of the signed mode's writer.
pub const WRITER_SECRET: [u8; 32] = [0x46; 32];

/// What one input came to, for the replay test to pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Raw bytes that are not a proof.
    NotDecoded,
    /// Raw bytes that decode, and whether the proof verifies.
    Decoded {
        /// Whether [`ForkProof::verify`] accepted it.
        verifies: bool,
    },
    /// A signed proof, verified, and its change refused (or no change).
    Signed,
}

/// Runs every check on one fuzzer input; panics on a violation.
pub fn check_input(data: &[u8]) -> Outcome {
    let Some((&mode, rest)) = data.split_first() else {
        return Outcome::NotDecoded;
    };
    if mode & 1 == 0 {
        check_raw(rest)
    } else {
        check_signed(&mut Fields(rest));
        Outcome::Signed
    }
}

fn check_raw(bytes: &[u8]) -> Outcome {
    match ForkProof::from_bytes(bytes) {
        Err(_) => Outcome::NotDecoded,
        Ok(proof) => {
            assert_eq!(proof.to_bytes(), bytes, "a proof re-encodes to its bytes");
            assert_eq!(proof.encoded_len(), bytes.len());
            Outcome::Decoded {
                verifies: proof.verify(None).is_ok(),
            }
        }
    }
}

fn check_signed(input: &mut Fields<'_>) {
    let key = WriterKey::from_bytes(WRITER_SECRET);
    let seq = u64::from(input.byte() % 8);
    let first = branch(&key, seq, input);
    let mut second = branch(&key, seq, input);
    if second.hash_at == first.hash_at {
        // One history is no fork: make the second branch another.
        let mut bytes = second.hash_at.to_bytes();
        bytes[0] ^= 1;
        second = resealed(&key, seq, ChainHash::from_bytes(bytes), second.events);
    }
    let proof = ForkProof {
        key: key.public(),
        seq,
        branches: [first, second],
    };
    proof.verify(None).expect("an honest proof verifies");
    let bytes = proof.to_bytes();
    assert_eq!(ForkProof::from_bytes(&bytes).as_ref(), Ok(&proof));
    let at = usize::from(u16::from_le_bytes(input.bytes::<2>())) % bytes.len();
    let xor = input.byte();
    if xor == 0 {
        return;
    }
    let mut changed = bytes;
    changed[at] ^= xor;
    let judged = ForkProof::from_bytes(&changed).and_then(|proof| proof.verify(None));
    assert!(
        judged.is_err(),
        "byte {at} changed by {xor:#04x} is accepted"
    );
}

/// A branch from `seq` the input describes, sealed by `key`.
fn branch(key: &WriterKey, seq: u64, input: &mut Fields<'_>) -> ForkBranch {
    let hash_at = ChainHash::from_bytes(input.bytes::<32>());
    let count = u64::from(input.byte() % 5);
    let stream = key.stream();
    let events = (1..=count)
        .map(|offset| {
            let time_ms = u64::from_le_bytes(input.bytes::<8>());
            let len = usize::from(input.byte() % 16);
            let payload: Vec<u8> = (0..len).map(|_| input.byte()).collect();
            Event {
                stream,
                seq: seq + offset,
                lamport: seq + offset,
                time_ms,
                payload: payload.into(),
            }
        })
        .collect();
    resealed(key, seq, hash_at, events)
}

/// A branch of `events` from `hash_at` at `seq`, sealed at its end.
fn resealed(key: &WriterKey, seq: u64, hash_at: ChainHash, events: Vec<Event>) -> ForkBranch {
    let head = hash_at.extend(&events);
    let seal = Seal::sign(key, seq + events.len() as u64, head);
    ForkBranch {
        seal,
        hash_at,
        events,
    }
}

/// The input read as fields; zeros past its end.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }

    fn byte(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
}
