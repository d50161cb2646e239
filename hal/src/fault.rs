//! A fault-injecting adapter around any [`BlockDevice`], for hal's tests, the appliance's and
//! core's crash tests alike:
//!
//! - **Live faults**: power cut after N writes (the write in flight torn), loss or tearing of
//!   everything not yet flushed at the cut (core's power-cut contract, decided by a seeded PRNG),
//!   I/O errors on chosen blocks, added latency.
//! - **Discards** ([`DiscardMode`]): forwarded to the inner device (zeros on hal's RAM device and
//!   files), dropped (the blocks keep their old bytes, as a drive that ignores the hint), or either
//!   per discard, seeded. The device contract allows all of them; a consumer must cope with stale
//!   bytes it left behind.
//! - **Tears** ([`TearUnit`]): at 512-byte sector boundaries, or at any byte (the worst case, for
//!   checks that must not assume even sector atomicity: e.g. core's CRCs on 512-byte blocks).
//! - **Recording** ([`FaultDevice::start_recording`]): every completed write (with its data),
//!   discard (and whether it was forwarded) and flush, tagged with the caller's current operation
//!   ([`FaultDevice::set_tag`]). A [`Recording`] rebuilds, for EVERY write of a run, what a crash
//!   during it leaves ([`Recording::cuts`]): a **process crash** (the OS page cache survives: every
//!   write up to and including it) and a **power cut** (everything flushed survives; each block
//!   written or discarded since survives or not, independently and so out of order, later versions
//!   possibly where earlier ones were lost; the write in flight lands as a prefix torn at the
//!   [`TearUnit`]). One run of a workload then checks thousands of crash points without re-running
//!   it: core's `tests/pool/crash.rs`, `crash_persist.rs` and `persist.rs` do exactly that.
//! - **Counters** ([`FaultStats`]): reads, writes, flushes, discards, cuts.
//!
//! Like tigerbeetle's `testing/storage.zig`: every run is reproducible from its seed; print it.
// Casts: block counts index in-memory buffers whose length already fits usize.
#![allow(clippy::cast_possible_truncation)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use edgevol_core::{BlockDevice, DeviceError, DeviceErrorKind, ErrorType};

/// What a discard does to the blocks it covers (the device contract lets a discarded block read
/// back as anything until it is written again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DiscardMode {
    /// Passed to the inner device (hal's RAM device and files then read zeros).
    #[default]
    Forward,
    /// Dropped after the bounds check: the blocks keep their old bytes, so stale content stays
    /// where its owner may come across it again.
    KeepOld,
    /// Each discard is forwarded or dropped with probability 1/2 (seeded, decided when it is
    /// issued, so a [`Recording`] replays the same outcome).
    Random,
}

/// Where a torn block is split: the bytes before the split point are new, the rest old.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TearUnit {
    /// At a 512-byte sector boundary, a drive's atomic write unit: a 512-byte block never tears.
    #[default]
    Sector,
    /// At any byte.
    Byte,
}

impl TearUnit {
    fn bytes(self) -> usize {
        match self {
            Self::Sector => 512,
            Self::Byte => 1,
        }
    }
}

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
    /// What discards do.
    pub discard: DiscardMode,
    /// Where unflushed blocks tear at a power cut.
    pub tear: TearUnit,
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
#[derive(Debug, Clone)]
pub struct FaultDevice<D> {
    inner: D,
    cfg: FaultConfig,
    rng: Prng,
    powered: bool,
    writes_since_power_on: u64,
    /// Old content of every block written since the last flush (first write wins).
    unflushed: BTreeMap<u64, Box<[u8]>>,
    stats: FaultStats,
    /// The caller's label for the I/O it issues next (recorded with every event).
    tag: u64,
    recording: Option<Recording<D>>,
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
            tag: 0,
            recording: None,
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

    /// Labels the I/O issued from now on (e.g. the index of the workload operation issuing it):
    /// every recorded event carries the tag current when it completed.
    pub fn set_tag(&mut self, tag: u64) {
        self.tag = tag;
    }

    /// Starts (or restarts) recording: the inner device's content now becomes the base every
    /// rebuilt crash image starts from, and counts as durable (start right after a flush, e.g.
    /// once a pool is formatted), and every later write, discard and flush is logged.
    pub fn start_recording(&mut self)
    where
        D: Clone,
    {
        self.recording = Some(Recording {
            base: self.inner.clone(),
            events: Vec::new(),
        });
    }

    /// The recording so far, if one was started.
    pub fn recording(&self) -> Option<&Recording<D>> {
        self.recording.as_ref()
    }

