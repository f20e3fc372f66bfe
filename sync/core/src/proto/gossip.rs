//! Checkpoint gossip (`docs/PROTOCOL.md`, "Checkpoints"): each checkpoint
//! the replica keeps and the peer does not is sent once, as a difference
//! from one the peer holds when it dominates one, else whole; a
//! checkpoint received is checked against its name before it is handed to
//! the driver to keep; a difference from a parent this side does not hold
//! is answered with an ask for the whole vector; and the driver may ask
//! for one by name (`Protocol::want_checkpoint`: a reader's token names
//! a checkpoint the replica does not keep), with the same ask.
//!
//! Sending is on only when `SessionConfig::checkpoints` is and the peer's
//! hello says it skips kinds it does not know (a peer of protocol 4 built
//! before these frames refuses them); receiving always.

use std::collections::VecDeque;

use meshlog_cursor::{Checkpoint, CheckpointName};

use crate::frame::{CheckpointFrame, Frame};
use crate::ProtocolError;

use super::state::{Gossip, LocalReplica, Protocol, Received};

/// The most names a session remembers the peer holding, and the most
/// asks or checkpoints it holds in each queue: a few times what a replica
/// keeps, so a long session's memory stays bounded.
const NAMES_MAX: usize = 64;
const QUEUE_MAX: usize = 16;

impl Gossip {
    /// Records that the peer holds `name` (bounded: the oldest goes).
    pub(super) fn know(&mut self, name: CheckpointName) {
        if !self.peer_knows.contains(&name) {
            if self.peer_knows.len() == NAMES_MAX {
                self.peer_knows.pop_front();
            }
            self.peer_knows.push_back(name);
        }
    }
}

/// Pushes `name` on a bounded queue, once.
fn enqueue(queue: &mut VecDeque<CheckpointName>, name: CheckpointName) {
    if !queue.contains(&name) && queue.len() < QUEUE_MAX {
        queue.push_back(name);
    }
}

impl Protocol {
    /// The checkpoint frame due next, if any: an ask, then a whole vector
    /// asked for, then (gossip on) the oldest checkpoint kept that the
    /// peer does not hold.
    pub(super) fn checkpoint_frame<L: LocalReplica>(&mut self, local: &L) -> Option<Frame> {
        if let Some(name) = self.gossip.wants.pop_front() {
            return Some(Frame::CheckpointWant(name));
        }
        while let Some(name) = self.gossip.asked.pop_front() {
            if let Some(checkpoint) = self.find(name, local) {
                self.gossip.know(name);
                return Some(Frame::Checkpoint(CheckpointFrame {
                    name,
                    parent: None,
                    changes: checkpoint.vector().clone(),
                }));
            }
        }
        if !self.gossip_on() {
            return None;
        }
        let names = local.checkpoint_names();
        let at = names
            .iter()
            .position(|name| !self.gossip.peer_knows.contains(name))?;
        let checkpoint = local.checkpoint(names[at])?;
        self.gossip.know(checkpoint.name());
        Some(Frame::Checkpoint(self.difference(
            &checkpoint,
            &names[..at],
            local,
        )))
    }

    /// `checkpoint` as a difference from the newest of `older` that the
    /// peer holds and it dominates, or whole.
    fn difference<L: LocalReplica>(
        &self,
        checkpoint: &Checkpoint,
        older: &[CheckpointName],
        local: &L,
    ) -> CheckpointFrame {
        let parent = older
            .iter()
            .rev()
            .filter(|name| self.gossip.peer_knows.contains(name))
            .find_map(|&name| local.checkpoint(name))
            .filter(|parent| checkpoint.vector().dominates(parent.vector()));
        let changes = match &parent {
            None => checkpoint.vector().clone(),
            Some(parent) => checkpoint
                .vector()
                .iter()
                .filter(|&(stream, seq)| seq > parent.vector().get(stream))
                .collect(),
        };
        CheckpointFrame {
            name: checkpoint.name(),
            parent: parent.map(|parent| parent.name()),
            changes,
        }
    }

    /// Whether a checkpoint frame is due (for quiescence).
    pub(super) fn checkpoint_due<L: LocalReplica>(&self, local: &L) -> bool {
        !self.gossip.wants.is_empty()
            || !self.gossip.asked.is_empty()
            || (self.gossip_on()
                && local
                    .checkpoint_names()
                    .iter()
                    .any(|name| !self.gossip.peer_knows.contains(name)))
    }

