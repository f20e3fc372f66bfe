//! Seals kept and seals sent (`docs/SIGNING.md`, "Seals").
//!
//! **Kept.** Per stream received sealed, the key pinned and the seals
//! held at and below its head ([`KeptSeals`]), thinned. They move in one
//! place, as the chains do: just before a batch goes to the store,
//! [`State::seals_after`] computes each moved stream's seals after it (a
//! round's accepted seal is kept where it is at its stream's head after
//! the batch, over the chain hash there; a floor drops the seals at or
//! below it), the store records them with the batch, and publishing keeps
//! them ([`State::publish_seals`]). Opening takes what the store recorded.
//!
//! **Sent.** A delta's run of a stream ends where the sender can seal it
//! ([`State::seal_runs`]): the own stream anywhere (the writer signs the
//! chain hash at the cut, chained from the nearest hash it knows below,
//! [`State::own_hash_at`]); a relayed stream at the highest kept seal
//! within the run, else, for the stream of the delta's oldest event,
//! extended to the lowest kept seal above it (over the budget: a
//! receiver must progress), else left out of this delta.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use meshlog_cursor::StreamId;

use super::held::State;
use super::plan::Plan;
use crate::columns::RunColumns;
use crate::mem::ReadError;
use crate::store::BatchPart;
use crate::{
    Batch, ChainHash, DeltaColumns, Event, KeptSeals, ReplicaError, RunSeal, Seal, WriterKey,
};

/// The most own-stream chain hashes kept below the head
/// ([`State::own_hashes`](State)): beyond it, every other one is dropped.
const OWN_HASHES_MAX: usize = 256;

/// How a delta's run of one stream ends, sealed.
enum RunEnd {
    /// As built: sealed (or unsealed, a stream nobody sealed).
    Keep(Option<RunSeal>),
    /// Cut back to the seal's seq.
    Cut(RunSeal),
    /// Extended to the seal's seq.
    Extend(RunSeal),
    /// Left out of this delta.
    Drop,
}

impl State {
    /// Records a commit's chains and seals in its batch: what the store
    /// records with it and publishing keeps.
    pub(crate) fn prepare_commit(&self, plan: &mut Plan<'_>) -> Result<(), ReplicaError> {
        (plan.batch.chains, plan.batch.hashed) = self.chains_after(
            &plan.batch,
            (&plan.held_seals, &plan.chained_seals),
            &plan.statements,
        )?;
        let noted = (&plan.kept_seals, plan.seals_noted);
        plan.batch.seals = self.seals_after(&plan.batch, &plan.seals, noted);
        plan.batch.statements = self.statements_after(&plan.batch, &plan.statements);
        Ok(())
    }

    /// Per stream whose kept seals `batch` moves (the round's accepted
    /// `run_seals`, or a floor over kept seals), ascending, its pin and
    /// seals after the batch. Needs the batch's chains. `noted`: the
    /// seals the planner kept already for the first of `run_seals`, delta
    /// by delta as one by one ([`Plan::kept_seals`]), and how many; the
    /// rest (the round's last delta's) are kept here, at the head after
    /// the batch.
    pub(crate) fn seals_after(
        &self,
        batch: &Batch,
        run_seals: &[RunSeal],
        noted: (&BTreeMap<StreamId, KeptSeals>, usize),
    ) -> Vec<(StreamId, KeptSeals)> {
        let (kept_by_round, noted) = noted;
        let mut moved: BTreeMap<StreamId, KeptSeals> = kept_by_round.clone();
        for run_seal in &run_seals[noted..] {
            let seal = run_seal.seal;
            let kept = self.kept_entry(&mut moved, seal.stream, run_seal.key);
            let (_, head) = bounds_after(self, batch, seal.stream);
            let head_hash = batch
                .chain(seal.stream)
                .copied()
                .or_else(|| self.chain(seal.stream))
                .map(|chain| chain.head_hash);
            if seal.seq == head && head_hash == Some(seal.head) {
                kept.seals.retain(|old| old.seq < seal.seq);
                kept.seals.push(seal);
            }
        }
        for &(stream, _) in &batch.floors {
            if let Some(&key) = self.pinned.get(&stream) {
                self.kept_entry(&mut moved, stream, key);
            }
        }
        for (&stream, kept) in &mut moved {
            let (floor, head) = bounds_after(self, batch, stream);
            kept.thin(floor, head);
        }
        moved.into_iter().collect()
    }

