//! The VolumeGroup service (alpha proposal, `volumegroup.Controller`): volume groups on core's
//! groups, the unit core snapshots in one commit (see [`super::group_controller`]).
//!
//! Handlers validate, resolve CSI ids, run one closure on the pool and convert back; core errors
//! become statuses through [`status::from_core`] only. Secrets are accepted (size-checked) and
//! never logged: nothing here logs a request.
//!
//! Parameters (from the VolumeGroupClass): the only key is [`CONSISTENCY`], whose only value is
//! `crash` (group snapshots freeze all members in one metadata commit; nothing is quiesced).
//! Anything else is the spec's "Not supported" INVALID_ARGUMENT. Parameters are stored as given
//! and compared as given for idempotency, and echoed in `volume_group_context`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use edgevol_core::{BlockDevice, ContentSource, Group, GroupId, Pool, VolumeId};
use edgevol_proto::volumegroup::controller_server::Controller;
use edgevol_proto::volumegroup::list_volume_groups_response::Entry;
use edgevol_proto::volumegroup::vg_volume_content_source::{self, SnapshotSource, VolumeSource};
use edgevol_proto::volumegroup::{
    ControllerGetVolumeGroupRequest, ControllerGetVolumeGroupResponse, CreateVolumeGroupRequest,
    CreateVolumeGroupResponse, DeleteVolumeGroupRequest, DeleteVolumeGroupResponse,
    ListVolumeGroupsRequest, ListVolumeGroupsResponse, ModifyVolumeGroupMembershipRequest,
    ModifyVolumeGroupMembershipResponse, VgTopology, VgVolume, VgVolumeContentSource, VolumeGroup,
};
use tonic::{Request, Response, Status};

use super::ids::Ids;
use super::{status, validate};
use crate::state::State;

/// The one group parameter: which consistency group snapshots give.
pub const CONSISTENCY: &str = "consistency";

/// The VolumeGroup service.
#[derive(Debug, Clone)]
pub struct VolumeGroupService {
    state: Arc<State>,
}

impl VolumeGroupService {
    /// Serves the volume groups of `state`'s pool.
    pub fn new(state: Arc<State>) -> Self {
        VolumeGroupService { state }
    }
}

/// CreateVolumeGroup, validated.
struct CreateOp {
    name: String,
    parameters: Vec<(String, String)>,
}

impl TryFrom<CreateVolumeGroupRequest> for CreateOp {
    type Error = Status;

    fn try_from(r: CreateVolumeGroupRequest) -> Result<Self, Status> {
        validate::required("name", &r.name)?;
        validate::map("parameters", &r.parameters)?;
        validate::secrets(&r.secrets)?;
        let mut parameters: Vec<(String, String)> = r.parameters.into_iter().collect();
        parameters.sort();
        for (k, v) in &parameters {
            match (k.as_str(), v.as_str()) {
                (CONSISTENCY, "crash") => {}
                (CONSISTENCY, other) => {
                    return Err(Status::invalid_argument(format!(
                        "parameters: {CONSISTENCY} {other:?} is not supported; only \"crash\" \
                         (group snapshots are crash-consistent, nothing is quiesced)"
                    )))
                }
                (key, _) => {
                    return Err(Status::invalid_argument(format!(
                        "parameters: unknown key {key:?}; the only key is {CONSISTENCY:?}"
                    )))
                }
            }
        }
        Ok(CreateOp {
            name: r.name,
            parameters,
        })
    }
}

/// ModifyVolumeGroupMembership, validated: the group id and the wanted member ids.
struct ModifyOp {
    group: String,
    volumes: Vec<String>,
}

impl TryFrom<ModifyVolumeGroupMembershipRequest> for ModifyOp {
    type Error = Status;

    fn try_from(r: ModifyVolumeGroupMembershipRequest) -> Result<Self, Status> {
        validate::required("volume_group_id", &r.volume_group_id)?;
        validate::secrets(&r.secrets)?;
        for v in &r.volume_ids {
            validate::required("volume_ids entry", v)?;
        }
        Ok(ModifyOp {
            group: r.volume_group_id,
            volumes: r.volume_ids,
        })
    }
}

/// ListVolumeGroups, validated: a page size (0: all) and where to start.
struct ListOp {
    max_entries: usize,
    starting_token: String,
}

impl TryFrom<ListVolumeGroupsRequest> for ListOp {
    type Error = Status;

