//! The replica's model test: random schedules of appends on random replicas,
//! deltas sent with small budgets and then delivered late, twice, out of
//! order or never, partitions and heals, compactions, restarts from the
//! store, and readers that page from one replica and then switch to another.
//!
//! A reference model (every event ever appended, and per reader what it was
//! returned and what it was told it lost) is checked after every step:
//! each replica holds exactly a gap-free prefix per stream above its floor,
//! with the events' true content, and a digest equal to its held events';
//! each page is ordered, new to its reader, and resumes where it should; a
//! stale report names exactly the streams where the cursor is below the
//! floor; a peer's floor never drops an event a replica holds. At the end
//! everything is healed (a replica behind on a stream whose next event no
//! replica holds gives it up by compacting it): replicas converge (equal
//! marks, and equal digests once compacted to one floor), and every reader
//! gets every event exactly once unless it was told it lost it.
//!
//! Seeded: `MESHLOG_SEED=<n>` replays a failing run; `MESHLOG_QC_TESTS=<n>`
//! runs more cases than the default 2,000.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{held, push};
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Config, Delta, DiskStore, Event, MemStore, PageError, Replica, Store};
use meshlog_testkit::seed::{self, with_seed};
use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};

const READERS: usize = 2;

#[derive(Clone, Debug)]
enum Op {
    Append {
        replica: u8,
    },
    /// Sends a delta; an optimistic sender assumes what it already has in
    /// flight to the target arrives (as sync does), which creates holes when
    /// frames are then lost or reordered.
    Send {
        from: u8,
        to: u8,
        budget: u16,
        optimistic: bool,
    },
    Deliver {
        index: u8,
        twice: bool,
    },
    Lose {
        index: u8,
    },
    Partition {
        a: u8,
        b: u8,
    },
    Compact {
        replica: u8,
        keep_last: u8,
    },
    Page {
        reader: u8,
        replica: u8,
        limit: u8,
    },
    Restart {
        replica: u8,
    },
}

impl Arbitrary for Op {
    fn arbitrary(g: &mut Gen) -> Self {
        let pick = |g: &mut Gen, n: u8| u8::arbitrary(g) % n;
        match pick(g, 20) {
            0..=4 => Op::Append {
                replica: u8::arbitrary(g),
            },
            5..=8 => Op::Send {
                from: u8::arbitrary(g),
                to: u8::arbitrary(g),
                budget: 40 + u16::arbitrary(g) % 400,
                optimistic: bool::arbitrary(g),
            },
            9..=11 => Op::Deliver {
                index: u8::arbitrary(g),
                twice: pick(g, 4) == 0,
            },
            12 => Op::Lose {
                index: u8::arbitrary(g),
            },
            13 => Op::Partition {
                a: u8::arbitrary(g),
                b: u8::arbitrary(g),
            },
            14 => Op::Compact {
                replica: u8::arbitrary(g),
                keep_last: pick(g, 6),
            },
            15..=18 => Op::Page {
                reader: u8::arbitrary(g),
                replica: u8::arbitrary(g),
                limit: 1 + pick(g, 5),
            },
            _ => Op::Restart {
                replica: u8::arbitrary(g),
            },
        }
    }
}

#[derive(Clone, Debug)]
struct Schedule {
    replicas: u8,
    ops: Vec<Op>,
}

impl Arbitrary for Schedule {
    fn arbitrary(g: &mut Gen) -> Self {
        Schedule {
            replicas: 2 + u8::arbitrary(g) % 3,
            ops: Vec::arbitrary(g),
        }
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        let replicas = self.replicas;
        Box::new(self.ops.shrink().map(move |ops| Schedule { replicas, ops }))
    }
}

#[derive(Default)]
struct Reader {
    cursor: VersionVector,
    seen: BTreeSet<(StreamId, u64)>,
    /// Events a stale report said were compacted before this reader saw them.
    excused: BTreeSet<(StreamId, u64)>,
}

/// Where the model's replicas keep their events, and how a restart reopens
/// them: the in-memory store, or the durable one reopened from its files.
trait Backend {
    type Store: Store;
    fn create(&mut self, config: Config) -> Replica<Self::Store>;
    fn reopen(&mut self, config: Config, store: Self::Store) -> Replica<Self::Store>;
}

struct Memory {
    pending_events_max: Option<usize>,
}

impl Backend for Memory {
    type Store = MemStore;

    fn create(&mut self, mut config: Config) -> Replica<MemStore> {
        if let Some(max) = self.pending_events_max {
            config.pending_events_max = max;
        }
        Replica::open(config, MemStore::default()).unwrap()
    }

    fn reopen(&mut self, config: Config, store: MemStore) -> Replica<MemStore> {
        Replica::open(config, store).unwrap()
    }
}

