//! The checks of the `seal_verify` fuzz target, on one fuzzer input: a key,
//! a run of events chained from a base, a seal over its end, verified as a
//! receiver verifies (it computes the head from the events it got, then
//! checks the seal over that head under the stream's key), and each signed
//! statement decoded and verified.
//!
//! Input format: the first byte picks the mode, the rest is read as fields
//! (past its end, every byte reads as 0, so every input is a case).
//!
//! - even first byte (**raw**): the key (32 bytes), the seal (112), the
//!   base hash (32), then the events (below), all from the input. Nothing
//!   needs to verify; decoding is total and verification never panics.
//!   Batch and single verification agree: a batch of a valid seal and the
//!   input's seal answers exactly what the input's seal alone answers.
//! - odd first byte (**signed**): a fixed writer key seals the run the
//!   input describes (first seq: 8 bytes, base hash: 32, events), so the
//!   fuzzer starts past the signature; then one change (a target byte, a
//!   position u16, an xor byte) alters the key, the seal or an event. The
//!   run must verify unchanged and be refused when changed (a change of the
//!   head the seal carries alone changes nothing: the receiver computes it).
//!
//! Events: a count byte (mod 17), then per event its lamport and time (u64
//! LE each), a payload length byte (mod 64) and the payload.
//!
//! This file is compiled into the fuzz crate and, by `#[path]`, into the
//! replica's `seal_fuzz_regressions` test: it may use only `meshlog_replica`,
//! `meshlog_cursor` and std.

use meshlog_cursor::StreamId;
use meshlog_replica::{
    verify_seals, AdminKey, Binding, ChainHash, Event, Seal, SealError, SignedAdmission,
    SignedBinding, SignedCompaction, WriterKey, WriterPublicKey,
};

/// The fixed secret of the signed mode's writer.
pub const WRITER_SECRET: [u8; 32] = [0x42; 32];
/// The fixed secret of the admin key statements are verified against.
pub const ADMIN_SECRET: [u8; 32] = [0xad; 32];

/// Runs every check on one fuzzer input; panics on a violation.
pub fn check_input(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut input = Fields(rest);
    if mode & 1 == 0 {
        let _ = check_raw(&mut input);
    } else {
        check_signed(&mut input);
    }
    check_statements(rest);
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

    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    /// A run of events of `stream` from `first_seq`.
    fn events(&mut self, stream: StreamId, first_seq: u64) -> Vec<Event> {
        let count = u64::from(self.u8() % 17);
        (0..count)
            .map_while(|i| {
                let seq = first_seq.checked_add(i)?;
                let lamport = self.u64();
                let time_ms = self.u64();
                let len = usize::from(self.u8() % 64);
                let payload: Vec<u8> = (0..len).map(|_| self.u8()).collect();
                Some(Event {
                    stream,
                    seq,
                    lamport,
                    time_ms,
                    payload: payload.into(),
                })
            })
            .collect()
    }
}

/// The receiver's check of a run: the head it computes from the events,
/// the seal over that head, under `key`.
fn receive(key: &WriterPublicKey, seal: &Seal, base: ChainHash, events: &[Event]) -> bool {
    let head = base.extend(events);
    Seal { head, ..*seal }.verify(key).is_ok()
}

/// Whether a raw-mode input's run verifies (`None`: not raw mode, or the
/// key does not decode): for the replay test to show that its seeds reach
/// both answers.
pub fn raw_verdict(data: &[u8]) -> Option<bool> {
    let (&mode, rest) = data.split_first()?;
    if mode & 1 != 0 {
        return None;
    }
    check_raw(&mut Fields(rest))
}

