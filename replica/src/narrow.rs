//! `Column`: a column of `u64`s held in no bytes a value where it can be,
//! else in 2 or 4.
//!
//! A memory log chunk's columns (stamps, times, payload ends) hold values
//! that lie close together: 256 consecutive events of one stream. While
//! they rise by one fixed step (a writer's batch: stamps one apart, one
//! time, payloads of one size) a column is that step and its first value,
//! in no memory a value. Otherwise each value is kept as an offset from a
//! base picked at the first value (half the offsets' range below it, so
//! values on either side of the first fit): 16-bit offsets while every
//! value lies within 2^15 of the first (a writer's stamps that rise by a
//! few, times within half a minute, payloads of up to 32 KiB in all), then
//! 32-bit ones within 2^31, then plain `u64`s. A column turns at most three
//! times, at the first value that does not fit, into the narrowest shape
//! that holds what it had, and holds the same values whatever its shape.

use crate::values::Piece;

/// The offsets a narrow column holds.
pub(crate) trait Offset: Copy {
    /// Offsets reach this far on either side of a column's first value.
    const HALF: u64;
    fn from_u64(value: u64) -> Option<Self>;
    fn to_u64(self) -> u64;
}

impl Offset for u16 {
    const HALF: u64 = 1 << 15;
    fn from_u64(value: u64) -> Option<Self> {
        u16::try_from(value).ok()
    }
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
}

impl Offset for u32 {
    const HALF: u64 = 1 << 31;
    fn from_u64(value: u64) -> Option<Self> {
        u32::try_from(value).ok()
    }
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
}

/// Values as offsets from `base` (set by the first value pushed).
#[derive(Debug, Clone)]
pub(crate) struct Narrow<T> {
    base: u64,
    offsets: Vec<T>,
}

impl<T: Offset> Narrow<T> {
    fn with_capacity(capacity: usize) -> Self {
        Narrow {
            base: 0,
            offsets: Vec::with_capacity(capacity),
        }
    }

    #[inline]
    fn get(&self, index: usize) -> u64 {
        self.base + self.offsets[index].to_u64()
    }

    /// Sets the base if nothing is held yet, from the first value to come.
    #[inline]
    fn base_from(&mut self, first: u64) -> u64 {
        if self.offsets.is_empty() {
            self.base = first.saturating_sub(T::HALF);
        }
        self.base
    }

    /// Pushes `value` if it fits.
    #[cfg(test)]
    fn try_push(&mut self, value: u64) -> bool {
        let base = self.base_from(value);
        match value.checked_sub(base).and_then(T::from_u64) {
            Some(offset) => {
                self.offsets.push(offset);
                true
            }
            None => false,
        }
    }

    /// Pushes `values` if they all fit (checked in one pass, written in a
    /// second, each a tight loop); else pushes none.
    fn try_extend<I: Iterator<Item = u64> + Clone>(&mut self, values: I) -> bool {
        let Some(first) = values.clone().next() else {
            return true;
        };
        let base = self.base_from(first);
        let max = T::HALF * 2 - 1;
        if !values
            .clone()
            .all(|value| value >= base && value - base <= max)
        {
            return false;
        }
        self.offsets
            .extend(values.map(|value| T::from_u64(value - base).expect("checked to fit")));
        true
    }

    /// [`Narrow::try_extend`] for values that never fall: checked from the
    /// first and the last alone.
    fn try_extend_rising<I>(&mut self, values: I) -> bool
    where
        I: DoubleEndedIterator<Item = u64> + Clone,
    {
        let (Some(first), Some(last)) = (values.clone().next(), values.clone().next_back()) else {
            return true;
        };
        debug_assert!(first <= last, "rising values");
        let base = self.base_from(first);
        if first < base || last - base > T::HALF * 2 - 1 {
            return false;
        }
        self.offsets.extend(values.map(|value| {
            T::from_u64(value - base).unwrap_or_else(|| {
                unreachable!("values that never fall fit between the first and the last")
            })
        }));
        true
    }

