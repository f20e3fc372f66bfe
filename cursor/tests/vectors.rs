//! Replays the committed token vectors in `tests/vectors.txt`, and checks the
//! limits and the size table that `docs/TOKEN.md` states.
//!
//! The vectors were written by an implementation independent of this crate's
//! encoder (see the file's header for the line format), so a change to any
//! byte the codec writes or any error it answers fails here: a valid line must
//! decode to its vector and encode back to exactly its bytes and text, and an
//! invalid line must fail with exactly its `TokenError` variant and fields.
//! Every failing line is reported at once, with its line number.

use std::collections::BTreeSet;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use meshlog_cursor::token::{self, TokenError};
use meshlog_cursor::{StreamId, VersionVector, STREAMS_MAX};
use meshlog_testkit::SplitMix64;

mod common;
use common::{clip, describe, parse_fill, parse_hex, parse_vector, to_hex};

const VECTORS: &str = include_str!("vectors.txt");

#[test]
fn every_vector_replays_exactly() {
    let mut failures = Vec::new();
    let mut valid = 0;
    let mut invalid = 0;
    let mut variants_seen = BTreeSet::new();
    for (index, line) in VECTORS.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let outcome = match line.split_once(' ') {
            Some(("valid", rest)) => {
                valid += 1;
                replay_valid(rest)
            }
            Some(("invalid", rest)) => {
                invalid += 1;
                replay_invalid(rest, &mut variants_seen)
            }
            _ => Err("a line starts with neither `valid ` nor `invalid `".to_owned()),
        };
        if let Err(why) = outcome {
            failures.push(format!("line {}: {why}\n    {}", index + 1, clip(line)));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} vectors failed:\n{}",
        failures.len(),
        valid + invalid,
        failures.join("\n")
    );
    // Guards against a file emptied or cut short by accident.
    assert!(valid >= 14, "only {valid} valid vectors");
    assert!(invalid >= 50, "only {invalid} invalid vectors");
    // Every way a token can be refused has at least one vector.
    let every_variant = [
        "TextTooLarge",
        "Base64",
        "TooLarge",
        "UnknownVersion",
        "Truncated",
        "ChecksumMismatch",
        "TooManyStreams",
        "NonCanonical/Varint",
        "NonCanonical/ZeroEntry",
        "NonCanonical/StreamOverflow",
        "TrailingBytes",
    ];
    for variant in every_variant {
        assert!(
            variants_seen.contains(variant),
            "no vector expects {variant}"
        );
    }
}

/// `<vector> <text> hex:<bytes>`
fn replay_valid(rest: &str) -> Result<(), String> {
    let fields: Vec<&str> = rest.split(' ').collect();
    let [vector, text, hex] = fields[..] else {
        return Err(format!("expected 3 fields, found {}", fields.len()));
    };
    let vector = parse_vector(vector)?;
    let Some(hex) = hex.strip_prefix("hex:") else {
        return Err("the third field does not start with `hex:`".to_owned());
    };
    let bytes = parse_hex(hex)?;
    // The file must agree with itself: the text is the base64 of the bytes.
    if URL_SAFE_NO_PAD.encode(&bytes) != text {
        return Err("the text is not the base64 of the hex: the file is wrong".to_owned());
    }
    let check = |what: &str, ok: bool, detail: String| {
        if ok {
            Ok(())
        } else {
            Err(format!("{what}: {detail}"))
        }
    };
    let decoded = token::decode(&bytes);
    check(
        "decode(bytes)",
        decoded.as_ref() == Ok(&vector),
        format!("{decoded:?}, want Ok({vector:?})"),
    )?;
    let decoded = token::decode_text(text);
    check(
        "decode_text(text)",
        decoded.as_ref() == Ok(&vector),
        format!("{decoded:?}, want Ok({vector:?})"),
    )?;
    let encoded = token::encode(&vector);
    check(
        "encode(vector)",
        encoded.as_ref() == Ok(&bytes),
        format!("{:?}, want {}", encoded.map(|b| to_hex(&b)), to_hex(&bytes)),
    )?;
    let encoded = token::encode_text(&vector);
    check(
        "encode_text(vector)",
        encoded.as_deref() == Ok(text),
        format!("{encoded:?}, want {text}"),
    )?;
    if vector.is_empty() {
        check(
            "START_TEXT",
            token::START_TEXT == text,
            format!(
                "{} is not the empty vector's token {text}",
                token::START_TEXT
            ),
        )?;
    }
    Ok(())
}

