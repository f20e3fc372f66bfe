//! Cargo facts about a crate's dependencies, checked from its tests: the
//! sync core and the simulator must not depend on tokio.

use std::process::Command;

/// The crates named `tokio` or `tokio-*` in `package`'s normal dependency
/// tree, as `cargo tree` prints it (the `CARGO` variable names the cargo
/// that runs the test); `manifest_dir` is the caller's
/// `env!("CARGO_MANIFEST_DIR")`. Panics, with what cargo said, when
/// `cargo tree` fails or does not name `package` first.
pub fn tokio_in_tree(package: &str, manifest_dir: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            package,
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(manifest_dir)
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
            .any(|line| line.starts_with(&format!("{package} "))),
        "the tree names {package} first:\n{tree}"
    );
    tree.lines()
        .filter(|line| *line == "tokio" || line.starts_with("tokio ") || line.starts_with("tokio-"))
        .map(str::to_owned)
        .collect()
}
