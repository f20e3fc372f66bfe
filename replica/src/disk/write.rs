//! The fold's writes: a commit's blocks, stream, chain and seals records,
//! the clock, digest and block count, in one redb write transaction
//! (`fold` calls them, on the fold thread or during an open's replay).

use std::collections::BTreeMap;

use meshlog_cursor::StreamId;
use redb::ReadableTable;

use super::block::{Block, BlockBuilder, BLOCK_EVENTS_MAX};
use super::codec::{
    self, encode_chain, encode_clock, encode_count, encode_seals, encode_stream, META_BLOCKS,
    META_CLOCK, META_DIGEST,
};
use super::error::corrupt_block;
use super::fold::Folder;
use super::{
    chain_record, digest_record, DiskError, BLOCKS, CHAINS, FORKS, META, SEALS, STATEMENTS, STREAMS,
};
use crate::{Batch, Digest, Event, Seal};

impl Folder {
    /// Writes the blocks of a batch, in `txn`: first its floors (dropping
    /// what they cover), then each stream's run of events, counting both
    /// into `digest`.
    pub(super) fn write_blocks(
        &mut self,
        txn: &redb::WriteTransaction,
        batch: &Batch,
        digest: &mut Digest,
    ) -> Result<(), DiskError> {
        // A batch's events are contiguous per stream but may interleave
        // streams: gather each stream's run, in seq order.
        let mut runs: BTreeMap<StreamId, Vec<&Event>> = BTreeMap::new();
        for event in batch.events() {
            runs.entry(event.stream).or_default().push(event);
        }
        let mut table = txn
            .open_table(BLOCKS)
            .map_err(self.engine("open blocks table"))?;
        for &(stream, floor_seq) in &batch.floors {
            if floor_seq > self.meta.floor.get(stream) {
                self.drop_through(&mut table, stream, floor_seq, digest)?;
            }
        }
        for (&stream, events) in &runs {
            for event in events {
                digest.add(event);
            }
            self.append_run(&mut table, stream, events)?;
        }
        Ok(())
    }

    /// Writes the records a commit changes, in `txn`: each touched stream's
    /// `(floor, head)`, the clock if it moved, the digest, and the block
    /// count if it moved from `blocks_before`.
    pub(super) fn write_records(
        &self,
        txn: &redb::WriteTransaction,
        batch: &Batch,
        touched: &BTreeMap<StreamId, (u64, u64)>,
        clock: u64,
        digest: Digest,
        blocks_before: u64,
    ) -> Result<(), DiskError> {
        let mut chains = txn
            .open_table(CHAINS)
            .map_err(self.engine("open chains table"))?;
        for &(stream, ref chain) in &batch.chains {
            let (floor, head) = touched
                .get(&stream)
                .copied()
                .unwrap_or_else(|| (self.meta.floor.get(stream), self.meta.heads.get(stream)));
            // A stream hashed lazily records the seq its hash is at.
            let at = batch
                .hashed
                .binary_search_by_key(&stream, |&(of, _)| of)
                .map_or(head, |at| batch.hashed[at].1);
            let bounds = (floor, at);
            let record = encode_chain(stream, chain_record(bounds, chain));
            chains
                .insert(stream.get(), record.as_slice())
                .map_err(self.engine("write chain record"))?;
        }
        if batch.chains.is_empty() {
            // A batch built without chains: the touched streams' recorded
            // chains are forgotten, and chained again on open.
            for &stream in touched.keys() {
                chains
                    .remove(stream.get())
                    .map_err(self.engine("remove chain record"))?;
            }
        }
        self.write_seals(txn, batch)?;
        self.write_forks(txn, batch)?;
        self.write_statements(txn, batch)?;
        let mut streams = txn
            .open_table(STREAMS)
            .map_err(self.engine("open streams table"))?;
        for (&stream, &(floor, head)) in touched {
            let record = encode_stream(stream, floor, head);
            streams
                .insert(stream.get(), record.as_slice())
                .map_err(self.engine("write stream record"))?;
        }
        let mut meta = txn
            .open_table(META)
            .map_err(self.engine("open meta table"))?;
        if clock != self.meta.clock {
            meta.insert(META_CLOCK, encode_clock(clock).as_slice())
                .map_err(self.engine("write clock"))?;
        }
        meta.insert(META_DIGEST, digest_record(digest).as_slice())
            .map_err(self.engine("write digest"))?;
        if self.blocks != blocks_before {
            meta.insert(
                META_BLOCKS,
                encode_count(META_BLOCKS, self.blocks).as_slice(),
            )
            .map_err(self.engine("write block count"))?;
        }
        Ok(())
    }

    /// Writes the seals records `batch` moves, in `txn` (creating the
    /// table in a format-4 file written before it existed).
    fn write_seals(&self, txn: &redb::WriteTransaction, batch: &Batch) -> Result<(), DiskError> {
        if batch.seals.is_empty() {
            return Ok(());
        }
        let mut seals = txn
            .open_table(SEALS)
            .map_err(self.engine("open seals table"))?;
        for (stream, kept) in &batch.seals {
            let bytes: Vec<[u8; codec::SEAL_LEN]> = kept.seals.iter().map(Seal::to_bytes).collect();
            let record = encode_seals(*stream, kept.key.to_bytes(), &bytes);
            seals
                .insert(stream.get(), record.as_slice())
                .map_err(self.engine("write seals record"))?;
        }
        Ok(())
    }

