//! `DiskStore`: the durable [`Store`], on the redb embedded engine.
//!
//! A data directory holds three files:
//!
//! - `meshlog.redb`, the redb database: table `blocks` maps
//!   `(stream, first_seq)` to a block of up to 128 consecutive events of the
//!   stream in meshlog's own layout with a crc32 (`block`); table `streams`
//!   maps a stream to its `(floor, head)`; table `chains` maps a stream to
//!   its chain hash at the floor and at the head and whether it is
//!   anchored (`docs/SIGNING.md`); table `seals` maps a stream received
//!   sealed to the key pinned for it and the seals kept (added within
//!   format 4: a file without it holds no pins); table `checkpoints` the
//!   checkpoints kept (added within format 5, `checkpoints`); table `meta` holds the lamport
//!   clock, the digest, the number of blocks and the format version. Every
//!   record carries a crc32 over its key and content, so a damaged value is
//!   named, not served.
//! - `meshlog.wal`, the write-ahead segment: the commits since redb's
//!   last checkpoint, one checksummed record each (`segment`, `record`).
//! - `LOCK`, locked exclusively while a store is open, so that a second
//!   process (or a second open in this one) is refused with
//!   [`DiskError::Locked`], after waiting up to [`DiskOptions::lock_wait`]
//!   for a lock held only for a moment (`lock`). Once the database has been created it also holds
//!   a marker line, so that a data file deleted from under the directory is
//!   reported rather than silently replaced by an empty log.
//!
//! Every [`Store::commit`] is one record appended to the write-ahead
//! segment `meshlog.wal` and synced (`fdatasync`) before `commit` returns;
//! a fold thread then writes it into redb without durability, and until
//! it has, reads serve it from memory (`overlay`); a checkpoint every so
//! many commits makes redb durable and empties the segment (`fold`,
//! `segment`).
//! Recovery on [`DiskStore::open`] opens redb on its last checkpoint
//! (which recorded redb's allocator state, so no page is walked), checks
//! meshlog's own records, and replays the segment's tail:
//! the format, the clock, every stream's `floor <= head`, that the blocks
//! of each stream start at `floor+1` and its last block (read and
//! crc-checked) ends at `head`, the number of blocks, and the recorded
//! digest. The replica's open reads
//! no events: it takes the recorded bounds, clock and digest, and reads
//! events later through the store's view and redb's bounded cache. The
//! full check of every record (each value's crc32, seqs without a hole,
//! lamport rising with seq, the digest recounted) is
//! `Replica::verify`, on demand.
//!
//! # Layout
//!
//! - `block`: a block's layout, its checks, and the builder.
//! - `checkpoints`: the `checkpoints` table, written apart from the
//!   segment.
//! - `codec`: the records of the `streams`, `chains`, `seals` and `meta`
//!   tables.
//! - `error`: [`DiskError`] and the helpers that build it.
//! - `segment`: the write-ahead segment's file, its framing and its scan.
//! - `record`: a commit as a segment record (the codec of a whole batch).
//! - `db`: the redb tables, the database handle closed under a guard,
//!   and write transactions, durable or not.
//! - `options`: [`DiskOptions`] and their defaults, and [`Recovery`].
//! - `fold`: the fold thread and what it shares with the committer,
//!   a commit's check against the heads (`plan`), checkpoints, replay.
//! - `commit`: the store's side of the fold: a commit's path into the
//!   segment and on to the fold thread, closing, and the fold's test
//!   hooks.
//! - `overlay`: the commits not folded yet, and the rule that merges them
//!   with redb's blocks in every read.
//! - `write`: a commit's writes into redb (blocks and records), which the
//!   fold runs.
//! - `lock`: the directory's lock, its bounded wait, and why it is
//!   released explicitly.
//! - `view`: [`DiskView`](view::DiskView), the blocks as of one fold and
//!   the overlay after it, and its scans.
//! - `upgrade`: formats 1 and 2 (a value per event) and 3 (no chains),
//!   upgraded on open.
//!
//! Imports flow one way: the leaves (`error`, `db`, `options`, `codec`,
//! `record`, `segment`, `overlay`) import nothing of the store, `fold`
//! imports only leaves, and the files that add to [`DiskStore`]
//! (`commit`, `write`, `upgrade`, `checkpoints`) import this module,
//! which imports none of them.
//!
//! See `docs/STORAGE.md` for the engine choice and its measurements.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use meshlog_cursor::{StreamId, VersionVector};
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use crate::store::{StoreView, ViewKind};
use crate::{
    Batch, ChainHash, Digest, Event, KeptSeals, Seal, Store, StoreMeta, StreamChain,
    WriterPublicKey,
};

mod block;
mod checkpoints;
mod codec;
mod commit;
mod db;
mod error;
mod fold;
mod lock;
mod options;
mod overlay;
mod record;
mod segment;
mod upgrade;
pub(crate) mod view;
mod write;

use block::Block;
use codec::{
    decode_chain, decode_clock, decode_count, decode_digest, decode_format, decode_seals,
    decode_stream, encode_count, encode_digest, encode_format, META_BLOCKS, META_CLOCK,
    META_DIGEST, META_FORMAT,
};
use db::{begin_write_with, Db, BLOCKS, CHAINS, FORKS, META, SEALS, STATEMENTS, STREAMS};
pub use error::DiskError;
use error::{corrupt_block, engine_error, guarded, io, panic_message};
pub use fold::FoldLag;
use fold::{locked, FoldShared, Folder};
use lock::{DirLock, Waiting};
pub use options::{
    DiskOptions, Recovery, CACHE_BYTES_DEFAULT, CHECKPOINT_BYTES_DEFAULT,
    CHECKPOINT_RECORDS_DEFAULT, LOCK_WAIT_DEFAULT, UNFOLDED_BYTES_MAX_DEFAULT,
    UNFOLDED_RECORDS_MAX_DEFAULT,
};
use overlay::Overlay;
pub use segment::SEGMENT_FILE;
use segment::{Segment, SegmentFile};
use view::BlocksTable;
pub(crate) use view::DiskView;

