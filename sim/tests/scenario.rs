//! The simulator's CI scenario: a mesh of 20 replicas and 200 writers on a
//! random topology, run on a simulated clock over a lossy, duplicating,
//! reordering network, with partitions that heal, replicas that stop and
//! restart, a late joiner and compaction, while readers page with small
//! limits and fail over between replicas with their tokens. After every
//! step no replica holds a hole and every page is exactly-once (or a stale
//! answer that names exactly what the floor took); after writes stop and
//! everything heals, the mesh converges (marks, floors, digests) within a
//! bound of simulated time, and each walk, finished, returned every event
//! once or reported it lost. Replicas mint checkpoints
//! (`Replica::mint_checkpoint`, asked by their sessions) and the sessions
//! gossip them (the core's frames), and a reader that fails over carries
//! the token its replica's last page answered, version 2 where shorter,
//! which the target must read (`Replica::cursor`) as exactly the reader's
//! cursor.
//!
//! The property runs a handful of seeds (`MESHLOG_SCHEDULES=N` for more);
//! `MESHLOG_SEED=<seed>` replays one. A failure prints the seed and the
//! simulated time and step of the broken check.

use std::time::Duration;

use meshlog_sim::{Mesh, MeshConfig, NetConfig, Scenario};
use meshlog_sync_core::SessionConfig;
use meshlog_testkit::seed;

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The CI mesh: 20 replicas (one joining late), 200 writers, a lossy
/// network, 250 ms heartbeats (so timeouts and redials happen in a few
/// simulated seconds).
fn ci_scenario(seed: u64, replicas: usize, writers: usize) -> Scenario {
    Scenario {
        mesh: MeshConfig {
            seed,
            replicas,
            late_joiners: 1,
            writers,
            extra_links: replicas / 2,
            net: NetConfig {
                latency_min: ms(2),
                latency_max: ms(20),
                loss: 0.02,
                duplicate: 0.02,
                reorder: 0.05,
                reorder_window: ms(30),
            },
            session: SessionConfig::with_heartbeat(ms(250)),
            payload_bytes: 16,
        },
        write_for: Duration::from_secs(5),
        events_per_writer: 5,
        faults: true,
        retire_fraction: 0.0,
        readers: 3,
        step: ms(100),
        converge_within: Duration::from_secs(30),
        converge_poll: ms(10),
        quiet_for: Duration::from_secs(2),
        progress: None,
    }
}

