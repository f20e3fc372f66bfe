//! How a [`DiskStore`](super::DiskStore) opens ([`DiskOptions`], and the
//! defaults of its fields), and what recovery found on open
//! ([`Recovery`]). A leaf: it imports nothing of the store.

use std::time::Duration;

/// The default size of the cache of the database's pages: 64 MiB.
pub const CACHE_BYTES_DEFAULT: usize = 64 << 20;
/// How many commits the segment holds, by default, before they are made
/// durable in redb and the segment is emptied: 1,024.
pub const CHECKPOINT_RECORDS_DEFAULT: u64 = 1024;
/// How many bytes the segment holds, by default, before its commits are
/// made durable in redb and it is emptied: 16 MiB.
pub const CHECKPOINT_BYTES_DEFAULT: u64 = 16 << 20;
/// How many commits, by default, reads serve from memory while the fold
/// thread has yet to write them into redb, before a commit waits: 1,024.
pub const UNFOLDED_RECORDS_MAX_DEFAULT: usize = 1024;
/// How many bytes of events, by default, reads serve from memory while the
/// fold thread has yet to write them, before a commit waits: 16 MiB.
pub const UNFOLDED_BYTES_MAX_DEFAULT: u64 = 16 << 20;
/// How many commits, by default, wait for the fold thread before it folds
/// them into redb in one transaction, at the latest: 64.
pub(super) const FOLD_RECORDS_DEFAULT: usize = 64;
/// How long, by default, a commit waits for the fold thread to write it
/// into redb with the commits after it, at the most: 5 ms.
pub(super) const FOLD_LINGER_DEFAULT: Duration = Duration::from_millis(5);
/// How long an open waits by default for a data directory locked by
/// another holder before answering
/// [`DiskError::Locked`](super::DiskError::Locked): 2 s. A lock held only
/// for a moment (a child process forked while the lock file was open,
/// until it execs; a store another process is closing) is gone well within
/// it; a supervisor's restart may overlap the old process's exit by about
/// that much.
pub const LOCK_WAIT_DEFAULT: Duration = Duration::from_secs(2);

/// What recovery found on open, beyond the log itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The data file did not exist, or no open had ever returned on it and
    /// it was damaged (set aside as `meshlog.redb.damaged-<ns>`): a new,
    /// empty store was created.
    pub created: bool,
    /// redb found the newest commit torn (its pages do not match the
    /// checksum its commit slot records) and fell back to the commit before
    /// it. A commit torn by a crash never returned, so nothing in it was
    /// acknowledged; the log read back is a correct prefix either way, and
    /// this says that the newest commit on disk was dropped.
    pub rolled_back: bool,
    /// redb's recovery ran on this open and checked the checksum of every
    /// page of the newest commit (reading the whole file): because the
    /// store was not closed cleanly (a crash, a kill, a power cut: redb's
    /// recovery flag was still set), or because
    /// [`DiskOptions::check_pages_on_open`] asked for it. With the default
    /// options it is exactly "the last shutdown was unclean".
    pub pages_checked: bool,
    /// Commits replayed from the write-ahead segment on this open: each was
    /// acknowledged (or in flight) and not yet durable in redb when the
    /// store last stopped. 0 after a clean close.
    pub replayed: u64,
    /// Bytes of a torn record cut from the segment's tail on this open (an
    /// append a crash interrupted, never acknowledged); 0 if none.
    pub torn_bytes: u64,
}

