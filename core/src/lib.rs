//! edgevol core: the `no_std` volume manager.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;

pub mod device;
mod ram;

pub use device::{BlockDevice, DeviceError, DeviceErrorKind, ErrorType};
pub use ram::RamDevice;
