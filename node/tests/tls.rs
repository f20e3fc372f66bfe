//! TLS (`docs/SECURITY.md`, "TLS"): a mesh of three nodes over TLS with
//! peer secrets converges; a node whose certificate comes from another CA
//! is refused both ways; a sync upgrade without a client certificate is
//! refused; plaintext to the TLS port gets a clean answer and the node
//! goes on serving; the CLI's client, the Follower and `meshlog mcp`
//! reach a TLS node with `--ca` and a secret. Every certificate is made at run time.

mod support;
mod tls_support;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use meshlog_node::auth::SecretSources;
use meshlog_node::cli::client::{Client, ClientOptions, PageOutcome};
use meshlog_node::follow::{FollowItem, FollowStream, Follower, FollowerConfig};
use support::*;
use tls_support::Ca;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADMIN: &str = "admin-secret-0123456789abcdef";
const PEER: &str = "peer-secret-0123456789abcdef";

async fn tls_node(ca: &Ca, id: u64, peers: Vec<String>) -> TestNode {
    let (cert, key) = ca.node(&format!("node{id}"));
    let ca_file = ca.ca_file();
    start_with(id, move |config| {
        config.security.tls_cert = Some(cert);
        config.security.tls_key = Some(key);
        config.security.tls_ca = Some(ca_file);
        config.security.secrets = SecretSources {
            admin: vec![ADMIN.into()],
            peer: vec![PEER.into()],
            ..SecretSources::default()
        };
        config.peers = peers;
    })
    .await
}

fn https(node: &TestNode) -> String {
    format!("https://127.0.0.1:{}", node.addr.port())
}

fn client(node: &TestNode, ca: &Ca) -> Client {
    Client::with_options(
        &https(node),
        &ClientOptions {
            token: Some(ADMIN.into()),
            ca: Some(ca.ca_file()),
        },
    )
    .unwrap()
}

