//! One schedule, end to end: start the mesh, run writers and readers while
//! the nemesis applies the schedule's faults, stop the writers, heal,
//! measure convergence, let the readers finish their walks, read every node
//! to the end, tear the mesh down and judge the history.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use meshlog_cursor::{token, StreamId};
use meshlog_testkit::SplitMix64;
use serde_json::Value;

use crate::check::{chains_agree, check, Verdict};
use crate::history::{
    read_history, write_record, Ack, AppendOutcome, Event, Forgery, LostRange, NodeInfo,
    PageOutcome, Record,
};
use crate::hostile;
use crate::http::{request, request_from, RequestError};
use crate::net::{node_addr, node_url, observer, Mesh, Sealing};
use crate::schedule::{Fault, Schedule, NODES};

/// Set by SIGINT or SIGTERM: every loop stops, the guard cleans up.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How many readers walk the mesh.
pub const READERS: usize = 3;
/// How long the nodes may take to agree after the heal before it is a
/// violation.
const CONVERGE_BOUND: Duration = Duration::from_secs(30);
/// How long a reader's final walk, or a node's final read, may take.
const FINAL_BOUND: Duration = Duration::from_secs(30);

/// A bug to plant in reader 0, to show the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// Records a page without its first event (once).
    DropEvent,
    /// Resumes from a cursor one seq past the page's `next` on the stream
    /// of its last event (once).
    SkipCursor,
    /// Runs the hostile node (as `--hostile-node`) and gives it node 3's
    /// writer key, so that its forgery of stream 3's next event is sealed
    /// by the writer's own key ([`crate::history::Forgery::StolenKey`]).
    StolenKey,
}

impl std::str::FromStr for Plant {
    type Err = String;
    fn from_str(text: &str) -> Result<Plant, String> {
        match text {
            "drop-event" => Ok(Plant::DropEvent),
            "skip-cursor" => Ok(Plant::SkipCursor),
            "stolen-key" => Ok(Plant::StolenKey),
            other => Err(format!(
                "unknown plant {other:?}: drop-event, skip-cursor or stolen-key"
            )),
        }
    }
}

/// What one schedule's run measured, beside the checker's verdict.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The schedule.
    pub schedule: Schedule,
    /// The checker's verdict on the history.
    pub verdict: Verdict,
    /// The history file.
    pub history: PathBuf,
    /// Milliseconds from the final heal (partitions, kills, pauses lifted;
    /// link impairments kept) to equal digests, if within the bound.
    pub converge_impaired_ms: Option<u64>,
    /// Milliseconds from removing the link impairments to equal digests.
    pub converge_clear_ms: Option<u64>,
    /// Whether links were impaired at the final heal.
    pub impaired_at_heal: bool,
    /// Per step heal, with writers running: milliseconds until every node
    /// held what any node held at the heal (`None`: not within 10 s).
    pub caught_up: Vec<Option<u64>>,
    /// Events acknowledged per second while the schedule ran.
    pub acked_per_s: f64,
    /// Seconds the schedule ran (faults), startup and teardown excluded.
    pub faults_s: f64,
    /// Seconds in all, startup and teardown included.
    pub total_s: f64,
}

/// The phases the clients follow.
const RUNNING: u8 = 0;
/// Writers stop; readers keep reading.
const HEALING: u8 = 1;
/// Readers walk to the head and stop.
const FINAL: u8 = 2;

struct Shared {
    history: Mutex<BufWriter<File>>,
    started: Instant,
    phase: AtomicU8,
    seed: u64,
    /// The forgeries the hostile node has shown tried and answered as they
    /// must be ([`crate::history::Forgery::shown_by`]).
    forgeries_shown: Mutex<BTreeSet<Forgery>>,
}

impl Shared {
    fn record(&self, record: &Record) {
        let mut out = self.history.lock().expect("the history lock");
        write_record(&mut *out, record).expect("writing the history");
    }

