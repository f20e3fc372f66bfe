//! Fuzz target `token_roundtrip`: any vector survives encode then decode, in
//! bytes and in text, and its token has exactly the documented size.
//!
//! The vector is built from an arbitrary `Vec<(stream, seq)>` and checked
//! against a `BTreeMap` model first (repeats keep the maximum, zero seqs are
//! dropped), so a wrong `FromIterator` cannot hide behind a symmetric codec.
#![no_main]

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use meshlog_cursor::token::{self, TOKEN_BYTES_MAX, TOKEN_TEXT_MAX};
use meshlog_cursor::{StreamId, TokenError, VersionVector, STREAMS_MAX};

fn varint_len(value: u64) -> usize {
    // 7 bits a byte; 0 takes one byte.
    (64 - value.leading_zeros() as usize).div_ceil(7).max(1)
}

fuzz_target!(|entries: Vec<(u64, u64)>| {
    let vector: VersionVector = entries
        .iter()
        .map(|&(stream, seq)| (StreamId::new(stream), seq))
        .collect();

    let mut model = BTreeMap::new();
    for &(stream, seq) in &entries {
        if seq > 0 {
            let entry = model.entry(stream).or_insert(seq);
            *entry = (*entry).max(seq);
        }
    }
    let got: Vec<(u64, u64)> = vector.iter().map(|(s, q)| (s.get(), q)).collect();
    let want: Vec<(u64, u64)> = model.into_iter().collect();
    assert_eq!(got, want, "the vector differs from the BTreeMap model");

    let bytes = match token::encode(&vector) {
        Ok(bytes) => bytes,
        Err(TokenError::TooManyStreams { streams, .. }) => {
            assert!(vector.len() > STREAMS_MAX && streams == vector.len() as u64);
            return;
        }
        Err(other) => panic!("encode failed on {vector:?}: {other}"),
    };

    // The exact size: version, count, gap-coded entries, checksum.
    let mut size = 1 + varint_len(vector.len() as u64) + 4;
    let mut next = 0u64;
    for (stream, seq) in vector.iter() {
        size += varint_len(stream.get() - next) + varint_len(seq);
        next = stream.get().wrapping_add(1);
    }
    assert_eq!(bytes.len(), size, "token size for {vector:?}");
    assert!(bytes.len() <= TOKEN_BYTES_MAX);
    assert_eq!(
        token::decode(&bytes).as_ref(),
        Ok(&vector),
        "bytes {bytes:02x?}"
    );

    let text = token::encode_text(&vector).expect("encode succeeded on bytes");
    assert_eq!(text, URL_SAFE_NO_PAD.encode(&bytes));
    assert!(text.len() <= TOKEN_TEXT_MAX);
    assert_eq!(
        token::decode_text(&text).as_ref(),
        Ok(&vector),
        "text {text}"
    );
});
