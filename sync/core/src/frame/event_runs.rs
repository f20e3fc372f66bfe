//! A delta's events, written by hand: their count, one run header per
//! stream (streams ascending, each `stream, first seq, event count`, the
//! first seq after the first run as a difference from the run's before),
//! then three columns over the events in run order (lamport gaps, times,
//! payload lengths), each in repeat and literal runs, and the payloads back
//! to back (`docs/PROTOCOL.md`, "Delta events").
//!
//! Separate from the postcard-mapped fields because it is a codec of its
//! own: the stream written once per run, seqs implied, lamport stamps and
//! times as differences, and each column's repeats written once, so a
//! writer's steady events (consecutive stamps, a steady clock, payloads of
//! one size) cost a few bytes a delta besides their payloads, where
//! postcard's layout of an `Event` would repeat every field in full. The
//! layout makes a hole, a seq twice or a falling stamp unwritable, and the
//! decoder reads canonical input only, so a delta re-encodes to the bytes
//! it came from.

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{ColumnRun, DeltaColumns, Event, Piece, Values, ValuesRef};

use super::{FrameError, DELTA_EVENTS_MAX};

/// The longest varint of a `u64`: 10 bytes of 7 bits, the last holding 1.
const VARINT_BYTES_MAX: usize = 10;

/// Appends `value` as a LEB128 varint, postcard's encoding of unsigned
/// integers: 7 bits a byte, least significant group first, the high bit
/// set on every byte but the last. Always the shortest form.
pub(super) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A signed difference as an unsigned number, small magnitudes small:
/// 0, -1, 1, -2, 2... as 0, 1, 2, 3, 4...
fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// The inverse of [`zigzag`].
fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// `value` as a difference from `base`, modulo 2^64, zigzag-encoded: every
/// pair has exactly one encoding, and [`undiff`] gives `value` back.
fn diff(value: u64, base: u64) -> u64 {
    zigzag(value.wrapping_sub(base) as i64)
}

/// The inverse of [`diff`]: the value `encoded` stands for above `base`.
fn undiff(encoded: u64, base: u64) -> u64 {
    base.wrapping_add(unzigzag(encoded) as u64)
}

/// The fewest equal values in a row a column writes as a repeat; shorter
/// runs of a value go in literal runs.
const REPEAT_MIN: u64 = 3;

/// Writes a delta's events after its floor (`docs/PROTOCOL.md`, "Delta
/// events"): their count; one run header per stream, streams ascending,
/// each `stream, first seq, event count` (the first seq of every run but
/// the first as a difference from the run's before); then three columns
/// over the events in run order, each in repeat and literal runs — lamport
/// gaps, times, payload lengths — and last the payloads back to back.
///
/// The seqs of a run are implied (`first + i`), so a stream's events must
/// be contiguous; a lamport stamp is written as its gap above the previous
/// one in the run less one, so it must rise from 1 (a run's first stamp is
/// a difference from the first stamp of the run before, the delta's first
/// its gap above 0); a time is the wrapping difference from the previous
/// event's in the column, zigzag-encoded (the first event's plain). What
/// the layout cannot carry is refused with [`FrameError::Encode`].
pub(super) fn encode_events(events: &[Event], out: &mut Vec<u8>) -> Result<usize, FrameError> {
    // Grouped by stream, each stream's events in the order given: a stable
    // sort (a replica's delta comes grouped already, streams ascending).
    let mut by_stream: Vec<&Event> = events.iter().collect();
    if !by_stream.is_sorted_by_key(|event| event.stream) {
        by_stream.sort_by_key(|event| event.stream);
    }
    let mut columns = DeltaColumns::default();
    columns.reserve(
        events.len(),
        events.iter().map(|event| event.payload.len()).sum(),
    );
    for event in by_stream {
        columns.push(event);
    }
    encode_columns(&columns, out)
}

/// [`encode_events`] from the events' columns (their floor aside): the
/// runs must be one per stream, streams ascending, and each run's stamps
/// must rise from 1. What a sender reads with
/// `Replica::delta_columns_for` is written as it is: no event is made,
/// and the payloads go in with one copy. Returns the number of runs
/// written (what bounds the delta's seals).
pub(super) fn encode_columns(
    columns: &DeltaColumns,
    out: &mut Vec<u8>,
) -> Result<usize, FrameError> {
    // Sized once for the payloads (the columns may be a few bytes for
    // thousands of events: they grow as written).
    out.reserve(columns.payloads().len() + 64);
    put_varint(out, columns.len() as u64);
    let mut gaps = Column::default();
    // The previous run: its stream and last seq, its first seq and stamp.
    let mut run_previous: Option<(ColumnRun, u64)> = None;
    let mut index = 0;
    for run in columns.runs() {
        if let Some((previous, _)) = run_previous {
            check_run_order(&previous, run)?;
        }
        put_varint(out, run.stream.get());
        put_varint(
            out,
            run_previous.map_or(run.first_seq, |(previous, _)| {
                diff(run.first_seq, previous.first_seq)
            }),
        );
        put_varint(out, run.len as u64);
        let run_lamports = columns.lamports().slice(index..index + run.len);
        push_lamport_gaps(&mut gaps, run, &run_lamports, run_previous)?;
        run_previous = Some((*run, run_lamports.get(0)));
        index += run.len;
    }
    gaps.finish(out);
    time_column(columns.times()).finish(out);
    len_column(columns.ends()).finish(out);
    out.extend_from_slice(columns.payloads());
    Ok(columns.runs().len())
}

/// An encoding refused: what the delta breaks.
fn refuse(detail: String) -> FrameError {
    FrameError::Encode {
        kind: "delta",
        detail,
    }
}

/// Refuses a run that does not follow `previous` in a delta's order: one
/// run per stream, streams ascending.
fn check_run_order(previous: &ColumnRun, run: &ColumnRun) -> Result<(), FrameError> {
    if previous.stream < run.stream {
        return Ok(());
    }
    Err(refuse(if previous.stream == run.stream {
        format!(
            "event {}:{} follows seq {} of its stream: a delta carries each \
             stream's events contiguous and in seq order",
            run.stream,
            run.first_seq,
            previous.last_seq(),
        )
    } else {
        format!(
            "stream {} follows stream {}: a delta's runs go streams ascending",
            run.stream, previous.stream
        )
    }))
}

/// Pushes a run's lamport stamps as gaps: the first as a difference from
/// the run before's first (or itself less one), then each gap above the
/// one before. Refuses stamps that do not rise from 1 with seq.
fn push_lamport_gaps(
    gaps: &mut Column,
    run: &ColumnRun,
    run_lamports: &ValuesRef<'_>,
    run_previous: Option<(ColumnRun, u64)>,
) -> Result<(), FrameError> {
    // Stamps rise from 1 with seq: the first above 0, each above the
    // one before.
    let falls = |i: usize, previous: u64| {
        refuse(format!(
            "event {}:{} has lamport stamp {}, not above {previous}: lamport stamps rise \
             from 1 with seq",
            run.stream,
            run.first_seq + i as u64,
            run_lamports.get(i),
        ))
    };
    // Piece by piece: a steady one's gaps are one repeat, written at
    // once.
    let (mut previous, mut i) = (None::<u64>, 0usize);
    for piece in run_lamports.pieces() {
        let first = piece.first().unwrap_or_default();
        gaps.push(match (previous, run_previous) {
            (None, _) if first == 0 => return Err(falls(0, 0)),
            (None, Some((_, first_lamport))) => diff(first, first_lamport),
            (None, None) => first - 1,
            (Some(before), _) if first <= before => return Err(falls(i, before)),
            (Some(before), _) => first - before - 1,
        });
        match piece {
            Piece::Steady { first, step, len } if len > 1 => {
                if step == 0 {
                    return Err(falls(i + 1, first));
                }
                // The steps that fit below u64::MAX.
                let fit = (u64::MAX - first) / step;
                if fit < len as u64 - 1 {
                    return Err(falls(i + fit as usize + 1, first + fit * step));
                }
                gaps.push_n(step - 1, len as u64 - 1);
            }
            Piece::Steady { .. } => {}
            Piece::Listed(values) => {
                for (k, pair) in values.windows(2).enumerate() {
                    if pair[1] <= pair[0] {
                        return Err(falls(i + k + 1, pair[0]));
                    }
                    gaps.push(pair[1] - pair[0] - 1);
                }
            }
        }
        previous = piece.last();
        i += piece.len();
    }
    Ok(())
}

