//! The block device core sits on: a small contract every backend in `hal` implements.
//!
//! # Power-cut contract
//!
//! Everything core needs from a device about crashes is said here, once:
//!
//! - A `write` that returned `Ok` but was not followed by a successful [`BlockDevice::flush`] may be
//!   lost after a power cut, wholly or in part: each block it touched holds its old content, its
//!   new content, or (for the blocks being written at the instant of the cut) any mix of the two.
//!   Core never assumes a write is atomic, not even a single block: every metadata structure it
//!   writes carries a CRC32C and is validated before use.
//! - After `flush` returns `Ok`, every write that returned `Ok` before the call started survives a
//!   power cut.
//! - A discarded block reads back as unspecified content (zeros, `0xFF`, or its old data) until it
//!   is written again. Core discards every metadata block range before it rewrites it, so
//!   erase-before-write media (NOR flash) map `discard` to an erase and expose their erase sector as
//!   the block.
//! - Reads never change what a later read returns.

/// What went wrong, as generic code (core) sees it. Backends keep their rich error and map it here.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceErrorKind {
    /// The access starts or ends past the last block.
    OutOfBounds,
    /// A buffer length is not a whole number of blocks.
    NotAligned,
    /// The medium or transport failed (EIO, timeout, uncorrectable ECC).
    Io,
    /// The device refuses writes (write-protected, worn-out flash).
    ReadOnly,
    /// The device lost power or was removed; nothing further will succeed.
    PowerLoss,
    /// Anything else.
    Other,
}

impl core::fmt::Display for DeviceErrorKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            Self::OutOfBounds => "access out of device bounds",
            Self::NotAligned => "buffer not a whole number of blocks",
            Self::Io => "I/O error",
            Self::ReadOnly => "device is read-only",
            Self::PowerLoss => "device lost power",
            Self::Other => "device error",
        };
        f.write_str(s)
    }
}

/// A device error: any type, as long as it can say which [`DeviceErrorKind`] it is.
pub trait DeviceError: core::fmt::Debug {
    /// The generic kind of this error.
    fn kind(&self) -> DeviceErrorKind;
}

impl DeviceError for DeviceErrorKind {
    fn kind(&self) -> DeviceErrorKind {
        *self
    }
}

/// Holds a device's error type, so adapters can name it without the whole device trait.
pub trait ErrorType {
    /// The error every method of the device returns.
    type Error: DeviceError;
}

impl<T: ErrorType + ?Sized> ErrorType for &mut T {
    type Error = T::Error;
}

/// A block device: fixed-size blocks addressed from 0, read and written whole.
///
/// Geometry is queried at run time (not associated consts) because Linux block devices, NVMe
/// namespaces and files only know it once opened. It must not change while the value lives.
pub trait BlockDevice: ErrorType {
    /// Bytes per block: a power of two, at least 512.
    fn block_size(&self) -> u32;

    /// Number of blocks.
    fn block_count(&self) -> u64;

    /// Reads `buf.len() / block_size` blocks starting at `block`.
    ///
    /// `buf.len()` must be a multiple of the block size ([`check_io`]).
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), Self::Error>;

    /// Writes `data.len() / block_size` blocks starting at `block`.
    ///
    /// Volatile until the next successful [`flush`](Self::flush): a power cut before it may lose or
    /// tear this write (see the module docs).
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), Self::Error>;

    /// Makes every write that completed before this call durable. A power cut after `Ok` loses none.
    fn flush(&mut self) -> Result<(), Self::Error>;

    /// Tells the device `count` blocks from `block` are unused; they read back unspecified until
    /// written again. Durable, like a write, only after the next flush.
    fn discard(&mut self, block: u64, count: u64) -> Result<(), Self::Error>;
}

impl<T: BlockDevice + ?Sized> BlockDevice for &mut T {
    fn block_size(&self) -> u32 {
        T::block_size(self)
    }
    fn block_count(&self) -> u64 {
        T::block_count(self)
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), Self::Error> {
        T::read(self, block, buf)
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), Self::Error> {
        T::write(self, block, data)
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        T::flush(self)
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), Self::Error> {
        T::discard(self, block, count)
    }
}

/// Bounds and alignment check every `read`/`write` implementation runs first: `len` bytes from
/// `block` must be whole blocks inside the device.
pub fn check_io<D: BlockDevice + ?Sized>(dev: &D, block: u64, len: usize) -> Result<(), DeviceErrorKind> {
    let bs = u64::from(dev.block_size());
    let len = u64::try_from(len).map_err(|_| DeviceErrorKind::OutOfBounds)?;
    if len % bs != 0 {
        return Err(DeviceErrorKind::NotAligned);
    }
    check_discard(dev, block, len / bs)
}

/// Bounds check for `discard` (and the block range behind [`check_io`]).
pub fn check_discard<D: BlockDevice + ?Sized>(dev: &D, block: u64, count: u64) -> Result<(), DeviceErrorKind> {
    match block.checked_add(count) {
        Some(end) if end <= dev.block_count() => Ok(()),
        _ => Err(DeviceErrorKind::OutOfBounds),
    }
}
