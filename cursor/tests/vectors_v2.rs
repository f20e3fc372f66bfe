//! Replays the committed version-2 vectors in `tests/vectors_v2.txt`
//! (tokens relative to a checkpoint), and checks the size bounds that
//! `docs/TOKEN.md` states for them.
//!
//! The vectors were written by an implementation independent of this
//! crate (see the file's header): a checkpoint's name, each valid token's
//! bytes and text, and the exact error of each invalid token, refused
//! expansion and refused encoding are pinned, so a change to any of them
//! fails here. Every failing line is reported at once, with its number.

use std::collections::BTreeSet;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use meshlog_cursor::token::{self, Token, CHECKPOINT_DIFF_MAX, RELATIVE_BYTES_MAX};
use meshlog_cursor::{Checkpoint, StreamId, TokenError, VersionVector, STREAMS_MAX};
use meshlog_testkit::SplitMix64;

mod common;
use common::{clip, expect_error, parse_fill, parse_hex, parse_vector, to_hex};

const VECTORS: &str = include_str!("vectors_v2.txt");

#[test]
fn every_version_2_vector_replays_exactly() {
    let mut failures = Vec::new();
    let mut kinds = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut lines = 0;
    for (index, line) in VECTORS.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        lines += 1;
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        kinds.insert(kind.to_owned());
        let outcome = match kind {
            "checkpoint" => replay_checkpoint(rest),
            "valid" => replay_valid(rest),
            "invalid" => replay_invalid(rest).map(|v| {
                seen.insert(v);
            }),
            "expand" => replay_expand(rest).map(|v| {
                seen.insert(v);
            }),
            "refuse" => replay_refuse(rest).map(|v| {
                seen.insert(v);
            }),
            other => Err(format!("unknown line kind {other:?}")),
        };
        if let Err(why) = outcome {
            failures.push(format!("line {}: {why}\n    {}", index + 1, clip(line)));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {lines} vectors failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Guards against a file emptied or cut short by accident.
    assert!(lines >= 45, "only {lines} vectors");
    assert_eq!(kinds.len(), 5, "{kinds:?}");
    for variant in [
        "Truncated",
        "ChecksumMismatch",
        "TooManyDifferences",
        "NonCanonical/Varint",
        "NonCanonical/ZeroDifference",
        "NonCanonical/StreamOverflow",
        "TrailingBytes",
        "TooLarge",
        "UnknownVersion",
        "Base64",
        "CheckpointMismatch",
        "SeqOutOfRange",
        "DifferenceOutOfRange",
    ] {
        assert!(seen.contains(variant), "no vector expects {variant}");
    }
}

/// `<vector> <name>`
fn replay_checkpoint(rest: &str) -> Result<(), String> {
    let [vector, name] = fields(rest)?;
    let checkpoint = Checkpoint::new(parse_vector(vector)?).map_err(|e| e.to_string())?;
    if checkpoint.name().to_string() != name {
        return Err(format!("name {}, want {name}", checkpoint.name()));
    }
    Ok(())
}

/// `<checkpoint> <cursor> <text> hex:<bytes>`
fn replay_valid(rest: &str) -> Result<(), String> {
    let [checkpoint, cursor, text, hex] = fields(rest)?;
    let checkpoint = Checkpoint::new(parse_vector(checkpoint)?).map_err(|e| e.to_string())?;
    let cursor = parse_vector(cursor)?;
    let bytes = parse_hex(hex.strip_prefix("hex:").ok_or("no hex: prefix")?)?;
    if URL_SAFE_NO_PAD.encode(&bytes) != text {
        return Err("the text is not the base64 of the hex: the file is wrong".to_owned());
    }
    let encoded = token::encode_relative(&cursor, &checkpoint);
    if encoded.as_ref() != Ok(&bytes) {
        let got = encoded.map(|b| to_hex(&b));
        return Err(format!("encode_relative: {got:?}, want {}", to_hex(&bytes)));
    }
    let encoded = token::encode_relative_text(&cursor, &checkpoint);
    if encoded.as_deref() != Ok(text) {
        return Err(format!("encode_relative_text: {encoded:?}, want {text}"));
    }
    for decoded in [token::decode_any(&bytes), token::decode_any_text(text)] {
        let Ok(Token::Relative(relative)) = decoded else {
            return Err(format!("decode_any: {decoded:?}, want a relative cursor"));
        };
        if relative.checkpoint() != checkpoint.name() {
            return Err(format!("names checkpoint {}", relative.checkpoint()));
        }
        let expanded = relative.expand(&checkpoint);
        if expanded.as_ref() != Ok(&cursor) {
            return Err(format!("expands to {expanded:?}, want {cursor:?}"));
        }
        if Token::Relative(relative).encode().as_ref() != Ok(&bytes) {
            return Err("the decoded token does not re-encode to its bytes".to_owned());
        }
    }
    // The version-1 decoder does not read version 2, and says so.
    match token::decode(&bytes) {
        Err(TokenError::UnknownVersion { version: 2 }) => Ok(()),
        other => Err(format!("decode (version 1): {other:?}")),
    }
}

/// `<input> <Variant> [key=value ...]`
fn replay_invalid(rest: &str) -> Result<String, String> {
    let mut fields = rest.split(' ');
    let input = fields.next().unwrap_or_default();
    let (kind, payload) = input.split_once(':').ok_or("no `kind:` prefix")?;
    let outcome = match kind {
        "hex" => {
            let bytes = parse_hex(payload)?;
            let binary = token::decode_any(&bytes);
            let text = token::decode_any_text(&URL_SAFE_NO_PAD.encode(&bytes));
            if text != binary {
                return Err(format!("decode_any {binary:?}, its text {text:?}"));
            }
            binary
        }
        "fill" => {
            let (byte, count) = parse_fill(payload)?;
            let byte = u8::from_str_radix(byte, 16).map_err(|e| format!("fill byte: {e}"))?;
            token::decode_any(&vec![byte; count])
        }
        "text" => token::decode_any_text(payload),
        other => return Err(format!("unknown input kind {other:?}")),
    };
    match outcome {
        Ok(token) => Err(format!("decoded to {token:?}")),
        Err(error) => expect_error(&error, fields),
    }
}

/// `<checkpoint> hex:<bytes> <Variant> [key=value ...]`
fn replay_expand(rest: &str) -> Result<String, String> {
    let mut fields = rest.split(' ');
    let checkpoint = parse_vector(fields.next().unwrap_or_default())?;
    let checkpoint = Checkpoint::new(checkpoint).map_err(|e| e.to_string())?;
    let hex = fields.next().unwrap_or_default();
    let bytes = parse_hex(hex.strip_prefix("hex:").ok_or("no hex: prefix")?)?;
    let relative = match token::decode_any(&bytes) {
        Ok(Token::Relative(relative)) => relative,
        other => return Err(format!("decode_any: {other:?}, want a relative cursor")),
    };
    match relative.expand(&checkpoint) {
        Ok(vector) => Err(format!("expanded to {vector:?}")),
        Err(error) => expect_error(&error, fields),
    }
}

/// `<checkpoint> <cursor> <Variant> [key=value ...]`
fn replay_refuse(rest: &str) -> Result<String, String> {
    let mut fields = rest.split(' ');
    let checkpoint = parse_vector(fields.next().unwrap_or_default())?;
    let checkpoint = Checkpoint::new(checkpoint).map_err(|e| e.to_string())?;
    let cursor = parse_vector(fields.next().unwrap_or_default())?;
    match token::encode_relative(&cursor, &checkpoint) {
        Ok(bytes) => Err(format!("encoded to {}", to_hex(&bytes))),
        Err(error) => expect_error(&error, fields),
    }
}

fn fields<const N: usize>(rest: &str) -> Result<[&str; N], String> {
    let fields: Vec<&str> = rest.split(' ').collect();
    let found = fields.len();
    fields
        .try_into()
        .map_err(|_| format!("expected {N} fields, found {found}"))
}

/// The size bound of `docs/TOKEN.md`: a token of [`CHECKPOINT_DIFF_MAX`]
/// differences, each of magnitude below 8,192, is at most 1,432 bytes and
/// 1,910 characters of text whatever the stream ids, and this token, with
/// the longest gaps 128 ids allow (a ten-byte first id, then 127 gaps of
/// 2^56), is exactly that long.
#[test]
fn the_worst_small_difference_token_is_1432_bytes_and_under_2_kb_of_text() {
    let ids: Vec<u64> = (0..128u64)
        .map(|i| (1 << 63) + i * ((1 << 56) + 1))
        .collect();
    let checkpoint: VersionVector = ids.iter().map(|&id| (StreamId::new(id), 10_000)).collect();
    let checkpoint = Checkpoint::new(checkpoint).unwrap();
    // Alternately +8191 and -8192: both zig-zag to two bytes.
    let cursor: VersionVector = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (StreamId::new(id), if i % 2 == 0 { 18_191 } else { 1_808 }))
        .collect();
    let bytes = token::encode_relative(&cursor, &checkpoint).unwrap();
    // version, name, count (2), first entry (10 + 2), 127 of (9 + 2), crc.
    assert_eq!(bytes.len(), 1 + 16 + 2 + 12 + 127 * 11 + 4);
    assert_eq!(bytes.len(), 1_432);
    let text = token::encode_relative_text(&cursor, &checkpoint).unwrap();
    assert_eq!(text.len(), 1_910);
    assert!(bytes.len() <= RELATIVE_BYTES_MAX);
}

