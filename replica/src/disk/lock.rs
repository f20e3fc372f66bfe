//! `LOCK`: the data directory's lock, taken with a bounded wait and
//! released explicitly.
//!
//! The lock is `flock(2)` (std's [`File::try_lock`] on Unix), which belongs
//! to the lock file's *open description*, not to the process. A child
//! forked by any thread of this process shares that description until it
//! execs (std opens every file with `O_CLOEXEC`, so the exec closes it; a
//! child that never execs keeps it until it exits). Closing our descriptor
//! alone therefore does not release the lock while such a child lives, and
//! an immediate reopen in this process was refused as `Locked` (issue 28).
//! Two measures, each sufficient for its own case:
//!
//! - [`DirLock`]'s drop unlocks explicitly (`LOCK_UN` releases the lock of
//!   the description, whoever else shares it), so a store dropped here
//!   leaves nothing held behind it;
//! - [`DirLock::acquire`] waits up to [`DiskOptions::lock_wait`] for a lock
//!   that is held only for a moment (a store another process is closing, a
//!   redb lock of a description shared the same way) before answering
//!   [`DiskError::Locked`], as SQLite's busy timeout does. A lock held by a
//!   live store is still refused, once the wait is over.
//!
//! fcntl record locks would not be inherited by a fork, but they are per
//! process: a second open in this process would take the lock again, and
//! closing any descriptor of the file would drop it. redb locks its own
//! file with open-description locks and releases them explicitly on close.
//!
//! [`DiskOptions::lock_wait`]: super::DiskOptions::lock_wait

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;
use std::time::{Duration, Instant};

use super::error::{io, DiskError};

/// The first pause between two attempts; it doubles up to
/// [`RETRY_PAUSE_MAX`].
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(1);
/// The longest pause between two attempts.
const RETRY_PAUSE_MAX: Duration = Duration::from_millis(50);

/// The locked `LOCK` file of a data directory; unlocked when dropped.
#[derive(Debug)]
pub(super) struct DirLock {
    file: File,
}

impl DirLock {
    /// Opens (creating it) and locks `lock_path` in `dir`, waiting up to
    /// `wait` while another holder has it.
    pub(super) fn acquire(
        dir: &Path,
        lock_path: &Path,
        wait: Duration,
    ) -> Result<DirLock, DiskError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(lock_path)
            .map_err(io(lock_path, "open lock file"))?;
        let mut waiting = Waiting::new(dir, lock_path, wait);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(DirLock { file }),
                Err(TryLockError::WouldBlock) => waiting.pause_or_refuse()?,
                Err(TryLockError::Error(source)) => {
                    return Err(DiskError::Io {
                        path: lock_path.to_path_buf(),
                        op: "lock",
                        source,
                    })
                }
            }
        }
    }

    /// The lock file, to read and write its marker.
    pub(super) fn file(&mut self) -> &mut File {
        &mut self.file
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Released for every sharer of the description (a forked child
        // that has not exec'd yet), not only closed here; see the module
        // docs. Closing follows when the file drops.
        if let Err(error) = self.file.unlock() {
            tracing::warn!(%error, "unlocking the data directory's lock file failed");
        }
    }
}

/// A bounded wait for a lock: when it started, when it ends, and the next
/// pause.
#[derive(Debug)]
pub(super) struct Waiting<'a> {
    dir: &'a Path,
    lock_path: &'a Path,
    started: Instant,
    wait: Duration,
    pause: Duration,
}

impl<'a> Waiting<'a> {
    /// A wait of up to `wait` from now for the lock of `dir` at `lock_path`
    /// (the file named in the refusal).
    pub(super) fn new(dir: &'a Path, lock_path: &'a Path, wait: Duration) -> Waiting<'a> {
        Waiting {
            dir,
            lock_path,
            started: Instant::now(),
            wait,
            pause: RETRY_PAUSE_MIN,
        }
    }

    /// Sleeps before the next attempt, or, once the wait is over, answers
    /// [`DiskError::Locked`] saying how long it waited.
    pub(super) fn pause_or_refuse(&mut self) -> Result<(), DiskError> {
        let waited = self.started.elapsed();
        let Some(left) = self.wait.checked_sub(waited).filter(|left| !left.is_zero()) else {
            return Err(DiskError::Locked {
                dir: self.dir.to_path_buf(),
                lock: self.lock_path.to_path_buf(),
                waited,
            });
        };
        std::thread::sleep(self.pause.min(left));
        self.pause = (self.pause * 2).min(RETRY_PAUSE_MAX);
        Ok(())
    }

    /// How long it has waited so far.
    pub(super) fn waited(&self) -> Duration {
        self.started.elapsed()
    }
}
