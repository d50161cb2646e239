//! The device under an edgevol pool on a Linux box, and the data path's second handle on it.
//!
//! [`PoolDevice`] is what core's pool is formatted and mounted on: a regular file or a Linux block
//! device; with the `testing` feature (dev-dependencies only) also a file behind hal's fault
//! device, shared through `SharedFaults` so that the pool and its data path follow one fault plan.
//!
//! [`DataHandle`] is a second handle on the same device for I/O outside the pool's lock:
//! positioned reads and writes through `&self`, so any number of threads use one handle while the
//! pool keeps its own. A file is reopened, a block device reopened without `O_EXCL` (the pool's
//! handle holds the exclusive open), the fault device shared. A flush through the pool's handle
//! (`fdatasync`) covers writes made through the data handle: same file, same device.

#[cfg(feature = "testing")]
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::Error;
#[cfg(feature = "testing")]
use crate::fault::FaultDevice;
use crate::file::{DirectIo, FileDevice, FileOptions};
use crate::linux_block::{BlockOptions, LinuxBlockDevice};

/// A file behind hal's [`FaultDevice`], shared by a pool and its data path.
#[cfg(feature = "testing")]
pub type SharedFaults = Arc<Mutex<FaultDevice<FileDevice>>>;

/// The device under a pool.
#[derive(Debug)]
pub enum PoolDevice {
    /// A (sparse) file.
    File(FileDevice),
    /// `/dev/nvmeXnY`, `/dev/vdX`, `/dev/loopN`...
    Block(LinuxBlockDevice),
    /// Fault injection (tests, feature `testing`): I/O errors on chosen blocks, power cuts.
    #[cfg(feature = "testing")]
    Faulty(SharedFaults),
}

#[cfg(feature = "testing")]
fn lock(faults: &SharedFaults) -> MutexGuard<'_, FaultDevice<FileDevice>> {
    // The fault device holds no invariant a panicking user could break halfway.
    faults.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PoolDevice {
    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        match self {
            Self::File(d) => d.block_size(),
            Self::Block(d) => d.block_size(),
            #[cfg(feature = "testing")]
            Self::Faulty(f) => lock(f).inner_mut().block_size(),
        }
    }

    /// Number of blocks.
    pub fn block_count(&self) -> u64 {
        match self {
            Self::File(d) => d.block_count(),
            Self::Block(d) => d.block_count(),
            #[cfg(feature = "testing")]
            Self::Faulty(f) => lock(f).inner_mut().block_count(),
        }
    }

    /// Reads whole blocks from `block`.
    pub fn read_blocks(&self, block: u64, buf: &mut [u8]) -> Result<(), Error> {
        match self {
            Self::File(d) => d.read_blocks(block, buf),
            Self::Block(d) => d.read_blocks(block, buf),
            #[cfg(feature = "testing")]
            Self::Faulty(f) => Ok(lock(f).read_blocks(block, buf)?),
        }
    }

    /// Writes whole blocks from `block` (volatile until [`sync`](Self::sync)).
    pub fn write_blocks(&self, block: u64, data: &[u8]) -> Result<(), Error> {
        match self {
            Self::File(d) => d.write_blocks(block, data),
            Self::Block(d) => d.write_blocks(block, data),
            #[cfg(feature = "testing")]
            Self::Faulty(f) => Ok(lock(f).write_blocks(block, data)?),
        }
    }

    /// Makes completed writes durable, through any handle on the device.
    pub fn sync(&self) -> Result<(), Error> {
        match self {
            Self::File(d) => d.sync(),
            Self::Block(d) => d.sync(),
            #[cfg(feature = "testing")]
            Self::Faulty(f) => Ok(lock(f).flush_all()?),
        }
    }

    /// Deallocates `count` blocks from `block` (hole punch, `BLKDISCARD`).
    pub fn discard_blocks(&self, block: u64, count: u64) -> Result<(), Error> {
        match self {
            Self::File(d) => d.discard_blocks(block, count),
            Self::Block(d) => d.discard_blocks(block, count),
            #[cfg(feature = "testing")]
            Self::Faulty(f) => Ok(lock(f).discard_blocks(block, count)?),
        }
    }

    /// Makes `count` blocks from `block` read as zeros without sending their bytes: a hole in a
    /// file (written zeros where the filesystem has no holes), `BLKZEROOUT` on a block device
    /// (NVMe Write Zeroes, or zeros the kernel writes). Durable, like a write, after the next
    /// flush. The fault device writes zeros, so that its fault plan sees them as writes.
    pub fn zero_blocks(&self, block: u64, count: u64) -> Result<(), Error> {
        match self {
            Self::File(d) => d.discard_blocks(block, count),
            Self::Block(d) => d.zero_blocks(block, count),
            #[cfg(feature = "testing")]
            Self::Faulty(f) => {
                let mut dev = lock(f);
                let bs = u64::from(dev.inner_mut().block_size());
                crate::buf::write_zeros(
                    bs,
                    block,
                    count,
                    |b, zeros| Ok(dev.write_blocks(b, zeros)?),
                )
            }
        }
    }
}

