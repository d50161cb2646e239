//! I/O command execution over core and hal (Linux `io-cmd-bdev.c`).
//!
//! # Locking and durability
//!
//! Mapping runs under the pool mutex; device I/O of reads and of writes into clusters the volume
//! already owns alone runs *outside* it (in place, on the queue's io_uring or on a worker
//! thread), through a second handle on the pool's device ([`DataPath`], opened by path: the same
//! file or block device). Core makes that safe (`edgevol_core` data-path docs):
//!
//! - [`Pool::begin_read`] / [`Pool::begin_write`] pin the physical clusters of the I/O until
//!   [`Pool::complete`]: a cluster trimmed, deallocated or freed by a volume/snapshot deletion and
//!   a flush meanwhile stays held and is never handed to another volume while we still touch it.
//!   Tickets are completed by a guard, on every path (errors, a dropped connection).
//! - A write that allocates (first write of a cluster, copy-on-write) makes the new mapping
//!   visible at once, so its zero-fill/copy and data are written before the lock is released.
//!   Steady-state writes (in place) do not allocate.
//! - A detached write is counted in the [`Gate`] while the pool lock is still held; the gate is
//!   the pool's [`Quiesce`] hook, so a snapshot, group snapshot or clone (which holds the lock)
//!   waits until every detached write has landed: the snapshot contains each write completed or
//!   in flight before it, and nothing written after it returns. Leaving the gate does not need
//!   the pool lock, so the wait cannot deadlock.
//!
//! Core's rule is followed as written: a Write is acknowledged once its data (and any
//! copy-on-write or zero-fill of the rest of a new cluster, done *before* the data) is written to
//! the device and [`Pool::persist`] has put the mapping changes up to it in the journal (a soft
//! commit: survives a daemon crash; writers arriving meanwhile share one append); with FUA, or
//! with the volatile write cache disabled, only after [`Pool::flush`] instead (its `fdatasync`
//! on the pool's handle covers writes through ours: same file). Write Zeroes and Deallocate
//! persist their unmaps the same way. NVMe Flush is [`Pool::flush`]; `crate::sync` bounds what
//! a power cut can take. Holes are read as zeros without touching the device.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use smallvec::SmallVec;

use edgevol_core::{
    BlockDevice, DeviceError, IoTicket, PersistTicket, Pool, Prepare, Quiesce, ReadSegment,
    VolumeId, WriteSegment,
};
use edgevol_hal::uring::{Part, Ring};
use edgevol_hal::{AlignedBuf, DataHandle};
use edgevol_nvmeof::io_cmd::{IoCommand, DSM_RANGE_LEN};
use edgevol_nvmeof::status::StatusCode;

use super::stats::IoKind;
use super::status::{from_core, from_device, Access, TargetStatus};
use crate::pool::PoolDevice;
use crate::state::State;

/// Segments mapped per `map_write` call.
const SEGMENTS: usize = 16;

/// Segments of one read or write (more spill to the heap: a large I/O over many clusters).
type Segments<T> = SmallVec<[T; SEGMENTS]>;

/// One I/O command with what the queue knows about its namespace.
#[derive(Debug)]
pub struct Request {
    /// The volume.
    pub volume: VolumeId,
    /// This host may only read.
    pub readonly: bool,
    /// Volatile write cache enabled (off: every write is FUA).
    pub wce: bool,
    /// log2 of the logical block size.
    pub lba_shift: u8,
    /// The command.
    pub cmd: IoCommand,
    /// Host-to-controller data.
    pub data: Vec<u8>,
}

impl Request {
    /// Kind and byte count for the counters.
    pub fn accounting(&self) -> (IoKind, u64) {
        let bytes = |blocks: u32| u64::from(blocks) << self.lba_shift;
        match self.cmd {
            IoCommand::Read { blocks, .. } => (IoKind::Read, bytes(blocks)),
            IoCommand::Write { blocks, .. } | IoCommand::WriteZeroes { blocks, .. } => {
                (IoKind::Write, bytes(blocks))
            }
            IoCommand::Flush { .. } => (IoKind::Flush, 0),
            IoCommand::DatasetManagement { .. } => (IoKind::Deallocate, 0),
        }
    }
}

type Dev = PoolDevice;

