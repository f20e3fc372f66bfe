//! The redb database: its tables, the handle that closes it under a
//! guard, and write transactions, durable or not. A leaf: the store and
//! its parts (`fold`, `write`, `upgrade`) import from here, and it imports
//! none of them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::{Database, TableDefinition};

use super::error::{panic_message, DiskError};

pub(super) const BLOCKS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("blocks");
pub(super) const STREAMS: TableDefinition<u64, &[u8]> = TableDefinition::new("streams");
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub(super) const CHAINS: TableDefinition<u64, &[u8]> = TableDefinition::new("chains");
/// Per stream received sealed, the key pinned and the seals kept
/// (`docs/STORAGE.md`): added within format 4, so a format-4 file
/// without it holds no pins.
pub(super) const SEALS: TableDefinition<u64, &[u8]> = TableDefinition::new("seals");
/// Per stream, the newest compaction statement kept (`docs/STORAGE.md`):
/// its 144 bytes (`SignedCompaction::to_bytes`). Added within format 5: a
/// file without it holds none.
pub(super) const STATEMENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("statements");
/// Per stream proven forked, the proof kept (`docs/STORAGE.md`): added
/// within format 5, so a file without it holds no proofs.
pub(super) const FORKS: TableDefinition<u64, &[u8]> = TableDefinition::new("forks");

/// The redb database, closed under a guard. redb's close writes its
/// allocator state back in a commit of its own; on a file damaged outside
/// redb that opened without redb noticing, that commit can panic (a flipped
/// bit in the list of pages to free does,
/// `corruption::a_flipped_bit_in_the_data_file_is_refused_or_repaired_never_a_panic`),
/// and a destructor inside redb then panics again while unwinding, which
/// aborts the process: no `catch_unwind` stops that. So a handle that
/// never began a write transaction (an open that only read: a clean open,
/// `Replica::verify`, an inspection) is closed without that commit (as
/// redb closes while a panic unwinds: its file left for the next open to
/// recover as after a crash, from the allocator state its last durable
/// commit recorded); one that wrote (or a
/// build with `panic = "abort"`) closes as redb does, its panic caught and
/// logged, naming the file.
#[derive(Debug)]
pub(super) struct Db {
    /// Taken only when dropped.
    pub(super) db: Option<Database>,
    pub(super) path: PathBuf,
    /// Whether a write transaction was begun on it ([`begin_write_with`]).
    pub(super) wrote: AtomicBool,
}

impl Db {
    /// The handle of `db`, the data file at `path`: nothing written yet.
    pub(super) fn new(db: Database, path: PathBuf) -> Db {
        Db {
            db: Some(db),
            path,
            wrote: AtomicBool::new(false),
        }
    }
}

impl std::ops::Deref for Db {
    type Target = Database;

    fn deref(&self) -> &Database {
        self.db
            .as_ref()
            .expect("the database is taken only when dropped")
    }
}

/// What unwinds through a close that must write nothing: not a failure,
/// so no panic hook runs for it.
struct CloseWithoutCommit;

/// Drops the database it holds as its own drop runs: while a
/// [`CloseWithoutCommit`] unwinds, so redb's close writes nothing.
struct DropWhileUnwinding(Option<Database>);

impl Drop for DropWhileUnwinding {
    fn drop(&mut self) {
        drop(self.0.take());
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else {
            return;
        };
        // Built with `panic = "abort"`, an unwind is an abort: close as
        // redb does (a panic there would abort the process anyway).
        let wrote = self.wrote.load(Ordering::Relaxed) || !cfg!(panic = "unwind");
        let closed = catch_unwind(AssertUnwindSafe(move || {
            if wrote {
                drop(db);
            } else {
                let _closing = DropWhileUnwinding(Some(db));
                std::panic::resume_unwind(Box::new(CloseWithoutCommit));
            }
        }));
        match closed {
            Err(panic) if !panic.is::<CloseWithoutCommit>() => tracing::error!(
                path = %self.path.display(),
                panic = %panic_message(&*panic),
                "the storage engine panicked closing the data file: it is damaged; \
                 reopen it (redb checks and repairs it) or run Replica::verify"
            ),
            _ => {}
        }
    }
}

/// A write transaction, durable or not. A durable commit also records
/// redb's allocator state and commits in two phases ("quick repair"): an
/// open after a crash then loads that state instead of walking and
/// checksumming every page of the file, so recovery costs the segment's
/// tail, not the file (`docs/STORAGE.md`). A commit that is not durable
/// is only in memory (and the page cache) until the next durable one: the
/// segment holds it meanwhile. `engine` names the file in an error.
pub(super) fn begin_write_with(
    db: &Db,
    durable: bool,
    engine: impl FnOnce(redb::Error) -> DiskError,
) -> Result<redb::WriteTransaction, DiskError> {
    let durability = if durable {
        redb::Durability::Immediate
    } else {
        redb::Durability::None
    };
    db.wrote.store(true, Ordering::Relaxed);
    let txn = db
        .begin_write()
        .map_err(redb::Error::from)
        .and_then(|mut txn| {
            txn.set_durability(durability)?;
            txn.set_quick_repair(durable);
            Ok(txn)
        });
    txn.map_err(engine)
}
