//! What signed streams cost (`docs/SIGNING.md`): signing and verifying a
//! seal, judging a public key (a new one, and one judged before: kept),
//! batch verification per seal at batch sizes 1, 16 and 64, and the
//! chain hash per event at payload sizes 16, 256 and 4,096 bytes; and a
//! writer's deltas at a 16 KiB budget (a stream longer than one delta, cut
//! at each budget), keyed beside unkeyed: building them (`delta_for`,
//! swept by the receiver's marks, a fresh writer each round) and a fresh
//! receiver applying them in order; the keyed deltas in columns (as a
//! session builds them) beside built as events; and a sealed run of 1, 10, 100 and
//! 1,000 events of 32 bytes (the chain hash over it and one seal), signed
//! and verified, per run and per event.
//!
//! Run: `cargo bench -p meshlog-bench --bench seal`
//!
//! Each figure is the best of five rounds of at least 200 ms, in µs (or ns)
//! per seal or per event. Keys and hashes come from a fixed seed. Nothing
//! is asserted: this is a measurement.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_cursor::VersionVector;
use meshlog_replica::{
    verify_seals, ChainHash, Config, Delta, DeltaColumns, Event, MemStore, Replica, Seal,
    WriterKey, WriterPublicKey,
};
use meshlog_testkit::SplitMix64;

const SEED: u64 = 0x5ea1_be7c;
const ROUND_MIN: Duration = Duration::from_millis(200);
const ROUNDS: usize = 5;
const BATCHES: [usize; 3] = [1, 16, 64];
const PAYLOADS: [usize; 3] = [16, 256, 4_096];
/// The sealed-delta rows: a writer of this many events of this size, sent
/// in deltas of this budget.
const DELTA_EVENTS: usize = 20_000;
const DELTA_PAYLOAD: usize = 100;
const DELTA_BUDGET: usize = 16 * 1024;

/// The best time per item over the rounds: `work` handles `items` items
/// per call, and is called until the round's minimum has passed.
fn per_item(items: usize, mut work: impl FnMut()) -> Duration {
    (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            let mut calls = 0u32;
            while start.elapsed() < ROUND_MIN {
                work();
                calls += 1;
            }
            start.elapsed() / (calls * items as u32)
        })
        .min()
        .expect("at least one round")
}

fn key(rng: &mut SplitMix64) -> WriterKey {
    WriterKey::from_bytes(rng.bytes())
}

