//! Fuzz target `token_v2`: bytes into `decode_any`, and what decodes as a
//! version-2 token expanded against a checkpoint the input describes.
//!
//! The input format and the checks are in `src/relative_check.rs`, shared
//! with the stable replay in `cursor/tests/fuzz_regressions.rs`. Memory is
//! measured as in `token_decode`: the peak of live heap bytes while the
//! checks run is held to a small multiple of the input's length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshlog_fuzz::alloc::{peak_during, Counting};
use meshlog_fuzz::relative_check;

/// As `token_decode`'s bound, plus the checkpoint: at most 255 streams,
/// its version-1 token hashed for its name, and its vector cloned once by
/// an expansion.
const ALLOC_PER_BYTE: usize = 64;
const ALLOC_SLACK: usize = 64 * 1024;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    let peak = peak_during(|| relative_check::check_input(data));
    let bound = ALLOC_PER_BYTE * data.len() + ALLOC_SLACK;
    assert!(
        peak <= bound,
        "checking {} input bytes held {peak} heap bytes at peak; the bound is {bound}",
        data.len()
    );
});
