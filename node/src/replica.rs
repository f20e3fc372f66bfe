//! `NodeReplica`: every replica access of the node, in one place.
//!
//! It wraps `meshlog_replica::SharedReplica<DiskStore>`, the one handle the
//! HTTP handlers and the sync sessions share: reads never wait on a commit,
//! and appends and received deltas are grouped into durable commits by the
//! handle's committer thread, so an async handler never blocks the runtime
//! on an fsync.
//!
//! Also here: the data directory's `stream-id` file, which fixes the node's
//! writer stream on its first start.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    CompactReport, Config, DiskError, DiskStore, Event, Page, PageError, Replica, ReplicaError,
    RetentionPolicy, SharedReplica, Stats, Verified,
};

/// The file in the data directory that holds the node's stream id, in
/// decimal, written once on the first start.
pub const STREAM_ID_FILE: &str = "stream-id";

/// The node's replica: a durable replica shared by the HTTP handlers and
/// the sync sessions. Cheap to clone.
#[derive(Clone, Debug)]
pub struct NodeReplica {
    shared: SharedReplica<DiskStore>,
    config: Config,
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
    /// The `stream-id` file could not be read or written.
    #[error("{path}: {message}")]
    StreamId {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

impl NodeReplica {
    /// Opens (or creates) the durable replica in `dir`. The stream id comes
    /// from the directory's `stream-id` file; on the first start it is
    /// `requested`, or a random non-zero id, and is written there. A
    /// `requested` id that differs from the recorded one is refused: a
    /// store must not change writers. Blocks (it reads the whole log).
    pub fn open(
        dir: &Path,
        requested: Option<u64>,
        payload_bytes_max: usize,
    ) -> Result<NodeReplica, OpenError> {
        // The store first: its lock keeps a second node off this
        // directory, `stream-id` included.
        let store = DiskStore::open(dir)?;
        let stream = stream_id(dir, requested)?;
        let mut config = Config::new(stream);
        config.payload_bytes_max = payload_bytes_max;
        let replica = Replica::open(config.clone(), store)?;
        Ok(NodeReplica {
            shared: SharedReplica::new(replica),
            config,
        })
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

    /// The replica's counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
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
        let stream = stream_id(dir, None)?;
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

/// Reads the recorded stream id, or records one on the first start.
fn stream_id(dir: &Path, requested: Option<u64>) -> Result<StreamId, OpenError> {
    let path = dir.join(STREAM_ID_FILE);
    let fail = |message: String| OpenError::StreamId {
        path: path.display().to_string(),
        message,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let recorded: u64 = text
                .trim()
                .parse()
                .map_err(|_| fail(format!("not a decimal stream id: {:?}", text.trim())))?;
            if recorded == 0 {
                return Err(fail("stream id 0 is not allowed".into()));
            }
            if let Some(requested) = requested {
                if requested != recorded {
                    return Err(fail(format!(
                        "this data directory writes as stream {recorded}; --stream-id {requested} would change its writer"
                    )));
                }
            }
            Ok(StreamId::new(recorded))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let id = match requested {
                Some(0) => return Err(fail("stream id 0 is not allowed".into())),
                Some(id) => id,
                None => random_nonzero(),
            };
            // Written aside, synced, then renamed: a crash leaves either no
            // file or the whole id.
            let text = format!("{id}\n");
            crate::durable_file::write_aside_and_rename(
                dir,
                STREAM_ID_FILE,
                text.as_bytes(),
                0o644,
            )
            .map_err(|error| fail(error.to_string()))?;
            Ok(StreamId::new(id))
        }
        Err(error) => Err(fail(error.to_string())),
    }
}

/// A random non-zero 64-bit id, from the standard library's per-process
/// random hash keys (seeded by the OS) mixed with the time and process id.
fn random_nonzero() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(now_ms());
        hasher.write_u32(std::process::id());
        let id = hasher.finish();
        if id != 0 {
            return id;
        }
    }
}
