//! The VolumeGroup service (alpha proposal, `volumegroup.Controller`): volume groups on core's
//! groups, the unit core snapshots in one commit (see [`super::group_controller`]).
//!
//! Handlers validate (`TryFrom`), run one operation on the pool ([`super::call`]) and encode
//! ([`encode::volume_group`]); failures become statuses through [`super::status`] only. Secrets
//! are accepted (size-checked) and never logged: nothing here logs a request.
//!
//! Parameters (from the VolumeGroupClass): the only key is [`CONSISTENCY`], whose only value is
//! `crash` (group snapshots freeze all members in one metadata commit; nothing is quiesced).
//! Anything else is the spec's "Not supported" INVALID_ARGUMENT. Parameters are stored as given
//! and compared as given for idempotency, and echoed in `volume_group_context`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use edgevol_core::{BlockDevice, Group, Pool, VolumeId};
use edgevol_proto::volumegroup::controller_server::Controller;
use edgevol_proto::volumegroup::list_volume_groups_response::Entry;
use edgevol_proto::volumegroup::{
    ControllerGetVolumeGroupRequest, ControllerGetVolumeGroupResponse, CreateVolumeGroupRequest,
    CreateVolumeGroupResponse, DeleteVolumeGroupRequest, DeleteVolumeGroupResponse,
    ListVolumeGroupsRequest, ListVolumeGroupsResponse, ModifyVolumeGroupMembershipRequest,
    ModifyVolumeGroupMembershipResponse, VolumeGroup,
};
use tonic::{Request, Response, Status};

use super::error::{gone_is_ok, Error};
use super::ids::Ids;
use super::{encode, page, validate};
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
        // Tokens are group ids we handed out: checked on the pool (ABORTED if not ours).
        Ok(ListOp {
            max_entries: validate::max_entries(r.max_entries)?,
            starting_token: r.starting_token,
        })
    }
}

/// Delete/ControllerGetVolumeGroup, validated: the group id, as given.
struct ByIdOp {
    group: String,
}

impl ByIdOp {
    fn new(id: String, secrets: &HashMap<String, String>) -> Result<Self, Status> {
        validate::required("volume_group_id", &id)?;
        validate::secrets(secrets)?;
        Ok(ByIdOp { group: id })
    }
}

impl TryFrom<DeleteVolumeGroupRequest> for ByIdOp {
    type Error = Status;

    fn try_from(r: DeleteVolumeGroupRequest) -> Result<Self, Status> {
        ByIdOp::new(r.volume_group_id, &r.secrets)
    }
}

impl TryFrom<ControllerGetVolumeGroupRequest> for ByIdOp {
    type Error = Status;

    fn try_from(r: ControllerGetVolumeGroupRequest) -> Result<Self, Status> {
        ByIdOp::new(r.volume_group_id, &r.secrets)
    }
}

/// The group named by `id`: NOT_FOUND naming `id` as given if it is not ours or is gone.
fn find_group<'p, D: BlockDevice>(
    ids: Ids<'_>,
    pool: &'p Pool<D>,
    id: &str,
) -> Result<&'p Group, Error> {
    Ok(pool.group(ids.require_group(id)?)?)
}

/// CreateVolumeGroup. Core is idempotent by name: the same name and parameters return the
/// existing group (whatever its members now are); other parameters are ALREADY_EXISTS.
fn create<D: BlockDevice>(
    state: &State,
    pool: &mut Pool<D>,
    op: CreateOp,
) -> Result<VolumeGroup, Error> {
    let id = pool.create_group(&op.name, op.parameters)?;
    encode::volume_group(state, pool, pool.group(id)?)
}

