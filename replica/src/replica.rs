//! `Replica`: one runtime's copy of the log.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshlog_cursor::STREAMS_MAX;
use meshlog_cursor::{StreamId, VersionVector};

use crate::error::store_error;
use crate::state::{AppendRequest, Planned, RoundIndex, RoundItem, State};
use crate::{
    ChainDigest, DeltaColumns, Event, MemStore, Membership, OpenWarning, PageError, ReplicaError,
    RunSeal, Seal, Store, StreamChain, WriterKey,
};

/// The longest page a reader may ask for by default
/// ([`Config::page_len_max`]): the one place this bound is written; the
/// node's HTTP schema and its checks read it from here.
pub const PAGE_LEN_MAX: usize = 10_000;

/// A replica's settings and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This replica's own writer stream.
    pub stream: StreamId,
    /// The most early events (with a hole below them) held back at once,
    /// over all streams. Beyond it they are dropped and counted; anti-entropy
    /// fetches them again.
    pub pending_events_max: usize,
    /// The largest payload accepted, in bytes.
    pub payload_bytes_max: usize,
    /// The longest page a reader may ask for; [`PAGE_LEN_MAX`] by default.
    pub page_len_max: usize,
    /// The most streams a replica holds, its own stream included: the own
    /// stream's slot is always reserved (counted whether or not it has
    /// appended yet), so a replica takes at most `streams_max - 1` other
    /// writers' streams and its own appends are never refused for this
    /// limit. A delta that would add a stream beyond it is refused
    /// ([`ReplicaError::TooManyStreams`]); a store that already holds more
    /// (the limit was lowered) opens all the same, with
    /// [`OpenWarning::StreamsOverLimit`](crate::OpenWarning::StreamsOverLimit),
    /// and takes no new stream. So whatever a replica accepts, it reopens.
    pub streams_max: usize,
    /// Open to relearn this replica's own stream from its peers: a writer
    /// that lost its store and restarts under its old stream id must not
    /// append seqs it already used. While recovering, deltas may carry the
    /// own stream beyond its head (and its floor), and appends are refused
    /// with [`ReplicaError::Recovering`] until
    /// [`Replica::end_recovery`]. Off by default: then no peer can ever
    /// write or compact this replica's own stream.
    pub recover_own_stream: bool,
    /// The writer key of the own stream, if this replica seals it
    /// (`docs/SIGNING.md`, "Seals"): then `stream` is the one the key
    /// derives ([`Config::with_key`]). Without one the replica writes
    /// unsealed, as every replica did before signing.
    pub key: Option<WriterKey>,
    /// Refuse every received run that carries no seal
    /// ([`DeltaError::Unsealed`](crate::DeltaError::Unsealed)). Off by
    /// default until the node seals its stream: then a run with a seal is
    /// verified and one without is taken as before.
    pub require_seals: bool,
    /// Which writers' events are accepted, and the legacy streams bound
    /// to their keys ([`Membership`]): open by default (any writer whose
    /// key derives its stream). A closed one refuses other writers'
    /// events with [`DeltaError::UnknownWriter`](crate::DeltaError::UnknownWriter).
    pub membership: Membership,
}

impl Config {
    /// Defaults for a replica writing `stream`: 4,096 pending events, 1 MiB
    /// payloads, pages of up to 10,000 events, up to
    /// [`STREAMS_MAX`](meshlog_cursor::STREAMS_MAX) streams (what a
    /// token can carry).
    pub fn new(stream: StreamId) -> Self {
        Config {
            stream,
            pending_events_max: 4096,
            payload_bytes_max: 1 << 20,
            page_len_max: PAGE_LEN_MAX,
            streams_max: STREAMS_MAX,
            recover_own_stream: false,
            key: None,
            require_seals: false,
            membership: Membership::open(),
        }
    }

