//! `Log`: the shape of what a replica holds, and the walk behind paging
//! and deltas.
//!
//! Per stream, memory holds only its `floor`, `head` and pending buffer
//! (early arrivals); the held events `floor+1 ..= head` are read through a
//! [`Source`]: the replica's own [`MemLog`] for a store that offers no view,
//! or the store's view (`MemStore`'s data, or a snapshot of the disk), so
//! an event is kept once. A walk is the k-way merge of the streams'
//! uncovered suffixes in `(lamport, stream)` order: each suffix is already
//! sorted, because lamport rises with seq within a stream.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::BTreeMap;
use std::collections::BinaryHeap;
use std::sync::{PoisonError, RwLockReadGuard};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};

use crate::columns::RunColumns;
use crate::mem::{MemLog, ReadError, Source, StreamScan};
use crate::store::{StoreView, ViewKind};
use crate::Event;

/// An early event waiting for the hole below it to fill.
#[derive(Debug, Clone)]
pub(crate) struct Early {
    pub(crate) lamport: u64,
    pub(crate) time_ms: u64,
    pub(crate) payload: Bytes,
}

/// One stream: held seqs `floor+1 ..= head`, and early ones.
#[derive(Debug, Default)]
pub(crate) struct StreamLog {
    stream: StreamId,
    pub(crate) floor: u64,
    head: u64,
    pending: BTreeMap<u64, Early>,
}

impl StreamLog {
    pub(crate) fn head(&self) -> u64 {
        self.head
    }

    fn holds(&self, seq: u64) -> bool {
        seq > self.floor && seq <= self.head
    }

    /// The pending (early) version of `seq`, if any.
    pub(crate) fn early(&self, seq: u64) -> Option<&Early> {
        self.pending.get(&seq)
    }

    /// Whether no event of the stream is pending.
    pub(crate) fn has_no_early(&self) -> bool {
        self.pending.is_empty()
    }

    /// How many pending events have a seq in `range`.
    pub(crate) fn early_count_in(&self, range: std::ops::RangeInclusive<u64>) -> usize {
        if range.is_empty() {
            return 0;
        }
        self.pending.range(range).count()
    }
}

/// Where the held events are read from.
#[derive(Debug)]
pub(crate) enum Held {
    /// The replica's own copy (a store without a view).
    Own(MemLog),
    /// The store's view, as of the commit last published.
    View(StoreView),
}

