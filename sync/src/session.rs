//! `Session`: anti-entropy between this replica and one peer over one byte
//! stream.

use std::future::Future;
use std::io;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{Delta, DeltaError, Event, MemStore, ReplicaError, Store};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::frame::{
    self, Frame, FrameError, FrameReader, Hello, DELTA_EVENTS_MAX, FRAME_BYTES_MAX,
};
use crate::{ChangeWatch, SharedReplica};

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
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            heartbeat_interval: Duration::from_secs(1),
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            delta_bytes_max: 256 * 1024,
            queue_bytes_max: 512 * 1024,
        }
    }
}

impl SessionConfig {
    /// Defaults scaled to a heartbeat interval: read and write timeouts of
    /// ten intervals. Tests use short intervals (10 to 50 ms).
    pub fn with_heartbeat(heartbeat_interval: Duration) -> Self {
        SessionConfig {
            heartbeat_interval,
            read_timeout: heartbeat_interval * 10,
            write_timeout: heartbeat_interval * 10,
            ..SessionConfig::default()
        }
    }

    /// The largest delta budget that keeps every frame below the limit:
    /// room is left for a floor vector of the most streams a vector holds
    /// and for one event of the largest payload a replica accepts.
    fn delta_budget(&self) -> usize {
        self.delta_bytes_max.clamp(1, FRAME_BYTES_MAX / 2)
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
}

/// How a session ended when nothing went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The peer closed the stream between frames.
    PeerClosed,
    /// The stop future given to [`Session::run_until`] completed.
    Stopped,
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
/// The protocol, from each side (see `docs/PROTOCOL.md`):
///
/// 1. Send a hello with our stream, protocol version, marks and floor, and
///    re-send it every tick until the peer sends anything else (which shows
///    it has our hello). Frames other than a hello that arrive before the
///    peer's hello are ignored; the peer re-sends its hello.
/// 2. Keep a *view* of the peer's marks: set from its hello, joined with its
///    acks and with the events it sends us, **replaced** by every heartbeat.
/// 3. While the view does not cover our marks and less than
///    `queue_bytes_max` is queued, send `delta_for(view, budget)` (in frames
///    of at most [`DELTA_EVENTS_MAX`] events) and advance the view by what it
///    carries (optimistically: if that frame is lost, the peer's next
///    heartbeat lowers the view again and it is re-sent).
/// 4. After applying a delta that changed our log, ack our marks.
/// 5. Every tick, send a heartbeat with our marks; time out a silent peer.
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
}

