//! `DeltaColumns`: a delta's events as columns, the way the memory log
//! holds them and a frame carries them.

use meshlog_cursor::{StreamId, VersionVector};

use crate::narrow::ColumnRange;
use crate::values::{Piece, Values, ValuesRef};
use crate::{Delta, Event};

/// A delta's events as columns: runs of consecutive seqs of one stream,
/// then per event its lamport stamp, time and where its payload ends, and
/// every payload back to back. What [`Replica::delta_columns_for`] reads
/// from the log for a sender to encode, without an [`Event`] and a
/// payload handle per event. Each of the three per-event columns is a
/// [`Values`]: a steady writer's stamps, times and ends are one piece
/// each (a first value and a step), whatever the run's length.
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
    /// The writers' seals over the runs (as [`Delta::seals`]).
    pub seals: Vec<crate::RunSeal>,
    /// What backs the floors (as [`Delta::floor_proofs`]).
    pub floor_proofs: crate::FloorProofs,
    /// Proofs of forked streams a peer passes on (`docs/SIGNING.md`,
    /// "Equivocation with valid signatures"): applying the delta keeps
    /// each that verifies, before its events are judged. A [`Delta`] has
    /// none ([`DeltaColumns::to_delta`] drops them).
    pub forks: Vec<crate::ForkProof>,
    runs: Vec<ColumnRun>,
    lamports: Values,
    times: Values,
    /// Per event, where its payload ends in `payloads`.
    ends: Values,
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

/// One run of a [`DeltaColumns`] with its columns: what a store holds
/// without making an [`Event`] of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunColumns<'a> {
    pub(crate) stream: StreamId,
    pub(crate) first_seq: u64,
    pub(crate) lamports: ValuesRef<'a>,
    pub(crate) times: ValuesRef<'a>,
    /// Per event, where its payload ends in `payloads`.
    pub(crate) ends: ValuesRef<'a>,
    /// Where the run's first payload starts in `payloads`.
    pub(crate) start: usize,
    /// Every payload of the delta (the run's are `start ..` its last end).
    pub(crate) payloads: &'a [u8],
}

impl RunColumns<'_> {
    /// Its events (at least one).
    pub(crate) fn len(&self) -> usize {
        self.lamports.len()
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.first_seq + (self.len() as u64 - 1)
    }

    pub(crate) fn last_lamport(&self) -> u64 {
        self.lamports.get(self.len() - 1)
    }

    /// Where the payload of event `index` starts in `payloads`.
    pub(crate) fn payload_start(&self, index: usize) -> usize {
        if index == 0 {
            self.start
        } else {
            self.end(index - 1)
        }
    }

    /// Where the payload of event `index` ends in `payloads`.
    pub(crate) fn end(&self, index: usize) -> usize {
        // Checked to lie within the payloads when the columns were made.
        self.ends.get(index) as usize
    }

    /// Whether a payload of the run is over `max` bytes (none can be when
    /// all of them together are not; one steady piece's are all its step
    /// but the first).
    pub(crate) fn has_payload_over(&self, max: usize) -> bool {
        if self.end(self.len() - 1) - self.start <= max {
            return false;
        }
        let mut start = self.start as u64;
        self.ends.pieces().any(|piece| {
            let over = match piece {
                Piece::Steady { first, step, len } => {
                    first - start > max as u64 || (len > 1 && step > max as u64)
                }
                Piece::Listed(ends) => {
                    let starts = std::iter::once(start).chain(ends.iter().copied());
                    ends.iter()
                        .zip(starts)
                        .any(|(&end, start)| end - start > max as u64)
                }
            };
            start = piece.last().unwrap_or(start);
            over
        })
    }

    /// The run as events, their payloads slices of one copy.
    pub(crate) fn to_events(self) -> Vec<Event> {
        let base = self.start;
        let copy = bytes::Bytes::copy_from_slice(&self.payloads[base..self.end(self.len() - 1)]);
        let starts = std::iter::once(base as u64).chain(self.ends.iter());
        self.lamports
            .iter()
            .zip(self.times.iter())
            .zip(self.ends.iter().zip(starts))
            .enumerate()
            .map(|(i, ((lamport, time_ms), (end, start)))| Event {
                stream: self.stream,
                seq: self.first_seq + i as u64,
                lamport,
                time_ms,
                payload: copy.slice(start as usize - base..end as usize - base),
            })
            .collect()
    }
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

