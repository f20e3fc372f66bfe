//! Planning: the operations and the store batch a change makes, simulated
//! on an overlay of the state. Changes nothing.
//!
//! A round (one request alone, or a group commit's queue) is a **left
//! fold**: each request is validated ([`State::validate`]) and planned
//! against the state the requests before it leave ([`Round`]), in
//! submission order, exactly as applying them one by one would: a floor
//! affects only what comes after it, and an append is stamped from the
//! clock as it stands at its position.

use std::borrow::Cow;
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};

use super::held::State;
use super::validate::{Chained, PeerFloor, Rejection, RoundIndex};
use crate::log::StreamLog;
use crate::{
    ApplyReport, Batch, CompactReport, Delta, DeltaColumns, Event, KeptSeals, ReplicaError,
};

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
    /// Raise `stream`'s floor to `floor_seq`.
    Floor { stream: StreamId, floor_seq: u64 },
    /// Hold a run of events, consecutive seqs of one stream from its head
    /// + 1: the batch's run `run`.
    Events { run: usize, source: Source },
    /// Keep an early event in the pending buffer (memory only).
    Hold(Event),
    /// Nothing: an [`Op::Events`] moved after a floor of its stream
    /// raised later in the round (left in place, so that moving it costs
    /// no scan of the plan).
    Moved,
}

