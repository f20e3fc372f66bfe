//! Refusals: what this side does not take from the peer (a received delta
//! cut to the replica's limits, the streams refused for the session), and
//! why a delta the replica refused ends the session.

use std::collections::BTreeMap;

use meshlog_cursor::StreamId;
use meshlog_replica::Limit;
use meshlog_replica::{DeltaColumns, DeltaError, ReplicaError};

use crate::{LimitHit, ProtocolError};

use super::seals::cut_streams;
use super::state::{LocalReplica, Protocol};

impl Protocol {
    /// Cuts from a received delta what this side does not take: the
    /// streams refused earlier in the session, then what the replica says
    /// its limits and membership cannot take ([`LocalReplica::admission`]:
    /// an unknown writer's stream, streams beyond `streams_max`, each
    /// stream from its first event above `payload_bytes_max` on). The
    /// replica alone owns its limits and its membership; this
    /// only maps its cuts onto reports. A stream cut is asked quiet for
    /// the rest of the session, reported in the state
    /// ([`SessionState::limits`]) and logged once; the rest of the delta
    /// is applied as usual. The replica's apply still checks both limits:
    /// a delta that slips past this (a stream count that changed
    /// meanwhile) ends the session with [`ProtocolError::Limit`] as before.
    pub(super) fn admit<L: LocalReplica>(&mut self, columns: &mut DeltaColumns, local: &L) {
        if !self.routing.refused.is_empty() {
            // Cut first, so that they take no slot in the replica's count.
            let refused: BTreeMap<StreamId, u64> = columns
                .runs()
                .iter()
                .map(|run| run.stream)
                .chain(columns.floor.iter().map(|(stream, _)| stream))
                .filter(|stream| self.routing.refused.contains(stream))
                .map(|stream| (stream, 0))
                .collect();
            if !refused.is_empty() {
                self.drop_cut(columns, &refused);
            }
        }
        let admission = local.admission(columns);
        if admission.is_whole() {
            return;
        }
        let peer = self.hello.peer.unwrap_or(self.local);
        for cut in &admission.cuts {
            match cut.limit {
                Limit::StreamsMax { limit } => self.refuse_stream(peer, cut.stream, limit),
                Limit::PayloadBytesMax { len, limit } => {
                    self.refuse_payload(peer, cut.stream, cut.from_seq, len, limit);
                }
                Limit::UnknownWriter { key } => self.refuse_writer(peer, cut.stream, key),
                Limit::Frozen { head } => self.refuse_frozen(peer, cut.stream, head),
                Limit::Unsealed => self.refuse_unsealed(peer, cut.stream),
                Limit::StatementNoAuthority { floor } => {
                    self.refuse_statement(peer, cut.stream, floor);
                }
                // A limit this build does not know yet: cut, not reported.
                _ => {}
            }
        }
        let cut = admission
            .cuts
            .iter()
            .map(|cut| (cut.stream, cut.from_seq))
            .collect();
        self.drop_cut(columns, &cut);
    }

    /// A stream refused for `streams_max`: logged, asked quiet, reported.
    pub(super) fn refuse_stream(&mut self, peer: StreamId, stream: StreamId, streams_max: usize) {
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
    }

    /// A stream cut because its writer is not admitted (a closed
    /// membership): logged, asked quiet, reported. The delta's other
    /// streams are taken, so one stranger's stream does not cut the link.
    pub(super) fn refuse_writer(
        &mut self,
        peer: StreamId,
        stream: StreamId,
        key: Option<meshlog_replica::WriterPublicKey>,
    ) {
        let sealed_by = key.map(|key| key.to_string());
        tracing::warn!(
            %peer,
            %stream,
            key = sealed_by.as_deref().unwrap_or("none (unsealed)"),
            "stream refused: peer relayed a writer this node does not admit; its events \
             are not taken nor asked of this peer again in this session (the rest of the \
             peer's events are). Admit the writer's key in the trust configuration to \
             take it"
        );
        self.refuse(stream, LimitHit::UnknownWriter { stream, key });
    }

    /// A stream cut because it is frozen at a fork (the replica keeps a
    /// proof that its writer signed two histories): logged, asked quiet,
    /// reported. The delta's other streams are taken.
    pub(super) fn refuse_frozen(&mut self, peer: StreamId, stream: StreamId, head: u64) {
        tracing::warn!(
            %peer,
            %stream,
            head,
            "stream refused: its writer forked it (this node keeps the proof, GET /forks); \
             nothing of it above seq {head} is taken, nor asked of this peer again in this \
             session"
        );
        self.refuse(stream, LimitHit::Frozen { stream, head });
    }

