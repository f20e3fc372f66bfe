//! [`DiskError`], and the helpers that build it: from redb's errors, from
//! I/O errors, from a damaged block, and from a panic inside the engine.
//! A leaf: the store and its parts (`block`, `lock`, `view`, `upgrade`)
//! import from here, and it imports none of them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Duration;

use meshlog_cursor::StreamId;

/// Why a [`DiskStore`](super::DiskStore) could not open, read or commit.
/// Each variant names the file, and what failed in it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiskError {
    /// Another process (or another open store in this one) holds the data
    /// directory, and still held it after the open waited
    /// [`DiskOptions::lock_wait`](super::DiskOptions::lock_wait) for it.
    #[error(
        "data directory {} is locked by another process or another open store \
         (lock file {}); waited {} ms for it",
        dir.display(),
        lock.display(),
        waited.as_millis()
    )]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The lock file held.
        lock: PathBuf,
        /// How long the open waited for the lock before answering this.
        waited: Duration,
    },
    /// An operating-system call on a file failed.
    #[error("{}: {op} failed: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The error from the operating system.
        #[source]
        source: std::io::Error,
    },
    /// The file is damaged: the engine's page checksums, its structure, or
    /// one of meshlog's records (streams, clock, format, counts) fails a
    /// check. Nothing was repaired silently.
    #[error("{} is damaged: {detail}", path.display())]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// One stored event of a format-2 file fails its crc32 or its layout
    /// (read once, by the upgrade to format 3).
    #[error("{} is damaged: event stream {stream} seq {seq}: {detail}", path.display())]
    CorruptEvent {
        /// The damaged file.
        path: PathBuf,
        /// The event's stream (from its key).
        stream: StreamId,
        /// The event's seq (from its key).
        seq: u64,
        /// What failed.
        detail: String,
    },
    /// One stored block fails its crc32 or its layout.
    #[error("{} is damaged: block of stream {stream} from seq {first_seq}: {detail}", path.display())]
    CorruptBlock {
        /// The damaged file.
        path: PathBuf,
        /// The block's stream (from its key).
        stream: StreamId,
        /// The block's first seq (from its key).
        first_seq: u64,
        /// What failed.
        detail: String,
    },
    /// The file was written in a format this build does not read.
    #[error("{} has format version {found}; this build reads version {expected}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
        /// [`FORMAT_VERSION`](super::FORMAT_VERSION).
        expected: u32,
    },
    /// The storage engine failed in a way that is not damage or I/O.
    #[error("{}: storage engine failed while {op}: {source}", path.display())]
    Engine {
        /// The database file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The engine's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A batch would leave a hole in a stream (its events do not follow the
    /// stored head). Nothing was written.
    #[error("{}: batch refused, nothing written: stream {stream}: {detail}", path.display())]
    BatchRefused {
        /// The database file.
        path: PathBuf,
        /// The stream.
        stream: StreamId,
        /// What does not follow.
        detail: String,
    },
    /// The write-ahead segment (`meshlog.wal`) is damaged before its tail
    /// (a bad record with a whole, later record after it: acknowledged
    /// commits would be lost if it were cut there), or a record in it
    /// cannot be applied, or a commit could not be framed. A torn *tail*
    /// is not this: it is cut, with a warning (`docs/STORAGE.md`).
    #[error("{} is damaged at byte {offset}: {detail}", path.display())]
    Segment {
        /// The segment file.
        path: PathBuf,
        /// Where in it.
        offset: u64,
        /// What failed.
        detail: String,
    },
}

/// [`DiskError::CorruptBlock`] for the block of `stream` from `first_seq`
/// in the file at `path`: the one place both the store and its views build
/// it.
pub(super) fn corrupt_block(
    path: &Path,
    stream: StreamId,
    first_seq: u64,
    detail: String,
) -> DiskError {
    DiskError::CorruptBlock {
        path: path.to_path_buf(),
        stream,
        first_seq,
        detail,
    }
}

/// Runs `work`, which reads or writes through redb, turning a panic inside
/// the engine (which a file damaged outside redb can provoke once it is
/// trusted on open) into [`DiskError::Corrupt`] naming the file.
pub(super) fn guarded<T>(
    path: &Path,
    doing: &str,
    work: impl FnOnce() -> Result<T, DiskError>,
) -> Result<T, DiskError> {
    catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        Err(DiskError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "the storage engine panicked {doing}: {}",
                panic_message(&*panic)
            ),
        })
    })
}

pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_string()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "(no message)".to_string()
    }
}

pub(super) fn engine_error(
    dir: &Path,
    path: &Path,
    op: &'static str,
    error: redb::Error,
) -> DiskError {
    match error {
        redb::Error::Corrupted(detail) => DiskError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("{op}: {detail}"),
        },
        // redb reports a file that is not (or no longer) a database, or ends
        // early, as I/O errors of these kinds: that is damage, not a failing
        // disk.
        redb::Error::Io(source)
            if matches!(
                source.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            DiskError::Corrupt {
                path: path.to_path_buf(),
                detail: format!("{op}: {source}"),
            }
        }
        redb::Error::Io(source) => DiskError::Io {
            path: path.to_path_buf(),
            op,
            source,
        },
        redb::Error::DatabaseAlreadyOpen => DiskError::Locked {
            dir: dir.to_path_buf(),
            lock: path.to_path_buf(),
            waited: Duration::ZERO,
        },
        other => DiskError::Engine {
            path: path.to_path_buf(),
            op,
            source: Box::new(other),
        },
    }
}

pub(super) fn io(path: &Path, op: &'static str) -> impl FnOnce(std::io::Error) -> DiskError {
    let path = path.to_path_buf();
    move |source| DiskError::Io { path, op, source }
}
