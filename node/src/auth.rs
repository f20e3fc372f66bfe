//! Who may do what (`docs/SECURITY.md`): bearer secrets in three roles for
//! the HTTP API, and a shared peer secret for sync links, proved by a
//! challenge-response in the `GET /sync` upgrade (`peer_auth`).
//!
//! Roles nest: `admin` may do what `write` may, and `write` what `read`
//! may. Each role holds a list of secrets, so a secret is rotated by adding
//! the new one, moving clients over, and removing the old one; a running
//! node rereads its secrets on `SIGHUP` ([`crate::Node::reload_secrets`]).
//!
//! A secret is kept only as its SHA-256 digest, and a presented secret is
//! hashed and compared with every digest of every role in constant time
//! (`subtle`), whatever matches: neither a secret's length nor how much of
//! it a guess got right shows in the answer's timing.
//!
//! With no secret configured at all, the node is *unauthenticated*: every
//! route is open. [`Auth::check_listen`] allows that only on a loopback
//! address, unless the operator says `--allow-unauthenticated`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::http::{HeaderValue, Method};
use ring::digest;
use serde::Deserialize;
use subtle::ConstantTimeEq;

/// The shortest secret accepted, in bytes: shorter ones are guessable.
pub const SECRET_LEN_MIN: usize = 16;

/// The longest `Authorization` value read; a longer one is refused
/// without hashing it.
const AUTHORIZATION_LEN_MAX: usize = 1024;

/// What a bearer secret lets its holder do. Roles nest: each may do what
/// the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Pages, follow, marks, forks.
    Read,
    /// Append, and what `read` may.
    Write,
    /// Compact and manage peers, and what `write` may.
    Admin,
}

impl Role {
    /// The role's name, as in the secrets file.
    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: open to anyone (health, metrics, the page, the OpenAPI
    /// document).
    Open,
    /// A bearer secret of this role or above.
    Role(Role),
    /// The peer handshake of `GET /sync` (checked by its handler).
    Peer,
}

/// What each route needs: the one table the middleware and the docs
/// follow (`docs/SECURITY.md`, "Who may do what"). Anything not named
/// (another method, an unknown path) needs `admin`.
pub fn need(method: &Method, path: &str) -> Need {
    // The router answers HEAD with the GET handler (body dropped): it needs
    // what GET needs.
    let method = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    match (method, path) {
        ("GET", "/events")
        | ("POST", "/events/query")
        | ("GET", "/marks")
        | ("GET", "/forks")
        | ("GET", "/checkpoint")
        | ("GET", "/follow") => Need::Role(Role::Read),
        ("POST", "/events") | ("GET", "/events/append") => Need::Role(Role::Write),
        // `GET /compaction` reads the stream's events up to the floor asked
        // (a chain hash): the admin's step before `POST /compaction`, not a
        // reader's, and a scan a reader could repeat at will.
        ("POST", "/compact") | (_, "/compaction") | ("POST", "/verify") | (_, "/peers") => {
            Need::Role(Role::Admin)
        }
        ("GET", "/sync") => Need::Peer,
        ("GET", "/health") | ("GET", "/metrics") | ("GET", "/") | ("GET", "/openapi.json") => {
            Need::Open
        }
        // Closed by default: a route added without a line here needs the
        // highest role, and a stranger probing for routes hears 401, not
        // which paths exist.
        _ => Need::Role(Role::Admin),
    }
}

/// The secrets file (`--secrets FILE`), TOML. Each role lists the secrets
/// it accepts; every key is optional.
///
/// ```toml
/// read = ["a-long-random-read-secret"]
/// write = ["a-long-random-write-secret"]
/// admin = ["a-long-random-admin-secret"]
/// # the mesh's shared secret: every peer dials with the first and
/// # accepts any of them
/// peer = ["a-long-random-peer-secret"]
/// # pages, follow and marks without a secret
/// open_reads = false
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsFile {
    /// Secrets of the `read` role.
    #[serde(default)]
    pub read: Vec<String>,
    /// Secrets of the `write` role.
    #[serde(default)]
    pub write: Vec<String>,
    /// Secrets of the `admin` role.
    #[serde(default)]
    pub admin: Vec<String>,
    /// The mesh's peer secrets: the first is the one this node dials with.
    #[serde(default)]
    pub peer: Vec<String>,
    /// Serve reads without a secret.
    #[serde(default)]
    pub open_reads: Option<bool>,
}

/// Where the secrets come from: a file, environment variables, or both
/// (their lists are joined).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretSources {
    /// `--secrets FILE` (`MESHLOG_SECRETS`).
    pub file: Option<PathBuf>,
    /// `MESHLOG_READ_SECRETS`, comma-separated.
    pub read: Vec<String>,
    /// `MESHLOG_WRITE_SECRETS`, comma-separated.
    pub write: Vec<String>,
    /// `MESHLOG_ADMIN_SECRETS`, comma-separated.
    pub admin: Vec<String>,
    /// `MESHLOG_PEER_SECRETS`, comma-separated.
    pub peer: Vec<String>,
    /// `--open-reads` (`MESHLOG_OPEN_READS`).
    pub open_reads: bool,
}

