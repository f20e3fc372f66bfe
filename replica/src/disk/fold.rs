//! The commit path through the write-ahead segment, the fold thread, and
//! recovery.
//!
//! A commit is checked against the heads (`plan`), appended to the
//! segment as one record and synced (`fdatasync`): from then on it is
//! durable, and [`Store::commit`](crate::Store::commit) returns. The fold
//! thread writes it into redb later, in a write transaction that is *not*
//! durable (`Durability::None`), together with every other record that
//! waited meanwhile. Until redb holds it, reads serve it from memory
//! (`overlay`): a view is a redb snapshot and the records after it.
//! The fold lets records gather ([`DiskOptions::fold_records`], at most
//! [`DiskOptions::fold_linger`] for the oldest) and is woken only then,
//! so that it neither wakes nor runs a redb transaction per commit.
//!
//! What the fold may lag is bounded ([`DiskOptions::unfolded_records_max`],
//! [`DiskOptions::unfolded_bytes_max`]): a commit
//! that finds the overlay full waits for the fold, so memory stays
//! bounded whatever the disk does.
//!
//! Every [`DiskOptions::checkpoint_records`] records
//! (or bytes) the fold thread checkpoints: it holds the segment (commits
//! wait for that moment), folds what is left in one *durable* redb commit,
//! which makes every fold before it durable too, and empties the segment
//! (written again from offset 0, `segment`).
//! The `meta` record `"folded"`, written in each fold's transaction, says
//! which record redb holds last, so the records of the segment at or below
//! it are known folded, whatever the segment still holds.
//!
//! On open, the records after `"folded"` are folded again, in order, and
//! a checkpoint follows if any was (or redb walked the file), before the
//! thread starts; a torn tail record is
//! cut with a warning; damage before the tail is refused
//! (`segment::scan`). redb itself opens on its last durable commit, which
//! recorded its allocator state ("quick repair"), so it reads no more of
//! the file than a clean open does.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshlog_cursor::StreamId;
use redb::ReadableDatabase;

use super::codec::{decode_count, encode_count, META_FOLDED};
use super::db::{begin_write_with, Db, META};
use super::error::DiskError;
use super::error::{engine_error, guarded};
use super::options::{DiskOptions, Recovery};
use super::overlay::{Overlay, Unfolded};
use super::record::decode_batch;
use super::segment::{scan, Segment};
use crate::{Batch, StoreMeta};

/// What the fold thread writes with: redb, and what redb holds.
pub(super) struct Folder {
    pub(super) dir: PathBuf,
    pub(super) path: PathBuf,
    pub(super) db: Arc<Db>,
    /// What redb holds (the store's `meta` is what the commits returned).
    pub(super) meta: StoreMeta,
    /// How many blocks the blocks table holds.
    pub(super) blocks: u64,
    /// Scratch for laying out a block value.
    pub(super) value: Vec<u8>,
    /// The number of the last segment record redb holds.
    pub(super) folded: u64,
}

/// How the fold thread and the committer share the unfolded records.
#[derive(Debug, Default)]
pub(super) struct FoldShared {
    pub(super) state: Mutex<FoldState>,
    /// Notified whenever `state` changes.
    pub(super) changed: Condvar,
}

