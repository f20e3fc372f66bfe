//! The sans-I/O protocol core: one peer's side of the sync protocol as a
//! state machine, fed received frames and the time, handing back frames to
//! send and when to wake next.
//!
//! Every rule of a session lives here: the hello exchange, what the peer is
//! believed to hold (the *view*), how deltas are built, split and sized,
//! when to ack and heartbeat, which deltas are refused and why, and the
//! read timeouts. Nothing here touches a socket, a task, a timer or tokio:
//! time is an argument, bytes in and out are the caller's to move, and a
//! received delta is handed back to be applied by whoever owns the replica
//! (and its commits), in the manner of `quinn-proto` and `rustls`.
//!
//! Drivers:
//!
//! - [`Session`](crate::Session): a tokio task over one byte stream;
//! - [`sync_once`]: one exchange between two replicas in memory, to
//!   quiescence (tests, benchmarks, request/response transports);
//! - a runtime's own transport (a message bus, a WebSocket it owns): call
//!   [`Protocol::poll_transmit`] and send what it gives, hand what arrives
//!   to [`Protocol::handle_payload`], apply the delta it may return and
//!   report with [`Protocol::handle_applied`], and call
//!   [`Protocol::handle_timeout`] at [`Protocol::poll_timeout`].
//!
//! # Example
//!
//! ```
//! use std::time::Instant;
//! use meshlog_cursor::StreamId;
//! use meshlog_sync::proto::{Protocol, Received};
//! use meshlog_sync::{SessionConfig, SharedReplica};
//!
//! let a = SharedReplica::in_memory(StreamId::new(1));
//! let b = SharedReplica::in_memory(StreamId::new(2));
//! a.append(&b"from a"[..])?;
//! /// Carries every frame `from` has to send to `to`; whether it had any.
//! fn carry(
//!     now: Instant,
//!     from: &mut Protocol,
//!     from_replica: &SharedReplica,
//!     to: &mut Protocol,
//!     to_replica: &SharedReplica,
//! ) -> Result<bool, Box<dyn std::error::Error>> {
//!     let mut moved = false;
//!     while let Some(bytes) = from.poll_transmit(now, from_replica)? {
//!         moved = true;
//!         let payload = &bytes[meshlog_sync::frame::LENGTH_PREFIX_BYTES..];
//!         if let Received::Apply(delta) = to.handle_payload(now, payload, to_replica)? {
//!             let applied = to_replica.apply(delta);
//!             to.handle_applied(now, applied)?;
//!         }
//!     }
//!     Ok(moved)
//! }
//!
//! let now = Instant::now();
//! let mut a_side = Protocol::new(a.stream(), SessionConfig::default(), now);
//! let mut b_side = Protocol::new(b.stream(), SessionConfig::default(), now);
//! // Both ways, until neither side has anything to say.
//! while carry(now, &mut a_side, &a, &mut b_side, &b)?
//!     | carry(now, &mut b_side, &b, &mut a_side, &a)?
//! {}
//! assert_eq!(a.digest(), b.digest());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{ApplyReport, Delta, DeltaError, Event, ReplicaError, Store};

use crate::frame::{self, Frame, Hello, MarksDiff, Receipt, DELTA_EVENTS_MAX};
use crate::session::{SessionConfig, SessionError, SessionState};
use crate::SharedReplica;

/// What the protocol core reads of the local replica: its identity, its
/// marks and floor, and the deltas it builds. Implemented for
/// [`SharedReplica`]; a driver with another handle implements it over that.
pub trait LocalReplica {
    /// The replica's own writer stream.
    fn stream(&self) -> StreamId;
    /// Its marks and floor, read together (one consistent snapshot).
    fn marks_and_floor(&self) -> (VersionVector, VersionVector);
    /// Its marks (head vector).
    fn marks(&self) -> VersionVector;
    /// What a peer holding `view` misses, up to `byte_budget` (see
    /// [`meshlog_replica::Replica::delta_for`]).
    fn delta_for(&self, view: &VersionVector, byte_budget: usize) -> Delta;
    /// Whether the replica is relearning its own stream from peers
    /// (opened with `recover_own_stream`).
    fn is_recovering(&self) -> bool;
}

