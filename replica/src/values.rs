//! `Values`: one column of a [`DeltaColumns`](crate::DeltaColumns), held as
//! steady pieces and listed values.
//!
//! A writer's events mostly come in batches whose stamps rise by one, whose
//! time is one, and whose payloads are one size: each of a delta's columns
//! is then a few arithmetic progressions, one per run. A [`Values`] holds
//! such a progression as its first value, its step and its length, in no
//! memory a value, and every other value listed. The memory log hands its
//! chunks' steady columns over this way, a frame's repeats decode into
//! it, and a receiver checks and holds a steady piece at once: a run costs
//! the same whether it holds ten events or ten thousand, but for its
//! payloads.

use std::fmt;
use std::ops::Range;

/// A column of `u64`s: steady pieces (`first + i × step` for `len` values,
/// wrapping past `u64::MAX`, held as those three numbers) and listed
/// values, in order.
///
/// Two `Values` are equal when they hold the same values, however they
/// hold them.
///
/// ```
/// use meshlog_replica::{Piece, Values};
///
/// let mut stamps = Values::new();
/// stamps.push(7);
/// stamps.push_steady(8, 1, 999); // 8, 9, ..., 1006
/// stamps.push(2_000);
/// assert_eq!(stamps.len(), 1_001);
/// assert_eq!(stamps.get(999), 1_006);
/// // The first value joins the steady piece that goes on from it.
/// let pieces: Vec<Piece<'_>> = stamps.as_ref().pieces().collect();
/// assert_eq!(pieces[0], Piece::Steady { first: 7, step: 1, len: 1_000 });
/// assert_eq!(pieces[1], Piece::Listed(&[2_000]));
/// assert_eq!(stamps, Values::from(stamps.iter().collect::<Vec<u64>>()));
/// ```
#[derive(Clone, Default)]
pub struct Values {
    pieces: Vec<Stored>,
    listed: Vec<u64>,
}

/// One piece as held: where it ends among the values, and what it is.
#[derive(Debug, Clone, Copy)]
struct Stored {
    /// The index one past its last value.
    end: usize,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Steady {
        first: u64,
        step: u64,
    },
    /// Its values are `listed[at ..]`, as many as the piece holds.
    Listed {
        at: usize,
    },
}

/// A piece of a column, as [`ValuesRef::pieces`] hands them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// `len` values, `first + i × step` (wrapping) for `i` in `0 .. len`.
    Steady {
        /// The first value.
        first: u64,
        /// What each value adds to the one before (wrapping).
        step: u64,
        /// How many values (at least one).
        len: usize,
    },
    /// Values as they are.
    Listed(&'a [u64]),
}

impl Piece<'_> {
    /// How many values.
    pub fn len(&self) -> usize {
        match self {
            Piece::Steady { len, .. } => *len,
            Piece::Listed(values) => values.len(),
        }
    }

    /// Whether it holds no value (a piece handed out never does).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its first value.
    pub fn first(&self) -> Option<u64> {
        match self {
            Piece::Steady { first, .. } => Some(*first),
            Piece::Listed(values) => values.first().copied(),
        }
    }

    /// Its last value.
    pub fn last(&self) -> Option<u64> {
        match *self {
            Piece::Steady { first, step, len } => {
                Some(first.wrapping_add(step.wrapping_mul(len as u64 - 1)))
            }
            Piece::Listed(values) => values.last().copied(),
        }
    }

    /// Whether each value is above the one before (`strictly`) or at
    /// least it, with no wrap past `u64::MAX`.
    fn rises(&self, strictly: bool) -> bool {
        match *self {
            Piece::Steady { first, step, len } => {
                len <= 1
                    || ((!strictly || step > 0)
                        && step
                            .checked_mul(len as u64 - 1)
                            .and_then(|span| first.checked_add(span))
                            .is_some())
            }
            Piece::Listed(values) => values
                .windows(2)
                .all(|pair| pair[0] < pair[1] || (!strictly && pair[0] == pair[1])),
        }
    }
}

impl Values {
    /// No values.
    pub fn new() -> Self {
        Values::default()
    }

    /// How many values.
    #[inline]
    pub fn len(&self) -> usize {
        self.pieces.last().map_or(0, |piece| piece.end)
    }

    /// Whether it holds no value.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The value at `index`.
    ///
    /// # Panics
    ///
    /// If `index` is not below [`Values::len`].
    #[inline]
    pub fn get(&self, index: usize) -> u64 {
        self.as_ref().get(index)
    }

