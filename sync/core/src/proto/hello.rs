//! The hello exchange: our hello, the peer's (who it is, what it holds of
//! our stream, the frame size it takes), and the checks on it (a
//! self-connection, an identity that changes).

use crate::frame::{self, CheckpointFrame, Frame, Hello, HelloAgainst};
use crate::ProtocolError;

use super::state::{LocalReplica, Protocol, Received};

impl Protocol {
    /// Our hello: stream, marks, floor and frame limit. Its marks are our
    /// marks number 1 if none were numbered yet.
    pub(super) fn hello_frame<L: LocalReplica>(&mut self, local: &L) -> Frame {
        self.hello.hello_due = false;
        let (marks, floor) = local.marks_and_floor();
        // The first hello's marks are our marks number 1: any hello the
        // peer holds carries them or later ones, so a difference from
        // them is sound whichever hello arrived.
        if self.marks.marks_sent.is_empty() {
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
                return Frame::HelloAgainst(against);
            }
        }
        Frame::Hello(hello)
    }

    /// `hello` against the newest checkpoint the replica keeps that its
    /// marks dominate, if that takes fewer bytes than the whole hello
    /// (then the checkpoint is kept for the session, to answer the peer's
    /// ask for it).
    fn against<L: LocalReplica>(&mut self, hello: &Hello, local: &L) -> Option<HelloAgainst> {
        let (base, against) = local
            .checkpoint_names()
            .iter()
            .rev()
            .filter_map(|&name| local.checkpoint(name))
            .find_map(|base| HelloAgainst::new(hello, &base).map(|against| (base, against)))?;
        let bytes = |frame: Frame| frame::encode_payload(&frame).map_or(usize::MAX, |b| b.len());
        let against_bytes = bytes(Frame::HelloAgainst(against.clone()));
        if against_bytes >= bytes(Frame::Hello(hello.clone())) {
            return None;
        }
        self.hello.against_base = Some(base);
        Some(against)
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
        }
        self.hello.peer_frame_bytes_max = hello.frame_limit();
        self.hello.peer_skips_unknown_kinds = hello.skips_unknown_kinds();
        self.hello.peer_takes_against = self.config.checkpoints && hello.takes_hello_against();
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

    /// Whether checkpoints are gossiped to the peer: on in our
    /// configuration, and the peer's hello says it skips frame kinds it
    /// does not know (a peer built before the checkpoint frames ends the
    /// session on one; its hello does not say so).
    pub(super) fn gossip_on(&self) -> bool {
        self.config.checkpoints && self.hello.peer_skips_unknown_kinds
    }
}