/// A borrowed [`Source`]: the own copy, or a lock on the store's data.
pub(crate) enum SourceRef<'a> {
    Own(&'a MemLog),
    Mem(RwLockReadGuard<'a, MemLog>),
    Disk(&'a crate::disk::DiskView),
}

impl SourceRef<'_> {
    pub(crate) fn get(&self) -> &dyn Source {
        match self {
            SourceRef::Own(log) => *log,
            SourceRef::Mem(guard) => &**guard,
            SourceRef::Disk(view) => *view,
        }
    }
}

/// Every stream's shape, and where its events are read from.
#[derive(Debug)]
pub(crate) struct Log {
    streams: Streams,
    held: Held,
}

/// The streams, each at a dense slot that never changes (streams are never
/// removed), found by id through `index`.
#[derive(Debug, Default)]
struct Streams {
    index: BTreeMap<StreamId, u32>,
    logs: Vec<StreamLog>,
}

impl Streams {
    fn get(&self, stream: &StreamId) -> Option<&StreamLog> {
        self.index
            .get(stream)
            .map(|&slot| &self.logs[slot as usize])
    }

    fn get_mut(&mut self, stream: &StreamId) -> Option<&mut StreamLog> {
        self.index
            .get(stream)
            .map(|&slot| &mut self.logs[slot as usize])
    }

    fn contains_key(&self, stream: &StreamId) -> bool {
        self.index.contains_key(stream)
    }

    fn len(&self) -> usize {
        self.logs.len()
    }

    /// The slot of `stream`, adding it with `floor` (and head) if it is new.
    fn slot(&mut self, stream: StreamId, floor: u64) -> u32 {
        let logs = &mut self.logs;
        *self.index.entry(stream).or_insert_with(|| {
            logs.push(StreamLog {
                stream,
                floor,
                head: floor,
                ..StreamLog::default()
            });
            u32::try_from(logs.len() - 1).expect("streams are bounded well below 2^32")
        })
    }

    fn entry(&mut self, stream: StreamId) -> &mut StreamLog {
        let slot = self.slot(stream, 0);
        &mut self.logs[slot as usize]
    }
}

impl Log {
    pub(crate) fn new(held: Held) -> Self {
        Log {
            streams: Streams::default(),
            held,
        }
    }

    /// Whether the events are the replica's own copy (read on open).
    pub(crate) fn is_own(&self) -> bool {
        matches!(self.held, Held::Own(_))
    }

    /// Whether the events are held in memory: the own copy, or a
    /// `MemStore`'s (not a store's view on disk).
    pub(crate) fn is_in_memory(&self) -> bool {
        match &self.held {
            Held::Own(_) => true,
            Held::View(view) => matches!(view.kind, ViewKind::Mem(_)),
        }
    }

    /// Replaces the store's view with the one of the commit being
    /// published.
    pub(crate) fn set_view(&mut self, view: StoreView) {
        if let Held::View(current) = &mut self.held {
            *current = view;
        }
    }

    pub(crate) fn source(&self) -> SourceRef<'_> {
        match &self.held {
            Held::Own(log) => SourceRef::Own(log),
            Held::View(view) => match &view.kind {
                ViewKind::Mem(data) => {
                    SourceRef::Mem(data.read().unwrap_or_else(PoisonError::into_inner))
                }
                ViewKind::Disk(view) => SourceRef::Disk(view),
            },
        }
    }

    pub(crate) fn stream(&self, stream: StreamId) -> Option<&StreamLog> {
        self.streams.get(&stream)
    }

    pub(crate) fn stream_count(&self) -> usize {
        self.streams.len()
    }

    pub(crate) fn has_stream(&self, stream: StreamId) -> bool {
        self.streams.contains_key(&stream)
    }

    /// Makes sure `stream` exists (with `floor`, if it is new).
    pub(crate) fn ensure_stream(&mut self, stream: StreamId, floor: u64) -> &StreamLog {
        let slot = self.streams.slot(stream, floor);
        &self.streams.logs[slot as usize]
    }

    /// Records a stream the store holds, with its events `floor+1 ..= head`
    /// (read through the view; the own copy is filled by `push`).
    pub(crate) fn open_stream(&mut self, stream: StreamId, floor: u64, head: u64) {
        let slot = self.streams.slot(stream, floor);
        self.streams.logs[slot as usize].head = head;
    }

    pub(crate) fn head(&self, stream: StreamId) -> u64 {
        self.streams.get(&stream).map_or(0, StreamLog::head)
    }

    /// The held event `(stream, seq)`.
    pub(crate) fn get(&self, stream: StreamId, seq: u64) -> Result<Option<Event>, ReadError> {
        if !self.streams.get(&stream).is_some_and(|log| log.holds(seq)) {
            return Ok(None);
        }
        self.source().get().event(stream, seq)
    }

    /// The lamport of held `seq` of the stream `log`.
    pub(crate) fn lamport_in(&self, log: &StreamLog, seq: u64) -> Result<Option<u64>, ReadError> {
        if !log.holds(seq) {
            return Ok(None);
        }
        self.source().get().lamport(log.stream, seq)
    }

    /// The lamport of the held or pending version of `seq` of `log`.
    pub(crate) fn known_lamport(
        &self,
        log: &StreamLog,
        seq: u64,
    ) -> Result<Option<u64>, ReadError> {
        if log.holds(seq) {
            return self.source().get().lamport(log.stream, seq);
        }
        Ok(log.pending.get(&seq).map(|early| early.lamport))
    }

    /// Whether the held or pending version of `seq` of `log`, if any, is
    /// `event` itself.
    pub(crate) fn known_is(&self, log: &StreamLog, event: &Event) -> Result<bool, ReadError> {
        if log.holds(event.seq) {
            let held = self.source().get().event(log.stream, event.seq)?;
            return Ok(held.is_none_or(|held| held == *event));
        }
        Ok(log.pending.get(&event.seq).is_none_or(|early| {
            early.lamport == event.lamport
                && early.time_ms == event.time_ms
                && early.payload == event.payload
        }))
    }

    /// The last seq of `stream` whose lamport is at most `lamport`, if every
    /// held event at or below it is known to be: `None` when the first held
    /// event is already above `lamport` and events below it were compacted
    /// (their stamps are gone, so whether they were at or below is unknown).
    pub(crate) fn last_seq_at_or_below(
        &self,
        log: &StreamLog,
        lamport: u64,
    ) -> Result<Option<u64>, ReadError> {
        let source = self.source();
        let source = source.get();
        // Lamport rises with seq: binary search over the held seqs.
        let (mut low, mut high) = (log.floor, log.head);
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            let at = source.lamport(log.stream, mid)?.unwrap_or(u64::MAX);
            if at <= lamport {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        if low == log.floor && log.floor > 0 {
            return Ok(None);
        }
        Ok(Some(low))
    }

    /// `(seq, time_ms)` of the held events of `stream`, in seq order.
    pub(crate) fn times(&self, stream: StreamId) -> Result<Vec<(u64, u64)>, ReadError> {
        let Some(log) = self.streams.get(&stream) else {
            return Ok(Vec::new());
        };
        let source = self.source();
        let mut scan = source.get().scan(stream, log.floor + 1, log.head)?;
        let mut times = Vec::new();
        while scan.peek()?.is_some() {
            let event = scan.take()?;
            times.push((event.seq, event.time_ms));
        }
        Ok(times)
    }

    /// Holds `event`, the next of its stream (`seq == head + 1`), and drops
    /// its pending version, if any: returns whether there was one.
    pub(crate) fn push(&mut self, event: &Event) -> bool {
        self.push_run(std::slice::from_ref(event)) == 1
    }

    /// Holds `events`, consecutive seqs of one stream from its `head + 1`,
    /// and drops their pending versions: returns how many there were. (One
    /// lookup of the stream for the whole run: publishing costs O(1) per
    /// run besides copying the events into the own copy, if any.)
    pub(crate) fn push_run(&mut self, events: &[Event]) -> usize {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return 0;
        };
        assert_eq!(
            Some(last.seq),
            first.seq.checked_add(events.len() as u64 - 1),
            "a run is consecutive seqs"
        );
        let was_early = self.advance_head(first.stream, first.seq, last.seq);
        if let Held::Own(own) = &mut self.held {
            own.push_run(events);
        }
        was_early
    }

    /// [`Log::push_run`] for a run of a delta in columns.
    pub(crate) fn push_columns(&mut self, run: RunColumns<'_>) -> usize {
        if run.len() == 0 {
            return 0;
        }
        let was_early = self.advance_head(run.stream, run.first_seq, run.last_seq());
        if let Held::Own(own) = &mut self.held {
            own.push_columns(run);
        }
        was_early
    }

    /// Moves `stream`'s head from `first - 1` to `last`, dropping the
    /// pending versions of the seqs between: how many there were.
    fn advance_head(&mut self, stream: StreamId, first: u64, last: u64) -> usize {
        let log = self.streams.entry(stream);
        assert_eq!(
            Some(first),
            log.head.checked_add(1),
            "held events stay gap-free"
        );
        log.head = last;
        let mut was_early = 0;
        if !log.pending.is_empty() {
            // Only the pending seqs in the run are visited (the buffer may
            // hold many more above it).
            let early: Vec<u64> = log
                .pending
                .range(first..=last)
                .map(|(&seq, _)| seq)
                .collect();
            for seq in &early {
                log.pending.remove(seq);
            }
            was_early = early.len();
        }
        was_early
    }

    /// Keeps an early event; returns false if one is already pending there.
    pub(crate) fn hold_early(&mut self, event: &Event) -> bool {
        let log = self.streams.entry(event.stream);
        if log.pending.contains_key(&event.seq) {
            return false;
        }
        log.pending.insert(
            event.seq,
            Early {
                lamport: event.lamport,
                time_ms: event.time_ms,
                // A received payload may be a slice of its whole frame's
                // buffer (the sync codec copies a delta's payloads once):
                // an event kept pending must not keep the frame alive.
                payload: Bytes::copy_from_slice(&event.payload),
            },
        );
        true
    }

    /// Drops every pending event of `stream`; returns how many.
    pub(crate) fn drop_early(&mut self, stream: StreamId) -> usize {
        self.streams
            .get_mut(&stream)
            .map_or(0, |log| std::mem::take(&mut log.pending).len())
    }

    /// Raises `stream`'s floor to `floor_seq`: held events at or below it go
    /// to `dropped`, if given (read before they go); pending ones at or below it are
    /// discarded (their count is returned); a floor above the head moves the
    /// head up to it.
    pub(crate) fn raise_floor(
        &mut self,
        stream: StreamId,
        floor_seq: u64,
        dropped: Option<&mut dyn FnMut(Event)>,
    ) -> Result<usize, ReadError> {
        self.streams.entry(stream);
        let log = self.streams.get(&stream).expect("just ensured");
        let (floor, head) = (log.floor, log.head);
        if let (true, Some(dropped)) = (floor_seq > floor, dropped) {
            let last = floor_seq.min(head);
            if last > floor {
                let source = self.source();
                let mut scan = source.get().scan(stream, floor + 1, last)?;
                while scan.peek()?.is_some() {
                    dropped(scan.take()?);
                }
            }
        }
        let log = self.streams.get_mut(&stream).expect("just ensured");
        if floor_seq > log.floor {
            log.floor = floor_seq;
            log.head = log.head.max(floor_seq);
        }
        let stale: Vec<u64> = log
            .pending
            .range(..=floor_seq)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in &stale {
            log.pending.remove(seq);
        }
        if let Held::Own(own) = &mut self.held {
            own.drop_through(stream, floor_seq);
        }
        Ok(stale.len())
    }

    /// The places of a walk from `start`: every stream of the log, then the
    /// cursor's streams the log lacks (kept so the next cursor carries them).
    pub(crate) fn places(&self, start: &VersionVector) -> Vec<Place> {
        let mut places: Vec<Place> = self
            .streams
            .logs
            .iter()
            .map(|log| {
                let seq = start.get(log.stream);
                Place {
                    stream: log.stream,
                    head: Some(log.head),
                    covered: seq.max(log.floor),
                    start: seq,
                }
            })
            .collect();
        places.extend(
            start
                .iter()
                .filter(|(stream, _)| !self.streams.contains_key(stream))
                .map(|(stream, seq)| Place {
                    stream,
                    head: None,
                    covered: seq,
                    start: seq,
                }),
        );
        places
    }
}

