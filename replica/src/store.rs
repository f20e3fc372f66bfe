//! `Store`: where a replica keeps what it has accepted, and `MemStore`, the
//! in-memory implementation.
//!
//! The trait is shaped for a real embedded engine: one atomic batch per
//! commit (new events, raised floors as range deletes, the lamport clock),
//! range reads per stream, and a small metadata record that lets recovery
//! prove it read back everything (the heads), not a silently shorter log.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::error::Error;

use meshlog_cursor::{StreamId, VersionVector};

use crate::Event;

/// One atomic write. A store applies all of it or none of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Events to add, each the next of its stream (contiguous per stream).
    pub events: Vec<Event>,
    /// Floors to raise: for each `(stream, floor_seq)`, delete every event of
    /// the stream with `seq <= floor_seq` and record the floor.
    pub floors: Vec<(StreamId, u64)>,
    /// The replica's lamport clock after the batch.
    pub clock: u64,
}

impl Batch {
    /// Whether the batch changes nothing but possibly the clock.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.floors.is_empty()
    }
}

/// What a store knows without reading events: enough to check that the
/// events read back are complete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreMeta {
    /// Per stream, the last seq compacted away.
    pub floor: VersionVector,
    /// Per stream, the last seq stored (or the floor, if nothing above it is).
    pub heads: VersionVector,
    /// The lamport clock recorded with the last commit.
    pub clock: u64,
}

/// Durable (or, for [`MemStore`], simulated) storage under a replica.
///
/// A replica calls [`Store::commit`] before it exposes anything a batch
/// holds, so nothing is paged or sent to a peer that the store could forget.
pub trait Store {
    /// The engine's error.
    type Error: Error + Send + Sync + 'static;

    /// Reads the metadata on open.
    fn meta(&self) -> Result<StoreMeta, Self::Error>;

    /// Appends to `out` up to `limit` events of `stream` with seq above
    /// `after_seq`, in ascending seq order.
    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), Self::Error>;

    /// Makes a batch durable, atomically.
    fn commit(&mut self, batch: &Batch) -> Result<(), Self::Error>;
}

/// A store in memory: nothing survives the process, but a replica reopened on
/// the same `MemStore` recovers exactly what was committed, which is what
/// tests use to simulate a restart.
///
/// ```
/// use meshlog_replica::{Config, MemStore, Replica};
/// use meshlog_cursor::StreamId;
/// let config = Config::new(StreamId::new(1));
/// let mut replica = Replica::open(config.clone(), MemStore::default())?;
/// replica.append(&b"hello"[..])?;
/// let store = replica.into_store();
/// let reopened = Replica::open(config, store)?;
/// assert_eq!(reopened.marks().get(StreamId::new(1)), 1);
/// # Ok::<(), meshlog_replica::ReplicaError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemStore {
    /// Per stream, its events `floor+1 ..= head`, in seq order.
    streams: BTreeMap<StreamId, VecDeque<Event>>,
    meta: StoreMeta,
}

impl Store for MemStore {
    type Error = Infallible;

    fn meta(&self) -> Result<StoreMeta, Infallible> {
        Ok(self.meta.clone())
    }

    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), Infallible> {
        let Some(events) = self.streams.get(&stream) else {
            return Ok(());
        };
        // The deque starts at floor + 1.
        let skip = after_seq.saturating_sub(self.meta.floor.get(stream));
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        out.extend(events.iter().skip(skip).take(limit).cloned());
        Ok(())
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), Infallible> {
        for &(stream, floor_seq) in &batch.floors {
            let floor = self.meta.floor.get(stream);
            let events = self.streams.entry(stream).or_default();
            let drop = usize::try_from(floor_seq.saturating_sub(floor)).unwrap_or(usize::MAX);
            events.drain(..drop.min(events.len()));
            self.meta.floor.advance(stream, floor_seq);
            self.meta.heads.advance(stream, floor_seq);
        }
        // Events come per stream in seq order, usually many of one stream in
        // a row: look the stream up once per run, move its head once.
        let mut run: Option<(StreamId, u64, &mut VecDeque<Event>)> = None;
        for event in &batch.events {
            if run
                .as_ref()
                .is_none_or(|(stream, _, _)| *stream != event.stream)
            {
                if let Some((stream, head, _)) = run.take() {
                    self.meta.heads.advance(stream, head);
                }
                let head = self.meta.heads.get(event.stream);
                let events = self.streams.entry(event.stream).or_default();
                run = Some((event.stream, head, events));
            }
            let (_, head, events) = run.as_mut().expect("a run was just started");
            assert_eq!(
                event.seq,
                *head + 1,
                "a batch's events are contiguous per stream"
            );
            *head = event.seq;
            events.push_back(event.clone());
        }
        if let Some((stream, head, _)) = run {
            self.meta.heads.advance(stream, head);
        }
        self.meta.clock = self.meta.clock.max(batch.clock);
        Ok(())
    }
}