/// Why the secrets could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    /// The secrets file could not be read.
    #[error("cannot read the secrets file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The secrets file is not valid TOML or holds an unknown key.
    #[error("the secrets file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's reason.
        message: String,
    },
    /// A secret is too short to resist guessing.
    #[error(
        "a {role} secret is {len} bytes long; secrets must be at least {min} bytes \
         (for example `openssl rand -hex 32`)"
    )]
    TooShort {
        /// The role (`read`, `write`, `admin`, `peer`).
        role: &'static str,
        /// The secret's length.
        len: usize,
        /// [`SECRET_LEN_MIN`].
        min: usize,
    },
    /// A secret holds a character a header cannot carry.
    #[error("a {role} secret holds whitespace or a control character")]
    BadCharacter {
        /// The role.
        role: &'static str,
    },
    /// The node would serve writes to anyone on a non-loopback address.
    #[error(
        "no secret is configured and {addr} is not a loopback address: anyone who can reach \
         it could write. Configure secrets (--secrets FILE or MESHLOG_*_SECRETS) or pass \
         --allow-unauthenticated"
    )]
    Unprotected {
        /// The listen address.
        addr: SocketAddr,
    },
}

/// One secret, as its digest.
#[derive(Clone)]
struct Digest([u8; 32]);

fn sha256(bytes: &[u8]) -> Digest {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, bytes).as_ref());
    Digest(out)
}

/// The node's loaded secrets. Cheap to clone; [`Auth::reload`] swaps them
/// for every clone at once.
#[derive(Clone)]
pub struct Auth {
    inner: Arc<RwLock<Keys>>,
    sources: Arc<SecretSources>,
}

#[derive(Clone, Default)]
struct Keys {
    /// Every bearer secret with its role.
    bearer: Vec<(Digest, Role)>,
    /// The peer secrets, first the one to dial with.
    peer: Vec<PeerKey>,
    open_reads: bool,
}

/// One peer secret: its HMAC key and its public id (the first 8 bytes of
/// the SHA-256 of the secret, in hex), which tells the acceptor which key
/// a dialer proves without revealing anything about the secret.
#[derive(Clone)]
pub struct PeerKey {
    /// The key's id.
    pub id: String,
    /// The HMAC-SHA256 key.
    pub key: ring::hmac::Key,
}

/// Why a request was refused by [`Auth::authorize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No usable `Authorization: Bearer` header, or a secret no role holds.
    Unauthenticated(&'static str),
    /// A valid secret of a role below the one needed.
    Forbidden {
        /// The holder's role.
        has: Role,
        /// The role the route needs.
        needs: Role,
    },
}

impl Auth {
    /// Loads the secrets from `sources`.
    pub fn load(sources: SecretSources) -> Result<Auth, SecretsError> {
        let keys = read_keys(&sources)?;
        Ok(Auth {
            inner: Arc::new(RwLock::new(keys)),
            sources: Arc::new(sources),
        })
    }

