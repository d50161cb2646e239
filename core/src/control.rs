//! Control-path operations (what CSI calls map onto). Each one is durable when it returns `Ok`,
//! and creations are idempotent by name, as CSI requires: repeating a create with the same name and
//! a compatible request returns the existing object without a commit.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::device::BlockDevice;
use crate::error::{Error, ObjectRef, Result};
use crate::group::{Group, GroupSnapshot};
use crate::id::{GroupId, GroupSnapshotId, SnapshotId, VolumeId};
use crate::pool::Pool;
use crate::record::Record;
use crate::snapshot::Snapshot;
use crate::volume::{round_up, validate_name, validate_parameters, ContentSource, Volume, VolumeSpec};

/// Metadata bytes a copied map entry may take in a checkpoint (two varints).
const MAP_ENTRY_BYTES: u64 = 20;

impl<D: BlockDevice> Pool<D> {
    /// Creates a volume (empty, or sharing the clusters of `spec.source`: a clone or a volume from
    /// a snapshot, both instant). Returns the existing volume's id if one of that name exists with a
    /// compatible spec; `AlreadyExists` if it is incompatible.
    pub fn create_volume(&mut self, mut spec: VolumeSpec) -> Result<VolumeId> {
        spec.normalize(u64::from(self.cluster_size()))?;
        if let Some(v) = self.state.volume_by_name(&spec.name) {
            return if v.spec.compatible(&spec) {
                Ok(v.id)
            } else {
                Err(Error::AlreadyExists(ObjectRef::Volume(v.id)))
            };
        }
        let copied = match spec.source {
            Some(ContentSource::Volume(id)) => self.state.volume(id)?.mapped_clusters(),
            Some(ContentSource::Snapshot(id)) => self.state.snapshot(id)?.mapped_clusters(),
            None => 0,
        };
        self.check_metadata_room(copied * MAP_ENTRY_BYTES)?;
        let id = VolumeId(self.state.t.next_id);
        self.run(Record::CreateVolume { id, spec }, copied * MAP_ENTRY_BYTES)?;
        Ok(id)
    }

    /// Deletes a volume. Its snapshots and clones stay readable: shared clusters keep their other
    /// references. Refused while the volume is in a group or published.
    pub fn delete_volume(&mut self, id: VolumeId) -> Result<()> {
        self.run(Record::DeleteVolume(id), 0)
    }

    /// Grows a volume to at least `size` bytes (rounded up to clusters); returns the new size.
    /// Growing to the current size or less than a cluster more is a no-op; shrinking is refused.
    pub fn expand_volume(&mut self, id: VolumeId, size: u64) -> Result<u64> {
        let current = self.state.volume(id)?.size();
        if round_up(size, u64::from(self.cluster_size()))? == current {
            return Ok(current);
        }
        self.run(Record::ExpandVolume { id, size }, 0)?;
        Ok(self.state.volume(id)?.size())
    }

    /// Publishes a volume to a host NQN (ControllerPublish), read-write or read-only. Idempotent;
    /// publishing again to the same host with the other `readonly` is `AlreadyExists`.
    /// Single-node access modes allow one host at a time; without MULTI_NODE_MULTI_WRITER at most
    /// one host may write.
    pub fn publish(&mut self, id: VolumeId, host: &str, readonly: bool) -> Result<()> {
        if let Some(p) = self.state.volume(id)?.published.iter().find(|p| p.host == host) {
            return if p.readonly == readonly {
                Ok(())
            } else {
                Err(Error::AlreadyExists(ObjectRef::Volume(id)))
            };
        }
        self.check_metadata_room(host.len() as u64)?;
        self.run(
            Record::Publish {
                id,
                host: host.to_string(),
                readonly,
            },
            0,
        )
    }

