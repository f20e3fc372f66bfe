//! `Log`: the events a replica holds, laid out for paging.
//!
//! Every held event lives once, in `order`, a sorted map keyed by
//! `lamport << 64 | stream` — page order — in contiguous chunks, so a walk
//! reads events in the order it returns them, as a sequential scan. Per stream, `lamports` maps a seq to
//! its key (seq `floor + 1 + i` has `lamports[i]`), which makes the stream a
//! gap-free prefix by construction, and `pending` holds early arrivals.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::BTreeMap;
use std::collections::{BinaryHeap, VecDeque};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};

use crate::order::{self, Order};
use crate::Event;

/// A held event's content, beside its key.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    /// The stream's dense index in the log, so a walk finds its place
    /// without a search.
    slot: u32,
    pub(crate) seq: u64,
    pub(crate) time_ms: u64,
    pub(crate) payload: Bytes,
}

/// An early event waiting for the hole below it to fill.
#[derive(Debug, Clone)]
pub(crate) struct Early {
    pub(crate) lamport: u64,
    pub(crate) time_ms: u64,
    pub(crate) payload: Bytes,
}

/// The comparable content of some version of an event: to detect an
/// equivocation and check lamport order against neighbours.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Content<'a> {
    pub(crate) lamport: u64,
    pub(crate) time_ms: u64,
    pub(crate) payload: &'a Bytes,
}

impl Content<'_> {
    pub(crate) fn same_as(&self, event: &Event) -> bool {
        self.lamport == event.lamport
            && self.time_ms == event.time_ms
            && *self.payload == event.payload
    }
}

/// One stream: held seqs `floor+1 ..= head` (their lamports), and early ones.
#[derive(Debug, Default)]
pub(crate) struct StreamLog {
    stream: StreamId,
    pub(crate) floor: u64,
    lamports: VecDeque<u64>,
    pending: BTreeMap<u64, Early>,
}

impl StreamLog {
    pub(crate) fn head(&self) -> u64 {
        self.floor + self.lamports.len() as u64
    }

    /// The lamport of held `seq`.
    fn lamport(&self, seq: u64) -> Option<u64> {
        let index = seq.checked_sub(self.floor.checked_add(1)?)?;
        self.lamports.get(usize::try_from(index).ok()?).copied()
    }

    /// The lamport of the held or pending version of `seq`.
    pub(crate) fn known_lamport(&self, seq: u64) -> Option<u64> {
        self.lamport(seq)
            .or_else(|| self.pending.get(&seq).map(|early| early.lamport))
    }

    pub(crate) fn last_lamport(&self) -> Option<u64> {
        self.lamports.back().copied()
    }

    /// The pending (early) version of `seq`, if any.
    pub(crate) fn early(&self, seq: u64) -> Option<&Early> {
        self.pending.get(&seq)
    }

    /// How many pending events have a seq in `range`.
    pub(crate) fn early_count_in(&self, range: std::ops::RangeInclusive<u64>) -> usize {
        if range.is_empty() {
            return 0;
        }
        self.pending.range(range).count()
    }

    /// The last seq whose lamport is at most `lamport`, if every held event
    /// at or below it is known to be: `None` when the first held event is
    /// already above `lamport` and events below it were compacted (their
    /// stamps are gone, so whether they were at or below is unknown).
    pub(crate) fn last_seq_at_or_below(&self, lamport: u64) -> Option<u64> {
        let count = self.lamports.partition_point(|&l| l <= lamport);
        if count == 0 && self.floor > 0 {
            return None;
        }
        Some(self.floor + count as u64)
    }
}

pub(crate) fn key(lamport: u64, stream: StreamId) -> u128 {
    (u128::from(lamport) << 64) | u128::from(stream.get())
}

fn key_stream(key: u128) -> StreamId {
    StreamId::new(key as u64)
}

fn key_lamport(key: u128) -> u64 {
    (key >> 64) as u64
}

