//! A stranger's delta, from its bytes to the replica's state: the checks of
//! the `delta_apply` fuzz target (`meshlog_sync::testkit::delta_check`) on
//! every file under `fuzz/regressions/delta_apply/`, on hand-made deltas at
//! the edges (claims about the receiver's own stream, seqs, stamps and
//! floors at 0, 1 and the type's maximum), and on seeded random deltas near
//! the receiver's heads, valid or with bytes flipped. Each must leave the
//! receiver's own events in place, refuse without a trace or apply as the
//! same events one by one would.

use std::path::PathBuf;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event, LAMPORT_MAX};
use meshlog_sync::frame::{self, Frame};
use meshlog_sync::testkit::delta_check::{check_input, Outcome, OWN};
use meshlog_sync::testkit::{self, SplitMix64};

fn event(stream: StreamId, seq: u64, lamport: u64) -> Event {
    Event {
        stream,
        seq,
        lamport,
        time_ms: seq,
        payload: Bytes::from(vec![7u8; (seq % 5) as usize]),
    }
}

/// The delta's frame payload, if the layout can carry it.
fn payload(delta: Delta) -> Option<Vec<u8>> {
    frame::encode_payload(&Frame::Delta { number: 1, delta }).ok()
}

fn delta(floor: &[(u64, u64)], events: Vec<Event>) -> Delta {
    Delta {
        floor_proofs: Default::default(),
        floor: floor
            .iter()
            .map(|&(stream, seq)| (StreamId::new(stream), seq))
            .collect(),
        events,
        seals: Vec::new(),
    }
}

#[test]
fn the_fuzz_regressions_hold() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/delta_apply");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let mut replayed = 0;
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let data = std::fs::read(&path).expect("a regression file");
        let outcome = std::panic::catch_unwind(|| check_input(&data));
        let Ok(outcome) = outcome else {
            panic!("{} fails the checks", path.display());
        };
        // A seed is a delta of today's layout: one that no longer decodes
        // gives the fuzzer nothing to start from.
        let name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        if name.is_some_and(|name| name.starts_with("seed-")) {
            assert!(
                outcome.delta,
                "{} no longer decodes to a delta",
                path.display()
            );
        }
        replayed += 1;
    }
    assert!(replayed > 0, "{} holds no regression", dir.display());
}

/// A sealed delta from a stranger's bytes (protocol 4): the seal is
/// verified on the fuzz path as in a session, in columns and as events
/// alike. The seeds: `docs/PROTOCOL.md`'s sealed example (a new writer's
/// first event), taken; the same with its payload altered, refused.
#[test]
fn a_sealed_run_is_verified_on_the_fuzz_path() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/delta_apply");
    for (seed, accepted) in [
        ("seed-a-sealed-run-of-a-new-writer", true),
        ("seed-a-sealed-run-its-seal-does-not-vouch-for", false),
    ] {
        let data = std::fs::read(dir.join(seed)).expect("the seed");
        let Ok(Frame::Delta { delta, .. }) = frame::decode_payload(&data) else {
            panic!("{seed} decodes to a delta");
        };
        assert_eq!(delta.seals.len(), 1, "{seed}");
        assert_eq!(
            check_input(&data),
            Outcome {
                delta: true,
                accepted
            },
            "{seed}"
        );
    }
}

