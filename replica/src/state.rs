//! `State`: what a replica holds in memory, readable by many, and every
//! change split into **plan → commit → publish**.
//!
//! A change is first *validated* and *planned* against the state without
//! touching it (a plan lists the operations to perform and the store
//! [`Batch`] that makes them durable); the batch is *committed* to the store
//! with no lock on the state held; only then is the plan *published*: its
//! operations are performed on the state, which cannot fail. So readers
//! never wait for a commit, a failed commit leaves the state exactly as it
//! was, and nothing is visible before its commit.
//!
//! Planning simulates the change on a sparse overlay (per touched stream:
//! floor, head, early events added), and publishing re-checks the outcome
//! (heads, pending count) against the plan: a disagreement is a bug and
//! stops the process rather than serve a state that differs from the store.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};

use crate::log::{Held, Log, StreamLog, Walk};
use crate::mem::{MemLog, ReadError, Through};
use crate::store::{BatchPart, StoreView};
use crate::{
    ApplyReport, Batch, CompactReport, Config, Delta, DeltaColumns, DeltaError, Digest, Event,
    Page, PageError, ReplicaError, Stats, Store,
};

/// A replica's readable state: the log, its vectors and counters.
#[derive(Debug)]
pub(crate) struct State {
    config: Config,
    log: Log,
    marks: VersionVector,
    floor: VersionVector,
    clock: u64,
    pending_len: usize,
    /// The digest, summed when asked ([`State::digest`]): a sender or a
    /// reader that never asks never hashes what it receives.
    digest: Mutex<LazyDigest>,
    stats: Stats,
    /// Whether peers may still write this replica's own stream (see
    /// [`Config::recover_own_stream`]); appends are refused meanwhile.
    recovering: bool,
}

/// Events accepted earlier in the same round (group commit), by name:
/// a later delta of the round is checked against them as against held
/// events, so two peers' deltas that equivocate are caught even when they
/// arrive in one round.
///
/// It also keeps the floors those deltas raise, so that a later delta is
/// judged against them as if the earlier ones were already applied: a round
/// behaves as its deltas applied one by one (`replica/tests/shared_rounds.rs`).
#[derive(Debug, Default)]
pub(crate) struct RoundIndex<'a> {
    events: BTreeMap<(StreamId, u64), &'a Event>,
    new_streams: BTreeSet<StreamId>,
    floors: BTreeMap<StreamId, u64>,
}

impl<'a> RoundIndex<'a> {
    /// Adds an accepted delta.
    pub(crate) fn add(&mut self, state: &State, delta: &'a Delta) {
        for event in &delta.events {
            self.events
                .entry((event.stream, event.seq))
                .or_insert(event);
            if !state.log.has_stream(event.stream) {
                self.new_streams.insert(event.stream);
            }
        }
        for (stream, floor_seq) in delta.floor.iter() {
            if !state.log.has_stream(stream) {
                self.new_streams.insert(stream);
            }
            // As planning does: a peer's floor for our own stream is not
            // applied (outside recovery).
            if stream != state.config.stream || state.recovering {
                let floor = self.floors.entry(stream).or_insert(0);
                *floor = (*floor).max(floor_seq);
            }
        }
    }

    fn floor(&self, stream: StreamId) -> u64 {
        self.floors.get(&stream).copied().unwrap_or(0)
    }

    fn lamport(&self, stream: StreamId, seq: u64) -> Option<u64> {
        self.events.get(&(stream, seq)).map(|event| event.lamport)
    }
}

/// Where an event of a plan comes from, which decides what publishing it
/// does besides holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A peer's event at its stream's head + 1.
    Received,
    /// An early event released from the pending buffer.
    Released,
    /// A local append.
    Appended,
}

#[derive(Debug)]
enum Op {
    /// Raise a floor: `batch.floors[i]`.
    Floor(usize),
    /// Hold a run of events, consecutive seqs of one stream from its head
    /// + 1: the batch's run `run`.
    Events { run: usize, source: Source },
    /// Keep an early event in the pending buffer (memory only).
    Hold(Event),
}

/// A planned change: what to commit, and what to do to the state once
/// committed. It borrows the received events from their deltas.
#[derive(Debug, Default)]
pub(crate) struct Plan<'d> {
    /// What the store commits (possibly empty: a change of the pending
    /// buffer alone, or counters).
    pub(crate) batch: Batch<'d>,
    ops: Vec<Op>,
    /// One report per planned delta, in order.
    pub(crate) reports: Vec<ApplyReport>,
    /// Per local append request, the batch's run of its events, or why it
    /// was refused.
    pub(crate) appended: Vec<Result<usize, ReplicaError>>,
    compacted: Option<CompactReport>,
    /// Deltas refused in the round, for the counters.
    pub(crate) refused: u64,
    /// Pair assertions: what publishing must lead to.
    pending_len_after: usize,
    heads_after: Vec<(StreamId, u64)>,
}

impl Plan<'_> {
    /// Whether publishing changes anything the store does not hold (the
    /// pending buffer or counters) or the store must commit.
    pub(crate) fn is_noop(&self) -> bool {
        self.ops.is_empty()
            && self.refused == 0
            && self
                .reports
                .iter()
                .all(|report| *report == ApplyReport::default())
    }

    /// The events of the local append request whose batch run is `run`
    /// (from [`Plan::appended`]), taken out of the plan once it is
    /// committed and published (moved, not copied).
    pub(crate) fn take_appended(&mut self, run: usize) -> Vec<Event> {
        self.batch.take_run(run)
    }

    /// The compaction report of a compaction plan.
    pub(crate) fn compact_report(&self) -> CompactReport {
        self.compacted.unwrap_or_default()
    }
}

/// One local append request of a round.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AppendRequest<'a> {
    pub(crate) payloads: &'a [Bytes],
    pub(crate) time_ms: u64,
}

/// A stream as a plan sees it: the state's, with the plan's changes so far.
struct SimStream<'s, 'd> {
    log: Option<&'s StreamLog>,
    floor: u64,
    head: u64,
    /// Early events the plan holds back.
    added: BTreeMap<u64, &'d Event>,
}

impl State {
    /// Reads what `store` holds and checks it: per stream the events
    /// `floor+1 ..= head` with none missing, lamport rising with seq, and a
    /// clock at or above every stamp recorded.
    pub(crate) fn load<S: Store>(config: Config, store: &S) -> Result<State, ReplicaError> {
        let meta = store.meta().map_err(store_error)?;
        let recovering = config.recover_own_stream;
        let view = store.view();
        let held = match view {
            Some(view) => Held::View(view),
            None => Held::Own(MemLog::default()),
        };
        let mut state = State {
            config,
            log: Log::new(held),
            marks: VersionVector::new(),
            floor: meta.floor.clone(),
            clock: meta.clock,
            pending_len: 0,
            digest: Mutex::default(),
            stats: Stats::default(),
            recovering,
        };
        let streams: Vec<(StreamId, u64)> = meta.heads.iter().collect();
        if streams.len() > state.config.streams_max {
            return Err(ReplicaError::TooManyStreams {
                streams: streams.len(),
                limit: state.config.streams_max,
            });
        }
        if state.log.is_own() {
            state.load_every_event(store, &streams, &meta.floor)?;
        } else {
            state.load_recorded(&streams, &meta.floor, meta.digest)?;
        }
        tracing::debug!(
            stream = %state.config.stream,
            streams = state.log.stream_count(),
            events = state.digest().events,
            clock = state.clock,
            recovering,
            "replica opened"
        );
        Ok(state)
    }

    /// Opens on a store's view: what the store recorded (floors, heads,
    /// digest), checking per stream only that its last event is stamped at
    /// or below the clock. [`State::verify`] checks every event.
    fn load_recorded(
        &mut self,
        streams: &[(StreamId, u64)],
        floors: &VersionVector,
        digest: Option<Digest>,
    ) -> Result<(), ReplicaError> {
        for &(stream, head) in streams {
            let floor = floors.get(stream);
            if head < floor {
                return Err(ReplicaError::Corrupt {
                    stream,
                    detail: format!("head {head} is below floor {floor}"),
                });
            }
            self.log.open_stream(stream, floor, head);
            self.marks.advance(stream, head);
            let log = self.log.stream(stream).expect("just opened");
            if head > floor {
                let last = self.log.lamport_in(log, head).map_err(read_error)?;
                match last {
                    None => {
                        return Err(ReplicaError::Corrupt {
                            stream,
                            detail: format!(
                                "the store records head {head} but holds no such event"
                            ),
                        })
                    }
                    Some(lamport) if lamport > self.clock => {
                        return Err(ReplicaError::Corrupt {
                            stream,
                            detail: format!(
                                "seq {head} has lamport {lamport} above the recorded clock {}",
                                self.clock
                            ),
                        })
                    }
                    Some(_) => {}
                }
            }
        }
        let sum = match digest {
            Some(digest) => digest,
            None => self.recount()?.1,
        };
        *self.lazy_digest() = LazyDigest {
            sum,
            unhashed: BTreeMap::new(),
        };
        Ok(())
    }

