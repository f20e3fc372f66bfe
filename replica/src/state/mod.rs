//! `State`: what a replica holds in memory, readable by many, and every
//! change split into **plan → commit → publish**.
//!
//! A change is first *validated* and *planned* against the state without
//! touching it (a plan lists the operations to perform and the store
//! [`Batch`] that makes them durable); the batch is *committed* to the store
//! with no lock on the state held; only then is the plan *published*: its
//! operations are performed on the state, which cannot fail. So readers
//! never wait for a commit, a failed commit leaves the state exactly as it
//! was, and nothing is visible before its commit.
//!
//! Planning simulates the change on a sparse overlay (per touched stream:
//! floor, head, early events added), and publishing re-checks the outcome
//! (heads, pending count) against the plan: a disagreement is a bug and
//! stops the process rather than serve a state that differs from the store.
//!
//! # Layout
//!
//! Imports flow one way: this module imports its children; the children
//! import the state from `held`, and one another only downward (`plan`
//! from `validate`, `publish` from `plan`); none imports this module.
//!
//! - this module: opening (`load`, the checks of what a store holds),
//!   `verify`, the digest summed when asked, ending recovery, and reads
//!   (`page`, `get`);
//! - `chain`: the chain heads per stream (`docs/SIGNING.md`): computed
//!   for a batch just before its commit, kept when published, taken on
//!   open, recomputed by `verify`; the digest of them;
//! - `held`: the `State` struct and its fields' types (`LazyDigest`), its
//!   plain accessors, the digest's arithmetic; the leaf, importing none of
//!   its siblings (the store-error conversions are `crate::error`'s);
//! - `validate`: the one validator: what a replica accepts, for a run of
//!   events (a delta's floors and runs, local appends), and its limits;
//! - `plan`: a round (one request, or a group commit's queue) folded in
//!   submission order into a `Plan`, on an overlay of the state;
//! - `publish`: performing a committed plan;
//! - `delta`: building what a peer misses, as events or as columns;
//! - `seals`: the seals kept per stream received sealed (moved just
//!   before a commit, recorded with it, published), and the seals a delta
//!   carries: each run cut where a seal is held, or the own stream sealed
//!   where it is cut.

mod authority;
mod chain;
mod delta;
mod forks;
mod held;
mod plan;
mod publish;
mod seals;
mod validate;

pub(crate) use held::State;
pub(crate) use plan::{AppendRequest, Plan, Planned, RoundItem};
pub(crate) use validate::RoundIndex;

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use meshlog_cursor::{StreamId, VersionVector};

use crate::checkpoints::Checkpoints;
use crate::error::{read_error, store_error};
use crate::log::{Held, Log, Walk};
use crate::mem::MemLog;
use crate::{Config, Digest, Event, OpenWarning, Page, PageError, ReplicaError, Stats, Store};
use delta::read_whole;
use held::LazyDigest;

impl State {
    /// Reads what `store` holds and checks it: per stream the events
    /// `floor+1 ..= head` with none missing, lamport rising with seq, and a
    /// clock at or above every stamp recorded.
    pub(crate) fn load<S: Store>(config: Config, store: &S) -> Result<State, ReplicaError> {
        let meta = store.meta().map_err(store_error)?;
        let recovering = config.recover_own_stream;
        let view = store.view();
        let held = match view {
            Some(view) => Held::View(view),
            None => Held::Own(MemLog::default()),
        };
        let mut state = State {
            config,
            log: Log::new(held),
            marks: VersionVector::new(),
            floor: meta.floor.clone(),
            clock: meta.clock,
            pending_len: 0,
            digest: Mutex::default(),
            chains: BTreeMap::new(),
            hashed: BTreeMap::new(),
            resolved: Mutex::default(),
            stats: Stats::default(),
            recovering,
            open_warnings: Vec::new(),
            own_seal: Mutex::default(),
            pinned: meta.seals.iter().map(|(&s, kept)| (s, kept.key)).collect(),
            kept_seals: BTreeMap::new(),
            statements: meta.statements.clone(),
            own_hashes: Mutex::default(),
            seals_signed: Default::default(),
            checkpoints: Checkpoints::from_vectors(&meta.checkpoints),
            forks: meta.forks.clone(),
        };
        let streams: Vec<(StreamId, u64)> = meta.heads.iter().collect();
        if state.log.is_own() {
            state.load_every_event(store, &streams, &meta.floor)?;
        } else {
            state.load_recorded(&streams, &meta.floor, meta.digest)?;
        }
        state.load_chains(&meta.chains, &meta.hashed)?;
        state.load_seals(&meta.seals);
        state.check_open_limits();
        tracing::debug!(
            stream = %state.config.stream,
            streams = state.log.stream_count(),
            events = state.digest().events,
            clock = state.clock,
            recovering,
            "replica opened"
        );
        Ok(state)
    }

