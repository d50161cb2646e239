//! Snapshots: a frozen copy of a volume's cluster map (read-only, independent of the volume).

use alloc::string::String;

use serde::{Deserialize, Serialize};

use crate::id::{GroupSnapshotId, SnapshotId, VolumeId};
use crate::volume::ClusterMap;

/// A snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub(crate) id: SnapshotId,
    /// Empty for the members of a group snapshot, which the CO names through the group snapshot.
    pub(crate) name: String,
    pub(crate) source: VolumeId,
    pub(crate) size: u64,
    pub(crate) created_at: u64,
    pub(crate) group_snapshot: Option<GroupSnapshotId>,
    pub(crate) map: ClusterMap,
}

impl Snapshot {
    /// Its id.
    pub fn id(&self) -> SnapshotId {
        self.id
    }
    /// Its name; empty for a member of a group snapshot.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The volume it was taken of (which may since have been deleted).
    pub fn source_volume(&self) -> VolumeId {
        self.source
    }
    /// Size in bytes (the source's size when taken).
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Creation time as given by the caller (core has no clock), e.g. Unix nanoseconds.
    pub fn created_at(&self) -> u64 {
        self.created_at
    }
    /// The group snapshot it belongs to.
    pub fn group_snapshot(&self) -> Option<GroupSnapshotId> {
        self.group_snapshot
    }
    /// Clusters mapped (shared with the source and other snapshots until they diverge).
    pub fn mapped_clusters(&self) -> u64 {
        self.map.len()
    }
}
