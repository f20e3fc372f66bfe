//! The client subcommands (`meshlog append`, `meshlog page`, ...): a thin
//! HTTP client of a running node. Not built yet: each subcommand says so and
//! exits with status 2.

use std::process::ExitCode;

/// A client subcommand, talking to a running node over HTTP.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Append events to a node (not built yet).
    Append(ClientArgs),
    /// Page through a node's log (not built yet).
    Page(ClientArgs),
}

/// Arguments shared by the client subcommands.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// The node's base URL.
    #[arg(long, env = "MESHLOG_NODE", default_value = "http://127.0.0.1:7070")]
    pub node: String,
    /// Whatever else the subcommand takes.
    pub rest: Vec<String>,
}

/// Runs a client subcommand.
pub fn run(command: ClientCommand) -> ExitCode {
    let name = match command {
        ClientCommand::Append(_) => "append",
        ClientCommand::Page(_) => "page",
    };
    eprintln!("meshlog {name}: not built yet");
    ExitCode::from(2)
}
