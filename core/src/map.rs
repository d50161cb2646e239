//! The data path: translate (volume, byte offset, length) into device offsets.
//!
//! Lookups (`map_read`, and `map_write` on clusters the volume already owns alone) allocate
//! nothing and cost one B-tree lookup per cluster. `map_write` allocates clusters on first write
//! and for copy-on-write, and `trim` unmaps; those changes survive a crash of the process once
//! [`Pool::persist`] returned for a ticket covering them, and a power cut after the next
//! [`Pool::flush`], [`Pool::sync`] or control-path commit (the crate docs' durability rule).
//!
//! # I/O outside the pool's lock
//!
//! A caller that shares the pool between threads behind a lock may run the device I/O of a
//! command after releasing the lock, through its own device handle, if it maps the command with
//! [`Pool::begin_read`] / [`Pool::begin_write`] and hands the returned [`IoTicket`] back to
//! [`Pool::complete`] (under the lock again) once that I/O has ended:
//!
//! - **Pins.** A ticket pins the physical clusters its I/O touches (a read's data clusters; a
//!   write's target clusters and copy-on-write sources). A pinned cluster freed meanwhile (trim,
//!   Write Zeroes, volume or snapshot deletion, then a flush) stays *held* until its last pin
//!   goes: it is never handed to another volume while an I/O may still read or write it. A read
//!   racing a trim returns the old data or zeros; a write racing a trim lands in the orphaned
//!   cluster (as if it came first). Both are orders NVMe allows for commands in flight together.
//! - **Only in-place writes detach.** A write that allocated a cluster (first write, or
//!   copy-on-write) publishes the new mapping at once, before the cluster holds its data, so it
//!   must do its [`Prepare`] steps and data writes before the pool is used by anyone else (under
//!   the lock): [`IoTicket::detachable`] is false for it. Writes into clusters the volume already
//!   owns alone, and all reads, are detachable.
//! - **Snapshots wait for in-flight writes.** An operation that makes a volume's clusters shared
//!   (create snapshot, group snapshot, clone of a volume) first waits, through the caller's
//!   [`Quiesce`] hook, until every outstanding write ticket's data has reached the device: an
//!   in-place write landing after the snapshot would otherwise change the snapshot. The snapshot
//!   therefore contains every write completed before it was taken and every write in flight at
//!   that moment, and nothing written after it returns. The hook must not need the pool's lock.
//! - **Durability is unchanged.** Every mapping a detached write uses was made (and its cluster
//!   prepared) under the lock, and every hard commit flushes the device before writing records
//!   when data was mapped since the last one, so a durable mapping never points at data that is
//!   not; data still in flight at a commit is, like any unacknowledged write, either there or not
//!   after a power cut. A detached write takes its [`PersistTicket`] under the lock, with its
//!   ticket, and persists it after [`Pool::complete`] like any write: the ticket covers the
//!   allocation that gave the volume its cluster, whose data I/O had completed under the lock, so
//!   [`Pool::persist`]'s precondition holds while detached in-place writes are in flight.

use crate::device::BlockDevice;
use crate::error::{Error, Limit, Range, Result};
use crate::id::{ImageId, VolumeId};
use crate::pool::{Commit, Epoch, PersistTicket, Pool};
use crate::record::Record;
use crate::volume::{ClusterMap, Provisioning};

/// Part of a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSegment {
    /// Read `len` bytes at `device_offset`.
    Data {
        /// Byte offset on the device.
        device_offset: u64,
        /// Bytes.
        len: u64,
    },
    /// `len` bytes that were never written (or were trimmed): return zeros.
    Zero {
        /// Bytes.
        len: u64,
    },
}

impl ReadSegment {
    /// Bytes this segment covers.
    pub fn len(&self) -> u64 {
        match *self {
            Self::Data { len, .. } | Self::Zero { len } => len,
        }
    }

    /// Whether it covers nothing (never produced by [`ReadMap`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Iterator over the segments of a read, merging physically contiguous clusters. Allocation-free.
#[derive(Debug, Clone)]
pub struct ReadMap<'a> {
    map: &'a ClusterMap,
    cluster_size: u64,
    data_offset: u64,
    pos: u64,
    end: u64,
}