/// `<input> <Variant> [key=value ...]`
fn replay_invalid(rest: &str, variants_seen: &mut BTreeSet<String>) -> Result<(), String> {
    let mut fields = rest.split(' ');
    let input = fields.next().unwrap_or_default();
    let Some(variant) = fields.next() else {
        return Err("no expected error variant".to_owned());
    };
    let expected_fields: Vec<(&str, &str)> = fields
        .map(|field| {
            field
                .split_once('=')
                .ok_or(format!("{field:?} is not key=value"))
        })
        .collect::<Result<_, _>>()?;

    let (kind, payload) = input
        .split_once(':')
        .ok_or("the input has no `kind:` prefix")?;
    let outcome = match kind {
        "hex" => {
            let bytes = parse_hex(payload)?;
            let binary = token::decode(&bytes);
            // The text path must refuse the same bytes the same way.
            let text = token::decode_text(&URL_SAFE_NO_PAD.encode(&bytes));
            if text != binary {
                return Err(format!(
                    "decode gives {binary:?} but decode_text of its base64 gives {text:?}"
                ));
            }
            binary
        }
        "fill" => {
            let (byte, count) = parse_fill(payload)?;
            let byte = u8::from_str_radix(byte, 16).map_err(|e| format!("fill byte: {e}"))?;
            token::decode(&vec![byte; count])
        }
        "text" => token::decode_text(payload),
        "textfill" => {
            let (char, count) = parse_fill(payload)?;
            token::decode_text(&char.repeat(count))
        }
        other => return Err(format!("unknown input kind {other:?}")),
    };
    let error = match outcome {
        Ok(vector) => return Err(format!("decoded to {vector:?}, want {variant}")),
        Err(error) => error,
    };
    let (actual_variant, actual_fields) = describe(&error);
    if actual_variant != variant {
        return Err(format!("got {error:?}, want {variant}"));
    }
    for (key, want) in expected_fields {
        match actual_fields.iter().find(|(name, _)| *name == key) {
            Some((_, got)) if got == want => {}
            Some((_, got)) => {
                return Err(format!(
                    "{variant}: {key} is {got}, want {want} ({error:?})"
                ));
            }
            None => return Err(format!("{variant} has no field {key:?}")),
        }
    }
    let rule = actual_fields.iter().find(|(name, _)| *name == "rule");
    variants_seen.insert(match rule {
        Some((_, rule)) => format!("{variant}/{rule}"),
        None => variant.to_owned(),
    });
    Ok(())
}

/// The stream limit is exact in both directions: `STREAMS_MAX` streams encode
/// and decode (the largest count whose varint takes two bytes), one more is
/// refused by the encoder, naming the count.
#[test]
fn the_stream_limit_is_exact() {
    let at_limit: VersionVector = (0..STREAMS_MAX as u64)
        .map(|id| (StreamId::new(id), 1))
        .collect();
    let bytes = token::encode(&at_limit).unwrap();
    // version, count ff 7f, 16,383 entries of (gap 0, seq 1), crc32.
    assert_eq!(bytes.len(), 1 + 2 + 2 * STREAMS_MAX + 4);
    assert_eq!(&bytes[..5], &[0x01, 0xff, 0x7f, 0x00, 0x01]);
    assert_eq!(token::decode(&bytes), Ok(at_limit.clone()));
    let text = token::encode_text(&at_limit).unwrap();
    assert_eq!(token::decode_text(&text), Ok(at_limit.clone()));

    let mut over = at_limit;
    over.advance(StreamId::new(u64::MAX), 1);
    assert_eq!(
        token::encode(&over),
        Err(TokenError::TooManyStreams {
            streams: STREAMS_MAX as u64 + 1,
            limit: STREAMS_MAX,
        })
    );
    assert_eq!(
        token::encode_text(&over),
        Err(TokenError::TooManyStreams {
            streams: STREAMS_MAX as u64 + 1,
            limit: STREAMS_MAX,
        })
    );
}