async fn streams_held(client: &Client) -> Vec<String> {
    match client.page(None, Some(1000)).await {
        Ok(PageOutcome::Page(page)) => {
            let mut streams: Vec<String> = page
                .events
                .iter()
                .map(|event| event.stream.clone())
                .collect();
            streams.sort();
            streams.dedup();
            streams
        }
        _ => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mesh_of_three_over_tls_converges_and_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "one");
    let n1 = tls_node(&ca, 1, Vec::new()).await;
    let n2 = tls_node(&ca, 2, vec![https(&n1)]).await;
    let n3 = tls_node(&ca, 3, vec![https(&n2)]).await;
    let clients: Vec<Client> = [&n1, &n2, &n3].iter().map(|n| client(n, &ca)).collect();
    for client in &clients {
        client.append(&["over tls".to_owned()]).await.unwrap();
    }
    for client in &clients {
        wait_until("every node holds all three streams", || async {
            streams_held(client).await == ["1", "2", "3"]
        })
        .await;
    }

    // A node with a certificate from another CA (and the right peer
    // secret): refused whichever side dials.
    let other = Ca::new(dir.path(), "two");
    let stranger = tls_node(&other, 4, vec![https(&n1)]).await;
    let stranger_client = client(&stranger, &other);
    stranger_client
        .append(&["stranger".to_owned()])
        .await
        .unwrap();
    clients[0].add_peer(&https(&stranger)).await.unwrap();
    wait_until("both dials fail on the certificate", || async {
        let ours = clients[0].peers().await.unwrap();
        let theirs = stranger_client.peers().await.unwrap();
        let failed = |peers: &meshlog_node::cli::client::PeersJson, url: &str| {
            peers.peers.iter().any(|peer| {
                peer.url == url
                    && peer
                        .last_error
                        .as_deref()
                        .is_some_and(|error| error.contains("TLS"))
            })
        };
        failed(&ours, &https(&stranger)) && failed(&theirs, &https(&n1))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(streams_held(&clients[0]).await, ["1", "2", "3"]);
    assert_eq!(streams_held(&stranger_client).await, ["4"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plaintext_and_certificate_less_sync_are_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "one");
    let node = tls_node(&ca, 1, Vec::new()).await;

    // Plaintext HTTP on the TLS port: a readable 400, then closed.
    let mut tcp = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    tcp.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, tcp.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let response = parse_response(&answer).expect("an HTTP answer");
    assert_eq!(response.status, 400);
    assert_eq!(response.error(), "tls_required");

    // A TLS client without a certificate may use the API, not sync.
    let tls = meshlog_node::tls::client_trusting(&ca.ca_file()).unwrap();
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(Arc::unwrap_or_clone(tls))
        .build()
        .unwrap();
    let health = http
        .get(format!("{}/health", https(&node)))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let sync = http
        .get(format!("{}/sync", https(&node)))
        .header("connection", "upgrade")
        .header("upgrade", "meshlog-sync")
        .send()
        .await
        .unwrap();
    assert_eq!(sync.status(), 403);
    let body: serde_json::Value = sync.json().await.unwrap();
    assert_eq!(body["error"], "peer_certificate_required");

    // A client that does not trust the node's CA fails its handshake.
    let other = Ca::new(dir.path(), "two");
    let wrong = Client::with_options(
        &https(&node),
        &ClientOptions {
            token: None,
            ca: Some(other.ca_file()),
        },
    )
    .unwrap();
    assert!(wrong.marks().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_follows_a_tls_node_with_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "one");
    let node = tls_node(&ca, 1, Vec::new()).await;
    let admin = client(&node, &ca);
    admin.append(&["before".to_owned()]).await.unwrap();
    let mut config = FollowerConfig::new(vec![https(&node)], FollowStream::All);
    config.token = Some(ADMIN.into());
    config.tls = Some(meshlog_node::tls::client_trusting(&ca.ca_file()).unwrap());
    let mut follower = Follower::start(config).unwrap();
    let mut seen = Vec::new();
    let mut appended = false;
    while seen.len() < 2 {
        let item = tokio::time::timeout(DEADLINE, follower.next())
            .await
            .expect("the follower yields within the deadline")
            .expect("the follower goes on");
        match item {
            FollowItem::Event(event) => seen.push(event.payload.unwrap_or_default()),
            FollowItem::Connected { .. } if !appended => {
                appended = true;
                admin.append(&["after".to_owned()]).await.unwrap();
            }
            _ => {}
        }
    }
    assert_eq!(seen, ["before", "after"]);

    // Without the secret, the follower is refused and says so.
    let mut config = FollowerConfig::new(vec![https(&node)], FollowStream::All);
    config.tls = Some(meshlog_node::tls::client_trusting(&ca.ca_file()).unwrap());
    config.backoff_min = Duration::from_millis(10);
    let mut refused = Follower::start(config).unwrap();
    let item = tokio::time::timeout(Duration::from_millis(1500), refused.next()).await;
    assert!(
        !matches!(item, Ok(Some(FollowItem::Event(_)))),
        "a follower without a secret got an event: {item:?}"
    );
}

/// `meshlog mcp --node https://... --ca FILE --token SECRET` reaches a TLS
/// node: an agent reads its marks and appends. Without `--ca` it does not
/// start, and says what it needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mcp_server_reaches_a_tls_node_with_its_ca_and_a_secret() {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
    use rmcp::ServiceExt;

    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "one");
    let node = tls_node(&ca, 1, Vec::new()).await;
    let url = https(&node);
    let ca_file = ca.ca_file();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_meshlog")).configure(|cmd| {
        cmd.args(["mcp", "--node", &url, "--ca"])
            .arg(&ca_file)
            .args(["--token", ADMIN])
            .env_remove("MESHLOG_NODE")
            .env_remove("MESHLOG_CA")
            .env_remove("MESHLOG_TOKEN");
    });
    let agent = tokio::time::timeout(
        DEADLINE,
        ().serve(TokioChildProcess::new(command).expect("meshlog mcp starts")),
    )
    .await
    .expect("the MCP handshake within the deadline")
    .expect("the MCP handshake");
    let call = |tool: &str, arguments: serde_json::Value| {
        let params = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(arguments.as_object().unwrap().clone());
        let agent = &agent;
        async move {
            let result = tokio::time::timeout(DEADLINE, agent.call_tool(params))
                .await
                .expect("an answer within the deadline")
                .expect("a tool result");
            let text = result.content[0].as_text().unwrap().text.clone();
            (result.is_error == Some(true), text)
        }
    };
    let (failed, text) = call(
        "append_events",
        serde_json::json!({"payloads": ["over tls"]}),
    )
    .await;
    assert!(!failed, "{text}");
    let (failed, text) = call("read_marks", serde_json::json!({})).await;
    assert!(!failed, "{text}");
    let marks: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(marks["marks"]["1"], 1, "{text}");
    agent.cancel().await.unwrap();

    // No CA for an https:// node: refused at start, exit 2, the reason named.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_meshlog"))
        .args(["mcp", "--node", &url])
        .env_remove("MESHLOG_CA")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("needs --ca FILE"), "{stderr}");
}

