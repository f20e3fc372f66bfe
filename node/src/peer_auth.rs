//! The peer handshake: two nodes that hold the same peer secret prove it
//! to each other in the `GET /sync` upgrade, before the sync session
//! starts, without sending the secret (`docs/SECURITY.md`, "Peer links").
//!
//! ```text
//! dialer   -> acceptor  GET /sync
//!                       Meshlog-Peer-Key: ID          (which secret)
//!                       Meshlog-Peer-Nonce: Na        (32 random bytes)
//! acceptor -> dialer    101, Meshlog-Peer-Nonce: Nb   (32 random bytes)
//!                            Meshlog-Peer-Proof: HMAC(k, "acceptor" Na Nb)
//! dialer   -> acceptor  the first 32 bytes on the upgraded connection:
//!                       HMAC(k, "dialer" Na Nb)
//! ```
//!
//! Each side's proof covers a nonce the *other* side just chose, so a
//! recorded proof is useless on any later connection (no replay), and the
//! two proofs carry different labels, so one cannot be reflected back as
//! the other. Proofs are checked with `ring::hmac::verify`, in constant
//! time. Without TLS the handshake proves who the peer is but does not
//! protect what follows on the connection: see `docs/SECURITY.md`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use http_body_util::Empty;
use hyper::header::{HeaderMap, CONNECTION, HOST, UPGRADE};
use hyper::upgrade::Upgraded;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::auth::PeerKey;

/// The protocol named in the `Upgrade` header of `GET /sync`.
pub(crate) const SYNC_PROTOCOL: &str = "meshlog-sync";

/// How the reason of a dial the peer answered without upgrading begins
/// (`peer answered 401 Unauthorized to the sync upgrade: ...`, from
/// [`upgrade`]): the status stream calls such a link `refused`.
pub(crate) const REFUSED_PREFIX: &str = "peer answered";

/// The header naming the dialer's peer secret by its id.
pub const KEY_HEADER: &str = "meshlog-peer-key";
/// The header carrying a side's nonce.
pub const NONCE_HEADER: &str = "meshlog-peer-nonce";
/// The header carrying the acceptor's proof.
pub const PROOF_HEADER: &str = "meshlog-peer-proof";
/// Bytes in a nonce and in a proof.
pub const LEN: usize = 32;

const ACCEPTOR_LABEL: &[u8] = b"meshlog peer v1 acceptor\0";
const DIALER_LABEL: &[u8] = b"meshlog peer v1 dialer\0";

/// A fresh random nonce.
pub fn nonce() -> [u8; LEN] {
    let mut out = [0u8; LEN];
    SystemRandom::new()
        .fill(&mut out)
        .expect("the system's random source failed");
    out
}

fn message(label: &[u8], dialer_nonce: &[u8; LEN], acceptor_nonce: &[u8; LEN]) -> Vec<u8> {
    let mut message = Vec::with_capacity(label.len() + 2 * LEN);
    message.extend_from_slice(label);
    message.extend_from_slice(dialer_nonce);
    message.extend_from_slice(acceptor_nonce);
    message
}

fn proof(key: &hmac::Key, label: &[u8], na: &[u8; LEN], nb: &[u8; LEN]) -> [u8; LEN] {
    let tag = hmac::sign(key, &message(label, na, nb));
    let mut out = [0u8; LEN];
    out.copy_from_slice(tag.as_ref());
    out
}

fn verify(key: &hmac::Key, label: &[u8], na: &[u8; LEN], nb: &[u8; LEN], proof: &[u8]) -> bool {
    hmac::verify(key, &message(label, na, nb), proof).is_ok()
}

