//! CSI GroupController: crash-consistent snapshots of a volume group.
//!
//! Core's consistency unit is the volume group: `create_group_snapshot` freezes every member in
//! one metadata commit, so the snapshots are write-order consistent across the group. A
//! CreateVolumeGroupSnapshot therefore names exactly the members of one group (see
//! [`resolve_group`]). Every handler validates, resolves CSI ids, runs one closure on the pool and
//! converts back; core errors become statuses through [`status::from_core`] only.
//!
//! Secrets are accepted (size-checked) and never logged: nothing here logs a request.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use edgevol_core::{BlockDevice, GroupId, GroupSnapshot, Pool, SnapshotId, VolumeId};
use edgevol_proto::csi::v1::group_controller_server::GroupController;
use edgevol_proto::csi::v1::group_controller_service_capability::{self, rpc};
use edgevol_proto::csi::v1::{
    CreateVolumeGroupSnapshotRequest, CreateVolumeGroupSnapshotResponse,
    DeleteVolumeGroupSnapshotRequest, DeleteVolumeGroupSnapshotResponse,
    GetVolumeGroupSnapshotRequest, GetVolumeGroupSnapshotResponse,
    GroupControllerGetCapabilitiesRequest, GroupControllerGetCapabilitiesResponse,
    GroupControllerServiceCapability, Snapshot, VolumeGroupSnapshot,
};
use tonic::{Request, Response, Status};

use super::ids::Ids;
use super::{status, validate};
use crate::state::{now_nanos, State};

/// The GroupController service.
#[derive(Debug, Clone)]
pub struct GroupControllerService {
    state: Arc<State>,
}

impl GroupControllerService {
    /// Serves group snapshots of `state`'s pool.
    pub fn new(state: Arc<State>) -> Self {
        GroupControllerService { state }
    }
}

/// CreateVolumeGroupSnapshot, validated: a name and the set of source volumes, as given.
struct CreateOp {
    name: String,
    sources: Vec<String>,
}

impl TryFrom<CreateVolumeGroupSnapshotRequest> for CreateOp {
    type Error = Status;

    fn try_from(r: CreateVolumeGroupSnapshotRequest) -> Result<Self, Status> {
        validate::required("name", &r.name)?;
        validate::secrets(&r.secrets)?;
        validate::map("parameters", &r.parameters)?;
        // No group snapshot parameter is defined: refusing them beats silently ignoring a
        // class that asks for something we do not do (e.g. application consistency).
        if let Some(key) = sorted_keys(&r.parameters).first() {
            return Err(Status::invalid_argument(format!(
                "parameters: unknown key {key:?}; group snapshots take no parameters"
            )));
        }
        if r.source_volume_ids.is_empty() {
            return Err(Status::invalid_argument("source_volume_ids is required"));
        }
        let mut seen = BTreeSet::new();
        for id in &r.source_volume_ids {
            validate::required("source_volume_ids entry", id)?;
            if !seen.insert(id.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "source_volume_ids lists {id} twice"
                )));
            }
        }
        Ok(CreateOp {
            name: r.name,
            sources: r.source_volume_ids,
        })
    }
}

/// Delete/GetVolumeGroupSnapshot, validated: the group snapshot id and the member snapshot ids
/// the CO believes it holds. The ids are REQUIRED by the spec, but only checked once the group
/// snapshot is found: an unknown id is NOT_FOUND (Get) or OK (Delete) whatever they say.
struct ByIdOp {
    id: String,
    snapshot_ids: Vec<String>,
}

impl ByIdOp {
    fn new(
        id: String,
        snapshot_ids: Vec<String>,
        secrets: &HashMap<String, String>,
    ) -> Result<Self, Status> {
        validate::required("group_snapshot_id", &id)?;
        validate::secrets(secrets)?;
        for s in &snapshot_ids {
            validate::required("snapshot_ids entry", s)?;
        }
        Ok(ByIdOp { id, snapshot_ids })
    }

    /// INVALID_ARGUMENT unless `snapshot_ids` is given ("snapshot_ids is required") and is
    /// exactly the member snapshots of `gs` (in any order; "Snapshot list mismatch").
    fn check_members(&self, ids: Ids<'_>, gs: &GroupSnapshot) -> Result<(), Status> {
        if self.snapshot_ids.is_empty() {
            return Err(Status::invalid_argument("snapshot_ids is required"));
        }
        let ours: BTreeSet<String> = gs.snapshots().iter().map(|&s| ids.snapshot(s)).collect();
        let theirs: BTreeSet<String> = self.snapshot_ids.iter().cloned().collect();
        if ours == theirs && theirs.len() == self.snapshot_ids.len() {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "snapshot_ids do not match group snapshot {}: it holds [{}]",
            ids.group_snapshot(gs.id()),
            ours.into_iter().collect::<Vec<_>>().join(", ")
        )))
    }
}

