//! The node's stream and its key (`docs/SIGNING.md`, "Keys and stream
//! ids", the upgrade policy, "Membership"): a new data directory writes the
//! stream its `writer.key` derives, sealed, and refuses a `--stream-id`
//! that differs; a legacy directory (a `stream-id` its key does not
//! derive) keeps its id and runs unsealed unless the trust configuration
//! binds its key to it (`key@stream`, or a binding the admin signed); a
//! node whose membership is closed takes, over a real sync session, an
//! admitted writer's events and cuts those of a writer it does not admit
//! from the same peer's deltas, the link kept; a node that requires seals
//! takes a sealed writer's events through a peer that also relays an
//! unsealed legacy stream, cuts that one, and keeps the link.
//!
//! Nodes are real `Node::start`s on scratch directories; what they write
//! is read back over HTTP (`GET /marks`, `GET /peers`). Waits poll a state
//! with a deadline (`support::wait_until`); nothing is timed.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use meshlog_node::config::NodeConfig;
use meshlog_node::Node;
use meshlog_replica::{AdminKey, Binding, Membership, WriterKey};
use support::{append, get, marks, wait_until};

/// Fast sync timings on `dir`, without a recorded stream id.
fn config(dir: &Path) -> NodeConfig {
    let mut config = NodeConfig::new(dir, "127.0.0.1:0");
    config.sync.heartbeat = std::time::Duration::from_millis(50);
    config.sync.backoff_min = std::time::Duration::from_millis(20);
    config.sync.backoff_max = std::time::Duration::from_millis(400);
    config
}

/// Writes `key` as the directory's `writer.key` (mode 0600), as a node
/// that created it would have.
fn write_key(dir: &Path, key: &WriterKey) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("writer.key");
    std::fs::write(&path, key.to_bytes()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

async fn stop(node: Node) {
    node.shutdown();
    node.stopped().await;
}

fn recorded(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("stream-id"))
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_new_directory_writes_the_stream_its_key_derives_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path())).await.unwrap();
    let derived = node.writer_key().stream().get();
    assert_eq!(node.stream(), derived);
    assert!(node.sealed(), "a key-derived stream is sealed");
    let addr = node.local_addr();
    append(addr, b"one").await;
    let answer = marks(addr).await;
    assert_eq!(answer["stream"], derived.to_string().as_str(), "{answer}");
    assert_eq!(answer["marks"][derived.to_string()], 1, "{answer}");
    let writer = &answer["writer"];
    assert_eq!(
        writer["public_key"],
        node.writer_key().to_string().as_str(),
        "{answer}"
    );
    assert_eq!(writer["sealed"], true, "{answer}");
    assert!(writer["unsealed_reason"].is_null(), "{answer}");
    assert_eq!(recorded(dir.path()), derived.to_string());
    let key = node.writer_key();
    stop(node).await;

    // Restarted: the same key, the same stream, asked for by id too.
    let mut again = config(dir.path());
    again.stream_id = Some(derived);
    let node = Node::start(again).await.unwrap();
    assert_eq!((node.writer_key(), node.stream()), (key, derived));
    assert!(node.sealed());
    stop(node).await;
}

#[tokio::test]
async fn a_stream_id_its_key_does_not_derive_is_refused_on_a_new_directory() {
    let dir = tempfile::tempdir().unwrap();
    let key = WriterKey::from_bytes([21; 32]);
    write_key(dir.path(), &key);
    let mut config = config(dir.path());
    config.stream_id = Some(42);
    let error = match Node::start(config).await {
        Err(error) => error.to_string(),
        Ok(_) => panic!("a new directory took --stream-id 42"),
    };
    assert!(
        error.contains("writes the stream its writer key derives")
            && error.contains(&key.stream().get().to_string())
            && error.contains("--stream-id 42"),
        "{error}"
    );
    assert!(!dir.path().join("stream-id").exists(), "nothing recorded");
}

