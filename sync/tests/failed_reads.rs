//! A store read that fails ends the session with that error; it is never
//! hidden behind a shorter or empty delta (issue 29's review: the protocol
//! core read deltas with `delta_columns_for`, which logs a failed read and
//! answers the empty delta, so a sender whose disk had a damaged block sent
//! what came before it and then nothing, for ever, while both sides
//! believed the link was in sync).
//!
//! How: a replica on a `DiskStore` writes 300 events of its own in 60
//! commits and closes; one bit is flipped inside a block in the middle of
//! its stream (`meshlog_testkit::damage`), which opening does not read.
//! Reopened, it syncs with an empty in-memory peer over two real
//! `Session`s on tokio's paused clock, each told to stop after a minute.
//! The sender's session must end with `ProtocolError::Read`, naming the
//! peer, the data file and the damaged block, logged once; the peer holds
//! nothing at or past the damaged block. Before the protocol core read
//! with `try_delta_columns_for`, both sessions ran until stopped (`Ok`).

use std::cell::RefCell;
use std::sync::Once;
use std::time::Duration;

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{Commits, Config, DiskStore, Replica, DATA_FILE};
use meshlog_sync::testkit::run_paused;
use meshlog_sync::{ProtocolError, Session, SessionConfig, SessionError, SharedReplica};
use meshlog_testkit::damage::flip_bit_in_block;

const SENDER: StreamId = StreamId::new(1);
const RECEIVER: StreamId = StreamId::new(2);

thread_local! {
    static CAPTURED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes what it is given to this thread's capture (the paused runtime
/// runs both sessions on the test's thread).
struct ThreadCapture;

impl std::io::Write for ThreadCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        CAPTURED.with(|captured| captured.borrow_mut().extend_from_slice(bytes));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_log() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing_subscriber::fmt()
            .with_writer(|| ThreadCapture)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
    });
    CAPTURED.with(|captured| captured.borrow_mut().clear());
}

fn captured_log() -> String {
    CAPTURED.with(|captured| String::from_utf8_lossy(&captured.borrow()).into_owned())
}

/// Writes 300 events of `SENDER` in 60 commits to a store in `dir`, and
/// closes it.
fn write_log(dir: &std::path::Path) {
    let store = DiskStore::open(dir).expect("the store opens");
    let mut replica = Replica::open(Config::new(SENDER), store).expect("the replica opens");
    for commit in 0..60u64 {
        let payloads =
            (0..5).map(|i| Bytes::from(format!("event {commit}.{i} {}", "x".repeat(40))));
        replica
            .append_batch_at(payloads, 1_000 + commit)
            .expect("appended");
    }
}

#[test]
fn a_failed_store_read_ends_the_session_naming_the_block_never_a_shorter_delta() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    write_log(dir.path());
    let first_seq = flip_bit_in_block(&dir.path().join(DATA_FILE), SENDER, 150);
    let store = DiskStore::open(dir.path()).expect("opening reads no middle block");
    let sender = Replica::open(Config::new(SENDER), store).expect("the replica opens");
    let sender = SharedReplica::with_commits(sender, Commits::Inline);
    assert_eq!(sender.marks().get(SENDER), 300);
    let receiver = SharedReplica::in_memory(RECEIVER);
    capture_log();
    let config = SessionConfig::with_heartbeat(Duration::from_millis(20));
    let (sender_end, receiver_end) = run_paused(async {
        let (a_io, b_io) = tokio::io::duplex(1 << 20);
        let stop = || tokio::time::sleep(Duration::from_secs(60));
        tokio::join!(
            Session::new(sender.clone(), config.clone()).run_until(a_io, stop()),
            Session::new(receiver.clone(), config.clone()).run_until(b_io, stop()),
        )
    });
    let block = format!("block of stream {SENDER} from seq {first_seq}");
    match &sender_end {
        Err(SessionError::Core(ProtocolError::Read { peer, source })) => {
            assert_eq!(*peer, RECEIVER);
            let text = source.to_string();
            assert!(text.contains(DATA_FILE) && text.contains(&block), "{text}");
        }
        other => panic!("the sender's session must end with the read error, got {other:?}"),
    }
    assert!(receiver_end.is_ok(), "{receiver_end:?}");
    let held = receiver.marks().get(SENDER);
    assert!(
        held < first_seq,
        "the peer holds {held}, past the damaged block at {first_seq}"
    );
    let log = captured_log();
    // One line: the session's end, with the reason.
    let lines: Vec<&str> = log.lines().filter(|line| line.contains(&block)).collect();
    assert_eq!(lines.len(), 1, "logged once:\n{log}");
    assert!(
        lines[0].contains("WARN") && lines[0].contains("sync session closed"),
        "{log}"
    );
}
