//! Seeded convergence under faults: 3 to 5 replicas, random appends
//! everywhere, fault links dropping (up to 30%), duplicating, delaying and
//! reordering frames, random partitions (symmetric, one-way, isolating one
//! replica, severed connections), then everything healed.
//!
//! What it proves, per schedule: all replicas reach equal marks and digests
//! within a bounded (virtual) time; each holds exactly the events appended
//! anywhere, none lost, none duplicated, each equal to what its writer
//! appended; and a reader that pages with small limits while switching
//! between replicas during the run, then walks to the head, gets every event
//! exactly once.
//!
//! How: every schedule is drawn from one seed (topology, fault rates, each
//! link's decisions, the steps) and runs on a current-thread runtime with
//! tokio's paused clock over in-memory links, so it replays exactly. A
//! failing schedule prints its seed; `MESHLOG_SEED=<seed> cargo test -p
//! meshlog-sync --test convergence` replays it. The default run has 4 × 52 =
//! 208 schedules, split in four tests so both cores work.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::Event;
use meshlog_sync::testkit::{self, Direction, Faults, MeshConfig, SimMesh, SplitMix64};
use meshlog_sync::SharedReplica;

const SCHEDULES_PER_TEST: usize = 52;
/// After everything heals, replicas must agree within this much virtual
/// time. The worst case is a session still waiting out its read timeout
/// (200 ms), then a reconnect delay (up to 100 ms), then one round trip;
/// over the default 208 schedules the slowest took 116 ms, the median 13 ms.
const CONVERGE_WITHIN: Duration = Duration::from_secs(2);

/// A reader that pages through whichever replica it is pointed at, with a
/// version-vector cursor, and checks it never sees an event twice.
struct Reader {
    cursor: VersionVector,
    seen: BTreeSet<(StreamId, u64)>,
}

impl Reader {
    fn page(
        &mut self,
        replica: &SharedReplica,
        limit: usize,
        model: &BTreeMap<(StreamId, u64), Event>,
    ) -> bool {
        let page = replica
            .page(&self.cursor, limit)
            .expect("no compaction here: never stale");
        for event in &page.events {
            let name = (event.stream, event.seq);
            assert!(self.seen.insert(name), "reader got {name:?} twice");
            assert_eq!(
                model.get(&name),
                Some(event),
                "reader got an event nobody appended"
            );
        }
        self.cursor = page.next;
        page.at_head
    }
}

fn run_schedule(seed: u64) {
    testkit::run_paused(schedule(seed));
}

