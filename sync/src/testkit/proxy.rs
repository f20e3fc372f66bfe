//! The frame-level fault proxy: in memory ([`FaultLink`]) and over TCP
//! ([`FaultProxy`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use meshlog_testkit::SplitMix64;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep_until, Instant};

use crate::FrameReader;

/// How a link mistreats the frames that cross it. Probabilities are per
/// frame, in `[0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Faults {
    /// A frame is lost.
    pub drop: f64,
    /// A frame is delivered twice (the copy with its own random delay).
    pub duplicate: f64,
    /// A frame is held for up to `delay_ms_max`, in order: later frames wait
    /// behind it.
    pub delay: f64,
    /// A frame is held for up to `delay_ms_max` out of order: later frames
    /// overtake it.
    pub reorder: f64,
    /// The longest delay, in milliseconds.
    pub delay_ms_max: u64,
}

impl Faults {
    /// A perfect link.
    pub fn none() -> Self {
        Faults::default()
    }

    /// Rates drawn from `rng`, as a simulator draws a schedule's fault
    /// profile per seed: drop up to `drop_max`, duplicate up to 20%, delay and
    /// reorder up to 30%, delays up to `delay_ms_max`.
    pub fn random(rng: &mut SplitMix64, drop_max: f64, delay_ms_max: u64) -> Self {
        Faults {
            drop: rng.unit() * drop_max,
            duplicate: rng.unit() * 0.2,
            delay: rng.unit() * 0.3,
            reorder: rng.unit() * 0.3,
            delay_ms_max: 1 + rng.below(delay_ms_max.max(1)),
        }
    }
}

/// A direction across a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the side that connected (the first end of [`FaultLink::connect`],
    /// the TCP client of a [`FaultProxy`]) to the other.
    Forward,
    /// Back.
    Backward,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::Forward => 0,
            Direction::Backward => 1,
        }
    }
}

/// What a link did to frames in one direction, over all its connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames read from the sender.
    pub frames: u64,
    /// Frames (and copies) written to the receiver.
    pub delivered: u64,
    /// Frames lost to the drop rate.
    pub dropped: u64,
    /// Frames lost to a cut (at arrival or while held).
    pub cut: u64,
    /// Frames delivered twice.
    pub duplicated: u64,
    /// Frames held in order.
    pub delayed: u64,
    /// Frames held out of order.
    pub reordered: u64,
}

/// Commands and counters of one link, shared by all its connections.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct LinkControl {
    inner: Arc<ControlInner>,
}

#[derive(Debug)]
struct ControlInner {
    seed: u64,
    state: Mutex<ControlState>,
    generation: watch::Sender<u64>,
    connections: AtomicU64,
}

#[derive(Debug, Default)]
struct ControlState {
    faults: Faults,
    cut: [bool; 2],
    stats: [LinkStats; 2],
}

impl LinkControl {
    fn new(seed: u64, faults: Faults) -> Self {
        let (generation, _) = watch::channel(0);
        LinkControl {
            inner: Arc::new(ControlInner {
                seed,
                state: Mutex::new(ControlState {
                    faults,
                    ..ControlState::default()
                }),
                generation,
                connections: AtomicU64::new(0),
            }),
        }
    }

    /// The link's seed.
    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// Partitions the link both ways: every frame is lost, including those
    /// held in flight, until [`LinkControl::heal`]. Connections stay open
    /// (as a real partition does), so sessions time out.
    pub fn cut(&self) {
        self.lock().cut = [true, true];
    }

    /// Partitions one direction only.
    pub fn cut_one_way(&self, direction: Direction) {
        self.lock().cut[direction.index()] = true;
    }

    /// Ends every partition.
    pub fn heal(&self) {
        self.lock().cut = [false, false];
    }

    /// Whether `direction` is cut.
    pub fn is_cut(&self, direction: Direction) -> bool {
        self.lock().cut[direction.index()]
    }

    /// Closes every current connection of the link (both ends see the
    /// stream end); new connections are accepted as before.
    pub fn sever(&self) {
        self.inner
            .generation
            .send_modify(|generation| *generation += 1);
    }

