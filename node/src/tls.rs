//! TLS for the node's port and its peer links, with `rustls` (and `ring`):
//! certificate and key files by flag, a peer's certificate checked against
//! a configured CA (`docs/SECURITY.md`, "TLS").
//!
//! - `--tls-cert FILE --tls-key FILE` (PEM): the node serves HTTPS only;
//!   its peers dial it at `https://`.
//! - `--tls-ca FILE` (PEM): the CA peers' certificates must chain to. The
//!   node checks the certificate of every peer it dials against it, and
//!   presents its own certificate when dialing. As the acceptor, it asks
//!   every client for a certificate: HTTP clients may send none (they
//!   authenticate with bearer secrets), but `GET /sync` is refused to a
//!   connection without one that chains to the CA.
//!
//! The node's own certificate and key are reread on `SIGHUP`
//! ([`Tls::reload`]): handshakes from then on present the new pair, the
//! links already up keep theirs. The CA is read at start only.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SignatureScheme};

/// The TLS files, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The node's certificate chain (PEM).
    pub cert: PathBuf,
    /// The node's private key (PEM).
    pub key: PathBuf,
    /// The CA that peers' certificates must chain to (PEM).
    pub ca: Option<PathBuf>,
}

/// Why the TLS settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{what} {path}: {reason}")]
    File {
        /// What the file was for (`certificate`, `key`, `CA`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the configuration (a key that does not match the
    /// certificate, say).
    #[error("TLS configuration: {0}")]
    Config(String),
    /// Only one of `--tls-cert` and `--tls-key` was given.
    #[error("--tls-cert and --tls-key go together")]
    Incomplete,
}

/// The node's loaded TLS: the server side for its port, the client side
/// for dialing `https://` peers.
#[derive(Clone)]
pub struct Tls {
    /// The server configuration, if the node serves TLS.
    pub server: Option<Arc<ServerConfig>>,
    /// The client configuration for dialing peers: roots from `--tls-ca`,
    /// and the node's certificate as its client certificate.
    pub client: Option<Arc<ClientConfig>>,
    /// Whether `GET /sync` needs a client certificate (a CA is set and the
    /// node serves TLS).
    pub peers_need_certificate: bool,
    /// The node's own certificate and key, which both configurations
    /// present and [`Tls::reload`] replaces.
    own: Option<Arc<OwnCert>>,
}

/// The node's certificate chain and key, as read from their files last:
/// what every handshake presents, server side and client side.
#[derive(Debug)]
struct OwnCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl OwnCert {
    fn read(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
        let chain = certificates("certificate", cert)?;
        let der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("key", key, e))?;
        // Checks that the key is the certificate's.
        let pair = CertifiedKey::from_der(chain, der, &provider())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Arc::new(pair))
    }

    fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }
}

impl ResolvesServerCert for OwnCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for OwnCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _schemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server", &self.server.is_some())
            .field("client", &self.client.is_some())
            .field("peers_need_certificate", &self.peers_need_certificate)
            .finish()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_error(what: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        what,
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates("CA", path)? {
        roots
            .add(cert)
            .map_err(|e| file_error("CA", path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

impl Tls {
    /// No TLS: plain HTTP, `http://` peers only.
    pub fn none() -> Tls {
        Tls {
            server: None,
            client: None,
            peers_need_certificate: false,
            own: None,
        }
    }

    /// Loads the files. With a CA but no certificate of its own, the node
    /// serves plain HTTP but dials `https://` peers, checking them
    /// against the CA.
    pub fn load(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
    ) -> Result<Tls, TlsError> {
        let own = match (cert, key) {
            (Some(cert), Some(key)) => Some(Arc::new(OwnCert {
                current: RwLock::new(OwnCert::read(cert, key)?),
                cert: cert.to_owned(),
                key: key.to_owned(),
            })),
            (None, None) => None,
            _ => return Err(TlsError::Incomplete),
        };
        let roots = ca.map(roots).transpose()?;
        let config = |e: rustls::Error| TlsError::Config(e.to_string());
        let server = match &own {
            None => None,
            Some(own) => {
                let builder = ServerConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(config)?;
                let builder = match &roots {
                    Some(roots) => {
                        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                            Arc::clone(roots),
                            provider(),
                        )
                        .allow_unauthenticated()
                        .build()
                        .map_err(|e| TlsError::Config(e.to_string()))?;
                        builder.with_client_cert_verifier(verifier)
                    }
                    None => builder.with_no_client_auth(),
                };
                let mut server = builder.with_cert_resolver(Arc::clone(own) as _);
                server.alpn_protocols = vec![b"http/1.1".to_vec()];
                Some(Arc::new(server))
            }
        };
        let client = match &roots {
            None => None,
            Some(roots) => {
                let builder = ClientConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(config)?
                    .with_root_certificates(Arc::clone(roots));
                let client = match &own {
                    Some(own) => builder.with_client_cert_resolver(Arc::clone(own) as _),
                    None => builder.with_no_client_auth(),
                };
                Some(Arc::new(client))
            }
        };
        Ok(Tls {
            peers_need_certificate: server.is_some() && roots.is_some(),
            server,
            client,
            own,
        })
    }

    /// Rereads the node's certificate and key from their files (what
    /// `SIGHUP` does): handshakes from then on present the new pair, the
    /// connections already up keep theirs. `Ok(false)` when the node has no
    /// certificate of its own. On an error (a file missing or unreadable, a
    /// key that is not the certificate's) the old pair stays in force.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let Some(own) = &self.own else {
            return Ok(false);
        };
        let pair = OwnCert::read(&own.cert, &own.key)?;
        *own.current.write().unwrap_or_else(PoisonError::into_inner) = pair;
        Ok(true)
    }
}

/// The client side of a TLS handshake over `tcp`, checking the server's
/// certificate for `host`: what dialing a peer and following a node share.
pub(crate) async fn connect(
    client: Arc<ClientConfig>,
    host: &str,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|error| format!("bad TLS server name {host:?}: {error}"))?;
    tokio_rustls::TlsConnector::from(client)
        .connect(name, tcp)
        .await
        .map_err(|error| format!("TLS handshake with {host} failed: {error}"))
}

/// A client configuration trusting the CA in `path` (the CLI's and the
/// follower's `--ca`), with no client certificate.
pub fn client_trusting(path: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = roots(path)?;
    let client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(client))
}
