//! The chain heads: per stream, the chain hash at its floor and at its
//! head (`docs/SIGNING.md`, "Hash chain"; [`StreamChain`]).
//!
//! They move in one place, the commit: just before a batch goes to the
//! store, [`State::chains_after`] computes each touched stream's chain
//! after it (every event of the batch hashed once; the events a floor
//! drops read back only when the floor is at or below the held head), the
//! store records them with the floor and head, and publishing keeps them
//! ([`State::publish_chains`]). Opening takes what the store recorded
//! (chaining again, from the floor, a stream it has none for), and
//! [`State::verify_chains`] recomputes every held chain.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use meshlog_cursor::StreamId;

use super::held::State;
use crate::error::read_error;
use crate::store::BatchPart;
use crate::{Batch, ChainDigest, ChainHash, Event, ReplicaError, StreamChain, StreamHead};

/// A stream's chain as a batch moves it.
struct Moving {
    chain: StreamChain,
    floor: u64,
    head: u64,
    /// The seq `chain.head_hash` is at: `head`, or below it while the
    /// stream is hashed lazily.
    hashed: u64,
    /// Whether the stream is hashed at every commit (the own keyed
    /// stream, a pinned one, one the round seals): [`State::eager`].
    eager: bool,
}

impl State {
    /// Per stream `batch` touches, ascending, its chain after the batch:
    /// its floors first (a store deletes below them before it adds the
    /// events), then its events in order; and, per stream whose chain is
    /// left below its head (hashed lazily: [`State::eager`] says which are
    /// not), the seq its head hash is at. A floor at or below the held
    /// head chains through the held events it drops (read back); a floor
    /// above it chains through the events of the round it erased, and
    /// where those do not reach it (a peer's floor above everything held)
    /// the stream is unanchored from there ([`StreamChain::rooted`]).
    /// Fails only if reading held events fails (a store on disk).
    ///
    /// A stream unanchored where the batch's events start (nothing held
    /// above its floor) is anchored by a `base` of the round's accepted
    /// `seals` (`docs/SIGNING.md`, "Unanchored streams") when the batch's
    /// events chain from that base to the seal's hash, and one left
    /// unanchored at the floor of one of the round's accepted
    /// `statements` by the statement's hash. `seals` are the round's
    /// accepted seals whose run it holds, and of those the ones the
    /// validator chained from the head hash (`Plan::chained_seals`): a
    /// run ending at one of those takes its hash without hashing again.
    #[allow(clippy::type_complexity)]
    pub(crate) fn chains_after(
        &self,
        batch: &Batch,
        (seals, chained): (&[crate::RunSeal], &[crate::RunSeal]),
        statements: &[crate::SignedCompaction],
    ) -> Result<(Vec<(StreamId, StreamChain)>, Vec<(StreamId, u64)>), ReplicaError> {
        let mut moving: BTreeMap<StreamId, Moving> = BTreeMap::new();
        self.floors_after(&mut moving, batch, seals)?;
        self.anchor_statements(&mut moving, seals, statements)?;
        for run_seal in seals {
            if run_seal.base.is_some() && batch.touched().contains(&run_seal.seal.stream) {
                self.anchor(&mut moving, batch, run_seal, seals)?;
            }
        }
        self.events_after(&mut moving, batch, (seals, chained))?;
        // An eager stream the batch moved by a floor alone (no events to
        // catch it up) that was hashed lazily until now.
        for (&stream, at) in moving.iter_mut().filter(|(_, at)| at.eager) {
            if at.hashed < at.head && at.head <= self.bounds(stream).1 {
                self.catch_up(stream, at)?;
            }
        }
        let hashed = moving
            .iter()
            .filter(|(_, at)| at.hashed < at.head)
            .map(|(&stream, at)| (stream, at.hashed))
            .collect();
        let chains = moving
            .into_iter()
            .map(|(stream, at)| (stream, at.chain))
            .collect();
        Ok((chains, hashed))
    }