    /// [`Config::new`] for the stream `key` derives, sealed by it: when
    /// the replica builds a delta it signs its own stream's head once
    /// (the seal is kept until the head moves, so the cost is per delta,
    /// not per append).
    ///
    /// ```
    /// use meshlog_replica::{Config, MemStore, Replica, WriterKey};
    /// let key = WriterKey::from_bytes([1; 32]);
    /// let config = Config::with_key(key.clone());
    /// assert_eq!(config.stream, key.stream());
    /// let mut replica = Replica::open(config, MemStore::default())?;
    /// replica.append(&b"hello"[..])?;
    /// let seal = replica.own_seal().expect("a keyed replica seals its head");
    /// assert_eq!(seal.seq, 1);
    /// seal.verify(&key.public()).expect("its own key signs it");
    /// # Ok::<(), meshlog_replica::ReplicaError>(())
    /// ```
    pub fn with_key(key: WriterKey) -> Self {
        Config {
            key: Some(key.clone()),
            ..Config::new(key.stream())
        }
    }
}

/// A page of events, and the cursor to resume from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Up to `limit` events not covered by the cursor, ordered by
    /// `(lamport, stream)`.
    pub events: Vec<Event>,
    /// The cursor joined with the page: pass it to the next call.
    pub next: VersionVector,
    /// `next` as a token's text, the shortest this replica can write: a
    /// version-2 token relative to a checkpoint it keeps, or version 1
    /// (`docs/TOKEN.md`). What a surface answers a reader;
    /// [`Replica::cursor`] reads it back, here or on any replica that
    /// keeps the checkpoint.
    pub token: String,
    /// Whether `next` covers every event this replica holds now.
    pub at_head: bool,
}

/// What one replica sends another: the events the other misses, per stream
/// contiguous from the other's mark, and the sender's floor where the other's
/// mark is below it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// Floors the receiver must record (it cannot get the events below them).
    pub floor: VersionVector,
    /// Per stream in seq order. [`Replica::delta_for`] builds them stream
    /// by stream, streams ascending (when its budget cuts them, what it
    /// keeps is the oldest: a prefix in `(lamport, stream)` order); a
    /// delta decoded by `meshlog-sync` holds them grouped by stream.
    /// Applying takes any order across streams.
    pub events: Vec<Event>,
    /// Per stream, at most one writer's seal over the end of the delta's
    /// run of it (`docs/SIGNING.md`, "Seals"), streams ascending. A run
    /// with none is unsealed: taken as before unless the receiver knows
    /// the stream as sealed or requires seals
    /// ([`Config::require_seals`]).
    pub seals: Vec<RunSeal>,
    /// What backs the delta's floors: compaction statements and the
    /// sender's chain hash at each floor (`docs/SIGNING.md`, "Floors with
    /// an authority").
    pub floor_proofs: crate::FloorProofs,
}

/// What applying a delta did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Events that became visible (including early ones released from the
    /// pending buffer).
    pub applied: u64,
    /// Events already held (or already pending).
    pub duplicates: u64,
    /// Early events now waiting in the pending buffer.
    pub pending: u64,
    /// Early events dropped because the pending buffer was full.
    pub dropped: u64,
    /// Events at or below the floor, ignored.
    pub below_floor: u64,
    /// Streams whose floor the delta raised: streams this replica held
    /// nothing of above its own floor (a newcomer, or it compacted them
    /// whole), where the peer's floor records the range as lost. A peer's
    /// floor never drops an event this replica holds, and never touches
    /// its own stream (`docs/SIGNING.md`, "Floors with an authority").
    pub floors_raised: u64,
    /// Streams this replica holds events of below the peer's floor, with
    /// that floor, streams ascending: the peer cannot serve the seqs
    /// between this replica's head and its floor, so its events of the
    /// stream cannot attach and were not taken (counted in
    /// [`ApplyReport::behind_events`]). The stream is behind *that peer*:
    /// another peer may still serve it. Empty for an honest delta on a
    /// replica that is not behind.
    pub behind_floor: Vec<(StreamId, u64)>,
    /// Events of the streams in [`ApplyReport::behind_floor`] the delta
    /// carried, not taken.
    pub behind_events: u64,
}

/// What a compaction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Events dropped.
    pub dropped: u64,
    /// Streams whose floor rose.
    pub streams: u64,
}

/// A fingerprint of the events a replica holds: their count and the wrapping
/// sum of their content hashes. Independent of arrival order; two replicas
/// with equal floors, marks and digests hold the same events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Digest {
    /// How many events are held.
    pub events: u64,
    /// The wrapping sum of [`Event::content_hash`] over them.
    pub sum: u128,
}

