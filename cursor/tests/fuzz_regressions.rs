//! Replays the `token_decode` and `token_v2` fuzz targets' regressions on
//! stable `cargo test`.
//!
//! Every file under `fuzz/regressions/token_decode/` and
//! `fuzz/regressions/token_v2/` (crashers minimized with `cargo fuzz tmin`,
//! and hand-made tricky inputs) goes through the very checks its fuzz target
//! runs: `fuzz/src/decode_check.rs` and `fuzz/src/relative_check.rs` are
//! compiled in here by path. Each directory must exist and hold at least one
//! input, so this test cannot pass by testing nothing.

use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

use meshlog_cursor::token::{self, Token};
use meshlog_cursor::{CanonicalRule, StreamId, TokenError, VersionVector, STREAMS_MAX};

#[path = "../../fuzz/src/decode_check.rs"]
mod decode_check;
#[path = "../../fuzz/src/relative_check.rs"]
mod relative_check;

fn regressions_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/regressions")
        .join(target)
}

/// Every regression input of `token_decode`, sorted by name, with its bytes.
fn regression_inputs() -> Vec<(String, Vec<u8>)> {
    inputs_of("token_decode")
}

/// Every regression input of `target`, sorted by name, with its bytes.
fn inputs_of(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = regressions_dir(target);
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    let mut inputs: Vec<(String, Vec<u8>)> = entries
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.is_file())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (name, bytes)
        })
        .collect();
    inputs.sort();
    assert!(
        !inputs.is_empty(),
        "{} holds no input: the replay would test nothing",
        dir.display()
    );
    inputs
}

fn input(name: &str) -> Vec<u8> {
    regression_inputs()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("regression input {name} is missing"))
        .1
}

#[test]
fn every_token_decode_regression_replays_clean() {
    replay_clean("token_decode", decode_check::check_input);
}

#[test]
fn every_token_v2_regression_replays_clean() {
    replay_clean("token_v2", relative_check::check_input);
}

fn replay_clean(target: &str, check_input: fn(&[u8])) {
    let inputs = inputs_of(target);
    let mut failures = Vec::new();
    for (name, bytes) in &inputs {
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| check_input(bytes)));
        if let Err(cause) = outcome {
            let message = cause
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| cause.downcast_ref::<&str>().copied())
                .unwrap_or("(non-string panic)");
            failures.push(format!("{name} ({bytes:02x?}): {message}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} regression inputs failed:\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}

// The hand-made inputs (see fuzz/regressions/README.md) also pin the exact
// outcome, so that a change of behaviour on them is seen, not just a panic.

#[test]
fn a_count_of_streams_max_in_ten_bytes_is_refused_before_any_entry() {
    let bytes = input("count-16383-streams-in-10-bytes");
    let token = &bytes[1..];
    assert_eq!(token.len(), 10);
    assert_eq!(&token[1..3], &[0xff, 0x7f], "the count is {STREAMS_MAX}");
    assert_eq!(
        token::decode(token),
        Err(TokenError::Truncated {
            len: 6,
            field: "entries"
        })
    );
}

#[test]
fn an_overlong_varint_with_a_valid_checksum_is_not_canonical() {
    let bytes = input("overlong-varint-valid-crc");
    assert_eq!(
        token::decode(&bytes[1..]),
        Err(TokenError::NonCanonical {
            offset: 2,
            rule: CanonicalRule::Varint
        })
    );
}

#[test]
fn a_stream_id_past_u64_max_is_refused() {
    let bytes = input("stream-id-overflow-wrapped");
    assert!(matches!(
        token::decode(&decode_check::wrap(&bytes[1..])),
        Err(TokenError::NonCanonical {
            rule: CanonicalRule::StreamOverflow,
            ..
        })
    ));
}

#[test]
fn the_largest_stream_and_seq_decode() {
    let bytes = input("max-stream-and-seq-valid-wrapped");
    let want: VersionVector = [(StreamId::new(0), 2), (StreamId::new(u64::MAX), u64::MAX)]
        .into_iter()
        .collect();
    assert_eq!(token::decode(&decode_check::wrap(&bytes[1..])), Ok(want));
}

#[test]
fn padded_text_is_refused() {
    let bytes = input("start-text-with-padding");
    let text = std::str::from_utf8(&bytes[1..]).unwrap();
    assert_eq!(text, format!("{}=", token::START_TEXT));
    assert!(matches!(
        token::decode_text(text),
        Err(TokenError::Base64 { offset: 8, .. })
    ));
}

// The token_v2 inputs (hand-made, see fuzz/regressions/README.md) pin
// their outcomes too.

/// The token a `token_v2` input describes, and its checkpoint.
fn v2_input(name: &str) -> (Vec<u8>, meshlog_cursor::Checkpoint) {
    let bytes = inputs_of("token_v2")
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("regression input {name} is missing"))
        .1;
    let (checkpoint, rest) = relative_check::checkpoint_of(&bytes[1..]);
    let token = if bytes[0] & 1 == 1 {
        relative_check::wrap(&checkpoint, rest)
    } else {
        rest.to_vec()
    };
    (token, checkpoint)
}

fn expand(name: &str) -> Result<VersionVector, TokenError> {
    let (token, checkpoint) = v2_input(name);
    match token::decode_any(&token)? {
        Token::Relative(relative) => relative.expand(&checkpoint),
        Token::Absolute(vector) => panic!("{name} decoded as version 1: {vector:?}"),
    }
}

#[test]
fn the_token_v2_regressions_have_their_outcomes() {
    let stream = StreamId::new(1);
    assert!(matches!(
        expand("wrapped-zero-difference"),
        Err(TokenError::NonCanonical {
            rule: CanonicalRule::ZeroDifference { .. },
            ..
        })
    ));
    assert_eq!(
        expand("wrapped-difference-below-the-checkpoint-seq"),
        Err(TokenError::SeqOutOfRange {
            stream,
            checkpoint_seq: 5,
            difference: -6
        })
    );
    assert_eq!(
        expand("wrapped-difference-past-the-largest-seq"),
        Err(TokenError::SeqOutOfRange {
            stream,
            checkpoint_seq: u64::MAX,
            difference: 1
        })
    );
    assert_eq!(
        expand("wrapped-smallest-difference-expands-to-nothing"),
        Ok(VersionVector::new())
    );
    assert!(matches!(
        expand("wrapped-stream-overflow"),
        Err(TokenError::NonCanonical {
            rule: CanonicalRule::StreamOverflow,
            ..
        })
    ));
    assert_eq!(
        expand("wrapped-count-above-the-limit"),
        Err(TokenError::TooManyDifferences {
            differences: 129,
            limit: 128
        })
    );
    let (token, _) = v2_input("raw-version-1-example");
    assert_eq!(
        token::decode_any(&token),
        token::decode(&token).map(Token::Absolute)
    );
    assert_eq!(token::decode(&token).map(|v| v.len()), Ok(3));
}
