//! Planning: the operations and the store batch a change makes, simulated
//! on an overlay of the state. Changes nothing.

use std::collections::BTreeMap;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};

use super::State;
use crate::log::StreamLog;
use crate::{ApplyReport, Batch, CompactReport, Delta, DeltaColumns, Event, ReplicaError};

/// Where an event of a plan comes from, which decides what publishing it
/// does besides holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// A peer's event at its stream's head + 1.
    Received,
    /// An early event released from the pending buffer.
    Released,
    /// A local append.
    Appended,
}

#[derive(Debug)]
pub(super) enum Op {
    /// Raise a floor: `batch.floors[i]`.
    Floor(usize),
    /// Hold a run of events, consecutive seqs of one stream from its head
    /// + 1: the batch's run `run`.
    Events { run: usize, source: Source },
    /// Keep an early event in the pending buffer (memory only).
    Hold(Event),
}

/// A planned change: what to commit, and what to do to the state once
/// committed. It borrows the received events from their deltas.
#[derive(Debug, Default)]
pub(crate) struct Plan<'d> {
    /// What the store commits (possibly empty: a change of the pending
    /// buffer alone, or counters).
    pub(crate) batch: Batch<'d>,
    pub(super) ops: Vec<Op>,
    /// One report per planned delta, in order.
    pub(crate) reports: Vec<ApplyReport>,
    /// Per local append request, the batch's run of its events, or why it
    /// was refused.
    pub(crate) appended: Vec<Result<usize, ReplicaError>>,
    compacted: Option<CompactReport>,
    /// Deltas refused in the round, for the counters.
    pub(crate) refused: u64,
    /// Pair assertions: what publishing must lead to.
    pub(super) pending_len_after: usize,
    pub(super) heads_after: Vec<(StreamId, u64)>,
}

impl Plan<'_> {
    /// Whether publishing changes anything the store does not hold (the
    /// pending buffer or counters) or the store must commit.
    pub(crate) fn is_noop(&self) -> bool {
        self.ops.is_empty()
            && self.refused == 0
            && self
                .reports
                .iter()
                .all(|report| *report == ApplyReport::default())
    }

    /// The events of the local append request whose batch run is `run`
    /// (from [`Plan::appended`]), taken out of the plan once it is
    /// committed and published (moved, not copied).
    pub(crate) fn take_appended(&mut self, run: usize) -> Vec<Event> {
        self.batch.take_run(run)
    }

    /// The compaction report of a compaction plan.
    pub(crate) fn compact_report(&self) -> CompactReport {
        self.compacted.unwrap_or_default()
    }
}

/// One local append request of a round.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AppendRequest<'a> {
    pub(crate) payloads: &'a [Bytes],
    pub(crate) time_ms: u64,
}

/// A stream as a plan sees it: the state's, with the plan's changes so far.
struct SimStream<'s, 'd> {
    log: Option<&'s StreamLog>,
    floor: u64,
    head: u64,
    /// Early events the plan holds back.
    added: BTreeMap<u64, &'d Event>,
}

impl State {
    /// Plans a round: validated `deltas` (floors first, then their events in
    /// order), then local `appends`, stamped above everything the deltas
    /// make visible. Changes nothing.
    ///
    /// The resulting state is the one applying the deltas one by one, then
    /// the appends, would give (`replica/tests/shared_rounds.rs`), with one
    /// difference: an event a later delta's floor drops is never received,
    /// so it does not move the clock, where one by one it would have. The
    /// clock stays at or above every stamp held, which is all it promises.
    pub(crate) fn plan_round<'d>(
        &self,
        deltas: &[&'d Delta],
        appends: &[AppendRequest],
    ) -> Plan<'d> {
        let own = self.config.stream;
        let mut plan = Plan {
            reports: vec![ApplyReport::default(); deltas.len()],
            ..Plan::default()
        };
        let mut sims: BTreeMap<StreamId, SimStream<'_, 'd>> = BTreeMap::new();
        let mut pending_len = self.pending_len;
        let mut clock = self.clock;

