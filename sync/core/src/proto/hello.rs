//! The hello exchange: our hello, the peer's (who it is, what it holds of
//! our stream, the frame size it takes), and the checks on it (a
//! self-connection, an identity that changes); and [`PeerMemory`], what a
//! session learned of its peer for the next session dialed to it.

use meshlog_cursor::CheckpointName;

use crate::frame::{self, CheckpointFrame, Frame, Hello, HelloAgainst};
use crate::ProtocolError;

use super::state::{LocalReplica, Protocol, Received};

/// The most checkpoint names a [`PeerMemory`] holds: as many as a replica
/// keeps (`meshlog_replica::CHECKPOINTS_KEPT`).
pub(super) const MEMORY_NAMES_MAX: usize = 16;

/// What a session learned of its peer that the next session dialed to the
/// same peer starts from (`docs/PROTOCOL.md`, "The dialer's hello"): with
/// it, the dialer's first hello goes against a checkpoint, where a writer
/// retired and compacted costs nothing. Kept by the driver between
/// sessions (`meshlog_sync::PeerLink`, per peer dialed), handed to the next
/// with [`Protocol::with_peer_memory`]; the default knows nothing (a
/// whole hello). A driver that keeps it past its process (the node does,
/// in its data directory) writes it with [`PeerMemory::to_bytes`] and
/// reads it back with [`PeerMemory::from_bytes`].
///
/// ```
/// use std::time::Instant;
/// use meshlog_cursor::StreamId;
/// use meshlog_sync_core::proto::{PeerMemory, Protocol};
/// use meshlog_sync_core::SessionConfig;
///
/// let core = Protocol::new(StreamId::new(1), SessionConfig::default(), Instant::now());
/// // No hello from the peer yet: nothing learned, the next hello goes whole.
/// assert_eq!(core.peer_memory(), PeerMemory::default());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerMemory {
    /// Whether the peer's hello said it reads a hello against a
    /// checkpoint (kind 9,
    /// [`Hello::takes_hello_against`](crate::frame::Hello::takes_hello_against)),
    /// and this side reads and writes one (`SessionConfig::checkpoints`).
    pub reads_hello_against: bool,
    /// Checkpoints the peer holds, as far as the session knew (sent to
    /// it, received from it, the base of a hello against one), oldest
    /// first, at most 16: preferred as the next hello's base, so that the
    /// peer need not fetch it.
    pub checkpoints: Vec<CheckpointName>,
}

impl PeerMemory {
    /// What a dialer assumes of a peer it never met: that it reads a
    /// hello against a checkpoint and holds none known. Its first hello
    /// then goes against the newest checkpoint its marks dominate (in a
    /// mesh, most likely one the peer holds; if not, the peer fetches it
    /// by name), so that even a link's first session costs nothing per
    /// retired writer. A peer that does not read one says so in its hello
    /// (ours then goes again, whole, at once), and one built before kind
    /// 9 ends the session on it: the memory that session leaves
    /// ([`Protocol::peer_memory`]) knows nothing, and the redial's hello
    /// goes whole. [`PeerMemory::default`] is that memory: a whole hello.
    pub fn unmet() -> Self {
        PeerMemory {
            reads_hello_against: true,
            checkpoints: Vec::new(),
        }
    }
}

impl Protocol {
    /// Starts from what an earlier session with the same peer learned
    /// ([`Protocol::peer_memory`]): if the peer read a hello against a
    /// checkpoint then, our first hello goes against one (with
    /// [`SessionConfig::checkpoints`](crate::SessionConfig::checkpoints)
    /// on), preferably one the peer holds. For a dialer: an accepting side
    /// answers the dialer's hello, which says what it reads.
    ///
    /// If the peer no longer reads one, its hello says so and ours goes
    /// again, whole, at once; a peer built before kind 9 ends the session
    /// on it, and [`Protocol::peer_memory`] then remembers nothing.
    pub fn with_peer_memory(mut self, memory: &PeerMemory) -> Self {
        self.hello.peer_takes_against = self.config.checkpoints && memory.reads_hello_against;
        let skip = memory.checkpoints.len().saturating_sub(MEMORY_NAMES_MAX);
        self.hello.peer_held = memory.checkpoints[skip..].to_vec();
        self
    }

    /// What this session learned of its peer, for the next session dialed
    /// to it ([`Protocol::with_peer_memory`]): whether its hello says it
    /// reads a hello against a checkpoint, and the checkpoints it holds.
    /// Nothing before the peer's hello: a session that ended without one
    /// (a peer that ended it on our hello against a checkpoint, say)
    /// leaves the next hello whole.
    pub fn peer_memory(&self) -> PeerMemory {
        if self.hello.peer.is_none() {
            return PeerMemory::default();
        }
        let mut checkpoints: Vec<CheckpointName> = Vec::new();
        let names = self.hello.peer_held.iter().chain(&self.gossip.peer_knows);
        for name in names {
            if !checkpoints.contains(name) {
                checkpoints.push(*name);
            }
        }
        let skip = checkpoints.len().saturating_sub(MEMORY_NAMES_MAX);
        checkpoints.drain(..skip);
        PeerMemory {
            reads_hello_against: self.hello.peer_takes_against,
            checkpoints,
        }
    }

