//! [`sync_once`] at the time of the call: the core's
//! [`meshlog_sync_core::sync_once`] takes the time as an argument, since
//! the core reads no clock; this reads it, and answers the driver's error.

use std::time::Instant;

use meshlog_replica::Store;
use meshlog_sync_core::{SessionConfig, SyncReport};

use crate::{SessionError, SharedReplica};

/// Runs one exchange between two replicas in memory, to quiescence, now
/// (see [`meshlog_sync_core::sync_once`]): each side sends its hello, then
/// each sends the other what it misses and acks what it applied, turn by
/// turn, until neither has anything left to send. No heartbeat is sent.
///
/// ```
/// use meshlog_cursor::StreamId;
/// use meshlog_sync::{sync_once, SessionConfig, SharedReplica};
///
/// let a = SharedReplica::in_memory(StreamId::new(1));
/// let b = SharedReplica::in_memory(StreamId::new(2));
/// a.append(&b"from a"[..])?;
/// b.append(&b"from b"[..])?;
/// let report = sync_once(&a, &b, &SessionConfig::default())?;
/// assert!(report.quiescent);
/// assert_eq!(a.digest(), b.digest());
/// assert_eq!(report.a.events_sent, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// Why the protocol core ended the exchange (a refused delta, a store
/// failure), as a [`SessionError`].
pub fn sync_once<A, B>(
    a: &SharedReplica<A>,
    b: &SharedReplica<B>,
    config: &SessionConfig,
) -> Result<SyncReport, SessionError>
where
    A: Store + Send + Sync + 'static,
    B: Store + Send + Sync + 'static,
{
    Ok(meshlog_sync_core::sync_once(Instant::now(), a, b, config)?)
}
