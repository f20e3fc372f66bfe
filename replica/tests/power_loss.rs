//! The power-loss test: nothing acknowledged is lost when the machine loses
//! power, which `kill -9` (`crash.rs`) does not simulate — what a killed
//! process wrote is in the kernel's page cache and reaches the disk anyway.
//!
//! Each case runs a `DiskStore` over testkit's `PowerDisk`, a simulated
//! disk that keeps writes in memory until `sync_data`. A case lives several
//! power-ons. In each, the power goes off at a seeded operation (a write, a
//! length change or a sync) — during the open and its recovery, or in the
//! middle of a commit of the workload: appends of batches with payloads of
//! 0 bytes to 6 KiB, deltas from a simulated peer and from a sealing
//! writer (cut by seeded budgets), compactions — or, if
//! the workload ends first, while the store is idle. Then the disk keeps
//! only what was synced plus a seeded part of the rest: nothing, a prefix
//! in issue order, a prefix with the next write torn at a sector boundary,
//! or a random subset of the dirty pages with one torn (reordered writes).
//!
//! After every cut the store is reopened without `verify` (as a restart
//! does) and checked against what was acknowledged: every acknowledged own
//! event present and unchanged unless below an acknowledged floor, every
//! acknowledged peer event present, floors not fallen, the clock at or
//! above every acknowledged stamp, the next append on a fresh seq and a
//! higher stamp, and an event held beyond the acknowledged ones only if it
//! was the one in flight; the sealing writer's stream still pinned to its
//! key and relayed sealed at the head held, whatever the cut kept (the
//! seals are written in the commit of the events they seal). Then `verify` reads every event and must find
//! nothing: a cut never leaves damage inside a committed state
//! (`docs/STORAGE.md`, "Verify after an unclean shutdown"). Every reopen
//! after a cut must succeed: a typed `DiskError` would fail the test just
//! as a lost event would, since what was synced is all redb needs.
//!
//! 120 cases in the default run (`MESHLOG_POWER_CASES` for more); each
//! case's seed is printed on failure and `MESHLOG_SEED` replays it.

mod disk_support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use bytes::Bytes;
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Config, Delta, DiskError, DiskOptions, DiskStore, MemStore, Replica, ReplicaError, Store,
    WriterKey, DATA_FILE, SEGMENT_FILE,
};
use meshlog_testkit::{seed, PowerDisk, SplitMix64};

use disk_support::{peer_event, scratch, PEER};

const OWN: StreamId = StreamId::new(1);
const CASES_ENV: &str = "MESHLOG_POWER_CASES";
const CASES_DEFAULT: usize = 120;

/// What the test was told is durable: the model every reopen is checked
/// against.
#[derive(Default)]
struct Acked {
    /// Own events acknowledged: seq → (lamport, payload).
    own: BTreeMap<u64, (u64, Bytes)>,
    /// The own events of the append in flight when the power went off:
    /// they may or may not be on disk.
    in_flight: BTreeMap<u64, Bytes>,
    /// The highest peer seq whose delta was acknowledged.
    peer_head: u64,
    /// The highest own floor whose compaction was acknowledged.
    own_floor: u64,
    /// The highest stamp acknowledged.
    lamport: u64,
    /// The sealing writer, and its highest seq acknowledged.
    sealed: SealedWriter,
    sealed_head: u64,
}

/// A writer that seals its stream (`docs/SIGNING.md`), in memory: it
/// outlives the store's power cuts.
struct SealedWriter(Replica<MemStore>);

impl Default for SealedWriter {
    fn default() -> Self {
        let key = WriterKey::from_bytes([81; 32]);
        SealedWriter(Replica::open(Config::with_key(key), MemStore::default()).expect("opens"))
    }
}

/// Counts over the run, printed at the end.
#[derive(Default, Debug)]
struct Tally {
    cases: usize,
    power_ons: usize,
    cuts_in_open: usize,
    first_open_damaged: usize,
    cuts_in_workload: usize,
    cuts_idle: usize,
    rolled_back: usize,
    torn: u64,
    acked_events: usize,
    in_flight_found: usize,
    /// Sealed events held at the end of the cases (pinned, relayed sealed).
    sealed_events: u64,
    replayed: u64,
    torn_tails: u64,
}