    fn try_from(r: ListVolumeGroupsRequest) -> Result<Self, Status> {
        validate::secrets(&r.secrets)?;
        let max_entries = usize::try_from(r.max_entries).map_err(|_| {
            Status::invalid_argument(format!(
                "max_entries is {}; it must not be negative",
                r.max_entries
            ))
        })?;
        // Tokens are group ids we handed out: a longer one is not ours (ABORTED below).
        Ok(ListOp {
            max_entries,
            starting_token: r.starting_token,
        })
    }
}

/// A required group id, and secrets, for Delete and Get.
fn group_id_arg(id: &str, secrets: &HashMap<String, String>) -> Result<(), Status> {
    validate::required("volume_group_id", id)?;
    validate::secrets(secrets)
}

fn not_found(id: &str) -> Status {
    Status::not_found(format!("volume group {id} does not exist"))
}

/// A group as the proposal shows it: its parameters as context, and every member volume.
fn group_message<D: BlockDevice>(
    state: &State,
    pool: &Pool<D>,
    group: &Group,
) -> Result<VolumeGroup, Status> {
    let ids = state.ids();
    let core = |e| status::from_core(ids, e);
    let mut volumes = Vec::new();
    for v in pool.group_members(group.id()).map_err(core)? {
        let volume = pool.volume(v).map_err(core)?;
        let content_source = volume.source().map(|s| VgVolumeContentSource {
            r#type: Some(match s {
                ContentSource::Snapshot(s) => {
                    vg_volume_content_source::Type::Snapshot(SnapshotSource {
                        snapshot_id: ids.snapshot(s),
                    })
                }
                ContentSource::Volume(v) => vg_volume_content_source::Type::Volume(VolumeSource {
                    volume_id: ids.volume(v),
                }),
            }),
        });
        // The same volume_context and topology as the Controller service reports: CSI wants a
        // volume to look the same from every RPC.
        volumes.push(VgVolume {
            capacity_bytes: i64::try_from(volume.size()).unwrap_or(i64::MAX),
            volume_id: ids.volume(v),
            volume_context: super::controller::volume_context(pool, volume),
            content_source,
            accessible_topology: vec![VgTopology {
                segments: state.topology.clone().into_iter().collect(),
            }],
        });
    }
    Ok(VolumeGroup {
        volume_group_id: ids.group(group.id()),
        volume_group_context: group.parameters().iter().cloned().collect(),
        volumes,
    })
}

/// The group named by `id`, or NOT_FOUND naming `id` as given.
fn find_group<'p, D: BlockDevice>(
    ids: Ids<'_>,
    pool: &'p Pool<D>,
    id: &str,
) -> Result<&'p Group, Status> {
    ids.parse_group(id)
        .and_then(|g| pool.group(g).ok())
        .ok_or_else(|| not_found(id))
}

fn create<D: BlockDevice>(
    state: &State,
    pool: &mut Pool<D>,
    op: CreateOp,
) -> Result<VolumeGroup, Status> {
    let ids = state.ids();
    // Core is idempotent by name: the same name and parameters return the existing group
    // (whatever its members now are); other parameters are ALREADY_EXISTS.
    let id = pool
        .create_group(&op.name, op.parameters)
        .map_err(|e| status::from_core(ids, e))?;
    let group = pool.group(id).map_err(|e| status::from_core(ids, e))?;
    group_message(state, pool, group)
}

fn modify<D: BlockDevice>(
    state: &State,
    pool: &mut Pool<D>,
    op: &ModifyOp,
) -> Result<VolumeGroup, Status> {
    let ids = state.ids();
    let group: GroupId = find_group(ids, pool, &op.group)?.id();
    let mut members = BTreeSet::new();
    for v in &op.volumes {
        let id = ids
            .parse_volume(v)
            .ok_or_else(|| Status::not_found(format!("volume {v} does not exist")))?;
        members.insert(id);
    }
    let members: Vec<VolumeId> = members.into_iter().collect();
    // Core checks, in one commit: unknown volume NOT_FOUND, a volume of another group
    // INVALID_ARGUMENT ("incompatible"), more than MAX_GROUP_MEMBERS RESOURCE_EXHAUSTED.
    pool.set_group_members(group, &members)
        .map_err(|e| status::from_core(ids, e))?;
    let group = pool.group(group).map_err(|e| status::from_core(ids, e))?;
    group_message(state, pool, group)
}