/// The times as differences from the one before (the first as it is): a
/// steady piece's all one step.
fn time_column(times: ValuesRef<'_>) -> Column {
    let mut column = Column::default();
    let mut time_previous: Option<u64> = None;
    for piece in times.pieces() {
        let first = piece.first().unwrap_or_default();
        column.push(match time_previous {
            None => first,
            Some(previous) => zigzag(first.wrapping_sub(previous) as i64),
        });
        match piece {
            Piece::Steady { step, len, .. } => {
                column.push_n(zigzag(step as i64), len as u64 - 1);
            }
            Piece::Listed(values) => {
                for pair in values.windows(2) {
                    column.push(zigzag(pair[1].wrapping_sub(pair[0]) as i64));
                }
            }
        }
        time_previous = piece.last();
    }
    column
}

/// The payloads' lengths, from their ends: a steady piece's all one step.
fn len_column(ends: ValuesRef<'_>) -> Column {
    let mut column = Column::default();
    let mut end_previous = 0;
    for piece in ends.pieces() {
        column.push(piece.first().unwrap_or_default() - end_previous);
        match piece {
            Piece::Steady { step, len, .. } => column.push_n(step, len as u64 - 1),
            Piece::Listed(values) => {
                for pair in values.windows(2) {
                    column.push(pair[1] - pair[0]);
                }
            }
        }
        end_previous = piece.last().unwrap_or_default();
    }
    column
}

/// A column being written: its values as runs of equal values, each value
/// differing from the run's before it. A run of [`REPEAT_MIN`] or more is
/// written as a repeat (`2 × (n − 3)`, then the value); the shorter runs
/// between two repeats go in one literal run (`2 × (k − 1) + 1`, then the
/// `k` values). So every column has one encoding.
#[derive(Default)]
struct Column {
    runs: Vec<(u64, u64)>,
    /// The run being counted (its value and how many): kept out of `runs`
    /// until a different value ends it, so that a value equal to the last
    /// costs a compare and an add.
    open: (u64, u64),
}

impl Column {
    #[inline]
    fn push(&mut self, value: u64) {
        let (last, repeat) = &mut self.open;
        if *last == value && *repeat > 0 {
            *repeat += 1;
        } else {
            if *repeat > 0 {
                self.runs.push(self.open);
            }
            self.open = (value, 1);
        }
    }

    /// [`Column::push`] of `value`, `n` times.
    #[inline]
    fn push_n(&mut self, value: u64, n: u64) {
        if n == 0 {
            return;
        }
        let (last, repeat) = &mut self.open;
        if *last == value && *repeat > 0 {
            *repeat += n;
        } else {
            if *repeat > 0 {
                self.runs.push(self.open);
            }
            self.open = (value, n);
        }
    }

    fn finish(mut self, out: &mut Vec<u8>) {
        if self.open.1 > 0 {
            self.runs.push(self.open);
        }
        // The runs shorter than a repeat since the last repeat, written
        // as one literal run before the next repeat (or at the end).
        let flush = |literals: &[(u64, u64)], out: &mut Vec<u8>| {
            let count: u64 = literals.iter().map(|&(_, repeat)| repeat).sum();
            if count > 0 {
                put_varint(out, 2 * (count - 1) + 1);
                for &(value, repeat) in literals {
                    for _ in 0..repeat {
                        put_varint(out, value);
                    }
                }
            }
        };
        let mut literals_from = 0;
        for (i, &(value, repeat)) in self.runs.iter().enumerate() {
            if repeat >= REPEAT_MIN {
                flush(&self.runs[literals_from..i], out);
                literals_from = i + 1;
                put_varint(out, 2 * (repeat - REPEAT_MIN));
                put_varint(out, value);
            }
        }
        flush(&self.runs[literals_from..], out);
    }
}

/// Reads a delta's events, written by [`encode_events`], into columns as
/// they were written: no [`Event`] and no payload handle per event (what a
/// receiver applies; a [`Frame`](super::Frame) makes events of them). What
/// follows the payloads (the delta's sections) is handed to `trailer` with
/// the delta's number of runs, after the events are checked and before
/// anything is allocated for them; its answer comes back beside the
/// columns.
///
/// Every count is checked before anything is decoded or allocated for what
/// it counts: the delta's against [`DELTA_EVENTS_MAX`] (so a delta decodes
/// into at most 8,192 events, 512 KiB, whatever its size), each run's
/// against what the delta's count leaves, each column's repeats against
/// the events left in it, and the payload lengths' sum against the bytes
/// left. Seqs, lamport stamps and their sums are checked for overflow.
/// Only canonical input decodes (shortest varints, one run per stream,
/// streams strictly ascending, no empty run, no repeat of 0, no two pairs
/// of a column with one value in a row), so the events re-encode to the
/// very bytes they came from.
///
/// Nothing is allocated for the events until the whole delta is known to
/// be well formed (the run headers read, the columns and payloads checked
/// in a first pass that allocates nothing, the trailer read): a malformed
/// delta costs only its run headers (and what its trailer decoded),
/// however many events it claims. Then the columns are reserved once and
/// read again, and the payloads are copied once, into one buffer.
///
/// The events come out in run order: by stream, ascending, each stream's in
/// seq order (and so with rising lamport stamps). Receipt is order-free
/// across streams, and a receiver takes a stream's events as a run; putting
/// them back into `(lamport, stream)` order cost a third of a convergence's
/// time (`docs/BENCHMARKS.md`).
pub(super) fn decode_columns<T>(
    bytes: &[u8],
    trailer: impl FnOnce(&[u8], usize) -> Result<T, FrameError>,
) -> Result<(DeltaColumns, T), FrameError> {
    decode_columns_checked_by(bytes, check_columns, trailer)
}

/// A check of a delta's columns: [`check_columns`], or (in tests) its
/// value-by-value reference. It answers the payloads and what follows them.
type ColumnsCheck = for<'a> fn(&'a [u8], &[Run], usize) -> Result<(&'a [u8], &'a [u8]), FrameError>;

/// [`decode_columns`], as events (a [`Frame`](super::Frame)'s): reserved
/// once, the payloads copied once into one buffer that every event's
/// payload is a slice of.
pub(super) fn decode_events<T>(
    bytes: &[u8],
    trailer: impl FnOnce(&[u8], usize) -> Result<T, FrameError>,
) -> Result<(Vec<Event>, T), FrameError> {
    decode_events_checked_by(bytes, check_columns, trailer)
}

