//! A device in RAM, for tests and benches. Every write is durable at once; `discard` zeroes.

use alloc::vec;
use alloc::vec::Vec;

use crate::device::{check_discard, check_io, BlockDevice, DeviceErrorKind, ErrorType};

/// A [`BlockDevice`] backed by a `Vec<u8>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamDevice {
    block_size: u32,
    bytes: Vec<u8>,
}

impl RamDevice {
    /// A zeroed device of `block_count` blocks of `block_size` bytes.
    ///
    /// # Panics
    /// If `block_size` is not a power of two of at least 512, or the size overflows `usize`.
    pub fn new(block_size: u32, block_count: u64) -> Self {
        assert!(block_size.is_power_of_two() && block_size >= 512, "bad block size");
        let len = usize::try_from(block_count)
            .ok()
            .and_then(|n| n.checked_mul(block_size as usize))
            .expect("device too large for memory");
        Self {
            block_size,
            bytes: vec![0; len],
        }
    }

    /// The whole medium, for inspection.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The whole medium, for corruption tests.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }

    fn range(&self, block: u64, len: usize) -> Result<core::ops::Range<usize>, DeviceErrorKind> {
        check_io(self, block, len)?;
        let start = usize::try_from(block * u64::from(self.block_size)).map_err(|_| DeviceErrorKind::OutOfBounds)?;
        Ok(start..start + len)
    }
}

impl ErrorType for RamDevice {
    type Error = DeviceErrorKind;
}

impl BlockDevice for RamDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn block_count(&self) -> u64 {
        (self.bytes.len() / self.block_size as usize) as u64
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), DeviceErrorKind> {
        let r = self.range(block, buf.len())?;
        buf.copy_from_slice(&self.bytes[r]);
        Ok(())
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), DeviceErrorKind> {
        let r = self.range(block, data.len())?;
        self.bytes[r].copy_from_slice(data);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), DeviceErrorKind> {
        Ok(())
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), DeviceErrorKind> {
        check_discard(self, block, count)?;
        let bs = self.block_size as usize;
        let start = usize::try_from(block).map_err(|_| DeviceErrorKind::OutOfBounds)? * bs;
        let len = usize::try_from(count).map_err(|_| DeviceErrorKind::OutOfBounds)? * bs;
        self.bytes[start..start + len].fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_alignment_are_checked() {
        let mut d = RamDevice::new(512, 4);
        let mut buf = [0u8; 512];
        assert_eq!(d.read(4, &mut buf), Err(DeviceErrorKind::OutOfBounds));
        assert_eq!(d.write(0, &buf[..100]), Err(DeviceErrorKind::NotAligned));
        assert_eq!(d.discard(3, 2), Err(DeviceErrorKind::OutOfBounds));
        assert_eq!(d.discard(u64::MAX, 2), Err(DeviceErrorKind::OutOfBounds));
    }

    #[test]
    fn write_read_discard_round_trip() {
        let mut d = RamDevice::new(512, 4);
        let data = [7u8; 1024];
        d.write(2, &data).unwrap();
        let mut back = [0u8; 1024];
        // Through the `&mut T` blanket impl, as adapters will.
        fn read_via<D: BlockDevice>(mut dev: D, block: u64, buf: &mut [u8]) {
            dev.read(block, buf).unwrap();
        }
        read_via(&mut d, 2, &mut back);
        assert_eq!(back, data);
        d.discard(3, 1).unwrap();
        d.read(2, &mut back).unwrap();
        assert!(back[..512].iter().all(|&b| b == 7) && back[512..].iter().all(|&b| b == 0));
    }
}