    /// Reads every event of `store`, checking it, into the own copy.
    fn load_every_event<S: Store>(
        &mut self,
        store: &S,
        streams: &[(StreamId, u64)],
        floors: &VersionVector,
    ) -> Result<(), ReplicaError> {
        let mut chunk = Vec::new();
        for &(stream, head) in streams {
            let floor = floors.get(stream);
            let corrupt = |detail: String| ReplicaError::Corrupt { stream, detail };
            if head < floor {
                return Err(corrupt(format!("head {head} is below floor {floor}")));
            }
            self.log.ensure_stream(stream, floor);
            let mut previous: Option<u64> = None;
            while self.log.head(stream) < head {
                chunk.clear();
                let after = self.log.head(stream);
                store
                    .read_stream(stream, after, 4096, &mut chunk)
                    .map_err(store_error)?;
                if chunk.is_empty() {
                    return Err(corrupt(format!(
                        "store holds seqs {}..={after} but records head {head}",
                        floor.saturating_add(1)
                    )));
                }
                for event in &chunk {
                    check_next(event, stream, self.log.head(stream), previous, self.clock)?;
                    previous = Some(event.lamport);
                    self.lazy_digest().sum.add(event);
                    self.log.push(event);
                }
            }
            if self.log.head(stream) != head {
                return Err(corrupt(format!(
                    "read up to seq {} past the recorded head {head}",
                    self.log.head(stream)
                )));
            }
            self.marks.advance(stream, head);
        }
        Ok(())
    }

    /// Reads every held event through the source and checks it (seqs
    /// without a hole, lamport rising with seq, no stamp above the clock);
    /// answers the event count and the digest recomputed.
    fn recount(&self) -> Result<(u64, Digest), ReplicaError> {
        let mut digest = Digest::default();
        let source = self.log.source();
        for (stream, head) in self.marks.iter() {
            let Some(log) = self.log.stream(stream) else {
                continue;
            };
            if head <= log.floor {
                continue;
            }
            let mut scan = source
                .get()
                .scan(stream, log.floor + 1, head)
                .map_err(read_error)?;
            let mut previous: Option<u64> = None;
            let mut expected = log.floor;
            while scan.peek().map_err(read_error)?.is_some() {
                let event = scan.take().map_err(read_error)?;
                check_next(&event, stream, expected, previous, self.clock)?;
                previous = Some(event.lamport);
                expected = event.seq;
                digest.add(&event);
            }
            if expected != head {
                return Err(ReplicaError::Corrupt {
                    stream,
                    detail: format!("holds seqs up to {expected} but records head {head}"),
                });
            }
        }
        Ok((digest.events, digest))
    }

