//! Forks: a writer's equivocation with valid signatures detected, its
//! proof kept, the stream frozen (`docs/SIGNING.md`, "Equivocation with
//! valid signatures").
//!
//! **Detected** in the one validator ([`State::check_forks`], asked before
//! the seals are judged): a delta's sealed run of a pinned stream, under
//! the pinned key, that carries its `base` (the chain hash below its first
//! seq) is a second history when, chained from that base, it passes a
//! seal the receiver keeps (at or above the base's seq, at or below the
//! run's seal) over another hash, and reaches its own seal, which
//! verifies. Then the two seals are two signed histories: the delta is
//! refused [`DeltaError::Forked`] carrying a [`ForkProof`]. A run without
//! a base, or that does not reach its seal, or whose seal does not verify,
//! proves nothing about the writer (a relay may have forged it) and stays
//! a plain refusal (`ChainBroken`, `BadSeal`, `Equivocation`). The own
//! stream is never judged here: its key is this replica's.
//!
//! **Kept**: the planner puts a refused delta's proof in the round's batch
//! (the first per stream), the store records it, publishing keeps it.
//!
//! **Frozen**: a stream with a proof takes no event above its head any
//! more ([`DeltaError::Frozen`]); what it held stays held and readable.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use meshlog_cursor::StreamId;

use super::held::State;
use super::validate::{Rejection, RoundIndex};
use crate::{
    Batch, Cut, Delta, DeltaColumns, DeltaError, Event, ForkBranch, ForkProof, Limit, ReplicaError,
    RunSeal, Seal,
};

impl State {
    /// The fork rules for `delta`, as the round leaves the state: a run of
    /// a frozen stream above its head is refused [`DeltaError::Frozen`];
    /// a sealed run that proves a fork is refused [`DeltaError::Forked`]
    /// with the proof.
    pub(super) fn check_forks(&self, delta: &Delta, round: &RoundIndex) -> Result<(), Rejection> {
        if !self.forks.is_empty() || !round.forked.is_empty() {
            self.check_frozen(delta, round)?;
        }
        if self.kept_seals.is_empty() && round.seals.is_empty() {
            return Ok(());
        }
        for run_seal in &delta.seals {
            let stream = run_seal.seal.stream;
            if stream == self.config.stream || self.frozen(stream, round) {
                continue;
            }
            if let Some(proof) = self.fork_of(delta, run_seal, round) {
                let seq = proof.seq;
                tracing::warn!(%stream, seq, key = %run_seal.key, "a writer signed two histories of its stream: the stream is frozen");
                let rule = DeltaError::Forked {
                    stream,
                    seq,
                    head: self.round_head(stream, round),
                    proof: Box::new(proof),
                };
                return Err(rejection(stream, seq..=run_seal.seal.seq, rule));
            }
        }
        Ok(())
    }

    /// The cuts of the frozen streams of `columns` (what
    /// [`State::check_frozen`] refuses), where `cuts` has none yet: each
    /// from its head + 1, the seal with it.
    pub(super) fn frozen_cuts(&self, columns: &DeltaColumns, cuts: &mut BTreeMap<StreamId, Cut>) {
        if self.forks.is_empty() {
            return;
        }
        for run in columns.runs() {
            let stream = run.stream;
            let head = self.log.head(stream);
            if self.forks.contains_key(&stream) && run.last_seq() > head {
                cuts.entry(stream).or_insert(Cut {
                    stream,
                    from_seq: head + 1,
                    limit: Limit::Frozen { head },
                });
            }
        }
    }

    /// Whether `stream` is frozen as the round leaves it: a proof is kept,
    /// or a delta refused earlier in the round proved it forked.
    fn frozen(&self, stream: StreamId, round: &RoundIndex) -> bool {
        self.forks.contains_key(&stream) || round.forked.contains(&stream)
    }

    /// The head of `stream` as the round leaves it.
    fn round_head(&self, stream: StreamId, round: &RoundIndex) -> u64 {
        round.head(stream).unwrap_or_else(|| self.log.head(stream))
    }

    /// No event of a frozen stream above its head (as the round leaves it).
    fn check_frozen(&self, delta: &Delta, round: &RoundIndex) -> Result<(), Rejection> {
        for event in &delta.events {
            if !self.frozen(event.stream, round) {
                continue;
            }
            let stream = event.stream;
            let head = self.round_head(stream, round);
            if event.seq > head {
                let rule = DeltaError::Frozen { stream, head };
                return Err(rejection(stream, event.seq..=event.seq, rule));
            }
        }
        Ok(())
    }

