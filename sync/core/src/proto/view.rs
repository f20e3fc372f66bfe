//! The peer view: what the peer is believed to hold (its marks, what it
//! sent, what is in flight to it, what it holds pending above a hole),
//! which every delta is computed from.

use std::collections::BTreeMap;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::DeltaColumns;

use super::state::{PendingRange, Protocol};

impl Protocol {
    /// The view deltas are built from: the view, with every stream the
    /// peer asked quiet counted as held up to our marks.
    pub(super) fn send_view(&self, marks: &VersionVector) -> std::borrow::Cow<'_, VersionVector> {
        let own = self.hello.peer.filter(|&peer| {
            self.hello.peer_holds_own_stream && self.send.view.get(peer) < marks.get(peer)
        });
        if self.routing.peer_quiet.is_empty() && own.is_none() && self.send.unsendable.is_empty() {
            return std::borrow::Cow::Borrowed(&self.send.view);
        }
        let mut view = self.send.view.clone();
        for &stream in self.send.unsendable.keys() {
            view.advance(stream, marks.get(stream));
        }
        if let Some(peer) = own {
            view.advance(peer, marks.get(peer));
        }
        for &stream in &self.routing.peer_quiet {
            view.advance(stream, marks.get(stream));
        }
        std::borrow::Cow::Owned(view)
    }

    /// Whether the send view covers `marks`: what
    /// `send_view(marks).dominates(marks)` says, without building the view
    /// or looking each stream up: one walk of `marks`, the view and the
    /// streams asked quiet together (each ascending), no allocation. What
    /// every poll asks (is there a delta to send?), so its cost is per
    /// poll, not per delta.
    pub(super) fn send_view_covers(&self, marks: &VersionVector) -> bool {
        let own = self.hello.peer.filter(|_| self.hello.peer_holds_own_stream);
        let mut view = self.send.view.iter().peekable();
        let mut quiet = self.routing.peer_quiet.iter().peekable();
        let covers = marks.iter().all(|(stream, seq)| {
            while view.next_if(|&(held, _)| held < stream).is_some() {}
            while quiet.next_if(|&&asked| asked < stream).is_some() {}
            let held = view.peek().filter(|&&(held, _)| held == stream);
            held.is_some_and(|&(_, held_seq)| held_seq >= seq)
                || quiet.peek() == Some(&&stream)
                || own == Some(stream)
                || self.send.unsendable.contains_key(&stream)
        });
        debug_assert_eq!(covers, self.send_view(marks).dominates(marks));
        covers
    }

    /// The view from what is certain: the peer's marks, joined with every
    /// delta still in flight (not what was lost). Parts of a delta not yet
    /// handed out were counted in the old view: they are rebuilt.
    pub(super) fn recompute_view(&mut self) {
        self.send.view = self.marks.peer_marks.clone();
        for sent in &self.send.in_flight {
            self.send.view.join(&sent.advance);
        }
        let peer_marks = &self.marks.peer_marks;
        self.send
            .peer_pending
            .retain(|range| peer_marks.get(range.stream) < range.to);
        skip_pending(&mut self.send.view, &self.send.peer_pending);
        self.send.parts.clear();
    }
}

/// Records a range the peer holds pending, joined to the range of the
/// same stream and expiry that it continues (the deltas one receipt
/// acknowledges carry a stream's seqs back to back): one entry per stream
/// and receipt, not per delta.
pub(super) fn add_pending(ranges: &mut Vec<PendingRange>, range: PendingRange) {
    let joined = ranges.iter_mut().rev().find(|known| {
        known.stream == range.stream
            && known.expires == range.expires
            && range.from <= known.to.saturating_add(1)
            && known.from <= range.to.saturating_add(1)
    });
    match joined {
        Some(known) => {
            known.from = known.from.min(range.from);
            known.to = known.to.max(range.to);
        }
        None => ranges.push(range),
    }
}

/// Advances `view` past every range the peer holds pending that the view
/// reaches (its seq at or just below the range's first), so the next delta
/// starts above it.
pub(super) fn skip_pending(view: &mut VersionVector, ranges: &[PendingRange]) {
    loop {
        let mut moved = false;
        for range in ranges {
            let seq = view.get(range.stream);
            if seq + 1 >= range.from && seq < range.to {
                view.advance(range.stream, range.to);
                moved = true;
            }
        }
        if !moved {
            return;
        }
    }
}

/// Advances `view` by what a delta carries, from its floor and its
/// [`column_spans`]: per stream, its last event and its floor (a replica
/// holding seq `n` of a stream holds every seq below).
pub(super) fn advance_by_spans(
    view: &mut VersionVector,
    floor: &VersionVector,
    spans: &[(StreamId, u64, u64)],
) {
    for (stream, floor_seq) in floor.iter() {
        view.advance(stream, floor_seq);
    }
    for &(stream, _, last) in spans {
        view.advance(stream, last);
    }
}

/// Per stream of a delta in columns, its lowest and highest seq, streams
/// ascending: one step per run.
pub(super) fn column_spans(columns: &DeltaColumns) -> Vec<(StreamId, u64, u64)> {
    let mut spans: BTreeMap<StreamId, (u64, u64)> = BTreeMap::new();
    for run in columns.runs() {
        spans
            .entry(run.stream)
            .and_modify(|(first, last)| {
                *first = (*first).min(run.first_seq);
                *last = (*last).max(run.last_seq());
            })
            .or_insert((run.first_seq, run.last_seq()));
    }
    spans
        .into_iter()
        .map(|(stream, (first, last))| (stream, first, last))
        .collect()
}