    /// Opens on a store's view: what the store recorded (floors, heads,
    /// digest), checking per stream only that its last event is stamped at
    /// or below the clock. [`State::verify`] checks every event.
    fn load_recorded(
        &mut self,
        streams: &[(StreamId, u64)],
        floors: &VersionVector,
        digest: Option<Digest>,
    ) -> Result<(), ReplicaError> {
        for &(stream, head) in streams {
            let floor = floors.get(stream);
            if head < floor {
                return Err(ReplicaError::Corrupt {
                    stream,
                    detail: format!("head {head} is below floor {floor}"),
                });
            }
            self.log.open_stream(stream, floor, head);
            self.marks.advance(stream, head);
            let log = self.log.stream(stream).expect("just opened");
            if head > floor {
                let last = self.log.lamport_in(log, head).map_err(read_error)?;
                match last {
                    None => {
                        return Err(ReplicaError::Corrupt {
                            stream,
                            detail: format!(
                                "the store records head {head} but holds no such event"
                            ),
                        })
                    }
                    Some(lamport) if lamport > self.clock => {
                        return Err(ReplicaError::Corrupt {
                            stream,
                            detail: format!(
                                "seq {head} has lamport {lamport} above the recorded clock {}",
                                self.clock
                            ),
                        })
                    }
                    Some(_) => {}
                }
            }
        }
        let sum = match digest {
            Some(digest) => digest,
            None => self.recount()?.1,
        };
        *self.lazy_digest() = LazyDigest {
            sum,
            unhashed: BTreeMap::new(),
        };
        Ok(())
    }

    /// Reads every event of `store`, checking it, into the own copy.
    fn load_every_event<S: Store>(
        &mut self,
        store: &S,
        streams: &[(StreamId, u64)],
        floors: &VersionVector,
    ) -> Result<(), ReplicaError> {
        let mut chunk = Vec::new();
        for &(stream, head) in streams {
            let floor = floors.get(stream);
            let corrupt = |detail: String| ReplicaError::Corrupt { stream, detail };
            if head < floor {
                return Err(corrupt(format!("head {head} is below floor {floor}")));
            }
            self.log.ensure_stream(stream, floor);
            let mut previous: Option<u64> = None;
            while self.log.head(stream) < head {
                chunk.clear();
                let after = self.log.head(stream);
                store
                    .read_stream(stream, after, 4096, &mut chunk)
                    .map_err(store_error)?;
                if chunk.is_empty() {
                    return Err(corrupt(format!(
                        "store holds seqs {}..={after} but records head {head}",
                        floor.saturating_add(1)
                    )));
                }
                for event in &chunk {
                    check_next(event, stream, self.log.head(stream), previous, self.clock)?;
                    previous = Some(event.lamport);
                    self.lazy_digest().sum.add(event);
                    self.log.push(event);
                }
            }
            if self.log.head(stream) != head {
                return Err(corrupt(format!(
                    "read up to seq {} past the recorded head {head}",
                    self.log.head(stream)
                )));
            }
            self.marks.advance(stream, head);
        }
        Ok(())
    }

    /// Reads every held event through the source and checks it (seqs
    /// without a hole, lamport rising with seq, no stamp above the clock);
    /// answers the event count and the digest recomputed.
    fn recount(&self) -> Result<(u64, Digest), ReplicaError> {
        let mut digest = Digest::default();
        let source = self.log.source();
        for (stream, head) in self.marks.iter() {
            let Some(log) = self.log.stream(stream) else {
                continue;
            };
            if head <= log.floor {
                continue;
            }
            let mut scan = source
                .get()
                .scan(stream, log.floor + 1, head)
                .map_err(read_error)?;
            let mut previous: Option<u64> = None;
            let mut expected = log.floor;
            while scan.peek().map_err(read_error)?.is_some() {
                let event = scan.take().map_err(read_error)?;
                check_next(&event, stream, expected, previous, self.clock)?;
                previous = Some(event.lamport);
                expected = event.seq;
                digest.add(&event);
            }
            if expected != head {
                return Err(ReplicaError::Corrupt {
                    stream,
                    detail: format!("holds seqs up to {expected} but records head {head}"),
                });
            }
        }
        Ok((digest.events, digest))
    }

