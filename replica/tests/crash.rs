//! The crash test: nothing acknowledged is lost to `kill -9`.
//!
//! A child process (this test binary run again, into `crash_child_process`)
//! opens a replica on `DiskStore` in a shared data directory and, through
//! `SharedReplica` (group commit), appends from four threads; it also receives events from a
//! simulated peer (stamped far above its own clock) and compacts its own
//! stream now and then. It prints a line for each of these only after the
//! call returned, i.e. after the store commit: `ack`, `seen`, `floor`.
//!
//! The parent kills the child with SIGKILL at seeded random moments — during
//! recovery, or after a seeded number of acknowledgements plus a seeded
//! delay — then reopens the directory and checks: every acknowledged own
//! event and every seen peer event is present, unchanged (or below a floor
//! that was acknowledged); the floor did not fall; the replica's open
//! checks (no hole, lamport rising, clock at or above every stamp) hold;
//! the clock is at or above every stamp acknowledged; and the next append
//! takes a fresh seq and a higher lamport. Then the next child continues the
//! same log. 50 kills in the default run (`MESHLOG_CRASH_KILLS` for more);
//! the seed is printed on failure and `MESHLOG_SEED` replays the schedule.
//!
//! SIGKILL ends the process but not the machine: writes that reached the
//! kernel survive it. So this test proves that the store and the replica
//! acknowledge only what they committed and recover to a consistent state
//! from any point of a commit or of recovery; power loss adds the fsync,
//! which every commit does (the segment's `fdatasync`). A commit is
//! appended to the write-ahead segment and folded into redb; the child
//! checkpoints every 3, every 40 or every 1,024 commits by round, so kills
//! land in appends, folds, checkpoints and replays.

mod disk_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Config, Delta, DiskOptions, DiskStore, Replica, SharedReplica, CHECKPOINT_RECORDS_DEFAULT,
};
use meshlog_testkit::{seed, SplitMix64};

use disk_support::{peer_event, scratch, PEER};

const OWN: StreamId = StreamId::new(1);
const DIR_ENV: &str = "MESHLOG_CRASH_CHILD_DIR";
const ROUND_ENV: &str = "MESHLOG_CRASH_CHILD_ROUND";
const APPENDERS: usize = 4;

/// The child: runs only when started by `acknowledged_events_survive_sigkill`
/// (with `DIR_ENV` set) and passes trivially otherwise. It never returns on
/// its own before the parent kills it (a 30 s guard ends an orphan).
#[test]
fn crash_child_process() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return;
    };
    // The harness has printed `test crash_child_process ... ` without a
    // newline: end that line, so that our first line (an `error` line if the
    // open fails) reaches the parent whole and is not taken for the
    // harness's.
    println!();
    let round: u64 = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let fail = |what: &str| -> ! {
        println!("error {what}");
        std::process::exit(2)
    };
    // Checkpoints (a durable redb commit, then the segment emptied) every
    // few commits in some rounds, so that kills land in them too.
    let options = DiskOptions {
        checkpoint_records: [3, 40, CHECKPOINT_RECORDS_DEFAULT][(round % 3) as usize],
        ..DiskOptions::default()
    };
    let store =
        DiskStore::open_with(&dir, &options).unwrap_or_else(|e| fail(&format!("open: {e}")));
    let replica =
        Replica::open(Config::new(OWN), store).unwrap_or_else(|e| fail(&format!("recover: {e}")));
    let group = SharedReplica::new(replica);
    println!("ready");
    for thread in 0..APPENDERS {
        let group = group.clone();
        std::thread::spawn(move || {
            for n in 0.. {
                let payload = format!("r{round}t{thread}n{n}");
                match group.append(payload.clone()) {
                    Ok(event) => println!("ack {} {} {payload}", event.seq, event.lamport),
                    Err(error) => fail(&format!("append: {error}")),
                }
            }
        });
    }
    let started = Instant::now();
    for tick in 0u64.. {
        if started.elapsed() > Duration::from_secs(30) {
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(1));
        if tick % 25 == 24 {
            let floor_seq = group.marks().get(OWN).saturating_sub(30);
            let target: VersionVector = [(OWN, floor_seq)].into_iter().collect();
            let floor = group.compact(&target).map(|_| group.floor().get(OWN));
            match floor {
                Ok(floor) => println!("floor {floor}"),
                Err(error) => fail(&format!("compact: {error}")),
            }
        } else {
            // Only this thread applies peer events, so the mark read here
            // is still the head when the delta is applied.
            let event = peer_event(group.marks().get(PEER) + 1);
            let delta = Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events: vec![event.clone()],
                seals: Vec::new(),
            };
            let seen = group.apply(delta).map(|_| event);
            match seen {
                Ok(event) => println!("seen {} {}", event.seq, event.lamport),
                Err(error) => fail(&format!("apply: {error}")),
            }
        }
    }
}

