//! The protocol core's state, shared by the modules of its rules: the
//! [`Protocol`] and its state grouped by concern, [`LocalReplica`] (what it
//! reads of the replica), [`Received`], and the records its state holds
//! (deltas in flight, ranges the peer holds pending, streams asked quiet).
//! A leaf: it imports nothing of its siblings, which each import from it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use meshlog_cursor::{Checkpoint, CheckpointName, StreamId, VersionVector};
use meshlog_replica::{
    Admission, ChainHash, Compaction, Delta, DeltaColumns, ForkProof, ReplicaError, SharedReplica,
    SignedCompaction, Store,
};

use crate::frame::{Frame, HelloAgainst};
use crate::routes::RouteLink;
use crate::{SessionConfig, SessionState};

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
    /// Its floor alone (what a poll that sends no delta reads). By
    /// default, that of [`LocalReplica::marks_and_floor`].
    fn floor(&self) -> VersionVector {
        self.marks_and_floor().1
    }
    /// What a peer holding `view` misses, up to `byte_budget` (see
    /// [`meshlog_replica::Replica::try_delta_for`]), or why it could not be
    /// read (a store read that failed: [`ReplicaError::Store`] naming the
    /// block). Never a shorter or empty delta in place of a failed read:
    /// the session ends with [`ProtocolError::Read`](crate::ProtocolError::Read)
    /// rather than send one, which would hide the fault from both sides.
    fn try_delta_for(
        &self,
        view: &VersionVector,
        byte_budget: usize,
    ) -> Result<Delta, ReplicaError>;
    /// [`LocalReplica::try_delta_for`] in columns, which is what the
    /// protocol encodes (see
    /// [`meshlog_replica::Replica::try_delta_columns_for`]). By default,
    /// the events of `try_delta_for` put in columns.
    fn try_delta_columns_for(
        &self,
        view: &VersionVector,
        byte_budget: usize,
    ) -> Result<DeltaColumns, ReplicaError> {
        let delta = self.try_delta_for(view, byte_budget)?;
        Ok(DeltaColumns::from_delta(&delta))
    }
    /// Whether the replica is relearning its own stream from peers
    /// (opened with `recover_own_stream`).
    fn is_recovering(&self) -> bool;
    /// How much of a received delta the replica takes under its limits
    /// (see [`meshlog_replica::Replica::admission`]): the delta is cut to
    /// it before it is handed back to apply (see [`LimitHit`](crate::LimitHit)). No
    /// default: a replica that admitted everything here would have its
    /// deltas refused whole by its own limits, ending the session.
    fn admission(&self, columns: &DeltaColumns) -> Admission;
    /// The names of the checkpoints the replica keeps, oldest first (see
    /// [`meshlog_replica::Replica::checkpoints`]). By default none: such a
    /// replica gossips no checkpoint.
    fn checkpoint_names(&self) -> Vec<CheckpointName> {
        Vec::new()
    }
    /// The checkpoint of that name, if the replica keeps it. By default
    /// none.
    fn checkpoint(&self, name: CheckpointName) -> Option<Checkpoint> {
        let _ = name;
        None
    }
    /// The fork proofs the replica keeps (see
    /// [`meshlog_replica::Replica::forks`]) but those of `streams`. By
    /// default none: such a driver passes no proof on.
    fn forks_except(&self, streams: &BTreeSet<StreamId>) -> Vec<ForkProof> {
        let _ = streams;
        Vec::new()
    }
    /// The newest compaction statement the replica keeps of `stream` (see
    /// [`meshlog_replica::Replica::statement`]): offered to a peer that
    /// holds the stream past its floor. By default none: such a driver
    /// offers no statement (a delta's floor still carries them).
    fn statement(&self, stream: StreamId) -> Option<SignedCompaction> {
        let _ = stream;
        None
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

    fn floor(&self) -> VersionVector {
        SharedReplica::floor(self)
    }

    fn try_delta_for(
        &self,
        view: &VersionVector,
        byte_budget: usize,
    ) -> Result<Delta, ReplicaError> {
        SharedReplica::try_delta_for(self, view, byte_budget)
    }

    fn try_delta_columns_for(
        &self,
        view: &VersionVector,
        byte_budget: usize,
    ) -> Result<DeltaColumns, ReplicaError> {
        SharedReplica::try_delta_columns_for(self, view, byte_budget)
    }

    fn is_recovering(&self) -> bool {
        SharedReplica::is_recovering(self)
    }

    fn admission(&self, columns: &DeltaColumns) -> Admission {
        SharedReplica::admission(self, columns)
    }

    fn checkpoint_names(&self) -> Vec<CheckpointName> {
        SharedReplica::checkpoint_names(self)
    }

    fn checkpoint(&self, name: CheckpointName) -> Option<Checkpoint> {
        SharedReplica::checkpoint(self, name)
    }

    fn forks_except(&self, streams: &BTreeSet<StreamId>) -> Vec<ForkProof> {
        SharedReplica::forks_except(self, streams)
    }

    fn statement(&self, stream: StreamId) -> Option<SignedCompaction> {
        SharedReplica::statement(self, stream)
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
    /// A checkpoint from the peer, its vector checked against its name, that
    /// the replica does not keep yet: keep it
    /// ([`SharedReplica::keep_checkpoint`] or its async form). Nothing to
    /// report back.
    Checkpoint(Checkpoint),
}

/// One peer's side of the sync protocol, without I/O (see the module docs).
#[derive(Debug)]
pub struct Protocol {
    pub(super) config: SessionConfig,
    pub(super) local: StreamId,
    pub(super) state: SessionState,
    pub(super) state_changed: bool,
    /// The hello exchange: who the peer is and what it takes.
    pub(super) hello: HelloState,
    /// What we send the peer: the view deltas are built from, deltas in flight and waiting.
    pub(super) send: Sending,
    /// Round trips, retransmission and read timeouts, the tick.
    pub(super) timing: Timing,
    /// Our receipts to the peer: which deltas arrived, and when an ack or heartbeat is due.
    pub(super) acks: Acking,
    /// Marks both ways, numbered so that they travel as differences.
    pub(super) marks: MarksExchange,
    /// The routes table and the streams asked quiet both ways, and the streams refused for a limit.
    pub(super) routing: Routing,
    /// The checkpoints the peer holds, and the frames owed of them.
    pub(super) gossip: Gossip,
}

/// The hello exchange: who the peer is and what it takes.
#[derive(Debug)]
pub(super) struct HelloState {
    pub(super) peer: Option<StreamId>,
    /// The largest frame payload the peer takes, from its hello
    /// ([`FRAME_BYTES_MAX`] until it arrives).
    pub(super) peer_frame_bytes_max: usize,
    /// Whether the peer's hello says it skips frame kinds it does not know
    /// (`Hello::skips_unknown_kinds`): then checkpoints are gossiped to it.
    pub(super) peer_skips_unknown_kinds: bool,
    pub(super) peer_has_our_hello: bool,
    pub(super) hello_due: bool,
    /// Whether the peer's hello says it reads a hello against a
    /// checkpoint (`Hello::takes_hello_against`): then ours goes so.
    pub(super) peer_takes_against: bool,
    /// The checkpoint our hello was last written against, kept for the
    /// session: a peer that does not keep it asks for it by name, and
    /// gets it even once the replica no longer keeps it.
    pub(super) against_base: Option<Checkpoint>,
    /// The peer's hello against a checkpoint this side does not keep,
    /// waiting for the checkpoint it asked for.
    pub(super) against_pending: Option<HelloAgainst>,
    /// The checkpoints the peer held when an earlier session with it
    /// ended (`PeerMemory`, a dialer's): preferred as our hello's base.
    pub(super) peer_held: Vec<CheckpointName>,
    /// Whether the peer holds its own stream up to our marks of it: its
    /// hello showed at least what we hold (the writer holds everything it
    /// wrote), so its events are never sent back to it, even those that
    /// reached us through another replica before its receipt did. False
    /// for a peer relearning its stream (its hello shows less).
    pub(super) peer_holds_own_stream: bool,
}

/// What we send the peer: the view deltas are built from, deltas in flight and waiting.
#[derive(Debug)]
pub(super) struct Sending {
    /// What we believe the peer holds: what to send is computed from it.
    pub(super) view: VersionVector,
    /// When the last delta frame was sent, and whether it filled half the
    /// budget: new events wait up to [`SessionConfig::send_delay`] after a
    /// small one while deltas are in flight.
    pub(super) last_delta_at: Option<Instant>,
    pub(super) last_delta_full: bool,
    /// Until when events wait for a fuller delta (see
    /// [`SessionConfig::send_delay`]), if they do.
    pub(super) hold_until: Option<Instant>,
    /// Parts of a delta too large for one frame, still to hand out, in
    /// order; the view already counts them as sent.
    pub(super) parts: VecDeque<DeltaColumns>,
    /// The number of the next delta frame we send (from 1).
    pub(super) next_delta_number: u64,
    /// Delta frames sent and not yet acknowledged, in number order, with
    /// what each carried: the view counts them as held until the peer's
    /// receipt says they arrived, or their retransmission timeout passes.
    pub(super) in_flight: VecDeque<InFlight>,
    /// The highest delta number the peer reported receiving.
    pub(super) acked: u64,
    /// Deltas the peer received but holds pending (above a hole), per
    /// stream the seqs they carried, until its marks cover them or the
    /// entry expires: the view skips them, so repairing the hole below
    /// does not send them again.
    pub(super) peer_pending: Vec<PendingRange>,
    /// Our streams the peer cannot be sent past a seq (an event too large
    /// for a frame): the view counts them as held.
    pub(super) unsendable: BTreeMap<StreamId, u64>,
    /// The streams whose fork proof this session sent the peer (`forks`).
    pub(super) forks_sent: BTreeSet<StreamId>,
    /// Per stream, the floor up to which the peer holds, or was offered,
    /// our compaction statements (`statements`): its hello's floor, the
    /// floors its deltas carried, and every floor of ours looked at.
    pub(super) statements_told: VersionVector,
}

/// Round trips, retransmission and read timeouts, the tick.
#[derive(Debug)]
pub(super) struct Timing {
    /// The smoothed round trip from sending a delta to its ack (before the
    /// first ack, from our first hello to the peer's first other frame,
    /// which is at most a tick longer).
    pub(super) rtt: Option<Duration>,
    /// Whether `rtt` is still the hello's estimate.
    pub(super) rtt_from_hello: bool,
    /// How much round trips vary (the mean deviation of the samples from
    /// `rtt`, as TCP keeps it): a delta is not counted lost while a round
    /// trip this much longer than usual could still bring its ack.
    pub(super) rtt_var: Duration,
    /// Retransmission timeouts in a row with no ack between: each doubles
    /// the next timeout (up to 8 times), as TCP's does.
    pub(super) rto_backoff: u32,
    pub(super) started_at: Instant,
    pub(super) last_frame_at: Instant,
    pub(super) next_tick: Instant,
}

/// Our receipts to the peer: which deltas arrived, and when an ack or heartbeat is due.
#[derive(Debug, Default)]
pub(super) struct Acking {
    /// A heartbeat is due for a repair: sent at once.
    pub(super) heartbeat_due: bool,
    /// A heartbeat is due for the tick: sent unless it repeats an idle one
    /// (see `receipts::IDLE_REPEATS`).
    pub(super) tick_due: bool,
    /// What the last heartbeat sent said: received, seen, our marks' number.
    pub(super) last_heartbeat: (u64, u64, u64),
    /// Heartbeats sent in a row saying `last_heartbeat`.
    pub(super) heartbeats_alike: u32,
    /// Ticks passed without a heartbeat since the last one sent.
    pub(super) ticks_quiet: u32,
    pub(super) ack_due: bool,
    /// When a delayed ack is due: set by the first delta applied since the
    /// last receipt, so a burst is acknowledged once (see
    /// [`SessionConfig::ack_delay`]).
    pub(super) ack_at: Option<Instant>,
    /// Deltas applied since the last receipt sent.
    pub(super) unacked: u32,
    /// A delta arrived after a gap in the numbers: acknowledge at once, so
    /// that the sender repairs within a round trip.
    pub(super) hole_seen: bool,
    /// The highest delta number received from the peer (what we ack).
    pub(super) received: u64,
    /// The number of a delta handed back to apply and not yet reported.
    pub(super) applying: Option<u64>,
    /// An offered statement handed back to apply and not yet reported
    /// (`statements`): what it would be remembered under, refused.
    pub(super) applying_statement: Option<[RefusedStatement; 2]>,
}

/// Marks both ways, numbered so that they travel as differences.
#[derive(Debug)]
pub(super) struct MarksExchange {
    /// What we know the peer holds for certain: the marks it reported
    /// (hello and receipts, reconstructed from their differences) joined
    /// with what it sent us. Rises only.
    pub(super) peer_marks: VersionVector,
    /// The number of the latest of the peer's marks we hold (what we
    /// report as `seen`).
    pub(super) peer_marks_number: u64,
    /// Our marks as numbered for this peer, oldest first: the latest, and
    /// those the peer may still report holding (a difference is taken from
    /// the one it reported last).
    pub(super) marks_sent: VecDeque<(u64, VersionVector)>,
    /// The highest of our marks numbers the peer reported holding.
    pub(super) peer_seen: u64,
    /// Per stream, the last seq (or floor) the peer's deltas carried: what
    /// it knows we hold without being told.
    pub(super) carried: VersionVector,
}

/// The routes table and the streams asked quiet both ways, and the streams refused for a limit.
#[derive(Debug)]
pub(super) struct Routing {
    /// This session's place in the replica's routing table, if it shares
    /// one with the replica's other sessions.
    pub(super) link: Option<RouteLink>,
    /// The table's generation last checked.
    pub(super) routes_generation: u64,
    /// Streams we asked the peer not to push (another session brings
    /// them), with when we asked and how long the peer has been ahead.
    pub(super) quiet_asked: HashMap<StreamId, QuietAsk>,
    /// Route changes to send: per stream, quiet (`true`) or loud.
    pub(super) routes_due: BTreeMap<StreamId, bool>,
    /// The number of the next routes frame we send (from 1).
    pub(super) next_routes_number: u64,
    /// Streams the peer asked us not to push.
    pub(super) peer_quiet: BTreeSet<StreamId>,
    /// Streams not asked quiet that the peer's marks show ahead of ours,
    /// since when: past `lag_allowed` they are asked loud again, since
    /// the routes frame that asked them loud may have been lost.
    pub(super) loud_ahead: HashMap<StreamId, Instant>,
    /// Per stream, the number of the peer's latest routes frame naming it.
    pub(super) peer_route_numbers: HashMap<StreamId, u64>,
    /// Another session with the same peer is kept: this one sends nothing
    /// more and ends.
    pub(super) duplicate: bool,
    /// A tick passed or a receipt arrived since the routes were checked.
    pub(super) lag_check_due: bool,
    /// How many of the table's claims this session has read.
    pub(super) claims_seen: usize,
    /// Streams this side cannot take from the peer (a limit: see
    /// [`LimitHit`]): asked quiet for the whole session, never loud again.
    pub(super) refused: BTreeSet<StreamId>,
    /// Streams our replica could not take the peer's floor of (the peer
    /// cannot serve the seqs below it): asked quiet until the gap is
    /// filled, or until we compact what we held of it (`routing`,
    /// [`Protocol::check_behind`](super::Protocol)).
    pub(super) behind: BTreeMap<StreamId, Behind>,
    /// The `(stream, signer)` pairs of offered statements this replica
    /// refused for no authority this session, at most
    /// [`STATEMENT_REFUSALS_MAX`](crate::STATEMENT_REFUSALS_MAX): a
    /// repeat is counted and dropped (`statements`). Authority depends on
    /// the stream, the signer and the replica's trust alone, so a pair
    /// refused once is refused again.
    pub(super) refused_statements: HashSet<RefusedStatement>,
}

/// A stream behind the peer's floor.
#[derive(Debug, Clone, Copy)]
pub(super) struct Behind {
    /// The peer's floor.
    pub(super) floor: u64,
    /// Whether our replica held events of the stream above its own floor
    /// when it was found behind (`None` until the next poll reads it:
    /// the report of the apply that found it says only the floor): if it
    /// did, compacting them lets the peer's floor be taken, and the
    /// stream is asked loud again; if it did not (a keyed stream whose
    /// unsigned floor the replica refused), the gap filled releases it,
    /// or the peer holding more of it than `peer_head`.
    pub(super) held: Option<bool>,
    /// The peer's marks of the stream when it was found behind: a peer
    /// whose marks rise past them holds a run it did not, which may
    /// vouch for its floor (a writer's sealed run from it).
    pub(super) peer_head: u64,
}

/// An offered statement refused this session, by what the refusal
/// depends on (so that a repeat is refused again without being judged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum RefusedStatement {
    /// Refused for no authority: its stream and signer (the key's 32
    /// bytes: a decoded key is far larger). Authority depends on those
    /// and the replica's trust alone.
    NoAuthority(StreamId, [u8; 32]),
    /// Refused for a chain hash that is not the replica's at its floor:
    /// its stream, floor and hash. The history a replica holds at a seq
    /// does not change, and once its floor passes the statement's, the
    /// statement erases nothing there anyway.
    HashMismatch(StreamId, u64, ChainHash),
}

