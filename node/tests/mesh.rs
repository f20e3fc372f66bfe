//! Nodes syncing over `GET /sync` upgrades on their one HTTP port: three
//! nodes in a chain converge (same digest, third-party events relayed);
//! two nodes that raise the frame limit sync an event above 4 MiB;
//! a peer added at run time syncs and one removed stops; and the `meshlog`
//! binary exits 0 on SIGTERM with appends in flight, and a restart on the
//! same data directory holds every acknowledged append.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::*;

async fn digest(addr: std::net::SocketAddr) -> Value {
    marks(addr).await["digest"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_in_a_chain_converge_over_the_upgrade() {
    let c = start(3).await;
    let b = start_with(2, |config| config.peers = vec![c.url()]).await;
    let a = start_with(1, |config| config.peers = vec![b.url()]).await;
    for i in 0..20u32 {
        let node = [&a, &b, &c][i as usize % 3];
        append(node.addr, format!("event {i}").as_bytes()).await;
    }
    wait_until("a, b and c hold the same events", || async {
        let (da, db, dc) = (
            digest(a.addr).await,
            digest(b.addr).await,
            digest(c.addr).await,
        );
        da["events"] == 20 && da == db && db == dc
    })
    .await;
    // A walk on a sees every writer's events; c's came through b.
    let events = walk(a.addr, 7).await;
    assert_eq!(events.len(), 20);
    let expected_marks = json!({"1": 7, "2": 7, "3": 6});
    for node in [&a, &b, &c] {
        assert_eq!(marks(node.addr).await["marks"], expected_marks);
    }
    // a's peer list shows b connected, with its stream and acknowledged marks.
    wait_until("a sees b's acknowledgement", || async {
        let peers = get(a.addr, "/peers").await.json();
        let peer = &peers["peers"][0];
        peer["connected"] == true && peer["marks"] == expected_marks && peer["lag_events"] == 0
    })
    .await;
    let peers = get(a.addr, "/peers").await.json();
    assert_eq!(peers["peers"][0]["url"], b.url());
    assert_eq!(peers["peers"][0]["stream"], "2");
    assert_eq!(peers["peers"][0]["last_error"], Value::Null);
    // A token from a walk on a resumes on c.
    let first = get(a.addr, "/events?limit=5").await.json();
    let rest = walk_from(c.addr, first["next"].as_str().unwrap()).await;
    assert_eq!(rest.len(), 15);

    let metrics = String::from_utf8(get(a.addr, "/metrics").await.body).unwrap();
    assert!(
        metrics.lines().any(|l| l == "meshlog_peers_connected 1"),
        "{metrics}"
    );
    // Per peer too (found by the CLI work: the family was never registered).
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("meshlog_peer_connected{peer=\"http://") && l.ends_with(" 1")),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("meshlog_peer_lag_events{peer=")),
        "{metrics}"
    );
    for node in [a, b, c] {
        node.node.shutdown();
        tokio::time::timeout(DEADLINE, node.node.stopped())
            .await
            .unwrap();
    }
}

/// A node's `frame_bytes_max` reaches its sync sessions: two nodes that
/// both raise it (and `payload_bytes_max`) sync an event larger than the
/// default 4 MiB frame carries. With the defaults the event would stay on
/// its writer (`sync/tests/limits.rs` covers the refusal).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_that_raise_the_frame_limit_sync_an_event_above_4_mib() {
    let raise = |config: &mut meshlog_node::config::NodeConfig| {
        config.limits.payload_bytes_max = 6 << 20;
        config.limits.body_bytes_max = 8 << 20;
        config.sync.frame_bytes_max = 8 << 20;
    };
    let b = start_with(2, raise).await;
    let a = start_with(1, |config| {
        raise(config);
        config.peers = vec![b.url()];
    })
    .await;
    append(a.addr, &vec![0x5a; 5 << 20]).await;
    append(a.addr, b"after").await;
    wait_until("b holds a's large event and the one after it", || async {
        marks(b.addr).await["marks"]["1"] == 2
    })
    .await;
    assert_eq!(digest(a.addr).await, digest(b.addr).await);
    for node in [a, b] {
        node.node.shutdown();
        tokio::time::timeout(DEADLINE, node.node.stopped())
            .await
            .unwrap();
    }
}

