//! The checks of the `token_decode` fuzz target, on one fuzzer input.
//!
//! Input format: the first byte picks the mode, the rest is the payload.
//!
//! - even first byte (**raw**): the payload is a binary token as it is. It
//!   goes to `decode`, and to `decode_text` as text (as it is when it is valid
//!   UTF-8, else lossily converted).
//! - odd first byte (**wrapped**): the target prepends the version byte 1 and
//!   appends the payload's valid CRC-32, so that the fuzzer gets past the
//!   header and the checksum and explores the entries (automerge's fuzz
//!   targets wrap their input with a valid checksum the same way).
//!
//! In both modes the binary token also goes to `decode_text` as base64, which
//! must agree with `decode` on it exactly. Whatever decodes must re-encode to
//! the very input (canonical round trip). Nothing may panic.
//!
//! This file is compiled into the fuzz crate and, by `#[path]`, into the
//! cursor crate's `fuzz_regressions` test: it may use only `meshlog_cursor`,
//! `crc32fast`, `base64` and std.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use meshlog_cursor::token::{self, TOKEN_BYTES_MAX, TOKEN_TEXT_MAX};
use meshlog_cursor::TokenError;

/// The version byte the wrapped mode prepends.
pub const WRAP_VERSION: u8 = 1;

/// Runs every check on one fuzzer input; panics on a violation.
pub fn check_input(data: &[u8]) {
    let Some((&mode, payload)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        check_bytes(payload);
        match std::str::from_utf8(payload) {
            Ok(text) => check_text(text),
            Err(_) => check_text(&String::from_utf8_lossy(payload)),
        }
    } else {
        check_bytes(&wrap(payload));
    }
}

/// `[1] ++ body ++ crc32([1] ++ body)`: a token with a valid header and
/// checksum around any body.
pub fn wrap(body: &[u8]) -> Vec<u8> {
    let mut token = Vec::with_capacity(body.len() + 5);
    token.push(WRAP_VERSION);
    token.extend_from_slice(body);
    let crc = crc32fast::hash(&token);
    token.extend_from_slice(&crc.to_le_bytes());
    token
}

/// `decode` on bytes: an error, or a vector that encodes back to the same
/// bytes; and the text form of the same bytes decodes to the same result.
pub fn check_bytes(bytes: &[u8]) {
    let decoded = token::decode(bytes);
    if let Ok(vector) = &decoded {
        assert!(
            bytes.len() <= TOKEN_BYTES_MAX,
            "decoded a token past TOKEN_BYTES_MAX"
        );
        let again = token::encode(vector).expect("a decoded vector must encode");
        assert_eq!(
            again, bytes,
            "decode accepted a non-canonical token: {vector:?}"
        );
    }
    let text = URL_SAFE_NO_PAD.encode(bytes);
    let decoded_text = token::decode_text(&text);
    match (&decoded, &decoded_text) {
        // The size limits are checked before anything else, in each unit.
        (Err(TokenError::TooLarge { .. }), Err(TokenError::TextTooLarge { .. })) => {}
        _ => assert_eq!(
            decoded, decoded_text,
            "decode and decode_text disagree on the same token"
        ),
    }
}

/// `decode_text` on text: an error, or a vector whose text form is the same
/// text.
pub fn check_text(text: &str) {
    if let Ok(vector) = token::decode_text(text) {
        assert!(
            text.len() <= TOKEN_TEXT_MAX,
            "decoded a text past TOKEN_TEXT_MAX"
        );
        let again = token::encode_text(&vector).expect("a decoded vector must encode");
        assert_eq!(
            again, text,
            "decode_text accepted a non-canonical text: {vector:?}"
        );
    }
}
