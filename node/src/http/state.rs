//! What every handler shares ([`AppState`]) and what the accept loop
//! tells them of a request's connection ([`ConnInfo`]). Its own file, so
//! that the handlers and the router both depend on it and not on each
//! other.

use std::sync::Arc;

use crate::config::Limits;
use crate::metrics::Metrics;
use crate::peers::Peers;
use crate::replica::NodeReplica;

/// What every handler shares.
pub(crate) struct AppState {
    /// The node's replica.
    pub replica: NodeReplica,
    /// The node's sync links.
    pub peers: Peers,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The HTTP bounds.
    pub limits: Limits,
    /// The follow connections' limits and change watch.
    pub follow: crate::follow::FollowHub,
    /// The secrets: who may do what.
    pub auth: crate::auth::Auth,
    /// The node's TLS (whether sync upgrades need a client certificate).
    pub tls: crate::tls::Tls,
    /// How a read fetches a checkpoint a token names from the peers.
    pub fetch: crate::read::CheckpointFetch,
}

/// What the accept loop knows of a request's connection, in every
/// request's extensions.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    /// The client's address.
    pub remote: std::net::SocketAddr,
    /// Whether the client showed a certificate that chains to `--tls-ca`.
    pub client_certificate: bool,
}
