//! `VersionVector`: per stream, the last sequence number seen; and the
//! staleness check of a cursor against a compaction floor.

use std::cmp::Ordering;
use std::fmt;

use crdts::VClock;

use crate::StreamId;

/// The most streams a version vector may name wherever one is kept or
/// crosses a boundary: a cursor token, a replica's marks, a compaction
/// floor, the vectors of a sync frame. 16,383 is the largest count whose
/// varint takes two bytes, so a token's fixed overhead stays at 7 bytes.
///
/// One bound for all of them, because they are one type playing several
/// roles: marks and floors become cursors, and every cursor must fit a
/// token. [`VersionVector`] itself does not enforce it (a join may pass
/// it); each boundary does: [`token::encode`](crate::token::encode) and
/// [`token::decode`](crate::token::decode) refuse more streams with
/// [`TokenError::TooManyStreams`](crate::TokenError::TooManyStreams), a
/// replica holds at most this many by default, and a frame naming more is
/// refused by its count before any entry is read.
pub const STREAMS_MAX: usize = 16_383;

/// Per writer stream, the highest sequence number covered: every event
/// `(stream, seq)` with `seq <= self.get(stream)` is covered.
///
/// One type plays three roles, which is the point of meshlog's design:
///
/// - a reader's **cursor**: per stream, the last seq a walk has returned;
/// - a replica's **marks** (head): per stream, the last seq held with no hole
///   below it, which is what sync exchanges as high-water marks;
/// - a compaction **floor**: per stream, the last seq dropped.
///
/// Because every replica holds each stream as a gap-free prefix, "covered by
/// the cursor" means exactly "already returned to the reader", on any replica.
///
/// It wraps the `crdts` crate's [`VClock`], which provides the join and the
/// partial order; a stream with seq 0 is never stored, so two vectors that
/// cover the same events are equal.
///
/// Join is commutative, associative and idempotent:
///
/// ```
/// use meshlog_cursor::{StreamId, VersionVector};
/// let a: VersionVector = [(StreamId::new(1), 4), (StreamId::new(2), 1)].into_iter().collect();
/// let b: VersionVector = [(StreamId::new(2), 7)].into_iter().collect();
/// let mut ab = a.clone();
/// ab.join(&b);
/// assert_eq!(ab, b.joined(&a));
/// assert_eq!(ab.joined(&b), ab);
/// assert_eq!(ab.get(StreamId::new(2)), 7);
/// assert!(ab.dominates(&a) && ab.dominates(&b));
/// assert!(a.concurrent(&b));
/// ```
#[derive(Clone, PartialEq, Eq, Default)]
pub struct VersionVector {
    clock: VClock<StreamId>,
}

impl VersionVector {
    /// The empty vector: covers nothing. As a cursor it is the start of the
    /// log; as a floor it means nothing was compacted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a vector from entries in strictly ascending stream order with
    /// nonzero seqs, in one go (the token decoder's fast path).
    pub(crate) fn from_sorted_entries(entries: Vec<(StreamId, u64)>) -> Self {
        debug_assert!(entries.windows(2).all(|w| w[0].0 < w[1].0));
        debug_assert!(entries.iter().all(|&(_, seq)| seq > 0));
        let mut clock = VClock::new();
        clock.dots = entries.into_iter().collect();
        VersionVector { clock }
    }

    /// The last seq covered for `stream` (0 if none).
    pub fn get(&self, stream: StreamId) -> u64 {
        self.clock.get(&stream)
    }

    /// Whether the event `(stream, seq)` is covered.
    pub fn covers(&self, stream: StreamId, seq: u64) -> bool {
        seq <= self.get(stream)
    }

    /// Raises `stream`'s entry to at least `seq`; never lowers it.
    pub fn advance(&mut self, stream: StreamId, seq: u64) {
        // `VClock::apply`'s rule (an entry only rises, and 0 is no entry),
        // in one map lookup instead of two.
        match self.clock.dots.entry(stream) {
            std::collections::btree_map::Entry::Occupied(mut entry) => {
                if *entry.get() < seq {
                    entry.insert(seq);
                }
            }
            std::collections::btree_map::Entry::Vacant(entry) => {
                if seq > 0 {
                    entry.insert(seq);
                }
            }
        }
    }

