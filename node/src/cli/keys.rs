//! `meshlog key`: the keys of the trust configuration (`docs/OPERATIONS.md`,
//! "Writer keys and trust"), offline, with no node running; and the admin
//! key's compaction statements, submitted to nodes.
//!
//! - `key show --data-dir D`: the node's writer public key and stream.
//! - `key new-admin --out FILE`: a new mesh admin key file (0600, the rules
//!   of `writer.key`).
//! - `key admit --admin FILE KEY`: an admission of a writer, signed.
//! - `key bind --admin FILE KEY@STREAM`: a legacy stream bound to a key,
//!   signed.
//!
//! - `key compact --admin FILE --stream S --floor F --node URL…`: a
//!   compaction statement of a writer's stream, signed here and submitted
//!   to the nodes (`crate::cli::statement`; the one command that talks to
//!   nodes).
//!
//! Each other command prints on stdout exactly one line of the trust configuration's TOML
//! (`writers = […]`, `admin_key = …`, `admissions = […]`, `bindings = […]`),
//! to paste into every node's `--config` file (or its value to give to the
//! matching flag); anything else goes to stderr. Exit codes: 0 done, 1 a key
//! file or argument refused (the reason on stderr), 2 bad usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use meshlog_replica::{Binding, WriterAdmission};

use crate::trust::{encode_hex, writer_entry};
use crate::writer_key;

/// `meshlog key`.
#[derive(Debug, clap::Args)]
pub struct KeyArgs {
    #[command(subcommand)]
    action: KeyAction,
}

/// What `meshlog key` does.
#[derive(Debug, clap::Subcommand)]
pub enum KeyAction {
    /// Print the node's writer public key and stream, as the `writers`
    /// entry other nodes' trust configuration takes.
    Show {
        /// The node's data directory (its `writer.key` and `stream-id`).
        #[arg(long, visible_alias = "data", env = "MESHLOG_DATA")]
        data_dir: PathBuf,
    },
    /// Create a mesh admin key file (mode 0600; an existing file is not
    /// replaced) and print its public key as `admin_key`.
    NewAdmin {
        /// The admin key file to create. Keep it off the nodes.
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign an admission of a writer's public key with the admin key and
    /// print it as `admissions`.
    Admit {
        /// The admin key file (`key new-admin`).
        #[arg(long)]
        admin: PathBuf,
        /// The writer's public key (64 hex digits; `key show` prints it).
        key: String,
    },
    /// Sign a binding of a legacy stream to a writer's key with the admin
    /// key and print it as `bindings`.
    Bind {
        /// The admin key file (`key new-admin`).
        #[arg(long)]
        admin: PathBuf,
        /// `KEY@STREAM`: the writer's public key and the legacy stream it
        /// writes (decimal).
        entry: String,
    },
    /// Compact a writer's stream on the nodes named as the mesh admin:
    /// sign a compaction statement of the stream at the floor (the chain
    /// hash there asked of the nodes, the key kept here) and submit it.
    Compact(super::statement::CompactStatementArgs),
}

/// Runs `meshlog key`.
pub fn run(args: KeyArgs) -> ExitCode {
    if let KeyAction::Compact(args) = args.action {
        return super::statement::run(args);
    }
    match line(args.action) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("meshlog key: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The trust configuration line an action prints, or why it cannot.
fn line(action: KeyAction) -> Result<String, String> {
    match action {
        KeyAction::Show { data_dir } => show(&data_dir),
        KeyAction::NewAdmin { out } => {
            let admin = writer_key::create_admin(&out).map_err(|e| e.to_string())?;
            eprintln!(
                "admin key created in {} (mode 0600): keep it off the nodes; give them its public key",
                out.display()
            );
            Ok(format!(
                "admin_key = \"{}\"",
                encode_hex(&admin.public().to_bytes())
            ))
        }
        KeyAction::Admit { admin, key } => {
            let admin = writer_key::load_admin(&admin).map_err(|e| e.to_string())?;
            let key = match writer_entry(&key)? {
                (key, None) => key,
                (_, Some(_)) => {
                    return Err("admit takes a KEY; KEY@STREAM is for `key bind`".into())
                }
            };
            let signed = WriterAdmission { key }.sign(&admin);
            Ok(format!(
                "admissions = [\"{}\"]",
                encode_hex(&signed.to_bytes())
            ))
        }
        KeyAction::Bind { admin, entry } => {
            let admin = writer_key::load_admin(&admin).map_err(|e| e.to_string())?;
            let (key, stream) = match writer_entry(&entry)? {
                (key, Some(stream)) => (key, stream),
                (_, None) => return Err(format!("bind takes KEY@STREAM, not {entry:?}")),
            };
            let signed = Binding { stream, key }.sign(&admin);
            Ok(format!(
                "bindings = [\"{}\"]",
                encode_hex(&signed.to_bytes())
            ))
        }
        KeyAction::Compact(_) => Err("key compact talks to nodes; it prints no line".into()),
    }
}

/// `key show`: the `writers` entry of the node in `dir`, and its stream
/// (a TOML comment on the same line). A legacy directory's entry is
/// `KEY@STREAM`: the binding it seals under.
fn show(dir: &Path) -> Result<String, String> {
    let key = writer_key::load(dir)
        .map_err(|error| format!("{error} (a node creates its writer.key on its first start)"))?;
    let public = key.public();
    let derived = key.stream();
    let recorded = crate::replica::recorded_stream(dir).map_err(|e| e.to_string())?;
    Ok(match recorded {
        Some(stream) if stream != derived => format!(
            "writers = [\"{public}@{}\"]  # legacy stream {}: sealed once this binding is in every node's trust configuration",
            stream.get(),
            stream.get()
        ),
        _ => format!(
            "writers = [\"{public}\"]  # stream {}, derived from the key",
            derived.get()
        ),
    })
}
