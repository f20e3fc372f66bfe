//! `DeltaColumns`: a delta's events as columns, the way the memory log
//! holds them and a frame carries them.

use meshlog_cursor::{StreamId, VersionVector};

use crate::narrow::ColumnRange;
use crate::{Delta, Event};

/// A delta's events as columns: runs of consecutive seqs of one stream,
/// then per event its lamport stamp, time and payload length, and every
/// payload back to back. What [`Replica::delta_columns_for`] reads from
/// the log for a sender to encode, without an [`Event`] and a payload
/// handle per event.
///
/// The same events as a [`Delta`] (in run order):
///
/// ```
/// use bytes::Bytes;
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::{DeltaColumns, Replica};
///
/// let mut writer = Replica::new(StreamId::new(7));
/// writer.append(Bytes::from_static(b"one")).unwrap();
/// writer.append(Bytes::from_static(b"two")).unwrap();
/// let columns = writer.delta_columns_for(&VersionVector::new(), usize::MAX);
/// assert_eq!(columns.len(), 2);
/// assert_eq!(columns.runs()[0].first_seq, 1);
/// assert_eq!(columns.payload(1), b"two");
/// assert_eq!(
///     columns.to_delta(),
///     writer.delta_for(&VersionVector::new(), usize::MAX)
/// );
/// ```
///
/// [`Replica::delta_columns_for`]: crate::Replica::delta_columns_for
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeltaColumns {
    /// Floors the receiver must record (as [`Delta::floor`]).
    pub floor: VersionVector,
    runs: Vec<ColumnRun>,
    lamports: Vec<u64>,
    times: Vec<u64>,
    /// Per event, where its payload ends in `payloads`.
    ends: Vec<usize>,
    payloads: Vec<u8>,
}

/// A slice of a memory log chunk's columns: per event its stamp, time and
/// where its payload ends among the chunk's payloads, and those payloads
/// from `base` on.
pub(crate) struct ColumnSlice<'a> {
    pub(crate) lamports: ColumnRange<'a>,
    pub(crate) times: ColumnRange<'a>,
    pub(crate) ends: ColumnRange<'a>,
    pub(crate) base: usize,
    pub(crate) payloads: &'a [u8],
}

/// One run of a [`DeltaColumns`]: `len` events of `stream`, seqs
/// `first_seq ..`, the next `len` entries of each column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnRun {
    /// The run's stream.
    pub stream: StreamId,
    /// The seq of its first event.
    pub first_seq: u64,
    /// Its events (at least one).
    pub len: usize,
}

impl ColumnRun {
    /// The seq of its last event (`first_seq` for a run of none, which a
    /// [`DeltaColumns`] never holds).
    pub fn last_seq(&self) -> u64 {
        self.first_seq
            .saturating_add((self.len as u64).saturating_sub(1))
    }
}

impl DeltaColumns {
    /// No events, and `floor`.
    pub fn new(floor: VersionVector) -> Self {
        DeltaColumns {
            floor,
            ..DeltaColumns::default()
        }
    }

    /// The same events as `delta`, in its order: a new run wherever the
    /// stream changes or the seq is not the one after.
    pub fn from_delta(delta: &Delta) -> Self {
        let mut columns = DeltaColumns::new(delta.floor.clone());
        columns.reserve(
            delta.events.len(),
            delta.events.iter().map(|e| e.payload.len()).sum(),
        );
        for event in &delta.events {
            columns.push(event);
        }
        columns
    }

    /// The same events as a [`Delta`], in run order.
    pub fn to_delta(&self) -> Delta {
        let mut events = Vec::with_capacity(self.len());
        // One copy of the payloads, each event's a slice of it.
        let payloads = bytes::Bytes::copy_from_slice(&self.payloads);
        let mut index = 0;
        for run in &self.runs {
            for i in 0..run.len {
                events.push(Event {
                    stream: run.stream,
                    seq: run.first_seq + i as u64,
                    lamport: self.lamports[index],
                    time_ms: self.times[index],
                    payload: if self.payload(index).is_empty() {
                        bytes::Bytes::new()
                    } else {
                        let start = if index == 0 { 0 } else { self.ends[index - 1] };
                        payloads.slice(start..self.ends[index])
                    },
                });
                index += 1;
            }
        }
        Delta {
            floor: self.floor.clone(),
            events,
        }
    }

    /// Makes room for `events` more events of `payload_bytes` in all.
    pub fn reserve(&mut self, events: usize, payload_bytes: usize) {
        self.lamports.reserve(events);
        self.times.reserve(events);
        self.ends.reserve(events);
        self.payloads.reserve(payload_bytes);
    }

