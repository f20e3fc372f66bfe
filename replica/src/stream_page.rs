//! One writer's page: the events of one stream after a cursor, the
//! cursor's other entries carried unchanged, so one token serves a reader
//! of one writer and a reader of the whole log alike.
//!
//! Added beside `state` (issue 25) so the node's `?stream=` read is one
//! replica operation under one read of the state: the floor is checked
//! once, on the caller's cursor, and no stream can appear between reading
//! the marks and paging.

use meshlog_cursor::{StreamId, VersionVector};

use crate::state::State;
use crate::{Page, PageError, Replica, Store};

impl State {
    pub(crate) fn page_stream(
        &self,
        stream: StreamId,
        after: &VersionVector,
        limit: usize,
    ) -> Result<Page, PageError> {
        let max = self.config().page_len_max;
        if limit > max {
            return Err(PageError::LimitTooLarge { limit, max });
        }
        // Only `stream` can be stale: the answer names it alone, and its
        // `resume` is `after` with `stream` raised to its floor.
        let floor: VersionVector = [(stream, self.floor().get(stream))].into_iter().collect();
        after.check_floor(&floor)?;
        // Every other stream held or compacted here covered at `u64::MAX`:
        // the walk skips covered streams (O(S + limit · log S)).
        let mut masked = after.clone();
        for (other, _) in self.marks().iter().chain(self.floor().iter()) {
            if other != stream {
                masked.advance(other, u64::MAX);
            }
        }
        let page = self.page_untokened(&masked, limit)?;
        debug_assert!(page.events.iter().all(|event| event.stream == stream));
        let mut next = after.clone();
        if let Some(last) = page.events.last() {
            next.advance(stream, last.seq);
        }
        let token = self.checkpoints.token(&next)?;
        Ok(Page {
            events: page.events,
            next,
            token,
            at_head: page.at_head,
        })
    }
}

impl<S: Store> Replica<S> {
    /// Up to `limit` events of `stream` alone after `after`, in seq order,
    /// and the next cursor: `after` with only `stream`'s entry advanced
    /// (every other entry is carried unchanged). `at_head` says whether
    /// `next` covers every event of `stream` held here.
    ///
    /// A cursor is stale only in `stream`: [`PageError::Stale`] names that
    /// stream alone, and its `resume` is `after` with `stream` raised to
    /// its floor. Costs what [`Replica::page`] costs.
    ///
    /// ```
    /// use meshlog_cursor::{StreamId, VersionVector};
    /// use meshlog_replica::Replica;
    ///
    /// let mut replica = Replica::new(StreamId::new(1));
    /// replica.append(&b"a"[..])?;
    /// let after: VersionVector = [(StreamId::new(9), 4)].into_iter().collect();
    /// let page = replica.page_stream(StreamId::new(1), &after, 10)?;
    /// assert_eq!(page.events.len(), 1);
    /// // Stream 9's entry is carried, stream 1's advanced.
    /// assert_eq!(page.next.get(StreamId::new(9)), 4);
    /// assert_eq!(page.next.get(StreamId::new(1)), 1);
    /// assert!(page.at_head);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn page_stream(
        &self,
        stream: StreamId,
        after: &VersionVector,
        limit: usize,
    ) -> Result<Page, PageError> {
        let _span = tracing::trace_span!("page_stream", limit).entered();
        self.state.page_stream(stream, after, limit)
    }
}