fn byte_range(slba: u64, blocks: u32, shift: u8) -> Result<(u64, u64), TargetStatus> {
    let off = slba
        .checked_mul(1u64 << shift)
        .ok_or(StatusCode::LbaOutOfRange)?;
    let len = u64::from(blocks) << shift;
    off.checked_add(len).ok_or(StatusCode::LbaOutOfRange)?;
    Ok((off, len))
}

fn dev_err(e: &<Dev as edgevol_core::ErrorType>::Error, access: Access) -> TargetStatus {
    from_device(e.kind(), access)
}

fn to_usize(v: u64) -> Result<usize, TargetStatus> {
    usize::try_from(v).map_err(|_| StatusCode::InternalError.into())
}

fn block_of(dev: &Dev, offset: u64) -> Result<u64, TargetStatus> {
    let bs = u64::from(dev.block_size());
    if !offset.is_multiple_of(bs) {
        return Err(StatusCode::InternalError.into());
    }
    Ok(offset / bs)
}

fn dev_read(dev: &mut Dev, offset: u64, buf: &mut [u8]) -> Result<(), TargetStatus> {
    let block = block_of(dev, offset)?;
    dev.read(block, buf).map_err(|e| dev_err(&e, Access::Read))
}

fn dev_write(dev: &mut Dev, offset: u64, buf: &[u8]) -> Result<(), TargetStatus> {
    let block = block_of(dev, offset)?;
    dev.write(block, buf)
        .map_err(|e| dev_err(&e, Access::Write))
}

/// Executes `req`; a Read's data goes to `out` (resized to the read's length).
pub fn execute(pool: &mut Pool<Dev>, req: &Request, out: &mut ReadBuf) -> Result<(), TargetStatus> {
    let writes = matches!(
        req.cmd,
        IoCommand::Write { .. }
            | IoCommand::WriteZeroes { .. }
            | IoCommand::DatasetManagement { .. }
    );
    if writes && req.readonly {
        return Err(TargetStatus::NamespaceWriteProtected);
    }
    match req.cmd {
        IoCommand::Read { slba, blocks, .. } => {
            let (off, len) = byte_range(slba, blocks, req.lba_shift)?;
            read(pool, req.volume, off, len, out)
        }
        IoCommand::Write {
            slba, blocks, fua, ..
        } => {
            let (off, len) = byte_range(slba, blocks, req.lba_shift)?;
            if req.data.len() != to_usize(len)? {
                return Err(StatusCode::DataSglLengthInvalid.into());
            }
            write(pool, req.volume, off, &req.data)?;
            durable(pool, fua || !req.wce)
        }
        IoCommand::Flush { .. } => pool.flush().map_err(|e| from_core(&e)),
        IoCommand::WriteZeroes { slba, blocks, .. } => {
            let (off, len) = byte_range(slba, blocks, req.lba_shift)?;
            write_zeroes(pool, req.volume, off, len)?;
            durable(pool, !req.wce)
        }
        IoCommand::DatasetManagement {
            ranges, deallocate, ..
        } => {
            if deallocate {
                deallocate_ranges(pool, req, ranges)?;
                durable(pool, false)?;
            }
            Ok(())
        }
    }
}

/// Before a mutating command is acknowledged: its mapping changes (and every earlier one) reach
/// the journal, so a daemon crash cannot lose it; with `flush` (FUA, write cache off) everything
/// is durable against a power cut too. Called under the pool lock after the command's data I/O.
fn durable(pool: &mut Pool<Dev>, flush: bool) -> Result<(), TargetStatus> {
    if flush {
        pool.flush()
    } else {
        let ticket = pool.persist_ticket();
        pool.persist(ticket)
    }
    .map_err(|e| from_core(&e))
}

fn read(
    pool: &mut Pool<Dev>,
    vol: VolumeId,
    off: u64,
    len: u64,
    out: &mut ReadBuf,
) -> Result<(), TargetStatus> {
    let segments: Segments<ReadSegment> = pool
        .map_read(vol, off, len)
        .map_err(|e| from_core(&e))?
        .collect();
    gather(&segments, len, out, |offset, part| {
        dev_read(pool.device_mut(), offset, part)
    })
}

