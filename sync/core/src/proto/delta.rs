//! Deltas: what to send and when (the send delay, the in-flight window),
//! how it is sized and split into frames, what is cut because a frame
//! cannot carry it; and a received delta, handed back to apply.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Instant;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, DeltaColumns};

use crate::frame::{self, DELTA_EVENTS_MAX};
use crate::{LimitHit, ProtocolError};

use super::seals::{cut_streams, split_delta};
use super::state::{InFlight, LocalReplica, Outgoing, Protocol, Received};
use super::view::{advance_by_spans, column_spans, skip_pending, walk};

impl Protocol {
    /// Builds the next delta to send, in parts of one frame each, if the
    /// view does not cover our marks and nothing holds it back (too many
    /// deltas in flight, a send delay); or the replica's error where
    /// reading what to send failed ([`ProtocolError::Read`]: nothing is
    /// sent in its place).
    pub(super) fn plan_delta<L: LocalReplica>(
        &mut self,
        now: Instant,
        local: &L,
    ) -> Result<Planned, ProtocolError> {
        if self.send.in_flight.len() >= IN_FLIGHT_MAX {
            // Wait for receipts (or the retransmission timeout).
            return Ok(Planned::Nothing);
        }
        let marks = local.marks();
        skip_pending(&mut self.send.view, &self.send.peer_pending);
        if let Some(part) = self.forks_part(local) {
            self.send.parts.push_back(part);
            return Ok(Planned::Parts);
        }
        if self.send_view_covers(&marks) {
            self.send.hold_until = None;
            return Ok(Planned::Nothing);
        }
        if let Some(until) = self.send_held_until(now) {
            // Nagle's rule: a small delta is in flight, so what is new
            // waits to go with what follows it, for at most the send
            // delay (the peer's ack, retiring it, ends the wait sooner).
            self.send.hold_until = Some(until);
            return Ok(Planned::Nothing);
        }
        self.send.hold_until = None;
        let Some(parts) = self.delta_parts(local, &marks)? else {
            return Ok(Planned::Again);
        };
        if parts
            .iter()
            .all(|part| part.is_empty() && part.floor.is_empty())
        {
            // The marks ran ahead of a compaction; nothing to send.
            return Ok(Planned::Nothing);
        }
        let mut bytes = 0;
        for part in &parts {
            advance_by_spans(&mut self.send.view, &part.floor, &column_spans(part));
            bytes += part.size_hint();
        }
        self.send.last_delta_full = bytes >= self.config.delta_budget() / 2;
        self.send.last_delta_at = Some(now);
        self.send.parts.extend(parts);
        Ok(Planned::Parts)
    }

    /// What the peer misses, read in columns and sent as read, unless an
    /// event is too large for a frame, a stream runs into what the peer
    /// holds pending, or it needs more than one frame: then it is cut and
    /// split as events, each seal kept with its run (`seals`). `None` if
    /// only events too large for a frame were read (their streams are now
    /// cut: read again). The replica's error where the read failed.
    pub(super) fn delta_parts<L: LocalReplica>(
        &mut self,
        local: &L,
        marks: &VersionVector,
    ) -> Result<Option<Vec<DeltaColumns>>, ProtocolError> {
        let mut budget = self.config.delta_budget();
        loop {
            let view = self.send_view(marks);
            let mut columns = local
                .try_delta_columns_for(&view, budget)
                .map_err(|source| ProtocolError::Read {
                    peer: self.hello.peer.unwrap_or(self.local),
                    source,
                })?;
            floors_with_runs(&mut columns, marks);
            let payload_max = self.frame_payload_max(&columns.floor);
            let pending = self.pending_cuts(&view, &columns);
            let as_read = columns.len() <= DELTA_EVENTS_MAX
                && columns.payload_len_max() <= payload_max
                && !columns.runs().iter().any(|run| {
                    pending
                        .get(&run.stream)
                        .is_some_and(|&from| run.last_seq() >= from)
                });
            drop(view);
            if as_read {
                return Ok(Some(vec![columns]));
            }
            let mut delta = columns.to_delta();
            if self.cut_unsendable(&mut delta) && delta.events.is_empty() && delta.floor.is_empty()
            {
                return Ok(None);
            }
            // A hole below what the peer holds pending is sent up to the
            // pending events, not through them.
            cut_streams(&mut delta, &pending);
            match split_delta(delta) {
                Ok(parts) => return Ok(Some(parts.iter().map(DeltaColumns::from_delta).collect())),
                Err(_) if budget > ONE_FRAME_BUDGET => {
                    // A sealed run longer than a frame carries: read again
                    // under a budget that fits one frame, in which the
                    // replica ends each run where it holds a seal.
                    budget = ONE_FRAME_BUDGET;
                }
                // Not reached: a delta read under ONE_FRAME_BUDGET holds at
                // most DELTA_EVENTS_MAX events. Sent whole, its frame is
                // refused by the encoder, which ends the session.
                Err(delta) => return Ok(Some(vec![DeltaColumns::from_delta(&delta)])),
            }
        }
    }

