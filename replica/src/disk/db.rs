//! The redb database: its tables, the handle that closes it under a
//! guard, and write transactions, durable or not. A leaf: the store and
//! its parts (`fold`, `write`, `upgrade`) import from here, and it imports
//! none of them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

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
/// allocator state back; on a file damaged outside redb that opened without
/// redb noticing, that can panic (a flipped bit in an allocator page does,
/// `corruption::a_flipped_bit_in_the_data_file_is_refused_or_repaired_never_a_panic`).
/// Closing a damaged file must not take the process down: the panic is
/// caught and logged, naming the file.
#[derive(Debug)]
pub(super) struct Db {
    /// Taken only when dropped.
    pub(super) db: Option<Database>,
    pub(super) path: PathBuf,
}

impl std::ops::Deref for Db {
    type Target = Database;

    fn deref(&self) -> &Database {
        self.db
            .as_ref()
            .expect("the database is taken only when dropped")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else {
            return;
        };
        if let Err(panic) = catch_unwind(AssertUnwindSafe(move || drop(db))) {
            tracing::error!(
                path = %self.path.display(),
                panic = %panic_message(&*panic),
                "the storage engine panicked closing the data file: it is damaged; \
                 reopen it (redb checks and repairs it) or run Replica::verify"
            );
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
    db: &Database,
    durable: bool,
    engine: impl FnOnce(redb::Error) -> DiskError,
) -> Result<redb::WriteTransaction, DiskError> {
    let durability = if durable {
        redb::Durability::Immediate
    } else {
        redb::Durability::None
    };
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
