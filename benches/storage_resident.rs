//! A durable log larger than its cache (issue 13), printed with each goal
//! met or not:
//!
//! - resident memory (RSS, peak) of the process while it reopens, pages the
//!   whole log, appends and syncs — goal under 256 MiB;
//! - reopen time (`DiskStore::open` + `Replica::open`; the median of five)
//!   under the default options, which check no page on a clean open, and
//!   once with the page-checksum pass that redb's recovery ran after an
//!   unclean shutdown up to format 4 (since format 5 an unclean open
//!   replays the write-ahead segment's tail instead; `storage` times it) —
//!   goal under 1 s and flat from the smallest log to the largest;
//! - full-walk page rate with a warm cache (the median of three walks) —
//!   goal at least 5 M events/s —
//!   and cold (the OS page cache dropped, where permitted), as MB/s beside
//!   the disk's sequential read rate measured in the same run.
//!
//! 100 streams, 100-byte payloads, written in deltas of 4,096 events (one
//! durable commit each). Run:
//! `cargo bench -p meshlog-bench --bench storage_resident -- 1000000 10000000`
//! (sizes in events; default 1M and 10M). The data goes to `$MESHLOG_BENCH_DIR`
//! or the system's temp directory.

use std::io::Read;
use std::time::Instant;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Config, Delta, DiskOptions, DiskStore, Event, Replica};

const STREAMS: u64 = 100;
const PAYLOAD_BYTES: usize = 100;
const PAGE_LEN: usize = 10_000;
const DELTA_LEN: u64 = 4_096;
const OWN: StreamId = StreamId::new(1_000);
const WARM_WALKS: usize = 3;
const REOPENS: usize = 5;

fn event(i: u64) -> Event {
    Event {
        stream: StreamId::new(1 + i % STREAMS),
        seq: 1 + i / STREAMS,
        lamport: 1 + i,
        time_ms: 0,
        payload: Bytes::from(vec![(i % 251) as u8; PAYLOAD_BYTES]),
    }
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|line| line.starts_with(field))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|kib| kib.parse().ok())
        .unwrap_or(0)
}

/// Resets the peak RSS (`VmHWM`) to the current RSS.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn drop_os_cache() -> bool {
    // SAFETY-free: sync, then ask the kernel to drop clean pages.
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn open(dir: &std::path::Path, check_pages_on_open: bool) -> (Replica<DiskStore>, f64) {
    let start = Instant::now();
    let options = DiskOptions {
        check_pages_on_open,
        ..DiskOptions::default()
    };
    let store = DiskStore::open_with(dir, &options).unwrap();
    let replica = Replica::open(Config::new(OWN), store).unwrap();
    (replica, start.elapsed().as_secs_f64())
}

fn walk(replica: &Replica<DiskStore>) -> (u64, f64) {
    let start = Instant::now();
    let mut cursor = VersionVector::new();
    let mut count = 0u64;
    loop {
        let page = replica.page(&cursor, PAGE_LEN).unwrap();
        count += page.events.len() as u64;
        cursor = page.next;
        if page.at_head {
            break;
        }
    }
    (count, start.elapsed().as_secs_f64())
}

struct Row {
    events: u64,
    file_mib: f64,
    reopen_checked_s: f64,
    reopen_s: f64,
    warm_per_s: f64,
    cold_mib_per_s: Option<f64>,
    disk_mib_per_s: Option<f64>,
    peak_rss_mib: f64,
}

