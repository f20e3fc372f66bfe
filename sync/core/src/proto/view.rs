//! The peer view: what the peer is believed to hold (its marks, what it
//! sent, what is in flight to it, what it holds pending above a hole),
//! which every delta is computed from.

use std::collections::BTreeMap;

use meshlog_cursor::{StreamId, VersionVector};
use meshlog_replica::DeltaColumns;

use super::state::{PendingRange, Protocol};

impl Protocol {
    /// The view deltas are built from: the view, with every stream the
    /// peer asked quiet counted as held up to our marks (and the streams
    /// [`Protocol::counted_as_held`] names). Built in one walk of the
    /// view and the marks, not a lookup and an insert per stream.
    pub(super) fn send_view(&self, marks: &VersionVector) -> std::borrow::Cow<'_, VersionVector> {
        let own = self.hello.peer.filter(|&peer| {
            self.hello.peer_holds_own_stream && self.send.view.get(peer) < marks.get(peer)
        });
        if self.routing.peer_quiet.is_empty() && own.is_none() && self.send.unsendable.is_empty() {
            return std::borrow::Cow::Borrowed(&self.send.view);
        }
        let mut counted = self.counted_as_held();
        let mut view = walk(&self.send.view);
        let raised: Vec<(StreamId, u64)> = marks
            .iter()
            .filter(|&(stream, seq)| counted(stream) && seq > view.at(stream))
            .collect();
        // Both ascending, and a raised seq is above the view's.
        let mut merged = Vec::with_capacity(self.send.view.len() + raised.len());
        let mut raised = raised.into_iter().peekable();
        for (stream, seq) in self.send.view.iter() {
            while let Some(entry) = raised.next_if(|&(at, _)| at < stream) {
                merged.push(entry);
            }
            merged.push(
                raised
                    .next_if(|&(at, _)| at == stream)
                    .unwrap_or((stream, seq)),
            );
        }
        merged.extend(raised);
        let built: VersionVector = merged.into_iter().collect();
        debug_assert_eq!(built, self.send_view_by_lookups(marks));
        std::borrow::Cow::Owned(built)
    }

    /// [`Protocol::send_view`] as it was first written, a lookup and an
    /// insert per stream: what the debug builds (every test) check it
    /// against.
    fn send_view_by_lookups(&self, marks: &VersionVector) -> VersionVector {
        let mut view = self.send.view.clone();
        for &stream in self.send.unsendable.keys() {
            view.advance(stream, marks.get(stream));
        }
        if let Some(peer) = self.hello.peer.filter(|_| self.hello.peer_holds_own_stream) {
            view.advance(peer, marks.get(peer));
        }
        for &stream in &self.routing.peer_quiet {
            view.advance(stream, marks.get(stream));
        }
        view
    }

    /// Which streams the send view counts as held up to our marks, asked
    /// at ascending streams: those the peer asked quiet, those we cannot
    /// send it (an event too large for a frame), and its own where it
    /// holds it (`HelloState::peer_holds_own_stream`).
    fn counted_as_held(&self) -> impl FnMut(StreamId) -> bool + '_ {
        let own = self.hello.peer.filter(|_| self.hello.peer_holds_own_stream);
        let mut quiet = self.routing.peer_quiet.iter().peekable();
        move |stream| {
            while quiet.next_if(|&&asked| asked < stream).is_some() {}
            quiet.peek() == Some(&&stream)
                || own == Some(stream)
                || self.send.unsendable.contains_key(&stream)
        }
    }

    /// Whether the send view covers `marks`: what
    /// `send_view(marks).dominates(marks)` says, without building the view
    /// or looking each stream up: one walk of `marks`, the view and the
    /// streams asked quiet together (each ascending), no allocation. What
    /// every poll asks (is there a delta to send?), so its cost is per
    /// poll, not per delta.
    pub(super) fn send_view_covers(&self, marks: &VersionVector) -> bool {
        let mut view = walk(&self.send.view);
        let mut counted = self.counted_as_held();
        let covers = marks
            .iter()
            .all(|(stream, seq)| view.at(stream) >= seq || counted(stream));
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

/// A vector read at ascending streams in one walk: each [`Walk::at`] asks
/// a stream at or above the one asked before, so reading it at every
/// stream of another vector costs one pass over both, not a lookup per
/// stream. For the checks a poll or a receipt makes over every stream.
pub(super) struct Walk<I: Iterator<Item = (StreamId, u64)>>(std::iter::Peekable<I>);

/// A [`Walk`] of `vector` from its first stream.
pub(super) fn walk(vector: &VersionVector) -> Walk<impl Iterator<Item = (StreamId, u64)> + '_> {
    Walk(vector.iter().peekable())
}

