//! CSI Node: parse (csi::request), run the operation off the reactor, convert back.

use std::collections::HashMap;
use std::sync::Arc;

use edgevol_proto::csi::v1::node_server::Node;
use edgevol_proto::csi::v1::node_service_capability::rpc::Type as Rpc;
use edgevol_proto::csi::v1::volume_usage::Unit;
use edgevol_proto::csi::v1::{
    node_service_capability, NodeExpandVolumeRequest, NodeExpandVolumeResponse,
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodePublishVolumeResponse, NodeServiceCapability,
    NodeStageVolumeRequest, NodeStageVolumeResponse, NodeUnpublishVolumeRequest,
    NodeUnpublishVolumeResponse, NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, Topology,
    VolumeCondition, VolumeUsage,
};
use tonic::{Request, Response, Status};

use super::request;
use crate::error::Error;
use crate::volume::{Usage, Volumes};

/// What NodeGetInfo reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The host NQN.
    pub node_id: String,
    /// 0 = no limit.
    pub max_volumes_per_node: i64,
    /// Topology segments (`edgevol.io/appliance=<id>`); empty = none reported.
    pub topology: HashMap<String, String>,
}

/// The capabilities advertised. SINGLE_NODE_MULTI_WRITER is included because it truly works
/// here: a volume is staged once per node and bind-mounted into any number of targets, and
/// SINGLE_NODE_SINGLE_WRITER is enforced at publish (a second read-write publication of such a
/// volume is refused).
pub const CAPABILITIES: &[Rpc] = &[
    Rpc::StageUnstageVolume,
    Rpc::GetVolumeStats,
    Rpc::ExpandVolume,
    Rpc::VolumeCondition,
    Rpc::SingleNodeMultiWriter,
];

/// The Node service.
#[derive(Debug, Clone)]
pub struct NodeService {
    volumes: Arc<Volumes>,
    info: NodeInfo,
}

impl NodeService {
    /// Serves `volumes` on a node described by `info`.
    pub fn new(volumes: Arc<Volumes>, info: NodeInfo) -> Self {
        NodeService { volumes, info }
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Volumes) -> Result<T, Error> + Send + 'static,
    {
        let volumes = Arc::clone(&self.volumes);
        match tokio::task::spawn_blocking(move || f(&volumes)).await {
            Ok(result) => result.map_err(Status::from),
            Err(e) => Err(Status::internal(format!("node operation panicked: {e}"))),
        }
    }
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        if let Some(op) = crate::legs::stage_request(request.get_ref())? {
            tracing::info!(volume_id = %op.volume_id, staging = %op.staging_path.display(),
                legs = op.legs.len(), "NodeStageVolume (replicated)");
            self.blocking(move |v| v.stage_replicated(&op)).await?;
            return Ok(Response::new(NodeStageVolumeResponse {}));
        }
        let op = request::stage(request.get_ref())?;
        tracing::info!(volume_id = %op.volume_id, staging = %op.staging_path.display(), "NodeStageVolume");
        self.blocking(move |v| v.stage(&op)).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let (id, path) = request::unstage(request.get_ref())?;
        tracing::info!(volume_id = %id, staging = %path.display(), "NodeUnstageVolume");
        self.blocking(move |v| v.unstage(&id, &path)).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let op = request::publish(request.get_ref())?;
        tracing::info!(volume_id = %op.volume_id, target = %op.target_path.display(),
            read_only = op.read_only, "NodePublishVolume");
        self.blocking(move |v| v.publish(&op)).await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let (id, path) = request::unpublish(request.get_ref())?;
        tracing::info!(volume_id = %id, target = %path.display(), "NodeUnpublishVolume");
        self.blocking(move |v| v.unpublish(&id, &path)).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let (id, path) = request::stats(request.get_ref())?;
        let stats = self.blocking(move |v| v.stats(&id, &path)).await?;
        let usage = match stats.usage {
            Usage::Filesystem(u) => vec![
                VolumeUsage {
                    available: i64_of(u.available_bytes),
                    total: i64_of(u.total_bytes),
                    used: i64_of(u.used_bytes),
                    unit: Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: i64_of(u.free_inodes),
                    total: i64_of(u.total_inodes),
                    used: i64_of(u.total_inodes.saturating_sub(u.free_inodes)),
                    unit: Unit::Inodes as i32,
                },
            ],
            Usage::Block(bytes) => vec![VolumeUsage {
                available: 0,
                total: i64_of(bytes),
                used: 0,
                unit: Unit::Bytes as i32,
            }],
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(VolumeCondition {
                abnormal: stats.abnormal.is_some(),
                message: stats
                    .abnormal
                    .unwrap_or_else(|| "controller live".to_owned()),
            }),
        }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let op = request::expand(request.get_ref())?;
        tracing::info!(volume_id = %op.volume_id, path = %op.volume_path.display(),
            required = op.required_bytes, limit = op.limit_bytes, "NodeExpandVolume");
        let size = self.blocking(move |v| v.expand(&op)).await?;
        Ok(Response::new(NodeExpandVolumeResponse {
            capacity_bytes: i64_of(size),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|rpc| NodeServiceCapability {
                r#type: Some(node_service_capability::Type::Rpc(
                    node_service_capability::Rpc {
                        r#type: *rpc as i32,
                    },
                )),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let accessible_topology = (!self.info.topology.is_empty()).then(|| Topology {
            segments: self.info.topology.clone(),
        });
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.info.node_id.clone(),
            max_volumes_per_node: self.info.max_volumes_per_node,
            accessible_topology,
        }))
    }
}