impl<S: Store> LocalReplica for SharedReplica<S> {
    fn stream(&self) -> StreamId {
        SharedReplica::stream(self)
    }

    fn marks_and_floor(&self) -> (VersionVector, VersionVector) {
        let change = self.latest_change();
        (change.marks, change.floor)
    }

    fn marks(&self) -> VersionVector {
        SharedReplica::marks(self)
    }

    fn delta_for(&self, view: &VersionVector, byte_budget: usize) -> Delta {
        SharedReplica::delta_for(self, view, byte_budget)
    }

    fn is_recovering(&self) -> bool {
        SharedReplica::is_recovering(self)
    }
}

/// What a received frame asks of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a delta handed back must be applied and reported with `handle_applied`"]
pub enum Received {
    /// Nothing: the frame was taken into the core's state.
    Nothing,
    /// A delta from the peer, to apply to the local replica (validate, then
    /// apply; in the order received), then report with
    /// [`Protocol::handle_applied`] before the next frame is handled.
    Apply(Delta),
}

/// One peer's side of the sync protocol, without I/O (see the module docs).
#[derive(Debug)]
pub struct Protocol {
    config: SessionConfig,
    local: StreamId,
    peer: Option<StreamId>,
    /// What we believe the peer holds: what to send is computed from it.
    view: VersionVector,
    peer_has_our_hello: bool,
    hello_due: bool,
    heartbeat_due: bool,
    ack_due: bool,
    /// Parts of a delta too large for one frame, still to hand out, in
    /// order; the view already counts them as sent.
    parts: VecDeque<Delta>,
    /// The number of the next delta frame we send (from 1).
    next_delta_number: u64,
    /// Delta frames sent and not yet acknowledged, in number order, with
    /// what each carried: the view counts them as held until the peer's
    /// receipt says they arrived, or their retransmission timeout passes.
    in_flight: VecDeque<InFlight>,
    /// The highest delta number the peer reported receiving.
    acked: u64,
    /// The smoothed round trip from sending a delta to its ack (before the
    /// first ack, from our first hello to the peer's first other frame,
    /// which is at most a tick longer).
    rtt: Option<Duration>,
    /// Whether `rtt` is still the hello's estimate.
    rtt_from_hello: bool,
    /// Retransmission timeouts in a row with no ack between: each doubles
    /// the next timeout (up to 8 times), as TCP's does.
    rto_backoff: u32,
    /// The highest delta number received from the peer (what we ack).
    received: u64,
    /// The number of a delta handed back to apply and not yet reported.
    applying: Option<u64>,
    /// What we know the peer holds for certain: the marks it reported
    /// (hello and receipts, reconstructed from their differences) joined
    /// with what it sent us. Rises only.
    peer_marks: VersionVector,
    /// The number of the latest of the peer's marks we hold (what we
    /// report as `seen`).
    peer_marks_number: u64,
    /// Our marks as numbered for this peer, oldest first: the latest, and
    /// those the peer may still report holding (a difference is taken from
    /// the one it reported last).
    marks_sent: VecDeque<(u64, VersionVector)>,
    /// The highest of our marks numbers the peer reported holding.
    peer_seen: u64,
    started_at: Instant,
    last_frame_at: Instant,
    next_tick: Instant,
    state: SessionState,
    state_changed: bool,
}

impl Protocol {
    /// A protocol core for the replica whose stream is `local`, starting at
    /// `now`: its first [`Protocol::poll_transmit`] gives the hello.
    pub fn new(local: StreamId, config: SessionConfig, now: Instant) -> Self {
        let interval = tick_interval(&config);
        Protocol {
            config,
            local,
            peer: None,
            view: VersionVector::new(),
            peer_has_our_hello: false,
            hello_due: true,
            heartbeat_due: false,
            ack_due: false,
            parts: VecDeque::new(),
            next_delta_number: 1,
            in_flight: VecDeque::new(),
            acked: 0,
            rtt: None,
            rtt_from_hello: false,
            rto_backoff: 0,
            received: 0,
            applying: None,
            peer_marks: VersionVector::new(),
            peer_marks_number: 0,
            marks_sent: VecDeque::new(),
            peer_seen: 0,
            started_at: now,
            last_frame_at: now,
            next_tick: now + interval,
            state: SessionState::default(),
            state_changed: false,
        }
    }

