//! Raw NOR flash: a RAM simulator with erase counters and power cuts ([`NorSim`]), an adapter that
//! shows any `embedded-storage` [`NorFlash`] as core's [`BlockDevice`] ([`NorBlockDevice`]), and an
//! append-only, erase-block-aware record journal over [`NorFlash`] ([`NorJournal`]) for metadata
//! that is appended in records much smaller than an erase block.
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
    const GEOMETRY_OK: () = assert!(WRITE > 0 && ERASE % WRITE == 0 && ERASE.is_power_of_two());

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
        if offset as usize % align != 0 || len % align != 0 {
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

/// Error of the NOR adapters: the flash's own error, or a format problem found on it.
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
    /// Length not a whole number of blocks / write units.
    NotAligned,
    /// The journal has no erase block it may reclaim: call [`NorJournal::release_through`].
    Full,
    /// A record larger than one erase block can hold.
    TooLarge {
        /// Payload length.
        len: usize,
        /// Largest payload.
        max: usize,
    },
    /// A record that should be valid is not: the journal refuses to open.
    Corrupt {
        /// Erase block.
        block: usize,
        /// Offset in the block.
        offset: usize,
        /// What failed.
        what: &'static str,
    },
}

impl<E: fmt::Debug> fmt::Display for NorError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flash(e) => write!(f, "flash: {e:?}"),
            Self::NotErased { block } => write!(f, "block {block} written without erase"),
            Self::OutOfBounds => f.write_str("out of bounds"),
            Self::NotAligned => f.write_str("not aligned"),
            Self::Full => f.write_str("journal full"),
            Self::TooLarge { len, max } => write!(f, "record {len} > {max} bytes"),
            Self::Corrupt {
                block,
                offset,
                what,
            } => write!(f, "journal corrupt at block {block} +{offset}: {what}"),
        }
    }
}

