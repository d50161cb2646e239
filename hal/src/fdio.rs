//! Positioned I/O on a file descriptor shared by the file and Linux block backends: full
//! transfers (short reads/writes retried), and a bounce through an aligned buffer when the caller's
//! buffer does not meet `O_DIRECT`'s alignment.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::buf::{is_aligned, AlignedBuf};
use crate::error::Error;

/// Reads exactly `buf.len()` bytes at `offset`. With `direct_align`, bounces unaligned buffers.
pub(crate) fn read_exact_at(
    file: &File,
    path: &Path,
    offset: u64,
    buf: &mut [u8],
    direct_align: Option<usize>,
) -> Result<(), Error> {
    match direct_align {
        Some(a) if !is_aligned(buf, a) => {
            let mut bounce = AlignedBuf::with_align(buf.len(), a);
            file.read_exact_at(&mut bounce, offset)
                .map_err(|e| Error::io("pread", Some(path), e))?;
            buf.copy_from_slice(&bounce);
            Ok(())
        }
        _ => file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::io("pread", Some(path), e)),
    }
}

/// Writes all of `data` at `offset`. With `direct_align`, bounces unaligned buffers.
pub(crate) fn write_all_at(
    file: &File,
    path: &Path,
    offset: u64,
    data: &[u8],
    direct_align: Option<usize>,
) -> Result<(), Error> {
    match direct_align {
        Some(a) if !is_aligned(data, a) => {
            let bounce = {
                let mut b = AlignedBuf::with_align(data.len(), a);
                b.copy_from_slice(data);
                b
            };
            file.write_all_at(&bounce, offset)
                .map_err(|e| Error::io("pwrite", Some(path), e))
        }
        _ => file
            .write_all_at(data, offset)
            .map_err(|e| Error::io("pwrite", Some(path), e)),
    }
}