        // Floors first, each stream's highest: the store deletes below the
        // floors before it adds the round's events, so the plan must too.
        let mut floors: BTreeMap<StreamId, (u64, usize)> = BTreeMap::new();
        for (index, delta) in deltas.iter().enumerate() {
            for (stream, floor_seq) in delta.floor.iter() {
                // A peer never compacts this replica's own stream (validated
                // not to pass its head): its own events are its to keep.
                if stream == own && !self.recovering {
                    continue;
                }
                let entry = floors.entry(stream).or_insert((floor_seq, index));
                if floor_seq > entry.0 {
                    *entry = (floor_seq, index);
                }
            }
        }
        for (stream, (floor_seq, index)) in floors {
            let sim = self.sim(&mut sims, stream);
            if floor_seq <= sim.floor {
                continue;
            }
            let discarded = sim.log.map_or(0, |log| match sim.head.checked_add(1) {
                Some(first) => log.early_count_in(first..=floor_seq),
                None => 0,
            });
            pending_len -= discarded;
            sim.floor = floor_seq;
            sim.head = sim.head.max(floor_seq);
            plan.batch.floors.push((stream, floor_seq));
            plan.ops.push(Op::Floor(plan.batch.floors.len() - 1));
            plan.reports[index].floors_raised += 1;
            let report = &mut plan.reports[index];
            release(
                stream,
                sim,
                &mut plan.batch,
                &mut plan.ops,
                report,
                &mut pending_len,
                &mut clock,
            );
        }

        for (index, delta) in deltas.iter().enumerate() {
            let mut position = 0;
            while let Some(event) = delta.events.get(position) {
                let stream = event.stream;
                let sim = self.sim(&mut sims, stream);
                let report = &mut plan.reports[index];
                let no_early = sim.added.is_empty() && sim.log.is_none_or(StreamLog::has_no_early);
                if no_early && Some(event.seq) == sim.head.checked_add(1) {
                    // A run extending the head, with nothing pending to
                    // release: held as one operation (validated, so its
                    // stamps rise).
                    let len = delta.events[position..]
                        .iter()
                        .enumerate()
                        .take_while(|(i, next)| {
                            next.stream == stream
                                && Some(next.seq) == event.seq.checked_add(*i as u64)
                        })
                        .count();
                    let run = &delta.events[position..position + len];
                    let last = &run[len - 1];
                    sim.head = last.seq;
                    clock = clock.max(last.lamport);
                    let run = plan.batch.add_events(run);
                    plan.ops.push(Op::Events {
                        run,
                        source: Source::Received,
                    });
                    report.applied += len as u64;
                    position += len;
                    continue;
                }
                position += 1;
                let pending = sim.added.contains_key(&event.seq)
                    || sim.log.is_some_and(|log| log.early(event.seq).is_some());
                if event.seq <= sim.floor {
                    report.below_floor += 1;
                } else if event.seq <= sim.head || pending {
                    report.duplicates += 1;
                } else if Some(event.seq) == sim.head.checked_add(1) {
                    sim.head = event.seq;
                    clock = clock.max(event.lamport);
                    let run = plan.batch.add_events(&delta.events[position - 1..position]);
                    plan.ops.push(Op::Events {
                        run,
                        source: Source::Received,
                    });
                    report.applied += 1;
                    release(
                        stream,
                        sim,
                        &mut plan.batch,
                        &mut plan.ops,
                        report,
                        &mut pending_len,
                        &mut clock,
                    );
                } else if pending_len < self.config.pending_events_max {
                    sim.added.insert(event.seq, event);
                    plan.ops.push(Op::Hold(event.clone()));
                    pending_len += 1;
                    report.pending += 1;
                } else {
                    report.dropped += 1;
                }
            }
        }

