//! Fuzz target `token_decode`: any bytes into the token decoders.
//!
//! The checks and the input format (first byte: raw or wrapped with a valid
//! version and CRC-32) are in `src/decode_check.rs`, shared with the stable
//! replay test `cursor/tests/fuzz_regressions.rs`.
//!
//! Beyond those, this target measures memory: invariant 6 says decoding is
//! bounded in memory, so the peak of live heap bytes while the checks run is
//! held to a small multiple of the input's length (`ALLOC_PER_BYTE`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshlog_fuzz::alloc::{peak_during, Counting};
use meshlog_fuzz::decode_check;

/// Live heap bytes at most per input byte, plus `ALLOC_SLACK`. A stream takes
/// at least 2 token bytes, one 16-byte entry while decoding and one B-tree
/// slot after (the map is built at once); the text path also holds the token and its
/// base64 form. 64 leaves room for that; a decoder that reserved by a count
/// it had not yet checked against the input would blow far past it.
const ALLOC_PER_BYTE: usize = 64;
const ALLOC_SLACK: usize = 16 * 1024;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    let peak = peak_during(|| decode_check::check_input(data));
    let bound = ALLOC_PER_BYTE * data.len() + ALLOC_SLACK;
    assert!(
        peak <= bound,
        "decoding {} input bytes held {peak} heap bytes at peak; the bound is {bound}",
        data.len()
    );
});
