//! Floors with an authority (`docs/SIGNING.md`): the compaction statements
//! a delta carries, judged for the one validator (`state/validate.rs`
//! asks [`State::statement_floors`] and [`State::ignored_floors`]), and
//! the statements a replica keeps and sends with its floors.
//!
//! A statement that verifies under the stream's writer key (derived,
//! bound, pinned and admitted) or the admin key the receiver trusts
//! erases the receiver's events of the stream up to its floor, as a
//! compaction does (readers are told exactly what they lost); where the
//! receiver holds that seq, the statement's chain hash must be its own.
//! Any other statement refuses the delta. No statement erases the
//! receiver's own stream.

use std::collections::BTreeMap;

use meshlog_cursor::StreamId;

use super::held::State;
use super::validate::{PeerFloor, Rejection, RoundIndex};
use crate::{
    Batch, ChainHash, Compaction, CompactionSigner, Delta, DeltaError, FloorProofs, ReplicaError,
    SealError, SignedCompaction,
};

impl State {
    /// Judges `delta`'s compaction statements against the state as the
    /// round leaves it: per stream (never the own), the floor a valid
    /// statement erases it to, where that is above its floor. A statement
    /// with no authority, a bad signature or a chain hash at a held seq
    /// that differs from the receiver's refuses the delta.
    pub(super) fn statement_floors(
        &self,
        delta: &Delta,
        round: &RoundIndex,
    ) -> Result<BTreeMap<StreamId, u64>, Rejection> {
        let mut floors = BTreeMap::new();
        for signed in &delta.floor_proofs.statements {
            let Compaction {
                stream,
                floor,
                hash,
            } = signed.statement;
            let reject = |rule: ReplicaError| Rejection::at(stream, floor..=floor)(rule);
            if floor > crate::LAMPORT_MAX {
                let max = crate::LAMPORT_MAX;
                return Err(reject(
                    DeltaError::FloorTooLarge { stream, floor, max }.into(),
                ));
            }
            self.check_signer(signed, round)
                .map_err(|rule| reject(rule.into()))?;
            if stream == self.config.stream
                || floor <= self.floor.get(stream).max(round.floor(stream))
            {
                continue;
            }
            if let Some(held) = self.held_hash(stream, floor, round).map_err(reject)? {
                if held != hash {
                    let rule = DeltaError::StatementHashMismatch { stream, seq: floor };
                    return Err(reject(rule.into()));
                }
            }
            let at = floors.entry(stream).or_insert(floor);
            *at = (*at).max(floor);
        }
        Ok(floors)
    }

    /// The cuts of the streams of `columns` whose compaction statement's
    /// signer has no authority here (the validator's rule,
    /// [`State::check_signer`], judged against this state alone), each
    /// whole; a statement that does not verify is left to the validator
    /// (a forgery, refused, never cut).
    pub(super) fn no_authority_cuts(&self, columns: &crate::DeltaColumns) -> Vec<crate::Cut> {
        let round = RoundIndex::default();
        let mut cuts: Vec<crate::Cut> = Vec::new();
        for signed in &columns.floor_proofs.statements {
            let Compaction { stream, floor, .. } = signed.statement;
            let refused = matches!(
                self.check_signer(signed, &round),
                Err(DeltaError::StatementNoAuthority { .. })
            );
            if refused && cuts.iter().all(|cut| cut.stream != stream) {
                cuts.push(crate::Cut {
                    stream,
                    from_seq: 0,
                    limit: crate::Limit::StatementNoAuthority { floor },
                });
            }
        }
        cuts
    }

    /// Whether `signed`'s signer may erase its stream here, and signed
    /// it: the admin key trusted, or the stream's writer (the key deriving
    /// or bound to it, the one pinned if any, admitted if membership is
    /// closed).
    fn check_signer(
        &self,
        signed: &SignedCompaction,
        round: &RoundIndex,
    ) -> Result<(), DeltaError> {
        let Compaction { stream, floor, .. } = signed.statement;
        let membership = &self.config.membership;
        let binding = membership.binding(stream);
        let no_authority = DeltaError::StatementNoAuthority {
            stream,
            floor,
            derived: signed.signer.stream(),
        };
        match signed.verify(membership.admin(), binding.as_ref()) {
            Ok(CompactionSigner::Admin) => Ok(()),
            Ok(CompactionSigner::Writer) => {
                let pinned = self.pinned.get(&stream).or(round.sealed.get(&stream));
                let other_pin = pinned.is_some_and(|key| *key != signed.signer);
                if other_pin || !membership.admits(stream, &signed.signer) {
                    return Err(no_authority);
                }
                Ok(())
            }
            Err(SealError::NoAuthority { .. }) => Err(no_authority),
            Err(_) => Err(DeltaError::BadStatement { stream, floor }),
        }
    }