impl Place {
    /// The stream and seqs `first ..= last` the log holds above the place.
    pub(crate) fn uncovered(&self) -> Option<(StreamId, u64, u64)> {
        let head = self.head?;
        let first = self.covered.checked_add(1)?;
        (first <= head).then_some((self.stream, first, head))
    }
}

/// One stream's place in a walk.
pub(crate) struct Place {
    stream: StreamId,
    /// The stream's head, if the log has the stream.
    head: Option<u64>,
    /// The last seq covered: the cursor's, raised as the walk returns events.
    covered: u64,
    /// The cursor's entry before the walk.
    start: u64,
}

/// The uncovered events in `(lamport, stream)` order: a k-way merge of the
/// streams' suffixes above the cursor, one heap entry per stream with
/// events left. Costs O(S) to start and O(log S) per event returned,
/// whatever the log's length.
pub(crate) struct Walk<'a> {
    places: Vec<Place>,
    scans: Vec<Option<Box<dyn StreamScan + 'a>>>,
    heap: BinaryHeap<Reverse<(u128, usize)>>,
    /// A read failed: the walk stops there (only a store on disk fails).
    pub(crate) error: Option<ReadError>,
}

pub(crate) fn key(lamport: u64, stream: StreamId) -> u128 {
    (u128::from(lamport) << 64) | u128::from(stream.get())
}