    /// [`State::chains_after`]'s floors: each raised floor moves its
    /// stream's chain (see there).
    fn floors_after(
        &self,
        moving: &mut BTreeMap<StreamId, Moving>,
        batch: &Batch,
        seals: &[crate::RunSeal],
    ) -> Result<(), ReplicaError> {
        for &(stream, floor_seq) in &batch.floors {
            let at = self.moving(moving, stream, seals);
            if floor_seq <= at.floor {
                continue;
            }
            if floor_seq <= at.head && at.hashed <= floor_seq {
                // Hashed lazily below the floor: the hash there is the
                // chain's, read through the events the floor drops.
                at.chain.head_hash =
                    self.chain_through(stream, at.chain.head_hash, at.hashed, floor_seq)?;
                at.chain.floor_hash = at.chain.head_hash;
                at.hashed = floor_seq;
            } else if floor_seq <= at.head {
                at.chain.floor_hash =
                    self.chain_through(stream, at.chain.floor_hash, at.floor, floor_seq)?;
            } else {
                self.catch_up(stream, at)?;
                erased_through(at, stream, floor_seq, batch.erased());
                at.hashed = floor_seq;
            }
            at.floor = floor_seq;
        }
        Ok(())
    }

    /// [`State::chains_after`]'s events: each run moves its stream's head,
    /// and its head hash where the stream is hashed at every commit.
    fn events_after(
        &self,
        moving: &mut BTreeMap<StreamId, Moving>,
        batch: &Batch,
        (seals, chained): (&[crate::RunSeal], &[crate::RunSeal]),
    ) -> Result<(), ReplicaError> {
        for part in batch.parts() {
            match part {
                BatchPart::Events(events) => {
                    for run in events.chunk_by(|a, b| a.stream == b.stream) {
                        let at = self.moving(moving, run[0].stream, seals);
                        assert_eq!(
                            Some(run[0].seq),
                            at.head.checked_add(1),
                            "a batch's run follows its stream's head"
                        );
                        let (stream, last) = (run[0].stream, run[run.len() - 1].seq);
                        if at.eager {
                            let sealed = checked_seal(batch, chained, stream, last, at);
                            self.hash_run(stream, at, last, sealed, |hash| hash.extend(run))?;
                        }
                        at.head = last;
                    }
                }
                BatchPart::Columns(run) => {
                    let at = self.moving(moving, run.stream, seals);
                    assert_eq!(
                        Some(run.first_seq),
                        at.head.checked_add(1),
                        "a batch's run follows its stream's head"
                    );
                    if at.eager {
                        let last = run.last_seq();
                        let sealed = checked_seal(batch, chained, run.stream, last, at);
                        self.hash_run(run.stream, at, last, sealed, |hash| {
                            chain_columns(hash, &run)
                        })?;
                    }
                    at.head = run.last_seq();
                }
            }
        }
        Ok(())
    }

    /// Whether `stream` is hashed at every commit: the own stream when
    /// this replica seals it, a stream pinned (a seal seen) or sealed by
    /// one of the round's `seals`. Any other stream is hashed lazily: its
    /// chain is recorded where it was last hashed, and extended when
    /// something asks ([`State::chain`], the digest, `verify`, a floor, a
    /// seal), reading its events back.
    fn eager(&self, stream: StreamId, seals: &[crate::RunSeal]) -> bool {
        (stream == self.config.stream && self.config.key.is_some())
            || self.pinned.contains_key(&stream)
            || seals.iter().any(|run_seal| run_seal.seal.stream == stream)
    }

    /// Moves `at`'s head hash past a run of the batch that follows its
    /// head and ends at `last`: to `sealed`, the hash there a seal of the
    /// round proves ([`checked_seal`]), else hashed (`chain`, from the
    /// hash at the head: caught up first). So a sealed run received costs
    /// one hash per event (the validator's), not two.
    fn hash_run(
        &self,
        stream: StreamId,
        at: &mut Moving,
        last: u64,
        sealed: Option<ChainHash>,
        chain: impl FnOnce(ChainHash) -> ChainHash,
    ) -> Result<(), ReplicaError> {
        if let Some(hash) = sealed {
            if cfg!(debug_assertions) {
                let below = self.chain_through(stream, at.chain.head_hash, at.hashed, at.head)?;
                assert_eq!(
                    chain(below),
                    hash,
                    "a seal of the round proves its stream's hash"
                );
            }
            at.chain.head_hash = hash;
            at.hashed = last;
            return Ok(());
        }
        self.catch_up(stream, at)?;
        at.chain.head_hash = chain(at.chain.head_hash);
        at.hashed = last;
        Ok(())
    }

