//! edgevol core: the `no_std` volume manager.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;

mod checkpoint;
mod cluster;
mod control;
mod crc;
pub mod device;
mod error;
mod group;
mod id;
mod journal;
pub mod limits;
mod map;
mod pool;
mod ram;
mod record;
mod snapshot;
mod state;
mod superblock;
mod volume;

pub use crate::cluster::Capacity;
pub use crc::{crc32c, crc32c_append};
pub use device::{BlockDevice, DeviceError, DeviceErrorKind, ErrorType};
pub use error::{Corruption, Error, Field, Limit, ObjectRef, Precondition, Problem, Range, Result};
pub use group::{Group, GroupSnapshot};
pub use id::{GroupId, GroupSnapshotId, ImageId, SnapshotId, VolumeId};
pub use map::{Prepare, ReadMap, ReadSegment, WriteSegment};
pub use pool::{FormatOptions, Pool};
pub use ram::RamDevice;
pub use snapshot::Snapshot;
pub use superblock::VERSION;
pub use volume::{AccessMode, AccessModes, ContentSource, Provisioning, Volume, VolumeSpec};
