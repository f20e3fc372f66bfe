//! [`Scenario`]: one run of a mesh, scripted from its seed: writes with
//! faults (partitions, stops and restarts, a late joiner, compaction) and
//! readers walking with failover, every invariant checked as it goes; then
//! writes stop, everything heals, and the mesh must converge within a
//! bound; then a quiet minute measures heartbeats. Its [`Figures`] are
//! what `mesh-bench` prints and the CI scenario asserts on.

use std::time::Duration;

use meshlog_cursor::{token, VersionVector};

use crate::check::{self, Reader, Violation};
use crate::mesh::{Counters, Mesh, MeshConfig};

/// A run's script.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The mesh.
    pub mesh: MeshConfig,
    /// How long writers write (simulated).
    pub write_for: Duration,
    /// Events each writer appends, on average, spread over `write_for`.
    pub events_per_writer: u64,
    /// Partitions, stops and restarts, late joins and compaction while
    /// writers write.
    pub faults: bool,
    /// Churn: of the writers, this fraction (the first, rounded down; at
    /// least one writer keeps writing) stops after the first half of the
    /// write window, and every replica compacts their streams whole
    /// ([`Mesh::retire`]); the rest write what is left. 0: none.
    pub retire_fraction: f64,
    /// Readers walking with failover.
    pub readers: usize,
    /// The step of the script: writes, faults and reader pages are drawn
    /// per step, and the invariants checked after each.
    pub step: Duration,
    /// How long after writes stop (and everything heals) the mesh has to
    /// converge.
    pub converge_within: Duration,
    /// How often convergence is looked at while waiting for it.
    pub converge_poll: Duration,
    /// The quiet window after convergence in which heartbeats are measured.
    pub quiet_for: Duration,
    /// Called with the mesh and the phase after each step, for a caller
    /// that reports progress (the bench); `None` in tests.
    pub progress: Option<fn(&Mesh, &str)>,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Figures {
    /// The seed.
    pub seed: u64,
    /// Replicas and writers.
    pub replicas: usize,
    /// Writers.
    pub writers: usize,
    /// Links, and the graph's diameter in hops.
    pub links: usize,
    /// The graph's diameter in hops.
    pub diameter: usize,
    /// The mean round trip of a link.
    pub round_trip: Duration,
    /// Events written.
    pub events: u64,
    /// Simulated time from writes stopping (and everything healing) to
    /// every replica holding everything.
    pub converge_time: Duration,
    /// The goal: 3 × diameter × round trip.
    pub converge_goal: Duration,
    /// Counters at convergence.
    pub counters: Counters,
    /// Bytes sent in the quiet window, per link per minute (heartbeats and
    /// their acks, both ways).
    pub heartbeat_bytes_per_link_minute: f64,
    /// The same over the quiet window's second half only, once the
    /// receipts that follow the last deltas are done.
    pub heartbeat_bytes_per_link_minute_settled: f64,
    /// The quiet window's frames and bytes per frame kind.
    pub quiet_by_kind: Vec<(&'static str, u64, u64)>,
    /// A converged replica's streams.
    pub streams: usize,
    /// The token text at the head of a converged replica, in bytes.
    pub token_head_bytes: usize,
    /// The token text half-way through a walk of a converged replica.
    pub token_mid_bytes: usize,
    /// The token text the same replica answers at its head at the end of
    /// the quiet window, with the checkpoints it then keeps: version 2
    /// where shorter (`docs/TOKEN.md`).
    pub token_v2_head: TokenFigure,
    /// The same half-way through its walk.
    pub token_v2_mid: TokenFigure,
    /// Readers' failovers that carried a version-2 token, expanded by the
    /// target; that named a checkpoint the target did not keep; and that
    /// fell back to version 1 beyond the bound.
    pub failovers_relative: u64,
    /// Failovers whose checkpoint the target did not keep.
    pub unknown_checkpoint: u64,
    /// Failovers that fell back to version 1.
    pub fell_back: u64,
    /// Counters at the end of the quiet window (checkpoint gossip
    /// included).
    pub counters_end: Counters,
    /// Distinct checkpoints the replicas keep at the end.
    pub checkpoints_held: usize,
    /// Replicas that keep replica 0's newest checkpoint at the end.
    pub newest_kept_by: usize,

    /// Events each replica holds once converged.
    pub events_held: u64,
    /// Reader totals: failovers and stale answers met (each checked exact).
    pub failovers: u64,
    /// Stale answers met.
    pub stale: u64,
    /// Events the readers returned.
    pub returned: u64,
    /// Simulated steps handled.
    pub steps: u64,
    /// With churn ([`Scenario::retire_fraction`]): what the retirement
    /// changed.
    pub churn: Option<Churn>,
}

/// What a run with churn measured: bytes on the links (all frames, both
/// ways) per link per simulated minute, over the write window before the
/// retirement and after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Churn {
    /// Writers retired.
    pub retired: usize,
    /// Bytes per link per simulated minute before the retirement.
    pub before: f64,
    /// The same after it, to the end of the writes.
    pub after: f64,
}