impl<E: fmt::Debug> std::error::Error for NorError<E> {}

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
            Self::NotErased { .. } | Self::Corrupt { .. } => DeviceErrorKind::Io,
            Self::Full | Self::TooLarge { .. } => DeviceErrorKind::Other,
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

    fn span(&self, block: u64, len: usize) -> Result<u32, NorError<F::Error>> {
        let bs = F::ERASE_SIZE;
        if len % bs != 0 {
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

const BLOCK_MAGIC: u32 = 0x4A4E_5645; // "EVNJ"
const HDR_XOR: u32 = 0x5EED_F1A5;
const PAYLOAD_XOR: u32 = 0xC0FF_EE11;
const BLOCK_HDR: usize = 20; // magic u32, epoch u64, prev_end u32, crc u32
const REC_HDR: usize = 20; // len u32, seq u64, header crc u32, payload crc u32

fn pad<F: NorFlash>(n: usize) -> usize {
    n.next_multiple_of(F::WRITE_SIZE)
}

/// One erase block of the live chain.
#[derive(Debug, Clone, Copy)]
struct LiveBlock {
    index: usize,
    epoch: u64,
    /// Highest sequence number stored in it (None: no record yet).
    last_seq: Option<u64>,
}

/// An append-only record log over a [`NorFlash`], used as a ring of erase blocks.
///
/// - Each erase block starts with a header (magic, epoch = position in the ring's history, the
///   end of valid data in the previous block, CRC32C); records follow, each framed as length,
///   sequence number, a CRC of those two, and a CRC of the payload (both XORed with constants so
///   erased or zeroed flash never validates), padded to `WRITE_SIZE`. A record never spans blocks.
/// - Blocks are used strictly in ring order, so erases spread evenly over the flash.
/// - Recovery: the valid header with the highest epoch is the head; the chain runs back through
///   consecutive epochs. Every record before a block's recorded end must validate (otherwise
///   [`NorError::Corrupt`]); in the head a failing record ends the log (torn tail) unless a valid
///   record follows it (corruption). After a torn tail the next append opens a fresh block whose
///   header records where valid data ended, so the torn bytes are never read again.
/// - Space: the caller says which records it no longer needs ([`release_through`](Self::release_through),
///   e.g. after a checkpoint); a block is reclaimed only when all its records are released,
///   otherwise [`append`](Self::append) answers [`NorError::Full`].
#[derive(Debug)]
pub struct NorJournal<F> {
    flash: F,
    blocks: usize,
    chain: std::collections::VecDeque<LiveBlock>,
    write_off: usize,
    /// The head's tail is torn: the next append must open a new block.
    head_sealed: bool,
    next_seq: u64,
    released: Option<u64>,
}

impl<F: NorFlash> NorJournal<F> {
    const GEOMETRY_OK: () =
        assert!(F::ERASE_SIZE >= 4 * (BLOCK_HDR + REC_HDR) && F::WRITE_SIZE <= 64);

    /// Largest payload one record can carry.
    pub const MAX_PAYLOAD: usize =
        F::ERASE_SIZE - BLOCK_HDR.next_multiple_of(F::WRITE_SIZE) - REC_HDR;

    /// Opens (recovers) the journal on `flash`; an erased flash is an empty journal.
    pub fn open(mut flash: F) -> Result<Self, NorError<F::Error>> {
        let () = Self::GEOMETRY_OK;
        let blocks = flash.capacity() / F::ERASE_SIZE;
        let mut epochs = vec![None; blocks];
        let mut hdr = [0u8; BLOCK_HDR];
        let mut prev_ends = vec![0usize; blocks];
        for (i, e) in epochs.iter_mut().enumerate() {
            flash
                .read((i * F::ERASE_SIZE) as u32, &mut hdr)
                .map_err(NorError::Flash)?;
            if let Some((epoch, prev_end)) = parse_block_header(&hdr) {
                *e = Some(epoch);
                prev_ends[i] = prev_end;
            }
        }
        let mut j = Self {
            flash,
            blocks,
            chain: Default::default(),
            write_off: 0,
            head_sealed: false,
            next_seq: 0,
            released: None,
        };
        let Some(head) = (0..blocks)
            .filter(|&i| epochs[i].is_some())
            .max_by_key(|&i| epochs[i])
        else {
            return Ok(j);
        };
        let head_epoch = epochs[head].unwrap_or(0);
        let mut idx = head;
        let mut epoch = head_epoch;
        let mut chain = std::collections::VecDeque::new();
        loop {
            chain.push_front(LiveBlock {
                index: idx,
                epoch,
                last_seq: None,
            });
            if chain.len() == blocks || epoch == 1 {
                break;
            }
            let prev = (idx + blocks - 1) % blocks;
            if epochs[prev] != Some(epoch - 1) {
                break;
            }
            idx = prev;
            epoch -= 1;
        }
        // Scan every block: non-head blocks up to the end their successor recorded.
        let mut expected_seq: Option<u64> = None;
        for k in 0..chain.len() {
            let b = chain[k].index;
            let limit = if k + 1 < chain.len() {
                Some(prev_ends[chain[k + 1].index])
            } else {
                None
            };
            let mut last = None;
            let end = j.scan_block(b, limit, |seq, _| {
                if expected_seq.is_some_and(|e| e != seq) {
                    return Err("sequence gap");
                }
                expected_seq = Some(seq + 1);
                last = Some(seq);
                Ok(())
            })?;
            chain[k].last_seq = last;
            if k + 1 == chain.len() {
                j.write_off = end.offset;
                j.head_sealed = end.torn;
            }
        }
        j.next_seq = expected_seq.unwrap_or(0);
        j.chain = chain;
        Ok(j)
    }

    /// Scans block `b`'s records, calling `f(seq, payload)`. Returns where valid data ends.
    fn scan_block(
        &mut self,
        b: usize,
        limit: Option<usize>,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), &'static str>,
    ) -> Result<ScanEnd, NorError<F::Error>> {
        let base = b * F::ERASE_SIZE;
        let mut block = vec![0u8; F::ERASE_SIZE];
        self.flash
            .read(base as u32, &mut block)
            .map_err(NorError::Flash)?;
        let mut off = pad::<F>(BLOCK_HDR);
        let corrupt = |offset, what| NorError::Corrupt {
            block: b,
            offset,
            what,
        };
        let stop = limit.unwrap_or(F::ERASE_SIZE);
        if stop > F::ERASE_SIZE || stop < off && limit.is_some() {
            return Err(corrupt(0, "block end out of range"));
        }
        while off < stop {
            match parse_record(&block[off..stop.min(F::ERASE_SIZE)]) {
                Rec::Valid { seq, payload_len } => {
                    f(seq, &block[off + REC_HDR..off + REC_HDR + payload_len])
                        .map_err(|w| corrupt(off, w))?;
                    off += pad::<F>(REC_HDR + payload_len);
                }
                Rec::Erased if limit.is_none() => {
                    return Ok(ScanEnd {
                        offset: off,
                        torn: false,
                    })
                }
                Rec::Erased => return Err(corrupt(off, "erased before recorded end")),
                Rec::Bad { next } => {
                    if limit.is_some() {
                        return Err(corrupt(off, "bad record before recorded end"));
                    }
                    // Head block: torn tail, unless a valid record follows a trustworthy length.
                    if let Some(n) = next {
                        let n = off + pad::<F>(REC_HDR + n);
                        if n < F::ERASE_SIZE
                            && matches!(parse_record(&block[n..]), Rec::Valid { .. })
                        {
                            return Err(corrupt(off, "bad record followed by valid records"));
                        }
                    }
                    return Ok(ScanEnd {
                        offset: off,
                        torn: true,
                    });
                }
            }
        }
        Ok(ScanEnd {
            offset: off,
            torn: false,
        })
    }

    /// Appends a record; returns its sequence number. Durable when this returns `Ok` (NOR
    /// programs are synchronous). A power cut during the call may leave it absent or present.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64, NorError<F::Error>> {
        if payload.len() > Self::MAX_PAYLOAD {
            return Err(NorError::TooLarge {
                len: payload.len(),
                max: Self::MAX_PAYLOAD,
            });
        }
        let rec_len = pad::<F>(REC_HDR + payload.len());
        if self.chain.is_empty() || self.head_sealed || self.write_off + rec_len > F::ERASE_SIZE {
            self.open_next_block()?;
        }
        let head = self.chain.back().map(|h| h.index).ok_or(NorError::Full)?;
        let seq = self.next_seq;
        let mut rec = vec![0xFFu8; rec_len];
        rec[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        rec[4..12].copy_from_slice(&seq.to_le_bytes());
        let hcrc = crc32c::crc32c(&rec[0..12]) ^ HDR_XOR;
        rec[12..16].copy_from_slice(&hcrc.to_le_bytes());
        rec[16..20].copy_from_slice(&(crc32c::crc32c(payload) ^ PAYLOAD_XOR).to_le_bytes());
        rec[REC_HDR..REC_HDR + payload.len()].copy_from_slice(payload);
        let off = head * F::ERASE_SIZE + self.write_off;
        let r = self.flash.write(off as u32, &rec);
        // Whatever happened, these bytes are no longer erased: never program them again.
        self.write_off += rec_len;
        if let Err(e) = r {
            self.write_off -= rec_len;
            self.head_sealed = true;
            return Err(NorError::Flash(e));
        }
        self.next_seq += 1;
        if let Some(h) = self.chain.back_mut() {
            h.last_seq = Some(seq);
        }
        Ok(seq)
    }

    fn open_next_block(&mut self) -> Result<(), NorError<F::Error>> {
        let (next, epoch, prev_end) = match self.chain.back() {
            Some(h) => ((h.index + 1) % self.blocks, h.epoch + 1, self.write_off),
            None => (0, 1, 0),
        };
        if let Some(oldest) = self.chain.front().copied() {
            if oldest.index == next {
                if oldest
                    .last_seq
                    .is_some_and(|s| self.released.is_none_or(|r| s > r))
                {
                    return Err(NorError::Full);
                }
                self.chain.pop_front();
            }
        }
        let base = (next * F::ERASE_SIZE) as u32;
        // From here the new head is in use: a failure below leaves it sealed for the next try.
        self.head_sealed = true;
        self.flash
            .erase(base, base + F::ERASE_SIZE as u32)
            .map_err(NorError::Flash)?;
        let mut hdr = vec![0xFFu8; pad::<F>(BLOCK_HDR)];
        hdr[0..4].copy_from_slice(&BLOCK_MAGIC.to_le_bytes());
        hdr[4..12].copy_from_slice(&epoch.to_le_bytes());
        hdr[12..16].copy_from_slice(&(prev_end as u32).to_le_bytes());
        let crc = crc32c::crc32c(&hdr[0..16]) ^ HDR_XOR;
        hdr[16..20].copy_from_slice(&crc.to_le_bytes());
        self.flash.write(base, &hdr).map_err(NorError::Flash)?;
        self.chain.push_back(LiveBlock {
            index: next,
            epoch,
            last_seq: None,
        });
        self.write_off = pad::<F>(BLOCK_HDR);
        self.head_sealed = false;
        Ok(())
    }

    /// Declares records up to `seq` (inclusive) no longer needed: their blocks may be erased.
    pub fn release_through(&mut self, seq: u64) {
        self.released = Some(self.released.map_or(seq, |r| r.max(seq)));
    }

    /// Sequence number the next append gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Calls `f(seq, payload)` for every record in the journal, oldest first.
    pub fn for_each(&mut self, mut f: impl FnMut(u64, &[u8])) -> Result<(), NorError<F::Error>> {
        let chain: Vec<LiveBlock> = self.chain.iter().copied().collect();
        for (k, b) in chain.iter().enumerate() {
            let limit = if k + 1 < chain.len() {
                let mut hdr = [0u8; BLOCK_HDR];
                self.flash
                    .read((chain[k + 1].index * F::ERASE_SIZE) as u32, &mut hdr)
                    .map_err(NorError::Flash)?;
                parse_block_header(&hdr).map(|(_, end)| end)
            } else {
                Some(self.write_off)
            };
            self.scan_block(b.index, limit, |s, p| {
                f(s, p);
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Unwraps the flash.
    pub fn into_flash(self) -> F {
        self.flash
    }

    /// The flash.
    pub fn flash(&self) -> &F {
        &self.flash
    }
}

struct ScanEnd {
    offset: usize,
    torn: bool,
}

enum Rec {
    Valid {
        seq: u64,
        payload_len: usize,
    },
    Erased,
    /// A record that does not validate; `next` is its payload length when the header CRC holds.
    Bad {
        next: Option<usize>,
    },
}

fn parse_block_header(h: &[u8; BLOCK_HDR]) -> Option<(u64, usize)> {
    let magic = u32::from_le_bytes(h[0..4].try_into().ok()?);
    let crc = u32::from_le_bytes(h[16..20].try_into().ok()?);
    if magic != BLOCK_MAGIC || crc32c::crc32c(&h[0..16]) ^ HDR_XOR != crc {
        return None;
    }
    let epoch = u64::from_le_bytes(h[4..12].try_into().ok()?);
    let prev_end = u32::from_le_bytes(h[12..16].try_into().ok()?) as usize;
    Some((epoch, prev_end))
}

fn parse_record(b: &[u8]) -> Rec {
    if b.len() < REC_HDR {
        return if b.iter().all(|&x| x == 0xFF) {
            Rec::Erased
        } else {
            Rec::Bad { next: None }
        };
    }
    if b[..REC_HDR].iter().all(|&x| x == 0xFF) {
        return Rec::Erased;
    }
    let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let hcrc = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
    if crc32c::crc32c(&b[0..12]) ^ HDR_XOR != hcrc {
        return Rec::Bad { next: None };
    }
    if REC_HDR + len > b.len() {
        return Rec::Bad { next: None };
    }
    let pcrc = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
    if crc32c::crc32c(&b[REC_HDR..REC_HDR + len]) ^ PAYLOAD_XOR != pcrc {
        return Rec::Bad { next: Some(len) };
    }
    let seq = u64::from_le_bytes(b[4..12].try_into().expect("8 bytes"));
    Rec::Valid {
        seq,
        payload_len: len,
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

    fn payload(seq: u64) -> Vec<u8> {
        let len = 8 + (seq.wrapping_mul(2_654_435_761) % 180) as usize;
        (0..len)
            .map(|i| (seq as u8).wrapping_add(i as u8).wrapping_mul(13))
            .collect()
    }

    fn collect<F: NorFlash>(j: &mut NorJournal<F>) -> Vec<(u64, Vec<u8>)> {
        let mut v = Vec::new();
        j.for_each(|s, p| v.push((s, p.to_vec()))).unwrap();
        v
    }

    #[test]
    fn journal_reopen_full_and_too_large() {
        let mut j = NorJournal::open(NorSim::<4, 1024>::new(4, 3)).unwrap();
        assert_eq!(j.next_seq(), 0);
        for s in 0..30 {
            assert_eq!(j.append(&payload(s)).unwrap(), s);
        }
        let mut j = NorJournal::open(j.into_flash()).unwrap();
        assert_eq!(j.next_seq(), 30);
        let recs = collect(&mut j);
        assert_eq!(recs.len(), 30);
        assert!(recs.iter().all(|(s, p)| *p == payload(*s)));
        // Nothing released: the ring fills up and refuses to overwrite.
        let mut s = 30;
        let full = loop {
            match j.append(&payload(s)) {
                Ok(_) => s += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(full, NorError::Full), "{full}");
        j.release_through(s - 1);
        j.append(&payload(s)).unwrap();
        assert!(matches!(
            j.append(&[0; 2000]),
            Err(NorError::TooLarge { .. })
        ));
    }

    #[test]
    fn journal_detects_corruption_before_the_tail() {
        let mut j = NorJournal::open(NorSim::<4, 1024>::new(4, 4)).unwrap();
        for s in 0..20 {
            j.append(&payload(s)).unwrap();
        }
        let mut f = j.into_flash();
        // Flip a payload byte of the first record of block 0 (a sealed block): corruption.
        f.as_bytes_mut()[pad::<NorSim<4, 1024>>(BLOCK_HDR) + REC_HDR] ^= 0x40;
        let e = NorJournal::open(f).unwrap_err();
        assert!(matches!(e, NorError::Corrupt { block: 0, .. }), "{e}");
    }

    /// The check: 100,000 appends over a 64 KiB simulated NOR (16 x 4 KiB blocks) wrap
    /// many times, survive a power cut every few hundred operations, and wear blocks evenly.
    #[test]
    fn journal_100k_appends_wrap_survive_power_cuts_and_spread_erases() {
        const TOTAL: u64 = 100_000;
        let seed = 0xED6E_u64;
        println!("seed {seed:#x}");
        let mut rng = Prng::new(seed);
        let mut flash = Sim::new(16, seed);
        flash.cut_after_ops(50 + rng.below(400));
        let mut j = NorJournal::open(flash).unwrap();
        let mut acked: Option<u64> = None; // last acknowledged seq
        let mut checkpoint: Option<u64> = None; // "durable checkpoint": records up to it are released
        let (mut appends, mut cuts, mut torn_seen) = (0u64, 0u64, 0u64);
        while appends < TOTAL {
            let seq = j.next_seq();
            match j.append(&payload(seq)) {
                Ok(s) => {
                    assert_eq!(s, seq);
                    acked = Some(s);
                    appends += 1;
                    // A checkpoint every 64 records keeps the last ~64-128 records live.
                    if s % 64 == 63 {
                        checkpoint = Some(s - 32);
                        j.release_through(s - 32);
                    }
                }
                Err(NorError::Flash(NorSimError::PowerLoss)) => {
                    cuts += 1;
                    let mut flash = j.into_flash();
                    flash.power_on();
                    flash.cut_after_ops(50 + rng.below(400));
                    j = NorJournal::open(flash).expect("recovery after power cut");
                    if let Some(c) = checkpoint {
                        j.release_through(c);
                    }
                    let recs = collect(&mut j);
                    for w in recs.windows(2) {
                        assert_eq!(w[0].0 + 1, w[1].0, "contiguous sequence numbers");
                    }
                    for (s, p) in &recs {
                        assert_eq!(p, &payload(*s), "record {s} intact");
                    }
                    let last = recs.last().map(|r| r.0);
                    // Nothing acknowledged is lost; the in-flight record may or may not be there.
                    assert!(last >= acked, "last {last:?} acked {acked:?}");
                    assert!(last <= acked.map(|a| a + 1).or(Some(0)));
                    if last > acked {
                        acked = last; // the in-flight record fully landed before the cut
                    } else {
                        torn_seen += 1;
                    }
                    // Everything after the checkpoint is still there.
                    let first_needed = checkpoint.map_or(0, |c| c + 1);
                    if let (Some(first), Some(a)) = (recs.first(), acked) {
                        assert!(
                            first.0 <= first_needed.min(a),
                            "first {} needed {first_needed}",
                            first.0
                        );
                    }
                }
                Err(e) => panic!("append {seq}: {e}"),
            }
        }
        let counts = j.flash().erase_counts();
        let (max, min) = (*counts.iter().max().unwrap(), *counts.iter().min().unwrap());
        println!("{appends} appends, {cuts} power cuts ({torn_seen} in-flight records lost), erase counts min {min} max {max}: {counts:?}");
        assert!(cuts >= 100, "power cuts exercised: {cuts}");
        assert!(min >= 100, "journal wrapped many times: min erases {min}");
        assert!(
            max - min <= max / 10 + 2,
            "erases spread evenly: {min}..{max}"
        );
    }
}