/// The limits in `docs/TOKEN.md` are the constants, and the largest token a
/// vector can really produce is within them.
#[test]
fn the_documented_limits_hold() {
    assert_eq!(token::TOKEN_VERSION, 1);
    assert_eq!(STREAMS_MAX, 16_383);
    assert_eq!(token::TOKEN_BYTES_MAX, 327_667);
    assert_eq!(token::TOKEN_TEXT_MAX, 436_890);
    assert_eq!(
        token::TOKEN_TEXT_MAX,
        URL_SAFE_NO_PAD
            .encode(vec![0; token::TOKEN_BYTES_MAX])
            .len()
    );
    // A large real token: STREAMS_MAX streams spread over the whole id space
    // (every gap about 2^50, eight bytes) at the largest seq (ten bytes).
    let spread: VersionVector = (0..STREAMS_MAX as u64)
        .map(|i| (StreamId::new(i << 50), u64::MAX))
        .collect();
    let bytes = token::encode(&spread).unwrap();
    // version, count (2), first entry (gap 0: 1, seq: 10), 16,382 entries
    // of (gap 2^50 - 1: 8, seq: 10), crc32.
    assert_eq!(bytes.len(), 1 + 2 + 11 + 16_382 * 18 + 4);
    assert_eq!(bytes.len(), 294_894);
    assert!(bytes.len() <= token::TOKEN_BYTES_MAX);
    assert_eq!(token::decode(&bytes), Ok(spread));
}

/// The vectors of the size table: `n` streams with seqs 900 ..= 1099 (two
/// varint bytes each), ids dense `1..=n`, random 64-bit, or random 32-bit.
fn size_table_vector(n: usize, ids: &str) -> VersionVector {
    // SplitMix64, so the size table is reproducible from the seed named in
    // `docs/TOKEN.md`.
    let mut rng = SplitMix64::new(0x006d_6573_686c_6f67); // "meshlog"
    let mut vector = VersionVector::new();
    let mut i = 0u64;
    while vector.len() < n {
        let id = match ids {
            "dense" => i + 1,
            "random64" => rng.next_u64(),
            "random32" => rng.next_u64() >> 32,
            _ => unreachable!(),
        };
        vector.advance(StreamId::new(id), 900 + i % 200);
        i += 1;
    }
    vector
}

/// The size table in `docs/TOKEN.md`, recomputed: binary bytes and text
/// characters for 1 to 10,000 streams. If the codec's size changes, this
/// fails and the table must be measured again.
#[test]
fn the_size_table_in_token_md_holds() {
    #[rustfmt::skip]
    let table: [(usize, [(usize, usize); 3]); 5] = [
        // streams   dense 1..=n        random 64-bit        random 32-bit
        (1,      [(9, 12),          (17, 23),            (13, 18)]),
        (10,     [(36, 48),         (115, 154),          (70, 94)]),
        (100,    [(306, 408),       (1_073, 1_431),      (598, 798)]),
        (1_000,  [(3_007, 4_010),   (9_998, 13_331),     (5_623, 7_498)]),
        (10_000, [(30_007, 40_010), (97_344, 129_792),   (49_715, 66_287)]),
    ];
    let mut measured = Vec::new();
    for (n, _) in table {
        let mut row = [(0, 0); 3];
        for (column, ids) in ["dense", "random64", "random32"].into_iter().enumerate() {
            let vector = size_table_vector(n, ids);
            assert_eq!(vector.len(), n);
            let bytes = token::encode(&vector).unwrap().len();
            let chars = token::encode_text(&vector).unwrap().len();
            row[column] = (bytes, chars);
        }
        measured.push((n, row));
    }
    assert_eq!(
        measured, table,
        "measured (left) differs from the documented table (right)"
    );
}