/// The name of the redb database file inside a data directory.
pub const DATA_FILE: &str = "meshlog.redb";
/// The name of the lock file inside a data directory.
pub const LOCK_FILE: &str = "LOCK";
/// The on-disk format this build writes: 4, events in blocks and each
/// stream's chain heads. It also reads formats 1 (a value per event, no
/// digest record) and 2 (a value per event), which it upgrades on open to
/// format 3 (it reads and checks every event once and writes the blocks,
/// the digest and format 3 in one commit), and format 3, which it upgrades
/// to 4 (it chains every stream's held events from its floor and writes
/// the chains and format 4 in one commit), so that a build that does not
/// keep chains refuses the file from then on.
///
/// Format 5 adds the write-ahead segment (`meshlog.wal`) and the `meta`
/// record `"folded"` (the number of the last segment record redb holds);
/// a file of format 4 becomes format 5 by its format record alone, and a
/// build of format 4, which would not replay the segment, refuses it.
pub const FORMAT_VERSION: u32 = 5;
// The `seals` record's bounds are the kept seals'.
const _: () = assert!(codec::SEALS_RECORD_MAX == KeptSeals::SEALS_MAX);
const _: () = assert!(codec::SEAL_LEN == Seal::LEN);
/// Written to `LOCK` once the database exists; see the module docs.
const LOCK_MARKER: &[u8] = b"meshlog-replica data directory, format 1\n";

/// The durable [`Store`]: a redb database in a locked data directory.
///
/// ```
/// use meshlog_cursor::StreamId;
/// use meshlog_replica::{Config, DiskStore, Replica};
///
/// let dir = std::env::temp_dir().join(format!("meshlog-doc-{}", std::process::id()));
/// # let _ = std::fs::remove_dir_all(&dir);
/// let config = Config::new(StreamId::new(1));
/// let mut replica = Replica::open(config.clone(), DiskStore::open(&dir)?)?;
/// replica.append(&b"hello"[..])?;
/// drop(replica); // or a crash: the append was durable when it returned
///
/// let reopened = Replica::open(config, DiskStore::open(&dir)?)?;
/// assert_eq!(reopened.marks().get(StreamId::new(1)), 1);
/// # drop(reopened);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    path: PathBuf,
    db: Arc<Db>,
    /// What the commits that returned hold (folded into redb or not),
    /// kept to validate batches without a read.
    meta: StoreMeta,
    /// The events as of the last commit, for the replica to read.
    view: Option<StoreView>,
    recovery: Recovery,
    /// The write-ahead segment: a commit is durable once its record is
    /// appended and synced there (`fold`). Shared with the fold thread,
    /// which empties it at a checkpoint.
    segment: Arc<Mutex<Segment>>,
    /// The number of the last record appended to the segment.
    number: u64,
    /// The records the fold thread has yet to write into redb.
    fold: Arc<FoldShared>,
    /// The fold thread, from the end of the open until the store drops.
    fold_thread: Option<std::thread::JoinHandle<()>>,
    /// [`DiskOptions::checkpoint_records`] and
    /// [`DiskOptions::checkpoint_bytes`].
    checkpoint_at: (u64, u64),
    /// Held for its lock; released when the store is dropped, after the
    /// database closed (fields drop in order).
    lock: DirLock,
}

impl DiskStore {
    /// Opens (or creates) the store in `dir`, locking the directory, and
    /// recovers and checks it. A damaged file gives a [`DiskError`] naming
    /// it, never a panic and never a silently shorter log.
    pub fn open(dir: impl AsRef<Path>) -> Result<DiskStore, DiskError> {
        DiskStore::open_with(dir, &DiskOptions::default())
    }

    /// [`DiskStore::open`], with `options`.
    pub fn open_with(dir: impl AsRef<Path>, options: &DiskOptions) -> Result<DiskStore, DiskError> {
        DiskStore::open_inner(
            dir.as_ref(),
            options,
            None::<redb::backends::FileBackend>,
            None,
        )
    }

    /// [`DiskStore::open_with`], over the given redb storage backend instead
    /// of the file `dir/meshlog.redb`: for tests that simulate a disk (the
    /// power-loss test keeps writes in memory until `sync_data`) and for
    /// embedders with storage of their own. `dir` still holds `LOCK` and
    /// still names the data file in errors and [`DiskStore::path`]; the
    /// backend stands for that file, and an empty backend is a missing file.
    /// Every check of [`DiskStore::open`] runs, except that a damaged
    /// backend no open ever acknowledged cannot be set aside as a file
    /// can: it is reported, never started over.
    ///
    /// The backend trait is redb's, so it ties a caller to the redb version
    /// this crate pins (`redb = "=4.6.0"`).
    pub fn open_with_backend(
        dir: impl AsRef<Path>,
        options: &DiskOptions,
        backend: impl redb::StorageBackend,
    ) -> Result<DiskStore, DiskError> {
        DiskStore::open_inner(dir.as_ref(), options, Some(backend), None)
    }

