//! The mesh admin compacts a writer's stream (issue 29, `docs/SIGNING.md`,
//! "Floors with an authority"; `docs/HTTP.md`, "Compaction statements"):
//! a node configured with `--admin-key` trusts the admin's compaction
//! statements, and `meshlog key compact` signs one (the chain hash asked
//! of the nodes, the key kept on the operator's machine) and submits it.
//!
//! Three real nodes: a third writer W (its own key-derived stream), T
//! configured as `meshlog serve --admin-key HEX` resolves it, and U with no
//! admin key; both take W's events over sync. The built binary compacts
//! W's stream to seq 5 on T and U: T erases W's events 1..=5 (a reader
//! from the start is told exactly that range is lost, the events above
//! stay); U refuses it (`422 statement_refused`, reason `no_authority`,
//! counted in `meshlog_deltas_refused_total`) and keeps every event. A
//! statement signed by another key than the admin's is refused by T the
//! same way; so are bytes that are no statement, a statement of a node's
//! own stream, and a hash asked where the node cannot know it.
//!
//! Before `trust_admin` was wired (`node/src/trust.rs`), T refused the
//! admin's statement as U does. Waits poll with a deadline
//! (`support::wait_until`); nothing is timed.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use clap::Parser;
use meshlog_node::config::NodeConfig;
use meshlog_node::{Cli, Node};
use serde_json::json;
use support::{append, get, marks, post_json, wait_until};

fn meshlog(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshlog"))
        .args(args)
        .env_remove("MESHLOG_NODE")
        .env_remove("MESHLOG_TOKEN")
        .output()
        .expect("the meshlog binary runs")
}

/// A `meshlog serve` command line resolved as the binary resolves it,
/// with fast sync timings.
fn serve_config(dir: &Path, extra: &[&str]) -> NodeConfig {
    let mut argv = vec!["meshlog", "serve", "--listen", "127.0.0.1:0", "--data"];
    argv.push(dir.to_str().unwrap());
    argv.extend_from_slice(extra);
    let cli = Cli::try_parse_from(argv).expect("the command line parses");
    let meshlog_node::Command::Serve(args) = cli.command else {
        panic!("not serve");
    };
    let mut config = NodeConfig::from_args(*args).expect("the configuration is taken");
    config.sync.heartbeat = std::time::Duration::from_millis(50);
    config.sync.backoff_min = std::time::Duration::from_millis(20);
    config.sync.backoff_max = std::time::Duration::from_millis(400);
    config
}