fn list<D: BlockDevice>(
    state: &State,
    pool: &Pool<D>,
    op: &ListOp,
) -> Result<ListVolumeGroupsResponse, Status> {
    let ids = state.ids();
    // The token is the id of the last group of the previous page: groups are listed in id order
    // after it, so groups created or deleted meanwhile never shift a page.
    let after = if op.starting_token.is_empty() {
        None
    } else {
        Some(ids.parse_group(&op.starting_token).ok_or_else(|| {
            Status::aborted(format!(
                "starting_token {:?} is not one this plugin issued; restart the listing",
                op.starting_token
            ))
        })?)
    };
    let limit = if op.max_entries == 0 {
        usize::MAX
    } else {
        op.max_entries
    };
    let mut entries = Vec::new();
    let mut next_token = String::new();
    for group in pool.groups(after) {
        if entries.len() == limit {
            next_token = entries
                .last()
                .map(|e: &Entry| {
                    e.volume_group
                        .as_ref()
                        .map_or_else(String::new, |g| g.volume_group_id.clone())
                })
                .unwrap_or_default();
            break;
        }
        entries.push(Entry {
            volume_group: Some(group_message(state, pool, group)?),
        });
    }
    Ok(ListVolumeGroupsResponse {
        entries,
        next_token,
    })
}

#[tonic::async_trait]
impl Controller for VolumeGroupService {
    async fn create_volume_group(
        &self,
        request: Request<CreateVolumeGroupRequest>,
    ) -> Result<Response<CreateVolumeGroupResponse>, Status> {
        let op = CreateOp::try_from(request.into_inner())?;
        let group = self
            .state
            .with_pool(move |state, pool| create(state, pool, op))
            .await?;
        Ok(Response::new(CreateVolumeGroupResponse {
            volume_group: Some(group),
        }))
    }

    async fn modify_volume_group_membership(
        &self,
        request: Request<ModifyVolumeGroupMembershipRequest>,
    ) -> Result<Response<ModifyVolumeGroupMembershipResponse>, Status> {
        let op = ModifyOp::try_from(request.into_inner())?;
        let group = self
            .state
            .with_pool(move |state, pool| modify(state, pool, &op))
            .await?;
        Ok(Response::new(ModifyVolumeGroupMembershipResponse {
            volume_group: Some(group),
        }))
    }

    async fn delete_volume_group(
        &self,
        request: Request<DeleteVolumeGroupRequest>,
    ) -> Result<Response<DeleteVolumeGroupResponse>, Status> {
        let r = request.into_inner();
        group_id_arg(&r.volume_group_id, &r.secrets)?;
        let id = r.volume_group_id;
        self.state
            .with_pool(move |state, pool| {
                let ids = state.ids();
                // Gone (or never ours): the proposal's MUST reply OK.
                let Ok(group) = find_group(ids, pool, &id).map(Group::id) else {
                    return Ok(());
                };
                // Deletes the member volumes too (the proposal). A published member is
                // FAILED_PRECONDITION ("in use"). Group snapshots are independent of the group
                // (their clusters are reference-counted), so they never block it.
                pool.delete_group(group)
                    .map_err(|e| status::from_core(ids, e))
            })
            .await?;
        Ok(Response::new(DeleteVolumeGroupResponse {}))
    }

    async fn list_volume_groups(
        &self,
        request: Request<ListVolumeGroupsRequest>,
    ) -> Result<Response<ListVolumeGroupsResponse>, Status> {
        let op = ListOp::try_from(request.into_inner())?;
        let response = self
            .state
            .with_pool(move |state, pool| list(state, pool, &op))
            .await?;
        Ok(Response::new(response))
    }

    async fn controller_get_volume_group(
        &self,
        request: Request<ControllerGetVolumeGroupRequest>,
    ) -> Result<Response<ControllerGetVolumeGroupResponse>, Status> {
        let r = request.into_inner();
        group_id_arg(&r.volume_group_id, &r.secrets)?;
        let id = r.volume_group_id;
        let group = self
            .state
            .with_pool(move |state, pool| {
                let ids = state.ids();
                let group = find_group(ids, pool, &id)?;
                group_message(state, pool, group)
            })
            .await?;
        Ok(Response::new(ControllerGetVolumeGroupResponse {
            volume_group: Some(group),
        }))
    }
}
