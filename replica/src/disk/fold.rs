//! The commit path through the write-ahead segment, and its recovery.
//!
//! A commit is checked against the heads (`plan`), appended to the
//! segment as one record and synced (`fdatasync`): from then on it is
//! durable, and [`Store::commit`](crate::Store::commit) may return. It is
//! then folded into redb in a write transaction that is *not* durable
//! (`Durability::None`): redb's readers see it at once, so the store's
//! view serves it, but redb writes nothing to disk for it until a durable
//! commit. Every [`DiskOptions::checkpoint_records`](super::DiskOptions)
//! records (or bytes), the fold is a durable commit instead, which makes
//! every fold before it durable too; then the segment is emptied. The
//! `meta` record `"folded"`, written in each fold's transaction, says which
//! record redb holds last, so the records of the segment at or below it
//! are known folded, whatever the segment still holds.
//!
//! On open, the records after `"folded"` are folded again, in order, and
//! a checkpoint follows; a torn tail record is cut with a warning; damage
//! before the tail is refused (`segment::scan`). redb itself opens on its
//! last durable commit, which recorded its allocator state ("quick
//! repair"), so it reads no more of the file than a clean open does.

use std::collections::BTreeMap;

use bytes::Bytes;
use meshlog_cursor::StreamId;
use redb::ReadableDatabase;

use super::codec::{decode_count, encode_count, META_FOLDED};
use super::error::guarded;
use super::record::decode_batch;
use super::segment::scan;
use super::{DiskError, DiskStore, META};
use crate::Batch;

impl DiskStore {
    /// Makes `batch` durable in the segment, then folds it into redb; a
    /// checkpoint every so many records. Refused, with nothing written, if
    /// it leaves a hole; refused altogether after a failure that may have
    /// left redb behind the segment.
    pub(super) fn commit_to_segment(&mut self, batch: &Batch) -> Result<(), DiskError> {
        if self.broken {
            return Err(DiskError::Segment {
                path: self.segment.path().to_path_buf(),
                offset: self.segment.len(),
                detail: "an earlier commit failed after its record may have reached the \
                         segment; reopen the store to replay it"
                    .to_string(),
            });
        }
        let touched = self.plan(batch)?;
        let number = self.folded + 1;
        // Until the fold is done, redb may lack a record the segment has.
        self.broken = true;
        self.segment.append(number, batch)?;
        let (records_max, bytes_max) = self.checkpoint_at;
        let checkpoint = self.segment.records() >= records_max || self.segment.len() >= bytes_max;
        self.fold(batch, touched, number, checkpoint)?;
        if checkpoint {
            self.segment.reset()?;
        }
        self.broken = false;
        Ok(())
    }

    /// Writes `batch`, record `number` of the segment, into redb in one
    /// write transaction, durable or not, and then into the store's
    /// metadata. `touched` is what `plan` answered for it.
    fn fold(
        &mut self,
        batch: &Batch,
        touched: BTreeMap<StreamId, (u64, u64)>,
        number: u64,
        durable: bool,
    ) -> Result<(), DiskError> {
        let clock = self.meta.clock.max(batch.clock);
        let mut digest = self.meta.digest.unwrap_or_default();
        let blocks_before = self.blocks;
        let txn = self.begin_write_with(durable)?;
        let path = self.path.clone();
        let written = guarded(&path, "writing it", || {
            self.write_blocks(&txn, batch, &mut digest)?;
            self.write_records(&txn, batch, &touched, clock, digest, blocks_before)?;
            txn.open_table(META)
                .map_err(self.engine("open meta table"))?
                .insert(META_FOLDED, encode_count(META_FOLDED, number).as_slice())
                .map_err(self.engine("write folded"))?;
            txn.commit().map_err(self.engine("commit"))
        });
        if let Err(error) = written {
            // Nothing was committed: the count is the stored one again.
            self.blocks = blocks_before;
            return Err(error);
        }
        self.folded = number;
        self.meta.digest = Some(digest);
        for (stream, (floor, head)) in touched {
            self.meta.floor.advance(stream, floor);
            self.meta.heads.advance(stream, head);
        }
        self.meta.clock = clock;
        self.meta.record_chains(batch);
        self.meta.record_seals(batch);
        self.meta.record_forks(batch);
        Ok(())
    }