fn sorted_keys(map: &HashMap<String, String>) -> Vec<&String> {
    let mut keys: Vec<_> = map.keys().collect();
    keys.sort();
    keys
}

/// The group whose members are exactly `sources`.
///
/// A volume id that names nothing is NOT_FOUND (the general gRPC meaning; the CO must fix the
/// id, not the volume's configuration). Volumes that exist but are not exactly one group's
/// members are FAILED_PRECONDITION, the spec's "Cannot snapshot multiple volumes together" row:
/// "the volumes are not configured properly based on requirements from the SP. Caller MUST fix
/// the configuration of the volumes" — here, put them in one volume group (and only them), since
/// the group is what core freezes in one commit. INVALID_ARGUMENT would tell the CO the request
/// itself is malformed, which it is not.
fn resolve_group<D: BlockDevice>(
    ids: Ids<'_>,
    pool: &Pool<D>,
    sources: &[VolumeId],
) -> Result<GroupId, Status> {
    let mut group = None;
    for &v in sources {
        let volume = pool.volume(v).map_err(|e| status::from_core(ids, e))?;
        let Some(g) = volume.group() else {
            return Err(Status::failed_precondition(format!(
                "volume {} is in no volume group: group snapshots are taken of exactly the \
                 members of one volume group (ModifyVolumeGroupMembership)",
                ids.volume(v)
            )));
        };
        match group {
            None => group = Some(g),
            Some(first) if first != g => {
                return Err(Status::failed_precondition(format!(
                    "the volumes are in different volume groups ({} and {}): group snapshots \
                     are taken of exactly the members of one volume group",
                    ids.group(first),
                    ids.group(g)
                )))
            }
            Some(_) => {}
        }
    }
    let group = group.expect("sources is not empty");
    let members: BTreeSet<VolumeId> = pool
        .group_members(group)
        .map_err(|e| status::from_core(ids, e))?
        .collect();
    let asked: BTreeSet<VolumeId> = sources.iter().copied().collect();
    if members != asked {
        let missing: Vec<String> = members.difference(&asked).map(|&v| ids.volume(v)).collect();
        return Err(Status::failed_precondition(format!(
            "volume group {} also holds [{}]: a group snapshot covers exactly all members of \
             one volume group",
            ids.group(group),
            missing.join(", ")
        )));
    }
    Ok(group)
}

/// Sets `$slot` (an `Option<google.protobuf.Timestamp>`) to `$nanos` since the epoch. A macro
/// because the timestamp type is prost-types', which this crate does not depend on by name.
macro_rules! set_time {
    ($slot:expr, $nanos:expr) => {{
        let nanos: u64 = $nanos;
        let t = $slot.get_or_insert_with(Default::default);
        t.seconds = i64::try_from(nanos / 1_000_000_000).unwrap_or(i64::MAX);
        t.nanos = i32::try_from(nanos % 1_000_000_000).unwrap_or(0);
    }};
}

/// A group snapshot as CSI shows it: every member snapshot, ready (snapshots are instant).
fn group_snapshot_message<D: BlockDevice>(
    ids: Ids<'_>,
    pool: &Pool<D>,
    gs: &GroupSnapshot,
) -> Result<VolumeGroupSnapshot, Status> {
    let group_snapshot_id = ids.group_snapshot(gs.id());
    let mut snapshots = Vec::with_capacity(gs.snapshots().len());
    for &sid in gs.snapshots() {
        let s = pool.snapshot(sid).map_err(|e| status::from_core(ids, e))?;
        let mut m = Snapshot {
            size_bytes: i64::try_from(s.size()).unwrap_or(i64::MAX),
            snapshot_id: ids.snapshot(sid),
            source_volume_id: ids.volume(s.source_volume()),
            creation_time: None,
            ready_to_use: true,
            group_snapshot_id: group_snapshot_id.clone(),
        };
        set_time!(m.creation_time, s.created_at());
        snapshots.push(m);
    }
    let mut m = VolumeGroupSnapshot {
        group_snapshot_id,
        snapshots,
        creation_time: None,
        ready_to_use: true,
    };
    set_time!(m.creation_time, gs.created_at());
    Ok(m)
}