#[derive(Debug, Default)]
pub(super) struct FoldState {
    /// The records appended and not yet folded, in order.
    pub(super) pending: VecDeque<Arc<Unfolded>>,
    /// Their bytes ([`Unfolded::bytes`]).
    pending_bytes: u64,
    /// The most records and bytes `pending` holds before a commit waits.
    max: (usize, u64),
    /// How many records the fold lets gather, and how long the oldest
    /// waits at most (`DiskOptions::fold_records`, `fold_linger`).
    gather: (usize, Duration),
    /// When `pending` last became non-empty: when its oldest record came.
    oldest_at: Option<Instant>,
    /// The fold failed: redb lacks records the segment holds, and no
    /// commit may follow until the store is reopened and replays them.
    pub(super) failed: Option<String>,
    /// An append failed after its record may have reached the segment:
    /// no commit and no checkpoint (which would empty the segment) may
    /// follow until the store is reopened.
    pub(super) broken: bool,
    /// The test hook `DiskStore::hold_fold`: fold only what the bounds
    /// force.
    pub(super) held: bool,
    /// The store is closing: fold what is left, checkpoint, stop.
    pub(super) stop: bool,
    /// The test hook `DiskStore::pause_fold_before_trim`: after each
    /// fold's redb commit, the fold thread waits before it trims the
    /// overlay.
    pub(super) pause_before_trim: bool,
    /// The fold thread waits there now (redb holds records the overlay
    /// still serves).
    pub(super) paused: bool,
    /// The test hook `DiskStore::fold_between_view_reads`: a view waits
    /// between taking the overlay and redb's snapshot until the fold has
    /// written every record of that overlay.
    pub(super) drain_in_view: bool,
}

impl FoldState {
    fn full(&self) -> bool {
        !self.pending.is_empty()
            && (self.pending.len() >= self.max.0 || self.pending_bytes >= self.max.1)
    }

    /// Whether the pending records are to be folded now without waiting
    /// for more: enough have gathered, a commit waits for room, the store
    /// closes, or a test hook waits for the fold. Otherwise the fold
    /// waits until the oldest has lingered (`next_records`).
    fn gathered(&self) -> bool {
        self.pending.len() >= self.gather.0
            || self.full()
            || self.stop
            || self.pause_before_trim
            || self.drain_in_view
    }
}

/// How many commits the fold has yet to write into redb, and their bytes
/// ([`DiskStore::fold_lag`](super::DiskStore::fold_lag)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FoldLag {
    /// Commits served from memory, not yet in redb.
    pub records: u64,
    /// Their events' bytes (payloads and per-event overhead).
    pub bytes: u64,
}

