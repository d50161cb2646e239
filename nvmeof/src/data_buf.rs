//! A PDU's data buffer whose bytes start on a page boundary, so that a write's data can go from
//! the socket to an `O_DIRECT` device without a copy into aligned memory.
//!
//! Safe code only: the buffer owns a zero-filled `Vec<u8>` over-allocated by [`DATA_ALIGN`] and
//! exposes the bytes from the first page boundary in it. The `Vec` is never resized once made
//! (growing makes a new one), so its heap memory stays put for the buffer's life, also when the
//! buffer (or the `Vec`, through [`DataBuf::into_parts`]) is moved: a device layer can own the
//! `Vec` while the kernel writes from it, without this crate knowing that layer.
//!
//! Every buffer is aligned, small ones too: small PDUs (admin and fabrics commands) are rare and
//! recycled like the rest, so their over-allocation costs little, and one kind of buffer keeps
//! the decoder's reuse simple.

use core::fmt;
use core::ops::{Deref, DerefMut};

/// Alignment of the data's first byte: the page, the most any `O_DIRECT` device needs.
pub const DATA_ALIGN: usize = 4096;

/// Bytes received for one PDU or command, starting at a [`DATA_ALIGN`] boundary.
#[derive(Default)]
pub struct DataBuf {
    /// The allocation; its length never changes.
    bytes: Vec<u8>,
    /// Where the data starts in `bytes` (the first aligned address).
    start: usize,
    /// Bytes of data.
    len: usize,
}

impl DataBuf {
    /// An empty buffer that holds `capacity` bytes without allocating again.
    pub fn with_capacity(capacity: usize) -> Self {
        if capacity == 0 {
            return DataBuf::default();
        }
        let bytes = vec![0u8; capacity + DATA_ALIGN - 1];
        let misalign = bytes.as_ptr().addr() % DATA_ALIGN;
        let start = (DATA_ALIGN - misalign) % DATA_ALIGN;
        DataBuf {
            bytes,
            start,
            len: 0,
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn copy_of(data: &[u8]) -> Self {
        let mut b = DataBuf::with_capacity(data.len());
        b.extend_from_slice(data);
        b
    }

    /// Bytes of data it can hold without allocating again.
    pub fn capacity(&self) -> usize {
        self.bytes.len() - self.start
    }

    /// Bytes it has allocated (what it costs to keep).
    pub fn allocated(&self) -> usize {
        self.bytes.capacity()
    }

    /// Whether the data starts at a [`DATA_ALIGN`] boundary (false only when empty and never
    /// allocated).
    pub fn is_aligned(&self) -> bool {
        self.bytes[self.start..]
            .as_ptr()
            .addr()
            .is_multiple_of(DATA_ALIGN)
    }

    /// Forgets the data; keeps the allocation.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `data`; when it does not fit, moves to a new allocation that does (a copy).
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        let end = self.len + data.len();
        if end > self.capacity() {
            let mut grown = DataBuf::with_capacity(end);
            grown.extend_from_slice(self);
            *self = grown;
        }
        let at = self.start + self.len;
        self.bytes[at..at + data.len()].copy_from_slice(data);
        self.len = end;
    }

    /// The room after the data, to receive into; then [`DataBuf::commit`] what was written.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let at = self.start + self.len;
        &mut self.bytes[at..]
    }

    /// Counts `n` bytes written into [`DataBuf::spare_mut`] as data (at most the room there).
    pub fn commit(&mut self, n: usize) {
        debug_assert!(n <= self.capacity() - self.len, "committed past the buffer");
        self.len = (self.len + n).min(self.capacity());
    }

    /// The allocation, where the data starts in it and its length: for a layer that owns the
    /// memory while a device writes from it. [`DataBuf::from_parts`] makes it a buffer again.
    pub fn into_parts(self) -> (Vec<u8>, usize, usize) {
        (self.bytes, self.start, self.len)
    }

