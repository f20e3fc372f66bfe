//! `RetentionPolicy`: which floor to compact to.

use meshlog_cursor::VersionVector;

use crate::{Replica, Store};

/// Picks the floor a replica may compact to. An event is kept while it is
/// among the last `keep_last` of its stream **or** younger than `keep_ms`;
/// a rule left `None` keeps nothing by itself, and with both `None` nothing
/// is dropped. By default the floor never passes what the known peers have
/// acknowledged, so no peer is made to miss an event it has not received.
///
/// ```
/// use meshlog_cursor::StreamId;
/// use meshlog_replica::{Replica, RetentionPolicy};
/// let mut replica = Replica::new(StreamId::new(1));
/// for i in 0..10u8 {
///     replica.append_at(vec![i], 1_000)?;
/// }
/// let policy = RetentionPolicy { keep_last: Some(3), ..RetentionPolicy::default() };
/// // A peer has acknowledged seqs up to 5 only: compaction stops there.
/// let peer = replica.marks().iter().map(|(s, _)| (s, 5)).collect();
/// let floor = policy.floor(&replica, 2_000, &[peer]);
/// assert_eq!(floor.get(StreamId::new(1)), 5);
/// replica.compact(&floor)?;
/// assert_eq!(replica.floor().get(StreamId::new(1)), 5);
/// # Ok::<(), meshlog_replica::ReplicaError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Keep at least this many of each stream's newest events.
    pub keep_last: Option<u64>,
    /// Keep events whose `time_ms` is within this many milliseconds of now.
    pub keep_ms: Option<u64>,
    /// Compact past what known peers have acknowledged (off by default).
    pub ignore_peers: bool,
}

impl RetentionPolicy {
    /// The floor this policy allows on `replica` at `now_ms`, given the marks
    /// each known peer has acknowledged. Never below the current floor.
    pub fn floor<S: Store>(
        &self,
        replica: &Replica<S>,
        now_ms: u64,
        peer_marks: &[VersionVector],
    ) -> VersionVector {
        self.floor_of(&replica.state, now_ms, peer_marks)
    }

    pub(crate) fn floor_of(
        &self,
        state: &crate::state::State,
        now_ms: u64,
        peer_marks: &[VersionVector],
    ) -> VersionVector {
        let mut floor = state.floor().clone();
        if self.keep_last.is_none() && self.keep_ms.is_none() {
            return floor;
        }
        let cutoff_ms = self.keep_ms.map(|keep_ms| now_ms.saturating_sub(keep_ms));
        for (stream, head) in state.marks().iter() {
            let by_count = self.keep_last.map(|keep| head.saturating_sub(keep));
            // Events are in seq order; wall clocks can step back, so stop at
            // the first young event rather than skip over it.
            // A failed read (a damaged store) compacts nothing by time.
            let by_time = cutoff_ms.map(|cutoff| match state.held_times(stream) {
                Ok(times) => times
                    .into_iter()
                    .take_while(|&(_, time_ms)| time_ms < cutoff)
                    .last()
                    .map_or(0, |(seq, _)| seq),
                Err(error) => {
                    tracing::error!(%stream, %error, "reading the log failed");
                    0
                }
            });
            let mut candidate = match (by_count, by_time) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => 0,
            };
            if !self.ignore_peers {
                for marks in peer_marks {
                    candidate = candidate.min(marks.get(stream));
                }
            }
            floor.advance(stream, candidate);
        }
        floor
    }
}
