//! The durable store under group commit, beside the in-memory store, in one
//! run: append rate with 1, 8 and 64 concurrent appenders (each appender
//! waits for its acknowledgement, i.e. for the durable commit on disk), and
//! the time to reopen (recover and check) a 1M-event log.
//!
//! Run: `cargo bench -p meshlog-bench --bench storage`.
//! `MESHLOG_BENCH_SECONDS` sets each append run's length (default 3),
//! `MESHLOG_BENCH_EVENTS` the reopened log's length (default 1,000,000; 0
//! skips it), `MESHLOG_BENCH_APPENDERS` runs one appender count only.
//! Figures are recorded in docs/BENCHMARKS.md ("Durable storage").

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{Config, DiskStore, MemStore, Replica, SharedReplica, Store};

const PAYLOAD_BYTES: usize = 100;

/// Set in the child that builds a log and aborts (an unclean stop).
const UNCLEAN_CHILD_ENV: &str = "MESHLOG_BENCH_UNCLEAN_CHILD";

fn main() {
    if let Ok(dir) = std::env::var(UNCLEAN_CHILD_ENV) {
        let events = env_number("MESHLOG_BENCH_EVENTS", 1_000_000);
        let mut disk = Replica::open(config(), DiskStore::open(&dir).unwrap()).unwrap();
        build(&mut disk, events);
        // A tail of single appends after the last checkpoint, then no close.
        for n in 0..500 {
            disk.append(payload(n)).unwrap();
        }
        std::process::abort();
    }
    let seconds: u64 = env_number("MESHLOG_BENCH_SECONDS", 3);
    let events: u64 = env_number("MESHLOG_BENCH_EVENTS", 1_000_000);
    let root = std::env::temp_dir().join(format!("meshlog-bench-storage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    println!(
        "meshlog storage: {PAYLOAD_BYTES}-byte payloads, {seconds} s per append run, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<8} {:>10} {:>14} {:>12} {:>12} {:>14}",
        "store", "appenders", "events/s", "commits/s", "mean batch", "p99 ack ms"
    );
    let fdatasync_rate = fdatasync_run(&root, seconds);
    let only: Option<usize> = std::env::var("MESHLOG_BENCH_APPENDERS")
        .ok()
        .map(|text| text.parse().expect("a number"));
    for appenders in [1usize, 8, 64] {
        if only.is_some_and(|only| only != appenders) {
            continue;
        }
        let memory = Replica::open(config(), MemStore::default()).unwrap();
        append_run("memory", memory, appenders, seconds);
        let dir = root.join(format!("append-{appenders}"));
        let disk = Replica::open(config(), DiskStore::open(&dir).unwrap()).unwrap();
        let commit_rate = append_run("disk", disk, appenders, seconds);
        std::fs::remove_dir_all(&dir).unwrap();
        if appenders == 1 {
            // The disk's rate drifts with the machine's load: the limit is
            // measured again right after, and the goal taken against both.
            let again = fdatasync_run(&root, seconds);
            print_commit_goal(commit_rate, (fdatasync_rate + again) / 2.0);
        }
    }
    if events > 0 {
        reopen_run(&root.join("reopen"), events);
        unclean_reopen_run(&root.join("unclean"), events);
    }
    let _ = std::fs::remove_dir_all(&root);
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map_or(default, |text| text.parse().expect("a number"))
}

fn config() -> Config {
    Config::new(StreamId::new(1))
}

fn payload(n: u64) -> Bytes {
    let mut bytes = format!("event {n} ").into_bytes();
    bytes.resize(PAYLOAD_BYTES, b'.');
    Bytes::from(bytes)
}

/// The goal of issue 30: a commit costs one append and one `fdatasync`,
/// so one appender commits at the rate of the `fdatasync` rows of the
/// same run (the mean of the one before and the one after it: the
/// machine's load moves both). Met at 0.8 of it or more: the
/// rest is the record's encoding, the handoff to the fold thread and the
/// view.
const COMMIT_GOAL_RATIO: f64 = 0.8;

fn print_commit_goal(commit_rate: f64, fdatasync_rate: f64) {
    let ratio = commit_rate / fdatasync_rate;
    println!(
        "goal: 1 appender at >= {COMMIT_GOAL_RATIO:.1}x the fdatasync rows' commits/s \
         ({fdatasync_rate:.0}): {ratio:.2}x, {}",
        if ratio >= COMMIT_GOAL_RATIO {
            "met"
        } else {
            "not met"
        }
    );
}

/// `appenders` threads append in a loop, each waiting for its
/// acknowledgement, for `seconds`; answers the commits per second.
fn append_run<S: Store + Send + Sync + 'static>(
    name: &str,
    replica: Replica<S>,
    appenders: usize,
    seconds: u64,
) -> f64 {
    let group = SharedReplica::new(replica);
    let stop = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..appenders)
        .map(|_| {
            let (group, stop, counter) = (group.clone(), Arc::clone(&stop), Arc::clone(&counter));
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let asked = Instant::now();
                    group.append(payload(n)).expect("append");
                    latencies.push(asked.elapsed());
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort();
    // Empty if no appender got to run (`MESHLOG_BENCH_SECONDS=0`).
    let p99 = latencies
        .get(latencies.len() * 99 / 100)
        .copied()
        .unwrap_or_default();
    let stats = group.commit_stats();
    println!(
        "{:<8} {:>10} {:>14.0} {:>12.0} {:>12.1} {:>14.2}",
        name,
        appenders,
        stats.appended as f64 / elapsed,
        stats.commits as f64 / elapsed,
        stats.appended as f64 / stats.commits.max(1) as f64,
        p99.as_secs_f64() * 1e3,
    );
    stats.commits as f64 / elapsed
}

/// The limit a durable commit runs into: one 160-byte append and one
/// `fdatasync` (`File::sync_data`) after another, on the same disk, by one
/// writer. A `disk` row with 1 appender cannot beat it. Answers the
/// syncs per second.
fn fdatasync_run(root: &Path, seconds: u64) -> f64 {
    use std::io::Write as _;
    std::fs::create_dir_all(root).unwrap();
    let path = root.join("fdatasync");
    let mut file = std::fs::File::create(&path).unwrap();
    let record = [7u8; 160];
    let mut latencies = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        let one = Instant::now();
        file.write_all(&record).unwrap();
        file.sync_data().unwrap();
        latencies.push(one.elapsed());
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let p99 = latencies[latencies.len() * 99 / 100];
    let rate = latencies.len() as f64 / elapsed;
    println!(
        "{:<8} {:>10} {:>14.0} {:>12.0} {:>12.1} {:>14.3}",
        "fdatasync",
        1,
        rate,
        rate,
        1.0,
        p99.as_secs_f64() * 1e3,
    );
    drop(file);
    std::fs::remove_file(&path).unwrap();
    rate
}

/// A child process writes an `events`-long log and 500 single appends
/// after it, and aborts (no close); the reopen after that unclean stop is
/// timed: redb opens on its last checkpoint and the write-ahead segment's
/// tail is replayed.
fn unclean_reopen_run(dir: &Path, events: u64) {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .env(UNCLEAN_CHILD_ENV, dir)
        .env("MESHLOG_BENCH_EVENTS", events.to_string())
        .status()
        .unwrap();
    assert!(!status.success(), "the child aborts");
    let start = Instant::now();
    let store = DiskStore::open(dir).unwrap();
    let store_open = start.elapsed();
    let recovery = store.recovery();
    let disk = Replica::open(config(), store).unwrap();
    let disk_reopen = start.elapsed();
    assert_eq!(disk.marks().get(StreamId::new(1)), events + 500);
    println!(
        "  disk after an unclean stop (abort): {:>6.0} ms total = {:>6.0} ms store open \
         ({} commits replayed from the segment, data file walked: {}) + {:>6.0} ms replica recovery",
        disk_reopen.as_secs_f64() * 1e3,
        store_open.as_secs_f64() * 1e3,
        recovery.replayed,
        recovery.pages_checked,
        (disk_reopen - store_open).as_secs_f64() * 1e3
    );
}

const BATCH: u64 = 4096;

fn build<S: Store>(replica: &mut Replica<S>, events: u64) {
    let mut n = 0;
    while n < events {
        let len = BATCH.min(events - n);
        replica
            .append_batch_at((n..n + len).map(payload), n)
            .unwrap();
        n += len;
    }
}

/// Writes an `events`-long log in large batches, closes it, and times the
/// reopen: the store's own open (lock, redb's integrity check, meshlog's
/// record checks), then the replica's recovery (reading and checking every
/// event). The in-memory store's recovery runs beside it.
fn reopen_run(dir: &Path, events: u64) {
    let mut disk = Replica::open(config(), DiskStore::open(dir).unwrap()).unwrap();
    let start = Instant::now();
    build(&mut disk, events);
    let write = start.elapsed();
    drop(disk);
    let size = std::fs::metadata(dir.join(meshlog_replica::DATA_FILE))
        .unwrap()
        .len();

    let start = Instant::now();
    let store = DiskStore::open(dir).unwrap();
    let store_open = start.elapsed();
    let disk = Replica::open(config(), store).unwrap();
    let disk_reopen = start.elapsed();
    assert_eq!(disk.marks().get(StreamId::new(1)), events);
    drop(disk);

    let mut memory = Replica::open(config(), MemStore::default()).unwrap();
    build(&mut memory, events);
    let store = memory.into_store();
    let start = Instant::now();
    let memory = Replica::open(config(), store).unwrap();
    let memory_reopen = start.elapsed();
    assert_eq!(memory.marks().get(StreamId::new(1)), events);

    println!();
    println!(
        "reopen of a {events}-event log ({:.0} MiB on disk, written in {:.1} s in batches of {BATCH}):",
        size as f64 / (1 << 20) as f64,
        write.as_secs_f64()
    );
    println!("  disk:   {:>8.0} ms total = {:>6.0} ms store open (lock, redb integrity check, record checks) + {:>6.0} ms replica recovery (read and check every event)",
        disk_reopen.as_secs_f64() * 1e3,
        store_open.as_secs_f64() * 1e3,
        (disk_reopen - store_open).as_secs_f64() * 1e3);
    println!(
        "  memory: {:>8.0} ms replica recovery",
        memory_reopen.as_secs_f64() * 1e3
    );
}