    /// A checkpoint from the peer: its vector rebuilt (from the parent it
    /// names, or asked for whole if this side lacks it) and checked
    /// against its name; handed to the driver to keep if it is new.
    pub(super) fn on_checkpoint<L: LocalReplica>(
        &mut self,
        frame: CheckpointFrame,
        local: &L,
    ) -> Result<Received, ProtocolError> {
        self.gossip.know(frame.name);
        if self.holds(frame.name, local) {
            return Ok(Received::Nothing);
        }
        let vector = match frame.parent {
            None => frame.changes,
            Some(parent) => match self.find(parent, local) {
                Some(parent) => parent.vector().joined(&frame.changes),
                None => {
                    tracing::debug!(name = %frame.name, %parent, "checkpoint parent unknown: asking for the whole");
                    enqueue(&mut self.gossip.wants, frame.name);
                    return Ok(Received::Nothing);
                }
            },
        };
        let checkpoint = match Checkpoint::new(vector) {
            Ok(checkpoint) if checkpoint.name() == frame.name => checkpoint,
            named => {
                return Err(ProtocolError::CheckpointForged {
                    claimed: frame.name,
                    computed: named.ok().map(|checkpoint| checkpoint.name()),
                })
            }
        };
        if self.gossip.received.len() == QUEUE_MAX {
            self.gossip.received.pop_front();
        }
        self.gossip.received.push_back(checkpoint.clone());
        Ok(Received::Checkpoint(checkpoint))
    }

    /// Asks the peer for the checkpoint `name` whole, with the same
    /// `CheckpointWant` a receiver sends for a parent it lacks: for a
    /// reader whose token names a checkpoint the replica does not keep
    /// (the node fetches it by name, `docs/TOKEN.md`). The answer comes
    /// back as any checkpoint does, checked against its name
    /// ([`Received::Checkpoint`]); a peer that does not keep it answers
    /// nothing. Whether the ask is queued: only once the peer takes
    /// checkpoint frames ([`Protocol::takes_checkpoint_frames`]; an ask is
    /// not gossip, so whatever [`SessionConfig::checkpoints`] says), not
    /// for a checkpoint this side holds, and not past the queue's bound.
    ///
    /// [`SessionConfig::checkpoints`]: crate::SessionConfig::checkpoints
    pub fn want_checkpoint<L: LocalReplica>(&mut self, name: CheckpointName, local: &L) -> bool {
        if !self.takes_checkpoint_frames() || self.holds(name, local) {
            return false;
        }
        enqueue(&mut self.gossip.wants, name);
        self.gossip.wants.contains(&name)
    }

    /// Whether the peer takes checkpoint frames: its hello arrived and
    /// says it skips frame kinds it does not know (a peer built before
    /// them ends the session on one).
    pub fn takes_checkpoint_frames(&self) -> bool {
        self.hello.peer.is_some() && self.hello.peer_skips_unknown_kinds
    }

    /// The peer asks for a checkpoint whole: sent if the replica keeps it.
    pub(super) fn on_checkpoint_want(&mut self, name: CheckpointName) {
        enqueue(&mut self.gossip.asked, name);
    }

    /// Asks the peer for the checkpoint its hello was written against
    /// (`Frame::HelloAgainst`), once and again at each tick while it has
    /// not come: the one frame sent before the peer's hello is read.
    pub(super) fn ask_for_hello_base(&mut self, name: CheckpointName) {
        enqueue(&mut self.gossip.wants, name);
    }

    /// The ask for the checkpoint a peer's hello was written against, if
    /// one waits for it and the ask is due.
    pub(super) fn pending_hello_want(&mut self) -> Option<Frame> {
        self.hello.against_pending.as_ref()?;
        self.gossip.wants.pop_front().map(Frame::CheckpointWant)
    }

    /// At each tick, the ask for the checkpoint a waiting hello was
    /// written against goes again (it or its answer may have been lost).
    pub(super) fn ask_again_for_hello_base(&mut self) {
        if let Some(name) = self.hello.against_pending.as_ref().map(|h| h.base) {
            self.ask_for_hello_base(name);
        }
    }

    fn holds<L: LocalReplica>(&self, name: CheckpointName, local: &L) -> bool {
        self.gossip.received.iter().any(|c| c.name() == name)
            || local.checkpoint_names().contains(&name)
    }

    /// The checkpoint of that name, if this side holds it: received on
    /// the session, kept by the replica, or the one our hello was written
    /// against.
    pub(super) fn find<L: LocalReplica>(
        &self,
        name: CheckpointName,
        local: &L,
    ) -> Option<Checkpoint> {
        self.gossip
            .received
            .iter()
            .find(|c| c.name() == name)
            .cloned()
            .or_else(|| local.checkpoint(name))
            .or_else(|| {
                self.hello
                    .against_base
                    .clone()
                    .filter(|base| base.name() == name)
            })
    }
}