    /// The same values as offsets of `U`, with the same room.
    fn widen<U: Offset>(&self) -> Narrow<U> {
        let mut wider = Narrow::with_capacity(self.offsets.capacity().max(self.offsets.len() + 1));
        if let Some(first) = self.offsets.first() {
            // The wider base sits below this one, and reaches past its top.
            wider.base = (self.base + first.to_u64()).saturating_sub(U::HALF);
            let shift = self.base - wider.base;
            wider.offsets.extend(self.offsets.iter().map(|&offset| {
                U::from_u64(offset.to_u64() + shift).expect("a wider offset holds a narrower one")
            }));
        }
        wider
    }
}

/// Values that rise by one fixed step (or stay the same): `first + index *
/// step` for `len` values, held in no memory. `room` is the capacity the
/// column was asked for, which it gives its offsets if it turns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Steady {
    first: u64,
    step: u64,
    len: usize,
    room: usize,
}

impl Steady {
    #[inline]
    fn get(&self, index: usize) -> u64 {
        debug_assert!(index < self.len);
        // No overflow: every value held was checked when it was added.
        self.first + index as u64 * self.step
    }

    /// Adds the `len` values `first + i × step` if they go on with this
    /// column's step (or set it) and stay within `u64::MAX`; else adds
    /// none. O(1).
    fn try_extend_steady(&mut self, first: u64, step: u64, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        // The piece's last value, with no wrap past u64::MAX.
        let Some(_) = step
            .checked_mul(len as u64 - 1)
            .and_then(|span| first.checked_add(span))
        else {
            return false;
        };
        let mut next = *self;
        match next.len {
            0 => {
                next.first = first;
                next.step = if len > 1 { step } else { 0 };
            }
            1 => {
                let Some(gap) = first.checked_sub(next.first) else {
                    return false;
                };
                if len > 1 && gap != step {
                    return false;
                }
                next.step = gap;
            }
            held => {
                if len > 1 && step != next.step {
                    return false;
                }
                if next.get(held - 1).checked_add(next.step) != Some(first) {
                    return false;
                }
            }
        }
        next.len += len;
        next.room = next.room.max(next.len);
        *self = next;
        true
    }

    /// Adds `values` if they go on with the step (the first two set it);
    /// else adds none. One pass, that stops at the first value off it.
    fn try_extend<I: Iterator<Item = u64>>(&mut self, mut values: I) -> bool {
        let mut next = *self;
        if next.len == 0 {
            let Some(first) = values.next() else {
                return true;
            };
            next.first = first;
            next.len = 1;
        }
        if next.len == 1 {
            if let Some(second) = values.next() {
                let Some(step) = second.checked_sub(next.first) else {
                    return false;
                };
                next.step = step;
                next.len = 2;
            }
        }
        // Each value one step above the one before (a step past u64::MAX
        // is off it).
        let (mut last, step) = (next.get(next.len - 1), next.step);
        for value in values {
            if last.checked_add(step) != Some(value) {
                return false;
            }
            last = value;
            next.len += 1;
        }
        next.room = next.room.max(next.len);
        *self = next;
        true
    }
}

/// A column of `u64`s: a first value and a step while the values rise by
/// it, then 16-bit, then 32-bit offsets from a base while every value
/// fits, plain values after one that does not.
#[derive(Debug, Clone)]
pub(crate) enum Column {
    Steady(Steady),
    N16(Narrow<u16>),
    N32(Narrow<u32>),
    Wide(Vec<u64>),
}