    /// [`DiskStore::open_with_backend`], with the write-ahead segment
    /// (`dir/meshlog.wal`) over `segment` too: the power-loss test puts
    /// both on simulated disks. An empty segment backend is an empty
    /// segment (a backend cannot be told missing from empty).
    pub fn open_with_backends(
        dir: impl AsRef<Path>,
        options: &DiskOptions,
        backend: impl redb::StorageBackend,
        segment: impl redb::StorageBackend,
    ) -> Result<DiskStore, DiskError> {
        DiskStore::open_inner(
            dir.as_ref(),
            options,
            Some(backend),
            Some(Box::new(segment)),
        )
    }

    fn open_inner<B: redb::StorageBackend>(
        dir: &Path,
        options: &DiskOptions,
        backend: Option<B>,
        segment: Option<Box<dyn redb::StorageBackend>>,
    ) -> Result<DiskStore, DiskError> {
        let dir = dir.to_path_buf();
        create_dir_durably(&dir)?;
        let lock_path = dir.join(LOCK_FILE);
        let mut lock = DirLock::acquire(&dir, &lock_path, options.lock_wait)?;
        let marked = read_marker(&mut lock, &lock_path)?;
        let path = dir.join(DATA_FILE);
        let segment_path = dir.join(SEGMENT_FILE);
        let (segment, segment_missing) = match segment {
            Some(segment) => (segment, false),
            None => {
                let (file, existed) = SegmentFile::open(&segment_path)?;
                if !existed {
                    sync_dir(&dir)?;
                }
                (Box::new(file) as Box<dyn redb::StorageBackend>, !existed)
            }
        };
        let exists = match &backend {
            // An empty backend is what a missing (or empty) file is.
            Some(backend) => backend.len().map_err(io(&path, "stat"))? > 0,
            None => path.try_exists().map_err(io(&path, "stat"))?,
        };
        if !exists && marked {
            return Err(DiskError::Corrupt {
                path,
                detail: format!(
                    "the data file is missing, but {} records that this directory held a store",
                    lock_path.display()
                ),
            });
        }
        let repair = Arc::new(RepairSeen::default());
        let (db, created) = open_or_start_over(&path, exists, marked, options, &repair, backend)?;
        if created {
            // The new file's directory entry must be durable before the
            // first commit is acknowledged.
            sync_dir(&dir)?;
        }
        let mut store = DiskStore {
            dir,
            db: Arc::new(Db::new(db, path.clone())),
            path,
            meta: StoreMeta::default(),
            view: None,
            recovery: Recovery {
                created,
                rolled_back: repair.rolled_back.load(Ordering::Relaxed),
                pages_checked: repair.ran.load(Ordering::Relaxed),
                ..Recovery::default()
            },
            segment: Arc::new(Mutex::new(Segment::new(segment_path, segment))),
            number: 0,
            fold: Arc::new(FoldShared::new(options)),
            fold_thread: None,
            checkpoint_at: (options.checkpoint_records.max(1), options.checkpoint_bytes),
            lock,
        };
        store.load_on_open(marked, segment_missing, &lock_path)?;
        store.log_opened();
        Ok(store)
    }

    /// The reads (and the first writes) of an open, once the database is
    /// open: the format record (written into a new file, then the lock
    /// file's marker), the upgrade of an older format, the meta records
    /// and the first view. A plain open trusts a file redb closed cleanly,
    /// and redb may panic reading one damaged since: every read of the open
    /// is guarded, as the open itself is.
    ///
    /// Then it replays the segment's commits that redb does not hold
    /// durably (`fold`). A directory whose data file is of this format but
    /// whose segment file was missing is refused: the commits it held
    /// would be lost.
    fn load_on_open(
        &mut self,
        marked: bool,
        segment_missing: bool,
        lock_path: &Path,
    ) -> Result<(), DiskError> {
        let path = self.path.clone();
        guarded(&path, "reading it on open", || {
            let found = self.init_format(marked)?;
            if !marked {
                // Only after the format commit is durable: a marker promises
                // a data file worth missing.
                let lock = self.lock.file();
                lock.write_all(LOCK_MARKER)
                    .and_then(|()| lock.sync_all())
                    .map_err(io(lock_path, "write lock file"))?;
            }
            if found < FORMAT_VERSION {
                self.upgrade(found)?;
            } else if marked && segment_missing {
                return Err(DiskError::Segment {
                    path: self.dir.join(SEGMENT_FILE),
                    offset: 0,
                    detail: "the segment file is missing, but the data file is of a format \
                             that keeps one: commits it held would be lost"
                        .to_string(),
                });
            }
            let (meta, blocks) = self.load_meta()?;
            let mut folder = Folder {
                dir: self.dir.clone(),
                path: self.path.clone(),
                db: Arc::clone(&self.db),
                meta,
                blocks,
                value: Vec::new(),
                folded: 0,
            };
            folder.folded = folder.folded_record()?;
            let walked = self.recovery.pages_checked || found < FORMAT_VERSION;
            folder.replay(&mut locked(&self.segment), &mut self.recovery, walked)?;
            self.meta = folder.meta.clone();
            self.number = folder.folded;
            self.start_fold(folder)?;
            self.make_view()
        })
    }

