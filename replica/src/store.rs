//! `Store`: where a replica keeps what it has accepted, and `MemStore`, the
//! in-memory implementation.
//!
//! The trait is shaped for a real embedded engine: one atomic batch per
//! commit (new events, raised floors as range deletes, the lamport clock),
//! range reads per stream, and a small metadata record that lets recovery
//! prove it read back everything (the heads), not a silently shorter log.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::error::Error;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use meshlog_cursor::{StreamId, VersionVector};

use crate::columns::RunColumns;
use crate::mem::{MemLog, Source};
use crate::{Digest, Event, KeptSeals, StreamChain};

/// One atomic write. A store applies all of it or none of it.
///
/// Its events are kept as the runs they were planned in, each borrowed
/// from the delta it arrived in where it can be (so a received event is
/// neither copied nor shared on its way to the store), or owned. A run
/// of a delta received in columns ([`DeltaColumns`](crate::DeltaColumns))
/// stays in columns: `MemStore` copies them as they are, and the
/// run's [`Event`]s are made only if a store asks for them
/// ([`Batch::events`], [`Batch::runs`]). Two batches are equal when they
/// add the same events, raise the same floors and set the same clock,
/// whichever way their runs are held.
#[derive(Debug, Clone, Default)]
pub struct Batch<'a> {
    /// Events to add, each the next of its stream (contiguous per stream),
    /// in order across the runs.
    runs: Vec<BatchRun<'a>>,
    /// Floors to raise: for each `(stream, floor_seq)`, delete every event of
    /// the stream with `seq <= floor_seq` and record the floor.
    pub floors: Vec<(StreamId, u64)>,
    /// The replica's lamport clock after the batch.
    pub clock: u64,
    /// Per stream the batch touches (a floor or events), ascending, its
    /// chain after the batch (`docs/SIGNING.md`): a store records it with
    /// the stream's floor and head. A replica fills it in just before the
    /// commit, for every stream the batch touches. A batch with none (built
    /// by hand) makes a store forget the chains of the streams it touches:
    /// the replica opened on the store chains them again from their floors
    /// ([`StreamChain::rooted`]).
    pub chains: Vec<(StreamId, StreamChain)>,
    /// Per stream of `chains` hashed lazily (`docs/SIGNING.md`, "Hash
    /// chain"), ascending, whose chain is recorded below its head after
    /// the batch: the seq its `head_hash` is at (at or above the floor).
    /// A stream of `chains` not listed here has its `head_hash` at its
    /// head. A store records the seq with the chain; the hash at a seq
    /// stays true whatever is appended above it, so a record older than
    /// the head is still right after a crash, as long as the floor is
    /// its own.
    pub hashed: Vec<(StreamId, u64)>,
    /// Per stream whose seals the batch moves, ascending, the key pinned
    /// for it and the seals kept after the batch ([`KeptSeals`];
    /// `docs/SIGNING.md`): a store records them with the events they seal
    /// (replacing what it held for the stream), so a reopened replica
    /// keeps its pins and relays sealed. A replica fills it in just before
    /// the commit.
    pub seals: Vec<(StreamId, KeptSeals)>,
    /// Per stream whose newest compaction statement the batch moves,
    /// ascending (`docs/SIGNING.md`, "Floors with an authority"): the
    /// own stream's, signed when a keyed replica compacts it, or one a
    /// delta brought that erased the stream to its floor. A store records
    /// it (replacing what it held for the stream), so a reopened replica
    /// still sends it with its floor. A replica fills it in just before
    /// the commit.
    pub statements: Vec<crate::SignedCompaction>,
    /// Proofs of forked streams the batch keeps (`docs/SIGNING.md`,
    /// "Equivocation with valid signatures"), at most one per stream and
    /// none of a stream the store already keeps one of: a store records
    /// them, so a reopened replica keeps its streams frozen.
    pub forks: Vec<crate::ForkProof>,
    /// Events of the round that a floor raised later in the same round
    /// erased (taken out of the runs by `trim_run`), in order: the chain
    /// of their stream runs through them to that floor. Not committed.
    erased: Vec<Event>,
}

impl PartialEq for Batch<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.floors == other.floors && self.clock == other.clock && self.events().eq(other.events())
    }
}

impl Eq for Batch<'_> {}

/// One run of a batch.
#[derive(Debug, Clone)]
enum BatchRun<'a> {
    Events(Cow<'a, [Event]>),
    /// A run of a delta in columns, and its events once asked for.
    Columns {
        run: RunColumns<'a>,
        events: OnceLock<Vec<Event>>,
    },
}

