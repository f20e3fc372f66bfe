//! The `meshlog` CLI against a real in-process node, run as the built
//! binary: appends from arguments and stdin, walks with `--all` and
//! `--json`, the one-token-everywhere rule (a token the CLI prints is
//! accepted over HTTP and the other way round, and both spell the same
//! position the same way), a stale cursor reported with its exact loss and
//! exit code 3, a token too long for a URL sent in a query body, peers, and
//! errors that name the node and what it answered.

mod cli_support;
mod support;

use cli_support::cli;
use meshlog_cursor::{token, StreamId, VersionVector};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_takes_arguments_or_stdin_lines_as_one_batch() {
    let node = start(5).await;
    let url = node.url();
    let run = cli(&["append", "--node", &url, "one", "two", "three"], "").await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout.trim(),
        "appended 3 event(s) to stream 5: seq 1..=3, lamport 1..=3"
    );
    let run = cli(
        &["append", "--node", &url, "--stdin", "--json"],
        "four\nfive\n",
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines = run.json_lines();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["seq"], 5);
    let payloads: Vec<String> = walk(node.addr, 100)
        .await
        .iter()
        .map(|e| e["payload"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(payloads, ["one", "two", "three", "four", "five"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_printed_by_the_cli_is_accepted_over_http_and_the_other_way_round() {
    let node = start(7).await;
    let url = node.url();
    for i in 0..10 {
        append(node.addr, format!("event {i}").as_bytes()).await;
    }
    // CLI first page, then HTTP from its token.
    let run = cli(&["events", "--node", &url, "--limit", "4"], "").await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stdout.lines().count(), 5, "{}", run.stdout);
    assert!(run.stdout.starts_with("7:1  lamport 1  event 0\n"));
    let cli_token = run.next();
    let page = get(node.addr, &format!("/events?after={cli_token}&limit=100"))
        .await
        .json();
    let seqs: Vec<u64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (5..=10).collect::<Vec<_>>());

    // HTTP first page, then the CLI from its token, to the head.
    let first = get(node.addr, "/events?limit=6").await.json();
    let http_token = first["next"].as_str().unwrap();
    let run = cli(
        &[
            "events", "--node", &url, "--after", http_token, "--all", "--json",
        ],
        "",
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines = run.json_lines();
    let events = &lines[..lines.len() - 1];
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [7, 8, 9, 10]);
    assert_eq!(events[0]["stream"], "7");
    assert_eq!(events[0]["payload"], "event 6");
    let last = &lines[lines.len() - 1];
    assert_eq!(last["at_head"], true);
    // Tokens are canonical: the CLI's position at the head is spelled as
    // the node's own marks token.
    assert_eq!(last["next"], marks(node.addr).await["token"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_all_walks_every_page_and_prints_the_head_token() {
    let node = start(3).await;
    let url = node.url();
    let payloads: Vec<String> = (0..25).map(|i| format!("p{i}")).collect();
    let mut args = vec!["append", "--node", url.as_str()];
    args.extend(payloads.iter().map(String::as_str));
    assert_eq!(cli(&args, "").await.code, Some(0));
    let run = cli(&["events", "--node", &url, "--all", "--limit", "4"], "").await;
    assert_eq!(run.code, Some(0), "{run:?}");
    // 25 events, then `next:`; no progress bar when stdout is a pipe.
    assert_eq!(run.stdout.lines().count(), 26);
    assert_eq!(run.next(), marks(node.addr).await["token"]);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_cursor_prints_what_was_lost_and_the_resume_token_and_exits_3() {
    let node = start(9).await;
    let url = node.url();
    for i in 0..10 {
        append(node.addr, format!("event {i}").as_bytes()).await;
    }
    let first = cli(&["events", "--node", &url, "--limit", "2"], "").await;
    let held = first.next();
    let run = cli(&["compact", "--node", &url, "--keep-last", "3"], "").await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout.trim(),
        "dropped 7 event(s) on 1 stream(s); floor: 9:7"
    );

    let run = cli(&["events", "--node", &url, "--after", &held], "").await;
    assert_eq!(run.code, Some(3), "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines[..2],
        [
            "stale cursor: 5 event(s) were compacted away before this reader saw them",
            "lost: stream 9 seq 3..=7 (5 event(s))",
        ]
    );
    let resume = lines[2].strip_prefix("resume: ").expect("a resume line");
    let mut expected = VersionVector::new();
    expected.advance(StreamId::new(9), 7);
    assert_eq!(resume, token::encode_text(&expected).unwrap());
    // The same answer as JSON, for scripts.
    let run = cli(&["events", "--node", &url, "--after", &held, "--json"], "").await;
    assert_eq!(run.code, Some(3));
    let answer = &run.json_lines()[0];
    assert_eq!(answer["error"], "stale_cursor");
    assert_eq!(answer["lost"][0]["first"], 3);
    assert_eq!(answer["resume"], resume);
    // Accepting the gap: the three events still held, each once.
    let run = cli(&["events", "--node", &url, "--after", resume, "--all"], "").await;
    assert_eq!(run.code, Some(0));
    assert_eq!(run.stdout.lines().count(), 4, "{}", run.stdout);
    assert!(run.stdout.starts_with("9:8  lamport 8  event 7\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_too_long_for_a_url_is_sent_in_a_query_body() {
    let node = start(11).await;
    append(node.addr, b"only").await;
    // 3,000 streams the node has never heard of, with spread-out ids: a
    // future cursor, which the node serves (`behind`) rather than refusing.
    let mut vector = VersionVector::new();
    for i in 1..=3_000u64 {
        vector.advance(StreamId::new(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)), 1);
    }
    let long = token::encode_text(&vector).unwrap();
    assert!(long.len() > 2 * meshlog_node::cli::client::TOKEN_QUERY_MAX);
    let run = cli(
        &["events", "--node", &node.url(), "--after", &long, "--json"],
        "",
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines = run.json_lines();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["payload"], "only");
    assert_eq!(lines[1]["behind"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_are_added_listed_and_removed() {
    let a = start(1).await;
    let b = start(2).await;
    let (ua, ub) = (a.url(), b.url());
    let run = cli(&["peers", "add", &ub, "--node", &ua], "").await;
    assert_eq!(
        (run.code, run.stdout.trim()),
        (Some(0), &*format!("added peer {ub}"))
    );
    wait_until("a is connected to b", || async {
        let run = cli(&["peers", "--node", &ua, "list"], "").await;
        run.stdout.contains(&format!("{ub}  connected, stream 2"))
    })
    .await;
    // b lists a's session under inbound, a lists none there.
    wait_until("b lists a's inbound session", || async {
        let run = cli(&["peers", "--node", &ub, "list"], "").await;
        run.stdout.contains("peers:  none")
            && run.stdout.contains("inbound:\n  from 127.0.0.1:")
            && run.stdout.contains("  connected, stream 1, lag 0 event(s)")
    })
    .await;
    let run = cli(&["peers", "--node", &ua, "list"], "").await;
    assert!(run.stdout.contains("inbound: none"), "{}", run.stdout);
    let run = cli(&["marks", "--node", &ua], "").await;
    assert!(run.stdout.contains("(stream 1)"), "{}", run.stdout);
    assert!(
        run.stdout
            .lines()
            .any(|line| line.starts_with("chains: ") && line.len() == 8 + 64),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!("  {ub}  connected")),
        "{}",
        run.stdout
    );
    let run = cli(&["peers", "remove", &ub, "--node", &ua], "").await;
    assert_eq!(run.code, Some(0));
    let run = cli(&["peers", "remove", &ub, "--node", &ua], "").await;
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr.contains("404 unknown_peer"),
        "the node's error code is shown: {}",
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_node_and_what_it_answered() {
    // Nothing listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = format!("http://127.0.0.1:{port}");
    let run = cli(&["marks", "--node", &nowhere], "").await;
    assert_eq!(run.code, Some(1));
    assert!(
        run.stderr
            .contains(&format!("cannot reach the node at {nowhere}")),
        "{}",
        run.stderr
    );

    let node = start(4).await;
    let url = node.url();
    let run = cli(&["events", "--node", &url, "--after", "AQC-I8JZ"], "").await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("400 bad_token"), "{}", run.stderr);
    let run = cli(&["events", "--node", &url, "--limit", "0"], "").await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("400 bad_limit"), "{}", run.stderr);
    let run = cli(&["marks", "--node", "127.0.0.1:7070"], "").await;
    assert_eq!(run.code, Some(1));
    assert!(run.stderr.contains("bad node URL"), "{}", run.stderr);
    // MESHLOG_NODE is read when --node is absent.
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_meshlog"))
        .args(["marks", "--json"])
        .env("MESHLOG_NODE", &url)
        .output()
        .await
        .unwrap();
    assert!(run.status.success());
    assert!(String::from_utf8_lossy(&run.stdout).contains(r#""stream":"4""#));
}

/// A stand-in node that answers every request with one empty page and
/// reports each request's first line.
async fn recording_node() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (lines, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 65536];
                // Read the head and any body (the CLI sends content-length).
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request);
                    let Some(end) = text.find("\r\n\r\n") else {
                        if n == 0 {
                            return;
                        }
                        continue;
                    };
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length || n == 0 {
                        break;
                    }
                }
                let text = String::from_utf8_lossy(&request);
                let _ = lines.send(text.lines().next().unwrap_or("").to_owned());
                let body = r#"{"events":[],"next":"AQC-I8JY","at_head":true,"behind":false}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (url, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_token_goes_in_the_url_and_a_long_one_in_a_post_body() {
    let (url, mut requests) = recording_node().await;
    let run = cli(
        &[
            "events", "--node", &url, "--after", "AQC-I8JY", "--limit", "5",
        ],
        "",
    )
    .await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        requests.recv().await.unwrap(),
        "GET /events?after=AQC-I8JY&limit=5 HTTP/1.1"
    );
    let mut vector = VersionVector::new();
    for i in 1..=1_000u64 {
        vector.advance(StreamId::new(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)), 1);
    }
    let long = token::encode_text(&vector).unwrap();
    assert!(long.len() > meshlog_node::cli::client::TOKEN_QUERY_MAX);
    let run = cli(&["events", "--node", &url, "--after", &long], "").await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        requests.recv().await.unwrap(),
        "POST /events/query HTTP/1.1"
    );
}
