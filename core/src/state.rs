//! The pool's tables and the one place they change: `validate` a record, then `apply` it.
//!
//! `validate` has no side effects and `apply` cannot fail, so a live operation checks, commits
//! the record, then applies it, and recovery replays the same two steps. A record that fails
//! `validate` during replay means corruption, never a silently different state.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::cluster::Allocator;
use crate::error::{Error, Field, Limit, ObjectRef, Precondition, Problem, Range, Result};
use crate::group::{Group, GroupSnapshot};
use crate::id::{GroupId, GroupSnapshotId, SnapshotId, VolumeId};
use crate::limits::{
    MAX_GROUPS, MAX_GROUP_MEMBERS, MAX_GROUP_SNAPSHOTS, MAX_PUBLISHED_HOSTS, MAX_SNAPSHOTS, MAX_VOLUMES,
};
use crate::record::Record;
use crate::snapshot::Snapshot;
use crate::volume::{
    round_up, validate_name, validate_nqn, validate_parameters, AccessMode, ClusterMap, ContentSource, Provisioning,
    Publication, Volume,
};

/// What a checkpoint stores: everything else is derived at load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tables {
    pub(crate) next_id: u64,
    pub(crate) volumes: BTreeMap<VolumeId, Volume>,
    pub(crate) snapshots: BTreeMap<SnapshotId, Snapshot>,
    pub(crate) groups: BTreeMap<GroupId, Group>,
    pub(crate) group_snapshots: BTreeMap<GroupSnapshotId, GroupSnapshot>,
}

/// Tables plus derived indexes: refcounts, names, group members.
#[derive(Debug, Clone)]
pub(crate) struct State {
    pub(crate) t: Tables,
    pub(crate) alloc: Allocator,
    cluster_size: u64,
    volume_names: BTreeMap<String, VolumeId>,
    snapshot_names: BTreeMap<String, SnapshotId>,
    group_names: BTreeMap<String, GroupId>,
    group_snapshot_names: BTreeMap<String, GroupSnapshotId>,
    pub(crate) members: BTreeMap<GroupId, BTreeSet<VolumeId>>,
}

fn clusters_needed(needed: u64, available: u64) -> Result<()> {
    if needed > available {
        Err(Error::ResourceExhausted(Limit::Clusters { needed, available }))
    } else {
        Ok(())
    }
}

/// Thick volumes reserve every cluster they have not mapped yet.
fn reservation(v: &Volume, cluster_size: u64) -> u64 {
    match v.spec.provisioning {
        Provisioning::Thin => 0,
        Provisioning::Thick => v.spec.size / cluster_size - v.map.len(),
    }
}