    /// Our hello: stream, marks, floor and frame limit. Its marks are our
    /// marks number 1 if none were numbered yet.
    pub(super) fn hello_frame<L: LocalReplica>(&mut self, local: &L) -> Frame {
        self.hello.hello_due = false;
        // No marks numbered yet: this is our first hello (a later one is a
        // re-send), as `on_hello` reads it too.
        let first = self.marks.marks_sent.is_empty();
        let (marks, floor) = local.marks_and_floor();
        // The first hello's marks are our marks number 1: any hello the
        // peer holds carries them or later ones, so a difference from
        // them is sound whichever hello arrived.
        if first {
            self.marks.marks_sent.push_back((1, marks.clone()));
        }
        let hello = Hello {
            protocol: frame::PROTOCOL_VERSION,
            stream: self.local,
            marks,
            floor,
            // The limit we read, its lowest bit set: we skip frame kinds
            // we do not know (`HELLO_SKIPS_UNKNOWN_KINDS`); with
            // checkpoints on, its second too (`HELLO_TAKES_HELLO_AGAINST`).
            frame_bytes_max: self.config.receive_limit() as u32,
        };
        if self.hello.peer_takes_against {
            if let Some(against) = self.against(&hello, local) {
                self.state.first_hello_against |= first;
                return Frame::HelloAgainst(against);
            }
        }
        Frame::Hello(hello)
    }

    /// `hello` against the newest checkpoint the replica keeps that its
    /// marks dominate and the peer holds, else the newest its marks
    /// dominate (the peer fetches it by name), if that takes fewer bytes
    /// than the whole hello (then the checkpoint is kept for the session,
    /// to answer the peer's ask for it).
    fn against<L: LocalReplica>(&mut self, hello: &Hello, local: &L) -> Option<HelloAgainst> {
        let names = local.checkpoint_names();
        let write = |name: &CheckpointName| {
            let base = local.checkpoint(*name)?;
            HelloAgainst::new(hello, &base).map(|against| (base, against))
        };
        let (base, against) = names
            .iter()
            .rev()
            .filter(|name| self.peer_holds(**name))
            .find_map(write)
            .or_else(|| names.iter().rev().find_map(write))?;
        let bytes = |frame: Frame| frame::encode_payload(&frame).map_or(usize::MAX, |b| b.len());
        let against_bytes = bytes(Frame::HelloAgainst(against.clone()));
        if against_bytes >= bytes(Frame::Hello(hello.clone())) {
            return None;
        }
        if self.hello.peer.is_some() {
            // The peer's hello says it reads ours: it holds the base, or
            // fetches it from us.
            self.gossip.know(base.name());
        }
        self.hello.against_base = Some(base);
        Some(against)
    }

    /// Whether the peer holds the checkpoint `name`, as far as this
    /// session (or the one before it, `PeerMemory`) knows.
    fn peer_holds(&self, name: CheckpointName) -> bool {
        self.hello.peer_held.contains(&name) || self.gossip.peer_knows.contains(&name)
    }

    /// The peer asks for a checkpoint before its hello: answered if it is
    /// the one our hello was written against (an accepting side that does
    /// not keep it asks before it answers our hello), else ignored as any
    /// frame before a hello.
    pub(super) fn on_hello_base_want(&mut self, name: CheckpointName) {
        if self
            .hello
            .against_base
            .as_ref()
            .is_some_and(|base| base.name() == name)
        {
            self.on_checkpoint_want(name);
        } else {
            tracing::debug!(%name, "checkpoint asked for before the peer's hello ignored");
        }
    }

    /// The answer to the peer's ask for the checkpoint our hello was
    /// written against, if one is due before the peer's hello (the only
    /// ask taken then: `on_hello_base_want`).
    pub(super) fn hello_base_answer<L: LocalReplica>(&mut self, local: &L) -> Option<Frame> {
        if self.gossip.asked.is_empty() {
            return None;
        }
        self.checkpoint_frame(local)
    }