    /// `stream`'s entry in `moved`, from what the state keeps (pinned to
    /// `key` if nothing is pinned yet).
    fn kept_entry<'m>(
        &self,
        moved: &'m mut BTreeMap<StreamId, KeptSeals>,
        stream: StreamId,
        key: crate::WriterPublicKey,
    ) -> &'m mut KeptSeals {
        moved.entry(stream).or_insert_with(|| KeptSeals {
            key: self.pinned.get(&stream).copied().unwrap_or(key),
            seals: self.kept_seals.get(&stream).cloned().unwrap_or_default(),
        })
    }

    /// Keeps the seals a committed batch recorded.
    pub(crate) fn publish_seals(&mut self, batch: &Batch) {
        for (stream, kept) in &batch.seals {
            self.pinned.insert(*stream, kept.key);
            self.kept_seals.insert(*stream, kept.seals.clone());
        }
    }

    /// Takes the seals the store recorded: a seal at the head over another
    /// hash than the chain's (a damaged record) is dropped and logged.
    pub(super) fn load_seals(&mut self, recorded: &BTreeMap<StreamId, KeptSeals>) {
        for (&stream, kept) in recorded {
            let mut kept = kept.clone();
            let floor = self.floor.get(stream);
            let head = self.marks.get(stream);
            kept.thin(floor, head);
            let head_hash = self.chain(stream).map(|chain| chain.head_hash);
            kept.seals.retain(|seal| {
                let agrees = seal.seq != head || Some(seal.head) == head_hash;
                if !agrees {
                    tracing::warn!(%stream, seq = seal.seq, "a recorded seal at the head is over another chain hash: dropped");
                }
                agrees && seal.stream == stream
            });
            self.kept_seals.insert(stream, kept.seals);
        }
    }

    /// Seals the runs of a delta's `events` (grouped by stream, streams
    /// ascending, each run from the receiver's mark), cutting, extending
    /// or leaving out the runs of sealed streams so that each ends where
    /// a seal is held (see the module docs); the seals, by stream. Fails
    /// where reading the held events a run is extended by fails: the
    /// delta is not answered without the run (shorter, it would hide the
    /// fault, and the run of its oldest event is what lets a receiver
    /// progress), as [`State::delta_for`] answers any read that fails.
    pub(super) fn seal_runs(&self, events: &mut Vec<Event>) -> Result<Vec<RunSeal>, ReadError> {
        if self.config.key.is_none() && self.kept_seals.is_empty() {
            return Ok(Vec::new());
        }
        let runs: Vec<&[Event]> = events.chunk_by(|a, b| a.stream == b.stream).collect();
        // The stream of the delta's oldest event, in (lamport, stream)
        // order: its run is never left out, so every delta progresses.
        let oldest = runs
            .iter()
            .map(|run| (run[0].lamport, run[0].stream))
            .min()
            .map(|(_, stream)| stream);
        let ends: Vec<RunEnd> = runs
            .iter()
            .map(|run| self.run_end(run, Some(run[0].stream) == oldest))
            .collect();
        if ends.iter().all(|end| matches!(end, RunEnd::Keep(_))) {
            return Ok(ends
                .into_iter()
                .filter_map(|end| match end {
                    RunEnd::Keep(seal) => seal,
                    _ => None,
                })
                .collect());
        }
        let mut sealed = Vec::with_capacity(events.len());
        let mut seals = Vec::new();
        for (run, end) in runs.iter().zip(ends) {
            match end {
                RunEnd::Keep(seal) => {
                    sealed.extend_from_slice(run);
                    seals.extend(seal);
                }
                RunEnd::Cut(seal) => {
                    let len = (seal.seal.seq - run[0].seq + 1) as usize;
                    sealed.extend_from_slice(&run[..len]);
                    seals.push(seal);
                }
                RunEnd::Extend(seal) => {
                    sealed.extend_from_slice(run);
                    self.read_more(run, seal.seal.seq, &mut sealed)?;
                    seals.push(seal);
                }
                RunEnd::Drop => {}
            }
        }
        *events = sealed;
        Ok(seals)
    }

    /// Reads `stream`'s events after `run` up to `last` into `out`, all of
    /// them, or the read error.
    fn read_more(&self, run: &[Event], last: u64, out: &mut Vec<Event>) -> Result<(), ReadError> {
        let stream = run[0].stream;
        let first = run[run.len() - 1].seq + 1;
        let before = out.len();
        let source = self.log.source();
        let mut used = 0;
        source
            .get()
            .read_into(stream, first, last, usize::MAX, &mut used, out)?;
        super::delta::read_whole(stream, first, last, out.len() - before)
    }

    /// How `run` (a delta's events of one stream, from the receiver's
    /// mark) ends: `oldest` says it holds the delta's oldest event.
    fn run_end(&self, run: &[Event], oldest: bool) -> RunEnd {
        let stream = run[0].stream;
        let (first, last) = (run[0].seq, run[run.len() - 1].seq);
        if stream == self.config.stream && self.config.key.is_some() {
            return RunEnd::Keep(self.own_cut_seal(run));
        }
        let (Some(kept), Some(&key)) = (self.kept_seals.get(&stream), self.pinned.get(&stream))
        else {
            return RunEnd::Keep(None);
        };
        let run_seal = |seal: Seal| RunSeal {
            key,
            seal,
            base: self.base_for(stream, first),
        };
        let within = kept
            .iter()
            .rev()
            .find(|seal| seal.seq >= first && seal.seq <= last);
        match within {
            Some(&seal) if seal.seq == last => RunEnd::Keep(Some(run_seal(seal))),
            Some(&seal) => RunEnd::Cut(run_seal(seal)),
            None => match kept.iter().find(|seal| seal.seq > last) {
                Some(&seal) if oldest => RunEnd::Extend(run_seal(seal)),
                Some(_) => RunEnd::Drop,
                // No seal held above: the stream is sent as held (a
                // receiver that pinned it refuses it, and asks another).
                None => RunEnd::Keep(None),
            },
        }
    }

    /// The chain hash below `first` that a run of `stream` starting there
    /// carries as its `base`, where it is known without reading: the
    /// floor's, when the run starts right after it and the stream is
    /// anchored there; a kept seal's hash there; for the own stream, a
    /// hash kept there or its last seal's. A receiver anchors on it
    /// after its floor, and compares it with a seal it keeps there to
    /// find a fork (`state/forks.rs`).
    fn base_for(&self, stream: StreamId, first: u64) -> Option<ChainHash> {
        let floor = self.floor.get(stream);
        let chain = self.chains.get(&stream)?;
        let below = first.checked_sub(1)?;
        if below == floor {
            return (floor > 0 && chain.anchored).then_some(chain.floor_hash);
        }
        let kept = self.kept_seals.get(&stream).into_iter().flatten();
        if let Some(seal) = kept.into_iter().find(|seal| seal.seq == below) {
            return Some(seal.head);
        }
        if stream != self.config.stream || self.config.key.is_none() {
            return None;
        }
        let hashes = self
            .own_hashes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let last_seal = *self.own_seal.lock().unwrap_or_else(PoisonError::into_inner);
        hashes.get(&below).copied().or(last_seal
            .filter(|seal| seal.seq == below)
            .map(|seal| seal.head))
    }

    /// The seal of a run of the own stream (its events, consecutive): at
    /// the head, the own seal ([`State::own_seal`]); below, signed now
    /// over the chain hash at the run's end ([`State::own_hash_at`]).
    fn own_cut_seal(&self, run: &[Event]) -> Option<RunSeal> {
        let key = self.config.key.as_ref()?;
        let stream = self.config.stream;
        let (first, last) = (run.first()?.seq, run.last()?.seq);
        if last == self.marks.get(stream) {
            return self.own_cut_seal_at_head(first);
        }
        let hash = self.own_hash_at(first, last, |hash, skip| {
            let rest = run.get(skip..)?;
            Some(rest.iter().fold(hash, |hash, event| hash.next(event)))
        })?;
        Some(self.own_seal_below(key, first, last, hash))
    }

    /// [`State::own_cut_seal`] for a run in columns that ends below the
    /// head: sealed where the hash known nearest below the run's end is at
    /// its start or its end (a receiver syncing delta by delta); `None`
    /// otherwise, and the caller builds the delta as events.
    fn own_columns_seal(&self, run: &RunColumns<'_>) -> Option<RunSeal> {
        let key = self.config.key.as_ref()?;
        let (first, last) = (run.first_seq, run.last_seq());
        let hash = self.own_hash_at(first, last, |hash, skip| match skip {
            0 => Some(super::chain::chain_columns(hash, run)),
            skip if skip == run.len() => Some(hash),
            _ => None,
        })?;
        Some(self.own_seal_below(key, first, last, hash))
    }

    /// The own stream's run `first..=last`, below the head, sealed over
    /// `hash`, the chain hash at `last`: one signature.
    fn own_seal_below(&self, key: &WriterKey, first: u64, last: u64, hash: ChainHash) -> RunSeal {
        let stream = self.config.stream;
        self.seals_signed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RunSeal {
            key: key.public(),
            seal: Seal::sign_for(key, stream, last, hash),
            base: self.base_for(stream, first),
        }
    }

    /// The own stream's chain hash at `last`, the end of a run
    /// `first..=last` below the head: chained from the nearest hash known
    /// at or below its end (one kept, or the floor's), through the held
    /// events up to the run (read back only where that hash is below the
    /// run's start) and the run's own, which `chain_run` hashes from the
    /// hash given, its first `skip` events skipped (`None`: it cannot).
    /// The hashes at the run's start and end are kept, so a receiver's
    /// next delta (from the end) chains from there and reads nothing more;
    /// a delta to a receiver elsewhere reads at most the gap from the
    /// nearest hash kept.
    fn own_hash_at(
        &self,
        first: u64,
        last: u64,
        chain_run: impl FnOnce(ChainHash, usize) -> Option<ChainHash>,
    ) -> Option<ChainHash> {
        let stream = self.config.stream;
        let floor = self.floor.get(stream);
        let chain = self.chains.get(&stream)?;
        let mut hashes = self
            .own_hashes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (mut from, mut hash) = hashes
            .range(floor..=last)
            .next_back()
            .map_or((floor, chain.floor_hash), |(&seq, &hash)| (seq, hash));
        let below = first - 1;
        if from < below {
            hash = match self.chain_through(stream, hash, from, below) {
                Ok(hash) => hash,
                Err(error) => {
                    tracing::error!(%stream, %error, "reading the own stream to seal a cut failed");
                    return None;
                }
            };
            from = below;
            hashes.insert(below, hash);
        }
        let skip = usize::try_from(from - below).ok()?;
        hash = chain_run(hash, skip)?;
        hashes.insert(last, hash);
        hashes.retain(|&seq, _| seq >= floor);
        if hashes.len() > OWN_HASHES_MAX {
            // Every other one, the newest kept: the spacing doubles.
            let older: Vec<u64> = hashes.keys().rev().skip(1).step_by(2).copied().collect();
            for seq in older {
                hashes.remove(&seq);
            }
        }
        Some(hash)
    }

    /// The seals of a delta in columns whose runs all end where they can be
    /// sealed as they are; `None` where a run must be cut, extended or
    /// left out (the caller builds the delta as events then).
    pub(super) fn columns_seals(&self, columns: &DeltaColumns) -> Option<Vec<RunSeal>> {
        let mut seals = Vec::new();
        let mut own = None;
        for run in columns.run_parts() {
            let stream = run.stream;
            let first = run.first_seq;
            let last = run.last_seq();
            if stream == self.config.stream && self.config.key.is_some() {
                own = Some(run);
                continue;
            }
            let Some(kept) = self.kept_seals.get(&stream) else {
                continue;
            };
            match kept.iter().find(|seal| seal.seq >= last) {
                Some(seal) if seal.seq == last => seals.push(RunSeal {
                    key: *self.pinned.get(&stream)?,
                    seal: *seal,
                    base: self.base_for(stream, first),
                }),
                Some(_) => return None,
                None if kept.iter().any(|seal| seal.seq >= first) => return None,
                None => {}
            }
        }
        // Signed last, once every other run is known to end at a seal: a
        // delta built as events after all would sign it again.
        if let Some(run) = own {
            if run.last_seq() == self.marks.get(self.config.stream) {
                seals.extend(self.own_cut_seal_at_head(run.first_seq));
            } else {
                seals.push(self.own_columns_seal(&run)?);
            }
        }
        seals.sort_unstable_by_key(|s| s.seal.stream);
        Some(seals)
    }

    /// The own stream's run from `first` to its head, sealed.
    fn own_cut_seal_at_head(&self, first: u64) -> Option<RunSeal> {
        let key = self.config.key.as_ref()?;
        let base = self.base_for(self.config.stream, first);
        Some(RunSeal {
            key: key.public(),
            seal: self.own_seal()?,
            base,
        })
    }
}

/// `stream`'s floor and head after `batch` (its floors, then its events).
fn bounds_after(state: &State, batch: &Batch, stream: StreamId) -> (u64, u64) {
    let mut floor = state.floor.get(stream);
    let mut head = state.log.head(stream).max(floor);
    for &(of, floor_seq) in &batch.floors {
        if of == stream {
            floor = floor.max(floor_seq);
            head = head.max(floor_seq);
        }
    }
    for part in batch.parts() {
        let last = match part {
            BatchPart::Events(events) => events.iter().rfind(|e| e.stream == stream).map(|e| e.seq),
            BatchPart::Columns(run) => (run.stream == stream).then(|| run.last_seq()),
        };
        head = head.max(last.unwrap_or(0));
    }
    (floor, head)
}