/// What [`Replica::verify`] read and found sound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verified {
    /// Streams held.
    pub streams: usize,
    /// Events read and checked.
    pub events: u64,
}

/// Counters since the replica was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Local appends.
    pub appended: u64,
    /// Received events made visible.
    pub applied: u64,
    /// Received events already held.
    pub duplicates: u64,
    /// Early events dropped for a full pending buffer.
    pub pending_dropped: u64,
    /// Deltas refused (equivocation, bad lamport, limits).
    pub deltas_refused: u64,
    /// Streams found behind a peer's floor (one per stream and delta: see
    /// [`ApplyReport::behind_floor`]).
    pub behind_floor: u64,
    /// Warnings found by `open` ([`Replica::open_warnings`]).
    pub open_warnings: u64,
    /// Seals this replica signed over its own stream's head
    /// ([`Replica::own_seal`]): at most one per head it served.
    pub seals_signed: u64,
}

/// One runtime's replica of the log: its own stream, which it appends to, and
/// every other stream it has received, each a gap-free prefix above its floor.
///
/// ```
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::Replica;
///
/// let mut a = Replica::new(StreamId::new(1));
/// let mut b = Replica::new(StreamId::new(2));
/// a.append(&b"from a"[..])?;
/// b.append(&b"from b"[..])?;
/// // Anti-entropy: each sends what the other misses.
/// let to_b = a.delta_for(&b.marks(), usize::MAX);
/// let to_a = b.delta_for(&a.marks(), usize::MAX);
/// b.apply(&to_b)?;
/// a.apply(&to_a)?;
/// assert_eq!(a.digest(), b.digest());
///
/// // A reader walks a's log, then resumes on b: nothing twice, nothing missed.
/// let first = a.page(&VersionVector::new(), 1)?;
/// let rest = b.page(&first.next, 10)?;
/// assert_eq!(first.events.len() + rest.events.len(), 2);
/// assert!(rest.at_head);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
/// One runtime's replica of the log: its own stream, which it appends to, and
/// every other stream it has received, each a gap-free prefix above its floor.
///
/// Owned by one thread; [`SharedReplica`](crate::SharedReplica) shares one
/// among many (readers that never wait on a commit, group commit, change
/// notification).
///
/// ```
/// use meshlog_cursor::{StreamId, VersionVector};
/// use meshlog_replica::Replica;
///
/// let mut a = Replica::new(StreamId::new(1));
/// let mut b = Replica::new(StreamId::new(2));
/// a.append(&b"from a"[..])?;
/// b.append(&b"from b"[..])?;
/// // Anti-entropy: each sends what the other misses.
/// let to_b = a.delta_for(&b.marks(), usize::MAX);
/// let to_a = b.delta_for(&a.marks(), usize::MAX);
/// b.apply(&to_b)?;
/// a.apply(&to_a)?;
/// assert_eq!(a.digest(), b.digest());
///
/// // A reader walks a's log, then resumes on b: nothing twice, nothing missed.
/// let first = a.page(&VersionVector::new(), 1)?;
/// let rest = b.page(&first.next, 10)?;
/// assert_eq!(first.events.len() + rest.events.len(), 2);
/// assert!(rest.at_head);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Replica<S: Store = MemStore> {
    pub(crate) state: State,
    pub(crate) store: S,
    /// A store commit failed: the store's content is uncertain, so no
    /// further change is made until the replica is reopened. Reads go on
    /// serving the committed state.
    pub(crate) failed: bool,
}

impl Replica<MemStore> {
    /// A new, empty replica writing `stream`, on an in-memory store, with
    /// default limits.
    pub fn new(stream: StreamId) -> Self {
        Replica::open(Config::new(stream), MemStore::default())
            .expect("an empty in-memory store always opens")
    }
}

impl<S: Store> Replica<S> {
    /// Opens a replica on `store`, recovering and checking what it holds:
    /// per stream the events `floor+1 ..= head` with none missing, lamport
    /// rising with seq, and a clock at or above every stamp recorded.
    pub fn open(config: Config, store: S) -> Result<Self, ReplicaError> {
        let state =
            State::load(config, &store).map_err(|error| match (error, store.location()) {
                // A check of the store's content failed: say where it lives.
                (ReplicaError::Corrupt { stream, detail }, Some(location)) => {
                    ReplicaError::Corrupt {
                        stream,
                        detail: format!("{detail} (in {location})"),
                    }
                }
                (error, _) => error,
            })?;
        Ok(Replica {
            state,
            store,
            failed: false,
        })
    }

