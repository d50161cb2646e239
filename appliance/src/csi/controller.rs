//! CSI Controller: volumes and snapshots of the pool.
//!
//! Every handler: the request `TryFrom` into its validated operation ([`super::request`]), one
//! call of that operation on the pool ([`super::volumes`], answered once durable: concurrent
//! calls share one group commit), the answer encoded; failures become statuses in
//! [`super::status`] only. Calls on the pool are
//! serialized, so concurrent calls on one volume never interleave.
//!
//! Served: every Controller RPC. ControllerPublishVolume and ControllerUnpublishVolume only
//! while the NVMe/TCP target runs (it gives publish_context its meaning): without it they answer
//! UNIMPLEMENTED and are not advertised.

use std::sync::Arc;

use edgevol_core::Pool;
use edgevol_proto::csi::v1::controller_server::Controller;
use edgevol_proto::csi::v1::controller_service_capability::rpc::Type as Rpc;
use edgevol_proto::csi::v1::controller_service_capability::{Rpc as RpcCap, Type as CapType};
use edgevol_proto::csi::v1::*;
use tonic::{Request, Response, Status};

use super::error::Error;
use super::ids::Ids;
use super::request::{
    ById, CreateSnapshot, CreateVolume, Expand, GetCapacity, ListSnapshots, Modify, Page, Publish,
    Unpublish, ValidateCapabilities,
};
use super::{status, volumes};
use crate::nvme::TargetInfo;
use crate::pool::PoolDevice;
use crate::state::State;

