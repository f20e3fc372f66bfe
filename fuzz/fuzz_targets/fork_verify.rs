//! Fuzz target `fork_verify`: any bytes as a fork proof, decoded and
//! verified as a receiver does with one a peer passes on (sync's forks
//! section, tag 3); and a proof the target signs, then changes once.
//!
//! The checks and the input format are in `src/fork_check.rs`, shared with
//! the stable replay test `replica/tests/fork_fuzz_regressions.rs`: no
//! panic, a decoded proof re-encodes to its bytes, an honest proof
//! verifies, a changed one never does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshlog_fuzz::fork_check;

fuzz_target!(|data: &[u8]| {
    fork_check::check_input(data);
});