    /// This replica's own stream.
    pub fn stream(&self) -> StreamId {
        self.state.config().stream
    }

    /// The settings this replica was opened with.
    pub fn config(&self) -> &Config {
        self.state.config()
    }

    /// The marks (head vector): per stream, the last seq held with no hole
    /// below it. What sync sends as high-water marks.
    pub fn marks(&self) -> VersionVector {
        self.state.marks().clone()
    }

    /// The floor: per stream, the last seq compacted away (here or, learned
    /// through sync, at a peer).
    pub fn floor(&self) -> VersionVector {
        self.state.floor().clone()
    }

    /// The lamport clock: at or above every stamp issued or seen.
    pub fn clock(&self) -> u64 {
        self.state.clock()
    }

    /// A fingerprint of the events held.
    pub fn digest(&self) -> Digest {
        self.state.digest()
    }

    /// The chain heads: per stream held, its head and the chain hash
    /// there (none for an unanchored stream), and one hash over them.
    /// Unlike [`Replica::digest`], equal on replicas that hold the same
    /// heads whatever each compacted (`docs/SIGNING.md`). Costs O(streams):
    /// the hashes were computed as the events were committed.
    ///
    /// ```
    /// use meshlog_cursor::{StreamId, VersionVector};
    /// use meshlog_replica::Replica;
    ///
    /// let mut a = Replica::new(StreamId::new(1));
    /// for i in 0..5u8 {
    ///     a.append(vec![i])?;
    /// }
    /// let mut b = Replica::new(StreamId::new(2));
    /// b.apply(&a.delta_for(&b.marks(), usize::MAX))?;
    /// // b drops what it read; the chain head does not move.
    /// b.compact(&a.marks())?;
    /// assert_ne!(a.digest(), b.digest());
    /// assert_eq!(a.chain_digest(), b.chain_digest());
    /// # Ok::<(), meshlog_replica::ReplicaError>(())
    /// ```
    pub fn chain_digest(&self) -> ChainDigest {
        self.state.chain_digest()
    }

    /// `stream`'s chain at its floor and head, if it is held.
    pub fn chain(&self, stream: StreamId) -> Option<StreamChain> {
        self.state.chain(stream)
    }

    /// The newest compaction statement kept of `stream`: the own stream's,
    /// signed when a keyed replica compacts it, or one that erased the
    /// stream here. Sent with the floor (`docs/SIGNING.md`, "Floors with
    /// an authority").
    pub fn statement(&self, stream: StreamId) -> Option<crate::SignedCompaction> {
        self.state.statement(stream)
    }

    /// What a compaction statement of `stream` at this replica's floor
    /// says, for a key with authority to sign (the mesh admin:
    /// [`Compaction::sign_by_admin`](crate::Compaction::sign_by_admin)):
    /// `None` where nothing of it is compacted or its chain is unanchored
    /// (the hash at the floor is not known).
    pub fn compaction(&self, stream: StreamId) -> Option<crate::Compaction> {
        let floor = self.state.floor().get(stream);
        let chain = self.chain(stream).filter(|chain| chain.anchored)?;
        (floor > 0).then_some(crate::Compaction {
            stream,
            floor,
            hash: chain.floor_hash,
        })
    }

