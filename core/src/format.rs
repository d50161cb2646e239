//! Formatting as a long operation: deallocating the data area of a new pool with progress, and a
//! read-only probe for guards that must not write to a device they may refuse.

use crate::device::BlockDevice;
use crate::error::{Corruption, Error, Result};
use crate::pool::{dev_err, read_superblock, FormatOptions, Pool};
use crate::superblock::Geometry;

/// Most bytes one discard of the data area covers: a huge drive is deallocated in bounded steps,
/// so no single call (one `BLKDISCARD` ioctl) runs for minutes and progress keeps moving.
pub const DISCARD_CHUNK_MAX: u64 = 1 << 30;

/// How far a long operation has come: `done` of `total` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Bytes done so far; never decreases, and reaches `total` when the operation succeeds.
    pub done: u64,
    /// Bytes the operation covers.
    pub total: u64,
}

impl<D: BlockDevice> Pool<D> {
    /// As [`Pool::format`], then deallocates (discards) everything past the metadata, the way
    /// mkfs and `zpool create` trim a new drive: SSDs and thin backends get the space back, and no
    /// previous owner's data stays readable on the device. `progress` is called with 0 first, then
    /// after each chunk (at most [`DISCARD_CHUNK_MAX`] bytes, about 1% of the area).
    ///
    /// The pool is durable before the first data discard: an interruption leaves a valid empty
    /// pool whose free clusters still hold old bytes, which is all [`Pool::format`] promises.
    /// Discard is a required operation of [`BlockDevice`] (core erases metadata with it), so a
    /// failing discard fails the format like any other device error.
    pub fn format_discarding(dev: D, options: FormatOptions, progress: &mut dyn FnMut(Progress)) -> Result<Self> {
        let mut pool = Self::format(dev, options)?;
        let start = pool.geo.journal_start() + pool.geo.journal_blocks;
        let end = pool.geo.block_count;
        let total = pool.geo.bytes(end - start);
        let chunk = discard_chunk(&pool.geo, end - start);
        progress(Progress { done: 0, total });
        let mut at = start;
        while at < end {
            // Chunk boundaries at absolute multiples of `chunk` (whole clusters): a device never
            // sees a discard granule split between two calls, which some would skip.
            let next = ((at / chunk + 1) * chunk).min(end);
            pool.dev.discard(at, next - at).map_err(dev_err)?;
            at = next;
            progress(Progress {
                done: pool.geo.bytes(at - start),
                total,
            });
        }
        pool.dev.flush().map_err(dev_err)?;
        Ok(pool)
    }

    /// The uuid of the pool on `dev`, reading only its superblocks; `None` when neither copy is
    /// valid. Unlike [`Pool::open`] (which discards the journal past its tail) it never writes.
    /// A superblock of a format version this build does not read, with an incompatible feature
    /// it lacks (`Error::Unsupported`), or with a geometry that does not validate, is an error:
    /// the device holds a pool this build cannot read.
    pub fn probe(dev: &mut D) -> Result<Option<[u8; 16]>> {
        match read_superblock(dev, false).and_then(|sb| sb.check().map(|_| sb)) {
            Ok(sb) => Ok(Some(sb.uuid)),
            Err(Error::Corrupt(Corruption::NoSuperblock)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Blocks per discard: about 1% of `blocks`, so progress moves in percent steps on any device, in
/// whole clusters, at most [`DISCARD_CHUNK_MAX`] bytes.
fn discard_chunk(geo: &Geometry, blocks: u64) -> u64 {
    let per_cluster = geo.blocks_per_cluster();
    let max = (DISCARD_CHUNK_MAX / u64::from(geo.block_size)).max(per_cluster);
    (blocks / 100).next_multiple_of(per_cluster).clamp(per_cluster, max)
}
