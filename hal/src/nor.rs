//! Raw NOR flash: a RAM simulator with erase counters and power cuts ([`NorSim`]), and an adapter
//! that shows any `embedded-storage` [`NorFlash`] as core's [`BlockDevice`] ([`NorBlockDevice`]),
//! so core's own pool and journal run on raw flash (one block = one erase block; core discards,
//! i.e. erases, every metadata range before it rewrites it). `tests/nor_pool.rs` runs a core pool
//! on it through power cuts.
//!
//! NOR rules the simulator enforces: programming only clears bits (1 -> 0), erasing sets a whole
//! erase block to `0xFF`, and both are aligned to `WRITE_SIZE` / `ERASE_SIZE`.
// Casts: embedded-storage addresses flash with u32 offsets; every offset is bounded by capacity(), checked at each entry point.
#![allow(clippy::cast_possible_truncation)]

use std::fmt;

use edgevol_core::{BlockDevice, DeviceError, DeviceErrorKind, ErrorType};
use embedded_storage::nor_flash::{
    check_erase, check_read, check_write, ErrorType as NorErrorType, NorFlash, NorFlashError,
    NorFlashErrorKind, ReadNorFlash,
};

use crate::fault::Prng;

/// Errors of the [`NorSim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NorSimError {
    /// Offset or length not aligned to the operation's unit.
    NotAligned,
    /// Past the end of the flash.
    OutOfBounds,
    /// Programming would need a 0 -> 1 transition at this byte offset (area not erased).
    NotErased(u32),
    /// Power was cut; nothing succeeds until [`NorSim::power_on`].
    PowerLoss,
}

impl NorFlashError for NorSimError {
    fn kind(&self) -> NorFlashErrorKind {
        match self {
            Self::NotAligned => NorFlashErrorKind::NotAligned,
            Self::OutOfBounds => NorFlashErrorKind::OutOfBounds,
            Self::NotErased(_) | Self::PowerLoss => NorFlashErrorKind::Other,
        }
    }
}

/// NOR flash in RAM with `WRITE`-byte program units and `ERASE`-byte erase blocks.
///
/// Power cuts: [`cut_after_ops`](Self::cut_after_ops) counts programs and erases; the op that
/// reaches the count is torn (a program lands a random prefix of its words, the next word with a
/// random subset of its bits; an erase leaves random bytes) and the flash goes dark.
#[derive(Debug, Clone)]
pub struct NorSim<const WRITE: usize, const ERASE: usize> {
    mem: Vec<u8>,
    erase_counts: Vec<u32>,
    rng: Prng,
    ops: u64,
    cut_at: Option<u64>,
    powered: bool,
}

impl<const WRITE: usize, const ERASE: usize> NorSim<WRITE, ERASE> {
    const GEOMETRY_OK: () =
        assert!(WRITE > 0 && ERASE.is_multiple_of(WRITE) && ERASE.is_power_of_two());

    /// `blocks` erase blocks, all erased (0xFF), random decisions from `seed`.
    pub fn new(blocks: usize, seed: u64) -> Self {
        let () = Self::GEOMETRY_OK;
        Self {
            mem: vec![0xFF; blocks * ERASE],
            erase_counts: vec![0; blocks],
            rng: Prng::new(seed),
            ops: 0,
            cut_at: None,
            powered: true,
        }
    }

    /// Cuts power during the `n`th program/erase from now (1 = the next one).
    pub fn cut_after_ops(&mut self, n: u64) {
        self.cut_at = Some(self.ops + n);
    }

    /// Restores power (any pending cut is cancelled).
    pub fn power_on(&mut self) {
        self.powered = true;
        self.cut_at = None;
    }

    /// Whether power is on.
    pub fn is_powered(&self) -> bool {
        self.powered
    }

    /// Erases per erase block so far.
    pub fn erase_counts(&self) -> &[u32] {
        &self.erase_counts
    }