/// A token a replica answers: its text length, and whether it is relative
/// to a checkpoint or fell back to version 1 beyond the bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenFigure {
    /// Text characters.
    pub chars: usize,
    /// Version 2.
    pub relative: bool,
    /// Version 1 because no checkpoint kept was within the bound.
    pub fell_back: bool,
}

impl Scenario {
    /// Runs the script; the first broken invariant ends it.
    pub fn run(&self) -> Result<(Mesh, Figures), Violation> {
        let mut mesh = Mesh::new(self.mesh.clone());
        let replicas = mesh.replicas();
        let late = self.mesh.late_joiners;
        let mut readers: Vec<Reader> = (0..self.readers)
            .map(|i| Reader::new(i % (replicas - late)))
            .collect();
        let links = mesh.links().len();
        let churn = self.write(&mut mesh, &mut readers, links)?;
        let converge_time = self.converge(&mut mesh, links)?;
        check::prefix_closed(&mesh)?;
        let counters = mesh.counters().clone();
        fail_over_all(&mut mesh, &mut readers, false)?;
        let head = mesh.replica(0).expect("up").marks();
        let token_head_bytes = token::encode_text(&head).map_or(0, |t| t.len());
        let token_mid_bytes = token::encode_text(&mid_walk_cursor(&mesh)).map_or(0, |t| t.len());
        let events_held = mesh.replica(0).expect("up").digest().events;
        // Quiet: heartbeats and their receipts, and the checkpoint of the
        // converged marks, minted and gossiped.
        let (quiet, settled, quiet_by_kind) = self.quiet(&mut mesh);
        // At the head after the quiet window (the converged marks'
        // checkpoint minted and gossiped): mid-walk, a reader's cursor is
        // often beyond every checkpoint's bound.
        fail_over_all(&mut mesh, &mut readers, true)?;
        let sum = |f: fn(&Reader) -> u64| readers.iter().map(f).sum::<u64>();
        let head = mesh.replica(0).expect("up").marks();
        let token_v2_head = token_figure(&mesh, &head);
        let token_v2_mid = token_figure(&mesh, &mid_walk_cursor(&mesh));
        let (checkpoints_held, newest_kept_by) = newest_spread(&mesh);
        let minutes = self.quiet_for.as_secs_f64() / 60.0;
        let round_trip = self.mesh.net.round_trip_mean();
        let diameter = mesh.diameter();
        let figures = Figures {
            seed: self.mesh.seed,
            replicas,
            writers: mesh.writers(),
            links,
            diameter,
            round_trip,
            events: mesh.counters().events_written,
            converge_time,
            converge_goal: round_trip * 3 * diameter as u32,
            counters,
            heartbeat_bytes_per_link_minute: quiet as f64 / links as f64 / minutes,
            heartbeat_bytes_per_link_minute_settled: settled as f64
                / links as f64
                / (minutes / 2.0),
            quiet_by_kind,
            streams: head.len(),
            token_head_bytes,
            token_mid_bytes,
            token_v2_head,
            token_v2_mid,
            failovers_relative: sum(|r| r.failovers_relative),
            unknown_checkpoint: sum(|r| r.unknown_checkpoint),
            fell_back: sum(|r| r.fell_back),
            counters_end: mesh.counters().clone(),
            checkpoints_held,
            newest_kept_by,
            events_held,
            failovers: sum(|r| r.failovers),
            stale: sum(|r| r.stale),
            returned: sum(|r| r.returned),
            steps: mesh.steps(),
            churn,
        };
        Ok((mesh, figures))
    }

