//! `meshlog demo`, the README's main command, run as the built binary: it
//! exits 0 and prints the lines that carry its claims (the partition, the
//! late events received once on another node, the scalar cursor missing
//! them, the stale token's exact loss). The demo checks those claims itself
//! and exits 1 if one fails; this test holds it to that.

mod cli_support;

use cli_support::cli;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_exits_0_and_shows_the_late_events_received_once_on_another_node() {
    let run = cli(&["demo"], "").await;
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let out = &run.stdout;
    for line in [
        "✓ A, B and C each hold the 9 events, with the same digest",
        "✓ C runs no sync session: it is partitioned",
        "are stamped at or below the reader's position",
        "The reader resumes on B, a different node, with its last token.",
        "c-late-1   (from C)",
        "c-late-2   (from C)",
        "✓ the resumed walk returns exactly C's 2 late events, each once",
        "✓ the whole walk, A then B, returned 19 events, 19 distinct, of the mesh's 19",
        "none of C's late events",
        "410 stale_cursor:",
        "lost: stream ",
        "nothing skipped silently",
        "All 10 checks passed.",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    assert!(!out.contains("FAILED"), "{out}");
    // Each step says how to reproduce it.
    assert!(out.matches("$ curl -s").count() >= 8, "{out}");
    // The nodes' info logs stay out of the narration.
    assert!(!run.stderr.contains(" INFO "), "{}", run.stderr);
}
