//! Forks (`docs/SIGNING.md`, "Equivocation with valid signatures").
//!
//! Proofs passed on: each proof the local replica keeps goes to the peer
//! once per session, in a delta of its own (no events: its forks section,
//! tag 3, `docs/PROTOCOL.md`), so that the peer freezes the stream too
//! once it has verified the proof itself. The receiving side needs
//! nothing for that: the replica keeps the proofs a delta passes on when
//! it applies it.
//!
//! A delta that reveals a fork: the replica refuses it whole
//! (`DeltaError::Forked`), keeping the proof and freezing the stream. The
//! session goes on (it ended, and the other streams stopped syncing on
//! that link until the redial): the stream is refused for the session as
//! a frozen stream the admission cuts would be (asked quiet,
//! `LimitHit::Frozen`), and the delta is not acknowledged, so the peer
//! sends what else it carried again, which the admission then takes
//! without the frozen stream. Safe: the proof is kept before the session
//! reads the refusal, and what the next session would do with that peer
//! (cut the frozen stream, take the rest) is what this one now does.

use meshlog_replica::{DeltaColumns, DeltaError, ReplicaError};

use super::state::{LocalReplica, Protocol};

impl Protocol {
    /// A delta carrying the proofs the local replica keeps that this
    /// session has not sent yet, if any (then they count as sent).
    pub(super) fn forks_part<L: LocalReplica>(&mut self, local: &L) -> Option<DeltaColumns> {
        let forks = local.forks_except(&self.send.forks_sent);
        if forks.is_empty() {
            return None;
        }
        self.send
            .forks_sent
            .extend(forks.iter().map(|proof| proof.stream()));
        let mut part = DeltaColumns::new(meshlog_cursor::VersionVector::new());
        part.forks = forks;
        Some(part)
    }
}

impl Protocol {
    /// Whether the delta the replica refused with `source` leaves the
    /// session going: refused for a stream it froze at a fork
    /// (`DeltaError::Forked`, the proof kept) or froze after the
    /// admission looked (`DeltaError::Frozen`), that this session has not
    /// refused yet. Then that stream is refused for the session (asked
    /// quiet, [`LimitHit::Frozen`](crate::LimitHit::Frozen) at the head
    /// it is frozen at, logged) and the delta is not acknowledged: the
    /// peer sends the rest again (at its next receipt's repair or its
    /// retransmission timeout). A stream this session refused is cut
    /// before the replica sees it, so a second such refusal of it would
    /// be the replica's own doing: that ends the session as before,
    /// rather than loop.
    pub(super) fn refused_at_fork(&mut self, source: &ReplicaError) -> bool {
        let ReplicaError::Delta(
            DeltaError::Forked { stream, head, .. } | DeltaError::Frozen { stream, head },
        ) = source
        else {
            return false;
        };
        if self.routing.refused.contains(stream) {
            return false;
        }
        let peer = self.hello.peer.unwrap_or(self.local);
        tracing::debug!(%peer, reason = %source, "delta refused at a fork: the session goes on, the rest of it is sent again");
        self.refuse_frozen(peer, *stream, *head);
        self.state_changed = true;
        true
    }
}