/// Puts the `len` bytes `segments` map into `out`, in order: zeros for holes,
/// `read(device offset, part)` for data.
fn gather(
    segments: &[ReadSegment],
    len: u64,
    out: &mut ReadBuf,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), TargetStatus>,
) -> Result<(), TargetStatus> {
    let parts = lay_out(segments, len, out)?;
    let buf = out.filled();
    parts
        .iter()
        .try_for_each(|p| read(p.device_offset, &mut buf[p.at..p.at + p.len]))
}

/// Sizes `out` to `len`, zeroes the holes `segments` leave (the buffer is reused: nothing of
/// an earlier command may show through) and returns where the data parts go.
fn lay_out(segments: &[ReadSegment], len: u64, out: &mut ReadBuf) -> Result<Parts, TargetStatus> {
    let buf = out.prepare(to_usize(len)?);
    let mut parts = Parts::new();
    let mut at = 0usize;
    for seg in segments {
        let n = to_usize(seg.len())?;
        let part = buf.get_mut(at..at + n).ok_or(StatusCode::InternalError)?;
        match *seg {
            ReadSegment::Data { device_offset, .. } => parts.push(Part {
                device_offset,
                at,
                len: n,
            }),
            ReadSegment::Zero { .. } => part.fill(0),
        }
        at += n;
    }
    buf.get_mut(at..).ok_or(StatusCode::InternalError)?.fill(0);
    Ok(parts)
}

/// A read's data: page-aligned, so that a read from an `O_DIRECT` device lands in it directly
/// (hal bounces unaligned buffers through an aligned copy), and kept by the queue for the next
/// command.
#[derive(Debug)]
pub struct ReadBuf {
    buf: AlignedBuf,
    len: usize,
}

impl Default for ReadBuf {
    fn default() -> Self {
        ReadBuf {
            buf: AlignedBuf::zeroed(0),
            len: 0,
        }
    }
}

