//! CSI GroupController: crash-consistent snapshots of a volume group.
//!
//! Core's consistency unit is the volume group: `create_group_snapshot` freezes every member in
//! one metadata commit, so the snapshots are write-order consistent across the group. A
//! CreateVolumeGroupSnapshot therefore names exactly the members of one group (see
//! `resolve_group`). Every handler validates (`TryFrom`), runs one operation on the pool
//! ([`super::call`]) and encodes ([`encode::group_snapshot`]); failures become statuses through
//! [`super::status`] only.
//!
//! Idempotency: CSI compares a repeated request's name and `source_volume_ids`; core's
//! `create_group_snapshot` compares the name and the group. The sources are turned into the
//! group core is asked about: those of an existing group snapshot of that name designate its
//! group (the group may have changed or gone since, and a retry must still get the snapshot it
//! created), so core returns it; other sources are core's ALREADY_EXISTS for that snapshot.
//!
//! Secrets are accepted (size-checked) and never logged: nothing here logs a request.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use edgevol_core::{BlockDevice, GroupId, GroupSnapshot, ObjectRef, Pool, SnapshotId, VolumeId};
use edgevol_proto::csi::v1::group_controller_server::GroupController;
use edgevol_proto::csi::v1::group_controller_service_capability::{self, rpc};
use edgevol_proto::csi::v1::{
    CreateVolumeGroupSnapshotRequest, CreateVolumeGroupSnapshotResponse,
    DeleteVolumeGroupSnapshotRequest, DeleteVolumeGroupSnapshotResponse,
    GetVolumeGroupSnapshotRequest, GetVolumeGroupSnapshotResponse,
    GroupControllerGetCapabilitiesRequest, GroupControllerGetCapabilitiesResponse,
    GroupControllerServiceCapability, VolumeGroupSnapshot,
};
use tonic::{Request, Response, Status};

use super::error::{gone_is_ok, Error};
use super::ids::Ids;
use super::{encode, validate};
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

impl TryFrom<DeleteVolumeGroupSnapshotRequest> for ByIdOp {
    type Error = Status;

    fn try_from(r: DeleteVolumeGroupSnapshotRequest) -> Result<Self, Status> {
        ByIdOp::new(r.group_snapshot_id, r.snapshot_ids, &r.secrets)
    }
}

impl TryFrom<GetVolumeGroupSnapshotRequest> for ByIdOp {
    type Error = Status;

    fn try_from(r: GetVolumeGroupSnapshotRequest) -> Result<Self, Status> {
        ByIdOp::new(r.group_snapshot_id, r.snapshot_ids, &r.secrets)
    }
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
    fn check_members(&self, ids: Ids<'_>, gs: &GroupSnapshot) -> Result<(), Error> {
        if self.snapshot_ids.is_empty() {
            return Err(Error::SnapshotIdsRequired);
        }
        let ours: BTreeSet<String> = gs.snapshots().iter().map(|&s| ids.snapshot(s)).collect();
        let theirs: BTreeSet<String> = self.snapshot_ids.iter().cloned().collect();
        if ours == theirs && theirs.len() == self.snapshot_ids.len() {
            return Ok(());
        }
        Err(Error::SnapshotIdsMismatch {
            group_snapshot: gs.id(),
            members: gs.snapshots().to_vec(),
        })
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
fn resolve_group<D: BlockDevice>(pool: &Pool<D>, sources: &[VolumeId]) -> Result<GroupId, Error> {
    let mut group = None;
    for &v in sources {
        let Some(g) = pool.volume(v)?.group() else {
            return Err(Error::NotInGroup(v));
        };
        match group {
            None => group = Some(g),
            Some(first) if first != g => return Err(Error::DifferentGroups(first, g)),
            Some(_) => {}
        }
    }
    let group = group.expect("sources is not empty");
    let members: BTreeSet<VolumeId> = pool.group_members(group)?.collect();
    let asked: BTreeSet<VolumeId> = sources.iter().copied().collect();
    if members != asked {
        return Err(Error::NotAllMembers {
            group,
            missing: members.difference(&asked).copied().collect(),
        });
    }
    Ok(group)
}

/// Source volumes of a group snapshot's members.
fn sources_of<D: BlockDevice>(
    pool: &Pool<D>,
    gs: &GroupSnapshot,
) -> Result<BTreeSet<VolumeId>, Error> {
    gs.snapshots()
        .iter()
        .map(|&s: &SnapshotId| Ok(pool.snapshot(s)?.source_volume()))
        .collect()
}

fn create<D: BlockDevice>(
    ids: Ids<'_>,
    pool: &mut Pool<D>,
    op: &CreateOp,
) -> Result<VolumeGroupSnapshot, Error> {
    let asked: Option<BTreeSet<VolumeId>> =
        op.sources.iter().map(|s| ids.parse_volume(s)).collect();
    let group = match pool.group_snapshot_by_name(&op.name) {
        // A retry: these sources designate the group that snapshot was taken of.
        Some(gs) if asked.as_ref() == Some(&sources_of(pool, gs)?) => gs.group(),
        Some(gs) => {
            return Err(
                edgevol_core::Error::AlreadyExists(ObjectRef::GroupSnapshot(gs.id())).into(),
            )
        }
        None => {
            let sources = op
                .sources
                .iter()
                .map(|s| ids.require_volume(s))
                .collect::<Result<Vec<_>, _>>()?;
            resolve_group(pool, &sources)?
        }
    };
    let id = pool.create_group_snapshot(group, &op.name, now_nanos())?;
    encode::group_snapshot(ids, pool, pool.group_snapshot(id)?)
}

/// DeleteVolumeGroupSnapshot: the group snapshot and its member snapshots, in one commit.
/// Gone (or never ours): the spec's MUST reply OK. "Volume group snapshot in use" cannot
/// happen: volumes created from a member snapshot share its clusters by reference count and
/// outlive it.
fn delete<D: BlockDevice>(ids: Ids<'_>, pool: &mut Pool<D>, op: &ByIdOp) -> Result<(), Error> {
    gone_is_ok(find(ids, pool, op).map(GroupSnapshot::id).and_then(|id| {
        pool.delete_group_snapshot(id)?;
        Ok(())
    }))
}

/// The group snapshot `op` names, if it exists, with its members checked.
fn find<'p, D: BlockDevice>(
    ids: Ids<'_>,
    pool: &'p Pool<D>,
    op: &ByIdOp,
) -> Result<&'p GroupSnapshot, Error> {
    let gs = pool.group_snapshot(ids.require_group_snapshot(&op.id)?)?;
    op.check_members(ids, gs)?;
    Ok(gs)
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
        let group_snapshot = super::call(&self.state, move |state, pool| {
            create(Ids::new(&state.appliance_id), pool, &op)
        })
        .await?;
        Ok(Response::new(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_snapshot),
        }))
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<DeleteVolumeGroupSnapshotResponse>, Status> {
        let op = ByIdOp::try_from(request.into_inner())?;
        super::call(&self.state, move |state, pool| {
            delete(Ids::new(&state.appliance_id), pool, &op)
        })
        .await?;
        Ok(Response::new(DeleteVolumeGroupSnapshotResponse {}))
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<GetVolumeGroupSnapshotResponse>, Status> {
        let op = ByIdOp::try_from(request.into_inner())?;
        let group_snapshot = super::call(&self.state, move |state, pool| {
            let ids = Ids::new(&state.appliance_id);
            encode::group_snapshot(ids, pool, find(ids, pool, &op)?)
        })
        .await?;
        Ok(Response::new(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_snapshot),
        }))
    }
}
