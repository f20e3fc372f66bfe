//! A delta's events, written by hand: their count, one run header per
//! stream (streams ascending, each `stream, first seq, event count`), then
//! three run-length encoded columns over the events in run order (lamport
//! gaps, times, payload lengths) and the payloads back to back
//! (`docs/PROTOCOL.md`, "Delta events").
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
use meshlog_cursor::StreamId;
use meshlog_replica::Event;

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

/// Writes a delta's events after its floor (`docs/PROTOCOL.md`, "Delta
/// events"): their count; one run header per stream, streams ascending,
/// each `stream, first seq, event count`; then three columns over the
/// events in run order, each run-length encoded — lamport gaps, times,
/// payload lengths — and last the payloads back to back.
///
/// The seqs of a run are implied (`first + i`), so a stream's events must
/// be contiguous; a lamport stamp is written as its gap above the previous
/// one in the run less one (above 0 for the first), so it must rise from 1;
/// a time is the wrapping difference from the previous event's in the
/// column, zigzag-encoded (the first event's plain). What the layout cannot
/// carry is refused with [`FrameError::Encode`].
pub(super) fn encode_events(events: &[Event], out: &mut Vec<u8>) -> Result<(), FrameError> {
    let refuse = |detail: String| FrameError::Encode {
        kind: "delta",
        detail,
    };
    // Grouped by stream, each stream's events in the order given: a stable
    // sort. A replica's delta interleaves streams in `(lamport, stream)`
    // order; the receiver gets them grouped by stream.
    let mut by_stream: Vec<&Event> = events.iter().collect();
    by_stream.sort_by_key(|event| event.stream);
    put_varint(out, events.len() as u64);
    let mut gaps = Column::default();
    let mut times = Column::default();
    let mut lens = Column::default();
    let mut time_previous: Option<u64> = None;
    for run in by_stream.chunk_by(|a, b| a.stream == b.stream) {
        let first = run[0];
        put_varint(out, first.stream.get());
        put_varint(out, first.seq);
        put_varint(out, run.len() as u64);
        let mut seq_due = Some(first.seq);
        let mut lamport_previous = 0u64;
        for event in run {
            if seq_due != Some(event.seq) {
                return Err(refuse(format!(
                    "event {}:{} follows seq {} of its stream: a delta carries each \
                     stream's events contiguous and in seq order",
                    event.stream,
                    event.seq,
                    seq_due.map_or(u64::MAX, |due| due - 1),
                )));
            }
            if event.lamport <= lamport_previous {
                return Err(refuse(format!(
                    "event {}:{} has lamport stamp {}, not above {}: lamport stamps rise \
                     from 1 with seq",
                    event.stream, event.seq, event.lamport, lamport_previous
                )));
            }
            gaps.push(event.lamport - lamport_previous - 1);
            times.push(match time_previous {
                None => event.time_ms,
                Some(previous) => zigzag(event.time_ms.wrapping_sub(previous) as i64),
            });
            lens.push(event.payload.len() as u64);
            seq_due = event.seq.checked_add(1);
            lamport_previous = event.lamport;
            time_previous = Some(event.time_ms);
        }
    }
    gaps.finish(out);
    times.finish(out);
    lens.finish(out);
    for event in &by_stream {
        out.extend_from_slice(&event.payload);
    }
    Ok(())
}

/// A column being written: `(value, repeat)` pairs, each value differing
/// from the pair's before it, so every column has one encoding.
#[derive(Default)]
struct Column {
    pairs: Vec<(u64, u64)>,
}

impl Column {
    fn push(&mut self, value: u64) {
        match self.pairs.last_mut() {
            Some((last, repeat)) if *last == value => *repeat += 1,
            _ => self.pairs.push((value, 1)),
        }
    }

    fn finish(self, out: &mut Vec<u8>) {
        for (value, repeat) in self.pairs {
            put_varint(out, value);
            put_varint(out, repeat);
        }
    }
}

