//! `Column`: a column of `u64`s held in 4 bytes a value where it can be.
//!
//! A memory log chunk's columns (stamps, times, payload ends) hold values
//! that lie close together: 256 consecutive events of one stream. Each is
//! kept as a 32-bit offset from a base picked at the first value (2^31
//! below it, so values on either side of the first fit), and the column
//! turns into plain `u64`s, once, at the first value that does not fit:
//! a stamp jump or a clock step of over 2^31 within a chunk, or a chunk's
//! payloads past 2 GiB. Half the bytes of plain `u64`s for every chunk
//! that never turns, and the same values either way.

/// Offsets reach this far on either side of a column's first value.
const HALF: u64 = 1 << 31;

/// A column of `u64`s: 32-bit offsets from a base while every value fits,
/// plain values after one that did not.
#[derive(Debug, Clone)]
pub(crate) enum Column {
    /// Every value is `base + offset` (`base` is set by the first push).
    Narrow { base: u64, offsets: Vec<u32> },
    /// Every value as it is.
    Wide(Vec<u64>),
}

/// A borrowed range of a [`Column`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum ColumnRange<'a> {
    Narrow { base: u64, offsets: &'a [u32] },
    Wide(&'a [u64]),
}

impl Column {
    /// An empty column with room for `capacity` values.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Column::Narrow {
            base: 0,
            offsets: Vec::with_capacity(capacity),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Column::Narrow { offsets, .. } => offsets.len(),
            Column::Wide(values) => values.len(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        match self {
            Column::Narrow { offsets, .. } => offsets.capacity(),
            Column::Wide(values) => values.capacity(),
        }
    }

    /// Room for `additional` more values, exactly.
    pub(crate) fn reserve_exact(&mut self, additional: usize) {
        match self {
            Column::Narrow { offsets, .. } => offsets.reserve_exact(additional),
            Column::Wide(values) => values.reserve_exact(additional),
        }
    }

    /// The value at `index` (which is held).
    #[inline]
    pub(crate) fn get(&self, index: usize) -> u64 {
        match self {
            Column::Narrow { base, offsets } => base + u64::from(offsets[index]),
            Column::Wide(values) => values[index],
        }
    }

    pub(crate) fn last(&self) -> Option<u64> {
        self.len().checked_sub(1).map(|index| self.get(index))
    }

    #[inline]
    pub(crate) fn push(&mut self, value: u64) {
        match self {
            Column::Narrow { base, offsets } => {
                if offsets.is_empty() {
                    *base = value.saturating_sub(HALF);
                }
                match value
                    .checked_sub(*base)
                    .and_then(|offset| u32::try_from(offset).ok())
                {
                    Some(offset) => offsets.push(offset),
                    None => {
                        self.widen();
                        self.push(value);
                    }
                }
            }
            Column::Wide(values) => values.push(value),
        }
    }

    /// Pushes `values`: when they all fit, checked in one pass and
    /// written in another (each a tight loop), else one by one.
    pub(crate) fn extend<I>(&mut self, values: I)
    where
        I: Iterator<Item = u64> + Clone,
    {
        match self {
            Column::Narrow { base, offsets } => {
                let mut probe = values.clone();
                let Some(first) = probe.next() else {
                    return;
                };
                if offsets.is_empty() {
                    *base = first.saturating_sub(HALF);
                }
                let base = *base;
                let fits = |value: u64| value >= base && value - base <= u64::from(u32::MAX);
                if fits(first) && probe.all(fits) {
                    offsets.extend(values.map(|value| (value - base) as u32));
                    return;
                }
            }
            Column::Wide(held) => {
                held.extend(values);
                return;
            }
        }
        for value in values {
            self.push(value);
        }
    }

    /// The values `range`, borrowed.
    pub(crate) fn range(&self, range: std::ops::RangeInclusive<usize>) -> ColumnRange<'_> {
        match self {
            Column::Narrow { base, offsets } => ColumnRange::Narrow {
                base: *base,
                offsets: &offsets[range],
            },
            Column::Wide(values) => ColumnRange::Wide(&values[range]),
        }
    }

    /// [`Column::extend`] for `values` that never fall (a planned run's
    /// stamps, payload ends): whether they fit is read from the first and
    /// the last alone. The caller has checked that they never fall.
    pub(crate) fn extend_rising<I>(&mut self, values: I)
    where
        I: DoubleEndedIterator<Item = u64> + Clone,
    {
        if let Column::Narrow { base, offsets } = self {
            let (Some(first), Some(last)) = (values.clone().next(), values.clone().next_back())
            else {
                return;
            };
            debug_assert!(first <= last, "rising values");
            if offsets.is_empty() {
                *base = first.saturating_sub(HALF);
            }
            let base = *base;
            if first >= base && last - base <= u64::from(u32::MAX) {
                offsets.extend(values.map(|value| (value - base) as u32));
                return;
            }
        }
        self.extend(values);
    }

    /// Turns into plain values, keeping the capacity.
    #[cold]
    fn widen(&mut self) {
        if let Column::Narrow { base, offsets } = self {
            let mut values = Vec::with_capacity(offsets.capacity().max(offsets.len() + 1));
            values.extend(offsets.iter().map(|&offset| *base + u64::from(offset)));
            *self = Column::Wide(values);
        }
    }
}