fn check_raw(input: &mut Fields<'_>) -> Option<bool> {
    let key = WriterPublicKey::from_bytes(&input.bytes::<32>());
    let seal =
        Seal::from_bytes(&input.bytes::<{ Seal::LEN }>()).expect("any 112 bytes decode to a seal");
    assert_eq!(Seal::from_bytes(&seal.to_bytes()), Ok(seal), "round trip");
    let base = ChainHash::from_bytes(input.bytes());
    let first_seq = seal.seq.saturating_sub(15).max(1);
    let events = input.events(seal.stream, first_seq);
    let Ok(key) = key else { return None };
    assert_eq!(WriterPublicKey::from_bytes(&key.to_bytes()), Ok(key));
    let verdict = receive(&key, &seal, base, &events);

    // The batch answers what the seal alone answers.
    let alone = seal.verify(&key);
    if let Err(SealError::KeyMismatch { stream, derived }) = alone {
        assert_eq!((stream, derived), (seal.stream, key.stream()));
    }
    let honest = WriterKey::from_bytes(WRITER_SECRET);
    let valid = Seal::sign(&honest, 1, ChainHash::GENESIS);
    let batch = [(valid, honest.public()), (seal, key)];
    assert_eq!(
        verify_seals(&batch, &[]),
        alone,
        "batch and single disagree"
    );
    // A binding of the seal's stream to the key makes the key's id
    // irrelevant, not the signature.
    let binding = Binding {
        stream: seal.stream,
        key,
    };
    let bound = seal.verify_bound(&key, Some(&binding));
    assert!(!matches!(bound, Err(SealError::KeyMismatch { .. })));
    assert_eq!(verify_seals(&batch, &[binding]), bound);
    Some(verdict)
}

fn check_signed(input: &mut Fields<'_>) {
    let writer = WriterKey::from_bytes(WRITER_SECRET);
    let key = writer.public();
    let first_seq = (input.u64() % (1 << 20)) + 1;
    let base = ChainHash::from_bytes(input.bytes());
    let events = input.events(writer.stream(), first_seq);
    let last = first_seq + events.len() as u64 - 1;
    let seal = Seal::sign(&writer, last, base.extend(&events));
    assert!(receive(&key, &seal, base, &events), "an honest run refused");

    let target = input.u8() % 3;
    let at = usize::from(u16::from_le_bytes(input.bytes()));
    let xor = input.u8();
    if xor == 0 {
        return;
    }
    let accepted = match target {
        0 => {
            let mut bytes = key.to_bytes();
            bytes[at % 32] ^= xor;
            match WriterPublicKey::from_bytes(&bytes) {
                Ok(changed) => receive(&changed, &seal, base, &events),
                Err(_) => false,
            }
        }
        1 => {
            let mut bytes = seal.to_bytes();
            bytes[at % Seal::LEN] ^= xor;
            let changed = Seal::from_bytes(&bytes).expect("a seal's length");
            receive(&key, &changed, base, &events)
        }
        _ => {
            if events.is_empty() {
                return;
            }
            let mut changed = events.clone();
            let event = &mut changed[at % events.len()];
            match xor % 4 {
                0 => event.lamport ^= u64::from(xor),
                1 => event.time_ms ^= u64::from(xor),
                2 if !event.payload.is_empty() => {
                    let mut payload = event.payload.to_vec();
                    let i = (at / 4) % payload.len();
                    payload[i] ^= xor;
                    event.payload = payload.into();
                }
                _ => {
                    let mut payload = event.payload.to_vec();
                    payload.push(xor);
                    event.payload = payload.into();
                }
            }
            receive(&key, &seal, base, &changed)
        }
    };
    // The receiver checks the seal over the head it computes, so a changed
    // head carried in the seal changes nothing; any other change is refused.
    let head_only = target == 1 && (16..48).contains(&(at % Seal::LEN));
    assert_eq!(
        accepted, head_only,
        "target {target}, at {at}, xor {xor}: a changed run verified, or a seal whose carried \
         head alone changed was refused"
    );
}

/// Each statement's encoding decoded from the input's start, verified
/// against the fixed admin key; a decoded one re-encodes to its bytes.
fn check_statements(rest: &[u8]) {
    let admin = AdminKey::from_bytes(ADMIN_SECRET).public();
    if let Some(bytes) = rest.get(..SignedCompaction::LEN) {
        if let Ok(statement) = SignedCompaction::from_bytes(bytes) {
            assert_eq!(&statement.to_bytes()[..], bytes);
            let _ = statement.verify(Some(&admin), None);
        }
    }
    if let Some(bytes) = rest.get(..SignedAdmission::LEN) {
        if let Ok(statement) = SignedAdmission::from_bytes(bytes) {
            assert_eq!(&statement.to_bytes()[..], bytes);
            let _ = statement.verify(&admin);
        }
    }
    if let Some(bytes) = rest.get(..SignedBinding::LEN) {
        if let Ok(statement) = SignedBinding::from_bytes(bytes) {
            assert_eq!(&statement.to_bytes()[..], bytes);
            let _ = statement.verify(&admin);
        }
    }
    let _ = SignedCompaction::from_bytes(rest);
}
