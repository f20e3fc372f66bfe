//! The partition scenario of the brief, over real sockets on 127.0.0.1.
//!
//! `events_resume_across_partition_test`: replicas A and B, each with a
//! `PeerManager`; B dials A through a TCP `FaultProxy`. A reader walks A with
//! a small limit past B's stamp; the link is cut; B appends an event stamped
//! at or below the reader's position (B's clock stalled while A's ran on);
//! the link heals and A accepts it; the walk resumed from the last cursor
//! returns it, the same walk resumed again returns it again (the cursor is
//! data, not a session), delivering the late event a second time changes
//! nothing, and the finished walk holds every event exactly once.
//!
//! `events_travel_through_a_third_replica`: C dials A directly, B dials A
//! through the proxy; C's events reach B only through A, including one C
//! writes while B is cut off, and B's reader gets it exactly once after the
//! heal. It also checks the managers' peer reports (connected, marks, lag).
//!
//! Real time, short intervals (20 ms heartbeats); every wait is bounded.
//! Read and write timeouts are long (5 s): nothing here waits for one, and a
//! loaded machine that stalls the runtime for a few hundred milliseconds must
//! not end a session in the middle of a step that observes it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event};
use meshlog_sync::testkit::{wait_for, FaultProxy, Faults};
use meshlog_sync::{ManagerConfig, PeerDirection, PeerManager, SessionConfig, SharedReplica};

/// How long any wait here may take, in real time.
const WAIT: Duration = Duration::from_secs(10);

fn config(listen: bool, peers: Vec<SocketAddr>) -> ManagerConfig {
    ManagerConfig {
        listen: listen.then(|| "127.0.0.1:0".parse().unwrap()),
        peers,
        session: SessionConfig {
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            ..SessionConfig::with_heartbeat(Duration::from_millis(20))
        },
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
        connect_timeout: Duration::from_secs(1),
        ..ManagerConfig::default()
    }
}

/// Pages `replica` from `cursor` with `limit` until the head; returns the
/// events and the last cursor.
fn walk(
    replica: &SharedReplica,
    cursor: &VersionVector,
    limit: usize,
) -> (Vec<Event>, VersionVector) {
    let mut cursor = cursor.clone();
    let mut events = Vec::new();
    for _ in 0..10_000 {
        let page = replica.page(&cursor, limit).expect("page");
        events.extend(page.events);
        cursor = page.next;
        if page.at_head {
            return (events, cursor);
        }
    }
    panic!("walk did not reach the head");
}

#[tokio::test]
async fn events_resume_across_partition_test() {
    let a = SharedReplica::in_memory(StreamId::new(0xa));
    let b = SharedReplica::in_memory(StreamId::new(0xb));
    let manager_a = PeerManager::start(a.clone(), config(true, vec![]))
        .await
        .unwrap();
    let proxy = FaultProxy::start(manager_a.local_addr().unwrap(), 1, Faults::none())
        .await
        .unwrap();
    let manager_b = PeerManager::start(b.clone(), config(false, vec![proxy.local_addr()]))
        .await
        .unwrap();
    let link = proxy.control();

    let mut appended: BTreeMap<(StreamId, u64), Event> = BTreeMap::new();
    let mut record = |event: Event| {
        assert!(appended
            .insert((event.stream, event.seq), event.clone())
            .is_none());
        event
    };
    let b1 = record(b.append(&b"b1"[..]).unwrap());
    for i in 1..=3 {
        record(a.append(format!("a{i}").into_bytes()).unwrap());
    }
    wait_for("A and B to converge", WAIT, || {
        a.marks() == b.marks() && a.digest() == b.digest()
    })
    .await;

    // The reader walks A with a small limit, past B's stamp.
    let limit = 2;
    let (mut seen, mut cursor) = walk(&a, &VersionVector::new(), limit);
    let mut position = seen.iter().map(|e| e.lamport).max().unwrap();
    assert!(position >= b1.lamport, "the walk went past B's stamp");

    link.cut();
    // A writes on (its clock runs ahead); the reader follows.
    for i in 4..=8 {
        record(a.append(format!("a{i}").into_bytes()).unwrap());
    }
    let (more, next) = walk(&a, &cursor, limit);
    position = position.max(more.iter().map(|e| e.lamport).max().unwrap());
    seen.extend(more);
    cursor = next;

    // B, cut off, writes with its stalled clock: stamped at or below the
    // reader's position, which a lamport cursor would skip for ever.
    let late = record(b.append(&b"b2, late"[..]).unwrap());
    assert!(
        late.lamport <= position,
        "late stamp {} is above the reader's {position}",
        late.lamport
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !a.marks().covers(late.stream, late.seq),
        "the cut link let the late event through"
    );
    let (nothing, _) = walk(&a, &cursor, limit);
    assert!(
        nothing.is_empty(),
        "A has nothing new while the link is cut"
    );

    link.heal();
    wait_for("A to accept the late event", WAIT, || {
        a.marks().covers(late.stream, late.seq)
    })
    .await;

    // The walk resumed from the last cursor returns it.
    let (resumed, after_late) = walk(&a, &cursor, limit);
    assert_eq!(resumed, vec![late.clone()]);
    // Resumed again from the same cursor: the same answer.
    let (again, again_cursor) = walk(&a, &cursor, 1);
    assert_eq!(again, vec![late.clone()]);
    assert_eq!(again_cursor, after_late);

    // The late event delivered a second time changes nothing.
    let digest = a.digest();
    let report = a
        .apply(Delta {
            floor_proofs: Default::default(),
            floor: VersionVector::new(),
            events: vec![late.clone()],
            seals: Vec::new(),
        })
        .unwrap();
    assert_eq!((report.applied, report.duplicates), (0, 1));
    assert_eq!(a.digest(), digest);
    let (after_duplicate, _) = walk(&a, &after_late, limit);
    assert!(after_duplicate.is_empty());

    // Every event exactly once.
    seen.extend(resumed);
    let mut names: Vec<_> = seen.iter().map(|e| (e.stream, e.seq)).collect();
    names.sort();
    let before = names.len();
    names.dedup();
    assert_eq!(names.len(), before, "an event was returned twice");
    let seen: BTreeMap<_, _> = seen.into_iter().map(|e| ((e.stream, e.seq), e)).collect();
    assert_eq!(seen, appended);

    wait_for("B to converge too", WAIT, || {
        a.marks() == b.marks() && a.digest() == b.digest()
    })
    .await;
    manager_b.shutdown().await;
    manager_a.shutdown().await;
}

