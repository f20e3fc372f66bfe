//! The core builds without tokio: no crate named `tokio` (or `tokio-*`) is
//! in `meshlog-sync-core`'s normal dependency tree, so an embedder with its
//! own transport does not compile it. The rule is a Cargo fact, checked
//! here with `cargo tree` (the `CARGO` variable names the cargo that runs
//! the test), not a comment.
//!
//! Fails if a dependency of the core, direct or not, pulls tokio in.

#[test]
fn the_core_has_no_tokio_in_its_dependency_tree() {
    let tokio =
        meshlog_testkit::deps::tokio_in_tree("meshlog-sync-core", env!("CARGO_MANIFEST_DIR"));
    assert!(
        tokio.is_empty(),
        "the sync core must not depend on tokio: {tokio:?}"
    );
}

/// The check sees tokio where it is: the tokio drivers' crate has it.
#[test]
fn the_check_finds_tokio_in_the_drivers_tree() {
    let tokio = meshlog_testkit::deps::tokio_in_tree("meshlog-sync", env!("CARGO_MANIFEST_DIR"));
    assert!(
        tokio.iter().any(|line| line.starts_with("tokio ")),
        "{tokio:?}"
    );
}
