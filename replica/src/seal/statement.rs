//! Signed statements: a compaction's authority, a writer's admission, a
//! legacy stream's binding (`docs/SIGNING.md`). Each kind signs its own
//! domain string and fixed-size fields, and encodes as those fields, the
//! signer where it varies, and the 64-byte signature.

use ed25519_dalek::{Signature, Verifier};
use meshlog_cursor::StreamId;

use super::{
    array, fixed, u64_at, AdminKey, AdminPublicKey, SealError, WriterKey, WriterPublicKey,
};
use crate::ChainHash;

const COMPACTION_DOMAIN: &[u8] = b"meshlog compaction v1";
const ADMISSION_DOMAIN: &[u8] = b"meshlog admission v1";
const BINDING_DOMAIN: &[u8] = b"meshlog binding v1";

/// A compaction statement: the stream's events up to `floor` may be
/// dropped, and `hash` is the stream's chain hash at `floor`. It erases a
/// receiver's events only when signed by the stream's writer or the mesh
/// admin key ([`SignedCompaction::verify`]).
///
/// Signed message: `"meshlog compaction v1" || stream u64 LE || floor u64
/// LE || hash` (69 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    /// The compacted stream.
    pub stream: StreamId,
    /// The last seq dropped.
    pub floor: u64,
    /// The stream's chain hash at `floor`.
    pub hash: ChainHash,
}

/// Who signed a [`SignedCompaction`], as its verification found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionSigner {
    /// The stream's writer (its key derives the stream, or a binding names it).
    Writer,
    /// The mesh admin key.
    Admin,
}

/// A [`Compaction`] with its signer's public key and signature.
///
/// Encoding ([`SignedCompaction::LEN`] bytes): `stream u64 LE || floor u64
/// LE || hash || signer key || signature`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SignedCompaction {
    /// What is stated.
    pub statement: Compaction,
    /// The key that signed: the writer's or the admin's.
    pub signer: WriterPublicKey,
    /// The signature over the statement's message.
    pub signature: [u8; 64],
}

impl Compaction {
    /// The bytes a compaction statement signs.
    pub fn message(&self) -> [u8; 69] {
        let mut message = [0u8; 69];
        message[..21].copy_from_slice(COMPACTION_DOMAIN);
        message[21..29].copy_from_slice(&self.stream.get().to_le_bytes());
        message[29..37].copy_from_slice(&self.floor.to_le_bytes());
        message[37..].copy_from_slice(self.hash.as_bytes());
        message
    }

    /// The statement signed by a writer's key (the stream's, for it to be
    /// accepted).
    pub fn sign_by_writer(&self, key: &WriterKey) -> SignedCompaction {
        SignedCompaction {
            statement: *self,
            signer: key.public(),
            signature: key.sign(&self.message()).to_bytes(),
        }
    }

    /// The statement signed by the mesh admin key.
    pub fn sign_by_admin(&self, key: &AdminKey) -> SignedCompaction {
        SignedCompaction {
            statement: *self,
            signer: *key.public().as_writer(),
            signature: key.sign(&self.message()).to_bytes(),
        }
    }
}

impl SignedCompaction {
    /// The size of the encoding.
    pub const LEN: usize = 8 + 8 + 32 + 32 + 64;

    /// The statement, if its signer has authority over the stream and the
    /// signature verifies: the admin key (`admin`, when the receiver trusts
    /// one) or the stream's writer (its key derives the stream, or
    /// `binding`, one the receiver trusts, names it).
    pub fn verify(
        &self,
        admin: Option<&AdminPublicKey>,
        binding: Option<&Binding>,
    ) -> Result<CompactionSigner, SealError> {
        let stream = self.statement.stream;
        let signer = if admin.is_some_and(|admin| *admin.as_writer() == self.signer) {
            CompactionSigner::Admin
        } else if self.signer.signs_for(stream, binding).is_ok() {
            CompactionSigner::Writer
        } else {
            return Err(SealError::NoAuthority {
                stream,
                floor: self.statement.floor,
                derived: self.signer.stream(),
            });
        };
        self.verify_signature()?;
        Ok(signer)
    }