    /// Reads and checks every held event, and compares the digest
    /// recomputed with the one recorded.
    pub(crate) fn verify(&self) -> Result<crate::Verified, ReplicaError> {
        let (events, digest) = self.recount()?;
        let recorded = self.digest();
        if digest != recorded {
            return Err(ReplicaError::DigestMismatch {
                recorded,
                recomputed: digest,
            });
        }
        Ok(crate::Verified {
            streams: self.log.stream_count(),
            events,
        })
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn marks(&self) -> &VersionVector {
        &self.marks
    }

    pub(crate) fn floor(&self) -> &VersionVector {
        &self.floor
    }

    pub(crate) fn clock(&self) -> u64 {
        self.clock
    }

    /// The digest of the events held: the sum kept, plus the hashes of
    /// the events received since it was last asked for (read back from
    /// the log, once). A store that records the digest keeps it whole.
    pub(crate) fn digest(&self) -> Digest {
        let mut lazy = self.digest.lock().unwrap_or_else(PoisonError::into_inner);
        if lazy.unhashed.is_empty() {
            return lazy.sum;
        }
        let source = self.log.source();
        let mut events = Vec::new();
        let unhashed = std::mem::take(&mut lazy.unhashed);
        for (&stream, &from) in &unhashed {
            let head = self.log.head(stream);
            if from > head {
                continue;
            }
            let mut used = 0;
            events.clear();
            let read = source
                .get()
                .read_into(stream, from, head, usize::MAX, &mut used, &mut events)
                .map_err(|error| error.to_string())
                .and_then(|_| {
                    read_whole(stream, from, head, events.len()).map_err(|e| e.to_string())
                });
            match read {
                Ok(()) => {
                    for event in &events {
                        lazy.sum.add(event);
                    }
                }
                Err(error) => {
                    // Only a store's view on disk fails a read, and a store
                    // on disk records the digest: asked again, read again.
                    tracing::error!(%stream, %error, "reading events to sum the digest failed");
                    lazy.unhashed.insert(stream, from);
                }
            }
        }
        lazy.sum
    }

    /// The digest's parts, from `&mut self` (no lock taken).
    fn lazy_digest(&mut self) -> &mut LazyDigest {
        self.digest
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn stats(&self) -> Stats {
        self.stats
    }

    pub(crate) fn pending_len(&self) -> usize {
        self.pending_len
    }

    pub(crate) fn is_recovering(&self) -> bool {
        self.recovering
    }

    /// Ends recovery: from now on peers cannot write this replica's own
    /// stream, and it appends after the head it relearned. Early events of
    /// its own stream still pending are dropped: its next appends take
    /// those seqs.
    pub(crate) fn end_recovery(&mut self) {
        if !self.recovering {
            return;
        }
        self.recovering = false;
        let stream = self.config.stream;
        let head = self.log.head(stream);
        let dropped = self.log.drop_early(stream);
        self.pending_len -= dropped;
        tracing::info!(%stream, head, dropped, "recovery of the own stream ended");
    }

    pub(crate) fn count_refused(&mut self, refused: u64) {
        self.stats.deltas_refused += refused;
    }

    pub(crate) fn get(&self, stream: StreamId, seq: u64) -> Result<Option<Event>, ReplicaError> {
        self.log.get(stream, seq).map_err(read_error)
    }

    pub(crate) fn held_times(&self, stream: StreamId) -> Result<Vec<(u64, u64)>, ReplicaError> {
        self.log.times(stream).map_err(read_error)
    }

    /// The vector covering every held event with a lamport at or below
    /// `lamport`; a stream whose compacted events' stamps are unknown (its
    /// first held event is above `lamport`, and some were compacted) gets 0,
    /// so a page reports its compacted range as possibly lost rather than
    /// skip it silently.
    pub(crate) fn covering_lamport(&self, lamport: u64) -> VersionVector {
        let mut cursor = VersionVector::new();
        for (stream, _) in self.marks.iter() {
            if let Some(log) = self.log.stream(stream) {
                match self.log.last_seq_at_or_below(log, lamport) {
                    Ok(Some(seq)) => cursor.advance(stream, seq),
                    Ok(None) => {}
                    // Unknown: 0, so the page reports what may be lost.
                    Err(error) => {
                        tracing::error!(%stream, %error, "reading the log failed");
                    }
                }
            }
        }
        cursor
    }

    pub(crate) fn page(&self, after: &VersionVector, limit: usize) -> Result<Page, PageError> {
        if limit > self.config.page_len_max {
            return Err(PageError::LimitTooLarge {
                limit,
                max: self.config.page_len_max,
            });
        }
        after.check_floor(&self.floor)?;
        let source = self.log.source();
        let mut walk = Walk::new(source.get(), self.log.places(after));
        let events: Vec<Event> = walk.by_ref().take(limit).collect();
        if let Some(error) = walk.error.take() {
            return Err(PageError::Store {
                detail: error.to_string(),
            });
        }
        let at_head = walk.is_done();
        let next = walk.cursor(after);
        tracing::trace!(len = events.len(), at_head, "page");
        Ok(Page {
            events,
            next,
            at_head,
        })
    }

    pub(crate) fn delta_for(&self, their_marks: &VersionVector, byte_budget: usize) -> Delta {
        let floor = self.floor_below(their_marks);
        let source = self.log.source();
        let places = self.log.places(their_marks);
        // Where the source counts from its columns: the ranges that fit,
        // read stream by stream.
        match self.delta_ranges(source.get(), &places, byte_budget) {
            Ok(Some(delta)) => {
                let mut events = Vec::with_capacity(delta.events);
                let mut used = 0usize;
                let read = delta.ranges.iter().try_for_each(|&(stream, first, last)| {
                    let before = events.len();
                    source.get().read_into(
                        stream,
                        first,
                        last,
                        usize::MAX,
                        &mut used,
                        &mut events,
                    )?;
                    read_whole(stream, first, last, events.len() - before)
                });
                match read {
                    Ok(()) => return Delta { floor, events },
                    Err(error) => {
                        tracing::error!(%error, "reading the log for a delta failed");
                    }
                }
            }
            Ok(None) => {}
            Err(error) => tracing::error!(%error, "reading the log for a delta failed"),
        }
        // Sized once: what they miss, at most what the budget holds (an
        // event's size hint is at least 50 bytes).
        let missing: u64 = self
            .marks
            .iter()
            .map(|(stream, head)| {
                head.saturating_sub(their_marks.get(stream).max(self.floor.get(stream)))
            })
            .sum();
        let fits = byte_budget / 50 + 1;
        let mut events = Vec::with_capacity(usize::try_from(missing).map_or(fits, |n| n.min(fits)));
        let mut used = 0usize;
        // When everything missing may fit the budget, it is read stream by
        // stream (no merge): a delta that carries all of it has no prefix
        // to keep in order, and a receiver takes it a stream at a time.
        if missing <= fits as u64 {
            match self.whole_delta(source.get(), &places, byte_budget, &mut events) {
                Ok(true) => return Delta { floor, events },
                Ok(false) => events.clear(),
                Err(error) => {
                    tracing::error!(%error, "reading the log for a delta failed");
                    events.clear();
                }
            }
        }
        // Otherwise (or if the payloads proved too large after all) the
        // oldest that fit, in `(lamport, stream)` order: a prefix that
        // holds every event below its newest stamp.
        let mut walk = Walk::new(source.get(), places);
        for event in walk.by_ref() {
            let size = event.size_hint();
            if !events.is_empty() && used.saturating_add(size) > byte_budget {
                break;
            }
            used = used.saturating_add(size);
            events.push(event);
        }
        // The events up to a failed read form a valid delta (per stream
        // contiguous from their mark); the peer asks again for the rest.
        if let Some(error) = walk.error {
            tracing::error!(%error, "reading the log for a delta failed");
        }
        // Stream by stream, as every delta built is (and a frame carries).
        events.sort_unstable_by_key(|event| (event.stream, event.seq));
        Delta { floor, events }
    }

    /// [`State::delta_for`] as columns: read a slice of the memory log's
    /// columns at a time; from a store on disk, the delta's events put in
    /// columns.
    pub(crate) fn delta_columns_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> DeltaColumns {
        let source = self.log.source();
        let places = self.log.places(their_marks);
        match self.delta_ranges(source.get(), &places, byte_budget) {
            Ok(Some(delta)) => {
                let mut columns = DeltaColumns::new(self.floor_below(their_marks));
                columns.reserve(delta.events, delta.payload_bytes);
                let read = delta.ranges.iter().try_for_each(|&(stream, first, last)| {
                    let before = columns.len();
                    source
                        .get()
                        .read_columns(stream, first, last, &mut columns)?;
                    read_whole(stream, first, last, columns.len() - before)
                });
                match read {
                    Ok(()) => return columns,
                    Err(error) => {
                        tracing::error!(%error, "reading the log for a delta failed");
                    }
                }
            }
            Ok(None) => {}
            Err(error) => tracing::error!(%error, "reading the log for a delta failed"),
        }
        DeltaColumns::from_delta(&self.delta_for(their_marks, byte_budget))
    }

    /// Our floor where `their_marks` is below it.
    fn floor_below(&self, their_marks: &VersionVector) -> VersionVector {
        self.floor
            .iter()
            .filter(|&(stream, floor_seq)| their_marks.get(stream) < floor_seq)
            .collect()
    }

    /// Reads into `events` every event `places` do not cover, stream by
    /// stream, if their size hints sum within `byte_budget`: `Ok(false)`
    /// (with `events` partly filled) as soon as one does not fit.
    fn whole_delta(
        &self,
        source: &dyn crate::mem::Source,
        places: &[crate::log::Place],
        byte_budget: usize,
        events: &mut Vec<Event>,
    ) -> Result<bool, ReadError> {
        let mut used = 0usize;
        // Streams ascending, as a frame carries them.
        let mut uncovered: Vec<(StreamId, u64, u64)> = places
            .iter()
            .filter_map(crate::log::Place::uncovered)
            .collect();
        uncovered.sort_unstable();
        for (stream, first, last) in uncovered {
            let before = events.len();
            if !source.read_into(stream, first, last, byte_budget, &mut used, events)? {
                return Ok(false);
            }
            if Some((events.len() - before) as u64) != (last - first).checked_add(1) {
                return Err(format!(
                    "stream {stream} seqs {first}..={last} are held but could not be read"
                )
                .into());
            }
        }
        Ok(true)
    }

    /// Per stream (ascending), the seqs of a delta: every uncovered event
    /// if their size hints fit `byte_budget`, else the oldest that fit (at
    /// least one): the longest prefix of them in `(lamport, stream)`
    /// order, found by a binary search on the lamport where it ends, each
    /// step asking every stream how many of its events stamp at most
    /// there ([`Source::through`]). `Ok(None)` where the source cannot
    /// tell.
    fn delta_ranges(
        &self,
        source: &dyn crate::mem::Source,
        places: &[crate::log::Place],
        byte_budget: usize,
    ) -> Result<Option<DeltaRanges>, ReadError> {
        let budget = byte_budget as u64;
        // An event costs at least 50 bytes: no stream gives more than
        // `fits` (so no step counts past them).
        let fits = budget / 50 + 1;
        let mut ranges: Vec<(StreamId, u64, u64)> = places
            .iter()
            .filter_map(crate::log::Place::uncovered)
            .map(|(stream, first, last)| (stream, first, last.min(first.saturating_add(fits - 1))))
            .collect();
        ranges.sort_unstable();
        let Some(&(stream, first, _)) = ranges.first() else {
            return Ok(Some(DeltaRanges::default()));
        };
        if source.through(stream, first, first, 0)?.is_none() {
            return Ok(None);
        }
        let stamp = |stream: StreamId, seq: u64| -> Result<u64, ReadError> {
            source.lamport(stream, seq)?.ok_or_else(|| {
                format!("stream {stream} seq {seq} is held but could not be read").into()
            })
        };
        // Below the lowest first stamp nothing fits; at the highest last
        // one everything does (or the search narrows below it).
        let (mut low, mut high) = (u64::MAX, 0u64);
        for &(stream, first, last) in &ranges {
            low = low.min(stamp(stream, first)?.saturating_sub(1));
            high = high.max(stamp(stream, last)?);
        }
        // Per stream, what stamps at most `low` (`below`), and how many
        // stamp at most `high` (`within`): a step counts only the events
        // between, so the windows narrow with the search.
        let size = |through: &[Through]| {
            through.iter().fold(0u64, |size, t| {
                size.saturating_add(t.payload_bytes)
                    .saturating_add(t.count.saturating_mul(50))
            })
        };
        let mut below = vec![Through::default(); ranges.len()];
        let mut within: Vec<u64> = ranges
            .iter()
            .map(|&(_, first, last)| last - first + 1)
            .collect();
        let count = |below: &[Through], within: &[u64], lamport: u64| {
            let mut counts = Vec::with_capacity(ranges.len());
            for ((&(stream, first, _), known), &upto) in ranges.iter().zip(below).zip(within) {
                let mut through = *known;
                if upto > known.count {
                    let more = source
                        .through(stream, first + known.count, first + (upto - 1), lamport)?
                        .ok_or("the source stopped counting")?;
                    through.count += more.count;
                    through.payload_bytes += more.payload_bytes;
                }
                counts.push(through);
            }
            Ok::<_, ReadError>(counts)
        };
        let mut taken = count(&below, &within, high)?;
        let mut used = size(&taken);
        if used > budget {
            // Invariant: what stamps at most `low` fits, at `high` not.
            while high - low > 1 {
                let middle = low + (high - low) / 2;
                let counts = count(&below, &within, middle)?;
                if size(&counts) <= budget {
                    low = middle;
                    below = counts;
                } else {
                    high = middle;
                    within = counts.iter().map(|t| t.count).collect();
                }
            }
            taken = below.clone();
            used = size(&taken);
            // Then the events stamped `high` (one per stream at most), in
            // stream order while they fit; the first event always goes.
            let next = count(&below, &within, high)?;
            for (now, then) in taken.iter_mut().zip(next) {
                if then.count == now.count {
                    continue;
                }
                let size = (then.payload_bytes - now.payload_bytes) + 50;
                if used > 0 && used.saturating_add(size) > budget {
                    break;
                }
                used = used.saturating_add(size);
                *now = then;
            }
        }
        Ok(Some(DeltaRanges {
            events: taken.iter().map(|through| through.count as usize).sum(),
            payload_bytes: taken
                .iter()
                .map(|through| through.payload_bytes as usize)
                .sum(),
            ranges: ranges
                .iter()
                .zip(&taken)
                .filter(|(_, through)| through.count > 0)
                .map(|(&(stream, first, _), through)| (stream, first, first + (through.count - 1)))
                .collect(),
        }))
    }

    /// Checks a delta against this state and the deltas accepted earlier in
    /// the same round, changing nothing.
    pub(crate) fn validate(&self, delta: &Delta, round: &RoundIndex) -> Result<(), ReplicaError> {
        self.validate_with(delta, round, true)
    }

    /// [`State::validate`]; `runs` lets clean runs be checked as runs
    /// (off only in the test that compares both ways).
    fn validate_with(
        &self,
        delta: &Delta,
        round: &RoundIndex,
        runs: bool,
    ) -> Result<(), ReplicaError> {
        let own = self.config.stream;
        let own_head = self.log.head(own);
        if !self.recovering {
            let own_floor = delta.floor.get(own);
            if own_floor > own_head {
                return Err(DeltaError::OwnFloorAboveHead {
                    stream: own,
                    floor: own_floor,
                    head: own_head,
                }
                .into());
            }
        }
        // Lamports rise with seq from at least 1, so no stream can hold a
        // seq above LAMPORT_MAX: a floor above it would only erase a
        // stream's future (every event at or below a floor is ignored).
        if let Some((stream, floor)) = delta
            .floor
            .iter()
            .find(|&(_, floor)| floor > crate::LAMPORT_MAX)
        {
            return Err(DeltaError::FloorTooLarge {
                stream,
                floor,
                max: crate::LAMPORT_MAX,
            }
            .into());
        }
        // The delta's events by name: two versions of one name sit side by
        // side, and so do an event and its neighbours in the same delta, so
        // every check is against the log, the round, or an adjacent entry —
        // whatever order the events came in.
        let by_name = sorted_by_name(&delta.events);
        let mut new_streams: Vec<StreamId> = delta
            .floor
            .iter()
            .map(|(stream, _)| stream)
            .filter(|&stream| !self.log.has_stream(stream))
            .collect();
        // The stream's log, looked up once per run of its events.
        let mut log: Option<&StreamLog> = None;
        let mut next = 0;
        while let Some(&event) = by_name.get(next) {
            let index = next;
            next += 1;
            let stream = event.stream;
            if index == 0 || by_name[index - 1].stream != stream {
                log = self.log.stream(stream);
                if log.is_none() {
                    new_streams.push(stream);
                }
            }
            let run = if runs {
                self.clean_run(&by_name, index, log, delta, round)?
            } else {
                None
            };
            // A clean run (of one stream) is checked whole: on past it.
            if let Some(len) = run {
                next = index + len;
                continue;
            }
            if event.seq == 0 {
                return Err(DeltaError::ZeroSeq { stream }.into());
            }
            if event.lamport > crate::LAMPORT_MAX {
                return Err(DeltaError::LamportTooLarge {
                    stream,
                    seq: event.seq,
                    lamport: event.lamport,
                    max: crate::LAMPORT_MAX,
                }
                .into());
            }
            if event.payload.len() > self.config.payload_bytes_max {
                return Err(ReplicaError::PayloadTooLarge {
                    stream,
                    len: event.payload.len(),
                    limit: self.config.payload_bytes_max,
                });
            }
            if stream == own && !self.recovering && event.seq > own_head {
                return Err(DeltaError::OwnStreamAhead {
                    stream,
                    seq: event.seq,
                    head: own_head,
                }
                .into());
            }
            let floor_seq = self.floor.get(stream).max(round.floor(stream)).max(
                if stream == own && !self.recovering {
                    0
                } else {
                    delta.floor.get(stream)
                },
            );
            if event.seq <= floor_seq {
                continue;
            }
            // Any other version of this name, held, pending, accepted
            // earlier in this round, or in this delta (the entry before,
            // once sorted), must be this very event.
            let same_as_held = match log {
                Some(log) => self.log.known_is(log, event).map_err(read_error)?,
                None => true,
            };
            let same_as_round = round
                .events
                .get(&(stream, event.seq))
                .is_none_or(|other| *other == event);
            let previous = index.checked_sub(1).map(|i| by_name[i]);
            let same_as_offered = previous
                .filter(|other| other.stream == stream && other.seq == event.seq)
                .is_none_or(|other| other == event);
            if !(same_as_held && same_as_round && same_as_offered) {
                return Err(DeltaError::Equivocation {
                    stream,
                    seq: event.seq,
                }
                .into());
            }
            // Lamport rises with seq against every neighbour known: held,
            // pending, in the round, or the nearest entries of this delta
            // either side (past repeats of this very name).
            let in_delta = |seq: u64, entries: &mut dyn Iterator<Item = &&Event>| {
                entries
                    .take_while(|other| other.stream == stream)
                    .find(|other| other.seq != event.seq)
                    .filter(|other| other.seq == seq)
                    .map(|other| other.lamport)
            };
            let below = event.seq - 1;
            if below > floor_seq {
                let known = match log {
                    Some(log) => self.log.known_lamport(log, below).map_err(read_error)?,
                    None => None,
                };
                let lamport = known
                    .or_else(|| round.lamport(stream, below))
                    .or_else(|| in_delta(below, &mut by_name[..index].iter().rev()));
                if let Some(lamport) = lamport {
                    if lamport >= event.lamport {
                        return Err(lamport_error(event, below, lamport));
                    }
                }
            }
            if let Some(above) = event.seq.checked_add(1) {
                let known = match log {
                    Some(log) => self.log.known_lamport(log, above).map_err(read_error)?,
                    None => None,
                };
                let lamport = known
                    .or_else(|| round.lamport(stream, above))
                    .or_else(|| in_delta(above, &mut by_name[index + 1..].iter()));
                if let Some(lamport) = lamport {
                    if lamport <= event.lamport {
                        return Err(lamport_error(event, above, lamport));
                    }
                }
            }
        }
        new_streams.retain(|stream| !round.new_streams.contains(stream));
        new_streams.sort_unstable();
        new_streams.dedup();
        let streams = self.log.stream_count() + round.new_streams.len() + new_streams.len();
        if streams > self.config.streams_max {
            return Err(ReplicaError::TooManyStreams {
                streams,
                limit: self.config.streams_max,
            });
        }
        Ok(())
    }

    /// Checks, in O(1) reads of the log, the run of `by_name` (a delta's
    /// events sorted by name) that starts at `start`, if it is *clean*:
    /// consecutive seqs of one stream from its head + 1, above every
    /// floor, lamports rising, no other version of any of its seqs pending
    /// or in the round, not this replica's own stream (outside recovery),
    /// and nothing in the delta right after it that another check would
    /// compare with it. Answers how many entries it covers, having made
    /// every check the per-event path makes on them (and refused the delta
    /// with the same error, if one fails at the run's ends), or `None` for
    /// the per-event path to take the entry at `start`: anything unusual,
    /// including every failure inside the run, goes there, so that what is
    /// refused, and the error it is refused with, do not change.
    fn clean_run(
        &self,
        by_name: &[&Event],
        start: usize,
        log: Option<&StreamLog>,
        delta: &Delta,
        round: &RoundIndex,
    ) -> Result<Option<usize>, ReplicaError> {
        let first = by_name[start];
        let stream = first.stream;
        if stream == self.config.stream && !self.recovering {
            return Ok(None);
        }
        let head = log.map_or(0, StreamLog::head);
        let floor_seq = self
            .floor
            .get(stream)
            .max(round.floor(stream))
            .max(delta.floor.get(stream));
        if head.checked_add(1) != Some(first.seq) || first.seq <= floor_seq {
            return Ok(None);
        }
        let before = start.checked_sub(1).map(|i| by_name[i]);
        if before.is_some_and(|other| other.stream == stream && other.seq == first.seq) {
            return Ok(None);
        }
        let mut end = start;
        let mut previous: Option<u64> = None;
        while let Some(&event) = by_name.get(end) {
            let expected = first.seq.checked_add((end - start) as u64);
            if event.stream != stream || Some(event.seq) != expected {
                break;
            }
            if event.lamport > crate::LAMPORT_MAX
                || event.payload.len() > self.config.payload_bytes_max
                || previous.is_some_and(|lamport| lamport >= event.lamport)
            {
                return Ok(None);
            }
            previous = Some(event.lamport);
            end += 1;
        }
        let last = by_name[end - 1];
        // Another version of the last seq right after the run: the
        // per-event path compares them.
        if by_name
            .get(end)
            .is_some_and(|other| other.stream == stream && other.seq == last.seq)
        {
            return Ok(None);
        }
        if log.is_some_and(|log| log.early_count_in(first.seq..=last.seq) > 0)
            || round
                .events
                .range((stream, first.seq)..=(stream, last.seq))
                .next()
                .is_some()
        {
            return Ok(None);
        }
        // The neighbours outside the run, as the per-event path finds them:
        // held (or pending), in the round, or in the delta next to it.
        let below = first.seq - 1;
        if below > floor_seq {
            let known = match log {
                Some(log) => self.log.known_lamport(log, below).map_err(read_error)?,
                None => None,
            };
            let lamport = known.or_else(|| round.lamport(stream, below)).or_else(|| {
                before
                    .filter(|other| other.stream == stream && other.seq == below)
                    .map(|other| other.lamport)
            });
            if let Some(lamport) = lamport {
                if lamport >= first.lamport {
                    return Err(lamport_error(first, below, lamport));
                }
            }
        }
        if let Some(above) = last.seq.checked_add(1) {
            // The delta's next entry is not `above`: the run would have
            // taken it, or left it all to the per-event path.
            let known = match log {
                Some(log) => self.log.known_lamport(log, above).map_err(read_error)?,
                None => None,
            };
            if let Some(lamport) = known.or_else(|| round.lamport(stream, above)) {
                if lamport <= last.lamport {
                    return Err(lamport_error(last, above, lamport));
                }
            }
        }
        Ok(Some(end - start))
    }

    /// Plans a round: validated `deltas` (floors first, then their events in
    /// order), then local `appends`, stamped above everything the deltas
    /// make visible. Changes nothing.
    ///
    /// The resulting state is the one applying the deltas one by one, then
    /// the appends, would give (`replica/tests/shared_rounds.rs`), with one
    /// difference: an event a later delta's floor drops is never received,
    /// so it does not move the clock, where one by one it would have. The
    /// clock stays at or above every stamp held, which is all it promises.
    pub(crate) fn plan_round<'d>(
        &self,
        deltas: &[&'d Delta],
        appends: &[AppendRequest],
    ) -> Plan<'d> {
        let own = self.config.stream;
        let mut plan = Plan {
            reports: vec![ApplyReport::default(); deltas.len()],
            ..Plan::default()
        };
        let mut sims: BTreeMap<StreamId, SimStream<'_, 'd>> = BTreeMap::new();
        let mut pending_len = self.pending_len;
        let mut clock = self.clock;

        // Floors first, each stream's highest: the store deletes below the
        // floors before it adds the round's events, so the plan must too.
        let mut floors: BTreeMap<StreamId, (u64, usize)> = BTreeMap::new();
        for (index, delta) in deltas.iter().enumerate() {
            for (stream, floor_seq) in delta.floor.iter() {
                // A peer never compacts this replica's own stream (validated
                // not to pass its head): its own events are its to keep.
                if stream == own && !self.recovering {
                    continue;
                }
                let entry = floors.entry(stream).or_insert((floor_seq, index));
                if floor_seq > entry.0 {
                    *entry = (floor_seq, index);
                }
            }
        }
        for (stream, (floor_seq, index)) in floors {
            let sim = self.sim(&mut sims, stream);
            if floor_seq <= sim.floor {
                continue;
            }
            let discarded = sim.log.map_or(0, |log| match sim.head.checked_add(1) {
                Some(first) => log.early_count_in(first..=floor_seq),
                None => 0,
            });
            pending_len -= discarded;
            sim.floor = floor_seq;
            sim.head = sim.head.max(floor_seq);
            plan.batch.floors.push((stream, floor_seq));
            plan.ops.push(Op::Floor(plan.batch.floors.len() - 1));
            plan.reports[index].floors_raised += 1;
            let report = &mut plan.reports[index];
            release(
                stream,
                sim,
                &mut plan.batch,
                &mut plan.ops,
                report,
                &mut pending_len,
                &mut clock,
            );
        }

        for (index, delta) in deltas.iter().enumerate() {
            let mut position = 0;
            while let Some(event) = delta.events.get(position) {
                let stream = event.stream;
                let sim = self.sim(&mut sims, stream);
                let report = &mut plan.reports[index];
                let no_early = sim.added.is_empty() && sim.log.is_none_or(StreamLog::has_no_early);
                if no_early && Some(event.seq) == sim.head.checked_add(1) {
                    // A run extending the head, with nothing pending to
                    // release: held as one operation (validated, so its
                    // stamps rise).
                    let len = delta.events[position..]
                        .iter()
                        .enumerate()
                        .take_while(|(i, next)| {
                            next.stream == stream
                                && Some(next.seq) == event.seq.checked_add(*i as u64)
                        })
                        .count();
                    let run = &delta.events[position..position + len];
                    let last = &run[len - 1];
                    sim.head = last.seq;
                    clock = clock.max(last.lamport);
                    let run = plan.batch.add_events(run);
                    plan.ops.push(Op::Events {
                        run,
                        source: Source::Received,
                    });
                    report.applied += len as u64;
                    position += len;
                    continue;
                }
                position += 1;
                let pending = sim.added.contains_key(&event.seq)
                    || sim.log.is_some_and(|log| log.early(event.seq).is_some());
                if event.seq <= sim.floor {
                    report.below_floor += 1;
                } else if event.seq <= sim.head || pending {
                    report.duplicates += 1;
                } else if Some(event.seq) == sim.head.checked_add(1) {
                    sim.head = event.seq;
                    clock = clock.max(event.lamport);
                    let run = plan.batch.add_events(&delta.events[position - 1..position]);
                    plan.ops.push(Op::Events {
                        run,
                        source: Source::Received,
                    });
                    report.applied += 1;
                    release(
                        stream,
                        sim,
                        &mut plan.batch,
                        &mut plan.ops,
                        report,
                        &mut pending_len,
                        &mut clock,
                    );
                } else if pending_len < self.config.pending_events_max {
                    sim.added.insert(event.seq, event);
                    plan.ops.push(Op::Hold(event.clone()));
                    pending_len += 1;
                    report.pending += 1;
                } else {
                    report.dropped += 1;
                }
            }
        }

        let mut own_head = self.sim(&mut sims, own).head;
        self.plan_appends(
            appends,
            &mut own_head,
            &mut clock,
            &mut plan,
            &mut pending_len,
        );
        self.sim(&mut sims, own).head = own_head;
        plan.batch.clock = clock;
        plan.pending_len_after = pending_len;
        plan.heads_after = sims
            .iter()
            .map(|(&stream, sim)| (stream, sim.head))
            .collect();
        plan
    }

    /// Plans a round of deltas in columns as columns, then `appends` (as
    /// [`State::plan_round`] plans them), if every delta is *clean*: no
    /// floor, one run per stream, streams ascending, none this replica's
    /// own, each run from its stream's head + 1 (as the deltas before it
    /// in the round leave it) with nothing pending in the stream, stamps
    /// rising above the head's up to `LAMPORT_MAX`, payloads within the
    /// limit, and room for the new streams. Those are deltas the event
    /// path takes whole, each run as one operation, and plans alike
    /// ([`State::clean_run`], [`State::plan_round`]). Anything else is
    /// `None`: the caller plans the round as events, which validate each
    /// delta and say why it is refused, if it is. So is every round on a
    /// store on disk, which commits events (it would make them from the
    /// columns, a copy more than making them over a delta's own payloads).
    /// Changes nothing.
    pub(crate) fn plan_columns<'d>(
        &self,
        deltas: &[&'d DeltaColumns],
        appends: &[AppendRequest],
    ) -> Option<Plan<'d>> {
        if !self.log.is_in_memory() {
            return None;
        }
        let mut plan = Plan {
            reports: vec![ApplyReport::default(); deltas.len()],
            ..Plan::default()
        };
        let mut clock = self.clock;
        // Per stream the round touched: its head and the head's stamp, as
        // the round's runs so far leave them.
        let mut heads: BTreeMap<StreamId, (u64, u64)> = BTreeMap::new();
        let mut new_streams = 0usize;
        for (index, columns) in deltas.iter().enumerate() {
            if !columns.floor.is_empty() {
                return None;
            }
            let mut previous: Option<StreamId> = None;
            for run in columns.run_parts() {
                let stream = run.stream;
                if stream == self.config.stream || previous.is_some_and(|before| before >= stream) {
                    return None;
                }
                previous = Some(stream);
                let log = self.log.stream(stream);
                if log.is_some_and(|log| !log.has_no_early()) {
                    return None;
                }
                let floor_seq = self.floor.get(stream);
                let (head, head_lamport) = match heads.get(&stream) {
                    Some(&planned) => planned,
                    None => {
                        new_streams += usize::from(log.is_none());
                        let head = log.map_or(0, StreamLog::head);
                        let lamport = if head > floor_seq {
                            self.log.known_lamport(log?, head).ok()?.unwrap_or(0)
                        } else {
                            0
                        };
                        (head, lamport)
                    }
                };
                if run.len() == 0 {
                    return None;
                }
                let last_lamport = run.last_lamport();
                if head.checked_add(1) != Some(run.first_seq)
                    || run.first_seq <= floor_seq
                    || run.first_seq.checked_add(run.len() as u64 - 1).is_none()
                    || run.lamports.get(0) <= head_lamport
                    || last_lamport > crate::LAMPORT_MAX
                    || !run.lamports.rises(true)
                    || run.has_payload_over(self.config.payload_bytes_max)
                {
                    return None;
                }
                heads.insert(stream, (run.last_seq(), last_lamport));
                clock = clock.max(last_lamport);
                plan.reports[index].applied += run.len() as u64;
                let run = plan.batch.add_columns(run);
                plan.ops.push(Op::Events {
                    run,
                    source: Source::Received,
                });
            }
        }
        if self.log.stream_count() + new_streams > self.config.streams_max {
            return None;
        }
        // Then the appends, stamped above everything the deltas hold.
        let mut pending_len = self.pending_len;
        let own = self.config.stream;
        let mut own_head = self.log.head(own);
        self.plan_appends(
            appends,
            &mut own_head,
            &mut clock,
            &mut plan,
            &mut pending_len,
        );
        if !appends.is_empty() {
            heads.insert(own, (own_head, 0));
        }
        plan.batch.clock = clock;
        plan.pending_len_after = pending_len;
        plan.heads_after = heads
            .into_iter()
            .map(|(stream, (head, _))| (stream, head))
            .collect();
        Some(plan)
    }

