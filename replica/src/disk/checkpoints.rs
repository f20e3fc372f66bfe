//! The `checkpoints` table: the checkpoints a replica keeps
//! (`docs/TOKEN.md`, "Version 2"), added within format 5 (a file without
//! the table holds none; a build that does not know it ignores it).
//!
//! Key: the position, 0 for the oldest; value: the checkpoint's vector as
//! its version-1 token (`meshlog-cursor`'s encoding, which carries its own
//! CRC-32 and decodes totally), so a damaged record is named, not read as
//! another vector. Written whole, apart from the segment, in one durable
//! redb transaction: checkpoints change at most every couple of seconds,
//! and one lost in a crash costs only the tokens naming it.

use meshlog_cursor::{token, VersionVector};
use redb::{ReadableTable, TableDefinition};

use super::{DiskError, DiskStore};
use crate::checkpoints::CHECKPOINTS_KEPT;

/// Per position, oldest first, a checkpoint's vector as a version-1 token.
const CHECKPOINTS: TableDefinition<u64, &[u8]> = TableDefinition::new("checkpoints");

impl DiskStore {
    /// Replaces the checkpoints recorded by `vectors`, durably.
    pub(super) fn write_checkpoints(&mut self, vectors: &[VersionVector]) -> Result<(), DiskError> {
        let mut records = Vec::with_capacity(vectors.len());
        for vector in vectors {
            records.push(token::encode(vector).map_err(|error| DiskError::Corrupt {
                path: self.path.clone(),
                detail: format!("a checkpoint to record has no token: {error}"),
            })?);
        }
        let txn = self.begin_write()?;
        {
            let mut table = txn
                .open_table(CHECKPOINTS)
                .map_err(self.engine("open checkpoints table"))?;
            table
                .retain(|_, _| false)
                .map_err(self.engine("clear checkpoints"))?;
            for (position, record) in records.iter().enumerate() {
                table
                    .insert(position as u64, record.as_slice())
                    .map_err(self.engine("write checkpoint"))?;
            }
        }
        txn.commit().map_err(self.engine("commit checkpoints"))?;
        self.meta.checkpoints = vectors.to_vec();
        Ok(())
    }

    /// Reads the checkpoints recorded, oldest first: none in a file
    /// without the table. A record that does not decode is
    /// [`DiskError::Corrupt`], naming the table and the position.
    pub(super) fn checkpoint_records(
        &self,
        read: &redb::ReadTransaction,
    ) -> Result<Vec<VersionVector>, DiskError> {
        let table = match read.open_table(CHECKPOINTS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(error) => return Err(self.engine("open checkpoints table")(error)),
        };
        let mut vectors = Vec::new();
        for entry in table.iter().map_err(self.engine("read checkpoints"))? {
            let (key, value) = entry.map_err(self.engine("read checkpoints"))?;
            let position = key.value();
            if position != vectors.len() as u64 || vectors.len() == CHECKPOINTS_KEPT {
                return Err(self.corrupt(format!(
                    "the checkpoints table holds position {position} after {} records \
                     (at most {CHECKPOINTS_KEPT}, from 0)",
                    vectors.len()
                )));
            }
            let vector = token::decode(value.value()).map_err(|error| {
                self.corrupt(format!(
                    "the checkpoint record at position {position}: {error}"
                ))
            })?;
            vectors.push(vector);
        }
        Ok(vectors)
    }
}
