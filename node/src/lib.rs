//! The meshlog node: one durable replica served over HTTP and JSON on one
//! port, syncing with its peers over an HTTP upgrade on that same port.
//!
//! # Layout
//!
//! - `main.rs` (the `meshlog` binary): parses the command line into [`Cli`]
//!   and calls [`run`]; nothing else. `command`: [`Cli`], its subcommands
//!   and [`run`], which hands each to its module (its own file, so the crate
//!   root imports no module that imports it back).
//! - [`config`]: `meshlog serve`'s flags and environment variables
//!   ([`ServeArgs`]), the optional TOML file ([`config::FileSettings`]) and
//!   the resolved [`NodeConfig`] with its limits and defaults.
//! - [`serve`]: startup (data directory, stream id, replica, listener),
//!   the accept loop with its connection limit and read timeouts, and
//!   graceful shutdown on SIGINT/SIGTERM ([`Node`]).
//! - [`http`]: the axum router, its handlers and errors, the `GET /sync`
//!   upgrade, [`http::json`], the API's JSON types (`docs/HTTP.md`),
//!   which clients deserialize with, and [`http::openapi`], the OpenAPI
//!   document generated from them (`GET /openapi.json`, `meshlog openapi`).
//! - `peers`: the links to peers by URL: dial, upgrade, run a sync session,
//!   redial with jittered exponential backoff, report each peer's state;
//!   peers added and removed at run time. `peer_memory`: the data
//!   directory's `peer-memory` file, what the links learned of their
//!   peers, so that a link's first hello after a restart goes against a
//!   checkpoint.
//! - `read`: the one read behind `GET /events`, `POST /events/query` and
//!   follow: a cursor's text, a limit and a stream filter to a page or a
//!   stale answer.
//! - `replica`: `NodeReplica`, the one place the node touches its replica,
//!   and the data directory's `stream-id` file: the stream its writer key
//!   derives, or a legacy stream's recorded id (the upgrade policy).
//! - [`writer_key`]: the data directory's `writer.key`, created on the
//!   first start and checked on every start (`docs/SIGNING.md`); it
//!   seals the node's stream. [`trust`]: the trust configuration (writer
//!   keys, admin key, admissions, bindings) decoded into the replica's
//!   membership.
//! - `metrics`: the Prometheus counters behind `GET /metrics`.
//! - [`auth`]: bearer secrets in three roles, the route table of who may
//!   do what, the middleware; `peer_auth`: the peers' challenge-response
//!   in the `GET /sync` upgrade; [`tls`]: rustls for the port and for
//!   `https://` peers (`docs/SECURITY.md`).
//! - [`follow`]: live follow over WebSocket (`GET /follow`), its frames,
//!   the [`follow::Follower`] client, and the browser page (`GET /`).
//! - [`client`]: the node's one HTTP client (reqwest), which the CLI, the
//!   follower's refetch and MCP talk through; [`url`]: the one parser of a
//!   node's URL, which they and the peers use.
//! - [`cli`], [`demo`]: the client subcommands and the local demo mesh.
//! - [`mcp`]: `meshlog mcp`, the Model Context Protocol on stdio, as a client
//!   of a node's HTTP API.
//!
//! **Architecture invariant:** only this crate knows HTTP and JSON. It uses
//! the replica, the cursor's token codec and sync's sessions through their
//! public APIs; every replica call goes through `replica::NodeReplica`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod auth;
pub mod cli;
pub mod client;
mod command;
pub mod config;
pub mod demo;
mod durable_file;
pub mod follow;
pub mod http;
pub mod mcp;
mod metrics;
pub mod peer_auth;
mod peer_memory;
mod peers;
mod read;
mod recovery;
mod replica;
pub mod serve;
pub mod tls;
pub mod trust;
pub mod url;
pub mod writer_key;

pub use command::{run, Cli, Command};
pub use config::{NodeConfig, ServeArgs};
pub use serve::{Node, ServeError};

/// Locks `mutex`, taking a poisoned lock as it is: only bookkeeping is
/// done under this crate's locks, so a panic elsewhere leaves it
/// consistent.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