impl Iterator for ReadMap<'_> {
    type Item = ReadSegment;

    fn next(&mut self) -> Option<ReadSegment> {
        if self.pos >= self.end {
            return None;
        }
        let cs = self.cluster_size;
        let first = self.map.get(self.pos / cs);
        let start = self.pos;
        // Extend while the next cluster continues the same run (hole after hole, or pc + 1).
        let mut expect = first;
        while self.pos < self.end && self.map.get(self.pos / cs) == expect {
            self.pos = (self.pos / cs + 1).saturating_mul(cs).min(self.end);
            expect = expect.map(|pc| pc + 1);
        }
        let len = self.pos - start;
        Some(match first {
            Some(pc) => ReadSegment::Data {
                device_offset: self.data_offset + pc * cs + start % cs,
                len,
            },
            None => ReadSegment::Zero { len },
        })
    }
}

/// What the caller must do to a freshly allocated cluster before (or together with) writing its
/// data, so the bytes of the cluster it does not write are right. Clusters are
/// [`Pool::cluster_size`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepare {
    /// Nothing: the cluster was already the volume's, or the write covers it whole.
    None,
    /// New cluster at `device_offset`: write zeros to the parts the write does not cover.
    Zero {
        /// Byte offset of the cluster on the device.
        device_offset: u64,
    },
    /// Copy-on-write: copy the cluster at `from` to `to` (the parts the write does not cover
    /// suffice), then write. The old cluster stays with the snapshots or clones sharing it.
    Copy {
        /// Byte offset of the shared cluster.
        from: u64,
        /// Byte offset of the new cluster.
        to: u64,
    },
}

/// Part of a write: within one cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteSegment {
    /// Byte offset in the volume.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Where those bytes go on the device.
    pub device_offset: u64,
    /// What to do first.
    pub prepare: Prepare,
}

impl WriteSegment {
    /// An empty segment, to fill arrays passed to [`Pool::map_write`].
    pub const EMPTY: Self = Self {
        offset: 0,
        len: 0,
        device_offset: 0,
        prepare: Prepare::None,
    };
}

/// What core needs from a caller that runs write I/O outside the pool's lock (see the module
/// docs of the data path).
pub trait Quiesce: Send + Sync + core::fmt::Debug {
    /// Returns once no device write of any outstanding write ticket is still running (each has
    /// ended, successfully or not; its ticket may not be completed yet). Called with the pool
    /// borrowed mutably, so it must not wait for the pool itself.
    fn wait_writes_landed(&self);
}

impl<T: Quiesce + ?Sized> Quiesce for alloc::sync::Arc<T> {
    fn wait_writes_landed(&self) {
        (**self).wait_writes_landed();
    }
}

/// Most runs of pinned clusters a ticket holds. A read segment is one physically contiguous run
/// and a write segment pins at most two clusters (its target and a copy-on-write source), so a
/// read of up to `TICKET_RUNS` segments and a write of up to [`WRITE_SEGMENTS`] segments always
/// fit; larger requests are cut short (see `begin_read` / `begin_write`), which their "call
/// again for the rest" contract allows. Few, because a ticket travels by value with its command
/// through a target's paths (onto an io_uring and back): 8 runs keep it at 136 bytes, and one
/// ticket still covers a 4 KiB to 1 MiB command over one or two clusters.
const TICKET_RUNS: usize = 8;

// A build fails if a ticket outgrows what the comment above says it costs.
const _: () = assert!(core::mem::size_of::<IoTicket>() <= 144);

/// Most segments one [`Pool::begin_write`] fills: two runs each fit a ticket.
const WRITE_SEGMENTS: usize = TICKET_RUNS / 2;

/// An I/O in flight on clusters core has pinned: pass it to [`Pool::complete`] once the device
/// I/O has ended (or will never start). A ticket dropped instead keeps its clusters pinned until
/// the pool is reopened: safe, but their space is not reused. Holds its runs inline: taking and
/// completing one allocates nothing.
#[must_use = "pass the ticket to Pool::complete once the I/O has ended"]
#[derive(Debug, PartialEq, Eq)]
pub struct IoTicket {
    /// Pinned physical clusters, as runs (first, count).
    runs: Runs,
    write: bool,
    detachable: bool,
}