    /// Whether the signature verifies under the key that claims it,
    /// whatever that key's authority (judged by [`SignedCompaction::verify`]
    /// when the statement is received): what a store checks of a
    /// statement it kept.
    pub(crate) fn verify_signature(&self) -> Result<(), SealError> {
        verify(
            &self.signer,
            &self.statement.message(),
            &self.signature,
            "compaction",
            Some(self.statement.stream),
        )
    }

    /// The encoding's [`SignedCompaction::LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; SignedCompaction::LEN] {
        let mut bytes = [0u8; SignedCompaction::LEN];
        bytes[..8].copy_from_slice(&self.statement.stream.get().to_le_bytes());
        bytes[8..16].copy_from_slice(&self.statement.floor.to_le_bytes());
        bytes[16..48].copy_from_slice(self.statement.hash.as_bytes());
        bytes[48..80].copy_from_slice(&self.signer.to_bytes());
        bytes[80..].copy_from_slice(&self.signature);
        bytes
    }

    /// The signed statement these bytes encode: [`SealError::WrongLength`]
    /// for any other length, [`SealError::BadKey`] if the signer is not a
    /// usable key. The signature is judged by [`SignedCompaction::verify`].
    pub fn from_bytes(bytes: &[u8]) -> Result<SignedCompaction, SealError> {
        let bytes = fixed::<{ SignedCompaction::LEN }>(bytes, "compaction")?;
        Ok(SignedCompaction {
            statement: Compaction {
                stream: StreamId::new(u64_at(bytes, 0)),
                floor: u64_at(bytes, 8),
                hash: ChainHash::from_bytes(array(&bytes[16..48])),
            },
            signer: WriterPublicKey::from_bytes(&bytes[48..80])
                .map_err(|e| rename_key(e, "compaction signer"))?,
            signature: array(&bytes[80..]),
        })
    }
}

impl std::fmt::Debug for SignedCompaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedCompaction")
            .field("statement", &self.statement)
            .field("signer", &self.signer)
            .finish_non_exhaustive()
    }
}

/// An admission: the mesh admin admits `key` as a writer.
///
/// Signed message: `"meshlog admission v1" || key` (52 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterAdmission {
    /// The admitted writer's key.
    pub key: WriterPublicKey,
}

/// A [`WriterAdmission`] signed by the admin key.
///
/// Encoding ([`SignedAdmission::LEN`] bytes): `key || signature`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SignedAdmission {
    /// What is stated.
    pub statement: WriterAdmission,
    /// The admin's signature over the statement's message.
    pub signature: [u8; 64],
}

impl WriterAdmission {
    /// The bytes an admission signs.
    pub fn message(&self) -> [u8; 52] {
        let mut message = [0u8; 52];
        message[..20].copy_from_slice(ADMISSION_DOMAIN);
        message[20..].copy_from_slice(&self.key.to_bytes());
        message
    }

    /// The admission signed by the admin key.
    pub fn sign(&self, admin: &AdminKey) -> SignedAdmission {
        SignedAdmission {
            statement: *self,
            signature: admin.sign(&self.message()).to_bytes(),
        }
    }
}

impl SignedAdmission {
    /// The size of the encoding.
    pub const LEN: usize = 32 + 64;

    /// The admission, if `admin` signed it.
    pub fn verify(&self, admin: &AdminPublicKey) -> Result<WriterAdmission, SealError> {
        verify(
            admin.as_writer(),
            &self.statement.message(),
            &self.signature,
            "admission",
            None,
        )?;
        Ok(self.statement)
    }

    /// The encoding's [`SignedAdmission::LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; SignedAdmission::LEN] {
        let mut bytes = [0u8; SignedAdmission::LEN];
        bytes[..32].copy_from_slice(&self.statement.key.to_bytes());
        bytes[32..].copy_from_slice(&self.signature);
        bytes
    }

    /// The signed admission these bytes encode (totally, as
    /// [`SignedCompaction::from_bytes`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<SignedAdmission, SealError> {
        let bytes = fixed::<{ SignedAdmission::LEN }>(bytes, "admission")?;
        Ok(SignedAdmission {
            statement: WriterAdmission {
                key: WriterPublicKey::from_bytes(&bytes[..32])
                    .map_err(|e| rename_key(e, "admitted key"))?,
            },
            signature: array(&bytes[32..]),
        })
    }
}

