//! A sealed stream longer than one delta syncs (`docs/SIGNING.md`,
//! "Seals", runs cut where a seal is held), and a received `base` anchors
//! an unanchored stream.
//!
//! A keyed writer writes many times what one delta's budget holds; a
//! receiver that pinned the stream (it requires seals) takes it delta by
//! delta, and a third replica takes it from that receiver, which relays
//! only the seals it kept. Every delta must be accepted and move the
//! receiver's marks, and at the end the chain digests agree. Budgets,
//! payload sizes and the path (events or columns) are drawn per seed;
//! the seed is printed on failure and replays with `MESHLOG_SEED`.

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{
    ChainHash, Config, Delta, DeltaColumns, KeptSeals, MemStore, Replica, Seal, WriterKey,
};
use meshlog_testkit::{seed, SplitMix64};

fn keyed(secret: u8) -> Replica<MemStore> {
    Replica::open(
        Config::with_key(WriterKey::from_bytes([secret; 32])),
        MemStore::default(),
    )
    .expect("an empty store opens")
}

/// A replica that requires seals (so it refuses any unsealed run).
fn strict(id: u64) -> Replica<MemStore> {
    let config = Config {
        require_seals: true,
        ..Config::new(StreamId::new(id))
    };
    Replica::open(config, MemStore::default()).expect("an empty store opens")
}

/// Sends deltas from `source` to `target` within `budget` until `target`
/// holds all `source` holds: every delta accepted and moving the marks,
/// every run of a sealed stream sealed. Answers how many deltas it took.
fn sync(
    source: &Replica<MemStore>,
    target: &mut Replica<MemStore>,
    budget: usize,
    rng: &mut SplitMix64,
    seed: u64,
) -> usize {
    let mut deltas = 0;
    while !target.marks().dominates(&source.marks()) {
        let before = target.marks();
        let delta = if rng.chance(0.5) {
            source.delta_for(&before, budget)
        } else {
            source.delta_columns_for(&before, budget).to_delta()
        };
        for run in delta.events.chunk_by(|a, b| a.stream == b.stream) {
            assert!(
                delta.seals.iter().any(|s| s.seal.stream == run[0].stream
                    && s.seal.seq == run[run.len() - 1].seq),
                "every run of a sealed stream ends at its seal, seed {seed}"
            );
        }
        let report = if rng.chance(0.5) {
            target.apply(&delta)
        } else {
            target.apply_columns(&DeltaColumns::from_delta(&delta))
        };
        report.unwrap_or_else(|error| panic!("delta {deltas} refused: {error}, seed {seed}"));
        assert_ne!(
            target.marks(),
            before,
            "delta {deltas} moved nothing, seed {seed}"
        );
        deltas += 1;
        assert!(deltas < 100_000, "no end, seed {seed}");
    }
    deltas
}

fn append_some(writer: &mut Replica<MemStore>, rng: &mut SplitMix64, count: u64) {
    for i in 0..count {
        let len = rng.between(0, 400) as usize;
        writer
            .append(Bytes::from(vec![i as u8; len]))
            .expect("append");
    }
}

#[test]
fn a_sealed_stream_many_deltas_long_syncs_to_a_pinned_receiver_and_on_through_it() {
    seed::for_each_seed("sealed_stream_syncs_by_many_deltas", 0x5ea15, 12, |seed| {
        let mut rng = SplitMix64::new(seed);
        let mut writers = [keyed(31), keyed(32)];
        let mut relay = strict(200);
        let mut third = strict(201);
        let budgets = [
            rng.between(200, 4_000) as usize,
            rng.between(100, 4_000) as usize,
        ];
        let mut deltas = 0;
        for _ in 0..4 {
            for writer in &mut writers {
                let count = rng.between(20, 150);
                append_some(writer, &mut rng, count);
            }
            for writer in &writers {
                deltas += sync(writer, &mut relay, budgets[0], &mut rng, seed);
            }
            // The third takes from the relay, which relays the seals it
            // kept (at the writers' cuts), thinned.
            sync(&relay, &mut third, budgets[1], &mut rng, seed);
        }
        for writer in &writers {
            let stream = writer.stream();
            let held = |r: &Replica<MemStore>| r.chain_digest().stream(stream).copied();
            assert_eq!(held(&relay), held(writer), "seed {seed}");
            assert_eq!(held(&third), held(writer), "seed {seed}");
        }
        assert_eq!(third.chain_digest(), relay.chain_digest(), "seed {seed}");
        assert!(deltas > 8, "many deltas ({deltas}), seed {seed}");
        third.verify().expect("verifies");
    });
}

