//! `meshlog key compact`: the mesh admin compacts a writer's stream
//! (retired, or misbehaving) on the nodes named (`docs/OPERATIONS.md`,
//! "Compact a writer's stream as the admin").
//!
//! It asks each node what a compaction statement of the stream at the
//! floor commits to (`GET /compaction`: the chain hash there), refuses to
//! sign if two nodes answer different hashes (two histories of the
//! stream), signs the statement here with the admin key file (the key
//! never leaves this machine) and submits it to every node (`POST
//! /compaction`, the `admin` role). A node that trusts the admin key
//! erases the stream up to the floor and sends the statement with that
//! floor to its peers behind it; a node that does not refuses it
//! (`statement_refused`, `no_authority`). One line per node on stdout;
//! exit 0 when every node took it, 1 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use meshlog_cursor::StreamId;
use meshlog_replica::{ChainHash, Compaction, SignedCompaction};

use crate::client::{Client, ClientOptions};
use crate::writer_key;

/// `meshlog key compact`.
#[derive(Debug, clap::Args)]
pub struct CompactStatementArgs {
    /// The admin key file (`key new-admin`).
    #[arg(long)]
    pub admin: PathBuf,
    /// The writer's stream to compact (decimal).
    #[arg(long)]
    pub stream: u64,
    /// The last seq to drop.
    #[arg(long)]
    pub floor: u64,
    /// A node to submit the statement to (its base URL). Repeatable, or
    /// comma-separated; the hash signed is asked of every node that holds
    /// seq FLOOR, and they must agree.
    #[arg(
        long = "node",
        env = "MESHLOG_NODE",
        value_delimiter = ',',
        required = true
    )]
    pub nodes: Vec<String>,
    /// A bearer secret of the `admin` role, for nodes that need one.
    #[arg(long, env = "MESHLOG_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The CA (PEM) an `https://` node's certificate chains to.
    #[arg(long, env = "MESHLOG_CA")]
    pub ca: Option<PathBuf>,
}

/// Runs `meshlog key compact`.
pub fn run(args: CompactStatementArgs) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let outcome = match runtime {
        Ok(runtime) => runtime.block_on(compact(args)),
        Err(error) => Err(format!("cannot start the runtime: {error}")),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("meshlog key compact: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn compact(args: CompactStatementArgs) -> Result<ExitCode, String> {
    let admin = writer_key::load_admin(&args.admin).map_err(|e| e.to_string())?;
    let stream = match args.stream {
        0 => return Err("--stream must be a non-zero stream id".into()),
        id => StreamId::new(id),
    };
    if args.floor == 0 {
        return Err("--floor must be a seq from 1".into());
    }
    let options = ClientOptions {
        token: args.token.clone(),
        ca: args.ca.clone(),
    };
    let clients = args
        .nodes
        .iter()
        .map(|url| Client::with_options(url, &options).map_err(|e| e.to_string()))
        .collect::<Result<Vec<Client>, String>>()?;
    let hash = agreed_hash(&clients, stream, args.floor).await?;
    let signed = Compaction {
        stream,
        floor: args.floor,
        hash,
    }
    .sign_by_admin(&admin);
    Ok(submit(&clients, &signed).await)
}

/// The chain hash at `floor` every node that holds it answers, or why
/// none can be signed: no node answered, or two answered differently.
async fn agreed_hash(
    clients: &[Client],
    stream: StreamId,
    floor: u64,
) -> Result<ChainHash, String> {
    let mut agreed: Option<(String, String)> = None;
    let mut unknown = Vec::new();
    for client in clients {
        match client.compaction(stream, floor).await {
            Ok(answer) => match &agreed {
                Some((url, hash)) if *hash != answer.hash => {
                    return Err(format!(
                        "the nodes hold two histories of stream {}: {url} has chain hash {hash} \
                         at seq {floor}, {} has {}; nothing signed",
                        stream.get(),
                        client.url(),
                        answer.hash
                    ))
                }
                Some(_) => {}
                None => agreed = Some((client.url().to_owned(), answer.hash)),
            },
            Err(error) => unknown.push(error.to_string()),
        }
    }
    let Some((_, hash)) = agreed else {
        return Err(format!(
            "no node answered the chain hash of stream {} at seq {floor}: {}",
            stream.get(),
            unknown.join("; ")
        ));
    };
    let bytes = crate::trust::decode_hex(&hash)?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| format!("a node answered a hash of another length: {hash}"))?;
    Ok(ChainHash::from_bytes(bytes))
}

/// Submits `signed` to every node, one line each; success when all took it.
async fn submit(clients: &[Client], signed: &SignedCompaction) -> ExitCode {
    let mut code = ExitCode::SUCCESS;
    for client in clients {
        match client.submit_statement(signed).await {
            Ok(taken) => println!(
                "{}: stream {} compacted to seq {} by the admin statement (its floor now {}{})",
                client.url(),
                taken.stream,
                signed.statement.floor,
                taken.floor,
                if taken.raised { "" } else { ", already there" }
            ),
            Err(error) => {
                eprintln!("meshlog key compact: {error}");
                code = ExitCode::FAILURE;
            }
        }
    }
    code
}
