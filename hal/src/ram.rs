//! A sparse RAM device: blocks exist only once written, so a multi-terabyte thin pool fits in a
//! test. Every write is durable at once (pair it with [`FaultDevice`](crate::FaultDevice) to model
//! volatile caches and power cuts).

use std::collections::BTreeMap;

use crate::error::{check_blocks, check_range, Error};

/// A sparse in-memory [`BlockDevice`](edgevol_core::BlockDevice). Never-written and discarded blocks read as zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamDevice {
    block_size: u32,
    block_count: u64,
    blocks: BTreeMap<u64, Box<[u8]>>,
    read_only: bool,
}

impl RamDevice {
    /// An empty device of `block_count` blocks of `block_size` bytes.
    ///
    /// # Panics
    /// If `block_size` is not a power of two of at least 512.
    pub fn new(block_size: u32, block_count: u64) -> Self {
        assert!(
            block_size.is_power_of_two() && block_size >= 512,
            "bad block size {block_size}"
        );
        Self {
            block_size,
            block_count,
            blocks: BTreeMap::new(),
            read_only: false,
        }
    }

    /// Makes later writes and discards fail with [`Error::ReadOnly`] (or allows them again).
    pub fn set_read_only(&mut self, read_only: bool) {
        self.read_only = read_only;
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Number of blocks.
    pub fn block_count(&self) -> u64 {
        self.block_count
    }

    /// Blocks currently holding data (written and not discarded).
    pub fn allocated_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Reads whole blocks from `block`.
    pub fn read_blocks(&self, block: u64, buf: &mut [u8]) -> Result<(), Error> {
        check_blocks(self.block_size, self.block_count, block, buf.len())?;
        for (i, chunk) in buf.chunks_exact_mut(self.block_size as usize).enumerate() {
            match self.blocks.get(&(block + i as u64)) {
                Some(data) => chunk.copy_from_slice(data),
                None => chunk.fill(0),
            }
        }
        Ok(())
    }

    /// Writes whole blocks from `block`.
    pub fn write_blocks(&mut self, block: u64, data: &[u8]) -> Result<(), Error> {
        check_blocks(self.block_size, self.block_count, block, data.len())?;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        for (i, chunk) in data.chunks_exact(self.block_size as usize).enumerate() {
            let slot = self
                .blocks
                .entry(block + i as u64)
                .or_insert_with(|| chunk.into());
            slot.copy_from_slice(chunk);
        }
        Ok(())
    }

    /// Drops `count` blocks from `block`: they read as zeros until written again.
    pub fn discard_blocks(&mut self, block: u64, count: u64) -> Result<(), Error> {
        check_range(self.block_count, block, count)?;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let doomed: Vec<u64> = self
            .blocks
            .range(block..block + count)
            .map(|(&b, _)| b)
            .collect();
        for b in doomed {
            self.blocks.remove(&b);
        }
        Ok(())
    }

    /// Nothing in RAM is volatile in the device's sense: the flush has nothing to do.
    pub fn sync(&self) -> Result<(), Error> {
        Ok(())
    }
}

forward_block_device!(RamDevice);

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::{BlockDevice, DeviceError, DeviceErrorKind};

    #[test]
    fn sparse_read_write_discard() {
        // 1 TiB of 4 KiB blocks: only written blocks cost memory.
        let mut d = RamDevice::new(4096, 1 << 28);
        let mut buf = vec![0xAAu8; 8192];
        d.read(5, &mut buf).unwrap();
        assert!(
            buf.iter().all(|&b| b == 0),
            "unwritten blocks read as zeros"
        );
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        d.write((1 << 28) - 2, &data).unwrap();
        d.read((1 << 28) - 2, &mut buf).unwrap();
        assert_eq!(buf, data);
        assert_eq!(d.allocated_blocks(), 2);
        d.discard((1 << 28) - 2, 1).unwrap();
        assert_eq!(d.allocated_blocks(), 1);
        d.read((1 << 28) - 2, &mut buf).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0));
        assert_eq!(&buf[4096..], &data[4096..]);
    }

    #[test]
    fn bounds_alignment_read_only() {
        let mut d = RamDevice::new(512, 8);
        let e = d.write(7, &[0; 1024]).unwrap_err();
        assert_eq!(e.kind(), DeviceErrorKind::OutOfBounds);
        let e = d.write(0, &[0; 100]).unwrap_err();
        assert_eq!(e.kind(), DeviceErrorKind::NotAligned);
        assert_eq!(
            d.discard(u64::MAX, 2).unwrap_err().kind(),
            DeviceErrorKind::OutOfBounds
        );
        d.set_read_only(true);
        assert_eq!(
            d.write(0, &[1; 512]).unwrap_err().kind(),
            DeviceErrorKind::ReadOnly
        );
    }
}
