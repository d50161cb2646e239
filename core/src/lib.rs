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

/// Entry points for `fuzz/`: the decoders behind the CRCs, which a fuzzer cannot reach through
/// `Pool::open` because it cannot forge checksums. Not API.
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `bytes` as checkpoint tables and as a journal payload, validating what decodes the
    /// way `Pool::open` does. Must never panic.
    pub fn decode_metadata(bytes: &[u8]) {
        if let Ok(tables) = postcard::from_bytes::<crate::state::Tables>(bytes) {
            let _ = crate::state::State::load(tables, 64, 4096);
        }
        let Some(mut state) = crate::state::State::load(crate::state::Tables::default(), 64, 4096) else { return };
        let mut rest = bytes;
        while let Ok((rec, tail)) = postcard::take_from_bytes::<crate::record::Record>(rest) {
            if state.validate(&rec).is_ok() {
                state.apply(rec);
                state.alloc.release_pending();
            }
            rest = tail;
        }
    }
}
