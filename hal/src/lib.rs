//! Devices behind edgevol-core's [`BlockDevice`](edgevol_core::BlockDevice) trait.
//!
//! Every backend has inherent methods returning the rich [`Error`]; its `BlockDevice` impl only
//! forwards, and core sees [`DeviceErrorKind`](edgevol_core::DeviceErrorKind) through
//! [`DeviceError::kind`](edgevol_core::DeviceError::kind).
//!
//! | device | file | use |
//! |---|---|---|
//! | `RamDevice` | `ram.rs` | sparse RAM, tests (feature `testing`) |
//! | [`FileDevice`] | `file.rs` | sparse file, `O_DIRECT` where possible |
//! | [`LinuxBlockDevice`] | `linux_block.rs` | `/dev/nvmeXnY`, `/dev/vdX`, `/dev/loopN` |
//! | [`scheduler`] | `scheduler.rs` | a block device's I/O scheduler, `none` for a pool |
//! | [`NvmeDevice`] | `nvme.rs` | NVMe namespace + admin passthrough (identify, SMART) |
//! | [`PoolDevice`], [`DataHandle`] | `pool.rs` | the appliance's pool device and its data path's second handle |
//! | `FaultDevice` | `fault.rs` | power cuts, torn writes, I/O errors, latency, discard outcomes; recording a run to rebuild every crash point (core's crash tests; feature `testing`) |
//! | [`NorSim`], [`NorBlockDevice`] | `nor.rs` | raw NOR flash (feature `nor-flash`) |
//! | [`discovery`] | `discovery.rs` | candidate devices, format refusal |
//! | [`uring::Ring`] | `uring.rs` | a queue's own io_uring over a [`DataHandle`]'s descriptor |
//!
//! Features (none by default): `nor-flash` adds the NOR module and its `embedded-storage`
//! dependency; `testing` adds the test-only devices (`RamDevice`, `FaultDevice` and
//! `PoolDevice::Faulty`), for dev-dependencies only: nothing that ships carries them.
//!
//! `unsafe` is denied workspace-wide and allowed only in `buf.rs` (aligned allocation),
//! `linux_block.rs` and `nvme.rs` (ioctls) and `uring.rs` (io_uring submissions, whose buffers
//! the ring owns until the kernel is done), each block with a `SAFETY` comment.

/// The `BlockDevice` impl of a backend whose inherent methods carry the work (`block_size`,
/// `block_count`, `read_blocks`, `write_blocks`, `sync`, `discard_blocks`): it only forwards.
macro_rules! forward_block_device {
    ($ty:ty) => {
        impl edgevol_core::ErrorType for $ty {
            type Error = crate::error::Error;
        }

        impl edgevol_core::BlockDevice for $ty {
            fn block_size(&self) -> u32 {
                <$ty>::block_size(self)
            }
            fn block_count(&self) -> u64 {
                <$ty>::block_count(self)
            }
            fn read(&mut self, block: u64, buf: &mut [u8]) -> Result<(), crate::error::Error> {
                self.read_blocks(block, buf)
            }
            fn write(&mut self, block: u64, data: &[u8]) -> Result<(), crate::error::Error> {
                self.write_blocks(block, data)
            }
            fn flush(&mut self) -> Result<(), crate::error::Error> {
                self.sync()
            }
            fn discard(&mut self, block: u64, count: u64) -> Result<(), crate::error::Error> {
                self.discard_blocks(block, count)
            }
        }
    };
}

/// The inherent methods every device over an open descriptor shares, forwarded to its `io:`
/// [`BlockFile`](crate::fdio::BlockFile) in one place, plus its `BlockDevice` impl. The device
/// itself adds its geometry extras and `discard_blocks` (hole punch, `BLKDISCARD`).
#[cfg(unix)]
macro_rules! forward_block_file {
    ($ty:ty) => {
        impl $ty {
            /// The file's or device's path.
            pub fn path(&self) -> &std::path::Path {
                &self.io.path
            }

            /// Bytes per block (what core sees).
            pub fn block_size(&self) -> u32 {
                self.io.block_size
            }

            /// Number of blocks of [`block_size`](Self::block_size).
            pub fn block_count(&self) -> u64 {
                self.io.block_count
            }

            /// Whether writes and discards are refused.
            pub fn is_read_only(&self) -> bool {
                self.io.read_only
            }

            /// Whether I/O bypasses the page cache (`O_DIRECT`).
            pub fn is_direct(&self) -> bool {
                self.io.direct_align.is_some()
            }

            /// A second descriptor on the same open file (raw access beside the device, e.g.
            /// `hal-bench`'s baseline, or an io_uring of the data path).
            pub fn try_clone_file(&self) -> Result<std::fs::File, crate::error::Error> {
                self.io.try_clone_file()
            }

            /// Reads whole blocks from `block`.
            pub fn read_blocks(
                &self,
                block: u64,
                buf: &mut [u8],
            ) -> Result<(), crate::error::Error> {
                self.io.read_blocks(block, buf)
            }

            /// Writes whole blocks from `block` (volatile until [`sync`](Self::sync)).
            pub fn write_blocks(&self, block: u64, data: &[u8]) -> Result<(), crate::error::Error> {
                self.io.write_blocks(block, data)
            }

            /// `fdatasync`: makes completed writes durable. On a block device, or a file on one,
            /// the kernel sends the drive a cache flush (NVMe Flush) when it has a volatile cache.
            pub fn sync(&self) -> Result<(), crate::error::Error> {
                self.io.sync()
            }
        }

        forward_block_device!($ty);
    };
}

mod buf;
mod error;
#[cfg(feature = "testing")]
mod fault;
#[cfg(feature = "testing")]
mod ram;

#[cfg(unix)]
mod fdio;
#[cfg(unix)]
mod file;

#[cfg(target_os = "linux")]
pub mod discovery;
#[cfg(target_os = "linux")]
mod linux_block;
#[cfg(target_os = "linux")]
pub mod nvme;
#[cfg(target_os = "linux")]
mod pool;
#[cfg(target_os = "linux")]
pub mod scheduler;
#[cfg(target_os = "linux")]
pub mod uring;

#[cfg(feature = "nor-flash")]
pub mod nor;

pub use buf::{AlignedBuf, IO_ALIGN};
pub use error::Error;
#[cfg(feature = "testing")]
pub use fault::{
    Cut, Cuts, DiscardMode, FaultConfig, FaultDevice, FaultError, FaultEvent, FaultStats, Recorded,
    Recording, TearUnit,
};
#[cfg(feature = "testing")]
pub use ram::RamDevice;

#[cfg(unix)]
pub use file::{DirectIo, FileDevice, FileOptions};
#[cfg(target_os = "linux")]
pub use linux_block::{BlockOptions, LinuxBlockDevice};
#[cfg(feature = "nor-flash")]
pub use nor::{NorBlockDevice, NorError, NorSim, NorSimError};
#[cfg(target_os = "linux")]
pub use nvme::NvmeDevice;
#[cfg(all(target_os = "linux", feature = "testing"))]
pub use pool::SharedFaults;
#[cfg(target_os = "linux")]
pub use pool::{DataHandle, PoolDevice};