/// A relay whose only seal of a stream is far above what a receiver's
/// budget holds: the run is left out while another stream holds the
/// delta's oldest event (that stream progresses), and once it holds the
/// oldest, goes whole to the seal, over the budget: a receiver is never
/// starved.
#[test]
fn a_run_that_cannot_end_at_a_held_seal_waits_and_is_never_starved() {
    let payload = || Bytes::from(vec![7u8; 20]);
    // `other` writes first; `sealed` sees it, so its stamps come after.
    let mut other = keyed(42);
    for _ in 0..5 {
        other.append(payload()).expect("append");
    }
    let mut sealed = keyed(41);
    sealed
        .apply(&other.delta_for(&sealed.marks(), usize::MAX))
        .expect("taken");
    for _ in 0..50 {
        sealed.append(payload()).expect("append");
    }
    let mut relay = Replica::new(StreamId::new(300));
    for writer in [&other, &sealed] {
        relay
            .apply(&writer.delta_for(&relay.marks(), usize::MAX))
            .expect("one sealed run each");
    }
    let mut receiver = strict(301);
    // The budget holds `other`'s 5 and a few of `sealed`'s 50, whose only
    // seal the relay holds is at 50.
    let budget = 1_000;
    let cut = relay.delta_for(&receiver.marks(), budget);
    let streams: Vec<StreamId> = cut.events.iter().map(|e| e.stream).collect();
    assert_eq!(streams, vec![other.stream(); 5], "the sealed run waits");
    receiver.apply(&cut).expect("sealed at 5");
    let whole = relay.delta_for(&receiver.marks(), budget);
    assert_eq!(whole.events.len(), 50, "to its seal, over the budget");
    assert!(whole.events.iter().all(|e| e.stream == sealed.stream()));
    receiver.apply(&whole).expect("sealed at 50");
    assert_eq!(receiver.chain_digest(), relay.chain_digest());
}

#[test]
fn thinning_keeps_the_newest_and_exponentially_spaced_older_seals() {
    let seed = seed::replay_or(0x7417);
    let mut rng = SplitMix64::new(seed);
    let key = WriterKey::from_bytes([51; 32]);
    for _ in 0..200 {
        let head = rng.between(1, 1 << 40);
        let floor = rng.below(head);
        let mut seqs: Vec<u64> = (0..rng.between(0, 300))
            .map(|_| rng.between(1, head))
            .collect();
        seqs.sort_unstable();
        let mut kept = KeptSeals {
            key: key.public(),
            seals: seqs
                .iter()
                .map(|&seq| Seal {
                    stream: key.stream(),
                    seq,
                    head: ChainHash::GENESIS,
                    signature: [0; 64],
                })
                .collect(),
        };
        kept.thin(floor, head);
        let got: Vec<u64> = kept.seals.iter().map(|s| s.seq).collect();
        assert!(got.len() <= KeptSeals::SEALS_MAX, "seed {seed}");
        assert!(
            got.is_sorted() && got.windows(2).all(|w| w[0] < w[1]),
            "seed {seed}"
        );
        let mut above: Vec<u64> = seqs.iter().copied().filter(|&s| s > floor).collect();
        above.dedup();
        let newest = &above[above.len().saturating_sub(KeptSeals::SEALS_RECENT)..];
        assert!(newest.iter().all(|s| got.contains(s)), "seed {seed}");
        // Every held seq's distance bucket below the head keeps one.
        let bucket = |seq: u64| 64 - (head - seq).leading_zeros();
        for seq in &above {
            assert!(
                got.iter().any(|&g| bucket(g) == bucket(*seq)),
                "seed {seed}"
            );
        }
    }
}

