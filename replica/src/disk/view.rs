//! `DiskView`: the blocks table as of one commit, read through redb's
//! bounded page cache; what a replica on a [`DiskStore`](super::DiskStore)
//! reads its events through.
//!
//! A scan reads one block per redb step and hands out its events as
//! slices of the block's one buffer. A point read (`event`, `lamport`)
//! finds the block holding the seq with one seek: the last block keyed at
//! or below `(stream, seq)`. Every block read is crc-checked; every gap
//! between blocks, and every seq the caller says is held but no block
//! holds, is reported as damage naming the file.
//!
//! A scan that stops inside a block (a page ends there) leaves that block
//! with the view, so that the next page, which resumes at the next seq,
//! starts without reading it again: at most [`TAIL_BLOCKS_MAX`] blocks, one
//! per stream, for as long as the view (one commit) lives.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use meshlog_cursor::StreamId;

use super::block::{Block, BLOCK_BYTES_TARGET};
use super::error::{corrupt_block, engine_error, guarded, DiskError};
use super::overlay::{Overlay, OverlayScan};
use crate::mem::{ReadError, Source, StreamScan};
use crate::Event;

pub(crate) type BlocksTable = redb::ReadOnlyTable<(u64, u64), &'static [u8]>;
type BlocksRange = redb::Range<'static, (u64, u64), &'static [u8]>;

/// The most blocks a view keeps where scans stopped (each at most
/// `BLOCK_BYTES_TARGET` or one event's payload): 256 blocks of 32 KiB, 8 MiB.
pub(crate) const TAIL_BLOCKS_MAX: usize = 256;

/// A snapshot of the blocks table as of one fold, and the commits after
/// it that the fold thread has not written yet (`overlay`): together, the
/// events as of one commit.
pub(crate) struct DiskView {
    pub(super) path: PathBuf,
    pub(super) blocks: BlocksTable,
    pub(super) overlay: Overlay,
    /// Per stream, the block the last scan of it stopped in.
    pub(super) tails: Mutex<HashMap<StreamId, Block>>,
}

impl DiskView {
    pub(super) fn new(path: PathBuf, blocks: BlocksTable, overlay: Overlay) -> DiskView {
        DiskView {
            path,
            blocks,
            overlay,
            tails: Mutex::new(HashMap::new()),
        }
    }

    /// The block a scan of `stream` stopped in, if it holds `seq`.
    fn tail_holding(&self, stream: StreamId, seq: u64) -> Option<Block> {
        let tails = self.tails.lock().unwrap_or_else(PoisonError::into_inner);
        tails.get(&stream).filter(|block| block.holds(seq)).cloned()
    }

    fn keep_tail(&self, stream: StreamId, block: Block) {
        // A block over the byte target holds one large event: not kept, so
        // that the tails stay within TAIL_BLOCKS_MAX blocks of the target.
        if block.byte_len() > BLOCK_BYTES_TARGET {
            return;
        }
        let mut tails = self.tails.lock().unwrap_or_else(PoisonError::into_inner);
        if tails.len() >= TAIL_BLOCKS_MAX && !tails.contains_key(&stream) {
            if let Some(&evicted) = tails.keys().next() {
                tails.remove(&evicted);
            }
        }
        tails.insert(stream, block);
    }

