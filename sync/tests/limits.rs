//! Limits a growing mesh reaches degrade a session instead of ending it.
//!
//! What it proves: a replica that holds `streams_max` streams, or whose
//! `payload_bytes_max` is below a peer's event, and a sender whose event is
//! too large for a frame, each keep exchanging everything that fits; what
//! does not is reported in the session's state ([`LimitHit`], one entry per
//! stream, and the `events_over_limit` metric), asked quiet (the peer stops
//! sending it), and the exchange still reaches quiescence. Before, each
//! ended the session (`SessionError::Limit`, `SessionError::Send`) on every
//! reconnect, for ever.
//!
//! How: one exchange at a time with `sync_once`, through the codec, no
//! clock; replicas opened with the limits under test.

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{Config, MemStore, Replica};
use meshlog_sync::{sync_once, LimitHit, SessionConfig, SharedReplica};

fn replica_with(stream: u64, configure: impl FnOnce(&mut Config)) -> SharedReplica {
    let mut config = Config::new(StreamId::new(stream));
    configure(&mut config);
    SharedReplica::new(Replica::open(config, MemStore::default()).expect("an in-memory replica"))
}

/// A replica holding events of `streams` writers (ids 100, 101, ...), each
/// with `events` events, besides its own.
fn hub(stream: u64, streams: u64, events: u64) -> SharedReplica {
    let hub = SharedReplica::in_memory(StreamId::new(stream));
    hub.append(&b"hub"[..]).unwrap();
    for writer in 0..streams {
        let source = SharedReplica::in_memory(StreamId::new(100 + writer));
        for i in 0..events {
            source.append(format!("{writer} {i}").into_bytes()).unwrap();
        }
        sync_once(&source, &hub, &SessionConfig::default()).unwrap();
    }
    hub
}

#[test]
fn a_peer_with_more_streams_than_streams_max_sends_what_fits_and_hears_what_does_not() {
    let a = hub(1, 6, 3);
    // B holds its own stream and takes two more.
    let b = replica_with(2, |config| config.streams_max = 3);
    b.append(&b"b"[..]).unwrap();
    let report = sync_once(&a, &b, &SessionConfig::default()).expect("the session keeps going");
    assert!(report.quiescent);
    assert_eq!(b.marks().len(), 3, "{:?}", b.marks());
    let refused: Vec<&LimitHit> = report.b.limits.iter().collect();
    assert_eq!(refused.len(), 7 - 2, "{refused:?}");
    assert!(refused
        .iter()
        .all(|hit| matches!(hit, LimitHit::StreamsMax { limit: 3, .. })));
    assert!(report.b.events_over_limit > 0);
    // A heard it: those streams are quiet on this session.
    assert_eq!(report.a.peer_quiet_streams, 5);
    // The other direction is unaffected.
    assert_eq!(a.marks().get(StreamId::new(2)), 1);

    // What fits keeps flowing: A's own stream came first (the lowest
    // stamps), so B holds it, and a new event of it arrives.
    assert_eq!(b.marks().get(StreamId::new(1)), 1);
    a.append(&b"more"[..]).unwrap();
    let report = sync_once(&a, &b, &SessionConfig::default()).unwrap();
    assert!(report.quiescent);
    assert_eq!(b.marks().get(StreamId::new(1)), 2);
    assert_eq!(b.marks().len(), 3);
}

/// Regression (issue 28, H8): sync re-counted the replica's streams itself
/// and left out the receiver's own stream before its first append, so it
/// let `streams_max` other streams through where the replica, which always
/// reserves its own stream's slot, takes one fewer: the replica refused the
/// whole delta with `TooManyStreams` and the session ended with
/// `SessionError::Limit`, again on every reconnect. The delta is now cut to
/// what the replica's `admission` says it takes.
#[test]
fn a_receiver_that_never_appended_keeps_its_own_slot_under_streams_max() {
    let a = hub(1, 6, 3);
    let b = replica_with(2, |config| config.streams_max = 3);
    let report = sync_once(&a, &b, &SessionConfig::default()).expect("the session keeps going");
    assert!(report.quiescent);
    assert_eq!(
        b.marks().len(),
        2,
        "two streams besides its own: {:?}",
        b.marks()
    );
    assert_eq!(b.marks().get(StreamId::new(2)), 0, "it never appended");
    assert!(!report.b.limits.is_empty());
    assert!(report
        .b
        .limits
        .iter()
        .all(|hit| matches!(hit, LimitHit::StreamsMax { limit: 3, .. })));
    // Its own slot is there when it writes.
    b.append(&b"b"[..]).unwrap();
    assert_eq!(b.marks().len(), 3);
}