    /// Writes the proofs `batch` keeps, in `txn` (creating the table in a
    /// file written before it existed); a stream's first proof stays.
    fn write_forks(&self, txn: &redb::WriteTransaction, batch: &Batch) -> Result<(), DiskError> {
        if batch.forks.is_empty() {
            return Ok(());
        }
        let mut forks = txn
            .open_table(FORKS)
            .map_err(self.engine("open forks table"))?;
        for proof in &batch.forks {
            let stream = proof.stream();
            let kept = forks
                .get(stream.get())
                .map_err(self.engine("read forks record"))?
                .is_some();
            if kept {
                continue;
            }
            let record = codec::encode_fork(stream, &proof.to_bytes());
            forks
                .insert(stream.get(), record.as_slice())
                .map_err(self.engine("write forks record"))?;
        }
        Ok(())
    }

    /// Writes the statements records `batch` moves, in `txn` (creating
    /// the table in a file written before it existed).
    fn write_statements(
        &self,
        txn: &redb::WriteTransaction,
        batch: &Batch,
    ) -> Result<(), DiskError> {
        if batch.statements.is_empty() {
            return Ok(());
        }
        let mut table = txn
            .open_table(STATEMENTS)
            .map_err(self.engine("open statements table"))?;
        for statement in &batch.statements {
            let stream = statement.statement.stream;
            let record = codec::encode_statement(stream, &statement.to_bytes());
            table
                .insert(stream.get(), record.as_slice())
                .map_err(self.engine("write statement record"))?;
        }
        Ok(())
    }

    /// Drops the events of `stream` at or below `floor_seq`: reads each
    /// block holding any (their hashes leave the digest), deletes them as
    /// one key range, and writes what is left of the boundary block, if
    /// any, as a block starting at `floor_seq + 1`.
    fn drop_through(
        &mut self,
        table: &mut redb::Table<(u64, u64), &'static [u8]>,
        stream: StreamId,
        floor_seq: u64,
        digest: &mut Digest,
    ) -> Result<(), DiskError> {
        let range = (stream.get(), 0)..=(stream.get(), floor_seq);
        let mut dropped = 0u64;
        let mut rest: Option<BlockBuilder> = None;
        for entry in table
            .range(range.clone())
            .map_err(self.engine("read blocks below the floor"))?
        {
            let (key, value) = entry.map_err(self.engine("read blocks below the floor"))?;
            let first_seq = key.value().1;
            let block = Block::decode(stream, first_seq, value.value())
                .map_err(|detail| self.damaged(stream, first_seq, detail))?;
            let kept_from = if block.last_seq() > floor_seq {
                (floor_seq - first_seq + 1) as usize
            } else {
                block.len()
            };
            for index in 0..kept_from {
                digest.remove(&block.event(stream, index));
            }
            if kept_from < block.len() {
                rest = Some(BlockBuilder::from_block(&block, kept_from));
            }
            dropped += 1;
        }
        table
            .retain_in(range, |_, _| false)
            .map_err(self.engine("delete blocks below the floor"))?;
        self.blocks -= dropped;
        if let Some(mut rest) = rest {
            rest.finish(stream, floor_seq + 1, &mut self.value);
            table
                .insert((stream.get(), floor_seq + 1), self.value.as_slice())
                .map_err(self.engine("write block"))?;
            self.blocks += 1;
        }
        Ok(())
    }

    /// Appends `events`, the next of `stream` in seq order: into its last
    /// block while that has room (the block is read, checked and written
    /// again whole), then into new blocks.
    fn append_run(
        &mut self,
        table: &mut redb::Table<(u64, u64), &'static [u8]>,
        stream: StreamId,
        events: &[&Event],
    ) -> Result<(), DiskError> {
        let Some(first_event) = events.first() else {
            return Ok(());
        };
        let last = {
            let mut range = table
                .range((stream.get(), 0)..=(stream.get(), u64::MAX))
                .map_err(self.engine("read the last block"))?;
            match range.next_back() {
                Some(entry) => {
                    let (key, value) = entry.map_err(self.engine("read the last block"))?;
                    let first_seq = key.value().1;
                    Some(
                        Block::decode(stream, first_seq, value.value())
                            .map_err(|detail| self.damaged(stream, first_seq, detail))?,
                    )
                }
                None => None,
            }
        };
        let (mut builder, mut first_seq) = match last {
            Some(block) => {
                if block.last_seq().checked_add(1) != Some(first_event.seq) {
                    return Err(self.corrupt(format!(
                        "stream {stream}: the last block ends at seq {}, but the stream \
                         record's head is {}",
                        block.last_seq(),
                        first_event.seq - 1
                    )));
                }
                // A full block is not copied into a builder only to be
                // left as it is.
                let builder = (block.len() < BLOCK_EVENTS_MAX)
                    .then(|| BlockBuilder::from_block(&block, 0))
                    .filter(|builder| builder.has_room(first_event.payload.len()));
                match builder {
                    Some(builder) => (builder, block.first_seq()),
                    None => (BlockBuilder::default(), first_event.seq),
                }
            }
            None => (BlockBuilder::default(), first_event.seq),
        };
        // The block read back is rewritten under its own key; every other
        // block is new.
        let extends = builder.len() > 0;
        let mut new_blocks = 0u64;
        for event in events {
            if !builder.has_room(event.payload.len()) {
                builder.finish(stream, first_seq, &mut self.value);
                table
                    .insert((stream.get(), first_seq), self.value.as_slice())
                    .map_err(self.engine("write block"))?;
                new_blocks += 1;
                first_seq = event.seq;
            }
            builder.push_event(event);
        }
        builder.finish(stream, first_seq, &mut self.value);
        table
            .insert((stream.get(), first_seq), self.value.as_slice())
            .map_err(self.engine("write block"))?;
        new_blocks += 1;
        self.blocks += new_blocks - u64::from(extends);
        Ok(())
    }

    fn damaged(&self, stream: StreamId, first_seq: u64, detail: String) -> DiskError {
        corrupt_block(&self.path, stream, first_seq, detail)
    }
}