/// One request of a round, in submission order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RoundItem<'d> {
    /// A peer's delta.
    Delta(&'d Delta),
    /// A peer's delta in columns (planned as columns by
    /// [`State::plan_columns`]; [`State::plan_round`] takes none).
    Columns(&'d DeltaColumns),
    /// Local appends.
    Append(AppendRequest<'d>),
}

/// What a round does with one of its requests.
#[derive(Debug)]
pub(crate) enum Planned {
    /// A delta accepted, and what applying it does.
    Applied(ApplyReport),
    /// A delta refused, and why.
    Refused(Rejection),
    /// Local appends: the batch's run of their events, or why they were
    /// refused.
    Appended(Result<usize, ReplicaError>),
}

/// A planned change: what to commit, and what to do to the state once
/// committed. It borrows the received events from their deltas.
#[derive(Debug, Default)]
pub(crate) struct Plan<'d> {
    /// What the store commits (possibly empty: a change of the pending
    /// buffer alone, or counters).
    pub(crate) batch: Batch<'d>,
    pub(super) ops: Vec<Op>,
    /// One per request of the round, in order.
    pub(crate) planned: Vec<Planned>,
    compacted: Option<CompactReport>,
    /// Pair assertions: what publishing must lead to.
    pub(super) pending_len_after: usize,
    pub(super) heads_after: Vec<(StreamId, u64)>,
    /// The seals of the deltas the round accepted, in order: kept by
    /// publishing where they are at their stream's head.
    pub(crate) seals: Vec<crate::RunSeal>,
    /// The compaction statements of the deltas the round accepted that
    /// erased their stream, in order (`state/authority.rs`).
    pub(crate) statements: Vec<crate::SignedCompaction>,
    /// How many of `seals` the planner kept already, delta by delta, as
    /// publishing each delta alone would (every delta's but the round's
    /// last: [`Round::note_seals`]), and per stream what it kept:
    /// [`State::seals_after`] goes on from there with the rest.
    pub(crate) seals_noted: usize,
    pub(crate) kept_seals: BTreeMap<StreamId, KeptSeals>,
    /// Of `seals`, those whose run the round holds up to the seal (the
    /// delta's events of the stream, not left behind a floor or dropped
    /// as early, reaching the seal's seq): what the commit's chains may
    /// anchor on or take a hash from ([`State::chains_after`]), as one by
    /// one, where a seal whose run is not held commits with no event of
    /// its stream, and one whose run is held only in part (an event of a
    /// sealed stream dropped as early) with none at the seal's seq: the
    /// round's later deltas may bring it, which the commit of the delta
    /// alone does not see.
    pub(crate) held_seals: Vec<crate::RunSeal>,
    /// Of `held_seals`, those whose run the validator chained from the
    /// receiver's head hash as the round left it ([`Chained`]): the only
    /// seals the commit may take a stream's chain hash from instead of
    /// hashing the run. (A seal taken unchained, on a stream unanchored
    /// then, proves nothing of the chain a later delta's base anchors in
    /// the same round.)
    pub(crate) chained_seals: Vec<crate::RunSeal>,
}

impl Plan<'_> {
    /// Whether publishing changes anything the store does not hold (the
    /// pending buffer or counters) or the store must commit.
    pub(crate) fn is_noop(&self) -> bool {
        self.ops.is_empty()
            && self.planned.iter().all(|planned| match planned {
                Planned::Applied(report) => *report == ApplyReport::default(),
                Planned::Refused(_) => false,
                Planned::Appended(_) => true,
            })
    }

    /// The events of the local append request whose batch run is `run`
    /// (from [`Planned::Appended`]), taken out of the plan once it is
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

/// A round being planned: the plan so far, and the state as the requests
/// planned so far leave it (per touched stream, the clock, the pending
/// count), which the next request is validated and planned against.
struct Round<'s, 'd> {
    state: &'s State,
    sims: BTreeMap<StreamId, SimStream<'s, 'd>>,
    clock: u64,
    pending_len: usize,
    plan: Plan<'d>,
    /// What a later delta of the round is validated against.
    index: RoundIndex,
    /// Whether a delta follows in the round: only then is the index kept
    /// (the events planned, the streams added).
    indexing: bool,
    /// Per stream, where its [`Op::Events`] are in `plan.ops`: what a
    /// floor raised later moves after itself, found without a scan.
    event_ops: BTreeMap<StreamId, Vec<usize>>,
    /// Per stream, where its floor is in `plan.batch.floors`.
    floor_at: BTreeMap<StreamId, usize>,
    /// The streams the delta being planned holds events of.
    held_streams: std::collections::BTreeSet<StreamId>,
}

impl State {
    /// Plans a round: each request in order, validated and planned
    /// against the state the requests before it leave, exactly as
    /// applying them one by one would (`replica/tests/round_fold.rs`).
    /// Deltas in columns are not taken here (see [`State::plan_columns`]).
    /// Changes nothing.
    pub(crate) fn plan_round<'d>(&self, items: &[RoundItem<'d>]) -> Plan<'d> {
        let mut round = Round::new(self);
        let mut deltas_left = items
            .iter()
            .filter(|item| matches!(item, RoundItem::Delta(_)))
            .count();
        for item in items {
            let planned = match *item {
                RoundItem::Delta(delta) => {
                    deltas_left -= 1;
                    round.indexing = deltas_left > 0;
                    match self.validate(delta, &round.index) {
                        Ok(chained) => {
                            round.plan.seals.extend_from_slice(&delta.seals);
                            round
                                .index
                                .sealed
                                .extend(delta.seals.iter().map(|s| (s.seal.stream, s.key)));
                            let report = round.delta(delta);
                            round.note_held_seals(delta, &chained);
                            if round.indexing {
                                round.note_anchors(delta);
                                round.note_seals(delta);
                                round.plan.seals_noted = round.plan.seals.len();
                            }
                            Planned::Applied(report)
                        }
                        Err(error) => {
                            round.keep_fork(&error.rule);
                            Planned::Refused(error)
                        }
                    }
                }
                RoundItem::Append(request) => {
                    round.indexing = deltas_left > 0;
                    Planned::Appended(round.append(&request))
                }
                RoundItem::Columns(_) => {
                    unreachable!("a delta in columns is planned by plan_columns or made events")
                }
            };
            round.plan.planned.push(planned);
        }
        round.finish()
    }

    /// What [`State::validate`] checks a delta against after `earlier`
    /// is planned in the same round.
    #[cfg(test)]
    pub(super) fn index_after(&self, earlier: &[RoundItem<'_>]) -> RoundIndex {
        let mut round = Round::new(self);
        round.indexing = true;
        for item in earlier {
            match *item {
                RoundItem::Delta(delta) => {
                    if self.validate(delta, &round.index).is_ok() {
                        round.delta(delta);
                    }
                }
                RoundItem::Append(request) => {
                    let _ = round.append(&request);
                }
                RoundItem::Columns(_) => unreachable!("events only"),
            }
        }
        round.index
    }

    /// Plans a round of deltas in columns as columns, with its appends in
    /// order, if every delta is *clean*: no floor, one run per stream,
    /// streams ascending, none this replica's own, each run from its
    /// stream's head + 1 (as the deltas before it in the round leave it)
    /// with nothing pending in the stream, stamps rising above the head's
    /// up to `LAMPORT_MAX`, payloads within the limit, and room for the new
    /// streams. Those are deltas the event path takes whole, each run as
    /// one operation, and plans alike ([`State::plan_round`]). Anything
    /// else is `None`: the caller plans the round as events, which validate
    /// each delta and say why it is refused, if it is. So is every round
    /// on a store on disk, which commits events (it would make them from
    /// the columns, a copy more than making them over a delta's own
    /// payloads). Changes nothing.
    pub(crate) fn plan_columns<'d>(&self, items: &[RoundItem<'d>]) -> Option<Plan<'d>> {
        if !self.log.is_in_memory() {
            return None;
        }
        let mut round = Round::new(self);
        // Per stream the round touched: its head and the head's stamp, as
        // the round's runs so far leave them.
        let mut heads: BTreeMap<StreamId, (u64, u64)> = BTreeMap::new();
        for item in items {
            let planned = match *item {
                RoundItem::Columns(columns) => {
                    // Seals and forks are judged only in the one
                    // validator: a sealed delta, any under
                    // `require_seals`, and one of a pinned or frozen
                    // stream (a proof received before anything of it
                    // freezes a stream never pinned) go the events' way.
                    let judged = |stream| {
                        self.pinned.contains_key(&stream) || self.forks.contains_key(&stream)
                    };
                    let pinned = !(self.pinned.is_empty() && self.forks.is_empty())
                        && columns.runs().iter().any(|run| judged(run.stream));
                    if !columns.seals.is_empty() || self.config.require_seals || pinned {
                        return None;
                    }
                    Planned::Applied(round.clean_columns(columns, &mut heads)?)
                }
                RoundItem::Append(request) => Planned::Appended(round.append(&request)),
                RoundItem::Delta(_) => return None,
            };
            round.plan.planned.push(planned);
        }
        let new_streams: Vec<StreamId> = heads
            .keys()
            .copied()
            .filter(|&stream| !self.log.has_stream(stream))
            .collect();
        if self
            .streams_over(&RoundIndex::default(), new_streams.len())
            .is_some()
        {
            return None;
        }
        let mut plan = round.finish();
        plan.heads_after
            .extend(heads.into_iter().map(|(stream, (head, _))| (stream, head)));
        Some(plan)
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
                plan.ops.push(Op::Floor { stream, floor_seq });
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