    /// The chain hash of `stream` at `seq` as the round leaves it, where
    /// it is known and the replica holds that seq: from the statement the
    /// round took (where it anchors the stream) or the state's anchored
    /// floor, through the held events, then the events the round planned
    /// above the store's head (so a round judges as one by one would);
    /// `None` elsewhere (nothing to compare with).
    fn held_hash(
        &self,
        stream: StreamId,
        seq: u64,
        round: &RoundIndex,
    ) -> Result<Option<ChainHash>, ReplicaError> {
        match self.chain_base(round, stream) {
            Some(base) => self.hash_from(stream, base, seq, round),
            None => Ok(None),
        }
    }

    /// The chain hash of `stream` at `seq`, from `(base_seq, base_hash)`
    /// through the held events, then the events the round planned above
    /// the store's head; `None` where `seq` is below the base or an event
    /// is missing.
    fn hash_from(
        &self,
        stream: StreamId,
        (base_seq, base_hash): (u64, ChainHash),
        seq: u64,
        round: &RoundIndex,
    ) -> Result<Option<ChainHash>, ReplicaError> {
        if seq < base_seq {
            return Ok(None);
        }
        let state_head = self.log.head(stream);
        let stored = seq.min(state_head).max(base_seq);
        let mut hash = self.chain_through(stream, base_hash, base_seq, stored)?;
        for next in stored + 1..=seq {
            match round.events.get(&(stream, next)) {
                Some(event) => hash = hash.next(event),
                None => return Ok(None),
            }
        }
        Ok(Some(hash))
    }

    /// Where `stream`'s chain is known from as the round leaves it: the
    /// floor and hash the round anchored it on (a statement's, or a
    /// seal's base: [`RoundIndex::anchors`]), where the commit anchors
    /// the stream there (at its floor as the round leaves it, above the
    /// state's head or on a stream held unanchored), else the state's
    /// floor and floor hash if anchored (a stream not held yet: 0,
    /// anchored).
    fn chain_base(&self, round: &RoundIndex, stream: StreamId) -> Option<(u64, ChainHash)> {
        let (floor, head) = self
            .log
            .stream(stream)
            .map_or((0, 0), |log| (log.floor, log.head()));
        let chain = match self.chains.get(&stream) {
            Some(chain) => Some(*chain),
            None if floor == 0 => Some(crate::StreamChain::default()),
            None => None,
        };
        let anchored = chain.is_some_and(|chain| chain.anchored);
        let taken = round.anchors.get(&stream).copied();
        match taken {
            Some((at, hash))
                if at == floor.max(round.floor(stream)) && (at > head || !anchored) =>
            {
                Some((at, hash))
            }
            _ => chain
                .filter(|chain| chain.anchored)
                .map(|chain| (floor, chain.floor_hash)),
        }
    }

    /// Per stream `delta` carries a floor or a valid statement of, the seq
    /// at or below which its events of the stream are not taken: the
    /// statement's floor (`signed`, from [`State::statement_floors`]),
    /// then the delta's floor as [`PeerFloor::of`] judges it on the
    /// stream as the statement leaves it.
    pub(super) fn ignored_floors(
        &self,
        delta: &Delta,
        round: &RoundIndex,
        signed: &BTreeMap<StreamId, u64>,
    ) -> BTreeMap<StreamId, u64> {
        let own = self.config.stream;
        let mut ignored = signed.clone();
        for (stream, floor) in delta.floor.iter() {
            let signed_floor = signed.get(&stream).copied().unwrap_or(0);
            let held_floor = self
                .floor
                .get(stream)
                .max(round.floor(stream))
                .max(signed_floor);
            let head = round
                .head(stream)
                .unwrap_or_else(|| self.log.head(stream))
                .max(held_floor);
            let needed = self.floor_needs_authority(stream, floor, round, Some(delta));
            let rule = PeerFloor::of(
                stream,
                floor,
                own,
                self.recovering,
                (held_floor, head),
                needed,
            );
            ignored.insert(stream, rule.ignored_to(floor).max(signed_floor));
        }
        ignored
    }