/// A borrowed range of a [`Column`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum ColumnRange<'a> {
    Steady { first: u64, step: u64, len: usize },
    N16 { base: u64, offsets: &'a [u16] },
    N32 { base: u64, offsets: &'a [u32] },
    Wide(&'a [u64]),
}

impl Column {
    /// An empty column with room for `capacity` values.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Column::Steady(Steady {
            first: 0,
            step: 0,
            len: 0,
            room: capacity,
        })
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Column::Steady(steady) => steady.len,
            Column::N16(narrow) => narrow.offsets.len(),
            Column::N32(narrow) => narrow.offsets.len(),
            Column::Wide(values) => values.len(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        match self {
            Column::Steady(steady) => steady.room,
            Column::N16(narrow) => narrow.offsets.capacity(),
            Column::N32(narrow) => narrow.offsets.capacity(),
            Column::Wide(values) => values.capacity(),
        }
    }

    /// Room for `additional` more values, exactly.
    pub(crate) fn reserve_exact(&mut self, additional: usize) {
        match self {
            Column::Steady(steady) => steady.room = steady.room.max(steady.len + additional),
            Column::N16(narrow) => narrow.offsets.reserve_exact(additional),
            Column::N32(narrow) => narrow.offsets.reserve_exact(additional),
            Column::Wide(values) => values.reserve_exact(additional),
        }
    }

    /// The value at `index` (which is held).
    #[inline]
    pub(crate) fn get(&self, index: usize) -> u64 {
        match self {
            Column::Steady(steady) => {
                assert!(index < steady.len, "index {index} of {}", steady.len);
                steady.get(index)
            }
            Column::N16(narrow) => narrow.get(index),
            Column::N32(narrow) => narrow.get(index),
            Column::Wide(values) => values[index],
        }
    }

    pub(crate) fn last(&self) -> Option<u64> {
        self.len().checked_sub(1).map(|index| self.get(index))
    }

    #[cfg(test)]
    pub(crate) fn push(&mut self, value: u64) {
        loop {
            let pushed = match self {
                Column::Steady(steady) => steady.try_extend(std::iter::once(value)),
                Column::N16(narrow) => narrow.try_push(value),
                Column::N32(narrow) => narrow.try_push(value),
                Column::Wide(values) => {
                    values.push(value);
                    true
                }
            };
            if pushed {
                return;
            }
            self.widen();
        }
    }

    /// Pushes `values`, turning the column as few times as they need.
    pub(crate) fn extend<I>(&mut self, values: I)
    where
        I: Iterator<Item = u64> + Clone,
    {
        self.grow(
            |steady| steady.try_extend(values.clone()),
            |narrow| narrow.try_extend(values.clone()),
            |narrow| narrow.try_extend(values.clone()),
            |held| held.extend(values.clone()),
        );
    }

    /// [`Column::extend`] for `values` that never fall (a planned run's
    /// stamps, payload ends): whether they fit is read from the first and
    /// the last alone. The caller has checked that they never fall.
    pub(crate) fn extend_rising<I>(&mut self, values: I)
    where
        I: DoubleEndedIterator<Item = u64> + Clone,
    {
        self.grow(
            |steady| steady.try_extend(values.clone()),
            |narrow| narrow.try_extend_rising(values.clone()),
            |narrow| narrow.try_extend_rising(values.clone()),
            |held| held.extend(values.clone()),
        );
    }

    /// Appends a piece of a delta's column, each value plus `shift`
    /// (wrapping): a steady piece at once where this column is steady and
    /// the piece goes on with its step; else value by value, as
    /// [`Column::extend_rising`] where the caller checked that the values
    /// never fall (`rising`), else as [`Column::extend`].
    pub(crate) fn extend_piece(&mut self, piece: Piece<'_>, shift: u64, rising: bool) {
        match piece {
            Piece::Steady { first, step, len } => {
                let first = first.wrapping_add(shift);
                if let Column::Steady(steady) = self {
                    if steady.try_extend_steady(first, step, len) {
                        return;
                    }
                }
                let values = (0..len as u64).map(move |i| first.wrapping_add(step.wrapping_mul(i)));
                if rising {
                    self.extend_rising(values);
                } else {
                    self.extend(values);
                }
            }
            Piece::Listed(values) => {
                let values = values.iter().map(move |value| value.wrapping_add(shift));
                if rising {
                    self.extend_rising(values);
                } else {
                    self.extend(values);
                }
            }
        }
    }

    /// Adds values the way the column's shape takes them (each narrow way
    /// adds all or none), turning it until one does.
    fn grow(
        &mut self,
        mut steady: impl FnMut(&mut Steady) -> bool,
        mut narrow16: impl FnMut(&mut Narrow<u16>) -> bool,
        mut narrow32: impl FnMut(&mut Narrow<u32>) -> bool,
        wide: impl FnOnce(&mut Vec<u64>),
    ) {
        loop {
            let added = match self {
                Column::Steady(held) => steady(held),
                Column::N16(narrow) => narrow16(narrow),
                Column::N32(narrow) => narrow32(narrow),
                Column::Wide(held) => {
                    wide(held);
                    return;
                }
            };
            if added {
                return;
            }
            self.widen();
        }
    }

    /// The values `range`, borrowed.
    pub(crate) fn range(&self, range: std::ops::RangeInclusive<usize>) -> ColumnRange<'_> {
        match self {
            Column::Steady(steady) => {
                let (start, end) = (*range.start(), *range.end());
                assert!(
                    start <= end && end < steady.len,
                    "range {start}..={end} of {}",
                    steady.len
                );
                ColumnRange::Steady {
                    first: steady.get(start),
                    step: steady.step,
                    len: end - start + 1,
                }
            }
            Column::N16(narrow) => ColumnRange::N16 {
                base: narrow.base,
                offsets: &narrow.offsets[range],
            },
            Column::N32(narrow) => ColumnRange::N32 {
                base: narrow.base,
                offsets: &narrow.offsets[range],
            },
            Column::Wide(values) => ColumnRange::Wide(&values[range]),
        }
    }

    /// Turns into the next wider shape, keeping the values and the room.
    #[cold]
    fn widen(&mut self) {
        *self = match self {
            Column::Steady(steady) => {
                // Into the narrowest shape that holds the values so far.
                let held = (0..steady.len).map(|index| steady.get(index));
                let room = steady.room.max(steady.len + 1);
                let mut n16 = Narrow::with_capacity(room);
                if n16.try_extend(held.clone()) {
                    Column::N16(n16)
                } else {
                    let mut n32 = Narrow::with_capacity(room);
                    if n32.try_extend(held.clone()) {
                        Column::N32(n32)
                    } else {
                        let mut values = Vec::with_capacity(room);
                        values.extend(held);
                        Column::Wide(values)
                    }
                }
            }
            Column::N16(narrow) => Column::N32(narrow.widen()),
            Column::N32(narrow) => {
                let mut values =
                    Vec::with_capacity(narrow.offsets.capacity().max(narrow.offsets.len() + 1));
                values.extend((0..narrow.offsets.len()).map(|index| narrow.get(index)));
                Column::Wide(values)
            }
            Column::Wide(_) => unreachable!("a wide column holds every value"),
        };
    }
}