    /// Appends `event`: to the last run if it is the next seq of its
    /// stream, else as a new run.
    pub fn push(&mut self, event: &Event) {
        self.start_run(event.stream, event.seq, 1);
        self.lamports.push(event.lamport);
        self.times.push(event.time_ms);
        self.payloads.extend_from_slice(&event.payload);
        self.ends.push(self.payloads.len());
    }

    /// Appends the columns of consecutive events of `stream` from
    /// `first_seq`, a slice of each of a memory log chunk's columns.
    pub(crate) fn extend_from_columns(
        &mut self,
        stream: StreamId,
        first_seq: u64,
        slice: ColumnSlice<'_>,
    ) {
        if slice.lamports.is_empty() {
            return;
        }
        self.start_run(stream, first_seq, slice.lamports.len());
        slice
            .lamports
            .extend_into(&mut self.lamports, |lamport| lamport);
        slice.times.extend_into(&mut self.times, |time| time);
        let shift = self.payloads.len();
        slice
            .ends
            .extend_into(&mut self.ends, |end| end as usize - slice.base + shift);
        self.payloads.extend_from_slice(slice.payloads);
    }

    fn start_run(&mut self, stream: StreamId, first_seq: u64, len: usize) {
        match self.runs.last_mut() {
            Some(run)
                if run.stream == stream && run.last_seq().checked_add(1) == Some(first_seq) =>
            {
                run.len += len;
            }
            _ => self.runs.push(ColumnRun {
                stream,
                first_seq,
                len,
            }),
        }
    }

    /// How many events.
    pub fn len(&self) -> usize {
        self.lamports.len()
    }

    /// Whether it holds no events (its floor may still say something).
    pub fn is_empty(&self) -> bool {
        self.lamports.is_empty()
    }

    /// The runs, in order; the columns list their events in the same
    /// order.
    pub fn runs(&self) -> &[ColumnRun] {
        &self.runs
    }

    /// Per event, its lamport stamp.
    pub fn lamports(&self) -> &[u64] {
        &self.lamports
    }

    /// Per event, its time in milliseconds.
    pub fn times(&self) -> &[u64] {
        &self.times
    }

    /// The payload of event `index` (in run order).
    ///
    /// # Panics
    ///
    /// If `index` is not below [`DeltaColumns::len`].
    pub fn payload(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.payloads[start..self.ends[index]]
    }

    /// Per event, its payload's length.
    pub fn payload_lens(&self) -> impl Iterator<Item = usize> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        self.ends
            .iter()
            .zip(starts)
            .map(|(&end, start)| end - start)
    }

    /// Every payload, back to back in run order.
    pub fn payloads(&self) -> &[u8] {
        &self.payloads
    }

    /// The sum of the events' [`Event::size_hint`]s.
    pub fn size_hint(&self) -> usize {
        self.payloads.len() + 50 * self.len()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn event(stream: u64, seq: u64, payload: &'static [u8]) -> Event {
        Event {
            stream: StreamId::new(stream),
            seq,
            lamport: seq * 2,
            time_ms: 1000 + seq,
            payload: Bytes::from_static(payload),
        }
    }

    #[test]
    fn events_go_in_runs_and_come_back_in_run_order() {
        let events = vec![
            event(3, 4, b"a"),
            event(3, 5, b""),
            event(1, 9, b"bcd"),
            event(3, 6, b"e"),
            event(3, 8, b"f"),
        ];
        let delta = Delta {
            floor: [(StreamId::new(2), 5)].into_iter().collect(),
            events: events.clone(),
        };
        let columns = DeltaColumns::from_delta(&delta);
        let runs: Vec<(u64, u64, usize)> = columns
            .runs()
            .iter()
            .map(|run| (run.stream.get(), run.first_seq, run.len))
            .collect();
        assert_eq!(runs, [(3, 4, 2), (1, 9, 1), (3, 6, 1), (3, 8, 1)]);
        assert_eq!(columns.len(), 5);
        assert_eq!(columns.payload(2), b"bcd");
        assert_eq!(columns.payload(1), b"");
        assert_eq!(columns.payload_lens().collect::<Vec<_>>(), [1, 0, 3, 1, 1]);
        assert_eq!(columns.payloads(), b"abcdef");
        assert_eq!(
            columns.size_hint(),
            events.iter().map(Event::size_hint).sum::<usize>()
        );
        assert_eq!(columns.to_delta(), delta);
        assert!(DeltaColumns::new(VersionVector::new()).is_empty());
    }
}
