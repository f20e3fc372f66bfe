//! `meshlog events --follow`: the `meshlog` binary follows a node live and
//! prints each event once as it is committed; Ctrl-C prints the cursor
//! (`next: TOKEN`) that covers exactly what it printed; a stale `--after`
//! ends it as a stale page does (exit 3, what was lost, the resume token).

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::{append, get, post_json, start, DEADLINE};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

fn meshlog() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_meshlog"));
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_prints_each_event_as_committed_and_the_cursor_on_ctrl_c() {
    let node = start(7).await;
    append(node.addr, b"before").await;
    let mut child = meshlog()
        .args(["events", "--follow", "--node", &node.url()])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next_line = async || {
        tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .expect("a line within the deadline")
            .unwrap()
            .expect("stdout open")
    };
    assert_eq!(next_line().await, "7:1  lamport 1  before");
    for i in 0..3 {
        append(node.addr, format!("live {i}").as_bytes()).await;
        let line = next_line().await;
        assert_eq!(line, format!("7:{}  lamport {}  live {i}", i + 2, i + 2));
    }
    // Ctrl-C: the cursor to resume from, which covers the four events.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let last = next_line().await;
    let token = last.strip_prefix("next: ").expect("next: TOKEN last");
    assert_eq!(token, get(node.addr, "/marks").await.json()["token"]);
    assert!(child.wait().await.unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_from_a_stale_token_exits_3_with_what_was_lost() {
    let node = start(8).await;
    append(node.addr, b"one").await;
    let old = get(node.addr, "/marks").await.json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    for i in 0..4 {
        append(node.addr, format!("more {i}").as_bytes()).await;
    }
    let compacted = post_json(node.addr, "/compact", &serde_json::json!({"keep_last": 1})).await;
    assert_eq!(compacted.status, 200);
    let output = tokio::time::timeout(
        DEADLINE,
        meshlog()
            .args(["events", "--follow", "--node", &node.url(), "--after", &old])
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("lost: stream 8 seq 2..=4"), "{stdout}");
    assert!(stdout.contains("resume: "), "{stdout}");
}

/// Issue 27: `--after` takes a version-2 token from another node. A's
/// head token names a checkpoint C (its peer, gossip off) does not keep;
/// `meshlog events --follow --after TOKEN` at C expands it with the
/// checkpoint C fetches from A (`GET /checkpoint`) and prints only what
/// is appended after. Before, it refused the token ("bad --after token").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_after_a_version_2_token_of_another_node() {
    let a_dir = tempfile::tempdir().unwrap();
    support::checkpointed_dir(a_dir.path());
    let a = support::node_in(a_dir, 1, vec![], 10_000).await;
    let c = support::node_in(tempfile::tempdir().unwrap(), 3, vec![a.url()], 10_000).await;
    support::wait_until("c holds a's events", || async {
        support::marks(c.addr).await["marks"] == support::marks(a.addr).await["marks"]
    })
    .await;
    let head = get(a.addr, "/events?limit=1000").await.json();
    let token = head["next"].as_str().unwrap().to_owned();
    let mut child = meshlog()
        .args(["events", "--follow", "--node", &c.url(), "--after", &token])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    append(c.addr, b"after the token").await;
    let line = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .expect("a line within the deadline")
        .unwrap()
        .expect("stdout open");
    assert!(line.starts_with("3:1  lamport "), "{line}");
    assert!(line.ends_with("  after the token"), "{line}");
    child.kill().await.unwrap();
}
