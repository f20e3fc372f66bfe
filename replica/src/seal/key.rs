//! Writer and admin keys: Ed25519 key pairs, and the stream id a writer's
//! public key derives (`docs/SIGNING.md`, "Keys and stream ids").

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use meshlog_cursor::StreamId;
use rand_core::{OsRng, RngCore};

use super::{KeyFault, SealError};

/// The BLAKE3 key-derivation context of stream ids.
const STREAM_ID_CONTEXT: &str = "meshlog stream id v1";

/// A writer's secret key: it signs the writer's seals and its compaction
/// statements. Its `Debug` prints the public key only; the secret is
/// zeroed when the key is dropped.
///
/// ```
/// use meshlog_replica::WriterKey;
/// let key = WriterKey::from_bytes([7; 32]);
/// assert_eq!(WriterKey::from_bytes(key.to_bytes()).public(), key.public());
/// assert!(!format!("{key:?}").contains(&"07".repeat(32)));
/// ```
#[derive(Clone)]
pub struct WriterKey(SigningKey);

/// A writer's public key: 32 bytes, a point of the curve's prime-order
/// subgroup in its canonical encoding. The stream it writes is
/// [`WriterPublicKey::stream`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriterPublicKey(VerifyingKey);

/// The mesh admin's secret key: it admits writers, binds legacy streams to
/// their keys, and may sign any stream's compaction. Kept off the writers.
#[derive(Clone)]
pub struct AdminKey(WriterKey);

/// The mesh admin's public key, from a node's trust configuration.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdminPublicKey(WriterPublicKey);

impl WriterKey {
    /// The size of a secret key's encoding.
    pub const LEN: usize = 32;

    /// A new key from the operating system's randomness.
    pub fn generate() -> Result<WriterKey, SealError> {
        let mut secret = [0u8; 32];
        OsRng
            .try_fill_bytes(&mut secret)
            .map_err(|e| SealError::Randomness {
                detail: e.to_string(),
            })?;
        let key = WriterKey::from_bytes(secret);
        zeroize::Zeroize::zeroize(&mut secret);
        Ok(key)
    }

    /// The key whose secret is these 32 bytes (any 32 bytes are a key).
    pub fn from_bytes(secret: [u8; 32]) -> WriterKey {
        WriterKey(SigningKey::from_bytes(&secret))
    }

    /// The secret's 32 bytes: what a key file holds. Handle with care.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The key's public half.
    pub fn public(&self) -> WriterPublicKey {
        WriterPublicKey(self.0.verifying_key())
    }

    /// The stream this key writes: its public key's [`WriterPublicKey::stream`].
    pub fn stream(&self) -> StreamId {
        self.public().stream()
    }

    pub(super) fn sign(&self, message: &[u8]) -> Signature {
        self.0.sign(message)
    }
}

/// Two keys are equal when their secrets are (compared in constant time),
/// so that a [`Config`](crate::Config) holding one compares.
impl PartialEq for WriterKey {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for WriterKey {}

impl std::fmt::Debug for WriterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterKey")
            .field("public", &self.public())
            .finish_non_exhaustive()
    }
}

impl WriterPublicKey {
    /// The size of a public key's encoding.
    pub const LEN: usize = 32;

    /// The key these 32 bytes encode, refused unless they are the canonical
    /// encoding of a point of the prime-order subgroup (what every key
    /// generated as Ed25519 says is).
    pub fn from_bytes(bytes: &[u8]) -> Result<WriterPublicKey, SealError> {
        decode_key(bytes, "writer key").map(WriterPublicKey)
    }

    /// The key's 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The stream this key writes:
    /// `u64::from_le_bytes(blake3::derive_key("meshlog stream id v1", key)[0..8])`.
    pub fn stream(&self) -> StreamId {
        let derived = blake3::derive_key(STREAM_ID_CONTEXT, self.0.as_bytes());
        let mut id = [0u8; 8];
        id.copy_from_slice(&derived[..8]);
        StreamId::new(u64::from_le_bytes(id))
    }

