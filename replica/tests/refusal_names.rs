//! A refusal names what a user needs to act on (issue 28 follow-up: the
//! validator's rejection named the stream and seqs, and the error it became
//! dropped them for the limits): `TooManyStreams` names the stream that
//! does not fit and the seqs the delta carried of it, `PayloadTooLarge`
//! the event's seq; through a `Replica` and a `SharedReplica` alike.

use bytes::Bytes;
use meshlog_cursor::StreamId;
use meshlog_replica::{Config, Delta, Event, MemStore, Replica, ReplicaError, SharedReplica};

const OWN: StreamId = StreamId::new(1);

fn event(stream: u64, seq: u64, payload: &'static [u8]) -> Event {
    Event {
        stream: StreamId::new(stream),
        seq,
        lamport: seq,
        time_ms: 0,
        payload: Bytes::from_static(payload),
    }
}

fn config() -> Config {
    let mut config = Config::new(OWN);
    config.streams_max = 2;
    config.payload_bytes_max = 4;
    config
}

fn check(apply: impl Fn(&Delta) -> Result<(), ReplicaError>, append: impl Fn() -> ReplicaError) {
    apply(&Delta {
        events: vec![event(2, 1, b"a")],
        ..Delta::default()
    })
    .unwrap();
    let refused = apply(&Delta {
        events: vec![event(3, 1, b"b"), event(3, 2, b"c"), event(3, 3, b"d")],
        ..Delta::default()
    });
    assert!(
        matches!(
            &refused,
            Err(ReplicaError::TooManyStreams { stream, seqs, streams: 3, limit: 2 })
                if *stream == StreamId::new(3) && *seqs == (1..=3)
        ),
        "{refused:?}"
    );
    let refused = apply(&Delta {
        events: vec![event(2, 2, b"ok"), event(2, 3, b"too long")],
        ..Delta::default()
    });
    assert!(
        matches!(
            &refused,
            Err(ReplicaError::PayloadTooLarge { stream, seq: 3, len: 8, limit: 4 })
                if *stream == StreamId::new(2)
        ),
        "{refused:?}"
    );
    let refused = append();
    assert!(
        matches!(
            &refused,
            ReplicaError::PayloadTooLarge { stream, seq: 2, len: 8, limit: 4 } if *stream == OWN
        ),
        "the second payload of an append is seq 2: {refused:?}"
    );
}

#[test]
fn a_refusal_for_a_limit_names_the_stream_and_seqs() {
    let replica = std::cell::RefCell::new(Replica::open(config(), MemStore::default()).unwrap());
    check(
        |delta| replica.borrow_mut().apply(delta).map(drop),
        || {
            let payloads = vec![Bytes::from_static(b"ok"), Bytes::from_static(b"too long")];
            replica
                .borrow_mut()
                .append_batch_at(payloads, 0)
                .unwrap_err()
        },
    );
    let shared = SharedReplica::new(Replica::open(config(), MemStore::default()).unwrap());
    check(
        |delta| shared.apply(delta.clone()).map(drop),
        || {
            let payloads = vec![Bytes::from_static(b"ok"), Bytes::from_static(b"too long")];
            shared.append_batch(payloads).unwrap_err()
        },
    );
}