/// [`decode_events`], its columns checked by `check`.
fn decode_events_checked_by<T>(
    bytes: &[u8],
    check: ColumnsCheck,
    trailer: impl FnOnce(&[u8], usize) -> Result<T, FrameError>,
) -> Result<(Vec<Event>, T), FrameError> {
    let (runs, count, columns) = read_runs(bytes)?;
    // As in `decode_columns_checked_by`: checked whole first.
    let (payload_bytes, rest) = check(columns, &runs, count)?;
    let after = trailer(rest, runs.len())?;
    let mut events: Vec<Event> = Vec::with_capacity(count);
    let payloads = Bytes::copy_from_slice(payload_bytes);
    let mut start = 0;
    read_columns(columns, &runs, count, |run, i, fields| {
        let payload = if fields.len > 0 {
            payloads.slice(start..start + fields.len)
        } else {
            Bytes::new()
        };
        start += fields.len;
        events.push(Event {
            stream: run.stream,
            seq: run.first_seq + i,
            lamport: fields.lamport,
            time_ms: fields.time_ms,
            payload,
        });
    })?;
    Ok((events, after))
}

/// A delta's event count and run headers, checked (every run's count
/// against what the delta's count leaves, its seqs against overflow), and
/// the bytes after them: the columns and the payloads.
fn read_runs(bytes: &[u8]) -> Result<(Vec<Run>, usize, &[u8]), FrameError> {
    let mut reader = Reader { bytes };
    let count = reader.varint("event count")?;
    if count > DELTA_EVENTS_MAX as u64 {
        return Err(FrameError::TooManyEvents {
            count: usize::try_from(count).unwrap_or(usize::MAX),
            max: DELTA_EVENTS_MAX,
        });
    }
    let count = count as usize;
    // The run headers: at least 3 bytes each, so they grow with the input.
    let mut runs: Vec<Run> = Vec::new();
    let mut headed = 0usize;
    let mut stream_previous: Option<StreamId> = None;
    while headed < count {
        let stream = StreamId::new(reader.varint("stream")?);
        let bad_run = |detail: String| FrameError::BadRun { stream, detail };
        if let Some(previous) = stream_previous {
            if stream <= previous {
                return Err(bad_run(format!(
                    "it follows the run of stream {previous}: one run per stream, \
                     streams strictly ascending"
                )));
            }
        }
        stream_previous = Some(stream);
        let first_seq = reader.varint("first seq")?;
        // After the first run, a difference from the run's before.
        let first_seq = runs
            .last()
            .map_or(first_seq, |previous| undiff(first_seq, previous.first_seq));
        let run_len = reader.varint("run event count")?;
        let events_left = count - headed;
        if run_len == 0 {
            return Err(bad_run("a run of no events".to_string()));
        }
        if run_len > events_left as u64 {
            return Err(bad_run(format!(
                "{run_len} events where the delta's count leaves {events_left}"
            )));
        }
        first_seq
            .checked_add(run_len - 1)
            .ok_or(FrameError::SeqOverflow {
                stream,
                first_seq,
                count: run_len,
            })?;
        runs.push(Run {
            stream,
            first_seq,
            len: run_len as usize,
        });
        headed += run_len as usize;
    }
    Ok((runs, count, reader.bytes))
}

/// [`decode_columns`], its columns checked by `check`.
fn decode_columns_checked_by<T>(
    bytes: &[u8],
    check: ColumnsCheck,
    trailer: impl FnOnce(&[u8], usize) -> Result<T, FrameError>,
) -> Result<(DeltaColumns, T), FrameError> {
    let (runs, count, columns) = read_runs(bytes)?;
    // The columns and the payloads are checked whole, and the trailer
    // read, before anything is allocated for the events: a few bytes may
    // stand for thousands of events, but only in a delta that decodes.
    let (payload_bytes, rest) = check(columns, &runs, count)?;
    let after = trailer(rest, runs.len())?;
    let (lamports, times, ends) = read_columns_whole(columns, &runs, count)?;
    let runs = runs
        .iter()
        .map(|run| ColumnRun {
            stream: run.stream,
            first_seq: run.first_seq,
            len: run.len,
        })
        .collect();
    // Checked above as a frame: columns that fail here are a bug of this
    // decoder, reported as malformed input rather than a panic.
    let columns = DeltaColumns::from_parts(
        VersionVector::new(),
        runs,
        lamports,
        times,
        ends,
        payload_bytes.to_vec(),
    )
    .map_err(|error| FrameError::Malformed {
        kind: "delta",
        detail: error.to_string(),
    })?;
    Ok((columns, after))
}

/// A run's header: its stream, first seq and number of events.
struct Run {
    stream: StreamId,
    first_seq: u64,
    len: usize,
}

/// One event's fields read from the columns.
struct Fields {
    lamport: u64,
    time_ms: u64,
    len: usize,
}

/// Checks a delta's three columns (`columns` starts at the first) for
/// `count` events in the runs' order, and that the bytes after them hold
/// the payloads; returns the payloads and the bytes after them (the
/// delta's sections). Allocates nothing.
fn check_columns<'a>(
    columns: &'a [u8],
    runs: &[Run],
    count: usize,
) -> Result<(&'a [u8], &'a [u8]), FrameError> {
    let mut reader = Reader { bytes: columns };
    let mut gaps = ColumnReader::new("lamport gaps", count);
    let mut stamps = Stamps::default();
    // A repeat is checked at once (the values it stands for are known),
    // with the same outcome, error included, as value by value.
    for run in runs {
        let len = run.len as u64;
        let mut i = 0;
        while i < len {
            let overflow = |i: u64| FrameError::LamportOverflow {
                stream: run.stream,
                seq: run.first_seq + i,
            };
            let gap = gaps.next(&mut reader)?;
            stamps.next(gap, i).ok_or(overflow(i))?;
            i += 1;
            let more = gaps.take_repeat(len - i);
            if more > 0 {
                stamps
                    .rise(gap, more)
                    .map_err(|within| overflow(i + within))?;
                i += more;
            }
        }
    }
    ColumnReader::new("times", count).skip_all(&mut reader)?;
    let mut lens = ColumnReader::new("payload lengths", count);
    let mut total = 0u64;
    let mut read = 0;
    while read < count {
        let len = lens.next(&mut reader)?;
        let more = lens.take_repeat((count - read - 1) as u64);
        read += 1 + more as usize;
        let bytes_left = reader.bytes.len() as u64;
        // The sum after each of the 1 + `more` values, up to the first
        // above the bytes left (what summing them one by one stops at).
        let room = bytes_left.saturating_sub(total);
        let values = match len {
            0 => 1,
            len => (room / len + 1).min(1 + more),
        };
        total = total.saturating_add(len.saturating_mul(values));
        if total > bytes_left {
            return Err(FrameError::CountAboveBytes {
                field: "payloads",
                count: total,
                bytes_left: reader.bytes.len(),
            });
        }
    }
    // At most the bytes left: checked as the lengths were summed.
    Ok(reader.bytes.split_at(total as usize))
}

/// Reads the columns [`check_columns`] accepted, handing each event's
/// fields to `each` in run order with its run and its index in the run.
/// The three columns follow one another, so each is read by its own
/// reader, started where the one before it ends.
fn read_columns(
    columns: &[u8],
    runs: &[Run],
    count: usize,
    mut each: impl FnMut(&Run, u64, Fields),
) -> Result<(), FrameError> {
    // Where the times and the lengths start: past the columns before them.
    let mut skip = Reader { bytes: columns };
    ColumnReader::new("lamport gaps", count).skip_all(&mut skip)?;
    let times_at = skip.bytes;
    ColumnReader::new("times", count).skip_all(&mut skip)?;
    let mut gaps_reader = Reader { bytes: columns };
    let mut times_reader = Reader { bytes: times_at };
    let mut lens_reader = Reader { bytes: skip.bytes };
    let mut gaps = ColumnReader::new("lamport gaps", count);
    let mut times = ColumnReader::new("times", count);
    let mut lens = ColumnReader::new("payload lengths", count);
    let mut time_previous: Option<u64> = None;
    let mut stamps = Stamps::default();
    for run in runs {
        for i in 0..run.len as u64 {
            // Checked by `check_columns`: in range.
            let lamport = stamps
                .next(gaps.next(&mut gaps_reader)?, i)
                .unwrap_or_default();
            let value = times.next(&mut times_reader)?;
            let time_ms = match time_previous {
                None => value,
                Some(previous) => previous.wrapping_add(unzigzag(value) as u64),
            };
            time_previous = Some(time_ms);
            let len = lens.next(&mut lens_reader)? as usize;
            each(
                run,
                i,
                Fields {
                    lamport,
                    time_ms,
                    len,
                },
            );
        }
    }
    Ok(())
}

