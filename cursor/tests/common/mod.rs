//! What the two vector files' replays share (`vectors.rs` for version 1,
//! `vectors_v2.rs` for version 2): the files' notation for vectors, bytes
//! and errors.
#![allow(dead_code)]

use meshlog_cursor::token::TokenError;
use meshlog_cursor::{CanonicalRule, StreamId, VersionVector};

/// A `TokenError` as its variant name and its fields in the vector file's
/// notation.
pub fn describe(error: &TokenError) -> (&'static str, Vec<(&'static str, String)>) {
    match error {
        TokenError::TextTooLarge { len, limit } => (
            "TextTooLarge",
            vec![("len", len.to_string()), ("limit", limit.to_string())],
        ),
        TokenError::Base64 { offset, reason } => (
            "Base64",
            vec![
                ("offset", offset.to_string()),
                ("reason", reason.replace(' ', "-")),
            ],
        ),
        TokenError::TooLarge { len, limit } => (
            "TooLarge",
            vec![("len", len.to_string()), ("limit", limit.to_string())],
        ),
        TokenError::UnknownVersion { version } => {
            ("UnknownVersion", vec![("version", version.to_string())])
        }
        TokenError::Truncated { len, field } => (
            "Truncated",
            vec![("len", len.to_string()), ("field", field.replace(' ', "-"))],
        ),
        TokenError::ChecksumMismatch { stored, computed } => (
            "ChecksumMismatch",
            vec![
                ("stored", format!("{stored:#010x}")),
                ("computed", format!("{computed:#010x}")),
            ],
        ),
        TokenError::TooManyStreams { streams, limit } => (
            "TooManyStreams",
            vec![
                ("streams", streams.to_string()),
                ("limit", limit.to_string()),
            ],
        ),
        TokenError::NonCanonical { offset, rule } => {
            let mut fields = vec![("offset", offset.to_string())];
            match rule {
                CanonicalRule::Varint => fields.push(("rule", "Varint".to_owned())),
                CanonicalRule::ZeroEntry { stream } => {
                    fields.push(("rule", "ZeroEntry".to_owned()));
                    fields.push(("stream", stream.to_string()));
                }
                CanonicalRule::StreamOverflow => fields.push(("rule", "StreamOverflow".to_owned())),
                CanonicalRule::ZeroDifference { stream } => {
                    fields.push(("rule", "ZeroDifference".to_owned()));
                    fields.push(("stream", stream.to_string()));
                }
                other => fields.push(("rule", format!("{other:?}"))),
            }
            ("NonCanonical", fields)
        }
        TokenError::TrailingBytes { offset, count } => (
            "TrailingBytes",
            vec![("offset", offset.to_string()), ("count", count.to_string())],
        ),
        TokenError::TooManyDifferences { differences, limit } => (
            "TooManyDifferences",
            vec![
                ("differences", differences.to_string()),
                ("limit", limit.to_string()),
            ],
        ),
        TokenError::DifferenceOutOfRange {
            stream,
            cursor_seq,
            checkpoint_seq,
        } => (
            "DifferenceOutOfRange",
            vec![
                ("stream", stream.to_string()),
                ("cursor_seq", cursor_seq.to_string()),
                ("checkpoint_seq", checkpoint_seq.to_string()),
            ],
        ),
        TokenError::CheckpointMismatch { token, given } => (
            "CheckpointMismatch",
            vec![("token", token.to_string()), ("given", given.to_string())],
        ),
        TokenError::SeqOutOfRange {
            stream,
            checkpoint_seq,
            difference,
        } => (
            "SeqOutOfRange",
            vec![
                ("stream", stream.to_string()),
                ("checkpoint_seq", checkpoint_seq.to_string()),
                ("difference", difference.to_string()),
            ],
        ),
        // A variant added later: the vectors cannot name it until this test
        // learns it, so it never matches.
        _ => ("(unknown variant)", Vec::new()),
    }
}

/// `-`, or `<hex stream>:<decimal seq>,...` strictly ascending with nonzero
/// seqs, so the file itself holds only canonical vectors.
pub fn parse_vector(text: &str) -> Result<VersionVector, String> {
    if text == "-" {
        return Ok(VersionVector::new());
    }
    let mut entries: Vec<(StreamId, u64)> = Vec::new();
    for entry in text.split(',') {
        let (stream, seq) = entry
            .split_once(':')
            .ok_or(format!("entry {entry:?} is not stream:seq"))?;
        let stream: StreamId = stream.parse().map_err(|e| format!("{e}"))?;
        let seq: u64 = seq.parse().map_err(|e| format!("seq {seq:?}: {e}"))?;
        if seq == 0 {
            return Err(format!("entry {entry:?} has seq 0"));
        }
        if entries.last().is_some_and(|&(last, _)| last >= stream) {
            return Err(format!("entry {entry:?} is not above the one before"));
        }
        entries.push((stream, seq));
    }
    let vector: VersionVector = entries.iter().copied().collect();
    assert_eq!(vector.iter().collect::<Vec<_>>(), entries);
    Ok(vector)
}

pub fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = text.bytes().filter(|&b| b != b'_').collect();
    if !digits.len().is_multiple_of(2) {
        return Err("odd number of hex digits".to_owned());
    }
    digits
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).map_err(|e| e.to_string())?;
            u8::from_str_radix(pair, 16).map_err(|e| format!("hex {pair:?}: {e}"))
        })
        .collect()
}

/// `<unit>*<count>`
pub fn parse_fill(text: &str) -> Result<(&str, usize), String> {
    let (unit, count) = text
        .split_once('*')
        .ok_or(format!("{text:?} is not unit*count"))?;
    let count = count.parse().map_err(|e| format!("count {count:?}: {e}"))?;
    Ok((unit, count))
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn clip(line: &str) -> String {
    match line.char_indices().nth(160) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_owned(),
    }
}

/// Checks `error` against a line's `<Variant> [key=value ...]`; answers the
/// variant seen (with its rule, for `NonCanonical`).
pub fn expect_error<'a>(
    error: &TokenError,
    mut fields: impl Iterator<Item = &'a str>,
) -> Result<String, String> {
    let variant = fields.next().ok_or("no expected error variant")?;
    let (actual_variant, actual_fields) = describe(error);
    if actual_variant != variant {
        return Err(format!("got {error:?}, want {variant}"));
    }
    for field in fields {
        let (key, want) = field
            .split_once('=')
            .ok_or(format!("{field:?} is not key=value"))?;
        match actual_fields.iter().find(|(name, _)| *name == key) {
            Some((_, got)) if got == want => {}
            Some((_, got)) => {
                return Err(format!(
                    "{variant}: {key} is {got}, want {want} ({error:?})"
                ))
            }
            None => return Err(format!("{variant} has no field {key:?}")),
        }
    }
    let rule = actual_fields.iter().find(|(name, _)| *name == "rule");
    Ok(match rule {
        Some((_, rule)) => format!("{variant}/{rule}"),
        None => variant.to_owned(),
    })
}
