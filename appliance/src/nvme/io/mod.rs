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
//!
//! Files: `under_lock` runs a whole command under the pool lock; `data_path` maps under it
//! and moves the data outside it; [`gate`] holds snapshots back while detached writes land;
//! `read_buf` is the aligned buffer a command's data lives in.

mod data_path;
pub(crate) mod gate;
mod read_buf;
mod under_lock;

use std::sync::{Arc, MutexGuard};

use smallvec::SmallVec;

use edgevol_core::{Pool, VolumeId};
use edgevol_hal::uring::Part;
use edgevol_nvmeof::data_buf::DataBuf;
use edgevol_nvmeof::io_cmd::IoCommand;
use edgevol_nvmeof::status::StatusCode;

use super::stats::IoKind;
use super::status::TargetStatus;
use crate::pool::PoolDevice;
use crate::state::State;

pub use data_path::{
    land_write, map_read, map_write, read_parts, write_parts, DataPath, ReadPin, WriteHold,
};
pub use gate::{Gate, Landing};
pub use read_buf::{aligned_copies, ReadBuf};
pub use under_lock::execute;

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
    /// Host-to-controller data (page-aligned: see [`edgevol_nvmeof::data_buf`]).
    pub data: DataBuf,
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

fn to_usize(v: u64) -> Result<usize, TargetStatus> {
    usize::try_from(v).map_err(|_| StatusCode::InternalError.into())
}

/// Whether `data` starts on a page boundary, as an `O_DIRECT` device needs (the decoder's
/// buffers always do).
fn page_aligned(data: &[u8]) -> bool {
    data.as_ptr().addr().is_multiple_of(edgevol_hal::IO_ALIGN)
}

/// The pool, locked.
fn lock(state: &State) -> Result<MutexGuard<'_, Pool<Dev>>, TargetStatus> {
    state.lock_pool().map_err(TargetStatus::from)
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
            let mut parts = Parts::new();
            let _pin = map_read(state, req, out, &mut parts)?;
            read_parts(data, &parts, out)
        }
        IoCommand::Write { .. } if !req.readonly => {
            let mut parts = Parts::new();
            let hold = map_write(state, data, req, out, &mut parts)?;
            land_write(data, &parts, hold, &req.data, out)
        }
        _ => execute(&mut *lock(state)?, req, out),
    }
}