fn to_event(key: u128, stored: &Stored) -> Event {
    Event {
        stream: key_stream(key),
        seq: stored.seq,
        lamport: key_lamport(key),
        time_ms: stored.time_ms,
        payload: stored.payload.clone(),
    }
}

/// Every held event, in page order, and every stream's shape.
#[derive(Debug, Default)]
pub(crate) struct Log {
    streams: Streams,
    order: Order<Stored>,
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

    /// The slot of `stream`, adding it with `floor` if it is new.
    fn slot(&mut self, stream: StreamId, floor: u64) -> u32 {
        let logs = &mut self.logs;
        *self.index.entry(stream).or_insert_with(|| {
            logs.push(StreamLog {
                stream,
                floor,
                ..StreamLog::default()
            });
            u32::try_from(logs.len() - 1).expect("streams are bounded well below 2^32")
        })
    }

    fn entry(&mut self, stream: StreamId) -> (u32, &mut StreamLog) {
        let slot = self.slot(stream, 0);
        (slot, &mut self.logs[slot as usize])
    }
}

impl Log {
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

    pub(crate) fn head(&self, stream: StreamId) -> u64 {
        self.streams.get(&stream).map_or(0, StreamLog::head)
    }

    /// The held event `(stream, seq)`.
    pub(crate) fn get(&self, stream: StreamId, seq: u64) -> Option<Event> {
        let key = key(self.streams.get(&stream)?.lamport(seq)?, stream);
        self.order.get(key).map(|stored| to_event(key, stored))
    }

    /// The held or pending version of `seq` of the stream `log`.
    pub(crate) fn known_in<'a>(&'a self, log: &'a StreamLog, seq: u64) -> Option<Content<'a>> {
        let stream = log.stream;
        if let Some(lamport) = log.lamport(seq) {
            let stored = self.order.get(key(lamport, stream))?;
            return Some(Content {
                lamport,
                time_ms: stored.time_ms,
                payload: &stored.payload,
            });
        }
        log.pending.get(&seq).map(|early| Content {
            lamport: early.lamport,
            time_ms: early.time_ms,
            payload: &early.payload,
        })
    }

    /// `(seq, time_ms)` of the held events of `stream`, in seq order.
    pub(crate) fn times(&self, stream: StreamId) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.streams.get(&stream).into_iter().flat_map(move |log| {
            log.lamports.iter().map(move |&lamport| {
                let stored = self
                    .order
                    .get(key(lamport, stream))
                    .expect("held events are in order");
                (stored.seq, stored.time_ms)
            })
        })
    }

    /// Holds `event`, the next of its stream (`seq == head + 1`).
    pub(crate) fn push(&mut self, event: &Event) {
        let (slot, log) = self.streams.entry(event.stream);
        assert_eq!(
            Some(event.seq),
            log.head().checked_add(1),
            "held events stay gap-free"
        );
        log.lamports.push_back(event.lamport);
        let previous = self.order.insert(
            key(event.lamport, event.stream),
            Stored {
                slot,
                seq: event.seq,
                time_ms: event.time_ms,
                payload: event.payload.clone(),
            },
        );
        assert!(previous.is_none(), "lamport rises with seq within a stream");
    }

    /// Keeps an early event; returns false if one is already pending there.
    pub(crate) fn hold_early(&mut self, event: &Event) -> bool {
        let (_, log) = self.streams.entry(event.stream);
        if log.pending.contains_key(&event.seq) {
            return false;
        }
        log.pending.insert(
            event.seq,
            Early {
                lamport: event.lamport,
                time_ms: event.time_ms,
                payload: event.payload.clone(),
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

    /// Drops the pending version of `(stream, seq)`, if any.
    pub(crate) fn forget_early(&mut self, stream: StreamId, seq: u64) -> bool {
        self.streams
            .get_mut(&stream)
            .is_some_and(|log| log.pending.remove(&seq).is_some())
    }

    /// Raises `stream`'s floor to `floor_seq`: held events at or below it go
    /// to `dropped`; pending ones at or below it are discarded (their count
    /// is returned); a floor above the head moves the head up to it.
    pub(crate) fn raise_floor(
        &mut self,
        stream: StreamId,
        floor_seq: u64,
        dropped: &mut impl FnMut(Event),
    ) -> usize {
        let (_, log) = self.streams.entry(stream);
        let mut doomed = Vec::new();
        while log.floor < floor_seq {
            let Some(lamport) = log.lamports.pop_front() else {
                log.floor = floor_seq;
                break;
            };
            log.floor += 1;
            doomed.push(key(lamport, stream));
        }
        // Lamport rises with seq, so the keys are ascending.
        let mut removed = 0;
        self.order.remove_sorted(&doomed, |key, stored| {
            removed += 1;
            dropped(to_event(key, &stored));
        });
        assert_eq!(removed, doomed.len(), "held events are in order");
        let stale: Vec<u64> = log
            .pending
            .range(..=floor_seq)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in &stale {
            log.pending.remove(seq);
        }
        stale.len()
    }

    /// A walk over the events not covered by `start` (nor by the floor), in
    /// page order.
    pub(crate) fn walk(&self, start: &VersionVector) -> Walk<'_> {
        let mut walk = Walk::new(self, start);
        walk.skip_budget = walk.places.len() + SKIP_BUDGET_EXTRA;
        walk
    }
}

/// How many covered events a scan may skip beyond one per stream before the
/// walk switches to the merge.
const SKIP_BUDGET_EXTRA: usize = 64;

/// One stream's place in a walk.
struct Place<'a> {
    stream: StreamId,
    log: Option<&'a StreamLog>,
    /// The last seq covered: the cursor's, raised as the walk returns events.
    covered: u64,
    /// The cursor's entry before the walk.
    start: u64,
}