/// A delta's stamps, times and payload ends, as [`read_columns_whole`]
/// reads them.
type ReadColumns = (Values, Values, Values);

/// The columns of a delta checked by [`check_columns`], each read whole
/// in turn: the stamps, the times and the payload ends (sums of the
/// lengths), a repeat as one steady piece (held in no memory a value).
/// Reads what [`read_columns`] reads.
fn read_columns_whole(
    columns: &[u8],
    runs: &[Run],
    count: usize,
) -> Result<ReadColumns, FrameError> {
    let mut reader = Reader { bytes: columns };
    let mut lamports = Values::new();
    let mut gaps = ColumnReader::new("lamport gaps", count);
    let mut stamps = Stamps::default();
    for run in runs {
        let len = run.len as u64;
        let mut i = 0;
        while i < len {
            // Checked by `check_columns`: in range.
            let gap = gaps.next(&mut reader)?;
            let lamport = stamps.next(gap, i).unwrap_or_default();
            lamports.push(lamport);
            i += 1;
            let more = gaps.take_repeat(len - i);
            if more > 0 {
                let step = gap.wrapping_add(1);
                lamports.push_steady(lamport.wrapping_add(step), step, more as usize);
                stamps.lamport = lamport.wrapping_add(more.wrapping_mul(step));
                i += more;
            }
        }
    }
    let mut times = Values::new();
    let mut column = ColumnReader::new("times", count);
    let mut time: Option<u64> = None;
    while times.len() < count {
        let value = column.next(&mut reader)?;
        let now = match time {
            None => value,
            Some(previous) => previous.wrapping_add(unzigzag(value) as u64),
        };
        times.push(now);
        let more = column.take_repeat((count - times.len()) as u64);
        let step = unzigzag(value) as u64;
        times.push_steady(now.wrapping_add(step), step, more as usize);
        time = Some(now.wrapping_add(more.wrapping_mul(step)));
    }
    let mut ends = Values::new();
    let mut column = ColumnReader::new("payload lengths", count);
    let mut end = 0u64;
    while ends.len() < count {
        // Checked by `check_columns`: the lengths sum to the bytes left.
        let len = column.next(&mut reader)?;
        let more = column.take_repeat((count - ends.len() - 1) as u64);
        ends.push_steady(end + len, len, 1 + more as usize);
        end += (1 + more) * len;
    }
    Ok((lamports, times, ends))
}

/// The lamport stamps of a delta's events, from their gaps column in run
/// order: within a run, each the previous plus one plus its gap; a run's
/// first, a difference from the first of the run before (the delta's
/// first, its gap above 0).
#[derive(Default)]
struct Stamps {
    /// The previous event's stamp.
    lamport: u64,
    /// The first stamp of the current run.
    run_first: Option<u64>,
}

impl Stamps {
    /// The stamps of `more` events after the previous one in its run (none
    /// of them a run's first), each its previous plus one plus `gap`; on an
    /// overflow, `Err` with the index among them (from 0) of the first that
    /// overflows.
    fn rise(&mut self, gap: u64, more: u64) -> Result<(), u64> {
        let Some(step) = gap.checked_add(1) else {
            return Err(0);
        };
        // How many steps fit below u64::MAX.
        let fit = (u64::MAX - self.lamport) / step;
        if fit < more {
            return Err(fit);
        }
        self.lamport += step * more;
        Ok(())
    }

    /// The stamp of event `i` of its run from its gap; `None` outside
    /// `1..=u64::MAX` (an overflow, or a run's first stamp of 0).
    fn next(&mut self, gap: u64, i: u64) -> Option<u64> {
        self.lamport = match (i, self.run_first) {
            (0, Some(first)) => Some(undiff(gap, first)).filter(|&stamp| stamp > 0)?,
            _ => {
                let previous = if i == 0 { 0 } else { self.lamport };
                previous.checked_add(gap)?.checked_add(1)?
            }
        };
        if i == 0 {
            self.run_first = Some(self.lamport);
        }
        Some(self.lamport)
    }
}

/// Reads one column of `count` values, written in repeat and literal runs
/// (see [`Column`]), and refuses any other encoding of the same values.
struct ColumnReader {
    what: &'static str,
    /// Values not read yet.
    left: usize,
    /// Copies of `value` still to come in the current repeat.
    repeat: u64,
    /// Values still to read in the current literal run.
    literals: u64,
    /// The last value given, and how many times in a row.
    value: u64,
    in_a_row: u64,
    /// Whether the last run read was a literal one (the next must be a
    /// repeat).
    after_literals: bool,
}

impl ColumnReader {
    fn new(what: &'static str, count: usize) -> Self {
        Self {
            what,
            left: count,
            repeat: 0,
            literals: 0,
            value: 0,
            in_a_row: 0,
            after_literals: false,
        }
    }

    /// Reads the rest of the column, a repeat at a time and a literal value
    /// at a time, with the checks of [`ColumnReader::next`].
    fn skip_all(mut self, reader: &mut Reader<'_>) -> Result<(), FrameError> {
        while self.left > 0 {
            self.next(reader)?;
            self.left -= self.repeat as usize;
            self.in_a_row += self.repeat;
            self.repeat = 0;
        }
        Ok(())
    }

    /// Takes up to `max` more copies of the value [`ColumnReader::next`]
    /// last gave, if it is inside a repeat: how many it took.
    fn take_repeat(&mut self, max: u64) -> u64 {
        let taken = self.repeat.min(max);
        self.repeat -= taken;
        self.in_a_row += taken;
        self.left -= taken as usize;
        taken
    }

    /// The column's next value, reading the next run's header when the
    /// current run is used up. Called at most `count` times.
    #[inline(always)]
    fn next(&mut self, reader: &mut Reader<'_>) -> Result<u64, FrameError> {
        debug_assert!(self.left > 0, "read past the column's count");
        // Inside a repeat (a steady writer's whole column): no byte to read.
        if self.repeat > 0 {
            self.repeat -= 1;
            self.in_a_row += 1;
            self.left -= 1;
            return Ok(self.value);
        }
        self.next_read(reader)
    }