    /// Replaces the fault rates (for frames read from now on).
    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    /// The fault rates now.
    pub fn faults(&self) -> Faults {
        self.lock().faults
    }

    /// What the link did in `direction`.
    pub fn stats(&self, direction: Direction) -> LinkStats {
        self.lock().stats[direction.index()]
    }

    /// How many connections the link has carried.
    pub fn connections(&self) -> u64 {
        self.inner.connections.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, ControlState> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts the two pumps of a new connection between `a` and `b`.
    fn join<A, B>(&self, a: A, b: B, tasks: &mut JoinSet<()>)
    where
        A: AsyncRead + AsyncWrite + Send + 'static,
        B: AsyncRead + AsyncWrite + Send + 'static,
    {
        let connection = self.inner.connections.fetch_add(1, Ordering::Relaxed);
        let generation = *self.inner.generation.borrow();
        let (a_read, a_write) = tokio::io::split(a);
        let (b_read, b_write) = tokio::io::split(b);
        for (direction, source, target) in [
            (
                Direction::Forward,
                Box::new(a_read) as Box<dyn AsyncRead + Send + Unpin>,
                Box::new(b_write) as Box<dyn AsyncWrite + Send + Unpin>,
            ),
            (Direction::Backward, Box::new(b_read), Box::new(a_write)),
        ] {
            let seed =
                SplitMix64::derive(self.inner.seed, connection * 2 + direction.index() as u64);
            tasks.spawn(pump(
                source,
                target,
                self.clone(),
                direction,
                SplitMix64::new(seed),
                generation,
            ));
        }
    }
}

/// The most frames one direction holds at once; past it the pump stops
/// reading (backpressure) rather than grow.
const HELD_FRAMES_MAX: usize = 1024;

struct Held {
    at: Instant,
    order: u64,
    frame: Bytes,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// Moves whole frames from `source` to `target`, deciding each one's fate
/// from `rng` as it arrives: a fixed number of draws per frame, so the k-th
/// frame's fate depends on the seed and k only.
async fn pump(
    mut source: Box<dyn AsyncRead + Send + Unpin>,
    mut target: Box<dyn AsyncWrite + Send + Unpin>,
    control: LinkControl,
    direction: Direction,
    mut rng: SplitMix64,
    generation: u64,
) {
    let index = direction.index();
    let mut reader = FrameReader::new();
    let mut held: BinaryHeap<Reverse<Held>> = BinaryHeap::new();
    let mut order = 0u64;
    let mut in_order_at = Instant::now();
    let mut severed = control.inner.generation.subscribe();
    if *severed.borrow_and_update() != generation {
        return;
    }
    loop {
        let next_at = held.peek().map(|Reverse(h)| h.at);
        tokio::select! {
            biased;
            _ = severed.changed() => break,
            _ = sleep_until(next_at.unwrap_or_else(Instant::now)), if next_at.is_some() => {
                let Some(Reverse(frame)) = held.pop() else { continue };
                {
                    let mut state = control.lock();
                    if state.cut[index] {
                        state.stats[index].cut += 1;
                        continue;
                    }
                    state.stats[index].delivered += 1;
                }
                if target.write_all(&frame.frame).await.is_err() {
                    break;
                }
            }
            read = reader.read_raw(&mut source), if held.len() < HELD_FRAMES_MAX => {
                let frame = match read {
                    Ok(Some(frame)) => frame,
                    // The sender closed, broke, or sent a prefix above the
                    // limit: close the other side too.
                    Ok(None) | Err(_) => break,
                };
                let draws = [(); 7].map(|_| rng.next_u64());
                for at in fates(&control, index, draws, Instant::now(), &mut in_order_at) {
                    order += 1;
                    held.push(Reverse(Held { at, order, frame: frame.clone() }));
                }
            }
        }
    }
    let _ = target.shutdown().await;
}

/// A frame's fate, from its seven draws: when to deliver it (none: cut or
/// dropped; two times: duplicated), counted in the link's stats. A frame
/// neither reordered nor duplicated is delivered no earlier than the one
/// before (`in_order_at`).
fn fates(
    control: &LinkControl,
    index: usize,
    draws: [u64; 7],
    now: Instant,
    in_order_at: &mut Instant,
) -> Vec<Instant> {
    let unit = |draw: u64| (draw >> 11) as f64 / (1u64 << 53) as f64;
    let mut state = control.lock();
    let faults = state.faults;
    let cut = state.cut[index];
    let stats = &mut state.stats[index];
    stats.frames += 1;
    if cut {
        stats.cut += 1;
        return Vec::new();
    }
    if unit(draws[0]) < faults.drop {
        stats.dropped += 1;
        return Vec::new();
    }
    let hold_ms = |draw: u64| draw % (faults.delay_ms_max + 1);
    let at = if unit(draws[2]) < faults.reorder {
        stats.reordered += 1;
        now + Duration::from_millis(1 + hold_ms(draws[3]))
    } else {
        let mut at = now;
        if unit(draws[4]) < faults.delay {
            stats.delayed += 1;
            at += Duration::from_millis(hold_ms(draws[5]));
        }
        *in_order_at = (*in_order_at).max(at);
        *in_order_at
    };
    let mut fates = vec![at];
    if unit(draws[1]) < faults.duplicate {
        stats.duplicated += 1;
        fates.push(now + Duration::from_millis(hold_ms(draws[6])));
    }
    fates
}

/// A fault link in memory: each [`FaultLink::connect`] gives a pair of
/// connected byte streams whose frames cross the faults of the link.
///
/// ```
/// use meshlog_sync::testkit::{Direction, FaultLink, Faults};
/// # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(async {
/// let link = FaultLink::new(7, Faults { drop: 0.3, ..Faults::none() });
/// let (a, b) = link.connect();
/// link.control().cut_one_way(Direction::Forward);
/// # drop((a, b));
/// # });
/// ```
#[derive(Debug)]
pub struct FaultLink {
    control: LinkControl,
    tasks: Mutex<JoinSet<()>>,
}

/// The buffer of each in-memory stream, in bytes.
const DUPLEX_BYTES: usize = 256 * 1024;

impl FaultLink {
    /// A link with `faults`, its decisions drawn from `seed`.
    pub fn new(seed: u64, faults: Faults) -> Self {
        FaultLink {
            control: LinkControl::new(seed, faults),
            tasks: Mutex::new(JoinSet::new()),
        }
    }