    /// Raw content, for inspection and corruption tests.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    fn tick(&mut self) -> Result<bool, NorSimError> {
        if !self.powered {
            return Err(NorSimError::PowerLoss);
        }
        self.ops += 1;
        Ok(self.cut_at == Some(self.ops))
    }

    /// Programs `data` at `offset` (bits can only go 1 -> 0).
    pub fn program(&mut self, offset: u32, data: &[u8]) -> Result<(), NorSimError> {
        check_write(self, offset, data.len())
            .map_err(|_| self.range_err(offset, data.len(), WRITE))?;
        let start = offset as usize;
        if let Some(i) = data
            .iter()
            .zip(&self.mem[start..])
            .position(|(&new, &old)| new & !old != 0)
        {
            return Err(NorSimError::NotErased(offset + i as u32));
        }
        if self.tick()? {
            let words = data.len() / WRITE;
            let full = self.rng.below(words as u64 + 1) as usize * WRITE;
            for (m, &d) in self.mem[start..start + full].iter_mut().zip(data) {
                *m &= d;
            }
            if full < data.len() {
                let mask = self.rng.next_u64().to_le_bytes();
                for (i, m) in self.mem[start + full..start + full + WRITE]
                    .iter_mut()
                    .enumerate()
                {
                    *m &= data[full + i] | mask[i % 8];
                }
            }
            self.powered = false;
            return Err(NorSimError::PowerLoss);
        }
        for (m, &d) in self.mem[start..start + data.len()].iter_mut().zip(data) {
            *m &= d;
        }
        Ok(())
    }

    /// Erases `[from, to)` (whole erase blocks).
    pub fn erase_range(&mut self, from: u32, to: u32) -> Result<(), NorSimError> {
        check_erase(self, from, to)
            .map_err(|_| self.range_err(from, to.saturating_sub(from) as usize, ERASE))?;
        for b in (from as usize / ERASE)..(to as usize / ERASE) {
            let cut = self.tick()?;
            self.erase_counts[b] += 1;
            let block = &mut self.mem[b * ERASE..(b + 1) * ERASE];
            if cut {
                for chunk in block.chunks_mut(8) {
                    let r = self.rng.next_u64().to_le_bytes();
                    chunk.copy_from_slice(&r[..chunk.len()]);
                }
                self.powered = false;
                return Err(NorSimError::PowerLoss);
            }
            block.fill(0xFF);
        }
        Ok(())
    }

    fn range_err(&self, offset: u32, len: usize, align: usize) -> NorSimError {
        if !(offset as usize).is_multiple_of(align) || !len.is_multiple_of(align) {
            NorSimError::NotAligned
        } else {
            NorSimError::OutOfBounds
        }
    }
}

impl<const WRITE: usize, const ERASE: usize> NorErrorType for NorSim<WRITE, ERASE> {
    type Error = NorSimError;
}

impl<const WRITE: usize, const ERASE: usize> ReadNorFlash for NorSim<WRITE, ERASE> {
    const READ_SIZE: usize = 1;
    fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), NorSimError> {
        check_read(self, offset, bytes.len()).map_err(|_| NorSimError::OutOfBounds)?;
        if !self.powered {
            return Err(NorSimError::PowerLoss);
        }
        bytes.copy_from_slice(&self.mem[offset as usize..offset as usize + bytes.len()]);
        Ok(())
    }
    fn capacity(&self) -> usize {
        self.mem.len()
    }
}

impl<const WRITE: usize, const ERASE: usize> NorFlash for NorSim<WRITE, ERASE> {
    const WRITE_SIZE: usize = WRITE;
    const ERASE_SIZE: usize = ERASE;
    fn erase(&mut self, from: u32, to: u32) -> Result<(), NorSimError> {
        self.erase_range(from, to)
    }
    fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), NorSimError> {
        self.program(offset, bytes)
    }
}

/// Error of [`NorBlockDevice`]: the flash's own error, or an access the adapter refuses.
#[derive(Debug)]
pub enum NorError<E> {
    /// The flash failed.
    Flash(E),
    /// The block was written without being discarded (erased) first.
    NotErased {
        /// The block.
        block: u64,
    },
    /// Access outside the device.
    OutOfBounds,
    /// Length not a whole number of blocks.
    NotAligned,
}

