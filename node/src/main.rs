//! The `meshlog` binary: parses the command line and hands it to the
//! library (`meshlog_node`), where every subcommand lives.

use clap::Parser;

fn main() -> std::process::ExitCode {
    meshlog_node::run(meshlog_node::Cli::parse())
}
