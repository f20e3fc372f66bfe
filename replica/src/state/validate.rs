//! Validation: whether a delta may be accepted against the state and the
//! requests planned before it in its round. Changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use meshlog_cursor::StreamId;

use super::held::State;
use crate::error::read_error;
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
    /// Heads of the streams the round's deltas touched, as the round
    /// leaves them (kept only while a later delta may be checked).
    pub(super) heads: BTreeMap<StreamId, u64>,
    /// The own stream's head, once the round moved it.
    pub(super) own_head: Option<u64>,
    /// The streams a delta accepted earlier in the round sealed, and the
    /// key (pinned as publishing will pin it).
    pub(super) sealed: BTreeMap<StreamId, crate::WriterPublicKey>,
    /// Per stream the round anchored: the floor and the chain hash there,
    /// of a statement the round took (erased to it), or of a sealed run's
    /// base the round holds on a stream unanchored at its floor
    /// ([`State::seal_anchor`]), where the commit anchors a chain left
    /// unanchored there. A later delta's runs and statements are chained
    /// from it, as one by one they are from the chain committed.
    pub(super) anchors: BTreeMap<StreamId, (u64, crate::ChainHash)>,
    /// The streams a delta refused earlier in the round proved forked:
    /// frozen for the deltas after it, as publishing its proof freezes
    /// them one by one (`state/forks.rs`).
    pub(super) forked: BTreeSet<StreamId>,
    /// Per pinned stream whose kept seals the round moved, the seals
    /// applying its deltas one by one would keep by now (what a later
    /// delta's run is compared with to find a fork; kept only while a
    /// later delta may be checked).
    pub(super) seals: BTreeMap<StreamId, crate::KeptSeals>,
}

impl RoundIndex {
    pub(super) fn floor(&self, stream: StreamId) -> u64 {
        self.floors.get(&stream).copied().unwrap_or(0)
    }

    pub(super) fn head(&self, stream: StreamId) -> Option<u64> {
        self.heads.get(&stream).copied()
    }

    fn lamport(&self, stream: StreamId, seq: u64) -> Option<u64> {
        self.events.get(&(stream, seq)).map(|event| event.lamport)
    }
}

/// Per seal of an accepted delta, in order: whether the validator chained
/// its run's new events from the receiver's chain hash at its head as the
/// round leaves it to the seal's hash, which is then the receiver's chain
/// hash at the seal's seq (what the commit may take instead of hashing
/// the run again: `State::chains_after`). A run chained from its `base`
/// (the receiver unanchored), or not chained (an early run, one the
/// receiver holds, an unanchored stream), proves nothing of the
/// receiver's chain.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Chained(Vec<bool>);

impl Chained {
    /// Whether the delta's seal at `index` was chained from the head
    /// hash: its hash is the receiver's chain hash at its seq.
    pub(crate) fn proves(&self, index: usize) -> bool {
        self.0.get(index).copied().unwrap_or(false)
    }
}

/// Why a change is refused: the stream and the seqs it concerns, and the
/// rule broken (as the caller is told it). What every validation path
/// answers: a delta's floors and runs, and local appends.
#[derive(Debug)]
pub(crate) struct Rejection {
    /// The stream concerned.
    pub(crate) stream: StreamId,
    /// The seqs concerned (a floor's seq, for a floor).
    pub(crate) seqs: RangeInclusive<u64>,
    /// The rule broken.
    pub(crate) rule: ReplicaError,
}

impl Rejection {
    pub(super) fn at(
        stream: StreamId,
        seqs: RangeInclusive<u64>,
    ) -> impl FnOnce(ReplicaError) -> Self {
        move |rule| Rejection { stream, seqs, rule }
    }

    fn of(event: &Event) -> impl FnOnce(ReplicaError) -> Self {
        Rejection::at(event.stream, event.seq..=event.seq)
    }
}

/// Every rule names its stream and seq (or seqs) itself, so nothing a user
/// needs to act on is lost here.
impl From<Rejection> for ReplicaError {
    fn from(rejection: Rejection) -> Self {
        rejection.rule
    }
}

/// One delta being validated: against the state, and what the round
/// planned before it; its events by name.
struct Check<'a> {
    state: &'a State,
    round: &'a RoundIndex,
    delta: &'a Delta,
    /// The delta's events by name: two versions of one name sit side by
    /// side, and so do an event and its neighbours in the same delta, so
    /// every check is against the log, the round, or an adjacent entry,
    /// whatever order the events came in.
    by_name: Vec<&'a Event>,
    own: StreamId,
    own_head: u64,
    /// Per stream of the delta's floor or statements, the seq at or below
    /// which the delta's events of it are ignored
    /// ([`State::ignored_floors`]).
    delta_floors: BTreeMap<StreamId, u64>,
}