    /// What a compaction statement of `stream` at `floor` says (its
    /// chain hash there), for the mesh admin to sign
    /// ([`Compaction::sign_by_admin`](crate::Compaction::sign_by_admin))
    /// without compacting here first: read through the held events up to
    /// `floor`. `None` where this replica cannot know it: `floor` is 0,
    /// below its floor of the stream (the hash went with the events),
    /// above its head, or the stream is unanchored or not held.
    ///
    /// ```
    /// use meshlog_replica::{AdminKey, Config, MemStore, Replica, WriterKey};
    /// let mut writer = Replica::open(Config::with_key(WriterKey::from_bytes([1; 32])), MemStore::default())?;
    /// for i in 0..5u8 {
    ///     writer.append(vec![i])?;
    /// }
    /// let stream = writer.stream();
    /// let statement = writer.compaction_at(stream, 3)?.expect("held and anchored");
    /// assert_eq!((statement.stream, statement.floor), (stream, 3));
    /// let _signed = statement.sign_by_admin(&AdminKey::from_bytes([9; 32]));
    /// // Compacted there, the replica records the same hash.
    /// writer.compact(&[(stream, 3)].into_iter().collect())?;
    /// assert_eq!(writer.compaction(stream), Some(statement));
    /// assert_eq!(writer.compaction_at(stream, 2)?, None, "below the floor");
    /// assert_eq!(writer.compaction_at(stream, 6)?, None, "above the head");
    /// # Ok::<(), meshlog_replica::ReplicaError>(())
    /// ```
    pub fn compaction_at(
        &self,
        stream: StreamId,
        floor: u64,
    ) -> Result<Option<crate::Compaction>, ReplicaError> {
        self.state.compaction_at(stream, floor)
    }

    /// Counters since open.
    pub fn stats(&self) -> Stats {
        self.state.stats()
    }

    /// The seal over the own stream's head, signed by [`Config::key`]
    /// (`None` without a key, or before the first append). Signed once
    /// per head and kept until the head moves: building a delta asks for
    /// it, so the cost is one signature per delta at most.
    pub fn own_seal(&self) -> Option<Seal> {
        self.state.own_seal()
    }

    /// How many early events wait in the pending buffer.
    pub fn pending_len(&self) -> usize {
        self.state.pending_len()
    }

    /// What `open` accepted but reports (also logged, and counted in
    /// [`Stats::open_warnings`]).
    ///
    /// ```
    /// use meshlog_cursor::StreamId;
    /// use meshlog_replica::{Config, MemStore, OpenWarning, Replica};
    ///
    /// let mut wide = Replica::open(Config::new(StreamId::new(1)), MemStore::default())?;
    /// wide.append(&b"own"[..])?;
    /// let mut peer = Replica::new(StreamId::new(2));
    /// peer.append(&b"peer"[..])?;
    /// wide.apply(&peer.delta_for(&wide.marks(), usize::MAX))?;
    /// // Reopened with a lower limit: it opens, and says so.
    /// let mut config = Config::new(StreamId::new(1));
    /// config.streams_max = 1;
    /// let narrow = Replica::open(config, wide.into_store())?;
    /// assert_eq!(
    ///     narrow.open_warnings(),
    ///     [OpenWarning::StreamsOverLimit { streams: 2, limit: 1 }]
    /// );
    /// assert_eq!(narrow.stats().open_warnings, 1);
    /// # Ok::<(), meshlog_replica::ReplicaError>(())
    /// ```
    pub fn open_warnings(&self) -> &[OpenWarning] {
        self.state.open_warnings()
    }

    /// Whether the replica is still relearning its own stream (see
    /// [`Config::recover_own_stream`]).
    pub fn is_recovering(&self) -> bool {
        self.state.is_recovering()
    }

    /// Ends the recovery of the own stream: from now on no peer can write
    /// it, and appends continue after the head relearned. Call it once the
    /// peers that may hold the stream have been synced with (their marks
    /// for it at or below this replica's). A no-op when not recovering.
    pub fn end_recovery(&mut self) {
        self.state.end_recovery();
    }

    /// The event `(stream, seq)`, if held (pending events are not visible).
    /// A failed read (a damaged store on disk) is logged and answers `None`.
    pub fn get(&self, stream: StreamId, seq: u64) -> Option<Event> {
        self.state.get(stream, seq).unwrap_or_else(|error| {
            tracing::error!(%stream, seq, %error, "reading the log failed");
            None
        })
    }

