//! The driver's API: making a [`Protocol`], and `poll_transmit`,
//! `handle_payload`, `handle_frame`, `poll_timeout`, each handing a frame
//! to the module that owns its rule.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::DeltaColumns;

use crate::frame::{self, Frame, FrameError, Incoming, FRAME_BYTES_MAX};
use crate::routes::{PeerDirection, RouteLink, Routes};
use crate::{ProtocolError, SessionConfig, SessionState};

use super::delta::Planned;
use super::state::{
    Acking, HelloState, LocalReplica, MarksExchange, Outgoing, Protocol, Received, Routing,
    Sending, Timing,
};
use super::timeouts::tick_interval;

impl Protocol {
    /// A protocol core for the replica whose stream is `local`, starting at
    /// `now`: its first [`Protocol::poll_transmit`] gives the hello.
    pub fn new(local: StreamId, config: SessionConfig, now: Instant) -> Self {
        let interval = tick_interval(&config);
        Protocol {
            config,
            local,
            state: SessionState::default(),
            state_changed: false,
            hello: HelloState {
                peer: None,
                peer_frame_bytes_max: FRAME_BYTES_MAX,
                peer_skips_unknown_kinds: false,
                peer_has_our_hello: false,
                hello_due: true,
                peer_takes_against: false,
                against_base: None,
                against_pending: None,
                peer_held: Vec::new(),
                peer_holds_own_stream: false,
            },
            send: Sending {
                view: VersionVector::new(),
                last_delta_at: None,
                last_delta_full: false,
                hold_until: None,
                parts: VecDeque::new(),
                next_delta_number: 1,
                in_flight: VecDeque::new(),
                acked: 0,
                peer_pending: Vec::new(),
                unsendable: BTreeMap::new(),
                forks_sent: BTreeSet::new(),
                statements_told: VersionVector::new(),
            },
            timing: Timing {
                rtt: None,
                rtt_from_hello: false,
                rtt_var: Duration::ZERO,
                rto_backoff: 0,
                started_at: now,
                last_frame_at: now,
                next_tick: now + interval,
            },
            // Nothing due, nothing received.
            acks: Acking::default(),
            marks: MarksExchange {
                peer_marks: VersionVector::new(),
                peer_marks_number: 0,
                marks_sent: VecDeque::new(),
                peer_seen: 0,
                carried: VersionVector::new(),
            },
            routing: Routing {
                link: None,
                routes_generation: 0,
                quiet_asked: HashMap::new(),
                routes_due: BTreeMap::new(),
                next_routes_number: 1,
                peer_quiet: BTreeSet::new(),
                loud_ahead: HashMap::new(),
                peer_route_numbers: HashMap::new(),
                duplicate: false,
                lag_check_due: false,
                claims_seen: 0,
                refused: BTreeSet::new(),
                behind: BTreeMap::new(),
                refused_statements: HashSet::new(),
            },
            gossip: Default::default(),
        }
    }

    /// Shares `routes` with the replica's other sessions (see [`Routes`]):
    /// a stream that arrives through another session is asked quiet here,
    /// and of two sessions with one peer only one is kept. `direction`
    /// says who dialed, the one thing both sides of two sessions agree on
    /// to keep the same one.
    ///
    /// A session that accepted the connection (`PeerDirection::Inbound`)
    /// and gossips checkpoints answers the dialer's hello instead of
    /// sending its own first: if that hello says it reads a hello against
    /// a checkpoint, ours goes so (`docs/PROTOCOL.md`, "A hello against a
    /// checkpoint"). Past a tick without the dialer's hello, ours goes
    /// whole, as a dialer's does.
    pub fn with_routes(mut self, routes: &Routes, direction: PeerDirection) -> Self {
        self.routing.link = Some(routes.join(direction));
        if direction == PeerDirection::Inbound && self.config.checkpoints {
            self.hello.hello_due = false;
        }
        self
    }

    /// The peer, if another session with it is kept instead of this one:
    /// the driver ends this session (`meshlog_sync::SessionEnd::Duplicate`).
    pub fn duplicate_of(&self) -> Option<StreamId> {
        let duplicate = self.routing.duplicate
            || self
                .routing
                .link
                .as_ref()
                .is_some_and(RouteLink::is_duplicate);
        self.hello.peer.filter(|_| duplicate)
    }

    /// The session's configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Whether this session sends the peer checkpoints:
    /// [`SessionConfig::checkpoints`] is on and the peer's hello says it
    /// skips frame kinds it does not know (so a peer built before the
    /// checkpoint frames gets none). False before the peer's hello.
    pub fn gossips_checkpoints(&self) -> bool {
        self.gossip_on()
    }