/// A newcomer takes a compacted writer's stream: the delta carries the
/// writer's floor and a run from right after it, sealed, with the chain
/// hash at the floor as `base`. The newcomer's chain is anchored there,
/// so its digest equals the writer's. So is one that learned the floor
/// first without a hash (unanchored), and one that takes it through a
/// relay.
#[test]
fn a_received_base_anchors_an_unanchored_stream() {
    let mut writer = keyed(61);
    let stream = writer.stream();
    let mut rng = SplitMix64::new(3);
    append_some(&mut writer, &mut rng, 30);
    writer
        .compact(&[(stream, 12)].into_iter().collect())
        .expect("compacts");
    assert!(writer.chain(stream).unwrap().anchored);

    let mut newcomer = strict(400);
    let delta = writer.delta_for(&newcomer.marks(), usize::MAX);
    assert!(
        delta.seals[0].base.is_some(),
        "the run starts after the floor"
    );
    newcomer.apply(&delta).expect("taken");
    assert_eq!(newcomer.chain_digest(), writer.chain_digest());
    assert!(newcomer.chain(stream).unwrap().anchored);

    // Unanchored first (a floor learned without a hash), then anchored.
    let mut late = Replica::new(StreamId::new(401));
    late.apply(&Delta {
        floor_proofs: Default::default(),
        floor: [(stream, 12)].into_iter().collect(),
        events: Vec::new(),
        seals: Vec::new(),
    })
    .expect("a floor alone");
    assert!(!late.chain(stream).unwrap().anchored, "unanchored");
    let small = writer.delta_for(&late.marks(), 600);
    assert!(small.events.len() < 18, "cut by the budget");
    late.apply(&small).expect("taken");
    assert!(late.chain(stream).unwrap().anchored, "anchored by the base");
    sync_all(&writer, &mut late);
    assert_eq!(late.chain_digest(), writer.chain_digest());

    // Through a relay: the relay is anchored, and sends the base on.
    let mut third = strict(402);
    sync_all(&newcomer, &mut third);
    assert_eq!(third.chain_digest(), writer.chain_digest());
}

fn sync_all(source: &Replica<MemStore>, target: &mut Replica<MemStore>) {
    while !target.marks().dominates(&source.marks()) {
        let delta = source.delta_for(&target.marks(), 1_000);
        target.apply(&delta).expect("taken");
    }
}

/// A keyed writer's run cut below its head by the budget is sealed in
/// columns as it is as events (the same events and seal: one hash at the
/// cut, one signature each). Delta by delta, as a receiver syncing takes them
/// (each delta starting where the last ended), the whole stream goes in
/// sealed columns, each delta accepted by a receiver that requires seals.
#[test]
fn a_cut_of_the_own_stream_is_sealed_in_columns_as_in_events() {
    seed::for_each_seed("own_cut_sealed_in_columns", 0xc07, 8, |seed| {
        let mut rng = SplitMix64::new(seed);
        let mut writer = keyed(41);
        let count = rng.between(40, 200);
        append_some(&mut writer, &mut rng, count);
        let mut receiver = strict(300);
        let budget = rng.between(300, 3_000) as usize;
        let mut deltas = 0;
        while !receiver.marks().dominates(&writer.marks()) {
            let before = receiver.marks();
            let signed = writer.stats().seals_signed;
            let columns = writer.delta_columns_for(&before, budget);
            let cut = columns.to_delta().events.last().expect("a run").seq
                < writer.marks().get(writer.stream());
            // A cut signs once; the head's seal is signed once and kept.
            let signatures = writer.stats().seals_signed - signed;
            assert!(
                signatures == 1 || (!cut && signatures == 0),
                "{signatures} signatures, cut {cut}, delta {deltas}, seed {seed}"
            );
            let events = writer.delta_for(&before, budget);
            assert_eq!(columns.to_delta(), events, "delta {deltas}, seed {seed}");
            receiver
                .apply_columns(&columns)
                .unwrap_or_else(|error| panic!("delta {deltas} refused: {error}, seed {seed}"));
            assert_ne!(receiver.marks(), before, "delta {deltas}, seed {seed}");
            deltas += 1;
        }
        assert!(
            deltas > 1,
            "cut at least once ({deltas} deltas), seed {seed}"
        );
        assert_eq!(
            receiver.chain_digest(),
            writer.chain_digest(),
            "seed {seed}"
        );
    });
}