    fn log_opened(&self) {
        tracing::debug!(
            dir = %self.dir.display(),
            streams = self.meta.heads.len(),
            clock = self.meta.clock,
            created = self.recovery.created,
            rolled_back = self.recovery.rolled_back,
            pages_checked = self.recovery.pages_checked,
            replayed = self.recovery.replayed,
            torn_bytes = self.recovery.torn_bytes,
            "disk store opened"
        );
        if self.recovery.rolled_back {
            tracing::warn!(
                path = %self.path.display(),
                "the newest commit was torn; recovered the commit before it"
            );
        }
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What recovery found on open.
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// Writes the format record into a database that has none yet: a new
    /// file, or one whose first commit never completed (nothing in it was
    /// ever acknowledged). Refuses a database that has meshlog tables but no
    /// format record, and one without it in a directory whose lock file
    /// records a store (`marked`): that file was replaced, and writing a
    /// format into it would serve an empty log.
    /// Answers the format found (this build's for a new file).
    fn init_format(&mut self, marked: bool) -> Result<u32, DiskError> {
        let read = self.db.begin_read().map_err(self.engine("begin read"))?;
        let format = match read.open_table(META) {
            Ok(table) => table
                .get(META_FORMAT)
                .map_err(self.engine("read format"))?
                .map(|value| value.value().to_vec()),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(error) => return Err(self.engine("open meta table")(error)),
        };
        if let Some(format) = format {
            let found = decode_format(&format).ok_or_else(|| {
                self.corrupt(format!(
                    "the format record fails its checksum ({} bytes)",
                    format.len()
                ))
            })?;
            if !(1..=FORMAT_VERSION).contains(&found) {
                return Err(DiskError::Format {
                    path: self.path.clone(),
                    found,
                    expected: FORMAT_VERSION,
                });
            }
            return Ok(found);
        }
        let tables = read
            .list_tables()
            .map_err(self.engine("list tables"))?
            .count();
        drop(read);
        if tables > 0 {
            return Err(self.corrupt("meshlog tables exist but the format record is missing"));
        }
        if marked {
            return Err(self.corrupt(format!(
                "the format record is missing, but {} records that this directory held a store",
                self.dir.join(LOCK_FILE).display()
            )));
        }
        let txn = self.begin_write()?;
        {
            let mut meta = txn
                .open_table(META)
                .map_err(self.engine("open meta table"))?;
            meta.insert(META_FORMAT, encode_format(FORMAT_VERSION).as_slice())
                .map_err(self.engine("write format"))?;
            meta.insert(META_DIGEST, digest_record(Digest::default()).as_slice())
                .map_err(self.engine("write digest"))?;
            meta.insert(META_BLOCKS, encode_count(META_BLOCKS, 0).as_slice())
                .map_err(self.engine("write block count"))?;
            txn.open_table(BLOCKS)
                .map_err(self.engine("create blocks table"))?;
            txn.open_table(STREAMS)
                .map_err(self.engine("create streams table"))?;
            txn.open_table(CHAINS)
                .map_err(self.engine("create chains table"))?;
            txn.open_table(SEALS)
                .map_err(self.engine("create seals table"))?;
        }
        txn.commit().map_err(self.engine("commit format"))?;
        Ok(FORMAT_VERSION)
    }

    /// Reads and checks the stream records: `(floor, head)` per stream.
    fn stream_records(
        &self,
        read: &redb::ReadTransaction,
    ) -> Result<BTreeMap<StreamId, (u64, u64)>, DiskError> {
        let streams = read
            .open_table(STREAMS)
            .map_err(self.engine("open streams table"))?;
        let mut records = BTreeMap::new();
        for entry in streams.iter().map_err(self.engine("read streams"))? {
            let (key, value) = entry.map_err(self.engine("read streams"))?;
            let stream = StreamId::new(key.value());
            let (floor, head) = decode_stream(stream, value.value()).ok_or_else(|| {
                self.corrupt(format!("the record of stream {stream} fails its checksum"))
            })?;
            if head < floor {
                return Err(self.corrupt(format!(
                    "stream {stream} records head {head} below floor {floor}"
                )));
            }
            records.insert(stream, (floor, head));
        }
        Ok(records)
    }

    /// Reads and checks the chain records, each of a stream with a stream
    /// record, for its floor and at or below its head (a stream hashed
    /// lazily: the seq its head hash is at, [`Batch::hashed`]). A stream
    /// without one is chained again on open.
    #[allow(clippy::type_complexity)]
    fn chain_records(
        &self,
        read: &redb::ReadTransaction,
        streams: &BTreeMap<StreamId, (u64, u64)>,
    ) -> Result<(BTreeMap<StreamId, StreamChain>, BTreeMap<StreamId, u64>), DiskError> {
        let table = read
            .open_table(CHAINS)
            .map_err(self.engine("open chains table"))?;
        let mut chains = BTreeMap::new();
        let mut hashed = BTreeMap::new();
        for entry in table.iter().map_err(self.engine("read chains"))? {
            let (key, value) = entry.map_err(self.engine("read chains"))?;
            let stream = StreamId::new(key.value());
            let (floor, head, floor_hash, head_hash, anchored) =
                decode_chain(stream, value.value()).ok_or_else(|| {
                    self.corrupt(format!(
                        "the chain record of stream {stream} fails its checksum"
                    ))
                })?;
            match streams.get(&stream) {
                None => {
                    return Err(self.corrupt(format!(
                        "stream {stream} has a chain record but no stream record"
                    )))
                }
                Some(&bounds) if bounds.0 != floor || head < floor || head > bounds.1 => {
                    return Err(self.corrupt(format!(
                        "stream {stream} records floor {} and head {}, but its chain record \
                         is for floor {floor} and seq {head}",
                        bounds.0, bounds.1
                    )))
                }
                Some(&(_, stream_head)) if head < stream_head => {
                    hashed.insert(stream, head);
                }
                Some(_) => {}
            }
            chains.insert(
                stream,
                StreamChain {
                    floor_hash: ChainHash::from_bytes(floor_hash),
                    head_hash: ChainHash::from_bytes(head_hash),
                    anchored,
                },
            );
        }
        Ok((chains, hashed))
    }

    /// Reads the digest record, if there is one.
    fn digest_record(&self, read: &redb::ReadTransaction) -> Result<Option<Digest>, DiskError> {
        let meta = read
            .open_table(META)
            .map_err(self.engine("open meta table"))?;
        let record = meta
            .get(META_DIGEST)
            .map_err(self.engine("read digest"))?
            .map(|value| value.value().to_vec());
        record
            .map(|record| {
                decode_digest(&record)
                    .map(|(events, sum)| Digest { events, sum })
                    .ok_or_else(|| self.corrupt("the digest record fails its checksum"))
            })
            .transpose()
    }

    /// Starts the fold thread, which from now on writes into redb.
    fn start_fold(&mut self, folder: Folder) -> Result<(), DiskError> {
        let (shared, segment) = (Arc::clone(&self.fold), Arc::clone(&self.segment));
        let checkpoint_at = self.checkpoint_at;
        let thread = std::thread::Builder::new()
            .name("meshlog-fold".to_string())
            .spawn(move || {
                let ran = catch_unwind(AssertUnwindSafe(|| {
                    fold::run(folder, Arc::clone(&shared), segment, checkpoint_at)
                }));
                if let Err(panic) = ran {
                    shared.panicked(format!(
                        "the fold thread panicked: {}",
                        panic_message(&*panic)
                    ));
                }
            })
            .map_err(io(&self.path, "start the fold thread"))?;
        self.fold_thread = Some(thread);
        Ok(())
    }

    /// Takes the view of the events as of the last commit: the commits the
    /// fold has not written, then a redb snapshot (in that order, so the
    /// snapshot holds every commit before them).
    fn make_view(&mut self) -> Result<(), DiskError> {
        let overlay = self.fold.overlay();
        self.fold.view_pause_point();
        self.view = Some(StoreView {
            kind: ViewKind::Disk(Arc::new(self.disk_view(overlay)?)),
            digest: self.meta.digest,
        });
        Ok(())
    }

    /// The view of the last commit.
    fn current_view(&self) -> Result<&DiskView, DiskError> {
        match &self.view {
            Some(StoreView {
                kind: ViewKind::Disk(view),
                ..
            }) => Ok(view),
            _ => Err(self.corrupt("read before the store's open finished")),
        }
    }

    fn disk_view(&self, overlay: Overlay) -> Result<DiskView, DiskError> {
        let read = self.db.begin_read().map_err(self.engine("begin read"))?;
        let blocks = read
            .open_table(BLOCKS)
            .map_err(self.engine("open blocks table"))?;
        Ok(DiskView::new(self.path.clone(), blocks, overlay))
    }

    /// Reads and checks the seals records: each one's seals of its stream,
    /// ascending (those outside the stream's `(floor, head]` dropped). A file without
    /// the table (format 4 before it was added) holds no pins.
    fn seal_records(
        &self,
        read: &redb::ReadTransaction,
        streams: &BTreeMap<StreamId, (u64, u64)>,
    ) -> Result<BTreeMap<StreamId, KeptSeals>, DiskError> {
        let table = match read.open_table(SEALS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(BTreeMap::new()),
            Err(error) => return Err(self.engine("open seals table")(error)),
        };
        let mut kept = BTreeMap::new();
        for entry in table.iter().map_err(self.engine("read seals"))? {
            let (key, value) = entry.map_err(self.engine("read seals"))?;
            let stream = StreamId::new(key.value());
            let bad = |detail: String| {
                self.corrupt(format!("the seals record of stream {stream}: {detail}"))
            };
            let (key, seals) = decode_seals(stream, value.value()).map_err(bad)?;
            let key = WriterPublicKey::from_bytes(&key).map_err(|e| bad(e.to_string()))?;
            // A pin of a stream not held (its sealed run came early, and
            // was dropped) has no stream record, and no seals.
            let (floor, head) = streams.get(&stream).copied().unwrap_or((0, 0));
            let mut previous = 0;
            let mut decoded = Vec::with_capacity(seals.len());
            for bytes in &seals {
                let seal = Seal::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
                if seal.stream != stream || seal.seq <= previous {
                    return Err(bad(format!(
                        "a seal of stream {} at seq {} after seq {previous}",
                        seal.stream, seal.seq
                    )));
                }
                previous = seal.seq;
                // Outside the stream's range (a build that kept no seals
                // compacted it since): dropped, not refused.
                if seal.seq > floor && seal.seq <= head {
                    decoded.push(seal);
                } else {
                    tracing::info!(%stream, seq = seal.seq, floor, head, "a kept seal outside the stream's range is dropped");
                }
            }
            kept.insert(
                stream,
                KeptSeals {
                    key,
                    seals: decoded,
                },
            );
        }
        Ok(kept)
    }

    /// Reads and checks the forks records: each one's proof, decoded, of
    /// its stream (verified when it was kept; its crc32 now). A file
    /// without the table holds no proofs.
    fn fork_records(
        &self,
        read: &redb::ReadTransaction,
    ) -> Result<BTreeMap<StreamId, crate::ForkProof>, DiskError> {
        let table = match read.open_table(FORKS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(BTreeMap::new()),
            Err(error) => return Err(self.engine("open forks table")(error)),
        };
        let mut forks = BTreeMap::new();
        for entry in table.iter().map_err(self.engine("read forks"))? {
            let (key, value) = entry.map_err(self.engine("read forks"))?;
            let stream = StreamId::new(key.value());
            let bad = |detail: String| {
                self.corrupt(format!("the forks record of stream {stream}: {detail}"))
            };
            let bytes = codec::decode_fork(stream, value.value()).map_err(bad)?;
            let proof = crate::ForkProof::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
            if proof.stream() != stream {
                return Err(bad(format!("a proof of stream {}", proof.stream())));
            }
            forks.insert(stream, proof);
        }
        Ok(forks)
    }

    /// Reads and checks the streams, the clock, the digest and the blocks'
    /// extent: per stream, the first block starts at `floor + 1` and the
    /// last block, read and crc-checked, ends at `head`; the table holds
    /// the number of blocks recorded. O(streams), not O(events).
    fn load_meta(&self) -> Result<(StoreMeta, u64), DiskError> {
        let read = self.db.begin_read().map_err(self.engine("begin read"))?;
        let (clock, recorded_blocks) = self.clock_and_block_count(&read)?;
        let digest = self
            .digest_record(&read)?
            .ok_or_else(|| self.corrupt("the digest record is missing"))?;
        let records = self.stream_records(&read)?;
        let blocks = read
            .open_table(BLOCKS)
            .map_err(self.engine("open blocks table"))?;
        let mut meta = StoreMeta {
            clock,
            ..StoreMeta::default()
        };
        let mut expected_len: u64 = 0;
        for (&stream, &(floor, head)) in &records {
            let held = self.held_extent(&blocks, stream)?;
            self.check_extent(stream, floor, head, held)?;
            expected_len = expected_len.checked_add(head - floor).ok_or_else(|| {
                self.corrupt(format!(
                    "the stream records account for more than {} events",
                    u64::MAX
                ))
            })?;
            meta.floor.advance(stream, floor);
            meta.heads.advance(stream, head);
        }
        // The replica's open reads each head by a point lookup, which walks
        // the tree by another path than the extent's range: a damaged key
        // in a branch page can hide the head from one and not the other.
        let view = DiskView::new(
            self.path.clone(),
            read.open_table(BLOCKS)
                .map_err(self.engine("open blocks table"))?,
            Overlay::default(),
        );
        for (&stream, &(floor, head)) in &records {
            if head > floor && view.block_at(stream, head)?.is_none() {
                return Err(self.corrupt(format!(
                    "stream {stream} records head {head}, but a lookup of it finds no block"
                )));
            }
        }
        if digest.events != expected_len {
            return Err(self.corrupt(format!(
                "the digest record counts {} events, but the stream records account for \
                 {expected_len}",
                digest.events
            )));
        }
        let len = blocks.len().map_err(self.engine("count blocks"))?;
        if len != recorded_blocks {
            return Err(self.corrupt(format!(
                "the blocks table holds {len} blocks, but the meta record counts {recorded_blocks}"
            )));
        }
        meta.digest = Some(digest);
        (meta.chains, meta.hashed) = self.chain_records(&read, &records)?;
        meta.seals = self.seal_records(&read, &records)?;
        meta.statements = self.statement_records(&read)?;
        meta.checkpoints = self.checkpoint_records(&read)?;
        meta.forks = self.fork_records(&read)?;
        Ok((meta, recorded_blocks))
    }

    /// Reads the clock record (0 when there is none yet) and the block
    /// count record (which every format-3 file has).
    fn clock_and_block_count(&self, read: &redb::ReadTransaction) -> Result<(u64, u64), DiskError> {
        let meta_table = read
            .open_table(META)
            .map_err(self.engine("open meta table"))?;
        let clock = match meta_table
            .get(META_CLOCK)
            .map_err(self.engine("read clock"))?
        {
            Some(value) => decode_clock(value.value())
                .ok_or_else(|| self.corrupt("the clock record fails its checksum"))?,
            None => 0,
        };
        let recorded_blocks = match meta_table
            .get(META_BLOCKS)
            .map_err(self.engine("read block count"))?
        {
            Some(value) => decode_count(META_BLOCKS, value.value())
                .ok_or_else(|| self.corrupt("the block count record fails its checksum"))?,
            None => return Err(self.corrupt("the block count record is missing")),
        };
        Ok((clock, recorded_blocks))
    }

    /// The seqs the blocks of `stream` hold, from the first block's key to
    /// the last block's last seq (that block read and crc-checked); `None`
    /// when it has no block.
    fn held_extent(
        &self,
        blocks: &BlocksTable,
        stream: StreamId,
    ) -> Result<Option<(u64, u64)>, DiskError> {
        let range = (stream.get(), 0)..=(stream.get(), u64::MAX);
        let mut held = blocks.range(range).map_err(self.engine("read blocks"))?;
        let first = held
            .next()
            .transpose()
            .map_err(self.engine("read blocks"))?
            .map(|(key, _)| key.value().1);
        let last = match held
            .next_back()
            .transpose()
            .map_err(self.engine("read blocks"))?
        {
            Some((key, value)) => Some(self.last_seq_of(stream, key.value().1, value.value())?),
            // One block: it is the first and the last.
            None => match first {
                Some(first_seq) => {
                    let value = blocks
                        .get((stream.get(), first_seq))
                        .map_err(self.engine("read blocks"))?
                        .ok_or_else(|| self.corrupt("a block vanished while read"))?;
                    Some(self.last_seq_of(stream, first_seq, value.value())?)
                }
                None => None,
            },
        };
        Ok(first.zip(last))
    }

    /// The last seq of the block of `stream` from `first_seq`, decoded
    /// (and crc-checked) from its stored `value`.
    fn last_seq_of(
        &self,
        stream: StreamId,
        first_seq: u64,
        value: &[u8],
    ) -> Result<u64, DiskError> {
        let block = Block::decode(stream, first_seq, value)
            .map_err(|detail| self.damaged(stream, first_seq, detail))?;
        Ok(block.last_seq())
    }

    /// Checks that the blocks of `stream` hold exactly `floor + 1 ..= head`
    /// (nothing when `head == floor`).
    fn check_extent(
        &self,
        stream: StreamId,
        floor: u64,
        head: u64,
        held: Option<(u64, u64)>,
    ) -> Result<(), DiskError> {
        // Lazily: `floor + 1` overflows when `floor == head == u64::MAX`.
        let expected = (head > floor).then(|| (floor + 1, head));
        if held == expected {
            return Ok(());
        }
        let describe = |seqs: Option<(u64, u64)>| match seqs {
            Some((first, last)) => format!("seqs {first}..={last}"),
            None => "no events".to_string(),
        };
        Err(self.corrupt(format!(
            "stream {stream} records floor {floor} and head {head} ({}), \
             but the blocks table holds {}",
            describe(expected),
            describe(held)
        )))
    }

    /// A write transaction whose commit is durable when it returns.
    fn begin_write(&self) -> Result<redb::WriteTransaction, DiskError> {
        begin_write_with(&self.db, true, self.engine("begin write"))
    }

    fn engine<E: Into<redb::Error>>(&self, op: &'static str) -> impl FnOnce(E) -> DiskError + '_ {
        move |error| engine_error(&self.dir, &self.path, op, error.into())
    }

    fn corrupt(&self, detail: impl Into<String>) -> DiskError {
        DiskError::Corrupt {
            path: self.path.clone(),
            detail: detail.into(),
        }
    }
}

impl DiskStore {
    /// Reads and checks the statements records: each one, through its
    /// checksum, a signed statement of its stream whose signature verifies
    /// under the key it names (that key's authority was judged by the
    /// replica when it was received). A damaged record is refused
    /// ([`DiskError::Corrupt`], naming the file and the stream), never
    /// kept to stall a floor's sync later.
    fn statement_records(
        &self,
        read: &redb::ReadTransaction,
    ) -> Result<BTreeMap<StreamId, crate::SignedCompaction>, DiskError> {
        let table = match read.open_table(STATEMENTS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(BTreeMap::new()),
            Err(error) => return Err(self.engine("open statements table")(error)),
        };
        let mut kept = BTreeMap::new();
        for entry in table.iter().map_err(self.engine("read statements"))? {
            let (key, value) = entry.map_err(self.engine("read statements"))?;
            let stream = StreamId::new(key.value());
            let bad = |detail: String| {
                self.corrupt(format!("the statement record of stream {stream}: {detail}"))
            };
            let bytes = codec::decode_statement(stream, value.value()).map_err(bad)?;
            let statement =
                crate::SignedCompaction::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
            if statement.statement.stream != stream {
                let stated = statement.statement.stream;
                return Err(bad(format!("it states stream {stated}")));
            }
            statement
                .verify_signature()
                .map_err(|e| bad(e.to_string()))?;
            kept.insert(stream, statement);
        }
        Ok(kept)
    }

    fn damaged(&self, stream: StreamId, first_seq: u64, detail: String) -> DiskError {
        corrupt_block(&self.path, stream, first_seq, detail)
    }
}

impl Store for DiskStore {
    type Error = DiskError;

    fn meta(&self) -> Result<StoreMeta, DiskError> {
        Ok(self.meta.clone())
    }

    fn location(&self) -> Option<String> {
        Some(self.path.display().to_string())
    }

    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), DiskError> {
        let Some((first, last)) = self.meta.read_range(stream, after_seq, limit) else {
            return Ok(());
        };
        let mut scan = self.current_view()?.merged_scan(stream, first, last)?;
        while let Some(event) = scan.next_event()? {
            out.push(event);
        }
        Ok(())
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), DiskError> {
        self.commit_to_segment(batch)?;
        // The commit is durable; a view that fails to open leaves the
        // replica reading the previous one, which would hide this commit:
        // report it as the commit's failure (the replica then refuses
        // changes until reopened, and serves what it published before).
        self.make_view()
    }

    fn view(&self) -> Option<StoreView> {
        self.view.clone()
    }

    fn keep_checkpoints(&mut self, vectors: &[VersionVector]) -> Result<(), DiskError> {
        self.write_checkpoints(vectors)
    }
}

/// Creates `dir` and any missing parent. A directory created here must
/// itself survive a power cut, or the files acknowledged in it go with it:
/// each new one's parent is synced.
fn create_dir_durably(dir: &Path) -> Result<(), DiskError> {
    let new_dirs = missing_dirs(dir)?;
    std::fs::create_dir_all(dir).map_err(io(dir, "create directory"))?;
    for new_dir in &new_dirs {
        sync_dir(parent_dir(new_dir))?;
    }
    Ok(())
}

/// Whether the lock file holds the marker line (any bytes at all count:
/// see the module docs), that is whether an open of this directory ever
/// returned. Bounded: the lock file is read from disk like any other input.
fn read_marker(lock: &mut DirLock, lock_path: &Path) -> Result<bool, DiskError> {
    let mut marker = Vec::new();
    lock.file()
        .take(LOCK_MARKER.len() as u64 + 1)
        .read_to_end(&mut marker)
        .map_err(io(lock_path, "read lock file"))?;
    Ok(!marker.is_empty())
}

/// Opens the database, answering it and whether it was created. No marker
/// (`marked` false): no open of this directory ever returned, so nothing
/// in the file was acknowledged. A file left damaged by a crash during the
/// first open is set aside, not deleted, and started over: the marker is
/// also missing if `LOCK` itself was deleted, and then the file may hold a
/// log. Only damage qualifies, never a lock (another process holding the
/// file) or an I/O error, and never a backend given by the caller.
fn open_or_start_over<B: redb::StorageBackend>(
    path: &Path,
    exists: bool,
    marked: bool,
    options: &DiskOptions,
    repair: &Arc<RepairSeen>,
    mut backend: Option<B>,
) -> Result<(Database, bool), DiskError> {
    let from_backend = backend.is_some();
    match open_database_waiting(path, exists, options, repair, backend.take()) {
        Ok(db) => Ok((db, !exists)),
        Err(error @ DiskError::Corrupt { .. }) if exists && !marked && !from_backend => {
            let aside = set_aside(path)?;
            tracing::warn!(
                %error,
                aside = %aside.display(),
                "set aside a damaged data file no open ever acknowledged; starting over"
            );
            let db = open_database(path, false, options, Arc::clone(repair), backend)?;
            Ok((db, true))
        }
        Err(error) => Err(error),
    }
}

/// The digest record of `digest` (`codec` knows no [`Digest`]).
/// The `chains` record of `chain`, for a stream at `(floor, head)`.
fn chain_record((floor, head): (u64, u64), chain: &StreamChain) -> codec::ChainRecord {
    (
        floor,
        head,
        chain.floor_hash.to_bytes(),
        chain.head_hash.to_bytes(),
        chain.anchored,
    )
}

fn digest_record(digest: Digest) -> [u8; 28] {
    encode_digest(digest.events, digest.sum)
}

/// Opens the redb file with a full integrity check, turning a panic inside
/// the engine (which a damaged file can provoke) into [`DiskError::Corrupt`].
/// Records in `repair` whether redb's recovery ran (it checks every page)
/// and whether it fell back from a torn newest commit.
/// [`open_database`], waiting up to [`DiskOptions::lock_wait`] while redb
/// finds its file locked (for the same moments as `LOCK`: redb locks its
/// file's open description too). A backend given by the caller is tried
/// once: it cannot be handed to redb again.
fn open_database_waiting<B: redb::StorageBackend>(
    path: &Path,
    exists: bool,
    options: &DiskOptions,
    repair: &Arc<RepairSeen>,
    mut backend: Option<B>,
) -> Result<Database, DiskError> {
    let dir = path.parent().unwrap_or(path);
    let mut waiting = Waiting::new(dir, path, options.lock_wait);
    loop {
        let from_file = backend.is_none();
        match open_database(path, exists, options, Arc::clone(repair), backend.take()) {
            Err(DiskError::Locked { dir, lock, .. }) if !from_file => {
                return Err(DiskError::Locked {
                    dir,
                    lock,
                    waited: waiting.waited(),
                })
            }
            Err(DiskError::Locked { .. }) => waiting.pause_or_refuse()?,
            opened => return opened,
        }
    }
}

fn open_database<B: redb::StorageBackend>(
    path: &Path,
    exists: bool,
    options: &DiskOptions,
    repair: Arc<RepairSeen>,
    backend: Option<B>,
) -> Result<Database, DiskError> {
    let dir = path.parent().unwrap_or(path).to_path_buf();
    let mut builder = redb::Builder::new();
    builder.set_cache_size(options.cache_bytes);
    // redb's repair reports its progress in steps: 0.0 on entry, 0.3 only
    // when the newest commit fails its checksum and it falls back to the
    // one before (redb 4.x `Database::do_repair`), 0.6 and on for the
    // allocator rebuild that every checked open runs. The step between the
    // first two is the only sign of a fallback redb gives. The callback is
    // called only when the recovery runs: after an unclean shutdown, or on
    // every open with `check_pages_on_open`.
    builder
        .set_check_integrity_on_open(options.check_pages_on_open)
        .set_repair_callback(move |session| {
            let progress = session.progress();
            repair.ran.store(true, Ordering::Relaxed);
            if progress > 0.0 && progress < 0.6 {
                repair.rolled_back.store(true, Ordering::Relaxed);
            }
        });
    let opened = catch_unwind(AssertUnwindSafe(|| {
        if let Some(backend) = backend {
            // Opens what the backend holds, or creates in an empty one.
            builder.create_with_backend(backend)
        } else if exists {
            builder.open(path)
        } else {
            builder.create(path)
        }
    }));
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(error)) => Err(engine_error(&dir, path, "open", error.into())),
        Err(panic) => Err(DiskError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "the storage engine panicked opening it: {}",
                panic_message(&*panic)
            ),
        }),
    }
}

/// What redb's repair callback saw during an open.
#[derive(Default)]
struct RepairSeen {
    /// The recovery ran: it checked the checksum of every page.
    ran: AtomicBool,
    /// It fell back from a torn newest commit.
    rolled_back: AtomicBool,
}

/// The directories of `dir`'s path, innermost first, that do not exist yet.
fn missing_dirs(dir: &Path) -> Result<Vec<PathBuf>, DiskError> {
    let mut missing = Vec::new();
    for ancestor in dir.ancestors() {
        if ancestor.as_os_str().is_empty() || ancestor.try_exists().map_err(io(ancestor, "stat"))? {
            break;
        }
        missing.push(ancestor.to_path_buf());
    }
    Ok(missing)
}

/// The directory holding `path` (`.` for a bare relative name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Renames a damaged data file to a name of its own beside it, and returns
/// that name.
fn set_aside(path: &Path) -> Result<PathBuf, DiskError> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".damaged-{stamp}"));
    let aside = PathBuf::from(name);
    std::fs::rename(path, &aside).map_err(io(path, "set aside"))?;
    Ok(aside)
}

fn sync_dir(dir: &Path) -> Result<(), DiskError> {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io(dir, "sync directory"))
}
