//! `mesh-bench`: the simulator's figures at scale (issue 27,
//! `docs/BENCHMARKS.md`, "A simulated mesh").
//!
//! ```text
//! cargo run --release -p meshlog-sim --bin mesh-bench -- [--replicas N] [--writers W]
//!     [--events-per-writer E] [--seed S] [--faults] [--write-secs T] [--quiet-secs Q]
//!     [--retire-fraction F]
//! ```
//!
//! Builds a mesh of N replicas on a random connected topology (links from
//! a spanning tree plus N/2 more), W writers homed round-robin, default
//! sessions (1 s heartbeat) over links of 10 to 50 ms one way; writers
//! append E events each over T simulated seconds; then writes stop and the
//! run measures the time to converge, bytes, duplicates, a quiet window's
//! heartbeat bytes, memory per replica (a counting allocator: what is live
//! once the writers' own replicas are dropped, divided by N) and token
//! sizes: version 1, and the token a replica answers with the checkpoints
//! it minted and its sessions gossiped (version 2 where shorter). Each goal of issue 27 is printed met or not. With
//! `--retire-fraction F` (churn), that fraction of the writers stops after
//! the first half of the write window and every replica compacts their
//! streams whole; the bytes per link per minute before and after are
//! printed.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use meshlog_sim::{Figures, MeshConfig, NetConfig, Scenario};
use meshlog_sync_core::SessionConfig;
use meshlog_testkit::alloc::{self, CountingAlloc};

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

struct Args {
    replicas: usize,
    writers: usize,
    events_per_writer: u64,
    seed: u64,
    faults: bool,
    write_secs: u64,
    quiet_secs: u64,
    retire_fraction: f64,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        replicas: 100,
        writers: 1000,
        events_per_writer: 5,
        seed: 27,
        faults: false,
        write_secs: 5,
        quiet_secs: 60,
        retire_fraction: 0.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--replicas" => args.replicas = number(&value()?)?,
            "--writers" => args.writers = number(&value()?)?,
            "--events-per-writer" => args.events_per_writer = number(&value()?)?,
            "--seed" => {
                args.seed = meshlog_testkit::seed::parse(&value()?).map_err(|e| e.to_string())?
            }
            "--write-secs" => args.write_secs = number(&value()?)?,
            "--quiet-secs" => args.quiet_secs = number(&value()?)?,
            "--retire-fraction" => args.retire_fraction = number(&value()?)?,
            "--faults" => args.faults = true,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.replicas < 2 || args.writers == 0 || args.quiet_secs == 0 {
        return Err("at least 2 replicas, 1 writer and a quiet second".to_owned());
    }
    if !(0.0..1.0).contains(&args.retire_fraction) {
        return Err("--retire-fraction is at least 0 and below 1".to_owned());
    }
    Ok(args)
}

fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a number"))
}

/// When the run started, for the progress lines.
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// A progress line on stderr: simulated time, steps, wall time, heap.
fn progress(mesh: &meshlog_sim::Mesh, phase: &str) {
    let wall = STARTED.get_or_init(Instant::now).elapsed();
    eprintln!(
        "  [{phase}] simulated {:.1} s, {} steps, {} of {} links connected, wall {:.0} s, heap {:.2} GiB",
        mesh.now().as_secs_f64(),
        mesh.steps(),
        mesh.connected(),
        mesh.links().len(),
        wall.as_secs_f64(),
        alloc::live_bytes() as f64 / (1u64 << 30) as f64
    );
}

/// The scenario the arguments ask for.
fn scenario(args: &Args) -> Scenario {
    let ms = Duration::from_millis;
    let net = if args.faults {
        NetConfig {
            latency_min: ms(10),
            latency_max: ms(50),
            loss: 0.01,
            duplicate: 0.01,
            reorder: 0.05,
            reorder_window: ms(50),
        }
    } else {
        NetConfig::clean(ms(10), ms(50))
    };
    Scenario {
        mesh: MeshConfig {
            seed: args.seed,
            replicas: args.replicas,
            late_joiners: usize::from(args.faults),
            writers: args.writers,
            extra_links: args.replicas / 2,
            net,
            session: SessionConfig::default(),
            payload_bytes: 16,
        },
        write_for: Duration::from_secs(args.write_secs),
        events_per_writer: args.events_per_writer,
        faults: args.faults,
        retire_fraction: args.retire_fraction,
        readers: 2,
        step: ms(500),
        converge_within: Duration::from_secs(600),
        converge_poll: ms(5),
        quiet_for: Duration::from_secs(args.quiet_secs),
        progress: Some(progress),
    }
}

/// Prints the figures and each goal of issue 27, met or not.
fn report(
    args: &Args,
    mesh: &meshlog_sim::Mesh,
    figures: &Figures,
    wall: Duration,
    peak: i64,
    per_replica: f64,
) {
    let f = figures;
    let c = &f.counters;
    let delivered = c.events_applied.max(1);
    println!(
        "mesh-bench: {} replicas, {} writers, {} links (diameter {}), seed {}, faults {}",
        f.replicas, f.writers, f.links, f.diameter, f.seed, args.faults
    );
    println!(
        "  events written {}, held per replica {}, streams {}; {} simulated steps in {:.1} s wall, peak heap {:.2} GiB",
        f.events,
        f.events_held,
        f.streams,
        f.steps,
        wall.as_secs_f64(),
        peak as f64 / (1u64 << 30) as f64
    );
    println!(
        "  converge after writes stop: {:.3} s simulated = {:.1} round trips of {} ms; goal 3 x diameter x round trip = {:.3} s: {}",
        f.converge_time.as_secs_f64(),
        f.converge_time.as_secs_f64() / f.round_trip.as_secs_f64(),
        f.round_trip.as_millis(),
        f.converge_goal.as_secs_f64(),
        goal(f.converge_time <= f.converge_goal)
    );
    println!(
        "  bytes per delivered event: {:.1} (all frames until convergence, heartbeats and checkpoint gossip included; {} bytes, {} events delivered to replicas); per event per replica: {:.1}",
        c.bytes_sent as f64 / delivered as f64,
        c.bytes_sent,
        c.events_applied,
        c.bytes_sent as f64 / (f.events as f64 * (f.replicas - 1) as f64)
    );
    println!(
        "  duplicate deliveries: {} ({:.2} % of delivered)",
        c.events_duplicate,
        100.0 * c.events_duplicate as f64 / delivered as f64
    );
    report_quiet(f);
    report_tokens(mesh, figures, per_replica);
}