/// Issue 27's goal, on random ids: a reader at the head differs from the
/// mesh's newest checkpoint on at most 128 streams, each by a few events;
/// its token is under 2 KB of text, against 1,535 bytes of text for the
/// same 128 streams alone as version 1 and 130 KB for a 10,000-stream
/// head. Seeded; the seed is printed on failure.
#[test]
fn a_head_token_over_128_differing_random_64_bit_streams_is_under_2048_chars() {
    for seed in 0..32u64 {
        let mut rng = SplitMix64::new(0x7e57_0027 ^ seed);
        let head: VersionVector = (0..10_000)
            .map(|_| (StreamId::new(rng.next_u64()), 1 + rng.below(1 << 20)))
            .collect();
        let checkpoint = Checkpoint::new(head.clone()).unwrap();
        let mut cursor = head.clone();
        let streams: Vec<StreamId> = head.iter().map(|(s, _)| s).collect();
        let mut moved = BTreeSet::new();
        while moved.len() < CHECKPOINT_DIFF_MAX {
            let stream = streams[rng.below(streams.len() as u64) as usize];
            if moved.insert(stream) {
                cursor.advance(stream, head.get(stream) + 1 + rng.below(8_000));
            }
        }
        let text = token::encode_relative_text(&cursor, &checkpoint).unwrap();
        assert!(text.len() < 2_048, "seed {seed}: {} chars", text.len());
        assert!(token::encode_text(&cursor).unwrap().len() > 100_000);
        match token::decode_any_text(&text) {
            Ok(Token::Relative(relative)) => {
                assert_eq!(relative.expand(&checkpoint), Ok(cursor), "seed {seed}")
            }
            other => panic!("seed {seed}: {other:?}"),
        }
    }
}