impl State {
    /// Rebuilds the derived state from checkpointed tables, checking every cross-reference so no
    /// later lookup can miss or index out of range. `None` means the tables are inconsistent.
    pub(crate) fn load(t: Tables, clusters: usize, cluster_size: u64) -> Option<Self> {
        let mut s = Self {
            t: Tables::default(),
            alloc: Allocator::new(clusters),
            cluster_size,
            volume_names: BTreeMap::new(),
            snapshot_names: BTreeMap::new(),
            group_names: BTreeMap::new(),
            group_snapshot_names: BTreeMap::new(),
            members: BTreeMap::new(),
        };
        let total = s.alloc.total();
        let map_ok = |m: &ClusterMap, size: u64| {
            let vclusters = size / cluster_size;
            size.checked_rem(cluster_size) == Some(0)
                && m.last().is_none_or(|vc| vc < vclusters)
                && m.values().all(|pc| pc < total)
        };
        let id_ok = |id: u64| id < t.next_id;
        for (&id, g) in &t.groups {
            let fresh = s.group_names.insert(g.name.clone(), id).is_none();
            let mut params = g.parameters.clone();
            let params_ok = validate_parameters(&mut params).is_ok() && params == g.parameters;
            if id != g.id || !id_ok(id.0) || !fresh || validate_name(&g.name).is_err() || !params_ok {
                return None;
            }
            s.members.insert(id, BTreeSet::new());
        }
        let mut reserved = 0u64;
        for (&id, v) in &t.volumes {
            let mut spec = v.spec.clone();
            let spec_ok = spec.normalize(cluster_size).is_ok() && spec == v.spec;
            let fresh = s.volume_names.insert(v.spec.name.clone(), id).is_none();
            let hosts_ok = v.published.len() <= MAX_PUBLISHED_HOSTS
                && v.published
                    .iter()
                    .enumerate()
                    .all(|(i, p)| validate_nqn(&p.host).is_ok() && !v.published[..i].iter().any(|q| q.host == p.host));
            let mut mutable = v.mutable.clone();
            let mutable_ok = validate_parameters(&mut mutable).is_ok() && mutable == v.mutable;
            if id != v.id
                || !id_ok(id.0)
                || !spec_ok
                || !fresh
                || !hosts_ok
                || !mutable_ok
                || !map_ok(&v.map, v.spec.size)
            {
                return None;
            }
            if let Some(g) = v.spec.group {
                s.members.get_mut(&g)?.insert(id);
            }
            reserved = reserved.checked_add(reservation(v, cluster_size))?;
        }
        for (&id, g) in &t.group_snapshots {
            let fresh = s.group_snapshot_names.insert(g.name.clone(), id).is_none();
            if id != g.id || !id_ok(id.0) || !fresh || validate_name(&g.name).is_err() {
                return None;
            }
        }
        for (&id, snap) in &t.snapshots {
            let fresh = snap.name.is_empty() || s.snapshot_names.insert(snap.name.clone(), id).is_none();
            let name_ok = match snap.group_snapshot {
                None => validate_name(&snap.name).is_ok(),
                Some(gs) => snap.name.is_empty() && t.group_snapshots.get(&gs)?.snapshots.contains(&id),
            };
            if id != snap.id || !id_ok(id.0) || !fresh || !name_ok || !map_ok(&snap.map, snap.size) {
                return None;
            }
        }
        for g in t.group_snapshots.values() {
            let back = |sid: &SnapshotId| t.snapshots.get(sid).is_some_and(|x| x.group_snapshot == Some(g.id));
            if !g.snapshots.iter().all(back) {
                return None;
            }
        }
        let mut refs_total = 0u64;
        let maps = t
            .volumes
            .values()
            .map(|v| &v.map)
            .chain(t.snapshots.values().map(|x| &x.map));
        for m in maps {
            refs_total = refs_total.checked_add(m.len())?;
            if refs_total >= u64::from(u32::MAX) {
                return None;
            }
            m.values().for_each(|pc| s.alloc.incref(pc));
        }
        if reserved > s.alloc.available() {
            return None;
        }
        s.alloc.reserve(reserved);
        s.t = t;
        Some(s)
    }

    pub(crate) fn volume(&self, id: VolumeId) -> Result<&Volume> {
        self.t.volumes.get(&id).ok_or(Error::NotFound(ObjectRef::Volume(id)))
    }

    pub(crate) fn snapshot(&self, id: SnapshotId) -> Result<&Snapshot> {
        self.t
            .snapshots
            .get(&id)
            .ok_or(Error::NotFound(ObjectRef::Snapshot(id)))
    }

    pub(crate) fn group(&self, id: GroupId) -> Result<&Group> {
        self.t.groups.get(&id).ok_or(Error::NotFound(ObjectRef::Group(id)))
    }

    pub(crate) fn group_snapshot(&self, id: GroupSnapshotId) -> Result<&GroupSnapshot> {
        self.t
            .group_snapshots
            .get(&id)
            .ok_or(Error::NotFound(ObjectRef::GroupSnapshot(id)))
    }

    pub(crate) fn volume_by_name(&self, name: &str) -> Option<&Volume> {
        self.volume_names.get(name).and_then(|id| self.t.volumes.get(id))
    }

    pub(crate) fn snapshot_by_name(&self, name: &str) -> Option<&Snapshot> {
        self.snapshot_names.get(name).and_then(|id| self.t.snapshots.get(id))
    }

