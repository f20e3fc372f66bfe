//! The checkpoints a replica keeps (`docs/TOKEN.md`, "Version 2"): the
//! vectors its version-2 tokens are relative to, minted from its marks or
//! received from peers, at most [`CHECKPOINTS_KEPT`] by name (past it,
//! those of the fewest events go, the same at every replica).
//!
//! Mint from the marks when no checkpoint kept is within
//! [`CHECKPOINT_DIFF_MAX`] streams of them, at most one every
//! [`CHECKPOINT_INTERVAL_MS`] plus a jitter of up to half that (so that a
//! mesh under writes neither mints on every change nor all at once); a
//! replica that keeps a checkpoint from a peer leaves the minting to the
//! peer's minter, minting again only past [`CHECKPOINT_INTERVAL_MS`] and
//! a jitter of up to [`ADOPT_JITTER_MS`] from then (one minter at a time
//! in a mesh: see [`Checkpoints::due`]); a token is the shortest of
//! version 2 against each checkpoint kept and version 1. The time is
//! always an argument: nothing here reads a clock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use meshlog_cursor::token::{self, Token, CHECKPOINT_DIFF_MAX};
use meshlog_cursor::{Checkpoint, CheckpointName, StreamId, TokenError, VersionVector};

use crate::error::store_error;
use crate::{PageError, Replica, ReplicaError, Store};

/// How many checkpoints a replica keeps, minted or received: 16. A token
/// naming an older one is answered [`PageError::UnknownCheckpoint`].
pub const CHECKPOINTS_KEPT: usize = 16;

/// The least time between two checkpoints a replica mints: 2 s (the
/// simulator's), plus a jitter of up to half of it.
pub const CHECKPOINT_INTERVAL_MS: u64 = 2_000;

/// How long, beyond [`CHECKPOINT_INTERVAL_MS`], a replica that kept a
/// checkpoint from a peer may wait before it mints one of its own: a
/// jitter of up to 20 s, drawn per replica and per time. A mesh's minter
/// mints every 2-3 s while it needs to, so the others never do while it
/// is up; when it stops, the first of the others takes over within
/// 22 s, the first of N in about `2 s + 20 s / N`. Long against the time
/// a checkpoint takes to cross a mesh (a few hundred ms under writes), so
/// that few replicas take over at once.
pub(crate) const ADOPT_JITTER_MS: u64 = 20_000;

/// The checkpoints kept, oldest first, and when the next may be minted.
#[derive(Debug, Default)]
pub(crate) struct Checkpoints {
    kept: VecDeque<Checkpoint>,
    /// The earliest time (ms) of the next mint: the last mint's time, the
    /// interval and a jitter. 0: none minted since open.
    next_mint_ms: u64,
    /// Mints since open: with the stream, what the jitter is drawn from.
    minted: u64,
    /// A checkpoint from a peer was kept since the last mint call: the
    /// next call defers this replica's own mint (it has a time; keeping
    /// has none). Scheduling only, not stored; atomic because a mint call
    /// plans on a shared state (`SharedReplica`'s rounds) and a call that
    /// mints nothing changes nothing else.
    adopted: AtomicBool,
    /// No mint of this replica's own before this time (ms): it keeps
    /// checkpoints a peer minted. 0: none.
    deferred_until_ms: AtomicU64,
}

impl Clone for Checkpoints {
    fn clone(&self) -> Self {
        Checkpoints {
            kept: self.kept.clone(),
            next_mint_ms: self.next_mint_ms,
            minted: self.minted,
            adopted: AtomicBool::new(self.adopted.load(Ordering::Relaxed)),
            deferred_until_ms: AtomicU64::new(self.deferred_until_ms.load(Ordering::Relaxed)),
        }
    }
}