    /// Plans each of `appends` in turn ([`State::plan_append`]), its
    /// outcome pushed to the plan's `appended`.
    fn plan_appends(
        &self,
        appends: &[AppendRequest],
        own_head: &mut u64,
        clock: &mut u64,
        plan: &mut Plan,
        pending_len: &mut usize,
    ) {
        let own_log = self.log.stream(self.config.stream);
        for request in appends {
            let result = self.plan_append(request, own_head, clock, own_log, plan, pending_len);
            plan.appended.push(result);
        }
    }

    fn plan_append(
        &self,
        request: &AppendRequest,
        own_head: &mut u64,
        clock: &mut u64,
        own_log: Option<&StreamLog>,
        plan: &mut Plan,
        pending_len: &mut usize,
    ) -> Result<usize, ReplicaError> {
        let stream = self.config.stream;
        if self.recovering {
            return Err(ReplicaError::Recovering {
                stream,
                head: *own_head,
            });
        }
        for payload in request.payloads {
            if payload.len() > self.config.payload_bytes_max {
                return Err(ReplicaError::PayloadTooLarge {
                    stream,
                    len: payload.len(),
                    limit: self.config.payload_bytes_max,
                });
            }
        }
        let exhausted = || ReplicaError::ClockExhausted { stream };
        let len = u64::try_from(request.payloads.len()).map_err(|_| exhausted())?;
        own_head.checked_add(len).ok_or_else(exhausted)?;
        clock.checked_add(len).ok_or_else(exhausted)?;
        let mut events = Vec::with_capacity(request.payloads.len());
        for payload in request.payloads {
            *own_head += 1;
            *clock += 1;
            // An early event of our own stream (left from a recovery) is
            // replaced by ours.
            if own_log.is_some_and(|log| log.early(*own_head).is_some()) {
                *pending_len -= 1;
            }
            events.push(Event {
                stream,
                seq: *own_head,
                lamport: *clock,
                time_ms: request.time_ms,
                payload: payload.clone(),
            });
        }
        let len = events.len();
        let run = plan.batch.add_events(events);
        if len > 0 {
            plan.ops.push(Op::Events {
                run,
                source: Source::Appended,
            });
        }
        Ok(run)
    }