    /// The `"folded"` record: 0 in a file that has none yet.
    pub(super) fn folded_record(&self) -> Result<u64, DiskError> {
        let read = self.db.begin_read().map_err(self.engine("begin read"))?;
        let meta = read
            .open_table(META)
            .map_err(self.engine("open meta table"))?;
        let record = meta.get(META_FOLDED).map_err(self.engine("read folded"))?;
        match record {
            None => Ok(0),
            Some(value) => decode_count(META_FOLDED, value.value())
                .ok_or_else(|| self.corrupt("the folded record fails its checksum")),
        }
    }

    /// Folds the segment's records after `"folded"` into redb, cuts a torn
    /// tail, and checkpoints: from then on the segment is empty and redb
    /// holds every commit durably, with its allocator state recorded.
    pub(super) fn replay_segment(&mut self) -> Result<(), DiskError> {
        let started = std::time::Instant::now();
        let bytes = Bytes::from(self.segment.read_all()?);
        // Even with nothing to replay the open ends in a checkpoint: after
        // an open on which redb walked the file (asked to, or a file of an
        // older format), its allocator state is recorded only by a durable
        // commit, and until one the next crash would walk the file again.
        if bytes.is_empty() {
            return self.checkpoint();
        }
        let segment_path = self.segment.path().to_path_buf();
        let found = scan(&bytes, self.folded, &segment_path)?;
        let bad = |offset: usize, detail: String| DiskError::Segment {
            path: segment_path.clone(),
            offset: offset as u64 - 8,
            detail,
        };
        let mut replayed = 0u64;
        for (number, body) in found.records {
            if number <= self.folded {
                continue;
            }
            if number != self.folded + 1 {
                return Err(bad(
                    body.start,
                    format!(
                        "record {number} follows record {} (the last redb holds): the records \
                         between are missing",
                        self.folded
                    ),
                ));
            }
            let (_, batch) = decode_batch(&bytes.slice(body.clone()))
                .map_err(|why| bad(body.start, format!("record {number}: {why}")))?;
            let touched = self.plan(&batch).map_err(|error| {
                bad(
                    body.start,
                    format!("record {number} does not apply: {error}"),
                )
            })?;
            self.fold(&batch, touched, number, false)?;
            replayed += 1;
        }
        if let Some((offset, dropped, why)) = &found.torn {
            tracing::warn!(
                path = %segment_path.display(),
                offset,
                bytes = dropped,
                reason = %why,
                "cut a torn record from the segment's tail: an append a crash interrupted, \
                 never acknowledged"
            );
            self.recovery.torn_bytes = *dropped;
        }
        self.recovery.replayed = replayed;
        self.checkpoint()?;
        tracing::info!(
            path = %segment_path.display(),
            replayed,
            segment_bytes = bytes.len(),
            ms = started.elapsed().as_millis() as u64,
            "replayed the write-ahead segment"
        );
        Ok(())
    }

    /// Makes every fold durable in redb (one durable commit), then empties
    /// the segment.
    pub(super) fn checkpoint(&mut self) -> Result<(), DiskError> {
        let txn = self.begin_write()?;
        let path = self.path.clone();
        guarded(&path, "writing it", || {
            txn.open_table(META)
                .map_err(self.engine("open meta table"))?
                .insert(
                    META_FOLDED,
                    encode_count(META_FOLDED, self.folded).as_slice(),
                )
                .map_err(self.engine("write folded"))?;
            txn.commit().map_err(self.engine("checkpoint"))
        })?;
        self.segment.reset()
    }
}

impl Drop for DiskStore {
    /// A clean close: a checkpoint, so that the next open replays nothing.
    /// Not after a failed commit (redb may lack a record the segment
    /// holds, and the checkpoint would empty it), and a failure here is
    /// only logged: the segment still holds every commit.
    fn drop(&mut self) {
        if self.broken || self.segment.len() == 0 {
            return;
        }
        if let Err(error) = self.checkpoint() {
            tracing::warn!(
                %error,
                "the checkpoint on close failed; the next open replays the segment"
            );
        }
    }
}