/// Why columns handed to [`DeltaColumns::from_parts`] do not make a
/// delta.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ColumnsError {
    /// A run of no events.
    #[error("run {index} (stream {stream}) holds no events")]
    EmptyRun {
        /// The run's position.
        index: usize,
        /// Its stream.
        stream: StreamId,
    },
    /// A run whose seqs pass `u64::MAX`.
    #[error(
        "run {index} (stream {stream}) of {len} events from seq {first_seq} passes the largest seq"
    )]
    SeqOverflow {
        /// The run's position.
        index: usize,
        /// Its stream.
        stream: StreamId,
        /// Its first seq.
        first_seq: u64,
        /// Its events.
        len: usize,
    },
    /// A column whose length is not the runs' event count.
    #[error("the {column} column holds {len} values for {events} events")]
    ColumnLength {
        /// Which column.
        column: &'static str,
        /// Its values.
        len: usize,
        /// The events the runs hold.
        events: usize,
    },
    /// Payload ends that fall, pass the payloads, or stop short of them.
    #[error(
        "payload end {end} of event {index}: the ends must rise (or stay) up to exactly the \
         {payload_bytes} payload bytes"
    )]
    BadEnd {
        /// The event's position.
        index: usize,
        /// Its end.
        end: usize,
        /// The payload bytes given.
        payload_bytes: usize,
    },
}

