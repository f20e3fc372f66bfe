//! `meshlog demo`: a local mesh of nodes with embedded defaults, no setup.
//! Not built yet: it says so and exits with status 2.

use std::process::ExitCode;

/// Arguments of `meshlog demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

/// Runs the demo.
pub fn run(_args: DemoArgs) -> ExitCode {
    eprintln!("meshlog demo: not built yet");
    ExitCode::from(2)
}