/// Encodes bytes for a header.
pub fn encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes a header of exactly [`LEN`] bytes.
fn decode(headers: &HeaderMap, name: &str) -> Result<[u8; LEN], String> {
    let value = headers
        .get(name)
        .ok_or_else(|| format!("no {name} header"))?
        .to_str()
        .map_err(|_| format!("the {name} header is not ASCII"))?;
    if value.len() > 64 {
        return Err(format!("the {name} header is too long"));
    }
    let bytes = URL_SAFE_NO_PAD
        .decode(value.trim())
        .map_err(|_| format!("the {name} header is not base64url"))?;
    bytes
        .try_into()
        .map_err(|_| format!("the {name} header is not {LEN} bytes"))
}

/// The acceptor's side, once the upgrade request is read: what to answer
/// in the `101`, and what to check on the connection after it.
pub struct Acceptor {
    key: hmac::Key,
    dialer_nonce: [u8; LEN],
    acceptor_nonce: [u8; LEN],
    /// The key's id, for the log.
    pub key_id: String,
}

impl Acceptor {
    /// Reads the dialer's key id and nonce from the upgrade request.
    pub fn start(keys: &[PeerKey], headers: &HeaderMap) -> Result<Acceptor, String> {
        let id = headers
            .get(KEY_HEADER)
            .ok_or("no peer secret offered (the dialer has no peer secret configured)")?
            .to_str()
            .map_err(|_| "the peer key header is not ASCII".to_owned())?;
        let key = keys
            .iter()
            .find(|key| key.id == id)
            .ok_or_else(|| format!("peer key {id:.16} is not one of this node's peer secrets"))?;
        Ok(Acceptor {
            key: key.key.clone(),
            dialer_nonce: decode(headers, NONCE_HEADER)?,
            acceptor_nonce: nonce(),
            key_id: key.id.clone(),
        })
    }

    /// The headers of the `101`: the acceptor's nonce and proof.
    pub fn answer(&self) -> [(&'static str, String); 2] {
        let proof = proof(
            &self.key,
            ACCEPTOR_LABEL,
            &self.dialer_nonce,
            &self.acceptor_nonce,
        );
        [
            (NONCE_HEADER, encode(&self.acceptor_nonce)),
            (PROOF_HEADER, encode(&proof)),
        ]
    }

    /// Checks the dialer's proof, the first [`LEN`] bytes after the
    /// upgrade.
    pub fn finish(&self, dialer_proof: &[u8; LEN]) -> bool {
        verify(
            &self.key,
            DIALER_LABEL,
            &self.dialer_nonce,
            &self.acceptor_nonce,
            dialer_proof,
        )
    }
}

/// The dialer's side.
pub struct Dialer {
    key: hmac::Key,
    key_id: String,
    dialer_nonce: [u8; LEN],
}

impl Dialer {
    /// Dials with `key` (the node's first peer secret).
    pub fn new(key: &PeerKey) -> Dialer {
        Dialer {
            key: key.key.clone(),
            key_id: key.id.clone(),
            dialer_nonce: nonce(),
        }
    }

