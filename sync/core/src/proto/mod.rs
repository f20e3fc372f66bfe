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
use meshlog_replica::{ApplyReport, Delta, DeltaColumns, DeltaError, Event, ReplicaError, Store};

use crate::frame::{
    self, Frame, Hello, Incoming, MarksDiff, Receipt, Routes as RoutesFrame, DELTA_EVENTS_MAX,
    FRAME_BYTES_MAX,
};
use meshlog_replica::SharedReplica;

use crate::routes::{PeerDirection, RouteLink, Routes};
use crate::{LimitHit, ProtocolError, SessionConfig, SessionState};

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
    /// The replica's limits on what it takes in: `(streams_max,
    /// payload_bytes_max)`. A delta is cut to fit them before it is handed
    /// back to apply (see [`LimitHit`]). Unbounded unless implemented.
    fn limits(&self) -> (usize, usize) {
        (usize::MAX, usize::MAX)
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

    fn limits(&self) -> (usize, usize) {
        let config = self.config();
        (config.streams_max, config.payload_bytes_max)
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
    peer: Option<StreamId>,
    /// The largest frame payload the peer takes, from its hello
    /// ([`FRAME_BYTES_MAX`] until it arrives).
    peer_frame_bytes_max: usize,
    /// What we believe the peer holds: what to send is computed from it.
    view: VersionVector,
    peer_has_our_hello: bool,
    hello_due: bool,
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
    /// Deltas the peer received but holds pending (above a hole), per
    /// stream the seqs they carried, until its marks cover them or the
    /// entry expires: the view skips them, so repairing the hole below
    /// does not send them again.
    peer_pending: Vec<PendingRange>,
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
    /// Per stream, the last seq (or floor) the peer's deltas carried: what
    /// it knows we hold without being told.
    carried: VersionVector,
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
    /// Our streams the peer cannot be sent past a seq (an event too large
    /// for a frame): the view counts them as held.
    unsendable: BTreeMap<StreamId, u64>,
    /// Whether the peer holds its own stream up to our marks of it: its
    /// hello showed at least what we hold (the writer holds everything it
    /// wrote), so its events are never sent back to it, even those that
    /// reached us through another replica before its receipt did. False
    /// for a peer relearning its stream (its hello shows less).
    peer_holds_own_stream: bool,
}

/// A stream asked quiet on this session.
#[derive(Debug, Clone, Copy)]
struct QuietAsk {
    asked_at: Instant,
    /// Since when the peer's marks show the stream above ours, and the seq
    /// they showed then.
    ahead: Option<(u64, Instant)>,
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
            peer_frame_bytes_max: FRAME_BYTES_MAX,
            view: VersionVector::new(),
            peer_has_our_hello: false,
            hello_due: true,
            heartbeat_due: false,
            ack_due: false,
            ack_at: None,
            unacked: 0,
            hole_seen: false,
            last_delta_at: None,
            last_delta_full: false,
            hold_until: None,
            parts: VecDeque::new(),
            next_delta_number: 1,
            in_flight: VecDeque::new(),
            acked: 0,
            rtt: None,
            rtt_from_hello: false,
            rtt_var: Duration::ZERO,
            peer_pending: Vec::new(),
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
            link: None,
            routes_generation: 0,
            quiet_asked: HashMap::new(),
            routes_due: BTreeMap::new(),
            next_routes_number: 1,
            peer_quiet: BTreeSet::new(),
            carried: VersionVector::new(),
            peer_route_numbers: HashMap::new(),
            duplicate: false,
            lag_check_due: false,
            claims_seen: 0,
            refused: BTreeSet::new(),
            unsendable: BTreeMap::new(),
            peer_holds_own_stream: false,
        }
    }

    /// Shares `routes` with the replica's other sessions (see [`Routes`]):
    /// a stream that arrives through another session is asked quiet here,
    /// and of two sessions with one peer only one is kept. `direction`
    /// says who dialed, the one thing both sides of two sessions agree on
    /// to keep the same one.
    pub fn with_routes(mut self, routes: &Routes, direction: PeerDirection) -> Self {
        self.link = Some(routes.join(direction));
        self
    }

    /// The peer, if another session with it is kept instead of this one:
    /// the driver ends this session (`meshlog_sync::SessionEnd::Duplicate`).
    pub fn duplicate_of(&self) -> Option<StreamId> {
        let duplicate = self.duplicate || self.link.as_ref().is_some_and(RouteLink::is_duplicate);
        self.peer.filter(|_| duplicate)
    }

    /// The view deltas are built from: the view, with every stream the
    /// peer asked quiet counted as held up to our marks.
    fn send_view(&self, marks: &VersionVector) -> std::borrow::Cow<'_, VersionVector> {
        let own = self
            .peer
            .filter(|&peer| self.peer_holds_own_stream && self.view.get(peer) < marks.get(peer));
        if self.peer_quiet.is_empty() && own.is_none() && self.unsendable.is_empty() {
            return std::borrow::Cow::Borrowed(&self.view);
        }
        let mut view = self.view.clone();
        for &stream in self.unsendable.keys() {
            view.advance(stream, marks.get(stream));
        }
        if let Some(peer) = own {
            view.advance(peer, marks.get(peer));
        }
        for &stream in &self.peer_quiet {
            view.advance(stream, marks.get(stream));
        }
        std::borrow::Cow::Owned(view)
    }

    /// How long a peer may show a stream ahead of ours, on a session that
    /// asked it quiet, before this session takes the stream over: a tick
    /// and two round trips, the time the source session has to bring it.
    fn lag_allowed(&self) -> Duration {
        3 * tick_interval(&self.config) + 2 * self.rtt.unwrap_or(tick_interval(&self.config))
    }

    /// Re-checks the streams asked quiet: loud again if their source
    /// session ended, or taken over if the peer has shown them ahead of us
    /// for longer than [`Protocol::lag_allowed`].
    fn check_routes<L: LocalReplica>(&mut self, now: Instant, local: &L) {
        let Some(link) = &self.link else {
            return;
        };
        self.routes_generation = link.generation();
        if self.quiet_asked.is_empty() {
            return;
        }
        let marks = local.marks();
        let lag_allowed = self.lag_allowed();
        let mut loud = Vec::new();
        for (&stream, ask) in &mut self.quiet_asked {
            let Some(source_since) = link.other_source_since(stream) else {
                loud.push(stream);
                continue;
            };
            let (theirs, ours) = (self.peer_marks.get(stream), marks.get(stream));
            ask.ahead = match ask.ahead {
                _ if theirs <= ours => None,
                None => Some((theirs, now)),
                Some((target, _)) if ours >= target => Some((theirs, now)),
                Some((target, since)) => {
                    if now.saturating_duration_since(since) > lag_allowed
                        && now.saturating_duration_since(source_since) > lag_allowed
                    {
                        tracing::debug!(%stream, theirs, ours, "the stream's source lags: taken over");
                        link.take_over(stream, now);
                        loud.push(stream);
                    }
                    Some((target, since))
                }
            };
        }
        for stream in loud {
            self.quiet_asked.remove(&stream);
            self.routes_due.insert(stream, false);
        }
    }

    /// Asks the peer not to push `stream` (another session brings it).
    fn ask_quiet(&mut self, stream: StreamId, now: Instant) {
        self.quiet_asked.insert(
            stream,
            QuietAsk {
                asked_at: now,
                ahead: None,
            },
        );
        self.routes_due.insert(stream, true);
    }

    /// Events of `streams` arrived in a delta: a stream another session
    /// brings is asked quiet here (again, if asked a while ago and still
    /// pushed: the routes frame may have been lost).
    fn route_received(&mut self, now: Instant, streams: &BTreeSet<StreamId>) {
        let Some(link) = &self.link else {
            return;
        };
        let resend_after = self.lag_allowed();
        let mut asks = Vec::new();
        for &stream in streams {
            if stream == self.local || self.refused.contains(&stream) {
                continue;
            }
            if link.claim(stream, now) {
                if self.quiet_asked.remove(&stream).is_some() {
                    self.routes_due.insert(stream, false);
                }
                continue;
            }
            match self.quiet_asked.get_mut(&stream) {
                Some(ask) if now.saturating_duration_since(ask.asked_at) <= resend_after => {}
                Some(ask) => {
                    ask.asked_at = now;
                    self.routes_due.insert(stream, true);
                }
                None => asks.push(stream),
            }
        }
        for stream in asks {
            self.ask_quiet(stream, now);
        }
    }

    /// Cuts what the replica's limits cannot take from a received delta:
    /// events of streams beyond `streams_max` (every stream the replica
    /// does not hold yet, once it holds that many), and each stream from
    /// its first event above `payload_bytes_max` on. Those streams are
    /// asked quiet for the rest of the session, reported in the state
    /// ([`SessionState::limits`]) and logged once each; the rest of the
    /// delta is applied as usual. The replica's apply still checks both
    /// limits: a delta that slips past this (a stream count that changed
    /// meanwhile) ends the session with [`ProtocolError::Limit`] as before.
    fn admit<L: LocalReplica>(&mut self, columns: &mut DeltaColumns, local: &L) {
        let (streams_max, payload_bytes_max) = local.limits();
        if streams_max == usize::MAX && payload_bytes_max == usize::MAX {
            return;
        }
        let (marks, floor) = local.marks_and_floor();
        let held = |stream: StreamId| marks.get(stream) > 0 || floor.get(stream) > 0;
        let mut streams_held =
            marks.iter().filter(|&(s, _)| !held_in(&floor, s)).count() + floor.len();
        let mut cut: BTreeMap<StreamId, u64> = BTreeMap::new();
        let mut admitted: BTreeSet<StreamId> = BTreeSet::new();
        let peer = self.peer.unwrap_or(self.local);
        // The stream checks run once per change of stream (a delta comes
        // grouped by stream); the payload check per event, up to a cut.
        let mut checked: Option<StreamId> = None;
        // No payload can pass the limit when all of them together do not.
        let payloads_fit = columns.payloads().len() <= payload_bytes_max;
        let mut index = 0;
        for run in columns.runs() {
            let stream = run.stream;
            let first_index = index;
            index += run.len;
            let cut_from = cut.get(&stream).copied();
            if cut_from.is_some_and(|from| run.first_seq >= from) {
                continue;
            }
            if checked != Some(stream) {
                checked = Some(stream);
                if self.refused.contains(&stream) {
                    cut.insert(stream, 0);
                    continue;
                }
                if !admitted.contains(&stream) && !held(stream) {
                    if streams_held >= streams_max {
                        tracing::warn!(
                            %peer,
                            %stream,
                            limit = streams_max,
                            "stream refused: this replica already holds streams_max = {streams_max} \
                             streams; raise streams_max (at most 16,383, what a cursor carries) to \
                             take it. Its events are not asked of this peer again in this session"
                        );
                        self.refuse(
                            stream,
                            LimitHit::StreamsMax {
                                stream,
                                limit: streams_max,
                            },
                        );
                        cut.insert(stream, 0);
                        continue;
                    }
                    streams_held += 1;
                    admitted.insert(stream);
                }
            }
            if payloads_fit {
                continue;
            }
            let below = cut_from.unwrap_or(u64::MAX);
            let over = (0..run.len).find(|&i| {
                run.first_seq + i as u64 >= below
                    || columns.payload(first_index + i).len() > payload_bytes_max
            });
            let Some(i) = over else {
                continue;
            };
            let seq = run.first_seq + i as u64;
            if seq >= below {
                continue;
            }
            let len = columns.payload(first_index + i).len();
            tracing::warn!(
                %peer,
                %stream,
                seq,
                len,
                limit = payload_bytes_max,
                "event refused: its payload exceeds payload_bytes_max = {payload_bytes_max}; \
                 the stream stops below it here until payload_bytes_max is raised"
            );
            self.refuse(
                stream,
                LimitHit::PayloadBytesMax {
                    stream,
                    seq,
                    len,
                    limit: payload_bytes_max,
                },
            );
            cut.insert(stream, seq);
        }
        if cut.is_empty() {
            return;
        }
        // Rare: the delta is made again without what was cut.
        let mut delta = std::mem::take(columns).into_delta();
        let before = delta.events.len();
        delta
            .events
            .retain(|event| cut.get(&event.stream).is_none_or(|&from| event.seq < from));
        delta.floor = delta
            .floor
            .iter()
            .filter(|&(stream, _)| cut.get(&stream) != Some(&0))
            .collect();
        self.state.events_over_limit += (before - delta.events.len()) as u64;
        self.state_changed = true;
        *columns = DeltaColumns::from_delta(&delta);
    }

    /// Records a stream this side cannot take: asked quiet, reported.
    fn refuse(&mut self, stream: StreamId, hit: LimitHit) {
        if self.refused.insert(stream) {
            self.quiet_asked.remove(&stream);
            self.routes_due.insert(stream, true);
            self.state.limits.push(hit);
        }
    }

    /// The largest frame payload we send: the smaller of our limit and
    /// the peer's (from its hello; the default before it arrives).
    fn send_limit(&self) -> usize {
        self.config.frame_limit().min(self.peer_frame_bytes_max)
    }

    /// The largest payload that fits a frame we send with a delta's
    /// `floor` (whatever else the frame holds).
    fn frame_payload_max(&self, floor: &VersionVector) -> usize {
        let floor_bytes = frame::vector_bytes_max(floor);
        self.send_limit()
            .saturating_sub(floor_bytes + EVENT_FRAME_OVERHEAD_MAX)
    }

    /// Cuts from a delta to send every event too large for a frame (with
    /// the delta's floor), and what follows it in its stream: that stream
    /// is not sent to this peer past it in this session, reported
    /// ([`LimitHit::FrameBytesMax`]) and logged once. Whether anything was
    /// cut.
    fn cut_unsendable(&mut self, delta: &mut Delta) -> bool {
        let limit = self.send_limit();
        let payload_max = self.frame_payload_max(&delta.floor);
        let mut cut: BTreeMap<StreamId, u64> = BTreeMap::new();
        for event in &delta.events {
            if event.payload.len() > payload_max && !cut.contains_key(&event.stream) {
                cut.insert(event.stream, event.seq);
            }
        }
        if cut.is_empty() {
            return false;
        }
        let peer = self.peer.unwrap_or(self.local);
        for (&stream, &seq) in &cut {
            let len = delta
                .events
                .iter()
                .find(|event| event.stream == stream && event.seq == seq)
                .map_or(0, |event| event.payload.len());
            tracing::warn!(
                %peer,
                %stream,
                seq,
                len,
                limit,
                ours = self.config.frame_limit(),
                theirs = self.peer_frame_bytes_max,
                "event not sent: with its frame it exceeds the frame limit of {limit} bytes \
                 (the smaller of this side's frame_bytes_max and the peer's; under the default \
                 4 MiB at most 3,866,582 bytes of payload always fit): the stream is not sent \
                 to this peer past it; raise frame_bytes_max on both sides"
            );
            self.unsendable.insert(stream, seq);
            self.state.limits.push(LimitHit::FrameBytesMax {
                stream,
                seq,
                len,
                limit,
            });
        }
        let before = delta.events.len();
        delta
            .events
            .retain(|event| cut.get(&event.stream).is_none_or(|&from| event.seq < from));
        self.state.events_over_limit += (before - delta.events.len()) as u64;
        self.state_changed = true;
        true
    }

    /// The routes frame for what changed, if anything did (at most
    /// `STREAMS_MAX` streams of each kind; the rest in the next).
    fn routes_frame(&mut self) -> Option<Frame> {
        if self.routes_due.is_empty() {
            return None;
        }
        let (mut quiet, mut loud) = (Vec::new(), Vec::new());
        while let Some((stream, is_quiet)) = self.routes_due.pop_first() {
            if is_quiet {
                quiet.push(stream);
            } else {
                loud.push(stream);
            }
            if quiet.len() == meshlog_cursor::STREAMS_MAX
                || loud.len() == meshlog_cursor::STREAMS_MAX
            {
                break;
            }
        }
        let number = self.next_routes_number;
        self.next_routes_number += 1;
        self.state.routes_sent += 1;
        Some(Frame::Routes(RoutesFrame {
            number,
            quiet,
            loud,
        }))
    }

    /// The peer's routes: each stream named follows the latest-numbered
    /// frame naming it.
    fn on_routes(&mut self, routes: RoutesFrame) {
        let number = routes.number;
        for (streams, quiet) in [(routes.quiet, true), (routes.loud, false)] {
            for stream in streams {
                let latest = self.peer_route_numbers.entry(stream).or_insert(0);
                if number <= *latest {
                    continue;
                }
                *latest = number;
                if quiet {
                    self.peer_quiet.insert(stream);
                } else {
                    self.peer_quiet.remove(&stream);
                }
            }
        }
        self.state.peer_quiet_streams = self.peer_quiet.len();
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

    /// When the core next wants [`Protocol::handle_timeout`] (and
    /// [`Protocol::poll_transmit`] after it): its tick (the heartbeat, a
    /// hello re-sent, the read timeouts), or before it a delayed ack or the
    /// end of a send delay.
    pub fn poll_timeout(&self) -> Instant {
        [self.ack_at, self.hold_until]
            .into_iter()
            .flatten()
            .fold(self.next_tick, Instant::min)
    }

    /// Whether the core has nothing to send right now and no delta out to
    /// apply: what [`sync_once`] runs to.
    pub fn is_quiescent<L: LocalReplica>(&self, local: &L) -> bool {
        self.applying.is_none()
            && !self.hello_due
            && self.parts.is_empty()
            && (self.peer.is_none()
                || (!self.heartbeat_due
                    && !self.ack_due
                    && self.ack_at.is_none()
                    && self.routes_due.is_empty()
                    && self.send_view(&local.marks()).dominates(&local.marks())))
    }

    /// Serves the tick if `now` reached it: times out a silent peer, and
    /// makes a hello (until the peer has ours) and a heartbeat due.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ProtocolError> {
        if self.ack_at.is_some_and(|at| at <= now) {
            self.ack_at = None;
            self.ack_due = true;
        }
        if self.hold_until.is_some_and(|at| at <= now) {
            self.hold_until = None;
        }
        if now < self.next_tick {
            return Ok(());
        }
        self.next_tick = now + tick_interval(&self.config);
        if self.peer.is_none() && now - self.started_at > self.config.read_timeout {
            return Err(ProtocolError::ReadTimeout {
                what: "hello",
                idle: now - self.started_at,
            });
        }
        if now - self.last_frame_at > self.config.read_timeout {
            return Err(ProtocolError::ReadTimeout {
                what: "frame",
                idle: now - self.last_frame_at,
            });
        }
        self.hello_due |= !self.peer_has_our_hello;
        self.heartbeat_due |= self.peer.is_some();
        self.lag_check_due = true;
        // A delta unacknowledged past its timeout is lost (the tail of a
        // burst: no later delta's ack shows the hole): count it as missing
        // again, so what the peer lacks of it is sent again.
        let rto = self.retransmit_timeout();
        let pending_before = self.peer_pending.len();
        self.peer_pending.retain(|range| range.expires > now);
        if self.peer_pending.len() != pending_before {
            // Still not in the peer's marks: dropped from its pending
            // buffer, or the hole below stays open. Sent again.
            self.recompute_view();
        }
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

    /// Until when new events wait for a fuller delta, if they do: while a
    /// delta is in flight and the last one sent was small, up to the send
    /// delay after it (see [`SessionConfig::send_delay`]).
    fn send_held_until(&self, now: Instant) -> Option<Instant> {
        if self.in_flight.is_empty() || self.last_delta_full {
            return None;
        }
        let until = self.last_delta_at? + self.config.send_delay;
        (now < until).then_some(until)
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
        let peer_marks = &self.peer_marks;
        self.peer_pending
            .retain(|range| peer_marks.get(range.stream) < range.to);
        skip_pending(&mut self.view, &self.peer_pending);
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

    /// Whether our marks hold news the peer pushes by: a stream it pushes
    /// to us (not asked quiet) that we hold further than its deltas
    /// carried and than the marks we last sent, because another session
    /// brought it first. Then an ack carries our marks, so the peer does
    /// not push what we hold; otherwise a bare ack tells it as much.
    fn marks_news_for_peer<L: LocalReplica>(&self, local: &L) -> bool {
        let sent = self.marks_sent.back().map(|(_, marks)| marks);
        local.marks().iter().any(|(stream, seq)| {
            stream != self.local
                && seq > self.carried.get(stream)
                && sent.is_none_or(|sent| seq > sent.get(stream))
                && !self.quiet_asked.contains_key(&stream)
                && !self.refused.contains(&stream)
        })
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
        if self.hello_due {
            self.hello_due = false;
            let (marks, floor) = local.marks_and_floor();
            // The first hello's marks are our marks number 1: any hello the
            // peer holds carries them or later ones, so a difference from
            // them is sound whichever hello arrived.
            if self.marks_sent.is_empty() {
                self.marks_sent.push_back((1, marks.clone()));
            }
            return Some(Outgoing::Frame(Frame::Hello(Hello {
                protocol: frame::PROTOCOL_VERSION,
                stream: self.local,
                marks,
                floor,
                frame_bytes_max: self.config.frame_limit() as u32,
            })));
        }
        self.peer?;
        if self.duplicate_of().is_some() {
            return None;
        }
        if let Some(link) = &self.link {
            // Streams another session now brings: asked quiet here before
            // the peer sends a second copy.
            let (claims, seen) = link.claims_since(self.claims_seen);
            self.claims_seen = seen;
            let asks: Vec<StreamId> = claims
                .into_iter()
                .filter(|&stream| {
                    stream != self.local
                        && !self.refused.contains(&stream)
                        && link.other_source_since(stream).is_some()
                        && !self.quiet_asked.contains_key(&stream)
                })
                .collect();
            for stream in asks {
                self.ask_quiet(stream, now);
            }
            let link = self.link.as_ref().expect("checked above");
            if self.lag_check_due || link.generation() != self.routes_generation {
                self.lag_check_due = false;
                self.check_routes(now, local);
            }
        }
        if self.heartbeat_due {
            // A heartbeat is a receipt too: it stands for a due ack.
            self.heartbeat_due = false;
            self.ack_due = false;
            self.ack_at = None;
            self.unacked = 0;
            return Some(Outgoing::Frame(Frame::Heartbeat(self.receipt(local))));
        }
        if self.ack_due {
            self.ack_due = false;
            self.ack_at = None;
            self.unacked = 0;
            if self.link.is_some() && !self.marks_news_for_peer(local) {
                return Some(Outgoing::Frame(Frame::BareAck(self.received)));
            }
            return Some(Outgoing::Frame(Frame::Ack(self.receipt(local))));
        }
        if let Some(routes) = self.routes_frame() {
            return Some(Outgoing::Frame(routes));
        }
        if self.parts.is_empty() {
            if self.in_flight.len() >= IN_FLIGHT_MAX {
                // Wait for receipts (or the retransmission timeout).
                return None;
            }
            let marks = local.marks();
            skip_pending(&mut self.view, &self.peer_pending);
            let view = self.send_view(&marks);
            if view.dominates(&marks) {
                self.hold_until = None;
                return None;
            }
            drop(view);
            if let Some(until) = self.send_held_until(now) {
                // Nagle's rule: a small delta is in flight, so what is new
                // waits to go with what follows it, for at most the send
                // delay (the peer's ack, retiring it, ends the wait sooner).
                self.hold_until = Some(until);
                return None;
            }
            self.hold_until = None;
            let view = self.send_view(&marks);
            let columns = local.delta_columns_for(&view, self.config.delta_budget());
            // What is sent as read, in columns, unless an event is too
            // large for a frame, a stream runs into what the peer holds
            // pending, or it needs more than one frame: then it is cut and
            // split as events.
            let payload_max = self.frame_payload_max(&columns.floor);
            let as_read = columns.len() <= DELTA_EVENTS_MAX
                && columns.payload_len_max() <= payload_max
                && !self.peer_pending.iter().any(|range| {
                    view.get(range.stream) + 1 < range.from
                        && columns
                            .runs()
                            .iter()
                            .any(|run| run.stream == range.stream && run.last_seq() >= range.from)
                });
            drop(view);
            let parts = if as_read {
                vec![columns]
            } else {
                let mut delta = columns.to_delta();
                if self.cut_unsendable(&mut delta)
                    && delta.events.is_empty()
                    && delta.floor.is_empty()
                {
                    // Only events too large for a frame: build again
                    // without their streams (at the next poll: the state
                    // changed).
                    self.state_changed = true;
                    return self.next_frame(now, local);
                }
                let view = self.send_view(&marks);
                // A hole below what the peer holds pending is sent up to
                // the pending events, not through them.
                for range in &self.peer_pending {
                    if view.get(range.stream) + 1 < range.from {
                        delta
                            .events
                            .retain(|event| event.stream != range.stream || event.seq < range.from);
                    }
                }
                split_delta(delta)
                    .iter()
                    .map(DeltaColumns::from_delta)
                    .collect()
            };
            if parts
                .iter()
                .all(|part| part.is_empty() && part.floor.is_empty())
            {
                // The marks ran ahead of a compaction; nothing to send.
                return None;
            }
            let mut bytes = 0;
            for part in &parts {
                advance_by_spans(&mut self.view, &part.floor, &column_spans(part));
                bytes += part.size_hint();
            }
            self.last_delta_full = bytes >= self.config.delta_budget() / 2;
            self.last_delta_at = Some(now);
            self.parts.extend(parts);
        }
        let part = self.parts.pop_front()?;
        let number = self.next_delta_number;
        self.next_delta_number += 1;
        let spans = column_spans(&part);
        let mut advance = VersionVector::new();
        advance_by_spans(&mut advance, &part.floor, &spans);
        let first: VersionVector = spans
            .iter()
            .map(|&(stream, first, _)| (stream, first))
            .collect();
        self.in_flight.push_back(InFlight {
            number,
            sent_at: now,
            advance,
            first,
        });
        Some(Outgoing::Delta {
            number,
            columns: part,
        })
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
        self.last_frame_at = now;
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
        self.last_frame_at = now;
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
            self.applying.is_none(),
            "a frame handed in before the delta was reported"
        );
        if let Incoming::Frame(Frame::Hello(hello)) = incoming {
            self.on_hello(hello, local)?;
            return Ok(Received::Nothing);
        }
        // Only a peer that has our hello sends anything else.
        if !self.peer_has_our_hello {
            self.peer_has_our_hello = true;
            if self.rtt.is_none() {
                // Our first hello went out when we started: a first
                // estimate of the round trip, until an ack measures it.
                let sample = now.saturating_duration_since(self.started_at);
                self.rtt = Some(sample);
                self.rtt_var = sample / 2;
                self.rtt_from_hello = true;
            }
        }
        if self.peer.is_none() {
            // Its hello was lost on the way; it re-sends it every tick.
            tracing::debug!(
                kind = incoming.kind(),
                "frame before the peer's hello ignored"
            );
            return Ok(Received::Nothing);
        }
        let frame = match incoming {
            Incoming::Frame(frame) => frame,
            Incoming::Delta { number, columns } => {
                if number > self.received + 1 {
                    // A hole: the deltas between were lost (or are late).
                    // The ack that follows shows it to the sender at once.
                    self.hole_seen = true;
                    tracing::debug!(
                        number,
                        received = self.received,
                        "delta frames missing before this one"
                    );
                }
                // The peer holds what it sent (each stream is a prefix):
                // never echo it back. Advanced before the apply: if the
                // apply fails, the session ends and the view with it.
                let mut columns = columns;
                self.admit(&mut columns, local);
                let mut advance = VersionVector::new();
                advance_by_spans(&mut advance, &columns.floor, &column_spans(&columns));
                self.view.join(&advance);
                self.peer_marks.join(&advance);
                self.carried.join(&advance);
                if self.link.is_some() {
                    let streams: BTreeSet<StreamId> =
                        columns.runs().iter().map(|run| run.stream).collect();
                    self.route_received(now, &streams);
                }
                self.applying = Some(number);
                return Ok(Received::Apply(columns));
            }
        };
        match frame {
            Frame::Delta { .. } => unreachable!("a delta is handed in as columns"),
            Frame::Ack(receipt) => {
                self.on_receipt(now, receipt, true)?;
                self.lag_check_due = true;
            }
            Frame::Heartbeat(receipt) => {
                self.on_receipt(now, receipt, false)?;
                self.lag_check_due = true;
            }
            Frame::BareAck(received) => {
                // A receipt naming what we and the peer held before: only
                // the deltas it acknowledges are new.
                let receipt = Receipt {
                    received,
                    seen: self.peer_seen,
                    marks: MarksDiff {
                        number: self.peer_marks_number,
                        base: self.peer_marks_number,
                        changes: VersionVector::new(),
                    },
                };
                self.on_receipt(now, receipt, true)?;
                self.lag_check_due = true;
            }
            Frame::Routes(routes) => self.on_routes(routes),
            Frame::Hello(_) => unreachable!("handled above"),
        }
        Ok(Received::Nothing)
    }

    /// A receipt: learn the peer's marks, which of ours it holds, and which
    /// of our deltas arrived; then count as held only what it holds and
    /// what is still in flight, so what was lost is sent again (and what
    /// is in flight is not).
    ///
    /// An ack's marks may lag behind what the deltas it acknowledges
    /// carried (`marks_lag`): what they carried and the marks lack counts
    /// as pending at the peer, every acknowledged delta's, not only the
    /// last one's. A heartbeat's marks are current: an acknowledged delta
    /// before the last whose events they lack was lost.
    fn on_receipt(
        &mut self,
        now: Instant,
        receipt: Receipt,
        marks_lag: bool,
    ) -> Result<(), ProtocolError> {
        let Receipt {
            received,
            seen,
            marks,
        } = receipt;
        if marks.base > self.peer_marks_number {
            return Err(ProtocolError::Protocol {
                detail: format!(
                    "marks {} sent as a difference from marks {} this side never reported \
                     holding (it holds marks {})",
                    marks.number, marks.base, self.peer_marks_number
                ),
            });
        }
        let latest_ours = self.marks_sent.back().map_or(0, |(number, _)| *number);
        if seen > latest_ours {
            return Err(ProtocolError::Protocol {
                detail: format!("peer holds our marks {seen}; we sent up to {latest_ours}"),
            });
        }
        if received >= self.next_delta_number {
            return Err(ProtocolError::Protocol {
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
                self.rtt_var = match self.rtt {
                    Some(rtt) if !self.rtt_from_hello => {
                        (self.rtt_var * 3 + rtt.abs_diff(sample)) / 4
                    }
                    _ => sample / 2,
                };
                self.rtt = Some(match self.rtt {
                    Some(rtt) if !self.rtt_from_hello => (rtt * 7 + sample) / 8,
                    _ => sample,
                });
                self.rtt_from_hello = false;
                self.rto_backoff = 0;
            }
            if sent.number == received || marks_lag {
                // It arrived: what it carried and the peer's marks lack
                // waits in its pending buffer, above a hole (or, after an
                // ack, is held and not reported yet: the peer acks so only
                // what it applied whole, and its marks come with its next
                // heartbeat, or the one after if that one is lost).
                let mut expires = now + self.retransmit_timeout();
                if marks_lag {
                    expires += tick_interval(&self.config);
                }
                for (stream, to) in sent.advance.iter() {
                    let from = sent.first.get(stream);
                    if from > 0 && self.peer_marks.get(stream) < to {
                        add_pending(
                            &mut self.peer_pending,
                            PendingRange {
                                stream,
                                from,
                                to,
                                expires,
                            },
                        );
                    }
                }
            }
            self.in_flight.pop_front();
        }
        // A delta sent two round trips before this receipt arrived should
        // have reached the peer before it sent the receipt: one the receipt
        // does not cover was lost (the tail of a burst, or everything sent
        // into a cut link), and is sent again now rather than at its
        // retransmission timeout.
        // Two round trips, or one and four deviations on a link whose
        // round trips vary more (a delayed frame is not a lost one).
        let rtt = self.rtt.unwrap_or(2 * tick_interval(&self.config));
        let lost_after = (2 * rtt)
            .max(rtt + 4 * self.rtt_var)
            .max(tick_interval(&self.config) / 8);
        self.in_flight
            .retain(|sent| now.saturating_duration_since(sent.sent_at) <= lost_after);
        self.peer_pending.retain(|range| range.expires > now);
        self.recompute_view();
        Ok(())
    }

    fn on_hello<L: LocalReplica>(&mut self, hello: Hello, local: &L) -> Result<(), ProtocolError> {
        if hello.stream == self.local {
            return Err(ProtocolError::SelfConnection {
                stream: hello.stream,
            });
        }
        match self.peer {
            Some(was) if was != hello.stream => {
                return Err(ProtocolError::IdentityChanged {
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
                self.peer_holds_own_stream =
                    hello.marks.get(hello.stream) >= local.marks().get(hello.stream);
                if let Some(link) = &self.link {
                    if !link.establish(self.local, hello.stream) {
                        tracing::info!(
                            local = %self.local,
                            peer = %hello.stream,
                            "a second session with this peer: the one dialed by the lower id is kept, this one ends"
                        );
                        self.duplicate = true;
                    }
                }
                tracing::debug!(local = %self.local, peer = %hello.stream, marks = ?hello.marks, "sync session established");
            }
        }
        self.peer_frame_bytes_max = hello.frame_bytes_max as usize;
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
    /// delta ends the session ([`ProtocolError::Refused`] for what the peer
    /// did wrong, [`ProtocolError::Limit`] for a local limit it exceeds,
    /// [`ProtocolError::Replica`] for our own store failing); one that
    /// changed our log makes an ack due.
    pub fn handle_applied(
        &mut self,
        now: Instant,
        applied: Result<ApplyReport, ReplicaError>,
    ) -> Result<(), ProtocolError> {
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
                ProtocolError::Refused { peer, source }
            }
            ReplicaError::PayloadTooLarge { .. } | ReplicaError::TooManyStreams { .. } => {
                ProtocolError::Limit { peer, source }
            }
            source => ProtocolError::Replica(source),
        })?;
        // Time spent committing what the peer sent is not its silence.
        self.last_frame_at = now;
        // Acked whether or not it changed our log: the ack is how the
        // peer learns the delta arrived (and, by what our marks lack, what
        // was lost before it).
        if let Some(number) = number {
            self.received = self.received.max(number);
            self.unacked += 1;
            // At once when there is something to repair (a gap in the
            // numbers, events held above a hole or dropped): a receipt
            // with our current marks, which shows the sender what is
            // missing (a heartbeat's kind: an ack's marks may lag). At
            // once too for a window's worth to acknowledge; else once per
            // `ack_delay`, for the whole burst.
            let repair = self.hole_seen || report.pending > 0 || report.dropped > 0;
            self.hole_seen = false;
            if repair {
                self.heartbeat_due = true;
            } else if self.unacked >= ACK_EVERY || self.config.ack_delay.is_zero() {
                self.ack_due = true;
                self.ack_at = None;
            } else if self.ack_at.is_none() {
                self.ack_at = Some(now + self.config.ack_delay);
            }
        }
        self.state.events_applied += report.applied;
        self.state.events_duplicate += report.duplicates;
        self.state_changed = true;
        Ok(())
    }
}

/// The most bytes a delta frame takes besides one event's payload and its
/// floor: the kind, the number, the event count, a run's header and the
/// event's literal run of one (a header byte, then the value) in each
/// column, every varint at its longest (1 + 10 + 2 + 22 + 27 = 62).
const EVENT_FRAME_OVERHEAD_MAX: usize = 64;

/// Whether `stream` has an entry in `vector`.
fn held_in(vector: &VersionVector, stream: StreamId) -> bool {
    vector.get(stream) > 0
}

/// The most delta frames in flight (sent, not acknowledged) at once: past
/// it, no new delta is built until a receipt (or the retransmission
/// timeout) retires some.
const IN_FLIGHT_MAX: usize = 256;

/// A receiver acknowledges at least every this many deltas, however short
/// they come: well within [`IN_FLIGHT_MAX`], so a sender never waits on a
/// delayed ack to send more.
const ACK_EVERY: u32 = 8;

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
    /// Per stream, the first seq of the events it carried.
    first: VersionVector,
}