/// ModifyVolumeGroupMembership. Core checks, in one commit: unknown volume NOT_FOUND, a volume
/// of another group INVALID_ARGUMENT ("incompatible"), more than MAX_GROUP_MEMBERS
/// RESOURCE_EXHAUSTED.
fn modify<D: BlockDevice>(
    state: &State,
    pool: &mut Pool<D>,
    op: &ModifyOp,
) -> Result<VolumeGroup, Error> {
    let ids = Ids::new(&state.appliance_id);
    let group = find_group(ids, pool, &op.group)?.id();
    let members = op
        .volumes
        .iter()
        .map(|v| ids.require_volume(v))
        .collect::<Result<BTreeSet<VolumeId>, _>>()?;
    pool.set_group_members(group, &members.into_iter().collect::<Vec<_>>())?;
    encode::volume_group(state, pool, pool.group(group)?)
}

/// DeleteVolumeGroup: the group and its member volumes; gone (or never ours) is the proposal's
/// MUST reply OK. A published member is FAILED_PRECONDITION ("in use"). Group snapshots are
/// independent of the group (their clusters are reference-counted), so they never block it.
fn delete<D: BlockDevice>(state: &State, pool: &mut Pool<D>, op: &ByIdOp) -> Result<(), Error> {
    let group = find_group(Ids::new(&state.appliance_id), pool, &op.group).map(Group::id);
    gone_is_ok(group.and_then(|g| Ok(pool.delete_group(g)?)))
}

/// ListVolumeGroups. The token is the id of the last group of the previous page: groups are
/// listed in id order after it, so groups created or deleted meanwhile never shift a page.
fn list<D: BlockDevice>(
    state: &State,
    pool: &Pool<D>,
    op: &ListOp,
) -> Result<ListVolumeGroupsResponse, Error> {
    let ids = Ids::new(&state.appliance_id);
    let after = match op.starting_token.as_str() {
        "" => None,
        token => Some(
            ids.parse_group(token)
                .ok_or_else(|| Error::BadToken(token.to_owned()))?,
        ),
    };
    let (groups, next_token) = page(pool.groups(after), op.max_entries, |g| ids.group(g.id()));
    let entries = groups
        .into_iter()
        .map(|g| {
            Ok(Entry {
                volume_group: Some(encode::volume_group(state, pool, g)?),
            })
        })
        .collect::<Result<_, Error>>()?;
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
        let group = super::call(&self.state, move |state, pool| create(state, pool, op)).await?;
        Ok(Response::new(CreateVolumeGroupResponse {
            volume_group: Some(group),
        }))
    }

    async fn modify_volume_group_membership(
        &self,
        request: Request<ModifyVolumeGroupMembershipRequest>,
    ) -> Result<Response<ModifyVolumeGroupMembershipResponse>, Status> {
        let op = ModifyOp::try_from(request.into_inner())?;
        let group = super::call(&self.state, move |state, pool| modify(state, pool, &op)).await?;
        Ok(Response::new(ModifyVolumeGroupMembershipResponse {
            volume_group: Some(group),
        }))
    }

    async fn delete_volume_group(
        &self,
        request: Request<DeleteVolumeGroupRequest>,
    ) -> Result<Response<DeleteVolumeGroupResponse>, Status> {
        let op = ByIdOp::try_from(request.into_inner())?;
        super::call(&self.state, move |state, pool| delete(state, pool, &op)).await?;
        Ok(Response::new(DeleteVolumeGroupResponse {}))
    }

    async fn list_volume_groups(
        &self,
        request: Request<ListVolumeGroupsRequest>,
    ) -> Result<Response<ListVolumeGroupsResponse>, Status> {
        let op = ListOp::try_from(request.into_inner())?;
        let response = super::call(&self.state, move |state, pool| list(state, pool, &op)).await?;
        Ok(Response::new(response))
    }

    async fn controller_get_volume_group(
        &self,
        request: Request<ControllerGetVolumeGroupRequest>,
    ) -> Result<Response<ControllerGetVolumeGroupResponse>, Status> {
        let op = ByIdOp::try_from(request.into_inner())?;
        let group = super::call(&self.state, move |state, pool| {
            let group = find_group(Ids::new(&state.appliance_id), pool, &op.group)?;
            encode::volume_group(state, pool, group)
        })
        .await?;
        Ok(Response::new(ControllerGetVolumeGroupResponse {
            volume_group: Some(group),
        }))
    }
}