/// An expansion that would name more than `STREAMS_MAX` streams is refused
/// by count, as a version-1 token of that many would be.
#[test]
fn an_expansion_past_the_stream_limit_is_refused() {
    let full: VersionVector = (1..=STREAMS_MAX as u64)
        .map(|s| (StreamId::new(s), 1))
        .collect();
    let checkpoint = Checkpoint::new(full.clone()).unwrap();
    let mut over = full;
    over.advance(StreamId::new(u64::MAX), 1);
    assert_eq!(
        token::encode_relative(&over, &checkpoint),
        Err(TokenError::TooManyStreams {
            streams: STREAMS_MAX as u64 + 1,
            limit: STREAMS_MAX,
        })
    );
    // The same token made by hand (one difference, +1 on the last stream).
    let mut body = vec![2];
    body.extend_from_slice(checkpoint.name().as_bytes());
    body.push(1);
    body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    body.push(2);
    body.extend_from_slice(&crc32(&body).to_le_bytes());
    let Ok(Token::Relative(relative)) = token::decode_any(&body) else {
        panic!("the hand-made token decodes");
    };
    assert_eq!(
        relative.expand(&checkpoint),
        Err(TokenError::TooManyStreams {
            streams: STREAMS_MAX as u64 + 1,
            limit: STREAMS_MAX,
        })
    );
}

fn crc32(bytes: &[u8]) -> u32 {
    // CRC-32/IEEE, bit by bit: independent of the crate's crc32fast.
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
