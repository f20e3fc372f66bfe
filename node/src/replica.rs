//! `NodeReplica`: every replica access of the node, in one place.
//!
//! It wraps `meshlog_replica::SharedReplica<DiskStore>`, the one handle the
//! HTTP handlers and the sync sessions share: reads never wait on a commit,
//! and appends and received deltas are grouped into durable commits by the
//! handle's committer thread, so an async handler never blocks the runtime
//! on an fsync.
//!
//! Also here: the data directory's `stream-id` file, which records the
//! node's writer stream, and the upgrade policy (`docs/SIGNING.md`,
//! "Storage, wire and keys on disk"): a new directory writes the stream its
//! `writer.key` derives and seals it; a legacy directory (a `stream-id` its
//! key does not derive) keeps its id, and seals it only where the trust
//! configuration binds its key to it.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    CompactReport, Compaction, Config, Delta, DiskError, DiskStore, Event, Membership, Page,
    PageError, Replica, ReplicaError, RetentionPolicy, SharedReplica, SignedCompaction, Stats,
    Verified, WriterKey, WriterPublicKey,
};

use crate::writer_key::{self, KeyFileError};

/// The file in the data directory that holds the node's stream id, in
/// decimal, written once on the first start.
pub const STREAM_ID_FILE: &str = "stream-id";

/// The node's replica: a durable replica shared by the HTTP handlers and
/// the sync sessions. Cheap to clone.
#[derive(Clone, Debug)]
pub struct NodeReplica {
    shared: SharedReplica<DiskStore>,
    config: Config,
    writer: WriterPublicKey,
    /// `true` while the replica relearns its own stream (opened with
    /// `recover_own_stream`, until [`NodeReplica::end_recovery`]): what an
    /// append waits on ([`NodeReplica::wait_recovered`]).
    recovering: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    /// How long an append waits for the end of recovery before it is
    /// refused.
    append_wait: std::time::Duration,
}