    /// Sets mutable parameters (CSI ControllerModifyVolume): each given key takes its value, the
    /// others keep theirs; a key given the empty value is removed. No commit when nothing changes.
    pub fn modify_volume(&mut self, id: VolumeId, changes: &[(String, String)]) -> Result<()> {
        let mut merged = self.state.volume(id)?.mutable.clone();
        for (k, v) in changes {
            let at = merged.iter().position(|(mk, _)| mk == k);
            match (at, v.is_empty()) {
                (Some(i), true) => {
                    merged.remove(i);
                }
                (Some(i), false) => merged[i].1.clone_from(v),
                (None, true) => {}
                (None, false) => merged.push((k.clone(), v.clone())),
            }
        }
        validate_parameters(&mut merged)?;
        if merged == self.state.volume(id)?.mutable {
            return Ok(());
        }
        let bytes: usize = merged.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.check_metadata_room(bytes as u64)?;
        self.run(Record::ModifyVolume { id, parameters: merged }, 0)
    }

    /// Removes a host NQN from a volume (ControllerUnpublish). Idempotent.
    pub fn unpublish(&mut self, id: VolumeId, host: &str) -> Result<()> {
        if !self.state.volume(id)?.published.iter().any(|p| p.host == host) {
            return Ok(());
        }
        self.run(
            Record::Unpublish {
                id,
                host: host.to_string(),
            },
            0,
        )
    }

    /// Snapshots a volume: instant (copies the cluster map, not data). `created_at` is stored as
    /// given. Idempotent for the same name and source; `AlreadyExists` for another source.
    pub fn create_snapshot(&mut self, source: VolumeId, name: &str, created_at: u64) -> Result<SnapshotId> {
        validate_name(name)?;
        if let Some(s) = self.state.snapshot_by_name(name) {
            return if s.source == source {
                Ok(s.id)
            } else {
                Err(Error::AlreadyExists(ObjectRef::Snapshot(s.id)))
            };
        }
        let copied = self.state.volume(source)?.mapped_clusters();
        self.check_metadata_room(copied * MAP_ENTRY_BYTES)?;
        let id = SnapshotId(self.state.t.next_id);
        self.run(
            Record::CreateSnapshot {
                id,
                source,
                name: name.to_string(),
                created_at,
            },
            copied * MAP_ENTRY_BYTES,
        )?;
        Ok(id)
    }

    /// Deletes a snapshot; clusters no one else maps are freed. Refused for members of a group
    /// snapshot (delete the group snapshot).
    pub fn delete_snapshot(&mut self, id: SnapshotId) -> Result<()> {
        self.run(Record::DeleteSnapshot(id), 0)
    }

    /// Creates an empty volume group. Idempotent for the same name and parameters.
    pub fn create_group(&mut self, name: &str, mut parameters: Vec<(String, String)>) -> Result<GroupId> {
        validate_name(name)?;
        validate_parameters(&mut parameters)?;
        if let Some(g) = self.state.group_by_name(name) {
            return if g.parameters == parameters {
                Ok(g.id)
            } else {
                Err(Error::AlreadyExists(ObjectRef::Group(g.id)))
            };
        }
        self.check_metadata_room(0)?;
        let id = GroupId(self.state.t.next_id);
        self.run(
            Record::CreateGroup {
                id,
                name: name.to_string(),
                parameters,
            },
            0,
        )?;
        Ok(id)
    }

    /// Deletes a group and every volume in it, in one commit (VolumeGroup: "Delete a volume group
    /// will delete all volumes in the group"). Refused while a member is published.
    pub fn delete_group(&mut self, id: GroupId) -> Result<()> {
        self.run(Record::DeleteGroup(id), 0)
    }

    /// Sets a group's members to exactly `members` (ModifyVolumeGroupMembership): volumes not
    /// listed leave the group, listed ones join. A volume in another group is `InvalidArgument`
    /// naming that group (of several such volumes, the one with the lowest id).
    pub fn set_group_members(&mut self, id: GroupId, members: &[VolumeId]) -> Result<()> {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        let current: Vec<VolumeId> = self.group_members(id)?.collect();
        if current == members {
            return Ok(());
        }
        self.run(Record::SetGroupMembers { id, members }, 0)
    }

