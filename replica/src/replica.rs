//! `Replica`: one runtime's copy of the log.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshlog_cursor::token::STREAMS_MAX;
use meshlog_cursor::{StreamId, VersionVector};

use crate::log::Log;
use crate::{Batch, Event, MemStore, PageError, ReplicaError, Store};

/// A replica's settings and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This replica's own writer stream.
    pub stream: StreamId,
    /// The most early events (with a hole below them) held back at once,
    /// over all streams. Beyond it they are dropped and counted; anti-entropy
    /// fetches them again.
    pub pending_events_max: usize,
    /// The largest payload accepted, in bytes.
    pub payload_bytes_max: usize,
    /// The longest page a reader may ask for.
    pub page_len_max: usize,
    /// The most streams a replica holds.
    pub streams_max: usize,
}

impl Config {
    /// Defaults for a replica writing `stream`: 4,096 pending events, 1 MiB
    /// payloads, pages of up to 10,000 events, up to
    /// [`STREAMS_MAX`](meshlog_cursor::token::STREAMS_MAX) streams (what a
    /// token can carry).
    pub fn new(stream: StreamId) -> Self {
        Config {
            stream,
            pending_events_max: 4096,
            payload_bytes_max: 1 << 20,
            page_len_max: 10_000,
            streams_max: STREAMS_MAX,
        }
    }
}

/// A page of events, and the cursor to resume from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Up to `limit` events not covered by the cursor, ordered by
    /// `(lamport, stream)`.
    pub events: Vec<Event>,
    /// The cursor joined with the page: pass it to the next call.
    pub next: VersionVector,
    /// Whether `next` covers every event this replica holds now.
    pub at_head: bool,
}

/// What one replica sends another: the events the other misses, per stream
/// contiguous from the other's mark, and the sender's floor where the other's
/// mark is below it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// Floors the receiver must record (it cannot get the events below them).
    pub floor: VersionVector,
    /// Events in `(lamport, stream)` order; per stream in seq order.
    pub events: Vec<Event>,
}

/// What applying a delta did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Events that became visible (including early ones released from the
    /// pending buffer).
    pub applied: u64,
    /// Events already held (or already pending).
    pub duplicates: u64,
    /// Early events now waiting in the pending buffer.
    pub pending: u64,
    /// Early events dropped because the pending buffer was full.
    pub dropped: u64,
    /// Events at or below the floor, ignored.
    pub below_floor: u64,
    /// Streams whose floor the delta raised.
    pub floors_raised: u64,
}

/// What a compaction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Events dropped.
    pub dropped: u64,
    /// Streams whose floor rose.
    pub streams: u64,
}

/// A fingerprint of the events a replica holds: their count and the wrapping
/// sum of their content hashes. Independent of arrival order; two replicas
/// with equal floors, marks and digests hold the same events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Digest {
    /// How many events are held.
    pub events: u64,
    /// The wrapping sum of [`Event::content_hash`] over them.
    pub sum: u128,
}

/// Counters since the replica was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Local appends.
    pub appended: u64,
    /// Received events made visible.
    pub applied: u64,
    /// Received events already held.
    pub duplicates: u64,
    /// Early events dropped for a full pending buffer.
    pub pending_dropped: u64,
    /// Deltas refused (equivocation, bad lamport, limits).
    pub deltas_refused: u64,
}