/// What a peer's floor (a floor without authority: `docs/SIGNING.md`,
/// "Floors with an authority") does to one stream of the receiver, judged
/// on the stream as the round leaves it before the delta. The one rule:
/// the validator and the planner both ask [`PeerFloor::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PeerFloor {
    /// Nothing: the receiver's own stream (a peer never compacts it), a
    /// floor at or below the receiver's, or one at or below its head
    /// while it holds events of the stream (it keeps them; the peer can
    /// serve what follows its head).
    Ignored,
    /// The receiver holds nothing of the stream above its floor: the
    /// floor is raised to the peer's, recording the range as lost (on a
    /// stream the receiver knows is keyed, only with the writer's
    /// authority: else `Behind`; [`State::floor_needs_authority`]).
    Raised,
    /// The receiver holds events of the stream below the peer's floor:
    /// kept, and the delta's events of the stream (which cannot attach
    /// above the gap) are not taken.
    Behind,
}

impl PeerFloor {
    /// The rule, for a peer's `floor` of `stream` on a receiver whose own
    /// stream is `own` (written by peers only while `recovering`), holding
    /// the stream from `held_floor` to `head`; `authority_needed` where
    /// [`State::floor_needs_authority`] says so (a raise would let a peer
    /// invent a floor past the writer's head).
    pub(super) fn of(
        stream: StreamId,
        floor: u64,
        own: StreamId,
        recovering: bool,
        (held_floor, head): (u64, u64),
        authority_needed: bool,
    ) -> PeerFloor {
        if (stream == own && !recovering) || floor <= held_floor {
            PeerFloor::Ignored
        } else if head <= held_floor && authority_needed {
            PeerFloor::Behind
        } else if head <= held_floor {
            PeerFloor::Raised
        } else if floor > head {
            PeerFloor::Behind
        } else {
            PeerFloor::Ignored
        }
    }

    /// The seq at or below which the delta's events of the stream are
    /// ignored (judged for their limits only, never taken): the peer's
    /// floor where it is raised, every seq where the stream is behind it.
    pub(super) fn ignored_to(self, floor: u64) -> u64 {
        match self {
            PeerFloor::Ignored => 0,
            PeerFloor::Raised => floor,
            PeerFloor::Behind => u64::MAX,
        }
    }
}

impl State {
    /// Whether a peer's floor of `stream` is raised only with the
    /// writer's authority ([`PeerFloor::of`]'s `authority_needed`): the
    /// receiver knows the stream is keyed, and `delta` (where a delta is
    /// judged) does not vouch for the floor with a sealed run starting
    /// right after it with its base ([`vouched`]). Known keyed:
    /// a key is pinned for it (by the state, or by a delta earlier in
    /// `round`), or, another stream than the own, the membership knows
    /// its key ([`Membership::knows_key`](crate::Membership::knows_key))
    /// or [`Config::require_seals`](crate::Config::require_seals) is on
    /// for a stream the membership takes at all (an unknown writer's
    /// floor that would raise its stream stays refused as such:
    /// [`Check::membership`]). A newcomer that knows that much before it
    /// pins the stream is not handed a floor past the writer's head by an
    /// unsigned floor alone.
    pub(super) fn floor_needs_authority(
        &self,
        stream: StreamId,
        floor: u64,
        round: &RoundIndex,
        delta: Option<&Delta>,
    ) -> bool {
        let pinned = self.pinned.contains_key(&stream) || round.sealed.contains_key(&stream);
        let membership = &self.config.membership;
        let sealed_only = self.config.require_seals && membership.admits_stream(stream);
        let configured =
            stream != self.config.stream && (sealed_only || membership.knows_key(stream));
        (pinned || configured) && !delta.is_some_and(|delta| vouched(delta, stream, floor))
    }
}

/// Whether the writer's seal vouches for `delta`'s floor of `stream`: a
/// sealed run of it starting right after the floor, with the base there
/// (the validator chains the run from that base to the seal).
fn vouched(delta: &Delta, stream: StreamId, floor: u64) -> bool {
    let based = delta
        .seals
        .iter()
        .any(|s| s.seal.stream == stream && s.base.is_some());
    based
        && delta
            .events
            .iter()
            .filter(|event| event.stream == stream)
            .map(|event| event.seq)
            .min()
            == floor.checked_add(1)
}

impl State {
    /// Checks a delta against this state and the requests planned earlier
    /// in the same round, changing nothing: its floors, then each run of
    /// its events (one stream, consecutive seqs; an event alone is a run
    /// of one), then the streams it adds. Accepted, which of its seals
    /// it proved the receiver's chain hash by ([`Chained`]).
    pub(crate) fn validate(&self, delta: &Delta, round: &RoundIndex) -> Result<Chained, Rejection> {
        self.validate_with(delta, round, true)
    }

