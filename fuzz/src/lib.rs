//! Checks shared by meshlog's fuzz targets and by the replay of their
//! regressions under stable `cargo test` (`cursor/tests/fuzz_regressions.rs`
//! includes `decode_check.rs` by path, so both run the very same code).

pub mod alloc;
pub mod decode_check;
pub mod fork_check;
pub mod relative_check;
pub mod seal_check;