/// Why the data directory could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The store failed to open (locked by another process, damaged, I/O).
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// The replica refused what the store holds.
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    /// The writer key could not be loaded or created.
    #[error(transparent)]
    WriterKey(#[from] KeyFileError),
    /// The `stream-id` file could not be read or written.
    #[error("{path}: {message}")]
    StreamId {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// What the node's replica opens with besides its data directory.
#[derive(Debug, Clone)]
pub struct OpenSettings {
    /// The trust configuration's membership (`Config::membership`).
    pub trust: Membership,
    /// Refuse unsealed streams (`Config::require_seals`); `None`: the
    /// node's rule, resolved by [`OpenSettings::require_seals`].
    pub require_seals: Option<bool>,
    /// `Config::payload_bytes_max`.
    pub payload_bytes_max: usize,
    /// Open relearning the own stream from peers
    /// (`Config::recover_own_stream`; `crate::recovery` ends it).
    pub recover_own_stream: bool,
    /// How long an append waits for the end of recovery before it is
    /// refused (`SyncSettings::recovery_wait`).
    pub append_wait: std::time::Duration,
}

impl OpenSettings {
    /// Whether the replica requires seals: as set, else whenever the
    /// membership is closed. A closed membership admits writers by key,
    /// and a key-holder seals: an unsealed run of an admitted stream
    /// proves nothing of its writer (a peer could invent its first events
    /// before the receiver pins the key). The one place the rule is
    /// applied, for `meshlog serve` and embedders alike.
    pub fn require_seals(&self) -> bool {
        self.require_seals.unwrap_or(!self.trust.is_open())
    }
}

impl NodeReplica {
    /// Opens (or creates) the durable replica in `dir`, with its writer
    /// key (`writer.key`, created on the first start) and `settings`'
    /// trust as its membership. The stream is the one the key derives on the first
    /// start (a `requested` id that differs is refused), and the one the
    /// `stream-id` file records after (a `requested` id that differs is
    /// refused: a store must not change writers). The node seals its
    /// stream where its key signs for it ([`own_stream`]). Blocks (it
    /// reads the whole log).
    pub fn open(
        dir: &Path,
        requested: Option<u64>,
        settings: &OpenSettings,
    ) -> Result<NodeReplica, OpenError> {
        // The store first: its lock keeps a second node off this
        // directory, `writer.key` and `stream-id` included.
        let store = DiskStore::open(dir)?;
        let key = writer_key::load_or_create(Some(dir))?;
        let (stream, sealed) = own_stream(dir, requested, &key, &settings.trust)?;
        let writer = key.public();
        let mut config = Config {
            membership: settings.trust.clone(),
            require_seals: settings.require_seals(),
            ..Config::new(stream)
        };
        config.key = sealed.then_some(key);
        config.payload_bytes_max = settings.payload_bytes_max;
        config.recover_own_stream = settings.recover_own_stream;
        let replica = Replica::open(config.clone(), store)?;
        let (recovering, _) = tokio::sync::watch::channel(settings.recover_own_stream);
        Ok(NodeReplica {
            shared: SharedReplica::new(replica),
            config,
            writer,
            recovering: std::sync::Arc::new(recovering),
            append_wait: settings.append_wait,
        })
    }

    /// The public half of the node's writer key.
    pub fn writer_key(&self) -> WriterPublicKey {
        self.writer
    }

    /// Whether the node seals its own stream (its key derives the stream,
    /// or the trust configuration binds it to this legacy stream).
    pub fn sealed(&self) -> bool {
        self.config.key.is_some()
    }

    /// Whether the replica is relearning its own stream from its peers
    /// (`Config::recover_own_stream`): appends are refused meanwhile.
    pub fn is_recovering(&self) -> bool {
        self.shared.is_recovering()
    }

    /// Ends the relearning of the own stream (queued behind what was
    /// submitted before it), and wakes the appends waiting for it.
    pub async fn end_recovery(&self) {
        let _ = self.shared.end_recovery_async().await;
        self.recovering.send_replace(false);
    }

    /// Waits, at most the append wait, until the own stream is not being
    /// relearned; whether it is not (an append then goes ahead, else it is
    /// answered `503 recovering`).
    pub async fn wait_recovered(&self) -> bool {
        let mut recovering = self.recovering.subscribe();
        let wait = recovering.wait_for(|now| !now);
        let recovered = tokio::time::timeout(self.append_wait, wait).await;
        matches!(recovered, Ok(Ok(_)))
    }

    /// The node's own stream.
    pub fn stream(&self) -> StreamId {
        self.shared.stream()
    }

    /// The replica's limits.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The handle sync sessions run on.
    pub fn sync_handle(&self) -> SharedReplica<DiskStore> {
        self.shared.clone()
    }

    /// The cursor a token's text stands for, of either version (see
    /// `meshlog_replica::Replica::cursor`).
    pub fn cursor(&self, token: &str) -> Result<VersionVector, PageError> {
        self.shared.cursor(token)
    }

    /// The checkpoint `name`, if the replica keeps it (minted, gossiped
    /// or fetched): whether a version-2 token naming it reads here.
    pub fn checkpoint(
        &self,
        name: meshlog_cursor::CheckpointName,
    ) -> Option<meshlog_cursor::Checkpoint> {
        self.shared.checkpoint(name)
    }

    /// The token the replica answers for `cursor`, as a page's `next`
    /// is: the shortest of version 2 against a checkpoint kept and
    /// version 1 (a follow frame's tokens, for a follower that asks for
    /// them short).
    pub fn token(&self, cursor: &VersionVector) -> String {
        self.try_token(cursor)
            .expect("a cursor of this node encodes")
    }

    /// [`NodeReplica::token`] for a cursor that may not encode (one joined
    /// from a reader's: a stale cursor's resume), its error when neither
    /// version holds it.
    pub fn try_token(
        &self,
        cursor: &VersionVector,
    ) -> Result<String, meshlog_cursor::token::TokenError> {
        self.shared
            .token(cursor)
            .or_else(|_| meshlog_cursor::token::encode_text(cursor))
    }

    /// Up to `limit` events after `after`.
    pub fn page(&self, after: &VersionVector, limit: usize) -> Result<Page, PageError> {
        self.shared.page(after, limit)
    }

    /// Up to `limit` events of `stream` alone after `after`; `next` is
    /// `after` with only `stream`'s entry advanced (see
    /// `meshlog_replica::Replica::page_stream`).
    pub fn page_stream(
        &self,
        stream: StreamId,
        after: &VersionVector,
        limit: usize,
    ) -> Result<Page, PageError> {
        self.shared.page_stream(stream, after, limit)
    }

    /// The handle's change notification as a tokio watch (one hook on the
    /// handle for as long as the watch lives).
    pub fn change_watch(&self) -> meshlog_sync::ChangeWatch {
        meshlog_sync::ChangeWatch::new(&self.shared)
    }

    /// The marks (per stream, the last seq held).
    pub fn marks(&self) -> VersionVector {
        self.shared.marks()
    }

    /// The floor (per stream, the last seq compacted away).
    pub fn floor(&self) -> VersionVector {
        self.shared.floor()
    }

    /// The digest of the events held.
    pub fn digest(&self) -> meshlog_replica::Digest {
        self.shared.digest()
    }

    /// The chain heads: per stream, its head and chain hash, and one hash
    /// over them.
    pub fn chain_digest(&self) -> meshlog_replica::ChainDigest {
        self.shared.chain_digest()
    }

    /// The proofs of forked streams kept, one per stream (each frozen).
    pub fn forks(&self) -> Vec<meshlog_replica::ForkProof> {
        self.shared.forks()
    }

    /// The replica's counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The group commit's counters (rounds, commits, the largest round).
    pub fn commit_stats(&self) -> meshlog_replica::CommitStats {
        self.shared.commit_stats()
    }

    /// Appends `payloads` as one durable commit, all or none; returns the
    /// events once the commit is durable. The commit runs on the handle's
    /// committer thread, grouped with other callers' appends and deltas.
    /// Queued when called, not when first polled: calls made one after
    /// another commit in that order (the WebSocket append's pipeline).
    pub fn append_batch(
        &self,
        payloads: Vec<Bytes>,
    ) -> impl std::future::Future<Output = Result<Vec<Event>, ReplicaError>> + Send + 'static {
        self.shared.append_batch_async(payloads)
    }

    /// Compacts by `policy`, never past what `peer_marks` acknowledge unless
    /// the policy ignores peers. Returns the report and the new floor.
    pub async fn compact(
        &self,
        policy: RetentionPolicy,
        peer_marks: Vec<VersionVector>,
    ) -> Result<(CompactReport, VersionVector), ReplicaError> {
        let target = self.shared.retention_floor(&policy, now_ms(), &peer_marks);
        let report = self.shared.compact_async(target).await?;
        Ok((report, self.shared.floor()))
    }

    /// What a compaction statement of `stream` at `floor` commits to (its
    /// chain hash there: `meshlog_replica::Replica::compaction_at`), read
    /// off the runtime: it reads the held events up to `floor`.
    pub async fn compaction_at(
        &self,
        stream: StreamId,
        floor: u64,
    ) -> Result<Option<Compaction>, ReplicaError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.compaction_at(stream, floor))
            .await
            .unwrap_or(Err(ReplicaError::Failed))
    }

    /// Hands a signed compaction statement to the replica as a peer's
    /// delta carrying only it and its floor would: judged by the one
    /// validator (the signer's authority, the signature, the hash at a
    /// held seq), then it erases the stream up to its floor, is kept and
    /// is sent with that floor to peers behind it (`docs/SIGNING.md`,
    /// "Floors with an authority"). A refusal is the replica's
    /// `DeltaError` (and counts in `Stats::deltas_refused`).
    pub async fn take_statement(&self, signed: SignedCompaction) -> Result<(), ReplicaError> {
        let Compaction { stream, floor, .. } = signed.statement;
        let mut delta = Delta {
            floor: [(stream, floor)].into_iter().collect(),
            ..Delta::default()
        };
        delta.floor_proofs.statements.push(signed);
        self.shared.apply_async(delta).await.map(|_| ())
    }

    /// Reads and checks every held event against the recorded digest and
    /// bounds (`meshlog_replica::Replica::verify`), off the runtime. Writes
    /// wait while it runs; reads do not.
    pub async fn verify(&self) -> Result<Verified, ReplicaError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.verify())
            .await
            .unwrap_or(Err(ReplicaError::Failed))
    }

    /// Verifies the data directory of a node that is not running (its lock
    /// keeps a running node's directory from being opened). Refuses a
    /// directory that has no `stream-id` file rather than creating one.
    pub fn verify_dir(dir: &Path) -> Result<Verified, OpenError> {
        if !dir.join(STREAM_ID_FILE).exists() {
            return Err(OpenError::StreamId {
                path: dir.join(STREAM_ID_FILE).display().to_string(),
                message: "no such file: not a node's data directory".into(),
            });
        }
        let store = DiskStore::open(dir)?;
        let stream = stream_id(dir, None, 0)?;
        let replica = Replica::open(Config::new(stream), store)?;
        Ok(replica.verify()?)
    }

    /// When the event `(stream, seq)` was appended (its writer's wall
    /// clock, ms since the epoch), if this replica holds it: the status
    /// stream's last event time per writer.
    pub fn event_time_ms(&self, stream: StreamId, seq: u64) -> Option<u64> {
        self.shared.get(stream, seq).map(|event| event.time_ms)
    }

    /// The cursor covering every held event stamped at or below `lamport`
    /// (see `Replica::covering_lamport`): what a legacy reader's scalar
    /// position converts to.
    pub fn covering_lamport(&self, lamport: u64) -> VersionVector {
        self.shared.covering_lamport(lamport)
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The node's stream, and whether it seals it: on the first start the
/// stream `key` derives (recorded in `stream-id`; a `requested` id that
/// differs is refused), sealed. On later starts the recorded id; where
/// `key` does not derive it (a legacy directory, from before signed
/// streams), sealed only if `trust` binds `key` to it, else unsealed, and
/// a warning says what to do.
fn own_stream(
    dir: &Path,
    requested: Option<u64>,
    key: &WriterKey,
    trust: &Membership,
) -> Result<(StreamId, bool), OpenError> {
    let derived = key.stream();
    if !dir.join(STREAM_ID_FILE).exists() {
        if let Some(requested) = requested.filter(|&id| id != derived.get()) {
            return Err(OpenError::StreamId {
                path: dir.join(STREAM_ID_FILE).display().to_string(),
                message: format!(
                    "a new data directory writes the stream its writer key derives, {}; \
                     --stream-id {requested} is another (drop --stream-id; a node keeps an \
                     older id only in the data directory that records it)",
                    derived.get()
                ),
            });
        }
    }
    let stream = stream_id(dir, requested, derived.get())?;
    let bound = trust
        .binding(stream)
        .is_some_and(|binding| binding.key == key.public());
    let sealed = stream == derived || bound;
    if stream == derived {
        tracing::info!(stream = stream.get(), key = %key.public(), "writes the stream its key derives, sealed");
    } else if bound {
        tracing::info!(stream = stream.get(), key = %key.public(), "writes a legacy stream bound to its key by the trust configuration, sealed");
    } else {
        tracing::warn!(
            stream = stream.get(),
            derived_stream = derived.get(),
            key = %key.public(),
            "this data directory writes the legacy stream {} (recorded in its stream-id file), \
             which its writer key does not derive: the node writes it UNSEALED, and peers \
             that require seals or close membership refuse it. To seal it, bind the key to \
             the stream in every node's trust configuration: `writers = [\"{}@{}\"]`, or a \
             binding the mesh admin signs (docs/OPERATIONS.md, \"Writer keys and trust\")",
            stream.get(),
            key.public(),
            stream.get(),
        );
    }
    Ok((stream, sealed))
}

/// The stream `dir`'s `stream-id` file records, if it has one (`Ok(None)`:
/// no such file, a directory a node never started in).
pub(crate) fn recorded_stream(dir: &Path) -> Result<Option<StreamId>, OpenError> {
    let path = dir.join(STREAM_ID_FILE);
    let fail = |message: String| OpenError::StreamId {
        path: path.display().to_string(),
        message,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(0) => Err(fail("stream id 0 is not allowed".into())),
            Ok(recorded) => Ok(Some(StreamId::new(recorded))),
            Err(_) => Err(fail(format!("not a decimal stream id: {:?}", text.trim()))),
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(fail(error.to_string())),
    }
}

/// Reads the recorded stream id, or records `first` on the first start.
fn stream_id(dir: &Path, requested: Option<u64>, first: u64) -> Result<StreamId, OpenError> {
    let path = dir.join(STREAM_ID_FILE);
    let fail = |message: String| OpenError::StreamId {
        path: path.display().to_string(),
        message,
    };
    if let Some(recorded) = recorded_stream(dir)? {
        if let Some(requested) = requested.filter(|&requested| requested != recorded.get()) {
            return Err(fail(format!(
                "this data directory writes as stream {}; --stream-id {requested} would change its writer",
                recorded.get()
            )));
        }
        return Ok(recorded);
    }
    let id = requested.unwrap_or(first);
    if id == 0 {
        return Err(fail("stream id 0 is not allowed".into()));
    }
    // Written aside, synced, then renamed: a crash leaves either no
    // file or the whole id.
    let text = format!("{id}\n");
    crate::durable_file::write_aside_and_rename(dir, STREAM_ID_FILE, text.as_bytes(), 0o644)
        .map_err(|error| fail(error.to_string()))?;
    Ok(StreamId::new(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(trust: Membership, require_seals: Option<bool>) -> OpenSettings {
        OpenSettings {
            trust,
            require_seals,
            payload_bytes_max: 1024,
            recover_own_stream: false,
            append_wait: std::time::Duration::from_secs(1),
        }
    }

    /// The one rule, for `meshlog serve` and embedders alike: unset, a
    /// closed membership requires seals and an open one does not; set, it
    /// is as set.
    #[test]
    fn a_closed_membership_requires_seals_unless_set_otherwise() {
        let mut closed = Membership::open();
        closed.admit(WriterKey::from_bytes([1; 32]).public());
        assert!(settings(closed.clone(), None).require_seals());
        assert!(!settings(closed, Some(false)).require_seals());
        assert!(!settings(Membership::open(), None).require_seals());
        assert!(settings(Membership::open(), Some(true)).require_seals());
    }
}
