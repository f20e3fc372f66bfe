//! Fuzz target `seal_verify`: any bytes as a writer's key, a run of events
//! chained from a base and a seal over its end, verified as a receiver
//! verifies them; and as each signed statement.
//!
//! The checks and the input format (first byte: raw, or a run the target
//! seals with a fixed key and then changes once) are in
//! `src/seal_check.rs`, shared with the stable replay test
//! `replica/tests/seal_fuzz_regressions.rs`: no panic, an honest run
//! verifies, a changed one never does, batch and single verification agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshlog_fuzz::seal_check;

fuzz_target!(|data: &[u8]| {
    seal_check::check_input(data);
});