/// Each replica in a directory of its own, removed with the backend.
#[derive(Default)]
struct Disk {
    dirs: Vec<tempfile::TempDir>,
}

impl Backend for Disk {
    type Store = DiskStore;

    fn create(&mut self, config: Config) -> Replica<DiskStore> {
        let dir = tempfile::tempdir().unwrap();
        let store = DiskStore::open(dir.path()).unwrap();
        self.dirs.push(dir);
        Replica::open(config, store).unwrap()
    }

    fn reopen(&mut self, config: Config, store: DiskStore) -> Replica<DiskStore> {
        // Close the files (and the directory lock), then recover from disk.
        let dir = store.dir().to_path_buf();
        drop(store);
        Replica::open(config, DiskStore::open(&dir).unwrap()).unwrap()
    }
}

struct World<B: Backend> {
    backend: B,
    replicas: Vec<Replica<B::Store>>,
    cut: BTreeSet<(usize, usize)>,
    in_flight: Vec<(usize, Delta)>,
    reference: BTreeMap<(StreamId, u64), Event>,
    readers: Vec<Reader>,
    time_ms: u64,
}

impl<B: Backend> World<B> {
    fn new(n: usize, mut backend: B) -> Self {
        let replicas = (1..=n as u64)
            .map(|id| backend.create(Config::new(StreamId::new(id))))
            .collect();
        World {
            backend,
            replicas,
            cut: BTreeSet::new(),
            in_flight: Vec::new(),
            reference: BTreeMap::new(),
            readers: (0..READERS).map(|_| Reader::default()).collect(),
            time_ms: 1_000,
        }
    }

    fn step(&mut self, op: &Op) {
        let n = self.replicas.len();
        match *op {
            Op::Append { replica } => {
                self.time_ms += 1;
                let r = &mut self.replicas[replica as usize % n];
                let event = r
                    .append_at(self.time_ms.to_le_bytes().to_vec(), self.time_ms)
                    .unwrap();
                assert!(
                    self.reference
                        .insert((event.stream, event.seq), event)
                        .is_none(),
                    "seq reused"
                );
            }
            Op::Send {
                from,
                to,
                budget,
                optimistic,
            } => {
                let (from, to) = (from as usize % n, to as usize % n);
                if from != to && !self.cut.contains(&(from.min(to), from.max(to))) {
                    let mut believed = self.replicas[to].marks();
                    if optimistic {
                        for (_, delta) in self.in_flight.iter().filter(|(t, _)| *t == to) {
                            for e in &delta.events {
                                believed.advance(e.stream, e.seq);
                            }
                        }
                    }
                    let delta = self.replicas[from].delta_for(&believed, budget as usize);
                    self.in_flight.push((to, delta));
                }
            }
            Op::Deliver { index, twice } => {
                if !self.in_flight.is_empty() {
                    let index = index as usize % self.in_flight.len();
                    let (to, delta) = if twice {
                        self.in_flight[index].clone()
                    } else {
                        self.in_flight.swap_remove(index)
                    };
                    let target = &mut self.replicas[to];
                    let (marks, floor) = (target.marks(), target.floor());
                    let report = target.apply(&delta).unwrap();
                    // A peer's floor never drops an event the receiver
                    // holds: a floor rises only on a stream held nothing
                    // of above it (docs/SIGNING.md, issue 29).
                    for (stream, head) in marks.iter() {
                        if head > floor.get(stream) {
                            assert_eq!(
                                target.floor().get(stream),
                                floor.get(stream),
                                "a peer's floor dropped held events of {stream}: {report:?}"
                            );
                        }
                    }
                }
            }
            Op::Lose { index } => {
                if !self.in_flight.is_empty() {
                    let index = index as usize % self.in_flight.len();
                    self.in_flight.swap_remove(index);
                }
            }
            Op::Partition { a, b } => {
                let (a, b) = (a as usize % n, b as usize % n);
                let key = (a.min(b), a.max(b));
                if !self.cut.remove(&key) {
                    self.cut.insert(key);
                }
            }
            Op::Compact { replica, keep_last } => {
                let r = &mut self.replicas[replica as usize % n];
                let target: VersionVector = r
                    .marks()
                    .iter()
                    .map(|(s, head)| (s, head.saturating_sub(keep_last as u64)))
                    .collect();
                let before = r.floor();
                r.compact(&target).unwrap();
                for (s, seq) in target.iter() {
                    assert_eq!(
                        r.floor().get(s),
                        seq.max(before.get(s)),
                        "floor after compact"
                    );
                }
            }
            Op::Page {
                reader,
                replica,
                limit,
            } => {
                let r = &self.replicas[replica as usize % n];
                let reader = &mut self.readers[reader as usize % READERS];
                page(reader, r, limit as usize, &self.reference);
            }
            Op::Restart { replica } => {
                let index = replica as usize % n;
                let old = self.replicas.remove(index);
                let config = old.config().clone();
                let (marks, floor, digest, clock) =
                    (old.marks(), old.floor(), old.digest(), old.clock());
                let reopened = self.backend.reopen(config, old.into_store());
                // The pending buffer is volatile; everything visible survives,
                // and the clock never goes back.
                assert_eq!(
                    (reopened.marks(), reopened.floor(), reopened.digest()),
                    (marks, floor, digest)
                );
                assert!(reopened.clock() >= clock, "clock after reopen");
                self.replicas.insert(index, reopened);
            }
        }
        self.check_replicas();
    }

