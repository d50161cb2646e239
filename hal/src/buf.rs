//! Heap buffers aligned for `O_DIRECT` I/O.
//!
//! `O_DIRECT` needs the buffer address, the file offset and the length aligned to the device's
//! logical block size; `Vec<u8>` only guarantees byte alignment, so this type owns an allocation
//! made with an explicit [`Layout`]. This module is one of the few places hal allows `unsafe`.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment hal uses for every I/O buffer: the largest logical block size Linux supports on
/// x86-64 (the page size), so one buffer type fits every device.
pub const IO_ALIGN: usize = 4096;

/// A zero-initialised byte buffer whose start is aligned to [`IO_ALIGN`] (or more).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like Vec<u8>; no interior mutability or shared
// pointers escape except through &self/&mut self borrows.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8], which is Sync.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to [`IO_ALIGN`].
    pub fn zeroed(len: usize) -> Self {
        Self::with_align(len, IO_ALIGN)
    }

    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two).
    ///
    /// # Panics
    /// If `align` is not a power of two or the size overflows; aborts if allocation fails.
    pub fn with_align(len: usize, align: usize) -> Self {
        // A zero-size Layout may not be passed to alloc: allocate at least one aligned unit.
        let size = len.max(1).next_multiple_of(align);
        let layout = Layout::from_size_align(size, align).expect("valid buffer layout");
        // SAFETY: layout has a non-zero size (at least `align` bytes).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Self { ptr, len, layout }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::zeroed(data.len());
        b.copy_from_slice(data);
        b
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Alignment of the start address.
    pub fn align(&self) -> usize {
        self.layout.align()
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to `layout.size() >= len` initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was returned by alloc_zeroed with exactly this layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        let mut b = Self::with_align(self.len, self.align());
        b.copy_from_slice(self);
        b
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.align())
            .finish()
    }
}

/// Whether `buf` starts at an address aligned to `align`.
pub(crate) fn is_aligned(buf: &[u8], align: usize) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(align)
}

/// Writes zeros over `count` blocks of `block_size` bytes from `block`, through `write(block,
/// bytes)`, 256 blocks at a time from one aligned buffer: for devices that have no cheaper way to
/// zero (no holes, no Write Zeroes).
pub(crate) fn write_zeros<E>(
    block_size: u64,
    block: u64,
    count: u64,
    mut write: impl FnMut(u64, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    const CHUNK: u64 = 256;
    let zeros = AlignedBuf::zeroed(usize::try_from(CHUNK * block_size).unwrap_or(0));
    let mut b = block;
    while b < block + count {
        let n = CHUNK.min(block + count - b);
        let len = usize::try_from(n * block_size).unwrap_or(usize::MAX);
        write(b, &zeros[..len])?;
        b += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_writable() {
        for len in [0, 1, 511, 4096, 4097, 131072] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(is_aligned(&b, IO_ALIGN), "len {len}");
            assert!(b.iter().all(|&x| x == 0));
            b.fill(0xA5);
            let c = b.clone();
            assert_eq!(&c[..], &b[..]);
            assert!(is_aligned(&c, IO_ALIGN));
        }
        let b = AlignedBuf::with_align(100, 65536);
        assert_eq!(b.align(), 65536);
        assert!(is_aligned(&b, 65536));
    }
}
