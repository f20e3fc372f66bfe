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
//! - `meshlog_sync::Session`: a tokio task over one byte stream;
//! - [`sync_once`]: one exchange between two replicas in memory, to
//!   quiescence (tests, benchmarks, request/response transports);
//! - a runtime's own transport (a message bus, a WebSocket it owns): call
//!   [`Protocol::poll_transmit`] and send what it gives, hand what arrives
//!   to [`Protocol::handle_payload`], apply the delta it may return and
//!   report with [`Protocol::handle_applied`], and call
//!   [`Protocol::handle_timeout`] at [`Protocol::poll_timeout`].
//!
//! # Layout
//!
//! One [`Protocol`], its state grouped by concern (the hello, what we
//! send, timing, our acks, the marks both ways, routing), its rules cut
//! along the same seams:
//!
//! - this file: [`Protocol`] and its state, [`LocalReplica`],
//!   [`Received`], and the driver's API (`poll_transmit`, `handle_*`,
//!   `poll_timeout`), which hands each frame to the module that owns it;
//! - `hello`: the hello exchange and the checks on the peer's;
//! - `view`: the peer view, what the peer is believed to hold;
//! - `delta`: delta sizing, splitting and the send delay, and a received
//!   delta;
//! - `receipts`: acks and heartbeats both ways;
//! - `refusals`: what this side does not take (`admit`, the re-check of
//!   the replica's limits), and why a refused delta ends the session;
//! - `timeouts`: the tick, read timeouts, round trips and retransmission;
//! - `routing`: the routes table and the streams asked quiet;
//! - `once`: [`sync_once`] and [`hand_in`].
//!
//! # Example
//!
//! ```
//! use std::time::Instant;
//! use meshlog_cursor::StreamId;
//! use meshlog_replica::SharedReplica;
//! use meshlog_sync_core::proto::{Protocol, Received};
//! use meshlog_sync_core::SessionConfig;
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
//!         let payload = &bytes[meshlog_sync_core::frame::LENGTH_PREFIX_BYTES..];
//!         if let Received::Apply(columns) = to.handle_payload(now, payload, to_replica)? {
//!             let applied = to_replica.apply_columns(columns);
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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::{
    Admission, ApplyReport, Delta, DeltaColumns, DeltaError, Event, ReplicaError, Store,
};

use crate::frame::{
    self, Frame, Hello, Incoming, MarksDiff, Receipt, Routes as RoutesFrame, DELTA_EVENTS_MAX,
    FRAME_BYTES_MAX,
};
use meshlog_replica::SharedReplica;

use crate::routes::{PeerDirection, RouteLink, Routes};
use crate::{LimitHit, ProtocolError, SessionConfig, SessionState};

mod delta;
mod hello;
mod once;
mod receipts;
mod refusals;
mod routing;
mod timeouts;
mod view;

use delta::*;
use refusals::*;
use routing::*;
use timeouts::*;
use view::*;

pub use once::{hand_in, sync_once, SyncReport};

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
    /// [`LocalReplica::delta_for`] in columns, which is what the protocol
    /// encodes (see [`meshlog_replica::Replica::delta_columns_for`]). By
    /// default, the events of `delta_for` put in columns.
    fn delta_columns_for(&self, view: &VersionVector, byte_budget: usize) -> DeltaColumns {
        DeltaColumns::from_delta(&self.delta_for(view, byte_budget))
    }
    /// Whether the replica is relearning its own stream from peers
    /// (opened with `recover_own_stream`).
    fn is_recovering(&self) -> bool;
    /// How much of a received delta the replica takes under its limits
    /// (see [`meshlog_replica::Replica::admission`]): the delta is cut to
    /// it before it is handed back to apply (see [`LimitHit`]). The whole
    /// delta unless implemented.
    fn admission(&self, columns: &DeltaColumns) -> Admission {
        let _ = columns;
        Admission::default()
    }
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

    fn delta_columns_for(&self, view: &VersionVector, byte_budget: usize) -> DeltaColumns {
        SharedReplica::delta_columns_for(self, view, byte_budget)
    }

    fn is_recovering(&self) -> bool {
        SharedReplica::is_recovering(self)
    }

    fn admission(&self, columns: &DeltaColumns) -> Admission {
        SharedReplica::admission(self, columns)
    }
}

/// What a received frame asks of the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a delta handed back must be applied and reported with `handle_applied`"]
// One per received frame, handed straight to the caller: boxing the
// delta would cost an allocation a frame for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Received {
    /// Nothing: the frame was taken into the core's state.
    Nothing,
    /// A delta from the peer, in columns as it was written, to apply to the
    /// local replica (validate, then apply; in the order received: with
    /// [`SharedReplica::apply_columns`], or as
    /// [`DeltaColumns::to_delta`]), then report with
    /// [`Protocol::handle_applied`] before the next frame is handled.
    Apply(DeltaColumns),
}

