//! I/O command execution over core and hal (Linux `io-cmd-bdev.c`).
//!
//! # Locking and durability
//!
//! Every command runs on the blocking pool under the pool mutex, mapping *and* device I/O: the
//! mapping is only valid while the lock is held. Releasing it between `map_write` and the data
//! write would let a concurrent snapshot share the cluster before our data lands in it (the
//! snapshot would change after it was taken), and a concurrent trim + flush could free and hand
//! the cluster to another volume (our write would land in its data). Doing the I/O through a
//! second handle outside the lock needs in-flight fencing in core (pin a cluster until its I/O
//! ends); until then correctness wins and the data path is serialized per pool.
//!
//! Core's rule is followed as written: a Write is acknowledged once its data (and any
//! copy-on-write or zero-fill of the rest of a new cluster, done *before* the data) is written to
//! the device; with FUA, or with the volatile write cache disabled, only after [`Pool::flush`]
//! too. NVMe Flush is [`Pool::flush`]. Holes are read as zeros without touching the device.

use edgevol_core::{BlockDevice, DeviceError, Pool, Prepare, ReadSegment, VolumeId, WriteSegment};
use edgevol_nvmeof::io_cmd::{IoCommand, DSM_RANGE_LEN};
use edgevol_nvmeof::status::StatusCode;

use super::stats::IoKind;
use super::status::{from_core, from_device, TargetStatus};
use crate::pool::PoolDevice;

/// Segments mapped per `map_write` call.
const SEGMENTS: usize = 16;

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

fn dev_err(e: &<Dev as edgevol_core::ErrorType>::Error) -> TargetStatus {
    from_device(e.kind())
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
    dev.read(block, buf).map_err(|e| dev_err(&e))
}

fn dev_write(dev: &mut Dev, offset: u64, buf: &[u8]) -> Result<(), TargetStatus> {
    let block = block_of(dev, offset)?;
    dev.write(block, buf).map_err(|e| dev_err(&e))
}

/// Executes `req`; the read data on success.
pub fn execute(pool: &mut Pool<Dev>, req: &Request) -> Result<Vec<u8>, TargetStatus> {
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
            read(pool, req.volume, off, len)
        }
        IoCommand::Write {
            slba, blocks, fua, ..
        } => {
            let (off, len) = byte_range(slba, blocks, req.lba_shift)?;
            if req.data.len() != to_usize(len)? {
                return Err(StatusCode::DataSglLengthInvalid.into());
            }
            write(pool, req.volume, off, &req.data)?;
            if fua || !req.wce {
                pool.flush().map_err(|e| from_core(&e))?;
            }
            Ok(Vec::new())
        }
        IoCommand::Flush { .. } => {
            pool.flush().map_err(|e| from_core(&e))?;
            Ok(Vec::new())
        }
        IoCommand::WriteZeroes { slba, blocks, .. } => {
            let (off, len) = byte_range(slba, blocks, req.lba_shift)?;
            write_zeroes(pool, req.volume, off, len)?;
            if !req.wce {
                pool.flush().map_err(|e| from_core(&e))?;
            }
            Ok(Vec::new())
        }
        IoCommand::DatasetManagement {
            ranges, deallocate, ..
        } => {
            if deallocate {
                deallocate_ranges(pool, req, ranges)?;
            }
            Ok(Vec::new())
        }
    }
}

fn read(pool: &mut Pool<Dev>, vol: VolumeId, off: u64, len: u64) -> Result<Vec<u8>, TargetStatus> {
    let segments: Vec<ReadSegment> = pool
        .map_read(vol, off, len)
        .map_err(|e| from_core(&e))?
        .collect();
    let mut buf = vec![0u8; to_usize(len)?];
    let mut at = 0usize;
    for seg in segments {
        let n = to_usize(seg.len())?;
        let part = buf.get_mut(at..at + n).ok_or(StatusCode::InternalError)?;
        if let ReadSegment::Data { device_offset, .. } = seg {
            dev_read(pool.device_mut(), device_offset, part)?;
        }
        at += n;
    }
    Ok(buf)
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
            prepare(pool, seg)?;
            let start = to_usize(seg.offset - off)?;
            let part = data
                .get(start..start + to_usize(seg.len)?)
                .ok_or(StatusCode::InternalError)?;
            dev_write(pool.device_mut(), seg.device_offset, part)?;
            done += seg.len;
        }
    }
    Ok(())
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