/// A batch's run as a store reads it.
pub(crate) enum BatchPart<'b> {
    Events(&'b [Event]),
    Columns(RunColumns<'b>),
}

impl<'a> Batch<'a> {
    /// A batch adding `events` (each the next of its stream, contiguous per
    /// stream), raising no floor, with clock 0.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use meshlog_cursor::StreamId;
    /// use meshlog_replica::{Batch, Event, MemStore, Store};
    /// let event = Event {
    ///     stream: StreamId::new(1),
    ///     seq: 1,
    ///     lamport: 1,
    ///     time_ms: 0,
    ///     payload: Bytes::from_static(b"hello"),
    /// };
    /// let batch = Batch::from_events(vec![event]).with_clock(1);
    /// let mut store = MemStore::default();
    /// store.commit(&batch)?;
    /// assert_eq!(store.meta()?.heads.get(StreamId::new(1)), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_events(events: Vec<Event>) -> Self {
        let mut batch = Batch::default();
        batch.add_events(events);
        batch
    }

    /// The batch with its clock set to `clock`.
    pub fn with_clock(mut self, clock: u64) -> Self {
        self.clock = clock;
        self
    }

    /// The batch with `floors` to raise.
    pub fn with_floors(mut self, floors: Vec<(StreamId, u64)>) -> Self {
        self.floors = floors;
        self
    }

    /// Adds `events` after those already in the batch; returns the run's
    /// index.
    pub(crate) fn add_events(&mut self, events: impl Into<Cow<'a, [Event]>>) -> usize {
        self.runs.push(BatchRun::Events(events.into()));
        self.runs.len() - 1
    }

    /// Adds a run of a delta in columns after those already in the batch;
    /// returns the run's index.
    pub(crate) fn add_columns(&mut self, run: RunColumns<'a>) -> usize {
        self.runs.push(BatchRun::Columns {
            run,
            events: OnceLock::new(),
        });
        self.runs.len() - 1
    }

    /// The run at `index`, as a store reads it.
    pub(crate) fn part(&self, index: usize) -> BatchPart<'_> {
        match &self.runs[index] {
            BatchRun::Events(events) => BatchPart::Events(events),
            BatchRun::Columns { run, .. } => BatchPart::Columns(*run),
        }
    }

    /// The runs, as a store reads them.
    pub(crate) fn parts(&self) -> impl Iterator<Item = BatchPart<'_>> + '_ {
        (0..self.runs.len()).map(|index| self.part(index))
    }

    /// The events of the run at `index` (made from its columns, once, if
    /// it is a run in columns).
    pub(crate) fn run(&self, index: usize) -> &[Event] {
        match &self.runs[index] {
            BatchRun::Events(events) => events,
            BatchRun::Columns { run, events } => events.get_or_init(|| run.to_events()),
        }
    }

    /// How many events the run at `index` holds.
    pub(crate) fn run_len(&self, index: usize) -> usize {
        self.runs[index].len()
    }

    /// Drops from the run at `index` its events at or below `floor_seq`
    /// (a floor planned after them in the same round erases them: the
    /// store, which deletes below a batch's floors before it adds its
    /// events, must not see them).
    pub(crate) fn trim_run(&mut self, index: usize, floor_seq: u64) {
        let run = &mut self.runs[index];
        if let BatchRun::Columns { run: columns, .. } = run {
            *run = BatchRun::Events(Cow::Owned(columns.to_events()));
        }
        let BatchRun::Events(events) = run else {
            unreachable!("made events above");
        };
        let erased = events.partition_point(|event| event.seq <= floor_seq);
        self.erased.extend_from_slice(&events[..erased]);
        match events {
            Cow::Borrowed(slice) => *slice = &slice[erased..],
            Cow::Owned(vec) => {
                vec.drain(..erased);
            }
        }
    }

    /// Takes the events of the run at `index` out of the batch (which keeps
    /// an empty run there), copying them only if they were borrowed.
    pub(crate) fn take_run(&mut self, index: usize) -> Vec<Event> {
        match std::mem::replace(&mut self.runs[index], BatchRun::Events(Cow::Borrowed(&[]))) {
            BatchRun::Events(events) => events.into_owned(),
            BatchRun::Columns { run, events } => {
                events.into_inner().unwrap_or_else(|| run.to_events())
            }
        }
    }

    /// The events of the round a later floor erased (see `erased`).
    pub(crate) fn erased(&self) -> &[Event] {
        &self.erased
    }

    /// The chain the batch records for `stream`, if any.
    pub fn chain(&self, stream: StreamId) -> Option<&StreamChain> {
        self.chains
            .binary_search_by_key(&stream, |&(of, _)| of)
            .ok()
            .map(|at| &self.chains[at].1)
    }

    /// Every stream the batch touches (a floor or events), ascending.
    pub fn touched(&self) -> Vec<StreamId> {
        let mut streams: Vec<StreamId> = self.floors.iter().map(|&(stream, _)| stream).collect();
        for part in self.parts() {
            match part {
                BatchPart::Events(events) => {
                    for run in events.chunk_by(|a, b| a.stream == b.stream) {
                        streams.push(run[0].stream);
                    }
                }
                BatchPart::Columns(run) => streams.push(run.stream),
            }
        }
        streams.sort_unstable();
        streams.dedup();
        streams
    }

    /// The events to add, in order.
    pub fn events(&self) -> impl Iterator<Item = &Event> + '_ {
        self.runs().flatten()
    }

    /// The events to add, in order, as slices (each may hold several
    /// streams; every stream's events are in seq order across them).
    pub fn runs(&self) -> impl Iterator<Item = &[Event]> + '_ {
        (0..self.runs.len()).map(|index| self.run(index))
    }

    /// How many events the batch adds.
    pub fn event_count(&self) -> usize {
        self.runs.iter().map(BatchRun::len).sum()
    }

    /// Whether the batch changes nothing but possibly the clock (and
    /// the seals kept).
    pub fn is_empty(&self) -> bool {
        self.floors.is_empty() && self.runs.iter().all(|run| run.len() == 0)
    }
}