impl<'s, 'd> Round<'s, 'd> {
    /// Keeps the proof a refused delta carries ([`DeltaError::Forked`]:
    /// `state/forks.rs`), the first per stream, and freezes its stream
    /// for the rest of the round, as publishing the proof would one by
    /// one.
    ///
    /// [`DeltaError::Forked`]: crate::DeltaError::Forked
    fn keep_fork(&mut self, rule: &ReplicaError) {
        if let ReplicaError::Delta(crate::DeltaError::Forked { stream, proof, .. }) = rule {
            self.index.forked.insert(*stream);
            let batch = &self.plan.batch;
            if !self.state.forks.contains_key(stream)
                && !batch.forks.iter().any(|kept| kept.stream() == *stream)
            {
                self.plan.batch.forks.push((**proof).clone());
            }
        }
    }

    /// Notes the seals of `delta` (just planned) whose run it holds up to
    /// the seal ([`Plan::held_seals`]), and of those the ones the validator
    /// chained from the head hash ([`Plan::chained_seals`]).
    fn note_held_seals(&mut self, delta: &Delta, chained: &Chained) {
        for (index, run_seal) in delta.seals.iter().enumerate() {
            if self.holds_run(run_seal) {
                self.plan.held_seals.push(*run_seal);
                if chained.proves(index) {
                    self.plan.chained_seals.push(*run_seal);
                }
            }
        }
    }