/// The machine's two disks, which lose power together: the data file's
/// and the write-ahead segment's.
#[derive(Default)]
struct Disks {
    data: PowerDisk,
    segment: PowerDisk,
}

impl Disks {
    /// Arms the cut at the `op`-th operation of one disk (the other goes
    /// down with it, at `restore`).
    fn cut_at(&self, on_segment: bool, op: u64) {
        let (armed, other) = if on_segment {
            (&self.segment, &self.data)
        } else {
            (&self.data, &self.segment)
        };
        armed.cut_at(Some(op));
        other.cut_at(None);
    }

    fn disarm(&self) {
        self.data.cut_at(None);
        self.segment.cut_at(None);
    }

    fn is_cut(&self) -> bool {
        self.data.is_cut() || self.segment.is_cut()
    }

    /// Cuts the power of both (if still on), draws what each kept, and
    /// turns them on again.
    fn restore(&self, rng: &mut SplitMix64) -> String {
        let data = self.data.restore(rng);
        let segment = self.segment.restore(rng);
        format!("data file: {data}; segment: {segment}")
    }
}

#[test]
fn acknowledged_events_survive_power_loss() {
    let cases = std::env::var(CASES_ENV)
        .ok()
        .map(|text| {
            text.trim()
                .parse::<usize>()
                .unwrap_or_else(|_| panic!("{CASES_ENV}={text:?} is not a count"))
        })
        .unwrap_or(CASES_DEFAULT);
    let started = std::time::Instant::now();
    let mut tally = Tally::default();
    seed::for_each_seed(
        "acknowledged_events_survive_power_loss",
        0x90_4e11_0551,
        cases,
        |seed| run_case(seed, &mut tally),
    );
    eprintln!(
        "power loss: {} cases, {} power-ons; cuts: {} in open or recovery, {} in a commit, \
         {} idle; {} first opens found their file damaged (nothing acknowledged); {} reopens rolled back a torn commit; {} cuts left a torn write; \
         {} events acknowledged; {} in-flight events found on disk; {} commits replayed from \
         the segment; {} torn tail records cut; {} sealed events held; {:.1} s",
        tally.cases,
        tally.power_ons,
        tally.cuts_in_open,
        tally.cuts_in_workload,
        tally.cuts_idle,
        tally.first_open_damaged,
        tally.rolled_back,
        tally.torn,
        tally.acked_events,
        tally.in_flight_found,
        tally.replayed,
        tally.torn_tails,
        tally.sealed_events,
        started.elapsed().as_secs_f64(),
    );
    assert!(tally.sealed_events > 0, "no case took a sealed run");
}

