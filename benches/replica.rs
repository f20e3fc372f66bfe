//! The replica's rates and memory, printed (never asserted):
//!
//! - append, apply and page rates in events/s, and bytes of memory per event
//!   beyond the payload, for 100 streams and logs of 10k, 100k and 1M events;
//! - page time per event as the log grows (goal: 1M/10k within 1.5);
//! - beside a naive lamport-indexed scan (`BTreeMap` range over
//!   `lamport > after`, the broken design the version vector replaces), in
//!   the same run (goal: at least half its rate).
//!
//! Run: `cargo bench -p meshlog-bench --bench replica` (add `-- quick` for
//! 10k and 100k only).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event, Replica};
use meshlog_testkit::alloc::{self, CountingAlloc};

/// Counts live heap bytes, to measure memory per event. It counts per
/// thread: everything measured here runs on the main thread.
#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

const STREAMS: u64 = 100;
const PAYLOAD_BYTES: usize = 16;
const PAGE_LEN: usize = 1_000;

/// The i-th event of a mesh of 100 writers taking turns.
fn event(i: u64) -> Event {
    Event {
        stream: StreamId::new(1 + i % STREAMS),
        seq: 1 + i / STREAMS,
        lamport: 1 + i,
        time_ms: 0,
        payload: Bytes::from(i.to_le_bytes().repeat(PAYLOAD_BYTES / 8)),
    }
}

struct Row {
    events: u64,
    append_per_s: f64,
    apply_per_s: f64,
    page_per_s: f64,
    page_ns_per_event: f64,
    naive_per_s: f64,
    bytes_per_event: f64,
}

fn measure(n: u64) -> Row {
    // Append: one writer's own stream.
    let mut writer = Replica::new(StreamId::new(1_000));
    let payload = Bytes::from(vec![7u8; PAYLOAD_BYTES]);
    let start = Instant::now();
    for _ in 0..n {
        writer.append_at(payload.clone(), 0).unwrap();
    }
    let append_per_s = n as f64 / start.elapsed().as_secs_f64();
    drop(writer);

    // Apply: 100 streams arriving in deltas of 1,000 events. The count
    // starts before the deltas are made and ends after they are dropped, so
    // what is left is the replica's own cost: its log, its store, and
    // whatever it keeps of the payloads (a copy, or the shared buffers).
    let live_before = alloc::live_bytes();
    let deltas: Vec<Delta> = (0..n)
        .collect::<Vec<_>>()
        .chunks(1_000)
        .map(|chunk| Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: chunk.iter().map(|&i| event(i)).collect(),
            seals: Vec::new(),
        })
        .collect();
    // The receiver writes a stream of its own outside the 100 it receives:
    // a peer's delta may not carry the receiver's own stream.
    let mut replica = Replica::new(StreamId::new(STREAMS + 1));
    let start = Instant::now();
    for delta in &deltas {
        replica.apply(delta).unwrap();
    }
    let apply_per_s = n as f64 / start.elapsed().as_secs_f64();
    drop(deltas);
    let live_after = alloc::live_bytes();
    // Subtract the payloads themselves to leave the overhead.
    let bytes_per_event = (live_after - live_before) as f64 / n as f64 - PAYLOAD_BYTES as f64;

    // Page: a full walk from the start, PAGE_LEN at a time, three times.
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let mut cursor = VersionVector::new();
        let mut count = 0u64;
        loop {
            let page = replica.page(&cursor, PAGE_LEN).unwrap();
            count += page.events.len() as u64;
            black_box(&page.events);
            cursor = page.next;
            if page.at_head {
                break;
            }
        }
        assert_eq!(count, n);
        best = best.min(start.elapsed().as_secs_f64());
    }
    let page_per_s = n as f64 / best;

    // The naive design: a lamport-indexed map scanned from a scalar cursor.
    // Built event by event, as a journal is, not bulk-loaded.
    let mut naive: BTreeMap<(u64, StreamId), Event> = BTreeMap::new();
    for i in 0..n {
        let e = event(i);
        naive.insert((e.lamport, e.stream), e);
    }
    let mut best_naive = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let mut after = (0u64, StreamId::new(u64::MAX));
        let mut count = 0u64;
        loop {
            let page: Vec<Event> = naive
                .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
                .take(PAGE_LEN)
                .map(|(_, e)| e.clone())
                .collect();
            let Some(last) = page.last() else { break };
            after = (last.lamport, last.stream);
            count += page.len() as u64;
            black_box(&page);
        }
        assert_eq!(count, n);
        best_naive = best_naive.min(start.elapsed().as_secs_f64());
    }
    Row {
        events: n,
        append_per_s,
        apply_per_s,
        page_per_s,
        page_ns_per_event: best * 1e9 / n as f64,
        naive_per_s: n as f64 / best_naive,
        bytes_per_event,
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let sizes: &[u64] = if quick {
        &[10_000, 100_000]
    } else {
        &[10_000, 100_000, 1_000_000]
    };
    println!("meshlog replica benchmark: {STREAMS} streams, {PAYLOAD_BYTES}-byte payloads, pages of {PAGE_LEN}");
    println!(
        "| events | append ev/s | apply ev/s | page ev/s | page ns/ev | naive scan ev/s | page/naive | bytes/event beyond payload |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for &n in sizes {
        let row = measure(n);
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.2} | {:.0} |",
            row.events,
            row.append_per_s,
            row.apply_per_s,
            row.page_per_s,
            row.page_ns_per_event,
            row.naive_per_s,
            row.page_per_s / row.naive_per_s,
            row.bytes_per_event
        );
        rows.push(row);
    }
    let (first, last) = (&rows[0], &rows[rows.len() - 1]);
    let growth = last.page_ns_per_event / first.page_ns_per_event;
    let check = |ok: bool| if ok { "PASS" } else { "FAIL" };
    println!();
    println!(
        "page ns/event {} / {}: ratio {:.2} (goal <= 1.5): {}",
        last.events,
        first.events,
        growth,
        check(growth <= 1.5)
    );
    for row in &rows {
        println!(
            "{} events: page {:.2} M ev/s (goal >= 5): {}; page/naive {:.2} (goal >= 0.5): {}",
            row.events,
            row.page_per_s / 1e6,
            check(row.page_per_s >= 5e6),
            row.page_per_s / row.naive_per_s,
            check(row.page_per_s >= 0.5 * row.naive_per_s)
        );
    }
}
