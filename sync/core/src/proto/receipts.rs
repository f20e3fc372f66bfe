//! Acks and heartbeats (receipts) both ways: ours (when one is due, our
//! marks as a difference from marks the peer holds) and the peer's (which
//! deltas arrived, what was lost, its marks).

use std::time::Instant;

use meshlog_cursor::VersionVector;
use meshlog_replica::{ApplyReport, ReplicaError};

use crate::frame::{Frame, MarksDiff, Receipt};
use crate::ProtocolError;

use super::refusals::refusal;
use super::state::{InFlight, LocalReplica, PendingRange, Protocol};
use super::timeouts::tick_interval;
use super::view::{add_pending, walk};

impl Protocol {
    /// A due heartbeat (which stands for a due ack) or ack, if one is due.
    /// The tick's heartbeat is left out while it only repeats an idle one
    /// ([`Protocol::idle_tick`]).
    pub(super) fn receipt_frame<L: LocalReplica>(&mut self, local: &L) -> Option<Frame> {
        if self.acks.heartbeat_due || self.acks.tick_due {
            let receipt = self.receipt(local);
            let repair = self.acks.heartbeat_due || self.acks.ack_due;
            self.acks.tick_due = false;
            if !repair && self.idle_tick(&receipt) {
                return None;
            }
            // A heartbeat is a receipt too: it stands for a due ack.
            self.acks.heartbeat_due = false;
            self.acks.ack_due = false;
            self.acks.ack_at = None;
            self.acks.unacked = 0;
            let said = (receipt.received, receipt.seen, receipt.marks.number);
            if said == self.acks.last_heartbeat {
                self.acks.heartbeats_alike += 1;
            } else {
                self.acks.last_heartbeat = said;
                self.acks.heartbeats_alike = 1;
            }
            self.acks.ticks_quiet = 0;
            return Some(Frame::Heartbeat(receipt));
        }
        if !self.acks.ack_due {
            return None;
        }
        self.acks.ack_due = false;
        self.acks.ack_at = None;
        self.acks.unacked = 0;
        if self.routing.link.is_some() && !self.marks_news_for_peer(local) {
            return Some(Frame::BareAck(self.acks.received));
        }
        Some(Frame::Ack(self.receipt(local)))
    }

    /// Our receipt for the peer: the last delta received, the peer's marks
    /// held, and our marks as a difference from those the peer reported
    /// holding (numbered anew if they changed since last sent).
    pub(super) fn receipt<L: LocalReplica>(&mut self, local: &L) -> Receipt {
        let marks = local.marks();
        let number = match self.marks.marks_sent.back() {
            Some((number, sent)) if *sent == marks => *number,
            latest => {
                let number = latest.map_or(1, |(number, _)| number + 1);
                self.marks.marks_sent.push_back((number, marks.clone()));
                if self.marks.marks_sent.len() > MARKS_HISTORY_MAX {
                    self.marks.marks_sent.pop_front();
                }
                number
            }
        };
        // The peer holds our hello's marks (number 1) before it reads any
        // receipt: it ignores every frame but a hello until it has one of
        // ours, and each carries those marks or later ones. So a peer that
        // reported none yet gets a difference from them, not the whole
        // vector (which repeated the hello: every stream, retired ones
        // included, twice a session).
        let seen = self.marks.peer_seen.max(1);
        let base = self.marks.marks_sent.iter().find(|(n, _)| *n == seen);
        let (base, changes) = match base {
            Some((base, base_marks)) => (*base, difference(&marks, base_marks)),
            // Those marks are no longer kept: the whole vector.
            None => (0, marks),
        };
        Receipt {
            received: self.acks.received,
            seen: self.marks.peer_marks_number,
            marks: MarksDiff {
                number,
                base,
                changes,
            },
        }
    }