impl<I: Iterator<Item = (StreamId, u64)>> Walk<I> {
    /// The vector's seq at `stream` (0 if none): `stream` is at or above
    /// every stream asked before.
    pub(super) fn at(&mut self, stream: StreamId) -> u64 {
        while self.0.next_if(|&(at, _)| at < stream).is_some() {}
        self.0
            .peek()
            .filter(|&&(at, _)| at == stream)
            .map_or(0, |&(_, seq)| seq)
    }
}

/// The streams `theirs` holds further than `ours`, with both seqs: one
/// walk of both vectors (each ascending), not a lookup per stream, for it
/// runs after every receipt; most often it finds few.
pub(super) fn streams_ahead(
    theirs: &VersionVector,
    ours: &VersionVector,
) -> BTreeMap<StreamId, (u64, u64)> {
    let mut ours = walk(ours);
    theirs
        .iter()
        .filter_map(|(stream, their_seq)| {
            let our_seq = ours.at(stream);
            (their_seq > our_seq).then_some((stream, (their_seq, our_seq)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use meshlog_testkit::SplitMix64;

    use super::*;

    fn random_vector(rng: &mut SplitMix64) -> VersionVector {
        (0..rng.next_u64() % 40)
            .map(|_| (StreamId::new(1 + rng.next_u64() % 60), rng.next_u64() % 5))
            .collect()
    }

    /// A walk reads what a lookup reads, at every stream asked in
    /// ascending order, skipping some (as a short-circuited check does).
    #[test]
    fn a_walk_reads_each_stream_as_a_lookup_does() {
        let seed = 0x5eed_0027;
        let mut rng = SplitMix64::new(seed);
        for round in 0..500 {
            let vector = random_vector(&mut rng);
            let mut walked = walk(&vector);
            for id in 1..=61 {
                if rng.below(3) == 0 {
                    continue;
                }
                let stream = StreamId::new(id);
                assert_eq!(
                    walked.at(stream),
                    vector.get(stream),
                    "seed {seed:#x}, round {round}, {stream}, {vector:?}"
                );
            }
        }
    }

    /// The walks over two vectors answer what lookups answer.
    #[test]
    fn differences_and_streams_ahead_are_those_of_lookups() {
        let seed = 0x5eed_0028;
        let mut rng = SplitMix64::new(seed);
        for round in 0..500 {
            let (theirs, ours) = (random_vector(&mut rng), random_vector(&mut rng));
            let ahead: BTreeMap<StreamId, (u64, u64)> = theirs
                .iter()
                .filter(|&(stream, seq)| seq > ours.get(stream))
                .map(|(stream, seq)| (stream, (seq, ours.get(stream))))
                .collect();
            let context = format!("seed {seed:#x}, round {round}, {theirs:?}, {ours:?}");
            assert_eq!(streams_ahead(&theirs, &ours), ahead, "{context}");
            let difference: VersionVector = ahead.iter().map(|(&s, &(seq, _))| (s, seq)).collect();
            assert_eq!(
                super::super::receipts::difference(&theirs, &ours),
                difference,
                "{context}"
            );
        }
    }
}
