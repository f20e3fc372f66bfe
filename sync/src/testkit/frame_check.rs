//! The checks of the `frame_decode` fuzz target, shared with its replay
//! under stable `cargo test` (`sync/tests/frame_decode.rs`), so both run the
//! very same code.
//!
//! Input format (helping the fuzzer past the header): the first byte picks a
//! mode, the rest is the body.
//!
//! - `byte % 3 == 0`: the body is a byte stream of length-prefixed frames,
//!   split with [`split_frame`] and each payload decoded, as a session reads.
//! - `byte % 3 == 1`: the body is one payload, decoded as is.
//! - `byte % 3 == 2`: the body follows a valid hello header (kind 0, this
//!   protocol version), so the fuzzer reaches the hello's vectors at once.
//!
//! What must hold: no panic; a length prefix above [`FRAME_BYTES_MAX`] is
//! [`FrameError::TooLarge`] and nothing else is; a delta that decodes holds
//! at most [`DELTA_EVENTS_MAX`] events, grouped by stream in strictly
//! ascending `(stream, seq)` order, and [`FrameError::TooManyEvents`] names a
//! count above it; every frame that decodes re-encodes and decodes to
//! itself. Re-encoding a delta also checks what its layout promises: per
//! stream, seqs contiguous and lamport stamps rising from 1 (the encoder
//! refuses anything else).

use crate::frame::{
    self, split_frame, Frame, FrameError, DELTA_EVENTS_MAX, FRAME_BYTES_MAX, PROTOCOL_VERSION,
};

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
    match mode % 3 {
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
        _ => {
            let mut payload = vec![0u8, PROTOCOL_VERSION as u8];
            payload.extend_from_slice(body);
            check_payload(&payload, &mut outcome);
        }
    }
    outcome
}

fn check_payload(payload: &[u8], outcome: &mut Outcome) {
    match frame::decode_payload(payload) {
        Ok(decoded) => {
            if let Frame::Delta { delta, .. } = &decoded {
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
            }
            let encoded = frame::encode(&decoded)
                .unwrap_or_else(|error| panic!("a decoded frame does not re-encode: {error}"));
            let (again, _) = split_frame(&encoded)
                .expect("a re-encoded frame is within the limit")
                .expect("a re-encoded frame is whole");
            assert_eq!(
                frame::decode_payload(again).as_ref(),
                Ok(&decoded),
                "a frame does not survive re-encoding"
            );
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
