//! [`CountingAlloc`]: a global allocator that counts, per thread, the heap
//! bytes live, their peak and the number of allocations, so a test can hold
//! work to a memory bound and a bench can report bytes per event.
//!
//! Counts are kept per thread because the test harness runs tests on
//! parallel threads: a process-wide count would charge one test with
//! another's allocations. Memory freed on another thread than the one that
//! allocated it is counted where it is freed, so a measured closure should
//! do its work on its own thread (or join what it spawns and measure only
//! the bytes it keeps).
//!
//! A test binary installs it once, at its top level:
//!
//! ```
//! use meshlog_testkit::alloc::{self, CountingAlloc};
//!
//! #[global_allocator]
//! static ALLOCATOR: CountingAlloc = CountingAlloc;
//!
//! fn main() {
//!     let (len, measured) = alloc::measure(|| vec![0u8; 4096].len());
//!     assert_eq!(len, 4096);
//!     assert!(measured.bytes_peak >= 4096);
//!     assert_eq!(measured.bytes_net, 0, "the vector was freed inside");
//!     assert!(measured.allocations >= 1);
//! }
//! ```
//!
//! (`fuzz/src/alloc.rs` keeps its own process-wide counter: the fuzz crate is
//! outside the workspace and runs one input at a time.)

// The one module of the kit that needs `unsafe`: implementing `GlobalAlloc`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;

/// Forwards every call to the system allocator unchanged, counting on the
/// side in this thread's counters (see the [module docs](self)).
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

thread_local! {
    // Const-initialized, so reading them never allocates (which would
    // recurse into the allocator).
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Adds `bytes` (negative: freed) to this thread's live count.
fn count(bytes: i64) {
    // `try_with`: the allocator also runs while a thread's locals are being
    // torn down, when they can no longer be reached; those bytes go
    // uncounted.
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + bytes);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

fn count_allocation() {
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded to the system allocator with its
// arguments unchanged and its result returned unchanged; the counting on the
// side touches only const-initialized thread locals, which never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            count(layout.size() as i64);
            count_allocation();
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(layout.size() as i64);
            count_allocation();
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // New before old: while a block moves both are live, and the
            // peak should say so.
            count(new_size as i64);
            count(-(layout.size() as i64));
            count_allocation();
        }
        new
    }
}

/// What [`measure`] saw on this thread while its closure ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Measured {
    /// The highest live heap bytes reached, above what was live before.
    pub bytes_peak: i64,
    /// Live heap bytes after, minus before: what the closure kept (its
    /// output included), negative if it freed more than it allocated.
    pub bytes_net: i64,
    /// Allocations made (each `alloc`, `alloc_zeroed` and `realloc`).
    pub allocations: u64,
}

/// Heap bytes live on this thread: allocated here and not yet freed here
/// (see the [module docs](self) on memory crossing threads).
pub fn live_bytes() -> i64 {
    LIVE.with(Cell::get)
}

/// Allocations made on this thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Whether [`CountingAlloc`] is this binary's global allocator.
pub fn is_installed() -> bool {
    let before = allocations();
    drop(black_box(Box::new(0u64)));
    allocations() != before
}

/// Runs `work` on this thread and returns its output with what it
/// allocated (see [`Measured`]). Measurements nest: an outer one's peak
/// includes an inner one's.
///
/// # Panics
///
/// If [`CountingAlloc`] is not the global allocator: every count would be
/// zero, and a memory bound would pass without measuring anything.
pub fn measure<T>(work: impl FnOnce() -> T) -> (T, Measured) {
    assert!(
        is_installed(),
        "alloc::measure needs `#[global_allocator] static A: CountingAlloc = CountingAlloc;` \
         in the test binary"
    );
    let live_before = live_bytes();
    let allocations_before = allocations();
    let peak_outer = PEAK.with(|peak| peak.replace(live_before));
    let out = work();
    let peak = PEAK.with(Cell::get);
    PEAK.with(|p| p.set(peak.max(peak_outer)));
    let measured = Measured {
        bytes_peak: peak - live_before,
        bytes_net: live_bytes() - live_before,
        allocations: allocations() - allocations_before,
    };
    (out, measured)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_sees_the_peak_the_net_and_the_count() {
        assert!(is_installed());
        let (kept, measured) = measure(|| {
            let scratch = black_box(vec![1u8; 10_000]);
            drop(scratch);
            black_box(vec![2u8; 100])
        });
        assert_eq!(kept.len(), 100);
        assert!(
            (10_000..10_000 + 1_024).contains(&measured.bytes_peak),
            "{measured:?}"
        );
        assert_eq!(measured.bytes_net, 100);
        assert_eq!(measured.allocations, 2);
    }

    #[test]
    fn a_growing_vector_counts_each_move_and_ends_at_its_capacity() {
        let (grown, measured) = measure(|| {
            let mut grown = Vec::new();
            for i in 0..1_000u32 {
                grown.push(i);
            }
            grown
        });
        assert_eq!(measured.bytes_net, (grown.capacity() * 4) as i64);
        assert!(measured.allocations > 1, "{measured:?}");
        assert!(measured.bytes_peak >= measured.bytes_net);
    }

    #[test]
    fn an_outer_measurement_keeps_an_inner_peak() {
        let ((), outer) = measure(|| {
            let ((), inner) = measure(|| drop(black_box(vec![0u8; 50_000])));
            assert!(inner.bytes_peak >= 50_000);
        });
        assert!(outer.bytes_peak >= 50_000, "{outer:?}");
        assert_eq!(outer.bytes_net, 0);
    }

    #[test]
    fn another_threads_allocations_are_not_counted_here() {
        let ((), measured) = measure(|| {
            std::thread::spawn(|| black_box(vec![0u8; 1 << 20]).len())
                .join()
                .unwrap();
        });
        assert!(measured.bytes_peak < 1 << 20, "{measured:?}");
    }
}