    /// The peer's stream, once its hello arrived.
    pub fn peer(&self) -> Option<StreamId> {
        self.hello.peer
    }

    /// What the core believes the peer holds.
    pub fn view(&self) -> &VersionVector {
        &self.send.view
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

    /// When the core next wants [`Protocol::handle_timeout`] (and
    /// [`Protocol::poll_transmit`] after it): its tick (the heartbeat, a
    /// hello re-sent, the read timeouts), or before it a delayed ack or the
    /// end of a send delay.
    pub fn poll_timeout(&self) -> Instant {
        [self.acks.ack_at, self.send.hold_until]
            .into_iter()
            .flatten()
            .fold(self.timing.next_tick, Instant::min)
    }

    /// Whether the core has nothing to send right now and no delta out to
    /// apply: what [`sync_once`](super::sync_once) runs to.
    pub fn is_quiescent<L: LocalReplica>(&self, local: &L) -> bool {
        self.acks.applying.is_none()
            && self.acks.applying_statement.is_none()
            && !self.hello.hello_due
            && self.send.parts.is_empty()
            && (self.hello.peer.is_none()
                || (!self.acks.heartbeat_due
                    && !self.acks.tick_due
                    && !self.acks.ack_due
                    && self.acks.ack_at.is_none()
                    && self.routing.routes_due.is_empty()
                    && !self.checkpoint_due(local)
                    && !self.statement_due(local)
                    && self.send_view_covers(&local.marks())))
    }

    /// The next frame to send, encoded with its length prefix, or `None`
    /// if nothing is due. A driver with a bounded output buffer calls it
    /// only while the buffer has room: that is the backpressure a slow peer
    /// exerts (a due ack or heartbeat waits, and is sent once).
    ///
    /// In order: a hello while one is due; then, once the peer's hello
    /// arrived, a heartbeat (which stands for a due ack), an ack, and
    /// deltas while the view does not cover our marks.
    ///
    /// # Errors
    ///
    /// [`ProtocolError::Read`] where reading the events of a delta from
    /// the replica failed (its store): nothing is sent in their place, and
    /// the session ends; [`ProtocolError::Send`] where a frame cannot be
    /// encoded.
    pub fn poll_transmit<L: LocalReplica>(
        &mut self,
        now: Instant,
        local: &L,
    ) -> Result<Option<Vec<u8>>, ProtocolError> {
        let Some(outgoing) = self.next_frame(now, local)? else {
            return Ok(None);
        };
        let (bytes, kind) = match &outgoing {
            Outgoing::Frame(frame) => (
                frame::encode_limited(frame, self.send_limit()),
                frame.kind(),
            ),
            Outgoing::Delta { number, columns } => {
                self.state.events_sent += columns.len() as u64;
                (
                    frame::encode_delta_columns_limited(*number, columns, self.send_limit()),
                    "delta",
                )
            }
        };
        let bytes = bytes.map_err(ProtocolError::Send)?;
        tracing::trace!(kind, len = bytes.len(), "frame queued");
        self.state.frames_sent += 1;
        self.state.bytes_sent += bytes.len() as u64;
        self.state_changed = true;
        Ok(Some(bytes))
    }

    fn next_frame<L: LocalReplica>(
        &mut self,
        now: Instant,
        local: &L,
    ) -> Result<Option<Outgoing>, ProtocolError> {
        if self.hello.hello_due {
            return Ok(Some(Outgoing::Frame(self.hello_frame(local))));
        }
        if self.hello.peer.is_none() {
            // Only the ask for the checkpoint a peer's hello was written
            // against, and the answer to the peer's ask for the one ours
            // was, go before the peer's hello is read.
            let frame = self
                .pending_hello_want()
                .or_else(|| self.hello_base_answer(local));
            return Ok(frame.map(Outgoing::Frame));
        }
        if self.duplicate_of().is_some() {
            return Ok(None);
        }
        self.check_behind(local);
        self.read_routes(now, local);
        if let Some(receipt) = self.receipt_frame(local) {
            return Ok(Some(Outgoing::Frame(receipt)));
        }
        if let Some(routes) = self.routes_frame() {
            return Ok(Some(Outgoing::Frame(routes)));
        }
        if let Some(checkpoint) = self.checkpoint_frame(local) {
            return Ok(Some(Outgoing::Frame(checkpoint)));
        }
        if self.send.parts.is_empty() {
            match self.plan_delta(now, local)? {
                Planned::Parts => {}
                // Statements go when no delta does: a poll that sends
                // events reads no floor for them.
                Planned::Nothing => return Ok(self.statement_frame(local).map(Outgoing::Frame)),
                Planned::Again => {
                    // Only events too large for a frame: build again
                    // without their streams (at the next poll: the state
                    // changed).
                    self.state_changed = true;
                    return self.next_frame(now, local);
                }
            }
        }
        Ok(self.next_delta_part(now))
    }

    /// Takes in one received payload (a frame without its length prefix),
    /// decoding it first. See [`Protocol::handle_frame`].
    pub fn handle_payload<L: LocalReplica>(
        &mut self,
        now: Instant,
        payload: &[u8],
        local: &L,
    ) -> Result<Received, ProtocolError> {
        let len = payload.len() + frame::LENGTH_PREFIX_BYTES;
        self.state.frames_received += 1;
        self.state.bytes_received += len as u64;
        self.state_changed = true;
        self.timing.last_frame_at = now;
        self.state.last_frame_at = Some(now);
        let incoming = match frame::decode_incoming(payload, self.config.receive_limit()) {
            Ok(incoming) => incoming,
            // A kind added after this build, from a peer that said hello
            // (our hello says we skip them): skipped whole, bounded by the
            // frame limit its bytes were read under; the session goes on.
            // Before the peer's hello it is garbage: no peer that speaks
            // the protocol sends it, so the session ends as before.
            Err(FrameError::UnknownKind { tag, .. }) if self.hello.peer.is_some() => {
                self.state.frames_skipped += 1;
                tracing::debug!(tag, len, "frame of a kind this side does not know skipped");
                return Ok(Received::Nothing);
            }
            Err(error) => {
                if matches!(error, FrameError::ProtocolVersion { .. }) {
                    // A side that waited for the peer's hello sends its
                    // own before it closes, so the peer hears our version.
                    self.hello.hello_due |= self.marks.marks_sent.is_empty();
                }
                return Err(ProtocolError::Frame(error));
            }
        };
        tracing::trace!(kind = incoming.kind(), len, "frame received");
        self.on_frame(now, incoming, local)
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
    ) -> Result<Received, ProtocolError> {
        self.state.frames_received += 1;
        self.state_changed = true;
        self.timing.last_frame_at = now;
        self.state.last_frame_at = Some(now);
        let incoming = match frame {
            Frame::Delta { number, delta } => Incoming::Delta {
                number,
                columns: DeltaColumns::from_delta(&delta),
            },
            frame => Incoming::Frame(frame),
        };
        self.on_frame(now, incoming, local)
    }

    fn on_frame<L: LocalReplica>(
        &mut self,
        now: Instant,
        incoming: Incoming,
        local: &L,
    ) -> Result<Received, ProtocolError> {
        debug_assert!(
            self.acks.applying.is_none() && self.acks.applying_statement.is_none(),
            "a frame handed in before the delta was reported"
        );
        if let Incoming::Frame(Frame::Hello(hello)) = incoming {
            self.on_hello(hello, local)?;
            return Ok(Received::Nothing);
        }
        if let Incoming::Frame(Frame::HelloAgainst(against)) = incoming {
            return self.on_hello_against(against, local);
        }
        // Only a peer that has our hello sends anything else (once we
        // sent one: an accepting side that waits for the dialer's hello
        // may be sent the checkpoint it asked for before its own).
        if !self.hello.peer_has_our_hello && !self.marks.marks_sent.is_empty() {
            self.hello.peer_has_our_hello = true;
            self.rtt_from_hello(now);
        }
        if let (None, Some(_), Incoming::Frame(Frame::Checkpoint(checkpoint))) =
            (self.hello.peer, &self.hello.against_pending, &incoming)
        {
            // The checkpoint its hello was written against, asked for.
            let checkpoint = checkpoint.clone();
            return self.on_pending_checkpoint(checkpoint, local);
        }
        if let (None, Incoming::Frame(Frame::CheckpointWant(name))) = (self.hello.peer, &incoming) {
            // The acceptor asks for the checkpoint our hello was written
            // against before it answers that hello.
            self.on_hello_base_want(*name);
            return Ok(Received::Nothing);
        }
        if self.hello.peer.is_none() {
            // Its hello was lost on the way; it re-sends it every tick.
            tracing::debug!(
                kind = incoming.kind(),
                "frame before the peer's hello ignored"
            );
            return Ok(Received::Nothing);
        }
        match incoming {
            Incoming::Delta { number, columns } => Ok(self.on_delta(now, number, columns, local)),
            Incoming::Frame(Frame::Checkpoint(checkpoint)) => self.on_checkpoint(checkpoint, local),
            Incoming::Frame(Frame::Statement(signed)) => Ok(self.on_statement(signed, local)),
            Incoming::Frame(Frame::CheckpointWant(name)) => {
                self.on_checkpoint_want(name);
                Ok(Received::Nothing)
            }
            Incoming::Frame(frame) => {
                self.on_control(now, frame)?;
                Ok(Received::Nothing)
            }
        }
    }
}