    /// The value at `index`, which piece `at` holds.
    #[inline]
    fn value_in(&self, at: usize, index: usize) -> u64 {
        let start = self.piece_start(at);
        match self.pieces[at].kind {
            Kind::Steady { first, step } => {
                first.wrapping_add(step.wrapping_mul((index - start) as u64))
            }
            Kind::Listed { at } => self.listed[at + (index - start)],
        }
    }

    /// Every value, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.as_ref().iter()
    }

    /// All of it, borrowed.
    #[inline]
    pub fn as_ref(&self) -> ValuesRef<'_> {
        ValuesRef {
            values: self,
            start: 0,
            len: self.len(),
            first_piece: 0,
            end_piece: self.pieces.len(),
        }
    }

    /// The values `range`, borrowed.
    ///
    /// # Panics
    ///
    /// If `range` reaches past [`Values::len`] or ends before it starts.
    pub fn slice(&self, range: Range<usize>) -> ValuesRef<'_> {
        self.as_ref().slice(range)
    }

    /// Appends `value`: to the last steady piece if it goes on with its
    /// step (a one-value piece takes any step up), else listed.
    pub fn push(&mut self, value: u64) {
        let Some((held, kind)) = self.last_piece() else {
            self.pieces.push(Stored {
                end: 1,
                kind: Kind::Steady {
                    first: value,
                    step: 0,
                },
            });
            return;
        };
        if let Kind::Steady { first, step } = kind {
            let last = self.pieces.last_mut().expect("a last piece");
            if held == 1 {
                last.kind = Kind::Steady {
                    first,
                    step: value.wrapping_sub(first),
                };
                last.end += 1;
                return;
            }
            if first.wrapping_add(step.wrapping_mul(held as u64)) == value {
                last.end += 1;
                return;
            }
            if held == 2 {
                // Two values, then one off their step: all three listed,
                // so that wandering values stay one listed piece.
                self.pieces.pop();
                self.push_listed(first);
                self.push_listed(first.wrapping_add(step));
            }
        }
        self.push_listed(value);
    }

    /// Appends `len` values `first + i × step` (wrapping), held in no
    /// memory a value: joined to the last piece where it goes on with the
    /// same step, or taking the last listed value in where that value is
    /// one step below `first`.
    pub fn push_steady(&mut self, first: u64, step: u64, len: usize) {
        if len == 0 {
            return;
        }
        let total = self.len();
        match self.last_piece() {
            Some((
                held,
                Kind::Steady {
                    first: piece_first,
                    step: piece_step,
                },
            )) if (held == 1 || piece_step == step)
                && piece_first.wrapping_add(step.wrapping_mul(held as u64)) == first =>
            {
                let last = self.pieces.last_mut().expect("a last piece");
                last.kind = Kind::Steady {
                    first: piece_first,
                    step,
                };
                last.end += len;
                return;
            }
            Some((held, Kind::Listed { .. })) if len > 1 => {
                let before = *self.listed.last().expect("a listed piece holds a value");
                if before.wrapping_add(step) == first {
                    self.listed.pop();
                    if held == 1 {
                        self.pieces.pop();
                    } else {
                        self.pieces.last_mut().expect("a last piece").end -= 1;
                    }
                    self.pieces.push(Stored {
                        end: total + len,
                        kind: Kind::Steady {
                            first: before,
                            step,
                        },
                    });
                    return;
                }
            }
            _ => {}
        }
        if len == 1 {
            self.push(first);
            return;
        }
        self.pieces.push(Stored {
            end: total + len,
            kind: Kind::Steady { first, step },
        });
    }

    /// Appends every value of `values`, keeping its steady pieces steady.
    pub fn extend_from(&mut self, values: ValuesRef<'_>) {
        for piece in values.pieces() {
            self.push_piece(piece);
        }
    }

    /// Appends a piece.
    pub fn push_piece(&mut self, piece: Piece<'_>) {
        match piece {
            Piece::Steady { first, step, len } => self.push_steady(first, step, len),
            Piece::Listed(values) => {
                for &value in values {
                    self.push(value);
                }
            }
        }
    }

    /// Makes room for `additional` more listed values.
    pub fn reserve(&mut self, additional: usize) {
        self.listed.reserve(additional);
    }

    fn push_listed(&mut self, value: u64) {
        let total = self.len();
        match self.pieces.last_mut() {
            Some(last) if matches!(last.kind, Kind::Listed { .. }) => last.end += 1,
            _ => self.pieces.push(Stored {
                end: total + 1,
                kind: Kind::Listed {
                    at: self.listed.len(),
                },
            }),
        }
        self.listed.push(value);
    }

    /// Where piece `at` starts among the values.
    #[inline]
    fn piece_start(&self, at: usize) -> usize {
        if at == 0 {
            0
        } else {
            self.pieces[at - 1].end
        }
    }

    /// The last piece: how many values it holds, and what it is.
    fn last_piece(&self) -> Option<(usize, Kind)> {
        let last = self.pieces.last()?;
        Some((
            last.end - self.piece_start(self.pieces.len() - 1),
            last.kind,
        ))
    }
}