impl<S: Store> Session<S> {
    /// A session for `shared` with `config`, not yet running.
    pub fn new(shared: SharedReplica<S>, config: SessionConfig) -> Self {
        let (state, _) = watch::channel(SessionState::default());
        Session {
            shared,
            config,
            state,
        }
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
        let mut driver = Driver {
            marks,
            shared: self.shared,
            config: self.config,
            state: self.state,
            reader: FrameReader::new(),
            read,
            write,
            out: BytesMut::new(),
            peer: None,
            view: VersionVector::new(),
            peer_has_our_hello: false,
            hello_due: true,
            heartbeat_due: false,
            ack_due: false,
            started_at: Instant::now(),
            last_frame_at: Instant::now(),
            write_progress_at: Instant::now(),
        };
        let result = driver.run(stop).await;
        let peer = driver.peer.map(|p| p.to_string());
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

struct Driver<S: Store, R, W> {
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
    peer: Option<StreamId>,
    /// What we believe the peer holds: what to send is computed from it.
    view: VersionVector,
    peer_has_our_hello: bool,
    hello_due: bool,
    heartbeat_due: bool,
    ack_due: bool,
    started_at: Instant,
    last_frame_at: Instant,
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
        let interval = self.config.heartbeat_interval.max(Duration::from_millis(1));
        let mut next_tick = Instant::now() + interval;
        // Whether reading goes before writing this turn: not right after a
        // frame was handled, so that a peer whose frames are always ready
        // cannot starve our writes (see "Sharing the runtime" on `Session`).
        let mut read_first = true;
        loop {
            self.fill()?;
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
                Turn::Tick => {
                    next_tick = Instant::now() + interval;
                    self.on_tick()?;
                }
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
        if self.peer.is_none() && now - self.started_at > self.config.read_timeout {
            return Err(SessionError::ReadTimeout {
                what: "hello",
                idle: now - self.started_at,
            });
        }
        if now - self.last_frame_at > self.config.read_timeout {
            return Err(SessionError::ReadTimeout {
                what: "frame",
                idle: now - self.last_frame_at,
            });
        }
        if !self.out.is_empty() && now - self.write_progress_at > self.config.write_timeout {
            return Err(SessionError::WriteTimeout {
                stalled: now - self.write_progress_at,
                queued_bytes: self.out.len(),
            });
        }
        self.hello_due |= !self.peer_has_our_hello;
        self.heartbeat_due |= self.peer.is_some();
        Ok(())
    }

    /// Whether the output buffer has room for another frame. At least one
    /// frame always fits, whatever `queue_bytes_max` says.
    fn has_room(&self) -> bool {
        self.out.len() < self.config.queue_bytes_max.max(1)
    }

    /// Queues what is due: a hello, then, while the output buffer has room, a
    /// heartbeat or an ack and deltas while the peer misses something.
    ///
    /// A heartbeat or ack that finds no room stays due (one of each, however
    /// many deltas asked for it): a peer that sends without reading cannot
    /// grow the buffer with our replies.
    fn fill(&mut self) -> Result<(), SessionError> {
        if self.hello_due {
            self.hello_due = false;
            let change = self.shared.latest_change();
            let hello = Hello {
                protocol: frame::PROTOCOL_VERSION,
                stream: self.shared.stream(),
                marks: change.marks,
                floor: change.floor,
            };
            self.enqueue(&Frame::Hello(hello))?;
        }
        if self.peer.is_none() {
            return Ok(());
        }
        if self.heartbeat_due && self.has_room() {
            // A heartbeat carries our marks too: it stands for a due ack.
            self.heartbeat_due = false;
            self.ack_due = false;
            let marks = self.shared.marks();
            self.enqueue(&Frame::Heartbeat { marks })?;
        }
        if self.ack_due && self.has_room() {
            self.ack_due = false;
            let marks = self.shared.marks();
            self.enqueue(&Frame::Ack { marks })?;
        }
        let budget = self.config.delta_budget();
        while self.has_room() {
            let marks = self.marks.receiver().borrow_and_update().marks.clone();
            if self.view.dominates(&marks) {
                break;
            }
            let delta = self.shared.delta_for(&self.view, budget);
            if delta.events.is_empty() && delta.floor.is_empty() {
                // The watch ran ahead of a compaction; nothing to send.
                break;
            }
            advance_by(&mut self.view, &delta);
            let events = delta.events.len() as u64;
            for part in split_delta(delta) {
                self.enqueue(&Frame::Delta(part))?;
            }
            self.state.send_modify(|state| state.events_sent += events);
        }
        Ok(())
    }

    fn enqueue(&mut self, frame: &Frame) -> Result<(), SessionError> {
        let bytes = frame::encode(frame).map_err(SessionError::Send)?;
        if self.out.is_empty() {
            self.write_progress_at = Instant::now();
        }
        self.out.extend_from_slice(&bytes);
        tracing::trace!(kind = frame.kind(), len = bytes.len(), "frame queued");
        self.state.send_modify(|state| {
            state.frames_sent += 1;
            state.bytes_sent += bytes.len() as u64;
        });
        Ok(())
    }

    async fn on_payload(&mut self, payload: Bytes) -> Result<(), SessionError> {
        self.last_frame_at = Instant::now();
        let len = payload.len() + frame::LENGTH_PREFIX_BYTES;
        self.state.send_modify(|state| {
            state.frames_received += 1;
            state.bytes_received += len as u64;
        });
        let frame = frame::decode(&payload).map_err(SessionError::Frame)?;
        tracing::trace!(kind = frame.kind(), len, "frame received");
        if let Frame::Hello(hello) = frame {
            return self.on_hello(hello);
        }
        // Only a peer that has our hello sends anything else.
        self.peer_has_our_hello = true;
        let Some(peer) = self.peer else {
            // Its hello was lost on the way; it re-sends it every tick.
            tracing::debug!(kind = frame.kind(), "frame before the peer's hello ignored");
            return Ok(());
        };
        match frame {
            Frame::Delta(delta) => self.on_delta(peer, delta).await?,
            Frame::Ack { marks } => {
                self.view.join(&marks);
                self.state
                    .send_modify(|state| state.peer_marks.join(&marks));
            }
            Frame::Heartbeat { marks } => {
                // The truth about the peer: whatever we optimistically
                // counted as sent and it does not hold is sent again.
                self.state
                    .send_modify(|state| state.peer_marks.join(&marks));
                self.view = marks;
            }
            Frame::Hello(_) => unreachable!("handled above"),
        }
        Ok(())
    }

    fn on_hello(&mut self, hello: Hello) -> Result<(), SessionError> {
        let local = self.shared.stream();
        if hello.stream == local {
            return Err(SessionError::SelfConnection {
                stream: hello.stream,
            });
        }
        match self.peer {
            Some(was) if was != hello.stream => {
                return Err(SessionError::IdentityChanged {
                    was,
                    now: hello.stream,
                });
            }
            Some(_) => {
                // A re-sent or duplicated hello: take it as a heartbeat.
            }
            None => {
                let own_head = self.shared.marks().get(local);
                let claimed = hello.marks.get(local);
                if claimed > own_head && !self.shared.is_recovering() {
                    // Only we write our stream: a peer holding more of it
                    // than we do saw a forged stream, or a previous life of
                    // ours whose store was lost (open with
                    // `recover_own_stream` to relearn it). Its deltas of
                    // our stream beyond our head are refused.
                    tracing::warn!(
                        %local,
                        peer = %hello.stream,
                        claimed,
                        own_head,
                        "suspicious hello: the peer claims more of our own stream than we wrote"
                    );
                }
                self.peer = Some(hello.stream);
                tracing::debug!(%local, peer = %hello.stream, marks = ?hello.marks, "sync session established");
            }
        }
        self.state.send_modify(|state| {
            state.peer = Some(hello.stream);
            state.peer_marks.join(&hello.marks);
            state.peer_floor.join(&hello.floor);
        });
        self.view = hello.marks;
        Ok(())
    }

    async fn on_delta(&mut self, peer: StreamId, delta: Delta) -> Result<(), SessionError> {
        // The peer holds what it sent (each stream is a prefix): never echo
        // it back. Advanced before the apply, which takes the delta: if the
        // apply fails, the session ends and the view with it.
        advance_by(&mut self.view, &delta);
        // Awaited before the next frame is read: one session's applies run
        // in the order its frames arrived. With a durable store the commit
        // runs on the handle's committer thread, grouped with other
        // sessions' deltas and local appends (see `SharedReplica`).
        let report = self
            .shared
            .apply_async(delta)
            .await
            .map_err(|source| match source {
                ReplicaError::Delta(source) => {
                    match &source {
                        DeltaError::OwnStreamAhead { .. } | DeltaError::OwnFloorAboveHead { .. } => {
                            tracing::warn!(%peer, reason = %source, "peer tried to write our own stream");
                        }
                        DeltaError::ZeroSeq { .. }
                        | DeltaError::Equivocation { .. }
                        | DeltaError::LamportNotRising { .. }
                        | DeltaError::LamportTooLarge { .. }
                        | DeltaError::FloorTooLarge { .. } => {}
                    }
                    SessionError::Refused { peer, source }
                }
                ReplicaError::PayloadTooLarge { .. } | ReplicaError::TooManyStreams { .. } => {
                    SessionError::Limit { peer, source }
                }
                source => SessionError::Replica(source),
            })?;
        // Time spent committing what the peer sent is not its silence.
        self.last_frame_at = Instant::now();
        if report.applied > 0 || report.floors_raised > 0 {
            self.ack_due = true;
        }
        self.state.send_modify(|state| {
            state.events_applied += report.applied;
            state.events_duplicate += report.duplicates;
        });
        Ok(())
    }
}

/// Splits a delta into deltas of at most [`DELTA_EVENTS_MAX`] events, in
/// order, the first carrying the floor: a receiver refuses a frame of more.
/// Each part is a run of the whole's `(lamport, stream)` order, so per
/// stream it continues where the parts before it ended, as successive
/// deltas do.
fn split_delta(delta: Delta) -> Vec<Delta> {
    if delta.events.len() <= DELTA_EVENTS_MAX {
        return vec![delta];
    }
    let Delta { mut floor, events } = delta;
    let mut parts = Vec::with_capacity(events.len().div_ceil(DELTA_EVENTS_MAX));
    let mut events = events.into_iter();
    loop {
        let part: Vec<Event> = events.by_ref().take(DELTA_EVENTS_MAX).collect();
        if part.is_empty() {
            return parts;
        }
        parts.push(Delta {
            floor: std::mem::take(&mut floor),
            events: part,
        });
    }
}

/// Advances `view` by what a delta carries: per stream, its last event and
/// its floor (a replica holding seq `n` of a stream holds every seq below).
fn advance_by(view: &mut VersionVector, delta: &Delta) {
    for (stream, floor_seq) in delta.floor.iter() {
        view.advance(stream, floor_seq);
    }
    for event in &delta.events {
        view.advance(event.stream, event.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64) -> Event {
        Event {
            stream: StreamId::new(1 + seq % 3),
            seq,
            lamport: seq,
            time_ms: 0,
            payload: Bytes::new(),
        }
    }

    #[test]
    fn a_delta_is_split_at_the_event_limit_with_the_floor_in_the_first_part() {
        let floor: VersionVector = [(StreamId::new(9), 4)].into_iter().collect();
        let events: Vec<Event> = (1..=2 * DELTA_EVENTS_MAX as u64 + 1).map(event).collect();
        let parts = split_delta(Delta {
            floor: floor.clone(),
            events: events.clone(),
        });
        let lens: Vec<usize> = parts.iter().map(|part| part.events.len()).collect();
        assert_eq!(lens, [DELTA_EVENTS_MAX, DELTA_EVENTS_MAX, 1]);
        assert_eq!(parts[0].floor, floor);
        assert!(parts[1..].iter().all(|part| part.floor.is_empty()));
        let joined: Vec<Event> = parts.into_iter().flat_map(|part| part.events).collect();
        assert_eq!(joined, events);

        let small = Delta {
            floor,
            events: events[..3].to_vec(),
        };
        assert_eq!(split_delta(small.clone()), [small]);
    }
}