    /// The statements a commit of `batch` keeps, newest per stream: the
    /// round's accepted `statements` that erased their stream, and the own
    /// stream's, signed here when a keyed replica's batch raises its floor
    /// over the chain hash there. Needs the batch's chains.
    pub(super) fn statements_after(
        &self,
        batch: &Batch,
        statements: &[SignedCompaction],
    ) -> Vec<SignedCompaction> {
        let mut kept: BTreeMap<StreamId, SignedCompaction> = BTreeMap::new();
        for signed in statements {
            let stream = signed.statement.stream;
            let newer = kept
                .get(&stream)
                .or(self.statements.get(&stream))
                .is_none_or(|old| old.statement.floor < signed.statement.floor);
            if newer {
                kept.insert(stream, *signed);
            }
        }
        let own = self.config.stream;
        let own_floor = batch.floors.iter().find(|&&(s, _)| s == own);
        if let (Some(key), Some(&(_, floor))) = (&self.config.key, own_floor) {
            let chain = batch.chain(own).copied();
            if let Some(chain) = chain.filter(|chain| chain.anchored) {
                let statement = Compaction {
                    stream: own,
                    floor,
                    hash: chain.floor_hash,
                };
                kept.insert(own, statement.sign_by_writer(key));
            }
        }
        kept.into_values().collect()
    }

    /// The newest statement kept of `stream`.
    pub(crate) fn statement(&self, stream: StreamId) -> Option<SignedCompaction> {
        self.statements.get(&stream).copied()
    }

    /// Keeps the statements a committed batch recorded.
    pub(super) fn publish_statements(&mut self, statements: &[SignedCompaction]) {
        for signed in statements {
            self.statements.insert(signed.statement.stream, *signed);
        }
    }

    /// What backs the floors of a delta (`floor`, the sender's floors the
    /// receiver is below): per stream, the newest statement kept at or
    /// below its floor, and the chain hash at the floor where anchored.
    pub(super) fn floor_proofs(&self, floor: &meshlog_cursor::VersionVector) -> FloorProofs {
        let mut proofs = FloorProofs::default();
        for (stream, floor_seq) in floor.iter() {
            if let Some(signed) = self.statements.get(&stream) {
                if signed.statement.floor <= floor_seq {
                    proofs.statements.push(*signed);
                }
            }
            if let Some(chain) = self.chains.get(&stream).filter(|chain| chain.anchored) {
                proofs.hashes.push((stream, chain.floor_hash));
            }
        }
        proofs
    }
}

impl State {
    /// The chain hash at `head` of `stream` where a statement `round`
    /// took anchors it ([`State::chain_base`]), chained from the
    /// statement's hash through the held events, then the round's.
    pub(super) fn anchored_head_hash(
        &self,
        round: &RoundIndex,
        stream: StreamId,
        head: u64,
    ) -> Option<ChainHash> {
        let (floor, _) = round.anchors.get(&stream).copied()?;
        if self.chain_base(round, stream)?.0 != floor {
            return None;
        }
        self.held_hash(stream, head, round).ok().flatten()
    }

    /// Where a sealed run the round holds anchors its stream, as the
    /// commit of the delta alone would (`State::chains_after`, "Unanchored
    /// streams" in `docs/SIGNING.md`): the stream's `floor` as the round
    /// leaves it after the delta and the seal's base, where the chain hash
    /// at that floor is not known (the stream is unanchored there) and the
    /// base, chained through the held events and the round's up to the
    /// seal, reaches the seal's hash ([`State::base_reaches_seal`], the
    /// rule the commit anchors by too). A later delta of the round is then
    /// judged on the chain from there ([`RoundIndex::anchors`]), as one by
    /// one it is judged on the chain the commit anchored.
    pub(super) fn seal_anchor(
        &self,
        round: &RoundIndex,
        run_seal: &crate::RunSeal,
        floor: u64,
    ) -> Option<(u64, ChainHash)> {
        let (base, seal) = (run_seal.base?, run_seal.seal);
        let stream = seal.stream;
        // A failed read notes no anchor: the commit, which reads the same
        // held events to anchor, fails then.
        if floor >= seal.seq || self.held_hash(stream, floor, round).ok()?.is_some() {
            return None;
        }
        let planned = round
            .events
            .range((stream, floor)..=(stream, seal.seq))
            .map(|(_, event)| event);
        let held_head = self.log.head(stream);
        self.base_reaches_seal(&seal, (floor, base), held_head, planned)
            .ok()?
            .map(|_| (floor, base))
    }
}
