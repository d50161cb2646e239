//! The buffer a command's data lives in, kept by its queue for the next command.

use std::sync::atomic::{AtomicU64, Ordering};

use edgevol_hal::AlignedBuf;

/// Copies of a write's data into aligned memory ([`ReadBuf::copy_from`]), since start.
static ALIGNED_COPIES: AtomicU64 = AtomicU64::new(0);

/// How many times a write's data was copied into aligned memory for an `O_DIRECT` device: the
/// fallback for host data that is not page-aligned, which the decoder's buffers always are.
pub fn aligned_copies() -> u64 {
    ALIGNED_COPIES.load(Ordering::Relaxed)
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
    pub(super) fn filled(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// Holds a copy of `data` (a write's, for the device ring's aligned I/O).
    pub fn copy_from(&mut self, data: &[u8]) {
        ALIGNED_COPIES.fetch_add(1, Ordering::Relaxed);
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
    pub(super) fn prepare(&mut self, len: usize) -> &mut [u8] {
        if self.buf.len() < len {
            self.buf = AlignedBuf::zeroed(len);
        }
        self.len = len;
        &mut self.buf[..len]
    }
}
