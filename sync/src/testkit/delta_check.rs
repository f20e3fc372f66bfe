//! The checks of the `delta_apply` fuzz target, shared with its replay
//! under stable `cargo test` (`sync/tests/delta_apply.rs`): the whole path
//! a stranger's delta takes, from the frame's bytes to a replica's state.
//!
//! Input: one frame payload. If it decodes to a delta, the delta is applied
//! to a receiver with some history (see [`receiver`]): its own stream 1
//! (3 events), a peer's stream 2 (5 events), an early event pending on
//! stream 3 (seq 3), and stream 4 compacted to 2 of its 4 events.
//!
//! What must hold: no panic; the receiver's own events are never removed
//! nor replaced; its marks never fall; a refused delta changes nothing (marks,
//! floor, digest, pending buffer); the state verifies after every apply;
//! and a delta accepted whole leaves the state that applying it floor
//! first, then event by event (each a delta of its own, but those of a
//! stream behind the floor, which are not taken), leaves: the runs
//! a replica applies at once agree with the events one at a time. The
//! protocol's own path, the payload decoded in columns and applied with
//! `apply_columns`, ends with the same outcome and state as the events.

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event, Replica};

use crate::frame::{self, Frame};

/// The receiver's own stream.
pub const OWN: StreamId = StreamId::new(1);

/// What one input did, for the replay test's expectations.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the payload decoded to a delta.
    pub delta: bool,
    /// Whether the receiver accepted it.
    pub accepted: bool,
}

fn event(stream: u64, seq: u64, lamport: u64) -> Event {
    Event {
        stream: StreamId::new(stream),
        seq,
        lamport,
        time_ms: 1_750_000_000_000 + seq,
        payload: Bytes::from(vec![stream as u8; (seq % 4) as usize]),
    }
}

/// The receiver every input is applied to (built the same way each time).
pub fn receiver() -> Replica {
    let mut replica = Replica::new(OWN);
    for i in 0..3u8 {
        // At a fixed time: two receivers must hold the very same events.
        replica
            .append_at(vec![i; 3], 1_750_000_000_000)
            .expect("an append");
    }
    let history = Delta {
        floor_proofs: Default::default(),
        floor: VersionVector::new(),
        events: (1..=5)
            .map(|seq| event(2, seq, 10 + seq))
            .chain((1..=4).map(|seq| event(4, seq, 20 + seq)))
            .chain([event(3, 3, 33)])
            .collect(),
        seals: Vec::new(),
    };
    replica.apply(&history).expect("the history applies");
    replica
        .compact(&[(StreamId::new(4), 2)].into_iter().collect())
        .expect("a compaction");
    replica
}

/// What a replica's state is, for comparisons.
fn state(replica: &Replica) -> (VersionVector, VersionVector, u64, usize) {
    (
        replica.marks(),
        replica.floor(),
        replica.digest().events,
        replica.pending_len(),
    )
}

/// Runs every check on `data`; panics if one fails.
pub fn check_input(data: &[u8]) -> Outcome {
    let mut outcome = Outcome::default();
    let Ok(Frame::Delta { delta, .. }) = frame::decode_payload(data) else {
        return outcome;
    };
    outcome.delta = true;
    let mut whole = receiver();
    let own_before: Vec<Event> = (1..=3)
        .map(|seq| whole.get(OWN, seq).expect("own event"))
        .collect();
    let before = state(&whole);
    let digest_before = whole.digest();
    let result = whole.apply(&delta);
    whole.verify().expect("the state verifies after an apply");
    check_columns_path(data, &format!("{result:?}"), &whole);
    let own_after: Vec<Option<Event>> = (1..=3).map(|seq| whole.get(OWN, seq)).collect();
    assert_eq!(
        own_after,
        own_before.into_iter().map(Some).collect::<Vec<_>>(),
        "our own events stay"
    );
    assert!(whole.marks().dominates(&before.0), "marks never fall");
    if result.is_err() {
        assert_eq!(state(&whole), before, "a refused delta changes nothing");
        assert_eq!(
            whole.digest(),
            digest_before,
            "a refused delta changes nothing"
        );
        return outcome;
    }
    outcome.accepted = true;
    check_one_by_one(&delta, &whole);
    outcome
}

/// The protocol's path: the same bytes decoded in columns and applied as
/// columns end with the same outcome (`result`, as events) and the same
/// state as `whole`.
fn check_columns_path(data: &[u8], result: &str, whole: &Replica) {
    // The protocol's path: the same bytes decoded in columns and applied
    // as columns, with the same outcome and the same state.
    let Ok(frame::Incoming::Delta { columns, .. }) =
        frame::decode_incoming(data, frame::FRAME_BYTES_MAX)
    else {
        panic!("a payload that decodes to a delta decodes to one in columns");
    };
    let mut in_columns = receiver();
    let result_in_columns = in_columns.apply_columns(&columns);
    in_columns
        .verify()
        .expect("the state verifies after an apply in columns");
    assert_eq!(
        format!("{result_in_columns:?}"),
        result,
        "in columns or as events"
    );
    assert_eq!(state(&in_columns), state(whole), "in columns or as events");
    assert_eq!(
        in_columns.digest(),
        whole.digest(),
        "in columns or as events"
    );
}

/// An accepted delta applied floor first, then one event at a time, ends
/// where `whole` (the delta applied at once) did; the events of a stream
/// the floor found behind it are not taken (they cannot attach above the
/// gap), so they are left out.
fn check_one_by_one(delta: &Delta, whole: &Replica) {
    // The same delta, floor first, then one event at a time.
    let mut one_by_one = receiver();
    let report = one_by_one
        .apply(&Delta {
            floor_proofs: Default::default(),
            floor: delta.floor.clone(),
            events: Vec::new(),
            seals: Vec::new(),
        })
        .expect("the floor of an accepted delta is accepted alone");
    let behind = |event: &&Event| {
        report
            .behind_floor
            .iter()
            .any(|&(stream, _)| stream == event.stream)
    };
    for event in delta.events.iter().filter(|event| !behind(event)) {
        one_by_one
            .apply(&Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: vec![event.clone()],
                seals: Vec::new(),
            })
            .expect("each event of an accepted delta is accepted alone");
    }
    assert_eq!(
        state(&one_by_one),
        state(whole),
        "whole or one by one: {delta:?}"
    );
    assert_eq!(
        one_by_one.digest(),
        whole.digest(),
        "whole or one by one: {delta:?}"
    );
}