/// One runtime's replica of the log: its own stream, which it appends to, and
/// every other stream it has received, each a gap-free prefix above its floor.
///
/// ```
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::Replica;
///
/// let mut a = Replica::new(StreamId::new(1));
/// let mut b = Replica::new(StreamId::new(2));
/// a.append(&b"from a"[..])?;
/// b.append(&b"from b"[..])?;
/// // Anti-entropy: each sends what the other misses.
/// let to_b = a.delta_for(&b.marks(), usize::MAX);
/// let to_a = b.delta_for(&a.marks(), usize::MAX);
/// b.apply(&to_b)?;
/// a.apply(&to_a)?;
/// assert_eq!(a.digest(), b.digest());
///
/// // A reader walks a's log, then resumes on b: nothing twice, nothing missed.
/// let first = a.page(&VersionVector::new(), 1)?;
/// let rest = b.page(&first.next, 10)?;
/// assert_eq!(first.events.len() + rest.events.len(), 2);
/// assert!(rest.at_head);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Replica<S: Store = MemStore> {
    config: Config,
    log: Log,
    marks: VersionVector,
    floor: VersionVector,
    clock: u64,
    pending_len: usize,
    digest: Digest,
    stats: Stats,
    store: S,
    failed: bool,
}

impl Replica<MemStore> {
    /// A new, empty replica writing `stream`, on an in-memory store, with
    /// default limits.
    pub fn new(stream: StreamId) -> Self {
        Replica::open(Config::new(stream), MemStore::default())
            .expect("an empty in-memory store always opens")
    }
}

impl<S: Store> Replica<S> {
    /// Opens a replica on `store`, recovering and checking what it holds:
    /// per stream the events `floor+1 ..= head` with none missing, lamport
    /// rising with seq, and a clock at or above every stamp recorded.
    pub fn open(config: Config, store: S) -> Result<Self, ReplicaError> {
        let meta = store.meta().map_err(store_error)?;
        let mut replica = Replica {
            config,
            log: Log::default(),
            marks: VersionVector::new(),
            floor: meta.floor.clone(),
            clock: meta.clock,
            pending_len: 0,
            digest: Digest::default(),
            stats: Stats::default(),
            store,
            failed: false,
        };
        let streams: Vec<(StreamId, u64)> = meta.heads.iter().collect();
        if streams.len() > replica.config.streams_max {
            return Err(ReplicaError::TooManyStreams {
                streams: streams.len(),
                limit: replica.config.streams_max,
            });
        }
        let mut chunk = Vec::new();
        for (stream, head) in streams {
            let floor = meta.floor.get(stream);
            let corrupt = |detail: String| ReplicaError::Corrupt { stream, detail };
            if head < floor {
                return Err(corrupt(format!("head {head} is below floor {floor}")));
            }
            replica.log.ensure_stream(stream, floor);
            while replica.log.head(stream) < head {
                chunk.clear();
                let after = replica.log.head(stream);
                replica
                    .store
                    .read_stream(stream, after, 4096, &mut chunk)
                    .map_err(store_error)?;
                if chunk.is_empty() {
                    return Err(corrupt(format!(
                        "store holds seqs {}..={after} but records head {head}",
                        floor + 1
                    )));
                }
                for event in &chunk {
                    let expected = replica.log.head(stream) + 1;
                    if event.stream != stream || event.seq != expected {
                        return Err(corrupt(format!(
                            "expected seq {expected}, read stream {} seq {}",
                            event.stream, event.seq
                        )));
                    }
                    let previous = replica.log.stream(stream).and_then(|l| l.last_lamport());
                    if let Some(previous) = previous {
                        if previous >= event.lamport {
                            return Err(corrupt(format!(
                                "seq {} has lamport {} after lamport {previous}",
                                event.seq, event.lamport
                            )));
                        }
                    }
                    if event.lamport > replica.clock {
                        return Err(corrupt(format!(
                            "seq {} has lamport {} above the recorded clock {}",
                            event.seq, event.lamport, replica.clock
                        )));
                    }
                    replica.digest.add(event);
                    replica.log.push(event);
                }
            }
            if replica.log.head(stream) != head {
                return Err(corrupt(format!(
                    "read up to seq {} past the recorded head {head}",
                    replica.log.head(stream)
                )));
            }
            replica.marks.advance(stream, head);
        }
        tracing::debug!(
            stream = %replica.config.stream,
            streams = replica.log.stream_count(),
            events = replica.digest.events,
            clock = replica.clock,
            "replica opened"
        );
        Ok(replica)
    }