/// One peer's side of the sync protocol, without I/O (see the module docs).
#[derive(Debug)]
pub struct Protocol {
    config: SessionConfig,
    local: StreamId,
    state: SessionState,
    state_changed: bool,
    /// The hello exchange: who the peer is and what it takes.
    hello: HelloState,
    /// What we send the peer: the view deltas are built from, deltas in flight and waiting.
    send: Sending,
    /// Round trips, retransmission and read timeouts, the tick.
    timing: Timing,
    /// Our receipts to the peer: which deltas arrived, and when an ack or heartbeat is due.
    acks: Acking,
    /// Marks both ways, numbered so that they travel as differences.
    marks: MarksExchange,
    /// The routes table and the streams asked quiet both ways, and the streams refused for a limit.
    routing: Routing,
}

/// The hello exchange: who the peer is and what it takes.
#[derive(Debug)]
struct HelloState {
    peer: Option<StreamId>,
    /// The largest frame payload the peer takes, from its hello
    /// ([`FRAME_BYTES_MAX`] until it arrives).
    peer_frame_bytes_max: usize,
    peer_has_our_hello: bool,
    hello_due: bool,
    /// Whether the peer holds its own stream up to our marks of it: its
    /// hello showed at least what we hold (the writer holds everything it
    /// wrote), so its events are never sent back to it, even those that
    /// reached us through another replica before its receipt did. False
    /// for a peer relearning its stream (its hello shows less).
    peer_holds_own_stream: bool,
}

/// What we send the peer: the view deltas are built from, deltas in flight and waiting.
#[derive(Debug)]
struct Sending {
    /// What we believe the peer holds: what to send is computed from it.
    view: VersionVector,
    /// When the last delta frame was sent, and whether it filled half the
    /// budget: new events wait up to [`SessionConfig::send_delay`] after a
    /// small one while deltas are in flight.
    last_delta_at: Option<Instant>,
    last_delta_full: bool,
    /// Until when events wait for a fuller delta (see
    /// [`SessionConfig::send_delay`]), if they do.
    hold_until: Option<Instant>,
    /// Parts of a delta too large for one frame, still to hand out, in
    /// order; the view already counts them as sent.
    parts: VecDeque<DeltaColumns>,
    /// The number of the next delta frame we send (from 1).
    next_delta_number: u64,
    /// Delta frames sent and not yet acknowledged, in number order, with
    /// what each carried: the view counts them as held until the peer's
    /// receipt says they arrived, or their retransmission timeout passes.
    in_flight: VecDeque<InFlight>,
    /// The highest delta number the peer reported receiving.
    acked: u64,
    /// Deltas the peer received but holds pending (above a hole), per
    /// stream the seqs they carried, until its marks cover them or the
    /// entry expires: the view skips them, so repairing the hole below
    /// does not send them again.
    peer_pending: Vec<PendingRange>,
    /// Our streams the peer cannot be sent past a seq (an event too large
    /// for a frame): the view counts them as held.
    unsendable: BTreeMap<StreamId, u64>,
}

/// Round trips, retransmission and read timeouts, the tick.
#[derive(Debug)]
struct Timing {
    /// The smoothed round trip from sending a delta to its ack (before the
    /// first ack, from our first hello to the peer's first other frame,
    /// which is at most a tick longer).
    rtt: Option<Duration>,
    /// Whether `rtt` is still the hello's estimate.
    rtt_from_hello: bool,
    /// How much round trips vary (the mean deviation of the samples from
    /// `rtt`, as TCP keeps it): a delta is not counted lost while a round
    /// trip this much longer than usual could still bring its ack.
    rtt_var: Duration,
    /// Retransmission timeouts in a row with no ack between: each doubles
    /// the next timeout (up to 8 times), as TCP's does.
    rto_backoff: u32,
    started_at: Instant,
    last_frame_at: Instant,
    next_tick: Instant,
}

/// Our receipts to the peer: which deltas arrived, and when an ack or heartbeat is due.
#[derive(Debug)]
struct Acking {
    heartbeat_due: bool,
    ack_due: bool,
    /// When a delayed ack is due: set by the first delta applied since the
    /// last receipt, so a burst is acknowledged once (see
    /// [`SessionConfig::ack_delay`]).
    ack_at: Option<Instant>,
    /// Deltas applied since the last receipt sent.
    unacked: u32,
    /// A delta arrived after a gap in the numbers: acknowledge at once, so
    /// that the sender repairs within a round trip.
    hole_seen: bool,
    /// The highest delta number received from the peer (what we ack).
    received: u64,
    /// The number of a delta handed back to apply and not yet reported.
    applying: Option<u64>,
}

/// Marks both ways, numbered so that they travel as differences.
#[derive(Debug)]
struct MarksExchange {
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
    /// Per stream, the last seq (or floor) the peer's deltas carried: what
    /// it knows we hold without being told.
    carried: VersionVector,
}