fn run_case(seed: u64, tally: &mut Tally) {
    let mut rng = SplitMix64::new(seed);
    let dir = scratch();
    let mut disk = Disks::default();
    let mut opened_once = false;
    // The last open was cut before its closing checkpoint: redb's last
    // durable commit may then be its own repair's, which records no
    // allocator state, and the next open walks the file once more.
    let mut open_cut = false;
    let mut acked = Acked::default();
    // What happened, for the failure message.
    let mut story = String::new();
    let lives = rng.between(2, 5);
    tally.cases += 1;
    for life in 0..lives {
        tally.power_ons += 1;
        let options = DiskOptions {
            // Sometimes far smaller than the log, so reads cross the cache.
            cache_bytes: if rng.chance(0.5) { 1 << 20 } else { 16 << 10 },
            check_pages_on_open: rng.chance(0.5),
            // A checkpoint (a durable redb commit, then the segment emptied)
            // after every commit, every few, or seldom.
            checkpoint_records: [1, 3, 16, 1024][rng.below(4) as usize],
            ..DiskOptions::default()
        };
        // A new store's open creates the file and commits its format: a cut
        // there loses nothing acknowledged, and has no marker to refuse
        // with; it is part of the schedule too.
        // The power goes off at an operation of the data file's disk or of
        // the segment's (two per commit: the append and its sync).
        let on_segment = rng.chance(0.5);
        let cut = if on_segment {
            rng.between(1, 40)
        } else {
            rng.between(1, 160)
        };
        disk.cut_at(on_segment, cut);
        let _ = writeln!(
            story,
            "life {life}: {options:?}, cut armed at op {cut} of the {}",
            if on_segment { "segment" } else { "data file" }
        );
        // Every life before this one ended in a power cut, never a clean
        // close: once a store was opened, every reopen is unclean.
        let unclean = opened_once;
        let replica = match open(dir.path(), &options, &disk) {
            Ok(replica) => replica,
            Err(error) if disk.is_cut() => {
                tally.cuts_in_open += 1;
                open_cut = true;
                let _ = writeln!(story, "  the power went off in the open: {error}");
                let loss = disk.restore(&mut rng);
                let _ = writeln!(story, "  {loss}");
                continue;
            }
            // The very first open was cut before its format commit was
            // durable: no open ever returned, nothing was acknowledged, and
            // the file is whatever the cut left. A file store sets such a
            // file aside and starts over; a backend cannot be set aside,
            // so the open reports it (typed, naming the file) and the test
            // starts over on a new disk.
            Err(error) if !opened_once && error.contains("is damaged") => {
                tally.first_open_damaged += 1;
                let _ = writeln!(story, "  the first open's file is damaged: {error}");
                disk = Disks::default();
                continue;
            }
            Err(error) => {
                panic!("seed {seed}: the reopen after a power cut failed: {error}\n{story}")
            }
        };
        opened_once = true;
        // Recovery costs the segment's tail: redb opens on its last
        // checkpoint, whose allocator state it recorded, and walks no page
        // unless asked to.
        let recovery = replica.store().recovery();
        assert!(
            !recovery.pages_checked || options.check_pages_on_open || open_cut,
            "seed {seed}: a reopen after a power cut (unclean: {unclean}) walked every page\n{story}"
        );
        open_cut = false;
        tally.replayed += recovery.replayed;
        if recovery.torn_bytes > 0 {
            tally.torn_tails += 1;
            let _ = writeln!(story, "  cut a torn tail of {} bytes", recovery.torn_bytes);
        }
        if replica.store().recovery().rolled_back {
            tally.rolled_back += 1;
            let _ = writeln!(story, "  recovery rolled back a torn commit");
        }
        check_reopened(seed, &replica, &mut acked, &story, tally);
        let mut replica = replica;
        let cut_in_workload = workload(&mut rng, &mut replica, &mut acked, life, &disk, &mut story);
        if cut_in_workload {
            tally.cuts_in_workload += 1;
        } else {
            tally.cuts_idle += 1;
        }
        // The power goes off (now, if the workload ended first) before the
        // replica is dropped: its close must not reach the disk.
        let loss = disk.restore(&mut rng);
        let _ = writeln!(story, "  {loss}");
        drop(replica);
    }
    // The last power-on: no cut.
    disk.disarm();
    let replica = open(dir.path(), &DiskOptions::default(), &disk)
        .unwrap_or_else(|error| panic!("seed {seed}: the final reopen failed: {error}\n{story}"));
    check_reopened(seed, &replica, &mut acked, &story, tally);
    tally.torn += disk.data.stats().torn + disk.segment.stats().torn;
    tally.acked_events += acked.own.len();
    tally.sealed_events += acked.sealed_head;
}

fn open(dir: &Path, options: &DiskOptions, disk: &Disks) -> Result<Replica<DiskStore>, String> {
    let store =
        DiskStore::open_with_backends(dir, options, disk.data.backend(), disk.segment.backend())
            .map_err(|error| {
                // Whatever the cause, an error names the data file or the segment.
                let text = error.to_string();
                if !matches!(error, DiskError::Io { .. } | DiskError::Engine { .. }) {
                    assert!(
                        text.contains(&dir.join(DATA_FILE).display().to_string())
                            || text.contains(&dir.join(SEGMENT_FILE).display().to_string()),
                        "a store error that does not name the file: {text}"
                    );
                }
                format!("store: {text}")
            })?;
    Replica::open(Config::new(OWN), store).map_err(|error| format!("replica: {error}"))
}