    /// Stops recording and returns what was recorded.
    pub fn take_recording(&mut self) -> Option<Recording<D>> {
        self.recording.take()
    }

    fn record(&mut self, event: FaultEvent) {
        if let Some(r) = &mut self.recording {
            r.events.push(Recorded {
                tag: self.tag,
                event,
            });
        }
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
        let unit = self.cfg.tear.bytes().min(bs);
        let mut cur = vec![0u8; bs];
        for (block, old) in pending {
            match self.rng.below(3) {
                0 => continue, // the new content made it
                1 => self.inner.write(block, &old).map_err(FaultError::Inner)?,
                _ => {
                    // Torn: a prefix of units (sectors or bytes) is new, the rest old (or the
                    // reverse). A block of one unit cannot tear: it lands whole.
                    self.inner
                        .read(block, &mut cur)
                        .map_err(FaultError::Inner)?;
                    let units = bs / unit;
                    let cut = unit * (1 + self.rng.below(units.max(2) as u64 - 1) as usize).min(bs);
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
        if self.recording.is_some() {
            let data = data.to_vec();
            self.record(FaultEvent::Write { block, data });
        }
        Ok(())
    }

    /// Flushes the inner device; unflushed state is cleared on success.
    pub fn flush_all(&mut self) -> Result<(), FaultError<D::Error>> {
        self.pre()?;
        self.inner.flush().map_err(FaultError::Inner)?;
        self.unflushed.clear();
        self.stats.flushes += 1;
        self.record(FaultEvent::Flush);
        Ok(())
    }

    /// Discards per [`FaultConfig::discard`]: on the inner device, or nowhere (the blocks keep
    /// their bytes). Either way it is bounds-checked like the inner device's own discard.
    pub fn discard_blocks(&mut self, block: u64, count: u64) -> Result<(), FaultError<D::Error>> {
        self.pre()?;
        let forwarded = match self.cfg.discard {
            DiscardMode::Forward => true,
            DiscardMode::KeepOld => false,
            DiscardMode::Random => self.rng.below(2) == 0,
        };
        if forwarded || edgevol_core::device::check_discard(&self.inner, block, count).is_err() {
            // A bad range is the inner device's to reject, with its own rich error.
            self.inner
                .discard(block, count)
                .map_err(FaultError::Inner)?;
        }
        self.stats.discards += 1;
        self.record(FaultEvent::Discard {
            block,
            count,
            forwarded,
        });
        Ok(())
    }
}

/// One mutation a recording [`FaultDevice`] completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultEvent {
    /// Whole blocks written from `block`.
    Write {
        /// First block.
        block: u64,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// `count` blocks discarded from `block`.
    Discard {
        /// First block.
        block: u64,
        /// Blocks.
        count: u64,
        /// Passed to the inner device ([`DiscardMode`]); otherwise the blocks kept their bytes.
        forwarded: bool,
    },
    /// A flush: everything before it is durable.
    Flush,
}

/// A recorded event with the device's tag when it completed ([`FaultDevice::set_tag`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The caller's label.
    pub tag: u64,
    /// What happened.
    pub event: FaultEvent,
}

/// Everything a [`FaultDevice`] wrote, discarded and flushed since
/// [`start_recording`](FaultDevice::start_recording), and the inner device's content then: enough
/// to rebuild what a crash at any write of the run leaves ([`Recording::cuts`]).
#[derive(Clone)]
pub struct Recording<D> {
    base: D,
    events: Vec<Recorded>,
}

impl<D> fmt::Debug for Recording<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recording")
            .field("events", &self.events.len())
            .finish_non_exhaustive()
    }
}

impl<D: BlockDevice + Clone> Recording<D> {
    /// The device content when recording started.
    pub fn base(&self) -> &D {
        &self.base
    }

    /// The events, in completion order.
    pub fn events(&self) -> &[Recorded] {
        &self.events
    }

    /// Walks the run write by write: `seed` decides which unflushed blocks a power cut keeps and
    /// where the write in flight is cut, `tear` at which granularity.
    pub fn cuts(&self, seed: u64, tear: TearUnit) -> Cuts<'_, D> {
        Cuts {
            events: &self.events,
            next: 0,
            durable: self.base.clone(),
            everything: self.base.clone(),
            pending: Vec::new(),
            current: None,
            rng: Prng::new(seed),
            tear,
        }
    }
}

/// The write a [`Cuts`] walk stands at: the one in flight when the crash strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Its index in [`Recording::events`].
    pub event: usize,
    /// Its tag.
    pub tag: u64,
}