    fn t_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn stopping(&self) -> bool {
        INTERRUPTED.load(Ordering::Relaxed)
    }
}

/// Sleeps up to `time`, waking early on an interrupt.
fn nap(time: Duration) {
    let until = Instant::now() + time;
    while Instant::now() < until && !INTERRUPTED.load(Ordering::Relaxed) {
        std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
    }
}

/// Runs one schedule and judges it. The history and node logs go under
/// `out/seed-<seed>/`. With `hostile` (or the stolen-key plant), the nodes
/// seal their streams under a closed trust configuration and the hostile
/// node runs beside them ([`crate::hostile`]).
pub fn run_schedule(
    schedule: &Schedule,
    binary: &Path,
    out: &Path,
    plant: Option<Plant>,
    hostile: bool,
) -> Result<Outcome, String> {
    let began = Instant::now();
    let hostile = hostile || plant == Some(Plant::StolenKey);
    let dir = out.join(format!("seed-{}", schedule.seed));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let history_path = dir.join("history.jsonl");
    let file = File::create(&history_path).map_err(|e| format!("history: {e}"))?;
    let sealing = hostile.then(|| Sealing {
        keys: (0..NODES)
            .map(|i| hostile::writer_key(schedule.seed, i).to_bytes())
            .collect(),
        writers: hostile::trust_entries(schedule.seed),
    });
    let mut mesh = Mesh::start(binary, &dir, schedule.seed, sealing)?;
    let shared = Arc::new(Shared {
        history: Mutex::new(BufWriter::new(file)),
        started: Instant::now(),
        phase: AtomicU8::new(RUNNING),
        seed: schedule.seed,
        forgeries_shown: Mutex::new(BTreeSet::new()),
    });
    shared.record(&Record::Start {
        seed: schedule.seed,
        nodes: (0..NODES)
            .map(|i| NodeInfo {
                name: format!("n{}", i + 1),
                url: node_url(i),
                stream: (i + 1).to_string(),
            })
            .collect(),
        hostile,
    });

    // The hostile node first: its unsealed first runs go to each node
    // before the writers write (`hostile::Hostile::first_runs`).
    let stolen = (plant == Some(Plant::StolenKey)).then_some(2);
    let hostile_peer = hostile.then(|| {
        let shared = Arc::clone(&shared);
        let (started, first_runs_sent) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || run_hostile(&shared, stolen, started));
        // Bounded: a peer that cannot reach the nodes records that, and
        // the schedule goes on (a dropped sender ends the wait too).
        let _ = first_runs_sent.recv_timeout(FIRST_RUNS_BOUND);
        handle
    });
    let writers: Vec<JoinHandle<()>> = (0..NODES)
        .map(|w| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || writer(&shared, w))
        })
        .collect();
    let readers: Vec<JoinHandle<()>> = (0..READERS)
        .map(|r| {
            let shared = Arc::clone(&shared);
            let plant = if r == 0 { plant } else { None };
            std::thread::spawn(move || reader(&shared, r, plant))
        })
        .collect();

    // The nemesis.
    let mut caught_up = Vec::new();
    let nemesis = run_steps(&mut mesh, schedule, &shared, &mut caught_up);
    if hostile {
        await_forgeries(&shared);
    }
    let faults_s = shared.started.elapsed().as_secs_f64();
    shared.phase.store(HEALING, Ordering::SeqCst);
    for handle in writers.into_iter().chain(hostile_peer) {
        handle
            .join()
            .map_err(|_| "a writer or the hostile peer panicked".to_owned())?;
    }
    // The final heal: everything but the link impairments.
    let healed = heal_all(&mut mesh, &shared).and(nemesis);
    let impaired_at_heal = mesh.any_impaired();
    let mut converge_impaired_ms = None;
    let mut converge_clear_ms = None;
    if healed.is_ok() && !shared.stopping() {
        let bound = if impaired_at_heal {
            Duration::from_secs(10)
        } else {
            CONVERGE_BOUND
        };
        // Compaction leaves the floors apart (a floor never passes what a
        // peer acknowledged, and a peer's floor is taken only by a node
        // holding nothing of the stream above its own: it never erases
        // what a node holds, docs/SIGNING.md), and with
        // them the digests, until the final compaction: until then the
        // nodes agree when their chain heads do (equal heads, and equal
        // hashes where both are anchored; `check::chains_agree`).
        // The final compaction keeps the fewest any step kept: a floor
        // never goes down, so only that one can bring every node's floor
        // to one value.
        let last_compaction = schedule
            .steps
            .iter()
            .filter_map(|step| match step.fault {
                Fault::Compact { keep_last } => Some(keep_last),
                _ => None,
            })
            .min();
        let key = if last_compaction.is_some() {
            "chains"
        } else {
            "digest"
        };
        converge_impaired_ms = converge(bound, key);
        shared.record(&Record::Converged {
            after_heal_ms: converge_impaired_ms,
            under_impairment: impaired_at_heal,
            compared: key.into(),
        });
        if impaired_at_heal {
            mesh.clear_impairments()?;
            shared.record(&Record::Fault {
                t_ms: shared.t_ms(),
                action: "heal link impairments".into(),
            });
            converge_clear_ms = converge(CONVERGE_BOUND, key);
            shared.record(&Record::Converged {
                after_heal_ms: converge_clear_ms,
                under_impairment: false,
                compared: key.into(),
            });
        } else {
            converge_clear_ms = converge_impaired_ms;
        }
        if let Some(keep_last) = last_compaction {
            final_compaction(keep_last, &shared);
        }
    }
    shared.phase.store(FINAL, Ordering::SeqCst);
    for handle in readers {
        handle.join().map_err(|_| "a reader panicked".to_owned())?;
    }
    if healed.is_ok() && !shared.stopping() {
        for node in 0..NODES {
            shared.record(&final_read(node));
        }
    }
    shared
        .history
        .lock()
        .expect("the history lock")
        .flush()
        .map_err(|e| format!("history: {e}"))?;
    drop(mesh);
    healed?;
    if shared.stopping() {
        return Err("interrupted".into());
    }
    let records = read_history(BufReader::new(
        File::open(&history_path).map_err(|e| format!("history: {e}"))?,
    ))?;
    let verdict = check(&records);
    Ok(Outcome {
        schedule: schedule.clone(),
        acked_per_s: verdict.acknowledged as f64 / faults_s.max(0.001),
        verdict,
        history: history_path,
        converge_impaired_ms,
        converge_clear_ms,
        impaired_at_heal,
        caught_up,
        faults_s,
        total_s: began.elapsed().as_secs_f64(),
    })
}