    /// Whether the tick's heartbeat, carrying `receipt`, is left out: it
    /// says what the last [`IDLE_REPEATS`] heartbeats said (nothing
    /// received, no marks of the peer's, ours unchanged) and the peer
    /// holds our marks (no changes to carry), so it would tell the peer
    /// nothing but that we are alive. Then one goes every
    /// [`idle_ticks`] ticks, not every tick: half the bytes of a quiet
    /// link, and still several frames within the peer's read timeout.
    /// Anything new (a delta received, marks that moved either way, a
    /// repair) goes at the next tick as before, and starts the count over.
    fn idle_tick(&mut self, receipt: &Receipt) -> bool {
        let said = (receipt.received, receipt.seen, receipt.marks.number);
        let idle = said == self.acks.last_heartbeat
            && receipt.marks.base == receipt.marks.number
            && self.acks.heartbeats_alike >= IDLE_REPEATS;
        if !idle {
            return false;
        }
        self.acks.ticks_quiet += 1;
        self.acks.ticks_quiet < idle_ticks(&self.config)
    }

    /// Whether our marks hold news the peer pushes by: a stream it pushes
    /// to us (not asked quiet) that we hold further than its deltas
    /// carried and than the marks we last sent, because another session
    /// brought it first. Then an ack carries our marks, so the peer does
    /// not push what we hold; otherwise a bare ack tells it as much.
    pub(super) fn marks_news_for_peer<L: LocalReplica>(&self, local: &L) -> bool {
        let mut sent = self.marks.marks_sent.back().map(|(_, marks)| walk(marks));
        let mut carried = walk(&self.marks.carried);
        local.marks().iter().any(|(stream, seq)| {
            stream != self.local
                && seq > carried.at(stream)
                && sent.as_mut().is_none_or(|sent| seq > sent.at(stream))
                && !self.routing.quiet_asked.contains_key(&stream)
                && !self.routing.refused.contains(&stream)
                && !self.routing.behind.contains_key(&stream)
        })
    }

    /// A frame other than a hello or a delta: a receipt (ack, bare ack,
    /// heartbeat) or the peer's routes.
    pub(super) fn on_control(&mut self, now: Instant, frame: Frame) -> Result<(), ProtocolError> {
        match frame {
            Frame::Delta { .. } => unreachable!("a delta is handed in as columns"),
            Frame::Ack(receipt) => {
                self.on_receipt(now, receipt, true)?;
                self.routing.lag_check_due = true;
            }
            Frame::Heartbeat(receipt) => {
                self.on_receipt(now, receipt, false)?;
                self.routing.lag_check_due = true;
            }
            Frame::BareAck(received) => {
                // A receipt naming what we and the peer held before: only
                // the deltas it acknowledges are new.
                let receipt = Receipt {
                    received,
                    seen: self.marks.peer_seen,
                    marks: MarksDiff {
                        number: self.marks.peer_marks_number,
                        base: self.marks.peer_marks_number,
                        changes: VersionVector::new(),
                    },
                };
                self.on_receipt(now, receipt, true)?;
                self.routing.lag_check_due = true;
            }
            Frame::Routes(routes) => self.on_routes(routes),
            Frame::Hello(_)
            | Frame::Checkpoint(_)
            | Frame::CheckpointWant(_)
            | Frame::Statement(_)
            | Frame::HelloAgainst(_) => {
                unreachable!("handled by the driver")
            }
        }
        Ok(())
    }

    /// A receipt: learn the peer's marks, which of ours it holds, and which
    /// of our deltas arrived; then count as held only what it holds and
    /// what is still in flight, so what was lost is sent again (and what
    /// is in flight is not).
    ///
    /// An ack's marks may lag behind what the deltas it acknowledges
    /// carried (`marks_lag`): what they carried and the marks lack counts
    /// as pending at the peer, every acknowledged delta's, not only the
    /// last one's. A heartbeat's marks are current: an acknowledged delta
    /// before the last whose events they lack was lost.
    pub(super) fn on_receipt(
        &mut self,
        now: Instant,
        receipt: Receipt,
        marks_lag: bool,
    ) -> Result<(), ProtocolError> {
        self.check_receipt(&receipt)?;
        let Receipt {
            received,
            seen,
            marks,
        } = receipt;
        // Whatever we hold of the peer's marks from `base` on, joined with
        // the changes, is its marks `number`: marks only rise.
        self.marks.peer_marks.join(&marks.changes);
        self.marks.peer_marks_number = self.marks.peer_marks_number.max(marks.number);
        self.state.peer_marks.join(&marks.changes);
        if seen > self.marks.peer_seen {
            self.marks.peer_seen = seen;
            // Older marks are never a base again.
            while self
                .marks
                .marks_sent
                .front()
                .is_some_and(|(number, _)| *number < seen)
            {
                self.marks.marks_sent.pop_front();
            }
        }
        if received < self.send.acked {
            // A receipt overtaken by a later one: what it says of the
            // peer's marks is old, of our deltas older still.
            self.send.view.join(&self.marks.peer_marks);
            return Ok(());
        }
        self.send.acked = received;
        while self
            .send
            .in_flight
            .front()
            .is_some_and(|sent| sent.number <= received)
        {
            let sent = self.send.in_flight.pop_front().expect("checked above");
            if sent.number == received {
                self.rtt_sample(now.saturating_duration_since(sent.sent_at));
            }
            if sent.number == received || marks_lag {
                self.note_pending(now, &sent, marks_lag);
            }
        }
        self.forget_lost(now);
        Ok(())
    }