/// What the children acknowledged, over all rounds.
#[derive(Debug, Default)]
struct Acknowledged {
    /// Own events: seq → (lamport, payload).
    own: BTreeMap<u64, (u64, String)>,
    /// Peer events seen: seq → lamport.
    peer: BTreeMap<u64, u64>,
    /// The highest own floor acknowledged.
    floor: u64,
    /// The highest lamport acknowledged or seen.
    lamport: u64,
    /// Reopens where redb fell back from a torn newest commit.
    rolled_back: u64,
    /// Commits replayed from the segment over all reopens.
    replayed: u64,
    /// Reopens that cut a torn record from the segment's tail.
    torn: u64,
}

impl Acknowledged {
    /// Records one complete line of the child's output. Returns whether it
    /// was an acknowledgement.
    fn record(&mut self, line: &str) -> Result<bool, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| -> Result<u64, String> {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| format!("malformed line {line:?}"))
        };
        match words.first().copied() {
            Some("ack") => {
                let (seq, lamport) = (number(1)?, number(2)?);
                let payload = words.get(3).ok_or("ack without payload")?.to_string();
                if let Some(old) = self.own.insert(seq, (lamport, payload.clone())) {
                    return Err(format!(
                        "seq {seq} acknowledged twice: {old:?} and {payload}"
                    ));
                }
                self.lamport = self.lamport.max(lamport);
                Ok(true)
            }
            Some("seen") => {
                let (seq, lamport) = (number(1)?, number(2)?);
                self.peer.insert(seq, lamport);
                self.lamport = self.lamport.max(lamport);
                Ok(true)
            }
            Some("floor") => {
                self.floor = self.floor.max(number(1)?);
                Ok(true)
            }
            Some("ready") => Ok(false),
            Some("error") => Err(format!("child failed: {line}")),
            // The test harness's own lines.
            _ => Ok(false),
        }
    }
}

#[test]
fn acknowledged_events_survive_sigkill() {
    let seed = seed::fresh();
    let _report = seed::Report::new("acknowledged_events_survive_sigkill", seed);
    let mut rng = SplitMix64::new(seed);
    let kills: u64 = std::env::var("MESHLOG_CRASH_KILLS")
        .ok()
        .map_or(50, |text| {
            text.parse().expect("MESHLOG_CRASH_KILLS is a number")
        });
    let dir = scratch();
    let exe = std::env::current_exe().unwrap();
    let mut acknowledged = Acknowledged::default();
    let mut kills_after_acks = 0;
    let started = Instant::now();

    for round in 0..kills {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, dir.path())
            .env(ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the child");
        let stdout = child.stdout.take().unwrap();
        let (lines_tx, lines) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout);
            let mut line = String::new();
            // Only complete lines count: the child may die mid-line.
            while stdout.read_line(&mut line).unwrap_or(0) > 0 {
                if line.ends_with('\n') && lines_tx.send(line.clone()).is_err() {
                    break;
                }
                line.clear();
            }
        });

        // When to kill: early (likely during the child's open and recovery,
        // which may be repairing the last kill), or after some acks.
        let early = rng.below(8) == 0;
        let mut acks_wanted = if early { 0 } else { rng.between(1, 200) };
        let delay = if early {
            Duration::from_millis(rng.below(40))
        } else {
            Duration::from_micros(rng.below(3_000))
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while acks_wanted > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if acknowledged
                        .record(&line)
                        .unwrap_or_else(|e| panic!("round {round}: {e}"))
                        && line.starts_with("ack")
                    {
                        acks_wanted -= 1;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    panic!("round {round}: the child stopped acknowledging for 20 s");
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = child.kill();
                    let status = child.wait();
                    panic!("round {round}: the child ended on its own: {status:?}");
                }
            }
        }
        std::thread::sleep(delay);
        child.kill().expect("SIGKILL the child");
        let status = child.wait().unwrap();
        reader.join().unwrap();
        for line in lines.try_iter() {
            acknowledged
                .record(&line)
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        assert_eq!(
            status.signal(),
            Some(9),
            "round {round}: the child ended on its own: {status}"
        );
        if !early {
            kills_after_acks += 1;
        }

        // A child killed after it acknowledged had the store open: its
        // shutdown was unclean, and the reopen must have run redb's
        // recovery (the check of every page that finds a torn commit).
        check_recovery(dir.path(), round, &mut acknowledged, !early);
    }
    assert!(acknowledged.own.len() as u64 >= kills / 2, "too few acks");
    assert!(kills_after_acks >= kills / 2);
    eprintln!(
        "{kills} kills in {:?}: {} own events and {} peer events acknowledged, floor {}, \
         {} reopens fell back from a torn commit, {} commits replayed from the segment, \
         {} reopens cut a torn tail record",
        started.elapsed(),
        acknowledged.own.len(),
        acknowledged.peer.len(),
        acknowledged.floor,
        acknowledged.rolled_back,
        acknowledged.replayed,
        acknowledged.torn
    );
}