    /// A peer's hello against a checkpoint: taken as the hello it stands
    /// for if this side holds the checkpoint; otherwise, before the
    /// peer's first hello, kept while the checkpoint is asked for by name
    /// (a re-sent one after it tells nothing new). A side that did not
    /// say it reads one skips it, as a kind it does not take.
    pub(super) fn on_hello_against<L: LocalReplica>(
        &mut self,
        against: HelloAgainst,
        local: &L,
    ) -> Result<Received, ProtocolError> {
        if !self.config.checkpoints {
            self.state.frames_skipped += 1;
            return Ok(Received::Nothing);
        }
        match self.find(against.base, local) {
            Some(base) => {
                let hello = against.expand(&base).map_err(ProtocolError::Frame)?;
                self.on_hello(hello, local)?;
                // It wrote its hello against it: it holds it.
                self.gossip.know(base.name());
            }
            None if self.hello.peer.is_none() => {
                tracing::debug!(base = %against.base, "hello against a checkpoint not kept here: asking for it");
                self.ask_for_hello_base(against.base);
                self.hello.against_pending = Some(against);
            }
            None => {}
        }
        Ok(Received::Nothing)
    }

    /// A checkpoint that arrives while the peer's hello waits for the one
    /// it was written against: taken as any checkpoint is (checked
    /// against its name, handed back to keep), then the hello, if that
    /// was its checkpoint.
    pub(super) fn on_pending_checkpoint<L: LocalReplica>(
        &mut self,
        checkpoint: CheckpointFrame,
        local: &L,
    ) -> Result<Received, ProtocolError> {
        let received = self.on_checkpoint(checkpoint, local)?;
        let base = self
            .hello
            .against_pending
            .as_ref()
            .and_then(|pending| self.find(pending.base, local));
        if let (Some(base), Some(pending)) = (base, self.hello.against_pending.take()) {
            let hello = pending.expand(&base).map_err(ProtocolError::Frame)?;
            self.on_hello(hello, local)?;
        }
        Ok(received)
    }

    pub(super) fn on_hello<L: LocalReplica>(
        &mut self,
        hello: Hello,
        local: &L,
    ) -> Result<(), ProtocolError> {
        let first = self.hello.peer.is_none();
        if hello.stream == self.local {
            return Err(ProtocolError::SelfConnection {
                stream: hello.stream,
            });
        }
        match self.hello.peer {
            Some(was) if was != hello.stream => {
                return Err(ProtocolError::IdentityChanged {
                    was,
                    now: hello.stream,
                });
            }
            Some(_) => {
                // A re-sent or duplicated hello: take it as a heartbeat.
            }
            None => self.establish(&hello, local),
        }
        self.hello.peer_frame_bytes_max = hello.frame_limit();
        self.hello.peer_skips_unknown_kinds = hello.skips_unknown_kinds();
        self.hello.peer_takes_against = self.config.checkpoints && hello.takes_hello_against();
        if first {
            self.our_hello_against_answered();
        }
        // A side that waited for the peer's hello answers it now.
        self.hello.hello_due |= self.marks.marks_sent.is_empty();
        self.state.peer = Some(hello.stream);
        self.state.peer_marks.join(&hello.marks);
        self.state.peer_floor.join(&hello.floor);
        self.send.statements_told.join(&hello.floor);
        // The peer's hello marks are its marks number 1.
        self.marks.peer_marks.join(&hello.marks);
        self.marks.peer_marks_number = self.marks.peer_marks_number.max(1);
        self.recompute_view();
        Ok(())
    }

    /// The peer's first hello: who it is, checked against what it claims
    /// of our stream and against the replica's other sessions.
    fn establish<L: LocalReplica>(&mut self, hello: &Hello, local: &L) {
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
        self.hello.peer = Some(hello.stream);
        self.hello.peer_holds_own_stream =
            hello.marks.get(hello.stream) >= local.marks().get(hello.stream);
        if let Some(link) = &self.routing.link {
            if !link.establish(self.local, hello.stream) {
                tracing::info!(
                    local = %self.local,
                    peer = %hello.stream,
                    "a second session with this peer: the one dialed by the lower id is kept, this one ends"
                );
                self.routing.duplicate = true;
            }
        }
        tracing::debug!(local = %self.local, peer = %hello.stream, marks = ?hello.marks, "sync session established");
    }

    /// The peer's first hello, after ours went against a checkpoint (a
    /// dialer that remembered the peer reads one): if its hello says it
    /// reads one, it holds the base or fetches it from us; if not (it was
    /// downgraded, or turned checkpoints off, and skips ours), ours goes
    /// again, whole, at once.
    fn our_hello_against_answered(&mut self) {
        let Some(base) = self.hello.against_base.as_ref().map(|base| base.name()) else {
            return;
        };
        if self.hello.peer_takes_against {
            self.gossip.know(base);
        } else {
            tracing::debug!(%base, "the peer does not read a hello against a checkpoint: sending ours whole");
            self.hello.hello_due = true;
        }
    }

    /// Whether checkpoints are gossiped to the peer: on in our
    /// configuration, and the peer's hello says it skips frame kinds it
    /// does not know (a peer built before the checkpoint frames ends the
    /// session on one; its hello does not say so).
    pub(super) fn gossip_on(&self) -> bool {
        self.config.checkpoints && self.hello.peer_skips_unknown_kinds
    }
}