impl ColumnRange<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            ColumnRange::Steady { len, .. } => *len,
            ColumnRange::N16 { offsets, .. } => offsets.len(),
            ColumnRange::N32 { offsets, .. } => offsets.len(),
            ColumnRange::Wide(values) => values.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the values to `out`, each plus `shift` (wrapping): a steady
    /// range as one steady piece.
    pub(crate) fn push_onto(&self, out: &mut crate::values::Values, shift: u64) {
        match *self {
            ColumnRange::Steady { first, step, len } => {
                out.push_steady(first.wrapping_add(shift), step, len);
            }
            ColumnRange::N16 { base, offsets } => push_offsets(out, base, shift, offsets),
            ColumnRange::N32 { base, offsets } => push_offsets(out, base, shift, offsets),
            ColumnRange::Wide(values) => {
                out.reserve(values.len());
                for &value in values {
                    out.push(value.wrapping_add(shift));
                }
            }
        }
    }
}

/// Pushes `base + offset + shift` for each of `offsets` onto `out`.
fn push_offsets<O: Offset>(out: &mut crate::values::Values, base: u64, shift: u64, offsets: &[O]) {
    let base = base.wrapping_add(shift);
    out.reserve(offsets.len());
    for &offset in offsets {
        out.push(base.wrapping_add(offset.to_u64()));
    }
}

#[cfg(test)]
mod tests {
    use meshlog_testkit::{seed, SplitMix64};

    use super::*;
    use crate::values::Values;

    const HALF16: u64 = <u16 as Offset>::HALF;
    const HALF32: u64 = <u32 as Offset>::HALF;

    /// A value near one of the edges a column turns at, or anywhere.
    fn value(rng: &mut SplitMix64, first: u64) -> u64 {
        let half = [HALF16, HALF32][rng.below(2) as usize];
        match rng.below(8) {
            0 => 0,
            1 => u64::MAX,
            2 => first.saturating_sub(half) + rng.below(3),
            3 => first
                .saturating_sub(half)
                .saturating_add(2 * half - 2 + rng.below(3)),
            4 => rng.next_u64(),
            _ => first.saturating_add(rng.below(1 << 20)),
        }
    }