    /// Reads every held event and checks it: each record's checksum (a
    /// [`DiskStore`](crate::DiskStore) checks its crc32 on every read), seqs
    /// without a hole from `floor+1` to `head`, lamport rising with seq, no
    /// stamp above the clock, and the digest recomputed from the events
    /// against the one recorded. Opening reads none of this (it trusts
    /// what the store recorded at its last commit); this is the full check,
    /// for an operator or a test to run. Changes nothing.
    ///
    /// ```
    /// use meshlog_cursor::StreamId;
    /// use meshlog_replica::Replica;
    /// let mut replica = Replica::new(StreamId::new(1));
    /// replica.append(&b"checked"[..])?;
    /// assert_eq!(replica.verify()?.events, 1);
    /// # Ok::<(), meshlog_replica::ReplicaError>(())
    /// ```
    pub fn verify(&self) -> Result<Verified, ReplicaError> {
        self.state.verify()
    }

    /// The cursor covering every held event stamped at or below `lamport`:
    /// what a legacy reader's scalar position converts to. A stream whose
    /// compacted events' stamps are unknown (its first held event is above
    /// `lamport`) gets 0, so that a page reports its compacted range as
    /// possibly lost instead of skipping it.
    ///
    /// ```
    /// use meshlog_cursor::StreamId;
    /// use meshlog_replica::Replica;
    /// let mut replica = Replica::new(StreamId::new(1));
    /// for i in 0..5u8 {
    ///     replica.append(vec![i])?; // lamports 1..=5
    /// }
    /// assert_eq!(replica.covering_lamport(3).get(StreamId::new(1)), 3);
    /// # Ok::<(), meshlog_replica::ReplicaError>(())
    /// ```
    pub fn covering_lamport(&self, lamport: u64) -> VersionVector {
        self.state.covering_lamport(lamport)
    }

    /// The store underneath.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Closes the replica and hands back its store (to reopen it, say).
    pub fn into_store(self) -> S {
        self.store
    }

    /// Appends a local event stamped with the current wall-clock time.
    /// Returns it once the store has committed it.
    pub fn append(&mut self, payload: impl Into<Bytes>) -> Result<Event, ReplicaError> {
        self.append_at(payload, now_ms())
    }

    /// Appends a local event with an explicit wall-clock time (for replays
    /// and deterministic tests).
    pub fn append_at(
        &mut self,
        payload: impl Into<Bytes>,
        time_ms: u64,
    ) -> Result<Event, ReplicaError> {
        let mut events = self.append_batch_at([payload.into()], time_ms)?;
        Ok(events.pop().expect("one payload gives one event"))
    }

    /// Appends several local events in one store commit (one durable write
    /// for all of them). All or none are appended.
    pub fn append_batch_at(
        &mut self,
        payloads: impl IntoIterator<Item = Bytes>,
        time_ms: u64,
    ) -> Result<Vec<Event>, ReplicaError> {
        self.check_usable()?;
        let stream = self.stream();
        let _span = tracing::trace_span!("append", %stream).entered();
        let payloads: Vec<Bytes> = payloads.into_iter().collect();
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        let request = AppendRequest {
            payloads: &payloads,
            time_ms,
        };
        let mut plan = self.state.plan_round(&[RoundItem::Append(request)]);
        let Some(Planned::Appended(run)) = plan.planned.pop() else {
            unreachable!("one append request, one outcome");
        };
        let run = run?;
        // Durable first: nothing is paged or sent that the store could forget.
        self.commit_and_publish(&mut plan)?;
        // The plan is spent: its events move to the caller, not copied.
        let events = plan.take_appended(run);
        tracing::trace!(%stream, len = events.len(), lamport = plan.batch.clock, "append");
        Ok(events)
    }

    /// Up to `limit` events not covered by `after`, ordered by
    /// `(lamport, stream)`, and `next = after ⊔ page`.
    ///
    /// Refuses a cursor below the floor with [`PageError::Stale`], naming
    /// every stream and range lost. Costs O(S + limit · log S) for S
    /// streams, plus logarithmic seeks into the ordered log, whatever the
    /// log's length. A cursor from any replica of the mesh is valid here,
    /// including one ahead of this replica (it gets what this replica holds
    /// beyond it).
    pub fn page(&self, after: &VersionVector, limit: usize) -> Result<Page, PageError> {
        let _span = tracing::trace_span!("page", limit).entered();
        self.state.page(after, limit)
    }

