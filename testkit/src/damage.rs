//! Damage to a closed `DiskStore`'s data file, for tests that need a store
//! whose reads fail where a real disk's would: [`flip_bit_in_block`] flips
//! one bit inside the block of events holding a seq, through redb itself,
//! so the file stays a valid redb database and only meshlog's check of
//! the block (its crc32) finds the damage. Opening reads no block but the
//! last of each stream, so a block in the middle of a stream is found by
//! the first read that reaches it: a page, a delta, `verify`.
//!
//! It knows the store's `blocks` table (`docs/STORAGE.md`): keyed by
//! `(stream, first seq)`, one block of events per value.

use std::path::Path;

use meshlog_cursor::StreamId;
use redb::{ReadableTable, TableDefinition};

const BLOCKS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("blocks");

/// Flips one bit inside the block of `stream` holding `seq` in the closed
/// store whose data file is `data_file` (`dir/meshlog.redb`); answers the
/// block's first seq, which the store's error names ("block of stream S
/// from seq N").
///
/// # Panics
///
/// If the file does not open as a redb database, or holds no block of
/// `stream` at or below `seq`: a test's setup is wrong.
pub fn flip_bit_in_block(data_file: &Path, stream: StreamId, seq: u64) -> u64 {
    let db = redb::Database::open(data_file).expect("the data file opens as redb");
    let txn = db.begin_write().expect("a write transaction");
    let first_seq = {
        let mut blocks = txn.open_table(BLOCKS).expect("the blocks table");
        let key = blocks
            .range((stream.get(), 0)..=(stream.get(), seq))
            .expect("a range of blocks")
            .next_back()
            .expect("a block at or below seq")
            .expect("a readable block")
            .0
            .value();
        let mut value = blocks
            .get(key)
            .expect("the block reads")
            .expect("the block exists")
            .value()
            .to_vec();
        // Past the block's header, inside its events: only the crc finds it.
        value[30] ^= 0x10;
        blocks.insert(key, value.as_slice()).expect("written back");
        key.1
    };
    txn.commit().expect("committed");
    first_seq
}