    /// The writing phase: writers append on schedule, faults are drawn,
    /// readers walk and fail over, writers retire (with churn); the
    /// invariants are checked each step.
    fn write(
        &self,
        mesh: &mut Mesh,
        readers: &mut [Reader],
        links: usize,
    ) -> Result<Option<Churn>, Violation> {
        let slices = (self.write_for.as_nanos() / self.step.as_nanos()).max(1) as u64;
        let total = self.events_per_writer * mesh.writers() as u64;
        let mut written = 0u64;
        let mut stopped: Vec<usize> = Vec::new();
        let mut cut: Vec<usize> = Vec::new();
        let retired = ((mesh.writers() as f64 * self.retire_fraction) as usize)
            .min(mesh.writers().saturating_sub(1));
        let mut churn = Churn {
            retired,
            before: 0.0,
            after: 0.0,
        };
        let mut retired_at = None;
        // Writers `first_active..` write (those below retired).
        let mut first_active = 0;
        for slice in 1..=slices {
            // Writes: the events due by the end of this slice.
            append_due(mesh, &mut written, total * slice / slices, first_active);
            if self.faults {
                self.fault(mesh, slice, slices, &mut stopped, &mut cut, links);
            }
            for reader in readers.iter_mut() {
                if mesh.rng().chance(0.1) {
                    let up = mesh.up();
                    let i = mesh.rng().below(up.len() as u64) as usize;
                    let to = up[i];
                    reader.fail_over(mesh, to)?;
                }
                // Slow readers (a short page, every other step), so that
                // compaction overtakes them and they meet stale answers.
                if mesh.rng().chance(0.5) {
                    reader.step(mesh, 5)?;
                }
            }
            if slice == slices {
                break; // the last writes: convergence is timed from here
            }
            let until = mesh.now() + self.step;
            mesh.run_until(until);
            if first_active > 0 {
                mesh.reapply_retention();
            }
            check::prefix_closed(mesh)?;
            if let Some(progress) = self.progress {
                progress(mesh, "writing");
            }
            if retired > 0 && slice == slices / 2 {
                churn.before = per_link_minute(mesh, links, 0, Duration::ZERO);
                retired_at = Some((mesh.link_bytes().iter().sum::<u64>(), mesh.now()));
                mesh.retire(0..retired);
                first_active = retired;
            }
        }
        Ok(retired_at.map(|(bytes, at)| Churn {
            after: per_link_minute(mesh, links, bytes, at),
            ..churn
        }))
    }

    /// Writes stop, everything heals, restarts and joins; the time until
    /// every replica holds every event written.
    fn converge(&self, mesh: &mut Mesh, links: usize) -> Result<Duration, Violation> {
        // Writes stop; everything heals, restarts, joins.
        mesh.heal_all();
        for node in 0..mesh.replicas() {
            mesh.restart(node);
        }
        let stopped_at = mesh.now();
        let written = mesh.written();
        let mut next_check = stopped_at + self.step;
        loop {
            if check::converged(mesh, &written) {
                break;
            }
            if mesh.now() - stopped_at > self.converge_within {
                return Err(Violation {
                    at: mesh.now(),
                    step: mesh.steps(),
                    what: format!(
                        "not converged {:?} after writes stopped and everything healed ({} of {} links connected)",
                        self.converge_within,
                        mesh.connected(),
                        links
                    ),
                });
            }
            let until = mesh.now() + self.converge_poll;
            mesh.run_until(until);
            if self.retire_fraction > 0.0 {
                // Churn: the retired streams' last events are compacted
                // where they arrive late.
                mesh.reapply_retention();
            }
            if mesh.now() >= next_check {
                check::prefix_closed(mesh)?;
                next_check += self.step;
                if let Some(progress) = self.progress {
                    progress(mesh, "converging");
                }
            }
        }
        Ok(mesh.now() - stopped_at)
    }