    /// The delta a peer with marks `their_marks` misses: our floor where
    /// their mark is below it, and events per stream contiguous from their
    /// mark, up to `byte_budget` bytes by [`Event::size_hint`] (at least one
    /// event if any is missing), listed stream by stream, streams
    /// ascending. One the budget cuts holds the oldest missing events: the
    /// longest prefix of them in `(lamport, stream)` order that fits, so
    /// every missing event stamped below its newest (in memory it is found
    /// from the streams' lamports, without merging the streams).
    /// Only committed events are ever sent. Where reading the store fails
    /// (a damaged block on disk), the failure is logged and the delta is
    /// empty, never a shorter one; [`Replica::try_delta_for`] answers it.
    pub fn delta_for(&self, their_marks: &VersionVector, byte_budget: usize) -> Delta {
        self.state.delta_for_or_empty(their_marks, byte_budget)
    }

    /// [`Replica::delta_for`], or [`ReplicaError::Store`] where reading
    /// the store fails (naming, for a `DiskStore`, the file and the block).
    pub fn try_delta_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Result<Delta, ReplicaError> {
        let delta = self.state.delta_for(their_marks, byte_budget);
        delta.map_err(ReplicaError::Store)
    }

    /// [`Replica::delta_for`] as columns: the same events, read a slice of
    /// the memory log's columns at a time rather than an [`Event`] (and a
    /// payload handle) each; what a sender that encodes them at once
    /// reads.
    pub fn delta_columns_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> DeltaColumns {
        self.state
            .delta_columns_for_or_empty(their_marks, byte_budget)
    }

    /// [`Replica::delta_columns_for`], or the store's read error (as
    /// [`Replica::try_delta_for`]).
    pub fn try_delta_columns_for(
        &self,
        their_marks: &VersionVector,
        byte_budget: usize,
    ) -> Result<DeltaColumns, ReplicaError> {
        let columns = self.state.delta_columns_for(their_marks, byte_budget);
        columns.map_err(ReplicaError::Store)
    }

    /// How much of a received delta this replica's limits take (see
    /// [`Admission`](crate::Admission)): what a session cuts a delta to
    /// before applying it, rather than checking the limits itself.
    pub fn admission(&self, columns: &DeltaColumns) -> crate::Admission {
        self.state.admission(columns)
    }

    /// Checks a delta against this replica without changing anything: the
    /// first step of [`Replica::apply`].
    pub fn validate(&self, delta: &Delta) -> Result<(), ReplicaError> {
        self.state
            .validate(delta, &RoundIndex::default())
            .map(|_| ())
            .map_err(ReplicaError::from)
    }

    /// Validates, plans, commits, then publishes a delta from a peer.
    /// Idempotent and order-free: the same deltas in any order, any number
    /// of times, leave the same state. Early events wait in the pending
    /// buffer and are never exposed with a hole below them. A refused delta
    /// changes nothing; neither does a failed commit.
    pub fn apply(&mut self, delta: &Delta) -> Result<ApplyReport, ReplicaError> {
        self.check_usable()?;
        let _span = tracing::debug_span!("apply", events = delta.events.len()).entered();
        let mut plan = self.state.plan_round(&[RoundItem::Delta(delta)]);
        self.commit_and_publish(&mut plan)?;
        match plan.planned.pop() {
            Some(Planned::Applied(report)) => {
                tracing::debug!(
                    applied = report.applied,
                    duplicates = report.duplicates,
                    pending = report.pending,
                    dropped = report.dropped,
                    floors_raised = report.floors_raised,
                    behind_floor = ?report.behind_floor,
                    "apply"
                );
                Ok(report)
            }
            Some(Planned::Refused(rejection)) => {
                let (stream, seqs, error) = (rejection.stream, rejection.seqs, rejection.rule);
                tracing::warn!(%stream, ?seqs, %error, "delta refused");
                Err(error)
            }
            _ => unreachable!("one delta, one outcome"),
        }
    }

