//! The trust configuration's commands (`meshlog key`, `docs/OPERATIONS.md`,
//! "Writer keys and trust"), end to end: what they print is what a node
//! takes.
//!
//! The built binary makes an admin key (`key new-admin`, 0600), shows two
//! writers' keys (`key show`: a new directory's and a legacy one's), admits
//! them (`key admit`) and binds the legacy stream to its key (`key bind`).
//! A node started from a `--config` file made of those printed lines
//! verbatim (and one admission given by `--admission`), closed and
//! requiring seals, dials both writers and a stranger over real sync
//! sessions: it takes both admitted writers' events (the legacy one sealed
//! under the binding) and none of the stranger's. Also: each command
//! refuses what it must (an admin key file others can read, a file that
//! exists, a key where KEY@STREAM is due), exit code 1 and the reason.
//!
//! Nodes are real `Node::start`s; waits poll with a deadline
//! (`support::wait_until`); nothing is timed.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use clap::Parser;
use meshlog_node::config::NodeConfig;
use meshlog_node::{Cli, Node};
use meshlog_replica::WriterKey;
use support::{append, marks, wait_until};

fn meshlog(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_meshlog"))
        .args(args)
        .env_remove("MESHLOG_DATA")
        .output()
        .expect("the meshlog binary runs")
}

/// The one line a command printed on stdout (it must succeed).
fn printed(args: &[&str]) -> String {
    let output = meshlog(args);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "meshlog {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "one line: {stdout:?}");
    stdout.trim_end().to_owned()
}

/// The quoted value of a printed TOML line (`name = ["VALUE"]  # …`).
fn value(line: &str) -> String {
    line.split('"').nth(1).expect("a quoted value").to_owned()
}

/// A `meshlog serve` command line resolved as the binary resolves it.
fn serve_config(dir: &Path, extra: &[&str]) -> NodeConfig {
    let mut argv = vec!["meshlog", "serve", "--listen", "127.0.0.1:0", "--data"];
    argv.push(dir.to_str().unwrap());
    argv.extend_from_slice(extra);
    let cli = Cli::try_parse_from(argv).expect("the command line parses");
    let meshlog_node::Command::Serve(args) = cli.command else {
        panic!("not serve");
    };
    let mut config = NodeConfig::from_args(*args).expect("the trust configuration is taken");
    config.sync.heartbeat = std::time::Duration::from_millis(50);
    config.sync.backoff_min = std::time::Duration::from_millis(20);
    config.sync.backoff_max = std::time::Duration::from_millis(400);
    config
}

