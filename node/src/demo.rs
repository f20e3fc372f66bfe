//! `meshlog demo`: a local mesh of three nodes with embedded defaults, no
//! setup, that shows the problem meshlog exists for and checks its own
//! claims.
//!
//! Three in-process [`Node`]s (A, B, C) on loopback, each in a temporary
//! data directory and writing the stream its new writer key derives
//! (sealed), linked to each other by URL. The demo
//! talks to them over HTTP only, through the same client as the CLI, and
//! prints the `curl` command that reproduces each step:
//!
//! 1. every node appends; the mesh converges;
//! 2. C is cut off (its peer links dropped through the API, on both sides)
//!    and writes while A and B keep writing, so C's events are stamped at
//!    or below what a reader of A will have passed;
//! 3. a reader walks A with a small limit to its head;
//! 4. the links heal; the reader resumes **on B** with its last token and
//!    receives C's late events exactly once, where a scalar
//!    `lamport > position` cursor receives none of them;
//! 5. B compacts; the reader's first token is now stale, and B says exactly
//!    which events it lost and which token resumes past them.
//!
//! Every claim is checked; the demo exits 1 if any fails. `--keep` leaves
//! the mesh running until Ctrl-C.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use meshlog_cursor::{StreamId, VersionVector};

use crate::cli::client::{
    AppendedJson, Client, ClientError, CompactedJson, EventJson, PageJson as Page, PageOutcome,
    Stale,
};
use crate::cli::{event_line, stale_lines, vector_text};
use crate::config::NodeConfig;
use crate::serve::Node;

/// Arguments of `meshlog demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Keep the mesh running after the demo, until Ctrl-C, to poke at it
    /// with `curl` or `meshlog --node URL ...`.
    #[arg(long)]
    pub keep: bool,
}

/// How long any one wait of the demo (convergence, a session ending) may
/// take before it counts as a failed check.
const WAIT_MAX: Duration = Duration::from_secs(20);

/// The reader's page length: small, so the walk takes several pages.
const PAGE_LIMIT: usize = 4;

/// Runs the demo.
pub fn run(args: DemoArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("meshlog demo: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let mesh = match Mesh::start().await {
            Ok(mesh) => mesh,
            Err(error) => {
                eprintln!("meshlog demo: cannot start the mesh: {error}");
                return ExitCode::FAILURE;
            }
        };
        let mut story = Story::default();
        if let Err(error) = script(&mesh, &mut story).await {
            story.fail(&error);
        }
        println!();
        let code = if story.failed.is_empty() {
            println!("All {} checks passed.", story.passed);
            ExitCode::SUCCESS
        } else {
            println!(
                "{} of {} checks FAILED:",
                story.failed.len(),
                story.passed + story.failed.len()
            );
            for failure in &story.failed {
                println!("  - {failure}");
            }
            ExitCode::FAILURE
        };
        if args.keep {
            println!();
            println!("The mesh keeps running until Ctrl-C:");
            for node in &mesh.nodes {
                println!("  {}  {}", node.name, node.client.url());
            }
            println!(
                "Try: meshlog events --node {} --all   (B compacted: the same on B is stale)",
                mesh.nodes[0].client.url()
            );
            println!(
                "     meshlog append --node {} hello   curl -s {}/marks",
                mesh.nodes[2].client.url(),
                mesh.nodes[1].client.url()
            );
            let _ = tokio::signal::ctrl_c().await;
            println!("stopping the mesh");
        }
        mesh.stop().await;
        code
    })
}

/// One node of the demo's mesh.
struct DemoNode {
    name: &'static str,
    stream: u64,
    node: Node,
    client: Client,
    _dir: tempfile::TempDir,
}

struct Mesh {
    nodes: Vec<DemoNode>,
}

impl Mesh {
    async fn start() -> Result<Mesh, String> {
        let mut nodes = Vec::new();
        for name in ["A", "B", "C"] {
            let dir = tempfile::Builder::new()
                .prefix(&format!("meshlog-demo-{name}-"))
                .tempdir()
                .map_err(|error| format!("a temporary directory: {error}"))?;
            let mut config = NodeConfig::new(dir.path(), "127.0.0.1:0");
            // Fast heartbeats and redials, so the demo heals in moments.
            config.sync.heartbeat = Duration::from_millis(100);
            config.sync.backoff_min = Duration::from_millis(20);
            config.sync.backoff_max = Duration::from_millis(500);
            let node = Node::start(config)
                .await
                .map_err(|error| format!("node {name}: {error}"))?;
            let stream = node.stream();
            let client = Client::new(&format!("http://{}", node.local_addr()))
                .map_err(|error| error.to_string())?;
            nodes.push(DemoNode {
                name,
                stream,
                node,
                client,
                _dir: dir,
            });
        }
        Ok(Mesh { nodes })
    }

