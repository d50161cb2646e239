//! Journal records: one per mutation. Live operations and recovery apply them through the same
//! `State::apply`, so what recovery rebuilds is what the live pool had.

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::id::{GroupId, GroupSnapshotId, SnapshotId, VolumeId};
use crate::volume::VolumeSpec;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Record {
    CreateVolume {
        id: VolumeId,
        spec: VolumeSpec,
    },
    DeleteVolume(VolumeId),
    ExpandVolume {
        id: VolumeId,
        size: u64,
    },
    CreateSnapshot {
        id: SnapshotId,
        source: VolumeId,
        name: String,
        created_at: u64,
    },
    DeleteSnapshot(SnapshotId),
    CreateGroup {
        id: GroupId,
        name: String,
        parameters: Vec<(String, String)>,
    },
    /// Deletes the group and every member volume.
    DeleteGroup(GroupId),
    /// Sorted, deduplicated member list.
    SetGroupMembers {
        id: GroupId,
        members: Vec<VolumeId>,
    },
    /// Member snapshots get ids `id + 1 ..`, one per member in volume id order: the whole group is
    /// frozen by this one record.
    CreateGroupSnapshot {
        id: GroupSnapshotId,
        group: GroupId,
        name: String,
        created_at: u64,
    },
    DeleteGroupSnapshot(GroupSnapshotId),
    Publish {
        id: VolumeId,
        host: String,
        readonly: bool,
    },
    /// The volume's mutable parameters become `parameters` (sorted, at most 4 KiB).
    ModifyVolume {
        id: VolumeId,
        parameters: Vec<(String, String)>,
    },
    Unpublish {
        id: VolumeId,
        host: String,
    },
    /// Data path: `vcluster` of the volume now maps to the fresh `pcluster` (first write or
    /// copy-on-write; a replaced mapping loses a reference).
    Map {
        id: VolumeId,
        vcluster: u64,
        pcluster: u64,
    },
    /// Data path: trim.
    Unmap {
        id: VolumeId,
        vcluster: u64,
    },
}

impl Record {
    /// Whether applying it makes a volume's clusters shared (so in-place writes in flight must
    /// land first).
    pub(crate) fn shares_volume_clusters(&self) -> bool {
        match self {
            Record::CreateSnapshot { .. } | Record::CreateGroupSnapshot { .. } => true,
            Record::CreateVolume { spec, .. } => {
                matches!(spec.source, Some(crate::volume::ContentSource::Volume(_)))
            }
            _ => false,
        }
    }
}