    /// Refuses a receipt that names marks or deltas this side never sent,
    /// or marks as a difference from marks it never reported holding.
    pub(super) fn check_receipt(&self, receipt: &Receipt) -> Result<(), ProtocolError> {
        let Receipt {
            received,
            seen,
            marks,
        } = receipt;
        if marks.base > self.marks.peer_marks_number {
            return Err(ProtocolError::Protocol {
                detail: format!(
                    "marks {} sent as a difference from marks {} this side never reported \
                     holding (it holds marks {})",
                    marks.number, marks.base, self.marks.peer_marks_number
                ),
            });
        }
        let latest_ours = self
            .marks
            .marks_sent
            .back()
            .map_or(0, |(number, _)| *number);
        if *seen > latest_ours {
            return Err(ProtocolError::Protocol {
                detail: format!("peer holds our marks {seen}; we sent up to {latest_ours}"),
            });
        }
        if *received >= self.send.next_delta_number {
            return Err(ProtocolError::Protocol {
                detail: format!(
                    "peer received delta {received}; we sent up to {}",
                    self.send.next_delta_number - 1
                ),
            });
        }
        Ok(())
    }

    /// An acknowledged delta arrived: what it carried and the peer's marks
    /// lack waits in its pending buffer, above a hole (or, after an ack, is
    /// held and not reported yet: the peer acks so only what it applied
    /// whole, and its marks come with its next heartbeat, or the one after
    /// if that one is lost).
    pub(super) fn note_pending(&mut self, now: Instant, sent: &InFlight, marks_lag: bool) {
        let mut expires = now + self.retransmit_timeout();
        if marks_lag {
            expires += tick_interval(&self.config);
        }
        for (stream, to) in sent.advance.iter() {
            let from = sent.first.get(stream);
            if from > 0 && self.marks.peer_marks.get(stream) < to {
                add_pending(
                    &mut self.send.peer_pending,
                    PendingRange {
                        stream,
                        from,
                        to,
                        expires,
                    },
                );
            }
        }
    }

    /// After a receipt: a delta sent two round trips before it arrived
    /// should have reached the peer before it sent the receipt: one the
    /// receipt does not cover was lost (the tail of a burst, or everything
    /// sent into a cut link), and is sent again now rather than at its
    /// retransmission timeout. Two round trips, or one and four deviations
    /// on a link whose round trips vary more (a delayed frame is not a lost
    /// one).
    pub(super) fn forget_lost(&mut self, now: Instant) {
        let rtt = self.timing.rtt.unwrap_or(2 * tick_interval(&self.config));
        let lost_after = (2 * rtt)
            .max(rtt + 4 * self.timing.rtt_var)
            .max(tick_interval(&self.config) / 8);
        self.send
            .in_flight
            .retain(|sent| now.saturating_duration_since(sent.sent_at) <= lost_after);
        self.send.peer_pending.retain(|range| range.expires > now);
        self.recompute_view();
    }

