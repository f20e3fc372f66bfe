//! Fault injection for tests of any crate of the workspace (feature
//! `testkit`).
//!
//! - [`FaultLink`] (in memory) and [`FaultProxy`] (TCP on 127.0.0.1) sit
//!   between two endpoints and act on whole frames: they drop, delay,
//!   duplicate and reorder them, and cut, cut one way, sever or heal the link
//!   on command through a [`LinkControl`]. Every decision is drawn from a
//!   seed, per connection and direction, so the k-th frame of a connection
//!   meets the same fate whenever the seed is replayed.
//! - [`SimMesh`]: replicas joined by in-memory fault links whose sessions
//!   reconnect after every failure, with convergence checks. Under tokio's
//!   paused clock on a current-thread runtime a run is deterministic.
//! - [`seeds`] and [`for_each_seed`]: run a randomized test over many seeds,
//!   print the one that fails, and replay it from the `MESHLOG_SEED`
//!   environment variable.
//! - [`frame_check`]: the checks of the `frame_decode` fuzz target, shared
//!   with its replay under `cargo test`.
//!
//! To use it from another crate's tests (tokio's `test-util` feature is what
//! allows a paused clock):
//!
//! ```toml
//! [dev-dependencies]
//! meshlog-sync = { workspace = true, features = ["testkit"] }
//! tokio = { workspace = true, features = ["test-util"] }
//! ```
//!
//! With `MESHLOG_SEED` set, every test that draws its seeds from [`seeds`]
//! runs that one seed: name the failing test on the command line.

pub mod frame_check;
mod mesh;
mod proxy;

pub use mesh::{Divergence, MeshConfig, SimMesh};
pub use proxy::{Direction, FaultLink, FaultProxy, Faults, LinkControl, LinkStats};

use std::panic::{self, AssertUnwindSafe};

/// The environment variable that replays one seed.
pub const SEED_ENV: &str = "MESHLOG_SEED";

/// The seeds a randomized test runs: the one in `MESHLOG_SEED` if it is set
/// (decimal, or hexadecimal with `0x`), else `count` seeds derived from
/// `base`.
///
/// # Panics
///
/// If `MESHLOG_SEED` is set but is not a number: a replay must not silently
/// run other seeds.
pub fn seeds(base: u64, count: usize) -> Vec<u64> {
    if let Ok(text) = std::env::var(SEED_ENV) {
        let text = text.trim();
        let parsed = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => text.parse(),
        };
        let seed = parsed.unwrap_or_else(|_| panic!("{SEED_ENV}={text:?} is not a u64"));
        return vec![seed];
    }
    (0..count as u64)
        .map(|i| crate::SplitMix64::derive(base, i))
        .collect()
}

/// Runs `check` for each of [`seeds`]`(base, count)`; if one panics, prints
/// the test's name, the seed and the command that replays it, then
/// re-raises the panic.
pub fn for_each_seed(name: &str, base: u64, count: usize, mut check: impl FnMut(u64)) {
    for seed in seeds(base, count) {
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| check(seed)));
        if let Err(cause) = outcome {
            // Best effort: cargo sets the package name when it runs a test,
            // and a test binary is named after its file plus a hash.
            let package = std::env::var("CARGO_PKG_NAME").unwrap_or_else(|_| "<package>".into());
            let target = std::env::current_exe()
                .ok()
                .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
                .and_then(|stem| stem.rsplit_once('-').map(|(file, _)| file.to_owned()))
                .unwrap_or_else(|| "<file>".into());
            eprintln!(
                "{name} failed with seed {seed:#x}; replay with: \
                 {SEED_ENV}={seed:#x} cargo test -p {package} --test {target} {name}"
            );
            panic::resume_unwind(cause);
        }
    }
}