/// How long the writers wait for the hostile node's first runs.
const FIRST_RUNS_BOUND: Duration = Duration::from_secs(30);

/// How long the writers and the hostile node may run on after the last
/// step, until every kind of forgery was shown tried.
const FORGERIES_BOUND: Duration = Duration::from_secs(15);

/// After the steps, with the hostile node: lets the writers and the
/// hostile node run on (the mesh healed, impairments kept) until every
/// kind of forgery but the planted one was shown tried, bounded by
/// [`FORGERIES_BOUND`]; the checker names any that was not. An altered run
/// needs events a node still lacks, which a short schedule on a lossy mesh
/// may not have offered yet.
fn await_forgeries(shared: &Shared) {
    let started = Instant::now();
    let done = || {
        let shown = shared.forgeries_shown.lock().expect("the forgeries lock");
        Forgery::ALL
            .iter()
            .all(|f| *f == Forgery::StolenKey || shown.contains(f))
    };
    while !done() && started.elapsed() < FORGERIES_BOUND && !shared.stopping() {
        nap(Duration::from_millis(50));
    }
}

/// The hostile node, while the writers run; each forgery it tries goes to
/// the history. `started` is told once its first runs are sent.
fn run_hostile(shared: &Shared, stolen: Option<usize>, started: std::sync::mpsc::Sender<()>) {
    let peer = match hostile::Hostile::new(shared.seed, stolen) {
        Ok(peer) => peer,
        Err(error) => {
            eprintln!("hostile peer: {error}");
            return;
        }
    };
    if let Some(node) = stolen {
        eprintln!("planted: the hostile peer holds n{}'s writer key", node + 1);
    }
    let stop = || shared.phase.load(Ordering::SeqCst) != RUNNING || shared.stopping();
    let record = |attempt: hostile::Attempt| {
        if attempt.forgery.shown_by(&attempt.outcome) {
            let mut shown = shared.forgeries_shown.lock().expect("the forgeries lock");
            shown.insert(attempt.forgery);
        }
        shared.record(&Record::Forgery {
            t_ms: shared.t_ms(),
            node: attempt.node,
            forgery: attempt.forgery,
            stream: if attempt.stream == 0 {
                String::new()
            } else {
                attempt.stream.to_string()
            },
            seq: attempt.seq,
            outcome: attempt.outcome,
        })
    };
    peer.run(&stop, &record, &|| {
        let _ = started.send(());
    });
}

