//! Compaction statements offered to a peer that holds a stream past their
//! floor (`docs/SIGNING.md`, "Floors with an authority"; the `Statement`
//! frame, kind 8, `docs/PROTOCOL.md`).
//!
//! A delta carries a statement only with a floor, and a floor goes only to
//! a peer whose marks are below it: a peer already past the floor, still
//! holding the events below it, never learned the statement, so an admin's
//! compaction erased only where it was posted. Here, each statement the
//! local replica keeps goes once per session, in a frame of its own, to a
//! peer whose floor (its hello's, or one its deltas carried) is below the
//! statement's and whose view is past ours (a peer behind our floor gets
//! the statement with the floor, in a delta). Never the peer's own stream
//! (no statement erases it), and only to a peer whose hello says it skips
//! frame kinds it does not know: an older peer gets nothing new and
//! behaves as before.
//!
//! Cheap: asked only when no delta is due (a poll that sends events reads
//! no floor for this), and the floor up to which the peer was told is
//! kept, so a poll with nothing new compares two vectors and reads no
//! statement; a statement is sent once per session (a frame lost to a
//! fault proxy is sent again by the next session).
//!
//! The receiver applies an offered statement as a delta of that floor and
//! statement alone (the one acceptance path judges it), where it holds
//! events of the stream at or below the statement's floor and above its
//! own (else there is nothing to erase, and nothing is applied). One its
//! replica does not grant authority (`StatementNoAuthority`: a node that
//! does not trust the admin key, a writer not admitted) is logged and
//! ignored, and the session goes on: a mesh whose nodes trust differently
//! keeps its links. Any other refusal (a bad signature, a hash that is not
//! the receiver's) ends the session as in a delta.
//!
//! A refusal for no authority is remembered for the rest of the session
//! by the statement's stream and signer: authority depends on those and
//! the replica's trust alone, so a peer that offers the same again
//! (whatever its floor) has it counted and dropped at the cost of a
//! lookup, with no commit round and no log. A refusal for a hash mismatch
//! is remembered by the statement's stream, floor and hash: the history
//! the replica holds at that seq does not change (and once its floor
//! passes the statement's, the statement erases nothing here anyway), so
//! the same statement is refused again, whoever signed it. Both share one
//! bound ([`STATEMENT_REFUSALS_MAX`] entries). Otherwise a peer could make
//! each repeat cost the receiver a commit round and two `warn` lines.

use meshlog_cursor::StreamId;
use meshlog_replica::{ApplyReport, DeltaColumns, DeltaError, ReplicaError, SignedCompaction};

use crate::frame::Frame;
use crate::{LimitHit, ProtocolError, STATEMENT_REFUSALS_MAX};

use super::refusals::refusal;
use super::state::{LocalReplica, Protocol, Received, RefusedStatement};

impl Protocol {
    /// The next statement frame owed to the peer, if any: the first
    /// stream whose floor here is above what the peer was told, that the
    /// peer holds past our floor, and of which we keep a statement above
    /// the peer's floor. Every stream looked at counts as told.
    pub(super) fn statement_frame<L: LocalReplica>(&mut self, local: &L) -> Option<Frame> {
        if !self.hello.peer_skips_unknown_kinds {
            return None;
        }
        let peer = self.hello.peer?;
        // Asked at every poll that sends no delta: the floor alone (most
        // often nothing new), the marks only when a statement may be owed.
        if self.send.statements_told.dominates(&local.floor()) {
            return None;
        }
        let (marks, floor) = local.marks_and_floor();
        if self.send.statements_told.dominates(&floor) {
            return None;
        }
        let view = self.send_view(&marks).into_owned();
        for (stream, floor_seq) in floor.iter() {
            let told = self.send.statements_told.get(stream);
            if told >= floor_seq {
                continue;
            }
            self.send.statements_told.advance(stream, floor_seq);
            // Behind our floor, the peer gets it with the floor, in a delta.
            if stream == peer || view.get(stream) < floor_seq {
                continue;
            }
            if let Some(signed) = local
                .statement(stream)
                .filter(|signed| signed.statement.floor > told)
            {
                self.state.statements_sent += 1;
                self.state_changed = true;
                tracing::debug!(%peer, %stream, floor = signed.statement.floor, "compaction statement offered");
                return Some(Frame::Statement(signed));
            }
        }
        None
    }