#[test]
fn an_event_above_payload_bytes_max_stops_its_stream_there_and_nothing_else() {
    let a = SharedReplica::in_memory(StreamId::new(1));
    for len in [50, 50, 200, 50] {
        a.append(Bytes::from(vec![7u8; len])).unwrap();
    }
    let c = hub(3, 2, 4);
    sync_once(&c, &a, &SessionConfig::default()).unwrap();
    let b = replica_with(2, |config| config.payload_bytes_max = 100);
    let report = sync_once(&a, &b, &SessionConfig::default()).expect("the session keeps going");
    assert!(report.quiescent);
    assert_eq!(b.marks().get(StreamId::new(1)), 2, "stops below seq 3");
    assert_eq!(
        report.b.limits,
        [LimitHit::PayloadBytesMax {
            stream: StreamId::new(1),
            seq: 3,
            len: 200,
            limit: 100
        }]
    );
    // Every other stream arrived whole.
    for stream in [3, 100, 101] {
        assert_eq!(
            b.marks().get(StreamId::new(stream)),
            a.marks().get(StreamId::new(stream))
        );
    }
}

#[test]
fn an_event_too_large_for_a_frame_is_not_sent_and_the_rest_is() {
    // A replica configured above what a frame carries.
    let a = replica_with(1, |config| config.payload_bytes_max = 5 << 20);
    a.append(&b"small"[..]).unwrap();
    a.append(Bytes::from(vec![1u8; (4 << 20) + 1])).unwrap();
    a.append(&b"after"[..]).unwrap();
    let c = hub(3, 1, 2);
    sync_once(&c, &a, &SessionConfig::default()).unwrap();
    let b = replica_with(2, |config| config.payload_bytes_max = 5 << 20);
    let report = sync_once(&a, &b, &SessionConfig::default()).expect("the session keeps going");
    assert!(report.quiescent);
    assert_eq!(b.marks().get(StreamId::new(1)), 1);
    assert_eq!(b.marks().get(StreamId::new(100)), 2);
    assert!(matches!(
        report.a.limits[..],
        [LimitHit::FrameBytesMax {
            seq: 2,
            len: 4194305,
            limit: 4194304,
            ..
        }]
    ));
    assert_eq!(report.a.events_over_limit, 1);
}

/// The frame limit is a setting each side announces in its hello: a link
/// whose two sides both raise `frame_bytes_max` carries an event too large
/// for the default 4 MiB; raised on the sender only, the receiver's hello
/// still says 4 MiB, so the sender cuts there and reports the limit
/// between them, and the receiver (reading with its own limit) never sees
/// a larger frame. Real sessions over an in-memory stream, paused clock.
#[test]
fn a_frame_limit_raised_on_both_sides_carries_larger_events_and_on_one_side_does_not() {
    use std::time::Duration;

    use meshlog_sync::testkit::{run_paused, wait_for};
    use meshlog_sync::{Session, FRAME_BYTES_MAX};

    let big = (4 << 20) + 1;
    let writer = || {
        let a = replica_with(1, |config| config.payload_bytes_max = 6 << 20);
        a.append(&b"small"[..]).unwrap();
        a.append(Bytes::from(vec![7u8; big])).unwrap();
        a.append(&b"after"[..]).unwrap();
        a
    };
    let raised = SessionConfig {
        frame_bytes_max: 8 << 20,
        ..SessionConfig::default()
    };
    let default = SessionConfig::default();
    for (receiver_config, carried) in [(raised.clone(), true), (default, false)] {
        run_paused(async {
            let a = writer();
            let b = replica_with(2, |config| config.payload_bytes_max = 6 << 20);
            let (a_end, b_end) = tokio::io::duplex(64 * 1024);
            let a_session = Session::new(a.clone(), raised.clone());
            let b_session = Session::new(b.clone(), receiver_config);
            let (a_state, b_state) = (a_session.state(), b_session.state());
            let a_task = tokio::spawn(a_session.run(a_end));
            let b_task = tokio::spawn(b_session.run(b_end));
            let want = if carried { 3 } else { 1 };
            wait_for(
                "b to take what the link carries",
                Duration::from_secs(10),
                || {
                    b.marks().get(StreamId::new(1)) == want
                        && a_state.borrow().peer.is_some()
                        && (carried || !a_state.borrow().limits.is_empty())
                },
            )
            .await;
            // A few more heartbeats: nothing else arrives.
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(b.marks().get(StreamId::new(1)), want, "carried: {carried}");
            let sent = a_state.borrow().clone();
            // Neither side refused a frame: both sessions still run.
            for (side, task) in [("a", a_task), ("b", b_task)] {
                if task.is_finished() {
                    panic!(
                        "carried {carried}: {side}'s session ended: {:?}",
                        task.await
                    );
                }
            }
            assert_eq!(b_state.borrow().peer, Some(StreamId::new(1)));
            if carried {
                assert!(sent.limits.is_empty(), "{:?}", sent.limits);
                let held = b.delta_for(&meshlog_cursor::VersionVector::new(), usize::MAX);
                let large = held
                    .events
                    .iter()
                    .find(|e| e.seq == 2 && e.stream == StreamId::new(1));
                assert_eq!(
                    large.map(|e| e.payload.len()),
                    Some(big),
                    "the large event arrived whole"
                );
            } else {
                assert!(
                    matches!(
                        sent.limits[..],
                        [LimitHit::FrameBytesMax {
                            seq: 2,
                            len,
                            limit,
                            ..
                        }] if len == big && limit == FRAME_BYTES_MAX
                    ),
                    "{:?}",
                    sent.limits
                );
                assert!(sent.events_over_limit >= 1);
            }
        });
    }
}
