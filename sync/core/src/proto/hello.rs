//! The hello exchange: our hello, the peer's (who it is, what it holds of
//! our stream, the frame size it takes), and the checks on it (a
//! self-connection, an identity that changes).

use crate::frame::{self, Frame, Hello};
use crate::ProtocolError;

use super::state::{LocalReplica, Protocol};

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
        Frame::Hello(Hello {
            protocol: frame::PROTOCOL_VERSION,
            stream: self.local,
            marks,
            floor,
            // The limit we read, its lowest bit set: we skip frame kinds
            // we do not know (`HELLO_SKIPS_UNKNOWN_KINDS`).
            frame_bytes_max: self.config.receive_limit() as u32,
        })
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
