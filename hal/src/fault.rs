//! A fault-injecting adapter around any [`BlockDevice`]: power cut after N writes (with the last
//! write torn), loss or tearing of everything not yet flushed at the cut (core's power-cut
//! contract, decided by a seeded PRNG), I/O errors on chosen blocks, and added latency.
//!
//! Like tigerbeetle's `testing/storage.zig`: every run is reproducible from its seed; print it.
// Casts: block counts index in-memory buffers whose length already fits usize.
#![allow(clippy::cast_possible_truncation)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use edgevol_core::{BlockDevice, DeviceError, DeviceErrorKind, ErrorType};

/// What to inject.
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    /// PRNG seed for every random decision.
    pub seed: u64,
    /// Cut power during the Nth write (1-based) counted from power-on: that write is torn (some of
    /// its sectors land, the rest keep their old content) and every unflushed write is resolved.
    pub cut_after_writes: Option<u64>,
    /// At a cut, each unflushed block independently keeps its new content, reverts to the old, or
    /// is torn at a random 512-byte sector boundary. When false, unflushed writes all survive (a
    /// device without a volatile cache).
    pub lose_unflushed: bool,
    /// Blocks whose reads fail with an injected I/O error.
    pub read_errors: BTreeSet<u64>,
    /// Blocks whose writes fail with an injected I/O error (nothing is written).
    pub write_errors: BTreeSet<u64>,
    /// Sleep added before every read, write, flush and discard.
    pub latency: Option<Duration>,
}

/// Counters since construction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Completed reads.
    pub reads: u64,
    /// Completed (acknowledged) writes.
    pub writes: u64,
    /// Completed flushes.
    pub flushes: u64,
    /// Completed discards.
    pub discards: u64,
    /// Power cuts so far.
    pub power_cuts: u64,
    /// Unflushed blocks reverted or torn at cuts.
    pub blocks_lost: u64,
}

/// The error of a [`FaultDevice`]: injected, or the inner device's.
#[derive(Debug)]
pub enum FaultError<E> {
    /// Power is off (cut by the config or [`FaultDevice::cut_power`]).
    PowerLoss,
    /// An injected I/O error on this block.
    Injected {
        /// The failing block.
        block: u64,
    },
    /// The wrapped device failed.
    Inner(E),
}

impl<E: fmt::Debug> fmt::Display for FaultError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PowerLoss => f.write_str("power cut (fault injection)"),
            Self::Injected { block } => write!(f, "injected I/O error at block {block}"),
            Self::Inner(e) => write!(f, "inner device: {e:?}"),
        }
    }
}

impl<E: fmt::Debug> std::error::Error for FaultError<E> {}

impl<E: DeviceError> DeviceError for FaultError<E> {
    fn kind(&self) -> DeviceErrorKind {
        match self {
            Self::PowerLoss => DeviceErrorKind::PowerLoss,
            Self::Injected { .. } => DeviceErrorKind::Io,
            Self::Inner(e) => e.kind(),
        }
    }
}

/// A fault device over a hal backend fails with hal's rich error, like any other hal device.
impl From<FaultError<crate::Error>> for crate::Error {
    fn from(e: FaultError<crate::Error>) -> Self {
        match e {
            FaultError::PowerLoss => Self::PowerLoss,
            FaultError::Injected { block } => Self::InjectedIo { block },
            FaultError::Inner(e) => e,
        }
    }
}

/// splitmix64: small, seedable, good enough to pick fault outcomes.
#[derive(Debug, Clone)]
pub(crate) struct Prng(u64);

impl Prng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Fault-injecting wrapper; see the module docs.
#[derive(Debug)]
pub struct FaultDevice<D> {
    inner: D,
    cfg: FaultConfig,
    rng: Prng,
    powered: bool,
    writes_since_power_on: u64,
    /// Old content of every block written since the last flush (first write wins).
    unflushed: BTreeMap<u64, Box<[u8]>>,
    stats: FaultStats,
}

impl<D: BlockDevice> FaultDevice<D> {
    /// Wraps `inner`.
    pub fn new(inner: D, cfg: FaultConfig) -> Self {
        let rng = Prng::new(cfg.seed);
        Self {
            inner,
            cfg,
            rng,
            powered: true,
            writes_since_power_on: 0,
            unflushed: BTreeMap::new(),
            stats: FaultStats::default(),
        }
    }