/// Up to [`TICKET_RUNS`] runs (first, count), inline. Not `Clone`, like the ticket holding it:
/// each pin is released once.
struct Runs {
    buf: [(u64, u64); TICKET_RUNS],
    len: usize,
}

impl Runs {
    const EMPTY: Self = Self {
        buf: [(0, 0); TICKET_RUNS],
        len: 0,
    };

    fn as_slice(&self) -> &[(u64, u64)] {
        &self.buf[..self.len]
    }

    /// Adds `count` clusters from `first`, extending the last run if they continue it. False
    /// (nothing added) if they need a new run and all are taken.
    fn push(&mut self, first: u64, count: u64) -> bool {
        if let Some((f, n)) = self.len.checked_sub(1).map(|i| &mut self.buf[i]) {
            if *f + *n == first {
                *n += count;
                return true;
            }
        }
        match self.buf.get_mut(self.len) {
            Some(slot) => {
                *slot = (first, count);
                self.len += 1;
                true
            }
            None => false,
        }
    }
}

impl core::fmt::Debug for Runs {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for Runs {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Runs {}

impl IoTicket {
    /// Whether the I/O may run after the pool's lock is released (reads always; writes that
    /// allocated nothing).
    pub fn detachable(&self) -> bool {
        self.detachable
    }
}

impl<D: BlockDevice> Pool<D> {
    /// Like [`map_read`](Self::map_read), for a read the caller runs outside the pool's lock:
    /// fills at most `out.len()` segments (covering a prefix of the range, call again for the
    /// rest) and pins their clusters until the ticket is [`complete`](Self::complete)d. Fills at
    /// least one segment of a non-empty range (given a non-empty `out`); fewer than `out.len()`
    /// when the ticket's inline runs are used up (only beyond 8 data segments), so it allocates
    /// nothing.
    pub fn begin_read(
        &mut self,
        image: impl Into<ImageId>,
        offset: u64,
        len: u64,
        out: &mut [ReadSegment],
    ) -> Result<(usize, IoTicket)> {
        let cs = u64::from(self.cluster_size());
        let data = self.data_offset();
        let mut ticket = IoTicket {
            runs: Runs::EMPTY,
            write: false,
            detachable: true,
        };
        let mut n = 0;
        for (slot, seg) in out.iter_mut().zip(self.map_read(image, offset, len)?) {
            if let ReadSegment::Data { device_offset, len } = seg {
                let first = (device_offset - data) / cs;
                let last = (device_offset - data + len - 1) / cs;
                // A data segment is one physical run: the first always fits an empty ticket.
                if !ticket.runs.push(first, last - first + 1) {
                    break;
                }
            }
            *slot = seg;
            n += 1;
        }
        for &(first, count) in ticket.runs.as_slice() {
            (first..first + count).for_each(|c| self.state.alloc.pin(c));
        }
        Ok((n, ticket))
    }

    /// [`map_write`](Self::map_write) for a write the caller may run outside the pool's lock:
    /// pins the target clusters and copy-on-write sources until the ticket is
    /// [`complete`](Self::complete)d. Only a [`detachable`](IoTicket::detachable) ticket's I/O
    /// may run after the lock is released. Fills at most 4 segments whatever `out.len()`
    /// (covering a prefix of the range, call again for the rest), so the ticket's inline runs
    /// hold every pin and it allocates nothing.
    pub fn begin_write(
        &mut self,
        id: VolumeId,
        offset: u64,
        len: u64,
        out: &mut [WriteSegment],
    ) -> Result<(usize, IoTicket)> {
        let bounded = out.len().min(WRITE_SEGMENTS);
        let out = &mut out[..bounded];
        let (n, allocated) = self.map_write_inner(id, offset, len, out)?;
        let cs = u64::from(self.cluster_size());
        let data = self.data_offset();
        let mut ticket = IoTicket {
            runs: Runs::EMPTY,
            write: true,
            detachable: !allocated,
        };
        for seg in &out[..n] {
            // At most two runs per segment and WRITE_SEGMENTS segments: these always fit.
            let fits = ticket.runs.push((seg.device_offset - data) / cs, 1);
            debug_assert!(fits, "write pins exceed the ticket's runs");
            if let Prepare::Copy { from, .. } = seg.prepare {
                let fits = ticket.runs.push((from - data) / cs, 1);
                debug_assert!(fits, "write pins exceed the ticket's runs");
            }
        }
        for &(first, count) in ticket.runs.as_slice() {
            (first..first + count).for_each(|c| self.state.alloc.pin(c));
        }
        self.writes_in_flight += 1;
        Ok((n, ticket))
    }

