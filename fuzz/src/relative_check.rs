//! The checks of the `token_v2` fuzz target, on one fuzzer input: version-2
//! tokens (relative to a checkpoint) into `decode_any`, and what decodes
//! expanded against a checkpoint the input describes.
//!
//! Input format: `mode pairs checkpoint{2 × pairs} rest`.
//!
//! - `pairs` (one byte) and the `2 × pairs` bytes after it describe the
//!   checkpoint: per pair a stream byte (`0 ..= 199` is that id, `200 ..=
//!   255` the top ids `2^64 − 56 ..= 2^64 − 1`) and a seq byte (`0 ..= 250`
//!   that seq, then `2^64 − 1`, `2^64 − 2`, `2^63`, `2^63 − 1`, `2^32`), so
//!   the edges of both come up often. Missing bytes are zero.
//! - even `mode` (**raw**): `rest` is the token as it is; also given to
//!   `decode_any_text` as text.
//! - odd `mode` (**wrapped**): the target writes `02 ++ name(checkpoint) ++
//!   rest ++ crc32`, so the fuzzer gets past the version, the name and the
//!   checksum and explores the differences and their expansion.
//!
//! Checks: `decode_any` agrees with `decode_any_text` of the same bytes;
//! whatever decodes re-encodes to the very input; a version-1 result is
//! what `decode` answers; a version-2 result expands against a checkpoint
//! of another name only to `CheckpointMismatch`, and against its own to a
//! cursor that re-encodes to the input, or to `SeqOutOfRange` or
//! `TooManyStreams`. Nothing may panic.
//!
//! Compiled into the fuzz crate and, by `#[path]`, into the cursor crate's
//! `fuzz_regressions` test: it may use only `meshlog_cursor`, `crc32fast`,
//! `base64` and std.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use meshlog_cursor::token::{self, Token, TOKEN_VERSION_RELATIVE};
use meshlog_cursor::{Checkpoint, StreamId, TokenError, VersionVector};

/// Runs every check on one fuzzer input; panics on a violation.
pub fn check_input(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (checkpoint, rest) = checkpoint_of(rest);
    if mode & 1 == 0 {
        check_bytes(rest, &checkpoint);
        if let Ok(text) = std::str::from_utf8(rest) {
            if let Ok(decoded) = token::decode_any_text(text) {
                let again = decoded.encode().expect("a decoded token encodes");
                assert_eq!(URL_SAFE_NO_PAD.encode(again), text, "non-canonical text");
            }
        }
    } else {
        check_bytes(&wrap(&checkpoint, rest), &checkpoint);
    }
}

/// The checkpoint the input describes, and the bytes after its description.
pub fn checkpoint_of(data: &[u8]) -> (Checkpoint, &[u8]) {
    let pairs = usize::from(data.first().copied().unwrap_or(0));
    let end = (1 + 2 * pairs).min(data.len());
    let described = data.get(1..end).unwrap_or_default();
    let vector: VersionVector = described
        .chunks(2)
        .map(|pair| {
            let stream = pair[0];
            let seq = pair.get(1).copied().unwrap_or(0);
            let stream = match stream {
                0..=199 => u64::from(stream),
                top => u64::MAX - u64::from(255 - top),
            };
            let seq = match seq {
                0..=250 => u64::from(seq),
                251 => u64::MAX,
                252 => u64::MAX - 1,
                253 => 1 << 63,
                254 => (1 << 63) - 1,
                _ => 1 << 32,
            };
            (StreamId::new(stream), seq)
        })
        .collect();
    let checkpoint = Checkpoint::new(vector).expect("at most 255 streams");
    (checkpoint, data.get(end..).unwrap_or_default())
}

/// `02 ++ name ++ body ++ crc32(...)`: a version-2 token naming
/// `checkpoint`, with a valid checksum around any body.
pub fn wrap(checkpoint: &Checkpoint, body: &[u8]) -> Vec<u8> {
    let mut token = vec![TOKEN_VERSION_RELATIVE];
    token.extend_from_slice(checkpoint.name().as_bytes());
    token.extend_from_slice(body);
    let crc = crc32fast::hash(&token);
    token.extend_from_slice(&crc.to_le_bytes());
    token
}

/// `decode_any` on bytes, and expansion of what decodes.
pub fn check_bytes(bytes: &[u8], checkpoint: &Checkpoint) {
    let decoded = token::decode_any(bytes);
    let text = token::decode_any_text(&URL_SAFE_NO_PAD.encode(bytes));
    match (&decoded, &text) {
        (Err(TokenError::TooLarge { .. }), Err(TokenError::TextTooLarge { .. })) => {}
        _ => assert_eq!(decoded, text, "decode_any and its text path disagree"),
    }
    let Ok(decoded) = decoded else {
        return;
    };
    let again = decoded.encode().expect("a decoded token encodes");
    assert_eq!(again, bytes, "decode_any accepted a non-canonical token");
    let relative = match decoded {
        Token::Absolute(vector) => {
            assert_eq!(token::decode(bytes), Ok(vector), "version 1 read otherwise");
            return;
        }
        Token::Relative(relative) => relative,
    };
    if relative.checkpoint() != checkpoint.name() {
        assert!(
            matches!(
                relative.expand(checkpoint),
                Err(TokenError::CheckpointMismatch { .. })
            ),
            "expanded against a checkpoint of another name"
        );
        return;
    }
    match relative.expand(checkpoint) {
        Ok(cursor) => {
            let again = token::encode_relative(&cursor, checkpoint)
                .expect("an expanded cursor encodes against its checkpoint");
            assert_eq!(again, bytes, "expansion is not the token's cursor");
        }
        Err(TokenError::SeqOutOfRange { .. } | TokenError::TooManyStreams { .. }) => {}
        Err(other) => panic!("expansion failed untyped: {other:?}"),
    }
}