/// Checks a reopened replica against what was acknowledged, then learns
/// what of the in-flight append reached the disk.
fn check_reopened(
    seed: u64,
    replica: &Replica<DiskStore>,
    acked: &mut Acked,
    story: &str,
    tally: &mut Tally,
) {
    let fail = |what: String| -> ! { panic!("seed {seed}: {what}\n{story}") };
    let marks = replica.marks();
    let floor = replica.floor();
    if floor.get(OWN) < acked.own_floor {
        fail(format!(
            "own floor fell from {} to {}",
            acked.own_floor,
            floor.get(OWN)
        ));
    }
    for (&seq, (lamport, payload)) in &acked.own {
        if seq <= floor.get(OWN) {
            continue;
        }
        match replica.get(OWN, seq) {
            Some(event) if event.lamport == *lamport && event.payload == *payload => {}
            Some(event) => fail(format!(
                "acknowledged own seq {seq} changed: lamport {} payload {:?}, expected {lamport} {:?}",
                event.lamport, event.payload, payload
            )),
            None => fail(format!(
                "acknowledged own seq {seq} lost (head {}, floor {})",
                marks.get(OWN),
                floor.get(OWN)
            )),
        }
    }
    let acked_head = acked.own.keys().next_back().copied().unwrap_or(0);
    // Held beyond what was acknowledged: only what was in flight.
    for seq in acked_head + 1..=marks.get(OWN) {
        let Some(payload) = acked.in_flight.get(&seq) else {
            fail(format!(
                "own seq {seq} is held but was neither acknowledged nor in flight"
            ));
        };
        match replica.get(OWN, seq) {
            Some(event) if event.payload == *payload => {
                acked.own.insert(seq, (event.lamport, event.payload));
                tally.in_flight_found += 1;
            }
            Some(event) if seq <= floor.get(OWN) => drop(event),
            other => fail(format!(
                "own seq {seq} in flight reads back as {other:?}, expected payload {payload:?}"
            )),
        }
    }
    acked.in_flight.clear();
    if marks.get(PEER) < acked.peer_head {
        fail(format!(
            "acknowledged peer events lost: head {} below {}",
            marks.get(PEER),
            acked.peer_head
        ));
    }
    for seq in floor.get(PEER) + 1..=marks.get(PEER) {
        if replica.get(PEER, seq) != Some(peer_event(seq)) {
            fail(format!("peer seq {seq} missing or changed"));
        }
    }
    acked.peer_head = marks.get(PEER);
    if let Err(what) = check_sealed(replica, acked) {
        fail(what);
    }
    acked.own_floor = floor.get(OWN);
    if replica.clock() < acked.lamport {
        fail(format!(
            "the clock fell to {} below the acknowledged stamp {}",
            replica.clock(),
            acked.lamport
        ));
    }
    // No damage inside the committed state: what `verify` would find is
    // what a cut must never leave.
    match replica.verify() {
        Ok(verified) => {
            let sealed = acked.sealed.0.stream();
            let held = (marks.get(OWN) - floor.get(OWN))
                + (marks.get(PEER) - floor.get(PEER))
                + (marks.get(sealed) - floor.get(sealed));
            if verified.events != held {
                fail(format!(
                    "verify counted {} events, the marks say {held}",
                    verified.events
                ));
            }
        }
        Err(error) => fail(format!("verify after the reopen found damage: {error}")),
    }
}

/// The sealing writer's stream, reopened: nothing acknowledged lost, the
/// key still pinned, and the head held sealed (relayed with its seal).
fn check_sealed(replica: &Replica<DiskStore>, acked: &mut Acked) -> Result<(), String> {
    let writer = &acked.sealed.0;
    let stream = writer.stream();
    let head = replica.marks().get(stream);
    if head < acked.sealed_head {
        return Err(format!(
            "acknowledged sealed events lost: head {head} below {}",
            acked.sealed_head
        ));
    }
    acked.sealed_head = head;
    if head == 0 {
        return Ok(());
    }
    let meta = replica.store().meta().expect("meta");
    let Some(kept) = meta.seals.get(&stream) else {
        return Err(format!(
            "the sealed stream (head {head}) is not pinned after the reopen"
        ));
    };
    if kept.key != WriterKey::from_bytes([81; 32]).public() {
        return Err(format!("the pin changed keys: {}", kept.key));
    }
    if kept.seals.last().map(|seal| seal.seq) != Some(head) {
        return Err(format!("no seal kept at the head {head}: {kept:?}"));
    }
    let relayed = replica.delta_for(&meta.floor, usize::MAX);
    if !relayed
        .seals
        .iter()
        .any(|s| s.seal.stream == stream && s.seal.seq == head)
    {
        return Err(format!(
            "the stream is not relayed sealed at its head {head}"
        ));
    }
    Ok(())
}