impl Checkpoints {
    /// The checkpoints a store recorded, oldest first. A vector that has no
    /// name (more streams than a token holds) cannot have been kept: it is
    /// dropped, with a warning.
    ///
    /// A replica opened mints at its first call (nothing kept near its
    /// marks, none minted since open), so a mesh started at once mints one
    /// small checkpoint per replica. Deferring that first mint as a kept
    /// peer's checkpoint defers the others was tried (2026-12-03): 617
    /// distinct checkpoints fell to 6 at 1,000 simulated replicas and
    /// 10,000 writers, but the gossip grew from 127.5 to 525.9 MB (more
    /// large checkpoints minted under writes, each crossing every link
    /// about whole), so it was not kept.
    pub(crate) fn from_vectors(vectors: &[VersionVector]) -> Self {
        let mut checkpoints = Checkpoints::default();
        for vector in vectors {
            match Checkpoint::new(vector.clone()) {
                Ok(checkpoint) => {
                    checkpoints.insert(checkpoint, true);
                }
                Err(error) => {
                    tracing::warn!(%error, "a stored checkpoint has no name; dropped");
                }
            }
        }
        checkpoints
    }

    /// The checkpoints kept, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Checkpoint> + '_ {
        self.kept.iter()
    }

    /// The vectors kept, oldest first: what a store records.
    pub(crate) fn vectors(&self) -> Vec<VersionVector> {
        self.kept.iter().map(|c| c.vector().clone()).collect()
    }

    /// The checkpoint of that name, if kept.
    pub(crate) fn get(&self, name: CheckpointName) -> Option<&Checkpoint> {
        self.kept.iter().find(|c| c.name() == name)
    }

    /// Keeps `checkpoint` as the newest. Past [`CHECKPOINTS_KEPT`] the
    /// lowest by [`rank`] goes: the kept one of the least events, or
    /// `checkpoint` itself, which is then not kept (unless `own`: a mint
    /// of this replica's is always kept). Whether it was kept (one kept
    /// already is not moved: keeping is idempotent).
    ///
    /// Why a rank and not arrival: every replica drops the same
    /// checkpoints, so what a replica dropped never comes back to it
    /// (the lowest it keeps only rises) and the gossip settles on the
    /// same 16 everywhere. Dropping the oldest to arrive, a mesh that
    /// minted more checkpoints than a replica keeps (a thousand replicas
    /// started at once, each minting at its first call) passed them round
    /// without end: dropped, received again, kept again, sent on again.
    pub(crate) fn insert(&mut self, checkpoint: Checkpoint, own: bool) -> bool {
        if self.get(checkpoint.name()).is_some() {
            return false;
        }
        if self.kept.len() == CHECKPOINTS_KEPT {
            let lowest = (0..self.kept.len())
                .min_by_key(|&at| rank(&self.kept[at]))
                .expect("full, so not empty");
            if !own && rank(&checkpoint) < rank(&self.kept[lowest]) {
                return false;
            }
            self.kept.remove(lowest);
        }
        self.kept.push_back(checkpoint);
        true
    }

    /// The checkpoint to mint from `marks` at `now_ms`, if one is due: no
    /// checkpoint kept is within [`CHECKPOINT_DIFF_MAX`] streams of the
    /// marks, the interval since the last mint (with its jitter) has
    /// passed, and so has the deferral after a checkpoint kept from a
    /// peer. `None` too for marks with no name (more streams than a token
    /// holds). Changes nothing but the deferral's schedule:
    /// [`Checkpoints::minted`] records a mint.
    ///
    /// **One minter at a time.** In a mesh under writes the marks of
    /// every replica pass the bound of the last checkpoint at about the
    /// same time, so a rule of the marks and the time alone has every
    /// replica mint then, each a vector of its own (marks differ in
    /// flight) that the gossip sends over every link: 173 distinct
    /// checkpoints and 5 times the protocol's bytes in a simulated mesh
    /// of 100 replicas and 1,000 writers. So the first call after a
    /// checkpoint from a peer was kept defers this replica's own mint to
    /// [`CHECKPOINT_INTERVAL_MS`] and a jitter of up to
    /// [`ADOPT_JITTER_MS`] later, and each later one pushes it on: while a
    /// peer mints, this replica does not, and whichever replica's
    /// deferral ends first mints next and goes on minting (its own
    /// interval is shorter than the others' deferral). The deferral is
    /// set by [`Checkpoints::defer_if_adopted`], at the call.
    pub(crate) fn due(&self, marks: &VersionVector, now_ms: u64) -> Option<Checkpoint> {
        if marks.is_empty()
            || now_ms < self.next_mint_ms
            || now_ms < self.deferred_until_ms.load(Ordering::Relaxed)
        {
            return None;
        }
        // The newest first: the likeliest to be close.
        if self
            .kept
            .iter()
            .rev()
            .any(|c| within_bound(c.vector(), marks))
        {
            return None;
        }
        Checkpoint::new(marks.clone()).ok()
    }

    /// At a mint call at `now_ms`: if a checkpoint from a peer was kept
    /// since the last call, no mint of this replica's own before
    /// [`CHECKPOINT_INTERVAL_MS`] and a jitter of up to
    /// [`ADOPT_JITTER_MS`] from now (drawn from the stream and the time).
    pub(crate) fn defer_if_adopted(&self, now_ms: u64, stream: StreamId) {
        if self.adopted.swap(false, Ordering::Relaxed) {
            let jitter = mix(stream.get() ^ now_ms.rotate_left(32)) % ADOPT_JITTER_MS;
            let until = now_ms.saturating_add(CHECKPOINT_INTERVAL_MS + jitter);
            self.deferred_until_ms.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Records a mint at `now_ms`: the next is due after the interval and
    /// a jitter of up to half of it, drawn from the replica's stream and
    /// the number of mints (deterministic: no randomness in tests, and
    /// replicas of one mesh spread apart).
    pub(crate) fn minted(&mut self, now_ms: u64, stream: StreamId) {
        let jitter = mix(stream.get() ^ self.minted.rotate_left(32)) % (CHECKPOINT_INTERVAL_MS / 2);
        self.minted += 1;
        self.next_mint_ms = now_ms.saturating_add(CHECKPOINT_INTERVAL_MS + jitter);
    }

    /// The checkpoints after `work` and the one it adds, or `None` if it
    /// changes nothing (no mint due from `marks`, or the checkpoint is
    /// kept already). A mint's jitter is drawn from `stream`, the
    /// replica's own. Copies the checkpoints kept only when they change.
    pub(crate) fn plan(
        &self,
        work: &CheckpointWork,
        marks: &VersionVector,
        stream: StreamId,
    ) -> Option<(Checkpoints, Checkpoint)> {
        match work {
            CheckpointWork::Mint { now_ms } => {
                self.defer_if_adopted(*now_ms, stream);
                let minted = self.due(marks, *now_ms)?;
                let mut next = self.clone();
                next.insert(minted.clone(), true);
                next.minted(*now_ms, stream);
                Some((next, minted))
            }
            CheckpointWork::Keep(received) => {
                if self.get(received.name()).is_some() {
                    return None;
                }
                let mut next = self.clone();
                if !next.insert(received.clone(), false) {
                    tracing::debug!(name = %received.name(), "a checkpoint below every one kept: not kept");
                    return None;
                }
                next.adopted = AtomicBool::new(true);
                Some((next, received.clone()))
            }
        }
    }

    /// The shortest token for `cursor`, as text: version 2 against each
    /// checkpoint kept, or version 1 (which every replica reads) when none
    /// is shorter.
    pub(crate) fn token(&self, cursor: &VersionVector) -> Result<String, TokenError> {
        let mut best = token::encode_text(cursor)?;
        for checkpoint in self.kept.iter().rev() {
            if let Ok(relative) = token::encode_relative_text(cursor, checkpoint) {
                if relative.len() < best.len() {
                    best = relative;
                }
            }
        }
        Ok(best)
    }

    /// The cursor a token's text stands for: version 1 as it is, version 2
    /// expanded against the checkpoint it names, never guessed.
    pub(crate) fn cursor_text(&self, text: &str) -> Result<VersionVector, PageError> {
        self.cursor(&token::decode_any_text(text)?)
    }

    /// The cursor a decoded token stands for: version 1 as it is, version 2
    /// expanded against the checkpoint it names, never guessed:
    /// [`PageError::UnknownCheckpoint`] if none kept has that name, and
    /// [`PageError::BadToken`] if the expansion is refused.
    pub(crate) fn cursor(&self, token: &Token) -> Result<VersionVector, PageError> {
        match token {
            Token::Absolute(vector) => Ok(vector.clone()),
            Token::Relative(relative) => {
                let name = relative.checkpoint();
                let checkpoint = self
                    .get(name)
                    .ok_or(PageError::UnknownCheckpoint { name })?;
                Ok(relative.expand(checkpoint)?)
            }
        }
    }
}

/// The order in which a replica keeps checkpoints past
/// [`CHECKPOINTS_KEPT`] (`Checkpoints::insert`): by the events they
/// cover, then by name, the same at every replica. A replica's marks only
/// rise, so the checkpoints of the most events are the newest and the
/// nearest to a reader at the head.
fn rank(checkpoint: &Checkpoint) -> (u128, CheckpointName) {
    (checkpoint.vector().total(), checkpoint.name())
}

/// A change to the checkpoints a replica keeps: a round of its own.
#[derive(Debug, Clone)]
pub(crate) enum CheckpointWork {
    /// Mint one from the marks, if due at `now_ms`.
    Mint {
        /// The time, in ms since the epoch.
        now_ms: u64,
    },
    /// Keep one received from a peer (its name is its vector's: a
    /// [`Checkpoint`] cannot be built otherwise).
    Keep(Checkpoint),
}

impl<S: Store> Replica<S> {
    /// Mints a checkpoint from the marks if one is due at `now_ms` (ms
    /// since the epoch): no checkpoint kept is within
    /// [`CHECKPOINT_DIFF_MAX`] streams of the marks,
    /// [`CHECKPOINT_INTERVAL_MS`] and a jitter have passed since the last
    /// mint, and, if a checkpoint from a peer was kept since the last
    /// call, [`CHECKPOINT_INTERVAL_MS`] and a jitter of up to 20 s from
    /// this call (a mesh's other replicas leave the minting to the one
    /// that mints: `docs/TOKEN.md`). Recorded by the store before it is kept; answers it, or
    /// `None` when none was due. Pages answer tokens relative to it from
    /// then on; a peer reads them once it keeps it too (sync gossips it).
    pub fn mint_checkpoint(&mut self, now_ms: u64) -> Result<Option<Checkpoint>, ReplicaError> {
        self.checkpoint_work(&CheckpointWork::Mint { now_ms })
    }

    /// Keeps a checkpoint received from a peer (recorded by the store
    /// first). Past [`CHECKPOINTS_KEPT`] the one of the fewest events
    /// goes (then the lowest name: every replica drops the same ones, so
    /// gossip settles), and a checkpoint below every one kept is not
    /// kept. Whether it was kept; keeping one twice changes nothing.
    pub fn keep_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<bool, ReplicaError> {
        Ok(self
            .checkpoint_work(&CheckpointWork::Keep(checkpoint))?
            .is_some())
    }

    fn checkpoint_work(
        &mut self,
        work: &CheckpointWork,
    ) -> Result<Option<Checkpoint>, ReplicaError> {
        if self.failed {
            return Err(ReplicaError::Failed);
        }
        let state = &self.state;
        let planned = state
            .checkpoints
            .plan(work, state.marks(), state.config().stream);
        let Some((next, added)) = planned else {
            return Ok(None);
        };
        self.store
            .keep_checkpoints(&next.vectors())
            .map_err(store_error)?;
        tracing::debug!(name = %added.name(), streams = added.vector().len(), "checkpoint kept");
        self.state.checkpoints = next;
        Ok(Some(added))
    }

    /// The checkpoints kept, oldest first.
    pub fn checkpoints(&self) -> Vec<Checkpoint> {
        self.state.checkpoints.iter().cloned().collect()
    }

    /// The checkpoint of that name, if kept: what a peer asks for by name.
    pub fn checkpoint(&self, name: CheckpointName) -> Option<Checkpoint> {
        self.state.checkpoints.get(name).cloned()
    }

    /// The cursor a token's text stands for, of either version: version 1
    /// as it is, version 2 expanded against the checkpoint it names.
    /// Never guesses: [`PageError::UnknownCheckpoint`] if this replica
    /// does not keep it, [`PageError::BadToken`] if the text is no token.
    pub fn cursor(&self, token: &str) -> Result<VersionVector, PageError> {
        self.state.checkpoints.cursor_text(token)
    }

    /// The token this replica answers for `cursor`, as a page's
    /// [`Page::token`](crate::Page::token) is: the shortest of version 2
    /// against each checkpoint kept and version 1. For a cursor no page
    /// answered (a follow frame's, a heartbeat's).
    pub fn token(&self, cursor: &VersionVector) -> Result<String, TokenError> {
        self.state.checkpoints.token(cursor)
    }
}

/// Whether `cursor` differs from `checkpoint` on at most
/// [`CHECKPOINT_DIFF_MAX`] streams (a version-2 token of it can be
/// written), stopping at the first stream past the bound.
fn within_bound(checkpoint: &VersionVector, cursor: &VersionVector) -> bool {
    let mut differences = 0usize;
    let mut a = checkpoint.iter().peekable();
    let mut b = cursor.iter().peekable();
    loop {
        let differ = match (a.peek(), b.peek()) {
            (None, None) => return true,
            (Some(_), None) => a.next().is_some(),
            (None, Some(_)) => b.next().is_some(),
            (Some(&(sa, qa)), Some(&(sb, qb))) => {
                if sa < sb {
                    a.next();
                } else if sb < sa {
                    b.next();
                } else {
                    a.next();
                    b.next();
                }
                sa != sb || qa != qb
            }
        };
        if differ {
            differences += 1;
            if differences > CHECKPOINT_DIFF_MAX {
                return false;
            }
        }
    }
}

/// A 64-bit mixer (SplitMix64's finalizer): spreads a stream id and a count
/// over the jitter's range.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(entries: impl IntoIterator<Item = (u64, u64)>) -> VersionVector {
        entries
            .into_iter()
            .map(|(s, q)| (StreamId::new(s), q))
            .collect()
    }

    #[test]
    fn the_bound_counts_streams_on_either_side_and_stops_past_the_limit() {
        let base = vector((1..=200).map(|s| (s, 5)));
        assert!(within_bound(&base, &base));
        // 128 streams ahead: still a version-2 token.
        let ahead = vector((1..=200).map(|s| (s, if s <= 128 { 6 } else { 5 })));
        assert!(within_bound(&base, &ahead));
        // One more, on a stream the checkpoint lacks: past it.
        let mut past = ahead.clone();
        past.advance(StreamId::new(999), 1);
        assert!(!within_bound(&base, &past));
        // Streams the cursor lacks count too.
        let fewer = vector((1..=71).map(|s| (s, 5)));
        assert!(!within_bound(&base, &fewer));
        assert!(within_bound(&base, &vector((1..=72).map(|s| (s, 5)))));
    }

    #[test]
    fn keeping_is_bounded_idempotent_and_drops_the_oldest() {
        let mut kept = Checkpoints::default();
        let checkpoints: Vec<Checkpoint> = (1..=20)
            .map(|q| Checkpoint::new(vector([(1, q)])).expect("named"))
            .collect();
        for checkpoint in &checkpoints {
            assert!(kept.insert(checkpoint.clone(), false));
            assert!(!kept.insert(checkpoint.clone(), false));
        }
        assert_eq!(kept.iter().count(), CHECKPOINTS_KEPT);
        assert!(kept.get(checkpoints[3].name()).is_none());
        assert!(kept.get(checkpoints[4].name()).is_some());
        let reread = Checkpoints::from_vectors(&kept.vectors());
        let names = |c: &Checkpoints| c.iter().map(Checkpoint::name).collect::<Vec<_>>();
        assert_eq!(names(&reread), names(&kept));
    }

    #[test]
    fn minting_waits_for_the_interval_and_its_jitter() {
        let stream = StreamId::new(7);
        let mut kept = Checkpoints::default();
        let marks = vector((1..=300).map(|s| (s, 1)));
        let first = kept.due(&marks, 1_000).expect("nothing kept: due");
        kept.insert(first, false);
        kept.minted(1_000, stream);
        let moved = vector((1..=300).map(|s| (s, 2)));
        assert!(kept
            .due(&moved, 1_000 + CHECKPOINT_INTERVAL_MS - 1)
            .is_none());
        let latest = 1_000 + CHECKPOINT_INTERVAL_MS + CHECKPOINT_INTERVAL_MS / 2;
        assert!(kept.due(&moved, latest).is_some());
        // Within the bound of one kept: never due, however late.
        assert!(kept.due(&marks, u64::MAX).is_none());
    }
}