    /// Pushed values read back as they were, whatever shape the column
    /// took, at the edges of what fits (0, `u64::MAX`, the base and 2^16
    /// and 2^32 above it).
    #[test]
    fn a_column_holds_every_value_it_was_given() {
        let seed = seed::replay_or(0xc01_5eed);
        let mut rng = SplitMix64::new(seed);
        let mut shapes = [0; 5];
        for round in 0..3_000 {
            let mut column = Column::with_capacity(rng.below(4) as usize);
            let mut model = Vec::new();
            let anywhere = match rng.below(3) {
                0 => rng.next_u64(),
                1 => rng.below(1 << 20),
                _ => rng.below(1 << 34),
            };
            let first = value(&mut rng, anywhere);
            // Now and then a steady column: values one step apart (the
            // step 0, small, or near the top of `u64`), with a value off
            // the step now and then.
            let step = match rng.below(4) {
                0 => 0,
                1 => 1 + rng.below(64),
                2 => u64::MAX / (2 + rng.below(8)),
                _ => rng.next_u64(),
            };
            let steady = rng.below(3) == 0;
            let mut at = 0u64;
            for _ in 0..rng.below(12) {
                // Mostly values close to the first, now and then one far;
                // pushed one at a time or a few at once.
                let mut values: Vec<u64> = (0..1 + rng.below(4))
                    .map(|_| {
                        at += 1;
                        if steady && rng.below(40) != 0 {
                            first.saturating_add((at - 1).saturating_mul(step))
                        } else if rng.below(10) == 0 {
                            value(&mut rng, first)
                        } else {
                            first.saturating_add(rng.below(1000))
                        }
                    })
                    .collect();
                match rng.below(5) {
                    0 => values.iter().for_each(|&next| column.push(next)),
                    1 => column.extend(values.iter().copied()),
                    2 => {
                        // Rising values, as a planned run's stamps.
                        values.sort_unstable();
                        column.extend_rising(values.iter().copied());
                    }
                    _ => {
                        // A delta's pieces (steady ones where the values
                        // go on with a step), held less a shift that each
                        // value gets back, as a delta's payload ends.
                        let rising = rng.below(2) == 0;
                        if rising {
                            values.sort_unstable();
                        }
                        let shift = [0, 1, u64::MAX, rng.next_u64()][rng.below(4) as usize];
                        let pieces = Values::from(
                            values
                                .iter()
                                .map(|v| v.wrapping_sub(shift))
                                .collect::<Vec<_>>(),
                        );
                        for piece in pieces.as_ref().pieces() {
                            column.extend_piece(piece, shift, rising);
                        }
                    }
                }
                model.extend(&values);
                assert_eq!(
                    column.last(),
                    model.last().copied(),
                    "round {round}, seed {seed}"
                );
            }
            assert_eq!(column.len(), model.len(), "round {round}, seed {seed}");
            for (index, &expected) in model.iter().enumerate() {
                assert_eq!(column.get(index), expected, "round {round}, seed {seed}");
            }
            if !model.is_empty() {
                let low = rng.below(model.len() as u64) as usize;
                let high = low + rng.below((model.len() - low) as u64) as usize;
                let mut out = Values::new();
                let range = column.range(low..=high);
                assert_eq!(range.len(), high - low + 1);
                range.push_onto(&mut out, 0);
                assert_eq!(
                    out.iter().collect::<Vec<_>>(),
                    model[low..=high],
                    "round {round}, seed {seed}"
                );
            }
            shapes[match column {
                Column::N16(_) => 0,
                Column::N32(_) => 1,
                Column::Wide(_) => 2,
                Column::Steady(Steady { len, .. }) => 3 + usize::from(len > 2),
            }] += 1;
        }
        // Every shape was read back, steady ones of more than two values
        // among them.
        assert!(shapes.iter().all(|&n| n > 100), "{shapes:?}");
    }

