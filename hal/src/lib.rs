//! Devices behind edgevol-core's [`BlockDevice`](edgevol_core::BlockDevice) trait.
//!
//! Every backend has inherent methods returning the rich [`Error`]; its `BlockDevice` impl only
//! forwards, and core sees [`DeviceErrorKind`](edgevol_core::DeviceErrorKind) through
//! [`DeviceError::kind`](edgevol_core::DeviceError::kind).
//!
//! | device | file | use |
//! |---|---|---|
//! | [`RamDevice`] | `ram.rs` | sparse RAM, tests |
//! | [`FileDevice`] | `file.rs` | sparse file, `O_DIRECT` where possible |
//! | [`LinuxBlockDevice`] | `linux_block.rs` | `/dev/nvmeXnY`, `/dev/vdX`, `/dev/loopN` |
//! | [`scheduler`] | `scheduler.rs` | a block device's I/O scheduler, `none` for a pool |
//! | [`NvmeDevice`] | `nvme.rs` | NVMe namespace + admin passthrough (identify, SMART) |
//! | [`PoolDevice`], [`DataHandle`] | `pool.rs` | the appliance's pool device and its data path's second handle |
//! | [`FaultDevice`] | `fault.rs` | power cuts, torn writes, I/O errors, latency, discard outcomes; recording a run to rebuild every crash point (core's crash tests) |
//! | [`NorSim`], [`NorBlockDevice`] | `nor.rs` | raw NOR flash (feature `nor-flash`) |
//! | [`discovery`] | `discovery.rs` | candidate devices, format refusal |
//! | [`uring::Ring`] | `uring.rs` | a queue's own io_uring over a [`DataHandle`]'s descriptor |
//!
//! Features (none by default): `nor-flash` adds the NOR module and its `embedded-storage`
//! dependency.
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

mod buf;
mod error;
mod fault;
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
pub use fault::{
    Cut, Cuts, DiscardMode, FaultConfig, FaultDevice, FaultError, FaultEvent, FaultStats, Recorded,
    Recording, TearUnit,
};
pub use ram::RamDevice;

#[cfg(unix)]
pub use file::{DirectIo, FileDevice, FileOptions};
#[cfg(target_os = "linux")]
pub use linux_block::{BlockOptions, LinuxBlockDevice};
#[cfg(feature = "nor-flash")]
pub use nor::{NorBlockDevice, NorError, NorSim, NorSimError};
#[cfg(target_os = "linux")]
pub use nvme::NvmeDevice;
#[cfg(target_os = "linux")]
pub use pool::{DataHandle, PoolDevice, SharedFaults};