    /// Ends the I/O of `ticket`: unpins its clusters (a held one becomes allocatable).
    pub fn complete(&mut self, ticket: IoTicket) {
        for &(first, count) in ticket.runs.as_slice() {
            (first..first + count).for_each(|c| self.state.alloc.unpin(c));
        }
        if ticket.write {
            self.writes_in_flight -= 1;
        }
    }

    /// Installs the hook that snapshots use to wait for detached writes (see the module docs).
    pub fn set_quiesce(&mut self, hook: alloc::boxed::Box<dyn Quiesce>) {
        self.quiesce = Some(hook);
    }

    /// Write tickets not completed yet.
    pub fn writes_in_flight(&self) -> u32 {
        self.writes_in_flight
    }

    /// In-flight I/Os pinning the physical cluster at byte `device_offset` (for tests and
    /// diagnostics).
    pub fn pins_at(&self, device_offset: u64) -> u32 {
        let cs = u64::from(self.cluster_size());
        device_offset
            .checked_sub(self.data_offset())
            .map_or(0, |b| self.state.alloc.pins(b / cs))
    }

    /// Waits, if write tickets are outstanding, until their data has landed: before an operation
    /// makes a volume's clusters shared.
    pub(crate) fn quiesce_writes(&self) {
        if self.writes_in_flight == 0 {
            return;
        }
        match &self.quiesce {
            Some(hook) => hook.wait_writes_landed(),
            // Tickets outstanding on this very thread: their I/O has not started, or has ended.
            None => log::debug!("write tickets outstanding without a quiesce hook"),
        }
    }

    /// Maps a read of `len` bytes at `offset` of a volume or snapshot.
    pub fn map_read(&self, image: impl Into<ImageId>, offset: u64, len: u64) -> Result<ReadMap<'_>> {
        let (map, size) = match image.into() {
            ImageId::Volume(id) => self.state.volume(id).map(|v| (&v.map, v.spec.size))?,
            ImageId::Snapshot(id) => self.state.snapshot(id).map(|s| (&s.map, s.size))?,
        };
        check_range(offset, len, size)?;
        let cluster_size = u64::from(self.cluster_size());
        Ok(ReadMap {
            map,
            cluster_size,
            data_offset: self.data_offset(),
            pos: offset,
            end: offset + len,
        })
    }

    /// Maps a write of `len` bytes at `offset`, one segment per cluster, allocating clusters for
    /// first writes and copy-on-write. Fills at most `out.len()` segments and returns how many; they
    /// cover a prefix of the range (call again for the rest). Either every needed cluster of that
    /// prefix is allocated or none is (`ResourceExhausted(Clusters)`).
    ///
    /// The new mappings are visible at once. They survive a crash of the process once
    /// [`persist`](Self::persist) returned for a ticket taken after this call (and after the data
    /// I/O), and a power cut after the next [`Pool::flush`] / [`Pool::sync`]: until then a power
    /// cut reverts them, like the unflushed data written through them.
    pub fn map_write(&mut self, id: VolumeId, offset: u64, len: u64, out: &mut [WriteSegment]) -> Result<usize> {
        self.map_write_inner(id, offset, len, out).map(|(n, _)| n)
    }

