//! Volume groups (the VolumeGroup proposal) and group snapshots.

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::id::{GroupId, GroupSnapshotId, SnapshotId};

/// A volume group. Members are volumes whose `group()` is this group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub(crate) id: GroupId,
    pub(crate) name: String,
    pub(crate) parameters: Vec<(String, String)>,
}

impl Group {
    /// Its id.
    pub fn id(&self) -> GroupId {
        self.id
    }
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Parameters, sorted by key.
    pub fn parameters(&self) -> &[(String, String)] {
        &self.parameters
    }
}

/// Snapshots of every member of a group, taken in one metadata commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshot {
    pub(crate) id: GroupSnapshotId,
    pub(crate) name: String,
    pub(crate) group: GroupId,
    pub(crate) created_at: u64,
    pub(crate) snapshots: Vec<SnapshotId>,
}

impl GroupSnapshot {
    /// Its id.
    pub fn id(&self) -> GroupSnapshotId {
        self.id
    }
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The group it was taken of (which may since have been deleted).
    pub fn group(&self) -> GroupId {
        self.group
    }
    /// Creation time as given by the caller.
    pub fn created_at(&self) -> u64 {
        self.created_at
    }
    /// Member snapshots, one per group member at the time, in volume id order.
    pub fn snapshots(&self) -> &[SnapshotId] {
        &self.snapshots
    }
}