forward_block_device!(PoolDevice);

/// A second handle on a [`PoolDevice`], for the data path's I/O outside the pool's lock. Byte
/// offsets (core's data path speaks them); each access must cover whole blocks.
#[derive(Debug)]
pub struct DataHandle {
    dev: PoolDevice,
    /// The device is memory (a file on tmpfs).
    in_memory: bool,
}

impl DataHandle {
    /// Whether I/O through this handle bypasses the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        match &self.dev {
            PoolDevice::File(d) => d.is_direct(),
            PoolDevice::Block(d) => d.is_direct(),
            #[cfg(feature = "testing")]
            PoolDevice::Faulty(_) => false,
        }
    }

    /// Whether the device is memory (a file on tmpfs): a read or write is then a copy
    /// that never waits, `O_DIRECT` or not.
    pub fn in_memory(&self) -> bool {
        self.in_memory
    }

    /// Opens a second handle on `pool`'s device, with its block size, `O_DIRECT` policy and
    /// read-only state.
    pub fn open(pool: &PoolDevice) -> Result<Self, Error> {
        let dev = match pool {
            PoolDevice::File(d) => {
                let opts = FileOptions {
                    block_size: d.block_size(),
                    direct: if d.is_direct() {
                        DirectIo::Required
                    } else {
                        DirectIo::Off
                    },
                    create_size: None,
                    read_only: d.is_read_only(),
                };
                PoolDevice::File(FileDevice::open_with(d.path(), &opts)?)
            }
            PoolDevice::Block(d) => {
                let opts = BlockOptions {
                    exclusive: false,
                    read_only: d.is_read_only(),
                    direct: d.is_direct(),
                    block_size: Some(d.block_size()),
                    // The pool's own open already chose it.
                    bypass_scheduler: false,
                };
                PoolDevice::Block(LinuxBlockDevice::open_with(d.path(), &opts)?)
            }
            #[cfg(feature = "testing")]
            PoolDevice::Faulty(f) => PoolDevice::Faulty(Arc::clone(f)),
        };
        let in_memory = matches!(&dev, PoolDevice::File(d) if d.in_memory());
        Ok(Self { dev, in_memory })
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.dev.block_size()
    }

    /// An io_uring for up to `ops` operations on a duplicate of this handle's descriptor;
    /// `None` for the fault device, whose I/O must go through its fault plan.
    pub fn ring<T>(&self, ops: u32) -> Option<Result<crate::uring::Ring<T>, Error>> {
        let file = match &self.dev {
            PoolDevice::File(d) => d.try_clone_file(),
            PoolDevice::Block(d) => d.try_clone_file(),
            #[cfg(feature = "testing")]
            PoolDevice::Faulty(_) => return None,
        };
        Some(file.and_then(|f| {
            crate::uring::Ring::new(f, ops).map_err(|e| Error::io("io_uring setup", None, e))
        }))
    }

    fn block_of(&self, offset: u64) -> Result<u64, Error> {
        let bs = u64::from(self.block_size());
        if !offset.is_multiple_of(bs) {
            return Err(Error::Misaligned {
                value: offset,
                align: bs,
            });
        }
        Ok(offset / bs)
    }

    /// Reads `buf.len()` bytes (whole blocks) at byte `offset` (a block boundary).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        self.dev.read_blocks(self.block_of(offset)?, buf)
    }

    /// Writes `data` (whole blocks) at byte `offset` (a block boundary); durable after the pool's
    /// next flush.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.dev.write_blocks(self.block_of(offset)?, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_core::{
        BlockDevice, DeviceError, DeviceErrorKind, FormatOptions, Pool, VolumeSpec,
    };
    use edgevol_core::{ReadSegment, WriteSegment};

    const MIB: u64 = 1 << 20;

    fn file_pool_device(dir: &tempfile::TempDir) -> PoolDevice {
        PoolDevice::File(FileDevice::create(dir.path().join("pool.img"), 64 * MIB).unwrap())
    }

    /// Writes `data` at `offset` of volume `vol` the way the appliance's data path does: core maps
    /// (whole, fresh clusters here), the data handle writes.
    fn write_through(
        pool: &mut Pool<PoolDevice>,
        data: &DataHandle,
        vol: edgevol_core::VolumeId,
        offset: u64,
        bytes: &[u8],
    ) {
        let mut segs = [WriteSegment::EMPTY; 8];
        let n = pool
            .map_write(vol, offset, bytes.len() as u64, &mut segs)
            .unwrap();
        let mut done = 0;
        for s in &segs[..n] {
            let len = usize::try_from(s.len).unwrap();
            data.write_at(s.device_offset, &bytes[done..done + len])
                .unwrap();
            done += len;
        }
        assert_eq!(done, bytes.len(), "one call maps it all");
    }

    fn device_offset(pool: &Pool<PoolDevice>, vol: edgevol_core::VolumeId, offset: u64) -> u64 {
        match pool.map_read(vol, offset, 4096).unwrap().next().unwrap() {
            ReadSegment::Data { device_offset, .. } => device_offset,
            ReadSegment::Zero { .. } => panic!("no data at {offset}"),
        }
    }

    /// Zeroed blocks read as zeros through both handles; the blocks around them keep their data.
    #[test]
    fn zeroed_blocks_of_a_file_read_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let dev = file_pool_device(&dir);
        let data = DataHandle::open(&dev).unwrap();
        dev.write_blocks(0, &vec![0xabu8; 64 * 4096]).unwrap();
        dev.zero_blocks(8, 48).unwrap();
        let mut back = vec![0u8; 64 * 4096];
        dev.read_blocks(0, &mut back).unwrap();
        assert!(back[..8 * 4096].iter().all(|&b| b == 0xab));
        assert!(back[8 * 4096..56 * 4096].iter().all(|&b| b == 0));
        assert!(back[56 * 4096..].iter().all(|&b| b == 0xab));
        let mut mid = crate::AlignedBuf::zeroed(4096);
        mid.fill(1);
        data.read_at(20 * 4096, &mut mid).unwrap();
        assert!(
            mid.iter().all(|&b| b == 0),
            "the data handle reads the zeros too"
        );
    }

    #[test]
    fn a_core_pool_on_a_file_pool_device_and_its_data_handle() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool =
            Pool::format(file_pool_device(&dir), FormatOptions::new([7; 16], 1 << 16)).unwrap();
        let vol = pool.create_volume(VolumeSpec::new("a", 4 * MIB)).unwrap();
        let data = DataHandle::open(pool.device_mut()).unwrap();
        assert_eq!(data.block_size(), 4096);
        let bytes: Vec<u8> = (0..1u32 << 17).map(|i| (i % 251) as u8).collect();
        write_through(&mut pool, &data, vol, 1 << 16, &bytes);
        pool.flush().unwrap();
        // The pool's own handle reads what the data handle wrote.
        let at = device_offset(&pool, vol, 1 << 16);
        let mut back = vec![0u8; bytes.len()];
        pool.device_mut().read_blocks(at / 4096, &mut back).unwrap();
        assert_eq!(back, bytes);
        // Misaligned offsets are refused, not rounded.
        let e = data.read_at(at + 512, &mut back[..4096]).unwrap_err();
        assert!(matches!(e, Error::Misaligned { align: 4096, .. }), "{e}");
        assert_eq!(e.kind(), DeviceErrorKind::NotAligned);
        drop((pool, data));
        // Reopened: the mapping and the data survived.
        let dev = PoolDevice::File(FileDevice::open(dir.path().join("pool.img")).unwrap());
        let pool = Pool::open(dev).unwrap();
        let data = DataHandle::open(&pool.into_device()).unwrap();
        back.fill(0);
        data.read_at(at, &mut back).unwrap();
        assert_eq!(back, bytes);
    }

    #[cfg(feature = "testing")]
    #[test]
    fn a_faulty_pool_device_shares_one_fault_plan_with_its_data_handle() {
        use crate::FaultConfig;
        use std::sync::{Arc, Mutex};

        let dir = tempfile::tempdir().unwrap();
        let PoolDevice::File(file) = file_pool_device(&dir) else {
            unreachable!()
        };
        let faults: SharedFaults =
            Arc::new(Mutex::new(FaultDevice::new(file, FaultConfig::default())));
        let mut pool = Pool::format(
            PoolDevice::Faulty(Arc::clone(&faults)),
            FormatOptions::new([8; 16], 1 << 16),
        )
        .unwrap();
        let vol = pool.create_volume(VolumeSpec::new("a", 4 * MIB)).unwrap();
        let data = DataHandle::open(pool.device_mut()).unwrap();
        write_through(&mut pool, &data, vol, 0, &[0x5a; 1 << 16]);
        pool.flush().unwrap();
        let at = device_offset(&pool, vol, 0);
        let block = at / 4096;
        {
            let mut f = lock(&faults);
            f.config_mut().read_errors.insert(block);
            f.config_mut().write_errors.insert(block + 1);
        }
        let mut buf = vec![0u8; 8192];
        for e in [
            data.read_at(at, &mut buf).unwrap_err(),
            pool.device_mut().read_blocks(block, &mut buf).unwrap_err(),
            data.write_at(at, &buf).unwrap_err(),
        ] {
            assert!(matches!(e, Error::InjectedIo { .. }), "{e}");
            assert_eq!(e.kind(), DeviceErrorKind::Io);
        }
        data.read_at(at + 8192, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0x5a));
        // One power: cut through the pool's device, both handles see it.
        lock(&faults).cut_power().unwrap();
        let e = data.read_at(at + 8192, &mut buf).unwrap_err();
        assert!(matches!(e, Error::PowerLoss), "{e}");
        assert_eq!(
            pool.device_mut().sync().unwrap_err().kind(),
            DeviceErrorKind::PowerLoss
        );
        assert_eq!(lock(&faults).stats().power_cuts, 1);
    }

    #[test]
    fn a_block_pool_device_keeps_o_excl_and_the_data_handle_still_opens() {
        let Some(lo) = crate::linux_block::tests::Loop::new(64 * MIB, 4096) else {
            return;
        };
        let dev = PoolDevice::Block(LinuxBlockDevice::open(&lo.dev).unwrap());
        let data = DataHandle::open(&dev).unwrap();
        // The pool's handle is exclusive: another exclusive opener is refused.
        assert!(LinuxBlockDevice::open(&lo.dev).is_err());
        data.write_at(40960, &[0xc3; 8192]).unwrap();
        dev.sync().unwrap();
        let mut back = vec![0u8; 8192];
        dev.read_blocks(10, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0xc3));
        assert_eq!(BlockDevice::block_count(&dev), 64 * MIB / 4096);
    }
}