impl BatchRun<'_> {
    fn len(&self) -> usize {
        match self {
            BatchRun::Events(events) => events.len(),
            BatchRun::Columns { run, .. } => run.len(),
        }
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
    /// The digest of the events `floor+1 ..= head` of every stream, if the
    /// store records it (then a replica opened on it reads no event).
    pub digest: Option<Digest>,
    /// Per stream, its chain as the last commit that touched it recorded
    /// ([`Batch::chains`]); a stream missing here is chained again from
    /// its floor on open.
    pub chains: BTreeMap<StreamId, StreamChain>,
    /// Per stream of `chains` recorded below its head (hashed lazily,
    /// [`Batch::hashed`]): the seq its `head_hash` is at.
    pub hashed: BTreeMap<StreamId, u64>,
    /// Per stream received sealed, the key pinned and the seals kept, as
    /// the last batch that moved them recorded ([`Batch::seals`]).
    pub seals: BTreeMap<StreamId, KeptSeals>,
    /// Per stream, the newest compaction statement kept, as the last batch
    /// that moved it recorded ([`Batch::statements`]).
    pub statements: BTreeMap<StreamId, crate::SignedCompaction>,
    /// The checkpoints' vectors the replica keeps, oldest first, as
    /// [`Store::keep_checkpoints`] last recorded them (`docs/TOKEN.md`).
    pub checkpoints: Vec<VersionVector>,
    /// Per stream proven forked, the proof kept ([`Batch::forks`]).
    pub forks: BTreeMap<StreamId, crate::ForkProof>,
}

impl StoreMeta {
    /// Records the chains of the streams `batch` touches; a batch without
    /// chains (built by hand) makes it forget theirs.
    pub(crate) fn record_chains(&mut self, batch: &Batch) {
        if batch.chains.is_empty() {
            for stream in batch.touched() {
                self.chains.remove(&stream);
                self.hashed.remove(&stream);
            }
        }
        for &(stream, chain) in &batch.chains {
            self.chains.insert(stream, chain);
            self.hashed.remove(&stream);
        }
        for &(stream, seq) in &batch.hashed {
            self.hashed.insert(stream, seq);
        }
    }

    /// Records the seals `batch` moves.
    pub(crate) fn record_seals(&mut self, batch: &Batch) {
        for (stream, kept) in &batch.seals {
            self.seals.insert(*stream, kept.clone());
        }
        for statement in &batch.statements {
            self.statements
                .insert(statement.statement.stream, *statement);
        }
    }