impl From<Vec<u64>> for Values {
    /// The values of `values`, steady pieces found where they rise (or
    /// fall) by one step.
    fn from(values: Vec<u64>) -> Self {
        let mut held = Values::new();
        for value in values {
            held.push(value);
        }
        held
    }
}

impl PartialEq for Values {
    fn eq(&self, other: &Self) -> bool {
        self.as_ref() == other.as_ref()
    }
}

impl Eq for Values {}

impl fmt::Debug for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

/// A borrowed range of a [`Values`].
#[derive(Clone, Copy)]
pub struct ValuesRef<'a> {
    values: &'a Values,
    start: usize,
    len: usize,
    /// The pieces the range touches: `values.pieces[first_piece ..
    /// end_piece]`, found once when the range is cut, so that a value or
    /// the pieces of a short range cost no search of the whole column.
    first_piece: usize,
    end_piece: usize,
}

impl<'a> ValuesRef<'a> {
    /// How many values.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no value.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value at `index` of this range.
    ///
    /// # Panics
    ///
    /// If `index` is not below [`ValuesRef::len`].
    #[inline]
    pub fn get(&self, index: usize) -> u64 {
        assert!(index < self.len, "value {index} of {}", self.len);
        let index = self.start + index;
        let at = self.first_piece
            + if self.end_piece - self.first_piece == 1 {
                0
            } else {
                self.touched().partition_point(|piece| piece.end <= index)
            };
        self.values.value_in(at, index)
    }

    /// The pieces the range touches, whole.
    #[inline]
    fn touched(&self) -> &'a [Stored] {
        &self.values.pieces[self.first_piece..self.end_piece]
    }

    /// Its last value.
    pub fn last(&self) -> Option<u64> {
        self.len.checked_sub(1).map(|index| self.get(index))
    }

    /// The values `range` of this range.
    ///
    /// # Panics
    ///
    /// If `range` reaches past [`ValuesRef::len`] or ends before it
    /// starts.
    pub fn slice(&self, range: Range<usize>) -> ValuesRef<'a> {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "values {}..{} of {}",
            range.start,
            range.end,
            self.len
        );
        let (start, len) = (self.start + range.start, range.end - range.start);
        let touched = self.touched();
        // The first piece ending past `start`, and the first ending at or
        // past the range's end (the one holding its last value).
        let first_piece = self.first_piece + touched.partition_point(|piece| piece.end <= start);
        let end_piece = if len == 0 {
            first_piece
        } else {
            self.first_piece + touched.partition_point(|piece| piece.end < start + len) + 1
        };
        ValuesRef {
            values: self.values,
            start,
            len,
            first_piece,
            end_piece,
        }
    }

    /// The first `len` values, and the rest: what walking a column run by
    /// run takes, each cut costing the pieces it passes rather than a
    /// search of the whole column.
    ///
    /// # Panics
    ///
    /// If `len` is above [`ValuesRef::len`].
    pub fn split_at(&self, len: usize) -> (ValuesRef<'a>, ValuesRef<'a>) {
        assert!(len <= self.len, "split at {len} of {}", self.len);
        let pieces = &self.values.pieces;
        let split = self.start + len;
        // The piece holding the front's last value, found by walking on.
        let mut last = self.first_piece;
        while last < self.end_piece && pieces[last].end < split {
            last += 1;
        }
        let front = ValuesRef {
            values: self.values,
            start: self.start,
            len,
            first_piece: self.first_piece,
            end_piece: if len == 0 { self.first_piece } else { last + 1 },
        };
        // The rest starts in that piece, or the next where it ends there.
        let rest_first = if last < self.end_piece && pieces[last].end == split {
            last + 1
        } else {
            last
        };
        let rest = ValuesRef {
            values: self.values,
            start: split,
            len: self.len - len,
            first_piece: rest_first,
            end_piece: if self.len == len {
                rest_first
            } else {
                self.end_piece
            },
        };
        (front, rest)
    }

    /// Its pieces, in order, cut to the range: a steady piece as its first
    /// value, step and length, listed values as a slice.
    pub fn pieces(&self) -> impl Iterator<Item = Piece<'a>> + 'a {
        let values = self.values;
        let (start, end) = (self.start, self.start + self.len);
        let first_piece = self.first_piece;
        self.touched()
            .iter()
            .enumerate()
            .map(move |(offset, piece)| {
                let piece_start = values.piece_start(first_piece + offset);
                let (from, to) = (start.max(piece_start), end.min(piece.end));
                match piece.kind {
                    Kind::Steady { first, step } => Piece::Steady {
                        first: first.wrapping_add(step.wrapping_mul((from - piece_start) as u64)),
                        step,
                        len: to - from,
                    },
                    Kind::Listed { at } => Piece::Listed(
                        &values.listed[at + (from - piece_start)..at + (to - piece_start)],
                    ),
                }
            })
    }

    /// Every value, in order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + 'a {
        self.pieces().flat_map(PieceValues::from)
    }

    /// Whether each value is above the one before (`strictly`) or at least
    /// it: O(1) a steady piece.
    pub fn rises(&self, strictly: bool) -> bool {
        let mut before: Option<u64> = None;
        for piece in self.pieces() {
            if !piece.rises(strictly) {
                return false;
            }
            if let (Some(before), Some(first)) = (before, piece.first()) {
                if before > first || (strictly && before == first) {
                    return false;
                }
            }
            before = piece.last();
        }
        true
    }
}

