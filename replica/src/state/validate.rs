//! Validation: whether a delta may be accepted against the state and the
//! requests planned before it in its round. Changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use meshlog_cursor::StreamId;

use super::{read_error, State};
use crate::log::StreamLog;
use crate::{Admission, Cut, Delta, DeltaColumns, DeltaError, Event, Limit, ReplicaError};

/// What the requests planned earlier in a round (group commit) changed,
/// as a later delta of the round must see it: with the state, what
/// applying them one by one would have left (`replica/tests/round_fold.rs`).
/// Filled by the planner as it folds the round.
#[derive(Debug, Default)]
pub(crate) struct RoundIndex {
    /// Events the round holds or keeps pending, by name (kept only while a
    /// later delta of the round may be checked against them).
    pub(super) events: BTreeMap<(StreamId, u64), Event>,
    /// Streams the round adds to the log.
    pub(super) new_streams: BTreeSet<StreamId>,
    /// Floors the round raises.
    pub(super) floors: BTreeMap<StreamId, u64>,
    /// The own stream's head, once the round moved it.
    pub(super) own_head: Option<u64>,
}

impl RoundIndex {
    fn floor(&self, stream: StreamId) -> u64 {
        self.floors.get(&stream).copied().unwrap_or(0)
    }

    fn lamport(&self, stream: StreamId, seq: u64) -> Option<u64> {
        self.events.get(&(stream, seq)).map(|event| event.lamport)
    }
}

impl State {
    /// Checks a delta against this state and the deltas accepted earlier in
    /// the same round, changing nothing.
    pub(crate) fn validate(&self, delta: &Delta, round: &RoundIndex) -> Result<(), ReplicaError> {
        self.validate_with(delta, round, true)
    }

    /// [`State::validate`]; `runs` lets clean runs be checked as runs
    /// (off only in the test that compares both ways).
    pub(super) fn validate_with(
        &self,
        delta: &Delta,
        round: &RoundIndex,
        runs: bool,
    ) -> Result<(), ReplicaError> {
        let own = self.config.stream;
        let own_head = round.own_head.unwrap_or_else(|| self.log.head(own));
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
            self.check_payload(stream, event.payload.len())?;
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
                .is_none_or(|other| other == event);
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
        new_streams.retain(|&stream| stream != own && !round.new_streams.contains(&stream));
        new_streams.sort_unstable();
        new_streams.dedup();
        self.check_streams(round, new_streams.len())
    }

    /// The payload limit, for appends and received events alike.
    pub(super) fn check_payload(&self, stream: StreamId, len: usize) -> Result<(), ReplicaError> {
        if len > self.config.payload_bytes_max {
            return Err(ReplicaError::PayloadTooLarge {
                stream,
                len,
                limit: self.config.payload_bytes_max,
            });
        }
        Ok(())
    }

    /// How many streams count toward `streams_max`: every stream held,
    /// those the round adds, and the own stream, whose slot is always
    /// reserved (see [`Config::streams_max`](crate::Config::streams_max)).
    pub(crate) fn streams_counted(&self, round: &RoundIndex) -> usize {
        let own = self.config.stream;
        let own_reserved = !self.log.has_stream(own) && !round.new_streams.contains(&own);
        self.log.stream_count() + round.new_streams.len() + usize::from(own_reserved)
    }

    /// The stream limit, for `new` streams a change would add (none held,
    /// none the round adds, not the own): refused beyond `streams_max`. A
    /// replica already beyond it (an operator lowered the limit) keeps
    /// what it holds and refuses only more.
    pub(super) fn check_streams(&self, round: &RoundIndex, new: usize) -> Result<(), ReplicaError> {
        self.check_streams_from(self.streams_counted(round), new)
    }

    /// [`State::check_streams`] from `counted` streams.
    fn check_streams_from(&self, counted: usize, new: usize) -> Result<(), ReplicaError> {
        let streams = counted + new;
        if new > 0 && streams > self.config.streams_max {
            return Err(ReplicaError::TooManyStreams {
                streams,
                limit: self.config.streams_max,
            });
        }
        Ok(())
    }

    /// How much of `columns` the limits take: the streams that fit (as
    /// [`State::check_streams`] counts them, in the delta's order) and,
    /// per stream, the events up to the first payload over the limit (as
    /// [`State::check_payload`] judges it). What apply would refuse for a
    /// limit is cut; nothing else is judged.
    pub(crate) fn admission(&self, columns: &DeltaColumns) -> Admission {
        let own = self.config.stream;
        let mut counted = self.streams_counted(&RoundIndex::default());
        let mut admitted: BTreeSet<StreamId> = BTreeSet::new();
        let mut cuts: BTreeMap<StreamId, Cut> = BTreeMap::new();
        let mut admit = |stream: StreamId, from_seq: u64, cuts: &mut BTreeMap<StreamId, Cut>| {
            let new = stream != own && !self.log.has_stream(stream) && admitted.insert(stream);
            if new && self.check_streams_from(counted, 1).is_err() {
                let limit = Limit::StreamsMax {
                    limit: self.config.streams_max,
                };
                cuts.insert(
                    stream,
                    Cut {
                        stream,
                        from_seq,
                        limit,
                    },
                );
                return false;
            }
            counted += usize::from(new);
            true
        };
        for (stream, _) in columns.floor.iter() {
            admit(stream, 0, &mut cuts);
        }
        let mut index = 0;
        for run in columns.runs() {
            let (stream, first_index) = (run.stream, index);
            index += run.len;
            if cuts.contains_key(&stream) || !admit(stream, run.first_seq, &mut cuts) {
                continue;
            }
            let over = (0..run.len).find_map(|i| {
                let len = columns.payload(first_index + i).len();
                self.check_payload(stream, len).err().map(|_| (i, len))
            });
            if let Some((i, len)) = over {
                let limit = Limit::PayloadBytesMax {
                    len,
                    limit: self.config.payload_bytes_max,
                };
                let from_seq = run.first_seq + i as u64;
                cuts.insert(
                    stream,
                    Cut {
                        stream,
                        from_seq,
                        limit,
                    },
                );
            }
        }
        Admission {
            cuts: cuts.into_values().collect(),
        }
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
pub(super) fn sorted_by_name(events: &[Event]) -> Vec<&Event> {
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
