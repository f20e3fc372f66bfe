//! redb against fjall on meshlog's storage workload, one run side by side.
//!
//! The workload is what a durable replica store does (docs/STORAGE.md):
//! batched appends of 64 events per durable commit, range reads per stream in
//! chunks of 4,096 (what recovery and paging read), a range delete of half of
//! every stream in one durable commit (compaction), and the reopen of the log
//! followed by a full read (recovery). Keys are `(stream, seq)`, values a
//! 24-byte header and a 100-byte payload.
//!
//! Run: `cargo bench -p meshlog-bench --bench storage_engines`
//! (`MESHLOG_BENCH_EVENTS=N` sets the log's length; default 200,000).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const STREAMS: u64 = 8;
const BATCH_EVENTS: u64 = 64;
const PAYLOAD_BYTES: usize = 100;
const READ_CHUNK: usize = 4096;

fn main() {
    let events: u64 = std::env::var("MESHLOG_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let root = std::env::temp_dir().join(format!("meshlog-engines-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp dir");
    println!("meshlog storage engines: {events} events, {STREAMS} streams, batches of {BATCH_EVENTS}, {PAYLOAD_BYTES}-byte payloads");
    println!(
        "{:<8} {:>16} {:>14} {:>16} {:>18} {:>12} {:>14} {:>10}",
        "engine",
        "append ev/s",
        "commits/s",
        "range read ev/s",
        "range delete ms",
        "reopen ms",
        "reopen+read ms",
        "file MiB"
    );
    let only = std::env::var("MESHLOG_BENCH_ENGINE").unwrap_or_default();
    if only.is_empty() || only == "redb" {
        Redb::measure(&root.join("redb"), events).print("redb");
    }
    if only.is_empty() || only == "fjall" {
        Fjall::measure(&root.join("fjall"), events).print("fjall");
    }
    let _ = std::fs::remove_dir_all(&root);
}

struct Figures {
    append: Duration,
    events: u64,
    read: Duration,
    delete: Duration,
    reopen: Duration,
    reopen_read: Duration,
    bytes: u64,
}

impl Figures {
    fn print(&self, name: &str) {
        let per_s = |n: u64, d: Duration| n as f64 / d.as_secs_f64();
        println!(
            "{:<8} {:>16.0} {:>14.0} {:>16.0} {:>18.1} {:>12.1} {:>14.1} {:>10.1}",
            name,
            per_s(self.events, self.append),
            per_s(self.events / BATCH_EVENTS, self.append),
            per_s(self.events, self.read),
            self.delete.as_secs_f64() * 1e3,
            self.reopen.as_secs_f64() * 1e3,
            self.reopen_read.as_secs_f64() * 1e3,
            self.bytes as f64 / (1 << 20) as f64,
        );
    }
}

fn value(stream: u64, seq: u64) -> Vec<u8> {
    let mut value = Vec::with_capacity(24 + PAYLOAD_BYTES);
    value.extend_from_slice(&(seq * STREAMS + stream).to_le_bytes());
    value.extend_from_slice(&seq.to_le_bytes());
    value.extend_from_slice(&[0u8; 8]);
    value.extend((0..PAYLOAD_BYTES).map(|i| (i as u64 ^ seq) as u8));
    value
}

fn dir_bytes(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            if let Ok(meta) = std::fs::metadata(&dir) {
                total += meta.len();
            }
            continue;
        };
        for entry in entries.flatten() {
            let meta = entry.metadata().expect("metadata");
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// The batches: 64 consecutive events of one stream each, cycling streams.
fn batches(events: u64) -> impl Iterator<Item = (u64, std::ops::RangeInclusive<u64>)> {
    let per_stream = events / STREAMS;
    (0..per_stream / BATCH_EVENTS).flat_map(move |round| {
        (0..STREAMS).map(move |stream| {
            let first = round * BATCH_EVENTS + 1;
            (stream, first..=first + BATCH_EVENTS - 1)
        })
    })
}

struct Redb;

const EVENTS: redb::TableDefinition<(u64, u64), &[u8]> = redb::TableDefinition::new("events");

impl Redb {
    fn measure(dir: &Path, events: u64) -> Figures {
        use redb::{Database, ReadableDatabase};
        std::fs::create_dir_all(dir).unwrap();
        let path: PathBuf = dir.join("meshlog.redb");
        let db = Database::create(&path).unwrap();
        let start = Instant::now();
        let mut written = 0;
        for (stream, seqs) in batches(events) {
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(EVENTS).unwrap();
                for seq in seqs {
                    table
                        .insert((stream, seq), value(stream, seq).as_slice())
                        .unwrap();
                    written += 1;
                }
            }
            txn.commit().unwrap();
        }
        let append = start.elapsed();
        let read_all = |db: &Database| {
            let txn = db.begin_read().unwrap();
            let table = txn.open_table(EVENTS).unwrap();
            let mut read = 0u64;
            for stream in 0..STREAMS {
                let mut after = 0u64;
                loop {
                    let mut chunk = Vec::with_capacity(READ_CHUNK);
                    for entry in table
                        .range((stream, after + 1)..=(stream, u64::MAX))
                        .unwrap()
                        .take(READ_CHUNK)
                    {
                        let (key, value) = entry.unwrap();
                        chunk.push((key.value().1, value.value().to_vec()));
                    }
                    let Some(last) = chunk.last() else { break };
                    after = last.0;
                    read += chunk.len() as u64;
                }
            }
            read
        };
        let start = Instant::now();
        let read = read_all(&db);
        let read_time = start.elapsed();
        assert_eq!(read, written);
        let start = Instant::now();
        {
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(EVENTS).unwrap();
                for stream in 0..STREAMS {
                    let floor = events / STREAMS / 2;
                    table
                        .retain_in((stream, 0)..=(stream, floor), |_, _| false)
                        .unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let delete = start.elapsed();
        drop(db);
        let start = Instant::now();
        let db = Database::open(&path).unwrap();
        let reopen = start.elapsed();
        let left = read_all(&db);
        let reopen_read = start.elapsed();
        assert!(left > 0);
        drop(db);
        Figures {
            append,
            events: written,
            read: read_time,
            delete,
            reopen,
            reopen_read,
            bytes: dir_bytes(dir),
        }
    }
}

struct Fjall;

impl Fjall {
    fn key(stream: u64, seq: u64) -> [u8; 16] {
        let mut key = [0u8; 16];
        key[..8].copy_from_slice(&stream.to_be_bytes());
        key[8..].copy_from_slice(&seq.to_be_bytes());
        key
    }

    fn measure(dir: &Path, events: u64) -> Figures {
        use fjall::{Database, KeyspaceCreateOptions, PersistMode};
        let db = Database::builder(dir).open().unwrap();
        let keyspace = db
            .keyspace("events", KeyspaceCreateOptions::default)
            .unwrap();
        let start = Instant::now();
        let mut written = 0;
        for (stream, seqs) in batches(events) {
            let mut batch = db.batch().durability(Some(PersistMode::SyncData));
            for seq in seqs {
                batch.insert(&keyspace, Self::key(stream, seq), value(stream, seq));
                written += 1;
            }
            batch.commit().unwrap();
        }
        let append = start.elapsed();
        let read_all = |keyspace: &fjall::Keyspace| {
            let mut read = 0u64;
            for stream in 0..STREAMS {
                let mut after = 0u64;
                loop {
                    let mut chunk = Vec::with_capacity(READ_CHUNK);
                    for guard in keyspace
                        .range(Self::key(stream, after + 1)..=Self::key(stream, u64::MAX))
                        .take(READ_CHUNK)
                    {
                        let (key, value) = guard.into_inner().unwrap();
                        let seq = u64::from_be_bytes(key[8..16].try_into().unwrap());
                        chunk.push((seq, value.to_vec()));
                    }
                    let Some(last) = chunk.last() else { break };
                    after = last.0;
                    read += chunk.len() as u64;
                }
            }
            read
        };
        let start = Instant::now();
        let read = read_all(&keyspace);
        let read_time = start.elapsed();
        assert_eq!(read, written);
        // fjall has no range delete: compaction writes one tombstone per key.
        let start = Instant::now();
        {
            let mut batch = db.batch().durability(Some(PersistMode::SyncData));
            for stream in 0..STREAMS {
                let floor = events / STREAMS / 2;
                for guard in keyspace.range(Self::key(stream, 0)..=Self::key(stream, floor)) {
                    batch.remove(&keyspace, guard.key().unwrap());
                }
            }
            batch.commit().unwrap();
        }
        let delete = start.elapsed();
        drop(keyspace);
        drop(db);
        let start = Instant::now();
        let db = Database::builder(dir).open().unwrap();
        let keyspace = db
            .keyspace("events", KeyspaceCreateOptions::default)
            .unwrap();
        let reopen = start.elapsed();
        let left = read_all(&keyspace);
        let reopen_read = start.elapsed();
        assert!(left > 0);
        drop(keyspace);
        drop(db);
        Figures {
            append,
            events: written,
            read: read_time,
            delete,
            reopen,
            reopen_read,
            bytes: dir_bytes(dir),
        }
    }
}
