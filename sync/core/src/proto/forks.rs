//! Fork proofs passed on (`docs/SIGNING.md`, "Equivocation with valid
//! signatures"): each proof the local replica keeps goes to the peer once
//! per session, in a delta of its own (no events: its forks section, tag
//! 3, `docs/PROTOCOL.md`), so that the peer freezes the stream too once it
//! has verified the proof itself. The receiving side needs nothing here:
//! the replica keeps the proofs a delta passes on when it applies it.

use meshlog_replica::DeltaColumns;

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
