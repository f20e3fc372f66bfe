//! `Order`: a sorted map from `u128` keys to values, laid out for scans.
//!
//! The log's events in page order. A `BTreeMap` fills its nodes about half
//! when keys arrive in ascending order (which is how events mostly arrive) and
//! scatters them over the heap; a walk over a large log then misses the cache
//! on most events. `Order` keeps entries in sorted chunks of up to
//! `CHUNK_LEN_MAX` contiguous entries: an entry at the end of the last chunk
//! (the common case) is a push, a full last chunk starts a new one, an entry
//! in the middle (a late event) is an insertion into one chunk, which splits
//! in half when full. A scan reads entries in memory order.

/// The most entries one chunk holds.
const CHUNK_LEN_MAX: usize = 512;

#[derive(Debug)]
pub(crate) struct Order<V> {
    /// Non-empty chunks, each sorted, every key of one below every key of
    /// the next.
    chunks: Vec<Vec<(u128, V)>>,
    len: usize,
}

impl<V> Default for Order<V> {
    fn default() -> Self {
        Order {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<V> Order<V> {
    /// The chunk that holds `key` or would: the last chunk whose first key
    /// is at or below it (the first chunk for a key below everything).
    fn chunk_for(&self, key: u128) -> usize {
        self.chunks
            .partition_point(|chunk| chunk[0].0 <= key)
            .saturating_sub(1)
    }

    /// The position of `key`: the chunk, then `Ok(index)` if present or
    /// `Err(index)` where it would go.
    fn find(&self, key: u128) -> Option<(usize, Result<usize, usize>)> {
        if self.chunks.is_empty() {
            return None;
        }
        let c = self.chunk_for(key);
        Some((c, self.chunks[c].binary_search_by_key(&key, |e| e.0)))
    }

    pub(crate) fn get(&self, key: u128) -> Option<&V> {
        match self.find(key)? {
            (c, Ok(i)) => Some(&self.chunks[c][i].1),
            _ => None,
        }
    }

    /// Inserts; returns the value it replaced, if any.
    pub(crate) fn insert(&mut self, key: u128, value: V) -> Option<V> {
        let Some((c, at)) = self.find(key) else {
            self.chunks.push(new_chunk(key, value));
            self.len += 1;
            return None;
        };
        let i = match at {
            Ok(i) => return Some(std::mem::replace(&mut self.chunks[c][i].1, value)),
            Err(i) => i,
        };
        self.len += 1;
        let is_last = c + 1 == self.chunks.len();
        let chunk = &mut self.chunks[c];
        if chunk.len() < CHUNK_LEN_MAX {
            chunk.insert(i, (key, value));
        } else if i == chunk.len() && is_last {
            // Past the end of a full last chunk: the ascending case.
            self.chunks.push(new_chunk(key, value));
        } else {
            let mut upper = Vec::with_capacity(CHUNK_LEN_MAX);
            upper.extend(chunk.drain(CHUNK_LEN_MAX / 2..));
            if i <= chunk.len() {
                chunk.insert(i, (key, value));
            } else {
                upper.insert(i - chunk.len(), (key, value));
            }
            self.chunks.insert(c + 1, upper);
        }
        None
    }

    /// Removes every key in `keys` (ascending), calling `removed` for each
    /// entry removed, in one pass per chunk touched.
    pub(crate) fn remove_sorted(&mut self, keys: &[u128], mut removed: impl FnMut(u128, V)) {
        let mut keys = keys.iter().copied().peekable();
        let mut c = match keys.peek() {
            Some(&first) if !self.chunks.is_empty() => self.chunk_for(first),
            _ => return,
        };
        while c < self.chunks.len() && keys.peek().is_some() {
            let chunk = std::mem::take(&mut self.chunks[c]);
            let last = chunk[chunk.len() - 1].0;
            let mut kept = Vec::with_capacity(chunk.capacity());
            for (key, value) in chunk {
                while keys.next_if(|&k| k < key).is_some() {}
                if keys.next_if_eq(&key).is_some() {
                    self.len -= 1;
                    removed(key, value);
                } else {
                    kept.push((key, value));
                }
            }
            while keys.next_if(|&k| k <= last).is_some() {}
            if kept.is_empty() {
                self.chunks.remove(c);
            } else {
                self.chunks[c] = kept;
                c += 1;
            }
            if let Some(&next) = keys.peek() {
                c = c.max(self.chunk_for(next));
            }
        }
    }

    /// The entries with keys at or above `from`, in key order.
    pub(crate) fn range_from(&self, from: u128) -> Range<'_, V> {
        let (chunk, index) = match self.find(from) {
            None => (0, 0),
            Some((c, Ok(i) | Err(i))) => (c, i),
        };
        Range {
            order: self,
            chunk,
            index,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }
}

fn new_chunk<V>(key: u128, value: V) -> Vec<(u128, V)> {
    let mut chunk = Vec::with_capacity(CHUNK_LEN_MAX);
    chunk.push((key, value));
    chunk
}

/// A scan over an [`Order`] from a key.
pub(crate) struct Range<'a, V> {
    order: &'a Order<V>,
    chunk: usize,
    index: usize,
}

impl<'a, V> Iterator for Range<'a, V> {
    type Item = (u128, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let chunk = self.order.chunks.get(self.chunk)?;
            if let Some((key, value)) = chunk.get(self.index) {
                self.index += 1;
                return Some((*key, value));
            }
            self.chunk += 1;
            self.index = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use meshlog_testkit::{seed, SplitMix64};

    use super::*;

    /// Random inserts (mostly ascending, some anywhere), batched removals
    /// and scans, checked against a `BTreeMap` after every step. Seeded.
    #[test]
    fn order_behaves_like_a_btree_map() {
        let seed = seed::replay_or(0x0bde_5eed);
        let mut rng = SplitMix64::new(seed);
        let mut next = move || rng.next_u64();
        for case in 0..20 {
            let mut order = Order::default();
            let mut model = BTreeMap::new();
            let mut top = 0u128;
            for step in 0..3_000 {
                let context = format!("case {case} step {step}: replay with MESHLOG_SEED={seed}");
                match next() % 10 {
                    0..=5 => {
                        top += 1 + u128::from(next() % 3);
                        assert_eq!(
                            order.insert(top, step),
                            model.insert(top, step),
                            "{context}"
                        );
                    }
                    6 | 7 => {
                        let key = u128::from(next()) % (top + 2);
                        assert_eq!(
                            order.insert(key, step),
                            model.insert(key, step),
                            "{context}"
                        );
                    }
                    8 => {
                        let mut keys: Vec<u128> = (0..next() % 600)
                            .map(|_| u128::from(next()) % (top + 2))
                            .collect();
                        keys.sort_unstable();
                        keys.dedup();
                        let mut got = Vec::new();
                        order.remove_sorted(&keys, |k, v| got.push((k, v)));
                        let want: Vec<_> = keys
                            .iter()
                            .filter_map(|k| model.remove(k).map(|v| (*k, v)))
                            .collect();
                        assert_eq!(got, want, "{context}");
                    }
                    _ => {
                        let from = u128::from(next()) % (top + 2);
                        let got: Vec<_> = order.range_from(from).map(|(k, v)| (k, *v)).collect();
                        let want: Vec<_> = model.range(from..).map(|(k, v)| (*k, *v)).collect();
                        assert_eq!(got, want, "{context}");
                        assert_eq!(order.get(from), model.get(&from), "{context}");
                    }
                }
                assert_eq!(order.len(), model.len(), "{context}");
                assert!(order
                    .chunks
                    .iter()
                    .all(|c| !c.is_empty() && c.len() <= CHUNK_LEN_MAX));
            }
        }
    }
}
