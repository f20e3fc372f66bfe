//! The simulator builds without tokio: no crate named `tokio` (or
//! `tokio-*`) is in `meshlog-sim`'s normal dependency tree, so it runs
//! single-threaded on its own clock and a run replays from its seed. A
//! Cargo fact, checked with `cargo tree` as `sync/core/tests/no_tokio.rs`
//! checks the core's.
//!
//! Fails if a dependency of the simulator, direct or not, pulls tokio in.

#[test]
fn the_simulator_has_no_tokio_in_its_dependency_tree() {
    let tokio = meshlog_testkit::deps::tokio_in_tree("meshlog-sim", env!("CARGO_MANIFEST_DIR"));
    assert!(
        tokio.is_empty(),
        "the simulator must not depend on tokio: {tokio:?}"
    );
}