    /// Plans a compaction to `target` (per stream, clamped to the head: a
    /// replica compacts only what it holds). Changes nothing.
    pub(crate) fn plan_compact(&self, target: &VersionVector) -> Plan<'static> {
        let mut plan = Plan {
            pending_len_after: self.pending_len,
            ..Plan::default()
        };
        plan.batch.clock = self.clock;
        let mut report = CompactReport::default();
        for (stream, target_seq) in target.iter() {
            let Some(log) = self.log.stream(stream) else {
                continue;
            };
            let floor_seq = target_seq.min(log.head());
            if floor_seq > log.floor {
                report.dropped += floor_seq - log.floor;
                report.streams += 1;
                plan.batch.floors.push((stream, floor_seq));
                plan.ops.push(Op::Floor(plan.batch.floors.len() - 1));
                plan.heads_after.push((stream, log.head()));
            }
        }
        plan.compacted = Some(report);
        plan
    }

    /// Performs a committed plan. Cannot fail: every check was made when
    /// planning; what is asserted here is that planning and publishing
    /// agree, which only a bug breaks.
    pub(crate) fn publish(&mut self, plan: &Plan<'_>, view: Option<StoreView>) {
        // A store that records the digest hands it over with its view, so
        // the events a compaction drops need not be read to subtract them.
        let recorded = view.as_ref().and_then(|view| view.digest);
        let mut touched: Vec<StreamId> = Vec::new();
        for op in &plan.ops {
            match *op {
                Op::Floor(index) => {
                    let (stream, floor_seq) = plan.batch.floors[index];
                    let lazy = self
                        .digest
                        .get_mut()
                        .unwrap_or_else(PoisonError::into_inner);
                    // Only what was summed is taken out of the sum; the
                    // events not summed yet that the floor drops are gone.
                    let unhashed_from = lazy.unhashed.get(&stream).copied();
                    let sum = &mut lazy.sum;
                    let mut remove = |event: Event| {
                        if unhashed_from.is_none_or(|from| event.seq < from) {
                            sum.remove(&event);
                        }
                    };
                    let dropped: Option<&mut dyn FnMut(Event)> = match recorded {
                        Some(_) => None,
                        None => Some(&mut remove),
                    };
                    let discarded = self
                        .log
                        .raise_floor(stream, floor_seq, dropped)
                        .expect("the own copy of the events never fails a read");
                    let head = self.log.head(stream);
                    let lazy = self.lazy_digest();
                    if let Some(from) = lazy.unhashed.get_mut(&stream) {
                        *from = (*from).max(floor_seq.saturating_add(1));
                        if *from > head {
                            lazy.unhashed.remove(&stream);
                        }
                    }
                    self.pending_len -= discarded;
                    self.floor.advance(stream, floor_seq);
                    touched.push(stream);
                }
                Op::Events { run, source } => {
                    let (stream, first_seq, len, last_lamport, was_early) =
                        match plan.batch.part(run) {
                            BatchPart::Events(run) => {
                                let len = run.len();
                                let was_early = self.log.push_run(run);
                                // Stamps rise with seq: the run's last is
                                // its highest.
                                let last = &run[len - 1];
                                (run[0].stream, run[0].seq, len, last.lamport, was_early)
                            }
                            BatchPart::Columns(run) => {
                                let was_early = self.log.push_columns(run);
                                let last = run.last_lamport();
                                (run.stream, run.first_seq, run.len(), last, was_early)
                            }
                        };
                    match source {
                        Source::Released => {
                            assert_eq!(was_early, len, "a released event was pending");
                        }
                        Source::Received => {
                            assert_eq!(was_early, 0, "a received event was not pending");
                        }
                        Source::Appended => {}
                    }
                    self.pending_len -= was_early;
                    // A store that records the digest has added the events
                    // already: its digest replaces this one below. Else
                    // they are summed when the digest is asked for.
                    if recorded.is_none() {
                        self.lazy_digest()
                            .unhashed
                            .entry(stream)
                            .or_insert(first_seq);
                    }
                    self.clock = self.clock.max(last_lamport);
                    if touched.last() != Some(&stream) {
                        touched.push(stream);
                    }
                }
                Op::Hold(ref event) => {
                    assert!(self.log.hold_early(event), "a held-back event was new");
                    self.pending_len += 1;
                }
            }
        }
        self.clock = self.clock.max(plan.batch.clock);
        if let Some(view) = view {
            self.log.set_view(view);
        }
        if let Some(sum) = recorded {
            *self.lazy_digest() = LazyDigest {
                sum,
                unhashed: BTreeMap::new(),
            };
        }
        touched.sort_unstable();
        touched.dedup();
        for stream in touched {
            self.marks.advance(stream, self.log.head(stream));
        }
        for report in &plan.reports {
            self.stats.applied += report.applied;
            self.stats.duplicates += report.duplicates;
            self.stats.pending_dropped += report.dropped;
        }
        self.stats.deltas_refused += plan.refused;
        self.stats.appended += plan
            .appended
            .iter()
            .filter_map(|run| run.as_ref().ok())
            .map(|&run| plan.batch.run(run).len() as u64)
            .sum::<u64>();
        assert_eq!(
            self.pending_len, plan.pending_len_after,
            "publishing agrees with the plan on the pending buffer"
        );
        for &(stream, head) in &plan.heads_after {
            assert_eq!(
                self.log.head(stream),
                head,
                "publishing agrees with the plan on stream {stream}'s head"
            );
        }
    }

    fn sim<'m, 's, 'd>(
        &'s self,
        sims: &'m mut BTreeMap<StreamId, SimStream<'s, 'd>>,
        stream: StreamId,
    ) -> &'m mut SimStream<'s, 'd> {
        sims.entry(stream).or_insert_with(|| {
            let log = self.log.stream(stream);
            SimStream {
                log,
                floor: log.map_or(0, |log| log.floor),
                head: log.map_or(0, StreamLog::head),
                added: BTreeMap::new(),
            }
        })
    }
}

