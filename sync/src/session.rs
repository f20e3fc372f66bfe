//! `Session`: anti-entropy between this replica and one peer over one byte
//! stream.

use std::future::Future;
use std::io;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{DeltaError, MemStore, ReplicaError, Store};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::frame::{FrameError, FrameReader, FRAME_BYTES_CEILING, FRAME_BYTES_MAX};
// Named by the docs only.
#[cfg(doc)]
use crate::frame::DELTA_EVENTS_MAX;
use crate::proto::{Protocol, Received};
use crate::{ChangeWatch, PeerDirection, Routes, SharedReplica};

/// A session's timing and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// How often a session sends a heartbeat with its marks (the periodic
    /// re-exchange that repairs lost frames), re-sends an unanswered hello,
    /// and checks its timeouts. Default 1 s.
    pub heartbeat_interval: Duration,
    /// A session that receives no frame for this long (or no hello) ends
    /// with [`SessionError::ReadTimeout`]. Default 10 s; keep it several
    /// heartbeat intervals long so a few lost heartbeats are survived.
    pub read_timeout: Duration,
    /// A session whose queued output (or a flush) makes no progress for
    /// this long ends with [`SessionError::WriteTimeout`]. Default 10 s.
    pub write_timeout: Duration,
    /// The byte budget of one delta, by [`meshlog_replica::Event::size_hint`]
    /// (a delta holds at least one event whatever its size). Default 256 KiB;
    /// capped so that a frame stays below [`FRAME_BYTES_MAX`]. A delta of
    /// more than [`DELTA_EVENTS_MAX`] events (small events under a budget
    /// above 400 KiB) is sent as several frames.
    pub delta_bytes_max: usize,
    /// No new delta, ack or heartbeat is queued while this many bytes wait to
    /// be written: the bound on a session's output buffer (plus one frame and
    /// a hello), and the backpressure a slow peer exerts. Default 512 KiB.
    pub queue_bytes_max: usize,
    /// The largest frame payload this side takes, in bytes, announced in
    /// its hello; each side sends frames up to the smaller of both sides'
    /// limits. Default (and floor) [`FRAME_BYTES_MAX`], 4 MiB: events of
    /// payloads up to 3,866,582 bytes always fit. Raise it on both sides
    /// of a link to sync larger events (each session may buffer one frame
    /// of this size); at most [`FRAME_BYTES_CEILING`].
    pub frame_bytes_max: usize,
    /// How long an ack may wait for more deltas to acknowledge with it.
    /// Default 20 ms: a burst of deltas is acknowledged once (and at
    /// least every 8 deltas), where each used to get its own receipt
    /// carrying the marks it changed. A gap in the delta numbers, or events
    /// held above a hole, is acknowledged at once, so repair is not
    /// delayed. Zero acknowledges every delta at once.
    pub ack_delay: Duration,
    /// How long new events may wait while a delta to the peer is in
    /// flight (sent, not yet acknowledged), counted from that delta's
    /// sending, so that one delta carries what accumulates meanwhile
    /// instead of one small delta each (Nagle's rule). Default 40 ms. A
    /// delta goes at once when nothing is in flight (the first after a
    /// quiet period, a reconnect or a receipt that retired the rest), when
    /// the delta before it filled half the budget (a backlog drains at the
    /// link's pace), and when this has passed: so the wait is bounded
    /// whatever the peer's [`SessionConfig::ack_delay`]. Zero sends every
    /// change at once.
    pub send_delay: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            heartbeat_interval: Duration::from_secs(1),
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            delta_bytes_max: 256 * 1024,
            queue_bytes_max: 512 * 1024,
            frame_bytes_max: FRAME_BYTES_MAX,
            ack_delay: Duration::from_millis(20),
            send_delay: Duration::from_millis(40),
        }
    }
}