    /// [`Replica::apply`] for a delta in columns, as a receiver decodes one:
    /// the same checks, outcome and state as applying
    /// [`DeltaColumns::to_delta`]. On a replica whose events are in memory,
    /// a delta that only extends other streams' heads (one run per stream,
    /// no floor, nothing pending in them) is checked per run and held as
    /// columns, without an [`Event`] per event; any other, and any on a
    /// store on disk (which commits events), goes the event path.
    ///
    /// ```
    /// use meshlog_cursor::{StreamId, VersionVector};
    /// use meshlog_replica::Replica;
    ///
    /// let mut writer = Replica::new(StreamId::new(1));
    /// writer.append(&b"hello"[..])?;
    /// let columns = writer.delta_columns_for(&VersionVector::new(), usize::MAX);
    /// let mut reader = Replica::new(StreamId::new(2));
    /// assert_eq!(reader.apply_columns(&columns)?.applied, 1);
    /// assert_eq!(reader.marks(), writer.marks());
    /// # Ok::<(), meshlog_replica::ReplicaError>(())
    /// ```
    pub fn apply_columns(&mut self, columns: &DeltaColumns) -> Result<ApplyReport, ReplicaError> {
        self.check_usable()?;
        for proof in &columns.forks {
            // A proof that proves nothing is the peer's fault, logged; the
            // delta is judged on its own.
            match self.keep_fork(proof) {
                Ok(_) | Err(ReplicaError::Fork(_)) => {}
                Err(error) => return Err(error),
            }
        }
        let Some(mut plan) = self.state.plan_columns(&[RoundItem::Columns(columns)]) else {
            return self.apply(&columns.to_delta());
        };
        let _span = tracing::debug_span!("apply", events = columns.len()).entered();
        self.commit_and_publish(&mut plan)?;
        let Some(Planned::Applied(report)) = plan.planned.pop() else {
            unreachable!("a clean delta in columns is applied");
        };
        tracing::debug!(applied = report.applied, "apply");
        Ok(report)
    }

    /// Raises the floor to `target` (per stream, clamped to the head: a
    /// replica compacts only what it holds) and drops the events below it.
    /// A floor never falls.
    pub fn compact(&mut self, target: &VersionVector) -> Result<CompactReport, ReplicaError> {
        self.check_usable()?;
        let _span = tracing::debug_span!("compact").entered();
        let mut plan = self.state.plan_compact(target);
        let report = plan.compact_report();
        if report.streams > 0 {
            tracing::info!(
                dropped = report.dropped,
                streams = report.streams,
                "compact"
            );
            self.commit_and_publish(&mut plan)?;
        }
        Ok(report)
    }

    /// The proofs of forked streams this replica keeps, one per stream
    /// (`docs/SIGNING.md`, "Equivocation with valid signatures"): each
    /// such stream is frozen.
    pub fn forks(&self) -> Vec<crate::ForkProof> {
        self.state.forks()
    }

    /// Keeps a proof received from a peer, once it verifies under the
    /// stream's key (and the key pinned for it, if any), and freezes its
    /// stream: `Ok(true)` if it is kept, `Ok(false)` if a proof of the
    /// stream is kept already. A proof of the own stream is refused and
    /// logged at `error` (its key signed two histories: it may have
    /// leaked), and the own stream is never frozen.
    pub fn keep_fork(&mut self, proof: &crate::ForkProof) -> Result<bool, ReplicaError> {
        self.check_usable()?;
        let Some(batch) = self.state.fork_batch(proof)? else {
            return Ok(false);
        };
        if let Err(error) = self.store.commit(&batch) {
            self.failed = true;
            tracing::error!(%error, "store commit failed; the replica refuses changes until reopened");
            return Err(store_error(error));
        }
        self.state.publish_forks(&batch);
        Ok(true)
    }

    fn commit_and_publish(
        &mut self,
        plan: &mut crate::state::Plan<'_>,
    ) -> Result<(), ReplicaError> {
        // The chains and seals after the batch, recorded with it (a failed
        // read here commits nothing: the replica stays usable).
        self.state.prepare_commit(plan)?;
        if !plan.batch.is_empty() || !plan.batch.seals.is_empty() || !plan.batch.forks.is_empty() {
            if let Err(error) = self.store.commit(&plan.batch) {
                self.failed = true;
                tracing::error!(%error, "store commit failed; the replica refuses changes until reopened");
                return Err(store_error(error));
            }
        }
        let view = self.store.view();
        self.state.publish(plan, view);
        Ok(())
    }

    fn check_usable(&self) -> Result<(), ReplicaError> {
        if self.failed {
            Err(ReplicaError::Failed)
        } else {
            Ok(())
        }
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
