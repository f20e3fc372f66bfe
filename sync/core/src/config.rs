//! [`SessionConfig`]: a session's timing and limits, read by the protocol
//! core (timers, delta and frame sizes) and by its drivers (the write
//! timeout and the output buffer's bound, which only a driver that owns a
//! buffer and a socket can enforce).

use std::time::Duration;

use crate::frame::{
    FRAME_BYTES_CEILING, FRAME_BYTES_MAX, HELLO_SKIPS_UNKNOWN_KINDS, HELLO_TAKES_HELLO_AGAINST,
};
// Named by the docs only.
#[cfg(doc)]
use crate::frame::DELTA_EVENTS_MAX;

/// A session's timing and limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// How often a session sends a heartbeat with its marks (the periodic
    /// re-exchange that repairs lost frames), re-sends an unanswered hello,
    /// and checks its timeouts. Default 1 s. On a quiet link (three
    /// heartbeats in a row said the same, and the peer holds our marks)
    /// heartbeats go every other tick, when
    /// [`SessionConfig::read_timeout`] is at least ten ticks.
    pub heartbeat_interval: Duration,
    /// A session that receives no frame for this long (or no hello) ends
    /// with [`ProtocolError::ReadTimeout`](crate::ProtocolError::ReadTimeout).
    /// Default 10 s; keep it several heartbeat intervals long so a few lost
    /// heartbeats are survived.
    pub read_timeout: Duration,
    /// A session whose queued output (or a flush) makes no progress for
    /// this long ends with `meshlog_sync::SessionError::WriteTimeout`: read
    /// by the driver, which owns the output buffer (the core writes
    /// nothing). Default 10 s.
    pub write_timeout: Duration,
    /// The byte budget of one delta, by [`meshlog_replica::Event::size_hint`]
    /// (a delta holds at least one event whatever its size). Default 256 KiB;
    /// capped so that a frame stays below [`FRAME_BYTES_MAX`]. A delta of
    /// more than [`DELTA_EVENTS_MAX`] events (small events under a budget
    /// above 400 KiB) is sent as several frames.
    pub delta_bytes_max: usize,
    /// No new delta, ack or heartbeat is queued while this many bytes wait to
    /// be written: the bound on a session's output buffer (plus one frame and
    /// a hello), and the backpressure a slow peer exerts. Default 512 KiB.
    pub queue_bytes_max: usize,
    /// The largest frame payload this side takes, in bytes, announced in
    /// its hello; each side sends frames up to the smaller of both sides'
    /// limits. Default (and floor) [`FRAME_BYTES_MAX`], 4 MiB: events of
    /// payloads up to 3,866,401 bytes always fit. Raise it on both sides
    /// of a link to sync larger events (each session may buffer one frame
    /// of this size); at most [`FRAME_BYTES_CEILING`].
    pub frame_bytes_max: usize,
    /// How long an ack may wait for more deltas to acknowledge with it.
    /// Default 20 ms: a burst of deltas is acknowledged once (and at
    /// least every 8 deltas), where each used to get its own receipt
    /// carrying the marks it changed. A gap in the delta numbers, or events
    /// held above a hole, is acknowledged at once, so repair is not
    /// delayed. Zero acknowledges every delta at once.
    pub ack_delay: Duration,
    /// How long new events may wait while a delta to the peer is in
    /// flight (sent, not yet acknowledged), counted from that delta's
    /// sending, so that one delta carries what accumulates meanwhile
    /// instead of one small delta each (Nagle's rule). Default 40 ms. A
    /// delta goes at once when nothing is in flight (the first after a
    /// quiet period, a reconnect or a receipt that retired the rest), when
    /// the delta before it filled half the budget (a backlog drains at the
    /// link's pace), and when this has passed: so the wait is bounded
    /// whatever the peer's [`SessionConfig::ack_delay`]. Zero sends every
    /// change at once.
    pub send_delay: Duration,
    /// Whether this session gossips checkpoints (`docs/TOKEN.md`,
    /// "Version 2"; `docs/PROTOCOL.md`, "Checkpoints"): sends the peer
    /// every checkpoint the replica keeps and the peer lacks, answers its
    /// asks, and hands the checkpoints it receives to the replica to keep.
    /// Default on, and then only with a peer whose hello says it skips
    /// frame kinds it does not know
    /// ([`Hello::skips_unknown_kinds`](crate::frame::Hello::skips_unknown_kinds)):
    /// a peer of protocol 4 built before that ends the session on a
    /// checkpoint frame, so it gets none. A session with it off still
    /// takes the checkpoints a peer sends.
    pub checkpoints: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            heartbeat_interval: Duration::from_secs(1),
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            delta_bytes_max: 256 * 1024,
            queue_bytes_max: 512 * 1024,
            frame_bytes_max: FRAME_BYTES_MAX,
            ack_delay: Duration::from_millis(20),
            send_delay: Duration::from_millis(40),
            checkpoints: true,
        }
    }
}

impl SessionConfig {
    /// Defaults scaled to a heartbeat interval: read and write timeouts of
    /// ten intervals, an ack delay of a fiftieth (at most 20 ms) and a send
    /// delay of a twenty-fifth (at most 40 ms). Tests use short intervals
    /// (10 to 50 ms).
    pub fn with_heartbeat(heartbeat_interval: Duration) -> Self {
        SessionConfig {
            heartbeat_interval,
            read_timeout: heartbeat_interval * 10,
            write_timeout: heartbeat_interval * 10,
            // 20 ms at the default 1 s heartbeat, a fiftieth of shorter ones.
            ack_delay: (heartbeat_interval / 50).min(Duration::from_millis(20)),
            send_delay: (heartbeat_interval / 25).min(Duration::from_millis(40)),
            ..SessionConfig::default()
        }
    }

    /// The largest delta budget that keeps every frame below the limit:
    /// room is left for a floor vector of the most streams a vector holds
    /// and for one event of the largest payload a replica accepts.
    pub fn delta_budget(&self) -> usize {
        self.delta_bytes_max.clamp(1, FRAME_BYTES_MAX / 2)
    }

    /// [`SessionConfig::frame_bytes_max`] within its bounds: the most
    /// this side sends (to a peer that takes as much).
    pub fn frame_limit(&self) -> usize {
        self.frame_bytes_max
            .clamp(FRAME_BYTES_MAX, FRAME_BYTES_CEILING)
    }

    /// What this side announces in its hello and reads: its
    /// [`SessionConfig::frame_limit`] with the hello's flag bit set
    /// ([`HELLO_SKIPS_UNKNOWN_KINDS`]), so one byte more when the limit is
    /// even: a peer built before the flag reads it as the limit, and may
    /// send a frame that large.
    ///
    /// With [`SessionConfig::checkpoints`] on, its second-lowest bit too
    /// ([`HELLO_TAKES_HELLO_AGAINST`]): this side reads a hello against a
    /// checkpoint.
    pub fn receive_limit(&self) -> usize {
        let against = if self.checkpoints {
            HELLO_TAKES_HELLO_AGAINST as usize
        } else {
            0
        };
        self.frame_limit() | HELLO_SKIPS_UNKNOWN_KINDS as usize | against
    }
}
