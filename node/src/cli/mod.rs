//! The client subcommands (`meshlog append`, `events`, `marks`, `compact`,
//! `peers`): a thin HTTP client of a running node, by default
//! `http://127.0.0.1:7070` (`--node URL` or `MESHLOG_NODE`).
//!
//! They talk to a node over HTTP only ([`client::Client`]) and never open a
//! data directory. Output is for people by default and JSON lines with
//! `--json`; errors go to stderr and say which node and what it answered.
//!
//! Exit codes: 0 done; 1 the node is unreachable or answered an error;
//! 2 bad usage (clap's); [`EXIT_STALE`] a stale cursor, reported with what
//! was lost and the token to resume from.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use meshlog_cursor::{token, StreamId, VersionVector};

pub mod keys;
pub mod statement;

/// The HTTP client the subcommands talk through (the node's one client,
/// `crate::client`, kept at this path too).
pub use crate::client;

use client::{
    Client, ClientError, EventJson, InboundJson, PageOutcome, PeerJson, Stale, VectorJson,
};

/// The exit code of `meshlog events` when the cursor is stale: distinct
/// from a failure, so a script can accept the gap and resume.
pub const EXIT_STALE: u8 = 3;

/// The default node URL.
pub const NODE_DEFAULT: &str = "http://127.0.0.1:7070";

/// A client subcommand, talking to a running node over HTTP.
#[derive(Debug, clap::Subcommand)]
pub enum ClientCommand {
    /// Append events to a node's own stream, as one batch (one commit).
    Append(AppendArgs),
    /// Page through a node's log from a token; prints `next: TOKEN` last.
    Events(EventsArgs),
    /// Show a node's marks, floor, resume token, digest and peers.
    Marks(MarksArgs),
    /// Drop old events on a node, raising its floor.
    Compact(CompactArgs),
    /// Read and check every event a node holds (`--data DIR`: a stopped
    /// node's data directory, offline).
    Verify(VerifyArgs),
    /// List, add or remove a node's peers.
    Peers(PeersArgs),
}

/// Which node to talk to.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeArg {
    /// The node's base URL.
    #[arg(long, env = "MESHLOG_NODE", default_value = NODE_DEFAULT, global = true)]
    pub node: String,
    /// A bearer secret for a node that needs one (`docs/SECURITY.md`).
    #[arg(long, env = "MESHLOG_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// The CA (PEM) an `https://` node's certificate chains to.
    #[arg(long, env = "MESHLOG_CA", global = true)]
    pub ca: Option<std::path::PathBuf>,
}

impl NodeArg {
    /// A client of the node, with the secret and CA given.
    pub fn client(&self) -> Result<Client, ClientError> {
        Client::with_options(
            &self.node,
            &client::ClientOptions {
                token: self.token.clone(),
                ca: self.ca.clone(),
            },
        )
    }
}

/// `meshlog append`.
#[derive(Debug, clap::Args)]
pub struct AppendArgs {
    #[command(flatten)]
    node: NodeArg,
    /// Read payloads from stdin, one per line, instead of the arguments.
    #[arg(long, conflicts_with = "payloads")]
    stdin: bool,
    /// Print each appended event as a JSON line.
    #[arg(long)]
    json: bool,
    /// The payloads, one event each.
    #[arg(required_unless_present = "stdin")]
    payloads: Vec<String>,
}

/// `meshlog events`.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    #[command(flatten)]
    node: NodeArg,
    /// The token to page after (a `next:` line of an earlier call, or any
    /// node's); the start of the log if absent.
    #[arg(long)]
    after: Option<String>,
    /// Events per page (the node's default if absent).
    #[arg(long)]
    limit: Option<usize>,
    /// Walk page by page to the node's head.
    #[arg(long, conflicts_with = "follow")]
    all: bool,
    /// Follow live over `GET /follow` (a WebSocket): print every event past
    /// the token as it is committed, refetching any gap from the cursor,
    /// until Ctrl-C, which prints `next: TOKEN` to resume from. A stale
    /// cursor ends it as a stale page does.
    #[arg(long)]
    follow: bool,
    /// With `--follow`: only this writer's stream (a decimal stream id).
    #[arg(long, requires = "follow")]
    writer: Option<u64>,
    /// JSON lines: one per event, then `{"next", "at_head", "behind"}`.
    #[arg(long)]
    json: bool,
}

