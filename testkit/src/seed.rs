//! Seeds: the one format of the workspace, the seeds a test runs, and the
//! guard that prints how to replay a failing one.
//!
//! # The format
//!
//! A seed is a `u64`. It is **printed in decimal**, always, so one failing
//! line can be copied into `MESHLOG_SEED=<seed>` whatever crate printed it.
//! On input, `MESHLOG_SEED` accepts decimal or `0x`-prefixed hexadecimal
//! (`0X` too; surrounding whitespace and `_` between digits are ignored), so
//! that hexadecimal seed constants in test sources can be pasted as well.
//!
//! A `MESHLOG_SEED` that is set but cannot be read is a loud failure, never
//! a fallback: a replay that silently ran some other seed would pass and
//! prove nothing.
//!
//! # Which seeds a test runs
//!
//! With `MESHLOG_SEED` set, every seeded test runs that one seed (name the
//! failing test on the command line). Without it:
//!
//! - [`fresh`]: one new seed per run, from the clock, so repeated runs cover
//!   new ground (print it: [`Report`] and [`with_seed`] do on failure);
//! - [`replay_or`]: a fixed seed the test names, for tests whose cost or
//!   coverage was tuned on it;
//! - [`seeds`]: `count` fixed seeds derived from a base, for CI that must
//!   replay exactly; [`for_each_seed`] runs a check on each.

use std::fmt;

use crate::rng::SplitMix64;

/// The environment variable that replays one seed.
pub const SEED_ENV: &str = "MESHLOG_SEED";

/// Why a seed's text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a seed: expected a u64 in decimal, or hexadecimal after 0x")]
pub struct SeedError {
    /// The text as given.
    pub text: String,
}

/// Reads a seed: decimal, or hexadecimal after `0x` (or `0X`). Whitespace
/// around it and `_` between digits are ignored.
///
/// ```
/// use meshlog_testkit::seed::parse;
///
/// assert_eq!(parse("42"), Ok(42));
/// assert_eq!(parse(" 0x2a\n"), Ok(42));
/// assert_eq!(parse("0x5eed_0001"), Ok(0x5eed_0001));
/// assert!(parse("forty-two").is_err());
/// assert!(parse("-1").is_err());
/// ```
pub fn parse(text: &str) -> Result<u64, SeedError> {
    let error = || SeedError {
        text: text.to_owned(),
    };
    let trimmed = text.trim();
    let (digits, radix) = match trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
    {
        Some(hex) => (hex, 16),
        None => (trimmed, 10),
    };
    // `_` only between digits: "_1", "1_" and "0x_" are typos, not seeds.
    if digits.is_empty() || digits.starts_with('_') || digits.ends_with('_') {
        return Err(error());
    }
    let digits: String = digits.chars().filter(|&c| c != '_').collect();
    // `from_str_radix` accepts a leading `+`; a seed has no sign.
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(error());
    }
    u64::from_str_radix(&digits, radix).map_err(|_| error())
}

/// The seed in `MESHLOG_SEED`, if it is set.
///
/// # Panics
///
/// If `MESHLOG_SEED` is set but is not a seed (see [`parse`]) or not
/// unicode: a replay must not silently run another seed.
pub fn replayed() -> Option<u64> {
    match std::env::var(SEED_ENV) {
        Ok(text) => match parse(&text) {
            Ok(seed) => Some(seed),
            Err(error) => panic!("{SEED_ENV}: {error}"),
        },
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(text)) => {
            panic!("{SEED_ENV}={text:?} is not a seed: not unicode")
        }
    }
}

/// The seed for a randomized test that draws a new one each run:
/// `MESHLOG_SEED` if set, else one derived from the clock.
///
/// # Panics
///
/// If `MESHLOG_SEED` is set but is not a seed.
pub fn fresh() -> u64 {
    replayed().unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        // Mixed, so that two runs a few nanoseconds apart get seeds that
        // differ in every bit, not only the low ones.
        SplitMix64::new(nanos as u64 ^ (nanos >> 64) as u64).next_u64()
    })
}

/// The seed for a randomized test that runs a fixed seed by default:
/// `MESHLOG_SEED` if set, else `default`.
///
/// # Panics
///
/// If `MESHLOG_SEED` is set but is not a seed.
pub fn replay_or(default: u64) -> u64 {
    replayed().unwrap_or(default)
}

/// The seeds a randomized test runs: the one in `MESHLOG_SEED` if it is
/// set, else `count` seeds derived from `base` (the same ones every run).
///
/// # Panics
///
/// If `MESHLOG_SEED` is set but is not a seed.
pub fn seeds(base: u64, count: usize) -> Vec<u64> {
    if let Some(seed) = replayed() {
        return vec![seed];
    }
    (0..count as u64)
        .map(|i| SplitMix64::derive(base, i))
        .collect()
}

/// Runs `check` for each of [`seeds`]`(base, count)`; if one panics,
/// prints the seed and the command that replays it (see [`Report`]), and
/// the panic goes on to fail the test.
pub fn for_each_seed(name: &str, base: u64, count: usize, mut check: impl FnMut(u64)) {
    for seed in seeds(base, count) {
        let _report = Report::new(name, seed);
        check(seed);
    }
}

/// Runs `test` with `seed`, printing the replay line if it panics (see
/// [`Report`]).
pub fn with_seed<R>(name: &str, seed: u64, test: impl FnOnce(u64) -> R) -> R {
    let _report = Report::new(name, seed);
    test(seed)
}

