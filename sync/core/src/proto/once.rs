//! [`sync_once`]: one exchange between two replicas in memory, to
//! quiescence, at a time the caller gives; and [`hand_in`], its
//! synchronous step.

use std::time::{Duration, Instant};

use meshlog_replica::SharedReplica;
use meshlog_replica::Store;

use crate::frame::{self};
use crate::{ProtocolError, SessionConfig, SessionState};

use super::state::{Protocol, Received};

/// What one [`sync_once`] exchange did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// The first replica's side: frames, bytes and events it sent and
    /// received, the peer marks it learned.
    pub a: SessionState,
    /// The second replica's side.
    pub b: SessionState,
    /// Flights: times frames crossed, one way or the other, until neither
    /// side had anything to send (a round trip is two).
    pub flights: u32,
    /// Whether the exchange reached quiescence (false only if it hit the
    /// flight limit, which a correct exchange never does).
    pub quiescent: bool,
}

/// The most flights [`sync_once`] makes before it gives up.
pub(super) const SYNC_ONCE_FLIGHTS_MAX: u32 = 100_000;

/// Runs one exchange between two replicas in memory, to quiescence: each
/// side sends its hello, then each sends the other what it misses and acks
/// what it applied, turn by turn, until neither has anything left to send.
/// Frames go through the codec (so bytes are counted as on a wire); the
/// whole exchange happens at `now` (no clock runs), so no heartbeat is
/// sent. `meshlog_sync::sync_once` is this at the time of the call.
///
/// For tests, benchmarks and request/response transports: the rules are
/// those of a session (`meshlog_sync::Session`), without a task or a
/// stream.
///
/// ```
/// use std::time::Instant;
/// use meshlog_cursor::StreamId;
/// use meshlog_replica::SharedReplica;
/// use meshlog_sync_core::{sync_once, SessionConfig};
///
/// let a = SharedReplica::in_memory(StreamId::new(1));
/// let b = SharedReplica::in_memory(StreamId::new(2));
/// a.append(&b"from a"[..])?;
/// b.append(&b"from b"[..])?;
/// let report = sync_once(Instant::now(), &a, &b, &SessionConfig::default())?;
/// assert!(report.quiescent);
/// assert_eq!(a.digest(), b.digest());
/// assert_eq!(report.a.events_sent, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn sync_once<A, B>(
    now: Instant,
    a: &SharedReplica<A>,
    b: &SharedReplica<B>,
    config: &SessionConfig,
) -> Result<SyncReport, ProtocolError>
where
    A: Store + Send + Sync + 'static,
    B: Store + Send + Sync + 'static,
{
    // No clock runs here, so no ack or delta waits for one.
    let config = SessionConfig {
        ack_delay: Duration::ZERO,
        send_delay: Duration::ZERO,
        ..config.clone()
    };
    let mut a_side = Protocol::new(a.stream(), config.clone(), now);
    let mut b_side = Protocol::new(b.stream(), config, now);
    let mut flights = 0;
    let mut a_turn = true;
    let mut idle_turns = 0;
    while idle_turns < 2 {
        if flights >= SYNC_ONCE_FLIGHTS_MAX {
            return Ok(SyncReport {
                a: a_side.state.clone(),
                b: b_side.state.clone(),
                flights,
                quiescent: false,
            });
        }
        let moved = if a_turn {
            flight(now, &mut a_side, a, &mut b_side, b)?
        } else {
            flight(now, &mut b_side, b, &mut a_side, a)?
        };
        a_turn = !a_turn;
        if moved {
            flights += 1;
            idle_turns = 0;
        } else {
            idle_turns += 1;
        }
    }
    Ok(SyncReport {
        a: a_side.state.clone(),
        b: b_side.state.clone(),
        flights,
        quiescent: true,
    })
}

/// Everything `from` has to send, carried to `to` and handled there;
/// whether anything was sent.
pub(super) fn flight<F, T>(
    now: Instant,
    from: &mut Protocol,
    from_replica: &SharedReplica<F>,
    to: &mut Protocol,
    to_replica: &SharedReplica<T>,
) -> Result<bool, ProtocolError>
where
    F: Store + Send + Sync + 'static,
    T: Store + Send + Sync + 'static,
{
    let mut sent = Vec::new();
    while let Some(bytes) = from.poll_transmit(now, from_replica)? {
        sent.push(bytes);
    }
    for bytes in &sent {
        hand_in(now, to, &bytes[frame::LENGTH_PREFIX_BYTES..], to_replica)?;
    }
    Ok(!sent.is_empty())
}

/// Hands `core` one received payload and, if it carries a delta, applies
/// it to `replica` at once and reports the outcome: the synchronous step of
/// a driver whose replica commits on the caller's thread ([`sync_once`],
/// and tests that drive two cores by hand, through
/// `meshlog_sync::testkit::hand_in`).
pub fn hand_in<S: Store + Send + Sync + 'static>(
    now: Instant,
    core: &mut Protocol,
    payload: &[u8],
    replica: &SharedReplica<S>,
) -> Result<(), ProtocolError> {
    match core.handle_payload(now, payload, replica)? {
        Received::Apply(columns) => {
            let applied = replica.apply_columns(columns);
            core.handle_applied(now, applied)?;
        }
        Received::Checkpoint(checkpoint) => {
            replica
                .keep_checkpoint(checkpoint)
                .map_err(ProtocolError::Replica)?;
        }
        Received::Nothing => {}
    }
    Ok(())
}