    /// [`State::validate`]; `runs` lets clean runs be checked as runs
    /// (off only in the test that compares both ways).
    pub(super) fn validate_with(
        &self,
        delta: &Delta,
        round: &RoundIndex,
        runs: bool,
    ) -> Result<Chained, Rejection> {
        let own = self.config.stream;
        // Statements first: what they erase is how the floors are judged.
        let signed = self.statement_floors(delta, round)?;
        let delta_floors = self.ignored_floors(delta, round, &signed);
        let check = Check {
            state: self,
            round,
            delta,
            by_name: sorted_by_name(&delta.events),
            own,
            own_head: round.own_head.unwrap_or_else(|| self.log.head(own)),
            delta_floors,
        };
        check.floors()?;
        check.membership()?;
        self.check_forks(delta, round)?;
        let chained = check.seals()?;
        // The streams of the runs, noted as they are walked: the stream
        // check needs no second walk over the events.
        let mut streams: Vec<StreamId> = check.delta.floor.iter().map(|(s, _)| s).collect();
        let mut start = 0;
        while start < check.by_name.len() {
            let end = check.run_end(start);
            check.run(start, end, runs)?;
            streams.push(check.by_name[start].stream);
            start = end;
        }
        check.streams(streams)?;
        Ok(chained)
    }

    /// A local append request of `len` events after `own_head`, at
    /// `clock`: refused while recovering, for a payload above the limit,
    /// or when the seqs or the clock would pass `u64::MAX`.
    pub(super) fn check_append(
        &self,
        payloads: &[bytes::Bytes],
        own_head: u64,
        clock: u64,
    ) -> Result<(), Rejection> {
        let stream = self.config.stream;
        let len = payloads.len() as u64;
        let reject = Rejection::at(
            stream,
            own_head.saturating_add(1)..=own_head.saturating_add(len),
        );
        if self.recovering {
            return Err(reject(ReplicaError::Recovering {
                stream,
                head: own_head,
            }));
        }
        for (seq, payload) in (own_head.saturating_add(1)..).zip(payloads) {
            if let Err(rule) = self.check_payload(stream, seq, payload.len()) {
                return Err(reject(rule));
            }
        }
        if own_head.checked_add(len).is_none() || clock.checked_add(len).is_none() {
            return Err(reject(ReplicaError::ClockExhausted { stream }));
        }
        Ok(())
    }