/// A delta's events sorted by name, `(stream, seq)`.
///
/// A delta lists each stream's events in seq order, interleaved across
/// streams by lamport; so its events are grouped by stream in one pass
/// (O(n), a lookup only when the stream changes) and the groups put in
/// stream order. Only when some stream's seqs do not strictly rise (a
/// repeat or a disorder, i.e. a delta from a faulty or hostile peer) is the
/// whole delta sorted instead, exactly as before, so that equal names come
/// out in the order they always did.
fn sorted_by_name(events: &[Event]) -> Vec<&Event> {
    let name = |event: &Event| (event.stream, event.seq);
    let mut sorted: Vec<&Event> = Vec::with_capacity(events.len());
    if events.is_sorted_by(|a, b| name(a) < name(b)) {
        sorted.extend(events);
        return sorted;
    }
    let mut slots: BTreeMap<StreamId, usize> = BTreeMap::new();
    let mut groups: Vec<(StreamId, Vec<&Event>)> = Vec::new();
    let mut current: Option<(StreamId, usize)> = None;
    for event in events {
        let slot = match current {
            Some((stream, slot)) if stream == event.stream => slot,
            _ => {
                let slot = *slots.entry(event.stream).or_insert_with(|| {
                    groups.push((event.stream, Vec::new()));
                    groups.len() - 1
                });
                current = Some((event.stream, slot));
                slot
            }
        };
        let group = &mut groups[slot].1;
        if group.last().is_some_and(|last| last.seq >= event.seq) {
            sorted.extend(events);
            sorted.sort_unstable_by_key(|event| name(event));
            return sorted;
        }
        group.push(event);
    }
    groups.sort_unstable_by_key(|(stream, _)| *stream);
    for (_, group) in groups {
        sorted.extend(group);
    }
    sorted
}

