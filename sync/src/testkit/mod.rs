//! Fault injection for tests of any crate of the workspace (feature
//! `testkit`).
//!
//! - [`FaultLink`] (in memory) and [`FaultProxy`] (TCP on 127.0.0.1) sit
//!   between two endpoints and act on whole frames: they drop, delay,
//!   duplicate and reorder them, and cut, cut one way, sever or heal the link
//!   on command through a [`LinkControl`]. Every decision is drawn from a
//!   seed, per connection and direction, so the k-th frame of a connection
//!   meets the same fate whenever the seed is replayed.
//! - [`tampering_link`]: an in-memory link whose deltas one way a test
//!   rewrites (decoded, changed, re-encoded): a hostile relay in the middle
//!   of a real session, for signed streams (`docs/SIGNING.md`).
//! - [`SimMesh`]: replicas joined by in-memory fault links whose sessions
//!   reconnect after every failure, with convergence checks. Under tokio's
//!   paused clock on a current-thread runtime a run is deterministic.
//! - [`seeds`] and [`for_each_seed`]: run a randomized test over many seeds,
//!   print the one that fails, and replay it from the `MESHLOG_SEED`
//!   environment variable (re-exported from `meshlog_testkit::seed`, which
//!   defines the one seed format: printed in decimal, read in decimal or
//!   `0x` hexadecimal).
//! - [`SplitMix64`]: the seeded generator every fault decision is drawn
//!   from, for tests that draw their own schedules (re-exported from
//!   `meshlog_testkit`, so every crate's tests share one type).
//! - [`run_paused`] and [`wait_for`]: a current-thread runtime whose clock
//!   starts paused, and a bounded wait for a condition, so tests need not
//!   each build their own.
//! - [`hand_in`]: one received payload handed to a protocol core, its
//!   delta applied at once, for tests that drive two cores by hand.
//! - [`frame_check`]: the checks of the `frame_decode` fuzz target, shared
//!   with its replay under `cargo test`; [`delta_check`], the same for the
//!   `delta_apply` target (a decoded delta applied to a replica).
//!
//! To use it from another crate's tests (the feature turns on tokio's
//! `test-util`, which is what allows a paused clock):
//!
//! ```toml
//! [dev-dependencies]
//! meshlog-sync = { workspace = true, features = ["testkit"] }
//! ```
//!
//! With `MESHLOG_SEED` set, every test that draws its seeds from [`seeds`]
//! runs that one seed: name the failing test on the command line.

pub mod delta_check;
pub mod frame_check;
mod mesh;
mod proxy;
mod relay;

pub use mesh::{Divergence, MeshConfig, SimMesh};
pub use relay::tampering_link;

/// Hands `core` one received payload (a frame without its length prefix)
/// and, if it carries a delta, applies it to `replica` at once and reports
/// the outcome, as [`crate::sync_once`] does: the step of a test that drives
/// two protocol cores by hand.
///
/// # Errors
///
/// What [`crate::proto::Protocol::handle_payload`] or
/// [`crate::proto::Protocol::handle_applied`] answers.
pub fn hand_in<S>(
    now: std::time::Instant,
    core: &mut crate::proto::Protocol,
    payload: &[u8],
    replica: &crate::SharedReplica<S>,
) -> Result<(), crate::SessionError>
where
    S: meshlog_replica::Store + Send + Sync + 'static,
{
    Ok(crate::proto::hand_in(now, core, payload, replica)?)
}
pub use meshlog_testkit::seed::{for_each_seed, seeds, SEED_ENV};
pub use meshlog_testkit::SplitMix64;
pub use proxy::{Direction, FaultLink, FaultProxy, Faults, LinkControl, LinkStats};

use std::future::Future;
use std::time::Duration;

/// Runs `test` to completion on a new current-thread runtime whose clock
/// starts paused: time stands still while any task can run and jumps to the
/// next timer when none can, so a run replays exactly and its timeouts take
/// no real time.
///
/// Time does not jump while a `spawn_blocking` task runs (tokio holds it
/// back), so a test whose timers must fire during blocking work needs a
/// runtime on the real clock instead.
///
/// ```
/// use std::time::Duration;
/// use meshlog_sync::testkit::run_paused;
///
/// let slept = run_paused(async {
///     let start = tokio::time::Instant::now();
///     tokio::time::sleep(Duration::from_secs(3600)).await;
///     start.elapsed()
/// });
/// assert_eq!(slept, Duration::from_secs(3600));
/// ```
///
/// # Panics
///
/// If the runtime cannot be built (out of threads or descriptors).
pub fn run_paused<F: Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
        .block_on(test)
}

/// Waits until `done` holds, checking it every millisecond of tokio time
/// (paused or real).
///
/// # Panics
///
/// If `done` still does not hold after `within`, naming `what`: a test that
/// waits for something that never happens fails instead of hanging.
pub async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() <= within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