    /// The configuration, to change faults between steps.
    pub fn config_mut(&mut self) -> &mut FaultConfig {
        &mut self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    /// Whether power is on.
    pub fn is_powered(&self) -> bool {
        self.powered
    }

    /// The wrapped device (its content is what survived).
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// Unwraps.
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// Cuts power now: unflushed writes are resolved per [`FaultConfig::lose_unflushed`].
    pub fn cut_power(&mut self) -> Result<(), FaultError<D::Error>> {
        if !self.powered {
            return Ok(());
        }
        self.powered = false;
        self.stats.power_cuts += 1;
        let pending = std::mem::take(&mut self.unflushed);
        if !self.cfg.lose_unflushed {
            return Ok(());
        }
        let bs = self.inner.block_size() as usize;
        let mut cur = vec![0u8; bs];
        for (block, old) in pending {
            match self.rng.below(3) {
                0 => continue, // the new content made it
                1 => self.inner.write(block, &old).map_err(FaultError::Inner)?,
                _ => {
                    // Torn: a prefix of sectors is new, the rest old (or the reverse).
                    self.inner
                        .read(block, &mut cur)
                        .map_err(FaultError::Inner)?;
                    let sectors = bs / 512;
                    let cut =
                        512 * (1 + self.rng.below(sectors.max(2) as u64 - 1) as usize).min(bs);
                    if self.rng.below(2) == 0 {
                        cur[cut..].copy_from_slice(&old[cut..]);
                    } else {
                        cur[..cut].copy_from_slice(&old[..cut]);
                    }
                    self.inner.write(block, &cur).map_err(FaultError::Inner)?;
                }
            }
            self.stats.blocks_lost += 1;
        }
        Ok(())
    }

    /// Restores power: the write counter restarts and the cut point is consumed.
    pub fn power_on(&mut self) {
        self.powered = true;
        self.writes_since_power_on = 0;
        self.cfg.cut_after_writes = None;
    }

    fn pre(&self) -> Result<(), FaultError<D::Error>> {
        if let Some(d) = self.cfg.latency {
            std::thread::sleep(d);
        }
        if self.powered {
            Ok(())
        } else {
            Err(FaultError::PowerLoss)
        }
    }

    /// Reads blocks, failing on configured bad blocks.
    pub fn read_blocks(&mut self, block: u64, buf: &mut [u8]) -> Result<(), FaultError<D::Error>> {
        self.pre()?;
        let n = (buf.len() / self.inner.block_size() as usize) as u64;
        if let Some(&b) = self
            .cfg
            .read_errors
            .range(block..block.saturating_add(n))
            .next()
        {
            return Err(FaultError::Injected { block: b });
        }
        self.inner.read(block, buf).map_err(FaultError::Inner)?;
        self.stats.reads += 1;
        Ok(())
    }

    /// Writes blocks, remembering old content until the next flush; may cut power.
    pub fn write_blocks(&mut self, block: u64, data: &[u8]) -> Result<(), FaultError<D::Error>> {
        self.pre()?;
        let bs = self.inner.block_size() as usize;
        let n = (data.len() / bs) as u64;
        if let Some(&b) = self
            .cfg
            .write_errors
            .range(block..block.saturating_add(n))
            .next()
        {
            return Err(FaultError::Injected { block: b });
        }
        if edgevol_core::device::check_io(&self.inner, block, data.len()).is_err() {
            // Let the inner device reject it with its own rich error.
            return self.inner.write(block, data).map_err(FaultError::Inner);
        }
        let mut old = vec![0u8; bs];
        for i in 0..n {
            if !self.unflushed.contains_key(&(block + i)) {
                self.inner
                    .read(block + i, &mut old)
                    .map_err(FaultError::Inner)?;
                self.unflushed
                    .insert(block + i, old.clone().into_boxed_slice());
            }
        }
        self.writes_since_power_on += 1;
        if self.cfg.cut_after_writes == Some(self.writes_since_power_on) {
            // The write in flight at the cut: a random prefix of its blocks lands.
            let landed = self.rng.below(n + 1) as usize;
            self.inner
                .write(block, &data[..landed * bs])
                .map_err(FaultError::Inner)?;
            self.cut_power()?;
            return Err(FaultError::PowerLoss);
        }
        self.inner.write(block, data).map_err(FaultError::Inner)?;
        self.stats.writes += 1;
        Ok(())
    }

    /// Flushes the inner device; unflushed state is cleared on success.
    pub fn flush_all(&mut self) -> Result<(), FaultError<D::Error>> {
        self.pre()?;
        self.inner.flush().map_err(FaultError::Inner)?;
        self.unflushed.clear();
        self.stats.flushes += 1;
        Ok(())
    }

    /// Discards on the inner device.
    pub fn discard_blocks(&mut self, block: u64, count: u64) -> Result<(), FaultError<D::Error>> {
        self.pre()?;
        self.inner
            .discard(block, count)
            .map_err(FaultError::Inner)?;
        self.stats.discards += 1;
        Ok(())
    }
}

impl<D: BlockDevice> ErrorType for FaultDevice<D> {
    type Error = FaultError<D::Error>;
}

impl<D: BlockDevice> BlockDevice for FaultDevice<D> {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), Self::Error> {
        self.read_blocks(block, buf)
    }
    fn write(&mut self, block: u64, data: &[u8]) -> Result<(), Self::Error> {
        self.write_blocks(block, data)
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        self.flush_all()
    }
    fn discard(&mut self, block: u64, count: u64) -> Result<(), Self::Error> {
        self.discard_blocks(block, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RamDevice;

    fn blk(v: u8) -> Vec<u8> {
        vec![v; 4096]
    }

    #[test]
    fn cut_after_n_writes_keeps_flushed_and_tears_in_flight() {
        let cfg = FaultConfig {
            seed: 7,
            cut_after_writes: Some(3),
            lose_unflushed: true,
            ..Default::default()
        };
        let mut d = FaultDevice::new(RamDevice::new(4096, 64), cfg);
        d.write(0, &blk(1)).unwrap();
        d.flush().unwrap();
        d.write(1, &blk(2)).unwrap();
        let e = d.write(2, &[blk(3), blk(3)].concat()).unwrap_err();
        assert_eq!(e.kind(), DeviceErrorKind::PowerLoss);
        assert!(!d.is_powered());
        assert_eq!(
            d.read(0, &mut [0; 4096]).unwrap_err().kind(),
            DeviceErrorKind::PowerLoss
        );
        assert_eq!(d.stats().power_cuts, 1);
        d.power_on();
        let mut b = vec![0u8; 4096];
        d.read(0, &mut b).unwrap();
        assert_eq!(b, blk(1), "flushed write survives");
        // Unflushed block 1: old (zeros), new (2s), or a sector-granular mix of both.
        d.read(1, &mut b).unwrap();
        assert!(
            b.chunks(512)
                .all(|s| s.iter().all(|&x| x == 0) || s.iter().all(|&x| x == 2)),
            "{:?}",
            &b[..8]
        );
        for blk_no in [2u64, 3] {
            d.read(blk_no, &mut b).unwrap();
            assert!(b
                .chunks(512)
                .all(|s| s.iter().all(|&x| x == 0) || s.iter().all(|&x| x == 3)));
        }
        // After power-on the cut point is consumed.
        for i in 0..10 {
            d.write(i, &blk(9)).unwrap();
        }
    }

    #[test]
    fn every_outcome_of_unflushed_writes_appears_over_seeds() {
        let (mut new, mut old, mut torn) = (0, 0, 0);
        for seed in 0..200 {
            let cfg = FaultConfig {
                seed,
                lose_unflushed: true,
                ..Default::default()
            };
            let mut d = FaultDevice::new(RamDevice::new(4096, 4), cfg);
            d.write(0, &blk(0xAA)).unwrap();
            d.cut_power().unwrap();
            d.power_on();
            let mut b = vec![0u8; 4096];
            d.read(0, &mut b).unwrap();
            match (b.iter().all(|&x| x == 0xAA), b.iter().all(|&x| x == 0)) {
                (true, _) => new += 1,
                (_, true) => old += 1,
                _ => torn += 1,
            }
        }
        assert!(
            new > 0 && old > 0 && torn > 0,
            "new {new} old {old} torn {torn}"
        );
        // Without a volatile cache nothing acknowledged is lost.
        let mut d = FaultDevice::new(RamDevice::new(4096, 4), FaultConfig::default());
        d.write(0, &blk(5)).unwrap();
        d.cut_power().unwrap();
        d.power_on();
        let mut b = vec![0u8; 4096];
        d.read(0, &mut b).unwrap();
        assert_eq!(b, blk(5));
    }

    #[test]
    fn injected_errors_latency_and_inner_errors() {
        let cfg = FaultConfig {
            read_errors: [5].into(),
            write_errors: [9].into(),
            latency: Some(Duration::from_millis(2)),
            ..Default::default()
        };
        let mut d = FaultDevice::new(RamDevice::new(512, 16), cfg);
        let t = std::time::Instant::now();
        assert!(matches!(
            d.read(4, &mut [0; 1024]),
            Err(FaultError::Injected { block: 5 })
        ));
        assert!(matches!(
            d.write(8, &[1; 1024]),
            Err(FaultError::Injected { block: 9 })
        ));
        let mut b = [7u8; 512];
        d.read(8, &mut b).unwrap();
        assert_eq!(b, [0; 512], "failed write wrote nothing");
        assert!(t.elapsed() >= Duration::from_millis(6));
        assert!(matches!(
            d.write(16, &[0; 512]),
            Err(FaultError::Inner(crate::Error::OutOfBounds { .. }))
        ));
        assert_eq!(
            d.write(0, &[0; 100]).unwrap_err().kind(),
            DeviceErrorKind::NotAligned
        );
        d.discard(0, 16).unwrap();
        d.config_mut().read_errors.clear();
        d.read(4, &mut [0; 1024]).unwrap();
        assert_eq!(d.stats().discards, 1);
    }
}