/// `Node::reload_tls` (what SIGHUP does) swaps the node's certificate and
/// key for what their files hold now: a client trusting only the new CA
/// gets in, one trusting only the old one no longer does. Files that do not load
/// (a key that is not the certificate's, a key file that is not PEM)
/// leave the pair in force as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_presents_the_new_certificate_and_a_bad_one_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (Ca::new(dir.path(), "one"), Ca::new(dir.path(), "two"));
    let node = tls_node(&one, 1, Vec::new()).await;
    let trusting = |ca: &Ca| {
        Client::with_options(
            &https(&node),
            &ClientOptions {
                token: Some(ADMIN.into()),
                ca: Some(ca.ca_file()),
            },
        )
        .unwrap()
    };
    let reaches = |client: Client| async move { client.marks().await.is_ok() };
    assert!(reaches(trusting(&one)).await);
    assert!(!reaches(trusting(&two)).await);

    // The node's files now hold a pair from CA two (where tls_node put
    // them: one's directory, node1.pem and node1.key).
    let (cert, key) = two.node("node1");
    let (live_cert, live_key) = (one.dir.join("node1.pem"), one.dir.join("node1.key"));
    let (old_cert, old_key) = (
        std::fs::read(&live_cert).unwrap(),
        std::fs::read(&live_key).unwrap(),
    );
    std::fs::copy(&cert, &live_cert).unwrap();
    std::fs::copy(&key, &live_key).unwrap();
    assert!(node.node.reload_tls().unwrap());
    assert!(reaches(trusting(&two)).await);
    assert!(!reaches(trusting(&one)).await);

    // A key that is not the certificate's: refused, CA two's pair stays.
    std::fs::write(&live_key, &old_key).unwrap();
    let error = node.node.reload_tls().unwrap_err();
    assert!(error.to_string().contains("TLS configuration"), "{error}");
    assert!(reaches(trusting(&two)).await);
    // A key file that is not PEM: refused, named.
    std::fs::write(&live_key, b"not a key").unwrap();
    let error = node.node.reload_tls().unwrap_err();
    assert!(error.to_string().contains("node1.key"), "{error}");
    assert!(reaches(trusting(&two)).await);
    // The old pair back: CA one again.
    std::fs::write(&live_cert, &old_cert).unwrap();
    std::fs::write(&live_key, &old_key).unwrap();
    assert!(node.node.reload_tls().unwrap());
    assert!(reaches(trusting(&one)).await);

    // A node without a certificate has nothing to reload.
    let plain = start(2).await;
    assert!(!plain.node.reload_tls().unwrap());
}

/// The same through the binary: `meshlog serve` with a certificate, the
/// files replaced, `kill -HUP`: a client trusting only the new CA gets in
/// (the old pair stays until then), and the node still exits 0 on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_makes_a_serving_process_present_the_new_certificate() {
    use std::io::BufRead;

    /// Kills the child if the test fails before it exits.
    struct Serve(std::process::Child);
    impl Drop for Serve {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (Ca::new(dir.path(), "one"), Ca::new(dir.path(), "two"));
    let (cert, key) = one.node("served");
    let mut serve = Serve(
        std::process::Command::new(env!("CARGO_BIN_EXE_meshlog"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path().join("data"))
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the meshlog binary runs"),
    );
    let mut stdout = std::io::BufReader::new(serve.0.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    let url = format!("https://{addr}");
    let trusting = |ca: &Ca| {
        Client::with_options(
            &url,
            &ClientOptions {
                token: None,
                ca: Some(ca.ca_file()),
            },
        )
        .unwrap()
    };
    assert!(trusting(&one).marks().await.is_ok());

    let (new_cert, new_key) = two.node("renewed");
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    // Not before the signal.
    assert!(trusting(&one).marks().await.is_ok());
    let pid = serve.0.id().to_string();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(hup.success());
    wait_until("the new certificate is presented", || async {
        trusting(&two).marks().await.is_ok()
    })
    .await;
    assert!(trusting(&one).marks().await.is_err());

    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(term.success());
    let deadline = std::time::Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = serve.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(0));
}