/// Seqs `from ..= to` of a stream, which the peer received in a delta but
/// holds pending (above a hole), as of a receipt; forgotten at `expires`.
#[derive(Debug, Clone, Copy)]
struct PendingRange {
    stream: StreamId,
    from: u64,
    to: u64,
    expires: Instant,
}

/// Records a range the peer holds pending, joined to the range of the
/// same stream and expiry that it continues (the deltas one receipt
/// acknowledges carry a stream's seqs back to back): one entry per stream
/// and receipt, not per delta.
fn add_pending(ranges: &mut Vec<PendingRange>, range: PendingRange) {
    let joined = ranges.iter_mut().rev().find(|known| {
        known.stream == range.stream
            && known.expires == range.expires
            && range.from <= known.to.saturating_add(1)
            && known.from <= range.to.saturating_add(1)
    });
    match joined {
        Some(known) => {
            known.from = known.from.min(range.from);
            known.to = known.to.max(range.to);
        }
        None => ranges.push(range),
    }
}

/// Advances `view` past every range the peer holds pending that the view
/// reaches (its seq at or just below the range's first), so the next delta
/// starts above it.
fn skip_pending(view: &mut VersionVector, ranges: &[PendingRange]) {
    loop {
        let mut moved = false;
        for range in ranges {
            let seq = view.get(range.stream);
            if seq + 1 >= range.from && seq < range.to {
                view.advance(range.stream, range.to);
                moved = true;
            }
        }
        if !moved {
            return;
        }
    }
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

/// Advances `view` by what a delta carries, from its floor and its
/// [`column_spans`]: per stream, its last event and its floor (a replica
/// holding seq `n` of a stream holds every seq below).
fn advance_by_spans(
    view: &mut VersionVector,
    floor: &VersionVector,
    spans: &[(StreamId, u64, u64)],
) {
    for (stream, floor_seq) in floor.iter() {
        view.advance(stream, floor_seq);
    }
    for &(stream, _, last) in spans {
        view.advance(stream, last);
    }
}

/// What the protocol sends next: a frame, or a delta held in columns.
enum Outgoing {
    Frame(Frame),
    Delta { number: u64, columns: DeltaColumns },
}

/// Per stream of a delta in columns, its lowest and highest seq, streams
/// ascending: one step per run.
fn column_spans(columns: &DeltaColumns) -> Vec<(StreamId, u64, u64)> {
    let mut spans: BTreeMap<StreamId, (u64, u64)> = BTreeMap::new();
    for run in columns.runs() {
        spans
            .entry(run.stream)
            .and_modify(|(first, last)| {
                *first = (*first).min(run.first_seq);
                *last = (*last).max(run.last_seq());
            })
            .or_insert((run.first_seq, run.last_seq()));
    }
    spans
        .into_iter()
        .map(|(stream, (first, last))| (stream, first, last))
        .collect()
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
/// Frames go through the codec (so bytes are counted as on a wire); the
/// whole exchange happens at `now` (no clock runs), so no heartbeat is
/// sent. `meshlog_sync::sync_once` is this at the time of the call.
///
/// For tests, benchmarks and request/response transports: the rules are
/// those of a session (`meshlog_sync::Session`), without a task or a
/// stream.
///
/// ```
/// use std::time::Instant;
/// use meshlog_cursor::StreamId;
/// use meshlog_replica::SharedReplica;
/// use meshlog_sync_core::{sync_once, SessionConfig};
///
/// let a = SharedReplica::in_memory(StreamId::new(1));
/// let b = SharedReplica::in_memory(StreamId::new(2));
/// a.append(&b"from a"[..])?;
/// b.append(&b"from b"[..])?;
/// let report = sync_once(Instant::now(), &a, &b, &SessionConfig::default())?;
/// assert!(report.quiescent);
/// assert_eq!(a.digest(), b.digest());
/// assert_eq!(report.a.events_sent, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sync_once<A, B>(
    now: Instant,
    a: &SharedReplica<A>,
    b: &SharedReplica<B>,
    config: &SessionConfig,
) -> Result<SyncReport, ProtocolError>
where
    A: Store + Send + Sync + 'static,
    B: Store + Send + Sync + 'static,
{
    // No clock runs here, so no ack or delta waits for one.
    let config = SessionConfig {
        ack_delay: Duration::ZERO,
        send_delay: Duration::ZERO,
        ..config.clone()
    };
    let mut a_side = Protocol::new(a.stream(), config.clone(), now);
    let mut b_side = Protocol::new(b.stream(), config, now);
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
) -> Result<bool, ProtocolError>
where
    F: Store + Send + Sync + 'static,
    T: Store + Send + Sync + 'static,
{
    let mut sent = Vec::new();
    while let Some(bytes) = from.poll_transmit(now, from_replica)? {
        sent.push(bytes);
    }
    for bytes in &sent {
        hand_in(now, to, &bytes[frame::LENGTH_PREFIX_BYTES..], to_replica)?;
    }
    Ok(!sent.is_empty())
}

/// Hands `core` one received payload and, if it carries a delta, applies
/// it to `replica` at once and reports the outcome: the synchronous step of
/// a driver whose replica commits on the caller's thread ([`sync_once`],
/// and tests that drive two cores by hand, through
/// `meshlog_sync::testkit::hand_in`).
pub fn hand_in<S: Store + Send + Sync + 'static>(
    now: Instant,
    core: &mut Protocol,
    payload: &[u8],
    replica: &SharedReplica<S>,
) -> Result<(), ProtocolError> {
    if let Received::Apply(columns) = core.handle_payload(now, payload, replica)? {
        let applied = replica.apply_columns(columns);
        core.handle_applied(now, applied)?;
    }
    Ok(())
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