    /// Joins `other` into `self`: per stream, the maximum of both.
    pub fn join(&mut self, other: &VersionVector) {
        // Entry by entry: the same as merging a clone of `other`, without
        // the clone (a copy of its whole map per join).
        for (stream, seq) in other.iter() {
            self.advance(stream, seq);
        }
    }

    /// The join of `self` and `other`, leaving both unchanged.
    pub fn joined(&self, other: &VersionVector) -> VersionVector {
        let mut out = self.clone();
        out.join(other);
        out
    }

    /// Whether `self` covers every event `other` covers (`self >= other`).
    pub fn dominates(&self, other: &VersionVector) -> bool {
        matches!(
            self.clock.partial_cmp(&other.clock),
            Some(Ordering::Greater | Ordering::Equal)
        )
    }

    /// How many events `self` covers that `other` does not: per stream,
    /// `self`'s seq minus `other`'s where it is ahead, summed (saturating).
    /// A replica's marks beyond a peer's are the peer's lag in events.
    ///
    /// ```
    /// use meshlog_cursor::{StreamId, VersionVector};
    /// let ours: VersionVector = [(StreamId::new(1), 10), (StreamId::new(2), 3)].into_iter().collect();
    /// let theirs: VersionVector = [(StreamId::new(1), 4), (StreamId::new(2), 5)].into_iter().collect();
    /// assert_eq!(ours.events_beyond(&theirs), 6);
    /// assert_eq!(theirs.events_beyond(&ours), 2);
    /// ```
    pub fn events_beyond(&self, other: &VersionVector) -> u64 {
        self.iter()
            .map(|(stream, seq)| seq.saturating_sub(other.get(stream)))
            .fold(0u64, u64::saturating_add)
    }

    /// Whether neither vector dominates the other.
    pub fn concurrent(&self, other: &VersionVector) -> bool {
        self.clock.concurrent(&other.clock)
    }

    /// The number of streams with a nonzero entry.
    pub fn len(&self) -> usize {
        self.clock.dots.len()
    }

    /// Whether no stream has a nonzero entry.
    pub fn is_empty(&self) -> bool {
        self.clock.is_empty()
    }

    /// The nonzero entries, in ascending stream order.
    pub fn iter(&self) -> impl Iterator<Item = (StreamId, u64)> + '_ {
        self.clock.dots.iter().map(|(stream, seq)| (*stream, *seq))
    }

    /// The sum of all entries: how many events the vector covers, if each
    /// stream starts at seq 1.
    pub fn total(&self) -> u128 {
        self.iter().map(|(_, seq)| u128::from(seq)).sum()
    }

    /// Checks a cursor (`self`) against a compaction `floor`.
    ///
    /// The cursor is stale when, for some stream, it is below the floor: the
    /// events `cursor[s] + 1 ..= floor[s]` were dropped before this reader
    /// saw them. The error names every such stream with the range lost, and
    /// carries the cursor to resume from if the reader accepts the gap
    /// (`cursor ⊔ floor`).
    ///
    /// ```
    /// use meshlog_cursor::{StreamId, VersionVector};
    /// let s = StreamId::new(7);
    /// let cursor: VersionVector = [(s, 3)].into_iter().collect();
    /// let floor: VersionVector = [(s, 10)].into_iter().collect();
    /// let stale = cursor.check_floor(&floor).unwrap_err();
    /// assert_eq!(stale.lost()[0].stream, s);
    /// assert_eq!(stale.lost()[0].seqs(), 4..=10);
    /// assert_eq!(stale.resume().get(s), 10);
    /// assert!(stale.resume().check_floor(&floor).is_ok());
    /// ```
    pub fn check_floor(&self, floor: &VersionVector) -> Result<(), StaleCursor> {
        let lost: Vec<LostRange> = floor
            .iter()
            .filter_map(|(stream, floor_seq)| {
                let cursor_seq = self.get(stream);
                // Lazily: `cursor_seq + 1` overflows when the cursor is at
                // u64::MAX (and not behind).
                (cursor_seq < floor_seq).then(|| LostRange {
                    stream,
                    first_seq: cursor_seq + 1,
                    last_seq: floor_seq,
                })
            })
            .collect();
        if lost.is_empty() {
            Ok(())
        } else {
            Err(StaleCursor {
                lost,
                resume: self.joined(floor),
            })
        }
    }
}

