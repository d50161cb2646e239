//! Cluster allocator: a reference count per data cluster, plus free/pending/reserved counters.
//!
//! Refcounts are not stored on media: they are rebuilt from the cluster maps at open, so they can
//! never disagree with the maps.
//!
//! A cluster whose last reference goes is *pending* until the next metadata commit: it may not be
//! handed out again before the unmap is durable, or a crash could leave the old owner's map
//! pointing at a new owner's data. Likewise a cluster that lost a reference but kept others is
//! *unsettled* until then: its remaining owner must still copy on write, because after a crash the
//! dropped reference (say a clone's unflushed copy-on-write) comes back.
//!
//! A cluster is *pinned* while a data-path I/O that the caller runs outside the pool's lock
//! reads or writes it (see `Pool::begin_read` / `Pool::begin_write`). A pinned cluster whose
//! release is due stays *held* (counted as pending) until its last pin goes, so an I/O still in
//! flight never touches a cluster that was handed to someone else.

use alloc::collections::BTreeSet;
use alloc::vec;
use alloc::vec::Vec;

const PENDING: u32 = u32::MAX;

/// Capacity of the pool, in bytes. `free + used + reserved == total` always.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Bytes of data clusters.
    pub total: u64,
    /// Bytes neither referenced nor reserved (includes clusters freed since the last flush, which
    /// become allocatable when it completes: `pending_free`).
    pub free: u64,
    /// Bytes in referenced clusters.
    pub used: u64,
    /// Bytes reserved for thick volumes' unwritten clusters.
    pub reserved: u64,
    /// Part of `free` waiting for the next flush or metadata commit.
    pub pending_free: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct Allocator {
    refs: Vec<u32>,
    free: u64,
    pending: Vec<u64>,
    unsettled: BTreeSet<u64>,
    reserved: u64,
    cursor: usize,
    /// In-flight I/Os per cluster (see the module docs).
    pins: Vec<u32>,
    /// Released clusters waiting for their last pin to go.
    held: BTreeSet<u64>,
}

impl Allocator {
    pub(crate) fn new(clusters: usize) -> Self {
        Self {
            refs: vec![0; clusters],
            free: clusters as u64,
            pending: Vec::new(),
            unsettled: BTreeSet::new(),
            reserved: 0,
            cursor: 0,
            pins: vec![0; clusters],
            held: BTreeSet::new(),
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.refs.len() as u64
    }

    /// References to `c` (0 for free or pending clusters, and for out-of-range ones).
    pub(crate) fn refs(&self, c: u64) -> u32 {
        match self.slot(c).map(|i| self.refs[i]) {
            Some(PENDING) | None => 0,
            Some(n) => n,
        }
    }

    /// Whether the one map referencing `c` may write it in place: it is the only reference, durably.
    pub(crate) fn exclusive(&self, c: u64) -> bool {
        self.refs(c) == 1 && !self.unsettled.contains(&c)
    }

    /// Whether `c` exists and may be handed out now.
    pub(crate) fn is_free(&self, c: u64) -> bool {
        self.slot(c).is_some_and(|i| self.refs[i] == 0)
    }

    /// Clusters that a new reservation or allocation may still claim.
    pub(crate) fn available(&self) -> u64 {
        self.free + self.waiting() - self.reserved
    }

    /// Clusters freed but not allocatable yet: pending a commit, or held by a pin.
    fn waiting(&self) -> u64 {
        (self.pending.len() + self.held.len()) as u64
    }

    /// Marks an I/O in flight on `c`.
    pub(crate) fn pin(&mut self, c: u64) {
        if let Some(i) = self.slot(c) {
            self.pins[i] += 1;
        }
    }

    /// Ends an I/O on `c`: a held cluster becomes free with its last pin.
    pub(crate) fn unpin(&mut self, c: u64) {
        let Some(i) = self.slot(c) else { return };
        self.pins[i] = self.pins[i].saturating_sub(1);
        if self.pins[i] == 0 && self.held.remove(&c) {
            self.refs[i] = 0;
            self.free += 1;
        }
    }

    /// I/Os in flight on `c`.
    pub(crate) fn pins(&self, c: u64) -> u32 {
        self.slot(c).map_or(0, |i| self.pins[i])
    }

    pub(crate) fn free_now(&self) -> u64 {
        self.free
    }

    /// Adds a reference. `c` must be in range and not pending.
    pub(crate) fn incref(&mut self, c: u64) {
        let Some(i) = self.slot(c) else { return };
        if self.refs[i] == 0 {
            self.free -= 1;
        }
        self.refs[i] += 1;
    }

    /// Drops a reference; the last one makes the cluster pending.
    pub(crate) fn decref(&mut self, c: u64) {
        let Some(i) = self.slot(c) else { return };
        self.refs[i] -= 1;
        if self.refs[i] == 0 {
            self.refs[i] = PENDING;
            self.pending.push(c);
        } else {
            self.unsettled.insert(c);
        }
    }

    pub(crate) fn reserve(&mut self, n: u64) {
        self.reserved += n;
    }

    pub(crate) fn unreserve(&mut self, n: u64) {
        self.reserved -= n;
    }

    /// A free cluster (not pending), found from a rotating cursor so allocation spreads evenly.
    pub(crate) fn find_free(&mut self) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        let n = self.refs.len();
        let at = (self.cursor..n).chain(0..self.cursor).find(|&i| self.refs[i] == 0)?;
        self.cursor = (at + 1) % n;
        Some(at as u64)
    }

