//! Fuzz target `delta_apply`: any bytes, as a frame payload, into the sync
//! frame decoder and, when they decode to a delta, into a replica with some
//! history: the whole path a stranger's delta takes.
//!
//! The checks are in `meshlog_sync::testkit::delta_check`, shared with the
//! stable replay test `sync/tests/delta_apply.rs`: no panic, the receiver's
//! own events never removed nor replaced, marks never falling, a refused
//! delta changing nothing, the state verifying after every apply, and a
//! delta accepted whole leaving the state its events applied one by one
//! leave. Seeds: `fuzz/regressions/delta_apply/` (valid deltas near the
//! receiver's heads).
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshlog_sync::testkit::delta_check;

fuzz_target!(|data: &[u8]| {
    delta_check::check_input(data);
});
