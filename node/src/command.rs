//! The `meshlog` command line: [`Cli`], its subcommands, and [`run`], which
//! hands each to its module.

use std::process::ExitCode;

use crate::config::ServeArgs;
use crate::{cli, demo, mcp, serve};

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
    /// The keys of the trust configuration, offline: show a node's writer
    /// key, make an admin key, sign admissions and bindings; and compact
    /// a writer's stream on nodes as the mesh admin.
    Key(cli::keys::KeyArgs),
    /// Client subcommands, talking to a running node.
    #[command(flatten)]
    Client(cli::ClientCommand),
}

/// Runs one `meshlog` command line to its end.
pub fn run(cli: Cli) -> ExitCode {
    // The demo narrates on stdout; the nodes' info logs would drown it. An
    // MCP host shows the server's stderr to a person: keep it to problems.
    let level = match cli.command {
        Command::Demo(_) | Command::Mcp(_) | Command::Key(_) => "warn",
        _ => "info",
    };
    init_tracing(cli.log_json, level);
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Demo(args) => demo::run(args),
        Command::Mcp(args) => mcp::run(args),
        Command::Openapi => cli::print_openapi(),
        Command::Key(args) => cli::keys::run(args),
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