    /// Whether this key signs for `stream`: it derives it, or `binding`
    /// (one the receiver trusts: admin-signed or configured) names this key
    /// for it. Otherwise [`SealError::KeyMismatch`].
    pub fn signs_for(
        &self,
        stream: StreamId,
        binding: Option<&super::Binding>,
    ) -> Result<(), SealError> {
        let derived = self.stream();
        let bound = binding.is_some_and(|b| b.stream == stream && b.key == *self);
        if derived == stream || bound {
            Ok(())
        } else {
            Err(SealError::KeyMismatch { stream, derived })
        }
    }

    pub(super) fn verifying(&self) -> &VerifyingKey {
        &self.0
    }
}

impl std::fmt::Debug for WriterPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriterPublicKey({self})")
    }
}

impl std::fmt::Display for WriterPublicKey {
    /// Lowercase hex, 64 digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0
            .as_bytes()
            .iter()
            .try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl AdminKey {
    /// A new admin key from the operating system's randomness.
    pub fn generate() -> Result<AdminKey, SealError> {
        WriterKey::generate().map(AdminKey)
    }

    /// The key whose secret is these 32 bytes.
    pub fn from_bytes(secret: [u8; 32]) -> AdminKey {
        AdminKey(WriterKey::from_bytes(secret))
    }

    /// The secret's 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The key's public half.
    pub fn public(&self) -> AdminPublicKey {
        AdminPublicKey(self.0.public())
    }

    pub(super) fn sign(&self, message: &[u8]) -> Signature {
        self.0.sign(message)
    }
}

impl std::fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminKey")
            .field("public", &self.public())
            .finish_non_exhaustive()
    }
}

impl AdminPublicKey {
    /// The key these 32 bytes encode, refused as [`WriterPublicKey::from_bytes`]
    /// refuses.
    pub fn from_bytes(bytes: &[u8]) -> Result<AdminPublicKey, SealError> {
        decode_key(bytes, "admin key").map(|key| AdminPublicKey(WriterPublicKey(key)))
    }

    /// The key's 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    pub(super) fn as_writer(&self) -> &WriterPublicKey {
        &self.0
    }
}

impl std::fmt::Debug for AdminPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminPublicKey({})", self.0)
    }
}

/// The keys [`decode_key`] judged valid, kept for the process: a delta
/// carries its writers' keys with their seals, so a receiver is offered the
/// same few keys in every frame, and judging one (a point decompressed and
/// multiplied by the group order, about 40 µs) cost more than the
/// verification it serves. Only valid keys are kept, so a fault is found
/// again every time.
static DECODED_KEYS: std::sync::LazyLock<KeyCache> =
    std::sync::LazyLock::new(|| KeyCache::new(KeyCache::KEYS_MAX));

/// A bounded map from a key's 32 bytes to the key they were judged to be.
/// At its bound it is emptied, not searched for what to evict: a peer that
/// offers ever new valid keys (each costing it a key pair) makes the
/// receiver judge keys as often as it did without the cache, never more,
/// and the cache never holds more than its bound.
struct KeyCache {
    keys_max: usize,
    keys: std::sync::Mutex<std::collections::HashMap<[u8; 32], VerifyingKey>>,
}

impl KeyCache {
    /// The most keys kept: about 230 bytes each, under 1 MiB in all; a
    /// mesh of more writers than this judges keys again, as before.
    const KEYS_MAX: usize = 4096;

    fn new(keys_max: usize) -> KeyCache {
        KeyCache {
            keys_max,
            keys: std::sync::Mutex::default(),
        }
    }