/// A legacy directory keeps its id (tokens and peers know it); its key
/// seals it only where the trust configuration binds the key to it.
#[tokio::test]
async fn a_legacy_directory_keeps_its_id_and_seals_only_where_bound() {
    let dir = tempfile::tempdir().unwrap();
    let key = WriterKey::from_bytes([22; 32]);
    write_key(dir.path(), &key);
    support::legacy_dir(dir.path(), 4242);

    let node = Node::start(config(dir.path())).await.unwrap();
    assert_eq!(node.stream(), 4242, "the recorded id is kept");
    assert_ne!(key.stream().get(), 4242);
    assert!(!node.sealed(), "unbound: unsealed");
    let addr = node.local_addr();
    append(addr, b"legacy").await;
    let answer = marks(addr).await;
    assert_eq!(answer["stream"], "4242");
    // `GET /marks` says it is unsealed, and why.
    assert_eq!(answer["writer"]["sealed"], false, "{answer}");
    assert_eq!(
        answer["writer"]["unsealed_reason"], "unbound_legacy_stream",
        "{answer}"
    );
    assert_eq!(
        answer["writer"]["public_key"],
        key.public().to_string().as_str()
    );
    stop(node).await;

    // Bound in the trust configuration (`key@4242`): sealed, same id.
    let binding = Binding {
        stream: meshlog_cursor::StreamId::new(4242),
        key: key.public(),
    };
    let mut configured = config(dir.path());
    configured.trust.bind(binding);
    let node = Node::start(configured).await.unwrap();
    assert_eq!((node.stream(), node.sealed()), (4242, true));
    assert_eq!(support::walk(node.local_addr(), 10).await.len(), 1);
    let answer = marks(node.local_addr()).await;
    assert_eq!(answer["writer"]["sealed"], true, "{answer}");
    assert!(answer["writer"]["unsealed_reason"].is_null(), "{answer}");
    stop(node).await;

    // Bound by the admin's signature: sealed; by another key's: refused
    // before the node starts.
    let admin = AdminKey::from_bytes([23; 32]);
    let mut signed = config(dir.path());
    signed
        .trust
        .bind_signed(&binding.sign(&admin), &admin.public())
        .expect("the admin's binding");
    let node = Node::start(signed).await.unwrap();
    assert_eq!((node.stream(), node.sealed()), (4242, true));
    stop(node).await;
    let impostor = AdminKey::from_bytes([24; 32]);
    assert!(Membership::open()
        .bind_signed(&binding.sign(&impostor), &admin.public())
        .is_err());

    // A binding of this stream to another key seals nothing.
    let mut other = config(dir.path());
    other.trust.bind(Binding {
        key: WriterKey::from_bytes([25; 32]).public(),
        ..binding
    });
    let node = Node::start(other).await.unwrap();
    assert_eq!((node.stream(), node.sealed()), (4242, false));
    stop(node).await;
    assert_eq!(recorded(dir.path()), "4242");
}