    /// The payload limit, for appends and received events alike.
    pub(super) fn check_payload(
        &self,
        stream: StreamId,
        seq: u64,
        len: usize,
    ) -> Result<(), ReplicaError> {
        if len > self.config.payload_bytes_max {
            return Err(ReplicaError::PayloadTooLarge {
                stream,
                seq,
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
    /// none the round adds, not the own): the count it would reach, if
    /// that is beyond `streams_max` (refused). A replica already beyond it
    /// (an operator lowered the limit) keeps what it holds and refuses
    /// only more.
    pub(super) fn streams_over(&self, round: &RoundIndex, new: usize) -> Option<usize> {
        self.streams_over_from(self.streams_counted(round), new)
    }

    /// [`State::streams_over`] from `counted` streams.
    fn streams_over_from(&self, counted: usize, new: usize) -> Option<usize> {
        let streams = counted + new;
        (new > 0 && streams > self.config.streams_max).then_some(streams)
    }

    /// How much of `columns` the limits take: none of an unknown writer's
    /// stream (as [`Check::membership`] judges it, by the same rule) nor,
    /// under `require_seals`, of an unsealed legacy stream (as
    /// [`Check::seals`] judges it), the
    /// streams that fit (as [`State::check_streams`] counts them, in the
    /// delta's order) and, per stream, the events up to the first payload
    /// over the limit (as [`State::check_payload`] judges it). What apply
    /// would refuse for membership or a limit is cut; nothing else is
    /// judged.
    pub(crate) fn admission(&self, columns: &DeltaColumns) -> Admission {
        let own = self.config.stream;
        let mut counted = self.streams_counted(&RoundIndex::default());
        let mut admitted: BTreeSet<StreamId> = BTreeSet::new();
        // Streams refused whole first, so that they take no slot in the count.
        let mut cuts: BTreeMap<StreamId, Cut> = self.whole_cuts(columns);
        self.frozen_cuts(columns, &mut cuts);
        let mut admit = |stream: StreamId, from_seq: u64, cuts: &mut BTreeMap<StreamId, Cut>| {
            let new = stream != own && !self.log.has_stream(stream) && admitted.insert(stream);
            if new && self.streams_over_from(counted, 1).is_some() {
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
            if !cuts.contains_key(&stream) {
                admit(stream, 0, &mut cuts);
            }
        }
        let mut index = 0;
        for run in columns.runs() {
            let (stream, first_index) = (run.stream, index);
            index += run.len;
            if cuts.contains_key(&stream) || !admit(stream, run.first_seq, &mut cuts) {
                continue;
            }
            // No payload of a run is longer than the run's payloads
            // together: within the limit, its events need no look.
            if run.len == 0
                || run_payload_bytes(columns, first_index, index) <= self.config.payload_bytes_max
            {
                continue;
            }
            let over = (0..run.len).find_map(|i| {
                let len = columns.payload(first_index + i).len();
                let seq = run.first_seq + i as u64;
                self.check_payload(stream, seq, len).err().map(|_| (i, len))
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
}

impl State {
    /// The cuts of the streams of `columns` an unknown writer's, each
    /// whole, judged against this state
    /// ([`Membership::unknown_writers`](crate::Membership::unknown_writers),
    /// the validator's rule): sealed, or brought something new of (a run
    /// above the head, a floor [`PeerFloor::of`] raises).
    fn unknown_writer_cuts(&self, columns: &DeltaColumns) -> BTreeMap<StreamId, Cut> {
        let membership = &self.config.membership;
        if membership.is_open() {
            return BTreeMap::new();
        }
        let own = self.config.stream;
        let raised = columns.floor.iter().filter(|&(stream, floor)| {
            let held_floor = self.floor.get(stream);
            let head = self.log.head(stream).max(held_floor);
            let needed = self.floor_needs_authority(stream, floor, &RoundIndex::default(), None);
            let rule = PeerFloor::of(
                stream,
                floor,
                own,
                self.recovering,
                (held_floor, head),
                needed,
            );
            rule == PeerFloor::Raised
        });
        let new_runs = columns
            .runs()
            .iter()
            .filter(|run| run.last_seq() > self.log.head(run.stream));
        let brought = raised
            .map(|(stream, _)| stream)
            .chain(new_runs.map(|run| run.stream));
        let unknown = membership.unknown_writers(own, &columns.seals, brought);
        let cut = |(stream, key)| {
            let limit = Limit::UnknownWriter { key };
            let from_seq = 0;
            (
                stream,
                Cut {
                    stream,
                    from_seq,
                    limit,
                },
            )
        };
        unknown.into_iter().map(cut).collect()
    }
}

impl State {
    /// The streams of `columns` refused whole, each cut from seq 0: an
    /// unknown writer's ([`State::unknown_writer_cuts`]), then an unsealed
    /// legacy one's ([`State::unsealed_cuts`]), then one whose statement
    /// has no authority here ([`State::no_authority_cuts`]); one cut per stream, the
    /// first reason kept.
    fn whole_cuts(&self, columns: &DeltaColumns) -> BTreeMap<StreamId, Cut> {
        let mut cuts = self.unknown_writer_cuts(columns);
        for cut in self
            .unsealed_cuts(columns)
            .into_iter()
            .chain(self.no_authority_cuts(columns))
        {
            cuts.entry(cut.stream).or_insert(cut);
        }
        cuts
    }

    /// Under [`Config::require_seals`](crate::Config::require_seals), the
    /// cuts of the streams of `columns` a legacy writer's: a run of
    /// another stream with new events (above the head), no seal in the
    /// delta and no key pinned for it, each cut whole. The validator
    /// refuses the same runs ([`Check::seals`], `Unsealed`); a pinned
    /// stream's unsealed run is left to it (a seal cut off in flight is a
    /// tampering, refused). Judged against this state alone: an
    /// admission answers for one delta before its round.
    fn unsealed_cuts(&self, columns: &DeltaColumns) -> Vec<Cut> {
        if !self.config.require_seals {
            return Vec::new();
        }
        let own = self.config.stream;
        let sealed = |stream| columns.seals.iter().any(|s| s.seal.stream == stream);
        let mut cuts: Vec<Cut> = Vec::new();
        for run in columns.runs() {
            let stream = run.stream;
            let legacy = stream != own
                && run.len > 0
                && run.last_seq() > self.log.head(stream)
                && !self.pinned.contains_key(&stream)
                && !sealed(stream);
            if legacy && cuts.last().is_none_or(|cut| cut.stream != stream) {
                cuts.push(Cut {
                    stream,
                    from_seq: 0,
                    limit: Limit::Unsealed,
                });
            }
        }
        cuts
    }
}

/// How many payload bytes `columns`' events `start..end` carry together
/// (`end` above `start`).
fn run_payload_bytes(columns: &DeltaColumns, start: usize, end: usize) -> usize {
    let ends = columns.ends();
    let from = start.checked_sub(1).map_or(0, |before| ends.get(before));
    (ends.get(end - 1) - from) as usize
}

impl State {
    /// The chain hash at `head` of `stream` as `round` leaves it: the
    /// state's head hash chained through the events the round holds
    /// above it. `None` where it is not known: the stream is unanchored,
    /// or the round raised its floor above what the state held.
    pub(super) fn round_head_hash(
        &self,
        round: &RoundIndex,
        stream: StreamId,
        head: u64,
    ) -> Option<crate::ChainHash> {
        let state_head = self.log.head(stream);
        // A statement or a seal's base the round took anchors the stream
        // at its floor.
        if let Some(hash) = self.anchored_head_hash(round, stream, head) {
            return Some(hash);
        }
        let chain = match self.chain(stream) {
            Some(chain) => chain,
            None if state_head == 0 && self.floor.get(stream) == 0 => crate::StreamChain::default(),
            None => return None,
        };
        // A floor the round raised above the state's head leaves the
        // stream chained through the round's events it erased, if they
        // reach it (a statement's), else unanchored: a missing event below.
        if !chain.anchored || head < state_head {
            return None;
        }
        let mut hash = chain.head_hash;
        for seq in state_head + 1..=head {
            hash = hash.next(round.events.get(&(stream, seq))?);
        }
        Some(hash)
    }
}

impl Check<'_> {
    /// The delta's floors: none above `LAMPORT_MAX`. Any other floor is
    /// taken as [`PeerFloor::of`] says (on the receiver's own stream,
    /// ignored whatever its value: no peer can cut a writer off).
    fn floors(&self) -> Result<(), Rejection> {
        // Lamports rise with seq from at least 1, so no stream can hold a
        // seq above LAMPORT_MAX: a floor above it would only erase a
        // stream's future (every event at or below a floor is ignored).
        let too_large = self
            .delta
            .floor
            .iter()
            .find(|&(_, floor)| floor > crate::LAMPORT_MAX);
        if let Some((stream, floor)) = too_large {
            let rule = DeltaError::FloorTooLarge {
                stream,
                floor,
                max: crate::LAMPORT_MAX,
            };
            return Err(Rejection::at(stream, floor..=floor)(rule.into()));
        }
        Ok(())
    }

    /// The delta's seals (`docs/SIGNING.md`, "Seals"), each over its
    /// stream's run of the delta: the key must derive the stream, the run's
    /// new events must chain from the receiver's head hash as the round
    /// leaves it (or from the sent base, when the run starts right after
    /// the delta's floor) to the sealed hash, and the signature must
    /// verify, alone (not batched: two replicas must decide alike). With
    /// [`Config::require_seals`](crate::Config::require_seals), a run of
    /// another stream with new events and no seal is refused.
    fn seals(&self) -> Result<Chained, Rejection> {
        let mut chained = Chained::default();
        for run_seal in &self.delta.seals {
            chained.0.push(self.sealed_run(run_seal)?);
        }
        if self.state.config.require_seals
            || !self.state.pinned.is_empty()
            || !self.round.sealed.is_empty()
        {
            let mut start = 0;
            while start < self.by_name.len() {
                let first = self.by_name[start];
                let stream = first.stream;
                let end = start + self.by_name[start..].partition_point(|e| e.stream == stream);
                let last = self.by_name[end - 1];
                let sealed = self.delta.seals.iter().any(|s| s.seal.stream == stream);
                let required = self.state.config.require_seals || self.pinned(stream).is_some();
                if required && stream != self.own && !sealed && last.seq > self.head(stream) {
                    let rule = DeltaError::Unsealed {
                        stream,
                        seq: first.seq,
                    };
                    return Err(Rejection::at(stream, first.seq..=last.seq)(rule.into()));
                }
                start = end;
            }
        }
        Ok(chained)
    }

    /// Membership ([`Config::membership`](crate::Config::membership)):
    /// under a closed one, no stream the delta seals or brings something
    /// new of (events above the head, a floor that raises it) may be an
    /// unknown writer's ([`Membership::unknown_writers`], the rule the
    /// admission cuts by); else [`DeltaError::UnknownWriter`], naming the
    /// first. Judged before any signature is checked, so a stranger costs
    /// no verification.
    ///
    /// [`Membership::unknown_writers`]: crate::Membership::unknown_writers
    fn membership(&self) -> Result<(), Rejection> {
        let membership = &self.state.config.membership;
        if membership.is_open() {
            return Ok(());
        }
        // Raised (not ignored, not behind): the floor would be recorded.
        let raised = self
            .delta
            .floor
            .iter()
            .filter(|&(stream, floor)| floor > 0 && self.delta_floors.get(&stream) == Some(&floor))
            .map(|(stream, _)| stream);
        let mut new_events = Vec::new();
        let mut start = 0;
        while start < self.by_name.len() {
            let stream = self.by_name[start].stream;
            let end = start + self.by_name[start..].partition_point(|e| e.stream == stream);
            if self.by_name[end - 1].seq > self.head(stream) {
                new_events.push(stream);
            }
            start = end;
        }
        let unknown =
            membership.unknown_writers(self.own, &self.delta.seals, raised.chain(new_events));
        match unknown.into_iter().next() {
            None => Ok(()),
            Some((stream, key)) => {
                let rule = DeltaError::UnknownWriter {
                    stream,
                    key: key.map(Box::new),
                };
                Err(Rejection::at(stream, self.seqs_of(stream))(rule.into()))
            }
        }
    }

    /// One seal and its stream's run; whether its new events were chained
    /// from the receiver's head hash (see [`Chained`]).
    fn sealed_run(&self, run_seal: &crate::RunSeal) -> Result<bool, Rejection> {
        let seal = &run_seal.seal;
        let stream = seal.stream;
        let refuse = |seqs: RangeInclusive<u64>, rule: DeltaError| {
            Err(Rejection::at(stream, seqs)(rule.into()))
        };
        self.seal_key(run_seal)?;
        let start = self.by_name.partition_point(|e| e.stream < stream);
        let end = start + self.by_name[start..].partition_point(|e| e.stream == stream);
        let run = &self.by_name[start..end];
        let broken = DeltaError::ChainBroken {
            stream,
            seq: seal.seq,
        };
        // The run: consecutive seqs, one version each, ending at the seal.
        let Some(first) = run.first() else {
            return refuse(seal.seq..=seal.seq, broken);
        };
        if first.seq == 0 {
            return refuse(0..=0, DeltaError::ZeroSeq { stream });
        }
        let consecutive = run
            .iter()
            .zip(first.seq..)
            .all(|(event, seq)| event.seq == seq);
        if !consecutive || run.last().map(|e| e.seq) != Some(seal.seq) {
            return refuse(first.seq..=seal.seq, broken);
        }
        let start = self.chain_start(run_seal, first.seq);
        if let Some((hash, from_seq, _)) = start {
            let skip = (from_seq - first.seq) as usize;
            let chained = run[skip..]
                .iter()
                .fold(hash, |hash, event| hash.next(event));
            if chained != seal.head {
                return refuse(first.seq..=seal.seq, broken);
            }
        }
        let binding = self.state.config.membership.binding(stream);
        if seal.verify_bound(&run_seal.key, binding.as_ref()).is_err() {
            let rule = DeltaError::BadSeal {
                stream,
                seq: seal.seq,
            };
            return refuse(seal.seq..=seal.seq, rule);
        }
        Ok(start.is_some_and(|(_, _, from_head)| from_head))
    }

    /// A seal's key: it derives the seal's stream (or a trusted binding
    /// names it for it: [`Membership::binding`](crate::Membership::binding)),
    /// is the key pinned for the stream, if one is, and under a closed
    /// membership the key admitted for it (an unknown writer's stream
    /// never comes here: [`Check::membership`] is judged first).
    fn seal_key(&self, run_seal: &crate::RunSeal) -> Result<(), Rejection> {
        let seal = &run_seal.seal;
        let stream = seal.stream;
        let membership = &self.state.config.membership;
        let binding = membership.binding(stream);
        let other_than_admitted = stream != self.own && !membership.admits(stream, &run_seal.key);
        let derived = match run_seal.key.signs_for(stream, binding.as_ref()) {
            Err(crate::SealError::KeyMismatch { derived, .. }) => derived,
            _ if other_than_admitted
                || self
                    .pinned(stream)
                    .is_some_and(|pinned| pinned != run_seal.key) =>
            {
                run_seal.key.stream()
            }
            _ => return Ok(()),
        };
        let rule = DeltaError::KeyMismatch { stream, derived };
        Err(Rejection::at(stream, seal.seq..=seal.seq)(rule.into()))
    }

    /// Where a sealed run's new events are chained from to its seal: the
    /// hash, the first seq it covers and whether the hash is the
    /// receiver's head hash (else the run's `base`), or `None` where the
    /// run is not chained here (nothing new, an early run:
    /// `docs/SIGNING.md`).
    fn chain_start(
        &self,
        run_seal: &crate::RunSeal,
        first_seq: u64,
    ) -> Option<(crate::ChainHash, u64, bool)> {
        let seal = &run_seal.seal;
        let stream = seal.stream;
        let head = self.head(stream);
        let after_floor = first_seq - 1 == self.delta.floor.get(stream);
        if first_seq <= head.saturating_add(1) {
            // It attaches at (or overlaps) the head: chained from the
            // head's hash through the new events (the older ones must be
            // the held ones: the per-event checks see to that).
            if seal.seq <= head {
                return None;
            }
            self.head_hash(stream, head)
                .map(|hash| (hash, head + 1, true))
                .or(run_seal
                    .base
                    .filter(|_| after_floor)
                    .map(|base| (base, first_seq, false)))
        } else if after_floor {
            // It starts right after the sender's floor, above the head.
            run_seal.base.map(|base| (base, first_seq, false))
        } else {
            // An early run: not judged here.
            None
        }
    }

    /// The key pinned for `stream`: by the state, or a delta accepted
    /// earlier in the round.
    fn pinned(&self, stream: StreamId) -> Option<crate::WriterPublicKey> {
        let pinned = self.state.pinned.get(&stream);
        pinned.or_else(|| self.round.sealed.get(&stream)).copied()
    }

    /// `stream`'s head as the round leaves it before the delta.
    fn head(&self, stream: StreamId) -> u64 {
        self.round
            .head(stream)
            .unwrap_or_else(|| self.state.log.head(stream))
    }

    /// The chain hash at `head` of `stream` as the round leaves it
    /// ([`State::round_head_hash`]).
    fn head_hash(&self, stream: StreamId, head: u64) -> Option<crate::ChainHash> {
        self.state.round_head_hash(self.round, stream, head)
    }

    /// Where the run of `by_name` that starts at `start` ends: one stream,
    /// consecutive seqs (another version of a seq starts the next run).
    fn run_end(&self, start: usize) -> usize {
        let first = self.by_name[start];
        let mut end = start + 1;
        while let Some(event) = self.by_name.get(end) {
            let expected = first.seq.checked_add((end - start) as u64);
            if event.stream != first.stream || Some(event.seq) != expected {
                break;
            }
            end += 1;
        }
        end
    }

    /// The run `by_name[start..end]`: whole if it is clean
    /// ([`Check::clean`]), else event by event.
    fn run(&self, start: usize, end: usize, runs: bool) -> Result<(), Rejection> {
        let log = self.state.log.stream(self.by_name[start].stream);
        if runs && self.clean(start, end, log)? {
            return Ok(());
        }
        for index in start..end {
            self.event(index, log)?;
        }
        Ok(())
    }

    /// The seq at or below which `stream`'s events are ignored: the
    /// state's floor, the round's, and what the delta's floor makes
    /// ignored ([`PeerFloor::ignored_to`]).
    fn floor_seq(&self, stream: StreamId) -> u64 {
        let delta_floor = self.delta_floors.get(&stream).copied().unwrap_or(0);
        let floor = self.state.floor.get(stream).max(self.round.floor(stream));
        floor.max(delta_floor)
    }

    /// The lamport of `seq` of `stream` held or pending in the log, or
    /// planned earlier in the round.
    fn known_lamport(
        &self,
        log: Option<&StreamLog>,
        stream: StreamId,
        seq: u64,
    ) -> Result<Option<u64>, ReplicaError> {
        let known = match log {
            Some(log) => self.state.log.known_lamport(log, seq).map_err(read_error)?,
            None => None,
        };
        Ok(known.or_else(|| self.round.lamport(stream, seq)))
    }

    /// One event: its limits, then (above the floor) its name and its
    /// neighbours.
    fn event(&self, index: usize, log: Option<&StreamLog>) -> Result<(), Rejection> {
        let event = self.by_name[index];
        self.event_limits(event).map_err(Rejection::of(event))?;
        if event.seq <= self.floor_seq(event.stream) {
            return Ok(());
        }
        self.same_name(index, log).map_err(Rejection::of(event))?;
        self.neighbours(index, log).map_err(Rejection::of(event))
    }

    /// What an event may be at all: a seq from 1, a stamp and a payload
    /// within the limits, not the own stream beyond its head (outside
    /// recovery).
    fn event_limits(&self, event: &Event) -> Result<(), ReplicaError> {
        let stream = event.stream;
        if event.seq == 0 {
            return Err(DeltaError::ZeroSeq { stream }.into());
        }
        check_lamport_max(event)?;
        self.state
            .check_payload(stream, event.seq, event.payload.len())?;
        if stream == self.own && !self.state.recovering && event.seq > self.own_head {
            let rule = DeltaError::OwnStreamAhead {
                stream,
                seq: event.seq,
                head: self.own_head,
            };
            return Err(rule.into());
        }
        Ok(())
    }

    /// Any other version of the event's name, held, pending, planned
    /// earlier in the round, or in this delta (the entry before, once
    /// sorted), must be this very event.
    fn same_name(&self, index: usize, log: Option<&StreamLog>) -> Result<(), ReplicaError> {
        let event = self.by_name[index];
        let (stream, seq) = (event.stream, event.seq);
        let same_as_held = match log {
            Some(log) => self.state.log.known_is(log, event).map_err(read_error)?,
            None => true,
        };
        let same_as_round = self
            .round
            .events
            .get(&(stream, seq))
            .is_none_or(|other| other == event);
        let previous = index.checked_sub(1).map(|i| self.by_name[i]);
        let same_as_offered = previous
            .filter(|other| other.stream == stream && other.seq == seq)
            .is_none_or(|other| other == event);
        if same_as_held && same_as_round && same_as_offered {
            return Ok(());
        }
        Err(DeltaError::Equivocation { stream, seq }.into())
    }

    /// Lamport rises with seq against every neighbour known: held,
    /// pending, planned in the round, or the nearest entries of this delta
    /// either side (past repeats of this very name).
    fn neighbours(&self, index: usize, log: Option<&StreamLog>) -> Result<(), ReplicaError> {
        let event = self.by_name[index];
        let stream = event.stream;
        let in_delta = |seq: u64, entries: &mut dyn Iterator<Item = &&Event>| {
            entries
                .take_while(|other| other.stream == stream)
                .find(|other| other.seq != event.seq)
                .filter(|other| other.seq == seq)
                .map(|other| other.lamport)
        };
        let below = event.seq - 1;
        if below > self.floor_seq(stream) {
            let known = self.known_lamport(log, stream, below)?;
            let lamport =
                known.or_else(|| in_delta(below, &mut self.by_name[..index].iter().rev()));
            if let Some(lamport) = lamport {
                check_rising(event, below, lamport)?;
            }
        }
        if let Some(above) = event.seq.checked_add(1) {
            let known = self.known_lamport(log, stream, above)?;
            let lamport = known.or_else(|| in_delta(above, &mut self.by_name[index + 1..].iter()));
            if let Some(lamport) = lamport {
                check_rising(event, above, lamport)?;
            }
        }
        Ok(())
    }

    /// Checks, in O(1) reads of the log, the run `by_name[start..end]` if
    /// it is *clean*: from its stream's head + 1, above every floor, every
    /// event within the limits and stamped above the one before, no other
    /// version of any of its seqs pending or in the round, not this
    /// replica's own stream (outside recovery), and no other version of
    /// its ends next to it in the delta. Answers whether it was, having
    /// made every check the per-event path makes on it (and refused the
    /// delta with the same rejection, if one fails at the run's ends); a
    /// run that is not goes event by event, so that what is refused, and
    /// why, do not change.
    fn clean(&self, start: usize, end: usize, log: Option<&StreamLog>) -> Result<bool, Rejection> {
        let (first, last) = (self.by_name[start], self.by_name[end - 1]);
        let stream = first.stream;
        let head = log.map_or(0, StreamLog::head);
        let floor_seq = self.floor_seq(stream);
        let before = start.checked_sub(1).map(|i| self.by_name[i]);
        let same_name = |other: &&Event, seq: u64| other.stream == stream && other.seq == seq;
        if (stream == self.own && !self.state.recovering)
            || head.checked_add(1) != Some(first.seq)
            || first.seq <= floor_seq
            || before.is_some_and(|other| same_name(&other, first.seq))
            || self
                .by_name
                .get(end)
                .is_some_and(|other| same_name(other, last.seq))
            || !self.within_limits_and_rising(&self.by_name[start..end])
            || log.is_some_and(|log| log.early_count_in(first.seq..=last.seq) > 0)
            || (self.round.events)
                .range((stream, first.seq)..=(stream, last.seq))
                .next()
                .is_some()
        {
            return Ok(false);
        }
        // The neighbours outside the run, as the per-event path finds them:
        // held (or pending), in the round, or in the delta next to it (the
        // entry after the run is not `last + 1`: the run would hold it).
        let below = first.seq - 1;
        if below > floor_seq {
            let known = self.known_lamport(log, stream, below);
            let known = known.map_err(Rejection::of(first))?;
            let lamport = known.or_else(|| {
                before
                    .filter(|other| same_name(other, below))
                    .map(|other| other.lamport)
            });
            if let Some(lamport) = lamport {
                check_rising(first, below, lamport).map_err(Rejection::of(first))?;
            }
        }
        if let Some(above) = last.seq.checked_add(1) {
            let known = self.known_lamport(log, stream, above);
            if let Some(lamport) = known.map_err(Rejection::of(last))? {
                check_rising(last, above, lamport).map_err(Rejection::of(last))?;
            }
        }
        Ok(true)
    }

    /// Whether every event of a run is within the stamp and payload limits
    /// and stamped above the one before.
    fn within_limits_and_rising(&self, run: &[&Event]) -> bool {
        let mut previous: Option<&Event> = None;
        run.iter().all(|&event| {
            let fits = check_lamport_max(event).is_ok()
                && self
                    .state
                    .check_payload(event.stream, event.seq, event.payload.len())
                    .is_ok()
                && previous.is_none_or(|p| check_rising(event, p.seq, p.lamport).is_ok());
            previous = Some(event);
            fits
        })
    }

    /// The streams the delta adds (of `new`, those named by its floor or
    /// its runs: not held, not added earlier in the round, not the own):
    /// within the limit, or the delta is refused naming the last that does
    /// not fit.
    fn streams(&self, mut new: Vec<StreamId>) -> Result<(), Rejection> {
        let state = self.state;
        new.retain(|&stream| {
            stream != self.own
                && !state.log.has_stream(stream)
                && !self.round.new_streams.contains(&stream)
        });
        new.sort_unstable();
        new.dedup();
        match state.streams_over(self.round, new.len()) {
            None => Ok(()),
            Some(streams) => {
                let stream = *new.last().expect("only new streams are refused");
                let seqs = self.seqs_of(stream);
                let rule = ReplicaError::TooManyStreams {
                    stream,
                    seqs: seqs.clone(),
                    streams,
                    limit: state.config.streams_max,
                };
                Err(Rejection::at(stream, seqs)(rule))
            }
        }
    }

    /// The seqs the delta carries of `stream` (its floor, if none).
    fn seqs_of(&self, stream: StreamId) -> RangeInclusive<u64> {
        let mut seqs = self
            .by_name
            .iter()
            .filter(|e| e.stream == stream)
            .map(|e| e.seq);
        let floor = self.delta.floor.get(stream);
        let first = seqs.next().unwrap_or(floor);
        first..=seqs.next_back().unwrap_or(first)
    }
}

/// The one lamport-order rule: within a stream, lamport rises with seq.
/// Judges `event` against a neighbour of its stream, below or above it.
pub(super) fn check_rising(
    event: &Event,
    neighbour_seq: u64,
    neighbour_lamport: u64,
) -> Result<(), ReplicaError> {
    let rises = if neighbour_seq < event.seq {
        neighbour_lamport < event.lamport
    } else {
        event.lamport < neighbour_lamport
    };
    if rises {
        Ok(())
    } else {
        Err(lamport_error(event, neighbour_seq, neighbour_lamport))
    }
}

/// The stamp limit: no received event above
/// [`LAMPORT_MAX`](crate::LAMPORT_MAX).
fn check_lamport_max(event: &Event) -> Result<(), ReplicaError> {
    if event.lamport > crate::LAMPORT_MAX {
        let rule = DeltaError::LamportTooLarge {
            stream: event.stream,
            seq: event.seq,
            lamport: event.lamport,
            max: crate::LAMPORT_MAX,
        };
        return Err(rule.into());
    }
    Ok(())
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
