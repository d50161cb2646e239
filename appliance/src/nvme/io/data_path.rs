//! Commands whose device I/O runs outside the pool lock: mapped (and pinned) under it, then
//! read or written through a second handle on the device.

use std::sync::Arc;

use smallvec::SmallVec;

use edgevol_core::{DeviceError, IoTicket, PersistTicket, Pool, ReadSegment, WriteSegment};
use edgevol_hal::uring::{Part, Ring};
use edgevol_nvmeof::io_cmd::IoCommand;
use edgevol_nvmeof::status::StatusCode;

use super::gate::{Gate, GateGuard};
use super::under_lock::{lay_out, write_segment};
use super::{
    byte_range, lock, page_aligned, to_usize, Dev, Parts, ReadBuf, Request, Segments, SEGMENTS,
};
use crate::nvme::status::{from_core, from_device, Access, TargetStatus};
use crate::state::State;

/// The second handle the data path's device I/O goes through. The target's unit tests put
/// one in its place that they can make panic mid-command.
#[cfg(not(test))]
type Handle = edgevol_hal::DataHandle;
#[cfg(test)]
type Handle = crate::nvme::test_device::PanickingHandle;

/// The data path outside the pool lock: our device handle and the gate.
#[derive(Debug)]
pub struct DataPath {
    dev: Handle,
    gate: Arc<Gate>,
}

impl DataPath {
    /// Opens a second handle on the pool's device and installs the gate as the pool's quiesce
    /// hook. Call under the pool lock, once.
    pub fn open(pool: &mut Pool<Dev>) -> Result<Self, edgevol_hal::Error> {
        let dev = Handle::open(pool.device_mut())?;
        let gate = Arc::new(Gate::default());
        pool.set_quiesce(Box::new(gate.clone()));
        Ok(DataPath { dev, gate })
    }

    /// Whether our handle bypasses the page cache (`O_DIRECT`): its buffers must then be
    /// page-aligned.
    pub fn is_direct(&self) -> bool {
        self.dev.is_direct()
    }

    /// Whether a read or write waits on a drive: an `O_DIRECT` handle on anything but memory.
    /// The transport then runs queued ones off the queue's thread, so that the queue depth
    /// reaches the drive. Otherwise each is a copy to or from memory (the page cache, or a file
    /// on tmpfs, `O_DIRECT` or not: there the kernel would run every ring operation on one of
    /// its io_uring worker threads), done in place at any depth.
    pub fn device_waits(&self) -> bool {
        self.dev.is_direct() && !self.dev.in_memory()
    }

    /// The device handle, for the tests that make it fail.
    #[cfg(test)]
    pub(crate) fn handle(&self) -> &Handle {
        &self.dev
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

/// Writes a mapped write's parts of `src` here, on this thread, and finishes it. `src` is the
/// host's buffer, page-aligned as the decoder receives it, so an `O_DIRECT` device writes from
/// it as it is; `out` is scratch for data that is not aligned (never the decoder's), copied
/// there rather than bounced through the aligned buffer hal would allocate for every write.
pub fn land_write(
    data: &DataPath,
    parts: &[Part],
    hold: WriteHold,
    src: &[u8],
    out: &mut ReadBuf,
) -> Result<(), TargetStatus> {
    let landed = if data.is_direct() && !parts.is_empty() && !page_aligned(src) {
        out.copy_from(src);
        let landed = write_parts(data, parts, out.data());
        out.clear();
        landed
    } else {
        write_parts(data, parts, src)
    };
    hold.finish(landed)
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

/// A mapped Read's clusters, pinned until it is dropped.
#[derive(Debug)]
pub struct ReadPin {
    _pinned: Pinned,
}

/// Maps a Read (`req.cmd` must be one) and lays out `out` for it: `out` holds its length with
/// the holes zeroed, and `parts` (emptied first) where the device's data goes in it. Parts are
/// filled in place rather than returned, so that a command's path does not move them around.
pub fn map_read(
    state: &Arc<State>,
    req: &Request,
    out: &mut ReadBuf,
    parts: &mut Parts,
) -> Result<ReadPin, TargetStatus> {
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
    lay_out(&segments, len, out, parts)?;
    Ok(ReadPin { _pinned: pinned })
}

/// What a Write mapped under the pool lock holds until its parts have landed: its clusters
/// pinned, the snapshot gate, and what makes it durable ([`WriteHold::finish`]).
#[derive(Debug)]
pub struct WriteHold {
    pinned: Pinned,
    /// Holds snapshots back until the parts have landed.
    gate: Option<GateGuard>,
    persist: PersistTicket,
    flush: bool,
}

/// Maps a Write (`req.cmd` must be one, the host not read-only). On an `O_DIRECT` device,
/// what it allocates is written from the host's buffer, or through `scratch` (the command's
/// aligned buffer) should that not be page-aligned. Its allocating parts are written before it
/// returns; `parts` (emptied first; offsets into the command's data) go to clusters the volume
/// owns alone, to be written outside the lock.
pub fn map_write(
    state: &Arc<State>,
    data_path: &DataPath,
    req: &Request,
    scratch: &mut ReadBuf,
    parts: &mut Parts,
) -> Result<WriteHold, TargetStatus> {
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
    parts.clear();
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
            let result = segs[..n].iter().try_for_each(|seg| {
                let aligned =
                    (data_path.is_direct() && !page_aligned(data)).then_some(&mut *scratch);
                write_segment(&mut pool, seg, off, data, aligned)
            });
            pool.complete(ticket);
            result?;
        }
        done += segs[..n].iter().map(|s| s.len).sum::<u64>();
    }
    Ok(WriteHold {
        pinned,
        gate,
        // Covers this write's allocations and any earlier one it may write through.
        persist: pool.persist_ticket(),
        flush: fua || !req.wce,
    })
}

impl WriteHold {
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
