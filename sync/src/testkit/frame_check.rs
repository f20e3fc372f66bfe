//! The checks of the `frame_decode` fuzz target, shared with its replay
//! under stable `cargo test` (`sync/tests/frame_decode.rs`), so both run the
//! very same code.
//!
//! Input format (helping the fuzzer past the header): the first byte picks a
//! mode, the rest is the body.
//!
//! - `byte % 4 == 0`: the body is a byte stream of length-prefixed frames,
//!   split with [`split_frame`] and each payload decoded, as a session reads.
//! - `byte % 4 == 1`: the body is one payload, decoded as is.
//! - `byte % 4 == 2`: the body follows a valid hello header (kind 0, this
//!   protocol version), so the fuzzer reaches the hello's vectors at once.
//! - `byte % 4 == 3`: the body is a delta's sections (protocol 4), after
//!   the payload of a valid delta of two runs ([`SECTIONS_PREFIX_RUNS`])
//!   whose floor names both streams, so the fuzzer reaches the seals, the
//!   statements and the floor hashes at once.
//!
//! What must hold: no panic; a length prefix above [`FRAME_BYTES_MAX`] is
//! [`FrameError::TooLarge`] and nothing else is; a delta that decodes holds
//! at most [`DELTA_EVENTS_MAX`] events, grouped by stream in strictly
//! ascending `(stream, seq)` order, and [`FrameError::TooManyEvents`] names a
//! count above it; its seals are at most one per run, streams strictly
//! ascending; its statements and floor hashes at most one per stream of
//! its floor, streams strictly ascending, each named by the floor; every
//! frame that decodes re-encodes and decodes to
//! itself. Re-encoding a delta also checks what its layout promises: per
//! stream, seqs contiguous and lamport stamps rising from 1 (the encoder
//! refuses anything else).

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, Event};

use crate::frame::{
    self, split_frame, Frame, FrameError, DELTA_EVENTS_MAX, FRAME_BYTES_MAX, PROTOCOL_VERSION,
};

/// The runs of the delta whose payload mode 3 puts before its body: streams
/// 1 and 2, two events each.
pub const SECTIONS_PREFIX_RUNS: usize = 2;

/// The payload of delta 1 of two runs (streams 1 and 2, seqs 1 and 2,
/// payloads `"ab"`) with the floor `{1: 5, 2: 5}` (so statements and floor
/// hashes of either stream are well formed), without sections: what mode
/// 3 puts before its body.
pub fn sections_prefix() -> Vec<u8> {
    let events = (1..=SECTIONS_PREFIX_RUNS as u64)
        .flat_map(|stream| {
            (1..=2).map(move |seq| Event {
                stream: StreamId::new(stream),
                seq,
                lamport: seq,
                time_ms: 1000,
                payload: Bytes::from_static(b"ab"),
            })
        })
        .collect();
    let delta = Delta {
        floor_proofs: Default::default(),
        floor: [(StreamId::new(1), 5), (StreamId::new(2), 5)]
            .into_iter()
            .collect::<VersionVector>(),
        events,
        seals: Vec::new(),
    };
    frame::encode_payload(&Frame::delta(1, delta)).expect("a valid delta")
}

/// What one input did, for the replay test's expectations.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Frames decoded.
    pub decoded: usize,
    /// Decoding errors, in order.
    pub errors: Vec<FrameError>,
}

/// Runs every check on `data`; panics if one fails.
pub fn check_input(data: &[u8]) -> Outcome {
    let mut outcome = Outcome::default();
    let Some((&mode, body)) = data.split_first() else {
        return outcome;
    };
    match mode % 4 {
        0 => {
            let mut rest = body;
            loop {
                match split_frame(rest) {
                    Ok(Some((payload, used))) => {
                        assert!(used == payload.len() + frame::LENGTH_PREFIX_BYTES);
                        check_payload(payload, &mut outcome);
                        rest = &rest[used..];
                    }
                    Ok(None) => break,
                    Err(error) => {
                        let FrameError::TooLarge { len, max } = error else {
                            panic!("split_frame failed with {error:?}, not TooLarge");
                        };
                        assert!(len > max && max == FRAME_BYTES_MAX);
                        outcome.errors.push(error);
                        break;
                    }
                }
            }
        }
        1 => check_payload(body, &mut outcome),
        2 => {
            let mut payload = vec![0u8, PROTOCOL_VERSION as u8];
            payload.extend_from_slice(body);
            check_payload(&payload, &mut outcome);
        }
        _ => {
            let mut payload = sections_prefix();
            payload.extend_from_slice(body);
            check_payload(&payload, &mut outcome);
        }
    }
    outcome
}