impl<'a> Walk<'a> {
    pub(crate) fn new(source: &'a dyn Source, places: Vec<Place>) -> Self {
        let mut walk = Walk {
            scans: Vec::with_capacity(places.len()),
            heap: BinaryHeap::with_capacity(places.len()),
            places,
            error: None,
        };
        if let Err(error) = walk.start(source) {
            walk.error = Some(error);
            walk.heap.clear();
        }
        walk
    }

    fn start(&mut self, source: &'a dyn Source) -> Result<(), ReadError> {
        for (index, place) in self.places.iter().enumerate() {
            let scan = match (place.head, place.covered.checked_add(1)) {
                (Some(head), Some(first)) if first <= head => {
                    let mut scan = source.scan(place.stream, first, head)?;
                    match scan.peek()? {
                        Some(lamport) => {
                            self.heap.push(Reverse((key(lamport, place.stream), index)));
                            Some(scan)
                        }
                        None => {
                            return Err(format!(
                                "stream {} seq {first} is held but could not be read",
                                place.stream
                            )
                            .into())
                        }
                    }
                }
                _ => None,
            };
            self.scans.push(scan);
        }
        Ok(())
    }

    /// Whether the walk has returned everything the log holds.
    pub(crate) fn is_done(&self) -> bool {
        self.error.is_none()
            && self
                .places
                .iter()
                .all(|place| place.head.is_none_or(|head| place.covered >= head))
    }