    pub(crate) fn group_by_name(&self, name: &str) -> Option<&Group> {
        self.group_names.get(name).and_then(|id| self.t.groups.get(id))
    }

    pub(crate) fn group_snapshot_by_name(&self, name: &str) -> Option<&GroupSnapshot> {
        self.group_snapshot_names
            .get(name)
            .and_then(|id| self.t.group_snapshots.get(id))
    }

    fn fresh_id(&self, id: u64) -> Result<()> {
        // A record's id must be the next one: anything else is a replay out of order.
        if id == self.t.next_id {
            Ok(())
        } else {
            Err(Error::Corrupt(crate::error::Corruption::Record(id)))
        }
    }

    fn source_map(&self, src: ContentSource) -> Result<(&ClusterMap, u64)> {
        match src {
            ContentSource::Volume(id) => self.volume(id).map(|v| (&v.map, v.spec.size)),
            ContentSource::Snapshot(id) => self.snapshot(id).map(|s| (&s.map, s.size)),
        }
    }

    /// Checks `rec` against the current state without changing anything.
    pub(crate) fn validate(&self, rec: &Record) -> Result<()> {
        let cs = self.cluster_size;
        match rec {
            Record::CreateVolume { id, spec } => {
                self.fresh_id(id.0)?;
                let mut normal = spec.clone();
                normal.normalize(cs)?;
                if normal != *spec {
                    return Err(Error::InvalidArgument(Field::Size, Problem::Unsupported));
                }
                if let Some(&other) = self.volume_names.get(&spec.name) {
                    return Err(Error::AlreadyExists(ObjectRef::Volume(other)));
                }
                if self.t.volumes.len() >= MAX_VOLUMES {
                    return Err(Error::ResourceExhausted(Limit::Volumes));
                }
                let mapped = match spec.source {
                    Some(src) => {
                        let (map, size) = self.source_map(src)?;
                        if spec.size < size {
                            return Err(Error::OutOfRange(Range::SmallerThanSource { source: size }));
                        }
                        map.len()
                    }
                    None => 0,
                };
                if let Some(g) = spec.group {
                    self.group(g)?;
                    if self.members.get(&g).map_or(0, BTreeSet::len) >= MAX_GROUP_MEMBERS {
                        return Err(Error::ResourceExhausted(Limit::GroupMembers));
                    }
                }
                if spec.provisioning == Provisioning::Thick {
                    clusters_needed(spec.size / cs - mapped, self.alloc.available())?;
                }
                Ok(())
            }
            Record::DeleteVolume(id) => self.check_deletable(*id),
            Record::ExpandVolume { id, size } => {
                let v = self.volume(*id)?;
                let size = round_up(*size, cs)?;
                if size < v.spec.size {
                    return Err(Error::OutOfRange(Range::Shrink { current: v.spec.size }));
                }
                if v.spec.provisioning == Provisioning::Thick {
                    clusters_needed((size - v.spec.size) / cs, self.alloc.available())?;
                }
                Ok(())
            }
            Record::CreateSnapshot { id, source, name, .. } => {
                self.fresh_id(id.0)?;
                validate_name(name)?;
                self.volume(*source)?;
                if let Some(&other) = self.snapshot_names.get(name) {
                    return Err(Error::AlreadyExists(ObjectRef::Snapshot(other)));
                }
                if self.t.snapshots.len() >= MAX_SNAPSHOTS {
                    return Err(Error::ResourceExhausted(Limit::Snapshots));
                }
                Ok(())
            }
            Record::DeleteSnapshot(id) => match self.snapshot(*id)?.group_snapshot {
                Some(gs) => Err(Error::FailedPrecondition(Precondition::SnapshotInGroupSnapshot(gs))),
                None => Ok(()),
            },
            Record::CreateGroup { id, name, parameters } => {
                self.fresh_id(id.0)?;
                validate_name(name)?;
                let mut sorted = parameters.clone();
                validate_parameters(&mut sorted)?;
                if sorted != *parameters {
                    return Err(Error::InvalidArgument(Field::Parameters, Problem::Unsupported));
                }
                if let Some(&other) = self.group_names.get(name) {
                    return Err(Error::AlreadyExists(ObjectRef::Group(other)));
                }
                if self.t.groups.len() >= MAX_GROUPS {
                    return Err(Error::ResourceExhausted(Limit::Groups));
                }
                Ok(())
            }
            Record::DeleteGroup(id) => {
                self.group(*id)?;
                for &v in self.members.get(id).into_iter().flatten() {
                    if !self.volume(v)?.published.is_empty() {
                        return Err(Error::FailedPrecondition(Precondition::VolumePublished(v)));
                    }
                }
                Ok(())
            }
            Record::SetGroupMembers { id, members } => {
                self.group(*id)?;
                if members.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(Error::InvalidArgument(Field::Members, Problem::Duplicate));
                }
                if members.len() > MAX_GROUP_MEMBERS {
                    return Err(Error::ResourceExhausted(Limit::GroupMembers));
                }
                for &m in members {
                    match self.volume(m)?.spec.group {
                        Some(g) if g != *id => {
                            return Err(Error::InvalidArgument(Field::Members, Problem::InOtherGroup(g)))
                        }
                        _ => {}
                    }
                }
                Ok(())
            }
            Record::CreateGroupSnapshot { id, group, name, .. } => {
                self.fresh_id(id.0)?;
                validate_name(name)?;
                self.group(*group)?;
                let n = self.members.get(group).map_or(0, BTreeSet::len);
                if n == 0 {
                    return Err(Error::InvalidArgument(Field::Members, Problem::Empty));
                }
                if let Some(&other) = self.group_snapshot_names.get(name) {
                    return Err(Error::AlreadyExists(ObjectRef::GroupSnapshot(other)));
                }
                if self.t.group_snapshots.len() >= MAX_GROUP_SNAPSHOTS {
                    return Err(Error::ResourceExhausted(Limit::GroupSnapshots));
                }
                if self.t.snapshots.len() + n > MAX_SNAPSHOTS {
                    return Err(Error::ResourceExhausted(Limit::Snapshots));
                }
                Ok(())
            }
            Record::DeleteGroupSnapshot(id) => self.group_snapshot(*id).map(drop),
            Record::Publish { id, host, readonly } => {
                validate_nqn(host)?;
                let v = self.volume(*id)?;
                if v.published.iter().any(|p| p.host == *host) {
                    return Err(Error::InvalidArgument(Field::HostNqn, Problem::Duplicate));
                }
                if v.spec.access_modes.single_node() && !v.published.is_empty() {
                    return Err(Error::FailedPrecondition(Precondition::PublishedToOtherHost(*id)));
                }
                let shared_writers = v.spec.access_modes.contains(AccessMode::MultiNodeMultiWriter);
                if !readonly && !shared_writers && v.published.iter().any(|p| !p.readonly) {
                    return Err(Error::FailedPrecondition(Precondition::PublishedToOtherHost(*id)));
                }
                if v.published.len() >= MAX_PUBLISHED_HOSTS {
                    return Err(Error::ResourceExhausted(Limit::PublishedHosts));
                }
                Ok(())
            }
            Record::ModifyVolume { id, parameters } => {
                self.volume(*id)?;
                let mut sorted = parameters.clone();
                validate_parameters(&mut sorted)?;
                if sorted != *parameters {
                    return Err(Error::InvalidArgument(Field::Parameters, Problem::Unsupported));
                }
                Ok(())
            }
            Record::Unpublish { id, host } => {
                if self.volume(*id)?.published.iter().any(|p| p.host == *host) {
                    Ok(())
                } else {
                    Err(Error::InvalidArgument(Field::HostNqn, Problem::Unsupported))
                }
            }
            Record::Map { id, vcluster, pcluster } => {
                let v = self.volume(*id)?;
                if *vcluster >= v.spec.size / cs {
                    return Err(Error::OutOfRange(Range::PastEnd { size: v.spec.size }));
                }
                if !self.alloc.is_free(*pcluster) {
                    return Err(Error::ResourceExhausted(Limit::Clusters {
                        needed: 1,
                        available: 0,
                    }));
                }
                let consumes_reservation = v.spec.provisioning == Provisioning::Thick && !v.map.contains(*vcluster);
                if !consumes_reservation {
                    clusters_needed(1, self.alloc.available())?;
                }
                Ok(())
            }
            Record::Unmap { id, vcluster } => {
                let v = self.volume(*id)?;
                let Some(pc) = v.map.get(*vcluster) else {
                    return Err(Error::OutOfRange(Range::PastEnd { size: v.spec.size }));
                };
                if v.spec.provisioning == Provisioning::Thick {
                    // The cluster goes back under reservation: it needs a free one to stand for it.
                    let freed = u64::from(self.alloc.refs(pc) == 1);
                    clusters_needed(1, self.alloc.available() + freed)?;
                }
                Ok(())
            }
        }
    }

    fn check_deletable(&self, id: VolumeId) -> Result<()> {
        let v = self.volume(id)?;
        if let Some(g) = v.spec.group {
            return Err(Error::FailedPrecondition(Precondition::VolumeInGroup(g)));
        }
        if !v.published.is_empty() {
            return Err(Error::FailedPrecondition(Precondition::VolumePublished(id)));
        }
        Ok(())
    }

    /// Applies a record `validate` accepted. Never fails; clusters it frees become pending.
    pub(crate) fn apply(&mut self, rec: Record) {
        let cs = self.cluster_size;
        match rec {
            Record::CreateVolume { id, spec } => {
                let map = spec
                    .source
                    .and_then(|s| self.source_map(s).ok())
                    .map(|(m, _)| m.clone())
                    .unwrap_or_default();
                map.values().for_each(|pc| self.alloc.incref(pc));
                let v = Volume {
                    id,
                    spec,
                    published: Vec::new(),
                    mutable: Vec::new(),
                    map,
                };
                self.alloc.reserve(reservation(&v, cs));
                self.volume_names.insert(v.spec.name.clone(), id);
                if let Some(g) = v.spec.group {
                    self.members.entry(g).or_default().insert(id);
                }
                self.t.volumes.insert(id, v);
                self.t.next_id = id.0 + 1;
            }
            Record::DeleteVolume(id) => self.remove_volume(id),
            Record::ExpandVolume { id, size } => {
                if let (Some(v), Ok(size)) = (self.t.volumes.get_mut(&id), round_up(size, cs)) {
                    let before = reservation(v, cs);
                    v.spec.size = size;
                    self.alloc.reserve(reservation(v, cs) - before);
                }
            }
            Record::CreateSnapshot {
                id,
                source,
                name,
                created_at,
            } => {
                let Some(v) = self.t.volumes.get(&source) else { return };
                let snap = Snapshot {
                    id,
                    name,
                    source,
                    size: v.spec.size,
                    created_at,
                    group_snapshot: None,
                    map: v.map.clone(),
                };
                self.insert_snapshot(snap);
                self.t.next_id = id.0 + 1;
            }
            Record::DeleteSnapshot(id) => self.remove_snapshot(id),
            Record::CreateGroup { id, name, parameters } => {
                self.group_names.insert(name.clone(), id);
                self.members.insert(id, BTreeSet::new());
                self.t.groups.insert(id, Group { id, name, parameters });
                self.t.next_id = id.0 + 1;
            }
            Record::DeleteGroup(id) => {
                for v in self.members.remove(&id).unwrap_or_default() {
                    self.remove_volume(v);
                }
                if let Some(g) = self.t.groups.remove(&id) {
                    self.group_names.remove(&g.name);
                }
            }
            Record::SetGroupMembers { id, members } => {
                let old = self
                    .members
                    .insert(id, members.iter().copied().collect())
                    .unwrap_or_default();
                for v in old {
                    if let Some(v) = self.t.volumes.get_mut(&v) {
                        v.spec.group = None;
                    }
                }
                for v in members {
                    if let Some(v) = self.t.volumes.get_mut(&v) {
                        v.spec.group = Some(id);
                    }
                }
            }
            Record::CreateGroupSnapshot {
                id,
                group,
                name,
                created_at,
            } => {
                let members: Vec<VolumeId> = self.members.get(&group).into_iter().flatten().copied().collect();
                let mut snapshots = Vec::with_capacity(members.len());
                for (sid, vid) in (id.0 + 1..).map(SnapshotId).zip(members) {
                    let Some(v) = self.t.volumes.get(&vid) else { continue };
                    let snap = Snapshot {
                        id: sid,
                        name: String::new(),
                        source: vid,
                        size: v.spec.size,
                        created_at,
                        group_snapshot: Some(id),
                        map: v.map.clone(),
                    };
                    self.insert_snapshot(snap);
                    snapshots.push(sid);
                }
                self.t.next_id = id.0 + 1 + snapshots.len() as u64;
                self.group_snapshot_names.insert(name.clone(), id);
                self.t.group_snapshots.insert(
                    id,
                    GroupSnapshot {
                        id,
                        name,
                        group,
                        created_at,
                        snapshots,
                    },
                );
            }
            Record::DeleteGroupSnapshot(id) => {
                let Some(gs) = self.t.group_snapshots.remove(&id) else {
                    return;
                };
                self.group_snapshot_names.remove(&gs.name);
                for s in gs.snapshots {
                    self.remove_snapshot(s);
                }
            }
            Record::Publish { id, host, readonly } => {
                if let Some(v) = self.t.volumes.get_mut(&id) {
                    v.published.push(Publication { host, readonly });
                }
            }
            Record::Unpublish { id, host } => {
                if let Some(v) = self.t.volumes.get_mut(&id) {
                    v.published.retain(|p| p.host != host);
                }
            }
            Record::ModifyVolume { id, parameters } => {
                if let Some(v) = self.t.volumes.get_mut(&id) {
                    v.mutable = parameters;
                }
            }
            Record::Map { id, vcluster, pcluster } => {
                let Some(v) = self.t.volumes.get_mut(&id) else { return };
                self.alloc.incref(pcluster);
                match v.map.insert(vcluster, pcluster) {
                    Some(old) => self.alloc.decref(old),
                    None if v.spec.provisioning == Provisioning::Thick => self.alloc.unreserve(1),
                    None => {}
                }
            }
            Record::Unmap { id, vcluster } => {
                let Some(v) = self.t.volumes.get_mut(&id) else { return };
                if let Some(old) = v.map.remove(vcluster) {
                    self.alloc.decref(old);
                    if v.spec.provisioning == Provisioning::Thick {
                        self.alloc.reserve(1);
                    }
                }
            }
        }
    }

    fn insert_snapshot(&mut self, snap: Snapshot) {
        snap.map.values().for_each(|pc| self.alloc.incref(pc));
        if !snap.name.is_empty() {
            self.snapshot_names.insert(snap.name.clone(), snap.id);
        }
        self.t.snapshots.insert(snap.id, snap);
    }

    fn remove_volume(&mut self, id: VolumeId) {
        let Some(v) = self.t.volumes.remove(&id) else { return };
        self.alloc.unreserve(reservation(&v, self.cluster_size));
        v.map.values().for_each(|pc| self.alloc.decref(pc));
        self.volume_names.remove(&v.spec.name);
        if let Some(g) = v.spec.group.and_then(|g| self.members.get_mut(&g)) {
            g.remove(&id);
        }
    }

    fn remove_snapshot(&mut self, id: SnapshotId) {
        let Some(s) = self.t.snapshots.remove(&id) else { return };
        s.map.values().for_each(|pc| self.alloc.decref(pc));
        if !s.name.is_empty() {
            self.snapshot_names.remove(&s.name);
        }
    }
}