        let mut own_head = self.sim(&mut sims, own).head;
        self.plan_appends(
            appends,
            &mut own_head,
            &mut clock,
            &mut plan,
            &mut pending_len,
        );
        self.sim(&mut sims, own).head = own_head;
        plan.batch.clock = clock;
        plan.pending_len_after = pending_len;
        plan.heads_after = sims
            .iter()
            .map(|(&stream, sim)| (stream, sim.head))
            .collect();
        plan
    }

    /// Plans a round of deltas in columns as columns, then `appends` (as
    /// [`State::plan_round`] plans them), if every delta is *clean*: no
    /// floor, one run per stream, streams ascending, none this replica's
    /// own, each run from its stream's head + 1 (as the deltas before it
    /// in the round leave it) with nothing pending in the stream, stamps
    /// rising above the head's up to `LAMPORT_MAX`, payloads within the
    /// limit, and room for the new streams. Those are deltas the event
    /// path takes whole, each run as one operation, and plans alike
    /// ([`State::clean_run`], [`State::plan_round`]). Anything else is
    /// `None`: the caller plans the round as events, which validate each
    /// delta and say why it is refused, if it is. So is every round on a
    /// store on disk, which commits events (it would make them from the
    /// columns, a copy more than making them over a delta's own payloads).
    /// Changes nothing.
    pub(crate) fn plan_columns<'d>(
        &self,
        deltas: &[&'d DeltaColumns],
        appends: &[AppendRequest],
    ) -> Option<Plan<'d>> {
        if !self.log.is_in_memory() {
            return None;
        }
        let mut plan = Plan {
            reports: vec![ApplyReport::default(); deltas.len()],
            ..Plan::default()
        };
        let mut clock = self.clock;
        // Per stream the round touched: its head and the head's stamp, as
        // the round's runs so far leave them.
        let mut heads: BTreeMap<StreamId, (u64, u64)> = BTreeMap::new();
        let mut new_streams = 0usize;
        for (index, columns) in deltas.iter().enumerate() {
            if !columns.floor.is_empty() {
                return None;
            }
            let mut previous: Option<StreamId> = None;
            for run in columns.run_parts() {
                let stream = run.stream;
                if stream == self.config.stream || previous.is_some_and(|before| before >= stream) {
                    return None;
                }
                previous = Some(stream);
                let log = self.log.stream(stream);
                if log.is_some_and(|log| !log.has_no_early()) {
                    return None;
                }
                let floor_seq = self.floor.get(stream);
                let (head, head_lamport) = match heads.get(&stream) {
                    Some(&planned) => planned,
                    None => {
                        new_streams += usize::from(log.is_none());
                        let head = log.map_or(0, StreamLog::head);
                        let lamport = if head > floor_seq {
                            self.log.known_lamport(log?, head).ok()?.unwrap_or(0)
                        } else {
                            0
                        };
                        (head, lamport)
                    }
                };
                if run.len() == 0 {
                    return None;
                }
                let last_lamport = run.last_lamport();
                if head.checked_add(1) != Some(run.first_seq)
                    || run.first_seq <= floor_seq
                    || run.first_seq.checked_add(run.len() as u64 - 1).is_none()
                    || run.lamports.get(0) <= head_lamport
                    || last_lamport > crate::LAMPORT_MAX
                    || !run.lamports.rises(true)
                    || run.has_payload_over(self.config.payload_bytes_max)
                {
                    return None;
                }
                heads.insert(stream, (run.last_seq(), last_lamport));
                clock = clock.max(last_lamport);
                plan.reports[index].applied += run.len() as u64;
                let run = plan.batch.add_columns(run);
                plan.ops.push(Op::Events {
                    run,
                    source: Source::Received,
                });
            }
        }
        if self.log.stream_count() + new_streams > self.config.streams_max {
            return None;
        }
        // Then the appends, stamped above everything the deltas hold.
        let mut pending_len = self.pending_len;
        let own = self.config.stream;
        let mut own_head = self.log.head(own);
        self.plan_appends(
            appends,
            &mut own_head,
            &mut clock,
            &mut plan,
            &mut pending_len,
        );
        if !appends.is_empty() {
            heads.insert(own, (own_head, 0));
        }
        plan.batch.clock = clock;
        plan.pending_len_after = pending_len;
        plan.heads_after = heads
            .into_iter()
            .map(|(stream, (head, _))| (stream, head))
            .collect();
        Some(plan)
    }

    /// Plans each of `appends` in turn ([`State::plan_append`]), its
    /// outcome pushed to the plan's `appended`.
    fn plan_appends(
        &self,
        appends: &[AppendRequest],
        own_head: &mut u64,
        clock: &mut u64,
        plan: &mut Plan,
        pending_len: &mut usize,
    ) {
        let own_log = self.log.stream(self.config.stream);
        for request in appends {
            let result = self.plan_append(request, own_head, clock, own_log, plan, pending_len);
            plan.appended.push(result);
        }
    }

    fn plan_append(
        &self,
        request: &AppendRequest,
        own_head: &mut u64,
        clock: &mut u64,
        own_log: Option<&StreamLog>,
        plan: &mut Plan,
        pending_len: &mut usize,
    ) -> Result<usize, ReplicaError> {
        let stream = self.config.stream;
        if self.recovering {
            return Err(ReplicaError::Recovering {
                stream,
                head: *own_head,
            });
        }
        for payload in request.payloads {
            if payload.len() > self.config.payload_bytes_max {
                return Err(ReplicaError::PayloadTooLarge {
                    stream,
                    len: payload.len(),
                    limit: self.config.payload_bytes_max,
                });
            }
        }
        let exhausted = || ReplicaError::ClockExhausted { stream };
        let len = u64::try_from(request.payloads.len()).map_err(|_| exhausted())?;
        own_head.checked_add(len).ok_or_else(exhausted)?;
        clock.checked_add(len).ok_or_else(exhausted)?;
        let mut events = Vec::with_capacity(request.payloads.len());
        for payload in request.payloads {
            *own_head += 1;
            *clock += 1;
            // An early event of our own stream (left from a recovery) is
            // replaced by ours.
            if own_log.is_some_and(|log| log.early(*own_head).is_some()) {
                *pending_len -= 1;
            }
            events.push(Event {
                stream,
                seq: *own_head,
                lamport: *clock,
                time_ms: request.time_ms,
                payload: payload.clone(),
            });
        }
        let len = events.len();
        let run = plan.batch.add_events(events);
        if len > 0 {
            plan.ops.push(Op::Events {
                run,
                source: Source::Appended,
            });
        }
        Ok(run)
    }

    /// Plans a compaction to `target` (per stream, clamped to the head: a
    /// replica compacts only what it holds). Changes nothing.
    pub(crate) fn plan_compact(&self, target: &VersionVector) -> Plan<'static> {
        let mut plan = Plan {
            pending_len_after: self.pending_len,
            ..Plan::default()
        };
        plan.batch.clock = self.clock;
        let mut report = CompactReport::default();
        for (stream, target_seq) in target.iter() {
            let Some(log) = self.log.stream(stream) else {
                continue;
            };
            let floor_seq = target_seq.min(log.head());
            if floor_seq > log.floor {
                report.dropped += floor_seq - log.floor;
                report.streams += 1;
                plan.batch.floors.push((stream, floor_seq));
                plan.ops.push(Op::Floor(plan.batch.floors.len() - 1));
                plan.heads_after.push((stream, log.head()));
            }
        }
        plan.compacted = Some(report);
        plan
    }

    fn sim<'m, 's, 'd>(
        &'s self,
        sims: &'m mut BTreeMap<StreamId, SimStream<'s, 'd>>,
        stream: StreamId,
    ) -> &'m mut SimStream<'s, 'd> {
        sims.entry(stream).or_insert_with(|| {
            let log = self.log.stream(stream);
            SimStream {
                log,
                floor: log.map_or(0, |log| log.floor),
                head: log.map_or(0, StreamLog::head),
                added: BTreeMap::new(),
            }
        })
    }
}

/// Releases the early events that now follow `sim`'s head, into the plan.
fn release(
    stream: StreamId,
    sim: &mut SimStream,
    batch: &mut Batch,
    ops: &mut Vec<Op>,
    report: &mut ApplyReport,
    pending_len: &mut usize,
    clock: &mut u64,
) {
    while let Some(next) = sim.head.checked_add(1) {
        let event = if let Some(event) = sim.added.remove(&next) {
            event.clone()
        } else if let Some(early) = sim.log.and_then(|log| log.early(next)) {
            Event {
                stream,
                seq: next,
                lamport: early.lamport,
                time_ms: early.time_ms,
                payload: early.payload.clone(),
            }
        } else {
            return;
        };
        sim.head = next;
        *clock = (*clock).max(event.lamport);
        *pending_len -= 1;
        report.applied += 1;
        let run = batch.add_events(vec![event]);
        ops.push(Op::Events {
            run,
            source: Source::Released,
        });
    }
}
