//! The data path's steady state allocates nothing: a read and an in-place write through
//! `begin_read` / `begin_write` and `complete`, and a first write of a cluster once the volume's
//! map has room for it, counted by a global allocator.
// The counting allocator needs `unsafe impl GlobalAlloc`; it only forwards to `System`.
#![allow(unsafe_code)]
// Host-only test code on 64-bit machines: byte counts of test devices fit in usize.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{ram_pool, write, CLUSTER};
use edgevol_core::*;

const CS: u64 = CLUSTER as u64;

std::thread_local! {
    /// Allocations by this thread (other test threads do not count).
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Counts allocations (and reallocations) per thread, then forwards to the system allocator.
struct Counting;

// SAFETY: every call forwards unchanged to `System`, which upholds `GlobalAlloc`'s contract; the
// counter is a const-initialized thread-local without destructor, so touching it never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// A read of two clusters and an in-place write across a cluster boundary, as the appliance's
/// data path does them (16-segment arrays), each completed.
fn read_and_write(pool: &mut Pool<RamDevice>, vol: VolumeId) {
    let mut rsegs = [ReadSegment::Zero { len: 0 }; 16];
    let (n, ticket) = pool.begin_read(vol, 0, 2 * CS, &mut rsegs).unwrap();
    assert_eq!(rsegs[..n].iter().map(ReadSegment::len).sum::<u64>(), 2 * CS);
    pool.complete(ticket);

    let mut wsegs = [WriteSegment::EMPTY; 16];
    let (n, ticket) = pool.begin_write(vol, CS - 512, 1024, &mut wsegs).unwrap();
    assert_eq!(n, 2);
    assert!(ticket.detachable(), "in place");
    pool.complete(ticket);
}

#[test]
fn a_steady_state_read_and_in_place_write_allocate_nothing() {
    let mut pool = ram_pool(16);
    let vol = pool.create_volume(VolumeSpec::new("v", 4 * CS)).unwrap();
    write(&mut pool, vol, 0, &vec![7; 4 * CS as usize]).unwrap();
    pool.flush().unwrap();
    // Warm-up.
    read_and_write(&mut pool, vol);

    let before = allocations();
    read_and_write(&mut pool, vol);
    assert_eq!(allocations() - before, 0, "begin_read/begin_write/complete allocated");
    assert_eq!(pool.writes_in_flight(), 0);
}

/// A pool of `clusters` 4 KiB clusters with room in its journal for thousands of records (so no
/// checkpoint runs in the measured window), in an epoch, so `persist` commits soft as in the
/// appliance, and one thin volume over all of it.
fn roomy_pool(clusters: u64) -> (Pool<RamDevice>, VolumeId) {
    let mut opts = common::options(1);
    opts.journal_bytes = 4 << 20;
    opts.checkpoint_bytes = 4 << 20;
    let blocks = 2 + 4 * 8192 + 8 + clusters * u64::from(CLUSTER / 512);
    let mut pool = Pool::format(RamDevice::new(512, blocks), opts).unwrap();
    pool.set_epoch(Epoch([0xA; 16])).unwrap();
    let vol = pool.create_volume(VolumeSpec::new("v", clusters * CS)).unwrap();
    (pool, vol)
}

/// The first 4 KiB write of cluster `c`, as the data path does it: map, complete, persist.
fn allocating_write(pool: &mut Pool<RamDevice>, vol: VolumeId, c: u64) {
    let mut segs = [WriteSegment::EMPTY; 16];
    let (n, ticket) = pool.begin_write(vol, c * CS, 4096, &mut segs).unwrap();
    assert_eq!(n, 1);
    assert!(!ticket.detachable(), "cluster {c} was not allocated");
    pool.complete(ticket);
    let persist = pool.persist_ticket();
    pool.persist(persist).unwrap();
}

#[test]
fn allocating_writes_allocate_nothing_once_the_map_has_room_for_them() {
    let (mut pool, vol) = roomy_pool(4096);
    // Warm-up: the journal's frame buffer, and two spans of the map (each covers 256 clusters:
    // the first write in it makes it).
    allocating_write(&mut pool, vol, 0);
    allocating_write(&mut pool, vol, 1024);
    let before = allocations();
    for c in (1..200).chain(1025..1200) {
        allocating_write(&mut pool, vol, c);
    }
    assert_eq!(allocations() - before, 0, "first writes of clusters allocated");

    // Across the whole volume, in order: one allocation per span opened, not per few clusters
    // (a B-tree of single mappings grew a node every six or so).
    let before = allocations();
    let writes = (200..1024).chain(1200..4096).count() as u64;
    for c in (200..1024).chain(1200..4096) {
        allocating_write(&mut pool, vol, c);
    }
    let per_write = (allocations() - before) as f64 / writes as f64;
    assert!(per_write < 0.01, "{per_write} allocations per allocating write");
}