impl SessionConfig {
    /// Defaults scaled to a heartbeat interval: read and write timeouts of
    /// ten intervals, an ack delay of a fiftieth (at most 20 ms) and a send
    /// delay of a twenty-fifth (at most 40 ms). Tests use short intervals
    /// (10 to 50 ms).
    pub fn with_heartbeat(heartbeat_interval: Duration) -> Self {
        SessionConfig {
            heartbeat_interval,
            read_timeout: heartbeat_interval * 10,
            write_timeout: heartbeat_interval * 10,
            // 20 ms at the default 1 s heartbeat, a fiftieth of shorter ones.
            ack_delay: (heartbeat_interval / 50).min(Duration::from_millis(20)),
            send_delay: (heartbeat_interval / 25).min(Duration::from_millis(40)),
            ..SessionConfig::default()
        }
    }

    /// The largest delta budget that keeps every frame below the limit:
    /// room is left for a floor vector of the most streams a vector holds
    /// and for one event of the largest payload a replica accepts.
    pub(crate) fn delta_budget(&self) -> usize {
        self.delta_bytes_max.clamp(1, FRAME_BYTES_MAX / 2)
    }

    /// [`SessionConfig::frame_bytes_max`] within its bounds.
    pub(crate) fn frame_limit(&self) -> usize {
        self.frame_bytes_max
            .clamp(FRAME_BYTES_MAX, FRAME_BYTES_CEILING)
    }
}

/// What a session knows about its peer, published as it changes (see
/// [`Session::state`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionState {
    /// The peer's stream, once its hello arrived.
    pub peer: Option<StreamId>,
    /// The marks the peer reported (hello, acks, heartbeats), joined: what it
    /// has acknowledged holding.
    pub peer_marks: VersionVector,
    /// The floor in the peer's hello.
    pub peer_floor: VersionVector,
    /// Frames sent (queued for writing).
    pub frames_sent: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Bytes sent, prefixes included.
    pub bytes_sent: u64,
    /// Bytes received, prefixes included.
    pub bytes_received: u64,
    /// Events sent in deltas (re-sends counted again).
    pub events_sent: u64,
    /// Received events that became visible here.
    pub events_applied: u64,
    /// Received events this replica already held.
    pub events_duplicate: u64,
    /// Routes frames sent: streams asked quiet (another session brings
    /// them) or loud again.
    pub routes_sent: u64,
    /// Streams the peer asked us not to push, now.
    pub peer_quiet_streams: usize,
    /// Events not exchanged because of a limit (received and cut before
    /// the apply, or not sent): the metric of [`SessionState::limits`].
    pub events_over_limit: u64,
    /// Every limit the session ran into, one entry per stream affected:
    /// what it cannot exchange and which setting says so. The session
    /// keeps exchanging everything else.
    pub limits: Vec<LimitHit>,
}

/// A limit a session ran into, and what it cannot exchange because of it.
/// The session keeps exchanging what fits; each is logged once, at `warn`,
/// naming the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitHit {
    /// The peer sent a stream this replica cannot hold: it already holds
    /// `streams_max` streams (`meshlog_replica::Config::streams_max`, at
    /// most 16,383, what a cursor carries). The stream is asked quiet.
    StreamsMax {
        /// The stream refused.
        stream: StreamId,
        /// `streams_max`.
        limit: usize,
    },
    /// The peer sent an event whose payload exceeds this replica's
    /// `payload_bytes_max`: its stream stops below it here, and is asked
    /// quiet.
    PayloadBytesMax {
        /// The event's stream.
        stream: StreamId,
        /// The event's seq.
        seq: u64,
        /// Its payload's length.
        len: usize,
        /// `payload_bytes_max`.
        limit: usize,
    },
    /// One of our events is too large for a frame (our
    /// `payload_bytes_max` is above what a frame between us and this peer
    /// carries): its stream is not sent to this peer past it.
    FrameBytesMax {
        /// The event's stream.
        stream: StreamId,
        /// The event's seq.
        seq: u64,
        /// Its payload's length.
        len: usize,
        /// The frame limit it exceeds: the smaller of this side's
        /// [`SessionConfig::frame_bytes_max`] and the peer's.
        limit: usize,
    },
}

/// How a session ended when nothing went wrong. New ways may be added (as
/// `Duplicate` was), so a match needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionEnd {
    /// The peer closed the stream between frames.
    PeerClosed,
    /// The stop future given to [`Session::run_until`] completed.
    Stopped,
    /// Another session with the same peer is kept instead of this one (two
    /// replicas that dial each other keep one session; see
    /// [`Session::with_routes`]).
    Duplicate {
        /// The peer's stream.
        peer: StreamId,
    },
}