impl<E: fmt::Debug> fmt::Display for NorError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flash(e) => write!(f, "flash: {e:?}"),
            Self::NotErased { block } => write!(f, "block {block} written without erase"),
            Self::OutOfBounds => f.write_str("out of bounds"),
            Self::NotAligned => f.write_str("not aligned"),
        }
    }
}

impl<E: fmt::Debug> std::error::Error for NorError<E> {}

/// A flash error maps through its [`NorFlashErrorKind`]; embedded-storage has no power-loss kind,
/// so a flash that went dark (like [`NorSim`] after a cut) is an `Io` error here.
impl<E: NorFlashError> DeviceError for NorError<E> {
    fn kind(&self) -> DeviceErrorKind {
        match self {
            Self::Flash(e) => match e.kind() {
                NorFlashErrorKind::NotAligned => DeviceErrorKind::NotAligned,
                NorFlashErrorKind::OutOfBounds => DeviceErrorKind::OutOfBounds,
                _ => DeviceErrorKind::Io,
            },
            Self::OutOfBounds => DeviceErrorKind::OutOfBounds,
            Self::NotAligned => DeviceErrorKind::NotAligned,
            Self::NotErased { .. } => DeviceErrorKind::Io,
        }
    }
}

impl fmt::Display for NorSimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Core's [`BlockDevice`] over a [`NorFlash`]: one block = one erase block; `discard` erases;
/// `write` programs a block that must have been discarded (checked by reading it back first);
/// `flush` has nothing to do because NOR programs are durable when they return.
#[derive(Debug)]
pub struct NorBlockDevice<F> {
    flash: F,
}

impl<F: NorFlash> NorBlockDevice<F> {
    const GEOMETRY_OK: () = assert!(F::ERASE_SIZE.is_power_of_two() && F::ERASE_SIZE >= 512);

    /// Wraps `flash`; its erase size (a power of two >= 512) becomes the block size.
    pub fn new(flash: F) -> Self {
        let () = Self::GEOMETRY_OK;
        Self { flash }
    }

    /// The flash.
    pub fn flash_mut(&mut self) -> &mut F {
        &mut self.flash
    }

    /// Unwraps the flash (to power it on again after a simulated cut, say).
    pub fn into_flash(self) -> F {
        self.flash
    }

    fn span(&self, block: u64, len: usize) -> Result<u32, NorError<F::Error>> {
        let bs = F::ERASE_SIZE;
        if !len.is_multiple_of(bs) {
            return Err(NorError::NotAligned);
        }
        let end = block
            .checked_add((len / bs) as u64)
            .ok_or(NorError::OutOfBounds)?;
        if end > self.flash.capacity() as u64 / bs as u64 {
            return Err(NorError::OutOfBounds);
        }
        u32::try_from(block * bs as u64).map_err(|_| NorError::OutOfBounds)
    }

    /// Reads whole erase blocks.
    pub fn read_blocks(&mut self, block: u64, buf: &mut [u8]) -> Result<(), NorError<F::Error>> {
        let off = self.span(block, buf.len())?;
        self.flash.read(off, buf).map_err(NorError::Flash)
    }

    /// Programs whole, previously discarded erase blocks.
    pub fn write_blocks(&mut self, block: u64, data: &[u8]) -> Result<(), NorError<F::Error>> {
        let off = self.span(block, data.len())?;
        let mut cur = vec![0u8; F::ERASE_SIZE];
        for (i, chunk) in data.chunks_exact(F::ERASE_SIZE).enumerate() {
            let o = off + (i * F::ERASE_SIZE) as u32;
            self.flash.read(o, &mut cur).map_err(NorError::Flash)?;
            if cur.iter().any(|&b| b != 0xFF) {
                return Err(NorError::NotErased {
                    block: block + i as u64,
                });
            }
            self.flash.write(o, chunk).map_err(NorError::Flash)?;
        }
        Ok(())
    }