    /// The start cursor joined with what the walk returned.
    pub(crate) fn cursor(&self, start: &VersionVector) -> VersionVector {
        let mut cursor = start.clone();
        for place in &self.places {
            if place.covered > place.start {
                cursor.advance(place.stream, place.covered);
            }
        }
        cursor
    }

    fn step(&mut self) -> Result<Option<Event>, ReadError> {
        let Some(mut top) = self.heap.peek_mut() else {
            return Ok(None);
        };
        let Reverse((_, index)) = *top;
        let scan = self.scans[index]
            .as_mut()
            .expect("a stream in the heap has a scan");
        let event = scan.take()?;
        let place = &mut self.places[index];
        debug_assert_eq!(Some(event.seq), place.covered.checked_add(1));
        place.covered = event.seq;
        match scan.peek()? {
            Some(lamport) => *top = Reverse((key(lamport, place.stream), index)),
            None => {
                PeekMut::pop(top);
            }
        }
        Ok(Some(event))
    }
}

impl Iterator for Walk<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        if self.error.is_some() {
            return None;
        }
        match self.step() {
            Ok(event) => event,
            Err(error) => {
                self.error = Some(error);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use meshlog_testkit::{seed, SplitMix64};

    use super::*;

    /// The walk returns exactly the naive answer: every held event above
    /// the cursor, sorted by (lamport, stream).
    #[test]
    fn walk_equals_a_naive_filter_and_sort() {
        let seed = seed::replay_or(0x5eed);
        let mut rng = SplitMix64::new(seed);
        for case in 0..300 {
            let mut log = Log::new(Held::Own(MemLog::default()));
            let streams = 1 + rng.below(6);
            let mut all = Vec::new();
            for s in 0..streams {
                let stream = StreamId::new(s * 7);
                let floor = rng.below(3);
                log.ensure_stream(stream, floor);
                let mut lamport = rng.below(20);
                for seq in floor + 1..=floor + rng.below(400) {
                    lamport += 1 + rng.below(30);
                    let event = Event {
                        stream,
                        seq,
                        lamport,
                        time_ms: 0,
                        payload: Bytes::from(vec![seq as u8; (seq % 3) as usize]),
                    };
                    log.push(&event);
                    all.push(event);
                }
            }
            let start: VersionVector = (0..streams + 1)
                .map(|s| (StreamId::new(s * 7), rng.below(450)))
                .collect();
            let mut expected: Vec<&Event> = all
                .iter()
                .filter(|e| {
                    let floor = log.stream(e.stream).map_or(0, |l| l.floor);
                    e.seq > start.get(e.stream).max(floor)
                })
                .collect();
            expected.sort_by_key(|e| (e.lamport, e.stream));
            let source = log.source();
            let mut walk = Walk::new(source.get(), log.places(&start));
            let got: Vec<Event> = walk.by_ref().collect();
            let got: Vec<&Event> = got.iter().collect();
            assert_eq!(
                got, expected,
                "case {case}, seed {seed}: replay with MESHLOG_SEED={seed}"
            );
            assert!(walk.is_done());
        }
    }
}
