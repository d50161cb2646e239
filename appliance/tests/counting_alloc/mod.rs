//! A global allocator that counts the heap allocations (and reallocations) made outside the
//! host's threads, i.e. the target's: shared by the data-path bench and the allocating-write
//! test. A binary that declares `mod counting_alloc;` gets it as its global allocator; threads
//! that run the host side call [`mark_host_thread`] (a runtime's `on_thread_start`).
// A `GlobalAlloc` impl is unsafe by definition.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

struct Counting;

static TARGET_ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the host runtime's threads.
    static ON_HOST: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as the host's: its allocations are not counted.
pub fn mark_host_thread() {
    ON_HOST.with(|h| h.set(true));
}

/// Allocations made outside the host's threads so far.
pub fn target_allocs() -> u64 {
    TARGET_ALLOCS.load(Ordering::Relaxed)
}

fn count() {
    if !ON_HOST.try_with(Cell::get).unwrap_or(true) {
        TARGET_ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only an
// atomic and a const-initialised thread local (neither allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;