    /// The headers to add to the upgrade request.
    pub fn request_headers(&self) -> [(&'static str, String); 2] {
        [
            (KEY_HEADER, self.key_id.clone()),
            (NONCE_HEADER, encode(&self.dialer_nonce)),
        ]
    }

    /// Checks the acceptor's `101` and returns the proof to send as the
    /// first bytes on the upgraded connection.
    pub fn finish(&self, headers: &HeaderMap) -> Result<[u8; LEN], String> {
        let acceptor_nonce = decode(headers, NONCE_HEADER)
            .map_err(|e| format!("the peer did not authenticate: {e}"))?;
        let acceptor_proof = decode(headers, PROOF_HEADER)
            .map_err(|e| format!("the peer did not authenticate: {e}"))?;
        if !verify(
            &self.key,
            ACCEPTOR_LABEL,
            &self.dialer_nonce,
            &acceptor_nonce,
            &acceptor_proof,
        ) {
            return Err("the peer's proof is wrong: it does not hold our peer secret".into());
        }
        Ok(proof(
            &self.key,
            DIALER_LABEL,
            &self.dialer_nonce,
            &acceptor_nonce,
        ))
    }
}

/// A connection upgraded to the sync protocol, as [`upgrade`] answers it.
pub type SyncLink = TokioIo<Upgraded>;

/// Upgrades `GET /sync` on `io` (a connection to the peer at
/// `authority`, `host:port`, plain or TLS) to the sync protocol, passing the
/// peer handshake with `key` when given: the node's one dial step after
/// the connection, used by its peer links and by anything else that must
/// reach a node as a peer (the fault harness's hostile peer,
/// `docs/FAULTS.md`). A peer that answers other than `101` is an error
/// starting with `peer answered` and carrying its status and body.
pub async fn upgrade<IO>(io: IO, authority: &str, key: Option<&PeerKey>) -> Result<SyncLink, String>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|error| format!("HTTP handshake failed: {error}"))?;
    // Drives the connection until the upgrade hands its socket over.
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let handshake = key.map(Dialer::new);
    let mut request = Request::get("/sync")
        .header(HOST, authority)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, SYNC_PROTOCOL);
    if let Some(dialer) = &handshake {
        for (name, value) in dialer.request_headers() {
            request = request.header(name, value);
        }
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|error| format!("cannot build the upgrade request: {error}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| format!("sync upgrade request failed: {error}"))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let status = response.status();
        let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(
            response.into_body(),
            4096,
        ))
        .await
        .map(|body| String::from_utf8_lossy(&body.to_bytes()).into_owned())
        .unwrap_or_default();
        return Err(format!(
            "{REFUSED_PREFIX} {status} to the sync upgrade: {body}"
        ));
    }
    let proof = match &handshake {
        Some(dialer) => Some(dialer.finish(response.headers())?),
        None => None,
    };
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|error| format!("sync upgrade failed: {error}"))?;
    let mut io = TokioIo::new(upgraded);
    if let Some(proof) = proof {
        io.write_all(&proof)
            .await
            .map_err(|error| format!("cannot send the peer proof: {error}"))?;
    }
    Ok(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn key(secret: &str) -> PeerKey {
        crate::auth::Auth::load(crate::auth::SecretSources {
            peer: vec![secret.into()],
            ..Default::default()
        })
        .unwrap()
        .peer_keys()
        .remove(0)
    }

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn two_holders_of_one_secret_agree_and_a_replay_fails() {
        let k = key("the-mesh-secret-0123456789");
        let dialer = Dialer::new(&k);
        let request = headers(&dialer.request_headers());
        let acceptor = Acceptor::start(std::slice::from_ref(&k), &request).unwrap();
        let answer = headers(&acceptor.answer());
        let dialer_proof = dialer.finish(&answer).unwrap();
        assert!(acceptor.finish(&dialer_proof));

        // The same request replayed: the acceptor picks a new nonce, so the
        // recorded proof no longer passes.
        let again = Acceptor::start(std::slice::from_ref(&k), &request).unwrap();
        assert!(!again.finish(&dialer_proof));
        // The acceptor's own proof reflected back as the dialer's fails.
        let reflected = decode(&answer, PROOF_HEADER).unwrap();
        assert!(!acceptor.finish(&reflected));
    }

    #[test]
    fn a_different_secret_is_refused_on_both_sides() {
        let ours = key("the-mesh-secret-0123456789");
        let theirs = key("another-mesh-secret-987654");
        // Unknown id: the acceptor refuses at once.
        let dialer = Dialer::new(&theirs);
        let request = headers(&dialer.request_headers());
        assert!(Acceptor::start(std::slice::from_ref(&ours), &request).is_err());
        // A forged id with the wrong key: the proofs fail both ways.
        let forged = PeerKey {
            id: ours.id.clone(),
            key: theirs.key.clone(),
        };
        let dialer = Dialer::new(&forged);
        let request = headers(&dialer.request_headers());
        let acceptor = Acceptor::start(std::slice::from_ref(&ours), &request).unwrap();
        assert!(dialer.finish(&headers(&acceptor.answer())).is_err());
        assert!(!acceptor.finish(&[0u8; LEN]));
    }
}
