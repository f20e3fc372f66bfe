//! The commits redb does not hold yet, served from memory.
//!
//! A commit returns once its record is durable in the segment; the fold
//! thread writes it into redb later (`fold`). Until then its events live
//! here: each unfolded commit is an [`Unfolded`] record, shared (`Arc`)
//! by the fold queue and by every view taken while it was unfolded. A view
//! is a redb snapshot plus the records after the last one that snapshot
//! held (or a few more: a record both hold gives the same events).
//!
//! The one merge rule, [`Overlay::first_seq`]: of a stream, every held seq
//! at or above the overlay's first seq of that stream is in the overlay,
//! every held seq below it is in redb. (The overlay's events of a stream
//! continue redb's head; a seq between redb's head and the overlay's
//! first is one a floor in the overlay skipped, and so is not held.)
//! `DiskView` reads through it for pages, `read_stream` and point reads.

use std::collections::BTreeMap;
use std::sync::Arc;

use meshlog_cursor::StreamId;

use crate::{Batch, Event};

/// One commit whose record is durable in the segment: what the fold
/// writes into redb, and what reads serve until it has.
#[derive(Debug)]
pub(super) struct Unfolded {
    /// Its record's number in the segment.
    pub(super) number: u64,
    /// The commit, owned: its events ordered by `(stream, seq)`.
    pub(super) batch: Batch<'static>,
    /// Per stream it touches, `(floor, head)` after it (`plan`).
    pub(super) touched: BTreeMap<StreamId, (u64, u64)>,
    /// Its events' payload bytes and per-event overhead, for the bound on
    /// what the overlay holds.
    pub(super) bytes: u64,
}

impl Unfolded {
    /// The owned copy of `batch` (payloads are shared, not copied), record
    /// `number`, whose plan answered `touched`.
    pub(super) fn new(
        number: u64,
        batch: &Batch,
        touched: BTreeMap<StreamId, (u64, u64)>,
    ) -> Unfolded {
        let mut events: Vec<Event> = batch.events().cloned().collect();
        // Stable: each stream's events stay in seq order.
        events.sort_by_key(|event| event.stream);
        let bytes = events.iter().map(|event| event.size_hint() as u64).sum();
        let mut owned = Batch::from_events(events)
            .with_floors(batch.floors.clone())
            .with_clock(batch.clock);
        owned.chains = batch.chains.clone();
        owned.hashed = batch.hashed.clone();
        owned.seals = batch.seals.clone();
        owned.forks = batch.forks.clone();
        owned.statements = batch.statements.clone();
        Unfolded {
            number,
            batch: owned,
            touched,
            bytes,
        }
    }

    /// Its events of `stream`, in seq order.
    fn events_of(&self, stream: StreamId) -> &[Event] {
        let events = self.batch.runs().next().unwrap_or(&[]);
        let from = events.partition_point(|event| event.stream < stream);
        let to = events.partition_point(|event| event.stream <= stream);
        &events[from..to]
    }
}

/// The unfolded commits a view serves besides its redb snapshot, in
/// record order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overlay {
    records: Arc<[Arc<Unfolded>]>,
}

impl Overlay {
    pub(super) fn new(records: Vec<Arc<Unfolded>>) -> Overlay {
        Overlay {
            records: records.into(),
        }
    }

    /// The merge rule (module docs): the first seq of `stream` the overlay
    /// holds; every held seq from it up is served from here.
    pub(super) fn first_seq(&self, stream: StreamId) -> Option<u64> {
        self.records
            .iter()
            .find_map(|record| record.events_of(stream).first())
            .map(|event| event.seq)
    }

    /// The event `(stream, seq)`, if the overlay holds it.
    pub(super) fn event(&self, stream: StreamId, seq: u64) -> Option<&Event> {
        self.records.iter().find_map(|record| {
            let events = record.events_of(stream);
            let first = events.first()?.seq;
            events.get(usize::try_from(seq.checked_sub(first)?).ok()?)
        })
    }

    /// A scan of `stream`'s events `first ..= last` held here, in seq
    /// order.
    pub(super) fn scan(&self, stream: StreamId, first: u64, last: u64) -> OverlayScan {
        OverlayScan {
            overlay: self.clone(),
            stream,
            next_seq: first,
            last,
            record: 0,
        }
    }
}

/// One stream's events of the overlay, `next_seq ..= last`.
pub(crate) struct OverlayScan {
    overlay: Overlay,
    stream: StreamId,
    next_seq: u64,
    last: u64,
    /// The record to look in first: records are in seq order per stream.
    record: usize,
}

impl OverlayScan {
    /// The next event, if any.
    pub(super) fn peek(&mut self) -> Option<&Event> {
        if self.next_seq > self.last {
            return None;
        }
        let (stream, seq) = (self.stream, self.next_seq);
        while let Some(record) = self.overlay.records.get(self.record) {
            let events = record.events_of(stream);
            if events.last().is_some_and(|last| last.seq >= seq) {
                // A seq below the record's first is none the overlay holds.
                let at = usize::try_from(seq.checked_sub(events[0].seq)?).ok()?;
                return events.get(at);
            }
            self.record += 1;
        }
        None
    }

    /// Moves past the event `peek` answered.
    pub(super) fn advance(&mut self) {
        match self.next_seq.checked_add(1) {
            Some(next) => self.next_seq = next,
            None => self.last = 0,
        }
    }
}
