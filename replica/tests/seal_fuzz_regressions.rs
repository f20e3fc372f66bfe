//! Replays the `seal_verify` fuzz target's regressions on stable `cargo test`.
//!
//! Every file under `fuzz/regressions/seal_verify/` goes through the very
//! checks the fuzz target runs (`fuzz/src/seal_check.rs`, compiled in here
//! by path): no panic, an honest run verifies, a changed one never does,
//! batch and single verification agree. The directory must hold inputs, and
//! the raw-mode seeds must reach both verdicts, so this test cannot pass by
//! testing nothing.

mod common;

#[path = "../../fuzz/src/seal_check.rs"]
mod seal_check;

fn regression_inputs() -> Vec<(String, Vec<u8>)> {
    common::fuzz_regressions("seal_verify", 2)
}

#[test]
fn every_seal_verify_regression_replays_clean() {
    for (name, bytes) in regression_inputs() {
        eprintln!("replaying {name}");
        seal_check::check_input(&bytes);
    }
}

/// The raw seeds reach the accepting branch and the refusing one: the
/// fixed vector's seal over its own chain verifies, over a changed event
/// it does not.
#[test]
fn the_raw_seeds_reach_both_verdicts() {
    let inputs = regression_inputs();
    let verdict = |name: &str| {
        let (_, bytes) = inputs
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("regression input {name} is missing"));
        seal_check::raw_verdict(bytes)
    };
    assert_eq!(
        verdict("raw-the-fixed-vector-seal-and-its-chain"),
        Some(true)
    );
    assert_eq!(
        verdict("raw-the-fixed-vector-seal-over-a-changed-event"),
        Some(false)
    );
    assert_eq!(verdict("raw-a-small-order-key"), None);
}