/// Why a session ended badly. Each variant is logged (`tracing::warn!`) with
/// its reason when the session ends; the replica's log is unchanged by the
/// frame that caused it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The byte stream failed, or ended inside a frame.
    #[error("link failed: {0}")]
    Io(#[source] io::Error),
    /// The peer sent bytes that are not a valid frame: garbage, an oversized
    /// length prefix, another protocol version, a non-canonical vector.
    #[error("bad frame from peer: {0}")]
    Frame(#[source] FrameError),
    /// The peer's delta was refused by the replica (an equivocation, a
    /// lamport stamp not rising, too many streams...). Nothing was applied.
    #[error("delta from peer {peer} refused: {source}")]
    Refused {
        /// The peer's stream.
        peer: StreamId,
        /// What the delta breaks.
        #[source]
        source: DeltaError,
    },
    /// The peer's delta exceeds a limit of this replica (a payload larger
    /// than `payload_bytes_max`, more streams than `streams_max`): a
    /// configuration mismatch rather than misbehaviour. Nothing was applied.
    #[error("delta from peer {peer} exceeds a local limit: {source}")]
    Limit {
        /// The peer's stream.
        peer: StreamId,
        /// The limit exceeded.
        #[source]
        source: ReplicaError,
    },
    /// The local replica failed (its store) while applying a delta.
    #[error("local replica failed: {0}")]
    Replica(#[source] ReplicaError),
    /// The peer's hello names this replica's own stream: a connection to
    /// itself, or two replicas configured with one id.
    #[error("peer claims this replica's own stream {stream}: a self-connection or a duplicate id")]
    SelfConnection {
        /// The stream claimed.
        stream: StreamId,
    },
    /// A second hello named another stream than the first.
    #[error("peer changed identity from stream {was} to stream {now} within one session")]
    IdentityChanged {
        /// The stream of the first hello.
        was: StreamId,
        /// The stream of the later hello.
        now: StreamId,
    },
    /// No frame (or no hello) arrived for the read timeout.
    #[error("no {what} from the peer for {idle:?} (read timeout)")]
    ReadTimeout {
        /// `frame`, or `hello` if the peer never said who it is.
        what: &'static str,
        /// How long the session waited.
        idle: Duration,
    },
    /// Queued output, or a flush, made no progress for the write timeout:
    /// the peer is not reading.
    #[error("{queued_bytes} queued bytes made no progress for {stalled:?} (write timeout)")]
    WriteTimeout {
        /// How long writing stalled.
        stalled: Duration,
        /// Bytes waiting to be written.
        queued_bytes: usize,
    },
    /// The peer broke the session's rules in a frame that decoded: it
    /// acknowledged a delta or marks this side never sent, or sent marks as
    /// a difference from marks this side never reported holding.
    #[error("peer broke the sync protocol: {detail}")]
    Protocol {
        /// What it did.
        detail: String,
    },
    /// A frame of ours could not be encoded (an event too large for a frame:
    /// the replica's `payload_bytes_max` is set above what a frame carries).
    #[error("cannot send a frame: {0}")]
    Send(#[source] FrameError),
}

impl From<io::Error> for SessionError {
    fn from(error: io::Error) -> Self {
        match FrameError::of_io(&error) {
            Some(frame_error) => SessionError::Frame(frame_error.clone()),
            None => SessionError::Io(error),
        }
    }
}

/// Anti-entropy with one peer over one byte stream (a TCP connection, an
/// in-memory duplex, a fault proxy's end).
///
/// The protocol's rules are those of the sans-I/O core,
/// [`Protocol`](crate::proto::Protocol) (see `docs/PROTOCOL.md`); the
/// session drives it over the stream. From each side:
///
/// 1. Send a hello with our stream, protocol version, marks and floor, and
///    re-send it every tick until the peer sends anything else (which shows
///    it has our hello). Frames other than a hello that arrive before the
///    peer's hello are ignored; the peer re-sends its hello. A peer of
///    another protocol version is refused, after our hello reaches it.
/// 2. Keep a *view* of the peer's marks: what it certainly holds (its
///    marks, learned from its hello and receipts, and what it sent us)
///    joined with the numbered delta frames still in flight to it.
/// 3. While the view does not cover our marks and less than
///    `queue_bytes_max` is queued, send `delta_for(view, budget)` in
///    numbered frames (of at most [`DELTA_EVENTS_MAX`] events each).
/// 4. After receiving deltas, ack: the last delta number received and our
///    marks, as a difference from marks the peer holds. A receipt retires
///    the deltas it covers; what they carried and the peer's marks lack was
///    lost, and is sent again at once.
/// 5. Every tick, send a heartbeat (a receipt, a few bytes when idle); time
///    out a silent peer; count deltas unacknowledged past their
///    retransmission timeout as lost.
///
/// Acks and heartbeats wait, like deltas, while `queue_bytes_max` is queued.
///
/// New events (local appends, or deltas applied from any other peer) wake
/// the session through the shared replica's marks watch, so they are pushed
/// at once, including third-party streams: an event travels from C to B
/// through A. The session runs in one task with no queue of events: a slow
/// peer only fills this session's bounded output buffer.
///
/// # Sharing the runtime
///
/// - **Fair turns.** Each turn the session serves one thing that is ready:
///   the tick first (it is ready once per interval, so it starves nothing),
///   then reading and writing, which take turns going first: after a frame
///   is handled, writing goes first. A peer whose frames are always ready (a
///   deep backlog on a fast link) cannot starve our acks and heartbeats and
///   then time out waiting for them. The order is fixed per turn, not
///   random, so a run under tokio's paused clock replays from its seeds.
/// - **Yielding.** Every frame handled spends a unit of the task's tokio
///   coop budget, so a session that always has a frame to handle (even from
///   its own buffer, with no socket read in between) still yields to the
///   runtime's other tasks and timers.
/// - **Commits off the runtime.** A received delta is applied with
///   [`SharedReplica::apply_async`]: with a durable store (anything but
///   [`Commits::Inline`](crate::Commits)), on tokio's blocking pool, so its
///   fsync does not stall the runtime's other tasks. The session awaits each
///   apply before it reads the next frame: a peer's deltas are applied in
///   the order they arrived, one at a time.
///
/// Dropping the future closes the stream; there are no background tasks (an
/// apply already handed to the blocking pool finishes there).
pub struct Session<S: Store = MemStore> {
    shared: SharedReplica<S>,
    config: SessionConfig,
    state: watch::Sender<SessionState>,
    routes: Option<(Routes, PeerDirection)>,
}

impl<S: Store> Session<S> {
    /// A session for `shared` with `config`, not yet running.
    pub fn new(shared: SharedReplica<S>, config: SessionConfig) -> Self {
        let (state, _) = watch::channel(SessionState::default());
        Session {
            shared,
            config,
            state,
            routes: None,
        }
    }

    /// Shares `routes` with the replica's other sessions: a stream another
    /// session brings is asked quiet on this one, so that in a mesh with
    /// cycles an event arrives once; and of two sessions with one peer
    /// (each replica dialed the other) only the one dialed by the lower
    /// stream id is kept, the other ending with [`SessionEnd::Duplicate`].
    /// `direction` says whether this side dialed. Without it, the session
    /// pushes every stream, whatever the others do.
    pub fn with_routes(mut self, routes: Routes, direction: PeerDirection) -> Self {
        self.routes = Some((routes, direction));
        self
    }

    /// A receiver of the session's state (peer, acknowledged marks,
    /// counters), updated as it runs.
    pub fn state(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }
}

impl<S: Store + Send + Sync + 'static> Session<S> {
    /// Runs the session over `io` until the peer closes it or it fails.
    pub async fn run<IO>(self, io: IO) -> Result<SessionEnd, SessionError>
    where
        IO: AsyncRead + AsyncWrite,
    {
        self.run_until(io, std::future::pending::<()>()).await
    }

    /// Runs the session over `io` until the peer closes it, it fails, or
    /// `stop` completes.
    pub async fn run_until<IO, F>(self, io: IO, stop: F) -> Result<SessionEnd, SessionError>
    where
        IO: AsyncRead + AsyncWrite,
        F: Future,
    {
        let (read, write) = tokio::io::split(io);
        let local = self.shared.stream();
        let marks = ChangeWatch::new(&self.shared);
        let now = Instant::now();
        let mut protocol = Protocol::new(local, self.config.clone(), now.into_std());
        if let Some((routes, direction)) = &self.routes {
            protocol = protocol.with_routes(routes, *direction);
        }
        let reader = FrameReader::with_limit(self.config.frame_limit());
        let mut driver = Driver {
            protocol,
            marks,
            shared: self.shared,
            config: self.config,
            state: self.state,
            reader,
            read,
            write,
            out: BytesMut::new(),
            write_progress_at: now,
        };
        let result = driver.run(stop).await;
        driver.publish();
        if let Err(SessionError::Frame(FrameError::ProtocolVersion { theirs, ours })) = &result {
            // Our hello says which version we speak: make sure it reaches
            // a peer of another version before we close, so it can say why
            // too (an older peer logs that we speak version 3).
            tracing::warn!(
                %local,
                theirs,
                ours,
                "refusing a peer that speaks sync protocol version {theirs}: this side speaks \
                 version {ours}; upgrade the older side"
            );
            driver.flush_out().await;
        }
        let peer = driver.protocol.peer().map(|p| p.to_string());
        let peer = peer.as_deref().unwrap_or("unknown");
        match &result {
            Ok(end) => tracing::info!(%local, peer, ?end, "sync session ended"),
            Err(error) => {
                tracing::warn!(%local, peer, reason = %error, "sync session closed: {error}")
            }
        }
        result
    }
}

/// What one turn of a session serves: the branch of its select that was
/// ready first in that turn's order.
enum Turn {
    Stop,
    Tick,
    Read(io::Result<Option<Bytes>>),
    Wrote(io::Result<usize>),
    MarksChanged,
}

/// The tokio driver of a [`Protocol`]: it owns the stream, the output
/// buffer, the timers and the replica's commits; every rule of the protocol
/// is the core's.
struct Driver<S: Store, R, W> {
    protocol: Protocol,
    shared: SharedReplica<S>,
    config: SessionConfig,
    state: watch::Sender<SessionState>,
    /// Wakes the session when the replica's marks or floor move.
    marks: ChangeWatch,
    reader: FrameReader,
    read: R,
    write: W,
    /// Encoded frames waiting to be written.
    out: BytesMut,
    write_progress_at: Instant,
}

impl<S, R, W> Driver<S, R, W>
where
    S: Store + Send + Sync + 'static,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    async fn run<F: Future>(&mut self, stop: F) -> Result<SessionEnd, SessionError> {
        tokio::pin!(stop);
        // Whether reading goes before writing this turn: not right after a
        // frame was handled, so that a peer whose frames are always ready
        // cannot starve our writes (see "Sharing the runtime" on `Session`).
        let mut read_first = true;
        loop {
            self.fill()?;
            self.publish();
            if let Some(peer) = self.protocol.duplicate_of() {
                return Ok(SessionEnd::Duplicate { peer });
            }
            let next_tick = Instant::from_std(self.protocol.poll_timeout());
            let has_output = !self.out.is_empty();
            // Biased, in an order fixed per turn: a run under tokio's paused
            // clock replays exactly from its seeds. Two selects rather than
            // one, because a select's order is fixed where it is written.
            // The tick goes first, even before a frame that is ready: it can
            // then time out a peer whose frame waits unread only if this
            // session went unpolled for a whole read timeout, in which case
            // it sent no heartbeat for as long and the peer times out too.
            let turn = if read_first {
                tokio::select! {
                    biased;
                    _ = &mut stop => Turn::Stop,
                    _ = sleep_until(next_tick) => Turn::Tick,
                    read = self.reader.read_payload(&mut self.read) => Turn::Read(read),
                    written = self.write.write(&self.out), if has_output => Turn::Wrote(written),
                    _ = self.marks.receiver().changed() => Turn::MarksChanged,
                }
            } else {
                tokio::select! {
                    biased;
                    _ = &mut stop => Turn::Stop,
                    _ = sleep_until(next_tick) => Turn::Tick,
                    written = self.write.write(&self.out), if has_output => Turn::Wrote(written),
                    read = self.reader.read_payload(&mut self.read) => Turn::Read(read),
                    _ = self.marks.receiver().changed() => Turn::MarksChanged,
                }
            };
            read_first = !matches!(turn, Turn::Read(_));
            match turn {
                Turn::Stop => return Ok(SessionEnd::Stopped),
                Turn::Tick => self.on_tick()?,
                Turn::Read(read) => match read? {
                    Some(payload) => {
                        self.on_payload(payload).await?;
                        // Frames served from our own buffer touch no socket,
                        // so nothing else would make us yield under a flood.
                        tokio::task::coop::consume_budget().await;
                    }
                    None => return Ok(SessionEnd::PeerClosed),
                },
                Turn::Wrote(written) => {
                    let written = written?;
                    if written == 0 {
                        return Err(SessionError::Io(io::ErrorKind::WriteZero.into()));
                    }
                    self.out.advance(written);
                    self.write_progress_at = Instant::now();
                    if self.out.is_empty() {
                        self.flush().await?;
                    }
                }
                // New events here: loop round to fill.
                Turn::MarksChanged => {}
            }
        }
    }

    /// Writes what is queued and flushes, for at most the write timeout
    /// (one second at most): the last words of a session that is closing.
    async fn flush_out(&mut self) {
        let within = self.config.write_timeout.min(Duration::from_secs(1));
        let out = std::mem::take(&mut self.out);
        let _ = tokio::time::timeout(within, async {
            self.write.write_all(&out).await?;
            self.write.flush().await
        })
        .await;
    }

    /// Flushes the stream, within the write timeout: a transport whose
    /// flush never completes (a peer that stopped reading behind a buffered
    /// writer) must not hold the session for ever.
    async fn flush(&mut self) -> Result<(), SessionError> {
        let write_timeout = self.config.write_timeout;
        match tokio::time::timeout(write_timeout, self.write.flush()).await {
            Ok(flushed) => Ok(flushed?),
            Err(_) => Err(SessionError::WriteTimeout {
                stalled: write_timeout,
                queued_bytes: self.out.len(),
            }),
        }
    }

    fn on_tick(&mut self) -> Result<(), SessionError> {
        let now = Instant::now();
        self.protocol.handle_timeout(now.into_std())?;
        if !self.out.is_empty() && now - self.write_progress_at > self.config.write_timeout {
            return Err(SessionError::WriteTimeout {
                stalled: now - self.write_progress_at,
                queued_bytes: self.out.len(),
            });
        }
        Ok(())
    }

    /// Publishes the core's state if it changed.
    fn publish(&mut self) {
        if self.protocol.take_state_changed() {
            let state = self.protocol.state().clone();
            self.state.send_replace(state);
        }
    }

    /// Whether the output buffer has room for another frame. At least one
    /// frame always fits, whatever `queue_bytes_max` says.
    fn has_room(&self) -> bool {
        self.out.len() < self.config.queue_bytes_max.max(1)
    }

    /// Queues what the core has to send while the output buffer has room:
    /// a peer that sends without reading cannot grow the buffer with our
    /// replies (a due ack or heartbeat stays due in the core).
    fn fill(&mut self) -> Result<(), SessionError> {
        // Marks the watch's change as seen: what it announced is read now.
        self.marks.receiver().borrow_and_update();
        while self.has_room() {
            let now = Instant::now();
            let Some(bytes) = self.protocol.poll_transmit(now.into_std(), &self.shared)? else {
                break;
            };
            if self.out.is_empty() {
                self.write_progress_at = now;
            }
            self.out.extend_from_slice(&bytes);
        }
        Ok(())
    }

    async fn on_payload(&mut self, payload: Bytes) -> Result<(), SessionError> {
        let received =
            self.protocol
                .handle_payload(Instant::now().into_std(), &payload, &self.shared)?;
        if let Received::Apply(columns) = received {
            // Awaited before the next frame is read: one session's applies
            // run in the order its frames arrived. With a durable store the
            // commit runs on the handle's committer thread, grouped with
            // other sessions' deltas and local appends (see
            // `SharedReplica`).
            let applied = self.shared.apply_columns_async(columns).await;
            self.protocol
                .handle_applied(Instant::now().into_std(), applied)?;
        }
        Ok(())
    }
}
