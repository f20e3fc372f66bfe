//! `meshlog-faults`: runs seeded fault schedules against five real nodes in
//! network namespaces and checks each history (`docs/FAULTS.md`).
//!
//! ```text
//! meshlog-faults [--seed N] [--schedules N] [--steps N] [--meshlog PATH]
//!                [--out DIR] [--plant drop-event|skip-cursor|stolen-key]
//!                [--hostile-node] [--dry-run]
//! meshlog-faults --check HISTORY.jsonl
//! ```
//!
//! Exit status: 0 when every history passes, 1 when one fails, 2 on bad
//! arguments or when the harness itself cannot run (not root, no binary),
//! 130 when interrupted.

use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use meshlog_faults::check::{check, Verdict};
use meshlog_faults::history::read_history;
use meshlog_faults::net::{cleanup_leftovers, ensure_tools};
use meshlog_faults::run::{run_schedule, Outcome, Plant, INTERRUPTED};
use meshlog_faults::schedule::Schedule;

struct Args {
    seed: Option<u64>,
    schedules: usize,
    steps: usize,
    meshlog: Option<PathBuf>,
    out: PathBuf,
    plant: Option<Plant>,
    hostile: bool,
    check: Option<PathBuf>,
    dry_run: bool,
}

const USAGE: &str = "usage: meshlog-faults [--seed N] [--schedules N] [--steps N] [--meshlog PATH] [--out DIR] [--plant drop-event|skip-cursor|stolen-key] [--hostile-node] [--dry-run]\n       meshlog-faults --check HISTORY.jsonl";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seed: None,
        schedules: 3,
        steps: 6,
        meshlog: None,
        out: PathBuf::from("target/meshlog-faults"),
        plant: None,
        hostile: false,
        check: None,
        dry_run: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || given.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seed" => {
                args.seed =
                    Some(meshlog_testkit::seed::parse(&value()?).map_err(|e| e.to_string())?)
            }
            "--schedules" => {
                args.schedules = value()?.parse().map_err(|e| format!("--schedules: {e}"))?
            }
            "--steps" => args.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--meshlog" => args.meshlog = Some(value()?.into()),
            "--out" => args.out = value()?.into(),
            "--plant" => args.plant = Some(value()?.parse()?),
            "--check" => args.check = Some(value()?.into()),
            "--dry-run" => args.dry_run = true,
            "--hostile-node" => args.hostile = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn print_verdict(verdict: &Verdict) {
    for violation in verdict.violations.iter().take(20) {
        println!("  VIOLATION {violation}");
    }
    if verdict.violations.len() > 20 {
        println!("  ... and {} more", verdict.violations.len() - 20);
    }
}