/// Source volumes of a group snapshot's members.
fn sources_of<D: BlockDevice>(
    ids: Ids<'_>,
    pool: &Pool<D>,
    gs: &GroupSnapshot,
) -> Result<BTreeSet<VolumeId>, Status> {
    gs.snapshots()
        .iter()
        .map(|&s: &SnapshotId| {
            pool.snapshot(s)
                .map(|s| s.source_volume())
                .map_err(|e| status::from_core(ids, e))
        })
        .collect()
}

fn create<D: BlockDevice>(
    ids: Ids<'_>,
    pool: &mut Pool<D>,
    op: &CreateOp,
) -> Result<VolumeGroupSnapshot, Status> {
    // Idempotency first, by name and source set: the group may have changed (or gone) since
    // the snapshot was cut, and a retry must still get the snapshot it created.
    let asked: Option<Vec<VolumeId>> = op.sources.iter().map(|s| ids.parse_volume(s)).collect();
    if let Some(gs) = pool.group_snapshot_by_name(&op.name) {
        let existing = sources_of(ids, pool, gs)?;
        let same = asked
            .as_ref()
            .is_some_and(|a| a.iter().copied().collect::<BTreeSet<_>>() == existing);
        if !same {
            return Err(Status::already_exists(format!(
                "group snapshot {} is named {:?} and was taken of other volumes",
                ids.group_snapshot(gs.id()),
                op.name
            )));
        }
        return group_snapshot_message(ids, pool, gs);
    }
    let Some(sources) = asked else {
        let bad = op
            .sources
            .iter()
            .find(|s| ids.parse_volume(s).is_none())
            .expect("one failed to parse");
        return Err(Status::not_found(format!("volume {bad} does not exist")));
    };
    let group = resolve_group(ids, pool, &sources)?;
    let id = pool
        .create_group_snapshot(group, &op.name, now_nanos())
        .map_err(|e| status::from_core(ids, e))?;
    let gs = pool
        .group_snapshot(id)
        .map_err(|e| status::from_core(ids, e))?;
    group_snapshot_message(ids, pool, gs)
}

#[tonic::async_trait]
impl GroupController for GroupControllerService {
    async fn group_controller_get_capabilities(
        &self,
        _request: Request<GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<GroupControllerGetCapabilitiesResponse>, Status> {
        let rpc = |t: rpc::Type| GroupControllerServiceCapability {
            r#type: Some(group_controller_service_capability::Type::Rpc(
                group_controller_service_capability::Rpc { r#type: t.into() },
            )),
        };
        Ok(Response::new(GroupControllerGetCapabilitiesResponse {
            capabilities: vec![rpc(rpc::Type::CreateDeleteGetVolumeGroupSnapshot)],
        }))
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<CreateVolumeGroupSnapshotResponse>, Status> {
        let op = CreateOp::try_from(request.into_inner())?;
        let group_snapshot = self
            .state
            .with_pool(move |state, pool| create(state.ids(), pool, &op))
            .await?;
        Ok(Response::new(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_snapshot),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<DeleteVolumeGroupSnapshotResponse>, Status> {
        let r = request.into_inner();
        let op = ByIdOp::new(r.group_snapshot_id, r.snapshot_ids, &r.secrets)?;
        self.state
            .with_pool(move |state, pool| {
                let ids = state.ids();
                // Gone (or never ours): the spec's MUST reply OK.
                let Some(id) = ids.parse_group_snapshot(&op.id) else {
                    return Ok(());
                };
                let Ok(gs) = pool.group_snapshot(id) else {
                    return Ok(());
                };
                op.check_members(ids, gs)?;
                // "Volume group snapshot in use" cannot happen: volumes created from a member
                // snapshot share its clusters by reference count and outlive it.
                pool.delete_group_snapshot(id)
                    .map_err(|e| status::from_core(ids, e))
            })
            .await?;
        Ok(Response::new(DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<GetVolumeGroupSnapshotResponse>, Status> {
        let r = request.into_inner();
        let op = ByIdOp::new(r.group_snapshot_id, r.snapshot_ids, &r.secrets)?;
        let group_snapshot = self
            .state
            .with_pool(move |state, pool| {
                let ids = state.ids();
                let gs = ids
                    .parse_group_snapshot(&op.id)
                    .and_then(|id| pool.group_snapshot(id).ok())
                    .ok_or_else(|| {
                        Status::not_found(format!("group snapshot {} does not exist", op.id))
                    })?;
                op.check_members(ids, gs)?;
                group_snapshot_message(ids, pool, gs)
            })
            .await?;
        Ok(Response::new(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_snapshot),
        }))
    }
}
