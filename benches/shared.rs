//! The shared handle under durable write load, in one run (the issue of
//! `SharedReplica`), printed, never asserted:
//!
//! 1. **Read latency.** A reader thread pages a walk (pages of 100, from a
//!    cursor that moves with the walk and starts over at the head) through a
//!    `DiskStore`-backed replica while 64 threads append durably. *Before* is
//!    the design `SharedReplica` replaced, reproduced here (`Locked`): one
//!    mutex around the replica, commits made under it, so a reader waits
//!    behind the fsync. *After* is `SharedReplica::new` (a committer
//!    thread). The store commit and each append's acknowledgement are timed
//!    in the same run, so that the goal — read p99 under 1 ms and under a
//!    tenth of the commit latency — is judged against this run's commits.
//! 2. **Durable events/s with 64 callers**: single appends (blocking
//!    threads), batches of 16 and of 64 (blocking threads), and 64 tasks on
//!    a one-thread tokio runtime awaiting `append_async`; each quiet and
//!    with the other core busy (a spinning thread, pinned nowhere). Goal:
//!    100,000 events/s. Every acknowledged event was fsynced by `DiskStore`.
//!    Two rows that are not goals run the same callers on `MemStore`, whose
//!    commit costs nothing: what the handle itself allows on this machine.
//!    The batching callers also run keyed (issue 29: the replica sealing its
//!    stream, `Config::with_key`), quiet, right after the same callers
//!    unkeyed. Goal: keyed at least 0.9× unkeyed. (A keyed replica signs
//!    when a delta is built, not per append: nothing here reads deltas, so
//!    the row measures what a key costs the append path.)
//! 3. **In-memory appends beside yrs** (issue 28): W writers, each its own
//!    replica, append E events of 32 bytes one call at a time, writer after
//!    writer on one thread: through `SharedReplica::in_memory` (the goal
//!    row), through `SharedReplica::new` over a `MemStore` (a committer
//!    thread: a hand-off per append) and through the single-owner
//!    `Replica::append`; beside yrs, each writer its own doc appending each
//!    event to a `YArray` (`Any::Buffer`, as the converge bench does) in a
//!    transaction of its own: an append observable on its own, as
//!    meshlog's is. (All of a writer's events in one transaction, as the
//!    converge bench does for its few thousand, grows quadratic in yrs
//!    0.28: 2.3 GB and 0.002 M events/s at 10,000 events per writer; not a
//!    row.) Best of three passes each, interleaved. Goal: the shared
//!    handle in memory at least yrs's rate in the same run.
//!
//! Run: `cargo bench -p meshlog-bench --bench shared`; with the argument
//! `appends`, only part 3 (`cargo bench -p meshlog-bench --bench shared --
//! appends`; `MESHLOG_BENCH_WRITERS` and `MESHLOG_BENCH_EVENTS`, default 4
//! and 100,000 events per writer).
//! `MESHLOG_BENCH_SECONDS` sets each run's length (default 2),
//! `MESHLOG_BENCH_LOG` the events in the log before the read-latency runs
//! (default 100,000). Figures are recorded in docs/BENCHMARKS.md ("The
//! shared handle").

use std::collections::VecDeque;
use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Batch, Config, DiskStore, Event, MemStore, Page, Replica, SharedReplica, Store, StoreMeta,
    StoreView, WriterKey, ROUND_EVENTS_MAX,
};

const CALLERS: usize = 64;
const PAYLOAD_BYTES: usize = 100;
const PAGE_LEN: usize = 100;
/// The reader's pause between pages: it reads often (thousands of pages a
/// second) without taking a whole core from the writers on a 2-core machine.
const READ_PAUSE: Duration = Duration::from_micros(200);
const EVENTS_PER_S_GOAL: f64 = 100_000.0;
const READ_P99_GOAL: Duration = Duration::from_millis(1);

