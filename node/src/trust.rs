//! The node's trust configuration (`docs/SIGNING.md`, "Membership";
//! `docs/OPERATIONS.md`, "Writer keys and trust"): which writers it
//! accepts events of, and the legacy streams bound to their keys. Read
//! from the `--config` file and the command line, decoded here once into
//! the replica's [`Membership`].
//!
//! - `writers`: writer public keys (64 hex digits) the node accepts; an
//!   entry `KEY@STREAM` (the stream in decimal) also binds the legacy
//!   stream `STREAM` to `KEY`.
//! - `admin_key`: the mesh admin's public key (64 hex digits), which signs
//!   admissions, bindings and compaction statements (trusted by the
//!   replica: `Membership::trust_admin`).
//! - `admissions`: writer admissions the admin signed (hex of their 96
//!   bytes, `docs/SIGNING.md`, "The bytes signed and carried").
//! - `bindings`: legacy-stream bindings the admin signed (hex of their
//!   104 bytes).
//!
//! Any writer or admission closes membership: the node then takes events
//! only of the writers named or admitted (and its own). With none, it is
//! open: any writer whose key derives its stream.

use meshlog_cursor::StreamId;
use meshlog_replica::{
    AdminPublicKey, Binding, Membership, SealError, SignedAdmission, SignedBinding, WriterPublicKey,
};

/// The trust settings as written (file and flags joined), before decoding.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustSettings {
    /// `writers`: `KEY` or `KEY@STREAM` entries.
    pub writers: Vec<String>,
    /// `admin_key`.
    pub admin_key: Option<String>,
    /// `admissions`, hex.
    pub admissions: Vec<String>,
    /// `bindings`, hex.
    pub bindings: Vec<String>,
}

/// A trust entry that could not be taken: which setting, the entry, and
/// why. The node does not start on a trust configuration it cannot read
/// whole (a dropped entry would silently refuse a writer, or admit one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting} entry {entry:?}: {reason}")]
pub struct TrustError {
    /// The setting (`writers`, `admin_key`, `admissions`, `bindings`).
    pub setting: &'static str,
    /// The entry as written (cut to 80 characters).
    pub entry: String,
    /// Why it was refused.
    pub reason: String,
}

impl TrustSettings {
    /// Decodes the settings into a [`Membership`]: each writer admitted
    /// (and bound, for `KEY@STREAM`), each admission and binding verified
    /// against the admin key. An admission or binding without an admin
    /// key, or signed by another key, is refused.
    pub fn membership(&self) -> Result<Membership, TrustError> {
        let mut membership = Membership::open();
        for entry in &self.writers {
            let fail = |reason: String| error("writers", entry, reason);
            match writer_entry(entry).map_err(fail)? {
                (key, None) => membership.admit(key),
                (key, Some(stream)) => {
                    membership.admit(key);
                    membership.bind(Binding { stream, key });
                }
            }
        }
        let admin = match &self.admin_key {
            Some(text) => Some(
                decode_hex(text)
                    .and_then(|bytes| AdminPublicKey::from_bytes(&bytes).map_err(|e| e.to_string()))
                    .map_err(|reason| error("admin_key", text, reason))?,
            ),
            None => None,
        };
        // The admin key also signs compaction statements: trusted, so that
        // a statement it signs erases a writer's stream here
        // (`docs/SIGNING.md`, "Floors with an authority").
        if let Some(admin) = admin {
            membership.trust_admin(admin);
        }
        let no_admin = || "no admin_key is configured to verify it".to_string();
        for entry in &self.admissions {
            let fail = |reason: String| error("admissions", entry, reason);
            let admin = admin.as_ref().ok_or_else(no_admin).map_err(fail)?;
            let admission = decode_hex(entry)
                .and_then(|bytes| SignedAdmission::from_bytes(&bytes).map_err(|e| e.to_string()))
                .map_err(fail)?;
            membership
                .admit_signed(&admission, admin)
                .map_err(|e| fail(signed_by_other(e)))?;
        }
        for entry in &self.bindings {
            let fail = |reason: String| error("bindings", entry, reason);
            let admin = admin.as_ref().ok_or_else(no_admin).map_err(fail)?;
            let binding = decode_hex(entry)
                .and_then(|bytes| SignedBinding::from_bytes(&bytes).map_err(|e| e.to_string()))
                .map_err(fail)?;
            membership
                .bind_signed(&binding, admin)
                .map_err(|e| fail(signed_by_other(e)))?;
        }
        Ok(membership)
    }
}

/// Logs the membership once at start: open, or closed with the writers
/// it admits; and whether seals are required.
pub fn log(membership: &Membership, require_seals: bool) {
    if require_seals {
        tracing::info!(
            "require_seals: streams that come unsealed (legacy streams) are refused, \
             each cut from a peer's deltas with the link kept"
        );
    }
    if membership.is_open() {
        tracing::info!(
            "membership open: events of any writer whose key derives its stream are \
             accepted (name writers or admissions in the trust configuration to close it)"
        );
    } else {
        let writers: Vec<String> = membership
            .writers()
            .map(|(stream, key)| format!("{}={key}", stream.get()))
            .collect();
        tracing::info!(
            writers = writers.len(),
            admitted = %writers.join(","),
            "membership closed: events of other writers are refused (unknown writer)"
        );
    }
}

fn error(setting: &'static str, entry: &str, reason: String) -> TrustError {
    TrustError {
        setting,
        entry: entry.chars().take(80).collect(),
        reason,
    }
}

fn signed_by_other(error: SealError) -> String {
    match error {
        SealError::BadStatement { .. } => {
            "its signature does not verify under admin_key (signed by another key, or altered)"
                .into()
        }
        other => other.to_string(),
    }
}