    /// The key `bytes` encode: kept, or judged by `judge` and kept if
    /// valid.
    fn get_or_judge(
        &self,
        bytes: &[u8; 32],
        judge: impl FnOnce() -> Result<VerifyingKey, SealError>,
    ) -> Result<VerifyingKey, SealError> {
        let lock = || {
            self.keys
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if let Some(key) = lock().get(bytes) {
            return Ok(*key);
        }
        // Judged outside the lock: another thread may judge the same key
        // meanwhile, and both keep the same value.
        let key = judge()?;
        let mut keys = lock();
        if keys.len() >= self.keys_max {
            keys.clear();
        }
        keys.insert(*bytes, key);
        Ok(key)
    }
}

/// The one decoder of a public key: 32 bytes, a point, canonical, not of
/// small order, without a small-order component. A key judged valid
/// before is taken from [`DECODED_KEYS`].
fn decode_key(bytes: &[u8], what: &'static str) -> Result<VerifyingKey, SealError> {
    let bytes: &[u8; 32] = bytes.try_into().map_err(|_| SealError::WrongLength {
        what,
        expected: WriterPublicKey::LEN,
        got: bytes.len(),
    })?;
    DECODED_KEYS.get_or_judge(bytes, || judge_key(bytes, what))
}

/// [`decode_key`]'s checks, every time.
fn judge_key(bytes: &[u8; 32], what: &'static str) -> Result<VerifyingKey, SealError> {
    let fault = |fault| SealError::BadKey { what, fault };
    let key = VerifyingKey::from_bytes(bytes).map_err(|_| fault(KeyFault::NotAPoint))?;
    let point = key.to_edwards();
    if point.compress().as_bytes() != bytes {
        return Err(fault(KeyFault::NonCanonical));
    }
    if key.is_weak() {
        return Err(fault(KeyFault::SmallOrder));
    }
    if !point.is_torsion_free() {
        return Err(fault(KeyFault::Torsion));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    // The cache of judged keys: a kept key is the one judging gives, a
    // fault is judged again every time (only valid keys are kept), and the
    // cache never holds more than its bound.
    use super::*;

    fn judged(cache: &KeyCache, bytes: [u8; 32]) -> Result<VerifyingKey, SealError> {
        cache.get_or_judge(&bytes, || judge_key(&bytes, "writer key"))
    }

    #[test]
    fn a_kept_key_is_the_judged_one_and_a_fault_is_never_kept() {
        let cache = KeyCache::new(2);
        let real = WriterKey::from_bytes([3; 32]).public().to_bytes();
        let first = judged(&cache, real).unwrap();
        // Kept: judging is not asked again.
        let again = cache.get_or_judge(&real, || panic!("judged twice"));
        assert_eq!(again.unwrap(), first);
        assert_eq!(first.to_bytes(), real);
        // The identity, of small order: refused, and refused again.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        for _ in 0..2 {
            assert!(matches!(
                judged(&cache, identity),
                Err(SealError::BadKey {
                    fault: KeyFault::SmallOrder,
                    ..
                })
            ));
        }
        assert_eq!(cache.keys.lock().unwrap().len(), 1);
    }

    #[test]
    fn the_cache_is_emptied_at_its_bound() {
        let cache = KeyCache::new(2);
        for byte in 1..=5u8 {
            let bytes = WriterKey::from_bytes([byte; 32]).public().to_bytes();
            judged(&cache, bytes).unwrap();
            assert!(cache.keys.lock().unwrap().len() <= 2);
        }
        // The last key is kept; the first was emptied out and is judged
        // again, to the same key.
        let last = WriterKey::from_bytes([5; 32]).public().to_bytes();
        assert!(cache.get_or_judge(&last, || panic!("kept")).is_ok());
        let first = WriterKey::from_bytes([1; 32]).public().to_bytes();
        let mut asked = false;
        let key = cache.get_or_judge(&first, || {
            asked = true;
            judge_key(&first, "writer key")
        });
        assert!(asked);
        assert_eq!(key.unwrap().to_bytes(), first);
    }
}