impl Place<'_> {
    /// The key of this stream's first uncovered event, if held.
    fn next_key(&self) -> Option<u128> {
        // A cursor at `u64::MAX` covers everything: nothing follows it.
        let lamport = self.log?.lamport(self.covered.checked_add(1)?)?;
        Some(key(lamport, self.stream))
    }
}

enum Mode<'a> {
    /// Scanning `order` from the lowest uncovered key, skipping covered
    /// events (the common case: a walk in step with the log skips none).
    Scan(order::Range<'a, Stored>),
    /// A k-way merge of stream suffixes, once the scan has skipped too much
    /// (a late event far below the walk's position): one heap entry per
    /// stream with events left.
    Merge(BinaryHeap<Reverse<(u128, usize)>>),
}

/// The uncovered events in `(lamport, stream)` order.
///
/// Within a stream lamport rises with seq, so a stream's uncovered events
/// appear in the scan in seq order, starting right above its cursor entry.
/// Every event the scan skips is one the cursor already covers; the scan
/// skips at most `skip_budget` of them before switching to the merge, so a
/// walk costs O(S + n · log S) for n events returned over S streams plus
/// the logarithmic seeks into the ordered map, whatever the log's length.
pub(crate) struct Walk<'a> {
    log: &'a Log,
    /// Every stream of the log, at its slot, then the start cursor's
    /// streams the log lacks.
    places: Vec<Place<'a>>,
    mode: Mode<'a>,
    skip_budget: usize,
}

impl<'a> Walk<'a> {
    fn new(log: &'a Log, start: &VersionVector) -> Self {
        // Places at the log's slots, then the cursor's streams the log lacks
        // (kept so the next cursor carries them).
        let mut places: Vec<Place<'a>> = log
            .streams
            .logs
            .iter()
            .map(|stream_log| {
                let seq = start.get(stream_log.stream);
                Place {
                    stream: stream_log.stream,
                    log: Some(stream_log),
                    covered: seq.max(stream_log.floor),
                    start: seq,
                }
            })
            .collect();
        places.extend(
            start
                .iter()
                .filter(|(stream, _)| !log.streams.contains_key(stream))
                .map(|(stream, seq)| Place {
                    stream,
                    log: None,
                    covered: seq,
                    start: seq,
                }),
        );
        let first = places.iter().filter_map(Place::next_key).min();
        let mode = match first {
            Some(first) => Mode::Scan(log.order.range_from(first)),
            None => Mode::Merge(BinaryHeap::new()),
        };
        Walk {
            log,
            places,
            mode,
            skip_budget: 0,
        }
    }

