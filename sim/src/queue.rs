//! [`Queue`]: the simulated clock, a priority queue of timed events.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Timed events, popped in time order; events at the same time in the
/// order they were pushed, so a run does not depend on the heap's layout.
#[derive(Debug)]
pub struct Queue<E> {
    heap: BinaryHeap<Reverse<(Duration, u64, Slot<E>)>>,
    pushed: u64,
}

/// An event in the heap, compared by nothing (time and number decide).
#[derive(Debug)]
struct Slot<E>(E);

impl<E> PartialEq for Slot<E> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<E> Eq for Slot<E> {}
impl<E> PartialOrd for Slot<E> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Slot<E> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue {
            heap: BinaryHeap::new(),
            pushed: 0,
        }
    }
}

impl<E> Queue<E> {
    /// An empty queue.
    pub fn new() -> Self {
        Queue::default()
    }

    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Duration, event: E) {
        self.pushed += 1;
        self.heap.push(Reverse((at, self.pushed, Slot(event))));
    }

    /// The time of the next event.
    pub fn peek_time(&self) -> Option<Duration> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The next event, if it is due at or before `until`.
    pub fn pop_until(&mut self, until: Duration) -> Option<(Duration, E)> {
        if self.peek_time()? > until {
            return None;
        }
        self.heap
            .pop()
            .map(|Reverse((at, _, Slot(event)))| (at, event))
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event waits.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_in_time_order_and_ties_in_push_order() {
        let mut queue = Queue::new();
        let ms = Duration::from_millis;
        queue.push(ms(5), "late");
        queue.push(ms(1), "first");
        queue.push(ms(1), "second");
        queue.push(ms(3), "middle");
        assert_eq!(queue.pop_until(ms(0)), None);
        let order: Vec<_> = std::iter::from_fn(|| queue.pop_until(ms(4)))
            .map(|(_, e)| e)
            .collect();
        assert_eq!(order, ["first", "second", "middle"]);
        assert_eq!(queue.len(), 1);
    }
}