    /// An unauthenticated node: every route open.
    pub fn open() -> Auth {
        Auth::load(SecretSources::default()).expect("no secrets load")
    }

    /// Rereads the secrets from the same sources; on an error the old ones
    /// stay in force. A node listening on `listen` (beyond loopback, and
    /// not `allow_unauthenticated`) refuses a reload that would leave it
    /// with no secret at all: the same rule as at start.
    pub fn reload(
        &self,
        listen: SocketAddr,
        allow_unauthenticated: bool,
    ) -> Result<(), SecretsError> {
        let keys = read_keys(&self.sources)?;
        let empty = keys.bearer.is_empty() && keys.peer.is_empty();
        if empty && !allow_unauthenticated && !is_loopback(listen.ip()) {
            return Err(SecretsError::Unprotected { addr: listen });
        }
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = keys;
        Ok(())
    }

    fn keys(&self) -> std::sync::RwLockReadGuard<'_, Keys> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any secret is configured (bearer or peer).
    pub fn enabled(&self) -> bool {
        let keys = self.keys();
        !keys.bearer.is_empty() || !keys.peer.is_empty()
    }

    /// Refuses to serve without secrets on a non-loopback address, unless
    /// `allow_unauthenticated`.
    pub fn check_listen(
        &self,
        addr: SocketAddr,
        allow_unauthenticated: bool,
    ) -> Result<(), SecretsError> {
        if self.enabled() || allow_unauthenticated || is_loopback(addr.ip()) {
            Ok(())
        } else {
            Err(SecretsError::Unprotected { addr })
        }
    }

    /// The role an `Authorization` header value proves, if any. Every
    /// configured secret is compared, in constant time each.
    pub fn role_of(&self, authorization: Option<&HeaderValue>) -> Result<Role, Denied> {
        let value = authorization.ok_or(Denied::Unauthenticated("no Authorization header"))?;
        if value.len() > AUTHORIZATION_LEN_MAX {
            return Err(Denied::Unauthenticated(
                "the Authorization header is too long",
            ));
        }
        let text = value.to_str().map_err(|_| {
            Denied::Unauthenticated("the Authorization header is not visible ASCII")
        })?;
        let secret = text
            .strip_prefix("Bearer ")
            .or_else(|| text.strip_prefix("bearer "))
            .ok_or(Denied::Unauthenticated(
                "the Authorization header is not `Bearer SECRET`",
            ))?
            .trim();
        let presented = sha256(secret.as_bytes());
        let keys = self.keys();
        let mut best: Option<Role> = None;
        for (digest, role) in &keys.bearer {
            // No early exit: the time does not tell which one matched.
            let matched: bool = digest.0.ct_eq(&presented.0).into();
            if matched && best.is_none_or(|b| *role > b) {
                best = Some(*role);
            }
        }
        best.ok_or(Denied::Unauthenticated(
            "the secret is not one this node holds",
        ))
    }

    /// Whether a request needing `need` with this `Authorization` may go
    /// on. `Need::Peer` always may here: the sync handler checks it.
    pub fn authorize(
        &self,
        need: Need,
        authorization: Option<&HeaderValue>,
    ) -> Result<Option<Role>, Denied> {
        let needs = match need {
            Need::Open | Need::Peer => return Ok(None),
            Need::Role(role) => role,
        };
        {
            let keys = self.keys();
            if keys.bearer.is_empty() && keys.peer.is_empty() {
                return Ok(None);
            }
            if needs == Role::Read && keys.open_reads && authorization.is_none() {
                return Ok(None);
            }
        }
        let has = self.role_of(authorization)?;
        if has >= needs {
            Ok(Some(has))
        } else {
            Err(Denied::Forbidden { has, needs })
        }
    }

