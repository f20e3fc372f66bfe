//! `NodeReplica`: every replica access of the node, in one place.
//!
//! Today it wraps `meshlog_sync::SharedReplica<DiskStore>`. That handle is
//! being replaced by `meshlog_replica::SharedReplica<S>` (reads that never
//! wait on a commit, a batch append, `covering_lamport`); switching means
//! changing this file only.
//!
//! Also here: the data directory's `stream-id` file, which fixes the node's
//! writer stream on its first start.

use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    CompactReport, Config, DiskError, DiskStore, Event, Page, PageError, Replica, ReplicaError,
    RetentionPolicy, Stats,
};
use meshlog_sync::SharedReplica;

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

    /// The replica's counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Appends `payloads` as one durable commit, all or none; returns the
    /// events once the commit is durable. Commits off the async runtime.
    pub async fn append_batch(&self, payloads: Vec<Bytes>) -> Result<Vec<Event>, ReplicaError> {
        let now = now_ms();
        self.shared
            .with_mut_async(move |replica| replica.append_batch_at(payloads, now))
            .await
    }

    /// Compacts by `policy`, never past what `peer_marks` acknowledge unless
    /// the policy ignores peers. Returns the report and the new floor.
    pub async fn compact(
        &self,
        policy: RetentionPolicy,
        peer_marks: Vec<VersionVector>,
    ) -> Result<(CompactReport, VersionVector), ReplicaError> {
        let now = now_ms();
        self.shared
            .with_mut_async(move |replica| {
                let target = policy.floor(replica, now, &peer_marks);
                let report = replica.compact(&target)?;
                Ok((report, replica.floor()))
            })
            .await
    }

    /// The cursor covering every held event stamped at or below `lamport`:
    /// per stream, the last seq with a lamport at or below it (and at least
    /// the floor, which a scalar reader cannot be told about).
    ///
    /// Temporary: this walks pages from the floor, O(events below the
    /// stamp). `meshlog_replica::SharedReplica::covering_lamport` replaces
    /// it.
    pub fn covering_lamport(&self, lamport: u64) -> VersionVector {
        let page_len = self.config.page_len_max;
        let mut cursor = self.floor();
        loop {
            let page = match self.shared.page(&cursor, page_len) {
                Ok(page) => page,
                // Compacted meanwhile: start again from the new floor.
                Err(PageError::Stale(stale)) => {
                    cursor = stale.resume().clone();
                    continue;
                }
                Err(_) => return cursor,
            };
            for event in &page.events {
                if event.lamport > lamport {
                    return cursor;
                }
                cursor.advance(event.stream, event.seq);
            }
            if page.at_head || page.events.is_empty() {
                return cursor;
            }
        }
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
            let temp = dir.join(format!("{STREAM_ID_FILE}.tmp"));
            let write = || -> std::io::Result<()> {
                let mut file = std::fs::File::create(&temp)?;
                writeln!(file, "{id}")?;
                file.sync_all()?;
                std::fs::rename(&temp, &path)?;
                std::fs::File::open(dir)?.sync_all()
            };
            write().map_err(|error| fail(error.to_string()))?;
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
