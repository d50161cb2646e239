//! CSI Controller: volumes and snapshots of the pool.
//!
//! Handlers are thin: check the request ([`validate`], [`capability`], [`params`]), run one core
//! operation through [`State::with_pool`] (durable when it returns), convert back. Calls on the
//! pool are serialized, so concurrent calls on one volume never interleave.
//!
//! Served: every Controller RPC. ControllerPublishVolume and ControllerUnpublishVolume only
//! while the NVMe/TCP target runs (it gives publish_context its meaning): without it they answer
//! UNIMPLEMENTED and are not advertised.

use std::collections::HashMap;
use std::sync::Arc;

use edgevol_core::{
    BlockDevice, ContentSource, Pool, Provisioning, SnapshotId, Volume as CoreVolume, VolumeId,
    VolumeSpec,
};
use edgevol_proto::csi::v1::controller_server::Controller;
use edgevol_proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use edgevol_proto::csi::v1::controller_service_capability::{Rpc as RpcCap, Type as CapType};
use edgevol_proto::csi::v1::volume_content_source::{
    SnapshotSource, Type as SourceType, VolumeSource,
};
use edgevol_proto::csi::v1::*;
use tonic::{Request, Response, Status};

use super::capability;
use super::params;
use super::qos;
use super::status::from_core;
use super::validate;
use crate::naming;
use crate::nvme::stats::MediaHealth;
use crate::pool::PoolDevice;
use crate::state::{now_nanos, State, TargetInfo};

/// Size of a volume created without capacity_range: 1 GiB.
pub const DEFAULT_VOLUME_BYTES: u64 = 1 << 30;

/// The RPCs served whatever else runs.
pub const CAPABILITIES: [Rpc; 11] = [
    Rpc::CreateDeleteVolume,
    Rpc::ListVolumes,
    Rpc::GetCapacity,
    Rpc::CreateDeleteSnapshot,
    Rpc::ListSnapshots,
    Rpc::CloneVolume,
    Rpc::ExpandVolume,
    Rpc::GetVolume,
    Rpc::VolumeCondition,
    Rpc::ModifyVolume,
    Rpc::SingleNodeMultiWriter,
];

/// The RPCs served while the NVMe/TCP target runs.
pub const TARGET_CAPABILITIES: [Rpc; 3] = [
    Rpc::PublishUnpublishVolume,
    Rpc::PublishReadonly,
    Rpc::ListVolumesPublishedNodes,
];

/// publish_context keys the node plugin reads.
pub mod publish_context {
    /// Always `tcp`.
    pub const TRANSPORT: &str = "transport";
    /// The target's address.
    pub const ADDRESS: &str = "targetAddress";
    /// The target's port.
    pub const PORT: &str = "targetPort";
    /// The volume's subsystem NQN.
    pub const SUBSYSTEM_NQN: &str = "subsystemNqn";
    /// Namespace NGUID, 32 lower-case hex digits.
    pub const NGUID: &str = "nguid";
    /// Namespace UUID, 8-4-4-4-12.
    pub const UUID: &str = "uuid";
    /// `true` when the host may only read.
    pub const READONLY: &str = "readonly";
}

/// Exactly the RPCs served now.
pub fn capabilities(state: &State) -> Vec<Rpc> {
    let mut rpcs = CAPABILITIES.to_vec();
    if state.target().is_some() {
        rpcs.extend(TARGET_CAPABILITIES);
    }
    rpcs
}

/// The Controller service.
#[derive(Debug, Clone)]
pub struct ControllerService {
    state: Arc<State>,
}

impl ControllerService {
    /// Serves the volumes of `state`'s pool.
    pub fn new(state: Arc<State>) -> Self {
        ControllerService { state }
    }

    /// The running target: publishing means nothing without it.
    fn target(&self) -> Result<TargetInfo, Status> {
        self.state.target().cloned().ok_or_else(|| {
            Status::unimplemented("publishing needs the NVMe/TCP target, which is not running")
        })
    }
}

type Core = Pool<PoolDevice>;