impl std::fmt::Debug for SignedAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedAdmission")
            .field("statement", &self.statement)
            .finish_non_exhaustive()
    }
}

/// A binding: the legacy stream `stream` (a random id from before signed
/// streams, which no key derives) is written by `key`. A receiver trusts
/// one signed by the admin key ([`SignedBinding::verify`]) or one its trust
/// configuration lists (`key@stream`), and passes it to
/// [`crate::Seal::verify_bound`] and [`SignedCompaction::verify`].
///
/// Signed message: `"meshlog binding v1" || stream u64 LE || key` (58 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The legacy stream.
    pub stream: StreamId,
    /// Its writer's key.
    pub key: WriterPublicKey,
}

/// A [`Binding`] signed by the admin key.
///
/// Encoding ([`SignedBinding::LEN`] bytes): `stream u64 LE || key ||
/// signature`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SignedBinding {
    /// What is stated.
    pub statement: Binding,
    /// The admin's signature over the statement's message.
    pub signature: [u8; 64],
}

impl Binding {
    /// The bytes a binding signs.
    pub fn message(&self) -> [u8; 58] {
        let mut message = [0u8; 58];
        message[..18].copy_from_slice(BINDING_DOMAIN);
        message[18..26].copy_from_slice(&self.stream.get().to_le_bytes());
        message[26..].copy_from_slice(&self.key.to_bytes());
        message
    }

    /// The binding signed by the admin key.
    pub fn sign(&self, admin: &AdminKey) -> SignedBinding {
        SignedBinding {
            statement: *self,
            signature: admin.sign(&self.message()).to_bytes(),
        }
    }
}

impl SignedBinding {
    /// The size of the encoding.
    pub const LEN: usize = 8 + 32 + 64;

    /// The binding, if `admin` signed it.
    pub fn verify(&self, admin: &AdminPublicKey) -> Result<Binding, SealError> {
        verify(
            admin.as_writer(),
            &self.statement.message(),
            &self.signature,
            "binding",
            Some(self.statement.stream),
        )?;
        Ok(self.statement)
    }

    /// The encoding's [`SignedBinding::LEN`] bytes.
    pub fn to_bytes(&self) -> [u8; SignedBinding::LEN] {
        let mut bytes = [0u8; SignedBinding::LEN];
        bytes[..8].copy_from_slice(&self.statement.stream.get().to_le_bytes());
        bytes[8..40].copy_from_slice(&self.statement.key.to_bytes());
        bytes[40..].copy_from_slice(&self.signature);
        bytes
    }

    /// The signed binding these bytes encode (totally, as
    /// [`SignedCompaction::from_bytes`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<SignedBinding, SealError> {
        let bytes = fixed::<{ SignedBinding::LEN }>(bytes, "binding")?;
        Ok(SignedBinding {
            statement: Binding {
                stream: StreamId::new(u64_at(bytes, 0)),
                key: WriterPublicKey::from_bytes(&bytes[8..40])
                    .map_err(|e| rename_key(e, "bound key"))?,
            },
            signature: array(&bytes[40..]),
        })
    }
}

impl std::fmt::Debug for SignedBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedBinding")
            .field("statement", &self.statement)
            .finish_non_exhaustive()
    }
}

/// The one signature check of the statements.
fn verify(
    key: &WriterPublicKey,
    message: &[u8],
    signature: &[u8; 64],
    statement: &'static str,
    stream: Option<StreamId>,
) -> Result<(), SealError> {
    key.verifying()
        .verify(message, &Signature::from_bytes(signature))
        .map_err(|_| SealError::BadStatement { statement, stream })
}

/// A key decoded inside a statement is named for its place there.
fn rename_key(error: SealError, what: &'static str) -> SealError {
    match error {
        SealError::BadKey { fault, .. } => SealError::BadKey { what, fault },
        other => other,
    }
}