/// The quiet window's lines (heartbeats, by frame kind, its second half)
/// and, with churn, the bytes before and after the writers retired.
fn report_quiet(f: &Figures) {
    println!(
        "  quiet window bytes per minute per link (heartbeats, receipts and the checkpoint gossip of the converged marks, both ways, {} streams): {:.0}; goal under 1 KB: {}",
        f.streams,
        f.heartbeat_bytes_per_link_minute,
        goal(f.heartbeat_bytes_per_link_minute < 1024.0)
    );
    let quiet: Vec<String> = f
        .quiet_by_kind
        .iter()
        .map(|(kind, frames, bytes)| {
            format!(
                "{kind} {frames} frames {:.0} B each",
                *bytes as f64 / *frames as f64
            )
        })
        .collect();
    println!("    quiet window by kind: {}", quiet.join(", "));
    println!(
        "    its second half only: {:.0} bytes per minute per link; goal under 1 KB: {}",
        f.heartbeat_bytes_per_link_minute_settled,
        goal(f.heartbeat_bytes_per_link_minute_settled < 1024.0)
    );
    if let Some(churn) = &f.churn {
        println!(
            "  churn: {} writers retired (compacted at every replica) after the first half of the writes; bytes per minute per link (all frames, both ways): {:.0} before, {:.0} after",
            churn.retired, churn.before, churn.after
        );
    }
}

/// The memory, token and reader lines of the report.
fn report_tokens(mesh: &meshlog_sim::Mesh, figures: &Figures, per_replica: f64) {
    let f = figures;
    println!(
        "  memory per replica (heap live / replicas, sessions included): {:.0} bytes, {:.1} bytes per event held",
        per_replica,
        per_replica / f.events_held.max(1) as f64
    );
    println!(
        "  token text at the head: {} bytes; mid-walk: {} bytes; goal at most 2 KB at the head: {}",
        f.token_head_bytes,
        f.token_mid_bytes,
        goal(f.token_head_bytes <= 2048)
    );
    let version = |t: &meshlog_sim::TokenFigure| {
        if t.relative {
            "version 2"
        } else if t.fell_back {
            "version 1: beyond the bound of every checkpoint kept"
        } else {
            "version 1: shorter"
        }
    };
    println!(
        "  token text with checkpoints (end of the quiet window): at the head {} bytes ({}); mid-walk {} bytes ({}); goal at most 2 KB at the head: {}",
        f.token_v2_head.chars,
        version(&f.token_v2_head),
        f.token_v2_mid.chars,
        version(&f.token_v2_mid),
        goal(f.token_v2_head.chars <= 2048)
    );
    let e = &f.counters_end;
    println!(
        "    checkpoints: {} mints ({} distinct), {} kept from peers; {} distinct kept at the end, replica 0's newest by {} of {} replicas; gossip (kinds 6, 7) {} frames, {} bytes ({:.0} B per link per simulated minute over the run; protocol's other frames {} bytes)",
        e.checkpoints_minted,
        e.checkpoints_distinct,
        e.checkpoints_kept,
        f.checkpoints_held,
        f.newest_kept_by,
        f.replicas,
        e.checkpoint_frames,
        e.checkpoint_bytes,
        e.checkpoint_bytes as f64 / f.links as f64 / (mesh.now().as_secs_f64() / 60.0),
        e.bytes_sent - e.checkpoint_bytes
    );
    let kinds: Vec<String> = e
        .by_kind
        .iter()
        .map(|(kind, (frames, bytes))| format!("{kind} {frames} frames {bytes} B"))
        .collect();
    println!("    whole run by kind: {}", kinds.join(", "));
    println!(
        "  readers: {} events returned exactly once, {} failovers ({} carried version 2, {} named a checkpoint the target lacked, {} fell back to version 1 beyond the bound), {} stale answers (each exact)",
        f.returned,
        f.failovers,
        f.failovers_relative,
        f.unknown_checkpoint,
        f.fell_back,
        f.stale
    );
}

/// A goal's verdict.
fn goal(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

fn main() -> ExitCode {
    STARTED.get_or_init(Instant::now);
    let args = match parse() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("mesh-bench: {error}");
            return ExitCode::from(2);
        }
    };
    let scenario = scenario(&args);
    let baseline = alloc::live_bytes();
    let started = Instant::now();
    let (result, measured) = alloc::measure(|| scenario.run());
    let (mut mesh, figures) = match result {
        Ok(run) => run,
        Err(violation) => {
            eprintln!("mesh-bench: seed {}: {violation}", args.seed);
            return ExitCode::FAILURE;
        }
    };
    let wall = started.elapsed();
    let peak = measured.bytes_peak;
    mesh.drop_writers();
    let live = alloc::live_bytes() - baseline;
    let per_replica = live as f64 / args.replicas as f64;
    report(&args, &mesh, &figures, wall, peak, per_replica);
    ExitCode::SUCCESS
}