    /// [`ColumnReader::next`] where the value is read: a literal, or the
    /// first of a run whose header is read first.
    #[inline(never)]
    fn next_read(&mut self, reader: &mut Reader<'_>) -> Result<u64, FrameError> {
        if self.repeat == 0 && self.literals == 0 {
            let header = reader.varint(self.what)?;
            // Both at most 2^63 + 2: no overflow.
            let (count, literal) = if header % 2 == 0 {
                (header / 2 + REPEAT_MIN, false)
            } else {
                (header / 2 + 1, true)
            };
            if count > self.left as u64 {
                let kind = if literal { "literal" } else { "repeat" };
                return Err(Reader::malformed(
                    self.what,
                    &format!(
                        "a {kind} run of {count} where {} values are left",
                        self.left
                    ),
                ));
            }
            if literal {
                if self.after_literals {
                    return Err(Reader::malformed(
                        self.what,
                        "two literal runs in a row, not one",
                    ));
                }
                self.literals = count;
                self.after_literals = true;
            } else {
                let value = reader.varint(self.what)?;
                if self.in_a_row > 0 && value == self.value {
                    return Err(Reader::malformed(
                        self.what,
                        "a repeat of the value before it, not one longer run",
                    ));
                }
                self.value = value;
                self.in_a_row = 0;
                self.repeat = count;
                self.after_literals = false;
            }
        }
        if self.repeat > 0 {
            self.repeat -= 1;
            self.in_a_row += 1;
        } else {
            let value = reader.varint(self.what)?;
            if self.in_a_row > 0 && value == self.value {
                // A literal equal to the repeat before it, or a third equal
                // value in a row within a literal run.
                if self.in_a_row + 1 >= REPEAT_MIN {
                    return Err(Reader::malformed(
                        self.what,
                        "three equal values in a row in a literal run, or a literal equal to \
                         the repeat before it, not one repeat",
                    ));
                }
                self.in_a_row += 1;
            } else {
                self.value = value;
                self.in_a_row = 1;
            }
            self.literals -= 1;
        }
        self.left -= 1;
        Ok(self.value)
    }
}

/// Reads the hand-written part of a delta frame: shortest-form varints and
/// byte strings, every error a [`FrameError`] of the delta kind.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
}