fn run_steps(
    mesh: &mut Mesh,
    schedule: &Schedule,
    shared: &Shared,
    caught_up: &mut Vec<Option<u64>>,
) -> Result<(), String> {
    // Let the mesh connect and the clients start before the first fault.
    nap(Duration::from_millis(500));
    for step in &schedule.steps {
        if shared.stopping() {
            return Ok(());
        }
        match &step.fault {
            Fault::Impair { nodes } => {
                for &node in nodes {
                    mesh.impair(node, &schedule.link)?;
                }
            }
            Fault::Isolate { node } => {
                let others: Vec<usize> = (0..NODES).filter(|n| n != node).collect();
                mesh.cut(*node, &others)?;
            }
            Fault::Split { minority } => {
                let majority: Vec<usize> = (0..NODES).filter(|n| !minority.contains(n)).collect();
                for &node in minority {
                    mesh.cut(node, &majority)?;
                }
            }
            Fault::OneWay { source, target } => mesh.cut_one_way(*source, *target)?,
            Fault::Kill { node } => mesh.kill(*node),
            Fault::Pause { node } => mesh.pause(*node, true),
            Fault::Compact { .. } => {}
        }
        let action = match &step.fault {
            Fault::Impair { .. } => format!("{} ({})", step.fault, schedule.link),
            Fault::Compact { keep_last } => {
                format!("{} ({})", step.fault, compact_all(*keep_last))
            }
            other => other.to_string(),
        };
        shared.record(&Record::Fault {
            t_ms: shared.t_ms(),
            action,
        });
        nap(Duration::from_millis(step.hold_ms));
        let healed = match &step.fault {
            // Impairments stay until the final heal; compaction is undone by
            // nothing.
            Fault::Impair { .. } | Fault::Compact { .. } => None,
            Fault::Isolate { .. } | Fault::Split { .. } | Fault::OneWay { .. } => {
                mesh.heal_partitions()?;
                Some("heal partitions".to_owned())
            }
            Fault::Kill { node } => {
                mesh.restart(*node)?;
                Some(format!("heal: restart n{}", node + 1))
            }
            Fault::Pause { node } => {
                mesh.pause(*node, false);
                Some(format!("heal: resume n{}", node + 1))
            }
        };
        if let Some(action) = healed {
            let t_ms = shared.t_ms();
            shared.record(&Record::Fault {
                t_ms,
                action: action.clone(),
            });
            // The next fault waits until the mesh has caught up (bounded),
            // so each heal gets its own measurement.
            let after_heal_ms = catch_up(Duration::from_secs(10));
            caught_up.push(after_heal_ms);
            shared.record(&Record::CaughtUp {
                t_ms,
                heal: action,
                after_heal_ms,
            });
        }
        nap(Duration::from_millis(step.rest_ms));
    }
    Ok(())
}

