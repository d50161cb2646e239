//! A whole command under the pool lock, through the pool's own handle: Flush, Write Zeroes,
//! Deallocate, and every command when there is no second handle ([`super::DataPath`]).

use edgevol_core::{BlockDevice, DeviceError, Pool, Prepare, ReadSegment, VolumeId, WriteSegment};
use edgevol_hal::uring::Part;
use edgevol_nvmeof::io_cmd::{IoCommand, DSM_RANGE_LEN};
use edgevol_nvmeof::status::StatusCode;

use super::{byte_range, to_usize, Dev, Parts, ReadBuf, Request, Segments, SEGMENTS};
use crate::nvme::status::{from_core, from_device, Access, TargetStatus};

fn dev_err(e: &<Dev as edgevol_core::ErrorType>::Error, access: Access) -> TargetStatus {
    from_device(e.kind(), access)
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
    // A read-only publication, or a pool mounted read-only (a read-only-compatible feature
    // this firmware lacks): refused whether or not the command would change a byte (a Write
    // Zeroes over unmapped blocks changes none), as Linux nvmet refuses a read-only namespace.
    if writes && (req.readonly || pool.read_only().is_some()) {
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
    let mut parts = Parts::new();
    lay_out(segments, len, out, &mut parts)?;
    let buf = out.filled();
    parts
        .iter()
        .try_for_each(|p| read(p.device_offset, &mut buf[p.at..p.at + p.len]))
}

/// Sizes `out` to `len`, zeroes the holes `segments` leave (the buffer is reused: nothing of
/// an earlier command may show through) and puts where the data parts go in `parts` (emptied
/// first).
pub(super) fn lay_out(
    segments: &[ReadSegment],
    len: u64,
    out: &mut ReadBuf,
    parts: &mut Parts,
) -> Result<(), TargetStatus> {
    let buf = out.prepare(to_usize(len)?);
    parts.clear();
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
    Ok(())
}

/// Zeros `len` bytes at device offset `at` (the rest of a new cluster) without sending them: a
/// hole in a file pool, Write Zeroes on a drive. Writing them cost a cluster of zeros through
/// the page cache or the bus for every allocating write, and a buffer to send them from.
fn write_zeros(dev: &mut Dev, at: u64, len: u64) -> Result<(), TargetStatus> {
    let bs = u64::from(dev.block_size());
    let block = block_of(dev, at)?;
    if !len.is_multiple_of(bs) {
        return Err(StatusCode::InternalError.into());
    }
    dev.zero_blocks(block, len / bs)
        .map_err(|e| dev_err(&e, Access::Write))
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
                    write_zeros(pool.device_mut(), device_offset + from, to - from)?;
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
            // Not the data path: Write Zeroes, or a pool with no second handle.
            write_segment(pool, seg, off, data, None)?;
            done += seg.len;
        }
    }
    Ok(())
}

/// Prepares `seg`'s cluster as core asks, then writes its part of `data` (which starts at volume
/// offset `off`), through the pool's own handle. With `aligned` (the command's own buffer, given
/// on an `O_DIRECT` device) the part goes through it: a copy, but not the allocation of hal's
/// bounce.
pub(super) fn write_segment(
    pool: &mut Pool<Dev>,
    seg: &WriteSegment,
    off: u64,
    data: &[u8],
    aligned: Option<&mut ReadBuf>,
) -> Result<(), TargetStatus> {
    prepare(pool, seg)?;
    let start = to_usize(seg.offset - off)?;
    let part = data
        .get(start..start + to_usize(seg.len)?)
        .ok_or(StatusCode::InternalError)?;
    let Some(aligned) = aligned else {
        return dev_write(pool.device_mut(), seg.device_offset, part);
    };
    aligned.copy_from(part);
    let written = dev_write(pool.device_mut(), seg.device_offset, aligned.data());
    aligned.clear();
    written
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

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::FormatOptions;
    use edgevol_hal::{FileDevice, PoolDevice};

    /// A new cluster that held another volume's bytes (freed, then allocated again) shows none
    /// of them: around the write, it reads as zeros.
    #[test]
    fn the_rest_of_a_new_cluster_reads_as_zeros_whatever_it_held() {
        const CLUSTER: u64 = 64 << 10;
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create(dir.path().join("pool.img"), 64 << 20).unwrap();
        let opts = FormatOptions::new([7; 16], u32::try_from(CLUSTER).unwrap());
        let mut pool = Pool::format(PoolDevice::File(dev), opts).unwrap();
        // The device's last cluster, full of old bytes.
        let cluster_at = (64 << 20) - CLUSTER;
        let old = vec![0xabu8; usize::try_from(CLUSTER).unwrap()];
        dev_write(pool.device_mut(), cluster_at, &old).unwrap();
        // A 4 KiB write at 8 KiB into it, allocating: zeros before and after.
        let data = vec![0x5au8; 4096];
        let seg = WriteSegment {
            offset: CLUSTER * 3 + 8192,
            len: 4096,
            device_offset: cluster_at + 8192,
            prepare: Prepare::Zero {
                device_offset: cluster_at,
            },
        };
        let mut aligned = ReadBuf::default();
        write_segment(&mut pool, &seg, seg.offset, &data, Some(&mut aligned)).unwrap();
        let mut back = vec![0u8; old.len()];
        dev_read(pool.device_mut(), cluster_at, &mut back).unwrap();
        assert!(back[..8192].iter().all(|&b| b == 0), "before the write");
        assert_eq!(&back[8192..12288], &data[..]);
        assert!(back[12288..].iter().all(|&b| b == 0), "after the write");
    }

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