    /// Reads and checks every held event, and compares the digest
    /// recomputed with the one recorded.
    pub(crate) fn verify(&self) -> Result<crate::Verified, ReplicaError> {
        let (events, digest) = self.recount()?;
        let recorded = self.digest();
        if digest != recorded {
            return Err(ReplicaError::DigestMismatch {
                recorded,
                recomputed: digest,
            });
        }
        self.verify_chains()?;
        Ok(crate::Verified {
            streams: self.log.stream_count(),
            events,
        })
    }

    /// The digest of the events held: the sum kept, plus the hashes of
    /// the events received since it was last asked for (read back from
    /// the log, once). A store that records the digest keeps it whole.
    pub(crate) fn digest(&self) -> Digest {
        let mut lazy = self.digest.lock().unwrap_or_else(PoisonError::into_inner);
        if lazy.unhashed.is_empty() {
            return lazy.sum;
        }
        let source = self.log.source();
        let mut events = Vec::new();
        let unhashed = std::mem::take(&mut lazy.unhashed);
        for (&stream, &from) in &unhashed {
            let head = self.log.head(stream);
            if from > head {
                continue;
            }
            let mut used = 0;
            events.clear();
            let read = source
                .get()
                .read_into(stream, from, head, usize::MAX, &mut used, &mut events)
                .map_err(|error| error.to_string())
                .and_then(|_| {
                    read_whole(stream, from, head, events.len()).map_err(|e| e.to_string())
                });
            match read {
                Ok(()) => {
                    for event in &events {
                        lazy.sum.add(event);
                    }
                }
                Err(error) => {
                    // Only a store's view on disk fails a read, and a store
                    // on disk records the digest: asked again, read again.
                    tracing::error!(%stream, %error, "reading events to sum the digest failed");
                    lazy.unhashed.insert(stream, from);
                }
            }
        }
        lazy.sum
    }

    /// What opening found beyond the configured limits: kept, served, and
    /// reported (a limit lowered since the store was written must not make
    /// it unopenable).
    fn check_open_limits(&mut self) {
        let streams = self.streams_counted(&RoundIndex::default());
        if streams > self.config.streams_max {
            let warning = OpenWarning::StreamsOverLimit {
                streams,
                limit: self.config.streams_max,
            };
            tracing::warn!(stream = %self.config.stream, %warning, "replica opened over a limit");
            self.open_warnings.push(warning);
        }
        self.stats.open_warnings = self.open_warnings.len() as u64;
    }

    /// Ends recovery: from now on peers cannot write this replica's own
    /// stream, and it appends after the head it relearned. Early events of
    /// its own stream still pending are dropped: its next appends take
    /// those seqs.
    pub(crate) fn end_recovery(&mut self) {
        if !self.recovering {
            return;
        }
        self.recovering = false;
        let stream = self.config.stream;
        let head = self.log.head(stream);
        let dropped = self.log.drop_early(stream);
        self.pending_len -= dropped;
        tracing::info!(%stream, head, dropped, "recovery of the own stream ended");
    }

    pub(crate) fn get(&self, stream: StreamId, seq: u64) -> Result<Option<Event>, ReplicaError> {
        self.log.get(stream, seq).map_err(read_error)
    }

    pub(crate) fn held_times(&self, stream: StreamId) -> Result<Vec<(u64, u64)>, ReplicaError> {
        self.log.times(stream).map_err(read_error)
    }

    /// The vector covering every held event with a lamport at or below
    /// `lamport`; a stream whose compacted events' stamps are unknown (its
    /// first held event is above `lamport`, and some were compacted) gets 0,
    /// so a page reports its compacted range as possibly lost rather than
    /// skip it silently.
    pub(crate) fn covering_lamport(&self, lamport: u64) -> VersionVector {
        let mut cursor = VersionVector::new();
        for (stream, _) in self.marks.iter() {
            if let Some(log) = self.log.stream(stream) {
                match self.log.last_seq_at_or_below(log, lamport) {
                    Ok(Some(seq)) => cursor.advance(stream, seq),
                    Ok(None) => {}
                    // Unknown: 0, so the page reports what may be lost.
                    Err(error) => {
                        tracing::error!(%stream, %error, "reading the log failed");
                    }
                }
            }
        }
        cursor
    }

