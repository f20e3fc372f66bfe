//! The store's side of the fold (`fold`): a commit's path into the
//! write-ahead segment and on to the fold thread, the digest after it,
//! stopping the thread on close, and the fold's test hooks. Apart from
//! `fold` so that `fold` (the thread, its shared state, checkpoints and
//! replay) imports nothing of the store's module, which imports it.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};

use meshlog_cursor::StreamId;

use super::error::DiskError;
use super::fold::{locked, plan, FoldLag};
use super::overlay::Unfolded;
use super::DiskStore;
use crate::{Batch, Digest};

impl DiskStore {
    /// Makes `batch` durable in the segment and hands it to the fold
    /// thread. Refused, with nothing written, if it leaves a hole; refused
    /// altogether after a failure that may have left redb behind the
    /// segment. Waits first while the overlay is full.
    pub(super) fn commit_to_segment(&mut self, batch: &Batch) -> Result<(), DiskError> {
        let refused = |store: &DiskStore, detail: String| {
            let segment = locked(&store.segment);
            DiskError::Segment {
                path: segment.path().to_path_buf(),
                offset: segment.len(),
                detail,
            }
        };
        if let Some(why) = self.fold.refusal() {
            return Err(refused(self, why));
        }
        let touched = plan(&self.meta, &self.path, batch)?;
        let digest = self.digest_after(batch)?;
        let number = self.number + 1;
        let record = Arc::new(Unfolded::new(number, batch, touched));
        self.fold.wait_for_room();
        if let Some(why) = self.fold.refusal() {
            return Err(refused(self, why));
        }
        {
            // The record is pending before the segment is let go: a
            // checkpoint, which holds the segment, then folds it before it
            // empties the segment.
            let mut segment = locked(&self.segment);
            if let Err(error) = segment.append(number, batch) {
                locked(&self.fold.state).broken = true;
                return Err(error);
            }
            self.fold.push(Arc::clone(&record));
        }
        self.number = number;
        self.meta.digest = Some(digest);
        self.meta.clock = self.meta.clock.max(batch.clock);
        for (&stream, &(floor, head)) in &record.touched {
            self.meta.floor.advance(stream, floor);
            self.meta.heads.advance(stream, head);
        }
        self.meta.record_chains(batch);
        self.meta.record_seals(batch);
        self.meta.record_forks(batch);
        Ok(())
    }

    /// The digest after `batch`: the events its floors drop (read through
    /// the current view, from redb or the overlay) out, its events in.
    fn digest_after(&self, batch: &Batch) -> Result<Digest, DiskError> {
        let mut digest = self.meta.digest.unwrap_or_default();
        let mut floors: BTreeMap<StreamId, u64> = BTreeMap::new();
        for &(stream, floor_seq) in &batch.floors {
            let floor = *floors
                .entry(stream)
                .or_insert_with(|| self.meta.floor.get(stream));
            let last = floor_seq.min(self.meta.heads.get(stream));
            if floor_seq > floor && last > floor {
                let view = self.current_view()?;
                let mut scan = view.merged_scan(stream, floor + 1, last)?;
                while let Some(event) = scan.next_event()? {
                    digest.remove(&event);
                }
            }
            floors.insert(stream, floor.max(floor_seq));
        }
        for event in batch.events() {
            digest.add(event);
        }
        Ok(digest)
    }

    /// A test hook: while `held`, the fold thread folds only what the
    /// bounds on the overlay force
    /// ([`DiskOptions::unfolded_records_max`](super::DiskOptions::unfolded_records_max)),
    /// so that reads between commits are served from the overlay.
    pub fn hold_fold(&self, held: bool) {
        locked(&self.fold.state).held = held;
        self.fold.changed.notify_all();
    }

    /// A test hook: while `paused`, the fold thread, after each fold's
    /// redb commit, waits before it trims the overlay, so that a view
    /// taken meanwhile finds its records both in redb's snapshot and in
    /// the overlay. A commit that finds the overlay full waits for the
    /// trim: keep
    /// [`DiskOptions::unfolded_records_max`](super::DiskOptions::unfolded_records_max)
    /// above what the test commits while paused. Let go (`false`), it returns once the
    /// fold thread has left the pause.
    #[doc(hidden)]
    pub fn pause_fold_before_trim(&self, paused: bool) {
        let mut state = locked(&self.fold.state);
        state.pause_before_trim = paused;
        self.fold.changed.notify_all();
        while !paused && state.paused && state.failed.is_none() {
            state = self
                .fold
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// A test hook: waits until the fold thread is paused before a trim
    /// ([`DiskStore::pause_fold_before_trim`]), or has nothing left to
    /// fold, or is held, or has failed; answers whether it is paused.
    #[doc(hidden)]
    pub fn wait_fold_paused(&self) -> bool {
        let mut state = locked(&self.fold.state);
        while !state.paused && !state.pending.is_empty() && !state.held && state.failed.is_none() {
            state = self
                .fold
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.paused
    }

    /// A test hook: while `on`, every view (one per commit) waits between
    /// taking the overlay and redb's snapshot until the fold has written
    /// every record of that overlay, so that the snapshot is as new as
    /// the overlay or newer. Not with the fold held.
    #[doc(hidden)]
    pub fn fold_between_view_reads(&self, on: bool) {
        locked(&self.fold.state).drain_in_view = on;
        self.fold.changed.notify_all();
    }

    /// How far the fold lags: the commits served from memory, not yet
    /// written into redb.
    pub fn fold_lag(&self) -> FoldLag {
        self.fold.lag()
    }

    /// Stops the fold thread: it folds what is left and checkpoints
    /// (unless a failure forbids it), then exits.
    pub(super) fn stop_fold(&mut self) {
        let Some(thread) = self.fold_thread.take() else {
            return;
        };
        {
            let mut state = locked(&self.fold.state);
            state.stop = true;
            state.held = false;
        }
        self.fold.changed.notify_all();
        if thread.join().is_err() {
            tracing::error!(
                path = %self.path.display(),
                "the fold thread panicked; the next open replays the segment"
            );
        }
    }
}

impl Drop for DiskStore {
    /// A clean close: the fold thread folds the rest and checkpoints, so
    /// that the next open replays nothing.
    fn drop(&mut self) {
        self.stop_fold();
    }
}