    /// Records the proofs `batch` keeps (the first per stream stays).
    pub(crate) fn record_forks(&mut self, batch: &Batch) {
        for proof in &batch.forks {
            self.forks
                .entry(proof.stream())
                .or_insert_with(|| proof.clone());
        }
    }

    /// The seqs [`Store::read_stream`] returns for `(stream, after_seq,
    /// limit)`: from above both `after_seq` and the floor, at most `limit`
    /// of them, up to the head; `None` if there are none.
    pub(crate) fn read_range(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
    ) -> Option<(u64, u64)> {
        let head = self.heads.get(stream);
        let first = after_seq.max(self.floor.get(stream)).checked_add(1)?;
        if first > head || limit == 0 {
            return None;
        }
        Some((first, head.min(first.saturating_add(limit as u64 - 1))))
    }
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

    /// Where the store keeps its content, as an operator would look for it
    /// (a data file's path), or `None` (a store in memory). An open that
    /// finds the content inconsistent names it
    /// ([`ReplicaError::Corrupt`](crate::ReplicaError::Corrupt)).
    fn location(&self) -> Option<String> {
        None
    }

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

    /// The store's events as of its last commit, readable while later
    /// commits run, if the store offers that: a replica then reads its
    /// events through the view instead of keeping a copy of its own, and
    /// opens without reading them. `None` (the default): the replica
    /// reads every event on open and keeps its own copy in memory.
    fn view(&self) -> Option<StoreView> {
        None
    }

    /// Records the checkpoints the replica keeps (at most
    /// [`CHECKPOINTS_KEPT`](crate::CHECKPOINTS_KEPT) vectors, oldest
    /// first), replacing those recorded before, durably; the next
    /// [`Store::meta`] answers them. Apart from the commits of events: a
    /// checkpoint is minted or received at most every so often, and one
    /// lost costs only the tokens that name it. The default records
    /// nothing (a replica on such a store forgets its checkpoints on
    /// reopen, and answers tokens naming them
    /// [`PageError::UnknownCheckpoint`](crate::PageError::UnknownCheckpoint)).
    fn keep_checkpoints(&mut self, vectors: &[VersionVector]) -> Result<(), Self::Error> {
        let _ = vectors;
        Ok(())
    }
}

/// The readable side of a store's events, as of one commit (see
/// [`Store::view`]). Opaque: only this crate's stores make one; a store
/// wrapping another hands on the inner store's.
#[derive(Clone)]
pub struct StoreView {
    pub(crate) kind: ViewKind,
    /// The digest of the events as of that commit, if the store records it
    /// (then publishing a compaction reads none of the events it drops).
    pub(crate) digest: Option<Digest>,
}

#[derive(Clone)]
pub(crate) enum ViewKind {
    /// A [`MemStore`]'s data. Commits append beyond the published heads
    /// and free what a compaction drops one commit late, so a reader
    /// bounded by the published floor and heads reads exactly what was
    /// published.
    Mem(Arc<RwLock<MemLog>>),
    /// A snapshot of a [`DiskStore`](crate::DiskStore)'s events.
    Disk(Arc<crate::disk::view::DiskView>),
}

impl std::fmt::Debug for StoreView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            ViewKind::Mem(_) => "memory",
            ViewKind::Disk(_) => "disk",
        };
        f.debug_struct("StoreView").field("kind", &kind).finish()
    }
}

/// A store in memory: nothing survives the process, but a replica reopened on
/// the same `MemStore` recovers exactly what was committed, which is what
/// tests use to simulate a restart.
///
/// It holds the one copy of each event: a replica on it reads events
/// through its [view](Store::view), in chunked columns of about 7 bytes
/// per event beyond the payload (`docs/STORAGE.md`). A clone is a copy of
/// what was committed, independent of the original.
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
#[derive(Default)]
pub struct MemStore {
    /// Per stream, at least its events `floor+1 ..= head` (events below a
    /// floor raised by the last commit are freed by the next one).
    data: Arc<RwLock<MemLog>>,
    meta: StoreMeta,
    /// Floors raised by the last commit, whose events are freed by the next.
    freed_late: Vec<(StreamId, u64)>,
}

impl Clone for MemStore {
    fn clone(&self) -> Self {
        let data = self
            .data
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        MemStore {
            data: Arc::new(RwLock::new(data)),
            meta: self.meta.clone(),
            freed_late: self.freed_late.clone(),
        }
    }
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore")
            .field("meta", &self.meta)
            .finish()
    }
}

impl Store for MemStore {
    type Error = Infallible;

