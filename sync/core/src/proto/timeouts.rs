//! Timeouts: the tick (heartbeats, a hello re-sent), the read timeouts,
//! round trips and the retransmission timeout that counts a delta lost.

use std::time::{Duration, Instant};

use crate::{ProtocolError, SessionConfig};

use super::state::Protocol;

impl Protocol {
    /// Serves the tick if `now` reached it: times out a silent peer, and
    /// makes a hello (until the peer has ours) and a heartbeat due.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ProtocolError> {
        if self.acks.ack_at.is_some_and(|at| at <= now) {
            self.acks.ack_at = None;
            self.acks.ack_due = true;
        }
        if self.send.hold_until.is_some_and(|at| at <= now) {
            self.send.hold_until = None;
        }
        if now < self.timing.next_tick {
            return Ok(());
        }
        self.timing.next_tick = now + tick_interval(&self.config);
        if self.hello.peer.is_none() && now - self.timing.started_at > self.config.read_timeout {
            return Err(ProtocolError::ReadTimeout {
                what: "hello",
                idle: now - self.timing.started_at,
            });
        }
        if now - self.timing.last_frame_at > self.config.read_timeout {
            return Err(ProtocolError::ReadTimeout {
                what: "frame",
                idle: now - self.timing.last_frame_at,
            });
        }
        self.hello.hello_due |= !self.hello.peer_has_our_hello;
        self.ask_again_for_hello_base();
        self.acks.tick_due |= self.hello.peer.is_some();
        self.routing.lag_check_due = true;
        // A delta unacknowledged past its timeout is lost (the tail of a
        // burst: no later delta's ack shows the hole): count it as missing
        // again, so what the peer lacks of it is sent again.
        let rto = self.retransmit_timeout();
        let pending_before = self.send.peer_pending.len();
        self.send.peer_pending.retain(|range| range.expires > now);
        if self.send.peer_pending.len() != pending_before {
            // Still not in the peer's marks: dropped from its pending
            // buffer, or the hole below stays open. Sent again.
            self.recompute_view();
        }
        let before = self.send.in_flight.len();
        self.send
            .in_flight
            .retain(|sent| now.saturating_duration_since(sent.sent_at) < rto);
        if self.send.in_flight.len() != before {
            self.timing.rto_backoff = (self.timing.rto_backoff + 1).min(RTO_BACKOFF_MAX);
            tracing::debug!(
                lost = before - self.send.in_flight.len(),
                ?rto,
                "delta frames unacknowledged past the retransmission timeout"
            );
            self.recompute_view();
        }
        Ok(())
    }

    /// How long a delta may go unacknowledged before it counts as lost: a
    /// heartbeat interval (the peer's receipt comes at least that often)
    /// plus two smoothed round trips (two ticks before any estimate),
    /// doubled for each timeout in a row.
    pub(super) fn retransmit_timeout(&self) -> Duration {
        let interval = tick_interval(&self.config);
        let rto = interval + 2 * self.timing.rtt.unwrap_or(2 * interval);
        rto * (1 << self.timing.rto_backoff)
    }

    /// A round trip measured from a delta to its ack: smoothed, with its
    /// deviation, as TCP keeps them; the retransmission backoff starts over.
    pub(super) fn rtt_sample(&mut self, sample: Duration) {
        self.timing.rtt_var = match self.timing.rtt {
            Some(rtt) if !self.timing.rtt_from_hello => {
                (self.timing.rtt_var * 3 + rtt.abs_diff(sample)) / 4
            }
            _ => sample / 2,
        };
        self.timing.rtt = Some(match self.timing.rtt {
            Some(rtt) if !self.timing.rtt_from_hello => (rtt * 7 + sample) / 8,
            _ => sample,
        });
        self.timing.rtt_from_hello = false;
        self.timing.rto_backoff = 0;
    }

    /// The peer sent something other than a hello, so it has ours: our
    /// first hello went out when we started, a first estimate of the round
    /// trip, until an ack measures it.
    pub(super) fn rtt_from_hello(&mut self, now: Instant) {
        if self.timing.rtt.is_none() {
            let sample = now.saturating_duration_since(self.timing.started_at);
            self.timing.rtt = Some(sample);
            self.timing.rtt_var = sample / 2;
            self.timing.rtt_from_hello = true;
        }
    }
}

/// The tick: the heartbeat interval, at least 1 ms.
pub(super) fn tick_interval(config: &SessionConfig) -> Duration {
    config.heartbeat_interval.max(Duration::from_millis(1))
}

/// The most doublings of the retransmission timeout.
pub(super) const RTO_BACKOFF_MAX: u32 = 3;