/// A guard that prints, if dropped while its thread panics, the seed and
/// the command that replays it:
///
/// ```text
/// disk_matches_the_model: failed with seed 1234; replay with MESHLOG_SEED=1234 cargo test -p meshlog-replica --test disk disk_matches_the_model
/// ```
///
/// The harness shows a failing test's output, so the line reaches the
/// reader; the panic itself goes on unchanged.
#[derive(Debug)]
pub struct Report {
    name: String,
    seed: u64,
}

impl Report {
    /// Reports `seed` for the check called `name` if dropped while
    /// panicking.
    pub fn new(name: &str, seed: u64) -> Self {
        Report {
            name: name.to_owned(),
            seed,
        }
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", ReplayLine::here(&self.name, self.seed));
        }
    }
}

/// The line a failing seeded check prints.
struct ReplayLine<'a> {
    name: &'a str,
    seed: u64,
    /// `cargo test` arguments that select the failing test, as far as they
    /// can be told from inside it.
    selector: String,
}

impl<'a> ReplayLine<'a> {
    /// The line for check `name` failing with `seed` on this thread, in
    /// this test binary.
    fn here(name: &'a str, seed: u64) -> Self {
        // Best effort. Cargo sets the package name when it runs a test; an
        // integration test's binary is named after its file plus a hash, a
        // unit test's after the crate; libtest names each test's thread
        // after the test (unless tests run on the main thread).
        let mut selector = String::new();
        if let Ok(package) = std::env::var("CARGO_PKG_NAME") {
            selector.push_str(&format!(" -p {package}"));
            let target = std::env::current_exe().ok().and_then(|exe| {
                let stem = exe.file_stem()?.to_string_lossy().into_owned();
                Some(
                    stem.rsplit_once('-')
                        .map_or(stem.clone(), |(file, _)| file.to_owned()),
                )
            });
            match target {
                Some(target) if target == package.replace('-', "_") => selector.push_str(" --lib"),
                Some(target) => selector.push_str(&format!(" --test {target}")),
                None => {}
            }
        }
        let thread = std::thread::current();
        let test = match thread.name() {
            Some(test) if test != "main" => test,
            _ => name,
        };
        selector.push(' ');
        selector.push_str(test);
        ReplayLine {
            name,
            seed,
            selector,
        }
    }
}

impl fmt::Display for ReplayLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: failed with seed {seed}; replay with {SEED_ENV}={seed} cargo test{}",
            self.name,
            self.selector,
            seed = self.seed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_hexadecimal_seeds_parse() {
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse("0xffffffffffffffff"), Ok(u64::MAX));
        assert_eq!(parse("0XFF"), Ok(255));
        assert_eq!(parse("0xdead_beef"), Ok(0xdead_beef));
        assert_eq!(parse("1_000"), Ok(1_000));
        assert_eq!(parse("  77 \n"), Ok(77));
        // Decimal digits that look like hexadecimal are decimal.
        assert_eq!(parse("10"), Ok(10));
    }

    #[test]
    fn what_is_not_a_seed_is_an_error_naming_the_text() {
        for text in [
            "",
            "  ",
            "0x",
            "x10",
            "ff",
            "-1",
            "+1",
            "0x+1",
            "1.5",
            "_1",
            "1_",
            "0x_1",
            "18446744073709551616",
            "0x1_0000_0000_0000_0000",
            "seed 5",
        ] {
            let error = parse(text).expect_err(text);
            assert_eq!(error.text, text);
            assert!(error.to_string().contains("is not a seed"), "{error}");
        }
    }

    #[test]
    fn derived_seeds_are_the_same_every_run_and_distinct() {
        // `MESHLOG_SEED` may be set for some other test of this run: only
        // check the derivation when it is not.
        if replayed().is_some() {
            return;
        }
        let seeds = seeds(0xa, 8);
        assert_eq!(seeds, super::seeds(0xa, 8));
        assert_eq!(seeds.len(), 8);
        let mut distinct = seeds.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 8);
        assert_eq!(seeds[0], SplitMix64::derive(0xa, 0));
        assert_eq!(replay_or(5), 5);
    }

    #[test]
    fn the_replay_line_prints_the_seed_in_decimal() {
        let line = ReplayLine::here("a_check", 0x2a).to_string();
        assert!(
            line.starts_with(
                "a_check: failed with seed 42; replay with MESHLOG_SEED=42 cargo test"
            ),
            "{line}"
        );
        // Run by cargo, the line names the package and this unit test.
        assert!(line.contains(" -p meshlog-testkit --lib "), "{line}");
        // libtest names the test's thread after it, unless the test runs on
        // the main thread; then the check's own name stands in.
        assert!(
            line.ends_with(" seed::tests::the_replay_line_prints_the_seed_in_decimal")
                || line.ends_with(" a_check"),
            "{line}"
        );
    }

    #[test]
    fn a_failing_seed_is_reported_and_the_panic_goes_on() {
        if replayed().is_some() {
            return;
        }
        let mut ran = Vec::new();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for_each_seed("fails_on_the_third", 1, 5, |seed| {
                ran.push(seed);
                assert!(ran.len() < 3, "third seed");
            })
        }));
        assert!(outcome.is_err(), "the panic reaches the caller");
        assert_eq!(ran, seeds(1, 5)[..3], "no seed runs after the failing one");
    }
}