    /// A buffer from [`DataBuf::into_parts`]; a start or length outside `bytes` is clamped to
    /// it.
    pub fn from_parts(bytes: Vec<u8>, start: usize, len: usize) -> Self {
        let start = start.min(bytes.len());
        let len = len.min(bytes.len() - start);
        DataBuf { bytes, start, len }
    }
}

impl Deref for DataBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }
}

impl DerefMut for DataBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

impl Clone for DataBuf {
    fn clone(&self) -> Self {
        DataBuf::copy_of(self)
    }
}

impl fmt::Debug for DataBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

impl PartialEq for DataBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for DataBuf {}

impl PartialEq<[u8]> for DataBuf {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<&[u8]> for DataBuf {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}

impl PartialEq<Vec<u8>> for DataBuf {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for DataBuf {
    fn eq(&self, other: &[u8; N]) -> bool {
        **self == other[..]
    }
}

impl From<&[u8]> for DataBuf {
    /// A copy of the bytes, aligned.
    fn from(data: &[u8]) -> Self {
        DataBuf::copy_of(data)
    }
}

impl From<Vec<u8>> for DataBuf {
    /// A copy of the bytes, aligned (a `Vec`'s own memory has no alignment to keep).
    fn from(data: Vec<u8>) -> Self {
        DataBuf::copy_of(&data)
    }
}

impl FromIterator<u8> for DataBuf {
    fn from_iter<I: IntoIterator<Item = u8>>(iter: I) -> Self {
        DataBuf::copy_of(&iter.into_iter().collect::<Vec<u8>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_starts_on_a_page_boundary_whatever_its_size() {
        for cap in [1, 100, 511, 4096, 4097, 128 * 1024] {
            let mut b = DataBuf::with_capacity(cap);
            assert!(b.is_aligned(), "capacity {cap}");
            assert!(b.capacity() >= cap);
            b.extend_from_slice(&vec![7; cap]);
            assert_eq!(b.as_ptr().addr() % DATA_ALIGN, 0);
            assert_eq!(b.len(), cap);
        }
    }

    #[test]
    fn extending_within_capacity_keeps_the_memory_and_past_it_moves_the_data() {
        let mut b = DataBuf::with_capacity(8);
        b.extend_from_slice(b"abcd");
        let at = b.as_ptr();
        b.extend_from_slice(b"efgh");
        assert_eq!(b.as_ptr(), at, "no reallocation within capacity");
        b.extend_from_slice(b"ij");
        assert_eq!(b, *b"abcdefghij");
        assert!(b.is_aligned(), "the new allocation is aligned too");
    }

    #[test]
    fn received_bytes_count_once_committed() {
        let mut b = DataBuf::with_capacity(16);
        b.extend_from_slice(b"ab");
        b.spare_mut()[..3].copy_from_slice(b"cde");
        assert_eq!(b, *b"ab");
        b.commit(3);
        assert_eq!(b, *b"abcde");
    }

    #[test]
    fn parts_round_trip_without_moving_the_data() {
        let b = DataBuf::copy_of(&[1, 2, 3, 4]);
        let at = b.as_ptr();
        let (bytes, start, len) = b.into_parts();
        assert_eq!((bytes[start..start + len].as_ptr(), len), (at, 4));
        let b = DataBuf::from_parts(bytes, start, len);
        assert_eq!((b.as_ptr(), &b[..]), (at, &[1u8, 2, 3, 4][..]));
        // Out of range parts are clamped, not a panic.
        let (bytes, _, _) = b.into_parts();
        let total = bytes.len();
        let b = DataBuf::from_parts(bytes, total + 5, 9);
        assert!(b.is_empty());
    }

    #[test]
    fn an_unallocated_buffer_is_empty_and_not_aligned() {
        let b = DataBuf::default();
        assert_eq!((b.len(), b.capacity(), b.allocated()), (0, 0, 0));
        assert!(!b.is_aligned());
    }
}