    /// Hashes `at` up to its head (read back) where it is hashed lazily
    /// below it. Only while `at.head` is the state's (held) head.
    fn catch_up(&self, stream: StreamId, at: &mut Moving) -> Result<(), ReplicaError> {
        if at.hashed < at.head {
            at.chain.head_hash =
                self.chain_through(stream, at.chain.head_hash, at.hashed, at.head)?;
            at.hashed = at.head;
        }
        Ok(())
    }

    /// Anchors the sealed stream at its floor where it is unanchored and
    /// the seal's `base` is proven there ([`State::base_reaches_seal`],
    /// the validator's rule: through the held events above the floor,
    /// then the batch's). The seal's signature was checked by the
    /// validator, so the base is the writer's `h(floor)`.
    fn anchor(
        &self,
        moving: &mut BTreeMap<StreamId, Moving>,
        batch: &Batch,
        run_seal: &crate::RunSeal,
        seals: &[crate::RunSeal],
    ) -> Result<(), ReplicaError> {
        let (Some(base), seal) = (run_seal.base, run_seal.seal) else {
            return Ok(());
        };
        let at = self.moving(moving, seal.stream, seals);
        if at.chain.anchored {
            return Ok(());
        }
        let batch_events = batch_events_of(batch, seal.stream);
        let proven = self.base_reaches_seal(&seal, (at.floor, base), at.head, &batch_events)?;
        if let Some((held_to, held)) = proven {
            let head_hash = self.chain_through(seal.stream, held, held_to, at.head)?;
            at.chain = StreamChain {
                floor_hash: base,
                head_hash,
                anchored: true,
            };
            at.hashed = at.head;
        }
        Ok(())
    }

