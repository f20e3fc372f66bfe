//! The meshlog node: one durable replica served over HTTP and JSON on one
//! port, syncing with its peers over an HTTP upgrade on that same port.
//!
//! # Layout
//!
//! - `main.rs` (the `meshlog` binary): parses the command line into [`Cli`]
//!   and calls [`run`]; nothing else.
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
//!   peers added and removed at run time.
//! - `read`: the one read behind `GET /events`, `POST /events/query` and
//!   follow: a cursor's text, a limit and a stream filter to a page or a
//!   stale answer.
//! - `replica`: `NodeReplica`, the one place the node touches its replica,
//!   and the data directory's `stream-id` file.
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

use std::process::ExitCode;

pub mod auth;
pub mod cli;
pub mod client;
pub mod config;
pub mod demo;
pub mod follow;
pub mod http;
pub mod mcp;
mod metrics;
pub mod peer_auth;
mod peers;
mod read;
mod replica;
pub mod serve;
pub mod tls;
pub mod url;

pub use config::{NodeConfig, ServeArgs};
pub use serve::{Node, ServeError};

/// The `meshlog` command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "meshlog",
    version,
    about = "A replicated event log for a mesh of runtimes."
)]
pub struct Cli {
    /// Log as JSON lines instead of human-readable text (on stderr).
    #[arg(long, global = true)]
    pub log_json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `meshlog`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run a node: one durable replica served over HTTP, syncing with peers.
    Serve(Box<ServeArgs>),
    /// The local demo: three nodes, a partition, a walk resumed on another
    /// node, a stale token; checks its own claims.
    Demo(demo::DemoArgs),
    /// Serve the Model Context Protocol on stdio, as a client of a node:
    /// tools to page, follow and append with the same cursor token.
    Mcp(mcp::McpArgs),
    /// Print the HTTP API's OpenAPI document (what `GET /openapi.json`
    /// serves; `meshlog openapi > docs/openapi.json` refreshes the
    /// committed copy).
    Openapi,
    /// Client subcommands, talking to a running node.
    #[command(flatten)]
    Client(cli::ClientCommand),
}

/// Runs one `meshlog` command line to its end.
pub fn run(cli: Cli) -> ExitCode {
    // The demo narrates on stdout; the nodes' info logs would drown it. An
    // MCP host shows the server's stderr to a person: keep it to problems.
    let level = match cli.command {
        Command::Demo(_) | Command::Mcp(_) => "warn",
        _ => "info",
    };
    init_tracing(cli.log_json, level);
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Demo(args) => demo::run(args),
        Command::Mcp(args) => mcp::run(args),
        Command::Openapi => cli::print_openapi(),
        Command::Client(command) => cli::run(command),
    }
}

/// Logs to stderr (stdout is for output other programs read, such as
/// `listening on ADDR`): human-readable, or JSON lines with `--log-json`.
/// `RUST_LOG` filters; the default is `level`.
fn init_tracing(json: bool, level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests calling `run` twice) is harmless: keep the first.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