    /// Per stream of `columns` with a hole below events the peer holds
    /// pending (as `view` sees it), the first pending seq: the stream is
    /// sent up to it. Not for a stream the delta seals: a sealed run is
    /// sent whole (cut, it would go without its seal), and the peer holds
    /// nothing of such a stream pending anyway (a receiver drops an early
    /// run of a sealed stream: `docs/SIGNING.md`).
    fn pending_cuts(
        &self,
        view: &VersionVector,
        columns: &DeltaColumns,
    ) -> BTreeMap<StreamId, u64> {
        let mut cuts: BTreeMap<StreamId, u64> = BTreeMap::new();
        for range in &self.send.peer_pending {
            let sealed = columns.seals.iter().any(|s| s.seal.stream == range.stream);
            if view.get(range.stream) + 1 < range.from && !sealed {
                let from = cuts.entry(range.stream).or_insert(range.from);
                *from = (*from).min(range.from);
            }
        }
        cuts
    }

    /// The next part of the planned delta, numbered and recorded as in
    /// flight.
    pub(super) fn next_delta_part(&mut self, now: Instant) -> Option<Outgoing> {
        let part = self.send.parts.pop_front()?;
        let number = self.send.next_delta_number;
        self.send.next_delta_number += 1;
        let spans = column_spans(&part);
        let mut advance = VersionVector::new();
        advance_by_spans(&mut advance, &part.floor, &spans);
        let first: VersionVector = spans
            .iter()
            .map(|&(stream, first, _)| (stream, first))
            .collect();
        self.send.in_flight.push_back(InFlight {
            number,
            sent_at: now,
            advance,
            first,
        });
        Some(Outgoing::Delta {
            number,
            columns: part,
        })
    }

    /// The largest frame payload we send: the smaller of our limit and
    /// the peer's (from its hello; the default before it arrives).
    pub(super) fn send_limit(&self) -> usize {
        self.config
            .frame_limit()
            .min(self.hello.peer_frame_bytes_max)
    }

    /// The largest payload that fits a frame we send with a delta's
    /// `floor` (whatever else the frame holds).
    pub(super) fn frame_payload_max(&self, floor: &VersionVector) -> usize {
        // The floor, and what backs it (statements and hashes).
        let floor_bytes =
            frame::vector_bytes_max(floor) + frame::floor_proofs_bytes_max(floor.len());
        self.send_limit()
            .saturating_sub(floor_bytes + EVENT_FRAME_OVERHEAD_MAX)
    }

    /// Cuts from a delta to send every event too large for a frame (with
    /// the delta's floor), and what follows it in its stream (and, if the
    /// stream is sealed, what precedes it in the delta: no seal vouches
    /// for it): that stream is not sent to this peer past it in this
    /// session, reported ([`LimitHit::FrameBytesMax`]) and logged once.
    /// Whether anything was cut.
    pub(super) fn cut_unsendable(&mut self, delta: &mut Delta) -> bool {
        let limit = self.send_limit();
        let payload_max = self.frame_payload_max(&delta.floor);
        let mut cut: BTreeMap<StreamId, u64> = BTreeMap::new();
        for event in &delta.events {
            if event.payload.len() > payload_max && !cut.contains_key(&event.stream) {
                cut.insert(event.stream, event.seq);
            }
        }
        if cut.is_empty() {
            return false;
        }
        let peer = self.hello.peer.unwrap_or(self.local);
        for (&stream, &seq) in &cut {
            let len = delta
                .events
                .iter()
                .find(|event| event.stream == stream && event.seq == seq)
                .map_or(0, |event| event.payload.len());
            tracing::warn!(
                %peer,
                %stream,
                seq,
                len,
                limit,
                ours = self.config.frame_limit(),
                theirs = self.hello.peer_frame_bytes_max,
                "event not sent: with its frame it exceeds the frame limit of {limit} bytes \
                 (the smaller of this side's frame_bytes_max and the peer's; under the default \
                 4 MiB at most 3,866,401 bytes of payload always fit): the stream is not sent \
                 to this peer past it; raise frame_bytes_max on both sides"
            );
            self.send.unsendable.insert(stream, seq);
            self.state.limits.push(LimitHit::FrameBytesMax {
                stream,
                seq,
                len,
                limit,
            });
        }
        self.state.events_over_limit += cut_streams(delta, &cut);
        self.state_changed = true;
        true
    }

    /// Until when new events wait for a fuller delta, if they do: while a
    /// delta is in flight and the last one sent was small, up to the send
    /// delay after it (see [`SessionConfig::send_delay`]).
    pub(super) fn send_held_until(&self, now: Instant) -> Option<Instant> {
        if self.send.in_flight.is_empty() || self.send.last_delta_full {
            return None;
        }
        let until = self.send.last_delta_at? + self.config.send_delay;
        (now < until).then_some(until)
    }