    /// Whether a seal's `base` proves its stream's chain at `floor`
    /// (`docs/SIGNING.md`, "Unanchored streams"): chained from the base
    /// through the stream's events held above `floor` (up to `held_head`)
    /// and then through `above` (events past them that the round or batch
    /// adds, in seq order; others are skipped), it reaches the seal's hash
    /// at its seq. The one rule the validator ([`State::seal_anchor`]) and
    /// the commit (`anchor`) both ask. Where it does, the last held seq
    /// chained and the hash there. Fails only if reading held events fails.
    pub(super) fn base_reaches_seal<'e>(
        &self,
        seal: &crate::Seal,
        (floor, base): (u64, ChainHash),
        held_head: u64,
        above: impl IntoIterator<Item = &'e Event>,
    ) -> Result<Option<(u64, ChainHash)>, ReplicaError> {
        if floor >= seal.seq {
            return Ok(None);
        }
        let held_to = held_head.min(seal.seq).max(floor);
        let held = self.chain_through(seal.stream, base, floor, held_to)?;
        let (mut seq, mut hash) = (held_to, held);
        let above = above.into_iter();
        for event in above.filter(|event| event.stream == seal.stream && event.seq > held_to) {
            if seq >= seal.seq {
                break;
            }
            if event.seq.checked_sub(1) != Some(seq) {
                return Ok(None);
            }
            hash = hash.next(event);
            seq = event.seq;
        }
        Ok((seq == seal.seq && hash == seal.head).then_some((held_to, held)))
    }

    /// Anchors each stream a round's accepted statement left unanchored
    /// at the statement's floor by its hash (signed by the writer or the
    /// admin: `state/authority.rs`), chained on through the held events
    /// above the floor.
    fn anchor_statements(
        &self,
        moving: &mut BTreeMap<StreamId, Moving>,
        seals: &[crate::RunSeal],
        statements: &[crate::SignedCompaction],
    ) -> Result<(), ReplicaError> {
        for signed in statements {
            let crate::Compaction {
                stream,
                floor,
                hash,
            } = signed.statement;
            let at = self.moving(moving, stream, seals);
            if at.chain.anchored || at.floor != floor {
                continue;
            }
            let held_head = at.head.min(self.bounds(stream).1).max(floor);
            let head_hash = self.chain_through(stream, hash, floor, held_head)?;
            at.chain = StreamChain {
                floor_hash: hash,
                head_hash,
                anchored: true,
            };
            at.hashed = held_head;
        }
        Ok(())
    }

    /// Keeps the chains a committed batch recorded, and where each is
    /// hashed to; drops the hashes resolved at or below that.
    pub(crate) fn publish_chains(&mut self, batch: &Batch) {
        let resolved = self
            .resolved
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for &(stream, chain) in &batch.chains {
            self.chains.insert(stream, chain);
            self.hashed.remove(&stream);
            resolved.remove(&stream);
        }
        for &(stream, seq) in &batch.hashed {
            self.hashed.insert(stream, seq);
        }
    }

    /// `stream`'s chain as the state holds it, and its floor and head;
    /// hashed from the furthest hash known ([`State::known_hash`]).
    fn moving<'m>(
        &self,
        moving: &'m mut BTreeMap<StreamId, Moving>,
        stream: StreamId,
        seals: &[crate::RunSeal],
    ) -> &'m mut Moving {
        moving.entry(stream).or_insert_with(|| {
            let (floor, head) = self.bounds(stream);
            let mut chain = self.chains.get(&stream).copied().unwrap_or_default();
            let (hashed, head_hash) = self.known_hash(stream);
            chain.head_hash = head_hash;
            Moving {
                chain,
                floor,
                head,
                hashed,
                eager: self.eager(stream, seals),
            }
        })
    }

    /// `stream`'s floor and head as held.
    fn bounds(&self, stream: StreamId) -> (u64, u64) {
        self.log
            .stream(stream)
            .map_or((0, 0), |log| (log.floor, log.head()))
    }

    /// The furthest chain hash of `stream` known without reading: `(seq,
    /// hash)`, from what the chains record or, above it, what was
    /// resolved since ([`State::resolved`]).
    fn known_hash(&self, stream: StreamId) -> (u64, ChainHash) {
        let (floor, head) = self.bounds(stream);
        let recorded = self.recorded_hash(stream);
        let resolved = self
            .resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&stream)
            .copied();
        match resolved {
            Some((seq, hash)) if seq > recorded.0 && seq >= floor && seq <= head => (seq, hash),
            _ => recorded,
        }
    }

    /// The chain hash of `stream` the chains record, and the seq it is at.
    fn recorded_hash(&self, stream: StreamId) -> (u64, ChainHash) {
        let chain = self.chains.get(&stream).copied().unwrap_or_default();
        let seq = match self.hashed.get(&stream) {
            Some(&seq) => seq,
            None => self.bounds(stream).1,
        };
        (seq, chain.head_hash)
    }

    /// `stream`'s chain with its head hash at its head: a stream hashed
    /// lazily below it is extended through its held events (read back)
    /// from the furthest hash known, which is kept for the next ask and
    /// the next commit. `None` for a stream not held.
    pub(crate) fn resolve_chain(
        &self,
        stream: StreamId,
    ) -> Result<Option<StreamChain>, ReplicaError> {
        let Some(mut chain) = self.chains.get(&stream).copied() else {
            return Ok(None);
        };
        if !self.hashed.contains_key(&stream) {
            return Ok(Some(chain));
        }
        let head = self.bounds(stream).1;
        let (seq, hash) = self.known_hash(stream);
        chain.head_hash = self.chain_through(stream, hash, seq, head)?;
        if seq < head {
            self.resolved
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(stream, (head, chain.head_hash));
        }
        Ok(Some(chain))
    }

    /// What a compaction statement of `stream` at `floor` commits to
    /// (`Replica::compaction_at`): the chain hash there, from the
    /// furthest hash known at or below `floor` (else the floor's)
    /// through the held events. `None` where `floor` is 0, below the
    /// held floor (that hash went with the events), above the head, or
    /// the stream is unanchored or not held.
    pub(crate) fn compaction_at(
        &self,
        stream: StreamId,
        floor: u64,
    ) -> Result<Option<crate::Compaction>, ReplicaError> {
        let (held_floor, head) = self.bounds(stream);
        let Some(chain) = self.chains.get(&stream).filter(|chain| chain.anchored) else {
            return Ok(None);
        };
        if floor == 0 || floor < held_floor || floor > head {
            return Ok(None);
        }
        let (known, known_hash) = self.known_hash(stream);
        let (after, hash) = if (held_floor..=floor).contains(&known) {
            (known, known_hash)
        } else {
            (held_floor, chain.floor_hash)
        };
        let hash = self.chain_through(stream, hash, after, floor)?;
        Ok(Some(crate::Compaction {
            stream,
            floor,
            hash,
        }))
    }

    /// The chain hash of `stream` at `last`, from `hash` at `after`,
    /// through the held events `after + 1 ..= last` (read back).
    pub(super) fn chain_through(
        &self,
        stream: StreamId,
        hash: ChainHash,
        after: u64,
        last: u64,
    ) -> Result<ChainHash, ReplicaError> {
        let Some(first) = after.checked_add(1).filter(|&first| first <= last) else {
            return Ok(hash);
        };
        let source = self.log.source();
        let mut scan = source.get().scan(stream, first, last).map_err(read_error)?;
        let mut hash = hash;
        let mut expected = first;
        while scan.peek().map_err(read_error)?.is_some() {
            let event = scan.take().map_err(read_error)?;
            if event.seq != expected {
                return Err(ReplicaError::Corrupt {
                    stream,
                    detail: format!("expected seq {expected}, read seq {}", event.seq),
                });
            }
            hash = hash.next(&event);
            expected += 1;
        }
        if expected != last + 1 {
            return Err(ReplicaError::Corrupt {
                stream,
                detail: format!(
                    "holds seqs {first}..{expected} but records seqs up to {last} to chain"
                ),
            });
        }
        Ok(hash)
    }

    /// Takes the chains the store recorded, and where each lazily hashed
    /// one is hashed to (a seq from its floor to its head, else the store
    /// is corrupt); a stream held without one is chained from its floor
    /// ([`StreamChain::rooted`]: anchored only if nothing was compacted),
    /// reading its events, and logged.
    pub(super) fn load_chains(
        &mut self,
        recorded: &BTreeMap<StreamId, StreamChain>,
        hashed: &BTreeMap<StreamId, u64>,
    ) -> Result<(), ReplicaError> {
        let streams: Vec<(StreamId, u64)> = self.marks.iter().collect();
        for (stream, head) in streams {
            let chain = match recorded.get(&stream) {
                Some(&chain) => chain,
                None => {
                    let floor = self.log.stream(stream).map_or(0, |log| log.floor);
                    let mut chain = StreamChain::rooted(floor);
                    chain.head_hash = self.chain_through(stream, chain.floor_hash, floor, head)?;
                    tracing::info!(
                        %stream,
                        floor,
                        head,
                        anchored = chain.anchored,
                        "the store records no chain for the stream: chained from its floor"
                    );
                    chain
                }
            };
            self.chains.insert(stream, chain);
            if let Some(&seq) = hashed
                .get(&stream)
                .filter(|_| recorded.contains_key(&stream))
            {
                let floor = self.log.stream(stream).map_or(0, |log| log.floor);
                if seq < floor || seq > head {
                    return Err(ReplicaError::Corrupt {
                        stream,
                        detail: format!(
                            "its chain is recorded at seq {seq}, outside floor {floor} to head {head}"
                        ),
                    });
                }
                if seq < head {
                    self.hashed.insert(stream, seq);
                }
            }
        }
        Ok(())
    }

    /// Recomputes every held stream's chain from its floor hash through
    /// its events, against the head hash recorded (extended to the head
    /// from where it is recorded, for a stream hashed lazily).
    pub(super) fn verify_chains(&self) -> Result<(), ReplicaError> {
        for (stream, head) in self.marks.iter() {
            let floor = self.log.stream(stream).map_or(0, |log| log.floor);
            let chain = self.chains.get(&stream).copied().unwrap_or_default();
            let recomputed = self.chain_through(stream, chain.floor_hash, floor, head)?;
            let (seq, hash) = self.recorded_hash(stream);
            let recorded = self.chain_through(stream, hash, seq, head)?;
            if recomputed != recorded {
                return Err(ReplicaError::ChainMismatch {
                    stream,
                    head,
                    recorded: Box::new(recorded),
                    recomputed: Box::new(recomputed),
                });
            }
        }
        Ok(())
    }

    /// Per held stream, its head and chain hash there (none when
    /// unanchored), and the hash over them. Streams hashed lazily are
    /// hashed to their heads now ([`State::resolve_chain`]); one whose
    /// events cannot be read is listed without a hash, and logged.
    pub(crate) fn chain_digest(&self) -> ChainDigest {
        let streams = self
            .marks
            .iter()
            .filter(|&(_, head)| head > 0)
            .map(|(stream, head)| {
                let chain = self.chain(stream).unwrap_or_default();
                StreamHead {
                    stream,
                    head,
                    chain: chain.anchored.then_some(chain.head_hash),
                }
            })
            .collect();
        ChainDigest::new(streams)
    }

    /// `stream`'s chain, its head hash at its head ([`State::resolve_chain`]);
    /// `None` if it is not held or its events cannot be read (logged).
    pub(crate) fn chain(&self, stream: StreamId) -> Option<StreamChain> {
        match self.resolve_chain(stream) {
            Ok(chain) => chain,
            Err(error) => {
                tracing::error!(%stream, %error, "reading a stream to hash its chain failed");
                None
            }
        }
    }
}