/// The hostile node's forgeries, per kind: sent on a session, and refused
/// (an event), cut (an unsealed first run) or acknowledged and ignored (a
/// floor).
fn print_forgeries(verdict: &Verdict) {
    if verdict.forgeries.is_empty() {
        return;
    }
    let kinds: Vec<String> = verdict
        .forgeries
        .iter()
        .map(|(forgery, (sent, shown))| {
            format!("{forgery:?} {sent} sent/{shown} {}", forgery.answer_word())
        })
        .collect();
    println!("  hostile node: {}", kinds.join(", "));
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &args.check {
        let records = match std::fs::File::open(path)
            .map_err(|e| e.to_string())
            .and_then(|file| read_history(BufReader::new(file)))
        {
            Ok(records) => records,
            Err(error) => {
                eprintln!("{}: {error}", path.display());
                return ExitCode::from(2);
            }
        };
        let verdict = check(&records);
        println!(
            "{}: {} acknowledged, {} checked, {} violations",
            path.display(),
            verdict.acknowledged,
            verdict.checked,
            verdict.violations.len()
        );
        print_forgeries(&verdict);
        print_verdict(&verdict);
        return if verdict.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }

    if args.dry_run {
        // The schedules only: what a run with these arguments would do.
        let base = args.seed.unwrap_or_else(meshlog_testkit::seed::fresh);
        for index in 0..args.schedules {
            let schedule = Schedule::draw(base.wrapping_add(index as u64), args.steps);
            println!("seed {}: links {}", schedule.seed, schedule.link);
            for step in &schedule.steps {
                println!("  {} for {} ms", step.fault, step.hold_ms);
            }
        }
        return ExitCode::SUCCESS;
    }

    // SAFETY: geteuid has no preconditions; the handler only stores to an
    // atomic, which is async-signal-safe.
    unsafe {
        if libc::geteuid() != 0 {
            eprintln!("meshlog-faults: must run as root (it creates network namespaces)");
            return ExitCode::from(2);
        }
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let binary = match args.meshlog.clone().or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join("meshlog")))
    }) {
        Some(binary) if binary.is_file() => binary,
        other => {
            eprintln!(
                "meshlog-faults: no meshlog binary at {:?}; build it (cargo build -p meshlog-node) or pass --meshlog",
                other
            );
            return ExitCode::from(2);
        }
    };
    if let Err(error) = ensure_tools() {
        eprintln!("meshlog-faults: {error}");
        return ExitCode::from(2);
    }
    for leftover in cleanup_leftovers() {
        println!("removed leftover {leftover}");
    }

    let base = args.seed.unwrap_or_else(meshlog_testkit::seed::fresh);
    println!(
        "meshlog-faults: seed {base}, {} schedule(s) of {} steps, binary {}",
        args.schedules,
        args.steps,
        binary.display()
    );
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut failed = false;
    for index in 0..args.schedules {
        if INTERRUPTED.load(Ordering::SeqCst) {
            break;
        }
        let seed = base.wrapping_add(index as u64);
        let schedule = Schedule::draw(seed, args.steps);
        println!(
            "schedule {}/{}: seed {seed} (replay: --seed {seed} --schedules 1 --steps {}); links: {}",
            index + 1,
            args.schedules,
            args.steps,
            schedule.link
        );
        for step in &schedule.steps {
            println!(
                "  {} for {} ms, then {} ms healed",
                step.fault, step.hold_ms, step.rest_ms
            );
        }
        match run_schedule(&schedule, &binary, &args.out, args.plant, args.hostile) {
            Ok(outcome) => {
                let verdict = &outcome.verdict;
                let ms = |v: Option<u64>| v.map_or("never".to_owned(), |v| format!("{v} ms"));
                println!(
                    "  {}: {} events acknowledged ({} appends unanswered), {} in the final log, {} checks, {} pages ({} stale), {} faults",
                    if verdict.passed() { "PASS" } else { "FAIL" },
                    verdict.acknowledged,
                    verdict.unknown_appends,
                    verdict.final_events,
                    verdict.checked,
                    verdict.pages,
                    verdict.stale_pages,
                    verdict.faults
                );
                println!(
                    "  converged {} after the final heal{}, {} after clearing links; {:.0} events/s acknowledged under faults; {:.1} s of faults, {:.1} s in all",
                    ms(outcome.converge_impaired_ms),
                    if outcome.impaired_at_heal { " (links still impaired)" } else { "" },
                    ms(outcome.converge_clear_ms),
                    outcome.acked_per_s,
                    outcome.faults_s,
                    outcome.total_s
                );
                let (heals, p50, max, missed) = heal_stats(&[&outcome]);
                println!(
                    "  {heals} heals under load: caught up p50 {p50} max {max}{}",
                    if missed > 0 {
                        format!(", {missed} not within 10 s")
                    } else {
                        String::new()
                    }
                );
                print_forgeries(verdict);
                println!("  history: {}", outcome.history.display());
                print_verdict(verdict);
                failed |= !verdict.passed();
                outcomes.push(outcome);
            }
            Err(error) => {
                println!("  ERROR: {error}");
                failed = true;
            }
        }
    }
    summarize(&outcomes);
    if INTERRUPTED.load(Ordering::SeqCst) {
        eprintln!("meshlog-faults: interrupted; everything it created is removed");
        return ExitCode::from(130);
    }
    if failed {
        println!("meshlog-faults: FAIL (seed {base})");
        ExitCode::FAILURE
    } else {
        println!("meshlog-faults: PASS (seed {base})");
        ExitCode::SUCCESS
    }
}

/// Over every step heal of these runs: how many, p50 and max of the
/// caught-up times, and how many did not catch up within the bound.
fn heal_stats(outcomes: &[&Outcome]) -> (usize, String, String, usize) {
    let all: Vec<Option<u64>> = outcomes
        .iter()
        .flat_map(|o| o.caught_up.iter().copied())
        .collect();
    let mut within: Vec<u64> = all.iter().flatten().copied().collect();
    within.sort_unstable();
    let show = |v: Option<&u64>| v.map_or("-".to_owned(), |v| format!("{v} ms"));
    (
        all.len(),
        show(within.get(within.len().saturating_sub(1) / 2)),
        show(within.last()),
        all.len() - within.len(),
    )
}

fn summarize(outcomes: &[Outcome]) {
    if outcomes.is_empty() {
        return;
    }
    let mut converge: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| o.converge_impaired_ms)
        .collect();
    converge.sort_unstable();
    let acked: usize = outcomes.iter().map(|o| o.verdict.acknowledged).sum();
    let checked: usize = outcomes.iter().map(|o| o.verdict.checked).sum();
    let violations: usize = outcomes.iter().map(|o| o.verdict.violations.len()).sum();
    let rate: f64 = outcomes.iter().map(|o| o.acked_per_s).sum::<f64>() / outcomes.len() as f64;
    let p50 = converge.get(converge.len().saturating_sub(1) / 2);
    let refs: Vec<&Outcome> = outcomes.iter().collect();
    let (heals, heal_p50, heal_max, missed) = heal_stats(&refs);
    println!(
        "summary: {heals} step heals under load: caught up p50 {heal_p50} max {heal_max}, {missed} not within 10 s"
    );
    println!(
        "summary: {} schedule(s), {acked} events acknowledged, {checked} checks, {violations} violations; converge after the final heal p50 {} max {}; {rate:.0} events/s acknowledged (mean)",
        outcomes.len(),
        p50.map_or("-".into(), |v| format!("{v} ms")),
        converge.last().map_or("-".into(), |v| format!("{v} ms")),
    );
}