async fn schedule(seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let n = 3 + rng.below(3) as usize;
    let replicas: Vec<SharedReplica> = (0..n)
        .map(|i| SharedReplica::in_memory(StreamId::new(i as u64 + 1)))
        .collect();
    let mut mesh = SimMesh::new(replicas.clone(), MeshConfig::default());

    // A random spanning tree (so some events must be relayed through a
    // third replica), plus a few extra links.
    let mut edges = Vec::new();
    for i in 1..n {
        edges.push((rng.below(i as u64) as usize, i));
    }
    for a in 0..n {
        for b in a + 1..n {
            if !edges.contains(&(a, b)) && rng.chance(0.25) {
                edges.push((a, b));
            }
        }
    }
    for (k, &(a, b)) in edges.iter().enumerate() {
        let faults = Faults::random(&mut rng, 0.3, 40);
        mesh.link(a, b, SplitMix64::derive(seed, k as u64), faults);
    }
    let controls: Vec<_> = mesh.links().map(|(_, control)| control.clone()).collect();

    let mut model: BTreeMap<(StreamId, u64), Event> = BTreeMap::new();
    let mut reader = Reader {
        cursor: VersionVector::new(),
        seen: BTreeSet::new(),
    };
    let mut reading = rng.below(n as u64) as usize;
    let mut appended = 0u64;

    let phases = 3 + rng.below(4);
    for _ in 0..phases {
        let link = rng.below(controls.len() as u64) as usize;
        match rng.below(5) {
            0 => {}
            1 => controls[link].cut(),
            2 => {
                let direction = if rng.chance(0.5) {
                    Direction::Forward
                } else {
                    Direction::Backward
                };
                controls[link].cut_one_way(direction);
            }
            3 => mesh.isolate(rng.below(n as u64) as usize),
            _ => controls[link].sever(),
        }
        let steps = 5 + rng.below(15);
        for _ in 0..steps {
            match rng.below(10) {
                0..=5 => {
                    let i = rng.below(n as u64) as usize;
                    appended += 1;
                    let payload = format!("seed {seed:x} replica {i} event {appended}");
                    let event = replicas[i]
                        .append_at(payload.into_bytes(), appended)
                        .expect("append");
                    let name = (event.stream, event.seq);
                    assert!(
                        model.insert(name, event).is_none(),
                        "{name:?} appended twice"
                    );
                }
                6 | 7 => {
                    let limit = 1 + rng.below(4) as usize;
                    reader.page(&replicas[reading], limit, &model);
                }
                8 => reading = rng.below(n as u64) as usize,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
        }
        if rng.chance(0.5) {
            for control in &controls {
                control.heal();
            }
        }
    }

    // The last partition: one replica isolated while every replica writes,
    // so the heal below has work to do.
    mesh.isolate(rng.below(n as u64) as usize);
    for replica in &replicas {
        appended += 1;
        let event = replica
            .append_at(format!("late {appended}").into_bytes(), appended)
            .expect("append");
        model.insert((event.stream, event.seq), event);
    }
    tokio::time::sleep(Duration::from_millis(rng.below(300))).await;

    mesh.heal_all();
    if let Err(divergence) = mesh.wait_converged(CONVERGE_WITHIN).await {
        panic!("{divergence}");
    }

    let expected_marks: VersionVector = model.keys().copied().collect();
    let expected_sum = model
        .values()
        .fold(0u128, |sum, e| sum.wrapping_add(e.content_hash()));
    for replica in &replicas {
        assert_eq!(
            replica.marks(),
            expected_marks,
            "replica {} marks",
            replica.stream()
        );
        let digest = replica.digest();
        assert_eq!(
            digest.events,
            model.len() as u64,
            "replica {} holds a wrong count",
            replica.stream()
        );
        assert_eq!(
            digest.sum,
            expected_sum,
            "replica {} digest",
            replica.stream()
        );
        let all = replica
            .page(&VersionVector::new(), 10_000)
            .expect("page all");
        assert!(all.at_head);
        let held: BTreeMap<_, _> = all
            .events
            .into_iter()
            .map(|e| ((e.stream, e.seq), e))
            .collect();
        assert_eq!(held, model, "replica {} events", replica.stream());
    }

    // The reader finishes its walk, still switching replicas.
    for _ in 0..10_000 {
        reading = rng.below(n as u64) as usize;
        if reader.page(&replicas[reading], 1 + rng.below(4) as usize, &model) {
            break;
        }
    }
    let expected: BTreeSet<_> = model.keys().copied().collect();
    assert_eq!(reader.seen, expected, "the reader missed events");
}

#[test]
fn seeded_convergence_under_faults_part_0() {
    testkit::for_each_seed(
        "seeded_convergence_under_faults_part_0",
        0xc0,
        SCHEDULES_PER_TEST,
        run_schedule,
    );
}

#[test]
fn seeded_convergence_under_faults_part_1() {
    testkit::for_each_seed(
        "seeded_convergence_under_faults_part_1",
        0xc1,
        SCHEDULES_PER_TEST,
        run_schedule,
    );
}

#[test]
fn seeded_convergence_under_faults_part_2() {
    testkit::for_each_seed(
        "seeded_convergence_under_faults_part_2",
        0xc2,
        SCHEDULES_PER_TEST,
        run_schedule,
    );
}

#[test]
fn seeded_convergence_under_faults_part_3() {
    testkit::for_each_seed(
        "seeded_convergence_under_faults_part_3",
        0xc3,
        SCHEDULES_PER_TEST,
        run_schedule,
    );
}