/// Reopens the directory after a kill and checks everything acknowledged;
/// then appends once, checking the seq and lamport are fresh.
fn check_recovery(dir: &Path, round: u64, acknowledged: &mut Acknowledged, unclean: bool) {
    // Replica::open trusts what the store recorded at its last commit;
    // verify then reads every event and checks the invariants (no hole,
    // lamport rising with seq, every stamp at or below the recorded clock)
    // and that the recorded digest equals a full recount.
    let store = DiskStore::open(dir).unwrap_or_else(|e| panic!("round {round}: open: {e}"));
    let recovery = store.recovery();
    acknowledged.rolled_back += u64::from(recovery.rolled_back);
    acknowledged.replayed += recovery.replayed;
    acknowledged.torn += u64::from(recovery.torn_bytes > 0);
    // Recovery costs the segment's tail, not the file: redb opens on its
    // last checkpoint, whose allocator state it recorded, and walks no
    // page (`docs/STORAGE.md`), killed while open or not.
    assert!(
        !recovery.pages_checked,
        "round {round} (unclean: {unclean}): the reopen walked every page of the data file"
    );
    let mut replica = Replica::open(Config::new(OWN), store)
        .unwrap_or_else(|e| panic!("round {round}: recover: {e}"));
    let verified = replica
        .verify()
        .unwrap_or_else(|e| panic!("round {round}: verify after the kill: {e}"));
    assert_eq!(verified.events, replica.digest().events, "round {round}");
    let floor = replica.floor().get(OWN);
    assert!(
        floor >= acknowledged.floor,
        "round {round}: floor {floor} below the acknowledged {}",
        acknowledged.floor
    );
    for (&seq, (lamport, payload)) in &acknowledged.own {
        if seq <= floor {
            continue;
        }
        let held = replica
            .get(OWN, seq)
            .unwrap_or_else(|| panic!("round {round}: acknowledged seq {seq} lost"));
        assert_eq!(held.lamport, *lamport, "round {round}: seq {seq}");
        assert_eq!(held.payload, payload.as_bytes(), "round {round}: seq {seq}");
    }
    let peer_floor = replica.floor().get(PEER);
    for (&seq, &lamport) in &acknowledged.peer {
        if seq <= peer_floor {
            continue;
        }
        let held = replica
            .get(PEER, seq)
            .unwrap_or_else(|| panic!("round {round}: seen peer seq {seq} lost"));
        assert_eq!(held, peer_event(seq));
        assert_eq!(held.lamport, lamport);
    }
    let clock = replica.clock();
    assert!(
        clock >= acknowledged.lamport,
        "round {round}: clock {clock} below an acknowledged stamp {}",
        acknowledged.lamport
    );
    let head = replica.marks().get(OWN);
    let last_acknowledged = acknowledged.own.keys().next_back().copied().unwrap_or(0);
    assert!(head >= last_acknowledged, "round {round}: head {head}");

    let payload = format!("parent{round}");
    let next = replica.append(payload.clone()).unwrap();
    assert_eq!(next.seq, head + 1, "round {round}");
    assert!(next.seq > last_acknowledged, "round {round}: seq reused");
    assert!(
        next.lamport > clock,
        "round {round}: lamport not above clock"
    );
    acknowledged
        .record(&format!("ack {} {} {payload}", next.seq, next.lamport))
        .unwrap();
}