    /// `map_write`, also saying whether a cluster was allocated.
    fn map_write_inner(
        &mut self,
        id: VolumeId,
        offset: u64,
        len: u64,
        out: &mut [WriteSegment],
    ) -> Result<(usize, bool)> {
        self.check_writable()?;
        let cs = u64::from(self.cluster_size());
        let v = self.state.volume(id)?;
        check_range(offset, len, v.spec.size)?;
        if len == 0 || out.is_empty() {
            return Ok((0, false));
        }
        let first = offset / cs;
        let count = ((offset + len - 1) / cs - first + 1).min(out.len() as u64);
        let thick = v.spec.provisioning == Provisioning::Thick;
        let (mut fresh, mut unreserved) = (0u64, 0u64);
        for vc in first..first + count {
            match v.map.get(vc) {
                Some(pc) if self.state.alloc.exclusive(pc) => {}
                Some(_) => (fresh, unreserved) = (fresh + 1, unreserved + 1),
                None => (fresh, unreserved) = (fresh + 1, unreserved + u64::from(!thick)),
            }
        }
        let alloc = &self.state.alloc;
        if unreserved > alloc.available() || fresh > alloc.free_now() {
            let available = alloc.available().min(alloc.free_now());
            return Err(Error::ResourceExhausted(Limit::Clusters {
                needed: fresh,
                available,
            }));
        }
        let data = self.data_offset();
        let mut allocated = false;
        for (i, vc) in (first..first + count).enumerate() {
            let start = (vc * cs).max(offset);
            let end = ((vc + 1) * cs).min(offset + len);
            let whole = end - start == cs;
            let old = self.state.volume(id)?.map.get(vc);
            let (pc, prepare) = match old {
                Some(pc) if self.state.alloc.exclusive(pc) => (pc, Prepare::None),
                _ => {
                    let pc = self
                        .state
                        .alloc
                        .find_free()
                        .ok_or(Error::ResourceExhausted(Limit::Clusters {
                            needed: 1,
                            available: 0,
                        }))?;
                    let prepare = match old {
                        _ if whole => Prepare::None,
                        Some(from) => Prepare::Copy {
                            from: data + from * cs,
                            to: data + pc * cs,
                        },
                        None => Prepare::Zero {
                            device_offset: data + pc * cs,
                        },
                    };
                    let rec = Record::Map {
                        id,
                        vcluster: vc,
                        pcluster: pc,
                    };
                    debug_assert_eq!(self.state.validate(&rec), Ok(()));
                    self.record_pending(rec.clone());
                    self.state.apply(rec);
                    allocated = true;
                    (pc, prepare)
                }
            };
            out[i] = WriteSegment {
                offset: start,
                len: end - start,
                device_offset: data + pc * cs + start % cs,
                prepare,
            };
        }
        self.data_dirty = true;
        Ok((usize::try_from(count).unwrap_or(out.len()), allocated))
    }

    /// Deallocates the clusters wholly inside the range: they read as zeros from now on, and are
    /// freed when no snapshot or clone shares them. Partial clusters at either end are left as they
    /// are (deallocation is advisory; write zeros to clear them). A thick volume's trimmed clusters
    /// go back under its reservation, and are kept if no cluster is free to stand for them. Returns
    /// the bytes unmapped. Durable like writes: across a process crash once persisted, across a
    /// power cut after the next flush or sync.
    pub fn trim(&mut self, id: VolumeId, offset: u64, len: u64) -> Result<u64> {
        self.check_writable()?;
        let cs = u64::from(self.cluster_size());
        check_range(offset, len, self.state.volume(id)?.spec.size)?;
        let (first, end) = (offset.div_ceil(cs), (offset + len) / cs);
        let mut vc = first;
        let mut unmapped = 0;
        while vc < end {
            let map = &self.state.volume(id)?.map;
            let Some((next, _)) = map.entries(vc).next().filter(|&(next, _)| next < end) else {
                break;
            };
            let rec = Record::Unmap { id, vcluster: next };
            if self.state.validate(&rec).is_ok() {
                self.record_pending(rec.clone());
                self.state.apply(rec);
                unmapped += cs;
            }
            vc = next + 1;
        }
        Ok(unmapped)
    }