    /// This replica's own stream.
    pub fn stream(&self) -> StreamId {
        self.config.stream
    }

    /// The settings this replica was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The marks (head vector): per stream, the last seq held with no hole
    /// below it. What sync sends as high-water marks.
    pub fn marks(&self) -> VersionVector {
        self.marks.clone()
    }

    /// The floor: per stream, the last seq compacted away (here or, learned
    /// through sync, at a peer).
    pub fn floor(&self) -> VersionVector {
        self.floor.clone()
    }

    /// The lamport clock: at or above every stamp issued or seen.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// A fingerprint of the events held.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// Counters since open.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// How many early events wait in the pending buffer.
    pub fn pending_len(&self) -> usize {
        self.pending_len
    }

    /// The event `(stream, seq)`, if held (pending events are not visible).
    pub fn get(&self, stream: StreamId, seq: u64) -> Option<Event> {
        self.log.get(stream, seq)
    }

    /// `(seq, time_ms)` of the held events of `stream`, in seq order.
    pub(crate) fn held_times(&self, stream: StreamId) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.log.times(stream)
    }

    /// The store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Closes the replica and hands back its store (to reopen it, say).
    pub fn into_store(self) -> S {
        self.store
    }

    /// Appends a local event stamped with the current wall-clock time.
    /// Returns it once the store has committed it.
    pub fn append(&mut self, payload: impl Into<Bytes>) -> Result<Event, ReplicaError> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.append_at(payload, now_ms)
    }

    /// Appends a local event with an explicit wall-clock time (for replays
    /// and deterministic tests).
    pub fn append_at(
        &mut self,
        payload: impl Into<Bytes>,
        time_ms: u64,
    ) -> Result<Event, ReplicaError> {
        let mut events = self.append_batch_at([payload.into()], time_ms)?;
        Ok(events.pop().expect("one payload gives one event"))
    }

    /// Appends several local events in one store commit (group commit: one
    /// durable write for many callers' events). All or none are appended.
    pub fn append_batch_at(
        &mut self,
        payloads: impl IntoIterator<Item = Bytes>,
        time_ms: u64,
    ) -> Result<Vec<Event>, ReplicaError> {
        self.check_usable()?;
        let stream = self.config.stream;
        let _span = tracing::trace_span!("append", %stream).entered();
        let mut seq = self.marks.get(stream);
        let mut lamport = self.clock;
        let mut events = Vec::new();
        for payload in payloads {
            if payload.len() > self.config.payload_bytes_max {
                return Err(ReplicaError::PayloadTooLarge {
                    stream,
                    len: payload.len(),
                    limit: self.config.payload_bytes_max,
                });
            }
            let exhausted = || ReplicaError::ClockExhausted { stream };
            seq = seq.checked_add(1).ok_or_else(exhausted)?;
            lamport = lamport.checked_add(1).ok_or_else(exhausted)?;
            events.push(Event {
                stream,
                seq,
                lamport,
                time_ms,
                payload,
            });
        }
        if events.is_empty() {
            return Ok(events);
        }
        let batch = Batch {
            events,
            floors: Vec::new(),
            clock: lamport,
        };
        // Durable first: nothing is paged or sent that the store could forget.
        self.commit(&batch)?;
        self.clock = lamport;
        for event in &batch.events {
            // An early event of our own stream can only come from a peer
            // holding what this writer forgot; ours replaces it.
            if self.log.forget_early(stream, event.seq) {
                self.pending_len -= 1;
            }
            self.log.push(event);
            self.digest.add(event);
        }
        self.marks.advance(stream, seq);
        self.stats.appended += batch.events.len() as u64;
        tracing::trace!(%stream, last_seq = seq, lamport, len = batch.events.len(), "append");
        Ok(batch.events)
    }

    /// Up to `limit` events not covered by `after`, ordered by
    /// `(lamport, stream)`, and `next = after ⊔ page`.
    ///
    /// Refuses a cursor below the floor with [`PageError::Stale`], naming
    /// every stream and range lost, and every cursor with
    /// [`PageError::Failed`] once a store commit has failed (`apply` and
    /// `compact` change memory before they commit). Costs O(S + limit · log S) for S streams,
    /// plus logarithmic seeks into the ordered log, whatever the log's
    /// length. A cursor from any replica of the mesh is valid here.
    pub fn page(&self, after: &VersionVector, limit: usize) -> Result<Page, PageError> {
        if limit > self.config.page_len_max {
            return Err(PageError::LimitTooLarge {
                limit,
                max: self.config.page_len_max,
            });
        }
        let _span = tracing::trace_span!("page", limit).entered();
        if self.failed {
            return Err(PageError::Failed);
        }
        after.check_floor(&self.floor)?;
        let mut walk = self.log.walk(after);
        let events: Vec<Event> = walk.by_ref().take(limit).collect();
        let at_head = walk.is_done();
        let next = walk.cursor(after);
        tracing::trace!(len = events.len(), at_head, "page");
        Ok(Page {
            events,
            next,
            at_head,
        })
    }

    /// The delta a peer with marks `their_marks` misses: our floor where
    /// their mark is below it, and events per stream contiguous from their
    /// mark, in `(lamport, stream)` order, up to `byte_budget` bytes by
    /// [`Event::size_hint`] (at least one event if any is missing).
    ///
    /// Empty once a store commit has failed: a replica sends nothing its
    /// store may not hold, so no peer gets an event its writer could forget.
    pub fn delta_for(&self, their_marks: &VersionVector, byte_budget: usize) -> Delta {
        if self.failed {
            return Delta::default();
        }
        let floor: VersionVector = self
            .floor
            .iter()
            .filter(|&(stream, floor_seq)| their_marks.get(stream) < floor_seq)
            .collect();
        let mut events = Vec::new();
        let mut used = 0usize;
        for event in self.log.walk(their_marks) {
            let size = event.size_hint();
            if !events.is_empty() && used.saturating_add(size) > byte_budget {
                break;
            }
            used = used.saturating_add(size);
            events.push(event);
        }
        Delta { floor, events }
    }

    /// Checks a delta against this replica without changing anything: the
    /// first step of [`Replica::apply`].
    pub fn validate(&self, delta: &Delta) -> Result<(), ReplicaError> {
        // The delta's events by name: two versions of one name sit side by
        // side, and so do an event and its neighbours in the same delta, so
        // every check is against the log or an adjacent entry — whatever
        // order the events came in.
        let mut by_name: Vec<&Event> = delta.events.iter().collect();
        by_name.sort_unstable_by_key(|event| (event.stream, event.seq));
        let mut new_streams: Vec<StreamId> = delta
            .floor
            .iter()
            .map(|(stream, _)| stream)
            .filter(|&stream| !self.log.has_stream(stream))
            .collect();
        // The stream's log, looked up once per run of its events.
        let mut log: Option<&crate::log::StreamLog> = None;
        for (index, &event) in by_name.iter().enumerate() {
            let stream = event.stream;
            if event.seq == 0 {
                return Err(ReplicaError::ZeroSeq { stream });
            }
            if event.payload.len() > self.config.payload_bytes_max {
                return Err(ReplicaError::PayloadTooLarge {
                    stream,
                    len: event.payload.len(),
                    limit: self.config.payload_bytes_max,
                });
            }
            if index == 0 || by_name[index - 1].stream != stream {
                log = self.log.stream(stream);
                if log.is_none() {
                    new_streams.push(stream);
                }
            }
            let floor_seq = self.floor.get(stream).max(delta.floor.get(stream));
            if event.seq <= floor_seq {
                continue;
            }
            // Any other version of this name, held, pending or in this delta
            // (the entry before, once sorted), must be this very event.
            let same_as_held = log
                .and_then(|log| self.log.known_in(log, event.seq))
                .is_none_or(|content| content.same_as(event));
            let previous = index.checked_sub(1).map(|i| by_name[i]);
            let same_as_offered = previous
                .filter(|other| other.stream == stream && other.seq == event.seq)
                .is_none_or(|other| other == event);
            if !(same_as_held && same_as_offered) {
                return Err(ReplicaError::Equivocation {
                    stream,
                    seq: event.seq,
                });
            }
            // Lamport rises with seq against every neighbour known: held,
            // pending, or the nearest entries of this delta either side
            // (past repeats of this very name).
            let in_delta = |seq: u64, entries: &mut dyn Iterator<Item = &&Event>| {
                entries
                    .take_while(|other| other.stream == stream)
                    .find(|other| other.seq != event.seq)
                    .filter(|other| other.seq == seq)
                    .map(|other| other.lamport)
            };
            let below = event.seq - 1;
            if below > floor_seq {
                let lamport = log
                    .and_then(|log| log.known_lamport(below))
                    .or_else(|| in_delta(below, &mut by_name[..index].iter().rev()));
                if let Some(lamport) = lamport {
                    if lamport >= event.lamport {
                        return Err(lamport_error(event, below, lamport));
                    }
                }
            }
            if let Some(above) = event.seq.checked_add(1) {
                let lamport = log
                    .and_then(|log| log.known_lamport(above))
                    .or_else(|| in_delta(above, &mut by_name[index + 1..].iter()));
                if let Some(lamport) = lamport {
                    if lamport <= event.lamport {
                        return Err(lamport_error(event, above, lamport));
                    }
                }
            }
        }
        new_streams.sort_unstable();
        new_streams.dedup();
        let streams = self.log.stream_count() + new_streams.len();
        if streams > self.config.streams_max {
            return Err(ReplicaError::TooManyStreams {
                streams,
                limit: self.config.streams_max,
            });
        }
        Ok(())
    }

    /// Validates, then applies a delta from a peer. Idempotent and
    /// order-free: the same deltas in any order, any number of times, leave
    /// the same state. Early events wait in the pending buffer and are never
    /// exposed with a hole below them. A refused delta changes nothing.
    pub fn apply(&mut self, delta: &Delta) -> Result<ApplyReport, ReplicaError> {
        self.check_usable()?;
        let _span = tracing::debug_span!("apply", events = delta.events.len()).entered();
        if let Err(error) = self.validate(delta) {
            self.stats.deltas_refused += 1;
            tracing::warn!(%error, "delta refused");
            return Err(error);
        }
        let mut report = ApplyReport::default();
        let mut batch = Batch::default();
        for (stream, floor_seq) in delta.floor.iter() {
            if floor_seq > self.floor.get(stream) {
                self.raise_floor(stream, floor_seq, &mut batch);
                report.floors_raised += 1;
            }
        }
        for event in &delta.events {
            let stream = event.stream;
            let log = self.log.ensure_stream(stream, 0);
            let (floor, head) = (log.floor, log.head());
            if event.seq <= floor {
                report.below_floor += 1;
            } else if event.seq <= head || self.log.is_pending(stream, event.seq) {
                report.duplicates += 1;
            } else if event.seq == head + 1 {
                self.log.push(event);
                batch.events.push(event.clone());
                self.pending_len -= self.log.release_pending(stream, &mut batch.events);
            } else if self.pending_len < self.config.pending_events_max {
                self.log.hold_early(event);
                self.pending_len += 1;
                report.pending += 1;
            } else {
                report.dropped += 1;
            }
        }
        report.applied = batch.events.len() as u64;
        // Marks move once per stream touched, to the stream's head: a
        // vector update per event would cost a map insert each.
        let mut touched: Vec<StreamId> = Vec::new();
        for event in &batch.events {
            self.clock = self.clock.max(event.lamport);
            self.digest.add(event);
            if touched.last() != Some(&event.stream) {
                touched.push(event.stream);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for stream in touched {
            self.marks.advance(stream, self.log.head(stream));
        }
        batch.clock = self.clock;
        self.stats.applied += report.applied;
        self.stats.duplicates += report.duplicates;
        self.stats.pending_dropped += report.dropped;
        tracing::debug!(
            applied = report.applied,
            duplicates = report.duplicates,
            pending = report.pending,
            dropped = report.dropped,
            floors_raised = report.floors_raised,
            "apply"
        );
        if !batch.is_empty() {
            self.commit(&batch)?;
        }
        Ok(report)
    }

    /// Raises the floor to `target` (per stream, clamped to the head: a
    /// replica compacts only what it holds) and drops the events below it.
    /// A floor never falls.
    pub fn compact(&mut self, target: &VersionVector) -> Result<CompactReport, ReplicaError> {
        self.check_usable()?;
        let _span = tracing::debug_span!("compact").entered();
        let mut batch = Batch {
            clock: self.clock,
            ..Batch::default()
        };
        let mut report = CompactReport::default();
        for (stream, target_seq) in target.iter() {
            let Some(log) = self.log.stream(stream) else {
                continue;
            };
            let floor_seq = target_seq.min(log.head());
            if floor_seq > log.floor {
                report.dropped += floor_seq - log.floor;
                report.streams += 1;
                self.raise_floor(stream, floor_seq, &mut batch);
            }
        }
        if batch.is_empty() {
            return Ok(report);
        }
        // A floor clamped to the head releases nothing from the pending
        // buffer: an event at head + 1 would have been released on arrival.
        assert!(
            batch.events.is_empty(),
            "local compaction released pending events"
        );
        tracing::info!(
            dropped = report.dropped,
            streams = report.streams,
            "compact"
        );
        self.commit(&batch)?;
        Ok(report)
    }

    /// Raises one stream's floor, dropping held and pending events at or
    /// below it; a floor above the head moves the head up to it. Records the
    /// change in `batch`, with the pending events it releases; the caller
    /// accounts for those (clock, marks, digest) with the rest of the batch.
    fn raise_floor(&mut self, stream: StreamId, floor_seq: u64, batch: &mut Batch) {
        let digest = &mut self.digest;
        let discarded = self
            .log
            .raise_floor(stream, floor_seq, &mut |event| digest.remove(&event));
        self.pending_len -= discarded;
        self.pending_len -= self.log.release_pending(stream, &mut batch.events);
        self.floor.advance(stream, floor_seq);
        self.marks.advance(stream, self.log.head(stream));
        batch.floors.push((stream, floor_seq));
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), ReplicaError> {
        self.store.commit(batch).map_err(|error| {
            self.failed = true;
            tracing::error!(%error, "store commit failed; the replica refuses changes until reopened");
            store_error(error)
        })
    }

    fn check_usable(&self) -> Result<(), ReplicaError> {
        if self.failed {
            Err(ReplicaError::Failed)
        } else {
            Ok(())
        }
    }
}

fn lamport_error(event: &Event, neighbour_seq: u64, neighbour_lamport: u64) -> ReplicaError {
    ReplicaError::LamportNotRising {
        stream: event.stream,
        seq: event.seq,
        lamport: event.lamport,
        neighbour_seq,
        neighbour_lamport,
    }
}

fn store_error<E: std::error::Error + Send + Sync + 'static>(error: E) -> ReplicaError {
    ReplicaError::Store(Box::new(error))
}

impl Digest {
    fn add(&mut self, event: &Event) {
        self.events += 1;
        self.sum = self.sum.wrapping_add(event.content_hash());
    }

    fn remove(&mut self, event: &Event) {
        self.events -= 1;
        self.sum = self.sum.wrapping_sub(event.content_hash());
    }
}