impl RefusedStatement {
    /// The two keys `signed` would be remembered under: for no
    /// authority, then for a hash mismatch.
    pub(super) fn keys(signed: &SignedCompaction) -> [RefusedStatement; 2] {
        let Compaction {
            stream,
            floor,
            hash,
        } = signed.statement;
        [
            RefusedStatement::NoAuthority(stream, signed.signer.to_bytes()),
            RefusedStatement::HashMismatch(stream, floor, hash),
        ]
    }
}

/// What this session knows and owes of checkpoints (its rules and bounds
/// are `gossip`'s).
#[derive(Debug, Default)]
pub(super) struct Gossip {
    /// Names the peer holds, as far as this session knows (sent to it, or
    /// received from it), oldest first.
    pub(super) peer_knows: VecDeque<CheckpointName>,
    /// Checkpoints the peer asked for whole, to send.
    pub(super) asked: VecDeque<CheckpointName>,
    /// Checkpoints to ask the peer for whole (their parent is unknown here).
    pub(super) wants: VecDeque<CheckpointName>,
    /// Checkpoints received on this session, oldest first: the parents of
    /// those that follow, before the replica has kept them.
    pub(super) received: VecDeque<Checkpoint>,
}

/// What the protocol sends next: a frame, or a delta held in columns.
pub(super) enum Outgoing {
    Frame(Frame),
    Delta { number: u64, columns: DeltaColumns },
}

/// A delta frame sent and not yet acknowledged.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) number: u64,
    pub(super) sent_at: Instant,
    /// Per stream, the last seq (or floor) it carried.
    pub(super) advance: VersionVector,
    /// Per stream, the first seq of the events it carried.
    pub(super) first: VersionVector,
}

/// Seqs `from ..= to` of a stream, which the peer received in a delta but
/// holds pending (above a hole), as of a receipt; forgotten at `expires`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingRange {
    pub(super) stream: StreamId,
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) expires: Instant,
}

/// A stream asked quiet on this session.
#[derive(Debug, Clone, Copy)]
pub(super) struct QuietAsk {
    pub(super) asked_at: Instant,
    /// Since when the peer's marks show the stream above ours, and the seq
    /// they showed then.
    pub(super) ahead: Option<(u64, Instant)>,
}