fn measure(events: u64, base: &std::path::Path) -> Row {
    let dir = base.join(format!("resident-{events}"));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let store = DiskStore::open(&dir).unwrap();
        let mut replica = Replica::open(Config::new(OWN), store).unwrap();
        let start = Instant::now();
        let mut i = 0;
        while i < events {
            let end = (i + DELTA_LEN).min(events);
            let delta = Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: (i..end).map(event).collect(),
                seals: Vec::new(),
            };
            replica.apply(&delta).unwrap();
            i = end;
        }
        eprintln!(
            "{events} events written in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
    let file = dir.join(meshlog_replica::DATA_FILE);
    let file_mib = std::fs::metadata(&file).unwrap().len() as f64 / (1 << 20) as f64;

    let (replica, reopen_checked_s) = open(&dir, true);
    drop(replica);
    let peak_reset = reset_peak_rss();
    // The reopen takes milliseconds, where one fsync of another tenant's
    // moves it by as much: the median of five.
    let mut reopens: Vec<f64> = (1..REOPENS).map(|_| open(&dir, false).1).collect();
    let (mut replica, reopen_s) = open(&dir, false);
    reopens.push(reopen_s);
    reopens.sort_by(f64::total_cmp);
    let reopen_s = reopens[reopens.len() / 2];
    assert_eq!(replica.digest().events, events);

    // Cold: the OS cache dropped (where permitted), then one walk; and the
    // disk's own sequential rate, reading the file after another drop.
    let cold = drop_os_cache();
    let (count, cold_s) = walk(&replica);
    assert_eq!(count, events);
    let (cold_mib_per_s, disk_mib_per_s) = if cold {
        let cold_rate = file_mib / cold_s;
        drop_os_cache();
        let start = Instant::now();
        let mut reader = std::fs::File::open(&file).unwrap();
        let mut buffer = vec![0u8; 1 << 20];
        while reader.read(&mut buffer).unwrap() > 0 {}
        (
            Some(cold_rate),
            Some(file_mib / start.elapsed().as_secs_f64()),
        )
    } else {
        (None, None)
    };
    // Warm: the median of three walks (the machine is shared; one walk's
    // figure moves with the other tenants' load).
    let walks = std::env::var("MESHLOG_BENCH_WARM_WALKS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(WARM_WALKS);
    let mut warm: Vec<f64> = (0..walks).map(|_| walk(&replica).1).collect();
    warm.sort_by(f64::total_cmp);
    let warm_s = warm[warm.len() / 2];
    // Append and sync while the log is this long.
    for round in 0..100u64 {
        replica
            .append_batch_at(
                (0..100).map(|_| Bytes::from(vec![7u8; PAYLOAD_BYTES])),
                round,
            )
            .unwrap();
    }
    let peak_rss_mib = if peak_reset {
        status_kib("VmHWM:") as f64 / 1024.0
    } else {
        f64::NAN
    };
    drop(replica);
    let _ = std::fs::remove_dir_all(&dir);
    Row {
        events,
        file_mib,
        reopen_checked_s,
        reopen_s,
        warm_per_s: events as f64 / warm_s,
        cold_mib_per_s,
        disk_mib_per_s,
        peak_rss_mib,
    }
}

fn main() {
    let mut sizes: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|arg| arg.parse().ok())
        .collect();
    if sizes.is_empty() {
        sizes = vec![1_000_000, 10_000_000];
    }
    let base = std::env::var_os("MESHLOG_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    println!(
        "meshlog disk-resident log: {STREAMS} streams, {PAYLOAD_BYTES}-byte payloads, pages of {PAGE_LEN}, cache {} MiB",
        meshlog_replica::CACHE_BYTES_DEFAULT >> 20
    );
    println!("| events | file MiB | reopen, pages checked (as after an unclean shutdown up to format 4) | reopen (default options, median of 5) | warm walk ev/s (median of 3) | cold walk MiB/s | disk sequential MiB/s | peak RSS MiB (reopen, walks, appends) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for &events in &sizes {
        let row = measure(events, &base);
        let opt = |v: Option<f64>| {
            v.map_or("n/a (cannot drop the OS cache)".to_string(), |v| {
                format!("{v:.0}")
            })
        };
        println!(
            "| {} | {:.0} | {:.3} s | {:.3} s | {:.0} | {} | {} | {:.0} |",
            row.events,
            row.file_mib,
            row.reopen_checked_s,
            row.reopen_s,
            row.warm_per_s,
            opt(row.cold_mib_per_s),
            opt(row.disk_mib_per_s),
            row.peak_rss_mib
        );
        rows.push(row);
    }
    let met = |ok: bool| if ok { "goal met" } else { "goal NOT met" };
    println!();
    for row in &rows {
        println!(
            "{} events: peak RSS {:.0} MiB (< 256): {}; reopen {:.3} s (< 1 s): {}; warm walk {:.2} M ev/s (>= 5): {}",
            row.events,
            row.peak_rss_mib,
            met(row.peak_rss_mib < 256.0),
            row.reopen_s,
            met(row.reopen_s < 1.0),
            row.warm_per_s / 1e6,
            met(row.warm_per_s >= 5e6),
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        if rows.len() > 1 {
            let ratio = last.reopen_s / first.reopen_s.max(1e-6);
            println!(
                "reopen {} / {}: {:.2}x (flat: within 2x): {}",
                last.events,
                first.events,
                ratio,
                met(ratio <= 2.0)
            );
        }
    }
}