    /// Makes every completed data write and every mapping change durable (NVMe Flush): device
    /// flush, then the pending mapping records in the journal, then another device flush (a hard
    /// commit, which also seals soft frames). Clusters freed since the last hard commit become
    /// allocatable afterwards. Flushes the device even when nothing is pending; on a pool
    /// mounted read-only ([`Pool::read_only`]) that is all it does (nothing of this mount's is
    /// pending, and replayed soft frames are left as found).
    pub fn flush(&mut self) -> Result<()> {
        self.check_usable()?;
        if self.read_only().is_some() || (self.pending.is_empty() && !self.data_dirty && !self.unsealed()) {
            return self
                .dev
                .flush()
                .map_err(|e| Error::Device(crate::device::DeviceError::kind(&e)));
        }
        self.commit(None, 0, Commit::Hard)?;
        self.state.alloc.release_pending();
        Ok(())
    }

    /// The periodic hard sync (the appliance calls it every second): [`flush`](Self::flush) when
    /// [`needs_sync`](Self::needs_sync), else nothing at all (no device I/O on an idle pool).
    /// Bounds what a power cut can take: every write persisted before a `sync` that returned `Ok`
    /// survives one.
    pub fn sync(&mut self) -> Result<()> {
        self.check_usable()?;
        if self.needs_sync() {
            self.flush()
        } else {
            Ok(())
        }
    }

    /// Whether anything is not durable across a power cut yet: data written since the last hard
    /// commit, records not in the journal, or soft frames not sealed.
    pub fn needs_sync(&self) -> bool {
        self.read_only().is_none() && (self.data_dirty || self.unsealed() || !self.pending.is_empty())
    }

    /// The ticket covering every allocation and trim made so far. A write or trim takes it, under
    /// the pool's lock, right after its last [`map_write`](Self::map_write) /
    /// [`begin_write`](Self::begin_write) / [`trim`](Self::trim) call (and its allocating data
    /// writes), and passes it to [`persist`](Self::persist) before it is acknowledged. Every write
    /// does, allocating or not: an in-place write may land in a cluster that another command's
    /// record, not persisted yet, gave the volume.
    pub fn persist_ticket(&self) -> PersistTicket {
        self.ticket()
    }

    /// Whether everything `ticket` covers is in the journal already, so
    /// [`persist`](Self::persist) would return at once (a caller may skip retaking the lock).
    pub fn is_persisted(&self, ticket: PersistTicket) -> bool {
        self.journaled(ticket)
    }

    /// Makes every record `upto` covers survive a crash of the process (group commit): returns at
    /// once if an earlier commit, soft or hard, covered them; otherwise appends every pending
    /// record (this caller's and any other's) to the journal in one soft commit, without a device
    /// flush. The records are then in the OS page cache with the data they point at: they are
    /// replayed after a process crash (reopen with the same [`Epoch`]) and dropped after a power
    /// cut, unless a later [`sync`](Self::sync), [`flush`](Self::flush) or control operation sealed
    /// them. Turns into a hard commit (as `flush`) when no epoch is set or the journal is full.
    ///
    /// **Precondition**: the data writes (and [`Prepare`] steps) of every allocation made so far
    /// have completed, i.e. no command that allocated is between its `map_write` and the end of
    /// its data I/O. The data path guarantees it by doing allocating writes under the lock and
    /// calling `persist` (under the lock again) only after; a frame written earlier could map a
    /// cluster whose data never reaches it, exposing the cluster's previous bytes after a crash.
    ///
    /// Clusters freed by the records (trims, copy-on-write) stay unallocatable until a hard commit:
    /// a soft commit does not make a free durable across a power cut.
    pub fn persist(&mut self, upto: PersistTicket) -> Result<()> {
        self.check_usable()?;
        if self.journaled(upto) {
            return Ok(());
        }
        self.commit(None, 0, Commit::Soft)
    }

    /// The epoch soft frames are written in (`None`: [`persist`](Self::persist) commits hard).
    pub fn current_epoch(&self) -> Option<Epoch> {
        self.epoch()
    }

    /// Sets the epoch of later soft commits: after [`Pool::format`], or an [`Pool::open`] that was
    /// not given one. Unsealed soft frames of another epoch are sealed first (a hard commit).
    /// The epoch must be the current boot's (see [`Epoch`]): a stale one would let a power cut
    /// pass for a process crash.
    pub fn set_epoch(&mut self, epoch: Epoch) -> Result<()> {
        self.check_usable()?;
        self.set_epoch_inner(epoch)
    }
}

fn check_range(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange(Range::PastEnd { size })),
    }
}