#[tokio::test]
async fn events_travel_through_a_third_replica() {
    let a = SharedReplica::in_memory(StreamId::new(0xa));
    let b = SharedReplica::in_memory(StreamId::new(0xb));
    let c = SharedReplica::in_memory(StreamId::new(0xc));
    let manager_a = PeerManager::start(a.clone(), config(true, vec![]))
        .await
        .unwrap();
    let a_addr = manager_a.local_addr().unwrap();
    let proxy = FaultProxy::start(a_addr, 2, Faults::none()).await.unwrap();
    let manager_b = PeerManager::start(b.clone(), config(false, vec![proxy.local_addr()]))
        .await
        .unwrap();
    let manager_c = PeerManager::start(c.clone(), config(false, vec![a_addr]))
        .await
        .unwrap();

    let c1 = c.append(&b"c1"[..]).unwrap();
    wait_for("c1 to reach B through A", WAIT, || {
        b.marks().covers(c1.stream, c1.seq)
    })
    .await;
    let (seen, cursor) = walk(&b, &VersionVector::new(), 1);
    assert_eq!(seen, vec![c1]);

    // Peer reports: B is connected to A (through the proxy) and has
    // acknowledged everything. The report checked is the one the wait saw,
    // so a reconnect in between cannot show a fresh session's empty marks.
    let mut caught_up = None;
    wait_for("B's report to show A caught up", WAIT, || {
        let mut peers = manager_b.peers();
        let done = peers.len() == 1
            && peers[0].connected
            && peers[0].lag_events == 0
            && peers[0].marks == b.marks();
        if done {
            caught_up = peers.pop();
        }
        done
    })
    .await;
    let report = caught_up.expect("the wait saw the report");
    assert_eq!(report.direction, PeerDirection::Outbound);
    assert_eq!(report.stream, Some(a.stream()));
    assert_eq!(report.marks, b.marks());
    wait_for("A to report two inbound peers", WAIT, || {
        let peers = manager_a.peers();
        peers.len() == 2
            && peers
                .iter()
                .all(|p| p.connected && p.direction == PeerDirection::Inbound)
    })
    .await;

    proxy.control().cut();
    let c2 = c.append(&b"c2 while B is cut off"[..]).unwrap();
    wait_for("c2 to reach A", WAIT, || {
        a.marks().covers(c2.stream, c2.seq)
    })
    .await;
    // While cut, B's report shows it behind... from A's side: A holds c2 and
    // B has not acknowledged it.
    wait_for("A to report B lagging", WAIT, || {
        manager_a
            .peers()
            .iter()
            .any(|p| p.stream == Some(b.stream()) && p.lag_events >= 1)
    })
    .await;
    proxy.control().heal();
    wait_for("c2 to reach B after the heal", WAIT, || {
        b.marks().covers(c2.stream, c2.seq)
    })
    .await;
    let (resumed, _) = walk(&b, &cursor, 1);
    assert_eq!(resumed, vec![c2]);

    manager_c.shutdown().await;
    manager_b.shutdown().await;
    manager_a.shutdown().await;
}