impl ColumnRange<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            ColumnRange::Narrow { offsets, .. } => offsets.len(),
            ColumnRange::Wide(values) => values.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the values to `out`, each through `map`.
    #[inline]
    pub(crate) fn extend_into<T>(&self, out: &mut Vec<T>, map: impl Fn(u64) -> T) {
        match self {
            ColumnRange::Narrow { base, offsets } => {
                out.extend(offsets.iter().map(|&offset| map(base + u64::from(offset))));
            }
            ColumnRange::Wide(values) => out.extend(values.iter().map(|&value| map(value))),
        }
    }
}

#[cfg(test)]
mod tests {
    use meshlog_testkit::{seed, SplitMix64};

    use super::*;

    /// A value near one of the edges a column turns at, or anywhere.
    fn value(rng: &mut SplitMix64, first: u64) -> u64 {
        match rng.below(8) {
            0 => 0,
            1 => u64::MAX,
            2 => first.saturating_sub(HALF) + rng.below(3),
            3 => first
                .saturating_sub(HALF)
                .saturating_add(u64::from(u32::MAX) - 1 + rng.below(3)),
            4 => rng.next_u64(),
            _ => first.saturating_add(rng.below(1 << 20)),
        }
    }

    /// Pushed values read back as they were, narrow or turned wide, at the
    /// edges of what fits (0, `u64::MAX`, the base and 2^32 above it).
    #[test]
    fn a_column_holds_every_value_it_was_given() {
        let seed = seed::replay_or(0xc01_5eed);
        let mut rng = SplitMix64::new(seed);
        let (mut narrow, mut wide) = (0, 0);
        for round in 0..2_000 {
            let mut column = Column::with_capacity(rng.below(4) as usize);
            let mut model = Vec::new();
            let anywhere = rng.next_u64();
            let first = value(&mut rng, anywhere);
            for _ in 0..rng.below(12) {
                // Mostly values close to the first, now and then one far;
                // pushed one at a time or a few at once.
                let mut values: Vec<u64> = (0..1 + rng.below(4))
                    .map(|_| {
                        if rng.below(10) == 0 {
                            value(&mut rng, first)
                        } else {
                            first.saturating_add(rng.below(1000))
                        }
                    })
                    .collect();
                match rng.below(3) {
                    0 => values.iter().for_each(|&next| column.push(next)),
                    1 => column.extend(values.iter().copied()),
                    _ => {
                        // Rising values, as a planned run's stamps.
                        let mut rising = values.clone();
                        rising.sort_unstable();
                        values = rising;
                        column.extend_rising(values.iter().copied());
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
                let mut out = Vec::new();
                let range = column.range(low..=high);
                assert_eq!(range.len(), high - low + 1);
                range.extend_into(&mut out, |v| v);
                assert_eq!(out, model[low..=high], "round {round}, seed {seed}");
            }
            match column {
                Column::Narrow { .. } => narrow += 1,
                Column::Wide(_) => wide += 1,
            }
        }
        // Both shapes were read back.
        assert!(narrow > 100 && wide > 100, "{narrow} narrow, {wide} wide");
    }

    /// Values within 2^31 of the first on either side stay narrow.
    #[test]
    fn close_values_stay_narrow() {
        let mut column = Column::with_capacity(0);
        for value in [1 << 40, (1 << 40) - HALF, (1 << 40) + HALF - 1, 0] {
            column.push(value);
            if value != 0 {
                assert!(matches!(column, Column::Narrow { .. }), "{value}");
            }
        }
        assert!(matches!(column, Column::Wide(_)));
        assert_eq!(column.get(3), 0);
        assert_eq!(column.get(0), 1 << 40);
        // A column whose first value is small keeps everything from 0.
        let mut column = Column::with_capacity(0);
        column.extend([5, 0, u64::from(u32::MAX)].into_iter());
        assert!(matches!(column, Column::Narrow { base: 0, .. }));
        column.push(u64::from(u32::MAX) + 1);
        assert!(matches!(column, Column::Wide(_)));
        assert_eq!(column.get(3), u64::from(u32::MAX) + 1);
    }
}