pub(super) fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FoldShared {
    /// With the bounds on the overlay of `options`.
    pub(super) fn new(options: &DiskOptions) -> FoldShared {
        let shared = FoldShared::default();
        {
            let mut state = locked(&shared.state);
            state.max = (
                options.unfolded_records_max.max(1),
                options.unfolded_bytes_max,
            );
            state.gather = (options.fold_records.max(1), options.fold_linger);
        }
        shared
    }

    /// Why no commit may follow, if one may not.
    pub(super) fn refusal(&self) -> Option<String> {
        let state = locked(&self.state);
        if let Some(why) = &state.failed {
            return Some(format!(
                "the fold into redb failed ({why}); reopen the store to replay the segment"
            ));
        }
        state.broken.then(|| {
            "an earlier commit failed after its record may have reached the segment; reopen \
             the store to replay it"
                .to_string()
        })
    }

    /// Waits while the overlay is full (the fold makes room, or fails).
    pub(super) fn wait_for_room(&self) {
        let mut state = locked(&self.state);
        while state.full() && state.failed.is_none() {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Hands a durable record to the fold. Wakes the fold thread only
    /// when it has something to do: the first record after none (it then
    /// sleeps until the record has lingered) or once enough gathered.
    /// Nothing else waits for a record to arrive.
    pub(super) fn push(&self, record: Arc<Unfolded>) {
        let mut state = locked(&self.state);
        let first = state.pending.is_empty();
        if first {
            state.oldest_at = Some(Instant::now());
        }
        state.pending_bytes += record.bytes;
        state.pending.push_back(record);
        if first || state.gathered() {
            self.changed.notify_all();
        }
    }

    /// The records a view serves besides redb's snapshot: take it before
    /// the snapshot, so that the snapshot holds at least every record
    /// before them.
    pub(super) fn overlay(&self) -> Overlay {
        Overlay::new(locked(&self.state).pending.iter().cloned().collect())
    }

    /// The next records to fold, once there are any (and the hook does
    /// not hold them back); `None` once the store is closing and every
    /// record is folded.
    /// Records gather first (`FoldState::gathered`), for at most the
    /// linger since the oldest came, so that one redb transaction folds
    /// many commits and the fold wakes once for them, not once a commit.
    fn next_records(&self) -> Option<Vec<Arc<Unfolded>>> {
        let mut state = locked(&self.state);
        loop {
            let allowed = !state.pending.is_empty() && (!state.held || state.full() || state.stop);
            let waited = state.oldest_at.map_or(Duration::ZERO, |at| at.elapsed());
            let linger = state.gather.1.saturating_sub(waited);
            if allowed && (state.gathered() || linger.is_zero()) {
                return Some(state.pending.iter().cloned().collect());
            }
            if state.stop {
                return None;
            }
            state = if allowed {
                self.changed
                    .wait_timeout(state, linger)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            } else {
                self.changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner)
            };
        }
    }

    /// The test hook's pause between a fold's redb commit and the trim of
    /// the overlay (`DiskStore::pause_fold_before_trim`); not on close.
    fn pause_point(&self) {
        let mut state = locked(&self.state);
        while state.pause_before_trim && !state.stop {
            state.paused = true;
            self.changed.notify_all();
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.paused = false;
        self.changed.notify_all();
    }

    /// The test hook's wait between a view's two reads
    /// (`DiskStore::fold_between_view_reads`): until the fold has
    /// written every pending record into redb (trimmed, or paused before
    /// the trim), or failed.
    pub(super) fn view_pause_point(&self) {
        let mut state = locked(&self.state);
        while state.drain_in_view
            && !state.pending.is_empty()
            && !state.paused
            && !state.held
            && state.failed.is_none()
        {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The first `count` pending records are in redb now.
    fn folded(&self, count: usize) {
        let mut state = locked(&self.state);
        for record in state.pending.drain(..count).collect::<Vec<_>>() {
            state.pending_bytes -= record.bytes;
        }
        // The records that came during the fold have waited since then
        // at most: their linger starts now.
        state.oldest_at = (!state.pending.is_empty()).then(Instant::now);
        self.changed.notify_all();
    }

    fn fail(&self, error: &DiskError) {
        tracing::error!(%error, "the fold into redb failed; the store refuses commits until reopened");
        locked(&self.state).failed = Some(error.to_string());
        self.changed.notify_all();
    }

    /// The fold thread panicked: nothing will make room in the overlay
    /// again, so commits are refused rather than left waiting.
    pub(super) fn panicked(&self, why: String) {
        tracing::error!(%why, "the fold thread stopped; the store refuses commits until reopened");
        locked(&self.state).failed.get_or_insert(why);
        self.changed.notify_all();
    }

    fn usable(&self) -> bool {
        let state = locked(&self.state);
        state.failed.is_none() && !state.broken
    }

    pub(super) fn lag(&self) -> FoldLag {
        let state = locked(&self.state);
        FoldLag {
            records: state.pending.len() as u64,
            bytes: state.pending_bytes,
        }
    }
}

/// The fold thread: folds what waits, checkpoints when the segment is
/// due, and on close folds the rest and checkpoints once more.
pub(super) fn run(
    mut folder: Folder,
    shared: Arc<FoldShared>,
    segment: Arc<Mutex<Segment>>,
    checkpoint_at: (u64, u64),
) {
    while let Some(records) = shared.next_records() {
        if let Err(error) = folder.fold(&records, false) {
            return shared.fail(&error);
        }
        shared.pause_point();
        shared.folded(records.len());
        let due = {
            let segment = locked(&segment);
            segment.records() >= checkpoint_at.0 || segment.len() >= checkpoint_at.1
        };
        if due {
            if let Err(error) = checkpoint(&mut folder, &shared, &segment) {
                return shared.fail(&error);
            }
        }
    }
    if locked(&segment).len() > 0 {
        if let Err(error) = checkpoint(&mut folder, &shared, &segment) {
            tracing::warn!(
                %error,
                "the checkpoint on close failed; the next open replays the segment"
            );
        }
    }
    let mut segment = locked(&segment);
    if segment.len() == 0 && shared.usable() {
        if let Err(error) = segment.cut_on_close() {
            tracing::warn!(
                %error,
                "emptying the segment on close failed; the next open reads it through"
            );
        }
    }
}

/// Holds the segment (a commit waits meanwhile: every record appended is
/// then pending), folds what is pending in one durable commit and empties
/// the segment. Not after a failed append: redb may lack a record the
/// segment holds, and emptying it would lose it.
fn checkpoint(
    folder: &mut Folder,
    shared: &FoldShared,
    segment: &Mutex<Segment>,
) -> Result<(), DiskError> {
    let mut segment = locked(segment);
    if !shared.usable() {
        return Ok(());
    }
    let rest: Vec<Arc<Unfolded>> = locked(&shared.state).pending.iter().cloned().collect();
    folder.fold(&rest, true)?;
    shared.folded(rest.len());
    segment.reset()
}

/// Checks that `batch` keeps every stream gap-free against `meta` (what
/// the store at `path` holds), and returns the per-stream `(floor, head)`
/// after it.
pub(super) fn plan(
    meta: &StoreMeta,
    path: &Path,
    batch: &Batch,
) -> Result<BTreeMap<StreamId, (u64, u64)>, DiskError> {
    let mut touched: BTreeMap<StreamId, (u64, u64)> = BTreeMap::new();
    let stored = |stream: StreamId| (meta.floor.get(stream), meta.heads.get(stream));
    for &(stream, floor_seq) in &batch.floors {
        let (floor, head) = touched.entry(stream).or_insert_with(|| stored(stream));
        *floor = (*floor).max(floor_seq);
        *head = (*head).max(floor_seq);
    }
    for event in batch.events() {
        let (_, head) = touched
            .entry(event.stream)
            .or_insert_with(|| stored(event.stream));
        let refused = |detail: String| DiskError::BatchRefused {
            path: path.to_path_buf(),
            stream: event.stream,
            detail,
        };
        // Checked: a head read from disk (or raised by a floor) may be
        // `u64::MAX`, and nothing follows it.
        if head.checked_add(1) != Some(event.seq) {
            return Err(refused(format!(
                "seq {} does not follow head {head}",
                event.seq
            )));
        }
        if u32::try_from(event.payload.len()).is_err() {
            return Err(refused(format!(
                "seq {} has a payload over 4 GiB",
                event.seq
            )));
        }
        *head = event.seq;
    }
    Ok(touched)
}

impl Folder {
    /// Writes `records` (the next after `folded`, in order) into redb in
    /// one write transaction, durable or not, with the `"folded"` record;
    /// with none, only the `"folded"` record (a checkpoint).
    pub(super) fn fold(
        &mut self,
        records: &[Arc<Unfolded>],
        durable: bool,
    ) -> Result<(), DiskError> {
        let number = records.last().map_or(self.folded, |record| record.number);
        let txn = begin_write_with(&self.db, durable, self.engine("begin write"))?;
        let path = self.path.clone();
        guarded(&path, "writing it", || {
            for record in records {
                self.fold_one(&txn, &record.batch, &record.touched)?;
            }
            txn.open_table(META)
                .map_err(self.engine("open meta table"))?
                .insert(META_FOLDED, encode_count(META_FOLDED, number).as_slice())
                .map_err(self.engine("write folded"))?;
            txn.commit().map_err(self.engine("commit"))
        })?;
        self.folded = number;
        Ok(())
    }

    /// Writes one commit in `txn`, and records it in `meta`. A failure
    /// leaves `meta` and the block count ahead of redb: the fold has
    /// failed then, and the store is reopened before anything follows.
    fn fold_one(
        &mut self,
        txn: &redb::WriteTransaction,
        batch: &Batch,
        touched: &BTreeMap<StreamId, (u64, u64)>,
    ) -> Result<(), DiskError> {
        let clock = self.meta.clock.max(batch.clock);
        let mut digest = self.meta.digest.unwrap_or_default();
        let blocks_before = self.blocks;
        self.write_blocks(txn, batch, &mut digest)?;
        self.write_records(txn, batch, touched, clock, digest, blocks_before)?;
        self.meta.digest = Some(digest);
        for (&stream, &(floor, head)) in touched {
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
    pub(super) fn replay(
        &mut self,
        segment: &mut Segment,
        recovery: &mut Recovery,
        walked: bool,
    ) -> Result<(), DiskError> {
        let started = std::time::Instant::now();
        let bytes = Bytes::from(segment.read_all()?);
        // With nothing to replay, the open ends in a checkpoint only when
        // redb walked the file (`walked`: its recovery ran, asked to or
        // after an unclean shutdown, or the file was of an older format):
        // its allocator state is then recorded only by a durable commit,
        // and until one the next crash would walk the file again. After a
        // clean close the last checkpoint holds it already, and an open
        // writes nothing: a file damaged since (which redb trusts then) is
        // read, and refused where it is damaged, but never written, since
        // a write through damaged allocator state can panic twice inside
        // the engine, which aborts the process where one panic is caught.
        if bytes.is_empty() {
            if walked {
                self.fold(&[], true)?;
            }
            return segment.reset();
        }
        let segment_path = segment.path().to_path_buf();
        let found = scan(&bytes, self.folded, &segment_path)?;
        let replayed = self.replay_records(&bytes, found.records, &segment_path)?;
        if let Some((offset, dropped, why)) = &found.torn {
            tracing::warn!(
                path = %segment_path.display(),
                offset,
                bytes = dropped,
                reason = %why,
                "cut a torn record from the segment's tail: an append a crash interrupted, \
                 never acknowledged"
            );
            recovery.torn_bytes = *dropped;
        }
        recovery.replayed = replayed;
        // The segment is not emptied by truncation (`Segment::reset`): it
        // may still hold records redb has (a close that could not empty it,
        // a crash after a checkpoint), and replaying none needs no durable
        // commit, as above.
        if replayed > 0 || walked {
            self.fold(&[], true)?;
        }
        segment.reset()?;
        tracing::info!(
            path = %segment_path.display(),
            replayed,
            segment_bytes = bytes.len(),
            ms = started.elapsed().as_millis() as u64,
            "replayed the write-ahead segment"
        );
        Ok(())
    }

    /// Folds the scanned `records` of the segment's `bytes` after
    /// `"folded"`, in order, each in a fold of its own (not durable), and
    /// answers how many. A record missing between them, or one that does
    /// not decode or apply, refuses the open, naming its offset.
    fn replay_records(
        &mut self,
        bytes: &Bytes,
        records: Vec<(u64, Range<usize>)>,
        segment_path: &Path,
    ) -> Result<u64, DiskError> {
        let bad = |offset: usize, detail: String| DiskError::Segment {
            path: segment_path.to_path_buf(),
            offset: offset as u64 - 8,
            detail,
        };
        let mut replayed = 0u64;
        for (number, body) in records {
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
            let touched = plan(&self.meta, &self.path, &batch).map_err(|error| {
                bad(
                    body.start,
                    format!("record {number} does not apply: {error}"),
                )
            })?;
            self.fold(&[Arc::new(Unfolded::new(number, &batch, touched))], false)?;
            replayed += 1;
        }
        Ok(replayed)
    }

    pub(super) fn engine<E: Into<redb::Error>>(
        &self,
        op: &'static str,
    ) -> impl FnOnce(E) -> DiskError + '_ {
        move |error| engine_error(&self.dir, &self.path, op, error.into())
    }

    pub(super) fn corrupt(&self, detail: impl Into<String>) -> DiskError {
        DiskError::Corrupt {
            path: self.path.clone(),
            detail: detail.into(),
        }
    }
}