    /// Makes pending clusters allocatable and unsettled ones settled: call once the records that
    /// dropped their references are durable.
    pub(crate) fn release_pending(&mut self) {
        self.unsettled.clear();
        for c in self.pending.drain(..) {
            // Pending clusters came from `decref`, so the index is in range.
            let Some(i) = usize::try_from(c).ok().filter(|&i| i < self.refs.len()) else {
                continue;
            };
            if self.pins[i] > 0 {
                self.held.insert(c);
            } else {
                self.refs[i] = 0;
                self.free += 1;
            }
        }
    }

    pub(crate) fn capacity(&self, cluster_size: u64) -> Capacity {
        let pending = self.waiting();
        let used = self.total() - self.free - pending;
        Capacity {
            total: self.total() * cluster_size,
            free: self.available() * cluster_size,
            used: used * cluster_size,
            reserved: self.reserved * cluster_size,
            pending_free: pending * cluster_size,
        }
    }

    fn slot(&self, c: u64) -> Option<usize> {
        usize::try_from(c).ok().filter(|&i| i < self.refs.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_clusters_wait_for_release() {
        let mut a = Allocator::new(2);
        let c = a.find_free().unwrap();
        a.incref(c);
        let d = a.find_free().unwrap();
        assert_ne!(c, d);
        a.incref(d);
        assert_eq!(a.find_free(), None);
        a.decref(c);
        assert_eq!(a.find_free(), None, "pending cluster handed out before the commit");
        assert_eq!(a.available(), 1);
        a.release_pending();
        assert_eq!(a.find_free(), Some(c));
        let cap = a.capacity(10);
        assert_eq!((cap.total, cap.free, cap.used, cap.reserved), (20, 10, 10, 0));
    }

    #[test]
    fn a_pinned_cluster_is_held_past_release_until_unpinned() {
        let mut a = Allocator::new(2);
        a.incref(0);
        a.incref(1);
        a.pin(0);
        a.pin(0);
        a.decref(0);
        a.release_pending();
        assert_eq!(a.find_free(), None, "handed out while an I/O is in flight on it");
        assert_eq!(a.available(), 1, "held clusters still count as free-to-be");
        assert_eq!(a.capacity(1).pending_free, 1);
        a.unpin(0);
        assert_eq!(a.find_free(), None, "one I/O is still in flight");
        a.unpin(0);
        assert_eq!(a.find_free(), Some(0));
        let cap = a.capacity(1);
        assert_eq!((cap.free, cap.used, cap.pending_free), (1, 1, 0));
        // Unpinning a cluster whose release is not due yet frees nothing.
        a.pin(1);
        a.decref(1);
        a.unpin(1);
        assert_eq!(a.find_free(), Some(0));
        a.release_pending();
        assert_eq!(a.free_now(), 2);
    }

    #[test]
    fn a_dropped_reference_settles_at_release() {
        let mut a = Allocator::new(1);
        a.incref(0);
        a.incref(0);
        a.decref(0);
        assert!(
            !a.exclusive(0),
            "written in place before the dropped reference is durable"
        );
        a.release_pending();
        assert!(a.exclusive(0));
    }

    #[test]
    fn reservations_count_against_available() {
        let mut a = Allocator::new(4);
        a.reserve(3);
        assert_eq!(a.available(), 1);
        let cap = a.capacity(1);
        assert_eq!(cap.free + cap.used + cap.reserved, cap.total);
        a.unreserve(3);
        assert_eq!(a.available(), 4);
    }
}