/// Over real sync sessions: a node whose membership admits one writer
/// syncs with a peer that holds that writer's stream and a stranger's
/// (the stranger's own). It takes the admitted writer's events through
/// that peer, now and as they are appended, and never the stranger's: the
/// stranger's stream is cut from each delta and asked quiet, and the link
/// stays up. (Issue 29: the closed node refused every delta whole,
/// `unknown writer`, so the admitted writer's events never arrived through
/// this peer and the link redialed for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_membership_node_cuts_an_unknown_writer_and_syncs_the_admitted_one() {
    let (admitted_dir, stranger_dir, closed_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let admitted = Node::start(config(admitted_dir.path())).await.unwrap();
    let mut stranger_config = config(stranger_dir.path());
    stranger_config.peers = vec![format!("http://{}", admitted.local_addr())];
    let stranger = Node::start(stranger_config).await.unwrap();
    append(admitted.local_addr(), b"admitted").await;
    append(stranger.local_addr(), b"stranger").await;
    let (admitted_stream, stranger_stream) =
        (admitted.stream().to_string(), stranger.stream().to_string());
    let stranger_addr = stranger.local_addr();
    wait_until("the stranger's node holds the admitted writer", || async {
        marks(stranger_addr).await["marks"][&admitted_stream] == 1
    })
    .await;

    let mut closed_config = config(closed_dir.path());
    closed_config.trust.admit(admitted.writer_key());
    let stranger_url = format!("http://{stranger_addr}");
    closed_config.peers = vec![stranger_url.clone()];
    let closed = Node::start(closed_config).await.unwrap();
    let addr = closed.local_addr();
    for (event, head) in [(&b"again"[..], 2), (b"and again", 3)] {
        wait_until(
            "the admitted writer's events, through the stranger",
            || async { marks(addr).await["marks"][&admitted_stream] == head - 1 },
        )
        .await;
        append(admitted.local_addr(), event).await;
    }
    wait_until("the admitted writer's later events", || async {
        marks(addr).await["marks"][&admitted_stream] == 3
    })
    .await;
    let answer = marks(addr).await;
    assert!(
        answer["marks"].get(&stranger_stream).is_none(),
        "the stranger's events were taken: {answer}"
    );
    let peers = get(addr, "/peers").await.json();
    let link = peers["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|peer| peer["url"] == stranger_url.as_str())
        .unwrap()
        .clone();
    assert_eq!(link["connected"], true, "{link}");
    assert!(link["last_error"].is_null(), "the link was refused: {link}");
    for node in [closed, admitted, stranger] {
        stop(node).await;
    }
}

/// The binary's log at start (stderr, `RUST_LOG=info`): membership open,
/// and for a legacy directory one warning that it writes unsealed and the
/// `writers` entry that would bind its key; then, so bound, that it seals.
#[test]
fn a_legacy_directory_says_once_at_start_that_it_runs_unsealed_and_what_to_do() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let key = WriterKey::from_bytes([26; 32]);
    write_key(dir.path(), &key);
    support::legacy_dir(dir.path(), 4343);
    let start_log = |extra: &[String]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_meshlog"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path())
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("MESHLOG_PEERS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the meshlog binary runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("listening on"), "{line:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        let mut log = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut log)
            .unwrap();
        log
    };
    let log = start_log(&[]);
    assert!(log.contains("membership open"), "{log}");
    let entry = format!("{}@4343", key.public());
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("UNSEALED")).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("WARN")
            && warnings[0].contains("legacy stream 4343")
            && warnings[0].contains(&entry),
        "{log}"
    );
    let log = start_log(&["--writer".into(), entry]);
    assert!(!log.contains("UNSEALED"), "{log}");
    assert!(log.contains("membership closed"), "{log}");
    assert!(log.contains("legacy stream bound to its key"), "{log}");
}

/// Over real sync sessions: a node that requires seals dials a peer that
/// holds a sealed writer's stream (its own) and an unsealed legacy one
/// (relayed from a legacy node). It takes the sealed writer's events and
/// never the legacy stream's, and the link stays up: no `last_error`, the
/// sealed writer's later events keep arriving. (Before `Limit::Unsealed`,
/// the whole delta was refused `Unsealed` and the link redialed for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_requiring_seals_cuts_a_legacy_stream_and_keeps_the_link() {
    let (sealed_dir, strict_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let legacy = support::start(4646).await;
    let mut sealed_config = config(sealed_dir.path());
    sealed_config.peers = vec![legacy.url()];
    let sealed = Node::start(sealed_config).await.unwrap();
    append(legacy.addr, b"legacy").await;
    append(sealed.local_addr(), b"sealed").await;
    let sealed_addr = sealed.local_addr();
    wait_until("the sealed node holds the legacy stream", || async {
        marks(sealed_addr).await["marks"]["4646"] == 1
    })
    .await;

    let mut strict_config = config(strict_dir.path());
    strict_config.require_seals = Some(true);
    let sealed_url = format!("http://{sealed_addr}");
    strict_config.peers = vec![sealed_url.clone()];
    let strict = Node::start(strict_config).await.unwrap();
    let (addr, stream) = (strict.local_addr(), sealed.stream().to_string());
    wait_until("the sealed writer's event", || async {
        marks(addr).await["marks"][&stream] == 1
    })
    .await;
    append(sealed_addr, b"sealed again").await;
    append(legacy.addr, b"legacy again").await;
    wait_until("the sealed writer's later event", || async {
        marks(addr).await["marks"][&stream] == 2
    })
    .await;
    let answer = marks(addr).await;
    assert!(
        answer["marks"].get("4646").is_none(),
        "the legacy stream was taken unsealed: {answer}"
    );
    let peers = get(addr, "/peers").await.json();
    let link = &peers["peers"][0];
    assert_eq!(link["url"], sealed_url.as_str(), "{peers}");
    assert_eq!(link["connected"], true, "{link}");
    assert!(link["last_error"].is_null(), "the link was refused: {link}");
    for node in [strict, sealed, legacy.node] {
        stop(node).await;
    }
}