fn schedules(default: usize) -> usize {
    std::env::var("MESHLOG_SCHEDULES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

#[test]
fn a_faulty_mesh_of_20_replicas_and_200_writers_converges_and_walks_exactly_once() {
    // Retuned from 0x5e4_0027 when an accepting side began to wait for
    // the dialer's hello and a lost loud began to be asked again (every
    // later draw moved; that seed's run held every invariant but met no
    // read timeout).
    let seed = seed::replay_or(0x5e4_002a);
    seed::with_seed("mesh_20x200", seed, |seed| {
        let (_, figures) = ci_scenario(seed, 20, 200)
            .run()
            .unwrap_or_else(|violation| panic!("seed {seed}: {violation}"));
        eprintln!("{figures:#?}");
        // Not vacuous: with the default seed (tuned for it), faults
        // happened and readers met them. A replayed seed checks the
        // invariants only.
        let ends = &figures.counters.session_ends;
        if seed::replayed().is_none() {
            assert!(
                ends.keys().any(|k| k.starts_with("read timeout")),
                "{ends:?}"
            );
            assert!(ends.contains_key("peer stopped"), "{ends:?}");
            assert!(figures.counters.frames_lost > 0 && figures.counters.frames_duplicated > 0);
            assert!(figures.failovers > 3 && figures.returned > 0);
            assert!(figures.stale > 0, "no reader met a stale answer");
            // Checkpoints were minted and gossiped, a reader carried a
            // version-2 token to another replica which expanded it (each
            // expansion is checked equal to the cursor in `fail_over`),
            // and the head token is version 2 and shorter than version 1.
            assert!(figures.counters_end.checkpoints_minted > 0);
            assert!(figures.failovers_relative > 0, "no version-2 failover");
            assert!(figures.token_v2_head.relative);
            assert!(figures.token_v2_head.chars < figures.token_head_bytes);
        }
        assert_eq!(figures.events, 1000);
        // Only timeouts, stops and duplicates end sessions: no protocol error.
        for why in ends.keys() {
            assert!(
                why.starts_with("read timeout") || why == "peer stopped" || why == "duplicate",
                "a session ended for {why}"
            );
        }
    });
}

#[test]
fn meshes_converge_and_walk_exactly_once_over_seeds() {
    for seed in seed::seeds(0x5e4_5eed, schedules(4)) {
        seed::with_seed("mesh_over_seeds", seed, |seed| {
            let mut scenario = ci_scenario(seed, 8, 40);
            scenario.write_for = Duration::from_secs(3);
            if let Err(violation) = scenario.run() {
                panic!("seed {seed}: {violation}");
            }
        });
    }
}

/// Churn: half the writers stop half-way and every replica compacts their
/// streams, under faults; the mesh still converges with every invariant
/// held, and each replica's floor holds their streams.
#[test]
fn a_mesh_whose_writers_retire_half_way_converges() {
    let seed = seed::replay_or(0x5e4_c4a2);
    seed::with_seed("mesh_churn", seed, |seed| {
        let mut scenario = ci_scenario(seed, 8, 40);
        scenario.write_for = Duration::from_secs(3);
        scenario.retire_fraction = 0.5;
        let (mesh, figures) = scenario
            .run()
            .unwrap_or_else(|violation| panic!("seed {seed}: {violation}"));
        let churn = figures.churn.expect("writers retired");
        assert_eq!(churn.retired, 20);
        assert!(churn.before > 0.0 && churn.after > 0.0, "{churn:?}");
        for node in mesh.up() {
            let floor = mesh.replica(node).expect("up").floor();
            assert!(floor.len() >= 15, "replica {node}: floor {floor:?}");
        }
    });
}

#[test]
fn a_seed_replays_the_same_run() {
    let seed = seed::replay_or(0x5e4_0001);
    let run = || {
        let mut scenario = ci_scenario(seed, 6, 30);
        scenario.write_for = Duration::from_secs(2);
        scenario.quiet_for = Duration::from_secs(1);
        let (mesh, figures) = scenario.run().expect("the small mesh converges");
        (mesh.fingerprint(), mesh.steps(), figures.counters)
    };
    let first = run();
    let second = run();
    assert_eq!(first, second, "seed {seed} ran twice differently");
    // And another seed runs differently (the fingerprint sees the run).
    let other = {
        let mut scenario = ci_scenario(seed ^ 1, 6, 30);
        scenario.write_for = Duration::from_secs(2);
        scenario.quiet_for = Duration::from_secs(1);
        scenario.run().expect("converges").0.fingerprint()
    };
    assert_ne!(first.0, other);
}

#[test]
fn a_clean_mesh_converges_within_three_diameters_of_round_trips() {
    let seed = seed::replay_or(0x5e4_c1ea);
    seed::with_seed("clean_mesh", seed, |seed| {
        let mut scenario = ci_scenario(seed, 12, 100);
        scenario.mesh.net = NetConfig::clean(ms(5), ms(15));
        scenario.write_for = Duration::from_secs(2);
        scenario.faults = false;
        scenario.mesh.late_joiners = 0;
        let (_, figures) = scenario.run().expect("converges");
        eprintln!("{figures:#?}");
        assert!(
            figures.converge_time <= figures.converge_goal,
            "converged in {:?}, goal {:?}",
            figures.converge_time,
            figures.converge_goal
        );
    });
}

// Only the harness's own compile check of `Mesh` as an API.
#[allow(dead_code)]
fn mesh_is_usable_alone(config: MeshConfig) -> Mesh {
    Mesh::new(config)
}

/// A clean mesh run as `mesh-bench` runs one (1 s heartbeats,
/// half-second steps, a 10 s quiet window): 10 replicas, 300 writers.
fn clean_scenario(seed: u64, retire_fraction: f64) -> Scenario {
    Scenario {
        mesh: MeshConfig {
            seed,
            replicas: 10,
            late_joiners: 0,
            writers: 300,
            extra_links: 5,
            net: NetConfig::clean(ms(10), ms(50)),
            session: SessionConfig::default(),
            payload_bytes: 16,
        },
        write_for: Duration::from_secs(5),
        events_per_writer: 5,
        faults: false,
        retire_fraction,
        readers: 2,
        step: ms(500),
        converge_within: Duration::from_secs(60),
        converge_poll: ms(5),
        quiet_for: Duration::from_secs(10),
        progress: None,
    }
}

/// The head token with churn (`docs/BENCHMARKS.md`, "With churn"): in
/// the clean mesh, half the writers retired half-way, the
/// token at the head of the converged mesh is relative to a checkpoint
/// and within 2 KB. The simulator's model of checkpoints ended this run
/// at version 1 (3,495 characters): it tried to mint after convergence
/// once, at the quiet window's start, within the 2 s of its last mint,
/// and never again; with or without churn. The sessions now ask their
/// replica to mint once a heartbeat, as the tokio driver does.
#[test]
fn with_churn_the_head_token_of_a_converged_mesh_is_relative_to_a_checkpoint() {
    let seed = seed::replay_or(27);
    seed::with_seed("churn_head_token", seed, |seed| {
        let scenario = clean_scenario(seed, 0.5);
        let (_, figures) = scenario
            .run()
            .unwrap_or_else(|violation| panic!("seed {seed}: {violation}"));
        let head = figures.token_v2_head;
        assert!(
            head.relative && head.chars <= 2048,
            "seed {seed}: head token {head:?}, version 1 {} characters",
            figures.token_head_bytes
        );
    });
}

/// A dialer's hello after a restart goes against a checkpoint, as from a
/// link's second session (the tokio driver's `PeerLink` memory, which the
/// node keeps on disk): in a converged, quiet mesh of 300 writers, each
/// replica in turn stops and restarts, its links redial, and no hello
/// goes whole. The simulator's links kept no memory: each redial's first
/// hello went whole (22 bytes a retired writer at scale).
#[test]
fn after_restarts_no_hello_goes_whole() {
    let seed = seed::replay_or(27);
    seed::with_seed("restart_hellos", seed, |seed| {
        let (mut mesh, _) = clean_scenario(seed, 0.0)
            .run()
            .unwrap_or_else(|violation| panic!("seed {seed}: {violation}"));
        let sent = |mesh: &Mesh, kind| mesh.counters().by_kind.get(kind).map_or(0, |c| c.0);
        let (whole, against) = (sent(&mesh, "hello"), sent(&mesh, "hello against"));
        for node in 0..mesh.replicas() {
            mesh.stop(node);
            let until = mesh.now() + Duration::from_secs(1);
            mesh.run_until(until);
            mesh.restart(node);
            let until = mesh.now() + Duration::from_secs(5);
            mesh.run_until(until);
        }
        assert_eq!(
            mesh.connected(),
            mesh.links().len(),
            "seed {seed}: every link redialed"
        );
        assert_eq!(
            sent(&mesh, "hello"),
            whole,
            "seed {seed}: a hello went whole after a restart"
        );
        assert!(sent(&mesh, "hello against") > against, "seed {seed}");
    });
}