fn hash(rng: &mut SplitMix64) -> ChainHash {
    ChainHash::from_bytes(rng.bytes())
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let mut rng = SplitMix64::new(SEED);
    println!("seal bench: seed {SEED:#x}, best of {ROUNDS} rounds of ≥ {ROUND_MIN:?}");

    let writer = key(&mut rng);
    let public = writer.public();
    let head = hash(&mut rng);
    let sign = per_item(1, || {
        black_box(Seal::sign(black_box(&writer), 7, black_box(head)));
    });
    let seal = Seal::sign(&writer, 7, head);
    let verify = per_item(1, || {
        black_box(seal.verify(black_box(&public))).expect("an honest seal");
    });
    let key_decode = per_item(1, || {
        black_box(WriterPublicKey::from_bytes(black_box(&public.to_bytes()))).expect("a key");
    });
    // More keys than the process keeps (4,096), taken in turn: each one
    // judged again.
    let mut fresh_rng = SplitMix64::new(SEED ^ 1);
    let fresh: Vec<[u8; 32]> = (0..5_000)
        .map(|_| key(&mut fresh_rng).public().to_bytes())
        .collect();
    let key_judge = per_item(fresh.len(), || {
        for bytes in &fresh {
            black_box(WriterPublicKey::from_bytes(black_box(bytes))).expect("a key");
        }
    });
    println!();
    println!("| operation | per seal |");
    println!("| --- | --- |");
    println!("| sign | {} |", micros(sign));
    println!("| verify alone | {} |", micros(verify));
    println!(
        "| decode and check a new public key | {} |",
        micros(key_judge)
    );
    println!(
        "| decode a public key judged before (kept) | {} |",
        micros(key_decode)
    );

    // Batches of seals by distinct writers, as a delta of many streams
    // carries them.
    let writers: Vec<WriterKey> = (0..64).map(|_| key(&mut rng)).collect();
    let seals: Vec<(Seal, WriterPublicKey)> = writers
        .iter()
        .map(|w| {
            (
                Seal::sign(w, 1 + rng.next_u64() % 1_000, hash(&mut rng)),
                w.public(),
            )
        })
        .collect();
    for batch in BATCHES {
        let seals = &seals[..batch];
        let cost = per_item(batch, || {
            verify_seals(black_box(seals), &[]).expect("honest seals");
        });
        println!("| verify_seals, batch of {batch} | {} |", micros(cost));
    }

    println!();
    println!("| payload | chain hash per event | per payload byte |");
    println!("| --- | --- | --- |");
    for len in PAYLOADS {
        let events: Vec<Event> = (1..=64u64)
            .map(|seq| Event {
                stream: StreamId::new(9),
                seq,
                lamport: seq,
                time_ms: 1_700_000_000_000 + seq,
                payload: Bytes::from(vec![seq as u8; len]),
            })
            .collect();
        let cost = per_item(events.len(), || {
            black_box(ChainHash::GENESIS.extend(black_box(&events)));
        });
        println!(
            "| {len} B | {:.0} ns | {:.2} ns |",
            cost.as_secs_f64() * 1e9,
            cost.as_secs_f64() * 1e9 / len as f64
        );
    }

    println!();
    println!(
        "| {DELTA_EVENTS} events of {DELTA_PAYLOAD} B, {} KiB deltas | deltas | build per delta | per event sent | apply per delta | per event received |",
        DELTA_BUDGET / 1024
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for keyed in [false, true] {
        sealed_delta_row(&mut rng, keyed);
    }
    columns_build(&mut rng);
    sealed_runs(&writer);
}

/// A writer of [`DELTA_EVENTS`] events, keyed or not.
fn delta_writer(key: &WriterKey, keyed: bool) -> Replica<MemStore> {
    let config = if keyed {
        Config::with_key(key.clone())
    } else {
        Config::new(key.stream())
    };
    let mut writer = Replica::open(config, MemStore::default()).expect("an empty store opens");
    for batch in 0..DELTA_EVENTS / 100 {
        let payloads = (0..100).map(|i| Bytes::from(vec![(batch + i) as u8; DELTA_PAYLOAD]));
        writer
            .append_batch_at(payloads, 1_700_000_000_000 + batch as u64)
            .expect("appends");
    }
    writer
}

/// The writer's deltas to a receiver that takes each in turn: marks swept
/// from 0 to the head.
fn sweep(writer: &Replica<MemStore>) -> Vec<Delta> {
    let stream = writer.stream();
    let mut marks = VersionVector::new();
    let mut deltas = Vec::new();
    while marks.get(stream) < writer.marks().get(stream) {
        let delta = writer.delta_for(&marks, DELTA_BUDGET);
        let last = delta.events.last().expect("a delta moves the receiver").seq;
        marks.advance(stream, last);
        deltas.push(delta);
    }
    deltas
}

/// The keyed writer's deltas in columns, as a session builds them
/// (`delta_columns_for`), beside the same deltas built as events and put
/// in columns (what `delta_columns_for` did for a run of the own stream
/// cut below the head until 2026-12-02, after reading the columns first):
/// the best of [`ROUNDS`] sweeps of a fresh writer, per delta.
fn columns_build(rng: &mut SplitMix64) {
    let key = key(rng);
    let stream = key.stream();
    let sweep_by = |build: &dyn Fn(&Replica<MemStore>, &VersionVector) -> DeltaColumns| {
        let mut best = Duration::MAX;
        let mut count = 0;
        for _ in 0..ROUNDS {
            let writer = delta_writer(&key, true);
            let mut marks = VersionVector::new();
            count = 0;
            let start = Instant::now();
            while marks.get(stream) < writer.marks().get(stream) {
                let columns = black_box(build(&writer, &marks));
                let run = columns.runs().last().expect("a delta moves the receiver");
                marks.advance(stream, run.first_seq + run.len as u64 - 1);
                count += 1;
            }
            best = best.min(start.elapsed());
        }
        best.as_secs_f64() * 1e6 / count as f64
    };
    let columns = sweep_by(&|writer, marks| writer.delta_columns_for(marks, DELTA_BUDGET));
    let events =
        sweep_by(&|writer, marks| DeltaColumns::from_delta(&writer.delta_for(marks, DELTA_BUDGET)));
    println!();
    println!(
        "keyed, in columns (a session's path): {columns:.1} µs a delta; built as events and put in columns: {events:.1} µs"
    );
}

/// One row: the best of [`ROUNDS`] sweeps of a fresh writer, and of
/// [`ROUNDS`] fresh receivers applying the deltas.
fn sealed_delta_row(rng: &mut SplitMix64, keyed: bool) {
    let key = key(rng);
    let mut build = Duration::MAX;
    let mut deltas = Vec::new();
    for _ in 0..ROUNDS {
        let writer = delta_writer(&key, keyed);
        let start = Instant::now();
        deltas = black_box(sweep(&writer));
        build = build.min(start.elapsed());
    }
    let mut apply = Duration::MAX;
    for _ in 0..ROUNDS {
        let mut receiver = Replica::new(StreamId::new(1));
        let start = Instant::now();
        for delta in &deltas {
            black_box(receiver.apply(delta)).expect("the writer's delta applies");
        }
        apply = apply.min(start.elapsed());
    }
    let n = deltas.len() as f64;
    println!(
        "| {} | {} | {:.1} µs | {:.0} ns | {:.1} µs | {:.0} ns |",
        if keyed { "keyed (sealed)" } else { "unkeyed" },
        deltas.len(),
        build.as_secs_f64() * 1e6 / n,
        build.as_secs_f64() * 1e9 / DELTA_EVENTS as f64,
        apply.as_secs_f64() * 1e6 / n,
        apply.as_secs_f64() * 1e9 / DELTA_EVENTS as f64,
    );
}

/// Run lengths of the sealed-run table: the sync bench's partition of
/// 1,000 events is one run of 1,000 (1 writer), 10 runs of 100 or 100 runs
/// of 10 (10 and 100 writers).
const RUNS: [u64; 4] = [1, 10, 100, 1_000];
/// The converge and sync benches' payload.
const RUN_PAYLOAD: usize = 32;

/// What one sealed run of `RUNS` events costs the writer (chain hash over
/// the run, then one signature) and a receiver (the same chain hash, then
/// one verification), per run and per event. Unsigned streams are hashed
/// lazily (docs/SIGNING.md, "Hash chain"), so the hash and the seal are
/// both what signing adds on the sync path.
fn sealed_runs(writer: &WriterKey) {
    let public = writer.public();
    println!();
    println!("sealed runs of {RUN_PAYLOAD}-byte events (chain hash over the run + one seal):");
    println!("| events in the run | sign per run | per event | verify per run | per event |");
    println!("| --- | --- | --- | --- | --- |");
    for len in RUNS {
        let events: Vec<Event> = (1..=len)
            .map(|seq| Event {
                stream: writer.stream(),
                seq,
                lamport: seq,
                time_ms: 1_700_000_000_000 + seq,
                payload: Bytes::from(vec![seq as u8; RUN_PAYLOAD]),
            })
            .collect();
        let sign = per_item(1, || {
            let head = ChainHash::GENESIS.extend(black_box(&events));
            black_box(Seal::sign(writer, len, head));
        });
        let seal = Seal::sign(writer, len, ChainHash::GENESIS.extend(&events));
        let verify = per_item(1, || {
            let head = ChainHash::GENESIS.extend(black_box(&events));
            assert!(head == seal.head, "the run reaches the sealed hash");
            black_box(seal.verify(black_box(&public))).expect("an honest seal");
        });
        let per_event = |d: Duration| d.as_secs_f64() * 1e9 / len as f64;
        println!(
            "| {len} | {} | {:.0} ns | {} | {:.0} ns |",
            micros(sign),
            per_event(sign),
            micros(verify),
            per_event(verify)
        );
    }
}