    /// A legacy stream cut because it comes unsealed and this replica
    /// requires seals: logged, asked quiet, reported. The delta's sealed
    /// streams are taken, so one legacy stream does not cut the link.
    pub(super) fn refuse_unsealed(&mut self, peer: StreamId, stream: StreamId) {
        tracing::warn!(
            %peer,
            %stream,
            "stream refused: peer relayed an unsealed stream (a legacy stream, from before \
             signed streams) and this node requires seals; its events are not taken nor \
             asked of this peer again in this session (the peer's sealed streams are). Its \
             writer seals it once every node's trust configuration binds its key to it"
        );
        self.refuse(stream, LimitHit::Unsealed { stream });
    }

    /// A stream cut because the peer's compaction statement for it has no
    /// authority here (an admin key not trusted, a writer key not
    /// admitted): logged, asked quiet, reported. The delta's other streams
    /// are taken, so a difference in trust does not cut the link.
    pub(super) fn refuse_statement(&mut self, peer: StreamId, stream: StreamId, floor: u64) {
        tracing::warn!(
            %peer,
            %stream,
            floor,
            "stream refused: peer sent a compaction statement for it (floor {floor}) signed \
             by a key this node does not trust to erase it; nothing of it is taken from this \
             peer in this session (the rest of the peer's events are). Trust the admin key \
             in the trust configuration, or take the stream from a peer below its floor"
        );
        self.refuse(stream, LimitHit::StatementNoAuthority { stream, floor });
    }

    /// A stream cut from an event whose payload is over
    /// `payload_bytes_max`: logged, asked quiet, reported.
    pub(super) fn refuse_payload(
        &mut self,
        peer: StreamId,
        stream: StreamId,
        seq: u64,
        len: usize,
        payload_bytes_max: usize,
    ) {
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
    }

    /// Makes a received delta again without what [`Protocol::admit`] cut:
    /// per stream, its events from the seq in `cut` on (0: the whole
    /// stream, and its floor), and all of a sealed stream's events when
    /// the cut falls below its seal (the replica would refuse the run,
    /// sealed or not: `seals`).
    pub(super) fn drop_cut(&mut self, columns: &mut DeltaColumns, cut: &BTreeMap<StreamId, u64>) {
        // Rare: the delta is made again without what was cut.
        let forks = std::mem::take(&mut columns.forks);
        let mut delta = std::mem::take(columns).into_delta();
        self.state.events_over_limit += cut_streams(&mut delta, cut);
        delta.floor = delta
            .floor
            .iter()
            .filter(|&(stream, _)| cut.get(&stream) != Some(&0))
            .collect();
        delta
            .floor_proofs
            .retain(|stream| cut.get(&stream) != Some(&0));
        self.state_changed = true;
        *columns = DeltaColumns::from_delta(&delta);
        columns.forks = forks;
    }

    /// Records a stream this side cannot take: asked quiet, reported.
    pub(super) fn refuse(&mut self, stream: StreamId, hit: LimitHit) {
        if self.routing.refused.insert(stream) {
            self.routing.quiet_asked.remove(&stream);
            self.routing.routes_due.insert(stream, true);
            self.state.limits.push(hit);
        }
    }
}

/// Why a delta the replica refused ends the session: what the peer did
/// wrong ([`ProtocolError::Refused`]), a local limit it exceeds
/// ([`ProtocolError::Limit`]), or our own store failing
/// ([`ProtocolError::Replica`]).
pub(super) fn refusal(peer: StreamId, source: ReplicaError) -> ProtocolError {
    match source {
        ReplicaError::Delta(source) => {
            match &source {
                DeltaError::OwnStreamAhead { .. } => {
                    tracing::warn!(%peer, reason = %source, "peer tried to write our own stream");
                }
                DeltaError::ZeroSeq { .. }
                | DeltaError::Equivocation { .. }
                | DeltaError::LamportNotRising { .. }
                | DeltaError::LamportTooLarge { .. }
                | DeltaError::FloorTooLarge { .. } => {}
                DeltaError::KeyMismatch { .. }
                | DeltaError::ChainBroken { .. }
                | DeltaError::BadSeal { .. }
                | DeltaError::Unsealed { .. } => {
                    tracing::warn!(%peer, reason = %source, "peer sent a run its seal does not vouch for");
                }
                DeltaError::UnknownWriter { .. } => {
                    tracing::warn!(%peer, reason = %source, "peer relayed a writer this node does not admit");
                }
                DeltaError::StatementNoAuthority { .. }
                | DeltaError::BadStatement { .. }
                | DeltaError::StatementHashMismatch { .. } => {
                    tracing::warn!(%peer, reason = %source, "peer sent a compaction statement without authority");
                }
                DeltaError::Forked { .. } | DeltaError::Frozen { .. } => {
                    tracing::warn!(%peer, reason = %source, "peer relayed a forked writer's other history: the proof is kept, the stream frozen");
                }
            }
            ProtocolError::Refused { peer, source }
        }
        ReplicaError::PayloadTooLarge { .. } | ReplicaError::TooManyStreams { .. } => {
            ProtocolError::Limit { peer, source }
        }
        source => ProtocolError::Replica(source),
    }
}