    /// Invariant 2 and the digest, on every replica, against the reference.
    fn check_replicas(&self) {
        for r in &self.replicas {
            let floor = r.floor();
            let mut events = 0u64;
            let mut sum = 0u128;
            for (stream, head) in r.marks().iter() {
                let mut lamport = 0;
                for seq in floor.get(stream) + 1..=head {
                    let event = r
                        .get(stream, seq)
                        .unwrap_or_else(|| panic!("hole at {stream}:{seq}"));
                    assert_eq!(
                        Some(&event),
                        self.reference.get(&(stream, seq)),
                        "content of {stream}:{seq}"
                    );
                    assert!(event.lamport > lamport, "lamport rises with seq");
                    lamport = event.lamport;
                    events += 1;
                    sum = sum.wrapping_add(event.content_hash());
                }
            }
            assert_eq!(
                (r.digest().events, r.digest().sum),
                (events, sum),
                "digest of held events"
            );
        }
    }

    /// Heals every link and exchanges until quiescent, then checks
    /// convergence and that every reader gets every event exactly once
    /// unless it was told it lost it.
    ///
    /// A peer's floor never erases what a replica holds, so a replica can
    /// be behind every other's floor on a stream: no replica holds its
    /// next event. It then records the gap as lost by compacting what it
    /// holds of the stream (its own decision, as an operator's), and the
    /// next exchange raises its floor to the peers'.
    fn heal_and_check(&mut self) {
        let n = self.replicas.len();
        for round in 0..=n {
            if round > 0 {
                self.give_up_what_no_one_holds();
            }
            for from in 0..n {
                for to in 0..n {
                    if from != to {
                        let (source, target) = pair(&mut self.replicas, from, to);
                        push(source, target, 300);
                    }
                }
            }
        }
        let marks = self.replicas[0].marks();
        let mut floor = VersionVector::new();
        for r in &self.replicas {
            assert_eq!(r.marks(), marks, "marks converge");
            floor.join(&r.floor());
        }
        for r in &mut self.replicas {
            r.compact(&floor).unwrap();
        }
        let digest = self.replicas[0].digest();
        for r in &self.replicas {
            assert_eq!(
                r.digest(),
                digest,
                "digests converge once compacted to one floor"
            );
            assert_eq!(held(r).len() as u64, digest.events);
        }
        let all: BTreeSet<_> = self.reference.keys().copied().collect();
        for (i, reader) in self.readers.iter_mut().enumerate() {
            let r = &self.replicas[i % n];
            for _ in 0..10_000 {
                if page(reader, r, 3, &self.reference) {
                    break;
                }
            }
            assert!(reader.seen.is_disjoint(&reader.excused));
            let union: BTreeSet<_> = reader.seen.union(&reader.excused).copied().collect();
            assert_eq!(
                union, all,
                "reader {i} got every event once or was told it lost it"
            );
        }
    }
}

impl<B: Backend> World<B> {
    /// Every replica behind on a stream whose next event no replica holds
    /// (each is at or below it, or compacted past it) compacts the stream
    /// to its head.
    fn give_up_what_no_one_holds(&mut self) {
        let marks: Vec<VersionVector> = self.replicas.iter().map(|r| r.marks()).collect();
        let floors: Vec<VersionVector> = self.replicas.iter().map(|r| r.floor()).collect();
        let mut streams = VersionVector::new();
        for m in &marks {
            streams.join(m);
        }
        for (i, r) in self.replicas.iter_mut().enumerate() {
            let mut target = VersionVector::new();
            for (stream, top) in streams.iter() {
                let head = marks[i].get(stream);
                let served = (0..marks.len())
                    .any(|q| floors[q].get(stream) <= head && marks[q].get(stream) > head);
                if head < top && !served {
                    target.advance(stream, head);
                }
            }
            r.compact(&target).unwrap();
        }
    }
}