    /// Records no digest: a replica sums it from the events, when asked
    /// (memory holds them at hand, and a replica never asked never hashes
    /// what it receives).
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
        let Some((first, last)) = self.meta.read_range(stream, after_seq, limit) else {
            return Ok(());
        };
        let data = self.data.read().unwrap_or_else(PoisonError::into_inner);
        let mut scan = data.scan(stream, first, last).expect("memory never fails");
        while scan.peek().expect("memory never fails").is_some() {
            out.push(scan.take().expect("memory never fails"));
        }
        Ok(())
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), Infallible> {
        // The events a floor drops stay until the next commit (readers of
        // the state published before this commit may still read them).
        let mut data = self.data.write().unwrap_or_else(PoisonError::into_inner);
        for (stream, floor_seq) in self.freed_late.drain(..) {
            data.drop_through(stream, floor_seq);
        }
        data.free_retired();
        for &(stream, floor_seq) in &batch.floors {
            self.meta.floor.advance(stream, floor_seq);
            self.meta.heads.advance(stream, floor_seq);
            self.freed_late.push((stream, floor_seq));
        }
        // Events come per stream in seq order, usually many of one stream in
        // a row: each run is held, and its stream's head moved, at once (a
        // run in columns copied as columns).
        for part in batch.parts() {
            match part {
                BatchPart::Events(events) => {
                    for run in events.chunk_by(|a, b| a.stream == b.stream) {
                        let (first, last) = (&run[0], &run[run.len() - 1]);
                        assert_eq!(
                            first.seq,
                            self.meta.heads.get(first.stream) + 1,
                            "a batch's events are contiguous per stream"
                        );
                        // (Which checks that the run's seqs are consecutive.)
                        data.push_run(run);
                        self.meta.heads.advance(first.stream, last.seq);
                    }
                }
                BatchPart::Columns(run) => {
                    assert_eq!(
                        run.first_seq,
                        self.meta.heads.get(run.stream) + 1,
                        "a batch's events are contiguous per stream"
                    );
                    data.push_columns(run);
                    self.meta.heads.advance(run.stream, run.last_seq());
                }
            }
        }
        self.meta.clock = self.meta.clock.max(batch.clock);
        self.meta.record_chains(batch);
        self.meta.record_seals(batch);
        self.meta.record_forks(batch);
        Ok(())
    }

    fn keep_checkpoints(&mut self, vectors: &[VersionVector]) -> Result<(), Infallible> {
        self.meta.checkpoints = vectors.to_vec();
        Ok(())
    }

    fn view(&self) -> Option<StoreView> {
        Some(StoreView {
            kind: ViewKind::Mem(Arc::clone(&self.data)),
            digest: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{Delta, DeltaColumns};

    /// A batch of runs in columns reads as the batch of the same events,
    /// and commits the same store.
    #[test]
    fn a_batch_in_columns_is_the_batch_of_its_events() {
        let events: Vec<Event> = [(2, 1, b"ab".as_slice()), (2, 2, b""), (5, 1, b"cde")]
            .into_iter()
            .map(|(stream, seq, payload)| Event {
                stream: StreamId::new(stream),
                seq,
                lamport: seq + stream,
                time_ms: 9,
                payload: Bytes::copy_from_slice(payload),
            })
            .collect();
        let columns = DeltaColumns::from_delta(&Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: events.clone(),
            seals: Vec::new(),
        });
        let mut in_columns = Batch::default().with_clock(7);
        for run in columns.run_parts() {
            in_columns.add_columns(run);
        }
        let as_events = Batch::from_events(events.clone()).with_clock(7);
        assert_eq!(in_columns.event_count(), 3);
        assert_eq!(in_columns.events().cloned().collect::<Vec<_>>(), events);
        assert_eq!(in_columns, as_events);
        assert_ne!(in_columns, as_events.clone().with_clock(8));
        let (mut one, mut other) = (MemStore::default(), MemStore::default());
        one.commit(&in_columns).unwrap();
        other.commit(&as_events).unwrap();
        assert_eq!(one.meta().unwrap(), other.meta().unwrap());
        for stream in [2, 5] {
            let (mut left, mut right) = (Vec::new(), Vec::new());
            let stream = StreamId::new(stream);
            one.read_stream(stream, 0, 10, &mut left).unwrap();
            other.read_stream(stream, 0, 10, &mut right).unwrap();
            assert_eq!(left, right);
        }
    }
}