    /// The link's commands and counters.
    pub fn control(&self) -> LinkControl {
        self.control.clone()
    }

    /// A new connection across the link: `(first, second)`, with
    /// [`Direction::Forward`] from first to second. Must be called within a
    /// tokio runtime (it spawns the link's two pumps).
    pub fn connect(&self) -> (DuplexStream, DuplexStream) {
        let (first, first_inner) = tokio::io::duplex(DUPLEX_BYTES);
        let (second_inner, second) = tokio::io::duplex(DUPLEX_BYTES);
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while tasks.try_join_next().is_some() {}
        self.control.join(first_inner, second_inner, &mut tasks);
        (first, second)
    }
}

/// A fault proxy over TCP on 127.0.0.1: connections to its address are
/// forwarded to a target, frame by frame, through the faults of one link.
/// Dropping it closes every connection.
#[derive(Debug)]
pub struct FaultProxy {
    local_addr: SocketAddr,
    control: LinkControl,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards to `target`.
    pub async fn start(target: SocketAddr, seed: u64, faults: Faults) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let local_addr = listener.local_addr()?;
        let control = LinkControl::new(seed, faults);
        let task = tokio::spawn(proxy_loop(listener, target, control.clone()));
        Ok(FaultProxy {
            local_addr,
            control,
            task,
        })
    }

    /// The address to connect to instead of the target.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The link's commands and counters.
    pub fn control(&self) -> LinkControl {
        self.control.clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn proxy_loop(listener: TcpListener, target: SocketAddr, control: LinkControl) {
    // Owned here: aborting this task drops the set and every pump.
    let mut pumps = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        while pumps.try_join_next().is_some() {}
        let Ok(server) = TcpStream::connect(target).await else {
            // The target is down: the client sees its connection close.
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        control.join(client, server, &mut pumps);
    }
}