    fn engine(&self, op: &'static str) -> impl FnOnce(redb::StorageError) -> DiskError + '_ {
        move |error| {
            let dir = self.path.parent().unwrap_or(&self.path);
            engine_error(dir, &self.path, op, error.into())
        }
    }

    fn damaged(&self, stream: StreamId, first_seq: u64, detail: String) -> DiskError {
        corrupt_block(&self.path, stream, first_seq, detail)
    }

    /// Runs a read of the engine, turning a panic inside it (which a file
    /// damaged outside redb can provoke on a read, as on an open) into
    /// damage naming the file.
    fn guarded<T>(&self, read: impl FnOnce() -> Result<T, DiskError>) -> Result<T, DiskError> {
        guarded(&self.path, "reading it", read)
    }

    /// The block holding `(stream, seq)`, if any.
    pub(super) fn block_at(&self, stream: StreamId, seq: u64) -> Result<Option<Block>, DiskError> {
        self.guarded(|| {
            let mut range = self
                .blocks
                .range((stream.get(), 0)..=(stream.get(), seq))
                .map_err(self.engine("read blocks"))?;
            let Some(entry) = range.next_back() else {
                return Ok(None);
            };
            let (key, value) = entry.map_err(self.engine("read blocks"))?;
            let first_seq = key.value().1;
            let block = Block::decode(stream, first_seq, value.value())
                .map_err(|detail| self.damaged(stream, first_seq, detail))?;
            Ok(block.holds(seq).then_some(block))
        })
    }

    /// The block holding `(stream, seq)`, which the caller knows is held.
    fn held_block(&self, stream: StreamId, seq: u64) -> Result<Block, DiskError> {
        self.block_at(stream, seq)?
            .ok_or_else(|| DiskError::Corrupt {
                path: self.path.clone(),
                detail: format!("stream {stream} seq {seq} is held, but no block holds it"),
            })
    }

    /// A scan of `stream`'s events `first ..= last`, all of which the
    /// caller knows are held.
    pub(super) fn scan_blocks(
        &self,
        stream: StreamId,
        first: u64,
        last: u64,
    ) -> Result<BlockScan<'_>, DiskError> {
        let block = if first <= last {
            match self.tail_holding(stream, first) {
                Some(block) => Some(block),
                None => Some(self.held_block(stream, first)?),
            }
        } else {
            None
        };
        Ok(BlockScan {
            view: self,
            stream,
            rest: None,
            block,
            next_seq: first,
            last,
            done: false,
        })
    }
}

impl DiskView {
    /// The events of `stream` with seqs `first ..= last`, all of which the
    /// caller knows are held, from redb's blocks and the overlay: the one
    /// place the two are merged (`overlay`'s rule), for pages, point reads
    /// and `read_stream` alike.
    pub(super) fn merged_scan(
        &self,
        stream: StreamId,
        first: u64,
        last: u64,
    ) -> Result<MergedScan<'_>, DiskError> {
        let from = self.overlay.first_seq(stream).filter(|&from| from <= last);
        let blocks_last = from.map_or(last, |from| last.min(from - 1));
        let blocks = if first <= blocks_last {
            Some(self.scan_blocks(stream, first, blocks_last)?)
        } else {
            None
        };
        let overlay = match from {
            Some(from) => self.overlay.scan(stream, first.max(from), last),
            None => self.overlay.scan(stream, 1, 0),
        };
        Ok(MergedScan { blocks, overlay })
    }

    /// The held event `(stream, seq)`, by the same rule.
    fn event_at(&self, stream: StreamId, seq: u64) -> Result<Option<Event>, DiskError> {
        if let Some(event) = self.overlay.event(stream, seq) {
            return Ok(Some(event.clone()));
        }
        let block = self.block_at(stream, seq)?;
        Ok(block.map(|block| block.event(stream, (seq - block.first_seq()) as usize)))
    }
}

impl Source for DiskView {
    fn lamport(&self, stream: StreamId, seq: u64) -> Result<Option<u64>, ReadError> {
        if let Some(event) = self.overlay.event(stream, seq) {
            return Ok(Some(event.lamport));
        }
        let block = self.block_at(stream, seq)?;
        Ok(block.map(|block| block.lamport((seq - block.first_seq()) as usize)))
    }

    fn event(&self, stream: StreamId, seq: u64) -> Result<Option<Event>, ReadError> {
        Ok(self.event_at(stream, seq)?)
    }

    fn scan<'a>(
        &'a self,
        stream: StreamId,
        first: u64,
        last: u64,
    ) -> Result<Box<dyn StreamScan + 'a>, ReadError> {
        Ok(Box::new(self.merged_scan(stream, first, last)?))
    }
}