/// The values of one piece, in order.
enum PieceValues<'a> {
    Steady { next: u64, step: u64, left: usize },
    Listed(std::slice::Iter<'a, u64>),
}

impl<'a> From<Piece<'a>> for PieceValues<'a> {
    fn from(piece: Piece<'a>) -> Self {
        match piece {
            Piece::Steady { first, step, len } => PieceValues::Steady {
                next: first,
                step,
                left: len,
            },
            Piece::Listed(values) => PieceValues::Listed(values.iter()),
        }
    }
}

impl Iterator for PieceValues<'_> {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        match self {
            PieceValues::Steady { next, step, left } => {
                if *left == 0 {
                    return None;
                }
                *left -= 1;
                let value = *next;
                *next = next.wrapping_add(*step);
                Some(value)
            }
            PieceValues::Listed(values) => values.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let len = match self {
            PieceValues::Steady { left, .. } => *left,
            PieceValues::Listed(values) => values.len(),
        };
        (len, Some(len))
    }
}

impl PartialEq for ValuesRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for ValuesRef<'_> {}

impl fmt::Debug for ValuesRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.pieces()).finish()
    }
}

#[cfg(test)]
mod tests {
    use meshlog_testkit::{seed, SplitMix64};

    use super::*;

    /// Values built at random from pushes, steady pieces and slices of
    /// other values hold what a plain vector of the same pushes holds,
    /// whatever pieces they end in.
    #[test]
    fn values_hold_what_was_pushed_in_any_pieces() {
        let seed = seed::replay_or(0x7a1_5eed);
        let mut rng = SplitMix64::new(seed);
        let edge = |rng: &mut SplitMix64| match rng.below(6) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => u64::MAX - rng.below(3),
            _ => rng.below(50),
        };
        for _ in 0..2_000 {
            let (mut values, mut plain) = (Values::new(), Vec::<u64>::new());
            for _ in 0..rng.below(12) {
                match rng.below(4) {
                    0 => {
                        let value = edge(&mut rng);
                        values.push(value);
                        plain.push(value);
                    }
                    1 | 2 => {
                        // Often one step on from the last value.
                        let step = edge(&mut rng);
                        let first = match plain.last() {
                            Some(&last) if rng.below(2) == 0 => last.wrapping_add(step),
                            _ => edge(&mut rng),
                        };
                        let len = rng.below(5) as usize;
                        values.push_steady(first, step, len);
                        plain.extend(
                            (0..len as u64).map(|i| first.wrapping_add(step.wrapping_mul(i))),
                        );
                    }
                    _ => {
                        let other = Values::from(plain.clone());
                        let from = rng.below(plain.len() as u64 + 1) as usize;
                        let to = from + rng.below((plain.len() - from) as u64 + 1) as usize;
                        values.extend_from(other.slice(from..to));
                        plain.extend_from_slice(&plain.clone()[from..to]);
                    }
                }
            }
            let context = format!("seed {seed:#x}: {values:?} against {plain:?}");
            assert_eq!(values.len(), plain.len(), "{context}");
            assert_eq!(values.iter().collect::<Vec<_>>(), plain, "{context}");
            for (index, &value) in plain.iter().enumerate() {
                assert_eq!(values.get(index), value, "{context}: value {index}");
            }
            assert_eq!(values, Values::from(plain.clone()), "{context}");
            let from = rng.below(plain.len() as u64 + 1) as usize;
            let to = from + rng.below((plain.len() - from) as u64 + 1) as usize;
            let slice = values.slice(from..to);
            assert_eq!(
                slice.iter().collect::<Vec<_>>(),
                &plain[from..to],
                "{context}"
            );
            assert_eq!(
                slice.pieces().map(|piece| piece.len()).sum::<usize>(),
                to - from,
                "{context}"
            );
            assert!(slice.pieces().all(|piece| !piece.is_empty()), "{context}");
            for (index, &value) in plain[from..to].iter().enumerate() {
                assert_eq!(slice.get(index), value, "{context}: slice value {index}");
            }
            // A slice of the slice, and the slice walked in cuts as a
            // delta's runs are, hold the same values and no empty piece.
            let inner_from = rng.below(slice.len() as u64 + 1) as usize;
            let inner_to = inner_from + rng.below((slice.len() - inner_from) as u64 + 1) as usize;
            let inner = slice.slice(inner_from..inner_to);
            assert_eq!(
                inner.iter().collect::<Vec<_>>(),
                &plain[from + inner_from..from + inner_to],
                "{context}: inner {inner_from}..{inner_to}"
            );
            assert!(inner.pieces().all(|piece| !piece.is_empty()), "{context}");
            let mut rest = slice;
            let mut walked = 0;
            while walked < slice.len() || rng.below(4) == 0 {
                let cut = rng.below((rest.len() as u64).min(4) + 1) as usize;
                let (front, after) = rest.split_at(cut);
                let expected = &plain[from + walked..from + walked + cut];
                assert_eq!(
                    front.iter().collect::<Vec<_>>(),
                    expected,
                    "{context}: cut {walked}+{cut}"
                );
                assert!(front.pieces().all(|piece| !piece.is_empty()), "{context}");
                assert_eq!(front.pieces().map(|piece| piece.len()).sum::<usize>(), cut);
                for (index, &value) in expected.iter().enumerate() {
                    assert_eq!(front.get(index), value, "{context}: cut value {index}");
                }
                assert_eq!(front.last(), expected.last().copied(), "{context}");
                walked += cut;
                rest = after;
                assert_eq!(rest.len(), slice.len() - walked, "{context}");
            }
            assert_eq!(rest.pieces().count(), 0, "{context}");
            for strictly in [false, true] {
                let rises = plain[from..to]
                    .windows(2)
                    .all(|pair| pair[0] < pair[1] || (!strictly && pair[0] == pair[1]));
                assert_eq!(
                    slice.rises(strictly),
                    rises,
                    "{context}: strictly {strictly}"
                );
            }
        }
    }

    #[test]
    fn a_steady_writer_is_one_piece_whatever_its_length() {
        let mut values = Values::new();
        values.push(1);
        values.push_steady(2, 1, 8_191);
        assert_eq!(values.as_ref().pieces().count(), 1);
        assert_eq!(values.listed.capacity(), 0);
        assert_eq!(values.get(8_191), 8_192);
        assert!(values.as_ref().rises(true));
        // One step past u64::MAX does not rise.
        let mut wraps = Values::new();
        wraps.push_steady(u64::MAX - 1, 1, 3);
        assert_eq!(
            wraps.iter().collect::<Vec<_>>(),
            [u64::MAX - 1, u64::MAX, 0]
        );
        assert!(!wraps.as_ref().rises(false));
        // Wandering values stay one listed piece.
        let wandering = Values::from(vec![5, 9, 4, 11, 2, 30]);
        assert_eq!(wandering.as_ref().pieces().count(), 1);
    }
}