fn u64_of(field: &str, v: i64) -> Result<u64, Status> {
    u64::try_from(v).map_err(|_| Status::invalid_argument(format!("{field} must not be negative")))
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn timestamp(nanos: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64_of(nanos / 1_000_000_000),
        nanos: i32::try_from(nanos % 1_000_000_000).unwrap_or(0),
    }
}

/// The size to create for `range`, given the source's size (0 without source) and the cluster.
fn choose_size(range: Option<&CapacityRange>, source: u64, cluster: u64) -> Result<u64, Status> {
    let (required, limit) = match range {
        Some(r) => (
            u64_of("capacity_range.required_bytes", r.required_bytes)?,
            u64_of("capacity_range.limit_bytes", r.limit_bytes)?,
        ),
        None => (0, 0),
    };
    if limit != 0 && limit < required {
        return Err(Status::invalid_argument(format!(
            "capacity_range.limit_bytes ({limit}) is below required_bytes ({required})"
        )));
    }
    if limit != 0 && limit < source {
        return Err(Status::out_of_range(format!(
            "the source holds {source} bytes, more than limit_bytes ({limit})"
        )));
    }
    if required != 0 && required < source {
        return Err(Status::out_of_range(format!(
            "the source holds {source} bytes, more than required_bytes ({required})"
        )));
    }
    let wanted = match (required, source) {
        (0, 0) if limit != 0 => DEFAULT_VOLUME_BYTES.min(limit),
        (0, 0) => DEFAULT_VOLUME_BYTES,
        (0, s) => s,
        (r, _) => r,
    };
    let rounded = wanted.div_ceil(cluster).saturating_mul(cluster);
    if limit == 0 || rounded <= limit {
        return Ok(rounded);
    }
    // Round down inside the range when rounding up would leave it.
    let down = limit / cluster * cluster;
    if down >= wanted.max(1) && down >= source {
        Ok(down)
    } else {
        Err(Status::out_of_range(format!(
            "no multiple of the {cluster}-byte cluster lies in [{required}, {limit}]"
        )))
    }
}

impl State {
    fn topology_segments(&self) -> Topology {
        Topology {
            segments: self.topology.clone().into_iter().collect(),
        }
    }

    /// Whether the appliance lies in `t`: every segment of `t` matches ours.
    fn is_in(&self, t: &Topology) -> bool {
        t.segments
            .iter()
            .all(|(k, v)| self.topology.get(k) == Some(v))
    }

    fn csi_volume(&self, pool: &Core, v: &CoreVolume) -> Volume {
        let ids = self.ids();
        let content_source = v.source().map(|s| VolumeContentSource {
            r#type: Some(match s {
                ContentSource::Snapshot(id) => SourceType::Snapshot(SnapshotSource {
                    snapshot_id: ids.snapshot(id),
                }),
                ContentSource::Volume(id) => SourceType::Volume(VolumeSource {
                    volume_id: ids.volume(id),
                }),
            }),
        });
        Volume {
            capacity_bytes: i64_of(v.size()),
            volume_id: ids.volume(v.id()),
            volume_context: volume_context(pool, v),
            content_source,
            accessible_topology: vec![self.topology_segments()],
        }
    }

    fn csi_snapshot(&self, pool: &Core, id: SnapshotId) -> Result<Snapshot, Status> {
        let ids = self.ids();
        let s = pool.snapshot(id).map_err(|e| from_core(ids, e))?;
        Ok(Snapshot {
            size_bytes: i64_of(s.size()),
            snapshot_id: ids.snapshot(s.id()),
            source_volume_id: ids.volume(s.source_volume()),
            creation_time: Some(timestamp(s.created_at())),
            ready_to_use: true,
            group_snapshot_id: s
                .group_snapshot()
                .map(|g| ids.group_snapshot(g))
                .unwrap_or_default(),
        })
    }
}

/// Parses a pagination token: the core id after which to continue.
fn parse_token(token: &str) -> Result<Option<u64>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .parse::<u64>()
        .map(Some)
        .map_err(|_| Status::aborted(format!("starting_token {token:?} is not a token of ours")))
}