    /// Erases `count` blocks.
    pub fn erase_blocks(&mut self, block: u64, count: u64) -> Result<(), NorError<F::Error>> {
        let len = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(F::ERASE_SIZE))
            .ok_or(NorError::OutOfBounds)?;
        let off = self.span(block, len)?;
        self.flash
            .erase(off, off + len as u32)
            .map_err(NorError::Flash)
    }
}

impl<F: NorFlash> ErrorType for NorBlockDevice<F> {
    type Error = NorError<F::Error>;
}

impl<F: NorFlash> BlockDevice for NorBlockDevice<F> {
    fn block_size(&self) -> u32 {
        F::ERASE_SIZE as u32
    }
    fn block_count(&self) -> u64 {
        (self.flash.capacity() / F::ERASE_SIZE) as u64
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), Self::Error> {
        self.read_blocks(block, buf)
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), Self::Error> {
        self.write_blocks(block, data)
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(()) // NOR programs and erases are durable when they return.
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), Self::Error> {
        self.erase_blocks(block, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Sim = NorSim<4, 4096>;

    #[test]
    fn sim_enforces_nor_rules_and_counts_erases() {
        let mut f = Sim::new(4, 1);
        f.write(0, &[0x0F; 8]).unwrap();
        f.write(0, &[0x07; 8]).unwrap(); // clearing more bits is fine
        assert_eq!(f.write(0, &[0xF0; 4]), Err(NorSimError::NotErased(0)));
        assert_eq!(f.write(2, &[0; 4]), Err(NorSimError::NotAligned));
        assert_eq!(f.write(16384, &[0; 4]), Err(NorSimError::OutOfBounds));
        assert_eq!(f.erase(0, 100), Err(NorSimError::NotAligned));
        f.erase(0, 8192).unwrap();
        let mut b = [0u8; 8];
        f.read(0, &mut b).unwrap();
        assert_eq!(b, [0xFF; 8]);
        assert_eq!(f.erase_counts(), &[1, 1, 0, 0]);
        // A cut during a program lands a prefix; then everything fails until power-on.
        f.cut_after_ops(1);
        assert_eq!(f.write(4096, &[0u8; 64]), Err(NorSimError::PowerLoss));
        assert_eq!(f.read(0, &mut b), Err(NorSimError::PowerLoss));
        f.power_on();
        let mut blk = vec![0u8; 64];
        f.read(4096, &mut blk).unwrap();
        // Whole words programmed, then at most one partly programmed word, then erased words.
        let words: Vec<&[u8]> = blk.chunks(4).collect();
        let done = words
            .iter()
            .take_while(|w| w.iter().all(|&x| x == 0))
            .count();
        assert!(
            words
                .iter()
                .skip(done + 1)
                .all(|w| w.iter().all(|&x| x == 0xFF)),
            "{blk:?}"
        );
    }

    #[test]
    fn nor_block_device_requires_discard_before_write() {
        let mut d = NorBlockDevice::new(Sim::new(8, 2));
        assert_eq!(BlockDevice::block_size(&d), 4096);
        assert_eq!(BlockDevice::block_count(&d), 8);
        d.write(1, &[0xA5; 4096]).unwrap(); // fresh flash is erased
        assert!(matches!(
            d.write(1, &[0x5A; 4096]),
            Err(NorError::NotErased { block: 1 })
        ));
        d.discard(1, 1).unwrap();
        d.write(1, &[0x5A; 4096]).unwrap();
        d.flush().unwrap();
        let mut b = vec![0u8; 4096];
        d.read(1, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0x5A));
        assert_eq!(
            d.read(8, &mut b).unwrap_err().kind(),
            DeviceErrorKind::OutOfBounds
        );
        assert_eq!(
            d.write(0, &b[..100]).unwrap_err().kind(),
            DeviceErrorKind::NotAligned
        );
        assert_eq!(d.flash_mut().erase_counts()[1], 1);
    }
}