async fn walk_from(addr: std::net::SocketAddr, after: &str) -> Vec<Value> {
    let page = get(addr, &format!("/events?after={after}&limit=1000"))
        .await
        .json();
    assert_eq!(page["at_head"], true);
    page["events"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_added_at_run_time_syncs_and_a_removed_one_stops() {
    let a = start(1).await;
    let d = start(4).await;
    append(a.addr, b"on a").await;
    append(d.addr, b"on d").await;

    let added = post_json(a.addr, "/peers", &json!({"url": d.url()})).await;
    assert_eq!(added.status, 201);
    assert_eq!(added.json()["url"], d.url());
    // Again (with a trailing slash): already there, 200.
    let again = post_json(a.addr, "/peers", &json!({"url": format!("{}/", d.url())})).await;
    assert_eq!(again.status, 200);
    wait_until("a and d converge", || async {
        let (da, dd) = (digest(a.addr).await, digest(d.addr).await);
        da["events"] == 2 && da == dd
    })
    .await;
    wait_until("a lists d as connected", || async {
        let peers = get(a.addr, "/peers").await.json();
        peers["peers"].as_array().unwrap().len() == 1
            && peers["peers"][0]["connected"] == true
            && peers["peers"][0]["stream"] == "4"
    })
    .await;
    // d lists a's session as inbound: from a's loopback address, a's
    // stream, nothing a lacks; d dials no one.
    wait_until("d lists a's inbound session", || async {
        let peers = get(d.addr, "/peers").await.json();
        peers["inbound"].as_array().unwrap().len() == 1
            && peers["inbound"][0]["connected"] == true
            && peers["inbound"][0]["stream"] == "1"
            && peers["inbound"][0]["lag_events"] == 0
    })
    .await;
    let peers = get(d.addr, "/peers").await.json();
    assert_eq!(peers["peers"], json!([]));
    let inbound = &peers["inbound"][0];
    assert!(
        inbound["remote"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{peers}"
    );
    assert_eq!(inbound["marks"], json!({"1": 1, "4": 1}), "{peers}");
    assert_eq!(get(a.addr, "/peers").await.json()["inbound"], json!([]));

    let removed = request(
        a.addr,
        "DELETE",
        "/peers",
        &[("content-type", "application/json")],
        json!({"url": d.url()}).to_string().as_bytes(),
    )
    .await;
    assert_eq!(removed.status, 200);
    assert_eq!(
        get(a.addr, "/peers").await.json(),
        json!({"peers": [], "inbound": []})
    );
    let removed_again = request(
        a.addr,
        "DELETE",
        "/peers",
        &[],
        json!({"url": d.url()}).to_string().as_bytes(),
    )
    .await;
    assert_eq!(
        (removed_again.status, removed_again.error()),
        (404, "unknown_peer".into())
    );
    // The session is gone on both sides, and from d's inbound list.
    for node in [&a, &d] {
        wait_until("the removed peer's session ends", || async {
            let metrics = String::from_utf8(get(node.addr, "/metrics").await.body).unwrap();
            metrics.lines().any(|l| l == "meshlog_sync_sessions 0")
        })
        .await;
    }
    assert_eq!(
        get(d.addr, "/peers").await.json(),
        json!({"peers": [], "inbound": []})
    );
    // d's next event stays on d: wait ten heartbeats, a bounded wait.
    append(d.addr, b"after removal").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(digest(a.addr).await["events"], 2);
    assert_eq!(digest(d.addr).await["events"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_peer_reports_its_error_and_redials_with_backoff() {
    // A port nothing listens on: bind one, note it, drop it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let a = start_with(1, |config| config.peers = vec![url.clone()]).await;
    wait_until("the dial failure is reported", || async {
        let peers = get(a.addr, "/peers").await.json();
        peers["peers"][0]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("dial failed"))
    })
    .await;
    let peers = get(a.addr, "/peers").await.json();
    assert_eq!(peers["peers"][0]["connected"], false);
    assert_eq!(peers["peers"][0]["stream"], Value::Null);
    // A server that is up but is not a node refuses the upgrade.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let added = post_json(a.addr, "/peers", &json!({"url": format!("http://{other}")})).await;
    assert_eq!(added.status, 201);
    wait_until("the refused upgrade is reported", || async {
        let peers = get(a.addr, "/peers").await.json();
        peers["peers"][1]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("404"))
    })
    .await;
    // The node itself is unharmed.
    assert_eq!(append(a.addr, b"still serving").await, 1);
}

/// The built binary, started on a data directory with a free port.
struct Process {
    child: Child,
    addr: std::net::SocketAddr,
}

fn spawn_node(data: &std::path::Path, extra: &[&str]) -> Process {
    let mut child = Command::new(env!("CARGO_BIN_EXE_meshlog"))
        .args(["serve", "--data"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the meshlog binary runs");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line is not `listening on ADDR`: {line:?}"))
        .parse()
        .unwrap();
    // Keep reading stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while stdout.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
            sink.clear();
        }
    });
    Process { child, addr }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < DEADLINE, "the node did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_exits_0_and_a_restart_keeps_every_acknowledged_append() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = spawn_node(dir.path(), &[]);
    let addr = node.addr;
    // A new directory: the stream its writer key derives.
    let stream = marks(addr).await["stream"].as_str().unwrap().to_owned();
    // Four appenders keep appending until the node goes away; each records
    // what was acknowledged (201), which must survive.
    let mut appenders = Vec::new();
    for writer in 0..4u32 {
        appenders.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 0.. {
                let payload = format!("writer {writer} event {i}");
                let attempt = async {
                    let mut stream = tokio::net::TcpStream::connect(addr).await?;
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let request = format!("POST /events HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{payload}", payload.len());
                    stream.write_all(request.as_bytes()).await?;
                    let mut answer = Vec::new();
                    stream.read_to_end(&mut answer).await?;
                    Ok::<_, std::io::Error>(answer)
                };
                match attempt.await.ok().and_then(|answer| parse_response(&answer)) {
                    Some(response) if response.status == 201 => {
                        let seq = response.json()["events"][0]["seq"].as_u64().unwrap();
                        acknowledged.push((seq, payload));
                    }
                    _ => break,
                }
            }
            acknowledged
        }));
    }
    wait_until("some appends are acknowledged", || async {
        marks(addr).await["marks"][&stream].as_u64().unwrap_or(0) >= 40
    })
    .await;
    let status = Command::new("kill")
        .args(["-TERM", &node.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = wait_exit(&mut node.child);
    assert_eq!(exit.code(), Some(0), "{exit:?}");
    let mut acknowledged = Vec::new();
    for appender in appenders {
        acknowledged.extend(
            tokio::time::timeout(DEADLINE, appender)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert!(acknowledged.len() >= 40, "{}", acknowledged.len());

    // Restart on the same directory: same stream, every acknowledged event.
    let mut restarted = spawn_node(dir.path(), &[]);
    let held: std::collections::HashMap<u64, String> = walk(restarted.addr, 1000)
        .await
        .into_iter()
        .map(|event| {
            (
                event["seq"].as_u64().unwrap(),
                event["payload"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(marks(restarted.addr).await["stream"], stream.as_str());
    for (seq, payload) in &acknowledged {
        assert_eq!(
            held.get(seq),
            Some(payload),
            "acknowledged seq {seq} lost or changed"
        );
    }
    // The recorded stream id cannot be changed.
    Command::new("kill")
        .args(["-TERM", &restarted.child.id().to_string()])
        .status()
        .unwrap();
    assert_eq!(wait_exit(&mut restarted.child).code(), Some(0));
    let refused = Command::new(env!("CARGO_BIN_EXE_meshlog"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--stream-id",
            "43",
            "--data",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(&format!("writes as stream {stream}")),
        "{stderr}"
    );
}