fn main() {
    if std::env::args().skip(1).any(|arg| arg == "appends") {
        appends::run();
        return;
    }
    let seconds = env_number("MESHLOG_BENCH_SECONDS", 2);
    let log_len = env_number("MESHLOG_BENCH_LOG", 100_000);
    let run = Duration::from_secs(seconds);
    let root = std::env::temp_dir().join(format!("meshlog-bench-shared-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    println!(
        "meshlog shared handle: DiskStore, {CALLERS} callers, {PAYLOAD_BYTES}-byte payloads, {seconds} s per run, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );

    println!();
    println!(
        "1. page({PAGE_LEN}) latency while {CALLERS} threads append durably (log of {log_len} events at start)"
    );
    println!(
        "{:<26} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10} {:>11} {:>11} {:>10} {:>7}",
        "design",
        "pages",
        "p50 µs",
        "p99 µs",
        "max µs",
        "ack mean",
        "ack p99",
        "commit mean",
        "commit p99",
        "events/s",
        "round"
    );
    let alone = read_run(&root.join("alone"), Design::NoWriters, log_len, run);
    let before = read_run(&root.join("before"), Design::Locked, log_len, run);
    let after = read_run(&root.join("after"), Design::Shared, log_len, run);
    println!("(ack: an append's acknowledgement, commit: the store's commit and fsync, both in ms; round: events per commit)");

    println!();
    println!("2. durable events/s, {CALLERS} callers");
    println!(
        "{:<28} {:<7} {:>10} {:>10} {:>8} {:>12} {:>11} {:>10} {:>8}",
        "callers",
        "load",
        "events/s",
        "commits/s",
        "round",
        "commit mean",
        "store busy%",
        "ack p99",
        "goal"
    );
    let mut rates = Vec::new();
    let mut keyed_rates = Vec::new();
    for callers in [
        Callers::Single,
        Callers::Batch(16),
        Callers::Batch(64),
        Callers::Async,
    ] {
        // Batching callers also run keyed (issue 29), quiet, right after
        // the same callers unkeyed.
        let batching = matches!(callers, Callers::Batch(_));
        for (loaded, keyed) in [(false, false), (false, true), (true, false)] {
            if keyed && !batching {
                continue;
            }
            let dir = root.join(format!("rate-{}-{loaded}-{keyed}", callers.name()));
            let (replica, commits) = open_timed(&dir, 0, keyed);
            let name = match keyed {
                true => format!("{}, keyed", callers.name()),
                false => callers.name(),
            };
            let row = rate_run(replica, &commits, &name, true, loaded, callers, run);
            let _ = std::fs::remove_dir_all(&dir);
            match keyed {
                true => keyed_rates.push((callers, row)),
                false => rates.push((callers, loaded, row)),
            }
        }
    }
    // Not goals: the same callers on the in-memory store, whose commit
    // costs nothing, measure what the handle itself allows on this machine
    // (planning, publishing, waking callers).
    for callers in [Callers::Single, Callers::Async] {
        let (replica, commits) = timed(MemStore::default());
        let replica = Replica::open(config(), replica).expect("open the replica");
        let name = format!("{}, memory", callers.name());
        rate_run(replica, &commits, &name, false, false, callers, run);
    }
    let _ = std::fs::remove_dir_all(&root);
    println!("(store busy: the share of the run spent in the store's commit; ms columns as above)");

    println!();
    println!("goals");
    let met = |ok: bool| if ok { "met" } else { "not met" };
    println!(
        "  read p99 under 1 ms (after): {} µs: {}",
        micros(after.read_p99),
        met(after.read_p99 < READ_P99_GOAL)
    );
    println!(
        "  read p99 under a tenth of the store commit's mean latency (after): {} µs vs {} µs / 10: {}",
        micros(after.read_p99),
        micros(after.commit_mean),
        met(after.read_p99 * 10 < after.commit_mean)
    );
    println!(
        "  (before: read p99 {} µs, commit mean {} µs; no writers: read p99 {} µs)",
        micros(before.read_p99),
        micros(before.commit_mean),
        micros(alone.read_p99)
    );
    for (callers, loaded, row) in &rates {
        println!(
            "  {:.0} durable events/s, {} {}: {:.0}: {}",
            EVENTS_PER_S_GOAL,
            callers.name(),
            if *loaded { "loaded" } else { "quiet" },
            row.events_per_s,
            met(row.events_per_s >= EVENTS_PER_S_GOAL)
        );
    }

    keyed_goals(&rates, &keyed_rates);

    println!();
    appends::run();
}

/// Issue 29: durable appends of batching callers with a key (the replica
/// sealing its stream) at least this share of the same callers' rate
/// without.
const KEYED_RATE_RATIO_MIN: f64 = 0.9;

/// Issue 29's verdict per batching row: keyed beside unkeyed, both quiet.
fn keyed_goals(rates: &[(Callers, bool, RateRow)], keyed: &[(Callers, RateRow)]) {
    for (callers, row) in keyed {
        let Some((_, _, unkeyed)) = rates
            .iter()
            .find(|(c, loaded, _)| c.name() == callers.name() && !loaded)
        else {
            continue;
        };
        let ratio = row.events_per_s / unkeyed.events_per_s;
        println!(
            "  issue 29, keyed durable events/s >= {KEYED_RATE_RATIO_MIN}x unkeyed, {} quiet: \
             {:.0} vs {:.0} ({ratio:.2}x): {}",
            callers.name(),
            row.events_per_s,
            unkeyed.events_per_s,
            if ratio >= KEYED_RATE_RATIO_MIN {
                "met"
            } else {
                "not met"
            }
        );
    }
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

fn micros(duration: Duration) -> String {
    format!("{:.0}", duration.as_secs_f64() * 1e6)
}

fn millis(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1e3)
}

/// The `q`-quantile of sorted durations (zero if there are none).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[index]
}

fn mean(durations: &[Duration]) -> Duration {
    if durations.is_empty() {
        return Duration::ZERO;
    }
    durations.iter().sum::<Duration>() / durations.len() as u32
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A store that times its inner store's commits (for `DiskStore`, redb's
/// commit and its fsync), so that both designs' commit latency is measured
/// the same way.
struct Timed<S> {
    store: S,
    commits: Arc<Mutex<Vec<Duration>>>,
}

impl<S: Store> Store for Timed<S> {
    type Error = S::Error;

    fn meta(&self) -> Result<StoreMeta, S::Error> {
        self.store.meta()
    }

    fn read_stream(
        &self,
        stream: StreamId,
        after_seq: u64,
        limit: usize,
        out: &mut Vec<Event>,
    ) -> Result<(), S::Error> {
        self.store.read_stream(stream, after_seq, limit, out)
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), S::Error> {
        let start = Instant::now();
        let result = self.store.commit(batch);
        lock(&self.commits).push(start.elapsed());
        result
    }

    fn view(&self) -> Option<StoreView> {
        self.store.view()
    }
}

/// `store`, timed, and where its commit times are left.
fn timed<S>(store: S) -> (Timed<S>, Arc<Mutex<Vec<Duration>>>) {
    let commits = Arc::new(Mutex::new(Vec::new()));
    let store = Timed {
        store,
        commits: Arc::clone(&commits),
    };
    (store, commits)
}

/// A `DiskStore`-backed replica in `dir` holding `log_len` events written
/// in large batches, its store timed from then on; `keyed`, it seals its
/// stream with a key from a fixed seed (`Config::with_key`).
fn open_timed(
    dir: &Path,
    log_len: u64,
    keyed: bool,
) -> (Replica<Timed<DiskStore>>, Arc<Mutex<Vec<Duration>>>) {
    let (store, commits) = timed(DiskStore::open(dir).expect("open the store"));
    let config = match keyed {
        true => Config::with_key(WriterKey::from_bytes([0x29; 32])),
        false => config(),
    };
    let mut replica = Replica::open(config, store).expect("open the replica");
    let mut n = 0;
    while n < log_len {
        let len = (ROUND_EVENTS_MAX as u64).min(log_len - n);
        replica
            .append_batch_at((n..n + len).map(payload), 0)
            .expect("preload");
        n += len;
    }
    lock(&commits).clear();
    (replica, commits)
}

/// The design `SharedReplica` replaced (`GroupCommit`, removed in commit
/// 46161fc, kept small here): one mutex around the replica, held by
/// readers to page and by the committer thread through
/// `append_batch_at` of whatever is queued — so a reader waits behind the
/// store commit and its fsync.
struct Locked<S: Store> {
    replica: Mutex<Replica<S>>,
    queue: Mutex<LockedQueue>,
    /// Signalled when a payload is queued or the queue closes.
    queued: Condvar,
    commits: AtomicU64,
    appended: AtomicU64,
}

#[derive(Default)]
struct LockedQueue {
    waiting: VecDeque<(Bytes, Arc<Answer>)>,
    /// Whether the committer sleeps on `queued` (only then is it woken).
    idle: bool,
    closed: bool,
}

/// Where the committer tells one caller its append is durable.
#[derive(Default)]
struct Answer {
    done: Mutex<bool>,
    changed: Condvar,
}

impl<S: Store + Send + 'static> Locked<S> {
    fn start(replica: Replica<S>) -> (Arc<Self>, JoinHandle<()>) {
        let locked = Arc::new(Locked {
            replica: Mutex::new(replica),
            queue: Mutex::new(LockedQueue::default()),
            queued: Condvar::new(),
            commits: AtomicU64::new(0),
            appended: AtomicU64::new(0),
        });
        let committer = {
            let locked = Arc::clone(&locked);
            std::thread::spawn(move || locked.run_committer())
        };
        (locked, committer)
    }

    fn append(&self, payload: Bytes) {
        let answer = Arc::new(Answer::default());
        let idle = {
            let mut queue = lock(&self.queue);
            queue.waiting.push_back((payload, Arc::clone(&answer)));
            std::mem::take(&mut queue.idle)
        };
        if idle {
            self.queued.notify_one();
        }
        let mut done = lock(&answer.done);
        while !*done {
            done = answer
                .changed
                .wait(done)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn page(&self, after: &VersionVector) -> Page {
        lock(&self.replica).page(after, PAGE_LEN).expect("page")
    }

    fn close(&self) {
        lock(&self.queue).closed = true;
        self.queued.notify_all();
    }

    fn run_committer(&self) {
        loop {
            let round: Vec<(Bytes, Arc<Answer>)> = {
                let mut queue = lock(&self.queue);
                while queue.waiting.is_empty() {
                    if queue.closed {
                        return;
                    }
                    queue.idle = true;
                    queue = self
                        .queued
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                queue.idle = false;
                let len = queue.waiting.len().min(ROUND_EVENTS_MAX);
                queue.waiting.drain(..len).collect()
            };
            let payloads = round.iter().map(|(payload, _)| payload.clone());
            lock(&self.replica)
                .append_batch_at(payloads, 0)
                .expect("durable append");
            self.commits.fetch_add(1, Ordering::Relaxed);
            self.appended
                .fetch_add(round.len() as u64, Ordering::Relaxed);
            for (_, answer) in round {
                *lock(&answer.done) = true;
                answer.changed.notify_one();
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Design {
    /// `SharedReplica`, the reader alone: the floor of read latency here.
    NoWriters,
    /// The replaced design (`Locked`).
    Locked,
    /// `SharedReplica::new`.
    Shared,
}

struct ReadRow {
    read_p99: Duration,
    commit_mean: Duration,
}

/// Pages a walk of `PAGE_LEN` events at a time, pausing `READ_PAUSE`
/// between pages, from the start cursor, starting over at the head, until
/// `stop`; answers each page call's latency.
fn read_walk(page: impl Fn(&VersionVector) -> Page, stop: &AtomicBool) -> Vec<Duration> {
    let mut latencies = Vec::new();
    let mut cursor = VersionVector::new();
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let page = page(&cursor);
        latencies.push(start.elapsed());
        black_box(&page.events);
        cursor = if page.at_head {
            VersionVector::new()
        } else {
            page.next
        };
        std::thread::sleep(READ_PAUSE);
    }
    latencies
}

/// `CALLERS` threads each call `append` in a loop until `stop`; answers
/// every acknowledgement's latency.
fn append_threads(
    append: Arc<dyn Fn(Bytes) + Send + Sync>,
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<Vec<Duration>>> {
    let counter = Arc::new(AtomicU64::new(0));
    (0..CALLERS)
        .map(|_| {
            let (append, stop, counter) =
                (Arc::clone(&append), Arc::clone(stop), Arc::clone(&counter));
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let asked = Instant::now();
                    append(payload(n));
                    latencies.push(asked.elapsed());
                }
                latencies
            })
        })
        .collect()
}

fn join_all<T>(threads: Vec<JoinHandle<Vec<T>>>) -> Vec<T> {
    threads
        .into_iter()
        .flat_map(|thread| thread.join().expect("a bench thread panicked"))
        .collect()
}

fn read_run(dir: &Path, design: Design, log_len: u64, run: Duration) -> ReadRow {
    let (replica, commits) = open_timed(dir, log_len, false);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    // (page latencies, ack latencies, events appended, rounds committed)
    let (mut reads, mut acks, appended, rounds) = match design {
        Design::NoWriters => {
            let shared = SharedReplica::new(replica);
            let reader = {
                let (shared, stop) = (shared.clone(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    read_walk(|cursor| shared.page(cursor, PAGE_LEN).expect("page"), &stop)
                })
            };
            std::thread::sleep(run);
            stop.store(true, Ordering::Relaxed);
            (reader.join().expect("reader"), Vec::new(), 0, 0)
        }
        Design::Locked => {
            let (locked, committer) = Locked::start(replica);
            let writers = append_threads(
                {
                    let locked = Arc::clone(&locked);
                    Arc::new(move |payload| locked.append(payload))
                },
                &stop,
            );
            let reader = {
                let (locked, stop) = (Arc::clone(&locked), Arc::clone(&stop));
                std::thread::spawn(move || read_walk(|cursor| locked.page(cursor), &stop))
            };
            std::thread::sleep(run);
            stop.store(true, Ordering::Relaxed);
            let appended = locked.appended.load(Ordering::Relaxed);
            let rounds = locked.commits.load(Ordering::Relaxed);
            let reads = reader.join().expect("reader");
            let acks = join_all(writers);
            locked.close();
            committer.join().expect("committer");
            (reads, acks, appended, rounds)
        }
        Design::Shared => {
            let shared = SharedReplica::new(replica);
            let writers = append_threads(
                {
                    let shared = shared.clone();
                    Arc::new(move |payload| {
                        shared.append(payload).expect("durable append");
                    })
                },
                &stop,
            );
            let reader = {
                let (shared, stop) = (shared.clone(), Arc::clone(&stop));
                std::thread::spawn(move || {
                    read_walk(|cursor| shared.page(cursor, PAGE_LEN).expect("page"), &stop)
                })
            };
            std::thread::sleep(run);
            stop.store(true, Ordering::Relaxed);
            let stats = shared.commit_stats();
            let reads = reader.join().expect("reader");
            let acks = join_all(writers);
            (reads, acks, stats.appended, stats.commits)
        }
    };
    let elapsed = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(dir);
    let mut commits = std::mem::take(&mut *lock(&commits));
    reads.sort();
    acks.sort();
    commits.sort();
    let name = match design {
        Design::NoWriters => "no writers (SharedReplica)",
        Design::Locked => "before (one mutex)",
        Design::Shared => "after (SharedReplica::new)",
    };
    let row = ReadRow {
        read_p99: quantile(&reads, 0.99),
        commit_mean: mean(&commits),
    };
    println!(
        "{:<26} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10} {:>11} {:>11} {:>10.0} {:>7.1}",
        name,
        reads.len(),
        micros(quantile(&reads, 0.5)),
        micros(row.read_p99),
        micros(reads.last().copied().unwrap_or_default()),
        millis(mean(&acks)),
        millis(quantile(&acks, 0.99)),
        millis(row.commit_mean),
        millis(quantile(&commits, 0.99)),
        appended as f64 / elapsed,
        appended as f64 / rounds.max(1) as f64,
    );
    row
}

#[derive(Clone, Copy)]
enum Callers {
    /// Blocking threads, one event per `append`.
    Single,
    /// Blocking threads, this many events per `append_batch`.
    Batch(usize),
    /// Tasks on a one-thread tokio runtime awaiting `append_async`.
    Async,
}

impl Callers {
    fn name(self) -> String {
        match self {
            Callers::Single => "single (threads)".to_string(),
            Callers::Batch(len) => format!("batches of {len} (threads)"),
            Callers::Async => "single (async tasks)".to_string(),
        }
    }
}

struct RateRow {
    events_per_s: f64,
}

/// Keeps one core busy until dropped: a thread spinning on arithmetic,
/// pinned to no core, as another program's work would be.
struct Spinner {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Spinner {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut x = 1u64;
                while !stop.load(Ordering::Relaxed) {
                    x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        };
        Spinner {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn rate_run<S: Store + Send + Sync + 'static>(
    replica: Replica<S>,
    commits: &Mutex<Vec<Duration>>,
    name: &str,
    judged: bool,
    loaded: bool,
    callers: Callers,
    run: Duration,
) -> RateRow {
    let shared = SharedReplica::new(replica);
    let spinner = loaded.then(Spinner::start);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let (stats, elapsed, mut acks) = match callers {
        Callers::Single | Callers::Batch(_) => {
            let len = match callers {
                Callers::Batch(len) => len,
                _ => 1,
            };
            let shared_for = shared.clone();
            let append: Arc<dyn Fn(Bytes) + Send + Sync> = if len == 1 {
                Arc::new(move |payload| {
                    shared_for.append(payload).expect("durable append");
                })
            } else {
                Arc::new(move |payload: Bytes| {
                    shared_for
                        .append_batch(vec![payload; len])
                        .expect("durable append");
                })
            };
            let threads = append_threads(append, &stop);
            std::thread::sleep(run);
            stop.store(true, Ordering::Relaxed);
            let (stats, elapsed) = (shared.commit_stats(), start.elapsed());
            (stats, elapsed, join_all(threads))
        }
        Callers::Async => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            runtime.block_on(async {
                let tasks: Vec<_> = (0..CALLERS as u64)
                    .map(|task| {
                        let (shared, stop) = (shared.clone(), Arc::clone(&stop));
                        tokio::spawn(async move {
                            let mut latencies = Vec::new();
                            let mut n = task << 32;
                            while !stop.load(Ordering::Relaxed) {
                                let asked = Instant::now();
                                shared
                                    .append_async(payload(n))
                                    .await
                                    .expect("durable append");
                                latencies.push(asked.elapsed());
                                n += 1;
                            }
                            latencies
                        })
                    })
                    .collect();
                tokio::time::sleep(run).await;
                stop.store(true, Ordering::Relaxed);
                let (stats, elapsed) = (shared.commit_stats(), start.elapsed());
                let mut acks = Vec::new();
                for task in tasks {
                    acks.extend(task.await.expect("an append task panicked"));
                }
                (stats, elapsed, acks)
            })
        }
    };
    drop(spinner);
    drop(shared);
    acks.sort();
    let commits = std::mem::take(&mut *lock(commits));
    let elapsed = elapsed.as_secs_f64();
    // The share of the run the committer spent inside the store's commit:
    // near 100%, the rate is the store's; well below, the time goes to
    // the handle (planning, publishing, answering) or to waiting for
    // callers.
    let store_busy = commits.iter().sum::<Duration>().as_secs_f64() / elapsed;
    let row = RateRow {
        events_per_s: stats.appended as f64 / elapsed,
    };
    println!(
        "{:<28} {:<7} {:>10.0} {:>10.0} {:>8.1} {:>12} {:>11.0} {:>10} {:>8}",
        name,
        if loaded { "loaded" } else { "quiet" },
        row.events_per_s,
        stats.commits as f64 / elapsed,
        stats.appended as f64 / stats.commits.max(1) as f64,
        millis(mean(&commits)),
        store_busy * 100.0,
        millis(quantile(&acks, 0.99)),
        match (judged, row.events_per_s >= EVENTS_PER_S_GOAL) {
            (false, _) => "-",
            (true, true) => "met",
            (true, false) => "not met",
        },
    );
    row
}

/// Part 3: in-memory appends, one call per event, beside yrs (see the
/// module docs).
mod appends {
    use std::sync::Arc;
    use std::time::Instant;

    use bytes::Bytes;
    use meshlog_cursor::StreamId;
    use meshlog_replica::{Replica, SharedReplica};
    use yrs::{Any, Array, Doc, Transact};

    use super::env_number;

    /// The converge bench's event size.
    const EVENT_BYTES: usize = 32;
    const PASSES: usize = 3;

    #[derive(Clone, Copy)]
    enum System {
        SharedInMemory,
        SharedThread,
        Owned,
        Yrs,
    }

    impl System {
        const ALL: [System; 4] = [
            System::SharedInMemory,
            System::SharedThread,
            System::Owned,
            System::Yrs,
        ];

        fn name(self) -> &'static str {
            match self {
                System::SharedInMemory => "SharedReplica::in_memory",
                System::SharedThread => "SharedReplica::new(MemStore)",
                System::Owned => "Replica::append (owned)",
                System::Yrs => "yrs (txn per event)",
            }
        }
    }

    /// The 32 bytes of writer `writer`'s event `seq` (distinct per event).
    fn event(writer: u64, seq: u64) -> [u8; EVENT_BYTES] {
        let mut out = [0u8; EVENT_BYTES];
        out[..8].copy_from_slice(&writer.to_le_bytes());
        out[8..16].copy_from_slice(&seq.to_le_bytes());
        out
    }

    /// Events per second of one pass of `system`: `writers` writers of
    /// `events` appends each, writer after writer.
    fn pass(system: System, writers: u64, events: u64) -> f64 {
        let start = Instant::now();
        for writer in 1..=writers {
            let stream = StreamId::new(writer);
            match system {
                System::SharedInMemory => {
                    let shared = SharedReplica::in_memory(stream);
                    for seq in 1..=events {
                        let payload = Bytes::copy_from_slice(&event(writer, seq));
                        shared.append(payload).expect("append");
                    }
                    assert_eq!(shared.marks().get(stream), events);
                }
                System::SharedThread => {
                    let shared = SharedReplica::new(Replica::new(stream));
                    for seq in 1..=events {
                        let payload = Bytes::copy_from_slice(&event(writer, seq));
                        shared.append(payload).expect("append");
                    }
                    assert_eq!(shared.marks().get(stream), events);
                }
                System::Owned => {
                    let mut replica = Replica::new(stream);
                    for seq in 1..=events {
                        let payload = Bytes::copy_from_slice(&event(writer, seq));
                        replica.append(payload).expect("append");
                    }
                    assert_eq!(replica.marks().get(stream), events);
                }
                System::Yrs => {
                    let doc = Doc::with_client_id(writer);
                    let array = doc.get_or_insert_array("log");
                    for seq in 1..=events {
                        let payload = Any::Buffer(Arc::from(&event(writer, seq)[..]));
                        array.push_back(&mut doc.transact_mut(), payload);
                    }
                    assert_eq!(u64::from(array.len(&doc.transact())), events);
                }
            }
        }
        (writers * events) as f64 / start.elapsed().as_secs_f64()
    }

    pub(super) fn run() {
        let writers = env_number("MESHLOG_BENCH_WRITERS", 4);
        let events = env_number("MESHLOG_BENCH_EVENTS", 100_000);
        println!(
            "3. in-memory appends, one call per {EVENT_BYTES}-byte event: {writers} writers x {events} events, best of {PASSES} passes"
        );
        let mut best = [0f64; System::ALL.len()];
        for _ in 0..PASSES {
            for (index, system) in System::ALL.into_iter().enumerate() {
                best[index] = best[index].max(pass(system, writers, events));
            }
        }
        let yrs = best[System::ALL.len() - 1];
        println!("{:<30} {:>12} {:>12}", "system", "M events/s", "x yrs");
        for (index, system) in System::ALL.into_iter().enumerate() {
            println!(
                "{:<30} {:>12.3} {:>12.2}",
                system.name(),
                best[index] / 1e6,
                best[index] / yrs
            );
        }
        let shared = best[0];
        println!("goal");
        println!(
            "  SharedReplica::in_memory appends at least yrs's rate: {:.3} vs {:.3} M/s ({:.2}x): {}",
            shared / 1e6,
            yrs / 1e6,
            shared / yrs,
            if shared >= yrs { "met" } else { "not met" }
        );
    }
}
