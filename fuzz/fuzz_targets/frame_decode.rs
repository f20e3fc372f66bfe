//! Fuzz target `frame_decode`: any bytes into the sync frame decoder.
//!
//! The checks and the input format (first byte: a stream of length-prefixed
//! frames, one raw payload, or a payload after a valid hello header) are in
//! `meshlog_sync::testkit::frame_check`, shared with the stable replay test
//! `sync/tests/frame_decode.rs`: no panic, typed errors, a length prefix above
//! the limit refused before its payload, and every decoded frame
//! re-encoding to itself.
//!
//! Beyond those, this target measures memory: decoding a frame from a
//! stranger must be bounded, so the peak of live heap bytes while the checks
//! run is held to a small multiple of the input's length (`ALLOC_PER_BYTE`)
//! plus what a delta's event count allows (`DELTA_EVENTS_BYTES`, twice: the
//! checks decode a frame again from its re-encoding).
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshlog_fuzz::alloc::{peak_during, Counting};
use meshlog_sync::testkit::frame_check;

/// Live heap bytes at most per input byte, plus `ALLOC_SLACK`: a run header
/// (16 bytes in memory) takes 3 input bytes, a vector entry (16 bytes) 2, a
/// payload is copied once; the checks also re-encode what decoded.
const ALLOC_PER_BYTE: usize = 64;
const ALLOC_SLACK: usize = 16 * 1024;
/// What a delta's events take whatever the frame's size: its columns write
/// a repeated value once, so a few bytes may stand for up to
/// `DELTA_EVENTS_MAX` events of 64 bytes (512 KiB), reserved once the delta
/// is known to be well formed. A decoder that reserved by a count it had
/// not checked (a 7-byte delta can claim 4 billion events) would blow far
/// past the bound.
const DELTA_EVENTS_BYTES: usize = meshlog_sync::DELTA_EVENTS_MAX * 64;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    let peak = peak_during(|| {
        frame_check::check_input(data);
    });
    let bound = ALLOC_PER_BYTE * data.len() + ALLOC_SLACK + 2 * DELTA_EVENTS_BYTES;
    assert!(
        peak <= bound,
        "decoding {} input bytes held {peak} heap bytes at peak; the bound is {bound}",
        data.len()
    );
});