/// A new admin key file; its public key, hex.
fn new_admin(path: &Path) -> String {
    let output = meshlog(&["key", "new-admin", "--out", path.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8(output.stdout).unwrap();
    line.split('"')
        .nth(1)
        .expect("admin_key = \"HEX\"")
        .to_owned()
}

/// `meshlog key compact` of `stream` to `floor` on `nodes`: exit code,
/// stdout, stderr.
fn key_compact(admin: &Path, stream: u64, floor: u64, nodes: &[&Node]) -> (i32, String, String) {
    let (stream, floor) = (stream.to_string(), floor.to_string());
    let mut args = vec![
        "key",
        "compact",
        "--admin",
        admin.to_str().unwrap(),
        "--stream",
        &stream,
        "--floor",
        &floor,
    ];
    let urls: Vec<String> = nodes
        .iter()
        .map(|node| format!("http://{}", node.local_addr()))
        .collect();
    for url in &urls {
        args.extend(["--node", url.as_str()]);
    }
    let output = meshlog(&args);
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

/// The lost ranges a walk from the start of `node`'s log is told of
/// (`410 stale_cursor`), as `(stream, first, last)`; none if it pages.
async fn lost_from_start(node: &Node) -> Vec<(String, u64, u64)> {
    let response = get(node.local_addr(), "/events?limit=100").await;
    if response.status == 200 {
        return Vec::new();
    }
    assert_eq!(response.status, 410, "{:?}", response.json());
    let body = response.json();
    body["lost"]
        .as_array()
        .unwrap()
        .iter()
        .map(|range| {
            (
                range["stream"].as_str().unwrap().to_owned(),
                range["first"].as_u64().unwrap(),
                range["last"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn deltas_refused(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("meshlog_deltas_refused_total "))
        .and_then(|value| value.trim().parse().ok())
        .expect("the deltas_refused counter")
}

async fn stop(node: Node) {
    node.shutdown();
    node.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_statement_erases_a_writers_stream_only_where_the_admin_key_is_trusted() {
    let scratch = tempfile::tempdir().unwrap();
    let path = |name: &str| scratch.path().join(name);
    let admin_file = path("admin.key");
    let admin_hex = new_admin(&admin_file);

    let writer = Node::start(serve_config(&path("writer"), &[]))
        .await
        .unwrap();
    for i in 0..8 {
        append(writer.local_addr(), format!("w{i}").as_bytes()).await;
    }
    let writer_url = format!("http://{}", writer.local_addr());
    let mut trusting = serve_config(&path("trusting"), &["--admin-key", &admin_hex]);
    assert!(trusting.trust.is_open(), "an admin key alone admits nobody");
    trusting.peers = vec![writer_url.clone()];
    let trusting = Node::start(trusting).await.unwrap();
    let mut untrusting = serve_config(&path("untrusting"), &[]);
    untrusting.peers = vec![writer_url];
    let untrusting = Node::start(untrusting).await.unwrap();
    let w = writer.stream().to_string();
    for node in [&trusting, &untrusting] {
        let addr = node.local_addr();
        wait_until("the writer's 8 events", || async {
            marks(addr).await["marks"][&w] == 8
        })
        .await;
    }

    // The admin compacts W's stream to seq 5 on both nodes.
    let (code, stdout, stderr) =
        key_compact(&admin_file, writer.stream(), 5, &[&trusting, &untrusting]);
    assert_eq!(code, 1, "one node refused: {stdout} {stderr}");
    let trusting_url = format!("http://{}", trusting.local_addr());
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with(&trusting_url) && stdout.contains(&format!("stream {w} compacted")),
        "{stdout}"
    );
    assert!(
        stderr.contains("422 statement_refused") && stderr.contains("neither this stream's writer"),
        "{stderr}"
    );

    // T erased 1..=5 and kept 6..=8; a reader from the start is told so.
    let answer = marks(trusting.local_addr()).await;
    assert_eq!(answer["floor"][&w], 5, "{answer}");
    assert_eq!(answer["marks"][&w], 8, "{answer}");
    assert_eq!(lost_from_start(&trusting).await, vec![(w.clone(), 1, 5)]);
    // U kept everything, and counted the refusal.
    let answer = marks(untrusting.local_addr()).await;
    assert!(answer["floor"].get(&w).is_none(), "{answer}");
    assert!(lost_from_start(&untrusting).await.is_empty());
    let metrics = get(untrusting.local_addr(), "/metrics").await;
    assert_eq!(deltas_refused(&String::from_utf8(metrics.body).unwrap()), 1);

    // A statement signed by another key than the admin's: refused by T,
    // naming why, and nothing erased.
    let other_admin = path("other-admin.key");
    new_admin(&other_admin);
    let (code, stdout, stderr) = key_compact(&other_admin, writer.stream(), 7, &[&trusting]);
    assert_eq!(code, 1, "{stdout} {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("statement_refused"), "{stderr}");
    assert_eq!(marks(trusting.local_addr()).await["floor"][&w], 5);

    refusals(&trusting, &writer, &admin_file).await;
    for node in [trusting, untrusting, writer] {
        stop(node).await;
    }
}

/// What `/compaction` refuses, each with its code and reason.
async fn refusals(trusting: &Node, writer: &Node, admin_file: &Path) {
    let addr = trusting.local_addr();
    let w = writer.stream();
    // A hash above the head, or below the floor: 409 hash_unknown.
    for (floor, says) in [(9, "up to seq 8 only"), (4, "compacted stream")] {
        let answer = get(addr, &format!("/compaction?stream={w}&floor={floor}")).await;
        assert_eq!(answer.status, 409, "{:?}", answer.json());
        assert_eq!(answer.error(), "hash_unknown");
        assert!(answer.json()["message"].as_str().unwrap().contains(says));
    }
    let answer = get(addr, &format!("/compaction?stream={w}&floor=7")).await;
    assert_eq!(answer.status, 200, "{:?}", answer.json());
    assert_eq!(answer.json()["hash"].as_str().unwrap().len(), 64);
    // Bytes that are no statement: 400 bad_statement.
    let answer = post_json(addr, "/compaction", &json!({"statement": "00ff"})).await;
    assert_eq!(
        (answer.status, answer.error()),
        (400, "bad_statement".into())
    );
    // The admin's statement of the node's own stream: 422 own_stream.
    let own = trusting.stream();
    append(addr, b"own").await;
    let admin = meshlog_node::writer_key::load_admin(admin_file).unwrap();
    let signed = meshlog_replica::Compaction {
        stream: meshlog_cursor::StreamId::new(own),
        floor: 1,
        hash: meshlog_replica::ChainHash::from_bytes([0; 32]),
    }
    .sign_by_admin(&admin);
    let hex = meshlog_node::trust::encode_hex(&signed.to_bytes());
    let answer = post_json(addr, "/compaction", &json!({ "statement": hex })).await;
    assert_eq!(answer.status, 422, "{:?}", answer.json());
    assert_eq!(answer.json()["reason"], "own_stream");
    // The admin's statement over another history than the node's.
    let forged = meshlog_replica::Compaction {
        stream: meshlog_cursor::StreamId::new(w),
        floor: 7,
        hash: meshlog_replica::ChainHash::from_bytes([7; 32]),
    }
    .sign_by_admin(&admin);
    let hex = meshlog_node::trust::encode_hex(&forged.to_bytes());
    let answer = post_json(addr, "/compaction", &json!({ "statement": hex })).await;
    assert_eq!(answer.status, 422, "{:?}", answer.json());
    assert_eq!(answer.json()["reason"], "hash_mismatch");
    assert_eq!(marks(addr).await["floor"][w.to_string()], 5);
}