impl ReadBuf {
    /// The data of the last read (empty after [`ReadBuf::clear`]).
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Bytes it can hold without reallocating.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Forgets the data; keeps the allocation.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The data, to fill.
    fn filled(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// Holds a copy of `data` (a write's, for the device ring's aligned I/O).
    pub fn copy_from(&mut self, data: &[u8]) {
        self.prepare(data.len()).copy_from_slice(data);
    }

    /// The aligned allocation and the data's length, for the device ring.
    pub fn into_parts(self) -> (AlignedBuf, usize) {
        (self.buf, self.len)
    }

    /// A buffer back from the device ring.
    pub fn from_parts(buf: AlignedBuf, len: usize) -> Self {
        ReadBuf {
            len: len.min(buf.len()),
            buf,
        }
    }

    /// `len` bytes to fill, growing the allocation if it is smaller.
    fn prepare(&mut self, len: usize) -> &mut [u8] {
        if self.buf.len() < len {
            self.buf = AlignedBuf::zeroed(len);
        }
        self.len = len;
        &mut self.buf[..len]
    }
}

/// Fills the parts of a fresh cluster that `seg` does not cover, as core asks.
fn prepare(pool: &mut Pool<Dev>, seg: &WriteSegment) -> Result<(), TargetStatus> {
    let cs = u64::from(pool.cluster_size());
    let within = seg.offset % cs;
    let (head, tail_start) = (within, within + seg.len);
    let parts = [(0, head), (tail_start, cs)];
    match seg.prepare {
        Prepare::None => Ok(()),
        Prepare::Zero { device_offset } => {
            for (from, to) in parts {
                if to > from {
                    let zeros = vec![0u8; to_usize(to - from)?];
                    dev_write(pool.device_mut(), device_offset + from, &zeros)?;
                }
            }
            Ok(())
        }
        Prepare::Copy { from: src, to: dst } => {
            for (from, to) in parts {
                if to > from {
                    let mut buf = vec![0u8; to_usize(to - from)?];
                    dev_read(pool.device_mut(), src + from, &mut buf)?;
                    dev_write(pool.device_mut(), dst + from, &buf)?;
                }
            }
            Ok(())
        }
    }
}

fn write(pool: &mut Pool<Dev>, vol: VolumeId, off: u64, data: &[u8]) -> Result<(), TargetStatus> {
    let len = u64::try_from(data.len()).map_err(|_| StatusCode::InternalError)?;
    let mut done = 0u64;
    let mut segs = [WriteSegment::EMPTY; SEGMENTS];
    while done < len {
        let n = pool
            .map_write(vol, off + done, len - done, &mut segs)
            .map_err(|e| from_core(&e))?;
        if n == 0 {
            return Err(StatusCode::InternalError.into());
        }
        for seg in segs.iter().take(n) {
            write_segment(pool, seg, off, data)?;
            done += seg.len;
        }
    }
    Ok(())
}

/// Prepares `seg`'s cluster as core asks, then writes its part of `data` (which starts at volume
/// offset `off`), through the pool's own handle.
fn write_segment(
    pool: &mut Pool<Dev>,
    seg: &WriteSegment,
    off: u64,
    data: &[u8],
) -> Result<(), TargetStatus> {
    prepare(pool, seg)?;
    let start = to_usize(seg.offset - off)?;
    let part = data
        .get(start..start + to_usize(seg.len)?)
        .ok_or(StatusCode::InternalError)?;
    dev_write(pool.device_mut(), seg.device_offset, part)
}

/// Write Zeroes: whole clusters are unmapped (they read as zeros); partial clusters that hold
/// data get zeros written through the normal write path (copy-on-write included).
fn write_zeroes(
    pool: &mut Pool<Dev>,
    vol: VolumeId,
    off: u64,
    len: u64,
) -> Result<(), TargetStatus> {
    let cs = u64::from(pool.cluster_size());
    let end = off.checked_add(len).ok_or(StatusCode::LbaOutOfRange)?;
    // Range check first (map_read refuses past the end).
    pool.map_read(vol, off, len).map_err(|e| from_core(&e))?;
    let whole_start = off.div_ceil(cs) * cs;
    let whole_end = (end / cs) * cs;
    let mut partial = Vec::new();
    if whole_start < whole_end {
        pool.trim(vol, whole_start, whole_end - whole_start)
            .map_err(|e| from_core(&e))?;
        partial.push((off, whole_start - off));
        partial.push((whole_end, end - whole_end));
    } else {
        partial.push((off, len));
    }
    for (start, n) in partial {
        if n == 0 {
            continue;
        }
        let mapped: Vec<ReadSegment> = pool
            .map_read(vol, start, n)
            .map_err(|e| from_core(&e))?
            .collect();
        let mut at = start;
        for seg in mapped {
            if matches!(seg, ReadSegment::Data { .. }) {
                write(pool, vol, at, &vec![0u8; to_usize(seg.len())?])?;
            }
            at += seg.len();
        }
    }
    Ok(())
}

fn deallocate_ranges(pool: &mut Pool<Dev>, req: &Request, ranges: u32) -> Result<(), TargetStatus> {
    let range_len = to_usize(u64::from(DSM_RANGE_LEN))?;
    for i in 0..to_usize(u64::from(ranges))? {
        let r = req
            .data
            .get(i * range_len..(i + 1) * range_len)
            .ok_or(StatusCode::DataSglLengthInvalid)?;
        let nlb = u32::from_le_bytes([r[4], r[5], r[6], r[7]]);
        let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
        if nlb == 0 {
            continue;
        }
        let off = slba
            .checked_mul(1u64 << req.lba_shift)
            .ok_or(StatusCode::LbaOutOfRange)?;
        let len = u64::from(nlb) << req.lba_shift;
        pool.trim(req.volume, off, len).map_err(|e| from_core(&e))?;
    }
    Ok(())
}

/// Detached writes whose device I/O has not ended: the pool's [`Quiesce`] hook.
#[derive(Debug, Default)]
pub struct Gate {
    running: Mutex<u64>,
    idle: Condvar,
    /// Queues' io_uring rings, which may hold detached writes that only the gate can reap
    /// while their queue waits for the pool lock (`device_ring` module docs).
    rings: Mutex<Vec<Weak<dyn Landing>>>,
}

/// Something holding detached writes that the gate can see to the end of by itself.
pub trait Landing: Send + Sync {
    /// Returns once every operation in flight has ended and left the gate; takes no pool lock.
    fn land(&self);
}

/// How long the gate waits for a count to drop before landing the rings' writes again: a write
/// may be mapped (in the gate) just before its queue puts it on its ring.
const LAND_AGAIN: Duration = Duration::from_millis(1);

impl Gate {
    fn count(&self) -> MutexGuard<'_, u64> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a detached write in; call with the pool lock held, before releasing it.
    pub(crate) fn enter(self: &Arc<Self>) -> GateGuard {
        *self.count() += 1;
        GateGuard(self.clone())
    }