    pub(crate) fn page(&self, after: &VersionVector, limit: usize) -> Result<Page, PageError> {
        let mut page = self.page_untokened(after, limit)?;
        page.token = self.checkpoints.token(&page.next)?;
        Ok(page)
    }

    /// [`State::page`] without its token (left empty): for a caller that
    /// changes `next` before answering it.
    pub(crate) fn page_untokened(
        &self,
        after: &VersionVector,
        limit: usize,
    ) -> Result<Page, PageError> {
        if limit > self.config.page_len_max {
            return Err(PageError::LimitTooLarge {
                limit,
                max: self.config.page_len_max,
            });
        }
        after.check_floor(&self.floor)?;
        let source = self.log.source();
        let mut walk = Walk::new(source.get(), self.log.places(after));
        let events: Vec<Event> = walk.by_ref().take(limit).collect();
        if let Some(error) = walk.error.take() {
            return Err(PageError::Store {
                detail: error.to_string(),
            });
        }
        let at_head = walk.is_done();
        let next = walk.cursor(after);
        tracing::trace!(len = events.len(), at_head, "page");
        Ok(Page {
            events,
            next,
            token: String::new(),
            at_head,
        })
    }
}

/// Checks that `event`, read back for `stream`, is the seq after
/// `head_before`, stamped above `previous` and at or below `clock`.
fn check_next(
    event: &Event,
    stream: StreamId,
    head_before: u64,
    previous: Option<u64>,
    clock: u64,
) -> Result<(), ReplicaError> {
    let corrupt = |detail: String| ReplicaError::Corrupt { stream, detail };
    let expected = head_before.checked_add(1);
    if event.stream != stream || Some(event.seq) != expected {
        return Err(corrupt(format!(
            "expected seq {expected:?}, read stream {} seq {}",
            event.stream, event.seq
        )));
    }
    if let Some(previous) = previous {
        if validate::check_rising(event, event.seq - 1, previous).is_err() {
            return Err(corrupt(format!(
                "seq {} has lamport {} after lamport {previous}",
                event.seq, event.lamport
            )));
        }
    }
    if event.lamport > clock {
        return Err(corrupt(format!(
            "seq {} has lamport {} above the recorded clock {clock}",
            event.seq, event.lamport
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use meshlog_cursor::{StreamId, VersionVector};
    use meshlog_testkit::{seed, SplitMix64};

    use super::RoundIndex;
    use crate::{Config, Delta, Event, Replica};

    /// A delta of seeded, often hostile events near the heads: runs that
    /// start at, below or above a head, repeat or contradict held and
    /// pending events, stamp out of order, or carry floors.
    fn hostile_delta(rng: &mut SplitMix64, replica: &Replica) -> Delta {
        let mut events = Vec::new();
        for _ in 0..rng.between(1, 3) {
            let stream = StreamId::new(rng.between(1, 4));
            let head = replica.marks().get(stream);
            let mut seq = (head + 1).saturating_sub(rng.below(3)).max(1) + rng.below(2);
            if rng.chance(0.1) {
                seq += rng.between(2, 4);
            }
            for _ in 0..rng.between(1, 6) {
                // Regular, or a neighbour's stamp (equal: not rising), or any.
                let lamport = match rng.below(20) {
                    0 => (seq + rng.below(3)).saturating_sub(1) * 10 + stream.get(),
                    1 => rng.below(80),
                    _ => seq * 10 + stream.get(),
                };
                let payload = if rng.chance(0.9) {
                    Bytes::from(format!("{stream}:{seq}"))
                } else {
                    Bytes::from_static(b"other")
                };
                events.push(Event {
                    stream,
                    seq,
                    lamport,
                    time_ms: 0,
                    payload,
                });
                if rng.chance(0.9) {
                    seq += 1;
                }
            }
        }
        rng.shuffle(&mut events);
        let mut floor = VersionVector::new();
        if rng.chance(0.15) {
            let stream = StreamId::new(rng.between(1, 4));
            floor.advance(stream, replica.marks().get(stream) + rng.below(3));
        }
        Delta {
            floor_proofs: Default::default(),
            floor,
            events,
            seals: Vec::new(),
        }
    }

    /// Grouping by stream sorts by name as a sort does, whatever the
    /// interleaving, repeats and disorder of the events.
    /// `delta_for` from any marks with any budget: everything missing,
    /// stream by stream, when it fits; else the oldest missing events in
    /// `(lamport, stream)` order (every missing event stamped below the
    /// newest sent is sent), never above the budget but for one event.
    #[test]
    fn a_delta_is_everything_stream_by_stream_or_the_oldest_that_fits() {
        let seed = seed::replay_or(0xde17a);
        let mut rng = SplitMix64::new(seed);
        let ids = [9u64, 2, 40, 7];
        let mut writers: Vec<Replica> = ids
            .iter()
            .map(|&id| Replica::new(StreamId::new(id)))
            .collect();
        let mut all = Replica::new(StreamId::new(1));
        for _ in 0..600 {
            let w = rng.below(ids.len() as u64) as usize;
            let payload = vec![0u8; rng.below(300) as usize];
            writers[w].append(Bytes::from(payload)).unwrap();
            if rng.below(4) == 0 {
                let target = rng.below(ids.len() as u64) as usize;
                let delta = writers[w].delta_for(&writers[target].marks(), usize::MAX);
                writers[target].apply(&delta).unwrap();
            }
            let delta = writers[w].delta_for(&all.marks(), usize::MAX);
            all.apply(&delta).unwrap();
        }
        let key = |e: &Event| (e.lamport, e.stream);
        let everything = all.delta_for(&VersionVector::new(), usize::MAX).events;
        let mut by_lamport = everything.clone();
        by_lamport.sort_by_key(key);
        for _ in 0..200 {
            // A reader's marks somewhere below the heads, and a budget.
            let their: VersionVector = ids
                .iter()
                .map(|&id| {
                    let head = all.marks().get(StreamId::new(id));
                    (StreamId::new(id), rng.below(head + 1))
                })
                .collect();
            let missing: Vec<&Event> = by_lamport
                .iter()
                .filter(|e| e.seq > their.get(e.stream))
                .collect();
            let budget = rng.below(missing.len() as u64 * 350 + 1) as usize;
            let delta = all.delta_for(&their, budget);
            // The same events as columns, read from the chunks' columns.
            let columns = all.delta_columns_for(&their, budget);
            assert_eq!(
                columns,
                crate::DeltaColumns::from_delta(&delta),
                "seed {seed}"
            );
            assert_eq!(columns.to_delta(), delta, "seed {seed}");
            let sizes: usize = delta.events.iter().map(Event::size_hint).sum();
            assert!(
                sizes <= budget || delta.events.len() == 1,
                "within the budget, seed {seed}"
            );
            if delta.events.len() == missing.len() {
                // Everything: stream by stream, streams ascending.
                let mut names: Vec<(StreamId, u64)> =
                    missing.iter().map(|e| (e.stream, e.seq)).collect();
                names.sort_unstable();
                let got: Vec<(StreamId, u64)> =
                    delta.events.iter().map(|e| (e.stream, e.seq)).collect();
                assert_eq!(got, names, "seed {seed}");
            } else {
                // Cut: the oldest missing events (a prefix in `(lamport,
                // stream)` order), stream by stream, streams ascending.
                let mut got: Vec<&Event> = delta.events.iter().collect();
                assert!(
                    got.is_sorted_by_key(|e| (e.stream, e.seq)),
                    "stream by stream, seed {seed}"
                );
                got.sort_by_key(|e| key(e));
                assert_eq!(got, missing[..got.len()], "seed {seed}");
                assert!(!got.is_empty() || missing.is_empty(), "seed {seed}");
                // The longest such prefix: the next one would not fit.
                if let Some(next) = missing.get(got.len()) {
                    assert!(
                        sizes + next.size_hint() > budget,
                        "the next oldest fits too, seed {seed}"
                    );
                }
            }
        }
    }

    /// The digest is summed when asked: a replica asked after every step
    /// and one asked only at the end answer the same, and both the sum of
    /// the hashes of the events they hold, through appends, deltas (with
    /// floors, some above the head) and compactions.
    #[test]
    fn a_digest_summed_when_asked_is_the_sum_of_what_is_held() {
        let seed = seed::replay_or(0xd1_6e57);
        let mut rng = SplitMix64::new(seed);
        let ids = [4u64, 11, 30];
        let mut writers: Vec<Replica> = ids
            .iter()
            .map(|&id| Replica::new(StreamId::new(id)))
            .collect();
        let mut asked = Replica::new(StreamId::new(1));
        let mut unasked = Replica::new(StreamId::new(1));
        let held_sum = |replica: &Replica| {
            let mut digest = crate::Digest::default();
            for event in replica.delta_for(&VersionVector::new(), usize::MAX).events {
                digest.add(&event);
            }
            digest
        };
        for step in 0..600 {
            let w = rng.below(ids.len() as u64) as usize;
            match rng.below(10) {
                0 | 1 => {
                    // A writer compacts (so its deltas carry floors).
                    let head = writers[w].marks().get(StreamId::new(ids[w]));
                    let target: VersionVector = [(StreamId::new(ids[w]), rng.below(head + 1))]
                        .into_iter()
                        .collect();
                    writers[w].compact(&target).unwrap();
                }
                2 => {
                    // The readers compact somewhere below their heads.
                    let target: VersionVector = ids
                        .iter()
                        .map(|&id| {
                            let head = asked.marks().get(StreamId::new(id));
                            (StreamId::new(id), rng.below(head + 1))
                        })
                        .collect();
                    asked.compact(&target).unwrap();
                    unasked.compact(&target).unwrap();
                }
                _ => {
                    for _ in 0..rng.below(5) {
                        writers[w]
                            .append(Bytes::from(vec![step as u8; 20]))
                            .unwrap();
                    }
                    let delta = writers[w].delta_for(&asked.marks(), rng.below(3000) as usize);
                    asked.apply(&delta).unwrap();
                    unasked.apply(&delta).unwrap();
                }
            }
            assert_eq!(asked.digest(), held_sum(&asked), "step {step}, seed {seed}");
        }
        assert_eq!(unasked.marks(), asked.marks(), "seed {seed}");
        assert_eq!(unasked.digest(), asked.digest(), "seed {seed}");
        assert_eq!(unasked.digest(), held_sum(&unasked), "seed {seed}");
        assert!(asked.digest().events > 0, "seed {seed}");
        unasked.verify().unwrap();
    }

    #[test]
    fn events_are_sorted_by_name() {
        let seed = seed::replay_or(0x50_47ed);
        let mut rng = SplitMix64::new(seed);
        for case in 0..500 {
            let mut heads = [0u64; 5];
            let mut events = Vec::new();
            for _ in 0..rng.below(60) {
                let stream = rng.below(5) as usize;
                let seq = match rng.below(30) {
                    0 => rng.below(heads[stream] + 2),
                    _ => {
                        heads[stream] += 1 + u64::from(rng.chance(0.1));
                        heads[stream]
                    }
                };
                events.push(Event {
                    stream: StreamId::new(stream as u64 * 3),
                    seq,
                    lamport: 0,
                    time_ms: 0,
                    payload: Bytes::new(),
                });
            }
            let got: Vec<(StreamId, u64)> = super::validate::sorted_by_name(&events)
                .iter()
                .map(|event| (event.stream, event.seq))
                .collect();
            let mut expected: Vec<(StreamId, u64)> = events
                .iter()
                .map(|event| (event.stream, event.seq))
                .collect();
            expected.sort_unstable();
            assert_eq!(got, expected, "case {case}, seed {seed}");
        }
    }

    /// Checking clean runs as runs answers exactly what checking every
    /// event one by one answers, error included, on seeded hostile deltas
    /// against states with held and pending events, alone and after an
    /// earlier delta of the same round.
    #[test]
    fn runs_are_validated_as_event_by_event_validation_would() {
        seed::for_each_seed("runs_validated_as_events", 0x7_2e45, 40, |seed| {
            let mut rng = SplitMix64::new(seed);
            let mut config = Config::new(StreamId::new(1));
            config.recover_own_stream = rng.chance(0.2);
            let mut replica = Replica::open(config, crate::MemStore::default()).unwrap();
            let (mut fast, mut slow) = (0, 0);
            for step in 0..300 {
                let delta = hostile_delta(&mut rng, &replica);
                let earlier = hostile_delta(&mut rng, &replica);
                let round = if rng.chance(0.3) {
                    replica
                        .state
                        .index_after(&[super::RoundItem::Delta(&earlier)])
                } else {
                    RoundIndex::default()
                };
                let runs = replica.state.validate_with(&delta, &round, true);
                let events = replica.state.validate_with(&delta, &round, false);
                assert_eq!(
                    format!("{runs:?}"),
                    format!("{events:?}"),
                    "step {step}: {delta:?}"
                );
                // (A round's floors can let a delta pass that alone fails.)
                if runs.is_ok() && replica.apply(&delta).is_ok() {
                    fast += 1;
                } else {
                    slow += 1;
                }
            }
            // Both outcomes are exercised.
            assert!(fast > 20 && slow > 20, "accepted {fast}, refused {slow}");
        });
    }
}