    /// The quiet window: the bytes sent over it, over its second half,
    /// and per frame kind.
    fn quiet(&self, mesh: &mut Mesh) -> (u64, u64, Vec<(&'static str, u64, u64)>) {
        let before: u64 = mesh.link_bytes().iter().sum();
        let kinds_before = mesh.counters().by_kind.clone();
        let half = mesh.now() + self.quiet_for / 2;
        mesh.run_until(half);
        let middle: u64 = mesh.link_bytes().iter().sum();
        let until = mesh.now() + (self.quiet_for - self.quiet_for / 2);
        mesh.run_until(until);
        let end: u64 = mesh.link_bytes().iter().sum();
        let quiet = end - before;
        let settled = end - middle;
        if let Some(progress) = self.progress {
            progress(mesh, "quiet window done");
        }
        let quiet_by_kind = mesh
            .counters()
            .by_kind
            .iter()
            .map(|(&kind, &(frames, bytes))| {
                let (f0, b0) = kinds_before.get(kind).copied().unwrap_or_default();
                (kind, frames - f0, bytes - b0)
            })
            .filter(|&(_, frames, _)| frames > 0)
            .collect();
        (quiet, settled, quiet_by_kind)
    }

    /// This slice's faults, drawn: cut or heal a link, stop or restart a
    /// replica (at most a fifth down at once), a late joiner joins half-way,
    /// and compaction now and then.
    fn fault(
        &self,
        mesh: &mut Mesh,
        slice: u64,
        slices: u64,
        stopped: &mut Vec<usize>,
        cut: &mut Vec<usize>,
        links: usize,
    ) {
        let replicas = mesh.replicas();
        let late = self.mesh.late_joiners;
        if mesh.rng().chance(0.1) && cut.len() < links / 4 + 1 {
            let link = mesh.rng().below(links as u64) as usize;
            mesh.cut(link);
            cut.push(link);
        }
        // Cuts last 2.5 s on average: longer than a read timeout at the
        // CI's heartbeat, so sessions time out and redial.
        if !cut.is_empty() && mesh.rng().chance(0.04) {
            let i = mesh.rng().below(cut.len() as u64) as usize;
            mesh.heal(cut.swap_remove(i));
        }
        if mesh.rng().chance(0.08) && stopped.len() < (replicas - late) / 5 + 1 {
            let node = mesh.rng().below((replicas - late) as u64) as usize;
            if !stopped.contains(&node) {
                mesh.stop(node);
                stopped.push(node);
            }
        }
        if !stopped.is_empty() && mesh.rng().chance(0.1) {
            let i = mesh.rng().below(stopped.len() as u64) as usize;
            mesh.restart(stopped.swap_remove(i));
        }
        if slice == slices / 2 {
            for node in replicas - late..replicas {
                mesh.join(node);
            }
        }
        if mesh.rng().chance(0.05) {
            // Half of what every replica up holds, on a few streams.
            let up = mesh.up();
            let mut common: Option<VersionVector> = None;
            for node in up {
                let marks = mesh.replica(node).expect("up").marks();
                common = Some(match common {
                    None => marks,
                    Some(c) => c.iter().map(|(s, seq)| (s, seq.min(marks.get(s)))).fold(
                        VersionVector::new(),
                        |mut v, (s, seq)| {
                            v.advance(s, seq);
                            v
                        },
                    ),
                });
            }
            let mut target = VersionVector::new();
            for (stream, seq) in common.unwrap_or_default().iter() {
                if mesh.rng().chance(0.3) {
                    target.advance(stream, seq / 2);
                }
            }
            mesh.compact_all(&target);
        }
    }
}

/// The distinct checkpoints the replicas keep, and how many keep replica
/// 0's newest.
fn newest_spread(mesh: &Mesh) -> (usize, usize) {
    let kept: Vec<Vec<_>> = (0..mesh.replicas())
        .map(|n| mesh.checkpoint_names(n))
        .collect();
    let distinct: std::collections::BTreeSet<_> = kept.iter().flatten().collect();
    let Some(newest) = kept[0].last() else {
        return (distinct.len(), 0);
    };
    let kept_by = kept.iter().filter(|names| names.contains(newest)).count();
    (distinct.len(), kept_by)
}

/// The token replica 0 answers for `cursor`.
fn token_figure(mesh: &Mesh, cursor: &VersionVector) -> TokenFigure {
    let answer = mesh.token(0, cursor).expect("replica 0 is up");
    TokenFigure {
        chars: answer.text.len(),
        relative: answer.relative,
        fell_back: answer.fell_back,
    }
}

/// The cursor half-way through a walk of replica 0.
fn mid_walk_cursor(mesh: &Mesh) -> VersionVector {
    let replica = mesh.replica(0).expect("up");
    let half = replica.digest().events / 2;
    let mut cursor = replica.floor();
    let mut seen = 0;
    while seen < half {
        let Ok(page) = replica.page(&cursor, 1000) else {
            break;
        };
        seen += page.events.len() as u64;
        cursor = page.next;
        if page.at_head {
            break;
        }
    }
    cursor
}

/// Appends until `due` events are written, each by a writer drawn among
/// those from `first_active` on (the others retired).
fn append_due(mesh: &mut Mesh, written: &mut u64, due: u64, first_active: usize) {
    while *written < due {
        let active = (mesh.writers() - first_active) as u64;
        let writer = first_active + mesh.rng().below(active) as usize;
        mesh.append(writer);
        *written += 1;
    }
}

/// Bytes sent on the links since `bytes` were at `since`, per link per
/// simulated minute.
fn per_link_minute(mesh: &Mesh, links: usize, bytes: u64, since: Duration) -> f64 {
    let sent = mesh.link_bytes().iter().sum::<u64>() - bytes;
    let minutes = (mesh.now() - since).as_secs_f64() / 60.0;
    sent as f64 / links as f64 / minutes.max(f64::MIN_POSITIVE)
}

/// Every reader fails over once more and walks to the head. `at_head`:
/// it first walks to the head and takes its replica's token there
/// (version 2 if a checkpoint is within its bound), and fails over to a
/// replica that is up; otherwise it carries its mid-walk token to any
/// replica (one that is down is paged once it is up).
fn fail_over_all(mesh: &mut Mesh, readers: &mut [Reader], at_head: bool) -> Result<(), Violation> {
    for reader in readers {
        let to = if at_head {
            reader.finish(mesh, 100)?;
            let up = mesh.up();
            up[mesh.rng().below(up.len() as u64) as usize]
        } else {
            let replicas = mesh.replicas() as u64;
            mesh.rng().below(replicas) as usize
        };
        reader.fail_over(mesh, to)?;
        reader.finish(mesh, 100)?;
    }
    Ok(())
}
