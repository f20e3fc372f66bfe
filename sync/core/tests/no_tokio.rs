//! The core builds without tokio: no crate named `tokio` (or `tokio-*`) is
//! in `meshlog-sync-core`'s normal dependency tree, so an embedder with its
//! own transport does not compile it. The rule is a Cargo fact, checked
//! here with `cargo tree` (the `CARGO` variable names the cargo that runs
//! the test), not a comment.
//!
//! Fails if a dependency of the core, direct or not, pulls tokio in.

use std::process::Command;

#[test]
fn the_core_has_no_tokio_in_its_dependency_tree() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            "meshlog-sync-core",
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
        tree.lines()
            .any(|line| line.starts_with("meshlog-sync-core ")),
        "the tree names the core first:\n{tree}"
    );
    let tokio: Vec<&str> = tree
        .lines()
        .filter(|line| line == &"tokio" || line.starts_with("tokio ") || line.starts_with("tokio-"))
        .collect();
    assert!(
        tokio.is_empty(),
        "the sync core must not depend on tokio: {tokio:?}\n{tree}"
    );
}