/// An embedder's closed membership requires seals by default (issue 29):
/// the rule is applied where the replica opens, not only by `meshlog
/// serve`'s command line. A node built with `NodeConfig::new` that admits
/// a sealed writer and binds a legacy stream's key (so the legacy stream
/// is admitted, but comes unsealed) takes the sealed writer's events, cuts
/// the legacy stream, and says so in `GET /peers` (the link's `limits`:
/// the stream, `unsealed`, why). With `require_seals: Some(false)` the
/// same node takes the legacy stream. (Before, `NodeConfig::new` left
/// seals off whatever the membership, and `GET /peers` showed no limits.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedders_closed_membership_requires_seals_and_peers_shows_the_cut_stream() {
    let sealed_dir = tempfile::tempdir().unwrap();
    let legacy = support::start(4747).await;
    let mut sealed_config = config(sealed_dir.path());
    sealed_config.peers = vec![legacy.url()];
    let sealed = Node::start(sealed_config).await.unwrap();
    append(legacy.addr, b"legacy").await;
    append(sealed.local_addr(), b"sealed").await;
    let sealed_addr = sealed.local_addr();
    wait_until("the sealed node holds the legacy stream", || async {
        marks(sealed_addr).await["marks"]["4747"] == 1
    })
    .await;
    let mut trust = Membership::open();
    trust.admit(sealed.writer_key());
    trust.bind(Binding {
        stream: meshlog_cursor::StreamId::new(4747),
        key: legacy.node.writer_key(),
    });
    let sealed_url = format!("http://{sealed_addr}");
    let stream = sealed.stream().to_string();
    for (require_seals, takes_legacy) in [(None, false), (Some(false), true)] {
        let dir = tempfile::tempdir().unwrap();
        let mut closed = config(dir.path());
        closed.trust = trust.clone();
        closed.require_seals = require_seals;
        closed.peers = vec![sealed_url.clone()];
        let node = Node::start(closed).await.unwrap();
        let addr = node.local_addr();
        wait_until("the sealed writer's event", || async {
            marks(addr).await["marks"][&stream] == 1
        })
        .await;
        if takes_legacy {
            wait_until("the legacy stream, seals not required", || async {
                marks(addr).await["marks"]["4747"] == 1
            })
            .await;
            stop(node).await;
            continue;
        }
        let link = wait_for_limit(addr).await;
        assert_eq!(link["connected"], true, "{link}");
        assert!(link["last_error"].is_null(), "the link was refused: {link}");
        assert_eq!(link["limits_total"], 1, "{link}");
        let limit = &link["limits"][0];
        assert_eq!(limit["stream"], "4747", "{link}");
        assert_eq!(limit["limit"], "unsealed", "{link}");
        assert!(
            limit["reason"].as_str().unwrap().contains("requires seals"),
            "{link}"
        );
        let answer = marks(addr).await;
        assert!(
            answer["marks"].get("4747").is_none(),
            "the legacy stream was taken unsealed: {answer}"
        );
        stop(node).await;
    }
    for node in [sealed, legacy.node] {
        stop(node).await;
    }
}

/// The first dialed link of the node at `addr`, once it lists a limit.
async fn wait_for_limit(addr: std::net::SocketAddr) -> serde_json::Value {
    wait_until("the link lists the stream it cuts", || async {
        get(addr, "/peers").await.json()["peers"][0]["limits_total"] == 1
    })
    .await;
    get(addr, "/peers").await.json()["peers"][0].clone()
}