    /// Detached writes running now.
    pub fn running(&self) -> u64 {
        *self.count()
    }

    /// Lets the gate land `ring`'s writes itself (until the ring is gone).
    pub(crate) fn register(&self, ring: Weak<dyn Landing>) {
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        rings.retain(|r| r.strong_count() > 0);
        rings.push(ring);
    }

    fn land_rings(&self) {
        let rings: Vec<Arc<dyn Landing>> = self
            .rings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        rings.iter().for_each(|r| r.land());
    }
}

impl Quiesce for Gate {
    fn wait_writes_landed(&self) {
        while self.running() > 0 {
            self.land_rings();
            let n = self.count();
            if *n > 0 {
                drop(self.idle.wait_timeout(n, LAND_AGAIN));
            }
        }
    }
}

/// A detached write in the gate; leaves it when dropped (the write's I/O has ended).
#[derive(Debug)]
pub(crate) struct GateGuard(Arc<Gate>);

impl Drop for GateGuard {
    fn drop(&mut self) {
        let mut n = self.0.count();
        *n -= 1;
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

/// The data path outside the pool lock: our device handle and the gate.
#[derive(Debug)]
pub struct DataPath {
    dev: DataHandle,
    gate: Arc<Gate>,
}

impl DataPath {
    /// Opens a second handle on the pool's device and installs the gate as the pool's quiesce
    /// hook. Call under the pool lock, once.
    pub fn open(pool: &mut Pool<Dev>) -> Result<Self, edgevol_hal::Error> {
        let dev = DataHandle::open(pool.device_mut())?;
        let gate = Arc::new(Gate::default());
        pool.set_quiesce(Box::new(gate.clone()));
        Ok(DataPath { dev, gate })
    }

    /// Whether our handle bypasses the page cache (`O_DIRECT`): then a read or write waits on
    /// the drive, and the transport runs it off the queue's thread so the queue depth reaches
    /// the drive; otherwise it is a copy to or from the page cache, done in place.
    pub fn is_direct(&self) -> bool {
        self.dev.is_direct()
    }

    /// The gate (for tests and diagnostics).
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// A queue's own io_uring on this device, for `ops` operations at once; `None` where the
    /// device has none (the fault device) or io_uring is unavailable: the queue then uses the
    /// worker threads.
    pub fn ring<T>(&self, ops: u32) -> Option<Ring<T>> {
        match self.dev.ring(ops)? {
            Ok(ring) => Some(ring),
            Err(e) => {
                tracing::debug!(%e, "no io_uring: device reads on the worker threads");
                None
            }
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), TargetStatus> {
        self.dev
            .read_at(offset, buf)
            .map_err(|e| from_device(e.kind(), Access::Read))
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), TargetStatus> {
        self.dev
            .write_at(offset, data)
            .map_err(|e| from_device(e.kind(), Access::Write))
    }
}

/// The pool, locked.
fn lock(state: &State) -> Result<MutexGuard<'_, Pool<Dev>>, TargetStatus> {
    state.lock_pool().map_err(TargetStatus::from)
}

/// The I/O tickets pinning a command's clusters: completed under the pool lock when dropped,
/// on every path (an error, a dropped connection).
#[derive(Debug)]
struct Pinned {
    state: Arc<State>,
    held: SmallVec<[IoTicket; 2]>,
}

impl Pinned {
    fn new(state: &Arc<State>) -> Self {
        Pinned {
            state: state.clone(),
            held: SmallVec::new(),
        }
    }

    fn complete_in(held: &mut SmallVec<[IoTicket; 2]>, pool: &mut Pool<Dev>) {
        for t in held.drain(..) {
            pool.complete(t);
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let state = self.state.clone();
        let locked = lock(&state);
        match locked {
            Ok(mut pool) => Self::complete_in(&mut self.held, &mut pool),
            Err(_) => tracing::error!("pool lock poisoned: I/O tickets left pinned"),
        }
    }
}

/// The device parts of one command: where each lies on the device and in the command's buffer.
pub type Parts = SmallVec<[Part; SEGMENTS]>;

/// Runs `req` with its device I/O outside the pool lock (reads, and writes into clusters the
/// volume owns alone); everything else under it.
pub fn run(
    state: &Arc<State>,
    data: &DataPath,
    req: &Request,
    out: &mut ReadBuf,
) -> Result<(), TargetStatus> {
    match req.cmd {
        IoCommand::Read { .. } => {
            let mapped = map_read(state, req, out)?;
            read_parts(data, &mapped.parts, out)
        }
        IoCommand::Write { .. } if !req.readonly => {
            let mapped = map_write(state, data, req)?;
            land_write(data, mapped, &req.data, out)
        }
        _ => execute(&mut *lock(state)?, req, out),
    }
}

/// Writes a mapped write's parts of `src` here, on this thread, and finishes it. `out` is
/// scratch: `O_DIRECT` takes aligned memory only, and a copy into the queue's aligned buffer
/// is cheaper than the bounce hal would allocate for every write.
pub fn land_write(
    data: &DataPath,
    mapped: MappedWrite,
    src: &[u8],
    out: &mut ReadBuf,
) -> Result<(), TargetStatus> {
    let landed = if data.is_direct() && !mapped.parts.is_empty() {
        out.copy_from(src);
        let landed = write_parts(data, &mapped.parts, out.data());
        out.clear();
        landed
    } else {
        write_parts(data, &mapped.parts, src)
    };
    mapped.finish(landed)
}

/// Reads `parts` from the device into `out`'s data.
pub fn read_parts(data: &DataPath, parts: &[Part], out: &mut ReadBuf) -> Result<(), TargetStatus> {
    let buf = out.filled();
    parts.iter().try_for_each(|p| {
        let part = buf
            .get_mut(p.at..p.at + p.len)
            .ok_or(StatusCode::InternalError)?;
        data.read(p.device_offset, part)
    })
}

/// Writes `parts` of `src` to the device.
pub fn write_parts(data: &DataPath, parts: &[Part], src: &[u8]) -> Result<(), TargetStatus> {
    parts.iter().try_for_each(|p| {
        let part = src
            .get(p.at..p.at + p.len)
            .ok_or(StatusCode::InternalError)?;
        data.write(p.device_offset, part)
    })
}

/// A Read mapped under the pool lock: `out` holds its length with the holes zeroed, `parts`
/// are to be read from the device into it. Its clusters stay pinned until it is dropped.
#[derive(Debug)]
pub struct MappedRead {
    /// Device extents to read into the buffer.
    pub parts: Parts,
    _pinned: Pinned,
}

/// Maps a Read (`req.cmd` must be one) and lays out `out` for it.
pub fn map_read(
    state: &Arc<State>,
    req: &Request,
    out: &mut ReadBuf,
) -> Result<MappedRead, TargetStatus> {
    let IoCommand::Read { slba, blocks, .. } = req.cmd else {
        return Err(StatusCode::InternalError.into());
    };
    let (off, len) = byte_range(slba, blocks, req.lba_shift)?;
    let mut pinned = Pinned::new(state);
    let mut segments = Segments::<ReadSegment>::new();
    {
        let mut pool = lock(state)?;
        let mut done = 0;
        let mut segs = [ReadSegment::Zero { len: 0 }; SEGMENTS];
        while done < len {
            let (n, ticket) = pool
                .begin_read(req.volume, off + done, len - done, &mut segs)
                .map_err(|e| from_core(&e))?;
            pinned.held.push(ticket);
            if n == 0 {
                return Err(StatusCode::InternalError.into());
            }
            for seg in &segs[..n] {
                done += seg.len();
                segments.push(*seg);
            }
        }
    }
    let parts = lay_out(&segments, len, out)?;
    Ok(MappedRead {
        parts,
        _pinned: pinned,
    })
}

/// A Write mapped under the pool lock: its allocating parts are written already; `parts`
/// (offsets into the command's data) go to clusters the volume owns alone, outside the lock.
/// [`MappedWrite::finish`] then makes it durable.
#[derive(Debug)]
pub struct MappedWrite {
    /// Device extents to write, from the command's data.
    pub parts: Parts,
    pinned: Pinned,
    /// Holds snapshots back until the parts have landed.
    gate: Option<GateGuard>,
    persist: PersistTicket,
    flush: bool,
}

/// Maps a Write (`req.cmd` must be one, the host not read-only).
pub fn map_write(
    state: &Arc<State>,
    data_path: &DataPath,
    req: &Request,
) -> Result<MappedWrite, TargetStatus> {
    let IoCommand::Write {
        slba, blocks, fua, ..
    } = req.cmd
    else {
        return Err(StatusCode::InternalError.into());
    };
    if req.readonly {
        return Err(TargetStatus::NamespaceWriteProtected);
    }
    let (off, len) = byte_range(slba, blocks, req.lba_shift)?;
    if req.data.len() != to_usize(len)? {
        return Err(StatusCode::DataSglLengthInvalid.into());
    }
    let data = &req.data;
    let mut pinned = Pinned::new(state);
    let mut parts = Parts::new();
    let mut gate = None;
    let mut pool = lock(state)?;
    let mut done = 0u64;
    let mut segs = [WriteSegment::EMPTY; SEGMENTS];
    while done < len {
        let (n, ticket) = pool
            .begin_write(req.volume, off + done, len - done, &mut segs)
            .map_err(|e| from_core(&e))?;
        if n == 0 {
            pool.complete(ticket);
            return Err(StatusCode::InternalError.into());
        }
        if ticket.detachable() {
            // In the gate before the lock goes: a snapshot now waits for this write.
            gate.get_or_insert_with(|| data_path.gate.enter());
            for seg in &segs[..n] {
                parts.push(Part {
                    device_offset: seg.device_offset,
                    at: to_usize(seg.offset - off)?,
                    len: to_usize(seg.len)?,
                });
            }
            pinned.held.push(ticket);
        } else {
            // Allocated: the new mapping is visible, so fill it before anyone looks.
            let result = segs[..n]
                .iter()
                .try_for_each(|seg| write_segment(&mut pool, seg, off, data));
            pool.complete(ticket);
            result?;
        }
        done += segs[..n].iter().map(|s| s.len).sum::<u64>();
    }
    Ok(MappedWrite {
        parts,
        pinned,
        gate,
        // Covers this write's allocations and any earlier one it may write through.
        persist: pool.persist_ticket(),
        flush: fua || !req.wce,
    })
}

impl MappedWrite {
    /// Its parts have landed (on a ring the gate reaped): snapshots need not wait for it any
    /// longer. Takes no lock.
    pub fn leave_gate(&mut self) {
        self.gate = None;
    }

    /// After the parts were written (`landed`): unpins, and acknowledges only what is durable.
    pub fn finish(mut self, landed: Result<(), TargetStatus>) -> Result<(), TargetStatus> {
        drop(self.gate.take());
        let state = self.pinned.state.clone();
        let mut pool = lock(&state)?;
        Pinned::complete_in(&mut self.pinned.held, &mut pool);
        landed?;
        // Group commit: writers that got here meanwhile share one journal append; a ticket an
        // earlier append covered returns at once.
        if self.flush {
            pool.flush()
        } else {
            pool.persist(self.persist)
        }
        .map_err(|e| from_core(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reused read buffer shows holes as zeros and data as read, whatever it held before,
    /// and keeps its aligned allocation.
    #[test]
    fn a_reused_read_buffer_shows_nothing_of_an_earlier_read() {
        let mut out = ReadBuf::default();
        gather(
            &[ReadSegment::Zero { len: 8192 }],
            8192,
            &mut out,
            |_, _| unreachable!("a hole reads nothing"),
        )
        .unwrap();
        out.prepare(8192).fill(0xee);
        let at = out.data().as_ptr();
        let segments = [
            ReadSegment::Data {
                device_offset: 4096,
                len: 2048,
            },
            ReadSegment::Zero { len: 2048 },
        ];
        gather(&segments, 4096, &mut out, |offset, part| {
            assert_eq!(offset, 4096);
            part.fill(0x5a);
            Ok(())
        })
        .unwrap();
        assert_eq!(out.data().len(), 4096);
        assert!(out.data()[..2048].iter().all(|&b| b == 0x5a));
        assert!(
            out.data()[2048..].iter().all(|&b| b == 0),
            "the hole is zeros"
        );
        assert_eq!(out.data().as_ptr(), at, "same allocation");
        assert_eq!(out.data().as_ptr() as usize % edgevol_hal::IO_ALIGN, 0);
    }
}