/// Runs seeded steps until the power goes off or the steps run out;
/// returns whether the power went off.
fn workload(
    rng: &mut SplitMix64,
    replica: &mut Replica<DiskStore>,
    acked: &mut Acked,
    life: u64,
    disk: &Disks,
    story: &mut String,
) -> bool {
    let steps = rng.between(4, 30);
    let mut first_append = true;
    for step in 0..steps {
        let roll = rng.below(10);
        let outcome: Result<(), ReplicaError> = if roll < 6 {
            let len = rng.between(1, 8);
            let payloads: Vec<Bytes> = (0..len).map(|n| payload(rng, life, step, n)).collect();
            let next = replica.marks().get(OWN) + 1;
            for (i, payload) in payloads.iter().enumerate() {
                acked.in_flight.insert(next + i as u64, payload.clone());
            }
            let result = replica.append_batch_at(payloads, step);
            result.map(|events| {
                if first_append {
                    // A fresh seq and a higher stamp than anything acknowledged.
                    let acked_head = acked.own.keys().next_back().copied().unwrap_or(0);
                    assert!(events[0].seq > acked_head, "{story}");
                    assert!(events[0].lamport > acked.lamport, "{story}");
                    first_append = false;
                }
                acked.in_flight.clear();
                for event in events {
                    acked.lamport = acked.lamport.max(event.lamport);
                    acked.own.insert(event.seq, (event.lamport, event.payload));
                }
            })
        } else if roll == 7 {
            let writer = &mut acked.sealed.0;
            for n in 0..rng.between(1, 12) {
                writer.append(payload(rng, life, step, n)).expect("append");
            }
            let budget = rng.between(500, 20_000) as usize;
            let delta = writer.delta_for(&replica.marks(), budget);
            let stream = writer.stream();
            replica.apply(&delta).map(|_| {
                acked.sealed_head = replica.marks().get(stream);
            })
        } else if roll < 8 {
            let from = replica.marks().get(PEER) + 1;
            let len = rng.between(1, 5);
            let events: Vec<_> = (from..from + len).map(peer_event).collect();
            let top = from + len - 1;
            let delta = Delta {
                floor_proofs: Default::default(),
                floor: VersionVector::new(),
                events,
                seals: Vec::new(),
            };
            replica.apply(&delta).map(|_| {
                acked.peer_head = top;
                acked.lamport = acked.lamport.max(peer_event(top).lamport);
            })
        } else {
            let head = replica.marks().get(OWN);
            let target_seq = rng.between(0, head);
            let mut target = VersionVector::new();
            target.advance(OWN, target_seq);
            replica.compact(&target).map(|_| {
                acked.own_floor = acked.own_floor.max(target_seq.min(head));
            })
        };
        match outcome {
            Ok(()) => {}
            Err(error) if disk.is_cut() => {
                let _ = writeln!(story, "  step {step}: the power went off: {error}");
                return true;
            }
            Err(error) => panic!("step {step}: failed with the power on: {error}\n{story}"),
        }
    }
    let _ = writeln!(story, "  {steps} steps done, the power goes off idle");
    false
}

/// A payload naming where it came from, 0 bytes to 6 KiB.
fn payload(rng: &mut SplitMix64, life: u64, step: u64, n: u64) -> Bytes {
    let mut text = format!("l{life}s{step}n{n}:").into_bytes();
    let len = match rng.below(8) {
        0 => 0,
        1 => rng.between(1_000, 6_000) as usize,
        _ => rng.between(1, 200) as usize,
    };
    text.resize(len.max(text.len()), b'a' + (n % 26) as u8);
    if len == 0 {
        text.clear();
    }
    Bytes::from(text)
}
