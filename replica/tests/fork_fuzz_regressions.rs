//! Replays the `fork_verify` fuzz target's regressions on stable `cargo test`.
//!
//! Every file under `fuzz/regressions/fork_verify/` goes through the very
//! checks the fuzz target runs (`fuzz/src/fork_check.rs`, compiled in here
//! by path): no panic, a decoded proof re-encodes to its bytes, an honest
//! proof verifies, a changed one never does. The directory must hold
//! inputs, and the raw seeds must reach every outcome (not a proof, a proof
//! that verifies, one that does not), so this test cannot pass by testing
//! nothing. A seeded sweep of signed inputs runs the same checks.

use meshlog_testkit::{seed, SplitMix64};

mod common;

#[path = "../../fuzz/src/fork_check.rs"]
mod fork_check;

use fork_check::Outcome;

fn regression_inputs() -> Vec<(String, Vec<u8>)> {
    common::fuzz_regressions("fork_verify", 4)
}

#[test]
fn every_fork_verify_regression_replays_with_its_outcome() {
    let mut outcomes = Vec::new();
    for (name, bytes) in regression_inputs() {
        eprintln!("replaying {name}");
        let outcome = fork_check::check_input(&bytes);
        if name.starts_with("raw-valid") {
            assert_eq!(outcome, Outcome::Decoded { verifies: true }, "{name}");
        } else if name.starts_with("raw-refused") {
            assert_eq!(outcome, Outcome::Decoded { verifies: false }, "{name}");
        } else if name.starts_with("raw-") {
            assert_eq!(outcome, Outcome::NotDecoded, "{name}");
        } else {
            assert_eq!(outcome, Outcome::Signed, "{name}");
        }
        outcomes.push(outcome);
    }
    for due in [
        Outcome::NotDecoded,
        Outcome::Decoded { verifies: true },
        Outcome::Decoded { verifies: false },
        Outcome::Signed,
    ] {
        assert!(outcomes.contains(&due), "no input reaches {due:?}");
    }
}

/// Seeded: random signed inputs (histories, the change) and random raw
/// bytes go through the target's checks.
#[test]
fn random_signed_and_raw_inputs_pass_the_targets_checks() {
    seed::for_each_seed("fork_verify_inputs", 0xF0_5E, 8, |seed| {
        let mut rng = SplitMix64::new(seed);
        for _ in 0..64 {
            let len = rng.below(600) as usize;
            let mut input: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if let Some(mode) = input.first_mut() {
                *mode |= 1;
            }
            fork_check::check_input(&input);
            input[0] = 0;
            fork_check::check_input(&input);
        }
    });
}
