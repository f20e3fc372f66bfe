//! Refusals: what this side does not take from the peer (a received delta
//! cut to the replica's limits, the streams refused for the session), and
//! why a delta the replica refused ends the session.

use super::*;

impl Protocol {
    /// Cuts what the replica's limits cannot take from a received delta:
    /// events of streams beyond `streams_max` (every stream the replica
    /// does not hold yet, once it holds that many), and each stream from
    /// its first event above `payload_bytes_max` on. Those streams are
    /// asked quiet for the rest of the session, reported in the state
    /// ([`SessionState::limits`]) and logged once each; the rest of the
    /// delta is applied as usual. The replica's apply still checks both
    /// limits: a delta that slips past this (a stream count that changed
    /// meanwhile) ends the session with [`ProtocolError::Limit`] as before.
    pub(super) fn admit<L: LocalReplica>(&mut self, columns: &mut DeltaColumns, local: &L) {
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
        let peer = self.hello.peer.unwrap_or(self.local);
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
                if self.routing.refused.contains(&stream) {
                    cut.insert(stream, 0);
                    continue;
                }
                if !admitted.contains(&stream) && !held(stream) {
                    if streams_held >= streams_max {
                        self.refuse_stream(peer, stream, streams_max);
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
            self.refuse_payload(peer, stream, seq, len, payload_bytes_max);
            cut.insert(stream, seq);
        }
        if !cut.is_empty() {
            self.drop_cut(columns, &cut);
        }
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
    /// stream, and its floor).
    pub(super) fn drop_cut(&mut self, columns: &mut DeltaColumns, cut: &BTreeMap<StreamId, u64>) {
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
    pub(super) fn refuse(&mut self, stream: StreamId, hit: LimitHit) {
        if self.routing.refused.insert(stream) {
            self.routing.quiet_asked.remove(&stream);
            self.routing.routes_due.insert(stream, true);
            self.state.limits.push(hit);
        }
    }
}

/// Whether `stream` has an entry in `vector`.
pub(super) fn held_in(vector: &VersionVector, stream: StreamId) -> bool {
    vector.get(stream) > 0
}

/// Why a delta the replica refused ends the session: what the peer did
/// wrong ([`ProtocolError::Refused`]), a local limit it exceeds
/// ([`ProtocolError::Limit`]), or our own store failing
/// ([`ProtocolError::Replica`]).
pub(super) fn refusal(peer: StreamId, source: ReplicaError) -> ProtocolError {
    match source {
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
    }
}