/// Decodes one payload and checks what holds of it: of a frame that
/// decodes, its delta's limits and orders and its round trip; of an
/// error, that it names a limit only when one was passed.
fn check_payload(payload: &[u8], outcome: &mut Outcome) {
    match frame::decode_payload(payload) {
        Ok(decoded) => {
            if let Frame::Delta { delta, .. } = &decoded {
                check_delta(delta);
            }
            check_round_trip(&decoded);
            outcome.decoded += 1;
        }
        Err(error) => {
            if let (FrameError::TooLarge { .. }, true) = (&error, payload.len() <= FRAME_BYTES_MAX)
            {
                panic!("decode of {} bytes reported {error}", payload.len());
            }
            if let FrameError::TooManyEvents { count, max } = error {
                assert!(count > max && max == DELTA_EVENTS_MAX, "{error}");
            }
            outcome.errors.push(error);
        }
    }
}

/// A decoded delta: at most [`DELTA_EVENTS_MAX`] events, in strictly
/// ascending `(stream, seq)` order; at most a seal per run, streams
/// strictly ascending; its floor proofs as [`check_floor_proofs`] says.
fn check_delta(delta: &Delta) {
    assert!(
        delta.events.len() <= DELTA_EVENTS_MAX,
        "decoded a delta of {} events",
        delta.events.len()
    );
    for pair in delta.events.windows(2) {
        assert!(
            (pair[0].stream, pair[0].seq) < (pair[1].stream, pair[1].seq),
            "a decoded delta out of (stream, seq) order: {:?} before {:?}",
            pair[0],
            pair[1]
        );
    }
    let runs = 1 + delta
        .events
        .windows(2)
        .filter(|pair| pair[0].stream != pair[1].stream)
        .count();
    assert!(
        delta.seals.len() <= runs.min(delta.events.len()),
        "decoded {} seals for {runs} runs",
        delta.seals.len()
    );
    check_floor_proofs(delta);
    for pair in delta.seals.windows(2) {
        assert!(
            pair[0].seal.stream < pair[1].seal.stream,
            "decoded seals out of stream order: {:?} before {:?}",
            pair[0].seal,
            pair[1].seal
        );
    }
}

/// A decoded delta's statements and floor hashes: each kind at most one
/// per stream of its floor, streams strictly ascending, each named by
/// the floor.
fn check_floor_proofs(delta: &Delta) {
    let proofs = &delta.floor_proofs;
    let streams = proofs.statements.iter().map(|s| s.statement.stream);
    let hashed = proofs.hashes.iter().map(|&(stream, _)| stream);
    for streams in [streams.collect::<Vec<_>>(), hashed.collect()] {
        assert!(
            streams.len() <= delta.floor.len(),
            "more floor proofs than floors"
        );
        assert!(
            streams.windows(2).all(|pair| pair[0] < pair[1]),
            "floor proofs out of order"
        );
        assert!(
            streams.iter().all(|&s| delta.floor.get(s) > 0),
            "a floor proof of a stream without a floor"
        );
    }
}

/// A decoded frame re-encodes, within the limit, to a frame that decodes
/// to itself.
fn check_round_trip(decoded: &Frame) {
    let encoded = frame::encode(decoded)
        .unwrap_or_else(|error| panic!("a decoded frame does not re-encode: {error}"));
    let (again, _) = split_frame(&encoded)
        .expect("a re-encoded frame is within the limit")
        .expect("a re-encoded frame is whole");
    assert_eq!(
        frame::decode_payload(again).as_ref(),
        Ok(decoded),
        "a frame does not survive re-encoding"
    );
}