/// The RPCs served whatever else runs.
pub const CAPABILITIES: [Rpc; 12] = [
    Rpc::CreateDeleteVolume,
    Rpc::ListVolumes,
    Rpc::GetCapacity,
    Rpc::CreateDeleteSnapshot,
    Rpc::ListSnapshots,
    Rpc::GetSnapshot,
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

/// Exactly the RPCs served with (or without) the NVMe/TCP target.
pub fn capabilities(target_runs: bool) -> Vec<Rpc> {
    let mut rpcs = CAPABILITIES.to_vec();
    if target_runs {
        rpcs.extend(TARGET_CAPABILITIES);
    }
    rpcs
}

/// The Controller service.
#[derive(Debug, Clone)]
pub struct ControllerService {
    state: Arc<State>,
    target: Option<TargetInfo>,
}

impl ControllerService {
    /// Serves the volumes of `state`'s pool, publishing them through `target` if it runs.
    pub fn new(state: Arc<State>, target: Option<TargetInfo>) -> Self {
        ControllerService { state, target }
    }

    /// Runs one operation on the pool.
    async fn call<T, F>(&self, f: F) -> Result<T, Status>
    where
        F: FnOnce(&State, &mut Pool<PoolDevice>) -> Result<T, Error> + Send + 'static,
        T: Send + 'static,
    {
        super::call(&self.state, f).await
    }

    /// The running target: publishing means nothing without it.
    fn target(&self) -> Result<TargetInfo, Status> {
        self.target
            .clone()
            .ok_or_else(|| status::from_error(Ids::new(&self.state.appliance_id), Error::NoTarget))
    }

    /// The target's per-volume counters, for volume conditions.
    fn stats(&self) -> Option<crate::nvme::stats::IoStats> {
        self.target.as_ref().map(|t| t.stats.clone())
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let op = CreateVolume::try_from(request.into_inner())?;
        let (name, existing_only) = (op.name.clone(), op.existing_only);
        // Looked up and answered under one pool lock: no volume of the name can appear between.
        let facts = self
            .call(move |state, pool| {
                if op.existing_only && pool.volume_by_name(&op.name).is_none() {
                    return Ok(None);
                }
                volumes::create_volume(state, pool, op).map(Some)
            })
            .await?;
        let Some(facts) = facts else {
            return Err(Status::not_found(format!(
                "no volume named {name:?} on this appliance (asked with {}; none was created)",
                super::params::EXISTING_ONLY_PARAM
            )));
        };
        let volume = facts.into_volume(&self.state);
        if existing_only {
            tracing::info!(volume = %volume.volume_id, "volume found by name for the proxy");
        } else {
            tracing::info!(volume = %volume.volume_id, bytes = volume.capacity_bytes, "volume created");
        }
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let op = ById::try_from(request.into_inner())?;
        self.call(move |state, pool| volumes::delete_volume(state, pool, &op))
            .await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let target = self.target()?;
        let op = Publish::try_from(request.into_inner())?;
        let (volume, node, readonly) = (op.volume_id.clone(), op.node_id.clone(), op.readonly);
        let published = self
            .call(move |state, pool| volumes::publish(state, pool, op))
            .await?;
        tracing::info!(%volume, %node, readonly, "volume published");
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: published.context(&self.state, &target),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        let target = self.target()?;
        let op = Unpublish::try_from(request.into_inner())?;
        let volume = op.volume_id.clone();
        let nodes = self
            .call(move |state, pool| volumes::unpublish(state, pool, &op))
            .await?;
        // Durable now: only then do live connections go.
        if let Some(id) = Ids::new(&self.state.appliance_id).parse_volume(&volume) {
            for node in &nodes {
                target.access.revoke(id, node);
            }
        }
        for node in &nodes {
            tracing::info!(%volume, %node, "volume unpublished");
        }
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let op = ValidateCapabilities::try_from(request.into_inner())?;
        let response = self
            .call(move |state, pool| volumes::validate_capabilities(state, pool, op))
            .await?;
        Ok(Response::new(response))
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let op = Page::try_from(request.into_inner())?;
        let stats = self.stats();
        let response = self
            .call(move |state, pool| volumes::list_volumes(state, pool, &op, stats.as_ref()))
            .await?;
        Ok(Response::new(response))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let op = GetCapacity::try_from(request.into_inner())?;
        let response = self
            .call(move |state, pool| volumes::get_capacity(state, pool, &op))
            .await?;
        Ok(Response::new(response))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: capabilities(self.target.is_some())
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
        let op = CreateSnapshot::try_from(request.into_inner())?;
        let name = op.name.clone();
        // Looked up and answered under one pool lock, like CreateVolume's question.
        let snapshot = self
            .call(move |state, pool| {
                if op.existing_only {
                    volumes::find_snapshot(state, pool, &op)
                } else {
                    volumes::create_snapshot(state, pool, &op).map(Some)
                }
            })
            .await?;
        let Some(snapshot) = snapshot else {
            return Err(Status::not_found(format!(
                "no snapshot named {name:?} on this appliance (asked with {}; none was created)",
                super::params::EXISTING_ONLY_PARAM
            )));
        };
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let op = ById::try_from(request.into_inner())?;
        self.call(move |state, pool| volumes::delete_snapshot(state, pool, &op))
            .await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let op = ListSnapshots::try_from(request.into_inner())?;
        let response = self
            .call(move |state, pool| volumes::list_snapshots(state, pool, &op))
            .await?;
        Ok(Response::new(response))
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let op = ById::try_from(request.into_inner())?;
        let snapshot = self
            .call(move |state, pool| volumes::get_snapshot(state, pool, &op))
            .await?;
        Ok(Response::new(GetSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let op = Expand::try_from(request.into_inner())?;
        let block = op.block;
        let volume = op.volume_id.clone();
        let (size, grown) = self
            .call(move |state, pool| volumes::expand(state, pool, &op))
            .await?;
        // Durable now: connected hosts learn of the new size.
        let id = Ids::new(&self.state.appliance_id).parse_volume(&volume);
        if let (Some(t), Some(id), true) = (&self.target, id, grown) {
            t.access.namespace_changed(id);
        }
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: super::encode::i64_of(size),
            // A filesystem must grow on the node too; a raw block volume is simply larger.
            node_expansion_required: !block,
        }))
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let op = ById::try_from(request.into_inner())?;
        let stats = self.stats();
        let response = self
            .call(move |state, pool| volumes::get_volume(state, pool, &op, stats.as_ref()))
            .await?;
        Ok(Response::new(response))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let op = Modify::try_from(request.into_inner())?;
        let (id, parameters) = self
            .call(move |state, pool| volumes::modify(state, pool, &op))
            .await?;
        // Durable now: connected hosts get the new limits.
        if let Some(t) = &self.target {
            t.access.parameters_changed(id, &parameters);
        }
        Ok(Response::new(ControllerModifyVolumeResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing_is_offered_only_with_the_target() {
        let without = capabilities(false);
        let with = capabilities(true);
        assert!(TARGET_CAPABILITIES.iter().all(|c| !without.contains(c)));
        assert!(TARGET_CAPABILITIES.iter().all(|c| with.contains(c)));
        assert_eq!(with.len(), CAPABILITIES.len() + TARGET_CAPABILITIES.len());
    }
}