    /// Reports how applying the delta last handed back went. A refused
    /// delta ends the session ([`ProtocolError::Refused`] for what the peer
    /// did wrong, [`ProtocolError::Limit`] for a local limit it exceeds,
    /// [`ProtocolError::Replica`] for our own store failing), but one
    /// refused for a stream it froze at a fork (`forks`: the stream is
    /// refused for the session, the rest sent again); one that changed
    /// our log makes an ack due.
    pub fn handle_applied(
        &mut self,
        now: Instant,
        applied: Result<ApplyReport, ReplicaError>,
    ) -> Result<(), ProtocolError> {
        if let Some(offered) = self.acks.applying_statement.take() {
            return self.statement_applied(offered, applied);
        }
        let number = self.acks.applying.take();
        let peer = self.hello.peer.unwrap_or(self.local);
        let report = match applied {
            Ok(report) => report,
            Err(source) if self.refused_at_fork(&source) => {
                self.timing.last_frame_at = now;
                return Ok(());
            }
            Err(source) => return Err(refusal(peer, source)),
        };
        // Time spent committing what the peer sent is not its silence.
        self.timing.last_frame_at = now;
        // Acked whether or not it changed our log: the ack is how the
        // peer learns the delta arrived (and, by what our marks lack, what
        // was lost before it).
        if let Some(number) = number {
            self.acks.received = self.acks.received.max(number);
            self.acks.unacked += 1;
            // At once when there is something to repair (a gap in the
            // numbers, events held above a hole or dropped): a receipt
            // with our current marks, which shows the sender what is
            // missing (a heartbeat's kind: an ack's marks may lag). At
            // once too for a window's worth to acknowledge; else once per
            // `ack_delay`, for the whole burst.
            let repair = self.acks.hole_seen || report.pending > 0 || report.dropped > 0;
            self.acks.hole_seen = false;
            if repair {
                self.acks.heartbeat_due = true;
            } else if self.acks.unacked >= ACK_EVERY || self.config.ack_delay.is_zero() {
                self.acks.ack_due = true;
                self.acks.ack_at = None;
            } else if self.acks.ack_at.is_none() {
                self.acks.ack_at = Some(now + self.config.ack_delay);
            }
        }
        self.state.events_applied += report.applied;
        self.state.events_duplicate += report.duplicates;
        self.state_changed = true;
        if !report.behind_floor.is_empty() {
            self.note_behind(&report);
        }
        Ok(())
    }
}

/// A heartbeat is sent at every tick until this many in a row said the
/// same (so one lost, or two, are repeated a tick later as before); after
/// them, every [`idle_ticks`] ticks.
pub(super) const IDLE_REPEATS: u32 = 3;

/// The most ticks between two idle heartbeats.
pub(super) const IDLE_TICKS_MAX: u32 = 2;

/// The ticks between two idle heartbeats: [`IDLE_TICKS_MAX`] when the read
/// timeout holds five such gaps (ten ticks: the default, and
/// `SessionConfig::with_heartbeat`'s), else every tick. The peer's read
/// timeout is taken to be like ours (a mesh's sessions share their
/// settings; an older peer's default is ten ticks of its own): a quiet
/// link then survives four lost heartbeats in a row, where it survived
/// nine.
pub(super) fn idle_ticks(config: &crate::SessionConfig) -> u32 {
    let tick = tick_interval(config);
    if config.read_timeout >= tick * (5 * IDLE_TICKS_MAX) {
        IDLE_TICKS_MAX
    } else {
        1
    }
}

/// A receiver acknowledges at least every this many deltas, however short
/// they come: well within [`IN_FLIGHT_MAX`], so a sender never waits on a
/// delayed ack to send more.
pub(super) const ACK_EVERY: u32 = 8;

/// The most numbered marks kept for differences: the latest and those the
/// peer may still report holding. Past it the oldest goes, and a peer
/// reporting it gets the whole vector once.
pub(super) const MARKS_HISTORY_MAX: usize = 32;

/// Every stream of `marks` whose seq is above its seq in `base`, with its
/// seq in `marks`.
pub(super) fn difference(marks: &VersionVector, base: &VersionVector) -> VersionVector {
    let mut base = walk(base);
    marks
        .iter()
        .filter(|&(stream, seq)| seq > base.at(stream))
        .collect()
}
