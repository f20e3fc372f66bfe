//! `Session`: anti-entropy between this replica and one peer over one byte
//! stream.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use meshlog_cursor::StreamId;
use meshlog_replica::{MemStore, Store};
use meshlog_sync_core::proto::{PeerMemory, Protocol, Received};
use meshlog_sync_core::{PeerDirection, ProtocolError, Routes, SessionConfig, SessionState};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{sleep_until, Instant};

use crate::frame::{FrameError, FrameReader};
use crate::lock;
// Named by the docs only.
#[cfg(doc)]
use crate::frame::DELTA_EVENTS_MAX;
use crate::wants::{CheckpointWants, Registration};
use crate::{ChangeWatch, SharedReplica};

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

/// Why a session ended badly: the protocol core's reason
/// ([`ProtocolError`]: a bad frame, a refused delta, a read timeout...), or
/// the stream's, which only a driver meets. Each is logged
/// (`tracing::warn!`) with its reason when the session ends; the replica's
/// log is unchanged by the frame that caused it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The protocol core ended the session: what the peer sent or did, a
    /// local limit, the local replica failing, or a read timeout.
    #[error(transparent)]
    Core(#[from] ProtocolError),
    /// The byte stream failed, or ended inside a frame.
    #[error("link failed: {0}")]
    Io(#[source] io::Error),
    /// Queued output, or a flush, made no progress for the write timeout:
    /// the peer is not reading.
    #[error("{queued_bytes} queued bytes made no progress for {stalled:?} (write timeout)")]
    WriteTimeout {
        /// How long writing stalled.
        stalled: Duration,
        /// Bytes waiting to be written.
        queued_bytes: usize,
    },
}

impl From<io::Error> for SessionError {
    fn from(error: io::Error) -> Self {
        match FrameError::of_io(&error) {
            Some(frame_error) => ProtocolError::Frame(frame_error.clone()).into(),
            None => SessionError::Io(error),
        }
    }
}

/// Anti-entropy with one peer over one byte stream (a TCP connection, an
/// in-memory duplex, a fault proxy's end).
///
/// The protocol's rules are those of the sans-I/O core,
/// [`Protocol`] (see `docs/PROTOCOL.md`); the
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
    wants: Option<CheckpointWants>,
    memory: Option<Arc<Mutex<PeerMemory>>>,
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
            wants: None,
            memory: None,
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

    /// Takes asks for checkpoints by name from `wants` (shared by the
    /// replica's sessions) to its peer, once the peer takes checkpoint
    /// frames, and bumps `wants`' kept count when it keeps a checkpoint
    /// its peer sent. Without it, the session asks only for what its own
    /// gossip needs.
    pub fn with_checkpoint_wants(mut self, wants: CheckpointWants) -> Self {
        self.wants = Some(wants);
        self
    }

    /// Starts from what the last session with the same peer learned of it
    /// (a link's memory, [`PeerLink`](crate::PeerLink)'s for a peer it
    /// dials), and leaves there what this one learns when it ends: if the
    /// peer read a hello against a checkpoint then, this session's first
    /// hello goes against one (`docs/PROTOCOL.md`, "The dialer's hello");
    /// a session that never hears the peer's hello leaves nothing, so the
    /// next goes whole. See [`Protocol::with_peer_memory`].
    pub fn with_peer_memory(mut self, memory: Arc<Mutex<PeerMemory>>) -> Self {
        self.memory = Some(memory);
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
        let memory = self.memory;
        if let Some(memory) = &memory {
            protocol = protocol.with_peer_memory(&lock(memory));
        }
        let reader = FrameReader::with_limit(self.config.receive_limit());
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
            mint_at: now,
            wants: self.wants.as_ref().map(CheckpointWants::register),
        };
        let result = driver.run(stop).await;
        driver.publish();
        if let Some(memory) = &memory {
            *lock(memory) = driver.protocol.peer_memory();
        }
        if let Err(SessionError::Core(ProtocolError::Frame(FrameError::ProtocolVersion {
            theirs,
            ours,
        }))) = &result
        {
            // Our hello says which version we speak: make sure it reaches
            // a peer of another version before we close, so it can say why
            // too (an older peer logs that we speak version 4).
            tracing::warn!(
                %local,
                theirs,
                ours,
                "refusing a peer that speaks sync protocol version {theirs}: this side speaks \
                 version {ours}; upgrade the older side"
            );
            // An accepting side that waited for the dialer's hello has
            // its own due now (the core made it so): queue it.
            let _ = driver.fill();
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
    /// A checkpoint asked for by name (`CheckpointWants::ask`).
    Wanted(meshlog_cursor::CheckpointName),
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
    /// When this session next asks the replica to mint a checkpoint, if
    /// one is due (`SessionConfig::checkpoints`): once a heartbeat
    /// interval; the replica's own rate limit decides.
    mint_at: Instant,
    /// This session's slot in the replica's checkpoint wants, if given.
    wants: Option<Registration>,
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
            let turn = self.next_turn(stop.as_mut(), read_first).await;
            read_first = !matches!(turn, Turn::Read(_));
            if let Some(end) = self.serve(turn).await? {
                return Ok(end);
            }
        }
    }

    /// Waits for the first branch ready in this turn's order: `stop`, the
    /// tick, then reading and writing (reading first if `read_first`),
    /// then the replica's marks.
    async fn next_turn<F: Future>(&mut self, stop: Pin<&mut F>, read_first: bool) -> Turn {
        let next_tick = Instant::from_std(self.protocol.poll_timeout());
        let has_output = !self.out.is_empty();
        // Biased, in an order fixed per turn: a run under tokio's paused
        // clock replays exactly from its seeds. Two selects rather than
        // one, because a select's order is fixed where it is written.
        // The tick goes first, even before a frame that is ready: it can
        // then time out a peer whose frame waits unread only if this
        // session went unpolled for a whole read timeout, in which case
        // it sent no heartbeat for as long and the peer times out too.
        if read_first {
            tokio::select! {
                biased;
                _ = stop => Turn::Stop,
                _ = sleep_until(next_tick) => Turn::Tick,
                read = self.reader.read_payload(&mut self.read) => Turn::Read(read),
                written = self.write.write(&self.out), if has_output => Turn::Wrote(written),
                _ = self.marks.receiver().changed() => Turn::MarksChanged,
                Some(name) = next_want(self.wants.as_mut()) => Turn::Wanted(name),
            }
        } else {
            tokio::select! {
                biased;
                _ = stop => Turn::Stop,
                _ = sleep_until(next_tick) => Turn::Tick,
                written = self.write.write(&self.out), if has_output => Turn::Wrote(written),
                read = self.reader.read_payload(&mut self.read) => Turn::Read(read),
                _ = self.marks.receiver().changed() => Turn::MarksChanged,
                Some(name) = next_want(self.wants.as_mut()) => Turn::Wanted(name),
            }
        }
    }

    /// Serves one turn; how the session ends, if it ends there.
    async fn serve(&mut self, turn: Turn) -> Result<Option<SessionEnd>, SessionError> {
        match turn {
            Turn::Stop => return Ok(Some(SessionEnd::Stopped)),
            Turn::Tick => {
                self.on_tick()?;
                self.mint().await;
            }
            Turn::Read(read) => match read? {
                Some(payload) => {
                    self.on_payload(payload).await?;
                    // Frames served from our own buffer touch no socket,
                    // so nothing else would make us yield under a flood.
                    tokio::task::coop::consume_budget().await;
                }
                None => return Ok(Some(SessionEnd::PeerClosed)),
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
            // Queued in the core (or not: the peer does not take the
            // frames, or this side holds it now); sent by the next fill.
            Turn::Wanted(name) => {
                self.protocol.want_checkpoint(name, &self.shared);
            }
        }
        Ok(None)
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
        if let Some(wants) = &self.wants {
            wants.set_takes(self.protocol.takes_checkpoint_frames());
        }
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
        match received {
            Received::Apply(columns) => {
                // Awaited before the next frame is read: one session's applies
                // run in the order its frames arrived. With a durable store the
                // commit runs on the handle's committer thread, grouped with
                // other sessions' deltas and local appends (see
                // `SharedReplica`).
                let applied = self.shared.apply_columns_async(columns).await;
                self.protocol
                    .handle_applied(Instant::now().into_std(), applied)?;
            }
            Received::Checkpoint(checkpoint) => {
                // Checked against its name by the core. A store that fails
                // to record it costs the tokens naming it, not the session.
                let name = checkpoint.name();
                match self.shared.keep_checkpoint_async(checkpoint).await {
                    Ok(_) => {
                        if let Some(wants) = &self.wants {
                            wants.wants().received();
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%name, %error, "a received checkpoint was not kept")
                    }
                }
            }
            Received::Nothing => {}
        }
        Ok(())
    }

    /// Asks the replica to mint a checkpoint from its marks, once a
    /// heartbeat interval, on a session that gossips them (configured so,
    /// with a peer whose hello says it takes them); the replica
    /// mints only when one is due (`Replica::mint_checkpoint`), at the
    /// wall clock's time.
    async fn mint(&mut self) {
        let now = Instant::now();
        if !self.protocol.gossips_checkpoints() || now < self.mint_at {
            return;
        }
        self.mint_at = now + self.config.heartbeat_interval;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        match self.shared.mint_checkpoint_async(now_ms).await {
            Ok(Some(checkpoint)) => tracing::debug!(name = %checkpoint.name(), "checkpoint minted"),
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "minting a checkpoint failed"),
        }
    }
}

/// The next checkpoint name asked of this session; never, without wants.
async fn next_want(wants: Option<&mut Registration>) -> Option<meshlog_cursor::CheckpointName> {
    match wants {
        Some(wants) => wants.next().await,
        None => std::future::pending().await,
    }
}