    /// Whether a statement frame may be owed (what [`Protocol::is_quiescent`]
    /// asks): our floor is above what the peer was told somewhere.
    pub(super) fn statement_due<L: LocalReplica>(&self, local: &L) -> bool {
        self.hello.peer_skips_unknown_kinds && !self.send.statements_told.dominates(&local.floor())
    }

    /// A statement the peer offered: handed back to apply as a delta of
    /// its floor and the statement alone, where this replica holds events
    /// of the stream it would erase; else nothing. One this session
    /// refused already (its stream and signer for no authority, or its
    /// stream, floor and hash for a hash mismatch) is counted refused and
    /// dropped before anything is read.
    pub(super) fn on_statement<L: LocalReplica>(
        &mut self,
        signed: SignedCompaction,
        local: &L,
    ) -> Received {
        let stream = signed.statement.stream;
        let offered = RefusedStatement::keys(&signed);
        let refused = &self.routing.refused_statements;
        if offered.iter().any(|key| refused.contains(key)) {
            self.state.statements_refused += 1;
            self.state_changed = true;
            return Received::Nothing;
        }
        let (marks, floor) = local.marks_and_floor();
        let erases = stream != self.local
            && floor.get(stream) < signed.statement.floor
            && marks.get(stream) > floor.get(stream);
        if !erases {
            tracing::debug!(%stream, floor = signed.statement.floor, "offered statement erases nothing held here: ignored");
            return Received::Nothing;
        }
        let mut columns =
            DeltaColumns::new([(stream, signed.statement.floor)].into_iter().collect());
        columns.floor_proofs.statements.push(signed);
        self.acks.applying_statement = Some(offered);
        Received::Apply(columns)
    }

    /// How applying the offered statement went (`offered`: what it is
    /// remembered under, refused): one this replica grants no authority,
    /// or whose hash differs from the history held at its floor, is
    /// remembered for the session, logged and ignored (the session goes
    /// on); any other refusal ends the session as in a delta.
    pub(super) fn statement_applied(
        &mut self,
        offered: [RefusedStatement; 2],
        applied: Result<ApplyReport, ReplicaError>,
    ) -> Result<(), ProtocolError> {
        let peer = self.hello.peer.unwrap_or(self.local);
        self.state_changed = true;
        let [no_authority, hash_mismatch] = offered;
        match applied {
            Ok(_) => Ok(()),
            Err(ReplicaError::Delta(reason @ DeltaError::StatementNoAuthority { .. })) => {
                self.state.statements_refused += 1;
                self.remember_refused_statement(peer, no_authority);
                tracing::warn!(
                    %peer,
                    %reason,
                    "peer offered a compaction statement this replica grants no authority: \
                     nothing erased, the session goes on (trust the mesh's admin key here \
                     for its statements to erase)"
                );
                Ok(())
            }
            // An honest disagreement (the peer holds another history of
            // the stream at the floor, e.g. a forked writer's other
            // branch): ending the session would only have the next one
            // offer it again. A bad signature still ends it.
            Err(ReplicaError::Delta(reason @ DeltaError::StatementHashMismatch { .. })) => {
                self.state.statements_refused += 1;
                self.remember_refused_statement(peer, hash_mismatch);
                tracing::warn!(
                    %peer,
                    %reason,
                    "peer offered a compaction statement whose chain hash differs from the \
                     history this replica holds at its floor: nothing erased, the session \
                     goes on (GET /forks shows whether the stream's writer forked it)"
                );
                Ok(())
            }
            Err(source) => Err(refusal(peer, source)),
        }
    }

    /// Remembers `offered` as refused for the rest of the session, while
    /// fewer than [`STATEMENT_REFUSALS_MAX`] refusals are; past that,
    /// reports [`LimitHit::StatementRefusalsMax`] once, logged once at
    /// `warn`.
    fn remember_refused_statement(&mut self, peer: StreamId, offered: RefusedStatement) {
        let refused = &mut self.routing.refused_statements;
        if refused.len() < STATEMENT_REFUSALS_MAX {
            refused.insert(offered);
            return;
        }
        let hit = LimitHit::StatementRefusalsMax {
            limit: STATEMENT_REFUSALS_MAX,
        };
        if !self.state.limits.contains(&hit) {
            tracing::warn!(
                %peer,
                limit = STATEMENT_REFUSALS_MAX,
                "peer offered more than {STATEMENT_REFUSALS_MAX} distinct compaction \
                 statements refused here (no authority, or a chain hash not this replica's) \
                 in this session: further ones are not remembered, and each repeat costs a \
                 commit round"
            );
            self.state.limits.push(hit);
        }
    }
}