/// Releases the early events that now follow `sim`'s head, into the plan.
fn release(
    stream: StreamId,
    sim: &mut SimStream,
    batch: &mut Batch,
    ops: &mut Vec<Op>,
    report: &mut ApplyReport,
    pending_len: &mut usize,
    clock: &mut u64,
) {
    while let Some(next) = sim.head.checked_add(1) {
        let event = if let Some(event) = sim.added.remove(&next) {
            event.clone()
        } else if let Some(early) = sim.log.and_then(|log| log.early(next)) {
            Event {
                stream,
                seq: next,
                lamport: early.lamport,
                time_ms: early.time_ms,
                payload: early.payload.clone(),
            }
        } else {
            return;
        };
        sim.head = next;
        *clock = (*clock).max(event.lamport);
        *pending_len -= 1;
        report.applied += 1;
        let run = batch.add_events(vec![event]);
        ops.push(Op::Events {
            run,
            source: Source::Released,
        });
    }
}

fn lamport_error(event: &Event, neighbour_seq: u64, neighbour_lamport: u64) -> ReplicaError {
    DeltaError::LamportNotRising {
        stream: event.stream,
        seq: event.seq,
        lamport: event.lamport,
        neighbour_seq,
        neighbour_lamport,
    }
    .into()
}

/// Checks that `event`, read back for `stream`, is the seq after
/// `head_before`, stamped above `previous` and at or below `clock`.
fn check_next(
    event: &Event,
    stream: StreamId,
    head_before: u64,
    previous: Option<u64>,
    clock: u64,
) -> Result<(), ReplicaError> {
    let corrupt = |detail: String| ReplicaError::Corrupt { stream, detail };
    let expected = head_before.checked_add(1);
    if event.stream != stream || Some(event.seq) != expected {
        return Err(corrupt(format!(
            "expected seq {expected:?}, read stream {} seq {}",
            event.stream, event.seq
        )));
    }
    if let Some(previous) = previous {
        if previous >= event.lamport {
            return Err(corrupt(format!(
                "seq {} has lamport {} after lamport {previous}",
                event.seq, event.lamport
            )));
        }
    }
    if event.lamport > clock {
        return Err(corrupt(format!(
            "seq {} has lamport {} above the recorded clock {clock}",
            event.seq, event.lamport
        )));
    }
    Ok(())
}

pub(crate) fn read_error(error: ReadError) -> ReplicaError {
    ReplicaError::Store(error)
}

pub(crate) fn store_error<E: std::error::Error + Send + Sync + 'static>(error: E) -> ReplicaError {
    ReplicaError::Store(Box::new(error))
}

impl Digest {
    pub(crate) fn add(&mut self, event: &Event) {
        self.events += 1;
        self.sum = self.sum.wrapping_add(event.content_hash());
    }

    pub(crate) fn remove(&mut self, event: &Event) {
        self.events -= 1;
        self.sum = self.sum.wrapping_sub(event.content_hash());
    }
}

/// The digest of the events held, summed when asked: `sum` holds every
/// held event's hash but those of `unhashed`, which per stream is the
/// first held seq not in it (every held seq from it to the head is not).
#[derive(Debug, Default)]
struct LazyDigest {
    sum: Digest,
    unhashed: BTreeMap<StreamId, u64>,
}

/// What a delta holds, found from the log's columns: per stream
/// (ascending) its seqs `(stream, first, last)`, and how many events and
/// payload bytes that is in all.
#[derive(Debug, Default)]
struct DeltaRanges {
    ranges: Vec<(StreamId, u64, u64)>,
    events: usize,
    payload_bytes: usize,
}