    /// Whether the delta just planned holds `run_seal`'s run up to the
    /// seal: events of its stream held, and the stream's head at or past
    /// the seal's seq ([`Plan::held_seals`]).
    fn holds_run(&self, run_seal: &crate::RunSeal) -> bool {
        let stream = run_seal.seal.stream;
        self.held_streams.contains(&stream)
            && self
                .sims
                .get(&stream)
                .is_some_and(|sim| sim.head >= run_seal.seal.seq)
    }

    /// Notes where `delta`'s sealed runs the round holds anchor their
    /// streams ([`State::seal_anchor`]), as committing `delta` alone
    /// would: a later delta of the round is judged on those chains.
    fn note_anchors(&mut self, delta: &Delta) {
        for run_seal in &delta.seals {
            let stream = run_seal.seal.stream;
            if run_seal.base.is_none() || !self.holds_run(run_seal) {
                continue;
            }
            let floor = self.state.sim(&mut self.sims, stream).floor;
            if let Some(anchor) = self.state.seal_anchor(&self.index, run_seal, floor) {
                self.index.anchors.insert(stream, anchor);
            }
        }
    }

    /// Moves the seals the round keeps as publishing `delta` alone would
    /// ([`State::seals_after`]): its seal of a stream at the stream's
    /// head, over the chain hash there, is kept (the seals at and above
    /// it dropped); each pinned stream it sealed or raised a floor of is
    /// thinned to its bounds. For a later delta's fork check
    /// (`state/forks.rs`).
    fn note_seals(&mut self, delta: &Delta) {
        let state = self.state;
        let statements = delta.floor_proofs.statements.iter();
        let floors = delta.floor.iter().map(|(stream, _)| stream);
        let floors = floors.chain(statements.map(|signed| signed.statement.stream));
        let pinned = |index: &RoundIndex, stream| {
            let key = state.pinned.get(&stream).or(index.sealed.get(&stream));
            key.copied()
        };
        let mut moved: Vec<(StreamId, Option<crate::Seal>)> = Vec::new();
        for run_seal in &delta.seals {
            let (stream, head) = (run_seal.seal.stream, run_seal.seal.head);
            let at = state.sim(&mut self.sims, stream).head;
            let kept = run_seal.seal.seq == at
                && state.round_head_hash(&self.index, stream, at) == Some(head);
            moved.push((stream, kept.then_some(run_seal.seal)));
        }
        moved.extend(floors.map(|stream| (stream, None)));
        for (stream, seal) in moved {
            let Some(key) = pinned(&self.index, stream) else {
                continue;
            };
            let sim = state.sim(&mut self.sims, stream);
            let kept = self.index.seals.entry(stream).or_insert_with(|| KeptSeals {
                key,
                seals: state.kept_seals.get(&stream).cloned().unwrap_or_default(),
            });
            if let Some(seal) = seal {
                kept.seals.retain(|old| old.seq < seal.seq);
                kept.seals.push(seal);
            }
            kept.thin(sim.floor, sim.head);
        }
    }

    fn new(state: &'s State) -> Self {
        Round {
            state,
            sims: BTreeMap::new(),
            clock: state.clock,
            pending_len: state.pending_len,
            plan: Plan::default(),
            index: RoundIndex::default(),
            indexing: false,
            event_ops: BTreeMap::new(),
            floor_at: BTreeMap::new(),
            held_streams: Default::default(),
        }
    }