/// The chain hash after a run in columns, from `hash` below its first seq.
pub(super) fn chain_columns(hash: ChainHash, run: &crate::columns::RunColumns<'_>) -> ChainHash {
    let starts = std::iter::once(run.start as u64).chain(run.ends.iter());
    let mut hash = hash;
    for (i, ((lamport, time_ms), (start, end))) in run
        .lamports
        .iter()
        .zip(run.times.iter())
        .zip(starts.zip(run.ends.iter()))
        .enumerate()
    {
        let payload = &run.payloads[start as usize..end as usize];
        let seq = run.first_seq + i as u64;
        hash = hash.next_parts(run.stream, seq, lamport, time_ms, payload);
    }
    hash
}

/// The chain hash at `last` of `stream` that the round's `chained` seals
/// prove (the validator chained their runs from the head hash as the
/// round left it: `Plan::chained_seals`): a seal at `last` (all of them
/// at `last` agreeing) of a stream anchored where the batch finds it and
/// whose floor the batch does not move.
fn checked_seal(
    batch: &Batch,
    seals: &[crate::RunSeal],
    stream: StreamId,
    last: u64,
    at: &Moving,
) -> Option<ChainHash> {
    if !at.chain.anchored || batch.floors.iter().any(|&(of, _)| of == stream) {
        return None;
    }
    let mut at_last = seals
        .iter()
        .map(|run_seal| run_seal.seal)
        .filter(|seal| seal.stream == stream && seal.seq == last);
    let first = at_last.next()?;
    at_last
        .all(|seal| seal.head == first.head)
        .then_some(first.head)
}