/// Reads a delta's events, written by [`encode_events`], to the end of the
/// payload.
///
/// Every count is checked before anything is decoded or allocated for what
/// it counts: the delta's against [`DELTA_EVENTS_MAX`] (so a delta decodes
/// into at most 8,192 events, 512 KiB, whatever its size), each run's
/// against what the delta's count leaves, each column's repeats against
/// the events left in it, and the payload lengths' sum against the bytes
/// left. Seqs, lamport stamps and their sums are checked for overflow.
/// Only canonical input decodes (shortest varints, one run per stream,
/// streams strictly ascending, no empty run, no repeat of 0, no two pairs
/// of a column with one value in a row, the payloads ending the frame), so
/// the frame re-encodes to the very bytes it came from.
///
/// Nothing is allocated for the events until the whole delta is known to
/// be well formed (the run headers read, the columns and payloads checked
/// in a first pass that allocates nothing): a malformed delta costs only
/// its run headers, however many events it claims. Then the events are
/// reserved once and the columns read again, and the payloads are copied
/// once, into one buffer that every event's payload is a slice of.
///
/// The events come out in run order: by stream, ascending, each stream's in
/// seq order (and so with rising lamport stamps). Receipt is order-free
/// across streams, and a receiver takes a stream's events as a run; putting
/// them back into `(lamport, stream)` order cost a third of a convergence's
/// time (`docs/BENCHMARKS.md`).
pub(super) fn decode_events(bytes: &[u8]) -> Result<Vec<Event>, FrameError> {
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
    // The columns and the payloads are checked whole before anything is
    // allocated for the events: a few bytes may stand for thousands of
    // events, but only in a delta that decodes.
    let payload_bytes = check_columns(reader.bytes, &runs, count)?;
    let mut events: Vec<Event> = Vec::with_capacity(count);
    let payloads = Bytes::copy_from_slice(payload_bytes);
    let mut start = 0;
    read_columns(reader.bytes, &runs, count, |run, i, fields| {
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
    Ok(events)
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
/// `count` events in the runs' order, and that the payloads after them fill
/// the rest exactly; returns the payloads. Allocates nothing.
fn check_columns<'a>(
    columns: &'a [u8],
    runs: &[Run],
    count: usize,
) -> Result<&'a [u8], FrameError> {
    let mut reader = Reader { bytes: columns };
    let mut gaps = ColumnReader::new("lamport gaps", count);
    for run in runs {
        let mut lamport = 0u64;
        for i in 0..run.len as u64 {
            let gap = gaps.next(&mut reader)?;
            lamport = lamport
                .checked_add(gap)
                .and_then(|sum| sum.checked_add(1))
                .ok_or(FrameError::LamportOverflow {
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
    let total = total as usize;
    if reader.bytes.len() > total {
        return Err(FrameError::TrailingBytes {
            kind: "delta",
            len: reader.bytes.len() - total,
        });
    }
    Ok(reader.bytes)
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
    for run in runs {
        let mut lamport = 0u64;
        for i in 0..run.len as u64 {
            // Checked by `check_columns`: no overflow.
            lamport += gaps.next(&mut gaps_reader)? + 1;
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

/// Reads one run-length encoded column of `count` values.
struct ColumnReader {
    what: &'static str,
    /// Values not read yet, the current pair's included.
    left: usize,
    /// The current pair's value, and how many times it is still to come.
    value: u64,
    repeat: u64,
    /// Whether a pair has been read (the next must differ from it).
    started: bool,
}

impl ColumnReader {
    fn new(what: &'static str, count: usize) -> Self {
        Self {
            what,
            left: count,
            value: 0,
            repeat: 0,
            started: false,
        }
    }

    /// Reads the rest of the column, pair by pair, with the checks of
    /// [`ColumnReader::next`].
    fn skip_all(mut self, reader: &mut Reader<'_>) -> Result<(), FrameError> {
        while self.left > 0 {
            self.next(reader)?;
            let repeat = self.repeat.min(self.left as u64);
            self.left -= repeat as usize;
            self.repeat -= repeat;
        }
        Ok(())
    }

    /// The column's next value, reading its next pair when the current one
    /// is used up. Called at most `count` times.
    fn next(&mut self, reader: &mut Reader<'_>) -> Result<u64, FrameError> {
        debug_assert!(self.left > 0, "read past the column's count");
        if self.repeat == 0 {
            let value = reader.varint(self.what)?;
            let repeat = reader.varint(self.what)?;
            if repeat == 0 {
                return Err(Reader::malformed(self.what, "a repeat of 0"));
            }
            if repeat > self.left as u64 {
                return Err(Reader::malformed(
                    self.what,
                    &format!("a repeat of {repeat} where {} events are left", self.left),
                ));
            }
            if self.started && value == self.value {
                return Err(Reader::malformed(
                    self.what,
                    "two pairs of one value in a row, not one pair",
                ));
            }
            self.value = value;
            self.repeat = repeat;
            self.started = true;
        }
        self.repeat -= 1;
        self.left -= 1;
        Ok(self.value)
    }
}

/// Reads the hand-written part of a delta frame: shortest-form varints and
/// byte strings, every error a [`FrameError`] of the delta kind.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn malformed(what: &str, problem: &str) -> FrameError {
        FrameError::Malformed {
            kind: "delta",
            detail: format!("{what}: {problem}"),
        }
    }

    /// The next varint; `what` names it in errors. Refuses a varint cut
    /// short, one above `u64::MAX`, and one not in its shortest form (a
    /// last byte of 0 after others), so that every value has one encoding.
    fn varint(&mut self, what: &str) -> Result<u64, FrameError> {
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
    use crate::frame::{decode, decode_payload, encode, Frame};

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
        // seq 1) of 8193 events and each column one pair (0 repeated 8193
        // times): 18 bytes that would decode into 8193 empty events.
        let mut payload = vec![1, 1, 0];
        let count = postcard::to_stdvec(&((DELTA_EVENTS_MAX + 1) as u64)).unwrap();
        payload.extend(&count);
        payload.extend([1, 1]);
        payload.extend(&count);
        for _ in 0..3 {
            payload.push(0);
            payload.extend(&count);
        }
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
                floor: VersionVector::new(),
                events: tiny_events(DELTA_EVENTS_MAX),
            },
        );
        let bytes = encode(&at_limit).unwrap();
        assert_eq!(decode(&bytes), Ok(at_limit));
        let above = Frame::delta(
            1,
            Delta {
                floor: VersionVector::new(),
                events: tiny_events(DELTA_EVENTS_MAX + 1),
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
                floor: VersionVector::new(),
                events,
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
        // twice then 4, times 0 three times, lengths 0 three times.
        let payload = [1, 1, 0, 3, 5, 1, 3, 0, 2, 4, 1, 0, 3, 0, 3];
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
        // Cut inside the time column's first value, and a repeat in two bytes.
        malformed(
            &[1, 1, 0, 1, 1, 1, 1, 0, 1, 0x80, 0x80],
            "times: the frame ends inside a varint",
        );
        malformed(
            &[1, 1, 0, 1, 1, 1, 1, 0, 0x81, 0x00],
            "lamport gaps: varint not in its shortest form",
        );
        // The shortest forms of 0 and u64::MAX are fine.
        let mut payload = vec![1, 1, 0, 1, 1];
        payload.extend([0xff; 9]);
        payload.extend([0x01, 1, 0, 1, 0, 1, 0, 1]);
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

    /// A column has one encoding: every repeat at least 1, none past the
    /// events left, no two pairs of one value in a row; the payloads fill
    /// the frame exactly. Anything else is refused, naming the column.
    #[test]
    fn columns_are_read_in_their_one_encoding_only() {
        // Kind 1, number 1, no floor, 2 events of stream 4 from seq 1; then
        // the gaps, times and lengths columns and the payloads vary.
        let delta = |columns: &[u8]| {
            let mut payload = vec![1, 1, 0, 2, 4, 1, 2];
            payload.extend(columns);
            decode_payload(&payload)
        };
        let malformed = |columns: &[u8], says: &str| match delta(columns) {
            Err(FrameError::Malformed {
                kind: "delta",
                detail,
            }) => assert!(detail.contains(says), "{columns:?}: {detail}"),
            other => panic!("{columns:?}: {other:?}"),
        };
        malformed(&[0, 0], "lamport gaps: a repeat of 0");
        malformed(
            &[0, 3],
            "lamport gaps: a repeat of 3 where 2 events are left",
        );
        malformed(
            &[0, 2, 7, 1, 7, 1],
            "times: two pairs of one value in a row",
        );
        malformed(
            &[0, 2, 7, 1, 8, 1, 1, 1, 1, 2],
            "payload lengths: a repeat of 2 where 1 events are left",
        );
        // Lengths 1 and 2 where 2 bytes are left, and where 4 are.
        assert_eq!(
            delta(&[0, 2, 7, 2, 1, 1, 2, 1, b'a', b'b']),
            Err(FrameError::CountAboveBytes {
                field: "payloads",
                count: 3,
                bytes_left: 2,
            })
        );
        assert_eq!(
            delta(&[0, 2, 7, 2, 1, 1, 2, 1, b'a', b'b', b'c', b'd']),
            Err(FrameError::TrailingBytes {
                kind: "delta",
                len: 1
            })
        );
        // The same, well formed: stamps 1 and 2, time 7 twice, "a" and "bc".
        let Ok(Frame::Delta { delta, .. }) =
            delta(&[0, 2, 7, 1, 0, 1, 1, 1, 2, 1, b'a', b'b', b'c'])
        else {
            panic!()
        };
        let fields: Vec<(u64, u64, u64, &[u8])> = delta
            .events
            .iter()
            .map(|e| (e.seq, e.lamport, e.time_ms, &e.payload[..]))
            .collect();
        assert_eq!(fields, [(1, 1, 7, &b"a"[..]), (2, 2, 7, &b"bc"[..])]);
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
        // Count 2, run 5 + 1 + 2, gaps 1 + 2, times 6 + 1 + 1 + 2 (the
        // first time in full, then the step), lengths 1 + 2.
        assert_eq!(overhead, 26, "{out:02x?}");
        assert_eq!(decode_events(&out).unwrap(), events);
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
        let mut rng = crate::rng::SplitMix64::new(0xf4a3e);
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
}