impl DeltaColumns {
    /// A delta from its columns, as a decoder reads them: `runs`, then
    /// per event (in run order) its lamport stamp, time and where its
    /// payload ends in `payloads`, which holds every payload back to back.
    /// Checked whole: every run holds events whose seqs fit a `u64`, each
    /// column holds one value per event, and the ends rise (or stay) up to
    /// exactly `payloads.len()`. Runs are kept as given (two runs of one
    /// stream stay two).
    ///
    /// ```
    /// use meshlog_cursor::{StreamId, VersionVector};
    /// use meshlog_replica::{ColumnRun, DeltaColumns, Values};
    ///
    /// let run = ColumnRun { stream: StreamId::new(4), first_seq: 1, len: 2 };
    /// let columns = DeltaColumns::from_parts(
    ///     VersionVector::new(),
    ///     vec![run],
    ///     Values::from(vec![1, 2]),
    ///     Values::from(vec![1_000, 1_000]),
    ///     Values::from(vec![3, 5]),
    ///     b"onetw".to_vec(),
    /// )?;
    /// assert_eq!(columns.payload(1), b"tw");
    /// let one = |value| Values::from(vec![value]);
    /// assert!(DeltaColumns::from_parts(
    ///     VersionVector::new(), vec![run], one(1), one(1_000), one(3), b"one".to_vec()
    /// ).is_err());
    /// # Ok::<(), meshlog_replica::ColumnsError>(())
    /// ```
    pub fn from_parts(
        floor: VersionVector,
        runs: Vec<ColumnRun>,
        lamports: Values,
        times: Values,
        ends: Values,
        payloads: Vec<u8>,
    ) -> Result<Self, ColumnsError> {
        let events = run_events(&runs)?;
        for (column, len) in [
            ("lamport", lamports.len()),
            ("time", times.len()),
            ("payload end", ends.len()),
        ] {
            if len != events {
                return Err(ColumnsError::ColumnLength {
                    column,
                    len,
                    events,
                });
            }
        }
        check_ends(&ends, events, payloads.len())?;
        Ok(DeltaColumns {
            floor,
            seals: Vec::new(),
            floor_proofs: Default::default(),
            forks: Vec::new(),
            runs,
            lamports,
            times,
            ends,
            payloads,
        })
    }

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
        columns.seals.clone_from(&delta.seals);
        columns.floor_proofs.clone_from(&delta.floor_proofs);
        columns
    }

    /// The same events as a [`Delta`], in run order.
    pub fn to_delta(&self) -> Delta {
        // One copy of the payloads, each event's a slice of it.
        self.events_over(
            bytes::Bytes::copy_from_slice(&self.payloads),
            self.floor.clone(),
        )
    }

    /// [`DeltaColumns::to_delta`], the payloads kept where they are (each
    /// event's a slice of them) rather than copied.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use meshlog_cursor::{StreamId, VersionVector};
    /// use meshlog_replica::{Delta, DeltaColumns, Event};
    ///
    /// let event = Event {
    ///     stream: StreamId::new(3),
    ///     seq: 1,
    ///     lamport: 1,
    ///     time_ms: 0,
    ///     payload: Bytes::from_static(b"kept"),
    /// };
    /// let delta = Delta { floor: VersionVector::new(), events: vec![event], ..Delta::default() };
    /// let columns = DeltaColumns::from_delta(&delta);
    /// assert_eq!(columns.to_delta(), delta);
    /// assert_eq!(columns.into_delta(), delta);
    /// ```
    pub fn into_delta(mut self) -> Delta {
        let payloads = bytes::Bytes::from(std::mem::take(&mut self.payloads));
        let floor = std::mem::take(&mut self.floor);
        self.events_over(payloads, floor)
    }

    /// The events, their payloads slices of `payloads` (this delta's).
    fn events_over(&self, payloads: bytes::Bytes, floor: VersionVector) -> Delta {
        let mut events = Vec::with_capacity(self.len());
        let mut start = 0;
        let mut columns = self
            .lamports
            .iter()
            .zip(self.times.iter())
            .zip(self.ends.iter());
        for run in &self.runs {
            for i in 0..run.len {
                let ((lamport, time_ms), end) = columns.next().expect("a value per event");
                let end = end as usize;
                events.push(Event {
                    stream: run.stream,
                    seq: run.first_seq + i as u64,
                    lamport,
                    time_ms,
                    payload: if end == start {
                        bytes::Bytes::new()
                    } else {
                        payloads.slice(start..end)
                    },
                });
                start = end;
            }
        }
        Delta {
            floor_proofs: self.floor_proofs.clone(),
            floor,
            events,
            seals: self.seals.clone(),
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
        self.ends.push(self.payloads.len() as u64);
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
        slice.lamports.push_onto(&mut self.lamports, 0);
        slice.times.push_onto(&mut self.times, 0);
        // The chunk's ends, from `base` on, as ends in these payloads.
        let shift = self.payloads.len() as u64;
        slice
            .ends
            .push_onto(&mut self.ends, shift.wrapping_sub(slice.base as u64));
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

    /// Its runs with their columns, in order.
    pub(crate) fn run_parts(&self) -> impl Iterator<Item = RunColumns<'_>> + '_ {
        // Each column cut run by run from what is left of it: a cut walks
        // on over the pieces it passes, no search of the whole column.
        let rest = (
            self.lamports.as_ref(),
            self.times.as_ref(),
            self.ends.as_ref(),
            0usize,
        );
        self.runs
            .iter()
            .scan(rest, move |(lamports, times, ends, start), run| {
                let (run_lamports, lamports_rest) = lamports.split_at(run.len);
                let (run_times, times_rest) = times.split_at(run.len);
                let (run_ends, ends_rest) = ends.split_at(run.len);
                (*lamports, *times, *ends) = (lamports_rest, times_rest, ends_rest);
                let run_start = *start;
                if let Some(end) = run_ends.last() {
                    *start = end as usize;
                }
                Some(RunColumns {
                    stream: run.stream,
                    first_seq: run.first_seq,
                    lamports: run_lamports,
                    times: run_times,
                    ends: run_ends,
                    start: run_start,
                    payloads: &self.payloads,
                })
            })
    }

    /// How many events.
    #[inline]
    pub fn len(&self) -> usize {
        self.lamports.len()
    }

    /// Whether it holds no events (its floor may still say something).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.lamports.is_empty()
    }

    /// The runs, in order; the columns list their events in the same
    /// order.
    #[inline]
    pub fn runs(&self) -> &[ColumnRun] {
        &self.runs
    }

    /// Per event, its lamport stamp.
    #[inline]
    pub fn lamports(&self) -> ValuesRef<'_> {
        self.lamports.as_ref()
    }

    /// Per event, its time in milliseconds.
    #[inline]
    pub fn times(&self) -> ValuesRef<'_> {
        self.times.as_ref()
    }

    /// Per event, where its payload ends in [`DeltaColumns::payloads`]
    /// (it starts where the one before ends).
    #[inline]
    pub fn ends(&self) -> ValuesRef<'_> {
        self.ends.as_ref()
    }

    /// The payload of event `index` (in run order).
    ///
    /// # Panics
    ///
    /// If `index` is not below [`DeltaColumns::len`].
    #[inline]
    pub fn payload(&self, index: usize) -> &[u8] {
        let start = if index == 0 {
            0
        } else {
            self.ends.get(index - 1) as usize
        };
        &self.payloads[start..self.ends.get(index) as usize]
    }

    /// Per event, its payload's length.
    #[inline]
    pub fn payload_lens(&self) -> impl Iterator<Item = usize> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter());
        self.ends
            .iter()
            .zip(starts)
            .map(|(end, start)| (end - start) as usize)
    }

    /// The longest payload's length (0 for none): a steady piece of the
    /// ends is read at once.
    pub fn payload_len_max(&self) -> usize {
        let (mut max, mut start) = (0, 0);
        for piece in self.ends.as_ref().pieces() {
            let first = piece.first().unwrap_or(start);
            max = max.max(first - start);
            match piece {
                Piece::Steady { step, len, .. } if len > 1 => max = max.max(step),
                Piece::Steady { .. } => {}
                Piece::Listed(ends) => {
                    for pair in ends.windows(2) {
                        max = max.max(pair[1] - pair[0]);
                    }
                }
            }
            start = piece.last().unwrap_or(start);
        }
        max as usize
    }

    /// Every payload, back to back in run order.
    #[inline]
    pub fn payloads(&self) -> &[u8] {
        &self.payloads
    }

    /// The sum of the events' [`Event::size_hint`]s.
    pub fn size_hint(&self) -> usize {
        self.payloads.len() + 50 * self.len()
    }
}