fn heal_all(mesh: &mut Mesh, shared: &Shared) -> Result<(), String> {
    mesh.heal_partitions()?;
    for node in 0..NODES {
        mesh.pause(node, false);
        mesh.restart(node)?;
    }
    shared.record(&Record::Fault {
        t_ms: shared.t_ms(),
        action: "heal all (link impairments kept)".into(),
    });
    Ok(())
}

/// `POST /compact {"keep_last": N}` on every node; what each answered.
fn compact_all(keep_last: u64) -> String {
    let body = format!("{{\"keep_last\": {keep_last}}}");
    (0..NODES)
        .map(|node| {
            match request_from(
                Some(observer()),
                node_addr(node),
                "POST",
                "/compact",
                Some("application/json"),
                body.as_bytes(),
            ) {
                Ok(response) if response.status == 200 => {
                    let answer: Value =
                        serde_json::from_slice(&response.body).unwrap_or(Value::Null);
                    format!("n{} dropped {}", node + 1, answer["dropped"])
                }
                Ok(response) => format!("n{} status {}", node + 1, response.status),
                Err(error) => format!("n{} {error}", node + 1),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// After the heal, compacts every node again with the schedule's smallest
/// `keep_last` until the digests agree: a floor never passes what a peer
/// has acknowledged, and acknowledgements trail by a heartbeat, so the
/// first round may leave the floors a few seqs apart. Records the time.
fn final_compaction(keep_last: u64, shared: &Shared) {
    shared.record(&Record::Fault {
        t_ms: shared.t_ms(),
        action: format!("final compaction, keep_last {keep_last}, on every node"),
    });
    let started = Instant::now();
    let mut agreed = None;
    while started.elapsed() < CONVERGE_BOUND && !shared.stopping() {
        compact_all(keep_last);
        if converge(Duration::from_millis(300), "digest").is_some() {
            agreed = Some(started.elapsed().as_millis() as u64);
            break;
        }
    }
    shared.record(&Record::Converged {
        after_heal_ms: agreed,
        under_impairment: false,
        compared: "digest".into(),
    });
}

/// Every node's `GET /marks` body, asked all at once from the observer
/// address, so one slow answer over a lossy link does not stretch the
/// round; `None` for a node that did not answer 200.
fn marks_bodies() -> Vec<Option<Value>> {
    std::thread::scope(|scope| {
        let asks: Vec<_> = (0..NODES)
            .map(|node| {
                scope.spawn(move || {
                    let response = request_from(
                        Some(observer()),
                        node_addr(node),
                        "GET",
                        "/marks",
                        None,
                        b"",
                    )
                    .ok()?;
                    let body: Value = serde_json::from_slice(&response.body).ok()?;
                    (response.status == 200).then_some(body)
                })
            })
            .collect();
        asks.into_iter()
            .map(|ask| ask.join().ok().flatten())
            .collect()
    })
}

/// Every node's `/marks` object; `None` for a node that did not answer.
fn all_marks() -> Vec<Option<serde_json::Map<String, Value>>> {
    marks_bodies()
        .into_iter()
        .map(|body| body.and_then(|body| body["marks"].as_object().cloned()))
        .collect()
}

/// After a heal: joins every node's marks now, then polls until every
/// node's marks dominate that join; the time from the call.
fn catch_up(bound: Duration) -> Option<u64> {
    let started = Instant::now();
    let mut target: BTreeMap<String, u64> = BTreeMap::new();
    let mut answered = [false; NODES];
    // The target: what any node holds at the heal. A node that does not
    // answer yet (restarting, on a lossy link) is asked again.
    while !answered.iter().all(|&a| a) {
        if started.elapsed() > bound || INTERRUPTED.load(Ordering::Relaxed) {
            return None;
        }
        for (node, marks) in all_marks().into_iter().enumerate() {
            if let Some(marks) = marks {
                answered[node] = true;
                for (stream, seq) in marks {
                    let seq = seq.as_u64().unwrap_or(0);
                    let entry = target.entry(stream).or_default();
                    *entry = (*entry).max(seq);
                }
            }
        }
    }
    while started.elapsed() < bound && !INTERRUPTED.load(Ordering::Relaxed) {
        let all = all_marks();
        let dominates = |marks: &Option<serde_json::Map<String, Value>>| {
            marks.as_ref().is_some_and(|marks| {
                target.iter().all(|(stream, seq)| {
                    marks.get(stream).and_then(Value::as_u64).unwrap_or(0) >= *seq
                })
            })
        };
        if all.iter().all(dominates) {
            return Some(started.elapsed().as_millis() as u64);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Polls every node's `/marks` until `key` (`digest`, or `marks` when
/// compaction has left the nodes' floors apart) is equal on all; the time
/// it took.
fn converge(bound: Duration, key: &'static str) -> Option<u64> {
    let started = Instant::now();
    while started.elapsed() < bound && !INTERRUPTED.load(Ordering::Relaxed) {
        let digests: Vec<Option<Value>> = marks_bodies()
            .into_iter()
            .map(|body| body.map(|body| body[key].clone()))
            .collect();
        let agree = |w: &[Option<Value>]| match (key, &w[0], &w[1]) {
            ("chains", Some(a), Some(b)) => chains_agree(a, b).is_ok(),
            _ => w[0] == w[1],
        };
        if digests.iter().all(Option::is_some) && digests.windows(2).all(agree) {
            return Some(started.elapsed().as_millis() as u64);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn writer(shared: &Shared, w: usize) {
    let mut rng = SplitMix64::new(SplitMix64::derive(shared.seed, 100 + w as u64));
    let mut count = 0u64;
    while shared.phase.load(Ordering::SeqCst) == RUNNING && !shared.stopping() {
        let batch = rng.between(1, 3) as usize;
        let payloads: Vec<String> = (0..batch)
            .map(|_| {
                count += 1;
                format!("s{}-w{}-{}", shared.seed, w + 1, count)
            })
            .collect();
        let body = serde_json::to_vec(&payloads).expect("strings serialize");
        let t_ms = shared.t_ms();
        let outcome = match request(
            node_addr(w),
            "POST",
            "/events",
            Some("application/json"),
            &body,
        ) {
            Ok(response) if response.status == 201 => match parse_acks(&response.body) {
                Some(events) if events.len() == batch => AppendOutcome::Ok { events },
                _ => AppendOutcome::Unknown {
                    message: format!(
                        "201 with an answer that does not name {batch} events: {}",
                        String::from_utf8_lossy(&response.body)
                    ),
                },
            },
            // A 5xx may come from a commit that failed after it started.
            Ok(response) if response.status >= 500 && response.status != 503 => {
                AppendOutcome::Unknown {
                    message: format!("status {}", response.status),
                }
            }
            Ok(response) => AppendOutcome::Failed {
                message: format!("status {}", response.status),
            },
            Err(RequestError::Connect(error)) => AppendOutcome::Failed {
                message: format!("connect: {error}"),
            },
            Err(error) => AppendOutcome::Unknown {
                message: error.to_string(),
            },
        };
        let failed = !matches!(outcome, AppendOutcome::Ok { .. });
        shared.record(&Record::Append {
            t_ms,
            writer: w,
            node: w,
            payloads,
            outcome,
        });
        let pause = if failed { 100 } else { rng.between(10, 30) };
        std::thread::sleep(Duration::from_millis(pause));
    }
}

fn parse_acks(body: &[u8]) -> Option<Vec<Ack>> {
    let answer: Value = serde_json::from_slice(body).ok()?;
    answer["events"]
        .as_array()?
        .iter()
        .map(|event| {
            Some(Ack {
                stream: event["stream"].as_str()?.to_owned(),
                seq: event["seq"].as_u64()?,
                lamport: event["lamport"].as_u64()?,
            })
        })
        .collect()
}

fn parse_page(body: &[u8]) -> Option<(Vec<Event>, String, bool, bool)> {
    let page: Value = serde_json::from_slice(body).ok()?;
    let events = page["events"]
        .as_array()?
        .iter()
        .map(|event| {
            Some(Event {
                stream: event["stream"].as_str()?.to_owned(),
                seq: event["seq"].as_u64()?,
                lamport: event["lamport"].as_u64()?,
                payload: event["payload"].as_str()?.to_owned(),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((
        events,
        page["next"].as_str()?.to_owned(),
        page["at_head"].as_bool()?,
        page["behind"].as_bool()?,
    ))
}

fn parse_stale(body: &[u8]) -> Option<(Vec<LostRange>, String)> {
    let answer: Value = serde_json::from_slice(body).ok()?;
    let lost = answer["lost"]
        .as_array()?
        .iter()
        .map(|range| {
            Some(LostRange {
                stream: range["stream"].as_str()?.to_owned(),
                first: range["first"].as_u64()?,
                last: range["last"].as_u64()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((lost, answer["resume"].as_str()?.to_owned()))
}

fn reader(shared: &Shared, r: usize, plant: Option<Plant>) {
    let mut rng = SplitMix64::new(SplitMix64::derive(shared.seed, 200 + r as u64));
    let mut node = r % NODES;
    let mut after = String::new();
    let mut planted = false;
    let mut final_started: Option<Instant> = None;
    loop {
        if shared.stopping() {
            break;
        }
        let phase = shared.phase.load(Ordering::SeqCst);
        let final_walk = phase == FINAL;
        if final_walk && final_started.is_none() {
            final_started = Some(Instant::now());
        }
        if final_started.is_some_and(|s| s.elapsed() > FINAL_BOUND) {
            shared.record(&Record::ReaderDone {
                reader: r,
                at_head: false,
            });
            return;
        }
        if rng.chance(0.25) {
            node = rng.below(NODES as u64) as usize;
        }
        // The last reader is slow (small pages, long pauses), so that it
        // falls behind compaction and meets 410s.
        let slow = r == READERS - 1;
        let limit = match (final_walk, slow) {
            (true, _) => 100,
            (false, true) => rng.between(1, 5),
            (false, false) => rng.between(1, 40),
        };
        let path = format!("/events?after={after}&limit={limit}");
        let t_ms = shared.t_ms();
        let asked = node;
        let sent = after.clone();
        let outcome = match request(node_addr(asked), "GET", &path, None, b"") {
            Ok(response) if response.status == 200 => match parse_page(&response.body) {
                Some((events, next, at_head, behind)) => PageOutcome::Ok {
                    events,
                    next,
                    at_head,
                    behind,
                },
                None => PageOutcome::Error {
                    message: format!(
                        "200 with a page that does not parse: {}",
                        String::from_utf8_lossy(&response.body)
                    ),
                },
            },
            Ok(response) if response.status == 410 => match parse_stale(&response.body) {
                Some((lost, resume)) => PageOutcome::Stale { lost, resume },
                None => PageOutcome::Error {
                    message: "410 without lost ranges and resume".into(),
                },
            },
            Ok(response) => PageOutcome::Error {
                message: format!(
                    "status {}: {}",
                    response.status,
                    String::from_utf8_lossy(&response.body)
                ),
            },
            Err(error) => PageOutcome::Error {
                message: error.to_string(),
            },
        };
        let mut recorded = outcome.clone();
        let mut done = false;
        match &outcome {
            PageOutcome::Ok {
                events,
                next,
                at_head,
                ..
            } => {
                after = next.clone();
                done = final_walk && *at_head;
                let ripe = !planted && t_ms > 2_000 && events.len() >= 2;
                match plant {
                    Some(Plant::DropEvent) if ripe => {
                        if let PageOutcome::Ok { events, .. } = &mut recorded {
                            eprintln!(
                                "planted: reader {r} drops stream {} seq {} from its record",
                                events[0].stream, events[0].seq
                            );
                            events.remove(0);
                        }
                        planted = true;
                    }
                    Some(Plant::SkipCursor) if ripe => {
                        let last = events.last().expect("two events");
                        if let (Ok(mut cursor), Ok(stream)) =
                            (token::decode_text(next), last.stream.parse::<u64>())
                        {
                            let stream = StreamId::new(stream);
                            cursor.advance(stream, cursor.get(stream) + 1);
                            if let Ok(text) = token::encode_text(&cursor) {
                                eprintln!(
                                    "planted: reader {r} resumes past stream {} seq {}",
                                    last.stream,
                                    cursor.get(stream)
                                );
                                after = text;
                                planted = true;
                            }
                        }
                    }
                    _ => {}
                }
            }
            PageOutcome::Stale { resume, .. } => after = resume.clone(),
            PageOutcome::Error { .. } => node = rng.below(NODES as u64) as usize,
        }
        shared.record(&Record::Page {
            t_ms,
            reader: r,
            node: asked,
            after: sent,
            outcome: recorded,
        });
        if done {
            shared.record(&Record::ReaderDone {
                reader: r,
                at_head: true,
            });
            return;
        }
        if !final_walk {
            let pause = if slow {
                rng.between(100, 300)
            } else {
                rng.between(20, 60)
            };
            std::thread::sleep(Duration::from_millis(pause));
        } else if matches!(outcome, PageOutcome::Error { .. }) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Reads node `node` to the end, with its floor and digest.
fn final_read(node: usize) -> Record {
    let failed = |message: String| Record::FinalFailed { node, message };
    let started = Instant::now();
    let mut events = Vec::new();
    let mut after = String::new();
    loop {
        if started.elapsed() > FINAL_BOUND {
            return failed("the read did not reach the head in time".into());
        }
        let path = format!("/events?after={after}&limit=1000");
        let response =
            match request_from(Some(observer()), node_addr(node), "GET", &path, None, b"") {
                Ok(response) if response.status == 200 => response,
                // Compacted: what is gone is the floor's, recorded below.
                Ok(response) if response.status == 410 => match parse_stale(&response.body) {
                    Some((_, resume)) => {
                        after = resume;
                        continue;
                    }
                    None => return failed("410 without resume".into()),
                },
                Ok(response) => return failed(format!("status {}", response.status)),
                Err(error) => {
                    std::thread::sleep(Duration::from_millis(100));
                    if started.elapsed() > FINAL_BOUND {
                        return failed(error.to_string());
                    }
                    continue;
                }
            };
        let Some((page, next, at_head, _)) = parse_page(&response.body) else {
            return failed("a page that does not parse".into());
        };
        events.extend(page);
        after = next;
        if at_head {
            break;
        }
    }
    let marks = match request_from(
        Some(observer()),
        node_addr(node),
        "GET",
        "/marks",
        None,
        b"",
    ) {
        Ok(response) if response.status == 200 => response,
        Ok(response) => return failed(format!("marks: status {}", response.status)),
        Err(error) => return failed(format!("marks: {error}")),
    };
    let Ok(marks) = serde_json::from_slice::<Value>(&marks.body) else {
        return failed("marks: not JSON".into());
    };
    let floor = marks["floor"]
        .as_object()
        .map(|floor| {
            floor
                .iter()
                .filter_map(|(stream, seq)| Some((stream.clone(), seq.as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    Record::Final {
        node,
        events,
        floor,
        digest: marks["digest"].clone(),
        chains: marks["chains"].clone(),
    }
}