    fn finish(mut self) -> Plan<'d> {
        self.plan.kept_seals = std::mem::take(&mut self.index.seals);
        self.plan.batch.clock = self.clock;
        self.plan.pending_len_after = self.pending_len;
        self.plan.heads_after = self
            .sims
            .iter()
            .map(|(&stream, sim)| (stream, sim.head))
            .collect();
        self.plan
    }

    /// Plans a validated delta: its floors, as [`PeerFloor::of`] judges
    /// each on the stream as the round leaves it, then its events in
    /// order (but those of a stream behind the delta's floor).
    fn delta(&mut self, delta: &'d Delta) -> ApplyReport {
        let state = self.state;
        let own = state.config.stream;
        self.held_streams.clear();
        let mut report = ApplyReport::default();
        // A statement with authority (validated) erases first, as a
        // compaction: never the own stream.
        for signed in &delta.floor_proofs.statements {
            let (stream, floor_seq) = (signed.statement.stream, signed.statement.floor);
            if stream != own && floor_seq > state.sim(&mut self.sims, stream).floor {
                self.raise_floor(stream, floor_seq, &mut report);
                self.plan.statements.push(*signed);
                let hash = signed.statement.hash;
                self.index.anchors.insert(stream, (floor_seq, hash));
            }
        }
        for (stream, floor_seq) in delta.floor.iter() {
            let needed = state.floor_needs_authority(stream, floor_seq, &self.index, Some(delta));
            let sim = state.sim(&mut self.sims, stream);
            let bounds = (sim.floor, sim.head);
            let rule = PeerFloor::of(stream, floor_seq, own, state.recovering, bounds, needed);
            match rule {
                PeerFloor::Ignored => {}
                PeerFloor::Raised => self.raise_floor(stream, floor_seq, &mut report),
                PeerFloor::Behind => report.behind_floor.push((stream, floor_seq)),
            }
        }
        let mut position = 0;
        while position < delta.events.len() {
            let stream = delta.events[position].stream;
            // Streams ascending, as the delta's floor lists them.
            if !report.behind_floor.is_empty()
                && report
                    .behind_floor
                    .binary_search_by_key(&stream, |&(behind, _)| behind)
                    .is_ok()
            {
                report.behind_events += 1;
                position += 1;
                continue;
            }
            position = self.event_at(delta, position, &mut report);
        }
        if let Some(sim) = self.sims.get(&own) {
            self.index.own_head = Some(sim.head);
        }
        if self.indexing {
            // What a later delta's floors are judged against: the
            // streams of its floor, its statements (a hand-built delta's
            // statement need not be in its floor) and its events.
            let statements = delta.floor_proofs.statements.iter();
            let touched = delta.floor.iter().map(|(stream, _)| stream);
            let touched = touched.chain(statements.map(|signed| signed.statement.stream));
            let mut last = None;
            let touched = touched.chain(delta.events.iter().filter_map(|event| {
                (last.replace(event.stream) != Some(event.stream)).then_some(event.stream)
            }));
            for stream in touched {
                if let Some(sim) = self.sims.get(&stream) {
                    self.index.heads.insert(stream, sim.head);
                }
            }
        }
        report
    }

    /// Plans the event of `delta` at `position` (with the run it starts,
    /// where it extends the head); answers the position after them.
    fn event_at(&mut self, delta: &'d Delta, position: usize, report: &mut ApplyReport) -> usize {
        let event = &delta.events[position];
        let stream = event.stream;
        let sim = self.state.sim(&mut self.sims, stream);
        let no_early = sim.added.is_empty() && sim.log.is_none_or(StreamLog::has_no_early);
        if no_early && Some(event.seq) == sim.head.checked_add(1) {
            // A run extending the head, with nothing pending to release:
            // held as one operation (validated, so its stamps rise).
            let len = delta.events[position..]
                .iter()
                .enumerate()
                .take_while(|(i, next)| {
                    next.stream == stream && Some(next.seq) == event.seq.checked_add(*i as u64)
                })
                .count();
            let run = &delta.events[position..position + len];
            let last = &run[len - 1];
            sim.head = last.seq;
            self.clock = self.clock.max(last.lamport);
            self.hold(stream, Cow::Borrowed(run), Source::Received);
            report.applied += len as u64;
            return position + len;
        }
        let pending = sim.added.contains_key(&event.seq)
            || sim.log.is_some_and(|log| log.early(event.seq).is_some());
        if event.seq <= sim.floor {
            report.below_floor += 1;
        } else if event.seq <= sim.head || pending {
            report.duplicates += 1;
        } else if Some(event.seq) == sim.head.checked_add(1) {
            sim.head = event.seq;
            self.clock = self.clock.max(event.lamport);
            let run = &delta.events[position..=position];
            self.hold(stream, Cow::Borrowed(run), Source::Received);
            report.applied += 1;
            self.release(stream, report);
        } else if self.pending_len < self.state.config.pending_events_max
            && !self.sealed(delta, stream)
        {
            let sim = self.state.sim(&mut self.sims, stream);
            sim.added.insert(event.seq, event);
            self.plan.ops.push(Op::Hold(event.clone()));
            self.pending_len += 1;
            report.pending += 1;
            if self.indexing {
                self.note_stream(stream);
                self.index.events.insert((stream, event.seq), event.clone());
            }
        } else {
            report.dropped += 1;
        }
        position + 1
    }

    /// Whether `stream` is sealed for this delta: the delta seals it, or
    /// the receiver (or an earlier delta of the round) pinned its key. An
    /// early event of a sealed stream is dropped, not held pending: its
    /// seal can be checked only from the head hash, so it is fetched
    /// again once it attaches (`docs/SIGNING.md`).
    fn sealed(&self, delta: &Delta, stream: StreamId) -> bool {
        delta.seals.iter().any(|s| s.seal.stream == stream)
            || self.state.pinned.contains_key(&stream)
            || self.index.sealed.contains_key(&stream)
    }

    /// Adds a run of `stream`'s events to the plan, held from its head.
    fn hold(&mut self, stream: StreamId, events: Cow<'d, [Event]>, source: Source) -> usize {
        let run = self.plan.batch.add_events(events);
        if self.plan.batch.run_len(run) == 0 {
            return run;
        }
        self.held_streams.insert(stream);
        self.push_events(stream, run, source);
        if self.indexing {
            self.note_stream(stream);
            for event in self.plan.batch.run(run) {
                self.index
                    .events
                    .insert((event.stream, event.seq), event.clone());
            }
        }
        run
    }

    /// Adds the operation holding the batch's run `run`, indexed by stream
    /// while a delta follows (only a later delta's floor moves it: a
    /// delta's own floors are planned before its events, and an append or
    /// a delta in columns raises none), so that a one-delta round pays no
    /// map entry per run.
    fn push_events(&mut self, stream: StreamId, run: usize, source: Source) {
        if self.indexing {
            self.event_ops
                .entry(stream)
                .or_default()
                .push(self.plan.ops.len());
        }
        self.plan.ops.push(Op::Events { run, source });
    }

    /// Records that the round adds `stream` to the log, if it is new.
    fn note_stream(&mut self, stream: StreamId) {
        if !self.state.log.has_stream(stream) {
            self.index.new_streams.insert(stream);
        }
    }

    /// Raises `stream`'s floor to `floor_seq` at this point of the round:
    /// the early events at or below it are discarded, the events the round
    /// added at or below it are taken out of the plan (the store never
    /// sees them: it deletes below the floors before it adds a batch's
    /// events), and those above it follow the floor.
    fn raise_floor(&mut self, stream: StreamId, floor_seq: u64, report: &mut ApplyReport) {
        let sim = self.state.sim(&mut self.sims, stream);
        if floor_seq <= sim.floor {
            return;
        }
        let discarded = sim.log.map_or(0, |log| match sim.head.checked_add(1) {
            Some(first) => log.early_count_in(first..=floor_seq),
            None => 0,
        });
        let stale: Vec<u64> = sim.added.range(..=floor_seq).map(|(&seq, _)| seq).collect();
        for seq in &stale {
            sim.added.remove(seq);
        }
        self.pending_len -= discarded + stale.len();
        sim.floor = floor_seq;
        sim.head = sim.head.max(floor_seq);
        self.index.floors.insert(stream, floor_seq);
        // The batch records each stream's floor once, its highest.
        let floors = &mut self.plan.batch.floors;
        match self.floor_at.entry(stream) {
            Entry::Occupied(at) => floors[*at.get()].1 = floor_seq,
            Entry::Vacant(at) => {
                at.insert(floors.len());
                floors.push((stream, floor_seq));
            }
        }
        let erased = self.take_events_of(stream);
        self.plan.ops.push(Op::Floor { stream, floor_seq });
        if self.indexing {
            self.note_stream(stream);
        }
        for (run, source) in erased {
            self.plan.batch.trim_run(run, floor_seq);
            if self.plan.batch.run_len(run) > 0 {
                self.push_events(stream, run, source);
            }
        }
        report.floors_raised += 1;
        self.release(stream, report);
    }

    /// Takes the operations holding `stream`'s events out of the plan, in
    /// order (the batch keeps their runs; each leaves [`Op::Moved`]).
    fn take_events_of(&mut self, stream: StreamId) -> Vec<(usize, Source)> {
        let at = self.event_ops.remove(&stream).unwrap_or_default();
        at.into_iter()
            .filter_map(
                |i| match std::mem::replace(&mut self.plan.ops[i], Op::Moved) {
                    Op::Events { run, source, .. } => Some((run, source)),
                    _ => None,
                },
            )
            .collect()
    }

    /// Releases the early events that now follow `stream`'s head.
    fn release(&mut self, stream: StreamId, report: &mut ApplyReport) {
        loop {
            let sim = self.state.sim(&mut self.sims, stream);
            let Some(next) = sim.head.checked_add(1) else {
                return;
            };
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
            self.clock = self.clock.max(event.lamport);
            self.pending_len -= 1;
            report.applied += 1;
            self.hold(stream, Cow::Owned(vec![event]), Source::Released);
        }
    }

    /// Plans a local append request at this point of the round: stamped
    /// from the clock as the requests before it leave it.
    fn append(&mut self, request: &AppendRequest) -> Result<usize, ReplicaError> {
        let state = self.state;
        let stream = state.config.stream;
        let sim = state.sim(&mut self.sims, stream);
        let mut head = sim.head;
        state.check_append(request.payloads, head, self.clock)?;
        let mut events = Vec::with_capacity(request.payloads.len());
        for payload in request.payloads {
            head += 1;
            self.clock += 1;
            // An early event of our own stream (left from a recovery) is
            // replaced by ours.
            if sim.log.is_some_and(|log| log.early(head).is_some()) {
                self.pending_len -= 1;
            }
            events.push(Event {
                stream,
                seq: head,
                lamport: self.clock,
                time_ms: request.time_ms,
                payload: payload.clone(),
            });
        }
        sim.head = head;
        self.index.own_head = Some(head);
        Ok(self.hold(stream, Cow::Owned(events), Source::Appended))
    }

    /// Plans a delta in columns, if it is clean (see
    /// [`State::plan_columns`]), against `heads` as the round leaves them.
    fn clean_columns(
        &mut self,
        columns: &'d DeltaColumns,
        heads: &mut BTreeMap<StreamId, (u64, u64)>,
    ) -> Option<ApplyReport> {
        let state = self.state;
        if !columns.floor.is_empty() || !columns.floor_proofs.statements.is_empty() {
            return None;
        }
        let mut report = ApplyReport::default();
        let mut previous: Option<StreamId> = None;
        for run in columns.run_parts() {
            let stream = run.stream;
            if stream == state.config.stream || previous.is_some_and(|before| before >= stream) {
                return None;
            }
            previous = Some(stream);
            let log = state.log.stream(stream);
            if log.is_some_and(|log| !log.has_no_early()) {
                return None;
            }
            let floor_seq = state.floor.get(stream);
            let (head, head_lamport) = match heads.get(&stream) {
                Some(&planned) => planned,
                None => {
                    let head = log.map_or(0, StreamLog::head);
                    let lamport = if head > floor_seq {
                        state.log.known_lamport(log?, head).ok()?.unwrap_or(0)
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
                || run.has_payload_over(state.config.payload_bytes_max)
            {
                return None;
            }
            heads.insert(stream, (run.last_seq(), last_lamport));
            self.clock = self.clock.max(last_lamport);
            report.applied += run.len() as u64;
            let run = self.plan.batch.add_columns(run);
            self.push_events(stream, run, Source::Received);
        }
        Some(report)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use meshlog_cursor::StreamId;

    use super::{Planned, RoundItem};
    use crate::{Config, Delta, Event, MemStore, Replica};

    /// A round with many floors over many streams plans in time linear in
    /// its size (issue 28 follow-up: each floor raised scanned every
    /// operation of the plan and every floor of the batch). One delta
    /// brings ten events of each of 8,000 streams; ten more name a floor
    /// for those (above their heads: each is behind it, issue 29) and for
    /// 8,000 streams held nothing of, raised by one each time: 80,000
    /// floors raised over a plan of 8,000 event operations and 80,000 more
    /// floors judged behind, some 10⁹ steps when quadratic (minutes in
    /// debug), about a second linear.
    #[test]
    fn a_round_of_many_floors_over_many_streams_plans_in_linear_time() {
        const STREAMS: u64 = 8_000;
        const SEQS: u64 = 10;
        let mut config = Config::new(StreamId::new(1));
        config.streams_max = meshlog_cursor::STREAMS_MAX;
        let replica = Replica::open(config, MemStore::default()).unwrap();
        let held = || (2..STREAMS + 2).map(StreamId::new);
        let empty = || (STREAMS + 2..2 * STREAMS + 2).map(StreamId::new);
        let events = Delta {
            events: held()
                .flat_map(|stream| {
                    (1..=SEQS).map(move |seq| Event {
                        stream,
                        seq,
                        lamport: seq,
                        time_ms: 0,
                        payload: Bytes::from_static(b"e"),
                    })
                })
                .collect(),
            ..Delta::default()
        };
        let floors: Vec<Delta> = (1..=SEQS)
            .map(|seq| Delta {
                floor: held()
                    .map(|stream| (stream, SEQS + seq))
                    .chain(empty().map(|stream| (stream, seq)))
                    .collect(),
                ..Delta::default()
            })
            .collect();
        let mut items = vec![RoundItem::Delta(&events)];
        items.extend(floors.iter().map(RoundItem::Delta));
        let plan = replica.state.plan_round(&items);
        let Planned::Applied(first) = &plan.planned[0] else {
            panic!("the events accepted: {:?}", plan.planned[0]);
        };
        assert_eq!(first.applied, STREAMS * SEQS);
        for (seq, planned) in (1..).zip(&plan.planned[1..]) {
            let Planned::Applied(report) = planned else {
                panic!("a floor accepted: {planned:?}");
            };
            assert_eq!(report.floors_raised, STREAMS);
            let behind: Vec<(StreamId, u64)> = held().map(|s| (s, SEQS + seq)).collect();
            assert_eq!(report.behind_floor, behind);
        }
        assert_eq!(plan.batch.floors.len(), STREAMS as usize);
        assert_eq!(
            plan.batch.events().count(),
            (STREAMS * SEQS) as usize,
            "no held event is below a floor"
        );
    }
}