/// The number of events `runs` hold, each run checked: not empty, and
/// its seqs fit a `u64` (the first step of [`DeltaColumns::from_parts`]).
fn run_events(runs: &[ColumnRun]) -> Result<usize, ColumnsError> {
    let mut events = 0usize;
    for (index, run) in runs.iter().enumerate() {
        if run.len == 0 {
            return Err(ColumnsError::EmptyRun {
                index,
                stream: run.stream,
            });
        }
        if run.first_seq.checked_add(run.len as u64 - 1).is_none() {
            return Err(ColumnsError::SeqOverflow {
                index,
                stream: run.stream,
                first_seq: run.first_seq,
                len: run.len,
            });
        }
        events = events.saturating_add(run.len);
    }
    Ok(events)
}

/// Checks that the payload `ends` of `events` events rise (or stay) to
/// exactly `payload_bytes` (the last step of [`DeltaColumns::from_parts`]).
fn check_ends(ends: &Values, events: usize, payload_bytes: usize) -> Result<(), ColumnsError> {
    // Rising (or staying) to exactly the payloads' length: a steady
    // piece is checked at once; value by value only to say where not.
    let bytes = payload_bytes as u64;
    if !(ends.as_ref().rises(false) && ends.as_ref().last().unwrap_or(0) == bytes) {
        let clamp = |end: u64| usize::try_from(end).unwrap_or(usize::MAX);
        let mut previous = 0;
        for (index, end) in ends.iter().enumerate() {
            if end < previous || end > bytes {
                return Err(ColumnsError::BadEnd {
                    index,
                    end: clamp(end),
                    payload_bytes,
                });
            }
            previous = end;
        }
        return Err(ColumnsError::BadEnd {
            index: events.saturating_sub(1),
            end: clamp(previous),
            payload_bytes,
        });
    }
    Ok(())
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

    /// Columns from their parts are the delta they make, or the reason
    /// they make none, at each edge.
    #[test]
    fn columns_from_parts_are_checked_whole() {
        let delta = Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: vec![event(3, 4, b"a"), event(3, 5, b""), event(1, 9, b"bcd")],
            seals: Vec::new(),
        };
        let columns = DeltaColumns::from_delta(&delta);
        let parts = |columns: &DeltaColumns| {
            (
                columns.runs.clone(),
                columns.lamports.iter().collect::<Vec<u64>>(),
                columns.times.iter().collect::<Vec<u64>>(),
                columns.ends.iter().collect::<Vec<u64>>(),
                columns.payloads.clone(),
            )
        };
        let from =
            |(runs, lamports, times, ends, payloads): (_, Vec<u64>, Vec<u64>, Vec<u64>, _)| {
                DeltaColumns::from_parts(
                    VersionVector::new(),
                    runs,
                    Values::from(lamports),
                    Values::from(times),
                    Values::from(ends),
                    payloads,
                )
            };
        assert_eq!(from(parts(&columns)), Ok(columns.clone()));
        let stream = StreamId::new(3);
        let mut bad = parts(&columns);
        bad.0[0].len = 0;
        assert_eq!(from(bad), Err(ColumnsError::EmptyRun { index: 0, stream }));
        let mut bad = parts(&columns);
        bad.0[0].first_seq = u64::MAX;
        assert!(matches!(
            from(bad),
            Err(ColumnsError::SeqOverflow { index: 0, .. })
        ));
        // A run of one event may start at the last seq.
        let mut edge = parts(&columns);
        edge.0[1].first_seq = u64::MAX;
        assert!(from(edge).is_ok());
        let mut bad = parts(&columns);
        bad.2.pop();
        assert_eq!(
            from(bad),
            Err(ColumnsError::ColumnLength {
                column: "time",
                len: 2,
                events: 3
            })
        );
        let mut bad = parts(&columns);
        bad.3[1] = 0;
        assert!(matches!(
            from(bad),
            Err(ColumnsError::BadEnd { index: 1, .. })
        ));
        let mut bad = parts(&columns);
        bad.4.push(b'x');
        assert!(matches!(
            from(bad),
            Err(ColumnsError::BadEnd { end: 4, .. })
        ));
        let mut bad = parts(&columns);
        bad.3[2] = u64::MAX;
        assert!(matches!(
            from(bad),
            Err(ColumnsError::BadEnd { index: 2, .. })
        ));
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
            floor_proofs: Default::default(),
            floor: [(StreamId::new(2), 5)].into_iter().collect(),
            events: events.clone(),
            seals: Vec::new(),
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
