//! `verify` (issue 13: the full check a restart does not make): a running
//! node checks every event over `POST /verify`; a stopped node's directory
//! is checked offline with `meshlog verify --data DIR`, and a damaged
//! record is reported, naming the file, with a failing exit code.

mod cli_support;
mod support;

use cli_support::{cli, serve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_node_and_a_stopped_ones_directory_verify() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a");
    let mut node = serve(&data, 7, &[]);
    let url = format!("http://{}", node.addr);
    let appended = cli(&["append", "--node", &url, "one", "two", "three"], "").await;
    assert_eq!(appended.code, Some(0), "{appended:?}");

    let online = cli(&["verify", "--node", &url], "").await;
    assert_eq!(online.code, Some(0), "{online:?}");
    assert!(
        online.stdout.contains("3 event(s) on 1 stream(s) sound"),
        "{online:?}"
    );
    // The directory of a running node is locked: offline verify says so.
    let locked = cli(&["verify", "--data", data.to_str().unwrap()], "").await;
    assert_eq!(locked.code, Some(1), "{locked:?}");

    node.kill9();
    let offline = cli(&["verify", "--data", data.to_str().unwrap()], "").await;
    assert_eq!(offline.code, Some(0), "{offline:?}");
    assert!(
        offline.stdout.contains("3 event(s) on 1 stream(s) sound"),
        "{offline:?}"
    );

    // Not a node's directory: refused, nothing created.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let refused = cli(&["verify", "--data", empty.to_str().unwrap()], "").await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("stream-id"), "{refused:?}");
    assert!(std::fs::read_dir(&empty).unwrap().next().is_none());

    // A payload byte flipped on disk: the file still opens, and verify
    // names it.
    let file = data.join("meshlog.redb");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(5)
        .position(|w| w == b"three")
        .expect("the payload is stored as written");
    bytes[at] ^= 0x20;
    std::fs::write(&file, &bytes).unwrap();
    let damaged = cli(&["verify", "--data", data.to_str().unwrap()], "").await;
    assert_eq!(damaged.code, Some(1), "{damaged:?}");
    assert!(damaged.stderr.contains("meshlog.redb"), "{damaged:?}");
}