    /// Snapshots every member of a group in one metadata commit (crash-consistent across the
    /// group). Idempotent for the same name and group.
    pub fn create_group_snapshot(&mut self, group: GroupId, name: &str, created_at: u64) -> Result<GroupSnapshotId> {
        validate_name(name)?;
        if let Some(gs) = self.state.group_snapshot_by_name(name) {
            return if gs.group == group {
                Ok(gs.id)
            } else {
                Err(Error::AlreadyExists(ObjectRef::GroupSnapshot(gs.id)))
            };
        }
        let mut copied = 0;
        for v in self.group_members(group)? {
            copied += self.state.volume(v)?.mapped_clusters();
        }
        self.check_metadata_room(copied * MAP_ENTRY_BYTES)?;
        let id = GroupSnapshotId(self.state.t.next_id);
        self.run(
            Record::CreateGroupSnapshot {
                id,
                group,
                name: name.to_string(),
                created_at,
            },
            copied * MAP_ENTRY_BYTES,
        )?;
        Ok(id)
    }

    /// Deletes a group snapshot and its member snapshots, in one commit.
    pub fn delete_group_snapshot(&mut self, id: GroupSnapshotId) -> Result<()> {
        self.run(Record::DeleteGroupSnapshot(id), 0)
    }

    /// A volume.
    pub fn volume(&self, id: VolumeId) -> Result<&Volume> {
        self.state.volume(id)
    }

    /// The volume of that name.
    pub fn volume_by_name(&self, name: &str) -> Option<&Volume> {
        self.state.volume_by_name(name)
    }

    /// Volumes in id order, starting after `after` (CSI pagination: the last id of a page is the
    /// next token).
    pub fn volumes(&self, after: Option<VolumeId>) -> impl Iterator<Item = &Volume> + '_ {
        self.state
            .t
            .volumes
            .range(after.map_or(VolumeId(0), |a| VolumeId(a.0 + 1))..)
            .map(|(_, v)| v)
    }

    /// Number of volumes.
    pub fn volume_count(&self) -> usize {
        self.state.t.volumes.len()
    }

    /// A snapshot.
    pub fn snapshot(&self, id: SnapshotId) -> Result<&Snapshot> {
        self.state.snapshot(id)
    }

    /// The snapshot of that name.
    pub fn snapshot_by_name(&self, name: &str) -> Option<&Snapshot> {
        self.state.snapshot_by_name(name)
    }

    /// Snapshots in id order, starting after `after`.
    pub fn snapshots(&self, after: Option<SnapshotId>) -> impl Iterator<Item = &Snapshot> + '_ {
        self.state
            .t
            .snapshots
            .range(after.map_or(SnapshotId(0), |a| SnapshotId(a.0 + 1))..)
            .map(|(_, s)| s)
    }

    /// A group.
    pub fn group(&self, id: GroupId) -> Result<&Group> {
        self.state.group(id)
    }

    /// The group of that name.
    pub fn group_by_name(&self, name: &str) -> Option<&Group> {
        self.state.group_by_name(name)
    }

    /// Groups in id order, starting after `after`.
    pub fn groups(&self, after: Option<GroupId>) -> impl Iterator<Item = &Group> + '_ {
        self.state
            .t
            .groups
            .range(after.map_or(GroupId(0), |a| GroupId(a.0 + 1))..)
            .map(|(_, g)| g)
    }

    /// Members of a group, in id order.
    pub fn group_members(&self, id: GroupId) -> Result<impl Iterator<Item = VolumeId> + '_> {
        self.state.group(id)?;
        Ok(self.state.members.get(&id).into_iter().flatten().copied())
    }

    /// A group snapshot.
    pub fn group_snapshot(&self, id: GroupSnapshotId) -> Result<&GroupSnapshot> {
        self.state.group_snapshot(id)
    }

    /// The group snapshot of that name.
    pub fn group_snapshot_by_name(&self, name: &str) -> Option<&GroupSnapshot> {
        self.state.group_snapshot_by_name(name)
    }

    /// Group snapshots in id order, starting after `after`.
    pub fn group_snapshots(&self, after: Option<GroupSnapshotId>) -> impl Iterator<Item = &GroupSnapshot> + '_ {
        self.state
            .t
            .group_snapshots
            .range(after.map_or(GroupSnapshotId(0), |a| GroupSnapshotId(a.0 + 1))..)
            .map(|(_, g)| g)
    }
}