#[test]
fn deltas_at_the_edges_are_applied_or_refused_cleanly() {
    let s = StreamId::new;
    let cases: Vec<(&str, Delta, bool)> = vec![
        (
            "the next events of a held stream",
            delta(&[], (6..=9).map(|q| event(s(2), q, 20 + q)).collect()),
            true,
        ),
        (
            "the hole below a pending event",
            delta(&[], vec![event(s(3), 1, 31), event(s(3), 2, 32)]),
            true,
        ),
        ("our own events, as we hold them", delta(&[], vec![]), true),
        (
            "our own stream ahead of us",
            delta(&[], vec![event(OWN, 4, 4)]),
            false,
        ),
        // Ignored (issue 29): refusing it ended every session.
        (
            "our own floor above our head",
            delta(&[(1, 4)], vec![]),
            true,
        ),
        ("our own floor at our head", delta(&[(1, 3)], vec![]), true),
        (
            "a floor at u64::MAX",
            delta(&[(9, u64::MAX)], vec![]),
            false,
        ),
        (
            "a floor at the stamp bound",
            delta(&[(9, LAMPORT_MAX)], vec![]),
            true,
        ),
        (
            "a stamp above the bound",
            delta(&[], vec![event(s(9), 1, LAMPORT_MAX + 1)]),
            false,
        ),
        (
            "a stamp at the bound",
            delta(&[], vec![event(s(9), 1, LAMPORT_MAX)]),
            true,
        ),
        (
            "a stream id at u64::MAX",
            delta(&[], vec![event(s(u64::MAX), 1, 1)]),
            true,
        ),
        (
            "a seq far above the head, held early",
            delta(&[], vec![event(s(2), u64::MAX - 1, 99)]),
            true,
        ),
        (
            "a seq of u64::MAX, held early",
            delta(&[], vec![event(s(2), u64::MAX, 99)]),
            true,
        ),
        ("a seq of 0", delta(&[], vec![event(s(2), 0, 1)]), false),
        (
            "a held seq restamped",
            delta(&[], vec![event(s(2), 5, 99)]),
            false,
        ),
        (
            "below a floor, ignored",
            delta(&[], vec![event(s(4), 1, 1)]),
            true,
        ),
        (
            "a floor and the events above it",
            delta(&[(5, 10)], (11..=12).map(|q| event(s(5), q, q)).collect()),
            true,
        ),
        (
            "stamps not rising past the head",
            delta(&[], vec![event(s(2), 6, 15)]),
            false,
        ),
    ];
    for (what, delta, accepted) in cases {
        let data = payload(delta).unwrap_or_else(|| panic!("{what}: the layout carries it"));
        assert_eq!(
            check_input(&data),
            Outcome {
                delta: true,
                accepted
            },
            "{what}"
        );
    }
}

/// A seeded delta near the receiver's heads: runs of streams 1 to 5 that
/// start below, at or above a head, with stamps rising from a random
/// start, sometimes a floor.
fn near_the_heads(rng: &mut SplitMix64) -> Delta {
    let heads = [3u64, 5, 0, 4, 0];
    let mut events = Vec::new();
    let mut floor = VersionVector::new();
    for stream in 1..=5u64 {
        if rng.below(2) == 0 {
            continue;
        }
        let head = heads[stream as usize - 1];
        let first = (head + 1).saturating_sub(rng.below(3)) + rng.below(2);
        let first = first.max(1);
        let mut lamport = rng.below(40);
        for seq in first..first + rng.below(6) {
            lamport += 1 + rng.below(3);
            events.push(event(StreamId::new(stream), seq, lamport));
        }
        if rng.below(5) == 0 {
            floor.advance(StreamId::new(stream), rng.below(head + 3));
        }
    }
    Delta {
        floor_proofs: Default::default(),
        floor,
        events,
        seals: Vec::new(),
    }
}

#[test]
fn seeded_deltas_near_the_heads_hold() {
    testkit::for_each_seed("seeded_deltas_near_the_heads_hold", 0xde17a, 200, |seed| {
        let mut rng = SplitMix64::new(seed);
        let mut decoded = 0;
        for _ in 0..20 {
            let Some(mut data) = payload(near_the_heads(&mut rng)) else {
                continue;
            };
            decoded += usize::from(check_input(&data).delta);
            // The same bytes with one flipped: decoded or not, applied or
            // not, the checks hold.
            let at = rng.below(data.len() as u64) as usize;
            data[at] ^= 1 << rng.below(8);
            check_input(&data);
        }
        assert!(decoded > 0, "seed {seed}: no delta decoded");
    });
    // Some seeds are accepted, some refused: the generator reaches both.
    let mut rng = SplitMix64::new(0xd3_17a);
    let outcomes: Vec<Outcome> = (0..200)
        .filter_map(|_| payload(near_the_heads(&mut rng)))
        .map(|data| check_input(&data))
        .collect();
    assert!(outcomes.iter().any(|o| o.accepted));
    assert!(outcomes.iter().any(|o| o.delta && !o.accepted));
}