    /// A delta from the peer: noted as held by the peer (never echoed
    /// back), cut to what the replica's limits take ([`Protocol::admit`]),
    /// its streams routed, and handed back to apply.
    pub(super) fn on_delta<L: LocalReplica>(
        &mut self,
        now: Instant,
        number: u64,
        columns: DeltaColumns,
        local: &L,
    ) -> Received {
        if number > self.acks.received + 1 {
            // A hole: the deltas between were lost (or are late).
            // The ack that follows shows it to the sender at once.
            self.acks.hole_seen = true;
            tracing::debug!(
                number,
                received = self.acks.received,
                "delta frames missing before this one"
            );
        }
        // The peer holds what it sent (each stream is a prefix):
        // never echo it back. Advanced before the apply: if the
        // apply fails, the session ends and the view with it.
        let mut columns = columns;
        self.admit(&mut columns, local);
        let mut advance = VersionVector::new();
        advance_by_spans(&mut advance, &columns.floor, &column_spans(&columns));
        self.send.view.join(&advance);
        self.marks.peer_marks.join(&advance);
        self.marks.carried.join(&advance);
        // The peer holds its floors: none of our statements at or below
        // them is owed to it.
        self.send.statements_told.join(&columns.floor);
        if self.routing.link.is_some() {
            let streams: BTreeSet<StreamId> = columns.runs().iter().map(|run| run.stream).collect();
            self.route_received(now, &streams);
        }
        self.acks.applying = Some(number);
        Received::Apply(columns)
    }
}

/// Keeps in `columns`' floor (and what backs it) only the streams it
/// carries a run of, or that hold nothing above the floor here (`marks`):
/// a stream's floor goes with its first run, which starts right after it.
/// A receiver that knows the stream is keyed takes an unsigned floor only
/// with the writer's sealed run from it in the same delta
/// (`State::floor_needs_authority`): a floor sent ahead of its run (the
/// budget read other streams first) left such a receiver behind it, and
/// the stream quiet on this link. The view is not advanced past a floor
/// not sent, so it goes with the delta that carries the run.
fn floors_with_runs(columns: &mut DeltaColumns, marks: &VersionVector) {
    if columns.floor.is_empty() {
        return;
    }
    let runs: HashSet<StreamId> = columns.runs().iter().map(|run| run.stream).collect();
    let mut held = walk(marks);
    let floor: VersionVector = columns
        .floor
        .iter()
        .filter(|&(stream, floor)| runs.contains(&stream) || held.at(stream) <= floor)
        .collect();
    if floor.len() == columns.floor.len() {
        return;
    }
    columns.floor_proofs.retain(|stream| floor.get(stream) > 0);
    columns.floor = floor;
}

/// The most bytes a delta frame takes besides one event's payload and its
/// floor: the kind, the number, the event count, a run's header and the
/// event's literal run of one (a header byte, then the value) in each
/// column, every varint at its longest (1 + 10 + 2 + 22 + 27 = 62), and
/// the run's seal with its base in the seals section (181).
pub(super) const EVENT_FRAME_OVERHEAD_MAX: usize = 62 + frame::ONE_RUN_SECTIONS_BYTES_MAX;

/// The most delta frames in flight (sent, not acknowledged) at once: past
/// it, no new delta is built until a receipt (or the retransmission
/// timeout) retires some.
pub(super) const IN_FLIGHT_MAX: usize = 256;

/// What planning a delta came to.
pub(super) enum Planned {
    /// Parts to send are queued.
    Parts,
    /// Nothing to send now.
    Nothing,
    /// Only events too large for a frame were read: plan again without
    /// their streams.
    Again,
}

/// A budget under which a delta holds at most [`DELTA_EVENTS_MAX`] events,
/// so it goes in one frame: a replica counts at least 50 bytes an event
/// ([`meshlog_replica::Event::size_hint`]). What a delta is read again under when a sealed
/// run is too long to split.
pub(super) const ONE_FRAME_BUDGET: usize = DELTA_EVENTS_MAX * 50;

#[cfg(test)]
mod tests {
    use meshlog_replica::Event;

    use super::*;

    /// The bound rests on the replica's count of an
    /// event's bytes; if that count shrank, a delta read under the budget
    /// could need more than one frame again.
    #[test]
    fn a_delta_read_under_the_one_frame_budget_fits_one_frame() {
        let empty = Event {
            stream: StreamId::new(1),
            seq: 1,
            lamport: 1,
            time_ms: 0,
            payload: bytes::Bytes::new(),
        };
        assert!(ONE_FRAME_BUDGET / empty.size_hint() <= DELTA_EVENTS_MAX);
    }
}