impl Reader<'_> {
    pub(super) fn malformed(what: &str, problem: &str) -> FrameError {
        FrameError::Malformed {
            kind: "delta",
            detail: format!("{what}: {problem}"),
        }
    }

    /// The next varint; `what` names it in errors. Refuses a varint cut
    /// short, one above `u64::MAX`, and one not in its shortest form (a
    /// last byte of 0 after others), so that every value has one encoding.
    pub(super) fn varint(&mut self, what: &str) -> Result<u64, FrameError> {
        let mut value = 0u64;
        for (i, &byte) in self.bytes.iter().take(VARINT_BYTES_MAX).enumerate() {
            if i == VARINT_BYTES_MAX - 1 && byte > 1 {
                return Err(Self::malformed(what, "varint above u64::MAX"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                if byte == 0 && i > 0 {
                    return Err(Self::malformed(what, "varint not in its shortest form"));
                }
                self.bytes = &self.bytes[i + 1..];
                return Ok(value);
            }
        }
        // Every 10th byte returned above: the input ended first.
        Err(Self::malformed(what, "the frame ends inside a varint"))
    }
}

#[cfg(test)]
mod tests {
    // The event limit on both sides, what the layout refuses to write, the
    // ends of every range, shortest-form varints only, and interleaved
    // writers coming back in the order a replica sends them.
    use meshlog_cursor::VersionVector;
    use meshlog_replica::Delta;

    use super::*;
    use crate::frame::{decode, decode_payload, encode, Frame, LENGTH_PREFIX_BYTES};

    /// A trailer of nothing: bytes after the payloads are trailing bytes
    /// (as they were before protocol 4's sections).
    fn nothing_after(rest: &[u8], _runs: usize) -> Result<(), FrameError> {
        match rest.len() {
            0 => Ok(()),
            len => Err(FrameError::TrailingBytes { kind: "delta", len }),
        }
    }

    /// [`check_columns`] value by value, as it was before repeats were
    /// checked at once: the reference it must agree with.
    fn check_columns_one_by_one<'a>(
        columns: &'a [u8],
        runs: &[Run],
        count: usize,
    ) -> Result<(&'a [u8], &'a [u8]), FrameError> {
        let mut reader = Reader { bytes: columns };
        let mut gaps = ColumnReader::new("lamport gaps", count);
        let mut stamps = Stamps::default();
        for run in runs {
            for i in 0..run.len as u64 {
                let gap = gaps.next(&mut reader)?;
                stamps.next(gap, i).ok_or(FrameError::LamportOverflow {
                    stream: run.stream,
                    seq: run.first_seq + i,
                })?;
            }
        }
        ColumnReader::new("times", count).skip_all(&mut reader)?;
        let mut lens = ColumnReader::new("payload lengths", count);
        let mut total = 0u64;
        for _ in 0..count {
            total = total.saturating_add(lens.next(&mut reader)?);
            if total > reader.bytes.len() as u64 {
                return Err(FrameError::CountAboveBytes {
                    field: "payloads",
                    count: total,
                    bytes_left: reader.bytes.len(),
                });
            }
        }
        Ok(reader.bytes.split_at(total as usize))
    }

    /// Repeats checked at once decode, or fail with the very error, as the
    /// value-by-value check: over seeded deltas of long repeats (stamps
    /// near `u64::MAX`, payload lengths near the bytes left), each with
    /// bytes overwritten, cut or added.
    #[test]
    fn repeats_are_checked_at_once_as_value_by_value() {
        let seed = meshlog_testkit::seed::seeds(0x4e9e47, 1)[0];
        let mut rng = meshlog_testkit::SplitMix64::new(seed);
        let mut compared = 0;
        for _ in 0..20_000 {
            let mut events = Vec::new();
            for stream in 1..=1 + rng.below(3) {
                let len = 1 + rng.below(40);
                let gap = [0, 1, rng.below(1 << 20), u64::MAX / 64][rng.below(4) as usize];
                let mut lamport = [1, u64::MAX - 2_000, rng.below(1 << 40)][rng.below(3) as usize];
                let size = rng.below(6) as usize;
                for seq in 1..=len {
                    events.push(Event {
                        stream: StreamId::new(stream),
                        seq,
                        lamport,
                        time_ms: 7,
                        payload: Bytes::from(vec![1u8; size]),
                    });
                    lamport = match lamport.checked_add(gap + 1) {
                        Some(next) => next,
                        None => break,
                    };
                }
            }
            let mut bytes = Vec::new();
            if encode_events(&events, &mut bytes).is_err() {
                continue;
            }
            for _ in 0..rng.below(4) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = [0xff, 0x00, 0x7f, rng.next_u64() as u8][rng.below(4) as usize];
            }
            match rng.below(3) {
                0 => bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize),
                1 => bytes.extend((0..rng.below(4)).map(|_| 0xffu8)),
                _ => {}
            }
            let at_once = decode_events_checked_by(&bytes, check_columns, nothing_after)
                .map(|(events, ())| events);
            let one_by_one =
                decode_events_checked_by(&bytes, check_columns_one_by_one, nothing_after)
                    .map(|(events, ())| events);
            assert_eq!(at_once, one_by_one, "seed {seed}, bytes {bytes:02x?}");
            // Decoded into columns, the same events or the same error.
            let in_columns = decode_columns(&bytes, nothing_after)
                .map(|(columns, ())| columns.to_delta().events);
            assert_eq!(in_columns, at_once, "seed {seed}, bytes {bytes:02x?}");
            compared += 1;
        }
        assert!(compared > 10_000, "seed {seed}: {compared} compared");
    }

    fn tiny_events(count: usize) -> Vec<Event> {
        (1..=count as u64)
            .map(|seq| Event {
                stream: StreamId::new(1),
                seq,
                lamport: seq,
                time_ms: 0,
                payload: Bytes::new(),
            })
            .collect()
    }

    /// Found in review: a 4 MiB delta of minimal events decoded into about
    /// 800,000 events (50 to 100 MB) before anything checked their number.
    #[test]
    fn a_delta_of_more_events_than_the_limit_is_refused_before_decoding() {
        // Kind 1, number 1, an empty floor, the count, then a run (stream 1 from
        // seq 1) of 8193 events and each column one repeat (0, 8193 times):
        // 18 bytes that would decode into 8193 empty events.
        let mut payload = vec![1, 1, 0];
        let count = postcard::to_stdvec(&((DELTA_EVENTS_MAX + 1) as u64)).unwrap();
        let repeat = postcard::to_stdvec(&(2 * (DELTA_EVENTS_MAX as u64 + 1 - 3))).unwrap();
        payload.extend(&count);
        payload.extend([1, 1]);
        payload.extend(&count);
        for _ in 0..3 {
            payload.extend(&repeat);
            payload.push(0);
        }
        assert_eq!(payload.len(), 18);
        assert_eq!(
            decode_payload(&payload),
            Err(FrameError::TooManyEvents {
                count: DELTA_EVENTS_MAX + 1,
                max: DELTA_EVENTS_MAX
            })
        );
        // The count is read past a floor vector too.
        let mut payload = vec![1, 1, 2, 1, 4, 7, 2];
        payload.extend(postcard::to_stdvec(&((DELTA_EVENTS_MAX + 1) as u64)).unwrap());
        assert!(matches!(
            decode_payload(&payload),
            Err(FrameError::TooManyEvents { .. })
        ));
    }

    #[test]
    fn a_delta_at_the_event_limit_round_trips_and_one_above_is_not_encoded() {
        let at_limit = Frame::delta(
            1,
            Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: tiny_events(DELTA_EVENTS_MAX),
                seals: Vec::new(),
            },
        );
        let bytes = encode(&at_limit).unwrap();
        assert_eq!(decode(&bytes), Ok(at_limit));
        let above = Frame::delta(
            1,
            Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: tiny_events(DELTA_EVENTS_MAX + 1),
                seals: Vec::new(),
            },
        );
        assert_eq!(
            encode(&above),
            Err(FrameError::TooManyEvents {
                count: DELTA_EVENTS_MAX + 1,
                max: DELTA_EVENTS_MAX
            })
        );
    }

    /// The sender's side of the limit: a byte budget counts at least 50
    /// bytes per event, so the default budget cannot build a delta the
    /// receiver refuses; larger budgets are split by the session.
    #[test]
    fn the_default_budget_never_builds_a_delta_over_the_event_limit() {
        let mut replica = meshlog_replica::Replica::new(StreamId::new(1));
        for i in 0..(DELTA_EVENTS_MAX as u64 + 100) {
            replica.append_at(Bytes::new(), i).unwrap();
        }
        let budget = crate::SessionConfig::default().delta_bytes_max;
        let delta = replica.delta_for(&VersionVector::new(), budget);
        assert!(
            delta.events.len() <= DELTA_EVENTS_MAX,
            "{} events",
            delta.events.len()
        );
        assert_eq!(delta.events.len(), budget / 50);
    }

    fn event(stream: u64, seq: u64, lamport: u64, time_ms: u64) -> Event {
        Event {
            stream: StreamId::new(stream),
            seq,
            lamport,
            time_ms,
            payload: Bytes::from(format!("{stream}:{seq}")),
        }
    }

    fn delta_of(events: Vec<Event>) -> Frame {
        Frame::delta(
            1,
            Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events,
                seals: Vec::new(),
            },
        )
    }

    fn round_trip(frame: &Frame) -> Result<Frame, FrameError> {
        let bytes = encode(frame)?;
        decode(&bytes)
    }

    /// A delta's seqs are implied and its lamport stamps are gaps, so what
    /// breaks the model (and a receiver's replica would refuse) cannot be
    /// written: the encoder says so instead of sending something else.
    #[test]
    fn a_delta_the_layout_cannot_carry_is_not_encoded() {
        let cases = [
            (
                "a hole",
                vec![event(1, 1, 1, 0), event(1, 3, 2, 0)],
                "follows seq 1",
            ),
            (
                "seqs out of order",
                vec![event(1, 2, 2, 0), event(1, 1, 1, 0)],
                "follows seq 2",
            ),
            (
                "a seq twice",
                vec![event(1, 1, 1, 0), event(1, 1, 2, 0)],
                "follows seq 1",
            ),
            (
                "a lamport stamp repeated",
                vec![event(1, 1, 5, 0), event(1, 2, 5, 0)],
                "not above 5",
            ),
            (
                "a lamport stamp falling",
                vec![event(1, 1, 5, 0), event(1, 2, 4, 0)],
                "not above 5",
            ),
            (
                "a lamport stamp of 0",
                vec![event(2, 1, 1, 0), event(1, 1, 0, 0)],
                "stamp 0, not above 0",
            ),
            (
                "a seq past u64::MAX",
                vec![event(1, u64::MAX, 1, 0), event(1, 0, 2, 0)],
                "follows seq 18446744073709551615",
            ),
        ];
        for (name, events, says) in cases {
            match encode(&delta_of(events)) {
                Err(FrameError::Encode {
                    kind: "delta",
                    detail,
                }) => {
                    assert!(detail.contains(says), "{name}: {detail}");
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    /// The lamport field is the gap above the previous stamp in the run
    /// less one (above 0 for the first event), so a gap of 0 is the next
    /// stamp: no byte string can say that a stamp stands still or falls.
    #[test]
    fn a_lamport_gap_of_zero_is_the_next_stamp() {
        // Kind 1, number 1, no floor, 3 events: stream 5 from seq 1, gaps 0
        // twice then 4 (a literal run of 3), times 0 three times, lengths 0
        // three times (repeats of 3).
        let payload = [1, 1, 0, 3, 5, 1, 3, 5, 0, 0, 4, 0, 0, 0, 0];
        let Ok(Frame::Delta { delta, .. }) = decode_payload(&payload) else {
            panic!("{:?}", decode_payload(&payload));
        };
        let stamps: Vec<(u64, u64)> = delta.events.iter().map(|e| (e.seq, e.lamport)).collect();
        assert_eq!(stamps, [(1, 1), (2, 2), (3, 7)]);
    }

    /// The ends of every range: seqs up to `u64::MAX`, lamport stamps up
    /// to `u64::MAX`, and times that jump across the whole `u64` range
    /// (their differences wrap, so every step has an encoding: one of 2^63
    /// is `i64::MIN`).
    #[test]
    fn seqs_lamports_and_times_at_their_limits_round_trip() {
        let frame = delta_of(vec![
            event(u64::MAX, u64::MAX - 2, 1, 0),
            event(u64::MAX, u64::MAX - 1, 2, u64::MAX),
            event(u64::MAX, u64::MAX, u64::MAX, 0),
            event(0, 0, u64::MAX - 1, 1 << 63),
            event(0, 1, u64::MAX, 0),
        ]);
        let Frame::Delta { delta, .. } = &frame else {
            unreachable!()
        };
        let mut sorted = delta.events.clone();
        sorted.sort_by_key(|e| (e.stream, e.seq));
        assert_eq!(round_trip(&frame), Ok(delta_of(sorted)));
        // One event at seq u64::MAX, alone in its run.
        let frame = delta_of(vec![event(3, u64::MAX, u64::MAX, u64::MAX)]);
        assert_eq!(round_trip(&frame), Ok(frame));
    }

    #[test]
    fn zigzag_maps_small_magnitudes_to_small_numbers_and_back() {
        let pairs = [
            (0, 0),
            (-1, 1),
            (1, 2),
            (-2, 3),
            (i64::MAX, u64::MAX - 1),
            (i64::MIN, u64::MAX),
        ];
        for (signed, unsigned) in pairs {
            assert_eq!(zigzag(signed), unsigned);
            assert_eq!(unzigzag(unsigned), signed);
        }
    }

    /// Every value has one encoding: a varint longer than its shortest
    /// form, or above `u64::MAX`, is refused, so a delta that decodes
    /// re-encodes to the very bytes it came from.
    #[test]
    fn delta_varints_are_read_in_their_shortest_form_only() {
        let malformed = |payload: &[u8], says: &str| match decode_payload(payload) {
            Err(FrameError::Malformed {
                kind: "delta",
                detail,
            }) => {
                assert!(detail.contains(says), "{payload:?}: {detail}");
            }
            other => panic!("{payload:?}: {other:?}"),
        };
        // An empty delta whose count 0 is written in two bytes.
        malformed(
            &[1, 1, 0, 0x80, 0x00],
            "event count: varint not in its shortest form",
        );
        // Stream 1 written in two bytes.
        malformed(
            &[1, 1, 0, 1, 0x81, 0x00, 1, 1, 0, 1, 0, 1, 0, 1],
            "stream: varint not in its shortest form",
        );
        // A first seq of 2^64 (a 10th byte of 2), and of eleven bytes.
        let mut payload = vec![1, 1, 0, 1, 1];
        payload.extend([0x80; 9]);
        payload.extend([0x02, 1, 0, 1, 0, 1, 0, 1]);
        malformed(&payload, "first seq: varint above u64::MAX");
        let mut payload = vec![1, 1, 0, 1, 1];
        payload.extend([0xff; 10]);
        payload.extend([0x01, 1, 0, 1, 0, 1, 0, 1]);
        malformed(&payload, "first seq: varint above u64::MAX");
        // Cut inside the time column's first value, and a run header in two
        // bytes.
        malformed(
            &[1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0x80, 0x80],
            "times: the frame ends inside a varint",
        );
        malformed(
            &[1, 1, 0, 1, 1, 1, 1, 0x81, 0x00],
            "lamport gaps: varint not in its shortest form",
        );
        // The shortest forms of 0 and u64::MAX are fine.
        let mut payload = vec![1, 1, 0, 1, 1];
        payload.extend([0xff; 9]);
        payload.extend([0x01, 1, 1, 0, 1, 0, 1, 0]);
        let Ok(Frame::Delta { delta, .. }) = decode_payload(&payload) else {
            panic!("{:?}", decode_payload(&payload));
        };
        assert_eq!(
            (delta.events[0].seq, delta.events[0].lamport),
            (u64::MAX, 1)
        );
        let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
        bytes.extend(&payload);
        assert_eq!(encode(&Frame::delta(1, delta)), Ok(bytes));
    }

    /// A column has one encoding: a repeat of at least 3 equal values that
    /// differ from their neighbours, literal runs between repeats (never
    /// two in a row, never three equal values in a row), none past the
    /// values left; the payloads fill the frame exactly. Anything else is
    /// refused, naming the column.
    #[test]
    fn columns_are_read_in_their_one_encoding_only() {
        // Kind 1, number 1, no floor, `count` events of stream 4 from seq 1;
        // then the gaps, times and lengths columns and the payloads vary.
        let delta = |count: u8, columns: &[u8]| {
            let mut payload = vec![1, 1, 0, count, 4, 1, count];
            payload.extend(columns);
            decode_payload(&payload)
        };
        let malformed = |count: u8, columns: &[u8], says: &str| match delta(count, columns) {
            Err(FrameError::Malformed {
                kind: "delta",
                detail,
            }) => assert!(detail.contains(says), "{columns:?}: {detail}"),
            other => panic!("{columns:?}: {other:?}"),
        };
        malformed(
            2,
            &[0, 0],
            "lamport gaps: a repeat run of 3 where 2 values are left",
        );
        malformed(
            2,
            &[5, 0, 0, 0],
            "lamport gaps: a literal run of 3 where 2 values are left",
        );
        malformed(2, &[1, 0, 1, 0], "lamport gaps: two literal runs in a row");
        // Four events: a repeat of the literal value before it, a literal
        // equal to the repeat before it, three equal literals in a row.
        malformed(4, &[1, 0, 0, 0], "a repeat of the value before it");
        malformed(4, &[0, 0, 1, 0], "a literal equal to the repeat before it");
        malformed(4, &[7, 0, 0, 0, 1], "three equal values in a row");
        malformed(
            2,
            &[3, 0, 0, 3, 7, 0, 0, 0],
            "payload lengths: a repeat run of 3 where 2 values are left",
        );
        // Lengths 1 and 2 where 2 bytes are left, and where 4 are: the
        // byte after the payloads opens a section (tag 0x64), cut short.
        assert_eq!(
            delta(2, &[3, 0, 0, 3, 7, 0, 3, 1, 2, b'a', b'b']),
            Err(FrameError::CountAboveBytes {
                field: "payloads",
                count: 3,
                bytes_left: 2,
            })
        );
        assert_eq!(
            delta(2, &[3, 0, 0, 3, 7, 0, 3, 1, 2, b'a', b'b', b'c', b'd']),
            Err(FrameError::Malformed {
                kind: "delta",
                detail: "section length: the frame ends inside a varint".into()
            })
        );
        // The same, well formed: stamps 1 and 2, time 7 twice, "a" and "bc".
        let Ok(Frame::Delta { delta: well, .. }) =
            delta(2, &[3, 0, 0, 3, 7, 0, 3, 1, 2, b'a', b'b', b'c'])
        else {
            panic!()
        };
        let fields: Vec<(u64, u64, u64, &[u8])> = well
            .events
            .iter()
            .map(|e| (e.seq, e.lamport, e.time_ms, &e.payload[..]))
            .collect();
        assert_eq!(fields, [(1, 1, 7, &b"a"[..]), (2, 2, 7, &b"bc"[..])]);
        // Four events of one value: a repeat of 4 (header 2), and no other
        // way; the same four events re-encode to these bytes.
        let Ok(frame @ Frame::Delta { .. }) = delta(4, &[2, 0, 2, 7, 2, 0]) else {
            panic!("{:?}", delta(4, &[2, 0, 2, 7, 2, 0]))
        };
        assert_eq!(
            encode(&frame).unwrap()[LENGTH_PREFIX_BYTES..],
            [1, 1, 0, 4, 4, 1, 4, 2, 0, 2, 7, 2, 0]
        );
    }

    /// Every column value is one varint at most once a run: a run of one
    /// value costs its header and the value, a value that changes with
    /// every event one byte more than itself per event, not two.
    #[test]
    fn literal_runs_write_changing_values_once_each() {
        let mut out = Vec::new();
        let mut column = Column::default();
        for value in [5, 6, 6, 7, 0, 0, 0, 0, 9, 1] {
            column.push(value);
        }
        column.finish(&mut out);
        // Literals 5, 6, 6, 7 (header 7); a repeat of four 0s (header 2);
        // literals 9, 1 (header 3).
        assert_eq!(out, [7, 5, 6, 6, 7, 2, 0, 3, 9, 1]);
        let mut reader = Reader { bytes: &out };
        let mut column = ColumnReader::new("test", 10);
        let values: Vec<u64> = (0..10).map(|_| column.next(&mut reader).unwrap()).collect();
        assert_eq!(values, [5, 6, 6, 7, 0, 0, 0, 0, 9, 1]);
        assert!(reader.bytes.is_empty());
    }

    /// A run's first seq and first lamport stamp are differences from the
    /// run's before (modulo 2^64, zigzag): writers at about the same place
    /// cost a byte each for them, and a difference that comes to a stamp
    /// of 0 is refused.
    #[test]
    fn a_runs_first_seq_and_stamp_are_differences_from_the_run_before() {
        let frame = delta_of(vec![
            event(2, 300, 500, 0),
            event(3, 302, 499, 0),
            event(9, 1, 1, 0),
        ]);
        let bytes = encode(&frame).unwrap();
        // Count 3; runs (2, 300, 1), (3, +2 = 4, 1), (9, 1 − 302 = −301:
        // zigzag 601, 1); gaps a literal run of 499, then −1 (zigzag 1),
        // then −498 (zigzag 995); times a repeat of 0; lengths 5, 5, 3.
        assert_eq!(
            bytes[LENGTH_PREFIX_BYTES + 3..][..24],
            [
                3, 2, 0xac, 0x02, 1, 3, 4, 1, 9, 0xd9, 0x04, 1, 5, 0xf3, 0x03, 1, 0xe3, 0x07, 0, 0,
                5, 5, 5, 3
            ]
        );
        assert_eq!(decode(&bytes), Ok(frame));
        // A second run (stream 2 from seq 1 + 1, zigzag 2) whose first
        // stamp comes to 0: 1 − 1 (zigzag 1) after a first run at stamp 1.
        let payload = [1, 1, 0, 2, 1, 1, 1, 2, 2, 1, 3, 0, 1, 0, 0, 0, 0, 0];
        assert_eq!(
            decode_payload(&payload),
            Err(FrameError::LamportOverflow {
                stream: StreamId::new(2),
                seq: 2
            })
        );
    }

    /// What the columns are for: a writer's steady events cost a few bytes
    /// a delta besides their payloads, not a few bytes each.
    #[test]
    fn a_writers_steady_events_cost_a_few_bytes_a_delta() {
        let events: Vec<Event> = (1..=1000u64)
            .map(|seq| Event {
                stream: StreamId::new(0x5eed_cafe),
                seq,
                lamport: seq,
                time_ms: 1_750_000_000_000 + 10 * seq,
                payload: Bytes::from(vec![seq as u8; 32]),
            })
            .collect();
        let mut out = Vec::new();
        encode_events(&events, &mut out).unwrap();
        let overhead = out.len() - 32_000;
        // Count 2, run 5 + 1 + 2, gaps a repeat (2 + 1), times a literal
        // (1 + 6: the first time in full) and a repeat of the step (2 + 1),
        // lengths a repeat (2 + 1).
        assert_eq!(overhead, 26, "{out:02x?}");
        assert_eq!(decode_events(&out, nothing_after).unwrap().0, events);
    }

    /// A replica's delta interleaves its writers in `(lamport, stream)`
    /// order; the frame groups them by stream, and the receiver gets them
    /// grouped so, streams ascending, each stream's events in seq order,
    /// whatever order the sender's delta held them in (stream by stream
    /// backwards, say). A replica takes them in that order as it would in
    /// its own.
    #[test]
    fn interleaved_writers_arrive_grouped_by_stream() {
        let ids = [0x5eed_0001u64, 0x17, 0xffff_ffff, 3];
        let mut writers: Vec<meshlog_replica::Replica> = ids
            .iter()
            .map(|&id| meshlog_replica::Replica::new(StreamId::new(id)))
            .collect();
        let mut rng = meshlog_testkit::SplitMix64::new(0xf4a3e);
        for i in 0..400u64 {
            let w = rng.below(ids.len() as u64) as usize;
            // Wall clocks that step back now and then.
            let time_ms = 1_750_000_000_000 + i * 7 - rng.below(3) * 20;
            let payload = vec![i as u8; rng.below(40) as usize];
            writers[w].append_at(Bytes::from(payload), time_ms).unwrap();
            // Writers see each other's events now and then, so their
            // clocks interleave.
            if rng.below(3) == 0 {
                let target = rng.below(ids.len() as u64) as usize;
                let delta = writers[w].delta_for(&writers[target].marks(), usize::MAX);
                writers[target].apply(&delta).unwrap();
            }
        }
        for w in 1..writers.len() {
            let delta = writers[w].delta_for(&writers[0].marks(), usize::MAX);
            writers[0].apply(&delta).unwrap();
        }
        // In `(lamport, stream)` order, as a replica builds a delta its
        // budget cuts (a whole one comes stream by stream).
        let mut delta = writers[0].delta_for(&VersionVector::new(), usize::MAX);
        delta.events.sort_by_key(|e| (e.lamport, e.stream));
        assert_eq!(delta.events.len(), 400);
        let streams_switch = delta
            .events
            .windows(2)
            .filter(|pair| pair[0].stream != pair[1].stream)
            .count();
        assert!(streams_switch > 100, "{streams_switch} switches");
        let mut grouped = delta.events.clone();
        grouped.sort_by_key(|e| (e.stream, e.seq));
        let arrived = round_trip(&Frame::delta(1, delta.clone()));
        assert_eq!(arrived, Ok(delta_of(grouped.clone())));

        // Stream by stream, and backwards across streams.
        let mut by_stream = delta.events.clone();
        by_stream.sort_by_key(|e| std::cmp::Reverse(e.stream));
        assert_ne!(by_stream, delta.events);
        assert_eq!(round_trip(&delta_of(by_stream)), Ok(delta_of(grouped)));

        // Applied as it arrives, it leaves a replica as the sender's delta
        // in its own order does.
        let Ok(Frame::Delta { delta: arrived, .. }) = arrived else {
            unreachable!()
        };
        let mut in_order = meshlog_replica::Replica::new(StreamId::new(1));
        let mut grouped = meshlog_replica::Replica::new(StreamId::new(1));
        in_order.apply(&delta).unwrap();
        grouped.apply(&arrived).unwrap();
        assert_eq!(grouped.digest(), in_order.digest());
        assert_eq!(
            grouped.delta_for(&VersionVector::new(), usize::MAX),
            in_order.delta_for(&VersionVector::new(), usize::MAX)
        );
    }

    /// A sender encodes the delta it reads in columns
    /// (`delta_columns_for`): the frame is byte for byte the one the same
    /// delta as events makes, for every marks and budget (whole deltas, cut
    /// ones, with a floor, across sealed and open chunks).
    #[test]
    fn a_delta_read_in_columns_encodes_as_its_events_do() {
        use crate::frame::{encode_delta_columns_limited, FRAME_BYTES_MAX};
        use meshlog_replica::Replica;

        let seed = meshlog_testkit::seed::replay_or(0xc0_1a5);
        let mut rng = meshlog_testkit::SplitMix64::new(seed);
        let ids = [9u64, 2, 0x7fff_ffff, 40];
        let mut writers: Vec<Replica> = ids
            .iter()
            .map(|&id| Replica::new(StreamId::new(id)))
            .collect();
        let mut all = Replica::new(StreamId::new(1));
        for i in 0..1500u64 {
            let w = rng.below(ids.len() as u64) as usize;
            let time_ms = 1_750_000_000_000 + i * 3 - rng.below(2) * 10;
            let payload = vec![i as u8; rng.below(90) as usize];
            writers[w].append_at(Bytes::from(payload), time_ms).unwrap();
            if rng.below(4) == 0 {
                let target = rng.below(ids.len() as u64) as usize;
                let delta = writers[w].delta_for(&writers[target].marks(), usize::MAX);
                writers[target].apply(&delta).unwrap();
            }
            let delta = writers[w].delta_for(&all.marks(), usize::MAX);
            all.apply(&delta).unwrap();
        }
        // A floor on one stream, so some deltas carry it.
        let compact: VersionVector = [(StreamId::new(ids[0]), 20)].into_iter().collect();
        all.compact(&compact).unwrap();
        for number in 1..=300u64 {
            let their: VersionVector = ids
                .iter()
                .map(|&id| {
                    let head = all.marks().get(StreamId::new(id));
                    (StreamId::new(id), rng.below(head + 1))
                })
                .collect();
            let budget = rng.below(60_000) as usize;
            let columns = all.delta_columns_for(&their, budget);
            let events = all.delta_for(&their, budget);
            assert_eq!(
                encode_delta_columns_limited(number, &columns, FRAME_BYTES_MAX),
                encode(&Frame::delta(number, events)),
                "marks {their:?}, budget {budget}, seed {seed}"
            );
        }
    }
}
