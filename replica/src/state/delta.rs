//! Building deltas: what a peer with given marks misses, as events or
//! as columns, within a byte budget.

use meshlog_cursor::{StreamId, VersionVector};

use super::held::State;
use crate::log::Walk;
use crate::mem::{ReadError, Through};
use crate::{Delta, DeltaColumns, Event};

impl State {
    /// What a peer with `their_marks` misses, within `byte_budget`, or
    /// the store's read error: a read that fails is never answered as a
    /// shorter delta (it would hide the fault).
    pub(crate) fn delta_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Result<Delta, ReadError> {
        let mut delta = self.unsealed_delta_for(their_marks, byte_budget)?;
        // Each stream's run ends where it can be sealed (`state/seals.rs`).
        delta.seals = self.seal_runs(&mut delta.events)?;
        delta.floor_proofs = self.floor_proofs(&delta.floor);
        Ok(delta)
    }

    /// [`State::delta_for`] for a caller that takes no error (the public
    /// `delta_for`): a read that fails is logged and answered as the
    /// empty delta, never a shorter one; `try_delta_for` answers it.
    pub(crate) fn delta_for_or_empty(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Delta {
        or_empty(self.delta_for(their_marks, byte_budget))
    }

    /// [`State::delta_columns_for`] as [`State::delta_for_or_empty`].
    pub(crate) fn delta_columns_for_or_empty(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> DeltaColumns {
        or_empty(self.delta_columns_for(their_marks, byte_budget))
    }

    /// [`State::delta_for`] before the seals are put on.
    fn unsealed_delta_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Result<Delta, ReadError> {
        let floor = self.floor_below(their_marks);
        let source = self.log.source();
        let places = self.log.places(their_marks);
        // Where the source counts from its columns: the ranges that fit,
        // read stream by stream.
        if let Some(events) = self.delta_by_ranges(source.get(), &places, byte_budget)? {
            return Ok(Delta {
                floor_proofs: Default::default(),
                floor,
                events,
                seals: Vec::new(),
            });
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
        // When everything missing may fit the budget, it is read stream by
        // stream (no merge): a delta that carries all of it has no prefix
        // to keep in order, and a receiver takes it a stream at a time.
        if missing <= fits as u64 {
            if self.whole_delta(source.get(), &places, byte_budget, &mut events)? {
                return Ok(Delta {
                    floor_proofs: Default::default(),
                    floor,
                    events,
                    seals: Vec::new(),
                });
            }
            events.clear();
        }
        oldest_that_fit(source.get(), places, byte_budget, &mut events)?;
        Ok(Delta {
            floor_proofs: Default::default(),
            floor,
            events,
            seals: Vec::new(),
        })
    }

    /// The delta's events read by the ranges [`State::delta_ranges`]
    /// finds, where the source counts from its columns (`None` where it
    /// cannot: the caller walks instead), or the read error.
    fn delta_by_ranges(
        &self,
        source: &dyn crate::mem::Source,
        places: &[crate::log::Place],
        byte_budget: usize,
    ) -> Result<Option<Vec<Event>>, ReadError> {
        let Some(delta) = self.delta_ranges(source, places, byte_budget)? else {
            return Ok(None);
        };
        let mut events = Vec::with_capacity(delta.events);
        let mut used = 0usize;
        for &(stream, first, last) in &delta.ranges {
            let before = events.len();
            source.read_into(stream, first, last, usize::MAX, &mut used, &mut events)?;
            read_whole(stream, first, last, events.len() - before)?;
        }
        Ok(Some(events))
    }

    /// [`State::delta_for`] as columns: read a slice of the memory log's
    /// columns at a time; from a store on disk, the delta's events put in
    /// columns. A read that fails is the error, as there.
    pub(crate) fn delta_columns_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Result<DeltaColumns, ReadError> {
        let mut columns = self.unsealed_columns_for(their_marks, byte_budget)?;
        if columns.seals.is_empty() && !(self.config.key.is_none() && self.kept_seals.is_empty()) {
            match self.columns_seals(&columns) {
                Some(seals) => columns.seals = seals,
                // A run must end elsewhere: built as events, sealed there.
                None => {
                    let delta = self.delta_for(their_marks, byte_budget)?;
                    return Ok(DeltaColumns::from_delta(&delta));
                }
            }
        }
        columns.floor_proofs = self.floor_proofs(&columns.floor);
        Ok(columns)
    }

    /// [`State::delta_columns_for`] before the seals are put on (the
    /// fallback through [`State::delta_for`] has them already).
    fn unsealed_columns_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Result<DeltaColumns, ReadError> {
        let source = self.log.source();
        let places = self.log.places(their_marks);
        let Some(delta) = self.delta_ranges(source.get(), &places, byte_budget)? else {
            let delta = self.delta_for(their_marks, byte_budget)?;
            return Ok(DeltaColumns::from_delta(&delta));
        };
        let mut columns = DeltaColumns::new(self.floor_below(their_marks));
        columns.reserve(delta.events, delta.payload_bytes);
        for &(stream, first, last) in &delta.ranges {
            let before = columns.len();
            source
                .get()
                .read_columns(stream, first, last, &mut columns)?;
            read_whole(stream, first, last, columns.len() - before)?;
        }
        Ok(columns)
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
        let counter = Counter {
            source,
            ranges: &ranges,
        };
        let taken = counter.taken_within(budget, low, high)?;
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

/// A delta built, or the empty one where a read failed (logged).
fn or_empty<T: Default>(built: Result<T, ReadError>) -> T {
    built.unwrap_or_else(|error| {
        tracing::error!(%error, "reading the log for a delta failed: the empty delta is answered");
        T::default()
    })
}

/// Whether a read of seqs `first ..= last` of `stream` gave all of them.
pub(super) fn read_whole(
    stream: StreamId,
    first: u64,
    last: u64,
    read: usize,
) -> Result<(), ReadError> {
    if Some(read as u64) == (last - first).checked_add(1) {
        Ok(())
    } else {
        Err(format!("stream {stream} seqs {first}..={last} are held but could not be read").into())
    }
}

/// The oldest events `places` do not cover that fit `byte_budget` (at
/// least one), in `(lamport, stream)` order: a prefix that holds every
/// event below its newest stamp; then put stream by stream, as every
/// delta built is (and a frame carries).
fn oldest_that_fit(
    source: &dyn crate::mem::Source,
    places: Vec<crate::log::Place>,
    byte_budget: usize,
    events: &mut Vec<Event>,
) -> Result<(), ReadError> {
    let mut used = 0usize;
    let mut walk = Walk::new(source, places);
    for event in walk.by_ref() {
        let size = event.size_hint();
        if !events.is_empty() && used.saturating_add(size) > byte_budget {
            break;
        }
        used = used.saturating_add(size);
        events.push(event);
    }
    // A failed read is the error, not the shorter delta before it.
    if let Some(error) = walk.error {
        return Err(error);
    }
    events.sort_unstable_by_key(|event| (event.stream, event.seq));
    Ok(())
}

/// Counts, per range of a delta (`(stream, first, last)`), the events
/// stamped at most some lamport and their payload bytes, from the
/// source's columns ([`State::delta_ranges`]).
struct Counter<'a> {
    source: &'a dyn crate::mem::Source,
    ranges: &'a [(StreamId, u64, u64)],
}

impl Counter<'_> {
    /// Per range, what stamps at most `lamport`: `below` is known to
    /// (it stamps at most a lower lamport), and no more than `within`
    /// events can, so only the events between are counted.
    fn count(
        &self,
        below: &[Through],
        within: &[u64],
        lamport: u64,
    ) -> Result<Vec<Through>, ReadError> {
        let mut counts = Vec::with_capacity(self.ranges.len());
        for ((&(stream, first, _), known), &upto) in self.ranges.iter().zip(below).zip(within) {
            let mut through = *known;
            if upto > known.count {
                let more = self
                    .source
                    .through(stream, first + known.count, first + (upto - 1), lamport)?
                    .ok_or("the source stopped counting")?;
                through.count += more.count;
                through.payload_bytes += more.payload_bytes;
            }
            counts.push(through);
        }
        Ok(counts)
    }

    /// Per range, the events of the longest prefix in `(lamport, stream)`
    /// order whose size fits `budget` (at least one event): a binary
    /// search on the lamport where it ends, between `low` (at most which
    /// nothing is stamped) and `high` (the highest stamp), then the events
    /// stamped at the end in stream order while they fit.
    fn taken_within(
        &self,
        budget: u64,
        mut low: u64,
        mut high: u64,
    ) -> Result<Vec<Through>, ReadError> {
        // Per stream, what stamps at most `low` (`below`), and how many
        // stamp at most `high` (`within`): a step counts only the events
        // between, so the windows narrow with the search.
        let mut below = vec![Through::default(); self.ranges.len()];
        let mut within: Vec<u64> = self
            .ranges
            .iter()
            .map(|&(_, first, last)| last - first + 1)
            .collect();
        let taken = self.count(&below, &within, high)?;
        if size(&taken) <= budget {
            return Ok(taken);
        }
        // Invariant: what stamps at most `low` fits, at `high` not.
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            let counts = self.count(&below, &within, middle)?;
            if size(&counts) <= budget {
                low = middle;
                below = counts;
            } else {
                high = middle;
                within = counts.iter().map(|t| t.count).collect();
            }
        }
        let mut taken = below.clone();
        let mut used = size(&taken);
        // Then the events stamped `high` (one per stream at most), in
        // stream order while they fit; the first event always goes.
        let next = self.count(&below, &within, high)?;
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
        Ok(taken)
    }
}

/// The size of what `through` counts: payloads, and 50 bytes per event.
fn size(through: &[Through]) -> u64 {
    through.iter().fold(0u64, |size, t| {
        size.saturating_add(t.payload_bytes)
            .saturating_add(t.count.saturating_mul(50))
    })
}