    /// Whether the walk has returned everything the log holds.
    pub(crate) fn is_done(&self) -> bool {
        self.places
            .iter()
            .all(|place| place.log.is_none_or(|log| place.covered >= log.head()))
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

    fn switch_to_merge(&mut self) {
        let heads = self
            .places
            .iter()
            .enumerate()
            .filter_map(|(index, place)| place.next_key().map(|key| Reverse((key, index))))
            .collect::<Vec<_>>();
        self.mode = Mode::Merge(BinaryHeap::from(heads));
    }
}

impl Iterator for Walk<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        loop {
            match &mut self.mode {
                Mode::Scan(range) => {
                    let (key, stored) = range.next()?;
                    let place = &mut self.places[stored.slot as usize];
                    if stored.seq > place.covered {
                        debug_assert_eq!(Some(stored.seq), place.covered.checked_add(1));
                        place.covered = stored.seq;
                        return Some(to_event(key, stored));
                    }
                    if self.skip_budget == 0 {
                        self.switch_to_merge();
                    } else {
                        self.skip_budget -= 1;
                    }
                }
                Mode::Merge(heap) => {
                    let mut top = heap.peek_mut()?;
                    let Reverse((key, index)) = *top;
                    let place = &mut self.places[index];
                    place.covered += 1;
                    match place.next_key() {
                        Some(next) => *top = Reverse((next, index)),
                        None => {
                            PeekMut::pop(top);
                        }
                    }
                    let stored = self.log.order.get(key).expect("held events are in order");
                    return Some(to_event(key, stored));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use meshlog_testkit::{seed, SplitMix64};

    use super::*;

    /// The walk, whether it scans, switches to the merge after a few skips,
    /// or merges from the start, returns exactly the naive answer: every
    /// held event above the cursor, sorted by (lamport, stream).
    #[test]
    fn walk_equals_a_naive_filter_and_sort_in_every_mode() {
        let seed = seed::replay_or(0x5eed);
        let mut rng = SplitMix64::new(seed);
        for case in 0..300 {
            let mut log = Log::default();
            let streams = 1 + rng.below(6);
            let mut all = Vec::new();
            for s in 0..streams {
                let stream = StreamId::new(s * 7);
                let floor = rng.below(3);
                log.ensure_stream(stream, floor);
                let mut lamport = rng.below(20);
                for seq in floor + 1..=floor + rng.below(40) {
                    lamport += 1 + rng.below(30);
                    let event = Event {
                        stream,
                        seq,
                        lamport,
                        time_ms: 0,
                        payload: Bytes::new(),
                    };
                    log.push(&event);
                    all.push(event);
                }
            }
            let start: VersionVector = (0..streams + 1)
                .map(|s| (StreamId::new(s * 7), rng.below(45)))
                .collect();
            let mut expected: Vec<&Event> = all
                .iter()
                .filter(|e| {
                    let floor = log.stream(e.stream).map_or(0, |l| l.floor);
                    e.seq > start.get(e.stream).max(floor)
                })
                .collect();
            expected.sort_by_key(|e| (e.lamport, e.stream));
            for budget in [0, 1, 3, usize::MAX] {
                let mut walk = Walk::new(&log, &start);
                walk.skip_budget = budget;
                let got: Vec<Event> = walk.by_ref().collect();
                let got: Vec<&Event> = got.iter().collect();
                assert_eq!(
                    got, expected,
                    "case {case}, skip budget {budget}, seed {seed}: replay with MESHLOG_SEED={seed}"
                );
                assert!(walk.is_done());
            }
        }
    }
}
