//! Object ids. Volumes, snapshots, groups and group snapshots draw from one counter, so an id names
//! one object of the pool forever (never reused, even after deletion).

use serde::{Deserialize, Serialize};

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub u64);
    };
}

id!(
    /// A volume.
    VolumeId
);
id!(
    /// A snapshot.
    SnapshotId
);
id!(
    /// A volume group.
    GroupId
);
id!(
    /// A group snapshot.
    GroupSnapshotId
);

/// Something with a cluster map that can be read: a volume or a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ImageId {
    /// A volume (read-write).
    Volume(VolumeId),
    /// A snapshot (read-only).
    Snapshot(SnapshotId),
}

impl From<VolumeId> for ImageId {
    fn from(id: VolumeId) -> Self {
        Self::Volume(id)
    }
}

impl From<SnapshotId> for ImageId {
    fn from(id: SnapshotId) -> Self {
        Self::Snapshot(id)
    }
}