/// `meshlog marks`.
#[derive(Debug, clap::Args)]
pub struct MarksArgs {
    #[command(flatten)]
    node: NodeArg,
    /// The node's JSON as it is.
    #[arg(long)]
    json: bool,
}

/// `meshlog compact`.
#[derive(Debug, clap::Args)]
pub struct CompactArgs {
    #[command(flatten)]
    node: NodeArg,
    /// Keep at least this many of each stream's newest events.
    #[arg(long)]
    keep_last: Option<u64>,
    /// Keep events younger than this many milliseconds.
    #[arg(long)]
    keep_ms: Option<u64>,
    /// Compact past what the node's peers have acknowledged.
    #[arg(long)]
    ignore_peers: bool,
}

/// `meshlog verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    node: NodeArg,
    /// Verify this data directory offline instead of asking a running node
    /// (the node must be stopped: its lock keeps the directory from being
    /// opened twice).
    #[arg(long)]
    data: Option<std::path::PathBuf>,
}

/// `meshlog peers`.
#[derive(Debug, clap::Args)]
pub struct PeersArgs {
    #[command(flatten)]
    node: NodeArg,
    #[command(subcommand)]
    action: PeersAction,
}

/// What to do with a node's peers.
#[derive(Debug, clap::Subcommand)]
pub enum PeersAction {
    /// List the peers the node dials, with their state.
    List,
    /// Start syncing with a peer.
    Add {
        /// The peer's URL (`http://HOST:PORT`).
        url: String,
    },
    /// Stop syncing with a peer.
    Remove {
        /// The peer's URL.
        url: String,
    },
}