async fn stop(node: Node) {
    node.shutdown();
    node.stopped().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_configured_with_the_printed_lines_admits_those_writers_and_no_other() {
    let scratch = tempfile::tempdir().unwrap();
    let path = |name: &str| scratch.path().join(name);
    let admin_file = path("admin.key");
    let admin = path("admin.key").to_str().unwrap().to_owned();
    let admin_key = printed(&["key", "new-admin", "--out", &admin]);
    assert!(admin_key.starts_with("admin_key = \""), "{admin_key}");
    let mode = std::fs::metadata(&admin_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "mode {mode:04o}");

    // A new writer: `key show` prints the writers entry of the key it
    // created on its first start.
    let writer_dir = path("writer");
    let writer = Node::start(serve_config(&writer_dir, &[])).await.unwrap();
    let shown = printed(&["key", "show", "--data-dir", writer_dir.to_str().unwrap()]);
    assert_eq!(value(&shown), writer.writer_key().to_string(), "{shown}");
    assert!(
        shown.contains(&format!("stream {}", writer.stream())),
        "{shown}"
    );
    let admitted = printed(&["key", "admit", "--admin", &admin, &value(&shown)]);
    assert!(admitted.starts_with("admissions = [\""), "{admitted}");

    // A legacy writer: `key show` prints KEY@STREAM, which `key bind`
    // signs; its own node seals under the binding.
    let legacy_dir = path("legacy");
    std::fs::create_dir_all(&legacy_dir).unwrap();
    let legacy_key = WriterKey::from_bytes([31; 32]);
    let key_file = legacy_dir.join("writer.key");
    std::fs::write(&key_file, legacy_key.to_bytes()).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    support::legacy_dir(&legacy_dir, 4545);
    let legacy_shown = printed(&["key", "show", "--data-dir", legacy_dir.to_str().unwrap()]);
    assert_eq!(
        value(&legacy_shown),
        format!("{}@4545", legacy_key.public()),
        "{legacy_shown}"
    );
    let bound = printed(&["key", "bind", "--admin", &admin, &value(&legacy_shown)]);
    assert!(bound.starts_with("bindings = [\""), "{bound}");
    let legacy_admitted = printed(&[
        "key",
        "admit",
        "--admin",
        &admin,
        &legacy_key.public().to_string(),
    ]);
    let legacy_config = path("legacy.toml");
    std::fs::write(&legacy_config, format!("{admin_key}\n{bound}\n")).unwrap();
    let legacy = Node::start(serve_config(
        &legacy_dir,
        &["--config", legacy_config.to_str().unwrap()],
    ))
    .await
    .unwrap();
    assert_eq!((legacy.stream(), legacy.sealed()), (4545, true));

    // A stranger no command admitted.
    let stranger = Node::start(serve_config(&path("stranger"), &[]))
        .await
        .unwrap();
    for node in [&writer, &legacy, &stranger] {
        append(node.local_addr(), b"before").await;
    }

    // The closed node: the printed lines verbatim in its file, the
    // legacy writer's admission by flag (flags join the file).
    let closed_config = path("closed.toml");
    std::fs::write(
        &closed_config,
        format!("{admin_key}\n{admitted}\n{bound}\n"),
    )
    .unwrap();
    let legacy_admission = value(&legacy_admitted);
    let mut config = serve_config(
        &path("closed"),
        &[
            "--config",
            closed_config.to_str().unwrap(),
            "--admission",
            &legacy_admission,
            "--require-seals",
        ],
    );
    assert_eq!(config.require_seals, Some(true));
    config.peers = [&writer, &legacy, &stranger]
        .iter()
        .map(|node| format!("http://{}", node.local_addr()))
        .collect();
    let closed = Node::start(config).await.unwrap();
    let addr = closed.local_addr();
    let (w, l) = (writer.stream().to_string(), legacy.stream().to_string());
    wait_until("both admitted writers' events", || async {
        let answer = marks(addr).await;
        answer["marks"][&w] == 1 && answer["marks"][&l] == 1
    })
    .await;
    for node in [&writer, &legacy, &stranger] {
        append(node.local_addr(), b"after").await;
    }
    wait_until("both admitted writers' later events", || async {
        let answer = marks(addr).await;
        answer["marks"][&w] == 2 && answer["marks"][&l] == 2
    })
    .await;
    let answer = marks(addr).await;
    assert!(
        answer["marks"].get(stranger.stream().to_string()).is_none(),
        "the stranger's events were taken: {answer}"
    );
    for node in [closed, writer, legacy, stranger] {
        stop(node).await;
    }
}

#[test]
fn the_key_commands_refuse_what_they_must_with_the_reason() {
    let scratch = tempfile::tempdir().unwrap();
    let admin = scratch.path().join("admin.key");
    let admin = admin.to_str().unwrap();
    printed(&["key", "new-admin", "--out", admin]);
    let refused = |args: &[&str], says: &str| {
        let output = meshlog(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    refused(&["key", "new-admin", "--out", admin], "the file exists");
    let key = WriterKey::from_bytes([32; 32]).public().to_string();
    refused(&["key", "bind", "--admin", admin, &key], "KEY@STREAM");
    refused(&["key", "admit", "--admin", admin, "nothex"], "not hex");
    refused(
        &[
            "key",
            "show",
            "--data-dir",
            scratch.path().to_str().unwrap(),
        ],
        "first start",
    );
    std::fs::set_permissions(admin, std::fs::Permissions::from_mode(0o644)).unwrap();
    refused(&["key", "admit", "--admin", admin, &key], "chmod 600");
}