/// The events of `stream` in `batch`, in order.
fn batch_events_of(batch: &Batch, stream: StreamId) -> Vec<Event> {
    let mut events = Vec::new();
    for part in batch.parts() {
        match part {
            BatchPart::Events(part) => {
                events.extend(part.iter().filter(|e| e.stream == stream).cloned());
            }
            BatchPart::Columns(run) if run.stream == stream => events.extend(run.to_events()),
            BatchPart::Columns(_) => {}
        }
    }
    events
}

/// Raises `at`'s floor above its head to `floor_seq` through the events of
/// the round a floor erased (`erased`, in order). Where they do not follow
/// on, a floor above the head re-rooted the chain (one by one, the events
/// after a floor start at floor + 1): the stream is unanchored from there,
/// as it is when they do not reach `floor_seq`.
fn erased_through(at: &mut Moving, stream: StreamId, floor_seq: u64, erased: &[Event]) {
    let mut hash = at.chain.head_hash;
    let mut anchored = at.chain.anchored;
    let mut seq = at.head;
    for event in erased {
        if event.stream != stream || event.seq <= seq || event.seq > floor_seq {
            continue;
        }
        if event.seq.checked_sub(1) != Some(seq) {
            (hash, anchored) = (ChainHash::GENESIS, false);
        }
        hash = hash.next(event);
        seq = event.seq;
    }
    if seq != floor_seq {
        (hash, anchored) = (ChainHash::GENESIS, false);
    }
    at.chain = StreamChain {
        floor_hash: hash,
        head_hash: hash,
        anchored,
    };
    at.head = floor_seq;
}