/// A `writers` entry: `KEY`, or `KEY@STREAM` (a legacy stream bound to
/// the key). `meshlog key bind` reads its argument by this rule too.
pub fn writer_entry(entry: &str) -> Result<(WriterPublicKey, Option<StreamId>), String> {
    match entry.split_once('@') {
        None => Ok((writer_key(entry)?, None)),
        Some((key, stream)) => Ok((writer_key(key)?, Some(stream_id(stream)?))),
    }
}

/// Lowercase hex of `bytes`: how the trust configuration writes keys and
/// statements.
pub fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn writer_key(text: &str) -> Result<WriterPublicKey, String> {
    let bytes = decode_hex(text)?;
    WriterPublicKey::from_bytes(&bytes).map_err(|e| e.to_string())
}

fn stream_id(text: &str) -> Result<StreamId, String> {
    match text.trim().parse::<u64>() {
        Ok(0) | Err(_) => Err(format!(
            "the stream after '@' must be a non-zero decimal stream id, not {text:?}"
        )),
        Ok(id) => Ok(StreamId::new(id)),
    }
}

/// Hex (either case) to bytes; at most 512 digits (the longest statement,
/// a compaction, is 144 bytes), so a hostile value costs nothing.
pub fn decode_hex(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim().as_bytes();
    if !text.len().is_multiple_of(2) || text.len() > 512 {
        return Err(format!(
            "not hex of a key or statement: {} digits",
            text.len()
        ));
    }
    text.chunks(2)
        .map(|pair| {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(high), Some(low)) => Ok((high * 16 + low) as u8),
                _ => Err("not hex: a digit is not 0-9 or a-f".to_string()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshlog_replica::{AdminKey, WriterAdmission, WriterKey};

    fn hex(bytes: &[u8]) -> String {
        encode_hex(bytes)
    }

    #[test]
    fn no_settings_are_open_membership() {
        assert!(TrustSettings::default().membership().unwrap().is_open());
    }

    /// An admin key alone is trusted for compaction statements and leaves
    /// the membership open (it admits nobody by itself).
    #[test]
    fn an_admin_key_alone_is_trusted_and_leaves_membership_open() {
        let admin = AdminKey::from_bytes([9; 32]);
        let settings = TrustSettings {
            admin_key: Some(hex(&admin.public().to_bytes())),
            ..TrustSettings::default()
        };
        let membership = settings.membership().unwrap();
        assert!(membership.is_open());
        assert_eq!(membership.admin(), Some(&admin.public()));
    }

    #[test]
    fn writers_admissions_and_bindings_decode_into_a_closed_membership() {
        let admin = AdminKey::from_bytes([9; 32]);
        let (a, b, c) = (
            WriterKey::from_bytes([1; 32]).public(),
            WriterKey::from_bytes([2; 32]).public(),
            WriterKey::from_bytes([3; 32]).public(),
        );
        let legacy = StreamId::new(4242);
        let settings = TrustSettings {
            writers: vec![hex(&a.to_bytes()), format!("{}@4242", hex(&b.to_bytes()))],
            admin_key: Some(hex(&admin.public().to_bytes()).to_uppercase()),
            admissions: vec![hex(&WriterAdmission { key: c }.sign(&admin).to_bytes())],
            bindings: vec![hex(&Binding {
                stream: StreamId::new(7),
                key: c,
            }
            .sign(&admin)
            .to_bytes())],
        };
        let membership = settings.membership().unwrap();
        assert!(!membership.is_open());
        assert!(membership.admits(a.stream(), &a));
        assert!(membership.admits(legacy, &b));
        assert!(membership.admits(c.stream(), &c));
        assert_eq!(membership.binding(legacy).map(|b| b.key), Some(b));
        assert_eq!(membership.binding(StreamId::new(7)).map(|b| b.key), Some(c));
        // The admin key is trusted for compaction statements too.
        assert_eq!(membership.admin(), Some(&admin.public()));
        assert!(!membership.admits_stream(WriterKey::from_bytes([5; 32]).stream()));
    }

    #[test]
    fn a_bad_entry_is_refused_by_setting_and_entry() {
        let admin = AdminKey::from_bytes([9; 32]);
        let other = AdminKey::from_bytes([8; 32]);
        let key = WriterKey::from_bytes([1; 32]).public();
        let admission = hex(&WriterAdmission { key }.sign(&other).to_bytes());
        for (settings, setting, says) in [
            (
                TrustSettings {
                    writers: vec!["zz".into()],
                    ..TrustSettings::default()
                },
                "writers",
                "not hex",
            ),
            (
                TrustSettings {
                    writers: vec![format!("{}@0", hex(&key.to_bytes()))],
                    ..TrustSettings::default()
                },
                "writers",
                "non-zero decimal",
            ),
            (
                TrustSettings {
                    writers: vec![hex(&[0; 32])],
                    ..TrustSettings::default()
                },
                "writers",
                "writer key",
            ),
            (
                TrustSettings {
                    admissions: vec![admission.clone()],
                    ..TrustSettings::default()
                },
                "admissions",
                "no admin_key",
            ),
            (
                TrustSettings {
                    admin_key: Some(hex(&admin.public().to_bytes())),
                    admissions: vec![admission],
                    ..TrustSettings::default()
                },
                "admissions",
                "does not verify under admin_key",
            ),
        ] {
            let error = settings.membership().expect_err(says);
            assert_eq!(error.setting, setting, "{error}");
            assert!(error.to_string().contains(says), "{error}");
        }
    }
}
