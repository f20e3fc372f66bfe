//! Publishing: performing a committed plan on the state, operation by
//! operation in the plan's order, then the counters. Cannot fail: every
//! check was made when validating and planning; what publishing asserts
//! is that it agrees with the plan, which only a bug breaks.

use std::collections::BTreeMap;
use std::sync::PoisonError;

use meshlog_cursor::StreamId;

use super::held::{LazyDigest, State};
use super::plan::{Op, Plan, Planned, Source};
use crate::store::{BatchPart, StoreView};
use crate::{Digest, Event};

impl State {
    /// Performs a committed plan, with the store's view of the commit.
    pub(crate) fn publish(&mut self, plan: &Plan<'_>, view: Option<StoreView>) {
        // A store that records the digest hands it over with its view, so
        // the events a compaction drops need not be read to subtract them.
        let recorded = view.as_ref().and_then(|view| view.digest);
        self.publish_forks(&plan.batch);
        let mut touched: Vec<StreamId> = Vec::new();
        for op in &plan.ops {
            match *op {
                Op::Floor { stream, floor_seq } => {
                    self.publish_floor(stream, floor_seq, recorded);
                    touched.push(stream);
                }
                Op::Events { run, source, .. } => {
                    let stream = self.publish_events(plan, run, source, recorded);
                    if touched.last() != Some(&stream) {
                        touched.push(stream);
                    }
                }
                Op::Hold(ref event) => {
                    assert!(self.log.hold_early(event), "a held-back event was new");
                    self.pending_len += 1;
                }
                Op::Moved => {}
            }
        }
        self.clock = self.clock.max(plan.batch.clock);
        self.publish_chains(&plan.batch);
        self.publish_seals(&plan.batch);
        self.publish_statements(&plan.batch.statements);
        if let Some(view) = view {
            self.log.set_view(view);
        }
        if let Some(sum) = recorded {
            *self.lazy_digest() = LazyDigest {
                sum,
                unhashed: BTreeMap::new(),
            };
        }
        touched.sort_unstable();
        touched.dedup();
        for stream in touched {
            self.marks.advance(stream, self.log.head(stream));
        }
        self.count(plan);
        self.assert_agrees(plan);
    }

    /// Raises `stream`'s floor: the held events below it leave the log
    /// (and the digest's sum, unless the store records the digest), the
    /// pending ones are discarded.
    fn publish_floor(&mut self, stream: StreamId, floor_seq: u64, recorded: Option<Digest>) {
        let lazy = self
            .digest
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        // Only what was summed is taken out of the sum; the events not
        // summed yet that the floor drops are gone.
        let unhashed_from = lazy.unhashed.get(&stream).copied();
        let sum = &mut lazy.sum;
        let mut remove = |event: Event| {
            if unhashed_from.is_none_or(|from| event.seq < from) {
                sum.remove(&event);
            }
        };
        let dropped: Option<&mut dyn FnMut(Event)> = match recorded {
            Some(_) => None,
            None => Some(&mut remove),
        };
        let discarded = self
            .log
            .raise_floor(stream, floor_seq, dropped)
            .expect("the own copy of the events never fails a read");
        let head = self.log.head(stream);
        let lazy = self.lazy_digest();
        if let Some(from) = lazy.unhashed.get_mut(&stream) {
            *from = (*from).max(floor_seq.saturating_add(1));
            if *from > head {
                lazy.unhashed.remove(&stream);
            }
        }
        self.pending_len -= discarded;
        self.floor.advance(stream, floor_seq);
    }

    /// Holds the batch's run `run` from its stream's head; answers the
    /// stream.
    fn publish_events(
        &mut self,
        plan: &Plan<'_>,
        run: usize,
        source: Source,
        recorded: Option<Digest>,
    ) -> StreamId {
        let (stream, first_seq, len, last_lamport, was_early) = match plan.batch.part(run) {
            BatchPart::Events(run) => {
                let len = run.len();
                let was_early = self.log.push_run(run);
                // Stamps rise with seq: the run's last is its highest.
                let last = &run[len - 1];
                (run[0].stream, run[0].seq, len, last.lamport, was_early)
            }
            BatchPart::Columns(run) => {
                let was_early = self.log.push_columns(run);
                let last = run.last_lamport();
                (run.stream, run.first_seq, run.len(), last, was_early)
            }
        };
        match source {
            Source::Released => assert_eq!(was_early, len, "a released event was pending"),
            Source::Received => assert_eq!(was_early, 0, "a received event was not pending"),
            Source::Appended => self.stats.appended += len as u64,
        }
        self.pending_len -= was_early;
        // A store that records the digest has added the events already:
        // its digest replaces this one. Else they are summed when the
        // digest is asked for.
        if recorded.is_none() {
            self.lazy_digest()
                .unhashed
                .entry(stream)
                .or_insert(first_seq);
        }
        self.clock = self.clock.max(last_lamport);
        stream
    }

    /// Counts what the plan's requests did (appends are counted as their
    /// events are held).
    fn count(&mut self, plan: &Plan<'_>) {
        for planned in &plan.planned {
            match planned {
                Planned::Applied(report) => {
                    self.stats.applied += report.applied;
                    self.stats.duplicates += report.duplicates;
                    self.stats.pending_dropped += report.dropped;
                    self.stats.behind_floor += report.behind_floor.len() as u64;
                }
                Planned::Refused(_) => self.stats.deltas_refused += 1,
                Planned::Appended(_) => {}
            }
        }
    }

    /// Pair assertions: the state published is the one planned.
    fn assert_agrees(&self, plan: &Plan<'_>) {
        assert_eq!(
            self.pending_len, plan.pending_len_after,
            "publishing agrees with the plan on the pending buffer"
        );
        for &(stream, head) in &plan.heads_after {
            assert_eq!(
                self.log.head(stream),
                head,
                "publishing agrees with the plan on stream {stream}'s head"
            );
        }
    }
}