    /// The proof that `run_seal`'s run of `delta` and a seal kept (as the
    /// round leaves the seals kept and the keys pinned) are two histories
    /// (see the module docs), if it is one.
    fn fork_of(&self, delta: &Delta, run_seal: &RunSeal, round: &RoundIndex) -> Option<ForkProof> {
        let seal = run_seal.seal;
        let stream = seal.stream;
        let base = run_seal.base?;
        let pinned = self.pinned.get(&stream).or(round.sealed.get(&stream));
        if pinned != Some(&run_seal.key) {
            return None;
        }
        let kept = match round.seals.get(&stream) {
            Some(kept) => &kept.seals,
            None => self.kept_seals.get(&stream)?,
        };
        let run: Vec<&Event> = delta.events.iter().filter(|e| e.stream == stream).collect();
        let below = run.first()?.seq.checked_sub(1)?;
        let consecutive = run.iter().zip(below + 1..).all(|(e, seq)| e.seq == seq);
        if !consecutive || run.last()?.seq != seal.seq {
            return None;
        }
        let within = |k: &&Seal| k.seq >= below && k.seq <= seal.seq;
        // The common case, a run from the receiver's sealed head: its base
        // is the kept seal's hash, and nothing is hashed here.
        if kept
            .iter()
            .filter(within)
            .all(|k| k.seq == below && k.head == base)
        {
            return None;
        }
        // `hashes[i]`: the run's chain hash at `below + i`.
        let mut hashes = Vec::with_capacity(run.len() + 1);
        hashes.push(base);
        for event in &run {
            let next = hashes[hashes.len() - 1].next(event);
            hashes.push(next);
        }
        let binding = self.config.membership.binding(stream);
        if hashes.last() != Some(&seal.head)
            || seal.verify_bound(&run_seal.key, binding.as_ref()).is_err()
        {
            return None;
        }
        let other = kept
            .iter()
            .filter(within)
            .rev()
            .find(|k| hashes[(k.seq - below) as usize] != k.head)?;
        let at = (other.seq - below) as usize;
        let proof = ForkProof {
            key: run_seal.key,
            seq: other.seq,
            branches: [
                ForkBranch {
                    seal: *other,
                    hash_at: other.head,
                    events: Vec::new(),
                },
                ForkBranch {
                    seal,
                    hash_at: hashes[at],
                    events: run[at..].iter().map(|&e| e.clone()).collect(),
                },
            ],
        };
        checked(proof, binding.as_ref())
    }

    /// Keeps the proofs a committed batch recorded (the first per stream).
    pub(crate) fn publish_forks(&mut self, batch: &Batch) {
        for proof in &batch.forks {
            self.forks
                .entry(proof.stream())
                .or_insert_with(|| proof.clone());
        }
    }

    /// The proofs kept, by stream.
    pub(crate) fn forks(&self) -> Vec<ForkProof> {
        self.forks.values().cloned().collect()
    }

    /// The proofs kept, by stream, but those of `streams`.
    pub(crate) fn forks_except(
        &self,
        streams: &std::collections::BTreeSet<StreamId>,
    ) -> Vec<ForkProof> {
        let others = self
            .forks
            .iter()
            .filter(|(stream, _)| !streams.contains(stream));
        others.map(|(_, proof)| proof.clone()).collect()
    }

    /// The batch that keeps `proof` (received, not found here), or `None`
    /// where a proof of its stream is kept already; refused where it does
    /// not prove a fork of its stream by the stream's key, or is of the
    /// own stream ([`State::judge_proof`]).
    pub(crate) fn fork_batch(
        &self,
        proof: &ForkProof,
    ) -> Result<Option<Batch<'static>>, ReplicaError> {
        let stream = proof.stream();
        match self.judge_proof(proof) {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(error) => {
                tracing::warn!(%stream, %error, "a fork proof is refused");
                return Err(error.into());
            }
        }
        tracing::warn!(%stream, seq = proof.seq, "a proof that a writer signed two histories of its stream: the stream is frozen");
        let mut batch = Batch::default().with_clock(self.clock);
        batch.forks.push(proof.clone());
        Ok(Some(batch))
    }

    /// Whether a proof of `proof`'s stream may be kept (checked against the
    /// stream's key): `Ok(true)` when it is new and proves a fork of a
    /// stream other than the own, `Ok(false)` when one is kept already.
    pub(crate) fn judge_proof(&self, proof: &ForkProof) -> Result<bool, crate::ForkError> {
        let stream = proof.stream();
        let binding = self.config.membership.binding(stream);
        proof.verify(binding.as_ref())?;
        if stream == self.config.stream {
            tracing::error!(%stream, seq = proof.seq, "a valid proof that this replica's own stream forked: its key signed two histories, so it may have leaked; the stream is not frozen");
            return Err(crate::ForkError::OwnStream { stream });
        }
        let pinned = self.pinned.get(&stream);
        if pinned.is_some_and(|key| *key != proof.key) {
            return Err(crate::SealError::KeyMismatch {
                stream,
                derived: proof.key.stream(),
            }
            .into());
        }
        Ok(!self.forks.contains_key(&stream))
    }
}

/// The proof, if it verifies and fits its bounds (a run too long for one
/// is logged and stays a plain refusal).
fn checked(proof: ForkProof, binding: Option<&crate::Binding>) -> Option<ForkProof> {
    let stream = proof.stream();
    let events = proof.branches[1].events.len();
    if events > ForkProof::EVENTS_MAX || proof.encoded_len() > ForkProof::BYTES_MAX {
        tracing::warn!(%stream, seq = proof.seq, events, "a fork's proof would exceed its bounds: refused without a proof");
        return None;
    }
    match proof.verify(binding) {
        Ok(()) => Some(proof),
        Err(error) => {
            tracing::error!(%stream, %error, "a fork's proof built here does not verify");
            None
        }
    }
}

fn rejection(stream: StreamId, seqs: RangeInclusive<u64>, rule: DeltaError) -> Rejection {
    Rejection {
        stream,
        seqs,
        rule: ReplicaError::from(rule),
    }
}