/// A walk over a [`Recording`] that stops at every write ([`Cuts::next_cut`]) and builds the
/// device a crash during it leaves: [`Cuts::process_crash`] or [`Cuts::power_cut`].
#[derive(Debug)]
pub struct Cuts<'a, D> {
    events: &'a [Recorded],
    next: usize,
    /// The base plus every event up to the last flush before the current write.
    durable: D,
    /// The base plus every event up to and including the current write.
    everything: D,
    /// Events after that flush and before the current write (writes and forwarded discards).
    pending: Vec<usize>,
    current: Option<usize>,
    rng: Prng,
    tear: TearUnit,
}

impl<D: BlockDevice + Clone> Cuts<'_, D> {
    /// Moves to the next write of the recording; `None` after the last one.
    pub fn next_cut(&mut self) -> Result<Option<Cut>, D::Error> {
        if let Some(i) = self.current.take() {
            self.pending.push(i);
        }
        while let Some(rec) = self.events.get(self.next) {
            let i = self.next;
            self.next += 1;
            apply(&mut self.everything, &rec.event, None)?;
            match rec.event {
                FaultEvent::Flush => {
                    for p in self.pending.drain(..) {
                        apply(&mut self.durable, &self.events[p].event, None)?;
                    }
                }
                FaultEvent::Discard {
                    forwarded: true, ..
                } => self.pending.push(i),
                FaultEvent::Discard { .. } => {}
                FaultEvent::Write { .. } => {
                    self.current = Some(i);
                    return Ok(Some(Cut {
                        event: i,
                        tag: rec.tag,
                    }));
                }
            }
        }
        Ok(None)
    }

    /// The device after the process issuing the I/O died right after the current write returned:
    /// the OS (page cache, or the drive's cache while powered) keeps every write and discard up to
    /// and including it, flushed or not.
    pub fn process_crash(&self) -> D {
        self.everything.clone()
    }

    /// The device after a power cut during the current write: everything up to the last flush
    /// before it; then each block of each write or forwarded discard since, in issue order,
    /// independently lands or not (probability 1/2), so a later version may survive where an
    /// earlier one was lost; and the current write lands as a prefix: whole blocks, then part of
    /// one block split at the [`TearUnit`].
    ///
    /// # Panics
    /// Before the first [`next_cut`](Self::next_cut) or after it returned `None`.
    pub fn power_cut(&mut self) -> Result<D, D::Error> {
        let current = self.current.expect("power_cut: not at a write");
        let mut image = self.durable.clone();
        for &p in &self.pending {
            apply(&mut image, &self.events[p].event, Some(&mut self.rng))?;
        }
        let FaultEvent::Write { block, data } = &self.events[current].event else {
            unreachable!("cuts stop at writes only");
        };
        let bs = image.block_size() as usize;
        let unit = self.tear.bytes().min(bs);
        let whole = self.rng.below((data.len() / bs) as u64 + 1) as usize;
        let part = unit * self.rng.below((bs / unit) as u64) as usize;
        let bytes = (whole * bs + part).min(data.len());
        if whole > 0 {
            image.write(*block, &data[..whole * bs])?;
        }
        if bytes > whole * bs {
            let at = *block + whole as u64;
            let mut torn = vec![0u8; bs];
            image.read(at, &mut torn)?;
            torn[..bytes - whole * bs].copy_from_slice(&data[whole * bs..bytes]);
            image.write(at, &torn)?;
        }
        Ok(image)
    }
}

/// Applies a recorded event to `dev`: whole, or (with `rng`) each block with probability 1/2.
fn apply<D: BlockDevice>(
    dev: &mut D,
    event: &FaultEvent,
    mut rng: Option<&mut Prng>,
) -> Result<(), D::Error> {
    let bs = dev.block_size() as usize;
    let (block, blocks) = match event {
        FaultEvent::Write { block, data } if rng.is_none() => return dev.write(*block, data),
        FaultEvent::Discard {
            block,
            count,
            forwarded: true,
        } if rng.is_none() => return dev.discard(*block, *count),
        FaultEvent::Write { block, data } => (*block, (data.len() / bs) as u64),
        FaultEvent::Discard {
            block,
            count,
            forwarded: true,
        } => (*block, *count),
        FaultEvent::Discard { .. } | FaultEvent::Flush => return Ok(()),
    };
    for i in 0..blocks {
        if rng.as_mut().is_some_and(|r| r.below(2) == 0) {
            continue;
        }
        match event {
            FaultEvent::Write { data, .. } => {
                let at = i as usize * bs;
                dev.write(block + i, &data[at..at + bs])?;
            }
            _ => dev.discard(block + i, 1)?,
        }
    }
    Ok(())
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