/// One stream's events `next_seq ..= last`, block by block.
pub(crate) struct BlockScan<'a> {
    view: &'a DiskView,
    stream: StreamId,
    /// The blocks after the first, opened when the scan first leaves it.
    rest: Option<BlocksRange>,
    /// The block holding `next_seq` (or the one before it, exhausted).
    block: Option<Block>,
    next_seq: u64,
    last: u64,
    /// `last` was taken (`next_seq` cannot pass a `last` of `u64::MAX`).
    done: bool,
}

impl BlockScan<'_> {
    /// The next event's block and its index there, reading the next block
    /// when the current one is used up; `None` past `last`.
    fn position(&mut self) -> Result<Option<(&Block, usize)>, DiskError> {
        if self.done || self.next_seq > self.last {
            return Ok(None);
        }
        let current = self
            .block
            .as_ref()
            .expect("a scan with seqs left has a block");
        if !current.holds(self.next_seq) {
            let next = self.next_block()?;
            self.block = Some(next);
        }
        let block = self.block.as_ref().expect("just set");
        Ok(Some((block, (self.next_seq - block.first_seq()) as usize)))
    }

    fn next_block(&mut self) -> Result<Block, DiskError> {
        let view = self.view;
        let (stream, next_seq, last) = (self.stream, self.next_seq, self.last);
        let rest = &mut self.rest;
        view.guarded(|| {
            if rest.is_none() {
                let range = view
                    .blocks
                    .range((stream.get(), next_seq)..=(stream.get(), last))
                    .map_err(view.engine("read blocks"))?;
                *rest = Some(range);
            }
            let range = rest.as_mut().expect("just opened");
            let Some(entry) = range.next() else {
                return Err(DiskError::Corrupt {
                    path: view.path.clone(),
                    detail: format!(
                        "stream {stream} seqs {next_seq}..={last} are held, but no block holds them"
                    ),
                });
            };
            let (key, value) = entry.map_err(view.engine("read blocks"))?;
            let first_seq = key.value().1;
            if first_seq != next_seq {
                return Err(DiskError::Corrupt {
                    path: view.path.clone(),
                    detail: format!(
                        "stream {stream}: the block after seq {} starts at seq {first_seq}",
                        next_seq - 1
                    ),
                });
            }
            Block::decode(stream, first_seq, value.value())
                .map_err(|detail| view.damaged(stream, first_seq, detail))
        })
    }

    /// The next event, if any, without the `ReadError` boxing.
    pub(super) fn next_event(&mut self) -> Result<Option<Event>, DiskError> {
        let stream = self.stream;
        let event = self
            .position()?
            .map(|(block, index)| block.event(stream, index));
        if event.is_some() {
            match self.next_seq.checked_add(1) {
                Some(next) if self.next_seq < self.last => self.next_seq = next,
                _ => self.done = true,
            }
        }
        Ok(event)
    }
}

impl Drop for BlockScan<'_> {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            if !self.done && block.holds(self.next_seq) {
                self.view.keep_tail(self.stream, block);
            }
        }
    }
}

/// One stream's events from redb's blocks, then from the overlay
/// ([`DiskView::merged_scan`]).
pub(crate) struct MergedScan<'a> {
    blocks: Option<BlockScan<'a>>,
    overlay: OverlayScan,
}

impl MergedScan<'_> {
    /// The next event, if any.
    pub(super) fn next_event(&mut self) -> Result<Option<Event>, DiskError> {
        if let Some(blocks) = &mut self.blocks {
            if let Some(event) = blocks.next_event()? {
                return Ok(Some(event));
            }
        }
        let event = self.overlay.peek().cloned();
        if event.is_some() {
            self.overlay.advance();
        }
        Ok(event)
    }
}

impl StreamScan for MergedScan<'_> {
    fn peek(&mut self) -> Result<Option<u64>, ReadError> {
        if let Some(blocks) = &mut self.blocks {
            if let Some((block, index)) = blocks.position()? {
                return Ok(Some(block.lamport(index)));
            }
        }
        Ok(self.overlay.peek().map(|event| event.lamport))
    }

    fn take(&mut self) -> Result<Event, ReadError> {
        self.next_event()?
            .ok_or_else(|| "take past the end of a scan".into())
    }
}
