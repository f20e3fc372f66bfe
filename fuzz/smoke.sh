#!/usr/bin/env bash
# A bounded fuzzing smoke run of every meshlog fuzz target.
#
#   fuzz/smoke.sh [SECONDS]        # or FUZZ_SECONDS=SECONDS fuzz/smoke.sh
#
# Each target first replays fuzz/regressions/<target>/ (given to libFuzzer as a
# read-only seed directory), then fuzzes for SECONDS (default 60) with
# -rss_limit_mb=512 -malloc_limit_mb=64. The first crash stops the run: the
# crasher (and, for a crash-*, its `cargo fuzz tmin` minimization) is copied to
# fuzz/regressions/<target>/ and the script exits non-zero. Per target it
# prints one summary line: executions, exec/s, cov, ft, corpus, peak rss.
#
# Environment: FUZZ_SECONDS (run time per target), FUZZ_SANITIZER (address or
# none; default: address if it builds and starts, else none), FUZZ_TARGETS
# (space-separated; default every target).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

seconds="${1:-${FUZZ_SECONDS:-60}}"
case "$seconds" in
'' | *[!0-9]*)
    echo "smoke.sh: run time must be whole seconds, got '$seconds'" >&2
    exit 2
    ;;
esac
targets="${FUZZ_TARGETS:-token_decode token_roundtrip token_v2 frame_decode delta_apply seal_verify fork_verify}"

# cargo-fuzz passes nightly-only flags to rustc (-Zsanitizer=..., and
# -Cpasses=sancov-module with -Z llvm options for coverage instrumentation).
# The machines of this project have only the stable toolchain and cannot fetch
# a nightly one. RUSTC_BOOTSTRAP=1 tells stable rustc and cargo to accept
# unstable flags, as they do when building the compiler itself. Stable's
# rust-std ships the x86_64 Linux sanitizer runtimes, so ASan works this way
# too; if it ever does not, the script falls back to `--sanitizer none`, which
# still catches every panic (overflow checks and debug assertions stay on).
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "smoke.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

# Pick the sanitizer: ASan if the targets build with it and its runtime
# starts (an empty run, -runs=0), else none.
sanitizer="${FUZZ_SANITIZER:-}"
if [ -z "$sanitizer" ]; then
    first="${targets%% *}"
    if cargo fuzz build --sanitizer address >build-asan.log 2>&1 &&
        cargo fuzz run --sanitizer address "$first" -- -runs=0 >>build-asan.log 2>&1; then
        sanitizer=address
    else
        echo "smoke.sh: ASan does not build or start here (see fuzz/build-asan.log); using --sanitizer none" >&2
        sanitizer=none
    fi
fi
rm -f build-asan.log
echo "smoke.sh: sanitizer=$sanitizer, ${seconds}s per target, targets: $targets"
cargo fuzz build --sanitizer "$sanitizer"

mkdir -p logs
status=0
summaries=()
for target in $targets; do
    corpus="corpus/$target"
    regressions="regressions/$target"
    artifacts="artifacts/$target"
    log="logs/$target.log"
    mkdir -p "$corpus" "$regressions" "$artifacts"
    stamp="$(mktemp)"
    echo "smoke.sh: fuzzing $target for ${seconds}s (log: fuzz/$log)"
    set +e
    cargo fuzz run --sanitizer "$sanitizer" "$target" "$corpus" "$regressions" -- \
        -max_total_time="$seconds" -rss_limit_mb=512 -malloc_limit_mb=64 \
        -timeout=10 -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e

    # libFuzzer's last status line, e.g.
    #   #1234567 DONE cov: 310 ft: 1402 corp: 301/9731b lim: 4096 exec/s: 20575 rss: 61Mb
    last="$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -n 1 || true)"
    execs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)"
    [ -n "$execs" ] || execs="$(sed -nE 's/^#([0-9]+).*/\1/p' <<<"$last")"
    rate="$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)"
    [ -n "$rate" ] || rate="$(grep -oE 'exec/s: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)"
    rss="$(grep -oE 'stat::peak_rss_mb: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)"
    [ -n "$rss" ] || rss="$(grep -oE 'rss: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)"
    cov="$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)"
    ft="$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || true)"
    corp="$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]+' <<<"$last" | cut -d' ' -f2 || true)"
    summary="$(printf '%-16s executions=%s exec/s=%s cov=%s ft=%s corpus=%s peak_rss=%sMb' \
        "$target" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "${rss:-?}")"

    if [ "$rc" -ne 0 ]; then
        summary="$summary CRASHED (exit $rc)"
        grep -A 1 -E 'panicked at|^==[0-9]+==ERROR|Test unit written|SUMMARY' "$log" | head -n 20 >&2 || true
        found=0
        while IFS= read -r crasher; do
            found=1
            cp "$crasher" "$regressions/"
            echo "smoke.sh: copied $crasher to fuzz/$regressions/" >&2
            case "$(basename "$crasher")" in
            crash-*)
                if cargo fuzz tmin --sanitizer "$sanitizer" -r 1000 "$target" "$crasher" \
                    >"logs/$target.tmin.log" 2>&1; then
                    :
                fi
                minimized="$(grep -oE "$artifacts/minimized-from-[0-9a-f]+" "logs/$target.tmin.log" | tail -n 1 || true)"
                if [ -n "$minimized" ] && [ -f "$minimized" ]; then
                    cp "$minimized" "$regressions/"
                    echo "smoke.sh: minimized into fuzz/$regressions/$(basename "$minimized")" >&2
                fi
                ;;
            esac
        done < <(find "$artifacts" -maxdepth 1 -type f -newer "$stamp" ! -name 'minimized-from-*')
        [ "$found" -eq 1 ] || echo "smoke.sh: $target failed with no crasher written; see fuzz/$log" >&2
        status=1
    fi
    rm -f "$stamp"
    summaries+=("$summary")
    echo "$summary"
    [ "$status" -eq 0 ] || break
done

echo "smoke.sh: summary (sanitizer=$sanitizer, ${seconds}s per target)"
printf '  %s\n' "${summaries[@]}"
exit "$status"