fn max_entries(n: i32) -> Result<usize, Status> {
    match usize::try_from(n) {
        Ok(0) => Ok(usize::MAX),
        Ok(n) => Ok(n),
        Err(_) => Err(Status::invalid_argument("max_entries must not be negative")),
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = request.into_inner();
        validate::required("name", &req.name)?;
        validate::map("parameters", &req.parameters)?;
        validate::map("mutable_parameters", &req.mutable_parameters)?;
        validate::secrets(&req.secrets)?;
        let mutable = qos::parse(&req.mutable_parameters)?;
        let requested =
            capability::check_all(&req.volume_capabilities).map_err(Status::invalid_argument)?;
        let params = params::parse(&req.parameters)?;
        if let Some(access) = &req.accessibility_requirements {
            if !access.requisite.is_empty() && !access.requisite.iter().any(|t| self.state.is_in(t))
            {
                return Err(Status::resource_exhausted(format!(
                    "no requisite topology includes this appliance ({})",
                    self.state
                        .topology_segments()
                        .segments
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                )));
            }
        }
        let mut parameters: Vec<(String, String)> = req.parameters.into_iter().collect();
        parameters.sort();
        let range = req.capacity_range;
        let source = req.volume_content_source.map(|s| s.r#type);
        let volume = self
            .state
            .with_pool(move |state, pool| {
                let ids = state.ids();
                let cluster = u64::from(pool.cluster_size());
                let (source, source_size) = match source {
                    None => (None, 0),
                    Some(None) => {
                        return Err(Status::invalid_argument(
                            "volume_content_source has no snapshot or volume",
                        ))
                    }
                    Some(Some(SourceType::Snapshot(s))) => {
                        let id = ids.parse_snapshot(&s.snapshot_id).ok_or_else(|| {
                            Status::not_found(format!("snapshot {} does not exist", s.snapshot_id))
                        })?;
                        let size = pool.snapshot(id).map_err(|e| from_core(ids, e))?.size();
                        (Some(ContentSource::Snapshot(id)), size)
                    }
                    Some(Some(SourceType::Volume(v))) => {
                        let id = ids.parse_volume(&v.volume_id).ok_or_else(|| {
                            Status::not_found(format!("volume {} does not exist", v.volume_id))
                        })?;
                        let size = pool.volume(id).map_err(|e| from_core(ids, e))?.size();
                        (Some(ContentSource::Volume(id)), size)
                    }
                };
                let size = choose_size(range.as_ref(), source_size, cluster)?;
                let spec = VolumeSpec {
                    name: req.name.clone(),
                    size,
                    provisioning: params.provisioning,
                    parameters,
                    source,
                    access_modes: requested.modes,
                    group: None,
                };
                // CSI idempotency: an existing volume of this name that satisfies the request
                // (its size inside the range, everything else equal) is the answer.
                if let Some(existing) = pool.volume_by_name(&req.name) {
                    let fits = match &range {
                        Some(r) => {
                            let size = i64_of(existing.size());
                            size >= r.required_bytes
                                && (r.limit_bytes == 0 || size <= r.limit_bytes)
                        }
                        None => true,
                    };
                    let same = existing.provisioning() == spec.provisioning
                        && existing.parameters() == spec.parameters.as_slice()
                        && existing.source() == spec.source
                        && existing.access_modes() == spec.access_modes;
                    return if fits && same {
                        // A retry after a crash between the two commits below finishes the job.
                        let id = existing.id();
                        if !mutable.is_empty() {
                            pool.modify_volume(id, &mutable)
                                .map_err(|e| from_core(ids, e))?;
                        }
                        let v = pool.volume(id).map_err(|e| from_core(ids, e))?;
                        Ok(state.csi_volume(pool, v))
                    } else {
                        Err(Status::already_exists(format!(
                            "volume {} named {:?} exists with different arguments",
                            ids.volume(existing.id()),
                            req.name
                        )))
                    };
                }
                let id = pool.create_volume(spec).map_err(|e| from_core(ids, e))?;
                if !mutable.is_empty() {
                    pool.modify_volume(id, &mutable)
                        .map_err(|e| from_core(ids, e))?;
                }
                let v = pool.volume(id).map_err(|e| from_core(ids, e))?;
                Ok(state.csi_volume(pool, v))
            })
            .await?;
        tracing::info!(volume = %volume.volume_id, bytes = volume.capacity_bytes, "volume created");
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let req = request.into_inner();
        validate::required("volume_id", &req.volume_id)?;
        validate::secrets(&req.secrets)?;
        let Some(id) = self.state.ids().parse_volume(&req.volume_id) else {
            // Not an id of ours: it cannot exist here, so it is already deleted.
            return Ok(Response::new(DeleteVolumeResponse {}));
        };
        self.state
            .with_pool(move |state, pool| match pool.delete_volume(id) {
                Ok(()) | Err(edgevol_core::Error::NotFound(_)) => Ok(()),
                Err(e) => Err(from_core(state.ids(), e)),
            })
            .await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let target = self.target()?;
        let req = request.into_inner();
        validate::required("volume_id", &req.volume_id)?;
        validate::required("node_id", &req.node_id)?;
        validate::map("volume_context", &req.volume_context)?;
        validate::secrets(&req.secrets)?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        let mode = capability::check(cap).map_err(Status::invalid_argument)?;
        let host = req.node_id.clone();
        if !is_host_nqn(&host) {
            return Err(Status::not_found(format!(
                "node {host:?} is not an NVMe host NQN (the node plugin reports its host NQN as node_id)"
            )));
        }
        let id = self
            .state
            .ids()
            .parse_volume(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        // Reader-only modes publish read-only whatever the CO says.
        let readonly = req.readonly
            || matches!(
                mode,
                edgevol_core::AccessMode::SingleNodeReaderOnly
                    | edgevol_core::AccessMode::MultiNodeReaderOnly
            );
        let (nqn, nguid, uuid) = self
            .state
            .with_pool(move |state, pool| {
                let ids = state.ids();
                let v = pool.volume(id).map_err(|e| from_core(ids, e))?;
                if !v.access_modes().contains(mode) {
                    return Err(Status::invalid_argument(format!(
                        "volume {} was not created for that access mode",
                        ids.volume(id)
                    )));
                }
                match pool.publish(id, &host, readonly) {
                    Ok(()) => {}
                    Err(edgevol_core::Error::FailedPrecondition(
                        edgevol_core::Precondition::PublishedToOtherHost(_),
                    )) => {
                        let holders: Vec<&str> = pool
                            .volume(id)
                            .map_err(|e| from_core(ids, e))?
                            .publications()
                            .iter()
                            .map(|p| p.host.as_str())
                            .collect();
                        return Err(Status::failed_precondition(format!(
                            "volume {} is published to node(s) {} and its access mode does not allow another{}",
                            ids.volume(id),
                            holders.join(", "),
                            if readonly { "" } else { " writer" }
                        )));
                    }
                    Err(edgevol_core::Error::AlreadyExists(_)) => {
                        return Err(Status::already_exists(format!(
                            "volume {} is published to node {host} with readonly={}",
                            ids.volume(id),
                            !readonly
                        )));
                    }
                    Err(e) => return Err(from_core(ids, e)),
                }
                let uuid = pool.uuid();
                Ok((
                    naming::subsystem_nqn(&state.appliance_id, id),
                    naming::nguid(uuid, id),
                    naming::namespace_uuid(uuid, id),
                ))
            })
            .await?;
        use publish_context as k;
        let context = HashMap::from([
            (k::TRANSPORT.to_owned(), "tcp".to_owned()),
            (k::ADDRESS.to_owned(), target.endpoint.ip().to_string()),
            (k::PORT.to_owned(), target.endpoint.port().to_string()),
            (k::SUBSYSTEM_NQN.to_owned(), nqn),
            (k::NGUID.to_owned(), naming::hex(&nguid)),
            (k::UUID.to_owned(), naming::uuid_string(uuid)),
            (k::READONLY.to_owned(), readonly.to_string()),
        ]);
        tracing::info!(volume = %req.volume_id, node = %req.node_id, readonly, "volume published");
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: context,
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let target = self.target()?;
        let req = request.into_inner();
        validate::required("volume_id", &req.volume_id)?;
        validate::string("node_id", &req.node_id)?;
        validate::secrets(&req.secrets)?;
        // An unknown volume or node is already unpublished from it: OK, as the spec allows.
        let Some(id) = self.state.ids().parse_volume(&req.volume_id) else {
            return Ok(Response::new(ControllerUnpublishVolumeResponse {}));
        };
        let node = req.node_id.clone();
        let removed = self
            .state
            .with_pool(move |state, pool| {
                let hosts: Vec<String> = match pool.volume(id) {
                    Ok(v) => v
                        .publications()
                        .iter()
                        .map(|p| p.host.clone())
                        .filter(|h| node.is_empty() || *h == node)
                        .collect(),
                    Err(edgevol_core::Error::NotFound(_)) => return Ok(Vec::new()),
                    Err(e) => return Err(from_core(state.ids(), e)),
                };
                for host in &hosts {
                    pool.unpublish(id, host)
                        .map_err(|e| from_core(state.ids(), e))?;
                }
                Ok(hosts)
            })
            .await?;
        // Durable first, then cut the live connections: a host never keeps access the
        // metadata no longer grants after a crash.
        for host in &removed {
            target.access.revoke(id, host);
            tracing::info!(volume = %req.volume_id, node = %host, "volume unpublished");
        }
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        validate::required("volume_id", &req.volume_id)?;
        validate::map("volume_context", &req.volume_context)?;
        validate::map("parameters", &req.parameters)?;
        validate::map("mutable_parameters", &req.mutable_parameters)?;
        validate::secrets(&req.secrets)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        let id = self
            .state
            .ids()
            .parse_volume(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        let stored = self
            .state
            .with_pool(move |state, pool| {
                let v = pool.volume(id).map_err(|e| from_core(state.ids(), e))?;
                Ok((
                    v.parameters().to_vec(),
                    v.access_modes(),
                    v.mutable_parameters().to_vec(),
                ))
            })
            .await?;
        let (mut stored_params, modes, mutable) = stored;
        stored_params.sort();
        let mut asked: Vec<(String, String)> = req.parameters.clone().into_iter().collect();
        asked.sort();
        let asked_mutable = qos::parse(&req.mutable_parameters);
        let verdict = match capability::check_all(&req.volume_capabilities) {
            Err(why) => Err(why),
            Ok(r)
                if ALL_MODES
                    .iter()
                    .any(|m| r.modes.contains(*m) && !modes.contains(*m)) =>
            {
                Err("the volume was not created for every requested access mode".to_owned())
            }
            Ok(_) if !req.parameters.is_empty() && asked != stored_params => {
                Err("parameters differ from those the volume was created with".to_owned())
            }
            Ok(_) => match asked_mutable {
                Err(e) => Err(e.message().to_owned()),
                Ok(pairs) if pairs.iter().any(|p| !mutable.contains(p)) => {
                    Err("mutable_parameters differ from the volume's".to_owned())
                }
                Ok(_) => Ok(()),
            },
        };
        Ok(Response::new(match verdict {
            Ok(()) => ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
            Err(message) => ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
        }))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let max = max_entries(req.max_entries)?;
        let after = parse_token(&req.starting_token)?.map(VolumeId);
        let (entries, next) = self
            .state
            .with_pool(move |state, pool| {
                let mut entries = Vec::new();
                let mut next = None;
                for v in pool.volumes(after) {
                    if entries.len() == max {
                        next = Some(entries_last(&entries, state));
                        break;
                    }
                    entries.push(list_volumes_response::Entry {
                        volume: Some(state.csi_volume(pool, v)),
                        status: Some(list_volumes_response::VolumeStatus {
                            published_node_ids: published_nodes(v),
                            volume_condition: Some(condition(state, pool, v.id())),
                        }),
                    });
                }
                Ok((entries, next))
            })
            .await?;
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token: next.flatten().map(|id| id.to_string()).unwrap_or_default(),
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        validate::map("parameters", &req.parameters)?;
        let params = params::parse(&req.parameters)?;
        let usable = req
            .volume_capabilities
            .iter()
            .all(|c| capability::check(c).is_ok());
        let here = req
            .accessible_topology
            .as_ref()
            .is_none_or(|t| self.state.is_in(t));
        let (free, cluster) = self
            .state
            .with_pool(|_, pool| Ok((pool.capacity().free, u64::from(pool.cluster_size()))))
            .await?;
        let available = if usable && here { free } else { 0 };
        // A thin volume may be larger than the free space (it allocates on write); a thick one
        // reserves everything at creation.
        let maximum = match params.provisioning {
            Provisioning::Thin => edgevol_core::limits::MAX_VOLUME_SIZE,
            Provisioning::Thick => available,
        };
        Ok(Response::new(GetCapacityResponse {
            available_capacity: i64_of(available),
            maximum_volume_size: Some(i64_of(if usable && here { maximum } else { 0 })),
            minimum_volume_size: Some(i64_of(cluster)),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: capabilities(&self.state)
                .iter()
                .map(|rpc| ControllerServiceCapability {
                    r#type: Some(CapType::Rpc(RpcCap {
                        r#type: *rpc as i32,
                    })),
                })
                .collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let req = request.into_inner();
        validate::required("source_volume_id", &req.source_volume_id)?;
        validate::required("name", &req.name)?;
        validate::map("parameters", &req.parameters)?;
        validate::secrets(&req.secrets)?;
        if let Some(key) = req.parameters.keys().next() {
            return Err(Status::invalid_argument(format!(
                "unknown snapshot parameter {key:?} (snapshots take none)"
            )));
        }
        let source = self
            .state
            .ids()
            .parse_volume(&req.source_volume_id)
            .ok_or_else(|| {
                Status::not_found(format!("volume {} does not exist", req.source_volume_id))
            })?;
        let snapshot = self
            .state
            .with_pool(move |state, pool| {
                let id = pool
                    .create_snapshot(source, &req.name, now_nanos())
                    .map_err(|e| from_core(state.ids(), e))?;
                state.csi_snapshot(pool, id)
            })
            .await?;
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let req = request.into_inner();
        validate::required("snapshot_id", &req.snapshot_id)?;
        validate::secrets(&req.secrets)?;
        let Some(id) = self.state.ids().parse_snapshot(&req.snapshot_id) else {
            return Ok(Response::new(DeleteSnapshotResponse {}));
        };
        self.state
            .with_pool(move |state, pool| match pool.delete_snapshot(id) {
                Ok(()) | Err(edgevol_core::Error::NotFound(_)) => Ok(()),
                Err(e) => Err(from_core(state.ids(), e)),
            })
            .await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        validate::string("snapshot_id", &req.snapshot_id)?;
        validate::string("source_volume_id", &req.source_volume_id)?;
        validate::secrets(&req.secrets)?;
        let max = max_entries(req.max_entries)?;
        let after = parse_token(&req.starting_token)?.map(SnapshotId);
        let ids = self.state.ids();
        // A filter naming nothing of ours matches nothing: an empty list, not an error.
        let by_id = (!req.snapshot_id.is_empty()).then(|| ids.parse_snapshot(&req.snapshot_id));
        let by_source =
            (!req.source_volume_id.is_empty()).then(|| ids.parse_volume(&req.source_volume_id));
        if matches!(by_id, Some(None)) || matches!(by_source, Some(None)) {
            return Ok(Response::new(ListSnapshotsResponse::default()));
        }
        let (by_id, by_source) = (by_id.flatten(), by_source.flatten());
        let (entries, next) = self
            .state
            .with_pool(move |state, pool| {
                let mut entries = Vec::new();
                let mut next = None;
                let matching = pool.snapshots(after).filter(|s| {
                    by_id.is_none_or(|id| s.id() == id)
                        && by_source.is_none_or(|v| s.source_volume() == v)
                });
                for s in matching {
                    if entries.len() == max {
                        next = entries
                            .last()
                            .and_then(|e: &list_snapshots_response::Entry| e.snapshot.as_ref())
                            .and_then(|s| state.ids().parse_snapshot(&s.snapshot_id))
                            .map(|id| id.0);
                        break;
                    }
                    entries.push(list_snapshots_response::Entry {
                        snapshot: Some(state.csi_snapshot(pool, s.id())?),
                    });
                }
                Ok((entries, next))
            })
            .await?;
        Ok(Response::new(ListSnapshotsResponse {
            entries,
            next_token: next.map(|id| id.to_string()).unwrap_or_default(),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        validate::required("volume_id", &req.volume_id)?;
        validate::secrets(&req.secrets)?;
        let range = req
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let required = u64_of("capacity_range.required_bytes", range.required_bytes)?;
        let limit = u64_of("capacity_range.limit_bytes", range.limit_bytes)?;
        if limit != 0 && limit < required {
            return Err(Status::invalid_argument(format!(
                "capacity_range.limit_bytes ({limit}) is below required_bytes ({required})"
            )));
        }
        let id = self
            .state
            .ids()
            .parse_volume(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        let block = req.volume_capability.as_ref().is_some_and(|c| {
            matches!(c.access_type, Some(volume_capability::AccessType::Block(_)))
        });
        let size = self
            .state
            .with_pool(move |state, pool| {
                let ids = state.ids();
                let cluster = u64::from(pool.cluster_size());
                let current = pool.volume(id).map_err(|e| from_core(ids, e))?.size();
                if current >= required {
                    return Ok(current);
                }
                let target = choose_size(Some(&range), 0, cluster)?;
                let size = pool
                    .expand_volume(id, target)
                    .map_err(|e| from_core(ids, e))?;
                // Connected hosts learn of the new size through an async event.
                if let Some(t) = state.target() {
                    t.access.namespace_changed(id);
                }
                Ok(size)
            })
            .await?;
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: i64_of(size),
            // A filesystem must grow on the node too; a raw block volume is simply larger.
            node_expansion_required: !block,
        }))
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let req = request.into_inner();
        validate::required("volume_id", &req.volume_id)?;
        let id = self
            .state
            .ids()
            .parse_volume(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        let (volume, published, condition) = self
            .state
            .with_pool(move |state, pool| {
                let v = pool.volume(id).map_err(|e| from_core(state.ids(), e))?;
                Ok((
                    state.csi_volume(pool, v),
                    published_nodes(v),
                    condition(state, pool, id),
                ))
            })
            .await?;
        Ok(Response::new(ControllerGetVolumeResponse {
            volume: Some(volume),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: published,
                volume_condition: Some(condition),
            }),
        }))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let req = request.into_inner();
        validate::required("volume_id", &req.volume_id)?;
        validate::map("mutable_parameters", &req.mutable_parameters)?;
        validate::secrets(&req.secrets)?;
        if req.mutable_parameters.is_empty() {
            return Err(Status::invalid_argument("mutable_parameters is required"));
        }
        let changes = qos::parse(&req.mutable_parameters)?;
        let id = self
            .state
            .ids()
            .parse_volume(&req.volume_id)
            .ok_or_else(|| Status::not_found(format!("volume {} does not exist", req.volume_id)))?;
        self.state
            .with_pool(move |state, pool| {
                pool.modify_volume(id, &changes)
                    .map_err(|e| from_core(state.ids(), e))
            })
            .await?;
        Ok(Response::new(ControllerModifyVolumeResponse {}))
    }
}

/// Every access mode, for subset checks.
const ALL_MODES: [edgevol_core::AccessMode; 7] = [
    edgevol_core::AccessMode::SingleNodeWriter,
    edgevol_core::AccessMode::SingleNodeReaderOnly,
    edgevol_core::AccessMode::MultiNodeReaderOnly,
    edgevol_core::AccessMode::MultiNodeSingleWriter,
    edgevol_core::AccessMode::MultiNodeMultiWriter,
    edgevol_core::AccessMode::SingleNodeSingleWriter,
    edgevol_core::AccessMode::SingleNodeMultiWriter,
];

/// What a volume reports as volume_context, the same from every RPC that shows it: its
/// parameters and the pool's cluster size.
pub(crate) fn volume_context<D: BlockDevice>(
    pool: &Pool<D>,
    v: &CoreVolume,
) -> HashMap<String, String> {
    let mut context: HashMap<String, String> = v.parameters().iter().cloned().collect();
    context.insert(
        "edgevol.io/cluster-size".into(),
        pool.cluster_size().to_string(),
    );
    context
}

/// A volume's condition: abnormal when its pool stopped after a device failure (every volume on
/// it then is: the pool refuses all work until the appliance reopens it), or when commands on
/// this volume failed on the medium since the daemon started (the drive may be failing; other
/// volumes keep being served).
fn condition<D: BlockDevice>(state: &State, pool: &Pool<D>, volume: VolumeId) -> VolumeCondition {
    if let Some(kind) = pool.failure() {
        return VolumeCondition {
            abnormal: true,
            message: format!("pool stopped after a device failure ({kind}); restart the appliance"),
        };
    }
    let health = state.target().map(|t| t.stats.media_health(volume));
    match health {
        Some(MediaHealth {
            errors,
            last: Some((at, kind)),
        }) if errors > 0 => VolumeCondition {
            abnormal: true,
            message: format!(
                "{errors} I/O command(s) failed on the pool device's medium since the appliance started, \
                 the latest a {} at Unix time {at}; check the drive (edgevol status --metrics)",
                kind.as_str()
            ),
        },
        _ => VolumeCondition {
            abnormal: false,
            message: "pool healthy".into(),
        },
    }
}

fn published_nodes(v: &CoreVolume) -> Vec<String> {
    v.publications().iter().map(|p| p.host.clone()).collect()
}

/// Whether `s` looks like an NVMe qualified name (`nqn.` prefix, at most 223 bytes, printable).
fn is_host_nqn(s: &str) -> bool {
    s.starts_with("nqn.")
        && s.len() <= edgevol_core::limits::MAX_NQN_LEN
        && s.bytes().all(|b| b.is_ascii_graphic())
}

/// The token for a page that ended after `entries`: the core id of its last volume.
fn entries_last(entries: &[list_volumes_response::Entry], state: &State) -> Option<u64> {
    entries
        .last()
        .and_then(|e| e.volume.as_ref())
        .and_then(|v| state.ids().parse_volume(&v.volume_id))
        .map(|id| id.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(required: i64, limit: i64) -> CapacityRange {
        CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }
    }

    #[test]
    fn sizes_honour_the_range_and_the_source() {
        let mib = 1 << 20;
        assert_eq!(choose_size(None, 0, mib).unwrap(), DEFAULT_VOLUME_BYTES);
        assert_eq!(choose_size(Some(&range(1, 0)), 0, mib).unwrap(), mib);
        assert_eq!(
            choose_size(Some(&range(0, 5 * mib as i64)), 0, mib).unwrap(),
            5 * mib
        );
        // Rounding up would leave the range: round down inside it.
        let r = range(mib as i64 + 1, 2 * mib as i64 + 5);
        assert_eq!(choose_size(Some(&r), 0, mib).unwrap(), 2 * mib);
        let e = choose_size(Some(&range(mib as i64 + 1, mib as i64 + 5)), 0, mib).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert_eq!(choose_size(None, 3 * mib, mib).unwrap(), 3 * mib);
        let e = choose_size(Some(&range(mib as i64, 0)), 3 * mib, mib).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        let e = choose_size(Some(&range(5, 4)), 0, mib).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = choose_size(Some(&range(-1, 0)), 0, mib).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
