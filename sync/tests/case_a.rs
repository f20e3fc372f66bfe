//! `case_a_follower_converges_after_loss`, from the brief: a frame-level
//! proxy drops, delays, duplicates and reorders frames and partitions a
//! peer; after every fault the follower's state equals a fresh snapshot read
//! of the source: marks, floor, digest and the whole log paged from the start,
//! event by event. Receiving a resync frame is not enough: the comparison is
//! of state, read after the fault is over.
//!
//! The source writes; the follower only receives. Each fault gets its own
//! phase: the source appends under the fault, the fault is lifted, and the
//! follower must match the snapshot within a bounded (virtual) time. One
//! phase compacts the source past what the partitioned follower holds: the
//! follower keeps its events (a peer's floor erases nothing it holds) and
//! stays behind until it gives them up itself; then it must learn the floor
//! through sync and report a cursor below it as stale. Seeded (`MESHLOG_SEED` replays),
//! over an in-memory fault link under tokio's paused clock.

use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::PageError;
use meshlog_sync::testkit::{
    self, Direction, Faults, LinkControl, MeshConfig, SimMesh, SplitMix64,
};
use meshlog_sync::SharedReplica;

const CONVERGE_WITHIN: Duration = Duration::from_secs(2);

/// Asserts the follower's state is the source's, read fresh now.
fn assert_follower_matches(source: &SharedReplica, follower: &SharedReplica, phase: &str) {
    assert_eq!(follower.marks(), source.marks(), "{phase}: marks");
    assert_eq!(follower.floor(), source.floor(), "{phase}: floor");
    assert_eq!(follower.digest(), source.digest(), "{phase}: digest");
    let snapshot = source.page(&source.floor(), 10_000).expect("source page");
    let held = follower
        .page(&follower.floor(), 10_000)
        .expect("follower page");
    assert!(snapshot.at_head && held.at_head, "{phase}: page all");
    assert_eq!(
        held.events, snapshot.events,
        "{phase}: the log, event by event"
    );
    assert_eq!(held.next, snapshot.next, "{phase}: next cursor");
}

async fn phase(
    mesh: &SimMesh,
    link: &LinkControl,
    rng: &mut SplitMix64,
    name: &str,
    fault: impl FnOnce(&LinkControl),
    during: impl FnOnce(&SharedReplica),
) {
    let source = &mesh.replicas()[0];
    let follower = &mesh.replicas()[1];
    fault(link);
    let count = 5 + rng.below(20);
    for i in 0..count {
        source
            .append_at(format!("{name} {i}").into_bytes(), i)
            .expect("append");
        tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
    }
    during(source);
    tokio::time::sleep(Duration::from_millis(200)).await;
    link.heal();
    link.set_faults(Faults::none());
    if let Err(divergence) = mesh.wait_converged(CONVERGE_WITHIN).await {
        panic!("after {name}: {divergence}");
    }
    assert_follower_matches(source, follower, name);
}

async fn scenario(seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let source = SharedReplica::in_memory(StreamId::new(1));
    let follower = SharedReplica::in_memory(StreamId::new(2));
    let mut mesh = SimMesh::new(
        vec![source.clone(), follower.clone()],
        MeshConfig::default(),
    );
    let link = mesh.link(0, 1, seed, Faults::none());
    let delay_ms_max = 10 + rng.below(60);
    let rates = |drop: f64, duplicate: f64, delay: f64, reorder: f64| Faults {
        drop,
        duplicate,
        delay,
        reorder,
        delay_ms_max,
    };

    let nothing = |_: &SharedReplica| {};
    phase(
        &mesh,
        &link,
        &mut rng,
        "drop 30%",
        |l| l.set_faults(rates(0.3, 0.0, 0.0, 0.0)),
        nothing,
    )
    .await;
    phase(
        &mesh,
        &link,
        &mut rng,
        "delay",
        |l| l.set_faults(rates(0.0, 0.0, 0.8, 0.0)),
        nothing,
    )
    .await;
    phase(
        &mesh,
        &link,
        &mut rng,
        "duplicate",
        |l| l.set_faults(rates(0.0, 0.5, 0.0, 0.0)),
        nothing,
    )
    .await;
    phase(
        &mesh,
        &link,
        &mut rng,
        "reorder",
        |l| l.set_faults(rates(0.0, 0.0, 0.0, 0.6)),
        nothing,
    )
    .await;
    phase(&mesh, &link, &mut rng, "partition", |l| l.cut(), nothing).await;
    phase(
        &mesh,
        &link,
        &mut rng,
        "one-way partition to the follower",
        |l| l.cut_one_way(Direction::Forward),
        nothing,
    )
    .await;
    phase(
        &mesh,
        &link,
        &mut rng,
        "one-way partition from the follower",
        |l| l.cut_one_way(Direction::Backward),
        nothing,
    )
    .await;
    phase(
        &mesh,
        &link,
        &mut rng,
        "severed connection",
        |l| l.sever(),
        nothing,
    )
    .await;
    phase(
        &mesh,
        &link,
        &mut rng,
        "all faults at once",
        |l| l.set_faults(rates(0.3, 0.3, 0.3, 0.3)),
        nothing,
    )
    .await;

    // A partition during which the source compacts past everything the
    // follower holds. A peer's floor has no authority over what the
    // follower holds (issue 29, docs/SIGNING.md): healed, the follower
    // keeps its events and stays behind the floor, taking nothing above
    // the gap. Once it gives them up (compacts what it holds of the stream,
    // its own decision), it learns the floor through sync and reports a
    // cursor below it as stale.
    let old_cursor = follower.marks();
    let old_floor = follower.floor();
    let stream = source.stream();
    link.set_faults(rates(0.2, 0.2, 0.2, 0.2));
    link.cut();
    for i in 0..5 + rng.below(20) {
        source
            .append_at(format!("partition with compaction {i}").into_bytes(), i)
            .expect("append");
        tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
    }
    let head = source.marks().get(stream);
    let floor: VersionVector = [(stream, head - 2)].into_iter().collect();
    source.compact(&floor).expect("compact");
    tokio::time::sleep(Duration::from_millis(200)).await;
    link.heal();
    link.set_faults(Faults::none());
    tokio::time::sleep(CONVERGE_WITHIN).await;
    assert_eq!(
        follower.floor(),
        old_floor,
        "the source's floor erased nothing"
    );
    assert_eq!(follower.marks(), old_cursor, "nothing taken above the gap");
    let give_up: VersionVector = [(stream, old_cursor.get(stream))].into_iter().collect();
    follower.compact(&give_up).expect("the follower gives up");
    if let Err(divergence) = mesh.wait_converged(CONVERGE_WITHIN).await {
        panic!("after partition with compaction: {divergence}");
    }
    assert_follower_matches(&source, &follower, "partition with compaction");
    assert!(follower.floor().get(stream) > old_cursor.get(stream));
    match follower.page(&old_cursor, 10) {
        Err(PageError::Stale(stale)) => {
            assert_eq!(
                stale.lost()[0].first_seq,
                old_cursor.get(source.stream()) + 1
            );
        }
        other => panic!("a cursor below the learnt floor must be stale, got {other:?}"),
    }
    // After the compaction, the plain faults once more.
    phase(
        &mesh,
        &link,
        &mut rng,
        "drop after compaction",
        |l| l.set_faults(rates(0.3, 0.1, 0.1, 0.1)),
        nothing,
    )
    .await;
}

#[test]
fn case_a_follower_converges_after_loss() {
    testkit::for_each_seed("case_a_follower_converges_after_loss", 0xa, 8, |seed| {
        testkit::run_paused(scenario(seed));
    });
}
