//! The simulator builds without tokio: no crate named `tokio` (or
//! `tokio-*`) is in `meshlog-sim`'s normal dependency tree, so it runs
//! single-threaded on its own clock and a run replays from its seed. A
//! Cargo fact, checked with `cargo tree` as `sync/core/tests/no_tokio.rs`
//! checks the core's.
//!
//! Fails if a dependency of the simulator, direct or not, pulls tokio in.

use std::process::Command;

#[test]
fn the_simulator_has_no_tokio_in_its_dependency_tree() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            "meshlog-sim",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        tree.lines().any(|line| line.starts_with("meshlog-sim ")),
        "the tree names the simulator first:\n{tree}"
    );
    let tokio: Vec<&str> = tree
        .lines()
        .filter(|line| line == &"tokio" || line.starts_with("tokio ") || line.starts_with("tokio-"))
        .collect();
    assert!(
        tokio.is_empty(),
        "the simulator must not depend on tokio: {tokio:?}\n{tree}"
    );
}