/// One page for `reader` on `r`, checked. Returns whether it reached the head.
fn page<S: Store>(
    reader: &mut Reader,
    r: &Replica<S>,
    limit: usize,
    reference: &BTreeMap<(StreamId, u64), Event>,
) -> bool {
    match r.page(&reader.cursor, limit) {
        Ok(page) => {
            let mut next = reader.cursor.clone();
            let mut last = None;
            for event in &page.events {
                let key = (event.lamport, event.stream);
                assert!(last < Some(key), "page order");
                last = Some(key);
                assert!(
                    !reader.cursor.covers(event.stream, event.seq),
                    "returned a covered event"
                );
                assert!(
                    reader.seen.insert((event.stream, event.seq)),
                    "returned twice"
                );
                assert!(
                    !reader.excused.contains(&(event.stream, event.seq)),
                    "returned a lost event"
                );
                assert_eq!(Some(event), reference.get(&(event.stream, event.seq)));
                next.advance(event.stream, event.seq);
            }
            assert!(page.events.len() <= limit);
            assert_eq!(page.next, next, "next = cursor joined with the page");
            assert_eq!(page.at_head, next.dominates(&r.marks()), "at_head");
            reader.cursor = page.next;
            page.at_head
        }
        Err(PageError::Stale(stale)) => {
            let floor = r.floor();
            let expected: Vec<_> = floor
                .iter()
                .filter(|&(s, f)| reader.cursor.get(s) < f)
                .map(|(s, f)| (s, reader.cursor.get(s) + 1..=f))
                .collect();
            let got: Vec<_> = stale.lost().iter().map(|l| (l.stream, l.seqs())).collect();
            assert_eq!(
                got, expected,
                "stale report names exactly the ranges below the floor"
            );
            for (stream, seqs) in got {
                for seq in seqs {
                    assert!(
                        !reader.seen.contains(&(stream, seq)),
                        "reported lost but was returned"
                    );
                    reader.excused.insert((stream, seq));
                }
            }
            reader.cursor = stale.resume().clone();
            false
        }
        Err(other) => panic!("unexpected page error {other:?}"),
    }
}

fn pair<S: Store>(
    replicas: &mut [Replica<S>],
    from: usize,
    to: usize,
) -> (&Replica<S>, &mut Replica<S>) {
    assert_ne!(from, to);
    if from < to {
        let (left, right) = replicas.split_at_mut(to);
        (&left[from], &mut right[0])
    } else {
        let (left, right) = replicas.split_at_mut(from);
        (&right[0], &mut left[to])
    }
}

fn run_on<B: Backend>(schedule: &Schedule, backend: B) {
    let mut world = World::new(schedule.replicas as usize, backend);
    for op in &schedule.ops {
        world.step(op);
    }
    world.heal_and_check();
}

fn run(schedule: Schedule) -> TestResult {
    run_on(
        &schedule,
        Memory {
            pending_events_max: None,
        },
    );
    TestResult::passed()
}

fn run_on_disk(schedule: Schedule) -> TestResult {
    run_on(&schedule, Disk::default());
    TestResult::passed()
}

#[test]
fn model_replicas_converge_and_walks_are_exactly_once_or_told_stale() {
    let tests: u64 = std::env::var("MESHLOG_QC_TESTS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2_000);
    with_seed("model", seed::fresh(), |seed| {
        QuickCheck::new()
            .rng(Gen::from_size_and_seed(80, seed))
            .tests(tests)
            .max_tests(tests * 2)
            .quickcheck(run as fn(Schedule) -> TestResult);
    });
}

/// A small replica config is enough for the model: keep it the default, but
/// make sure the pending buffer's overflow path is reachable too.
#[test]
fn model_with_a_tiny_pending_buffer_still_converges() {
    with_seed("model-tiny-pending", seed::fresh(), |seed| {
        let mut g = Gen::from_size_and_seed(60, seed);
        for _ in 0..200 {
            let schedule = Schedule::arbitrary(&mut g);
            let backend = Memory {
                pending_events_max: Some(1),
            };
            run_on(&schedule, backend);
        }
    });
}

/// The same model on the durable store, where a restart closes the files and
/// recovers from them. Every commit is fsynced, so fewer cases run by
/// default (`MESHLOG_QC_DISK_TESTS` for more).
#[test]
fn model_on_the_durable_store_with_reopen_converges() {
    let tests: u64 = std::env::var("MESHLOG_QC_DISK_TESTS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(100);
    with_seed("model-disk", seed::fresh(), |seed| {
        QuickCheck::new()
            .rng(Gen::from_size_and_seed(40, seed))
            .tests(tests)
            .max_tests(tests * 2)
            .quickcheck(run_on_disk as fn(Schedule) -> TestResult);
    });
}
