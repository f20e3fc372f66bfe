//! The node's writer key file (`writer.key`, `docs/SIGNING.md`): created
//! 0600 on the first start, the same key loaded on every start after,
//! refused with what to do when others may read it or it has the wrong
//! size; with no data directory, a key for the run, and the log says so.
//!
//! The starts are real `Node::start`s on a scratch data directory; the
//! log lines are captured from `writer_key::load_or_create` itself (the
//! node calls it off the runtime, where a test's subscriber does not see).

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use meshlog_node::writer_key::{self, KeyFileError, WRITER_KEY_FILE};
use meshlog_node::{Node, ServeError};
use meshlog_replica::WriterPublicKey;

async fn start(dir: &Path) -> Result<Node, ServeError> {
    Node::start(support::test_config(dir, 7)).await
}

async fn start_and_stop(dir: &Path) -> WriterPublicKey {
    let node = start(dir).await.expect("the node starts");
    let key = node.writer_key();
    node.shutdown();
    node.stopped().await;
    key
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[tokio::test]
async fn the_first_start_creates_the_key_0600_and_the_next_loads_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(WRITER_KEY_FILE);
    let first = start_and_stop(dir.path()).await;
    assert_eq!(mode(&path), 0o600, "mode {:04o}", mode(&path));
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 32);
    assert!(!dir.path().join("writer.key.tmp").exists());

    let second = start_and_stop(dir.path()).await;
    assert_eq!(second, first, "the second start loaded another key");
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the key file changed");
}

#[tokio::test]
async fn a_key_file_others_can_read_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(WRITER_KEY_FILE);
    start_and_stop(dir.path()).await;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();

    let error = start(dir.path())
        .await
        .err()
        .expect("a 0644 key is refused");
    assert!(
        matches!(
            &error,
            ServeError::WriterKey(KeyFileError::Exposed { path: p, mode: 0o644 }) if *p == path
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("mode 0644"), "{message}");
    assert!(message.contains("chmod 600"), "{message}");

    // Restricted again, the node starts on the same key.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    start_and_stop(dir.path()).await;
}

#[tokio::test]
async fn a_key_file_of_the_wrong_size_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(WRITER_KEY_FILE);
    start_and_stop(dir.path()).await;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.pop();
    std::fs::write(&path, &bytes).unwrap();

    let error = start(dir.path()).await.err().expect("a cut key is refused");
    assert!(
        matches!(
            &error,
            ServeError::WriterKey(KeyFileError::WrongSize { len: 31, .. })
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("holds 32 bytes, this one 31"), "{message}");
}

#[test]
fn the_log_names_the_key_file_and_the_stream_it_derives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(WRITER_KEY_FILE);
    let mut key = None;
    let created =
        support::logged(|| key = Some(writer_key::load_or_create(Some(dir.path())).unwrap()));
    let key = key.unwrap();
    assert!(created.contains("writer key created"), "{created}");
    assert!(created.contains(&path.display().to_string()), "{created}");
    assert!(
        created.contains(&format!("derived_stream={}", key.stream().get())),
        "{created}"
    );
    assert!(
        created.contains(&format!("key={}", key.public())),
        "{created}"
    );
    let loaded = support::logged(|| {
        let again = writer_key::load_or_create(Some(dir.path())).unwrap();
        assert_eq!(again.public(), key.public());
    });
    assert!(loaded.contains("writer key loaded"), "{loaded}");

    let mut runs = Vec::new();
    let ephemeral = support::logged(|| {
        runs.push(writer_key::load_or_create(None).unwrap().public());
        runs.push(writer_key::load_or_create(None).unwrap().public());
    });
    assert!(ephemeral.contains("for this run only"), "{ephemeral}");
    assert_ne!(runs[0], runs[1], "each run gets its own key");
}