impl FromIterator<(StreamId, u64)> for VersionVector {
    /// Builds a vector from entries; repeated streams keep the maximum and
    /// zero entries are ignored.
    fn from_iter<I: IntoIterator<Item = (StreamId, u64)>>(entries: I) -> Self {
        // Sorted by stream, each stream's highest first, then built at once
        // (a map from sorted entries is built in one pass, where inserting
        // them one by one walks the tree for each).
        let mut entries: Vec<(StreamId, u64)> =
            entries.into_iter().filter(|&(_, seq)| seq > 0).collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        entries.dedup_by_key(|entry| entry.0);
        let mut out = VersionVector::new();
        out.clock.dots = entries.into_iter().collect();
        out
    }
}

impl PartialOrd for VersionVector {
    /// The causal partial order: `None` when the vectors are concurrent.
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.clock.partial_cmp(&other.clock)
    }
}

impl fmt::Debug for VersionVector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<")?;
        for (i, (stream, seq)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{stream}:{seq}")?;
        }
        f.write_str(">")
    }
}

/// The events of one stream that compaction dropped before a reader saw them:
/// seqs `first_seq ..= last_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostRange {
    /// The stream.
    pub stream: StreamId,
    /// The first seq lost (the cursor's entry plus one).
    pub first_seq: u64,
    /// The last seq lost (the floor's entry).
    pub last_seq: u64,
}

impl LostRange {
    /// The seqs lost, as an inclusive range.
    pub fn seqs(&self) -> std::ops::RangeInclusive<u64> {
        self.first_seq..=self.last_seq
    }

    /// How many events were lost (saturating at `u64::MAX`; 0 for a range
    /// built by hand with `first_seq > last_seq`).
    pub fn count(&self) -> u64 {
        if self.last_seq < self.first_seq {
            0
        } else {
            (self.last_seq - self.first_seq).saturating_add(1)
        }
    }
}

/// A cursor below the compaction floor: what the reader lost, and where to
/// resume if it accepts the gap. Never a silent skip.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", describe_stale(.lost))]
pub struct StaleCursor {
    lost: Vec<LostRange>,
    resume: VersionVector,
}

impl StaleCursor {
    /// Every stream where the cursor is below the floor, in ascending stream
    /// order, with the seqs compacted away unread.
    pub fn lost(&self) -> &[LostRange] {
        &self.lost
    }

    /// The cursor to resume from if the reader accepts the gap: the stale
    /// cursor joined with the floor.
    pub fn resume(&self) -> &VersionVector {
        &self.resume
    }

    /// How many events were lost in all.
    pub fn lost_count(&self) -> u128 {
        self.lost.iter().map(|r| u128::from(r.count())).sum()
    }
}

fn describe_stale(lost: &[LostRange]) -> String {
    use fmt::Write;
    let mut text = format!(
        "cursor is below the compaction floor on {} stream(s); lost:",
        lost.len()
    );
    // Name every stream, but keep a message bounded for logs: the full list
    // is in `StaleCursor::lost`.
    for range in lost.iter().take(16) {
        let _ = write!(
            text,
            " stream {} seq {}..={};",
            range.stream, range.first_seq, range.last_seq
        );
    }
    if lost.len() > 16 {
        let _ = write!(text, " and {} more streams;", lost.len() - 16);
    }
    text.push_str(" resume from the offered cursor to accept the gap");
    text
}