/// The routes table and the streams asked quiet both ways, and the streams refused for a limit.
#[derive(Debug)]
struct Routing {
    /// This session's place in the replica's routing table, if it shares
    /// one with the replica's other sessions.
    link: Option<RouteLink>,
    /// The table's generation last checked.
    routes_generation: u64,
    /// Streams we asked the peer not to push (another session brings
    /// them), with when we asked and how long the peer has been ahead.
    quiet_asked: HashMap<StreamId, QuietAsk>,
    /// Route changes to send: per stream, quiet (`true`) or loud.
    routes_due: BTreeMap<StreamId, bool>,
    /// The number of the next routes frame we send (from 1).
    next_routes_number: u64,
    /// Streams the peer asked us not to push.
    peer_quiet: BTreeSet<StreamId>,
    /// Per stream, the number of the peer's latest routes frame naming it.
    peer_route_numbers: HashMap<StreamId, u64>,
    /// Another session with the same peer is kept: this one sends nothing
    /// more and ends.
    duplicate: bool,
    /// A tick passed or a receipt arrived since the routes were checked.
    lag_check_due: bool,
    /// How many of the table's claims this session has read.
    claims_seen: usize,
    /// Streams this side cannot take from the peer (a limit: see
    /// [`LimitHit`]): asked quiet for the whole session, never loud again.
    refused: BTreeSet<StreamId>,
}

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
                peer_has_our_hello: false,
                hello_due: true,
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
            acks: Acking {
                heartbeat_due: false,
                ack_due: false,
                ack_at: None,
                unacked: 0,
                hole_seen: false,
                received: 0,
                applying: None,
            },
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
                peer_route_numbers: HashMap::new(),
                duplicate: false,
                lag_check_due: false,
                claims_seen: 0,
                refused: BTreeSet::new(),
            },
        }
    }

    /// Shares `routes` with the replica's other sessions (see [`Routes`]):
    /// a stream that arrives through another session is asked quiet here,
    /// and of two sessions with one peer only one is kept. `direction`
    /// says who dialed, the one thing both sides of two sessions agree on
    /// to keep the same one.
    pub fn with_routes(mut self, routes: &Routes, direction: PeerDirection) -> Self {
        self.routing.link = Some(routes.join(direction));
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
    /// apply: what [`sync_once`] runs to.
    pub fn is_quiescent<L: LocalReplica>(&self, local: &L) -> bool {
        self.acks.applying.is_none()
            && !self.hello.hello_due
            && self.send.parts.is_empty()
            && (self.hello.peer.is_none()
                || (!self.acks.heartbeat_due
                    && !self.acks.ack_due
                    && self.acks.ack_at.is_none()
                    && self.routing.routes_due.is_empty()
                    && self.send_view(&local.marks()).dominates(&local.marks())))
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
    ) -> Result<Option<Vec<u8>>, ProtocolError> {
        let Some(outgoing) = self.next_frame(now, local) else {
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

    fn next_frame<L: LocalReplica>(&mut self, now: Instant, local: &L) -> Option<Outgoing> {
        if self.hello.hello_due {
            return Some(Outgoing::Frame(self.hello_frame(local)));
        }
        self.hello.peer?;
        if self.duplicate_of().is_some() {
            return None;
        }
        self.read_routes(now, local);
        if let Some(receipt) = self.receipt_frame(local) {
            return Some(Outgoing::Frame(receipt));
        }
        if let Some(routes) = self.routes_frame() {
            return Some(Outgoing::Frame(routes));
        }
        if self.send.parts.is_empty() {
            match self.plan_delta(now, local) {
                Planned::Parts => {}
                Planned::Nothing => return None,
                Planned::Again => {
                    // Only events too large for a frame: build again
                    // without their streams (at the next poll: the state
                    // changed).
                    self.state_changed = true;
                    return self.next_frame(now, local);
                }
            }
        }
        self.next_delta_part(now)
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
        let incoming = frame::decode_incoming(payload, self.config.frame_limit())
            .map_err(ProtocolError::Frame)?;
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
            self.acks.applying.is_none(),
            "a frame handed in before the delta was reported"
        );
        if let Incoming::Frame(Frame::Hello(hello)) = incoming {
            self.on_hello(hello, local)?;
            return Ok(Received::Nothing);
        }
        // Only a peer that has our hello sends anything else.
        if !self.hello.peer_has_our_hello {
            self.hello.peer_has_our_hello = true;
            self.rtt_from_hello(now);
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
            Incoming::Frame(frame) => {
                self.on_control(now, frame)?;
                Ok(Received::Nothing)
            }
        }
    }
}

/// What the protocol sends next: a frame, or a delta held in columns.
enum Outgoing {
    Frame(Frame),
    Delta { number: u64, columns: DeltaColumns },
}