    /// The session's configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// The peer's stream, once its hello arrived.
    pub fn peer(&self) -> Option<StreamId> {
        self.peer
    }

    /// What the core believes the peer holds.
    pub fn view(&self) -> &VersionVector {
        &self.view
    }

    /// The session's state: the peer, its acknowledged marks, counters.
    pub fn state(&self) -> &SessionState {
        &self.state
    }

    /// Whether the state changed since the last call (for a driver that
    /// publishes it).
    pub fn take_state_changed(&mut self) -> bool {
        std::mem::take(&mut self.state_changed)
    }

    /// When the core next wants [`Protocol::handle_timeout`]: its tick (the
    /// heartbeat, a hello re-sent, the read timeouts).
    pub fn poll_timeout(&self) -> Instant {
        self.next_tick
    }

    /// Whether the core has nothing to send right now and no delta out to
    /// apply: what [`sync_once`] runs to.
    pub fn is_quiescent<L: LocalReplica>(&self, local: &L) -> bool {
        self.applying.is_none()
            && !self.hello_due
            && self.parts.is_empty()
            && (self.peer.is_none()
                || (!self.heartbeat_due && !self.ack_due && self.view.dominates(&local.marks())))
    }

    /// Serves the tick if `now` reached it: times out a silent peer, and
    /// makes a hello (until the peer has ours) and a heartbeat due.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), SessionError> {
        if now < self.next_tick {
            return Ok(());
        }
        self.next_tick = now + tick_interval(&self.config);
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
        self.hello_due |= !self.peer_has_our_hello;
        self.heartbeat_due |= self.peer.is_some();
        // A delta unacknowledged past its timeout is lost (the tail of a
        // burst: no later delta's ack shows the hole): count it as missing
        // again, so what the peer lacks of it is sent again.
        let rto = self.retransmit_timeout();
        let before = self.in_flight.len();
        self.in_flight
            .retain(|sent| now.saturating_duration_since(sent.sent_at) < rto);
        if self.in_flight.len() != before {
            self.rto_backoff = (self.rto_backoff + 1).min(RTO_BACKOFF_MAX);
            tracing::debug!(
                lost = before - self.in_flight.len(),
                ?rto,
                "delta frames unacknowledged past the retransmission timeout"
            );
            self.recompute_view();
        }
        Ok(())
    }

    /// How long a delta may go unacknowledged before it counts as lost: a
    /// heartbeat interval (the peer's receipt comes at least that often)
    /// plus two smoothed round trips (two ticks before any estimate),
    /// doubled for each timeout in a row.
    fn retransmit_timeout(&self) -> Duration {
        let interval = tick_interval(&self.config);
        let rto = interval + 2 * self.rtt.unwrap_or(2 * interval);
        rto * (1 << self.rto_backoff)
    }

    /// The view from what is certain: the peer's marks, joined with every
    /// delta still in flight (not what was lost). Parts of a delta not yet
    /// handed out were counted in the old view: they are rebuilt.
    fn recompute_view(&mut self) {
        self.view = self.peer_marks.clone();
        for sent in &self.in_flight {
            self.view.join(&sent.advance);
        }
        self.parts.clear();
    }

    /// Our receipt for the peer: the last delta received, the peer's marks
    /// held, and our marks as a difference from those the peer reported
    /// holding (numbered anew if they changed since last sent).
    fn receipt<L: LocalReplica>(&mut self, local: &L) -> Receipt {
        let marks = local.marks();
        let number = match self.marks_sent.back() {
            Some((number, sent)) if *sent == marks => *number,
            latest => {
                let number = latest.map_or(1, |(number, _)| number + 1);
                self.marks_sent.push_back((number, marks.clone()));
                if self.marks_sent.len() > MARKS_HISTORY_MAX {
                    self.marks_sent.pop_front();
                }
                number
            }
        };
        let base = self
            .marks_sent
            .iter()
            .find(|(n, _)| *n == self.peer_seen)
            .filter(|_| self.peer_seen > 0);
        let (base, changes) = match base {
            Some((base, base_marks)) => (*base, difference(&marks, base_marks)),
            // Nothing the peer holds to differ from: the whole vector.
            None => (0, marks),
        };
        Receipt {
            received: self.received,
            seen: self.peer_marks_number,
            marks: MarksDiff {
                number,
                base,
                changes,
            },
        }
    }

    /// The next frame to send, encoded with its length prefix, or `None`
    /// if nothing is due. A driver with a bounded output buffer calls it
    /// only while the buffer has room: that is the backpressure a slow peer
    /// exerts (a due ack or heartbeat waits, and is sent once).
    ///
    /// In order: a hello while one is due; then, once the peer's hello
    /// arrived, a heartbeat (which stands for a due ack), an ack, and
    /// deltas while the view does not cover our marks.
    pub fn poll_transmit<L: LocalReplica>(
        &mut self,
        now: Instant,
        local: &L,
    ) -> Result<Option<Vec<u8>>, SessionError> {
        let Some(frame) = self.next_frame(now, local) else {
            return Ok(None);
        };
        let bytes = frame::encode(&frame).map_err(SessionError::Send)?;
        tracing::trace!(kind = frame.kind(), len = bytes.len(), "frame queued");
        self.state.frames_sent += 1;
        self.state.bytes_sent += bytes.len() as u64;
        if let Frame::Delta { delta, .. } = &frame {
            self.state.events_sent += delta.events.len() as u64;
        }
        self.state_changed = true;
        Ok(Some(bytes))
    }

    fn next_frame<L: LocalReplica>(&mut self, now: Instant, local: &L) -> Option<Frame> {
        if self.hello_due {
            self.hello_due = false;
            let (marks, floor) = local.marks_and_floor();
            // The first hello's marks are our marks number 1: any hello the
            // peer holds carries them or later ones, so a difference from
            // them is sound whichever hello arrived.
            if self.marks_sent.is_empty() {
                self.marks_sent.push_back((1, marks.clone()));
            }
            return Some(Frame::Hello(Hello {
                protocol: frame::PROTOCOL_VERSION,
                stream: self.local,
                marks,
                floor,
            }));
        }
        self.peer?;
        if self.heartbeat_due {
            // A heartbeat is a receipt too: it stands for a due ack.
            self.heartbeat_due = false;
            self.ack_due = false;
            return Some(Frame::Heartbeat(self.receipt(local)));
        }
        if self.ack_due {
            self.ack_due = false;
            return Some(Frame::Ack(self.receipt(local)));
        }
        if self.parts.is_empty() {
            if self.in_flight.len() >= IN_FLIGHT_MAX {
                // Wait for receipts (or the retransmission timeout).
                return None;
            }
            let marks = local.marks();
            if self.view.dominates(&marks) {
                return None;
            }
            let delta = local.delta_for(&self.view, self.config.delta_budget());
            if delta.events.is_empty() && delta.floor.is_empty() {
                // The marks ran ahead of a compaction; nothing to send.
                return None;
            }
            advance_by(&mut self.view, &delta);
            self.parts.extend(split_delta(delta));
        }
        let part = self.parts.pop_front()?;
        let number = self.next_delta_number;
        self.next_delta_number += 1;
        let mut advance = VersionVector::new();
        advance_by(&mut advance, &part);
        self.in_flight.push_back(InFlight {
            number,
            sent_at: now,
            advance,
        });
        Some(Frame::Delta {
            number,
            delta: part,
        })
    }

    /// Takes in one received payload (a frame without its length prefix),
    /// decoding it first. See [`Protocol::handle_frame`].
    pub fn handle_payload<L: LocalReplica>(
        &mut self,
        now: Instant,
        payload: &[u8],
        local: &L,
    ) -> Result<Received, SessionError> {
        let len = payload.len() + frame::LENGTH_PREFIX_BYTES;
        self.state.frames_received += 1;
        self.state.bytes_received += len as u64;
        self.state_changed = true;
        self.last_frame_at = now;
        let frame = frame::decode_payload(payload).map_err(SessionError::Frame)?;
        tracing::trace!(kind = frame.kind(), len, "frame received");
        self.on_frame(now, frame, local)
    }

    /// Takes in one received frame, already decoded (its bytes are not
    /// counted). A delta comes back as [`Received::Apply`]: apply it, then
    /// report with [`Protocol::handle_applied`] before handing in the next
    /// frame.
    pub fn handle_frame<L: LocalReplica>(
        &mut self,
        now: Instant,
        frame: Frame,
        local: &L,
    ) -> Result<Received, SessionError> {
        self.state.frames_received += 1;
        self.state_changed = true;
        self.last_frame_at = now;
        self.on_frame(now, frame, local)
    }

    fn on_frame<L: LocalReplica>(
        &mut self,
        now: Instant,
        frame: Frame,
        local: &L,
    ) -> Result<Received, SessionError> {
        debug_assert!(
            self.applying.is_none(),
            "a frame handed in before the delta was reported"
        );
        if let Frame::Hello(hello) = frame {
            self.on_hello(hello, local)?;
            return Ok(Received::Nothing);
        }
        // Only a peer that has our hello sends anything else.
        if !self.peer_has_our_hello {
            self.peer_has_our_hello = true;
            if self.rtt.is_none() {
                // Our first hello went out when we started: a first
                // estimate of the round trip, until an ack measures it.
                self.rtt = Some(now.saturating_duration_since(self.started_at));
                self.rtt_from_hello = true;
            }
        }
        if self.peer.is_none() {
            // Its hello was lost on the way; it re-sends it every tick.
            tracing::debug!(kind = frame.kind(), "frame before the peer's hello ignored");
            return Ok(Received::Nothing);
        }
        match frame {
            Frame::Delta { number, delta } => {
                if number > self.received + 1 {
                    // A hole: the deltas between were lost (or are late).
                    // The ack that follows shows it to the sender at once.
                    tracing::debug!(
                        number,
                        received = self.received,
                        "delta frames missing before this one"
                    );
                }
                // The peer holds what it sent (each stream is a prefix):
                // never echo it back. Advanced before the apply: if the
                // apply fails, the session ends and the view with it.
                let mut advance = VersionVector::new();
                advance_by(&mut advance, &delta);
                self.view.join(&advance);
                self.peer_marks.join(&advance);
                self.applying = Some(number);
                return Ok(Received::Apply(delta));
            }
            Frame::Ack(receipt) | Frame::Heartbeat(receipt) => self.on_receipt(now, receipt)?,
            Frame::Hello(_) => unreachable!("handled above"),
        }
        Ok(Received::Nothing)
    }

    /// A receipt: learn the peer's marks, which of ours it holds, and which
    /// of our deltas arrived; then count as held only what it holds and
    /// what is still in flight, so what was lost is sent again (and what
    /// is in flight is not).
    fn on_receipt(&mut self, now: Instant, receipt: Receipt) -> Result<(), SessionError> {
        let Receipt {
            received,
            seen,
            marks,
        } = receipt;
        if marks.base > self.peer_marks_number {
            return Err(SessionError::Protocol {
                detail: format!(
                    "marks {} sent as a difference from marks {} this side never reported \
                     holding (it holds marks {})",
                    marks.number, marks.base, self.peer_marks_number
                ),
            });
        }
        let latest_ours = self.marks_sent.back().map_or(0, |(number, _)| *number);
        if seen > latest_ours {
            return Err(SessionError::Protocol {
                detail: format!("peer holds our marks {seen}; we sent up to {latest_ours}"),
            });
        }
        if received >= self.next_delta_number {
            return Err(SessionError::Protocol {
                detail: format!(
                    "peer received delta {received}; we sent up to {}",
                    self.next_delta_number - 1
                ),
            });
        }
        // Whatever we hold of the peer's marks from `base` on, joined with
        // the changes, is its marks `number`: marks only rise.
        self.peer_marks.join(&marks.changes);
        self.peer_marks_number = self.peer_marks_number.max(marks.number);
        self.state.peer_marks.join(&marks.changes);
        if seen > self.peer_seen {
            self.peer_seen = seen;
            // Older marks are never a base again.
            while self
                .marks_sent
                .front()
                .is_some_and(|(number, _)| *number < seen)
            {
                self.marks_sent.pop_front();
            }
        }
        if received < self.acked {
            // A receipt overtaken by a later one: what it says of the
            // peer's marks is old, of our deltas older still.
            self.view.join(&self.peer_marks);
            return Ok(());
        }
        self.acked = received;
        while let Some(sent) = self.in_flight.front() {
            if sent.number > received {
                break;
            }
            if sent.number == received {
                let sample = now.saturating_duration_since(sent.sent_at);
                self.rtt = Some(match self.rtt {
                    Some(rtt) if !self.rtt_from_hello => (rtt * 7 + sample) / 8,
                    _ => sample,
                });
                self.rtt_from_hello = false;
                self.rto_backoff = 0;
            }
            self.in_flight.pop_front();
        }
        // A delta sent two round trips before this receipt arrived should
        // have reached the peer before it sent the receipt: one the receipt
        // does not cover was lost (the tail of a burst, or everything sent
        // into a cut link), and is sent again now rather than at its
        // retransmission timeout.
        let lost_after = 2 * self.rtt.unwrap_or(2 * tick_interval(&self.config));
        self.in_flight
            .retain(|sent| now.saturating_duration_since(sent.sent_at) <= lost_after);
        self.recompute_view();
        Ok(())
    }

    fn on_hello<L: LocalReplica>(&mut self, hello: Hello, local: &L) -> Result<(), SessionError> {
        if hello.stream == self.local {
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
                let own_head = local.marks().get(self.local);
                let claimed = hello.marks.get(self.local);
                if claimed > own_head && !local.is_recovering() {
                    // Only we write our stream: a peer holding more of it
                    // than we do saw a forged stream, or a previous life of
                    // ours whose store was lost (open with
                    // `recover_own_stream` to relearn it). Its deltas of
                    // our stream beyond our head are refused.
                    tracing::warn!(
                        local = %self.local,
                        peer = %hello.stream,
                        claimed,
                        own_head,
                        "suspicious hello: the peer claims more of our own stream than we wrote"
                    );
                }
                self.peer = Some(hello.stream);
                tracing::debug!(local = %self.local, peer = %hello.stream, marks = ?hello.marks, "sync session established");
            }
        }
        self.state.peer = Some(hello.stream);
        self.state.peer_marks.join(&hello.marks);
        self.state.peer_floor.join(&hello.floor);
        // The peer's hello marks are its marks number 1.
        self.peer_marks.join(&hello.marks);
        self.peer_marks_number = self.peer_marks_number.max(1);
        self.recompute_view();
        Ok(())
    }

    /// Reports how applying the delta last handed back went. A refused
    /// delta ends the session ([`SessionError::Refused`] for what the peer
    /// did wrong, [`SessionError::Limit`] for a local limit it exceeds,
    /// [`SessionError::Replica`] for our own store failing); one that
    /// changed our log makes an ack due.
    pub fn handle_applied(
        &mut self,
        now: Instant,
        applied: Result<ApplyReport, ReplicaError>,
    ) -> Result<(), SessionError> {
        let number = self.applying.take();
        let peer = self.peer.unwrap_or(self.local);
        let report = applied.map_err(|source| match source {
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
        self.last_frame_at = now;
        // Acked whether or not it changed our log: the ack is how the
        // peer learns the delta arrived (and, by what our marks lack, what
        // was lost before it).
        if let Some(number) = number {
            self.received = self.received.max(number);
            self.ack_due = true;
        }
        self.state.events_applied += report.applied;
        self.state.events_duplicate += report.duplicates;
        self.state_changed = true;
        Ok(())
    }
}

/// The most delta frames in flight (sent, not acknowledged) at once: past
/// it, no new delta is built until a receipt (or the retransmission
/// timeout) retires some.
const IN_FLIGHT_MAX: usize = 256;

/// The most numbered marks kept for differences: the latest and those the
/// peer may still report holding. Past it the oldest goes, and a peer
/// reporting it gets the whole vector once.
const MARKS_HISTORY_MAX: usize = 32;

/// The most doublings of the retransmission timeout.
const RTO_BACKOFF_MAX: u32 = 3;

/// A delta frame sent and not yet acknowledged.
#[derive(Debug)]
struct InFlight {
    number: u64,
    sent_at: Instant,
    /// Per stream, the last seq (or floor) it carried.
    advance: VersionVector,
}

/// Every stream of `marks` whose seq is above its seq in `base`, with its
/// seq in `marks`.
fn difference(marks: &VersionVector, base: &VersionVector) -> VersionVector {
    marks
        .iter()
        .filter(|&(stream, seq)| seq > base.get(stream))
        .collect()
}

/// The tick: the heartbeat interval, at least 1 ms.
fn tick_interval(config: &SessionConfig) -> Duration {
    config.heartbeat_interval.max(Duration::from_millis(1))
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

/// What one [`sync_once`] exchange did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// The first replica's side: frames, bytes and events it sent and
    /// received, the peer marks it learned.
    pub a: SessionState,
    /// The second replica's side.
    pub b: SessionState,
    /// Flights: times frames crossed, one way or the other, until neither
    /// side had anything to send (a round trip is two).
    pub flights: u32,
    /// Whether the exchange reached quiescence (false only if it hit the
    /// flight limit, which a correct exchange never does).
    pub quiescent: bool,
}

/// The most flights [`sync_once`] makes before it gives up.
const SYNC_ONCE_FLIGHTS_MAX: u32 = 100_000;

/// Runs one exchange between two replicas in memory, to quiescence: each
/// side sends its hello, then each sends the other what it misses and acks
/// what it applied, turn by turn, until neither has anything left to send.
/// Frames go through the codec (so bytes are counted as on a wire); no
/// clock runs, so no heartbeat is sent.
///
/// For tests, benchmarks and request/response transports: the rules are
/// those of a [`Session`](crate::Session), without a task or a stream.
///
/// ```
/// use meshlog_cursor::StreamId;
/// use meshlog_sync::{sync_once, SessionConfig, SharedReplica};
///
/// let a = SharedReplica::in_memory(StreamId::new(1));
/// let b = SharedReplica::in_memory(StreamId::new(2));
/// a.append(&b"from a"[..])?;
/// b.append(&b"from b"[..])?;
/// let report = sync_once(&a, &b, &SessionConfig::default())?;
/// assert!(report.quiescent);
/// assert_eq!(a.digest(), b.digest());
/// assert_eq!(report.a.events_sent, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sync_once<A, B>(
    a: &SharedReplica<A>,
    b: &SharedReplica<B>,
    config: &SessionConfig,
) -> Result<SyncReport, SessionError>
where
    A: Store + Send + Sync + 'static,
    B: Store + Send + Sync + 'static,
{
    let now = Instant::now();
    let mut a_side = Protocol::new(a.stream(), config.clone(), now);
    let mut b_side = Protocol::new(b.stream(), config.clone(), now);
    let mut flights = 0;
    let mut a_turn = true;
    let mut idle_turns = 0;
    while idle_turns < 2 {
        if flights >= SYNC_ONCE_FLIGHTS_MAX {
            return Ok(SyncReport {
                a: a_side.state.clone(),
                b: b_side.state.clone(),
                flights,
                quiescent: false,
            });
        }
        let moved = if a_turn {
            flight(now, &mut a_side, a, &mut b_side, b)?
        } else {
            flight(now, &mut b_side, b, &mut a_side, a)?
        };
        a_turn = !a_turn;
        if moved {
            flights += 1;
            idle_turns = 0;
        } else {
            idle_turns += 1;
        }
    }
    Ok(SyncReport {
        a: a_side.state.clone(),
        b: b_side.state.clone(),
        flights,
        quiescent: true,
    })
}

/// Everything `from` has to send, carried to `to` and handled there;
/// whether anything was sent.
fn flight<F, T>(
    now: Instant,
    from: &mut Protocol,
    from_replica: &SharedReplica<F>,
    to: &mut Protocol,
    to_replica: &SharedReplica<T>,
) -> Result<bool, SessionError>
where
    F: Store + Send + Sync + 'static,
    T: Store + Send + Sync + 'static,
{
    let mut sent = Vec::new();
    while let Some(bytes) = from.poll_transmit(now, from_replica)? {
        sent.push(bytes);
    }
    for bytes in &sent {
        let payload = &bytes[frame::LENGTH_PREFIX_BYTES..];
        if let Received::Apply(delta) = to.handle_payload(now, payload, to_replica)? {
            let applied = to_replica.apply(delta);
            to.handle_applied(now, applied)?;
        }
    }
    Ok(!sent.is_empty())
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

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
