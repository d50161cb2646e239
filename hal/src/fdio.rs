//! Positioned I/O on a file descriptor shared by the file and Linux block backends: full
//! transfers (short reads/writes retried), and a bounce through an aligned buffer when the caller's
//! buffer does not meet `O_DIRECT`'s alignment.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::buf::{is_aligned, AlignedBuf};
use crate::error::{check_blocks, check_range, Error};

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

/// An open descriptor seen as whole blocks: what the file and Linux block backends share. Bounds
/// and read-only checks come first, then one positioned transfer.
#[derive(Debug)]
pub(crate) struct BlockFile {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) block_size: u32,
    pub(crate) block_count: u64,
    /// `O_DIRECT`'s buffer alignment, `None` when buffered.
    pub(crate) direct_align: Option<usize>,
    pub(crate) read_only: bool,
}

impl BlockFile {
    fn offset(&self, block: u64) -> u64 {
        block * u64::from(self.block_size)
    }

    pub(crate) fn read_blocks(&self, block: u64, buf: &mut [u8]) -> Result<(), Error> {
        check_blocks(self.block_size, self.block_count, block, buf.len())?;
        read_exact_at(
            &self.file,
            &self.path,
            self.offset(block),
            buf,
            self.direct_align,
        )
    }

    pub(crate) fn write_blocks(&self, block: u64, data: &[u8]) -> Result<(), Error> {
        check_blocks(self.block_size, self.block_count, block, data.len())?;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        write_all_at(
            &self.file,
            &self.path,
            self.offset(block),
            data,
            self.direct_align,
        )
    }

    /// Checks a range of `count` blocks for a discard or zeroing: its byte `[offset, length]`.
    pub(crate) fn byte_range(&self, block: u64, count: u64) -> Result<[u64; 2], Error> {
        check_range(self.block_count, block, count)?;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        Ok([self.offset(block), count * u64::from(self.block_size)])
    }

    pub(crate) fn sync(&self) -> Result<(), Error> {
        self.file
            .sync_data()
            .map_err(|e| Error::io("fdatasync", Some(&self.path), e))
    }

    pub(crate) fn try_clone_file(&self) -> Result<File, Error> {
        self.file
            .try_clone()
            .map_err(|e| Error::io("dup", Some(&self.path), e))
    }
}
