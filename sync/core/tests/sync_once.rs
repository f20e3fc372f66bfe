//! `sync_once`: one exchange between two replicas in memory, run to
//! quiescence through the sans-I/O protocol core, with no task, stream or
//! clock: the time is an argument.
//!
//! - Two replicas that each wrote converge in one round trip after the
//!   hellos, and a second exchange sends no event.
//! - A third party's events travel through the replica that holds them.
//! - A backlog larger than one delta budget (and than one frame's event
//!   limit) crosses in several frames, none above the limit, in one flight.
//! - A hostile delta handed to the core is refused with the replica's
//!   reason, through the same path a session takes.
//!
//! Each test states its numbers (flights, frames, events) so that a change
//! in what the protocol sends shows up here.

use std::time::Instant;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event, SharedReplica};
use meshlog_sync_core::frame::{Frame, Hello, PROTOCOL_VERSION};
use meshlog_sync_core::proto::{Protocol, Received};
use meshlog_sync_core::{sync_once, ProtocolError, SessionConfig, DELTA_EVENTS_MAX};

#[test]
fn two_writers_converge_in_one_exchange_and_a_second_sends_nothing() {
    let a = SharedReplica::in_memory(StreamId::new(1));
    let b = SharedReplica::in_memory(StreamId::new(2));
    for i in 0..10u8 {
        a.append(vec![i; 32]).unwrap();
        b.append(vec![i; 16]).unwrap();
    }
    let report = sync_once(Instant::now(), &a, &b, &SessionConfig::default()).unwrap();
    assert!(report.quiescent);
    assert_eq!(a.digest(), b.digest());
    assert_eq!(a.marks(), b.marks());
    assert_eq!((report.a.events_sent, report.b.events_sent), (10, 10));
    assert_eq!((report.a.events_applied, report.b.events_applied), (10, 10));
    assert_eq!(report.a.events_duplicate + report.b.events_duplicate, 0);
    // A: hello. B: hello, its delta. A: its delta, an ack. B: an ack.
    assert!(report.flights <= 4, "{report:?}");

    let again = sync_once(Instant::now(), &a, &b, &SessionConfig::default()).unwrap();
    assert!(again.quiescent);
    assert_eq!(again.a.events_sent + again.b.events_sent, 0, "{again:?}");
    // The hellos only.
    assert_eq!(again.a.frames_sent + again.b.frames_sent, 2, "{again:?}");
}

#[test]
fn a_third_partys_events_travel_through_the_replica_that_holds_them() {
    let a = SharedReplica::in_memory(StreamId::new(1));
    let b = SharedReplica::in_memory(StreamId::new(2));
    let c = SharedReplica::in_memory(StreamId::new(3));
    c.append(&b"from c"[..]).unwrap();
    sync_once(Instant::now(), &c, &a, &SessionConfig::default()).unwrap();
    let report = sync_once(Instant::now(), &a, &b, &SessionConfig::default()).unwrap();
    assert_eq!(report.a.events_sent, 1);
    assert_eq!(b.marks().get(StreamId::new(3)), 1);
    assert_eq!(b.digest(), c.digest());
}

#[test]
fn a_backlog_above_the_budget_crosses_in_several_frames() {
    let a = SharedReplica::in_memory(StreamId::new(1));
    let b = SharedReplica::in_memory(StreamId::new(2));
    let events = 2 * DELTA_EVENTS_MAX + 100;
    for chunk in (0..events).collect::<Vec<_>>().chunks(1000) {
        a.append_batch(chunk.iter().map(|_| Bytes::from_static(b"x")).collect())
            .unwrap();
    }
    // A budget large enough for deltas above the frame's event limit.
    let config = SessionConfig {
        delta_bytes_max: 2 << 20,
        ..SessionConfig::default()
    };
    let report = sync_once(Instant::now(), &a, &b, &config).unwrap();
    assert!(report.quiescent);
    assert_eq!(a.digest(), b.digest());
    assert_eq!(report.a.events_sent, events as u64);
    assert_eq!(report.b.events_applied, events as u64);
    // At least one delta frame per `DELTA_EVENTS_MAX` events, plus a hello.
    assert!(report.a.frames_sent >= 4, "{report:?}");
}

#[test]
fn a_hostile_delta_is_refused_by_the_core_with_the_replicas_reason() {
    let a = SharedReplica::in_memory(StreamId::new(1));
    a.append(&b"mine"[..]).unwrap();
    let now = Instant::now();
    let mut core = Protocol::new(a.stream(), SessionConfig::default(), now);
    let hello = Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        stream: StreamId::new(66),
        marks: VersionVector::new(),
        floor: VersionVector::new(),
        frame_bytes_max: meshlog_sync_core::FRAME_BYTES_MAX as u32,
    });
    assert_eq!(
        core.handle_frame(now, hello, &a).unwrap(),
        Received::Nothing
    );
    // Events of A's own stream beyond its head: only A writes its stream.
    let forged = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: vec![Event {
            stream: StreamId::new(1),
            seq: 2,
            lamport: 9,
            time_ms: 0,
            payload: Bytes::from_static(b"forged"),
        }],
        seals: Vec::new(),
    };
    let Received::Apply(columns) = core.handle_frame(now, Frame::delta(1, forged), &a).unwrap()
    else {
        panic!("a delta is handed back to apply");
    };
    let applied = a.apply_columns(columns);
    let error = core.handle_applied(now, applied).unwrap_err();
    assert!(
        matches!(error, ProtocolError::Refused { peer, .. } if peer == StreamId::new(66)),
        "{error}"
    );
    assert_eq!(a.marks().get(StreamId::new(1)), 1);
}