    fn a(&self) -> &DemoNode {
        &self.nodes[0]
    }

    fn b(&self) -> &DemoNode {
        &self.nodes[1]
    }

    fn c(&self) -> &DemoNode {
        &self.nodes[2]
    }

    async fn stop(self) {
        for node in &self.nodes {
            node.node.shutdown();
        }
        for node in self.nodes {
            let _ = tokio::time::timeout(WAIT_MAX, node.node.stopped()).await;
        }
    }

    /// Waits until every node in `nodes` holds `events` events and the same
    /// digest.
    async fn converged(&self, nodes: &[&DemoNode], events: u64) -> Result<String, String> {
        let started = Instant::now();
        loop {
            let mut digests = Vec::new();
            for node in nodes {
                let marks = node.client.marks().await.map_err(|e| e.to_string())?;
                digests.push(marks.digest);
            }
            if digests
                .iter()
                .all(|d| d.events == events && *d == digests[0])
            {
                return Ok(digests[0].sum.clone());
            }
            if started.elapsed() > WAIT_MAX {
                return Err(format!(
                    "not converged to {events} events within {WAIT_MAX:?}: {digests:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The demo's narration and its checks' tally.
#[derive(Default)]
struct Story {
    passed: usize,
    failed: Vec<String>,
    step: usize,
}

impl Story {
    fn step(&mut self, title: &str) {
        self.step += 1;
        println!();
        println!("{}. {title}", self.step);
    }

    fn say(&self, line: &str) {
        println!("   {line}");
    }

    fn curl(&self, command: &str) {
        println!("   $ {command}");
    }

    fn check(&mut self, holds: bool, claim: &str) -> bool {
        if holds {
            self.passed += 1;
            println!("   ✓ {claim}");
        } else {
            self.fail(claim);
        }
        holds
    }

    fn fail(&mut self, claim: &str) {
        println!("   ✗ FAILED: {claim}");
        self.failed.push(claim.to_owned());
    }
}

fn curl_post_json(url: &str, path: &str, body: &str) -> String {
    format!("curl -s -X POST {url}{path} -H 'content-type: application/json' -d '{body}'")
}

fn curl_delete_json(url: &str, path: &str, body: &str) -> String {
    format!("curl -s -X DELETE {url}{path} -H 'content-type: application/json' -d '{body}'")
}

fn curl_page(url: &str, after: Option<&str>, limit: usize) -> String {
    match after {
        Some(after) => format!("curl -s '{url}/events?after={after}&limit={limit}'"),
        None => format!("curl -s '{url}/events?limit={limit}'"),
    }
}

fn key(event: &EventJson) -> (String, u64) {
    (event.stream.clone(), event.seq)
}

/// A short list of events: `1:1 2:1 3:1`.
fn names(events: &[EventJson]) -> String {
    events
        .iter()
        .map(|e| format!("{}:{}", e.stream, e.seq))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn page(client: &Client, after: Option<&str>, limit: usize) -> Result<Page, String> {
    match client.page(after, Some(limit)).await {
        Ok(PageOutcome::Page(page)) => Ok(page),
        Ok(PageOutcome::Stale(stale)) => Err(format!(
            "{}: unexpected stale cursor: {}",
            client.url(),
            stale.message
        )),
        Err(error) => Err(error.to_string()),
    }
}

/// The cursor a token stands for, either version (a version-2 token is
/// expanded with its checkpoint, asked of the node that answered it).
async fn vector_of(client: &Client, text: &str) -> Result<VersionVector, String> {
    client
        .cursor(text)
        .await
        .map_err(|error| format!("token {text}: {error}"))
}

fn stream_name(mesh: &Mesh, stream: &str) -> &'static str {
    mesh.nodes
        .iter()
        .find(|node| node.stream.to_string() == stream)
        .map_or("?", |node| node.name)
}

/// What the steps learn and later steps check against.
#[derive(Default)]
struct Walk {
    /// C's events, written while it was cut off.
    late: Vec<AppendedJson>,
    /// Every event the reader was given walking A.
    seen: Vec<EventJson>,
    /// The token of the reader's first page on A.
    first_token: String,
    /// The token the reader's walk of A ended with.
    last_token: String,
    /// The highest lamport stamp the reader was given on A.
    position: u64,
}

impl Walk {
    fn late_lamports(&self) -> Vec<u64> {
        self.late.iter().map(|e| e.lamport).collect()
    }

    fn late_keys(&self) -> BTreeSet<(String, u64)> {
        self.late
            .iter()
            .map(|e| (e.stream.clone(), e.seq))
            .collect()
    }
}

/// The demo: its steps, in order. Each step narrates itself and checks its
/// claims; an `Err` is a step that could not go on.
async fn script(mesh: &Mesh, story: &mut Story) -> Result<(), String> {
    let mut walk = Walk::default();
    introduce(mesh);
    link_all(mesh, story).await?;
    append_everywhere(mesh, story).await?;
    cut_off_c(mesh, story).await?;
    write_apart(mesh, story, &mut walk).await?;
    walk_a(mesh, story, &mut walk).await?;
    heal(mesh, story).await?;
    resume_on_b(mesh, story, &walk).await?;
    compact_b(mesh, story, &walk).await
}

fn client_error(error: ClientError) -> String {
    error.to_string()
}

fn introduce(mesh: &Mesh) {
    println!(
        "meshlog demo: three nodes on loopback, each a durable replica in a temporary directory."
    );
    for node in &mesh.nodes {
        println!(
            "   {}  {}  writes stream {}",
            node.name,
            node.client.url(),
            node.stream
        );
    }
}

async fn link_all(mesh: &Mesh, story: &mut Story) -> Result<(), String> {
    let (a, b) = (mesh.a(), mesh.b());
    story.step("Link every node to the other two: peers by URL, sync over GET /sync.");
    for node in &mesh.nodes {
        for other in &mesh.nodes {
            if other.stream != node.stream {
                node.client
                    .add_peer(other.client.url())
                    .await
                    .map_err(client_error)?;
            }
        }
    }
    story.curl(&curl_post_json(
        a.client.url(),
        "/peers",
        &format!(r#"{{"url":"{}"}}"#, b.client.url()),
    ));
    story.say("(and the same for A→C, B→A, B→C, C→A, C→B)");
    Ok(())
}

async fn append_everywhere(mesh: &Mesh, story: &mut Story) -> Result<(), String> {
    let (a, b, c) = (mesh.a(), mesh.b(), mesh.c());
    story.step("Each node appends 3 events; the mesh converges.");
    for node in &mesh.nodes {
        let payloads: Vec<String> = (1..=3)
            .map(|i| format!("{}{i}", node.name.to_lowercase()))
            .collect();
        node.client.append(&payloads).await.map_err(client_error)?;
    }
    story.curl(&curl_post_json(
        a.client.url(),
        "/events",
        r#"["a1","a2","a3"]"#,
    ));
    let converged = mesh.converged(&[a, b, c], 9).await;
    story.check(
        converged.is_ok(),
        "A, B and C each hold the 9 events, with the same digest",
    );
    converged.map(drop)
}

async fn cut_off_c(mesh: &Mesh, story: &mut Story) -> Result<(), String> {
    let (a, b, c) = (mesh.a(), mesh.b(), mesh.c());
    story.step("Cut C off: C drops its peers, and A and B drop C.");
    for other in [a, b] {
        c.client
            .remove_peer(other.client.url())
            .await
            .map_err(client_error)?;
        other
            .client
            .remove_peer(c.client.url())
            .await
            .map_err(client_error)?;
    }
    story.curl(&curl_delete_json(
        c.client.url(),
        "/peers",
        &format!(r#"{{"url":"{}"}}"#, a.client.url()),
    ));
    story.say("(and C→B, A→C, B→C)");
    let started = Instant::now();
    let mut isolated = false;
    while started.elapsed() < WAIT_MAX {
        let metrics = c.client.metrics().await.map_err(client_error)?;
        if metrics
            .lines()
            .any(|line| line == "meshlog_sync_sessions 0")
        {
            isolated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    story.check(isolated, "C runs no sync session: it is partitioned");
    Ok(())
}

async fn write_apart(mesh: &Mesh, story: &mut Story, walk: &mut Walk) -> Result<(), String> {
    let (a, b, c) = (mesh.a(), mesh.b(), mesh.c());
    story.step("C writes 2 events alone, while A and B keep writing 8.");
    walk.late = c
        .client
        .append(&["c-late-1".to_owned(), "c-late-2".to_owned()])
        .await
        .map_err(client_error)?;
    for round in 1..=2 {
        for node in [a, b] {
            let payloads: Vec<String> = (1..=2)
                .map(|i| format!("{}-more-{}", node.name.to_lowercase(), 2 * round + i - 2))
                .collect();
            node.client.append(&payloads).await.map_err(client_error)?;
        }
    }
    story.say(&format!(
        "C's events are stamped lamport {}, by C's own clock.",
        joined(&walk.late_lamports(), " and ")
    ));
    let converged = mesh.converged(&[a, b], 17).await;
    story.check(converged.is_ok(), "A and B hold the same 17 events");
    converged.map(drop)
}

async fn walk_a(mesh: &Mesh, story: &mut Story, walk: &mut Walk) -> Result<(), String> {
    let a = mesh.a();
    story.step(&format!(
        "A reader walks A, {PAGE_LIMIT} events a page, to its head."
    ));
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let current = page(&a.client, after.as_deref(), PAGE_LIMIT).await?;
        pages += 1;
        if pages <= 2 {
            story.curl(&curl_page(a.client.url(), after.as_deref(), PAGE_LIMIT));
        }
        story.say(&format!(
            "page {pages}: {}  → next {}",
            names(&current.events),
            current.next
        ));
        walk.seen.extend(current.events.iter().cloned());
        if pages == 1 {
            walk.first_token = current.next.clone();
        }
        after = Some(current.next.clone());
        if current.at_head || current.events.is_empty() || pages > 100 {
            break;
        }
    }
    walk.position = walk.seen.iter().map(|e| e.lamport).max().unwrap_or(0);
    walk.last_token = after.unwrap_or_default();
    let position = walk.position;
    story.say(&format!(
        "The reader's position: lamport {position}; its token {} says, per stream, the last seq it was given: {}.",
        walk.last_token,
        vector_text(&vector_map(&vector_of(&a.client, &walk.last_token).await?))
    ));
    story.check(
        walk.late_lamports().iter().all(|&l| l <= position),
        &format!(
            "C's late events (lamport {}) are stamped at or below the reader's position ({position})",
            joined(&walk.late_lamports(), ", ")
        ),
    );
    Ok(())
}

async fn heal(mesh: &Mesh, story: &mut Story) -> Result<(), String> {
    let (a, b, c) = (mesh.a(), mesh.b(), mesh.c());
    story.step("Heal: the four links to and from C are re-added; the mesh converges.");
    for (node, other) in [(c, a), (c, b), (a, c), (b, c)] {
        node.client
            .add_peer(other.client.url())
            .await
            .map_err(client_error)?;
    }
    story.curl(&curl_post_json(
        c.client.url(),
        "/peers",
        &format!(r#"{{"url":"{}"}}"#, a.client.url()),
    ));
    let converged = mesh.converged(&[a, b, c], 19).await;
    story.check(
        converged.is_ok(),
        "A, B and C each hold all 19 events, with the same digest",
    );
    converged.map(drop)
}

async fn resume_on_b(mesh: &Mesh, story: &mut Story, walk: &Walk) -> Result<(), String> {
    let b = mesh.b();
    story.step("The reader resumes on B, a different node, with its last token.");
    let mut resumed: Vec<EventJson> = Vec::new();
    let mut after = walk.last_token.clone();
    for pages in 1..=100 {
        let current = page(&b.client, Some(&after), PAGE_LIMIT).await?;
        if pages == 1 {
            story.curl(&curl_page(b.client.url(), Some(&after), PAGE_LIMIT));
        }
        for event in &current.events {
            story.say(&format!(
                "{}   (from {})",
                event_line(event),
                stream_name(mesh, &event.stream)
            ));
        }
        resumed.extend(current.events.iter().cloned());
        after = current.next.clone();
        if current.at_head || current.events.is_empty() {
            break;
        }
    }
    let late_keys = walk.late_keys();
    let resumed_keys: Vec<(String, u64)> = resumed.iter().map(key).collect();
    story.check(
        resumed_keys.len() == late_keys.len()
            && resumed_keys.iter().cloned().collect::<BTreeSet<_>>() == late_keys,
        "the resumed walk returns exactly C's 2 late events, each once",
    );
    let whole: Vec<(String, u64)> = walk.seen.iter().chain(resumed.iter()).map(key).collect();
    let distinct: BTreeSet<_> = whole.iter().cloned().collect();
    story.check(
        whole.len() == 19 && distinct.len() == 19,
        &format!(
            "the whole walk, A then B, returned {} events, {} distinct, of the mesh's 19",
            whole.len(),
            distinct.len()
        ),
    );
    scalar_misses_late(mesh, story, walk).await
}

/// Part of the resume step: the scalar cursor beside the vector.
async fn scalar_misses_late(mesh: &Mesh, story: &mut Story, walk: &Walk) -> Result<(), String> {
    let (b, position) = (mesh.b(), walk.position);
    story.say("A cursor that is a single stamp would have missed them:");
    story.curl(&format!(
        "curl -s '{}/events?after={position}'",
        b.client.url()
    ));
    let scalar = page(&b.client, Some(&position.to_string()), 100).await?;
    let late_keys = walk.late_keys();
    let scalar_late = scalar
        .events
        .iter()
        .filter(|e| late_keys.contains(&key(e)))
        .count();
    story.check(
        scalar_late == 0,
        &format!(
            "`lamport > {position}` returns {} event(s), none of C's late events",
            scalar.events.len()
        ),
    );
    Ok(())
}

async fn compact_b(mesh: &Mesh, story: &mut Story, walk: &Walk) -> Result<(), String> {
    let b = mesh.b();
    story.step("B compacts, keeping each stream's last 2 events.");
    story.curl(&curl_post_json(
        b.client.url(),
        "/compact",
        r#"{"keep_last":2,"ignore_peers":true}"#,
    ));
    let compacted = b
        .client
        .compact(Some(2), None, true)
        .await
        .map_err(client_error)?;
    story.say(&format!(
        "dropped {} events; B's floor is now {}",
        compacted.dropped,
        vector_text(&compacted.floor)
    ));
    let first_token = &walk.first_token;
    story.say(&format!(
        "A reader still holding the token of page 1 ({first_token}) asks B:"
    ));
    story.curl(&curl_page(b.client.url(), Some(first_token), PAGE_LIMIT));
    match b.client.page(Some(first_token), Some(PAGE_LIMIT)).await {
        Ok(PageOutcome::Stale(stale)) => {
            story.say("410 stale_cursor:");
            for line in stale_lines(&stale) {
                story.say(&format!("  {line}"));
            }
            let cursor = vector_of(&b.client, first_token).await?;
            check_stale_is_exact(story, &stale, &cursor, &compacted)?;
            check_nothing_skipped(b, story, &stale, &cursor).await?;
        }
        Ok(PageOutcome::Page(page)) => {
            story.fail(&format!(
                "the page-1 token is stale on B after compaction (B answered a page of {} events)",
                page.events.len()
            ));
        }
        Err(error) => story.fail(&format!("the stale page: {error}")),
    }
    Ok(())
}

/// Part of the compaction step: the stale answer names exactly what was
/// lost, stream by stream, between the token and B's floor.
fn check_stale_is_exact(
    story: &mut Story,
    stale: &Stale,
    cursor: &VersionVector,
    compacted: &CompactedJson,
) -> Result<(), String> {
    let mut floor = VersionVector::new();
    for (stream, seq) in &compacted.floor {
        let stream = stream.parse::<u64>().map_err(|e| e.to_string())?;
        floor.advance(StreamId::new(stream), *seq);
    }
    let exact = stale.lost.iter().all(|range| {
        let stream = StreamId::new(range.stream.parse().unwrap_or(0));
        range.first == cursor.get(stream) + 1 && range.last == floor.get(stream)
    }) && stale.lost.len()
        == floor
            .iter()
            .filter(|(s, seq)| cursor.get(*s) < *seq)
            .count();
    story.check(
        exact,
        "it names every stream below the floor and exactly the seqs lost: after the token, up to the floor",
    );
    Ok(())
}

/// Part of the compaction step: resuming from the offered token returns
/// everything still held that the token did not cover, so seen + lost +
/// rest is the whole mesh.
async fn check_nothing_skipped(
    b: &DemoNode,
    story: &mut Story,
    stale: &Stale,
    cursor: &VersionVector,
) -> Result<(), String> {
    let mut rest = 0usize;
    let mut after = stale.resume.clone();
    for _ in 0..100 {
        let current = page(&b.client, Some(&after), 100).await?;
        rest += current.events.len();
        after = current.next.clone();
        if current.at_head || current.events.is_empty() {
            break;
        }
    }
    let covered = cursor.total() as u64;
    story.say(&format!(
        "resuming from {} returns the {rest} events B still holds past it",
        stale.resume
    ));
    story.check(
        covered + stale.lost_count() + rest as u64 == 19,
        &format!(
            "seen before ({covered}) + reported lost ({}) + returned after resume ({rest}) = all 19 events: nothing skipped silently",
            stale.lost_count()
        ),
    );
    Ok(())
}

/// Numbers joined by `separator`: `10 and 11`.
fn joined(numbers: &[u64], separator: &str) -> String {
    numbers
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(separator)
}

fn vector_map(vector: &VersionVector) -> std::collections::BTreeMap<String, u64> {
    vector
        .iter()
        .map(|(stream, seq)| (stream.get().to_string(), seq))
        .collect()
}