/// `meshlog openapi`: prints the OpenAPI document a node serves at
/// `GET /openapi.json`, with no node running.
pub fn print_openapi() -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out
        .write_all(crate::http::openapi::document().as_bytes())
        .and_then(|()| out.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("meshlog: cannot write the document: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a client subcommand.
pub fn run(command: ClientCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("meshlog: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(command)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("meshlog: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn execute(command: ClientCommand) -> Result<ExitCode, ClientError> {
    match command {
        ClientCommand::Append(args) => append(args).await,
        ClientCommand::Events(args) => events(args).await,
        ClientCommand::Marks(args) => marks(args).await,
        ClientCommand::Compact(args) => compact(args).await,
        ClientCommand::Verify(args) => verify(args).await,
        ClientCommand::Peers(args) => peers(args).await,
    }
}

async fn append(args: AppendArgs) -> Result<ExitCode, ClientError> {
    let client = args.node.client()?;
    let payloads = if args.stdin {
        let mut lines = Vec::new();
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(line) => lines.push(line),
                Err(error) => {
                    eprintln!("meshlog append: cannot read stdin: {error}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        lines
    } else {
        args.payloads
    };
    if payloads.is_empty() {
        eprintln!("meshlog append: nothing to append");
        return Ok(ExitCode::SUCCESS);
    }
    let appended = client.append(&payloads).await?;
    let mut out = std::io::stdout().lock();
    if args.json {
        for event in &appended {
            let line = serde_json::to_string(event).unwrap_or_default();
            let _ = writeln!(out, "{line}");
        }
    } else if let (Some(first), Some(last)) = (appended.first(), appended.last()) {
        let _ = writeln!(
            out,
            "appended {} event(s) to stream {}: seq {}..={}, lamport {}..={}",
            appended.len(),
            first.stream,
            first.seq,
            last.seq,
            first.lamport,
            last.lamport
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One event as a line for people: `stream:seq  lamport N  payload`.
pub fn event_line(event: &EventJson) -> String {
    let payload = match (&event.payload, &event.payload_base64) {
        (Some(text), _) if !text.chars().any(char::is_control) => text.clone(),
        (Some(text), _) => format!("{text:?}"),
        (None, Some(encoded)) => format!("base64:{encoded}"),
        (None, None) => String::new(),
    };
    format!(
        "{}:{}  lamport {}  {}",
        event.stream, event.seq, event.lamport, payload
    )
}

/// Prints a stale report: one JSON line (`--json`), or the lines of
/// [`stale_lines`].
fn print_stale(out: &mut impl Write, stale: &Stale, json: bool) {
    if json {
        let line = serde_json::to_string(&client::ErrorJson {
            error: "stale_cursor".into(),
            message: stale.message.clone(),
            lost: Some(stale.lost.clone()),
            resume: Some(stale.resume.clone()),
            max: None,
            limit: None,
            checkpoint: None,
            peers_asked: None,
        })
        .unwrap_or_default();
        let _ = writeln!(out, "{line}");
    } else {
        for line in stale_lines(stale) {
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = out.flush();
}

/// The lines that report a stale cursor: what was lost and where to resume.
pub fn stale_lines(stale: &Stale) -> Vec<String> {
    let mut lines = vec![format!(
        "stale cursor: {} event(s) were compacted away before this reader saw them",
        stale.lost_count()
    )];
    for range in &stale.lost {
        lines.push(format!(
            "lost: stream {} seq {}..={} ({} event(s))",
            range.stream,
            range.first,
            range.last,
            range.last + 1 - range.first
        ));
    }
    lines.push(format!("resume: {}", stale.resume));
    lines
}

async fn events(args: EventsArgs) -> Result<ExitCode, ClientError> {
    if args.follow {
        return follow(args).await;
    }
    let client = args.node.client()?;
    let mut after = args.after.clone().filter(|token| !token.is_empty());
    let stdout = std::io::stdout();
    let bar = if args.all && stdout.is_terminal() {
        progress_bar(&client, after.as_deref()).await
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut out = stdout.lock();
    loop {
        let page = match client.page(after.as_deref(), args.limit).await? {
            PageOutcome::Page(page) => page,
            PageOutcome::Stale(stale) => {
                bar.finish_and_clear();
                print_stale(&mut out, &stale, args.json);
                return Ok(ExitCode::from(EXIT_STALE));
            }
        };
        bar.suspend(|| {
            for event in &page.events {
                let line = if args.json {
                    serde_json::to_string(event).unwrap_or_default()
                } else {
                    event_line(event)
                };
                let _ = writeln!(out, "{line}");
            }
        });
        bar.inc(page.events.len() as u64);
        let done = !args.all || page.at_head || page.events.is_empty();
        if done {
            bar.finish_and_clear();
            if args.json {
                let line = serde_json::json!({"next": page.next, "at_head": page.at_head, "behind": page.behind});
                let _ = writeln!(out, "{line}");
            } else {
                if page.behind {
                    let _ = writeln!(
                        out,
                        "(this node is behind the cursor on some stream; it serves what it has)"
                    );
                }
                let _ = writeln!(out, "next: {}", page.next);
            }
            let _ = out.flush();
            return Ok(ExitCode::SUCCESS);
        }
        after = Some(page.next);
    }
}

/// The follower `meshlog events --follow` runs, from its flags; `Err`:
/// what is wrong with them. `--after` is a token of either version: a
/// version-2 token is expanded with its checkpoint, asked of the node
/// (which fetches it from its peers if it lacks it).
async fn follower_config(args: &EventsArgs) -> Result<crate::follow::FollowerConfig, String> {
    use crate::follow::{FollowStream, FollowerConfig};

    let stream = match args.writer {
        Some(0) => return Err("--writer must be a non-zero stream id".into()),
        Some(id) => FollowStream::Writer(StreamId::new(id)),
        None => FollowStream::All,
    };
    let mut config = FollowerConfig::new(vec![args.node.node.clone()], stream);
    config.token = args.node.token.clone();
    if let Some(ca) = &args.node.ca {
        config.tls = Some(crate::tls::client_trusting(ca).map_err(|error| error.to_string())?);
    }
    if let Some(after) = args.after.as_deref().filter(|token| !token.is_empty()) {
        let client = args.node.client().map_err(|error| error.to_string())?;
        config.after = match client.cursor(after).await {
            Ok(cursor) => cursor,
            Err(ClientError::BadToken { reason }) => {
                return Err(format!("bad --after token: {reason}"))
            }
            Err(error) => return Err(format!("--after names a checkpoint: {error}")),
        };
    }
    if let Some(limit) = args.limit {
        config.page_limit = limit.max(1);
    }
    Ok(config)
}

/// `meshlog events --follow`: the `Follower` client, printing as it goes.
async fn follow(args: EventsArgs) -> Result<ExitCode, ClientError> {
    use crate::follow::{FollowItem, Follower};
    use futures_util::StreamExt;

    let started = follower_config(&args)
        .await
        .and_then(|config| Follower::start(config).map_err(|error| error.to_string()));
    let mut follower = match started {
        Ok(follower) => follower,
        Err(error) => {
            eprintln!("meshlog events: {error}");
            return Ok(ExitCode::from(2));
        }
    };
    let mut out = std::io::stdout().lock();
    let finish = |out: &mut std::io::StdoutLock<'_>, follower: &Follower| {
        let next = follower.token();
        let line = if args.json {
            serde_json::json!({"next": next}).to_string()
        } else {
            format!("next: {next}")
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    loop {
        let item = tokio::select! {
            item = follower.next() => item,
            _ = tokio::signal::ctrl_c() => {
                finish(&mut out, &follower);
                return Ok(ExitCode::SUCCESS);
            }
        };
        match item {
            Some(FollowItem::Event(event)) => {
                let line = if args.json {
                    serde_json::to_string(&event).unwrap_or_default()
                } else {
                    event_line(&event)
                };
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
            Some(FollowItem::Connected { node }) => eprintln!("meshlog events: following {node}"),
            Some(FollowItem::Refetched { events }) => {
                eprintln!("meshlog events: a gap was refetched ({events} event(s))")
            }
            Some(FollowItem::Lagged { .. }) => {
                eprintln!("meshlog events: too slow for the node; paging, then following again")
            }
            Some(FollowItem::Stale { lost, resume, .. }) => {
                let stale = Stale {
                    message: "the cursor is below the node's floor".into(),
                    lost,
                    resume: token::encode_text(&resume).unwrap_or_default(),
                };
                print_stale(&mut out, &stale, args.json);
                return Ok(ExitCode::from(EXIT_STALE));
            }
            Some(FollowItem::Status(_)) => {}
            None => {
                finish(&mut out, &follower);
                return Ok(ExitCode::FAILURE);
            }
        }
    }
}

/// A bar over the events the walk has left (the node's marks above the
/// cursor and its floor), or a hidden one if that is small or unknown.
async fn progress_bar(client: &Client, after: Option<&str>) -> indicatif::ProgressBar {
    const SHOWN_FROM: u64 = 10_000;
    // A version-2 token is expanded with its checkpoint, asked of the
    // node; no bar if it cannot be.
    let cursor = match after {
        Some(text) => match client.cursor(text).await {
            Ok(cursor) => cursor,
            Err(_) => return indicatif::ProgressBar::hidden(),
        },
        None => VersionVector::new(),
    };
    let Ok(marks) = client.marks().await else {
        return indicatif::ProgressBar::hidden();
    };
    let vector = |json: &VectorJson| -> VersionVector {
        let mut vector = VersionVector::new();
        for (stream, seq) in json {
            if let Ok(stream) = stream.parse::<u64>() {
                vector.advance(StreamId::new(stream), *seq);
            }
        }
        vector
    };
    let (held, floor) = (vector(&marks.marks), vector(&marks.floor));
    let left: u64 = held
        .iter()
        .map(|(stream, seq)| seq.saturating_sub(cursor.get(stream).max(floor.get(stream))))
        .sum();
    if left < SHOWN_FROM {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(left);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} events  {per_sec}  eta {eta}")
    {
        bar.set_style(style);
    }
    bar
}

async fn marks(args: MarksArgs) -> Result<ExitCode, ClientError> {
    let client = args.node.client()?;
    let marks = client.marks().await?;
    if args.json {
        println!("{}", serde_json::to_string(&marks).unwrap_or_default());
        return Ok(ExitCode::SUCCESS);
    }
    println!("node:   {} (stream {})", client.url(), marks.stream);
    println!("marks:  {}", vector_text(&marks.marks));
    println!("floor:  {}", vector_text(&marks.floor));
    println!(
        "digest: {} events, sum {}",
        marks.digest.events, marks.digest.sum
    );
    // Equal on nodes that hold the same heads, whatever each compacted.
    println!("chains: {}", marks.chains.hash);
    if let Some(writer) = &marks.writer {
        let state = match (writer.sealed, writer.recovering) {
            (_, true) => "recovering its stream from peers",
            (true, false) => "sealed",
            (false, false) => "UNSEALED: a legacy stream no binding names",
        };
        println!("writer: {} ({state})", writer.public_key);
    }
    println!("token:  {}", marks.token);
    print_peers(&marks.peers);
    Ok(ExitCode::SUCCESS)
}

async fn compact(args: CompactArgs) -> Result<ExitCode, ClientError> {
    let client = args.node.client()?;
    let answer = client
        .compact(args.keep_last, args.keep_ms, args.ignore_peers)
        .await?;
    println!(
        "dropped {} event(s) on {} stream(s); floor: {}",
        answer.dropped,
        answer.streams,
        vector_text(&answer.floor)
    );
    Ok(ExitCode::SUCCESS)
}

async fn verify(args: VerifyArgs) -> Result<ExitCode, ClientError> {
    let started = std::time::Instant::now();
    let (streams, events, place) = match &args.data {
        Some(dir) => {
            let dir = dir.clone();
            let checked =
                tokio::task::spawn_blocking(move || crate::replica::NodeReplica::verify_dir(&dir))
                    .await;
            match checked {
                Ok(Ok(verified)) => (
                    verified.streams as u64,
                    verified.events,
                    args.data
                        .as_ref()
                        .map(|d| d.display().to_string())
                        .unwrap_or_default(),
                ),
                Ok(Err(error)) => {
                    eprintln!(
                        "meshlog verify: {}: {error}",
                        args.data
                            .as_ref()
                            .map(|d| d.display().to_string())
                            .unwrap_or_default()
                    );
                    return Ok(ExitCode::FAILURE);
                }
                Err(error) => {
                    eprintln!("meshlog verify: the check panicked: {error}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        None => {
            let client = args.node.client()?;
            let answer = client.verify().await?;
            (answer.streams, answer.events, client.url().to_owned())
        }
    };
    println!(
        "verified {place}: {events} event(s) on {streams} stream(s) sound ({} ms)",
        started.elapsed().as_millis()
    );
    Ok(ExitCode::SUCCESS)
}

async fn peers(args: PeersArgs) -> Result<ExitCode, ClientError> {
    let client = args.node.client()?;
    match args.action {
        PeersAction::List => {
            let answer = client.peers().await?;
            print_peers(&answer.peers);
            print_inbound(&answer.inbound);
        }
        PeersAction::Add { url } => {
            let answer = client.add_peer(&url).await?;
            if answer.added {
                println!("added peer {}", answer.url);
            } else {
                println!("already a peer: {}", answer.url);
            }
        }
        PeersAction::Remove { url } => {
            let answer = client.remove_peer(&url).await?;
            println!("removed peer {}", answer.url);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_peers(peers: &[PeerJson]) {
    if peers.is_empty() {
        println!("peers:  none");
        return;
    }
    println!("peers:");
    for peer in peers {
        let mut line = format!(
            "  {}  {}",
            peer.url,
            link_state(peer.connected, peer.stream.as_deref(), peer.lag_events)
        );
        if let Some(error) = &peer.last_error {
            line.push_str(&format!(", last error: {error}"));
        }
        println!("{line}");
    }
}

/// The inbound sessions, a line each: where from, stream and lag.
fn print_inbound(sessions: &[InboundJson]) {
    if sessions.is_empty() {
        println!("inbound: none");
        return;
    }
    println!("inbound:");
    for session in sessions {
        println!(
            "  from {}  {}",
            session.remote,
            link_state(
                session.connected,
                session.stream.as_deref(),
                session.lag_events
            )
        );
    }
}

/// `connected, stream 2, lag 0 event(s)`: a link's state on one line.
fn link_state(connected: bool, stream: Option<&str>, lag_events: u64) -> String {
    let state = if connected {
        "connected"
    } else {
        "not connected"
    };
    format!(
        "{state}, stream {}, lag {lag_events} event(s)",
        stream.unwrap_or("-")
    )
}

/// `{"1": 3, "2": 5}` as `1:3 2:5` (`-` when empty).
pub fn vector_text(vector: &VectorJson) -> String {
    if vector.is_empty() {
        return "-".into();
    }
    vector
        .iter()
        .map(|(stream, seq)| format!("{stream}:{seq}"))
        .collect::<Vec<_>>()
        .join(" ")
}