/// Whether a read of seqs `first ..= last` of `stream` gave all of them.
fn read_whole(stream: StreamId, first: u64, last: u64, read: usize) -> Result<(), ReadError> {
    if Some(read as u64) == (last - first).checked_add(1) {
        Ok(())
    } else {
        Err(format!("stream {stream} seqs {first}..={last} are held but could not be read").into())
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use meshlog_cursor::{StreamId, VersionVector};
    use meshlog_testkit::{seed, SplitMix64};

    use super::RoundIndex;
    use crate::{Config, Delta, Event, Replica};

    /// A delta of seeded, often hostile events near the heads: runs that
    /// start at, below or above a head, repeat or contradict held and
    /// pending events, stamp out of order, or carry floors.
    fn hostile_delta(rng: &mut SplitMix64, replica: &Replica) -> Delta {
        let mut events = Vec::new();
        for _ in 0..rng.between(1, 3) {
            let stream = StreamId::new(rng.between(1, 4));
            let head = replica.marks().get(stream);
            let mut seq = (head + 1).saturating_sub(rng.below(3)).max(1) + rng.below(2);
            if rng.chance(0.1) {
                seq += rng.between(2, 4);
            }
            for _ in 0..rng.between(1, 6) {
                // Regular, or a neighbour's stamp (equal: not rising), or any.
                let lamport = match rng.below(20) {
                    0 => (seq + rng.below(3)).saturating_sub(1) * 10 + stream.get(),
                    1 => rng.below(80),
                    _ => seq * 10 + stream.get(),
                };
                let payload = if rng.chance(0.9) {
                    Bytes::from(format!("{stream}:{seq}"))
                } else {
                    Bytes::from_static(b"other")
                };
                events.push(Event {
                    stream,
                    seq,
                    lamport,
                    time_ms: 0,
                    payload,
                });
                if rng.chance(0.9) {
                    seq += 1;
                }
            }
        }
        rng.shuffle(&mut events);
        let mut floor = VersionVector::new();
        if rng.chance(0.15) {
            let stream = StreamId::new(rng.between(1, 4));
            floor.advance(stream, replica.marks().get(stream) + rng.below(3));
        }
        Delta { floor, events }
    }

    /// Grouping by stream sorts by name as a sort does, whatever the
    /// interleaving, repeats and disorder of the events.
    /// `delta_for` from any marks with any budget: everything missing,
    /// stream by stream, when it fits; else the oldest missing events in
    /// `(lamport, stream)` order (every missing event stamped below the
    /// newest sent is sent), never above the budget but for one event.
    #[test]
    fn a_delta_is_everything_stream_by_stream_or_the_oldest_that_fits() {
        let seed = seed::replay_or(0xde17a);
        let mut rng = SplitMix64::new(seed);
        let ids = [9u64, 2, 40, 7];
        let mut writers: Vec<Replica> = ids
            .iter()
            .map(|&id| Replica::new(StreamId::new(id)))
            .collect();
        let mut all = Replica::new(StreamId::new(1));
        for _ in 0..600 {
            let w = rng.below(ids.len() as u64) as usize;
            let payload = vec![0u8; rng.below(300) as usize];
            writers[w].append(Bytes::from(payload)).unwrap();
            if rng.below(4) == 0 {
                let target = rng.below(ids.len() as u64) as usize;
                let delta = writers[w].delta_for(&writers[target].marks(), usize::MAX);
                writers[target].apply(&delta).unwrap();
            }
            let delta = writers[w].delta_for(&all.marks(), usize::MAX);
            all.apply(&delta).unwrap();
        }
        let key = |e: &Event| (e.lamport, e.stream);
        let everything = all.delta_for(&VersionVector::new(), usize::MAX).events;
        let mut by_lamport = everything.clone();
        by_lamport.sort_by_key(key);
        for _ in 0..200 {
            // A reader's marks somewhere below the heads, and a budget.
            let their: VersionVector = ids
                .iter()
                .map(|&id| {
                    let head = all.marks().get(StreamId::new(id));
                    (StreamId::new(id), rng.below(head + 1))
                })
                .collect();
            let missing: Vec<&Event> = by_lamport
                .iter()
                .filter(|e| e.seq > their.get(e.stream))
                .collect();
            let budget = rng.below(missing.len() as u64 * 350 + 1) as usize;
            let delta = all.delta_for(&their, budget);
            // The same events as columns, read from the chunks' columns.
            let columns = all.delta_columns_for(&their, budget);
            assert_eq!(
                columns,
                crate::DeltaColumns::from_delta(&delta),
                "seed {seed}"
            );
            assert_eq!(columns.to_delta(), delta, "seed {seed}");
            let sizes: usize = delta.events.iter().map(Event::size_hint).sum();
            assert!(
                sizes <= budget || delta.events.len() == 1,
                "within the budget, seed {seed}"
            );
            if delta.events.len() == missing.len() {
                // Everything: stream by stream, streams ascending.
                let mut names: Vec<(StreamId, u64)> =
                    missing.iter().map(|e| (e.stream, e.seq)).collect();
                names.sort_unstable();
                let got: Vec<(StreamId, u64)> =
                    delta.events.iter().map(|e| (e.stream, e.seq)).collect();
                assert_eq!(got, names, "seed {seed}");
            } else {
                // Cut: the oldest missing events (a prefix in `(lamport,
                // stream)` order), stream by stream, streams ascending.
                let mut got: Vec<&Event> = delta.events.iter().collect();
                assert!(
                    got.is_sorted_by_key(|e| (e.stream, e.seq)),
                    "stream by stream, seed {seed}"
                );
                got.sort_by_key(|e| key(e));
                assert_eq!(got, missing[..got.len()], "seed {seed}");
                assert!(!got.is_empty() || missing.is_empty(), "seed {seed}");
                // The longest such prefix: the next one would not fit.
                if let Some(next) = missing.get(got.len()) {
                    assert!(
                        sizes + next.size_hint() > budget,
                        "the next oldest fits too, seed {seed}"
                    );
                }
            }
        }
    }

    /// The digest is summed when asked: a replica asked after every step
    /// and one asked only at the end answer the same, and both the sum of
    /// the hashes of the events they hold, through appends, deltas (with
    /// floors, some above the head) and compactions.
    #[test]
    fn a_digest_summed_when_asked_is_the_sum_of_what_is_held() {
        let seed = seed::replay_or(0xd1_6e57);
        let mut rng = SplitMix64::new(seed);
        let ids = [4u64, 11, 30];
        let mut writers: Vec<Replica> = ids
            .iter()
            .map(|&id| Replica::new(StreamId::new(id)))
            .collect();
        let mut asked = Replica::new(StreamId::new(1));
        let mut unasked = Replica::new(StreamId::new(1));
        let held_sum = |replica: &Replica| {
            let mut digest = crate::Digest::default();
            for event in replica.delta_for(&VersionVector::new(), usize::MAX).events {
                digest.add(&event);
            }
            digest
        };
        for step in 0..600 {
            let w = rng.below(ids.len() as u64) as usize;
            match rng.below(10) {
                0 | 1 => {
                    // A writer compacts (so its deltas carry floors).
                    let head = writers[w].marks().get(StreamId::new(ids[w]));
                    let target: VersionVector = [(StreamId::new(ids[w]), rng.below(head + 1))]
                        .into_iter()
                        .collect();
                    writers[w].compact(&target).unwrap();
                }
                2 => {
                    // The readers compact somewhere below their heads.
                    let target: VersionVector = ids
                        .iter()
                        .map(|&id| {
                            let head = asked.marks().get(StreamId::new(id));
                            (StreamId::new(id), rng.below(head + 1))
                        })
                        .collect();
                    asked.compact(&target).unwrap();
                    unasked.compact(&target).unwrap();
                }
                _ => {
                    for _ in 0..rng.below(5) {
                        writers[w]
                            .append(Bytes::from(vec![step as u8; 20]))
                            .unwrap();
                    }
                    let delta = writers[w].delta_for(&asked.marks(), rng.below(3000) as usize);
                    asked.apply(&delta).unwrap();
                    unasked.apply(&delta).unwrap();
                }
            }
            assert_eq!(asked.digest(), held_sum(&asked), "step {step}, seed {seed}");
        }
        assert_eq!(unasked.marks(), asked.marks(), "seed {seed}");
        assert_eq!(unasked.digest(), asked.digest(), "seed {seed}");
        assert_eq!(unasked.digest(), held_sum(&unasked), "seed {seed}");
        assert!(asked.digest().events > 0, "seed {seed}");
        unasked.verify().unwrap();
    }

    #[test]
    fn events_are_sorted_by_name() {
        let seed = seed::replay_or(0x50_47ed);
        let mut rng = SplitMix64::new(seed);
        for case in 0..500 {
            let mut heads = [0u64; 5];
            let mut events = Vec::new();
            for _ in 0..rng.below(60) {
                let stream = rng.below(5) as usize;
                let seq = match rng.below(30) {
                    0 => rng.below(heads[stream] + 2),
                    _ => {
                        heads[stream] += 1 + u64::from(rng.chance(0.1));
                        heads[stream]
                    }
                };
                events.push(Event {
                    stream: StreamId::new(stream as u64 * 3),
                    seq,
                    lamport: 0,
                    time_ms: 0,
                    payload: Bytes::new(),
                });
            }
            let got: Vec<(StreamId, u64)> = super::sorted_by_name(&events)
                .iter()
                .map(|event| (event.stream, event.seq))
                .collect();
            let mut expected: Vec<(StreamId, u64)> = events
                .iter()
                .map(|event| (event.stream, event.seq))
                .collect();
            expected.sort_unstable();
            assert_eq!(got, expected, "case {case}, seed {seed}");
        }
    }

    /// Checking clean runs as runs answers exactly what checking every
    /// event one by one answers, error included, on seeded hostile deltas
    /// against states with held and pending events, alone and after an
    /// earlier delta of the same round.
    #[test]
    fn runs_are_validated_as_event_by_event_validation_would() {
        seed::for_each_seed("runs_validated_as_events", 0x7_2e45, 40, |seed| {
            let mut rng = SplitMix64::new(seed);
            let mut config = Config::new(StreamId::new(1));
            config.recover_own_stream = rng.chance(0.2);
            let mut replica = Replica::open(config, crate::MemStore::default()).unwrap();
            let (mut fast, mut slow) = (0, 0);
            for step in 0..300 {
                let delta = hostile_delta(&mut rng, &replica);
                let earlier = hostile_delta(&mut rng, &replica);
                let mut round = RoundIndex::default();
                if rng.chance(0.3) && replica.state.validate(&earlier, &round).is_ok() {
                    round.add(&replica.state, &earlier);
                }
                let runs = replica.state.validate_with(&delta, &round, true);
                let events = replica.state.validate_with(&delta, &round, false);
                assert_eq!(
                    format!("{runs:?}"),
                    format!("{events:?}"),
                    "step {step}: {delta:?}"
                );
                // (A round's floors can let a delta pass that alone fails.)
                if runs.is_ok() && replica.apply(&delta).is_ok() {
                    fast += 1;
                } else {
                    slow += 1;
                }
            }
            // Both outcomes are exercised.
            assert!(fast > 20 && slow > 20, "accepted {fast}, refused {slow}");
        });
    }
}