/// How a [`DiskStore`](super::DiskStore) opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskOptions {
    /// The most memory, in bytes, the cache of the database's pages takes
    /// (redb's read cache and write buffer). Events are read from disk
    /// through it; nothing else of the log is kept in memory but, per
    /// stream, its floor, head and pending buffer. Default
    /// [`CACHE_BYTES_DEFAULT`].
    pub cache_bytes: usize,
    /// Whether a *clean* open checks the checksum of every page of the
    /// file (redb's `set_check_integrity_on_open`), reading the whole file.
    /// Off by default: redb's last durable commit recorded its allocator
    /// state, so even an unclean open need not walk the file (the segment
    /// holds what came after), and a file closed cleanly holds exactly
    /// what its last commit wrote; damage done to it since (bit rot, another program) is
    /// caught by the crc32 of the block or record that reads it, typed and
    /// naming the file, and by [`Replica::verify`](crate::Replica::verify)
    /// on demand. On: such damage is reported on open instead, at the cost
    /// of reading the whole file (1.3 s for a million events of 100 bytes
    /// in format 2; `docs/STORAGE.md`).
    pub check_pages_on_open: bool,
    /// How long an open waits for a data directory locked by another
    /// holder before answering
    /// [`DiskError::Locked`](super::DiskError::Locked), trying again with
    /// pauses of 1 ms growing to 50 ms: SQLite's busy timeout, for the
    /// directory. A lock held only for a moment (a child process forked by
    /// any thread while a store's lock file was open keeps the lock until it
    /// execs; a store another process is closing) does not refuse the open;
    /// a store that stays open does, once this has passed. Zero refuses at
    /// once. Default [`LOCK_WAIT_DEFAULT`].
    pub lock_wait: Duration,
    /// How many commits the write-ahead segment holds before a checkpoint
    /// makes redb durable and empties it: a bound on what an unclean open
    /// replays. Default [`CHECKPOINT_RECORDS_DEFAULT`]; at least 1.
    pub checkpoint_records: u64,
    /// How many bytes the segment holds before a checkpoint. Default
    /// [`CHECKPOINT_BYTES_DEFAULT`].
    pub checkpoint_bytes: u64,
    /// How many commits the fold thread may lag: reads serve the commits
    /// it has not written into redb from memory, and a commit that finds
    /// this many waits for it. Default [`UNFOLDED_RECORDS_MAX_DEFAULT`]; at
    /// least 1.
    pub unfolded_records_max: usize,
    /// How many bytes of events (payloads and per-event overhead) the
    /// commits not yet folded may hold before a commit waits; a single
    /// larger commit waits until nothing else is unfolded. Default
    /// [`UNFOLDED_BYTES_MAX_DEFAULT`].
    pub unfolded_bytes_max: u64,
    /// How many commits the fold thread lets gather before it folds them
    /// into redb, in one (non-durable) write transaction: with
    /// [`DiskOptions::fold_linger`], what keeps the fold out of the way of
    /// the commits. A redb transaction costs about 50 µs of CPU whatever it
    /// holds; folded one commit at a time, the fold woke on every commit
    /// and, on a 2-core machine, ran before the committer had answered
    /// (issue 30). Default 64; at least 1 (1 and a
    /// zero linger: every commit folded at once). It never delays a commit
    /// that waits for room ([`DiskOptions::unfolded_records_max`]), nor
    /// durability: a commit is durable in the segment before it returns.
    pub fold_records: usize,
    /// How long the oldest commit not folded waits, at most, for
    /// [`DiskOptions::fold_records`] to gather: then what waits is folded
    /// anyway (reads serve it from memory meanwhile). Default 5 ms.
    pub fold_linger: Duration,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            cache_bytes: CACHE_BYTES_DEFAULT,
            check_pages_on_open: false,
            lock_wait: LOCK_WAIT_DEFAULT,
            checkpoint_records: CHECKPOINT_RECORDS_DEFAULT,
            checkpoint_bytes: CHECKPOINT_BYTES_DEFAULT,
            unfolded_records_max: UNFOLDED_RECORDS_MAX_DEFAULT,
            unfolded_bytes_max: UNFOLDED_BYTES_MAX_DEFAULT,
            fold_records: FOLD_RECORDS_DEFAULT,
            fold_linger: FOLD_LINGER_DEFAULT,
        }
    }
}