    /// Values within 2^15 of the first on either side stay in 16 bits,
    /// within 2^31 in 32; the column turns once per shape.
    #[test]
    fn close_values_stay_narrow() {
        let mut column = Column::with_capacity(0);
        let first = 1 << 40;
        column.push(first);
        assert!(matches!(column, Column::Steady(_)));
        for value in [first - HALF16, first + HALF16 - 1] {
            column.push(value);
            assert!(matches!(column, Column::N16(_)), "{value}");
        }
        for value in [first + HALF16, first - HALF32, first + HALF32 - 1] {
            column.push(value);
            assert!(matches!(column, Column::N32(_)), "{value}");
        }
        column.push(0);
        assert!(matches!(column, Column::Wide(_)));
        let held: Vec<u64> = (0..column.len()).map(|i| column.get(i)).collect();
        assert_eq!(
            held,
            [
                first,
                first - HALF16,
                first + HALF16 - 1,
                first + HALF16,
                first - HALF32,
                first + HALF32 - 1,
                0
            ]
        );
        // A column whose first value is small keeps everything from 0, and
        // a batch that does not fit 16 bits turns it once.
        let mut column = Column::with_capacity(0);
        column.extend([5, 0, u64::from(u16::MAX)].into_iter());
        // (Falling at the second value: not steady.)
        assert!(matches!(column, Column::N16(Narrow { base: 0, .. })));
        column.extend([1, u64::from(u32::MAX)].into_iter());
        assert!(matches!(column, Column::N32(Narrow { base: 0, .. })));
        column.extend_rising([7, u64::from(u32::MAX) + 1].into_iter());
        assert!(matches!(column, Column::Wide(_)));
        let held: Vec<u64> = (0..column.len()).map(|i| column.get(i)).collect();
        assert_eq!(
            held,
            [
                5,
                0,
                u64::from(u16::MAX),
                1,
                u64::from(u32::MAX),
                7,
                u64::from(u32::MAX) + 1
            ]
        );
    }

    /// Values one step apart stay steady, in no memory, whatever the step
    /// (0, 1, one that ends at `u64::MAX`); the first value off the step
    /// turns the column into the narrowest shape that holds them all.
    #[test]
    fn steady_values_hold_no_memory_until_one_is_off_the_step() {
        for (first, step, off, shape) in [
            (7, 0, 8, "N16"),
            (1 << 40, 1, 0, "Wide"),
            (100, 32, 100 + 32 * 300 + 1, "N16"),
            // A wide step turns straight into plain values.
            (0, u64::MAX / 4, 1, "Wide"),
            (u64::MAX - 2, 1, u64::MAX - 3, "N16"),
        ] {
            // 300 values, or as many as fit below u64::MAX.
            let len = (u64::MAX - first)
                .checked_div(step)
                .map_or(300, |most| most.saturating_add(1).min(300));
            let values: Vec<u64> = (0..len).map(|i| first + i * step).collect();
            let mut column = Column::with_capacity(256);
            // In pieces, as chunks are filled.
            for piece in values.chunks(7) {
                column.extend_rising(piece.iter().copied());
            }
            assert!(
                matches!(column, Column::Steady(Steady { room, .. }) if room == 256.max(values.len())),
                "{first} {step}: {column:?}"
            );
            let mut out = Values::new();
            column.range(1..=values.len() - 1).push_onto(&mut out, 0);
            assert_eq!(
                out.iter().collect::<Vec<_>>(),
                values[1..],
                "{first} {step}"
            );
            column.push(off);
            let turned = match column {
                Column::Steady(_) => "Steady",
                Column::N16(_) => "N16",
                Column::N32(_) => "N32",
                Column::Wide(_) => "Wide",
            };
            assert_eq!(turned, shape, "{first} {step}");
            assert!(column.capacity() > values.len(), "{first} {step}");
            let held: Vec<u64> = (0..column.len()).map(|i| column.get(i)).collect();
            assert_eq!(held[..values.len()], values[..], "{first} {step}");
            assert_eq!(held[values.len()], off);
        }
        // A step that would pass u64::MAX is off it.
        let mut column = Column::with_capacity(0);
        column.extend([u64::MAX - 1, u64::MAX].into_iter());
        assert!(matches!(column, Column::Steady(_)));
        column.push(u64::MAX);
        assert!(matches!(column, Column::N16(_)));
        assert_eq!(column.last(), Some(u64::MAX));
    }
}