    /// The peer secrets, first the one to dial with; empty when sync
    /// links are not authenticated.
    pub fn peer_keys(&self) -> Vec<PeerKey> {
        self.keys().peer.clone()
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

fn read_keys(sources: &SecretSources) -> Result<Keys, SecretsError> {
    let file = match &sources.file {
        Some(path) => read_file(path)?,
        None => SecretsFile::default(),
    };
    let mut lists: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let join = |a: &[String], b: &[String]| -> Vec<String> { a.iter().chain(b).cloned().collect() };
    lists.insert("read", join(&file.read, &sources.read));
    lists.insert("write", join(&file.write, &sources.write));
    lists.insert("admin", join(&file.admin, &sources.admin));
    // The environment's peer secrets come first: the first one dials.
    lists.insert("peer", join(&sources.peer, &file.peer));
    let mut keys = Keys {
        open_reads: sources.open_reads || file.open_reads.unwrap_or(false),
        ..Keys::default()
    };
    for (role_name, secrets) in lists {
        for secret in secrets {
            let secret = secret.trim();
            if secret.len() < SECRET_LEN_MIN {
                return Err(SecretsError::TooShort {
                    role: role_name,
                    len: secret.len(),
                    min: SECRET_LEN_MIN,
                });
            }
            if secret.bytes().any(|b| !b.is_ascii_graphic()) {
                return Err(SecretsError::BadCharacter { role: role_name });
            }
            let role = match role_name {
                "read" => Role::Read,
                "write" => Role::Write,
                "admin" => Role::Admin,
                _ => {
                    keys.peer.push(PeerKey {
                        id: peer_key_id(secret),
                        key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes()),
                    });
                    continue;
                }
            };
            keys.bearer.push((sha256(secret.as_bytes()), role));
        }
    }
    Ok(keys)
}

/// A peer secret's public id: 16 hex digits of its SHA-256.
fn peer_key_id(secret: &str) -> String {
    sha256(secret.as_bytes()).0[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn read_file(path: &Path) -> Result<SecretsFile, SecretsError> {
    let text = std::fs::read_to_string(path).map_err(|source| SecretsError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|error| SecretsError::Parse {
        path: path.to_owned(),
        // Not `error.to_string()`: it quotes the offending line, which may
        // hold a secret, and this message reaches the log.
        message: error.message().to_owned(),
    })
}

/// `Bearer SECRET` as an `Authorization` value, marked sensitive so that
/// no log or debug print shows it; `None` if the secret cannot be a
/// header value. What every client of the node sends.
pub fn bearer_header(secret: &str) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Bearer {secret}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// `access_token=SECRET` from a query string, as a bearer header value.
pub(crate) fn query_token(query: Option<&str>) -> Option<HeaderValue> {
    let value = query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("access_token="))?;
    if value.is_empty() || value.len() > AUTHORIZATION_LEN_MAX {
        return None;
    }
    // Secrets are visible ASCII; a percent-encoded one is taken as written
    // but for `%XX` escapes, decoded here.
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        if first == b'%' && tail.len() >= 2 {
            let hex = std::str::from_utf8(&tail[..2]).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(first);
            rest = tail;
        }
    }
    bearer_header(&String::from_utf8(bytes).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: &str = "read-secret-0123456789";
    const W: &str = "write-secret-0123456789";
    const A: &str = "admin-secret-0123456789";

    fn auth(open_reads: bool) -> Auth {
        Auth::load(SecretSources {
            read: vec![R.into()],
            write: vec![W.into()],
            admin: vec![A.into()],
            open_reads,
            ..SecretSources::default()
        })
        .unwrap()
    }

    fn bearer(secret: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("Bearer {secret}")).unwrap()
    }

    #[test]
    fn roles_nest_and_wrong_secrets_are_refused() {
        let auth = auth(false);
        let read = Need::Role(Role::Read);
        let admin = Need::Role(Role::Admin);
        assert_eq!(auth.authorize(read, Some(&bearer(R))), Ok(Some(Role::Read)));
        assert_eq!(
            auth.authorize(read, Some(&bearer(A))),
            Ok(Some(Role::Admin))
        );
        assert_eq!(
            auth.authorize(admin, Some(&bearer(W))),
            Err(Denied::Forbidden {
                has: Role::Write,
                needs: Role::Admin
            })
        );
        assert!(matches!(
            auth.authorize(read, None),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            auth.authorize(read, Some(&bearer("read-secret-012345678"))),
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            auth.authorize(read, Some(&HeaderValue::from_static("Basic eDp5"))),
            Err(Denied::Unauthenticated(_))
        ));
        assert_eq!(auth.authorize(Need::Open, None), Ok(None));
    }

    #[test]
    fn open_reads_open_only_reads() {
        let auth = auth(true);
        assert_eq!(auth.authorize(Need::Role(Role::Read), None), Ok(None));
        assert!(auth.authorize(Need::Role(Role::Write), None).is_err());
        // A wrong secret is still wrong, even where none is needed.
        assert!(auth
            .authorize(
                Need::Role(Role::Read),
                Some(&bearer("not-a-secret-of-ours"))
            )
            .is_err());
    }

    #[test]
    fn short_secrets_and_unprotected_listens_are_refused() {
        let short = Auth::load(SecretSources {
            admin: vec!["short".into()],
            ..SecretSources::default()
        });
        assert!(matches!(
            short,
            Err(SecretsError::TooShort { role: "admin", .. })
        ));
        let open = Auth::open();
        assert!(open
            .check_listen("127.0.0.1:1".parse().unwrap(), false)
            .is_ok());
        assert!(open.check_listen("[::1]:1".parse().unwrap(), false).is_ok());
        assert!(open
            .check_listen("0.0.0.0:1".parse().unwrap(), false)
            .is_err());
        assert!(open
            .check_listen("0.0.0.0:1".parse().unwrap(), true)
            .is_ok());
        assert!(auth(false)
            .check_listen("0.0.0.0:1".parse().unwrap(), false)
            .is_ok());
    }

    #[test]
    fn a_reload_may_not_leave_a_network_listener_without_secrets() {
        let dir = std::env::temp_dir().join(format!("meshlog-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secrets.toml");
        std::fs::write(&file, format!("admin = [\"{A}\"]\n")).unwrap();
        let auth = Auth::load(SecretSources {
            file: Some(file.clone()),
            ..SecretSources::default()
        })
        .unwrap();
        std::fs::write(&file, "").unwrap();
        let wide: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        assert!(matches!(
            auth.reload(wide, false),
            Err(SecretsError::Unprotected { .. })
        ));
        assert!(auth.enabled(), "the old secrets stay in force");
        auth.reload("127.0.0.1:7070".parse().unwrap(), false)
            .unwrap();
        assert!(!auth.enabled());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_follow_secret_may_come_in_the_query() {
        let value = query_token(Some("stream=all&access_token=abc%2Bdef&after=x")).unwrap();
        assert_eq!(value, "Bearer abc+def");
        assert!(query_token(Some("stream=all")).is_none());
        assert!(query_token(Some("access_token=")).is_none());
        assert!(query_token(Some("access_token=%zz")).is_none());
        assert!(query_token(None).is_none());
    }

    #[test]
    fn the_route_table_names_every_guarded_route() {
        assert_eq!(need(&Method::GET, "/events"), Need::Role(Role::Read));
        assert_eq!(need(&Method::POST, "/events"), Need::Role(Role::Write));
        assert_eq!(need(&Method::DELETE, "/peers"), Need::Role(Role::Admin));
        assert_eq!(need(&Method::POST, "/verify"), Need::Role(Role::Admin));
        assert_eq!(need(&Method::GET, "/sync"), Need::Peer);
        assert_eq!(need(&Method::GET, "/health"), Need::Open);
        assert_eq!(need(&Method::HEAD, "/events"), Need::Role(Role::Read));
        assert_eq!(need(&Method::GET, "/openapi.json"), Need::Open);
        assert_eq!(
            need(&Method::GET, "/no-such-route"),
            Need::Role(Role::Admin)
        );
        assert_eq!(need(&Method::PUT, "/events"), Need::Role(Role::Admin));
    }
}
